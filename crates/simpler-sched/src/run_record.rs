//! `RunRecord`: one run's phase, charge count, first failure and completion fence
//! (`docs/engine-protocols.md` §2).
//!
//! # Fence protocol
//!
//! 1. **Charge.** The orchestration thread, under `completion`, appends the new slot to
//!    `task_slots` (its index is the task's sequence number) and increments `active`, before the
//!    slot is visible to any other thread, so a decrement can never precede its increment.
//! 2. **Close / fail.** A failed submission or an abort first records its failure (first wins)
//!    and sets `failed`, then cancels. `close`, and `fail` after it has unwound its scopes and
//!    cleared the building mark, then set `closed` under `completion`, move the phase to
//!    `Executing` if work is still charged, and run the fence check (step 4) in the same
//!    critical section. Closing only after the mark is cleared means nobody who sees the run
//!    terminal can be refused by `begin_run` for it.
//! 3. **Reclaim.** Whichever thread reclaims a slot decrements `active` exactly once for it, for
//!    one slot or for a batch of slots at once (clamped at 0: an underflow records
//!    `RunFailure::Internal` instead of panicking, and still checks the fence). The thread that
//!    brings it to 0 locks `completion` and runs the fence check.
//! 4. **Fence check** (always under `completion`): if the run is not yet terminal, `closed` is
//!    set and `active` is 0, store the outcome (`Failed` if `failed` or a failure is recorded,
//!    else `Completed`), publish the phase, and `notify_all`. The transition happens at most once
//!    because it is decided under the lock and a terminal phase never changes.
//! 5. **Wait.** Waiters sleep on the condition variable under `completion` until the outcome is
//!    stored; every waiter clones the same stored outcome, so all of them see the same `Arc`.
//!
//! Steps 2 and 3 race safely: the decrement in step 3 is sequenced before that thread's lock
//! acquisition, so whichever critical section runs second sees both `closed` and `active == 0`.
//!
//! Admission waiters (a later `begin_run`) wait on this record's condition variable too, so the
//! fence needs no second lock to wake them (decision: one wake-up path, no lost wake-up because
//! the phase is only read and written under `completion`).
//!
//! # Atomic fields
//!
//! | Field | Writers | Readers |
//! |---|---|---|
//! | `phase` | fence check, `mark_executing` (at close) and [`RunRecord::force_failed`], under
//! `completion` | anyone, lock-free
//! (`is_done`, admission, fast checks) |
//! | `active` | orchestration thread (+1, step 1), reclaimers (−n, step 3) | reclaimers, fence
//! check, status |
//! | `has_failure` | failure recording, under `completion` | submit fail-fast check, lock-free |
//! | `map_entries_dropped` | `close` and `fail`, once the run's tensor-map entries are removed |
//! reclaimers, to skip erasing key by key |
//! | `failed_tasks`, `cancelled_tasks` | whoever moves one of the run's tasks to `Failed` | the run
//! summary |

use std::sync::Arc;
use std::time::Instant;

use simpler_types::{RunFailure, RunId, RunState, SlotId, TaskId};

use crate::outcome::{RingPeaks, RunOutcome};
use crate::sync::{AtomicBool, AtomicU8, AtomicU32, Condvar, Mutex, MutexGuard, Ordering};

/// Shared record of one run, referenced by the registry and by every slot charged to the run.
pub(crate) struct RunRecord {
    /// The run's id.
    pub(crate) id: RunId,
    /// `RunState` wire value.
    phase: AtomicU8,
    /// Slots (tasks and allocs) charged to the run and not yet reclaimed.
    active: AtomicU32,
    /// Lock-free mirror of `completion.first_failure.is_some()`.
    has_failure: AtomicBool,
    /// Submission has ended and the run's tensor-map entries were removed with it; no later
    /// submit can add one, so the run's reclaimers have nothing left to erase.
    map_entries_dropped: AtomicBool,
    /// Tasks of this run that ended `Failed` other than by cancellation.
    failed_tasks: AtomicU32,
    /// Tasks of this run cancelled before they ran.
    cancelled_tasks: AtomicU32,
    /// Everything the fence decides on.
    completion: Mutex<Completion>,
    /// Signalled once, when the run turns terminal.
    terminal: Condvar,
    /// The run's tracing span (`run.id`); task spans are its children.
    pub(crate) span: tracing::Span,
}

/// The last reference to a run may go on an engine thread, inside a pass (a reclamation that
/// fired the fence after the caller let go of the run): a tracing layer that panics when the run's
/// span closes must not be taken there for an engine bug, nor reach a caller's thread.
impl Drop for RunRecord {
    fn drop(&mut self) {
        crate::endpoint::drop_quietly(std::mem::replace(&mut self.span, tracing::Span::none()));
    }
}

impl std::fmt::Debug for RunRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunRecord")
            .field("id", &self.id)
            .field("phase", &self.phase())
            .field("active", &self.active())
            .finish_non_exhaustive()
    }
}

/// State under `RunRecord::completion`.
#[derive(Default)]
pub(crate) struct Completion {
    /// The run's first error.
    first_failure: Option<Arc<RunFailure>>,
    /// Submission is closed: no further charges.
    closed: bool,
    /// The submission failed or the run was aborted.
    failed: bool,
    /// Every slot charged to the run; the index is the task's sequence number.
    pub(crate) task_slots: Vec<SlotId>,
    /// Set once, at the fence.
    outcome: Option<RunOutcome>,
    /// Ring high-water marks over the run's lifetime, captured before the next run resets them.
    pub(crate) peaks: Option<RingPeaks>,
}

/// What [`RunRecord::mark_aborted`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AbortCheck {
    /// The run was already terminal; nothing changed.
    Terminal,
    /// Submission is still open; nothing changed.
    NotClosed,
    /// The failure was recorded and the run marked failed; cancellation follows.
    Marked,
}

/// Why a charge was refused.
#[derive(Debug)]
pub(crate) struct SequenceExhausted;

impl RunRecord {
    /// A new record in phase `Building`.
    pub(crate) fn new(id: RunId, span: tracing::Span) -> RunRecord {
        RunRecord {
            id,
            phase: AtomicU8::new(RunState::Building.as_u8()),
            active: AtomicU32::new(0),
            has_failure: AtomicBool::new(false),
            map_entries_dropped: AtomicBool::new(false),
            failed_tasks: AtomicU32::new(0),
            cancelled_tasks: AtomicU32::new(0),
            completion: Mutex::new(Completion::default()),
            terminal: Condvar::new(),
            span,
        }
    }

    /// Current phase.
    pub(crate) fn phase(&self) -> RunState {
        // Acquire pairs with the Release store at the fence, so a caller that sees a terminal
        // phase also sees everything the fencing thread did before (reclamations included).
        RunState::from_u8(self.phase.load(Ordering::Acquire)).unwrap_or(RunState::Failed)
    }

    /// Whether the fence has fired.
    pub(crate) fn is_terminal(&self) -> bool {
        self.phase().is_terminal()
    }

    /// Slots charged and not yet reclaimed.
    pub(crate) fn active(&self) -> u32 {
        // Acquire pairs with the AcqRel decrement, so a reader of 0 sees the reclamations.
        self.active.load(Ordering::Acquire)
    }

    /// The first failure, if any (fail-fast check: lock-free unless the run failed).
    pub(crate) fn failure(&self) -> Option<Arc<RunFailure>> {
        // Acquire pairs with the Release store in `record_locked`; the Arc itself is read under
        // the lock, so this flag is only a fast filter.
        if !self.has_failure.load(Ordering::Acquire) {
            return None;
        }
        self.completion.lock().first_failure.clone()
    }

    /// Locks the completion state (for status snapshots and cancellation).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Completion> {
        self.completion.lock()
    }

    /// Step 1: charges `slot` to the run and returns its task id.
    pub(crate) fn charge(&self, slot: SlotId) -> Result<TaskId, SequenceExhausted> {
        let mut c = self.completion.lock();
        let seq = u32::try_from(c.task_slots.len()).map_err(|_| SequenceExhausted)?;
        if seq == u32::MAX {
            return Err(SequenceExhausted);
        }
        c.task_slots.push(slot);
        // Relaxed suffices: the increment is published to reclaimers through the slot's own
        // lock (the slot is not visible to them yet), and the fence re-reads `active` under
        // `completion` after any decrement.
        self.active.fetch_add(1, Ordering::Relaxed);
        Ok(TaskId::new(self.id, seq))
    }

    /// Called once submission has ended and the run's tensor-map entries are gone.
    pub(crate) fn mark_map_entries_dropped(&self) {
        // Release after the removal. A reclaimer that sees the mark erases nothing; one that
        // races the removal without seeing it erases owner-checked, which finds nothing either.
        self.map_entries_dropped.store(true, Ordering::Release);
    }

    /// Whether the run's tensor-map entries were removed when submission ended.
    pub(crate) fn map_entries_dropped(&self) -> bool {
        self.map_entries_dropped.load(Ordering::Acquire)
    }

    /// Records `failure` if the run has none yet and is not terminal (first error wins).
    /// Returns whether it was stored.
    pub(crate) fn record(&self, failure: RunFailure) -> bool {
        let mut c = self.completion.lock();
        self.record_locked(&mut c, failure)
    }

    fn record_locked(&self, c: &mut Completion, failure: RunFailure) -> bool {
        if c.first_failure.is_some() || c.outcome.is_some() {
            return false;
        }
        c.first_failure = Some(Arc::new(failure));
        // Release pairs with the Acquire load in `failure()`.
        self.has_failure.store(true, Ordering::Release);
        true
    }

    /// Step 2 for `close`: closes submission and checks the fence. Returns whether the run
    /// turned terminal in this call.
    pub(crate) fn close(&self) -> bool {
        let mut c = self.completion.lock();
        c.closed = true;
        self.mark_executing(&c);
        self.fence_locked(&mut c)
    }

    /// Step 2 for `fail` and aborts: records `failure` (first wins) and marks the run failed.
    /// Neither closes submission nor checks the fence: cancellation (and, for `fail`, unwinding
    /// and ending the building phase) runs first, then [`RunRecord::close`] or
    /// [`RunRecord::check_fence`].
    pub(crate) fn mark_failed(&self, failure: RunFailure) {
        let mut c = self.completion.lock();
        self.record_locked(&mut c, failure);
        c.failed = true;
    }

    /// Step 2 for aborts, decided in one critical section: unless the run is already terminal
    /// (or, with `require_closed`, still open for submission), records `failure` (first wins)
    /// and marks the run failed. Deciding under `completion` means a fence that fires
    /// concurrently either comes first (the abort reports `Terminal`) or sees `failed`.
    pub(crate) fn mark_aborted(&self, failure: RunFailure, require_closed: bool) -> AbortCheck {
        let mut c = self.completion.lock();
        if c.outcome.is_some() {
            return AbortCheck::Terminal;
        }
        if require_closed && !c.closed {
            return AbortCheck::NotClosed;
        }
        self.record_locked(&mut c, failure);
        c.failed = true;
        AbortCheck::Marked
    }

    /// Moves a building run to `Executing`; the fence check may immediately move it on.
    fn mark_executing(&self, c: &Completion) {
        if c.outcome.is_none() {
            // Release: readers of a non-terminal phase act on nothing else; kept for symmetry
            // with the terminal store.
            self.phase.store(RunState::Executing.as_u8(), Ordering::Release);
        }
    }

    /// Step 3: `n` charged slots were reclaimed (`n > 0`). Returns whether the run turned
    /// terminal.
    pub(crate) fn reclaimed(&self, n: u32) -> bool {
        // AcqRel: the decrement must not be reordered before the reclamations it reports, and
        // the thread that sees the count reach 0 goes on to read the run's state.
        // The closure always returns `Some`, so the update cannot fail.
        let prev = self
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| Some(a.saturating_sub(n)))
            .unwrap_or_else(|a| a);
        if prev < n {
            // One reclamation too many (a bug elsewhere) must not keep the batch's real ones
            // from counting: the count stops at 0 and the fence is checked.
            self.record(RunFailure::Internal {
                run: self.id,
                message: "a slot was reclaimed more often than it was charged".to_owned(),
            });
        }
        if prev <= n { self.check_fence() } else { false }
    }

    /// Step 4 under a fresh lock. Returns whether the run turned terminal in this call.
    pub(crate) fn check_fence(&self) -> bool {
        let mut c = self.completion.lock();
        self.fence_locked(&mut c)
    }

    fn fence_locked(&self, c: &mut Completion) -> bool {
        // Acquire: as in `active()`. The decision itself is ordered by `completion` (module docs).
        if c.outcome.is_some() || !c.closed || self.active.load(Ordering::Acquire) != 0 {
            return false;
        }
        let outcome = match (&c.first_failure, c.failed) {
            (Some(f), _) => RunOutcome::Failed(Arc::clone(f)),
            (None, false) => RunOutcome::Completed,
            (None, true) => {
                // Unreachable by construction (every way to fail a run records a cause); keep
                // the guarantee that a failed run always carries a failure anyway.
                let f = Arc::new(RunFailure::Internal {
                    run: self.id,
                    message: "run marked failed without a recorded cause".to_owned(),
                });
                c.first_failure = Some(Arc::clone(&f));
                // Release pairs with the Acquire load in `failure()`.
                self.has_failure.store(true, Ordering::Release);
                RunOutcome::Failed(f)
            }
        };
        self.publish_outcome(c, outcome);
        true
    }

    fn publish_outcome(&self, c: &mut Completion, outcome: RunOutcome) {
        let phase = match outcome {
            RunOutcome::Completed => RunState::Completed,
            RunOutcome::Failed(_) => RunState::Failed,
        };
        c.outcome = Some(outcome);
        // Release pairs with the Acquire in `phase()`.
        self.phase.store(phase.as_u8(), Ordering::Release);
        self.terminal.notify_all();
    }

    /// Makes the run terminal now with `failure` (engine poisoning: its tasks may never retire).
    /// Returns whether it changed anything.
    pub(crate) fn force_failed(&self, failure: RunFailure) -> bool {
        let mut c = self.completion.lock();
        if c.outcome.is_some() {
            return false;
        }
        self.record_locked(&mut c, failure);
        c.failed = true;
        let f = c.first_failure.clone().unwrap_or_else(|| {
            Arc::new(RunFailure::Internal { run: self.id, message: "engine poisoned".to_owned() })
        });
        self.publish_outcome(&mut c, RunOutcome::Failed(f));
        true
    }

    /// Step 5: blocks until terminal, or until `deadline`; `None` on timeout.
    ///
    /// Spins briefly on the phase first: a short run usually reaches its fence within a few
    /// microseconds of `close`, far sooner than a park and wake-up would take.
    pub(crate) fn wait_until(&self, deadline: Option<Instant>) -> Option<RunOutcome> {
        crate::sync::spin_until(|| self.is_terminal());
        let mut c = self.completion.lock();
        loop {
            if let Some(o) = &c.outcome {
                return Some(o.clone());
            }
            match deadline {
                None => c = self.terminal.wait(c),
                Some(d) => {
                    if Instant::now() >= d {
                        return None;
                    }
                    c = self.terminal.wait_until(c, d).0;
                }
            }
        }
    }

    /// The outcome, if terminal.
    pub(crate) fn outcome(&self) -> Option<RunOutcome> {
        self.completion.lock().outcome.clone()
    }

    /// Counts one of the run's tasks ending `Failed`.
    pub(crate) fn count_failed_task(&self, cancelled: bool) {
        let counter = if cancelled { &self.cancelled_tasks } else { &self.failed_tasks };
        // Relaxed: a statistic read only after the fence, whose lock orders it.
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// `(failed, cancelled)` task counts.
    pub(crate) fn failure_counts(&self) -> (u32, u32) {
        // Relaxed: read after the fence, whose lock ordered every increment before it.
        (self.failed_tasks.load(Ordering::Relaxed), self.cancelled_tasks.load(Ordering::Relaxed))
    }
}

impl Completion {
    /// Whether submission is closed.
    pub(crate) fn closed(&self) -> bool {
        self.closed
    }

    /// Whether the submission failed or the run was aborted.
    pub(crate) fn failed(&self) -> bool {
        self.failed
    }

    /// The first failure.
    pub(crate) fn first_failure(&self) -> Option<&Arc<RunFailure>> {
        self.first_failure.as_ref()
    }
}

#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use super::*;

    fn record() -> RunRecord {
        RunRecord::new(RunId::FIRST, tracing::Span::none())
    }

    #[test]
    fn an_extra_reclamation_clamps_at_zero_and_records_an_internal_failure() {
        let r = record();
        r.charge(SlotId::new(0, 1)).unwrap();
        r.close();
        assert!(r.reclaimed(1), "the real reclamation fires the fence");
        assert_eq!(r.outcome(), Some(RunOutcome::Completed));
        // A second one is a bug elsewhere: it must not panic nor change the settled outcome.
        assert!(!r.reclaimed(1));
        assert_eq!(r.active(), 0);
        assert_eq!(r.outcome(), Some(RunOutcome::Completed));

        let open = record();
        assert!(!open.reclaimed(1), "not closed: no fence");
        assert!(matches!(open.failure().as_deref(), Some(RunFailure::Internal { .. })));
        assert!(open.close());
        assert!(matches!(open.outcome(), Some(RunOutcome::Failed(_))));
    }

    #[test]
    fn a_batch_counting_one_reclamation_too_many_still_brings_the_run_to_its_fence() {
        let r = record();
        for i in 0..3 {
            r.charge(SlotId::new(i, 1)).unwrap();
        }
        r.close();
        assert!(!r.reclaimed(1));
        assert!(r.reclaimed(3), "two real reclamations and one too many reach the fence");
        assert_eq!(r.active(), 0);
        assert!(matches!(r.outcome(), Some(RunOutcome::Failed(_))), "{:?}", r.outcome());
        assert!(matches!(r.failure().as_deref(), Some(RunFailure::Internal { .. })));
    }

    #[test]
    fn charges_number_tasks_in_order_and_closing_with_work_charged_means_executing() {
        let r = record();
        let ids: Vec<u32> = (0..3).map(|i| r.charge(SlotId::new(i, 1)).unwrap().seq).collect();
        assert_eq!(ids, vec![0, 1, 2]);
        assert!(!r.close());
        assert_eq!((r.phase(), r.active()), (RunState::Executing, 3));
        assert!(!r.reclaimed(1) && !r.reclaimed(1));
        assert!(r.reclaimed(1));
        assert_eq!(r.phase(), RunState::Completed);
        assert_eq!(r.wait_until(Some(Instant::now())), Some(RunOutcome::Completed));
    }

    #[test]
    fn recording_into_a_terminal_run_changes_nothing() {
        let r = record();
        r.close();
        assert!(!r.record(RunFailure::Submission { run: r.id, message: "late".into() }));
        assert_eq!(r.outcome(), Some(RunOutcome::Completed));
        assert!(r.failure().is_none());
        assert!(!r.force_failed(RunFailure::Internal { run: r.id, message: "late".into() }));
    }
}
