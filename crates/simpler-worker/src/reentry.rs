//! The reentrancy guard (spec 40 §4 rule 6): a thread-local stack of the workers the current
//! thread acts for (inside an orchestration callback, a host closure or a child run).
//! `submit`, `run`, `close` and `close_timeout` on a worker in that stack return `Reentrant`
//! at once instead of deadlocking on their own run.

use std::cell::RefCell;

thread_local! {
    static ACTING_FOR: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Whether the current thread acts for worker `instance`.
pub(crate) fn is_acting_for(instance: u64) -> bool {
    ACTING_FOR.with(|s| s.borrow().contains(&instance))
}

/// Marks the current thread as acting for `instance` until the guard drops (also on unwind).
pub(crate) fn enter(instance: u64) -> ActingGuard {
    ACTING_FOR.with(|s| s.borrow_mut().push(instance));
    ActingGuard { instance }
}

/// Pops the entry pushed by [`enter`].
pub(crate) struct ActingGuard {
    instance: u64,
}

impl Drop for ActingGuard {
    fn drop(&mut self) {
        ACTING_FOR.with(|s| {
            let mut s = s.borrow_mut();
            if let Some(pos) = s.iter().rposition(|&i| i == self.instance) {
                s.remove(pos);
            }
        });
    }
}
