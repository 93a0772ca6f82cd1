//! The public surface of [`DeviceRunner`]: each call finds the runner's state, checks what
//! only the surface knows (health, pointer ranges) and hands the work to the state machine in
//! the parent module or to the memory and callable services.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use simpler_types::CallConfig;

use super::callables::CallableTable;
use super::health::HealthCell;
use super::{
    ActiveRun, ChipSlot, Core, DeviceHealth, DevicePtr, DeviceRunner, FinalizeReport, HealthProbe,
    MAX_PIPELINE_SLOTS, PreparedRun, RunReport, RunRequest, RunnerStats, Slot, unusable,
};
use crate::abi::MAX_BLOCK_DIM;
use crate::callable::ChipCallable;
use crate::error::DeviceError;
use crate::options::RunnerOptions;
use crate::timeouts::TimeoutConfig;

impl DeviceRunner {
    /// Attaches to a device: resolves the timeouts (A1), creates the backend (A2) and
    /// initializes it (A3).
    ///
    /// ```
    /// use simpler_device_a2a3::{DeviceRunner, RunnerOptions, RuntimeVariant};
    ///
    /// let mut runner = DeviceRunner::attach(RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph))?;
    /// let p = runner.malloc(4096)?;
    /// runner.copy_to_device(p, &[7u8; 4096])?;
    /// let mut back = vec![0u8; 4096];
    /// runner.copy_from_device(&mut back, p)?;
    /// assert!(back.iter().all(|&b| b == 7));
    /// runner.free(p)?;
    /// runner.finalize()?;
    /// # Ok::<(), simpler_device_a2a3::DeviceError>(())
    /// ```
    pub fn attach(mut opts: RunnerOptions) -> Result<DeviceRunner, DeviceError> {
        let timeouts = opts.resolve_timeouts()?;
        opts.rings = opts.resolve_rings()?;
        tracing::info!(
            device = opts.device_id,
            scheduler_ms = timeouts.scheduler.as_millis() as u64,
            op_execute_us = timeouts.op_execute.as_micros() as u64,
            stream_sync_ms = timeouts.stream_sync.as_millis() as u64,
            "device timeouts"
        );
        #[cfg(feature = "sim")]
        if opts.sim.default_block_dim == 0 || opts.sim.default_block_dim > MAX_BLOCK_DIM {
            return Err(DeviceError::InvalidConfig {
                run_id: None,
                setting: "SimOptions.default_block_dim".into(),
                value: opts.sim.default_block_dim.to_string(),
                rule: format!("must be in 1..={MAX_BLOCK_DIM}"),
            });
        }
        if opts.pipeline_slots == 0 || opts.pipeline_slots > MAX_PIPELINE_SLOTS {
            return Err(DeviceError::InvalidConfig {
                run_id: None,
                setting: "RunnerOptions.pipeline_slots".into(),
                value: opts.pipeline_slots.to_string(),
                rule: format!("must be in 1..={MAX_PIPELINE_SLOTS}"),
            });
        }
        let slots = (0..opts.pipeline_slots).map(|_| Slot::default()).collect();
        let backend = crate::backend::attach(&opts)?;
        let runtime = crate::runtime::select(opts.runtime, timeouts.scheduler);
        let mut runner = DeviceRunner {
            _not_sync: PhantomData,
            core: Some(Core {
                opts,
                timeouts,
                backend,
                runtime,
                initialized: false,
                max_block_dim: MAX_BLOCK_DIM,
                health: Arc::new(HealthCell::default()),
                callables: CallableTable::new(),
                user_allocs: BTreeMap::new(),
                regs_table: None,
                slots,
                last_aicpu_end: None,
                launches: 0,
                poisoned_at: None,
                failed_runs: Vec::new(),
                wedged: false,
                returns: Default::default(),
                used_runs: Default::default(),
                stats: RunnerStats::default(),
                backend_down: false,
            }),
        };
        runner.ensure_initialized()?;
        Ok(runner)
    }

    /// The attached state, after the cleanup of slots whose handles were dropped (so every
    /// call sees the slots a dropped handle held as free again).
    fn core(&mut self) -> Result<&mut Core, DeviceError> {
        let core = self.attached()?;
        core.reclaim_dropped();
        Ok(core)
    }

    /// The attached state, for a call that refuses (or only forgets) on an unusable runner:
    /// cleaned up as by [`core`](Self::core) while the runner is healthy, otherwise only of the
    /// dropped runs the device already finished ([`Core::sweep_dropped`]), so the call does not
    /// first wait out a dropped run's stream-sync budget.
    fn core_unless_unusable(&mut self) -> Result<&mut Core, DeviceError> {
        let core = self.attached()?;
        if core.health.get().is_healthy() {
            core.reclaim_dropped();
        } else {
            core.sweep_dropped();
        }
        Ok(core)
    }

    /// The attached state after a look at the runs of dropped handles
    /// ([`Core::sweep_dropped`]), for a call that needs none of them gone: it never waits out a
    /// dropped run's stream-sync budget.
    fn core_looking(&mut self) -> Result<&mut Core, DeviceError> {
        let core = self.attached()?;
        core.sweep_dropped();
        Ok(core)
    }

    /// The attached state, for the calls of the pipelined path, which clean up dropped handles
    /// themselves and wait only for those they need gone (`docs/pipelining.md`).
    fn attached(&mut self) -> Result<&mut Core, DeviceError> {
        // `finalize` consumes the runner, so a live runner always has its core; the error is
        // only reachable if that invariant breaks.
        self.core.as_mut().ok_or(DeviceError::Finalized { call: "call" })
    }

    fn core_ref(&self) -> Option<&Core> {
        self.core.as_ref()
    }

    /// Idempotent device setup: streams, device programs (the simulator's AICPU threads),
    /// AICPU init. A failed attempt may be retried.
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
        let core = self.core_unless_unusable()?;
        unusable(core)?;
        core.device_rules(None, config)?;
        core.ensure_initialized()
    }

    /// Allocates `bytes` of device memory (1024-byte aligned, zero-filled on the simulator).
    /// New memory is nobody's: a dropped run still executing is only looked at.
    pub fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let core = self.core_looking()?;
        unusable(core)?;
        core.malloc(bytes).map(DevicePtr)
    }

    /// Frees a `malloc` allocation. While the runner is unusable the pointer is only forgotten
    /// (finalize releases the memory), without waiting for the run of a dropped handle.
    pub fn free(&mut self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let core = self.core_unless_unusable()?;
        if !core.user_allocs.contains_key(&ptr.0) {
            return Err(DeviceError::BadDevicePointer {
                run_id: None,
                arg: None,
                addr: ptr,
                len: 0,
            });
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
        let core = self.core_unless_unusable()?;
        core.check_copy("memset", ptr.0, bytes)?;
        core.backend.fill(ptr.0, value, bytes)
    }

    /// Copies `src` to device memory at `dst`.
    pub fn copy_to_device(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        let core = self.core_unless_unusable()?;
        let len = src.len() as u64;
        core.check_copy("copy_to_device", dst.0, len)?;
        core.backend.write(dst.0, src)
    }

    /// Copies device memory at `src` into `dst`.
    pub fn copy_from_device(&mut self, dst: &mut [u8], src: DevicePtr) -> Result<(), DeviceError> {
        let core = self.core_unless_unusable()?;
        let len = dst.len() as u64;
        core.check_copy("copy_from_device", src.0, len)?;
        core.backend.read(src.0, dst)
    }

    /// Registers a callable in the lowest free of the 64 slots. Only loading a `DeviceObject`
    /// needs the AICPU stream to itself, so only then is a dropped run still executing waited
    /// for; otherwise it is only looked at.
    pub fn register_callable(&mut self, callable: &ChipCallable) -> Result<ChipSlot, DeviceError> {
        let core = match callable.orchestration() {
            crate::callable::Orchestration::DeviceObject(_) => self.core_unless_unusable()?,
            crate::callable::Orchestration::Native { .. } => self.core_looking()?,
        };
        core.register(callable)
    }

    /// Frees a callable's slot; a slot used by the prepared or in-flight run is `CallableInUse`.
    pub fn unregister_callable(&mut self, slot: ChipSlot) -> Result<(), DeviceError> {
        self.core()?.unregister(slot)
    }

    /// Prepares a run (P1–P18) in a free resource slot and returns its lease. May be called
    /// while another run executes: it writes only its own slot, and an orchestration's write
    /// into a user allocation waits until the device finished the launched runs
    /// (`RunReport::overlap` then says so). With every slot in use, or when this run or a run
    /// in progress uses a diagnostic that needs exclusive use, `Busy`; the run of a dropped
    /// handle still executing is waited for only in those two cases, and never by an unusable
    /// runner, which refuses with `Unusable` first.
    pub fn prepare(&mut self, req: &RunRequest<'_>) -> Result<PreparedRun, DeviceError> {
        self.attached()?.prepare(req)
    }

    /// Launches a prepared run: AICore kernel first, then AICPU (L1–L3), then publishes the
    /// request's acceptance signal. No synchronisation. While another run is launched and not
    /// reaped the launch is refused with `Busy` and the prepared run is abandoned; the run of a
    /// dropped handle is waited for instead (with device queueing, not even that: the launch
    /// queues behind it).
    pub fn launch_run(&mut self, prepared: PreparedRun) -> Result<ActiveRun, DeviceError> {
        self.attached()?.launch_run(prepared)
    }

    /// Whether `reap_run` on `run` would return without waiting (the run finished or failed,
    /// or the stream-sync budget an earlier reap began has passed with no run queued ahead of
    /// it unfinished, so the reap times out at once). Never waits for the device: a dropped
    /// run handle's run is only asked about (on the onboard backend that is CANN's shortest
    /// sync, 1 ms), and one the device has not finished is cleaned up by a later call.
    /// Without device queueing the onboard backend asks the streams about the run itself the
    /// same way (with device queueing, the run's own events).
    pub fn poll_run(&mut self, run: &ActiveRun) -> Result<bool, DeviceError> {
        self.attached()?.poll_run(run)
    }

    /// Waits for a launched run (R1–R3). The stream-sync budget runs from the run's first
    /// reap across all of them (or from an earlier wait for the run: a preparation's write, the
    /// reap of a queued run behind it). `within` bounds the wait: if it is shorter than what is
    /// left of the budget and passes first, the run stays launched and the call returns
    /// `Ok(false)`, as it does for a queued run still waiting at `within` for a run ahead that
    /// may end within its own budget; `None` waits for the rest of the budget, after which the
    /// run fails with a timeout. Only the recovery drain after a failure the reap found may
    /// outlast `within`. A run already reaped returns `Ok(true)` at once. The cleanup of dropped run
    /// handles waits only for a dropped run queued ahead of `run`, which `run` cannot end
    /// before, and no longer than `within`.
    pub fn reap_run(
        &mut self,
        run: &ActiveRun,
        within: Option<Duration>,
    ) -> Result<bool, DeviceError> {
        self.attached()?.reap_run(run, within)
    }

    /// Finishes a reaped run (C1–C3): latched status, copy-back, terminal cleanup; frees its
    /// slot. A run not reaped yet is reaped first (`reap_run(run, None)`), so its outcome is
    /// never lost with the handle. Does not wait for a dropped handle's run still executing (a
    /// later call cleans it up).
    pub fn complete_run(&mut self, run: ActiveRun) -> Result<RunReport, DeviceError> {
        self.attached()?.complete_run(run)
    }

    /// Drops a prepared, unlaunched run (its terminal cleanup runs) and frees its slot. Does not
    /// wait for a dropped handle's run still executing.
    pub fn abandon(&mut self, prepared: PreparedRun) -> Result<(), DeviceError> {
        self.attached()?.abandon(prepared)
    }

    /// `prepare`, `launch_run`, `reap_run`, `complete_run`, in the seed's order.
    ///
    /// ```
    /// use simpler_device_a2a3::programs::{add, f32_from_le_bytes, f32_to_le_bytes};
    /// use simpler_device_a2a3::{DevicePtr, DeviceRunner, RunRequest, RunnerOptions, RuntimeVariant};
    /// use simpler_types::{CallConfig, DataType, RunId, TaskArgs, Tensor};
    ///
    /// let mut runner = DeviceRunner::attach(RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph))?;
    /// let slot = runner.register_callable(&add::callable()?)?; // f = a + b
    /// let [a, b, f] = [runner.malloc(64)?, runner.malloc(64)?, runner.malloc(64)?];
    /// runner.copy_to_device(a, &f32_to_le_bytes(&[1.0; 16]))?;
    /// runner.copy_to_device(b, &f32_to_le_bytes(&[2.0; 16]))?;
    /// let on_chip = |p: DevicePtr| {
    ///     Tensor::external(p.addr(), &[16], DataType::Float32).map(|t| t.child_memory(true))
    /// };
    /// let mut args = TaskArgs::new();
    /// args.add_input(on_chip(a)?)?.add_input(on_chip(b)?)?.add_output(on_chip(f)?)?;
    /// let run = RunId::from_raw(1).expect("non-zero");
    /// let report = runner.run(&RunRequest::new(run, slot, &args, &CallConfig::default()))?;
    /// assert_eq!(report.tasks, 1);
    /// let mut out = vec![0u8; 64];
    /// runner.copy_from_device(&mut out, f)?;
    /// assert_eq!(f32_from_le_bytes(&out), [3.0; 16]);
    /// runner.finalize()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run(&mut self, req: &RunRequest<'_>) -> Result<RunReport, DeviceError> {
        let core = self.core()?;
        let prepared = core.prepare(req)?;
        let active = core.launch_run(prepared)?;
        core.reap_run(&active, None)?;
        core.complete_run(active)
    }

    /// Resource slots of this runner (`RunnerOptions::pipeline_slots`).
    pub fn pipeline_slots(&self) -> usize {
        self.core_ref().map_or(0, |c| c.slots.len())
    }

    /// Whether runs launched while another run executes queue behind it on the device
    /// (`RunnerOptions::device_queue`).
    pub fn device_queue(&self) -> bool {
        self.core_ref().is_some_and(|c| c.opts.device_queue)
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

    /// The simulator's fault plan (`docs/device-simulator.md`); `None` on another backend.
    #[cfg(feature = "sim")]
    pub fn sim_faults(&self) -> Option<&crate::FaultPlan> {
        self.core_ref().and_then(|c| c.backend.sim()).map(|d| d.faults())
    }

    /// The device id.
    pub fn device_id(&self) -> u32 {
        self.core_ref().map_or(0, |c| c.opts.device_id)
    }

    /// Releases the device: cleans up any unfinished run, frees every allocation, resets the
    /// device and joins its threads. Returns the first error.
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
