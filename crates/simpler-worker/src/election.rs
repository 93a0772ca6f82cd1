//! The cleanup election of one run (steps 1, 2 and 5 of the protocol in [`run`](crate::run)):
//! which waiter performs the run's cleanup, and how everyone gets its one result.
//!
//! # Protocol
//!
//! One mutex holds the result, the elected flag and the values to drop after publication; one
//! condition variable wakes parked waiters.
//!
//! 1. **Enter.** Published → a clone of the result. Another waiter elected → yield for the
//!    caller's linger budget (once per entry, never past the deadline; none at all for a zero
//!    budget) until that waiter publishes or gives up, relock and decide again, then park until
//!    publication, un-election or the deadline. Otherwise become the elected waiter.
//! 2. **Give up.** An elected waiter that stops before the cleanup (its deadline passed, or it
//!    unwound) clears the flag and wakes every parked waiter: one of them is elected next.
//! 3. **Publish.** The elected waiter stores the result, clears the flag, wakes every waiter
//!    and takes the values to drop, which it drops outside the lock.
//!
//! So the cleanup runs at most once per run, every waiter that returns a result returns the one
//! stored, and no waiter parks for good while a result can still come.
//!
//! The yield of step 1 looks at a mirror of the elected flag kept outside the lock, stored
//! under the lock whenever the flag changes. It is only a hint: whatever the yield saw, the
//! waiter relocks and decides from the cell, so the protocol's guarantees do not depend on it.
//! It exists because two threads often wait for the same L2 run (a stream's admission wait and
//! the thread that collects its results), and a parked one costs a wake-up per run that a
//! virtual machine charges as much as the run's own host work (`docs/pipelining.md`, step 7).
//! Runs of an engine (L3 and up) usually take far longer than a linger, so their waiters pass
//! a zero budget and park at once.

use std::any::Any;
use std::time::{Duration, Instant};

use crate::linger;
use crate::sync::{AtomicBool, Condvar, Mutex, Ordering};

struct Cell<T> {
    result: Option<T>,
    elected: bool,
    keep: Vec<Box<dyn Any + Send>>,
}

/// The election state of one run; `T` is the run's result.
pub(crate) struct Election<T> {
    cell: Mutex<Cell<T>>,
    cv: Condvar,
    /// Mirrors `cell.elected`, for a waiter that yields before it parks (module docs).
    elected: AtomicBool,
}

/// What [`Election::enter`] decided.
pub(crate) enum Turn<T> {
    /// The result, published by another waiter.
    Published(T),
    /// The deadline passed with nothing published and another waiter elected.
    Expired,
    /// This waiter is elected: it runs the cleanup and then publishes (or gives up).
    Elected,
}

impl<T: Clone> Election<T> {
    /// Nothing published, nobody elected.
    pub(crate) fn new() -> Election<T> {
        Election {
            cell: Mutex::new(Cell { result: None, elected: false, keep: Vec::new() }),
            cv: Condvar::default(),
            elected: AtomicBool::new(false),
        }
    }

    /// Adds values to drop after publication.
    pub(crate) fn keep(&self, values: impl IntoIterator<Item = Box<dyn Any + Send>>) {
        self.cell.lock().keep.extend(values);
    }

    /// Whether a result is published.
    pub(crate) fn is_published(&self) -> bool {
        self.cell.lock().result.is_some()
    }

    /// Step 1, yielding for up to `linger` behind another elected waiter before parking.
    pub(crate) fn enter(&self, deadline: Option<Instant>, linger: Duration) -> Turn<T> {
        let mut cell = self.cell.lock();
        let mut yielded = false;
        loop {
            if let Some(r) = &cell.result {
                return Turn::Published(r.clone());
            }
            if !cell.elected {
                self.set_elected(&mut cell, true);
                return Turn::Elected;
            }
            if !yielded && !linger.is_zero() {
                yielded = true;
                drop(cell);
                linger::until_for(|| !self.elected.load(Ordering::Acquire), linger, deadline);
                cell = self.cell.lock();
                continue;
            }
            let (c, timed_out) = self.cv.wait_deadline(cell, deadline);
            cell = c;
            if timed_out {
                return match &cell.result {
                    Some(r) => Turn::Published(r.clone()),
                    None => Turn::Expired,
                };
            }
        }
    }

    /// Step 2 (elected waiters only).
    pub(crate) fn give_up(&self) {
        let mut cell = self.cell.lock();
        self.set_elected(&mut cell, false);
        self.cv.notify_all();
    }

    /// Step 3 (elected waiters only): stores `result` and returns the values to drop.
    pub(crate) fn publish(&self, result: T) -> Vec<Box<dyn Any + Send>> {
        let mut cell = self.cell.lock();
        cell.result = Some(result);
        self.set_elected(&mut cell, false);
        self.cv.notify_all();
        std::mem::take(&mut cell.keep)
    }

    /// Sets the elected flag and its mirror, under the lock.
    fn set_elected(&self, cell: &mut Cell<T>, elected: bool) {
        cell.elected = elected;
        self.elected.store(elected, Ordering::Release);
    }
}

// Timed waits and threads: normal builds only (`loom_models` checks the protocol itself).
#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    use super::*;

    /// Long enough that a waiter given it is still yielding when the test acts.
    const YIELDS: Duration = Duration::from_secs(60);

    /// A fresh election with one waiter elected, and a second waiter entering behind it on its
    /// own thread with `linger`; the barrier is passed just before it enters.
    fn behind(linger: Duration) -> (Arc<Election<u32>>, std::thread::JoinHandle<Turn<u32>>) {
        let e = Arc::new(Election::new());
        assert!(matches!(e.enter(None, Duration::ZERO), Turn::Elected));
        let entering = Arc::new(Barrier::new(2));
        let waiter = {
            let (e, entering) = (Arc::clone(&e), Arc::clone(&entering));
            std::thread::spawn(move || {
                entering.wait();
                e.enter(None, linger)
            })
        };
        entering.wait();
        // Well inside the waiter's linger, or past its park with a zero one.
        std::thread::sleep(Duration::from_millis(20));
        (e, waiter)
    }

    #[test]
    fn a_waiter_behind_the_elected_one_gets_its_result_whether_it_yields_or_parks() {
        for linger in [YIELDS, Duration::ZERO] {
            let (e, waiter) = behind(linger);
            assert!(e.publish(7).is_empty());
            match waiter.join().expect("waiter") {
                Turn::Published(r) => assert_eq!(r, 7, "linger {linger:?}"),
                _ => panic!("the waiter did not get the published result (linger {linger:?})"),
            }
        }
    }

    #[test]
    fn a_waiter_behind_one_that_gives_up_is_elected_next_whether_it_yields_or_parks() {
        for linger in [YIELDS, Duration::ZERO] {
            let (e, waiter) = behind(linger);
            e.give_up();
            assert!(
                matches!(waiter.join().expect("waiter"), Turn::Elected),
                "the waiter did not take over (linger {linger:?})"
            );
        }
    }

    #[test]
    fn a_deadline_ends_the_wait_behind_an_elected_waiter_also_while_it_yields() {
        let e = Election::<u32>::new();
        assert!(matches!(e.enter(None, Duration::ZERO), Turn::Elected));
        let deadline = Instant::now() + Duration::from_millis(5);
        assert!(matches!(e.enter(Some(deadline), YIELDS), Turn::Expired));
        assert!(Instant::now() >= deadline, "gave up before its deadline");
        let past = Some(Instant::now());
        assert!(matches!(e.enter(past, YIELDS), Turn::Expired), "a past deadline looks once");
    }
}
