//! Tasks whose accesses the tensor map does not record (`NoDep` and `manual_dep` tensors), or
//! no longer records (a writer a later blind write superseded without ordering after it): the
//! orchestration's `tensor_data` and `set_tensor_data` wait for those whose bytes overlap the
//! copy's as well as for the accessors the map names, since no entry would make them wait for
//! such a task.
//!
//! The owner lists each untracked access (task and byte span) as it submits the task and
//! forgets it once the task completed or retired. The list is bounded; when it is full, the
//! next such access sets `overflowed` instead, and a wait then lasts until every submitted task
//! completed, after which the list starts empty again.

use std::sync::atomic::Ordering::Acquire;

use simpler_tensormap::ByteSpan;
use simpler_types::DeviceTaskId;

use super::{Engine, is_retired, ring_of};

/// Untracked accesses listed before the list overflows.
const LISTED: usize = 64;

/// The untracked accesses of tasks that may still run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Untracked {
    accesses: [(u64, ByteSpan); LISTED],
    len: usize,
    /// An access was submitted while the list was full.
    overflowed: bool,
}

impl Untracked {
    pub(super) const fn new() -> Untracked {
        let none = (0, ByteSpan { start: 0, end: 0 });
        Untracked { accesses: [none; LISTED], len: 0, overflowed: false }
    }
}

impl Engine<'_> {
    /// Notes that task `id`, just submitted, accesses `span` untracked.
    pub(crate) fn note_untracked(&mut self, id: DeviceTaskId, span: ByteSpan) {
        if self.untracked.len == LISTED {
            self.forget_finished_untracked();
        }
        let u = &mut self.untracked;
        match u.accesses.get_mut(u.len) {
            Some(slot) => {
                *slot = (id.0, span);
                u.len += 1;
            }
            None => u.overflowed = true,
        }
    }

    /// Whether every task with an untracked access overlapping `span` has completed (its
    /// effects visible to the caller).
    pub(crate) fn untracked_done(&mut self, span: ByteSpan) -> bool {
        if self.untracked.overflowed {
            if self.incomplete() != 0 {
                return false;
            }
            self.untracked = Untracked::new();
            return true;
        }
        self.forget_finished_untracked();
        let u = &self.untracked;
        !u.accesses[..u.len].iter().any(|(_, s)| s.overlaps(span))
    }

    /// Drops the listed accesses of tasks that completed or retired.
    fn forget_finished_untracked(&mut self) {
        let (rings, shared) = (&self.rings, &self.shared.rings);
        let u = &mut self.untracked;
        let mut kept = 0;
        for i in 0..u.len {
            let (id, span) = u.accesses[i];
            // A retired task completed long ago and its slot may be another's now. Acquire:
            // pairs with the completer's release, so the task's writes are visible.
            let done = is_retired(rings, id)
                || shared[ring_of(id)].slot(id as u32).completed.load(Acquire) != 0;
            if !done {
                u.accesses[kept] = (id, span);
                kept += 1;
            }
        }
        u.len = kept;
    }
}

/// Writers one insert superseded without ordering after them (`FixedTensorMap::insert_noting`),
/// a few listed, the rest counted.
#[derive(Default)]
pub(super) struct Unordered {
    owners: [u64; 4],
    len: usize,
}

impl Unordered {
    pub(super) fn push(&mut self, owner: u64) {
        if let Some(slot) = self.owners.get_mut(self.len) {
            *slot = owner;
        }
        self.len += 1;
    }
}

impl Engine<'_> {
    /// Notes the writers `unordered` lists as untracked accessors of `span`; more than it can
    /// list overflow the untracked list (a copy then waits for every submitted task).
    pub(super) fn note_unordered(&mut self, unordered: &Unordered, span: ByteSpan) {
        if unordered.len > unordered.owners.len() {
            self.untracked.overflowed = true;
            return;
        }
        for &owner in &unordered.owners[..unordered.len] {
            self.note_untracked(DeviceTaskId(owner), span);
        }
    }
}
