//! [`FixedTensorMap`]: the entry pool, the bucket array, and the operations over them.
//!
//! # Layout
//!
//! - `entries` is the pool. Every slot is on the free list, in exactly one bucket chain, or in
//!   the untouched tail (`untouched..`, never handed out since the last clear, holding
//!   anything); the lists are singly linked through [`MapEntry::next`], and `NIL` ends a list.
//! - `buckets[b]` is the first slot of the chain of bucket `b`; a key's entries all lie in the
//!   chain of the key's bucket (other keys that hash there share it). New entries go to the
//!   front, so a chain holds its key's entries newest first.
//! - A bucket the map has not written since it was built or cleared may hold anything (what
//!   [`reuse`](FixedTensorMap::reuse) did not clear). Its value counts as the head of its chain
//!   only when it names a slot below `untouched` that is chained and whose key hashes to that
//!   bucket (`FixedTensorMap::head`); otherwise the chain is empty. The role of every slot below
//!   `untouched` is this map's (a slot leaves the untouched tail vacant), so such a slot was
//!   chained in that bucket by this map, which wrote the bucket to do so: a value the map did
//!   not write never passes, and no bucket content leads an operation into slots the map does
//!   not own.
//!
//! # Invariants
//!
//! 1. The free list, the chains and the untouched tail partition the pool; no slot is in two
//!    lists and no list has a cycle.
//! 2. A slot below `untouched` is on the free list iff its role byte is vacant.
//! 3. Every chained entry's key hashes to its chain's bucket, and its span is not empty.
//! 4. `writers` and `readers` count the chained entries of each role.
//!
//! A walk of a chain also ends at a vacant slot and after as many steps as the pool has slots,
//! and unlinking a slot never takes a count below zero, so that even a broken invariant could
//! not make an operation loop or panic; the bucket-head rule above keeps the invariants from
//! breaking through the public API, whatever the storage held.

use core::hash::Hash;

use super::entry::{AccessMode, MapEntry, Role, VACANT};
use super::error::FixedMapError;
use super::hash::bucket_of;
use crate::ByteSpan;

/// End of a chain or of the free list.
const NIL: u32 = u32::MAX;

/// A tensor map over caller-provided, fixed storage: per buffer key, writer and reader entries
/// with byte footprints, found by overlap.
///
/// The map never allocates: the entry pool and the bucket array are slices the caller owns, and
/// when the pool is exhausted an insert returns [`FixedMapError::Full`]. Owners are opaque `u64`
/// tags (a device task id, a packed slot id). Whether an owner has *retired* (finished, so that
/// nothing needs to wait for it any more) is the caller's knowledge; lookups and inserts take it
/// as a predicate, skip retired owners' entries, and inserts prune those they pass (an insert's
/// predicate may name fewer retired owners than the lookups', see [`insert`](Self::insert)).
/// The rules (which entries an access finds, which ones an insert supersedes) are in
/// `docs/tensormap-fixed.md`.
///
/// ```
/// use simpler_tensormap::ByteSpan;
/// use simpler_tensormap::fixed::{AccessMode, FixedTensorMap, MapEntry};
///
/// let mut entries = [MapEntry::<u64>::default(); 16];
/// let mut buckets = [0u32; 4];
/// let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
/// let (buf, whole) = (0x1000, ByteSpan::new(0x1000, 0x1100).unwrap());
/// let live = |_task: u64| false; // nothing has retired yet
///
/// // Task 1 writes the buffer, task 2 reads it.
/// map.insert(buf, whole, AccessMode::Write, 1, live).unwrap();
/// let mut producers = Vec::new();
/// map.lookup(&buf, whole, AccessMode::Read, live, |t| producers.push(t));
/// map.insert(buf, whole, AccessMode::Read, 2, live).unwrap();
/// assert_eq!(producers, [1]);
///
/// // Task 3 overwrites it: it must wait for the reader, not for the earlier writer.
/// let mut waits_for = Vec::new();
/// map.lookup(&buf, whole, AccessMode::Write, live, |t| waits_for.push(t));
/// assert_eq!(waits_for, [2]);
/// // Its covering write supersedes both entries.
/// assert_eq!(map.insert(buf, whole, AccessMode::Write, 3, live), Ok(2));
/// assert_eq!(map.len(), 1);
/// ```
#[derive(Debug)]
pub struct FixedTensorMap<'a, K> {
    entries: &'a mut [MapEntry<K>],
    buckets: &'a mut [u32],
    /// `64 − log2(buckets.len())`: the shift that turns a hash into a bucket index.
    shift: u32,
    /// First slot of the free list.
    free: u32,
    /// Slots from this index on were never handed out since the last clear: free, whatever
    /// they hold, so clearing needs no pass over the pool.
    untouched: u32,
    writers: u32,
    readers: u32,
    peak: u32,
}

/// Whether an insert of `span` of `key` in `mode` removes `entry`: a write supersedes the
/// entries of its key it covers whole, but a scatter write leaves the writers it did not order
/// after (their bytes in its gaps are still theirs).
fn replaces<K: Eq>(key: &K, span: ByteSpan, mode: AccessMode, entry: &MapEntry<K>) -> bool {
    mode.records_as() == Role::Writer
        && entry.key == *key
        && span.contains(entry.span())
        && (mode != AccessMode::ScatterWrite || mode.finds_entry(entry))
}

impl<'a, K: Copy + Eq + Hash> FixedTensorMap<'a, K> {
    /// Largest entry pool: slot indices are `u32`, and one value is the end-of-list mark.
    pub const MAX_ENTRIES: usize = NIL as usize;

    /// Largest bucket array.
    pub const MAX_BUCKETS: usize = 1 << 31;

    /// An empty map over `entries` (the pool; its capacity) and `buckets` (a power of two).
    ///
    /// Their previous contents do not matter: the bucket array is overwritten (one walk over
    /// it), and a pool slot is written before it is first read. Nothing allocates, then or
    /// later.
    pub fn new(
        entries: &'a mut [MapEntry<K>],
        buckets: &'a mut [u32],
    ) -> Result<Self, FixedMapError> {
        let mut map = Self::over(entries, buckets)?;
        map.clear();
        Ok(map)
    }

    /// An empty map over storage that a map over the same two slices is expected to have left
    /// behind, having handed out the pool's first `handed_out` slots
    /// ([`handed_out`](Self::handed_out) at its end), with nothing written to the slices since.
    ///
    /// Only the buckets that those slots' chained entries hash to are cleared, so the cost is
    /// proportional to what the previous map used rather than to the bucket count. The result
    /// is an empty map that behaves as the one [`new`](Self::new) builds whatever the slices
    /// hold: the map follows no bucket value it did not write itself (see the module's layout
    /// notes), so storage that breaks the expectation (fresh memory, a map over other slices,
    /// a map interrupted mid-operation, a wrong `handed_out`) can leave stale values in buckets
    /// this pass does not reach, which cost a check when first met but are never taken for
    /// entries. Errors as [`new`](Self::new), and [`FixedMapError::HandedOutBeyondPool`] when
    /// `handed_out` exceeds the pool.
    pub fn reuse(
        entries: &'a mut [MapEntry<K>],
        buckets: &'a mut [u32],
        handed_out: u32,
    ) -> Result<Self, FixedMapError> {
        let capacity = entries.len();
        let map = Self::over(entries, buckets)?;
        let Some(used) = map.entries.get(..handed_out as usize) else {
            return Err(FixedMapError::HandedOutBeyondPool { handed_out, capacity });
        };
        // Invariants 2 and 3: a bucket is non-empty only while the entry at its chain's head is
        // chained, and that entry's key hashes to it.
        for entry in used.iter().filter(|e| e.role().is_some()) {
            map.buckets[bucket_of(&entry.key, map.shift)] = NIL;
        }
        Ok(map)
    }

    /// The map's fields over checked storage, with nothing written to it yet.
    fn over(entries: &'a mut [MapEntry<K>], buckets: &'a mut [u32]) -> Result<Self, FixedMapError> {
        let len = buckets.len();
        if !len.is_power_of_two() || len > Self::MAX_BUCKETS {
            return Err(FixedMapError::BucketsNotPowerOfTwo { len });
        }
        if entries.len() > Self::MAX_ENTRIES {
            return Err(FixedMapError::TooManyEntries {
                len: entries.len(),
                max: Self::MAX_ENTRIES,
            });
        }
        Ok(FixedTensorMap {
            entries,
            buckets,
            shift: 64 - len.trailing_zeros(),
            free: NIL,
            untouched: 0,
            writers: 0,
            readers: 0,
            peak: 0,
        })
    }

    /// Slots of the pool handed out since construction or the last [`clear`](Self::clear): what
    /// [`reuse`](Self::reuse) needs to know about this map's storage.
    pub fn handed_out(&self) -> u32 {
        self.untouched
    }

    /// Removes every entry (and resets the peak), in one pass over the buckets; the pool is
    /// handed out again from its first slot, in index order.
    pub fn clear(&mut self) {
        self.buckets.fill(NIL);
        self.free = NIL;
        self.untouched = 0;
        self.writers = 0;
        self.readers = 0;
        self.peak = 0;
    }

    /// Calls `visit(owner)` for every entry of `key` that overlaps `span`, that `mode` finds
    /// ([`AccessMode::finds_entry`]) and whose owner has not retired.
    ///
    /// This is the lookup half of an access: a read finds writers, a write finds readers and
    /// the writers that stand in for readers they superseded, a read-write finds both. An owner with several such entries (it accessed the buffer through
    /// several arguments) is visited once per entry; callers collect a task's producers over all
    /// its arguments and skip repeats anyway. An empty `span` visits nothing. Cost: one pass
    /// over the key's bucket chain; nothing allocates.
    pub fn lookup(
        &self,
        key: &K,
        span: ByteSpan,
        mode: AccessMode,
        is_retired: impl Fn(u64) -> bool,
        visit: impl FnMut(u64),
    ) {
        self.lookup_by_role(key, span, mode, |owner, _| is_retired(owner), visit);
    }

    /// [`lookup`](Self::lookup) with a predicate that also sees the entry's role, for a caller
    /// that can leave out more than retired owners: a finished reader, say, which a later
    /// write need not wait for and whose bytes it does not read.
    pub fn lookup_by_role(
        &self,
        key: &K,
        span: ByteSpan,
        mode: AccessMode,
        mut skip: impl FnMut(u64, Role) -> bool,
        mut visit: impl FnMut(u64),
    ) {
        if span.is_empty() {
            return;
        }
        for entry in self.chain(bucket_of(key, self.shift)) {
            let found = mode.finds_entry(entry)
                && entry.key == *key
                && entry.span().overlaps(span)
                && !entry.role().is_some_and(|role| skip(entry.owner, role));
            if found {
                visit(entry.owner);
            }
        }
    }

    /// Records that `owner` accesses `span` of `key` in `mode`: a reader entry for
    /// [`AccessMode::Read`], a writer entry otherwise. Returns how many live entries the new one
    /// superseded.
    ///
    /// A writer entry supersedes (removes) every live entry of the key that lies entirely inside
    /// `span`, writer and reader entries of any owner (the owner's own reader entry too). Its
    /// owner has taken edges to them in its lookup, so a later access that finds the new entry
    /// is ordered after them as well. If a superseded entry ordered later writes (a reader, or a
    /// writer that did), the new writer entry takes that duty over, so that a later blind write
    /// still orders after the readers it replaced; a `ReadWrite` entry has the duty itself.
    /// Partly covered entries stay. A reader entry supersedes nothing. Entries of retired owners
    /// met in the key's chain are pruned on the way (they hand no duty over).
    ///
    /// `is_retired` may be narrower than the lookups' predicate (true only for some retired
    /// owners) when the full test is costly: entries it does not name stay longer (lookups still
    /// skip them), and one the new writer covers hands its duty over as a live entry would,
    /// which can add an edge to a live task but never loses one.
    ///
    /// An empty `span` records nothing and returns `Ok(0)`. When the pool has no vacant slot,
    /// the whole pool is pruned of retired owners first; [`FixedMapError::Full`] only when that
    /// frees nothing, and then nothing observable changed. Do every lookup of a task before its
    /// first insert, so that it never finds itself.
    pub fn insert(
        &mut self,
        key: K,
        span: ByteSpan,
        mode: AccessMode,
        owner: u64,
        is_retired: impl Fn(u64) -> bool,
    ) -> Result<u32, FixedMapError> {
        self.insert_noting(key, span, mode, owner, is_retired, |_| {})
    }

    /// As [`insert`](Self::insert), calling `unordered(owner)` for each entry it supersedes
    /// that the access does not find: a writer a blind [`AccessMode::Write`] covers but does not
    /// order after. Such a writer may still be running when no entry names it any more, so
    /// whoever touches the bytes outside the task graph (a copy of them) must wait for it by
    /// other means.
    pub fn insert_noting(
        &mut self,
        key: K,
        span: ByteSpan,
        mode: AccessMode,
        owner: u64,
        is_retired: impl Fn(u64) -> bool,
        mut unordered: impl FnMut(u64),
    ) -> Result<u32, FixedMapError> {
        if span.is_empty() {
            return Ok(0);
        }
        let role = mode.records_as();
        let bucket = bucket_of(&key, self.shift);
        let mut superseded = 0;
        let mut orders_writes = mode == AccessMode::ReadWrite;
        self.sweep(bucket, |entry| {
            if is_retired(entry.owner) {
                return true;
            }
            let covered = replaces(&key, span, mode, entry);
            if covered && !mode.finds_entry(entry) {
                unordered(entry.owner);
            }
            superseded += u32::from(covered);
            orders_writes |= covered && entry.orders_writes();
            covered
        });
        let at = match self.pop_free() {
            Some(at) => at,
            None => self.pop_free_after_pruning(&is_retired)?,
        };
        let head = self.head(bucket);
        let entry = &mut self.entries[at as usize];
        entry.key = key;
        entry.start = span.start;
        entry.end = span.end;
        entry.owner = owner;
        entry.role = role as u8;
        entry.orders_writes = u8::from(orders_writes);
        entry.next = head;
        self.buckets[bucket] = at;
        match role {
            Role::Writer => self.writers += 1,
            Role::Reader => self.readers += 1,
        }
        self.peak = self.peak.max(self.len());
        Ok(superseded)
    }

    /// How many vacant slots the inserts of one task's `accesses` (in order, each seen through
    /// `part`) take at most: one per non-empty access, but none for a write that covers a live
    /// entry no earlier access of the list covers (its insert removes that entry before it takes
    /// a slot, see [`insert`](Self::insert)). For a room check before a task's first insert:
    /// counting every access refuses a write that replaces what it covers in a full pool.
    /// Entries of retired owners, and covered entries of the task's own earlier inserts, are
    /// not counted as freeing anything, so the figure never falls short. Allocates nothing.
    pub fn slots_needed<A>(
        &self,
        accesses: &[A],
        part: impl Fn(&A) -> (K, ByteSpan, AccessMode),
        is_retired: impl Fn(u64) -> bool,
    ) -> u32 {
        let covers = |(key, span, mode): (K, ByteSpan, AccessMode), e: &MapEntry<K>| {
            !span.is_empty() && replaces(&key, span, mode, e)
        };
        let mut needed = 0;
        for (i, a) in accesses.iter().enumerate() {
            let access = part(a);
            if access.1.is_empty() {
                continue;
            }
            let frees = self.chain(bucket_of(&access.0, self.shift)).any(|e| {
                let fresh = || !accesses[..i].iter().any(|b| covers(part(b), e));
                !is_retired(e.owner) && covers(access, e) && fresh()
            });
            needed += u32::from(!frees);
        }
        needed
    }

    /// Removes the entries of the listed keys that `owner` holds (writer and reader entries) and
    /// returns how many.
    ///
    /// Entries of other owners, absent keys and repeated keys are left alone, so erasing for a
    /// superseded producer never removes the entry of the one that replaced it.
    pub fn erase_owned(&mut self, owner: u64, keys: &[K]) -> u32 {
        let mut erased = 0;
        for key in keys {
            erased += self.sweep(bucket_of(key, self.shift), |e| e.key == *key && e.owner == owner);
        }
        erased
    }

    /// Removes every entry whose owner has retired and returns how many: one pass over the
    /// buckets and the chained entries.
    ///
    /// Lookups already skip such entries and inserts prune those in their key's chain, so this
    /// is only needed to give memory back at a quiet moment; an insert that finds the pool full
    /// runs it itself.
    pub fn prune_retired(&mut self, is_retired: impl Fn(u64) -> bool) -> u32 {
        (0..self.buckets.len()).map(|b| self.sweep(b, |e| is_retired(e.owner))).sum()
    }

    /// The entries of `key` currently held, newest first, including any whose owner retired but
    /// was not pruned yet.
    pub fn entries_of<'m>(&'m self, key: &'m K) -> impl Iterator<Item = &'m MapEntry<K>> + 'm {
        self.chain(bucket_of(key, self.shift)).filter(move |e| e.key == *key)
    }

    /// Entries in the pool.
    pub fn capacity(&self) -> u32 {
        // `new` checked that the length fits.
        self.entries.len() as u32
    }

    /// Buckets in the bucket array.
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// Entries held (writer and reader entries), including unpruned ones of retired owners.
    pub fn len(&self) -> u32 {
        self.writers + self.readers
    }

    /// `true` when no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writer entries held.
    pub fn writers(&self) -> u32 {
        self.writers
    }

    /// Reader entries held.
    pub fn readers(&self) -> u32 {
        self.readers
    }

    /// The most entries held at once since construction, [`clear`](Self::clear) or
    /// [`reset_peak`](Self::reset_peak).
    pub fn peak_len(&self) -> u32 {
        self.peak
    }

    /// Sets the peak to the current number of entries.
    pub fn reset_peak(&mut self) {
        self.peak = self.len();
    }

    /// The first slot of `bucket`'s chain: the bucket's value when it names a slot this map
    /// chained in that bucket (below `untouched`, not vacant, its key hashing there), `NIL`
    /// otherwise. A value the map did not write since it was built or cleared never passes
    /// (module docs, Layout), so leftovers of other storage read as empty buckets.
    fn head(&self, bucket: usize) -> u32 {
        let at = self.buckets[bucket];
        match self.entries.get(at as usize) {
            Some(e)
                if at < self.untouched
                    && e.role().is_some()
                    && bucket_of(&e.key, self.shift) == bucket =>
            {
                at
            }
            _ => NIL,
        }
    }

    /// The chained entries of `bucket`, front to back.
    fn chain(&self, bucket: usize) -> Chain<'_, K> {
        Chain { entries: self.entries, at: self.head(bucket), left: self.entries.len() }
    }

    /// Unlinks every entry of `bucket`'s chain for which `remove` says so, returns them to the
    /// free list, and returns how many.
    fn sweep(&mut self, bucket: usize, mut remove: impl FnMut(&MapEntry<K>) -> bool) -> u32 {
        let mut removed = 0;
        let mut prev = NIL;
        let mut at = self.head(bucket);
        // Bounded by the pool, as `Chain` is: a chain never holds more slots than that.
        let mut left = self.entries.len();
        while let Some(entry) =
            self.entries.get(at as usize).filter(|e| left > 0 && e.role().is_some())
        {
            left -= 1;
            let next = entry.next;
            if remove(entry) {
                match self.entries.get_mut(prev as usize) {
                    Some(prev) => prev.next = next,
                    None => self.buckets[bucket] = next,
                }
                self.push_free(at);
                removed += 1;
            } else {
                prev = at;
            }
            at = next;
        }
        removed
    }

    fn push_free(&mut self, at: u32) {
        let Some(entry) = self.entries.get_mut(at as usize) else {
            return;
        };
        // Saturating: the counts match the chains (invariant 4), and if they ever did not, a
        // count stuck at 0 is better than a panic or a wrapped count.
        match entry.role() {
            Some(Role::Writer) => self.writers = self.writers.saturating_sub(1),
            Some(Role::Reader) => self.readers = self.readers.saturating_sub(1),
            None => {}
        }
        entry.role = VACANT;
        entry.next = self.free;
        self.free = at;
    }

    fn pop_free(&mut self) -> Option<u32> {
        let at = self.free;
        if let Some(entry) = self.entries.get(at as usize) {
            self.free = entry.next;
            return Some(at);
        }
        // `new` checked that every index fits below `NIL`.
        let at = self.untouched;
        // Vacant until the caller writes it: below `untouched`, a role must be this map's
        // (module docs, Layout), and the slot may hold an entry of an earlier map.
        self.entries.get_mut(at as usize)?.role = VACANT;
        self.untouched += 1;
        Some(at)
    }

    #[cold]
    fn pop_free_after_pruning(
        &mut self,
        is_retired: &impl Fn(u64) -> bool,
    ) -> Result<u32, FixedMapError> {
        self.prune_retired(is_retired);
        self.pop_free().ok_or(FixedMapError::Full {
            capacity: self.capacity(),
            writers: self.writers,
            readers: self.readers,
        })
    }

    /// Checks the invariants of the module docs; used by tests.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), &'static str> {
        let mut seen = 0usize;
        let (mut writers, mut readers) = (0, 0);
        let mut at = self.free;
        while let Some(e) = self.entries.get(at as usize) {
            if e.role != VACANT {
                return Err("a free slot has a role");
            }
            seen += 1;
            if seen > self.entries.len() {
                return Err("the free list has a cycle");
            }
            at = e.next;
        }
        for bucket in 0..self.buckets.len() {
            for e in self.chain(bucket) {
                seen += 1;
                if seen > self.entries.len() {
                    return Err("a chain has a cycle or shares slots");
                }
                match e.role() {
                    Some(Role::Writer) => writers += 1,
                    Some(Role::Reader) => readers += 1,
                    None => return Err("a chained slot is vacant"),
                }
                if bucket_of(&e.key, self.shift) != bucket || e.span().is_empty() {
                    return Err("an entry is in the wrong chain or empty");
                }
            }
        }
        if seen + (self.entries.len() - self.untouched as usize) != self.entries.len() {
            return Err("a slot is in no list");
        }
        if (writers, readers) != (self.writers, self.readers) {
            return Err("role counts disagree with the chains");
        }
        Ok(())
    }
}

/// Iterator over one bucket chain.
struct Chain<'m, K> {
    entries: &'m [MapEntry<K>],
    at: u32,
    /// Steps left: a chain holds at most every slot of the pool once. The walk also ends at a
    /// vacant slot, which no chain holds.
    left: usize,
}

impl<'m, K> Iterator for Chain<'m, K> {
    type Item = &'m MapEntry<K>;

    fn next(&mut self) -> Option<&'m MapEntry<K>> {
        self.left = self.left.checked_sub(1)?;
        let entry = self.entries.get(self.at as usize).filter(|e| e.role().is_some())?;
        self.at = entry.next;
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use AccessMode::{Read, ReadWrite, Write};

    fn span(start: u64, end: u64) -> ByteSpan {
        ByteSpan::new(start, end).unwrap()
    }

    const LIVE: fn(u64) -> bool = |_| false;

    fn found(map: &FixedTensorMap<'_, u64>, key: u64, s: ByteSpan, mode: AccessMode) -> Vec<u64> {
        let mut out = Vec::new();
        map.lookup(&key, s, mode, LIVE, |o| out.push(o));
        out.sort_unstable();
        out
    }

    #[test]
    fn storage_is_checked() {
        let mut entries = [MapEntry::<u64>::default(); 2];
        assert_eq!(
            FixedTensorMap::new(&mut entries, &mut [0; 3]).unwrap_err(),
            FixedMapError::BucketsNotPowerOfTwo { len: 3 }
        );
        assert!(FixedTensorMap::new(&mut entries, &mut []).is_err());
        let mut garbage = [7; 1];
        let map = FixedTensorMap::new(&mut entries, &mut garbage).unwrap();
        assert_eq!((map.capacity(), map.bucket_count(), map.len()), (2, 1, 0));
        map.check_invariants().unwrap();
        assert_eq!(
            FixedTensorMap::reuse(&mut entries, &mut [0; 1], 3).unwrap_err(),
            FixedMapError::HandedOutBeyondPool { handed_out: 3, capacity: 2 }
        );
        assert!(FixedTensorMap::reuse(&mut entries, &mut [0; 3], 0).is_err());
    }

    #[test]
    fn reuse_clears_the_buckets_of_what_the_previous_map_chained() {
        let mut entries = [MapEntry::<u64>::default(); 8];
        let mut buckets = [0; 64];
        let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        for key in 0..6 {
            map.insert(key * 4096, span(0, 8), Write, key, LIVE).unwrap();
        }
        map.erase_owned(2, &[2 * 4096]);
        let handed_out = map.handed_out();
        assert_eq!(handed_out, 6);
        let map = FixedTensorMap::reuse(&mut entries, &mut buckets, handed_out).unwrap();
        assert!(map.is_empty() && map.handed_out() == 0);
        assert!(found(&map, 0, span(0, 8), ReadWrite).is_empty());
        map.check_invariants().unwrap();
    }

    /// The pool and buckets a map leaves after task 1 wrote `[0x1000, 0x1100)` of buffer
    /// `0x1000`: one writer entry in slot 0, the only bucket naming it.
    fn leftovers() -> ([MapEntry<u64>; 4], [u32; 1]) {
        let mut entries = [MapEntry::<u64>::default(); 4];
        let mut buckets = [0u32; 1];
        let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        map.insert(0x1000, span(0x1000, 0x1100), Write, 1, LIVE).unwrap();
        assert_eq!(map.handed_out(), 1);
        (entries, buckets)
    }

    #[test]
    fn reuse_told_too_few_slots_still_gives_an_empty_map() {
        let whole = span(0x1000, 0x1100);
        // An insert over the leftover entry's key.
        let (mut entries, mut buckets) = leftovers();
        let mut map = FixedTensorMap::reuse(&mut entries, &mut buckets, 0).unwrap();
        assert!(found(&map, 0x1000, whole, ReadWrite).is_empty(), "the old writer is gone");
        assert_eq!(map.insert(0x1000, whole, Write, 2, LIVE), Ok(0), "nothing to supersede");
        assert_eq!((map.writers(), map.readers(), map.len()), (1, 0, 1));
        map.check_invariants().unwrap();
        // An insert of another key, whose slot the stale bucket still names.
        let (mut entries, mut buckets) = leftovers();
        let mut map = FixedTensorMap::reuse(&mut entries, &mut buckets, 0).unwrap();
        map.insert(0x2000, whole, Read, 2, LIVE).unwrap();
        assert_eq!(found(&map, 0x2000, whole, Write), [2]);
        assert!(found(&map, 0x1000, whole, ReadWrite).is_empty());
        map.check_invariants().unwrap();
    }

    #[test]
    fn reuse_of_fresh_zeroed_storage_gives_an_empty_map() {
        let mut entries = [MapEntry::<u64>::default(); 4];
        let mut buckets = [0u32; 4];
        let mut map = FixedTensorMap::reuse(&mut entries, &mut buckets, 0).unwrap();
        assert_eq!(map.insert(0, span(0, 0x100), Write, 7, LIVE), Ok(0));
        assert_eq!(found(&map, 0, span(0, 0x100), Read), [7]);
        // Keys in other buckets, whose zeroed heads name slot 0, which is now chained.
        for key in 1..16u64 {
            map.insert(key << 12, span(0, 0x100), Read, key, LIVE).ok();
            map.check_invariants().unwrap();
        }
        assert_eq!(map.prune_retired(|o| o != 7 && o % 2 == 0), 1);
        assert_eq!(map.len(), 3);
        map.check_invariants().unwrap();
    }

    #[test]
    fn broken_links_and_counts_neither_loop_nor_panic() {
        let mut entries = [MapEntry::<u64>::default(); 4];
        let mut buckets = [0u32; 1];
        let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        let whole = span(0, 8);
        map.insert(1, whole, Write, 10, LIVE).unwrap();
        // Corrupted behind the map's back: a chain that links its entry to itself, and counts
        // that say the entry is not there.
        map.entries[0].next = 0;
        map.writers = 0;
        assert_eq!(found(&map, 1, whole, Read), [10, 10, 10, 10], "one visit per pool slot");
        assert_eq!(map.slots_needed(&[(1, whole, Read)], |a| *a, LIVE), 1);
        assert_eq!(map.insert(1, whole, Write, 11, LIVE), Ok(1));
        assert_eq!((map.writers(), map.readers()), (1, 0));
        // A vacant slot inside a chain, still counted.
        map.insert(2, whole, Write, 12, LIVE).unwrap();
        map.entries[0].role = VACANT;
        assert!(found(&map, 1, whole, ReadWrite).is_empty());
        assert_eq!(found(&map, 2, whole, ReadWrite), [12]);
        assert_eq!(map.erase_owned(11, &[1]), 0);
        assert_eq!(map.prune_retired(|_| true), 1);
        assert_eq!(map.insert(3, whole, Read, 13, LIVE), Ok(0));
        assert_eq!(found(&map, 3, whole, Write), [13]);
    }

    #[test]
    fn writes_find_readers_reads_find_writers_and_read_writes_find_both() {
        let mut entries = [MapEntry::<u64>::default(); 8];
        let mut buckets = [0; 2];
        let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        map.insert(1, span(0, 8), Write, 10, LIVE).unwrap();
        map.insert(1, span(0, 8), Read, 11, LIVE).unwrap();
        assert_eq!(found(&map, 1, span(4, 5), Read), [10]);
        assert_eq!(found(&map, 1, span(4, 5), Write), [11]);
        assert_eq!(found(&map, 1, span(4, 5), ReadWrite), [10, 11]);
        assert!(found(&map, 1, span(8, 9), ReadWrite).is_empty(), "adjacent bytes");
        assert!(found(&map, 2, span(0, 8), ReadWrite).is_empty(), "another key");
        map.check_invariants().unwrap();
    }

    #[test]
    fn a_covering_write_supersedes_what_it_covers_and_takes_over_the_readers_duty() {
        let mut entries = [MapEntry::<u64>::default(); 8];
        let mut buckets = [0; 1];
        let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        map.insert(1, span(0, 4), Write, 10, LIVE).unwrap();
        map.insert(1, span(4, 8), Read, 11, LIVE).unwrap();
        map.insert(1, span(6, 12), Write, 12, LIVE).unwrap(); // partly outside the next write
        // Task 13 reads [0, 8) and overwrites it in one submit.
        map.insert(1, span(0, 8), Read, 13, LIVE).unwrap();
        assert_eq!(map.insert(1, span(0, 8), Write, 13, LIVE), Ok(3));
        assert_eq!(found(&map, 1, span(0, 8), ReadWrite), [12, 13]);
        assert_eq!(found(&map, 1, span(0, 8), Write), [13], "13 stands in for the readers");
        assert_eq!((map.writers(), map.readers()), (2, 0));
        // A blind write over a blind write inherits no duty.
        map.insert(2, span(0, 8), Write, 20, LIVE).unwrap();
        map.insert(2, span(0, 8), Write, 21, LIVE).unwrap();
        assert!(found(&map, 2, span(0, 8), Write).is_empty());
        map.check_invariants().unwrap();
    }

    #[test]
    fn an_insert_names_the_writers_it_supersedes_without_ordering_after_them() {
        let mut entries = [MapEntry::<u64>::default(); 8];
        let mut buckets = [0; 1];
        let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        let mut insert = |mode, owner| {
            let mut named = Vec::new();
            map.insert_noting(1, span(0, 8), mode, owner, LIVE, |o| named.push(o)).unwrap();
            named
        };
        assert!(insert(Write, 10).is_empty());
        assert_eq!(insert(Write, 11), [10], "a blind write over a blind write");
        assert!(insert(Read, 12).is_empty());
        assert_eq!(insert(Write, 13), [11], "a blind write orders after reader 12 only");
        assert!(insert(ReadWrite, 14).is_empty(), "an update orders after everything");
    }

    #[test]
    fn erase_is_owner_checked_and_prune_drops_retired_owners() {
        let mut entries = [MapEntry::<u64>::default(); 8];
        let mut buckets = [0; 4];
        let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        map.insert(1, span(0, 4), Write, 10, LIVE).unwrap();
        map.insert(1, span(4, 8), Write, 11, LIVE).unwrap();
        map.insert(2, span(0, 4), Read, 10, LIVE).unwrap();
        assert_eq!(map.erase_owned(10, &[1, 1, 3]), 1);
        assert_eq!(found(&map, 1, span(0, 8), Read), [11]);
        assert_eq!(map.prune_retired(|o| o == 10), 1);
        assert_eq!(map.len(), 1);
        let retired_11 = |o: u64| o == 11;
        let mut seen = Vec::new();
        map.lookup(&1, span(0, 8), Read, retired_11, |o| seen.push(o));
        assert!(seen.is_empty(), "a retired writer is not a producer");
        map.check_invariants().unwrap();
    }

    #[test]
    fn a_full_pool_prunes_retired_owners_before_refusing() {
        let mut entries = [MapEntry::<u64>::default(); 2];
        let mut buckets = [0; 2];
        let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        map.insert(1, span(0, 4), Write, 10, LIVE).unwrap();
        map.insert(2, span(0, 4), Read, 11, LIVE).unwrap();
        assert_eq!(
            map.insert(3, span(0, 4), Read, 12, LIVE),
            Err(FixedMapError::Full { capacity: 2, writers: 1, readers: 1 })
        );
        assert_eq!(map.len(), 2);
        assert_eq!(map.insert(3, span(0, 4), Read, 12, |o| o == 10), Ok(0));
        assert_eq!((map.writers(), map.readers(), map.peak_len()), (0, 2, 2));
        map.check_invariants().unwrap();
        map.clear();
        assert!(map.is_empty());
        map.check_invariants().unwrap();
    }

    #[test]
    fn a_write_read_chain_keeps_one_entry_of_each_role() {
        let mut entries = [MapEntry::<u64>::default(); 4];
        let mut buckets = [0; 1];
        let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        for task in 0..1000u64 {
            let mode = if task % 2 == 0 { ReadWrite } else { Read };
            map.insert(7, span(0, 64), mode, task, LIVE).unwrap();
            assert!(map.entries_of(&7).count() <= 2, "task {task}");
        }
        assert_eq!(found(&map, 7, span(0, 64), ReadWrite), [998, 999]);
        assert_eq!(map.peak_len(), 2);
    }
}
