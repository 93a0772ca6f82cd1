//! [`Ring`]: the task window plus four heap rings, with blocking allocation, exactly-once
//! release, reset, shutdown and statistics.
//!
//! # Allocation (`alloc`, `alloc_until`, `try_alloc`)
//!
//! 1. Shut down → `Shutdown`.
//! 2. `bytes > 0` with heaps disabled → `HeapDisabled` (immediately).
//! 3. `round_up(bytes, 1024)` overflows or exceeds the ring size → `RequestTooLarge`
//!    (immediately, whatever the ring's state).
//! 4. Reserve a window entry (window protocol step 1), waiting while a capped window is full.
//! 5. For `bytes > 0`, place the slab on ring `min(depth, 3)` (heap protocol in `heap.rs`),
//!    waiting for space. On failure, cancel the reservation, so the allocation leaves no trace
//!    except the `waits`/`timeouts` counters (and possibly one more materialized entry, which
//!    the next allocation reuses).
//! 6. Publish the entry with its heap stamp and return the [`Allocation`].
//!
//! # Release
//!
//! 1. Compare-and-swap the entry's generation (window step 4); a stale or repeated id returns
//!    `false` and changes nothing.
//! 2. If the entry owns a slab, release it on its ring (FIFO tail advance, rewind on drain, wake
//!    the ring's waiters if space appeared).
//! 3. Return the entry to the free list and wake one window waiter. A [`ReleaseBatch`] does
//!    this step for up to [`RELEASE_BATCH`] releases at once (waking every waiter when more than
//!    one entry returns), when that many are pending, flushed or dropped.
//!
//! # Shutdown
//!
//! 1. Set the shutdown flag (release store).
//! 2. For the window and each ring: take its lock, drop it, notify all waiters. A waiter checks
//!    the flag under that lock before every wait, so it either saw the flag or was already
//!    waiting when the notification came.
//! 3. Blocked and later allocations return `Shutdown`; `release` keeps working.
//!
//! # Lock order
//!
//! The crate has five locks: the window lock and one lock per heap ring. They are leaves: no call
//! holds two of them except `reset_to_empty`, which resets each heap under the window lock
//! (window before heap; nothing takes them the other way round), and none is held while
//! calling out of the crate. Callers must not hold their own locks across `alloc`, which may
//! block; `release` never blocks on anything but these two short leaf locks.

use std::fmt;
use std::time::Instant;

use simpler_types::{HEAP_ALIGN, HEAP_RING_COUNT, RingIndex, SlotId};

use crate::config::{HeapBacking, HeapRegion, RingConfig};
use crate::error::RingError;
use crate::heap::HeapRing;
use crate::patience::Patience;
use crate::stats::{HeapRingStats, RingStats};
use crate::sync::{AtomicBool, Ordering};
use crate::window::Window;

/// A successful allocation: the slot and, for `bytes > 0`, its heap slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Allocation {
    /// The task-window entry, live until released.
    pub slot: SlotId,
    /// The slab, or `None` for a slot-only allocation (`bytes == 0`).
    pub heap: Option<HeapSpan>,
}

/// One heap slab.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeapSpan {
    /// The ring holding the slab.
    pub ring: RingIndex,
    /// Per-ring sequence number (monotonic, never reset).
    pub seq: u64,
    /// Offset of the slab from the ring's base (a multiple of 1024).
    pub offset: u64,
    /// Aligned length: the request rounded up to 1024.
    pub len: u64,
    /// Bytes requested.
    pub requested: u64,
    /// Address of the slab: ring base + offset.
    pub addr: u64,
}

/// As derived, with the address in hex.
impl std::fmt::Debug for HeapSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapSpan")
            .field("ring", &self.ring)
            .field("seq", &self.seq)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("requested", &self.requested)
            .field("addr", &format_args!("{:#x}", self.addr))
            .finish()
    }
}

/// The task window and four heap rings of one engine.
///
/// `S` is the engine's per-slot payload; the ring creates it with `S::default()` when an entry is
/// first materialized and never touches it afterwards.
pub struct Ring<S> {
    window: Window<S>,
    /// `None` when heaps are disabled.
    heaps: Option<[HeapRing; HEAP_RING_COUNT]>,
    alloc_timeout: std::time::Duration,
    /// Writer: `shutdown` (once, false → true). Readers: every allocation, under the window or
    /// ring lock it is about to wait on, and `is_shutdown`.
    shutdown: AtomicBool,
}

impl<S> fmt::Debug for Ring<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("heaps", &self.heaps.as_ref().map(|h| h.each_ref().map(HeapRing::region)))
            .field("alloc_timeout", &self.alloc_timeout)
            // A diagnostic snapshot orders nothing: it publishes no data and no decision rests
            // on the value read, so `Relaxed` suffices.
            .field("shutdown", &self.shutdown.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Most released entries a [`ReleaseBatch`] holds: it returns them when this many are pending.
pub const RELEASE_BATCH: usize = 16;

/// Releases whose window entries go back to the free list together: each
/// [`release`](Self::release) frees the slot's generation and slab at once, as
/// [`Ring::release`] does, but the entries return under one window-lock acquisition, as soon as
/// [`RELEASE_BATCH`] are pending, on [`flush`](Self::flush) or on drop. Until then a released
/// entry is no longer live for its id, but it still counts as live in the statistics and
/// against a capped window, and it cannot be handed out.
///
/// For a thread that releases many slots in a row (a scope's end). It must not wait for window
/// space while it holds unreturned entries; nothing in this crate does.
pub struct ReleaseBatch<'a, S: Default + Send + Sync> {
    ring: &'a Ring<S>,
    freed: [u32; RELEASE_BATCH],
    len: usize,
    /// Released entries whose generations are exhausted: they only stop counting as live.
    retired: u32,
}

impl<S: Default + Send + Sync> ReleaseBatch<'_, S> {
    /// As [`Ring::release`]: `false` (and no change) for a stale, repeated or never-issued id.
    pub fn release(&mut self, slot: SlotId) -> bool {
        let Some(index) = self.ring.release_entry(slot) else {
            return false;
        };
        match index {
            Some(index) => {
                self.freed[self.len] = index;
                self.len += 1;
                if self.len == RELEASE_BATCH {
                    self.flush();
                }
            }
            None => self.retired += 1,
        }
        true
    }

    /// Returns every entry released so far to the window.
    pub fn flush(&mut self) {
        self.ring.window.free_indices(&self.freed[..self.len], self.retired);
        self.len = 0;
        self.retired = 0;
    }
}

impl<S: Default + Send + Sync> Drop for ReleaseBatch<'_, S> {
    fn drop(&mut self) {
        self.flush();
    }
}

impl<S: Default + Send + Sync> fmt::Debug for ReleaseBatch<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseBatch")
            .field("pending", &self.len)
            .field("retired", &self.retired)
            .finish_non_exhaustive()
    }
}

impl<S: Default + Send + Sync> Ring<S> {
    /// Validates `config` and builds the window and heaps (reserving anonymous mappings when
    /// asked to).
    pub fn new(config: RingConfig) -> Result<Self, RingError> {
        config.validate()?;
        let heaps = if config.heap_bytes_per_ring == 0 {
            None
        } else {
            let ring = |depth: usize| {
                let index = RingIndex::for_depth(depth);
                match &config.backing {
                    HeapBacking::Anonymous => {
                        HeapRing::map_anonymous(index, config.heap_bytes_per_ring)
                    }
                    HeapBacking::External(regions) => {
                        HeapRing::new(index, regions[index.as_usize()], None)
                    }
                }
            };
            // Depths 0..=3 select rings 0..=3, one each.
            const _: () = assert!(HEAP_RING_COUNT == 4);
            let [r0, r1, r2, r3] = [0, 1, 2, 3].map(ring);
            Some([r0?, r1?, r2?, r3?])
        };
        Ok(Ring {
            window: Window::new(config.max_live_slots),
            heaps,
            alloc_timeout: config.alloc_timeout,
            shutdown: AtomicBool::new(false),
        })
    }

    /// Allocates a slot and, for `bytes > 0`, a slab on ring `min(depth, 3)`, waiting up to the
    /// configured `alloc_timeout` (`Duration::ZERO`: not at all).
    ///
    /// `depth` is the scope depth below the run's outer frame.
    pub fn alloc(&self, bytes: u64, depth: usize) -> Result<Allocation, RingError> {
        self.alloc_with(bytes, depth, Patience::timeout(self.alloc_timeout))
    }

    /// As [`alloc`](Self::alloc), waiting until `deadline` (`None`: without limit).
    pub fn alloc_until(
        &self,
        bytes: u64,
        depth: usize,
        deadline: Option<Instant>,
    ) -> Result<Allocation, RingError> {
        self.alloc_with(bytes, depth, Patience::until(deadline))
    }

    /// As [`alloc`](Self::alloc), but never waits.
    pub fn try_alloc(&self, bytes: u64, depth: usize) -> Result<Allocation, RingError> {
        self.alloc_with(bytes, depth, Patience::never())
    }

    /// As [`try_alloc`](Self::try_alloc), but a refusal is not counted in the stats'
    /// `timeouts`: for a caller that follows a refusal with a waiting [`alloc`](Self::alloc),
    /// whose outcome is the one that counts.
    pub fn probe_alloc(&self, bytes: u64, depth: usize) -> Result<Allocation, RingError> {
        self.alloc_with(bytes, depth, Patience::probe())
    }

    fn alloc_with(
        &self,
        bytes: u64,
        depth: usize,
        mut patience: Patience,
    ) -> Result<Allocation, RingError> {
        // Relaxed: an early, advisory check; the authoritative one happens under the lock the
        // call would wait on.
        if self.shutdown.load(Ordering::Relaxed) {
            return Err(RingError::Shutdown);
        }
        let heap = if bytes == 0 {
            None
        } else {
            let heaps = self.heaps.as_ref().ok_or(RingError::HeapDisabled { requested: bytes })?;
            let ring = RingIndex::for_depth(depth);
            let heap = &heaps[ring.as_usize()];
            let aligned = bytes.checked_next_multiple_of(HEAP_ALIGN);
            match aligned {
                Some(aligned) if aligned <= heap.size() => Some((heap, aligned)),
                _ => {
                    return Err(RingError::RequestTooLarge {
                        ring,
                        requested: bytes,
                        aligned,
                        ring_size: heap.size(),
                    });
                }
            }
        };
        let reservation = self.window.reserve(&mut patience, &self.shutdown, heap.is_none())?;
        let Some((heap, aligned)) = heap else {
            self.window.publish(reservation, None, true);
            return Ok(Allocation { slot: reservation.slot, heap: None });
        };
        match heap.alloc(bytes, aligned, reservation.slot, &mut patience, &self.shutdown) {
            Ok(span) => {
                self.window.publish(reservation, Some((span.ring, span.seq)), false);
                Ok(Allocation { slot: reservation.slot, heap: Some(span) })
            }
            Err(error) => {
                self.window.cancel(reservation);
                Err(error)
            }
        }
    }

    /// Releases a live slot and its slab; `false` (and no change) for a stale, repeated or
    /// never-issued id. Exactly one of several concurrent releases of one id returns `true`.
    pub fn release(&self, slot: SlotId) -> bool {
        let Some(index) = self.release_entry(slot) else {
            return false;
        };
        match index {
            Some(index) => self.window.free_indices(&[index], 0),
            None => self.window.free_indices(&[], 1),
        }
        true
    }

    /// A batch of releases that return their window entries together (see [`ReleaseBatch`]).
    pub fn release_batch(&self) -> ReleaseBatch<'_, S> {
        ReleaseBatch { ring: self, freed: [0; RELEASE_BATCH], len: 0, retired: 0 }
    }

    /// Release steps 1 and 2: whether `slot` was live and is now released, and, if so, the
    /// entry's index unless its generations are exhausted.
    fn release_entry(&self, slot: SlotId) -> Option<Option<u32>> {
        let released = self.window.begin_release(slot)?;
        if let Some((ring, seq)) = released.heap {
            match &self.heaps {
                Some(heaps) => heaps[ring.as_usize()].release(seq),
                None => debug_assert!(false, "{slot} owns a slab while heaps are disabled"),
            }
        }
        Some((!released.retire).then_some(slot.index))
    }

    /// The payload of `id`, if `id` is live.
    pub fn slot(&self, id: SlotId) -> Option<&S> {
        self.window.live_payload(id)
    }

    /// The payload of entry `index`, live or not, without a generation check; callers re-check
    /// the generation under their own lock.
    pub fn entry(&self, index: u32) -> Option<&S> {
        self.window.payload(index)
    }

    /// The current generation of entry `index` (the generation its next or current id carries);
    /// `None` for an entry that does not exist or is retired (its last generation was used).
    pub fn generation(&self, index: u32) -> Option<u32> {
        self.window.generation(index)
    }

    /// `true` while `id` has been issued and not yet released.
    pub fn is_live(&self, id: SlotId) -> bool {
        self.window.live_payload(id).is_some()
    }

    /// The address region of heap `ring`; `None` when heaps are disabled.
    pub fn heap_region(&self, ring: RingIndex) -> Option<HeapRegion> {
        self.heaps.as_ref().map(|h| h[ring.as_usize()].region())
    }

    /// The heap ring whose region contains `addr`, if any.
    pub fn ring_of_addr(&self, addr: u64) -> Option<RingIndex> {
        let heaps = self.heaps.as_ref()?;
        RingIndex::all().find(|r| heaps[r.as_usize()].region().contains(addr))
    }

    /// Rewinds every ring and zeroes every peak, provided no slot is live; otherwise
    /// `NotQuiescent` and nothing changes. Ids issued before stay stale forever.
    pub fn reset_to_empty(&self) -> Result<(), RingError> {
        // Under the window lock, so that no allocation reserves and frees between the window's
        // check and the heaps' reset (which would count it in one peak and not the other).
        let reset_heaps = || self.heaps.iter().flatten().for_each(HeapRing::reset);
        if let Err(live_slots) = self.window.reset_if_quiescent(reset_heaps) {
            let mut live_allocs = [0; HEAP_RING_COUNT];
            if let Some(heaps) = &self.heaps {
                for (count, heap) in live_allocs.iter_mut().zip(heaps) {
                    *count = heap.live_allocs();
                }
            }
            return Err(RingError::NotQuiescent { live_slots, live_allocs });
        }
        Ok(())
    }

    /// Makes blocked and future allocations return `Shutdown`; releases keep working.
    pub fn shutdown(&self) {
        // Release: pairs with the acquire loads made under the window and ring locks.
        self.shutdown.store(true, Ordering::Release);
        self.window.wake_all();
        for heap in self.heaps.iter().flatten() {
            heap.wake_all();
        }
    }

    /// `true` once [`shutdown`](Self::shutdown) was called.
    pub fn is_shutdown(&self) -> bool {
        // Acquire: pairs with the release store in `shutdown`.
        self.shutdown.load(Ordering::Acquire)
    }

    /// A snapshot of the window and the four heaps.
    pub fn stats(&self) -> RingStats {
        let heaps = match &self.heaps {
            Some(heaps) => heaps.each_ref().map(HeapRing::stats),
            None => std::array::from_fn(|i| HeapRingStats::empty(RingIndex::for_depth(i))),
        };
        RingStats { window: self.window.stats(), heaps }
    }

    /// Sets every high-water mark to its current value.
    pub fn reset_peaks(&self) {
        self.window.reset_peaks();
        for heap in self.heaps.iter().flatten() {
            heap.reset_peaks();
        }
    }
}

#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use super::*;

    fn slot_only_ring() -> Ring<()> {
        Ring::new(RingConfig { heap_bytes_per_ring: 0, ..RingConfig::default() }).unwrap()
    }

    std::thread_local! {
        static PANIC_NEXT_DEFAULT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A payload whose construction panics when the test asks.
    struct Fragile;

    impl Default for Fragile {
        fn default() -> Self {
            if PANIC_NEXT_DEFAULT.with(|p| p.replace(false)) {
                panic!("deliberate: the payload cannot be built");
            }
            Fragile
        }
    }

    #[test]
    fn a_payload_whose_default_panics_leaves_the_window_as_it_was() {
        let cap = 2;
        let config = RingConfig {
            heap_bytes_per_ring: 0,
            max_live_slots: Some(cap),
            alloc_timeout: std::time::Duration::ZERO,
            ..RingConfig::default()
        };
        let ring = Ring::<Fragile>::new(config).unwrap();
        PANIC_NEXT_DEFAULT.with(|p| p.set(true));
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ring.alloc(0, 0)));
        assert!(unwound.is_err());
        assert_eq!(ring.stats().window.live, 0);
        assert_eq!(ring.stats().window.total_allocs, 0);
        // The whole window is still there, and the ring can be rewound.
        let ids: Vec<SlotId> = (0..cap).map(|_| ring.alloc(0, 0).unwrap().slot).collect();
        for id in ids {
            assert!(ring.release(id));
        }
        ring.reset_to_empty().unwrap();
    }

    /// A heap larger than the address space: the system's refusal stays its number and kind.
    #[test]
    fn a_heap_the_system_cannot_map_names_the_systems_error() {
        use crate::error::MapFailure;
        let bytes = 1u64 << 62;
        match Ring::<()>::new(RingConfig { heap_bytes_per_ring: bytes, ..RingConfig::default() }) {
            Err(RingError::HeapMapFailed {
                bytes: b,
                cause: MapFailure::Os { code, kind },
                ..
            }) => {
                assert_eq!(b, bytes);
                assert!(code.is_some());
                assert_eq!(kind, std::io::ErrorKind::OutOfMemory);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn heap_span_debug_shows_the_address_in_hex() {
        let span = HeapSpan {
            ring: RingIndex::ZERO,
            seq: 3,
            offset: 1024,
            len: 1024,
            requested: 100,
            addr: 0x7f00_0000_0400,
        };
        assert_eq!(
            format!("{span:?}"),
            "HeapSpan { ring: RingIndex(0), seq: 3, offset: 1024, len: 1024, requested: 100, addr: \
             0x7f0000000400 }"
        );
    }

    #[test]
    fn a_release_batch_returns_its_entries_when_full_flushed_or_dropped() {
        let n = RELEASE_BATCH + 6;
        let ring: Ring<()> = Ring::new(RingConfig {
            heap_bytes_per_ring: 0,
            max_live_slots: Some(n as u32),
            ..RingConfig::default()
        })
        .unwrap();
        let slots: Vec<SlotId> = (0..n).map(|_| ring.try_alloc(0, 0).unwrap().slot).collect();
        let mut batch = ring.release_batch();
        for (i, &slot) in slots[..RELEASE_BATCH - 1].iter().enumerate() {
            assert!(batch.release(slot));
            assert!(!batch.release(slot), "second release of {slot}");
            assert!(!ring.is_live(slot));
            // Released, but the entries are not back yet: the capped window stays full.
            assert_eq!(ring.stats().window.live, n as u32, "after {} releases", i + 1);
            assert_eq!(
                ring.try_alloc(0, 0).map(|_| ()),
                Err(RingError::TaskWindowExhausted {
                    limit: n as u32,
                    live: n as u32,
                    waited: std::time::Duration::ZERO,
                })
            );
        }
        // The batch fills: its RELEASE_BATCH entries return at once.
        assert!(batch.release(slots[RELEASE_BATCH - 1]));
        assert_eq!(ring.stats().window.live, 6);
        assert!(batch.release(slots[RELEASE_BATCH]) && batch.release(slots[RELEASE_BATCH + 1]));
        batch.flush();
        assert_eq!(ring.stats().window.live, 4);
        assert!(batch.release(slots[RELEASE_BATCH + 2]));
        drop(batch);
        assert_eq!(ring.stats().window.live, 3);
        // Exactly the returned entries are handed out again, none twice, and no new entry is
        // made in their place.
        let again: std::collections::HashSet<u32> =
            (0..n - 3).map(|_| ring.try_alloc(0, 0).unwrap().slot.index).collect();
        let returned: std::collections::HashSet<u32> =
            slots[..n - 3].iter().map(|s| s.index).collect();
        assert_eq!(again, returned);
        assert_eq!(ring.stats().window.capacity, n as u32);
        assert!(ring.try_alloc(0, 0).is_err());
    }

    /// A live slot holding the last generation of its entry.
    fn last_generation_slot(ring: &Ring<()>) -> SlotId {
        let first = ring.try_alloc(0, 0).unwrap().slot;
        assert!(ring.release(first));
        ring.window.force_generation(first.index, u32::MAX, false);
        let last = ring.try_alloc(0, 0).unwrap().slot;
        assert_eq!(last, SlotId::new(first.index, u32::MAX));
        last
    }

    #[test]
    fn a_release_batch_retires_an_exhausted_entry_instead_of_returning_it() {
        let ring = slot_only_ring();
        let last = last_generation_slot(&ring);
        let mut batch = ring.release_batch();
        assert!(batch.release(last));
        drop(batch);
        assert_eq!(ring.stats().window.live, 0);
        assert_ne!(ring.try_alloc(0, 0).unwrap().slot.index, last.index);
    }

    #[test]
    fn an_entry_whose_generation_is_exhausted_is_retired_not_reused() {
        let ring = slot_only_ring();
        let last = last_generation_slot(&ring);
        assert!(ring.release(last));
        assert!(!ring.is_live(last));
        assert!(!ring.release(last));
        assert_eq!(ring.generation(last.index), None, "no id of a retired entry is current");
        let next = ring.try_alloc(0, 0).unwrap().slot;
        assert_ne!(next.index, last.index, "a retired entry is never handed out again");
        let stats = ring.stats().window;
        assert_eq!((stats.live, stats.capacity), (1, 2));
    }

    #[test]
    fn a_patience_of_zero_one_nanosecond_or_duration_max_never_panics() {
        use std::time::Duration;
        assert_eq!(Patience::timeout(Duration::ZERO).next_wait(), None, "zero never blocks");
        // One nanosecond: a deadline now or already past, never a panic.
        let mut tiny = Patience::timeout(Duration::from_nanos(1));
        assert!(matches!(tiny.next_wait(), None | Some(Some(_))));
        // A budget past the clock's range is no deadline at all.
        assert_eq!(Patience::timeout(Duration::MAX).next_wait(), Some(None));
    }

    #[test]
    fn an_alloc_timeout_of_zero_one_nanosecond_or_duration_max_never_panics() {
        use std::time::Duration;
        for timeout in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
            let config = RingConfig {
                heap_bytes_per_ring: HEAP_ALIGN,
                alloc_timeout: timeout,
                ..RingConfig::default()
            };
            let ring = std::sync::Arc::new(Ring::<()>::new(config).unwrap());
            let full = ring.alloc(HEAP_ALIGN, 0).unwrap();
            if timeout == Duration::MAX {
                // No deadline: the call waits until the holder releases.
                let other = std::sync::Arc::clone(&ring);
                let waiter = std::thread::spawn(move || other.alloc(HEAP_ALIGN, 0).map(|a| a.slot));
                // Release only once the waiter blocks (or is gone), so the deadline is computed.
                while ring.stats().heaps[0].waits == 0 && !waiter.is_finished() {
                    std::thread::yield_now();
                }
                assert!(ring.release(full.slot));
                assert!(waiter.join().expect("waiter").is_ok(), "{timeout:?}");
            } else {
                let err = ring.alloc(HEAP_ALIGN, 0).unwrap_err();
                assert!(!matches!(err, RingError::Shutdown), "{timeout:?}: {err}");
            }
        }
    }

    #[test]
    fn a_forged_id_with_the_generation_of_a_free_entry_is_not_live() {
        let ring = slot_only_ring();
        let id = ring.try_alloc(0, 0).unwrap().slot;
        assert!(ring.release(id));
        let forged = SlotId::new(id.index, id.generation + 1);
        assert_eq!(ring.generation(id.index), Some(forged.generation));
        assert!(!ring.is_live(forged));
        assert!(ring.slot(forged).is_none());
        assert!(!ring.release(forged));
        assert_eq!(ring.try_alloc(0, 0).unwrap().slot, forged);
    }
}
