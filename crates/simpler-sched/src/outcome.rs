//! What the engine reports back: run outcomes and summaries, task snapshots, engine statistics.

use std::fmt;
use std::sync::Arc;

use simpler_ring::RingStats;
use simpler_types::{
    GroupMemberState, HEAP_RING_COUNT, RunFailure, RunId, TaskFailure, TaskId, TaskState,
    WorkerRef, WorkerType,
};

/// How a run ended. Every waiter of one run gets the same value (the same `Arc`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// Every task retired and nothing failed.
    Completed,
    /// The run's first failure.
    Failed(Arc<RunFailure>),
}

impl RunOutcome {
    /// Whether the run completed without failure.
    pub fn is_completed(&self) -> bool {
        matches!(self, RunOutcome::Completed)
    }

    /// The failure, if the run failed.
    pub fn failure(&self) -> Option<&Arc<RunFailure>> {
        match self {
            RunOutcome::Completed => None,
            RunOutcome::Failed(f) => Some(f),
        }
    }

    /// `Ok(())` for a completed run, else its failure as an error, so that a failed run
    /// propagates with `?`.
    ///
    /// ```
    /// use simpler_sched::RunOutcome;
    ///
    /// fn check(outcome: RunOutcome) -> Result<(), Box<dyn std::error::Error>> {
    ///     outcome.into_result()?;
    ///     Ok(())
    /// }
    /// assert!(check(RunOutcome::Completed).is_ok());
    /// ```
    pub fn into_result(self) -> Result<(), Arc<RunFailure>> {
        match self {
            RunOutcome::Completed => Ok(()),
            RunOutcome::Failed(f) => Err(f),
        }
    }
}

impl std::fmt::Display for RunOutcome {
    /// `completed`, or the failure (which names the run, the task and what failed).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunOutcome::Completed => f.write_str("completed"),
            RunOutcome::Failed(failure) => std::fmt::Display::fmt(failure, f),
        }
    }
}

/// High-water marks of one heap ring over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingPeak {
    /// Most bytes held by live slabs at once.
    pub peak_live_bytes: u64,
    /// Most bytes between tail and top at once (wrap gap included).
    pub peak_occupied_bytes: u64,
    /// Most live slabs at once.
    pub peak_live_allocs: u32,
}

/// Ring high-water marks of one run: each heap ring and the task window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingPeaks {
    /// Rings 0..=3.
    pub rings: [RingPeak; HEAP_RING_COUNT],
    /// Most live task-window slots at once.
    pub window_peak: u32,
}

impl RingPeaks {
    /// Extracts the peaks from a ring snapshot.
    pub(crate) fn from_stats(stats: &RingStats) -> RingPeaks {
        RingPeaks {
            rings: stats.heaps.each_ref().map(|h| RingPeak {
                peak_live_bytes: h.peak_live_bytes,
                peak_occupied_bytes: h.peak_occupied_bytes,
                peak_live_allocs: h.peak_live_allocs,
            }),
            window_peak: stats.window.peak_live,
        }
    }
}

/// Returned by [`Engine::release`](crate::Engine::release).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSummary {
    /// The run.
    pub id: RunId,
    /// How it ended.
    pub outcome: RunOutcome,
    /// Tasks and allocs charged to it.
    pub tasks: u32,
    /// Tasks that failed (their own failure or a producer's), cancelled ones excluded.
    pub failed: u32,
    /// Tasks cancelled before they ran.
    pub cancelled: u32,
    /// Ring high-water marks while the run was admitted (serial admission makes them per run).
    pub peaks: RingPeaks,
}

impl std::fmt::Display for RunSummary {
    /// One line for the run, then one per heap ring that was used:
    ///
    /// ```text
    /// run#1: completed; 3 tasks (0 failed, 0 cancelled); window peak 3 slots
    ///   heap ring 0: peak 4096 B live in 1 alloc(s), 4096 B occupied
    /// ```
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let outcome = match &self.outcome {
            RunOutcome::Completed => "completed".to_owned(),
            RunOutcome::Failed(failure) => failure.to_string(),
        };
        write!(
            f,
            "{}: {outcome}; {} tasks ({} failed, {} cancelled); window peak {} slots",
            self.id, self.tasks, self.failed, self.cancelled, self.peaks.window_peak
        )?;
        for (i, r) in self.peaks.rings.iter().enumerate() {
            if *r == RingPeak::default() {
                continue;
            }
            write!(
                f,
                "\n  heap ring {i}: peak {} B live in {} alloc(s), {} B occupied",
                r.peak_live_bytes, r.peak_live_allocs, r.peak_occupied_bytes
            )?;
        }
        Ok(())
    }
}

/// Introspection of one task, for debugging and tests ([`Engine::task_snapshot`](crate::Engine::task_snapshot)).
///
/// Once a task's slot is reclaimed only `task` and `state` (`Consumed`) remain meaningful.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskSnapshot {
    /// The task.
    pub task: TaskId,
    /// Its state.
    pub state: TaskState,
    /// `None` for an `alloc()` buffer.
    pub worker_type: Option<WorkerType>,
    /// Whether the task is an `alloc()` buffer.
    pub is_alloc: bool,
    /// Live producers counted at publication.
    pub fanin_count: u32,
    /// Producer completions counted so far.
    pub fanin_released: u32,
    /// Producers it holds a reference on (live or finished at submit), in attach order.
    pub producers: Vec<TaskId>,
    /// Consumers attached to it, in attach order.
    pub consumers: Vec<TaskId>,
    /// References it waits for: 1 (scope) + attached consumers.
    pub fanout_total: u32,
    /// References released so far (self, scope, consumers).
    pub fanout_released: u32,
    /// Per-member states (one entry for a single task).
    pub members: Vec<GroupMemberState>,
    /// Its failure, once `Failed`.
    pub failure: Option<Arc<TaskFailure>>,
}

impl TaskSnapshot {
    /// A reclaimed task: only its id and state remain known.
    pub(crate) fn consumed(task: TaskId) -> TaskSnapshot {
        TaskSnapshot {
            task,
            state: TaskState::Consumed,
            worker_type: None,
            is_alloc: false,
            fanin_count: 0,
            fanin_released: 0,
            producers: Vec::new(),
            consumers: Vec::new(),
            fanout_total: 0,
            fanout_released: 0,
            members: Vec::new(),
            failure: None,
        }
    }
}

/// Counters of one engine ([`Engine::stats`](crate::Engine::stats)).
#[derive(Clone, Debug)]
pub struct EngineStats {
    /// The engine's level label.
    pub level: u8,
    /// Scheduler passes run. A pass runs only when an event is delivered (a ready task, a
    /// completion) or the scheduler thread is poked (stop, stall deadline), never in a polling
    /// loop, so this stays constant while nothing happens.
    pub scheduler_iterations: u64,
    /// Members sent to workers.
    pub dispatched: u64,
    /// Member completions processed.
    pub completions: u64,
    /// Slots reclaimed (tasks and allocs).
    pub reclaimed: u64,
    /// Runs begun.
    pub runs_begun: u64,
    /// Ready tasks queued per NEXT_LEVEL worker, in registration order, as of the scheduler's
    /// last pass.
    pub queued_next_level: Vec<u32>,
    /// Ready groups queued, as of the scheduler's last pass.
    pub queued_groups: u32,
    /// Ready SUB tasks queued, as of the scheduler's last pass.
    pub queued_sub: u32,
    /// Ring snapshot.
    pub ring: RingStats,
}

/// An endpoint running a task, as [`Engine::busy`](crate::Engine::busy) reports it: what a
/// wait that does not end is waiting for.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BusyEndpoint {
    /// The endpoint.
    pub worker: WorkerRef,
    /// Its name.
    pub name: String,
    /// The task it runs; `None` when the task ended between the two reads of the snapshot.
    pub task: Option<TaskId>,
}

impl fmt::Display for BusyEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.task {
            Some(t) => write!(f, "{} ({}) running {t}", self.worker, self.name),
            None => write!(f, "{} ({}) finishing a task", self.worker, self.name),
        }
    }
}
