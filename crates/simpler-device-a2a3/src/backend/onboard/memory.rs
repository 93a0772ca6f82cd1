//! The backend's device memory: every allocation in one table by start address, the kernel
//! code of registered callables as entries of it, and allocations and transfers whose
//! refusals keep CANN's typed error.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use simpler_acl_sys::Error as CannError;

use super::owners::{Ctx, DeviceBuffer, HostMapping};
use super::reset::{Binds, release_in_context};
use super::{OnboardDevice, acl};
use crate::backend::AllocFailure;
use crate::error::{CopyKind, DeviceError, MemPurpose};
use crate::runner::DevicePtr;

/// One tracked allocation and its host mapping, if one was made.
#[derive(Debug)]
pub(super) struct Allocation {
    pub(super) purpose: MemPurpose,
    // Declared before `buffer`: the mapping is unregistered before the memory is freed.
    pub(super) mapping: Option<HostMapping>,
    pub(super) buffer: DeviceBuffer,
}

/// Every device allocation of the backend by start address, shared with the kernel code of
/// registered callables. A leaf lock.
pub(super) type Allocations = Arc<Mutex<BTreeMap<u64, Allocation>>>;

/// A callable's kernel code in device memory, kept while the callable is registered. The
/// memory is an entry of the backend's allocation table, so finalize frees it even if the
/// callable outlives the backend; dropping this frees it earlier, once the thread is bound for
/// the backend's runner (CANN frees in the calling thread's context). When that bind fails it
/// stays in the table, for finalize.
#[derive(Debug)]
pub(super) struct KernelText {
    pub(super) addr: u64,
    pub(super) table: Weak<Mutex<BTreeMap<u64, Allocation>>>,
    pub(super) ctx: Weak<Ctx>,
    pub(super) binds: Weak<Mutex<Binds>>,
}

impl Drop for KernelText {
    fn drop(&mut self) {
        let (Some(table), Some(ctx)) = (self.table.upgrade(), self.ctx.upgrade()) else { return };
        // Dropping the entry frees the memory.
        release_in_context(&ctx, &self.binds, || drop(table.lock().remove(&self.addr)));
    }
}

impl OnboardDevice {
    /// Runs `f` on the allocation holding `[addr, addr + len)` with the offset of `addr` in
    /// it; `None` when no single allocation holds the range.
    pub(super) fn with_allocation<T>(
        &self,
        addr: u64,
        len: u64,
        f: impl FnOnce(&mut Allocation, u64) -> T,
    ) -> Option<T> {
        let mut allocs = self.allocations.lock();
        let (base, a) = allocs.range_mut(..=addr).next_back()?;
        let offset = addr - base;
        (offset.checked_add(len)? <= a.buffer.len()).then(|| f(a, offset))
    }

    /// `rtMalloc` of `bytes`, zero-filled (the contract of both backends) and tracked. A
    /// refusal is `AllocRefused` with CANN's error (the bind's, the allocation's or the fill's).
    pub(super) fn alloc_tracked(
        &self,
        bytes: u64,
        purpose: MemPurpose,
    ) -> Result<u64, AllocFailure> {
        let refused = |e: CannError| {
            tracing::warn!(device = self.ctx.device, bytes, %purpose, error = %e, "device allocation refused");
            let e = match e {
                CannError::Acl(source) => DeviceError::AllocRefused {
                    run_id: None,
                    bytes,
                    purpose,
                    source: Box::new(source),
                },
                other => acl(None, other),
            };
            AllocFailure::Refused(Box::new(e))
        };
        self.bind().map_err(refused)?;
        let buffer = DeviceBuffer::alloc(&self.ctx, bytes).map_err(refused)?;
        buffer.fill(0, 0, bytes).map_err(refused)?;
        let addr = buffer.addr();
        self.allocations.lock().insert(addr, Allocation { purpose, mapping: None, buffer });
        Ok(addr)
    }

    /// One transfer `f` on the allocation holding `[addr, addr + len)`: `BadDevicePointer`
    /// when none holds it, `CopyRefused` with CANN's error when the bind or the call failed.
    pub(super) fn transfer(
        &self,
        kind: CopyKind,
        addr: u64,
        len: u64,
        f: impl FnOnce(&mut Allocation, u64) -> Result<(), CannError>,
    ) -> Result<(), DeviceError> {
        let refused = |e: CannError| match e {
            CannError::Acl(source) => DeviceError::CopyRefused {
                run_id: None,
                kind,
                addr: DevicePtr(addr),
                len,
                source: Box::new(source),
            },
            other => acl(None, other),
        };
        self.bind().map_err(refused)?;
        match self.with_allocation(addr, len, f) {
            Some(done) => done.map_err(refused),
            None => Err(DeviceError::BadDevicePointer {
                run_id: None,
                arg: None,
                addr: DevicePtr(addr),
                len,
            }),
        }
    }
}
