//! What the orchestration's `tensor_data` and `set_tensor_data` wait for before they copy: the
//! accessors the tensor map names ([`Engine::accessors_done`]), and the tasks whose accesses it
//! does not record (`NoDep` and `manual_dep` tensors) or no longer records (a writer a later
//! blind write superseded without ordering after it), whose bytes overlap the copy's, since no
//! entry would make them wait for such a task.
//!
//! The owner lists each untracked access (task and byte span) as it submits the task and
//! forgets it once the task completed or retired. The list is bounded; when it is full, the
//! next such access sets `overflowed` instead, and a wait then lasts until every submitted task
//! completed, after which the list starts empty again.

use simpler_tensormap::ByteSpan;
use simpler_tensormap::fixed::AccessMode;
use simpler_types::DeviceTaskId;

use super::{Completer, Engine, Ring, is_retired};

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

    /// Lists task `id`'s untracked access of `span`; when the list is full, the accesses of
    /// finished tasks leave it first, and with none finished it overflows.
    pub(super) fn note(
        &mut self,
        id: u64,
        span: ByteSpan,
        rings: &[Ring<'_>],
        shared: &Completer<'_>,
    ) {
        if self.len == LISTED {
            self.forget_finished(rings, shared);
        }
        match self.accesses.get_mut(self.len) {
            Some(slot) => {
                *slot = (id, span);
                self.len += 1;
            }
            None => self.overflowed = true,
        }
    }

    /// Drops the listed accesses of tasks that completed or retired.
    fn forget_finished(&mut self, rings: &[Ring<'_>], shared: &Completer<'_>) {
        let mut kept = 0;
        for i in 0..self.len {
            let (id, span) = self.accesses[i];
            // A retired task completed long ago and its slot may be another's now.
            let done = is_retired(rings, id) || shared.has_completed(id);
            if !done {
                self.accesses[kept] = (id, span);
                kept += 1;
            }
        }
        self.len = kept;
    }
}

impl Engine<'_> {
    /// Notes that task `id`, just submitted, accesses `span` untracked.
    pub(crate) fn note_untracked(&mut self, id: DeviceTaskId, span: ByteSpan) {
        self.untracked.note(id.0, span, &self.rings, &self.shared);
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
        self.untracked.forget_finished(&self.rings, &self.shared);
        let u = &self.untracked;
        !u.accesses[..u.len].iter().any(|(_, s)| s.overlaps(span))
    }

    /// Whether every task that an access of `span` of `key` in `mode` would order after has
    /// completed: what the orchestration's `tensor_data` (a [`AccessMode::Read`]: the writers)
    /// and `set_tensor_data` (an [`AccessMode::ReadWrite`]: the readers and the writers) wait
    /// for before touching the bytes.
    pub(crate) fn accessors_done(&self, key: u64, span: ByteSpan, mode: AccessMode) -> bool {
        let (rings, shared) = (&self.rings, self.shared);
        let mut done = true;
        self.map.lookup(
            &key,
            span,
            mode,
            |o| is_retired(rings, o),
            |o| done &= shared.has_completed(o),
        );
        done
    }

    /// Waits until [`accessors_done`](Self::accessors_done) holds, calling `idle(round)` between
    /// checks (the platform's spin-then-park wait). Every task the map names was submitted and
    /// completes once a scheduler runs it, so the wait ends unless the run is torn down, which
    /// `idle` reports by returning `false`; the wait then returns `false` too.
    #[cfg(test)]
    pub(crate) fn wait_for_accessors(
        &self,
        key: u64,
        span: ByteSpan,
        mode: AccessMode,
        mut idle: impl FnMut(u32) -> bool,
    ) -> bool {
        let mut round = 0u32;
        while !self.accessors_done(key, span, mode) {
            if !idle(round) {
                return false;
            }
            round = round.saturating_add(1);
        }
        true
    }
}
