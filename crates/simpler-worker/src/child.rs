//! Child workers of an L4+ level: engine NEXT_LEVEL endpoints that run one whole child run per
//! task (`docs/worker-protocols.md` §9).
//!
//! The endpoint copies the member's arguments (tags included) into an owned `TaskArgs` and
//! calls the child's `run` with the task's graph, arguments and configuration. `Ok` is success;
//! a `Build` error is a task failure, and so is a `Run` error in which a child task failed,
//! carrying the child's failure as its cause (one frame per level); a `Run` error with no failed
//! child task (its cleanup failed, say), `Closed` or `DeviceUnusable` is an endpoint failure.
//! The child stays usable and runs one parent task at a time. The endpoint's shutdown closes
//! the child.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use parking_lot::Mutex;
use simpler_sched::{DispatchedMember, Endpoint, EndpointCaps, EndpointFailure};
use simpler_types::{FailureSource, TaskArgs, WorkerId, WorkerType};

use crate::error::{Residue, TeardownCause, TeardownPart, WorkerError};
use crate::graph::Orchestration;
use crate::handle::{Entry, SharedRegistry};
use crate::reentry;
use crate::run::panic_text;
use crate::worker::Worker;

/// One adopted child worker.
pub(crate) struct ChildEndpoint {
    pub(crate) id: WorkerId,
    /// The parent worker and its ancestors: the child run acts for all of them.
    pub(crate) parent_lineage: reentry::Lineage,
    pub(crate) parent_registry: SharedRegistry,
    pub(crate) child: Option<Worker>,
    /// Errors of closing the child, read by the parent after the engine joined this thread.
    pub(crate) residue: Arc<Mutex<Vec<Residue>>>,
}

impl Endpoint for ChildEndpoint {
    fn caps(&self) -> EndpointCaps {
        let level = self.child.as_ref().map_or(0, Worker::level);
        EndpointCaps {
            worker_type: WorkerType::NextLevel,
            id: self.id,
            remote: false,
            name: format!("child {} (L{level})", self.id),
        }
    }

    fn run(&mut self, task: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
        let Some(child) = &self.child else {
            return Err(EndpointFailure::endpoint_failed("the child worker is closed"));
        };
        let found = self.parent_registry.read().runnable.get(task.callable).cloned();
        let graph = match found.map(|r| r.entry) {
            Some(Entry::Graph(g)) => g,
            _ => {
                return Err(EndpointFailure::endpoint_failed(format!(
                    "graph {} is not registered on this worker",
                    task.callable
                )));
            }
        };
        let args = TaskArgs::from_view(task.args).map_err(|e| {
            EndpointFailure::endpoint_failed(e.to_string()).with_source(FailureSource::new(e))
        })?;
        let orch = Orchestration::graph(move |gb, view, cfg| graph(gb, view, cfg))
            .args(args)
            .config(task.config.clone());
        let _acting = reentry::enter_lineage(&self.parent_lineage);
        match child.run(orch) {
            Ok(()) => Ok(()),
            // A task of the child failed: this task failed with it, caused by it. A child run
            // that failed without a failed task (its cleanup, an abort) failed the path. Either
            // way the child's run error travels as the frame's source, with its kind, its
            // cleanup errors and what it suppressed.
            Err(WorkerError::Run(e)) => {
                let cause = e.run_failure().and_then(|r| r.task_failure()).map(Arc::clone);
                let f = match cause {
                    Some(t) => EndpointFailure::task_failed(e.to_string()).with_cause(t),
                    None => EndpointFailure::endpoint_failed(e.to_string()),
                };
                Err(f.with_source(FailureSource::new(WorkerError::Run(e))))
            }
            // The child's own error travels as the frame's source (`Frame::worker_error`). Its
            // text may hold a graph callback's own error, user code: formatted where that
            // cannot panic out.
            Err(e @ WorkerError::Build { .. }) => {
                let failure = EndpointFailure::task_failed(crate::sub::text_of(&e));
                Err(failure.with_source(FailureSource::new(e)))
            }
            Err(e) => {
                let failure = EndpointFailure::endpoint_failed(crate::sub::text_of(&e));
                Err(failure.with_source(FailureSource::new(e)))
            }
        }
    }

    /// Closes the child; a close that panics is reported as its residue (the endpoint thread
    /// would only log it), so the parent's close returns it.
    fn shutdown(&mut self) {
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| self.close_child())) {
            let cause = TeardownCause::Panicked { step: "close", message: panic_text(p.as_ref()) };
            self.residue.lock().push(Residue::failed(TeardownPart::Child(self.id), cause));
        }
    }
}

impl Drop for ChildEndpoint {
    /// Closes a child whose endpoint was never shut down (an engine that failed to start);
    /// after a shutdown there is nothing left to close. Never unwinds out of the drop.
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl ChildEndpoint {
    /// Closes the child once, recording what its close reported.
    fn close_child(&mut self) {
        if let Some(child) = self.child.take()
            && let Err(mut e) = child.close()
        {
            // The subtree's residue stays residue one level up; every other error of the
            // child's close is a failed teardown step of this level.
            let part = TeardownPart::Child(self.id);
            let leaked = std::mem::take(&mut e.leaked);
            let mut residue = self.residue.lock();
            residue.extend(leaked.into_iter().map(|l| Residue::Leaked(l.under(part.clone()))));
            if !e.is_empty() {
                residue.push(Residue::failed(part, TeardownCause::Child(Box::new(e))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use simpler_device_a2a3::{Platform, RuntimeVariant};
    use simpler_sched::{DispatchedMember, Endpoint};
    use simpler_types::{
        CallConfig, CallableId, CallableKind, EndpointOutcome, RunId, TaskArgs, TaskArgsView,
        TaskId, TypesError, WorkerId,
    };

    use super::ChildEndpoint;
    use crate::error::{RunErrorKind, WorkerError};
    use crate::handle::{Entry, GraphFn, Registration, Registry, SharedRegistry};
    use crate::reentry;
    use crate::worker::Worker;

    /// The graph callable every test endpoint runs.
    fn graph_id() -> CallableId {
        Registry::closure_id(u64::MAX, 1, CallableKind::Graph)
    }

    /// An endpoint over `child` whose parent registers `body` as [`graph_id`].
    fn endpoint_over(child: Worker, body: Arc<GraphFn>) -> ChildEndpoint {
        let registry = SharedRegistry::default();
        let entry = Entry::Graph(body);
        registry.write().runnable.insert(graph_id(), Registration { name: "g".into(), entry });
        ChildEndpoint {
            id: WorkerId(0),
            parent_lineage: reentry::lineage_of(u64::MAX),
            parent_registry: registry,
            child: Some(child),
            residue: Arc::default(),
        }
    }

    /// Member 0 of a one-member task of the graph, with `scalars` and no tensors.
    fn member<'a>(
        graph: &'a CallableId,
        config: &'a CallConfig,
        scalars: &'a [u64],
    ) -> DispatchedMember<'a> {
        DispatchedMember {
            task: TaskId::new(RunId::FIRST, 0),
            member: 0,
            group_size: 1,
            callable: graph,
            config,
            args: TaskArgsView { tensors: &[], tags: &[], scalars },
        }
    }

    /// Arguments the engine hands over that break a `TaskArgs` rule fail the path, with the
    /// rule broken as the failure's typed source.
    #[test]
    fn arguments_that_cannot_be_copied_fail_the_path_with_the_types_error_as_source() {
        let child =
            Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).start().expect("start");
        let mut endpoint = endpoint_over(child, Arc::new(|_, _, _| Ok(())));
        let cap = TaskArgs::MAX_SCALARS;
        let scalars = vec![0; cap + 1];
        let (graph, config) = (graph_id(), CallConfig::default());
        let failure =
            endpoint.run(member(&graph, &config, &scalars)).expect_err("too many scalars");
        assert_eq!(failure.outcome, EndpointOutcome::EndpointFailure);
        let source = failure.source.as_ref().and_then(|s| s.downcast_ref::<TypesError>());
        assert_eq!(
            source,
            Some(&TypesError::TooManyScalars { count: cap + 1, cap }),
            "{}",
            failure.message
        );
        endpoint.shutdown();
        assert!(endpoint.residue.lock().is_empty());
    }

    /// A child run whose tasks all succeeded but whose cleanup failed fails the path, not a
    /// task, and keeps the child's run error as the failure's typed source.
    #[test]
    fn a_child_run_that_fails_only_in_cleanup_fails_the_path_with_its_run_error_as_source() {
        let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(1);
        let step = b.register_host("step", |_| Ok(()));
        let child = b.start().expect("start");
        child.inject_cleanup_failure("release", false);
        let body = move |gb: &mut crate::GraphBuilder<'_>, _: TaskArgsView<'_>, _: &CallConfig| {
            gb.submit_sub(step, TaskArgs::new())?;
            Ok(())
        };
        let mut endpoint = endpoint_over(child, Arc::new(body));
        let (graph, config) = (graph_id(), CallConfig::default());
        let failure =
            endpoint.run(member(&graph, &config, &[])).expect_err("the child's cleanup fails");
        assert_eq!(failure.outcome, EndpointOutcome::EndpointFailure, "{}", failure.message);
        assert!(failure.cause.is_none(), "no task of the child failed");
        let source = failure.source.as_ref().and_then(|s| s.downcast_ref::<WorkerError>());
        assert!(
            matches!(
                source,
                Some(WorkerError::Run(e)) if matches!(e.kind(), RunErrorKind::CleanupFailed { .. })
            ),
            "{source:?}"
        );
        endpoint.shutdown();
    }
}
