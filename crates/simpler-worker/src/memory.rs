//! Device-memory helpers on a chip (`docs/worker-protocols.md` §10): allocations owned by one
//! chip of one worker, with ownership and range checks, and the chip's memory ledger.
//!
//! Memory calls queue on the chip's lane behind work already there, never behind tasks still
//! waiting in a graph. From a closure running on that same lane they are `Reentrant`: the call
//! would queue behind the closure that waits for it.

use std::collections::BTreeMap;

use simpler_device_a2a3::MemoryLedger;
use simpler_types::{DataType, Tensor, WorkerId};

use crate::error::{BufferName, MemError, WorkerError};
use crate::worker::Inner;

/// A device allocation: meaningful only with its chip.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceBuffer {
    worker: u64,
    chip: WorkerId,
    /// The chip process that allocated it (PROCESS mode; 0 in this process).
    process: u64,
    /// Which allocation of its chip it is: a copy kept past `free` is refused even when a
    /// later allocation got the same address.
    serial: u64,
    addr: u64,
    len: u64,
}

/// The allocations made through the memory helpers on one chip: address → (length, serial),
/// all made by chip process `process` (those of an earlier process ended with it).
#[derive(Default)]
pub(crate) struct ChipAllocations {
    pub(crate) process: u64,
    pub(crate) by_addr: BTreeMap<u64, (u64, u64)>,
}

impl ChipAllocations {
    /// Records `bytes` at `addr`, allocation `serial` of chip process `process`. Processes only
    /// follow each other: a newer one's allocations replace the older ones' (which died with
    /// it); one of an older process, met late (its `malloc` raced a restart), is not recorded.
    fn record(&mut self, process: u64, addr: u64, bytes: u64, serial: u64) {
        if process > self.process {
            *self = ChipAllocations { process, by_addr: BTreeMap::new() };
        }
        if process == self.process {
            self.by_addr.insert(addr, (bytes, serial));
        }
    }

    /// Forgets the allocation at `addr` if it is still allocation `serial`: once the chip has
    /// freed it, another thread's `malloc` may already have been given the address again.
    fn forget(&mut self, addr: u64, serial: u64) {
        if self.by_addr.get(&addr).is_some_and(|&(_, s)| s == serial) {
            self.by_addr.remove(&addr);
        }
    }
}

impl std::fmt::Debug for DeviceBuffer {
    /// Addresses in hex, as everywhere else.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("chip", &self.chip)
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl DeviceBuffer {
    /// The chip that owns the memory.
    pub fn chip(&self) -> WorkerId {
        self.chip
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the buffer is empty (never, for a successful `malloc`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// A contiguous chip-memory tensor over the buffer; the shape must fit in it.
    pub fn tensor(&self, shape: &[u32], dtype: DataType) -> Result<Tensor, MemError> {
        let t = Tensor::external(self.addr, shape, dtype).map_err(MemError::Tensor)?;
        let bytes = shape.iter().fold(dtype.element_size(), |a, &d| a.saturating_mul(u64::from(d)));
        if bytes > self.len {
            let buffer = BufferName::Device { chip: self.chip, addr: self.addr };
            return Err(MemError::OutOfRange { buffer, offset: 0, len: bytes, size: self.len });
        }
        Ok(t.child_memory(true))
    }
}

/// Memory calls on one chip of a worker.
pub struct ChipMemory<'w> {
    pub(crate) inner: &'w Inner,
    pub(crate) chip: WorkerId,
}

impl std::fmt::Debug for ChipMemory<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChipMemory").field("chip", &self.chip).finish_non_exhaustive()
    }
}

impl ChipMemory<'_> {
    /// The chip.
    pub fn chip(&self) -> WorkerId {
        self.chip
    }

    fn check(&self, buf: &DeviceBuffer, offset: u64, len: u64) -> Result<(), MemError> {
        if buf.worker != self.inner.instance || buf.chip != self.chip {
            return Err(MemError::WrongChip { buffer_chip: buf.chip, chip: self.chip });
        }
        if offset.checked_add(len).is_none_or(|end| end > buf.len) {
            let buffer = BufferName::Device { chip: buf.chip, addr: buf.addr };
            return Err(MemError::OutOfRange { buffer, offset, len, size: buf.len });
        }
        Ok(())
    }

    /// Allocates `bytes` on the chip.
    pub fn malloc(&self, bytes: u64) -> Result<DeviceBuffer, WorkerError> {
        self.inner.off_lane("malloc")?;
        let _lease = self.inner.lease()?;
        let ((addr, serial), process) = self
            .inner
            .on_chip(self.chip, move |s| s.malloc(bytes).map(|a| (a, s.memory_process())))??;
        let mut owned = self.inner.owned.lock();
        owned.entry(self.chip).or_default().record(process, addr, bytes, serial);
        let worker = self.inner.instance;
        Ok(DeviceBuffer { worker, chip: self.chip, process, serial, addr, len: bytes })
    }

    /// Frees a buffer of this chip, after every run accepted before the call is published, so
    /// that memory never vanishes under a queued task. From inside one of the worker's own
    /// callbacks or closures, where that wait would never end, it is `Reentrant`.
    pub fn free(&self, buf: DeviceBuffer) -> Result<(), WorkerError> {
        self.check(&buf, 0, 0)?;
        self.inner.off_lane("free")?;
        if crate::reentry::is_acting_for(self.inner.instance) {
            return Err(WorkerError::Reentrant { op: "free", worker: self.inner.label.clone() });
        }
        // Declared before the lease: keep-alives of runs this wait publishes are dropped after
        // the lease is returned (a keep-alive whose drop closes the worker waits for leases).
        let _deferred = crate::deferred_drop::scope();
        let _lease = self.inner.lease()?;
        self.inner.wait_accepted();
        self.inner.on_chip(self.chip, move |s| {
            s.check_buffer(buf.process, buf.addr, buf.len, buf.serial)?;
            s.free(buf.addr)
        })??;
        if let Some(m) = self.inner.owned.lock().get_mut(&self.chip) {
            m.forget(buf.addr, buf.serial);
        }
        Ok(())
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn copy_to(&self, buf: &DeviceBuffer, offset: u64, data: &[u8]) -> Result<(), WorkerError> {
        self.check(buf, offset, data.len() as u64)?;
        self.inner.off_lane("copy_to")?;
        let _lease = self.inner.lease()?;
        let bytes = data.to_vec();
        let (base, len, process, serial) = (buf.addr, buf.len, buf.process, buf.serial);
        Ok(self.inner.on_chip(self.chip, move |s| {
            s.check_buffer(process, base, len, serial)?;
            s.copy_to(base + offset, &bytes)
        })??)
    }

    /// Copies from the buffer at `offset` into `out`.
    pub fn copy_from(
        &self,
        buf: &DeviceBuffer,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), WorkerError> {
        self.check(buf, offset, out.len() as u64)?;
        self.inner.off_lane("copy_from")?;
        let _lease = self.inner.lease()?;
        let (base, size, process, len) = (buf.addr, buf.len, buf.process, out.len());
        let serial = buf.serial;
        let data = self.inner.on_chip(self.chip, move |s| {
            s.check_buffer(process, base, size, serial)?;
            s.copy_from(base + offset, len)
        })??;
        out.copy_from_slice(&data);
        Ok(())
    }

    /// The chip's memory by use.
    pub fn ledger(&self) -> Result<MemoryLedger, WorkerError> {
        self.inner.off_lane("ledger")?;
        let _lease = self.inner.lease()?;
        Ok(self.inner.on_chip(self.chip, |s| s.ledger())??)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_allocation_of_an_older_chip_process_does_not_replace_the_newer_ones() {
        let mut a = ChipAllocations::default();
        a.record(1, 0x100, 8, 1);
        a.record(2, 0x200, 8, 2);
        assert_eq!((a.process, a.by_addr.len()), (2, 1), "process 1's memory died with it");
        a.record(1, 0x300, 8, 3);
        assert_eq!(a.process, 2);
        assert_eq!(a.by_addr.keys().copied().collect::<Vec<_>>(), vec![0x200]);
    }

    #[test]
    fn a_late_free_does_not_forget_the_allocation_that_reused_its_address() {
        // Allocation 1 at 0x100 is freed on the chip; before its record is dropped, another
        // thread's allocation 2 is given 0x100 and recorded.
        let mut a = ChipAllocations::default();
        a.record(1, 0x100, 8, 2);
        a.forget(0x100, 1);
        assert_eq!(a.by_addr.get(&0x100), Some(&(8, 2)), "the newer allocation was forgotten");
        a.forget(0x100, 2);
        assert!(a.by_addr.is_empty());
    }
}
