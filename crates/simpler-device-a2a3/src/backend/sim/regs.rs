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
    /// How long the core's recent kernels ran, whoever served them.
    pub(crate) kernel_times: KernelTimes,
}

/// How long a core's recent kernels ran, by kernel (code address): an AICPU thread runs a held
/// token itself only when the same kernel returned quickly on the core before
/// (`docs/device-simulator.md`, "Who runs a dispatch"). A small fully associative table (a
/// kernel evicts the oldest entry), so a core that alternates between a few kernels keeps each
/// one's time; a hashed table would let two kernels that collide evict each other at every
/// launch. Written by whoever serves a token, under the core's `serving` lock; read under it
/// too, or as a hint.
#[derive(Debug, Default)]
pub(crate) struct KernelTimes {
    /// `(kernel, nanoseconds)`; nanoseconds 0 for an empty entry.
    entries: [(AtomicU64, AtomicU64); KERNEL_ENTRIES],
    /// The entry the next new kernel takes.
    next: AtomicU32,
    /// Nanoseconds of the core's last kernel, whichever it was (0: none yet).
    last_ns: AtomicU64,
}

/// Kernels whose times a core remembers at once.
const KERNEL_ENTRIES: usize = 8;

impl KernelTimes {
    fn entry(&self, kernel: u64) -> Option<&(AtomicU64, AtomicU64)> {
        self.entries
            .iter()
            .find(|(k, t)| k.load(Ordering::Relaxed) == kernel && t.load(Ordering::Relaxed) != 0)
    }

    pub(crate) fn record(&self, kernel: u64, took: Duration) {
        let ns = took.as_nanos().clamp(1, u128::from(u64::MAX)) as u64;
        let (k, t) = self.entry(kernel).unwrap_or_else(|| {
            let i = self.next.fetch_add(1, Ordering::Relaxed) as usize % KERNEL_ENTRIES;
            &self.entries[i]
        });
        k.store(kernel, Ordering::Relaxed);
        t.store(ns, Ordering::Relaxed);
        self.last_ns.store(ns, Ordering::Relaxed);
    }

    /// Whether `kernel` returned within `limit` the last time it ran on the core (and is still
    /// remembered).
    pub(crate) fn ran_within(&self, kernel: u64, limit: Duration) -> bool {
        self.entry(kernel).is_some_and(|(_, t)| within(t.load(Ordering::Relaxed), limit))
    }

    /// Whether the core's last kernel, whichever it was, returned within `limit`.
    pub(crate) fn returned_within(&self, limit: Duration) -> bool {
        within(self.last_ns.load(Ordering::Relaxed), limit)
    }
}

fn within(ns: u64, limit: Duration) -> bool {
    ns != 0 && Duration::from_nanos(ns) < limit
}

impl Default for RegBlock {
    fn default() -> RegBlock {
        RegBlock {
            window: [const { AtomicU32::new(0) }; WINDOW_WORDS],
            wake: EventCount::default(),
            serving: Mutex::new(None),
            abandoned: AtomicBool::new(false),
            unthreaded: Mutex::new(None),
            kernel_times: KernelTimes::default(),
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

#[cfg(test)]
mod kernel_times_tests {
    use super::*;

    #[test]
    fn a_core_remembers_each_of_a_few_alternating_kernels() {
        let l = KernelTimes::default();
        let quick = Duration::from_micros(5);
        let limit = Duration::from_micros(100);
        assert!(!l.ran_within(0x1000, limit) && !l.returned_within(limit), "nothing ran yet");
        // Three kernels alternating on one core (any two of which a hashed table could
        // collide on) all stay known.
        for _ in 0..4 {
            for k in [0x1000, 0x2000, 0x3040] {
                l.record(k, quick);
            }
        }
        for k in [0x1000, 0x2000, 0x3040] {
            assert!(l.ran_within(k, limit), "{k:#x}");
        }
        assert!(!l.ran_within(0x4000, limit), "a kernel new to the core");
        l.record(0x2000, Duration::from_micros(300));
        assert!(!l.ran_within(0x2000, limit) && l.ran_within(0x1000, limit));
        assert!(!l.returned_within(limit), "the last kernel was long");
    }

    #[test]
    fn a_new_kernel_evicts_the_oldest_entry_only() {
        let l = KernelTimes::default();
        let quick = Duration::from_micros(5);
        let limit = Duration::from_micros(100);
        for k in 1..=KERNEL_ENTRIES as u64 + 1 {
            l.record(k << 8, quick);
        }
        assert!(!l.ran_within(1 << 8, limit), "the oldest went");
        for k in 2..=KERNEL_ENTRIES as u64 + 1 {
            assert!(l.ran_within(k << 8, limit), "{k}");
        }
    }
}
