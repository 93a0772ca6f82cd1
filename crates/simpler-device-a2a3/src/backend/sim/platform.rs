//! The simulator's [`AicpuPlatform`] for the AICPU threads (`docs/device-simulator.md`).

use std::fmt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::aicore::Server;
use super::stream::LaunchEntry;
use super::wait::SpinPolicy;
use super::{SimShared, drive};
use crate::abi::regs::RegId;
use crate::aicpu::{AicpuPlatform, LogLevel};

/// The simulator's [`AicpuPlatform`]: registers are atomics, idle waits spin then park.
pub(crate) struct SimAicpu<'a> {
    pub(super) dev: &'a SimShared,
    entry: &'a LaunchEntry,
    thread: u32,
    spin: SpinPolicy<'a>,
    /// Tokens this thread's stores rang that wait for it to run them or hand them over.
    held: drive::Held,
}

impl<'a> SimAicpu<'a> {
    pub(super) fn new(dev: &'a SimShared, entry: &'a LaunchEntry, thread: u32) -> SimAicpu<'a> {
        SimAicpu { dev, entry, thread, spin: dev.spin_policy(), held: drive::Held::default() }
    }

    /// Whether core `c`'s last kernel (whoever served it) returned within `limit`.
    fn last_kernel_under(&self, c: u32, limit: Duration) -> bool {
        self.dev.regs.get(c as usize).is_some_and(|b| b.kernel_times.returned_within(limit))
    }
}

impl Drop for SimAicpu<'_> {
    fn drop(&mut self) {
        self.dev.hand_over(self.held.take_all());
    }
}

impl AicpuPlatform for SimAicpu<'_> {
    fn reg_load(&self, core: u32, reg: RegId) -> u32 {
        self.dev.regs.get(core as usize).map_or(0, |b| b.load(reg))
    }

    fn reg_store(&self, core: u32, reg: RegId, value: u32) {
        let Some(block) = self.dev.regs.get(core as usize) else { return };
        block.store(reg, value);
        if !matches!(reg, RegId::DataMainBaseLow | RegId::DataMainBaseHigh) {
            return;
        }
        let server = self.dev.ring_server();
        match drive::ring(self.dev, core, server) {
            // A free host core (the token was not served here): a token of a launch AICPU
            // threads drive is held rather than handed to the core's thread at once. (A launch
            // its thread drives is woken for every store: its thread reads the registers itself,
            // and one held bit could stand for two stores.)
            drive::Ring::Adopt
                if server == Server::Nobody
                    && self.dev.may_spare_threads()
                    && self.held.hold(core) => {}
            ring => self.dev.after_ring(core, block, ring),
        }
    }

    fn counter(&self) -> u64 {
        self.dev.ticks()
    }

    fn wait_epoch(&self) -> u64 {
        self.dev.hand_over(self.held.overdue());
        self.dev.aicpu_wake[self.thread as usize].epoch()
    }

    fn idle_wait(&self, observed: u64, round: u32, deadline: u64) {
        self.dev.hand_over(self.held.take_all());
        let ec = &self.dev.aicpu_wake[self.thread as usize];
        self.spin.backoff(round, ec, observed, Some(self.dev.instant_of(deadline)));
    }

    fn scheduler_idle_wait(&self, observed: u64, round: u32, deadline: u64, busy: u32) {
        let (held, nothing_else) = self.held.take_at_idle(busy);
        // A fault armed since the tokens were held needs the cores' threads.
        if !nothing_else || !self.dev.may_spare_threads() {
            self.dev.hand_over(held);
            return self.idle_wait(observed, round, deadline);
        }
        // Nothing else to do: run the first here (`Server::LONE` declines a kernel that did not
        // return quickly on the core before, which then goes to the core's thread, where the
        // stall watchdog sees a kernel that never returns), and the others too when their
        // cores' last kernels were quick (while that costs less than waking their threads);
        // otherwise their threads run them meanwhile. The caller looks at its cores again
        // before waiting.
        let first = held.trailing_zeros();
        let rest = held & !(1 << first);
        let quick = drive::cores_of(rest).all(|c| self.last_kernel_under(c, drive::HOLD_BUDGET));
        if !quick {
            self.dev.hand_over(rest);
        }
        let serve_here = if quick { held } else { 1 << first };
        let started = Instant::now();
        for c in drive::cores_of(serve_here) {
            if started.elapsed() > drive::HOLD_BUDGET {
                self.dev.hand_over(serve_here & (u128::MAX << c));
                break;
            }
            if let Some(block) = self.dev.regs.get(c as usize) {
                self.dev.after_ring(c, block, drive::ring(self.dev, c, Server::LONE));
            }
        }
    }

    fn notify_schedulers(&self) {
        self.dev.notify_all_aicpu();
    }

    fn claim_core(&self, core: u32) {
        if let Some(o) = self.dev.owner.get(core as usize) {
            // Release: ordered before the window-opening register store, which the core
            // acquires before it first writes COND.
            o.store(self.thread + 1, Ordering::Release);
        }
    }

    fn should_stop(&self) -> bool {
        self.dev.is_reset() || self.entry.is_aborted()
    }

    fn log(&self, level: LogLevel, args: fmt::Arguments<'_>) {
        let (d, t) = (self.dev.device_id, self.thread);
        match level {
            LogLevel::Error => tracing::error!(device = d, aicpu = t, "{args}"),
            LogLevel::Warn => tracing::warn!(device = d, aicpu = t, "{args}"),
            LogLevel::Info => tracing::info!(device = d, aicpu = t, "{args}"),
            LogLevel::Debug => tracing::debug!(device = d, aicpu = t, "{args}"),
        }
    }

    fn report_fault(&self, core: Option<u32>, args: fmt::Arguments<'_>) {
        self.dev.record_aicpu_fault(core, args.to_string());
    }
}
