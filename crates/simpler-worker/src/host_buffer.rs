//! [`HostBuffer`]: host memory that chip tasks of an L3 graph may read and write, staged to and
//! from the chip by its lane (`docs/worker-protocols.md`, "Host tensors on chip tasks").
//!
//! A host buffer's bytes sit behind a mutex, so a sub task, the chip lane staging a chip task
//! and the user's own thread never touch them at the same time. The order between tasks comes
//! from the engine: a tensor of the buffer is tracked by its address like any other, so a sub
//! task that reads what a chip task wrote runs after it.
//!
//! Every live buffer is listed in one process-wide table by address, which is how the chip lane
//! (which only sees tensor descriptors) finds the bytes a tensor names. A submit keeps the
//! buffers its tensors name alive until the run is published, so the lane always finds them.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use simpler_types::{DataType, Tensor};

use crate::error::{BufferName, MemError};

/// An address in this process's memory, as errors carry it: `Debug` and `Display` show it in
/// hex. Compares equal to the plain `u64` (for example [`HostBuffer::addr`]).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostAddr(pub u64);

impl std::fmt::Debug for HostAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostAddr({:#x})", self.0)
    }
}

impl std::fmt::Display for HostAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl PartialEq<u64> for HostAddr {
    fn eq(&self, other: &u64) -> bool {
        self.0 == *other
    }
}

/// The bytes of one host buffer.
struct Bytes {
    data: Mutex<Box<[u8]>>,
    /// Address of `data`'s first byte: stable, the boxed slice never moves or resizes.
    addr: u64,
    len: u64,
}

/// Live host buffers by address.
static LIVE: Mutex<BTreeMap<u64, Weak<Bytes>>> = Mutex::new(BTreeMap::new());

/// Host memory that L3 chip tasks can take as tensors (`child_memory = 0`): the chip lane
/// copies it to the chip before the task (unless every tensor of it is a contiguous blind write
/// over all of it) and back after a successful task (the bytes its written tensors touch).
/// Clones share the bytes.
///
/// ```
/// use simpler_types::DataType;
/// use simpler_worker::HostBuffer;
///
/// let buf = HostBuffer::new(16)?;
/// buf.write(0, &1.5f32.to_le_bytes())?;
/// let t = buf.tensor(&[4], DataType::Float32)?; // a host-memory tensor over all 16 bytes
/// assert!(!t.is_child_memory());
/// assert_eq!(&buf.to_vec()[..4], &1.5f32.to_le_bytes());
/// # Ok::<(), simpler_worker::MemError>(())
/// ```
#[derive(Clone)]
pub struct HostBuffer {
    bytes: Arc<Bytes>,
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer")
            .field("addr", &format_args!("{:#x}", self.bytes.addr))
            .field("len", &self.len())
            .finish()
    }
}

impl HostBuffer {
    /// A zeroed buffer of `len` bytes (`len > 0`); [`MemError::HostAlloc`] if the host cannot
    /// allocate it.
    pub fn new(len: usize) -> Result<HostBuffer, MemError> {
        if len == 0 {
            return Err(MemError::EmptyHostBuffer);
        }
        let mut data = Vec::new();
        data.try_reserve_exact(len)
            .map_err(|e| MemError::HostAlloc { len: len as u64, source: e })?;
        data.resize(len, 0u8);
        let data = data.into_boxed_slice();
        let addr = data.as_ptr() as u64;
        let bytes = Arc::new(Bytes { data: Mutex::new(data), addr, len: len as u64 });
        LIVE.lock().insert(addr, Arc::downgrade(&bytes));
        Ok(HostBuffer { bytes })
    }

    /// A buffer holding a copy of `data` (non-empty).
    pub fn from_bytes(data: &[u8]) -> Result<HostBuffer, MemError> {
        let b = HostBuffer::new(data.len())?;
        b.write(0, data)?;
        Ok(b)
    }

    /// The buffer's address (the `addr` of its tensors).
    pub fn addr(&self) -> u64 {
        self.bytes.addr
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.bytes.len
    }

    /// Always `false`: a host buffer has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// A contiguous host-memory tensor of `shape`/`dtype` at offset 0 of this buffer.
    pub fn tensor(&self, shape: &[u32], dtype: DataType) -> Result<Tensor, MemError> {
        let len = self.len();
        let t = Tensor::with_buffer(self.addr(), len, shape, dtype).map_err(MemError::Tensor)?;
        if t.nbytes() > len {
            let buffer = BufferName::Host { addr: self.addr() };
            return Err(MemError::OutOfRange { buffer, offset: 0, len: t.nbytes(), size: len });
        }
        Ok(t.child_memory(false))
    }

    /// Copies `data` into the buffer at byte `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), MemError> {
        let range = range(self.addr(), offset, data.len() as u64, self.len())?;
        let mut bytes = self.bytes.data.lock();
        bytes[range].copy_from_slice(data);
        Ok(())
    }

    /// Copies `out.len()` bytes from byte `offset` into `out`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), MemError> {
        let range = range(self.addr(), offset, out.len() as u64, self.len())?;
        let bytes = self.bytes.data.lock();
        out.copy_from_slice(&bytes[range]);
        Ok(())
    }

    /// A copy of the whole buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        self.bytes.data.lock().to_vec()
    }

    /// Runs `f` on the buffer's bytes, holding its lock (no copy). Inside `f`, call no other
    /// method of this buffer and nothing that waits on a worker: both can deadlock, since a
    /// chip lane staging this buffer waits for the lock meanwhile (`docs/blocking-calls.md`).
    pub fn with_bytes<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(&mut self.bytes.data.lock())
    }

    /// The buffer tensor `t` is a view of (its `[addr, addr + size)` lies inside), e.g. to
    /// read a host tensor a sub task received.
    pub fn of_tensor(t: &Tensor) -> Option<HostBuffer> {
        if t.is_null() || t.is_child_memory() {
            return None;
        }
        HostBuffer::covering(t.addr, t.size)
    }

    /// The live buffer that holds `[addr, addr + len)` entirely, if any.
    pub(crate) fn covering(addr: u64, len: u64) -> Option<HostBuffer> {
        // The table's guard ends before `bytes` can be dropped: dropping the last reference
        // takes the table's lock to remove the entry.
        let bytes = LIVE.lock().range(..=addr).next_back()?.1.upgrade()?;
        let end = addr.checked_add(len)?;
        (end <= bytes.addr.checked_add(bytes.len)?).then_some(HostBuffer { bytes })
    }

    /// Whether `a` and `b` share their bytes.
    pub(crate) fn same(a: &HostBuffer, b: &HostBuffer) -> bool {
        Arc::ptr_eq(&a.bytes, &b.bytes)
    }
}

impl Drop for Bytes {
    fn drop(&mut self) {
        // The boxed bytes are freed only after this, so no other buffer can have taken the
        // address yet: the entry is this buffer's.
        LIVE.lock().remove(&self.addr);
    }
}

/// The bytes `[offset, offset + len)` of the host buffer at `addr` of `size` bytes.
fn range(addr: u64, offset: u64, len: u64, size: u64) -> Result<std::ops::Range<usize>, MemError> {
    let out = || MemError::OutOfRange { buffer: BufferName::Host { addr }, offset, len, size };
    let end = offset.checked_add(len).filter(|&e| e <= size).ok_or_else(out)?;
    Ok(usize::try_from(offset).map_err(|_| out())?..usize::try_from(end).map_err(|_| out())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use simpler_types::TypesError;

    #[test]
    fn a_host_buffer_of_no_bytes_and_an_access_past_one_are_refused_naming_it() {
        assert!(matches!(HostBuffer::new(0), Err(MemError::EmptyHostBuffer)));
        let b = HostBuffer::new(16).unwrap();
        let err = b.write(12, &[0; 8]).unwrap_err();
        let buffer = BufferName::Host { addr: b.addr() };
        assert!(
            matches!(err, MemError::OutOfRange { buffer: n, offset: 12, len: 8, size: 16 }
                if n == buffer),
            "{err:?}"
        );
        assert!(err.to_string().contains(&format!("host buffer {:#x}", b.addr())), "{err}");
    }

    /// Invariant of the table: an entry upgrades exactly while its buffer is alive, and a lookup
    /// finds a buffer only for a range inside it. Owners create and drop buffers while other
    /// threads look them up, too large ranges included (whose lookups drop the reference they
    /// upgraded, possibly the last one).
    #[test]
    fn lookups_racing_creation_and_drop_find_only_live_covering_buffers() {
        let published: Mutex<Vec<u64>> = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let published = &published;
                s.spawn(move || {
                    for i in 0..2000u64 {
                        let b = HostBuffer::new(64 + (i % 7) as usize).expect("buffer");
                        published.lock().push(b.addr());
                        let found = HostBuffer::covering(b.addr() + 8, 8).expect("own buffer");
                        assert!(HostBuffer::same(&found, &b));
                        assert!(HostBuffer::covering(b.addr(), b.len() + 1).is_none());
                        let others: Vec<u64> = {
                            let p = published.lock();
                            p.iter().rev().take(4).copied().collect()
                        };
                        for addr in others {
                            // Whatever is found (the buffer may be gone) lies around the range.
                            let len = if (i + t) % 2 == 0 { 4 } else { 1 << 20 };
                            if let Some(f) = HostBuffer::covering(addr, len) {
                                assert!(f.addr() <= addr && addr + len <= f.addr() + f.len());
                            }
                        }
                        drop(found);
                        drop(b);
                    }
                });
            }
        });
        assert!(LIVE.lock().values().all(|w| w.strong_count() > 0));
    }

    #[test]
    fn a_buffer_too_large_to_allocate_is_a_typed_error() {
        match HostBuffer::new(usize::MAX) {
            Err(e @ MemError::HostAlloc { len, .. }) => {
                assert_eq!(len, usize::MAX as u64);
                // The allocator's own refusal is the source, not a copy of its text.
                let source = std::error::Error::source(&e).expect("a source");
                assert!(source.is::<std::collections::TryReserveError>(), "{source:?}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_tensor_of_a_refused_shape_carries_the_tensor_error() {
        let b = HostBuffer::new(64).unwrap();
        match b.tensor(&[], DataType::Float32) {
            Err(MemError::Tensor(TypesError::InvalidRank { ndims: 0 })) => {}
            other => panic!("{other:?}"),
        }
    }
}
