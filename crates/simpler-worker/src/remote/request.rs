//! A nonblocking MPI request with the frame buffer it reads (a send) or writes (a receive).
//!
//! Invariant: a [`Request`] owns its buffer while MPI may use it, and lets it out only once MPI
//! has completed the request. One dropped while its request is still active (the MPI thread is
//! leaving) frees the request and leaks the buffer, which MPI may still read or write. The MPI
//! thread starts every send and receive this way (`sends.rs`, `receives.rs`) and polls them, so
//! it never blocks in either (`docs/multi-host.md`).

use std::time::{Duration, Instant};

use super::error::RemoteError;

/// The slowest rate at which a frame's bytes are expected to move while its peer is alive:
/// until its size at this rate has passed, a frame still on its way keeps the MPI thread
/// polling without parking.
const SLOWEST_RATE: u64 = 32 << 20;
/// The least time a frame on its way keeps the MPI thread polling.
const LEAST_HOT: Duration = Duration::from_millis(2);

/// An active or completed request over `buffer`.
pub(super) struct Request {
    raw: mpi::ffi::MPI_Request,
    buffer: Vec<u8>,
    /// Until when the frame is expected to be on its way (`SLOWEST_RATE`).
    hot_until: Instant,
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
        let moving = Duration::from_secs_f64(buffer.len() as f64 / SLOWEST_RATE as f64);
        let hot_until = Instant::now() + LEAST_HOT + moving;
        Request { raw, buffer, hot_until }
    }

    /// Whether the frame, if still on its way at `now`, may still be moving: before then the
    /// MPI thread polls it without parking (some transports move a frame's bytes only inside
    /// MPI calls); after, it is taken as stuck behind a stalled peer, and the thread parks
    /// between polls instead of taking a core for as long as the frame stays stuck.
    pub(super) fn hot(&self, now: Instant) -> bool {
        now < self.hot_until
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
