//! The chip runtimes and the runtime seam: the `ChipRuntime` trait the runner binds a run
//! through, and the `BoundRun` it gets back.
//!
//! - `arity`: what each kernel's signature says a task must pass it, checked at every submit.
//! - `orch`: the orchestration ops table and the safe `OrchCtx` (shared by both runtimes).
//! - `hbg`: host_build_graph — the graph is built on the host and uploaded whole.
//! - `trb`: tensormap_and_ringbuffer — the orchestration runs on an AICPU thread and the rings
//!   reclaim task slots, heap and dependency entries as tasks finish.
//!
//! Everything that differs between the runtimes happens behind `ChipRuntime::bind` and the
//! `BoundRun` methods: running (or preparing) the orchestration, the image layout and its
//! writing, capacity checks, and reading the runtime's state back after the run (latched
//! status, timing, swimlane records, the dependency graph and scope statistics). The runner
//! stays the same for every runtime: it validates the request, stages the tensors, uploads the
//! image the runtime wrote, launches, reaps and cleans up. `docs/device-seams.md` describes the
//! data flow.

pub(crate) mod arity;
pub mod hbg;
pub mod orch;
pub(crate) mod trb;

use std::fmt;
use std::time::Duration;

use simpler_types::{CallConfig, DeviceTaskId, RunId, Tensor, TensorArgType};

use crate::abi::codes::{RuntimeCode, StallClass};
use crate::abi::image::{KernelArity, SharedHeader};
use crate::abi::{CorePlace, CoreType};
use crate::aicpu::view::HostImageView;
use crate::callable::ChipCallable;
use crate::diag::timing::RunPhases;
use crate::diag::{DiagPlan, Exporter, Outcome};
use crate::error::{DeviceError, RuntimeFault, StallInfo};
use crate::options::{RingDefaults, RuntimeVariant};
use crate::runner::RunReport;

pub(crate) use self::hbg::builder::{BuildEnv, HeapArena};

/// `buf` cleared and zero-filled to an image of `len` bytes; `None` when the host cannot hold
/// that many (the allocation is tried, not assumed, so an oversized image is refused rather
/// than aborting the process).
pub(crate) fn sized_image(buf: &mut Vec<u8>, len: u64) -> Option<&mut [u8]> {
    let len = usize::try_from(len).ok()?;
    buf.clear();
    buf.try_reserve_exact(len).ok()?;
    buf.resize(len, 0);
    Some(buf.as_mut_slice())
}

/// A `DeviceObject` orchestration as the AICPU side loaded it at registration: the device
/// addresses of its C entry and config functions.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct DeviceOrchestration {
    /// The `COrchEntryFn`.
    pub(crate) entry: u64,
    /// The `COrchConfigFn`.
    pub(crate) config: u64,
}

/// What a runtime needs to bind one run: the request after the runner's checks and staging.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BindInputs<'a> {
    /// The run.
    pub(crate) run_id: RunId,
    /// The registered callable.
    pub(crate) callable: &'a ChipCallable,
    /// Its orchestration as the AICPU side loaded it (a `DeviceObject` under
    /// tensormap_and_ringbuffer), `None` for a host-run or `Native` one.
    pub(crate) device_orchestration: Option<DeviceOrchestration>,
    /// The arity of every kernel the callable registers, in ascending func id.
    pub(crate) kernels: &'a [KernelArity],
    /// Kernel entry address per func id (0 = unset).
    pub(crate) func_table: &'a [u64],
    /// The active-callable stamp (slot and registration generation) the image records.
    pub(crate) stamp: u64,
    /// The chip entry's tensors, staged (device addresses).
    pub(crate) tensors: &'a [Tensor],
    /// The chip entry's access tags, one per tensor.
    pub(crate) tags: &'a [TensorArgType],
    /// The chip entry's scalars.
    pub(crate) scalars: &'a [u64],
    /// The run's configuration.
    pub(crate) config: &'a CallConfig,
    /// Clusters of the launch.
    pub(crate) block_dim: u32,
    /// AICPU threads of the launch.
    pub(crate) threads: u32,
    /// The diagnostics the run latched.
    pub(crate) diag: &'a DiagPlan,
    /// The runner's ring defaults.
    pub(crate) rings: RingDefaults,
}

/// One chip runtime variant. Implementations are selected by [`select`] at attach.
pub(crate) trait ChipRuntime: Send + fmt::Debug {
    /// Checks this runtime's own rules on a run's configuration (preparation step 3).
    fn check_config(&self, run_id: Option<RunId>, config: &CallConfig) -> Result<(), DeviceError>;

    /// Checks this runtime's own limits on a callable's kernels when it is registered, so that
    /// a kernel no task could run is refused before any run names it.
    fn check_callable(&self, _callable: &ChipCallable) -> Result<(), DeviceError> {
        Ok(())
    }

    /// AICPU threads of a run whose `CallConfig::aicpu_thread_num` is 0 (the default).
    fn default_aicpu_threads(&self) -> u32 {
        crate::abi::DEFAULT_AICPU_THREADS
    }

    /// Binds one run (preparation step 7): runs or prepares its orchestration, checks the
    /// capacities and writes the run's runtime image into `image` (resized), ready to upload.
    /// `mem` is the runner's device memory as the runtime may use it.
    fn bind(
        &mut self,
        inputs: &BindInputs<'_>,
        mem: &mut dyn BuildEnv,
        image: &mut Vec<u8>,
    ) -> Result<Box<dyn BoundRun>, DeviceError>;
}

/// A run a runtime bound: what it knows about the run's image and how to read it back.
pub(crate) trait BoundRun: Send + fmt::Debug {
    /// Profiling flag bits of the launch (`abi::launch::PROFILE_*`).
    fn profiling(&self) -> u32;

    /// Records what binding learned (task and edge counts, ring high-water marks) in the
    /// report.
    fn describe(&self, report: &mut RunReport);

    /// Records what only the run itself learned (a runtime that builds its graph on the
    /// device: task counts, ring high-water marks), read from the image after both streams
    /// completed.
    fn read_back(&self, _image: &HostImageView<'_>, _report: &mut RunReport) {}

    /// The status the runtime latched during the run, read from the image after both streams
    /// completed; `None` when it latched none.
    fn latched_status(&self, image: &HostImageView<'_>) -> Option<RuntimeFault>;

    /// Device wall time and phases from the image's records; `launch_ticks` is the counter
    /// value when the AICore launch started. `None` when the records are incomplete.
    fn timing(&self, image: &HostImageView<'_>, launch_ticks: u64)
    -> Option<(Duration, RunPhases)>;

    /// Writes the run's diagnostic files by `outcome` (terminal cleanup step 2). `image` is
    /// `None` when the device image cannot be read (before the launch, or while the device
    /// may still be running).
    fn export(&self, image: Option<&HostImageView<'_>>, outcome: Outcome, out: &mut Exporter<'_>);
}

/// The runtime a runner attached with `variant` serves.
pub(crate) fn select(variant: RuntimeVariant, scheduler_budget: Duration) -> Box<dyn ChipRuntime> {
    match variant {
        RuntimeVariant::HostBuildGraph => Box::new(hbg::HostBuildGraph::new(scheduler_budget)),
        RuntimeVariant::TensormapAndRingbuffer => {
            Box::new(trb::bind::TensormapAndRingbuffer::new(scheduler_budget))
        }
    }
}

/// Reads the status latched in the shared header (the same for both runtimes): the
/// orchestration code if set, else the scheduler code, with the stall details of a scheduler
/// timeout. `block_dim` names the stuck core's type; `budget` is the scheduler budget.
pub(crate) fn latched_status(
    shared: &SharedHeader,
    block_dim: u32,
    budget: Duration,
) -> Option<RuntimeFault> {
    use std::sync::atomic::Ordering::Acquire;
    // Acquire: the host reads after both streams completed, which already orders the device's
    // writes before these loads; acquire keeps that true for any backend.
    let orch = shared.orch_error_code.load(Acquire);
    let sched = shared.sched_error_code.load(Acquire);
    let code = RuntimeCode::from_raw(if orch != 0 { orch } else { sched })?;
    let mut fault = RuntimeFault::new(code, String::new());
    fault.thread = Some(shared.error_thread.load(Acquire));
    if code == RuntimeCode::SchedulerTimeout {
        let stuck_task = shared.stuck_task.load(Acquire);
        let stuck_core = shared.stuck_core.load(Acquire);
        fault.stall = Some(StallInfo {
            class: StallClass::from_u32(shared.stall_class.load(Acquire)),
            stuck_task: (stuck_task != u64::MAX).then_some(DeviceTaskId(stuck_task)),
            stuck_core: (stuck_core != 0).then(|| {
                let c = stuck_core - 1;
                (c, CorePlace::of(c, block_dim).map_or(CoreType::Aiv, |p| p.core_type))
            }),
            running: shared.stall_running.load(Acquire),
            ready: shared.stall_ready.load(Acquire),
            waiting: shared.stall_waiting.load(Acquire),
            budget,
        });
        fault.task = fault.stall.as_ref().and_then(|s| s.stuck_task);
    }
    Some(fault)
}
