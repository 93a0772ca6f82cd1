//! Synchronization shim: the engine's locks and atomics, swapped for `loom`'s under
//! `cfg(simpler_loom)` so that the small core protocols can be model-checked unchanged.
//!
//! Normal builds use `parking_lot` locks (no poisoning, small, fast when uncontended) and `std`
//! atomics. Under `cfg(simpler_loom)` the same names resolve to thin wrappers over `loom::sync`
//! that present the `parking_lot` calling convention (`lock()` returns the guard directly).
//! [`Condvar`] takes and returns guards by value in both builds, because that is the only form
//! both libraries can offer.
//!
//! `Arc` is always `std::sync::Arc`: the models check the protocols built on these primitives,
//! not reference counting.

#[cfg(not(simpler_loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard, RwLock};
#[cfg(not(simpler_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};

#[cfg(simpler_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
#[cfg(simpler_loom)]
pub(crate) use loom_impl::{Mutex, MutexGuard, RwLock};

use std::time::Instant;

/// A condition variable over [`Mutex`] guards, passed by value.
#[derive(Default)]
pub(crate) struct Condvar {
    #[cfg(not(simpler_loom))]
    inner: parking_lot::Condvar,
    #[cfg(simpler_loom)]
    inner: loom::sync::Condvar,
}

impl Condvar {
    /// A condition variable nobody waits on yet.
    pub(crate) fn new() -> Condvar {
        Condvar::default()
    }

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

    /// As [`Condvar::wait`], giving up at `deadline`; the flag is true on timeout.
    #[cfg(simpler_loom)]
    pub(crate) fn wait_until<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        deadline: Instant,
    ) -> (MutexGuard<'a, T>, bool) {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.inner.wait_timeout(guard, left) {
            Ok((g, r)) => (g, r.timed_out()),
            Err(p) => {
                let (g, r) = p.into_inner();
                (g, r.timed_out())
            }
        }
    }

    /// Wakes one waiter.
    pub(crate) fn notify_one(&self) {
        self.inner.notify_one();
    }

    /// Wakes every waiter.
    pub(crate) fn notify_all(&self) {
        self.inner.notify_all();
    }
}

#[cfg(simpler_loom)]
mod loom_impl {
    //! `parking_lot`-shaped wrappers over `loom::sync` locks.

    use std::sync::PoisonError;

    pub(crate) use loom::sync::MutexGuard;
    pub(crate) use loom::sync::{RwLockReadGuard, RwLockWriteGuard};

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
            self.0.lock().unwrap_or_else(PoisonError::into_inner)
        }

        /// Whether the lock is taken: always `false` here, since its only use is a spin hint,
        /// which a model does not need (and loom has no such query).
        pub(crate) fn is_locked(&self) -> bool {
            false
        }

        /// Locks if free.
        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(g) => Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }
    }

    /// `loom::sync::RwLock` with non-poisoning `read()` and `write()`.
    #[derive(Debug, Default)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        /// Wraps `value`.
        #[allow(dead_code, reason = "mirrors the parking_lot API used in normal builds")]
        pub(crate) fn new(value: T) -> RwLock<T> {
            RwLock(loom::sync::RwLock::new(value))
        }

        /// Shared access.
        pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(PoisonError::into_inner)
        }

        /// Exclusive access.
        pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(PoisonError::into_inner)
        }
    }
}

/// A flag with a condition variable: one side sets it, the other waits for it.
#[derive(Default)]
pub(crate) struct Signal {
    set: Mutex<bool>,
    cond: Condvar,
}

impl Signal {
    /// Sets the flag and wakes every waiter.
    pub(crate) fn set(&self) {
        *self.set.lock() = true;
        self.cond.notify_all();
    }

    /// Waits until the flag is set or `deadline` passes (`None`: without limit). Returns
    /// whether it was set; with `consume`, also clears it for the next wait.
    pub(crate) fn wait(&self, deadline: Option<Instant>, consume: bool) -> bool {
        let mut g = self.set.lock();
        while !*g {
            match deadline {
                None => g = self.cond.wait(g),
                Some(d) => {
                    let (ng, timed_out) = self.cond.wait_until(g, d);
                    g = ng;
                    if timed_out {
                        break;
                    }
                }
            }
        }
        let was_set = *g;
        if consume {
            *g = false;
        }
        was_set
    }
}

/// A sequentially consistent fence (the Dekker-style handshakes of the combining protocol).
pub(crate) fn fence_seq_cst() {
    #[cfg(not(simpler_loom))]
    std::sync::atomic::fence(Ordering::SeqCst);
    #[cfg(simpler_loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}

/// Pause instructions before the first yield (see [`spin_until`]).
#[cfg(not(simpler_loom))]
const SPINS: u32 = 8;
/// `yield_now` calls before giving up (see [`spin_until`]).
#[cfg(not(simpler_loom))]
const YIELDS: u32 = 32;

/// Spin briefly, then give up: the short busy phase before a thread parks.
///
/// A park/unpark pair costs several microseconds on small machines, far more than one
/// cross-core handoff, so the hot handoffs (worker mailbox) poll a lock-free "something
/// arrived" flag before they park: first `SPINS` pause instructions (a fraction of a
/// microsecond), then up to `YIELDS` calls to `yield_now` (a few microseconds in all). Yielding
/// early matters when the kernel places the two threads of a handoff on one core, or on two SMT
/// siblings: a pure spin holds the execution resources the other thread needs to produce the
/// event. Measured on a 2-vCPU machine with a 10 000-step dependent chain: a 127-pause
/// `Backoff`-style spin cost 5–6 µs per step, 64 pauses then yields 2.5–7 µs, this policy about
/// 2.2 µs, steadily.
pub(crate) fn spin_until(mut ready: impl FnMut() -> bool) -> bool {
    #[cfg(not(simpler_loom))]
    {
        for _ in 0..SPINS {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        for _ in 0..YIELDS {
            if ready() {
                return true;
            }
            std::thread::yield_now();
        }
        ready()
    }
    #[cfg(simpler_loom)]
    {
        // Loom explores interleavings itself; a spin would only multiply its state space.
        ready()
    }
}
