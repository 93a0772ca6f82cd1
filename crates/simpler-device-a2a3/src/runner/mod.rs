//! `DeviceRunner`: one chip behind prepare → `launch_run` → `reap_run` → `complete_run`
//! (spec §3).
//!
//! Run-state protocol (one run at a time; spec §3.1 "Busy"):
//!
//! 1. `prepare` (P1–P18) takes the runner from *idle* to *prepared*, or back to *idle* with the
//!    run's terminal cleanup done and an error.
//! 2. `launch_run` (L1–L3) takes *prepared* to *launched*: the AICore kernel first, then the
//!    AICPU kernel, with no synchronisation and no cleanup on success. A launch failure runs
//!    recover-or-mark-unusable and the terminal cleanup and returns to *idle*.
//! 3. `reap_run` (R1–R3) takes *launched* to *reaped*. It takes no arguments and reads only the
//!    in-flight run record, so a later change can defer it. A sync failure runs
//!    recover-or-mark-unusable and the terminal cleanup and returns to *idle*.
//! 4. `complete_run` (C1–C3) takes *reaped* back to *idle*: handshake report, latched status,
//!    copy-back, terminal cleanup.
//!
//! Calls out of order return `Busy`. The terminal cleanup (`finish`) has one latch per step
//! (stop collectors, export, release), so it runs at most once per step whichever path reaches
//! it first — a failure, success, `abandon_prepared`, `finalize` or `Drop`. Each step works on
//! the run taken out of the runner under a guard (`FinishOnUnwind`) that runs the cleanup if the
//! thread unwinds, so a panic inside a step cannot skip it. User code called on the host (the
//! orchestration's config function and entry) runs inside `catch_unwind` and becomes
//! `Orchestration`.
//!
//! Memory calls that read or write device memory (`free`, copies, `memset`) are refused with
//! `Busy` while a run is launched and not yet reaped: the simulated cores may be using that
//! memory (decision). `free` is refused from `prepare` on: the prepared image already holds the
//! addresses of the run's tensors, so freeing one of them would hand the launch a dangling
//! pointer (decision: refusing every `free` is simpler to reason about than tracking which
//! allocations the image references, and a caller that needs to free can `abandon_prepared`).

mod callables;
mod health;
mod staging;
mod types;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::{offset_of, size_of};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use simpler_types::{CallConfig, DeviceTaskId, RunId, Tensor, TensorArgType};

pub use health::{DeviceHealth, HealthProbe};
pub use types::{
    ChipSlot, DevicePtr, FinalizeReport, MemoryLedger, RingHighWater, RunReport, RunRequest,
    RunnerStats,
};

use self::callables::{
    CallableTable, ChipBuffer, Registered, chip_buffer_bytes, fnv1a64, func_table_of,
    resolve_for_sim,
};
use self::health::HealthCell;
use self::staging::{StagedTensor, host_slice, host_slice_mut};
use crate::abi::codes::{AclCode, RuntimeCode, StallClass};
use crate::abi::handshake::Handshake;
use crate::abi::image::{ImageLayout, SharedHeader};
use crate::abi::launch::{
    InitArgs, KernelArgs, PROFILE_DEP_GEN, PROFILE_SCOPE_STATS, PROFILE_SWIMLANE,
};
use crate::abi::{
    ABI_VERSION, CoreType, DEFAULT_AICPU_THREADS, MAX_AICPU_THREADS, MAX_BLOCK_DIM,
    MAX_CALLABLE_SLOTS, WorkerPlace,
};
use crate::backend::Backend;
use crate::backend::sim::{AllocFailure, FaultPlan, SimDevice, StreamStatus, SyncError};
use crate::callable::{ChipCallable, OrchArgs, Orchestration};
use crate::diag;
use crate::diag::swimlane::SwimlaneCapture;
use crate::error::{
    CoreFault, DeviceError, KernelKind, MemPurpose, PoisonCause, PoisonStep, RuntimeFault,
    StallInfo, StreamKind,
};
use crate::options::{Platform, RunnerOptions, RuntimeVariant};
use crate::runtime::hbg::builder::{BuildEnv, BuildLimits, BuiltGraph, GraphBuilder, HBG_OPS};
use crate::runtime::hbg::image::{ImageInputs, total_dispatches, write_image};
use crate::runtime::orch::OrchCtx;
use crate::timeouts::TimeoutConfig;

/// Most swimlane records kept per worker per run.
const SWIMLANE_CAPACITY_MAX: u64 = 1 << 16;

/// How a run ended, for the terminal cleanup's export step.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Outcome {
    Success,
    FailedBeforeLaunch,
    FailedAfterLaunch,
}

/// Where a run is in the protocol.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stage {
    Prepared,
    Launched,
    Reaped,
}

impl Stage {
    fn describe(self) -> &'static str {
        match self {
            Stage::Prepared => "a run is prepared",
            Stage::Launched => "a run is launched and not reaped",
            Stage::Reaped => "a run is reaped and not completed",
        }
    }
}

/// Per-step latches of the terminal cleanup (spec §3.6).
#[derive(Clone, Copy, Debug, Default)]
struct Latches {
    stopped: bool,
    exported: bool,
    released: bool,
}

/// The diagnostics a run latched at P1.
#[derive(Clone, Debug, Default)]
struct DiagPlan {
    swimlane: u32,
    dep_gen: bool,
    scope_stats: bool,
    prefix: Option<Arc<Path>>,
}

/// Everything one run owns between `prepare` and the end of its terminal cleanup.
#[derive(Debug)]
struct ActiveRun {
    stage: Stage,
    run_id: RunId,
    slot: ChipSlot,
    diag: DiagPlan,
    block_dim: u32,
    threads: u32,
    graph: Option<BuiltGraph>,
    layout: Option<ImageLayout>,
    image_addr: u64,
    swimlane_capacity: u32,
    aicpu_swimlane_capacity: u32,
    staged: Vec<StagedTensor>,
    aicore: Option<crate::backend::Launched>,
    latched: Option<RuntimeFault>,
    latches: Latches,
    report: RunReport,
}

#[derive(Debug, Default, Clone, Copy)]
struct Arena {
    addr: u64,
    len: u64,
}

#[derive(Debug, Default)]
struct Arenas {
    heap: Option<Arena>,
    image: Option<Arena>,
    staging: Option<Arena>,
}

/// Runs the terminal cleanup of a run held outside `Core::run` when the thread unwinds through
/// the guard's scope. A normal exit does nothing: every normal path ends the run (or stores it
/// back) itself, and `finish`'s latches make an extra call harmless if this guard is dropped
/// during some unrelated, outer unwinding.
struct FinishOnUnwind<'a> {
    core: &'a mut Core,
    run: &'a mut ActiveRun,
    outcome: Outcome,
}

impl Drop for FinishOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.core.finish(self.run, self.outcome);
        }
    }
}

/// The state of an attached runner.
#[derive(Debug)]
struct Core {
    opts: RunnerOptions,
    timeouts: TimeoutConfig,
    backend: Backend,
    initialized: bool,
    max_block_dim: u32,
    health: Arc<HealthCell>,
    callables: CallableTable,
    user_allocs: BTreeMap<u64, u64>,
    arenas: Arenas,
    kernel_args: Option<u64>,
    regs_table: Option<u64>,
    host_image: Vec<u8>,
    run: Option<ActiveRun>,
    stats: RunnerStats,
}

/// One Ascend A2/A3 chip (simulated with the default `sim` feature).
///
/// `Send`, not `Sync`: one thread (a chip worker's lane) drives it. Dropping it runs
/// [`DeviceRunner::finalize`] and logs its errors.
#[derive(Debug)]
pub struct DeviceRunner {
    core: Option<Core>,
    /// `Send` but not `Sync`: one thread drives a device (onboard, CANN binds it per thread).
    _not_sync: PhantomData<Cell<()>>,
}

fn unusable(core: &Core) -> Result<(), DeviceError> {
    match core.health.get() {
        crate::runner::DeviceHealth::Healthy => Ok(()),
        crate::runner::DeviceHealth::Unusable { cause } => {
            Err(DeviceError::Unusable { device_id: core.opts.device_id, cause })
        }
    }
}

fn busy(call: &'static str, state: impl Into<String>) -> DeviceError {
    DeviceError::Busy { call, state: state.into() }
}

fn oom(run_id: Option<RunId>, bytes: u64, purpose: MemPurpose, f: AllocFailure) -> DeviceError {
    DeviceError::OutOfMemory {
        run_id,
        bytes,
        purpose,
        limit: match f {
            AllocFailure::Limit(l) => Some(l),
            AllocFailure::Host => None,
        },
    }
}

impl DeviceRunner {
    /// Attaches to a device (spec §3.2): resolves the timeouts (A1), creates the backend (A2)
    /// and initializes it (A3).
    pub fn attach(opts: RunnerOptions) -> Result<DeviceRunner, DeviceError> {
        let env = |var: &str| if opts.read_env { std::env::var(var).ok() } else { None };
        let timeouts = TimeoutConfig::resolve(&opts.timeouts, &env)?;
        tracing::info!(
            device = opts.device_id,
            scheduler_ms = timeouts.scheduler.as_millis() as u64,
            op_execute_us = timeouts.op_execute.as_micros() as u64,
            stream_sync_ms = timeouts.stream_sync.as_millis() as u64,
            "device timeouts"
        );
        let backend = match opts.platform {
            Platform::A2a3Sim => Backend::Sim(SimDevice::new(opts.device_id, opts.sim)),
            Platform::A2a3 => {
                return Err(DeviceError::Init {
                    run_id: None,
                    step: crate::error::InitStep::LoadPrograms,
                    message: "the onboard backend is not built into this crate (feature `onboard`); refusing to fall back to the simulator".into(),
                });
            }
        };
        if opts.sim.default_block_dim == 0 || opts.sim.default_block_dim > MAX_BLOCK_DIM {
            return Err(DeviceError::InvalidConfig {
                run_id: None,
                setting: "SimOptions.default_block_dim".into(),
                value: opts.sim.default_block_dim.to_string(),
                rule: format!("must be in 1..={MAX_BLOCK_DIM}"),
            });
        }
        let mut runner = DeviceRunner {
            _not_sync: PhantomData,
            core: Some(Core {
                opts,
                timeouts,
                backend,
                initialized: false,
                max_block_dim: MAX_BLOCK_DIM,
                health: Arc::new(HealthCell::default()),
                callables: CallableTable::new(),
                user_allocs: BTreeMap::new(),
                arenas: Arenas::default(),
                kernel_args: None,
                regs_table: None,
                host_image: Vec::new(),
                run: None,
                stats: RunnerStats::default(),
            }),
        };
        runner.ensure_initialized()?;
        Ok(runner)
    }

    fn core(&mut self) -> Result<&mut Core, DeviceError> {
        // `finalize` consumes the runner, so a live runner always has its core; the error is
        // only reachable if that invariant breaks.
        self.core.as_mut().ok_or_else(|| busy("call", "the runner is finalized"))
    }

    fn core_ref(&self) -> Option<&Core> {
        self.core.as_ref()
    }

    /// Idempotent device setup (spec §3.2): streams, device programs (the simulator's AICPU
    /// threads), AICPU init. A failed attempt may be retried.
    pub fn ensure_initialized(&mut self) -> Result<(), DeviceError> {
        self.core()?.ensure_initialized()
    }

    /// The effective timeout budgets.
    pub fn timeouts(&self) -> Option<TimeoutConfig> {
        self.core_ref().map(|c| c.timeouts)
    }

    /// Builds and caches what a run of this sizing needs (tensormap_and_ringbuffer arenas);
    /// host_build_graph has nothing to cache, so this only checks the configuration and
    /// initializes the device.
    pub fn prewarm(&mut self, config: &CallConfig) -> Result<(), DeviceError> {
        let core = self.core()?;
        unusable(core)?;
        core.device_rules(None, config)?;
        core.ensure_initialized()
    }

    /// Allocates `bytes` of device memory (1024-byte aligned, zero-filled on the simulator).
    pub fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let core = self.core()?;
        unusable(core)?;
        if bytes == 0 {
            return Err(DeviceError::InvalidArgs {
                run_id: None,
                message: "malloc of 0 bytes".into(),
            });
        }
        let addr = core
            .backend
            .malloc(bytes, MemPurpose::User)
            .map_err(|f| oom(None, bytes, MemPurpose::User, f))?;
        core.user_allocs.insert(addr, bytes);
        Ok(DevicePtr(addr))
    }

    /// Frees a `malloc` allocation. While the runner is unusable the pointer is only forgotten
    /// (finalize releases the memory).
    pub fn free(&mut self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let core = self.core()?;
        if !core.user_allocs.contains_key(&ptr.0) {
            return Err(DeviceError::BadDevicePointer { run_id: None, addr: ptr.0, len: 0 });
        }
        if core.health.get().is_healthy() {
            core.refuse_while_referenced("free")?;
            core.backend.free(ptr.0);
        }
        core.user_allocs.remove(&ptr.0);
        Ok(())
    }

    /// Sets `bytes` bytes at `ptr` to `value`.
    pub fn memset(&mut self, ptr: DevicePtr, value: u8, bytes: u64) -> Result<(), DeviceError> {
        let core = self.core()?;
        unusable(core)?;
        core.refuse_while_launched("memset")?;
        core.check_user_range(ptr.0, bytes)?;
        if !core.backend.fill(ptr.0, value, bytes) {
            return Err(DeviceError::BadDevicePointer { run_id: None, addr: ptr.0, len: bytes });
        }
        Ok(())
    }

    /// Copies `src` to device memory at `dst`.
    pub fn copy_to_device(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        let core = self.core()?;
        unusable(core)?;
        core.refuse_while_launched("copy_to_device")?;
        core.check_user_range(dst.0, src.len() as u64)?;
        if !core.backend.write(dst.0, src) {
            return Err(DeviceError::BadDevicePointer {
                run_id: None,
                addr: dst.0,
                len: src.len() as u64,
            });
        }
        Ok(())
    }

    /// Copies device memory at `src` into `dst`.
    pub fn copy_from_device(&mut self, dst: &mut [u8], src: DevicePtr) -> Result<(), DeviceError> {
        let core = self.core()?;
        unusable(core)?;
        core.refuse_while_launched("copy_from_device")?;
        core.check_user_range(src.0, dst.len() as u64)?;
        if !core.backend.read(src.0, dst) {
            return Err(DeviceError::BadDevicePointer {
                run_id: None,
                addr: src.0,
                len: dst.len() as u64,
            });
        }
        Ok(())
    }

    /// Registers a callable in the lowest free of the 64 slots (spec §3.4).
    pub fn register_callable(&mut self, callable: &ChipCallable) -> Result<ChipSlot, DeviceError> {
        self.core()?.register(callable)
    }

    /// Frees a callable's slot; a slot used by the prepared or in-flight run is `CallableInUse`.
    pub fn unregister_callable(&mut self, slot: ChipSlot) -> Result<(), DeviceError> {
        self.core()?.unregister(slot)
    }

    /// Prepares a run (P1–P18).
    pub fn prepare(&mut self, req: &RunRequest<'_>) -> Result<(), DeviceError> {
        self.core()?.prepare(req)
    }

    /// Launches the prepared run: AICore kernel first, then AICPU (L1–L3). No synchronisation.
    pub fn launch_run(&mut self) -> Result<(), DeviceError> {
        self.core()?.launch_run()
    }

    /// Waits for the launched run (R1–R3). Takes no arguments and reads only runner state.
    pub fn reap_run(&mut self) -> Result<(), DeviceError> {
        self.core()?.reap_run()
    }

    /// Finishes a reaped run (C1–C3): latched status, copy-back, terminal cleanup.
    pub fn complete_run(&mut self) -> Result<RunReport, DeviceError> {
        self.core()?.complete_run()
    }

    /// Drops a prepared, unlaunched run (its terminal cleanup runs).
    pub fn abandon_prepared(&mut self) -> Result<(), DeviceError> {
        self.core()?.abandon_prepared()
    }

    /// `prepare`, `launch_run`, `reap_run`, `complete_run`.
    pub fn run(&mut self, req: &RunRequest<'_>) -> Result<RunReport, DeviceError> {
        let core = self.core()?;
        core.prepare(req)?;
        core.launch_run()?;
        core.reap_run()?;
        core.complete_run()
    }

    /// The runner's health.
    pub fn health(&self) -> DeviceHealth {
        self.core_ref().map_or(DeviceHealth::Healthy, |c| c.health.get())
    }

    /// A view of the health other threads can read.
    pub fn health_probe(&self) -> HealthProbe {
        HealthProbe {
            cell: self
                .core_ref()
                .map_or_else(|| Arc::new(HealthCell::default()), |c| c.health.clone()),
        }
    }

    /// Counters and the memory ledger.
    pub fn stats(&self) -> RunnerStats {
        self.core_ref().map_or_else(RunnerStats::default, Core::stats)
    }

    /// The simulator's fault plan (spec §5.8); `None` on the onboard backend.
    pub fn sim_faults(&self) -> Option<&FaultPlan> {
        self.core_ref().and_then(|c| c.backend.faults())
    }

    /// The device id.
    pub fn device_id(&self) -> u32 {
        self.core_ref().map_or(0, |c| c.opts.device_id)
    }

    /// Releases the device (spec §3.7): cleans up any unfinished run, frees every allocation,
    /// resets the device and joins its threads. Returns the first error.
    pub fn finalize(mut self) -> Result<FinalizeReport, DeviceError> {
        match self.core.take() {
            Some(core) => core.finalize(),
            None => Ok(FinalizeReport::default()),
        }
    }
}

impl Drop for DeviceRunner {
    fn drop(&mut self) {
        if let Some(core) = self.core.take() {
            let device = core.opts.device_id;
            if let Err(e) = core.finalize() {
                tracing::error!(device, error = %e, "finalize during drop failed");
            }
        }
    }
}

/// The runner's view of device memory for the graph builder.
struct Env<'a> {
    backend: &'a Backend,
    heap: &'a mut Option<Arena>,
    run_id: RunId,
    misses: &'a mut u64,
}

/// Whether kernels may be handed memory of this purpose: user allocations, the GM heap and
/// staging. Runtime images, kernel arguments and chip buffers are the runtime's own; a tensor
/// pointing into them could let a kernel rewrite what the scheduler trusts.
fn kernel_visible(p: Option<MemPurpose>) -> bool {
    matches!(p, Some(MemPurpose::User | MemPurpose::HeapArena | MemPurpose::Staging))
}

impl BuildEnv for Env<'_> {
    fn device_range_ok(&self, addr: u64, len: u64) -> bool {
        kernel_visible(self.backend.find(addr, len))
    }

    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        self.backend.read(addr, out)
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> bool {
        self.backend.write(addr, data)
    }

    fn heap_arena(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        if let Some(a) = *self.heap {
            if a.len >= bytes {
                return Ok(a.addr);
            }
            self.backend.free(a.addr);
            *self.heap = None;
        }
        *self.misses += 1;
        let addr = self
            .backend
            .malloc(bytes, MemPurpose::HeapArena)
            .map_err(|f| oom(Some(self.run_id), bytes, MemPurpose::HeapArena, f))?;
        *self.heap = Some(Arena { addr, len: bytes });
        Ok(addr)
    }
}

impl Core {
    fn stats(&self) -> RunnerStats {
        let counts = self.backend.memory_counts();
        let threads = self.backend.thread_stats();
        RunnerStats {
            live_allocations: self.user_allocs.len() as u64,
            sim_threads_spawned: threads.spawned,
            sim_threads_alive: threads.alive,
            sim_threads_parked: threads.parked,
            memory: MemoryLedger {
                committed: counts.committed,
                user_allocations: counts.user_bytes,
                pooled_arenas: counts.pooled_bytes,
                runtime_buffers: counts.runtime_bytes,
            },
            ..self.stats
        }
    }

    fn ensure_initialized(&mut self) -> Result<(), DeviceError> {
        if self.initialized {
            return Ok(());
        }
        use crate::error::InitStep;
        // Step 1: streams exist with the simulated device; the core limit is fixed.
        self.max_block_dim = MAX_BLOCK_DIM;
        // Step 2: device programs (the persistent AICPU threads).
        self.backend.start_programs().map_err(|message| DeviceError::Init {
            run_id: None,
            step: InitStep::LoadPrograms,
            message,
        })?;
        // Runtime buffers used by every run: KernelArgs and the register table (P9, P16).
        if self.kernel_args.is_none() {
            let a = self
                .backend
                .malloc(size_of::<KernelArgs>() as u64, MemPurpose::Runtime)
                .map_err(|_| DeviceError::Init {
                    run_id: None,
                    step: InitStep::AicpuInit,
                    message: "allocating the kernel argument block failed".into(),
                })?;
            self.kernel_args = Some(a);
        }
        if self.regs_table.is_none() {
            let table = self.backend.register_table();
            let bytes: Vec<u8> = table.iter().flat_map(|a| a.to_le_bytes()).collect();
            let a = self.backend.malloc(bytes.len() as u64, MemPurpose::Runtime).map_err(|_| {
                DeviceError::Init {
                    run_id: None,
                    step: InitStep::QueryCores,
                    message: "allocating the register table failed".into(),
                }
            })?;
            self.backend.write(a, &bytes);
            self.regs_table = Some(a);
        }
        // Step 3: AICPU init.
        self.backend.init_aicpu(InitArgs {
            abi_version: ABI_VERSION,
            device_id: self.opts.device_id,
            log_level: 1,
            scheduler_timeout_ms: self.timeouts.scheduler.as_millis().min(u128::from(u32::MAX))
                as u32,
            shutdown_budget_ms: self
                .opts
                .budgets
                .shutdown_ack
                .as_millis()
                .clamp(1, u128::from(u32::MAX)) as u32,
            reserved: 0,
            dma_workspace: [0; 2],
        });
        self.initialized = true;
        Ok(())
    }

    /// Refuses calls that would invalidate addresses a prepared or launched run's image holds.
    fn refuse_while_referenced(&self, call: &'static str) -> Result<(), DeviceError> {
        match &self.run {
            Some(r) if matches!(r.stage, Stage::Prepared | Stage::Launched) => {
                Err(busy(call, r.stage.describe()))
            }
            _ => Ok(()),
        }
    }

    fn refuse_while_launched(&self, call: &'static str) -> Result<(), DeviceError> {
        match &self.run {
            Some(r) if r.stage == Stage::Launched => Err(busy(call, Stage::Launched.describe())),
            _ => Ok(()),
        }
    }

    fn check_user_range(&self, addr: u64, len: u64) -> Result<(), DeviceError> {
        let ok = self.user_allocs.range(..=addr).next_back().is_some_and(|(&start, &n)| {
            addr.checked_add(len).is_some_and(|end| end <= start + n) && addr < start + n.max(1)
        });
        if ok { Ok(()) } else { Err(DeviceError::BadDevicePointer { run_id: None, addr, len }) }
    }

    fn register(&mut self, c: &ChipCallable) -> Result<ChipSlot, DeviceError> {
        unusable(self)?;
        let Some(slot) = self.callables.free_slot() else {
            return Err(DeviceError::TooManyCallables { capacity: MAX_CALLABLE_SLOTS });
        };
        let resolved = resolve_for_sim(c)?;
        let bytes = chip_buffer_bytes(c, &resolved);
        let hash = fnv1a64(&bytes);
        let headers_base = match self.callables.buffers.get_mut(&hash) {
            Some(buf) => {
                buf.refs += 1;
                self.stats.chip_buffer_dedupe_hits += 1;
                buf.addr
            }
            None => {
                let addr = self
                    .backend
                    .malloc(bytes.len() as u64, MemPurpose::ChipBuffer)
                    .map_err(|f| oom(None, bytes.len() as u64, MemPurpose::ChipBuffer, f))?;
                if !self.backend.write(addr, &bytes) {
                    self.backend.free(addr);
                    return Err(DeviceError::BadDevicePointer {
                        run_id: None,
                        addr,
                        len: bytes.len() as u64,
                    });
                }
                self.callables.buffers.insert(hash, ChipBuffer { addr, refs: 1 });
                self.stats.chip_buffer_uploads += 1;
                addr
            }
        };
        let (func_table, funcs) = func_table_of(&resolved);
        tracing::debug!(
            device = self.opts.device_id,
            slot,
            chip_buffer = headers_base,
            kernels = c.children().len(),
            "callable registered"
        );
        let generation = self.callables.next_generation;
        self.callables.next_generation += 1;
        self.callables.slots[slot] = Some(Registered {
            callable: Arc::new(c.clone()),
            generation,
            buffer_hash: hash,
            func_table,
            funcs,
            objects: resolved.objects,
        });
        self.stats.registrations += 1;
        Ok(ChipSlot(slot as u32))
    }

    fn unregister(&mut self, slot: ChipSlot) -> Result<(), DeviceError> {
        if self.callables.get(slot.0).is_none() {
            return Err(DeviceError::UnknownCallable { run_id: None, slot: slot.0 });
        }
        if let Some(run) = &self.run
            && run.slot == slot
        {
            return Err(DeviceError::CallableInUse { slot: slot.0, run_id: run.run_id });
        }
        let Some(mut reg) = self.callables.slots[slot.0 as usize].take() else {
            return Err(DeviceError::UnknownCallable { run_id: None, slot: slot.0 });
        };
        if !self.health.get().is_healthy() {
            // A failed run may have left a simulated thread inside one of this callable's
            // kernels; closing the object would unmap code it is executing. A healthy runner
            // has no such thread: the only run that can execute kernels is the current one,
            // and its callable is refused above.
            self.callables.retired_objects.append(&mut reg.objects);
        }
        if let Some(buf) = self.callables.buffers.get_mut(&reg.buffer_hash) {
            buf.refs -= 1;
            if buf.refs == 0 {
                let addr = buf.addr;
                self.callables.buffers.remove(&reg.buffer_hash);
                if self.health.get().is_healthy() {
                    self.backend.free(addr);
                }
            }
        }
        Ok(())
    }

    /// P3: device rules on a valid `CallConfig`. Returns `(block_dim, threads)`.
    fn device_rules(
        &self,
        run_id: Option<RunId>,
        cfg: &CallConfig,
    ) -> Result<(u32, u32), DeviceError> {
        let threads = match cfg.aicpu_thread_num() {
            0 => DEFAULT_AICPU_THREADS,
            n => n,
        };
        if threads > MAX_AICPU_THREADS {
            return Err(DeviceError::InvalidConfig {
                run_id,
                setting: "CallConfig.aicpu_thread_num".into(),
                value: cfg.aicpu_thread_num().to_string(),
                rule: format!("must be in 1..={MAX_AICPU_THREADS} (0 = {DEFAULT_AICPU_THREADS})"),
            });
        }
        if cfg.block_dim() > self.max_block_dim {
            return Err(DeviceError::InvalidConfig {
                run_id,
                setting: "CallConfig.block_dim".into(),
                value: cfg.block_dim().to_string(),
                rule: format!("must be at most {} on this device (0 = auto)", self.max_block_dim),
            });
        }
        if cfg.pmu().is_some() {
            return Err(DeviceError::Unsupported {
                run_id,
                feature: "PMU capture (CallConfig.pmu)".into(),
            });
        }
        if cfg.dump_args() != simpler_types::DumpArgsLevel::Off {
            return Err(DeviceError::Unsupported {
                run_id,
                feature: "argument dumps (CallConfig.dump_args)".into(),
            });
        }
        if self.opts.runtime == RuntimeVariant::TensormapAndRingbuffer {
            return Err(DeviceError::Unsupported {
                run_id,
                feature: "the tensormap_and_ringbuffer runtime".into(),
            });
        }
        if cfg.diagnostics_any()
            && let Some(prefix) = cfg.output_prefix()
        {
            std::fs::create_dir_all(prefix).map_err(|e| DeviceError::InvalidConfig {
                run_id,
                setting: "CallConfig.output_prefix".into(),
                value: prefix.display().to_string(),
                rule: format!("must be a creatable directory: {e}"),
            })?;
        }
        let block_dim = match cfg.block_dim() {
            0 => self.opts.sim.default_block_dim.min(self.max_block_dim),
            b => b,
        };
        Ok((block_dim, threads))
    }

    fn prepare(&mut self, req: &RunRequest<'_>) -> Result<(), DeviceError> {
        if let Some(r) = &self.run {
            return Err(busy("prepare", r.stage.describe()));
        }
        // P1.
        let cfg = req.config;
        let diag = DiagPlan {
            swimlane: cfg.swimlane() as u32,
            dep_gen: cfg.dep_gen(),
            scope_stats: cfg.scope_stats(),
            prefix: cfg.output_prefix_shared().cloned(),
        };
        // P2.
        unusable(self)?;
        // P3.
        let (block_dim, threads) = self.device_rules(Some(req.run_id), cfg)?;
        // P4.
        if self.callables.get(req.callable.0).is_none() {
            return Err(DeviceError::UnknownCallable {
                run_id: Some(req.run_id),
                slot: req.callable.0,
            });
        }
        // P5.
        self.ensure_initialized().map_err(|e| e.in_run(req.run_id))?;
        let mut run = ActiveRun {
            stage: Stage::Prepared,
            run_id: req.run_id,
            slot: req.callable,
            diag,
            block_dim,
            threads,
            graph: None,
            layout: None,
            image_addr: 0,
            swimlane_capacity: 0,
            aicpu_swimlane_capacity: 0,
            staged: Vec::new(),
            aicore: None,
            latched: None,
            latches: Latches::default(),
            report: RunReport {
                run_id: Some(req.run_id),
                origin: req.origin(),
                block_dim,
                aicpu_threads: threads,
                ..RunReport::default()
            },
        };
        // P6–P16; on failure (or a panic) the terminal cleanup runs in before-launch mode.
        let bound =
            self.guarded(&mut run, Outcome::FailedBeforeLaunch, |core, run| core.bind(req, run));
        match bound.map_err(|e| e.in_run(req.run_id)) {
            Ok(()) => {
                self.run = Some(run);
                Ok(())
            }
            Err(e) => {
                self.finish(&mut run, Outcome::FailedBeforeLaunch);
                Err(e)
            }
        }
    }

    /// P6–P16 for host_build_graph.
    fn bind(&mut self, req: &RunRequest<'_>, run: &mut ActiveRun) -> Result<(), DeviceError> {
        let run_id = req.run_id;
        // P7: stage the entry tensors.
        let staged_tensors = self.stage_tensors(req, run)?;
        let Some(reg) = self.callables.get(req.callable.0) else {
            return Err(DeviceError::UnknownCallable {
                run_id: Some(run_id),
                slot: req.callable.0,
            });
        };
        let callable = reg.callable.clone();
        let funcs = reg.funcs.clone();
        let Orchestration::Native { entry, config } = callable.orchestration().clone() else {
            return Err(DeviceError::InvalidCallable {
                run_id: Some(run_id),
                reason: "the simulator needs a Native orchestration".into(),
            });
        };
        let tags: Vec<TensorArgType> = req.args.tags().to_vec();
        let args = OrchArgs::new(&staged_tensors, &tags, req.args.scalars());
        let cfg = req.config;
        let ring0 = cfg.runtime_env()[0];
        let limits = BuildLimits {
            task_window: ring0.task_window.unwrap_or(self.opts.rings.task_window),
            heap_bytes: ring0.heap_bytes.unwrap_or(self.opts.rings.heap_bytes),
            block_dim: run.block_dim,
            funcs,
        };
        // The config function is user code like the entry: a panic in it is an orchestration
        // failure of this run, never an unwind out of `prepare`.
        let expected = match std::panic::catch_unwind(AssertUnwindSafe(|| config(&args))) {
            Ok(c) => c.expected_arg_count as usize,
            Err(p) => {
                return Err(DeviceError::Orchestration {
                    run_id,
                    message: format!(
                        "the orchestration's config function panicked: {}",
                        panic_text(&*p)
                    ),
                });
            }
        };
        if args.len() < expected {
            return Err(DeviceError::Runtime {
                run_id,
                fault: Box::new(RuntimeFault::new(
                    RuntimeCode::InvalidArgs,
                    format!(
                        "the orchestration expects {expected} arguments, the chip entry got {}",
                        args.len()
                    ),
                )),
            });
        }
        let mut misses = 0u64;
        let built = {
            let mut env = Env {
                backend: &self.backend,
                heap: &mut self.arenas.heap,
                run_id,
                misses: &mut misses,
            };
            let mut builder = GraphBuilder::new(run_id, limits, &mut env, &staged_tensors);
            let rt = &mut builder as *mut GraphBuilder<'_> as *mut c_void;
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: `rt` is the builder above, exclusively borrowed by this call; the
                // HBG ops table's functions expect exactly that context.
                let mut ctx = unsafe { OrchCtx::new(&HBG_OPS, rt) };
                entry(&mut ctx, &args)
            }));
            match outcome {
                Err(p) => Err(DeviceError::Orchestration {
                    run_id,
                    message: format!("the orchestration panicked: {}", panic_text(&*p)),
                }),
                Ok(Err(e)) if !builder.has_error() => Err(DeviceError::Orchestration {
                    run_id,
                    message: format!("the orchestration returned an error: {e}"),
                }),
                Ok(_) => builder.finish(),
            }
        };
        self.stats.arena_cache_misses += misses;
        if let Err(DeviceError::OutOfMemory { purpose: MemPurpose::HeapArena, .. }) = &built {
            // As for the image and staging arenas: a failed arena allocation releases every
            // pooled arena, so the retry starts from free device memory.
            self.release_arenas();
        }
        let graph = built?;
        run.report.tasks = graph.tasks.len() as u32;
        run.report.edges = graph.edge_count as u64;
        run.report.rings[0] = RingHighWater {
            task_window_max: graph.tasks.len() as u64,
            heap_max: graph.heap_used,
            dep_pool_max: graph.edge_count as u64,
        };
        run.report.tensormap_max = graph.tensors.len() as u64;
        // P10, P12: profiling flags and swimlane capacity.
        let mut profiling = 0;
        if run.diag.swimlane > 0 {
            profiling |= PROFILE_SWIMLANE;
            run.swimlane_capacity = total_dispatches(&graph).clamp(1, SWIMLANE_CAPACITY_MAX) as u32;
            if run.diag.swimlane >= 2 {
                run.aicpu_swimlane_capacity = run.swimlane_capacity;
            }
        }
        if run.diag.dep_gen {
            profiling |= PROFILE_DEP_GEN;
        }
        if run.diag.scope_stats {
            profiling |= PROFILE_SCOPE_STATS;
        }
        // P13: re-check and stamp the active callable.
        let Some(reg) = self.callables.get(req.callable.0) else {
            return Err(DeviceError::UnknownCallable {
                run_id: Some(run_id),
                slot: req.callable.0,
            });
        };
        let stamp = (reg.generation << 8) | u64::from(req.callable.0);
        let layout = write_image(
            &mut self.host_image,
            &graph,
            &ImageInputs {
                block_dim: run.block_dim,
                aicpu_threads: run.threads,
                profiling,
                swimlane_capacity: run.swimlane_capacity,
                swimlane_level: run.diag.swimlane,
                aicpu_swimlane_capacity: run.aicpu_swimlane_capacity,
                active_callable: stamp,
                func_table: &reg.func_table,
            },
        )
        .ok_or_else(|| DeviceError::InvalidArgs {
            run_id: Some(run_id),
            message: "the graph is too large for a runtime image".into(),
        })?;
        run.graph = Some(graph);
        // P14: upload the image (the device copy is reused while it is large enough).
        let image_addr = self.image_arena(run_id, layout.len)?;
        if !self.backend.write(image_addr, &self.host_image) {
            return Err(DeviceError::BadDevicePointer {
                run_id: Some(run_id),
                addr: image_addr,
                len: layout.len,
            });
        }
        run.image_addr = image_addr;
        run.layout = Some(layout);
        // P16: upload KernelArgs.
        let ka = KernelArgs {
            abi_version: ABI_VERSION,
            block_dim: run.block_dim,
            num_aicore: 3 * run.block_dim,
            aicpu_threads: run.threads,
            image_base: image_addr,
            image_len: layout.len,
            regs_table: self.regs_table.unwrap_or(0),
            profiling,
            reserved0: 0,
            ffts_base: 0,
            reserved1: 0,
        };
        let Some(ka_addr) = self.kernel_args else {
            return Err(DeviceError::Init {
                run_id: Some(run_id),
                step: crate::error::InitStep::AicpuInit,
                message: "no kernel argument block".into(),
            });
        };
        self.backend.write(ka_addr, &kernel_args_bytes(&ka));
        Ok(())
    }

    /// The image arena, grown when too small (any failure releases all arenas).
    fn image_arena(&mut self, run_id: RunId, len: u64) -> Result<u64, DeviceError> {
        if let Some(a) = self.arenas.image {
            if a.len >= len {
                self.stats.arena_cache_hits += 1;
                return Ok(a.addr);
            }
            self.backend.free(a.addr);
            self.arenas.image = None;
        }
        self.stats.arena_cache_misses += 1;
        let alloc_len = len.next_power_of_two().max(1 << 16);
        match self.backend.malloc(alloc_len, MemPurpose::ImageArena) {
            Ok(addr) => {
                self.arenas.image = Some(Arena { addr, len: alloc_len });
                Ok(addr)
            }
            Err(f) => {
                self.release_arenas();
                Err(oom(Some(run_id), alloc_len, MemPurpose::ImageArena, f))
            }
        }
    }

    fn release_arenas(&mut self) {
        for a in [self.arenas.heap.take(), self.arenas.image.take(), self.arenas.staging.take()]
            .into_iter()
            .flatten()
        {
            self.backend.free(a.addr);
        }
    }

    /// P7 staging: device tensors pass through (range-checked); host tensors get a staging
    /// slice. Returns the tensors the orchestration sees.
    fn stage_tensors(
        &mut self,
        req: &RunRequest<'_>,
        run: &mut ActiveRun,
    ) -> Result<Vec<Tensor>, DeviceError> {
        let run_id = req.run_id;
        let mut out: Vec<Tensor> = req.args.tensors().to_vec();
        let tags = req.args.tags();
        let mut total = 0u64;
        for (i, t) in out.iter().enumerate() {
            let tag = tags.get(i).copied().unwrap_or_default();
            if t.is_null() {
                if !tag.allows_null() {
                    return Err(DeviceError::InvalidArgs {
                        run_id: Some(run_id),
                        message: format!(
                            "chip argument {i} ({tag}) is null; a written tensor needs a buffer"
                        ),
                    });
                }
                continue;
            }
            t.validate().map_err(|e| DeviceError::InvalidArgs {
                run_id: Some(run_id),
                message: format!("chip argument {i}: {e}"),
            })?;
            if t.is_child_memory() {
                if self.backend.find(t.addr, t.size) != Some(MemPurpose::User) {
                    return Err(DeviceError::BadDevicePointer {
                        run_id: Some(run_id),
                        addr: t.addr,
                        len: t.size,
                    });
                }
            } else {
                if !req.allows_host_tensors() {
                    return Err(DeviceError::InvalidArgs {
                        run_id: Some(run_id),
                        message: format!(
                            "chip argument {i} is host memory at {:#x} (child_memory = 0); pass device memory from malloc with child_memory set, or build the request with RunRequest::with_host_tensors",
                            t.addr
                        ),
                    });
                }
                total = total.saturating_add(t.size.div_ceil(1024) * 1024);
            }
        }
        if total == 0 {
            return Ok(out);
        }
        let base = self.staging_arena(run_id, total)?;
        let mut off = 0u64;
        for (i, t) in out.iter_mut().enumerate() {
            if t.is_null() || t.is_child_memory() {
                continue;
            }
            let tag = tags.get(i).copied().unwrap_or_default();
            let dev = base + off;
            off += t.size.div_ceil(1024) * 1024;
            if !matches!(tag, TensorArgType::Output | TensorArgType::OutputExisting) {
                // SAFETY: `with_host_tensors`' contract makes the host range readable.
                let Some(src) = (unsafe { host_slice(t.addr, t.size) }) else {
                    return Err(DeviceError::InvalidArgs {
                        run_id: Some(run_id),
                        message: format!("chip argument {i}: size overflows"),
                    });
                };
                self.backend.write(dev, src);
            }
            run.staged.push(StagedTensor {
                host_addr: t.addr,
                dev_addr: dev,
                bytes: t.size,
                copy_back: !matches!(tag, TensorArgType::Input | TensorArgType::NoDep),
            });
            t.addr = dev;
            t.child_memory = 1;
        }
        Ok(out)
    }

    fn staging_arena(&mut self, run_id: RunId, bytes: u64) -> Result<u64, DeviceError> {
        if let Some(a) = self.arenas.staging {
            if a.len >= bytes {
                return Ok(a.addr);
            }
            self.backend.free(a.addr);
            self.arenas.staging = None;
        }
        match self.backend.malloc(bytes, MemPurpose::Staging) {
            Ok(addr) => {
                self.arenas.staging = Some(Arena { addr, len: bytes });
                Ok(addr)
            }
            Err(f) => {
                self.release_arenas();
                Err(oom(Some(run_id), bytes, MemPurpose::Staging, f))
            }
        }
    }

    /// Runs `steps` on a run taken out of `self.run`, with the terminal cleanup armed for an
    /// unwinding panic (spec §3.6: `finish` runs on panics too).
    fn guarded<T>(
        &mut self,
        run: &mut ActiveRun,
        on_panic: Outcome,
        steps: impl FnOnce(&mut Core, &mut ActiveRun) -> T,
    ) -> T {
        let mut guard = FinishOnUnwind { core: self, run, outcome: on_panic };
        let FinishOnUnwind { core, run, .. } = &mut guard;
        steps(core, run)
    }

    fn take_run(&mut self, call: &'static str, want: Stage) -> Result<ActiveRun, DeviceError> {
        match self.run.take() {
            Some(r) if r.stage == want => Ok(r),
            Some(r) => {
                let state = r.stage.describe();
                self.run = Some(r);
                Err(busy(call, state))
            }
            None => Err(busy(call, "no run is prepared")),
        }
    }

    fn launch_run(&mut self) -> Result<(), DeviceError> {
        let mut run = self.take_run("launch_run", Stage::Prepared)?;
        let launched = self.guarded(&mut run, Outcome::FailedAfterLaunch, Core::launch_steps);
        if launched.is_ok() {
            run.stage = Stage::Launched;
            self.run = Some(run);
        }
        launched
    }

    /// L1–L3 on a run taken out of `self.run`; a failure has run the terminal cleanup.
    fn launch_steps(&mut self, run: &mut ActiveRun) -> Result<(), DeviceError> {
        // L1.
        self.clear_handshakes(run);
        let args = self.kernel_args.unwrap_or(0);
        // L2: AICore first.
        match self.backend.launch_aicore(run.block_dim, args) {
            Ok(l) => {
                self.stats.aicore_launches += 1;
                run.aicore = Some(l);
            }
            Err(code) => {
                self.recover_or_mark_unusable(run.run_id, PoisonStep::LaunchAiCore, code);
                self.finish(run, Outcome::FailedBeforeLaunch);
                return Err(DeviceError::Launch {
                    run_id: run.run_id,
                    kernel: KernelKind::AiCore,
                    code,
                });
            }
        }
        // L3: then AICPU.
        match self.backend.launch_aicpu(run.threads, args) {
            Ok(_) => self.stats.aicpu_launches += 1,
            Err(code) => {
                self.recover_or_mark_unusable(run.run_id, PoisonStep::LaunchAicpu, code);
                self.finish(run, Outcome::FailedAfterLaunch);
                return Err(DeviceError::Launch {
                    run_id: run.run_id,
                    kernel: KernelKind::Aicpu,
                    code,
                });
            }
        }
        Ok(())
    }

    /// L1: every `aicore_done` of the launch reads 0 on the device, whatever the image held
    /// since the upload, so the AICPU never takes a stale value for a worker reporting in. (A
    /// prepared run always has an image.)
    fn clear_handshakes(&self, run: &ActiveRun) {
        let Some(layout) = run.layout else { return };
        for w in 0..3 * run.block_dim {
            let off = layout.handshake_off
                + u64::from(w) * size_of::<Handshake>() as u64
                + offset_of!(Handshake, aicore_done) as u64;
            self.backend.write(run.image_addr + off, &0u32.to_le_bytes());
        }
    }

    /// Bounded drain, then unconditionally unusable (spec §3.7).
    fn recover_or_mark_unusable(&mut self, run_id: RunId, step: PoisonStep, code: AclCode) {
        self.stats.recoveries += 1;
        let drained = self.backend.drain(self.timeouts.stream_sync, self.timeouts.op_execute);
        tracing::error!(device = self.opts.device_id, %run_id, %step, %code, drained, "device unusable after a failed run");
        self.health.poison(PoisonCause { run_id, step, code });
    }

    fn reap_run(&mut self) -> Result<(), DeviceError> {
        let mut run = self.take_run("reap_run", Stage::Launched)?;
        let reaped = self.guarded(&mut run, Outcome::FailedAfterLaunch, Core::reap_steps);
        if reaped.is_ok() {
            run.stage = Stage::Reaped;
            self.run = Some(run);
        }
        reaped
    }

    /// R1–R3 on a run taken out of `self.run`; a failure has run the terminal cleanup.
    fn reap_steps(&mut self, run: &mut ActiveRun) -> Result<(), DeviceError> {
        let (sync, op) = (self.timeouts.stream_sync, self.timeouts.op_execute);
        // R1: AICPU stream, then AICore stream.
        let mut failure = None;
        for (stream, step) in [
            (StreamKind::Aicpu, PoisonStep::SyncAicpu),
            (StreamKind::AiCore, PoisonStep::SyncAiCore),
        ] {
            if let Err(e) = self.backend.synchronize(stream, sync, op) {
                failure = Some((stream, step, e));
                break;
            }
        }
        if let Some((stream, step, e)) = failure {
            // R2.
            let code = match &e {
                SyncError::Timeout => AclCode::STREAM_SYNC_TIMEOUT,
                SyncError::Fault(f) => f.code,
            };
            self.recover_or_mark_unusable(run.run_id, step, code);
            let other =
                if stream == StreamKind::Aicpu { StreamKind::AiCore } else { StreamKind::Aicpu };
            let other_status = self.backend.query(other, op);
            let idle = self.backend.drain(Duration::ZERO, op);
            let runtime = if idle { self.read_latched(run) } else { None };
            let mut faults = self.backend.take_faults();
            if let StreamStatus::Failed(f) = other_status
                && !faults.iter().any(|x| x.stream == other && x.code == f.code)
            {
                faults.push(CoreFault {
                    code: f.code,
                    stream: other,
                    core: None,
                    func_id: None,
                    task: None,
                    message: f.message,
                    at_ticks: u64::MAX,
                });
            }
            faults.sort_by_key(|f| f.at_ticks);
            self.finish(run, Outcome::FailedAfterLaunch);
            let runtime = runtime.map(Box::new);
            return Err(match e {
                SyncError::Timeout => DeviceError::Timeout {
                    run_id: run.run_id,
                    budget: simpler_types::TimeoutBudget::StreamSync,
                    limit: sync,
                    runtime,
                    faults,
                },
                SyncError::Fault(f) if f.code == AclCode::AICORE_TIMEOUT => DeviceError::Timeout {
                    run_id: run.run_id,
                    budget: simpler_types::TimeoutBudget::OpExecute,
                    limit: op,
                    runtime,
                    faults,
                },
                SyncError::Fault(f) => {
                    let (code, stream) =
                        faults.first().map_or((f.code, stream), |x| (x.code, x.stream));
                    DeviceError::DeviceFault { run_id: run.run_id, code, stream, faults, runtime }
                }
            });
        }
        // R3: timing (soft), then the collectors in the outcome the latched status implies.
        run.latched = self.read_latched(run);
        self.read_timing(run);
        let outcome =
            if run.latched.is_some() { Outcome::FailedAfterLaunch } else { Outcome::Success };
        self.stop_and_export(run, outcome);
        Ok(())
    }

    fn complete_run(&mut self) -> Result<RunReport, DeviceError> {
        let mut run = self.take_run("complete_run", Stage::Reaped)?;
        self.guarded(&mut run, Outcome::FailedAfterLaunch, Core::complete_steps)
    }

    /// C1–C3 on a run taken out of `self.run`; the terminal cleanup has run either way.
    fn complete_steps(&mut self, run: &mut ActiveRun) -> Result<RunReport, DeviceError> {
        // C1.
        self.handshake_report(run);
        // C2.
        let result = match run.latched.take() {
            Some(fault) => Err(DeviceError::Runtime { run_id: run.run_id, fault: Box::new(fault) }),
            None => {
                for s in &run.staged {
                    if !s.copy_back {
                        continue;
                    }
                    // SAFETY: `with_host_tensors`' contract makes the host range writable and
                    // unused by anyone else until the run ends.
                    if let Some(dst) = unsafe { host_slice_mut(s.host_addr, s.bytes) } {
                        self.backend.read(s.dev_addr, dst);
                    }
                }
                self.stats.runs_completed += 1;
                Ok(())
            }
        };
        // C3.
        let outcome = if result.is_ok() { Outcome::Success } else { Outcome::FailedAfterLaunch };
        self.finish(run, outcome);
        result.map(|()| std::mem::take(&mut run.report))
    }

    fn abandon_prepared(&mut self) -> Result<(), DeviceError> {
        let mut run = self.take_run("abandon_prepared", Stage::Prepared)?;
        self.finish(&mut run, Outcome::FailedBeforeLaunch);
        Ok(())
    }

    /// Reads the shared header's latched status (after both streams completed).
    fn read_latched(&self, run: &ActiveRun) -> Option<RuntimeFault> {
        let layout = run.layout?;
        let mut b = [0u8; size_of::<SharedHeader>()];
        if !self.backend.read(run.image_addr + layout.shared_off, &mut b) {
            return None;
        }
        let f = |o: usize| o as u64;
        let orch = diag::le_i32(&b, f(offset_of!(SharedHeader, orch_error_code)));
        let sched = diag::le_i32(&b, f(offset_of!(SharedHeader, sched_error_code)));
        let code = RuntimeCode::from_raw(if orch != 0 { orch } else { sched })?;
        let mut fault = RuntimeFault::new(code, String::new());
        fault.thread = Some(diag::le_u32(&b, f(offset_of!(SharedHeader, error_thread))));
        if code == RuntimeCode::SchedulerTimeout {
            let stuck_task = diag::le_u64(&b, f(offset_of!(SharedHeader, stuck_task)));
            let stuck_core = diag::le_u32(&b, f(offset_of!(SharedHeader, stuck_core)));
            fault.stall = Some(StallInfo {
                class: StallClass::from_u32(diag::le_u32(
                    &b,
                    f(offset_of!(SharedHeader, stall_class)),
                )),
                stuck_task: (stuck_task != u64::MAX).then_some(DeviceTaskId(stuck_task)),
                stuck_core: (stuck_core != 0).then(|| {
                    let w = stuck_core - 1;
                    (w, WorkerPlace::of(w, run.block_dim).map_or(CoreType::Aiv, |p| p.core_type))
                }),
                running: diag::le_u32(&b, f(offset_of!(SharedHeader, stall_running))),
                ready: diag::le_u32(&b, f(offset_of!(SharedHeader, stall_ready))),
                waiting: diag::le_u32(&b, f(offset_of!(SharedHeader, stall_waiting))),
                budget: self.timeouts.scheduler,
            });
            fault.task = fault.stall.as_ref().and_then(|s| s.stuck_task);
        }
        Some(fault)
    }

    fn read_timing(&self, run: &mut ActiveRun) {
        let Some(layout) = run.layout else { return };
        let mut b = vec![
            0u8;
            crate::abi::image::MAX_PHASE_THREADS
                * size_of::<crate::abi::image::PhaseRecord>()
        ];
        if !self.backend.read(run.image_addr + layout.phases_off, &mut b) {
            run.report.warnings.push("device timing could not be read".into());
            return;
        }
        let phases = diag::timing::parse_phases(&b, run.threads);
        let launch = run.aicore.as_ref().map_or(0, |l| l.started_ticks());
        match diag::timing::wall_and_phases(launch, &phases) {
            Some((wall, p)) => {
                run.report.device_wall = Some(wall);
                run.report.phases = Some(p);
            }
            None => run.report.warnings.push("device timing records are incomplete".into()),
        }
    }

    fn handshake_report(&self, run: &ActiveRun) {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let Some(layout) = run.layout else { return };
        let n = 3 * run.block_dim as usize;
        let mut b = vec![0u8; n * size_of::<Handshake>()];
        if !self.backend.read(run.image_addr + layout.handshake_off, &mut b) {
            return;
        }
        for w in 0..n as u64 {
            let o = w * size_of::<Handshake>() as u64;
            tracing::debug!(
                run = %run.run_id,
                core = w,
                aicore_done = diag::le_u32(&b, o + offset_of!(Handshake, aicore_done) as u64),
                aicpu_ready = diag::le_u32(&b, o + offset_of!(Handshake, aicpu_ready) as u64),
                task = diag::le_u64(&b, o + offset_of!(Handshake, task) as u64),
                core_type = diag::le_u32(&b, o + offset_of!(Handshake, core_type) as u64),
                physical = diag::le_u32(&b, o + offset_of!(Handshake, physical_core_id) as u64),
                "handshake"
            );
        }
    }

    /// Terminal cleanup steps 1 and 2 (spec §3.6), each at most once per run.
    fn stop_and_export(&mut self, run: &mut ActiveRun, outcome: Outcome) {
        if !run.latches.stopped {
            // The simulator's collectors are buffers inside the image: there are no collector
            // threads to stop or join.
            run.latches.stopped = true;
        }
        if !run.latches.exported {
            run.latches.exported = true;
            self.stats.exports += 1;
            self.export(run, outcome);
        }
    }

    /// The terminal cleanup (spec §3.6): stop, export, release; each step latched.
    fn finish(&mut self, run: &mut ActiveRun, outcome: Outcome) {
        self.stop_and_export(run, outcome);
        if !run.latches.released {
            run.latches.released = true;
            self.stats.terminal_cleanups += 1;
            // Per-run resources: staging leases (the arena itself is pooled) and the graph.
            run.staged.clear();
            run.graph = None;
        }
    }

    fn export(&mut self, run: &mut ActiveRun, outcome: Outcome) {
        let Some(prefix) = run.diag.prefix.clone() else { return };
        let write = |run: &mut ActiveRun, name: &str, bytes: Vec<u8>| match diag::write_atomic(
            &prefix, name, &bytes,
        ) {
            Ok(p) => run.report.outputs.push(p),
            Err(e) => {
                run.report.warnings.push(format!("writing {name} under {}: {e}", prefix.display()))
            }
        };
        let device_readable = match outcome {
            Outcome::Success => true,
            Outcome::FailedBeforeLaunch => false,
            // After a failure the simulated cores may still be running; read the image only
            // when both streams are idle.
            Outcome::FailedAfterLaunch => {
                self.backend.drain(Duration::ZERO, self.timeouts.op_execute)
            }
        };
        if run.diag.swimlane > 0 && device_readable {
            if let Some(capture) = self.read_swimlane(run) {
                run.report.swimlane_dropped = capture.dropped.iter().map(|&d| u64::from(d)).sum();
                let edges: Vec<(u64, u64)> = if run.diag.dep_gen {
                    run.graph.as_ref().map_or_else(Vec::new, |g| {
                        g.edges
                            .iter()
                            .map(|e| {
                                (DeviceTaskId::new(0, e.pred).0, DeviceTaskId::new(0, e.succ).0)
                            })
                            .collect()
                    })
                } else {
                    Vec::new()
                };
                let records = diag::swimlane::records_json(&capture).to_string().into_bytes();
                write(run, "l2_swimlane_records.json", records);
                let perfetto =
                    diag::swimlane::perfetto_json(&capture, &edges).to_string().into_bytes();
                write(run, "swimlane.perfetto.json", perfetto);
            } else {
                run.report.warnings.push("swimlane records could not be read".into());
            }
        }
        if run.diag.dep_gen
            && let Some(g) = &run.graph
        {
            let deps =
                diag::deps::deps_json(g, outcome == Outcome::Success).to_string().into_bytes();
            write(run, "deps.json", deps);
        }
        if run.diag.scope_stats
            && outcome != Outcome::FailedBeforeLaunch
            && let Some(g) = &run.graph
        {
            let lines = diag::scopes::scope_stats_jsonl(g).into_bytes();
            write(run, "scope_stats/scope_stats.jsonl", lines);
        }
    }

    fn read_swimlane(&self, run: &ActiveRun) -> Option<SwimlaneCapture> {
        let layout = run.layout?;
        let num = 3 * run.block_dim;
        let len = u64::from(num) * crate::abi::image::swimlane_block_bytes(run.swimlane_capacity);
        let mut b = vec![0u8; usize::try_from(len).ok()?];
        if !self.backend.read(run.image_addr + layout.swimlane_off, &mut b) {
            return None;
        }
        let (records, dropped) = diag::swimlane::parse(&b, num, run.swimlane_capacity);
        let mut aicpu = Vec::new();
        if run.aicpu_swimlane_capacity > 0 {
            let alen = crate::abi::image::MAX_PHASE_THREADS as u64
                * crate::abi::image::aicpu_swimlane_block_bytes(run.aicpu_swimlane_capacity);
            let mut ab = vec![0u8; usize::try_from(alen).ok()?];
            if self.backend.read(run.image_addr + layout.aicpu_swimlane_off, &mut ab) {
                aicpu = diag::swimlane::parse_aicpu(&ab, run.threads, run.aicpu_swimlane_capacity);
            }
        }
        let mut pb = vec![
            0u8;
            crate::abi::image::MAX_PHASE_THREADS
                * size_of::<crate::abi::image::PhaseRecord>()
        ];
        let phases = if self.backend.read(run.image_addr + layout.phases_off, &mut pb) {
            diag::timing::parse_phases(&pb, run.threads)
        } else {
            Vec::new()
        };
        Some(SwimlaneCapture {
            level: run.diag.swimlane,
            block_dim: run.block_dim,
            threads: run.threads,
            records,
            dropped,
            aicpu,
            phases,
        })
    }

    fn finalize(mut self) -> Result<FinalizeReport, DeviceError> {
        let mut report = FinalizeReport::default();
        // (3) Terminal cleanup of any unfinished run.
        if let Some(mut run) = self.run.take() {
            report.abandoned_run = Some(run.run_id);
            let outcome = match run.stage {
                Stage::Prepared => Outcome::FailedBeforeLaunch,
                Stage::Launched | Stage::Reaped => Outcome::FailedAfterLaunch,
            };
            self.finish(&mut run, outcome);
        }
        // (4)–(5) Reset the device, join its threads, free everything.
        let allocations = self.backend.memory_counts().allocations as usize;
        let budget = self.opts.sim.join_budget;
        report.stuck_workers = self.backend.shutdown(budget);
        if report.stuck_workers.is_empty() {
            report.freed_allocations = allocations;
        } else {
            // A detached thread may still be executing kernel code from a loaded object: keep
            // every object mapped for the life of the process.
            for reg in self.callables.slots.iter_mut().flatten() {
                std::mem::forget(std::mem::take(&mut reg.objects));
            }
            std::mem::forget(std::mem::take(&mut self.callables.retired_objects));
        }
        self.user_allocs.clear();
        Ok(report)
    }
}

/// The message of a caught panic payload.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

fn kernel_args_bytes(k: &KernelArgs) -> [u8; size_of::<KernelArgs>()] {
    let mut b = [0u8; size_of::<KernelArgs>()];
    let mut put = |off: usize, v: &[u8]| b[off..off + v.len()].copy_from_slice(v);
    put(offset_of!(KernelArgs, abi_version), &k.abi_version.to_le_bytes());
    put(offset_of!(KernelArgs, block_dim), &k.block_dim.to_le_bytes());
    put(offset_of!(KernelArgs, num_aicore), &k.num_aicore.to_le_bytes());
    put(offset_of!(KernelArgs, aicpu_threads), &k.aicpu_threads.to_le_bytes());
    put(offset_of!(KernelArgs, image_base), &k.image_base.to_le_bytes());
    put(offset_of!(KernelArgs, image_len), &k.image_len.to_le_bytes());
    put(offset_of!(KernelArgs, regs_table), &k.regs_table.to_le_bytes());
    put(offset_of!(KernelArgs, profiling), &k.profiling.to_le_bytes());
    put(offset_of!(KernelArgs, ffts_base), &k.ffts_base.to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use simpler_types::TaskArgs;

    use super::*;
    use crate::callable::OrchConfig;
    use crate::runtime::orch::OrchError;

    fn empty_orch(_: &mut OrchCtx<'_>, _: &OrchArgs<'_>) -> Result<(), OrchError> {
        Ok(())
    }

    #[test]
    fn the_runner_is_send() {
        fn send<T: Send>() {}
        send::<DeviceRunner>();
    }

    #[test]
    fn terminal_cleanup_called_twice_exports_once() {
        let mut opts = RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph);
        opts.read_env = false;
        let mut r = DeviceRunner::attach(opts).unwrap();
        let c = ChipCallable::native(empty_orch, |_| OrchConfig::default()).build().unwrap();
        let slot = r.register_callable(&c).unwrap();
        let dir =
            std::env::temp_dir().join(format!("simpler-cleanup-twice-{}", std::process::id()));
        let cfg = CallConfig::builder().dep_gen(true).output_prefix(&dir).build().unwrap();
        let args = TaskArgs::new();
        r.prepare(&RunRequest::new(RunId::FIRST, slot, &args, &cfg)).unwrap();
        let core = r.core.as_mut().unwrap();
        let mut run = core.run.take().unwrap();
        let before = core.stats;
        core.finish(&mut run, Outcome::FailedBeforeLaunch);
        let deps = dir.join("deps.json");
        let first = std::fs::metadata(&deps).unwrap().modified().unwrap();
        std::fs::remove_file(&deps).unwrap();
        core.finish(&mut run, Outcome::Success);
        assert_eq!(core.stats.exports, before.exports + 1);
        assert_eq!(core.stats.terminal_cleanups, before.terminal_cleanups + 1);
        assert!(!deps.exists(), "the second call exported nothing (first export at {first:?})");
        r.finalize().unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_panic_while_a_run_is_held_runs_the_terminal_cleanup() {
        let mut opts = RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph);
        opts.read_env = false;
        let mut r = DeviceRunner::attach(opts).unwrap();
        let c = ChipCallable::native(empty_orch, |_| OrchConfig::default()).build().unwrap();
        let slot = r.register_callable(&c).unwrap();
        let args = TaskArgs::new();
        let cfg = CallConfig::default();
        r.prepare(&RunRequest::new(RunId::FIRST, slot, &args, &cfg)).unwrap();
        let core = r.core.as_mut().unwrap();
        let mut run = core.run.take().unwrap();
        let before = core.stats;
        let caught = std::panic::catch_unwind(AssertUnwindSafe(|| {
            core.guarded(&mut run, Outcome::FailedBeforeLaunch, |_, _| panic!("injected"))
        }));
        assert!(caught.is_err());
        assert_eq!(core.stats.terminal_cleanups, before.terminal_cleanups + 1);
        assert_eq!(core.stats.exports, before.exports + 1);
        assert!(run.latches.released && run.latches.stopped);
        // A normal exit leaves the run to its caller.
        let kept = core.guarded(&mut run, Outcome::FailedBeforeLaunch, |_, _| 7);
        assert_eq!((kept, core.stats.terminal_cleanups), (7, before.terminal_cleanups + 1));
        r.finalize().unwrap();
    }

    /// Writes 1.0 into every element of its one output tensor.
    unsafe extern "C-unwind" fn fill_ones(args: *mut i64) {
        // SAFETY: the runner passes one tensor descriptor, the run's output buffer.
        let k = unsafe { crate::kernel::KernelCall::from_raw(args, 1) };
        // SAFETY: the output is a device buffer of f32 only this task writes.
        if let Some(out) = unsafe { k.slice_mut::<f32>(0) } {
            out.fill(1.0);
        }
    }

    fn fill_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
        let mut a = simpler_types::CoreArgs::new();
        a.add_output(*args.tensor(0).unwrap()).unwrap();
        ctx.submit(crate::runtime::orch::Kernels::Aiv(0), &a)?;
        Ok(())
    }

    /// A runner with a registered fill callable and a 1024-float output buffer.
    fn fill_setup() -> (DeviceRunner, ChipSlot, DevicePtr, TaskArgs) {
        let mut opts = RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph);
        opts.read_env = false;
        let mut r = DeviceRunner::attach(opts).unwrap();
        let c = ChipCallable::native(fill_orch, |_| OrchConfig { expected_arg_count: 1 })
            .kernel(
                0,
                crate::callable::CoreCallable::native(
                    vec![crate::callable::ArgDirection::Out],
                    fill_ones,
                ),
            )
            .build()
            .unwrap();
        let slot = r.register_callable(&c).unwrap();
        let p = r.malloc(4096).unwrap();
        let t = Tensor::external(p.addr(), &[1024], simpler_types::DataType::Float32)
            .unwrap()
            .child_memory(true);
        let mut args = TaskArgs::new();
        args.add_output(t).unwrap();
        (r, slot, p, args)
    }

    fn read_ones(r: &mut DeviceRunner, p: DevicePtr) -> bool {
        let mut b = vec![0u8; 4096];
        r.copy_from_device(&mut b, p).unwrap();
        b.chunks_exact(4).all(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) == 1.0)
    }

    #[test]
    fn a_stale_aicore_done_in_the_image_is_cleared_before_launch_and_opens_no_window_early() {
        let (mut r, slot, p, args) = fill_setup();
        let cfg = CallConfig::builder().block_dim(2).build().unwrap();
        r.prepare(&RunRequest::new(RunId::FIRST, slot, &args, &cfg)).unwrap();
        let core = r.core.as_mut().unwrap();
        let run = core.run.take().unwrap();
        let layout = run.layout.unwrap();
        let done_addr = |w: u64| {
            run.image_addr
                + layout.handshake_off
                + w * size_of::<Handshake>() as u64
                + offset_of!(Handshake, aicore_done) as u64
        };
        let workers = u64::from(3 * run.block_dim);
        // A stale report from an earlier launch: every worker claims to be in already.
        for w in 0..workers {
            assert!(core.backend.write(done_addr(w), &(w as u32 + 1).to_le_bytes()));
        }
        core.clear_handshakes(&run);
        for w in 0..workers {
            let mut b = [0u8; 4];
            assert!(core.backend.read(done_addr(w), &mut b));
            assert_eq!(u32::from_le_bytes(b), 0, "worker {w}'s aicore_done after L1");
        }
        // Stale again, then the whole launch: the run still completes with every task executed,
        // so no dispatch went to a worker that had not reported in.
        for w in 0..workers {
            assert!(core.backend.write(done_addr(w), &(w as u32 + 1).to_le_bytes()));
        }
        core.run = Some(run);
        r.launch_run().unwrap();
        r.reap_run().unwrap();
        r.complete_run().unwrap();
        assert!(read_ones(&mut r, p));
        r.finalize().unwrap();
    }

    #[test]
    fn each_run_launches_aicore_then_aicpu_without_a_sync_between_then_syncs_aicpu_then_aicore() {
        use crate::backend::sim::{AICORE_STREAM, AICPU_STREAM, HostCall};
        let (mut r, slot, p, args) = fill_setup();
        let cfg = CallConfig::default();
        let log = |r: &DeviceRunner| match &r.core.as_ref().unwrap().backend {
            Backend::Sim(d) => d.take_host_log(),
        };
        log(&r);
        for run in 1..=3 {
            let id = RunId::from_raw(run).unwrap();
            r.run(&RunRequest::new(id, slot, &args, &cfg)).unwrap();
            assert_eq!(
                log(&r),
                [
                    HostCall::LaunchAiCore,
                    HostCall::LaunchAicpu,
                    HostCall::Sync(AICPU_STREAM),
                    HostCall::Sync(AICORE_STREAM),
                ],
                "run {run}"
            );
        }
        assert!(read_ones(&mut r, p));
        r.finalize().unwrap();
    }

    /// Writes four bytes with `set_tensor_data` at the address passed as scalar 0.
    fn poke_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
        let addr = args.scalar(0).unwrap_or(0);
        let t = Tensor::external(addr, &[4], simpler_types::DataType::UInt8).unwrap();
        ctx.set_tensor_data(&t, &[0xEE; 4])
    }

    #[test]
    fn set_tensor_data_cannot_write_the_runtimes_own_buffers() {
        let mut opts = RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph);
        opts.read_env = false;
        let mut r = DeviceRunner::attach(opts).unwrap();
        let c = ChipCallable::native(poke_orch, |_| OrchConfig::default()).build().unwrap();
        let slot = r.register_callable(&c).unwrap();
        let cfg = CallConfig::default();
        let kernel_args = r.core.as_ref().unwrap().kernel_args.unwrap();
        let mut args = TaskArgs::new();
        args.add_scalar(kernel_args).unwrap();
        let err = r.run(&RunRequest::new(RunId::FIRST, slot, &args, &cfg)).unwrap_err();
        assert!(err.to_string().contains("set_tensor_data"), "{err}");
        let mut b = [0u8; 4];
        assert!(r.core.as_ref().unwrap().backend.read(kernel_args, &mut b));
        assert_ne!(b, [0xEE; 4], "the kernel argument block was not written");
        // A user allocation stays writable.
        let p = r.malloc(1024).unwrap();
        let mut args = TaskArgs::new();
        args.add_scalar(p.addr()).unwrap();
        r.run(&RunRequest::new(RunId::from_raw(2).unwrap(), slot, &args, &cfg)).unwrap();
        r.copy_from_device(&mut b, p).unwrap();
        assert_eq!(b, [0xEE; 4]);
        r.finalize().unwrap();
    }
}
