//! `fixed` — the tensor map over fixed, caller-provided storage, for device runtimes.
//!
//! The host [`TensorMap`](crate::TensorMap) grows as needed behind a mutex. A device runtime
//! cannot allocate while a run executes and keeps its state in memory it lays out itself, so this
//! module offers the same dependency rules over storage the caller hands in:
//!
//! - [`FixedTensorMap`] — an entry pool and a bucket array (slices the caller provides; nothing
//!   is allocated, then or later), writer and reader entries with byte footprints
//!   ([`ByteSpan`](crate::ByteSpan)), lookup through a visitor, owner-checked erase, pruning of
//!   retired owners, and [`FixedMapError::Full`] when the pool is exhausted.
//! - [`MapEntry`] — one pool slot, `repr(C)` with a fixed layout for `u64` keys.
//! - [`AccessMode`] and [`Role`] — what an access finds and what it records.
//!
//! The layout, the entry rules (a write finds live readers, a covering write supersedes what it
//! took edges from) and their reasons are described in `docs/tensormap-fixed.md`.
//!
//! The module uses only `core` (the crate builds with `--no-default-features` to prove it), takes
//! no lock (one thread owns a map; share it behind the caller's own lock if needed), and keys are
//! any `Copy + Eq + Hash` type: the device uses buffer base addresses (`u64`), the host's
//! [`TensorKey`](crate::TensorKey) works too.

mod entry;
mod error;
mod hash;
mod map;

pub use entry::{AccessMode, MapEntry, Role};
pub use error::FixedMapError;
pub use map::FixedTensorMap;
