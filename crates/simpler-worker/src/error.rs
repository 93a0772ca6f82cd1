//! Errors of the worker layer: [`WorkerError`], [`RunError`] with its [`Frame`]s, [`StartError`],
//! [`CloseError`] and [`MemError`] (frames: `docs/worker-protocols.md` §9).
//!
//! Every error names the facts a user needs to act on: the run, the task, the worker path, the
//! device code and its name. Error chains across levels are kept structured as frames,
//! outermost first, and only rendered to text by `Display`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use simpler_device_a2a3::DeviceError;
use simpler_sched::{BusyEndpoint, SchedError};
use simpler_types::{
    CallableKind, DeviceCode, FailureMechanism, FailureSource, RunFailure, RunId, TaskFailure,
    TaskId, WorkerId, WorkerRef,
};

use crate::process::ChildError;

mod calls;
mod cleanup;
mod config;
mod teardown;

pub use calls::{BufferName, LaneFault, MemError, WorkerError};
pub use cleanup::{CleanupError, CleanupFault};
pub use config::ConfigError;
pub(crate) use teardown::Residue;
pub use teardown::{Leak, Leaked, TeardownCause, TeardownError, TeardownPart};

/// A boxed error returned by user callbacks and closures.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why the graph of a run could not be built (carried by [`WorkerError::Build`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildFailure {
    /// The orchestration callback returned an error.
    Callback(BoxError),
    /// The orchestration callback panicked; the payload's text.
    Panicked(String),
    /// The engine rejected the submission (including the fail-fast re-raise of an earlier task
    /// failure of the same run).
    Engine(SchedError),
    /// A chip refused to prepare the run (L2: validation, bind, stage, upload).
    Device(Box<DeviceError>),
}

impl fmt::Display for BuildFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildFailure::Callback(e) => write!(f, "orchestration returned an error: {e}"),
            BuildFailure::Panicked(p) => write!(f, "orchestration panicked: {p}"),
            BuildFailure::Engine(e) => {
                write!(f, "engine rejected the submission: {}", InWorkerTerms(e))
            }
            BuildFailure::Device(e) => write!(f, "chip refused to prepare the run: {e}"),
        }
    }
}

impl std::error::Error for BuildFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildFailure::Callback(e) => Some(e.as_ref()),
            BuildFailure::Panicked(_) => None,
            // The message already gives a capacity error's facts with the worker's advice; as a
            // source it would repeat them with the ring crate's advice, which names settings a
            // worker's user does not have. The typed value stays this variant's field.
            BuildFailure::Engine(SchedError::Capacity { .. }) => None,
            BuildFailure::Engine(e) => Some(e),
            // The device error itself, not its box, so that a chain walk finds it.
            BuildFailure::Device(e) => Some(e.as_ref()),
        }
    }
}

/// An engine error in the words of the worker's API. The engine names a capacity limit by the
/// ring setting its own users set (`heap_bytes_per_ring`, `max_live_slots`); a worker's user
/// sets the worker builder's instead, so the worker keeps the ring's facts and replaces its
/// advice. The error itself stays the engine's typed value.
struct InWorkerTerms<'a>(&'a SchedError);

impl fmt::Display for InWorkerTerms<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let SchedError::Capacity { source, oldest_live } = self.0 else {
            return fmt::Display::fmt(self.0, f);
        };
        f.write_str("capacity exhausted")?;
        if let Some(t) = oldest_live {
            write!(f, " (oldest live: {t})")?;
        }
        write!(f, ": {}", source.facts())?;
        match worker_advice(source) {
            Some(advice) => write!(f, "; {advice}"),
            None => Ok(()),
        }
    }
}

/// The worker builder setting (or the graph habit) that avoids a ring capacity error.
fn worker_advice(e: &simpler_ring::RingError) -> Option<&'static str> {
    use simpler_ring::RingError;
    match e {
        RingError::HeapDisabled { .. } => Some("set the worker builder's heap_ring_size above 0"),
        RingError::RequestTooLarge { .. } => Some("raise the worker builder's heap_ring_size"),
        RingError::HeapExhausted(_) => Some(
            "raise the worker builder's heap_ring_size or alloc_timeout, or use a scope \
             (GraphBuilder::scope) that keeps less alive",
        ),
        RingError::TaskWindowExhausted { .. } => Some(
            "a worker's task window has no size setting; keep fewer tasks alive at once: end \
             scopes (GraphBuilder::scope) so that their tasks retire, or split the graph into \
             several runs",
        ),
        _ => None,
    }
}

/// Why a chip failed to prepare or to remove a chip callable (carried by
/// [`WorkerError::Registration`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationFailure {
    /// The chip's device refused, in this process or in the chip's own.
    // Not transparent: the error itself, not only its own source, is next in a source chain,
    // so code that walks the chain for a `DeviceError` or a `ChildError` finds it.
    #[error("{0}")]
    Device(#[from] DeviceError),
    /// The chip's process failed (PROCESS mode): it died, stopped answering or broke the
    /// protocol, the chip is unusable since it did, or its device failed in a way that has no
    /// [`DeviceError`] here (`ChildError::Device`).
    #[error("{0}")]
    Child(#[from] ChildError),
}

impl RegistrationFailure {
    /// The device's or the process's error itself: what a source chain names after the error
    /// that carries this one (this wrapper only says which of the two it is).
    pub(crate) fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        match self {
            RegistrationFailure::Device(e) => e,
            RegistrationFailure::Child(e) => e,
        }
    }

    /// The device's error, when the device refused.
    pub fn device_error(&self) -> Option<&DeviceError> {
        match self {
            RegistrationFailure::Device(e) => Some(e),
            RegistrationFailure::Child(_) => None,
        }
    }

    /// The failure of the chip's process (PROCESS mode).
    pub fn child_error(&self) -> Option<&ChildError> {
        match self {
            RegistrationFailure::Child(e) => Some(e),
            RegistrationFailure::Device(_) => None,
        }
    }

    /// The device's code, when one exists.
    pub fn device_code(&self) -> Option<DeviceCode> {
        match self {
            RegistrationFailure::Device(e) => e.device_code(),
            RegistrationFailure::Child(e) => e.device_code(),
        }
    }
}

fn rollback_note(failed: &[WorkerId]) -> String {
    if failed.is_empty() {
        String::new()
    } else {
        let ids: Vec<String> = failed.iter().map(ToString::to_string).collect();
        format!(" (rollback failed on chip(s) {}; marked unusable)", ids.join(", "))
    }
}

/// What a [`RunError`] is, by mechanism.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunErrorKind {
    /// A task's callable reported an error or panicked.
    TaskFailed,
    /// The path to a callable failed.
    EndpointFailed,
    /// A device reported a fault.
    DeviceFault {
        /// The device's code, when one exists.
        code: Option<DeviceCode>,
    },
    /// A timeout fired.
    Timeout {
        /// Which budget, as text.
        budget: String,
        /// Its value.
        value: Duration,
    },
    /// A capacity ran out.
    Capacity {
        /// What ran out and its size.
        what: String,
    },
    /// The submission failed (its `Build` error went to `submit`).
    SubmissionFailed,
    /// The run was aborted (shutdown).
    Aborted,
    /// A cleanup step failed.
    CleanupFailed {
        /// The step.
        step: &'static str,
    },
    /// The thread doing the cleanup unwound before it finished.
    CleanupInterrupted,
    /// `RunHandle::wait` was called, before the run ended, from a thread acting for the run's
    /// own worker (its callback, a closure or a child run), which the run may be waiting for:
    /// refused instead of waiting forever. The run itself goes on.
    Reentrant,
    /// An engine invariant broke.
    Internal,
}

/// One level of an error chain (`docs/worker-protocols.md` §9).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The host level (2 for a chip worker).
    pub level: u8,
    /// The run at that level.
    pub run: RunId,
    /// The task, if the failure belongs to one.
    pub task: Option<TaskId>,
    /// The callable's name, if known.
    pub callable: Option<String>,
    /// The callable's kind, if known.
    pub kind: Option<CallableKind>,
    /// Where the task ran.
    pub worker: Option<WorkerRef>,
    /// Group member.
    pub member: Option<u32>,
    /// How it failed.
    pub mechanism: Option<FailureMechanism>,
    /// The device's code.
    pub device_code: Option<DeviceCode>,
    /// The message of this level.
    pub message: String,
    /// The typed error the failing layer reported at this level (read with
    /// [`Frame::device_error`]).
    pub(crate) source: Option<FailureSource>,
}

impl Frame {
    /// The device error this frame's failure came from, when a chip reported one: match on it
    /// for the device code, a stall's details or the device run id.
    pub fn device_error(&self) -> Option<&DeviceError> {
        self.source.as_ref().and_then(FailureSource::downcast_ref::<DeviceError>)
    }

    /// The worker error reported at this level, when it was one: a child's run that could not
    /// be built (its orchestration failed, the child's engine refused it; match on it for the
    /// child's [`BuildFailure`], a callback's own error included), a child's run that failed
    /// (its [`RunError`], with its kind, cleanup errors and what it suppressed), or a host
    /// closure that returned a [`WorkerError`].
    pub fn worker_error(&self) -> Option<&WorkerError> {
        self.source.as_ref().and_then(FailureSource::downcast_ref::<WorkerError>)
    }

    /// The typed error the failing layer reported at this level, whatever its type (a host
    /// closure's own error, a device error, a child worker's): downcast it to match on it.
    pub fn error(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.source.as_ref().map(FailureSource::get)
    }

    /// The transport error this frame's failure came from, when the task ran on a remote
    /// rank: match on it for the rank, host, remote level, run and task.
    #[cfg(feature = "mpi")]
    pub fn remote_error(&self) -> Option<&crate::remote::RemoteError> {
        self.source.as_ref().and_then(FailureSource::downcast_ref::<crate::remote::RemoteError>)
    }
}

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One format for task references everywhere: `run#3/task#0`.
        match self.task {
            Some(t) => write!(f, "L{} {t}", self.level)?,
            None => write!(f, "L{} {}", self.level, self.run)?,
        }
        match (&self.kind, &self.callable) {
            (Some(k), Some(n)) => write!(f, " ({k} '{n}')")?,
            (None, Some(n)) => write!(f, " ('{n}')")?,
            _ => {}
        }
        if let Some(w) = self.worker {
            match w.ty {
                simpler_types::WorkerType::Sub => write!(f, " on sub {}", w.id)?,
                simpler_types::WorkerType::NextLevel if self.level >= 4 => {
                    write!(f, " on child {}", w.id)?;
                }
                simpler_types::WorkerType::NextLevel => write!(f, " on chip {}", w.id)?,
            }
        }
        if let Some(m) = self.member {
            write!(f, " member {m}")?;
        }
        if let Some(c) = self.device_code {
            write!(f, " [{c}]")?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

#[derive(Debug)]
struct RunErrorInner {
    run: RunId,
    kind: RunErrorKind,
    frames: Vec<Frame>,
    suppressed: Vec<CleanupError>,
    failure: Option<Arc<RunFailure>>,
}

/// The failure of one run: one `Arc`, cheap to clone; every waiter gets a clone of the same
/// value ([`RunError::ptr_eq`]).
#[derive(Clone, Debug)]
pub struct RunError(Arc<RunErrorInner>);

impl RunError {
    pub(crate) fn new(
        run: RunId,
        kind: RunErrorKind,
        frames: Vec<Frame>,
        suppressed: Vec<CleanupError>,
        failure: Option<Arc<RunFailure>>,
    ) -> RunError {
        RunError(Arc::new(RunErrorInner { run, kind, frames, suppressed, failure }))
    }

    /// The run.
    pub fn run_id(&self) -> RunId {
        self.0.run
    }

    /// What the error is.
    pub fn kind(&self) -> &RunErrorKind {
        &self.0.kind
    }

    /// The chain, outermost level first.
    pub fn frames(&self) -> &[Frame] {
        &self.0.frames
    }

    /// The innermost device error of the chain, if a chip reported one (see
    /// [`Frame::device_error`]).
    pub fn device_error(&self) -> Option<&DeviceError> {
        self.0.frames.iter().rev().find_map(Frame::device_error)
    }

    /// The innermost device code of the chain, if any.
    pub fn device_code(&self) -> Option<DeviceCode> {
        self.0.frames.iter().rev().find_map(|f| f.device_code)
    }

    /// Later errors (cleanup) that lost to the run's first error.
    pub fn suppressed(&self) -> &[CleanupError] {
        &self.0.suppressed
    }

    /// The engine's record of the failure, when the engine produced it.
    pub fn run_failure(&self) -> Option<&Arc<RunFailure>> {
        self.0.failure.as_ref()
    }

    /// Whether both values are the same published result.
    pub fn ptr_eq(&self, other: &RunError) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.frames.is_empty() {
            return write!(f, "{}: {:?}", self.0.run, self.0.kind);
        }
        for (i, frame) in self.0.frames.iter().enumerate() {
            if i > 0 {
                f.write_str(": ")?;
            }
            write!(f, "{frame}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RunError {
    /// The typed error of the innermost level that reported one (a device error, a host
    /// closure's own error), so that a caller walking the chain finds it as it finds a build
    /// failure's.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let innermost = self.0.frames.iter().rev().find_map(Frame::error)?;
        Some(innermost)
    }
}

/// Which step of starting a worker failed. Its [`source`](std::error::Error::source) is the
/// typed error behind it, where there is one.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StartCause {
    /// The builder's configuration is invalid: what, with the values found.
    Config(ConfigError),
    /// A registered callable has no eligible pool.
    NoEligibleTarget {
        /// The callable's name.
        callable: String,
        /// What it needs.
        needs: &'static str,
    },
    /// A child worker failed to start (its own error is in `child`).
    ChildFailed {
        /// Why the child failed (the path to it is the [`StartError`]'s).
        child: Box<StartCause>,
    },
    /// The startup deadline passed with parts still starting.
    DeadlineExceeded {
        /// What was still pending.
        pending: Vec<String>,
        /// The budget.
        budget: Duration,
    },
    /// A chip failed to attach or to prepare a callable.
    Device {
        /// The chip.
        chip: WorkerId,
        /// The device's code and name, when one exists.
        code: Option<DeviceCode>,
        /// The device's message.
        message: String,
        /// The device's error (a chip in this process) or the chip process's failure (PROCESS
        /// mode), when one exists; a chip process's own refusal crosses as code and message.
        error: Option<Arc<RegistrationFailure>>,
    },
    /// The engine could not start (the source).
    Engine(Arc<SchedError>),
    /// The builder's `heap_ring_size` is not a multiple of the heap alignment.
    HeapRingSize {
        /// The size given.
        value: u64,
        /// The alignment it must be a multiple of.
        align: u64,
    },
    /// The system refused to start one of the worker's threads.
    ThreadSpawn {
        /// Which thread.
        thread: &'static str,
        /// The system's refusal (the source).
        source: Arc<std::io::Error>,
    },
    /// A remote L3 child (another MPI rank) failed its start handshake.
    #[cfg(feature = "mpi")]
    Remote(crate::remote::RemoteError),
}

impl fmt::Display for StartCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartCause::Config(m) => write!(f, "invalid configuration: {m}"),
            StartCause::NoEligibleTarget { callable, needs } => {
                write!(f, "callable '{callable}' has no eligible target: it needs {needs}")
            }
            StartCause::ChildFailed { child } => write!(f, "child failed to start: {child}"),
            StartCause::DeadlineExceeded { pending, budget } => write!(
                f,
                "startup deadline of {budget:?} exceeded; still pending: {}",
                pending.join(", ")
            ),
            StartCause::Device { chip, code, message, .. } => {
                write!(f, "chip {chip} failed")?;
                if let Some(c) = code {
                    write!(f, " with {c}")?;
                }
                write!(f, ": {message}")
            }
            StartCause::Engine(e) => write!(f, "engine failed to start: {e}"),
            StartCause::HeapRingSize { value, align } => write!(
                f,
                "engine failed to start: heap_ring_size = {value} is not a multiple of {align} bytes"
            ),
            StartCause::ThreadSpawn { thread, source } => {
                write!(f, "cannot spawn {thread}: {source}")
            }
            #[cfg(feature = "mpi")]
            StartCause::Remote(e) => write!(f, "remote child failed to start: {e}"),
        }
    }
}

impl std::error::Error for StartCause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartCause::Device { error: Some(e), .. } => Some(e.as_error()),
            // The child's cause is in this one's text already: its own source is next.
            StartCause::ChildFailed { child } => child.source(),
            StartCause::Engine(e) => Some(&**e),
            StartCause::ThreadSpawn { source, .. } => Some(&**source),
            #[cfg(feature = "mpi")]
            StartCause::Remote(e) => Some(e),
            _ => None,
        }
    }
}

/// A failed start. Everything started before the failure was already rolled back. Its source
/// is its cause's (the cause itself is part of its message).
#[derive(Debug, Clone)]
pub struct StartError {
    /// Why.
    pub cause: StartCause,
    /// Path to the failing part, e.g. `L4 / child 1 (L3) / chip 0 (device 5)`.
    pub path: String,
    /// Errors met while rolling back.
    pub rollback: Vec<TeardownError>,
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "starting {} failed: {}{}", self.path, self.cause, rollback_text(&self.rollback))
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.cause)
    }
}

fn rollback_text(r: &[TeardownError]) -> String {
    if r.is_empty() {
        String::new()
    } else {
        let t: Vec<String> = r.iter().map(ToString::to_string).collect();
        format!("; rollback: {}", t.join("; "))
    }
}

/// A drain that ran out of budget; nothing was torn down and a later close may retry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainTimeout {
    /// Operations (submits, registrations, memory calls) still in flight.
    pub in_flight_ops: usize,
    /// Accepted runs not yet published.
    pub pending_runs: usize,
    /// The first of them (at most 16), oldest first.
    pub pending: Vec<RunId>,
    /// The endpoints running a task when the budget ran out (none for an L2 worker, whose runs
    /// are bounded by the device's budgets).
    pub busy: Vec<BusyEndpoint>,
    /// The budget that ran out.
    pub budget: Duration,
}

impl fmt::Display for DrainTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drain timed out after {:?} ({} operation(s) in flight, {} run(s) pending",
            self.budget, self.in_flight_ops, self.pending_runs
        )?;
        if !self.pending.is_empty() {
            let runs: Vec<String> = self.pending.iter().map(ToString::to_string).collect();
            write!(f, ": {}", runs.join(", "))?;
            if self.pending.len() < self.pending_runs {
                f.write_str(", …")?;
            }
        }
        f.write_str(")")?;
        if !self.busy.is_empty() {
            let busy: Vec<String> = self.busy.iter().map(ToString::to_string).collect();
            write!(f, "; busy: {}", busy.join("; "))?;
        }
        Ok(())
    }
}

/// What `close` found. `Clone`: concurrent closes share one value.
#[derive(Debug, Clone, Default, thiserror::Error)]
#[error("{}", self.describe())]
#[non_exhaustive]
pub struct CloseError {
    /// Failures of runs whose handles nobody waited on: the first 64 of them.
    pub unobserved_runs: Vec<RunError>,
    /// How many further unobserved failed runs there were beyond `unobserved_runs` (kept as a
    /// count only, so that a long-lived worker's bookkeeping stays bounded).
    pub unobserved_runs_not_kept: u64,
    /// Errors of the teardown itself.
    pub teardown: Vec<TeardownError>,
    /// Set when the drain ran out of budget.
    pub drain_timeout: Option<Box<DrainTimeout>>,
    /// What the teardown could not release (stuck device threads, remote workers that did not
    /// confirm their shutdown), each with where it is.
    pub leaked: Vec<Leak>,
    /// The call was made from inside one of the worker's own callbacks.
    pub reentrant: bool,
}

impl CloseError {
    /// Whether a later close may succeed (a drain timeout).
    pub fn is_retryable(&self) -> bool {
        self.drain_timeout.is_some()
    }

    /// Whether the worker itself closed cleanly (nothing went wrong in the drain or the
    /// teardown, nothing leaked) and the error only reports runs that failed without anyone
    /// waiting for them.
    ///
    /// ```
    /// # use simpler_worker::{Worker, Orchestration};
    /// # use simpler_device_a2a3::{Platform, RuntimeVariant};
    /// # let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(1);
    /// # let bad = b.register_host("bad", |_| Err("unseen".into()));
    /// # let worker = b.start()?;
    /// # drop(worker.submit(Orchestration::graph(move |g, _, _| { g.submit_sub(bad, Default::default())?; Ok(()) }))?);
    /// match worker.close() {
    ///     Ok(()) => {}
    ///     Err(e) if e.worker_closed_cleanly() => eprintln!("closed; earlier runs failed: {e}"),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn worker_closed_cleanly(&self) -> bool {
        self.teardown.is_empty()
            && self.drain_timeout.is_none()
            && self.leaked.is_empty()
            && !self.reentrant
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.unobserved_runs.is_empty()
            && self.unobserved_runs_not_kept == 0
            && self.teardown.is_empty()
            && self.drain_timeout.is_none()
            && self.leaked.is_empty()
            && !self.reentrant
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.reentrant {
            parts.push("close called from inside a callback of the same worker".to_owned());
        }
        if let Some(d) = &self.drain_timeout {
            parts.push(d.to_string());
        }
        if !self.unobserved_runs.is_empty() {
            let runs: Vec<String> = self.unobserved_runs.iter().map(|r| format!("{r}")).collect();
            let lead =
                if self.worker_closed_cleanly() { "the worker closed cleanly, but " } else { "" };
            parts.push(format!(
                "{lead}{} run(s) failed that nobody waited for: {}",
                runs.len(),
                runs.join("; ")
            ));
        }
        if self.unobserved_runs_not_kept > 0 {
            parts.push(format!("{} more unobserved failed run(s)", self.unobserved_runs_not_kept));
        }
        for t in &self.teardown {
            parts.push(format!("teardown: {t}"));
        }
        for l in &self.leaked {
            parts.push(format!("leaked: {l}"));
        }
        parts.join("; ")
    }
}

/// Frames of a task-failure chain as seen from `level`: the first frame belongs to `level`,
/// each cause one level lower.
pub(crate) fn frames_of_task(
    level: u8,
    failure: &TaskFailure,
    name_of: &dyn Fn(&simpler_types::CallableId) -> Option<String>,
) -> Vec<Frame> {
    Frame::from_task(level, failure, name_of(&failure.callable))
        .into_iter()
        .chain(failure.cause.iter().flat_map(|c| {
            // The cause is a task of the next level down.
            frames_of_task(level.saturating_sub(1), c, name_of)
        }))
        .collect()
}

impl Frame {
    /// A frame about run `run` as a whole at `level`: no task, callable or worker to name.
    pub(crate) fn of_run(level: u8, run: RunId, message: String) -> Frame {
        Frame {
            level,
            run,
            task: None,
            callable: None,
            kind: None,
            worker: None,
            member: None,
            mechanism: None,
            device_code: None,
            message,
            source: None,
        }
    }

    fn from_task(level: u8, t: &TaskFailure, name: Option<String>) -> Option<Frame> {
        Some(Frame {
            level,
            run: t.task.run,
            task: Some(t.task),
            callable: name,
            kind: Some(t.callable.kind),
            worker: t.worker,
            member: t.member,
            mechanism: Some(t.mechanism.clone()),
            device_code: t.device_code,
            source: t.source.clone(),
            message: if t.cause.is_some() {
                String::new()
            } else {
                format!("{}{}", mech_prefix(&t.mechanism), t.message)
            },
        })
    }
}

fn mech_prefix(m: &FailureMechanism) -> String {
    match m {
        FailureMechanism::Panicked => "panicked: ".to_owned(),
        FailureMechanism::TaskFailed | FailureMechanism::EndpointFailed => String::new(),
        other => format!("{other}: "),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use simpler_ring::RingError;
    use simpler_sched::SchedError;

    use super::WorkerError;

    /// A worker's task window has no size setting, so the worker's advice names what its user
    /// can change instead of the ring's `max_live_slots` (unreachable in practice: the window
    /// holds `u32::MAX` tasks).
    #[test]
    fn a_full_task_window_is_reported_with_advice_a_worker_user_can_follow() {
        let source = RingError::TaskWindowExhausted { limit: 8, live: 8, waited: Duration::ZERO };
        let e = WorkerError::Engine(SchedError::Capacity { source, oldest_live: None });
        assert_eq!(
            e.to_string(),
            "capacity exhausted: task window full: 8 of 8 slots live after waiting 0ns; a \
             worker's task window has no size setting; keep fewer tasks alive at once: end \
             scopes (GraphBuilder::scope) so that their tasks retire, or split the graph into \
             several runs"
        );
    }
}
