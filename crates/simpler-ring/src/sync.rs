//! Concurrency primitives behind one seam, so the crate's protocols can be model-checked.
//!
//! Normal builds use `parking_lot` locks and `std` atomics. Builds with `--cfg simpler_loom` swap
//! in `loom`'s versions, which explore every interleaving of the code that uses them. The
//! wrappers give both a by-value guard API (`wait` consumes and returns the guard) because that
//! is the shape `loom` offers, and it costs nothing with `parking_lot`.
//!
//! Under `loom`, time does not exist: a deadline wait that has not expired yet waits for a
//! notification. The model tests therefore only use waits without a deadline.

use std::time::Instant;

#[cfg(not(simpler_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(simpler_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(not(simpler_loom))]
mod imp {
    use std::time::Instant;

    pub(crate) type Guard<'a, T> = parking_lot::MutexGuard<'a, T>;

    /// A mutual-exclusion lock that never poisons.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(parking_lot::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> Guard<'_, T> {
            self.0.lock()
        }
    }

    /// A condition variable paired with [`Mutex`].
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(parking_lot::Condvar::new())
        }

        pub(crate) fn wait<'a, T>(&self, mut guard: Guard<'a, T>) -> Guard<'a, T> {
            self.0.wait(&mut guard);
            guard
        }

        pub(crate) fn wait_until<'a, T>(
            &self,
            mut guard: Guard<'a, T>,
            deadline: Instant,
        ) -> Guard<'a, T> {
            // Whether the wait timed out does not matter: every caller re-checks its condition
            // and the deadline after waking.
            let _ = self.0.wait_until(&mut guard, deadline);
            guard
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

#[cfg(simpler_loom)]
mod imp {
    use std::time::Instant;

    pub(crate) type Guard<'a, T> = loom::sync::MutexGuard<'a, T>;

    /// A mutual-exclusion lock; poisoning is ignored because no code holding it panics.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> Guard<'_, T> {
            self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }

    /// A condition variable paired with [`Mutex`].
    #[derive(Debug)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }

        pub(crate) fn wait<'a, T>(&self, guard: Guard<'a, T>) -> Guard<'a, T> {
            self.0.wait(guard).unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        pub(crate) fn wait_until<'a, T>(
            &self,
            guard: Guard<'a, T>,
            _deadline: Instant,
        ) -> Guard<'a, T> {
            // `loom` has no clock; waiting for a notification is the only behaviour it can model.
            self.wait(guard)
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

pub(crate) use imp::{Condvar, Guard, Mutex};

/// Waits on `cond` until notified or until `deadline` (if any) passes.
pub(crate) fn wait_for<'a, T>(
    cond: &Condvar,
    guard: Guard<'a, T>,
    deadline: Option<Instant>,
) -> Guard<'a, T> {
    match deadline {
        Some(deadline) => cond.wait_until(guard, deadline),
        None => cond.wait(guard),
    }
}
