//! The producers of one buffer key: `(footprint, producer)` entries ordered by start (spec 20 §D).
//!
//! This module is the overlap algorithm on its own: no hashing, no runs, no locking. It is the
//! part a fixed-capacity device core (spec 20 Part C) reuses, so it keeps to plain slice
//! operations on one ordered list.
//!
//! # Representation and invariants
//!
//! 1. `entries` is sorted by `span.start` (ties in any order) and never holds an empty span.
//! 2. `max_len` equals the longest entry's length. A lookup for `[s, e)` can then skip every entry
//!    whose start is at most `s − max_len`, because such an entry ends at or before `s`; together
//!    with the sort order this bounds a lookup to a binary search plus the entries whose start
//!    lies in `(s − max_len, e)` (the *candidates*). Insert keeps `max_len` exact by taking a
//!    maximum: the entries it removes lie inside the new span, so none is longer than the new one.
//!    Owner-erase recomputes it from the survivors during the scan it already makes.
//! 3. An empty list is never stored: the map removes the key instead.
//!
//! The common key has one entry, held inline by the `SmallVec`, so a lookup is one overlap test
//! and an insert that rewrites the same bytes replaces the entry in place.

use std::cell::Cell;

use simpler_types::SlotId;
use smallvec::SmallVec;

use crate::ByteSpan;

/// At most this many candidates are deduplicated in place by comparing each with the ones
/// before it; more are collected into the map's reusable scratch buffer, sorted and deduplicated,
/// which keeps a fan-in lookup over many producers linear-logarithmic instead of quadratic.
const IN_PLACE_DEDUP_LIMIT: usize = 16;

/// One producer's claim on a byte range of a buffer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Entry {
    /// The bytes the producer writes; never empty.
    pub(crate) span: ByteSpan,
    /// The producing task's slot.
    pub(crate) slot: SlotId,
}

/// All live entries of one buffer key, ordered by start.
#[derive(Clone, Debug)]
pub(crate) struct FootprintList {
    entries: SmallVec<[Entry; 1]>,
    max_len: u64,
}

impl FootprintList {
    /// A list holding one entry. `span` must not be empty (the store filters empty spans).
    pub(crate) fn new(span: ByteSpan, slot: SlotId) -> FootprintList {
        debug_assert!(!span.is_empty(), "the store never inserts an empty span");
        let mut entries = SmallVec::new();
        entries.push(Entry { span, slot });
        FootprintList { entries, max_len: span.len() }
    }

    /// Number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// `true` when no entry is left; the store then drops the key.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries in start order.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Calls `visit` once for every distinct producer with an entry that overlaps `span`.
    ///
    /// `scratch` is borrowed by value (taken out of the cell and put back) only when more than
    /// [`IN_PLACE_DEDUP_LIMIT`] candidates need deduplication; its capacity is kept, so lookups
    /// allocate nothing once it has grown to the largest fan-in seen. Taking it out of the cell
    /// rather than borrowing it means a `visit` that re-enters a lookup on the same store finds
    /// an empty buffer instead of a conflicting borrow. The visiting order is unspecified.
    pub(crate) fn visit_overlapping(
        &self,
        span: ByteSpan,
        scratch: &Cell<Vec<SlotId>>,
        mut visit: impl FnMut(SlotId),
    ) {
        if let [only] = self.entries.as_slice() {
            if only.span.overlaps(span) {
                visit(only.slot);
            }
            return;
        }
        let candidates = &self.entries[self.candidate_range(span)];
        if candidates.len() <= IN_PLACE_DEDUP_LIMIT {
            for (i, entry) in candidates.iter().enumerate() {
                let seen =
                    |earlier: &Entry| earlier.slot == entry.slot && earlier.span.overlaps(span);
                if entry.span.overlaps(span) && !candidates[..i].iter().any(seen) {
                    visit(entry.slot);
                }
            }
            return;
        }
        let mut slots = scratch.take();
        slots.clear();
        slots.extend(candidates.iter().filter(|e| e.span.overlaps(span)).map(|e| e.slot));
        slots.sort_unstable();
        slots.dedup();
        for &slot in &slots {
            visit(slot);
        }
        slots.clear();
        scratch.set(slots);
    }

    /// Index range of the entries that may overlap `span` (invariant 2 of the module docs).
    fn candidate_range(&self, span: ByteSpan) -> std::ops::Range<usize> {
        // An entry can reach past `span.start` only if it starts after `span.start - max_len`.
        // `span.start < span.end <= u64::MAX`, so `span.start + 1` cannot overflow.
        let first_reaching = (span.start + 1).saturating_sub(self.max_len);
        let lo = self.entries.partition_point(|e| e.span.start < first_reaching);
        let hi = lo + self.entries[lo..].partition_point(|e| e.span.start < span.end);
        lo..hi
    }

    /// Adds `(span, slot)` after removing every entry that lies inside `span`; returns how many
    /// were removed (superseded). Entries that `span` only partly covers stay.
    ///
    /// Only entries starting at or after `span.start` can lie inside it, and they are contiguous
    /// in start order, so the scan touches the superseded entries and the partial overlaps that
    /// start inside `span`, nothing else.
    pub(crate) fn insert(&mut self, span: ByteSpan, slot: SlotId) -> usize {
        debug_assert!(!span.is_empty(), "the store never inserts an empty span");
        let new = Entry { span, slot };
        let lo = self.entries.partition_point(|e| e.span.start < span.start);
        // Compact the survivors of `lo..` that start inside `span` towards `lo`.
        let mut write = lo;
        let mut read = lo;
        while let Some(&entry) = self.entries.get(read) {
            if entry.span.start >= span.end {
                break;
            }
            if !span.contains(entry.span) {
                self.entries[write] = entry;
                write += 1;
            }
            read += 1;
        }
        let superseded = read - write;
        if superseded > 0 && write == lo {
            // Every entry starting inside `span` was superseded (the rewrite case): the new entry
            // takes the first vacated place, which keeps the start order.
            self.entries[lo] = new;
            self.entries.drain(lo + 1..read);
        } else {
            self.entries.drain(write..read);
            // Survivors in `lo..write` start at or after `span.start`, so `lo` keeps the order.
            self.entries.insert(lo, new);
        }
        self.max_len = self.max_len.max(span.len());
        superseded
    }

    /// Removes every entry produced by `owner`; returns how many were removed.
    pub(crate) fn remove_owned(&mut self, owner: SlotId) -> usize {
        let before = self.entries.len();
        self.entries.retain(|e| e.slot != owner);
        let removed = before - self.entries.len();
        if removed > 0 {
            self.max_len = self.entries.iter().map(|e| e.span.len()).max().unwrap_or(0);
        }
        removed
    }

    /// Checks the representation invariants of the module docs; used by tests.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        if self.entries.is_empty() {
            return Err("stored list is empty".into());
        }
        if let Some(e) = self.entries.iter().find(|e| e.span.is_empty()) {
            return Err(format!("empty span stored: {e:?}"));
        }
        if self.entries.windows(2).any(|w| w[0].span.start > w[1].span.start) {
            return Err(format!("entries out of start order: {:?}", self.entries));
        }
        let longest = self.entries.iter().map(|e| e.span.len()).max().unwrap_or(0);
        if longest != self.max_len {
            return Err(format!("max_len {} but longest entry {longest}", self.max_len));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: u64, end: u64) -> ByteSpan {
        ByteSpan::new(start, end).unwrap()
    }

    fn slot(i: u32) -> SlotId {
        SlotId::new(i, 1)
    }

    fn visited(list: &FootprintList, s: ByteSpan) -> Vec<SlotId> {
        let scratch = Cell::new(Vec::new());
        let mut out = Vec::new();
        list.visit_overlapping(s, &scratch, |p| out.push(p));
        out.sort_unstable();
        out
    }

    #[test]
    fn rewrite_of_the_same_bytes_replaces_in_place() {
        let mut list = FootprintList::new(span(0, 8), slot(1));
        assert_eq!(list.insert(span(0, 8), slot(2)), 1);
        assert_eq!(list.entries(), &[Entry { span: span(0, 8), slot: slot(2) }]);
        list.check_invariants().unwrap();
    }

    #[test]
    fn partial_overlaps_survive_and_order_is_kept() {
        let mut list = FootprintList::new(span(4, 12), slot(1));
        assert_eq!(list.insert(span(0, 8), slot(2)), 0);
        assert_eq!(list.insert(span(10, 20), slot(3)), 0);
        assert_eq!(list.insert(span(6, 7), slot(4)), 0);
        let starts: Vec<u64> = list.entries().iter().map(|e| e.span.start).collect();
        assert_eq!(starts, [0, 4, 6, 10]);
        // [3, 12) contains only [4, 12) and [6, 7).
        assert_eq!(list.insert(span(3, 12), slot(5)), 2);
        let kept: Vec<_> = list.entries().iter().map(|e| (e.span, e.slot)).collect();
        assert_eq!(kept, [(span(0, 8), slot(2)), (span(3, 12), slot(5)), (span(10, 20), slot(3))]);
        list.check_invariants().unwrap();
    }

    #[test]
    fn lookup_skips_entries_that_end_before_the_span_even_when_a_long_one_exists() {
        let mut list = FootprintList::new(span(0, 1000), slot(1));
        for i in 0..40 {
            list.insert(span(1000 + i, 1001 + i), slot(10 + i as u32));
        }
        assert_eq!(visited(&list, span(500, 501)), [slot(1)]);
        assert_eq!(visited(&list, span(1005, 1007)), [slot(15), slot(16)]);
        let all = visited(&list, ByteSpan::ALL);
        assert_eq!(all.len(), 41);
    }

    #[test]
    fn a_producer_with_several_entries_is_visited_once_for_small_and_large_fan_ins() {
        for n in [3_u64, 40] {
            let mut list = FootprintList::new(span(0, 1), slot(7));
            for i in 1..n {
                // Every third byte belongs to slot 7, the rest to distinct slots.
                let owner = if i % 3 == 0 { slot(7) } else { slot(100 + i as u32) };
                list.insert(span(i, i + 1), owner);
            }
            let seen = visited(&list, span(0, n));
            let mut unique = seen.clone();
            unique.dedup();
            assert_eq!(seen, unique, "n = {n}");
            assert!(seen.contains(&slot(7)));
        }
    }

    #[test]
    fn remove_owned_recomputes_the_longest_length() {
        let mut list = FootprintList::new(span(0, 100), slot(1));
        list.insert(span(200, 201), slot(2));
        list.insert(span(300, 302), slot(1));
        assert_eq!(list.remove_owned(slot(1)), 2);
        assert_eq!(list.remove_owned(slot(1)), 0);
        list.check_invariants().unwrap();
        assert_eq!(visited(&list, span(150, 250)), [slot(2)]);
    }
}
