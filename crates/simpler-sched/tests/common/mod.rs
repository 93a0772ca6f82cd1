//! Fake in-process endpoints and fixtures shared by the engine's tests.
//!
//! Every fake endpoint reports into one [`Harness`]: each dispatch is logged, and a gated
//! endpoint holds the member until the test releases it with an [`Action`] (succeed, fail,
//! fail the endpoint path, or panic).

#![allow(dead_code, reason = "each test binary uses a different part of the fixture")]

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use simpler_ring::RingConfig;
use simpler_sched::{
    DispatchedMember, Endpoint, EndpointCaps, EndpointFailure, Engine, EngineConfig, RunBuilder,
    RunOutcome, SchedError,
};
use simpler_types::{
    CallConfig, CallableId, CallableKind, CallableNamespace, DataType, RunId, TaskArgs, TaskId,
    Tensor, TensorArgType, WorkerId, WorkerRef, WorkerType,
};

/// Upper bound for anything a test waits for; only catches hangs.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// What a gated member does when released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Return `Ok`.
    Succeed,
    /// Return a task failure with this message.
    Fail(String),
    /// Return an endpoint failure with this message.
    EndpointFail(String),
    /// Panic with this message (escapes `run`).
    Panic(String),
}

/// One dispatch as an endpoint saw it.
#[derive(Clone, Debug)]
pub struct Dispatch {
    pub worker: WorkerRef,
    pub task: TaskId,
    pub member: u32,
    pub group_size: u32,
    pub callable: CallableId,
    pub addrs: Vec<u64>,
    pub tensors: usize,
    pub scalars: Vec<u64>,
}

/// Start or end of one member on an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The endpoint's `run` was entered.
    Start(TaskId, u32),
    /// The endpoint's `run` is about to return.
    End(TaskId, u32),
}

#[derive(Default)]
struct HarnessState {
    log: Vec<Dispatch>,
    events: Vec<Event>,
    running: Vec<(WorkerRef, TaskId, u32)>,
    released: HashMap<(TaskId, u32), Action>,
    open: bool,
    scripted: HashMap<TaskId, Action>,
}

/// Shared controller of the fake endpoints.
#[derive(Default)]
pub struct Harness {
    state: Mutex<HarnessState>,
    cv: Condvar,
}

impl Harness {
    pub fn new() -> Arc<Harness> {
        Arc::new(Harness::default())
    }

    fn lock(&self) -> MutexGuard<'_, HarnessState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait_for<R>(&self, what: &str, mut f: impl FnMut(&mut HarnessState) -> Option<R>) -> R {
        let deadline = Instant::now() + PATIENCE;
        let mut s = self.lock();
        loop {
            if let Some(r) = f(&mut s) {
                return r;
            }
            let now = Instant::now();
            assert!(now < deadline, "timed out waiting for {what}");
            s = self.cv.wait_timeout(s, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Every dispatch so far.
    pub fn log(&self) -> Vec<Dispatch> {
        self.lock().log.clone()
    }

    /// Every start and end so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.lock().events.clone()
    }

    /// Position of `event` in the event log.
    pub fn position(&self, event: Event) -> Option<usize> {
        self.lock().events.iter().position(|e| *e == event)
    }

    /// Number of dispatches so far.
    pub fn dispatched(&self) -> usize {
        self.lock().log.len()
    }

    /// Waits until at least `n` dispatches happened.
    pub fn wait_dispatched(&self, n: usize) -> Vec<Dispatch> {
        self.wait_for(&format!("{n} dispatches"), |s| (s.log.len() >= n).then(|| s.log.clone()))
    }

    /// Waits until member `member` of `task` is running on a gated endpoint.
    pub fn wait_running(&self, task: TaskId, member: u32) -> WorkerRef {
        self.wait_for(&format!("{task} member {member} running"), |s| {
            s.running.iter().find(|r| r.1 == task && r.2 == member).map(|r| r.0)
        })
    }

    /// Waits until member `member` of `task` has entered its endpoint (it may have finished).
    pub fn wait_started(&self, task: TaskId, member: u32) {
        self.wait_for(&format!("{task} member {member} to start"), |s| {
            s.events.contains(&Event::Start(task, member)).then_some(())
        });
    }

    /// Whether member `member` of `task` is currently inside a gated endpoint.
    pub fn is_running(&self, task: TaskId, member: u32) -> bool {
        self.lock().running.iter().any(|r| r.1 == task && r.2 == member)
    }

    /// Releases member `member` of `task` with `action` (before or after it arrives).
    pub fn release_member(&self, task: TaskId, member: u32, action: Action) {
        self.lock().released.insert((task, member), action);
        self.cv.notify_all();
    }

    /// Releases member 0 of `task` with `action`.
    pub fn release(&self, task: TaskId, action: Action) {
        self.release_member(task, 0, action);
    }

    /// Lets every gated member through from now on (scripted actions still apply).
    pub fn open(&self) {
        self.lock().open = true;
        self.cv.notify_all();
    }

    /// Makes every member of `task` perform `action` (used with immediate endpoints).
    pub fn script(&self, task: TaskId, action: Action) {
        self.lock().scripted.insert(task, action);
    }

    /// Waits until no member is inside a gated endpoint.
    pub fn wait_idle(&self) {
        self.wait_for("gated endpoints to be idle", |s| s.running.is_empty().then_some(()));
    }
}

/// A fake endpoint reporting into a [`Harness`].
pub struct Fake {
    caps: EndpointCaps,
    harness: Arc<Harness>,
    gated: bool,
    /// Calls of `on_thread_start` and `shutdown`, for lifecycle tests.
    pub lifecycle: Arc<Mutex<Vec<&'static str>>>,
}

impl Fake {
    pub fn new(ty: WorkerType, id: u32, harness: &Arc<Harness>, gated: bool) -> Fake {
        Fake {
            caps: EndpointCaps {
                worker_type: ty,
                id: WorkerId(id),
                remote: false,
                name: format!("fake-{ty}-{id}"),
            },
            harness: Arc::clone(harness),
            gated,
            lifecycle: Arc::default(),
        }
    }

    pub fn boxed(
        ty: WorkerType,
        id: u32,
        harness: &Arc<Harness>,
        gated: bool,
    ) -> Box<dyn Endpoint> {
        Box::new(Fake::new(ty, id, harness, gated))
    }

    fn me(&self) -> WorkerRef {
        WorkerRef { ty: self.caps.worker_type, id: self.caps.id }
    }
}

impl Endpoint for Fake {
    fn caps(&self) -> EndpointCaps {
        self.caps.clone()
    }

    fn on_thread_start(&mut self) {
        self.lifecycle.lock().unwrap().push("start");
    }

    fn run(&mut self, m: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
        let h = &self.harness;
        let me = self.me();
        let mut s = h.lock();
        s.log.push(Dispatch {
            worker: me,
            task: m.task,
            member: m.member,
            group_size: m.group_size,
            callable: *m.callable,
            addrs: m.args.tensors.iter().map(|t| t.addr).collect(),
            tensors: m.args.tensors.len(),
            scalars: m.args.scalars.to_vec(),
        });
        s.events.push(Event::Start(m.task, m.member));
        let mut action = s.scripted.get(&m.task).cloned();
        if self.gated {
            s.running.push((me, m.task, m.member));
            h.cv.notify_all();
            let deadline = Instant::now() + PATIENCE * 3;
            loop {
                if let Some(a) = s.released.remove(&(m.task, m.member)) {
                    action = Some(a);
                    break;
                }
                if s.open {
                    break;
                }
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                s = h.cv.wait_timeout(s, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
            }
            s.running.retain(|r| !(r.1 == m.task && r.2 == m.member));
        }
        s.events.push(Event::End(m.task, m.member));
        h.cv.notify_all();
        drop(s);
        match action.unwrap_or(Action::Succeed) {
            Action::Succeed => Ok(()),
            Action::Fail(msg) => Err(EndpointFailure::task_failed(msg)),
            Action::EndpointFail(msg) => Err(EndpointFailure::endpoint_failed(msg)),
            Action::Panic(msg) => panic!("{msg}"),
        }
    }

    fn shutdown(&mut self) {
        self.lifecycle.lock().unwrap().push("shutdown");
    }
}

/// Rings of 1 MiB each with a short allocation deadline.
pub fn small_rings() -> RingConfig {
    RingConfig {
        heap_bytes_per_ring: 1 << 20,
        alloc_timeout: Duration::from_secs(2),
        ..RingConfig::default()
    }
}

/// An L3 engine with gated or immediate fake endpoints: NEXT_LEVEL ids `nl`, `subs` SUB workers.
pub fn engine(nl: &[u32], subs: u32, harness: &Arc<Harness>, gated: bool) -> Engine {
    Engine::start(EngineConfig {
        ring: small_rings(),
        next_level: nl
            .iter()
            .map(|&id| Fake::boxed(WorkerType::NextLevel, id, harness, gated))
            .collect(),
        sub: (0..subs).map(|i| Fake::boxed(WorkerType::Sub, i, harness, gated)).collect(),
        ..EngineConfig::default()
    })
    .expect("engine starts")
}

/// A chip callable (runs on NEXT_LEVEL at L3).
pub fn chip(n: u8) -> CallableId {
    let mut d = [0u8; 32];
    d[0] = n;
    CallableId::new(d, CallableKind::Chip, CallableNamespace::LocalChip)
}

/// A host callable (runs on SUB).
pub fn host(n: u8) -> CallableId {
    let mut d = [0u8; 32];
    d[0] = n;
    CallableId::new(d, CallableKind::Host, CallableNamespace::LocalHost)
}

/// A 1-D u8 tensor over `len` bytes at `addr` (the fakes never dereference it).
pub fn buf(addr: u64, len: u32) -> Tensor {
    Tensor::external(addr, &[len], DataType::UInt8).expect("valid tensor")
}

/// Arguments with the given tagged tensors.
pub fn args(tensors: &[(Tensor, TensorArgType)]) -> TaskArgs {
    let mut a = TaskArgs::new();
    for &(t, tag) in tensors {
        a.add_tensor(t, tag).expect("tensor fits");
    }
    a
}

/// Default call configuration.
pub fn cfg() -> CallConfig {
    CallConfig::default()
}

/// Waits for `run` with a hang-catching bound.
pub fn wait(engine: &Engine, run: RunId) -> RunOutcome {
    engine
        .wait_timeout(run, PATIENCE)
        .expect("known run")
        .unwrap_or_else(|| panic!("{run} did not finish within {PATIENCE:?}"))
}

/// Polls `cond` until it holds (hang-catching bound).
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Submits a no-op NEXT_LEVEL task (callable `chip(1)`, no arguments) to worker `target`.
pub fn noop_on(b: &mut RunBuilder<'_>, target: u32) -> Result<TaskId, SchedError> {
    b.submit_next_level(&chip(1), args(&[]), &cfg(), w(target), None)
}

/// Submits a two-member no-op NEXT_LEVEL group, member i to worker `targets[i]`.
pub fn noop_group_on(b: &mut RunBuilder<'_>, targets: [u32; 2]) -> Result<TaskId, SchedError> {
    b.submit_next_level_group(
        &chip(1),
        vec![args(&[]), args(&[])],
        &cfg(),
        &[w(targets[0]), w(targets[1])],
        None,
    )
}

/// `WorkerId` shorthand.
pub fn w(id: u32) -> WorkerId {
    WorkerId(id)
}

/// The snapshot of `task` (which must belong to a registered run).
pub fn snap(e: &Engine, task: TaskId) -> simpler_sched::TaskSnapshot {
    e.task_snapshot(task).unwrap_or_else(|| panic!("no snapshot for {task}"))
}

/// Waits until `task` is in `state`.
pub fn wait_state(e: &Engine, task: TaskId, state: simpler_types::TaskState) {
    eventually(&format!("{task} to be {state}"), || {
        e.task_snapshot(task).is_some_and(|s| s.state == state)
    });
}

/// An L3 engine with custom rings.
pub fn engine_with_rings(
    ring: RingConfig,
    nl: &[u32],
    subs: u32,
    harness: &Arc<Harness>,
    gated: bool,
) -> Engine {
    Engine::start(EngineConfig {
        ring,
        next_level: nl
            .iter()
            .map(|&id| Fake::boxed(WorkerType::NextLevel, id, harness, gated))
            .collect(),
        sub: (0..subs).map(|i| Fake::boxed(WorkerType::Sub, i, harness, gated)).collect(),
        ..EngineConfig::default()
    })
    .expect("engine starts")
}

/// The failure of a failed outcome.
pub fn failure_of(outcome: &RunOutcome) -> &simpler_types::RunFailure {
    outcome.failure().map(|f| &**f).unwrap_or_else(|| panic!("run did not fail: {outcome:?}"))
}

/// A harness and its engine; dropping it opens every gate first, so a failing test never
/// leaves a member blocked while the engine shuts down.
pub struct Rig {
    pub h: Arc<Harness>,
    pub e: Engine,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.h.open();
    }
}

/// A gated L3 rig with NEXT_LEVEL ids `nl` and `subs` SUB workers.
pub fn rig(nl: &[u32], subs: u32) -> Rig {
    let h = Harness::new();
    let e = engine(nl, subs, &h, true);
    Rig { h, e }
}

/// The id the next submit or alloc of `b` will get (to script an action before it can run).
pub fn next_task(b: &simpler_sched::RunBuilder<'_>) -> TaskId {
    TaskId::new(b.id(), b.status().tasks_submitted)
}

/// A `tracing` writer that keeps everything written, for asserting on log output.
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<u8>>>);

impl Capture {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}
