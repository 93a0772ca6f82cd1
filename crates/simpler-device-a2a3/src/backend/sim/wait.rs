//! Spin briefly, then park on an event count (spec §5.5; 00 design decision 2).
//!
//! Every wait of the simulator follows the same pattern:
//!
//! 1. Read the [`EventCount`] epoch.
//! 2. Check the condition; if it holds, stop.
//! 3. Spin (`spin_loop` hints) for the first `spins` rounds — but only while the device's
//!    awake threads leave a host core free ([`SpinGate`]) — then `yield_now` for
//!    `yields` rounds, then park until the epoch differs from the one read in step 1 or the
//!    deadline passes; go to 1.
//!
//! Every writer of a waited-for value changes the value first and then calls
//! [`EventCount::notify`], which bumps the epoch. A waiter that read the epoch before the write
//! either sees the new value in step 2 or finds the epoch changed when it parks, so no wakeup is
//! lost (see `EventCount::park` for the lock argument). The deadline is the nearest watchdog
//! deadline of the waiter, so watchdogs fire while it is parked.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// Counts the simulated threads of one device that are not parked, so a waiter spins only
/// when a core is free for it (decision: spec §5.5 says "0 spins when simulated threads
/// outnumber cores"; counting awake threads instead of all threads keeps spinning useful when
/// most simulated cores are idle, which is the common case).
///
/// `awake` is incremented by a thread when it stops parking and decremented when it starts;
/// it is read relaxed by waiters deciding whether to spin (a stale value only costs a few
/// wasted or skipped spins).
#[derive(Debug)]
pub(crate) struct SpinGate {
    awake: AtomicU32,
    cores: u32,
}

impl SpinGate {
    /// A gate for a host with `cores` cores and no awake thread.
    pub(crate) fn new(cores: u32) -> SpinGate {
        SpinGate { awake: AtomicU32::new(0), cores: cores.max(1) }
    }

    /// A thread stopped parking.
    pub(crate) fn wake(&self) {
        self.awake.fetch_add(1, Ordering::Relaxed);
    }

    /// A thread is about to park.
    pub(crate) fn sleep(&self) {
        self.awake.fetch_sub(1, Ordering::Relaxed);
    }

    /// Spinning needs a core nobody else wants: awake threads (the waiter included) must leave
    /// one core free for the host thread and for whoever the waiter waits on.
    fn may_spin(&self) -> bool {
        self.awake.load(Ordering::Relaxed) < self.cores
    }
}

/// An epoch counter with parked waiters.
///
/// `epoch` is bumped by every notifier and read by every waiter; `waiters` counts threads
/// inside `park`, so a notifier skips the lock when nobody sleeps. Both use `SeqCst`: the
/// notifier's "bump epoch, then read waiters" and the waiter's "count itself, then re-read the
/// epoch under the lock" must not be reordered against each other (a Dekker pattern).
#[derive(Debug, Default)]
pub(crate) struct EventCount {
    epoch: AtomicU64,
    waiters: AtomicU32,
    lock: Mutex<()>,
    cv: Condvar,
}

impl EventCount {
    /// The current epoch; read it before checking the condition.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Bumps the epoch and wakes every parked waiter.
    pub(crate) fn notify(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this wakeup after any waiter that is between its epoch
            // re-check and `cv.wait`, which holds the lock across that window.
            let _guard = self.lock.lock();
            self.cv.notify_all();
        }
    }

    /// Parks until the epoch differs from `observed` or `deadline` passes.
    pub(crate) fn park(&self, observed: u64, deadline: Option<Instant>, gate: &SpinGate) {
        gate.sleep();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut guard = self.lock.lock();
        while self.epoch.load(Ordering::SeqCst) == observed {
            match deadline {
                Some(d) => {
                    if self.cv.wait_until(&mut guard, d).timed_out() {
                        break;
                    }
                }
                None => self.cv.wait(&mut guard),
            }
        }
        drop(guard);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        gate.wake();
    }
}

/// How long a waiter spins and yields before it parks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpinPolicy<'a> {
    /// Rounds of `spin_loop` hints.
    pub(crate) spins: u32,
    /// Rounds of `yield_now` after the spins.
    pub(crate) yields: u32,
    /// The device's awake-thread count.
    pub(crate) gate: &'a SpinGate,
}

impl SpinPolicy<'_> {
    /// One round of backing off before re-checking; parks (on `ec`, until its epoch moves past
    /// `observed` or `deadline`) once the spin and yield rounds are used up.
    pub(crate) fn backoff(
        self,
        round: u32,
        ec: &EventCount,
        observed: u64,
        deadline: Option<Instant>,
    ) {
        if round < self.spins && self.gate.may_spin() {
            for _ in 0..(1u32 << round.min(4)) {
                std::hint::spin_loop();
            }
        } else if round < self.spins.saturating_add(self.yields) {
            std::thread::yield_now();
        } else {
            ec.park(observed, deadline, self.gate);
        }
    }

    /// Waits until `done()` holds or `deadline` passes; returns whether it holds.
    pub(crate) fn wait_until(
        self,
        ec: &EventCount,
        deadline: Option<Instant>,
        mut done: impl FnMut() -> bool,
    ) -> bool {
        let mut round = 0u32;
        loop {
            let observed = ec.epoch();
            if done() {
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            self.backoff(round, ec, observed, deadline);
            round = round.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    #[test]
    fn notify_wakes_a_parked_waiter_without_loss() {
        for _ in 0..200 {
            let ec = Arc::new(EventCount::default());
            let flag = Arc::new(AtomicBool::new(false));
            let (ec2, flag2) = (ec.clone(), flag.clone());
            let t = std::thread::spawn(move || {
                let gate = SpinGate::new(1);
                let policy = SpinPolicy { spins: 0, yields: 0, gate: &gate };
                policy.wait_until(&ec2, Some(Instant::now() + Duration::from_secs(20)), || {
                    flag2.load(Ordering::SeqCst)
                })
            });
            flag.store(true, Ordering::SeqCst);
            ec.notify();
            assert!(t.join().unwrap());
        }
    }

    #[test]
    fn park_returns_at_the_deadline() {
        let ec = EventCount::default();
        let gate = SpinGate::new(1);
        let policy = SpinPolicy { spins: 1, yields: 1, gate: &gate };
        assert!(!policy.wait_until(&ec, Some(Instant::now() + Duration::from_millis(5)), || false));
    }
}
