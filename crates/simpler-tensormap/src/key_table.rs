//! `KeyTable`: one run's buffer keys and their footprint lists.
//!
//! The lists live in a dense slab (`slots`), and a hash index maps each key to its slab position.
//! The index holds only `u32` positions, so it stays a few bytes per key and, for the key counts a
//! run has in flight, cache-resident; the slab is a plain vector whose freed positions are reused
//! last-freed-first, so recently used lists stay warm and keys inserted together sit together.
//! A hash map storing `(TensorKey, list)` pairs directly would spread 72-byte buckets over a table
//! twice the key count, and a lookup would miss the cache once the map outgrew it (spec 70 P4).
//!
//! # Invariants
//!
//! 1. Every position in `index` names a slot that is not in `free`, and no two name the same slot.
//! 2. The slot of an indexed key holds that key and a non-empty list; `free` slots hold empty
//!    lists (their old key is stale and unused).
//! 3. `index.len() + free.len() == slots.len()`.
//!
//! Keys come from this process, so the fast non-cryptographic Fx hash is safe here.

use std::hash::BuildHasher;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use rustc_hash::FxBuildHasher;
use simpler_types::SlotId;

use crate::footprints::FootprintList;
use crate::{ByteSpan, TensorKey};

/// One slab slot: a key and its list.
#[derive(Debug)]
struct Keyed {
    key: TensorKey,
    list: FootprintList,
}

/// One run's keys: a hash index of slab positions over a slab of lists.
#[derive(Debug, Default)]
pub(crate) struct KeyTable {
    index: HashTable<u32>,
    slots: Vec<Keyed>,
    free: Vec<u32>,
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
        }
    }

    /// Number of keys.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// The list of `key`, if the key has live entries.
    #[inline]
    pub(crate) fn get(&self, key: &TensorKey) -> Option<&FootprintList> {
        let slots = &self.slots;
        let at = self.index.find(hash(key), |&at| slots[at as usize].key == *key)?;
        Some(&slots[*at as usize].list)
    }

    /// Inserts `(span, slot)` under `key` (see `FootprintList::insert`); returns the number of
    /// superseded entries.
    pub(crate) fn insert(&mut self, key: TensorKey, span: ByteSpan, slot: SlotId) -> usize {
        let slots = &mut self.slots;
        let vacant = match self.index.entry(
            hash(&key),
            |&at| slots[at as usize].key == key,
            |&at| hash(&slots[at as usize].key),
        ) {
            Entry::Occupied(found) => return slots[*found.get() as usize].list.insert(span, slot),
            Entry::Vacant(vacant) => vacant,
        };
        let keyed = Keyed { key, list: FootprintList::new(span, slot) };
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

    /// Removes `owner`'s entries of `key`, dropping the key when no entry is left; returns the
    /// number removed.
    pub(crate) fn remove_owned(&mut self, key: &TensorKey, owner: SlotId) -> usize {
        let slots = &mut self.slots;
        let Ok(found) = self.index.find_entry(hash(key), |&at| slots[at as usize].key == *key)
        else {
            return 0;
        };
        let at = *found.get() as usize;
        let removed = slots[at].list.remove_owned(owner);
        if slots[at].list.is_empty() {
            found.remove();
            // Drop the list's buffers now rather than when the slot is reused.
            slots[at].list = FootprintList::default();
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

    /// Every key with its list; used by tests.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&TensorKey, &FootprintList)> {
        self.index.iter().map(|&at| {
            let keyed = &self.slots[at as usize];
            (&keyed.key, &keyed.list)
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
            if !self.slots[at as usize].list.is_empty() {
                return Err(format!("free slot {at} holds entries"));
            }
        }
        for (key, list) in self.iter() {
            if self.get(key).map(|l| l as *const _) != Some(list as *const _) {
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
            assert_eq!(table.insert(key, span, SlotId::new(i, 1)), 0);
            assert_eq!(table.remove_owned(&key, SlotId::new(i, 1)), 1);
        }
        assert_eq!((table.len(), table.slots.len()), (0, 1), "one slab slot serves every key");
        table.check_invariants().unwrap();
    }
}
