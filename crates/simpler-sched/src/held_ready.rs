//! Ready tasks the submitting thread holds while every endpoint thread is awake, and hands
//! over in batches (`inbox`, steps 7 and 11–15; `docs/engine-protocols.md` §6).
//!
//! Handing one ready task to the scheduler costs the submitting thread the inbox lock, the
//! inbox's `pending` word and the role word, each last written by the thread that drained the
//! task before: a cache-line transfer apiece, per task, on the thread that is usually the
//! bottleneck. Past a run's first tasks, while no endpoint thread is parked, a ready task is
//! held here instead and handed over [`READY_BATCH`] at a time, or taken by an endpoint thread
//! that runs out of mail.
//!
//! # Protocol
//!
//! 11. **Hold.** The submitter appends the entry under the buffer lock. An entry that made the
//!     buffer non-empty sets `nonempty`, then (after a SeqCst fence) reads `parked`: if an
//!     endpoint thread is parked, the submitter hands over at once (step 12). An entry appended
//!     behind others rides on the take those are owed (steps 13–15), as a join does (step 1).
//!     While an endpoint thread is parked the submitter does not hold at all.
//! 12. **Hand over.** The submitter takes every held entry, appends them to the inbox, then
//!     reads the role as in step 7 and drives (step 2) unless a holder will. It hands over when
//!     [`READY_BATCH`] entries are held, when it publishes a task that is not ready (it may wait
//!     for held ones), before it waits for window or heap space, and when the run's submission
//!     ends.
//! 13. **Take when idle.** An endpoint thread whose mailbox is empty takes the held entries
//!     (if `nonempty`) when it takes the idle-driver role and again when it gives it back
//!     (step 8), appends them to the inbox and drives.
//! 14. **Take before parking.** An endpoint thread about to park counts itself in `parked` (a
//!     read-modify-write, then a SeqCst fence), takes the held entries if `nonempty`, appends
//!     them to the inbox and drives, and only then locks its mailbox and parks; it leaves
//!     `parked` once it has mail.
//! 15. **Why nothing is held forever.** The append that made the buffer non-empty and a parking
//!     thread's count are each followed by a SeqCst fence and a read of the other's word, so at
//!     least one of them sees the other: either the submitter finds the thread parked and hands
//!     over, or the thread finds `nonempty` and takes the entries (or finds them already taken
//!     by whoever took them since). So entries are held only while every endpoint thread is
//!     awake, and an awake thread takes them when it next runs out of mail (step 13) or parks
//!     (step 14). Modelled in `loom_models`.
//!
//! The buffer lock is a leaf. Held entries are ready slots charged to the run: an abort or a
//! failure that cancels them finds them there, and a pass that meets a cancelled one skips it.
//! An engine with a parked endpoint thread (an idle pool of SUB workers beside busy NEXT_LEVEL
//! ones, say) holds nothing and delivers as before.

use crossbeam_utils::CachePadded;
use simpler_types::CancelReason;

use crate::core::Core;
use crate::graph::GraphScratch;
use crate::inbox::{Closed, IdleDriver, Inbox, ReadyEntry, deliver_ready, drive};
use crate::scheduler::Own;
use crate::sync::{self, AtomicBool, AtomicU32, Mutex, MutexGuard, Ordering};

/// Most ready tasks held before the submitter hands them over. Measured (P1, fast mode): 16
/// takes a P1 task from 0.38–0.40 to 0.25–0.30 µs.
pub(crate) const READY_BATCH: usize = 16;

/// The held entries (one submitting thread at a time: a single run builds).
#[derive(Default)]
pub(crate) struct HeldReady {
    entries: Mutex<Vec<ReadyEntry>>,
    /// Entries are held. Written under the lock; read without it by idle and parking endpoint
    /// threads (steps 13–15), on a line the submitter writes only when the buffer turns
    /// non-empty.
    nonempty: CachePadded<AtomicBool>,
    /// Endpoint threads parked or about to park (step 14). Read by the submitter on every ready
    /// task (a hint) and after each first append (step 15).
    parked: CachePadded<AtomicU32>,
    /// Takes by endpoint threads that found entries, for tests.
    #[cfg(all(test, not(simpler_loom)))]
    pub(crate) steals: std::sync::atomic::AtomicU64,
}

impl HeldReady {
    /// Step 11's append. Returns whether the entry made the buffer non-empty, and how many
    /// entries are held now.
    fn append(&self, entry: ReadyEntry) -> (bool, usize) {
        let mut entries = self.entries.lock();
        let first = entries.is_empty();
        entries.push(entry);
        if first {
            // Relaxed: written under the lock; the holder's read is ordered by the role's
            // read-modify-writes (step 14).
            self.nonempty.store(true, Ordering::Relaxed);
        }
        (first, entries.len())
    }

    /// Moves every held entry to the end of `into`; `false` when none was held.
    fn take(&self, into: &mut Vec<ReadyEntry>) -> bool {
        let mut entries = self.entries.lock();
        if entries.is_empty() {
            return false;
        }
        if into.is_empty() {
            // Swapped, so that both vectors keep their capacity and neither side allocates.
            std::mem::swap(&mut *entries, into);
        } else {
            into.append(&mut entries);
        }
        // Relaxed: under the lock, like every write.
        self.nonempty.store(false, Ordering::Relaxed);
        true
    }

    /// Whether entries seem held (steps 13 and 14; exact after the fence of step 15).
    fn seems_nonempty(&self) -> bool {
        // Relaxed: see `append`.
        self.nonempty.load(Ordering::Relaxed)
    }

    /// Whether no endpoint thread is parked (a hint: step 11 decides after its fence).
    fn all_awake(&self) -> bool {
        // Relaxed: a hint, or ordered by the fences of step 15.
        self.parked.load(Ordering::Relaxed) == 0
    }

    /// Step 14's count, before the take; [`unparked`](Self::unparked) must follow once the
    /// thread has mail.
    pub(crate) fn parking(&self) {
        // The fence pairs with the submitter's (step 15).
        self.parked.fetch_add(1, Ordering::SeqCst);
        sync::fence_seq_cst();
    }

    /// Step 14's end: the thread has mail again.
    pub(crate) fn unparked(&self) {
        // Relaxed: the count only; step 15's fences order what depends on it.
        self.parked.fetch_sub(1, Ordering::Relaxed);
    }

    /// Entries held, for tests.
    #[cfg(all(test, not(simpler_loom)))]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

/// Step 11: holds `entry`; `true` when the caller must hand over now (step 12).
pub(crate) fn hold(held: &HeldReady, entry: ReadyEntry) -> bool {
    match held.append(entry) {
        (true, _) => {
            // Pairs with the parking thread's fence (step 15).
            sync::fence_seq_cst();
            !held.all_awake()
        }
        (false, len) => len >= READY_BATCH,
    }
}

/// Step 12: takes every held entry into `handing` (which must be empty) and appends them to the
/// inbox, then drives unless a holder will. `Err(Closed)` leaves the entries in `handing`: the
/// scheduler has stopped for good, and the caller must cancel them.
pub(crate) fn hand_over<S>(
    held: &HeldReady,
    driver: &IdleDriver,
    inbox: &Inbox,
    lock: &Mutex<S>,
    handing: &mut Vec<ReadyEntry>,
    pass: impl FnMut(&mut MutexGuard<'_, S>),
) -> Result<(), Closed> {
    if !held.take(handing) {
        return Ok(());
    }
    if !driver.leave_all(inbox, handing)? {
        drive(inbox, lock, pass);
    }
    Ok(())
}

/// Steps 13 and 14's take: moves the held entries, if any, to the inbox; `true` when it moved
/// some (the caller then drives). `scratch` must be empty and is left empty.
pub(crate) fn steal(held: &HeldReady, inbox: &Inbox, scratch: &mut Vec<ReadyEntry>) -> bool {
    if held.seems_nonempty() && held.take(scratch) {
        #[cfg(all(test, not(simpler_loom)))]
        held.steals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A closed inbox means the scheduler has stopped, after every run still live was aborted
        // and its unstarted tasks cancelled: the entries name cancelled tasks.
        let _ = inbox.push_ready_all(scratch);
        scratch.clear();
        return true;
    }
    false
}

/// What the submitting thread keeps for holding (in the orchestrator state).
#[derive(Default)]
pub(crate) struct Holding {
    /// Entries may be held (the submitter held one and has not handed over since; a holder may
    /// have stolen them meanwhile).
    active: bool,
    /// Entries being handed over (kept for its capacity); after `Err(Closed)`, the entries the
    /// stopped scheduler refused.
    pub(crate) handing: Vec<ReadyEntry>,
}

/// A task published ready: held (step 11) while no endpoint thread is parked or entries are held
/// already, past a run's first tasks (`may_leave`); otherwise delivered as in steps 1–10
/// (`own_pass` runs on it if the scheduler lock is free). `Err(Closed)` once the
/// scheduler has stopped for good, with the refused entries in `holding.handing`.
#[allow(clippy::too_many_arguments, reason = "the protocol's parts, passed apart for the models")]
pub(crate) fn publish_ready<S>(
    held: &HeldReady,
    driver: &IdleDriver,
    inbox: &Inbox,
    lock: &Mutex<S>,
    entry: ReadyEntry,
    may_leave: bool,
    holding: &mut Holding,
    own_pass: impl FnOnce(&mut MutexGuard<'_, S>, ReadyEntry),
    mut pass: impl FnMut(&mut MutexGuard<'_, S>),
) -> Result<(), Closed> {
    if may_leave && (holding.active || held.all_awake()) {
        holding.active = true;
        if hold(held, entry) {
            return hand_over_held(held, driver, inbox, lock, holding, pass);
        }
        return Ok(());
    }
    deliver_ready(inbox, lock, entry, may_leave, own_pass, &mut pass).inspect_err(|_| {
        holding.handing.push(entry);
    })
}

/// Step 12 for the submitting thread, if it may hold entries. `Err(Closed)` as for
/// [`publish_ready`].
pub(crate) fn hand_over_held<S>(
    held: &HeldReady,
    driver: &IdleDriver,
    inbox: &Inbox,
    lock: &Mutex<S>,
    holding: &mut Holding,
    pass: impl FnMut(&mut MutexGuard<'_, S>),
) -> Result<(), Closed> {
    if !std::mem::take(&mut holding.active) {
        return Ok(());
    }
    hand_over(held, driver, inbox, lock, &mut holding.handing, pass)
}

impl Core {
    /// A task published ready (submit step 8; [`publish_ready`]). Cancels what the stopped
    /// scheduler refuses.
    pub(crate) fn publish_ready(
        &self,
        entry: ReadyEntry,
        may_leave: bool,
        holding: &mut Holding,
        graph: &mut GraphScratch,
    ) {
        let published = publish_ready(
            &self.held_ready,
            &self.idle_driver,
            &self.inbox,
            &self.sched,
            entry,
            may_leave,
            holding,
            |state, entry| self.run_pass(state, Own::Ready(entry)),
            |state| self.run_pass(state, Own::Nothing),
        );
        if published.is_err() {
            self.cancel_refused(holding, graph);
        }
    }

    /// Step 12, when the submitting thread may hold entries.
    pub(crate) fn hand_over(&self, holding: &mut Holding, graph: &mut GraphScratch) {
        let handed = hand_over_held(
            &self.held_ready,
            &self.idle_driver,
            &self.inbox,
            &self.sched,
            holding,
            |state| self.run_pass(state, Own::Nothing),
        );
        if handed.is_err() {
            self.cancel_refused(holding, graph);
        }
    }

    /// Steps 13 and 14 for an endpoint thread: takes the held entries, if any, and drives.
    pub(crate) fn take_held(&self, scratch: &mut Vec<ReadyEntry>) {
        if steal(&self.held_ready, &self.inbox, scratch) {
            self.drive();
        }
    }

    /// The scheduler has stopped for good: the refused tasks can never run.
    fn cancel_refused(&self, holding: &mut Holding, graph: &mut GraphScratch) {
        for entry in holding.handing.drain(..) {
            self.cancel_unstarted(entry.slot, CancelReason::Shutdown, graph);
        }
    }
}

#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use std::time::Duration;

    use simpler_types::{CallConfig, TaskArgs, TaskState, WorkerId};

    use crate::outcome::RunOutcome;
    use crate::scheduler::tests::{chip, gated_engine, wait_until};

    #[test]
    fn a_task_held_while_its_endpoint_was_busy_runs_when_the_endpoint_parks_without_the_role() {
        // The endpoint thread is busy (its first task waits at the gate) when the seventeenth
        // task is published, so the task is held (step 11). The test thread holds the
        // idle-driver role throughout, so the endpoint, once out of mail, never takes it
        // (step 13): only its take before parking (step 14) can find the held task. The run
        // stays open, so closing does not hand it over either.
        let (engine, tx) = gated_engine();
        let core = engine.core();
        wait_until(|| core.idle_driver.take());
        let cfg = CallConfig::default();
        let mut b = engine.begin_run().unwrap();
        let mut submit = || b.submit_next_level(&chip(), TaskArgs::new(), &cfg, WorkerId(0), None);
        let first = submit().unwrap();
        wait_until(|| engine.task_snapshot(first).unwrap().state == TaskState::Running);
        let mut last = first;
        for _ in 1..17 {
            last = submit().unwrap();
        }
        assert_eq!(core.held_ready.len(), 1, "the seventeenth task was not held");
        for _ in 0..17 {
            tx.send(()).unwrap();
        }
        wait_until(|| engine.task_snapshot(last).unwrap().state == TaskState::Completed);
        let mut stolen = Vec::new();
        core.give_back_idle_driver(&mut stolen);
        let run = b.close();
        let outcome = engine.wait_timeout(run, Duration::from_secs(20)).unwrap();
        assert_eq!(outcome, Some(RunOutcome::Completed));
    }
}
