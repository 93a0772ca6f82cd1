//! The submit flow (`docs/engine-protocols.md` §3): validation before any allocation, then the nine
//! steps that claim, charge, wire and publish a task.
//!
//! Steps 2–9 cannot fail and run no user code, so a task once claimed is always published or
//! failed; a failed validation changes nothing and leaves the run `Building`.

use std::sync::Arc;

use simpler_tensormap::{Access, ByteSpan, TensorKey};
use simpler_types::{
    CallConfig, CallableId, CallableKind, CancelReason, RunFailure, SlotId, TaskArgs, TaskFailure,
    TaskId, TaskState, WorkerId, WorkerType,
};

use crate::builder::RunBuilder;
use crate::error::SchedError;
use crate::inbox::ReadyEntry;
use crate::slot::{Edge, Head, Route};
use crate::task_protocol::{Attach, Publish, root_of};

/// Eligible worker sets of a NEXT_LEVEL submit.
#[derive(Clone, Copy)]
pub(crate) enum Eligible<'a> {
    /// No restriction.
    Any,
    /// One set for the single member.
    One(&'a [WorkerId]),
    /// One set per member.
    PerMember(&'a [Vec<WorkerId>]),
}

impl<'a> Eligible<'a> {
    /// Every id named in any set.
    fn ids(self) -> impl Iterator<Item = WorkerId> + 'a {
        let (one, per_member): (&[WorkerId], &[Vec<WorkerId>]) = match self {
            Eligible::Any => (&[], &[]),
            Eligible::One(set) => (set, &[]),
            Eligible::PerMember(sets) => (&[], sets),
        };
        one.iter().chain(per_member.iter().flatten()).copied()
    }
}

/// One tracked access of a submit: a tensor whose tag the tensor map tracks, with its footprint.
#[derive(Clone, Copy)]
pub(crate) struct Tracked {
    /// How the task uses the bytes.
    pub(crate) access: Access,
    /// The buffer.
    pub(crate) key: TensorKey,
    /// The bytes of the buffer.
    pub(crate) span: ByteSpan,
}

/// Where a submit's members run.
pub(crate) enum Placement<'a> {
    /// NEXT_LEVEL: one target per member, by stable id.
    NextLevel {
        /// Targets.
        targets: &'a [WorkerId],
        /// Eligible sets.
        eligible: Eligible<'a>,
    },
    /// SUB: any idle SUB workers.
    Sub,
}

impl RunBuilder<'_> {
    /// Validation then steps 1–9 (`docs/engine-protocols.md` §3).
    pub(crate) fn submit(
        &mut self,
        callable: &CallableId,
        members: &[TaskArgs],
        config: Option<&CallConfig>,
        placement: Placement<'_>,
    ) -> Result<TaskId, SchedError> {
        if self.core().is_stopping() {
            return Err(SchedError::ShuttingDown);
        }
        let worker_type = self.validate(callable, members, &placement)?;
        self.check_open()?;
        if self.orch.issued == u32::MAX {
            return Err(SchedError::TooManyTasks { run: self.run.id });
        }
        self.build(callable, members, config, worker_type)
    }

    /// Validation checks 1–12. Fills `orch.targets`, `orch.footprints` and `orch.tracked`.
    fn validate(
        &mut self,
        callable: &CallableId,
        args: &[TaskArgs],
        placement: &Placement<'_>,
    ) -> Result<WorkerType, SchedError> {
        let core = self.core();
        let orch = &mut *self.orch;
        let n = args.len();
        // 1
        if n == 0 {
            return Err(SchedError::EmptyArgsList);
        }
        orch.targets.clear();
        let worker_type = match placement {
            Placement::NextLevel { targets, eligible } => {
                // 2
                if targets.len() != n {
                    return Err(SchedError::TargetCountMismatch {
                        targets: targets.len(),
                        members: n,
                    });
                }
                // 3
                for (i, t) in targets.iter().enumerate() {
                    if targets[..i].contains(t) {
                        return Err(SchedError::DuplicateTarget { worker: *t });
                    }
                }
                // 4
                for &t in *targets {
                    let index =
                        core.next_level_index(t).ok_or(SchedError::UnknownWorker { worker: t })?;
                    orch.targets.push(index);
                }
                for w in eligible.ids() {
                    if core.next_level_index(w).is_none() {
                        return Err(SchedError::UnknownWorker { worker: w });
                    }
                }
                // 5
                let check = |member: usize, set: &[WorkerId]| {
                    if set.is_empty() {
                        return Err(SchedError::EmptyEligibleSet { member });
                    }
                    if !set.contains(&targets[member]) {
                        return Err(SchedError::TargetNotEligible {
                            member,
                            worker: targets[member],
                        });
                    }
                    Ok(())
                };
                match eligible {
                    Eligible::Any => {}
                    Eligible::One(set) => {
                        if n != 1 {
                            return Err(SchedError::EligibleCountMismatch { sets: 1, members: n });
                        }
                        check(0, set)?;
                    }
                    Eligible::PerMember(sets) => {
                        if sets.len() != n {
                            return Err(SchedError::EligibleCountMismatch {
                                sets: sets.len(),
                                members: n,
                            });
                        }
                        for (member, set) in sets.iter().enumerate() {
                            check(member, set)?;
                        }
                    }
                }
                WorkerType::NextLevel
            }
            Placement::Sub => {
                // 6
                if n > core.sub.len() {
                    return Err(SchedError::GroupLargerThanPool { size: n, pool: core.sub.len() });
                }
                WorkerType::Sub
            }
        };
        // 7
        let expected = match worker_type {
            WorkerType::Sub => CallableKind::Host,
            WorkerType::NextLevel if core.level <= 3 => CallableKind::Chip,
            WorkerType::NextLevel => CallableKind::Graph,
        };
        if callable.kind != expected {
            return Err(SchedError::CallableKindMismatch { kind: callable.kind, worker_type });
        }
        // 8–11, tensor by tensor.
        orch.footprints.clear();
        orch.tracked.clear();
        for (member, a) in args.iter().enumerate() {
            let target = match placement {
                Placement::NextLevel { targets, .. } => Some(targets[member]),
                Placement::Sub => None,
            };
            let first = orch.footprints.len();
            for (arg, (t, &tag)) in a.tensors().iter().zip(a.tags()).enumerate() {
                t.validate().map_err(|source| SchedError::InvalidTensor { member, arg, source })?;
                if t.lacks_buffer_for(tag) {
                    return Err(SchedError::OutputWithoutBuffer { member, arg, tag });
                }
                if target.is_none() && t.is_child_memory() {
                    return Err(SchedError::ChildMemoryOnSubTask { member, arg });
                }
                // 12: the engine orders and pins its heap's bytes by their `alloc()` buffer,
                // which it knows by base address only.
                if t.addr != 0 && !t.is_child_memory() && core.touches_heap(t.addr, t.size) {
                    let within =
                        orch.open_allocs.get(&t.addr).is_some_and(|&(_, bytes)| t.size <= bytes);
                    if !within {
                        return Err(SchedError::NotAnAllocBuffer {
                            member,
                            arg,
                            addr: t.addr,
                            size: t.size,
                        });
                    }
                }
                // A key can only fail for child memory without a target, which check 10 has
                // just refused; map it to the same error should that ever change.
                let spanned = Access::of_view_spanned(tag, t);
                let fp = match spanned {
                    Some((_, span)) => TensorKey::for_tensor(t, target)
                        .map_err(|_| SchedError::ChildMemoryOnSubTask { member, arg })?
                        .map(|key| (key, span)),
                    None => None,
                };
                if let (Some((access, _)), Some((key, span))) = (spanned, fp) {
                    orch.tracked.push(Tracked { access, key, span });
                }
                if let (true, Some((key, span))) = (tag.writes(), fp) {
                    let earlier = orch.footprints[first..].iter().zip(a.tags()).enumerate();
                    for (prev, (other, other_tag)) in earlier {
                        if let (true, Some((k, s))) = (other_tag.writes(), other)
                            && *k == key
                            && s.overlaps(span)
                        {
                            return Err(SchedError::OverlappingWrites {
                                member,
                                first: prev,
                                second: arg,
                            });
                        }
                    }
                }
                orch.footprints.push(fp);
            }
        }
        Ok(worker_type)
    }

    /// Steps 1–9. After validation only the ring can refuse (step 1); from step 2 on
    /// nothing fails.
    fn build(
        &mut self,
        callable: &CallableId,
        args: &[TaskArgs],
        config: Option<&CallConfig>,
        worker_type: WorkerType,
    ) -> Result<TaskId, SchedError> {
        let core = self.core();
        let n = args.len();

        // 1. Claim a slot (slot only, no heap).
        let depth = self.orch.scopes.depth().saturating_sub(1);
        let allocation = self.claim(0, depth)?;
        let run = &self.run;
        let id = allocation.slot;
        let Some(slot) = core.ring.slot(id) else {
            core.ring.release(id);
            return Err(SchedError::Internal {
                message: format!("{id} is not live right after its allocation"),
            });
        };

        // 2. Initialize and charge; register the scope reference before outputs are published.
        let task = match run.charge(id) {
            Ok(task) => task,
            Err(_) => {
                core.ring.release(id);
                return Err(SchedError::TooManyTasks { run: run.id });
            }
        };
        let orch = &mut *self.orch;
        orch.issued += 1;
        let route = match worker_type {
            WorkerType::Sub => Route::Sub { size: n as u32 },
            WorkerType::NextLevel if n > 1 => Route::Group,
            WorkerType::NextLevel => Route::Single { worker: orch.targets[0] },
        };
        slot.init_task(Head { id, task, callable: *callable }, Arc::clone(run), route, n);
        orch.scopes.register(id);

        let reads = {
            // The payload of a `Building` slot is read by nobody, so holding its lock across the
            // tensor-map guard contends with no one (lock order: payload → tensor map).
            let mut payload = slot.payload.write();

            // 3. Infer dependencies. Lifetime pins first (the creators of the `alloc()` buffers
            // the task names, which validation check 12 found open), then lookups and inserts
            // under one tensor-map guard.
            #[cfg(all(test, not(simpler_loom)))]
            fault::before_lookups();
            orch.producers.clear();
            orch.overwritten.clear();
            for t in args.iter().flat_map(|a| a.tensors()).filter(|t| !t.is_child_memory()) {
                if let Some(&(creator, _)) = orch.open_allocs.get(&t.addr) {
                    orch.producers.push(creator);
                }
            }
            {
                // Every lookup of the task comes before any of its records: a read then sees the
                // writers from before this task's own writes, so a group whose member writes a
                // buffer another member reads still waits for the buffer's earlier writers, and
                // a covering write has ordered after the readers it is about to supersede
                // (docs/tensormap.md).
                let mut map = core.tensor_map.lock();
                let tracked = &orch.tracked;
                let (found, overwritten) = (&mut orch.producers, &mut orch.overwritten);
                match tracked.as_slice() {
                    [] => {}
                    // One access: its lookup and record share one hash probe.
                    [t] => {
                        payload.journal(t.key, t.access);
                        let list = producers_of(t.access, found, overwritten);
                        map.access(run.id, t.key, t.span, t.access, id, |p| list.push(p));
                    }
                    // A few accesses of distinct keys: a record of one key cannot change what a
                    // lookup of another finds, so each lookup shares its record's hash probe as
                    // above and the order of the rule is kept trivially.
                    _ if distinct_keys(tracked.iter().map(|t| t.key)) => {
                        for t in tracked {
                            payload.journal(t.key, t.access);
                            let list = producers_of(t.access, found, overwritten);
                            map.access(run.id, t.key, t.span, t.access, id, |p| list.push(p));
                        }
                    }
                    _ => {
                        for t in tracked {
                            let list = producers_of(t.access, found, overwritten);
                            map.dependencies(run.id, &t.key, t.span, t.access, |p| list.push(p));
                        }
                        for t in tracked {
                            payload.journal(t.key, t.access);
                            map.record(run.id, t.key, t.span, t.access, id);
                        }
                    }
                }
            }
            // Duplicates are left in: attach skips a producer met twice (step 5).
            orch.producers.retain(|&p| p != id);
            orch.overwritten.retain(|&p| p != id);

            // 4. Store the payload.
            payload.id = Some(id);
            payload.task = Some(task);
            payload.callable = Some(*callable);
            payload.worker_type = Some(worker_type);
            if let Some(config) = config {
                payload.set_config(config);
            }
            for (i, a) in args.iter().enumerate() {
                payload.push_member(a, orch.targets.get(i).copied().unwrap_or(i as u32));
            }
            !payload.read_keys.is_empty()
        };

        // 5. Attach to each producer, holding only that producer's lock.
        let me = Edge { slot: id, task };
        orch.attached.clear();
        let mut live = 0u32;
        let mut failed: Option<Arc<TaskFailure>> = None;
        let found = orch.producers.iter().map(|&p| (p, false));
        let overwritten = orch.overwritten.iter().map(|&p| (p, true));
        for (p, only_overwritten) in found.chain(overwritten) {
            let Some(producer) = core.ring.slot(p) else { continue };
            // A producer only a blind write found that completed has done every read it stands
            // for: no edge, and no hold on its slot. Its completion was published with Release
            // before the state this Acquire load reads, so those reads happen before anything
            // this task does (`docs/engine-protocols.md` §3, step 5).
            if only_overwritten && producer.state.get(p) == Some(TaskState::Completed) {
                continue;
            }
            match producer.attach(p, me) {
                Attach::Skipped => {}
                Attach::Live(t) => {
                    live += 1;
                    orch.attached.push(Edge { slot: p, task: t });
                }
                Attach::Finished(t) => orch.attached.push(Edge { slot: p, task: t }),
                Attach::Failed(t, f) => {
                    orch.attached.push(Edge { slot: p, task: t });
                    failed.get_or_insert(f);
                }
            }
        }

        // The fail-fast check ran before the lookups. A producer that failed and was reclaimed
        // since then left no entry to find and no slot to attach to, so its failure is only
        // visible on the run: read it again now that every lookup and attach is done. A task
        // failure is recorded before the failed task can be reclaimed, so a producer the lookups
        // missed for that reason is seen here (`docs/engine-protocols.md` §3, step 6).
        // The same read finds a shutdown abort, or the engine's poisoning, that copied the run's
        // slot list before this task was charged: that cancellation cannot reach the task, so it
        // is cancelled here, or it would be dispatched after its run was reported failed.
        let mut aborted = None;
        if failed.is_none()
            && let Some(late) = run.failure()
        {
            match &*late {
                RunFailure::Aborted { reason, .. } => aborted = Some(*reason),
                RunFailure::Internal { .. } if core.registry.is_poisoned() => {
                    aborted = Some(CancelReason::EnginePoisoned);
                }
                other => failed = other.task_failure().map(Arc::clone),
            }
        }

        // 6. Publish; 7. poisoned or cancelled at submit; 8. queue.
        let poisoned = failed.is_some() || aborted.is_some();
        match slot.publish(id, &orch.attached, live, poisoned, reads) {
            Publish::Poisoned if let Some(reason) = aborted => {
                core.cancel_unstarted(id, reason, &mut orch.graph);
            }
            Publish::Ready(route) => {
                let may_hold = orch.issued > LATENCY_BOUND_TASKS;
                let entry = ReadyEntry { slot: id, route };
                core.publish_ready(entry, may_hold, &mut orch.holding, &mut orch.graph);
            }
            // It may wait for a held task: hand those over now rather than when an endpoint
            // thread takes them (`held_ready`, step 12).
            Publish::Pending => core.hand_over(&mut orch.holding, &mut orch.graph),
            Publish::Poisoned => {
                let root = failed.as_ref().map(root_of);
                if let Some(f) = slot.fail_at_submit(id, root, &mut orch.graph.releases) {
                    run.record(RunFailure::Task(Arc::clone(root_of(&f))));
                }
                core.release_all(&mut orch.graph.releases);
            }
        }
        tracing::trace!(parent: &run.span, %task, producers = orch.attached.len(), live, "submitted");
        // 9.
        Ok(task)
    }
}

/// A run's first submits (tasks and `alloc()`s counted alike), whose ready tasks its submitting
/// thread always dispatches itself, never holding them or joining them to waiting events
/// (`inbox`, step 10): up to here a run is short, and its dispatches count as latency. Measured: one- to sixteen-task runs lost 0.1–0.4 µs each when
/// every ready task could be left to an idle endpoint thread.
const LATENCY_BOUND_TASKS: u32 = 16;

/// Most tracked accesses of one task checked for [`distinct_keys`]; a task with more takes the
/// two-pass path, which is right for any keys.
const DISTINCT_CHECK_LIMIT: usize = 8;

/// Where the producers an access finds go. A blind write finds only tasks that read the bytes
/// or stand for readers they superseded (`docs/tensormap.md`); they are set apart, since one that
/// finished needs no edge (`docs/engine-protocols.md` §3, step 5).
fn producers_of<'a>(
    access: Access,
    found: &'a mut Vec<SlotId>,
    overwritten: &'a mut Vec<SlotId>,
) -> &'a mut Vec<SlotId> {
    if access.is_blind_write() { overwritten } else { found }
}

/// Whether `keys` (at most [`DISTINCT_CHECK_LIMIT`] of them) are pairwise distinct.
fn distinct_keys<K: PartialEq + Copy>(keys: impl Iterator<Item = K> + Clone) -> bool {
    let earlier = keys.clone();
    for (i, key) in keys.enumerate() {
        if i >= DISTINCT_CHECK_LIMIT || earlier.clone().take(i).any(|k| k == key) {
            return false;
        }
    }
    true
}

/// A fault point for tests: code run on the submitting thread between the fail-fast check and
/// the dependency lookups, to force interleavings that are otherwise a matter of timing.
#[cfg(all(test, not(simpler_loom)))]
pub(crate) mod fault {
    use std::cell::RefCell;

    thread_local! {
        static BEFORE_LOOKUPS: RefCell<Option<Box<dyn FnMut()>>> = const { RefCell::new(None) };
    }

    /// Runs `hook` in this thread's next submits, before their lookups, until cleared.
    pub(crate) fn set_before_lookups(hook: Option<Box<dyn FnMut()>>) {
        BEFORE_LOOKUPS.with(|h| *h.borrow_mut() = hook);
    }

    pub(super) fn before_lookups() {
        // Taken out while it runs, so a hook that submits does not re-enter itself.
        let hook = BEFORE_LOOKUPS.with(|h| h.borrow_mut().take());
        if let Some(mut hook) = hook {
            hook();
            BEFORE_LOOKUPS.with(|h| {
                h.borrow_mut().get_or_insert(hook);
            });
        }
    }
}

#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use simpler_types::{
        CallConfig, CancelReason, DataType, FailureMechanism, RunFailure, TaskArgs, TaskId,
        TaskState, Tensor, WorkerId, WorkerType,
    };

    use super::fault;
    use crate::endpoint::{DispatchedMember, Endpoint, EndpointCaps, EndpointFailure};
    use crate::engine::{Engine, EngineConfig};
    use crate::graph::GraphScratch;
    use crate::outcome::RunOutcome;
    use crate::scheduler::tests::{chip, gated_engine, wait_until};

    /// A NEXT_LEVEL endpoint that logs every task it runs; the first one waits for a token and
    /// then fails, every later one succeeds at once.
    struct FailFirst {
        gate: mpsc::Receiver<()>,
        ran: Arc<Mutex<Vec<TaskId>>>,
    }

    impl Endpoint for FailFirst {
        fn caps(&self) -> EndpointCaps {
            EndpointCaps {
                worker_type: WorkerType::NextLevel,
                id: WorkerId(0),
                remote: false,
                name: "fail-first".into(),
            }
        }

        fn run(&mut self, m: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
            let first = {
                let mut ran = self.ran.lock().unwrap();
                ran.push(m.task);
                ran.len() == 1
            };
            if !first {
                return Ok(());
            }
            let _ = self.gate.recv_timeout(Duration::from_secs(20));
            Err(EndpointFailure::task_failed("producer failed"))
        }
    }

    fn tensor() -> Tensor {
        Tensor::external(0x1000, &[64], DataType::UInt8).unwrap()
    }

    #[test]
    fn only_a_few_pairwise_distinct_keys_take_the_one_probe_path() {
        assert!(super::distinct_keys([1, 2, 3].into_iter()));
        assert!(!super::distinct_keys([1, 2, 1].into_iter()));
        let many = 0..super::DISTINCT_CHECK_LIMIT as u32 + 1;
        assert!(!super::distinct_keys(many), "past the limit the two-pass path is taken");
    }

    #[test]
    fn a_producer_failing_and_reclaimed_after_the_fail_fast_check_still_poisons_its_consumer() {
        let (tx, gate) = mpsc::channel();
        let ran = Arc::new(Mutex::new(Vec::new()));
        let endpoint = FailFirst { gate, ran: Arc::clone(&ran) };
        let engine = Arc::new(
            Engine::start(EngineConfig {
                next_level: vec![Box::new(endpoint)],
                ..EngineConfig::default()
            })
            .unwrap(),
        );
        let cfg = CallConfig::default();
        let mut b = engine.begin_run().unwrap();
        // The producer lives in a user scope that is closed at once, so that its failure lets
        // it be reclaimed while the run is still building.
        b.scope_begin().unwrap();
        let mut out = TaskArgs::new();
        out.add_output(tensor()).unwrap();
        let producer = b.submit_next_level(&chip(), out, &cfg, WorkerId(0), None).unwrap();
        b.scope_end().unwrap();
        wait_until(|| engine.task_snapshot(producer).unwrap().state == TaskState::Running);

        // Between the consumer's fail-fast check and its lookups, the producer fails and is
        // reclaimed: its tensor-map entry and its slot are gone when the lookups run.
        let hook_engine = Arc::clone(&engine);
        fault::set_before_lookups(Some(Box::new(move || {
            tx.send(()).unwrap();
            wait_until(|| {
                hook_engine.task_snapshot(producer).unwrap().state == TaskState::Consumed
            });
        })));
        let mut input = TaskArgs::new();
        input.add_input(tensor()).unwrap();
        let consumer = b.submit_next_level(&chip(), input, &cfg, WorkerId(0), None);
        fault::set_before_lookups(None);
        let consumer = consumer.unwrap();

        let snapshot = engine.task_snapshot(consumer).unwrap();
        assert_eq!(snapshot.state, TaskState::Failed, "{snapshot:?}");
        let failure = snapshot.failure.unwrap();
        assert!(
            matches!(&failure.mechanism, FailureMechanism::Poisoned { root } if *root == producer),
            "{failure:?}"
        );
        let outcome = engine.wait_timeout(b.close(), Duration::from_secs(20)).unwrap();
        let Some(RunOutcome::Failed(f)) = outcome else { panic!("{outcome:?}") };
        assert_eq!(f.task_failure().map(|t| t.task), Some(producer));
        // The run is terminal, so every dispatch that was ever going to happen has happened.
        assert_eq!(*ran.lock().unwrap(), vec![producer], "the consumer ran on a failed output");
    }

    /// Submits one task while `cancel` (the hook, given the core and the run) fails the run and
    /// cancels its slot list as copied before the task was charged, and checks that the task
    /// cancelled itself with `reason` instead of being dispatched; returns the run's failure.
    fn charge_after_a_cancellation_copied_the_slot_list(
        reason: CancelReason,
        cancel: impl Fn(&crate::core::Core, &Arc<crate::run_record::RunRecord>) + Send + 'static,
    ) -> Arc<RunFailure> {
        let (engine, tx) = gated_engine();
        let engine = Arc::new(engine);
        let cfg = CallConfig::default();
        let mut b = engine.begin_run().unwrap();
        let run_id = b.id();
        let hook_engine = Arc::clone(&engine);
        fault::set_before_lookups(Some(Box::new(move || {
            let core = hook_engine.core();
            let run = core.registry.find(run_id).unwrap();
            let late = run.lock().task_slots.pop().unwrap();
            cancel(core, &run);
            run.lock().task_slots.push(late);
        })));
        let task = b.submit_next_level(&chip(), TaskArgs::new(), &cfg, WorkerId(0), None);
        fault::set_before_lookups(None);
        let task = task.unwrap();

        let snapshot = engine.task_snapshot(task).unwrap();
        assert_eq!(snapshot.state, TaskState::Failed, "dispatched after its run failed");
        let failure = snapshot.failure.unwrap();
        assert!(
            matches!(failure.mechanism, FailureMechanism::Cancelled { reason: r } if r == reason),
            "{failure:?}"
        );
        assert_eq!(engine.stats().dispatched, 0);
        drop(tx);
        let outcome = engine.wait_timeout(b.close(), Duration::from_secs(20)).unwrap();
        let Some(RunOutcome::Failed(f)) = outcome else { panic!("{outcome:?}") };
        f
    }

    #[test]
    fn a_task_charged_after_a_shutdown_abort_copied_the_slot_list_is_cancelled_not_dispatched() {
        // Shutdown aborts a run whose builder is live on another thread: it marks the run failed
        // and cancels the slots it copied. A submit that passed the fail-fast check before the
        // mark but was charged after the copy is reached by neither; it must cancel itself
        // instead of being dispatched (the scheduler is still running until shutdown's next
        // step). The hook replays that abort against a slot list without the new task.
        let f = charge_after_a_cancellation_copied_the_slot_list(
            CancelReason::Shutdown,
            |core, run| {
                run.mark_failed(RunFailure::Aborted {
                    run: run.id,
                    reason: CancelReason::Shutdown,
                });
                core.cancel_run(run, CancelReason::Shutdown, false, &mut GraphScratch::default());
            },
        );
        assert!(matches!(*f, RunFailure::Aborted { .. }), "{f:?}");
    }

    #[test]
    fn a_task_charged_after_poisoning_copied_the_slot_list_is_cancelled_not_dispatched() {
        // The same for the engine's poisoning, which also fails the run and cancels the slots it
        // copied: the late task would otherwise run after its run's waiter saw the run fail.
        let poisoned = CancelReason::EnginePoisoned;
        let f = charge_after_a_cancellation_copied_the_slot_list(poisoned, |core, _| {
            core.poison("deliberate");
        });
        assert!(matches!(*f, RunFailure::Internal { .. }), "{f:?}");
    }
}
