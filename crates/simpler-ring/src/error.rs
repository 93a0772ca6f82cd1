//! [`RingError`]: every way a ring or scope operation can be refused.

use std::fmt;
use std::time::Duration;

use simpler_types::{HEAP_RING_COUNT, RingIndex, SlotId};

/// Why a [`Ring`](crate::Ring) or [`ScopeStack`](crate::ScopeStack) operation was refused.
///
/// Messages name the ring and the sizes involved, so a capacity error says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// The configuration given to [`Ring::new`](crate::Ring::new) is unusable.
    #[error("invalid ring configuration: {reason}")]
    InvalidConfig {
        /// What is wrong, with the offending values.
        reason: String,
    },
    /// Reserving the anonymous mapping behind a heap ring failed.
    #[error("could not map {bytes} bytes for heap {ring}: {reason}")]
    HeapMapFailed {
        /// The ring whose mapping failed.
        ring: RingIndex,
        /// Size of the mapping requested.
        bytes: u64,
        /// The operating system's explanation.
        reason: String,
    },
    /// The ring was shut down; no allocation succeeds any more.
    #[error("the ring is shut down")]
    Shutdown,
    /// A heap allocation was requested while heaps are disabled (`heap_bytes_per_ring == 0`).
    #[error(
        "heap allocation of {requested} bytes refused: heaps are disabled (heap_bytes_per_ring = 0)"
    )]
    HeapDisabled {
        /// Bytes requested.
        requested: u64,
    },
    /// The request can never fit its ring, whatever the ring's state.
    #[error(
        "request of {requested} bytes ({}) can never fit {ring} of {ring_size} bytes; raise heap_bytes_per_ring",
        AlignedText(*aligned)
    )]
    RequestTooLarge {
        /// The ring the request was for.
        ring: RingIndex,
        /// Bytes requested.
        requested: u64,
        /// The request rounded up to the heap alignment; `None` if that overflows `u64`.
        aligned: Option<u64>,
        /// Size of the ring.
        ring_size: u64,
    },
    /// The task window stayed full (at `max_live_slots`) until the deadline.
    #[error(
        "task window full: {live} of {limit} slots live after waiting {waited:?}; raise max_live_slots or keep fewer tasks alive"
    )]
    TaskWindowExhausted {
        /// The configured `max_live_slots`.
        limit: u32,
        /// Live slots when the allocation gave up.
        live: u32,
        /// How long the allocation waited.
        waited: Duration,
    },
    /// A heap ring had no room until the deadline.
    #[error("{0}")]
    HeapExhausted(Box<HeapExhausted>),
    /// `reset_to_empty` was called while slots were live.
    #[error("ring not quiescent: {live_slots} slots live (heap slabs per ring: {live_allocs:?})")]
    NotQuiescent {
        /// Live task-window slots.
        live_slots: u32,
        /// Live slabs in rings 0..=3.
        live_allocs: [u32; HEAP_RING_COUNT],
    },
    /// `ScopeStack::begin` at the maximum depth.
    #[error("scope depth limit of {max} frames reached (the run's outer frame included)")]
    ScopeDepthExceeded {
        /// The maximum depth, outer frame included.
        max: usize,
    },
    /// `ScopeStack::end_into` with no open frame.
    #[error("scope end without a matching begin")]
    ScopeUnderflow,
}

/// Everything known about a heap allocation that found no room before its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeapExhausted {
    /// The ring that had no room.
    pub ring: RingIndex,
    /// Bytes requested.
    pub requested: u64,
    /// The request rounded up to the heap alignment.
    pub aligned: u64,
    /// Size of the ring.
    pub ring_size: u64,
    /// Bytes held by unreleased slabs.
    pub live_bytes: u64,
    /// Bytes from tail to top: live slabs, released slabs behind a live one, and the wrap gap.
    pub occupied_bytes: u64,
    /// The largest request (a multiple of the alignment) that would have fitted when the
    /// allocation gave up: after the top, or at offset 0 after a wrap, whichever is larger.
    pub largest_fit: u64,
    /// Unreleased slabs in the ring.
    pub live_allocs: u32,
    /// The slab pinning the tail: releasing it is what frees space first.
    pub oldest_live: Option<SlotId>,
    /// How long the allocation waited.
    pub waited: Duration,
}

impl fmt::Display for HeapExhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} has no room for {} bytes ({} aligned) after waiting {:?}: ring size {}, \
             {} bytes live in {} slabs, {} bytes occupied, largest fit now {} bytes",
            self.ring,
            self.requested,
            self.aligned,
            self.waited,
            self.ring_size,
            self.live_bytes,
            self.live_allocs,
            self.occupied_bytes,
            self.largest_fit
        )?;
        if let Some(slot) = self.oldest_live {
            write!(f, "; the oldest live slab ({slot}) pins the tail")?;
        }
        f.write_str("; raise heap_bytes_per_ring or use a scope that keeps less alive")
    }
}

/// Formats an aligned size that may have overflowed.
struct AlignedText(Option<u64>);

impl fmt::Display for AlignedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(aligned) => write!(f, "{aligned} aligned"),
            None => f.write_str("aligned size overflows u64"),
        }
    }
}
