//! `Engine`: start, the run API, control jobs, introspection, and the stop-and-drain protocol
//! (`docs/engine-protocols.md` §1, §2, §8).
//!
//! # Stop and drain (`shutdown`; `Drop` calls it with a zero deadline)
//!
//! 1. Set `stopping`: `begin_run`, submits, `alloc` and `scope_begin` return `ShuttingDown`.
//! 2. Wait until every registered run is terminal, or the deadline.
//! 3. For each run still not terminal: record `RunFailure::Aborted { reason: Shutdown }`, mark
//!    it failed and cancel its unstarted tasks. A run whose builder is still live on another
//!    thread keeps its `Building` slots for that builder, whose later close or fail resolves
//!    the fence.
//! 4. Ask the scheduler to stop: it dispatches nothing more, keeps processing completions until
//!    no worker is busy, drains its inbox once more, cancels whatever is still queued, closes
//!    the inbox and exits.
//! 5. Wait for that exit; running members finish on their own (no engine deadline), with a
//!    `warn!` every 10 s naming the busy workers and their tasks. Their completions reclaim
//!    slots and resolve fences, so waiters on other threads get their results.
//! 6. Stop each endpoint thread (its mailbox is drained first: queued control jobs still run) and
//!    join it, then join the scheduler thread. The scheduler is stopped before the workers so
//!    that no dispatch can reach a worker that was already told to stop.
//! 7. `ring.shutdown()`; return the errors gathered on the way (`Drop` logs them).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use simpler_ring::{Ring, RingConfig};
use simpler_types::{
    CancelReason, RunFailure, RunId, RunStatus, TaskId, WorkerId, WorkerRef, WorkerType,
};

use crate::builder::{OrchState, RunBuilder};
use crate::core::{Core, CoreParts};
use crate::endpoint::{Endpoint, EndpointCaps, into_panic_message, quietly};
use crate::endpoint_thread::{JobReceiver, endpoint_thread_main, wrap_job};
use crate::error::{SchedError, ShutdownError};
use crate::graph::GraphScratch;
use crate::inbox::WorkerSlot;
use crate::outcome::{BusyEndpoint, EngineStats, RingPeaks, RunOutcome, RunSummary, TaskSnapshot};
use crate::registry::Registry;
use crate::run_record::{AbortCheck, RunRecord};
use crate::scheduler::scheduler_main;
use crate::sync::{Mutex, Ordering};

/// Everything [`Engine::start`] needs.
pub struct EngineConfig {
    /// Task window and heap rings.
    pub ring: RingConfig,
    /// NEXT_LEVEL endpoints (chips at L3, child workers at L4+), each with a distinct stable id.
    pub next_level: Vec<Box<dyn Endpoint>>,
    /// SUB endpoints (host closures); they get ids 0..m−1 in this order.
    pub sub: Vec<Box<dyn Endpoint>>,
    /// How long a blocked group may hold idle targets with queued singles before a warning.
    pub stall_warn_after: Duration,
    /// Host level: 3 = L3 (NEXT_LEVEL callables are `Chip`), 4 and above = L4+ (`Graph`).
    /// Also the tracing label.
    pub level: u8,
}

impl Default for EngineConfig {
    /// Default rings, no endpoints, a 5 s stall warning, level 3.
    fn default() -> Self {
        EngineConfig {
            ring: RingConfig::default(),
            next_level: Vec::new(),
            sub: Vec::new(),
            stall_warn_after: Duration::from_secs(5),
            level: 3,
        }
    }
}

impl std::fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineConfig")
            .field("ring", &self.ring)
            .field("next_level", &self.next_level.len())
            .field("sub", &self.sub.len())
            .field("stall_warn_after", &self.stall_warn_after)
            .field("level", &self.level)
            .finish()
    }
}

#[derive(Default)]
struct Threads {
    scheduler: Option<JoinHandle<()>>,
    workers: Vec<(String, JoinHandle<()>)>,
    /// Shutdown already ran.
    stopped: bool,
}

/// One host level's engine: run registry, orchestrator, scheduler thread and one endpoint thread
/// per endpoint. `Send + Sync`; every method takes `&self`.
pub struct Engine {
    core: Arc<Core>,
    threads: Mutex<Threads>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("level", &self.core.level)
            .field("next_level", &self.core.next_level.len())
            .field("sub", &self.core.sub.len())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Validates the endpoints, builds the ring, and spawns the scheduler thread and then one
    /// endpoint thread per endpoint (NEXT_LEVEL first, in order).
    ///
    /// Errors: [`SchedError::InvalidLevel`], [`SchedError::EndpointTypeMismatch`],
    /// [`SchedError::DuplicateWorkerId`], [`SchedError::Ring`], [`SchedError::ThreadSpawn`].
    ///
    /// ```
    /// use simpler_sched::{Engine, EngineConfig, RingConfig};
    ///
    /// // No endpoints: runs that submit nothing still complete.
    /// let ring = RingConfig { heap_bytes_per_ring: 1 << 20, ..RingConfig::default() };
    /// let engine = Engine::start(EngineConfig { ring, ..EngineConfig::default() })?;
    /// assert_eq!((engine.sub_count(), engine.next_level_ids().len()), (0, 0));
    /// engine.shutdown(std::time::Instant::now())?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start(config: EngineConfig) -> Result<Engine, SchedError> {
        let EngineConfig { ring, next_level, sub, stall_warn_after, level } = config;
        if level < 3 {
            return Err(SchedError::InvalidLevel { level });
        }
        let mut nl_names: Vec<(WorkerRef, String)> = Vec::with_capacity(next_level.len());
        for caps in caps_of(&next_level, WorkerType::NextLevel)? {
            if nl_names.iter().any(|(w, _)| w.id == caps.id) {
                return Err(SchedError::DuplicateWorkerId { id: caps.id });
            }
            nl_names.push((WorkerRef { ty: WorkerType::NextLevel, id: caps.id }, caps.name));
        }
        let sub_names = caps_of(&sub, WorkerType::Sub)?
            .into_iter()
            .enumerate()
            .map(|(index, caps)| (WorkerRef::sub(index as u32), caps.name))
            .collect();
        let ring = Ring::new(ring).map_err(SchedError::Ring)?;
        let core = Arc::new(Core::new(
            ring,
            CoreParts {
                level,
                next_level: nl_names,
                sub: sub_names,
                stall_warn_after,
                registry: Registry::new(Box::<OrchState>::default()),
            },
        ));
        let engine = Engine { core: Arc::clone(&core), threads: Mutex::new(Threads::default()) };

        let sched_core = Arc::clone(&core);
        let name = format!("simpler-l{level}-sched");
        let handle = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || scheduler_main(sched_core))
            .map_err(|source| SchedError::ThreadSpawn { thread: name, source })?;
        engine.threads.lock().scheduler = Some(handle);

        let endpoints = next_level
            .into_iter()
            .enumerate()
            .map(|(i, ep)| (WorkerSlot::NextLevel(i as u32), ep))
            .chain(sub.into_iter().enumerate().map(|(i, ep)| (WorkerSlot::Sub(i as u32), ep)));
        for (who, ep) in endpoints {
            let worker = core.worker(who).worker;
            let name = match who {
                WorkerSlot::NextLevel(_) => format!("simpler-l{level}-nl{}", worker.id),
                WorkerSlot::Sub(i) => format!("simpler-l{level}-sub{i}"),
            };
            let c = Arc::clone(&core);
            let spawned = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || endpoint_thread_main(c, who, worker, ep));
            match spawned {
                Ok(h) => engine.threads.lock().workers.push((name, h)),
                Err(e) => {
                    // Dropping the engine stops and joins everything started so far.
                    return Err(SchedError::ThreadSpawn { thread: name, source: e });
                }
            }
        }
        Ok(engine)
    }

    pub(crate) fn core(&self) -> &Core {
        &self.core
    }

    /// Begins a run, waiting (without limit) until every earlier run is terminal.
    ///
    /// Errors: [`SchedError::AnotherRunBuilding`] (at once), [`SchedError::ShuttingDown`],
    /// [`SchedError::EnginePoisoned`], [`SchedError::RunIdsExhausted`].
    ///
    /// ```
    /// use simpler_sched::{Engine, EngineConfig, SchedError};
    ///
    /// let engine = Engine::start(EngineConfig::default())?;
    /// let mut run = engine.begin_run()?;
    /// // One run builds at a time: a second begin fails at once instead of waiting on us.
    /// assert!(matches!(engine.begin_run(), Err(SchedError::AnotherRunBuilding { .. })));
    /// run.scope(|run| run.alloc(&[16], simpler_sched::DataType::Float32).map(drop))??;
    /// let id = run.close();
    /// assert!(engine.wait(id)?.is_completed());
    /// println!("{}", engine.release(id)?);
    /// # Ok::<(), SchedError>(())
    /// ```
    pub fn begin_run(&self) -> Result<RunBuilder<'_>, SchedError> {
        self.begin(None)
    }

    /// As [`begin_run`](Self::begin_run), giving up at `deadline` with
    /// [`SchedError::AdmissionTimeout`].
    pub fn begin_run_until(&self, deadline: Instant) -> Result<RunBuilder<'_>, SchedError> {
        self.begin(Some(deadline))
    }

    fn begin(&self, deadline: Option<Instant>) -> Result<RunBuilder<'_>, SchedError> {
        let core = &self.core;
        let level = core.level;
        let admitted = core
            .registry
            .admit(deadline, |id| tracing::info_span!("run", run.id = id.get(), level))?;
        if let Some(previous) = &admitted.previous {
            self.capture_peaks(previous);
        }
        core.ring.reset_peaks();
        // Relaxed: a statistic.
        core.counters.runs_begun.fetch_add(1, Ordering::Relaxed);
        // quietly: the run is admitted and marked building, and only its builder clears the
        // mark; a logging layer that panics here would leave it set for good.
        quietly(
            || tracing::debug!(parent: &admitted.run.span, run = %admitted.run.id, "run begun"),
        );
        Ok(RunBuilder::new(self, admitted.run, admitted.orch))
    }

    /// Stores the ring's current peaks into `run` unless it already has them (they are reset
    /// when the next run is admitted, so they are captured at that point or at release).
    fn capture_peaks(&self, run: &RunRecord) {
        if run.lock().peaks.is_some() {
            return;
        }
        let peaks = RingPeaks::from_stats(&self.core.ring.stats());
        let mut c = run.lock();
        if c.peaks.is_none() {
            c.peaks = Some(peaks);
        }
    }

    /// Blocks until `run` is terminal and returns its outcome (the same `Arc` for every waiter).
    ///
    /// A run that is still being built is refused with [`SchedError::NotClosed`] rather than
    /// waited for: the caller may well be the thread that holds its builder, which would then
    /// wait for itself forever. To wait for a run another thread is building, poll
    /// [`wait_timeout`](Self::wait_timeout).
    ///
    /// Errors: [`SchedError::UnknownRun`], [`SchedError::NotClosed`].
    ///
    /// ```
    /// use simpler_sched::{Engine, EngineConfig, SchedError};
    ///
    /// let engine = Engine::start(EngineConfig::default())?;
    /// let run = engine.begin_run()?;
    /// let id = run.id();
    /// // Still building: waiting now could only wait for this thread's own builder.
    /// assert!(matches!(engine.wait(id), Err(SchedError::NotClosed { .. })));
    /// run.close();
    /// assert!(engine.wait(id)?.is_completed());
    /// # Ok::<(), SchedError>(())
    /// ```
    pub fn wait(&self, run: RunId) -> Result<RunOutcome, SchedError> {
        let record = self.core.registry.find(run)?;
        if !record.is_terminal() && !record.lock().closed() {
            return Err(SchedError::NotClosed { run, op: "wait" });
        }
        record
            .wait_until(None)
            .ok_or_else(|| SchedError::Internal { message: format!("{run}: wait returned early") })
    }

    /// As [`wait`](Self::wait) with a time limit: `Ok(None)` on timeout (nothing changes; call
    /// again). A zero timeout polls; a timeout beyond the clock's range waits without limit.
    pub fn wait_timeout(
        &self,
        run: RunId,
        timeout: Duration,
    ) -> Result<Option<RunOutcome>, SchedError> {
        let record = self.core.registry.find(run)?;
        if timeout.is_zero() {
            return Ok(record.outcome());
        }
        // `None` (no deadline) when the sum leaves the clock's range: such a limit is never
        // reached anyway.
        Ok(record.wait_until(Instant::now().checked_add(timeout)))
    }

    /// Whether `run` is terminal. Released ids are unknown.
    pub fn is_done(&self, run: RunId) -> Result<bool, SchedError> {
        Ok(self.core.registry.find(run)?.is_terminal())
    }

    /// A snapshot of `run`'s status.
    pub fn status(&self, run: RunId) -> Result<RunStatus, SchedError> {
        let record = self.core.registry.find(run)?;
        Ok(status_of(&record))
    }

    /// Removes a terminal run from the registry and returns its summary. Erases any tensor-map
    /// entries the run left (a safety net; warns if there were any) and, when no run remains
    /// and no slot is live, rewinds the ring.
    ///
    /// Errors: [`SchedError::UnknownRun`], [`SchedError::NotTerminal`].
    pub fn release(&self, run: RunId) -> Result<RunSummary, SchedError> {
        let core = &self.core;
        // The peaks are captured while the run is still registered: once it is removed, a
        // `begin_run` on another thread no longer sees it as the previous run and resets the
        // ring's peaks without capturing them. A run that is not terminal yet keeps using the
        // ring, so its peaks are left for later (`remove_terminal` then refuses it anyway).
        let registered = core.registry.find(run)?;
        if registered.is_terminal() {
            self.capture_peaks(&registered);
        }
        drop(registered);
        let (record, now_empty) = core.registry.remove_terminal(run)?;
        let left = core.tensor_map.erase_run(run);
        if left > 0 {
            quietly(
                || tracing::warn!(%run, entries = left, "released run still had tensor-map entries"),
            );
        }
        let (tasks, peaks) = {
            let c = record.lock();
            (c.task_slots.len() as u32, c.peaks.unwrap_or_default())
        };
        let (failed, cancelled) = record.failure_counts();
        let outcome = record.outcome().unwrap_or_else(|| {
            RunOutcome::Failed(Arc::new(RunFailure::Internal {
                run,
                message: "terminal run without an outcome".to_owned(),
            }))
        });
        if now_empty {
            // The rewind also zeroes the ring's peaks, so it runs under the registry lock and
            // only while no run is registered: a run admitted after the removal above may
            // already have allocated and reclaimed its slots, which `NotQuiescent` would not
            // catch, and rewinding then would lose that run's peaks. Lock order: the ring's
            // locks are leaves, taken under the registry lock by nothing else that waits.
            core.registry.while_empty(|| {
                if core.ring.stats().window.live == 0 {
                    // Fails harmlessly with `NotQuiescent` if a slot is live after all.
                    let _ = core.ring.reset_to_empty();
                }
            });
        }
        quietly(|| tracing::debug!(%run, tasks, failed, cancelled, "run released"));
        Ok(RunSummary { id: run, outcome, tasks, failed, cancelled, peaks })
    }

    /// Aborts a closed, non-terminal run: records `RunFailure::Aborted { reason }`, cancels its
    /// unstarted tasks (running ones finish) and checks the fence. `Ok(false)` for a run that
    /// is already terminal.
    ///
    /// Errors: [`SchedError::UnknownRun`], [`SchedError::NotClosed`] (fail a building run
    /// through its builder).
    pub fn abort_run(&self, run: RunId, reason: CancelReason) -> Result<bool, SchedError> {
        let record = self.core.registry.find(run)?;
        match self.abort(&record, reason, true) {
            AbortCheck::Terminal => Ok(false),
            AbortCheck::NotClosed => Err(SchedError::NotClosed { run, op: "abort_run" }),
            AbortCheck::Marked => Ok(true),
        }
    }

    /// Fails `record` with `RunFailure::Aborted { reason }` unless it is terminal (or, with
    /// `require_closed`, still building), then cancels its unstarted tasks and checks the fence.
    fn abort(&self, record: &RunRecord, reason: CancelReason, require_closed: bool) -> AbortCheck {
        let failure = RunFailure::Aborted { run: record.id, reason };
        let check = record.mark_aborted(failure, require_closed);
        if check == AbortCheck::Marked {
            // quietly: the run is marked failed; its unstarted tasks must still be cancelled.
            quietly(|| tracing::debug!(run = %record.id, %reason, "aborting run"));
            self.core.cancel_run(record, reason, false, &mut GraphScratch::default());
            record.check_fence();
        }
        check
    }

    /// Runs `job` on `worker`'s thread, in FIFO order with its tasks (never concurrently with
    /// one), and returns a receiver for its result. A job must not touch engine state.
    ///
    /// Errors: [`SchedError::UnknownEndpoint`], [`SchedError::ShuttingDown`] once the worker
    /// has stopped.
    pub fn on_endpoint<R: Send + 'static>(
        &self,
        worker: WorkerRef,
        job: impl FnOnce(&mut dyn Endpoint) -> R + Send + 'static,
    ) -> Result<JobReceiver<R>, SchedError> {
        let who = self.core.find_worker(worker).ok_or(SchedError::UnknownEndpoint { worker })?;
        let (job, rx) = wrap_job(job);
        self.core.mailbox(who).send_job(job).map_err(|_| SchedError::ShuttingDown)?;
        Ok(JobReceiver::new(rx, worker))
    }

    /// Introspection of one task of a registered run: state, counts, edges and failure.
    /// `None` for an unknown or released run or an unknown sequence number.
    pub fn task_snapshot(&self, task: TaskId) -> Option<TaskSnapshot> {
        let record = self.core.registry.find(task.run).ok()?;
        let id = *record.lock().task_slots.get(task.seq as usize)?;
        Some(match self.core.ring.slot(id) {
            Some(slot) => slot.snapshot(id, task),
            None => TaskSnapshot::consumed(task),
        })
    }

    /// Engine counters and a ring snapshot.
    pub fn stats(&self) -> EngineStats {
        let c = &self.core.counters;
        // Relaxed throughout: statistics.
        EngineStats {
            level: self.core.level,
            scheduler_iterations: c.iterations.load(Ordering::Relaxed),
            dispatched: c.dispatched.load(Ordering::Relaxed),
            completions: c.completions.load(Ordering::Relaxed),
            reclaimed: c.reclaimed.load(Ordering::Relaxed),
            runs_begun: c.runs_begun.load(Ordering::Relaxed),
            queued_next_level: self
                .core
                .next_level
                .iter()
                .map(|w| w.queued.load(Ordering::Relaxed))
                .collect(),
            queued_groups: c.queued_groups.load(Ordering::Relaxed),
            queued_sub: c.queued_sub.load(Ordering::Relaxed),
            ring: self.core.ring.stats(),
        }
    }

    /// Stable ids of the NEXT_LEVEL workers, in registration order.
    pub fn next_level_ids(&self) -> Vec<WorkerId> {
        self.core.next_level.iter().map(|w| w.worker.id).collect()
    }

    /// Number of SUB workers.
    pub fn sub_count(&self) -> usize {
        self.core.sub.len()
    }

    /// Whether the engine was poisoned by an internal error.
    pub fn is_poisoned(&self) -> bool {
        self.core.registry.is_poisoned()
    }

    /// Stops the engine (module docs, steps 1–7). Idempotent: later calls return `Ok(())`.
    /// Runs still unfinished at `deadline` are aborted; running members are always waited for.
    pub fn shutdown(&self, deadline: Instant) -> Result<(), ShutdownError> {
        let mut threads = self.threads.lock();
        if threads.stopped {
            return Ok(());
        }
        threads.stopped = true;
        let core = &self.core;
        let mut errors = Vec::new();
        // quietly: the engine is marked stopped, so a later call would not stop it again.
        quietly(|| tracing::debug!(level = core.level, "engine shutting down"));

        // 1.
        // Release pairs with the Acquire in `Core::is_stopping`.
        core.stopping.store(true, Ordering::Release);
        core.registry.set_stopping();
        // 2. A run still being built is waited for too, until the deadline: its builder, on
        // another thread, may still close it (one on this thread cannot, so its run is only
        // aborted at step 3).
        for run in core.registry.runs() {
            let _ = run.wait_until(Some(deadline));
        }
        // 3.
        for run in core.registry.runs() {
            if self.abort(&run, CancelReason::Shutdown, false) == AbortCheck::Marked {
                errors.push(SchedError::AbortedAtShutdown { run: run.id });
            }
        }
        // 4.–5.
        core.request_stop();
        if threads.scheduler.is_some() {
            while !core.scheduler_exit.wait(Some(Instant::now() + Duration::from_secs(10)), false) {
                self.warn_busy();
            }
        }
        // 6.
        for w in core.next_level.iter().chain(&core.sub) {
            w.mailbox.stop();
        }
        for (name, h) in threads.workers.drain(..) {
            if let Err(p) = h.join() {
                errors.push(SchedError::ThreadPanicked {
                    thread: name,
                    message: into_panic_message(p),
                });
            }
        }
        if let Some(Err(p)) = threads.scheduler.take().map(JoinHandle::join) {
            errors.push(SchedError::ThreadPanicked {
                thread: format!("simpler-l{}-sched", core.level),
                message: into_panic_message(p),
            });
        }
        // 7.
        core.ring.shutdown();
        if errors.is_empty() { Ok(()) } else { Err(ShutdownError { errors }) }
    }

    #[cold]
    fn warn_busy(&self) {
        let busy: Vec<String> = self.busy().iter().map(ToString::to_string).collect();
        quietly(|| {
            tracing::warn!(
                level = self.core.level,
                "shutdown waiting for running tasks: {}",
                busy.join("; ")
            )
        });
    }

    /// The endpoints running a task now, next-level workers first (a diagnostic snapshot:
    /// each endpoint is read once, with no lock across them).
    pub fn busy(&self) -> Vec<BusyEndpoint> {
        let endpoints = self.core.next_level.iter().chain(&self.core.sub);
        endpoints
            .filter_map(|w| {
                let slot = w.mailbox.busy_with()?;
                Some(BusyEndpoint {
                    worker: w.worker,
                    name: w.name.clone(),
                    task: self.core.task_of(slot),
                })
            })
            .collect()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown(Instant::now()) {
            for e in e.errors {
                quietly(|| tracing::warn!(level = self.core.level, "engine drop: {e}"));
            }
        }
    }
}

/// Every endpoint's capabilities, refusing one whose type is not the list's.
fn caps_of(
    list: &[Box<dyn Endpoint>],
    listed: WorkerType,
) -> Result<Vec<EndpointCaps>, SchedError> {
    list.iter()
        .enumerate()
        .map(|(index, ep)| {
            let caps = ep.caps();
            if caps.worker_type == listed {
                Ok(caps)
            } else {
                Err(SchedError::EndpointTypeMismatch { index, listed, reported: caps.worker_type })
            }
        })
        .collect()
}

/// The status snapshot of a run.
pub(crate) fn status_of(run: &RunRecord) -> RunStatus {
    let c = run.lock();
    RunStatus {
        id: run.id,
        phase: run.phase(),
        submission_closed: c.closed(),
        submission_failed: c.failed(),
        tasks_submitted: c.task_slots.len() as u32,
        tasks_active: run.active(),
        failure: c.first_failure().cloned(),
    }
}
