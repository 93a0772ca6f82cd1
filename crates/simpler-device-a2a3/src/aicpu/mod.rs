//! The AICPU program: handshake, dispatch protocol and scheduler loop (`docs/device-handshake.md`).
//!
//! This is the scheduler that runs on the device's AICPU threads. The simulator runs exactly
//! this code on host threads; the onboard AICPU program is this module built for the device.
//! Everything hardware-specific goes through [`AicpuPlatform`] (registers, the 50 MHz counter,
//! idle waiting, cache maintenance, logging), so there are no simulator-only branches here
//! (conformance item 17). The module never blocks on a lock, spawns nothing and allocates
//! nothing: per-core state lives in fixed arrays on the thread's stack, and everything shared
//! lives in the runtime image.
//!
//! - `view`: checked, typed access to the runtime image.
//! - [`dispatch`]: one core's token state machine (ACK/FIN bookkeeping, double buffering).
//! - `scheduler`: the `exec` entry: boot, handshake, scheduling loop, watchdog, shutdown.
//! - `trace`: the AICPU dispatch records of swimlane level 2 (both runtimes).
//! - `trb`: the tensormap_and_ringbuffer side of `exec`: the orchestration thread and the
//!   scheduler threads that dispatch while it submits.
//! - `program` (feature `aicpu-program`): the onboard AICPU program's init and exec entries
//!   and its platform over the chip's register windows.

use core::fmt;

use crate::abi::regs::RegId;

pub mod dispatch;
pub mod program;
// The scheduler and the image view run over raw image memory whose exclusive use per AICPU
// thread only the runtime's launches guarantee: not for callers outside the crate.
pub(crate) mod scheduler;
mod text;
pub(crate) mod trace;
mod trb;
pub(crate) mod view;

pub(crate) use scheduler::exec;
pub use scheduler::{EXEC_HANDSHAKE_FAILED, EXEC_OK, EXEC_UNCLEAN_SHUTDOWN, part_is_brief};

/// Severity of an AICPU log line.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LogLevel {
    /// Something failed.
    Error,
    /// Something unusual happened.
    Warn,
    /// Progress information.
    Info,
    /// Per-run details.
    Debug,
}

/// What the AICPU scheduler needs from the hardware (or from the simulator standing in for it).
///
/// Validation is the caller's job: the scheduler only passes core indices below the launch's
/// `num_aicore`, and implementations may assume so.
pub trait AicpuPlatform {
    /// Loads register `reg` of AICore core `core` with acquire ordering (onboard: a volatile
    /// MMIO read followed by a read barrier).
    fn reg_load(&self, core: u32, reg: RegId) -> u32;

    /// Stores `value` into register `reg` of `core` with release ordering (onboard: a write
    /// barrier, then a volatile MMIO write). A store wakes the core if it is parked.
    fn reg_store(&self, core: u32, reg: RegId, value: u32);

    /// The 50 MHz system counter.
    fn counter(&self) -> u64;

    /// The epoch of this thread's wakeup counter. Read it before checking the conditions an
    /// idle wait depends on.
    fn wait_epoch(&self) -> u64;

    /// Called when an iteration made no progress. `round` counts consecutive idle rounds;
    /// implementations spin for the first rounds and then park until the epoch moves past
    /// `observed` or the counter reaches `deadline` (onboard: a bounded spin).
    fn idle_wait(&self, observed: u64, round: u32, deadline: u64);

    /// The idle wait of a scheduling thread's loop, `busy` of whose cores have a dispatch not
    /// yet seen finished. A platform whose cores are host threads may use the count: the
    /// simulator runs a lone dispatch itself here instead of waking a thread for it
    /// (`docs/device-simulator.md`, "Who runs a dispatch"). Otherwise [`idle_wait`](Self::idle_wait).
    fn scheduler_idle_wait(&self, observed: u64, round: u32, deadline: u64, busy: u32) {
        let _ = busy;
        self.idle_wait(observed, round, deadline);
    }

    /// Wakes every AICPU thread of the launch (new ready work, run finished, boot published).
    fn notify_schedulers(&self);

    /// Declares that the calling thread owns `core`, so the core's `COND` writes wake this
    /// thread. Called before the core's window is opened.
    fn claim_core(&self, core: u32);

    /// Core `core` reported physical core id `physical` at the handshake (below
    /// [`PHYSICAL_CORE_LIMIT`](crate::abi::PHYSICAL_CORE_LIMIT), and no other core of the
    /// thread's): a chip's register table is indexed by physical core id, which the launch does
    /// not fix in advance. A platform may drop stores to, and read 0 from, a core not mapped
    /// yet (a chip cannot address it); the scheduler maps a core before it opens its window,
    /// and after a failed handshake every core that reported in, so its exit signal arrives.
    fn map_core(&self, core: u32, physical: u32) {
        let _ = (core, physical);
    }

    /// Whether the launch is being torn down (device reset or abandoned entry): every wait gives
    /// up and the scheduler shuts down.
    fn should_stop(&self) -> bool;

    /// Writes a log line.
    fn log(&self, level: LogLevel, args: fmt::Arguments<'_>);

    /// Records a fault the host should report with the run's error (a handshake failure, a
    /// core that never answered exit).
    fn report_fault(&self, core: Option<u32>, args: fmt::Arguments<'_>);
}
