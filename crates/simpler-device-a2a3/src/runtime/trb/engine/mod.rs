//! The trb submit and completion state machine (`docs/device-trb.md`).
//!
//! A task submitted at scope depth `d` lives in ring `min(d, 3)` (depth 0 is the run's outer
//! scope): it takes a slot of that ring's task window, a slab of its heap ring for its outputs,
//! and one dependency entry per producer. Producers are found through the fixed tensor map (a
//! read finds writers, a write finds readers, a read-write both). Buffers allocated for a scope
//! live under a holder slot of that scope (`buffers`).
//!
//! # Roles
//!
//! - The **owner** ([`Engine`], `&mut`) is the orchestration thread: it submits, opens and
//!   closes scopes, and reclaims slots, heap and dependency entries.
//! - **Completers** ([`Completer`], `Copy` and `Sync`) are the scheduler threads: they pop
//!   ready tasks and report them finished, in any order, concurrently with the owner.
//!
//! # Per-task state and invariants
//!
//! 1. `fanin` counts producers not yet completed, plus one guard while the owner links the
//!    task. It reaches 0 exactly once, and whoever brings it there pushes the task to the ready
//!    queue, so a task is ready exactly once.
//! 2. `refs` counts what keeps the task's slot, slab and dependency entries: one until it
//!    completes, one while its scope is open, one per consumer until that consumer completes.
//!    It reaches 0 exactly once; whoever brings it there retires the slot (the window core's
//!    release CAS), and only then may the owner reclaim it. A reference is only taken from a
//!    non-zero count (CAS), so a consumed task is never revived.
//! 3. `completed` and `fanout_head` change only under the task's fanout lock: a completer sets
//!    `completed` and takes the whole list in one critical section, and the owner appends only
//!    while `completed` is false. So every consumer linked before completion is walked exactly
//!    once, and none is linked after.
//! 4. A dependency entry lives in its consumer's ring and is reused only after that consumer
//!    was reclaimed. A completer reads an entry's `next` before lowering its consumer's
//!    `fanin`, since that may let the consumer run, finish and be reclaimed at once.
//!
//! Reclaiming (owner): the window tail advances over retired slots in FIFO order; for each,
//! the owner releases its heap slab and moves the ring's dependency tail to its last entry.
//!
//! A submit that does not fit changes nothing and returns [`SubmitRefusal::Wait`] when
//! completions can make room, or a [`RingStall`] when nothing can.
//!
//! All storage is allocated once in [`TrbArena`]; nothing allocates afterwards.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};

use simpler_ring::fixed::{
    CountWatch, FixedRecords, HeapRingCore, Idlers, TaskWindowCore, WindowRetirer,
};
use simpler_tensormap::ByteSpan;
use simpler_tensormap::fixed::{AccessMode, FixedMapError, FixedTensorMap, Role};
use simpler_types::DeviceTaskId;
use simpler_types::constants::{HEAP_ALIGN, HEAP_RING_COUNT};

use super::ready::{ReadyRing, backoff};
use super::sizing::RingSizes;
use super::storage::{Leftovers, ReuseRecord, SharedStorage, Storage};

mod buffers;
mod copy_waits;
mod producers;
mod stall;
pub(crate) use stall::{RingStall, StallKind};

/// End of a fanout list.
const NIL: u64 = u64::MAX;
/// Deepest scope nesting the engine tracks (the outer scope included).
pub(crate) const MAX_SCOPE_DEPTH: usize = 64;
/// Most distinct producers one task may have.
pub(crate) const MAX_FANIN: usize = 256;
/// Slot flag: the scope that issued the slot is open and holds its reference.
const SCOPE_HELD: u8 = 1;
/// Slot flag: the slot holds buffers of its scope and runs nothing (`buffers`).
const HOLDER: u8 = 2;

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

/// The state of one task slot that completers touch.
#[derive(Debug)]
pub(crate) struct SharedSlot {
    /// The fanout lock: 1 while held.
    lock: AtomicU32,
    /// 1 once the task completed.
    completed: AtomicU32,
    fanout_head: AtomicU64,
    fanin: AtomicU32,
    refs: AtomicU32,
    /// The task's dependency entries in its ring's pool: `[dep_start, dep_end)`.
    dep_start: AtomicU64,
    dep_end: AtomicU64,
}

impl Default for SharedSlot {
    fn default() -> SharedSlot {
        SharedSlot {
            lock: AtomicU32::new(0),
            completed: AtomicU32::new(0),
            fanout_head: AtomicU64::new(NIL),
            fanin: AtomicU32::new(0),
            refs: AtomicU32::new(0),
            dep_start: AtomicU64::new(0),
            dep_end: AtomicU64::new(0),
        }
    }
}

impl SharedSlot {
    /// Runs `f` under the slot's fanout lock (a spin lock around a few loads and stores that
    /// cannot panic). A holder preempted inside them is waited for with the core given away.
    fn locked<R>(&self, f: impl FnOnce() -> R) -> R {
        // Acquire on taking / release on dropping: the critical sections are totally ordered.
        let mut round = 0u32;
        while self.lock.compare_exchange_weak(0, 1, Acquire, Relaxed).is_err() {
            backoff(round);
            round = round.saturating_add(1);
        }
        let r = f();
        self.lock.store(0, Release);
        r
    }
}

/// One dependency entry: the edge `producer → consumer`, linked into the producer's fanout
/// list while the producer has not completed.
#[derive(Debug, Default)]
pub(crate) struct SharedDep {
    producer: AtomicU64,
    consumer: AtomicU64,
    /// Next entry of the producer's fanout list (`(ring << 32) | index`, or `NIL`).
    next: AtomicU64,
}

/// What completers share of one ring.
#[derive(Clone, Copy, Debug)]
struct RingShared<'a> {
    slots: &'a [SharedSlot],
    deps: &'a [SharedDep],
    retirer: WindowRetirer<'a>,
    mask: u32,
}

impl<'a> RingShared<'a> {
    fn slot(&self, local: u32) -> &'a SharedSlot {
        &self.slots[(local & self.mask) as usize]
    }

    fn dep(&self, at: u64) -> &'a SharedDep {
        &self.deps[(at % self.deps.len() as u64) as usize]
    }
}

fn ring_of(id: u64) -> usize {
    (id >> 32) as usize
}

/// What one [`Completer::complete`] asks its caller to wake.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[must_use]
pub(crate) struct Completion {
    /// Consumers it made ready (pushed to the ready queue).
    pub(crate) readied: u32,
    /// It reached the completion count the owner waits for: wake the owner.
    pub(crate) wake_owner: bool,
    /// Consumers it made ready that the ready queue refused: they can never run, so the run
    /// must fail (the queue's sizing rules it out; see [`Completer::push_ready`]).
    pub(crate) unqueued: u32,
}

/// The scheduler side: pops ready tasks and completes them, from any thread.
///
/// Wake-ups (`docs/device-trb.md`, "Who wakes whom"): the owner waits for a completion count
/// it arms ([`Engine::arm_completions`]); the completion reaching it reports `wake_owner`, and
/// only that one. A scheduler thread that has a free core and found no ready task enters the
/// idle count ([`idle_enter`](Self::idle_enter)) and re-checks before it parks; whoever makes a
/// task ready asks [`idle_besides`](Self::idle_besides) (or [`Submitted::wake_schedulers`]) and
/// wakes the schedulers only then.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Completer<'a> {
    rings: [RingShared<'a>; HEAP_RING_COUNT],
    ready: ReadyRing<'a>,
    completed: CountWatch<'a>,
    idle: Idlers<'a>,
}

impl<'a> Completer<'a> {
    /// A completer over the shared sections of storage an [`Engine`] was built over (the
    /// engine resets them; attaching changes nothing).
    pub(crate) fn attach(parts: SharedStorage<'a>) -> Completer<'a> {
        let rings = [0, 1, 2, 3].map(|r| RingShared {
            slots: parts.slots[r],
            deps: parts.deps[r],
            retirer: WindowRetirer::new(parts.words[r]).expect("power-of-two window"),
            mask: parts.sizes[r].task_window - 1,
        });
        Completer {
            rings,
            ready: ReadyRing::attach(parts.ready, parts.ready_head, parts.ready_tail),
            completed: CountWatch::new(parts.completed, parts.owner_wake_at),
            idle: Idlers::new(parts.idle_schedulers),
        }
    }

    /// Tasks completed since the engine was built (acquire: their effects are visible).
    pub(crate) fn completed(&self) -> u64 {
        self.completed.count()
    }

    /// This scheduler thread has room for a task and found none ready: it counts as idle until
    /// [`idle_leave`](Self::idle_leave), and must look at the ready queue again before parking.
    pub(crate) fn idle_enter(&self) {
        self.idle.enter();
    }

    /// This scheduler thread (which entered) is busy again.
    pub(crate) fn idle_leave(&self) {
        self.idle.leave();
    }

    /// After making tasks ready: whether a scheduler thread other than the caller may be
    /// parked or about to park for want of them (`caller_idle`: the caller is counted idle).
    /// Nobody needs waking for tasks already popped again (by the caller itself, typically,
    /// when it completes a chain's task and dispatches its successor in the same round).
    pub(crate) fn idle_besides(&self, caller_idle: bool) -> bool {
        !self.ready.looks_empty() && self.idle.any_besides(caller_idle)
    }

    /// The oldest ready task, if any; each ready task is handed out once.
    pub(crate) fn pop_ready(&self) -> Option<DeviceTaskId> {
        self.ready.pop().map(DeviceTaskId)
    }

    /// Queues the ready task `id`; `false` when the queue refused it. It never does: the queue
    /// has a cell for every slot of every ring, a task is queued once and holds its slot until
    /// it completes, so fewer values than cells are ever unclaimed, and a push waits for a pop
    /// that claimed its cell. The callers still turn a refusal into a failed run, not a lost
    /// task.
    fn push_ready(&self, id: u64) -> bool {
        self.ready.push(id)
    }

    /// Drops one reference of `id`; the last one retires its slot.
    fn release(&self, id: u64) {
        let ring = &self.rings[ring_of(id)];
        // AcqRel: the last release sees every earlier holder's accesses before retiring.
        if ring.slot(id as u32).refs.fetch_sub(1, AcqRel) == 1 {
            ring.retirer.retire(id as u32);
        }
    }

    /// Whether the live task `id` completed (the orchestration reads it: a live slot is not
    /// reissued while it looks).
    fn has_completed(&self, id: u64) -> bool {
        // Acquire: pairs with the completer's release store.
        self.rings[ring_of(id)].slot(id as u32).completed.load(Acquire) == 1
    }

    /// Takes one reference of `id` unless it has none left (consumed); `false` then.
    fn acquire(&self, id: u64) -> bool {
        let refs = &self.rings[ring_of(id)].slot(id as u32).refs;
        let mut now = refs.load(Relaxed);
        loop {
            if now == 0 {
                return false;
            }
            match refs.compare_exchange_weak(now, now + 1, Relaxed, Relaxed) {
                Ok(_) => return true,
                Err(v) => now = v,
            }
        }
    }

    /// Records that `id`, a task this thread popped from the ready queue, finished: its
    /// consumers' fanins drop (those reaching zero become ready) and its producers and the task
    /// itself lose a reference.
    pub(crate) fn complete(&self, id: DeviceTaskId) -> Completion {
        let id = id.0;
        let (mut readied, mut unqueued) = (0, 0);
        let ring = &self.rings[ring_of(id)];
        let slot = ring.slot(id as u32);
        let mut link = slot.locked(|| {
            // Release: an orchestration that sees the flag (`accessors_done`) sees the task's
            // effects too.
            slot.completed.store(1, Release);
            slot.fanout_head.swap(NIL, Relaxed)
        });
        while link != NIL {
            let entry = self.rings[(link >> 32) as usize].dep(link as u32 as u64);
            let consumer = entry.consumer.load(Relaxed);
            link = entry.next.load(Relaxed);
            let c = self.rings[ring_of(consumer)].slot(consumer as u32);
            // AcqRel: the consumer runs after every producer's writes.
            if c.fanin.fetch_sub(1, AcqRel) == 1 {
                if self.push_ready(consumer) {
                    readied += 1;
                } else {
                    unqueued += 1;
                }
            }
        }
        for at in slot.dep_start.load(Relaxed)..slot.dep_end.load(Relaxed) {
            self.release(ring.dep(at).producer.load(Relaxed));
        }
        // The task's own reference goes before it is counted: an orchestration that sees every
        // submitted task counted must find each one's references released, or it would take the
        // map entries of a task about to retire for entries nothing will free (a false
        // TENSORMAP_OVERFLOW).
        self.release(id);
        #[cfg(test)]
        tests::between_release_and_count();
        // Release (inside the watch): the owner that counts this completion sees its effects.
        let wake_owner = self.completed.advance();
        Completion { readied, wake_owner, unqueued }
    }
}

/// A ring's owner-side state during a run.
struct Ring<'a> {
    window: TaskWindowCore<'a>,
    heap: HeapRingCore<FixedRecords<'a>>,
    /// Per slot, the heap records it owns (`[first, end)` sequence numbers).
    heap_seq: &'a mut [[u64; 2]],
    /// Per slot, [`SCOPE_HELD`] and [`HOLDER`].
    flags: &'a mut [u8],
    dep_head: u64,
    dep_tail: u64,
    sizes: RingSizes,
    peak_tasks: u32,
    peak_deps: u64,
}

/// Whether the map may forget `owner`: its slot was retired (or already reclaimed).
fn is_retired(rings: &[Ring<'_>], owner: u64) -> bool {
    rings.get(ring_of(owner)).is_none_or(|r| {
        let local = owner as u32;
        !r.window.is_live(local) || r.window.is_retired(local)
    })
}

/// Why a submit naming a buffer whose scope ended is refused.
const USED_AFTER_SCOPE: &str =
    "a buffer from alloc_tensors is used after the scope that allocated it ended";

/// Whether `id` names a live slot whose scope is still open, so that it cannot retire before
/// the owner closes that scope.
fn scope_holds(rings: &[Ring<'_>], id: u64) -> bool {
    rings.get(ring_of(id)).is_some_and(|r| {
        let local = id as u32;
        r.window.is_live(local) && r.flags[r.window.slot_of(local)] & SCOPE_HELD != 0
    })
}

/// Whether `id` names a live buffer holder (which no task needs to wait for).
fn is_holder(rings: &[Ring<'_>], id: u64) -> bool {
    rings.get(ring_of(id)).is_some_and(|r| {
        let local = id as u32;
        r.window.is_live(local) && r.flags[r.window.slot_of(local)] & HOLDER != 0
    })
}

/// Whether `owner`'s slot was reclaimed: the window's tail passed it. A test of the owner's own
/// window counters, with no load of a slot word the completers write; inserts prune by it
/// (see `submit_with`), lookups by [`is_retired`].
fn is_reclaimed(rings: &[Ring<'_>], owner: u64) -> bool {
    rings.get(ring_of(owner)).is_none_or(|r| !r.window.is_live(owner as u32))
}

/// Why a submit did not happen; nothing changed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum SubmitRefusal {
    /// Room will come when running tasks complete: complete some and retry.
    Wait,
    /// Room can never come.
    Stall(RingStall),
    /// The submit itself is malformed (a slab larger than the heap, scopes nested too deep, a
    /// buffer used after the scope that allocated it ended).
    Invalid(&'static str),
    /// The task was submitted and is ready, but the ready queue refused it, so it can never run
    /// and the run must fail (the queue's sizing rules it out).
    Unqueued(DeviceTaskId),
    /// The task was submitted but the tensor map refused to record one of its accesses (the
    /// room check before the commit rules it out), so later tasks would miss its edges and the
    /// run must fail.
    Unrecorded {
        /// The task.
        id: DeviceTaskId,
        /// The buffer of the access.
        key: u64,
        /// The map's refusal.
        error: FixedMapError,
    },
}

/// A submitted task.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Submitted {
    /// Its id.
    pub(crate) id: DeviceTaskId,
    /// Offset of its output slab in its ring's heap (`None` when it asked for no bytes).
    pub(crate) heap_offset: Option<u64>,
    /// It was ready at once and a scheduler thread may be parked for want of work: wake them.
    pub(crate) wake_schedulers: bool,
}

/// A buffer placed by [`Engine::alloc`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Allocated {
    /// The ring whose heap holds it.
    pub(crate) ring: usize,
    /// Its offset in that heap.
    pub(crate) offset: u64,
    /// Its holder: the slot of the allocating scope that keeps it, which a task using the
    /// buffer names in `keep`.
    pub(crate) owner: DeviceTaskId,
}

/// One open scope.
#[derive(Clone, Copy, Debug)]
struct Scope {
    /// The ring its tasks go to.
    ring: u8,
    /// The first local id it issued there.
    first: u32,
    /// Its newest buffer holder, if any (`buffers`).
    holder: Option<u64>,
}

/// How [`Engine::new`] made its arena's sections ready.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ArenaReset {
    /// Every section, whatever it held.
    Full,
    /// Only what the clean previous run over the same allocation used.
    Partial,
}

/// The orchestration side of the state machine over one arena.
pub(crate) struct Engine<'a> {
    reuse: &'a mut ReuseRecord,
    reset: ArenaReset,
    rings: [Ring<'a>; HEAP_RING_COUNT],
    shared: Completer<'a>,
    map: FixedTensorMap<'a, u64>,
    /// The open scopes, the outer one first.
    scopes: [Scope; MAX_SCOPE_DEPTH],
    /// Open scopes; 0 once the outer scope closed.
    open: usize,
    submitted: u64,
    /// Buffer holders issued.
    holders: u64,
    producers: [u64; MAX_FANIN],
    /// How many of `producers` the last submit's lookups found (the rest are slab holders).
    linked: usize,
    finished: producers::Finished,
    untracked: copy_waits::Untracked,
}

impl<'a> Engine<'a> {
    /// An empty engine over `storage`, with the outer scope open. Resets every section a run
    /// reads before it writes (slot words, ready queue, completion counter, tensor map), so the
    /// storage may hold anything before, including the leftovers of an abandoned run.
    ///
    /// With `kept` (the allocation is the one the previous run of its resource slot used, and
    /// nothing else wrote it since) and a clean reuse record of the same shape, only what that
    /// run used is reset; the result is the same.
    pub(crate) fn new(storage: Storage<'a>, kept: bool) -> Engine<'a> {
        let Storage { sizes, reuse, rings: stores, map_entries, map_buckets, shared: parts } =
            storage;
        let left = reuse.take(&sizes, map_entries.len(), map_buckets.len()).filter(|_| kept);
        // A partial reset rewrites the window words the previous run's slots took (each task and
        // each buffer holder took one); the ready queue resets the cells its pushes took.
        let used = left.map_or(usize::MAX, |l| usize::try_from(l.issued).unwrap_or(usize::MAX));
        CountWatch::new(parts.completed, parts.owner_wake_at).reset();
        Idlers::new(parts.idle_schedulers).reset();
        let mut stores = stores.into_iter();
        let rings = sizes.map(|s| {
            let st = stores.next().expect("one store per ring");
            Ring {
                window: TaskWindowCore::reuse(st.words, used).expect("power-of-two window"),
                heap: HeapRingCore::new(s.heap_bytes, FixedRecords::new(st.records))
                    .expect("aligned heap"),
                heap_seq: st.heap_seq,
                flags: st.flags,
                dep_head: 0,
                dep_tail: 0,
                sizes: s,
                peak_tasks: 0,
                peak_deps: 0,
            }
        });
        // Resets the queue's cells and cursors before any completer attaches.
        let map = match left {
            Some(l) => {
                ReadyRing::reuse(parts.ready, parts.ready_head, parts.ready_tail);
                FixedTensorMap::reuse(map_entries, map_buckets, l.map_handed_out)
            }
            None => {
                ReadyRing::new(parts.ready, parts.ready_head, parts.ready_tail);
                FixedTensorMap::new(map_entries, map_buckets)
            }
        };
        Engine {
            reuse,
            reset: if left.is_some() { ArenaReset::Partial } else { ArenaReset::Full },
            rings,
            shared: Completer::attach(parts),
            map: map.expect("power-of-two buckets, a checked hand-out count"),
            scopes: [Scope { ring: 0, first: 0, holder: None }; MAX_SCOPE_DEPTH],
            open: 1,
            submitted: 0,
            holders: 0,
            producers: [0; MAX_FANIN],
            linked: 0,
            finished: producers::Finished::new(),
            untracked: copy_waits::Untracked::new(),
        }
    }

    /// How the engine made its arena ready.
    pub(crate) fn arena_reset(&self) -> ArenaReset {
        self.reset
    }

    /// Records in the arena's reuse record what this run used, so that the next run over the
    /// same allocation resets only that; `false` (and a record asking for a full reset) unless
    /// the orchestration finished and every submitted task completed. Call it last: after
    /// every completion, nothing but a late slot retire (inside the recorded extents) touches
    /// the arena again during the launch.
    pub(crate) fn end_clean(&mut self) -> bool {
        if self.open != 0 || self.incomplete() != 0 {
            return false;
        }
        let issued = self.submitted + self.holders;
        let left = Leftovers { issued, map_handed_out: self.map.handed_out() };
        let sizes = self.rings.each_ref().map(|r| r.sizes);
        self.reuse.put(&sizes, self.map.capacity() as usize, self.map.bucket_count(), left);
        true
    }

    /// The handle scheduler threads complete tasks through.
    #[cfg(test)]
    pub(crate) fn completer(&self) -> Completer<'a> {
        self.shared
    }

    /// The ring tasks submitted now go to: `min(depth, 3)`, the outer scope being depth 0.
    fn current_ring(&self) -> usize {
        (self.open - 1).min(HEAP_RING_COUNT - 1)
    }

    /// Opens a scope.
    pub(crate) fn scope_begin(&mut self) -> Result<(), SubmitRefusal> {
        if self.open == 0 {
            return Err(SubmitRefusal::Invalid("the orchestration already finished"));
        }
        if self.open == MAX_SCOPE_DEPTH {
            return Err(SubmitRefusal::Invalid("scopes nested too deep"));
        }
        self.open += 1;
        let r = self.current_ring();
        let first = self.rings[r].window.head();
        self.scopes[self.open - 1] = Scope { ring: r as u8, first, holder: None };
        Ok(())
    }

    /// Closes the innermost scope: its tasks lose their scope reference.
    pub(crate) fn scope_end(&mut self) -> Result<(), SubmitRefusal> {
        if self.open <= 1 {
            return Err(SubmitRefusal::Invalid("scope end without a scope"));
        }
        self.close_scope();
        Ok(())
    }

    /// Closes the outer scope: the orchestration is done and submits nothing more.
    pub(crate) fn finish(&mut self) -> Result<(), SubmitRefusal> {
        while self.open > 1 {
            self.close_scope();
        }
        if self.open == 0 {
            return Err(SubmitRefusal::Invalid("the orchestration already finished"));
        }
        self.close_scope();
        Ok(())
    }

    fn close_scope(&mut self) {
        let Scope { ring: r, first, .. } = self.scopes[self.open - 1];
        self.open -= 1;
        let r = r as usize;
        let mut local = first;
        while local != self.rings[r].window.head() {
            let ring = &mut self.rings[r];
            // Ids a nested scope of the same ring released, or reclaimed ones, are skipped.
            let at = ring.window.slot_of(local);
            if ring.window.is_live(local) && ring.flags[at] & SCOPE_HELD != 0 {
                ring.flags[at] &= !SCOPE_HELD;
                self.shared.release(DeviceTaskId::new(r as u8, local).0);
            }
            local = local.wrapping_add(1);
        }
        self.reclaim(r);
    }

    /// Submits a task with `accesses` and an output slab of `heap_bytes` (rounded up to the
    /// heap alignment; 0 = none). Nothing changes when it is refused.
    #[cfg(test)]
    pub(crate) fn submit(
        &mut self,
        accesses: &[Access],
        heap_bytes: u64,
    ) -> Result<Submitted, SubmitRefusal> {
        self.submit_with(accesses, heap_bytes, &[], &[], |_| {})
    }

    /// [`submit`](Self::submit), also holding the slots of `keep` (the holders of the buffers
    /// the task uses, or the tasks whose slabs they are) until the task completes, without
    /// waiting for them, and calling `fill` with the task's id once its slot is taken and before
    /// any completer can see the task (the orchestration writes the task's dispatch record
    /// there). A `keep` entry whose scope ended means a buffer outlived the scope that allocated
    /// it, and the submit is refused as invalid. The task also waits for each task of
    /// `creators` (the creators of its `manual_dep` tensors, which the tensor map does not
    /// track) that has not retired; a buffer holder named as a creator runs nothing and is
    /// ignored.
    pub(crate) fn submit_with(
        &mut self,
        accesses: &[Access],
        heap_bytes: u64,
        keep: &[u64],
        creators: &[u64],
        fill: impl FnOnce(DeviceTaskId),
    ) -> Result<Submitted, SubmitRefusal> {
        if self.open == 0 {
            return Err(SubmitRefusal::Invalid("the orchestration already finished"));
        }
        let r = self.current_ring();
        let aligned = match heap_bytes.checked_next_multiple_of(HEAP_ALIGN) {
            Some(a) if a <= self.rings[r].sizes.heap_bytes => a,
            _ => return Err(SubmitRefusal::Invalid("output slab larger than the ring's heap")),
        };
        self.reclaim(r);
        let ring = &self.rings[r];
        if ring.window.live() == ring.window.capacity() {
            return Err(self.refuse(r, StallKind::Scope, 1));
        }
        let placement = match aligned {
            0 => None,
            _ => match ring.heap.try_place(aligned) {
                Some(p) => Some(p),
                None => return Err(self.refuse(r, StallKind::Heap, aligned)),
            },
        };
        // Producers: every lookup before any insert, so a task never finds itself.
        let mut count = 0usize;
        let mut overflow = false;
        {
            let (rings, shared, finished) = (&self.rings, self.shared, &mut self.finished);
            finished.clear();
            let producers = &mut self.producers;
            for a in accesses {
                // A blind write only orders after the accesses it finds (nothing flows from
                // them into it), so one that already completed needs no edge; the buffer it
                // writes, if a task's slab, is held through `keep`. An in-place update needs
                // none to a finished reader either (it reads nothing the reader made). Left
                // out, thousands of finished readers held by an open scope do not count toward
                // `MAX_FANIN`.
                let blind = matches!(a.mode, AccessMode::Write | AccessMode::ScatterWrite);
                let moot = |o, role| {
                    if is_retired(rings, o) {
                        return true;
                    }
                    let done = (blind || role == Role::Reader) && shared.has_completed(o);
                    if done {
                        finished.note(o);
                    }
                    done
                };
                self.map.lookup_by_role(&a.key, a.span, a.mode, moot, |o| {
                    if producers[..count].contains(&o) {
                        return;
                    }
                    if count == MAX_FANIN {
                        overflow = true;
                    } else {
                        producers[count] = o;
                        count += 1;
                    }
                });
            }
        }
        for &c in creators {
            // A retired creator needs no edge; the task's own id (not yet issued) counts as one.
            // A holder (the owner an allocated buffer's descriptor names) runs nothing.
            let rings = &self.rings;
            if self.producers[..count].contains(&c) || is_retired(rings, c) || is_holder(rings, c) {
                continue;
            }
            if count == MAX_FANIN {
                overflow = true;
            } else {
                self.producers[count] = c;
                count += 1;
            }
        }
        // Producers below `linked` are waited for; the holders after them only kept.
        let linked = count;
        for &h in keep {
            // Its scope holds it until the owner closes that scope: no completion can consume
            // it during this submit.
            if !scope_holds(&self.rings, h) {
                return Err(SubmitRefusal::Invalid(USED_AFTER_SCOPE));
            }
            if self.producers[..count].contains(&h) {
                continue;
            }
            if count == MAX_FANIN {
                overflow = true;
            } else {
                self.producers[count] = h;
                count += 1;
            }
        }
        if overflow {
            const _: () = assert!(MAX_FANIN == 256, "the message below names the limit");
            return Err(SubmitRefusal::Invalid(
                "more distinct producers than the 256 one task may wait on",
            ));
        }
        let ring = &self.rings[r];
        if ring.dep_head - ring.dep_tail + count as u64 > u64::from(ring.sizes.dep_pool) {
            return Err(self.refuse(r, StallKind::DepPool, count as u64));
        }
        // Tensor-map room first, so that no insert below can fail. Short of a slot per access,
        // a write that replaces an entry it covers needs none of its own.
        let needed = accesses.iter().filter(|a| !a.span.is_empty()).count() as u32;
        if self.map.capacity() - self.map.len() < needed {
            let rings = &self.rings;
            self.map.prune_retired(|o| is_retired(rings, o));
            let vacant_needed = self.map.slots_needed(
                accesses,
                |a| (a.key, a.span, a.mode),
                |o| is_retired(rings, o),
            );
            // The stall names one entry per access, as without the figure: a task with more
            // accesses than the map holds still stalls at once.
            if self.map.capacity() - self.map.len() < vacant_needed {
                return Err(self.refuse(r, StallKind::Tensormap, u64::from(needed)));
            }
        }
        let (count, linked) = self.acquire_producers(count, linked, keep)?;
        // Commit. The slot is not visible to completers until it is linked into a producer's
        // fanout list (under that producer's lock) or pushed to the ready queue (release).
        let ring = &mut self.rings[r];
        let id = DeviceTaskId::new(r as u8, ring.window.head()).0;
        // The slab's record first: the only step that can still fail, before anything changed
        // but the references just taken.
        let grant = match placement {
            None => None,
            Some(p) => match ring.heap.push_record(p, id) {
                Some(g) => Some(g),
                // The placement fit: what is missing is a record.
                None => {
                    self.release_producers(count);
                    return Err(self.refuse(r, StallKind::HeapRecords, 1));
                }
            },
        };
        self.linked = linked;
        self.finished.drop_wired(&self.producers[..linked]);
        let ring = &mut self.rings[r];
        let local = ring.window.try_issue().expect("room checked above");
        let at = ring.window.slot_of(local);
        ring.heap_seq[at] = grant.map_or([0, 0], |g| [g.seq, g.seq + 1]);
        ring.flags[at] = SCOPE_HELD;
        let dep_start = ring.dep_head;
        let shared = self.shared;
        let slot = shared.rings[r].slot(local);
        // The lock word too: storage may come from a run abandoned inside a critical section.
        slot.lock.store(0, Relaxed);
        slot.completed.store(0, Relaxed);
        slot.fanout_head.store(NIL, Relaxed);
        // One guard against becoming ready while linking; one until completion, one for the scope.
        slot.fanin.store(1, Relaxed);
        slot.refs.store(2, Relaxed);
        slot.dep_start.store(dep_start, Relaxed);
        for (k, &p) in self.producers[..count].iter().enumerate() {
            let entry_at = dep_start + k as u64;
            let entry = shared.rings[r].dep(entry_at);
            entry.producer.store(p, Relaxed);
            entry.consumer.store(id, Relaxed);
            let link = ((r as u64) << 32) | (entry_at % u64::from(ring.sizes.dep_pool));
            let ps = shared.rings[ring_of(p)].slot(p as u32);
            ps.locked(|| {
                if k < linked && ps.completed.load(Relaxed) == 0 {
                    entry.next.store(ps.fanout_head.load(Relaxed), Relaxed);
                    ps.fanout_head.store(link, Relaxed);
                    slot.fanin.fetch_add(1, Relaxed);
                }
            });
        }
        slot.dep_end.store(dep_start + count as u64, Relaxed);
        ring.dep_head += count as u64;
        ring.peak_tasks = ring.peak_tasks.max(ring.window.live());
        ring.peak_deps = ring.peak_deps.max(ring.dep_head - ring.dep_tail);
        for a in accesses {
            let rings = &self.rings;
            // An insert prunes what it passes in its key's chain. It prunes only reclaimed
            // owners: testing every entry for retirement loads a slot word the completers
            // write, once per entry per insert, which dominated the map's cost for a buffer
            // written slice by slice (all its entries share one chain). Entries of tasks retired
            // but not yet reclaimed stay until the tail passes them; lookups skip them, and one
            // a write covers hands its write-ordering duty on, an edge to a live task at most.
            // Room was checked above, so a refusal is a broken invariant: the task is linked
            // and cannot be taken back, and later tasks would miss its edges, so the run fails.
            // A blind write that supersedes a writer it does not order after leaves no entry
            // naming that writer, which may still run: the orchestration's copies of the bytes
            // wait for it as for an untracked access.
            let (shared, untracked) = (self.shared, &mut self.untracked);
            let inserted = self.map.insert_noting(
                a.key,
                a.span,
                a.mode,
                id,
                |o| is_reclaimed(rings, o),
                |o| {
                    // One that completed left its bytes visible to whoever sees its flag.
                    if !shared.has_completed(o) {
                        untracked.note(o, a.span, rings, &shared);
                    }
                },
            );
            if let Err(e) = inserted {
                return Err(SubmitRefusal::Unrecorded {
                    id: DeviceTaskId(id),
                    key: a.key,
                    error: e,
                });
            }
        }
        self.submitted += 1;
        fill(DeviceTaskId(id));
        // Drop the guard; with no producer pending the task is ready now.
        let ready = slot.fanin.fetch_sub(1, AcqRel) == 1;
        if ready && !shared.push_ready(id) {
            return Err(SubmitRefusal::Unqueued(DeviceTaskId(id)));
        }
        Ok(Submitted {
            id: DeviceTaskId(id),
            heap_offset: grant.map(|g| g.offset),
            wake_schedulers: ready && shared.idle_besides(false),
        })
    }

    /// Tasks submitted so far.
    pub(crate) fn submitted(&self) -> u64 {
        self.submitted
    }

    /// Classifies a submit that does not fit: a wait when completions can free room, a stall
    /// when the room is held by a scope still open (or by nothing that will complete).
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
            heap_records: u32::try_from(ring.heap.records().capacity()).unwrap_or(u32::MAX),
        };
        let can_free = match kind {
            // Map entries go when their owners are consumed; once nothing runs, none will be.
            StallKind::Tensormap => {
                self.incomplete() > 0 && needed <= u64::from(self.map.capacity())
            }
            StallKind::DepPool if needed > u64::from(ring.sizes.dep_pool) => false,
            // Room at the front of the ring frees once its oldest task is consumed, which
            // cannot happen while that task holds the reference of a scope still open.
            _ => {
                ring.window.live() > 0 && {
                    let oldest = ring.window.tail();
                    ring.flags[ring.window.slot_of(oldest)] & SCOPE_HELD == 0
                }
            }
        };
        if can_free { SubmitRefusal::Wait } else { SubmitRefusal::Stall(stall) }
    }

    /// Advances ring `r`'s window tail over retired slots, releasing their heap slabs and
    /// dependency entries in the same FIFO order.
    fn reclaim(&mut self, r: usize) {
        let ring = &mut self.rings[r];
        let shared = self.shared.rings[r];
        let first = ring.window.tail();
        let freed = ring.window.reclaim();
        // The reclaimed slots keep their owner-side and shared fields until they are reissued.
        for local in (0..freed).map(|i| first.wrapping_add(i)) {
            let at = ring.window.slot_of(local);
            let [first, end] = ring.heap_seq[at];
            for seq in first..end {
                ring.heap.mark_released(seq);
            }
            ring.heap_seq[at] = [0, 0];
            ring.dep_tail = shared.slot(local).dep_end.load(Relaxed);
        }
    }

    /// Tasks submitted and not yet completed.
    pub(crate) fn incomplete(&self) -> u64 {
        // Acquire (inside the watch): pairs with the completers' release increments.
        self.submitted - self.shared.completed.count()
    }

    /// The completion count `more` further completions from now, at most every submitted task
    /// (so a wait for it always ends once the submitted tasks run).
    pub(crate) fn completion_target(&self, more: u64) -> u64 {
        let done = self.shared.completed.count();
        done + more.max(1).min(self.submitted.saturating_sub(done))
    }

    /// Asks to be woken once the completion count reaches `target`: the completion that brings
    /// it there reports [`Completion::wake_owner`]. Returns `true` when it is there already (the
    /// caller must not park then). Read the platform's wait epoch before calling, so that a
    /// wake-up right after the call still ends the park.
    pub(crate) fn arm_completions(&self, target: u64) -> bool {
        self.shared.completed.arm(target)
    }

    /// Unreclaimed task slots of ring `r` and their high-water mark.
    pub(crate) fn ring_tasks(&mut self, r: usize) -> (u32, u32) {
        self.reclaim(r);
        (self.rings[r].window.live(), self.rings[r].peak_tasks)
    }

    /// Occupied heap bytes of ring `r` and their high-water mark.
    pub(crate) fn ring_heap(&mut self, r: usize) -> (u64, u64) {
        self.reclaim(r);
        (self.rings[r].heap.occupied_bytes(), self.rings[r].heap.peak_occupied_bytes())
    }

    /// Unreclaimed dependency entries of ring `r` and their high-water mark.
    pub(crate) fn ring_deps(&mut self, r: usize) -> (u64, u64) {
        self.reclaim(r);
        let ring = &self.rings[r];
        (ring.dep_head - ring.dep_tail, ring.peak_deps)
    }

    /// Live tensor-map entries and their high-water mark.
    pub(crate) fn map_entries(&self) -> (u32, u32) {
        (self.map.len(), self.map.peak_len())
    }
}

#[cfg(test)]
mod tests;
