//! `TensorArgType`: the access tag of a tensor argument and the dependency edges it implies
//! (see `docs/types.md` and `docs/tensormap.md`).
//!
//! Edges are inferred per byte footprint, within one run, against the earlier tasks that have
//! not retired yet:
//!
//! | Tag | Orders after earlier writers (read after write / write after write) | Orders after earlier readers (write after read) | Later writes order after it | Null address |
//! |---|---|---|---|---|
//! | `Input` | yes | no (readers stay concurrent) | yes | allowed (untracked) |
//! | `InOut` | yes | yes | yes | rejected |
//! | `Output` | no | yes | only where it replaced readers | rejected |
//! | `OutputExisting` | no | yes | only where it replaced readers | rejected |
//! | `NoDep` | no | no | no | allowed |
//!
//! "Readers" are `Input` and `InOut` tasks. Example (the original runtime's issue #1306):
//! `W0: InOut buf`, `R0: Input buf`, `W1: InOut buf` gives the edges `W0 → R0`, `W0 → W1` and
//! `R0 → W1`, so `W1` never overwrites `buf` while `R0` still reads it. With `W1: Output buf`
//! instead the edges are the same, since `W0` reads `buf` too; had `W0` been an `Output`, `W1`
//! would get only `R0 → W1`: a blind write does not wait for a previous blind writer, but does
//! wait for the readers. A blind write that replaces readers stands in for them, so a second
//! blind write of the same bytes orders after it. Nothing needs to be opted into.
//!
//! Dependencies are tracked by each view's bounding byte range. A blind write of a view with
//! gaps (strided or permuted) does not replace the earlier writers in its range: a later read of
//! bytes in its gaps still waits for whoever wrote them.
//!
//! The runtime never allocates an output buffer on the caller's behalf: a write-tagged tensor
//! with address 0 is rejected at submit by the engine.

use std::fmt;

/// Access tag of one tensor argument. The wire values are frozen.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
#[repr(i32)]
pub enum TensorArgType {
    /// Read; orders after the writers of its bytes (read after write), and later writes of its
    /// bytes order after it (write after read). Readers never order after each other.
    #[default]
    Input = 0,
    /// Blind overwrite; orders after the live readers of its bytes (an `InOut` writer is one),
    /// not after a previous blind writer.
    Output = 1,
    /// Read and write in place; orders after the previous writers and the readers of its bytes.
    InOut = 2,
    /// Blind overwrite of an existing buffer: orders after the live readers of its bytes (an
    /// `InOut` writer is one), not after a previous blind writer.
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

    /// Whether submit orders the access after the writers of its bytes: `Input`, `InOut`.
    pub const fn looks_up(self) -> bool {
        matches!(self, TensorArgType::Input | TensorArgType::InOut)
    }

    /// Whether submit records the task as the new writer of its bytes: `InOut`, `Output`,
    /// `OutputExisting`. (Every write tag also orders after the readers of its bytes.)
    pub const fn inserts(self) -> bool {
        matches!(self, TensorArgType::InOut | TensorArgType::Output | TensorArgType::OutputExisting)
    }

    /// Whether a null (`addr == 0`) tensor is accepted with this tag: only `Input` and `NoDep`
    /// (any tag takes a null view with no elements: `Tensor::lacks_buffer_for`).
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
