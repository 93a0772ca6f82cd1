//! Multi-slot operations built from the single-slot steps of `task_protocol`: reference
//! releases and reclamation (`docs/engine-protocols.md` §4), failure propagation and cancellation
//! (§5).
//!
//! Every function here holds at most one slot lock at a time and takes no slot lock while
//! holding another engine lock. Work lists are explicit vectors in a reusable [`GraphScratch`]
//! (decision: the original recursed over consumers, which can overflow the stack on long
//! chains).
//!
//! # Reclamation (exactly once, by the thread whose release reached the threshold)
//!
//! 1. Under the slot's payload lock: `tensor_map.erase_owned(run, slot, map_keys)` and, for a
//!    task whose reader entries were not retired at its finish, `erase_reader_owned` of its
//!    `read_keys`, so every map entry keeps naming a live slot until the window entry is
//!    released; skipped once the run's whole table was dropped at the end of its submission.
//! 2. Clear the payload (capacities kept). The bookkeeping under the slot lock was already
//!    cleared, and the run moved out, when the slot turned `Consumed`.
//! 3. Mark the entry `Free` and `ring.release` it (frees the slab, bumps the generation).
//! 4. Through the moved-out run: `active −= 1`, fence check at 0.
//!
//! A thread that reclaims several slots in a row (releasing a scope, settling a pass) does
//! steps 3 and 4 in batches ([`Reclaims`]): each slot's generation and slab are released at
//! once, but the window entries return under one lock acquisition and the run's count drops
//! once, after them.

use std::sync::Arc;

use simpler_types::{CancelReason, SlotId, TaskFailure, TaskState};

use simpler_ring::{RELEASE_BATCH, ReleaseBatch};

use crate::core::Core;
use crate::endpoint::quietly;
use crate::run_record::RunRecord;
use crate::slot::TaskSlot;
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

/// Reclamations that finish together (steps 3 and 4): their window entries go back 16 at a time
/// in one window-lock acquisition, the statistic and each run's count of active slots move once
/// per batch, and a run's count drops only after every entry counted in it has gone back, so a
/// thread its fence wakes finds them free. Finishes when dropped, after [`RECLAIMS_PER_BATCH`]
/// slots, and when a slot of another run comes. Like a [`ReleaseBatch`], it must not be held
/// across a wait for window space; nothing that reclaims waits for anything but short locks.
pub(crate) struct Reclaims<'a> {
    core: &'a Core,
    entries: ReleaseBatch<'a, TaskSlot>,
    /// The run whose reclaimed slots are not counted yet, and how many.
    run: Option<(Arc<RunRecord>, u32)>,
}

impl<'a> Reclaims<'a> {
    pub(crate) fn new(core: &'a Core) -> Self {
        Reclaims { core, entries: core.ring.release_batch(), run: None }
    }

    /// Step 4 for `id`, counted against `run` at the next finish. The entry is released before
    /// it is counted, so a panic in between (a failed assertion) leaves the run short of its
    /// fence rather than terminal with an entry still held.
    fn release(&mut self, id: SlotId, run: Arc<RunRecord>) {
        if !self.entries.release(id) {
            debug_assert!(false, "{id} was released twice");
        }
        match &mut self.run {
            Some((pending, n)) if Arc::ptr_eq(pending, &run) && *n < RECLAIMS_PER_BATCH => {
                *n += 1;
            }
            _ => {
                // The slot just released goes back with the others; it is counted later.
                self.finish();
                self.run = Some((run, 1));
            }
        }
    }

    /// Step 5 for everything counted so far: the entries first, so that a thread the fence
    /// wakes finds them free.
    fn finish(&mut self) {
        self.entries.flush();
        let Some((run, n)) = self.run.take() else { return };
        // Relaxed: a statistic.
        self.core.counters.reclaimed.fetch_add(u64::from(n), Ordering::Relaxed);
        run.reclaimed(n);
    }
}

impl Drop for Reclaims<'_> {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Most reclamations counted before a batch finishes, so that during a long release list (a
/// large scope's end) the run's active count and the reclaimed statistic, which status
/// snapshots read, keep up with the slots actually reclaimed.
const RECLAIMS_PER_BATCH: u32 = RELEASE_BATCH as u32;

impl Core {
    /// Releases every reference in `ids`, in order, and empties it; the reclamations this
    /// causes finish as one batch.
    pub(crate) fn release_all(&self, ids: &mut Vec<SlotId>) {
        let mut reclaims = Reclaims::new(self);
        for id in ids.drain(..) {
            self.release_into(id, &mut reclaims);
        }
    }

    /// Releases one reference on `id` and reclaims the slot (finishing with `reclaims`) if that
    /// was the last one. A stale id is ignored (its owner already reclaimed it).
    pub(crate) fn release_into(&self, id: SlotId, reclaims: &mut Reclaims<'_>) {
        let Some(slot) = self.ring.slot(id) else {
            // Quietly: releases also run outside passes (closing, the scheduler's exit).
            quietly(|| tracing::debug!(%id, "release of a stale slot ignored"));
            return;
        };
        if let Some(run) = slot.release_ref(id) {
            self.reclaim_into(id, run, reclaims);
        }
    }

    /// The reclamation steps (module docs). `run` was moved out of the slot at `Consumed`.
    /// A finished task stops holding back later writes: its reader entries leave the tensor
    /// map now rather than at reclamation (`docs/tensormap.md` §6). The task's self reference
    /// was released when its completion was processed, so another thread may have reclaimed
    /// the slot, and a new task may occupy it: the payload's id decides. The task has finished,
    /// so no member holds its payload, and the write lock is uncontended; emptying the journal
    /// of read keys tells a later reclaimer that nothing is left to erase for them. A reclaimer
    /// that came first erased them and cleared the payload, and then nothing happens here.
    pub(crate) fn retire_reads(&self, id: SlotId) {
        let Some(slot) = self.ring.slot(id) else { return };
        let mut payload = slot.payload.write();
        if payload.id != Some(id) || payload.read_keys.is_empty() {
            return;
        }
        if let Some(task) = payload.task {
            self.tensor_map.erase_reader_owned(task.run, id, &payload.read_keys);
        }
        payload.read_keys.clear();
    }

    pub(crate) fn reclaim(&self, id: SlotId, run: Arc<RunRecord>) {
        self.reclaim_into(id, run, &mut Reclaims::new(self));
    }

    /// The reclamation steps, steps 3 and 4 finishing with `reclaims`.
    pub(crate) fn reclaim_into(
        &self,
        id: SlotId,
        run: Arc<RunRecord>,
        reclaims: &mut Reclaims<'_>,
    ) {
        let Some(slot) = self.ring.slot(id) else {
            debug_assert!(false, "reclaiming {id}, which is no longer live");
            return;
        };
        {
            let mut payload = slot.payload.write();
            debug_assert_eq!(payload.id, Some(id), "reclaiming a payload of another occupant");
            // After submission ended the run has no entries left (most of a run whose outer
            // scope holds its tasks is reclaimed then): no map lock and no table search.
            let erase = !run.map_entries_dropped();
            if erase && !payload.map_keys.is_empty() {
                self.tensor_map.erase_owned(run.id, id, &payload.map_keys);
            }
            if erase && !payload.read_keys.is_empty() {
                // A task that never finished (cancelled, poisoned) still has its reader entries.
                self.tensor_map.erase_reader_owned(run.id, id, &payload.read_keys);
            }
            payload.clear();
        }
        slot.state.set(id, TaskState::Free);
        reclaims.release(id, run);
    }

    /// Poisons every consumer reachable from the failed task (whose consumers are in
    /// `scratch.consumers` and whose own releases are in `scratch.releases`), then performs all
    /// releases: phase 1 claims, phase 2 releases (`docs/engine-protocols.md` §5).
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

    /// Cancels every unstarted task of `run` (`docs/engine-protocols.md` §2). `Running` tasks
    /// finish normally. A `Building` slot is owned by the cancellation only once no submitter is
    /// left to finish it: submission is closed, or the caller is the run's own builder failing it
    /// (`by_builder`). While a builder is live on another thread, its submitter finishes it.
    pub(crate) fn cancel_run(
        &self,
        run: &RunRecord,
        reason: CancelReason,
        by_builder: bool,
        scratch: &mut GraphScratch,
    ) {
        let closed = {
            let c = run.lock();
            scratch.slots.clear();
            scratch.slots.extend_from_slice(&c.task_slots);
            c.closed() || by_builder
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
        // Consumers of cancelled tasks belong to the same run, but not necessarily to the copy:
        // while a builder is live, a task charged after the copy may have attached to a producer
        // claimed above. Claim every one of them, or such a task would stay `Pending` behind a
        // failed producer and the fence would never fire. Tasks of the copy that were already
        // claimed are skipped by the claim itself.
        while let Some(id) = scratch.consumers.pop() {
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
        scratch.slots.clear();
        self.release_all(&mut scratch.releases);
    }

    /// Cancels one task that must not be dispatched and poisons its consumers: a ready task
    /// the stopped scheduler can no longer run, or a task its submitter found its run aborted
    /// for (still `Building`, or already claimed by a producer's failure with the propagation
    /// owed to the submitter, which this settles).
    pub(crate) fn cancel_unstarted(
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
            true,
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

#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use simpler_types::{
        CallConfig, CancelReason, DataType, RunFailure, RunId, TaskArgs, TaskState, Tensor,
        WorkerId,
    };

    use crate::graph::{GraphScratch, Reclaims};
    use crate::outcome::RunOutcome;
    use crate::run_record::RunRecord;
    use crate::scheduler::tests::{chip, gated_engine, slot_of, wait_until};

    fn tensor() -> Tensor {
        Tensor::external(0x1000, &[64], DataType::UInt8).unwrap()
    }

    #[test]
    fn a_batch_counts_each_reclaimed_slot_against_its_own_run() {
        // The engine admits one run at a time, so today a batch only ever holds slots of one
        // run; counting against the run of each slot keeps it right should that change. Run 1
        // has three window entries and run 2 one, interleaved in one batch: each run's fence
        // fires, with no internal failure, and every entry is back in the window.
        let (engine, _tx) = gated_engine();
        let core = engine.core();
        let first = Arc::new(RunRecord::new(RunId::FIRST, tracing::Span::none()));
        let second = Arc::new(RunRecord::new(RunId::FIRST.next().unwrap(), tracing::Span::none()));
        let owners = [&first, &first, &second, &first];
        let live_before = core.ring.stats().window.live;
        let mut slots = Vec::new();
        for run in owners {
            let slot = core.ring.try_alloc(0, 0).unwrap().slot;
            run.charge(slot).unwrap();
            slots.push(slot);
        }
        assert!(!first.close() && !second.close());
        let mut reclaims = Reclaims::new(core);
        for (&slot, run) in slots.iter().zip(owners) {
            reclaims.release(slot, Arc::clone(run));
        }
        drop(reclaims);
        for run in [&first, &second] {
            assert_eq!(run.outcome(), Some(RunOutcome::Completed), "{}", run.id);
        }
        assert_eq!(core.ring.stats().window.live, live_before);
        assert_eq!(engine.stats().reclaimed, 4);
    }

    #[test]
    fn cancelling_a_building_run_claims_a_consumer_charged_after_the_slot_list_was_copied() {
        // A busy task holds worker 0; `producer` is queued behind it and `consumer` reads its
        // output. The cancellation is made to see a slot list copied before `consumer` was
        // charged (as when shutdown aborts a run whose builder is live on another thread): it
        // must still claim `consumer` through `producer`'s consumer list, or `consumer` stays
        // `Pending` behind a failed producer and the fence never fires.
        let (engine, tx) = gated_engine();
        let cfg = CallConfig::default();
        let mut b = engine.begin_run().unwrap();
        let busy = b.submit_next_level(&chip(), TaskArgs::new(), &cfg, WorkerId(0), None).unwrap();
        wait_until(|| engine.task_snapshot(busy).unwrap().state == TaskState::Running);
        let mut out = TaskArgs::new();
        out.add_output(tensor()).unwrap();
        let producer = b.submit_next_level(&chip(), out, &cfg, WorkerId(0), None).unwrap();
        let mut input = TaskArgs::new();
        input.add_input(tensor()).unwrap();
        let consumer = b.submit_next_level(&chip(), input, &cfg, WorkerId(0), None).unwrap();
        assert_eq!(engine.task_snapshot(consumer).unwrap().state, TaskState::Pending);

        let core = engine.core();
        let run = core.registry.find(b.id()).unwrap();
        let late = slot_of(&engine, consumer);
        assert_eq!(run.lock().task_slots.pop(), Some(late));
        run.mark_failed(RunFailure::Aborted { run: run.id, reason: CancelReason::Shutdown });
        core.cancel_run(&run, CancelReason::Shutdown, false, &mut GraphScratch::default());
        run.lock().task_slots.push(late);

        assert_eq!(engine.task_snapshot(producer).unwrap().state, TaskState::Failed);
        assert_eq!(engine.task_snapshot(consumer).unwrap().state, TaskState::Failed);
        tx.send(()).unwrap();
        let id = b.close();
        let outcome = engine.wait_timeout(id, Duration::from_secs(20)).unwrap();
        assert!(matches!(outcome, Some(RunOutcome::Failed(_))), "{outcome:?}");
    }
}
