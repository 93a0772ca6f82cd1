//! One host heap ring: a [`HeapRingCore`] under a mutex, with a condition variable for
//! back-pressure, the ring's address region and (for anonymous backing) its mapping.
//!
//! Allocation protocol (`HeapRing::alloc`, all under the ring lock):
//!
//! 1. If the ring is shut down, give up with `Shutdown`.
//! 2. If the bump rule places the slab, append its record (step 2 of the core protocol) and
//!    return the span.
//! 3. If the call's deadline has passed (or it may not wait), give up with `HeapExhausted`,
//!    describing the ring as it is now.
//! 4. Otherwise wait on the ring's condition variable (until the deadline) and go to 1.
//!
//! Release protocol (`HeapRing::release`): under the lock, mark the record released (the core
//! advances the tail and rewinds on drain); after unlocking, if the tail moved, wake **all**
//! waiters of this ring. Each re-checks the bump rule; waking all keeps a large request from
//! being starved by a wake that went to a request that still does not fit.

use std::collections::VecDeque;
use std::time::Instant;

use simpler_types::{RingIndex, SlotId};

use crate::config::HeapRegion;
use crate::error::{ConfigProblem, HeapExhausted, MapFailure, RingError};
use crate::fixed::{HeapRecord, HeapRingCore, RecordStore, ReleaseOutcome};
use crate::patience::Patience;
use crate::ring::HeapSpan;
use crate::stats::HeapRingStats;
use crate::sync::{AtomicBool, Condvar, Mutex, Ordering, wait_for};

impl RecordStore for VecDeque<HeapRecord> {
    fn len(&self) -> usize {
        VecDeque::len(self)
    }

    fn push_back(&mut self, record: HeapRecord) -> Result<(), HeapRecord> {
        VecDeque::push_back(self, record);
        Ok(())
    }

    fn get(&self, position: usize) -> Option<&HeapRecord> {
        VecDeque::get(self, position)
    }

    fn get_mut(&mut self, position: usize) -> Option<&mut HeapRecord> {
        VecDeque::get_mut(self, position)
    }

    fn pop_front(&mut self) -> Option<HeapRecord> {
        VecDeque::pop_front(self)
    }

    fn clear(&mut self) {
        VecDeque::clear(self);
    }
}

/// State under the ring lock: the core plus the counters that only the host (which waits) has.
#[derive(Debug)]
struct HeapState {
    core: HeapRingCore<VecDeque<HeapRecord>>,
    waits: u64,
    total_wait: std::time::Duration,
    timeouts: u64,
}

/// One heap ring of a [`Ring`](crate::Ring).
#[derive(Debug)]
pub(crate) struct HeapRing {
    index: RingIndex,
    region: HeapRegion,
    state: Mutex<HeapState>,
    /// Allocations waiting for space on this ring.
    cond: Condvar,
    /// Keeps the anonymous mapping alive; the ring never reads or writes it.
    _mapping: Option<memmap2::MmapMut>,
}

impl HeapRing {
    /// A ring over `region`; `mapping` is the memory behind it when the ring owns it.
    pub(crate) fn new(
        index: RingIndex,
        region: HeapRegion,
        mapping: Option<memmap2::MmapMut>,
    ) -> Result<Self, RingError> {
        // `RingConfig::validate` refused a zero or unaligned size already.
        let unaligned = ConfigProblem::UnalignedHeapSize { size: region.len };
        let core = HeapRingCore::new(region.len, VecDeque::new())
            .ok_or(RingError::InvalidConfig { problem: unaligned })?;
        Ok(HeapRing {
            index,
            region,
            state: Mutex::new(HeapState {
                core,
                waits: 0,
                total_wait: std::time::Duration::ZERO,
                timeouts: 0,
            }),
            cond: Condvar::new(),
            _mapping: mapping,
        })
    }

    /// Reserves the address space of one ring.
    pub(crate) fn map_anonymous(index: RingIndex, bytes: u64) -> Result<Self, RingError> {
        let map_failed = |cause| RingError::HeapMapFailed { ring: index, bytes, cause };
        let len = usize::try_from(bytes).map_err(|_| map_failed(MapFailure::SizeExceedsUsize))?;
        let mapping = memmap2::MmapOptions::new()
            .len(len)
            .no_reserve_swap()
            .map_anon()
            .map_err(|e| map_failed(MapFailure::os(&e)))?;
        // Only the address is taken; the ring never dereferences heap memory.
        let base = mapping.as_ptr() as usize as u64;
        HeapRing::new(index, HeapRegion { base, len: bytes }, Some(mapping))
    }

    pub(crate) fn region(&self) -> HeapRegion {
        self.region
    }

    pub(crate) fn size(&self) -> u64 {
        self.region.len
    }

    /// Places a slab of `aligned` bytes for `owner`, waiting as `patience` allows.
    pub(crate) fn alloc(
        &self,
        requested: u64,
        aligned: u64,
        owner: SlotId,
        patience: &mut Patience,
        shutdown: &AtomicBool,
    ) -> Result<HeapSpan, RingError> {
        let mut state = self.state.lock();
        let mut waited_here = false;
        loop {
            // Acquire pairs with the release store in `Ring::shutdown`; the ring lock already
            // orders it, the ordering only documents the pairing.
            if shutdown.load(Ordering::Acquire) {
                return Err(RingError::Shutdown);
            }
            if let Some(placement) = state.core.try_place(aligned) {
                let Some(grant) = state.core.push_record(placement, owner.pack()) else {
                    unreachable!("a VecDeque record store never refuses a record");
                };
                return Ok(HeapSpan {
                    ring: self.index,
                    seq: grant.seq,
                    offset: grant.offset,
                    len: grant.len,
                    requested,
                    addr: self.region.base + grant.offset,
                });
            }
            let Some(deadline) = patience.next_wait() else {
                state.timeouts += u64::from(patience.counts_refusal);
                let core = &state.core;
                return Err(RingError::HeapExhausted(Box::new(HeapExhausted {
                    ring: self.index,
                    requested,
                    aligned,
                    ring_size: core.size(),
                    live_bytes: core.live_bytes(),
                    occupied_bytes: core.occupied_bytes(),
                    largest_fit: core.largest_fit(),
                    live_allocs: core.live_allocs(),
                    oldest_live: core.oldest_live().map(|r| SlotId::unpack(r.owner)),
                    waited: patience.waited,
                })));
            };
            if !waited_here {
                waited_here = true;
                state.waits += 1;
            }
            let started = Instant::now();
            state = wait_for(&self.cond, state, deadline);
            let waited = started.elapsed();
            patience.waited += waited;
            state.total_wait += waited;
        }
    }

    /// Frees slab `seq` and wakes this ring's waiters if space appeared.
    pub(crate) fn release(&self, seq: u64) {
        let outcome = self.state.lock().core.mark_released(seq);
        match outcome {
            ReleaseOutcome::Released { tail_moved: true, .. } => self.cond.notify_all(),
            ReleaseOutcome::Released { tail_moved: false, .. } => {}
            ReleaseOutcome::NotFound | ReleaseOutcome::AlreadyReleased => {
                debug_assert!(false, "{}: the window released slab {seq} twice", self.index);
            }
        }
    }

    pub(crate) fn live_allocs(&self) -> u32 {
        self.state.lock().core.live_allocs()
    }

    /// Rewinds the ring and zeroes its peaks if it is empty; otherwise (an allocation raced with
    /// the reset) only resets the peaks to current values.
    pub(crate) fn reset(&self) {
        let mut state = self.state.lock();
        if !state.core.reset() {
            state.core.reset_peaks();
        }
    }

    pub(crate) fn reset_peaks(&self) {
        self.state.lock().core.reset_peaks();
    }

    /// Wakes every waiter of this ring; they observe the shutdown flag under the lock.
    pub(crate) fn wake_all(&self) {
        // Taking the lock orders this wake after any waiter's flag check (see `Window::wake_all`).
        drop(self.state.lock());
        self.cond.notify_all();
    }

    pub(crate) fn stats(&self) -> HeapRingStats {
        let state = self.state.lock();
        let core = &state.core;
        HeapRingStats {
            ring: self.index,
            size: core.size(),
            top: core.top(),
            tail: core.tail(),
            live_bytes: core.live_bytes(),
            peak_live_bytes: core.peak_live_bytes(),
            occupied_bytes: core.occupied_bytes(),
            peak_occupied_bytes: core.peak_occupied_bytes(),
            live_allocs: core.live_allocs(),
            peak_live_allocs: core.peak_live_allocs(),
            total_allocs: core.total_allocs(),
            total_bytes: core.total_bytes(),
            waits: state.waits,
            total_wait: state.total_wait,
            timeouts: state.timeouts,
            rewinds: core.rewinds(),
        }
    }
}
