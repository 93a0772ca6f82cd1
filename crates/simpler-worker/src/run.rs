//! `RunHandle` and the cleanup election (`docs/worker-protocols.md` §3–§4).
//!
//! # Cleanup election
//!
//! Fence-owned cleanup runs exactly once, on a waiting thread (`wait`, admission of the next
//! run, or `close`), never on an engine thread:
//!
//! 1. Lock the run's cell. Published → return a clone. Another waiter elected → for an L2 run,
//!    unlock and yield (never past the deadline) until it publishes or gives up, then relock and
//!    decide again (published, or elected now, or still behind it); then park until
//!    publication, un-election or the deadline (`None`). Else become elected; unlock.
//! 2. Wait for the fence with the remaining deadline. On expiry (or an unwind out of the wait):
//!    relock, un-elect, wake every parked waiter (one of them takes over) and return `None`.
//!    The run is untouched.
//! 3. The fence fired: arm an [`ElectionGuard`]. If the thread unwinds before step 5 its `Drop`
//!    publishes `CleanupInterrupted` and retires the run, so no waiter is stranded.
//! 4. Run the cleanup steps in order, each isolated (`Result` and `catch_unwind`): release the
//!    run in the engine (L3+), then retire it from the worker's accepted set. No deadline
//!    applies; both steps are host-side and bounded.
//! 5. Store the result in the cell, wake every parked waiter, disarm the guard. Then drop the
//!    run's keep-alive values outside the lock, each under `catch_unwind`.
//!
//! Steps 1, 2 and 5 are the [`election`](crate::election) protocol; its mutex is the only lock,
//! and no engine lock is held while it is taken.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use simpler_sched::RunOutcome;
use simpler_types::{FailureMechanism, FailureSource, RunFailure, RunId};

use crate::deferred_drop;
use crate::election::{Election, Turn};
use crate::error::{CleanupError, CleanupFault, Frame, RunError, RunErrorKind, frames_of_task};
use crate::lane_fence::LaneFence;
use crate::linger;
use crate::reentry;
use crate::worker::Inner;

/// The longest single wait on an engine fence; a wait without deadline repeats it.
const FENCE_POLL: Duration = Duration::from_secs(1);
/// How often a fence wait that has not ended logs what it waits for, unless the builder says.
pub(crate) const DEFAULT_STILL_WAITING: Duration = Duration::from_secs(10);

/// Where a run is in its worker's unobserved failures (`UnobservedFailures`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(crate) enum Unobserved {
    /// Not entered (succeeded, observed, or not yet published).
    No = 0,
    /// Kept with its error.
    Kept = 1,
    /// Only counted.
    Counted = 2,
}

/// How a run's fence is observed.
pub(crate) enum Fence {
    /// An engine run (L3+).
    Engine,
    /// A chip lane run (L2), of the chip callable registered under `callable`.
    Lane { fence: Arc<LaneFence>, callable: Arc<str> },
}

/// The shared state of one accepted run.
pub(crate) struct RunShared {
    pub(crate) run: RunId,
    pub(crate) inner: Arc<Inner>,
    pub(crate) fence: Fence,
    /// Who cleans the run up, and its result (`election`).
    election: Election<Result<(), RunError>>,
    /// Set by a user-facing read of the result. Written and read only under the worker's
    /// lock of its unobserved failures (`UnobservedFailures`), so Relaxed suffices.
    observed: AtomicBool,
    /// Where the run is in the worker's unobserved failures; under the same lock.
    unobserved: AtomicU8,
    /// Number of cleanups run (exactly one per run; tests read it).
    pub(crate) cleanups: std::sync::atomic::AtomicU32,
}

impl RunShared {
    pub(crate) fn new(run: RunId, inner: Arc<Inner>, fence: Fence) -> Arc<RunShared> {
        Arc::new(RunShared {
            run,
            inner,
            fence,
            election: Election::new(),
            observed: AtomicBool::new(false),
            unobserved: AtomicU8::new(Unobserved::No as u8),
            cleanups: std::sync::atomic::AtomicU32::new(0),
        })
    }

    /// Adds values to drop after publication.
    pub(crate) fn keep(&self, values: impl IntoIterator<Item = Box<dyn Any + Send>>) {
        self.election.keep(values);
    }

    pub(crate) fn mark_observed(&self) {
        self.observed.store(true, Ordering::Relaxed);
    }

    pub(crate) fn was_observed(&self) -> bool {
        self.observed.load(Ordering::Relaxed)
    }

    /// Under the lock of the worker's unobserved failures only.
    pub(crate) fn unobserved(&self) -> Unobserved {
        match self.unobserved.load(Ordering::Relaxed) {
            1 => Unobserved::Kept,
            2 => Unobserved::Counted,
            _ => Unobserved::No,
        }
    }

    /// Under the lock of the worker's unobserved failures only.
    pub(crate) fn set_unobserved(&self, u: Unobserved) {
        self.unobserved.store(u as u8, Ordering::Relaxed);
    }

    pub(crate) fn is_published(&self) -> bool {
        self.election.is_published()
    }

    pub(crate) fn fence_fired(&self) -> bool {
        match &self.fence {
            Fence::Engine => {
                self.inner.engine().is_none_or(|e| e.is_done(self.run).unwrap_or(true))
            }
            Fence::Lane { fence, .. } => fence.is_set(),
        }
    }

    /// Election steps 1–5 (module docs). `None` when the deadline passed first.
    pub(crate) fn wait_until(
        self: &Arc<Self>,
        deadline: Option<Instant>,
    ) -> Option<Result<(), RunError>> {
        self.wait_until_for(deadline, false)
    }

    /// [`wait_until`](Self::wait_until) for a user who reads the result: elected, the run is
    /// marked observed before it is published, so that a close that sees the publication
    /// while this thread still drops what the cleanup released never counts the failure as
    /// unobserved.
    pub(crate) fn wait_until_observed(
        self: &Arc<Self>,
        deadline: Option<Instant>,
    ) -> Option<Result<(), RunError>> {
        let r = self.wait_until_for(deadline, true);
        if r.is_some() {
            self.inner.note_observed(self);
        }
        r
    }

    fn wait_until_for(
        self: &Arc<Self>,
        deadline: Option<Instant>,
        observed: bool,
    ) -> Option<Result<(), RunError>> {
        // 1.
        // An L2 run usually ends within a linger of the elected waiter's; an engine's run rarely.
        let linger = match self.fence {
            Fence::Lane { .. } => linger::LINGER,
            Fence::Engine => Duration::ZERO,
        };
        match self.election.enter(deadline, linger) {
            Turn::Published(r) => return Some(r),
            Turn::Expired => return None,
            Turn::Elected => {}
        }
        // 2. Until step 3 the guard un-elects this thread on every way out (expiry, or an
        // unwind out of the fence wait), so a parked waiter always takes over.
        let mut unelect = UnelectGuard { run: self, armed: true };
        if !self.wait_fence(deadline) {
            return None;
        }
        unelect.armed = false;
        // What the cleanup releases (closures unregistered while the run was live) is dropped
        // after the publication: a drop that waits for this run would otherwise wait for this
        // thread, its elected waiter. Opened before the guard, so that on an unwind it closes
        // after the guard has published too.
        let after_publication = deferred_drop::scope();
        // 3.
        let mut guard = ElectionGuard { run: self, armed: true, released: None };
        // 4.
        let result = self.cleanup(&mut guard);
        // 5.
        guard.armed = false;
        if observed {
            self.inner.note_observed(self);
        }
        let published = self.publish(result);
        drop(after_publication);
        Some(published)
    }

    fn wait_fence(&self, deadline: Option<Instant>) -> bool {
        // Tests make the wait give up (an injected failure) or unwind (an injected panic).
        if self.inner.inject("fence wait").is_err() {
            return false;
        }
        match &self.fence {
            Fence::Engine => {
                let Some(engine) = self.inner.engine() else { return true };
                // `Engine::wait` refuses a run whose builder is still open (another thread's
                // graph callback, seen by `free` or a later waiter): polling `wait_timeout`
                // waits for it instead. An unknown run has no fence left to wait for; the
                // release step reports it.
                let started = Instant::now();
                let every = self.inner.still_waiting;
                // An interval past what `Instant` holds never warns.
                let mut warn_at = started.checked_add(every);
                let poll = FENCE_POLL.min(every);
                loop {
                    let slice = match deadline {
                        None => poll,
                        Some(d) => d.saturating_duration_since(Instant::now()).min(poll),
                    };
                    match engine.wait_timeout(self.run, slice) {
                        Ok(Some(_)) | Err(_) => return true,
                        Ok(None) if deadline.is_some_and(|d| Instant::now() >= d) => return false,
                        Ok(None) => {}
                    }
                    // A task that never returns would keep this wait (and the close, the
                    // submits and the other waiters behind it) silent for ever: say what it
                    // waits for.
                    if let Some(at) = warn_at
                        && Instant::now() >= at
                    {
                        warn_at = at.checked_add(every);
                        let busy: Vec<String> =
                            engine.busy().iter().map(ToString::to_string).collect();
                        tracing::warn!(
                            worker = %self.inner.label,
                            run = %self.run,
                            "still waiting for {} after {:.0?}; busy: {}",
                            self.run,
                            started.elapsed(),
                            if busy.is_empty() { "none".to_owned() } else { busy.join("; ") }
                        );
                    }
                }
            }
            Fence::Lane { fence, .. } => fence.wait(deadline),
        }
    }

    /// Step 4: the cleanup steps, each isolated. What the release step found is kept in `guard`
    /// too, for the error it publishes should this thread unwind before step 5.
    fn cleanup(self: &Arc<Self>, guard: &mut ElectionGuard<'_>) -> Result<(), RunError> {
        self.cleanups.fetch_add(1, Ordering::Relaxed);
        let mut failures: Vec<CleanupError> = Vec::new();
        let mut fail = |step, fault| failures.push(CleanupError { step, fault });
        // Step "release": the engine's run record (L3+) or the lane's fence (L2).
        let released = catch_unwind(AssertUnwindSafe(|| {
            self.injected("release")?;
            self.release()
        }));
        match released {
            Ok(Ok(r)) => guard.released = Some(r),
            Ok(Err(fault)) => fail("release", fault),
            Err(p) => fail("release", CleanupFault::Panicked(panic_text(p.as_ref()))),
        }
        // Tests unwind the elected thread here, outside the isolation of the steps.
        let _ = self.inner.inject("between cleanup steps");
        // Step "retire": the worker's accepted set (and deferred unregistrations).
        let retired = catch_unwind(AssertUnwindSafe(|| {
            self.injected("retire")?;
            self.inner.retire(self);
            Ok(())
        }));
        match retired {
            Ok(Ok(())) => {}
            Ok(Err(fault)) => fail("retire", fault),
            Err(p) => {
                // Once more, so the run leaves the accepted set; a second panic is not let out
                // of the caller's wait.
                let _ = catch_unwind(AssertUnwindSafe(|| self.inner.retire(self)));
                fail("retire", CleanupFault::Panicked(panic_text(p.as_ref())));
            }
        }
        // A copy: the guard keeps its own until step 5 disarms it.
        match guard.released.clone() {
            Some(Err(e)) if failures.is_empty() => Err(e),
            Some(Err(e)) => Err(RunError::new(
                e.run_id(),
                e.kind().clone(),
                e.frames().to_vec(),
                failures,
                e.run_failure().cloned(),
            )),
            Some(Ok(())) | None => {
                let mut failures = failures.into_iter();
                match failures.next() {
                    None => Ok(()),
                    Some(first) => {
                        let mut frame = self.frame(first.to_string());
                        let kind = RunErrorKind::CleanupFailed { step: first.step };
                        frame.source = Some(FailureSource::new(first));
                        Err(RunError::new(self.run, kind, vec![frame], failures.collect(), None))
                    }
                }
            }
        }
    }

    /// A failure a test injected into cleanup step `step`.
    fn injected(&self, step: &'static str) -> Result<(), CleanupFault> {
        #[cfg(test)]
        if self.inner.inject(step).is_err() {
            return Err(CleanupFault::Injected);
        }
        #[cfg(not(test))]
        let _ = step;
        Ok(())
    }

    /// Releases the run where it executed and turns its outcome into a result.
    fn release(&self) -> Result<Result<(), RunError>, CleanupFault> {
        match &self.fence {
            Fence::Engine => {
                let engine = self.inner.engine().ok_or(CleanupFault::EngineGone)?;
                let summary =
                    engine.release(self.run).map_err(|e| CleanupFault::Release(Arc::new(e)))?;
                Ok(match summary.outcome {
                    RunOutcome::Completed => Ok(()),
                    RunOutcome::Failed(f) => Err(self.inner.run_error(&f)),
                })
            }
            Fence::Lane { fence, callable } => fence.with_result(|done| match done {
                Some(Ok(())) => Ok(Ok(())),
                Some(Err(e)) => Ok(Err(self.inner.lane_error(self.run, callable, e))),
                // The fence wait returns only once the lane has set the fence; should that ever
                // change, the run is reported failed rather than done.
                None => Err(CleanupFault::FenceUnset),
            }),
        }
    }

    fn frame(&self, message: String) -> Frame {
        Frame::of_run(self.inner.level, self.run, message)
    }

    /// Step 5: stores the result, wakes waiters, then drops keep-alives outside the lock.
    fn publish(&self, result: Result<(), RunError>) -> Result<(), RunError> {
        let keep = self.election.publish(result.clone());
        deferred_drop::drop_logged(Some(self.run), keep);
        result
    }
}

/// Un-elects the elected waiter and wakes the parked ones unless disarmed (step 2).
struct UnelectGuard<'a> {
    run: &'a RunShared,
    armed: bool,
}

impl Drop for UnelectGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.run.election.give_up();
        }
    }
}

/// Publishes `CleanupInterrupted` if the elected thread unwinds mid-cleanup (step 3).
struct ElectionGuard<'a> {
    run: &'a Arc<RunShared>,
    armed: bool,
    /// The run's own result, once the release step found it (the record is gone after that).
    released: Option<Result<(), RunError>>,
}

impl Drop for ElectionGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let run = self.run;
        // The run's own result: what the release step found, or else a release from here (best
        // effort: a failure is logged, since the error published below cannot carry it).
        let own = match self.released.take() {
            Some(r) => r,
            None => match catch_unwind(AssertUnwindSafe(|| run.release())) {
                Ok(Ok(r)) => r,
                Ok(Err(error)) => {
                    tracing::warn!(run = %run.run, %error, "releasing an interrupted run failed");
                    Ok(())
                }
                Err(p) => {
                    tracing::warn!(
                        run = %run.run,
                        panic = %panic_text(p.as_ref()),
                        "releasing an interrupted run panicked"
                    );
                    Ok(())
                }
            },
        };
        let _ = catch_unwind(AssertUnwindSafe(|| run.inner.retire(run)));
        let mut frames = own.as_ref().err().map(|e| e.frames().to_vec()).unwrap_or_default();
        frames.push(run.frame("the thread running the cleanup unwound before it finished".into()));
        let failure = own.as_ref().err().and_then(|e| e.run_failure().cloned());
        let err =
            RunError::new(run.run, RunErrorKind::CleanupInterrupted, frames, Vec::new(), failure);
        let _ = run.publish(Err(err));
    }
}

pub(crate) fn panic_text(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// The kind of a run failure.
pub(crate) fn kind_of(f: &RunFailure) -> RunErrorKind {
    match f {
        RunFailure::Task(t) => {
            let root = t.root_cause();
            kind_of_mechanism(&root.mechanism, root.device_code)
        }
        RunFailure::Submission { .. } => RunErrorKind::SubmissionFailed,
        RunFailure::Aborted { .. } => RunErrorKind::Aborted,
        _ => RunErrorKind::Internal,
    }
}

/// The kind of a task failure that failed by `mechanism`, with the device's `code`.
pub(crate) fn kind_of_mechanism(
    mechanism: &FailureMechanism,
    code: Option<simpler_types::DeviceCode>,
) -> RunErrorKind {
    match mechanism {
        FailureMechanism::TaskFailed | FailureMechanism::Panicked => RunErrorKind::TaskFailed,
        FailureMechanism::EndpointFailed => RunErrorKind::EndpointFailed,
        FailureMechanism::DeviceFault => RunErrorKind::DeviceFault { code },
        FailureMechanism::Timeout { budget, limit } => {
            RunErrorKind::Timeout { budget: budget.to_string(), value: *limit }
        }
        FailureMechanism::CapacityExhausted { what } => {
            RunErrorKind::Capacity { what: what.clone() }
        }
        _ => RunErrorKind::TaskFailed,
    }
}

/// Frames of an engine failure at `level`.
pub(crate) fn frames_of(
    level: u8,
    f: &RunFailure,
    name_of: &dyn Fn(&simpler_types::CallableId) -> Option<String>,
) -> Vec<Frame> {
    match f {
        RunFailure::Task(t) => frames_of_task(level, t, name_of),
        other => vec![Frame::of_run(level, other.run(), other.to_string())],
    }
}

/// A cloneable handle to one accepted run. `Clone + Send + Sync`; clones share the run.
///
/// Dropping every clone unwaited never blocks: the run completes, and the next admission or
/// `close` cleans it up.
#[derive(Clone)]
pub struct RunHandle {
    pub(crate) shared: Arc<RunShared>,
}

impl std::fmt::Debug for RunHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHandle").field("run", &self.shared.run).finish_non_exhaustive()
    }
}

impl RunHandle {
    /// The run's id.
    pub fn run_id(&self) -> RunId {
        self.shared.run
    }

    /// Whether the run's fence fired. Never blocks on the run and never cleans up.
    pub fn is_done(&self) -> bool {
        self.shared.is_published() || self.shared.fence_fired()
    }

    /// Waits for the run's result; the first waiter after the fence performs the cleanup.
    ///
    /// From a thread acting for the run's own worker (its orchestration callback, a host
    /// closure, a child run) a run that has not ended yet is refused with
    /// [`RunErrorKind::Reentrant`]: the run may be waiting for that very thread.
    pub fn wait(&self) -> Result<(), RunError> {
        if let Some(refused) = self.refused_from_this_thread() {
            return Err(refused);
        }
        self.shared.inner.note_observed(&self.shared);
        match self.shared.wait_until(None) {
            Some(r) => r,
            // Unreachable without a deadline; answered with the run's state instead of a panic.
            None => Err(RunError::new(
                self.shared.run,
                RunErrorKind::Internal,
                Vec::new(),
                Vec::new(),
                None,
            )),
        }
    }

    /// As [`wait`](Self::wait), giving up after `timeout` with `None`. Never cancels the run or
    /// disturbs other waiters. From a thread acting for the run's own worker a run that has not
    /// ended is refused with [`RunErrorKind::Reentrant`] as by `wait`, unless `timeout` is zero
    /// (a look, which never waits).
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<(), RunError>> {
        if !timeout.is_zero()
            && let Some(refused) = self.refused_from_this_thread()
        {
            return Some(Err(refused));
        }
        // A timeout beyond what `Instant` can represent (`Duration::MAX`) means no deadline.
        self.shared.wait_until_observed(Instant::now().checked_add(timeout))
    }

    /// The result if the run is done (performing the cleanup if nobody has), else `None`.
    pub fn result(&self) -> Option<Result<(), RunError>> {
        self.wait_timeout(Duration::ZERO)
    }

    /// The `Reentrant` refusal of a wait for this run, unfinished, from a thread acting for its
    /// own worker: the run may be waiting for that very thread.
    fn refused_from_this_thread(&self) -> Option<RunError> {
        (!self.is_done() && reentry::is_acting_for(self.shared.inner.instance)).then(|| {
            RunError::new(self.shared.run, RunErrorKind::Reentrant, Vec::new(), Vec::new(), None)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    use simpler_device_a2a3::{Platform, RuntimeVariant};
    use simpler_types::TaskArgs;

    use super::*;
    use crate::{CallableHandle, Orchestration, Worker};

    fn held_worker() -> (Worker, CallableHandle, Arc<Barrier>) {
        let gate = Arc::new(Barrier::new(2));
        let g2 = Arc::clone(&gate);
        let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(1);
        let hold = b.register_host("hold", move |_| {
            g2.wait();
            Ok(())
        });
        (b.start().expect("start"), hold, gate)
    }

    fn one(h: CallableHandle) -> Orchestration {
        Orchestration::graph(move |g, _, _| {
            g.submit_sub(h, TaskArgs::new())?;
            Ok(())
        })
    }

    /// A held worker whose next cleanup step `step` fails (or panics), and a run of one held
    /// task submitted and released, so that its cleanup meets the injected failure.
    fn run_meeting_cleanup_failure(
        step: &'static str,
        panics: bool,
    ) -> (Worker, CallableHandle, Arc<Barrier>, RunHandle) {
        let (w, hold, gate) = held_worker();
        w.inject_cleanup_failure(step, panics);
        let handle = w.submit(one(hold)).expect("submit");
        gate.wait();
        (w, hold, gate, handle)
    }

    #[test]
    fn concurrent_waiters_share_one_cleanup_and_a_ptr_eq_result() {
        let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(1);
        let gate = Arc::new(Barrier::new(2));
        let g2 = Arc::clone(&gate);
        let bad = b.register_host("bad", move |_| {
            g2.wait();
            Err("shared failure".into())
        });
        let w = b.start().expect("start");
        let handle = w.submit(one(bad)).expect("submit");
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let h = handle.clone();
                std::thread::spawn(move || {
                    // `is_done` during cleanup neither errors nor blocks.
                    let _ = h.is_done();
                    h.wait()
                })
            })
            .collect();
        gate.wait();
        let results: Vec<RunError> =
            waiters.into_iter().map(|t| t.join().expect("join").expect_err("fails")).collect();
        assert!(results.windows(2).all(|w| w[0].ptr_eq(&w[1])));
        assert_eq!(handle.shared.cleanups.load(Ordering::Relaxed), 1);
        assert!(handle.wait().expect_err("same").ptr_eq(&results[0]));
    }

    #[test]
    fn a_failing_cleanup_step_becomes_the_result_for_every_waiter() {
        let (w, hold, gate, handle) = run_meeting_cleanup_failure("release", false);
        let e = handle.wait().expect_err("cleanup failed");
        assert_eq!(e.kind(), &RunErrorKind::CleanupFailed { step: "release" });
        let source = e.frames()[0].error().and_then(|s| s.downcast_ref::<CleanupError>());
        assert!(
            matches!(source, Some(CleanupError { step: "release", fault: CleanupFault::Injected })),
            "{e}: {source:?}"
        );
        assert!(handle.clone().wait().expect_err("again").ptr_eq(&e));
        w.inner.injected.lock().clear();
        // The run was retired: the next run is admitted and close does not hang.
        let next = w.submit(one(hold)).expect("next");
        gate.wait();
        next.wait().expect("next run");
        w.close().expect("close");
    }

    #[test]
    fn a_panicking_cleanup_step_still_publishes_and_retires_the_run() {
        let (w, _, _, handle) = run_meeting_cleanup_failure("retire", true);
        let e = handle.wait().expect_err("cleanup panicked");
        assert_eq!(e.kind(), &RunErrorKind::CleanupFailed { step: "retire" });
        w.inner.injected.lock().clear();
        assert!(w.inner.accepted.lock().is_empty());
        w.close().expect("close does not hang");
    }

    /// A worker whose cleanup panics at `step`, and a host callable that fails with "the run's
    /// own failure".
    fn failing_run_meeting_panic_at(step: &'static str) -> (Worker, CallableHandle) {
        let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(1);
        let bad = b.register_host("bad", |_| Err("the run's own failure".into()));
        let w = b.start().expect("start");
        w.inject_cleanup_failure(step, true);
        (w, bad)
    }

    #[test]
    fn a_cleanup_step_failing_after_the_run_failed_is_kept_typed_beside_the_runs_error() {
        let (w, bad) = failing_run_meeting_panic_at("retire");
        let e = w.submit(one(bad)).expect("submit").wait().expect_err("the task failed");
        w.inner.injected.lock().clear();
        assert_eq!(e.kind(), &RunErrorKind::TaskFailed);
        let [CleanupError { step: "retire", fault: CleanupFault::Panicked(payload) }] =
            e.suppressed()
        else {
            panic!("{e}: {:?}", e.suppressed());
        };
        assert_eq!(payload, "injected panic in cleanup step retire");
        w.close().expect("close");
    }

    #[test]
    fn an_elected_waiter_unwinding_mid_cleanup_publishes_cleanup_interrupted() {
        let (w, _, _, handle) = run_meeting_cleanup_failure("between cleanup steps", true);
        // The elected waiter unwinds out of `wait` between two cleanup steps.
        let unwound = catch_unwind(AssertUnwindSafe(|| handle.wait()));
        assert!(unwound.is_err(), "the injected panic unwinds out of wait");
        w.inner.injected.lock().clear();
        let r = handle.wait_timeout(Duration::from_secs(60)).expect("published for the next");
        assert_eq!(r.expect_err("interrupted").kind(), &RunErrorKind::CleanupInterrupted);
        assert_eq!(handle.shared.cleanups.load(Ordering::Relaxed), 1);
        assert!(w.inner.accepted.lock().is_empty(), "the guard retired the run");
        w.close().expect("close does not hang");
    }

    #[test]
    fn a_cleanup_interrupted_after_the_release_keeps_the_runs_own_failure() {
        // The release step took the engine's record (and the run's failure with it) before the
        // elected waiter unwound: the published error must still carry that failure.
        let (w, bad) = failing_run_meeting_panic_at("between cleanup steps");
        let handle = w.submit(one(bad)).expect("submit");
        let unwound = catch_unwind(AssertUnwindSafe(|| handle.wait()));
        assert!(unwound.is_err(), "the injected panic unwinds out of wait");
        w.inner.injected.lock().clear();
        let r = handle.wait_timeout(Duration::from_secs(60)).expect("published for the next");
        let e = r.expect_err("interrupted");
        assert_eq!(e.kind(), &RunErrorKind::CleanupInterrupted);
        let failure = e.run_failure().map(|f| f.to_string()).unwrap_or_default();
        assert!(failure.contains("the run's own failure"), "{e}: {failure:?}");
        w.close().expect("close does not hang");
    }

    /// Waits (up to two seconds) in its drop for the run put in its slot, and notes whether
    /// that wait found the run published.
    struct WaitsWhenDropped {
        run: Arc<parking_lot::Mutex<Option<RunHandle>>>,
        found_published: Arc<parking_lot::Mutex<Option<bool>>>,
    }

    impl Drop for WaitsWhenDropped {
        fn drop(&mut self) {
            if let Some(h) = self.run.lock().take() {
                let got = h.wait_timeout(Duration::from_secs(2));
                *self.found_published.lock() = Some(got.is_some());
            }
        }
    }

    #[test]
    fn an_elected_waiter_unwinding_mid_cleanup_drops_what_it_released_after_publishing() {
        let (w, hold, gate) = held_worker();
        let slot = Arc::new(parking_lot::Mutex::new(None));
        let found_published = Arc::new(parking_lot::Mutex::new(None));
        let captured = WaitsWhenDropped {
            run: Arc::clone(&slot),
            found_published: Arc::clone(&found_published),
        };
        let c = w
            .register_host("captures", move |_| {
                let _ = &captured;
                Ok(())
            })
            .expect("register");
        w.inject_cleanup_failure("between cleanup steps", true);
        let handle = w.submit(one(hold)).expect("submit");
        w.unregister(c).expect("unregister, deferred behind the run");
        *slot.lock() = Some(handle.clone());
        gate.wait();
        // The elected waiter unwinds; its guard retires the run (releasing the closure) and
        // publishes, and only then may the closure's drop wait for the run.
        let unwound = catch_unwind(AssertUnwindSafe(|| handle.wait()));
        assert!(unwound.is_err(), "the injected panic unwinds out of wait");
        w.inner.injected.lock().clear();
        assert_eq!(*found_published.lock(), Some(true), "the drop waited on its own unwind");
        w.close().expect("close");
    }

    #[test]
    fn an_elected_waiter_unwinding_before_the_fence_lets_another_take_over() {
        let (w, hold, gate) = held_worker();
        let handle = w.submit(one(hold)).expect("submit");
        // The elected waiter unwinds out of its fence wait while the task is still held.
        w.inject_cleanup_failure("fence wait", true);
        let unwound = catch_unwind(AssertUnwindSafe(|| handle.wait()));
        assert!(unwound.is_err(), "the injected panic unwinds out of wait");
        w.inner.injected.lock().clear();
        gate.wait();
        assert!(matches!(handle.wait_timeout(Duration::from_secs(60)), Some(Ok(()))));
        assert_eq!(handle.shared.cleanups.load(Ordering::Relaxed), 1);
        w.close().expect("close");
    }

    /// Runs `close` on a thread; `None` if it did not return within a generous bound.
    fn close_within_bound(w: Worker) -> Option<Result<(), crate::CloseError>> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(w.close());
        });
        rx.recv_timeout(Duration::from_secs(60)).ok()
    }

    #[test]
    fn close_does_not_spin_on_a_published_run_whose_retire_step_failed() {
        let (w, _, _, handle) = run_meeting_cleanup_failure("retire", false);
        let e = handle.wait().expect_err("cleanup failed");
        assert_eq!(e.kind(), &RunErrorKind::CleanupFailed { step: "retire" });
        w.inner.injected.lock().clear();
        assert!(!w.inner.accepted.lock().is_empty(), "the failed retire left the run accepted");
        assert!(close_within_bound(w).is_some(), "close spun on the published run");
    }

    #[test]
    fn a_close_attempt_that_unwinds_publishes_a_failed_result_for_every_closer() {
        let (w, _, _) = held_worker();
        w.inject_cleanup_failure("teardown", true);
        let unwound = catch_unwind(AssertUnwindSafe(|| w.close()));
        assert!(unwound.is_err(), "the injected teardown panic unwinds out of close");
        w.inner.injected.lock().clear();
        let e = close_within_bound(w).expect("a later close returns").expect_err("failed");
        assert!(
            matches!(
                e.teardown.as_slice(),
                [crate::TeardownError {
                    what: crate::TeardownPart::Worker,
                    cause: crate::TeardownCause::Unwound,
                    ..
                }]
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("the close attempt unwound"), "{e}");
    }

    #[test]
    fn a_waiter_timing_out_before_the_fence_lets_another_finish() {
        let (w, hold, gate) = held_worker();
        let handle = w.submit(one(hold)).expect("submit");
        let other = handle.clone();
        assert!(handle.wait_timeout(Duration::from_millis(1)).is_none());
        let done = Arc::new(AtomicUsize::new(0));
        let d2 = Arc::clone(&done);
        let t = std::thread::spawn(move || {
            let r = other.wait();
            d2.fetch_add(1, Ordering::SeqCst);
            r
        });
        gate.wait();
        t.join().expect("join").expect("the other waiter finishes");
        assert_eq!(done.load(Ordering::SeqCst), 1);
        assert!(matches!(handle.result(), Some(Ok(()))));
        assert_eq!(handle.shared.cleanups.load(Ordering::Relaxed), 1);
    }
}
