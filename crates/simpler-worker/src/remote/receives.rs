//! Frames MPI is still receiving. The MPI thread starts the receive of every matched data frame
//! with `MPI_Imrecv` and polls it (`request.rs`), so it never blocks in a receive: a frame of a
//! gigabyte over a slow link, or from a sender that hangs part way through, would otherwise keep
//! it from answering pings and from hearing every other rank for as long as its bytes take to
//! move, and the waiters of all ranks would judge healthy ranks unresponsive
//! (`docs/multi-host.md`).

use mpi::datatype::Equivalence;
use mpi::point_to_point::{Message, Status};
use mpi::raw::{AsRaw, AsRawMut};

use super::error::RemoteError;
use super::request::{Request, null_request};

/// One frame being received.
pub(super) struct Arriving {
    request: Request,
    /// The source rank.
    pub(super) from: i32,
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
        let mut raw = null_request();
        // SAFETY: the buffer of `bytes` is valid for `count` bytes, the matched frame's size;
        // it moves into the returned request, which keeps it until MPI completed the receive.
        // The datatype is the predefined one of `u8`, `message` a matched message of this
        // thread's MPI (set to the null message by the call), `raw` a place for the handle.
        let code = unsafe {
            mpi::ffi::MPI_Imrecv(
                bytes.as_mut_ptr().cast(),
                count,
                u8::equivalent_datatype().as_raw(),
                message.as_raw_mut(),
                &mut raw,
            )
        };
        if code != 0 {
            // The message may still be matched: its handle must not reach the crate's drop,
            // which asserts that it was received.
            std::mem::forget(message);
            return Err(RemoteError::Mpi { op: "MPI_Imrecv", code });
        }
        // SAFETY: `raw` is the receive MPI just started into the heap buffer of `bytes`.
        let request = unsafe { Request::new(raw, bytes) };
        Ok(Arriving { request, from })
    }

    /// Whether the frame may still be moving ([`Request::hot`]).
    pub(super) fn hot(&self, now: std::time::Instant) -> bool {
        self.request.hot(now)
    }

    /// The frame's bytes once MPI has received all of them (called again after that, an
    /// empty buffer); `None` while it has not.
    pub(super) fn poll(&mut self) -> Result<Option<Vec<u8>>, RemoteError> {
        if !self.request.test()? {
            return Ok(None);
        }
        Ok(self.request.take_buffer())
    }
}

/// The longest health frame: a `Pong` (version, kind, nonce and session).
pub(super) const HEALTH_FRAME_BYTES: usize = 2 + 1 + 8 + 8;

/// Receives the health frame `probe` matched into a buffer of [`HEALTH_FRAME_BYTES`], so that a
/// peer's frame of any size costs neither an allocation nor a long blocking receive on the MPI
/// thread: a longer one is cut there (and so consumed) and refused. Returns the buffer and the
/// frame's length.
#[allow(unsafe_code)]
pub(super) fn receive_health(
    probe: (Message, Status),
) -> Result<([u8; HEALTH_FRAME_BYTES], usize), RemoteError> {
    let (mut message, status) = probe;
    let rank = status.source_rank();
    let count = status.count(u8::equivalent_datatype());
    let mut buf = [0u8; HEALTH_FRAME_BYTES];
    // SAFETY: `buf` is valid for HEALTH_FRAME_BYTES bytes, the count passed, and MPI writes no
    // more (a longer message is cut, MPI_ERR_TRUNCATE under the errors-return handler). The
    // datatype is the predefined one of `u8`, `message` a matched message of this thread's MPI
    // (set to the null message by the call), and the status is ignored (a predefined constant).
    let code = unsafe {
        mpi::ffi::MPI_Mrecv(
            buf.as_mut_ptr().cast(),
            HEALTH_FRAME_BYTES as i32,
            u8::equivalent_datatype().as_raw(),
            message.as_raw_mut(),
            mpi::ffi::RSMPI_STATUS_IGNORE,
        )
    };
    // After an error the handle may not be the null message: it must not reach the crate's
    // drop, which asserts that it is. A message handle owns nothing on the Rust side.
    std::mem::forget(message);
    let len = health_length(rank, count, code, error_class(code))?;
    Ok((buf, len))
}

/// What a health frame's receive came to: its length, or why it is refused. A frame longer
/// than [`HEALTH_FRAME_BYTES`] is too large when the receive cut it (its error class is
/// MPI's truncation) or reported nothing; a receive that failed for any other reason is that
/// MPI error, whatever the frame's length.
fn health_length(rank: i32, count: i32, code: i32, class: i32) -> Result<usize, RemoteError> {
    let len = usize::try_from(count)
        .map_err(|_| RemoteError::Mpi { op: "MPI_Get_count", code: count })?;
    let truncated = code != 0 && class == MPI_ERR_TRUNCATE;
    if len > HEALTH_FRAME_BYTES && (code == 0 || truncated) {
        return Err(RemoteError::HealthFrameTooLarge {
            rank,
            bytes: len,
            limit: HEALTH_FRAME_BYTES,
        });
    }
    if code != 0 {
        return Err(RemoteError::Mpi { op: "MPI_Mrecv", code });
    }
    Ok(len)
}

/// MPI's class of truncation errors, in the installed library's numbering.
const MPI_ERR_TRUNCATE: i32 = mpi::ffi::MPI_ERR_TRUNCATE as i32;

/// The error class of MPI error code `code` (`-1` for a code MPI does not know).
#[allow(unsafe_code)]
fn error_class(code: i32) -> i32 {
    if code == 0 {
        return 0;
    }
    let mut class = -1;
    // SAFETY: `class` is a valid place for the one integer MPI writes; any code may be asked.
    let asked = unsafe { mpi::ffi::MPI_Error_class(code, &mut class) };
    if asked == 0 { class } else { -1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_health_frame_is_too_large_only_when_its_receive_cut_it_or_succeeded() {
        let (long, other_failure) = (1024, MPI_ERR_TRUNCATE + 1);
        let too_large = |r: Result<usize, RemoteError>| {
            matches!(r, Err(RemoteError::HealthFrameTooLarge { rank: 1, bytes: 1024, .. }))
        };
        assert!(too_large(health_length(1, long, 15, MPI_ERR_TRUNCATE)));
        assert!(too_large(health_length(1, long, 0, 0)));
        // Any other failure is the MPI error it is, not a frame too large.
        let failed = health_length(1, long, 99, other_failure);
        assert!(
            matches!(failed, Err(RemoteError::Mpi { op: "MPI_Mrecv", code: 99 })),
            "{failed:?}"
        );
        let short = health_length(1, 11, 99, other_failure);
        assert!(matches!(short, Err(RemoteError::Mpi { op: "MPI_Mrecv", code: 99 })), "{short:?}");
        assert_eq!(health_length(1, 11, 0, 0).ok(), Some(11));
        let undefined = health_length(1, -32766, 0, 0);
        assert!(matches!(undefined, Err(RemoteError::Mpi { op: "MPI_Get_count", .. })));
    }
}
