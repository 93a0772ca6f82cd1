//! One entry of a key's footprint lists, and what a write's supersession of covered entries
//! takes and reports (`docs/tensormap.md` §4).

use simpler_types::SlotId;

use crate::ByteSpan;

/// One task's claim on a byte range of a buffer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Entry {
    /// The bytes the task touches; empty only for a dead entry of an indexed list.
    pub(crate) span: ByteSpan,
    /// The task's slot.
    pub(crate) slot: SlotId,
    /// `true` when a later write of these bytes must order after the task: it reads them, or it
    /// took that duty over from the entries it superseded (see `docs/tensormap.md`).
    pub(crate) orders_writes: bool,
}

/// Which covered entries a write supersedes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Covered {
    /// Every entry inside its span (a dense write, or a reader list).
    All,
    /// Only those that order later writes: a scatter write ordered after exactly those, and
    /// the bytes in its gaps of any other writer are still that writer's.
    OrderingWrites,
}

impl Covered {
    #[inline]
    pub(crate) fn takes(self, span: ByteSpan, entry: &Entry) -> bool {
        span.contains(entry.span) && (self == Covered::All || entry.orders_writes)
    }
}

/// What an insert or a supersession removed.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(crate) struct Superseded {
    /// Number of entries removed.
    pub(crate) count: usize,
    /// Whether any removed entry ordered later writes.
    pub(crate) orders_writes: bool,
}

impl Superseded {
    pub(crate) fn take(&mut self, entry: &Entry) {
        self.count += 1;
        self.orders_writes |= entry.orders_writes;
    }

    pub(crate) fn merge(&mut self, other: Superseded) {
        self.count += other.count;
        self.orders_writes |= other.orders_writes;
    }
}

impl Entry {
    pub(crate) fn is_dead(&self) -> bool {
        self.span.is_empty()
    }
}
