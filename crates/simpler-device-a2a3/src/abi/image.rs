//! The host_build_graph runtime image (`docs/device-chip.md`).
//!
//! One contiguous region holds everything the AICPU scheduler and the AICore executor need for
//! one run. Every internal reference is an offset from the image base, so the host builds the
//! image in ordinary memory and uploads it byte for byte, with no pointer relocation. The
//! sections, in order (each 64-byte aligned):
//!
//! | Section | Contents |
//! |---|---|
//! | header | [`ImageHeader`]: counts and section offsets |
//! | handshake | [`Handshake`] × launch cores (`num_aicore`, at least 1) |
//! | func table | `u64` × 1024: device address of each func id's kernel (0 = unset) |
//! | shared | [`SharedHeader`]: latched status, stall details, progress counters |
//! | tasks | [`TaskRecord`] × task count |
//! | edges | `u32` × edge count: fanout lists (consumer task indices) |
//! | args | per task, its tensor descriptors (128 B each) then its scalars (`u64` each) |
//! | ready | [`ReadyQueueHeader`] × 4 (one per [`TaskShape`]), then each queue's `u64` cells |
//! | cores | [`CoreSlot`] × launch cores |
//! | payloads | [`PayloadPair`] × launch cores |
//! | swimlane | per launched core: [`SwimlaneHeader`] then [`SwimlaneRecord`] × capacity |
//! | phases | [`PhaseRecord`] × 4 (one per AICPU thread) |
//! | AICPU swimlane | per AICPU thread: [`SwimlaneHeader`] then [`AicpuRecord`] × capacity |
//!
//! Writers and readers of the atomic fields are documented on each type. The host writes the
//! whole image before the launch and reads the shared header, handshake records, swimlane and
//! phase sections after both streams completed; stream completion orders those accesses.
//!
//! Step labels (P1–P18, L1–L3, R1–R3, C1–C3) are the run-lifecycle steps defined in
//! `docs/device-runner.md`.

use core::mem::{align_of, offset_of, size_of};
use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64};

use super::MAX_LAUNCH_CORES;
use super::handshake::Handshake;
use super::payload::PayloadPair;

/// `ImageHeader::magic` of a host_build_graph image ("HBG1").
pub const HBG_IMAGE_MAGIC: u32 = 0x3147_4248;
/// `ImageHeader::magic` of a tensormap_and_ringbuffer image ("TRB1").
pub const TRB_IMAGE_MAGIC: u32 = 0x3142_5254;
/// AICPU threads an image has phase records for.
pub const MAX_PHASE_THREADS: usize = 4;
/// Number of ready queues: one per [`TaskShape`], indexed by its value.
pub const READY_QUEUE_COUNT: usize = 4;
/// Marks an unset func id in [`TaskRecord::func_ids`].
pub const NO_FUNC: i32 = -1;
/// Most blocks of one task; both runtimes refuse more. With at most three members per block,
/// the member count of a task (blocks × members) stays far inside a `u32`.
pub const MAX_BLOCK_NUM: u32 = 1 << 16;
/// Alignment of every image section.
pub const SECTION_ALIGN: u64 = 64;

/// How a task occupies cores.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u32)]
pub enum TaskShape {
    /// Kernels on several cores of one cluster per block; needs a whole idle cluster.
    Mix = 0,
    /// One AIC kernel per block.
    Aic = 1,
    /// One AIV kernel per block.
    Aiv = 2,
    /// No kernel: completes as soon as it is ready (dependency-only task).
    Dummy = 3,
}

impl TaskShape {
    /// The shape a raw value names.
    pub const fn from_u32(v: u32) -> Option<TaskShape> {
        match v {
            0 => Some(TaskShape::Mix),
            1 => Some(TaskShape::Aic),
            2 => Some(TaskShape::Aiv),
            3 => Some(TaskShape::Dummy),
            _ => None,
        }
    }

    /// Short name used in diagnostics.
    pub const fn name(self) -> &'static str {
        match self {
            TaskShape::Mix => "MIX",
            TaskShape::Aic => "AIC",
            TaskShape::Aiv => "AIV",
            TaskShape::Dummy => "DUMMY",
        }
    }
}

/// The image header: counts and section offsets. Written by the host only; plain data without
/// padding, so the writer copies [`bytemuck::bytes_of`] of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub struct ImageHeader {
    /// [`HBG_IMAGE_MAGIC`].
    pub magic: u32,
    /// [`ABI_VERSION`](super::ABI_VERSION).
    pub abi_version: u32,
    /// Total image length in bytes.
    pub image_len: u64,
    /// Clusters of the launch.
    pub block_dim: u32,
    /// Cores of the launch (`3 * block_dim`).
    pub num_aicore: u32,
    /// AICPU threads of the launch.
    pub aicpu_threads: u32,
    /// Tasks in the graph.
    pub task_count: u32,
    /// Entries of the edge section.
    pub edge_count: u32,
    /// Profiling flag bits (`launch::PROFILE_*`).
    pub profiling: u32,
    /// Stamp of the active callable (slot and registration generation, P13).
    pub active_callable: u64,
    /// Offset of the handshake section.
    pub handshake_off: u64,
    /// Offset of the func table.
    pub func_table_off: u64,
    /// Offset of the shared header.
    pub shared_off: u64,
    /// Offset of the task records.
    pub tasks_off: u64,
    /// Offset of the edge section.
    pub edges_off: u64,
    /// Offset of the ready-queue headers (cells follow them).
    pub ready_off: u64,
    /// Offset of the core slots.
    pub cores_off: u64,
    /// Offset of the payload pairs.
    pub payloads_off: u64,
    /// Offset of the swimlane section.
    pub swimlane_off: u64,
    /// Swimlane records per core (0 = swimlane off).
    pub swimlane_capacity: u32,
    /// `CallConfig::swimlane` level (0 off … 4).
    pub swimlane_level: u32,
    /// Offset of the phase records.
    pub phases_off: u64,
    /// Offset of the AICPU dispatch records (one block per AICPU thread).
    pub aicpu_swimlane_off: u64,
    /// AICPU dispatch records per thread (0 = not captured; swimlane level 2 and up).
    pub aicpu_swimlane_capacity: u32,
    /// Padding.
    pub reserved0: u32,
    /// Offset of the runtime's own section ([`TrbHeader`] in a trb image; 0 in an hbg image).
    pub runtime_off: u64,
    /// Padding to three cache lines (no implicit padding anywhere in the image).
    pub reserved1: [u64; 4],
}

const _: () = {
    assert!(size_of::<ImageHeader>() == 192);
    assert!(offset_of!(ImageHeader, handshake_off) == 48);
    assert!(offset_of!(ImageHeader, phases_off) == 128);
};

/// Status shared by every AICPU thread and read by the host after the run (`docs/device-chip.md`).
///
/// | Field | Written by | Read by |
/// |---|---|---|
/// | `ready_published` | boot thread (release, once) | other AICPU threads (acquire) |
/// | `orch_done` | boot thread (hbg: at boot) | schedulers, stall classification |
/// | `orch_error_code` | host builder (hbg) | host |
/// | `sched_error_code` | first scheduler thread to latch (CAS 0 → code) | all AICPU threads, host |
/// | stall fields | the latching thread, before nothing else (host reads after the run) | host |
/// | `completed_tasks` | any scheduler thread on task completion | all schedulers (termination) |
/// | `progress` | any scheduler thread on completion or dispatch | all schedulers (watchdog) |
/// | `running` | schedulers (dispatch +1, completion −1) | stall classification |
/// | `abort` | a thread that gave up (handshake failure) | all schedulers |
/// | `aicpu_claim` | each AICPU program exec participant (one `fetch_add`) | the same |
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct SharedHeader {
    /// 1 once the boot step finished and ready queues are seeded.
    pub ready_published: AtomicU32,
    /// 1 once orchestration is complete (hbg: always at boot).
    pub orch_done: AtomicU32,
    /// Latched orchestration code (0 = none).
    pub orch_error_code: AtomicI32,
    /// Latched scheduler code (0 = none).
    pub sched_error_code: AtomicI32,
    /// AICPU thread that latched the scheduler code.
    pub error_thread: AtomicU32,
    /// [`StallClass`](super::codes::StallClass) of a scheduler timeout.
    pub stall_class: AtomicU32,
    /// Core index + 1 of the stuck core (0 = none).
    pub stuck_core: AtomicU32,
    /// Tasks completed so far.
    pub completed_tasks: AtomicU32,
    /// Device task id of the stuck task (`u64::MAX` = none).
    pub stuck_task: AtomicU64,
    /// Bumped on every dispatch and completion; the no-progress watchdog watches it.
    pub progress: AtomicU64,
    /// Member dispatches currently on cores.
    pub running: AtomicU32,
    /// Ready tasks at the time of a stall latch.
    pub stall_ready: AtomicU32,
    /// Running dispatches at the time of a stall latch.
    pub stall_running: AtomicU32,
    /// Waiting tasks at the time of a stall latch.
    pub stall_waiting: AtomicU32,
    /// Failing ring of an orchestration capacity error (`u32::MAX` = none).
    pub fault_ring: AtomicU32,
    /// Non-zero once a thread gave up on the run without a runtime code (a handshake
    /// failure); every scheduler stops and shuts its cores down.
    pub abort: AtomicU32,
    /// Ring sizes at a capacity failure: task window, heap bytes, dep pool.
    pub fault_sizes: [AtomicU64; 3],
    /// Ring usage at a capacity failure, in the same order; for `OVERLAPPING_ARGUMENTS` the
    /// refused task's index, the written and the other argument's index.
    pub fault_usage: [AtomicU64; 3],
    /// Thread-index claims of the AICPU program: each exec participant takes
    /// `fetch_add(1) % aicpu_threads` (every launch starts exactly that many participants, so
    /// the indices of one launch are distinct whatever the counter held before).
    pub aicpu_claim: AtomicU32,
    /// Padding to two cache lines (no implicit padding anywhere in the image).
    pub reserved1: u32,
}

const _: () = {
    assert!(size_of::<SharedHeader>() == 128);
    assert!(align_of::<SharedHeader>() == 64);
};

/// One task of the resident graph (two cache lines; the second holds the fields schedulers
/// modify, so reading the first never contends with them).
///
/// Line 0 is written by the host only. Line 1:
///
/// | Field | Written by | Read by |
/// |---|---|---|
/// | `fanin_refcount` | boot thread (reset to `fanin_count`); a producer's completing thread (`fetch_sub`, AcqRel) | the thread whose decrement reached 0 pushes the task |
/// | `members_remaining` | boot thread (reset); the dispatching thread's completions (`fetch_sub`, AcqRel) | the thread whose decrement reached 0 completes the task |
#[derive(Debug)]
#[repr(C, align(64))]
pub struct TaskRecord {
    /// [`DeviceTaskId`](simpler_types::DeviceTaskId) raw value.
    pub task_id: u64,
    /// Func ids of the AIC, AIV0 and AIV1 kernels ([`NO_FUNC`] = none).
    pub func_ids: [i32; 3],
    /// [`TaskShape`] as `u32`.
    pub shape: u32,
    /// Blocks to run.
    pub block_num: u32,
    /// Tensor arguments.
    pub num_tensors: u32,
    /// Scalar arguments.
    pub num_scalars: u32,
    /// Producers this task waits for.
    pub fanin_count: u32,
    /// First entry of this task's fanout list in the edge section.
    pub fanout_start: u32,
    /// Entries of the fanout list.
    pub fanout_count: u32,
    /// Image offset of the tensor descriptors; the scalars follow them.
    pub args_off: u64,
    /// Padding to the end of line 0.
    pub reserved0: [u64; 1],
    /// Producers not yet completed.
    pub fanin_refcount: AtomicU32,
    /// Member dispatches (blocks × kernels per block) not yet finished.
    pub members_remaining: AtomicU32,
    /// Padding to 128 bytes.
    pub reserved1: [u32; 14],
}

const _: () = {
    assert!(size_of::<TaskRecord>() == 128);
    assert!(offset_of!(TaskRecord, args_off) == 48);
    assert!(offset_of!(TaskRecord, fanin_refcount) == 64);
};

/// Header of one ready queue. The queue is push-once: every block of a task enters the queue of
/// its shape exactly once per run, so a queue sized to the blocks of its shape never wraps.
/// A cell holds `((task << 32) | block) + 1`; 0 means "reserved, not yet written".
///
/// | Field | Written by | Read by |
/// |---|---|---|
/// | `tail` | pushers (`fetch_add` reserves a cell) | poppers (bound) |
/// | `head` | poppers (CAS claims the cell at `head`) | poppers |
/// | cells | the pusher that reserved the cell (release store) | the popper that claims it (acquire) |
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct ReadyQueueHeader {
    /// Next cell to claim.
    pub head: AtomicU32,
    /// Padding: `head` and `tail` live on different cache lines.
    pub reserved0: [u32; 15],
    /// Next cell to reserve.
    pub tail: AtomicU32,
    /// Number of cells.
    pub capacity: u32,
    /// Image offset of the cells.
    pub cells_off: u64,
    /// Padding.
    pub reserved1: [u32; 12],
}

const _: () = assert!(size_of::<ReadyQueueHeader>() == 128);

/// Per-core state visible to every AICPU thread (stall reports) and the host.
///
/// `running_task` is written by the owning scheduler thread (dispatch and completion) and read
/// by any thread classifying a stall and by the host afterwards; `dispatched` is written by the
/// owner only.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct CoreSlot {
    /// Device task id + 1 of the task running on the core (0 = idle).
    pub running_task: AtomicU64,
    /// Dispatches made to this core in this run.
    pub dispatched: AtomicU32,
    /// Padding.
    pub reserved: [u32; 13],
}

const _: () = assert!(size_of::<CoreSlot>() == 64);

/// Header of one core's swimlane buffer. Written by the core (the only writer), read by the
/// host after the run.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct SwimlaneHeader {
    /// Records written.
    pub count: AtomicU32,
    /// Records that did not fit (counted, never silent).
    pub dropped: AtomicU32,
    /// Padding.
    pub reserved: [u32; 14],
}

const _: () = assert!(size_of::<SwimlaneHeader>() == 64);

/// One AICore dispatch as the core saw it (50 MHz counter values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct SwimlaneRecord {
    /// Device task id.
    pub task_id: u64,
    /// Dispatch token.
    pub token: u32,
    /// Func id of the kernel.
    pub func_id: u32,
    /// Counter at kernel entry.
    pub start: u64,
    /// Counter at kernel exit.
    pub end: u64,
    /// Block index of the dispatch.
    pub block_idx: u32,
    /// Padding.
    pub reserved: u32,
}

const _: () = assert!(size_of::<SwimlaneRecord>() == 40);

/// One dispatch as its AICPU thread saw it (swimlane level 2): when the token was written and
/// when the thread observed its completion (50 MHz counter values). Written by that thread only
/// (its block's header counts them); read by the host after the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct AicpuRecord {
    /// Device task id.
    pub task_id: u64,
    /// Core the token went to.
    pub core: u32,
    /// The token.
    pub token: u32,
    /// Counter when the token was written.
    pub dispatch: u64,
    /// Counter when the completion was observed (0 = never).
    pub finish: u64,
}

const _: () = assert!(size_of::<AicpuRecord>() == 32);

/// Bytes of one AICPU thread's record block (header plus records, rounded up).
pub const fn aicpu_swimlane_block_bytes(capacity: u32) -> u64 {
    align_up(
        size_of::<SwimlaneHeader>() as u64 + capacity as u64 * size_of::<AicpuRecord>() as u64,
        SECTION_ALIGN,
    )
}

/// Phase counters of one AICPU thread (50 MHz counter values; 0 = not reached). Written by that
/// thread only, read by the host after the run.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct PhaseRecord {
    /// Entry into `exec`.
    pub start: AtomicU64,
    /// Boot (hbg) or orchestration finished.
    pub orchestration_end: AtomicU64,
    /// Handshake with every owned core finished.
    pub handshake_end: AtomicU64,
    /// Scheduling loop left.
    pub scheduling_end: AtomicU64,
    /// Return from `exec`.
    pub end: AtomicU64,
    /// Tasks this thread completed.
    pub tasks_completed: AtomicU64,
    /// Padding.
    pub reserved: [u64; 2],
}

const _: () = assert!(size_of::<PhaseRecord>() == 64);

/// The runtime section of a tensormap_and_ringbuffer image: where the AICPU threads find the
/// orchestration, its arguments and the arena (`docs/device-trb.md`). Written by the host only.
///
/// The arguments are `num_tensors` descriptors (128 bytes each), then `num_tensors` tags
/// (`i32` wire values), then `num_scalars` scalars, starting at `args_off` (the scalars 8-byte
/// aligned).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub struct TrbHeader {
    /// Device address of the orchestration entry: a `NativeOrchFn` or a C entry, as
    /// `orch_kind` says.
    pub orch_entry: u64,
    /// Device address of the arena (1024-aligned).
    pub arena_base: u64,
    /// Bytes of the arena.
    pub arena_len: u64,
    /// Task slots per ring.
    pub task_window: [u32; 4],
    /// Dependency entries per ring.
    pub dep_pool: [u32; 4],
    /// Heap bytes per ring.
    pub heap_bytes: [u64; 4],
    /// Tensor-map entries.
    pub map_entries: u32,
    /// Tensor-map buckets.
    pub map_buckets: u32,
    /// Tensor arguments of the orchestration.
    pub num_tensors: u32,
    /// Scalar arguments of the orchestration.
    pub num_scalars: u32,
    /// Image offset of the orchestration's arguments.
    pub args_off: u64,
    /// Image offset of the [`TrbStatus`].
    pub status_off: u64,
    /// Image offset of the [`TrbDiagHeader`] and its records (0 = no diagnostics).
    pub diag_off: u64,
    /// Device address of the C config function (`ORCH_KIND_C`; 0 otherwise).
    pub orch_config: u64,
    /// [`ORCH_KIND_NATIVE`] or [`ORCH_KIND_C`].
    pub orch_kind: u32,
    /// 1 when the arena is the allocation the previous run of the same resource slot used,
    /// untouched since: the device may then reset only what that run's reuse record names
    /// (`docs/device-trb.md`); 0 makes it reset every section.
    pub arena_kept: u32,
    /// Image offset of the callable's [`KernelArity`] records, in ascending func id.
    pub kernels_off: u64,
    /// Records at `kernels_off`.
    pub kernel_count: u32,
    /// Padding.
    pub reserved0: u32,
    /// Padding.
    pub reserved1: [u64; 4],
}

const _: () = assert!(size_of::<TrbHeader>() == 192);
const _: () = assert!(core::mem::offset_of!(TrbHeader, orch_config) == 128);
const _: () = assert!(core::mem::offset_of!(TrbHeader, orch_kind) == 136);

/// What one kernel's signature says of the arguments a task must pass it: a submit naming the
/// kernel is refused unless its tensors, their tags and its scalars match.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct KernelArity {
    /// The kernel's func id.
    pub func_id: u32,
    /// Tensor arguments (the signature's entries other than scalars).
    pub tensors: u16,
    /// Scalar arguments.
    pub scalars: u16,
    /// Bit `i`: the kernel reads tensor `i`.
    pub reads: u32,
    /// Bit `i`: the kernel writes tensor `i`.
    pub writes: u32,
}

const _: () = assert!(size_of::<KernelArity>() == 16);

/// `TrbHeader::orch_kind`: `orch_entry` is a Rust `NativeOrchFn` of the program running the
/// image (the simulator).
pub const ORCH_KIND_NATIVE: u32 = 0;
/// `TrbHeader::orch_kind`: `orch_entry` and `orch_config` are the C functions of an
/// orchestration object the AICPU side loaded at registration (`docs/device-trb.md`).
pub const ORCH_KIND_C: u32 = 1;

/// Bytes of message text a [`TrbStatus`] holds.
pub const TRB_MESSAGE_BYTES: usize = 256;

/// What the trb orchestration thread reports: its task count, the rings' high-water marks and
/// the text of a latched error. Written by that thread only (the code itself and the failing
/// ring's sizes and usage go to the [`SharedHeader`]); read by the schedulers (`submitted`,
/// after `orch_done`) and by the host after the run.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct TrbStatus {
    /// Tasks the orchestration submitted; final once `SharedHeader::orch_done` is set.
    pub submitted: AtomicU64,
    /// Bytes of `message` in use.
    pub message_len: AtomicU32,
    /// 1 when the run reset only what the previous run over its arena used, 0 when it reset
    /// every section (or never reached the reset).
    pub arena_partial_reset: AtomicU32,
    /// Per ring, the high-water marks of task slots, heap bytes and dependency entries.
    pub peaks: [[AtomicU64; 3]; 4],
    /// High-water mark of live tensor-map entries.
    pub map_peak: AtomicU64,
    /// Padding.
    pub reserved1: [u64; 1],
    /// The latched error's text, eight bytes per word (little-endian).
    pub message: [AtomicU64; TRB_MESSAGE_BYTES / 8],
}

const _: () = assert!(size_of::<TrbStatus>() == 128 + TRB_MESSAGE_BYTES);

/// The trb orchestration thread's diagnostic records (`docs/device-trb.md`): scope begin/end
/// records (`scope_stats`, and `dep_gen` for its replay) and submit records (`dep_gen`), in
/// fixed blocks that follow this header: `scope_capacity` [`ScopeRecord`]s, then
/// `submit_capacity` [`SubmitRecord`]s. Capacities are written by the host; the counts by the
/// orchestration thread only (a full block counts the record dropped); the host reads them
/// after the run.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct TrbDiagHeader {
    /// Scope records the block holds (0 = none recorded).
    pub scope_capacity: u32,
    /// Submit records the block holds (0 = none recorded).
    pub submit_capacity: u32,
    /// Scope records written.
    pub scope_count: AtomicU32,
    /// Scope events that did not fit.
    pub scope_dropped: AtomicU32,
    /// Submit records written.
    pub submit_count: AtomicU32,
    /// Submits that did not fit.
    pub submit_dropped: AtomicU32,
    /// Padding to one cache line.
    pub reserved: [u32; 10],
}

const _: () = assert!(size_of::<TrbDiagHeader>() == 64);

/// One scope begin or end as the trb orchestration saw it: the ring the scope's tasks go to and
/// its usage at that moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct ScopeRecord {
    /// 1 = begin, 0 = end.
    pub begin: u32,
    /// Scope depth (the outer scope is 0, a user scope at top level 1).
    pub depth: u32,
    /// The ring the scope's tasks go to.
    pub ring: u32,
    /// Live tensor-map entries.
    pub tensormap: u32,
    /// Tasks submitted before this event (orders it among the submit records).
    pub submitted: u64,
    /// The ring's unreclaimed task slots.
    pub task_window: u64,
    /// The ring's occupied heap bytes.
    pub heap: u64,
    /// The ring's unreclaimed dependency entries.
    pub dep_pool: u64,
}

const _: () = assert!(size_of::<ScopeRecord>() == 48);

/// Producers a [`SubmitRecord`] lists.
pub const SUBMIT_RECORD_PRODUCERS: usize = 16;
/// Set in a listed producer the task found already finished and does not wait for (a device
/// task id uses the low 40 bits).
pub const FINISHED_PRODUCER: u64 = 1 << 63;
/// Tensor arguments a [`SubmitRecord`] holds (a trb task's maximum).
pub const SUBMIT_RECORD_TENSORS: usize = 16;

/// One submitted trb task as the orchestration thread wired it: its kernels, its tensor
/// arguments and tags, and the producers the device's tensor map found for it.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct SubmitRecord {
    /// Device task id.
    pub task_id: u64,
    /// Scope depth at the submit.
    pub scope_depth: u32,
    /// `TaskShape` as `u32`.
    pub shape: u32,
    /// Func ids of the AIC, AIV0 and AIV1 kernels.
    pub func_ids: [i32; 3],
    /// Blocks.
    pub block_num: u32,
    /// Tensor arguments (≤ [`SUBMIT_RECORD_TENSORS`]).
    pub num_tensors: u32,
    /// Producers the tensor map found (may exceed the [`SUBMIT_RECORD_PRODUCERS`] listed): the
    /// ones waited for, then those found finished.
    pub num_producers: u32,
    /// Padding to the producers.
    pub reserved: [u32; 6],
    /// The first producers, as device task ids; one found finished has [`FINISHED_PRODUCER`] set.
    pub producers: [u64; SUBMIT_RECORD_PRODUCERS],
    /// Wire value of each tensor's tag.
    pub tags: [i32; SUBMIT_RECORD_TENSORS],
    /// Tensor descriptors (128 bytes each).
    pub tensors: [[u8; 128]; SUBMIT_RECORD_TENSORS],
}

const _: () = assert!(size_of::<SubmitRecord>() == 64 + 8 * 16 + 4 * 16 + 128 * 16);

/// Bytes of a trb diagnostics section of the given capacities.
pub const fn trb_diag_bytes(scope_capacity: u32, submit_capacity: u32) -> u64 {
    align_up(
        size_of::<TrbDiagHeader>() as u64
            + scope_capacity as u64 * size_of::<ScopeRecord>() as u64
            + submit_capacity as u64 * size_of::<SubmitRecord>() as u64,
        SECTION_ALIGN,
    )
}

/// Sizing inputs of an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageParams {
    /// Tasks in the graph.
    pub task_count: u32,
    /// Edges in the graph.
    pub edge_count: u32,
    /// Bytes of the argument section.
    pub args_bytes: u64,
    /// Cores of the launch; the swimlane section has a block for each.
    pub num_aicore: u32,
    /// Cells of each ready queue (blocks of the tasks of that shape).
    pub queue_capacity: [u32; READY_QUEUE_COUNT],
    /// Swimlane records per core (0 = off).
    pub swimlane_capacity: u32,
    /// AICPU dispatch records per AICPU thread (0 = off).
    pub aicpu_swimlane_capacity: u32,
}

/// Section offsets of an image, computed identically by the host and checked by the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageLayout {
    /// Offset of the handshake section.
    pub handshake_off: u64,
    /// Offset of the func table.
    pub func_table_off: u64,
    /// Offset of the shared header.
    pub shared_off: u64,
    /// Offset of the task records.
    pub tasks_off: u64,
    /// Offset of the edge section.
    pub edges_off: u64,
    /// Offset of the argument section.
    pub args_off: u64,
    /// Offset of the ready-queue headers.
    pub ready_off: u64,
    /// Offsets of the ready queues' cells.
    pub ready_cells_off: [u64; READY_QUEUE_COUNT],
    /// Offset of the core slots.
    pub cores_off: u64,
    /// Offset of the payload pairs.
    pub payloads_off: u64,
    /// Offset of the swimlane section.
    pub swimlane_off: u64,
    /// Offset of the phase records.
    pub phases_off: u64,
    /// Offset of the AICPU dispatch records.
    pub aicpu_swimlane_off: u64,
    /// Total length.
    pub len: u64,
}

const fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Bytes of one core's swimlane block (header plus records, rounded to the section alignment).
pub const fn swimlane_block_bytes(capacity: u32) -> u64 {
    align_up(
        size_of::<SwimlaneHeader>() as u64 + capacity as u64 * size_of::<SwimlaneRecord>() as u64,
        SECTION_ALIGN,
    )
}

/// How many handshake, core-slot and payload records an image for `num_aicore` cores holds:
/// one per core, at least one, at most [`MAX_LAUNCH_CORES`].
pub fn launch_cores(num_aicore: u32) -> u32 {
    num_aicore.clamp(1, MAX_LAUNCH_CORES as u32)
}

impl ImageLayout {
    /// Computes the layout; `None` if the sizes overflow `u64`.
    pub fn compute(p: &ImageParams) -> Option<ImageLayout> {
        let mut at = size_of::<ImageHeader>() as u64;
        let mut take = |bytes: u64| -> Option<u64> {
            let off = at;
            at = align_up(at.checked_add(bytes)?, SECTION_ALIGN);
            Some(off)
        };
        // Records for the launch's cores only (at least one), not for all the chip has.
        let cores = u64::from(launch_cores(p.num_aicore));
        let handshake_off = take(cores * size_of::<Handshake>() as u64)?;
        let func_table_off = take(super::MAX_FUNC_IDS as u64 * 8)?;
        let shared_off = take(size_of::<SharedHeader>() as u64)?;
        // At least one record, zeroed and never written for an empty graph, so a view can
        // always clamp a task index into the section (`ImageView::task`).
        let task_records = u64::from(p.task_count.max(1));
        let tasks_off = take(task_records.checked_mul(size_of::<TaskRecord>() as u64)?)?;
        let edges_off = take(u64::from(p.edge_count) * 4)?;
        let args_off = take(p.args_bytes)?;
        let ready_off = take(READY_QUEUE_COUNT as u64 * size_of::<ReadyQueueHeader>() as u64)?;
        let mut ready_cells_off = [0u64; READY_QUEUE_COUNT];
        for (cell, cap) in ready_cells_off.iter_mut().zip(p.queue_capacity) {
            *cell = take(u64::from(cap) * 8)?;
        }
        let cores_off = take(cores * size_of::<CoreSlot>() as u64)?;
        let payloads_off = take(cores * size_of::<PayloadPair>() as u64)?;
        let swimlane_off =
            take(u64::from(p.num_aicore).checked_mul(swimlane_block_bytes(p.swimlane_capacity))?)?;
        let phases_off = take(MAX_PHASE_THREADS as u64 * size_of::<PhaseRecord>() as u64)?;
        let aicpu_swimlane_off =
            take(MAX_PHASE_THREADS as u64 * aicpu_swimlane_block_bytes(p.aicpu_swimlane_capacity))?;
        Some(ImageLayout {
            handshake_off,
            func_table_off,
            shared_off,
            tasks_off,
            edges_off,
            args_off,
            ready_off,
            ready_cells_off,
            cores_off,
            payloads_off,
            swimlane_off,
            phases_off,
            aicpu_swimlane_off,
            len: at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_sections_are_aligned_and_ordered() {
        let l = ImageLayout::compute(&ImageParams {
            task_count: 5,
            edge_count: 7,
            args_bytes: 1000,
            num_aicore: 6,
            queue_capacity: [1, 2, 3, 4],
            swimlane_capacity: 3,
            aicpu_swimlane_capacity: 2,
        })
        .unwrap();
        let offs = [
            l.handshake_off,
            l.func_table_off,
            l.shared_off,
            l.tasks_off,
            l.edges_off,
            l.args_off,
            l.ready_off,
            l.ready_cells_off[0],
            l.ready_cells_off[1],
            l.ready_cells_off[2],
            l.ready_cells_off[3],
            l.cores_off,
            l.payloads_off,
            l.swimlane_off,
            l.phases_off,
            l.aicpu_swimlane_off,
            l.len,
        ];
        for w in offs.windows(2) {
            assert!(w[0] <= w[1]);
        }
        assert!(offs.iter().all(|o| o % SECTION_ALIGN == 0));
        assert_eq!(l.handshake_off, 192);
    }
}
