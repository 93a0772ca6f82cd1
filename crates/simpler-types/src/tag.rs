//! `TensorArgType`: the access tag of a tensor argument and the dependency rules it implies
//! (see `docs/types.md`).
//!
//! | Tag | Looks up producer | Becomes producer | Null address |
//! |---|---|---|---|
//! | `Input` | yes | no | allowed (untracked) |
//! | `InOut` | yes | yes | rejected |
//! | `Output` | no | yes | rejected |
//! | `OutputExisting` | no | yes | rejected |
//! | `NoDep` | no | no | allowed |
//!
//! The runtime never allocates an output buffer on the caller's behalf: a write-tagged tensor
//! with address 0 is rejected at submit by the engine.

use std::fmt;

/// Access tag of one tensor argument. The wire values are frozen.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
#[repr(i32)]
pub enum TensorArgType {
    /// Read; orders after the current producer (read-after-write).
    #[default]
    Input = 0,
    /// Blind overwrite; becomes the producer without ordering after the previous one.
    Output = 1,
    /// Read and write in place; orders after the previous producer and becomes the producer.
    InOut = 2,
    /// Blind overwrite of an existing buffer, without ordering against its previous writer.
    OutputExisting = 3,
    /// Neither looked up nor recorded; the caller orders accesses itself.
    NoDep = 4,
}

impl TensorArgType {
    /// `Input` and `InOut`.
    pub const fn reads(self) -> bool {
        matches!(self, TensorArgType::Input | TensorArgType::InOut)
    }

    /// `Output`, `OutputExisting` and `InOut`.
    pub const fn writes(self) -> bool {
        matches!(self, TensorArgType::Output | TensorArgType::OutputExisting | TensorArgType::InOut)
    }

    /// Whether submit looks up the current producer (and adds an edge): `Input`, `InOut`.
    pub const fn looks_up(self) -> bool {
        matches!(self, TensorArgType::Input | TensorArgType::InOut)
    }

    /// Whether submit records the task as the new producer: `InOut`, `Output`, `OutputExisting`.
    pub const fn inserts(self) -> bool {
        matches!(self, TensorArgType::InOut | TensorArgType::Output | TensorArgType::OutputExisting)
    }

    /// Whether a null (`addr == 0`) tensor is accepted with this tag: only `Input` and `NoDep`.
    pub const fn allows_null(self) -> bool {
        matches!(self, TensorArgType::Input | TensorArgType::NoDep)
    }

    /// The wire value.
    pub const fn as_i32(self) -> i32 {
        self as i32
    }

    /// Decodes a wire value; `None` for an unknown one.
    pub const fn from_i32(v: i32) -> Option<TensorArgType> {
        Some(match v {
            0 => TensorArgType::Input,
            1 => TensorArgType::Output,
            2 => TensorArgType::InOut,
            3 => TensorArgType::OutputExisting,
            4 => TensorArgType::NoDep,
            _ => return None,
        })
    }

    /// The upper-case name used in traces and dumps.
    pub const fn name(self) -> &'static str {
        match self {
            TensorArgType::Input => "INPUT",
            TensorArgType::Output => "OUTPUT",
            TensorArgType::InOut => "INOUT",
            TensorArgType::OutputExisting => "OUTPUT_EXISTING",
            TensorArgType::NoDep => "NO_DEP",
        }
    }
}

impl fmt::Display for TensorArgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::TensorArgType::{self, *};

    #[test]
    fn predicates_match_the_dependency_table() {
        // (tag, reads, writes, looks_up, inserts, allows_null), straight from the table above.
        let table = [
            (Input, true, false, true, false, true),
            (InOut, true, true, true, true, false),
            (Output, false, true, false, true, false),
            (OutputExisting, false, true, false, true, false),
            (NoDep, false, false, false, false, true),
        ];
        for (tag, r, w, l, i, n) in table {
            assert_eq!(
                (tag.reads(), tag.writes(), tag.looks_up(), tag.inserts(), tag.allows_null()),
                (r, w, l, i, n),
                "{tag}"
            );
            assert_eq!(TensorArgType::from_i32(tag.as_i32()), Some(tag));
        }
        assert_eq!(TensorArgType::default(), Input);
        assert_eq!(TensorArgType::from_i32(5), None);
        assert_eq!(TensorArgType::from_i32(-1), None);
    }
}
