//! Closing a worker: the lifecycle, operation leases, the close protocol and `Drop`
//! (`docs/worker-protocols.md` §6).
//!
//! # Protocol
//!
//! 1. A caller acting for this worker (inside its callback, closure or child run, or a
//!    closure or run of a descendant worker) gets `reentrant` at once.
//! 2. Lock the lifecycle. An attempt in flight → park until it ends and return its result
//!    (`close_timeout`: past its budget first → `DrainTimeout`). A finished attempt → return
//!    its result again, unless it was a drain timeout: then retry.
//! 3. Claim: lifecycle := `Closed`, attempt := in flight, unlock. New submissions,
//!    registrations and memory calls now fail with `Closed`; calls already past that check hold
//!    an operation lease.
//! 4. Drain leases (a submit admitted before the claim finishes its callback and its run joins
//!    the accepted set). Past the budget → `DrainTimeout`, nothing torn down, still `Closed`.
//! 5. Drain the accepted runs in FIFO order as an ordinary waiter (cleanup election). Failed
//!    runs that no user read go to `unobserved_runs` (at most
//!    [`UnobservedFailures::KEPT`] of them; further ones are counted in
//!    `unobserved_runs_not_kept`).
//! 6. Tear down once: stop the engine (its chip lanes finalize their chips, sub threads join,
//!    children close recursively) or the L2 lane. Residue goes to `leaked`.
//! 7. Publish the result in the attempt and wake joiners; then drop the registries outside
//!    every lock, so a closure whose `Drop` calls `close` finds the finished attempt.
//!

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use simpler_types::RunId;

use simpler_sched::ShutdownError;

use crate::deferred_drop;
use crate::error::{
    CloseError, DrainTimeout, Residue, RunError, TeardownCause, TeardownError, TeardownPart,
    WorkerError,
};
use crate::gate::Gate;
use crate::reentry;
use crate::run::{RunShared, Unobserved, panic_text};
use crate::worker::{Body, Inner, Worker};

/// Failed runs published before anybody read their result, which `close` reports.
///
/// Bounded, so that a long-lived worker whose callers drop failing handles does not grow: the
/// first [`KEPT`](Self::KEPT) such failures are kept with their errors, later ones are only
/// counted. A run leaves the set (or the count) when a handle reads its result. Each run's
/// [`Unobserved`] mark says where it is; it is read and written only under the worker's lock
/// around this set, as is the run's observed flag, so a read racing the publication either
/// comes first (the run is never entered) or finds the mark and removes the run.
#[derive(Default)]
pub(crate) struct UnobservedFailures {
    kept: VecDeque<(RunId, RunError)>,
    not_kept: u64,
}

impl UnobservedFailures {
    /// Failures kept with their errors; `close` reports at most this many in full.
    pub(crate) const KEPT: usize = 64;

    /// Enters the failure `error` of `run`, published with nobody having read it yet.
    pub(crate) fn enter(&mut self, run: &RunShared, error: &RunError) {
        if run.was_observed() || run.unobserved() != Unobserved::No {
            return;
        }
        if self.kept.len() < Self::KEPT {
            self.kept.push_back((run.run, error.clone()));
            run.set_unobserved(Unobserved::Kept);
        } else {
            self.not_kept += 1;
            run.set_unobserved(Unobserved::Counted);
        }
    }

    /// Marks `run` observed and takes it out of the set or the count.
    pub(crate) fn observe(&mut self, run: &RunShared) {
        run.mark_observed();
        match run.unobserved() {
            Unobserved::No => return,
            Unobserved::Kept => self.kept.retain(|(id, _)| *id != run.run),
            Unobserved::Counted => self.not_kept = self.not_kept.saturating_sub(1),
        }
        run.set_unobserved(Unobserved::No);
    }

    /// Runs kept with their errors plus runs only counted.
    #[cfg(test)]
    pub(crate) fn len(&self) -> (usize, u64) {
        (self.kept.len(), self.not_kept)
    }
}

/// The public lifecycle of a started worker.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lifecycle {
    /// Accepting work.
    Ready,
    /// Closed (or closing); permanent.
    Closed,
}

/// The close gate of a worker: its result is the result of `close`.
pub(crate) type CloseGate = Gate<Result<(), CloseError>>;

/// An operation lease: `close` waits for every lease before it drains runs.
pub(crate) type Lease<'a> = crate::gate::Lease<'a, Result<(), CloseError>>;

/// Pending runs a drain timeout names.
const DRAIN_TIMEOUT_RUNS: usize = 16;

/// A drain timeout may be retried by a later close; any other result is final.
fn retryable(r: &Result<(), CloseError>) -> bool {
    r.as_ref().is_err_and(CloseError::is_retryable)
}

impl Inner {
    pub(crate) fn lease(&self) -> Result<Lease<'_>, WorkerError> {
        self.gate.lease().ok_or(WorkerError::Closed)
    }

    /// The public lifecycle.
    pub(crate) fn lifecycle(&self) -> Lifecycle {
        if self.gate.is_closed() { Lifecycle::Closed } else { Lifecycle::Ready }
    }

    /// A retryable close error: the drain of `budget` ran out with `in_flight_ops` operations
    /// still holding leases and the accepted runs still pending.
    fn drain_timed_out(&self, in_flight_ops: usize, budget: Duration) -> CloseError {
        let (pending_runs, pending) = {
            let accepted = self.accepted.lock();
            let first = accepted.iter().take(DRAIN_TIMEOUT_RUNS).map(|r| r.run).collect();
            (accepted.len(), first)
        };
        let busy = self.engine().map(|e| e.busy()).unwrap_or_default();
        let d = DrainTimeout { in_flight_ops, pending_runs, pending, busy, budget };
        CloseError { drain_timeout: Some(Box::new(d)), ..CloseError::default() }
    }

    pub(crate) fn close(
        &self,
        deadline: Option<Instant>,
        budget: Duration,
    ) -> Result<(), CloseError> {
        // 1.
        if reentry::is_acting_for(self.instance) {
            return Err(CloseError { reentrant: true, ..CloseError::default() });
        }
        // Keep-alives of runs published by this attempt are dropped when it has ended (after
        // step 7), so one whose drop closes the worker sees the finished attempt.
        let _deferred = deferred_drop::scope();
        // 2. and 3. A claim whose closer unwinds publishes a failed result, so that parked and
        // later closers return instead of waiting for an attempt that will never finish.
        let unwound = || {
            Err(CloseError {
                teardown: vec![TeardownError {
                    path: self.label.clone(),
                    what: TeardownPart::Worker,
                    cause: TeardownCause::Unwound,
                }],
                ..CloseError::default()
            })
        };
        let claim = match self.gate.claim(retryable, unwound, deadline) {
            Ok(claim) => claim,
            Err(Some(result)) => return result,
            // Another closer's attempt outlasted this caller's budget: retryable, as a drain
            // timeout of its own would be.
            Err(None) => return Err(self.drain_timed_out(0, budget)),
        };
        // 4.
        if let Err(in_flight_ops) = claim.drain_leases(deadline) {
            let err = self.drain_timed_out(in_flight_ops, budget);
            claim.finish(Err(err.clone()));
            return Err(err);
        }
        // 5.
        loop {
            let next = self.accepted.lock().front().cloned();
            let Some(run) = next else { break };
            let published = run.wait_until(deadline);
            match published {
                Some(r) => {
                    self.note_published(&run, &r);
                    // Normally the cleanup retired it already; if its retire step failed, the
                    // run would stay at the front and this loop would spin on it.
                    self.retire(&run);
                }
                None => {
                    let err = self.drain_timed_out(0, budget);
                    claim.finish(Err(err.clone()));
                    return Err(err);
                }
            }
        }
        let mut result = CloseError::default();
        let unobserved = std::mem::take(&mut *self.failed_runs.lock());
        result.unobserved_runs = unobserved.kept.into_iter().map(|(_, e)| e).collect();
        result.unobserved_runs_not_kept = unobserved.not_kept;
        // 6.
        self.teardown(&mut result);
        // 7.
        let published = if result.is_empty() { Ok(()) } else { Err(result) };
        claim.finish(published.clone());
        // Each registration is dropped on its own (`deferred_drop`): a closure whose captures
        // panic when dropped must not keep the others' from being dropped.
        let registry = std::mem::take(&mut *self.registry.write());
        let registrations =
            registry.handles.into_values().map(|(_, r)| r).chain(registry.runnable.into_values());
        deferred_drop::drop_logged(
            None,
            registrations.map(|r| Box::new(r) as Box<dyn Any + Send>).collect(),
        );
        published
    }

    fn teardown(&self, result: &mut CloseError) {
        #[cfg(test)]
        self.teardowns.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        #[cfg(test)]
        if self.inject("teardown").is_err() {
            let (what, cause) = (TeardownPart::Worker, TeardownCause::Injected);
            result.teardown.push(TeardownError { path: self.label.clone(), what, cause });
        }
        let residue = match &self.body {
            Body::Chip(lane) => lane.stop(),
            Body::Engine { engine, residue, .. } => {
                if let Err(errors) = engine.shutdown(Instant::now()) {
                    result.teardown.extend(engine_errors(&self.label, errors));
                }
                std::mem::take(&mut *residue.lock())
            }
        };
        for r in residue {
            match r {
                Residue::Leaked(leak) => result.leaked.push(leak),
                Residue::Failed { what, cause } => {
                    result.teardown.push(TeardownError { path: self.label.clone(), what, cause });
                }
            }
        }
    }
}

/// The teardown errors of the engine of the worker at `path`: one per problem its shutdown met.
fn engine_errors(path: &str, errors: ShutdownError) -> impl Iterator<Item = TeardownError> + '_ {
    errors.into_iter().map(move |e| TeardownError {
        path: path.to_owned(),
        what: TeardownPart::Engine,
        cause: TeardownCause::Engine(Arc::new(e)),
    })
}

impl Worker {
    /// Closes the worker: rejects new work, drains every accepted run, tears down once.
    /// Concurrent and repeated closes return the same result.
    pub fn close(&self) -> Result<(), CloseError> {
        self.inner.close(None, Duration::MAX)
    }

    /// As [`close`](Self::close) with a drain budget: past it, `DrainTimeout` (retryable),
    /// nothing torn down, still `Closed`.
    pub fn close_timeout(&self, drain: Duration) -> Result<(), CloseError> {
        // A budget beyond what `Instant` can represent (`Duration::MAX`) means no deadline.
        self.inner.close(Instant::now().checked_add(drain), drain)
    }
}

impl Drop for Worker {
    /// Closes the worker unless a terminal close already happened; errors are logged.
    ///
    /// On a thread acting for this worker (its orchestration callback, a host closure or a
    /// child run) a close here would wait for the very run this thread is part of, and its
    /// teardown would join this thread. The close is handed to a detached reaper thread
    /// instead, which waits for that run like any other closer; nothing joins itself and the
    /// engine threads still end.
    ///
    /// After a bounded close that ran out of budget (`close_timeout` with `DrainTimeout`), a
    /// close here could wait for ever on what outlasted that budget: the drop closes within
    /// that same budget once more, and should that run out too, logs what the close waited for
    /// and hands the close to a detached reaper thread, so that the bound the caller asked for
    /// holds for the drop too.
    fn drop(&mut self) {
        if self.inner.gate.is_finished(retryable) {
            return;
        }
        // First: a close here, bounded or not, would be refused as reentrant.
        if reentry::is_acting_for(self.inner.instance) {
            self.close_detached("dropped inside its own callback");
            return;
        }
        if let Some(Err(e)) = self.inner.gate.last_result(retryable)
            && let Some(budget) = e.drain_timeout.as_ref().map(|d| d.budget)
        {
            match close_caught(&self.inner, Some(budget)) {
                None => {}
                Some(Err(again)) if again.is_retryable() => {
                    tracing::error!(worker = %self.inner.label, "dropped after a close that gave up ({again}); a detached thread closes it once that ends");
                    self.close_detached("dropped after a close that gave up");
                }
                Some(Err(e)) => {
                    tracing::error!(worker = %self.inner.label, "close during drop: {e}");
                }
                Some(Ok(())) => {}
            }
            return;
        }
        close_logged(&self.inner);
    }
}

impl Worker {
    /// Closes the worker on a detached reaper thread; `why` says why in the log should the
    /// thread not start.
    fn close_detached(&self, why: &str) {
        let inner = Arc::clone(&self.inner);
        let spawned = std::thread::Builder::new()
            .name(format!("simpler-reaper-{}", self.inner.instance))
            .spawn(move || close_logged(&inner));
        if let Err(e) = spawned {
            tracing::error!(worker = %self.inner.label, "cannot spawn the thread that closes the worker {why}; its threads stay alive: {e}");
        }
    }
}

/// Closes `inner` within `drain` (`None`: no budget) for a drop, which must not unwind: a panic
/// is logged and gives `None`.
fn close_caught(inner: &Inner, drain: Option<Duration>) -> Option<Result<(), CloseError>> {
    let deadline = drain.and_then(|d| Instant::now().checked_add(d));
    let budget = drain.unwrap_or(Duration::MAX);
    match catch_unwind(AssertUnwindSafe(|| inner.close(deadline, budget))) {
        Ok(result) => Some(result),
        Err(p) => {
            tracing::error!(worker = %inner.label, "close during drop panicked: {}", panic_text(p.as_ref()));
            None
        }
    }
}

/// Closes `inner` without a drain budget, logging any error (run ids included) and any panic.
fn close_logged(inner: &Inner) {
    if let Some(Err(e)) = close_caught(inner, None) {
        let runs: Vec<String> = e.unobserved_runs.iter().map(|r| r.run_id().to_string()).collect();
        tracing::error!(worker = %inner.label, runs = %runs.join(","), "close during drop: {e}");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use simpler_device_a2a3::{Platform, RuntimeVariant};
    use simpler_types::TaskArgs;

    use simpler_sched::{SchedError, ShutdownError};
    use simpler_types::RunId;

    use super::{UnobservedFailures, engine_errors};
    use crate::{
        CallableHandle, CloseError, Orchestration, TeardownCause, TeardownError, TeardownPart,
        Worker,
    };

    fn teardowns(w: &Worker) -> u32 {
        w.inner.teardowns.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs `body` on its own thread and fails the test if it does not finish within a minute,
    /// so a close that hangs is reported instead of stalling the test binary.
    fn bounded<T: Send + 'static>(what: &str, body: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(body());
        });
        match rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(v) => v,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what} hung"),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
        }
    }

    /// Closes `w` from `n` threads at once and returns every result.
    fn close_from_threads(w: &Arc<Worker>, n: usize) -> Vec<Result<(), CloseError>> {
        let start = Arc::new(std::sync::Barrier::new(n));
        let closers: Vec<_> = (0..n)
            .map(|_| {
                let (w, start) = (Arc::clone(w), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    w.close()
                })
            })
            .collect();
        closers.into_iter().map(|c| c.join().expect("closer")).collect()
    }

    /// Each problem the engine's shutdown met is a teardown error of the engine, kept typed.
    #[test]
    fn what_the_engine_shutdown_met_is_an_engine_teardown_error_with_the_sched_error_inside() {
        let run = RunId::FIRST;
        let errors = ShutdownError { errors: vec![SchedError::AbortedAtShutdown { run }] };
        let teardown: Vec<TeardownError> = engine_errors("L3", errors).collect();
        match teardown.as_slice() {
            [
                TeardownError { path, what: TeardownPart::Engine, cause: TeardownCause::Engine(e) },
            ] => {
                assert_eq!(path, "L3");
                assert!(matches!(**e, SchedError::AbortedAtShutdown { run: r } if r == run));
                let source = std::error::Error::source(&teardown[0]).map(ToString::to_string);
                assert_eq!(source, Some(e.to_string()), "the engine's error is the source");
            }
            other => panic!("an aborted run at shutdown gave {other:?}"),
        }
        assert!(teardown[0].to_string().starts_with("L3 / engine: "), "{}", teardown[0]);
    }

    #[test]
    fn double_and_concurrent_closes_share_one_result_from_any_thread() {
        let w = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph)
            .sub_workers(2)
            .start()
            .expect("start");
        // A failing teardown step makes the shared result a value that can be compared.
        w.inject_cleanup_failure("teardown", false);
        let w = Arc::new(w);
        let mut results = close_from_threads(&w, 4);
        results.push(w.close());
        results.push(w.close());
        let e = results[0].as_ref().expect_err("the injected teardown failure");
        assert!(
            matches!(
                e.teardown.as_slice(),
                [TeardownError { what: TeardownPart::Worker, cause: TeardownCause::Injected, .. }]
            ),
            "{e:?}"
        );
        let first = e.to_string();
        for r in &results {
            assert_eq!(r.as_ref().map_err(ToString::to_string), Err(first.clone()));
        }
        assert_eq!(teardowns(&w), 1, "one teardown for {} closes", results.len());
    }

    #[test]
    fn concurrent_closes_observe_one_result_while_runs_are_in_flight() {
        let mut seed = 0x9e37_79b9_u64;
        for _ in 0..6 {
            // xorshift, so that a failing round can be replayed from its seed.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let (tasks, spin, closers) = (1 + seed % 8, (seed >> 8) % 5000, 2 + (seed >> 20) % 3);
            bounded(&format!("seed {seed}: {closers} concurrent closes"), move || {
                let mut b =
                    Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(1);
                let h = b.register_host("spin", |a| {
                    for _ in 0..a.scalar(0).unwrap_or(0) {
                        std::hint::spin_loop();
                    }
                    Ok(())
                });
                let w = Arc::new(b.start().expect("start"));
                let handle = w
                    .submit(Orchestration::graph(move |g, _, _| {
                        for _ in 0..tasks {
                            let mut a = TaskArgs::new();
                            a.add_scalar(spin)?;
                            g.submit_sub(h, a)?;
                        }
                        Ok(())
                    }))
                    .expect("submit");
                let results = close_from_threads(&w, closers as usize);
                assert!(results.iter().all(Result::is_ok), "seed {seed}: {results:?}");
                assert_eq!(teardowns(&w), 1, "seed {seed}: one teardown for {closers} closes");
                assert!(matches!(handle.result(), Some(Ok(()))), "seed {seed}");
            });
        }
    }

    fn failing_worker() -> (Worker, CallableHandle) {
        let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(1);
        let fail = b.register_host("fail", |_| Err("failed on purpose".into()));
        (b.start().expect("start"), fail)
    }

    fn failing_run(fail: CallableHandle) -> Orchestration {
        Orchestration::graph(move |g, _, _| {
            g.submit_sub(fail, TaskArgs::new())?;
            Ok(())
        })
    }

    #[test]
    fn many_failing_runs_with_dropped_handles_keep_the_unobserved_set_bounded() {
        let (w, fail) = failing_worker();
        // Every live run state holds the worker's shared state, so its strong count measures
        // how many runs the worker still holds on to.
        let baseline = Arc::strong_count(&w.inner);
        // The figure is 100 000 runs (about 40 s in a debug build on a loaded machine);
        // CI runs fewer, `SIMPLER_UNOBSERVED_RUNS` sets the number.
        let runs: u64 = std::env::var("SIMPLER_UNOBSERVED_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000)
            .max(UnobservedFailures::KEPT as u64 + 1);
        let mut most_held = 0;
        for i in 0..runs {
            // The next submit publishes this run, unread: it enters the unobserved failures.
            drop(w.submit(failing_run(fail)).expect("submit"));
            if i % 1_000 == 0 {
                most_held = most_held.max(Arc::strong_count(&w.inner) - baseline);
                let (kept, _) = w.inner.failed_runs.lock().len();
                assert!(kept <= UnobservedFailures::KEPT, "{kept} failures kept");
            }
        }
        // Only the run in flight and the one being published at the sample are ever held.
        assert!(most_held <= 2, "{most_held} run states held");
        let e = w.close().expect_err("unobserved failures");
        assert_eq!(e.unobserved_runs.len(), UnobservedFailures::KEPT);
        assert_eq!(e.unobserved_runs_not_kept, runs - UnobservedFailures::KEPT as u64);
        assert_eq!(w.inner.failed_runs.lock().len(), (0, 0));
    }

    #[test]
    fn an_unobserved_failure_read_later_leaves_the_set_and_close_reports_nothing() {
        let (w, fail) = failing_worker();
        let first = w.submit(failing_run(fail)).expect("submit");
        // Fill the kept part, so that the next unread failure is only counted.
        for _ in 1..UnobservedFailures::KEPT {
            drop(w.submit(failing_run(fail)).expect("submit"));
        }
        let counted = w.submit(failing_run(fail)).expect("submit");
        let last = w.submit(failing_run(fail)).expect("submit");
        assert_eq!(w.inner.failed_runs.lock().len(), (UnobservedFailures::KEPT, 1));
        assert!(first.wait().is_err());
        assert!(counted.result().expect("published").is_err());
        assert_eq!(w.inner.failed_runs.lock().len(), (UnobservedFailures::KEPT - 1, 0));
        assert!(last.wait().is_err());
        let e = w.close().expect_err("unobserved failures");
        assert_eq!(e.unobserved_runs.len(), UnobservedFailures::KEPT - 1);
        assert_eq!(e.unobserved_runs_not_kept, 0);
        assert!(e.unobserved_runs.iter().all(|r| r.run_id() != first.run_id()));
    }
}
