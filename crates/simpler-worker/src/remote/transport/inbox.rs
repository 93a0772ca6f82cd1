//! The inboxes through which the MPI thread hands each rank's frames on, as their bytes: the
//! session that takes a frame decodes it (`docs/multi-host.md`, "The MPI thread").

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use super::super::error::RemoteError;
use super::super::frames::Packet;
use super::Shared;

/// Frames kept for a rank with no open inbox; older ones are dropped beyond this...
pub(super) const MAX_BACKLOG: usize = 64;
/// ...or beyond this many bytes (the newest frame is always kept).
pub(super) const MAX_BACKLOG_BYTES: usize = 64 << 20;

/// Where frames from one rank go, as their bytes.
pub(super) enum Inbox {
    Open(Sender<Arrived>),
    Closed(Backlog),
}

/// Frames from a rank with no open inbox, oldest first, within `MAX_BACKLOG` frames and
/// `MAX_BACKLOG_BYTES` bytes.
#[derive(Default)]
pub(super) struct Backlog {
    pub(super) frames: std::collections::VecDeque<Vec<u8>>,
    pub(super) bytes: usize,
}

impl Backlog {
    /// Appends `frame`, dropping the oldest frames beyond the limits.
    pub(super) fn push(&mut self, rank: i32, frame: Vec<u8>) {
        self.bytes += frame.len();
        self.frames.push_back(frame);
        while self.frames.len() > MAX_BACKLOG
            || (self.bytes > MAX_BACKLOG_BYTES && self.frames.len() > 1)
        {
            tracing::warn!(rank, "dropping an old unrouted frame");
            let old = self.frames.pop_front().map_or(0, |f| f.len());
            self.bytes -= old;
        }
    }
}

/// A frame's bytes in an open inbox.
pub(super) struct Arrived {
    /// It waited in the backlog before the session opened: not the session's, were it lost.
    pub(super) early: bool,
    pub(super) bytes: Vec<u8>,
}

/// The receiving end of one rank's inbox: frames in the order they arrived, decoded here.
pub(crate) struct InboxRx {
    pub(super) rx: Receiver<Arrived>,
    pub(super) rank: i32,
    pub(super) shared: std::sync::Arc<Shared>,
}

impl InboxRx {
    /// The next frame within `timeout`. A frame that does not decode is dropped and answered
    /// as a timeout; one that arrived during the session is recorded as lost (the waits on
    /// the rank then fail with it, as they check for lost frames), one that waited in the
    /// backlog before the session opened only logged, as a loss of no session of this one.
    pub(crate) fn recv_timeout(&self, timeout: Duration) -> Result<Packet, RecvTimeoutError> {
        let Arrived { early, bytes } = self.rx.recv_timeout(timeout)?;
        match Packet::decode(&bytes) {
            Ok(p) => Ok(p),
            Err(e) => {
                let rank = self.rank;
                tracing::error!(rank, error = %e, early, "dropping a malformed frame");
                if !early {
                    let violation = e.into();
                    self.shared.lose_frame(rank, None, RemoteError::Protocol { rank, violation });
                }
                Err(RecvTimeoutError::Timeout)
            }
        }
    }
}

/// Hands the bytes of a frame from `from` to its inbox, or to the rank's backlog.
pub(super) fn route(shared: &Shared, from: i32, bytes: Vec<u8>) {
    let mut inboxes = shared.inboxes.lock();
    match inboxes.get_mut(from as usize) {
        Some(Inbox::Open(tx)) => {
            if let Err(mpsc::SendError(frame)) = tx.send(Arrived { early: false, bytes }) {
                // The session's receiver is gone: keep the frame like any unrouted one.
                let mut backlog = Backlog::default();
                backlog.push(from, frame.bytes);
                inboxes[from as usize] = Inbox::Closed(backlog);
            }
        }
        Some(Inbox::Closed(backlog)) => backlog.push(from, bytes),
        None => tracing::error!(rank = from, "a frame from a rank outside the world"),
    }
}
