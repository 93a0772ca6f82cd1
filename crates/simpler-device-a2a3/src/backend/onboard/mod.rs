//! The onboard backend: one real A2/A3 chip through CANN (feature `onboard`).
//!
//! Every runner step maps onto CANN calls as `docs/device-onboard.md` lists them; the calls
//! go through `simpler-acl-sys`, which loads CANN at run time (nothing is linked at build
//! time). The backend owns its CANN objects through the owners of `owners` (streams, device
//! buffers, host mappings, events, the loaded AICPU program), each releasing on drop.
//!
//! Finalize protocol (`shutdown`):
//!
//! 1. Bind the calling thread.
//! 2. Unregister every host mapping.
//! 3. Healthy device: destroy both streams without synchronising (a stream in its error state
//!    would wedge a sync) and unload the AICPU program. A device step 6 force-resets leaves
//!    both to that reset (a destroy may wait for a stuck launch's tasks, an unload would pull
//!    its code). The AICore registration is never unregistered: its handle is forgotten and
//!    its image stays alive.
//! 4. On a healthy device, free every tracked allocation.
//! 5. Healthy: one soft reset (`rtDeviceReset`) per bind the runner made, since CANN counts
//!    binds and releases the device when the count is back to 0 (a reset with nothing bound
//!    is refused; a runner whose bind never succeeded resets nothing).
//! 6. If a launch, sync or drain failed during the runner's life, or a run was still
//!    launched: no soft reset (one that brought the count to 0 would make CANN refuse the
//!    force reset), but an ACL session (`Cann::acl_session`: it calls `aclInit` unless ACL is
//!    known initialised; its end finalizes nothing, as the runner's hold outlives it), then
//!    up to three `aclrtResetDeviceForce`, each verified by a probe (bind, create and destroy
//!    a stream, allocate and free 64 bytes, unbind), each after a bind of its own unless the
//!    runner's binds are still counted (the first, when it bound). All three failing is the finalize error. The device may run a launch until the
//!    reset, so the tracked allocations are never freed: a passed reset gives them back with
//!    the device, and without one they are leaked with a warning.
//! 7. End the runner's ACL hold, taken at attach (`Cann::acl_hold`): no other runner's force
//!    reset finalizes ACL while this one is attached; the last hold or session of the process
//!    finalizes it, if a session of the project initialised it.

mod claim;
mod events;
mod manifest;
mod memory;
mod owners;
mod programs;
mod reset;

use std::collections::BTreeMap;
use std::fmt;
use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use simpler_acl_sys::types::{
    ACL_RT_DEV_RES_CUBE_CORE, ACL_RT_DEV_RES_VECTOR_CORE, ACL_STOP_ON_FAILURE,
    ADDR_MAP_TYPE_REG_AIC_CTRL, AddrMapInPara, AddrMapOutPara, CTRL_TYPE_ADDR_MAP,
    RT_SCHEM_MODE_BATCH, rtArgsEx_t, rtCpuKernelArgs_t, rtTaskCfgInfo_t,
};
use simpler_acl_sys::{AclHold, Cann, Error as CannError};

use self::claim::DeviceClaim;
use self::events::{OnboardEvent, QUEUE_FUNCTIONS, foreign_event};
pub use self::manifest::ENV_ONBOARD_ARTIFACTS;
use self::memory::{Allocation, Allocations, KernelText};
use self::owners::{Event, HostMapping, Stream, code_of};
use self::programs::{AicoreBinary, Loaded};
use self::reset::{Binds, SharedBinds, bind_for};
use super::orch_object::{self, RegisterOp};
use super::{
    AllocFailure, Backend, EventHandle, EventStatus, LaunchHandle, LaunchState, MemoryCounts,
    NoHostView, ResolvedKernels, StreamFault, StreamStatus, SyncError, ThreadStats,
};
use crate::abi::codes::AclCode;
use crate::abi::launch::InitArgs;
use crate::callable::{ChipCallable, KernelCode};
use crate::error::{
    CallableProblem, CopyKind, CoreFault, DeviceError, InitFailure, InitStep, KernelCodeKind,
    MemPurpose, OrchLoadCause, StreamKind,
};
use crate::options::RunnerOptions;
use crate::runtime::DeviceOrchestration;

/// The `block_dim` limit when the core-limit query fails (the original's default).
const FALLBACK_BLOCK_DIM: u32 = 24;
/// Force resets tried at finalize after a failure.
const FORCE_RESETS: u32 = 3;
/// Device log level set before the first bind (3 = error), unless the user set one.
const DEVICE_LOG_LEVEL: i32 = 3;
/// AICore cores per table: AIC cores, then two AIV cores per AIC.
const AIC_CORES: u64 = 25;

/// Options of the onboard backend, part of `RunnerOptions`.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct OnboardOptions {
    /// The device program manifest; `None` reads `SIMPLER_ONBOARD_ARTIFACTS`.
    pub manifest: Option<PathBuf>,
    /// The CANN loader to use; `None` searches the process environment.
    pub cann: Option<Arc<Cann>>,
}

impl RunnerOptions {
    /// Uses the device program manifest at `path` (onboard).
    pub fn with_onboard_manifest(mut self, path: impl Into<PathBuf>) -> Self {
        self.onboard.manifest = Some(path.into());
        self
    }

    /// Uses `cann` instead of searching the process environment for CANN (onboard).
    ///
    /// Safe: a [`Cann`] over any search but the process environment's is built with the
    /// `unsafe` `Cann::new`, whose caller vouched that it loads only CANN (or the stand-in).
    pub fn with_cann(mut self, cann: Arc<Cann>) -> Self {
        self.onboard.cann = Some(cann);
        self
    }
}

fn acl(init: Option<InitStep>, e: CannError) -> DeviceError {
    match e {
        CannError::Load(source) => DeviceError::Load { source: Box::new(source) },
        CannError::Acl(source) => DeviceError::Acl { run_id: None, init, source: Box::new(source) },
        // `simpler_acl_sys::Error` is non-exhaustive; a new kind is still an init failure.
        other => DeviceError::Init {
            run_id: None,
            step: init.unwrap_or(InitStep::BindDevice),
            failure: InitFailure::Cann(Box::new(other)),
        },
    }
}

fn ms(d: Duration) -> i32 {
    d.as_millis().clamp(1, i32::MAX as u128) as i32
}

/// A launch as the runner keeps it; the device start time is not read back onboard.
#[derive(Debug)]
struct OnboardLaunch;

impl LaunchState for OnboardLaunch {
    fn started_ticks(&self) -> u64 {
        0
    }
}

/// A CANN failure as a stream's sticky error, keeping the typed error.
fn stream_fault(e: CannError) -> StreamFault {
    let mut fault = StreamFault::new(AclCode(code_of(&e)), e.to_string());
    if let CannError::Acl(acl) = e {
        fault.acl = Some(Box::new(acl));
    }
    fault
}

/// The streams, created by `start_programs`.
#[derive(Debug)]
struct Streams {
    aicpu: Stream,
    aicore: Stream,
}

/// One A2/A3 chip through CANN.
pub(crate) struct OnboardDevice {
    ctx: Arc<owners::Ctx>,
    opts: RunnerOptions,
    /// How many binds CANN has counted (finalize resets as many), and the identity a thread
    /// records when it is bound for this runner.
    bound: SharedBinds,
    streams: Option<Streams>,
    max_block_dim: u32,
    programs: Option<Loaded>,
    aicore: Option<AicoreBinary>,
    allocations: Allocations,
    /// Keeps ACL from being finalized while the runner lives (by another runner's force reset,
    /// or a SoC-name query), which would end it under this runner's device; ended at finalize,
    /// after the runner's last CANN call.
    acl: Option<AclHold>,
    /// The device, claimed for this runner alone until its last device reset (`claim`).
    claim: Option<DeviceClaim>,
    /// The finalize error, taken by the runner.
    error: Option<DeviceError>,
    shut_down: bool,
    /// Whether a recovery drain proved both streams idle and nothing was launched since: the
    /// answer to "idle now?", which CANN has no query for. The runner then reads the failed
    /// run's latched status and diagnostics from the image.
    drained_idle: AtomicBool,
}

impl fmt::Debug for OnboardDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnboardDevice")
            .field("device", &self.ctx.device)
            .field("streams", &self.streams)
            .field("allocations", &self.allocations.lock().len())
            .field("poisoned", &self.ctx.is_poisoned())
            .finish()
    }
}

impl OnboardDevice {
    /// Attach step A2: load CANN, set the device log level before the first bind (unless
    /// `ASCEND_GLOBAL_LOG_LEVEL` is set), bind the device, set the op-execute timeout (a
    /// failure is logged, not fatal).
    pub(crate) fn attach(opts: &RunnerOptions) -> Result<OnboardDevice, DeviceError> {
        let cann = match &opts.onboard.cann {
            Some(c) => Arc::clone(c),
            None => Arc::new(Cann::from_process_env()),
        };
        let probe = cann.probe().map_err(|e| DeviceError::Load { source: Box::new(e) })?;
        if opts.device_queue {
            // Optional in the list, needed by every queued run: missing, they would fail its
            // launch as a device fault and poison a healthy device.
            cann.require(&QUEUE_FUNCTIONS)
                .map_err(|e| DeviceError::Load { source: Box::new(e) })?;
        }
        if !probe.version_supported() {
            return Err(DeviceError::Init {
                run_id: None,
                step: InitStep::BindDevice,
                failure: InitFailure::CannVersion { found: probe.version },
            });
        }
        let device = i32::try_from(opts.device_id).map_err(|_| DeviceError::InvalidConfig {
            run_id: None,
            setting: "RunnerOptions.device_id".into(),
            value: opts.device_id.to_string(),
            rule: "must fit a CANN device id (i32)".into(),
        })?;
        let hold = cann.acl_hold().map_err(|e| acl(Some(InitStep::BindDevice), e))?;
        // Before any call on the device: a refused attach must not touch another runner's.
        let Some(claim) = DeviceClaim::take(hold.library(), device) else {
            return Err(DeviceError::Init {
                run_id: None,
                step: InitStep::BindDevice,
                failure: InitFailure::DeviceAttached { device: opts.device_id },
            });
        };
        let ctx = owners::Ctx::new(cann, device);
        if std::env::var_os("ASCEND_GLOBAL_LOG_LEVEL").is_none() {
            // SAFETY: plain integer arguments; -1 = every module.
            let ret = unsafe { ctx.cann.dlog_setlevel(-1, DEVICE_LOG_LEVEL, 0) };
            if let Err(e) = ctx.check("dlog_setlevel", ret) {
                tracing::debug!(device, error = %e, "device log level not set");
            }
        }
        let mut me = OnboardDevice {
            ctx,
            opts: opts.clone(),
            bound: Arc::new(Mutex::new(Binds::new())),
            streams: None,
            max_block_dim: FALLBACK_BLOCK_DIM,
            programs: None,
            aicore: None,
            allocations: Arc::new(Mutex::new(BTreeMap::new())),
            acl: Some(hold),
            claim: Some(claim),
            error: None,
            shut_down: false,
            drained_idle: AtomicBool::new(false),
        };
        if let Err(e) = me.bind() {
            // Nothing is bound, so nothing needs a reset: the drop must not bind to give one.
            me.shut_down = true;
            return Err(acl(Some(InitStep::BindDevice), e));
        }
        let budget_us =
            opts.resolve_timeouts().map(|t| t.op_execute.as_micros() as u64).unwrap_or(3_000_000);
        let mut actual = 0u64;
        // SAFETY: `actual` is a valid out-pointer.
        let ret = unsafe { me.ctx.cann.aclrtSetOpExecuteTimeOutV2(budget_us, &mut actual) };
        if let Err(e) = me.ctx.check("aclrtSetOpExecuteTimeOutV2", ret) {
            tracing::warn!(device, error = %e, "op-execute timeout not set; CANN's default applies");
        }
        Ok(me)
    }

    /// Remembers that finalize must force-reset.
    fn poison(&self) {
        self.ctx.poison();
    }

    /// Binds the calling thread unless it is bound for this runner already (not since bound
    /// for another runner: CANN binds one device per thread).
    fn bind(&self) -> Result<(), CannError> {
        bind_for(&self.ctx, &self.bound)
    }

    /// The failure a release recorded in `Drop`, as the typed error of this call.
    fn deferred(&self, init: Option<InitStep>) -> Result<(), DeviceError> {
        match self.ctx.take_deferred() {
            Some(e) => Err(acl(init, e)),
            None => Ok(()),
        }
    }

    fn stream(&self, kind: StreamKind) -> Option<&Stream> {
        let s = self.streams.as_ref()?;
        Some(match kind {
            StreamKind::Aicpu => &s.aicpu,
            StreamKind::AiCore => &s.aicore,
        })
    }

    /// Ensure_initialized step 1: the AICPU stream, then the AICore stream (the first is
    /// destroyed again if the second fails), both set to stop on failure, then the core
    /// limits.
    fn create_streams(&mut self) -> Result<(), DeviceError> {
        if self.streams.is_some() {
            return Ok(());
        }
        let step = Some(InitStep::CreateStream);
        let aicpu = Stream::create(&self.ctx).map_err(|e| acl(step, e))?;
        // On failure `aicpu` drops here: destroyed without a sync.
        let aicore = Stream::create(&self.ctx).map_err(|e| acl(step, e))?;
        self.stop_on_failure(&aicpu)?;
        self.stop_on_failure(&aicore)?;
        self.max_block_dim = self.query_block_dim(&aicore);
        self.streams = Some(Streams { aicpu, aicore });
        Ok(())
    }

    /// Makes `stream` stop at its first failed task and fail everything behind it, as the
    /// simulator's streams do; CANN's default is to go on. Device queueing relies on it: a run
    /// queued behind a failed one must never complete as if nothing happened, so with
    /// queueing a stream that cannot be set is an init failure; without, it is only logged.
    fn stop_on_failure(&self, stream: &Stream) -> Result<(), DeviceError> {
        // SAFETY: live stream, plain integer mode.
        let ret =
            unsafe { self.ctx.cann.aclrtSetStreamFailureMode(stream.raw(), ACL_STOP_ON_FAILURE) };
        match self.ctx.check("aclrtSetStreamFailureMode", ret) {
            Ok(()) => Ok(()),
            Err(e) if self.opts.device_queue => Err(acl(Some(InitStep::CreateStream), e)),
            Err(e) => {
                tracing::warn!(device = self.ctx.device, error = %e, "a stream goes on after a failed task");
                Ok(())
            }
        }
    }

    /// `min(cube cores, vector cores / 2)`, or 24 when a query fails.
    fn query_block_dim(&self, stream: &Stream) -> u32 {
        let query = |ty| {
            let mut v = 0u32;
            // SAFETY: live stream, valid out-pointer.
            let ret = unsafe { self.ctx.cann.aclrtGetStreamResLimit(stream.raw(), ty, &mut v) };
            self.ctx.check("aclrtGetStreamResLimit", ret).map(|()| v)
        };
        match (query(ACL_RT_DEV_RES_CUBE_CORE), query(ACL_RT_DEV_RES_VECTOR_CORE)) {
            (Ok(cube), Ok(vector)) if cube > 0 && vector >= 2 => cube.min(vector / 2),
            (cube, vector) => {
                tracing::warn!(
                    device = self.ctx.device,
                    ?cube,
                    ?vector,
                    "core-limit query failed; block_dim limit {FALLBACK_BLOCK_DIM}"
                );
                FALLBACK_BLOCK_DIM
            }
        }
    }

    /// Ensure_initialized step 2: the manifest's programs.
    fn load_programs(&mut self) -> Result<(), DeviceError> {
        if self.programs.is_some() && self.aicore.is_some() {
            return Ok(());
        }
        let path = match &self.opts.onboard.manifest {
            Some(p) => p.clone(),
            None => std::env::var_os(ENV_ONBOARD_ARTIFACTS).map(PathBuf::from).ok_or(
                DeviceError::Init {
                    run_id: None,
                    step: InitStep::LoadPrograms,
                    failure: InitFailure::NoManifest,
                },
            )?,
        };
        let programs = manifest::load(&path)?;
        let step = Some(InitStep::LoadPrograms);
        let Some(streams) = &self.streams else {
            return Err(DeviceError::Init {
                run_id: None,
                step: InitStep::LoadPrograms,
                failure: InitFailure::OutOfOrder { missing: "streams" },
            });
        };
        if self.programs.is_none() {
            let sync = ms(self.opts.budgets.init_sync);
            let loaded =
                programs::load_aicpu(&self.ctx, &streams.aicpu, &programs, self.opts.runtime, sync);
            self.programs = Some(loaded?);
        }
        if self.aicore.is_none() {
            let bin = programs::register_aicore(&self.ctx, programs.aicore_executor);
            self.aicore = Some(bin.map_err(|e| acl(step, e))?);
        }
        Ok(())
    }

    /// What a launch does before its CANN call: bind the thread. An earlier release that
    /// failed is left to the next call that reports it as itself (`DeviceError::Acl`): as a
    /// launch failure it would mark the device unusable for a fault of no launch's, and a run
    /// whose AICore half was launched would lose its AICPU half.
    fn launch_args(&self) -> Result<(), StreamFault> {
        self.bind().map_err(stream_fault)?;
        self.drained_idle.store(false, Ordering::Relaxed);
        Ok(())
    }

    fn launch_failed(&mut self, e: CannError) -> StreamFault {
        tracing::error!(device = self.ctx.device, error = %e, "launch refused");
        self.poison();
        stream_fault(e)
    }

    /// A step that needs what an earlier init step builds ran without it.
    fn missing(what: &str) -> StreamFault {
        StreamFault::new(AclCode::INTERNAL_ERROR, format!("the {what} do not exist"))
    }

    /// The live CANN event behind `event`, with this thread bound; an event of another
    /// backend is the fault a wait on it reports.
    fn our_event(&self, event: &EventHandle) -> Result<Arc<OnboardEvent>, StreamFault> {
        self.bind().map_err(stream_fault)?;
        Arc::clone(event).into_any().downcast::<OnboardEvent>().map_err(|_| foreign_event())
    }
}

impl OnboardDevice {
    /// Launches the program's register entry with `args` as one AICPU thread and waits for it
    /// within the init budget.
    fn launch_register(
        &self,
        slot: u32,
        entry: &str,
        args: &crate::abi::launch::RegisterArgs,
    ) -> Result<(), orch_object::LaunchFailed> {
        let (Some(streams), Some(programs)) = (&self.streams, &self.programs) else {
            return Err(DeviceError::OrchestrationLoad {
                slot,
                entry: entry.to_owned(),
                failure: None,
                cause: OrchLoadCause::ProgramsNotLoaded,
            }
            .into());
        };
        let Some(register) = programs.register else {
            return Err(DeviceError::OrchestrationLoad {
                slot,
                entry: entry.to_owned(),
                failure: None,
                cause: OrchLoadCause::NoRegisterEntry,
            }
            .into());
        };
        let mut bytes = bytemuck::bytes_of(args).to_vec();
        self.run_aicpu_entry(streams, register, &mut bytes, None)
    }

    /// Launches `func`, an entry of the AICPU program, as one thread with `bytes` as its
    /// argument bytes on the AICPU stream, and waits for it within the init budget. A failure
    /// is the error of `step`; `may_run` when the launch was accepted and only the wait failed.
    fn run_aicpu_entry(
        &self,
        streams: &Streams,
        func: simpler_acl_sys::types::rtFuncHandle,
        bytes: &mut [u8],
        step: Option<InitStep>,
    ) -> Result<(), orch_object::LaunchFailed> {
        let mut args = cpu_args(bytes);
        self.drained_idle.store(false, Ordering::Relaxed);
        // SAFETY: live function handle and stream; `args` points at `bytes`, alive for the
        // call (CANN copies the argument bytes); no launch config.
        let ret = unsafe {
            self.ctx.cann.rtsLaunchCpuKernel(
                func,
                1,
                streams.aicpu.raw(),
                std::ptr::null(),
                &mut args,
            )
        };
        let failed = |may_run| move |e| orch_object::LaunchFailed { error: acl(step, e), may_run };
        self.ctx.check("rtsLaunchCpuKernel", ret).map_err(failed(false))?;
        programs::wait_setup(&self.ctx, &streams.aicpu, ms(self.opts.budgets.init_sync))
            .map_err(failed(true))
    }
}

impl Backend for OnboardDevice {
    fn start_programs(&mut self) -> Result<(), DeviceError> {
        self.bind().map_err(|e| acl(Some(InitStep::BindDevice), e))?;
        self.deferred(Some(InitStep::CreateStream))?;
        self.create_streams()?;
        self.load_programs()
    }

    fn init_aicpu(&mut self, init: InitArgs) -> Result<(), DeviceError> {
        let step = Some(InitStep::AicpuInit);
        self.deferred(step)?;
        let (Some(streams), Some(programs)) = (&self.streams, &self.programs) else {
            return Err(DeviceError::Init {
                run_id: None,
                step: InitStep::AicpuInit,
                failure: InitFailure::OutOfOrder { missing: "device programs" },
            });
        };
        let mut bytes = Vec::with_capacity(40);
        for v in [
            init.abi_version,
            init.device_id,
            init.log_level,
            init.scheduler_timeout_ms,
            init.shutdown_budget_ms,
            init.tensor_wait_ms,
        ] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        for v in init.dma_workspace {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        self.run_aicpu_entry(streams, programs.init, &mut bytes, step).map_err(|f| f.error)
    }

    fn max_block_dim(&self) -> u32 {
        self.max_block_dim
    }

    fn default_block_dim(&self) -> u32 {
        self.max_block_dim
    }

    fn resolve_kernels(&self, c: &ChipCallable) -> Result<ResolvedKernels, DeviceError> {
        self.deferred(None)?;
        // The kernel texts are uploaded on this thread's device.
        self.bind().map_err(|e| acl(None, e))?;
        let mut out = ResolvedKernels::default();
        for (func_id, core) in c.children() {
            let KernelCode::Text(text) = core.code() else {
                let code = match core.code() {
                    KernelCode::SharedObject(_) => KernelCodeKind::SharedObject,
                    _ => KernelCodeKind::Native,
                };
                return Err(DeviceError::InvalidCallable {
                    run_id: None,
                    problem: CallableProblem::KernelCode { func_id: *func_id, code },
                });
            };
            // As every other device allocation: a refusal is `AllocRefused` (a `Resources`
            // error when memory ran out), a failed copy `CopyRefused`.
            let len = text.len().max(1) as u64;
            let addr = self
                .alloc_tracked(len, MemPurpose::ChipBuffer)
                .map_err(|f| crate::runner::oom(None, len, MemPurpose::ChipBuffer, f))?;
            if let Err(e) = self.write(addr, text) {
                self.allocations.lock().remove(&addr);
                return Err(e);
            }
            out.kernels.push((*func_id, addr));
            out.code.push(super::LoadedCode::new(KernelText {
                addr,
                table: Arc::downgrade(&self.allocations),
                ctx: Arc::downgrade(&self.ctx),
                binds: Arc::downgrade(&self.bound),
            }));
        }
        Ok(out)
    }

    fn runs_native_device_orchestration(&self) -> bool {
        // The AICPU runs the device program, not this process: a Rust function pointer of the
        // host means nothing there.
        false
    }

    fn load_orchestration(
        &mut self,
        slot: u32,
        object: &[u8],
        entry: &str,
        config: &str,
    ) -> Result<(DeviceOrchestration, Option<super::LoadedCode>), DeviceError> {
        self.deferred(None)?;
        let dir = simpler_onboard_programs::DEVICE_INSTALL_DIR;
        let op = RegisterOp::Load { object, entry, config, dir };
        let reply =
            orch_object::call(self, (0, slot), op, |args| self.launch_register(slot, entry, args))?;
        Ok((orch_object::loaded(slot, entry, &reply)?, None))
    }

    fn unload_orchestration(&mut self, slot: u32) {
        let reply = orch_object::call(self, (0, slot), RegisterOp::Unload, |args| {
            self.launch_register(slot, "", args)
        });
        match reply {
            Ok(r) if r.status == crate::abi::launch::REGISTER_OK => {}
            Ok(r) => {
                tracing::warn!(device = self.ctx.device, slot, status = r.status, message = %r.message(), "closing an orchestration object failed")
            }
            Err(e) => {
                tracing::warn!(device = self.ctx.device, slot, error = %e, "closing an orchestration object failed")
            }
        }
    }

    fn malloc(&self, bytes: u64, purpose: MemPurpose) -> Result<u64, AllocFailure> {
        self.alloc_tracked(bytes, purpose)
    }

    fn free(&self, addr: u64) -> Option<MemPurpose> {
        if let Err(e) = self.bind() {
            // Freed on this thread, the memory would be looked up in another context and the
            // free refused: it stays in the table, for finalize to free, and the next fallible
            // call reports the bind.
            self.ctx.record(e);
            return self.allocations.lock().get(&addr).map(|a| a.purpose);
        }
        // Dropping the entry unregisters its mapping, then frees the memory.
        self.allocations.lock().remove(&addr).map(|a| a.purpose)
    }

    fn abandon(&self, addr: u64) {
        // Out of the table, so finalize does not free it before the reset; the force reset
        // the failed wait asked for reclaims it.
        if let Some(a) = self.allocations.lock().remove(&addr) {
            std::mem::forget(a);
        }
    }

    fn find(&self, addr: u64, len: u64) -> Option<MemPurpose> {
        self.with_allocation(addr, len, |a, _| a.purpose)
    }

    fn write(&self, dst: u64, src: &[u8]) -> Result<(), DeviceError> {
        let len = src.len() as u64;
        self.transfer(CopyKind::ToDevice, dst, len, |a, off| a.buffer.write(off, src))
    }

    fn read(&self, src: u64, dst: &mut [u8]) -> Result<(), DeviceError> {
        let len = dst.len() as u64;
        self.transfer(CopyKind::FromDevice, src, len, |a, off| a.buffer.read(off, dst))
    }

    fn fill(&self, dst: u64, value: u8, len: u64) -> Result<(), DeviceError> {
        self.transfer(CopyKind::Fill, dst, len, |a, off| a.buffer.fill(off, value, len))
    }

    fn host_map(&self, addr: u64, len: u64) -> Result<*mut u8, NoHostView> {
        let refused = |e| NoHostView::Refused(Box::new(acl(None, e)));
        self.bind().map_err(refused)?;
        self.with_allocation(addr, len, |a, off| {
            let mapping = match &a.mapping {
                Some(m) => m,
                None => a.mapping.insert(HostMapping::map(&self.ctx, &a.buffer).map_err(refused)?),
            };
            // SAFETY: `off + len` lies inside the mapped allocation (checked above).
            Ok(unsafe { mapping.host().add(off as usize) })
        })
        .ok_or(NoHostView::NotOneAllocation)?
    }

    fn memory_counts(&self) -> MemoryCounts {
        let mut c = MemoryCounts::default();
        for a in self.allocations.lock().values() {
            let len = a.buffer.len();
            c.committed += len;
            c.allocations += 1;
            match a.purpose {
                MemPurpose::User => {
                    c.user_bytes += len;
                    c.user_allocations += 1;
                }
                MemPurpose::HeapArena | MemPurpose::ImageArena | MemPurpose::Staging => {
                    c.pooled_bytes += len;
                }
                MemPurpose::ChipBuffer | MemPurpose::Runtime => c.runtime_bytes += len,
            }
        }
        c
    }

    fn register_table(&self) -> Result<Vec<u64>, DeviceError> {
        // The AICore control window: AIC core i at base + i·8 MiB, its two AIV cores at
        // base + i·8 MiB + (j + 1)·1 MiB; AIC entries first, then AIV.
        let mut input =
            AddrMapInPara { addr_type: ADDR_MAP_TYPE_REG_AIC_CTRL, devid: self.ctx.device as u32 };
        let mut out = AddrMapOutPara::default();
        let mut out_len = size_of::<AddrMapOutPara>();
        // SAFETY: both parameter blocks are valid for their sizes during the call.
        let ret = unsafe {
            self.ctx.cann.halMemCtl(
                CTRL_TYPE_ADDR_MAP as i32,
                (&raw mut input).cast(),
                size_of::<AddrMapInPara>(),
                (&raw mut out).cast(),
                &mut out_len,
            )
        };
        // Without the window the AICPU cannot dispatch to any core: every run would time out.
        self.ctx.check("halMemCtl", ret).map_err(|e| acl(Some(InitStep::QueryCores), e))?;
        let base = out.ptr;
        // A window CANN placed so high that a core's offset leaves the address space is as
        // good as none for that core.
        let at = |offset: u64| if base == 0 { 0 } else { base.checked_add(offset).unwrap_or(0) };
        let aic = (0..AIC_CORES).map(|i| at(i << 23));
        let aiv = (0..AIC_CORES)
            .flat_map(|i| (0..2).map(move |j| (i, j)))
            .map(|(i, j)| at((i << 23) + ((j + 1) << 20)));
        Ok(aic.chain(aiv).collect())
    }

    fn launch_aicore(&mut self, block_dim: u32, args: u64) -> Result<LaunchHandle, StreamFault> {
        self.launch_args()?;
        let (Some(streams), Some(bin)) = (&self.streams, &self.aicore) else {
            return Err(Self::missing("streams or the registered AICore executor"));
        };
        // One 8-byte argument: the device address of `KernelArgs`.
        let mut arg = args;
        let mut ex = rtArgsEx_t {
            args: (&raw mut arg).cast(),
            hostInputInfoPtr: std::ptr::null_mut(),
            argsSize: 8,
            tilingAddrOffset: 0,
            tilingDataOffset: 0,
            hostInputInfoNum: 0,
            hasTiling: 0,
            isNoNeedH2DCopy: 0,
            reserved: [0; 4],
        };
        let cfg = rtTaskCfgInfo_t { schemMode: RT_SCHEM_MODE_BATCH as u8, ..Default::default() };
        // SAFETY: the handle is the registered executor, the stream is live, `ex` points at
        // `arg` for the call (CANN copies it), `cfg` lives for the call, smDesc is null.
        let ret = unsafe {
            self.ctx.cann.rtKernelLaunchWithHandleV2(
                bin.handle,
                0,
                block_dim,
                &mut ex,
                std::ptr::null_mut(),
                streams.aicore.raw(),
                &cfg,
            )
        };
        match self.ctx.check("rtKernelLaunchWithHandleV2", ret) {
            Ok(()) => Ok(Arc::new(OnboardLaunch)),
            Err(e) => Err(self.launch_failed(e)),
        }
    }

    fn launch_aicpu(&mut self, threads: u32, args: u64) -> Result<LaunchHandle, StreamFault> {
        self.launch_args()?;
        let (Some(streams), Some(programs)) = (&self.streams, &self.programs) else {
            return Err(Self::missing("streams or the loaded AICPU program"));
        };
        let mut bytes = args.to_le_bytes().to_vec();
        let mut cpu = cpu_args(&mut bytes);
        // SAFETY: live function handle and stream; `cpu` points at `bytes` for the call.
        let ret = unsafe {
            self.ctx.cann.rtsLaunchCpuKernel(
                programs.exec,
                threads,
                streams.aicpu.raw(),
                std::ptr::null(),
                &mut cpu,
            )
        };
        match self.ctx.check("rtsLaunchCpuKernel", ret) {
            Ok(()) => Ok(Arc::new(OnboardLaunch)),
            Err(e) => Err(self.launch_failed(e)),
        }
    }

    fn synchronize(
        &self,
        stream: StreamKind,
        timeout: Duration,
        _op_execute: Duration,
    ) -> Result<(), SyncError> {
        let fault = stream_fault;
        self.bind().map_err(|e| SyncError::Fault(fault(e)))?;
        let Some(s) = self.stream(stream) else {
            return Err(SyncError::Fault(StreamFault::new(
                AclCode::INTERNAL_ERROR,
                format!("the {stream} does not exist"),
            )));
        };
        match programs::sync(&self.ctx, s, ms(timeout)) {
            Ok(()) => Ok(()),
            // A wait that ran out says nothing about the device: the caller may have asked for
            // a short slice of the budget. A timeout of the whole budget reaches the recovery
            // drain, which marks the device for the force reset.
            Err(e) if code_of(&e) == AclCode::STREAM_SYNC_TIMEOUT.get() => Err(SyncError::Timeout),
            Err(e) => {
                self.poison();
                Err(SyncError::Fault(fault(e)))
            }
        }
    }

    fn query(&self, _stream: StreamKind, _op_execute: Duration) -> StreamStatus {
        // CANN offers no non-blocking stream query among the functions this backend loads;
        // "busy" makes the runner attach nothing it does not know.
        StreamStatus::Busy
    }

    fn queries_streams(&self) -> bool {
        false
    }

    fn record_event(&mut self, stream: StreamKind) -> Result<EventHandle, StreamFault> {
        self.bind().map_err(stream_fault)?;
        let s = self.stream(stream).ok_or_else(|| Self::missing("streams"))?;
        match Event::record(&self.ctx, s) {
            Ok(event) => Ok(Arc::new(OnboardEvent {
                event: ManuallyDrop::new(event),
                binds: Arc::downgrade(&self.bound),
            })),
            Err(e) => {
                tracing::warn!(device = self.ctx.device, error = %e, "event not recorded");
                Err(stream_fault(e))
            }
        }
    }

    fn wait_event(&mut self, stream: StreamKind, event: &EventHandle) -> Result<(), StreamFault> {
        let Ok(ours) = Arc::clone(event).into_any().downcast::<OnboardEvent>() else {
            return Err(foreign_event());
        };
        self.bind().map_err(stream_fault)?;
        let s = self.stream(stream).ok_or_else(|| Self::missing("streams"))?;
        // SAFETY: both handles are live.
        let ret = unsafe { self.ctx.cann.aclrtStreamWaitEvent(s.raw(), ours.event.raw()) };
        self.ctx.check("aclrtStreamWaitEvent", ret).map_err(|e| {
            tracing::warn!(device = self.ctx.device, error = %e, "stream wait not enqueued");
            stream_fault(e)
        })
    }

    fn event_status(&self, event: &EventHandle, _op_execute: Duration) -> EventStatus {
        let ours = match self.our_event(event) {
            Ok(e) => e,
            Err(f) => return EventStatus::Failed(f),
        };
        match ours.event.status() {
            Ok(true) => EventStatus::Complete,
            Ok(false) => EventStatus::Pending,
            Err(e) => EventStatus::Failed(stream_fault(e)),
        }
    }

    fn event_synchronize(
        &self,
        event: &EventHandle,
        timeout: Duration,
        _op_execute: Duration,
    ) -> Result<(), SyncError> {
        let ours = self.our_event(event).map_err(SyncError::Fault)?;
        match ours.event.synchronize(ms(timeout)) {
            Ok(()) => Ok(()),
            // CANN answers an event wait that ran out with its own code; the stream code is
            // taken too, so that no runtime version turns a slow run into a device fault.
            Err(e)
                if [AclCode::EVENT_SYNC_TIMEOUT, AclCode::STREAM_SYNC_TIMEOUT]
                    .iter()
                    .any(|c| c.get() == code_of(&e)) =>
            {
                Err(SyncError::Timeout)
            }
            Err(e) => {
                self.poison();
                Err(SyncError::Fault(stream_fault(e)))
            }
        }
    }

    fn drain(&self, timeout: Duration, _op_execute: Duration) -> bool {
        // A zero budget asks "idle now?": CANN has no such query, and a zero timeout means
        // "wait forever" to it, so the answer is "known idle" only after a drain that
        // succeeded with nothing launched since.
        if timeout.is_zero() {
            return self.drained_idle.load(Ordering::Relaxed);
        }
        // Only recover-or-mark-unusable drains with a budget: the runner is poisoned, also
        // when this thread cannot bind to drain (finalize must still force-reset).
        self.poison();
        if let Err(e) = self.bind() {
            tracing::warn!(device = self.ctx.device, error = %e, "cannot bind to drain the device");
            return false;
        }
        // SAFETY: plain integer argument.
        let ret = unsafe { self.ctx.cann.aclrtSynchronizeDeviceWithTimeout(ms(timeout)) };
        let idle = self
            .ctx
            .check("aclrtSynchronizeDeviceWithTimeout", ret)
            .inspect_err(|e| tracing::warn!(device = self.ctx.device, error = %e, "drain failed"))
            .is_ok();
        self.drained_idle.store(idle, Ordering::Relaxed);
        idle
    }

    fn take_faults(&self) -> Vec<CoreFault> {
        // CANN reports faults through the return codes of the syncs only.
        Vec::new()
    }

    fn thread_stats(&self) -> ThreadStats {
        ThreadStats::default()
    }

    fn shutdown(&mut self) -> Vec<String> {
        if std::mem::replace(&mut self.shut_down, true) {
            return Vec::new();
        }
        let unbound = self.bind().err();
        if unbound.is_some() {
            // Releases now would run in another device's context, or in none: the device's
            // reset below releases the handles with its context instead.
            self.ctx.leave_to_reset();
        }
        let mut allocations = std::mem::take(&mut *self.allocations.lock());
        for a in allocations.values_mut() {
            a.mapping = None;
        }
        if self.ctx.is_poisoned() {
            // A stream's destroy may wait for a stuck launch's tasks, and an unload would pull
            // code from under it: the force reset below releases them with the device.
            self.ctx.leave_to_reset();
        }
        self.streams = None;
        self.programs = None;
        // Unregistered after the streams are gone, unless the device is left to its reset.
        self.aicore = None;
        // A device that is force-reset may still be running a launch that reads or writes any
        // tracked allocation: those are not freed here but given back by the reset itself.
        let held = if self.ctx.is_poisoned() {
            allocations
        } else {
            drop(allocations);
            BTreeMap::new()
        };
        // Whether the memory was given back is the force reset's outcome alone: an `aclFinalize`
        // that fails after it still fails finalize, but leaks nothing.
        let (reset, forced_back) = self.reset_device();
        self.forget_after_reset(held, forced_back);
        // The runner makes no CANN call on its device after its reset: another may attach.
        self.claim = None;
        // Nor any CANN call at all: the last hold or session of the process finalizes ACL, if
        // the project initialised it.
        let ended = self.acl.take().map_or(Ok(()), AclHold::end).map_err(|e| acl(None, e));
        // A device the reset did not recover outweighs everything else; then the bind that
        // left the handles to it, the releases that failed (oldest first), ACL's end.
        let mut errors =
            reset.err().into_iter().chain(unbound.map(|e| acl(None, e))).collect::<Vec<_>>();
        errors.extend(std::iter::from_fn(|| self.ctx.take_deferred()).map(|e| acl(None, e)));
        errors.extend(ended.err());
        let mut errors = errors.into_iter();
        self.error = errors.next();
        for e in errors {
            tracing::error!(device = self.ctx.device, error = %e, "finalize: a further failure");
        }
        Vec::new()
    }

    fn take_error(&mut self) -> Option<DeviceError> {
        self.error.take()
    }
}

impl Drop for OnboardDevice {
    fn drop(&mut self) {
        self.shutdown();
        if let Some(e) = self.error.take() {
            tracing::error!(device = self.ctx.device, error = %e, "onboard device release failed");
        }
    }
}

/// An AICPU argument descriptor over `bytes` (CANN copies them at the launch).
fn cpu_args(bytes: &mut [u8]) -> rtCpuKernelArgs_t {
    rtCpuKernelArgs_t {
        baseArgs: simpler_acl_sys::types::rtAicpuArgsEx_t {
            args: bytes.as_mut_ptr().cast(),
            hostInputInfoPtr: std::ptr::null_mut(),
            kernelOffsetInfoPtr: std::ptr::null_mut(),
            argsSize: bytes.len() as u32,
            hostInputInfoNum: 0,
            kernelOffsetInfoNum: 0,
            soNameAddrOffset: 0,
            kernelNameAddrOffset: 0,
            isNoNeedH2DCopy: false,
            timeout: 0,
            reserved: 0,
        },
        cpuParamHeadOffset: 0,
        rsv: [0; 4],
    }
}
