//! The device seam: the [`Backend`] trait a runner drives, and the backend-neutral types its
//! methods exchange.
//!
//! A backend is the hardware underneath one chip: memory, the AICPU and AICore streams and
//! their launches, the register table, the device programs and the recovery drain. The
//! simulator (`sim`, feature `sim`) is one implementation; the onboard backend over CANN
//! (`onboard`, feature `onboard`) is the second. The runner picks one at attach
//! ([`attach`]) from `RunnerOptions::platform` and never falls back from one to the other.
//!
//! Backend methods are thin: one device operation each, no policy. **Validation is the
//! caller's job**: the runner checks every range against its own allocation table, every
//! configuration against the device limits and every call against the run state before it
//! calls a backend method, so an implementation may assume valid arguments and only reports
//! what the device itself refused. `docs/device-seams.md` describes the two seams of the
//! crate (this one and `ChipRuntime`) and the data flow from a run request to the chip image.

#[cfg(feature = "onboard")]
pub(crate) mod onboard;
pub(crate) mod orch_object;
#[cfg(feature = "sim")]
pub(crate) mod sim;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::abi::codes::AclCode;
use crate::abi::launch::InitArgs;
use crate::callable::ChipCallable;
use crate::error::{CoreFault, DeviceError, MemPurpose, StreamKind};
use crate::options::{Platform, RunnerOptions};
use crate::runtime::DeviceOrchestration;

/// Why an allocation was refused.
#[derive(Debug)]
pub(crate) enum AllocFailure {
    /// The device's memory limit would be exceeded.
    Limit(u64),
    /// The allocator refused.
    Host,
    /// The device refused; the backend's typed error naming the size, purpose and its code.
    #[cfg(feature = "onboard")]
    Refused(Box<DeviceError>),
}

/// Why [`Backend::host_map`] gave no host address for a range.
#[derive(Debug)]
pub(crate) enum NoHostView {
    /// The range is not inside one live device allocation.
    NotOneAllocation,
    /// The device refused to map the allocation (onboard: the driver's error).
    #[cfg_attr(not(feature = "onboard"), allow(dead_code))]
    Refused(Box<DeviceError>),
}

/// A transfer's result when the only refusal is a range outside every allocation.
pub(crate) fn in_range(done: bool, addr: u64, len: u64) -> Result<(), DeviceError> {
    let addr = crate::runner::DevicePtr(addr);
    if done {
        Ok(())
    } else {
        Err(DeviceError::BadDevicePointer { run_id: None, arg: None, addr, len })
    }
}

/// Per-purpose byte and allocation counts of a device's memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MemoryCounts {
    /// Bytes committed in total.
    pub(crate) committed: u64,
    /// Live allocations in total.
    pub(crate) allocations: u64,
    /// Bytes of user allocations.
    pub(crate) user_bytes: u64,
    /// Live user allocations.
    pub(crate) user_allocations: u64,
    /// Bytes of pooled arenas (heap and image arenas, staging).
    pub(crate) pooled_bytes: u64,
    /// Bytes of runtime buffers (kernel args, register table, chip buffers).
    pub(crate) runtime_bytes: u64,
}

/// A stream's sticky error, or why a call that enqueues on a stream (a launch, an event record,
/// an event wait) was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StreamFault {
    /// The device code of the failed entry.
    pub(crate) code: AclCode,
    /// What happened, in words.
    pub(crate) message: String,
    /// The CANN call that reported it (onboard), kept typed for the runner's error.
    #[cfg(feature = "onboard")]
    pub(crate) acl: Option<Box<simpler_acl_sys::AclError>>,
}

impl StreamFault {
    /// A fault no CANN call reported.
    pub(crate) fn new(code: AclCode, message: impl Into<String>) -> StreamFault {
        StreamFault {
            code,
            message: message.into(),
            #[cfg(feature = "onboard")]
            acl: None,
        }
    }
}

/// What a stream synchronisation returns on failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SyncError {
    /// The stream is in its sticky error state.
    Fault(StreamFault),
    /// The entries did not complete within the budget.
    Timeout,
}

impl SyncError {
    /// The device code a run that failed this way is charged with.
    pub(crate) fn code(&self) -> AclCode {
        match self {
            SyncError::Fault(f) => f.code,
            SyncError::Timeout => AclCode::STREAM_SYNC_TIMEOUT,
        }
    }
}

/// Non-blocking state of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StreamStatus {
    /// Every entry completed.
    Idle,
    /// An entry is queued or running.
    Busy,
    /// The stream is in its sticky error state.
    Failed(StreamFault),
}

/// Counts of the threads a backend runs on the host (the simulator's AICPU threads and AICore
/// cores; zero onboard).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ThreadStats {
    /// Threads spawned over the device's life.
    pub(crate) spawned: u32,
    /// Threads currently alive.
    pub(crate) alive: u32,
    /// Threads currently parked.
    pub(crate) parked: u32,
}

/// A launched kernel as the runner keeps it: only its start time is read (device wall time).
pub(crate) trait LaunchState: Send + Sync + fmt::Debug {
    /// Device counter ticks (50 MHz) when the launch started executing (0 = not yet).
    fn started_ticks(&self) -> u64;
}

/// A handle to a launched kernel.
pub(crate) type LaunchHandle = Arc<dyn LaunchState>;

/// Where a recorded event is (never blocks to find out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EventStatus {
    /// An entry enqueued before the record is queued or running.
    Pending,
    /// Every entry enqueued before the record completed without error.
    Complete,
    /// The stream failed before reaching the record (the record was discarded behind the
    /// stream's sticky error, which this carries).
    Failed(StreamFault),
}

/// An event recorded on a stream: it completes once every entry enqueued on that stream before
/// it completed, or fails with the stream's sticky error. Queued runs complete by their own
/// events (`docs/pipelining.md`, "Device queueing").
pub(crate) trait EventState: Send + Sync + fmt::Debug {
    /// The backend's own event object, so its `wait_event` can recognise it.
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

/// A handle to a recorded event.
pub(crate) type EventHandle = Arc<dyn EventState>;

/// Something a registered callable keeps loaded while it is registered (a shared object
/// holding kernel code). Dropping it unloads the code.
pub(crate) struct LoadedCode(Box<dyn fmt::Debug + Send>);

impl LoadedCode {
    /// Keeps `code` loaded until the value drops.
    pub(crate) fn new(code: impl fmt::Debug + Send + 'static) -> LoadedCode {
        LoadedCode(Box::new(code))
    }
}

impl fmt::Debug for LoadedCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Kernel addresses a callable resolved to on one backend, and the code that holds them.
#[derive(Debug, Default)]
pub(crate) struct ResolvedKernels {
    /// `(func id, kernel entry address)`, in func-id order.
    pub(crate) kernels: Vec<(u32, u64)>,
    /// Code kept loaded while the callable is registered.
    pub(crate) code: Vec<LoadedCode>,
}

/// One chip's hardware, as the runner drives it. See the module docs: validation is the
/// caller's job.
pub(crate) trait Backend: Send + fmt::Debug {
    /// Creates the streams and loads or starts the device programs (ensure_initialized steps
    /// 1 and 2); a retry after a partial failure resumes where it stopped.
    fn start_programs(&mut self) -> Result<(), DeviceError>;

    /// Hands the AICPU program its init arguments (ensure_initialized step 3).
    fn init_aicpu(&mut self, init: InitArgs) -> Result<(), DeviceError>;

    /// The largest `block_dim` the device's core limits allow (known after `start_programs`).
    fn max_block_dim(&self) -> u32 {
        crate::abi::MAX_BLOCK_DIM
    }

    /// An error the backend recorded where it could not return one (a release in `Drop`, a
    /// reset in `shutdown`), taken once.
    fn take_error(&mut self) -> Option<DeviceError> {
        None
    }

    /// The `block_dim` a run asking for 0 (auto) gets.
    fn default_block_dim(&self) -> u32;

    /// Resolves every kernel of `c` to an address this backend can launch; a code variant it
    /// cannot execute is `InvalidCallable`.
    fn resolve_kernels(&self, c: &ChipCallable) -> Result<ResolvedKernels, DeviceError>;

    /// Whether a tensormap_and_ringbuffer run may call a `Native` (host-code) orchestration on
    /// this device's AICPU threads.
    fn runs_native_device_orchestration(&self) -> bool;

    /// Loads a `DeviceObject` orchestration (`object`, exporting `entry` and `config`) on the
    /// AICPU side under callable `slot` (tensormap_and_ringbuffer): its function addresses,
    /// and host-side code to keep while it is registered, if any.
    fn load_orchestration(
        &mut self,
        slot: u32,
        object: &[u8],
        entry: &str,
        config: &str,
    ) -> Result<(DeviceOrchestration, Option<LoadedCode>), DeviceError>;

    /// Closes the orchestration loaded under `slot` on the AICPU side; a failure is logged
    /// (the slot's next load replaces the object anyway).
    fn unload_orchestration(&mut self, slot: u32);

    /// Allocates `bytes` of device memory (1024-byte aligned, zero-filled).
    fn malloc(&self, bytes: u64, purpose: MemPurpose) -> Result<u64, AllocFailure>;

    /// Frees an allocation; `None` if `addr` does not start one.
    fn free(&self, addr: u64) -> Option<MemPurpose>;

    /// Gives up an allocation a device kernel may still use (its wait failed): it is never
    /// freed, now or at finalize, and the device reset reclaims it. A backend whose kernels
    /// cannot outlive their wait keeps it tracked (freed at finalize).
    fn abandon(&self, _addr: u64) {}

    /// Purpose of the allocation holding `[addr, addr + len)`, if one does.
    fn find(&self, addr: u64, len: u64) -> Option<MemPurpose>;

    /// Copies `src` to device memory at `dst`. A range outside every allocation is
    /// `BadDevicePointer`; what the device itself refused keeps its typed error.
    fn write(&self, dst: u64, src: &[u8]) -> Result<(), DeviceError>;

    /// Copies device memory at `src` into `dst`; errors as for `write`.
    fn read(&self, src: u64, dst: &mut [u8]) -> Result<(), DeviceError>;

    /// Sets `len` bytes at `dst` to `value`; errors as for `write`.
    fn fill(&self, dst: u64, value: u8, len: u64) -> Result<(), DeviceError>;

    /// The host address through which the device range `[addr, addr + len)` can be read and
    /// written (the simulator: identity; onboard: a host mapping), or why there is none.
    fn host_map(&self, addr: u64, len: u64) -> Result<*mut u8, NoHostView>;

    /// Memory counts for the ledger.
    fn memory_counts(&self) -> MemoryCounts;

    /// The register table of every launch: one control-window address per physical AICore
    /// core id, at least `PHYSICAL_CORE_LIMIT` entries (0 for an id without a window). The
    /// AICPU program finds a core's window by the physical id the core reports at its
    /// handshake. Onboard, a device that maps no control window is an init error of the
    /// `QueryCores` step: without one no run could dispatch.
    fn register_table(&self) -> Result<Vec<u64>, DeviceError>;

    /// Launches the AICore kernel on `3 * block_dim` cores with the `KernelArgs` at `args`.
    fn launch_aicore(&mut self, block_dim: u32, args: u64) -> Result<LaunchHandle, StreamFault>;

    /// Launches the AICPU `exec` entry on `threads` threads with the `KernelArgs` at `args`.
    fn launch_aicpu(&mut self, threads: u32, args: u64) -> Result<LaunchHandle, StreamFault>;

    /// Waits at most `timeout` for every entry enqueued on `stream` so far; `op_execute` is
    /// the per-launch AICore budget.
    fn synchronize(
        &self,
        stream: StreamKind,
        timeout: Duration,
        op_execute: Duration,
    ) -> Result<(), SyncError>;

    /// The state of `stream`, without blocking.
    fn query(&self, stream: StreamKind, op_execute: Duration) -> StreamStatus;

    /// Whether [`query`](Self::query) can tell an idle stream from a busy one; a backend that
    /// cannot answers `Busy` until a fault, and a poll asks it with a short synchronisation.
    fn queries_streams(&self) -> bool {
        true
    }

    /// Records an event on `stream`; `Err` when it could not be recorded (the runner then
    /// treats the launch it frames as failed).
    fn record_event(&mut self, stream: StreamKind) -> Result<EventHandle, StreamFault>;

    /// Makes the entries enqueued on `stream` after this call wait until `event` completed; a
    /// failed `event` puts `stream` into the same sticky error, so nothing behind the wait
    /// runs. `Err` when the wait could not be enqueued, or with [`AclCode::INTERNAL_ERROR`]
    /// when `event` was not recorded by this backend.
    fn wait_event(&mut self, stream: StreamKind, event: &EventHandle) -> Result<(), StreamFault>;

    /// The state of `event`, without blocking; `op_execute` is the per-launch AICore budget
    /// (an overdue AICore entry fails its stream, as in `query`).
    fn event_status(&self, event: &EventHandle, op_execute: Duration) -> EventStatus;

    /// Waits at most `timeout` for `event`; a stream failure before the record is
    /// `SyncError::Fault`. The op-execute watchdog keeps running while it waits.
    fn event_synchronize(
        &self,
        event: &EventHandle,
        timeout: Duration,
        op_execute: Duration,
    ) -> Result<(), SyncError>;

    /// Waits at most `timeout` for both streams to go idle (the recovery drain); returns
    /// whether they did.
    fn drain(&self, timeout: Duration, op_execute: Duration) -> bool;

    /// Faults recorded since the last call, earliest first.
    fn take_faults(&self) -> Vec<CoreFault>;

    /// Counts of the backend's host threads.
    fn thread_stats(&self) -> ThreadStats;

    /// Resets the device and releases its threads and memory; returns the names of threads
    /// that had to be detached.
    fn shutdown(&mut self) -> Vec<String>;

    /// The simulated device behind this backend, if it is the simulator.
    #[cfg(feature = "sim")]
    fn sim(&self) -> Option<&sim::SimDevice> {
        None
    }
}

/// Creates the backend `opts.platform` names (attach step A2). A platform whose backend is not
/// built into this crate is an error naming the feature it needs, never a fallback.
pub(crate) fn attach(opts: &RunnerOptions) -> Result<Box<dyn Backend>, DeviceError> {
    #[cfg(not(feature = "sim"))]
    let missing = |feature| DeviceError::Init {
        run_id: None,
        step: crate::error::InitStep::LoadPrograms,
        failure: crate::error::InitFailure::BackendNotBuilt { feature },
    };
    match opts.platform {
        #[cfg(feature = "sim")]
        Platform::A2a3Sim => Ok(Box::new(sim::SimDevice::new(opts.device_id, opts.sim))),
        #[cfg(not(feature = "sim"))]
        Platform::A2a3Sim => Err(missing("sim")),
        #[cfg(feature = "onboard")]
        Platform::A2a3 => Ok(Box::new(onboard::OnboardDevice::attach(opts)?)),
        #[cfg(not(feature = "onboard"))]
        Platform::A2a3 => Err(DeviceError::Init {
            run_id: None,
            step: crate::error::InitStep::LoadPrograms,
            failure: crate::error::InitFailure::BackendNotBuilt { feature: "onboard" },
        }),
    }
}

// With both backends built there is no refusal left to test here; the onboard backend's own
// tests cover what it refuses.
#[cfg(all(test, not(all(feature = "sim", feature = "onboard"))))]
mod tests {
    use super::*;
    use crate::options::RuntimeVariant;

    /// The feature `attach` names as missing for `opts`.
    fn refusal(opts: RunnerOptions) -> &'static str {
        match attach(&opts) {
            Err(DeviceError::Init {
                step: crate::error::InitStep::LoadPrograms,
                failure: crate::error::InitFailure::BackendNotBuilt { feature },
                ..
            }) => feature,
            other => panic!("expected an Init error, got {other:?}"),
        }
    }

    #[cfg(not(feature = "onboard"))]
    #[test]
    fn the_onboard_platform_is_refused_with_a_typed_error_and_never_falls_back() {
        assert_eq!(refusal(RunnerOptions::onboard(0, RuntimeVariant::HostBuildGraph)), "onboard");
    }

    #[cfg(not(feature = "sim"))]
    #[test]
    fn without_the_sim_feature_attaching_a_simulated_chip_names_the_feature() {
        let o = RunnerOptions::new(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
        assert_eq!(refusal(o), "sim");
    }
}
