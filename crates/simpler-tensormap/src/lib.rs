//! `simpler-tensormap` — the dependency map under the engine: for each run and buffer, which
//! tasks currently produce which bytes.
//!
//! Layer: directly above `simpler-types`. The map answers "which tasks wrote bytes this access
//! overlaps, in this run" and forgets a producer when its slot is reclaimed. It must not know
//! about task states, scheduling, rings or devices; callers decide what a returned producer means.
//!
//! - [`TensorKey`] names a buffer: host memory by base address, child memory by worker and base
//!   address, remote memory by descriptor (`docs/tensormap.md` §1).
//! - [`ByteSpan`] is the byte range a view can touch; [`footprint`] derives both from a
//!   [`Tensor`] (`docs/tensormap.md` §2).
//! - [`TensorMap`] holds, per `(run, key)`, ordered lists of `(span, task)` writer and reader
//!   entries: [`dependencies`](TensorMap::dependencies) visits each task an [`Access`] of a span
//!   must order after, [`record`](TensorMap::record) adds the access and supersedes the entries
//!   a write covers entirely, [`erase_owned`](TensorMap::erase_owned) removes only the
//!   reclaimed task's entries (`docs/tensormap.md` §3–§4).
//!   [`lookup_overlapping`](TensorMap::lookup_overlapping) and [`insert`](TensorMap::insert)
//!   are that pair for a read and an overwrite.
//!
//! The module layout and the decisions behind it are in `docs/tensormap.md` ("Modules").
//!
//! ```
//! use simpler_tensormap::{Access, DataType, RunId, SlotId, Tensor, TensorMap, footprint};
//!
//! let map = TensorMap::new();
//! let run = RunId::FIRST;
//! let a = Tensor::external(0x1000, &[64], DataType::Float32)?;
//! let (key, span) = footprint(&a, None)?.expect("a non-empty host tensor");
//! let writer = SlotId::new(0, 1);
//! map.record(run, key, span, Access::Overwrite, writer);
//! // A later reader of the same bytes orders after the writer.
//! let mut deps = Vec::new();
//! map.dependencies(run, &key, span, Access::Read, |s| deps.push(s));
//! assert_eq!(deps, [writer]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`fixed`] is the same dependency map over fixed, caller-provided storage for device
//! runtimes (`docs/tensormap-fixed.md`). It and [`ByteSpan`] need only `core`: without the
//! default `std` feature the crate is `no_std` and holds just those two.

#![cfg_attr(not(feature = "std"), no_std)]
#![forbid(unsafe_code)]

#[cfg(feature = "std")]
mod access;
#[cfg(feature = "std")]
mod entry;
#[cfg(feature = "std")]
mod error;
pub mod fixed;
#[cfg(feature = "std")]
mod footprints;
#[cfg(feature = "std")]
mod from_tensor;
#[cfg(feature = "std")]
mod key;
#[cfg(feature = "std")]
mod key_table;
#[cfg(feature = "std")]
mod map;
mod span;
#[cfg(feature = "std")]
mod store;

#[cfg(feature = "std")]
pub use access::Access;
#[cfg(feature = "std")]
pub use error::TensorMapError;
#[cfg(feature = "std")]
pub use from_tensor::footprint;
#[cfg(feature = "std")]
pub use key::{RemoteSpace, TensorKey};
#[cfg(feature = "std")]
pub use map::{TensorMap, TensorMapGuard};
pub use span::ByteSpan;

// What the API takes, so that one dependency line suffices.
#[cfg(feature = "std")]
pub use simpler_types::{DataType, RunId, SlotId, Tensor, TensorArgType, TypesError, WorkerId};
