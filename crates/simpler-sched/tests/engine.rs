//! Engine lifecycle, control jobs, stop-and-drain, validation and reporting.

mod common;

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use simpler_ring::{RingConfig, RingError};
use simpler_sched::{
    DispatchedMember, Endpoint, EndpointCaps, EndpointFailure, Engine, EngineConfig, SchedError,
};
use simpler_types::TensorArgType::*;
use simpler_types::{
    CallableId, CallableKind, CallableNamespace, CancelReason, DataType, FailureMechanism,
    FailureSource, RunFailure, RunState, TaskState, Tensor, WorkerId, WorkerRef, WorkerType,
};

const A: u64 = 0x10_0000;

/// Records which hook ran on which thread.
struct Probe {
    ty: WorkerType,
    id: u32,
    log: Arc<Mutex<Vec<(&'static str, String)>>>,
}

impl Probe {
    fn record(&self, hook: &'static str) {
        let thread = std::thread::current().name().unwrap_or("?").to_owned();
        self.log.lock().unwrap().push((hook, thread));
    }
}

impl Endpoint for Probe {
    fn caps(&self) -> EndpointCaps {
        EndpointCaps {
            worker_type: self.ty,
            id: WorkerId(self.id),
            remote: false,
            name: "probe".into(),
        }
    }

    fn on_thread_start(&mut self) {
        self.record("start");
    }

    fn run(&mut self, _: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
        self.record("run");
        Ok(())
    }

    fn shutdown(&mut self) {
        self.record("shutdown");
    }
}

#[test]
fn endpoint_hooks_run_once_each_on_the_endpoints_own_thread() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let e = Engine::start(EngineConfig {
        next_level: vec![Box::new(Probe { ty: WorkerType::NextLevel, id: 4, log: log.clone() })],
        sub: vec![Box::new(Probe { ty: WorkerType::Sub, id: 0, log: log.clone() })],
        ..EngineConfig::default()
    })
    .unwrap();
    let mut b = e.begin_run().unwrap();
    noop_on(&mut b, 4).unwrap();
    b.submit_sub(&host(1), args(&[])).unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    drop(e);
    let log = log.lock().unwrap().clone();
    for (thread, expected) in [("simpler-l3-nl4", 3), ("simpler-l3-sub0", 3)] {
        let hooks: Vec<_> = log.iter().filter(|(_, t)| t == thread).map(|(h, _)| *h).collect();
        assert_eq!(hooks, vec!["start", "run", "shutdown"], "{thread}");
        assert_eq!(hooks.len(), expected);
    }
}

#[test]
fn start_rejects_wrong_endpoint_types_low_levels_and_bad_ring_configs() {
    let h = Harness::new();
    let err = Engine::start(EngineConfig {
        next_level: vec![
            Fake::boxed(WorkerType::NextLevel, 0, &h, false),
            Fake::boxed(WorkerType::Sub, 1, &h, false),
        ],
        ..EngineConfig::default()
    })
    .unwrap_err();
    assert!(matches!(
        err,
        SchedError::EndpointTypeMismatch {
            index: 1,
            listed: WorkerType::NextLevel,
            reported: WorkerType::Sub
        }
    ));
    let err = Engine::start(EngineConfig { level: 2, ..EngineConfig::default() }).unwrap_err();
    assert!(matches!(err, SchedError::InvalidLevel { level: 2 }));
    let ring = RingConfig { heap_bytes_per_ring: 1000, ..RingConfig::default() };
    let err = Engine::start(EngineConfig { ring, ..EngineConfig::default() }).unwrap_err();
    assert!(matches!(err, SchedError::Ring(RingError::InvalidConfig { .. })));
}

#[test]
fn control_jobs_run_in_fifo_order_with_tasks_and_can_reach_the_concrete_endpoint() {
    let r = rig(&[0], 1);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let t = noop_on(&mut b, 0).unwrap();
    h.wait_running(t, 0);
    let job = e
        .on_endpoint(WorkerRef::next_level(0), |ep: &mut dyn Endpoint| {
            let any: &mut dyn Any = ep;
            any.downcast_mut::<Fake>().map(|f| f.caps().name)
        })
        .unwrap();
    assert_eq!(
        job.recv_timeout(Duration::from_millis(50)).unwrap(),
        None,
        "queued behind the task"
    );
    h.release(t, Action::Succeed);
    assert_eq!(job.recv().unwrap(), Some("fake-next-level-0".to_owned()));
    let sub =
        e.on_endpoint(WorkerRef::sub(0), |ep: &mut dyn Endpoint| ep.caps().worker_type).unwrap();
    assert_eq!(sub.recv().unwrap(), WorkerType::Sub);
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn a_panicking_control_job_is_reported_and_the_worker_keeps_serving() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let job = e.on_endpoint(WorkerRef::next_level(0), |_: &mut dyn Endpoint| -> u32 {
        panic!("job broke")
    });
    let err = job.unwrap().recv().unwrap_err();
    assert!(
        matches!(err, SchedError::JobPanicked { ref message, .. } if message == "job broke"),
        "{err}"
    );
    let ok = e.on_endpoint(WorkerRef::next_level(0), |_: &mut dyn Endpoint| 7).unwrap();
    assert_eq!(ok.recv().unwrap(), 7);
    let mut b = e.begin_run().unwrap();
    noop_on(&mut b, 0).unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
}

/// A value whose drop panics.
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("dropped");
    }
}

/// Asserts that worker 0 of `e` still answers jobs and runs tasks.
fn still_serving(e: &Engine) {
    let ok = e.on_endpoint(WorkerRef::next_level(0), |_: &mut dyn Endpoint| 7).unwrap();
    assert_eq!(ok.recv_timeout(Duration::from_secs(10)).unwrap(), Some(7), "job not answered");
    let mut b = e.begin_run().unwrap();
    noop_on(&mut b, 0).unwrap();
    let run = b.close();
    let outcome = e.wait_timeout(run, Duration::from_secs(10)).unwrap();
    assert!(outcome.is_some_and(|o| o.is_completed()), "the run did not complete");
}

#[test]
fn a_job_whose_unclaimed_result_panics_on_drop_leaves_the_worker_serving() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    // The first job keeps the endpoint busy until the second job's receiver is gone.
    let (go, wait_for_go) = std::sync::mpsc::channel::<()>();
    let first = e
        .on_endpoint(WorkerRef::next_level(0), move |_: &mut dyn Endpoint| {
            let _ = wait_for_go.recv();
        })
        .unwrap();
    let dropped = e.on_endpoint(WorkerRef::next_level(0), |_: &mut dyn Endpoint| PanicOnDrop);
    drop(dropped.unwrap());
    go.send(()).unwrap();
    first.recv().unwrap();
    still_serving(&e);
}

#[test]
fn a_job_whose_panic_payload_panics_on_drop_is_reported_and_the_worker_keeps_serving() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let job = e.on_endpoint(WorkerRef::next_level(0), |_: &mut dyn Endpoint| {
        std::panic::panic_any(PanicOnDrop)
    });
    let err = job.unwrap().recv().unwrap_err();
    assert!(matches!(err, SchedError::JobPanicked { .. }), "{err}");
    still_serving(&e);
}

/// An error whose drop panics, attached by [`FailsWithPanickyError`] to every failure.
#[derive(Debug)]
struct PanicsOnDropError(PanicOnDrop);

impl std::fmt::Display for PanicsOnDropError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an error whose drop panics")
    }
}

impl std::error::Error for PanicsOnDropError {}

impl std::fmt::Debug for PanicOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PanicOnDrop")
    }
}

/// A NEXT_LEVEL endpoint failing every task with a [`PanicsOnDropError`] as its source.
struct FailsWithPanickyError;

impl Endpoint for FailsWithPanickyError {
    fn caps(&self) -> EndpointCaps {
        EndpointCaps {
            worker_type: WorkerType::NextLevel,
            id: WorkerId(0),
            remote: false,
            name: "panicky".into(),
        }
    }

    fn run(&mut self, _: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
        let source = FailureSource::new(PanicsOnDropError(PanicOnDrop));
        Err(EndpointFailure::task_failed("failed").with_source(source))
    }
}

#[test]
fn a_failure_source_whose_drop_panics_neither_poisons_the_engine_nor_jams_the_builder() {
    let e = Engine::start(EngineConfig {
        next_level: vec![Box::new(FailsWithPanickyError)],
        ..EngineConfig::default()
    })
    .unwrap();
    // Two failed tasks: the run keeps the first failure, and the second task's failure (with
    // its source) is dropped when its slot is reclaimed, once in a scheduler pass (a scope
    // that ended) and once at close (the outer frame).
    for scoped in [true, false] {
        let mut b = e.begin_run().unwrap();
        for _ in 0..2 {
            if scoped {
                b.scope(|b| noop_on(b, 0).unwrap()).unwrap();
            } else {
                noop_on(&mut b, 0).unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        let run = b.close();
        let outcome = e.wait_timeout(run, Duration::from_secs(10)).unwrap();
        assert!(
            outcome.as_ref().is_some_and(|o| !o.is_completed()),
            "scoped {scoped}: {outcome:?}"
        );
        assert!(!e.is_poisoned(), "scoped {scoped}");
        e.release(run).unwrap();
    }
    let b = e.begin_run().unwrap();
    let run = b.close();
    assert!(e.wait_timeout(run, Duration::from_secs(10)).unwrap().is_some());
}

#[test]
fn control_jobs_for_unknown_or_stopped_workers_are_refused() {
    let h = Harness::new();
    let e = engine(&[0], 1, &h, false);
    let err = e.on_endpoint(WorkerRef::next_level(3), |_: &mut dyn Endpoint| ()).unwrap_err();
    assert!(matches!(err, SchedError::UnknownEndpoint { .. }));
    let err = e.on_endpoint(WorkerRef::sub(1), |_: &mut dyn Endpoint| ()).unwrap_err();
    assert!(matches!(err, SchedError::UnknownEndpoint { .. }));
    e.shutdown(Instant::now()).unwrap();
    let err = e.on_endpoint(WorkerRef::next_level(0), |_: &mut dyn Endpoint| ()).unwrap_err();
    assert!(matches!(err, SchedError::ShuttingDown));
}

#[test]
fn dropping_an_idle_engine_stops_and_joins_every_thread_and_shutdown_is_idempotent() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let e = Engine::start(EngineConfig {
        next_level: (0..3)
            .map(|id| {
                Box::new(Probe { ty: WorkerType::NextLevel, id, log: log.clone() })
                    as Box<dyn Endpoint>
            })
            .collect(),
        ..EngineConfig::default()
    })
    .unwrap();
    assert!(e.shutdown(Instant::now()).is_ok());
    assert!(e.shutdown(Instant::now()).is_ok(), "a second shutdown is a no-op");
    assert!(matches!(e.begin_run(), Err(SchedError::ShuttingDown)));
    drop(e);
    let shutdowns = log.lock().unwrap().iter().filter(|(h, _)| *h == "shutdown").count();
    assert_eq!(shutdowns, 3);
    // A plain drop of a fresh engine as well (zero deadline, nothing to wait for).
    let h = Harness::new();
    drop(engine(&[0, 1], 2, &h, true));
}

#[test]
fn shutdown_racing_a_live_builder_aborts_its_run_and_leaves_the_builder_harmless() {
    let r = rig(&[0], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let running =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    h.wait_running(running, 0);
    let ready = noop_on(&mut b, 0).unwrap();
    let pending =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(0), None).unwrap();
    let run = b.id();
    std::thread::scope(|s| {
        let stopper = s.spawn(|| e.shutdown(Instant::now() + Duration::from_millis(30)));
        // The builder still holds the scope references, so the cancelled tasks stay visible.
        for t in [ready, pending] {
            wait_state(e, t, TaskState::Failed);
            let f = snap(e, t).failure.unwrap();
            assert_eq!(f.mechanism, FailureMechanism::Cancelled { reason: CancelReason::Shutdown });
        }
        h.release(running, Action::Succeed);
        let errors = stopper.join().unwrap().unwrap_err();
        assert!(
            matches!(errors.errors.as_slice(), [SchedError::AbortedAtShutdown { run: r }] if *r == run)
        );
    });
    assert!(matches!(noop_on(&mut b, 0), Err(SchedError::ShuttingDown)));
    assert!(matches!(b.alloc(&[4], DataType::UInt8), Err(SchedError::ShuttingDown)));
    assert!(matches!(b.scope_begin(), Err(SchedError::ShuttingDown)));
    let run = b.close();
    let o = wait(e, run);
    assert!(matches!(failure_of(&o), RunFailure::Aborted { reason: CancelReason::Shutdown, .. }));
    assert!(h.log().iter().all(|d| d.task == running), "nothing else was dispatched");
    let summary = e.release(run).unwrap();
    assert_eq!(summary.cancelled, 2);
}

#[test]
fn status_follows_the_run_through_its_phases() {
    let r = rig(&[0], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let t = noop_on(&mut b, 0).unwrap();
    b.alloc(&[8], DataType::UInt8).unwrap();
    let s = b.status();
    assert_eq!(
        (s.phase, s.submission_closed, s.tasks_submitted, s.tasks_active),
        (RunState::Building, false, 2, 2)
    );
    let run = b.close();
    let s = e.status(run).unwrap();
    assert_eq!((s.phase, s.submission_closed, s.tasks_active), (RunState::Executing, true, 1));
    assert!(matches!(
        e.release(run),
        Err(SchedError::NotTerminal { phase: RunState::Executing, .. })
    ));
    h.release(t, Action::Succeed);
    assert!(wait(e, run).is_completed());
    let s = e.status(run).unwrap();
    assert_eq!((s.phase, s.tasks_active, s.failure.is_none()), (RunState::Completed, 0, true));
    e.release(run).unwrap();
    assert!(matches!(e.status(run), Err(SchedError::UnknownRun { .. })));
    assert!(e.task_snapshot(t).is_none(), "released runs are unknown");
}

#[test]
fn release_returns_a_summary_with_counts_and_ring_peaks() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    for _ in 0..3 {
        b.alloc(&[2048], DataType::UInt8).unwrap();
    }
    b.scope_begin().unwrap();
    b.alloc(&[100], DataType::UInt8).unwrap();
    b.scope_end().unwrap();
    h.script(next_task(&b), Action::Fail("one failure".into()));
    noop_on(&mut b, 0).unwrap();
    let run = b.close();
    wait(&e, run);
    let summary = e.release(run).unwrap();
    assert_eq!((summary.tasks, summary.failed, summary.cancelled), (5, 1, 0));
    assert_eq!(summary.peaks.rings[0].peak_live_bytes, 3 * 2048);
    assert_eq!(summary.peaks.rings[1].peak_live_bytes, 1024);
    assert!(summary.peaks.window_peak >= 4);
    assert!(!summary.outcome.is_completed());
    assert!(matches!(e.release(run), Err(SchedError::UnknownRun { .. })));
}

#[test]
fn validation_refuses_malformed_submits_with_the_offending_values() {
    let r = rig(&[0, 1], 1);
    let e = &r.e;
    let mut b = e.begin_run().unwrap();
    assert!(matches!(
        b.submit_next_level_group(&chip(1), vec![], &cfg(), &[], None),
        Err(SchedError::EmptyArgsList)
    ));
    assert!(matches!(b.submit_sub_group(&host(1), vec![]), Err(SchedError::EmptyArgsList)));
    let two = || vec![args(&[]), args(&[])];
    assert!(matches!(
        b.submit_next_level_group(&chip(1), two(), &cfg(), &[w(0), w(1)], Some(&[vec![w(0)]])),
        Err(SchedError::EligibleCountMismatch { sets: 1, members: 2 })
    ));
    assert!(matches!(
        b.submit_next_level_group(
            &chip(1),
            two(),
            &cfg(),
            &[w(0), w(1)],
            Some(&[vec![w(0)], vec![]])
        ),
        Err(SchedError::EmptyEligibleSet { member: 1 })
    ));
    assert!(matches!(
        b.submit_next_level(&chip(1), args(&[]), &cfg(), w(0), Some(&[])),
        Err(SchedError::EmptyEligibleSet { member: 0 })
    ));
    let graph = CallableId::new([3; 32], CallableKind::Graph, CallableNamespace::LocalHost);
    assert!(matches!(
        b.submit_next_level(&graph, args(&[]), &cfg(), w(0), None),
        Err(SchedError::CallableKindMismatch {
            kind: CallableKind::Graph,
            worker_type: WorkerType::NextLevel
        })
    ));
    assert!(matches!(
        b.submit_sub(&chip(1), args(&[])),
        Err(SchedError::CallableKindMismatch {
            kind: CallableKind::Chip,
            worker_type: WorkerType::Sub
        })
    ));
    let mut bad = buf(A, 64);
    bad.dtype = 200;
    assert!(matches!(
        b.submit_next_level(
            &chip(1),
            args(&[(buf(A, 64), Input), (bad, Input)]),
            &cfg(),
            w(0),
            None
        ),
        Err(SchedError::InvalidTensor { member: 0, arg: 1, .. })
    ));
    let child = buf(A, 64).child_memory(true);
    assert!(matches!(
        b.submit_sub(&host(1), args(&[(buf(A, 8), Input), (child, Input)])),
        Err(SchedError::ChildMemoryOnSubTask { member: 0, arg: 1 })
    ));
    let whole = Tensor::external(A, &[4, 16], DataType::UInt8).unwrap();
    let row0 = whole.view(&[1, 16], &[0, 0]).unwrap();
    let row1 = whole.view(&[1, 16], &[1, 0]).unwrap();
    assert!(matches!(
        b.submit_next_level(&chip(1), args(&[(row0, Output), (whole, InOut)]), &cfg(), w(0), None),
        Err(SchedError::OverlappingWrites { member: 0, first: 0, second: 1 })
    ));
    assert_eq!(b.status().tasks_submitted, 0, "nothing was claimed so far");
    b.submit_next_level(&chip(1), args(&[(row0, Output), (row1, Output)]), &cfg(), w(0), None)
        .expect("disjoint slices of one buffer may be written by one member");
    b.submit_next_level_group(
        &chip(1),
        vec![args(&[(whole, Output)]), args(&[(whole, Output)])],
        &cfg(),
        &[w(0), w(1)],
        None,
    )
    .expect("members of a group may share an output");
    r.h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn graph_callables_run_on_next_level_workers_at_l4() {
    let h = Harness::new();
    let e = Engine::start(EngineConfig {
        level: 4,
        next_level: vec![Fake::boxed(WorkerType::NextLevel, 0, &h, false)],
        ..EngineConfig::default()
    })
    .unwrap();
    let graph = CallableId::new([3; 32], CallableKind::Graph, CallableNamespace::LocalHost);
    let mut b = e.begin_run().unwrap();
    assert!(matches!(
        noop_on(&mut b, 0),
        Err(SchedError::CallableKindMismatch { kind: CallableKind::Chip, .. })
    ));
    b.submit_next_level(&graph, args(&[]), &cfg(), w(0), None).unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
}

#[test]
fn a_failed_run_refuses_further_work_fast() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    h.script(next_task(&b), Action::Fail("first".into()));
    noop_on(&mut b, 0).unwrap();
    eventually("the failure to be recorded", || b.status().failure.is_some());
    let window = e.stats().ring.window.live;
    assert!(matches!(noop_on(&mut b, 0), Err(SchedError::RunFailed(_))));
    assert!(matches!(b.alloc(&[4], DataType::UInt8), Err(SchedError::RunFailed(_))));
    assert!(
        matches!(b.scope_begin(), Err(SchedError::RunFailed(f)) if matches!(&*f, RunFailure::Task(t) if t.message == "first"))
    );
    assert_eq!(e.stats().ring.window.live, window, "nothing was allocated");
    let run = b.close();
    assert!(!wait(&e, run).is_completed());
}

#[test]
fn scopes_nest_up_to_64_frames_including_the_runs_own() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    for _ in 0..63 {
        b.scope_begin().unwrap();
    }
    assert!(matches!(b.scope_begin(), Err(SchedError::ScopeDepthExceeded { max: 64 })));
    let t = b.alloc(&[16], DataType::UInt8).unwrap();
    assert_eq!(e.stats().ring.heaps[3].live_allocs, 1, "deep scopes use ring 3");
    let r = b.scope(|b| b.submit_next_level(&chip(1), args(&[(t, Input)]), &cfg(), w(0), None));
    assert!(matches!(r, Err(SchedError::ScopeDepthExceeded { .. })));
    for _ in 0..63 {
        b.scope_end().unwrap();
    }
    let inner = b.scope(|b| noop_on(b, 0)).unwrap();
    assert!(inner.is_ok());
    let run = b.close();
    assert!(wait(&e, run).is_completed());
}

#[test]
fn alloc_checks_shapes_and_returns_a_null_tensor_for_a_zero_extent() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    assert!(matches!(b.alloc(&[], DataType::UInt8), Err(SchedError::InvalidShape { dims: 0 })));
    assert!(matches!(b.alloc(&[1; 6], DataType::UInt8), Err(SchedError::InvalidShape { dims: 6 })));
    assert!(matches!(
        b.alloc(&[u32::MAX, u32::MAX, u32::MAX], DataType::Int64),
        Err(SchedError::SizeOverflow { element_size: 8, .. })
    ));
    let null = b.alloc(&[4, 0], DataType::Float32).unwrap();
    assert!(null.is_null());
    assert_eq!(b.status().tasks_submitted, 0, "a zero extent creates no slot");
    let t = b.alloc(&[3, 5], DataType::Float16).unwrap();
    assert_eq!((t.size, t.shape(), t.start_offset), (30, &[3u32, 5][..], 0));
    let run = b.close();
    assert!(wait(&e, run).is_completed());
}

#[test]
fn alloc_with_heaps_disabled_reports_capacity() {
    let h = Harness::new();
    let ring = RingConfig { heap_bytes_per_ring: 0, ..RingConfig::default() };
    let e = engine_with_rings(ring, &[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    let err = b.alloc(&[4], DataType::UInt8).unwrap_err();
    assert!(matches!(
        err,
        SchedError::Capacity {
            source: RingError::HeapDisabled { requested: 4 },
            oldest_live: None
        }
    ));
    noop_on(&mut b, 0).expect("slot-only tasks still work");
    let run = b.close();
    assert!(wait(&e, run).is_completed());
}

#[test]
fn a_capped_task_window_applies_back_pressure_and_then_reports_capacity() {
    let h = Harness::new();
    let ring = RingConfig {
        max_live_slots: Some(2),
        alloc_timeout: Duration::from_millis(50),
        ..common::small_rings()
    };
    let e = engine_with_rings(ring, &[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    b.scope_begin().unwrap();
    noop_on(&mut b, 0).unwrap();
    noop_on(&mut b, 0).unwrap();
    let err = noop_on(&mut b, 0).unwrap_err();
    assert!(matches!(
        err,
        SchedError::Capacity { source: RingError::TaskWindowExhausted { limit: 2, .. }, .. }
    ));
    b.scope_end().unwrap();
    eventually("the window to drain", || e.stats().ring.window.live == 0);
    noop_on(&mut b, 0).expect("room again");
    let run = b.close();
    assert!(wait(&e, run).is_completed());
}

#[test]
fn admission_waits_for_the_previous_run_and_reports_which_one_at_the_deadline() {
    let r = rig(&[0], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let t = noop_on(&mut b, 0).unwrap();
    let first = b.close();
    let err = e.begin_run_until(Instant::now() + Duration::from_millis(30)).unwrap_err();
    assert!(matches!(err, SchedError::AdmissionTimeout { waiting_for } if waiting_for == first));
    std::thread::scope(|s| {
        let admitted = s.spawn(|| e.begin_run().map(|b| b.close()));
        std::thread::sleep(Duration::from_millis(20));
        h.release(t, Action::Succeed);
        let second = admitted.join().unwrap().unwrap();
        assert!(second > first);
    });
    assert!(e.is_done(first).unwrap());
}

#[test]
fn abort_of_a_building_run_is_refused() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let b = e.begin_run().unwrap();
    assert!(matches!(
        e.abort_run(b.id(), CancelReason::RunAborted),
        Err(SchedError::NotClosed { .. })
    ));
    b.close();
}

#[test]
fn close_with_open_user_scopes_warns_naming_the_run() {
    let capture = Capture::default();
    let subscriber =
        tracing_subscriber::fmt().with_writer(capture.clone()).with_ansi(false).finish();
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let run = tracing::subscriber::with_default(subscriber, || {
        let mut b = e.begin_run().unwrap();
        b.scope_begin().unwrap();
        b.scope_begin().unwrap();
        b.close()
    });
    assert!(wait(&e, run).is_completed());
    let text = capture.text();
    assert!(text.contains("WARN") && text.contains("2 user scope(s) still open"), "{text}");
    assert!(text.contains(&run.to_string()), "{text}");
}

/// A tracing layer that panics on every warning.
struct PanicsOnWarn;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PanicsOnWarn {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            panic!("this layer refuses warnings");
        }
    }
}

#[test]
fn a_tracing_layer_panicking_on_the_close_warning_leaves_the_run_closed() {
    use tracing_subscriber::layer::SubscriberExt;
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let subscriber = tracing_subscriber::registry().with(PanicsOnWarn);
    let closed = tracing::subscriber::with_default(subscriber, || {
        let mut b = e.begin_run().unwrap();
        let id = b.id();
        b.scope_begin().unwrap();
        (id, std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.close())).is_err())
    });
    let (run, panicked) = closed;
    assert!(panicked, "the layer panics on the warning");
    assert!(wait(&e, run).is_completed(), "the run was closed before the warning");
    let next = e.begin_run().expect("the engine admits the next run");
    assert!(wait(&e, next.close()).is_completed());
}

#[test]
fn begin_run_right_after_a_failed_or_dropped_runs_fence_never_sees_another_run_building() {
    // The fence of a failed (or dropped) builder's run fires only after the building mark is
    // cleared, so a thread that has just seen the run terminal may begin the next run at once.
    // The builder thread fails runs in a loop while this thread races `begin_run` against each
    // fence; a fence fired before the mark is cleared is caught within a few hundred rounds.
    let e = Engine::start(EngineConfig::default()).unwrap();
    let (run_tx, run_rx) = std::sync::mpsc::channel();
    let (next_tx, next_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let e = &e;
        s.spawn(move || {
            for round in 0..2000 {
                let mut b = e.begin_run().unwrap();
                b.alloc(&[64], DataType::UInt8).unwrap();
                run_tx.send(b.id()).unwrap();
                if round % 2 == 0 {
                    b.fail("deliberate");
                } else {
                    drop(b);
                }
                if next_rx.recv_timeout(PATIENCE).is_err() {
                    break;
                }
            }
        });
        let next_tx = next_tx;
        for run in run_rx {
            // Spin rather than sleep: the window being checked is a few instructions wide.
            let deadline = Instant::now() + PATIENCE;
            while !e.is_done(run).unwrap() {
                assert!(Instant::now() < deadline, "{run} never reached its fence");
                std::hint::spin_loop();
            }
            match e.begin_run() {
                Ok(b) => {
                    let next = b.close();
                    assert!(wait(e, next).is_completed());
                    e.release(next).unwrap();
                }
                Err(err) => panic!("begin_run right after {run}'s fence: {err}"),
            }
            e.release(run).unwrap();
            next_tx.send(()).unwrap();
        }
    });
}

#[test]
fn wait_timeout_with_a_timeout_beyond_the_clocks_range_waits_without_limit() {
    let r = rig(&[0], 0);
    let (h, e) = (&r.h, &r.e);
    let empty = e.begin_run().unwrap().close();
    assert!(e.wait_timeout(empty, Duration::MAX).unwrap().unwrap().is_completed());
    let mut b = e.begin_run().unwrap();
    let t = noop_on(&mut b, 0).unwrap();
    let run = b.close();
    h.wait_running(t, 0);
    std::thread::scope(|s| {
        s.spawn(|| h.release(t, Action::Succeed));
        assert!(e.wait_timeout(run, Duration::MAX).unwrap().unwrap().is_completed());
    });
}

#[test]
fn abort_run_reports_true_only_for_a_run_it_actually_fails() {
    // Each run's only task finishes on an immediate endpoint while `abort_run` races its fence.
    // Whatever the interleaving, `Ok(true)` must mean the run ends aborted and `Ok(false)` that
    // it completed on its own.
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    for _ in 0..3000 {
        let mut b = e.begin_run().unwrap();
        noop_on(&mut b, 0).unwrap();
        let run = b.close();
        let aborted = e.abort_run(run, CancelReason::RunAborted).unwrap();
        let outcome = wait(&e, run);
        if aborted {
            assert!(
                matches!(
                    failure_of(&outcome),
                    RunFailure::Aborted { reason: CancelReason::RunAborted, .. }
                ),
                "{run}: abort_run returned true, yet the run ended {outcome:?}"
            );
        } else {
            assert!(outcome.is_completed(), "{run}: abort_run returned false for {outcome:?}");
        }
        e.release(run).unwrap();
    }
}
