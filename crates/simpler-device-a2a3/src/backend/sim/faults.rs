//! Fault injection for the simulated chip (`docs/device-simulator.md`).
//!
//! A [`FaultPlan`] arms one-shot faults: "the nth launch of this kind fails", "the nth
//! execution of this func id faults / hangs", and so on. The hot paths pay one relaxed load of
//! `armed` per launch and per kernel call; only when something is armed do they take the lock.
//! Every fault that fires is appended to a log, so tests can assert that it did.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::KernelKind;

/// One armed fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Armed {
    FailLaunch { kind: KernelKind, remaining: u32 },
    PanicAfterLaunch { kind: KernelKind, remaining: u32 },
    KernelFault { func_id: u32, remaining: u32 },
    KernelHang { func_id: u32, remaining: u32 },
    KernelDelay { func_id: u32, delay: Duration },
    AicpuFault { remaining: u32 },
    AicpuPanic { remaining: u32 },
    HandshakeFault { core: u32, physical_core_id: u32 },
    FailRead { remaining: u32 },
}

/// A fault that fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FiredFault {
    /// A launch of this kind was refused.
    LaunchRefused(KernelKind),
    /// A launch of this kind was enqueued, then the launching host call panicked.
    PanickedAfterLaunch(KernelKind),
    /// A kernel execution of this func id faulted (no FIN).
    KernelFaulted {
        /// The func id.
        func_id: u32,
        /// The core it ran on.
        core: u32,
    },
    /// A kernel execution of this func id hung.
    KernelHung {
        /// The func id.
        func_id: u32,
        /// The core it ran on.
        core: u32,
    },
    /// A kernel execution was delayed.
    KernelDelayed {
        /// The func id.
        func_id: u32,
    },
    /// The AICPU exec entry returned non-zero after its work.
    AicpuFaulted,
    /// AICPU thread 0 panicked at the start of its exec entry.
    AicpuPanicked,
    /// A core reported a bad physical core id in the handshake.
    HandshakeCorrupted {
        /// The core.
        core: u32,
    },
    /// A copy from device memory to the host was refused.
    ReadRefused,
}

/// What a kernel execution should do instead of (or besides) running normally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KernelAction {
    Run,
    Fault,
    Hang,
    Delay(Duration),
}

/// The fault plan of one simulated device. Obtain it with
/// [`DeviceRunner::sim_faults`](crate::DeviceRunner::sim_faults).
#[derive(Debug, Default)]
pub struct FaultPlan {
    /// Whether anything is armed; written under `state`'s lock, read relaxed on hot paths
    /// (a stale `false` only delays a fault armed concurrently with a run, which tests never do).
    armed: AtomicBool,
    state: Mutex<Vec<Armed>>,
    fired: Mutex<Vec<FiredFault>>,
}

impl FaultPlan {
    fn arm(&self, a: Armed) {
        let mut s = self.state.lock();
        s.push(a);
        self.armed.store(true, Ordering::Relaxed);
    }

    /// Refuses the `nth` (1-based) next launch of `kind` with 207001.
    pub fn fail_launch(&self, kind: KernelKind, nth: u32) {
        self.arm(Armed::FailLaunch { kind, remaining: nth.max(1) });
    }

    /// Makes the `nth` next launch of `kind` panic on the host thread right after the kernel
    /// was enqueued: the device runs while the caller unwinds, as after a panic in any host
    /// code between the launch and the end of the reap (a logging layer, an allocation).
    pub fn panic_after_launch(&self, kind: KernelKind, nth: u32) {
        self.arm(Armed::PanicAfterLaunch { kind, remaining: nth.max(1) });
    }

    /// Makes the `nth` next execution of `func_id` behave like a core exception: no FIN, the
    /// core stops, the AICore stream reports 507015.
    pub fn kernel_fault(&self, func_id: u32, nth: u32) {
        self.arm(Armed::KernelFault { func_id, remaining: nth.max(1) });
    }

    /// Makes the `nth` next execution of `func_id` park until the op-execute watchdog or a
    /// device reset releases it.
    pub fn kernel_hang(&self, func_id: u32, nth: u32) {
        self.arm(Armed::KernelHang { func_id, remaining: nth.max(1) });
    }

    /// Makes every execution of `func_id` take at least `delay`.
    pub fn kernel_delay(&self, func_id: u32, delay: Duration) {
        self.arm(Armed::KernelDelay { func_id, delay });
    }

    /// Makes the `nth` next AICPU exec entry (counted per launch) return non-zero after its
    /// work.
    pub fn aicpu_fault(&self, nth: u32) {
        self.arm(Armed::AicpuFault { remaining: nth.max(1) });
    }

    /// Makes AICPU thread 0 panic at the start of the `nth` next AICPU exec entry, before its
    /// handshake, as a bug in the AICPU program would: the simulator then ends the launch
    /// the way the program's own failure path does.
    pub fn aicpu_panic(&self, nth: u32) {
        self.arm(Armed::AicpuPanic { remaining: nth.max(1) });
    }

    /// Makes `core` report `physical_core_id` in its next handshake (≥ 75 is a handshake
    /// failure).
    pub fn handshake_fault(&self, core: u32, physical_core_id: u32) {
        self.arm(Armed::HandshakeFault { core, physical_core_id });
    }

    /// Refuses the `nth` next copy from device memory to the host (`copy_from_device`, a
    /// staged tensor's copy-back), as if the range were not mapped.
    pub fn fail_read(&self, nth: u32) {
        self.arm(Armed::FailRead { remaining: nth.max(1) });
    }

    /// Disarms everything (the log of fired faults is kept).
    pub fn clear(&self) {
        let mut s = self.state.lock();
        s.clear();
        self.armed.store(false, Ordering::Relaxed);
    }

    /// The faults that fired so far, in order.
    pub fn fired(&self) -> Vec<FiredFault> {
        self.fired.lock().clone()
    }

    pub(crate) fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed)
    }

    fn fire(&self, f: FiredFault) {
        tracing::warn!(fault = ?f, "simulator fault injected");
        self.fired.lock().push(f);
    }

    /// Removes entries matching `pred` whose countdown reached zero; returns whether one fired.
    fn countdown(&self, mut matches: impl FnMut(&mut Armed) -> Option<&mut u32>) -> bool {
        let mut s = self.state.lock();
        let mut fired_at = None;
        for (i, a) in s.iter_mut().enumerate() {
            if let Some(rem) = matches(a) {
                *rem -= 1;
                if *rem == 0 {
                    fired_at = Some(i);
                }
                break;
            }
        }
        if let Some(i) = fired_at {
            s.remove(i);
            if s.is_empty() {
                self.armed.store(false, Ordering::Relaxed);
            }
            true
        } else {
            false
        }
    }

    /// [`countdown`](Self::countdown) when anything is armed, logging `fired` if it fires.
    fn countdown_fire(
        &self,
        matches: impl FnMut(&mut Armed) -> Option<&mut u32>,
        fired: FiredFault,
    ) -> bool {
        if !self.is_armed() || !self.countdown(matches) {
            return false;
        }
        self.fire(fired);
        true
    }

    /// Called once per launch: whether this launch is refused.
    pub(crate) fn on_launch(&self, kind: KernelKind) -> bool {
        self.countdown_fire(
            |a| match a {
                Armed::FailLaunch { kind: k, remaining } if *k == kind => Some(remaining),
                _ => None,
            },
            FiredFault::LaunchRefused(kind),
        )
    }

    /// Called once per enqueued launch: panics if a `panic_after_launch` fault fires.
    pub(crate) fn after_launch(&self, kind: KernelKind) {
        let fired = self.countdown_fire(
            |a| match a {
                Armed::PanicAfterLaunch { kind: k, remaining } if *k == kind => Some(remaining),
                _ => None,
            },
            FiredFault::PanickedAfterLaunch(kind),
        );
        if fired {
            panic!("injected panic after the {kind:?} launch");
        }
    }

    /// Called once per kernel execution.
    pub(crate) fn on_kernel(&self, func_id: u32, core: u32) -> KernelAction {
        if !self.is_armed() {
            return KernelAction::Run;
        }
        if self.countdown(|a| match a {
            Armed::KernelFault { func_id: f, remaining } if *f == func_id => Some(remaining),
            _ => None,
        }) {
            self.fire(FiredFault::KernelFaulted { func_id, core });
            return KernelAction::Fault;
        }
        if self.countdown(|a| match a {
            Armed::KernelHang { func_id: f, remaining } if *f == func_id => Some(remaining),
            _ => None,
        }) {
            self.fire(FiredFault::KernelHung { func_id, core });
            return KernelAction::Hang;
        }
        let delay = self.state.lock().iter().find_map(|a| match a {
            Armed::KernelDelay { func_id: f, delay } if *f == func_id => Some(*delay),
            _ => None,
        });
        match delay {
            Some(d) => {
                self.fire(FiredFault::KernelDelayed { func_id });
                KernelAction::Delay(d)
            }
            None => KernelAction::Run,
        }
    }

    /// Called once per copy from device memory to the host: whether it is refused.
    pub(crate) fn on_read(&self) -> bool {
        self.countdown_fire(
            |a| match a {
                Armed::FailRead { remaining } => Some(remaining),
                _ => None,
            },
            FiredFault::ReadRefused,
        )
    }

    /// Called once per AICPU launch entry: whether its result is forced non-zero.
    pub(crate) fn on_aicpu_entry(&self) -> bool {
        self.countdown_fire(
            |a| match a {
                Armed::AicpuFault { remaining } => Some(remaining),
                _ => None,
            },
            FiredFault::AicpuFaulted,
        )
    }

    /// Called once per AICPU launch entry, on thread 0 before its work: whether it panics.
    pub(crate) fn on_aicpu_start(&self) -> bool {
        self.countdown_fire(
            |a| match a {
                Armed::AicpuPanic { remaining } => Some(remaining),
                _ => None,
            },
            FiredFault::AicpuPanicked,
        )
    }

    /// Called once per core handshake: the physical core id to report instead of the index.
    pub(crate) fn on_handshake(&self, core: u32) -> Option<u32> {
        if !self.is_armed() {
            return None;
        }
        let mut s = self.state.lock();
        let pos = s
            .iter()
            .position(|a| matches!(a, Armed::HandshakeFault { core: w, .. } if *w == core))?;
        let Armed::HandshakeFault { physical_core_id, .. } = s.remove(pos) else {
            unreachable!("position matched a handshake fault");
        };
        if s.is_empty() {
            self.armed.store(false, Ordering::Relaxed);
        }
        drop(s);
        self.fire(FiredFault::HandshakeCorrupted { core });
        Some(physical_core_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_launch_fails_once() {
        let p = FaultPlan::default();
        p.fail_launch(KernelKind::Aicpu, 2);
        assert!(!p.on_launch(KernelKind::AiCore));
        assert!(!p.on_launch(KernelKind::Aicpu));
        assert!(p.on_launch(KernelKind::Aicpu));
        assert!(!p.on_launch(KernelKind::Aicpu));
        assert_eq!(p.fired(), vec![FiredFault::LaunchRefused(KernelKind::Aicpu)]);
    }

    #[test]
    fn kernel_faults_count_executions_of_their_func_id() {
        let p = FaultPlan::default();
        p.kernel_fault(3, 2);
        assert_eq!(p.on_kernel(1, 0), KernelAction::Run);
        assert_eq!(p.on_kernel(3, 0), KernelAction::Run);
        assert_eq!(p.on_kernel(3, 4), KernelAction::Fault);
        assert_eq!(p.on_kernel(3, 0), KernelAction::Run);
    }
}
