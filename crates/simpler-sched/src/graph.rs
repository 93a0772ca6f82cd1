//! Multi-slot operations built from the single-slot steps of `task_protocol`: reference
//! releases and reclamation (spec 30 §3.5), failure propagation (§4) and cancellation (§2.2).
//!
//! Every function here holds at most one slot lock at a time and takes no slot lock while
//! holding another engine lock. Work lists are explicit vectors in a reusable [`GraphScratch`]
//! (decision: the original recursed over consumers, which can overflow the stack on long
//! chains).
//!
//! # Reclamation (exactly once, by the thread whose release reached the threshold)
//!
//! 1. Under the slot's payload lock: `tensor_map.erase_owned(run, slot, output_keys)`, so every
//!    map entry keeps naming a live slot until the window entry is released.
//! 2. For an `alloc()` slot: remove its alloc-registry entry if it still names this slot.
//! 3. Clear the payload (capacities kept). The bookkeeping under the slot lock was already
//!    cleared, and the run moved out, when the slot turned `Consumed`.
//! 4. Mark the entry `Free` and `ring.release` it (frees the slab, bumps the generation).
//! 5. Through the moved-out run: `active −= 1`, fence check at 0.

use std::sync::Arc;

use simpler_types::{CancelReason, SlotId, TaskFailure, TaskState};

use crate::core::Core;
use crate::run_record::RunRecord;
use crate::sync::Ordering;
use crate::task_protocol::{Claim, ClaimCause, OnBuilding};

/// Reusable work lists (kept by each thread that runs graph operations).
#[derive(Default)]
pub(crate) struct GraphScratch {
    /// Consumers still to visit.
    pub(crate) consumers: Vec<SlotId>,
    /// References to release once every claim is made.
    pub(crate) releases: Vec<SlotId>,
    /// Slots to cancel.
    pub(crate) slots: Vec<SlotId>,
}

impl Core {
    /// Releases one reference on `id` and reclaims the slot if that was the last one. A stale
    /// id is ignored (its owner already reclaimed it).
    pub(crate) fn release(&self, id: SlotId) {
        let Some(slot) = self.ring.slot(id) else {
            tracing::debug!(%id, "release of a stale slot ignored");
            return;
        };
        if let Some(run) = slot.release_ref(id) {
            self.reclaim(id, run);
        }
    }

    /// Releases every reference in `ids`, in order, and empties it.
    pub(crate) fn release_all(&self, ids: &mut Vec<SlotId>) {
        for id in ids.drain(..) {
            self.release(id);
        }
    }

    /// The reclamation steps (module docs). `run` was moved out of the slot at `Consumed`.
    pub(crate) fn reclaim(&self, id: SlotId, run: Arc<RunRecord>) {
        let Some(slot) = self.ring.slot(id) else {
            debug_assert!(false, "reclaiming {id}, which is no longer live");
            return;
        };
        {
            let mut payload = slot.payload.write();
            debug_assert_eq!(payload.id, Some(id), "reclaiming a payload of another occupant");
            if !payload.output_keys.is_empty() {
                self.tensor_map.erase_owned(run.id, id, &payload.output_keys);
            }
            if let Some(addr) = payload.alloc_addr {
                let mut allocs = self.allocs.lock();
                if allocs.get(&addr) == Some(&id) {
                    allocs.remove(&addr);
                }
            }
            payload.clear();
        }
        slot.state.set(id, TaskState::Free);
        if !self.ring.release(id) {
            debug_assert!(false, "{id} was released twice");
        }
        // Relaxed: a statistic.
        self.counters.reclaimed.fetch_add(1, Ordering::Relaxed);
        run.reclaimed();
    }

    /// Poisons every consumer reachable from the failed task (whose consumers are in
    /// `scratch.consumers` and whose own releases are in `scratch.releases`), then performs all
    /// releases: phase 1 claims, phase 2 releases (spec 30 §4).
    pub(crate) fn propagate_failure(&self, root: &Arc<TaskFailure>, scratch: &mut GraphScratch) {
        while let Some(id) = scratch.consumers.pop() {
            let Some(slot) = self.ring.slot(id) else { continue };
            slot.claim_failure(
                id,
                ClaimCause::Poison(root),
                OnBuilding::Defer,
                false,
                &mut scratch.consumers,
                &mut scratch.releases,
            );
        }
        self.release_all(&mut scratch.releases);
    }

    /// Cancels every unstarted task of `run` (spec 30 §2.2). `Running` tasks finish normally.
    /// A `Building` slot is owned by the cancellation only once submission is closed; while a
    /// builder is live its submitter finishes it.
    pub(crate) fn cancel_run(
        &self,
        run: &RunRecord,
        reason: CancelReason,
        scratch: &mut GraphScratch,
    ) {
        let closed = {
            let c = run.lock();
            scratch.slots.clear();
            scratch.slots.extend_from_slice(&c.task_slots);
            c.closed()
        };
        let on_building = if closed { OnBuilding::Own } else { OnBuilding::Defer };
        for &id in &scratch.slots {
            let Some(slot) = self.ring.slot(id) else { continue };
            slot.claim_failure(
                id,
                ClaimCause::Cancel(reason),
                on_building,
                closed,
                &mut scratch.consumers,
                &mut scratch.releases,
            );
        }
        // Consumers of cancelled tasks belong to the same run and were visited above.
        scratch.consumers.clear();
        scratch.slots.clear();
        self.release_all(&mut scratch.releases);
    }

    /// Cancels one ready task that can no longer be dispatched (the scheduler has stopped) and
    /// poisons its consumers.
    pub(crate) fn cancel_ready(
        &self,
        id: SlotId,
        reason: CancelReason,
        scratch: &mut GraphScratch,
    ) {
        let Some(slot) = self.ring.slot(id) else { return };
        let claim = slot.claim_failure(
            id,
            ClaimCause::Cancel(reason),
            OnBuilding::Own,
            false,
            &mut scratch.consumers,
            &mut scratch.releases,
        );
        if claim != Claim::Owned {
            return;
        }
        match slot.failure_of(id) {
            Some(root) => self.propagate_failure(&root, scratch),
            None => {
                scratch.consumers.clear();
                self.release_all(&mut scratch.releases);
            }
        }
    }
}
