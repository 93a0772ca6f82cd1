//! The per-core handshake record (`docs/device-handshake.md`).
//!
//! One 64-byte record per AICore core lives in the runtime image. Writers and readers:
//!
//! | Field | Written by | Read by |
//! |---|---|---|
//! | `aicore_done` | host (zeroed before launch, L1); AICore (`index + 1`, release, step 2) | AICPU (acquire, step 4); host report (C1) |
//! | `physical_core_id`, `core_type` | host (pre-typed, P6); AICore (before `aicore_done`, step 2) | AICPU after observing `aicore_done` |
//! | `task` | AICPU (payload-pair address, before opening the window, step 4) | AICore after the window opened (step 5) |
//! | `aicpu_ready` | AICPU (diagnostic only) | host report (C1) |
//!
//! Step labels (P1–P18, L1–L3, R1–R3, C1–C3) are the run-lifecycle steps defined in
//! `docs/device-runner.md`.

use core::mem::{align_of, offset_of, size_of};
use core::sync::atomic::{AtomicU32, AtomicU64};

/// One core's handshake record: 64 bytes, 64-byte aligned.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct Handshake {
    /// 1 once the owning AICPU thread opened the window (diagnostic only).
    pub aicpu_ready: AtomicU32,
    /// 0 until the core reported in; then `core index + 1`.
    pub aicore_done: AtomicU32,
    /// Device address of the core's payload pair.
    pub task: AtomicU64,
    /// [`CoreType`](super::CoreType) as `u32`.
    pub core_type: AtomicU32,
    /// Physical core id the core reported (the simulator reports its index).
    pub physical_core_id: AtomicU32,
    /// Padding to one cache line.
    pub reserved: [u32; 10],
}

const _: () = {
    assert!(size_of::<Handshake>() == 64);
    assert!(align_of::<Handshake>() == 64);
    assert!(offset_of!(Handshake, aicpu_ready) == 0);
    assert!(offset_of!(Handshake, aicore_done) == 4);
    assert!(offset_of!(Handshake, task) == 8);
    assert!(offset_of!(Handshake, core_type) == 16);
    assert!(offset_of!(Handshake, physical_core_id) == 20);
};
