//! The scheduler's inbox: ready tasks from the orchestration thread, member completions from
//! worker threads, and the stop request (spec 30 §6.1).
//!
//! # Handoff protocol
//!
//! 1. A producer locks the inbox, appends its event, sets `pending`, and if the scheduler has
//!    announced that it sleeps (`sleeping`, read under the same lock) clears that flag and
//!    notifies the condition variable. A push wakes at most one thread, and only when the
//!    scheduler is actually parked.
//! 2. The scheduler, looking for work, first spins briefly on `pending` (lock-free), then locks
//!    the inbox. If it is empty and no stop was requested, it sets `sleeping` under the lock and
//!    waits; a producer in step 1 therefore either saw `sleeping` or pushed before the scheduler
//!    checked emptiness — no lost wake-up.
//! 3. With events present, the scheduler swaps the inbox vectors with its own (emptied) ones and
//!    clears `pending`, so both sides keep their capacity and nothing is allocated per event.
//! 4. After the scheduler's final drain it closes the inbox: later pushes are refused and the
//!    pusher resolves what it owned itself.
//!
//! `pending` (writers: producers under the lock, the scheduler under the lock; reader: the
//! spinning scheduler, lock-free) is only a hint: the decision to sleep is always taken under the
//! lock.

use std::time::Instant;

use simpler_types::SlotId;

use crate::endpoint::EndpointFailure;
use crate::slot::Route;
use crate::sync::{self, AtomicBool, Condvar, Mutex, Ordering};

/// A task that became ready outside the scheduler (publication at submit).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadyEntry {
    /// The task's slot.
    pub(crate) slot: SlotId,
    /// Its queue.
    pub(crate) route: Route,
}

/// Which worker a completion comes from: its type and registration index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WorkerSlot {
    /// NEXT_LEVEL worker at this registration index.
    NextLevel(u32),
    /// SUB worker at this index.
    Sub(u32),
}

/// One member's result, echoed from the dispatch the worker received.
#[derive(Debug)]
pub(crate) struct MemberCompletion {
    /// The task's slot.
    pub(crate) slot: SlotId,
    /// The member index that was dispatched.
    pub(crate) member: u32,
    /// The worker that ran it.
    pub(crate) worker: WorkerSlot,
    /// What the endpoint returned.
    pub(crate) result: Result<(), EndpointFailure>,
}

/// Events taken by the scheduler in one go.
#[derive(Default)]
pub(crate) struct InboxBatch {
    /// Ready tasks, in push order.
    pub(crate) ready: Vec<ReadyEntry>,
    /// Completions, in arrival order.
    pub(crate) completions: Vec<MemberCompletion>,
    /// A stop was requested (reported by exactly one take).
    pub(crate) stop: bool,
}

#[derive(Default)]
struct InboxState {
    ready: Vec<ReadyEntry>,
    completions: Vec<MemberCompletion>,
    stop: bool,
    sleeping: bool,
    closed: bool,
}

/// The inbox (one mutex, one condition variable).
#[derive(Default)]
pub(crate) struct Inbox {
    state: Mutex<InboxState>,
    wake: Condvar,
    /// See the module docs.
    pending: AtomicBool,
}

/// The inbox was closed by the scheduler's final drain; the event was not delivered.
#[derive(Debug)]
pub(crate) struct Closed;

impl Inbox {
    /// Step 1 for a ready task.
    pub(crate) fn push_ready(&self, entry: ReadyEntry) -> Result<(), Closed> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(Closed);
        }
        s.ready.push(entry);
        self.wake_locked(&mut s);
        Ok(())
    }

    /// Step 1 for a completion. A completion can only exist while its worker is busy, and the
    /// scheduler closes the inbox only when no worker is busy, so this cannot be refused; a
    /// refusal is reported for the caller to log.
    pub(crate) fn push_completion(&self, completion: MemberCompletion) -> Result<(), Closed> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(Closed);
        }
        s.completions.push(completion);
        self.wake_locked(&mut s);
        Ok(())
    }

    /// Asks the scheduler to stop (spec 30 §8 step 4).
    pub(crate) fn request_stop(&self) {
        let mut s = self.state.lock();
        s.stop = true;
        self.wake_locked(&mut s);
    }

    fn wake_locked(&self, s: &mut InboxState) {
        // Relaxed: a hint for the spinner; the lock orders the event itself.
        self.pending.store(true, Ordering::Relaxed);
        if s.sleeping {
            s.sleeping = false;
            self.wake.notify_one();
        }
    }

    /// Steps 2–3: waits for events (spinning briefly first) and swaps them into `batch`, whose
    /// vectors must be empty. Returns `false` only when `deadline` passed with nothing to take.
    pub(crate) fn take(&self, batch: &mut InboxBatch, deadline: Option<Instant>) -> bool {
        debug_assert!(batch.ready.is_empty() && batch.completions.is_empty());
        // Relaxed: only decides whether to keep spinning; emptiness is re-checked under the lock.
        sync::spin_until(|| self.pending.load(Ordering::Relaxed));
        let mut s = self.state.lock();
        loop {
            if !s.ready.is_empty() || !s.completions.is_empty() || s.stop {
                std::mem::swap(&mut s.ready, &mut batch.ready);
                std::mem::swap(&mut s.completions, &mut batch.completions);
                // The stop request is reported once; afterwards the scheduler waits only for
                // the completions of members still running (no spinning while it drains).
                batch.stop = std::mem::take(&mut s.stop);
                self.pending.store(false, Ordering::Relaxed);
                return true;
            }
            s.sleeping = true;
            match deadline {
                None => s = self.wake.wait(s),
                Some(d) => {
                    let (g, timed_out) = self.wake.wait_until(s, d);
                    s = g;
                    if timed_out && s.ready.is_empty() && s.completions.is_empty() && !s.stop {
                        s.sleeping = false;
                        return false;
                    }
                }
            }
        }
    }

    /// Step 4: refuses every later push and returns what arrived since the last take.
    pub(crate) fn close(&self, batch: &mut InboxBatch) {
        let mut s = self.state.lock();
        s.closed = true;
        batch.ready.append(&mut s.ready);
        batch.completions.append(&mut s.completions);
    }
}
