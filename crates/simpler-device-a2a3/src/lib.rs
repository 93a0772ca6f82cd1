//! `simpler-device-a2a3` — one Ascend A2/A3 chip (L2) behind a [`DeviceRunner`].
//!
//! Layer: above `simpler-types`, `simpler-tensormap` and `simpler-ring`; below the worker
//! crate (`simpler-worker`). It owns device memory, callable registration, the kernel ABI, the
//! chip runtimes and their diagnostics, a faithful simulator backend (feature `sim`, default)
//! and the onboard backend over CANN (feature `onboard`, `docs/device-onboard.md`; CANN is
//! loaded at run time, so it builds without CANN). It must not know
//! about hierarchy levels above L2. With `--no-default-features` it builds without any backend
//! and `attach` reports which feature is missing.
//!
//! A run goes `prepare` → [`launch_run`](DeviceRunner::launch_run) →
//! [`reap_run`](DeviceRunner::reap_run) → [`complete_run`](DeviceRunner::complete_run);
//! [`DeviceRunner::run`] does all four (`docs/device-runner.md` numbers the steps). The
//! simulator runs the real AICPU scheduler code ([`aicpu`]) on host threads; only the hardware
//! underneath (registers, streams, memory) is simulated.
//!
//! Two seams (`docs/device-seams.md`): the `Backend` trait (`backend`: which device; the
//! simulator and the onboard backend implement it) and the `ChipRuntime` trait ([`runtime`]:
//! which chip runtime; host_build_graph and tensormap_and_ringbuffer implement it). The runner
//! between them is the run-state machine only.
//!
//! Public modules: [`abi`] (`#[repr(C)]` layouts shared by host, AICPU and AICore), [`aicpu`]
//! (the AICPU scheduler behind [`aicpu::AicpuPlatform`]), [`runtime`] (the `ChipRuntime` trait,
//! the orchestration API, host_build_graph), [`callable`] (chip and core callables), [`kernel`]
//! (the kernel ABI), [`options`] and [`timeouts`] (what `attach` fixes), [`error`]
//! ([`DeviceError`]) and [`programs`] (reference chip programs). The private ones (backends,
//! the runner, diagnostics) are mapped in `docs/device-internals.md`.
//!
//! ```
//! use simpler_device_a2a3::programs::{f32_from_le_bytes, f32_to_le_bytes, vector};
//! use simpler_device_a2a3::{DeviceRunner, RunRequest, RunnerOptions, RuntimeVariant};
//! use simpler_types::{CallConfig, DataType, RunId, TaskArgs, Tensor};
//!
//! // A simulated chip (device 0) running the vector example f = (a+b+1)(a+b+2) + (a+b).
//! let mut runner = DeviceRunner::attach(RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph))?;
//! let slot = runner.register_callable(&vector::callable()?)?;
//! let (a, b) = (vec![1.0f32; 256], vec![2.0f32; 256]);
//! let [pa, pb, pf] = [runner.malloc(1024)?, runner.malloc(1024)?, runner.malloc(1024)?];
//! runner.copy_to_device(pa, &f32_to_le_bytes(&a))?;
//! runner.copy_to_device(pb, &f32_to_le_bytes(&b))?;
//! let on_chip = |p: simpler_device_a2a3::DevicePtr| {
//!     Tensor::external(p.addr(), &[256], DataType::Float32).map(|t| t.child_memory(true))
//! };
//! let mut args = TaskArgs::new();
//! args.add_input(on_chip(pa)?)?.add_input(on_chip(pb)?)?.add_output(on_chip(pf)?)?;
//! let run = RunId::from_raw(1).expect("non-zero");
//! runner.run(&RunRequest::new(run, slot, &args, &CallConfig::default()))?;
//! let mut raw = vec![0u8; 1024];
//! runner.copy_from_device(&mut raw, pf)?;
//! assert_eq!(f32_from_le_bytes(&raw), vector::reference(&a, &b));
//! runner.finalize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The crate's lock order is in `docs/device-internals.md`.
//!
//! Unsafe inventory — every file that contains `unsafe`, and why:
//! - `src/aicpu/view.rs`: the typed views over a runtime image in device memory.
//! - `src/aicpu/scheduler.rs`: payload writes through raw pointers.
//! - `src/aicpu/trace.rs`: the AICPU dispatch records (swimlane level 2) through raw pointers.
//! - `src/aicpu/trb/record.rs`: the trb orchestration thread's scope and submit records through
//!   raw pointers.
//! - `src/aicpu/trb/orchestration/mod.rs`: the trb orchestration thread's call of the
//!   orchestration entry the image names, the orchestration's arguments, and the per-slot task
//!   records it writes through raw pointers.
//! - `src/aicpu/trb/orchestration/ops.rs`: the trb ops table's C-ABI functions over the raw
//!   arguments an orchestration passes, and its tensor copies.
//! - `src/aicpu/trb/schedule.rs`: the trb scheduler threads' attach to the arena, and the
//!   per-slot task records and dispatch payloads through raw pointers.
//! - `src/runtime/trb/storage.rs`: the trb arena's typed sections over device memory.
//! - `src/runtime/trb/diag.rs`: the host's read of the trb scope and submit records.
//! - `src/backend/sim/mod.rs`: reading a launch's `KernelArgs` and building image views over
//!   simulated device memory.
//! - `src/backend/sim/memory.rs`: simulated device memory (allocation and the host copies).
//! - `src/backend/sim/aicore.rs`: the AICore executor's payload reads and kernel call, and the
//!   image pointers its launch state keeps (`Send`).
//! - `src/backend/sim/loader.rs`: the shared-object kernel loader (`dlopen`/`dlsym`).
//! - `src/backend/sim/cxx_core.rs`: calling the C++ AICore executor with its environment.
//! - `src/backend/sim/program.rs`: calling the built AICPU program's C entries and its host
//!   services' context pointer.
//! - `src/aicpu/program/mod.rs`: the AICPU program's entries over raw argument bytes, register
//!   windows by address and the cache-maintenance and counter instructions.
//! - `src/aicpu/program/register.rs`: the register entry's argument block, object bytes and
//!   reply through raw device addresses, and the dynamic loading of the orchestration object.
//! - `src/backend/sim/orchestration.rs`: the simulator's own load of an orchestration object.
//! - `src/backend/onboard/owners.rs`: the CANN calls of the safe owners (streams, device
//!   buffers and copies, host mappings, events, the loaded AICPU program) and their `Send` /
//!   `Sync` impls over CANN handles.
//! - `src/backend/onboard/programs.rs`: the bootstrap launch, AICPU program loading and the
//!   AICore executor registration.
//! - `src/backend/onboard/mod.rs`: attach, stream, core-limit, launch, sync, drain and
//!   register window calls, and the host-mapping offset.
//! - `src/backend/onboard/reset.rs`: the finalize resets, soft and forced, and the probe.
//! - `src/backend/onboard/events.rs`: taking a queued run's event out of its `ManuallyDrop`
//!   once, in its drop.
//! - `src/callable.rs`: the contracts of `SharedObjectKernel::new`,
//!   `OrchestrationObject::new` and `CoreCallable::new` / `native`, which pair a kernel with a
//!   signature (`unsafe fn`s).
//! - `src/abi/services.rs`: the host services table's function types, `unsafe` since they take
//!   the context pointer of the exec call the table came with.
//! - `src/kernel.rs`: the kernel accessors over the argument slots.
//! - `src/options.rs`: the contracts of `RunnerOptions::with_aicpu_program` and
//!   `RunnerOptions::with_aicore_executor` (`unsafe fn`s).
//! - `src/programs.rs`, `src/programs/streaming.rs`, `src/programs/paged_attention.rs`: the
//!   reference programs' kernels and their pairing with their signatures (and the contracts of
//!   `builder_with_mul` and `builder_with_orchestration_and_mul`); `src/programs/kernel_tests.rs`: their direct calls in
//!   tests.
//! - `src/runner/mod.rs`: the runner's host view of a run's image.
//! - `src/runner/memory.rs` and `src/runner/staging.rs`: host-tensor staging;
//!   `src/runner/complete.rs`: the copy-back into the staged host ranges.
//! - `src/runner/types.rs`: the contract of `RunRequest::with_host_tensors` (an `unsafe fn`).
//! - `src/runner/tests.rs`: a test kernel.
//! - `src/runner/loom_models.rs`: the slot bytes of the `loom` models, as `loom` cells.
//! - `src/runtime/orch.rs`, `src/runtime/hbg/mod.rs`, `src/runtime/hbg/builder/mod.rs`: the
//!   ops-table glue between an orchestration and the graph builder.
//! - `src/runtime/hbg/builder/tests.rs`: calls of that glue with the malformed arrays a C
//!   orchestration could pass.

// With no backend feature the backend-neutral types and the simulator-facing image views have
// no constructor; the crate still builds (every `attach` reports the missing feature), so the
// dead-code lint is off in that configuration only.
#![cfg_attr(not(feature = "sim"), allow(dead_code))]

pub mod abi;
pub mod aicpu;
mod backend;
pub mod callable;
mod diag;
pub mod error;
pub mod kernel;
pub mod options;
pub mod programs;
mod runner;
pub mod runtime;
pub mod timeouts;

#[cfg(feature = "onboard")]
pub use backend::onboard::{ENV_ONBOARD_ARTIFACTS, OnboardOptions};
#[cfg(feature = "sim")]
pub use backend::sim::{FaultPlan, FiredFault};
pub use callable::{
    ArgDirection, ChipCallable, ChipCallableBuilder, CoreCallable, KernelCode, NativeConfigFn,
    NativeOrchFn, OrchArgs, OrchConfig, Orchestration, OrchestrationObject, SharedObjectKernel,
};
pub use diag::timing::RunPhases;
#[cfg(feature = "onboard")]
pub use error::ManifestProblem;
pub use error::{
    ArgOverlap, ArgSite, ArgsProblem, ArityMismatch, CallableName, CallableProblem,
    CapacityResource, CopyKind, CoreFault, DeviceError, ErrorClass, InitFailure, InitStep,
    KernelCodeKind, KernelKind, MemPurpose, ObjectError, OrchFailure, OrchLoadCause, OrchOp,
    PointerArg, PoisonCause, PoisonStep, RingSizes, RunStep, RuntimeFault, StallInfo, StreamKind,
};
pub use kernel::{KernelCall, KernelFn};
#[cfg(feature = "sim")]
pub use options::{CoreDispatch, SimOptions};
pub use options::{
    ENV_RING_DEP_POOL, ENV_RING_HEAP, ENV_RING_TASK_WINDOW, LimitExceeded, Platform,
    PlatformLimits, RingDefaults, RunnerOptions, RuntimeVariant, UnknownRuntime,
};
pub use runner::{
    AcceptanceSignal, ActiveRun, ChipSlot, DeviceHealth, DevicePtr, DeviceRunner, FinalizeReport,
    HealthProbe, MAX_PIPELINE_SLOTS, MemoryLedger, Overlap, PreparedRun, RUN_ID_MEMORY,
    RingHighWater, RunReport, RunRequest, RunnerStats,
};
pub use runtime::orch::{Kernels, OrchCtx, OrchError};
pub use timeouts::{FixedBudgets, TimeoutConfig, TimeoutOverrides};
