//! `RunStatus`: a cloneable snapshot of one run for users and tests (see `docs/types.md`).

use std::sync::Arc;

use crate::failure::RunFailure;
use crate::ids::RunId;
use crate::state::RunState;

/// Snapshot of a run's progress. Taking it does not hold any lock of the engine afterwards; the
/// values may be stale as soon as it is returned.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RunStatus {
    /// The run.
    pub id: RunId,
    /// Its phase when the snapshot was taken.
    pub phase: RunState,
    /// Whether submission was closed (normally or by failure).
    pub submission_closed: bool,
    /// Whether submission was closed by a failure.
    pub submission_failed: bool,
    /// Tasks and allocs charged to the run so far.
    pub tasks_submitted: u32,
    /// Tasks and allocs charged and not yet reclaimed.
    pub tasks_active: u32,
    /// The run's first error, once recorded.
    pub failure: Option<Arc<RunFailure>>,
}

impl RunStatus {
    /// Whether the run reached `Completed` or `Failed`.
    pub fn is_terminal(&self) -> bool {
        self.phase.is_terminal()
    }
}
