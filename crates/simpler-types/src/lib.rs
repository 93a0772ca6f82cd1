//! `simpler-types` — the bottom layer of simpler: plain data shared by every other crate.
//!
//! Identifiers, state enums, the 128-byte tensor descriptor that kernels read, task-argument
//! builders, per-task call configuration and the failure vocabulary. This crate has no threads,
//! no I/O and no device knowledge, and it contains no `unsafe` code.
//!
//! | Module | Holds |
//! |---|---|
//! | [`constants`] | sizes, caps and defaults |
//! | [`ids`] | run, task, slot, worker, ring and callable identifiers |
//! | [`state`], [`status`] | run states, task states, member outcomes, the run snapshot |
//! | [`tag`] | access tags and the dependency rules they imply |
//! | [`dtype`] | element types and scalar packing |
//! | [`tensor`] | the 128-byte descriptor, its validation and views |
//! | [`args`] | task-argument builders, their view and the blob encoding |
//! | [`config`] | per-task call configuration and its validating builder |
//! | [`failure`] | how a task or run failed |
//! | [`error`] | [`TypesError`], returned by every fallible function here |
//!
//! ```
//! use simpler_types::{CallConfig, DataType, RingSel, TaskArgs, Tensor};
//!
//! # fn main() -> Result<(), simpler_types::TypesError> {
//! let x = Tensor::external(0x1000, &[4, 8], DataType::Float32)?;
//! let mut args = TaskArgs::new();
//! args.add_input(x.slice(1, 0, 8, 2)?)?.add_output(Tensor::external(0x2000, &[4, 4], DataType::Float32)?)?;
//! args.add_scalar_of(0.5f32)?;
//! assert_eq!(args.view().tensors.len(), 2);
//!
//! let config = CallConfig::builder().block_dim(8).heap_bytes(RingSel::All, 1 << 20).build()?;
//! assert!(!config.diagnostics_any());
//! # Ok(())
//! # }
//! ```

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
    CancelReason, DeviceCode, FailureMechanism, FailureSource, RunFailure, TaskFailure,
    TimeoutBudget,
};
pub use ids::{
    CallableId, CallableKind, CallableNamespace, DeviceTaskId, RingIndex, RunId, SlotId, TaskId,
    WorkerId, WorkerRef, WorkerType,
};
pub use state::{EndpointOutcome, GroupMemberState, RunState, TaskState};
pub use status::RunStatus;
pub use tag::TensorArgType;
pub use tensor::{Tensor, overlapping_write};
