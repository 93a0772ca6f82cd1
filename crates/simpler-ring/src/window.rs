//! The task window: generation-tagged entries, recycled through a LIFO free list.
//!
//! Entries live in a `boxcar::Vec`, an append-only chunked vector: an entry's address never
//! changes and its memory is freed only when the window is dropped, so `slot(id)` hands out
//! `&S` without a lock.
//!
//! Each entry has one state word, `generation << 1 | live`. Protocol:
//!
//! 1. **Reserve** (under the window lock): if the window is capped and full, wait on the window's
//!    condition variable (or give up at the deadline or on shutdown). Otherwise count the entry
//!    as live and pop the most recently freed index, or — with the lock dropped — append a new
//!    entry whose word is `1 << 1` (generation 1, not live). The reserved entry is not live, so
//!    no id can reach it yet.
//! 2. **Publish**: write the entry's heap stamp (relaxed), then store `generation << 1 | 1` with
//!    release ordering. From here `slot(id)` is `Some` and `release(id)` may win.
//! 3. **Cancel** (instead of 2, when the heap step fails): push the index back and uncount it;
//!    the entry's word never changed, so the failed allocation leaves no trace.
//! 4. **Release**: compare-and-swap the word from `g << 1 | 1` to `(g + 1) << 1` (or to
//!    `0`, a generation no entry ever carries, when `g == u32::MAX`: the entry is retired).
//!    Exactly one caller wins; losers and stale ids change nothing. The winner reads the heap stamp, frees the slab, then
//!    5. pushes the index on the free list (unless retired), uncounts it and wakes one window
//!    waiter. A batch of releases (`Ring::release_batch`) does step 5 for up to
//!    `RELEASE_BATCH` entries under one lock acquisition, waking every waiter when more than one
//!    returns; until then its released entries are not live for any id but still counted live,
//!    as between steps 4 and 5 of a single release.
//!
//! An id with the current generation of a *free* entry is never live, because its live bit is
//! clear; forged ids cannot resurrect a free entry.

use simpler_types::{HEAP_RING_COUNT, RingIndex, SlotId};

use crate::error::RingError;
use crate::patience::Patience;
use crate::stats::WindowStats;
use crate::sync::{AtomicBool, AtomicU64, Condvar, Mutex, Ordering, wait_for};

/// Heap stamp meaning "no slab".
const NO_HEAP: u64 = 0;

/// One task-window entry.
#[derive(Debug)]
struct Entry<S> {
    /// `generation << 1 | live`.
    /// Writers: the allocator that reserved the entry (publish, step 2) and the release winner
    /// (step 4). Readers: `slot`, `is_live`, `generation` and every releaser.
    state: AtomicU64,
    /// The slab this entry owns: `NO_HEAP`, or `seq << 3 | 4 | ring`.
    /// Writer: the allocator, before publishing. Reader: the release winner, after its CAS.
    heap: AtomicU64,
    payload: S,
}

/// Window counters and the free list, under the window lock.
#[derive(Debug, Default)]
struct WindowState {
    free: Vec<u32>,
    /// Reserved or published entries (reservations in flight included, so the cap holds).
    live: u32,
    peak_live: u32,
    /// Counts resets of `peak_live`: a reservation's own `live` only counts toward the peak it
    /// was taken under.
    peak_epoch: u64,
    total_allocs: u64,
    waits: u64,
    timeouts: u64,
}

/// An entry taken in step 1, to be published or cancelled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reservation {
    pub(crate) slot: SlotId,
    /// `live` right after this reservation counted itself: the peak it reached, which the
    /// publish folds in (a later publish may see fewer live entries) unless the peaks were
    /// reset in between.
    live: u32,
    /// `peak_epoch` when it was taken.
    epoch: u64,
}

/// What a winning release learned from the entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Released {
    /// The slab to free, if the entry owned one.
    pub(crate) heap: Option<(RingIndex, u64)>,
    /// The entry's generation is exhausted; it must not be reused.
    pub(crate) retire: bool,
}

/// The task window of a [`Ring`](crate::Ring).
#[derive(Debug)]
pub(crate) struct Window<S> {
    entries: boxcar::Vec<Entry<S>>,
    state: Mutex<WindowState>,
    /// Waiters for a free slot in a capped window.
    cond: Condvar,
    limit: Option<u32>,
}

/// The word of a retired entry: generation 0, which no id carries (generations start at 1 and
/// end at `u32::MAX`), so no id is live in it and it has no current generation.
const RETIRED: u64 = 0;

fn live_word(generation: u32) -> u64 {
    (u64::from(generation) << 1) | 1
}

fn pack_heap(ring: RingIndex, seq: u64) -> u64 {
    (seq << 3) | 4 | u64::from(ring.get())
}

fn unpack_heap(stamp: u64) -> Option<(RingIndex, u64)> {
    if stamp & 4 == 0 {
        return None;
    }
    // The low two bits came from a valid `RingIndex`, so `new` cannot fail.
    RingIndex::new((stamp & 3) as u8).map(|ring| (ring, stamp >> 3))
}

/// One reservation counted live (and, `committed`, as an allocation), given back if dropped
/// (by an unwind) before it is issued.
struct Counted<'a, S: Default> {
    window: &'a Window<S>,
    committed: bool,
}

impl<S: Default> Drop for Counted<'_, S> {
    fn drop(&mut self) {
        if self.committed {
            let mut state = self.window.state.lock();
            state.total_allocs = state.total_allocs.saturating_sub(1);
        }
        self.window.free_indices(&[], 1);
    }
}

impl<S: Default> Window<S> {
    pub(crate) fn new(limit: Option<u32>) -> Self {
        Window {
            entries: boxcar::Vec::new(),
            state: Mutex::new(WindowState::default()),
            cond: Condvar::new(),
            limit,
        }
    }

    /// Step 1. With `commit`, the allocation cannot fail later, so its counters are updated
    /// here under the same lock acquisition.
    pub(crate) fn reserve(
        &self,
        patience: &mut Patience,
        shutdown: &AtomicBool,
        commit: bool,
    ) -> Result<Reservation, RingError> {
        let limit = self.limit.unwrap_or(u32::MAX);
        let mut state = self.state.lock();
        let mut waited_here = false;
        loop {
            // Acquire pairs with the release store in `Ring::shutdown`; the window lock already
            // orders it, the ordering only documents the pairing.
            if shutdown.load(Ordering::Acquire) {
                return Err(RingError::Shutdown);
            }
            if state.live < limit && (state.free.last().is_some() || self.can_append()) {
                break;
            }
            let Some(deadline) = patience.next_wait() else {
                state.timeouts += u64::from(patience.counts_refusal);
                return Err(RingError::TaskWindowExhausted {
                    limit,
                    live: state.live,
                    waited: patience.waited,
                });
            };
            if !waited_here {
                waited_here = true;
                state.waits += 1;
            }
            let started = std::time::Instant::now();
            state = wait_for(&self.cond, state, deadline);
            patience.waited += started.elapsed();
        }
        state.live += 1;
        let (live, epoch) = (state.live, state.peak_epoch);
        if commit {
            state.peak_live = state.peak_live.max(live);
            state.total_allocs += 1;
        }
        let reused = state.free.pop();
        drop(state);
        let index = match reused {
            Some(index) => index,
            None => {
                // A payload whose `Default` panics issued nothing: the count goes back.
                let counted = Counted { window: self, committed: commit };
                let index = self.entries.push(Entry {
                    state: AtomicU64::new(u64::from(1u32) << 1),
                    heap: AtomicU64::new(NO_HEAP),
                    payload: S::default(),
                });
                std::mem::forget(counted);
                // `can_append` checked the count under the lock, and appends happen only after
                // that check, so the index fits unless more than `u32::MAX` appends raced past
                // it, which the live cap of `u32::MAX` rules out.
                u32::try_from(index).unwrap_or(u32::MAX)
            }
        };
        let generation = self.generation(index).unwrap_or(1);
        Ok(Reservation { slot: SlotId::new(index, generation), live, epoch })
    }

    /// `true` while the table has room for another `u32`-indexed entry.
    fn can_append(&self) -> bool {
        self.entries.count() < u32::MAX as usize
    }

    /// Step 2. `committed` says whether `reserve` already updated the counters.
    pub(crate) fn publish(&self, r: Reservation, heap: Option<(RingIndex, u64)>, committed: bool) {
        if !committed {
            let mut state = self.state.lock();
            let reserved = if r.epoch == state.peak_epoch { r.live } else { 0 };
            state.peak_live = state.peak_live.max(state.live).max(reserved);
            state.total_allocs += 1;
        }
        let Some(entry) = self.entries.get(r.slot.index as usize) else {
            debug_assert!(false, "reserved entry {} is not materialized", r.slot);
            return;
        };
        let stamp = heap.map_or(NO_HEAP, |(ring, seq)| pack_heap(ring, seq));
        // Relaxed suffices: the release store below publishes it to whoever wins the CAS.
        entry.heap.store(stamp, Ordering::Relaxed);
        // Release: a thread that observes the entry live also observes the heap stamp.
        entry.state.store(live_word(r.slot.generation), Ordering::Release);
    }

    /// Step 3.
    pub(crate) fn cancel(&self, r: Reservation) {
        self.free_indices(&[r.slot.index], 0);
    }

    /// Step 4: the generation CAS. `None` if `id` is stale, never issued, or already released.
    pub(crate) fn begin_release(&self, id: SlotId) -> Option<Released> {
        let entry = self.entries.get(id.index as usize)?;
        let retire = id.generation == u32::MAX;
        let next = if retire { RETIRED } else { u64::from(id.generation + 1) << 1 };
        // AcqRel on success: acquire the publisher's heap stamp; release so that a later reader
        // of the new generation also sees everything this releaser did before. Failure needs
        // nothing: a loser returns without reading anything.
        entry
            .state
            .compare_exchange(live_word(id.generation), next, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        // Relaxed suffices: the successful acquire CAS above synchronizes with the publish.
        let heap = unpack_heap(entry.heap.load(Ordering::Relaxed));
        Some(Released { heap, retire })
    }

    /// Step 5 for several releases at once: `freed` go back on the free list, and `retired`
    /// more entries (which never return) stop counting as live, in one lock acquisition.
    pub(crate) fn free_indices(&self, freed: &[u32], retired: u32) {
        let released = freed.len() as u32 + retired;
        if released == 0 {
            return;
        }
        let mut state = self.state.lock();
        state.free.extend_from_slice(freed);
        state.live = state.live.saturating_sub(released);
        drop(state);
        if self.limit.is_some() {
            if released == 1 {
                self.cond.notify_one();
            } else {
                self.cond.notify_all();
            }
        }
    }

    fn entry(&self, index: u32) -> Option<&Entry<S>> {
        self.entries.get(index as usize)
    }

    pub(crate) fn payload(&self, index: u32) -> Option<&S> {
        self.entry(index).map(|e| &e.payload)
    }

    pub(crate) fn live_payload(&self, id: SlotId) -> Option<&S> {
        let entry = self.entry(id.index)?;
        // Acquire: pairs with the publish store, so the caller sees the entry as published.
        (entry.state.load(Ordering::Acquire) == live_word(id.generation)).then_some(&entry.payload)
    }

    pub(crate) fn generation(&self, index: u32) -> Option<u32> {
        // Acquire for the same reason as `live_payload`; the word is read on its own.
        let word = self.entry(index)?.state.load(Ordering::Acquire);
        (word != RETIRED).then_some((word >> 1) as u32)
    }

    /// Zeroes the live peak and runs `then` (the heaps' reset) before anyone can reserve again,
    /// if nothing is live; otherwise returns the live count.
    pub(crate) fn reset_if_quiescent(&self, then: impl FnOnce()) -> Result<(), u32> {
        let mut state = self.state.lock();
        if state.live > 0 {
            return Err(state.live);
        }
        state.peak_live = 0;
        state.peak_epoch += 1;
        then();
        Ok(())
    }

    pub(crate) fn reset_peaks(&self) {
        let mut state = self.state.lock();
        state.peak_live = state.live;
        state.peak_epoch += 1;
    }

    /// Wakes every window waiter; they observe the shutdown flag under the lock.
    pub(crate) fn wake_all(&self) {
        // Taking the lock orders this wake after any waiter's flag check: a waiter that saw the
        // flag clear has released the lock only by starting to wait.
        drop(self.state.lock());
        self.cond.notify_all();
    }

    pub(crate) fn stats(&self) -> WindowStats {
        let state = self.state.lock();
        WindowStats {
            live: state.live,
            peak_live: state.peak_live,
            capacity: u32::try_from(self.entries.count()).unwrap_or(u32::MAX),
            limit: self.limit,
            total_allocs: state.total_allocs,
            waits: state.waits,
            timeouts: state.timeouts,
        }
    }

    #[cfg(all(test, not(simpler_loom)))]
    pub(crate) fn force_generation(&self, index: u32, generation: u32, live: bool) {
        if let Some(e) = self.entry(index) {
            e.state.store((u64::from(generation) << 1) | u64::from(live), Ordering::SeqCst);
        }
    }
}

const _: () = assert!(HEAP_RING_COUNT <= 4, "heap stamps keep the ring index in two bits");
