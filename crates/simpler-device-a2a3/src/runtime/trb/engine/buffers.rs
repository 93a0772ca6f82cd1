//! Buffers allocated for a scope (`docs/device-trb.md`, "Buffers from `alloc_tensors`").
//!
//! A buffer lives in its ring's heap under a **holder**: a slot of the scope that allocated it,
//! issued in that scope's ring, which runs nothing and is complete from the start. Like a task
//! of the scope, the holder keeps one reference while the scope is open, and every task given
//! the buffer holds it until that task completes (`keep` of [`Engine::submit_with`]). The
//! holder's slab records are released when it is reclaimed, so a buffer's bytes stay allocated
//! exactly while its scope is open or a task still uses them, and a task of a nested scope may
//! use them like its own. Consecutive allocations of one scope share a holder while its
//! records are the newest of the ring, so a scope usually spends one slot on its buffers.
//!
//! The orchestration names a buffer by its address: [`Engine::buffer_holder`] finds the live
//! slab that starts there and checks that its scope is still open.

use std::sync::atomic::Ordering::Relaxed;

use simpler_ring::fixed::{FixedRecords, HeapRecord, RecordStore};
use simpler_types::DeviceTaskId;
use simpler_types::constants::HEAP_ALIGN;

use super::{
    Allocated, Engine, HOLDER, NIL, SCOPE_HELD, StallKind, SubmitRefusal, USED_AFTER_SCOPE,
    scope_holds,
};

impl Engine<'_> {
    /// Places `bytes` (rounded up to the heap alignment) in the current ring's heap for the
    /// innermost open scope: its holder keeps them until the scope ends and every task using
    /// them completed. Returns the ring, the offset in its heap and the holder. Nothing changes
    /// when it is refused.
    pub(crate) fn alloc(&mut self, bytes: u64) -> Result<Allocated, SubmitRefusal> {
        if self.open == 0 {
            return Err(SubmitRefusal::Invalid("the orchestration already finished"));
        }
        let r = self.current_ring();
        let aligned = match bytes.max(1).checked_next_multiple_of(HEAP_ALIGN) {
            Some(a) if a <= self.rings[r].sizes.heap_bytes => a,
            _ => return Err(SubmitRefusal::Invalid("buffer larger than the ring's heap")),
        };
        self.reclaim(r);
        let Some(placement) = self.rings[r].heap.try_place(aligned) else {
            return Err(self.refuse(r, StallKind::Heap, aligned));
        };
        // The scope's holder takes the buffer while its records are the ring's newest, so that
        // they stay one consecutive range.
        let scope = self.open - 1;
        if let Some(holder) = self.scopes[scope].holder {
            let ring = &mut self.rings[r];
            let at = ring.window.slot_of(holder as u32);
            if ring.heap_seq[at][1] == ring.heap.next_seq() {
                let Some(grant) = ring.heap.push_record(placement, holder) else {
                    return Err(self.refuse(r, StallKind::HeapRecords, 1));
                };
                ring.heap_seq[at][1] = grant.seq + 1;
                let owner = DeviceTaskId(holder);
                return Ok(Allocated { ring: r, offset: grant.offset, owner });
            }
        }
        let ring = &self.rings[r];
        if ring.window.live() == ring.window.capacity() {
            return Err(self.refuse(r, StallKind::Scope, 1));
        }
        let id = DeviceTaskId::new(r as u8, ring.window.head()).0;
        let ring = &mut self.rings[r];
        let Some(grant) = ring.heap.push_record(placement, id) else {
            return Err(self.refuse(r, StallKind::HeapRecords, 1));
        };
        let Some(local) = ring.window.try_issue() else {
            // Room was checked above; give the record back rather than keep it ownerless.
            ring.heap.mark_released(grant.seq);
            return Err(self.refuse(r, StallKind::Scope, 1));
        };
        let at = ring.window.slot_of(local);
        ring.heap_seq[at] = [grant.seq, grant.seq + 1];
        ring.flags[at] = SCOPE_HELD | HOLDER;
        ring.peak_tasks = ring.peak_tasks.max(ring.window.live());
        let slot = self.shared.rings[r].slot(local);
        // Complete from the start, so nothing links to it or waits for it; its one reference
        // is the scope's. It has no dependency entries: its range is empty at the ring's head.
        slot.lock.store(0, Relaxed);
        slot.completed.store(1, Relaxed);
        slot.fanout_head.store(NIL, Relaxed);
        slot.fanin.store(0, Relaxed);
        slot.refs.store(1, Relaxed);
        slot.dep_start.store(ring.dep_head, Relaxed);
        slot.dep_end.store(ring.dep_head, Relaxed);
        self.scopes[scope].holder = Some(id);
        self.holders += 1;
        Ok(Allocated { ring: r, offset: grant.offset, owner: DeviceTaskId(id) })
    }

    /// The holder of the buffer that starts at `offset` in ring `r`'s heap and is at least
    /// `len` bytes long, while the scope that allocated it is still open (so only this thread,
    /// by closing that scope, could let its bytes go); why not otherwise.
    pub(crate) fn buffer_holder(
        &self,
        r: usize,
        offset: u64,
        len: u64,
    ) -> Result<u64, &'static str> {
        let ring = self.rings.get(r).ok_or("no such heap ring")?;
        let found = find_record(ring.heap.records(), offset).filter(|rec| !rec.is_released());
        match found {
            Some(rec) if scope_holds(&self.rings, rec.owner) => {
                if len > rec.len {
                    return Err("a tensor extends past the end of its buffer from alloc_tensors");
                }
                Ok(rec.owner)
            }
            Some(_) => Err(USED_AFTER_SCOPE),
            None => Err("a tensor in the runtime heap does not start at a live buffer from \
                         alloc_tensors (was its scope ended?)"),
        }
    }
}

/// The record of `records` whose slab starts at `offset`, if any (released ones included).
///
/// Slabs are placed in order and the ring wraps at most once behind its oldest live slab, so
/// the records are those at or after the oldest's offset, in increasing order, then those
/// before it, in increasing order: two binary searches.
fn find_record<'r>(records: &'r FixedRecords<'_>, offset: u64) -> Option<&'r HeapRecord> {
    let at = |p: usize| records.get(p).map_or(u64::MAX, |rec| rec.offset);
    let first = records.get(0)?.offset;
    let wrap = partition_point(0, records.len(), |p| at(p) >= first);
    let (lo, hi) = if offset >= first { (0, wrap) } else { (wrap, records.len()) };
    let p = partition_point(lo, hi, |p| at(p) < offset);
    records.get(p).filter(|rec| rec.offset == offset)
}

/// The first position in `lo..hi` where `before` is false, given that it is true for a prefix
/// of the range and false after.
fn partition_point(mut lo: usize, mut hi: usize, before: impl Fn(usize) -> bool) -> usize {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if before(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}
