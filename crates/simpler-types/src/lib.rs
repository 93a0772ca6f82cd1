//! `simpler-types` — the bottom layer of simpler: plain data shared by every other crate.
//!
//! Identifiers, state enums, the 128-byte tensor descriptor that kernels read, task-argument
//! builders, per-task call configuration and the failure vocabulary. This crate has no threads,
//! no I/O and no device knowledge, and it contains no `unsafe` code.

#![forbid(unsafe_code)]

pub mod constants;
pub mod ids;

pub use constants::*;
pub use ids::{
    CallableId, CallableKind, CallableNamespace, DeviceTaskId, RingIndex, RunId, SlotId, TaskId,
    WorkerId, WorkerRef, WorkerType,
};
