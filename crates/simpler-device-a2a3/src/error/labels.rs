//! The labels an error names: which launch, stream, step or resource, what an allocation was
//! for and why a runner became unusable.

use std::fmt;

use simpler_types::RunId;

use crate::abi::codes::AclCode;

/// Which of the two launches of a run.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum KernelKind {
    /// The AICore executor kernel (launched first, L2).
    AiCore,
    /// The AICPU `exec` kernel (L3).
    Aicpu,
}

impl fmt::Display for KernelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelKind::AiCore => "AICore",
            KernelKind::Aicpu => "AICPU",
        })
    }
}

/// Which of the runner's two streams.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum StreamKind {
    /// The AICPU stream.
    Aicpu,
    /// The AICore stream.
    AiCore,
}

impl fmt::Display for StreamKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StreamKind::Aicpu => "AICPU stream",
            StreamKind::AiCore => "AICore stream",
        })
    }
}

/// The step of a run (or of setup) that poisoned the device.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum PoisonStep {
    /// The AICore launch (L2) failed.
    LaunchAiCore,
    /// The AICPU launch (L3) failed.
    LaunchAicpu,
    /// Synchronising the AICPU stream failed (R1).
    SyncAicpu,
    /// Synchronising the AICore stream failed (R1).
    SyncAiCore,
    /// A panic unwound out of `launch_run` or `reap_run` while the device may still have
    /// been running the launch.
    Unwind,
}

impl fmt::Display for PoisonStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoisonStep::LaunchAiCore => "AICore launch",
            PoisonStep::LaunchAicpu => "AICPU launch",
            PoisonStep::SyncAicpu => "AICPU stream sync",
            PoisonStep::SyncAiCore => "AICore stream sync",
            PoisonStep::Unwind => "a panic between launch and reap",
        })
    }
}

/// The step of a run whose driving code panicked
/// ([`DeviceError::RunPanicked`](super::DeviceError::RunPanicked)).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum RunStep {
    /// `prepare`.
    Prepare,
    /// `launch_run`.
    Launch,
    /// `reap_run`.
    Reap,
    /// `complete_run`.
    Complete,
}

impl fmt::Display for RunStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RunStep::Prepare => "preparation",
            RunStep::Launch => "launch",
            RunStep::Reap => "reap",
            RunStep::Complete => "completion",
        })
    }
}

/// Why a runner became unusable (`docs/device-runner.md`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct PoisonCause {
    /// The run during which it happened.
    pub run_id: RunId,
    /// The step that failed.
    pub step: PoisonStep,
    /// The device code of the failure.
    pub code: AclCode,
}

impl fmt::Display for PoisonCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed in {} with {}", self.step, self.run_id, self.code)
    }
}

/// The step of `ensure_initialized` that failed (`docs/device-runner.md`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum InitStep {
    /// Binding the calling thread to the device.
    BindDevice,
    /// Creating a stream.
    CreateStream,
    /// Querying the core counts.
    QueryCores,
    /// Loading the device programs (simulator: starting the AICPU threads).
    LoadPrograms,
    /// The AICPU init entry.
    AicpuInit,
}

impl fmt::Display for InitStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InitStep::BindDevice => "bind device",
            InitStep::CreateStream => "create stream",
            InitStep::QueryCores => "query cores",
            InitStep::LoadPrograms => "load device programs",
            InitStep::AicpuInit => "AICPU init",
        })
    }
}

/// A ring resource that ran out.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum CapacityResource {
    /// Task-window entries.
    TaskWindow,
    /// Heap bytes.
    Heap,
    /// Dependency-pool entries.
    DepPool,
}

impl fmt::Display for CapacityResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CapacityResource::TaskWindow => "task window",
            CapacityResource::Heap => "heap bytes",
            CapacityResource::DepPool => "dep pool",
        })
    }
}

/// What a device allocation was for (memory ledger and `OutOfMemory`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum MemPurpose {
    /// A user `malloc`.
    User,
    /// The GM heap arena of the chip runtime.
    HeapArena,
    /// The runtime image arena.
    ImageArena,
    /// The staging buffer for host tensors.
    Staging,
    /// A chip callable's buffer (kernel headers).
    ChipBuffer,
    /// Small runtime buffers (`KernelArgs`, register table).
    Runtime,
}

impl fmt::Display for MemPurpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemPurpose::User => "user allocation",
            MemPurpose::HeapArena => "GM heap arena",
            MemPurpose::ImageArena => "runtime image",
            MemPurpose::Staging => "staging buffer",
            MemPurpose::ChipBuffer => "chip callable buffer",
            MemPurpose::Runtime => "runtime buffer",
        })
    }
}

/// Which transfer between host and device memory (`CopyRefused`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum CopyKind {
    /// Host memory to device memory.
    ToDevice,
    /// Device memory to host memory.
    FromDevice,
    /// Setting device memory to one byte value.
    Fill,
}

impl fmt::Display for CopyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CopyKind::ToDevice => "copy to device",
            CopyKind::FromDevice => "copy from device",
            CopyKind::Fill => "memset",
        })
    }
}
