//! `KeyTable`: one run's buffer keys, each with its writer and reader footprint lists.
//!
//! The lists live in a dense slab (`slots`), and a hash index maps each key to its slab position.
//! The index holds only `u32` positions, so it stays a few bytes per key and, for the key counts a
//! run has in flight, cache-resident; the slab is a plain vector whose freed positions are reused
//! last-freed-first, so recently used lists stay warm and keys inserted together sit together.
//! A hash map storing `(TensorKey, list)` pairs directly would spread 72-byte buckets over a table
//! twice the key count, and a lookup would miss the cache once the map outgrew it (benchmark P4).
//!
//! # Invariants
//!
//! 1. Every position in `index` names a slot that is not in `free`, and no two name the same slot.
//! 2. The slot of an indexed key holds that key and at least one live entry over its two lists;
//!    `free` slots hold empty lists (their old key is stale and unused).
//! 3. `index.len() + free.len() == slots.len()`.
//!
//! Keys come from this process, so the fast non-cryptographic Fx hash is safe here.

use std::cell::Cell;
use std::hash::BuildHasher;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry as TableEntry;
use rustc_hash::FxBuildHasher;
use simpler_types::SlotId;

use crate::entry::Entry;
use crate::footprints::{FootprintList, IndexSpares};
use crate::{Access, ByteSpan, TensorKey};

/// One slab slot: a key and its entries.
#[derive(Debug)]
struct Keyed {
    key: TensorKey,
    entries: KeyEntries,
}

/// The entries of one buffer key: writers and readers, each ordered by start.
#[derive(Debug, Default)]
pub(crate) struct KeyEntries {
    /// Tasks that wrote bytes of the buffer; a read orders after the overlapping ones.
    pub(crate) writers: FootprintList,
    /// Tasks that read bytes of the buffer and no covering write has superseded yet.
    pub(crate) readers: FootprintList,
}

impl KeyEntries {
    fn new(span: ByteSpan, access: Access, slot: SlotId) -> KeyEntries {
        let entry = Entry { span, slot, orders_writes: !access.is_blind_write() };
        match access {
            Access::Read => {
                KeyEntries { writers: FootprintList::default(), readers: FootprintList::new(entry) }
            }
            Access::Overwrite | Access::Scatter | Access::Update => {
                KeyEntries { writers: FootprintList::new(entry), readers: FootprintList::default() }
            }
        }
    }

    /// Number of live entries over both lists.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.writers.len() + self.readers.len()
    }

    fn is_empty(&self) -> bool {
        self.writers.is_empty() && self.readers.is_empty()
    }

    /// Records `access` of `span` by `slot`; returns the number of entries superseded.
    ///
    /// A read adds a reader entry and supersedes nothing (readers of the same bytes stay side by
    /// side). A write supersedes the readers and writers its span covers (a scatter write only
    /// the writers it ordered after, those that order later writes), and its entry orders later
    /// writes when it reads (`Update`) or superseded an entry that did.
    fn record(
        &mut self,
        span: ByteSpan,
        access: Access,
        slot: SlotId,
        spares: &mut IndexSpares,
    ) -> usize {
        let mut entry = Entry { span, slot, orders_writes: !access.is_blind_write() };
        if access == Access::Read {
            self.readers.add(entry, spares);
            return 0;
        }
        let readers = self.readers.supersede(span, spares);
        entry.orders_writes |= readers.orders_writes;
        if access == Access::Scatter {
            // Its gaps may hold bytes only an earlier writer wrote: a writer it did not order
            // after stays. One it did order after goes: a later access of its bytes finds the
            // scatter, which orders after it.
            return readers.count + self.writers.insert_over_ordering(entry, spares).count;
        }
        readers.count + self.writers.insert(entry, spares).count
    }

    /// Calls `visit` for the tasks `access` of `span` orders after (see [`Access`]).
    #[inline]
    pub(crate) fn visit(
        &self,
        span: ByteSpan,
        access: Access,
        scratch: &Cell<Vec<SlotId>>,
        mut visit: impl FnMut(SlotId),
    ) {
        match access {
            Access::Read => self.writers.visit_overlapping(span, |_| true, scratch, visit),
            Access::Update => {
                self.writers.visit_overlapping(span, |_| true, scratch, &mut visit);
                self.readers.visit_overlapping(span, |_| true, scratch, visit);
            }
            Access::Overwrite | Access::Scatter => {
                self.writers.visit_overlapping(span, |e| e.orders_writes, scratch, &mut visit);
                self.readers.visit_overlapping(span, |_| true, scratch, visit);
            }
        }
    }

    fn remove_owned(
        &mut self,
        owner: SlotId,
        readers_only: bool,
        spares: &mut IndexSpares,
    ) -> usize {
        let writers = if readers_only { 0 } else { self.writers.remove_owned(owner, spares) };
        writers + self.readers.remove_owned(owner, spares)
    }
}

/// One run's keys: a hash index of slab positions over a slab of lists.
#[derive(Debug, Default)]
pub(crate) struct KeyTable {
    index: HashTable<u32>,
    slots: Vec<Keyed>,
    free: Vec<u32>,
    /// Owner indexes the lists left behind, for the next list that fans in.
    spares: IndexSpares,
}

fn hash(key: &TensorKey) -> u64 {
    FxBuildHasher.hash_one(key)
}

impl KeyTable {
    /// An empty table with room for `keys` keys.
    pub(crate) fn with_capacity(keys: usize) -> KeyTable {
        KeyTable {
            index: HashTable::with_capacity(keys),
            slots: Vec::with_capacity(keys),
            free: Vec::new(),
            spares: IndexSpares::default(),
        }
    }

    /// Number of keys.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// The entries of `key`, if the key has live entries.
    #[inline]
    pub(crate) fn get(&self, key: &TensorKey) -> Option<&KeyEntries> {
        let slots = &self.slots;
        let at = self.index.find(hash(key), |&at| slots[at as usize].key == *key)?;
        Some(&slots[*at as usize].entries)
    }

    /// Records `access` of `span` of `key` by `slot` (see `KeyEntries::record`); returns the
    /// number of superseded entries.
    #[cfg(test)]
    pub(crate) fn record(
        &mut self,
        key: TensorKey,
        span: ByteSpan,
        access: Access,
        slot: SlotId,
    ) -> usize {
        self.visit_and_record(key, span, access, slot, None::<(&Cell<Vec<SlotId>>, fn(SlotId))>)
    }

    /// Visits what `access` orders after (when `visit` is given) and then records it, with one
    /// hash probe.
    pub(crate) fn visit_and_record(
        &mut self,
        key: TensorKey,
        span: ByteSpan,
        access: Access,
        slot: SlotId,
        visit: Option<(&Cell<Vec<SlotId>>, impl FnMut(SlotId))>,
    ) -> usize {
        let slots = &mut self.slots;
        let vacant = match self.index.entry(
            hash(&key),
            |&at| slots[at as usize].key == key,
            |&at| hash(&slots[at as usize].key),
        ) {
            TableEntry::Occupied(found) => {
                let entries = &mut slots[*found.get() as usize].entries;
                if let Some((scratch, visit)) = visit {
                    entries.visit(span, access, scratch, visit);
                }
                return entries.record(span, access, slot, &mut self.spares);
            }
            TableEntry::Vacant(vacant) => vacant,
        };
        let keyed = Keyed { key, entries: KeyEntries::new(span, access, slot) };
        let at = match self.free.pop() {
            Some(at) => {
                slots[at as usize] = keyed;
                at
            }
            None => {
                slots.push(keyed);
                // Positions past `u32::MAX` would need a slab of more than 300 GB.
                u32::try_from(slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        vacant.insert(at);
        0
    }

    /// Removes `owner`'s entries of `key` (only its reader entries if `readers_only`), dropping
    /// the key when no entry is left; returns the number removed.
    pub(crate) fn remove_owned(
        &mut self,
        key: &TensorKey,
        owner: SlotId,
        readers_only: bool,
    ) -> usize {
        let slots = &mut self.slots;
        let Ok(found) = self.index.find_entry(hash(key), |&at| slots[at as usize].key == *key)
        else {
            return 0;
        };
        let at = *found.get() as usize;
        let removed = slots[at].entries.remove_owned(owner, readers_only, &mut self.spares);
        if slots[at].entries.is_empty() {
            found.remove();
            // Drop the lists' buffers now rather than when the slot is reused.
            slots[at].entries = KeyEntries::default();
            self.free.push(at as u32);
        }
        removed
    }

    /// Removes every key, keeping the capacity for the next run that uses this table.
    pub(crate) fn clear(&mut self) {
        if self.index.is_empty() {
            // Every slot is already free and empty (the usual end of a run, whose keys were erased
            // one by one): keeping them as they are saves a pass over the whole slab.
            return;
        }
        self.index.clear();
        self.slots.clear();
        self.free.clear();
    }

    /// Number of keys the index can hold without growing.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.index.capacity()
    }

    /// Every key with its entries; used by tests.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&TensorKey, &KeyEntries)> {
        self.index.iter().map(|&at| {
            let keyed = &self.slots[at as usize];
            (&keyed.key, &keyed.entries)
        })
    }

    /// Checks invariants 1–3 of the module docs; used by tests.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let mut used = vec![false; self.slots.len()];
        for &at in self.index.iter().chain(&self.free) {
            let seen = used.get_mut(at as usize).ok_or(format!("position {at} out of range"))?;
            if std::mem::replace(seen, true) {
                return Err(format!("position {at} is named twice"));
            }
        }
        if used.iter().any(|u| !u) {
            return Err("a slab slot is neither indexed nor free".into());
        }
        for &at in &self.free {
            if !self.slots[at as usize].entries.is_empty() {
                return Err(format!("free slot {at} holds entries"));
            }
        }
        for (key, entries) in self.iter() {
            if entries.is_empty() {
                return Err(format!("{key} is stored with no live entry"));
            }
            if self.get(key).map(|l| l as *const _) != Some(entries as *const _) {
                return Err(format!("{key} is not found at its own slot"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn churn_reuses_freed_slab_slots() {
        let mut table = KeyTable::with_capacity(4);
        let span = ByteSpan { start: 0, end: 8 };
        for i in 0..100_u32 {
            let key = TensorKey::Host { addr: u64::from(i) };
            assert_eq!(table.record(key, span, Access::Overwrite, SlotId::new(i, 1)), 0);
            assert_eq!(table.remove_owned(&key, SlotId::new(i, 1), false), 1);
        }
        assert_eq!((table.len(), table.slots.len()), (0, 1), "one slab slot serves every key");
        table.check_invariants().unwrap();
    }
}
