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
//! The scheduler's queues sit behind one lock; the thread that delivers an event (a ready task,
//! a completion) runs the scheduler pass itself when that lock is free and otherwise leaves the
//! event for the holder (`inbox`). The scheduler thread handles stop-and-drain and stall
//! deadlines. The reasons, with measurements, are in `docs/decisions/sched.md`.
//!
//! Protocols are documented next to their code, as numbered steps: the task-state protocol in
//! `task_protocol`, the run fence in `run_record`, admission in `registry`, the scheduler pass,
//! dispatch pass and scheduler thread in `scheduler`, the combining protocol in `inbox`, the
//! mailbox handoff and endpoint thread in `endpoint_thread`, reclamation, poisoning and cancellation in
//! `graph`, and stop-and-drain in `engine`. The small core protocols are model-checked with
//! `loom` through the `sync` shim (`loom_models`; run with
//! `RUSTFLAGS="--cfg simpler_loom" cargo test -p simpler-sched --release --lib loom`).
//!
//! # Lock order (the one place it is written down)
//!
//! The engine's locks are: the scheduler lock, a slot's `sync` lock, a slot's `payload` lock,
//! the tensor-map lock, the alloc-registry lock, the ring's locks (inside `simpler-ring`), a
//! run's `completion` lock, the registry lock, the scheduler inbox lock, a worker mailbox lock,
//! the scheduler thread's attention lock, and the shutdown lock.
//!
//! 0. The scheduler lock is the outermost: a pass holds it while it takes (one at a time) any of
//!    the locks below. It is never requested while another engine lock is held (the shutdown
//!    lock of rule 5 aside), and threads other than the scheduler thread only ever `try_lock`
//!    it.
//! 1. Besides the scheduler lock, a thread holds at most one of: a slot `sync` lock, the
//!    tensor-map lock, the alloc-registry lock, a ring lock, a run `completion` lock, the
//!    registry lock, the inbox lock, a mailbox lock, the attention lock.
//! 2. Exception: a slot's `payload` lock may be held (by the submitting thread while the slot is
//!    `Building`, by the reclaimer of a `Consumed` slot, or read by the pass that retires a
//!    finished slot's reader entries) while taking the tensor-map lock or the alloc-registry
//!    lock (deliberate: keeping the tensor-map lock a strict leaf would need the
//!    keys copied out of the payload first). No other thread uses that payload at those times,
//!    except a pass that reads a stale queue entry's payload and so may wait for the
//!    reclaimer's; that pass holds only the scheduler lock, which nobody in this chain requests.
//!    Neither leaf lock is ever held while a payload lock or the scheduler lock is requested, so
//!    no cycle can form.
//! 3. A worker holds a slot's `payload` read lock while its endpoint runs, and takes no engine
//!    lock meanwhile; the only writers of a payload (submit before publication, reclaimer after
//!    the last completion) never overlap a running member.
//! 4. A slot's `sync` lock may be held while recording into the run's atomic counters (not a
//!    lock), never while taking the run's `completion` lock.
//! 5. The shutdown lock is held for the whole of `shutdown` and taken by nothing else.
//!    Exception to rule 1: `Engine::release` holds the registry lock while it reads the ring's
//!    statistics and rewinds it (so that no run can be admitted in between); neither call
//!    blocks, and the ring's locks are leaves that never request an engine lock.
//! 6. Nothing blocks (ring allocation, waits, endpoint calls) while holding any lock of rule 1.
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
pub use outcome::{EngineStats, RingPeak, RingPeaks, RunOutcome, RunSummary, TaskSnapshot};
