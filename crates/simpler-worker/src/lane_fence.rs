//! The fence of an L2 run: set once by the chip lane when the run was reaped, waited for by
//! the run's elected waiter (`docs/pipelining.md`, "The L2 chip lane at depth 2", step 7).
//!
//! Invariant: `done` holds the result and `is_set` is true, or neither, for anyone who reads
//! `done` under its lock or sees the flag; both are set once, together under the lock, and
//! never change again. A waiter that sees the flag therefore finds the result under the lock;
//! one that does not parks on the condition variable after re-checking `done` under the lock,
//! and `set` notifies after storing, so no wake-up is lost.

use std::time::Instant;

use simpler_sched::EndpointFailure;

use crate::linger;
use crate::sync::{AtomicBool, Condvar, Mutex, Ordering};

/// What the lane stores: the run's failure mapped as at L3 (`chip::device_failure`).
pub(crate) type LaneResult = Result<(), EndpointFailure>;

/// The fence of one L2 run.
#[derive(Default)]
pub(crate) struct LaneFence {
    done: Mutex<Option<LaneResult>>,
    cv: Condvar,
    /// Mirrors `done.is_some()` without the lock, for a waiter that yields before it parks.
    is_set: AtomicBool,
}

impl LaneFence {
    /// Stores the run's result and wakes its waiters. Called once per run, by the lane.
    pub(crate) fn set(&self, r: LaneResult) {
        let mut done = self.done.lock();
        *done = Some(r);
        // Release after the store, and under the lock: a waiter that sees the flag finds the
        // result under the lock, and one that finds the result under the lock sees the flag.
        self.is_set.store(true, Ordering::Release);
        drop(done);
        self.cv.notify_all();
    }

    /// Whether the fence is set (the result itself is read by [`with_result`](Self::with_result)).
    pub(crate) fn is_set(&self) -> bool {
        self.is_set.load(Ordering::Acquire)
    }

    /// Waits until the fence is set or `deadline` passes; whether it is set. A lone run through
    /// the lane usually ends within tens of µs, so the wait yields for up to
    /// [`linger::LINGER`] before it parks, as the lane's own hand-offs do.
    pub(crate) fn wait(&self, deadline: Option<Instant>) -> bool {
        if linger::until(|| self.is_set(), deadline) {
            return true;
        }
        let mut done = self.done.lock();
        while done.is_none() {
            let (guard, timed_out) = self.cv.wait_deadline(done, deadline);
            done = guard;
            if timed_out {
                return done.is_some();
            }
        }
        true
    }

    /// Calls `f` with the stored result (`None` while the fence is not set).
    pub(crate) fn with_result<R>(&self, f: impl FnOnce(Option<&LaneResult>) -> R) -> R {
        f(self.done.lock().as_ref())
    }
}
