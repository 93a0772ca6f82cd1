//! `Access`: what one tensor argument does to its bytes, as the map sees it.

use simpler_types::TensorArgType;

/// How a task touches a footprint: which earlier entries it must order after
/// ([`TensorMap::dependencies`](crate::TensorMap::dependencies)) and which entry it leaves
/// behind ([`TensorMap::record`](crate::TensorMap::record)).
///
/// | Access | Orders after | Leaves |
/// |---|---|---|
/// | `Read` | the writers of overlapping bytes | a reader entry beside the others |
/// | `Overwrite` | the readers of overlapping bytes | a writer entry, superseding what it covers |
/// | `Update` | the writers and the readers of overlapping bytes | a writer entry that also counts as a reader |
///
/// "Readers" here are reader entries, in-place writers, and writers that superseded either: a
/// covering write takes the place of the readers it waited for, so a later write still orders
/// after them through it. The protocol is described in `docs/tensormap.md`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Access {
    /// Reads the bytes (`Input`).
    Read,
    /// Writes the bytes without reading them (`Output`, `OutputExisting`): no edge to the
    /// previous writer.
    Overwrite,
    /// Reads and writes the bytes in place (`InOut`).
    Update,
}

impl Access {
    /// The access of a tag; `None` for `NoDep`, which the map does not track.
    pub const fn of(tag: TensorArgType) -> Option<Access> {
        match tag {
            TensorArgType::Input => Some(Access::Read),
            TensorArgType::Output | TensorArgType::OutputExisting => Some(Access::Overwrite),
            TensorArgType::InOut => Some(Access::Update),
            TensorArgType::NoDep => None,
        }
    }

    /// Whether the access orders after earlier writers: `Read` and `Update`.
    pub const fn after_writers(self) -> bool {
        matches!(self, Access::Read | Access::Update)
    }

    /// Whether the access orders after earlier readers: `Overwrite` and `Update`.
    pub const fn after_readers(self) -> bool {
        matches!(self, Access::Overwrite | Access::Update)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tag_but_no_dep_is_tracked() {
        use TensorArgType::*;
        let table = [
            (Input, Some(Access::Read)),
            (Output, Some(Access::Overwrite)),
            (OutputExisting, Some(Access::Overwrite)),
            (InOut, Some(Access::Update)),
            (NoDep, None),
        ];
        for (tag, access) in table {
            assert_eq!(Access::of(tag), access, "{tag}");
        }
    }
}
