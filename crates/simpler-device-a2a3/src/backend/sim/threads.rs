//! The simulated threads' main loop (`docs/device-simulator.md`, "Device
//! object and threads").

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::aicore::record_core_fault;
use super::mailbox::Mail;
use super::platform::SimAicpu;
use super::stream::LaunchEntry;
use super::{Role, SimShared, core_type_of, cxx_core, drive, wait};
use crate::abi::codes::AclCode;
use crate::abi::regs::{EXIT_SIGNAL, RegId};
use crate::aicpu::AicpuPlatform;
use crate::runtime::hbg::panic_text;

/// Decrements `alive` and signals finalize when a simulated thread leaves (also on panic).
struct ExitGuard(Arc<SimShared>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        self.0.gate.sleep();
        let _g = self.0.exit_lock.lock();
        self.0.alive.fetch_sub(1, Ordering::AcqRel);
        self.0.exit_cv.notify_all();
    }
}

impl SimShared {
    /// Parks on the mailbox until it holds a job, an adoption or quit; an AICPU thread first
    /// lingers for the next job (`wait::linger`).
    fn take_mail(&self, role: Role, index: u32) -> Mail {
        let mb = self.mailbox(role, index);
        let mut st = mb.state.lock();
        let mut lingered = false;
        loop {
            mb.posted.store(false, Ordering::Relaxed);
            match std::mem::take(&mut *st) {
                Mail::Empty if !lingered && role == Role::Aicpu => {
                    lingered = true;
                    parking_lot::MutexGuard::unlocked(&mut st, || {
                        wait::linger(|| mb.posted.load(Ordering::Acquire), None)
                    });
                }
                Mail::Empty => {
                    self.parked.fetch_add(1, Ordering::Relaxed);
                    self.gate.sleep();
                    mb.cv.wait(&mut st);
                    self.gate.wake();
                    self.parked.fetch_sub(1, Ordering::Relaxed);
                }
                mail => return mail,
            }
        }
    }

    /// Takes over core `index`'s launch if AICPU threads drive it and reports its end.
    fn adopt_core(&self, index: u32) {
        let adopted = std::panic::catch_unwind(AssertUnwindSafe(|| drive::adopt(self, index)));
        let a = match adopted {
            Ok(Some(drive::Adoption::Taken(a))) => a,
            Ok(Some(drive::Adoption::GaveUp { stream, entry })) => {
                let ended = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    drive::end_outlived(self, &entry, index)
                }));
                let code = ended.unwrap_or(AclCode::AICORE_TIMEOUT.get());
                return self.finish(stream, &entry, code);
            }
            Ok(None) => return,
            // A bug in the simulator itself before the launch was taken (`adopt` takes it last,
            // after everything that could fail): nobody took it.
            Err(_) => return,
        };
        let driven =
            std::panic::catch_unwind(AssertUnwindSafe(|| drive::drive_adopted(self, index, &a)));
        let code = driven.unwrap_or_else(|_| {
            // A bug in the simulator itself; report it as a fault of the participant.
            self.drop_core_state(index);
            AclCode::AICORE_EXCEPTION.get()
        });
        self.finish(a.stream, &a.entry, code);
    }

    /// Drops core `index`'s launch state after a panic in the simulator, so that no AICPU
    /// thread serves from an ended launch's image (one still holding the state drops it).
    fn drop_core_state(&self, index: u32) {
        let Some(regs) = self.regs.get(index as usize) else { return };
        match regs.serving.try_lock() {
            Some(mut slot) => *slot = None,
            None => regs.abandoned.store(true, Ordering::SeqCst),
        }
    }

    /// Runs one posted participant; returns its code.
    fn run_participant(&self, role: Role, index: u32, entry: &Arc<LaunchEntry>) -> i32 {
        let run = std::panic::catch_unwind(AssertUnwindSafe(|| match role {
            Role::Aicpu => self.run_aicpu(entry, index),
            Role::AiCore => match self.executor.get() {
                Some(exe) => cxx_core::run_core(self, entry, index, exe),
                None => drive::run_on_thread(self, entry, index),
            },
        }));
        match run {
            Ok(code) => code,
            // A bug in the simulator or the AICPU program; report it as a fault of the
            // participant, with its text.
            Err(p) => match role {
                Role::Aicpu => {
                    let text = panic_text(&*p);
                    self.record_aicpu_fault(None, format!("AICPU thread {index} panicked: {text}"));
                    self.end_after_aicpu_panic(entry, index);
                    3
                }
                Role::AiCore => {
                    self.drop_core_state(index);
                    let core = (index, core_type_of(index, self));
                    let text = format!("the simulated core's thread panicked: {}", panic_text(&*p));
                    record_core_fault(self, AclCode::AICORE_EXCEPTION, core, None, text)
                }
            },
        }
    }

    /// After AICPU participant `thread` of `entry` panicked: what the AICPU program's own
    /// failure path does, so that the run ends now and not at the op-execute watchdog. The
    /// run's abort flag stops the other AICPU threads, and every core of the launch gets the
    /// exit signal: the cores the panicked thread served would otherwise wait for a task
    /// forever. (A core's kernel is never cut short: it answers once the kernel returns.)
    fn end_after_aicpu_panic(&self, entry: &LaunchEntry, thread: u32) {
        let Some(args) = self.read_kernel_args(entry.args) else { return };
        let Some(view) = self.core_image_view(&args) else { return };
        view.shared().abort.store(1, Ordering::Release);
        self.notify_all_aicpu();
        let p = SimAicpu::new(self, entry, thread);
        for w in 0..view.header().num_aicore {
            p.reg_store(w, RegId::DataMainBaseLow, EXIT_SIGNAL);
        }
    }
}

/// Thread protocol: park on the mailbox; run a posted participant and report its result, or
/// adopt a core's launch; on `Quit`, a core's thread first ends a launch it still has to adopt.
pub(super) fn thread_main(dev: Arc<SimShared>, role: Role, index: u32) {
    dev.gate.wake();
    wait::exact_timers();
    let _guard = ExitGuard(dev.clone());
    loop {
        match dev.take_mail(role, index) {
            Mail::Job { stream, entry, brief } => {
                for part in drive::cores_of(u128::from(brief)) {
                    let code = dev.run_participant(role, part, &entry);
                    dev.finish(stream, &entry, code);
                }
                let code = dev.run_participant(role, index, &entry);
                dev.finish(stream, &entry, code);
            }
            Mail::Adopt if role == Role::AiCore => dev.adopt_core(index),
            Mail::Adopt | Mail::Empty => {}
            Mail::Quit => {
                if role == Role::AiCore {
                    dev.adopt_core(index);
                }
                return;
            }
        }
    }
}
