//! The task-state protocol: every transition of `docs/engine-protocols.md` §4 that touches one
//! slot, each one critical section on that slot's lock (the dispatch claim is one
//! compare-and-swap).
//!
//! Multi-slot operations (submit wiring, completion, poisoning, cancellation, reclamation) are
//! sequences of these steps and live in `graph`; nothing here takes a second lock, so these
//! functions can be model-checked on their own (`loom_models`).
//!
//! # Protocol
//!
//! 1. **Initialize** (`Free → Building`, or `Free → Completed` for an alloc): the orchestration
//!    thread, under the slot lock, before the slot id is given to anyone. The scope reference is
//!    counted here (`fanout_total = 1`), before outputs are published, so a consumer's increment
//!    can never be overwritten.
//! 2. **Attach** (under the producer's lock): a consumer lists itself on producer P and raises
//!    P's `fanout_total`, unless P is stale or `Consumed`. The answer (live, finished, failed)
//!    is decided in the same critical section, so attach and reclamation exclude each other.
//! 3. **Publish** (under the consumer's lock): store producers and `fanin_count`; then
//!    `Building → Ready` if `fanin_released ≥ fanin_count` (producers that completed since
//!    attach only counted), else `Building → Pending`. If the compare-and-swap fails, a producer
//!    failure claimed the slot while it was `Building` and left the propagation to the
//!    submitter.
//! 4. **Release fanin** (under the consumer's lock, by the thread completing a producer):
//!    `fanin_released += 1`; a `Pending` consumer whose count is reached moves to `Ready`, and
//!    exactly that releaser queues it. A `Building` consumer only counts.
//! 5. **Failure claim** (under the slot's lock): compare-and-swap to `Failed` from `Building`,
//!    `Pending` or `Ready`; the winner alone writes `failure`. From `Building` the claimer either
//!    defers the propagation (`propagation_owed`, the submitter is still wiring the slot) or,
//!    when no submitter is left, owns it. A later claimer may take an owed debt exactly once.
//! 6. **Dispatch claim** (lock-free): `Ready → Running` by compare-and-swap on the
//!    generation-tagged state word; it loses cleanly to a failure claim and to recycling.
//! 7. **Member completion** (under the slot's lock): record the member's outcome; when every
//!    member is terminal, move `Running → Completed | Failed` and snapshot consumers and
//!    producers in the same critical section (closes hazards 1 and 2), then apply the self
//!    release.
//! 8. **Release a reference** (under the slot's lock): `fanout_released += 1`; when
//!    `fanout_released ≥ fanout_total + 1` and the task is finished, move to `Consumed`, take the
//!    run out and clear the bookkeeping. The caller then reclaims the slot (`graph`).

use std::sync::Arc;

use simpler_types::{
    CancelReason, FailureMechanism, GroupMemberState, SlotId, TaskFailure, TaskId, TaskState,
};

use crate::run_record::RunRecord;
use crate::slot::{Edge, Head, Route, SlotSync, TaskSlot};

/// What attaching a consumer to a producer found (`docs/engine-protocols.md` §3 step 5).
#[derive(Debug)]
pub(crate) enum Attach {
    /// Stale id, `Consumed`, or already attached in this submit: no new edge, nothing more to
    /// wait for.
    Skipped,
    /// Edge added; the producer is still to finish.
    Live(TaskId),
    /// Edge added; the producer already completed (it stays alive until the consumer ends).
    Finished(TaskId),
    /// Edge added; the producer failed, so the consumer is poisoned at submit.
    Failed(TaskId, Arc<TaskFailure>),
}

/// Result of publication.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Publish {
    /// Queue it.
    Ready(Route),
    /// Some producer is still live.
    Pending,
    /// A producer failed: the submitter must finish the failure (`docs/engine-protocols.md` §3 step
    /// 7).
    Poisoned,
}

/// Result of a fanin release.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fanin {
    /// The consumer became ready; the caller must queue it.
    Ready(Route),
    /// Counted, nothing else to do.
    Counted,
}

/// How a failure claim treats a slot that is still `Building`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnBuilding {
    /// Leave the propagation to the submitter (`propagation_owed`).
    Defer,
    /// No submitter is left (submission closed): the claimer propagates.
    Own,
}

/// Why a failure claim is made.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ClaimCause<'a> {
    /// A producer failed; this is the root failure of the chain.
    Poison(&'a Arc<TaskFailure>),
    /// The run's unstarted work is cancelled.
    Cancel(CancelReason),
}

/// Outcome of a failure claim.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The caller owns the propagation: consumers and releases were appended to its lists.
    Owned,
    /// Claimed from `Building`; the submitter propagates.
    Deferred,
    /// Not claimable (stale, running, finished, already owned).
    NotClaimed,
}

/// Outcome of one member's completion.
#[derive(Debug)]
pub(crate) enum MemberDone {
    /// Not the current occupant, or the member already reported: ignored.
    Stale,
    /// Other members are still running; the task stays `Running`.
    Waiting,
    /// The task turned terminal.
    Finished {
        /// Its failure, if any member failed.
        failure: Option<Arc<TaskFailure>>,
        /// Set when the self release reached the threshold: the caller reclaims the slot.
        reclaim: Option<Arc<RunRecord>>,
        /// The task has reader entries in the tensor map for the caller to retire.
        reads: bool,
    },
}

/// The failure recorded on a consumer poisoned by `root` (the original failure of its chain).
pub(crate) fn poisoned_failure(head: &Head, root: &Arc<TaskFailure>) -> Arc<TaskFailure> {
    Arc::new(
        TaskFailure::new(
            head.task,
            head.callable,
            FailureMechanism::Poisoned { root: root.task },
            root.message.clone(),
        )
        .caused_by(Arc::clone(root)),
    )
}

/// The original failure behind `failure`: itself, or the root it was poisoned by.
pub(crate) fn root_of(failure: &Arc<TaskFailure>) -> &Arc<TaskFailure> {
    match (&failure.mechanism, &failure.cause) {
        (FailureMechanism::Poisoned { .. }, Some(root)) => root,
        _ => failure,
    }
}

fn cancelled_failure(head: &Head, reason: CancelReason) -> Arc<TaskFailure> {
    Arc::new(TaskFailure::new(
        head.task,
        head.callable,
        FailureMechanism::Cancelled { reason },
        format!("cancelled before it ran: {reason}"),
    ))
}

impl TaskSlot {
    /// Step 1 for a task: `Free → Building`, charged to `run`, holding its scope reference.
    pub(crate) fn init_task(&self, head: Head, run: Arc<RunRecord>, route: Route, members: usize) {
        let mut s = self.sync.lock();
        s.clear();
        s.head = Some(head);
        s.run = Some(run);
        s.route = route;
        s.fanout_total = 1;
        s.members.resize(members, GroupMemberState::NotDispatched);
        self.state.set(head.id, TaskState::Building);
    }

    /// Step 1 for an alloc: `Free → Completed`, with the scope reference and, in place of the
    /// self release, one release already counted.
    pub(crate) fn init_alloc(&self, head: Head, run: Arc<RunRecord>) {
        let mut s = self.sync.lock();
        s.clear();
        s.head = Some(head);
        s.run = Some(run);
        s.is_alloc = true;
        s.fanout_total = 1;
        s.fanout_released = 1;
        self.state.set(head.id, TaskState::Completed);
    }

    /// Step 2: lists `consumer` on this producer (`me`) unless it is stale or consumed, or lists
    /// it already (a repeated attach in the same submit is skipped).
    pub(crate) fn attach(&self, me: SlotId, consumer: Edge) -> Attach {
        let mut s = self.sync.lock();
        let Some(head) = s.head.filter(|h| h.id == me) else {
            return Attach::Skipped;
        };
        if s.consumers.last() == Some(&consumer) {
            // Met twice in one submit (two arguments, or as a writer and a reader): only the
            // submitting thread attaches, one submit at a time, and consumers are only cleared
            // once the slot is consumed, so this consumer is still last and already counted.
            return Attach::Skipped;
        }
        let state = self.state.get(me);
        let answer = match state {
            Some(TaskState::Failed) => match &s.failure {
                Some(f) => Attach::Failed(head.task, Arc::clone(f)),
                None => {
                    debug_assert!(false, "{} is failed without a failure", head.task);
                    Attach::Live(head.task)
                }
            },
            Some(TaskState::Completed) => Attach::Finished(head.task),
            Some(TaskState::Pending | TaskState::Ready | TaskState::Running) => {
                Attach::Live(head.task)
            }
            Some(TaskState::Building) => {
                debug_assert!(false, "attach to {} while it is still building", head.task);
                Attach::Live(head.task)
            }
            Some(TaskState::Consumed | TaskState::Free) | None => return Attach::Skipped,
        };
        s.consumers.push(consumer);
        s.fanout_total += 1;
        answer
    }

    /// Step 3: publishes a `Building` slot with its attached producers, `live` of them still
    /// to finish. `producer_failed` says an attached producer had already failed; `reads` that
    /// the task recorded reader entries in the tensor map.
    pub(crate) fn publish(
        &self,
        me: SlotId,
        producers: &[Edge],
        live: u32,
        producer_failed: bool,
        reads: bool,
    ) -> Publish {
        let mut s = self.sync.lock();
        if !s.is(me) {
            debug_assert!(false, "publishing {me}, which is not the slot's occupant");
            return Publish::Poisoned;
        }
        s.reads = reads;
        s.producers.extend_from_slice(producers);
        s.fanin_count = live;
        if producer_failed {
            return Publish::Poisoned;
        }
        let to = if s.fanin_released >= live { TaskState::Ready } else { TaskState::Pending };
        if self.state.transition(me, TaskState::Building, to) {
            if to == TaskState::Ready { Publish::Ready(s.route) } else { Publish::Pending }
        } else {
            // A producer failure claimed the slot while it was building (protocol step 5).
            Publish::Poisoned
        }
    }

    /// Submit step 7 (`docs/engine-protocols.md` §3): finishes a failure found at submit. A
    /// still-`Building` slot is claimed as poisoned by `root`; a slot a producer already claimed
    /// keeps that failure and its owed propagation is settled here. Appends the self reference and
    /// every producer to `releases` and returns the slot's failure.
    pub(crate) fn fail_at_submit(
        &self,
        me: SlotId,
        root: Option<&Arc<TaskFailure>>,
        releases: &mut Vec<SlotId>,
    ) -> Option<Arc<TaskFailure>> {
        let mut s = self.sync.lock();
        let head = s.head.filter(|h| h.id == me)?;
        match self.state.get(me) {
            Some(TaskState::Building) => {
                let Some(root) = root else {
                    debug_assert!(false, "{} poisoned at submit without a root", head.task);
                    return None;
                };
                s.failure = Some(poisoned_failure(&head, root));
                self.state.set(me, TaskState::Failed);
                count_failed(&s, false);
            }
            Some(TaskState::Failed) => {}
            other => {
                debug_assert!(false, "{} is {other:?} at submit-time failure", head.task);
                return None;
            }
        }
        s.propagation_owed = false;
        skip_unstarted_members(&mut s);
        releases.push(me);
        releases.extend(s.producers.iter().map(|e| e.slot));
        s.failure.clone()
    }

    /// Step 4: a producer of this consumer completed successfully.
    pub(crate) fn release_fanin(&self, me: SlotId) -> Fanin {
        let mut s = self.sync.lock();
        if !s.is(me) {
            return Fanin::Counted;
        }
        s.fanin_released += 1;
        if s.fanin_released >= s.fanin_count
            && self.state.transition(me, TaskState::Pending, TaskState::Ready)
        {
            return Fanin::Ready(s.route);
        }
        Fanin::Counted
    }

    /// Step 5: claims the slot as failed. On [`Claim::Owned`], appends the slot's consumers to
    /// `consumers` (to be claimed next) and its self reference and producers to `releases`.
    pub(crate) fn claim_failure(
        &self,
        me: SlotId,
        cause: ClaimCause<'_>,
        on_building: OnBuilding,
        take_debt: bool,
        consumers: &mut Vec<SlotId>,
        releases: &mut Vec<SlotId>,
    ) -> Claim {
        let mut s = self.sync.lock();
        let Some(head) = s.head.filter(|h| h.id == me) else {
            return Claim::NotClaimed;
        };
        let state = self.state.get(me);
        match state {
            Some(from @ (TaskState::Building | TaskState::Pending | TaskState::Ready)) => {
                if !self.state.transition(me, from, TaskState::Failed) {
                    // Only the dispatch claim races outside the lock: the task is running now
                    // and finishes normally.
                    return Claim::NotClaimed;
                }
                let (failure, cancelled) = match cause {
                    ClaimCause::Poison(root) => (poisoned_failure(&head, root), false),
                    ClaimCause::Cancel(reason) => (cancelled_failure(&head, reason), true),
                };
                s.failure = Some(failure);
                count_failed(&s, cancelled);
                skip_unstarted_members(&mut s);
                if from == TaskState::Building && on_building == OnBuilding::Defer {
                    s.propagation_owed = true;
                    return Claim::Deferred;
                }
            }
            Some(TaskState::Failed) if take_debt && s.propagation_owed => {
                s.propagation_owed = false;
            }
            _ => return Claim::NotClaimed,
        }
        consumers.extend(s.consumers.iter().map(|e| e.slot));
        releases.push(me);
        releases.extend(s.producers.iter().map(|e| e.slot));
        Claim::Owned
    }

    /// Step 6: `Ready → Running`, lock-free. Loses to a failure claim and to recycling.
    pub(crate) fn claim_dispatch(&self, me: SlotId) -> bool {
        self.state.transition(me, TaskState::Ready, TaskState::Running)
    }

    /// Marks every member of a just-claimed group as running.
    pub(crate) fn mark_members_running(&self, me: SlotId) {
        let mut s = self.sync.lock();
        if s.is(me) {
            s.members.iter_mut().for_each(|m| *m = GroupMemberState::Running);
        }
    }

    /// Step 7: member `member` of a running task reported. On the last report, appends the
    /// consumers to `consumers` and the producers to `releases` (deferred releases) and applies
    /// the self release.
    pub(crate) fn complete_member(
        &self,
        me: SlotId,
        member: u32,
        failure: Option<Arc<TaskFailure>>,
        consumers: &mut Vec<SlotId>,
        releases: &mut Vec<SlotId>,
    ) -> MemberDone {
        let mut s = self.sync.lock();
        if !s.is(me) || self.state.get(me) != Some(TaskState::Running) {
            return MemberDone::Stale;
        }
        let size = s.members.len();
        let Some(slot) = s.members.get_mut(member as usize) else {
            return MemberDone::Stale;
        };
        if slot.is_terminal() {
            return MemberDone::Stale;
        }
        *slot =
            if failure.is_some() { GroupMemberState::Failed } else { GroupMemberState::Success };
        s.members_terminal += 1;
        if let Some(f) = failure {
            if s.first_failure.is_none() {
                s.first_failure = Some(f);
            }
            skip_unstarted_members(&mut s);
        }
        if (s.members_terminal as usize) < size {
            return MemberDone::Waiting;
        }
        let failure = s.first_failure.take();
        let to = if failure.is_some() { TaskState::Failed } else { TaskState::Completed };
        s.failure = failure.clone();
        self.state.set(me, to);
        if failure.is_some() {
            count_failed(&s, false);
        }
        consumers.extend(s.consumers.iter().map(|e| e.slot));
        releases.extend(s.producers.iter().map(|e| e.slot));
        s.fanout_released += 1;
        let reads = s.reads;
        let reclaim = self.consume_if_due(&mut s, me);
        MemberDone::Finished { failure, reclaim, reads }
    }

    /// Step 8: releases one reference. `Some(run)` means the caller is the reclaimer.
    pub(crate) fn release_ref(&self, me: SlotId) -> Option<Arc<RunRecord>> {
        let mut s = self.sync.lock();
        if !s.is(me) {
            return None;
        }
        s.fanout_released += 1;
        self.consume_if_due(&mut s, me)
    }

    /// The failure of occupant `id`, if it failed.
    pub(crate) fn failure_of(&self, id: SlotId) -> Option<Arc<TaskFailure>> {
        let s = self.sync.lock();
        if s.is(id) { s.failure.clone() } else { None }
    }

    fn consume_if_due(&self, s: &mut SlotSync, me: SlotId) -> Option<Arc<RunRecord>> {
        let finished = self.state.get(me).is_some_and(TaskState::is_finished);
        if !finished || s.fanout_released <= s.fanout_total {
            return None;
        }
        self.state.set(me, TaskState::Consumed);
        let run = s.run.take();
        s.clear();
        debug_assert!(run.is_some(), "{me} consumed without a run");
        run
    }
}

/// Marks every member that never started as skipped (a failed or cancelled task).
fn skip_unstarted_members(s: &mut SlotSync) {
    for m in s.members.iter_mut() {
        if *m == GroupMemberState::NotDispatched {
            *m = GroupMemberState::Skipped;
            s.members_terminal += 1;
        }
    }
}

fn count_failed(s: &SlotSync, cancelled: bool) {
    if let Some(run) = &s.run {
        run.count_failed_task(cancelled);
    }
}
