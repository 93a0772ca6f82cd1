//! Run handles: a prepared or launched run is a lease on one of the runner's resource slots.
//!
//! Invariant: a lease names `{slot, generation}`; the runner bumps a slot's generation when the
//! run in it ends, so a lease outlives its run only as a *stale* lease, which every call refuses
//! (`DeviceError::StaleRun`). At most one live lease names a slot at a time. A handle dropped
//! without being consumed by `launch_run`, `complete_run` or `abandon` hands its lease back
//! through the runner's return queue; the runner runs that slot's terminal cleanup at its next
//! call (or in `finalize`), after reaping the run if it was launched. A call that does not need
//! that run gone (the pipelined calls, `docs/pipelining.md` "Calls that do not wait for a
//! dropped run") reaps a dropped launched run only within its own wait: a run still executing
//! then keeps its slot and its lease stays queued for a later call, and the stream-sync budget
//! that began at that first reap still ends it. `docs/pipelining.md` describes the protocol.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use simpler_types::RunId;

#[cfg(simpler_loom)]
use self::loom_mutex::Mutex;
#[cfg(not(simpler_loom))]
use parking_lot::Mutex;

use super::{Core, RunState, Stage};
use crate::diag::Outcome;
use crate::error::DeviceError;

/// Leases handed back by dropped handles: `(slot, generation)`, oldest first. Writers:
/// `Lease::drop` on any thread (at the back). Reader: the runner's thread, which drains it at
/// its next call and alone puts a lease back (at the front, see [`keep_returned`]).
pub(super) type ReturnQueue = Arc<Mutex<VecDeque<(usize, u64)>>>;

/// The lowest free slot, given each slot's occupancy in slot order. `prepare` writes only the
/// slot this returns, so it never writes a slot whose run is launched.
pub(super) fn lowest_free(occupied: impl IntoIterator<Item = bool>) -> Option<usize> {
    occupied.into_iter().position(|o| !o)
}

/// Whether `lease` was issued by the runner owning `returns` and names the slot's `current`
/// generation (`None`: no such slot).
pub(super) fn is_current(lease: &Lease, returns: &ReturnQueue, current: Option<u64>) -> bool {
    Arc::ptr_eq(&lease.returns, returns) && current == Some(lease.generation)
}

/// Takes the oldest lease a dropped handle returned whose generation is still
/// `current_of(slot)`, after the first `kept` (those this cleanup put back); leases of ended
/// runs before it are discarded. One at a time, so a panic while one slot is cleaned up leaves
/// the others queued for the next call.
pub(super) fn take_returned(
    returns: &ReturnQueue,
    kept: usize,
    current_of: impl Fn(usize) -> Option<u64>,
) -> Option<(usize, u64)> {
    let mut returned = returns.lock();
    while let Some((s, generation)) = returned.remove(kept) {
        if current_of(s) == Some(generation) {
            return Some((s, generation));
        }
    }
    None
}

/// Puts back a lease [`take_returned`] took, as the `kept`th (0-based) of those this cleanup
/// keeps for a later call: ahead of the rest, in the order they were taken, and skipped by
/// the following takes of the same cleanup.
pub(super) fn keep_returned(returns: &ReturnQueue, kept: usize, lease: (usize, u64)) {
    returns.lock().insert(kept, lease);
}

/// One slot lease. Dropping a live lease queues it for the runner's cleanup.
pub(super) struct Lease {
    pub(super) slot: usize,
    pub(super) generation: u64,
    pub(super) run_id: RunId,
    pub(super) returns: ReturnQueue,
    /// Cleared when a runner call consumed the lease (its slot is handled there).
    live: bool,
}

impl Lease {
    pub(super) fn new(slot: usize, generation: u64, run_id: RunId, returns: ReturnQueue) -> Lease {
        Lease { slot, generation, run_id, returns, live: true }
    }

    /// Consumes the lease without queueing it: the caller handles the slot.
    pub(super) fn consume(mut self) {
        self.live = false;
    }

    /// A new lease on the same slot (the next stage of the same run).
    pub(super) fn advance(self) -> Lease {
        let next = Lease::new(self.slot, self.generation, self.run_id, Arc::clone(&self.returns));
        self.consume();
        next
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.live {
            self.returns.lock().push_back((self.slot, self.generation));
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} in slot {} (generation {})", self.run_id, self.slot, self.generation)
    }
}

/// A prepared, not yet launched run (`DeviceRunner::prepare`). Dropping it abandons the run:
/// the runner releases its slot at its next call.
#[must_use = "dropping a prepared run abandons it"]
#[derive(Debug)]
pub struct PreparedRun {
    pub(super) lease: Lease,
}

/// A launched run (`DeviceRunner::launch_run`). Dropping it discards the run's result: the
/// runner releases its slot once the device finished it, waiting for that only in the calls
/// that need it gone (`docs/pipelining.md`, "Calls that do not wait for a dropped run"); the
/// others leave a run still executing queued.
#[must_use = "dropping a launched run discards its result"]
#[derive(Debug)]
pub struct ActiveRun {
    pub(super) lease: Lease,
}

impl PreparedRun {
    /// The run's id.
    pub fn run_id(&self) -> RunId {
        self.lease.run_id
    }

    /// The resource slot the run holds (`0..RunnerOptions::pipeline_slots`).
    pub fn slot(&self) -> usize {
        self.lease.slot
    }
}

impl ActiveRun {
    /// The run's id.
    pub fn run_id(&self) -> RunId {
        self.lease.run_id
    }

    /// The resource slot the run holds.
    pub fn slot(&self) -> usize {
        self.lease.slot
    }
}

/// Lease checks and the cleanup of dropped handles.
impl Core {
    /// Checks that `lease` is this runner's and current; returns its slot.
    pub(super) fn check_lease(
        &self,
        call: &'static str,
        lease: &Lease,
    ) -> Result<usize, DeviceError> {
        let current = self.slots.get(lease.slot).map(|s| s.generation);
        if !is_current(lease, &self.returns, current) {
            return Err(DeviceError::StaleRun {
                call,
                run_id: lease.run_id,
                slot: lease.slot,
                generation: lease.generation,
            });
        }
        Ok(lease.slot)
    }

    /// Ends the run in slot `s`: the slot is free and every lease of the run is stale.
    pub(super) fn free_slot(&mut self, s: usize) {
        let slot = &mut self.slots[s];
        slot.run = None;
        slot.generation += 1;
    }

    /// Cleans up the slots whose handles were dropped: a prepared run is abandoned, a launched
    /// one reaped first (its result is discarded; the reap may take the run's whole stream-sync
    /// budget), a reaped one released.
    pub(super) fn reclaim_dropped(&mut self) {
        self.reclaim_dropped_within(|_| None);
    }

    /// [`Core::reclaim_dropped`] without waiting for the device: only the dropped runs it already
    /// finished (or failed, or whose budget ran out) are cleaned up; one still executing keeps
    /// its slot and its lease stays queued for a later call.
    pub(super) fn sweep_dropped(&mut self) {
        let now = Instant::now();
        self.reclaim_dropped_within(|_| Some(now));
    }

    /// [`Core::reclaim_dropped`] for a call that must not wait for the device: the reap of a
    /// dropped launched run waits until `until(run)` at most (`None`: its budget). A run still
    /// executing then keeps its slot, and its lease stays queued for a later call.
    pub(super) fn reclaim_dropped_within(&mut self, until: impl Fn(&RunState) -> Option<Instant>) {
        // Leases put back by this cleanup, at the front of the queue.
        let mut kept = 0;
        while let Some((s, generation)) =
            take_returned(&self.returns, kept, |s| self.slots.get(s).map(|x| x.generation))
        {
            let Some(mut run) = self.slots[s].run.take() else { continue };
            let run_id = run.run_id;
            match run.stage {
                Stage::Prepared => self.finish(&mut run, Outcome::FailedBeforeLaunch),
                Stage::Launched => {
                    let until = until(&run);
                    let r = self.guarded(s, &mut run, Outcome::FailedAfterLaunch, |c, run| {
                        c.reap_dropped(run, until)
                    });
                    match r {
                        Ok(true) => latched_failure_logged(&run),
                        Ok(false) => {
                            // Still executing at the deadline: it keeps its slot, and its
                            // lease waits for a later call.
                            self.slots[s].run = Some(run);
                            keep_returned(&self.returns, kept, (s, generation));
                            kept += 1;
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(%run_id, error = %e, "a dropped launched run failed");
                        }
                    }
                    self.finish(&mut run, Outcome::FailedAfterLaunch);
                }
                Stage::Reaped => {
                    latched_failure_logged(&run);
                    self.finish(&mut run, Outcome::FailedAfterLaunch);
                }
            }
            tracing::debug!(%run_id, slot = s, "cleaned up the slot of a dropped run handle");
            self.free_slot(s);
        }
    }
}

/// Logs the runtime fault a dropped run's device latched, if any: its reap ended well, so no
/// error carries it, and the handle that `complete_run` would have reported it to is gone.
fn latched_failure_logged(run: &RunState) {
    if let Some(fault) = &run.latched {
        tracing::warn!(run_id = %run.run_id, %fault, "a dropped launched run failed");
    }
}

#[cfg(simpler_loom)]
mod loom_mutex {
    //! A `parking_lot`-shaped wrapper over `loom::sync::Mutex`, so the return queue is
    //! model-checked (`loom_models`).

    /// `loom::sync::Mutex` with a non-poisoning `lock()`.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        /// Locks, ignoring poisoning (a panic inside a model already fails it).
        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }
}
