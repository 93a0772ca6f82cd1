//! `simpler-worker` — the user-facing `Worker` at every level: L2 (one chip), L3 (chips and sub
//! workers), L4+ (composition of lower workers); registration, `submit`/`run`, [`RunHandle`],
//! `close` and `Drop`, device-memory helpers (protocols: `docs/worker-protocols.md`).
//!
//! Layer: above `simpler-sched` (the engine it drives at L3+) and `simpler-device-a2a3` (the
//! `DeviceRunner` each chip lane owns). It must not know device internals beyond the
//! `DeviceRunner` API. Its `unsafe` code is listed in the inventory below: PROCESS mode's
//! shared memory and, with feature `mpi`, the MPI calls the `mpi` crate has no safe form of.
//!
//! The crate's module map is in `docs/worker-protocols.md` ("Modules"); the user guide is
//! `docs/guide.md`.
//!
//! # Unsafe inventory
//!
//! PROCESS mode needs `unsafe` for memory shared with another process, and the MPI transport
//! for its error handler and its nonblocking sends and receives:
//!
//! - `src/process/mailbox.rs`: references to the atomics of the mapped mailbox and copies
//!   into and out of its payload area, handed to one side at a time by the state word.
//! - `src/process/spawn.rs`: the `pre_exec` hook that leaves the mailbox the only descriptor
//!   the forked child keeps across `exec` (system calls only), and its fallback listing of
//!   `/proc/self/fd`.
//! - `src/process/child.rs`: borrowing and then taking ownership of the inherited mailbox
//!   descriptor whose number the arguments give.
//! - `src/process/mod.rs`: the `unsafe` `chip_child_main`, whose caller vouches that the
//!   process was started by the worker's spawner and that the descriptor its arguments name
//!   is the inherited mailbox nobody else in the process owns; `src/bin/simpler-chip-child.rs`
//!   calls it.
//! - `src/remote/transport.rs` (feature `mpi`): setting MPI's errors-return handler, which the
//!   `mpi` crate has no safe call for.
//! - `src/remote/request.rs`, `src/remote/sends.rs` and `src/remote/receives.rs` (feature
//!   `mpi`): nonblocking sends and receives whose buffers the module owns until MPI has
//!   completed them (the crate's scoped requests cannot outlive a loop iteration).
//!
//! # Example
//!
//! ```
//! use simpler_device_a2a3::{Platform, RuntimeVariant};
//! use simpler_worker::{Orchestration, Worker};
//! use simpler_types::TaskArgs;
//!
//! let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(1);
//! let hello = b.register_host("hello", |_args| Ok(()));
//! let worker = b.start()?;
//! worker.run(Orchestration::graph(move |g, _, _| {
//!     g.submit_sub(hello, TaskArgs::new())?;
//!     Ok(())
//! }))?;
//! worker.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `start` consumes the builder, so registering on a worker that is starting, starting twice
//! and adopting a started child cannot be written:
//!
//! ```compile_fail
//! use simpler_device_a2a3::{Platform, RuntimeVariant};
//! use simpler_worker::Worker;
//! let b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph);
//! let w = b.start();
//! let again = b.start(); // the builder was consumed by the first start
//! ```
//!
//! ```compile_fail
//! use simpler_device_a2a3::{Platform, RuntimeVariant};
//! use simpler_worker::Worker;
//! let mut parent = Worker::composite(4);
//! let child = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).start().unwrap();
//! parent.child(child); // only builders can be adopted, never a started worker
//! ```
//!
//! ```compile_fail
//! use simpler_device_a2a3::{Platform, RuntimeVariant};
//! use simpler_worker::Worker;
//! let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(1);
//! let w = b.start();
//! b.register_host("late", |_| Ok(())); // registering on the builder after start
//! ```
//!
//! ```compile_fail
//! use simpler_device_a2a3::{Platform, RuntimeVariant};
//! use simpler_worker::Worker;
//! // A worker that is still starting does not exist as a value, so it cannot be closed.
//! let b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph);
//! b.close();
//! ```
//!
#![deny(unsafe_code)]

mod builder;
mod child;
mod chip;
mod chip_endpoint;
mod close;
mod code_names;
mod deferred_drop;
mod election;
mod error;
mod faults;
mod gate;
mod graph;
mod handle;
mod host_buffer;
mod lane_fence;
mod linger;
mod memory;
#[allow(unsafe_code)]
mod process;
mod reentry;
mod registration;
#[cfg(feature = "mpi")]
pub mod remote;
mod run;
mod staging;
mod sub;
mod sync;
mod worker;

#[cfg(all(test, simpler_loom))]
mod loom_models;

pub use builder::{
    ChildSpec, ChipOptionsFn, ChipWorkerBuilder, CompositeWorkerBuilder, DEFAULT_ALLOC_TIMEOUT,
    DEFAULT_HEAP_RING_SIZE, DEFAULT_STARTUP_TIMEOUT, HostWorkerBuilder, MAX_SUB_WORKERS,
};
pub use close::Lifecycle;
pub use error::{
    BoxError, BufferName, BuildFailure, CleanupError, CleanupFault, CloseError, ConfigError,
    DrainTimeout, Frame, LaneFault, Leak, Leaked, MemError, RegistrationFailure, RunError,
    RunErrorKind, StartCause, StartError, TeardownCause, TeardownError, TeardownPart, WorkerError,
};
pub use graph::{GraphBuilder, GraphCallback, Orchestration};
pub use handle::{CallableHandle, GraphFn, HostFn};
pub use host_buffer::{HostAddr, HostBuffer};
pub use memory::{ChipMemory, DeviceBuffer};
#[cfg(feature = "sim")]
pub use process::ChildFault;
#[doc(hidden)]
pub use process::chip_child_main;
pub use process::{
    ChildError, ChildExit, ChildMode, OnChildDeath, ProcessOptions, ProtocolFault, ReplyFault,
    ShutdownFault, SpawnFault,
};
pub use run::RunHandle;
pub use simpler_device_a2a3::MemoryLedger;
pub use worker::Worker;
