//! [`MapEntry`]: one slot of the fixed map's entry pool, and the access vocabulary
//! ([`AccessMode`], [`Role`]) that decides which entries an access finds and which one it adds.

#[cfg(feature = "std")]
use crate::Access;
use crate::ByteSpan;

/// What a task does to a footprint, as far as dependencies are concerned.
///
/// The engine's tags map onto it as `Input` → [`Read`](Self::Read), `Output` and
/// `OutputExisting` → [`Write`](Self::Write), `InOut` → [`ReadWrite`](Self::ReadWrite); `NoDep`
/// and untracked tensors never reach the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessMode {
    /// Reads the bytes: depends on their writers, and is recorded as a reader so that a later
    /// write waits for it.
    Read,
    /// Overwrites the bytes without reading them: depends on their live readers (no edge to a
    /// previous blind writer), and on a previous writer that stands in for readers it
    /// superseded; recorded as their writer.
    Write,
    /// Reads and then writes the bytes: depends on their writers and their live readers, and is
    /// recorded as their writer.
    ReadWrite,
    /// Overwrites some of the footprint's bytes (a view with gaps, whose footprint is its
    /// bounding range): depends on what [`Write`](Self::Write) depends on; recorded as a writer
    /// that takes the place only of the entries it found (earlier blind writers stay, as their
    /// bytes in its gaps are still theirs).
    ScatterWrite,
}

impl AccessMode {
    /// `true` when a lookup for this access visits writer entries.
    pub const fn finds_writers(self) -> bool {
        matches!(self, AccessMode::Read | AccessMode::ReadWrite)
    }

    /// `true` when a lookup for this access visits reader entries.
    pub const fn finds_readers(self) -> bool {
        matches!(self, AccessMode::Write | AccessMode::ScatterWrite | AccessMode::ReadWrite)
    }

    /// The kind of entry an insert for this access adds.
    pub const fn records_as(self) -> Role {
        match self {
            AccessMode::Read => Role::Reader,
            AccessMode::Write | AccessMode::ScatterWrite | AccessMode::ReadWrite => Role::Writer,
        }
    }

    /// `true` when an access of this mode finds entries of `role`. A blind
    /// [`Write`](Self::Write) also finds the writer entries that order later writes
    /// ([`MapEntry::orders_writes`]); [`finds_entry`](Self::finds_entry) tells.
    pub const fn finds(self, role: Role) -> bool {
        match role {
            Role::Writer => self.finds_writers(),
            Role::Reader => self.finds_readers(),
        }
    }

    /// `true` when an access of this mode finds `entry` (whatever its key and span).
    pub const fn finds_entry<K>(self, entry: &MapEntry<K>) -> bool {
        match entry.role() {
            None => false,
            Some(role) => self.finds(role) || (self.finds_readers() && entry.orders_writes()),
        }
    }
}

#[cfg(feature = "std")]
impl From<Access> for AccessMode {
    /// The host map's access kinds in the fixed map's words: a read, a blind overwrite, an
    /// in-place update.
    fn from(access: Access) -> AccessMode {
        match access {
            Access::Read => AccessMode::Read,
            Access::Overwrite => AccessMode::Write,
            Access::Scatter => AccessMode::ScatterWrite,
            Access::Update => AccessMode::ReadWrite,
        }
    }
}

/// What a live entry records: that its owner writes or reads its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Role {
    /// The owner produces the bytes.
    Writer = 1,
    /// The owner reads the bytes; a later write must wait for it.
    Reader = 2,
}

/// The `role` byte of an entry on the free list.
pub(crate) const VACANT: u8 = 0;

/// One slot of the entry pool: a live `(key, footprint, owner, role)` record, or a vacant slot
/// on the free list.
///
/// The caller provides the pool as a slice of these (any contents: the map writes a slot before
/// it first reads it), so that the pool can live in memory the caller
/// manages. The layout is `repr(C)` with the key last; for the device's `u64` keys it is fixed
/// at 40 bytes (checked at compile time): `start`, `end`, `owner` at offsets 0, 8, 16, the
/// chain link `next` at 24, the `role` byte at 28, the `orders_writes` byte at 29, two reserved
/// bytes, the key at 32. Every
/// field is an integer there, so any bytes form a valid entry.
///
/// [`FixedTensorMap::new`]: super::FixedTensorMap::new
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapEntry<K> {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) owner: u64,
    /// Next slot in this entry's bucket chain, or in the free list; `NIL` ends either.
    pub(crate) next: u32,
    /// [`VACANT`], or a [`Role`] discriminant.
    pub(crate) role: u8,
    /// Non-zero on a writer entry that a later blind write must order after: its owner read the
    /// bytes (`ReadWrite`), or it superseded an entry that ordered later writes.
    pub(crate) orders_writes: u8,
    pub(crate) reserved: [u8; 2],
    pub(crate) key: K,
}

const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<MapEntry<u64>>() == 40);
    assert!(align_of::<MapEntry<u64>>() == 8);
    assert!(offset_of!(MapEntry<u64>, start) == 0);
    assert!(offset_of!(MapEntry<u64>, end) == 8);
    assert!(offset_of!(MapEntry<u64>, owner) == 16);
    assert!(offset_of!(MapEntry<u64>, next) == 24);
    assert!(offset_of!(MapEntry<u64>, role) == 28);
    assert!(offset_of!(MapEntry<u64>, orders_writes) == 29);
    assert!(offset_of!(MapEntry<u64>, key) == 32);
};

impl<K> MapEntry<K> {
    /// A vacant slot, for building the pool; `key` is a placeholder that is never compared.
    pub const fn vacant(key: K) -> MapEntry<K> {
        MapEntry {
            start: 0,
            end: 0,
            owner: 0,
            next: u32::MAX,
            role: VACANT,
            orders_writes: 0,
            reserved: [0; 2],
            key,
        }
    }

    /// The buffer the entry belongs to.
    pub const fn key(&self) -> &K {
        &self.key
    }

    /// The bytes the entry covers.
    pub const fn span(&self) -> ByteSpan {
        ByteSpan { start: self.start, end: self.end }
    }

    /// The task that wrote or read the bytes (the caller's opaque tag).
    pub const fn owner(&self) -> u64 {
        self.owner
    }

    /// `true` when a later blind write of these bytes must order after the entry's owner: the
    /// entry is a reader, or a writer that read the bytes or took that duty over from the
    /// entries it superseded.
    pub const fn orders_writes(&self) -> bool {
        self.role == Role::Reader as u8 || self.orders_writes != 0
    }

    /// What the entry records; `None` for a vacant slot.
    pub const fn role(&self) -> Option<Role> {
        match self.role {
            1 => Some(Role::Writer),
            2 => Some(Role::Reader),
            _ => None,
        }
    }
}

impl<K: Default> Default for MapEntry<K> {
    fn default() -> MapEntry<K> {
        MapEntry::vacant(K::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_find_and_record_the_roles_of_the_dependency_rules() {
        use AccessMode::*;
        let table = [(Read, true, false, Role::Reader), (Write, false, true, Role::Writer)];
        for (mode, writers, readers, records) in table {
            assert_eq!((mode.finds_writers(), mode.finds_readers()), (writers, readers));
            assert_eq!(mode.records_as(), records);
        }
        assert!(ReadWrite.finds(Role::Writer) && ReadWrite.finds(Role::Reader));
        assert_eq!(ReadWrite.records_as(), Role::Writer);
    }

    #[test]
    fn a_vacant_entry_has_no_role() {
        let e = MapEntry::<u64>::default();
        assert_eq!((e.role(), e.span().is_empty()), (None, true));
        assert_eq!(Role::Writer as u8, 1);
    }
}
