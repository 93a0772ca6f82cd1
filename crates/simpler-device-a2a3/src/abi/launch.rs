//! What the two kernel launches receive, and the AICPU init arguments (`docs/device-runner.md`).
//!
//! Step labels (P1–P18, L1–L3, R1–R3, C1–C3) are the run-lifecycle steps defined in
//! `docs/device-runner.md`.

use core::mem::{align_of, offset_of, size_of};

/// Profiling flag bit: dump arguments.
pub const PROFILE_DUMP_ARGS: u32 = 1 << 0;
/// Profiling flag bit: swimlane records.
pub const PROFILE_SWIMLANE: u32 = 1 << 1;
/// Profiling flag bit: PMU counters.
pub const PROFILE_PMU: u32 = 1 << 2;
/// Profiling flag bit: dependency-graph capture.
pub const PROFILE_DEP_GEN: u32 = 1 << 3;
/// Profiling flag bit: scope statistics.
pub const PROFILE_SCOPE_STATS: u32 = 1 << 4;

/// The argument block both launches receive (by device address), uploaded at preparation
/// step 16 (`docs/device-runner.md`). Plain data without padding, so its upload bytes are
/// [`bytemuck::bytes_of`] of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub struct KernelArgs {
    /// [`ABI_VERSION`](super::ABI_VERSION) of the host that wrote it.
    pub abi_version: u32,
    /// Clusters of this launch.
    pub block_dim: u32,
    /// AICore cores of this launch (`3 * block_dim`).
    pub num_aicore: u32,
    /// AICPU threads of this launch.
    pub aicpu_threads: u32,
    /// Device address of the runtime image.
    pub image_base: u64,
    /// Length of the runtime image in bytes.
    pub image_len: u64,
    /// Device address of the register table (one `u64` control-window address per core;
    /// the simulator's table holds register-block addresses).
    pub regs_table: u64,
    /// Profiling flag bits (`PROFILE_*`).
    pub profiling: u32,
    /// Padding.
    pub reserved0: u32,
    /// FFTS base address (onboard only; 0 on the simulator).
    pub ffts_base: u64,
    /// Device address of a [`HostServices`](super::services::HostServices) table when a host
    /// runs the AICPU program (the simulator loading the built program); 0 onboard.
    pub host_services: u64,
}

const _: () = {
    assert!(size_of::<KernelArgs>() == 64);
    assert!(align_of::<KernelArgs>() == 64);
    assert!(offset_of!(KernelArgs, image_base) == 16);
    assert!(offset_of!(KernelArgs, regs_table) == 32);
    assert!(offset_of!(KernelArgs, profiling) == 40);
};

/// What the AICPU init entry receives once per runner (`docs/device-runner.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct InitArgs {
    /// [`ABI_VERSION`](super::ABI_VERSION) of the host.
    pub abi_version: u32,
    /// Device id of the runner.
    pub device_id: u32,
    /// Log level of the AICPU program (0 = errors only … 4 = trace).
    pub log_level: u32,
    /// Scheduler no-progress budget in milliseconds.
    pub scheduler_timeout_ms: u32,
    /// Budget for a core to answer the exit signal, in milliseconds.
    pub shutdown_budget_ms: u32,
    /// Budget for the orchestration's wait on a tensor's accessors (`tensor_data`,
    /// `set_tensor_data`), in milliseconds.
    pub tensor_wait_ms: u32,
    /// DMA workspace addresses (0 on the simulator).
    pub dma_workspace: [u64; 2],
}

const _: () = {
    assert!(size_of::<InitArgs>() == 40);
    assert!(offset_of!(InitArgs, dma_workspace) == 24);
};

/// Header of one kernel inside a chip callable's uploaded buffer (`docs/device-runner.md`): the kernel's
/// resolved address (a device code address onboard, a function pointer on the simulator) and
/// its signature.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct CoreKernelHeader {
    /// Func id of the kernel.
    pub func_id: u32,
    /// Entries of `signature` in use.
    pub signature_len: u32,
    /// Resolved kernel entry address.
    pub kernel: u64,
    /// `ArgDirection` wire values.
    pub signature: [u8; 32],
}

const _: () = assert!(size_of::<CoreKernelHeader>() == 48);
