//! State enums of runs, tasks and group members (see `docs/types.md`).
//!
//! `TaskState`, `EndpointOutcome` and `GroupMemberState` mirror frozen wire value sets (traces and
//! the chip runtime compare the numbers), so they are exhaustive: a new state would be a protocol
//! change, and the engine is expected to match every state explicitly. `RunState` may gain
//! states for pipelined admission later and is therefore `#[non_exhaustive]`.

use std::fmt;

/// Lifecycle state of a run.
///
/// Legal moves: `Building → Executing | Completed | Failed`, `Executing → Completed | Failed`;
/// nothing leaves a terminal state.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
#[non_exhaustive]
pub enum RunState {
    /// Accepting submits; its tasks may already run.
    Building = 0,
    /// Submission closed; tasks are still charged to the run.
    Executing = 1,
    /// Every task retired and nothing failed.
    Completed = 2,
    /// The run recorded a failure.
    Failed = 3,
}

impl RunState {
    /// True for `Completed` and `Failed`.
    pub const fn is_terminal(self) -> bool {
        matches!(self, RunState::Completed | RunState::Failed)
    }

    /// Whether `self → next` is a legal move. Staying in the same phase is not a move.
    pub const fn can_move_to(self, next: RunState) -> bool {
        match self {
            RunState::Building => {
                matches!(next, RunState::Executing | RunState::Completed | RunState::Failed)
            }
            RunState::Executing => matches!(next, RunState::Completed | RunState::Failed),
            RunState::Completed | RunState::Failed => false,
        }
    }

    /// The wire value.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// Decodes a wire value; `None` for an unknown byte.
    pub const fn from_u8(v: u8) -> Option<RunState> {
        Some(match v {
            0 => RunState::Building,
            1 => RunState::Executing,
            2 => RunState::Completed,
            3 => RunState::Failed,
            _ => return None,
        })
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RunState::Building => "building",
            RunState::Executing => "executing",
            RunState::Completed => "completed",
            RunState::Failed => "failed",
        })
    }
}

/// State of one task-window entry, stored in an `AtomicU8`.
///
/// The wire values keep the original numbering so traces compare; `Building` was added last and
/// therefore has the highest value. The transition table, with the thread that performs each move,
/// belongs to the engine (`simpler-sched`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum TaskState {
    /// Window entry not in use.
    Free = 0,
    /// Published, waiting for live producers.
    Pending = 1,
    /// All producers satisfied; in a ready queue.
    Ready = 2,
    /// Claimed by dispatch; one or more members are on workers.
    Running = 3,
    /// Every member succeeded; may still be referenced.
    Completed = 4,
    /// A member failed, a producer failure poisoned it, or it was cancelled.
    Failed = 5,
    /// Every reference released; resources are being reclaimed.
    Consumed = 6,
    /// Claimed by a submit that is still wiring it; no other thread may advance it.
    Building = 7,
}

impl TaskState {
    /// Every state in wire-value order.
    pub const ALL: [TaskState; 8] = [
        TaskState::Free,
        TaskState::Pending,
        TaskState::Ready,
        TaskState::Running,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Consumed,
        TaskState::Building,
    ];

    /// The wire value.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// Decodes a wire value; `None` for any byte above 7.
    pub const fn from_u8(v: u8) -> Option<TaskState> {
        Some(match v {
            0 => TaskState::Free,
            1 => TaskState::Pending,
            2 => TaskState::Ready,
            3 => TaskState::Running,
            4 => TaskState::Completed,
            5 => TaskState::Failed,
            6 => TaskState::Consumed,
            7 => TaskState::Building,
            _ => return None,
        })
    }

    /// True for `Completed` and `Failed`: the task produced its result and will not run again.
    pub const fn is_finished(self) -> bool {
        matches!(self, TaskState::Completed | TaskState::Failed)
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TaskState::Free => "free",
            TaskState::Pending => "pending",
            TaskState::Ready => "ready",
            TaskState::Running => "running",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Consumed => "consumed",
            TaskState::Building => "building",
        })
    }
}

/// Result of one dispatched member.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum EndpointOutcome {
    /// The member ran and succeeded.
    Success = 0,
    /// The callable reported an error.
    TaskFailure = 1,
    /// The path to the callable failed (transport, child death, encoding, endpoint panic).
    EndpointFailure = 2,
    /// Never dispatched because its group or task failed first.
    Skipped = 3,
}

impl EndpointOutcome {
    /// True for `TaskFailure` and `EndpointFailure`.
    pub const fn is_failure(self) -> bool {
        matches!(self, EndpointOutcome::TaskFailure | EndpointOutcome::EndpointFailure)
    }

    /// The wire value.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// Decodes a wire value; `None` for an unknown byte.
    pub const fn from_u8(v: u8) -> Option<EndpointOutcome> {
        Some(match v {
            0 => EndpointOutcome::Success,
            1 => EndpointOutcome::TaskFailure,
            2 => EndpointOutcome::EndpointFailure,
            3 => EndpointOutcome::Skipped,
            _ => return None,
        })
    }
}

impl fmt::Display for EndpointOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EndpointOutcome::Success => "success",
            EndpointOutcome::TaskFailure => "task failure",
            EndpointOutcome::EndpointFailure => "endpoint failure",
            EndpointOutcome::Skipped => "skipped",
        })
    }
}

/// Per-member bookkeeping of a group task.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum GroupMemberState {
    /// Not yet handed to a worker.
    NotDispatched = 0,
    /// On a worker.
    Running = 1,
    /// Finished successfully.
    Success = 2,
    /// Finished with a failure.
    Failed = 3,
    /// Will never run because the group failed first.
    Skipped = 4,
}

impl GroupMemberState {
    /// True for `Success`, `Failed` and `Skipped`.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            GroupMemberState::Success | GroupMemberState::Failed | GroupMemberState::Skipped
        )
    }

    /// The wire value.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// Decodes a wire value; `None` for an unknown byte.
    pub const fn from_u8(v: u8) -> Option<GroupMemberState> {
        Some(match v {
            0 => GroupMemberState::NotDispatched,
            1 => GroupMemberState::Running,
            2 => GroupMemberState::Success,
            3 => GroupMemberState::Failed,
            4 => GroupMemberState::Skipped,
            _ => return None,
        })
    }
}

impl fmt::Display for GroupMemberState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GroupMemberState::NotDispatched => "not dispatched",
            GroupMemberState::Running => "running",
            GroupMemberState::Success => "success",
            GroupMemberState::Failed => "failed",
            GroupMemberState::Skipped => "skipped",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_state_from_u8_accepts_exactly_0_to_7() {
        for v in 0..=u8::MAX {
            match TaskState::from_u8(v) {
                Some(s) => {
                    assert!(v <= 7, "byte {v} decoded");
                    assert_eq!(s.as_u8(), v);
                }
                None => assert!(v > 7, "byte {v} rejected"),
            }
        }
        assert_eq!(TaskState::Building.as_u8(), 7);
        assert_eq!(TaskState::Free.as_u8(), 0);
        for (i, s) in TaskState::ALL.iter().enumerate() {
            assert_eq!(usize::from(s.as_u8()), i);
        }
    }

    #[test]
    fn run_phase_moves_follow_the_table() {
        use RunState::*;
        let all = [Building, Executing, Completed, Failed];
        let legal = [
            (Building, Executing),
            (Building, Completed),
            (Building, Failed),
            (Executing, Completed),
            (Executing, Failed),
        ];
        for a in all {
            for b in all {
                assert_eq!(a.can_move_to(b), legal.contains(&(a, b)), "{a} -> {b}");
            }
            assert_eq!(RunState::from_u8(a.as_u8()), Some(a));
        }
        assert!(Completed.is_terminal() && Failed.is_terminal());
        assert!(!Building.is_terminal() && !Executing.is_terminal());
        assert_eq!(RunState::from_u8(4), None);
    }

    #[test]
    fn outcome_and_member_predicates() {
        assert!(!EndpointOutcome::Success.is_failure());
        assert!(EndpointOutcome::TaskFailure.is_failure());
        assert!(EndpointOutcome::EndpointFailure.is_failure());
        assert!(!EndpointOutcome::Skipped.is_failure());
        for v in 0..=3 {
            assert_eq!(EndpointOutcome::from_u8(v).map(EndpointOutcome::as_u8), Some(v));
        }
        assert_eq!(EndpointOutcome::from_u8(4), None);
        let terminal: Vec<bool> = (0..=4)
            .map(|v| GroupMemberState::from_u8(v).map(GroupMemberState::is_terminal))
            .collect::<Option<_>>()
            .unwrap();
        assert_eq!(terminal, vec![false, false, true, true, true]);
        assert_eq!(GroupMemberState::from_u8(5), None);
    }
}
