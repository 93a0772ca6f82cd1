//! [`RingError`]: every way a ring or scope operation can be refused.

use std::fmt;
use std::time::Duration;

use simpler_types::{HEAP_RING_COUNT, RingIndex, SlotId};

/// Why a [`Ring`](crate::Ring) or [`ScopeStack`](crate::ScopeStack) operation was refused.
///
/// `Display` names the ring and the sizes involved and, for a capacity error, which
/// [`RingConfig`](crate::RingConfig) field to change. A layer that configures the ring through
/// settings of its own renders [`facts`](RingError::facts) and names its own setting instead.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RingError {
    /// The configuration given to [`Ring::new`](crate::Ring::new) is unusable.
    InvalidConfig {
        /// Which rule it breaks, with the offending values.
        problem: ConfigProblem,
    },
    /// Reserving the anonymous mapping behind a heap ring failed.
    HeapMapFailed {
        /// The ring whose mapping failed.
        ring: RingIndex,
        /// Size of the mapping requested.
        bytes: u64,
        /// Why it failed.
        cause: MapFailure,
    },
    /// The ring was shut down; no allocation succeeds any more.
    Shutdown,
    /// A heap allocation was requested while heaps are disabled (`heap_bytes_per_ring == 0`).
    HeapDisabled {
        /// Bytes requested.
        requested: u64,
    },
    /// The request can never fit its ring, whatever the ring's state.
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
    TaskWindowExhausted {
        /// The configured `max_live_slots`.
        limit: u32,
        /// Live slots when the allocation gave up.
        live: u32,
        /// How long the allocation waited.
        waited: Duration,
    },
    /// A heap ring had no room until the deadline.
    HeapExhausted(Box<HeapExhausted>),
    /// `reset_to_empty` was called while slots were live.
    NotQuiescent {
        /// Live task-window slots.
        live_slots: u32,
        /// Live slabs in rings 0..=3.
        live_allocs: [u32; HEAP_RING_COUNT],
    },
    /// `ScopeStack::begin` at the maximum depth.
    ScopeDepthExceeded {
        /// The maximum depth, outer frame included.
        max: usize,
    },
    /// `ScopeStack::end_into` with no open frame.
    ScopeUnderflow,
}

impl RingError {
    /// What happened, without the advice that names a [`RingConfig`](crate::RingConfig) field:
    /// for a layer whose users set the ring through settings of their own, which names those.
    ///
    /// ```
    /// use simpler_ring::RingError;
    ///
    /// let e = RingError::HeapDisabled { requested: 64 };
    /// assert_eq!(e.facts().to_string(), "heap allocation of 64 bytes refused: heaps are disabled");
    /// assert_eq!(e.to_string(), "heap allocation of 64 bytes refused: heaps are disabled; set heap_bytes_per_ring above 0");
    /// ```
    pub fn facts(&self) -> impl fmt::Display + '_ {
        Facts(self)
    }

    /// Which [`RingConfig`](crate::RingConfig) change avoids the error, for capacity errors.
    fn advice(&self) -> Option<&'static str> {
        match self {
            RingError::HeapDisabled { .. } => Some("set heap_bytes_per_ring above 0"),
            RingError::RequestTooLarge { .. } => Some("raise heap_bytes_per_ring"),
            RingError::TaskWindowExhausted { .. } => {
                Some("raise max_live_slots or keep fewer tasks alive")
            }
            RingError::HeapExhausted(_) => Some(
                "raise heap_bytes_per_ring or alloc_timeout, or use a scope that keeps less alive",
            ),
            _ => None,
        }
    }
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.facts(), f)?;
        match self.advice() {
            Some(advice) => write!(f, "; {advice}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for RingError {}

/// Why the mapping behind a heap ring could not be reserved ([`RingError::HeapMapFailed`]).
/// The system's error is kept as its number and kind, so that the ring error stays `Eq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MapFailure {
    /// The size does not fit this host's address width (`usize`).
    SizeExceedsUsize,
    /// The system refused the mapping.
    Os {
        /// The system's error number (`errno`), when it gave one.
        code: Option<i32>,
        /// The error's kind.
        kind: std::io::ErrorKind,
    },
}

impl MapFailure {
    /// The refusal `e` of the system.
    pub(crate) fn os(e: &std::io::Error) -> MapFailure {
        MapFailure::Os { code: e.raw_os_error(), kind: e.kind() }
    }
}

impl fmt::Display for MapFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MapFailure::SizeExceedsUsize => f.write_str("size exceeds usize"),
            MapFailure::Os { code: Some(code), .. } => {
                fmt::Display::fmt(&std::io::Error::from_raw_os_error(code), f)
            }
            MapFailure::Os { code: None, kind } => fmt::Display::fmt(&kind, f),
        }
    }
}

/// Which rule of a [`RingConfig`](crate::RingConfig) a configuration breaks
/// ([`RingError::InvalidConfig`]), with the offending values; `Display` names the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigProblem {
    /// `heap_bytes_per_ring` is not a multiple of the heap alignment.
    UnalignedHeapSize {
        /// The configured size.
        size: u64,
    },
    /// `heap_bytes_per_ring` is larger than the address space can hold.
    HeapSizeTooLarge {
        /// The configured size.
        size: u64,
    },
    /// `max_live_slots = Some(0)`, which would refuse every allocation.
    ZeroLiveSlots,
    /// External heap regions were given while `heap_bytes_per_ring = 0` disables heaps.
    RegionsWithoutHeaps,
    /// An external region's length differs from `heap_bytes_per_ring`.
    RegionLength {
        /// The ring whose region it is.
        ring: usize,
        /// The region's length.
        len: u64,
        /// `heap_bytes_per_ring`.
        size: u64,
    },
    /// An external region starts at 0 or off the heap alignment.
    RegionBase {
        /// The ring whose region it is.
        ring: usize,
        /// The region's base.
        base: u64,
    },
    /// An external region runs past the end of the address space.
    RegionWraps {
        /// The ring whose region it is.
        ring: usize,
        /// The region's base.
        base: u64,
        /// The region's length.
        len: u64,
    },
    /// Two external regions overlap.
    RegionsOverlap {
        /// The first ring and its region's base and length.
        first: (usize, u64, u64),
        /// The second ring and its region's base and length.
        second: (usize, u64, u64),
    },
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use simpler_types::HEAP_ALIGN;
        match *self {
            ConfigProblem::UnalignedHeapSize { size } => {
                write!(f, "heap_bytes_per_ring = {size} is not a multiple of {HEAP_ALIGN}")
            }
            ConfigProblem::HeapSizeTooLarge { size } => {
                write!(f, "heap_bytes_per_ring = {size} exceeds the address space")
            }
            ConfigProblem::ZeroLiveSlots => {
                f.write_str("max_live_slots = Some(0) would refuse every allocation")
            }
            ConfigProblem::RegionsWithoutHeaps => f.write_str(
                "external heap regions given while heap_bytes_per_ring = 0 disables heaps",
            ),
            ConfigProblem::RegionLength { ring, len, size } => write!(
                f,
                "heap region of ring {ring} is {len} bytes long; it must equal \
                 heap_bytes_per_ring = {size}"
            ),
            ConfigProblem::RegionBase { ring, base } => write!(
                f,
                "heap region of ring {ring} starts at {base:#x}; it must be a non-zero multiple \
                 of {HEAP_ALIGN}"
            ),
            ConfigProblem::RegionWraps { ring, base, len } => write!(
                f,
                "heap region of ring {ring} ({base:#x} + {len} bytes) wraps past the end of the \
                 address space"
            ),
            ConfigProblem::RegionsOverlap { first: (a, abase, alen), second: (b, bbase, blen) } => {
                write!(
                    f,
                    "heap regions of rings {a} ({abase:#x}, {alen} bytes) and {b} ({bbase:#x}, \
                     {blen} bytes) overlap"
                )
            }
        }
    }
}

/// [`RingError::facts`].
struct Facts<'a>(&'a RingError);

impl fmt::Display for Facts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            RingError::InvalidConfig { problem } => {
                write!(f, "invalid ring configuration: {problem}")
            }
            RingError::HeapMapFailed { ring, bytes, cause } => {
                write!(f, "could not map {bytes} bytes for heap {ring}: {cause}")
            }
            RingError::Shutdown => f.write_str("the ring is shut down"),
            RingError::HeapDisabled { requested } => {
                write!(f, "heap allocation of {requested} bytes refused: heaps are disabled")
            }
            RingError::RequestTooLarge { ring, requested, aligned, ring_size } => write!(
                f,
                "request of {requested} bytes ({}) can never fit {ring} of {ring_size} bytes",
                AlignedText(*aligned)
            ),
            RingError::TaskWindowExhausted { limit, live, waited } => {
                write!(f, "task window full: {live} of {limit} slots live after waiting {waited:?}")
            }
            RingError::HeapExhausted(e) => fmt::Display::fmt(e, f),
            RingError::NotQuiescent { live_slots, live_allocs } => write!(
                f,
                "ring not quiescent: {live_slots} slots live (heap slabs per ring: {live_allocs:?})"
            ),
            RingError::ScopeDepthExceeded { max } => {
                write!(
                    f,
                    "scope depth limit of {max} frames reached (the run's outer frame included)"
                )
            }
            RingError::ScopeUnderflow => f.write_str("scope end without a matching begin"),
        }
    }
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

/// The facts only; [`RingError`]'s `Display` adds which setting to change.
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
        Ok(())
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
