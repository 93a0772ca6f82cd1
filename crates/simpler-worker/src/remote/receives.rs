//! Frames MPI is still receiving. The MPI thread starts the receive of every matched data frame
//! with `MPI_Imrecv` and polls it with `MPI_Test`, so it never blocks in a receive: a frame of
//! a gigabyte over a slow link would otherwise keep it from answering pings and from hearing
//! every other rank for as long as its bytes take to move, and the waiters of all ranks would
//! judge healthy ranks unresponsive (`docs/multi-host.md`).
//!
//! Invariant: an [`Arriving`] owns the buffer of its request and hands it out only once MPI has
//! completed the request. One dropped while its request is still active (the MPI thread is
//! leaving) frees the request and leaks the buffer, which MPI may still write.

use mpi::datatype::Equivalence;
use mpi::point_to_point::{Message, Status};
use mpi::raw::{AsRaw, AsRawMut};

use super::error::RemoteError;

/// One frame being received.
pub(super) struct Arriving {
    request: mpi::ffi::MPI_Request,
    /// The source rank.
    pub(super) from: i32,
    bytes: Vec<u8>,
}

/// MPI's null request: what `MPI_Test` leaves in a request it completed.
#[allow(unsafe_code)]
fn null_request() -> mpi::ffi::MPI_Request {
    // SAFETY: reads a constant the MPI library defines; it is set before any MPI call.
    unsafe { mpi::ffi::RSMPI_REQUEST_NULL }
}

impl Arriving {
    /// Starts receiving the frame `probe` matched.
    #[allow(unsafe_code)]
    pub(super) fn start(probe: (Message, Status)) -> Result<Arriving, RemoteError> {
        let (mut message, status) = probe;
        let from = status.source_rank();
        let count = status.count(u8::equivalent_datatype());
        let Ok(len) = usize::try_from(count) else {
            // No byte count (MPI_UNDEFINED): the frame cannot be received as bytes. The
            // message stays matched and unreceived; its handle is let go without a receive.
            std::mem::forget(message);
            return Err(RemoteError::Mpi { op: "MPI_Get_count", code: count });
        };
        let mut bytes = vec![0u8; len];
        let mut request = null_request();
        // SAFETY: the buffer of `bytes` is valid for `count` bytes, the matched frame's size,
        // and nothing else touches it until the request completes: `bytes` moves into the
        // returned `Arriving` (which does not move its heap buffer) and is handed out only
        // after completion, or leaked. The datatype is the predefined one of `u8`, `message` a
        // matched message of this thread's MPI (set to the null message by the call), `request`
        // a place for the handle.
        let code = unsafe {
            mpi::ffi::MPI_Imrecv(
                bytes.as_mut_ptr().cast(),
                count,
                u8::equivalent_datatype().as_raw(),
                message.as_raw_mut(),
                &mut request,
            )
        };
        if code != 0 {
            // The message may still be matched: its handle must not reach the crate's drop,
            // which asserts that it was received.
            std::mem::forget(message);
            return Err(RemoteError::Mpi { op: "MPI_Imrecv", code });
        }
        Ok(Arriving { request, from, bytes })
    }

    /// The frame's bytes once MPI has received all of them; `None` while it has not.
    #[allow(unsafe_code)]
    pub(super) fn poll(&mut self) -> Result<Option<Vec<u8>>, RemoteError> {
        if self.request == null_request() {
            // Handed out already.
            return Ok(None);
        }
        let mut flag = 0;
        // SAFETY: `request` is the active request `start` created; `flag` is a valid out
        // parameter and the status is ignored.
        let code = unsafe {
            mpi::ffi::MPI_Test(&mut self.request, &mut flag, mpi::ffi::RSMPI_STATUS_IGNORE)
        };
        if code != 0 {
            return Err(RemoteError::Mpi { op: "MPI_Test", code });
        }
        // A completed request is the null request now: MPI no longer writes the buffer.
        Ok((flag != 0).then(|| std::mem::take(&mut self.bytes)))
    }
}

impl Drop for Arriving {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if self.request == null_request() {
            return;
        }
        // Still active: nobody waits for this frame any more, but MPI may write the buffer
        // until the receive completes on its own.
        std::mem::forget(std::mem::take(&mut self.bytes));
        // SAFETY: `request` is an active request of this thread's MPI; freeing it lets the
        // receive complete without being waited for.
        unsafe { mpi::ffi::MPI_Request_free(&mut self.request) };
    }
}
