//! What tearing a worker down (its close, or a start's rollback) met: a [`TeardownError`] for a
//! step that failed and a [`Leak`] for what could not be released, each naming the part of the
//! worker it concerns ([`TeardownPart`]) and why, typed.

use std::fmt;
use std::sync::Arc;
#[cfg(feature = "mpi")]
use std::time::Duration;

use simpler_device_a2a3::DeviceError;
use simpler_sched::SchedError;
use simpler_types::WorkerId;

use super::CloseError;
use crate::process::ShutdownFault;
#[cfg(feature = "mpi")]
use crate::remote::RemoteError;

/// The part of a worker a teardown error or a leak concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TeardownPart {
    /// The worker as a whole (its close attempt, a leak reported one level up).
    Worker,
    /// Its scheduling engine.
    Engine,
    /// One of its chips.
    Chip(WorkerId),
    /// One of its child workers in this process.
    Child(WorkerId),
    /// A remote L3 child: its child id, the MPI rank serving it and that rank's host.
    Remote {
        /// The child id.
        child: WorkerId,
        /// The serving rank.
        rank: i32,
        /// The rank's host name.
        host: String,
    },
}

impl fmt::Display for TeardownPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TeardownPart::Worker => f.write_str("the worker"),
            TeardownPart::Engine => f.write_str("engine"),
            TeardownPart::Chip(c) => write!(f, "chip {c}"),
            TeardownPart::Child(c) => write!(f, "child {c}"),
            TeardownPart::Remote { child, rank, host } => {
                write!(f, "child {child} (rank {rank} on {host})")
            }
        }
    }
}

/// Why a teardown step failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TeardownCause {
    /// Finalizing the chip's device failed (the chip is finalized anyway).
    #[error("finalize failed: {0}")]
    Device(#[source] Arc<DeviceError>),
    /// Stopping the engine met this error (the engine stopped anyway).
    #[error("{0}")]
    Engine(#[source] Arc<SchedError>),
    /// Closing a child worker failed. What the child leaked is not in it: that is the closing
    /// worker's own leak, one part deeper.
    #[error("{0}")]
    Child(#[source] Box<CloseError>),
    /// The chip's process (PROCESS mode) did not end cleanly.
    #[error("its process (pid {pid}) {fault}")]
    ChipProcess {
        /// The process.
        pid: u32,
        /// What went wrong.
        fault: ShutdownFault,
    },
    /// Stopping the part panicked.
    #[error("{step} panicked: {message}")]
    Panicked {
        /// What panicked: `finalize`, `close`, `lane thread`, `shutdown`.
        step: &'static str,
        /// The panic payload's text (a panic carries no typed value).
        message: String,
    },
    /// The close attempt unwound before it finished; parked and later closers get this.
    #[error("the close attempt unwound before it finished")]
    Unwound,
    /// Something a start's rollback could not release (a start error has no list of leaks).
    #[error("leaked: {0}")]
    Leaked(Leak),
    /// A chip still attaching at the start deadline: its attach thread was detached, and
    /// finalizes the chip when it finishes.
    #[error("the attach thread of device {device} was detached while still starting")]
    AttachDetached {
        /// The chip's device.
        device: u32,
    },
    /// A chip process still starting at the start deadline was killed and reaped.
    #[error("the chip process of device {device} was killed and reaped while still starting")]
    StartKilled {
        /// The chip's device.
        device: u32,
    },
    /// A chip process finished starting after the start deadline and was finalized.
    #[error("the chip process of device {device} started after the deadline; finalized")]
    StartedLate {
        /// The chip's device.
        device: u32,
    },
    /// The remote child's session ended with this error: a `Left` the rank sent before or
    /// during the shutdown (one saying its `ShutdownDone` was lost carries what its close did).
    #[cfg(feature = "mpi")]
    #[error("{0}")]
    Remote(#[source] RemoteError),
    /// The remote child's `Shutdown` could not be sent.
    #[cfg(feature = "mpi")]
    #[error("sending Shutdown failed: {0}")]
    RemoteShutdown(#[source] RemoteError),
    /// The remote L3 worker's close reported an error, rendered on its rank: a close error
    /// holds the user's own task failures, which have no wire form.
    #[cfg(feature = "mpi")]
    #[error("its close: {report}")]
    RemoteClose {
        /// The close error's text.
        report: String,
    },
    /// A failure injected by a test.
    #[cfg(test)]
    #[error("injected failure")]
    Injected,
}

/// One error met while tearing down (close or a start rollback): the part of which worker,
/// and why. Its source is its cause's.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TeardownError {
    /// The worker whose teardown met it (`L4 / child 1 (L3)`); empty when the error is
    /// reported inside a chip's own error ([`ChildError::Restore`](crate::ChildError)).
    pub path: String,
    /// The part of that worker.
    pub what: TeardownPart,
    /// What went wrong.
    pub cause: TeardownCause,
}

impl fmt::Display for TeardownError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.what, self.path.is_empty()) {
            (TeardownPart::Worker, false) => write!(f, "{}", self.path)?,
            (part, true) => write!(f, "{part}")?,
            (part, false) => write!(f, "{} / {part}", self.path)?,
        }
        write!(f, ": {}", self.cause)
    }
}

impl std::error::Error for TeardownError {
    /// The cause is in this error's text already: its own source is next.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.cause)
    }
}

/// Something a close could not release, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leak {
    /// The parts from the closing worker down to what leaked, outermost first:
    /// `[Child(0), Chip(0)]` is chip 0 of child 0.
    pub at: Vec<TeardownPart>,
    /// What leaked.
    pub what: Leaked,
}

impl Leak {
    pub(crate) fn new(part: TeardownPart, what: Leaked) -> Leak {
        Leak { at: vec![part], what }
    }

    /// The same leak seen one level up, from the worker whose part `outer` this one is in.
    pub(crate) fn under(mut self, outer: TeardownPart) -> Leak {
        self.at.insert(0, outer);
        self
    }
}

impl fmt::Display for Leak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.at {
            write!(f, "{part}: ")?;
        }
        write!(f, "{}", self.what)
    }
}

impl std::error::Error for Leak {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.what)
    }
}

/// What a close could not release.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Leaked {
    /// A device thread stuck in user code, which the chip's finalize detached: its name.
    #[error("stuck device thread {0}")]
    DeviceThread(String),
    /// A remote L3 worker that did not confirm its shutdown within the budget.
    #[cfg(feature = "mpi")]
    #[error("L3 worker did not confirm its shutdown within {budget:?}")]
    RemoteUnconfirmed {
        /// How long rank 0 waited.
        budget: Duration,
    },
    /// A remote L3 worker whose shutdown wait ended on this error before it confirmed (a
    /// `Left` for a frame lost or damaged before `Shutdown` says nothing of the close).
    #[cfg(feature = "mpi")]
    #[error("L3 worker did not confirm its shutdown: {0}")]
    RemoteLost(#[source] RemoteError),
}

/// What stopping a part of a worker left behind, before the worker's path is known.
#[derive(Debug)]
pub(crate) enum Residue {
    /// Something that could not be released: close reports it as leaked and never retries.
    Leaked(Leak),
    /// A teardown step of `what` that failed.
    Failed { what: TeardownPart, cause: TeardownCause },
}

impl Residue {
    pub(crate) fn failed(what: TeardownPart, cause: TeardownCause) -> Residue {
        Residue::Failed { what, cause }
    }

    pub(crate) fn leaked(what: TeardownPart, leaked: Leaked) -> Residue {
        Residue::Leaked(Leak::new(what, leaked))
    }

    /// As an entry of the teardown report of the worker at `path`, where leaks have no list
    /// of their own (a start's rollback): a leak names its outermost part as the error's.
    pub(crate) fn into_teardown(self, path: &str) -> TeardownError {
        let (what, cause) = match self {
            Residue::Failed { what, cause } => (what, cause),
            Residue::Leaked(mut leak) => {
                let what =
                    if leak.at.is_empty() { TeardownPart::Worker } else { leak.at.remove(0) };
                (what, TeardownCause::Leaked(leak))
            }
        };
        TeardownError { path: path.to_owned(), what, cause }
    }
}
