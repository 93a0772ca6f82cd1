//! The producers of one buffer key: `(footprint, producer)` entries ordered by start
//! (`docs/tensormap.md` §4).
//!
//! This module is the overlap algorithm on its own: no runs, no keys, no locking. It is the part
//! a fixed-capacity device core reuses; only the owner index of large lists
//! (below) uses a hash map, which a fixed core would replace by a fixed table.
//!
//! # Two modes
//!
//! **Plain** (at most [`INDEX_AT`] entries, the normal case): `entries` sorted by start, every
//! entry live. A lookup scans the entries that start before the span ends; an insert compacts
//! away the entries it supersedes; an owner-erase is a `retain`. A key with one entry is held
//! inline by the `SmallVec`: a lookup is one overlap test, and an insert that rewrites the same
//! bytes replaces the entry in place.
//!
//! **Indexed** (a list that grew past [`INDEX_AT`] entries: a fan-in buffer written slice by
//! slice, the fan-in benchmark P3). Scanning or shifting the whole list per operation would make a
//! fan-in of k slices cost O(k²), so the list gains an [`OwnerIndex`]:
//!
//! 1. `entries` stays sorted by start but may hold **dead** entries: an erased entry is killed in
//!    place by emptying its span (`end = start`), which keeps the order without shifting anything.
//!    Empty spans overlap nothing, so lookups skip dead entries for free.
//! 2. `starts[owner]` lists the start of each live entry of `owner` (in `entries` or `long`), so
//!    an owner-erase finds its entries by binary search instead of a scan. Each start carries
//!    the position the entry was placed at, a hint: an erase that finds the owner's live entry
//!    of that start there kills it without searching. Entries move only when the list shifts
//!    (an insertion before them, a compaction), after which the erase checks the hint, misses
//!    and searches; a fan-out of readers appended to one span, which would otherwise walk the
//!    dead entries of its finished readers on every erase, keeps its hints valid.
//! 3. `max_len` is at least the length of every live entry in `entries`. A lookup for `[s, e)`
//!    then scans only the entries whose start lies in `(s − max_len, e)` (the *candidates*): an
//!    entry starting at or before `s − max_len` ends at or before `s`.
//! 4. `long` holds up to [`LONG_CAP`] live entries that are not in `entries`, unordered, and every
//!    lookup tests all of them. An entry longer than `max_len` goes there while there is room, so
//!    a few long entries (a whole-buffer writer next to a fan-in of slices) do not stretch
//!    `max_len` and turn every lookup into a scan of the whole list. Only when `long` is full does
//!    a longer entry raise `max_len`. Which list an entry is in affects speed, never results.
//! 5. `shared_owners` counts owners with two or more live entries (over both lists). While it is
//!    0 no producer can be met twice, and a lookup visits candidates without deduplicating.
//! 6. When dead entries outnumber live ones the list is compacted (amortized O(1) per erase).
//! 7. An indexed list always holds more than [`UNINDEX_AT`] live entries: an insert that
//!    supersedes entries, or an erase, that leaves [`UNINDEX_AT`] or fewer drops the index, the
//!    dead entries and `long` (whose entries go back into `entries`), and the list is plain
//!    again. The index, emptied, goes to the store's [`IndexSpares`] and the entry buffer stays
//!    with the list (both unless oversized), so a buffer fanned in again and again allocates
//!    nothing once the store has seen its fan-in. The gap between the two thresholds keeps a
//!    list near the boundary from flapping.
//!    Because of this, a list with one entry is always plain, and the one-entry shortcuts of
//!    insert and erase (which keep no index up to date) never meet an indexed list.
//!
//! An empty list (no live entry) is never stored: the store removes the key instead.

use std::cell::Cell;

use rustc_hash::FxHashMap;
use simpler_types::SlotId;
use smallvec::SmallVec;

use crate::ByteSpan;
use crate::entry::{Covered, Entry, Superseded};

/// A list with more entries than this builds an owner index.
const INDEX_AT: usize = 32;

/// An indexed list left with this many live entries or fewer drops its index.
const UNINDEX_AT: usize = 8;

/// Most entries an indexed list keeps out of its `max_len` bound (module docs, item 4). Every
/// lookup tests them all, so the number stays small; four covers a whole-buffer initializer and
/// a few wide readers-turned-writers next to a fan-in.
const LONG_CAP: usize = 4;

/// Most owner indexes a store keeps for reuse once their lists no longer need them.
const MAX_SPARES: usize = 4;

/// An owner index whose table had room for more owners than this is freed rather than kept
/// for reuse, and a list leaving indexed mode frees an entry buffer larger than this (128 KiB):
/// a store keeps what a fan-in of this size needs, not what its largest fan-in ever needed.
const RETAINED_CAPACITY: usize = 1 << 12;

/// At most this many candidates are deduplicated in place by comparing each with the ones before
/// it; more are collected into the store's reusable scratch buffer, sorted and deduplicated.
const IN_PLACE_DEDUP_LIMIT: usize = 16;

/// All entries of one buffer key, ordered by start. The default value (no entry) only fills
/// unused slab slots; it is never stored under a key.
#[derive(Clone, Debug, Default)]
pub(crate) struct FootprintList {
    entries: SmallVec<[Entry; 1]>,
    /// Present in indexed mode only (see the module docs).
    index: Option<Box<OwnerIndex>>,
    /// Plain mode: `false` only while no task owns two live entries, so a lookup need not
    /// deduplicate (a key read by many tasks is scanned once instead of pairwise). Set when an
    /// entry joins another of its task, cleared when the list empties.
    repeats: bool,
}

/// Where an indexed list placed one live entry of an owner (module docs, item 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mark {
    /// The entry's start.
    start: u64,
    /// Its position in `entries` when placed ([`NOT_PLACED`] for an entry of `long`); a hint
    /// only, checked before use.
    at: u32,
}

/// [`Mark::at`] of an entry kept in `long`, or placed past `u32::MAX`.
const NOT_PLACED: u32 = u32::MAX;

fn position(at: usize) -> u32 {
    u32::try_from(at).unwrap_or(NOT_PLACED)
}

/// Bookkeeping of an indexed list (module docs, items 2–5).
#[derive(Clone, Debug, Default)]
struct OwnerIndex {
    /// Starts of every live entry, per owner, with their placement hints.
    starts: FxHashMap<SlotId, SmallVec<[Mark; 1]>>,
    /// Owners with two or more live entries.
    shared_owners: usize,
    /// Dead entries in the list.
    dead: usize,
    /// At least the length of every live entry in `entries`.
    max_len: u64,
    /// Live entries kept out of `entries` and its `max_len`, unordered.
    long: SmallVec<[Entry; LONG_CAP]>,
}

/// Owner indexes that lists left behind, kept for the next list that needs one, so that a
/// buffer fanned in and out again and again (one per diamond of the benchmark P3) builds its
/// index without allocating once the store has seen that fan-in.
#[derive(Debug, Default)]
pub(crate) struct IndexSpares {
    #[expect(
        clippy::vec_box,
        reason = "a list holds its index boxed: the boxes are what is reused"
    )]
    spares: Vec<Box<OwnerIndex>>,
}

impl IndexSpares {
    /// An empty index, reused when one is spare.
    fn take(&mut self) -> Box<OwnerIndex> {
        self.spares.pop().unwrap_or_default()
    }

    /// Keeps `index`, emptied, unless enough are kept already or its table is oversized.
    fn give(&mut self, mut index: Box<OwnerIndex>) {
        if self.spares.len() < MAX_SPARES && index.starts.capacity() <= RETAINED_CAPACITY {
            index.starts.clear();
            index.long.clear();
            index.shared_owners = 0;
            index.dead = 0;
            index.max_len = 0;
            self.spares.push(index);
        }
    }

    /// Number of indexes kept; used by tests.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.spares.len()
    }
}

impl OwnerIndex {
    fn remember(&mut self, owner: SlotId, start: u64, at: u32) {
        let starts = self.starts.entry(owner).or_default();
        starts.push(Mark { start, at });
        if starts.len() == 2 {
            self.shared_owners += 1;
        }
    }

    fn forget(&mut self, owner: SlotId, start: u64) {
        // One probe: the entry is looked up once and removed through the same handle.
        let std::collections::hash_map::Entry::Occupied(mut starts) = self.starts.entry(owner)
        else {
            debug_assert!(false, "{owner} has a live entry but no index record");
            return;
        };
        let marks = starts.get_mut();
        if let Some(at) = marks.iter().position(|m| m.start == start) {
            marks.swap_remove(at);
        }
        match marks.len() {
            0 => {
                starts.remove();
            }
            1 => self.shared_owners -= 1,
            _ => {}
        }
    }

    /// Removes the entries of `long` that `span` contains.
    fn supersede_long(&mut self, span: ByteSpan, covered: Covered) -> Superseded {
        let mut superseded = Superseded::default();
        let mut i = 0;
        while let Some(&entry) = self.long.get(i) {
            if covered.takes(span, &entry) {
                self.long.swap_remove(i);
                self.forget(entry.slot, entry.span.start);
                superseded.take(&entry);
            } else {
                i += 1;
            }
        }
        superseded
    }
}

impl FootprintList {
    /// A list holding one entry. Its span must not be empty (the store filters empty spans).
    pub(crate) fn new(entry: Entry) -> FootprintList {
        debug_assert!(!entry.span.is_empty(), "the store never inserts an empty span");
        FootprintList { entries: SmallVec::from_buf([entry]), index: None, repeats: false }
    }

    /// Number of live entries.
    pub(crate) fn len(&self) -> usize {
        match &self.index {
            None => self.entries.len(),
            Some(index) => self.entries.len() - index.dead + index.long.len(),
        }
    }

    /// `true` when no live entry is left; the store then drops the key.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The live entries in start order.
    #[cfg(test)]
    pub(crate) fn live_entries(&self) -> Vec<Entry> {
        let mut live: Vec<Entry> = self.entries.iter().filter(|e| !e.is_dead()).copied().collect();
        live.extend(self.index.iter().flat_map(|index| index.long.iter().copied()));
        live.sort_by_key(|e| e.span.start);
        live
    }

    /// Calls `visit` once for every distinct producer with an entry that overlaps `span`.
    ///
    /// `scratch` is taken out of its cell and put back, and only when more than
    /// [`IN_PLACE_DEDUP_LIMIT`] candidates, or candidates and long entries together, need
    /// deduplication; its capacity is kept, so lookups allocate nothing once it has grown to the
    /// largest fan-in seen. Taking it rather than borrowing it means a `visit` that re-enters a
    /// lookup on the same store finds an empty buffer instead of a conflicting borrow. The
    /// visiting order is unspecified.
    #[inline]
    pub(crate) fn visit_overlapping(
        &self,
        span: ByteSpan,
        keep: impl Fn(&Entry) -> bool + Copy,
        scratch: &Cell<Vec<SlotId>>,
        mut visit: impl FnMut(SlotId),
    ) {
        let Some(index) = &self.index else {
            if let [only] = self.entries.as_slice() {
                if only.span.overlaps(span) && keep(only) {
                    visit(only.slot);
                }
                return;
            }
            let end = self.entries.partition_point(|e| e.span.start < span.end);
            if !self.repeats {
                for entry in self.entries[..end].iter().filter(|e| e.span.overlaps(span) && keep(e))
                {
                    visit(entry.slot);
                }
                return;
            }
            return visit_dedup_in_place(&self.entries[..end], span, keep, visit);
        };
        let candidates = &self.entries[self.candidate_range(span, index.max_len)];
        let overlapping = |e: &&Entry| e.span.overlaps(span) && keep(e);
        if index.shared_owners == 0 {
            // Every owner has one live entry, so no producer can come up twice. Two loops rather
            // than a chained iterator keep the candidate loop as tight as without `long`.
            for entry in index.long.iter().filter(overlapping) {
                visit(entry.slot);
            }
            for entry in candidates.iter().filter(overlapping) {
                visit(entry.slot);
            }
        } else if index.long.is_empty() && candidates.len() <= IN_PLACE_DEDUP_LIMIT {
            visit_dedup_in_place(candidates, span, keep, visit);
        } else {
            let mut slots = scratch.take();
            slots.clear();
            slots.extend(index.long.iter().chain(candidates).filter(overlapping).map(|e| e.slot));
            slots.sort_unstable();
            slots.dedup();
            for &slot in &slots {
                visit(slot);
            }
            slots.clear();
            scratch.set(slots);
        }
    }

    /// Index range of the entries that may overlap `span` (module docs, item 3).
    fn candidate_range(&self, span: ByteSpan, max_len: u64) -> std::ops::Range<usize> {
        // `span.start < span.end <= u64::MAX`, so `span.start + 1` cannot overflow.
        let first_reaching = (span.start + 1).saturating_sub(max_len);
        let lo = self.entries.partition_point(|e| e.span.start < first_reaching);
        let hi = lo + self.entries[lo..].partition_point(|e| e.span.start < span.end);
        lo..hi
    }

    /// Adds `new` after removing every live entry that lies inside its span, and returns what
    /// was removed (superseded). Entries that the span only partly covers stay. If a removed
    /// entry ordered later writes, `new` takes that duty over (its `orders_writes` is set), so
    /// that supersession never lets a later write skip an earlier reader.
    pub(crate) fn insert(&mut self, new: Entry, spares: &mut IndexSpares) -> Superseded {
        debug_assert!(!new.span.is_empty(), "the store never inserts an empty span");
        self.replace(new.span, Some(new), Covered::All, spares)
    }

    /// Inserts `new`, superseding only the covered entries that order later writes (those a
    /// scatter write found and ordered after), and returns what was removed.
    pub(crate) fn insert_over_ordering(
        &mut self,
        new: Entry,
        spares: &mut IndexSpares,
    ) -> Superseded {
        debug_assert!(!new.span.is_empty(), "the store never inserts an empty span");
        self.replace(new.span, Some(new), Covered::OrderingWrites, spares)
    }

    /// Removes every live entry that lies inside `span`, and returns what was removed.
    #[inline]
    pub(crate) fn supersede(&mut self, span: ByteSpan, spares: &mut IndexSpares) -> Superseded {
        if self.entries.is_empty() && self.index.is_none() {
            // The usual reader list of a written buffer: nobody reads it.
            return Superseded::default();
        }
        self.replace(span, None, Covered::All, spares)
    }

    /// Adds `new` without superseding anything: readers of the same bytes stay side by side.
    pub(crate) fn add(&mut self, new: Entry, spares: &mut IndexSpares) {
        debug_assert!(!new.span.is_empty(), "the store never inserts an empty span");
        if let Some(index) = &mut self.index {
            if new.span.len() > index.max_len && index.long.len() < LONG_CAP {
                index.remember(new.slot, new.span.start, NOT_PLACED);
                index.long.push(new);
                return;
            }
            index.max_len = index.max_len.max(new.span.len());
        }
        // After the entries with the same start, so that readers of one span (a fan-out over
        // one buffer) append instead of shifting the whole list each time.
        let at = self.entries.partition_point(|e| e.span.start <= new.span.start);
        let placed = self.place(at, new);
        if let Some(index) = &mut self.index {
            index.remember(new.slot, new.span.start, position(placed));
        } else {
            self.note_repeat(new.slot);
            if self.entries.len() > INDEX_AT {
                self.build_index(spares);
            }
        }
    }

    /// Plain mode: records whether `slot`, just placed, now owns two entries.
    fn note_repeat(&mut self, slot: SlotId) {
        if !self.repeats {
            self.repeats = self.entries.iter().filter(|e| e.slot == slot).nth(1).is_some();
        }
    }

    /// Removes the live entries inside `span` that `covered` takes, then adds `new` if given.
    ///
    /// Only entries starting at or after `span.start` can lie inside it, and they are contiguous
    /// in start order, so the scan touches the superseded entries and the partial overlaps that
    /// start inside `span`, nothing else (plus the few `long` entries of an indexed list). Dead
    /// entries met on the way are dropped for free.
    fn replace(
        &mut self,
        span: ByteSpan,
        new: Option<Entry>,
        covered: Covered,
        spares: &mut IndexSpares,
    ) -> Superseded {
        if self.index.is_none()
            && let [only] = self.entries.as_mut_slice()
            && covered.takes(span, only)
        {
            // The common rewrite of one key's only entry (an `InOut` chain), without the scan.
            // Only a plain list may take it: it updates no owner index (module docs, item 7).
            let old = *only;
            match new {
                Some(mut new) => {
                    new.orders_writes |= old.orders_writes;
                    *only = new;
                }
                None => {
                    self.entries.clear();
                    self.repeats = false;
                }
            }
            return Superseded { count: 1, orders_writes: old.orders_writes };
        }
        let lo = self.entries.partition_point(|e| e.span.start < span.start);
        // Compact the survivors of `lo..` that start inside `span` towards `lo`.
        let mut write = lo;
        let mut read = lo;
        let mut superseded = Superseded::default();
        while let Some(&entry) = self.entries.get(read) {
            if entry.span.start >= span.end {
                break;
            }
            read += 1;
            if let Some(index) = &mut self.index {
                if entry.is_dead() {
                    index.dead -= 1;
                    continue;
                }
                if covered.takes(span, &entry) {
                    index.forget(entry.slot, entry.span.start);
                }
            }
            if covered.takes(span, &entry) {
                superseded.take(&entry);
            } else {
                self.entries[write] = entry;
                write += 1;
            }
        }
        if let Some(index) = &mut self.index {
            superseded.merge(index.supersede_long(span, covered));
        }
        let Some(mut new) = new else {
            self.entries.drain(write..read);
            if self.index.is_some() && self.len() <= UNINDEX_AT {
                self.drop_index(spares);
            }
            if self.entries.is_empty() {
                self.repeats = false;
            }
            return superseded;
        };
        new.orders_writes |= superseded.orders_writes;
        // An indexed list keeps an entry longer than `max_len` out of `entries` while `long`
        // has room (module docs, item 4).
        let goes_long = self.index.as_mut().is_some_and(|index| {
            let long = span.len() > index.max_len && index.long.len() < LONG_CAP;
            if long {
                index.long.push(new);
            }
            long
        });
        let placed = if goes_long {
            self.entries.drain(write..read);
            NOT_PLACED
        } else if read > write && write == lo {
            // Every entry starting inside `span` went away (the rewrite case): the new entry
            // takes the first vacated place, which keeps the start order.
            self.entries[lo] = new;
            self.entries.drain(lo + 1..read);
            position(lo)
        } else {
            self.entries.drain(write..read);
            position(self.place(lo, new))
        };
        match &mut self.index {
            Some(index) => {
                index.remember(new.slot, span.start, placed);
                if !goes_long {
                    index.max_len = index.max_len.max(span.len());
                }
                if self.len() <= UNINDEX_AT {
                    // Supersession shrank the list (module docs, item 7).
                    self.drop_index(spares);
                }
            }
            None => {
                self.note_repeat(new.slot);
                if self.entries.len() > INDEX_AT {
                    self.build_index(spares);
                }
            }
        }
        superseded
    }

    /// Puts `new` at `at`, where every entry before `at` starts at or before it and every entry
    /// from `at` on starts at or after it, and returns where it went.
    fn place(&mut self, at: usize, new: Entry) -> usize {
        // A dead entry just before `at` can be overwritten: it starts before `new`, and so does
        // everything before it, so the order holds without shifting the tail.
        if let Some(index) = &mut self.index
            && at > 0
            && self.entries[at - 1].is_dead()
        {
            self.entries[at - 1] = new;
            index.dead -= 1;
            return at - 1;
        }
        self.entries.insert(at, new);
        at
    }

    /// Switches a plain list that just outgrew [`INDEX_AT`] to indexed mode. The [`LONG_CAP`]
    /// longest entries go to `long` if they are longer than all the others; `max_len` bounds
    /// the rest.
    #[cold]
    fn build_index(&mut self, spares: &mut IndexSpares) {
        let mut index = spares.take();
        index.starts.reserve(self.entries.len() * 2);
        // The `LONG_CAP + 1` greatest lengths, greatest first; a plain list that outgrew
        // `INDEX_AT` holds more than `LONG_CAP` entries, so the last is the bound of the rest.
        let mut greatest = [0u64; LONG_CAP + 1];
        for len in self.entries.iter().map(|e| e.span.len()) {
            let mut at = LONG_CAP;
            if len <= greatest[at] {
                continue;
            }
            while at > 0 && greatest[at - 1] < len {
                greatest[at] = greatest[at - 1];
                at -= 1;
            }
            greatest[at] = len;
        }
        index.max_len = greatest[LONG_CAP];
        let max_len = index.max_len;
        for entry in self.entries.iter().filter(|e| e.span.len() > max_len) {
            index.remember(entry.slot, entry.span.start, NOT_PLACED);
            index.long.push(*entry);
        }
        self.entries.retain(|e| e.span.len() <= max_len);
        for (at, entry) in self.entries.iter().enumerate() {
            index.remember(entry.slot, entry.span.start, position(at));
        }
        self.index = Some(index);
    }

    /// Removes every live entry produced by `owner`; returns how many were removed.
    pub(crate) fn remove_owned(&mut self, owner: SlotId, spares: &mut IndexSpares) -> usize {
        let Some(index) = &mut self.index else {
            if let [only] = self.entries.as_slice() {
                // The common case of a key with one entry, without `retain`'s bookkeeping.
                let owned = only.slot == owner;
                if owned {
                    self.entries.clear();
                    self.repeats = false;
                }
                return usize::from(owned);
            }
            let before = self.entries.len();
            self.entries.retain(|e| e.slot != owner);
            if self.entries.len() <= 1 {
                self.repeats = false;
            }
            return before - self.entries.len();
        };
        let Some(starts) = index.starts.remove(&owner) else {
            return 0;
        };
        if starts.len() >= 2 {
            index.shared_owners -= 1;
        }
        for &Mark { start, at } in &starts {
            let owned = |e: &Entry| e.slot == owner && e.span.start == start && !e.is_dead();
            let hinted = self.entries.get(at as usize).is_some_and(owned);
            let victim = if hinted {
                self.entries.get_mut(at as usize)
            } else {
                let from = self.entries.partition_point(|e| e.span.start < start);
                self.entries[from..]
                    .iter_mut()
                    .take_while(|e| e.span.start == start)
                    .find(|e| owned(e))
            };
            if let Some(entry) = victim {
                entry.span.end = entry.span.start;
                index.dead += 1;
            } else if let Some(at) =
                index.long.iter().position(|e| e.slot == owner && e.span.start == start)
            {
                index.long.swap_remove(at);
            } else {
                debug_assert!(false, "index names a start of {owner} with no live entry");
            }
        }
        let live = self.entries.len() - index.dead;
        let mostly_dead = index.dead > live;
        if live + index.long.len() <= UNINDEX_AT {
            self.drop_index(spares);
        } else if mostly_dead {
            self.compact();
        }
        starts.len()
    }

    /// Drops the dead entries of an indexed list and recomputes `max_len`.
    #[cold]
    fn compact(&mut self) {
        self.entries.retain(|e| !e.is_dead());
        let max_len = self.entries.iter().map(|e| e.span.len()).max().unwrap_or(0);
        if let Some(index) = &mut self.index {
            index.dead = 0;
            index.max_len = max_len;
        }
    }

    /// Leaves indexed mode: a list down to [`UNINDEX_AT`] live entries (module docs, item 7).
    /// The index goes to `spares`, and the entry buffer is kept unless it is oversized, so a
    /// list that fans in again reuses both.
    #[cold]
    fn drop_index(&mut self, spares: &mut IndexSpares) {
        self.entries.retain(|e| !e.is_dead());
        if let Some(index) = self.index.take() {
            self.repeats = index.shared_owners > 0;
            for &entry in &index.long {
                let at = self.entries.partition_point(|e| e.span.start <= entry.span.start);
                self.entries.insert(at, entry);
            }
            spares.give(index);
        }
        if self.entries.capacity() > RETAINED_CAPACITY {
            self.entries.shrink_to_fit();
        }
    }

    /// Checks the representation invariants of the module docs; used by tests.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        if self.entries.windows(2).any(|w| w[0].span.start > w[1].span.start) {
            return Err(format!("entries out of start order: {:?}", self.entries));
        }
        let dead = self.entries.iter().filter(|e| e.is_dead()).count();
        let Some(index) = &self.index else {
            if dead > 0 {
                return Err(format!("plain list holds {dead} dead entries"));
            }
            if self.entries.len() > INDEX_AT {
                return Err(format!("plain list holds {} entries", self.entries.len()));
            }
            let repeated =
                |(i, e): (usize, &Entry)| self.entries[..i].iter().any(|o| o.slot == e.slot);
            if !self.repeats && self.entries.iter().enumerate().any(repeated) {
                return Err(format!(
                    "a task owns two entries but repeats is unset: {:?}",
                    self.entries
                ));
            }
            return Ok(());
        };
        if self.len() <= UNINDEX_AT {
            return Err(format!("indexed list holds only {} live entries", self.len()));
        }
        if dead != index.dead {
            return Err(format!("index counts {} dead entries, list holds {dead}", index.dead));
        }
        if let Some(e) = self.entries.iter().find(|e| e.span.len() > index.max_len) {
            return Err(format!("entry {e:?} is longer than max_len {}", index.max_len));
        }
        if index.long.len() > LONG_CAP || index.long.iter().any(|e| e.is_dead()) {
            return Err(format!("long entries {:?} over capacity or dead", index.long));
        }
        let mut expected: FxHashMap<SlotId, Vec<u64>> = FxHashMap::default();
        for e in self.entries.iter().filter(|e| !e.is_dead()).chain(&index.long) {
            expected.entry(e.slot).or_default().push(e.span.start);
        }
        let mut actual: FxHashMap<SlotId, Vec<u64>> =
            index.starts.iter().map(|(s, v)| (*s, v.iter().map(|m| m.start).collect())).collect();
        for v in expected.values_mut().chain(actual.values_mut()) {
            v.sort_unstable();
        }
        if expected != actual {
            return Err(format!("owner index {actual:?} but live entries give {expected:?}"));
        }
        let shared = expected.values().filter(|v| v.len() >= 2).count();
        if shared != index.shared_owners {
            return Err(format!(
                "index counts {} shared owners, not {shared}",
                index.shared_owners
            ));
        }
        Ok(())
    }
}

/// Visits the distinct producers among `candidates` that overlap `span`, comparing each with the
/// ones before it (for short candidate lists only).
fn visit_dedup_in_place(
    candidates: &[Entry],
    span: ByteSpan,
    keep: impl Fn(&Entry) -> bool,
    mut visit: impl FnMut(SlotId),
) {
    let wanted = |e: &Entry| e.span.overlaps(span) && keep(e);
    for (i, entry) in candidates.iter().enumerate() {
        let seen = |earlier: &Entry| earlier.slot == entry.slot && wanted(earlier);
        if wanted(entry) && !candidates[..i].iter().any(seen) {
            visit(entry.slot);
        }
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

    fn writer(span: ByteSpan, slot: SlotId) -> Entry {
        Entry { span, slot, orders_writes: false }
    }

    fn visited(list: &FootprintList, s: ByteSpan) -> Vec<SlotId> {
        let scratch = Cell::new(Vec::new());
        let mut out = Vec::new();
        list.visit_overlapping(s, |_| true, &scratch, |p| out.push(p));
        out.sort_unstable();
        out
    }

    /// A list of `n` one-byte entries at 0..n, entry `i` produced by `owner(i)`.
    fn bytes(n: u64, owner: impl Fn(u64) -> SlotId) -> FootprintList {
        let mut list = FootprintList::new(writer(span(0, 1), owner(0)));
        for i in 1..n {
            list.insert(writer(span(i, i + 1), owner(i)), &mut IndexSpares::default());
        }
        list
    }

    #[test]
    fn a_list_fanned_in_again_reuses_the_index_and_the_buffer_it_left() {
        // Readers of one buffer: a fan-out past `INDEX_AT`, retired, then again.
        let mut spares = IndexSpares::default();
        let reader =
            |i: u64| Entry { span: span(0, 64), slot: slot(i as u32), orders_writes: true };
        let mut list = FootprintList::new(reader(0));
        let fan_out = |list: &mut FootprintList, spares: &mut IndexSpares| {
            for i in 1..=INDEX_AT as u64 * 4 {
                list.add(reader(i), spares);
            }
            list.check_invariants().unwrap();
            let index = list.index.as_deref().map(std::ptr::from_ref).expect("indexed");
            let buffer = list.entries.as_ptr();
            for i in 1..=INDEX_AT as u64 * 4 {
                assert_eq!(list.remove_owned(slot(i as u32), spares), 1);
            }
            list.check_invariants().unwrap();
            assert!(list.index.is_none(), "back to a plain list");
            (index, buffer)
        };
        let (first_index, first_buffer) = fan_out(&mut list, &mut spares);
        assert_eq!(spares.len(), 1, "the index was kept");
        let (second_index, second_buffer) = fan_out(&mut list, &mut spares);
        assert_eq!(first_index, second_index, "the kept index was reused");
        assert_eq!(first_buffer, second_buffer, "the entry buffer was kept");
        assert_eq!(spares.len(), 1);
        assert_eq!(list.live_entries(), [reader(0)]);
    }

    #[test]
    fn rewrite_of_the_same_bytes_replaces_in_place() {
        let mut list = FootprintList::new(writer(span(0, 8), slot(1)));
        assert_eq!(list.insert(writer(span(0, 8), slot(2)), &mut IndexSpares::default()).count, 1);
        assert_eq!(list.live_entries(), [writer(span(0, 8), slot(2))]);
        list.check_invariants().unwrap();
    }

    #[test]
    fn partial_overlaps_survive_and_order_is_kept() {
        let mut list = FootprintList::new(writer(span(4, 12), slot(1)));
        assert_eq!(list.insert(writer(span(0, 8), slot(2)), &mut IndexSpares::default()).count, 0);
        assert_eq!(
            list.insert(writer(span(10, 20), slot(3)), &mut IndexSpares::default()).count,
            0
        );
        assert_eq!(list.insert(writer(span(6, 7), slot(4)), &mut IndexSpares::default()).count, 0);
        let starts: Vec<u64> = list.live_entries().iter().map(|e| e.span.start).collect();
        assert_eq!(starts, [0, 4, 6, 10]);
        // [3, 12) contains only [4, 12) and [6, 7).
        assert_eq!(list.insert(writer(span(3, 12), slot(5)), &mut IndexSpares::default()).count, 2);
        let kept: Vec<_> = list.live_entries().iter().map(|e| (e.span, e.slot)).collect();
        assert_eq!(kept, [(span(0, 8), slot(2)), (span(3, 12), slot(5)), (span(10, 20), slot(3))]);
        list.check_invariants().unwrap();
    }

    #[test]
    fn a_list_that_outgrows_the_threshold_is_indexed_and_shrinks_back() {
        let mut list = bytes(INDEX_AT as u64 + 1, |i| slot(i as u32));
        assert!(list.index.is_some());
        list.check_invariants().unwrap();
        for i in 0..INDEX_AT as u32 - 2 {
            assert_eq!(list.remove_owned(slot(i), &mut IndexSpares::default()), 1);
            list.check_invariants().unwrap();
        }
        assert!(list.index.is_none(), "three live entries left: plain again");
        assert_eq!(list.len(), 3);
    }

    #[test]
    fn a_fan_in_superseded_down_to_few_entries_is_plain_again_and_rewritable_in_place() {
        let mut list = bytes(40, |i| slot(i as u32));
        assert!(list.index.is_some());
        // Three slices survive a write over the first 37 bytes: four live entries.
        assert_eq!(
            list.insert(writer(span(0, 37), slot(100)), &mut IndexSpares::default()).count,
            37
        );
        assert!(list.index.is_none(), "four live entries: plain again");
        list.check_invariants().unwrap();
        assert_eq!(
            list.insert(writer(span(0, 40), slot(101)), &mut IndexSpares::default()).count,
            4
        );
        assert_eq!(
            list.insert(writer(span(0, 1000), slot(102)), &mut IndexSpares::default()).count,
            1,
            "the one-entry rewrite"
        );
        list.check_invariants().unwrap();
        assert_eq!(visited(&list, span(500, 501)), [slot(102)]);
        assert_eq!(list.remove_owned(slot(101), &mut IndexSpares::default()), 0);
        assert_eq!(list.remove_owned(slot(102), &mut IndexSpares::default()), 1);
        assert!(list.is_empty());
    }

    #[test]
    fn an_indexed_list_erased_down_to_the_threshold_is_plain_without_waiting_for_compaction() {
        let mut list = bytes(40, |i| slot(i as u32));
        // Erasing 32 of 40 leaves 8 live and 32 dead; the index must go at 8 live entries.
        for i in 0..32 {
            list.remove_owned(slot(i), &mut IndexSpares::default());
        }
        assert!(list.index.is_none());
        assert_eq!(list.len(), UNINDEX_AT);
        list.check_invariants().unwrap();
    }

    #[test]
    fn indexed_lookup_skips_entries_that_end_before_the_span_even_when_a_long_one_exists() {
        let mut list = FootprintList::new(writer(span(0, 1000), slot(1)));
        for i in 0..40 {
            list.insert(
                writer(span(1000 + i, 1001 + i), slot(10 + i as u32)),
                &mut IndexSpares::default(),
            );
        }
        assert!(list.index.is_some());
        assert_eq!(visited(&list, span(500, 501)), [slot(1)]);
        assert_eq!(visited(&list, span(1005, 1007)), [slot(15), slot(16)]);
        assert_eq!(visited(&list, ByteSpan::ALL).len(), 41);
    }

    #[test]
    fn a_few_long_entries_do_not_widen_the_candidates_of_a_fan_in() {
        // A whole-buffer writer is live while the fan-in is written (it is long when the index
        // is built), and a second long writer arrives later (long on insert).
        let mut list = FootprintList::new(writer(span(0, 1000), slot(9999)));
        for i in 0..1000 {
            list.insert(writer(span(i, i + 1), slot(i as u32)), &mut IndexSpares::default());
        }
        list.insert(writer(span(2000, 3000), slot(5000)), &mut IndexSpares::default());
        list.check_invariants().unwrap();
        let max_len = list.index.as_ref().unwrap().max_len;
        assert_eq!(max_len, 1);
        assert_eq!(list.candidate_range(span(500, 501), max_len).len(), 1);
        assert_eq!(visited(&list, span(500, 501)), [slot(500), slot(9999)]);
        assert_eq!(visited(&list, span(2500, 2501)), [slot(5000)]);
        assert_eq!(visited(&list, ByteSpan::ALL).len(), 1002);
        assert_eq!(list.remove_owned(slot(9999), &mut IndexSpares::default()), 1);
        assert_eq!(visited(&list, span(500, 501)), [slot(500)]);
        list.check_invariants().unwrap();
    }

    #[test]
    fn long_entries_past_the_side_list_capacity_raise_max_len_and_stay_visible() {
        let mut list = bytes(40, |i| slot(i as u32));
        for k in 0..=LONG_CAP as u64 {
            list.insert(
                writer(span(100 + 100 * k, 150 + 100 * k), slot(200 + k as u32)),
                &mut IndexSpares::default(),
            );
        }
        list.check_invariants().unwrap();
        let index = list.index.as_ref().unwrap();
        assert_eq!((index.long.len(), index.max_len), (LONG_CAP, 50));
        for k in 0..=LONG_CAP as u64 {
            assert_eq!(visited(&list, span(120 + 100 * k, 121 + 100 * k)), [slot(200 + k as u32)]);
        }
        // Erasing everything but the long entries leaves few enough for a plain list, in order.
        for i in 0..40 {
            list.remove_owned(slot(i), &mut IndexSpares::default());
        }
        assert!(list.index.is_none());
        list.check_invariants().unwrap();
        assert_eq!(list.len(), LONG_CAP + 1);
    }

    #[test]
    fn a_producer_with_several_entries_is_visited_once_in_every_mode() {
        // 3: plain; 40: indexed with a short candidate range; 200: indexed through the scratch.
        for n in [3_u64, 40, 200] {
            let list = bytes(n, |i| if i % 3 == 0 { slot(7) } else { slot(100 + i as u32) });
            for probe in [span(0, n), span(0, 4), ByteSpan::ALL] {
                let seen = visited(&list, probe);
                let mut unique = seen.clone();
                unique.dedup();
                assert_eq!(seen, unique, "n = {n}, probe {probe}");
                assert!(seen.contains(&slot(7)));
            }
        }
    }

    #[test]
    fn erasing_a_fan_in_in_any_order_kills_in_place_and_compacts() {
        for reversed in [false, true] {
            let mut list = bytes(1000, |i| slot(i as u32));
            let order: Vec<u32> =
                if reversed { (0..1000).rev().collect() } else { (0..1000).collect() };
            for (done, &i) in order.iter().enumerate() {
                assert_eq!(list.remove_owned(slot(i), &mut IndexSpares::default()), 1);
                assert_eq!(
                    list.remove_owned(slot(i), &mut IndexSpares::default()),
                    0,
                    "a second erase finds nothing"
                );
                assert_eq!(list.len(), 999 - done);
                if done % 97 == 0 && !list.is_empty() {
                    list.check_invariants().unwrap();
                }
            }
            assert!(list.is_empty());
        }
    }

    #[test]
    fn inserting_next_to_a_dead_entry_reuses_its_place() {
        let mut list = bytes(40, |i| slot(i as u32));
        list.remove_owned(slot(20), &mut IndexSpares::default());
        let len = list.entries.len();
        list.insert(writer(span(20, 21), slot(99)), &mut IndexSpares::default());
        assert_eq!(list.entries.len(), len, "the dead entry at 20 was taken over");
        list.check_invariants().unwrap();
        assert_eq!(visited(&list, span(20, 21)), [slot(99)]);
    }

    #[test]
    fn remove_owned_of_an_indexed_owner_with_two_entries_at_one_start() {
        let mut list = bytes(40, |i| slot(i as u32));
        // Slot 99 writes [50, 60), then [50, 55): the new span does not contain the old one, so
        // both stay, and the owner has two live entries with one start.
        list.insert(writer(span(50, 60), slot(99)), &mut IndexSpares::default());
        list.insert(writer(span(50, 55), slot(99)), &mut IndexSpares::default());
        list.check_invariants().unwrap();
        assert_eq!(visited(&list, span(52, 53)), [slot(99)]);
        assert_eq!(list.remove_owned(slot(99), &mut IndexSpares::default()), 2);
        list.check_invariants().unwrap();
        assert!(visited(&list, span(50, 60)).is_empty());
    }
}
