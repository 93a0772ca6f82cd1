//! PROCESS mode: each chip of an L3 worker in a child process of its own
//! (`docs/process-mode.md`).
//!
//! | Module | Holds |
//! |---|---|
//! | `buffers` | the device allocations of a chip's processes, to refuse memory of an ended one |
//! | `mailbox` | the shared-memory mailbox (memfd, header, request lane, futex parking) |
//! | `wire` | frames and their encoding |
//! | `catalog` | the content a chip process can run |
//! | `parent` | [`ChipProcess`](parent::ChipProcess), the worker's side of one chip process |
//! | `child` | the chip process's main loop |
//! | `spawn` | starting a chip process (fresh exec, inherited mailbox, process group) |

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use simpler_types::{DeviceCode, RunId, WorkerId};

mod buffers;
pub(crate) mod catalog;
pub(crate) mod child;
mod host_tensors;
pub(crate) mod mailbox;
pub(crate) mod parent;
pub(crate) mod spawn;

pub use spawn::SpawnFault;
pub(crate) mod wire;

/// Where a worker runs its chips.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChildMode {
    /// Every chip is a lane (a thread) of the worker's process.
    #[default]
    Thread,
    /// Every chip runs in a child process of its own, started from the `simpler-chip-child`
    /// binary (see [`ProcessOptions`]). Chip callables must be programs the child can build
    /// (the reference programs); other content is refused at registration.
    Process,
}

/// What happens to a chip whose process died or stopped answering.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnChildDeath {
    /// The chip stays unusable until close: later calls fail fast naming the first failure.
    #[default]
    ChipUnusable,
    /// The next call on the chip starts a new process and prepares the content the chip
    /// held again. Device allocations made before the death are gone. A restart that cannot
    /// prepare all of it fails that call and ends the new process; the next call tries again.
    Restart,
}

/// Settings of PROCESS mode.
#[derive(Clone, Debug)]
pub struct ProcessOptions {
    pub(crate) child_path: Option<PathBuf>,
    pub(crate) control_timeout: Duration,
    pub(crate) run_timeout: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) on_death: OnChildDeath,
    #[cfg(feature = "sim")]
    pub(crate) start_faults: Vec<ChildFault>,
    #[cfg(feature = "sim")]
    pub(crate) restart_faults: Vec<ChildFault>,
}

impl Default for ProcessOptions {
    /// The binary beside the current executable; 30 s for control calls, 300 s for runs, 10 s
    /// for shutdown; a dead chip stays unusable.
    fn default() -> ProcessOptions {
        ProcessOptions {
            child_path: None,
            control_timeout: Duration::from_secs(30),
            run_timeout: Duration::from_secs(300),
            shutdown_timeout: Duration::from_secs(10),
            on_death: OnChildDeath::ChipUnusable,
            #[cfg(feature = "sim")]
            start_faults: Vec::new(),
            #[cfg(feature = "sim")]
            restart_faults: Vec::new(),
        }
    }
}

impl ProcessOptions {
    /// The `simpler-chip-child` binary to start (default: beside the current executable).
    #[must_use]
    pub fn child_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.child_path = Some(path.into());
        self
    }

    /// How long each request of a registration or memory call may wait for its reply; a child
    /// that does not answer in time is killed. The budget is per request, not per call: a copy
    /// of more than one mailbox payload (64 KiB) is several requests, and a call that restarts
    /// the chip first also waits for the restart's own requests.
    #[must_use]
    pub fn control_timeout(mut self, t: Duration) -> Self {
        self.control_timeout = t;
        self
    }

    /// How long a chip run may wait for its reply; a child that does not answer in time is
    /// killed.
    #[must_use]
    pub fn run_timeout(mut self, t: Duration) -> Self {
        self.run_timeout = t;
        self
    }

    /// How long a child may take to finalize its chip and exit after it was asked to; then its
    /// process group is killed.
    #[must_use]
    pub fn shutdown_timeout(mut self, t: Duration) -> Self {
        self.shutdown_timeout = t;
        self
    }

    /// What happens to a chip whose process died or stopped answering.
    #[must_use]
    pub fn on_child_death(mut self, policy: OnChildDeath) -> Self {
        self.on_death = policy;
        self
    }

    /// Arms `fault` in every chip process at `start`, as soon as it is ready and before the
    /// builder's chip callables are prepared there (simulator builds; crash tests of the
    /// start). Called again, it arms each fault in turn: [`ChildFault::HangAfterExit`] and
    /// [`ChildFault::AbortAfterExit`] hold beside any other, of the others the last one armed
    /// holds. A restarted process starts without them (see
    /// [`fault_at_restart`](Self::fault_at_restart)).
    #[cfg(feature = "sim")]
    #[must_use]
    pub fn fault_at_start(mut self, fault: ChildFault) -> Self {
        self.start_faults.push(fault);
        self
    }

    /// Arms `fault` in every restarted chip process ([`OnChildDeath::Restart`]), as soon as it
    /// is ready and before the content the chip held is prepared there again (simulator
    /// builds; crash tests of the restart). Called again, it arms each fault in turn, as
    /// [`fault_at_start`](Self::fault_at_start) does.
    #[cfg(feature = "sim")]
    #[must_use]
    pub fn fault_at_restart(mut self, fault: ChildFault) -> Self {
        self.restart_faults.push(fault);
        self
    }
}

/// How a chip process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildExit {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl ChildExit {
    pub(crate) fn of(status: std::process::ExitStatus) -> ChildExit {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => ChildExit::Code(code),
            (None, Some(sig)) => ChildExit::Signal(sig),
            (None, None) => ChildExit::Code(-1),
        }
    }
}

impl fmt::Display for ChildExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChildExit::Code(c) => write!(f, "exited with status {c}"),
            ChildExit::Signal(s) => {
                let name = match *s {
                    libc::SIGSEGV => " (SIGSEGV)",
                    libc::SIGABRT => " (SIGABRT)",
                    libc::SIGKILL => " (SIGKILL)",
                    libc::SIGBUS => " (SIGBUS)",
                    libc::SIGILL => " (SIGILL)",
                    libc::SIGFPE => " (SIGFPE)",
                    libc::SIGTERM => " (SIGTERM)",
                    _ => "",
                };
                write!(f, "was killed by signal {s}{name}")
            }
        }
    }
}

/// A failure of a chip process or of the way to it (PROCESS mode).
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChildError {
    /// The process ended while a request was in flight.
    #[error("chip {chip}: its process (pid {pid}) {exit} during {operation}{} (request {seq})", fmt_run(*run))]
    Died {
        /// The chip.
        chip: WorkerId,
        /// The process.
        pid: u32,
        /// How it ended.
        exit: ChildExit,
        /// The request in flight.
        operation: &'static str,
        /// Its sequence number.
        seq: u64,
        /// The run it served, if it was a run.
        run: Option<RunId>,
    },
    /// The process ended while no request was in flight; noticed by the next call.
    #[error("chip {chip}: its process (pid {pid}) {exit} between requests (after request {after})")]
    EndedBetweenRequests {
        /// The chip.
        chip: WorkerId,
        /// The process.
        pid: u32,
        /// How it ended.
        exit: ChildExit,
        /// The sequence number of the last request it answered (0: none).
        after: u64,
    },
    /// The process did not answer within its budget and was killed with its process group.
    #[error("chip {chip}: its process (pid {pid}) did not answer {operation}{} (request {seq}) within {budget:?} and was killed", fmt_run(*run))]
    Unresponsive {
        /// The chip.
        chip: WorkerId,
        /// The process.
        pid: u32,
        /// The request in flight.
        operation: &'static str,
        /// Its sequence number.
        seq: u64,
        /// The run it served, if it was a run.
        run: Option<RunId>,
        /// The budget that ran out.
        budget: Duration,
    },
    /// An earlier failure made the chip unusable ([`OnChildDeath::ChipUnusable`]), or a restart
    /// failed ([`OnChildDeath::Restart`]).
    #[error("chip {chip} is unusable since: {cause}")]
    Unusable {
        /// The chip.
        chip: WorkerId,
        /// The first failure.
        cause: Box<ChildError>,
    },
    /// A request did not fit the mailbox; nothing was sent.
    #[error("chip {chip}: the {operation} request has {len} bytes, the mailbox holds {capacity}")]
    Oversized {
        /// The chip.
        chip: WorkerId,
        /// The request.
        operation: &'static str,
        /// Its payload length.
        len: usize,
        /// The mailbox's payload capacity.
        capacity: usize,
    },
    /// The process broke the protocol (a stale or malformed reply); the chip is unusable.
    #[error("chip {chip}: the chip process broke the protocol: {fault}")]
    Protocol {
        /// The chip.
        chip: WorkerId,
        /// What was wrong.
        fault: ProtocolFault,
    },
    /// A reply failed validation as it was read from the shared mailbox (a length field
    /// beyond the payload area, an unknown status); the process was killed and the chip is
    /// unusable.
    #[error("chip {chip}: its process (pid {pid}) sent a bad reply to {operation}: {fault}")]
    BadReply {
        /// The chip.
        chip: WorkerId,
        /// The process.
        pid: u32,
        /// The request the reply answered (`start` for the start's failure report).
        operation: &'static str,
        /// What was wrong with it.
        fault: ReplyFault,
    },
    /// The process could not be started.
    #[error("chip {chip}: cannot start its process: {fault}")]
    Spawn {
        /// The chip.
        chip: WorkerId,
        /// What failed (the paths tried, the system's refusal); the source.
        #[source]
        fault: SpawnFault,
    },
    /// A restarted process did not prepare again content the chip held
    /// ([`OnChildDeath::Restart`]): the restart failed and that process was ended and reaped.
    #[error(
        "chip {chip}: its restarted process (pid {pid}) did not prepare '{callable}' again: {cause}{}",
        fmt_residue(residue)
    )]
    Restore {
        /// The chip.
        chip: WorkerId,
        /// The restarted process.
        pid: u32,
        /// The callable's entry name.
        callable: String,
        /// Why: the chip's refusal ([`ChildError::Device`]), or the request's failure.
        cause: Box<ChildError>,
        /// What ending that process left behind (what its finalize could not release, a
        /// process that had to be killed), one entry each; empty when it ended cleanly.
        residue: Vec<crate::TeardownError>,
    },
    /// The chip's device reported a failure inside the process.
    #[error("chip {chip}: {message}")]
    Device {
        /// The chip.
        chip: WorkerId,
        /// The run, if a run failed.
        run: Option<RunId>,
        /// The device code, if the device reported one.
        code: Option<DeviceCode>,
        /// The device's text.
        message: String,
    },
}

/// How ending a chip process went wrong ([`TeardownCause::ChipProcess`](crate::TeardownCause)).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShutdownFault {
    /// Finalizing its chip failed there: the device's code, when it reported one, and its
    /// text (the device's error itself stays in that process).
    #[error("reported that finalizing its chip failed: {message}")]
    Finalize {
        /// The device's code.
        code: Option<DeviceCode>,
        /// The device's text.
        message: String,
    },
    /// Its report of what its finalize left could not be read.
    #[error("reported what its finalize left in a bad reply: {0}")]
    BadReply(ReplyFault),
    /// Its report of what its finalize left did not decode.
    #[error("reported what its finalize left in a malformed reply")]
    Malformed,
    /// It finalized but did not exit within the budget: its process group was killed.
    #[error("finalized but did not exit within {budget:?}; its process group was killed")]
    NoExit {
        /// The shutdown budget.
        budget: Duration,
    },
    /// It did not finalize within the budget: its process group was killed.
    #[error("did not finalize within {budget:?}; its process group was killed")]
    NoFinalize {
        /// The shutdown budget.
        budget: Duration,
    },
    /// It ended during the shutdown, other than by exiting with status 0.
    #[error("{0} during shutdown")]
    Ended(ChildExit),
    /// It had ended before it was asked to shut down, while no request was pending (nothing
    /// notices a death between requests earlier).
    #[error("{0} before it was asked to shut down")]
    EndedBefore(ChildExit),
}

/// What was wrong with a reply read from a chip process's mailbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplyFault {
    /// Its length field names more bytes than the payload area holds.
    #[error("its length field says {len} bytes, the mailbox holds {capacity}")]
    Length {
        /// The length field as read.
        len: u32,
        /// The payload area's size.
        capacity: usize,
    },
    /// Its status is neither success nor failure.
    #[error("status {status} is neither success (0) nor failure (1)")]
    Status {
        /// The status as read.
        status: u32,
    },
}

/// How a chip process broke the protocol of its mailbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolFault {
    /// The process said it was ready in a mailbox that names another process.
    #[error("the mailbox names pid {mailbox_pid}, the child is {child_pid}")]
    ForeignPid {
        /// The pid the mailbox names.
        mailbox_pid: u32,
        /// The pid of the process started.
        child_pid: u32,
    },
    /// The mailbox reached a state that no request in flight can reach.
    #[error("state {state} during {operation}")]
    State {
        /// The request in flight.
        operation: &'static str,
        /// The state as read.
        state: u32,
    },
    /// The reply answers another request than the one in flight.
    #[error("stale reply to {operation}: request {request}, reply {reply}")]
    StaleReply {
        /// The request in flight.
        operation: &'static str,
        /// Its sequence number.
        request: u64,
        /// The sequence number the reply echoed.
        reply: u64,
    },
    /// The reply's payload does not decode as the reply to its request (cut short, or a tag
    /// its encoder never writes).
    #[error("malformed reply to {operation}: {what}")]
    Malformed {
        /// The request the reply answered (`start` for the start's failure report).
        operation: &'static str,
        /// The field or check that failed.
        what: &'static str,
    },
    /// A query reply's unusable flag is neither 0 nor 1.
    #[error("query reply: unusable flag {flag} is neither 0 nor 1")]
    UnusableFlag {
        /// The flag as read.
        flag: u8,
    },
    /// An allocation was answered with a range that runs past the 64-bit address space.
    #[error("malloc: {bytes} bytes at {addr:#x} run past the address space")]
    AllocationPastAddressSpace {
        /// The address answered.
        addr: u64,
        /// The bytes asked for.
        bytes: u64,
    },
    /// A copy from device memory answered another number of bytes than it asked for.
    #[error("copy_from: {got} bytes for {asked}")]
    CopyLength {
        /// The bytes asked for.
        asked: usize,
        /// The bytes answered.
        got: usize,
    },
    /// No process runs and none failed: the last one was shut down.
    #[error("the chip process is gone")]
    Gone,
}

fn fmt_residue(residue: &[crate::TeardownError]) -> String {
    if residue.is_empty() {
        return String::new();
    }
    let t: Vec<String> = residue.iter().map(ToString::to_string).collect();
    format!("; ending it left: {}", t.join("; "))
}

fn fmt_run(run: Option<RunId>) -> String {
    run.map(|r| format!(" of {r}")).unwrap_or_default()
}

impl ChildError {
    /// The chip.
    pub fn chip(&self) -> WorkerId {
        match self {
            ChildError::Died { chip, .. }
            | ChildError::EndedBetweenRequests { chip, .. }
            | ChildError::Unresponsive { chip, .. }
            | ChildError::Unusable { chip, .. }
            | ChildError::Oversized { chip, .. }
            | ChildError::Protocol { chip, .. }
            | ChildError::BadReply { chip, .. }
            | ChildError::Spawn { chip, .. }
            | ChildError::Restore { chip, .. }
            | ChildError::Device { chip, .. } => *chip,
        }
    }

    /// The device code behind this failure: a device's, also as the cause of an unusable chip
    /// or of a failed restart.
    pub fn device_code(&self) -> Option<DeviceCode> {
        match self {
            ChildError::Device { code, .. } => *code,
            ChildError::Unusable { cause, .. } | ChildError::Restore { cause, .. } => {
                cause.device_code()
            }
            _ => None,
        }
    }
}

/// A fault a chip process acts on at its next run (simulator builds, for crash tests).
#[cfg(feature = "sim")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChildFault {
    /// The process dies of `SIGSEGV`.
    Segfault,
    /// The process aborts (`SIGABRT`).
    Abort,
    /// The process stops answering (it sleeps until killed).
    Hang,
    /// The process stops answering when asked to shut down (armed now, not at the next run).
    HangOnShutdown,
    /// The process dies of `SIGSEGV` at its second copy from device memory (armed now): a copy
    /// of several pieces, such as a host tensor's written span coming back, is cut midway.
    SegfaultOnCopyBack,
    /// The process aborts (`SIGABRT`) at its next registration (armed now, not at the next run).
    AbortOnRegister,
    /// The process stops answering at its next registration (armed now, not at the next run).
    HangOnRegister,
    /// The chip refuses the next registration as out of device memory, and only that one
    /// (armed now, not at the next run).
    RefuseOnRegister,
    /// The next allocation answers an address whose range does not fit in 64 bits, as a
    /// corrupted reply would (armed now, not at the next run).
    WildMalloc,
    /// The chip refuses the next removal of content, which stays on the device and unusable
    /// there (armed now, not at the next run).
    RefuseOnRelease,
    /// The process finalizes its chip and says it exits when asked to shut down, and then
    /// hangs instead (armed now, not at the next run; it holds beside any other fault).
    HangAfterExit,
    /// The process finalizes its chip and says it exits when asked to shut down, and then
    /// aborts, as an exit handler that crashes would (armed now, not at the next run; it holds
    /// beside any other fault).
    AbortAfterExit,
    /// At its next registration the process flips its mailbox between "request" and
    /// "accepted" for ever instead of answering, as a corrupted process might (armed now).
    FlipStateOnRegister,
}

/// The main function of the `simpler-chip-child` binary; returns its exit status.
///
/// It takes over the descriptor that `--mailbox-fd` names in the process's arguments, maps it
/// as the mailbox and closes it. A descriptor that is not a memfd carrying the mailbox's seals
/// is refused (exit status 3) and left open.
///
/// # Safety
///
/// The process was started by the worker's spawner (PROCESS mode) with these arguments, and the
/// descriptor `--mailbox-fd` names is the mailbox it inherited, open and owned by nothing else
/// in the process (no `File` or `OwnedFd` holds it and nothing else closes it).
///
/// ```compile_fail,E0133
/// let status = simpler_worker::chip_child_main(); // error: a call to an unsafe function
/// ```
#[doc(hidden)]
pub unsafe fn chip_child_main() -> i32 {
    child::main()
}

/// Starts chip `chip` in a child process and prepares `callables` there: the PROCESS-mode
/// half of a chip's attach at `start`. No wait passes the start deadline; one that would names
/// its step.
pub(crate) fn start_chip(
    chip: WorkerId,
    init: parent::ChipInit,
    opts: std::sync::Arc<ProcessOptions>,
    deadline: Option<std::time::Instant>,
    callables: &[simpler_device_a2a3::ChipCallable],
    faults: crate::faults::Faults,
) -> Result<crate::chip::ChipState, crate::builder::AttachFailure> {
    use crate::builder::AttachFailure;
    use crate::error::RegistrationFailure;
    // A little past the start deadline: `start` itself reports the deadline and then waits
    // for this thread, which kills and reaps a child still starting.
    let deadline = deadline.map(|d| d.checked_add(Duration::from_millis(20)).unwrap_or(d));
    #[cfg(feature = "sim")]
    let start_faults = opts.start_faults.clone();
    let mut process =
        parent::ChipProcess::start(chip, init, opts, deadline).map_err(|f| match f {
            parent::StartFailure::Deadline(ChildError::Unresponsive { pid, .. }) => {
                AttachFailure::Deadline {
                    step: format!("waiting for its process (pid {pid}) to be ready"),
                    residue: Vec::new(),
                }
            }
            parent::StartFailure::Deadline(ChildError::Spawn {
                fault: SpawnFault::Stalled { binary, .. },
                ..
            }) => AttachFailure::Deadline {
                step: format!("starting its process ({})", binary.display()),
                residue: Vec::new(),
            },
            parent::StartFailure::Child(e) | parent::StartFailure::Deadline(e) => {
                RegistrationFailure::Child(e).into()
            }
            parent::StartFailure::Device(f) => {
                let (code, message) = (f.code, f.message);
                RegistrationFailure::Child(ChildError::Device { chip, run: None, code, message })
                    .into()
            }
        })?;
    let pid = process.pid().unwrap_or_default();
    // A request the process did not answer by the start deadline is the deadline's failure.
    let failed = |process: &mut parent::ChipProcess, e: RegistrationFailure, step: String| {
        let late = deadline.is_some_and(|d| std::time::Instant::now() >= d);
        let failure = match e {
            RegistrationFailure::Child(ChildError::Unresponsive { .. }) if late => {
                let step = format!("{step} in its process (pid {pid})");
                AttachFailure::Deadline { step, residue: Vec::new() }
            }
            e => e.into(),
        };
        // The process was ready: what its shutdown leaves behind is the rollback's to report.
        let residue = process.shutdown();
        failure.with_residue(residue)
    };
    #[cfg(feature = "sim")]
    for fault in start_faults {
        if let Err(e) = process.arm(fault) {
            return Err(failed(&mut process, e.into(), "arming a fault".into()));
        }
    }
    for c in callables {
        if let Err(e) = process.register(c) {
            return Err(failed(&mut process, e, format!("preparing '{}'", c.entry_name())));
        }
    }
    // The start deadline stays on the process until the whole worker has started
    // (`ChipState::started`): a rollback's shutdown of this chip must not run past it.
    Ok(crate::chip::ChipState::in_process(chip, process, faults))
}

impl crate::Worker {
    /// The pid of chip `chip`'s process (`None` in THREAD mode or while the chip has no live
    /// process).
    pub fn chip_process_id(&self, chip: WorkerId) -> Result<Option<u32>, crate::WorkerError> {
        let _lease = self.inner.lease()?;
        self.inner.on_chip(chip, |s| s.process.as_ref().and_then(parent::ChipProcess::pid))
    }

    /// Arms `fault` in chip `chip`'s process for its next run (simulator builds; crash tests
    /// of code built on workers). `Ok(false)` in THREAD mode.
    #[cfg(feature = "sim")]
    pub fn arm_chip_process_fault(
        &self,
        chip: WorkerId,
        fault: ChildFault,
    ) -> Result<bool, crate::WorkerError> {
        let _lease = self.inner.lease()?;
        let armed = self.inner.on_chip(chip, move |s| s.process.as_mut().map(|p| p.arm(fault)))?;
        match armed {
            None => Ok(false),
            Some(Ok(())) => Ok(true),
            // The chip process failed: its chip is unusable, as for a memory call.
            Some(Err(e)) => Err(parent::mem_child(chip, e).into()),
        }
    }
}

impl crate::Frame {
    /// The chip-process failure this frame's failure came from (PROCESS mode): a child that
    /// died, stopped answering or reported a device failure.
    pub fn child_error(&self) -> Option<&ChildError> {
        self.source.as_ref().and_then(simpler_types::FailureSource::downcast_ref::<ChildError>)
    }
}
