//! The trb arena: one region of device memory holding the ring heaps and every piece of state
//! the engine works on, laid out identically by the host (which sizes and allocates it) and by
//! the AICPU threads (which reach it through the address the image names).
//!
//! Every element type of the arena is an integer, an integer record or an atomic, so any byte
//! pattern is a valid value: slices over the region are sound whatever a previous run (or the
//! allocator) left in it, and the engine resets what it reads before writing. The region is
//! split into disjoint sections; the orchestration thread holds the owner sections (`&mut`),
//! scheduler threads hold shared references to the atomic sections only, and the per-slot task
//! records are reached through raw pointers (written by the orchestration before the task is
//! published, read by the scheduler that popped it). `docs/device-trb.md` lists the sections.

use core::mem::{align_of, size_of};
use core::sync::atomic::AtomicU32;

use simpler_ring::fixed::{HeapRecord, SlotWord, WakeWord};
use simpler_tensormap::fixed::MapEntry;
use simpler_types::constants::{HEAP_ALIGN, HEAP_RING_COUNT};

use super::engine::{SharedDep, SharedSlot};
use super::ready::ReadyCell;
use super::sizing::RingSizes;

/// Most tensor arguments of one trb task.
pub(crate) const MAX_TASK_TENSORS: usize = 16;
/// Most scalar arguments of one trb task.
pub(crate) const MAX_TASK_SCALARS: usize = 16;
/// Most tensor arguments of a trb orchestration (the chip entry's tensors).
pub(crate) const MAX_ENTRY_TENSORS: usize = 64;
/// Alignment of every section.
const SECTION: u64 = 64;

/// What an arena is built for: the ring sizes and the tensor map's entry and bucket counts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct ArenaShape {
    /// The sizes of every ring.
    pub(crate) rings: [RingSizes; HEAP_RING_COUNT],
    /// Tensor-map entries.
    pub(crate) map_entries: u32,
    /// Tensor-map buckets (a power of two).
    pub(crate) map_buckets: u32,
}

impl ArenaShape {
    /// The shape of rings of `rings`: the tensor map holds four entries per task slot of every
    /// ring, over a quarter as many buckets. `None` when those counts do not fit the map's
    /// `u32` indices (windows legal one by one can add up past them).
    pub(crate) fn of(rings: [RingSizes; HEAP_RING_COUNT]) -> Option<ArenaShape> {
        let slots = rings.iter().try_fold(0u32, |sum, r| sum.checked_add(r.task_window))?;
        let map_entries = slots.checked_mul(4)?;
        let map_buckets = slots.checked_next_power_of_two()?;
        Some(ArenaShape { rings, map_entries, map_buckets })
    }
}

/// One task's dispatch record: what the scheduler that pops the task needs to dispatch it.
/// Written by the orchestration before the task is published; read by that scheduler.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct SlotTask {
    /// [`DeviceTaskId`](simpler_types::DeviceTaskId) raw value.
    pub(crate) task_id: u64,
    /// Func ids of the AIC, AIV0 and AIV1 kernels (`NO_FUNC` = none).
    pub(crate) func_ids: [i32; 3],
    /// `TaskShape` as `u32`.
    pub(crate) shape: u32,
    /// Blocks to run (≥ 1).
    pub(crate) block_num: u32,
    /// Tensor arguments.
    pub(crate) num_tensors: u32,
    /// Scalar arguments.
    pub(crate) num_scalars: u32,
    /// Member dispatches not yet finished (set by the orchestration, counted down by the
    /// schedulers that dispatched them).
    pub(crate) members_remaining: AtomicU32,
    /// Padding to the end of the first line.
    pub(crate) reserved: [u32; 6],
    /// Tensor descriptors (128 bytes each); the kernels read them during the run.
    pub(crate) tensors: [[u8; 128]; MAX_TASK_TENSORS],
    /// Scalars.
    pub(crate) scalars: [u64; MAX_TASK_SCALARS],
}

const _: () = {
    assert!(size_of::<SlotTask>() == 64 + 128 * MAX_TASK_TENSORS + 8 * MAX_TASK_SCALARS);
    assert!(core::mem::offset_of!(SlotTask, tensors) == 64);
};

/// [`ReuseRecord::state`] of a record that describes its run's leftovers.
const REUSE_CLEAN: u64 = 0x7472_625f_636c_6e31;

/// What the last run over an arena left behind, so that the next run over the same allocation
/// resets only that: the first section of every layout (offset 0, whatever the shape), written
/// by the orchestration thread alone. `docs/device-trb.md` ("Reusing an arena") has the rules.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(64))]
pub(crate) struct ReuseRecord {
    /// [`REUSE_CLEAN`] once a run ended with every task complete; anything else asks for a
    /// full reset.
    state: u64,
    /// The shape of the arena the run used.
    task_window: [u32; HEAP_RING_COUNT],
    dep_pool: [u32; HEAP_RING_COUNT],
    heap_bytes: [u64; HEAP_RING_COUNT],
    map_entries: u32,
    map_buckets: u32,
    /// Slots the run issued (tasks and buffer holders, over all rings): a bound on the slots
    /// each ring's window used.
    issued: u64,
    /// Tensor-map pool slots the run handed out.
    map_handed_out: u32,
    /// Fills the record to two whole 64-byte alignment units, so that it has no padding:
    /// copying the arena's bytes then never reads an uninitialised one.
    reserved: [u32; 9],
}

const _: () = assert!(size_of::<ReuseRecord>() == 128);

/// What a clean previous run over the same storage left: the extents a partial reset covers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Leftovers {
    pub(crate) issued: u64,
    pub(crate) map_handed_out: u32,
}

impl ReuseRecord {
    fn shape_is(
        &self,
        sizes: &[RingSizes; HEAP_RING_COUNT],
        entries: usize,
        buckets: usize,
    ) -> bool {
        (0..HEAP_RING_COUNT).all(|r| {
            self.task_window[r] == sizes[r].task_window
                && self.dep_pool[r] == sizes[r].dep_pool
                && self.heap_bytes[r] == sizes[r].heap_bytes
        }) && self.map_entries as usize == entries
            && self.map_buckets as usize == buckets
    }

    /// The leftovers the record describes, if it is clean and was written for storage of this
    /// shape; then marks it dirty, so that a run that does not end cleanly leaves a full reset
    /// to the next one.
    pub(crate) fn take(
        &mut self,
        sizes: &[RingSizes; HEAP_RING_COUNT],
        entries: usize,
        buckets: usize,
    ) -> Option<Leftovers> {
        let clean = self.state == REUSE_CLEAN
            && self.shape_is(sizes, entries, buckets)
            && self.map_handed_out as usize <= entries;
        self.state = 0;
        clean.then_some(Leftovers { issued: self.issued, map_handed_out: self.map_handed_out })
    }

    /// Records that a run over storage of this shape ended cleanly with these leftovers.
    pub(crate) fn put(
        &mut self,
        sizes: &[RingSizes; HEAP_RING_COUNT],
        entries: usize,
        buckets: usize,
        left: Leftovers,
    ) {
        *self = ReuseRecord {
            state: REUSE_CLEAN,
            task_window: sizes.map(|s| s.task_window),
            dep_pool: sizes.map(|s| s.dep_pool),
            heap_bytes: sizes.map(|s| s.heap_bytes),
            map_entries: entries as u32,
            map_buckets: buckets as u32,
            issued: left.issued,
            map_handed_out: left.map_handed_out,
            reserved: [0; 9],
        };
    }
}

/// Section offsets of one ring.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct RingLayout {
    heap: u64,
    words: u64,
    records: u64,
    slots: u64,
    heap_seq: u64,
    flags: u64,
    deps: u64,
    tasks: u64,
}

/// Section offsets of an arena of one shape.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct ArenaLayout {
    shape: ArenaShape,
    reuse: u64,
    rings: [RingLayout; HEAP_RING_COUNT],
    map_entries: u64,
    map_buckets: u64,
    ready: u64,
    counters: u64,
    /// Total bytes.
    pub(crate) len: u64,
}

/// Heap records per ring: twice the window, room for a slab per task and per buffer.
pub(crate) fn heap_records(window: u32) -> usize {
    2 * window as usize
}

/// The cursors and counters of the arena, one cache line each.
#[derive(Debug, Default)]
#[repr(C, align(64))]
struct Counter {
    value: WakeWord,
    reserved: [u64; 7],
}

const COUNTERS: u64 = 5;

impl ArenaLayout {
    /// The layout of `shape`; `None` when its sizes overflow.
    pub(crate) fn of(shape: ArenaShape) -> Option<ArenaLayout> {
        let mut at = 0u64;
        let mut take = |bytes: u64, align: u64| -> Option<u64> {
            let off = at.div_ceil(align).checked_mul(align)?;
            at = off.checked_add(bytes)?;
            Some(off)
        };
        let reuse = take(size_of::<ReuseRecord>() as u64, SECTION)?;
        let mut rings = [RingLayout {
            heap: 0,
            words: 0,
            records: 0,
            slots: 0,
            heap_seq: 0,
            flags: 0,
            deps: 0,
            tasks: 0,
        }; HEAP_RING_COUNT];
        for (l, s) in rings.iter_mut().zip(shape.rings) {
            l.heap = take(s.heap_bytes, HEAP_ALIGN)?;
        }
        for (l, s) in rings.iter_mut().zip(shape.rings) {
            let w = u64::from(s.task_window);
            l.words = take(w * size_of::<SlotWord>() as u64, SECTION)?;
            l.records =
                take(heap_records(s.task_window) as u64 * size_of::<HeapRecord>() as u64, SECTION)?;
            l.slots = take(w * size_of::<SharedSlot>() as u64, SECTION)?;
            l.heap_seq = take(w * 16, SECTION)?;
            l.flags = take(w, SECTION)?;
            l.deps = take(u64::from(s.dep_pool) * size_of::<SharedDep>() as u64, SECTION)?;
            l.tasks = take(w.checked_mul(size_of::<SlotTask>() as u64)?, SECTION)?;
        }
        let map_entries =
            take(u64::from(shape.map_entries) * size_of::<MapEntry<u64>>() as u64, SECTION)?;
        let map_buckets = take(u64::from(shape.map_buckets) * 4, SECTION)?;
        let cells: u64 = shape.rings.iter().map(|r| u64::from(r.task_window)).sum();
        let ready = take(cells * size_of::<ReadyCell>() as u64, SECTION)?;
        let counters = take(COUNTERS * size_of::<Counter>() as u64, SECTION)?;
        Some(ArenaLayout {
            shape,
            reuse,
            rings,
            map_entries,
            map_buckets,
            ready,
            counters,
            len: at,
        })
    }

    /// The shape laid out.
    pub(crate) fn shape(&self) -> ArenaShape {
        self.shape
    }

    /// Offset of ring `r`'s heap from the arena base.
    pub(crate) fn heap_off(&self, r: usize) -> u64 {
        self.rings[r].heap
    }
}

/// The storage of one ring, as the engine's owner holds it.
#[derive(Debug)]
pub(crate) struct RingStore<'a> {
    pub(crate) words: &'a [SlotWord],
    pub(crate) records: &'a mut [HeapRecord],
    /// Per slot, the heap records it owns: `[first, end)` sequence numbers.
    pub(crate) heap_seq: &'a mut [[u64; 2]],
    /// Per slot: whether its scope's reference is still held, whether it is a buffer holder.
    pub(crate) flags: &'a mut [u8],
}

/// All of an arena, as the engine's owner (the orchestration thread) holds it.
#[derive(Debug)]
pub(crate) struct Storage<'a> {
    pub(crate) sizes: [RingSizes; HEAP_RING_COUNT],
    pub(crate) reuse: &'a mut ReuseRecord,
    pub(crate) rings: [RingStore<'a>; HEAP_RING_COUNT],
    pub(crate) map_entries: &'a mut [MapEntry<u64>],
    pub(crate) map_buckets: &'a mut [u32],
    pub(crate) shared: SharedStorage<'a>,
}

/// The atomic sections of an arena, which completers (scheduler threads) share.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SharedStorage<'a> {
    pub(crate) sizes: [RingSizes; HEAP_RING_COUNT],
    pub(crate) words: [&'a [SlotWord]; HEAP_RING_COUNT],
    pub(crate) slots: [&'a [SharedSlot]; HEAP_RING_COUNT],
    pub(crate) deps: [&'a [SharedDep]; HEAP_RING_COUNT],
    pub(crate) ready: &'a [ReadyCell],
    pub(crate) ready_head: &'a WakeWord,
    pub(crate) ready_tail: &'a WakeWord,
    pub(crate) completed: &'a WakeWord,
    /// The completion count the owner waits for (`simpler_ring::fixed::CountWatch`).
    pub(crate) owner_wake_at: &'a WakeWord,
    /// Scheduler threads idle for want of ready tasks (`simpler_ring::fixed::Idlers`).
    pub(crate) idle_schedulers: &'a WakeWord,
}

/// # Safety
/// `base + off` must start `n` elements of `T` inside the caller's region, aligned for `T`,
/// which nobody accesses except through the returned slice (or atomically) for `'a`.
unsafe fn slice<'a, T>(base: *mut u8, off: u64, n: usize) -> &'a [T] {
    debug_assert!((base as usize + off as usize).is_multiple_of(align_of::<T>()));
    // SAFETY: forwarded from the caller; every arena type is valid for any bytes.
    unsafe { core::slice::from_raw_parts(base.add(off as usize).cast::<T>(), n) }
}

/// # Safety
/// As [`slice`], and nobody else accesses the elements at all for `'a`.
unsafe fn slice_mut<'a, T>(base: *mut u8, off: u64, n: usize) -> &'a mut [T] {
    debug_assert!((base as usize + off as usize).is_multiple_of(align_of::<T>()));
    // SAFETY: forwarded from the caller; every arena type is valid for any bytes.
    unsafe { core::slice::from_raw_parts_mut(base.add(off as usize).cast::<T>(), n) }
}

impl ArenaLayout {
    /// The shared sections of the arena at `base`.
    ///
    /// # Safety
    ///
    /// `base` must be 1024-aligned and start `self.len` bytes of memory valid for `'a`, laid
    /// out by this layout, whose atomic sections are only accessed atomically for `'a`.
    pub(crate) unsafe fn shared<'a>(&self, base: *mut u8) -> SharedStorage<'a> {
        let s = self.shape.rings;
        let cells: usize = s.iter().map(|r| r.task_window as usize).sum();
        // SAFETY: the sections lie inside the region (computed by `of`), aligned for their
        // types, and hold atomics only (the caller's guarantee).
        unsafe {
            let counters: &'a [Counter] = slice(base, self.counters, COUNTERS as usize);
            SharedStorage {
                sizes: s,
                words: [0, 1, 2, 3]
                    .map(|r| slice(base, self.rings[r].words, s[r].task_window as usize)),
                slots: [0, 1, 2, 3]
                    .map(|r| slice(base, self.rings[r].slots, s[r].task_window as usize)),
                deps: [0, 1, 2, 3].map(|r| slice(base, self.rings[r].deps, s[r].dep_pool as usize)),
                ready: slice(base, self.ready, cells),
                ready_head: &counters[0].value,
                ready_tail: &counters[1].value,
                completed: &counters[2].value,
                owner_wake_at: &counters[3].value,
                idle_schedulers: &counters[4].value,
            }
        }
    }

    /// Every section of the arena at `base`, for the engine's owner.
    ///
    /// # Safety
    ///
    /// As [`shared`](Self::shared), and nobody but the returned storage accesses the owner
    /// sections (reuse record, heap records, heap sequence numbers, scope flags, tensor map)
    /// for `'a`.
    pub(crate) unsafe fn owner<'a>(&self, base: *mut u8) -> Storage<'a> {
        let s = self.shape.rings;
        // SAFETY: the caller's guarantee; the owner sections are disjoint from each other and
        // from the shared ones.
        unsafe {
            let shared = self.shared(base);
            let mut n = 0;
            let rings = [(); HEAP_RING_COUNT].map(|()| {
                let (r, l, w) = (n, self.rings[n], s[n].task_window as usize);
                n += 1;
                RingStore {
                    words: shared.words[r],
                    records: slice_mut(base, l.records, heap_records(s[r].task_window)),
                    heap_seq: slice_mut(base, l.heap_seq, w),
                    flags: slice_mut(base, l.flags, w),
                }
            });
            Storage {
                sizes: s,
                reuse: &mut slice_mut(base, self.reuse, 1)[0],
                rings,
                map_entries: slice_mut(base, self.map_entries, self.shape.map_entries as usize),
                map_buckets: slice_mut(base, self.map_buckets, self.shape.map_buckets as usize),
                shared,
            }
        }
    }

    /// The dispatch record of slot `at` of ring `r` in the arena at `base`.
    pub(crate) fn task_ptr(&self, base: *mut u8, r: usize, at: usize) -> *mut SlotTask {
        let r = r.min(HEAP_RING_COUNT - 1);
        let at = at.min(self.shape.rings[r].task_window as usize - 1);
        base.wrapping_add(self.rings[r].tasks as usize + at * size_of::<SlotTask>()).cast()
    }
}

/// One 1024-aligned block of a host arena.
#[cfg(test)]
#[derive(Clone, Copy)]
#[repr(C, align(1024))]
struct Aligned1024([u8; 1024]);

/// An arena in host memory, for tests of the engine on host threads.
#[cfg(test)]
#[derive(Clone)]
pub(crate) struct TrbArena {
    layout: ArenaLayout,
    buf: Vec<Aligned1024>,
}

#[cfg(test)]
impl TrbArena {
    /// Storage for rings of `sizes` and a tensor map of `map_entries` entries over
    /// `map_buckets` buckets (a power of two).
    pub(crate) fn new(
        sizes: [RingSizes; HEAP_RING_COUNT],
        map_entries: u32,
        map_buckets: u32,
    ) -> TrbArena {
        let layout =
            ArenaLayout::of(ArenaShape { rings: sizes, map_entries, map_buckets }).unwrap();
        let blocks = layout.len.div_ceil(1024) as usize;
        TrbArena { layout, buf: vec![Aligned1024([0; 1024]); blocks] }
    }

    /// The arena's storage for one engine.
    pub(crate) fn storage(&mut self) -> Storage<'_> {
        // SAFETY: the buffer is 1024-aligned, `len` bytes long and exclusively borrowed.
        unsafe { self.layout.owner(self.buf.as_mut_ptr().cast()) }
    }

    /// Every byte of the arena.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the blocks are plain bytes, borrowed shared for the slice's life.
        unsafe { core::slice::from_raw_parts(self.buf.as_ptr().cast(), self.buf.len() * 1024) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(task_window: u32) -> [RingSizes; HEAP_RING_COUNT] {
        [RingSizes { task_window, heap_bytes: 4096, dep_pool: 16 }; HEAP_RING_COUNT]
    }

    #[test]
    fn a_reuse_record_is_taken_once_and_only_for_its_own_shape() {
        let left = Leftovers { issued: 7, map_handed_out: 9 };
        let mut record = ReuseRecord::default();
        assert_eq!(record.take(&sizes(16), 64, 16), None, "never written");
        record.put(&sizes(16), 64, 16, left);
        assert_eq!(record.take(&sizes(32), 64, 16), None, "another window");
        record.put(&sizes(16), 64, 16, left);
        assert_eq!(record.take(&sizes(16), 64, 32), None, "another bucket count");
        record.put(&sizes(16), 64, 16, left);
        assert_eq!(record.take(&sizes(16), 64, 16), Some(left));
        assert_eq!(record.take(&sizes(16), 64, 16), None, "taking marks it dirty");
        record.put(&sizes(16), 8, 16, left);
        assert_eq!(record.take(&sizes(16), 8, 16), None, "more handed out than the pool holds");
    }

    #[test]
    fn every_layout_starts_with_the_reuse_record() {
        for window in [1, 16, 1024] {
            let layout = ArenaLayout::of(ArenaShape::of(sizes(window)).unwrap()).unwrap();
            assert_eq!(layout.reuse, 0);
            assert!(layout.heap_off(0) >= size_of::<ReuseRecord>() as u64);
        }
    }
}
