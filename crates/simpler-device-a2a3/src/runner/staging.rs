//! Host-memory access for staged tensors.
//!
//! A request built with `RunRequest::with_host_tensors` may name host buffers by address; the
//! runner copies them into device staging memory before the launch and back after a successful
//! run. Turning those addresses into slices is unsafe and lives here, justified by that
//! constructor's contract.

/// Bytes of a staged host range that write-tagged views can touch: copied back after a
/// successful run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StagedTensor {
    /// Host address of the span.
    pub(crate) host_addr: u64,
    /// Device address of its staging copy.
    pub(crate) dev_addr: u64,
    /// Bytes of the span.
    pub(crate) bytes: u64,
}

/// The host bytes `[addr, addr + len)`.
///
/// # Safety
///
/// The range must be readable host memory that nothing writes while the slice lives (the
/// `with_host_tensors` contract).
pub(crate) unsafe fn host_slice<'a>(addr: u64, len: u64) -> Option<&'a [u8]> {
    let n = usize::try_from(len).ok()?;
    if addr == 0 || n == 0 {
        return Some(&[]);
    }
    // SAFETY: the caller's contract.
    Some(unsafe { std::slice::from_raw_parts(addr as usize as *const u8, n) })
}

/// The host bytes `[addr, addr + len)`, writable.
///
/// # Safety
///
/// The range must be writable host memory that nothing else reads or writes while the slice
/// lives (the `with_host_tensors` contract).
pub(crate) unsafe fn host_slice_mut<'a>(addr: u64, len: u64) -> Option<&'a mut [u8]> {
    let n = usize::try_from(len).ok()?;
    if addr == 0 || n == 0 {
        return Some(&mut []);
    }
    // SAFETY: the caller's contract.
    Some(unsafe { std::slice::from_raw_parts_mut(addr as usize as *mut u8, n) })
}
