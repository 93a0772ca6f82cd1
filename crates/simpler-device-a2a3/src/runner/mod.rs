//! `DeviceRunner`: one chip behind prepare → `launch_run` → `reap_run` → `complete_run`.
//!
//! This module is the run-state machine only; `docs/device-runner.md` describes the lifecycle
//! with its numbered steps (P1–P18, L1–L3, R1–R3, C1–C3) and the terminal cleanup, which the
//! comments below refer to, and `docs/pipelining.md` the resource slots and run handles. What
//! differs between chip runtimes happens behind [`ChipRuntime`]; what differs between devices
//! behind [`Backend`]; memory and arenas live in `memory`, callables in `callables`, reaping
//! (R1–R3) in `reap`.
//!
//! Run-state protocol. Every run lives in one of K resource slots (`RunnerOptions::
//! pipeline_slots`, 1..=4) and is named by a lease on it ([`PreparedRun`], [`ActiveRun`]):
//!
//! 1. `prepare` takes a free slot to *prepared* and returns its lease, or leaves the slot free
//!    with the run's terminal cleanup done and an error. It may run while another slot's run
//!    executes: it writes only its own slot's resources.
//! 2. `launch_run` takes *prepared* to *launched*: the AICore kernel first, then the AICPU
//!    kernel, with no synchronisation and no cleanup on success, then publishes the launch
//!    acceptance. Without device queueing at most one run is launched and not reaped (the
//!    exclusive execution claim); with it (`RunnerOptions::device_queue`) launched runs queue
//!    on the streams, up to one per slot. A launch failure runs recover-or-mark-unusable and
//!    the terminal cleanup and frees the slot.
//! 3. `reap_run` takes *launched* to *reaped*; `poll_run` says, waiting at most CANN's
//!    shortest sync per stream (onboard, without device queueing), whether it would return at
//!    once. A sync failure runs recover-or-mark-unusable and the terminal
//!    cleanup and frees the slot.
//! 4. `complete_run` takes *reaped* to free: handshake report, latched status, copy-back,
//!    terminal cleanup.
//!
//! Slot invariants: a slot holds at most one run; its generation changes exactly when its run
//! ends (or a runner call holding it unwinds), so a lease of an ended run is stale and refused;
//! nothing a run in one slot reads is written by the preparation of another (host image, image
//! arena, heap arena, staging arena and kernel arguments are per slot; the streams, register
//! table, programs and callable table are only read while a run executes). Calls out of order
//! return `Busy`.
//!
//! The terminal cleanup (`finish`) has one latch per step (stop collectors, export, release), so
//! it runs at most once per step whichever path reaches it first — a failure, success,
//! `abandon`, a dropped handle, `finalize` or `Drop`. Each step works on the run taken out of
//! its slot under a guard (`FinishOnUnwind`) that runs the cleanup if the thread unwinds, so a
//! panic inside a step cannot skip it. An unwind out of `launch_run` or `reap_run` also marks
//! the device unusable (`PoisonStep::Unwind`) before the cleanup and before any logging: the
//! simulated cores may still run the launch, so `prepare` and `free` must not touch its image or
//! memory until `finalize` has reset the device. User code called on the host (the
//! orchestration's config function and entry) runs inside `catch_unwind` and becomes
//! `Orchestration`.
//!
//! Memory calls that read or write device memory (`free`, copies, `memset`) are refused with
//! `Busy` while a run is launched and not yet reaped: the simulated cores may be using that
//! memory (decision). `free` is refused while any run is prepared or launched: the prepared
//! image already holds the addresses of the run's tensors, so freeing one of them would hand
//! the launch a dangling pointer (decision: refusing every `free` is simpler to reason about
//! than tracking which allocations the image references, and a caller that needs to free can
//! `abandon` the prepared run).

mod acceptance;
mod api;
mod callables;
mod checks;
mod complete;
mod finalize;
mod health;
mod lease;
#[cfg(all(test, simpler_loom))]
mod loom_models;
mod memory;
mod reap;
mod run_ids;
mod staging;
#[cfg(all(test, feature = "sim"))]
mod tests;
mod types;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use simpler_types::RunId;

pub use acceptance::AcceptanceSignal;
pub use health::{DeviceHealth, HealthProbe};
pub use lease::{ActiveRun, PreparedRun};
pub use run_ids::RUN_ID_MEMORY;
pub use types::{
    ChipSlot, DevicePtr, FinalizeReport, MemoryLedger, Overlap, RingHighWater, RunReport,
    RunRequest, RunnerStats,
};

use self::callables::CallableTable;
use self::health::HealthCell;
use self::lease::{Lease, ReturnQueue};
use self::memory::{Arenas, RunMemory};
use self::run_ids::UsedRunIds;
use self::staging::StagedTensor;
use crate::abi::ABI_VERSION;
use crate::abi::codes::AclCode;
use crate::abi::launch::KernelArgs;
use crate::aicpu::view::HostImageView;
use crate::backend::{AllocFailure, Backend, EventHandle, LaunchHandle, NoHostView, StreamFault};
use crate::diag::{DiagPlan, Exporter, Outcome};
use crate::error::{
    DeviceError, KernelKind, MemPurpose, PoisonCause, PoisonStep, RuntimeFault, StreamKind,
};
use crate::options::RunnerOptions;
use crate::runtime::{BindInputs, BoundRun, ChipRuntime};
use crate::timeouts::TimeoutConfig;

/// The most resource slots a runner may have.
pub const MAX_PIPELINE_SLOTS: usize = 4;

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
struct RunState {
    stage: Stage,
    run_id: RunId,
    /// The callable slot the run executes.
    callable: ChipSlot,
    diag: DiagPlan,
    block_dim: u32,
    threads: u32,
    /// What the runtime bound (P7); `None` before the bind and after the release.
    bound: Option<Box<dyn BoundRun>>,
    image_addr: u64,
    image_len: u64,
    /// The slot's kernel-argument block (P16).
    kernel_args: u64,
    staged: Vec<StagedTensor>,
    aicore: Option<LaunchHandle>,
    /// The run's own events when it was queued on the device (`RunnerOptions::device_queue`).
    events: Option<RunEvents>,
    /// Position of the run in launch order (0 = not launched).
    launch_seq: u64,
    /// When the first reap of the run began waiting, and the stream-sync budget it was given
    /// then; the budget runs from there across every later reap, so a run reaped in slices
    /// still times out.
    reap_started: Option<(Instant, Duration)>,
    /// Whether a queued run whose budget counted runs ahead was given one more budget of its
    /// own once they had all ended: a timeout from then on is its own.
    own_budget: bool,
    /// A fault a poll's short sync saw (a backend without stream queries): the reap reports it
    /// as its own sync's, without asking the device again.
    polled_fault: Option<(StreamKind, PoisonStep, StreamFault)>,
    latched: Option<RuntimeFault>,
    acceptance: Option<(Arc<AcceptanceSignal>, u64)>,
    latches: Latches,
    report: RunReport,
}

/// The events a queued run completes by, indexed by [`stream_slot`] (`docs/pipelining.md`,
/// "Device queueing"): a failed `begin` means the stream failed before the run reached it (the
/// fault is an earlier run's), a failed `end` after a completed `begin` is the run's own fault.
#[derive(Debug)]
struct RunEvents {
    begin: [EventHandle; 2],
    end: [EventHandle; 2],
}

/// Index of a stream in [`RunEvents`].
fn stream_slot(stream: StreamKind) -> usize {
    match stream {
        StreamKind::Aicpu => 0,
        StreamKind::AiCore => 1,
    }
}

/// The per-run resources of one slot, kept across the runs that use it.
#[derive(Debug, Default)]
struct SlotResources {
    /// The host copy of the runtime image the runtime writes (P7) and P14 uploads.
    host_image: Vec<u8>,
    /// Heap, image and staging arenas.
    arenas: Arenas,
    /// The device copy of `KernelArgs` (allocated on the slot's first run).
    kernel_args: Option<u64>,
}

/// One resource slot: at most one run, and the resources its runs reuse.
#[derive(Debug, Default)]
struct Slot {
    /// Changes exactly when the slot's run ends or a runner call holding it unwinds (leases of
    /// the ended run become stale).
    generation: u64,
    run: Option<RunState>,
    res: SlotResources,
}

/// Runs the terminal cleanup of a run held outside its slot when the thread unwinds through
/// the guard's scope. A normal exit does nothing: every normal path ends the run (or stores it
/// back) itself, and `finish`'s latches make an extra call harmless if this guard is dropped
/// during some unrelated, outer unwinding.
///
/// When the device may still run the launch (an unwind out of L1–L3 or R1–R3), the guard
/// poisons the device first, before the cleanup and before anything logs: the unwound run is
/// gone from the runner, so without the poisoning the next `prepare` would rewrite an image
/// the simulated cores may still read and `free` would release memory they may still use.
/// An unusable runner refuses both until `finalize`, which resets the device and joins its
/// threads before it frees anything.
struct FinishOnUnwind<'a> {
    core: &'a mut Core,
    run: &'a mut RunState,
    /// The slot the run was taken out of.
    slot: usize,
    outcome: Outcome,
    device_may_run: bool,
    /// Whether the thread was already unwinding when the guard was armed (a runner call made
    /// from a `Drop` during an unwind): then a normal return is not a panic of this call.
    unwinding_before: bool,
}

impl Drop for FinishOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.unwinding_before {
            if self.device_may_run {
                let cause = PoisonCause {
                    run_id: self.run.run_id,
                    step: PoisonStep::Unwind,
                    code: AclCode::INTERNAL_ERROR,
                };
                self.core.poison(cause, self.run.launch_seq);
            }
            self.core.finish(self.run, self.outcome);
            // The run is over: a handle that survived the unwind (borrowed by `reap_run`, or
            // dropped later) must find its lease stale, never a run prepared into the slot since.
            self.core.free_slot(self.slot);
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
    regs_table: Option<u64>,
    slots: Vec<Slot>,
    /// The AICPU end event of the run launched last: the next queued AICore kernel waits on it.
    last_aicpu_end: Option<EventHandle>,
    /// Runs launched so far (the next run's `launch_seq` is one more).
    launches: u64,
    /// The `launch_seq` of the run whose failure made the device unusable: runs launched
    /// after it stood behind it, runs launched before it did not. `None` while healthy, and
    /// when the cause was no launched run (every launched run then counts as behind it).
    poisoned_at: Option<u64>,
    /// `(launch_seq, cause)` of each launched run charged with a failure, for the runs behind
    /// it and its own reap (bounded: an unusable runner launches nothing more).
    failed_runs: Vec<(u64, PoisonCause)>,
    /// A recovery drain given the whole stream-sync budget did not see the device idle: the
    /// device is wedged, nothing new is launched on an unusable runner, and a later drain
    /// would only wait the whole budget again.
    wedged: bool,
    /// Leases of dropped handles, cleaned up at the next call.
    returns: ReturnQueue,
    used_runs: UsedRunIds,
    stats: RunnerStats,
    /// The backend was shut down (finalize's step 4); until then a drop shuts it down first.
    backend_down: bool,
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

pub(crate) fn oom(
    run_id: Option<RunId>,
    bytes: u64,
    purpose: MemPurpose,
    f: AllocFailure,
) -> DeviceError {
    let limit = match f {
        AllocFailure::Limit(l) => Some(l),
        AllocFailure::Host => None,
        #[cfg(feature = "onboard")]
        AllocFailure::Refused(e) => {
            return match run_id {
                Some(r) => e.in_run(r),
                None => *e,
            };
        }
    };
    DeviceError::OutOfMemory { run_id, bytes, purpose, limit }
}

/// The diagnostic a run latched that needs exclusive use of the runner, if any.
fn diag_feature(diag: &DiagPlan) -> Option<&'static str> {
    if diag.swimlane > 0 {
        Some("swimlane capture")
    } else if diag.dep_gen {
        Some("dependency capture")
    } else if diag.scope_stats {
        Some("scope statistics")
    } else {
        None
    }
}

/// A run refused because its image cannot be viewed from the host: the handshake clear before
/// the launch and the read of the latched status after it need that view, and a run whose
/// status cannot be read must not pass for a success. The device's refusal to map the image,
/// when that was why, is the error's cause.
fn unmapped_image(run_id: RunId, why: NoHostView) -> DeviceError {
    DeviceError::Unsupported {
        run_id: Some(run_id),
        feature: "a host view of the run's image, which the handshake clear before the launch \
                  and the status read after it need (the backend could not map the image, or \
                  its header no longer reads as the runtime's)"
            .into(),
        cause: match why {
            NoHostView::Refused(e) => Some(e),
            NoHostView::NotOneAllocation => None,
        },
    }
}

/// The host's view of `run`'s image, or why the backend gave none (a header that no longer
/// reads as the runtime's counts as a range with no image).
///
/// Callers build it only while no device thread runs the image: before the launch, after both
/// streams completed, or after a drain found them idle.
fn image_view<'a>(
    backend: &'a dyn Backend,
    run: &RunState,
) -> Result<HostImageView<'a>, NoHostView> {
    let base = backend.host_map(run.image_addr, run.image_len)?;
    // SAFETY: `host_map` checked that the range is one live device allocation (the slot's
    // image arena, which the runner keeps allocated while the run exists), mapped at `base`
    // for as long as the backend borrow lives; the image was written by `write_image` and
    // uploaded at P14; callers build the view only while no device thread runs it (see above).
    unsafe { HostImageView::from_raw(base, run.image_len) }
        .map_err(|_| NoHostView::NotOneAllocation)
}

impl Core {
    /// The runs in the slots.
    fn runs(&self) -> impl Iterator<Item = &RunState> {
        self.slots.iter().filter_map(|s| s.run.as_ref())
    }

    /// Whether a prepare must wait for the dropped runs still executing: no slot is free, or
    /// the run (`exclusive`) or a run in a slot uses a diagnostic that needs the device alone.
    fn needs_dropped_runs_gone(&self, exclusive: bool) -> bool {
        lease::lowest_free(self.slots.iter().map(|x| x.run.is_some())).is_none()
            || (exclusive && self.runs().next().is_some())
            || self.runs().any(|r| diag_feature(&r.diag).is_some())
    }

    /// A launched, unreaped run, if any, the first in slot order: without device queueing the
    /// only one (the exclusive execution claim), with it not necessarily the last launched.
    fn launched(&self) -> Option<&RunState> {
        self.runs().find(|r| r.stage == Stage::Launched)
    }

    fn prepare(&mut self, req: &RunRequest<'_>) -> Result<PreparedRun, DeviceError> {
        self.sweep_dropped();
        // P2 before any wait for a dropped run: an unusable runner refuses at once.
        unusable(self)?;
        // P1.
        let cfg = req.config;
        let diag = DiagPlan {
            swimlane: cfg.swimlane() as u32,
            dep_gen: cfg.dep_gen(),
            scope_stats: cfg.scope_stats(),
            prefix: cfg.output_prefix_shared().cloned(),
        };
        if self.needs_dropped_runs_gone(diag_feature(&diag).is_some()) {
            self.reclaim_dropped();
        }
        // P2 again: the cleanup of a dropped run may have made the runner unusable.
        unusable(self)?;
        // P3.
        let (block_dim, threads) = self.device_rules(Some(req.run_id), cfg)?;
        let Some(s) = lease::lowest_free(self.slots.iter().map(|x| x.run.is_some())) else {
            let k = self.slots.len();
            return Err(busy("prepare", format!("all {k} resource slots hold runs")));
        };
        // Diagnostics read and export whole-device state: they need exclusive use.
        let exclusive = diag_feature(&diag);
        if let Some(other) = self.runs().next() {
            if let Some(feature) = exclusive {
                return Err(busy(
                    "prepare",
                    format!("{feature} needs exclusive use and {} is in progress", other.run_id),
                ));
            }
            if let Some(feature) = diag_feature(&other.diag) {
                return Err(busy(
                    "prepare",
                    format!("{} uses {feature}, which needs exclusive use", other.run_id),
                ));
            }
        }
        // The last run launched, as `Waited` names: with device queueing several runs are
        // launched, and slot order is not launch order once slots are reused.
        let last = self.launched_before(u64::MAX).max_by_key(|r| r.launch_seq);
        let overlap = match (exclusive, last) {
            (Some(feature), _) => Overlap::Exclusive { reason: feature },
            (None, Some(r)) => Overlap::Overlapped { with: r.run_id },
            (None, None) => Overlap::NothingInFlight,
        };
        // P4.
        if self.callables.get(req.callable.0).is_none() {
            return Err(DeviceError::UnknownCallable {
                run_id: Some(req.run_id),
                slot: req.callable.0,
            });
        }
        // P5.
        self.ensure_initialized().map_err(|e| e.in_run(req.run_id))?;
        // The run exists from here on (a report, maybe files): its id must be new.
        if self.used_runs.contains(req.run_id, req.origin()) {
            return Err(DeviceError::RunIdReused { run_id: req.run_id, origin: req.origin() });
        }
        self.used_runs.insert(req.run_id, req.origin());
        let mut run = RunState {
            stage: Stage::Prepared,
            run_id: req.run_id,
            callable: req.callable,
            diag,
            block_dim,
            threads,
            bound: None,
            image_addr: 0,
            image_len: 0,
            kernel_args: 0,
            staged: Vec::new(),
            aicore: None,
            events: None,
            launch_seq: 0,
            reap_started: None,
            own_budget: false,
            polled_fault: None,
            latched: None,
            acceptance: req.acceptance().map(|a| (Arc::clone(a), req.run_id.get())),
            latches: Latches::default(),
            report: RunReport {
                run_id: Some(req.run_id),
                origin: req.origin(),
                block_dim,
                aicpu_threads: threads,
                overlap,
                ..RunReport::default()
            },
        };
        // P6–P16; on failure (or a panic) the terminal cleanup runs in before-launch mode.
        let bound = self
            .guarded(s, &mut run, Outcome::FailedBeforeLaunch, |core, run| core.bind(s, req, run));
        // Uploaded or refused, the host copy of the image is no longer needed by this run.
        memory::release_oversized(&mut self.slots[s].res.host_image);
        match bound.map_err(|e| e.in_run(req.run_id)) {
            Ok(()) => {
                let generation = self.slots[s].generation;
                self.slots[s].run = Some(run);
                let lease = Lease::new(s, generation, req.run_id, Arc::clone(&self.returns));
                Ok(PreparedRun { lease })
            }
            Err(e) => {
                self.finish(&mut run, Outcome::FailedBeforeLaunch);
                Err(e)
            }
        }
    }

    /// P6–P16 into slot `s`: stage the tensors, let the runtime bind the run and write its
    /// image, upload the image and the kernel arguments. Writes only slot `s`'s resources.
    fn bind(
        &mut self,
        s: usize,
        req: &RunRequest<'_>,
        run: &mut RunState,
    ) -> Result<(), DeviceError> {
        let run_id = req.run_id;
        // P7: stage the entry tensors, then bind through the runtime (P13: the stamp is taken
        // from the registration checked here).
        let tensors = self.stage_tensors(s, req, run)?;
        let Some(reg) = self.callables.get(req.callable.0) else {
            return Err(DeviceError::UnknownCallable {
                run_id: Some(run_id),
                slot: req.callable.0,
            });
        };
        let inputs = BindInputs {
            run_id,
            callable: &reg.callable,
            device_orchestration: reg.device_orchestration,
            kernels: &reg.kernels,
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
        let executing = self.executing();
        let res = &mut self.slots[s].res;
        let mut mem = RunMemory {
            backend: &*self.backend,
            heap: &mut res.arenas.heap,
            staging: res.arenas.staging,
            run_id,
            misses: 0,
            heap_refused: false,
            executing,
            budgets_begun: None,
            waited_for: None,
            ahead_failed: None,
        };
        let bound = self.runtime.bind(&inputs, &mut mem, &mut res.host_image);
        self.stats.arena_cache_misses += mem.misses;
        let (ahead_failed, waited_for) = (mem.ahead_failed, mem.waited_for);
        let (budgets_begun, heap_refused) = (mem.budgets_begun.take(), mem.heap_refused);
        if let Some((from, budgets)) = budgets_begun {
            self.begin_budgets(from, &budgets);
        }
        if heap_refused {
            // As for the image and staging arenas: a failed arena allocation releases every
            // pooled arena, so the retry starts from free device memory.
            self.release_arenas(s);
        }
        if let Some(failed) = ahead_failed {
            return Err(self.abandoned_behind_failed_wait(run_id, failed));
        }
        if let (Some((with, reason)), Overlap::Overlapped { .. }) =
            (waited_for, &run.report.overlap)
        {
            run.report.overlap = Overlap::Waited { with, reason };
        }
        let bound = bound?;
        bound.describe(&mut run.report);
        let profiling = bound.profiling();
        run.bound = Some(bound);
        // P14: upload the image (the slot's device copy is reused while it is large enough).
        let len = self.slots[s].res.host_image.len() as u64;
        let image_addr = self.image_arena(s, run_id, len)?;
        self.backend
            .write(image_addr, &self.slots[s].res.host_image)
            .map_err(|e| e.in_run(run_id))?;
        run.image_addr = image_addr;
        run.image_len = len;
        // P16: upload KernelArgs into the slot's block.
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
        let ka_addr = self.kernel_args_block(s, run_id)?;
        self.backend.write(ka_addr, bytemuck::bytes_of(&ka)).map_err(|e| e.in_run(run_id))?;
        run.kernel_args = ka_addr;
        // L1 at prepare time, in the slot's own image: with device queueing the host does not
        // run between the previous run's end and this run's start.
        self.clear_handshakes(run)
    }

    /// Slot `s`'s `KernelArgs` block, allocated on the slot's first run.
    fn kernel_args_block(&mut self, s: usize, run_id: RunId) -> Result<u64, DeviceError> {
        if let Some(a) = self.slots[s].res.kernel_args {
            return Ok(a);
        }
        let bytes = size_of::<KernelArgs>() as u64;
        let a = self
            .backend
            .malloc(bytes, MemPurpose::Runtime)
            .map_err(|f| oom(Some(run_id), bytes, MemPurpose::Runtime, f))?;
        self.slots[s].res.kernel_args = Some(a);
        Ok(a)
    }

    /// Runs `steps` on a run taken out of slot `slot`, with the terminal cleanup armed for an
    /// unwinding panic (the cleanup runs on panics too, and the slot is freed).
    fn guarded<T>(
        &mut self,
        slot: usize,
        run: &mut RunState,
        on_panic: Outcome,
        steps: impl FnOnce(&mut Core, &mut RunState) -> T,
    ) -> T {
        // Only launch and reap run while the device may be running this run's launch; before
        // the launch nothing runs, and a reaped run's streams have completed.
        let device_may_run = matches!(run.stage, Stage::Prepared | Stage::Launched)
            && on_panic == Outcome::FailedAfterLaunch;
        let unwinding_before = std::thread::panicking();
        let mut guard = FinishOnUnwind {
            core: self,
            run,
            slot,
            outcome: on_panic,
            device_may_run,
            unwinding_before,
        };
        let FinishOnUnwind { core, run, .. } = &mut guard;
        steps(core, run)
    }

    /// Takes the run `lease` names out of its slot when it is at stage `want`.
    fn take_run(
        &mut self,
        call: &'static str,
        lease: &Lease,
        want: Stage,
    ) -> Result<(usize, RunState), DeviceError> {
        let s = self.check_lease(call, lease)?;
        match self.slots[s].run.take() {
            Some(r) if r.stage == want => Ok((s, r)),
            Some(r) => {
                let state = r.stage.describe();
                self.slots[s].run = Some(r);
                Err(busy(call, state))
            }
            None => Err(busy(call, "the slot holds no run")),
        }
    }

    fn launch_run(&mut self, prepared: PreparedRun) -> Result<ActiveRun, DeviceError> {
        self.sweep_dropped();
        if !self.opts.device_queue && self.launched().is_some() {
            // The exclusive execution claim: a dropped run still executing is waited for.
            self.reclaim_dropped();
        }
        let lease = prepared.lease;
        self.check_lease("launch_run", &lease)?;
        if let DeviceHealth::Unusable { cause } = self.health.get() {
            // Prepared while the run that poisoned the device still executed: it never runs.
            let (run_id, device_id) = (lease.run_id, self.opts.device_id);
            drop(lease);
            self.sweep_dropped();
            // A run being launched is never the launched run that failed; only a culprit that
            // never launched (a failed preparation) may be this run, known by its id alone.
            let own = self.poisoned_at.is_none() && cause.run_id == run_id;
            return Err(if own {
                DeviceError::Unusable { device_id, cause }
            } else {
                DeviceError::Abandoned { run_id, after: cause.run_id, device_id, cause }
            });
        }
        if let Some(other) = self.launched().filter(|_| !self.opts.device_queue) {
            // The exclusive execution claim: the refused run is abandoned (its cleanup runs
            // now), so no slot is left behind by a handle the caller no longer has.
            let state = format!("{} is launched and not reaped", other.run_id);
            drop(lease);
            self.sweep_dropped();
            return Err(busy("launch_run", state));
        }
        // A refused lease drops live: a stale one is ignored by the reclaim, a foreign one
        // goes back to the runner that issued it.
        let (s, mut run) = self.take_run("launch_run", &lease, Stage::Prepared)?;
        let launched = self.guarded(s, &mut run, Outcome::FailedAfterLaunch, Core::launch_steps);
        match launched {
            Ok(()) => {
                run.stage = Stage::Launched;
                // (a) Launch acceptance: both kernels are on their streams; nothing waited.
                if let Some((signal, value)) = &run.acceptance {
                    signal.publish(*value);
                }
                self.slots[s].run = Some(run);
                Ok(ActiveRun { lease: lease.advance() })
            }
            Err(e) => {
                lease.consume();
                self.free_slot(s);
                Err(e)
            }
        }
    }

    /// L1–L3 on a run taken out of its slot (a queued run's L1 ran at prepare); a failure has run the
    /// terminal cleanup. With device queueing each kernel is framed by the run's own events
    /// and the streams wait on each other (`docs/pipelining.md`, "Device queueing").
    fn launch_steps(&mut self, run: &mut RunState) -> Result<(), DeviceError> {
        let args = run.kernel_args;
        let queued = self.opts.device_queue;
        if !queued {
            // L1 once more, in the seed's place, for whatever wrote the image since (mapped at
            // prepare already, so a refusal here is a backend that lost the mapping since).
            if let Err(e) = self.clear_handshakes(run) {
                self.finish(run, Outcome::FailedBeforeLaunch);
                return Err(e);
            }
        }
        self.launches += 1;
        run.launch_seq = self.launches;
        // An event record or stream wait that frames a kernel and fails is that kernel's
        // launch failure: without it the run cannot be ordered or reaped by its events. The
        // previous run's AICPU writes AICPU-idle into the token registers after its exit
        // acknowledgement, so this run's cores must not start before that.
        let begin_core = match queued.then(|| self.frame_aicore()).transpose() {
            Ok(begin_core) => begin_core,
            Err(fault) => return Err(self.launch_failed(run, KernelKind::AiCore, fault)),
        };
        // L2: AICore first.
        match self.backend.launch_aicore(run.block_dim, args) {
            Ok(l) => {
                self.stats.aicore_launches += 1;
                run.aicore = Some(l);
            }
            Err(fault) => return Err(self.launch_failed(run, KernelKind::AiCore, fault)),
        }
        // The AICPU starts only once the AICore kernel started (its launch resets the cores'
        // DATA_MAIN_BASE, which would erase what the AICPU publishes).
        let framed = match begin_core.map(|b| self.frame_aicpu(b)).transpose() {
            Ok(framed) => framed,
            Err(fault) => return Err(self.launch_failed(run, KernelKind::Aicpu, fault)),
        };
        // L3: then AICPU.
        match self.backend.launch_aicpu(run.threads, args) {
            Ok(_) => self.stats.aicpu_launches += 1,
            Err(fault) => return Err(self.launch_failed(run, KernelKind::Aicpu, fault)),
        }
        if let Some((begin_core, end_core, begin_cpu)) = framed {
            let end_cpu = match self.backend.record_event(StreamKind::Aicpu) {
                Ok(e) => e,
                Err(fault) => return Err(self.launch_failed(run, KernelKind::Aicpu, fault)),
            };
            self.last_aicpu_end = Some(Arc::clone(&end_cpu));
            run.events =
                Some(RunEvents { begin: [begin_cpu, begin_core], end: [end_cpu, end_core] });
        }
        Ok(())
    }

    /// A queued run's AICore stream waits for the previous run's AICPU end, then records the
    /// run's AICore begin.
    fn frame_aicore(&mut self) -> Result<EventHandle, StreamFault> {
        if let Some(prev) = self.last_aicpu_end.take() {
            self.backend.wait_event(StreamKind::AiCore, &prev)?;
        }
        self.backend.record_event(StreamKind::AiCore)
    }

    /// After a queued run's AICore kernel: its AICore end, the AICPU stream's wait for its
    /// AICore begin, and its AICPU begin.
    fn frame_aicpu(
        &mut self,
        begin_core: EventHandle,
    ) -> Result<(EventHandle, EventHandle, EventHandle), StreamFault> {
        let end_core = self.backend.record_event(StreamKind::AiCore)?;
        self.backend.wait_event(StreamKind::Aicpu, &begin_core)?;
        let begin_cpu = self.backend.record_event(StreamKind::Aicpu)?;
        Ok((begin_core, end_core, begin_cpu))
    }

    /// A launch step of `kernel` was refused with `fault`: the device is poisoned (whatever of
    /// the run is already on its streams must not be taken for a healthy run), the terminal
    /// cleanup runs, and the error names the kernel, the code and why (onboard, the CANN call
    /// that refused it, typed) — unless a run ahead already failed
    /// ([`abandoned_at_launch`](Core::abandoned_at_launch)).
    fn launch_failed(
        &mut self,
        run: &mut RunState,
        kernel: KernelKind,
        fault: StreamFault,
    ) -> DeviceError {
        let code = fault.code;
        let (step, outcome) = match kernel {
            KernelKind::AiCore => (PoisonStep::LaunchAiCore, Outcome::FailedBeforeLaunch),
            KernelKind::Aicpu => (PoisonStep::LaunchAicpu, Outcome::FailedAfterLaunch),
        };
        if let Some(abandoned) = self.abandoned_at_launch(run, outcome, code) {
            return abandoned;
        }
        self.recover_or_mark_unusable(run.run_id, run.launch_seq, step, code, None);
        self.finish(run, outcome);
        // A typed CANN error is the source and says why itself.
        #[cfg(feature = "onboard")]
        let message = if fault.acl.is_some() { String::new() } else { fault.message };
        #[cfg(not(feature = "onboard"))]
        let message = fault.message;
        DeviceError::Launch {
            run_id: run.run_id,
            kernel,
            code,
            message,
            #[cfg(feature = "onboard")]
            acl: fault.acl,
        }
    }

    /// L1: every `aicore_done` of the launch reads 0 on the device, whatever the image held
    /// since the upload, so the AICPU never takes a stale value for a core reporting in. A
    /// backend that cannot map the image refuses the run ([`unmapped_image`]).
    fn clear_handshakes(&self, run: &RunState) -> Result<(), DeviceError> {
        let view =
            image_view(&*self.backend, run).map_err(|why| unmapped_image(run.run_id, why))?;
        for c in 0..3 * run.block_dim {
            // Relaxed: the launch that follows publishes the image to the device threads.
            view.handshake(c).aicore_done.store(0, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Marks the device unusable with `cause` (the first cause stays) and, with the first
    /// cause, where the run behind it was launched (`launch_seq`, 0 for a run never launched).
    fn poison(&mut self, cause: PoisonCause, launch_seq: u64) {
        if self.health.get().is_healthy() {
            self.poisoned_at = (launch_seq > 0).then_some(launch_seq);
        }
        if launch_seq > 0 && !self.failed_runs.iter().any(|&(seq, _)| seq == launch_seq) {
            self.failed_runs.push((launch_seq, cause));
        }
        self.health.poison(cause);
    }

    /// Unconditionally unusable, then a drain of the stream-sync budget, or of what is left
    /// until `hard` for a reap that must be over by then ([`Core::recovery_drain`];
    /// `docs/device-runner.md`, "Recovery, health and finalize"), unless a drain of the whole
    /// budget already found the device busy. `launch_seq` places the failed run in the launch
    /// order (0: never launched).
    pub(super) fn recover_or_mark_unusable(
        &mut self,
        run_id: RunId,
        launch_seq: u64,
        step: PoisonStep,
        code: AclCode,
        hard: Option<Instant>,
    ) {
        // Poison first: neither the drain nor the log (a tracing layer may panic) can skip it.
        self.poison(PoisonCause { run_id, step, code }, launch_seq);
        if self.wedged {
            tracing::error!(device = self.opts.device_id, %run_id, %step, %code, "another failure on a device that did not drain");
            return;
        }
        self.stats.recoveries += 1;
        let budget = self.recovery_drain(hard);
        let drained = self.backend.drain(budget, self.timeouts.op_execute);
        self.wedged = !drained && budget >= self.timeouts.stream_sync;
        tracing::error!(device = self.opts.device_id, %run_id, %step, %code, drained, "device unusable after a failed run");
    }

    fn abandon(&mut self, prepared: PreparedRun) -> Result<(), DeviceError> {
        self.sweep_dropped();
        let lease = prepared.lease;
        let (s, mut run) = self.take_run("abandon", &lease, Stage::Prepared)?;
        lease.consume();
        self.finish(&mut run, Outcome::FailedBeforeLaunch);
        self.free_slot(s);
        Ok(())
    }

    /// Terminal cleanup steps 1 and 2, each at most once per run.
    fn stop_and_export(&mut self, run: &mut RunState, outcome: Outcome) {
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
    fn finish(&mut self, run: &mut RunState, outcome: Outcome) {
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
    fn export(&mut self, run: &mut RunState, outcome: Outcome) {
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
        let view = if device_readable { image_view(&*self.backend, run).ok() } else { None };
        let mut out = Exporter::new(&prefix, &mut run.report);
        if device_readable && view.is_none() && run.diag.swimlane > 0 {
            out.warn("swimlane records could not be read");
        }
        bound.export(view.as_ref(), outcome, &mut out);
    }
}
