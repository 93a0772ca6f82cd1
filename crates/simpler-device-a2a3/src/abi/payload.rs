//! The dispatch payload and the kernel-argument layout (`docs/device-chip.md`).
//!
//! Each core owns a pair of 512-byte payloads in the runtime image; token `t` uses payload
//! `t & 1`. The AICPU fills a payload only while the previous token of the core is ACKed or
//! FINed, i.e. while the AICore is not reading it, and publishes it with a release store of the
//! token; the AICore reads it after an acquire load of the token and never writes it.
//!
//! Line 0 holds the kernel address, the [`LocalContext`], the gate (`src_payload`) and
//! diagnostic ids; lines 1..7 hold the 50 argument slots; the tail holds the
//! [`GlobalContext`]. A kernel receives the address of `args[0]`:
//!
//! - `args[0..T)`: device addresses of the task's 128-byte tensor descriptors;
//! - `args[T..T+S)`: scalars as raw 64-bit words (value bytes low, zero-extended);
//! - `args[48]`: address of the payload's `LocalContext`;
//! - `args[49]`: address of the payload's `GlobalContext`.

use core::mem::{align_of, offset_of, size_of};

/// Argument slots of one kernel call.
pub const KERNEL_ARG_SLOTS: usize = 50;
/// Slot holding the address of the [`LocalContext`].
pub const LOCAL_CONTEXT_SLOT: usize = 48;
/// Slot holding the address of the [`GlobalContext`].
pub const GLOBAL_CONTEXT_SLOT: usize = 49;
/// Size of one dispatch payload.
pub const PAYLOAD_SIZE: usize = 512;

/// Per-dispatch topology a kernel reads through `args[48]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct LocalContext {
    /// Index of this block of the task, `0..block_num`.
    pub block_idx: u32,
    /// Number of blocks the task was submitted with.
    pub block_num: u32,
    /// Reserved for asynchronous completion (0 in this version).
    pub async_ctx: u64,
}

/// Per-core context a kernel reads through `args[49]`, and the dispatch's copy of its kernel.
///
/// The members of a MIX block all see the block's `block_idx`; when several of them run the
/// same kernel (both AIV sub-blocks, say), `copy_idx` and `copy_num` tell those copies apart,
/// so that they can split the block's work instead of each doing all of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct GlobalContext {
    /// Sub-block id of an AIV core (0 or 1); 0 for AIC.
    pub sub_block_id: u32,
    /// Index of this dispatch among the members of its block that run the same kernel, in
    /// member order (AIC, AIV0, AIV1); 0 outside MIX tasks.
    pub copy_idx: u16,
    /// Members of the block that run the kernel: 1 outside MIX tasks (0 counts as 1).
    pub copy_num: u16,
    /// DMA workspace addresses (0 on the simulator).
    pub dma_workspace: [u64; 2],
}

/// `(copy_idx, copy_num)` of member `member` (0 AIC, 1 AIV0, 2 AIV1) of a MIX block whose
/// members run `funcs` ([`NO_FUNC`](super::image::NO_FUNC) = none).
pub(crate) fn mix_copy(funcs: &[i32; 3], member: usize) -> (u16, u16) {
    let Some(&f) = funcs.get(member) else { return (0, 1) };
    let same = |g: &&i32| **g == f;
    (funcs[..member].iter().filter(same).count() as u16, funcs.iter().filter(same).count() as u16)
}

/// One 512-byte dispatch payload.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub struct DispatchPayload {
    /// Address of the kernel entry (a function pointer on the simulator).
    pub kernel: u64,
    /// Block index and count of this dispatch.
    pub local: LocalContext,
    /// 0 = ready to run; otherwise the gate: the address of the payload to copy the argument
    /// vector from, and the AICore waits for the doorbell before running (reserved for early
    /// dispatch; this version always writes 0).
    pub src_payload: u64,
    /// Device task id of the task (diagnostics).
    pub task_id: u64,
    /// Function id of the kernel (diagnostics).
    pub func_id: u32,
    /// Padding to the end of line 0.
    pub reserved0: [u32; 5],
    /// The kernel's argument vector.
    pub args: [i64; KERNEL_ARG_SLOTS],
    /// Per-core context.
    pub global: GlobalContext,
    /// Padding to 512 bytes.
    pub reserved1: [u64; 3],
}

const _: () = {
    assert!(size_of::<LocalContext>() == 16);
    assert!(size_of::<GlobalContext>() == 24);
    assert!(offset_of!(GlobalContext, copy_idx) == 4);
    assert!(offset_of!(GlobalContext, copy_num) == 6);
    assert!(offset_of!(GlobalContext, dma_workspace) == 8);
    assert!(size_of::<DispatchPayload>() == PAYLOAD_SIZE);
    assert!(align_of::<DispatchPayload>() == 64);
    assert!(offset_of!(DispatchPayload, kernel) == 0);
    assert!(offset_of!(DispatchPayload, local) == 8);
    assert!(offset_of!(DispatchPayload, src_payload) == 24);
    assert!(offset_of!(DispatchPayload, task_id) == 32);
    assert!(offset_of!(DispatchPayload, func_id) == 40);
    assert!(offset_of!(DispatchPayload, args) == 64);
    assert!(offset_of!(DispatchPayload, global) == 464);
    assert!(LOCAL_CONTEXT_SLOT < KERNEL_ARG_SLOTS && GLOBAL_CONTEXT_SLOT < KERNEL_ARG_SLOTS);
};

impl DispatchPayload {
    /// An all-zero payload.
    pub const ZERO: DispatchPayload = DispatchPayload {
        kernel: 0,
        local: LocalContext { block_idx: 0, block_num: 0, async_ctx: 0 },
        src_payload: 0,
        task_id: 0,
        func_id: 0,
        reserved0: [0; 5],
        args: [0; KERNEL_ARG_SLOTS],
        global: GlobalContext { sub_block_id: 0, copy_idx: 0, copy_num: 0, dma_workspace: [0; 2] },
        reserved1: [0; 3],
    };
}

/// The two payloads of one core; token `t` uses `pair[t & 1]`.
pub type PayloadPair = [DispatchPayload; 2];
