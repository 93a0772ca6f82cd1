//! Executes run plans against an engine and checks every run, and finally the engine, against
//! the reference model.
//!
//! Per run (after its fence):
//! 1. Every submit the model calls invalid is refused with exactly the predicted error; every
//!    valid one is accepted with the next sequence number, or refused with `RunFailed` carrying
//!    a planned failure of this run, after which nothing more is accepted (fail-fast).
//! 2. The fence fires within [`PATIENCE`]; every wait gets the same `Arc`; the status shows no
//!    active slot.
//! 3. Each member ran at most once, on its own target (distinct SUB endpoints for a SUB group),
//!    with the arguments it was given; a group ran all members or none.
//! 4. No task started before every earlier task it conflicts with (model: `ordered_after`, which
//!    includes every earlier reader of bytes it writes) finished, and none ran after such a task
//!    failed or did not run.
//! 5. A closed run that nobody failed or aborted ran every task not downstream of a planned
//!    failure; its outcome is `Completed` exactly when no task failed, else the failure of a
//!    task that was planned to fail. Failed, aborted or dropped submissions end `Failed` with
//!    their cause or an earlier task failure.
//! 6. The release summary counts every charge, and failed + cancelled tasks are exactly the
//!    tasks that did not succeed.
//! 7. After release the run is unknown; the tensor map held nothing of it (no safety-net erase
//!    warning); with the engine to itself, no slot is live and every heap ring is rewound.
//!
//! Per engine (after shutdown): counters match the log, every charge was reclaimed, every
//! endpoint started, stopped and was dropped, and no engine thread is left.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use simpler_sched::{Engine, RunBuilder, RunOutcome, RunSummary, SchedError};
use simpler_types::{
    CallConfig, CancelReason, DataType, FailureMechanism, RunFailure, RunId, TaskFailure, TaskId,
    TaskState, WorkerId, WorkerRef, WorkerType,
};

use super::endpoint::{Record, Recorder};
use super::env::{PATIENCE, WarningCapture, engine_threads_alive};
use super::model::{RunModel, next_level_callable, sub_callable};
use super::plan::{
    Action, DROP_CAUSE, EngineShape, FAIL_CAUSE, Op, RunEnd, RunPlan, TaskKind, failure_message,
};

/// What one executed run contributed, for the engine-level checks and coverage figures.
#[derive(Clone, Copy, Debug)]
pub struct RunReport {
    /// The run's id.
    pub run: RunId,
    /// Tasks and allocs charged to it.
    pub charges: u32,
    /// Tasks accepted.
    pub tasks: u32,
    /// Edges to producers in the model.
    pub edges: u32,
    /// Submits refused by validation, as predicted.
    pub rejected: u32,
    /// Ops refused by fail-fast.
    pub refused: u32,
    /// Tasks whose members all ran.
    pub ran: u32,
    /// Tasks that ran and failed.
    pub failed: u32,
    /// Tasks that ran on the output of a producer that failed while they were submitted
    /// (see `check_order`).
    pub late: u32,
    /// Tasks cancelled (release summary).
    pub cancelled: u32,
    /// How the run ended.
    pub end: RunEnd,
    /// Whether `abort_run` or shutdown aborted the run.
    pub aborted: bool,
    /// Whether the run ended `Completed`.
    pub completed: bool,
    /// The task-window peak of the release summary.
    pub window_peak: u32,
}

/// Sums of [`RunReport`]s, to show (and assert) what a test exercised.
#[derive(Clone, Copy, Debug, Default)]
pub struct Coverage {
    /// Runs.
    pub runs: u32,
    /// Tasks accepted.
    pub tasks: u32,
    /// Producer edges.
    pub edges: u32,
    /// Validation refusals.
    pub rejected: u32,
    /// Fail-fast refusals.
    pub refused: u32,
    /// Tasks run.
    pub ran: u32,
    /// Tasks failed by their endpoint.
    pub failed: u32,
    /// Late consumers of failed producers (see `check_order`).
    pub late: u32,
    /// Tasks cancelled.
    pub cancelled: u32,
    /// Runs that ended `Failed`.
    pub failed_runs: u32,
    /// Runs aborted by `abort_run` or shutdown.
    pub aborted_runs: u32,
    /// Runs whose builder was dropped.
    pub dropped_runs: u32,
}

impl Coverage {
    /// Adds one run.
    pub fn add(&mut self, r: &RunReport) {
        self.runs += 1;
        self.tasks += r.tasks;
        self.edges += r.edges;
        self.rejected += r.rejected;
        self.refused += r.refused;
        self.ran += r.ran;
        self.failed += r.failed;
        self.late += r.late;
        self.cancelled += r.cancelled;
        self.failed_runs += u32::from(!r.completed);
        self.aborted_runs += u32::from(r.aborted);
        self.dropped_runs += u32::from(r.end == RunEnd::DropBuilder);
    }
}

/// Runs plans on one engine.
pub struct Driver<'e> {
    /// The engine.
    pub engine: &'e Engine,
    /// Its endpoints.
    pub shape: &'e EngineShape,
    /// Its level.
    pub level: u8,
    /// The endpoints' log.
    pub recorder: &'e Arc<Recorder>,
    /// Whether no other thread uses the engine (enables the ring checks after release).
    pub exclusive: bool,
}

/// The state of the run being built, besides the model.
struct Build {
    run: RunId,
    model: RunModel,
    /// The failure of the first `RunFailed` refusal, if any.
    refused: Option<Arc<RunFailure>>,
    /// Validation refusals so far.
    rejections: u32,
    /// Fail-fast refusals so far.
    refusals: u32,
}

/// Everything the endpoints did for one run.
struct Execution {
    /// Per task that ran (all members): earliest start and latest end stamp.
    ran: BTreeMap<u32, (u64, u64)>,
    /// Tasks that ran and had a failing member.
    roots: BTreeSet<u32>,
}

impl Driver<'_> {
    /// Executes `plan` as one run and checks it (module docs, per-run list).
    pub fn run(&self, plan: &RunPlan) -> Result<RunReport, String> {
        let warnings = WarningCapture::default();
        let _capture = warnings.install();
        let mut b = self.begin()?;
        if plan.gated {
            // Only after admission: every earlier run is terminal now, so the gate holds this
            // run's members alone.
            self.recorder.hold();
        }
        let mut build = Build {
            run: b.id(),
            model: RunModel::default(),
            refused: None,
            rejections: 0,
            refusals: 0,
        };
        let run = build.run;
        for (i, op) in plan.ops.iter().enumerate() {
            self.step(&mut b, &mut build, i, op)
                .map_err(|e| format!("{run}, op {i} {op:?}: {e}"))?;
        }
        if plan.gated {
            let edges = check_edges(self.engine, &build);
            self.recorder.release();
            edges.map_err(|e| format!("{run}: {e}"))?;
        }
        let open_scopes = build.model.user_scopes();
        let mut aborted = false;
        match plan.end {
            RunEnd::Close => {
                b.close();
            }
            RunEnd::Fail => {
                b.fail(FAIL_CAUSE);
            }
            RunEnd::DropBuilder => drop(b),
            RunEnd::Abort => {
                b.close();
                aborted = self
                    .engine
                    .abort_run(run, CancelReason::RunAborted)
                    .map_err(|e| format!("{run}: abort_run of a closed run: {e}"))?;
            }
            RunEnd::Shutdown => {
                b.close();
                match self.engine.shutdown(Instant::now()) {
                    Ok(()) => {}
                    Err(e) => match e.errors.as_slice() {
                        [SchedError::AbortedAtShutdown { run: r }] if *r == run => aborted = true,
                        errors => return Err(format!("{run}: shutdown reported {errors:?}")),
                    },
                }
                // Shutdown waits for running members and cancels the rest, so the run must be
                // terminal by now.
                if !self.engine.is_done(run).map_err(|e| format!("{run}: {e}"))? {
                    return Err(format!("{run} is not terminal after shutdown returned"));
                }
            }
        }
        let outcome = self.wait(run, build.model.next_seq)?;
        let records = self.recorder.records_of(run);
        let exec =
            check_records(&build.model, &records, self.shape).map_err(|e| format!("{run}: {e}"))?;
        let late = check_order(&build.model, &exec).map_err(|e| format!("{run}: {e}"))?;
        let completes = match plan.end {
            RunEnd::Close => true,
            RunEnd::Abort | RunEnd::Shutdown => !aborted,
            RunEnd::Fail | RunEnd::DropBuilder => false,
        };
        let cause = match plan.end {
            RunEnd::Fail => Some(RunFailure::Submission { run, message: FAIL_CAUSE.to_owned() }),
            RunEnd::DropBuilder => {
                Some(RunFailure::Submission { run, message: DROP_CAUSE.to_owned() })
            }
            RunEnd::Abort if aborted => {
                Some(RunFailure::Aborted { run, reason: CancelReason::RunAborted })
            }
            RunEnd::Shutdown if aborted => {
                Some(RunFailure::Aborted { run, reason: CancelReason::Shutdown })
            }
            _ => None,
        };
        check_outcome(&build, &exec, completes, cause.as_ref(), &outcome)
            .map_err(|e| format!("{run}: {e}"))?;
        let summary = self.release(run, &build, &outcome)?;
        check_summary(&build.model, &exec, completes, self.exclusive, &summary)
            .map_err(|e| format!("{run}: {e}; summary {summary:?}"))?;
        let warned = warnings.take();
        if let Some(w) = warned.iter().find(|w| w.field("entries").is_some()) {
            return Err(format!("{run}: the tensor map still held entries at release: {w:?}"));
        }
        let closed_normally = matches!(plan.end, RunEnd::Close | RunEnd::Abort | RunEnd::Shutdown);
        let run_text = run.to_string();
        if closed_normally
            && open_scopes > 0
            && !warned.iter().any(|w| w.field("run") == Some(run_text.as_str()))
        {
            return Err(format!("{run}: close with {open_scopes} open scopes did not warn"));
        }
        let model = &build.model;
        Ok(RunReport {
            run,
            charges: model.next_seq,
            tasks: model.tasks.len() as u32,
            edges: model.tasks.values().map(|t| t.producers.len() as u32).sum(),
            rejected: build.rejections,
            refused: build.refusals,
            ran: exec.ran.len() as u32,
            failed: exec.roots.len() as u32,
            late: late.len() as u32,
            cancelled: summary.cancelled,
            end: plan.end,
            aborted,
            completed: outcome.is_completed(),
            window_peak: summary.peaks.window_peak,
        })
    }

    /// Admission. Without the engine to itself, another thread's builder may be live: retry.
    fn begin(&self) -> Result<RunBuilder<'_>, String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.engine.begin_run_until(deadline) {
                Ok(b) => return Ok(b),
                Err(SchedError::AnotherRunBuilding { .. })
                    if !self.exclusive && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_micros(50));
                }
                Err(e) => return Err(format!("begin_run: {e}")),
            }
        }
    }

    /// One op, checked against the model's prediction (module docs, item 1).
    fn step(&self, b: &mut RunBuilder<'_>, s: &mut Build, i: usize, op: &Op) -> Result<(), String> {
        match op {
            Op::Submit(plan) => {
                let prepared = s.model.prepare(i, plan, self.shape);
                let result = self.submit(b, plan.kind, prepared.args.clone(), &prepared.targets);
                match (&prepared.rejection, result) {
                    (Some(r), Err(e)) if r.matches(&e) => {
                        s.rejections += 1;
                        Ok(())
                    }
                    (Some(r), other) => Err(format!("expected {r:?}, got {other:?}")),
                    (None, Ok(task)) => {
                        s.accepted(task)?;
                        s.model.accept(i, plan, &prepared);
                        Ok(())
                    }
                    (None, Err(SchedError::RunFailed(f))) => s.refusal(f, self.shape),
                    (None, Err(e)) => Err(format!("unexpected error {e:?}")),
                }
            }
            Op::Alloc { bytes } => match b.alloc(&[*bytes], DataType::UInt8) {
                Ok(t) if *bytes == 0 => {
                    s.not_refused("a null alloc")?;
                    if t.is_null() { Ok(()) } else { Err(format!("zero-byte alloc gave {t:?}")) }
                }
                Ok(t) => {
                    s.accepted(TaskId::new(s.run, s.model.next_seq))?;
                    if t.addr == 0 || t.addr % 1024 != 0 || t.nbytes() != u64::from(*bytes) {
                        return Err(format!("alloc of {bytes} bytes gave {t:?}"));
                    }
                    s.model.accept_alloc(t.addr, *bytes);
                    Ok(())
                }
                Err(SchedError::RunFailed(f)) => s.refusal(f, self.shape),
                Err(e) => Err(format!("unexpected error {e:?}")),
            },
            Op::ScopeBegin => match b.scope_begin() {
                Ok(()) if s.model.user_scopes() < 63 => {
                    s.not_refused("a scope")?;
                    s.model.scope_begin();
                    Ok(())
                }
                Err(SchedError::ScopeDepthExceeded { max: 64 }) if s.model.user_scopes() == 63 => {
                    Ok(())
                }
                Err(SchedError::RunFailed(f)) => s.refusal(f, self.shape),
                other => Err(format!("with {} user scopes open: {other:?}", s.model.user_scopes())),
            },
            Op::Pause { us } => {
                std::thread::sleep(Duration::from_micros(u64::from(*us)));
                Ok(())
            }
            Op::ScopeEnd => match (b.scope_end(), s.model.user_scopes()) {
                (Err(SchedError::ScopeUnderflow), 0) => Ok(()),
                (Ok(()), n) if n > 0 => {
                    s.model.scope_end(i);
                    Ok(())
                }
                (other, n) => Err(format!("scope_end with {n} user scopes open: {other:?}")),
            },
        }
    }

    fn submit(
        &self,
        b: &mut RunBuilder<'_>,
        kind: TaskKind,
        mut args: Vec<simpler_types::TaskArgs>,
        targets: &[u32],
    ) -> Result<TaskId, SchedError> {
        let cfg = CallConfig::default();
        let ids: Vec<WorkerId> = targets.iter().map(|&t| WorkerId(t)).collect();
        match kind {
            TaskKind::NextLevel { .. } if args.len() == 1 => {
                let a = args.pop().expect("one member");
                b.submit_next_level(&next_level_callable(self.level), a, &cfg, ids[0], None)
            }
            TaskKind::NextLevel { .. } => {
                b.submit_next_level_group(&next_level_callable(self.level), args, &cfg, &ids, None)
            }
            TaskKind::Sub if args.len() == 1 => {
                b.submit_sub(&sub_callable(), args.pop().expect("one member"))
            }
            TaskKind::Sub => b.submit_sub_group(&sub_callable(), args),
        }
    }

    /// Waits for the fence; a second wait must return the same `Arc`.
    fn wait(&self, run: RunId, charges: u32) -> Result<RunOutcome, String> {
        let outcome = self
            .engine
            .wait_timeout(run, PATIENCE)
            .map_err(|e| format!("{run}: wait: {e}"))?
            .ok_or_else(|| self.hang_report(run, charges))?;
        let again = self.engine.wait(run).map_err(|e| format!("{run}: second wait: {e}"))?;
        if let (RunOutcome::Failed(a), RunOutcome::Failed(b)) = (&outcome, &again)
            && !Arc::ptr_eq(a, b)
        {
            return Err(format!("{run}: two waits returned different failure Arcs"));
        }
        if outcome != again {
            return Err(format!("{run}: two waits disagree: {outcome:?} then {again:?}"));
        }
        Ok(outcome)
    }

    /// Everything the engine says about a run whose fence did not fire.
    fn hang_report(&self, run: RunId, charges: u32) -> String {
        let mut text = format!("{run}: the fence did not fire within {PATIENCE:?}\n");
        text +=
            &format!("status: {:?}\nstats: {:?}\n", self.engine.status(run), self.engine.stats());
        for r in self.recorder.records_of(run) {
            text += &format!(
                "ran: {} member {} on {} [{}, {}]\n",
                r.task, r.member, r.worker, r.start, r.end
            );
        }
        for seq in 0..charges {
            match self.engine.task_snapshot(TaskId::new(run, seq)) {
                Some(s) if s.state == simpler_types::TaskState::Consumed => {}
                other => text += &format!("task {seq}: {other:?}\n"),
            }
        }
        text
    }

    /// Status at the fence, release, and the state left behind (module docs, items 2 and 7).
    fn release(
        &self,
        run: RunId,
        build: &Build,
        outcome: &RunOutcome,
    ) -> Result<RunSummary, String> {
        let e = self.engine;
        let status = e.status(run).map_err(|err| format!("{run}: status: {err}"))?;
        if !status.phase.is_terminal()
            || !status.submission_closed
            || status.tasks_active != 0
            || status.tasks_submitted != build.model.next_seq
            || status.failure.as_ref() != outcome.failure()
        {
            return Err(format!("{run}: status at the fence {status:?} (outcome {outcome:?})"));
        }
        let summary = e.release(run).map_err(|err| format!("{run}: release: {err}"))?;
        match e.release(run) {
            Err(SchedError::UnknownRun { run: r }) if r == run => {}
            other => return Err(format!("{run}: second release gave {other:?}")),
        }
        if !matches!(e.is_done(run), Err(SchedError::UnknownRun { .. })) {
            return Err(format!("{run}: a released run is still known"));
        }
        if summary.id != run || &summary.outcome != outcome {
            return Err(format!("{run}: summary {summary:?} for outcome {outcome:?}"));
        }
        if self.exclusive {
            let ring = e.stats().ring;
            let heaps_rewound = ring.heaps.iter().all(|h| {
                h.live_bytes == 0
                    && h.live_allocs == 0
                    && h.top == 0
                    && h.tail == 0
                    && h.occupied_bytes == 0
            });
            if ring.window.live != 0 || !heaps_rewound {
                return Err(format!("{run}: after release the ring is not empty: {ring:?}"));
            }
        }
        Ok(summary)
    }
}

impl Build {
    /// An accepted charge must carry the next sequence number, and nothing may be accepted
    /// after a fail-fast refusal.
    fn accepted(&self, task: TaskId) -> Result<(), String> {
        self.not_refused(&format!("{task}"))?;
        let expected = TaskId::new(self.run, self.model.next_seq);
        if task != expected {
            Err(format!("accepted as {task}, expected {expected}"))
        } else {
            Ok(())
        }
    }

    fn not_refused(&self, what: &str) -> Result<(), String> {
        match &self.refused {
            Some(f) => Err(format!("accepted {what} after the run refused submits with {f}")),
            None => Ok(()),
        }
    }

    /// A fail-fast refusal must carry a planned failure of this run, the same one every time.
    fn refusal(&mut self, f: Arc<RunFailure>, shape: &EngineShape) -> Result<(), String> {
        self.refusals += 1;
        let RunFailure::Task(tf) = &*f else {
            return Err(format!("refused with a failure no task caused: {f}"));
        };
        check_root(&self.model, self.run, tf, shape)?;
        match &self.refused {
            Some(first) if **first != *f => {
                Err(format!("refused first with {first}, later with {f}"))
            }
            Some(_) => Ok(()),
            None => {
                self.refused = Some(f);
                Ok(())
            }
        }
    }
}

/// Checks that `tf` is the failure a planned failing member produces; returns the task's seq.
fn check_root(
    model: &RunModel,
    run: RunId,
    tf: &TaskFailure,
    shape: &EngineShape,
) -> Result<u32, String> {
    let bad = |why: &str| Err(format!("failure {tf:?}: {why}"));
    if tf.task.run != run {
        return bad("names another run");
    }
    let Some(task) = model.tasks.get(&tf.task.seq) else {
        return bad("names no accepted task");
    };
    let n = task.plan.members.len();
    let member = tf.member.unwrap_or(0) as usize;
    if (n > 1) != tf.member.is_some() || member >= n {
        return bad("member index does not fit the task");
    }
    let action = task.plan.members[member].action;
    let message = failure_message(task.plan_index as u64, member as u32);
    let (mechanism, text) = match action {
        Action::Succeed => return bad("the member was planned to succeed"),
        Action::Fail => (FailureMechanism::TaskFailed, message),
        Action::EndpointFail => (FailureMechanism::EndpointFailed, message),
        Action::Panic => {
            (FailureMechanism::EndpointFailed, format!("endpoint panicked: {message}"))
        }
        Action::PanickedResult => (FailureMechanism::Panicked, message),
    };
    if tf.mechanism != mechanism || tf.message != text {
        return bad(&format!("expected {mechanism:?} with {text:?}"));
    }
    let worker_ok = match (task.plan.kind, tf.worker) {
        (TaskKind::NextLevel { .. }, Some(w)) => w == WorkerRef::next_level(task.targets[member]),
        (TaskKind::Sub, Some(w)) => w.ty == WorkerType::Sub && w.id.0 < shape.subs,
        (_, None) => false,
    };
    if !worker_ok {
        return bad("names the wrong worker");
    }
    Ok(tf.task.seq)
}

/// In a gated run, before anything finished: every task's producers, as the engine lists them,
/// are exactly the model's (plus `alloc()` creators pinned by address), and its state and live
/// fanin follow from them.
fn check_edges(engine: &Engine, build: &Build) -> Result<(), String> {
    let model = &build.model;
    for (&seq, task) in &model.tasks {
        let snap = engine
            .task_snapshot(TaskId::new(build.run, seq))
            .ok_or_else(|| format!("no snapshot of task seq {seq}"))?;
        let mut allocs = BTreeSet::new();
        let mut tasks = BTreeSet::new();
        for p in &snap.producers {
            if model.allocs.contains(&p.seq) {
                allocs.insert(p.seq)
            } else {
                tasks.insert(p.seq)
            };
        }
        let state_ok = match snap.state {
            TaskState::Pending => !task.producers.is_empty(),
            TaskState::Ready | TaskState::Running => task.producers.is_empty(),
            _ => false,
        };
        if tasks != task.producers || !state_ok || snap.fanin_count as usize != tasks.len() {
            return Err(format!(
                "task seq {seq} (op {}): the model expects producers {:?}, the engine has {snap:?}",
                task.plan_index, task.producers
            ));
        }
    }
    Ok(())
}

/// Item 3: the log is consistent with the accepted tasks.
fn check_records(
    model: &RunModel,
    records: &[Record],
    shape: &EngineShape,
) -> Result<Execution, String> {
    let mut members: BTreeMap<u32, BTreeMap<u32, &Record>> = BTreeMap::new();
    for r in records {
        let Some(task) = model.tasks.get(&r.task.seq) else {
            return Err(format!("dispatched {}, which was never accepted: {r:?}", r.task));
        };
        let n = task.plan.members.len();
        let m = r.member as usize;
        if m >= n || r.group_size as usize != n || r.plan_index != task.plan_index as u64 {
            return Err(format!("dispatch does not match the submit: {r:?}"));
        }
        let plan = &task.plan.members[m];
        if r.action != Some(plan.action) || r.tensors != plan.tensors.len() {
            return Err(format!("dispatched arguments differ from the submit: {r:?}"));
        }
        let placed = match task.plan.kind {
            TaskKind::NextLevel { .. } => r.worker == WorkerRef::next_level(task.targets[m]),
            TaskKind::Sub => r.worker.ty == WorkerType::Sub && r.worker.id.0 < shape.subs,
        };
        if !placed {
            return Err(format!("member ran on the wrong worker: {r:?}"));
        }
        if members.entry(r.task.seq).or_default().insert(r.member, r).is_some() {
            return Err(format!("member dispatched twice: {r:?}"));
        }
    }
    let mut exec = Execution { ran: BTreeMap::new(), roots: BTreeSet::new() };
    for (seq, ms) in &members {
        let task = &model.tasks[seq];
        if ms.len() != task.plan.members.len() {
            return Err(format!(
                "group task {} ran {} of {} members",
                TaskId::new(ms.values().next().map_or(RunId::FIRST, |r| r.task.run), *seq),
                ms.len(),
                task.plan.members.len()
            ));
        }
        if task.plan.kind == TaskKind::Sub {
            let workers: BTreeSet<u32> = ms.values().map(|r| r.worker.id.0).collect();
            if workers.len() != ms.len() {
                return Err(format!("SUB group shared a worker: {:?}", ms.values()));
            }
        }
        let start = ms.values().map(|r| r.start).min().unwrap_or(0);
        let end = ms.values().map(|r| r.end).max().unwrap_or(0);
        exec.ran.insert(*seq, (start, end));
        if task.plan.members.iter().any(|m| m.action.fails()) {
            exec.roots.insert(*seq);
        }
    }
    Ok(exec)
}

/// Item 4: dependencies were respected. Returns the "late consumers" (below).
///
/// One exception is tolerated, because the attach protocol allows it (`docs/engine-protocols.md` §3): a task submitted while its
/// producer failed and was reclaimed. Its fail-fast check passed before the failure was
/// recorded, and by the time it looked the producer up, reclamation had erased the producer's
/// map entry, so no edge exists and the task runs on the failed task's output. This needs the
/// producer's scope to have ended before the submit (or it could not have been reclaimed) and
/// nothing to have been accepted after the task (every later submit sees the failure).
fn check_order(model: &RunModel, exec: &Execution) -> Result<BTreeSet<u32>, String> {
    let mut late = BTreeSet::new();
    let last = model.next_seq.checked_sub(1);
    for (seq, &(start, _)) in &exec.ran {
        let task = &model.tasks[seq];
        for p in &task.ordered_after {
            let why = match exec.ran.get(p) {
                Some(&(_, end)) if !exec.roots.contains(p) && end < start => continue,
                Some(&(_, end)) if !exec.roots.contains(p) => {
                    return Err(format!(
                        "task seq {seq} started at {start}, before its producer seq {p} \
                         finished at {end}"
                    ));
                }
                Some(_) => "a producer that failed",
                None => "a producer that never ran",
            };
            let reclaimable = model.scope_ended_at.get(p).is_some_and(|&op| op < task.plan_index);
            if reclaimable && Some(*seq) == last {
                late.insert(*seq);
                continue;
            }
            return Err(format!("task seq {seq} ran after {why} (seq {p})"));
        }
    }
    Ok(late)
}

/// Tasks that did not run because something upstream failed (by the model's producers).
fn doomed(model: &RunModel, exec: &Execution) -> BTreeSet<u32> {
    let mut doomed = BTreeSet::new();
    // Producers always have smaller sequence numbers, so one pass in order suffices.
    for (seq, t) in &model.tasks {
        let upstream = t.producers.iter().any(|p| exec.roots.contains(p) || doomed.contains(p));
        if upstream && !exec.ran.contains_key(seq) {
            doomed.insert(*seq);
        }
    }
    doomed
}

/// The one task that may fail without a failed producer: the last accepted one, when a task
/// failed. Its fail-fast check may have passed just before the failure was recorded; submit
/// reads the failure again after its lookups and poisons the task then
/// (`docs/engine-protocols.md` §3, step 6), and every later submit is refused.
fn poisoned_late(model: &RunModel, exec: &Execution, doomed: &BTreeSet<u32>) -> Option<u32> {
    let last = model.next_seq.checked_sub(1)?;
    let poisoned = model.tasks.contains_key(&last)
        && !exec.roots.is_empty()
        && !doomed.contains(&last)
        && !exec.ran.contains_key(&last);
    poisoned.then_some(last)
}

/// Item 5.
fn check_outcome(
    build: &Build,
    exec: &Execution,
    completes: bool,
    cause: Option<&RunFailure>,
    outcome: &RunOutcome,
) -> Result<(), String> {
    let model = &build.model;
    if completes {
        let doomed = doomed(model, exec);
        let late = poisoned_late(model, exec, &doomed);
        if let Some(seq) = model
            .tasks
            .keys()
            .find(|s| !doomed.contains(s) && !exec.ran.contains_key(s) && Some(**s) != late)
        {
            return Err(format!("task seq {seq} never ran although nothing upstream failed"));
        }
    }
    let failure = match (outcome, exec.roots.is_empty() && cause.is_none()) {
        (RunOutcome::Completed, true) => return Ok(()),
        (RunOutcome::Completed, false) => {
            return Err(format!("completed although tasks {:?} failed or {cause:?}", exec.roots));
        }
        (RunOutcome::Failed(f), true) => return Err(format!("failed with nothing planned: {f}")),
        (RunOutcome::Failed(f), false) => f,
    };
    if let Some(first) = &build.refused
        && **first != **failure
    {
        return Err(format!("refused submits with {first} but ended with {failure}"));
    }
    match &**failure {
        RunFailure::Task(tf) if exec.roots.contains(&tf.task.seq) => Ok(()),
        f if Some(f) == cause => Ok(()),
        f => Err(format!("ended with {f}; expected {cause:?} or a failure of {:?}", exec.roots)),
    }
}

/// Item 6.
fn check_summary(
    model: &RunModel,
    exec: &Execution,
    completes: bool,
    exclusive: bool,
    summary: &RunSummary,
) -> Result<(), String> {
    let tasks = model.tasks.len() as u32;
    let succeeded = (exec.ran.len() - exec.roots.len()) as u32;
    if summary.tasks != model.next_seq {
        return Err(format!("{} charges counted, {} made", summary.tasks, model.next_seq));
    }
    if summary.failed + summary.cancelled != tasks - succeeded {
        return Err(format!("{tasks} tasks, {succeeded} succeeded"));
    }
    if summary.failed < exec.roots.len() as u32 {
        return Err(format!("{} tasks failed on their own", exec.roots.len()));
    }
    if completes
        && (summary.cancelled != 0
            || summary.failed as usize != {
                let doomed = doomed(model, exec);
                let late = poisoned_late(model, exec, &doomed);
                exec.roots.len() + doomed.len() + usize::from(late.is_some())
            })
    {
        return Err("a closed run cancelled tasks or miscounted poisoned ones".to_owned());
    }
    // Only with the engine to itself: a release on another thread can lose this run's peaks
    // (see the ignored peaks test in `stress.rs`).
    if exclusive && model.next_seq > 0 && summary.peaks.window_peak == 0 {
        return Err("no window peak recorded for a run with charges".to_owned());
    }
    Ok(())
}

/// Engine-level checks after the last run (module docs), consuming the engine.
pub fn finish_engine(
    engine: Engine,
    shape: &EngineShape,
    level: u8,
    recorder: &Recorder,
    reports: &[RunReport],
) -> Result<(), String> {
    engine.shutdown(Instant::now() + PATIENCE).map_err(|errors| format!("shutdown: {errors:?}"))?;
    let stats = engine.stats();
    let dispatched = recorder.len() as u64;
    let charges: u64 = reports.iter().map(|r| u64::from(r.charges)).sum();
    if stats.dispatched != dispatched
        || stats.completions != dispatched
        || stats.reclaimed != charges
        || stats.runs_begun != reports.len() as u64
    {
        return Err(format!(
            "after shutdown: {dispatched} dispatches logged, {charges} charges, {} runs; \
             stats {stats:?}",
            reports.len()
        ));
    }
    if stats.ring.window.live != 0 {
        return Err(format!("slots live after shutdown: {:?}", stats.ring.window));
    }
    drop(engine);
    let endpoints = shape.next_level.len() + shape.subs as usize;
    if recorder.live_endpoints() != 0 || recorder.lifecycle() != (endpoints, endpoints) {
        return Err(format!(
            "{} endpoints alive after drop, lifecycle {:?} for {endpoints} endpoints",
            recorder.live_endpoints(),
            recorder.lifecycle()
        ));
    }
    let alive = engine_threads_alive(level);
    if !alive.is_empty() {
        return Err(format!("engine threads outlived the engine: {alive:?}"));
    }
    Ok(())
}
