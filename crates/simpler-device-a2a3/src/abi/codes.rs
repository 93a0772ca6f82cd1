//! Status codes: the chip runtimes' latched codes and the device (ACL) codes the simulator
//! reports (see `DeviceError`'s docs).
//!
//! Device codes are a newtype over `i32` rather than an enum, because a real device can return
//! codes this crate has never heard of; [`AclCode::name`] knows the ones the runtime acts on.

use core::fmt;

/// A device runtime code (CANN `aclError` / `rtError_t` value).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct AclCode(pub i32);

impl AclCode {
    /// A launch was refused (also the code of a failed device allocation).
    pub const LAUNCH_FAILED: AclCode = AclCode(207_001);
    /// Internal runtime error.
    pub const INTERNAL_ERROR: AclCode = AclCode(507_000);
    /// AICore operation exceeded the op-execute budget.
    pub const AICORE_TIMEOUT: AclCode = AclCode(507_014);
    /// AICore exception (a kernel faulted).
    pub const AICORE_EXCEPTION: AclCode = AclCode(507_015);
    /// AICPU operation timed out.
    pub const AICPU_TIMEOUT: AclCode = AclCode(507_017);
    /// AICPU exception (the AICPU kernel returned non-zero).
    pub const AICPU_EXCEPTION: AclCode = AclCode(507_018);
    /// Stream synchronisation exceeded its budget.
    pub const STREAM_SYNC_TIMEOUT: AclCode = AclCode(507_046);
    /// An event synchronisation exceeded its budget (what `aclrtSynchronizeEventWithTimeout`
    /// returns where the stream form returns [`STREAM_SYNC_TIMEOUT`](Self::STREAM_SYNC_TIMEOUT)).
    pub const EVENT_SYNC_TIMEOUT: AclCode = AclCode(507_047);
    /// Driver internal error: the device is poisoned.
    pub const DEVICE_POISONED: AclCode = AclCode(507_899);
    /// A device task was aborted.
    pub const TASK_ABORT: AclCode = AclCode(107_022);

    /// The raw value.
    pub const fn get(self) -> i32 {
        self.0
    }

    /// Whether the code reports a fault of executing work (a kernel's exception or timeout, an
    /// aborted task), which a device reports again at later calls on its streams.
    pub const fn is_execution_fault(self) -> bool {
        matches!(
            self,
            AclCode::AICORE_TIMEOUT
                | AclCode::AICORE_EXCEPTION
                | AclCode::AICPU_TIMEOUT
                | AclCode::AICPU_EXCEPTION
                | AclCode::TASK_ABORT
        )
    }

    /// The ACL constant name of a known code, `"ACL_ERROR_UNKNOWN"` otherwise.
    pub const fn name(self) -> &'static str {
        match self.0 {
            0 => "ACL_SUCCESS",
            207_001 => "ACL_ERROR_RT_MEMORY_ALLOCATION",
            507_000 => "ACL_ERROR_RT_INTERNAL_ERROR",
            507_014 => "ACL_ERROR_RT_AICORE_TIMEOUT",
            507_015 => "ACL_ERROR_RT_AICORE_EXCEPTION",
            507_017 => "ACL_ERROR_RT_AICPU_TIMEOUT",
            507_018 => "ACL_ERROR_RT_AICPU_EXCEPTION",
            507_046 => "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT",
            507_047 => "ACL_ERROR_RT_EVENT_SYNC_TIMEOUT",
            507_899 => "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
            107_022 => "ACL_ERROR_RT_DEVICE_TASK_ABORT",
            _ => "ACL_ERROR_UNKNOWN",
        }
    }
}

impl fmt::Display for AclCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// A code latched by a chip runtime in the shared-memory header (`docs/device-chip.md`).
///
/// Values 1–12 are orchestration codes, 100–103 scheduler codes; 6 is retired. Names for 7, 9,
/// 10 and 101–103 are this crate's (the numbers are the original's); 12 is this crate's own.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum RuntimeCode {
    /// 1: one scope needs more task slots than the window holds.
    ScopeDeadlock,
    /// 2: a heap ring cannot place an allocation and nothing will free space.
    HeapRingDeadlock,
    /// 3: flow control cannot make progress.
    FlowControlDeadlock,
    /// 4: the dependency pool overflowed.
    DepPoolOverflow,
    /// 5: the chip entry got fewer arguments than the orchestration expects, or a submit was
    /// malformed.
    InvalidArgs,
    /// 7: a sync-start cohort could not be formed (reserved).
    SyncStartCohort,
    /// 8: waiting for tensor data exceeded its budget.
    TensorWaitTimeout,
    /// 9: the orchestration reported a fatal error.
    OrchestrationFatal,
    /// 10: the active callable does not match the registered one.
    CallableMismatch,
    /// 11: the tensor-map pool stayed full with no progress.
    TensormapOverflow,
    /// 12: a submitted task writes bytes it also names through another argument (the task's
    /// index and the two argument indices are in the fault-usage cells).
    OverlappingArguments,
    /// 100: the scheduler made no progress within its budget.
    SchedulerTimeout,
    /// 101: an asynchronous completion timed out (reserved).
    AsyncCompletionTimeout,
    /// 102: an asynchronous completion reported failure (reserved).
    AsyncCompletionFailed,
    /// 103: registering an asynchronous completion failed (reserved).
    AsyncRegistrationFailed,
    /// Any other non-zero value.
    Unknown(i32),
}

impl RuntimeCode {
    /// The code a raw value names; `None` for 0 (no error).
    pub const fn from_raw(code: i32) -> Option<RuntimeCode> {
        Some(match code {
            0 => return None,
            1 => RuntimeCode::ScopeDeadlock,
            2 => RuntimeCode::HeapRingDeadlock,
            3 => RuntimeCode::FlowControlDeadlock,
            4 => RuntimeCode::DepPoolOverflow,
            5 => RuntimeCode::InvalidArgs,
            7 => RuntimeCode::SyncStartCohort,
            8 => RuntimeCode::TensorWaitTimeout,
            9 => RuntimeCode::OrchestrationFatal,
            10 => RuntimeCode::CallableMismatch,
            11 => RuntimeCode::TensormapOverflow,
            12 => RuntimeCode::OverlappingArguments,
            100 => RuntimeCode::SchedulerTimeout,
            101 => RuntimeCode::AsyncCompletionTimeout,
            102 => RuntimeCode::AsyncCompletionFailed,
            103 => RuntimeCode::AsyncRegistrationFailed,
            other => RuntimeCode::Unknown(other),
        })
    }

    /// The raw value.
    pub const fn raw(self) -> i32 {
        match self {
            RuntimeCode::ScopeDeadlock => 1,
            RuntimeCode::HeapRingDeadlock => 2,
            RuntimeCode::FlowControlDeadlock => 3,
            RuntimeCode::DepPoolOverflow => 4,
            RuntimeCode::InvalidArgs => 5,
            RuntimeCode::SyncStartCohort => 7,
            RuntimeCode::TensorWaitTimeout => 8,
            RuntimeCode::OrchestrationFatal => 9,
            RuntimeCode::CallableMismatch => 10,
            RuntimeCode::TensormapOverflow => 11,
            RuntimeCode::OverlappingArguments => 12,
            RuntimeCode::SchedulerTimeout => 100,
            RuntimeCode::AsyncCompletionTimeout => 101,
            RuntimeCode::AsyncCompletionFailed => 102,
            RuntimeCode::AsyncRegistrationFailed => 103,
            RuntimeCode::Unknown(c) => c,
        }
    }

    /// Upper-case name.
    pub const fn name(self) -> &'static str {
        match self {
            RuntimeCode::ScopeDeadlock => "SCOPE_DEADLOCK",
            RuntimeCode::HeapRingDeadlock => "HEAP_RING_DEADLOCK",
            RuntimeCode::FlowControlDeadlock => "FLOW_CONTROL_DEADLOCK",
            RuntimeCode::DepPoolOverflow => "DEP_POOL_OVERFLOW",
            RuntimeCode::InvalidArgs => "INVALID_ARGS",
            RuntimeCode::SyncStartCohort => "SYNC_START_COHORT",
            RuntimeCode::TensorWaitTimeout => "TENSOR_WAIT_TIMEOUT",
            RuntimeCode::OrchestrationFatal => "ORCHESTRATION_FATAL",
            RuntimeCode::CallableMismatch => "CALLABLE_MISMATCH",
            RuntimeCode::TensormapOverflow => "TENSORMAP_OVERFLOW",
            RuntimeCode::OverlappingArguments => "OVERLAPPING_ARGUMENTS",
            RuntimeCode::SchedulerTimeout => "SCHEDULER_TIMEOUT",
            RuntimeCode::AsyncCompletionTimeout => "ASYNC_COMPLETION_TIMEOUT",
            RuntimeCode::AsyncCompletionFailed => "ASYNC_COMPLETION_FAILED",
            RuntimeCode::AsyncRegistrationFailed => "ASYNC_REGISTRATION_FAILED",
            RuntimeCode::Unknown(_) => "UNKNOWN",
        }
    }

    /// The code an orchestration's `report_fatal(code, …)` latches: `code` itself, except that
    /// 0 and `OVERLAPPING_ARGUMENTS` (whose detail only the runtime writes) become
    /// `ORCHESTRATION_FATAL`.
    pub const fn reported_by_orchestration(code: i32) -> RuntimeCode {
        match RuntimeCode::from_raw(code) {
            None | Some(RuntimeCode::OverlappingArguments) => RuntimeCode::OrchestrationFatal,
            Some(c) => c,
        }
    }

    /// Whether the code comes from the scheduler (100 and above) rather than orchestration.
    pub const fn is_scheduler(self) -> bool {
        self.raw() >= 100
    }
}

impl fmt::Display for RuntimeCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.raw())
    }
}

/// How the scheduler classified a stall (`docs/device-chip.md`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u32)]
pub enum StallClass {
    /// Not classified.
    Unknown = 0,
    /// S1: a task is running but never finishes.
    RunningStalled = 1,
    /// S3: ready tasks exist while cores are idle.
    ReadyNotDispatched = 3,
    /// S4: only waiting tasks remain (their producers never complete).
    OnlyWaiting = 4,
    /// S5: the orchestrator is not done but gives the scheduler nothing to do.
    OrchestratorIdle = 5,
}

impl StallClass {
    /// The class a raw value names.
    pub const fn from_u32(v: u32) -> StallClass {
        match v {
            1 => StallClass::RunningStalled,
            3 => StallClass::ReadyNotDispatched,
            4 => StallClass::OnlyWaiting,
            5 => StallClass::OrchestratorIdle,
            _ => StallClass::Unknown,
        }
    }

    /// Short label, e.g. `S1 running-stalled`.
    pub const fn label(self) -> &'static str {
        match self {
            StallClass::Unknown => "unclassified stall",
            StallClass::RunningStalled => "S1 running-stalled",
            StallClass::ReadyNotDispatched => "S3 ready-not-dispatched",
            StallClass::OnlyWaiting => "S4 only-waiting",
            StallClass::OrchestratorIdle => "S5 orchestrator-idle",
        }
    }
}

impl fmt::Display for StallClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}
