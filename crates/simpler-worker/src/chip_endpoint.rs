//! The chip endpoint of an L3 engine: the engine's endpoint thread of a chip is that chip's lane
//! (`docs/worker-protocols.md` §1). It runs each dispatched task on the chip's [`ChipState`],
//! staging host tensors first, and finalizes the chip when the engine shuts it down.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use parking_lot::Mutex;
use simpler_sched::{DispatchedMember, Endpoint, EndpointCaps, EndpointFailure};
use simpler_types::WorkerType;

use crate::chip::ChipState;
use crate::error::{Residue, TeardownCause, TeardownPart};
use crate::run::panic_text;

/// The chip endpoint of an L3 engine: its endpoint thread is the chip's lane.
pub(crate) struct ChipEndpoint {
    pub(crate) state: ChipState,
    /// Teardown residue, read by the worker after the engine joined this thread.
    pub(crate) residue: Arc<Mutex<Vec<Residue>>>,
    /// The worker this chip is part of, and its lineage: a task's preparation runs user code
    /// (a native orchestration) on this thread, the chip's lane, and a call from it back into
    /// the worker is `Reentrant`, never a wait for this lane.
    pub(crate) instance: u64,
    pub(crate) lineage: crate::reentry::Lineage,
}

impl Endpoint for ChipEndpoint {
    fn caps(&self) -> EndpointCaps {
        EndpointCaps {
            worker_type: WorkerType::NextLevel,
            id: self.state.chip,
            remote: false,
            name: format!("chip {}", self.state.chip),
        }
    }

    fn run(&mut self, task: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
        let _on_lane = crate::reentry::enter_lane(self.instance, &self.lineage);
        if crate::staging::has_host_tensors(task.args) {
            return crate::staging::run_staged(
                &mut self.state,
                task.callable,
                task.args,
                task.config,
                task.task,
            );
        }
        self.state.run(task.callable, task.args, task.config, task.task)
    }

    /// Finalizes the chip; a finalize that panics is reported as the chip's residue (the
    /// endpoint thread would only log it), so the worker's close returns it.
    fn shutdown(&mut self) {
        let residue = match catch_unwind(AssertUnwindSafe(|| self.state.finalize())) {
            Ok(residue) => residue,
            Err(p) => {
                let message = panic_text(p.as_ref());
                let cause = TeardownCause::Panicked { step: "finalize", message };
                vec![Residue::failed(TeardownPart::Chip(self.state.chip), cause)]
            }
        };
        self.residue.lock().extend(residue);
    }
}

impl Drop for ChipEndpoint {
    /// Finalizes a chip whose endpoint was never shut down (an engine that failed to start);
    /// after a shutdown there is nothing left to finalize. Never unwinds out of the drop.
    fn drop(&mut self) {
        self.shutdown();
    }
}
