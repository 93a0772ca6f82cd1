//! Errors of the multi-host transport: each names the rank and, where one exists, the level,
//! run and task it concerns.

use std::time::Duration;

use simpler_types::{RunId, TaskId, TypesError, WorkerId};

use super::frames::{DecodeError, FrameKind};
use crate::error::{CloseError, StartError};
use crate::host_buffer::HostAddr;

/// What went wrong between rank 0 and a serving rank.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// MPI could not be initialized on this rank.
    #[error("MPI initialization failed: {0}")]
    Init(#[from] InitError),
    /// The MPI thread of this rank panicked; `finalize` could not finalize MPI.
    #[error("the MPI thread of this rank panicked; MPI was not finalized")]
    ThreadPanicked,
    /// An MPI call returned an error code (the errors-return handler is set).
    #[error("{op} returned MPI error code {code}")]
    Mpi {
        /// The MPI function.
        op: &'static str,
        /// Its return code.
        code: i32,
    },
    /// The MPI thread of this rank has finalized.
    #[error("the MPI transport of this rank is finalized")]
    Finalized,
    /// A frame for `rank` is larger than one MPI message carries (its count is a C `int`):
    /// the task's tensors move too many bytes at once.
    #[error(
        "a {bytes}-byte frame for rank {rank} exceeds the {limit} bytes one MPI message carries"
    )]
    FrameTooLarge {
        /// The destination rank.
        rank: i32,
        /// The encoded frame's size.
        bytes: usize,
        /// The largest frame.
        limit: usize,
    },
    /// `rank` sent a health frame longer than any `Ping` or `Pong`: it was cut at that length
    /// when received (so it cost no allocation) and refused; the waits on `rank` fail with it.
    #[error(
        "rank {rank} sent a {bytes}-byte health frame; a health frame has at most {limit} bytes"
    )]
    HealthFrameTooLarge {
        /// The sending rank.
        rank: i32,
        /// The frame's size.
        bytes: usize,
        /// The longest health frame.
        limit: usize,
    },
    /// A frame for `rank` after which this rank stops listening (a serving rank's
    /// `ShutdownDone`) was not confirmed sent within `waited`.
    #[error("the {frame} frame to rank {rank} was not confirmed sent within {waited:?}")]
    SendUnconfirmed {
        /// The destination rank.
        rank: i32,
        /// The frame.
        frame: FrameKind,
        /// How long this rank waited for MPI to send it.
        waited: Duration,
    },
    /// A rank outside `1..size` (rank 0 runs the L4 worker).
    #[error("rank {rank} cannot host a remote L3 worker in a job of {size} ranks")]
    NoSuchRank {
        /// The rank asked for.
        rank: i32,
        /// Ranks in the job.
        size: i32,
    },
    /// Two remote children name the same rank.
    #[error("rank {rank} is already taken by another remote child")]
    RankInUse {
        /// The rank.
        rank: i32,
    },
    /// Only rank 0 builds the L4 worker; only ranks 1.. serve.
    #[error("rank {rank} cannot {op}")]
    WrongRank {
        /// This rank.
        rank: i32,
        /// What was attempted.
        op: &'static str,
    },
    /// The rank's registrations differ from what rank 0 expects; start refused.
    #[error(
        "rank {rank} registered a different manifest: entry {index} is {found}, expected {expected}"
    )]
    ManifestMismatch {
        /// The rank.
        rank: i32,
        /// Position in registration order.
        index: usize,
        /// What rank 0 (or the first serving rank, for chip callables) has there.
        expected: String,
        /// What this rank has there.
        found: String,
    },
    /// The rank's L3 worker failed to start.
    #[error("the L3 worker on rank {rank} ({host}) failed to start: {message}")]
    RemoteStart {
        /// The rank.
        rank: i32,
        /// Its host.
        host: String,
        /// Its start error, rendered there.
        message: String,
    },
    /// The rank stopped answering within the liveness budget; the endpoint is failed.
    #[error(
        "rank {rank} (L{level}) did not answer within its liveness budget of {budget:?}{}",
        task_text(*run, *task)
    )]
    Unresponsive {
        /// The rank.
        rank: i32,
        /// The level of the worker it hosts.
        level: u8,
        /// The budget that ran out.
        budget: Duration,
        /// The run at rank 0 whose task was waiting, if any.
        run: Option<RunId>,
        /// That task.
        task: Option<TaskId>,
    },
    /// The rank's pongs say it no longer serves this session (it left it, and the `Left` saying
    /// why was lost), and nothing arrived within the liveness budget after; the endpoint is
    /// failed.
    #[error(
        "rank {rank} left session {session} without a word (it now serves {}){}",
        serving_text(*serving),
        task_text(*run, *task)
    )]
    SessionEnded {
        /// The rank.
        rank: i32,
        /// The session rank 0 holds with it.
        session: u64,
        /// The session its pongs report (0: none).
        serving: u64,
        /// The run at rank 0 whose task was waiting, if any.
        run: Option<RunId>,
        /// That task.
        task: Option<TaskId>,
    },
    /// A task failed on the remote rank: its frames are the failure's cause chain.
    #[error("rank {rank} ({host}): L{level} {run} failed{}: {message}", task_seq(*task))]
    TaskFailed {
        /// The rank.
        rank: i32,
        /// Its host.
        host: String,
        /// The remote level.
        level: u8,
        /// The remote run.
        run: RunId,
        /// The remote task, when a task failed (not the run's build).
        task: Option<u32>,
        /// The remote failure, rendered.
        message: String,
    },
    /// The remote run failed without a failing task (an unknown graph, arguments that did not
    /// unpack, a reply too large, its graph's build, a closed worker).
    #[error("rank {rank} ({host}): L{level} run failed: {failure}")]
    RunFailed {
        /// The rank.
        rank: i32,
        /// Its host.
        host: String,
        /// The remote level.
        level: u8,
        /// Why, as the serving rank reported it.
        failure: RemoteRunFailure,
    },
    /// The graph of a task is not in the manifest checked at start.
    #[error("graph {graph} is not in the manifest of rank {rank}")]
    UnknownGraph {
        /// The rank.
        rank: i32,
        /// The graph's name (or id, when unnamed).
        graph: String,
    },
    /// A tensor of a task could not be packed for its rank at execution (the submit check
    /// refuses these; this catches a buffer that went away in between). Fails only the task.
    #[error("{task} for rank {rank}: argument {arg} {}", problem.describe())]
    Unshippable {
        /// The rank.
        rank: i32,
        /// The task at rank 0.
        task: TaskId,
        /// Index of the tensor argument.
        arg: usize,
        /// What is wrong with the tensor.
        problem: TensorProblem,
    },
    /// A frame did not decode or did not fit the protocol.
    #[error("protocol error with rank {rank}: {violation}")]
    Protocol {
        /// The peer rank.
        rank: i32,
        /// What was wrong.
        violation: ProtocolViolation,
    },
    /// A serving rank ended its session with an error and said so: nothing more comes from
    /// it in this session.
    #[error("rank {rank} left its session: {cause}")]
    Left {
        /// The rank that left.
        rank: i32,
        /// The error that ended the session there, as that rank saw it.
        cause: LeftCause,
    },
    /// Rank 0 refused the start of this rank's session.
    #[error("rank 0 refused the start: {reason}")]
    Refused {
        /// Rank 0's reason, rendered on rank 0: a manifest mismatch, a failed wait, or the
        /// error of rank 0's own start, which can hold any error of its program, so the
        /// `Refuse` frame carries it as text.
        reason: String,
    },
    /// Rank 0 could not send a serving rank the `Commit` of a graph registered after start,
    /// which the other ranks serve from then on: that rank does not, so its session is failed
    /// for good and its tasks fail at once with this error.
    #[error("rank {rank} was not sent the commit of graph '{graph}' (ordinal {ordinal}): {cause}")]
    CommitLost {
        /// The rank.
        rank: i32,
        /// The graph.
        graph: String,
        /// The ordinal the other ranks serve it under.
        ordinal: u32,
        /// Why the send failed.
        cause: Box<RemoteError>,
    },
    /// A serving rank refused phase 1 of a graph registration after start; every rank rolled
    /// it back.
    #[error("MPI rank {rank} cannot serve graph '{graph}' registered after start: {reason}")]
    RegistrationRefused {
        /// The refusing rank.
        rank: i32,
        /// The graph.
        graph: String,
        /// Why, in the rank's own words.
        reason: String,
    },
    /// A serving rank kept answering pings but did not answer phase 1 of a graph registration
    /// after start within `budget`; every rank rolled it back.
    #[error("MPI rank {rank} did not answer the registration of graph '{graph}' within {budget:?}")]
    RegistrationTimedOut {
        /// The silent rank.
        rank: i32,
        /// The graph.
        graph: String,
        /// The registration's budget for all ranks' answers.
        budget: Duration,
    },
}

/// Why a serving rank left its session: the error that ended the session on that rank, sent
/// to rank 0 in its `Left` frame. A serving rank talks only with rank 0, so the peer these
/// errors concern is always rank 0; [`RemoteError::Left`] names the rank that left.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeftCause {
    /// Rank 0 answered no ping of the serving rank within that rank's liveness budget.
    #[error("rank 0 (L4) did not answer within its liveness budget of {budget:?}")]
    Unresponsive {
        /// The serving rank's budget.
        budget: Duration,
    },
    /// An MPI call of the serving rank returned an error code.
    #[error("{op} returned MPI error code {code}")]
    Mpi {
        /// The MPI function.
        op: &'static str,
        /// Its return code.
        code: i32,
    },
    /// A frame for rank 0 was larger than one MPI message carries.
    #[error("a {bytes}-byte frame for rank 0 exceeds the {limit} bytes one MPI message carries")]
    FrameTooLarge {
        /// The encoded frame's size.
        bytes: u64,
        /// The largest frame.
        limit: u64,
    },
    /// A frame for rank 0 was not confirmed sent within `waited`.
    #[error("the {frame} frame to rank 0 was not confirmed sent within {waited:?}")]
    SendUnconfirmed {
        /// The frame.
        frame: FrameKind,
        /// How long the serving rank waited for MPI to send it.
        waited: Duration,
    },
    /// The serving rank's MPI transport was finalized.
    #[error("its MPI transport is finalized")]
    Finalized,
    /// A frame from rank 0 did not decode or did not fit the protocol.
    #[error("protocol error with rank 0: {0}")]
    Protocol(ProtocolViolation),
    /// The serving rank closed its worker at `Shutdown`, but its `ShutdownDone` was not
    /// confirmed sent: MPI refused it (lost), or did not confirm it within the wait (`lost` is
    /// `SendUnconfirmed`; it may then still arrive).
    #[error("its ShutdownDone {} ({lost}); {}", done_fate(lost), close_text(close.as_deref()))]
    ShutdownDoneLost {
        /// Why it was not confirmed sent (never another `ShutdownDoneLost`).
        lost: Box<LeftCause>,
        /// What the close reported, rendered on that rank (`None`: the worker closed
        /// cleanly). Text because a close error holds the user's own task failures, which
        /// have no wire form; `ShutdownDone` carries it the same way.
        close: Option<String>,
    },
    /// An error the frame format has no code for (one naming a rank other than rank 0, a
    /// call configuration rule, an MPI function or an expected set of frames it does not
    /// list), rendered on that rank. Of these only a `Task` frame whose call configuration
    /// breaks a rule (`DecodeError::Config`, which a rank 0 of this build never sends, since it
    /// validated the configuration at submit) ends a session today; the variant also keeps a
    /// cause added later from being dropped.
    #[error("{text}")]
    Other {
        /// The error, rendered on that rank.
        text: String,
    },
}

impl From<&RemoteError> for LeftCause {
    /// The cause a serving rank sends when `e` ends its session.
    fn from(e: &RemoteError) -> LeftCause {
        match e {
            RemoteError::Unresponsive { rank: 0, budget, .. } => {
                LeftCause::Unresponsive { budget: *budget }
            }
            RemoteError::Mpi { op, code } => LeftCause::Mpi { op, code: *code },
            RemoteError::FrameTooLarge { rank: 0, bytes, limit } => {
                LeftCause::FrameTooLarge { bytes: *bytes as u64, limit: *limit as u64 }
            }
            RemoteError::SendUnconfirmed { rank: 0, frame, waited } => {
                LeftCause::SendUnconfirmed { frame: *frame, waited: *waited }
            }
            RemoteError::Finalized => LeftCause::Finalized,
            RemoteError::Protocol { rank: 0, violation } => LeftCause::Protocol(violation.clone()),
            other => LeftCause::Other { text: other.to_string() },
        }
    }
}

/// What became of a `ShutdownDone` that `lost` kept from being confirmed sent.
fn done_fate(lost: &LeftCause) -> &'static str {
    match lost {
        LeftCause::SendUnconfirmed { .. } => "was unconfirmed and may still arrive",
        _ => "was lost",
    }
}

fn close_text(close: Option<&str>) -> String {
    close.map_or_else(|| "its worker closed".to_owned(), |e| format!("its close: {e}"))
}

/// How a peer broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolViolation {
    /// A frame from the peer did not decode; it was dropped.
    #[error("a frame did not decode: {0}")]
    Malformed(#[from] DecodeError),
    /// A frame of a kind the protocol does not allow at this point of the session.
    #[error("expected {}, got {got}", kinds(expected))]
    UnexpectedFrame {
        /// The frame's kind.
        got: FrameKind,
        /// The kinds allowed here.
        expected: &'static [FrameKind],
    },
    /// A completion's written spans are not the ones its task's write tags name (it would
    /// write bytes the engine did not order for the task). Boxed to keep `RemoteError` small.
    #[error("{0}")]
    WrittenSpans(Box<SpanMismatch>),
    /// A written span leaves the buffer it is written into.
    #[error(
        "a written span of {} bytes at offset {} leaves buffer {} of {size} bytes",
        span.len,
        span.offset,
        span.buffer
    )]
    SpanOutsideBuffer {
        /// The span.
        span: WrittenAt,
        /// The buffer's size.
        size: u64,
    },
}

/// The first written span of a completion that differs from those its task's write tags name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the completion's written span {index} is {}, but its task's write tags name {} \
     ({carried} spans carried, {named} named)",
    span_text(got.as_ref()),
    span_text(expected.as_ref())
)]
pub struct SpanMismatch {
    /// Its position among the spans.
    pub index: usize,
    /// That span as the completion carries it (`None`: the completion has fewer).
    pub got: Option<WrittenAt>,
    /// That span as the write tags name it (`None`: they name fewer).
    pub expected: Option<WrittenAt>,
    /// The spans the completion carries.
    pub carried: usize,
    /// The spans the write tags name.
    pub named: usize,
}

/// Where bytes a remote task wrote go: `len` bytes at `offset` of the task's buffer `buffer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrittenAt {
    /// The buffer's index in the task's frame.
    pub buffer: u32,
    /// The offset in that buffer.
    pub offset: u64,
    /// How many bytes.
    pub len: u64,
}

fn kinds(k: &[FrameKind]) -> String {
    let names: Vec<String> = k.iter().map(ToString::to_string).collect();
    names.join(" or ")
}

fn span_text(s: Option<&WrittenAt>) -> String {
    s.map_or_else(
        || "missing".to_owned(),
        |s| format!("{} bytes at offset {} of buffer {}", s.len, s.offset, s.buffer),
    )
}

/// Why `MpiJob::init` could not set MPI up on this rank.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// The thread that calls MPI could not be started (the OS refused a new thread).
    #[error("could not start the MPI thread: {}", io_text(*kind, *os_code))]
    Spawn {
        /// What kind of I/O error the spawn returned.
        kind: std::io::ErrorKind,
        /// Its OS error code, when the OS gave one.
        os_code: Option<i32>,
    },
    /// The MPI thread ended before it reported whether MPI started (it panicked inside
    /// `MPI_Init_thread` or just after).
    #[error("the MPI thread ended during initialization")]
    ThreadEnded,
    /// MPI was already initialized in this process (an earlier `MpiJob::init`, or other code
    /// of the process): one job per process.
    #[error("MPI was already initialized in this process")]
    AlreadyInitialized,
    /// The MPI library grants less thread support than the transport needs.
    #[error("the MPI library provides {provided} threading, {required} is needed")]
    Threading {
        /// What `MPI_Init_thread` granted.
        provided: ThreadingLevel,
        /// What the transport asked for.
        required: ThreadingLevel,
    },
}

impl InitError {
    /// The failure of spawning the MPI thread with `e`.
    pub(crate) fn spawn(e: &std::io::Error) -> InitError {
        InitError::Spawn { kind: e.kind(), os_code: e.raw_os_error() }
    }
}

/// How an I/O error reads from its kind and OS code: the OS's message when there is a code.
fn io_text(kind: std::io::ErrorKind, os_code: Option<i32>) -> String {
    match os_code {
        Some(code) => std::io::Error::from_raw_os_error(code).to_string(),
        None => kind.to_string(),
    }
}

/// MPI's levels of thread support (`MPI_THREAD_*`), least first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ThreadingLevel {
    /// `MPI_THREAD_SINGLE`.
    Single,
    /// `MPI_THREAD_FUNNELED`: only the thread that initialized MPI calls it.
    Funneled,
    /// `MPI_THREAD_SERIALIZED`.
    Serialized,
    /// `MPI_THREAD_MULTIPLE`.
    Multiple,
}

impl std::fmt::Display for ThreadingLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ThreadingLevel::Single => "single",
            ThreadingLevel::Funneled => "funneled",
            ThreadingLevel::Serialized => "serialized",
            ThreadingLevel::Multiple => "multiple",
        })
    }
}

/// A task for a remote child names a tensor whose bytes cannot travel with it; refused at
/// submit (`WorkerError::RemoteTensor`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "task argument {arg} for child {child} (an L3 worker on MPI rank {rank}) {problem}",
    problem = self.problem.describe()
)]
pub struct TensorRefusal {
    /// Index of the tensor argument.
    pub arg: usize,
    /// The remote child.
    pub child: WorkerId,
    /// Its rank.
    pub rank: i32,
    /// What is wrong with the tensor.
    pub problem: TensorProblem,
}

/// Why a tensor cannot go to a remote child.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TensorProblem {
    /// It lives in chip memory of this host, which the remote rank cannot reach.
    ChipMemory {
        /// The tensor's buffer address.
        addr: HostAddr,
    },
    /// It names host memory that is not a `HostBuffer`, whose bytes the endpoint cannot find.
    NotHostBuffer {
        /// The tensor's buffer address.
        addr: HostAddr,
        /// The tensor's buffer size in bytes.
        len: u64,
    },
    /// It is tagged `NoDep`: whether the task writes it, and so whether its bytes come back,
    /// is unknown.
    NoDep,
    /// The bytes its view can touch do not lie inside its `HostBuffer` (or cannot be
    /// measured: an unknown data type, an end past `u64`), so which bytes to send and take
    /// back is unknown.
    NoSpan {
        /// The buffer's address.
        addr: HostAddr,
        /// The buffer's length in bytes.
        len: u64,
    },
    /// Its buffer is named by empty views only, and with the task's other such buffers it
    /// holds more bytes than a serving rank allocates for bytes nobody reads or gets back.
    EmptyViewsOnly {
        /// The buffer's address.
        addr: HostAddr,
        /// The bytes of the task's buffers named only by empty views, up to this one.
        len: u64,
        /// The most a serving rank allocates for them.
        cap: u64,
    },
}

impl TensorProblem {
    fn describe(&self) -> String {
        match self {
            TensorProblem::ChipMemory { addr } => format!(
                "lives in chip memory at {addr} of this host, which another host cannot read; \
                 pass a HostBuffer tensor instead (its bytes travel with the task and written \
                 bytes come back), or let the remote graph allocate chip memory on its own chip"
            ),
            TensorProblem::NotHostBuffer { addr, len } => format!(
                "names host memory at {addr} ({len} bytes) that is not a HostBuffer, so its \
                 bytes cannot be found to send; allocate it with HostBuffer::new and pass \
                 HostBuffer::tensor"
            ),
            TensorProblem::NoDep => "is a HostBuffer tensor tagged NoDep, so it is unknown \
                 whether its bytes come back; tag it Input, Output or InOut"
                .to_owned(),
            TensorProblem::NoSpan { addr, len } => format!(
                "is a view whose bytes do not lie inside its HostBuffer at {addr} ({len} \
                 bytes), so which bytes to send and take back is unknown"
            ),
            TensorProblem::EmptyViewsOnly { addr, len, cap } => format!(
                "is an empty view of the HostBuffer at {addr}, which only empty views of the \
                 task name: with the task's other such buffers that is {len} bytes, more than \
                 the {cap} a serving rank allocates for bytes nobody reads; view a smaller buffer"
            ),
        }
    }
}

fn task_text(run: Option<RunId>, task: Option<TaskId>) -> String {
    match (run, task) {
        (_, Some(t)) => format!(" while {t} waited"),
        (Some(r), None) => format!(" while {r} waited"),
        (None, None) => String::new(),
    }
}

fn serving_text(serving: u64) -> String {
    if serving == 0 { "no session".to_owned() } else { format!("session {serving}") }
}

/// Why a remote run failed with no task to blame, as the serving rank reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteRunFailure {
    /// The task named a graph ordinal the rank does not serve.
    #[error("no graph with ordinal {ordinal}")]
    UnknownOrdinal {
        /// The ordinal.
        ordinal: u32,
    },
    /// The task's arguments do not unpack into buffers of the rank (a tensor outside its
    /// buffer, output buffers larger than a reply can carry).
    #[error("task arguments: {0}")]
    Arguments(ArgumentsProblem),
    /// The bytes the task wrote cannot come back: the reply would exceed a frame.
    #[error(
        "the task's written bytes cannot come back: a {bytes}-byte reply exceeds the {limit} \
         bytes one frame carries"
    )]
    ReplyTooLarge {
        /// The reply's size.
        bytes: u64,
        /// The largest frame.
        limit: u64,
    },
    /// The rank's worker refused or failed the run.
    #[error("{message}")]
    Run {
        /// What kind of failure.
        kind: RemoteRunKind,
        /// The remote error, rendered there.
        message: String,
    },
}

/// Why a task's arguments do not unpack into buffers of the serving rank. Indices count
/// tensors and buffers in the task's frame; offsets and lengths are bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgumentsProblem {
    /// A tensor that is not null names no buffer.
    #[error("tensor {tensor} is not null but names no buffer")]
    NoBuffer {
        /// The tensor.
        tensor: u32,
    },
    /// A tensor names a buffer the task does not carry.
    #[error("tensor {tensor} names buffer {buffer}, but the task carries {buffers} buffers")]
    NoSuchBuffer {
        /// The tensor.
        tensor: u32,
        /// The buffer it names.
        buffer: u32,
        /// The buffers the task carries.
        buffers: u32,
    },
    /// The memory a tensor names (`size` bytes at `offset`) leaves its buffer.
    #[error(
        "tensor {tensor}: {size} bytes at offset {offset} do not fit buffer {buffer} of {len} \
         bytes"
    )]
    OutsideBuffer {
        /// The tensor.
        tensor: u32,
        /// Its buffer.
        buffer: u32,
        /// The offset of its memory in the buffer.
        offset: u64,
        /// Its memory's size.
        size: u64,
        /// The buffer's length.
        len: u64,
    },
    /// The bytes a tensor's view can touch do not lie inside its buffer.
    #[error("tensor {tensor}: its view has no byte span inside buffer {buffer} of {len} bytes")]
    NoSpan {
        /// The tensor.
        tensor: u32,
        /// Its buffer.
        buffer: u32,
        /// The buffer's length.
        len: u64,
    },
    /// The bytes to be written back into buffers sent without their bytes could not come
    /// back in one reply frame.
    #[error("output buffers of {bytes} bytes, more than the {limit} bytes a frame holds")]
    OutputsTooLarge {
        /// The bytes that would come back.
        bytes: u64,
        /// The most one frame holds.
        limit: u64,
    },
    /// Buffers sent without their bytes that the task does not write back whole (named only
    /// by empty views, by views that do not cover them, or by none) hold zeros nobody gets
    /// back; together they may hold at most `cap` bytes, and buffer `buffer`, of `len` bytes,
    /// goes past it.
    #[error(
        "buffer {buffer} of {len} bytes, sent without its bytes and not written back whole, \
         goes past the {cap} bytes such buffers may hold together"
    )]
    NotWrittenBack {
        /// The buffer.
        buffer: u32,
        /// Its length.
        len: u64,
        /// The most such buffers of one task may hold together.
        cap: u64,
    },
    /// A buffer sent with its bytes carries another number of bytes than its length.
    #[error("buffer {buffer}: {carried} bytes for a length of {len}")]
    BufferBytes {
        /// The buffer.
        buffer: u32,
        /// The bytes it carries.
        carried: u64,
        /// Its length.
        len: u64,
    },
    /// A buffer of length 0, which no host buffer has.
    #[error("buffer {buffer} has length 0")]
    EmptyBuffer {
        /// The buffer.
        buffer: u32,
    },
    /// The serving rank could not allocate a buffer.
    #[error("buffer {buffer}: the rank could not allocate its {len} bytes")]
    Allocation {
        /// The buffer.
        buffer: u32,
        /// Its length.
        len: u64,
    },
    /// A tensor descriptor breaks a rule of `Tensor::validate`.
    #[error("tensor {tensor}: {}", error.as_deref().map_or_else(
        || "the descriptor breaks a rule this build cannot name".to_owned(),
        ToString::to_string,
    ))]
    InvalidTensor {
        /// The tensor.
        tensor: u32,
        /// The rule it breaks; `None` for a rule the frame format has no code for (the
        /// serving rank logs it). Boxed to keep `RemoteError` small.
        error: Option<Box<TypesError>>,
    },
    /// More tensors than a task takes.
    #[error("{count} tensors, more than the {cap} a task takes")]
    TooManyTensors {
        /// The tensors the task carries.
        count: u32,
        /// The most a task takes.
        cap: u32,
    },
    /// More scalars than a task takes.
    #[error("{count} scalars, more than the {cap} a task takes")]
    TooManyScalars {
        /// The scalars the task carries.
        count: u32,
        /// The most a task takes.
        cap: u32,
    },
}

/// What kind of error the serving rank's worker returned for a run (its `RunErrorKind`,
/// without the details that stay in the message). The discriminant is its wire code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[repr(u8)]
pub enum RemoteRunKind {
    /// A task's callable failed.
    TaskFailed = 0,
    /// The path to a callable failed.
    EndpointFailed = 1,
    /// A device reported a fault.
    DeviceFault = 2,
    /// A timeout fired.
    Timeout = 3,
    /// A capacity ran out.
    Capacity = 4,
    /// The graph's build failed.
    SubmissionFailed = 5,
    /// The run was aborted (the worker shut down).
    Aborted = 6,
    /// A cleanup step failed or was interrupted.
    CleanupFailed = 7,
    /// An engine invariant broke.
    Internal = 8,
    /// Not a run error: the worker refused the run (closed, unusable, bad input).
    Refused = 9,
}

fn task_seq(task: Option<u32>) -> String {
    task.map(|t| format!(" at task#{t}")).unwrap_or_default()
}

/// Why `serve_l3` returned with an error on a serving rank.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The transport failed or rank 0 refused the session.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The L3 worker failed to start (rank 0 was told). Boxed, like `Close`, to keep the
    /// `Result` of `serve_l3` small.
    #[error(transparent)]
    Start(Box<StartError>),
    /// Closing the L3 worker at shutdown reported errors (rank 0 was told).
    #[error(transparent)]
    Close(Box<CloseError>),
    /// Closing the L3 worker at shutdown reported errors, and the `ShutdownDone` carrying them
    /// was not confirmed sent: MPI refused it, or did not confirm it within the wait, when it
    /// may still arrive. A `Left` saying so (`LeftCause::ShutdownDoneLost`) was sent after it,
    /// if MPI took that.
    #[error(
        "{close} (its ShutdownDone to rank 0 was not confirmed sent: {report}; a Left saying so \
         was attempted)"
    )]
    CloseUnreported {
        /// What the close reported.
        close: Box<CloseError>,
        /// Why `ShutdownDone` was not confirmed sent.
        report: RemoteError,
    },
    /// The L3 worker failed to start, and rank 0 could not be told: the `Manifest` carrying
    /// the failure was not sent.
    #[error("{start} (rank 0 was not told: {report})")]
    StartUnreported {
        /// Why the start failed.
        start: Box<StartError>,
        /// Why the `Manifest` could not be sent.
        report: RemoteError,
    },
    /// Rank 0 refused the session, and closing the L3 worker started for it reported errors.
    #[error("rank 0 refused the session: {reason}; closing the worker then reported: {close}")]
    RefusedThenClose {
        /// Rank 0's reason.
        reason: String,
        /// What the close reported.
        close: Box<CloseError>,
    },
}

impl From<StartError> for ServeError {
    fn from(e: StartError) -> Self {
        Self::Start(Box::new(e))
    }
}

impl From<CloseError> for ServeError {
    fn from(e: CloseError) -> Self {
        Self::Close(Box::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_init_failure_keeps_the_facts_of_its_cause_and_reads_as_before() {
        let os = std::io::Error::from_raw_os_error(11);
        let e = InitError::spawn(&os);
        assert_eq!(e, InitError::Spawn { kind: os.kind(), os_code: Some(11) });
        assert_eq!(e.to_string(), format!("could not start the MPI thread: {os}"));
        let custom = std::io::Error::new(std::io::ErrorKind::OutOfMemory, "no stack");
        assert_eq!(
            InitError::spawn(&custom),
            InitError::Spawn { kind: std::io::ErrorKind::OutOfMemory, os_code: None }
        );
        let threading = InitError::Threading {
            provided: ThreadingLevel::Single,
            required: ThreadingLevel::Funneled,
        };
        assert_eq!(
            RemoteError::from(threading).to_string(),
            "MPI initialization failed: the MPI library provides single threading, funneled is \
             needed"
        );
        assert!(ThreadingLevel::Single < ThreadingLevel::Funneled);
    }

    #[test]
    fn a_serving_ranks_error_becomes_the_cause_it_leaves_with() {
        let budget = Duration::from_secs(3);
        let silent = RemoteError::Unresponsive { rank: 0, level: 4, budget, run: None, task: None };
        assert_eq!(LeftCause::from(&silent), LeftCause::Unresponsive { budget });
        let mpi = RemoteError::Mpi { op: "MPI_Test", code: 5 };
        assert_eq!(LeftCause::from(&mpi), LeftCause::Mpi { op: "MPI_Test", code: 5 });
        let large = RemoteError::FrameTooLarge { rank: 0, bytes: 10, limit: 4 };
        assert_eq!(LeftCause::from(&large), LeftCause::FrameTooLarge { bytes: 10, limit: 4 });
        let waited = Duration::from_secs(1);
        let unconfirmed =
            RemoteError::SendUnconfirmed { rank: 0, frame: FrameKind::ShutdownDone, waited };
        assert_eq!(
            LeftCause::from(&unconfirmed),
            LeftCause::SendUnconfirmed { frame: FrameKind::ShutdownDone, waited }
        );
        assert_eq!(LeftCause::from(&RemoteError::Finalized), LeftCause::Finalized);
        let violation = ProtocolViolation::Malformed(DecodeError::RunIdZero { at: 16 });
        let protocol = RemoteError::Protocol { rank: 0, violation: violation.clone() };
        assert_eq!(LeftCause::from(&protocol), LeftCause::Protocol(violation));
        // An error about another rank than rank 0 keeps its text, rank and all.
        let other = RemoteError::Protocol {
            rank: 2,
            violation: ProtocolViolation::Malformed(DecodeError::RunIdZero { at: 16 }),
        };
        assert_eq!(LeftCause::from(&other), LeftCause::Other { text: other.to_string() });
        let left = RemoteError::Left {
            rank: 1,
            cause: LeftCause::ShutdownDoneLost {
                lost: Box::new(LeftCause::from(&mpi)),
                close: None,
            },
        };
        assert_eq!(
            left.to_string(),
            "rank 1 left its session: its ShutdownDone was lost (MPI_Test returned MPI error \
             code 5); its worker closed"
        );
        // One MPI did not confirm sent within the wait may still arrive: it is not called lost.
        let left = RemoteError::Left {
            rank: 1,
            cause: LeftCause::ShutdownDoneLost {
                lost: Box::new(LeftCause::from(&unconfirmed)),
                close: Some("the device did not release".into()),
            },
        };
        assert_eq!(
            left.to_string(),
            "rank 1 left its session: its ShutdownDone was unconfirmed and may still arrive (the \
             ShutdownDone frame to rank 0 was not confirmed sent within 1s); its close: the \
             device did not release"
        );
    }
}
