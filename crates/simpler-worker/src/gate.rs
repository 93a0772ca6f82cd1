//! The close gate: a worker's lifecycle, its operation leases and its one close attempt
//! (steps 2–4 and 7 of the close protocol in [`close`](crate::close)).
//!
//! # Protocol
//!
//! All state is under one mutex, with one condition variable for every wait:
//!
//! 1. **Lease.** An operation takes a lease unless the gate is closed; dropping the lease wakes
//!    the waiters when it was the last one.
//! 2. **Claim.** A closer parks while an attempt is in flight, until its own deadline if it
//!    has one; a finished attempt hands its result to every later closer, unless the caller
//!    says it may be retried (a drain timeout). Otherwise the closer claims: the gate closes
//!    (no new lease from now on) and the attempt is in flight.
//! 3. **Drain.** The claimer waits until no lease is held, or until its deadline.
//! 4. **Finish.** The claimer stores the attempt's result and wakes every parked closer. A
//!    claim whose closer unwinds is finished by [`Claim`]'s drop with a result it makes, so no
//!    closer waits for an attempt that will never end.
//!
//! So however many threads close at once, one of them performs the close and all get its
//! result; a lease taken before the claim is returned before the claimer goes on, and none is
//! taken after it.

use std::time::Instant;

use crate::sync::{Condvar, Mutex};

enum Attempt<R> {
    None,
    InFlight,
    Done(R),
}

struct State<R> {
    closed: bool,
    leases: usize,
    attempt: Attempt<R>,
}

/// The close gate of one worker; `R` is the result of a close.
pub(crate) struct Gate<R> {
    state: Mutex<State<R>>,
    cv: Condvar,
}

/// A held operation lease (step 1).
pub(crate) struct Lease<'a, R> {
    gate: &'a Gate<R>,
}

impl<R> Drop for Lease<'_, R> {
    fn drop(&mut self) {
        let mut s = self.gate.state.lock();
        s.leases -= 1;
        if s.leases == 0 {
            self.gate.cv.notify_all();
        }
    }
}

/// A claimed close attempt (step 2); finish it with [`Claim::finish`].
pub(crate) struct Claim<'a, R> {
    gate: &'a Gate<R>,
    /// The result stored if the claimer unwinds before finishing.
    on_unwind: Option<Box<dyn FnOnce() -> R + 'a>>,
}

impl<R> Claim<'_, R> {
    /// Step 3: waits until no lease is held; `Err` with the leases still held at `deadline`.
    pub(crate) fn drain_leases(&self, deadline: Option<Instant>) -> Result<(), usize> {
        let mut s = self.gate.state.lock();
        while s.leases > 0 {
            let (g, timed_out) = self.gate.cv.wait_deadline(s, deadline);
            s = g;
            if timed_out && s.leases > 0 {
                return Err(s.leases);
            }
        }
        Ok(())
    }

    /// Step 4: stores the attempt's result and wakes every parked closer.
    pub(crate) fn finish(mut self, result: R) {
        self.on_unwind = None;
        self.gate.end(result);
    }
}

impl<R> Drop for Claim<'_, R> {
    fn drop(&mut self) {
        if let Some(make) = self.on_unwind.take() {
            self.gate.end(make());
        }
    }
}

impl<R: Clone> Gate<R> {
    /// An open gate with no lease and no attempt.
    pub(crate) fn new() -> Gate<R> {
        Gate {
            state: Mutex::new(State { closed: false, leases: 0, attempt: Attempt::None }),
            cv: Condvar::default(),
        }
    }

    /// Whether the gate is closed (a close was claimed).
    pub(crate) fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// Step 1: a lease, or `None` once closed.
    pub(crate) fn lease(&self) -> Option<Lease<'_, R>> {
        let mut s = self.state.lock();
        if s.closed {
            return None;
        }
        s.leases += 1;
        Some(Lease { gate: self })
    }

    /// The result of the last finished attempt when `retry` wants it retried.
    pub(crate) fn last_result(&self, retry: impl Fn(&R) -> bool) -> Option<R> {
        match &self.state.lock().attempt {
            Attempt::Done(r) if retry(r) => Some(r.clone()),
            _ => None,
        }
    }

    /// Whether an attempt finished with a result that `retry` does not want retried.
    pub(crate) fn is_finished(&self, retry: impl Fn(&R) -> bool) -> bool {
        matches!(&self.state.lock().attempt, Attempt::Done(r) if !retry(r))
    }

    /// Step 2: the result of a finished attempt (`Err(Some)`), or a claim of a new one
    /// (`Ok`); `Err(None)` when `deadline` passed while another closer's attempt was still in
    /// flight. `on_unwind` makes the result stored should the claimer unwind before finishing.
    pub(crate) fn claim<'a>(
        &'a self,
        retry: impl Fn(&R) -> bool,
        on_unwind: impl FnOnce() -> R + 'a,
        deadline: Option<Instant>,
    ) -> Result<Claim<'a, R>, Option<R>> {
        let mut s = self.state.lock();
        loop {
            match &s.attempt {
                Attempt::InFlight => {
                    let (g, timed_out) = self.cv.wait_deadline(s, deadline);
                    s = g;
                    if timed_out && matches!(s.attempt, Attempt::InFlight) {
                        return Err(None);
                    }
                }
                Attempt::Done(r) if !retry(r) => return Err(Some(r.clone())),
                _ => break,
            }
        }
        s.closed = true;
        s.attempt = Attempt::InFlight;
        Ok(Claim { gate: self, on_unwind: Some(Box::new(on_unwind)) })
    }
}

impl<R> Gate<R> {
    fn end(&self, result: R) {
        let mut s = self.state.lock();
        if matches!(s.attempt, Attempt::InFlight) {
            s.attempt = Attempt::Done(result);
            self.cv.notify_all();
        }
    }
}
