//! Deferred drops (`docs/worker-protocols.md` §3 rule 5): keep-alive values and unregistered
//! closures run user code when dropped, and that code may call back into the worker (submit, close). They are
//! therefore never dropped while the worker holds a lock or has a close attempt in flight.
//!
//! Protocol, per thread:
//! 1. `submit`, `free` and `unregister` open a [`scope`] before they take a lease (and, for
//!    `submit`, the admission lock); `close` opens one before its attempt begins.
//! 2. While a scope is open on the thread, [`drop_logged`] parks the values in it instead of
//!    dropping them. Nested scopes (a callback submitting to another worker) add to the
//!    outermost one, so nothing is dropped while any enclosing lock is still held.
//! 3. When the outermost scope's guard drops (after the admission lock was released, or after
//!    close published its result), it drops every parked value, each under `catch_unwind`.
//!
//! A run's elected waiter opens a scope around its cleanup and publication too, so what the
//! cleanup releases (closures unregistered while the run was live) and the run's keep-alive
//! values are dropped once the run is published: a drop that waits for that run finds it done
//! instead of waiting for its own thread. With no scope open, values are dropped at once.

use std::any::Any;
use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};

use simpler_types::RunId;

use crate::run::panic_text;

/// A value to drop later, with the run it belonged to (for the log), if any.
type Parked = (Option<RunId>, Box<dyn Any + Send>);

// Accessed through `try_with`: a worker dropped while the thread's locals are torn down (kept
// in a thread-local) may come here after this one is gone; values are then dropped at once.
thread_local! {
    /// The outermost open scope's parked values; `None` when no scope is open.
    static PARKED: RefCell<Option<Vec<Parked>>> = const { RefCell::new(None) };
}

/// Opens a scope on this thread (step 1); see the module docs.
pub(crate) fn scope() -> ScopeGuard {
    let outermost = PARKED
        .try_with(|p| {
            let mut p = p.borrow_mut();
            let outermost = p.is_none();
            if outermost {
                *p = Some(Vec::new());
            }
            outermost
        })
        .unwrap_or(false);
    ScopeGuard { outermost }
}

/// Closes the scope opened by [`scope`] and, if outermost, drops what it parked (step 3).
pub(crate) struct ScopeGuard {
    outermost: bool,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        if !self.outermost {
            return;
        }
        // The scope is closed before any value is dropped, so a value whose drop submits or
        // closes opens a fresh scope of its own.
        let parked = PARKED.try_with(|p| p.borrow_mut().take()).ok().flatten().unwrap_or_default();
        for (run, v) in parked {
            drop_now(run, v);
        }
    }
}

/// Drops each value, or parks it in the open scope (step 2).
pub(crate) fn drop_logged(run: Option<RunId>, values: Vec<Box<dyn Any + Send>>) {
    let mut values = Some(values);
    let _ = PARKED.try_with(|p| {
        if let (Some(parked), Some(v)) = (p.borrow_mut().as_mut(), values.take()) {
            parked.extend(v.into_iter().map(|v| (run, v)));
        }
    });
    let rest = values.unwrap_or_default();
    for v in rest {
        drop_now(run, v);
    }
}

fn drop_now(run: Option<RunId>, v: Box<dyn Any + Send>) {
    if let Err(p) = catch_unwind(AssertUnwindSafe(move || drop(v))) {
        let text = panic_text(p.as_ref());
        // The payload itself may panic when dropped: it is disposed of where it cannot.
        crate::sub::dispose(p);
        match run {
            Some(run) => tracing::error!(%run, "a keep-alive value panicked while dropped: {text}"),
            None => tracing::error!("an unregistered closure panicked while dropped: {text}"),
        }
    }
}

/// Values a submit has not handed to its run yet. If the submit returns early (a refused
/// orchestration, a closed engine), they are dropped through [`drop_logged`], so inside the
/// submit's scope rather than under its admission lock.
pub(crate) struct Pending(Vec<Box<dyn Any + Send>>);

impl Pending {
    /// Holds `values` until [`take`](Self::take) or the drop.
    pub(crate) fn new(values: Vec<Box<dyn Any + Send>>) -> Pending {
        Pending(values)
    }

    /// Adds a value to drop the same way.
    pub(crate) fn push(&mut self, value: impl Send + 'static) {
        self.0.push(Box::new(value));
    }

    /// Hands the values over (to the run that keeps them alive).
    pub(crate) fn take(&mut self) -> Vec<Box<dyn Any + Send>> {
        std::mem::take(&mut self.0)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        drop_logged(None, self.take());
    }
}
