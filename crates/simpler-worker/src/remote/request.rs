//! A nonblocking MPI request with the frame buffer it reads (a send) or writes (a receive).
//!
//! Invariant: a [`Request`] owns its buffer while MPI may use it, and lets it out only once MPI
//! has completed the request. One dropped while its request is still active (the MPI thread is
//! leaving) frees the request and leaks the buffer, which MPI may still read or write. The MPI
//! thread starts every send and receive this way (`sends.rs`, `receives.rs`) and polls them, so
//! it never blocks in either (`docs/multi-host.md`).

use super::error::RemoteError;

/// An active or completed request over `buffer`.
pub(super) struct Request {
    raw: mpi::ffi::MPI_Request,
    buffer: Vec<u8>,
}

/// MPI's null request: what `MPI_Test` leaves in a request it completed.
#[allow(unsafe_code)]
pub(super) fn null_request() -> mpi::ffi::MPI_Request {
    // SAFETY: reads a constant the MPI library defines; it is set before any MPI call.
    unsafe { mpi::ffi::RSMPI_REQUEST_NULL }
}

impl Request {
    /// Takes `raw`, a request MPI started over the heap buffer of `buffer`.
    ///
    /// # Safety
    ///
    /// `raw` is an active request of this thread's MPI whose buffer is exactly the heap buffer
    /// of `buffer` (which moving the `Vec` does not move), or the null request.
    #[allow(unsafe_code)]
    pub(super) unsafe fn new(raw: mpi::ffi::MPI_Request, buffer: Vec<u8>) -> Request {
        Request { raw, buffer }
    }

    /// Whether MPI has completed the request (its buffer is then free to use).
    #[allow(unsafe_code)]
    pub(super) fn test(&mut self) -> Result<bool, RemoteError> {
        if self.raw == null_request() {
            return Ok(true);
        }
        let mut flag = 0;
        // SAFETY: `raw` is the active request `new` took; `flag` is a valid out parameter and
        // the status is ignored.
        let code =
            unsafe { mpi::ffi::MPI_Test(&mut self.raw, &mut flag, mpi::ffi::RSMPI_STATUS_IGNORE) };
        if code != 0 {
            return Err(RemoteError::Mpi { op: "MPI_Test", code });
        }
        Ok(flag != 0)
    }

    /// The buffer, once [`Request::test`] said the request completed; `None` before.
    pub(super) fn take_buffer(&mut self) -> Option<Vec<u8>> {
        (self.raw == null_request()).then(|| std::mem::take(&mut self.buffer))
    }
}

impl Drop for Request {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if self.raw == null_request() {
            return;
        }
        // Still active: nobody waits for this frame any more, but MPI may use the buffer until
        // the request completes on its own.
        std::mem::forget(std::mem::take(&mut self.buffer));
        // SAFETY: `raw` is an active request of this thread's MPI; freeing it lets the
        // operation complete without being waited for.
        unsafe { mpi::ffi::MPI_Request_free(&mut self.raw) };
    }
}
