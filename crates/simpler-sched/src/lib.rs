//! `simpler-sched` — the engine of one host level (L3, L4, …): runs, submit, dependency
//! inference, scheduling, completion fences and the endpoint threads.
//!
//! Layer: above `simpler-types`, `simpler-tensormap` and `simpler-ring`; below `simpler-worker`.
//! It must not know about devices, FFI or processes: everything that executes a task is behind
//! the [`Endpoint`] trait.
//!
//! # Shape
//!
//! An [`Engine`] owns the run registry, the orchestrator state (scope stack, tensor map, ring),
//! the scheduler, one scheduler thread and one endpoint thread per endpoint. A user thread builds a
//! run through a [`RunBuilder`] (`begin_run` → `submit_*` / `alloc` / scopes → `close` or
//! `fail`), then waits for the run's fence with [`Engine::wait`] and releases it with
//! [`Engine::release`].
//!
//! ```text
//! user thread ─ submit ─► RunBuilder (slot, tensor map, edges) ─ ready ─┐
//!                                                                        ▼
//!              scheduler pass (queues, dispatch, completion processing, poisoning)
//!                 ▲ runs on whichever thread delivers an event      │ dispatch (mailbox)
//! wait ◄─ run fence ◄─ reclamation ◄─ completion ◄ endpoint threads ◄┘
//! ```
//!
//! ```
//! use simpler_sched::{
//!     CallConfig, CallableId, CallableKind, DispatchedMember, Endpoint, EndpointCaps,
//!     EndpointFailure, Engine, EngineConfig, TaskArgs, Tensor, DataType, WorkerId, WorkerType,
//! };
//!
//! /// A host worker that prints what it runs.
//! struct Print(u32);
//!
//! impl Endpoint for Print {
//!     fn caps(&self) -> EndpointCaps {
//!         EndpointCaps { worker_type: WorkerType::Sub, id: WorkerId(self.0), remote: false, name: format!("print {}", self.0) }
//!     }
//!     fn run(&mut self, task: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
//!         println!("{} runs on sub {}", task.task, self.0);
//!         Ok(())
//!     }
//! }
//!
//! let engine = Engine::start(EngineConfig {
//!     sub: vec![Box::new(Print(0)), Box::new(Print(1))],
//!     ..EngineConfig::default()
//! })?;
//! let produce = CallableId::host_named("produce", CallableKind::Host);
//! let consume = CallableId::host_named("consume", CallableKind::Host);
//! // Two tasks ordered through one buffer: the reader runs after the writer.
//! let buf = Tensor::external(0x10_0000, &[256], DataType::Float32)?;
//! let mut run = engine.begin_run()?;
//! let mut w = TaskArgs::new();
//! w.add_output(buf)?;
//! run.submit_sub(&produce, w)?;
//! let mut r = TaskArgs::new();
//! r.add_input(buf)?;
//! run.submit_sub(&consume, r)?;
//! let id = run.close();
//! engine.wait(id)?.into_result()?;
//! println!("{}", engine.release(id)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! How the engine works inside — the scheduler's combining lock, where each protocol is
//! written down, the loom models and the lock order — is in `docs/engine-protocols.md`.
//!
//! # Observability
//!
//! One `tracing` span per run (`run`, field `run.id`) and one per dispatched member (`task`, at
//! debug level); nothing above trace level on hot paths. The crate never installs a subscriber.

#![forbid(unsafe_code)]

mod builder;
mod core;
mod endpoint;
mod endpoint_thread;
mod engine;
mod error;
mod graph;
mod held_ready;
mod inbox;
mod outcome;
mod registry;
mod run_record;
mod scheduler;
mod slot;
mod submit;
mod sync;
mod task_protocol;

#[cfg(all(test, simpler_loom))]
mod loom_models;

pub use builder::RunBuilder;
pub use endpoint::{DispatchedMember, Endpoint, EndpointCaps, EndpointFailure};
pub use endpoint_thread::JobReceiver;
pub use engine::{Engine, EngineConfig};
pub use error::{SchedError, ShutdownError};
pub use outcome::{
    BusyEndpoint, EngineStats, RingPeak, RingPeaks, RunOutcome, RunSummary, TaskSnapshot,
};

// What the API takes and returns, so that one dependency line suffices.
pub use simpler_ring::{
    HeapBacking, HeapRegion, HeapRingStats, RingConfig, RingError, RingStats, WindowStats,
};
pub use simpler_types::{
    CallConfig, CallableId, CallableKind, CallableNamespace, CancelReason, DataType, DeviceCode,
    EndpointOutcome, FailureMechanism, FailureSource, GroupMemberState, RunFailure, RunId,
    RunState, RunStatus, SlotId, TaskArgs, TaskArgsView, TaskFailure, TaskId, TaskState, Tensor,
    TensorArgType, TypesError, WorkerId, WorkerRef, WorkerType,
};
