//! The launch acceptance signal: a sticky word a consumer reads (or waits on) to learn that a
//! run's kernels were accepted by the device, before the run completes.
//!
//! Invariant: the runner stores a run's value at most once, with release ordering, right after
//! both kernels of that run were launched and before anything waits for the run; it never
//! stores on a launch failure and never clears the word. Only the consumer resets it (for its
//! next run). A waiter that reads a non-zero value with acquire ordering therefore sees every
//! host write the runner made before the launch. `docs/pipelining.md` describes the protocol.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// A sticky "the device accepted the run" word shared between a runner and its consumer.
///
/// `0` means "not accepted"; the runner publishes the value the request named (non-zero).
#[derive(Debug, Default)]
pub struct AcceptanceSignal {
    value: AtomicU64,
    /// Waiters park here; the mutex orders a waiter's check against the publisher's notify.
    lock: Mutex<()>,
    cv: Condvar,
}

impl AcceptanceSignal {
    /// A signal that reads "not accepted".
    pub fn new() -> AcceptanceSignal {
        AcceptanceSignal::default()
    }

    /// The published value, or `None` while no run was accepted since the last reset.
    pub fn accepted(&self) -> Option<u64> {
        match self.value.load(Ordering::Acquire) {
            0 => None,
            v => Some(v),
        }
    }

    /// Waits at most `timeout` for a value; returns it, or `None` on timeout.
    pub fn wait(&self, timeout: Duration) -> Option<u64> {
        let deadline = Instant::now().checked_add(timeout);
        let mut guard = self.lock.lock();
        loop {
            if let Some(v) = self.accepted() {
                return Some(v);
            }
            match deadline {
                Some(d) => {
                    if self.cv.wait_until(&mut guard, d).timed_out() {
                        return self.accepted();
                    }
                }
                None => self.cv.wait(&mut guard),
            }
        }
    }

    /// Clears the signal for the consumer's next run.
    pub fn reset(&self) {
        self.value.store(0, Ordering::Release);
    }

    /// Publishes `value` (non-zero) and wakes every waiter.
    pub(crate) fn publish(&self, value: u64) {
        let _guard = self.lock.lock();
        self.value.store(value, Ordering::Release);
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_published_value_is_sticky_until_the_consumer_resets_it() {
        let s = AcceptanceSignal::new();
        assert_eq!(s.accepted(), None);
        assert_eq!(s.wait(Duration::from_millis(1)), None);
        s.publish(7);
        assert_eq!(s.accepted(), Some(7));
        assert_eq!(s.wait(Duration::ZERO), Some(7));
        s.reset();
        assert_eq!(s.accepted(), None);
    }

    #[test]
    fn waiters_on_several_threads_all_see_each_publication() {
        // Hammer: publishers and waiters race; no waiter may miss a publication (lost wakeup)
        // or see a value that was not published in its round.
        for round in 1..=200u64 {
            let s = Arc::new(AcceptanceSignal::new());
            let waiters: Vec<_> = (0..3)
                .map(|_| {
                    let s = Arc::clone(&s);
                    std::thread::spawn(move || s.wait(Duration::from_secs(10)))
                })
                .collect();
            s.publish(round);
            for w in waiters {
                assert_eq!(w.join().unwrap(), Some(round), "round {round}");
            }
        }
    }
}
