//! `TensorKey`: what "the same buffer" means to the map (`docs/tensormap.md` §1).
//!
//! A key names one backing buffer. Views, slices and reshapes of a local buffer share the key of
//! its base address; which bytes a view touches is carried separately by a
//! [`ByteSpan`](crate::ByteSpan). Remote keys are the deliberate exception: they include the
//! descriptor's byte `offset`, so remote views at different offsets are different keys
//! (rule A.1.3), because a remote descriptor names a region, not a base address the local side
//! could relate to its other views.

use std::fmt;

use simpler_types::WorkerId;

/// Identity of one backing buffer.
///
/// Equality compares the variant and every field (rule A.1.4): the same address on two chips is
/// two buffers, and the same address as host memory and as child memory is two buffers.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TensorKey {
    /// Host memory (`Tensor.child_memory == 0`), named by the buffer's base address.
    Host {
        /// Base address of the buffer.
        addr: u64,
    },
    /// Memory that already lives on one NEXT_LEVEL child (`Tensor.child_memory == 1`).
    Child {
        /// The child whose address space `addr` belongs to.
        worker: WorkerId,
        /// Base address of the buffer in that child's address space.
        addr: u64,
    },
    /// A buffer reached through a remote descriptor.
    Remote {
        /// Which kind of remote region the descriptor names.
        space: RemoteSpace,
        /// The worker that owns the region.
        owner: WorkerId,
        /// The owner's id for the buffer.
        buffer_id: u64,
        /// The buffer's generation, so that a recycled `buffer_id` is a different key.
        generation: u64,
        /// Byte offset of the descriptor inside the buffer (part of the identity, rule A.1.3).
        offset: u64,
    },
}

/// The kind of region a [`TensorKey::Remote`] names.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum RemoteSpace {
    /// A registered remote buffer.
    Buffer,
    /// Host memory carried inline with the remote call.
    HostInline,
}

impl fmt::Display for RemoteSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RemoteSpace::Buffer => "buffer",
            RemoteSpace::HostInline => "host-inline",
        })
    }
}

/// As derived, with addresses and offsets in hex: `Host { addr: 0x1000 }`.
impl fmt::Debug for TensorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = |v: u64| format!("{v:#x}");
        match *self {
            TensorKey::Host { addr } => {
                f.debug_struct("Host").field("addr", &format_args!("{}", hex(addr))).finish()
            }
            TensorKey::Child { worker, addr } => f
                .debug_struct("Child")
                .field("worker", &worker)
                .field("addr", &format_args!("{}", hex(addr)))
                .finish(),
            TensorKey::Remote { space, owner, buffer_id, generation, offset } => f
                .debug_struct("Remote")
                .field("space", &space)
                .field("owner", &owner)
                .field("buffer_id", &buffer_id)
                .field("generation", &generation)
                .field("offset", &format_args!("{}", hex(offset)))
                .finish(),
        }
    }
}

impl fmt::Display for TensorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TensorKey::Host { addr } => write!(f, "host buffer {addr:#x}"),
            TensorKey::Child { worker, addr } => {
                write!(f, "buffer {addr:#x} on next-level worker {worker}")
            }
            TensorKey::Remote { space, owner, buffer_id, generation, offset } => write!(
                f,
                "remote {space} {buffer_id}@{generation}+{offset:#x} owned by worker {owner}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_addresses_and_offsets_in_hex() {
        assert_eq!(format!("{:?}", TensorKey::Host { addr: 0x1000 }), "Host { addr: 0x1000 }");
        let child = TensorKey::Child { worker: WorkerId(2), addr: 0x12c0000 };
        assert!(format!("{child:?}").ends_with("addr: 0x12c0000 }"), "{child:?}");
        let remote = TensorKey::Remote {
            space: RemoteSpace::Buffer,
            owner: WorkerId(1),
            buffer_id: 7,
            generation: 1,
            offset: 0x40,
        };
        assert!(format!("{remote:?}").contains("buffer_id: 7, generation: 1, offset: 0x40 }"));
    }

    #[test]
    fn keys_differing_in_any_field_are_distinct() {
        let w0 = WorkerId(0);
        let w1 = WorkerId(1);
        let remote = |space, owner, buffer_id, generation, offset| TensorKey::Remote {
            space,
            owner,
            buffer_id,
            generation,
            offset,
        };
        let variants = [
            TensorKey::Host { addr: 0x1000 },
            TensorKey::Child { worker: w0, addr: 0x1000 },
            TensorKey::Child { worker: w1, addr: 0x1000 },
            remote(RemoteSpace::Buffer, w0, 7, 1, 0),
            remote(RemoteSpace::HostInline, w0, 7, 1, 0),
            remote(RemoteSpace::Buffer, w1, 7, 1, 0),
            remote(RemoteSpace::Buffer, w0, 8, 1, 0),
            remote(RemoteSpace::Buffer, w0, 7, 2, 0),
            remote(RemoteSpace::Buffer, w0, 7, 1, 64),
        ];
        for (i, a) in variants.iter().enumerate() {
            for (j, b) in variants.iter().enumerate() {
                assert_eq!(a == b, i == j, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn display_names_the_memory_kind() {
        assert_eq!(TensorKey::Host { addr: 0x40 }.to_string(), "host buffer 0x40");
        assert_eq!(
            TensorKey::Child { worker: WorkerId(3), addr: 0x40 }.to_string(),
            "buffer 0x40 on next-level worker 3"
        );
    }
}
