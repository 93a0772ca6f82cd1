//! The scheduler: queues, dispatch passes, completion processing (`docs/engine-protocols.md` §6),
//! and the scheduler thread.
//!
//! The queues live in [`SchedState`] behind the scheduler lock (`Core::sched`). A **pass** runs
//! under that lock on whichever thread delivered an event (combining protocol in `inbox`):
//!
//! 1. Drain the inbox, then take the caller's own event.
//! 2. Process completions in order: mark the worker idle first (idleness is owned by the
//!    scheduler, so it is never visible before its completion — hazard 7), then the member's
//!    outcome (`complete_member`), then releases, fanin releases and poisoning. Consumers that
//!    become ready are routed directly.
//! 3. Route each ready task: NEXT_LEVEL single → its target's FIFO, NEXT_LEVEL group → the group
//!    FIFO, SUB → the SUB FIFO.
//! 4. Unless stopping, one dispatch pass: groups, then singles, then SUB.
//! 5. Reader retirements (a finished task's reader entries leave the tensor map), then the
//!    reference releases and reclamations owed by the successful finishes of step 2 (deferred
//!    from there, so that a consumer released by a completion is dispatched before the
//!    finished task's bookkeeping runs: on a dependent chain that bookkeeping is otherwise on
//!    the critical path of every step). Nothing in steps 3–4 depends on them: dispatch neither
//!    allocates a slot nor reads the tensor map, and a run's fence fires only once every one of
//!    its slots is reclaimed, which this step still does before the pass ends.
//! 6. Stall bookkeeping; if stopping and no worker is busy, or a new stall episode just opened
//!    (even one replacing an episode already reported), poke the scheduler thread.
//!
//! Passes run only when an event arrives (edge-triggered): work that cannot be placed waits for
//! a completion, the only event that can unblock it (hazard 4). A pass runs under
//! `catch_unwind`, and so does each event it handles: a panic is an engine bug that poisons the
//! engine (every non-terminal run fails with an internal error, `begin_run` refuses); the other
//! events of the batch are still handled and the queues stay usable, so shutdown can finish.
//!
//! # Dispatch pass
//!
//! 1. **Groups**, strict FIFO: a stale or non-`Ready` head is dropped. If every target of the
//!    head is idle, claim it (`Ready → Running`), mark its members running and its targets busy,
//!    send member i to target i, and look at the next head. Otherwise the head is blocked: it
//!    **reserves all its targets**, busy or idle, for the rest of the pass, and group processing
//!    stops. Nothing is dispatched partially.
//! 2. **Singles**: each NEXT_LEVEL worker, in registration order, that is neither busy nor
//!    reserved pops its own FIFO until one claim succeeds (stale and non-`Ready` entries are
//!    dropped). At most one per worker per pass; no stealing.
//! 3. **SUB**, strict FIFO: the head needs `size` distinct idle SUB workers; with too few the
//!    pass stops. Otherwise member i goes to the i-th idle SUB worker, lowest index first.
//!
//! # Scheduler thread
//!
//! It sleeps on its own signal, not on the inbox, and is poked only for stop and for stall
//! deadlines:
//!
//! 1. Wait until poked, or until the open stall episode's deadline.
//! 2. Take the scheduler lock and run a pass (draining anything pending, reporting a due stall).
//! 3. If stopping and no worker is busy: close the inbox (taking what arrived meanwhile), cancel
//!    every task still queued (it can never be dispatched now), mark the state exited, and leave.
//! 4. Otherwise unlock and drive (combining step 2), so that an event another thread left in the
//!    inbox while this thread held the lock is processed.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use simpler_types::{CancelReason, RunFailure, SlotId, TaskFailure, TaskState};

use crate::core::Core;
use crate::endpoint::{EndpointFailure, drop_quietly, into_panic_message, quietly, thread_span};
use crate::graph::{GraphScratch, Reclaims};
use crate::held_ready::EndpointTake;
use crate::inbox::{
    InboxBatch, MemberCompletion, ReadyEntry, WorkerSlot, drive, locked_then_drive,
};
use crate::run_record::RunRecord;
use crate::slot::Route;
use crate::sync::{MutexGuard, Ordering};
use crate::task_protocol::{Fanin, MemberDone, root_of};

/// Scheduler-private state of one NEXT_LEVEL worker.
#[derive(Default)]
struct NextLevelQueue {
    fifo: VecDeque<SlotId>,
    busy: bool,
    /// Reserved by a blocked group head for the rest of the current pass.
    reserved: bool,
}

/// Releases and reclamations a pass owes after its dispatch (pass step 5).
#[derive(Default)]
struct Deferred {
    /// Finished slots whose reader entries are to leave the tensor map (before anything below
    /// can reclaim them).
    retired_readers: Vec<SlotId>,
    /// Scope and consumer references to release, in the order the finishes produced them.
    releases: Vec<SlotId>,
    /// Finished slots whose last reference is gone, with their run.
    reclaims: Vec<(SlotId, Arc<RunRecord>)>,
}

impl Deferred {
    /// Whether anything is owed (most passes owe nothing, and skip step 5).
    fn is_owed(&self) -> bool {
        !self.retired_readers.is_empty() || !self.releases.is_empty() || !self.reclaims.is_empty()
    }

    /// Performs everything owed — reader retirements, then releases (in completion order),
    /// then reclamations — and empties the lists.
    fn settle(&mut self, core: &Core) {
        for id in self.retired_readers.drain(..) {
            core.retire_reads(id);
        }
        let mut reclaims = Reclaims::new(core);
        for id in self.releases.drain(..) {
            core.release_into(id, &mut reclaims);
        }
        for (id, run) in self.reclaims.drain(..) {
            core.reclaim_into(id, run, &mut reclaims);
        }
    }
}

/// An open stall episode: the group head has been blocked since `since` while an idle target
/// it reserves holds queued singles.
struct Stall {
    head: SlotId,
    since: Instant,
    reported: bool,
}

/// The caller's own event for a pass.
pub(crate) enum Own {
    /// Nothing of its own (driving, or the scheduler thread).
    Nothing,
    /// A task published ready.
    Ready(ReadyEntry),
    /// A member completion.
    Completion(MemberCompletion),
}

/// Test seam run by the scheduler thread under the scheduler lock.
#[cfg(test)]
pub(crate) type ThreadHook = Box<dyn FnMut(&Core) + Send>;

/// The scheduler's queues and bookkeeping, private to the holder of the scheduler lock.
pub(crate) struct SchedState {
    next_level: Vec<NextLevelQueue>,
    sub_busy: Vec<bool>,
    groups: VecDeque<SlotId>,
    subs: VecDeque<(SlotId, u32)>,
    batch: InboxBatch,
    scratch: GraphScratch,
    targets: SmallVec<[u32; 8]>,
    idle_subs: SmallVec<[u32; 8]>,
    busy: usize,
    stopping: bool,
    exited: bool,
    stall: Option<Stall>,
    passes: u64,
    dispatched: u64,
    completions: u64,
    /// Step 5's work, owed by this pass's successful finishes. Kept apart from `scratch`, which
    /// a panicking event resets, so that another event's panic cannot drop it.
    deferred: Deferred,
    /// Test seam: called by the scheduler thread while it holds the scheduler lock.
    #[cfg(test)]
    pub(crate) thread_hook: Option<ThreadHook>,
}

impl SchedState {
    /// Empty queues for `next_level` NEXT_LEVEL and `sub` SUB workers.
    pub(crate) fn new(next_level: usize, sub: usize) -> SchedState {
        SchedState {
            next_level: (0..next_level).map(|_| NextLevelQueue::default()).collect(),
            sub_busy: vec![false; sub],
            groups: VecDeque::new(),
            subs: VecDeque::new(),
            batch: InboxBatch::default(),
            scratch: GraphScratch::default(),
            targets: SmallVec::new(),
            idle_subs: SmallVec::new(),
            busy: 0,
            stopping: false,
            exited: false,
            stall: None,
            passes: 0,
            dispatched: 0,
            completions: 0,
            deferred: Deferred::default(),
            #[cfg(test)]
            thread_hook: None,
        }
    }

    /// Pass steps 1–6. Returns whether the scheduler thread needs to look.
    fn pass(&mut self, core: &Core, own: Own) -> bool {
        core.inbox.take(&mut self.batch);
        self.passes += 1;
        let mut completions = std::mem::take(&mut self.batch.completions);
        for c in completions.drain(..) {
            self.guarded(core, |state| state.on_completion(core, c));
        }
        self.batch.completions = completions;
        let mut ready = std::mem::take(&mut self.batch.ready);
        for r in ready.drain(..) {
            self.guarded(core, |state| state.route(core, r.slot, r.route));
        }
        self.batch.ready = ready;
        match own {
            Own::Nothing => {}
            Own::Ready(r) => self.guarded(core, |state| state.route(core, r.slot, r.route)),
            Own::Completion(c) => self.guarded(core, |state| state.on_completion(core, c)),
        }
        if std::mem::take(&mut self.batch.stop) {
            self.stopping = true;
        }
        if !self.stopping {
            self.dispatch_pass(core);
        }
        if self.deferred.is_owed() {
            self.guarded(core, |state| state.deferred.settle(core));
        }
        let opened = self.check_stall(core);
        self.publish_counters(core);
        (self.stopping && self.busy == 0) || opened
    }

    /// Cancels everything still queued and refuses every later event (thread step 3).
    fn exit(&mut self, core: &Core) {
        core.inbox.close(&mut self.batch);
        for c in std::mem::take(&mut self.batch.completions) {
            self.guarded(core, |state| state.on_completion(core, c));
        }
        for r in std::mem::take(&mut self.batch.ready) {
            self.guarded(core, |state| state.route(core, r.slot, r.route));
        }
        self.guarded(core, |state| state.deferred.settle(core));
        self.exited = true;
        self.cancel_queued(core);
        self.publish_counters(core);
    }

    fn cancel_queued(&mut self, core: &Core) {
        let mut leftover: Vec<SlotId> = Vec::new();
        for q in &mut self.next_level {
            leftover.extend(q.fifo.drain(..));
        }
        leftover.extend(self.groups.drain(..));
        leftover.extend(self.subs.drain(..).map(|(s, _)| s));
        for id in leftover {
            core.cancel_unstarted(id, CancelReason::Shutdown, &mut self.scratch);
        }
    }

    /// Handles one event under its own `catch_unwind`. A panic is an engine bug: it poisons
    /// the engine, and the rest of the batch is still handled, so that every other completion
    /// marks its worker idle (or shutdown would wait for it forever) and every other ready task
    /// is queued or cancelled.
    fn guarded(&mut self, core: &Core, event: impl FnOnce(&mut Self)) {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| event(self))) {
            // The work lists may hold a half-processed event's slots.
            self.scratch = GraphScratch::default();
            core.poison(&format!(
                "scheduler event handling panicked: {}",
                into_panic_message(payload)
            ));
        }
    }

    // ---- Completion processing (`docs/engine-protocols.md` §6) ----------------------------------

    fn on_completion(&mut self, core: &Core, c: MemberCompletion) {
        self.completions += 1;
        self.mark_idle(core, c.worker);
        let failure = match c.result {
            Ok(()) => None,
            Err(f) => match record_member_failure(core, c.slot, c.member, c.worker, f) {
                Some(f) => Some(f),
                None => {
                    quietly(
                        || tracing::debug!(slot = %c.slot, "failed completion for a stale slot ignored"),
                    );
                    return;
                }
            },
        };
        let Some(slot) = core.ring.slot(c.slot) else {
            quietly(|| tracing::debug!(slot = %c.slot, "completion for a stale slot ignored"));
            return;
        };
        let s = &mut self.scratch;
        let done =
            slot.complete_member(c.slot, c.member, failure, &mut s.consumers, &mut s.releases);
        match done {
            MemberDone::Stale => {
                quietly(
                    || tracing::debug!(slot = %c.slot, member = c.member, "stale completion ignored"),
                );
            }
            MemberDone::Waiting => {}
            MemberDone::Finished { failure, reclaim, reads } => {
                match failure {
                    None => {
                        self.release_consumers(core);
                        // Pass step 5 performs these after the dispatch; a task without reader
                        // entries owes no retirement, so a pass owing nothing else skips step 5.
                        if reads {
                            self.deferred.retired_readers.push(c.slot);
                        }
                        self.deferred.releases.append(&mut self.scratch.releases);
                        if let Some(run) = reclaim {
                            self.deferred.reclaims.push((c.slot, run));
                        }
                    }
                    Some(f) => {
                        if reads {
                            core.retire_reads(c.slot);
                        }
                        core.propagate_failure(root_of(&f), &mut self.scratch);
                        core.release_all(&mut self.scratch.releases);
                        if let Some(run) = reclaim {
                            core.reclaim(c.slot, run);
                        }
                    }
                }
            }
        }
    }

    /// Successful finish: one fanin release per consumer; ready ones go to their own queue.
    fn release_consumers(&mut self, core: &Core) {
        let mut consumers = std::mem::take(&mut self.scratch.consumers);
        for id in consumers.drain(..) {
            let Some(slot) = core.ring.slot(id) else { continue };
            if let Fanin::Ready(route) = slot.release_fanin(id) {
                self.route(core, id, route);
            }
        }
        self.scratch.consumers = consumers;
    }

    fn mark_idle(&mut self, core: &Core, who: WorkerSlot) {
        let flag = match who {
            WorkerSlot::NextLevel(i) => self.next_level.get_mut(i as usize).map(|q| &mut q.busy),
            WorkerSlot::Sub(i) => self.sub_busy.get_mut(i as usize),
        };
        match flag {
            Some(busy) if *busy => {
                *busy = false;
                self.busy -= 1;
                core.mailbox(who).set_idle();
            }
            _ => debug_assert!(false, "completion from idle worker {who:?}"),
        }
    }

    // ---- Routing and dispatch (`docs/engine-protocols.md` §6) -----------------------------------

    fn route(&mut self, core: &Core, id: SlotId, route: Route) {
        if self.exited {
            // The scheduler has stopped for good: the task can never be dispatched.
            core.cancel_unstarted(id, CancelReason::Shutdown, &mut self.scratch);
            return;
        }
        match route {
            Route::Single { worker } => match self.next_level.get_mut(worker as usize) {
                Some(q) => q.fifo.push_back(id),
                None => debug_assert!(false, "route to unknown worker index {worker}"),
            },
            Route::Group => self.groups.push_back(id),
            Route::Sub { size } => self.subs.push_back((id, size)),
            Route::Unrouted => debug_assert!(false, "{id} became ready without a route"),
        }
    }

    fn dispatch_pass(&mut self, core: &Core) {
        for q in &mut self.next_level {
            q.reserved = false;
        }
        self.dispatch_groups(core);
        self.dispatch_singles(core);
        self.dispatch_subs(core);
    }

    fn dispatch_groups(&mut self, core: &Core) {
        while let Some(&head) = self.groups.front() {
            if !is_ready(core, head) || !self.load_targets(core, head) {
                self.groups.pop_front();
                continue;
            }
            let all_idle = self.targets.iter().all(|&t| !self.next_level[t as usize].busy);
            if !all_idle {
                for &t in &self.targets {
                    self.next_level[t as usize].reserved = true;
                }
                return;
            }
            self.groups.pop_front();
            let Some(slot) = core.ring.slot(head) else { continue };
            if !slot.claim_dispatch(head) {
                continue;
            }
            slot.mark_members_running(head);
            for (member, &t) in self.targets.iter().enumerate() {
                self.next_level[t as usize].busy = true;
                self.busy += 1;
                self.dispatched += 1;
                core.next_level[t as usize].mailbox.send_task(head, member as u32);
            }
        }
    }

    /// Loads the group's target indices into `self.targets`; `false` if the slot is stale.
    fn load_targets(&mut self, core: &Core, id: SlotId) -> bool {
        self.targets.clear();
        let Some(slot) = core.ring.slot(id) else { return false };
        let payload = slot.payload.read();
        if payload.id != Some(id) {
            return false;
        }
        self.targets.extend(payload.members.iter().map(|m| m.target));
        true
    }

    fn dispatch_singles(&mut self, core: &Core) {
        for (w, q) in self.next_level.iter_mut().enumerate() {
            if q.busy || q.reserved {
                continue;
            }
            while let Some(id) = q.fifo.pop_front() {
                let Some(slot) = core.ring.slot(id) else { continue };
                if slot.claim_dispatch(id) {
                    q.busy = true;
                    self.busy += 1;
                    self.dispatched += 1;
                    core.next_level[w].mailbox.send_task(id, 0);
                    break;
                }
            }
        }
    }

    fn dispatch_subs(&mut self, core: &Core) {
        while let Some(&(head, size)) = self.subs.front() {
            if !is_ready(core, head) {
                self.subs.pop_front();
                continue;
            }
            self.idle_subs.clear();
            self.idle_subs.extend(
                self.sub_busy.iter().enumerate().filter(|(_, b)| !**b).map(|(i, _)| i as u32),
            );
            if self.idle_subs.len() < size as usize {
                return;
            }
            self.subs.pop_front();
            let Some(slot) = core.ring.slot(head) else { continue };
            if !slot.claim_dispatch(head) {
                continue;
            }
            if size > 1 {
                slot.mark_members_running(head);
            }
            for member in 0..size {
                let w = self.idle_subs[member as usize];
                self.sub_busy[w as usize] = true;
                self.busy += 1;
                self.dispatched += 1;
                core.sub[w as usize].mailbox.send_task(head, member);
            }
        }
    }

    // ---- Diagnostics ----------------------------------------------------------------------------

    /// Opens, closes or reports a stall episode (`docs/engine-protocols.md` §6). Returns whether a
    /// new episode opened: the scheduler thread must then learn its deadline, even when it replaced
    /// an episode that was already reported (after which the thread sleeps without a deadline).
    fn check_stall(&mut self, core: &Core) -> bool {
        let Some(&head) = self.groups.front() else {
            self.stall = None;
            return false;
        };
        let held = !self.stopping
            && is_ready(core, head)
            && self.load_targets(core, head)
            && self.targets.iter().any(|&t| {
                let q = &self.next_level[t as usize];
                !q.busy && !q.fifo.is_empty()
            });
        if !held {
            self.stall = None;
            return false;
        }
        let now = Instant::now();
        let due = match &mut self.stall {
            Some(s) if s.head == head => {
                let due = !s.reported && stall_due(s.since, core).is_some_and(|d| now >= d);
                s.reported |= due;
                due.then_some(now - s.since)
            }
            _ => {
                self.stall = Some(Stall { head, since: now, reported: false });
                return true;
            }
        };
        if let Some(blocked) = due {
            self.report_stall(core, head, blocked);
        }
        false
    }

    /// When the scheduler thread must next look at an open, unreported stall episode.
    fn stall_deadline(&self, core: &Core) -> Option<Instant> {
        self.stall.as_ref().filter(|s| !s.reported).and_then(|s| stall_due(s.since, core))
    }

    #[cold]
    fn report_stall(&self, core: &Core, head: SlotId, blocked: Duration) {
        let busy: Vec<String> = self
            .targets
            .iter()
            .filter(|&&t| self.next_level[t as usize].busy)
            .map(|&t| core.next_level[t as usize].worker.to_string())
            .collect();
        let held: Vec<String> = self
            .targets
            .iter()
            .filter(|&&t| !self.next_level[t as usize].busy)
            .flat_map(|&t| self.next_level[t as usize].fifo.iter())
            .filter_map(|&id| core.task_of(id))
            .map(|t| t.to_string())
            .collect();
        let task = core.task_of(head).map_or_else(|| head.to_string(), |t| t.to_string());
        quietly(|| {
            tracing::warn!(
                level = core.level,
                "group task {task} blocked for {blocked:?} on busy targets [{}] while its idle \
                 targets hold queued singles [{}]",
                busy.join(", "),
                held.join(", ")
            )
        });
    }

    fn publish_counters(&self, core: &Core) {
        // Relaxed throughout: statistics written only under the scheduler lock.
        let c = &core.counters;
        c.iterations.store(self.passes, Ordering::Relaxed);
        c.dispatched.store(self.dispatched, Ordering::Relaxed);
        c.completions.store(self.completions, Ordering::Relaxed);
        c.queued_groups.store(self.groups.len() as u32, Ordering::Relaxed);
        c.queued_sub.store(self.subs.len() as u32, Ordering::Relaxed);
        for (q, info) in self.next_level.iter().zip(&core.next_level) {
            info.queued.store(q.fifo.len() as u32, Ordering::Relaxed);
        }
    }

    /// After a panic in a pass outside event handling (dispatch, stall bookkeeping): drop
    /// whatever the pass held (busy flags stay: a worker marked busy still reports its
    /// completion). Events themselves are handled one by one under [`SchedState::guarded`], so
    /// none is lost here.
    #[cold]
    fn recover(&mut self) {
        self.batch.ready.clear();
        self.batch.completions.clear();
        self.scratch = GraphScratch::default();
    }
}

/// When an episode open since `since` becomes reportable; `None` (never) when the configured
/// delay reaches past the clock's range, which is how `Duration::MAX` switches warnings off.
fn stall_due(since: Instant, core: &Core) -> Option<Instant> {
    since.checked_add(core.stall_warn_after)
}

fn is_ready(core: &Core, id: SlotId) -> bool {
    core.ring.slot(id).and_then(|s| s.state.get(id)) == Some(TaskState::Ready)
}

/// Builds the member's `TaskFailure` and records it on the run at once (`docs/engine-protocols.md`
/// §2).
fn record_member_failure(
    core: &Core,
    id: SlotId,
    member: u32,
    worker: WorkerSlot,
    f: EndpointFailure,
) -> Option<Arc<TaskFailure>> {
    let slot = core.ring.slot(id)?;
    let (head, run, group) = {
        let s = slot.sync.lock();
        let head = s.head.filter(|h| h.id == id)?;
        (head, s.run.clone()?, s.members.len() > 1)
    };
    let mut failure = TaskFailure::new(head.task, head.callable, f.mechanism, f.message)
        .on_worker(core.worker(worker).worker);
    if group {
        failure = failure.for_member(member);
    }
    failure.device_code = f.device_code;
    failure.source = f.source;
    failure.cause = f.cause;
    let failure = Arc::new(failure);
    quietly(|| tracing::debug!(task = %head.task, member, "member failed: {}", failure.message));
    run.record(RunFailure::Task(Arc::clone(&failure)));
    Some(failure)
}

impl Core {
    /// Runs one pass under the held scheduler lock, poisoning the engine if it panics.
    pub(crate) fn run_pass(&self, state: &mut MutexGuard<'_, SchedState>, own: Own) {
        let outcome = catch_unwind(AssertUnwindSafe(|| state.pass(self, own)));
        match outcome {
            Ok(false) => {}
            Ok(true) => self.attention.set(),
            Err(payload) => {
                state.recover();
                self.poison(&format!("scheduler pass panicked: {}", into_panic_message(payload)));
                // The pass never said whether the scheduler thread must look (a stop that this
                // pass's completions made due, say): it looks, once too often at worst.
                self.attention.set();
            }
        }
    }

    /// Combining step 2 (see `inbox`).
    pub(crate) fn drive(&self) {
        drive(&self.inbox, &self.sched, |state| self.run_pass(state, Own::Nothing));
    }

    /// Step 8 for an endpoint thread that held the idle-driver role: gives it back, then runs
    /// the passes of whatever was left for it.
    pub(crate) fn give_back_idle_driver(&self, state: &mut EndpointTake) {
        self.idle_driver.give_back_then_drive(
            &self.inbox,
            &self.held_ready,
            &mut state.refused,
            &self.sched,
            |state| self.run_pass(state, Own::Nothing),
        );
        self.cancel_refused(&mut state.refused, &mut state.graph);
    }

    /// Whether a pass seems to be running (a hint for the idle driver's spin).
    pub(crate) fn pass_in_progress(&self) -> bool {
        self.sched.is_locked()
    }

    /// Delivers a member completion (combining step 1).
    pub(crate) fn deliver_completion(&self, completion: MemberCompletion) {
        match self.sched.try_lock() {
            Some(mut state) => self.run_pass(&mut state, Own::Completion(completion)),
            None => {
                if self.inbox.push_completion(completion).is_err() {
                    // Cannot happen: the inbox closes only when no worker is busy. Logged
                    // quietly: this runs on an endpoint thread, outside any pass.
                    quietly(|| {
                        tracing::error!(level = self.level, "completion refused by a closed inbox")
                    });
                }
            }
        }
        self.drive();
    }

    /// Shutdown step 4: no new dispatch from the next pass on; the scheduler thread exits once
    /// no worker is busy.
    pub(crate) fn request_stop(&self) {
        self.inbox.request_stop();
        self.drive();
        self.attention.set();
    }
}

/// Body of the scheduler thread (module docs, thread steps 1–3).
///
/// Everything it does runs under `catch_unwind`: a panic outside a pass is an engine bug as
/// well, and poisons the engine instead of silently ending the thread. `scheduler_exit` is set
/// from a drop guard, so shutdown never waits for a thread that is gone, however it ended.
pub(crate) fn scheduler_main(core: Arc<Core>) {
    /// Sets `scheduler_exit` when the thread's body ends, by return or by unwinding.
    struct ExitGuard<'a>(&'a Core);

    impl Drop for ExitGuard<'_> {
        fn drop(&mut self) {
            self.0.scheduler_exit.set();
        }
    }

    let _exit = ExitGuard(&core);
    // A tracing layer that panics entering or leaving the thread's span is no engine bug: the
    // span is entered and left apart from the loop (which then runs without it), so that such
    // a panic neither skips the loop nor poisons the engine.
    let span = thread_span(|| tracing::debug_span!("scheduler", level = core.level).entered());
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| scheduler_loop(&core))) {
        core.poison(&format!("scheduler thread panicked: {}", into_panic_message(payload)));
    }
    drop_quietly(span);
}

/// Thread steps 1–3, until the scheduler has stopped for good.
fn scheduler_loop(core: &Core) {
    let mut deadline = None;
    loop {
        core.attention.wait(deadline, true);
        let exited = locked_then_drive(
            &core.inbox,
            &core.sched,
            |state| {
                core.run_pass(state, Own::Nothing);
                #[cfg(test)]
                if let Some(hook) = state.thread_hook.as_mut() {
                    hook(core);
                }
                if state.stopping && state.busy == 0 {
                    state.exit(core);
                    return true;
                }
                deadline = state.stall_deadline(core);
                false
            },
            |state| core.run_pass(state, Own::Nothing),
        );
        if exited {
            return;
        }
    }
}

#[cfg(all(test, not(simpler_loom)))]
pub(crate) mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use simpler_types::{
        CallConfig, CallableId, CallableKind, CallableNamespace, RunId, SlotId, TaskArgs, TaskId,
        TaskState, WorkerId, WorkerType,
    };

    use super::*;
    use crate::endpoint::{DispatchedMember, Endpoint, EndpointCaps};
    use crate::engine::{Engine, EngineConfig};
    use crate::outcome::RunOutcome;

    /// A NEXT_LEVEL endpoint that finishes a member only when the test sends it a token.
    pub(crate) struct Gate(pub(crate) mpsc::Receiver<()>);

    impl Endpoint for Gate {
        fn caps(&self) -> EndpointCaps {
            EndpointCaps {
                worker_type: WorkerType::NextLevel,
                id: WorkerId(0),
                remote: false,
                name: "gate".into(),
            }
        }

        fn run(&mut self, _: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
            let _ = self.0.recv_timeout(Duration::from_secs(20));
            Ok(())
        }
    }

    pub(crate) fn gated_engine() -> (Engine, mpsc::Sender<()>) {
        let (tx, rx) = mpsc::channel();
        let engine = Engine::start(EngineConfig {
            next_level: vec![Box::new(Gate(rx))],
            ..EngineConfig::default()
        })
        .unwrap();
        (engine, tx)
    }

    pub(crate) fn chip() -> CallableId {
        CallableId::new([1; 32], CallableKind::Chip, CallableNamespace::LocalChip)
    }

    /// Begins and closes a run of one task, and waits until that task runs on the gate.
    pub(crate) fn one_running_task(engine: &Engine) -> (RunId, TaskId) {
        let mut b = engine.begin_run().unwrap();
        let t = b.submit_next_level(
            &chip(),
            TaskArgs::new(),
            &CallConfig::default(),
            WorkerId(0),
            None,
        );
        let t = t.unwrap();
        let run = b.close();
        wait_until(|| engine.task_snapshot(t).unwrap().state == TaskState::Running);
        (run, t)
    }

    pub(crate) fn slot_of(engine: &Engine, task: simpler_types::TaskId) -> SlotId {
        let run = engine.core().registry.find(task.run).unwrap();
        run.lock().task_slots[task.seq as usize]
    }

    pub(crate) fn wait_until(mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(Instant::now() < deadline, "condition never held");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn c26_c47_a_stale_completion_or_release_is_ignored_and_completes_no_live_task() {
        let (engine, tx) = gated_engine();
        let cfg = CallConfig::default();
        let mut b = engine.begin_run().unwrap();
        let first = b.submit_next_level(&chip(), TaskArgs::new(), &cfg, WorkerId(0), None).unwrap();
        let old = slot_of(&engine, first);
        tx.send(()).unwrap();
        assert_eq!(engine.wait(b.close()).unwrap(), RunOutcome::Completed);

        // The recycled entry now holds a running task of the next run.
        let mut b = engine.begin_run().unwrap();
        let second =
            b.submit_next_level(&chip(), TaskArgs::new(), &cfg, WorkerId(0), None).unwrap();
        let new = slot_of(&engine, second);
        assert_eq!((new.index, new.generation), (old.index, old.generation + 1));
        wait_until(|| engine.task_snapshot(second).unwrap().state == TaskState::Running);

        let core = engine.core();
        let completion = MemberCompletion {
            slot: old,
            member: 0,
            worker: WorkerSlot::NextLevel(0),
            result: Err(EndpointFailure::task_failed("stale")),
        };
        // Deliver under the lock the worker itself would use, as if the stale report had come
        // from the worker that now runs `second` (it stays marked busy afterwards).
        {
            let mut state = core.sched.lock();
            core.run_pass(&mut state, Own::Completion(completion));
            state.next_level[0].busy = true;
            state.busy += 1;
        }
        // A stale reference release (conformance 26) is ignored as well.
        let before = engine.task_snapshot(second).unwrap().fanout_released;
        core.release_all(&mut vec![old]);
        assert_eq!(engine.task_snapshot(second).unwrap().fanout_released, before);
        assert_eq!(engine.task_snapshot(second).unwrap().state, TaskState::Running);
        assert!(b.status().failure.is_none(), "the stale failure was not recorded");
        assert!(!engine.is_poisoned());
        tx.send(()).unwrap();
        assert_eq!(engine.wait(b.close()).unwrap(), RunOutcome::Completed);
    }

    #[test]
    fn a_completion_delivered_while_the_scheduler_thread_holds_the_lock_is_not_stranded() {
        // The scheduler thread holds the lock (its hook waits) while the worker delivers the
        // run's only completion, which must then be left in the inbox. It is the run's last
        // event: unless the scheduler thread drives after unlocking, the run never finishes.
        let (engine, tx) = gated_engine();
        let (run, _) = one_running_task(&engine);
        let core = engine.core();
        let (entered_tx, entered_rx) = mpsc::channel();
        core.sched.lock().thread_hook = Some(Box::new(move |core: &Core| {
            let _ = entered_tx.send(());
            let deadline = Instant::now() + Duration::from_secs(20);
            while !core.inbox.pending() && Instant::now() < deadline {
                std::thread::yield_now();
            }
        }));
        core.attention.set();
        entered_rx.recv_timeout(Duration::from_secs(20)).unwrap();
        tx.send(()).unwrap();
        let outcome = engine.wait_timeout(run, Duration::from_secs(20)).unwrap();
        assert_eq!(outcome, Some(RunOutcome::Completed), "the completion was stranded");
        core.sched.lock().thread_hook = None;
    }

    #[test]
    fn a_panic_on_the_scheduler_thread_outside_a_pass_poisons_the_engine_and_shutdown_finishes() {
        let (engine, tx) = gated_engine();
        let engine = Arc::new(engine);
        let (run, _) = one_running_task(&engine);
        let core = engine.core();
        core.sched.lock().thread_hook = Some(Box::new(|_: &Core| panic!("deliberate")));
        core.attention.set();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !engine.is_poisoned() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if !engine.is_poisoned() {
            // Dropping the engine would wait for a scheduler thread that is gone.
            std::mem::forget(engine);
            panic!("the scheduler thread's panic did not poison the engine");
        }
        assert!(matches!(engine.wait(run).unwrap(), RunOutcome::Failed(_)));
        core.sched.lock().thread_hook = None;
        tx.send(()).unwrap();
        let (done_tx, done_rx) = mpsc::channel();
        let stopper = Arc::clone(&engine);
        std::thread::spawn(move || {
            let _ = done_tx.send(stopper.shutdown(Instant::now() + Duration::from_secs(20)));
        });
        let stopped = done_rx.recv_timeout(Duration::from_secs(20)).expect("shutdown finishes");
        assert!(stopped.is_ok(), "{stopped:?}");
    }

    #[cfg(debug_assertions)]
    #[test]
    fn a_panicking_event_does_not_drop_the_completions_batched_after_it() {
        let (engine, tx) = gated_engine();
        let (run, _) = one_running_task(&engine);
        let core = engine.core();
        let mut state = core.sched.lock();
        // With the lock held here, the worker's genuine completion waits in the inbox; put a
        // forged one from an unknown worker (an internal assertion fails on it) in front of it.
        tx.send(()).unwrap();
        wait_until(|| core.inbox.pending());
        let mut genuine = InboxBatch::default();
        core.inbox.take(&mut genuine);
        let forged = MemberCompletion {
            slot: SlotId::new(999, 1),
            member: 0,
            worker: WorkerSlot::NextLevel(7),
            result: Ok(()),
        };
        core.inbox.push_completion(forged).unwrap();
        for c in genuine.completions {
            core.inbox.push_completion(c).unwrap();
        }
        core.run_pass(&mut state, Own::Nothing);
        let busy = state.busy;
        drop(state);
        assert!(engine.is_poisoned());
        if busy != 0 {
            // Shutdown would wait forever for the worker the lost completion should have freed.
            std::mem::forget(engine);
            panic!("the completion batched after the panicking one was dropped");
        }
        assert!(matches!(engine.wait(run).unwrap(), RunOutcome::Failed(_)));
        assert!(engine.shutdown(Instant::now() + Duration::from_secs(20)).is_ok());
    }

    #[cfg(debug_assertions)]
    #[test]
    fn a_panicking_scheduler_pass_poisons_the_engine_and_fails_live_runs() {
        use crate::error::SchedError;

        let (engine, tx) = gated_engine();
        let (run, _) = one_running_task(&engine);
        // The first forged completion makes the scheduler believe worker 0 idle; the second,
        // from a worker it believes idle, trips an internal assertion inside the pass.
        let core = engine.core();
        for _ in 0..2 {
            core.deliver_completion(MemberCompletion {
                slot: SlotId::new(999, 1),
                member: 0,
                worker: WorkerSlot::NextLevel(0),
                result: Ok(()),
            });
        }
        assert!(engine.is_poisoned());
        match engine.wait(run).unwrap() {
            RunOutcome::Failed(f) => assert!(matches!(&*f, RunFailure::Internal { .. }), "{f}"),
            RunOutcome::Completed => panic!("a poisoned engine completed a run"),
        }
        assert!(matches!(engine.begin_run(), Err(SchedError::EnginePoisoned)));
        tx.send(()).unwrap();
        assert!(engine.shutdown(Instant::now() + Duration::from_secs(20)).is_ok());
    }
}
