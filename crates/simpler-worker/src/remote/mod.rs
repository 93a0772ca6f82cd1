//! Multi-host L4: L3 workers on other MPI ranks (feature `mpi`; protocol in
//! `docs/multi-host.md`).
//!
//! Jobs are SPMD under `mpirun`: every rank calls [`MpiJob::init`]; rank 0 builds the L4
//! worker with [`RemoteL3`] children, ranks `1..N` build their L3 worker and block in
//! [`serve_l3`] until rank 0 shuts them down. One thread per rank calls MPI
//! (`transport`); the L4 endpoint of a remote child (`endpoint`) and the serving loop
//! (`serve`) reach it through channels and exchange the frames of `frames`.
//!
//! | Module | Holds |
//! |---|---|
//! | `transport` | the MPI thread, inboxes per rank, health pings, `last_heard` |
//! | `frames` | the wire format of every message |
//! | `endpoint` | [`RemoteL3`], the start handshake on rank 0 and the NEXT_LEVEL endpoint |
//! | `serve` | [`serve_l3`] and [`ServedGraphs`] on ranks `1..N` |
//! | `tensors` | host tensors of remote tasks: the submit check, packing, written bytes back |
//! | `error` | [`RemoteError`], [`LeftCause`] (why a serving rank left), [`ServeError`] |

mod endpoint;
mod error;
mod frames;
mod receives;
mod request;
mod sends;
mod serve;
mod tensors;
mod transport;

use std::sync::Arc;
use std::time::Duration;

pub(crate) use endpoint::{Adoption, RemoteChildren};
pub use endpoint::{DEFAULT_LIVENESS, RemoteL3};
pub use error::{
    InitError, LeftCause, ProtocolViolation, RemoteError, RemoteRunFailure, RemoteRunKind,
    ServeError, SpanMismatch, TensorProblem, TensorRefusal, ThreadingLevel, WrittenAt,
};
pub use frames::{DecodeError, FrameKind, WireField};
pub use serve::{ServedGraphs, serve_l3};

pub(crate) use frames::ManifestEntry;
use simpler_types::CallableKind;
use transport::Transport;

/// This process's place in an MPI job; owns the rank's MPI thread.
///
/// [`MpiJob::finalize`] finalizes MPI at once, even while workers still use it (their waits
/// then end `Finalized`); dropping it finalizes MPI once the last worker built on it is dropped
/// too, as they share the rank's MPI thread. Close every worker that uses it first: rank 0's
/// L4 worker shuts its remote L3 workers down when it closes.
pub struct MpiJob {
    transport: Arc<Transport>,
}

impl std::fmt::Debug for MpiJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiJob")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("host", &self.host())
            .finish()
    }
}

impl MpiJob {
    /// Initializes MPI (funneled threading) on a new thread of this process. Call it once per
    /// process, on every rank, before building any worker.
    pub fn init() -> Result<MpiJob, RemoteError> {
        Ok(MpiJob { transport: Arc::new(Transport::init()?) })
    }

    /// This process's rank; rank 0 runs the L4 worker.
    pub fn rank(&self) -> i32 {
        self.transport.rank
    }

    /// Ranks in the job.
    pub fn size(&self) -> i32 {
        self.transport.size
    }

    /// The host this rank runs on, as MPI names it.
    pub fn host(&self) -> &str {
        &self.transport.host
    }

    /// Makes this rank's MPI thread answer nothing for `d`, as a hung host would: a liveness
    /// drill (rank 0 fails the runs waiting on this rank once its budget runs out).
    pub fn stall_for(&self, d: Duration) -> Result<(), RemoteError> {
        self.transport.stall(d)
    }

    /// Makes this rank's MPI thread start sending its next frame and then answer nothing for
    /// `d`, as a host that hangs part way through a send would: a drill for the ranks that
    /// receive it (a large frame stays half received until this rank goes on).
    pub fn stall_after_next_send(&self, d: Duration) -> Result<(), RemoteError> {
        self.transport.stall_after_next_send(d)
    }

    /// Makes this rank's next frame arrive damaged (it does not decode): a drill for the rank
    /// that receives it, whose waits on this rank then fail with `RemoteError::Protocol`.
    pub fn corrupt_next_send(&self) -> Result<(), RemoteError> {
        self.transport.corrupt_next_send()
    }

    /// Sends rank `to` a health frame of `bytes` bytes that is no `Ping` or `Pong`, as a peer of
    /// another build might: a drill for the rank that receives it, which refuses a frame longer
    /// than a health frame without allocating it (`RemoteError::HealthFrameTooLarge`, failing
    /// its waits on this rank) and ignores a shorter one.
    pub fn send_health_bytes(&self, to: i32, bytes: usize) -> Result<(), RemoteError> {
        self.transport.send_health_bytes(to, bytes)
    }

    /// Makes this rank's MPI thread refuse its next frame of `kind`, as MPI refuses a send
    /// (`RemoteError::Mpi { op: "MPI_Isend (drill)", code: -1 }`): a drill for a frame lost on
    /// its way out, such as a serving rank's `ShutdownDone`. Calls for several kinds add up,
    /// each refusing one frame.
    pub fn refuse_next_send_of(&self, kind: FrameKind) -> Result<(), RemoteError> {
        self.transport.refuse_next_send_of(kind)
    }

    /// Finalizes MPI and joins the MPI thread.
    pub fn finalize(self) -> Result<(), RemoteError> {
        self.transport.finalize()
    }
}

/// The manifest entry of the graph registered `ordinal`-th under `name`: functions are
/// identified by name and registration order, since closures cannot be compared.
fn graph_entry(ordinal: usize, name: &str) -> ManifestEntry {
    let mut digest = [0u8; 32];
    digest[..8].copy_from_slice(&(ordinal as u64).to_le_bytes());
    ManifestEntry { kind: CallableKind::Graph, name: name.to_owned(), digest }
}

/// The manifest entry of a chip callable: its entry name and content digest.
pub(crate) fn chip_entry(c: &simpler_device_a2a3::ChipCallable) -> ManifestEntry {
    ManifestEntry {
        kind: CallableKind::Chip,
        name: c.entry_name().to_owned(),
        digest: c.id().digest,
    }
}

/// How a manifest entry reads in an error.
fn describe(e: &ManifestEntry) -> String {
    match e.kind {
        CallableKind::Chip => {
            let hex: String = e.digest[..6].iter().map(|b| format!("{b:02x}")).collect();
            format!("chip callable '{}' (sha256:{hex})", e.name)
        }
        kind => format!("{kind} '{}'", e.name),
    }
}
