//! [`HeapRingCore`]: one heap ring's cursors, live-record FIFO and counters.
//!
//! Protocol (every step is a plain state transition; the caller provides mutual exclusion):
//!
//! 1. **Place.** [`HeapRingCore::try_place`] applies [`bump`] to the current cursors. It changes
//!    nothing, so a caller may give up or wait after a `None`.
//! 2. **Record.** [`HeapRingCore::push_record`] commits a placement obtained in step 1 with no
//!    state change in between: it appends a record with the next per-ring sequence number, moves
//!    the top, and updates the live counters and their peaks. A full record store refuses and
//!    changes nothing, and so does a placement that is not the one step 1 gives now (it is
//!    derived again, so no placement can overlap a live slab or leave the ring).
//! 3. **Release.** [`HeapRingCore::mark_released`] marks the record with a given sequence number.
//!    Records in the FIFO carry consecutive sequence numbers, so the lookup is one subtraction.
//! 4. **Advance.** Still inside step 3, or on its own through
//!    [`HeapRingCore::collect_released`]: while the oldest record is marked, the tail moves to
//!    its end and the record is dropped (a mark another agent wrote directly is taken out of the
//!    live counts here, once). A released slab behind an older live one frees nothing.
//! 5. **Rewind on drain.** When step 4 empties the FIFO, `top = tail = 0`, so an empty ring can
//!    always place a request of its full size.
//!
//! Invariants kept by these steps, when the core alone marks records: the oldest record in the
//! FIFO is never released (so it is the slab pinning the tail); `live_bytes` is the sum of
//! unreleased lengths; records lie in `[tail, top)` (or the wrapped equivalent) in placement
//! order; an empty FIFO means both cursors are 0. When another agent also marks records (any
//! non-zero `released` byte), the first two hold again after the next step 3 or 4: until then a
//! record it marked may sit at the front, and stays counted as live.

use simpler_types::HEAP_ALIGN;

use super::bump::{Placement, bump, largest_fit, occupied_bytes};
use super::records::{HeapRecord, RecordStore};

/// What [`HeapRingCore::push_record`] granted: the slab's sequence number, offset and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeapGrant {
    /// Per-ring sequence number of the slab (monotonic, never reset).
    pub seq: u64,
    /// Offset of the slab from the ring's base.
    pub offset: u64,
    /// Aligned length of the slab.
    pub len: u64,
}

/// What [`HeapRingCore::mark_released`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseOutcome {
    /// No record with that sequence number is in the FIFO (never issued, or already passed by
    /// the tail). Nothing changed.
    NotFound,
    /// The core had already marked the record (or accounted another agent's mark). Nothing
    /// changed.
    AlreadyReleased,
    /// The record was marked, or another agent's mark of it was accounted now.
    Released {
        /// Bytes the slab held (its aligned length).
        len: u64,
        /// The tail moved: space became available to waiting requests.
        tail_moved: bool,
        /// The FIFO drained and both cursors went back to 0.
        rewound: bool,
    },
}

/// One heap ring's state: cursors, the FIFO of records, live counters and high-water marks.
///
/// Offsets are relative to the ring's base; the core never sees addresses. Every method is a
/// plain state transition: the caller locks around it and does any waiting.
#[derive(Debug)]
pub struct HeapRingCore<R> {
    size: u64,
    top: u64,
    tail: u64,
    next_seq: u64,
    live_bytes: u64,
    live_allocs: u32,
    peak_live_bytes: u64,
    peak_occupied_bytes: u64,
    peak_live_allocs: u32,
    total_allocs: u64,
    total_bytes: u64,
    rewinds: u64,
    records: R,
}

impl<R: RecordStore> HeapRingCore<R> {
    /// An empty ring of `size` bytes over `records` (cleared first).
    ///
    /// `None` unless `size` is a non-zero multiple of [`HEAP_ALIGN`].
    pub fn new(size: u64, mut records: R) -> Option<Self> {
        if size == 0 || !size.is_multiple_of(HEAP_ALIGN) {
            return None;
        }
        records.clear();
        Some(HeapRingCore {
            size,
            top: 0,
            tail: 0,
            next_seq: 0,
            live_bytes: 0,
            live_allocs: 0,
            peak_live_bytes: 0,
            peak_occupied_bytes: 0,
            peak_live_allocs: 0,
            total_allocs: 0,
            total_bytes: 0,
            rewinds: 0,
            records,
        })
    }

    /// Step 1: where a slab of `aligned` bytes would go now, without changing anything; `None`
    /// as well when `aligned` is 0 or not a multiple of [`HEAP_ALIGN`].
    pub fn try_place(&self, aligned: u64) -> Option<Placement> {
        bump(self.size, self.top, self.tail, aligned)
    }

    /// Step 2: commits `placement` (from [`try_place`](Self::try_place), no change in between)
    /// for an owner tag. `None` when the record store is full, or when `placement` is not what
    /// [`try_place`](Self::try_place) gives for its length now (built by hand, or kept across
    /// a change of the ring); nothing changes then.
    pub fn push_record(&mut self, placement: Placement, owner: u64) -> Option<HeapGrant> {
        // Derived again rather than trusted: `Placement`'s fields are public, and a placement
        // the bump rule did not give now could overlap live slabs or run past the ring.
        let len = placement.new_top.checked_sub(placement.offset)?;
        if self.try_place(len) != Some(placement) {
            return None;
        }
        let record = HeapRecord::new(self.next_seq, placement.offset, len, owner);
        self.records.push_back(record).ok()?;
        self.next_seq += 1;
        self.top = placement.new_top;
        self.live_bytes += len;
        self.live_allocs += 1;
        self.total_allocs += 1;
        self.total_bytes += len;
        self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes);
        self.peak_live_allocs = self.peak_live_allocs.max(self.live_allocs);
        self.peak_occupied_bytes = self.peak_occupied_bytes.max(self.occupied_bytes());
        Some(HeapGrant { seq: record.seq, offset: record.offset, len })
    }

    /// Steps 3–5: marks the slab `seq` released, advances the tail over released records and
    /// rewinds the cursors if the FIFO drained.
    pub fn mark_released(&mut self, seq: u64) -> ReleaseOutcome {
        let Some(oldest) = self.records.get(0).map(|r| r.seq) else {
            return ReleaseOutcome::NotFound;
        };
        let Some(position) = seq.checked_sub(oldest).and_then(|p| usize::try_from(p).ok()) else {
            return ReleaseOutcome::NotFound;
        };
        let Some(record) = self.records.get_mut(position) else {
            return ReleaseOutcome::NotFound;
        };
        if record.accounted != 0 {
            return ReleaseOutcome::AlreadyReleased;
        }
        record.mark_released();
        record.accounted = 1;
        let len = record.len;
        self.live_bytes -= len;
        self.live_allocs -= 1;
        let (tail_moved, rewound) = self.advance_tail();
        ReleaseOutcome::Released { len, tail_moved, rewound }
    }

    /// Advances the tail over the released records at the front of the FIFO and rewinds the
    /// cursors if it drained: for a caller whose records another agent may mark released,
    /// before it places a slab, so that such a mark at the front does not pin the tail until
    /// the core's next release. Returns whether the tail moved.
    pub fn collect_released(&mut self) -> bool {
        self.advance_tail().0
    }

    /// Steps 4–5: pops released records off the front (taking out of the live counts any whose
    /// release another agent wrote and the core has not accounted) and rewinds an empty FIFO.
    /// Returns whether the tail moved, and whether it rewound.
    fn advance_tail(&mut self) -> (bool, bool) {
        let tail_before = self.tail;
        let mut popped = false;
        while let Some(front) = self.records.get(0).copied().filter(|r| r.is_released()) {
            if front.accounted == 0 {
                // Saturating: the record's bytes live in memory another agent may write, and a
                // corrupted `accounted` byte must not wrap the counts.
                debug_assert!(self.live_allocs > 0 && self.live_bytes >= front.len);
                self.live_bytes = self.live_bytes.saturating_sub(front.len);
                self.live_allocs = self.live_allocs.saturating_sub(1);
            }
            self.tail = front.end();
            self.records.pop_front();
            popped = true;
        }
        let rewound = popped && self.records.is_empty();
        if rewound {
            self.top = 0;
            self.tail = 0;
            self.rewinds += 1;
        }
        (self.tail != tail_before || rewound, rewound)
    }

    /// Rewinds an empty ring and zeroes its peaks; `false` (and no change) while records are
    /// live.
    pub fn reset(&mut self) -> bool {
        if !self.records.is_empty() {
            return false;
        }
        self.top = 0;
        self.tail = 0;
        self.reset_peaks();
        true
    }

    /// Sets every high-water mark to its current value.
    pub fn reset_peaks(&mut self) {
        self.peak_live_bytes = self.live_bytes;
        self.peak_live_allocs = self.live_allocs;
        self.peak_occupied_bytes = self.occupied_bytes();
    }

    /// The oldest record: the slab that pins the tail (released only if another agent marked
    /// it since the last step 3 or 4).
    pub fn oldest_live(&self) -> Option<&HeapRecord> {
        self.records.get(0)
    }

    /// The live record with sequence number `seq`, if it is still in the FIFO.
    pub fn record(&self, seq: u64) -> Option<&HeapRecord> {
        let oldest = self.records.get(0)?.seq;
        let position = usize::try_from(seq.checked_sub(oldest)?).ok()?;
        self.records.get(position)
    }

    /// The FIFO of records, oldest first (released ones included until the tail passes them).
    pub fn records(&self) -> &R {
        &self.records
    }

    /// Ring size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bump cursor (offset where the next slab goes unless it wraps).
    pub fn top(&self) -> u64 {
        self.top
    }

    /// End of the last slab the tail passed over: where the oldest live slab starts, or the
    /// bytes a wrap skipped before it (`size` once the tail passed the ring's last slab before
    /// a wrap). Equal to `top` only when empty, and then both are 0.
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// Sequence number the next slab gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Sum of the aligned lengths of unreleased slabs.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Unreleased slabs.
    pub fn live_allocs(&self) -> u32 {
        self.live_allocs
    }

    /// Bytes from tail to top, wrap gap and released-but-pinned slabs included.
    pub fn occupied_bytes(&self) -> u64 {
        occupied_bytes(self.size, self.top, self.tail)
    }

    /// The largest aligned request that [`try_place`](Self::try_place) accepts now.
    pub fn largest_fit(&self) -> u64 {
        largest_fit(self.size, self.top, self.tail)
    }

    /// High-water mark of [`live_bytes`](Self::live_bytes).
    pub fn peak_live_bytes(&self) -> u64 {
        self.peak_live_bytes
    }

    /// High-water mark of [`occupied_bytes`](Self::occupied_bytes).
    pub fn peak_occupied_bytes(&self) -> u64 {
        self.peak_occupied_bytes
    }

    /// High-water mark of [`live_allocs`](Self::live_allocs).
    pub fn peak_live_allocs(&self) -> u32 {
        self.peak_live_allocs
    }

    /// Slabs ever placed.
    pub fn total_allocs(&self) -> u64 {
        self.total_allocs
    }

    /// Aligned bytes ever placed.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Times the FIFO drained and the cursors went back to 0.
    pub fn rewinds(&self) -> u64 {
        self.rewinds
    }
}

#[cfg(test)]
mod tests {
    use super::super::records::FixedRecords;
    use super::*;

    const K: u64 = HEAP_ALIGN;

    fn place(core: &mut HeapRingCore<FixedRecords<'_>>, aligned: u64, owner: u64) -> HeapGrant {
        let p = core.try_place(aligned).unwrap();
        core.push_record(p, owner).unwrap()
    }

    #[test]
    fn sizes_that_are_not_aligned_multiples_are_refused() {
        let mut slots = [HeapRecord::default(); 4];
        assert!(HeapRingCore::new(0, FixedRecords::new(&mut slots)).is_none());
        assert!(HeapRingCore::new(1000, FixedRecords::new(&mut slots)).is_none());
    }

    #[test]
    fn fifo_reclamation_waits_for_the_oldest_slab_and_drain_rewinds() {
        let mut slots = [HeapRecord::default(); 8];
        let mut core = HeapRingCore::new(8 * K, FixedRecords::new(&mut slots)).unwrap();
        let a = place(&mut core, 2 * K, 1);
        let b = place(&mut core, 2 * K, 2);
        assert_eq!((a.seq, a.offset, b.seq, b.offset), (0, 0, 1, 2 * K));
        assert_eq!(
            core.mark_released(b.seq),
            ReleaseOutcome::Released { len: 2 * K, tail_moved: false, rewound: false }
        );
        assert_eq!((core.top(), core.tail(), core.live_bytes()), (4 * K, 0, 2 * K));
        assert_eq!(core.mark_released(b.seq), ReleaseOutcome::AlreadyReleased);
        assert_eq!(core.oldest_live().map(|r| r.owner), Some(1));
        assert_eq!(
            core.mark_released(a.seq),
            ReleaseOutcome::Released { len: 2 * K, tail_moved: true, rewound: true }
        );
        assert_eq!((core.top(), core.tail(), core.rewinds()), (0, 0, 1));
        assert_eq!(core.mark_released(a.seq), ReleaseOutcome::NotFound);
        assert_eq!((core.peak_live_bytes(), core.peak_live_allocs()), (4 * K, 2));
        assert!(core.reset());
        assert_eq!(core.peak_live_bytes(), 0);
        assert_eq!(core.next_seq(), 2, "sequence numbers are never reset");
    }

    #[test]
    fn any_non_zero_released_byte_written_by_another_agent_counts_as_released() {
        let mut slots = [HeapRecord::default(); 4];
        let mut core = HeapRingCore::new(8 * K, FixedRecords::new(&mut slots)).unwrap();
        let a = place(&mut core, K, 1);
        let b = place(&mut core, K, 2);
        // A device-side writer marks `b` with a byte other than 1; the core's own release of
        // it then accounts it, once.
        core.records.get_mut(1).unwrap().released = 0x80;
        assert_eq!(
            core.mark_released(b.seq),
            ReleaseOutcome::Released { len: K, tail_moved: false, rewound: false }
        );
        assert_eq!(core.mark_released(b.seq), ReleaseOutcome::AlreadyReleased);
        assert_eq!((core.live_bytes(), core.live_allocs()), (K, 1));
        // Releasing `a` lets the tail pass `b` too, which drains the ring.
        assert_eq!(
            core.mark_released(a.seq),
            ReleaseOutcome::Released { len: K, tail_moved: true, rewound: true }
        );
        assert!(core.records().is_empty());
        assert_eq!((core.live_bytes(), core.live_allocs()), (0, 0));
    }

    #[test]
    fn releases_another_agent_wrote_are_accounted_when_the_tail_passes_them() {
        let mut slots = [HeapRecord::default(); 4];
        let mut core = HeapRingCore::new(4 * K, FixedRecords::new(&mut slots)).unwrap();
        let a = place(&mut core, 2 * K, 1);
        place(&mut core, K, 2);
        place(&mut core, K, 3);
        assert_eq!(core.try_place(K), None, "full");
        // Another agent releases `b` (second) and then `a` (the oldest), never telling the core:
        // through the record's own method, and by writing a byte.
        core.records.get_mut(1).unwrap().mark_released();
        core.records.get_mut(0).unwrap().released = 0xFF;
        assert!(core.collect_released(), "the tail passes both");
        assert_eq!((core.live_bytes(), core.live_allocs(), core.tail()), (K, 1, 3 * K));
        assert!(core.try_place(2 * K).is_some(), "their space is free again");
        assert_eq!(core.mark_released(a.seq), ReleaseOutcome::NotFound, "passed by the tail");
        assert!(!core.collect_released(), "nothing more to pass");
    }

    #[test]
    fn a_placement_try_place_would_not_give_now_is_refused_without_changing_the_ring() {
        let mut slots = [HeapRecord::default(); 4];
        let mut core = HeapRingCore::new(16 * K, FixedRecords::new(&mut slots)).unwrap();
        place(&mut core, K, 1);
        let state = |c: &HeapRingCore<FixedRecords<'_>>| {
            (c.top(), c.tail(), c.next_seq(), c.live_bytes(), c.live_allocs(), c.total_bytes())
        };
        let before = state(&core);
        let forged = [
            Placement { offset: 4096, new_top: 0 },
            Placement { offset: 0, new_top: 1 << 40 },
            // A fitting length at an offset the bump rule would not choose: over the live slab.
            Placement { offset: 0, new_top: K },
            Placement { offset: 2 * K, new_top: 3 * K },
        ];
        for p in forged {
            assert_eq!(core.push_record(p, 2), None, "{p:?}");
            assert_eq!(state(&core), before, "{p:?}");
            assert_eq!(core.records().len(), 1, "{p:?}");
        }
        // The placement the rule gives is still taken.
        let g = place(&mut core, K, 3);
        assert_eq!((g.seq, g.offset, g.len), (1, K, K));
    }

    #[test]
    fn a_full_record_store_refuses_without_changing_the_ring() {
        let mut slots = [HeapRecord::default(); 1];
        let mut core = HeapRingCore::new(8 * K, FixedRecords::new(&mut slots)).unwrap();
        place(&mut core, K, 1);
        let p = core.try_place(K).unwrap();
        assert_eq!(core.push_record(p, 2), None);
        assert_eq!((core.top(), core.live_allocs(), core.next_seq()), (K, 1, 1));
        assert!(!core.reset());
    }
}
