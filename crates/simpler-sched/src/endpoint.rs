//! The `Endpoint` trait: whatever executes one dispatched task member (`docs/engine-protocols.md`
//! §7).
//!
//! The engine knows nothing about chips, child workers or host closures; each of them is an
//! endpoint owned by one engine worker thread. The engine validates every task before it reaches
//! an endpoint (targets, tags, descriptors), so endpoints may rely on a well-formed
//! [`DispatchedMember`]; checking platform limits of their own kind is theirs.

use std::any::Any;
use std::sync::Arc;

use simpler_types::{
    CallConfig, CallableId, DeviceCode, EndpointOutcome, FailureMechanism, FailureSource,
    TaskArgsView, TaskFailure, TaskId, WorkerId, WorkerType,
};

/// Executes dispatched task members on one engine worker thread.
///
/// Contract:
/// 1. Every method is called only on the endpoint's own worker thread, one member at a time
///    (`&mut self`: no internal locking needed).
/// 2. [`run`](Endpoint::run) executes exactly one member and returns. Blocking is expected; it
///    must be bounded by the endpoint's own budgets (device timeouts). A host closure's duration
///    is its author's business.
/// 3. `Ok` means success. A failure says whether the callable reported an error
///    ([`EndpointOutcome::TaskFailure`]) or the path to it failed
///    ([`EndpointOutcome::EndpointFailure`]); its message is complete, never truncated.
/// 4. Panics should not escape: an endpoint catches user panics and returns
///    [`EndpointFailure::panicked`]. As a backstop the worker thread catches an escaping panic,
///    reports it as an endpoint failure "endpoint panicked: …", and keeps serving.
/// 5. An endpoint never calls the submit API of its own engine (an L4+ endpoint drives a child
///    engine instead).
/// 6. The borrowed arguments are valid for the call only; the task stays `Running` meanwhile.
///
/// `Any` is a supertrait so that control jobs ([`Engine::on_endpoint`](crate::Engine::on_endpoint))
/// can downcast `&mut dyn Endpoint` to the concrete endpoint type.
pub trait Endpoint: Any + Send {
    /// What this endpoint is: worker type, stable id, remote flag, name. Called once at engine
    /// start, on the thread that starts the engine.
    fn caps(&self) -> EndpointCaps;

    /// Called once on the endpoint's own thread before any work, for per-thread state (a
    /// thread-bound context): every later call of the endpoint comes from this thread.
    fn on_thread_start(&mut self) {}

    /// Runs one dispatched member to completion.
    fn run(&mut self, task: DispatchedMember<'_>) -> Result<(), EndpointFailure>;

    /// Called once on the endpoint's own thread after its last task and control job.
    fn shutdown(&mut self) {}
}

/// What an endpoint reports about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointCaps {
    /// Which queue family the endpoint serves.
    pub worker_type: WorkerType,
    /// Stable, user-visible id of a NEXT_LEVEL endpoint; ignored for SUB endpoints, which are
    /// numbered 0..m−1 in registration order.
    pub id: WorkerId,
    /// Whether the endpoint reaches another host (informational at this layer).
    pub remote: bool,
    /// Human-readable name for traces and errors.
    pub name: String,
}

/// One member of a task, as handed to [`Endpoint::run`].
#[derive(Clone, Copy, Debug)]
pub struct DispatchedMember<'a> {
    /// The task this member belongs to.
    pub task: TaskId,
    /// Member index within the task (0 for a single task).
    pub member: u32,
    /// Number of members of the task (1 for a single task).
    pub group_size: u32,
    /// What to run.
    pub callable: &'a CallableId,
    /// Per-task configuration (always the default for SUB tasks).
    pub config: &'a CallConfig,
    /// The member's tensors with the tags they were submitted with, and its scalars.
    pub args: TaskArgsView<'a>,
}

/// Why a member did not succeed.
#[derive(Clone, Debug)]
pub struct EndpointFailure {
    /// `TaskFailure` (the callable reported an error) or `EndpointFailure` (the path failed).
    pub outcome: EndpointOutcome,
    /// How it failed.
    pub mechanism: FailureMechanism,
    /// Complete human-readable text.
    pub message: String,
    /// The device's code, when a device reported one.
    pub device_code: Option<DeviceCode>,
    /// The endpoint's typed error, passed on untouched in [`TaskFailure::source`].
    pub source: Option<FailureSource>,
    /// The lower level's failure, when a child engine failed.
    pub cause: Option<Arc<TaskFailure>>,
}

impl EndpointFailure {
    /// The callable ran and reported an error.
    pub fn task_failed(message: impl Into<String>) -> EndpointFailure {
        EndpointFailure::new(EndpointOutcome::TaskFailure, FailureMechanism::TaskFailed, message)
    }

    /// The path to the callable failed (transport, child death, encoding).
    pub fn endpoint_failed(message: impl Into<String>) -> EndpointFailure {
        EndpointFailure::new(
            EndpointOutcome::EndpointFailure,
            FailureMechanism::EndpointFailed,
            message,
        )
    }

    /// User code panicked and the endpoint caught it.
    pub fn panicked(message: impl Into<String>) -> EndpointFailure {
        EndpointFailure::new(EndpointOutcome::TaskFailure, FailureMechanism::Panicked, message)
    }

    /// A failure with an explicit outcome and mechanism.
    pub fn new(
        outcome: EndpointOutcome,
        mechanism: FailureMechanism,
        message: impl Into<String>,
    ) -> EndpointFailure {
        EndpointFailure {
            outcome,
            mechanism,
            message: message.into(),
            device_code: None,
            source: None,
            cause: None,
        }
    }

    /// Attaches the device's code.
    pub fn with_device_code(mut self, code: DeviceCode) -> EndpointFailure {
        self.device_code = Some(code);
        self
    }

    /// Attaches the endpoint's typed error.
    pub fn with_source(mut self, source: FailureSource) -> EndpointFailure {
        self.source = Some(source);
        self
    }

    /// Attaches the lower level's failure.
    pub fn with_cause(mut self, cause: Arc<TaskFailure>) -> EndpointFailure {
        self.cause = Some(cause);
        self
    }
}

/// Runs `log`, a logging call, ignoring a panic of the tracing layer it reaches: an engine thread
/// must outlive a subscriber that panics.
pub(crate) fn quietly(log: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(log)) {
        drop_quietly(payload);
    }
}

/// An engine thread's span, made and entered by `enter` where a tracing layer that panics
/// cannot end the thread (`None` then: the thread runs without it). Leave it with
/// [`drop_quietly`].
pub(crate) fn thread_span(
    enter: impl FnOnce() -> tracing::span::EnteredSpan,
) -> Option<tracing::span::EnteredSpan> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(enter)).map_err(drop_quietly).ok()
}

/// Drops `value` on an engine thread, which must outlive a value whose drop panics (a job's
/// result, a panic payload): such a panic is caught, and its own payload is forgotten rather
/// than dropped, since dropping it could panic in turn.
pub(crate) fn drop_quietly<T>(value: T) {
    if let Err(payload) =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(value)))
    {
        std::mem::forget(payload);
    }
}

/// Text of a caught panic payload, which is then dropped quietly.
pub(crate) fn into_panic_message(payload: Box<dyn Any + Send>) -> String {
    let message = panic_message(payload.as_ref());
    drop_quietly(payload);
    message
}

/// Text of a caught panic payload.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
