//! The reentrancy guard (`docs/worker-protocols.md` §3 rule 6): a thread-local stack of the
//! workers the current thread acts for (inside an orchestration callback, a host closure or a child run).
//! `submit`, `run`, `close` and `close_timeout` on a worker in that stack return `Reentrant`
//! at once instead of deadlocking on their own run.
//!
//! A thread acting for a child worker also acts for every ancestor of that child: the
//! ancestor's run waits for the child's task, which waits for this thread. Each worker
//! therefore keeps a [`Lineage`] (itself and its ancestors); a parent appends its instance to
//! the lineage of every worker of the adopted subtree at adoption, before any run exists, and
//! the sub and child endpoints mark the whole lineage.
//!
//! A second mark names the worker whose chip lane the current thread is serving a call on. A
//! call that would queue on that same lane and wait for it (a memory call from a closure the
//! lane runs) could never be served, so it is `Reentrant` too; so is one that would wait for
//! another lane of the same worker, or for its chip registrations (which wait for its lanes):
//! two lanes waiting for each other, or a registration waiting for this lane, would never end.
//! Such a call also acts for the lane's worker and its ancestors (their runs may need the
//! lane), so `submit`, `run` and `close` from it are `Reentrant` as from a callback.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use parking_lot::RwLock;

/// A worker's instance followed by the instances of its ancestors. Written only while the
/// tree is being started (adoption); read by the endpoints of the worker's engine.
pub(crate) type Lineage = Arc<RwLock<Vec<u64>>>;

/// A new lineage of a worker nobody has adopted yet.
pub(crate) fn lineage_of(instance: u64) -> Lineage {
    Arc::new(RwLock::new(vec![instance]))
}

// Every access goes through `try_with`: a worker kept in a thread-local is dropped (and closed)
// while the thread's locals are torn down, possibly after these. A thread being torn down runs
// no callback and serves no lane, so a destroyed mark reads as unset and is not written.
thread_local! {
    static ACTING_FOR: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// The worker instance whose chip lane is running a call on this thread.
    static ON_LANE: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Whether the current thread is running a call on a lane of worker `instance`.
pub(crate) fn is_on_a_lane_of(instance: u64) -> bool {
    ON_LANE.try_with(|l| l.get() == Some(instance)).unwrap_or(false)
}

/// Marks the current thread as serving a call on a chip lane of worker `instance`, and as
/// acting for every worker of its `lineage` (their runs may need the lane), until the guard
/// drops (also on unwind).
pub(crate) fn enter_lane(instance: u64, lineage: &Lineage) -> LaneGuard {
    let previous = ON_LANE.try_with(|l| l.replace(Some(instance))).unwrap_or(None);
    LaneGuard { previous, _acting: enter_lineage(lineage) }
}

/// Restores the lane mark that [`enter_lane`] replaced, and ends its acting for the lineage.
pub(crate) struct LaneGuard {
    previous: Option<u64>,
    _acting: ActingGuard,
}

impl Drop for LaneGuard {
    fn drop(&mut self) {
        let _ = ON_LANE.try_with(|l| l.set(self.previous));
    }
}

/// Whether the current thread acts for worker `instance`.
pub(crate) fn is_acting_for(instance: u64) -> bool {
    ACTING_FOR.try_with(|s| s.borrow().contains(&instance)).unwrap_or(false)
}

/// Marks the current thread as acting for `instance` until the guard drops (also on unwind).
pub(crate) fn enter(instance: u64) -> ActingGuard {
    enter_all(&[instance])
}

/// Marks the current thread as acting for every worker of `lineage` until the guard drops.
pub(crate) fn enter_lineage(lineage: &Lineage) -> ActingGuard {
    enter_all(&lineage.read())
}

fn enter_all(instances: &[u64]) -> ActingGuard {
    let depth = ACTING_FOR
        .try_with(|s| {
            let mut s = s.borrow_mut();
            let depth = s.len();
            s.extend_from_slice(instances);
            depth
        })
        .unwrap_or(0);
    ActingGuard { depth }
}

/// Pops the entries pushed by [`enter`] or [`enter_lineage`]. Guards are scoped, so they drop
/// in the reverse order of their creation and the stack is cut back to where this one began.
pub(crate) struct ActingGuard {
    depth: usize,
}

impl Drop for ActingGuard {
    fn drop(&mut self) {
        let _ = ACTING_FOR.try_with(|s| s.borrow_mut().truncate(self.depth));
    }
}
