//! Reaping a launched run (R1–R3): polling, waiting on the streams or, with device queueing,
//! on the run's own end events, blaming a queued run's failure on the run it stood behind, and
//! typing a sync failure.

use std::time::{Duration, Instant};

use simpler_types::{RunId, TimeoutBudget};

use super::{
    ActiveRun, Core, DeviceHealth, RunState, Stage, busy, image_view, stream_slot, unmapped_image,
};
use crate::abi::codes::AclCode;
use crate::backend::{EventStatus, StreamFault, StreamStatus, SyncError};
use crate::diag::Outcome;
use crate::error::{CoreFault, DeviceError, PoisonCause, PoisonStep, RuntimeFault, StreamKind};

/// How long one reap waits, and what its timeout reports.
#[derive(Clone, Copy)]
struct ReapWait {
    /// The wait of the whole reap: its synchronisations (one per stream) share it, each
    /// getting what the ones before it left ([`left_of`]).
    sync: Duration,
    /// Whether `sync` is the caller's shorter deadline: running out of it leaves the run
    /// launched instead of failing it.
    caller_deadline: bool,
    /// The run's stream-sync budget, the limit a timeout reports.
    budget: Duration,
    /// When the reap must be over (the cleanup of a dropped run in a call that must not wait):
    /// the waits for the runs ahead and the recovery drain stop there too. `None`: no limit
    /// but the budgets.
    hard: Option<Instant>,
    /// The caller's deadline, when it gave one: a wait the reap adds after its first (a queued
    /// run's own budget once the runs ahead cleared) stops there too, leaving the run launched.
    caller_until: Option<Instant>,
}

impl ReapWait {
    /// The earlier of the hard deadline and the caller's: where a wait the reap adds stops.
    fn until(&self) -> Option<Instant> {
        self.hard.into_iter().chain(self.caller_until).min()
    }
}

/// The shortest recovery drain: a zero drain only asks whether the device is idle, and the
/// onboard backend marks the device for the force reset only in a drain that waits.
pub(super) const MIN_RECOVERY_DRAIN: Duration = Duration::from_millis(1);

/// Whether a queued run that timed out before it began stood behind a run that did not end.
enum Ahead {
    /// The timeout is the run's own: it had its own budget after the runs ahead, or its budget
    /// counted none and it began, or it never began and nothing ahead of it was left to end.
    Ended,
    /// The runs ahead the run's budget counted have all ended: the run could begin only as
    /// they ended, so it gets one budget of its own.
    Cleared,
    /// This run ahead did not end within what was left of its own budget, or failed: the
    /// culprit, its `launch_seq` and the code its wait ended with.
    Stuck(RunId, u64, AclCode),
    /// A run ahead still had budget left when the reap's hard deadline passed: undecided.
    Undecided,
}

/// What is left of a wait of `whole` that began at `started` (from `Duration::MAX`, no limit,
/// a wait still too long for any deadline, so still no limit). Consecutive synchronisations
/// share one wait this way (the first has all of it): without it, each got the whole of it,
/// and a reap whose first stream took most of its budget could wait nearly twice the budget.
fn left_of(started: Instant, whole: Duration) -> Duration {
    whole.saturating_sub(started.elapsed())
}

/// How R1 ended.
enum Synced {
    /// Both sides completed.
    Done,
    /// The caller's shorter deadline passed first; nothing changed.
    CallerDeadline,
    /// The first failure: the side, its poison step, and what the wait answered.
    Failed(StreamKind, PoisonStep, SyncError),
}

/// The streams a run's end is waited for on, in order, with the step a failure is charged to.
pub(super) const SYNC_ORDER: [(StreamKind, PoisonStep); 2] =
    [(StreamKind::Aicpu, PoisonStep::SyncAicpu), (StreamKind::AiCore, PoisonStep::SyncAiCore)];

/// R1: the AICPU side, then the AICore side, each waited for by `sync` (a stream or the run's
/// end event on it); the two share `wait.sync`, the AICore side getting what the AICPU side
/// left ([`left_of`]). Stops at the first failure.
fn sync_in_order(
    wait: ReapWait,
    mut sync: impl FnMut(StreamKind, Duration) -> Result<(), SyncError>,
) -> Synced {
    let started = Instant::now();
    for (stream, step) in SYNC_ORDER {
        let left =
            if stream == StreamKind::Aicpu { wait.sync } else { left_of(started, wait.sync) };
        match sync(stream, left) {
            Ok(()) => {}
            Err(SyncError::Timeout) if wait.caller_deadline => return Synced::CallerDeadline,
            Err(e) => return Synced::Failed(stream, step, e),
        }
    }
    Synced::Done
}

/// Adds what `stream` reported, `fault`, to the core faults the device recorded, unless one of
/// the same code on that stream says it already; it sorts after every fault the device timed.
pub(super) fn add_stream_fault(
    faults: &mut Vec<CoreFault>,
    stream: StreamKind,
    fault: &StreamFault,
) {
    if faults.iter().any(|x| x.stream == stream && x.code == fault.code) {
        return;
    }
    faults.push(CoreFault {
        code: fault.code,
        stream,
        core: None,
        func_id: None,
        task: None,
        message: fault.message.clone(),
        at_ticks: u64::MAX,
    });
}

/// Orders `faults` earliest first and returns what a device fault reports of them: the earliest
/// one's code and stream (`None`: no fault, and the failed wait's own are reported).
pub(super) fn earliest_fault(faults: &mut [CoreFault]) -> Option<(AclCode, StreamKind)> {
    faults.sort_by_key(|f| f.at_ticks);
    faults.first().map(|f| (f.code, f.stream))
}

/// The limits a typed sync failure reports: the run's stream-sync budget (a wait that ran out)
/// and the op-execute budget (an AICore timeout the stream reported).
#[derive(Clone, Copy)]
pub(super) struct WaitLimits {
    pub(super) stream_sync: Duration,
    pub(super) op_execute: Duration,
}

/// The error of `run_id`'s wait on `stream` that failed with `error`, the one typing shared by a
/// reap and a preparation's own failed wait. `faults` are what the device recorded (and, from a
/// reap, the other stream's report); the stream's own report joins them last. A wait that ran
/// out is a stream-sync timeout; an AICore timeout the stream reported is an op-execute
/// timeout; any other fault is a device fault naming the earliest fault's code and stream.
pub(super) fn typed_sync_failure(
    run_id: RunId,
    stream: StreamKind,
    error: SyncError,
    mut faults: Vec<CoreFault>,
    limits: WaitLimits,
    runtime: Option<Box<RuntimeFault>>,
) -> DeviceError {
    let f = match error {
        SyncError::Timeout => {
            earliest_fault(&mut faults);
            return DeviceError::Timeout {
                run_id,
                budget: TimeoutBudget::StreamSync,
                limit: limits.stream_sync,
                runtime,
                faults,
                #[cfg(feature = "onboard")]
                acl: None,
            };
        }
        SyncError::Fault(f) => f,
    };
    add_stream_fault(&mut faults, stream, &f);
    let earliest = earliest_fault(&mut faults);
    if f.code == AclCode::AICORE_TIMEOUT {
        return DeviceError::Timeout {
            run_id,
            budget: TimeoutBudget::OpExecute,
            limit: limits.op_execute,
            runtime,
            faults,
            #[cfg(feature = "onboard")]
            acl: f.acl,
        };
    }
    let (code, stream) = earliest.unwrap_or((f.code, stream));
    DeviceError::DeviceFault {
        run_id,
        code,
        stream,
        faults,
        runtime,
        #[cfg(feature = "onboard")]
        acl: f.acl,
    }
}

impl Core {
    /// Whether `reap_run` on `active` would return without waiting. Waits at most CANN's
    /// shortest sync per stream (a backend without stream queries), never more: a dropped
    /// launched run is cleaned up only if the device already finished (or failed) it, or its
    /// budget ran out; otherwise it stays queued. A run whose stream-sync budget a reap began
    /// and which has spent it is decided too, unless a run queued ahead of it is unfinished:
    /// its reap times out at once. One whose budget no reap began stays undecided while the
    /// device has not finished it.
    pub(super) fn poll_run(&mut self, active: &ActiveRun) -> Result<bool, DeviceError> {
        let now = Instant::now();
        self.reclaim_dropped_within(|_| Some(now));
        let s = self.check_lease("poll_run", &active.lease)?;
        // Not while a run queued ahead of it is unfinished: its reap would then wait for that
        // run's budget first.
        if let Some(run) = self.slots[s].run.as_ref().filter(|r| r.stage == Stage::Launched)
            && run.reap_started.is_some()
            && self.reap_budget(run).1.is_zero()
            && !self.launched_before(run.launch_seq).any(|r| self.queued_end(r).is_none())
        {
            return Ok(true);
        }
        match self.slots[s].run.as_ref().map(|r| r.stage) {
            Some(Stage::Launched)
                if self.slots[s].run.as_ref().is_some_and(|r| r.events.is_some()) =>
            {
                let Some(run) = self.slots[s].run.as_ref() else { return Ok(false) };
                Ok(self.abandoned_cause(run).is_some() || self.queued_end(run).is_some())
            }
            Some(Stage::Launched) if !self.backend.queries_streams() => {
                // No query (onboard): CANN's shortest sync of each stream, which a run still
                // executing merely runs out of. A fault decides the run: it is kept for the
                // reap, which reports it without asking the device again.
                let op = self.timeouts.op_execute;
                for (stream, step) in SYNC_ORDER {
                    match self.backend.synchronize(stream, MIN_RECOVERY_DRAIN, op) {
                        Ok(()) => {}
                        Err(SyncError::Timeout) => return Ok(false),
                        Err(SyncError::Fault(f)) => {
                            if let Some(run) = self.slots[s].run.as_mut() {
                                run.polled_fault.get_or_insert((stream, step, f));
                            }
                            return Ok(true);
                        }
                    }
                }
                Ok(true)
            }
            Some(Stage::Launched) => {
                let op = self.timeouts.op_execute;
                Ok([StreamKind::Aicpu, StreamKind::AiCore]
                    .into_iter()
                    .any(|k| matches!(self.backend.query(k, op), StreamStatus::Failed(_)))
                    || [StreamKind::Aicpu, StreamKind::AiCore]
                        .into_iter()
                        .all(|k| self.backend.query(k, op) == StreamStatus::Idle))
            }
            Some(Stage::Reaped) => Ok(true),
            Some(Stage::Prepared) | None => Err(busy("poll_run", "the run is not launched")),
        }
    }

    /// Reaps `active` (R1–R3). With `within` shorter than what is left of the stream-sync
    /// budget since the run's first reap, a run still executing at the deadline returns
    /// `Ok(false)` and stays launched; otherwise a run that does not finish within the budget
    /// is a stream-sync timeout.
    ///
    /// The cleanup of dropped handles shares the deadline: a dropped launched run queued ahead
    /// of `active` is waited for until then (`active` cannot end before it), any other is only
    /// looked at; one still executing stays queued.
    pub(super) fn reap_run(
        &mut self,
        active: &ActiveRun,
        within: Option<Duration>,
    ) -> Result<bool, DeviceError> {
        let now = Instant::now();
        let deadline = within.and_then(|d| now.checked_add(d));
        let ahead_of = self
            .check_lease("reap_run", &active.lease)
            .ok()
            .and_then(|s| self.slots[s].run.as_ref())
            .filter(|r| r.stage == Stage::Launched)
            .map(|r| r.launch_seq);
        // A dropped run queued ahead is waited for until the deadline (`None`: its budget), as
        // `active` cannot end before it; any other dropped run is only looked at.
        self.reclaim_dropped_within(|r| {
            if ahead_of.is_some_and(|seq| r.launch_seq < seq) { deadline } else { Some(now) }
        });
        let s = self.check_lease("reap_run", &active.lease)?;
        if self.slots[s].run.as_ref().is_some_and(|r| r.stage == Stage::Reaped) {
            return Ok(true);
        }
        let (s, mut run) = self.take_run("reap_run", &active.lease, Stage::Launched)?;
        let within = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let reaped = self.guarded(s, &mut run, Outcome::FailedAfterLaunch, |c, run| {
            c.reap_steps(run, within, None)
        });
        match reaped {
            Ok(true) => {
                run.stage = Stage::Reaped;
                self.slots[s].run = Some(run);
                Ok(true)
            }
            Ok(false) => {
                self.slots[s].run = Some(run);
                Ok(false)
            }
            Err(e) => {
                self.free_slot(s);
                Err(e)
            }
        }
    }

    /// R1–R3 on a run taken out of its slot; a failure has run the terminal cleanup.
    /// `Ok(false)`: the caller's shorter deadline passed first (nothing changed).
    ///
    /// The stream-sync budget runs from the run's first reap across all of them, so a caller
    /// that reaps in slices (the L2 lane between jobs) gets a timeout once the budget has
    /// passed, not a wait that never ends on a device that never finishes. Nothing waits past
    /// `hard` ([`ReapWait::hard`]); an undecided timeout there is `Ok(false)` too.
    fn reap_steps(
        &mut self,
        run: &mut RunState,
        within: Option<Duration>,
        hard: Option<Instant>,
    ) -> Result<bool, DeviceError> {
        let (budget, remaining) = self.reap_budget(run);
        let now = Instant::now();
        run.reap_started.get_or_insert((now, budget));
        let caller_until = within.and_then(|d| now.checked_add(d));
        let wait = match within {
            Some(d) if d < remaining => {
                ReapWait { sync: d, caller_deadline: true, budget, hard, caller_until }
            }
            _ => ReapWait { sync: remaining, caller_deadline: false, budget, hard, caller_until },
        };
        if run.events.is_some() {
            self.reap_queued(run, wait)
        } else {
            self.reap_streams(run, wait)
        }
    }

    /// R1–R3 of a dropped launched run (its result is discarded) that waits until `until` at
    /// most (`None`: as long as `reap_run` without a deadline). `Ok(false)`: the device had not
    /// finished it by then; nothing changed. Its budget begins at the first of these reaps, so
    /// a run that is only ever looked at still times out once the budget has passed.
    pub(super) fn reap_dropped(
        &mut self,
        run: &mut RunState,
        until: Option<Instant>,
    ) -> Result<bool, DeviceError> {
        let within = until.map(|u| u.saturating_duration_since(Instant::now()));
        self.reap_steps(run, within, until)
    }

    /// The stream-sync budget of `run` and what is left of it. The budget is fixed at the
    /// first reap, which has all of it (a run reaped once waits exactly as in `run()`). For a
    /// queued run it counts the runs still ahead then; fewer can only be ahead later, so the
    /// first figure covers every later reap.
    pub(super) fn reap_budget(&self, run: &RunState) -> (Duration, Duration) {
        match run.reap_started {
            Some((started, budget)) => (budget, budget.saturating_sub(started.elapsed())),
            None => {
                let budget = self.timeouts.stream_sync;
                let budget =
                    if run.events.is_some() { self.queued_budget(run, budget) } else { budget };
                (budget, budget)
            }
        }
    }

    /// R1–R3 of a run launched alone: wait for both streams.
    fn reap_streams(&mut self, run: &mut RunState, wait: ReapWait) -> Result<bool, DeviceError> {
        if let Some((stream, step, fault)) = run.polled_fault.take() {
            return Err(self.sync_failure(run, stream, step, SyncError::Fault(fault), wait));
        }
        let op = self.timeouts.op_execute;
        // R1: AICPU stream, then AICore stream.
        match sync_in_order(wait, |stream, left| self.backend.synchronize(stream, left, op)) {
            Synced::Done => self.reaped_unless_charged(run, wait),
            Synced::CallerDeadline => Ok(false),
            Synced::Failed(stream, step, e) => Err(self.sync_failure(run, stream, step, e, wait)),
        }
    }

    /// R3 of a run whose streams or end events completed, unless another wait gave up on it
    /// first: a preparation's write or the reap of a run behind it that charged it with a
    /// timeout and made the device unusable through it (it may have ended in the recovery
    /// drain since). Its reap then reports that timeout, as its own wait would have, never a
    /// success for the run the device's health names.
    fn reaped_unless_charged(
        &mut self,
        run: &mut RunState,
        wait: ReapWait,
    ) -> Result<bool, DeviceError> {
        let charged = self.failed_runs.iter().find(|(seq, c)| {
            *seq == run.launch_seq
                && c.run_id == run.run_id
                && c.code == AclCode::STREAM_SYNC_TIMEOUT
        });
        let Some(&(_, cause)) = charged else { return self.reaped(run) };
        let stream = if cause.step == PoisonStep::SyncAiCore {
            StreamKind::AiCore
        } else {
            StreamKind::Aicpu
        };
        Err(self.sync_failure(run, stream, cause.step, SyncError::Timeout, wait))
    }

    /// R3 of a run whose streams or end events completed: timing (soft), then the collectors in
    /// the outcome the latched status implies.
    fn reaped(&mut self, run: &mut RunState) -> Result<bool, DeviceError> {
        if let Err(e) = self.read_results(run) {
            // Its latched status cannot be read: the run must not pass for a success.
            self.finish(run, Outcome::FailedAfterLaunch);
            return Err(e);
        }
        let outcome =
            if run.latched.is_some() { Outcome::FailedAfterLaunch } else { Outcome::Success };
        self.stop_and_export(run, outcome);
        Ok(true)
    }

    /// R1–R3 of a queued run: wait for the run's own end events (AICPU, then AICore), not
    /// for the streams. A run behind a run whose failure made the device unusable ends as
    /// `Abandoned` at once, without waiting for events that will never complete.
    fn reap_queued(&mut self, run: &mut RunState, wait: ReapWait) -> Result<bool, DeviceError> {
        let op = self.timeouts.op_execute;
        // A run launched after the run that made the device unusable is abandoned even if its
        // events completed: that failure did not necessarily stop the streams (a timeout, an
        // unwind), so what it computed cannot be trusted.
        if let Some(cause) = self.abandoned_cause(run) {
            return Err(self.abandon_behind(run, cause));
        }
        let Some(events) = run.events.as_ref() else { return Ok(false) };
        let synced = sync_in_order(wait, |stream, left| {
            self.backend.event_synchronize(&events.end[stream_slot(stream)], left, op)
        });
        let (stream, step, e) = match synced {
            Synced::Done => return self.reaped_unless_charged(run, wait),
            Synced::CallerDeadline => return Ok(false),
            Synced::Failed(stream, step, e) => (stream, step, e),
        };
        if let SyncError::Fault(f) = &e
            && let Some((culprit, culprit_seq)) = self.failed_before(run)
        {
            let cause = PoisonCause { run_id: culprit, step, code: f.code };
            self.recover_or_mark_unusable(culprit, culprit_seq, step, f.code, wait.hard);
            return Err(self.abandon_behind(run, cause));
        }
        if matches!(e, SyncError::Timeout) {
            // The wait for the runs ahead stops at the caller's deadline too: a run ahead cut
            // short there is undecided and this run stays launched.
            self.start_budgets(Instant::now(), run.launch_seq);
            match self.stuck_ahead(run, wait.until()) {
                Ahead::Ended => {}
                Ahead::Cleared => return self.reap_after_cleared(run, wait),
                Ahead::Stuck(culprit, culprit_seq, code) => {
                    let cause = PoisonCause { run_id: culprit, step, code };
                    self.recover_or_mark_unusable(culprit, culprit_seq, step, code, wait.hard);
                    return Err(self.abandon_behind(run, cause));
                }
                Ahead::Undecided => return Ok(false),
            }
        }
        Err(self.sync_failure(run, stream, step, e, wait))
    }

    /// A queued run whose wait ran out behind runs that have all ended since (before it began,
    /// or just after) gets one more stream-sync budget from now for its own execution (no wait past
    /// `wait.hard` or the caller's deadline); the budget it reports on a timeout grows to
    /// match. Without this it would be charged a timeout for the time the runs ahead took.
    fn reap_after_cleared(
        &mut self,
        run: &mut RunState,
        wait: ReapWait,
    ) -> Result<bool, DeviceError> {
        let own = self.timeouts.stream_sync;
        run.own_budget = true;
        let budget = match run.reap_started.as_mut() {
            Some((started, budget)) => {
                *budget = started.elapsed().saturating_add(own);
                *budget
            }
            None => wait.budget.saturating_add(own),
        };
        // Neither past the reap's hard deadline nor past the caller's: at either the run stays
        // launched, with its grown budget for the next reap.
        let cut =
            wait.until().map(|h| h.saturating_duration_since(Instant::now())).filter(|h| *h < own);
        let wait =
            ReapWait { sync: cut.unwrap_or(own), caller_deadline: cut.is_some(), budget, ..wait };
        // Every run ahead has ended, so a second timeout finds none left: it is the run's own.
        self.reap_queued(run, wait)
    }

    /// How a queued run's end events stand without blocking: `None` while one is pending,
    /// `Some(Ok)` when both completed, `Some(Err)` when one failed.
    pub(super) fn queued_end(&self, run: &RunState) -> Option<Result<(), ()>> {
        let events = run.events.as_ref()?;
        let op = self.timeouts.op_execute;
        let mut all = Some(Ok(()));
        for ev in &events.end {
            match self.backend.event_status(ev, op) {
                EventStatus::Complete => {}
                EventStatus::Pending => all = None,
                EventStatus::Failed(_) => return Some(Err(())),
            }
        }
        all
    }

    /// A queued launch refused with an execution fault (`code`) while a run launched before it
    /// already reports that fault on an end event stands behind that run's failure (a device
    /// reports an asynchronous fault again at the next call on its streams): the earliest such
    /// run is the culprit, the device is unusable with its cause, and `run` ends
    /// `Abandoned { after }` with its terminal cleanup, as it would at its reap had the launch
    /// gone through. `None`: the launch failure is the run's own (another code, such as a
    /// refused binding or a device that fails every call, or no run ahead reporting it).
    pub(super) fn abandoned_at_launch(
        &mut self,
        run: &mut RunState,
        outcome: Outcome,
        code: AclCode,
    ) -> Option<DeviceError> {
        if !code.is_execution_fault() {
            return None;
        }
        let (culprit, culprit_seq, cause) = self.failed_ahead(run, code)?;
        self.recover_or_mark_unusable(culprit, culprit_seq, cause.step, cause.code, None);
        self.finish(run, outcome);
        let device_id = self.opts.device_id;
        Some(DeviceError::Abandoned { run_id: run.run_id, after: culprit, device_id, cause })
    }

    /// The earliest run launched before `run` whose end event already reports `code`: its id,
    /// its launch position and the cause of that failure (the stream it failed on, as a sync
    /// step). Looks without blocking.
    fn failed_ahead(&self, run: &RunState, code: AclCode) -> Option<(RunId, u64, PoisonCause)> {
        let op = self.timeouts.op_execute;
        self.ahead_in_launch_order(run).into_iter().find_map(|r| {
            let events = r.events.as_ref()?;
            [
                (StreamKind::Aicpu, PoisonStep::SyncAicpu),
                (StreamKind::AiCore, PoisonStep::SyncAiCore),
            ]
            .into_iter()
            .find_map(|(stream, step)| {
                match self.backend.event_status(&events.end[stream_slot(stream)], op) {
                    EventStatus::Failed(f) if f.code == code => {
                        Some((r.run_id, r.launch_seq, PoisonCause { run_id: r.run_id, step, code }))
                    }
                    EventStatus::Failed(_) | EventStatus::Complete | EventStatus::Pending => None,
                }
            })
        })
    }

    /// The stream-sync budget of a queued run: one budget for itself and one for each run
    /// launched before it that has not ended yet, since its end events complete only after
    /// theirs (the streams are FIFO). So each run of the queue gets the budget for its own
    /// execution, whatever order the runs are reaped in.
    fn queued_budget(&self, run: &RunState, budget: Duration) -> Duration {
        let ahead =
            self.launched_before(run.launch_seq).filter(|r| self.queued_end(r).is_none()).count();
        budget.saturating_mul(u32::try_from(ahead).unwrap_or(u32::MAX).saturating_add(1))
    }

    /// The runs still launched (not reaped) that were launched before position `launch_seq`.
    pub(super) fn launched_before(&self, launch_seq: u64) -> impl Iterator<Item = &RunState> {
        self.runs().filter(move |r| r.stage == Stage::Launched && r.launch_seq < launch_seq)
    }

    /// [`launched_before`](Self::launched_before) `run`, earliest first.
    fn ahead_in_launch_order(&self, run: &RunState) -> Vec<&RunState> {
        let mut ahead: Vec<&RunState> = self.launched_before(run.launch_seq).collect();
        ahead.sort_by_key(|r| r.launch_seq);
        ahead
    }

    /// The cause that made the device unusable, when the failure of a run launched before
    /// `run` did (or of one with no place in the launch order).
    fn abandoned_cause(&self, run: &RunState) -> Option<PoisonCause> {
        let DeviceHealth::Unusable { cause } = self.health.get() else { return None };
        // By launch position when the failing run was launched: runs of one engine run share a
        // run id (they differ by origin), so the id alone cannot tell the culprit from the runs
        // queued behind it.
        let behind = match self.poisoned_at {
            Some(at) => run.launch_seq > at,
            None => cause.run_id != run.run_id,
        };
        behind.then_some(cause)
    }

    /// The earlier run whose failure a queued run's failed `begin` event stands behind, with
    /// its `launch_seq`: the latest run launched before it that either began (its own `begin`
    /// events completed, so its own work failed) or already had a failure charged to it (it may
    /// have been reaped and left its slot), or else the run that made the device unusable when
    /// that run was launched before this one (or never launched). `None`: the run's `begin`
    /// events completed, or no earlier run failed; the failure is its own.
    fn failed_before(&self, run: &RunState) -> Option<(RunId, u64)> {
        let op = self.timeouts.op_execute;
        let begun = |r: &RunState| {
            r.events.as_ref().is_some_and(|e| {
                e.begin
                    .iter()
                    .all(|b| !matches!(self.backend.event_status(b, op), EventStatus::Failed(_)))
            })
        };
        if begun(run) {
            return None;
        }
        let latest_begun = self
            .ahead_in_launch_order(run)
            .into_iter()
            .rev()
            .find(|r| begun(r))
            .map(|r| (r.launch_seq, r.run_id));
        let latest_failed = self
            .failed_runs
            .iter()
            .map(|&(seq, c)| (seq, c.run_id))
            .filter(|&(seq, _)| seq < run.launch_seq)
            .max();
        if let Some((seq, id)) = latest_begun.max(latest_failed) {
            return Some((id, seq));
        }
        match self.health.get() {
            // A device that fails every query fails this run's `begin` events too; when the
            // cause is this run itself, or a run launched after it, the failure is its own.
            DeviceHealth::Unusable { .. }
                if self.poisoned_at.is_some_and(|at| at >= run.launch_seq) =>
            {
                None
            }
            DeviceHealth::Unusable { cause } => Some((cause.run_id, self.poisoned_at.unwrap_or(0))),
            DeviceHealth::Healthy => None,
        }
    }

    /// Who a queued run's timeout belongs to. Its budget counted the runs ahead of it at its
    /// first reap, one budget each; when those have all ended since, it could begin only as
    /// they ended, so the time was theirs: `Cleared`, whether or not it has begun by now (it
    /// may be just into its own execution). A run that never began (none of its `begin` events
    /// was reached) stands behind a run that is still executing: each unfinished run ahead, in
    /// launch order, gets what is left of its own budget to end, but no wait past `hard`; the
    /// first that does not end (or fails) is the culprit, with the code its wait ended with,
    /// and `Cleared` when all of them end in the wait. `Ended`, the timeout is the run's own,
    /// once it was given its own budget after the runs ahead, or when it began and its budget
    /// counted none, or when it never began and no run ahead is left.
    fn stuck_ahead(&self, run: &RunState, hard: Option<Instant>) -> Ahead {
        let op = self.timeouts.op_execute;
        let Some(events) = run.events.as_ref() else { return Ahead::Ended };
        if run.own_budget {
            return Ahead::Ended;
        }
        let counted_ahead = run.reap_started.is_some_and(|(_, b)| b > self.timeouts.stream_sync);
        let never_began =
            events.begin.iter().all(|b| self.backend.event_status(b, op) == EventStatus::Pending);
        if !never_began && !counted_ahead {
            return Ahead::Ended;
        }
        let unfinished: Vec<&RunState> = self
            .ahead_in_launch_order(run)
            .into_iter()
            .filter(|r| self.queued_end(r).is_none())
            .collect();
        if unfinished.is_empty() {
            return if counted_ahead { Ahead::Cleared } else { Ahead::Ended };
        }
        unfinished
            .into_iter()
            .find_map(|r| {
                // Every run ahead of `r` has ended by now, so an unreaped `r` gets one budget.
                let (_, left) = self.reap_budget(r);
                let started = Instant::now();
                let cut = hard.map(|h| h.saturating_duration_since(started)).filter(|h| *h < left);
                let wait = cut.unwrap_or(left);
                let ends = r.events.as_ref().map_or(&[][..], |e| &e.end[..]);
                ends.iter().find_map(|end| {
                    match self.backend.event_synchronize(end, left_of(started, wait), op) {
                        Ok(()) => None,
                        // Cut short by `hard`: `r` may still end within its budget.
                        Err(SyncError::Timeout) if cut.is_some() => Some(Ahead::Undecided),
                        Err(SyncError::Timeout) => {
                            Some(Ahead::Stuck(r.run_id, r.launch_seq, AclCode::STREAM_SYNC_TIMEOUT))
                        }
                        Err(SyncError::Fault(f)) => {
                            Some(Ahead::Stuck(r.run_id, r.launch_seq, f.code))
                        }
                    }
                })
            })
            .unwrap_or(Ahead::Cleared)
    }

    /// Begins at `from` the stream-sync budget of every unfinished run launched before
    /// position `before` whose reap has not begun it. A look at a run from a wait that is not
    /// its own reap counts as its first reap, as a look at a dropped run does: from the reap of
    /// a run behind it (without this, every look gave a run ahead a whole new budget, and a run
    /// behind reaped in slices behind a run that never ends waited forever).
    pub(super) fn start_budgets(&mut self, from: Instant, before: u64) {
        let starts: Vec<(u64, Duration)> = self
            .launched_before(before)
            .filter(|r| r.reap_started.is_none() && self.queued_end(r).is_none())
            .map(|r| (r.launch_seq, self.reap_budget(r).0))
            .collect();
        self.begin_budgets(from, &starts);
    }

    /// Begins at `from` each `(launch_seq, budget)` of `starts` for its run, unless a reap has
    /// begun that run's budget already.
    pub(super) fn begin_budgets(&mut self, from: Instant, starts: &[(u64, Duration)]) {
        for slot in &mut self.slots {
            let Some(r) = slot.run.as_mut() else { continue };
            if r.reap_started.is_some() {
                continue;
            }
            if let Some(&(_, budget)) = starts.iter().find(|(seq, _)| *seq == r.launch_seq) {
                r.reap_started = Some((from, budget));
            }
        }
    }

    /// How long the recovery drain of a reap may wait: the stream-sync budget, or, for a reap
    /// that must be over by `hard`, what is left until then (at least [`MIN_RECOVERY_DRAIN`]).
    pub(super) fn recovery_drain(&self, hard: Option<Instant>) -> Duration {
        let full = self.timeouts.stream_sync;
        hard.map_or(full, |h| {
            h.saturating_duration_since(Instant::now()).max(MIN_RECOVERY_DRAIN).min(full)
        })
    }

    /// Ends a queued run that stood behind another run's failure: terminal cleanup, and
    /// `Abandoned` naming that run (never its error).
    fn abandon_behind(&mut self, run: &mut RunState, cause: PoisonCause) -> DeviceError {
        self.finish(run, Outcome::FailedAfterLaunch);
        DeviceError::Abandoned {
            run_id: run.run_id,
            after: cause.run_id,
            device_id: self.opts.device_id,
            cause,
        }
    }

    /// R2: recover, collect what the device reported (earliest fault first) and the latched
    /// status when the device went idle, run the terminal cleanup, and type the error; a
    /// timeout names `wait.budget`, the stream-sync budget the run was given.
    fn sync_failure(
        &mut self,
        run: &mut RunState,
        stream: StreamKind,
        step: PoisonStep,
        e: SyncError,
        wait: ReapWait,
    ) -> DeviceError {
        let op = self.timeouts.op_execute;
        self.recover_or_mark_unusable(run.run_id, run.launch_seq, step, e.code(), wait.hard);
        let other =
            if stream == StreamKind::Aicpu { StreamKind::AiCore } else { StreamKind::Aicpu };
        let other_status = self.backend.query(other, op);
        let idle = self.backend.drain(Duration::ZERO, op);
        let runtime = if idle { self.latched_status(run) } else { None };
        let mut faults = self.backend.take_faults();
        if let StreamStatus::Failed(f) = &other_status {
            add_stream_fault(&mut faults, other, f);
        }
        self.finish(run, Outcome::FailedAfterLaunch);
        let limits = WaitLimits { stream_sync: wait.budget, op_execute: op };
        typed_sync_failure(run.run_id, stream, e, faults, limits, runtime.map(Box::new))
    }

    /// The runtime's latched status (device idle).
    fn latched_status(&self, run: &RunState) -> Option<RuntimeFault> {
        let view = image_view(&*self.backend, run).ok()?;
        run.bound.as_ref()?.latched_status(&view)
    }

    /// R3's reads after both streams completed: latched status and device timing (soft). An
    /// image the host cannot view fails the reads ([`unmapped_image`]): its status is unknown.
    fn read_results(&self, run: &mut RunState) -> Result<(), DeviceError> {
        let view =
            image_view(&*self.backend, run).map_err(|why| unmapped_image(run.run_id, why))?;
        let Some(bound) = run.bound.as_ref() else {
            run.report.warnings.push("device timing could not be read".into());
            return Ok(());
        };
        run.latched = bound.latched_status(&view);
        bound.read_back(&view, &mut run.report);
        let launch = run.aicore.as_ref().map_or(0, |l| l.started_ticks());
        match bound.timing(&view, launch) {
            Some((wall, phases)) => {
                run.report.device_wall = Some(wall);
                run.report.phases = Some(phases);
            }
            None => run.report.warnings.push("device timing records are incomplete".into()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::StreamFault;

    const LIMITS: WaitLimits =
        WaitLimits { stream_sync: Duration::from_secs(3), op_execute: Duration::from_secs(2) };

    fn recorded(code: AclCode, stream: StreamKind, at_ticks: u64) -> CoreFault {
        CoreFault {
            code,
            stream,
            core: None,
            func_id: None,
            task: None,
            message: "recorded by the device".into(),
            at_ticks,
        }
    }

    #[test]
    fn a_faulted_wait_names_the_earliest_fault_and_lists_the_streams_report_last() {
        // The AICPU stream reported an AICore exception; the device had recorded an AICore
        // timeout on the AICore stream before it.
        let error = SyncError::Fault(StreamFault::new(AclCode::AICORE_EXCEPTION, "faulted"));
        let faults = vec![recorded(AclCode::AICORE_TIMEOUT, StreamKind::AiCore, 10)];
        let err = typed_sync_failure(RunId::FIRST, StreamKind::Aicpu, error, faults, LIMITS, None);
        let DeviceError::DeviceFault { run_id, code, stream, faults, runtime, .. } = err else {
            panic!("not a device fault: {err}");
        };
        assert_eq!(run_id, RunId::FIRST);
        assert_eq!((code, stream), (AclCode::AICORE_TIMEOUT, StreamKind::AiCore));
        let listed: Vec<_> = faults.iter().map(|f| (f.code, f.stream)).collect();
        let expected = [
            (AclCode::AICORE_TIMEOUT, StreamKind::AiCore),
            (AclCode::AICORE_EXCEPTION, StreamKind::Aicpu),
        ];
        assert_eq!(listed, expected);
        assert!(runtime.is_none());
    }

    #[test]
    fn an_aicore_timeout_the_stream_reported_is_an_op_execute_timeout_listing_the_report() {
        // What a reap always reported; a preparation's own failed wait reported it as a device
        // fault until both took this one typing.
        let error = SyncError::Fault(StreamFault::new(AclCode::AICORE_TIMEOUT, "watchdog"));
        let err = typed_sync_failure(RunId::FIRST, StreamKind::AiCore, error, vec![], LIMITS, None);
        let DeviceError::Timeout { budget, limit, faults, .. } = err else {
            panic!("not a timeout: {err}");
        };
        assert_eq!((budget, limit), (TimeoutBudget::OpExecute, LIMITS.op_execute));
        let listed: Vec<_> = faults.iter().map(|f| (f.code, f.stream)).collect();
        assert_eq!(listed, [(AclCode::AICORE_TIMEOUT, StreamKind::AiCore)]);
    }

    #[test]
    fn a_wait_that_ran_out_is_a_stream_sync_timeout_with_the_faults_earliest_first() {
        let faults = vec![
            recorded(AclCode::AICORE_EXCEPTION, StreamKind::AiCore, 30),
            recorded(AclCode::AICORE_TIMEOUT, StreamKind::AiCore, 20),
        ];
        let err = typed_sync_failure(
            RunId::FIRST,
            StreamKind::Aicpu,
            SyncError::Timeout,
            faults,
            LIMITS,
            None,
        );
        let DeviceError::Timeout { budget, limit, faults, .. } = err else {
            panic!("not a timeout: {err}");
        };
        assert_eq!((budget, limit), (TimeoutBudget::StreamSync, LIMITS.stream_sync));
        let ticks: Vec<_> = faults.iter().map(|f| f.at_ticks).collect();
        assert_eq!(ticks, [20, 30]);
    }
}
