//! [`RingStats`]: counters and high-water marks of the window and of each heap ring.

use std::time::Duration;

use simpler_types::{HEAP_RING_COUNT, RingIndex};

/// A snapshot of a [`Ring`](crate::Ring): consistent per ring (and for the window), not across
/// rings, since each is read under its own lock in turn.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RingStats {
    /// The task window.
    pub window: WindowStats,
    /// Heap rings 0..=3 (all zero sizes when heaps are disabled).
    pub heaps: [HeapRingStats; HEAP_RING_COUNT],
}

/// Counters of the task window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WindowStats {
    /// Live slots (including allocations in progress that already hold an entry).
    pub live: u32,
    /// High-water mark of `live` since construction or the last `reset_peaks`/`reset_to_empty`.
    pub peak_live: u32,
    /// Entries materialized so far (the window's memory is proportional to this).
    pub capacity: u32,
    /// The configured `max_live_slots`.
    pub limit: Option<u32>,
    /// Successful allocations.
    pub total_allocs: u64,
    /// Allocations that had to wait for a free slot.
    pub waits: u64,
    /// Allocations refused because the window stayed full (`TaskWindowExhausted`).
    pub timeouts: u64,
}

/// Counters of one heap ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeapRingStats {
    /// Which ring.
    pub ring: RingIndex,
    /// Ring size in bytes (0 when heaps are disabled).
    pub size: u64,
    /// Bump cursor, as an offset from the ring's base.
    pub top: u64,
    /// End of the last slab the tail passed over (where the oldest live slab starts, or the
    /// bytes a wrap skipped before it), as an offset from the ring's base.
    pub tail: u64,
    /// Bytes held by unreleased slabs.
    pub live_bytes: u64,
    /// High-water mark of `live_bytes`.
    pub peak_live_bytes: u64,
    /// Bytes from tail to top, wrap gap and released-but-pinned slabs included.
    pub occupied_bytes: u64,
    /// High-water mark of `occupied_bytes`.
    pub peak_occupied_bytes: u64,
    /// Unreleased slabs.
    pub live_allocs: u32,
    /// High-water mark of `live_allocs`.
    pub peak_live_allocs: u32,
    /// Slabs ever placed.
    pub total_allocs: u64,
    /// Aligned bytes ever placed.
    pub total_bytes: u64,
    /// Allocations that had to wait for space.
    pub waits: u64,
    /// Time spent waiting for space, summed over allocations.
    pub total_wait: Duration,
    /// Allocations refused for lack of space (`HeapExhausted`), whether after waiting or not.
    pub timeouts: u64,
    /// Times the ring drained and its cursors went back to 0.
    pub rewinds: u64,
}

impl HeapRingStats {
    /// All-zero counters for `ring` (a disabled heap).
    pub(crate) fn empty(ring: RingIndex) -> Self {
        HeapRingStats {
            ring,
            size: 0,
            top: 0,
            tail: 0,
            live_bytes: 0,
            peak_live_bytes: 0,
            occupied_bytes: 0,
            peak_occupied_bytes: 0,
            live_allocs: 0,
            peak_live_allocs: 0,
            total_allocs: 0,
            total_bytes: 0,
            waits: 0,
            total_wait: Duration::ZERO,
            timeouts: 0,
            rewinds: 0,
        }
    }
}
