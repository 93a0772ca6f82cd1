//! Host tensors on the chip tasks of a chip process (`docs/process-mode.md`, "Host tensors").
//!
//! The staging is THREAD mode's (`crate::staging`): one device copy per host buffer, copied in
//! unless every tensor of it is a contiguous blind write over all of it, written spans copied
//! back after a successful task. Here every
//! device call is a memory request through the mailbox, so the bytes cross in its frames and
//! no memory is shared with the child beyond the mailbox itself.
//!
//! Copy-back is all or nothing: every written span is read from the child first, and the host
//! buffers change only once all were read. A child that dies or stops answering during a task
//! therefore leaves every host buffer of it exactly as it was before the task.

use simpler_sched::EndpointFailure;
use simpler_types::{CallConfig, CallableId, EndpointOutcome, TaskArgsView, TaskId};

use super::parent::{ChipProcess, MemFailure, child_failure};
use crate::staging::StagingChip;

impl ChipProcess {
    /// The task failure of a memory request made while staging the task `origin`.
    fn staging_failure(&self, f: MemFailure, origin: TaskId) -> EndpointFailure {
        match f {
            MemFailure::Child(e) => child_failure(e, EndpointOutcome::EndpointFailure),
            MemFailure::Device(frame) => self.device_refusal(frame, Some(origin.run)),
        }
    }
}

impl StagingChip for ChipProcess {
    /// Starts (or restarts) the process now, then pins the task's requests to it: a copy lives
    /// in one process, and an address of it sent to a successor could name that process's own
    /// buffer.
    fn begin(&mut self) -> Result<(), EndpointFailure> {
        self.ensure_live().map_err(|e| child_failure(e, EndpointOutcome::EndpointFailure))?;
        self.pin(true);
        Ok(())
    }

    fn end(&mut self) {
        self.pin(false);
    }

    fn malloc(&mut self, len: u64, origin: TaskId) -> Result<u64, EndpointFailure> {
        self.device_malloc(len).map_err(|f| self.staging_failure(f, origin))
    }

    fn copy_in(
        &mut self,
        dev: u64,
        host: &crate::HostBuffer,
        origin: TaskId,
    ) -> Result<(), EndpointFailure> {
        host.with_bytes(|b| self.device_copy_to(dev, b))
            .map_err(|f| self.staging_failure(f, origin))
    }

    fn run(
        &mut self,
        callable: &CallableId,
        args: TaskArgsView<'_>,
        config: &CallConfig,
        origin: TaskId,
    ) -> Result<(), EndpointFailure> {
        ChipProcess::run(self, callable, args, config, origin)
    }

    fn copy_out(
        &mut self,
        dev: u64,
        out: &mut [u8],
        origin: TaskId,
    ) -> Result<(), EndpointFailure> {
        self.device_copy_from(dev, out).map_err(|f| self.staging_failure(f, origin))
    }

    fn free(&mut self, dev: u64, origin: TaskId) {
        // A copy in a process that ended died with it; freeing it would start a new process.
        if !self.is_live() {
            return;
        }
        if let Err(e) = ChipProcess::free(self, dev) {
            tracing::warn!(%origin, "freeing a staging copy in a chip process failed: {e}");
        }
    }
}
