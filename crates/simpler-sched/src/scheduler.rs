//! The scheduler thread: queues, dispatch passes, completion processing (spec 30 §6).
//!
//! # Loop (edge-triggered; it never spins on unplaceable work)
//!
//! 1. Take events from the inbox (spinning briefly, then parking; with a deadline only while a
//!    stall episode is open and not yet reported).
//! 2. Process completions in arrival order: mark the worker idle first (idleness is owned by the
//!    scheduler, so it is never visible before its completion — hazard 7), then the member's
//!    outcome (`complete_member`), then releases, fanin releases and poisoning. Consumers that
//!    become ready are routed directly.
//! 3. Route each ready task from the inbox: NEXT_LEVEL single → its target's FIFO, NEXT_LEVEL
//!    group → the group FIFO, SUB → the SUB FIFO.
//! 4. Unless stopping, one dispatch pass: groups, then singles, then SUB.
//! 5. If stopping and no worker is busy: close the inbox (taking what arrived meanwhile),
//!    cancel every task still queued (it can never be dispatched now), and exit.
//!
//! Work that cannot be placed is retried only when an event arrives; the only event that can
//! unblock it is a completion. The body of each iteration runs under `catch_unwind`: a panic is
//! an engine bug that poisons the engine (every non-terminal run fails with an internal error,
//! `begin_run` refuses), after which the loop keeps serving completions so shutdown can finish.
//!
//! # Dispatch pass
//!
//! 1. **Groups**, strict FIFO: a stale or non-`Ready` head is dropped. If every target of the
//!    head is idle, claim it (`Ready → Running`), mark its members running and its targets
//!    busy, send member i to target i, and look at the next head. Otherwise the head is blocked:
//!    it **reserves all its targets**, busy or idle, for the rest of the pass, and group
//!    processing stops. Nothing is dispatched partially.
//! 2. **Singles**: each NEXT_LEVEL worker, in registration order, that is neither busy nor
//!    reserved pops its own FIFO until one claim succeeds (stale and non-`Ready` entries are
//!    dropped). At most one per worker per pass; no stealing.
//! 3. **SUB**, strict FIFO: the head needs `size` distinct idle SUB workers; with too few the
//!    pass stops. Otherwise member i goes to the i-th idle SUB worker, lowest index first.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Instant;

use smallvec::SmallVec;

use simpler_types::{CancelReason, RunFailure, SlotId, TaskFailure, TaskState};

use crate::core::Core;
use crate::endpoint::{EndpointFailure, panic_message};
use crate::graph::GraphScratch;
use crate::inbox::{InboxBatch, MemberCompletion, WorkerSlot};
use crate::slot::Route;
use crate::sync::Ordering;
use crate::task_protocol::{Fanin, MemberDone, root_of};

/// Scheduler-private state of one NEXT_LEVEL worker.
#[derive(Default)]
struct NextLevelQueue {
    fifo: VecDeque<SlotId>,
    busy: bool,
    /// Reserved by a blocked group head for the rest of the current pass.
    reserved: bool,
}

/// An open stall episode: the group head has been blocked since `since` while an idle target
/// it reserves holds queued singles.
struct Stall {
    head: SlotId,
    since: Instant,
    reported: bool,
}

/// The scheduler thread's state.
pub(crate) struct Scheduler {
    core: Arc<Core>,
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
    stall: Option<Stall>,
    iterations: u64,
    dispatched: u64,
    completions: u64,
}

impl Scheduler {
    /// A scheduler for the workers registered in `core`.
    pub(crate) fn new(core: Arc<Core>) -> Scheduler {
        Scheduler {
            next_level: core.next_level.iter().map(|_| NextLevelQueue::default()).collect(),
            sub_busy: vec![false; core.sub.len()],
            core,
            groups: VecDeque::new(),
            subs: VecDeque::new(),
            batch: InboxBatch::default(),
            scratch: GraphScratch::default(),
            targets: SmallVec::new(),
            idle_subs: SmallVec::new(),
            busy: 0,
            stopping: false,
            stall: None,
            iterations: 0,
            dispatched: 0,
            completions: 0,
        }
    }

    /// The thread body: loops until stopped and drained.
    pub(crate) fn run(mut self) {
        let _span = tracing::debug_span!("scheduler", level = self.core.level).entered();
        loop {
            let deadline = self
                .stall
                .as_ref()
                .filter(|s| !s.reported)
                .map(|s| s.since + self.core.stall_warn_after);
            let got = self.core.inbox.take(&mut self.batch, deadline);
            let step = catch_unwind(AssertUnwindSafe(|| self.iteration(got)));
            if let Err(payload) = step {
                self.recover(&panic_message(payload.as_ref()));
            }
            if self.stopping && self.busy == 0 {
                break;
            }
        }
        self.exit();
        self.core.scheduler_exit.signal();
    }

    /// Steps 2–4 of the loop for one take.
    fn iteration(&mut self, got_events: bool) {
        if got_events {
            self.iterations += 1;
            let mut completions = std::mem::take(&mut self.batch.completions);
            for c in completions.drain(..) {
                self.on_completion(c);
            }
            self.batch.completions = completions;
            let mut ready = std::mem::take(&mut self.batch.ready);
            for r in ready.drain(..) {
                self.route(r.slot, r.route);
            }
            self.batch.ready = ready;
            if std::mem::take(&mut self.batch.stop) {
                self.stopping = true;
            }
        }
        if got_events && !self.stopping {
            self.dispatch_pass();
        }
        self.check_stall();
        self.publish_counters();
    }

    /// After a panic in the loop body: poison the engine and drop whatever the iteration held.
    #[cold]
    fn recover(&mut self, message: &str) {
        self.core.poison(&format!("scheduler panicked: {message}"));
        self.batch.ready.clear();
        self.batch.completions.clear();
        self.scratch = GraphScratch::default();
        // Busy flags stay as they are: a worker marked busy still reports its completion.
    }

    /// Loop step 5.
    fn exit(&mut self) {
        self.core.inbox.close(&mut self.batch);
        let completions = std::mem::take(&mut self.batch.completions);
        for c in completions {
            self.on_completion(c);
        }
        for r in std::mem::take(&mut self.batch.ready) {
            self.route(r.slot, r.route);
        }
        let mut leftover: Vec<SlotId> = Vec::new();
        for q in &mut self.next_level {
            leftover.extend(q.fifo.drain(..));
        }
        leftover.extend(self.groups.drain(..));
        leftover.extend(self.subs.drain(..).map(|(s, _)| s));
        for id in leftover {
            self.core.cancel_ready(id, CancelReason::Shutdown, &mut self.scratch);
        }
        self.publish_counters();
    }

    // ---- Completion processing (spec 30 §6.4) ---------------------------------------------

    fn on_completion(&mut self, c: MemberCompletion) {
        self.completions += 1;
        self.mark_idle(c.worker);
        if !self.core.ring.is_live(c.slot) {
            tracing::debug!(slot = %c.slot, "completion for a stale slot ignored");
            return;
        }
        let failure = match c.result {
            Ok(()) => None,
            Err(f) => match self.record_member_failure(c.slot, c.member, c.worker, f) {
                Some(f) => Some(f),
                None => {
                    tracing::debug!(slot = %c.slot, "failed completion for a stale slot ignored");
                    return;
                }
            },
        };
        let s = &mut self.scratch;
        let Some(slot) = self.core.ring.slot(c.slot) else { return };
        let done =
            slot.complete_member(c.slot, c.member, failure, &mut s.consumers, &mut s.releases);
        match done {
            MemberDone::Stale => {
                tracing::debug!(slot = %c.slot, member = c.member, "stale completion ignored");
            }
            MemberDone::Waiting => {}
            MemberDone::Finished { failure, reclaim } => {
                match failure {
                    None => self.release_consumers(),
                    Some(f) => self.core.propagate_failure(root_of(&f), &mut self.scratch),
                }
                self.core.release_all(&mut self.scratch.releases);
                if let Some(run) = reclaim {
                    self.core.reclaim(c.slot, run);
                }
            }
        }
    }

    /// Builds the member's `TaskFailure` and records it on the run at once (spec 30 §2.4).
    fn record_member_failure(
        &self,
        id: SlotId,
        member: u32,
        worker: WorkerSlot,
        f: EndpointFailure,
    ) -> Option<Arc<TaskFailure>> {
        let slot = self.core.ring.slot(id)?;
        let (head, run, group) = {
            let s = slot.sync.lock();
            let head = s.head.filter(|h| h.id == id)?;
            (head, s.run.clone()?, s.members.len() > 1)
        };
        let mut failure = TaskFailure::new(head.task, head.callable, f.mechanism, f.message)
            .on_worker(self.core.worker(worker).worker);
        if group {
            failure = failure.for_member(member);
        }
        failure.device_code = f.device_code;
        failure.cause = f.cause;
        let failure = Arc::new(failure);
        tracing::debug!(task = %head.task, member, "member failed: {}", failure.message);
        run.record(RunFailure::Task(Arc::clone(&failure)));
        Some(failure)
    }

    /// Successful finish: one fanin release per consumer; ready ones go to their own queue.
    fn release_consumers(&mut self) {
        let mut consumers = std::mem::take(&mut self.scratch.consumers);
        for id in consumers.drain(..) {
            let Some(slot) = self.core.ring.slot(id) else { continue };
            if let Fanin::Ready(route) = slot.release_fanin(id) {
                self.route(id, route);
            }
        }
        self.scratch.consumers = consumers;
    }

    fn mark_idle(&mut self, who: WorkerSlot) {
        let flag = match who {
            WorkerSlot::NextLevel(i) => self.next_level.get_mut(i as usize).map(|q| &mut q.busy),
            WorkerSlot::Sub(i) => self.sub_busy.get_mut(i as usize),
        };
        match flag {
            Some(busy) if *busy => {
                *busy = false;
                self.busy -= 1;
                self.core.mailbox(who).set_idle();
            }
            _ => debug_assert!(false, "completion from idle worker {who:?}"),
        }
    }

    // ---- Routing and dispatch (spec 30 §6.3) ----------------------------------------------

    fn route(&mut self, id: SlotId, route: Route) {
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

    fn is_ready(&self, id: SlotId) -> bool {
        self.core.ring.slot(id).and_then(|s| s.state.get(id)) == Some(TaskState::Ready)
    }

    fn dispatch_pass(&mut self) {
        for q in &mut self.next_level {
            q.reserved = false;
        }
        self.dispatch_groups();
        self.dispatch_singles();
        self.dispatch_subs();
    }

    fn dispatch_groups(&mut self) {
        while let Some(&head) = self.groups.front() {
            if !self.is_ready(head) || !self.load_targets(head) {
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
            let Some(slot) = self.core.ring.slot(head) else { continue };
            if !slot.claim_dispatch(head) {
                continue;
            }
            slot.mark_members_running(head);
            for (member, &t) in self.targets.iter().enumerate() {
                self.next_level[t as usize].busy = true;
                self.busy += 1;
                self.dispatched += 1;
                self.core.next_level[t as usize].mailbox.send_task(head, member as u32);
            }
        }
    }

    /// Loads the group's target indices into `self.targets`; `false` if the slot is stale.
    fn load_targets(&mut self, id: SlotId) -> bool {
        self.targets.clear();
        let Some(slot) = self.core.ring.slot(id) else { return false };
        let payload = slot.payload.read();
        if payload.id != Some(id) {
            return false;
        }
        self.targets.extend(payload.members.iter().map(|m| m.target));
        true
    }

    fn dispatch_singles(&mut self) {
        for (w, q) in self.next_level.iter_mut().enumerate() {
            if q.busy || q.reserved {
                continue;
            }
            while let Some(id) = q.fifo.pop_front() {
                let Some(slot) = self.core.ring.slot(id) else { continue };
                if slot.claim_dispatch(id) {
                    q.busy = true;
                    self.busy += 1;
                    self.dispatched += 1;
                    self.core.next_level[w].mailbox.send_task(id, 0);
                    break;
                }
            }
        }
    }

    fn dispatch_subs(&mut self) {
        while let Some(&(head, size)) = self.subs.front() {
            if !self.is_ready(head) {
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
            let Some(slot) = self.core.ring.slot(head) else { continue };
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
                self.core.sub[w as usize].mailbox.send_task(head, member);
            }
        }
    }

    // ---- Diagnostics -----------------------------------------------------------------------

    /// Opens, closes or reports a stall episode (spec 30 §6.3).
    fn check_stall(&mut self) {
        let Some(&head) = self.groups.front() else {
            self.stall = None;
            return;
        };
        let held = !self.stopping
            && self.is_ready(head)
            && self.load_targets(head)
            && self.targets.iter().any(|&t| {
                let q = &self.next_level[t as usize];
                !q.busy && !q.fifo.is_empty()
            });
        if !held {
            self.stall = None;
            return;
        }
        let now = Instant::now();
        let due = match &mut self.stall {
            Some(s) if s.head == head => {
                let due = !s.reported && now >= s.since + self.core.stall_warn_after;
                s.reported |= due;
                due.then_some(now - s.since)
            }
            _ => {
                self.stall = Some(Stall { head, since: now, reported: false });
                None
            }
        };
        if let Some(blocked) = due {
            self.report_stall(head, blocked);
        }
    }

    #[cold]
    fn report_stall(&self, head: SlotId, blocked: std::time::Duration) {
        let task = self.core.task_of(head);
        let busy: Vec<String> = self
            .targets
            .iter()
            .filter(|&&t| self.next_level[t as usize].busy)
            .map(|&t| self.core.next_level[t as usize].worker.to_string())
            .collect();
        let held: Vec<String> = self
            .targets
            .iter()
            .filter(|&&t| !self.next_level[t as usize].busy)
            .flat_map(|&t| self.next_level[t as usize].fifo.iter())
            .filter_map(|&id| self.core.task_of(id))
            .map(|t| t.to_string())
            .collect();
        tracing::warn!(
            level = self.core.level,
            "group task {} blocked for {blocked:?} on busy targets [{}] while its idle targets hold \
             queued singles [{}]",
            task.map(|t| t.to_string()).unwrap_or_else(|| head.to_string()),
            busy.join(", "),
            held.join(", ")
        );
    }

    fn publish_counters(&self) {
        // Relaxed throughout: statistics with a single writer (this thread).
        let c = &self.core.counters;
        c.iterations.store(self.iterations, Ordering::Relaxed);
        c.dispatched.store(self.dispatched, Ordering::Relaxed);
        c.completions.store(self.completions, Ordering::Relaxed);
        c.queued_groups.store(self.groups.len() as u32, Ordering::Relaxed);
        c.queued_sub.store(self.subs.len() as u32, Ordering::Relaxed);
        for (q, info) in self.next_level.iter().zip(&self.core.next_level) {
            info.queued.store(q.fifo.len() as u32, Ordering::Relaxed);
        }
    }
}
