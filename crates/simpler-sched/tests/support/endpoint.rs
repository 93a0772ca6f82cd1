//! The plan-driven fake endpoint and the log it writes.
//!
//! Every member carries its instructions in its scalars (`[plan index, action code, delay µs]`),
//! so endpoints need no shared script. Each call takes a global stamp when it starts and another
//! just before it returns; since the scheduler can only learn of the completion after `run`
//! returns, "consumer start stamp > producer end stamp" is exactly "the consumer started after
//! its producer finished".

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use simpler_sched::{DispatchedMember, Endpoint, EndpointCaps, EndpointFailure};
use simpler_types::{TaskId, WorkerId, WorkerRef, WorkerType};

use super::env::PATIENCE;
use super::plan::{Action, failure_message};

/// One member execution as the endpoint saw it.
#[derive(Clone, Debug)]
pub struct Record {
    /// The endpoint that ran it.
    pub worker: WorkerRef,
    /// The task.
    pub task: TaskId,
    /// Member index.
    pub member: u32,
    /// Members of the task.
    pub group_size: u32,
    /// Plan index echoed from the scalars.
    pub plan_index: u64,
    /// Action echoed from the scalars.
    pub action: Option<Action>,
    /// Number of tensors received.
    pub tensors: usize,
    /// Stamp taken on entry.
    pub start: u64,
    /// Stamp taken just before returning.
    pub end: u64,
}

/// Shared log of every endpoint of one engine.
#[derive(Debug, Default)]
pub struct Recorder {
    log: Mutex<Vec<Record>>,
    /// Global logical clock for start and end stamps (SeqCst: the stamps must be totally
    /// ordered consistently with the happens-before edges the engine creates).
    clock: AtomicU64,
    /// Endpoints constructed and not yet dropped.
    live: AtomicUsize,
    /// `on_thread_start` calls.
    started: AtomicUsize,
    /// `shutdown` calls.
    stopped: AtomicUsize,
    /// While set, endpoints hold every member on entry.
    held: Mutex<bool>,
    gate: Condvar,
}

impl Recorder {
    /// A fresh recorder.
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder::default())
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Record>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every record so far.
    pub fn records(&self) -> Vec<Record> {
        self.lock().clone()
    }

    /// Records of one run.
    pub fn records_of(&self, run: simpler_types::RunId) -> Vec<Record> {
        self.lock().iter().filter(|r| r.task.run == run).cloned().collect()
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// From now on, endpoints hold every member they receive until [`release`](Self::release).
    pub fn hold(&self) {
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = true;
    }

    /// Lets held and future members through.
    pub fn release(&self) {
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.gate.notify_all();
    }

    /// Waits while the gate is held (bounded by [`PATIENCE`] so a broken test cannot hang).
    fn pass_gate(&self) {
        let deadline = Instant::now() + PATIENCE;
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        while *held && Instant::now() < deadline {
            held = self.gate.wait_timeout(held, PATIENCE).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Endpoints alive right now.
    pub fn live_endpoints(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// `(on_thread_start, shutdown)` call counts.
    pub fn lifecycle(&self) -> (usize, usize) {
        (self.started.load(Ordering::SeqCst), self.stopped.load(Ordering::SeqCst))
    }
}

/// A fake endpoint that does what each member's scalars say.
pub struct PlanEndpoint {
    caps: EndpointCaps,
    recorder: Arc<Recorder>,
}

impl PlanEndpoint {
    /// A boxed endpoint of type `ty` with id `id` logging into `recorder`.
    pub fn boxed(ty: WorkerType, id: u32, recorder: &Arc<Recorder>) -> Box<dyn Endpoint> {
        recorder.live.fetch_add(1, Ordering::SeqCst);
        Box::new(PlanEndpoint {
            caps: EndpointCaps {
                worker_type: ty,
                id: WorkerId(id),
                remote: false,
                name: format!("plan-{ty}-{id}"),
            },
            recorder: Arc::clone(recorder),
        })
    }
}

impl Drop for PlanEndpoint {
    fn drop(&mut self) {
        self.recorder.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Endpoint for PlanEndpoint {
    fn caps(&self) -> EndpointCaps {
        self.caps.clone()
    }

    fn on_thread_start(&mut self) {
        self.recorder.started.fetch_add(1, Ordering::SeqCst);
    }

    fn run(&mut self, m: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
        self.recorder.pass_gate();
        let start = self.recorder.clock.fetch_add(1, Ordering::SeqCst);
        let plan_index = m.args.scalar(0).unwrap_or(u64::MAX);
        let action = m.args.scalar(1).and_then(Action::from_code);
        match m.args.scalar(2).unwrap_or(0) {
            0 => {}
            1 => std::thread::yield_now(),
            us => std::thread::sleep(Duration::from_micros(us)),
        }
        let end = self.recorder.clock.fetch_add(1, Ordering::SeqCst);
        self.recorder.lock().push(Record {
            worker: WorkerRef { ty: self.caps.worker_type, id: self.caps.id },
            task: m.task,
            member: m.member,
            group_size: m.group_size,
            plan_index,
            action,
            tensors: m.args.tensors.len(),
            start,
            end,
        });
        let message = failure_message(plan_index, m.member);
        match action {
            Some(Action::Succeed) => Ok(()),
            Some(Action::Fail) => Err(EndpointFailure::task_failed(message)),
            Some(Action::EndpointFail) => Err(EndpointFailure::endpoint_failed(message)),
            Some(Action::Panic) => std::panic::panic_any(message),
            Some(Action::PanickedResult) => Err(EndpointFailure::panicked(message)),
            None => Err(EndpointFailure::endpoint_failed("member without an action scalar")),
        }
    }

    fn shutdown(&mut self) {
        self.recorder.stopped.fetch_add(1, Ordering::SeqCst);
    }
}
