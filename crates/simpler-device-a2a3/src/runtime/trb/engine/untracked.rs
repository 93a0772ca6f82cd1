//! Tasks whose accesses the tensor map does not record (`NoDep` and `manual_dep` tensors): the
//! orchestration's `tensor_data` and `set_tensor_data` wait for them as well as for the
//! accessors the map names, since no entry would make them wait for such a task's bytes.
//!
//! The owner lists them as it submits them and forgets each once it completed or retired. The
//! list is bounded; when it is full, the next such task sets `overflowed` instead, and a wait
//! then lasts until every submitted task completed, after which the list starts empty again.
//! The wait is for every listed task, not only those whose bytes overlap the copy's: untracked
//! accesses are rare, and the bound keeps the check cheap.

use std::sync::atomic::Ordering::Acquire;

use simpler_types::DeviceTaskId;

use super::{Engine, is_retired, ring_of};

/// Untracked tasks listed before the list overflows.
const LISTED: usize = 64;

/// The untracked tasks that may still run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Untracked {
    ids: [u64; LISTED],
    len: usize,
    /// A task was submitted while the list was full.
    overflowed: bool,
}

impl Untracked {
    pub(super) const fn new() -> Untracked {
        Untracked { ids: [0; LISTED], len: 0, overflowed: false }
    }
}

impl Engine<'_> {
    /// Notes that task `id`, just submitted, has an untracked access.
    pub(crate) fn note_untracked(&mut self, id: DeviceTaskId) {
        self.forget_finished_untracked();
        let u = &mut self.untracked;
        match u.ids.get_mut(u.len) {
            Some(slot) => {
                *slot = id.0;
                u.len += 1;
            }
            None => u.overflowed = true,
        }
    }

    /// Whether every task with an untracked access has completed (its effects visible to the
    /// caller).
    pub(crate) fn untracked_done(&mut self) -> bool {
        if self.untracked.overflowed {
            if self.incomplete() != 0 {
                return false;
            }
            self.untracked = Untracked::new();
            return true;
        }
        self.forget_finished_untracked();
        self.untracked.len == 0
    }

    /// Drops the listed tasks that completed or retired.
    fn forget_finished_untracked(&mut self) {
        let (rings, shared) = (&self.rings, &self.shared.rings);
        let u = &mut self.untracked;
        let mut kept = 0;
        for i in 0..u.len {
            let id = u.ids[i];
            // A retired task completed long ago and its slot may be another's now. Acquire:
            // pairs with the completer's release, so the task's writes are visible.
            let done = is_retired(rings, id)
                || shared[ring_of(id)].slot(id as u32).completed.load(Acquire) != 0;
            if !done {
                u.ids[kept] = id;
                kept += 1;
            }
        }
        u.len = kept;
    }
}
