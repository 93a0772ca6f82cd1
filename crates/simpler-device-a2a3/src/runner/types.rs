//! Plain types of the runner's API: pointers, slots, requests, reports and statistics.
//!
//! Step labels (P1–P18, L1–L3, R1–R3, C1–C3) are the run-lifecycle steps defined in
//! `docs/device-runner.md`.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use simpler_types::{CallConfig, RunId, TaskArgs, TaskId};

use super::AcceptanceSignal;
use crate::diag::timing::RunPhases;

/// A device address returned by `malloc` (never 0).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

impl std::fmt::Debug for DevicePtr {
    /// The address in hex: `DevicePtr(0x12c0000)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevicePtr({:#x})", self.0)
    }
}

impl DevicePtr {
    /// The raw address.
    pub fn addr(self) -> u64 {
        self.0
    }

    /// The address `bytes` further on.
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0.wrapping_add(bytes))
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// One of a runner's 64 callable slots.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ChipSlot(pub(crate) u32);

impl ChipSlot {
    /// The slot index, `0..64`.
    pub fn index(self) -> u32 {
        self.0
    }

    /// A slot from an index (for callers that store slots as integers); any value is accepted
    /// and an unregistered one is rejected by the runner with `UnknownCallable`.
    pub fn from_index(index: u32) -> ChipSlot {
        ChipSlot(index)
    }
}

impl fmt::Display for ChipSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slot {}", self.0)
    }
}

/// One run: which callable, with which arguments and configuration (`docs/device-runner.md`).
///
/// Its parts are read through methods and set only by its constructors: a request built with
/// [`with_host_tensors`](Self::with_host_tensors) vouches for the host memory its arguments
/// name, so safe code must not be able to swap those arguments afterwards.
///
/// ```compile_fail
/// # use simpler_device_a2a3::{ChipSlot, RunRequest};
/// # use simpler_types::{CallConfig, RunId, TaskArgs};
/// let (args, other, cfg) = (TaskArgs::new(), TaskArgs::new(), CallConfig::default());
/// let id = RunId::from_raw(1).unwrap();
/// let mut req = RunRequest::new(id, ChipSlot::from_index(0), &args, &cfg);
/// req.args = &other; // the arguments are fixed at construction
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RunRequest<'a> {
    /// The run's id; every error the run produces carries it. A runner refuses an id (with
    /// the same origin) it has already used (`docs/device-runner.md`, "Run ids and empty tensors").
    pub(crate) run_id: RunId,
    /// The registered callable.
    pub(crate) callable: ChipSlot,
    /// The chip entry's arguments.
    pub(crate) args: &'a TaskArgs,
    /// The run's configuration.
    pub(crate) config: &'a CallConfig,
    host_tensors: bool,
    origin: Option<TaskId>,
    acceptance: Option<&'a Arc<AcceptanceSignal>>,
}

impl<'a> RunRequest<'a> {
    /// A request whose tensors are all device memory (`child_memory = 1`, addresses from
    /// `malloc`) or null.
    pub fn new(
        run_id: RunId,
        callable: ChipSlot,
        args: &'a TaskArgs,
        config: &'a CallConfig,
    ) -> Self {
        RunRequest {
            run_id,
            callable,
            args,
            config,
            host_tensors: false,
            origin: None,
            acceptance: None,
        }
    }

    /// A request that may also carry host-memory tensors (`child_memory = 0`), which the runner
    /// stages: views of one tensor (the same `[addr, addr + size)`) share one copy, filled from
    /// the host unless every view of it is a contiguous `Output`/`OutputExisting` over all of
    /// it; after a
    /// successful run the bytes the `InOut`/`Output`/`OutputExisting` views can touch are copied
    /// back, nothing else. Host ranges that overlap without being the same are refused.
    ///
    /// # Safety
    ///
    /// For every non-null host tensor, `[addr, addr + size)` must be host memory of this
    /// process that is readable and writable, and that nothing else reads or writes between
    /// `prepare` and the end of `complete_run` (or the run's failure), for every run this
    /// request or a copy of it is used for.
    pub unsafe fn with_host_tensors(
        run_id: RunId,
        callable: ChipSlot,
        args: &'a TaskArgs,
        config: &'a CallConfig,
    ) -> Self {
        RunRequest {
            run_id,
            callable,
            args,
            config,
            host_tensors: true,
            origin: None,
            acceptance: None,
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> RunId {
        self.run_id
    }

    /// The registered callable.
    pub fn callable(&self) -> ChipSlot {
        self.callable
    }

    /// The chip entry's arguments.
    pub fn args(&self) -> &'a TaskArgs {
        self.args
    }

    /// The run's configuration.
    pub fn config(&self) -> &'a CallConfig {
        self.config
    }

    /// Records the engine task (run and task id one level up) that asked for this device run,
    /// so its report, trace and dependency files can be traced back to it.
    pub fn with_origin(mut self, task: TaskId) -> Self {
        self.origin = Some(task);
        self
    }

    /// Publishes the run's id into `signal` right after both kernels were launched, before
    /// anything waits for the run (`docs/pipelining.md`, "Launch acceptance"); never on a
    /// launch failure. The runner never clears it: the consumer resets it for its next run.
    pub fn with_acceptance(mut self, signal: &'a Arc<AcceptanceSignal>) -> Self {
        self.acceptance = Some(signal);
        self
    }

    /// The acceptance signal the run publishes, if any.
    pub fn acceptance(&self) -> Option<&'a Arc<AcceptanceSignal>> {
        self.acceptance
    }

    /// The engine task that asked for this run, if any.
    pub fn origin(&self) -> Option<TaskId> {
        self.origin
    }

    pub(crate) fn allows_host_tensors(&self) -> bool {
        self.host_tensors
    }
}

/// Peak usage of one ring (`docs/device-chip.md`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct RingHighWater {
    /// Most task-window entries in use.
    pub task_window_max: u64,
    /// Most heap bytes in use.
    pub heap_max: u64,
    /// Most dependency-pool entries in use.
    pub dep_pool_max: u64,
}

/// What a completed run reports.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct RunReport {
    /// The run.
    pub run_id: Option<simpler_types::RunId>,
    /// The engine task one level up that asked for this run (`RunRequest::with_origin`).
    pub origin: Option<TaskId>,
    /// Clusters used.
    pub block_dim: u32,
    /// AICPU threads used.
    pub aicpu_threads: u32,
    /// Tasks in the graph.
    pub tasks: u32,
    /// Dependency edges in the graph.
    pub edges: u64,
    /// Device wall time: AICore launch to the last AICPU thread's end (`None` if not captured).
    pub device_wall: Option<Duration>,
    /// Where the device time went.
    pub phases: Option<RunPhases>,
    /// Ring high-water marks (host_build_graph uses ring 0 only).
    pub rings: [RingHighWater; 4],
    /// Tensor-map entries at the peak.
    pub tensormap_max: u64,
    /// tensormap_and_ringbuffer: the device reset only what the previous run over the same
    /// arena used, rather than the whole arena (`docs/device-trb.md`, "Reusing an arena").
    pub arena_reused: bool,
    /// Swimlane records dropped because a core's buffer was full.
    pub swimlane_dropped: u64,
    /// Files written under `output_prefix`.
    pub outputs: Vec<PathBuf>,
    /// Non-fatal problems (export failures, disabled captures).
    pub warnings: Vec<String>,
    /// Whether the run was prepared while another run executed, and if not, why.
    pub overlap: Overlap,
}

/// How a run's preparation related to the run executing before it (`docs/pipelining.md`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Overlap {
    /// No run was executing when this one was prepared (nothing to overlap with).
    #[default]
    NothingInFlight,
    /// Prepared while run `with` executed on the device.
    Overlapped {
        /// The run that was executing: the last one launched (with device queueing, the runs
        /// launched before it are on the device ahead of it).
        with: RunId,
    },
    /// Prepared while run `with` executed, but part of the preparation waited for the device
    /// to finish it (and every run launched before it): `reason`.
    Waited {
        /// The last run that was executing.
        with: RunId,
        /// What had to wait.
        reason: &'static str,
    },
    /// The run needs exclusive use of the runner (a diagnostic reads whole-device state), so
    /// it was prepared with no other run in progress.
    Exclusive {
        /// What needed exclusive use.
        reason: &'static str,
    },
}

/// Device memory by use (the chip worker's memory accounting reads it).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct MemoryLedger {
    /// Bytes committed in total.
    pub committed: u64,
    /// Bytes of user allocations.
    pub user_allocations: u64,
    /// Bytes of pooled arenas (heap, runtime image, staging).
    pub pooled_arenas: u64,
    /// Bytes of runtime buffers (kernel arguments, register table, chip buffers).
    pub runtime_buffers: u64,
}

/// Counters of a runner (`docs/device-runner.md`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[non_exhaustive]
pub struct RunnerStats {
    /// Callables registered over the runner's life.
    pub registrations: u64,
    /// Chip buffers uploaded.
    pub chip_buffer_uploads: u64,
    /// Registrations that reused an identical chip buffer.
    pub chip_buffer_dedupe_hits: u64,
    /// Runs that reused the cached arenas.
    pub arena_cache_hits: u64,
    /// Runs that had to (re)allocate an arena.
    pub arena_cache_misses: u64,
    /// AICore launches.
    pub aicore_launches: u64,
    /// AICPU launches.
    pub aicpu_launches: u64,
    /// Runs that completed successfully.
    pub runs_completed: u64,
    /// Terminal cleanups that released a run's resources (one per run that got past P5).
    pub terminal_cleanups: u64,
    /// Recover-or-mark-unusable passes that drained the device (once each; none after a drain
    /// given the whole stream-sync budget found the device still busy).
    pub recoveries: u64,
    /// Export passes (at most one per run).
    pub exports: u64,
    /// Live user allocations (runs allocate nothing outside the pooled arenas, which the
    /// ledger reports), so this is what a leak would change.
    pub live_allocations: u64,
    /// Simulated threads spawned over the device's life.
    pub sim_threads_spawned: u32,
    /// Simulated threads alive.
    pub sim_threads_alive: u32,
    /// Simulated threads parked on their mailbox.
    pub sim_threads_parked: u32,
    /// Device memory by use.
    pub memory: MemoryLedger,
}

/// What `finalize` did.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct FinalizeReport {
    /// Device allocations freed.
    pub freed_allocations: usize,
    /// Simulated threads stuck in user code that had to be detached (the one leak allowed).
    pub stuck_threads: Vec<String>,
    /// A run that was still prepared or in flight and got cleaned up.
    pub abandoned_run: Option<RunId>,
}
