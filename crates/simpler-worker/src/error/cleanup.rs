//! [`CleanupError`]: a cleanup step of a run that failed, with why ([`CleanupFault`]).

use std::fmt;
use std::sync::Arc;

use simpler_sched::SchedError;

/// Why a cleanup step of a run failed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum CleanupFault {
    /// The engine was gone before the run was released.
    EngineGone,
    /// The engine refused to release the run (the source).
    Release(Arc<SchedError>),
    /// The run's lane had not set its fence when the run was released.
    FenceUnset,
    /// The step panicked; the payload's text.
    Panicked(String),
    /// A failure injected by a test.
    #[cfg(test)]
    Injected,
}

impl fmt::Display for CleanupFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CleanupFault::EngineGone => f.write_str("the engine is gone"),
            CleanupFault::Release(e) => write!(f, "the engine did not release the run: {e}"),
            CleanupFault::FenceUnset => f.write_str("the lane had not set the run's fence"),
            CleanupFault::Panicked(p) => write!(f, "panicked: {p}"),
            #[cfg(test)]
            CleanupFault::Injected => f.write_str("injected failure"),
        }
    }
}

impl std::error::Error for CleanupFault {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CleanupFault::Release(e) => Some(&**e),
            _ => None,
        }
    }
}

/// A cleanup step of a run that failed: the source of a `CleanupFailed` run error's frame, and
/// what [`RunError::suppressed`](crate::RunError::suppressed) holds.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CleanupError {
    /// The step (`release`, `retire`).
    pub step: &'static str,
    /// Why it failed.
    pub fault: CleanupFault,
}

impl fmt::Display for CleanupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cleanup step {} failed: {}", self.step, self.fault)
    }
}

impl std::error::Error for CleanupError {
    /// The fault is in this error's text already: its own source is next.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.fault)
    }
}
