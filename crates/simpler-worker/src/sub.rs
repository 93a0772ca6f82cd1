//! Sub workers: engine SUB endpoints that run registered host closures
//! (`docs/worker-protocols.md` §8).
//!
//! The closure gets the member's arguments as a borrowed view valid for the call only. `Ok` is
//! success, `Err` a task failure carrying the error and its source chain, and a panic is
//! caught and becomes a task failure `panicked: <payload>`; the sub worker keeps serving.

use std::panic::{AssertUnwindSafe, catch_unwind};

use simpler_sched::{DispatchedMember, Endpoint, EndpointCaps, EndpointFailure};
use simpler_types::{FailureSource, WorkerId, WorkerType};

use crate::handle::{Entry, SharedRegistry};
use crate::reentry;
use crate::run::panic_text;

/// One sub worker of a level.
pub(crate) struct SubEndpoint {
    pub(crate) index: u32,
    pub(crate) level: u8,
    /// The level's worker and its ancestors: a host closure acts for all of them.
    pub(crate) lineage: reentry::Lineage,
    pub(crate) registry: SharedRegistry,
}

impl Endpoint for SubEndpoint {
    fn caps(&self) -> EndpointCaps {
        EndpointCaps {
            worker_type: WorkerType::Sub,
            id: WorkerId(self.index),
            remote: false,
            name: format!("simpler-sub-{}-{}", self.level, self.index),
        }
    }

    fn run(&mut self, task: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
        let found = self.registry.read().runnable.get(task.callable).cloned();
        let Some(reg) = found else {
            return Err(EndpointFailure::endpoint_failed(format!(
                "callable {} is not registered on this worker",
                task.callable
            )));
        };
        let Entry::Host(f) = reg.entry else {
            return Err(EndpointFailure::endpoint_failed(format!(
                "'{}' is not a host closure",
                reg.name
            )));
        };
        let _acting = reentry::enter_lineage(&self.lineage);
        match catch_unwind(AssertUnwindSafe(|| f(task.args))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                let mut text = e.to_string();
                let mut source = e.source();
                while let Some(s) = source {
                    text.push_str(": ");
                    text.push_str(&s.to_string());
                    source = s.source();
                }
                // The text for the frame, the error itself for `Frame::error`.
                Err(EndpointFailure::task_failed(text).with_source(FailureSource::from_boxed(e)))
            }
            Err(p) => Err(EndpointFailure::panicked(panic_text(p.as_ref()))),
        }
    }
}
