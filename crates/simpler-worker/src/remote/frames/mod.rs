//! The messages between rank 0 and a serving rank, encoded field by field in little-endian
//! (`docs/multi-host.md` §"Frames"). Never a struct image or a raw pointer: a frame means the
//! same on every host.
//!
//! Every frame starts with the protocol version (`u16`) and a kind byte; a frame of another
//! version, an unknown kind, a short body or trailing bytes is a [`DecodeError`].

use std::path::PathBuf;
use std::time::Duration;

use simpler_types::{
    CallConfig, CallableId, CallableKind, CallableNamespace, CancelReason, FailureMechanism,
    MAX_TENSOR_DIMS, RingOverride, RingSel, RunId, TaskFailure, TaskId, Tensor, TensorArgType,
    TimeoutBudget, WorkerId, WorkerRef, WorkerType,
};

use super::error::{RemoteRunFailure, RemoteRunKind};

/// Version of the frame layout; both ends must agree.
pub(crate) const VERSION: u16 = 6;

/// Error frames longer than this are cut (innermost message first), so one failure can never
/// grow a completion without bound.
pub(crate) const MAX_ERROR_BYTES: usize = 64 * 1024;

/// The most levels of a failure chain a completion carries (the outermost ones; a real chain
/// has one per worker level). Decoding refuses more, so a hostile frame can neither reserve
/// memory by its count nor nest `Arc`s deep enough to overflow the stack when dropped.
pub(crate) const MAX_CHAIN_LEVELS: usize = 32;

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
    /// Health answer (on the health communicator).
    Pong { nonce: u64 },
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
    Left { session: u64, reason: String },
}

/// A frame that could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed frame: {0}")]
pub struct DecodeError(pub(crate) String);

mod kind {
    pub(super) const HELLO: u8 = 1;
    pub(super) const MANIFEST: u8 = 2;
    pub(super) const ACCEPT: u8 = 3;
    pub(super) const REFUSE: u8 = 4;
    pub(super) const TASK: u8 = 5;
    pub(super) const COMPLETION: u8 = 6;
    pub(super) const SHUTDOWN: u8 = 7;
    pub(super) const SHUTDOWN_DONE: u8 = 8;
    pub(super) const PING: u8 = 9;
    pub(super) const PONG: u8 = 10;
    pub(super) const PREPARE: u8 = 11;
    pub(super) const PREPARED: u8 = 12;
    pub(super) const COMMIT: u8 = 13;
    pub(super) const ABORT: u8 = 14;
    pub(super) const LEFT: u8 = 15;
}

impl Packet {
    /// Encodes the frame.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(64));
        w.u16(VERSION);
        match self {
            Packet::Hello { session } => {
                w.u8(kind::HELLO);
                w.u64(*session);
            }
            Packet::Manifest { session, host, entries, start_error } => {
                w.u8(kind::MANIFEST);
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
            Packet::Accept => w.u8(kind::ACCEPT),
            Packet::Refuse { session, reason } => {
                w.u8(kind::REFUSE);
                w.opt_u64(*session);
                w.str(reason);
            }
            Packet::Left { session, reason } => {
                w.u8(kind::LEFT);
                w.u64(*session);
                w.str(truncate(reason, MAX_ERROR_BYTES));
            }
            Packet::Task { seq, graph, config, args } => {
                w.u8(kind::TASK);
                w.u64(*seq);
                w.u32(*graph);
                w.config(config);
                w.args(args);
            }
            Packet::Completion { seq, outcome } => {
                w.u8(kind::COMPLETION);
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
            Packet::Shutdown => w.u8(kind::SHUTDOWN),
            Packet::ShutdownDone { errors } => {
                w.u8(kind::SHUTDOWN_DONE);
                w.u32(errors.len() as u32);
                for e in errors {
                    w.str(truncate(e, MAX_ERROR_BYTES));
                }
            }
            Packet::Ping { nonce } => {
                w.u8(kind::PING);
                w.u64(*nonce);
            }
            Packet::Pong { nonce } => {
                w.u8(kind::PONG);
                w.u64(*nonce);
            }
            Packet::Prepare { seq, ordinal, name } => {
                w.u8(kind::PREPARE);
                w.u64(*seq);
                w.u32(*ordinal);
                w.str(name);
            }
            Packet::Prepared { seq, refusal } => {
                w.u8(kind::PREPARED);
                w.u64(*seq);
                w.opt_str(refusal.as_deref().map(|r| truncate(r, MAX_ERROR_BYTES)));
            }
            Packet::Commit { ordinal } => {
                w.u8(kind::COMMIT);
                w.u32(*ordinal);
            }
            Packet::Abort { ordinal } => {
                w.u8(kind::ABORT);
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
            return Err(DecodeError(format!("version {version}, expected {VERSION}")));
        }
        let p = match r.u8()? {
            kind::HELLO => Packet::Hello { session: r.u64()? },
            kind::MANIFEST => {
                let session = r.u64()?;
                let host = r.str()?;
                let n = r.count(33)?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    let kind = callable_kind(r.u8()?)?;
                    let name = r.str()?;
                    let digest = r.array::<32>()?;
                    entries.push(ManifestEntry { kind, name, digest });
                }
                let start_error = r.opt_str()?;
                Packet::Manifest { session, host, entries, start_error }
            }
            kind::ACCEPT => Packet::Accept,
            kind::REFUSE => Packet::Refuse { session: r.opt_u64()?, reason: r.str()? },
            kind::LEFT => Packet::Left { session: r.u64()?, reason: r.str()? },
            kind::TASK => Packet::Task {
                seq: r.u64()?,
                graph: r.u32()?,
                config: r.config()?,
                args: r.args()?,
            },
            kind::COMPLETION => {
                let seq = r.u64()?;
                let outcome = match r.u8()? {
                    0 => {
                        let n = r.count(16)?;
                        let mut written = Vec::with_capacity(n);
                        for _ in 0..n {
                            let buffer = r.u32()?;
                            let offset = r.u64()?;
                            written.push(WrittenSpan { buffer, offset, bytes: r.blob()?.to_vec() });
                        }
                        Outcome::Ok { written }
                    }
                    1 => {
                        let n = r.count(MIN_CHAIN_LEVEL_BYTES)?;
                        if n > MAX_CHAIN_LEVELS {
                            return Err(DecodeError(format!("a failure chain of {n} levels")));
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
                        let failure =
                            failure.ok_or_else(|| DecodeError("empty failure chain".to_owned()))?;
                        Outcome::TaskFailed { failure }
                    }
                    2 => Outcome::RunFailed { level: r.u8()?, failure: r.run_failure()? },
                    other => return Err(DecodeError(format!("outcome {other}"))),
                };
                Packet::Completion { seq, outcome }
            }
            kind::SHUTDOWN => Packet::Shutdown,
            kind::SHUTDOWN_DONE => {
                let n = r.count(4)?;
                let mut errors = Vec::with_capacity(n);
                for _ in 0..n {
                    errors.push(r.str()?);
                }
                Packet::ShutdownDone { errors }
            }
            kind::PING => Packet::Ping { nonce: r.u64()? },
            kind::PONG => Packet::Pong { nonce: r.u64()? },
            kind::PREPARE => Packet::Prepare { seq: r.u64()?, ordinal: r.u32()?, name: r.str()? },
            kind::PREPARED => Packet::Prepared { seq: r.u64()?, refusal: r.opt_str()? },
            kind::COMMIT => Packet::Commit { ordinal: r.u32()? },
            kind::ABORT => Packet::Abort { ordinal: r.u32()? },
            other => return Err(DecodeError(format!("unknown kind {other}"))),
        };
        if r.at != bytes.len() {
            return Err(DecodeError(format!("{} trailing bytes", bytes.len() - r.at)));
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

fn callable_kind(v: u8) -> Result<CallableKind, DecodeError> {
    Ok(match v {
        1 => CallableKind::Chip,
        2 => CallableKind::Host,
        3 => CallableKind::Graph,
        other => return Err(DecodeError(format!("callable kind {other}"))),
    })
}

/// A remote run failure's kind from its wire code (its discriminant).
fn run_kind(v: u8) -> Result<RemoteRunKind, DecodeError> {
    Ok(match v {
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
        other => return Err(DecodeError(format!("run failure kind {other}"))),
    })
}

/// The bytes of one tensor entry of [`WireArgs`] (descriptor, tag, buffer flag) at least.
const WIRE_TENSOR_MIN: usize = 4 * 8 + 2 * 4 + 4 + 2 * MAX_TENSOR_DIMS * 4 + 8 + 2;

fn tag(v: u8) -> Result<TensorArgType, DecodeError> {
    Ok(match v {
        0 => TensorArgType::Input,
        1 => TensorArgType::Output,
        2 => TensorArgType::InOut,
        3 => TensorArgType::OutputExisting,
        4 => TensorArgType::NoDep,
        other => return Err(DecodeError(format!("tensor tag {other}"))),
    })
}

fn namespace(v: u8) -> Result<CallableNamespace, DecodeError> {
    Ok(match v {
        1 => CallableNamespace::LocalChip,
        2 => CallableNamespace::LocalHost,
        3 => CallableNamespace::Remote,
        other => return Err(DecodeError(format!("callable namespace {other}"))),
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
            RemoteRunFailure::Arguments { reason } => {
                self.u8(1);
                self.str(truncate(reason, MAX_ERROR_BYTES));
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
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| {
            DecodeError(format!("truncated: {n} bytes wanted at offset {}", self.at))
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
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item) > self.bytes.len() - self.at {
            return Err(DecodeError(format!("count {n} exceeds the frame")));
        }
        Ok(n)
    }
    fn blob(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn str(&mut self) -> Result<String, DecodeError> {
        let b = self.blob()?;
        String::from_utf8(b.to_vec()).map_err(|e| DecodeError(format!("text: {e}")))
    }
    fn flag(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError(format!("flag {other}"))),
        }
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
        let v = self.u64()?;
        RunId::from_raw(v).ok_or_else(|| DecodeError("run id 0".to_owned()))
    }

    fn args(&mut self) -> Result<WireArgs, DecodeError> {
        let n = self.count(WIRE_TENSOR_MIN)?;
        let mut tensors = Vec::with_capacity(n);
        for _ in 0..n {
            let tensor = self.tensor()?;
            let tag = tag(self.u8()?)?;
            tensors.push(WireTensor { tensor, tag, buffer: self.opt_u32()? });
        }
        let n = self.count(8)?;
        let mut scalars = Vec::with_capacity(n);
        for _ in 0..n {
            scalars.push(self.u64()?);
        }
        let n = self.count(9)?;
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
        // Every field below is overwritten; the reserved bytes stay zero.
        let mut t = Tensor::external(0, &[1], simpler_types::DataType::UInt8)
            .map_err(|e| DecodeError(format!("tensor: {e}")))?;
        t.addr = self.u64()?;
        t.size = self.u64()?;
        t.owner_task_id = self.u64()?;
        t.start_offset = self.u64()?;
        t.version = self.u32()? as i32;
        t.ndims = self.u32()?;
        t.dtype = self.u8()?;
        t.manual_dep = self.u8()?;
        t.is_contiguous = self.u8()?;
        t.child_memory = self.u8()?;
        for s in &mut t.shapes {
            *s = self.u32()?;
        }
        t.extent_elems = self.u64()?;
        for s in &mut t.strides {
            *s = self.u32()?;
        }
        Ok(t)
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
        b.build().map_err(|e| DecodeError(format!("call config: {e}")))
    }

    fn failure(&mut self) -> Result<TaskFailure, DecodeError> {
        let task = TaskId::new(self.run_id()?, self.u32()?);
        let digest = self.array::<32>()?;
        let kind = callable_kind(self.u8()?)?;
        let ns = namespace(self.u8()?)?;
        let callable = CallableId::new(digest, kind, ns);
        let worker = if self.flag()? {
            let ty = match self.u8()? {
                0 => WorkerType::NextLevel,
                1 => WorkerType::Sub,
                other => return Err(DecodeError(format!("worker type {other}"))),
            };
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
            // Device code names are static strings on the sending side; the receiving side
            // keeps the code and says the name came from a remote rank.
            let _name = self.str()?;
            f.device_code = Some(simpler_types::DeviceCode::new(code, "remote device code"));
        }
        Ok(f)
    }

    fn run_failure(&mut self) -> Result<RemoteRunFailure, DecodeError> {
        Ok(match self.u8()? {
            0 => RemoteRunFailure::UnknownOrdinal { ordinal: self.u32()? },
            1 => RemoteRunFailure::Arguments { reason: self.str()? },
            2 => RemoteRunFailure::ReplyTooLarge { bytes: self.u64()?, limit: self.u64()? },
            3 => {
                let kind = run_kind(self.u8()?)?;
                RemoteRunFailure::Run { kind, message: self.str()? }
            }
            other => return Err(DecodeError(format!("run failure {other}"))),
        })
    }

    fn mechanism(&mut self) -> Result<FailureMechanism, DecodeError> {
        Ok(match self.u8()? {
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
            7 => {
                let code = self.u8()? as usize;
                let reason = CANCEL_REASONS
                    .get(code)
                    .copied()
                    .ok_or_else(|| DecodeError(format!("cancel reason {code}")))?;
                FailureMechanism::Cancelled { reason }
            }
            other => return Err(DecodeError(format!("failure mechanism {other}"))),
        })
    }
}

#[cfg(test)]
mod tests;
