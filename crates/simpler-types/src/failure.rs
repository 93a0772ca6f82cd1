//! The failure vocabulary every layer reports in (see `docs/types.md`).
//!
//! An error that reaches a user names the run, the task (callable, worker, member), the
//! mechanism, and the device code where one exists. These are plain data: the scheduler,
//! device and worker crates build them and wrap them in their own error enums.
//!
//! Display format (decision): one line per failure,
//!
//! ```text
//! run#7/task#12: timeout (op_execute budget of 5s) [callable sha256:001122334455…(chip), next-level worker 0, member 2, device code ACL_ERROR_X (507011)]: stream stalled
//!   caused by run#3/task#0: task failed [callable sha256:…(chip)]: kernel returned 5
//! ```
//!
//! followed by the cause chain, one indented line per lower level. The message is never
//! truncated. `source()` is not implemented for these types because `Display` already prints
//! the whole chain, and reporters that walk `source()` would print it twice; the typed error of
//! the failing layer is kept as data instead ([`TaskFailure::source`], a [`FailureSource`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::ids::{CallableId, RunId, TaskId, WorkerRef};

/// A code reported by the device runtime, with its symbolic name.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DeviceCode {
    /// The raw code.
    pub code: i32,
    /// Its symbolic name (for example an `ACL_ERROR_*` constant).
    pub name: &'static str,
}

impl DeviceCode {
    /// Pairs a code with its name.
    pub const fn new(code: i32, name: &'static str) -> DeviceCode {
        DeviceCode { code, name }
    }
}

impl fmt::Display for DeviceCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.code)
    }
}

/// Which timeout fired.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum TimeoutBudget {
    /// Execution of one operation on a worker.
    OpExecute,
    /// A device stream synchronisation.
    StreamSync,
    /// The on-device scheduler finishing a run.
    DeviceScheduler,
    /// A host–device or parent–child handshake.
    Handshake,
    /// A blocking heap-ring allocation (back-pressure).
    RingAlloc,
    /// Admission of a run.
    Admission,
    /// Any other budget, named.
    Other(&'static str),
}

impl fmt::Display for TimeoutBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimeoutBudget::OpExecute => "op_execute",
            TimeoutBudget::StreamSync => "stream_sync",
            TimeoutBudget::DeviceScheduler => "device_scheduler",
            TimeoutBudget::Handshake => "handshake",
            TimeoutBudget::RingAlloc => "ring_alloc",
            TimeoutBudget::Admission => "admission",
            TimeoutBudget::Other(name) => name,
        })
    }
}

/// Declares [`CancelReason`], its [`ALL`](CancelReason::ALL) and its text from one list, so
/// that no reason can be left out of `ALL`, which tables that must cover every reason (a wire
/// format's) are checked against.
macro_rules! cancel_reasons {
    ($($(#[doc = $doc:literal])* $variant:ident => $text:literal,)*) => {
        /// Why a task or run was cancelled.
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
        #[non_exhaustive]
        pub enum CancelReason {
            $($(#[doc = $doc])* $variant,)*
        }

        impl CancelReason {
            /// Every reason, in declaration order.
            pub const ALL: &'static [CancelReason] = &[$(CancelReason::$variant,)*];
        }

        impl fmt::Display for CancelReason {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self {
                    $(CancelReason::$variant => $text,)*
                })
            }
        }
    };
}

cancel_reasons! {
    /// The run's submission failed, so its unstarted tasks were cancelled.
    SubmissionFailed => "submission failed",
    /// The run was aborted.
    RunAborted => "run aborted",
    /// The engine shut down with the run in flight.
    Shutdown => "engine shut down",
    /// The engine was poisoned (an internal error) with the run in flight.
    EnginePoisoned => "engine poisoned",
}

/// How a task failed.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum FailureMechanism {
    /// The callable returned an error.
    TaskFailed,
    /// User code panicked and the panic was caught.
    Panicked,
    /// The path to the callable failed: transport, child death, encoding, endpoint panic.
    EndpointFailed,
    /// The device reported a fault.
    DeviceFault,
    /// A timeout fired.
    Timeout {
        /// Which budget.
        budget: TimeoutBudget,
        /// Its configured value.
        limit: Duration,
    },
    /// A capacity ran out.
    CapacityExhausted {
        /// What ran out, with its size (for example "heap ring 2: 1048576 bytes").
        what: String,
    },
    /// A producer failed, so this task could not run.
    Poisoned {
        /// The task whose failure started the poisoning.
        root: TaskId,
    },
    /// The task was cancelled before it ran.
    Cancelled {
        /// Why.
        reason: CancelReason,
    },
}

impl fmt::Display for FailureMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureMechanism::TaskFailed => f.write_str("task failed"),
            FailureMechanism::Panicked => f.write_str("panicked"),
            FailureMechanism::EndpointFailed => f.write_str("endpoint failed"),
            FailureMechanism::DeviceFault => f.write_str("device fault"),
            FailureMechanism::Timeout { budget, limit } => {
                write!(f, "timeout ({budget} budget of {limit:?})")
            }
            FailureMechanism::CapacityExhausted { what } => {
                write!(f, "capacity exhausted ({what})")
            }
            FailureMechanism::Poisoned { root } => write!(f, "poisoned by failed producer {root}"),
            FailureMechanism::Cancelled { reason } => write!(f, "cancelled ({reason})"),
        }
    }
}

/// The typed error a failing layer reported, kept beside the failure's text.
///
/// The engine never looks inside it: it carries whatever error type the endpoint produced (a
/// device error, say) from the endpoint to the caller, who gets it back with
/// [`downcast_ref`](Self::downcast_ref). Two sources are equal when they are the same shared
/// value.
///
/// The error is user code: whichever clone goes last drops it with a panic of its `Drop`
/// caught and forgotten, so that the engine thread or the builder that happens to release the
/// last reference (reclaiming a failed task, say) is never unwound by it.
#[derive(Clone)]
pub struct FailureSource(SharedError);

type SharedError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// What a dropped source holds in place of its error while the error is dropped.
#[derive(Debug)]
struct Dropped;

impl fmt::Display for Dropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dropped failure source")
    }
}

impl std::error::Error for Dropped {}

static DROPPED: std::sync::LazyLock<SharedError> = std::sync::LazyLock::new(|| Arc::new(Dropped));

impl FailureSource {
    /// Wraps `error`.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> FailureSource {
        FailureSource(Arc::new(error))
    }

    /// Wraps an error already boxed (a closure's `Box<dyn Error>`), keeping its own type for
    /// [`downcast_ref`](Self::downcast_ref).
    pub fn from_boxed(error: Box<dyn std::error::Error + Send + Sync + 'static>) -> FailureSource {
        FailureSource(Arc::from(error))
    }

    /// The error, as a trait object.
    pub fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// The error as a `T`, when it is one.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.0.downcast_ref::<T>()
    }
}

impl Drop for FailureSource {
    fn drop(&mut self) {
        // Failures are rare, so the placeholder's reference count is no cost worth avoiding.
        let error = std::mem::replace(&mut self.0, Arc::clone(&DROPPED));
        if let Err(payload) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(error)))
        {
            // The payload may panic on drop as well.
            std::mem::forget(payload);
        }
    }
}

impl PartialEq for FailureSource {
    fn eq(&self, other: &FailureSource) -> bool {
        // Data addresses only: the same value may be reached through different vtables.
        std::ptr::eq(Arc::as_ptr(&self.0).cast::<()>(), Arc::as_ptr(&other.0).cast::<()>())
    }
}

impl Eq for FailureSource {}

impl fmt::Debug for FailureSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for FailureSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

/// One failed task. Immutable once built and shared as `Arc`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TaskFailure {
    /// Which task (includes the run).
    pub task: TaskId,
    /// What it ran.
    pub callable: CallableId,
    /// Where it ran; `None` if it never reached a worker.
    pub worker: Option<WorkerRef>,
    /// Member index for a group task.
    pub member: Option<u32>,
    /// Why it failed.
    pub mechanism: FailureMechanism,
    /// Human text from the failing layer, not truncated.
    pub message: String,
    /// The device's code, when a device reported one.
    pub device_code: Option<DeviceCode>,
    /// The typed error of the failing layer, when it kept one (a device error, for example).
    pub source: Option<FailureSource>,
    /// The lower level's failure when a child `Worker` failed.
    pub cause: Option<Arc<TaskFailure>>,
}

impl TaskFailure {
    /// A failure with no worker, member, device code or cause; add those with the setters.
    pub fn new(
        task: TaskId,
        callable: CallableId,
        mechanism: FailureMechanism,
        message: impl Into<String>,
    ) -> TaskFailure {
        TaskFailure {
            task,
            callable,
            worker: None,
            member: None,
            mechanism,
            message: message.into(),
            device_code: None,
            source: None,
            cause: None,
        }
    }

    /// Sets the worker the task ran on.
    #[must_use]
    pub fn on_worker(mut self, worker: WorkerRef) -> TaskFailure {
        self.worker = Some(worker);
        self
    }

    /// Sets the group member index.
    #[must_use]
    pub fn for_member(mut self, member: u32) -> TaskFailure {
        self.member = Some(member);
        self
    }

    /// Sets the device code.
    #[must_use]
    pub fn with_device_code(mut self, code: DeviceCode) -> TaskFailure {
        self.device_code = Some(code);
        self
    }

    /// Sets the typed error of the failing layer.
    #[must_use]
    pub fn with_source(mut self, source: FailureSource) -> TaskFailure {
        self.source = Some(source);
        self
    }

    /// Sets the lower level's failure.
    #[must_use]
    pub fn caused_by(mut self, cause: Arc<TaskFailure>) -> TaskFailure {
        self.cause = Some(cause);
        self
    }

    /// This failure followed by its causes, outermost first.
    pub fn chain(&self) -> impl Iterator<Item = &TaskFailure> {
        std::iter::successors(Some(self), |f| f.cause.as_deref())
    }

    /// The innermost failure of the chain.
    pub fn root_cause(&self) -> &TaskFailure {
        self.chain().last().unwrap_or(self)
    }

    /// Writes this level only, on one line.
    fn fmt_line(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} [callable ", self.task, self.mechanism)?;
        // Twelve hex digits identify a callable for a human; the full digest is in `Debug`.
        f.write_str("sha256:")?;
        for b in &self.callable.digest[..6] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…({})", self.callable.kind)?;
        if let Some(w) = self.worker {
            write!(f, ", {w}")?;
        }
        if let Some(m) = self.member {
            write!(f, ", member {m}")?;
        }
        if let Some(c) = self.device_code {
            write!(f, ", device code {c}")?;
        }
        f.write_str("]")?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

impl fmt::Display for TaskFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_line(f)?;
        for cause in self.chain().skip(1) {
            f.write_str("\n  caused by ")?;
            cause.fmt_line(f)?;
        }
        Ok(())
    }
}

impl std::error::Error for TaskFailure {}

/// A run's first error. At most one per run; shared as `Arc`.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum RunFailure {
    /// A task of the run failed.
    Task(Arc<TaskFailure>),
    /// The orchestration code or its caller failed the submission.
    Submission {
        /// The run.
        run: RunId,
        /// What went wrong.
        message: String,
    },
    /// A closed run was aborted, or the engine shut down with the run in flight.
    Aborted {
        /// The run.
        run: RunId,
        /// Why.
        reason: CancelReason,
    },
    /// An engine invariant broke (reported instead of panicking).
    Internal {
        /// The run.
        run: RunId,
        /// What broke.
        message: String,
    },
}

impl RunFailure {
    /// The run that failed.
    pub fn run(&self) -> RunId {
        match self {
            RunFailure::Task(t) => t.task.run,
            RunFailure::Submission { run, .. }
            | RunFailure::Aborted { run, .. }
            | RunFailure::Internal { run, .. } => *run,
        }
    }

    /// The task failure, for the `Task` variant.
    pub fn task_failure(&self) -> Option<&Arc<TaskFailure>> {
        match self {
            RunFailure::Task(t) => Some(t),
            _ => None,
        }
    }
}

impl From<Arc<TaskFailure>> for RunFailure {
    fn from(t: Arc<TaskFailure>) -> RunFailure {
        RunFailure::Task(t)
    }
}

impl fmt::Display for RunFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: ", self.run())?;
        match self {
            RunFailure::Task(t) => write!(f, "{t}"),
            RunFailure::Submission { message, .. } => write!(f, "submission failed: {message}"),
            RunFailure::Aborted { reason, .. } => write!(f, "aborted ({reason})"),
            RunFailure::Internal { message, .. } => write!(f, "internal engine error: {message}"),
        }
    }
}

impl std::error::Error for RunFailure {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{CallableKind, CallableNamespace};

    fn callable() -> CallableId {
        let mut digest = [0u8; 32];
        digest[..6].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0x00, 0x01]);
        CallableId::new(digest, CallableKind::Chip, CallableNamespace::LocalChip)
    }

    fn task(run: u64, seq: u32) -> TaskId {
        TaskId::new(RunId::from_raw(run).unwrap(), seq)
    }

    #[test]
    fn display_names_run_task_mechanism_and_chain() {
        let inner = Arc::new(
            TaskFailure::new(task(3, 0), callable(), FailureMechanism::DeviceFault, "aicore trap")
                .with_device_code(DeviceCode::new(507_011, "ACL_ERROR_RT_AICORE_EXCEPTION")),
        );
        let outer = TaskFailure::new(
            task(7, 12),
            callable(),
            FailureMechanism::Timeout {
                budget: TimeoutBudget::OpExecute,
                limit: Duration::from_secs(5),
            },
            "child run failed",
        )
        .on_worker(WorkerRef::next_level(0))
        .for_member(2)
        .caused_by(inner);
        let run = RunFailure::Task(Arc::new(outer));
        assert_eq!(run.run().get(), 7);
        assert_eq!(
            run.to_string(),
            "run#7 failed: run#7/task#12: timeout (op_execute budget of 5s) \
             [callable sha256:deadbeef0001…(chip), next-level worker 0, member 2]: \
             child run failed\n  caused by run#3/task#0: device fault \
             [callable sha256:deadbeef0001…(chip), \
             device code ACL_ERROR_RT_AICORE_EXCEPTION (507011)]: aicore trap"
        );
        let t = run.task_failure().unwrap();
        assert_eq!(t.chain().count(), 2);
        assert_eq!(t.root_cause().task, task(3, 0));
    }

    #[test]
    fn non_task_failures_name_the_run() {
        let r = RunId::from_raw(4).unwrap();
        let cases = [
            (
                RunFailure::Submission { run: r, message: "bad".into() },
                "run#4 failed: submission failed: bad",
            ),
            (
                RunFailure::Aborted { run: r, reason: CancelReason::Shutdown },
                "run#4 failed: aborted (engine shut down)",
            ),
            (
                RunFailure::Internal { run: r, message: "fanin underflow".into() },
                "run#4 failed: internal engine error: fanin underflow",
            ),
        ];
        for (failure, text) in cases {
            assert_eq!(failure.run(), r);
            assert_eq!(failure.to_string(), text);
            assert!(failure.task_failure().is_none());
        }
    }

    #[test]
    fn mechanisms_display() {
        let m = [
            (
                FailureMechanism::Poisoned { root: task(1, 3) },
                "poisoned by failed producer run#1/task#3",
            ),
            (
                FailureMechanism::Cancelled { reason: CancelReason::SubmissionFailed },
                "cancelled (submission failed)",
            ),
            (
                FailureMechanism::CapacityExhausted { what: "heap ring 1: 4096 bytes".into() },
                "capacity exhausted (heap ring 1: 4096 bytes)",
            ),
            (
                FailureMechanism::Timeout {
                    budget: TimeoutBudget::Other("mailbox"),
                    limit: Duration::from_millis(250),
                },
                "timeout (mailbox budget of 250ms)",
            ),
        ];
        for (mech, text) in m {
            assert_eq!(mech.to_string(), text);
        }
    }
}
