//! `SchedError`: the crate's one error type.
//!
//! Every variant carries the values a caller needs to act on it: the run, the worker, the member
//! and argument index, the sizes. Ring and tensor-descriptor errors are wrapped, not flattened, so
//! their own detail (ring index, sizes, largest fit) survives.

use std::sync::Arc;

use simpler_ring::RingError;
use simpler_types::{
    CallableKind, RunFailure, RunId, RunState, TaskId, TensorArgType, TypesError, WorkerId,
    WorkerRef, WorkerType,
};
use thiserror::Error;

/// Everything the engine can refuse or report.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SchedError {
    // ---- Engine start (`docs/engine-protocols.md` §1) -------------------------------------------
    /// Two NEXT_LEVEL endpoints report the same stable id.
    #[error("two next-level endpoints report worker id {id}; next-level ids must be unique")]
    DuplicateWorkerId {
        /// The id reported twice.
        id: WorkerId,
    },
    /// An endpoint was registered in the list of the other worker type.
    #[error(
        "endpoint #{index} of the {listed} list reports worker type {reported}; register it in \
         the list of its own type"
    )]
    EndpointTypeMismatch {
        /// Position of the endpoint in its list.
        index: usize,
        /// The list it was passed in.
        listed: WorkerType,
        /// The type its `caps()` reports.
        reported: WorkerType,
    },
    /// The engine's level is below 3 (the engine runs host levels L3 and above).
    #[error("engine level {level} is not a host level; use 3 for L3 or 4 and above for L4+")]
    InvalidLevel {
        /// The level given.
        level: u8,
    },
    /// The task ring rejected its configuration or failed to start, or refused a scope
    /// operation for another reason than its depth.
    #[error("ring: {0}")]
    Ring(#[source] RingError),
    /// The operating system refused to start an engine thread.
    #[error("could not start engine thread {thread}: {source}")]
    ThreadSpawn {
        /// Name of the thread.
        thread: String,
        /// The operating system's refusal.
        #[source]
        source: std::io::Error,
    },

    // ---- Run lifecycle (`docs/engine-protocols.md` §2) ------------------------------------------
    /// An engine thread hit an internal error; the engine accepts no new runs.
    #[error("the engine is poisoned by an internal error and accepts no new runs; shut it down")]
    EnginePoisoned,
    /// The engine is stopping or stopped.
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// Another run is still being built on this engine (one builder at a time).
    #[error(
        "{building} is still being built; close or fail its builder before beginning another run \
         (a nested submit from inside an orchestration is not possible)"
    )]
    AnotherRunBuilding {
        /// The run whose builder is live.
        building: RunId,
    },
    /// An earlier run did not reach its fence before the admission deadline.
    #[error("admission deadline passed while waiting for {waiting_for} to finish")]
    AdmissionTimeout {
        /// The earliest run that was still not terminal.
        waiting_for: RunId,
    },
    /// The engine issued `u64::MAX` runs.
    #[error("run ids are exhausted on this engine")]
    RunIdsExhausted,
    /// The run id is unknown to this engine, or the run was already released.
    #[error("{run} is unknown to this engine or was already released")]
    UnknownRun {
        /// The id asked about.
        run: RunId,
    },
    /// The run has not reached its fence yet.
    #[error("{run} is still {phase}; wait for it before releasing it")]
    NotTerminal {
        /// The run.
        run: RunId,
        /// Its current phase.
        phase: RunState,
    },
    /// `abort_run` or `wait` was called on a run whose submission is still open: only its
    /// builder can end it.
    #[error(
        "{run} is still being built, so {op} could wait on nothing but its builder; close the \
         builder (RunBuilder::close) or fail it (RunBuilder::fail) first, or poll with \
         Engine::wait_timeout while another thread builds it"
    )]
    NotClosed {
        /// The run.
        run: RunId,
        /// The call that was refused (`"wait"`, `"abort_run"`).
        op: &'static str,
    },
    /// The run already failed; nothing more is accepted for it (fail-fast).
    #[error("the run already failed: {0}")]
    RunFailed(Arc<RunFailure>),

    // ---- Submit validation (`docs/engine-protocols.md` §3) --------------------------------------
    /// A submit named no member at all.
    #[error("a task needs at least one member; the argument list is empty")]
    EmptyArgsList,
    /// A next-level group names a different number of targets than members.
    #[error("{targets} targets for {members} members; give one target per member")]
    TargetCountMismatch {
        /// Targets given.
        targets: usize,
        /// Members given.
        members: usize,
    },
    /// Two members of one group name the same target.
    #[error("worker {worker} is the target of two members; group targets must be distinct")]
    DuplicateTarget {
        /// The repeated target.
        worker: WorkerId,
    },
    /// A target or eligible id is not a registered next-level worker.
    #[error("worker {worker} is not a registered next-level worker")]
    UnknownWorker {
        /// The id.
        worker: WorkerId,
    },
    /// The eligible-set list does not have one set per member.
    #[error("{sets} eligible sets for {members} members; give one set per member")]
    EligibleCountMismatch {
        /// Sets given.
        sets: usize,
        /// Members given.
        members: usize,
    },
    /// A member's eligible set is empty.
    #[error("the eligible set of member {member} is empty")]
    EmptyEligibleSet {
        /// The member.
        member: usize,
    },
    /// A member's target is not inside its eligible set.
    #[error("member {member} targets worker {worker}, which is not in its eligible set")]
    TargetNotEligible {
        /// The member.
        member: usize,
        /// Its target.
        worker: WorkerId,
    },
    /// A SUB group has more members than there are SUB workers; it could never be placed.
    #[error("a sub group of {size} members cannot run on a pool of {pool} sub workers")]
    GroupLargerThanPool {
        /// Members in the group.
        size: usize,
        /// SUB workers registered.
        pool: usize,
    },
    /// The callable's kind cannot run on the requested worker type at this level.
    #[error("a {kind} callable cannot run on a {worker_type} worker at this level")]
    CallableKindMismatch {
        /// The callable's kind.
        kind: CallableKind,
        /// The worker type it was submitted to.
        worker_type: WorkerType,
    },
    /// A tensor descriptor failed validation.
    #[error("member {member}, tensor {arg}: invalid descriptor: {source}")]
    InvalidTensor {
        /// The member.
        member: usize,
        /// Index of the tensor within the member.
        arg: usize,
        /// What is wrong with it.
        #[source]
        source: TypesError,
    },
    /// A write-tagged tensor has no buffer (address 0).
    #[error(
        "member {member}, tensor {arg} is tagged {tag} but has no buffer (address 0); use alloc() \
         or pass a buffer"
    )]
    OutputWithoutBuffer {
        /// The member.
        member: usize,
        /// Index of the tensor within the member.
        arg: usize,
        /// Its tag.
        tag: TensorArgType,
    },
    /// A tensor reaches into the engine's heap without being an `alloc()` buffer whose scope
    /// is open (or a view of one): based elsewhere, bigger than the buffer at its base, or
    /// naming a buffer whose scope has ended. The engine orders and holds its heap's bytes by
    /// their buffer, which it knows by base address, so such a tensor would get no edges.
    #[error(
        "member {member}, tensor {arg} names {size} bytes at {addr:#x} in the engine's heap, \
         which is not an alloc() buffer based there whose scope is open (a view of a buffer \
         keeps the buffer's address and moves its start offset)"
    )]
    NotAnAllocBuffer {
        /// The member.
        member: usize,
        /// Index of the tensor within the member.
        arg: usize,
        /// The tensor's base address.
        addr: u64,
        /// Its buffer size in bytes.
        size: u64,
    },
    /// A SUB task was given a tensor in a child's memory, which a host worker cannot address.
    #[error(
        "member {member}, tensor {arg} lives in child memory; a sub task can only use host memory"
    )]
    ChildMemoryOnSubTask {
        /// The member.
        member: usize,
        /// Index of the tensor within the member.
        arg: usize,
    },
    /// Two write-tagged tensors of one member overlap in bytes of one buffer.
    #[error(
        "member {member}: write-tagged tensors {first} and {second} overlap in the same buffer; \
         one member must not write the same bytes twice"
    )]
    OverlappingWrites {
        /// The member.
        member: usize,
        /// Index of the first tensor.
        first: usize,
        /// Index of the second tensor.
        second: usize,
    },
    /// The run has used every task sequence number (`u32::MAX` tasks and allocs).
    #[error("{run} has no task sequence numbers left")]
    TooManyTasks {
        /// The run.
        run: RunId,
    },
    /// The ring could not provide a slot or a heap slab in time.
    #[error("capacity exhausted{}: {source}", oldest_live.map(|t| format!(" (oldest live: {t})")).unwrap_or_default())]
    Capacity {
        /// The ring's report, with ring index and sizes.
        #[source]
        source: RingError,
        /// The task whose slab pins the ring's tail, when the ring named one.
        oldest_live: Option<TaskId>,
    },

    // ---- alloc() (`docs/engine-protocols.md` §3) ------------------------------------------------
    /// `alloc` was given fewer than 1 or more than 5 dimensions.
    #[error("alloc needs 1 to 5 dimensions, got {dims}")]
    InvalidShape {
        /// Dimensions given.
        dims: usize,
    },
    /// The byte size of an `alloc` shape does not fit in 64 bits.
    #[error("alloc shape {shape:?} of {element_size}-byte elements overflows 64 bits")]
    SizeOverflow {
        /// The shape.
        shape: Vec<u32>,
        /// Bytes per element.
        element_size: u64,
    },

    // ---- Scopes (`docs/engine-protocols.md` §2) -------------------------------------------------
    /// `scope_begin` beyond the maximum depth (the run's outer frame counts).
    #[error("scope depth limit {max} reached (the run's own frame counts as one)")]
    ScopeDepthExceeded {
        /// The limit.
        max: usize,
    },
    /// `scope_end` with no user scope open.
    #[error("scope_end without a matching scope_begin")]
    ScopeUnderflow,

    // ---- Endpoints and control jobs (`docs/engine-protocols.md` §7, §8) -------------------------
    /// No endpoint is registered under this worker reference.
    #[error("no endpoint is registered as {worker}")]
    UnknownEndpoint {
        /// The reference asked for.
        worker: WorkerRef,
    },
    /// The endpoint thread stopped before it ran the control job.
    #[error("{worker} stopped before running the control job")]
    WorkerStopped {
        /// The worker.
        worker: WorkerRef,
    },
    /// A control job panicked on its endpoint thread (the thread keeps serving).
    #[error("control job on {worker} panicked: {message}")]
    JobPanicked {
        /// The worker.
        worker: WorkerRef,
        /// The panic payload, when it was a string.
        message: String,
    },
    /// Shutdown aborted a run that had not reached its fence by the deadline.
    #[error("{run} was aborted by shutdown before it finished")]
    AbortedAtShutdown {
        /// The run.
        run: RunId,
    },
    /// An engine invariant broke (a bug in the engine, reported instead of panicking).
    #[error("internal engine error: {message}")]
    Internal {
        /// What broke.
        message: String,
    },
    /// An engine thread panicked outside any task (found when it was joined).
    #[error("engine thread {thread} panicked: {message}")]
    ThreadPanicked {
        /// Name of the thread.
        thread: String,
        /// The panic payload, when it was a string.
        message: String,
    },
}

impl SchedError {
    /// Translates a ring error from a slot or slab allocation into the engine's vocabulary:
    /// shutdown becomes [`SchedError::ShuttingDown`], everything else [`SchedError::Capacity`].
    pub(crate) fn from_alloc(err: RingError, oldest_live: Option<TaskId>) -> SchedError {
        match err {
            RingError::Shutdown => SchedError::ShuttingDown,
            other => SchedError::Capacity { source: other, oldest_live },
        }
    }
}

/// What [`Engine::shutdown`](crate::Engine::shutdown) met on the way (the engine is stopped
/// anyway): runs it had to abort, threads that panicked. Each error is kept as it was.
#[derive(Debug)]
pub struct ShutdownError {
    /// In the order they occurred.
    pub errors: Vec<SchedError>,
}

impl std::fmt::Display for ShutdownError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the engine stopped, but shutdown met {} problem(s)", self.errors.len())?;
        for (i, e) in self.errors.iter().enumerate() {
            write!(f, "{} {e}", if i == 0 { ":" } else { ";" })?;
        }
        Ok(())
    }
}

impl std::error::Error for ShutdownError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.errors.first().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl IntoIterator for ShutdownError {
    type Item = SchedError;
    type IntoIter = std::vec::IntoIter<SchedError>;

    fn into_iter(self) -> Self::IntoIter {
        self.errors.into_iter()
    }
}
