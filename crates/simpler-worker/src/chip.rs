//! Chip lanes: the one thread that owns a chip's `DeviceRunner` and makes every device call for
//! it (`docs/worker-protocols.md` §1, §7).
//!
//! At L3 the lane is the engine's endpoint thread of the chip (`ChipEndpoint`); control
//! work (registration, memory) reaches it through the engine's control jobs and queues behind
//! earlier tasks. At L2 ([`ChipLane`]) the lane is a thread of its own fed by a channel. Both
//! wrap the same [`ChipState`]: the runner, the content-keyed slot table and the user
//! allocations.
//!
//! The runner is attached on a start-up thread and then moved to its lane. On the simulator
//! nothing is bound to a thread; an onboard backend binds its context in the endpoint's
//! thread-start hook, which is why that hook exists.
//!
//! The L2 lane pipelines runs at depth 2 (`docs/pipelining.md`): a run job prepares run N+1
//! while run N executes on the device, then reaps and completes N (publishing its fence) and
//! only then launches N+1, which stays in flight. Invariant: at most one run is in flight
//! ([`ChipState::in_flight`]), it is always the oldest unpublished run, and it is retired
//! before any other job touches the runner except the next run's preparation — a control job
//! (registration, memory, fault plan) retires it first, exactly as at depth 1. While a run is
//! in flight and no job is queued the lane reaps the run in short, growing slices and looks for
//! a job between them, so a finished run is published at once even when no next run arrives.
//! With device queueing (`RunnerOptions::with_device_queue`) the run job launches N+1 behind N
//! on the device before it retires N, so N+1's kernels follow N's with no host round trip;
//! fences still publish in FIFO order and at most two runs are launched at once.

use std::any::Any;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use simpler_device_a2a3::{
    ActiveRun, ChipCallable, ChipSlot, DeviceError, DeviceHealth, DevicePtr, DeviceRunner,
    MemoryLedger, PreparedRun, RunRequest, RunStep,
};
use simpler_sched::EndpointFailure;
use simpler_types::{
    CallConfig, CallableId, EndpointOutcome, FailureSource, RunId, TaskArgs, TaskArgsView, TaskId,
    WorkerId,
};

use crate::error::{
    LaneFault, Leaked, MemError, RegistrationFailure, Residue, TeardownCause, TeardownPart,
    WorkerError,
};
use crate::faults::{Fault, Faults};
use crate::lane_fence::LaneFence;
use crate::linger;
use crate::run::panic_text;

/// One registered content on one chip.
struct Prepared {
    slot: ChipSlot,
    /// Handles that name this content on this chip.
    refs: usize,
}

/// A chip's runner and the bookkeeping that lives on its lane.
///
/// After a panic between the launch and the end of the reap the runner is unusable until the
/// chip is finalized (see [`ChipState::finish_run`]).
pub(crate) struct ChipState {
    pub(crate) chip: WorkerId,
    pub(crate) runner: Option<DeviceRunner>,
    prepared: HashMap<CallableId, Prepared>,
    /// Content whose rollback failed: unusable on this chip until close.
    unusable: HashSet<CallableId>,
    /// Live user allocations (both modes): address → the allocation's serial, which its
    /// `DeviceBuffer` carries, so that a copy of a freed buffer is told from an allocation that
    /// reused its address.
    allocations: BTreeMap<u64, u64>,
    /// The serial of the last user allocation.
    last_serial: u64,
    /// The chip process `allocations` are of (PROCESS mode; 0 in this process): those of an
    /// earlier process ended with it.
    allocations_of: u64,
    /// Reused per run so that a run's arguments are not reallocated.
    scratch: TaskArgs,
    /// The next device run id ([`ChipState::next_run_id`]).
    next_run: u64,
    /// Injected faults (armed by tests only).
    faults: Faults,
    /// PROCESS mode: the chip lives in this child process and every call goes there
    /// (`runner` is `None`).
    pub(crate) process: Option<crate::process::parent::ChipProcess>,
    /// The launched, unreaped run of an L2 lane (depth 2), with the fence it publishes.
    in_flight: Option<InFlight>,
    /// When this lane last published a run (just before its fence was set).
    published_at: Option<Instant>,
    /// Whether depth 1 for a run with diagnostics was logged (once per chip).
    exclusive_logged: bool,
}

/// A run the L2 lane launched and has not reaped yet.
struct InFlight {
    run: RunId,
    active: ActiveRun,
    fence: Arc<LaneFence>,
}

/// The first and the longest reap slice of a run in flight, between looks for the next job.
const REAP_SLICE_MIN: Duration = Duration::from_micros(200);
const REAP_SLICE_MAX: Duration = Duration::from_millis(5);

/// How long a lane whose runs come back to back waits for the next run's job, with a run in
/// flight, before it waits for the device instead ([`next_job`]).
const JOB_WAIT: Duration = Duration::from_micros(50);

/// The error of a device call on a chip whose runner was finalized.
fn finalized() -> DeviceError {
    DeviceError::Finalized { call: "chip call" }
}

/// An injected device error naming the call it replaces.
fn injected(call: &'static str) -> DeviceError {
    DeviceError::Busy { call, state: "an injected fault is armed".to_owned() }
}

impl ChipState {
    pub(crate) fn new(chip: WorkerId, runner: DeviceRunner, faults: Faults) -> ChipState {
        ChipState {
            chip,
            runner: Some(runner),
            prepared: HashMap::new(),
            unusable: HashSet::new(),
            allocations: BTreeMap::new(),
            last_serial: 0,
            allocations_of: 0,
            scratch: TaskArgs::new(),
            next_run: 1,
            faults,
            process: None,
            in_flight: None,
            published_at: None,
            exclusive_logged: false,
        }
    }

    /// A chip whose runner lives in a child process (PROCESS mode).
    pub(crate) fn in_process(
        chip: WorkerId,
        process: crate::process::parent::ChipProcess,
        faults: Faults,
    ) -> ChipState {
        ChipState {
            chip,
            runner: None,
            prepared: HashMap::new(),
            unusable: HashSet::new(),
            allocations: BTreeMap::new(),
            last_serial: 0,
            allocations_of: 0,
            scratch: TaskArgs::new(),
            next_run: 1,
            faults,
            process: Some(process),
            in_flight: None,
            published_at: None,
            exclusive_logged: false,
        }
    }

    /// Runs that may be prepared or in flight at once on this chip's lane: 2 when the runner
    /// has at least two resource slots, else 1.
    pub(crate) fn pipeline_depth(&self) -> usize {
        self.runner.as_ref().map_or(1, |r| r.pipeline_slots().min(2))
    }

    fn runner(&mut self) -> Result<&mut DeviceRunner, DeviceError> {
        self.runner.as_mut().ok_or_else(finalized)
    }

    /// Whether content `id` is unusable on this chip because removing it failed.
    pub(crate) fn is_unusable(&mut self, id: &CallableId) -> bool {
        if let Some(p) = &mut self.process {
            return p.is_unusable(id);
        }
        self.unusable.contains(id)
    }

    /// Prepares `c` (or adds a reference to identical content already prepared). The caller
    /// checks [`is_unusable`](Self::is_unusable) first: content whose removal failed is in an
    /// unknown state on the device and is never prepared again before close.
    pub(crate) fn register(&mut self, c: &ChipCallable) -> Result<(), RegistrationFailure> {
        if let Some(p) = &mut self.process {
            return p.register(c);
        }
        if let Some(p) = self.prepared.get_mut(&c.id()) {
            p.refs += 1;
            return Ok(());
        }
        if self.unusable.contains(&c.id()) {
            return Err(DeviceError::Busy {
                call: "register_callable",
                state: format!("unusable on chip {} after a failed removal", self.chip),
            }
            .into());
        }
        if self.faults.hit(self.chip, Fault::Register) {
            return Err(injected("register_callable").into());
        }
        let slot = self.runner()?.register_callable(c)?;
        self.prepared.insert(c.id(), Prepared { slot, refs: 1 });
        Ok(())
    }

    /// Drops one reference to `id`, removing it from the chip at the last.
    pub(crate) fn release(&mut self, id: &CallableId) -> Result<(), RegistrationFailure> {
        self.release_or_refuse(id, false)
    }

    /// [`ChipState::release`]; with `refuse`, the device refuses the removal (a drill of PROCESS
    /// mode, `ChildFault::RefuseOnRelease`).
    pub(crate) fn release_or_refuse(
        &mut self,
        id: &CallableId,
        refuse: bool,
    ) -> Result<(), RegistrationFailure> {
        if let Some(p) = &mut self.process {
            return p.release(id);
        }
        let Some(p) = self.prepared.get_mut(id) else { return Ok(()) };
        p.refs -= 1;
        if p.refs > 0 {
            return Ok(());
        }
        let slot = p.slot;
        let removed = if refuse || self.faults.hit(self.chip, Fault::Unregister) {
            Err(injected("unregister_callable"))
        } else {
            self.runner()?.unregister_callable(slot)
        };
        match removed {
            Ok(()) => {
                self.prepared.remove(id);
                Ok(())
            }
            Err(e) => {
                self.prepared.remove(id);
                self.unusable.insert(*id);
                Err(e.into())
            }
        }
    }

    /// The slot of prepared content `id`.
    pub(crate) fn slot_of(&self, id: &CallableId) -> Option<ChipSlot> {
        if self.unusable.contains(id) {
            return None;
        }
        self.prepared.get(id).map(|p| p.slot)
    }

    /// References held on `id` (0 when not prepared).
    pub(crate) fn refs(&mut self, id: &CallableId) -> usize {
        if let Some(p) = &mut self.process {
            return p.refs(id);
        }
        self.prepared.get(id).map_or(0, |p| p.refs)
    }

    /// The next device run id of this chip. Every chip run, at L2 and at L3, takes its id
    /// here, so ids are distinct per chip whichever level asked for the run.
    fn next_run_id(&mut self) -> Result<RunId, DeviceError> {
        let id = RunId::from_raw(self.next_run).ok_or(DeviceError::Busy {
            call: "run",
            state: format!("chip {} has used every run id", self.chip),
        })?;
        self.next_run += 1;
        Ok(id)
    }

    /// The synchronous half of a chip run: takes a run id, checks the chip and the callable,
    /// and prepares the run with `args` (tags included). `origin` names the engine task that
    /// asked for it (L3). Returns the run id, also when the preparation failed.
    ///
    /// A run in flight keeps executing while this one is prepared, unless this run's
    /// diagnostics need exclusive use of the runner: then the run in flight is retired first
    /// (depth 1 for this run; the device report says why).
    pub(crate) fn begin_run(
        &mut self,
        callable: &CallableId,
        args: TaskArgsView<'_>,
        config: &CallConfig,
        origin: Option<TaskId>,
    ) -> (Option<RunId>, Result<PreparedRun, DeviceError>) {
        if config.diagnostics_any() && self.in_flight.is_some() {
            if !self.exclusive_logged {
                self.exclusive_logged = true;
                tracing::info!(chip = %self.chip, "runs with diagnostics execute at pipeline depth 1 (they need exclusive use of the device)");
            }
            self.retire_in_flight();
        }
        let run = match self.next_run_id() {
            Ok(run) => run,
            Err(e) => return (None, Err(e)),
        };
        // A panic in the runner's preparation (user orchestrations are caught inside it) would
        // otherwise drop the caller's reply on the lane and lose its text.
        let prepared =
            catch_unwind(AssertUnwindSafe(|| self.prepare(run, callable, args, config, origin)));
        let prepared =
            prepared.unwrap_or_else(|p| Err(self.run_panicked(run, RunStep::Prepare, p.as_ref())));
        (Some(run), prepared)
    }

    fn prepare(
        &mut self,
        run: RunId,
        callable: &CallableId,
        args: TaskArgsView<'_>,
        config: &CallConfig,
        origin: Option<TaskId>,
    ) -> Result<PreparedRun, DeviceError> {
        if let Some(r) = &self.runner
            && let simpler_device_a2a3::DeviceHealth::Unusable { cause } = r.health()
        {
            return Err(DeviceError::Unusable { device_id: r.device_id(), cause });
        }
        // Content whose removal failed counts as not prepared: its state on the device is
        // unknown, so it never runs again before close.
        let slot = self.slot_of(callable).ok_or(DeviceError::CallableNotPrepared {
            run_id: Some(run),
            call: "prepare",
            callable: *callable,
        })?;
        self.scratch.assign(args).map_err(|source| DeviceError::InvalidTaskArgs {
            run_id: Some(run),
            arg: None,
            source,
        })?;
        let request = RunRequest::new(run, slot, &self.scratch, config);
        let request = match origin {
            Some(task) => request.with_origin(task),
            None => request,
        };
        if self.faults.hit(self.chip, Fault::PreparePanic) {
            panic!("injected panic in prepare");
        }
        let runner = self.runner.as_mut().ok_or_else(finalized)?;
        runner.prepare(&request)
    }

    /// The second half of a chip run: launch, reap and complete the prepared run. A panic on
    /// the way is caught and becomes the run's error, so no caller hangs on it.
    ///
    /// A panic that unwinds out of the runner's `launch_run` or `reap_run` leaves the runner
    /// unusable (the device may still run the launch): every later device call on this chip,
    /// `prepare` included, fails with `Unusable`, and `free` releases nothing, until the chip
    /// is finalized. A panic out of `complete_run` leaves it healthy. A run handle the unwind
    /// dropped is cleaned up by the runner at its next call.
    pub(crate) fn finish_run(
        &mut self,
        run: RunId,
        prepared: PreparedRun,
    ) -> Result<(), DeviceError> {
        let mut step = RunStep::Launch;
        let done =
            catch_unwind(AssertUnwindSafe(|| self.launch_reap_complete(prepared, &mut step)));
        done.unwrap_or_else(|p| Err(self.run_panicked(run, step, p.as_ref())))
    }

    fn launch_reap_complete(
        &mut self,
        prepared: PreparedRun,
        step: &mut RunStep,
    ) -> Result<(), DeviceError> {
        let active = self.launch(prepared)?;
        self.reap_complete(active, step)
    }

    /// The error of a panic caught while `step` of `run` was driven, with the device's state
    /// after it: a panic out of the runner's launch or reap leaves the device unusable.
    fn run_panicked(&self, run: RunId, step: RunStep, p: &(dyn Any + Send)) -> DeviceError {
        let unusable = match self.runner.as_ref().map(DeviceRunner::health) {
            Some(DeviceHealth::Unusable { cause }) => Some(cause),
            _ => None,
        };
        DeviceError::RunPanicked { run_id: Some(run), step, message: panic_text(p), unusable }
    }

    fn launch(&mut self, prepared: PreparedRun) -> Result<ActiveRun, DeviceError> {
        if self.faults.hit(self.chip, Fault::LaunchPanic) {
            panic!("injected panic in launch");
        }
        self.runner.as_mut().ok_or_else(finalized)?.launch_run(prepared)
    }

    /// Reaps and completes `active`, keeping `step` at the step under way.
    fn reap_complete(&mut self, active: ActiveRun, step: &mut RunStep) -> Result<(), DeviceError> {
        let runner = self.runner.as_mut().ok_or_else(finalized)?;
        *step = RunStep::Reap;
        runner.reap_run(&active, None)?;
        *step = RunStep::Complete;
        let report = runner.complete_run(active)?;
        // What did not stop the run (a diagnostics file that could not be written, a capture
        // turned off) has no other way to the user: the report ends here.
        for warning in &report.warnings {
            let (run, origin) = (report.run_id, report.origin);
            tracing::warn!(chip = %self.chip, ?run, ?origin, %warning, "chip run finished with a warning");
        }
        Ok(())
    }

    /// The L2 lane's run job after the preparation: retires the run in flight (publishing its
    /// fence), then launches `prepared` — or, with device queueing, launches `prepared` behind
    /// the run in flight first and then retires that run. At depth 2 the launched run stays in
    /// flight, to be retired by the next run job, a control job or the lane's poll; at depth 1,
    /// or when the run needs exclusive use, it is reaped and completed here.
    pub(crate) fn launch_pipelined(
        &mut self,
        run: RunId,
        prepared: PreparedRun,
        fence: Arc<LaneFence>,
        exclusive: bool,
    ) {
        let queued = !exclusive && self.device_queue() && self.in_flight.is_some();
        if !queued {
            self.retire_in_flight();
        }
        if exclusive || self.pipeline_depth() < 2 {
            let finished = self.finish_run(run, prepared);
            self.publish(&fence, finished);
            return;
        }
        // With device queueing `prepared` is launched behind the run in flight (its kernels
        // start when that run's end on the device, with no host round trip), and the run in
        // flight is retired after it: fences still publish in FIFO order.
        let launched = catch_unwind(AssertUnwindSafe(|| self.launch(prepared)));
        if queued {
            self.retire_in_flight();
        }
        match launched {
            Ok(Ok(active)) => self.in_flight = Some(InFlight { run, active, fence }),
            Ok(Err(e)) => self.publish(&fence, Err(e)),
            Err(p) => {
                let e = self.run_panicked(run, RunStep::Launch, p.as_ref());
                self.publish(&fence, Err(e));
            }
        }
    }

    /// Publishes a run that never reached the device because a run ahead of it poisoned the
    /// device ([`queued_behind`]): after the run in flight, so fences stay in FIFO order.
    pub(crate) fn abandon(&mut self, fence: Arc<LaneFence>, e: DeviceError) {
        self.retire_in_flight();
        self.publish(&fence, Err(e));
    }

    /// Whether the lane launches the next run behind the run in flight on the device
    /// (`RunnerOptions::with_device_queue`) instead of after reaping it.
    pub(crate) fn device_queue(&self) -> bool {
        self.pipeline_depth() >= 2 && self.runner.as_ref().is_some_and(DeviceRunner::device_queue)
    }

    /// Reaps and completes the run in flight, if any, and publishes its fence.
    pub(crate) fn retire_in_flight(&mut self) {
        let Some(InFlight { run, active, fence }) = self.in_flight.take() else { return };
        let mut step = RunStep::Reap;
        let done = catch_unwind(AssertUnwindSafe(|| self.reap_complete(active, &mut step)));
        let done = done.unwrap_or_else(|p| Err(self.run_panicked(run, step, p.as_ref())));
        self.publish(&fence, done);
    }

    /// Sets the fence of a run this lane ends to `result`, noting when.
    fn publish(&mut self, fence: &LaneFence, result: Result<(), DeviceError>) {
        self.published_at = Some(Instant::now());
        fence.set(result.map_err(device_failure));
    }

    /// Reaps the run in flight for at most `slice`; retires it if it finished (or failed).
    /// Returns whether no run is in flight any more.
    fn reap_in_flight_within(&mut self, slice: Duration) -> bool {
        let Some(f) = &self.in_flight else { return true };
        let reaped = match self.runner.as_mut() {
            Some(r) => catch_unwind(AssertUnwindSafe(|| r.reap_run(&f.active, Some(slice)))),
            None => Ok(Ok(true)),
        };
        match reaped {
            Ok(Ok(false)) => false,
            // Reaped: the retirement completes it and publishes the outcome. A reap that failed
            // ended the run and is published as it is (below).
            Ok(Ok(true)) => {
                self.retire_in_flight();
                true
            }
            Ok(Err(e)) => {
                if let Some(f) = self.in_flight.take() {
                    self.publish(&f.fence, Err(e));
                }
                true
            }
            Err(p) => {
                if let Some(f) = self.in_flight.take() {
                    let e = self.run_panicked(f.run, RunStep::Reap, p.as_ref());
                    self.publish(&f.fence, Err(e));
                }
                true
            }
        }
    }

    /// A whole chip run on this lane (the L3 path): [`begin_run`](Self::begin_run) then
    /// [`finish_run`](Self::finish_run), with the one error mapping.
    pub(crate) fn run(
        &mut self,
        callable: &CallableId,
        args: TaskArgsView<'_>,
        config: &CallConfig,
        origin: TaskId,
    ) -> Result<(), EndpointFailure> {
        if let Some(p) = &mut self.process {
            return p.run(callable, args, config, origin);
        }
        let (run, prepared) = self.begin_run(callable, args, config, Some(origin));
        match (run, prepared) {
            (Some(run), Ok(p)) => self.finish_run(run, p).map_err(device_failure),
            (_, Err(e)) => Err(device_failure(e)),
            (None, Ok(_)) => Err(EndpointFailure::endpoint_failed("a chip run without a run id")),
        }
    }

    /// The chip process whose memory a buffer allocated now lives in (PROCESS mode; 0 for a
    /// chip in this process, which has one runner for the worker's life).
    pub(crate) fn memory_process(&self) -> u64 {
        self.process.as_ref().map_or(0, |p| p.generation())
    }

    /// Refuses buffer `addr` (`len` bytes, allocation `serial`), allocated in chip process
    /// `process` (`memory_process` then), when that process has ended, or when the allocation
    /// was freed (its address is free, or another allocation's since).
    pub(crate) fn check_buffer(
        &mut self,
        process: u64,
        addr: u64,
        len: u64,
        serial: u64,
    ) -> Result<(), MemError> {
        if let Some(p) = &mut self.process {
            p.current_buffer(process, addr, len)?;
        }
        if self.allocations.get(&addr) != Some(&serial) {
            return Err(MemError::Freed { chip: self.chip, addr, len });
        }
        Ok(())
    }

    /// Allocates `bytes`: the address and the allocation's serial.
    pub(crate) fn malloc(&mut self, bytes: u64) -> Result<(u64, u64), MemError> {
        let chip = self.chip;
        let addr = match &mut self.process {
            Some(p) => p.malloc(bytes)?,
            None => {
                self.runner().and_then(|r| r.malloc(bytes)).map_err(|e| mem_err(chip, e))?.addr()
            }
        };
        let process = self.memory_process();
        if process != self.allocations_of {
            self.allocations.clear();
            self.allocations_of = process;
        }
        self.last_serial += 1;
        self.allocations.insert(addr, self.last_serial);
        Ok((addr, self.last_serial))
    }

    pub(crate) fn free(&mut self, addr: u64) -> Result<(), MemError> {
        let chip = self.chip;
        match &mut self.process {
            Some(p) => p.free(addr)?,
            None => {
                self.runner().and_then(|r| r.free(DevicePtr(addr))).map_err(|e| mem_err(chip, e))?
            }
        }
        self.allocations.remove(&addr);
        Ok(())
    }

    pub(crate) fn copy_to(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        if let Some(p) = &mut self.process {
            return p.copy_to(addr, data);
        }
        let chip = self.chip;
        self.runner()
            .and_then(|r| r.copy_to_device(DevicePtr(addr), data))
            .map_err(|e| mem_err(chip, e))
    }

    pub(crate) fn copy_from(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, MemError> {
        if let Some(p) = &mut self.process {
            return p.copy_from(addr, len);
        }
        let chip = self.chip;
        let mut out = vec![0u8; len];
        self.runner()
            .and_then(|r| r.copy_from_device(&mut out, DevicePtr(addr)))
            .map_err(|e| mem_err(chip, e))?;
        Ok(out)
    }

    pub(crate) fn ledger(&mut self) -> Result<MemoryLedger, MemError> {
        if let Some(p) = &mut self.process {
            return p.ledger();
        }
        let chip = self.chip;
        Ok(self.runner().map_err(|e| mem_err(chip, e))?.stats().memory)
    }

    /// The chip has started: the chip process's waits, its shutdown's included, end at the
    /// start deadline until `worker_started` is set (THREAD mode: nothing to do).
    pub(crate) fn started_with(&mut self, worker_started: &Arc<std::sync::atomic::AtomicBool>) {
        if let Some(p) = &mut self.process {
            p.started_with(Arc::clone(worker_started));
        }
    }

    /// Finalizes the runner after retiring a run in flight (whose fence is then published, so
    /// its waiters never wait for a lane that is gone); returns what it left behind: stuck
    /// device threads as leaked, a finalize error as failed.
    pub(crate) fn finalize(&mut self) -> Vec<Residue> {
        self.retire_in_flight();
        if let Some(mut p) = self.process.take() {
            return p.shutdown();
        }
        let Some(runner) = self.runner.take() else { return Vec::new() };
        let chip = self.chip;
        let part = TeardownPart::Chip(chip);
        let failed = |e| Residue::failed(part.clone(), TeardownCause::Device(Arc::new(e)));
        let stuck = |name| Residue::leaked(part.clone(), Leaked::DeviceThread(name));
        let mut residue: Vec<Residue> = match runner.finalize() {
            Ok(report) => report.stuck_threads.into_iter().map(stuck).collect(),
            Err(e) => vec![failed(e)],
        };
        if self.faults.hit(chip, Fault::Finalize) {
            residue.push(failed(injected("finalize")));
        }
        if self.faults.hit(chip, Fault::Leak) {
            residue.push(stuck("(injected)".to_owned()));
        }
        if self.faults.hit(chip, Fault::FinalizePanic) {
            panic!("chip {chip}: finalize panicked (injected)");
        }
        residue
    }
}

/// The memory error of a device call on `chip`; the device's error stays typed beside its text.
fn mem_err(chip: WorkerId, e: DeviceError) -> MemError {
    let (message, code) = (e.to_string(), e.device_code());
    let unusable = matches!(e, DeviceError::Unusable { .. });
    let device = Some(Arc::new(e));
    if unusable {
        MemError::DeviceUnusable { chip, message, code, child: None, device }
    } else {
        MemError::Device { chip, message, code, device }
    }
}

/// A preparation's `e` for run `run`, submitted while `behind` was the oldest run not yet
/// finished: a device that a run from `behind` on made unusable abandons this run behind that
/// run (`Ok` with the run and its `Abandoned { after }`), as it would had the lane prepared it
/// before retiring the culprit; so does a preparation the runner itself ended as abandoned
/// behind such a run (its orchestration's write waited for a run ahead that faulted). Any
/// other error comes back as it is (`Err`).
pub(crate) fn queued_behind(
    e: DeviceError,
    run: Option<RunId>,
    behind: Option<RunId>,
) -> Result<(RunId, DeviceError), DeviceError> {
    let (Some(run_id), Some(oldest)) = (run, behind) else { return Err(e) };
    let ahead = |culprit: RunId| oldest <= culprit && culprit < run_id;
    match e {
        DeviceError::Unusable { device_id, cause } if ahead(cause.run_id) => {
            Ok((run_id, DeviceError::Abandoned { run_id, after: cause.run_id, device_id, cause }))
        }
        DeviceError::Abandoned { run_id: abandoned, after, .. }
            if abandoned == run_id && ahead(after) =>
        {
            Ok((run_id, e))
        }
        e => Err(e),
    }
}

/// The one mapping of a device error, at L2 and at L3: a poisoned device is the path failing,
/// anything else the task. The typed error travels on as the failure's source.
pub(crate) fn device_failure(e: DeviceError) -> EndpointFailure {
    let outcome = if e.poisons_device() {
        EndpointOutcome::EndpointFailure
    } else {
        EndpointOutcome::TaskFailure
    };
    let mut f = EndpointFailure::new(outcome, e.mechanism(), e.to_string());
    if let Some(c) = e.device_code() {
        f = f.with_device_code(c);
    }
    f.with_source(FailureSource::new(e))
}

type LaneFn = Box<dyn FnOnce(&mut ChipState) + Send>;

/// Work for an L2 lane.
enum LaneJob {
    /// A run: may prepare while the run in flight executes (it retires that run itself).
    /// Stamped when posted.
    Run(LaneFn, Instant),
    /// Anything else: runs after the run in flight was retired, as at depth 1.
    Control(LaneFn),
}

/// The lane of an L2 worker: a thread of its own fed by a channel.
pub(crate) struct ChipLane {
    pub(crate) chip: WorkerId,
    /// Runs that may be unpublished at once (1 or 2).
    pub(crate) depth: usize,
    tx: Mutex<Option<mpsc::Sender<LaneJob>>>,
    thread: Mutex<Option<JoinHandle<Vec<Residue>>>>,
}

impl ChipLane {
    pub(crate) fn spawn(state: ChipState, name: String) -> std::io::Result<ChipLane> {
        let chip = state.chip;
        let depth = state.pipeline_depth();
        let (tx, rx) = mpsc::channel::<LaneJob>();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            let mut state = state;
            // Whatever unwinds out of the loop (a tracing layer that panics while the loop
            // logs, say), the teardown below still publishes the run in flight.
            let served = catch_unwind(AssertUnwindSafe(|| serve(&rx, &mut state)));
            if let Err(p) = served {
                let text = panic_text(p.as_ref());
                // The panic may have come from the tracing layer itself.
                let log = || tracing::error!(%chip, "the chip lane stopped on a panic: {text}");
                let _ = catch_unwind(AssertUnwindSafe(log));
            }
            state.finalize()
        })?;
        Ok(ChipLane { chip, depth, tx: Mutex::new(Some(tx)), thread: Mutex::new(Some(thread)) })
    }

    /// Queues control work `job` behind earlier work (after the run in flight is retired);
    /// `Err` once the lane stopped.
    pub(crate) fn post(&self, job: LaneFn) -> Result<(), WorkerError> {
        self.send(LaneJob::Control(job))
    }

    /// Queues a run job, which may prepare while the previous run executes.
    pub(crate) fn post_run(&self, job: LaneFn) -> Result<(), WorkerError> {
        self.send(LaneJob::Run(job, Instant::now()))
    }

    fn send(&self, job: LaneJob) -> Result<(), WorkerError> {
        let tx = self.tx.lock();
        let stopped = || WorkerError::Lane { chip: self.chip, fault: LaneFault::Stopped };
        tx.as_ref().ok_or_else(stopped)?.send(job).map_err(|_| stopped())
    }

    /// Runs `f` on the lane and returns its result.
    pub(crate) fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut ChipState) -> R + Send + 'static,
    ) -> Result<R, WorkerError> {
        self.queue_call(f)?.wait()
    }

    /// Queues `f` as control work and returns at once; [`LaneReply::wait`] gives its result.
    pub(crate) fn queue_call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut ChipState) -> R + Send + 'static,
    ) -> Result<LaneReply<R>, WorkerError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.post(Box::new(move |s| {
            let _ = tx
                .send(catch_unwind(AssertUnwindSafe(|| f(s))).map_err(|p| panic_text(p.as_ref())));
        }))?;
        Ok(LaneReply { chip: self.chip, rx })
    }

    /// Stops the lane after its queued jobs and joins it; returns teardown residue.
    pub(crate) fn stop(&self) -> Vec<Residue> {
        self.tx.lock().take();
        let handle = self.thread.lock().take();
        match handle.map(JoinHandle::join) {
            Some(Ok(residue)) => residue,
            Some(Err(p)) => {
                let message = panic_text(p.as_ref());
                let cause = TeardownCause::Panicked { step: "lane thread", message };
                vec![Residue::failed(TeardownPart::Chip(self.chip), cause)]
            }
            None => Vec::new(),
        }
    }
}

/// The result of a call queued on an L2 lane ([`ChipLane::queue_call`]).
pub(crate) struct LaneReply<R> {
    chip: WorkerId,
    rx: mpsc::Receiver<Result<R, String>>,
}

impl<R> LaneReply<R> {
    /// Waits for the call to run on the lane.
    pub(crate) fn wait(self) -> Result<R, WorkerError> {
        match self.rx.recv() {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(message)) => {
                Err(WorkerError::Lane { chip: self.chip, fault: LaneFault::Panicked { message } })
            }
            Err(_) => Err(WorkerError::Lane { chip: self.chip, fault: LaneFault::JobDropped }),
        }
    }
}

/// The lane's loop: runs each job as it comes until the channel closes. A job's panic (a user
/// closure given to the lane) is caught and logged, so later calls and the teardown still find
/// the lane.
fn serve(rx: &mpsc::Receiver<LaneJob>, state: &mut ChipState) {
    let chip = state.chip;
    let mut back_to_back = false;
    while let Some(job) = next_job(rx, &mut back_to_back, state) {
        let f = match job {
            LaneJob::Run(f, _) => f,
            LaneJob::Control(f) => {
                state.retire_in_flight();
                f
            }
        };
        // The job's own result channel is dropped by the unwind, which its caller reports.
        let before = state.in_flight.as_ref().map(|f| f.run);
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(state))) {
            tracing::error!(%chip, "a chip lane job panicked: {}", panic_text(p.as_ref()));
        }
        // A streak needs runs that go in flight one after another: a job that left no new run
        // in flight (a failed preparation, a run reaped at once) ends it, so that quickly
        // failing submits cannot keep the run in flight from being reaped.
        let after = state.in_flight.as_ref().map(|f| f.run);
        if after.is_none() || after == before {
            back_to_back = false;
        }
    }
}

/// The lane's next job; `None` once the channel closed. With a run in flight, reaps it in
/// growing slices and takes a job that arrived between two slices.
///
/// While runs come `back_to_back` (the last time the lane published a run, the next run's job
/// had been posted before that publication; or the last run job was taken while a run was
/// in flight and put its own run in flight), it first waits up to [`JOB_WAIT`] for the job, so
/// that the next run is prepared while this one executes instead of after it was reaped: the
/// submitter posts it a thread wake-up after the lane replied to its previous submit, often
/// after the lane is here. A wait that times out, a job that puts no new run in flight, and
/// an idle lane end the streak, so a lone run waited for by its submitter is published as soon
/// as the device finished it, at most one run after a stream stops. Both that wait and an
/// idle lane's wait yield first ([`linger`]), as the next job usually follows within
/// microseconds.
fn next_job(
    rx: &mpsc::Receiver<LaneJob>,
    back_to_back: &mut bool,
    state: &mut ChipState,
) -> Option<LaneJob> {
    let mut slice = REAP_SLICE_MIN;
    while state.in_flight.is_some() {
        let job = if std::mem::take(back_to_back) {
            linger::recv_until(rx, Instant::now() + JOB_WAIT)
                .map_err(|e| e == mpsc::RecvTimeoutError::Disconnected)
        } else {
            rx.try_recv().map_err(|e| e == mpsc::TryRecvError::Disconnected)
        };
        match job {
            Ok(job) => {
                *back_to_back = matches!(job, LaneJob::Run(..));
                return Some(job);
            }
            Err(true) => return None,
            Err(false) => {}
        }
        if state.reap_in_flight_within(slice) {
            break;
        }
        slice = (slice * 2).min(REAP_SLICE_MAX);
    }
    match rx.try_recv() {
        // The next run's job was posted before the run in flight was published: the lane
        // should have waited for it (one posted after it answers the publication).
        Ok(job) => {
            *back_to_back = match (&job, state.published_at) {
                (LaneJob::Run(_, posted), Some(published)) => *posted < published,
                _ => false,
            };
            Some(job)
        }
        Err(mpsc::TryRecvError::Disconnected) => None,
        Err(mpsc::TryRecvError::Empty) => {
            *back_to_back = false;
            linger::recv(rx).ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use simpler_device_a2a3::programs::{add, f32_to_le_bytes};
    use simpler_device_a2a3::{Platform, RuntimeVariant};
    use simpler_types::{DataType, TaskArgs, WorkerId};

    use crate::worker::Body;
    use crate::{Orchestration, Worker};

    #[test]
    fn only_a_run_ahead_from_the_oldest_unfinished_one_makes_a_preparation_error_an_abandonment() {
        use simpler_device_a2a3::abi::codes::AclCode;
        use simpler_device_a2a3::{DeviceError, PoisonCause, PoisonStep};
        use simpler_types::RunId;

        use super::queued_behind;

        let id = |n| RunId::from_raw(n).expect("nonzero");
        let cause =
            |n| PoisonCause { run_id: id(n), step: PoisonStep::SyncAicpu, code: AclCode(1) };
        let unusable = |n| DeviceError::Unusable { device_id: 0, cause: cause(n) };
        let abandoned = |run, after| DeviceError::Abandoned {
            run_id: id(run),
            after: id(after),
            device_id: 0,
            cause: cause(after),
        };
        // Run 5, submitted while run 3 was the oldest unfinished one.
        let check = |e, behind: Option<u64>| queued_behind(e, Some(id(5)), behind.map(id));
        for culprit in [3, 4] {
            let (run, e) = check(unusable(culprit), Some(3)).expect("abandoned behind it");
            assert_eq!(run, id(5));
            assert!(
                matches!(e, DeviceError::Abandoned { run_id, after, .. }
                    if run_id == id(5) && after == id(culprit)),
                "{e}"
            );
            let (_, e) = check(abandoned(5, culprit), Some(3)).expect("kept as it is");
            assert!(matches!(e, DeviceError::Abandoned { after, .. } if after == id(culprit)));
        }
        // A culprit that had finished before the submit, the run itself or a later one, an
        // abandonment of another run, no run ahead at all, or no run id: the error stands.
        for e in [unusable(2), unusable(5), abandoned(5, 2), abandoned(5, 5), abandoned(4, 3)] {
            assert!(check(e, Some(3)).is_err());
        }
        assert!(check(unusable(4), None).is_err());
        assert!(queued_behind(unusable(4), None, Some(id(3))).is_err());
    }

    #[test]
    fn a_lane_that_stops_with_a_run_in_flight_publishes_that_run() {
        // A slow kernel keeps the run on the chip while the lane's channel closes under it, as
        // when the lane's loop ends for any reason with a run in flight: the teardown must
        // retire the run, or whoever waits for it waits forever.
        let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
        let callable = add::builder().names("add_0", "add_config").build().expect("callable");
        let add = b.register_chip(callable);
        let w = b.start().expect("start");
        let mem = w.memory().expect("memory");
        let n = 64;
        let mut args = TaskArgs::new();
        for x in [1.0f32, 2.0, 0.0] {
            let buf = mem.malloc(u64::from(n) * 4).expect("malloc");
            mem.copy_to(&buf, 0, &f32_to_le_bytes(&vec![x; n as usize])).expect("copy");
            args.add_inout(buf.tensor(&[n], DataType::Float32).expect("tensor")).expect("arg");
        }
        w.with_sim_faults(WorkerId(0), |p| p.kernel_delay(0, Duration::from_millis(200)))
            .expect("fault plan");
        let run = w.submit(Orchestration::chip(add, args)).expect("submit");
        assert!(!run.is_done(), "the run must still be on the chip when the lane stops");
        let Body::Chip(lane) = &w.inner.body else { unreachable!("an L2 worker has a lane") };
        let residue = lane.stop();
        assert!(residue.is_empty(), "{residue:?}");
        if run.wait_timeout(Duration::from_secs(20)).is_none() {
            // Closing would wait for the same run forever.
            std::mem::forget((run, w));
            panic!("the run in flight was never published");
        }
        w.close().expect("close after the lane stopped");
    }
}
