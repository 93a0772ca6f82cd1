//! The simulated register blocks: one cache-line-aligned block per core, persistent for the
//! device's life, whose first bytes are laid out as the core's control window
//! (`docs/device-handshake.md`): each register the protocol uses is an atomic word at its MMIO
//! offset. The register table holds the blocks' addresses, so the built AICPU program, which
//! addresses registers as `window + offset`, runs against them unchanged.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::aicore::CoreLaunch;
use super::stream::LaunchEntry;
use super::wait::EventCount;
use crate::abi::regs::RegId;

/// Words of the simulated control window: up to and including the highest register offset.
const WINDOW_WORDS: usize = 0x500 / 4;

const _: () = {
    let mut i = 0;
    while i < RegId::COUNT {
        assert!((RegId::ALL[i].mmio_offset() as usize) / 4 < WINDOW_WORDS);
        assert!(RegId::ALL[i].mmio_offset().is_multiple_of(4));
        i += 1;
    }
};

/// One core's register window and the event count its waits park on.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct RegBlock {
    /// The control window; words no register uses stay 0.
    window: [AtomicU32; WINDOW_WORDS],
    /// Bumped by every store to `DATA_MAIN_BASE` (the AICore waits for those) and by resets.
    pub(crate) wake: EventCount,
    /// The core's part in the launch it serves; whoever holds the lock advances it (the
    /// core's thread, or the AICPU thread that wrote a register: `drive.rs`).
    pub(crate) serving: Mutex<Option<CoreLaunch>>,
    /// The stream and entry of the core's launch while AICPU threads drive it and its thread
    /// sits on its mailbox. Whoever takes it ends that participant (`drive.rs`).
    pub(crate) unthreaded: Mutex<Option<(usize, Arc<LaunchEntry>)>>,
    /// Set by the core's thread when it left a stopped launch while an AICPU thread still held
    /// `serving` (a kernel that did not return); the next holder drops the state.
    pub(crate) abandoned: AtomicBool,
    /// The core's last kernel and how long it ran, whoever served it.
    pub(crate) last_kernel: LastKernel,
}

/// A core's last kernel (its code address) and how long it ran: an AICPU thread runs a held
/// token itself only when the same kernel returned quickly on the core before
/// (`docs/device-simulator.md`, "Who runs a dispatch"). Written by whoever serves a token,
/// under the core's `serving` lock; read under it too, or as a hint.
#[derive(Debug, Default)]
pub(crate) struct LastKernel {
    kernel: AtomicU64,
    /// Nanoseconds, at least 1 once a kernel ran (0: none yet).
    ns: AtomicU64,
}

impl LastKernel {
    pub(crate) fn record(&self, kernel: u64, took: Duration) {
        self.kernel.store(kernel, Ordering::Relaxed);
        self.ns.store(took.as_nanos().clamp(1, u128::from(u64::MAX)) as u64, Ordering::Relaxed);
    }

    /// Whether `kernel` was the last kernel and returned within `limit`.
    pub(crate) fn ran_within(&self, kernel: u64, limit: Duration) -> bool {
        self.kernel.load(Ordering::Relaxed) == kernel && self.returned_within(limit)
    }

    /// Whether the last kernel, whichever it was, returned within `limit`.
    pub(crate) fn returned_within(&self, limit: Duration) -> bool {
        let ns = self.ns.load(Ordering::Relaxed);
        ns != 0 && Duration::from_nanos(ns) < limit
    }
}

impl Default for RegBlock {
    fn default() -> RegBlock {
        RegBlock {
            window: [const { AtomicU32::new(0) }; WINDOW_WORDS],
            wake: EventCount::default(),
            serving: Mutex::new(None),
            abandoned: AtomicBool::new(false),
            unthreaded: Mutex::new(None),
            last_kernel: LastKernel::default(),
        }
    }
}

impl RegBlock {
    fn cell(&self, reg: RegId) -> &AtomicU32 {
        &self.window[reg.mmio_offset() as usize / 4]
    }

    /// Acquire load of a register.
    pub(crate) fn load(&self, reg: RegId) -> u32 {
        self.cell(reg).load(Ordering::Acquire)
    }

    /// Release store of a register (waking waiters is the caller's job).
    pub(crate) fn store(&self, reg: RegId, v: u32) {
        self.cell(reg).store(v, Ordering::Release);
    }

    /// The address of the control window (the block's own address), for the register table.
    pub(crate) fn window_base(&self) -> u64 {
        self as *const RegBlock as u64
    }
}
