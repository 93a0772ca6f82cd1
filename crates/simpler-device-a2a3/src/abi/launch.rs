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
    /// Device address of the register table: one `u64` control-window address per physical
    /// core id, at least `PHYSICAL_CORE_LIMIT` of them (the simulator's holds its register
    /// blocks' addresses, its physical ids being core indices).
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

/// `RegisterArgs::op`: write, load and resolve the orchestration object; keep it under the slot.
pub const REGISTER_LOAD: u32 = 1;
/// `RegisterArgs::op`: close the object kept under the slot.
pub const REGISTER_UNLOAD: u32 = 2;

/// Bytes of each name in [`RegisterArgs`] (NUL-padded; at least one NUL).
pub const REGISTER_NAME_BYTES: usize = 64;
/// Bytes of the directory path in [`RegisterArgs`] (NUL-padded; at least one NUL).
pub const REGISTER_DIR_BYTES: usize = 128;

/// What `simpler_aicpu_register_callable` receives (as its argument bytes) for a
/// tensormap_and_ringbuffer `DeviceObject` orchestration (`docs/onboard-programs.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct RegisterArgs {
    /// [`ABI_VERSION`](super::ABI_VERSION) of the host.
    pub abi_version: u32,
    /// [`REGISTER_LOAD`] or [`REGISTER_UNLOAD`].
    pub op: u32,
    /// The callable slot the object is kept under (`< MAX_CALLABLE_SLOTS`).
    pub slot: u32,
    /// Which runner the slot belongs to, when one program serves several (the simulator runs
    /// several runners over one loaded program; onboard each device has its own, and this is 0).
    pub owner: u32,
    /// Device address of the object's bytes (load only).
    pub object_addr: u64,
    /// Length of the object in bytes (load only).
    pub object_len: u64,
    /// Device address of the [`RegisterReply`] the entry writes: CANN copies argument bytes, so
    /// the host cannot see writes to them.
    pub reply_addr: u64,
    /// The entry symbol (load only).
    pub entry_name: [u8; REGISTER_NAME_BYTES],
    /// The config symbol (load only).
    pub config_name: [u8; REGISTER_NAME_BYTES],
    /// The directory the object is written to (load only).
    pub dir: [u8; REGISTER_DIR_BYTES],
}

const _: () = {
    assert!(size_of::<RegisterArgs>() == 296);
    assert!(offset_of!(RegisterArgs, object_addr) == 16);
    assert!(offset_of!(RegisterArgs, reply_addr) == 32);
    assert!(offset_of!(RegisterArgs, entry_name) == 40);
    assert!(offset_of!(RegisterArgs, dir) == 168);
};

impl RegisterArgs {
    /// The block that loads the object at `object_addr` under `slot`; `None` when a name or the
    /// directory does not fit its field or holds a NUL byte.
    pub fn load(
        (owner, slot): (u32, u32),
        object: (u64, u64),
        reply_addr: u64,
        entry: &str,
        config: &str,
        dir: &str,
    ) -> Option<RegisterArgs> {
        Some(RegisterArgs {
            op: REGISTER_LOAD,
            object_addr: object.0,
            object_len: object.1,
            entry_name: padded(entry)?,
            config_name: padded(config)?,
            dir: padded(dir)?,
            ..RegisterArgs::unload((owner, slot), reply_addr)
        })
    }

    /// The block that closes the object `owner` keeps under `slot`.
    pub fn unload((owner, slot): (u32, u32), reply_addr: u64) -> RegisterArgs {
        RegisterArgs {
            abi_version: super::ABI_VERSION,
            op: REGISTER_UNLOAD,
            slot,
            owner,
            reply_addr,
            ..bytemuck::Zeroable::zeroed()
        }
    }
}

/// `s` NUL-padded into `N` bytes, keeping at least one NUL.
fn padded<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() >= N || b.contains(&0) {
        return None;
    }
    let mut out = [0u8; N];
    out[..b.len()].copy_from_slice(b);
    Some(out)
}

/// The text before the first NUL of a padded field; `None` without a NUL or when not UTF-8.
pub fn unpadded(field: &[u8]) -> Option<&str> {
    let end = field.iter().position(|&c| c == 0)?;
    core::str::from_utf8(&field[..end]).ok()
}

/// `RegisterReply::status`: the object is loaded (or closed) as asked.
pub const REGISTER_OK: u32 = 0;
/// `RegisterReply::status` as the host initialises it: the entry never wrote a reply.
pub const REGISTER_NO_REPLY: u32 = u32::MAX;
/// Bytes of message text a [`RegisterReply`] holds.
pub const REGISTER_MESSAGE_BYTES: usize = 232;

/// What the register entry writes at `RegisterArgs::reply_addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct RegisterReply {
    /// [`REGISTER_OK`], [`REGISTER_NO_REPLY`], or the `RegisterFailure` the entry hit.
    pub status: u32,
    /// Bytes of `message` in use.
    pub message_len: u32,
    /// Device address of the resolved entry function (load).
    pub entry: u64,
    /// Device address of the resolved config function (load).
    pub config: u64,
    /// What went wrong, as text (UTF-8).
    pub message: [u8; REGISTER_MESSAGE_BYTES],
}

const _: () = assert!(size_of::<RegisterReply>() == 256);

impl RegisterReply {
    /// The reply the host writes before the launch, so that a launch that never ran the entry
    /// reads as [`REGISTER_NO_REPLY`].
    pub fn unanswered() -> RegisterReply {
        RegisterReply { status: REGISTER_NO_REPLY, ..bytemuck::Zeroable::zeroed() }
    }

    /// The message text (lossy).
    pub fn message(&self) -> String {
        let n = (self.message_len as usize).min(REGISTER_MESSAGE_BYTES);
        String::from_utf8_lossy(&self.message[..n]).into_owned()
    }
}

/// Why the register entry refused, as `RegisterReply::status`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u32)]
pub enum RegisterFailure {
    /// The argument block names another ABI version, an unknown op, a slot out of range or
    /// unterminated names.
    BadArgs = 1,
    /// Writing the object into the directory failed.
    Write = 2,
    /// The dynamic loader refused the object.
    Load = 3,
    /// The object does not export the entry or config symbol.
    Symbol = 4,
}

impl RegisterFailure {
    /// The failure behind a reply status, `None` for success, no reply or an unknown value.
    pub fn from_raw(status: u32) -> Option<RegisterFailure> {
        match status {
            1 => Some(RegisterFailure::BadArgs),
            2 => Some(RegisterFailure::Write),
            3 => Some(RegisterFailure::Load),
            4 => Some(RegisterFailure::Symbol),
            _ => None,
        }
    }
}
