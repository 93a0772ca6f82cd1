//! `ByteSpan`: the half-open byte range a tensor view can touch (spec 20 §D.1).

use core::fmt;

/// A half-open byte range `[start, end)` in the address space of one buffer key.
///
/// Spans built with [`ByteSpan::new`] are never empty. The fields are public so that callers can
/// pattern-match and build spans in constant contexts; a span built by hand with
/// `start >= end` is *empty*: it overlaps nothing, contains nothing non-empty, and the map
/// ignores it (an insert of an empty span adds no entry and a lookup with one visits nothing),
/// exactly as it ignores an untracked zero-size tensor.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSpan {
    /// First byte of the range.
    pub start: u64,
    /// One past the last byte of the range.
    pub end: u64,
}

impl ByteSpan {
    /// Every byte address from 0 up to (excluding) `u64::MAX`.
    ///
    /// A lookup with this span finds every producer of a key, which is the "whole buffer"
    /// question the base-address map of spec 20 §A.3 answered.
    pub const ALL: ByteSpan = ByteSpan { start: 0, end: u64::MAX };

    /// The range `[start, end)`; `None` unless `start < end`.
    pub const fn new(start: u64, end: u64) -> Option<ByteSpan> {
        if start < end { Some(ByteSpan { start, end }) } else { None }
    }

    /// The range of `len` bytes starting at `start`; `None` if `len` is 0 or the end overflows.
    pub const fn with_len(start: u64, len: u64) -> Option<ByteSpan> {
        match start.checked_add(len) {
            Some(end) => ByteSpan::new(start, end),
            None => None,
        }
    }

    /// Number of bytes in the range (0 for an empty span).
    pub const fn len(self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// `true` when the range holds no byte (`start >= end`).
    pub const fn is_empty(self) -> bool {
        self.start >= self.end
    }

    /// `true` when the two ranges share at least one byte.
    ///
    /// An empty span overlaps nothing, not even a span that surrounds its position.
    pub const fn overlaps(self, other: ByteSpan) -> bool {
        !self.is_empty() && !other.is_empty() && self.start < other.end && other.start < self.end
    }

    /// `true` when every byte of `other` lies inside `self`.
    ///
    /// This is the supersession test of the map's insert: a new footprint removes the older
    /// entries it contains. An empty `other` is contained in every span (it has no byte outside).
    pub const fn contains(self, other: ByteSpan) -> bool {
        other.is_empty() || (self.start <= other.start && other.end <= self.end)
    }
}

impl fmt::Display for ByteSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#x}, {:#x})", self.start, self.end)
    }
}

impl fmt::Debug for ByteSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(start: u64, end: u64) -> ByteSpan {
        ByteSpan { start, end }
    }

    #[test]
    fn new_rejects_empty_and_inverted_ranges() {
        assert_eq!(ByteSpan::new(3, 3), None);
        assert_eq!(ByteSpan::new(4, 3), None);
        assert_eq!(ByteSpan::new(3, 4), Some(s(3, 4)));
        assert_eq!(ByteSpan::with_len(10, 0), None);
        assert_eq!(ByteSpan::with_len(u64::MAX, 1), None);
        assert_eq!(ByteSpan::with_len(10, 6), Some(s(10, 16)));
    }

    #[test]
    fn overlap_is_symmetric_and_needs_a_shared_byte() {
        assert!(s(0, 4).overlaps(s(3, 8)));
        assert!(s(3, 8).overlaps(s(0, 4)));
        assert!(!s(0, 4).overlaps(s(4, 8)), "adjacent ranges share no byte");
        assert!(s(0, 100).overlaps(s(50, 51)));
        assert!(!s(5, 5).overlaps(s(0, 10)), "an empty span overlaps nothing");
        assert!(!s(0, 10).overlaps(s(7, 2)), "an inverted span overlaps nothing");
    }

    #[test]
    fn containment_is_inclusive_at_both_ends() {
        assert!(s(0, 10).contains(s(0, 10)));
        assert!(s(0, 10).contains(s(2, 5)));
        assert!(!s(0, 10).contains(s(2, 11)));
        assert!(!s(2, 5).contains(s(0, 10)));
        assert!(s(2, 5).contains(s(9, 9)), "the empty set is a subset of every span");
    }

    #[test]
    fn all_covers_every_ordinary_address() {
        assert!(ByteSpan::ALL.contains(s(0, 1)));
        assert!(ByteSpan::ALL.overlaps(s(u64::MAX - 1, u64::MAX)));
        assert_eq!(s(0x10, 0x20).to_string(), "[0x10, 0x20)");
    }
}
