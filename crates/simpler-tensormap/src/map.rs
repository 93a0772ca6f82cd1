//! `TensorMap` and `TensorMapGuard`: the store behind one leaf mutex (`docs/tensormap.md` §8).
//!
//! # Locking
//!
//! The map has exactly one lock, a `parking_lot::Mutex` around the store, and no atomics. It is a
//! **leaf**: callers must not hold it while taking any other lock (slot, queue, run, ring), and
//! nothing inside the map takes another lock while holding it. Who takes it:
//!
//! 1. The orchestration thread, once per submit: [`TensorMap::lock`] returns a guard, the submit
//!    walks every tensor argument through it (lookups, then inserts), and drops it before
//!    attaching to producers (`docs/engine-protocols.md` §3 step 3).
//! 2. Whichever thread reclaims a slot, once per reclamation: [`TensorMap::erase_owned`].
//! 3. The run-release path: [`TensorMap::erase_run`], as a safety net.
//!
//! The `visit` callback of a lookup runs while the lock is held. It must not call back into the
//! same `TensorMap` (the mutex is not re-entrant, so that would deadlock) and, the lock being a
//! leaf, must not take other locks; collecting the producers into a buffer is the intended use.

use std::fmt;

use parking_lot::{Mutex, MutexGuard};
use simpler_types::{RunId, SlotId};

use crate::store::MapStore;
use crate::{Access, ByteSpan, TensorKey};

/// Run-scoped map from `(run, buffer key, byte footprint)` to the tasks that currently write
/// and read those bytes.
///
/// Each buffer key of a run holds two short lists of `(footprint, task)` entries, writers and
/// readers; `len()` counts the entries of both. No lookup, record or erase fails or panics
/// ([`with_capacity`](TensorMap::with_capacity) panics as `Vec::with_capacity` does when the
/// capacity overflows). The map never
/// looks at task states: what a returned producer means is the caller's business.
///
/// ```
/// use simpler_tensormap::{ByteSpan, TensorKey, TensorMap};
/// use simpler_types::{RunId, SlotId};
///
/// let map = TensorMap::new();
/// let run = RunId::FIRST;
/// let buf = TensorKey::Host { addr: 0x1000 };
/// // Two tasks write the two halves of one buffer.
/// map.insert(run, buf, ByteSpan::new(0x1000, 0x1080).unwrap(), SlotId::new(0, 1));
/// map.insert(run, buf, ByteSpan::new(0x1080, 0x1100).unwrap(), SlotId::new(1, 1));
/// // A reader of the whole buffer depends on both.
/// let mut producers = Vec::new();
/// map.lookup_overlapping(run, &buf, ByteSpan::new(0x1000, 0x1100).unwrap(), |s|
/// producers.push(s)); producers.sort();
/// assert_eq!(producers, [SlotId::new(0, 1), SlotId::new(1, 1)]);
/// ```
pub struct TensorMap {
    store: Mutex<MapStore>,
}

/// The map held locked, so that one submit walks all its tensors under one lock acquisition.
///
/// It offers the same operations as [`TensorMap`]; mutating ones take `&mut self`. Drop it
/// before taking any other lock (the map's lock is a leaf).
pub struct TensorMapGuard<'a> {
    store: MutexGuard<'a, MapStore>,
}

impl TensorMap {
    /// An empty map.
    pub fn new() -> TensorMap {
        TensorMap { store: Mutex::new(MapStore::default()) }
    }

    /// An empty map whose first run can hold `keys` buffer keys without growing its table.
    ///
    /// Tables emptied by `erase_owned`/`erase_run` are kept for the next run, so this capacity
    /// carries over to later runs as well.
    pub fn with_capacity(keys: usize) -> TensorMap {
        TensorMap { store: Mutex::new(MapStore::with_capacity(keys)) }
    }

    /// Takes the map's lock and returns a guard offering every operation.
    pub fn lock(&self) -> TensorMapGuard<'_> {
        TensorMapGuard { store: self.store.lock() }
    }

    /// Calls `visit` for every task of `run` that an `access` of `span` of `key` must order
    /// after: for a read the writers of overlapping bytes, for a write the readers of
    /// overlapping bytes (and, for an in-place [`Access::Update`], the writers too).
    ///
    /// A task is visited once per kind of entry it owns (an `Update` can meet one task as a
    /// writer and as a reader). The order of visits is unspecified. An empty `span` visits
    /// nothing. Cost: one hash probe plus the entries of the key that start inside the span's
    /// reach. The lookup allocates nothing, except that deduplicating more than 16 candidates of
    /// a key where some task owns several entries grows a scratch buffer the map keeps and
    /// reuses. `visit` runs under the map's lock: it must not call into this map or take other
    /// locks.
    ///
    /// A task's lookups must all come before its [`record`](TensorMap::record)s: a covering write
    /// supersedes the entries it has just ordered after.
    #[inline]
    pub fn dependencies(
        &self,
        run: RunId,
        key: &TensorKey,
        span: ByteSpan,
        access: Access,
        visit: impl FnMut(SlotId),
    ) {
        self.store.lock().dependencies(run, key, span, access, visit);
    }

    /// Records that `slot` accesses `span` of `key` in `run`, and returns the number of entries
    /// it superseded.
    ///
    /// A read adds a reader entry and supersedes nothing. A write removes the writer and reader
    /// entries lying entirely inside `span` (every byte they named is now written by `slot`,
    /// which has ordered after the readers among them) and keeps those `span` only partly
    /// covers. An empty `span` changes nothing and returns 0.
    pub fn record(
        &self,
        run: RunId,
        key: TensorKey,
        span: ByteSpan,
        access: Access,
        slot: SlotId,
    ) -> usize {
        self.store.lock().record(run, key, span, access, slot)
    }

    /// The writers of bytes of `key` overlapping `span`: [`dependencies`](Self::dependencies)
    /// for an [`Access::Read`].
    ///
    /// ```
    /// use simpler_tensormap::{ByteSpan, RunId, SlotId, TensorKey, TensorMap};
    ///
    /// let map = TensorMap::new();
    /// let (run, key) = (RunId::FIRST, TensorKey::Host { addr: 0x1000 });
    /// let writer = SlotId::new(0, 1);
    /// map.insert(run, key, ByteSpan::with_len(0x1000, 256).unwrap(), writer);
    /// // Bytes 0x10f0.. overlap what `writer` wrote; bytes 0x1100.. do not.
    /// let mut found = Vec::new();
    /// map.lookup_overlapping(run, &key, ByteSpan::with_len(0x10f0, 64).unwrap(), |s| found.push(s));
    /// map.lookup_overlapping(run, &key, ByteSpan::with_len(0x1100, 64).unwrap(), |s| found.push(s));
    /// assert_eq!(found, [writer]);
    /// ```
    #[inline]
    pub fn lookup_overlapping(
        &self,
        run: RunId,
        key: &TensorKey,
        span: ByteSpan,
        visit: impl FnMut(SlotId),
    ) {
        self.dependencies(run, key, span, Access::Read, visit);
    }

    /// Makes `slot` the writer of `span` of `key`: [`record`](Self::record) of an
    /// [`Access::Overwrite`].
    ///
    /// ```
    /// use simpler_tensormap::{ByteSpan, RunId, SlotId, TensorKey, TensorMap};
    ///
    /// let map = TensorMap::new();
    /// let (run, key) = (RunId::FIRST, TensorKey::Host { addr: 0x1000 });
    /// let whole = ByteSpan::with_len(0x1000, 256).unwrap();
    /// map.insert(run, key, ByteSpan::with_len(0x1000, 64).unwrap(), SlotId::new(0, 1));
    /// // A write covering the first one supersedes it: later readers find only the new writer.
    /// assert_eq!(map.insert(run, key, whole, SlotId::new(1, 1)), 1);
    /// let mut found = Vec::new();
    /// map.lookup_overlapping(run, &key, whole, |s| found.push(s));
    /// assert_eq!(found, [SlotId::new(1, 1)]);
    /// ```
    pub fn insert(&self, run: RunId, key: TensorKey, span: ByteSpan, slot: SlotId) -> usize {
        self.record(run, key, span, Access::Overwrite, slot)
    }

    /// For each key in `keys`, removes the entries of `run` whose producer is `owner`, and returns
    /// how many were removed.
    ///
    /// Entries of other producers, absent keys and repeated keys are left alone, so reclaiming a
    /// superseded producer never removes the entry of the producer that replaced it. Slot ids
    /// carry a generation, so a recycled slot never matches its predecessor's entries.
    pub fn erase_owned(&self, run: RunId, owner: SlotId, keys: &[TensorKey]) -> usize {
        self.store.lock().erase_owned(run, owner, keys, false)
    }

    /// For each key in `keys`, removes the *reader* entries of `run` whose task is `owner`, and
    /// returns how many were removed; its writer entries stay.
    ///
    /// A reader that has finished no longer holds back later writes, so the engine calls this
    /// when a task completes, long before its slot is reclaimed (`docs/tensormap.md` §6).
    pub fn erase_reader_owned(&self, run: RunId, owner: SlotId, keys: &[TensorKey]) -> usize {
        self.store.lock().erase_owned(run, owner, keys, true)
    }

    /// Removes every entry of `run` and returns how many there were; other runs are untouched.
    pub fn erase_run(&self, run: RunId) -> usize {
        self.store.lock().erase_run(run)
    }

    /// Number of `(footprint, task)` entries, writers and readers, over all runs.
    pub fn len(&self) -> usize {
        self.store.lock().len()
    }

    /// `true` when no run has an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of `(footprint, task)` entries, writers and readers, of `run`.
    pub fn len_run(&self, run: RunId) -> usize {
        self.store.lock().len_run(run)
    }
}

impl Default for TensorMap {
    fn default() -> TensorMap {
        TensorMap::new()
    }
}

impl fmt::Debug for TensorMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `try_lock` keeps `{:?}` usable while the caller itself holds a guard.
        match self.store.try_lock() {
            Some(store) => f.debug_struct("TensorMap").field("entries", &store.len()).finish(),
            None => f.debug_struct("TensorMap").field("entries", &"<locked>").finish(),
        }
    }
}

impl TensorMapGuard<'_> {
    /// See [`TensorMap::dependencies`].
    #[inline]
    pub fn dependencies(
        &self,
        run: RunId,
        key: &TensorKey,
        span: ByteSpan,
        access: Access,
        visit: impl FnMut(SlotId),
    ) {
        self.store.dependencies(run, key, span, access, visit);
    }

    /// See [`TensorMap::record`].
    pub fn record(
        &mut self,
        run: RunId,
        key: TensorKey,
        span: ByteSpan,
        access: Access,
        slot: SlotId,
    ) -> usize {
        self.store.record(run, key, span, access, slot)
    }

    /// [`dependencies`](TensorMap::dependencies) of one access followed by its
    /// [`record`](TensorMap::record), with one hash probe; returns the number of entries
    /// superseded.
    ///
    /// Only for a task whose one tracked access this is: with several, all lookups must come
    /// before any record.
    pub fn access(
        &mut self,
        run: RunId,
        key: TensorKey,
        span: ByteSpan,
        access: Access,
        slot: SlotId,
        visit: impl FnMut(SlotId),
    ) -> usize {
        self.store.visit_and_record(run, key, span, access, slot, Some(visit))
    }

    /// See [`TensorMap::lookup_overlapping`].
    #[inline]
    pub fn lookup_overlapping(
        &self,
        run: RunId,
        key: &TensorKey,
        span: ByteSpan,
        visit: impl FnMut(SlotId),
    ) {
        self.store.dependencies(run, key, span, Access::Read, visit);
    }

    /// See [`TensorMap::insert`].
    pub fn insert(&mut self, run: RunId, key: TensorKey, span: ByteSpan, slot: SlotId) -> usize {
        self.store.record(run, key, span, Access::Overwrite, slot)
    }

    /// See [`TensorMap::erase_owned`].
    pub fn erase_owned(&mut self, run: RunId, owner: SlotId, keys: &[TensorKey]) -> usize {
        self.store.erase_owned(run, owner, keys, false)
    }

    /// See [`TensorMap::erase_run`].
    pub fn erase_run(&mut self, run: RunId) -> usize {
        self.store.erase_run(run)
    }

    /// See [`TensorMap::len`].
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// See [`TensorMap::is_empty`].
    pub fn is_empty(&self) -> bool {
        self.store.len() == 0
    }

    /// See [`TensorMap::len_run`].
    pub fn len_run(&self, run: RunId) -> usize {
        self.store.len_run(run)
    }
}

impl fmt::Debug for TensorMapGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorMapGuard").field("entries", &self.store.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_is_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<TensorMap>();
    }

    #[test]
    fn debug_does_not_deadlock_while_locked() {
        let map = TensorMap::new();
        let guard = map.lock();
        assert_eq!(format!("{map:?}"), r#"TensorMap { entries: "<locked>" }"#);
        assert_eq!(format!("{guard:?}"), "TensorMapGuard { entries: 0 }");
    }
}
