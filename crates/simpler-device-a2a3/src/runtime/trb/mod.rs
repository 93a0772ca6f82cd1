//! tensormap_and_ringbuffer: the runtime whose orchestration builds the task graph on the
//! device while the schedulers dispatch, and reclaims task slots, heap and dependency entries
//! through per-scope-depth rings, so graphs far larger than the window run in bounded memory.
//!
//! - `sizing`: the three sizes of every ring, resolved from the run's configuration, the
//!   runner's defaults and the built-in defaults.
//! - `engine`: the submit and completion state machine over the fixed-capacity cores (task
//!   window, heap ring, dependency pool, tensor map) and the typed stalls it reports; the
//!   orchestration owns it, scheduler threads complete tasks through a shared handle.
//! - `ready`: the bounded multi-producer, multi-consumer queue of ready task ids.
//! - `storage`: the arena's layout in device memory and the typed sections over it.
//! - `accesses`: a submit's tensor arguments and tags as the engine's tensor-map accesses.
//! - `bind`: the runtime's `ChipRuntime` and `BoundRun`.
//! - `diag`: what a run asks the device to record for the diagnostics, the host replay of the
//!   submit records, and the scope statistics.
//! - `image`: the trb image (runtime section, orchestration arguments) and its status record.
//!
//! The AICPU side (the orchestration thread and the scheduler threads) is `aicpu::trb`;
//! `docs/device-trb.md` describes both halves.

pub(crate) mod accesses;
pub(crate) mod bind;
pub(crate) mod diag;
pub(crate) mod engine;
pub(crate) mod image;
pub(crate) mod ready;
pub(crate) mod sizing;
pub(crate) mod storage;
