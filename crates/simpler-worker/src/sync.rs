//! Synchronization shim for the worker's small protocols (the close gate, the cleanup
//! election and the L2 run's fence), swapped for `loom`'s primitives under `cfg(simpler_loom)`
//! so that the same code is model-checked (`loom_models`).
//!
//! Normal builds use `parking_lot` (no poisoning). Under `cfg(simpler_loom)` the same names are
//! thin wrappers over `loom::sync` with the `parking_lot` calling convention (`lock()` returns
//! the guard). [`Condvar`] takes and returns guards by value in both builds, the one form both
//! libraries offer. Loom has no timed waits: there a timed wait is an untimed one.

use std::time::Instant;

#[cfg(simpler_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, Ordering};
#[cfg(not(simpler_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, Ordering};

#[cfg(simpler_loom)]
pub(crate) use loom_impl::{Mutex, MutexGuard};
#[cfg(not(simpler_loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};

/// A condition variable over [`Mutex`] guards, passed by value.
#[derive(Default)]
pub(crate) struct Condvar {
    #[cfg(not(simpler_loom))]
    inner: parking_lot::Condvar,
    #[cfg(simpler_loom)]
    inner: loom::sync::Condvar,
}

impl Condvar {
    /// Releases `guard`, blocks until notified (or spuriously woken), and relocks.
    #[cfg(not(simpler_loom))]
    pub(crate) fn wait<'a, T>(&self, mut guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.inner.wait(&mut guard);
        guard
    }

    /// As [`Condvar::wait`], giving up at `deadline`; the flag is true on timeout.
    #[cfg(not(simpler_loom))]
    pub(crate) fn wait_until<'a, T>(
        &self,
        mut guard: MutexGuard<'a, T>,
        deadline: Instant,
    ) -> (MutexGuard<'a, T>, bool) {
        let timed_out = self.inner.wait_until(&mut guard, deadline).timed_out();
        (guard, timed_out)
    }

    /// Releases `guard`, blocks until notified (or spuriously woken), and relocks.
    #[cfg(simpler_loom)]
    pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        // A poisoned loom mutex means the model already failed; keep the guard either way.
        self.inner.wait(guard).unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Loom models no time: an untimed wait that never reports a timeout.
    #[cfg(simpler_loom)]
    pub(crate) fn wait_until<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        _deadline: Instant,
    ) -> (MutexGuard<'a, T>, bool) {
        (self.wait(guard), false)
    }

    /// Waits once, until notified or `deadline` passes (`None`: without limit); the guard and
    /// whether the wait timed out.
    pub(crate) fn wait_deadline<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, T>, bool) {
        match deadline {
            None => (self.wait(guard), false),
            Some(d) => self.wait_until(guard, d),
        }
    }

    /// Wakes every waiter.
    pub(crate) fn notify_all(&self) {
        self.inner.notify_all();
    }
}

#[cfg(simpler_loom)]
mod loom_impl {
    //! A `parking_lot`-shaped wrapper over `loom::sync::Mutex`.

    pub(crate) use loom::sync::MutexGuard;

    /// `loom::sync::Mutex` with a non-poisoning `lock()`.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        /// Wraps `value`.
        pub(crate) fn new(value: T) -> Mutex<T> {
            Mutex(loom::sync::Mutex::new(value))
        }

        /// Locks, ignoring poisoning (a panic inside a model already fails it).
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }
}
