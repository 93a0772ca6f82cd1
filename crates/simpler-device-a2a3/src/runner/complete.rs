//! Completing a reaped run (C1–C3): the handshake report, the latched status or the
//! copy-back, and the terminal cleanup that frees its slot.

use std::sync::atomic::Ordering;

use super::staging::host_slice_mut;
use super::{ActiveRun, Core, RunReport, RunState, Stage, image_view};
use crate::diag::Outcome;
use crate::error::DeviceError;

impl Core {
    pub(super) fn complete_run(&mut self, active: ActiveRun) -> Result<RunReport, DeviceError> {
        self.sweep_dropped();
        // A run not reaped yet is reaped first, for the rest of its budget, as `run` does: its
        // outcome is this call's, not lost behind a `Busy` with the handle the caller gave up.
        let launched = self
            .check_lease("complete_run", &active.lease)
            .ok()
            .and_then(|s| self.slots[s].run.as_ref().filter(|r| r.stage == Stage::Launched));
        if launched.is_some() {
            self.reap_run(&active, None)?;
        }
        let lease = active.lease;
        let (s, mut run) = match self.take_run("complete_run", &lease, Stage::Reaped) {
            Ok(x) => x,
            Err(e) => {
                // The handle was moved in, so the caller keeps nothing: a current lease is
                // cleaned up like a dropped handle, now; a stale or foreign one is ignored here.
                drop(lease);
                self.sweep_dropped();
                return Err(e);
            }
        };
        lease.consume();
        let r = self.guarded(s, &mut run, Outcome::FailedAfterLaunch, Core::complete_steps);
        self.free_slot(s);
        r
    }

    /// C1–C3 on a run taken out of its slot; the terminal cleanup has run either way.
    fn complete_steps(&mut self, run: &mut RunState) -> Result<RunReport, DeviceError> {
        // C1.
        self.handshake_report(run);
        // C2.
        let result = match run.latched.take() {
            Some(fault) => Err(fault.into_error(run.run_id)),
            None => {
                // Every copy-back is attempted; the first one the backend refuses fails the
                // run, so stale host bytes never pass for its output.
                let mut refused = None;
                for s in &run.staged {
                    // SAFETY: `with_host_tensors`' contract makes the host range writable and
                    // unused by anyone else until the run ends.
                    if let Some(dst) = unsafe { host_slice_mut(s.host_addr, s.bytes) }
                        && let Err(e) = self.backend.read(s.dev_addr, dst)
                    {
                        refused.get_or_insert(e.in_run(run.run_id));
                    }
                }
                match refused {
                    Some(e) => Err(e),
                    None => {
                        self.stats.runs_completed += 1;
                        Ok(())
                    }
                }
            }
        };
        // C3.
        let outcome = if result.is_ok() { Outcome::Success } else { Outcome::FailedAfterLaunch };
        self.finish(run, outcome);
        result.map(|()| std::mem::take(&mut run.report))
    }

    /// C1: the handshake record of every core of the launch, at debug level.
    fn handshake_report(&self, run: &RunState) {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let Ok(view) = image_view(&*self.backend, run) else { return };
        for c in 0..3 * run.block_dim {
            let h = view.handshake(c);
            tracing::debug!(
                run = %run.run_id,
                core = c,
                aicore_done = h.aicore_done.load(Ordering::Relaxed),
                aicpu_ready = h.aicpu_ready.load(Ordering::Relaxed),
                task = h.task.load(Ordering::Relaxed),
                core_type = h.core_type.load(Ordering::Relaxed),
                physical = h.physical_core_id.load(Ordering::Relaxed),
                "handshake"
            );
        }
    }
}
