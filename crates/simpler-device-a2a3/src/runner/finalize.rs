//! Finalizing a runner (steps 3–5 of `docs/device-runner.md`, "Finalize"): the terminal
//! cleanup of every unfinished run, the device's reset and the code it may still run.

use super::{Core, Stage, reap};
use crate::diag::Outcome;
use crate::error::DeviceError;
use crate::runner::FinalizeReport;

impl Core {
    /// A detached device thread may still be executing kernel code from a loaded object: every
    /// object stays loaded for the life of the process.
    fn keep_code_loaded(&mut self) {
        for reg in self.callables.slots.iter_mut().flatten() {
            std::mem::forget(std::mem::take(&mut reg.code));
        }
        std::mem::forget(std::mem::take(&mut self.callables.retired_code));
    }

    pub(super) fn finalize(mut self) -> Result<FinalizeReport, DeviceError> {
        let mut report = FinalizeReport::default();
        // A launched run may still execute an orchestration object's code on an AICPU thread
        // until the device is reset below; closing the object before that (the simulator's
        // built program closes it on the calling thread) would pull the code out from under
        // it. Such objects stay loaded instead.
        let launched = self.runs().any(|r| r.stage == Stage::Launched);
        // (3) Terminal cleanup of every unfinished run, dropped handles' included.
        drop(std::mem::take(&mut *self.returns.lock()));
        for s in 0..self.slots.len() {
            let Some(mut run) = self.slots[s].run.take() else { continue };
            report.abandoned_run.get_or_insert(run.run_id);
            let outcome = match run.stage {
                Stage::Prepared => Outcome::FailedBeforeLaunch,
                Stage::Launched | Stage::Reaped => Outcome::FailedAfterLaunch,
            };
            self.finish(&mut run, outcome);
            self.free_slot(s);
        }
        if launched {
            tracing::warn!(
                device = self.opts.device_id,
                "finalize with a launched run: orchestration objects stay loaded"
            );
            // The device may still be executing it: a recovery drain (here one that gives up at
            // once) marks the device for the force reset a plain reset would not do.
            let _ = self.backend.drain(reap::MIN_RECOVERY_DRAIN, self.timeouts.op_execute);
        } else {
            self.unload_orchestrations();
        }
        // The last run's AICPU end event (device queueing) is released before the reset:
        // CANN wants events destroyed before the device they belong to.
        self.last_aicpu_end = None;
        // (4)–(5) Reset the device, join its threads, free everything.
        let allocations = self.backend.memory_counts().allocations as usize;
        report.stuck_threads = self.backend.shutdown();
        self.backend_down = true;
        if report.stuck_threads.is_empty() {
            report.freed_allocations = allocations;
        } else {
            self.keep_code_loaded();
        }
        self.user_allocs.clear();
        // The backend's reset and release failures (onboard: the force-reset loop).
        match self.backend.take_error() {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }
}

/// A core dropped before its backend was shut down (a panic that unwound out of `finalize`,
/// from a tracing layer say): the device's threads may still run code of the loaded objects,
/// which the fields' own drops would unload under them (the backend drops before the
/// callables). The backend is shut down first, and the code stays loaded when it had to leave
/// a thread behind, as `finalize` does.
impl Drop for Core {
    fn drop(&mut self) {
        if self.backend_down {
            return;
        }
        self.backend_down = true;
        let backend = &mut self.backend;
        let stuck = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| backend.shutdown()));
        if !matches!(stuck, Ok(ref left) if left.is_empty()) {
            self.keep_code_loaded();
        }
    }
}
