//! `simpler-types` — the bottom layer of simpler: plain data shared by every other crate.
//!
//! Identifiers, state enums, the 128-byte tensor descriptor that kernels read, task-argument
//! builders, per-task call configuration and the failure vocabulary. This crate has no threads,
//! no I/O and no device knowledge, and it contains no `unsafe` code.

#![forbid(unsafe_code)]

// The descriptor and the argument blob are little-endian byte layouts read by kernels and by
// other processes; every supported host (x86_64, aarch64) and the device are little-endian.
#[cfg(target_endian = "big")]
compile_error!(
    "simpler-types encodes little-endian wire layouts and supports only little-endian targets"
);

pub mod args;
pub mod config;
pub mod constants;
pub mod dtype;
pub mod error;
pub mod failure;
pub mod ids;
pub mod state;
pub mod status;
pub mod tag;
pub mod tensor;

pub use args::{Args, ChipTaskArgs, CoreArgs, TaskArgs, TaskArgsView};
pub use config::{
    CallConfig, CallConfigBuilder, DumpArgsLevel, PmuEvent, RingOverride, RingSel, SwimlaneLevel,
};
pub use constants::*;
pub use dtype::{DataType, Scalar, from_scalar, to_scalar};
pub use error::TypesError;
pub use failure::{
    CancelReason, DeviceCode, FailureMechanism, RunFailure, TaskFailure, TimeoutBudget,
};
pub use ids::{
    CallableId, CallableKind, CallableNamespace, DeviceTaskId, RingIndex, RunId, SlotId, TaskId,
    WorkerId, WorkerRef, WorkerType,
};
pub use state::{EndpointOutcome, GroupMemberState, RunPhase, TaskState};
pub use status::RunStatus;
pub use tag::TensorArgType;
pub use tensor::Tensor;
