//! `TensorMapError`: the crate's one error type.

use thiserror::Error;

/// Why a tensor argument has no buffer key.
///
/// Only key derivation can fail; the map's own operations cannot.
#[derive(Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TensorMapError {
    /// The tensor lives in a child's memory but the task has no NEXT_LEVEL target to say which
    /// child (a SUB task). A host worker cannot address chip memory, so the engine rejects such a
    /// submit.
    #[error(
        "tensor at {addr:#x} is child memory, but the task has no next-level target to name the \
         child; pass host memory to a sub task or submit it to a next-level worker"
    )]
    ChildMemoryWithoutTarget {
        /// Base address of the offending tensor.
        addr: u64,
    },
}

/// As derived, with the address in hex.
impl std::fmt::Debug for TensorMapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TensorMapError::ChildMemoryWithoutTarget { addr } => f
                .debug_struct("ChildMemoryWithoutTarget")
                .field("addr", &format_args!("{addr:#x}"))
                .finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TensorMapError;

    #[test]
    fn debug_shows_the_address_in_hex() {
        let e = TensorMapError::ChildMemoryWithoutTarget { addr: 0x2000 };
        assert_eq!(format!("{e:?}"), "ChildMemoryWithoutTarget { addr: 0x2000 }");
    }
}
