//! The bump-and-wrap placement rule of one heap ring, as pure functions.
//!
//! Notation: `N` is the ring size, `T` the top (bump cursor), `L` the tail (the end of the last
//! slab reclaimed: the oldest live slab's start, or the bytes a wrap skipped before it, up to
//! `N`), `a` the aligned request. Live bytes lie in `[L, T)` when `T ≥ L`, and in
//! `[L, N) ∪ [0, T)` when the ring has wrapped (`T < L`).
//!
//! | Situation | Place at | New top | Condition |
//! |---|---|---|---|
//! | `T ≥ L`, room at the end | `T` | `T + a` | `N − T ≥ a` |
//! | `T ≥ L`, no room at the end: wrap | 0 | `a` | `L > a` (strict) |
//! | `T < L`, gap before the tail | `T` | `T + a` | `L − T > a` (strict) |
//! | otherwise | — | — | no space now |
//!
//! The strict comparisons keep `T == L` meaning "empty" and never "full". Bytes skipped at the
//! end by a wrap are not tracked; they become free when the tail passes them.

use simpler_types::HEAP_ALIGN;

/// Where a slab goes and where the bump cursor moves when it is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Placement {
    /// Offset of the slab from the ring's base.
    pub offset: u64,
    /// The ring's top after placing the slab (`offset + aligned`).
    pub new_top: u64,
}

/// Applies the bump rule: where a slab of `aligned` bytes goes in a ring of `size` bytes whose
/// cursors are `top` and `tail`, or `None` when it does not fit now.
///
/// A request of 0 bytes never gets a placement: zero-size slabs would sit in the FIFO without
/// owning any bytes. Nor does one that is not a multiple of [`HEAP_ALIGN`], which would leave
/// the cursors unaligned (callers round requests up first), nor cursors outside `0..=size`
/// (which no ring produces).
pub fn bump(size: u64, top: u64, tail: u64, aligned: u64) -> Option<Placement> {
    if aligned == 0 || !aligned.is_multiple_of(HEAP_ALIGN) || top > size || tail > size {
        return None;
    }
    if top >= tail {
        if size - top >= aligned {
            Some(Placement { offset: top, new_top: top + aligned })
        } else if tail > aligned {
            Some(Placement { offset: 0, new_top: aligned })
        } else {
            None
        }
    } else if tail - top > aligned {
        Some(Placement { offset: top, new_top: top + aligned })
    } else {
        None
    }
}

/// The largest multiple of [`HEAP_ALIGN`] that [`bump`] would place now (0 when nothing fits).
///
/// Cursors are assumed to be multiples of [`HEAP_ALIGN`], as every ring keeps them.
pub fn largest_fit(size: u64, top: u64, tail: u64) -> u64 {
    // The largest multiple of the alignment strictly below `gap`.
    let below = |gap: u64| gap.saturating_sub(1) / HEAP_ALIGN * HEAP_ALIGN;
    if top > size || tail > size {
        return 0;
    }
    if top >= tail {
        let at_end = (size - top) / HEAP_ALIGN * HEAP_ALIGN;
        at_end.max(below(tail))
    } else {
        below(tail - top)
    }
}

/// Bytes between the tail and the top, wrap gap included: `T − L` when `T ≥ L`, else
/// `N − L + T`.
pub fn occupied_bytes(size: u64, top: u64, tail: u64) -> u64 {
    if top >= tail { top - tail } else { size.saturating_sub(tail) + top }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = HEAP_ALIGN;

    #[test]
    fn an_unaligned_request_gets_no_placement() {
        for a in [1, K - 1, K + 1, 3 * K / 2] {
            assert_eq!(bump(4 * K, 0, 0, a), None, "{a} bytes placed");
            assert_eq!(bump(4 * K, K, 2 * K, a), None, "{a} bytes placed before the tail");
        }
        assert_eq!(bump(4 * K, 0, 0, K), Some(Placement { offset: 0, new_top: K }));
    }

    #[test]
    fn empty_ring_places_everything_up_to_its_size_at_zero() {
        for a in [K, 5 * K, 16 * K] {
            assert_eq!(bump(16 * K, 0, 0, a), Some(Placement { offset: 0, new_top: a }));
        }
        assert_eq!(bump(16 * K, 0, 0, 17 * K), None);
        assert_eq!(largest_fit(16 * K, 0, 0), 16 * K);
    }

    #[test]
    fn wrap_needs_strictly_more_room_than_the_request_before_the_tail() {
        // Live bytes [4K, 16K): the end is full; the front has 4K free.
        assert_eq!(
            bump(16 * K, 16 * K, 4 * K, 3 * K),
            Some(Placement { offset: 0, new_top: 3 * K })
        );
        assert_eq!(bump(16 * K, 16 * K, 4 * K, 4 * K), None);
        assert_eq!(largest_fit(16 * K, 16 * K, 4 * K), 3 * K);
    }

    #[test]
    fn wrapped_ring_fills_the_gap_before_the_tail_strictly() {
        assert_eq!(
            bump(16 * K, 2 * K, 8 * K, 5 * K),
            Some(Placement { offset: 2 * K, new_top: 7 * K })
        );
        assert_eq!(bump(16 * K, 2 * K, 8 * K, 6 * K), None);
        assert_eq!(largest_fit(16 * K, 2 * K, 8 * K), 5 * K);
        assert_eq!(occupied_bytes(16 * K, 2 * K, 8 * K), 10 * K);
    }

    #[test]
    fn zero_sized_requests_and_corrupt_cursors_are_never_placed() {
        assert_eq!(bump(16 * K, 0, 0, 0), None);
        assert_eq!(bump(16 * K, 17 * K, 0, K), None);
        assert_eq!(largest_fit(16 * K, 0, 17 * K), 0);
    }
}
