//! [`FixedMapError`]: why the fixed map refused storage or an insert.

use core::fmt;

/// Why [`FixedTensorMap`](super::FixedTensorMap) refused its storage or an insert.
///
/// Written by hand rather than derived so that the module needs nothing beyond `core`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FixedMapError {
    /// Every entry of the pool holds a live access of an unretired task, even after the
    /// retired ones were pruned, and the insert superseded none. Nothing changed.
    Full {
        /// Entries in the pool.
        capacity: u32,
        /// Live writer entries at the failure.
        writers: u32,
        /// Live reader entries at the failure.
        readers: u32,
    },
    /// The bucket array's length is not a power of two between 1 and 2³¹.
    BucketsNotPowerOfTwo {
        /// The length given.
        len: usize,
    },
    /// The entry pool has more slots than 32-bit links can name.
    TooManyEntries {
        /// The length given.
        len: usize,
        /// The largest pool supported.
        max: usize,
    },
    /// [`FixedTensorMap::reuse`](super::FixedTensorMap::reuse) was told that more slots were
    /// handed out than the pool has.
    HandedOutBeyondPool {
        /// The count given.
        handed_out: u32,
        /// Entries in the pool.
        capacity: usize,
    },
}

impl fmt::Display for FixedMapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FixedMapError::Full { capacity, writers, readers } => write!(
                f,
                "tensor map full: all {capacity} entries hold accesses of unretired tasks \
                 ({writers} writer and {readers} reader entries); give the map a larger entry \
                 pool or let earlier tasks retire before submitting more"
            ),
            FixedMapError::BucketsNotPowerOfTwo { len } => write!(
                f,
                "tensor map bucket array has {len} buckets; it needs a power of two from 1 to 2^31"
            ),
            FixedMapError::TooManyEntries { len, max } => {
                write!(f, "tensor map entry pool has {len} entries; at most {max} are supported")
            }
            FixedMapError::HandedOutBeyondPool { handed_out, capacity } => write!(
                f,
                "tensor map reuse names {handed_out} handed-out entries of a {capacity}-entry pool"
            ),
        }
    }
}

impl core::error::Error for FixedMapError {}
