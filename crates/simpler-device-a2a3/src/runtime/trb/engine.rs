//! The trb submit and completion state machine (`docs/device-trb.md`).
//!
//! A task submitted at scope depth `d` lives in ring `min(d, 3)`: it takes a slot of that ring's
//! task window, a slab of its heap ring for its outputs, and one dependency-pool entry per
//! producer. Producers are found through the fixed tensor map (a read finds writers, a write
//! finds readers, a read-write both). A task becomes ready when its last producer completed.
//!
//! # Task life cycle and invariants
//!
//! 1. **Pending**: `fanin_remaining` counts producers not yet completed. It reaches 0 exactly
//!    once, and the task is then pushed to the ready queue exactly once.
//! 2. **Completed** ([`Engine::complete`]): the task's fanout list is walked once (each
//!    consumer's `fanin_remaining` drops by one), and each of its producers loses one reference.
//! 3. **Consumed**: a completed task whose `refs` reached 0 — no consumer still reads its
//!    outputs (one reference per consumer, released when the consumer completes) and its scope
//!    closed (one reference, released at scope end). Its window slot is retired and its heap
//!    slab released; the ring's tails then advance over every consumed task at the front, in
//!    FIFO order, which also frees the dependency entries those tasks took.
//!
//! Fanout lists link dependency entries of the consumers' rings. An entry is reused only after
//! its consumer was reclaimed, which is after the consumer completed, which is after every
//! producer completed; a producer's list is walked only at its completion and only appended to
//! before it, so a walk never meets a reused entry.
//!
//! A submit that does not fit changes nothing and returns [`SubmitRefusal::Wait`] when
//! completions of running tasks can make room, or a [`RingStall`] when nothing can (the scope
//! holding the room cannot close while the orchestration waits inside it).
//!
//! The engine has one owner (`&mut`); all storage is allocated once in [`TrbArena`] and nothing
//! allocates afterwards.

use std::fmt;

use simpler_ring::fixed::{FixedRecords, HeapRecord, HeapRingCore, SlotWord, TaskWindowCore};
use simpler_tensormap::ByteSpan;
use simpler_tensormap::fixed::{AccessMode, FixedMapError, FixedTensorMap, MapEntry};
use simpler_types::DeviceTaskId;
use simpler_types::constants::{HEAP_ALIGN, HEAP_RING_COUNT};

use super::sizing::RingSizes;
use crate::abi::codes::RuntimeCode;

/// End of a fanout list.
const NIL: u64 = u64::MAX;
/// No heap slab.
const NO_SLAB: u64 = u64::MAX;
/// Deepest scope nesting the engine tracks.
pub(crate) const MAX_SCOPE_DEPTH: usize = 64;

/// One tensor access of a submitted task.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Access {
    /// The buffer's base address.
    pub(crate) key: u64,
    /// The bytes accessed.
    pub(crate) span: ByteSpan,
    /// How.
    pub(crate) mode: AccessMode,
}

/// The storage of one ring.
#[derive(Debug)]
struct RingStore {
    words: Vec<SlotWord>,
    records: Vec<HeapRecord>,
    slots: Vec<TaskSlot>,
    deps: Vec<DepEntry>,
}

/// All storage of a run's rings and tensor map, allocated once per sizing and reusable.
#[derive(Debug)]
pub(crate) struct TrbArena {
    sizes: [RingSizes; HEAP_RING_COUNT],
    rings: Vec<RingStore>,
    map_entries: Vec<MapEntry<u64>>,
    map_buckets: Vec<u32>,
    ready: Vec<u64>,
}

impl TrbArena {
    /// Storage for rings of `sizes` and a tensor map of `map_entries` entries over
    /// `map_buckets` buckets (a power of two).
    pub(crate) fn new(
        sizes: [RingSizes; HEAP_RING_COUNT],
        map_entries: u32,
        map_buckets: u32,
    ) -> TrbArena {
        let rings = sizes
            .iter()
            .map(|s| RingStore {
                words: (0..s.task_window).map(|_| SlotWord::new(0)).collect(),
                records: vec![HeapRecord::default(); s.task_window as usize],
                slots: vec![TaskSlot::default(); s.task_window as usize],
                deps: vec![DepEntry::default(); s.dep_pool as usize],
            })
            .collect();
        let ready = sizes.iter().map(|s| s.task_window as usize).sum();
        TrbArena {
            sizes,
            rings,
            map_entries: vec![MapEntry::vacant(0); map_entries as usize],
            map_buckets: vec![0; map_buckets as usize],
            ready: vec![0; ready],
        }
    }

    /// The sizes this arena was built for.
    pub(crate) fn sizes(&self) -> [RingSizes; HEAP_RING_COUNT] {
        self.sizes
    }
}

/// Per-slot task state.
#[derive(Clone, Copy, Debug)]
struct TaskSlot {
    fanin_remaining: u32,
    /// References that keep the task's slot and slab: one per uncompleted consumer, one for
    /// the scope while it is open.
    refs: u32,
    completed: bool,
    scope_ref: bool,
    heap_seq: u64,
    /// First dependency entry this task took in its ring's pool, and one past the last.
    dep_start: u64,
    dep_end: u64,
    fanout_head: u64,
}

impl Default for TaskSlot {
    fn default() -> TaskSlot {
        TaskSlot {
            fanin_remaining: 0,
            refs: 0,
            completed: false,
            scope_ref: false,
            heap_seq: NO_SLAB,
            dep_start: 0,
            dep_end: 0,
            fanout_head: NIL,
        }
    }
}

/// One dependency entry: the edge `producer → consumer`, linked into the producer's fanout list.
#[derive(Clone, Copy, Debug, Default)]
struct DepEntry {
    producer: u64,
    consumer: u64,
    /// Next entry of the producer's fanout list (`(ring << 32) | index`, or `NIL`).
    next: u64,
}

/// A ring's state during a run.
struct Ring<'a> {
    window: TaskWindowCore<'a>,
    heap: HeapRingCore<FixedRecords<'a>>,
    slots: &'a mut [TaskSlot],
    deps: &'a mut [DepEntry],
    dep_head: u64,
    dep_tail: u64,
    sizes: RingSizes,
    peak_tasks: u32,
    peak_deps: u64,
}

impl Ring<'_> {
    fn slot(&self, local: u32) -> usize {
        self.window.slot_of(local)
    }

    /// Whether `local` of this ring completed (a reclaimed id did; an id never issued did not).
    fn is_completed(&self, local: u32) -> bool {
        if self.window.is_live(local) {
            self.slots[self.slot(local)].completed
        } else {
            // Older than the tail: reclaimed. Not older: not issued yet.
            self.window.tail().wrapping_sub(local) <= i32::MAX as u32 && local != self.window.head()
        }
    }

    fn dep_entry(&mut self, at: u64) -> &mut DepEntry {
        let len = self.deps.len() as u64;
        &mut self.deps[(at % len) as usize]
    }
}

/// What stalled, in the words of the runtime codes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum StallKind {
    /// One scope needs more task slots than the window holds.
    Scope,
    /// The heap cannot place a slab and the slabs in the way belong to an open scope.
    Heap,
    /// The dependency pool cannot take a task's edges.
    DepPool,
    /// The tensor map holds only accesses of tasks that will not complete while the
    /// orchestration waits.
    Tensormap,
}

/// A wait that can never end: the ring, its three sizes and its usage at the failure.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct RingStall {
    /// What stalled.
    pub(crate) kind: StallKind,
    /// The ring.
    pub(crate) ring: u8,
    /// The ring's sizes.
    pub(crate) sizes: RingSizes,
    /// Unreclaimed task slots of the ring.
    pub(crate) tasks: u32,
    /// Occupied heap bytes of the ring.
    pub(crate) heap: u64,
    /// Unreclaimed dependency entries of the ring.
    pub(crate) deps: u64,
    /// What the refused submit needed: slots, bytes, entries or map entries by `kind`.
    pub(crate) needed: u64,
    /// Tensor-map entries (capacity) for a tensor-map stall.
    pub(crate) map_capacity: u32,
}

impl RingStall {
    /// The runtime code the stall latches.
    pub(crate) fn code(&self) -> RuntimeCode {
        match self.kind {
            StallKind::Scope => RuntimeCode::ScopeDeadlock,
            StallKind::Heap => RuntimeCode::HeapRingDeadlock,
            StallKind::DepPool => RuntimeCode::DepPoolOverflow,
            StallKind::Tensormap => RuntimeCode::TensormapOverflow,
        }
    }
}

impl fmt::Display for RingStall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.sizes;
        write!(f, "ring {}: ", self.ring)?;
        match self.kind {
            StallKind::Scope => write!(
                f,
                "scope needs {} task slots, window {}",
                u64::from(self.tasks) + self.needed,
                s.task_window
            )?,
            StallKind::Heap => write!(
                f,
                "scope needs {} more heap bytes with {} of {} held by the open scope",
                self.needed, self.heap, s.heap_bytes
            )?,
            StallKind::DepPool => write!(
                f,
                "a task needs {} dep entries with {} of {} in use",
                self.needed, self.deps, s.dep_pool
            )?,
            StallKind::Tensormap => write!(
                f,
                "the tensor map's {} entries all hold accesses of tasks that cannot complete, \
                 {} more needed",
                self.map_capacity, self.needed
            )?,
        }
        write!(
            f,
            " (sizes: window {}, heap {} bytes, dep pool {}; usage: {} tasks, {} heap bytes, \
             {} dep entries)",
            s.task_window, s.heap_bytes, s.dep_pool, self.tasks, self.heap, self.deps
        )
    }
}

/// Why a submit did not happen; nothing changed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum SubmitRefusal {
    /// Room will come when running tasks complete: complete some and retry.
    Wait,
    /// Room can never come.
    Stall(RingStall),
    /// The submit itself is malformed (a slab larger than the heap, scopes nested too deep).
    Invalid(&'static str),
}

/// A submitted task.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Submitted {
    /// Its id.
    pub(crate) id: DeviceTaskId,
    /// Offset of its output slab in its ring's heap (`None` when it asked for no bytes).
    pub(crate) heap_offset: Option<u64>,
}

/// Most distinct producers one task may have (the dependency entries one submit takes).
pub(crate) const MAX_FANIN: usize = 256;

/// The state machine over one arena.
pub(crate) struct Engine<'a> {
    rings: [Ring<'a>; HEAP_RING_COUNT],
    map: FixedTensorMap<'a, u64>,
    ready: &'a mut [u64],
    ready_head: usize,
    ready_len: usize,
    /// Per open scope: the ring its tasks go to and the first local id it issued there.
    scopes: [(u8, u32); MAX_SCOPE_DEPTH],
    depth: usize,
    /// Tasks submitted and not completed.
    incomplete: u64,
    producers: [u64; MAX_FANIN],
}

fn ring_of(id: u64) -> usize {
    (id >> 32) as usize
}

fn is_completed(rings: &[Ring<'_>], id: u64) -> bool {
    rings.get(ring_of(id)).is_none_or(|r| r.is_completed(id as u32))
}

impl<'a> Engine<'a> {
    /// An empty engine over `arena` (every ring empty, no scope open).
    pub(crate) fn new(arena: &'a mut TrbArena) -> Engine<'a> {
        let sizes = arena.sizes;
        let mut stores = arena.rings.iter_mut();
        let rings = sizes.map(|s| {
            let st = stores.next().expect("one store per ring");
            Ring {
                window: TaskWindowCore::new(&st.words).expect("power-of-two window"),
                heap: HeapRingCore::new(s.heap_bytes, FixedRecords::new(&mut st.records))
                    .expect("aligned heap"),
                slots: &mut st.slots,
                deps: &mut st.deps,
                dep_head: 0,
                dep_tail: 0,
                sizes: s,
                peak_tasks: 0,
                peak_deps: 0,
            }
        });
        Engine {
            rings,
            map: FixedTensorMap::new(&mut arena.map_entries, &mut arena.map_buckets)
                .expect("power-of-two buckets"),
            ready: &mut arena.ready,
            ready_head: 0,
            ready_len: 0,
            scopes: [(0, 0); MAX_SCOPE_DEPTH],
            depth: 0,
            incomplete: 0,
            producers: [0; MAX_FANIN],
        }
    }

    /// The ring tasks submitted now go to.
    fn current_ring(&self) -> usize {
        self.depth.min(HEAP_RING_COUNT - 1)
    }

    /// Opens a scope; `Err` when scopes nest deeper than [`MAX_SCOPE_DEPTH`].
    pub(crate) fn scope_begin(&mut self) -> Result<(), SubmitRefusal> {
        if self.depth == MAX_SCOPE_DEPTH {
            return Err(SubmitRefusal::Invalid("scopes nested too deep"));
        }
        self.depth += 1;
        let r = self.current_ring();
        self.scopes[self.depth - 1] = (r as u8, self.rings[r].window.head());
        Ok(())
    }

    /// Closes the innermost scope: its tasks lose their scope reference.
    pub(crate) fn scope_end(&mut self) -> Result<(), SubmitRefusal> {
        if self.depth == 0 {
            return Err(SubmitRefusal::Invalid("scope end without a scope"));
        }
        let (r, first) = self.scopes[self.depth - 1];
        self.depth -= 1;
        let r = r as usize;
        let mut local = first;
        while local != self.rings[r].window.head() {
            // Ids a nested scope already released, or that were reclaimed, are skipped.
            if self.rings[r].window.is_live(local) {
                let at = self.rings[r].slot(local);
                let slot = &mut self.rings[r].slots[at];
                if slot.scope_ref {
                    slot.scope_ref = false;
                    self.release(DeviceTaskId::new(r as u8, local).0);
                }
            }
            local = local.wrapping_add(1);
        }
        self.reclaim(r);
        Ok(())
    }

    /// Submits a task with `accesses` and an output slab of `heap_bytes` (rounded up to the
    /// heap alignment; 0 = none). Nothing changes when it is refused.
    pub(crate) fn submit(
        &mut self,
        accesses: &[Access],
        heap_bytes: u64,
    ) -> Result<Submitted, SubmitRefusal> {
        let r = self.current_ring();
        let aligned = heap_bytes.div_ceil(HEAP_ALIGN) * HEAP_ALIGN;
        if aligned > self.rings[r].sizes.heap_bytes {
            return Err(SubmitRefusal::Invalid("output slab larger than the ring's heap"));
        }
        // Window room.
        let ring = &mut self.rings[r];
        ring.window.reclaim();
        if ring.window.live() == ring.window.capacity() {
            return Err(self.refuse(r, StallKind::Scope, 1));
        }
        // Heap room.
        let placement = if aligned > 0 {
            match self.rings[r].heap.try_place(aligned) {
                Some(p) => Some(p),
                None => return Err(self.refuse(r, StallKind::Heap, aligned)),
            }
        } else {
            None
        };
        // Producers: every lookup before any insert, so a task never finds itself.
        let mut count = 0usize;
        let mut overflow = false;
        {
            let rings = &self.rings;
            let producers = &mut self.producers;
            for a in accesses {
                self.map.lookup(
                    &a.key,
                    a.span,
                    a.mode,
                    |o| is_completed(rings, o),
                    |o| {
                        if producers[..count].contains(&o) {
                            return;
                        }
                        if count == MAX_FANIN {
                            overflow = true;
                        } else {
                            producers[count] = o;
                            count += 1;
                        }
                    },
                );
            }
        }
        if overflow {
            return Err(SubmitRefusal::Invalid("more distinct producers than one task may have"));
        }
        // Dependency-pool room.
        let ring = &self.rings[r];
        if ring.dep_head - ring.dep_tail + count as u64 > u64::from(ring.sizes.dep_pool) {
            return Err(self.refuse(r, StallKind::DepPool, count as u64));
        }
        // Tensor-map room, so that no insert below can fail.
        let needed = accesses.iter().filter(|a| !a.span.is_empty()).count() as u32;
        if self.map.capacity() - self.map.len() < needed {
            let rings = &self.rings;
            self.map.prune_retired(|o| is_completed(rings, o));
            if self.map.capacity() - self.map.len() < needed {
                return Err(self.refuse(r, StallKind::Tensormap, u64::from(needed)));
            }
        }
        // Commit.
        let ring = &mut self.rings[r];
        let local = ring.window.try_issue().expect("room checked above");
        let id = DeviceTaskId::new(r as u8, local).0;
        let grant = placement.map(|p| ring.heap.push_record(p, id).expect("one record per slot"));
        let dep_start = ring.dep_head;
        ring.dep_head += count as u64;
        ring.peak_tasks = ring.peak_tasks.max(ring.window.live());
        ring.peak_deps = ring.peak_deps.max(ring.dep_head - ring.dep_tail);
        let at = ring.slot(local);
        ring.slots[at] = TaskSlot {
            fanin_remaining: 0,
            refs: u32::from(self.depth > 0),
            completed: false,
            scope_ref: self.depth > 0,
            heap_seq: grant.map_or(NO_SLAB, |g| g.seq),
            dep_start,
            dep_end: dep_start + count as u64,
            fanout_head: NIL,
        };
        let mut pending = 0;
        for (i, &p) in self.producers[..count].iter().enumerate() {
            let entry_at = dep_start + i as u64;
            let link = ((r as u64) << 32) | (entry_at % u64::from(self.rings[r].sizes.dep_pool));
            let (pr, pl) = (ring_of(p), p as u32);
            let pslot = self.rings[pr].slot(pl);
            let producer = &mut self.rings[pr].slots[pslot];
            producer.refs += 1;
            let next = producer.fanout_head;
            producer.fanout_head = link;
            *self.rings[r].dep_entry(entry_at) = DepEntry { producer: p, consumer: id, next };
            pending += 1;
        }
        let at = self.rings[r].slot(local);
        self.rings[r].slots[at].fanin_remaining = pending;
        for a in accesses {
            let rings = &self.rings;
            // Room was checked above, and a Full insert changes nothing.
            let inserted = self.map.insert(a.key, a.span, a.mode, id, |o| is_completed(rings, o));
            debug_assert!(!matches!(inserted, Err(FixedMapError::Full { .. })));
        }
        self.incomplete += 1;
        if pending == 0 {
            self.push_ready(id);
        }
        Ok(Submitted { id: DeviceTaskId(id), heap_offset: grant.map(|g| g.offset) })
    }

    /// Classifies a submit that does not fit: a wait when completions can free room, a stall
    /// when the room is held by the open scope (or by nothing that will complete).
    fn refuse(&self, r: usize, kind: StallKind, needed: u64) -> SubmitRefusal {
        let ring = &self.rings[r];
        let stall = RingStall {
            kind,
            ring: r as u8,
            sizes: ring.sizes,
            tasks: ring.window.live(),
            heap: ring.heap.occupied_bytes(),
            deps: ring.dep_head - ring.dep_tail,
            needed,
            map_capacity: self.map.capacity(),
        };
        let can_free = match kind {
            StallKind::Tensormap => self.incomplete > 0 && needed <= u64::from(self.map.capacity()),
            StallKind::Heap if needed > ring.heap.size() => false,
            StallKind::DepPool if needed > u64::from(ring.sizes.dep_pool) => false,
            // Room at the front of the ring frees once its oldest task is consumed, which
            // cannot happen while that task holds the reference of a scope still open.
            _ => {
                ring.window.live() > 0 && {
                    let oldest = ring.window.tail();
                    !ring.slots[ring.slot(oldest)].scope_ref
                }
            }
        };
        if can_free { SubmitRefusal::Wait } else { SubmitRefusal::Stall(stall) }
    }

    fn push_ready(&mut self, id: u64) {
        // The queue holds at most every live task once, and has a place for each.
        let at = (self.ready_head + self.ready_len) % self.ready.len();
        self.ready[at] = id;
        self.ready_len += 1;
    }

    /// The oldest ready task not yet handed out.
    pub(crate) fn pop_ready(&mut self) -> Option<DeviceTaskId> {
        if self.ready_len == 0 {
            return None;
        }
        let id = self.ready[self.ready_head];
        self.ready_head = (self.ready_head + 1) % self.ready.len();
        self.ready_len -= 1;
        Some(DeviceTaskId(id))
    }

    /// Tasks submitted and not yet completed.
    pub(crate) fn incomplete(&self) -> u64 {
        self.incomplete
    }

    /// Whether `id` completed.
    pub(crate) fn is_completed(&self, id: DeviceTaskId) -> bool {
        is_completed(&self.rings, id.0)
    }

    /// Records that the ready task `id` finished: its consumers' fanins drop (those reaching
    /// zero become ready), its producers lose a reference, and consumed tasks are reclaimed.
    /// `false` (nothing changed) when `id` is not a live, uncompleted task.
    pub(crate) fn complete(&mut self, id: DeviceTaskId) -> bool {
        let (r, local) = (ring_of(id.0), id.0 as u32);
        let Some(ring) = self.rings.get_mut(r) else { return false };
        if !ring.window.is_live(local) {
            return false;
        }
        let at = ring.slot(local);
        let slot = ring.slots[at];
        if slot.completed || slot.fanin_remaining > 0 {
            return false;
        }
        ring.slots[at].completed = true;
        self.incomplete -= 1;
        // Fanout: consumers become ready when their last producer completed.
        let mut link = slot.fanout_head;
        while link != NIL {
            let entry = self.rings[(link >> 32) as usize].deps[link as u32 as usize];
            let (cr, cl) = (ring_of(entry.consumer), entry.consumer as u32);
            let cat = self.rings[cr].slot(cl);
            let consumer = &mut self.rings[cr].slots[cat];
            consumer.fanin_remaining -= 1;
            if consumer.fanin_remaining == 0 {
                self.push_ready(entry.consumer);
            }
            link = entry.next;
        }
        // Fanin: this task no longer reads its producers' outputs.
        for e in slot.dep_start..slot.dep_end {
            let producer = self.rings[r].dep_entry(e).producer;
            self.release(producer);
        }
        if self.rings[r].slots[at].refs == 0 {
            self.consume(r, local);
        }
        for ring in 0..HEAP_RING_COUNT {
            self.reclaim(ring);
        }
        true
    }

    /// Drops one reference of `id`; a completed task with none left is consumed.
    fn release(&mut self, id: u64) {
        let (r, local) = (ring_of(id), id as u32);
        let at = self.rings[r].slot(local);
        let slot = &mut self.rings[r].slots[at];
        slot.refs -= 1;
        if slot.refs == 0 && slot.completed {
            self.consume(r, local);
        }
    }

    /// Retires the slot and releases the slab of a completed, unreferenced task.
    fn consume(&mut self, r: usize, local: u32) {
        let ring = &mut self.rings[r];
        let seq = ring.slots[ring.slot(local)].heap_seq;
        if seq != NO_SLAB {
            ring.heap.mark_released(seq);
        }
        ring.window.retire(local);
    }

    /// Advances the ring's window tail over consumed tasks, and its dep-pool tail with it.
    fn reclaim(&mut self, r: usize) {
        let ring = &mut self.rings[r];
        let before = ring.window.tail();
        let freed = ring.window.reclaim();
        if freed > 0 {
            let last = before.wrapping_add(freed - 1);
            ring.dep_tail = ring.slots[ring.slot(last)].dep_end;
        }
    }

    /// Unreclaimed task slots of ring `r` and their high-water mark.
    pub(crate) fn ring_tasks(&self, r: usize) -> (u32, u32) {
        (self.rings[r].window.live(), self.rings[r].peak_tasks)
    }

    /// Occupied heap bytes of ring `r` and their high-water mark.
    pub(crate) fn ring_heap(&self, r: usize) -> (u64, u64) {
        (self.rings[r].heap.occupied_bytes(), self.rings[r].heap.peak_occupied_bytes())
    }

    /// Unreclaimed dependency entries of ring `r` and their high-water mark.
    pub(crate) fn ring_deps(&self, r: usize) -> (u64, u64) {
        let ring = &self.rings[r];
        (ring.dep_head - ring.dep_tail, ring.peak_deps)
    }

    /// Live tensor-map entries and their high-water mark.
    pub(crate) fn map_entries(&self) -> (u32, u32) {
        (self.map.len(), self.map.peak_len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(task_window: u32, heap_bytes: u64, dep_pool: u32) -> [RingSizes; HEAP_RING_COUNT] {
        [RingSizes { task_window, heap_bytes, dep_pool }; HEAP_RING_COUNT]
    }

    fn access(key: u64, mode: AccessMode) -> Access {
        Access { key, span: ByteSpan::new(key, key + 256).unwrap(), mode }
    }

    /// Submits, completing ready tasks (oldest first, each reported to `done`) while the
    /// engine says to wait.
    fn submit_with_back_pressure(
        e: &mut Engine<'_>,
        accesses: &[Access],
        heap: u64,
        done: &mut impl FnMut(DeviceTaskId),
    ) -> Result<Submitted, RingStall> {
        loop {
            match e.submit(accesses, heap) {
                Ok(s) => return Ok(s),
                Err(SubmitRefusal::Stall(s)) => return Err(s),
                Err(SubmitRefusal::Invalid(m)) => panic!("invalid submit: {m}"),
                Err(SubmitRefusal::Wait) => {
                    assert!(complete_ready_newest_first(e, done) > 0, "a wait with nothing ready");
                }
            }
        }
    }

    /// Completes every task ready now, newest first, so that only dependencies order them.
    fn complete_ready_newest_first(
        e: &mut Engine<'_>,
        done: &mut impl FnMut(DeviceTaskId),
    ) -> usize {
        let ready: Vec<DeviceTaskId> = std::iter::from_fn(|| e.pop_ready()).collect();
        for &id in ready.iter().rev() {
            assert!(e.complete(id));
            done(id);
        }
        ready.len()
    }

    fn drain(e: &mut Engine<'_>, done: &mut impl FnMut(DeviceTaskId)) {
        while complete_ready_newest_first(e, done) > 0 {}
        assert_eq!(e.incomplete(), 0, "every submitted task completed");
    }

    #[test]
    fn reads_wait_for_writers_writes_for_readers_and_inout_for_both() {
        let mut arena = TrbArena::new(sizes(16, 16 << 10, 16), 64, 16);
        let mut e = Engine::new(&mut arena);
        let a = 0x10_000;
        let w0 = e.submit(&[access(a, AccessMode::Write)], 0).unwrap().id;
        let r1 = e.submit(&[access(a, AccessMode::Read)], 0).unwrap().id;
        let r2 = e.submit(&[access(a, AccessMode::Read)], 0).unwrap().id;
        let w3 = e.submit(&[access(a, AccessMode::Write)], 0).unwrap().id;
        let rw4 = e.submit(&[access(a, AccessMode::ReadWrite)], 0).unwrap().id;
        assert_eq!(e.pop_ready(), Some(w0));
        assert_eq!(e.pop_ready(), None, "the readers wait for the writer");
        assert!(e.complete(w0));
        let mut readers = [e.pop_ready(), e.pop_ready(), e.pop_ready()];
        readers.sort();
        assert_eq!(readers, [None, Some(r1), Some(r2)], "both readers, in any order");
        assert!(e.complete(r1));
        assert_eq!(e.pop_ready(), None, "the overwrite waits for both readers");
        assert!(e.complete(r2));
        assert_eq!(e.pop_ready(), Some(w3));
        assert!(!e.complete(rw4), "a task with a pending producer cannot complete");
        assert!(e.complete(w3));
        assert_eq!(e.pop_ready(), Some(rw4));
        assert!(e.complete(rw4));
        assert!(!e.complete(rw4), "a task completes once");
        assert_eq!(e.incomplete(), 0);
        assert_eq!(e.ring_tasks(0).0, 0, "top-level tasks are reclaimed once consumed");
    }

    /// Tasks of a chain must complete in submission order; every other order is allowed.
    fn stream(chain_len: u64, tasks: u64) {
        let mut arena = TrbArena::new(sizes(1024, 1 << 20, 1024), 4096, 1024);
        let mut e = Engine::new(&mut arena);
        let mut completed = 0u64;
        let mut next_in_chain = std::collections::HashMap::<u64, u64>::new();
        let index_of = std::cell::RefCell::new(std::collections::HashMap::<u64, (u64, u64)>::new());
        let mut done = |id: DeviceTaskId| {
            let (chain, pos) = index_of.borrow_mut().remove(&id.0).expect("a submitted task");
            let next = next_in_chain.entry(chain).or_insert(0);
            assert_eq!(*next, pos, "chain {chain} completed out of order");
            *next += 1;
            completed += 1;
        };
        let mut submitted = 0u64;
        while submitted < tasks {
            e.scope_begin().unwrap();
            for _ in 0..100 {
                let (chain, pos) = (submitted / chain_len, submitted % chain_len);
                // A chain updates one buffer in place; its first task only writes it.
                let mode = if pos == 0 { AccessMode::Write } else { AccessMode::ReadWrite };
                let key = 0x1000_0000 + chain * 0x1000;
                let s = submit_with_back_pressure(&mut e, &[access(key, mode)], 1024, &mut done)
                    .unwrap();
                assert!(s.heap_offset.is_some());
                // The map is keyed by id; ids recycle, so a live id is never submitted twice.
                assert!(index_of.borrow_mut().insert(s.id.0, (chain, pos)).is_none());
                submitted += 1;
            }
            e.scope_end().unwrap();
        }
        drain(&mut e, &mut done);
        assert_eq!(completed, tasks);
        let (live, peak) = e.ring_tasks(1);
        assert_eq!(live, 0, "every slot was reclaimed");
        assert!(peak <= 1024);
        assert_eq!(e.ring_heap(1).0, 0);
        assert_eq!(e.ring_deps(1).0, 0);
    }

    #[test]
    fn a_stream_of_independent_tasks_far_larger_than_the_window_runs_in_bounded_rings() {
        stream(1, 100_000);
    }

    #[test]
    fn a_stream_of_100_task_chains_far_larger_than_the_window_runs_in_order() {
        stream(100, 100_000);
    }

    #[test]
    fn one_scope_needing_more_slots_than_the_window_is_a_scope_deadlock_naming_the_ring() {
        let mut arena = TrbArena::new(sizes(4, 64 << 10, 16), 64, 16);
        let mut e = Engine::new(&mut arena);
        let mut done = |_| {};
        e.scope_begin().unwrap();
        e.scope_begin().unwrap();
        for i in 0..4 {
            submit_with_back_pressure(&mut e, &[access(i << 12, AccessMode::Write)], 0, &mut done)
                .unwrap();
        }
        let stall =
            submit_with_back_pressure(&mut e, &[access(9 << 12, AccessMode::Write)], 0, &mut done)
                .unwrap_err();
        assert_eq!(stall.code(), RuntimeCode::ScopeDeadlock);
        assert!(
            stall.to_string().starts_with("ring 2: scope needs 5 task slots, window 4"),
            "{stall}"
        );
        assert!(stall.to_string().contains("window 4, heap 65536 bytes, dep pool 16"), "{stall}");
    }

    #[test]
    fn a_scope_holding_the_whole_heap_is_a_heap_ring_deadlock() {
        let mut arena = TrbArena::new(sizes(16, 4096, 16), 64, 16);
        let mut e = Engine::new(&mut arena);
        let mut done = |_| {};
        e.scope_begin().unwrap();
        for i in 0..4 {
            submit_with_back_pressure(
                &mut e,
                &[access(i << 12, AccessMode::Write)],
                1000,
                &mut done,
            )
            .unwrap();
        }
        let stall = submit_with_back_pressure(&mut e, &[], 1, &mut done).unwrap_err();
        assert_eq!(stall.code(), RuntimeCode::HeapRingDeadlock);
        assert!(stall.to_string().contains("ring 1: scope needs 1024 more heap bytes"), "{stall}");
        assert!(stall.to_string().contains("4096 heap bytes"), "{stall}");
        // Closing the scope releases the heap: the same submit then succeeds.
        e.scope_end().unwrap();
        drain(&mut e, &mut done);
        submit_with_back_pressure(&mut e, &[], 1, &mut done).unwrap();
    }

    #[test]
    fn a_task_with_more_producers_than_the_dep_pool_is_a_dep_pool_overflow() {
        let mut arena = TrbArena::new(sizes(16, 64 << 10, 4), 64, 16);
        let mut e = Engine::new(&mut arena);
        let mut done = |_| {};
        let reads: Vec<Access> = (0..5).map(|i| access(i << 12, AccessMode::Read)).collect();
        for r in &reads {
            e.submit(&[access(r.key, AccessMode::Write)], 0).unwrap();
        }
        let stall = submit_with_back_pressure(&mut e, &reads, 0, &mut done).unwrap_err();
        assert_eq!(stall.code(), RuntimeCode::DepPoolOverflow);
        assert!(stall.to_string().contains("ring 0: a task needs 5 dep entries"), "{stall}");
    }

    #[test]
    fn a_task_with_more_accesses_than_the_map_holds_is_a_tensormap_overflow() {
        let mut arena = TrbArena::new(sizes(16, 64 << 10, 16), 4, 1);
        let mut e = Engine::new(&mut arena);
        let mut done = |_| {};
        e.submit(&[access(0x1000, AccessMode::Write)], 0).unwrap();
        let writes: Vec<Access> = (1..6).map(|i| access(i << 12, AccessMode::Write)).collect();
        // Refused at once, although a task is still running: no completion can make room.
        let Err(SubmitRefusal::Stall(stall)) = e.submit(&writes, 0) else {
            panic!("a task needing more entries than the map holds must stall at once")
        };
        assert_eq!(stall.code(), RuntimeCode::TensormapOverflow);
        assert!(stall.to_string().contains("tensor map's 4 entries"), "{stall}");
        // A full map of completed tasks' entries is pruned, not an overflow.
        let four = &writes[..4];
        drain(&mut e, &mut done);
        submit_with_back_pressure(&mut e, four, 0, &mut done).unwrap();
        assert_eq!(e.map_entries().0, 4);
    }

    #[test]
    fn a_refused_submit_changes_nothing() {
        let mut arena = TrbArena::new(sizes(4, 4096, 16), 64, 16);
        let mut e = Engine::new(&mut arena);
        e.scope_begin().unwrap();
        for i in 0..4 {
            e.submit(&[access(i << 12, AccessMode::Write)], 1).unwrap();
        }
        let before = (e.ring_tasks(1), e.ring_heap(1), e.ring_deps(1), e.map_entries());
        assert!(matches!(
            e.submit(&[access(0, AccessMode::Read)], 1),
            Err(SubmitRefusal::Stall(_))
        ));
        assert_eq!(before, (e.ring_tasks(1), e.ring_heap(1), e.ring_deps(1), e.map_entries()));
    }
}
