//! Storage of a heap ring's live records: the FIFO that [`HeapRingCore`](super::HeapRingCore)
//! pushes at the back and retires from the front.

use bytemuck::{Pod, Zeroable};

/// One slab of a heap ring, from placement until the tail passes it.
///
/// `repr(C)` plain data with no implicit padding ([`Pod`]), so a device runtime can keep an
/// array of them in shared memory and copy them as bytes. The layout is fixed (checked at
/// compile time): four `u64` fields at offsets 0, 8, 16 and 24, the `released` byte at 32, the
/// `accounted` byte at 33, six reserved bytes, 40 bytes in all with 8-byte alignment.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct HeapRecord {
    /// Per-ring sequence number: records in the FIFO carry consecutive values.
    pub seq: u64,
    /// Offset of the slab from the ring's base.
    pub offset: u64,
    /// Aligned length of the slab in bytes (never 0).
    pub len: u64,
    /// Opaque owner tag: the host stores a packed `SlotId`, a device its task id.
    pub owner: u64,
    /// Zero while the slab's owner holds it; non-zero once released (the record stays until the
    /// tail passes it). This crate writes 1 and reads any non-zero value as released, so a
    /// device-side writer may use whatever non-zero byte it likes. A byte rather than a `bool`
    /// because memory written by another agent may hold any value, which a `bool` must not.
    pub released: u8,
    /// Written by the core alone: non-zero once it has taken the slab out of its live counts,
    /// when it marks the slab released or first meets a release another agent wrote
    /// ([`HeapRingCore::mark_released`](super::HeapRingCore::mark_released),
    /// [`HeapRingCore::collect_released`](super::HeapRingCore::collect_released)).
    pub accounted: u8,
    /// Explicit padding up to the 8-byte alignment: written as zero here, never read.
    pub reserved: [u8; 6],
}

// The layout the struct docs promise, which a device-side definition must match.
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<HeapRecord>() == 40);
    assert!(align_of::<HeapRecord>() == 8);
    assert!(offset_of!(HeapRecord, seq) == 0);
    assert!(offset_of!(HeapRecord, offset) == 8);
    assert!(offset_of!(HeapRecord, len) == 16);
    assert!(offset_of!(HeapRecord, owner) == 24);
    assert!(offset_of!(HeapRecord, released) == 32);
    assert!(offset_of!(HeapRecord, accounted) == 33);
    assert!(offset_of!(HeapRecord, reserved) == 34);
};

impl HeapRecord {
    /// A record of a slab that is not yet released.
    pub const fn new(seq: u64, offset: u64, len: u64, owner: u64) -> HeapRecord {
        HeapRecord { seq, offset, len, owner, released: 0, accounted: 0, reserved: [0; 6] }
    }

    /// Offset one past the slab's last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// `true` once the slab was released: any non-zero `released` byte counts.
    pub const fn is_released(&self) -> bool {
        self.released != 0
    }

    /// Marks the slab released (what another agent does; the core's own release also notes
    /// that it accounted the slab).
    pub fn mark_released(&mut self) {
        self.released = 1;
    }
}

/// A FIFO of [`HeapRecord`]s: push at the back, inspect by position, pop at the front.
///
/// Position 0 is the oldest record. Implementations never reorder records.
pub trait RecordStore {
    /// Number of records held.
    fn len(&self) -> usize;
    /// `true` when no record is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Appends `record` at the back; hands it back when the store is full.
    fn push_back(&mut self, record: HeapRecord) -> Result<(), HeapRecord>;
    /// The record at `position` (0 = oldest).
    fn get(&self, position: usize) -> Option<&HeapRecord>;
    /// The record at `position`, mutably.
    fn get_mut(&mut self, position: usize) -> Option<&mut HeapRecord>;
    /// Removes and returns the oldest record.
    fn pop_front(&mut self) -> Option<HeapRecord>;
    /// Removes every record.
    fn clear(&mut self);
}

/// A [`RecordStore`] over a caller-provided slice, used as a circular buffer.
///
/// Its capacity is the slice length; it never allocates.
#[derive(Debug)]
pub struct FixedRecords<'a> {
    slots: &'a mut [HeapRecord],
    head: usize,
    len: usize,
}

impl<'a> FixedRecords<'a> {
    /// An empty store over `slots`; the slice's previous contents are ignored.
    pub fn new(slots: &'a mut [HeapRecord]) -> Self {
        FixedRecords { slots, head: 0, len: 0 }
    }

    /// Most records the store can hold.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn physical(&self, position: usize) -> Option<usize> {
        if position < self.len { Some((self.head + position) % self.slots.len()) } else { None }
    }
}

impl RecordStore for FixedRecords<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn push_back(&mut self, record: HeapRecord) -> Result<(), HeapRecord> {
        if self.len == self.slots.len() {
            return Err(record);
        }
        let at = (self.head + self.len) % self.slots.len();
        self.slots[at] = record;
        self.len += 1;
        Ok(())
    }

    fn get(&self, position: usize) -> Option<&HeapRecord> {
        self.physical(position).map(|at| &self.slots[at])
    }

    fn get_mut(&mut self, position: usize) -> Option<&mut HeapRecord> {
        self.physical(position).map(|at| &mut self.slots[at])
    }

    fn pop_front(&mut self) -> Option<HeapRecord> {
        let at = self.physical(0)?;
        self.head = (self.head + 1) % self.slots.len();
        self.len -= 1;
        Some(self.slots[at])
    }

    fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64) -> HeapRecord {
        HeapRecord::new(seq, seq * 1024, 1024, seq)
    }

    #[test]
    fn fixed_records_wrap_around_their_slice_in_fifo_order() {
        let mut slots = [HeapRecord::default(); 3];
        let mut store = FixedRecords::new(&mut slots);
        for seq in 0..3 {
            store.push_back(rec(seq)).unwrap();
        }
        assert_eq!(store.push_back(rec(3)), Err(rec(3)));
        assert_eq!(store.pop_front(), Some(rec(0)));
        store.push_back(rec(3)).unwrap();
        let seqs: Vec<u64> = (0..store.len()).map(|i| store.get(i).unwrap().seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        assert!(store.get(3).is_none());
        store.clear();
        assert!(store.is_empty());
        assert_eq!(store.pop_front(), None);
    }

    #[test]
    fn an_empty_slice_is_a_store_that_is_always_full() {
        let mut slots: [HeapRecord; 0] = [];
        let mut store = FixedRecords::new(&mut slots);
        assert_eq!(store.capacity(), 0);
        assert_eq!(store.push_back(rec(0)), Err(rec(0)));
        assert_eq!(store.pop_front(), None);
    }

    #[test]
    fn a_record_is_plain_bytes_in_the_documented_layout() {
        let mut record = HeapRecord::new(1, 2, 3, 4);
        record.mark_released();
        record.accounted = 1;
        let bytes = bytemuck::bytes_of(&record);
        assert_eq!(bytes.len(), 40);
        assert_eq!(bytes[24..32], 4_u64.to_ne_bytes());
        assert_eq!(bytes[32..], [1, 1, 0, 0, 0, 0, 0, 0], "released, accounted, then padding");
        let copy: HeapRecord = bytemuck::pod_read_unaligned(bytes);
        assert_eq!(copy, record);
        assert_eq!(HeapRecord::zeroed(), HeapRecord::default());
    }
}
