//! `simpler` — run task DAGs on Ascend A2/A3 NPUs, from one chip up to many hosts.
//!
//! This facade re-exports the workspace's public crates, bottom-up. Each crate is usable on its
//! own; depend on this one to get all of them under one name.
//!
//! ```
//! use simpler::device_a2a3::{Platform, RuntimeVariant};
//! use simpler::types::TaskArgs;
//! use simpler::worker::{Orchestration, Worker};
//!
//! // An L3 worker with one sub worker (no chips) running a one-task graph.
//! let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(1);
//! let hello = b.register_host("hello", |_| Ok(()));
//! let worker = b.start()?;
//! worker.run(Orchestration::graph(move |g, _, _| {
//!     g.submit_sub(hello, TaskArgs::new())?;
//!     Ok(())
//! }))?;
//! worker.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Start with the user guide, `docs/guide.md`.

#![forbid(unsafe_code)]

pub use simpler_device_a2a3 as device_a2a3;
pub use simpler_ring as ring;
pub use simpler_sched as sched;
pub use simpler_tensormap as tensormap;
pub use simpler_types as types;
pub use simpler_worker as worker;

/// The user guide, `docs/guide.md`: built only for doctests, so that every code block of the
/// guide compiles and runs as written.
#[cfg(all(doctest, feature = "sim"))]
#[doc = include_str!("../docs/guide.md")]
pub struct UserGuide;
