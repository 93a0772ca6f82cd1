//! [`WorkerError`] and [`MemError`], the errors of worker and memory calls.
//!
//! `Display` and `Error` are written out rather than derived so that a typed error kept behind
//! a pointer (a chip's [`DeviceError`], a chip process's [`ChildError`]) is next in the source
//! chain as itself, not as its `Box` or `Arc`: code that walks the chain with
//! `downcast_ref::<DeviceError>()` finds it.

use std::collections::TryReserveError;
use std::error::Error;
use std::fmt;
use std::sync::Arc;

use simpler_device_a2a3::DeviceError;
use simpler_sched::SchedError;
use simpler_types::{CallableKind, DeviceCode, RunId, TypesError, WorkerId};

use super::{BuildFailure, InWorkerTerms, RegistrationFailure, RunError, rollback_note};
use crate::handle::CallableHandle;
use crate::host_buffer::HostAddr;
use crate::process::ChildError;

/// Errors of [`Worker`](crate::Worker) calls other than start and close.
#[derive(Debug)]
#[non_exhaustive]
pub enum WorkerError {
    /// The worker is closed (or closing).
    Closed,
    /// The operation does not exist at this worker's level.
    WrongLevel {
        /// The operation.
        op: &'static str,
        /// The worker's level.
        level: u8,
    },
    /// The call was made from inside one of this worker's own callbacks, closures or child
    /// runs, or from a call running on one of its chip lanes, where waiting for the worker
    /// would deadlock.
    Reentrant {
        /// The operation.
        op: &'static str,
        /// The worker's label.
        worker: String,
    },
    /// The graph of a run could not be built; the run was drained and retired.
    Build {
        /// The run.
        run: RunId,
        /// Why (the source).
        cause: BuildFailure,
    },
    /// The run failed (returned by [`Worker::run`](crate::Worker::run) only).
    Run(RunError),
    /// The handle was unregistered.
    UnknownCallable {
        /// The handle.
        handle: CallableHandle,
    },
    /// The handle belongs to another worker.
    ForeignHandle {
        /// The handle.
        handle: CallableHandle,
    },
    /// The callable's kind cannot run where it was submitted.
    WrongCallableKind {
        /// The handle's kind.
        kind: CallableKind,
        /// Where it was submitted ("a chip", "a sub worker", "a child worker").
        target: &'static str,
    },
    /// No worker of the pool the callable needs exists.
    NoEligibleTarget {
        /// The callable's name.
        callable: String,
        /// What it needs ("sub workers", "chips", "child workers").
        needs: &'static str,
    },
    /// No chip or child has this id.
    NoSuchChild {
        /// The id.
        id: WorkerId,
    },
    /// A chip is named twice in one registration's list of chips.
    DuplicateChip {
        /// The callable's name.
        callable: String,
        /// The chip named twice.
        chip: WorkerId,
    },
    /// Preparing or removing a chip callable failed; for a registration, successful chips
    /// were rolled back.
    Registration {
        /// The callable's name.
        callable: String,
        /// The chip that failed.
        chip: WorkerId,
        /// The chip's error, or its process's (PROCESS mode); the source.
        source: Box<RegistrationFailure>,
        /// Chips whose rollback failed; the (chip, callable) pair is unusable there.
        rollback_failed: Vec<WorkerId>,
    },
    /// Removing this content from the chip failed earlier (a failed rollback or
    /// unregistration), so its state on the chip is unknown; the (chip, callable) pair stays
    /// unusable until the worker closes.
    CallableUnusable {
        /// The callable's name.
        callable: String,
        /// The chip.
        chip: WorkerId,
    },
    /// The content is being removed from a chip; register it again once the runs that pin it
    /// have finished.
    RemovalPending {
        /// The callable's name.
        callable: String,
        /// The chip.
        chip: WorkerId,
    },
    /// A chip task's configuration exceeds a launch limit of the chip's platform; refused at
    /// submit, before the task joins the graph. No task id exists yet, so the task is named by
    /// its run, callable and target chip.
    ConfigOutOfRange {
        /// The run being built.
        run: RunId,
        /// The callable's name.
        callable: String,
        /// The target chip (the first target of a group).
        chip: WorkerId,
        /// The setting, as `CallConfig.<field>`.
        setting: &'static str,
        /// Its value.
        value: u32,
        /// The largest value the platform accepts.
        limit: u32,
    },
    /// A device-memory call failed.
    Memory(MemError),
    /// A chip is unusable after a fault. The typed error behind it, when there is one, is the
    /// source: the device's own (`device`) or the chip process's failure (`child`).
    DeviceUnusable {
        /// The chip.
        chip: WorkerId,
        /// The device's code, when known.
        code: Option<DeviceCode>,
        /// What made it unusable.
        message: String,
        /// PROCESS mode: the failure of the chip's process that made it unusable.
        child: Option<Box<ChildError>>,
        /// A chip in this process: the device's error that said it is unusable.
        device: Option<Arc<DeviceError>>,
    },
    /// The chip's device refused a call that belongs to no run (the source).
    Device {
        /// The chip.
        chip: WorkerId,
        /// The device's error.
        source: Box<DeviceError>,
    },
    /// An engine call inside a graph callback failed.
    Engine(SchedError),
    /// A chip task names host memory (`child_memory = 0`) that is not a [`HostBuffer`], so
    /// its chip lane could not stage it (refused at submit).
    ///
    /// [`HostBuffer`]: crate::HostBuffer
    HostTensorNotStaged {
        /// Index of the tensor argument.
        arg: usize,
        /// The tensor's buffer address.
        addr: HostAddr,
        /// The tensor's buffer size in bytes.
        len: u64,
    },
    /// A tensor's base address lies inside a [`HostBuffer`] but is not the buffer's own
    /// address (refused at submit). The engine orders tensors by base address, so such a
    /// tensor would not be ordered against the buffer's other views.
    ///
    /// [`HostBuffer`]: crate::HostBuffer
    HostTensorOffsetBase {
        /// Index of the tensor argument.
        arg: usize,
        /// The tensor's base address.
        addr: HostAddr,
        /// The address of the host buffer it lies in.
        buffer: HostAddr,
    },
    /// A chip-memory tensor's base address lies inside a [`DeviceBuffer`] but is not the
    /// buffer's own address (refused at submit, L3): the engine orders tensors by base address,
    /// so such a tensor would not be ordered against the buffer's other views.
    ///
    /// [`DeviceBuffer`]: crate::DeviceBuffer
    ChipTensorOffsetBase {
        /// Index of the tensor argument.
        arg: usize,
        /// The chip the buffer belongs to.
        chip: WorkerId,
        /// The tensor's base address.
        addr: u64,
        /// The address of the device buffer it lies in.
        buffer: u64,
    },
    /// Two members of one group reach the same bytes of a [`HostBuffer`] and one of them writes
    /// them (refused at submit): members run at once, each staging its own copy, so the
    /// result would depend on which copy came back last.
    ///
    /// [`HostBuffer`]: crate::HostBuffer
    HostTensorSharedInGroup {
        /// The member that writes.
        member: usize,
        /// Its tensor argument.
        arg: usize,
        /// The other member.
        other: usize,
        /// The other member's tensor argument over the same bytes.
        other_arg: usize,
    },
    /// A chip task tags a [`HostBuffer`] tensor `NoDep` (refused at submit): the chip lane
    /// could not tell whether the task writes it, and copying back bytes the engine does not
    /// order could overwrite another task's writes.
    ///
    /// [`HostBuffer`]: crate::HostBuffer
    HostTensorNoDep {
        /// Index of the tensor argument.
        arg: usize,
    },
    /// An L2 chip run names host memory (refused at submit): an L2 worker runs on chip memory
    /// only; host data is staged by an L3 worker's chip lanes.
    HostTensorAtL2 {
        /// Index of the tensor argument.
        arg: usize,
        /// The tensor's buffer address.
        addr: HostAddr,
    },
    /// A sub task names chip memory, which a host closure cannot read (refused at submit).
    ChipMemoryOnSubTask {
        /// Index of the tensor argument.
        arg: usize,
    },
    /// A chip's lane stopped or a control job on it failed.
    Lane {
        /// The chip.
        chip: WorkerId,
        /// What happened (an engine error is the source).
        fault: LaneFault,
    },
    /// A task for a remote child names a tensor whose bytes cannot travel with it (refused at
    /// submit).
    #[cfg(feature = "mpi")]
    RemoteTensor(crate::remote::TensorRefusal),
    /// A graph registered after start could not reach every remote L3 child: the rank named
    /// refused it or failed; no rank serves it (the registration was rolled back everywhere)
    /// and no handle was made.
    #[cfg(feature = "mpi")]
    RemoteRegistration {
        /// The graph's name.
        graph: String,
        /// The first rank that refused or failed.
        rank: i32,
        /// What that rank answered, or how it failed (the source).
        cause: crate::remote::RemoteError,
    },
}

impl fmt::Display for WorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerError::Closed => f.write_str("the worker is closed"),
            WorkerError::WrongLevel { op, level } => {
                write!(f, "{op} is not available on an L{level} worker")
            }
            WorkerError::Reentrant { op, worker } => {
                write!(f, "{op} called from inside a callback of the same worker ({worker})")
            }
            WorkerError::Build { run, cause } => {
                write!(f, "{run}: building the graph failed: {cause}")
            }
            WorkerError::Run(e) => fmt::Display::fmt(e, f),
            WorkerError::UnknownCallable { handle } => {
                write!(f, "callable {handle} is not registered")
            }
            WorkerError::ForeignHandle { handle } => {
                write!(f, "callable {handle} belongs to another worker")
            }
            WorkerError::WrongCallableKind { kind, target } => {
                write!(f, "a {kind} callable cannot run on {target}")
            }
            WorkerError::NoEligibleTarget { callable, needs } => {
                write!(f, "callable '{callable}' has no eligible target: it needs {needs}")
            }
            WorkerError::NoSuchChild { id } => write!(f, "no chip or child worker has id {id}"),
            WorkerError::DuplicateChip { callable, chip } => {
                write!(f, "registering '{callable}' names chip {chip} more than once")
            }
            WorkerError::Registration { callable, chip, source, rollback_failed } => write!(
                f,
                "registering '{callable}' on chip {chip} failed: {source}{}",
                rollback_note(rollback_failed)
            ),
            WorkerError::CallableUnusable { callable, chip } => write!(
                f,
                "'{callable}' is unusable on chip {chip}: removing it from the chip failed earlier"
            ),
            WorkerError::RemovalPending { callable, chip } => {
                write!(f, "'{callable}' is still being removed from chip {chip}")
            }
            WorkerError::ConfigOutOfRange { run, callable, chip, setting, value, limit } => {
                write!(
                    f,
                    "{run}: a task of '{callable}' on chip {chip}: {setting} = {value} exceeds \
                     the platform's limit {limit}"
                )
            }
            WorkerError::Memory(e) => fmt::Display::fmt(e, f),
            WorkerError::DeviceUnusable { chip, message, .. } => {
                write!(f, "chip {chip} is unusable: {message}")
            }
            WorkerError::Device { chip, source } => write!(f, "chip {chip}: {source}"),
            WorkerError::Engine(e) => write!(f, "{}", InWorkerTerms(e)),
            WorkerError::HostTensorNotStaged { arg, addr, len } => write!(
                f,
                "chip task argument {arg} names host memory at {addr} ({len} bytes) that is not \
                 a HostBuffer; allocate it with HostBuffer::new and pass HostBuffer::tensor, or \
                 put it in chip memory (Worker::chip_memory / GraphBuilder::chip_memory, then \
                 DeviceBuffer::tensor)"
            ),
            WorkerError::HostTensorOffsetBase { arg, addr, buffer } => write!(
                f,
                "task argument {arg} has its base address {addr} inside the HostBuffer at \
                 {buffer} rather than at it, so it would not be ordered against that buffer's \
                 other tensors; take HostBuffer::tensor and a view of it (Tensor::view / slice) \
                 instead of offsetting the address"
            ),
            WorkerError::ChipTensorOffsetBase { arg, chip, addr, buffer } => write!(
                f,
                "task argument {arg} has its base address {addr:#x} inside the DeviceBuffer at \
                 {buffer:#x} of chip {chip} rather than at it, so it would not be ordered \
                 against that buffer's other tensors; take DeviceBuffer::tensor and a view of it \
                 (Tensor::view / slice) instead of offsetting the address"
            ),
            WorkerError::HostTensorSharedInGroup { member, arg, other, other_arg } => write!(
                f,
                "group member {member} writes host bytes (argument {arg}) that member {other} \
                 also touches (argument {other_arg}); members run at the same time, so give \
                 each member its own HostBuffer or its own part of one"
            ),
            WorkerError::HostTensorNoDep { arg } => write!(
                f,
                "chip task argument {arg} is a HostBuffer tensor tagged NoDep, which its chip \
                 lane cannot stage (it cannot tell whether the chip writes it); tag it Input, \
                 Output or InOut so the engine orders it, or put it in chip memory and order it \
                 yourself"
            ),
            WorkerError::HostTensorAtL2 { arg, addr } => write!(
                f,
                "chip run argument {arg} names host memory at {addr}, which an L2 worker cannot \
                 stage; put it in chip memory (Worker::memory, then DeviceBuffer::tensor), or \
                 run the task in an L3 worker's graph with a HostBuffer, which its chip lane \
                 stages"
            ),
            WorkerError::ChipMemoryOnSubTask { arg } => write!(
                f,
                "sub task argument {arg} lives in chip memory, which a sub worker cannot read; \
                 let the chip task write a HostBuffer instead (its chip lane copies the result \
                 back) and pass that to the sub task"
            ),
            WorkerError::Lane { chip, fault } => write!(f, "chip {chip}: {fault}"),
            #[cfg(feature = "mpi")]
            WorkerError::RemoteTensor(e) => fmt::Display::fmt(e, f),
            #[cfg(feature = "mpi")]
            WorkerError::RemoteRegistration { graph, rank, cause } => write!(
                f,
                "registering graph '{graph}' after start failed on MPI rank {rank}, rolled back \
                 on every rank: {cause}"
            ),
        }
    }
}

impl Error for WorkerError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            WorkerError::Build { cause, .. } => Some(cause),
            // Transparent: the wrapped error's own source.
            WorkerError::Run(e) => e.source(),
            WorkerError::Memory(e) => e.source(),
            #[cfg(feature = "mpi")]
            WorkerError::RemoteTensor(e) => e.source(),
            WorkerError::Registration { source, .. } => Some(source.as_error()),
            WorkerError::DeviceUnusable { child, device, .. } => unusable_source(child, device),
            WorkerError::Device { source, .. } => Some(&**source),
            WorkerError::Lane { fault: LaneFault::Engine(e), .. } => Some(e),
            #[cfg(feature = "mpi")]
            WorkerError::RemoteRegistration { cause, .. } => Some(cause),
            _ => None,
        }
    }
}

/// The typed error behind an unusable chip, as itself.
fn unusable_source<'a>(
    child: &'a Option<Box<ChildError>>,
    device: &'a Option<Arc<DeviceError>>,
) -> Option<&'a (dyn Error + 'static)> {
    match (device, child) {
        (Some(d), _) => Some(&**d),
        (None, Some(c)) => Some(&**c),
        (None, None) => None,
    }
}

/// How a call on a chip's lane failed ([`WorkerError::Lane`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaneFault {
    /// The lane stopped (the worker is closing) before it took the call.
    #[error("the lane stopped")]
    Stopped,
    /// The lane dropped the call without running it.
    #[error("the job was dropped")]
    JobDropped,
    /// The lane dropped a run before answering it.
    #[error("the lane dropped the run")]
    RunDropped,
    /// The lane answered a run with no run id and no error.
    #[error("the lane answered the run with no run id")]
    NoRunId,
    /// The endpoint the call reached is not a chip.
    #[error("not a chip endpoint")]
    NotChipEndpoint,
    /// The call panicked on the lane (the lane keeps serving).
    #[error("the call panicked on the lane: {message}")]
    Panicked {
        /// The panic payload's text (a panic carries no typed value).
        message: String,
    },
    /// The engine refused the call or its chip's thread stopped (the source).
    #[error("{0}")]
    Engine(#[source] SchedError),
}

impl From<MemError> for WorkerError {
    /// An unusable chip is reported as [`WorkerError::DeviceUnusable`] whichever call met it.
    fn from(e: MemError) -> WorkerError {
        match e {
            MemError::DeviceUnusable { chip, message, code, child, device } => {
                WorkerError::DeviceUnusable { chip, code, message, child, device }
            }
            other => WorkerError::Memory(other),
        }
    }
}

/// The buffer a [`MemError`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferName {
    /// A device buffer of `chip` at device address `addr`.
    Device {
        /// The chip.
        chip: WorkerId,
        /// The buffer's device address.
        addr: u64,
    },
    /// A host buffer at host address `addr`.
    Host {
        /// The buffer's host address.
        addr: u64,
    },
}

impl fmt::Display for BufferName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BufferName::Device { chip, addr } => write!(f, "buffer {addr:#x} of chip {chip}"),
            BufferName::Host { addr } => write!(f, "host buffer {addr:#x}"),
        }
    }
}

/// Errors of device-memory helpers.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum MemError {
    /// The buffer belongs to another chip or worker.
    WrongChip {
        /// The buffer's chip.
        buffer_chip: WorkerId,
        /// The chip the call addressed.
        chip: WorkerId,
    },
    /// The buffer was allocated by an earlier process of its chip (PROCESS mode, restarted
    /// after a death): its memory ended with that process. A memory call on it is refused
    /// before anything reaches the current process, and so is a chip task with a tensor over
    /// it, while that process is among the last 8 to end and the tensor reaches bytes the
    /// current process has not allocated (a tensor carries an address only).
    StaleBuffer {
        /// The chip.
        chip: WorkerId,
        /// The buffer's device address.
        addr: u64,
        /// The buffer's length in bytes.
        len: u64,
        /// The chip process that allocated the buffer (the first is 1).
        buffer_process: u64,
        /// The chip's current process.
        process: u64,
    },
    /// The buffer was freed: a copy of a `DeviceBuffer` kept past its `free`. Its address is
    /// free, or belongs to a later allocation, which the call must not reach.
    Freed {
        /// The chip.
        chip: WorkerId,
        /// The buffer's device address.
        addr: u64,
        /// The buffer's length in bytes.
        len: u64,
    },
    /// The access leaves the buffer.
    OutOfRange {
        /// The buffer.
        buffer: BufferName,
        /// Offset of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Buffer size.
        size: u64,
    },
    /// A host buffer of no bytes was asked for.
    EmptyHostBuffer,
    /// The device refused.
    Device {
        /// The chip.
        chip: WorkerId,
        /// The device's message.
        message: String,
        /// The device's code, when one exists.
        code: Option<DeviceCode>,
        /// A chip in this process: the device's error (the source). A chip in its own process
        /// (PROCESS mode) reports only its message and code.
        device: Option<Arc<DeviceError>>,
    },
    /// The chip is unusable after a fault; only closing the worker helps.
    DeviceUnusable {
        /// The chip.
        chip: WorkerId,
        /// The device's message.
        message: String,
        /// The device's code, when one exists.
        code: Option<DeviceCode>,
        /// PROCESS mode: the failure of the chip's process behind it (the source).
        child: Option<Box<ChildError>>,
        /// A chip in this process: the device's error that said it is unusable (the source).
        device: Option<Arc<DeviceError>>,
    },
    /// The tensor descriptor could not be built (the shape or data type was refused; the
    /// source).
    Tensor(TypesError),
    /// The host could not allocate a [`HostBuffer`](crate::HostBuffer) of this size.
    HostAlloc {
        /// The requested length in bytes.
        len: u64,
        /// The allocator's refusal (the source).
        source: TryReserveError,
    },
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemError::WrongChip { buffer_chip, chip } => {
                write!(f, "buffer of chip {buffer_chip} used on chip {chip}")
            }
            MemError::StaleBuffer { chip, addr, len, buffer_process, process } => write!(
                f,
                "buffer {addr:#x} ({len} bytes) of chip {chip} was allocated by its process \
                 #{buffer_process}, which has been replaced by process #{process}: its memory is \
                 gone"
            ),
            MemError::Freed { chip, addr, len } => write!(
                f,
                "buffer {addr:#x} ({len} bytes) of chip {chip} was freed; a copy of its handle \
                 cannot reach the memory now at that address"
            ),
            MemError::OutOfRange { buffer, offset, len, size } => {
                write!(
                    f,
                    "access of {len} bytes at offset {offset} leaves {buffer} of {size} bytes"
                )
            }
            MemError::EmptyHostBuffer => write!(f, "a host buffer needs at least one byte"),
            MemError::Device { chip, message, .. } => write!(f, "chip {chip}: {message}"),
            MemError::DeviceUnusable { chip, message, .. } => {
                write!(f, "chip {chip} is unusable: {message}")
            }
            MemError::Tensor(e) => write!(f, "tensor over a device buffer: {e}"),
            MemError::HostAlloc { len, source } => {
                write!(f, "cannot allocate a host buffer of {len} bytes: {source}")
            }
        }
    }
}

impl Error for MemError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            MemError::Device { device, .. } => {
                device.as_deref().map(|d| d as &(dyn Error + 'static))
            }
            MemError::DeviceUnusable { child, device, .. } => unusable_source(child, device),
            MemError::Tensor(e) => Some(e),
            MemError::HostAlloc { source, .. } => Some(source),
            _ => None,
        }
    }
}
