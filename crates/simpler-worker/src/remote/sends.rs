//! Frames MPI is still sending. The MPI thread starts every send with `MPI_Isend` and polls it
//! with `MPI_Test`, so it never blocks in a send: a rendezvous send to a rank that is not
//! receiving (a stalled host) would otherwise stop it from hearing every other rank, and
//! their waiters would judge healthy ranks unresponsive (`docs/multi-host.md`).
//!
//! Invariant: an [`InFlight`] owns the buffer of its request and frees it only once MPI has
//! completed the request. One dropped while its request is still active (the MPI thread is
//! leaving) frees the request and leaks the buffer, which MPI may still read.

use mpi::datatype::Equivalence;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;

use super::error::RemoteError;
use super::transport::MAX_FRAME_BYTES;

/// One frame being sent.
pub(super) struct InFlight {
    request: mpi::ffi::MPI_Request,
    /// The destination rank.
    pub(super) to: i32,
    /// Whether it goes on the health communicator (a ping or a pong).
    pub(super) health: bool,
    bytes: Vec<u8>,
}

/// MPI's null request: what `MPI_Test` leaves in a request it completed.
#[allow(unsafe_code)]
fn null_request() -> mpi::ffi::MPI_Request {
    // SAFETY: reads a constant the MPI library defines; it is set before any MPI call.
    unsafe { mpi::ffi::RSMPI_REQUEST_NULL }
}

impl InFlight {
    /// Starts sending `bytes` to rank `to` on `comm` with `tag`.
    #[allow(unsafe_code)]
    pub(super) fn start(
        comm: &SimpleCommunicator,
        to: i32,
        health: bool,
        tag: i32,
        bytes: Vec<u8>,
    ) -> Result<InFlight, RemoteError> {
        let too_large =
            || RemoteError::FrameTooLarge { rank: to, bytes: bytes.len(), limit: MAX_FRAME_BYTES };
        let count = i32::try_from(bytes.len()).map_err(|_| too_large())?;
        let mut request = null_request();
        // SAFETY: the buffer of `bytes` is valid for `count` bytes and MPI only reads it. It
        // stays allocated and unwritten until the request completes: `bytes` moves into the
        // returned `InFlight` (which does not move its heap buffer), and that frees it only
        // after completion, or leaks it. The datatype is the predefined one of `u8`, `comm` a
        // live communicator of the MPI this thread initialized, `request` a place for the
        // handle.
        let code = unsafe {
            mpi::ffi::MPI_Isend(
                bytes.as_ptr().cast(),
                count,
                u8::equivalent_datatype().as_raw(),
                to,
                tag,
                comm.as_raw(),
                &mut request,
            )
        };
        if code != 0 {
            return Err(RemoteError::Mpi { op: "MPI_Isend", code });
        }
        Ok(InFlight { request, to, health, bytes })
    }

    /// Whether MPI is done with the frame (its buffer may then be freed).
    #[allow(unsafe_code)]
    pub(super) fn done(&mut self) -> Result<bool, RemoteError> {
        let mut flag = 0;
        // SAFETY: `request` is the request `start` created, or null once completed (which
        // `MPI_Test` accepts); `flag` is a valid out parameter and the status is ignored.
        let code = unsafe {
            mpi::ffi::MPI_Test(&mut self.request, &mut flag, mpi::ffi::RSMPI_STATUS_IGNORE)
        };
        if code != 0 {
            return Err(RemoteError::Mpi { op: "MPI_Test", code });
        }
        Ok(flag != 0)
    }
}

impl Drop for InFlight {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if self.request == null_request() {
            return;
        }
        // Still active: nobody waits for this send any more, but MPI may read the buffer
        // until it completes on its own.
        std::mem::forget(std::mem::take(&mut self.bytes));
        // SAFETY: `request` is an active request of this thread's MPI; freeing it lets the
        // send complete without being waited for.
        unsafe { mpi::ffi::MPI_Request_free(&mut self.request) };
    }
}
