//! The cleanup election of one run (steps 1, 2 and 5 of the protocol in [`run`](crate::run)):
//! which waiter performs the run's cleanup, and how everyone gets its one result.
//!
//! # Protocol
//!
//! One mutex holds the result, the elected flag and the values to drop after publication; one
//! condition variable wakes parked waiters.
//!
//! 1. **Enter.** Published → a clone of the result. Another waiter elected → park until
//!    publication, un-election or the deadline. Otherwise become the elected waiter.
//! 2. **Give up.** An elected waiter that stops before the cleanup (its deadline passed, or it
//!    unwound) clears the flag and wakes every parked waiter: one of them is elected next.
//! 3. **Publish.** The elected waiter stores the result, clears the flag, wakes every waiter
//!    and takes the values to drop, which it drops outside the lock.
//!
//! So the cleanup runs at most once per run, every waiter that returns a result returns the one
//! stored, and no waiter parks for good while a result can still come.

use std::any::Any;
use std::time::Instant;

use crate::sync::{Condvar, Mutex};

struct Cell<T> {
    result: Option<T>,
    elected: bool,
    keep: Vec<Box<dyn Any + Send>>,
}

/// The election state of one run; `T` is the run's result.
pub(crate) struct Election<T> {
    cell: Mutex<Cell<T>>,
    cv: Condvar,
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

    /// Step 1.
    pub(crate) fn enter(&self, deadline: Option<Instant>) -> Turn<T> {
        let mut cell = self.cell.lock();
        loop {
            if let Some(r) = &cell.result {
                return Turn::Published(r.clone());
            }
            if !cell.elected {
                cell.elected = true;
                return Turn::Elected;
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
        cell.elected = false;
        self.cv.notify_all();
    }

    /// Step 3 (elected waiters only): stores `result` and returns the values to drop.
    pub(crate) fn publish(&self, result: T) -> Vec<Box<dyn Any + Send>> {
        let mut cell = self.cell.lock();
        cell.result = Some(result);
        cell.elected = false;
        self.cv.notify_all();
        std::mem::take(&mut cell.keep)
    }
}
