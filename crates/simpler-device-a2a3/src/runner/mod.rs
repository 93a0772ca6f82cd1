//! `DeviceRunner`: one chip behind prepare → `launch_run` → `reap_run` → `complete_run`.
//!
//! This module is the run-state machine only; `docs/device-runner.md` describes the lifecycle
//! with its numbered steps (P1–P18, L1–L3, R1–R3, C1–C3) and the terminal cleanup, which the
//! comments below refer to. What differs between chip runtimes happens behind
//! [`ChipRuntime`]; what differs between devices behind
//! [`Backend`]; memory and arenas live in `memory`, callables in `callables`.
//!
//! Run-state protocol (one run at a time):
//!
//! 1. `prepare` takes the runner from *idle* to *prepared*, or back to *idle* with the run's
//!    terminal cleanup done and an error.
//! 2. `launch_run` takes *prepared* to *launched*: the AICore kernel first, then the AICPU
//!    kernel, with no synchronisation and no cleanup on success. A launch failure runs
//!    recover-or-mark-unusable and the terminal cleanup and returns to *idle*.
//! 3. `reap_run` takes *launched* to *reaped*. It takes no arguments and reads only the
//!    in-flight run record, so a later change can defer it. A sync failure runs
//!    recover-or-mark-unusable and the terminal cleanup and returns to *idle*.
//! 4. `complete_run` takes *reaped* back to *idle*: handshake report, latched status,
//!    copy-back, terminal cleanup.
//!
//! Calls out of order return `Busy`. The terminal cleanup (`finish`) has one latch per step
//! (stop collectors, export, release), so it runs at most once per step whichever path reaches
//! it first — a failure, success, `abandon_prepared`, `finalize` or `Drop`. Each step works on
//! the run taken out of the runner under a guard (`FinishOnUnwind`) that runs the cleanup if the
//! thread unwinds, so a panic inside a step cannot skip it. User code called on the host (the
//! orchestration's config function and entry) runs inside `catch_unwind` and becomes
//! `Orchestration`.
//!
//! Memory calls that read or write device memory (`free`, copies, `memset`) are refused with
//! `Busy` while a run is launched and not yet reaped: the simulated cores may be using that
//! memory (decision). `free` is refused from `prepare` on: the prepared image already holds the
//! addresses of the run's tensors, so freeing one of them would hand the launch a dangling
//! pointer (decision: refusing every `free` is simpler to reason about than tracking which
//! allocations the image references, and a caller that needs to free can `abandon_prepared`).

mod api;
mod callables;
mod checks;
mod health;
mod memory;
mod staging;
#[cfg(all(test, feature = "sim"))]
mod tests;
mod types;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use simpler_types::RunId;

pub use health::{DeviceHealth, HealthProbe};
pub use types::{
    ChipSlot, DevicePtr, FinalizeReport, MemoryLedger, RingHighWater, RunReport, RunRequest,
    RunnerStats,
};

use self::callables::CallableTable;
use self::health::HealthCell;
use self::memory::{Arenas, RunMemory};
use self::staging::{StagedTensor, host_slice_mut};
use crate::abi::ABI_VERSION;
use crate::abi::codes::AclCode;
use crate::abi::launch::KernelArgs;
use crate::aicpu::view::HostImageView;
use crate::backend::{AllocFailure, Backend, LaunchHandle, StreamStatus, SyncError};
use crate::diag::{DiagPlan, Exporter, Outcome};
use crate::error::{
    CoreFault, DeviceError, InitStep, KernelKind, MemPurpose, PoisonCause, PoisonStep,
    RuntimeFault, StreamKind,
};
use crate::options::RunnerOptions;
use crate::runtime::{BindInputs, BoundRun, ChipRuntime};
use crate::timeouts::TimeoutConfig;

/// Where a run is in the protocol.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stage {
    Prepared,
    Launched,
    Reaped,
}

impl Stage {
    fn describe(self) -> &'static str {
        match self {
            Stage::Prepared => "a run is prepared",
            Stage::Launched => "a run is launched and not reaped",
            Stage::Reaped => "a run is reaped and not completed",
        }
    }
}

/// Per-step latches of the terminal cleanup.
#[derive(Clone, Copy, Debug, Default)]
struct Latches {
    stopped: bool,
    exported: bool,
    released: bool,
}

/// Everything one run owns between `prepare` and the end of its terminal cleanup.
#[derive(Debug)]
struct ActiveRun {
    stage: Stage,
    run_id: RunId,
    slot: ChipSlot,
    diag: DiagPlan,
    block_dim: u32,
    threads: u32,
    /// What the runtime bound (P7); `None` before the bind and after the release.
    bound: Option<Box<dyn BoundRun>>,
    image_addr: u64,
    image_len: u64,
    staged: Vec<StagedTensor>,
    aicore: Option<LaunchHandle>,
    latched: Option<RuntimeFault>,
    latches: Latches,
    report: RunReport,
}

/// Runs the terminal cleanup of a run held outside `Core::run` when the thread unwinds through
/// the guard's scope. A normal exit does nothing: every normal path ends the run (or stores it
/// back) itself, and `finish`'s latches make an extra call harmless if this guard is dropped
/// during some unrelated, outer unwinding.
struct FinishOnUnwind<'a> {
    core: &'a mut Core,
    run: &'a mut ActiveRun,
    outcome: Outcome,
}

impl Drop for FinishOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.core.finish(self.run, self.outcome);
        }
    }
}

/// The state of an attached runner.
#[derive(Debug)]
struct Core {
    opts: RunnerOptions,
    timeouts: TimeoutConfig,
    backend: Box<dyn Backend>,
    runtime: Box<dyn ChipRuntime>,
    initialized: bool,
    max_block_dim: u32,
    health: Arc<HealthCell>,
    callables: CallableTable,
    user_allocs: BTreeMap<u64, u64>,
    arenas: Arenas,
    kernel_args: Option<u64>,
    regs_table: Option<u64>,
    host_image: Vec<u8>,
    run: Option<ActiveRun>,
    stats: RunnerStats,
}

/// One Ascend A2/A3 chip (simulated with the default `sim` feature).
///
/// `Send`, not `Sync`: one thread (a chip worker's lane) drives it. Dropping it runs
/// [`DeviceRunner::finalize`] and logs its errors.
#[derive(Debug)]
pub struct DeviceRunner {
    core: Option<Core>,
    /// `Send` but not `Sync`: one thread drives a device (onboard, CANN binds it per thread).
    _not_sync: PhantomData<Cell<()>>,
}

fn unusable(core: &Core) -> Result<(), DeviceError> {
    match core.health.get() {
        DeviceHealth::Healthy => Ok(()),
        DeviceHealth::Unusable { cause } => {
            Err(DeviceError::Unusable { device_id: core.opts.device_id, cause })
        }
    }
}

fn busy(call: &'static str, state: impl Into<String>) -> DeviceError {
    DeviceError::Busy { call, state: state.into() }
}

fn oom(run_id: Option<RunId>, bytes: u64, purpose: MemPurpose, f: AllocFailure) -> DeviceError {
    DeviceError::OutOfMemory {
        run_id,
        bytes,
        purpose,
        limit: match f {
            AllocFailure::Limit(l) => Some(l),
            AllocFailure::Host => None,
        },
    }
}

/// The host's view of `run`'s image, if the backend can map it.
///
/// Callers build it only while no device thread runs the image: before the launch, after both
/// streams completed, or after a drain found them idle.
fn image_view<'a>(backend: &'a dyn Backend, run: &ActiveRun) -> Option<HostImageView<'a>> {
    let base = backend.host_map(run.image_addr, run.image_len)?;
    // SAFETY: `host_map` checked that the range is one live device allocation (the image
    // arena, which the runner keeps allocated while the run exists), mapped at `base` for as
    // long as the backend borrow lives; the image was written by `write_image` and uploaded at
    // P14; callers build the view only while no device thread runs it (see above).
    unsafe { HostImageView::from_raw(base, run.image_len) }.ok()
}

impl Core {
    fn prepare(&mut self, req: &RunRequest<'_>) -> Result<(), DeviceError> {
        if let Some(r) = &self.run {
            return Err(busy("prepare", r.stage.describe()));
        }
        // P1.
        let cfg = req.config;
        let diag = DiagPlan {
            swimlane: cfg.swimlane() as u32,
            dep_gen: cfg.dep_gen(),
            scope_stats: cfg.scope_stats(),
            prefix: cfg.output_prefix_shared().cloned(),
        };
        // P2.
        unusable(self)?;
        // P3.
        let (block_dim, threads) = self.device_rules(Some(req.run_id), cfg)?;
        // P4.
        if self.callables.get(req.callable.0).is_none() {
            return Err(DeviceError::UnknownCallable {
                run_id: Some(req.run_id),
                slot: req.callable.0,
            });
        }
        // P5.
        self.ensure_initialized().map_err(|e| e.in_run(req.run_id))?;
        let mut run = ActiveRun {
            stage: Stage::Prepared,
            run_id: req.run_id,
            slot: req.callable,
            diag,
            block_dim,
            threads,
            bound: None,
            image_addr: 0,
            image_len: 0,
            staged: Vec::new(),
            aicore: None,
            latched: None,
            latches: Latches::default(),
            report: RunReport {
                run_id: Some(req.run_id),
                origin: req.origin(),
                block_dim,
                aicpu_threads: threads,
                ..RunReport::default()
            },
        };
        // P6–P16; on failure (or a panic) the terminal cleanup runs in before-launch mode.
        let bound =
            self.guarded(&mut run, Outcome::FailedBeforeLaunch, |core, run| core.bind(req, run));
        match bound.map_err(|e| e.in_run(req.run_id)) {
            Ok(()) => {
                self.run = Some(run);
                Ok(())
            }
            Err(e) => {
                self.finish(&mut run, Outcome::FailedBeforeLaunch);
                Err(e)
            }
        }
    }

    /// P6–P16: stage the tensors, let the runtime bind the run and write its image, upload
    /// the image and the kernel arguments.
    fn bind(&mut self, req: &RunRequest<'_>, run: &mut ActiveRun) -> Result<(), DeviceError> {
        let run_id = req.run_id;
        // P7: stage the entry tensors, then bind through the runtime (P13: the stamp is taken
        // from the registration checked here).
        let tensors = self.stage_tensors(req, run)?;
        let Some(reg) = self.callables.get(req.callable.0) else {
            return Err(DeviceError::UnknownCallable {
                run_id: Some(run_id),
                slot: req.callable.0,
            });
        };
        let inputs = BindInputs {
            run_id,
            callable: &reg.callable,
            funcs: &reg.funcs,
            func_table: &reg.func_table,
            stamp: (reg.generation << 8) | u64::from(req.callable.0),
            tensors: &tensors,
            tags: req.args.tags(),
            scalars: req.args.scalars(),
            config: req.config,
            block_dim: run.block_dim,
            threads: run.threads,
            diag: &run.diag,
            rings: self.opts.rings,
        };
        let mut mem =
            RunMemory { backend: &*self.backend, heap: &mut self.arenas.heap, run_id, misses: 0 };
        let bound = self.runtime.bind(&inputs, &mut mem, &mut self.host_image);
        self.stats.arena_cache_misses += mem.misses;
        if let Err(DeviceError::OutOfMemory { purpose: MemPurpose::HeapArena, .. }) = &bound {
            // As for the image and staging arenas: a failed arena allocation releases every
            // pooled arena, so the retry starts from free device memory.
            self.release_arenas();
        }
        let bound = bound?;
        bound.describe(&mut run.report);
        let profiling = bound.profiling();
        run.bound = Some(bound);
        // P14: upload the image (the device copy is reused while it is large enough).
        let len = self.host_image.len() as u64;
        let image_addr = self.image_arena(run_id, len)?;
        if !self.backend.write(image_addr, &self.host_image) {
            return Err(DeviceError::BadDevicePointer {
                run_id: Some(run_id),
                addr: image_addr,
                len,
            });
        }
        run.image_addr = image_addr;
        run.image_len = len;
        // P16: upload KernelArgs.
        let ka = KernelArgs {
            abi_version: ABI_VERSION,
            block_dim: run.block_dim,
            num_aicore: 3 * run.block_dim,
            aicpu_threads: run.threads,
            image_base: image_addr,
            image_len: len,
            regs_table: self.regs_table.unwrap_or(0),
            profiling,
            ..KernelArgs::default()
        };
        let Some(ka_addr) = self.kernel_args else {
            return Err(DeviceError::Init {
                run_id: Some(run_id),
                step: InitStep::AicpuInit,
                message: "no kernel argument block".into(),
            });
        };
        self.backend.write(ka_addr, bytemuck::bytes_of(&ka));
        Ok(())
    }

    /// Runs `steps` on a run taken out of `self.run`, with the terminal cleanup armed for an
    /// unwinding panic (the cleanup runs on panics too).
    fn guarded<T>(
        &mut self,
        run: &mut ActiveRun,
        on_panic: Outcome,
        steps: impl FnOnce(&mut Core, &mut ActiveRun) -> T,
    ) -> T {
        let mut guard = FinishOnUnwind { core: self, run, outcome: on_panic };
        let FinishOnUnwind { core, run, .. } = &mut guard;
        steps(core, run)
    }

    fn take_run(&mut self, call: &'static str, want: Stage) -> Result<ActiveRun, DeviceError> {
        match self.run.take() {
            Some(r) if r.stage == want => Ok(r),
            Some(r) => {
                let state = r.stage.describe();
                self.run = Some(r);
                Err(busy(call, state))
            }
            None => Err(busy(call, "no run is prepared")),
        }
    }

    fn launch_run(&mut self) -> Result<(), DeviceError> {
        let mut run = self.take_run("launch_run", Stage::Prepared)?;
        let launched = self.guarded(&mut run, Outcome::FailedAfterLaunch, Core::launch_steps);
        if launched.is_ok() {
            run.stage = Stage::Launched;
            self.run = Some(run);
        }
        launched
    }

    /// L1–L3 on a run taken out of `self.run`; a failure has run the terminal cleanup.
    fn launch_steps(&mut self, run: &mut ActiveRun) -> Result<(), DeviceError> {
        // L1.
        self.clear_handshakes(run);
        let args = self.kernel_args.unwrap_or(0);
        // L2: AICore first.
        match self.backend.launch_aicore(run.block_dim, args) {
            Ok(l) => {
                self.stats.aicore_launches += 1;
                run.aicore = Some(l);
            }
            Err(code) => {
                self.recover_or_mark_unusable(run.run_id, PoisonStep::LaunchAiCore, code);
                self.finish(run, Outcome::FailedBeforeLaunch);
                let kernel = KernelKind::AiCore;
                return Err(DeviceError::Launch { run_id: run.run_id, kernel, code });
            }
        }
        // L3: then AICPU.
        match self.backend.launch_aicpu(run.threads, args) {
            Ok(_) => self.stats.aicpu_launches += 1,
            Err(code) => {
                self.recover_or_mark_unusable(run.run_id, PoisonStep::LaunchAicpu, code);
                self.finish(run, Outcome::FailedAfterLaunch);
                let kernel = KernelKind::Aicpu;
                return Err(DeviceError::Launch { run_id: run.run_id, kernel, code });
            }
        }
        Ok(())
    }

    /// L1: every `aicore_done` of the launch reads 0 on the device, whatever the image held
    /// since the upload, so the AICPU never takes a stale value for a core reporting in.
    fn clear_handshakes(&self, run: &ActiveRun) {
        let Some(view) = image_view(&*self.backend, run) else { return };
        for c in 0..3 * run.block_dim {
            // Relaxed: the launch that follows publishes the image to the device threads.
            view.handshake(c).aicore_done.store(0, Ordering::Relaxed);
        }
    }

    /// Bounded drain, then unconditionally unusable (`docs/device-runner.md`, "Recovery").
    fn recover_or_mark_unusable(&mut self, run_id: RunId, step: PoisonStep, code: AclCode) {
        self.stats.recoveries += 1;
        let drained = self.backend.drain(self.timeouts.stream_sync, self.timeouts.op_execute);
        tracing::error!(device = self.opts.device_id, %run_id, %step, %code, drained, "device unusable after a failed run");
        self.health.poison(PoisonCause { run_id, step, code });
    }

    fn reap_run(&mut self) -> Result<(), DeviceError> {
        let mut run = self.take_run("reap_run", Stage::Launched)?;
        let reaped = self.guarded(&mut run, Outcome::FailedAfterLaunch, Core::reap_steps);
        if reaped.is_ok() {
            run.stage = Stage::Reaped;
            self.run = Some(run);
        }
        reaped
    }

    /// R1–R3 on a run taken out of `self.run`; a failure has run the terminal cleanup.
    fn reap_steps(&mut self, run: &mut ActiveRun) -> Result<(), DeviceError> {
        let (sync, op) = (self.timeouts.stream_sync, self.timeouts.op_execute);
        // R1: AICPU stream, then AICore stream.
        let mut failure = None;
        for (stream, step) in [
            (StreamKind::Aicpu, PoisonStep::SyncAicpu),
            (StreamKind::AiCore, PoisonStep::SyncAiCore),
        ] {
            if let Err(e) = self.backend.synchronize(stream, sync, op) {
                failure = Some((stream, step, e));
                break;
            }
        }
        if let Some((stream, step, e)) = failure {
            return Err(self.sync_failure(run, stream, step, e));
        }
        // R3: timing (soft), then the collectors in the outcome the latched status implies.
        self.read_results(run);
        let outcome =
            if run.latched.is_some() { Outcome::FailedAfterLaunch } else { Outcome::Success };
        self.stop_and_export(run, outcome);
        Ok(())
    }

    /// R2: recover, collect what the device reported (earliest fault first) and the latched
    /// status when the device went idle, run the terminal cleanup, and type the error.
    fn sync_failure(
        &mut self,
        run: &mut ActiveRun,
        stream: StreamKind,
        step: PoisonStep,
        e: SyncError,
    ) -> DeviceError {
        let (sync, op) = (self.timeouts.stream_sync, self.timeouts.op_execute);
        let code = match &e {
            SyncError::Timeout => AclCode::STREAM_SYNC_TIMEOUT,
            SyncError::Fault(f) => f.code,
        };
        self.recover_or_mark_unusable(run.run_id, step, code);
        let other =
            if stream == StreamKind::Aicpu { StreamKind::AiCore } else { StreamKind::Aicpu };
        let other_status = self.backend.query(other, op);
        let idle = self.backend.drain(Duration::ZERO, op);
        let runtime = if idle { self.latched_status(run) } else { None };
        let mut faults = self.backend.take_faults();
        if let StreamStatus::Failed(f) = other_status
            && !faults.iter().any(|x| x.stream == other && x.code == f.code)
        {
            faults.push(CoreFault {
                code: f.code,
                stream: other,
                core: None,
                func_id: None,
                task: None,
                message: f.message,
                at_ticks: u64::MAX,
            });
        }
        faults.sort_by_key(|f| f.at_ticks);
        self.finish(run, Outcome::FailedAfterLaunch);
        let runtime = runtime.map(Box::new);
        let run_id = run.run_id;
        match e {
            SyncError::Timeout => DeviceError::Timeout {
                run_id,
                budget: simpler_types::TimeoutBudget::StreamSync,
                limit: sync,
                runtime,
                faults,
            },
            SyncError::Fault(f) if f.code == AclCode::AICORE_TIMEOUT => DeviceError::Timeout {
                run_id,
                budget: simpler_types::TimeoutBudget::OpExecute,
                limit: op,
                runtime,
                faults,
            },
            SyncError::Fault(f) => {
                let (code, stream) =
                    faults.first().map_or((f.code, stream), |x| (x.code, x.stream));
                DeviceError::DeviceFault { run_id, code, stream, faults, runtime }
            }
        }
    }

    /// The runtime's latched status (device idle).
    fn latched_status(&self, run: &ActiveRun) -> Option<RuntimeFault> {
        let view = image_view(&*self.backend, run)?;
        run.bound.as_ref()?.latched_status(&view)
    }

    /// R3's reads after both streams completed: latched status and device timing (soft).
    fn read_results(&self, run: &mut ActiveRun) {
        let (Some(view), Some(bound)) = (image_view(&*self.backend, run), run.bound.as_ref())
        else {
            run.report.warnings.push("device timing could not be read".into());
            return;
        };
        run.latched = bound.latched_status(&view);
        let launch = run.aicore.as_ref().map_or(0, |l| l.started_ticks());
        match bound.timing(&view, launch) {
            Some((wall, phases)) => {
                run.report.device_wall = Some(wall);
                run.report.phases = Some(phases);
            }
            None => run.report.warnings.push("device timing records are incomplete".into()),
        }
    }

    fn complete_run(&mut self) -> Result<RunReport, DeviceError> {
        let mut run = self.take_run("complete_run", Stage::Reaped)?;
        self.guarded(&mut run, Outcome::FailedAfterLaunch, Core::complete_steps)
    }

    /// C1–C3 on a run taken out of `self.run`; the terminal cleanup has run either way.
    fn complete_steps(&mut self, run: &mut ActiveRun) -> Result<RunReport, DeviceError> {
        // C1.
        self.handshake_report(run);
        // C2.
        let result = match run.latched.take() {
            Some(fault) => Err(DeviceError::Runtime { run_id: run.run_id, fault: Box::new(fault) }),
            None => {
                for s in &run.staged {
                    if !s.copy_back {
                        continue;
                    }
                    // SAFETY: `with_host_tensors`' contract makes the host range writable and
                    // unused by anyone else until the run ends.
                    if let Some(dst) = unsafe { host_slice_mut(s.host_addr, s.bytes) } {
                        self.backend.read(s.dev_addr, dst);
                    }
                }
                self.stats.runs_completed += 1;
                Ok(())
            }
        };
        // C3.
        let outcome = if result.is_ok() { Outcome::Success } else { Outcome::FailedAfterLaunch };
        self.finish(run, outcome);
        result.map(|()| std::mem::take(&mut run.report))
    }

    fn abandon_prepared(&mut self) -> Result<(), DeviceError> {
        let mut run = self.take_run("abandon_prepared", Stage::Prepared)?;
        self.finish(&mut run, Outcome::FailedBeforeLaunch);
        Ok(())
    }

    /// C1: the handshake record of every core of the launch, at debug level.
    fn handshake_report(&self, run: &ActiveRun) {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let Some(view) = image_view(&*self.backend, run) else { return };
        for c in 0..3 * run.block_dim {
            let h = view.handshake(c);
            tracing::debug!(
                run = %run.run_id,
                core = c,
                aicore_done = h.aicore_done.load(Ordering::Relaxed),
                aicpu_ready = h.aicpu_ready.load(Ordering::Relaxed),
                task = h.task.load(Ordering::Relaxed),
                core_type = h.core_type.load(Ordering::Relaxed),
                physical = h.physical_core_id.load(Ordering::Relaxed),
                "handshake"
            );
        }
    }

    /// Terminal cleanup steps 1 and 2, each at most once per run.
    fn stop_and_export(&mut self, run: &mut ActiveRun, outcome: Outcome) {
        if !run.latches.stopped {
            // The simulator's collectors are buffers inside the image: there are no collector
            // threads to stop or join.
            run.latches.stopped = true;
        }
        if !run.latches.exported {
            run.latches.exported = true;
            self.stats.exports += 1;
            self.export(run, outcome);
        }
    }

    /// The terminal cleanup: stop, export, release; each step latched.
    fn finish(&mut self, run: &mut ActiveRun, outcome: Outcome) {
        self.stop_and_export(run, outcome);
        if !run.latches.released {
            run.latches.released = true;
            self.stats.terminal_cleanups += 1;
            // Per-run resources: staging leases (the arena itself is pooled) and the bound run.
            run.staged.clear();
            run.bound = None;
        }
    }

    /// Terminal cleanup step 2: the runtime writes the run's files; the device image is read
    /// only when the device is idle.
    fn export(&mut self, run: &mut ActiveRun, outcome: Outcome) {
        let Some(prefix) = run.diag.prefix.clone() else { return };
        let Some(bound) = run.bound.as_ref() else { return };
        let device_readable = match outcome {
            Outcome::Success => true,
            Outcome::FailedBeforeLaunch => false,
            // After a failure the simulated cores may still be running; read the image only
            // when both streams are idle.
            Outcome::FailedAfterLaunch => {
                self.backend.drain(Duration::ZERO, self.timeouts.op_execute)
            }
        };
        let view = if device_readable { image_view(&*self.backend, run) } else { None };
        let mut out = Exporter::new(&prefix, &mut run.report);
        if device_readable && view.is_none() && run.diag.swimlane > 0 {
            out.warn("swimlane records could not be read");
        }
        bound.export(view.as_ref(), outcome, &mut out);
    }

    fn finalize(mut self) -> Result<FinalizeReport, DeviceError> {
        let mut report = FinalizeReport::default();
        // (3) Terminal cleanup of any unfinished run.
        if let Some(mut run) = self.run.take() {
            report.abandoned_run = Some(run.run_id);
            let outcome = match run.stage {
                Stage::Prepared => Outcome::FailedBeforeLaunch,
                Stage::Launched | Stage::Reaped => Outcome::FailedAfterLaunch,
            };
            self.finish(&mut run, outcome);
        }
        // (4)–(5) Reset the device, join its threads, free everything.
        let allocations = self.backend.memory_counts().allocations as usize;
        report.stuck_threads = self.backend.shutdown();
        if report.stuck_threads.is_empty() {
            report.freed_allocations = allocations;
        } else {
            // A detached thread may still be executing kernel code from a loaded object: keep
            // every object loaded for the life of the process.
            for reg in self.callables.slots.iter_mut().flatten() {
                std::mem::forget(std::mem::take(&mut reg.code));
            }
            std::mem::forget(std::mem::take(&mut self.callables.retired_code));
        }
        self.user_allocs.clear();
        Ok(report)
    }
}
