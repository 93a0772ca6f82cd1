//! The simulated register blocks: one cache-line-aligned block of atomic cells per core, one
//! cell per register the handshake and dispatch protocol uses (`docs/device-handshake.md`),
//! persistent for the device's life.

use std::sync::atomic::{AtomicU32, Ordering};

use super::wait::EventCount;
use crate::abi::regs::RegId;

/// One core's register cells and the event count its waits park on.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct RegBlock {
    cells: [AtomicU32; RegId::COUNT],
    /// Bumped by every store to `DATA_MAIN_BASE` (the AICore waits for those) and by resets.
    pub(crate) wake: EventCount,
}

impl RegBlock {
    /// Acquire load of a register.
    pub(crate) fn load(&self, reg: RegId) -> u32 {
        self.cells[reg.cell()].load(Ordering::Acquire)
    }

    pub(crate) fn store(&self, reg: RegId, v: u32) {
        self.cells[reg.cell()].store(v, Ordering::Release);
    }
}
