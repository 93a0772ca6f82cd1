//! `simpler-device-a2a3` — one Ascend A2/A3 chip (L2) behind a [`DeviceRunner`].
//!
//! Layer: above `simpler-types`, `simpler-tensormap` and `simpler-ring`; below the core
//! crate. It owns device memory, callable registration, the kernel ABI, the chip runtimes and
//! their diagnostics, and a faithful simulator backend (feature `sim`, default). It must not
//! know about hierarchy levels above L2.
//!
//! A run goes `prepare` → [`launch_run`](DeviceRunner::launch_run) →
//! [`reap_run`](DeviceRunner::reap_run) → [`complete_run`](DeviceRunner::complete_run);
//! [`DeviceRunner::run`] does all four. The simulator runs the real AICPU scheduler code
//! ([`aicpu`]) on host threads; only the hardware underneath (registers, streams, memory) is
//! simulated.
//!
//! Modules:
//! - [`abi`]: `#[repr(C)]` layouts shared by host, AICPU and AICore, asserted at compile time.
//! - [`aicpu`]: the AICPU scheduler behind the [`aicpu::AicpuPlatform`] trait.
//! - `aicore`: the simulated AICore executor.
//! - `backend`: the simulated device (streams, registers, memory, threads, fault injection).
//! - [`runtime`]: the orchestration API and host_build_graph.
//! - `runner`: [`DeviceRunner`], the run sequence, cleanup and health.
//! - `diag`: wall time, swimlane, dependency graph and scope statistics files.
//! - [`kernel`]: the kernel ABI.
//! - [`programs`]: reference chip programs (vector example, bgemm) used by the examples, tests
//!   and benchmarks.
//!
//! Lock order (the only nested acquisitions): a simulated stream's lock, then a thread
//! mailbox's lock or an event's lock. Every other lock (memory, fault plan, fault log, event
//! counts, health) is a leaf. The AICPU scheduler takes no lock at all.
//!
//! Unsafe code is confined to: simulated memory (`backend::sim::memory`), the image view
//! (`aicpu::view`), payload writes (`aicpu::scheduler::send`), the AICore executor's kernel call,
//! the kernel accessors, the ops-table glue (`runtime::orch`, `runtime::hbg::builder`) and
//! host-tensor staging (`runner::staging`), the shared-object kernel loader
//! (`backend::sim::loader`) and the reference programs' kernels (`programs`).

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

#[cfg(feature = "sim")]
pub use backend::sim::{FaultPlan, FiredFault};
pub use callable::{
    ArgDirection, ChipCallable, ChipCallableBuilder, CoreCallable, KernelCode, NativeConfigFn,
    NativeOrchFn, OrchArgs, OrchConfig, Orchestration, SharedObjectKernel,
};
pub use diag::timing::RunPhases;
pub use error::{
    CapacityResource, CoreFault, DeviceError, ErrorClass, InitStep, KernelKind, MemPurpose,
    PoisonCause, PoisonStep, RingSizes, RuntimeFault, StallInfo, StreamKind,
};
pub use kernel::{KernelCall, KernelFn};
#[cfg(feature = "sim")]
pub use options::SimOptions;
pub use options::{Platform, RingDefaults, RunnerOptions, RuntimeVariant};
pub use runner::{
    ChipSlot, DeviceHealth, DevicePtr, DeviceRunner, FinalizeReport, HealthProbe, MemoryLedger,
    RingHighWater, RunReport, RunRequest, RunnerStats,
};
pub use runtime::orch::{Kernels, OrchCtx, OrchError};
pub use timeouts::{FixedBudgets, TimeoutConfig, TimeoutOverrides};
