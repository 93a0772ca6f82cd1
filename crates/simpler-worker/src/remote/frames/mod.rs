//! The messages between rank 0 and a serving rank, encoded field by field in little-endian
//! (`docs/multi-host.md` §"Frames"). Never a struct image or a raw pointer: a frame means the
//! same on every host.
//!
//! Every frame starts with the protocol version (`u16`) and a kind byte ([`FrameKind`]); a
//! frame of another version, an unknown kind, a short body or trailing bytes is a
//! [`DecodeError`] naming the offset and what was found there.

mod arguments;
mod decode_error;
mod kind;
mod left;

use std::path::PathBuf;
use std::time::Duration;

use simpler_types::{
    CallConfig, CallableId, CallableKind, CallableNamespace, CancelReason, FailureMechanism,
    MAX_TENSOR_DIMS, RingOverride, RingSel, RunId, TaskArgs, TaskFailure, TaskId, Tensor,
    TensorArgType, TimeoutBudget, WorkerId, WorkerRef, WorkerType,
};

pub(crate) use self::arguments::carries as carries_types_error;
pub use self::decode_error::{DecodeError, WireField};
pub use self::kind::FrameKind;
use super::error::{LeftCause, RemoteRunFailure, RemoteRunKind};

/// Version of the frame layout; both ends must agree.
pub(crate) const VERSION: u16 = 13;

/// Error frames longer than this are cut (innermost message first), so one failure can never
/// grow a completion without bound.
pub(crate) const MAX_ERROR_BYTES: usize = 64 * 1024;

/// The most levels of a failure chain a completion carries (the outermost ones; a real chain
/// has one per worker level). Decoding refuses more, so a hostile frame can neither reserve
/// memory by its count nor nest `Arc`s deep enough to overflow the stack when dropped.
pub(crate) const MAX_CHAIN_LEVELS: usize = 32;

/// The most buffers a task's arguments carry: rank 0 sends one per distinct buffer the task's
/// tensors name, and a task has at most this many tensors. Decoding refuses more before
/// reserving anything, so a frame of many tiny buffers cannot make a serving rank allocate for
/// each (a `WireBuffer` here, a `HostBuffer` when it unpacks them).
pub(crate) const MAX_WIRE_BUFFERS: usize = TaskArgs::MAX_TENSORS;

/// The most written spans a completion carries: what a task's write-tagged tensors can name.
/// Decoding refuses more before reading any, so a frame of many empty spans cannot make rank 0
/// hold several times the frame's size.
const MAX_WRITTEN_SPANS: usize = TaskArgs::MAX_TENSORS;

/// The most close errors a `ShutdownDone` keeps; the rest are counted in one more line.
pub(crate) const MAX_SHUTDOWN_ERRORS: usize = 16;

/// The fewest bytes one level of a failure chain takes on the wire (run id, seq, digest,
/// kind, namespace, worker flag, member flag, mechanism, message length, code flag).
const MIN_CHAIN_LEVEL_BYTES: usize = 8 + 4 + 32 + 1 + 1 + 1 + 1 + 1 + 4 + 1;

/// A manifest entry: what a rank has registered, in registration order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ManifestEntry {
    /// Graph or chip callable.
    pub(crate) kind: CallableKind,
    /// The registered name (a chip callable's entry name).
    pub(crate) name: String,
    /// Content digest for a chip callable; for a graph, a digest of its name and ordinal.
    pub(crate) digest: [u8; 32],
}

/// A task's arguments as they cross hosts: tensors name a buffer of the frame, never an
/// address of the sending host (`docs/multi-host.md` §"Tensors across hosts").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct WireArgs {
    pub(crate) tensors: Vec<WireTensor>,
    pub(crate) scalars: Vec<u64>,
    /// The host buffers the tensors lie in, each once.
    pub(crate) buffers: Vec<WireBuffer>,
}

/// One tensor argument: its descriptor with `addr` holding the offset of the view's base in
/// its buffer, its tag, and which buffer of the frame it lies in (`None`: a null tensor).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WireTensor {
    pub(crate) tensor: Tensor,
    pub(crate) tag: TensorArgType,
    pub(crate) buffer: Option<u32>,
}

/// One host buffer of a task: its length, and its bytes unless the task only overwrites it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WireBuffer {
    pub(crate) len: u64,
    pub(crate) bytes: Option<Vec<u8>>,
}

/// Bytes a remote task wrote, on their way back: `bytes.len()` bytes at `offset` of buffer
/// `buffer` of the task's frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WrittenSpan {
    pub(crate) buffer: u32,
    pub(crate) offset: u64,
    pub(crate) bytes: Vec<u8>,
}

/// One level of a remote failure chain, outermost first.
pub(crate) type WireFailure = TaskFailure;

/// What a task's remote run ended with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The run succeeded; the bytes its write-tagged tensors can touch come back.
    Ok { written: Vec<WrittenSpan> },
    /// A task of the remote run failed: its failure chain (the remote L3 level first).
    TaskFailed { failure: WireFailure },
    /// The remote run failed without a task to blame (an unknown graph, arguments that did
    /// not unpack, a reply too large, a build error, a closed worker).
    RunFailed { level: u8, failure: RemoteRunFailure },
}

/// Every message of the protocol.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Packet {
    /// Rank 0 → serving rank: open session `session` (unique in the job), reply with the
    /// manifest.
    Hello { session: u64 },
    /// Serving rank → rank 0: what it registered, or why its L3 worker did not start, for
    /// session `session` (so a late manifest of an abandoned session is never taken).
    Manifest {
        session: u64,
        host: String,
        entries: Vec<ManifestEntry>,
        start_error: Option<String>,
    },
    /// Rank 0 → serving rank: the manifest matched, serve tasks.
    Accept,
    /// Rank 0 → serving rank: start of session `session` refused (`None`: rank 0's start
    /// failed before it reached this rank, so no session opened); close the L3 worker and
    /// return this reason. A refusal of another session is stale and ignored.
    Refuse { session: Option<u64>, reason: String },
    /// Rank 0 → serving rank: run graph `graph` (its manifest ordinal) once.
    Task { seq: u64, graph: u32, config: CallConfig, args: WireArgs },
    /// Serving rank → rank 0: how task `seq` ended.
    Completion { seq: u64, outcome: Outcome },
    /// Rank 0 → serving rank: close the L3 worker and end the session.
    Shutdown,
    /// Serving rank → rank 0: the L3 worker is closed; what its close reported.
    ShutdownDone { errors: Vec<String> },
    /// Health probe (on the health communicator).
    Ping { nonce: u64 },
    /// Health answer (on the health communicator): the ping's nonce and the session the
    /// answering rank serves when it answers (0: none), by which rank 0 learns that a serving
    /// rank left its session even when the `Left` saying so was lost.
    Pong { nonce: u64, session: u64 },
    /// Rank 0 → serving rank: phase 1 of a registration after start: be ready to serve graph
    /// `name` as ordinal `ordinal`, and answer.
    /// `seq` is unique in the job, so a late answer to an earlier attempt is never taken.
    Prepare { seq: u64, ordinal: u32, name: String },
    /// Serving rank → rank 0: ready for `Prepare` `seq` (`refusal: None`), or why not.
    Prepared { seq: u64, refusal: Option<String> },
    /// Rank 0 → serving rank: phase 2, every rank was ready: serve the prepared graph.
    Commit { ordinal: u32 },
    /// Rank 0 → serving rank: phase 2, some rank refused: forget the prepared graph.
    Abort { ordinal: u32 },
    /// Serving rank → rank 0: session `session` ended on this rank with an error (a lost or
    /// malformed frame, a failed send): nothing more will come from it in that session.
    Left { session: u64, cause: LeftCause },
}

impl Packet {
    /// Which message it is.
    pub(crate) fn kind(&self) -> FrameKind {
        match self {
            Packet::Hello { .. } => FrameKind::Hello,
            Packet::Manifest { .. } => FrameKind::Manifest,
            Packet::Accept => FrameKind::Accept,
            Packet::Refuse { .. } => FrameKind::Refuse,
            Packet::Task { .. } => FrameKind::Task,
            Packet::Completion { .. } => FrameKind::Completion,
            Packet::Shutdown => FrameKind::Shutdown,
            Packet::ShutdownDone { .. } => FrameKind::ShutdownDone,
            Packet::Ping { .. } => FrameKind::Ping,
            Packet::Pong { .. } => FrameKind::Pong,
            Packet::Prepare { .. } => FrameKind::Prepare,
            Packet::Prepared { .. } => FrameKind::Prepared,
            Packet::Commit { .. } => FrameKind::Commit,
            Packet::Abort { .. } => FrameKind::Abort,
            Packet::Left { .. } => FrameKind::Left,
        }
    }

    /// Encodes the frame.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(64));
        w.u16(VERSION);
        w.u8(self.kind() as u8);
        match self {
            Packet::Hello { session } => {
                w.u64(*session);
            }
            Packet::Manifest { session, host, entries, start_error } => {
                w.u64(*session);
                w.str(host);
                w.u32(entries.len() as u32);
                for e in entries {
                    w.u8(e.kind as u8);
                    w.str(&e.name);
                    w.bytes_fixed(&e.digest);
                }
                w.opt_str(start_error.as_deref());
            }
            Packet::Accept | Packet::Shutdown => {}
            Packet::Refuse { session, reason } => {
                w.opt_u64(*session);
                w.str(reason);
            }
            Packet::Left { session, cause } => {
                w.u64(*session);
                w.left_cause(cause);
            }
            Packet::Task { seq, graph, config, args } => {
                w.u64(*seq);
                w.u32(*graph);
                w.config(config);
                w.args(args);
            }
            Packet::Completion { seq, outcome } => {
                w.u64(*seq);
                match outcome {
                    Outcome::Ok { written } => {
                        w.u8(0);
                        w.u32(written.len() as u32);
                        for s in written {
                            w.u32(s.buffer);
                            w.u64(s.offset);
                            w.blob(&s.bytes);
                        }
                    }
                    Outcome::TaskFailed { failure } => {
                        w.u8(1);
                        let chain: Vec<&TaskFailure> =
                            failure.chain().take(MAX_CHAIN_LEVELS).collect();
                        w.u32(chain.len() as u32);
                        let mut budget = MAX_ERROR_BYTES;
                        for f in chain {
                            w.failure(f, &mut budget);
                        }
                    }
                    Outcome::RunFailed { level, failure } => {
                        w.u8(2);
                        w.u8(*level);
                        w.run_failure(failure);
                    }
                }
            }
            Packet::ShutdownDone { errors } => {
                w.u32(errors.len() as u32);
                for e in errors {
                    w.str(truncate(e, MAX_ERROR_BYTES));
                }
            }
            Packet::Ping { nonce } => {
                w.u64(*nonce);
            }
            Packet::Pong { nonce, session } => {
                w.u64(*nonce);
                w.u64(*session);
            }
            Packet::Prepare { seq, ordinal, name } => {
                w.u64(*seq);
                w.u32(*ordinal);
                w.str(name);
            }
            Packet::Prepared { seq, refusal } => {
                w.u64(*seq);
                w.opt_str(refusal.as_deref().map(|r| truncate(r, MAX_ERROR_BYTES)));
            }
            Packet::Commit { ordinal } => {
                w.u32(*ordinal);
            }
            Packet::Abort { ordinal } => {
                w.u32(*ordinal);
            }
        }
        w.0
    }

    /// Decodes one frame; the whole buffer must be consumed.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Packet, DecodeError> {
        let mut r = Reader { bytes, at: 0 };
        let version = r.u16()?;
        if version != VERSION {
            return Err(DecodeError::Version { found: version, expected: VERSION });
        }
        let p = match r.code(WireField::FrameKind, FrameKind::from_code)? {
            FrameKind::Hello => Packet::Hello { session: r.u64()? },
            FrameKind::Manifest => {
                let session = r.u64()?;
                let host = r.str()?;
                let n = r.count(33)?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    let kind = r.code(WireField::CallableKind, callable_kind)?;
                    let name = r.str()?;
                    let digest = r.array::<32>()?;
                    entries.push(ManifestEntry { kind, name, digest });
                }
                let start_error = r.opt_str()?;
                Packet::Manifest { session, host, entries, start_error }
            }
            FrameKind::Accept => Packet::Accept,
            FrameKind::Refuse => Packet::Refuse { session: r.opt_u64()?, reason: r.str()? },
            FrameKind::Left => Packet::Left { session: r.u64()?, cause: r.left_cause()? },
            FrameKind::Task => Packet::Task {
                seq: r.u64()?,
                graph: r.u32()?,
                config: r.config()?,
                args: r.args()?,
            },
            FrameKind::Completion => {
                let seq = r.u64()?;
                let outcome = match r.code(WireField::Outcome, |c| (c <= 2).then_some(c))? {
                    0 => {
                        let n = r.count_at_most(16, MAX_WRITTEN_SPANS, |at, count, cap| {
                            DecodeError::TooManySpans { at, count, cap }
                        })?;
                        let mut written = Vec::with_capacity(n);
                        for _ in 0..n {
                            let buffer = r.u32()?;
                            let offset = r.u64()?;
                            written.push(WrittenSpan { buffer, offset, bytes: r.blob()?.to_vec() });
                        }
                        Outcome::Ok { written }
                    }
                    1 => {
                        let at = r.at;
                        let n = r.count(MIN_CHAIN_LEVEL_BYTES)?;
                        if n > MAX_CHAIN_LEVELS {
                            return Err(DecodeError::ChainTooDeep {
                                levels: n as u32,
                                max: MAX_CHAIN_LEVELS as u32,
                            });
                        }
                        let mut levels = Vec::with_capacity(n);
                        for _ in 0..n {
                            levels.push(r.failure()?);
                        }
                        // Rebuild the chain innermost first.
                        let mut failure: Option<TaskFailure> = None;
                        for mut f in levels.into_iter().rev() {
                            if let Some(inner) = failure.take() {
                                f = f.caused_by(std::sync::Arc::new(inner));
                            }
                            failure = Some(f);
                        }
                        let failure = failure.ok_or(DecodeError::EmptyChain { at })?;
                        Outcome::TaskFailed { failure }
                    }
                    _ => Outcome::RunFailed { level: r.u8()?, failure: r.run_failure()? },
                };
                Packet::Completion { seq, outcome }
            }
            FrameKind::Shutdown => Packet::Shutdown,
            FrameKind::ShutdownDone => {
                // A serving rank of this build reports one close error at most: a peer that
                // claims many is kept to a few, so its frame cannot make this rank allocate
                // several times the frame's size (a `String` per four bytes).
                let n = r.count(4)?;
                let mut errors = Vec::with_capacity(n.min(MAX_SHUTDOWN_ERRORS));
                for i in 0..n {
                    let e = r.str()?;
                    if i < MAX_SHUTDOWN_ERRORS {
                        errors.push(e);
                    }
                }
                if n > MAX_SHUTDOWN_ERRORS {
                    errors
                        .push(format!("({} more close errors not kept)", n - MAX_SHUTDOWN_ERRORS));
                }
                Packet::ShutdownDone { errors }
            }
            FrameKind::Ping => Packet::Ping { nonce: r.u64()? },
            FrameKind::Pong => Packet::Pong { nonce: r.u64()?, session: r.u64()? },
            FrameKind::Prepare => {
                Packet::Prepare { seq: r.u64()?, ordinal: r.u32()?, name: r.str()? }
            }
            FrameKind::Prepared => Packet::Prepared { seq: r.u64()?, refusal: r.opt_str()? },
            FrameKind::Commit => Packet::Commit { ordinal: r.u32()? },
            FrameKind::Abort => Packet::Abort { ordinal: r.u32()? },
        };
        if r.at != bytes.len() {
            return Err(DecodeError::Trailing { at: r.at, len: bytes.len() });
        }
        Ok(p)
    }
}

/// The longest prefix of `s` within `max` bytes that ends on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn callable_kind(v: u8) -> Option<CallableKind> {
    Some(match v {
        1 => CallableKind::Chip,
        2 => CallableKind::Host,
        3 => CallableKind::Graph,
        _ => return None,
    })
}

/// A remote run failure's kind from its wire code (its discriminant).
fn run_kind(v: u8) -> Option<RemoteRunKind> {
    Some(match v {
        0 => RemoteRunKind::TaskFailed,
        1 => RemoteRunKind::EndpointFailed,
        2 => RemoteRunKind::DeviceFault,
        3 => RemoteRunKind::Timeout,
        4 => RemoteRunKind::Capacity,
        5 => RemoteRunKind::SubmissionFailed,
        6 => RemoteRunKind::Aborted,
        7 => RemoteRunKind::CleanupFailed,
        8 => RemoteRunKind::Internal,
        9 => RemoteRunKind::Refused,
        _ => return None,
    })
}

/// The bytes of one tensor entry of [`WireArgs`] (descriptor, tag, buffer flag) at least.
const WIRE_TENSOR_MIN: usize = 4 * 8 + 2 * 4 + 4 + 2 * MAX_TENSOR_DIMS * 4 + 8 + 2;

fn tag(v: u8) -> Option<TensorArgType> {
    Some(match v {
        0 => TensorArgType::Input,
        1 => TensorArgType::Output,
        2 => TensorArgType::InOut,
        3 => TensorArgType::OutputExisting,
        4 => TensorArgType::NoDep,
        _ => return None,
    })
}

fn namespace(v: u8) -> Option<CallableNamespace> {
    Some(match v {
        1 => CallableNamespace::LocalChip,
        2 => CallableNamespace::LocalHost,
        3 => CallableNamespace::Remote,
        _ => return None,
    })
}

/// Budget names that cross the wire by code; any other budget arrives as "remote".
const BUDGETS: [TimeoutBudget; 6] = [
    TimeoutBudget::OpExecute,
    TimeoutBudget::StreamSync,
    TimeoutBudget::DeviceScheduler,
    TimeoutBudget::Handshake,
    TimeoutBudget::RingAlloc,
    TimeoutBudget::Admission,
];

const CANCEL_REASONS: [CancelReason; 4] = [
    CancelReason::SubmissionFailed,
    CancelReason::RunAborted,
    CancelReason::Shutdown,
    CancelReason::EnginePoisoned,
];

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes_fixed(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
    fn blob(&mut self, b: &[u8]) {
        // Longer blobs make frames larger than any MPI message, which sending refuses.
        self.u32(u32::try_from(b.len()).unwrap_or(u32::MAX));
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.blob(s.as_bytes());
    }
    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
            None => self.u8(0),
        }
    }
    fn opt_u32(&mut self, v: Option<u32>) {
        match v {
            Some(v) => {
                self.u8(1);
                self.u32(v);
            }
            None => self.u8(0),
        }
    }
    fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            Some(v) => {
                self.u8(1);
                self.u64(v);
            }
            None => self.u8(0),
        }
    }

    fn args(&mut self, a: &WireArgs) {
        self.u32(a.tensors.len() as u32);
        for t in &a.tensors {
            self.tensor(&t.tensor);
            self.u8(t.tag as u8);
            self.opt_u32(t.buffer);
        }
        self.u32(a.scalars.len() as u32);
        for &v in &a.scalars {
            self.u64(v);
        }
        self.u32(a.buffers.len() as u32);
        for b in &a.buffers {
            self.u64(b.len);
            match &b.bytes {
                Some(bytes) => {
                    self.u8(1);
                    self.blob(bytes);
                }
                None => self.u8(0),
            }
        }
    }

    /// A tensor descriptor field by field (its reserved bytes stay behind).
    fn tensor(&mut self, t: &Tensor) {
        self.u64(t.addr);
        self.u64(t.size);
        self.u64(t.owner_task_id);
        self.u64(t.start_offset);
        self.u32(t.version as u32);
        self.u32(t.ndims);
        self.u8(t.dtype);
        self.u8(t.manual_dep);
        self.u8(t.is_contiguous);
        self.u8(t.child_memory);
        for &s in &t.shapes {
            self.u32(s);
        }
        self.u64(t.extent_elems);
        for &s in &t.strides {
            self.u32(s);
        }
    }

    fn config(&mut self, c: &CallConfig) {
        self.u32(c.block_dim());
        self.u32(c.aicpu_thread_num());
        self.u32(c.swimlane().as_u32());
        self.u32(c.dump_args().as_u32());
        self.opt_u32(c.pmu().map(|p| p.as_u32()));
        self.u8(u8::from(c.dep_gen()));
        self.u8(u8::from(c.scope_stats()));
        for o in c.runtime_env() {
            self.opt_u32(o.task_window);
            self.opt_u64(o.heap_bytes);
            self.opt_u32(o.dep_pool);
        }
        let prefix = c.output_prefix().map(|p| p.to_string_lossy().into_owned());
        self.opt_str(prefix.as_deref());
    }

    /// One level of a failure chain; the message is cut so the whole chain stays within
    /// `budget` bytes of text.
    fn failure(&mut self, f: &TaskFailure, budget: &mut usize) {
        self.u64(f.task.run.get());
        self.u32(f.task.seq);
        self.bytes_fixed(&f.callable.digest);
        self.u8(f.callable.kind as u8);
        self.u8(f.callable.namespace as u8);
        match f.worker {
            Some(w) => {
                self.u8(1);
                self.u8(w.ty as u8);
                self.u32(w.id.0);
            }
            None => self.u8(0),
        }
        self.opt_u32(f.member);
        self.mechanism(&f.mechanism);
        let message = truncate(&f.message, *budget);
        *budget -= message.len();
        self.str(message);
        match f.device_code {
            Some(c) => {
                self.u8(1);
                self.u32(c.code as u32);
                self.str(c.name);
            }
            None => self.u8(0),
        }
    }

    fn run_failure(&mut self, f: &RemoteRunFailure) {
        match f {
            RemoteRunFailure::UnknownOrdinal { ordinal } => {
                self.u8(0);
                self.u32(*ordinal);
            }
            RemoteRunFailure::Arguments(problem) => {
                self.u8(1);
                self.arguments_problem(problem);
            }
            RemoteRunFailure::ReplyTooLarge { bytes, limit } => {
                self.u8(2);
                self.u64(*bytes);
                self.u64(*limit);
            }
            RemoteRunFailure::Run { kind, message } => {
                self.u8(3);
                self.u8(*kind as u8);
                self.str(truncate(message, MAX_ERROR_BYTES));
            }
        }
    }

    fn mechanism(&mut self, m: &FailureMechanism) {
        match m {
            FailureMechanism::TaskFailed => self.u8(0),
            FailureMechanism::Panicked => self.u8(1),
            FailureMechanism::EndpointFailed => self.u8(2),
            FailureMechanism::DeviceFault => self.u8(3),
            FailureMechanism::Timeout { budget, limit } => {
                self.u8(4);
                let code = BUDGETS.iter().position(|b| b == budget).unwrap_or(BUDGETS.len());
                self.u8(code as u8);
                self.u64(limit.as_nanos().min(u128::from(u64::MAX)) as u64);
            }
            FailureMechanism::CapacityExhausted { what } => {
                self.u8(5);
                self.str(what);
            }
            FailureMechanism::Poisoned { root } => {
                self.u8(6);
                self.u64(root.run.get());
                self.u32(root.seq);
            }
            FailureMechanism::Cancelled { reason }
                if let Some(code) = CANCEL_REASONS.iter().position(|r| r == reason) =>
            {
                self.u8(7);
                self.u8(code as u8);
            }
            // A mechanism (or cancel reason) added later crosses as an endpoint failure; its
            // text is in the message.
            _ => self.u8(2),
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let len = self.bytes.len();
        let end = self.at.checked_add(n).filter(|&e| e <= len).ok_or(DecodeError::Truncated {
            at: self.at,
            wanted: n,
            len,
        })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A count of items that take at least `min_item` bytes each, checked against what is
    /// left so a corrupt count cannot make the decoder allocate without bound.
    fn count(&mut self, min_item: usize) -> Result<usize, DecodeError> {
        let at = self.at;
        let count = self.u32()?;
        let needed = u64::from(count).saturating_mul(min_item as u64);
        let left = self.bytes.len() - self.at;
        if needed > left as u64 {
            return Err(DecodeError::Count { at, count, needed, left });
        }
        Ok(count as usize)
    }
    /// A [`count`](Self::count) that may not exceed `cap`, refused as `too_many(at, count, cap)`
    /// before any item is read.
    fn count_at_most(
        &mut self,
        min_item: usize,
        cap: usize,
        too_many: fn(usize, u32, u32) -> DecodeError,
    ) -> Result<usize, DecodeError> {
        let at = self.at;
        let n = self.count(min_item)?;
        if n > cap {
            return Err(too_many(at, n as u32, cap as u32));
        }
        Ok(n)
    }
    /// A one-byte code of `field`, which `known` maps to its meaning.
    fn code<T>(
        &mut self,
        field: WireField,
        known: impl FnOnce(u8) -> Option<T>,
    ) -> Result<T, DecodeError> {
        let at = self.at;
        let code = self.u8()?;
        known(code).ok_or(DecodeError::Code { field, code, at })
    }
    fn blob(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn str(&mut self) -> Result<String, DecodeError> {
        let b = self.blob()?;
        let at = self.at - b.len();
        String::from_utf8(b.to_vec())
            .map_err(|e| DecodeError::Text { at, valid_up_to: e.utf8_error().valid_up_to() })
    }
    fn flag(&mut self) -> Result<bool, DecodeError> {
        self.code(WireField::Flag, |c| match c {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        })
    }
    fn opt_str(&mut self) -> Result<Option<String>, DecodeError> {
        if self.flag()? { self.str().map(Some) } else { Ok(None) }
    }
    fn opt_u32(&mut self) -> Result<Option<u32>, DecodeError> {
        if self.flag()? { self.u32().map(Some) } else { Ok(None) }
    }
    fn opt_u64(&mut self) -> Result<Option<u64>, DecodeError> {
        if self.flag()? { self.u64().map(Some) } else { Ok(None) }
    }
    fn run_id(&mut self) -> Result<RunId, DecodeError> {
        let at = self.at;
        RunId::from_raw(self.u64()?).ok_or(DecodeError::RunIdZero { at })
    }

    fn args(&mut self) -> Result<WireArgs, DecodeError> {
        let n = self.count(WIRE_TENSOR_MIN)?;
        let mut tensors = Vec::with_capacity(n);
        for _ in 0..n {
            let tensor = self.tensor()?;
            let tag = self.code(WireField::TensorTag, tag)?;
            tensors.push(WireTensor { tensor, tag, buffer: self.opt_u32()? });
        }
        let n = self.count(8)?;
        let mut scalars = Vec::with_capacity(n);
        for _ in 0..n {
            scalars.push(self.u64()?);
        }
        let n = self.count_at_most(9, MAX_WIRE_BUFFERS, |at, count, cap| {
            DecodeError::TooManyBuffers { at, count, cap }
        })?;
        let mut buffers = Vec::with_capacity(n);
        for _ in 0..n {
            let len = self.u64()?;
            let bytes = if self.flag()? { Some(self.blob()?.to_vec()) } else { None };
            buffers.push(WireBuffer { len, bytes });
        }
        Ok(WireArgs { tensors, scalars, buffers })
    }

    /// A tensor descriptor; checked by the receiver once its address is its own.
    fn tensor(&mut self) -> Result<Tensor, DecodeError> {
        // Fields in wire order; the reserved bytes stay zero.
        let addr = self.u64()?;
        let size = self.u64()?;
        let owner_task_id = self.u64()?;
        let start_offset = self.u64()?;
        let version = self.u32()? as i32;
        let ndims = self.u32()?;
        let dtype = self.u8()?;
        let manual_dep = self.u8()?;
        let is_contiguous = self.u8()?;
        let child_memory = self.u8()?;
        let mut shapes = [0u32; MAX_TENSOR_DIMS];
        for s in &mut shapes {
            *s = self.u32()?;
        }
        let extent_elems = self.u64()?;
        let mut strides = [0u32; MAX_TENSOR_DIMS];
        for s in &mut strides {
            *s = self.u32()?;
        }
        Ok(Tensor {
            addr,
            size,
            owner_task_id,
            start_offset,
            version,
            ndims,
            dtype,
            manual_dep,
            is_contiguous,
            child_memory,
            shapes,
            extent_elems,
            strides,
            reserved: [0; 36],
        })
    }

    fn config(&mut self) -> Result<CallConfig, DecodeError> {
        let mut b = CallConfig::builder()
            .block_dim(self.u32()?)
            .aicpu_thread_num(self.u32()?)
            .swimlane_level(self.u32()?)
            .dump_args_level(self.u32()?);
        if let Some(code) = self.opt_u32()? {
            b = b.pmu_event(code);
        }
        b = b.dep_gen(self.flag()?).scope_stats(self.flag()?);
        for ring in 0..simpler_types::HEAP_RING_COUNT as u32 {
            let o = RingOverride {
                task_window: self.opt_u32()?,
                heap_bytes: self.opt_u64()?,
                dep_pool: self.opt_u32()?,
            };
            if !o.is_unset() {
                b = b.ring_override(RingSel::Ring(ring), o);
            }
        }
        if let Some(prefix) = self.opt_str()? {
            b = b.output_prefix(PathBuf::from(prefix));
        }
        b.build().map_err(|e| DecodeError::Config(Box::new(e)))
    }

    fn failure(&mut self) -> Result<TaskFailure, DecodeError> {
        let task = TaskId::new(self.run_id()?, self.u32()?);
        let digest = self.array::<32>()?;
        let kind = self.code(WireField::CallableKind, callable_kind)?;
        let ns = self.code(WireField::Namespace, namespace)?;
        let callable = CallableId::new(digest, kind, ns);
        let worker = if self.flag()? {
            let ty = self.code(WireField::WorkerType, |c| match c {
                0 => Some(WorkerType::NextLevel),
                1 => Some(WorkerType::Sub),
                _ => None,
            })?;
            Some(WorkerRef { ty, id: WorkerId(self.u32()?) })
        } else {
            None
        };
        let member = self.opt_u32()?;
        let mechanism = self.mechanism()?;
        let message = self.str()?;
        let mut f = TaskFailure::new(task, callable, mechanism, message);
        f.worker = worker;
        f.member = member;
        if self.flag()? {
            let code = self.u32()? as i32;
            let name = crate::code_names::intern(&self.str()?);
            f.device_code = Some(simpler_types::DeviceCode::new(code, name));
        }
        Ok(f)
    }

    fn run_failure(&mut self) -> Result<RemoteRunFailure, DecodeError> {
        Ok(match self.code(WireField::RunFailure, |c| (c <= 3).then_some(c))? {
            0 => RemoteRunFailure::UnknownOrdinal { ordinal: self.u32()? },
            1 => RemoteRunFailure::Arguments(self.arguments_problem()?),
            2 => RemoteRunFailure::ReplyTooLarge { bytes: self.u64()?, limit: self.u64()? },
            _ => {
                let kind = self.code(WireField::RunFailureKind, run_kind)?;
                RemoteRunFailure::Run { kind, message: self.str()? }
            }
        })
    }

    fn mechanism(&mut self) -> Result<FailureMechanism, DecodeError> {
        Ok(match self.code(WireField::Mechanism, |c| (c <= 7).then_some(c))? {
            0 => FailureMechanism::TaskFailed,
            1 => FailureMechanism::Panicked,
            2 => FailureMechanism::EndpointFailed,
            3 => FailureMechanism::DeviceFault,
            4 => {
                let code = self.u8()? as usize;
                let budget = BUDGETS.get(code).copied().unwrap_or(TimeoutBudget::Other("remote"));
                FailureMechanism::Timeout { budget, limit: Duration::from_nanos(self.u64()?) }
            }
            5 => FailureMechanism::CapacityExhausted { what: self.str()? },
            6 => FailureMechanism::Poisoned { root: TaskId::new(self.run_id()?, self.u32()?) },
            _ => {
                let reason = self.code(WireField::CancelReason, |c| {
                    CANCEL_REASONS.get(usize::from(c)).copied()
                })?;
                FailureMechanism::Cancelled { reason }
            }
        })
    }
}

#[cfg(test)]
mod tests;
