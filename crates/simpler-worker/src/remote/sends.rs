//! Frames MPI is still sending. The MPI thread starts every send with `MPI_Isend` and polls it
//! (`request.rs`), so it never blocks in a send: a rendezvous send to a rank that is not
//! receiving (a stalled host) would otherwise stop it from hearing every other rank, and
//! their waiters would judge healthy ranks unresponsive (`docs/multi-host.md`).

use mpi::datatype::Equivalence;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;

use super::error::RemoteError;
use super::request::{Request, null_request};
use super::transport::MAX_FRAME_BYTES;

/// Where the sender of a frame learns whether MPI sent it.
pub(super) type Receipt = std::sync::mpsc::Sender<Result<(), RemoteError>>;

/// One frame being sent.
pub(super) struct InFlight {
    request: Request,
    /// Told how the send ended, when its sender asked.
    pub(super) receipt: Option<Receipt>,
    /// The destination rank.
    pub(super) to: i32,
    /// Whether it goes on the health communicator (a ping or a pong).
    pub(super) health: bool,
    /// The opening of the destination's inbox the frame was queued under (a loss of an
    /// ended session's frame is not that of the current one).
    pub(super) opening: u64,
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
        let mut raw = null_request();
        // SAFETY: the buffer of `bytes` is valid for `count` bytes and MPI only reads it; it
        // moves into the returned request, which keeps it until MPI completed the send. The
        // datatype is the predefined one of `u8`, `comm` a live communicator of the MPI this
        // thread initialized, `raw` a place for the handle.
        let code = unsafe {
            mpi::ffi::MPI_Isend(
                bytes.as_ptr().cast(),
                count,
                u8::equivalent_datatype().as_raw(),
                to,
                tag,
                comm.as_raw(),
                &mut raw,
            )
        };
        if code != 0 {
            return Err(RemoteError::Mpi { op: "MPI_Isend", code });
        }
        // SAFETY: `raw` is the send MPI just started over the heap buffer of `bytes`.
        let request = unsafe { Request::new(raw, bytes) };
        Ok(InFlight { request, receipt: None, to, health, opening: 0 })
    }

    /// Whether the frame may still be moving ([`Request::hot`]).
    pub(super) fn hot(&self, now: std::time::Instant) -> bool {
        self.request.hot(now)
    }

    /// Whether MPI is done with the frame; the receipt, if any, is told once it is, or once
    /// the send failed.
    pub(super) fn done(&mut self) -> Result<bool, RemoteError> {
        let done = self.request.test();
        match &done {
            Ok(false) => {}
            Ok(true) => settle(self.receipt.take(), Ok(())),
            Err(e) => settle(self.receipt.take(), Err(e.clone())),
        }
        done
    }
}

/// Tells `receipt`, if any, how a send ended (nobody may be waiting any more).
pub(super) fn settle(receipt: Option<Receipt>, r: Result<(), RemoteError>) {
    if let Some(receipt) = receipt {
        let _ = receipt.send(r);
    }
}
