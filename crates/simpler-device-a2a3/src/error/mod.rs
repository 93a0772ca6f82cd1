//! `DeviceError`, the one error type of this crate (see `DeviceError`'s docs), and the fault records it carries.
//!
//! Every variant produced by a run carries its `run_id`. [`DeviceError::mechanism`] maps onto
//! the shared failure vocabulary of `simpler-types`, [`DeviceError::device_code`] returns the
//! original device number where one exists, and [`DeviceError::legacy_status`] returns what the
//! original's C entry would have returned, for cross-checks.
//!
//! Step labels (P1–P18, L1–L3, R1–R3, C1–C3) are the run-lifecycle steps defined in
//! `docs/device-runner.md`.

use std::fmt;
use std::time::Duration;

use simpler_types::{
    CallableId, DeviceCode, DeviceTaskId, FailureMechanism, RunId, TaskId, TimeoutBudget,
};

use crate::abi::CoreType;
use crate::abi::codes::{AclCode, RuntimeCode};
use crate::runner::DevicePtr;

mod args;
mod callable;
mod fault;
mod init;
mod labels;
pub use args::{ArgSite, ArgsProblem, ArityMismatch, OrchOp, PointerArg};
pub use callable::{CallableName, CallableProblem, KernelCodeKind, ObjectError, OrchLoadCause};
pub use fault::{ArgOverlap, RingSizes, RuntimeFault, StallInfo};
pub use init::InitFailure;
#[cfg(feature = "onboard")]
pub use init::ManifestProblem;
pub use labels::{
    CapacityResource, CopyKind, InitStep, KernelKind, MemPurpose, PoisonCause, PoisonStep, RunStep,
    StreamKind,
};

/// Formats a device task id as `task#r<ring>:<local>`: the task reference of every error
/// (`run#3/task#0`), with the chip's ring and ring-local id in place of the sequence number.
pub(crate) fn fmt_task(t: DeviceTaskId) -> String {
    if t.is_valid() { format!("task#r{}:{}", t.ring(), t.local()) } else { "no task".to_owned() }
}

/// How a host orchestration failed ([`DeviceError::Orchestration`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OrchFailure {
    /// The orchestration's entry panicked.
    #[error("the orchestration panicked: {message}")]
    Panicked {
        /// The panic payload's text (a panic carries no typed value).
        message: String,
    },
    /// The orchestration's config function panicked.
    #[error("the orchestration's config function panicked: {message}")]
    ConfigPanicked {
        /// The panic payload's text (a panic carries no typed value).
        message: String,
    },
    /// The orchestration returned an error of its own, with no error latched by the runtime
    /// (the source).
    #[error("the orchestration returned an error: {0}")]
    Returned(#[source] crate::OrchError),
}

/// One fault a core or stream reported, as attached to [`DeviceError::DeviceFault`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CoreFault {
    /// Device code of the fault.
    pub code: AclCode,
    /// Stream the fault was charged to.
    pub stream: StreamKind,
    /// Core index of the faulting AICore core, if a core faulted.
    pub core: Option<(u32, CoreType)>,
    /// Func id of the kernel that faulted, if known.
    pub func_id: Option<u32>,
    /// Device task id of the faulting task, if known.
    pub task: Option<DeviceTaskId>,
    /// What happened, in words (a panic message for a panicking kernel).
    pub message: String,
    /// Device counter (50 MHz) when the fault happened; orders faults earliest first.
    pub at_ticks: u64,
}

impl fmt::Display for CoreFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on the {}", self.code, self.stream)?;
        if let Some((idx, ty)) = self.core {
            write!(f, ", core {}{}", ty.name(), idx)?;
        }
        if let Some(func) = self.func_id {
            write!(f, ", func id {func}")?;
        }
        if let Some(task) = self.task {
            write!(f, ", {}", fmt_task(task))?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// How an error is grouped (the table in [`DeviceError`]'s docs).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum ErrorClass {
    /// A runtime status latched by orchestration (codes 1–11).
    Orchestration,
    /// A runtime status latched by the scheduler (codes 100–103).
    Scheduler,
    /// A launch was refused.
    LaunchFailure,
    /// A stream synchronisation exceeded its budget.
    StreamSyncTimeout,
    /// An AICore or AICPU fault, or an op timeout.
    DeviceFault,
    /// A kernel never finished and never faulted: the scheduler's no-progress watchdog caught
    /// it and the run ended as a device fault (the device is unusable afterwards).
    Hang,
    /// The device was already unusable.
    Poisoned,
    /// The call or its configuration was invalid.
    Usage,
    /// Memory or ring capacity ran out.
    Resources,
    /// Setup or host orchestration failed.
    Setup,
}

/// The error type of every fallible call of this crate.
///
/// Every variant a run produces carries its `run_id`. Three views classify an error without
/// matching every variant:
///
/// - [`class`](Self::class) groups it by what happened and what state the device is in:
///
///   | Class | Variants | Device afterwards |
///   |---|---|---|
///   | `Orchestration` | `Runtime` with codes 1–11 | healthy |
///   | `Scheduler` | `Runtime` with codes 100–103 (a stall the scheduler shut down cleanly) | healthy |
///   | `LaunchFailure` | `Launch` | unusable |
///   | `StreamSyncTimeout` | `Timeout { budget: StreamSync }` | unusable |
///   | `Hang` | `DeviceFault` whose latched status is a scheduler timeout and whose faults contain no core exception: a kernel never finished | unusable |
///   | `DeviceFault` | any other `DeviceFault`; `Timeout { budget: OpExecute }` | unusable |
///   | `Poisoned` | `Unusable`, `Abandoned`, `RunPanicked` that left it unusable | unusable |
///   | `Usage` | `InvalidConfig`, `OutputDirectory`, `InvalidArgs`, `InvalidTaskArgs`, `RunIdReused`, `OverlappingArguments`, `InvalidCallable`, `UnknownCallable`, `TooManyCallables`, `CallableInUse`, `CallableNotPrepared`, `Busy`, `StaleRun`, `Finalized`, `BadDevicePointer`, `Unsupported` | unchanged |
///   | `Resources` | `OutOfMemory`, `Capacity`; onboard `AllocRefused` for want of memory | unchanged |
///   | `Setup` | `Init`, `Orchestration`, `OrchestrationLoad`, `RunPanicked` that left the device usable; onboard `Load`, `Acl`, `CopyRefused` and any other `AllocRefused` | unchanged |
///
/// - [`timed_out`](Self::timed_out) (and [`is_timeout`](Self::is_timeout)) answers "did it
///   time out or hang?" with the budget that fired: a `Timeout`, a `Runtime` scheduler stall,
///   and a hung kernel. A hung kernel arrives as a `DeviceFault` — the scheduler's watchdog
///   latched SCHEDULER_TIMEOUT, sent the exit signal, the hung core never answered, so the
///   AICPU's shutdown was unclean (an AICPU exception code) — and is classified by its latched
///   stall, not by that code. A kernel that faulted (a core exception) is not a timeout even
///   though the scheduler's watchdog also latched a stall for it.
/// - [`mechanism`](Self::mechanism) maps onto the shared failure vocabulary of
///   `simpler-types`, consistently with `timed_out`: every error `timed_out` names is
///   `FailureMechanism::Timeout` with that budget.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// A chip runtime latched a status during the run (orchestration or scheduler code).
    #[error("{run_id}: {fault}")]
    Runtime {
        /// The run.
        run_id: RunId,
        /// The latched status.
        fault: Box<RuntimeFault>,
    },
    /// A kernel launch (or an event that frames it on a queueing device) was refused; the
    /// device is unusable afterwards.
    #[error("{run_id}: device fault: {kernel} launch refused with {code}{}", fmt_why(message))]
    Launch {
        /// The run.
        run_id: RunId,
        /// Which launch.
        kernel: KernelKind,
        /// The device code.
        code: AclCode,
        /// Why, in words; empty when the typed CANN error below (the source) says it.
        message: String,
        /// Onboard: the CANN call that refused it, with its code, name and CANN's recent
        /// message.
        #[cfg(feature = "onboard")]
        #[source]
        acl: Option<Box<simpler_acl_sys::AclError>>,
    },
    /// A budget expired (stream sync on both backends; op execute on the simulator).
    #[error(
        "{run_id}: timeout ({budget} budget of {limit:?}){}{}",
        fmt_runtime(runtime),
        fmt_faults(faults)
    )]
    Timeout {
        /// The run.
        run_id: RunId,
        /// Which budget.
        budget: TimeoutBudget,
        /// Its value.
        limit: Duration,
        /// The latched runtime status read afterwards, if any.
        runtime: Option<Box<RuntimeFault>>,
        /// Faults reported by the streams, earliest first.
        faults: Vec<CoreFault>,
        /// Onboard, for an op-execute timeout: the CANN call that reported the AICore timeout
        /// (the stream or event sync), with its code, name and CANN's recent message.
        #[cfg(feature = "onboard")]
        #[source]
        acl: Option<Box<simpler_acl_sys::AclError>>,
    },
    /// A stream reported a device fault; the device is unusable afterwards.
    #[error(
        "{run_id}: device fault {code} on the {stream}{}{}",
        fmt_runtime(runtime),
        fmt_faults(faults)
    )]
    DeviceFault {
        /// The run.
        run_id: RunId,
        /// Code of the earliest fault.
        code: AclCode,
        /// Stream of the earliest fault.
        stream: StreamKind,
        /// Every fault collected, earliest first.
        faults: Vec<CoreFault>,
        /// The latched runtime status, if any.
        runtime: Option<Box<RuntimeFault>>,
        /// Onboard: the CANN call whose failure reported the fault (the stream or event sync),
        /// with its code, name and CANN's recent message.
        #[cfg(feature = "onboard")]
        #[source]
        acl: Option<Box<simpler_acl_sys::AclError>>,
    },
    /// The run was prepared (or queued) behind run `after`, whose failure made the device
    /// unusable before this run could execute; the run never ran. Its own error is never
    /// `after`'s error, and it never silently succeeds.
    #[error("{run_id}: abandoned after {after} made device {device_id} unusable: {cause}")]
    Abandoned {
        /// The abandoned run.
        run_id: RunId,
        /// The run whose failure poisoned the device.
        after: RunId,
        /// The device id.
        device_id: u32,
        /// What made it unusable.
        cause: PoisonCause,
    },
    /// The runner is unusable since an earlier failure; only `finalize` helps.
    #[error("device {device_id} is unusable: {cause}")]
    Unusable {
        /// The device id.
        device_id: u32,
        /// What made it unusable.
        cause: PoisonCause,
    },
    /// A configuration value broke a rule.
    #[error("{}invalid configuration: {setting} = {value:?}: {rule}", fmt_run(run_id))]
    InvalidConfig {
        /// The run, when the configuration was a run's.
        run_id: Option<RunId>,
        /// The setting (an environment variable or option name).
        setting: String,
        /// Its value.
        value: String,
        /// The rule it broke.
        rule: String,
    },
    /// A run's diagnostics are on and its output directory cannot be created.
    #[error(
        "{}invalid configuration: CallConfig.output_prefix = {:?}: must be a creatable directory: {source}",
        fmt_run(run_id),
        path.display()
    )]
    OutputDirectory {
        /// The run, when the configuration was a run's.
        run_id: Option<RunId>,
        /// The directory.
        path: std::path::PathBuf,
        /// The system's refusal.
        #[source]
        source: std::io::Error,
    },
    /// The arguments of a call or of a submitted task were invalid.
    #[error("{}invalid arguments: {problem}", fmt_run(run_id))]
    InvalidArgs {
        /// The run, if the arguments were a run's.
        run_id: Option<RunId>,
        /// What was wrong, with the values.
        #[source]
        problem: ArgsProblem,
    },
    /// A task's argument list, or one of its tensor descriptors, broke a rule of
    /// `simpler-types` (the source).
    #[error("{}invalid arguments: {}{source}", fmt_run(run_id), fmt_arg(arg))]
    InvalidTaskArgs {
        /// The run, if the arguments were a run's.
        run_id: Option<RunId>,
        /// The tensor argument refused, when one was (its index).
        arg: Option<usize>,
        /// The rule it broke, with the offending values.
        #[source]
        source: simpler_types::TypesError,
    },
    /// The runner already ran (or prepared) a run with this id and origin; its reports and
    /// trace files would overwrite each other. Ids are remembered for the runner's last
    /// `RUN_ID_MEMORY` runs (`docs/device-runner.md`).
    #[error("{run_id}: the run id{} was already used on this runner", fmt_origin(origin))]
    RunIdReused {
        /// The refused run id.
        run_id: RunId,
        /// The engine task the request named (`RunRequest::with_origin`), if any.
        origin: Option<TaskId>,
    },
    /// A chip task's written tensor (by its tag, or by its kernel's signature whatever the tag)
    /// shares bytes with another tensor argument of the same task: its kernel would write
    /// memory it also reads or writes through the other argument.
    #[error(
        "{run_id}/task#{task}: written tensor {written} overlaps tensor {other} of the same \
         task; a task must not write bytes it also accesses through another argument"
    )]
    OverlappingArguments {
        /// The run.
        run_id: RunId,
        /// The task's index in submission order.
        task: u64,
        /// Index of the written tensor (by its tag, or by its kernel's signature).
        written: usize,
        /// Index of the tensor it overlaps.
        other: usize,
    },
    /// A callable broke a limit or uses a code variant this backend cannot execute.
    #[error("{}invalid callable: {problem}", fmt_run(run_id))]
    InvalidCallable {
        /// The run, when a run's preparation found the callable unusable.
        run_id: Option<RunId>,
        /// What was wrong, with the values.
        #[source]
        problem: CallableProblem,
    },
    /// The AICPU side did not load a `DeviceObject` orchestration at registration
    /// (tensormap_and_ringbuffer); the registration was undone.
    #[error(
        "callable slot {slot}: the AICPU side did not load orchestration {entry:?}: {}{cause}",
        fmt_load_failure(*failure)
    )]
    OrchestrationLoad {
        /// The slot being registered.
        slot: u32,
        /// The orchestration's entry symbol.
        entry: String,
        /// What the AICPU program's register entry reported; `None` when it wrote no reply
        /// (the launch never ran it).
        failure: Option<crate::abi::launch::RegisterFailure>,
        /// Why: the register entry's text, or what the host saw.
        #[source]
        cause: OrchLoadCause,
    },
    /// No callable is registered in the slot.
    #[error("{}unknown callable slot {slot}", fmt_run(run_id))]
    UnknownCallable {
        /// The run, if a run named the slot.
        run_id: Option<RunId>,
        /// The slot.
        slot: u32,
    },
    /// All callable slots are taken.
    #[error("too many callables: all {capacity} slots are registered")]
    TooManyCallables {
        /// Number of slots.
        capacity: usize,
    },
    /// The callable is used by a prepared or in-flight run.
    #[error("callable slot {slot} is in use by {run_id}")]
    CallableInUse {
        /// The slot.
        slot: u32,
        /// The run using it.
        run_id: RunId,
    },
    /// The call is not allowed in the runner's current run state (a run is prepared,
    /// launched or reaped and not yet completed, or none is).
    #[error("busy: {call} is not allowed while {state}")]
    Busy {
        /// The call that was refused.
        call: &'static str,
        /// The state that refused it.
        state: String,
    },
    /// A run handle whose run already ended (or that belongs to another runner).
    #[error("{call}: the handle of {run_id} is stale (slot {slot}, generation {generation})")]
    StaleRun {
        /// The call that was refused.
        call: &'static str,
        /// The run the handle named.
        run_id: RunId,
        /// The resource slot it named.
        slot: usize,
        /// The slot generation it named.
        generation: u64,
    },
    /// The runner (or the chip holding it) was finalized; nothing can run on it any more.
    #[error("{call}: the device runner is finalized")]
    Finalized {
        /// The call that was refused.
        call: &'static str,
    },
    /// A run named a callable that is not prepared (registered) on this chip.
    #[error("{}{call}: callable {callable} is not prepared on this chip", fmt_run(run_id))]
    CallableNotPrepared {
        /// The run, if a run named the callable.
        run_id: Option<RunId>,
        /// The call that was refused.
        call: &'static str,
        /// The callable's content id.
        callable: CallableId,
    },
    /// The code driving a run's `step` panicked; the panic was caught and the run ended with
    /// this error. A panic out of the runner's launch or reap leaves the device unusable until
    /// `finalize` (it may still run the launch): `unusable` then says so, and the error counts
    /// as poisoning the device ([`poisons_device`](Self::poisons_device)).
    #[error(
        "{}the run's {step} panicked: {message}{}",
        fmt_run(run_id),
        unusable.map(|c| format!("; the device is unusable: {c}")).unwrap_or_default()
    )]
    RunPanicked {
        /// The run.
        run_id: Option<RunId>,
        /// The step that panicked.
        step: RunStep,
        /// The panic payload's text (a panic carries no typed value).
        message: String,
        /// What made the device unusable, when the panic did.
        unusable: Option<PoisonCause>,
    },
    /// An address range is not inside one tracked device allocation.
    #[error(
        "{}bad device pointer: {len} bytes at {addr}{} are not inside one device allocation",
        fmt_run(run_id),
        arg.map(|i| format!(" (chip argument {i})")).unwrap_or_default()
    )]
    BadDevicePointer {
        /// The run, when a run's arguments or image named the range.
        run_id: Option<RunId>,
        /// The run's chip argument that named the range, when a device-memory argument did
        /// (not for the staging of host arguments, whose range several arguments share).
        arg: Option<usize>,
        /// Start of the range.
        addr: DevicePtr,
        /// Length of the range.
        len: u64,
    },
    /// A feature is not implemented by this version or backend.
    #[error("{}unsupported: {feature}", fmt_run(run_id))]
    Unsupported {
        /// The run, if a run asked for it.
        run_id: Option<RunId>,
        /// The feature.
        feature: String,
        /// What refused it, when a call did (onboard: the driver's refusal to map an image to
        /// the host).
        #[source]
        cause: Option<Box<DeviceError>>,
    },
    /// The simulated device's memory ran out (its limit, or the host allocator refused). The
    /// onboard backend reports what CANN refused as `AllocRefused`, with CANN's code.
    #[error(
        "{}out of device memory: {bytes} bytes for the {purpose}{}",
        fmt_run(run_id),
        fmt_limit(limit)
    )]
    OutOfMemory {
        /// The run, if the allocation was a run's.
        run_id: Option<RunId>,
        /// Requested bytes.
        bytes: u64,
        /// What the allocation was for.
        purpose: MemPurpose,
        /// The simulator's memory limit, when it was the limit that refused.
        limit: Option<u64>,
    },
    /// A run needs more of a ring resource than configured.
    #[error(
        "{run_id}: capacity exhausted: ring {ring} {resource}: needed {}{needed}, capacity {capacity}",
        if *at_least { "at least " } else { "" }
    )]
    Capacity {
        /// The run.
        run_id: RunId,
        /// The ring.
        ring: u8,
        /// The resource.
        resource: CapacityResource,
        /// The configured capacity.
        capacity: u64,
        /// What the run needed.
        needed: u64,
        /// `needed` is a lower bound: the orchestration was told to stop (its call returned
        /// the capacity status) before it had asked for everything it would have used.
        at_least: bool,
    },
    /// Setting up the device failed.
    #[error("{}device init failed at {step}: {failure}", fmt_run(run_id))]
    Init {
        /// The run whose preparation (P5) initialized the device, if any.
        run_id: Option<RunId>,
        /// The step.
        step: InitStep,
        /// What went wrong (a system or CANN error is its source).
        #[source]
        failure: InitFailure,
    },
    /// Host orchestration (hbg graph build) failed, including a caught panic.
    #[error("{run_id}: orchestration failed: {failure}")]
    Orchestration {
        /// The run.
        run_id: RunId,
        /// How it failed (an error the orchestration returned is the source).
        #[source]
        failure: OrchFailure,
    },
    /// The CANN libraries could not be loaded (onboard backend): the source lists every path
    /// tried with its `dlerror`, or every missing symbol.
    #[cfg(feature = "onboard")]
    #[error("CANN could not be loaded: {source}")]
    Load {
        /// What the loader tried.
        #[source]
        source: Box<simpler_acl_sys::LoadError>,
    },
    /// A CANN call returned an error code (onboard backend).
    #[cfg(feature = "onboard")]
    #[error("{}{}{source}", fmt_run(run_id), fmt_init(init))]
    Acl {
        /// The run, if a run's preparation made the call.
        run_id: Option<RunId>,
        /// The `ensure_initialized` step, when the call was part of device setup.
        init: Option<InitStep>,
        /// The failed call: function, code, its CANN name and meaning, CANN's recent message.
        #[source]
        source: Box<simpler_acl_sys::AclError>,
    },
    /// CANN refused a device allocation (onboard backend), for want of memory (207001,
    /// classed with `OutOfMemory`) or for another reason its code names.
    #[cfg(feature = "onboard")]
    #[error(
        "{}device allocation of {bytes} bytes for the {purpose} refused: {source}",
        fmt_run(run_id)
    )]
    AllocRefused {
        /// The run, if the allocation was a run's.
        run_id: Option<RunId>,
        /// Requested bytes.
        bytes: u64,
        /// What the allocation was for.
        purpose: MemPurpose,
        /// The refused call: function, code, its CANN name and meaning, CANN's recent message.
        #[source]
        source: Box<simpler_acl_sys::AclError>,
    },
    /// CANN refused a copy or memset of a range inside one tracked allocation (onboard
    /// backend).
    #[cfg(feature = "onboard")]
    #[error("{}{kind} of {len} bytes at {addr} refused: {source}", fmt_run(run_id))]
    CopyRefused {
        /// The run, if the transfer was a run's.
        run_id: Option<RunId>,
        /// Which transfer.
        kind: CopyKind,
        /// Start of the device range.
        addr: DevicePtr,
        /// Length of the range.
        len: u64,
        /// The refused call: function, code, its CANN name and meaning, CANN's recent message.
        #[source]
        source: Box<simpler_acl_sys::AclError>,
    },
}

/// Whether CANN's `code` says the device ran out of memory.
#[cfg(feature = "onboard")]
fn out_of_memory(code: i32) -> bool {
    code == simpler_acl_sys::types::ACL_ERROR_RT_MEMORY_ALLOCATION
}

#[cfg(feature = "onboard")]
fn fmt_init(init: &Option<InitStep>) -> String {
    init.map(|s| format!("device init failed at {s}: ")).unwrap_or_default()
}

fn fmt_run(run_id: &Option<RunId>) -> String {
    run_id.map(|r| format!("{r}: ")).unwrap_or_default()
}

fn fmt_arg(arg: &Option<usize>) -> String {
    arg.map(|i| format!("chip argument {i}: ")).unwrap_or_default()
}

fn fmt_origin(origin: &Option<TaskId>) -> String {
    origin.map(|t| format!(" (for {t})")).unwrap_or_default()
}

fn fmt_limit(limit: &Option<u64>) -> String {
    limit.map(|l| format!(" (memory limit {l} bytes)")).unwrap_or_default()
}

fn fmt_why(message: &str) -> String {
    if message.is_empty() { String::new() } else { format!(": {message}") }
}

fn fmt_runtime(runtime: &Option<Box<RuntimeFault>>) -> String {
    runtime.as_ref().map(|r| format!("; latched {r}")).unwrap_or_default()
}

fn fmt_faults(faults: &[CoreFault]) -> String {
    let mut s = String::new();
    for f in faults {
        s.push_str("; ");
        s.push_str(&f.to_string());
    }
    s
}

/// The prefix naming a register-entry failure in `OrchestrationLoad`'s message.
fn fmt_load_failure(f: Option<crate::abi::launch::RegisterFailure>) -> &'static str {
    use crate::abi::launch::RegisterFailure;
    match f {
        None => "the register entry wrote no reply: ",
        Some(RegisterFailure::BadArgs) => "malformed registration: ",
        Some(RegisterFailure::Write) => "writing the object failed: ",
        Some(RegisterFailure::Load) => "the loader refused the object: ",
        Some(RegisterFailure::Symbol) => "a symbol is missing: ",
    }
}

impl DeviceError {
    /// The run the error belongs to, if it came from one.
    pub fn run_id(&self) -> Option<RunId> {
        match self {
            DeviceError::Runtime { run_id, .. }
            | DeviceError::Launch { run_id, .. }
            | DeviceError::Timeout { run_id, .. }
            | DeviceError::DeviceFault { run_id, .. }
            | DeviceError::Capacity { run_id, .. }
            | DeviceError::Orchestration { run_id, .. }
            | DeviceError::CallableInUse { run_id, .. }
            | DeviceError::RunIdReused { run_id, .. }
            | DeviceError::StaleRun { run_id, .. }
            | DeviceError::Abandoned { run_id, .. }
            | DeviceError::OverlappingArguments { run_id, .. } => Some(*run_id),
            DeviceError::InvalidConfig { run_id, .. }
            | DeviceError::OutputDirectory { run_id, .. }
            | DeviceError::InvalidArgs { run_id, .. }
            | DeviceError::InvalidTaskArgs { run_id, .. }
            | DeviceError::UnknownCallable { run_id, .. }
            | DeviceError::Unsupported { run_id, .. }
            | DeviceError::OutOfMemory { run_id, .. }
            | DeviceError::InvalidCallable { run_id, .. }
            | DeviceError::BadDevicePointer { run_id, .. }
            | DeviceError::CallableNotPrepared { run_id, .. }
            | DeviceError::RunPanicked { run_id, .. }
            | DeviceError::Init { run_id, .. } => *run_id,
            DeviceError::OrchestrationLoad { .. } => None,
            #[cfg(feature = "onboard")]
            DeviceError::Acl { run_id, .. }
            | DeviceError::AllocRefused { run_id, .. }
            | DeviceError::CopyRefused { run_id, .. } => *run_id,
            #[cfg(feature = "onboard")]
            DeviceError::Load { .. } => None,
            DeviceError::Unusable { .. }
            | DeviceError::TooManyCallables { .. }
            | DeviceError::Finalized { .. }
            | DeviceError::Busy { .. } => None,
        }
    }

    /// The same error attributed to `run` when it carries an optional run id that is unset.
    pub(crate) fn in_run(mut self, run: RunId) -> DeviceError {
        match &mut self {
            DeviceError::InvalidConfig { run_id, .. }
            | DeviceError::OutputDirectory { run_id, .. }
            | DeviceError::InvalidArgs { run_id, .. }
            | DeviceError::InvalidTaskArgs { run_id, .. }
            | DeviceError::UnknownCallable { run_id, .. }
            | DeviceError::Unsupported { run_id, .. }
            | DeviceError::OutOfMemory { run_id, .. }
            | DeviceError::InvalidCallable { run_id, .. }
            | DeviceError::BadDevicePointer { run_id, .. }
            | DeviceError::CallableNotPrepared { run_id, .. }
            | DeviceError::RunPanicked { run_id, .. }
            | DeviceError::Init { run_id, .. } => {
                run_id.get_or_insert(run);
            }
            #[cfg(feature = "onboard")]
            DeviceError::Acl { run_id, .. }
            | DeviceError::AllocRefused { run_id, .. }
            | DeviceError::CopyRefused { run_id, .. } => {
                run_id.get_or_insert(run);
            }
            _ => {}
        }
        self
    }

    /// The group the error belongs to (the table in the type's docs).
    pub fn class(&self) -> ErrorClass {
        match self {
            DeviceError::Runtime { fault, .. } if fault.code.is_scheduler() => {
                ErrorClass::Scheduler
            }
            DeviceError::Runtime { .. } => ErrorClass::Orchestration,
            DeviceError::Launch { .. } => ErrorClass::LaunchFailure,
            DeviceError::Timeout { budget: TimeoutBudget::StreamSync, .. } => {
                ErrorClass::StreamSyncTimeout
            }
            DeviceError::DeviceFault { .. } if self.is_hang() => ErrorClass::Hang,
            DeviceError::Timeout { .. } | DeviceError::DeviceFault { .. } => {
                ErrorClass::DeviceFault
            }
            DeviceError::Unusable { .. } | DeviceError::Abandoned { .. } => ErrorClass::Poisoned,
            DeviceError::InvalidConfig { .. }
            | DeviceError::OutputDirectory { .. }
            | DeviceError::InvalidArgs { .. }
            | DeviceError::InvalidTaskArgs { .. }
            | DeviceError::RunIdReused { .. }
            | DeviceError::OverlappingArguments { .. }
            | DeviceError::InvalidCallable { .. }
            | DeviceError::UnknownCallable { .. }
            | DeviceError::TooManyCallables { .. }
            | DeviceError::CallableInUse { .. }
            | DeviceError::Busy { .. }
            | DeviceError::StaleRun { .. }
            | DeviceError::Finalized { .. }
            | DeviceError::CallableNotPrepared { .. }
            | DeviceError::BadDevicePointer { .. }
            | DeviceError::Unsupported { .. } => ErrorClass::Usage,
            DeviceError::OutOfMemory { .. } | DeviceError::Capacity { .. } => ErrorClass::Resources,
            DeviceError::RunPanicked { unusable: Some(_), .. } => ErrorClass::Poisoned,
            DeviceError::Init { .. }
            | DeviceError::RunPanicked { .. }
            | DeviceError::OrchestrationLoad { .. }
            | DeviceError::Orchestration { .. } => ErrorClass::Setup,
            #[cfg(feature = "onboard")]
            DeviceError::AllocRefused { source, .. } if out_of_memory(source.code) => {
                ErrorClass::Resources
            }
            #[cfg(feature = "onboard")]
            DeviceError::Load { .. }
            | DeviceError::Acl { .. }
            | DeviceError::AllocRefused { .. }
            | DeviceError::CopyRefused { .. } => ErrorClass::Setup,
        }
    }

    /// Whether this is a device fault caused by a kernel that never finished: the latched
    /// status is a scheduler stall and no core reported an exception.
    fn is_hang(&self) -> bool {
        match self {
            DeviceError::DeviceFault { runtime: Some(rt), faults, .. } => {
                rt.stall.is_some() && !faults.iter().any(|f| f.code == AclCode::AICORE_EXCEPTION)
            }
            _ => false,
        }
    }

    /// The budget that fired and its value, when the error means that something did not
    /// finish in time: a `Timeout`, a scheduler stall latched by the runtime, or a hung kernel
    /// (see the type's docs).
    pub fn timed_out(&self) -> Option<(TimeoutBudget, Duration)> {
        match self {
            DeviceError::Timeout { budget, limit, .. } => Some((*budget, *limit)),
            DeviceError::Runtime { fault, .. } => {
                fault.stall.as_ref().map(|s| (TimeoutBudget::DeviceScheduler, s.budget))
            }
            DeviceError::DeviceFault { runtime: Some(rt), .. } if self.is_hang() => {
                rt.stall.as_ref().map(|s| (TimeoutBudget::DeviceScheduler, s.budget))
            }
            _ => None,
        }
    }

    /// Whether something timed out or hung ([`timed_out`](Self::timed_out) names the budget).
    pub fn is_timeout(&self) -> bool {
        self.timed_out().is_some()
    }

    /// The original device or runtime number, with its name, where one exists.
    pub fn device_code(&self) -> Option<DeviceCode> {
        match self {
            DeviceError::Runtime { fault, .. } => {
                Some(DeviceCode::new(fault.code.raw(), fault.code.name()))
            }
            DeviceError::Launch { code, .. } | DeviceError::DeviceFault { code, .. } => {
                Some(DeviceCode::new(code.get(), code.name()))
            }
            DeviceError::Timeout { budget: TimeoutBudget::OpExecute, .. } => {
                Some(DeviceCode::new(AclCode::AICORE_TIMEOUT.get(), AclCode::AICORE_TIMEOUT.name()))
            }
            DeviceError::Timeout { .. } => Some(DeviceCode::new(
                AclCode::STREAM_SYNC_TIMEOUT.get(),
                AclCode::STREAM_SYNC_TIMEOUT.name(),
            )),
            DeviceError::Unusable { cause, .. } | DeviceError::Abandoned { cause, .. } => {
                Some(DeviceCode::new(cause.code.get(), cause.code.name()))
            }
            DeviceError::OutOfMemory { .. } => {
                Some(DeviceCode::new(AclCode::LAUNCH_FAILED.get(), AclCode::LAUNCH_FAILED.name()))
            }
            #[cfg(feature = "onboard")]
            DeviceError::Acl { source, .. }
            | DeviceError::AllocRefused { source, .. }
            | DeviceError::CopyRefused { source, .. } => {
                Some(DeviceCode::new(source.code, source.name))
            }
            _ => None,
        }
    }

    /// The failure mechanism in the shared vocabulary (`simpler_types::FailureMechanism`).
    pub fn mechanism(&self) -> FailureMechanism {
        if let Some((budget, limit)) = self.timed_out() {
            return FailureMechanism::Timeout { budget, limit };
        }
        match self {
            // Stalls and `Timeout` were answered by `timed_out` above.
            DeviceError::Runtime { fault, .. } => match fault.code {
                RuntimeCode::OrchestrationFatal | RuntimeCode::InvalidArgs => {
                    FailureMechanism::TaskFailed
                }
                code => FailureMechanism::CapacityExhausted { what: code.name().to_owned() },
            },
            DeviceError::Capacity { ring, resource, capacity, .. } => {
                FailureMechanism::CapacityExhausted {
                    what: format!("ring {ring} {resource}: {capacity}"),
                }
            }
            DeviceError::OutOfMemory { bytes, purpose, .. } => {
                FailureMechanism::CapacityExhausted {
                    what: format!("device memory: {bytes} bytes for the {purpose}"),
                }
            }
            DeviceError::Orchestration { .. }
            | DeviceError::InvalidArgs { .. }
            | DeviceError::InvalidTaskArgs { .. }
            | DeviceError::RunIdReused { .. }
            | DeviceError::OverlappingArguments { .. }
            | DeviceError::InvalidConfig { .. }
            | DeviceError::OutputDirectory { .. }
            | DeviceError::UnknownCallable { .. }
            | DeviceError::Unsupported { .. } => FailureMechanism::TaskFailed,
            DeviceError::Busy { .. }
            | DeviceError::StaleRun { .. }
            | DeviceError::Finalized { .. }
            | DeviceError::CallableNotPrepared { .. }
            | DeviceError::RunPanicked { .. }
            | DeviceError::InvalidCallable { .. }
            | DeviceError::OrchestrationLoad { .. }
            | DeviceError::TooManyCallables { .. }
            | DeviceError::CallableInUse { .. }
            | DeviceError::BadDevicePointer { .. }
            | DeviceError::Init { .. } => FailureMechanism::EndpointFailed,
            #[cfg(feature = "onboard")]
            DeviceError::AllocRefused { bytes, purpose, source, .. }
                if out_of_memory(source.code) =>
            {
                FailureMechanism::CapacityExhausted {
                    what: format!("device memory: {bytes} bytes for the {purpose}"),
                }
            }
            #[cfg(feature = "onboard")]
            DeviceError::Load { .. }
            | DeviceError::Acl { .. }
            | DeviceError::AllocRefused { .. }
            | DeviceError::CopyRefused { .. } => FailureMechanism::EndpointFailed,
            DeviceError::Launch { .. }
            | DeviceError::DeviceFault { .. }
            | DeviceError::Timeout { .. }
            | DeviceError::Unusable { .. }
            | DeviceError::Abandoned { .. } => FailureMechanism::DeviceFault,
        }
    }

    /// What the original's C entry would have returned for this error.
    pub fn legacy_status(&self) -> i32 {
        match self {
            DeviceError::Runtime { fault, .. } => fault.code.raw(),
            DeviceError::Launch { code, .. } | DeviceError::DeviceFault { code, .. } => code.get(),
            DeviceError::Timeout { budget: TimeoutBudget::OpExecute, .. } => {
                AclCode::AICORE_TIMEOUT.get()
            }
            DeviceError::Timeout { .. } => AclCode::STREAM_SYNC_TIMEOUT.get(),
            DeviceError::OutOfMemory { .. } => AclCode::LAUNCH_FAILED.get(),
            _ => -1,
        }
    }

    /// Whether the device is unusable after this error (see `DeviceError`'s docs).
    pub fn poisons_device(&self) -> bool {
        matches!(
            self,
            DeviceError::Launch { .. }
                | DeviceError::Timeout { .. }
                | DeviceError::DeviceFault { .. }
                | DeviceError::Unusable { .. }
                | DeviceError::Abandoned { .. }
                | DeviceError::RunPanicked { unusable: Some(_), .. }
        )
    }
}

#[cfg(test)]
mod tests;
