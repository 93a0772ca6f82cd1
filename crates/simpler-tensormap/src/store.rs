//! `MapStore`: the whole map's state and algorithm, with no locking (`docs/tensormap.md` §4).
//!
//! [`TensorMap`](crate::TensorMap) wraps one store in a mutex; everything that decides what the
//! map contains lives here, behind `&self`/`&mut self`, so the algorithm can be tested and reused
//! without any synchronization.
//!
//! # Shape
//!
//! The map is keyed by `(RunId, TensorKey)`. Rather than hashing the pair, the store keeps one
//! hash table per run that has entries, in a short vector searched linearly:
//!
//! - Runs are admitted one at a time (`docs/engine-protocols.md` §2), so one or two runs have
//!   entries at any moment and the linear search costs less than hashing a `RunId`.
//! - `erase_run` drops one table instead of filtering a shared one, and is a short search that
//!   finds nothing when the run has no entries (rule: O(1) for an empty run).
//! - A table whose run loses its last entry is cleared and kept as a spare (at most
//!   [`MAX_SPARE_TABLES`]), and the next run that inserts takes it, so a steady stream of runs of
//!   one shape reuses the same allocation instead of growing a fresh table each run. A spare keeps
//!   the capacity of the largest run that used it; that memory is returned when the map is dropped.
//!
//! # Invariants
//!
//! 1. Every table in `runs` has `entries > 0` and names a distinct run.
//! 2. A table's `entries` equals the number of live entries over all its keys (writers and
//!    readers); `total` equals the sum over tables.
//! 3. No stored key is without a live entry (the key is removed instead).
//! 4. Spare tables are empty.

use std::cell::Cell;

use simpler_types::{RunId, SlotId};

use crate::key_table::KeyTable;
use crate::{Access, ByteSpan, TensorKey};

/// How many emptied tables are kept for reuse. Two covers serial admission (one run draining
/// while the next fills) without keeping memory for a burst of runs that will not recur.
const MAX_SPARE_TABLES: usize = 2;

/// The entries of one run.
struct RunTable {
    run: RunId,
    keys: KeyTable,
    /// Number of `(footprint, producer)` entries over all keys of this run.
    entries: usize,
}

/// The map's state: per-run tables of per-key footprint lists, and entry counts.
#[derive(Default)]
pub(crate) struct MapStore {
    runs: Vec<RunTable>,
    spare: Vec<KeyTable>,
    total: usize,
    /// Reusable buffer for deduplicating large fan-in lookups (see `FootprintList`). A `Cell` lets
    /// lookups stay `&self` while still reusing the buffer's capacity.
    scratch: Cell<Vec<SlotId>>,
}

impl MapStore {
    /// An empty store whose first run can hold `keys` buffer keys without rehashing.
    pub(crate) fn with_capacity(keys: usize) -> MapStore {
        let mut store = MapStore::default();
        if keys > 0 {
            store.spare.push(KeyTable::with_capacity(keys));
        }
        store
    }

    #[inline]
    fn table(&self, run: RunId) -> Option<&RunTable> {
        self.runs.iter().find(|t| t.run == run)
    }

    fn table_index(&self, run: RunId) -> Option<usize> {
        self.runs.iter().position(|t| t.run == run)
    }

    /// See [`TensorMap::dependencies`](crate::TensorMap::dependencies).
    #[inline]
    pub(crate) fn dependencies(
        &self,
        run: RunId,
        key: &TensorKey,
        span: ByteSpan,
        access: Access,
        visit: impl FnMut(SlotId),
    ) {
        if span.is_empty() {
            return;
        }
        if let Some(entries) = self.table(run).and_then(|t| t.keys.get(key)) {
            entries.visit(span, access, &self.scratch, visit);
        }
    }

    /// See [`TensorMap::record`](crate::TensorMap::record).
    pub(crate) fn record(
        &mut self,
        run: RunId,
        key: TensorKey,
        span: ByteSpan,
        access: Access,
        slot: SlotId,
    ) -> usize {
        self.visit_and_record(run, key, span, access, slot, None::<fn(SlotId)>)
    }

    /// See [`TensorMapGuard::access`](crate::TensorMapGuard::access): the lookup of
    /// `dependencies` (when `visit` is given), then `record`, with one hash probe.
    pub(crate) fn visit_and_record(
        &mut self,
        run: RunId,
        key: TensorKey,
        span: ByteSpan,
        access: Access,
        slot: SlotId,
        visit: Option<impl FnMut(SlotId)>,
    ) -> usize {
        if span.is_empty() {
            return 0;
        }
        let index = match self.table_index(run) {
            Some(index) => index,
            None => self.open_table(run),
        };
        let table = &mut self.runs[index];
        let visit = visit.map(|v| (&self.scratch, v));
        let superseded = table.keys.visit_and_record(key, span, access, slot, visit);
        // One entry was added and `superseded` removed; `superseded` entries existed before, so
        // neither count can underflow.
        table.entries = table.entries + 1 - superseded;
        self.total = self.total + 1 - superseded;
        superseded
    }

    /// Starts a table for `run` (reusing a spare one) and returns its index.
    #[cold]
    fn open_table(&mut self, run: RunId) -> usize {
        let keys = self.spare.pop().unwrap_or_default();
        self.runs.push(RunTable { run, keys, entries: 0 });
        self.runs.len() - 1
    }

    /// Removes the table at `index` (which must be empty of entries) and keeps it as a spare.
    fn retire_table(&mut self, index: usize) {
        let mut table = self.runs.swap_remove(index);
        table.keys.clear();
        if self.spare.len() < MAX_SPARE_TABLES {
            self.spare.push(table.keys);
        }
    }

    /// See [`TensorMap::erase_owned`](crate::TensorMap::erase_owned) and
    /// [`TensorMap::erase_reader_owned`](crate::TensorMap::erase_reader_owned).
    pub(crate) fn erase_owned(
        &mut self,
        run: RunId,
        owner: SlotId,
        keys: &[TensorKey],
        readers_only: bool,
    ) -> usize {
        let Some(index) = self.table_index(run) else {
            return 0;
        };
        let table = &mut self.runs[index];
        let mut removed = 0;
        for key in keys {
            removed += table.keys.remove_owned(key, owner, readers_only);
        }
        table.entries -= removed;
        self.total -= removed;
        if table.entries == 0 {
            self.retire_table(index);
        }
        removed
    }

    /// See [`TensorMap::erase_run`](crate::TensorMap::erase_run).
    pub(crate) fn erase_run(&mut self, run: RunId) -> usize {
        let Some(index) = self.table_index(run) else {
            return 0;
        };
        let removed = self.runs[index].entries;
        self.total -= removed;
        self.retire_table(index);
        removed
    }

    /// Number of entries over all runs.
    pub(crate) fn len(&self) -> usize {
        self.total
    }

    /// Number of entries of `run`.
    pub(crate) fn len_run(&self, run: RunId) -> usize {
        self.table(run).map_or(0, |t| t.entries)
    }

    /// Checks invariants 1–4 of the module docs and those of every list; used by tests.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let mut total = 0;
        for (i, table) in self.runs.iter().enumerate() {
            if table.entries == 0 {
                return Err(format!("{} has a table with no entries", table.run));
            }
            if self.runs[..i].iter().any(|t| t.run == table.run) {
                return Err(format!("{} has two tables", table.run));
            }
            table.keys.check_invariants().map_err(|e| format!("{}: {e}", table.run))?;
            let mut counted = 0;
            for (key, entries) in table.keys.iter() {
                for list in [&entries.writers, &entries.readers] {
                    list.check_invariants().map_err(|e| format!("{} {key}: {e}", table.run))?;
                }
                counted += entries.len();
            }
            if counted != table.entries {
                return Err(format!(
                    "{} counts {} entries, holds {counted}",
                    table.run, table.entries
                ));
            }
            total += counted;
        }
        if total != self.total {
            return Err(format!("total {} but tables hold {total}", self.total));
        }
        if self.spare.iter().any(|t| t.len() > 0) || self.spare.len() > MAX_SPARE_TABLES {
            return Err("a spare table is not empty, or too many spares".into());
        }
        Ok(())
    }

    /// The stored writer entries of `(run, key)` in start order; used by tests.
    #[cfg(test)]
    pub(crate) fn entries(&self, run: RunId, key: &TensorKey) -> Vec<(ByteSpan, SlotId)> {
        self.table(run)
            .and_then(|t| t.keys.get(key))
            .map(|l| l.writers.live_entries().iter().map(|e| (e.span, e.slot)).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(i: u64) -> RunId {
        RunId::from_raw(i).unwrap()
    }

    #[test]
    fn an_emptied_run_table_is_reused_by_the_next_run() {
        let mut store = MapStore::with_capacity(64);
        let key = TensorKey::Host { addr: 0x100 };
        let whole = ByteSpan::new(0x100, 0x200).unwrap();
        store.record(run(1), key, whole, Access::Overwrite, SlotId::new(0, 1));
        let capacity = store.runs[0].keys.capacity();
        assert!(capacity >= 64);
        assert_eq!(store.erase_owned(run(1), SlotId::new(0, 1), &[key], false), 1);
        assert!(store.runs.is_empty());
        assert_eq!(store.spare.len(), 1);
        store.record(run(2), key, whole, Access::Overwrite, SlotId::new(1, 1));
        assert_eq!(store.runs[0].keys.capacity(), capacity);
        assert!(store.spare.is_empty());
        store.check_invariants().unwrap();
    }

    #[test]
    fn empty_spans_are_ignored() {
        let mut store = MapStore::default();
        let key = TensorKey::Host { addr: 0x100 };
        let empty = ByteSpan { start: 8, end: 8 };
        assert_eq!(store.record(run(1), key, empty, Access::Overwrite, SlotId::new(0, 1)), 0);
        assert_eq!(store.len(), 0);
        store.record(run(1), key, ByteSpan::ALL, Access::Overwrite, SlotId::new(0, 1));
        let mut seen = 0;
        store.dependencies(run(1), &key, empty, Access::Read, |_| seen += 1);
        assert_eq!(seen, 0);
        store.check_invariants().unwrap();
    }

    /// Representation check: random op sequences keep invariants 1–4 and store exactly the
    /// entries of a plain list model (spans included, not only producers).
    mod representation {
        use proptest::prelude::*;

        use super::*;

        #[derive(Clone, Debug)]
        enum Op {
            Insert(u64, u64, u64, u64, u32),
            EraseOwned(u64, u32, Vec<u64>),
            EraseRun(u64),
            /// One-byte writes of bytes `0..count` by producers `first + i` (distinct) or
            /// `(first + i) % 5` (repeating): pushes a list into its indexed mode.
            Scatter(u64, u64, u32, u32, bool),
            /// `erase_owned` of one key for producers `first..first + count`.
            Reclaim(u64, u64, u32, u32),
        }

        fn scatter_owner(first: u32, i: u32, distinct: bool) -> u32 {
            if distinct { first + i } else { (first + i) % 5 }
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                6 => (1..4_u64, 0..4_u64, 0..24_u64, 1..6_u64, 0..5_u32)
                    .prop_map(|(r, k, s, l, slot)| Op::Insert(r, k, s, s + l, slot)),
                // Writes up to and past the width of a scatter, and of every byte: they shrink
                // an indexed list by supersession and meet it with entries longer than any seen.
                2 => (1..4_u64, 0..4_u64, 0..3_u64, 20..120_u64, 0..5_u32)
                    .prop_map(|(r, k, s, l, slot)| Op::Insert(r, k, s, s + l, slot)),
                1 => (1..4_u64, 0..4_u64, 0..5_u32)
                    .prop_map(|(r, k, slot)| Op::Insert(r, k, 0, u64::MAX, slot)),
                3 => (1..4_u64, 0..5_u32, prop::collection::vec(0..5_u64, 0..4))
                    .prop_map(|(r, slot, keys)| Op::EraseOwned(r, slot, keys)),
                1 => (1..4_u64).prop_map(Op::EraseRun),
                1 => (1..4_u64, 0..4_u64, 30..70_u32, 0..5_u32, any::<bool>())
                    .prop_map(|(r, k, n, first, distinct)| Op::Scatter(r, k, n, first, distinct)),
                1 => (1..4_u64, 0..4_u64, 0..70_u32, 1..70_u32)
                    .prop_map(|(r, k, first, n)| Op::Reclaim(r, k, first, n)),
            ]
        }

        fn cases() -> u32 {
            std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(cases()))]

            #[test]
            fn stored_entries_equal_the_model_after_every_op(ops in prop::collection::vec(op(), 1..80)) {
                let mut store = MapStore::with_capacity(4);
                let mut model: Vec<(RunId, TensorKey, ByteSpan, SlotId)> = Vec::new();
                for op in ops {
                    match op {
                        Op::Insert(r, k, start, end, slot) => {
                            let (r, key) = (run(r), TensorKey::Host { addr: k });
                            let span = ByteSpan { start, end };
                            let slot = SlotId::new(slot, 1);
                            model.retain(|&(mr, mk, ms, _)| !(mr == r && mk == key && span.contains(ms)));
                            model.push((r, key, span, slot));
                            store.record(r, key, span, Access::Overwrite, slot);
                        }
                        Op::EraseOwned(r, slot, keys) => {
                            let keys: Vec<TensorKey> = keys.into_iter().map(|addr| TensorKey::Host { addr }).collect();
                            let owner = SlotId::new(slot, 1);
                            model.retain(|&(mr, mk, _, ms)| !(mr == run(r) && ms == owner && keys.contains(&mk)));
                            store.erase_owned(run(r), owner, &keys, false);
                        }
                        Op::Scatter(r, k, n, first, distinct) => {
                            let (r, key) = (run(r), TensorKey::Host { addr: k });
                            for i in 0..n {
                                let span = ByteSpan { start: u64::from(i), end: u64::from(i) + 1 };
                                let slot = SlotId::new(scatter_owner(first, i, distinct), 1);
                                model.retain(|&(mr, mk, ms, _)| !(mr == r && mk == key && span.contains(ms)));
                                model.push((r, key, span, slot));
                                store.record(r, key, span, Access::Overwrite, slot);
                            }
                        }
                        Op::Reclaim(r, k, first, n) => {
                            let (r, key) = (run(r), TensorKey::Host { addr: k });
                            for owner in (first..first + n).map(|i| SlotId::new(i, 1)) {
                                model.retain(|&(mr, mk, _, ms)| !(mr == r && mk == key && ms == owner));
                                store.erase_owned(r, owner, &[key], false);
                            }
                        }
                        Op::EraseRun(r) => {
                            model.retain(|&(mr, ..)| mr != run(r));
                            store.erase_run(run(r));
                        }
                    }
                    prop_assert_eq!(store.check_invariants(), Ok(()));
                    for r in 1..4 {
                        for k in 0..5 {
                            let key = TensorKey::Host { addr: k };
                            let mut stored = store.entries(run(r), &key);
                            let mut expected: Vec<(ByteSpan, SlotId)> = model
                                .iter()
                                .filter(|&&(mr, mk, ..)| mr == run(r) && mk == key)
                                .map(|&(.., s, slot)| (s, slot))
                                .collect();
                            stored.sort_unstable();
                            expected.sort_unstable();
                            prop_assert_eq!(stored, expected, "run {} key {}", r, k);
                        }
                    }
                }
            }
        }
    }
}
