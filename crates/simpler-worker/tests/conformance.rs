//! Conformance behaviours of the original's worker tests that apply to in-process workers, each test
//! named after the behaviour it checks. Barriers and counters only; no wall-clock assertions.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use common::{HANG, add_callable, host, one_sub_task, register_hold};
use simpler_device_a2a3::programs::{f32_from_le_bytes, f32_to_le_bytes};
use simpler_device_a2a3::{DeviceError, Platform, RuntimeVariant};
use simpler_types::{CallConfig, DataType, TaskArgs, Tensor, WorkerId};
use simpler_worker::{
    BuildFailure, ConfigError, Lifecycle, Orchestration, RunErrorKind, RunHandle, StartCause,
    TeardownCause, TeardownError, TeardownPart, Worker, WorkerError,
};

fn noop_sub(n: usize) -> (Worker, simpler_worker::CallableHandle, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    let mut b = host().sub_workers(n);
    let h = b.register_host("count", move |_| {
        c.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    (b.start().expect("start"), h, count)
}

fn subs(h: simpler_worker::CallableHandle, n: usize) -> Orchestration {
    Orchestration::graph(move |g, _, _| {
        for _ in 0..n {
            g.submit_sub(h, TaskArgs::new())?;
        }
        Ok(())
    })
}

// ---- Lifecycle and start ------------------------------------------------------------------

#[test]
fn chipless_l3_workers_start_and_close_with_or_without_sub_workers() {
    for n in [0, 2] {
        let w = host().sub_workers(n).start().expect("start");
        assert_eq!(w.lifecycle(), Lifecycle::Ready);
        assert_eq!(w.sub_workers(), n);
        w.close().expect("close");
        assert_eq!(w.lifecycle(), Lifecycle::Closed);
    }
}

#[test]
fn two_workers_in_one_process_run_independently() {
    let (a, ha, ca) = noop_sub(1);
    let (b, hb, cb) = noop_sub(1);
    a.run(subs(ha, 3)).expect("a");
    b.run(subs(hb, 2)).expect("b");
    assert_eq!((ca.load(Ordering::SeqCst), cb.load(Ordering::SeqCst)), (3, 2));
    assert!(matches!(a.run(subs(hb, 1)), Err(WorkerError::Build { .. })));
}

#[test]
fn zero_startup_timeout_fails_before_anything_starts() {
    let e = host().chips(&[0]).startup_timeout(Duration::ZERO).start().expect_err("zero timeout");
    assert!(matches!(e.cause, StartCause::Config(ConfigError::ZeroStartupTimeout)), "{e}");
    assert!(e.path.starts_with("L3"), "{}", e.path);
}

#[test]
fn a_chip_still_starting_at_the_deadline_fails_the_start_with_deadline_exceeded() {
    // A one-nanosecond budget expires while the chips attach; the attach threads are
    // detached, listed in the rollback, and finalize their chips when they finish. On a busy
    // machine the chips can attach before the starting thread looks at the deadline (the
    // engine is pending then): that start is not the case under test, so it is tried again.
    let start = || {
        host()
            .chips(&[0, 1])
            .startup_timeout(Duration::from_nanos(1))
            .start()
            .expect_err("deadline")
    };
    let chip_pending = |e: &simpler_worker::StartError| match &e.cause {
        StartCause::DeadlineExceeded { pending, .. } => {
            !pending.is_empty() && pending.iter().all(|p| p.contains("chip"))
        }
        _ => true,
    };
    let e = (0..20).map(|_| start()).find(chip_pending).expect("a chip pending in 20 starts");
    match &e.cause {
        StartCause::DeadlineExceeded { pending, budget } => {
            assert!(!pending.is_empty(), "{e}");
            assert!(pending.iter().all(|p| p.contains("chip")), "{e}");
            assert_eq!(*budget, Duration::from_nanos(1));
        }
        other => panic!("unexpected {other}"),
    }
    // Every chip still pending at the deadline is in the rollback: its detached attach thread,
    // or in PROCESS mode its child process (killed, or finalized if it started after all).
    assert_eq!(e.rollback.len(), pending_count(&e), "{e:?}");
    assert!(!e.rollback.is_empty(), "{e}");
    let process = common::process_mode();
    let abandoned = |r: &TeardownError| match (&r.what, &r.cause) {
        (TeardownPart::Chip(chip), TeardownCause::AttachDetached { device }) if !process => {
            chip.0 == *device
        }
        (
            TeardownPart::Chip(chip),
            TeardownCause::StartKilled { device } | TeardownCause::StartedLate { device },
        ) if process => chip.0 == *device,
        _ => false,
    };
    assert!(e.rollback.iter().all(abandoned), "{e:?}");
}

fn pending_count(e: &simpler_worker::StartError) -> usize {
    match &e.cause {
        StartCause::DeadlineExceeded { pending, .. } => pending.len(),
        _ => 0,
    }
}

#[test]
fn failing_chip_fails_the_start_naming_the_chip_and_device() {
    let e = Worker::host(Platform::A2a3, RuntimeVariant::HostBuildGraph)
        .chips(&[7])
        .start()
        .expect_err("onboard backend is not built");
    assert!(matches!(e.cause, StartCause::Device { chip: WorkerId(0), .. }), "{e}");
    assert!(e.path.contains("chip 0 (device 7)"), "{}", e.path);
    // The device's error stays typed behind the start error.
    let device = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<DeviceError>());
    assert!(device.is_some(), "{e}");
}

#[test]
fn failing_child_fails_the_start_naming_it_and_started_siblings_close() {
    let mut l4 = Worker::composite(4);
    l4.child(host().sub_workers(1)).expect("child 0");
    l4.child(Worker::host(Platform::A2a3, RuntimeVariant::HostBuildGraph).chips(&[5]))
        .expect("child 1");
    let e = l4.start().expect_err("child 1 fails");
    let StartCause::ChildFailed { child } = &e.cause else { panic!("child 1 failed: {e}") };
    assert!(matches!(**child, StartCause::Device { chip: WorkerId(0), .. }), "{e}");
    assert!(e.path.contains("L4 / child 1 (L3) / chip 0 (device 5)"), "{}", e.path);
    // Through the child's cause to the device's error, typed all the way.
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source.filter(|s| !s.is::<DeviceError>()) {
        source = s.source();
    }
    assert!(source.is_some(), "no device error in the chain of {e}");
}

#[test]
fn callable_without_eligible_pool_fails_start_with_no_eligible_target() {
    let mut b = host();
    b.register_host("lonely", |_| Ok(()));
    let e = b.start().expect_err("no sub workers");
    assert!(matches!(e.cause, StartCause::NoEligibleTarget { needs: "sub workers", .. }), "{e}");
    let mut b = host().sub_workers(1);
    b.register_chip(add_callable(0));
    let e = b.start().expect_err("no chips");
    assert!(matches!(e.cause, StartCause::NoEligibleTarget { needs: "chips", .. }), "{e}");
    let mut l4 = Worker::composite(4);
    l4.register_graph("g", |_, _, _| Ok(()));
    let e = l4.start().expect_err("no children");
    assert!(matches!(e.cause, StartCause::NoEligibleTarget { needs: "child workers", .. }), "{e}");
}

#[test]
fn adopting_a_child_of_the_wrong_level_is_a_config_error() {
    let mut l5 = Worker::composite(5);
    assert!(l5.child(host()).is_err());
    assert!(l5.child(Worker::composite(4)).is_ok());
}

// ---- Registration ----------------------------------------------------------------------------

#[test]
fn register_host_at_l2_is_wrong_level_and_without_sub_workers_is_no_eligible_target() {
    let l2 =
        Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph).start().expect("l2");
    assert!(matches!(
        l2.register_host("x", |_| Ok(())),
        Err(WorkerError::WrongLevel { level: 2, .. })
    ));
    let l3 = host().start().expect("l3");
    assert!(matches!(
        l3.register_host("x", |_| Ok(())),
        Err(WorkerError::NoEligibleTarget { needs: "sub workers", .. })
    ));
    assert!(matches!(
        l3.register_chip(&add_callable(0)),
        Err(WorkerError::NoEligibleTarget { needs: "chips", .. })
    ));
}

#[test]
fn closure_registered_after_start_serves_the_next_submit_without_disturbing_a_running_task() {
    let mut b = host().sub_workers(2);
    let (hold, gate) = register_hold(&mut b);
    let w = b.start().expect("start");
    let running = w.submit(subs(hold, 1)).expect("submit");
    let late_count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&late_count);
    let late = w
        .register_host("late", move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .expect("register");
    assert!(!running.is_done());
    gate.wait();
    running.wait().expect("running");
    w.run(subs(late, 2)).expect("late");
    assert_eq!(late_count.load(Ordering::SeqCst), 2);
}

#[test]
fn registering_from_inside_a_graph_callback_does_not_deadlock() {
    let (w, h, count) = noop_sub(1);
    let w = Arc::new(w);
    let w2 = Arc::clone(&w);
    let late: Arc<Mutex<Option<simpler_worker::CallableHandle>>> = Arc::new(Mutex::new(None));
    let l2 = Arc::clone(&late);
    let c = Arc::clone(&count);
    w.run(Orchestration::graph(move |g, _, _| {
        let c = Arc::clone(&c);
        let nh = w2.register_host("from_callback", move |_| {
            c.fetch_add(10, Ordering::SeqCst);
            Ok(())
        })?;
        g.submit_sub(nh, TaskArgs::new())?;
        g.submit_sub(h, TaskArgs::new())?;
        *l2.lock().unwrap() = Some(nh);
        Ok(())
    }))
    .expect("run");
    assert_eq!(count.load(Ordering::SeqCst), 11);
    assert!(late.lock().unwrap().is_some());
}

#[test]
fn identical_chip_content_shares_one_slot_until_the_last_handle_is_unregistered() {
    let w = host().chips(&[0]).start().expect("start");
    let c = add_callable(1);
    let h1 = w.register_chip(&c).expect("first");
    let h2 = w.register_chip(&c).expect("second");
    assert_ne!(h1, h2);
    assert_eq!(w.chip_callable_refs(WorkerId(0), c.id()).expect("refs"), 2);
    w.unregister(h1).expect("unregister one");
    assert_eq!(w.chip_callable_refs(WorkerId(0), c.id()).expect("refs"), 1);
    w.unregister(h2).expect("unregister last");
    assert_eq!(w.chip_callable_refs(WorkerId(0), c.id()).expect("refs"), 0);
    assert!(matches!(w.unregister(h2), Err(WorkerError::UnknownCallable { .. })));
}

#[test]
fn the_65th_distinct_chip_callable_is_a_capacity_error_and_uses_no_slot() {
    let w = host().chips(&[0]).start().expect("start");
    let mut handles = Vec::new();
    for i in 0..64 {
        handles.push(w.register_chip(&add_callable(100 + i)).expect("fits"));
    }
    let extra = add_callable(999);
    let e = w.register_chip(&extra).expect_err("65th");
    // The same typed error whether the chip lives in this process or in its own.
    match &e {
        WorkerError::Registration { chip: WorkerId(0), source, .. } => assert!(
            matches!(source.device_error(), Some(DeviceError::TooManyCallables { capacity: 64 })),
            "{source:?}"
        ),
        other => panic!("{other}"),
    }
    assert_eq!(w.chip_callable_refs(WorkerId(0), extra.id()).expect("refs"), 0);
    // The lowest freed slot is reused once the chip confirmed the removal.
    w.unregister(handles[3]).expect("free one");
    w.register_chip(&extra).expect("reuses the freed slot");
}

#[test]
fn content_whose_removal_is_pending_cannot_be_registered_until_the_pinning_run_ends() {
    let mut b = host().chips(&[0]).sub_workers(1);
    let (hold, gate) = register_hold(&mut b);
    let w = b.start().expect("start");
    let c = add_callable(5);
    let h = w.register_chip(&c).expect("register");
    let live = w.submit(subs(hold, 1)).expect("submit");
    w.unregister(h).expect("unregister while a run is live");
    let e = w.register_chip(&c).expect_err("removal pending");
    assert!(matches!(e, WorkerError::RemovalPending { chip: WorkerId(0), .. }), "{e}");
    assert_eq!(w.chip_callable_refs(WorkerId(0), c.id()).expect("refs"), 1, "counts unchanged");
    gate.wait();
    live.wait().expect("run");
    assert_eq!(
        w.chip_callable_refs(WorkerId(0), c.id()).expect("refs"),
        0,
        "removed after the run"
    );
    w.register_chip(&c).expect("registrable again");
}

/// An L3 worker whose chip callable `add_callable(variant)` was unregistered while a run pinned
/// it, and that run, finished: nobody has waited for it yet.
fn finished_unwaited_pinning_run(
    variant: u32,
) -> (Worker, RunHandle, simpler_device_a2a3::ChipCallable) {
    let mut b = host().chips(&[0]).sub_workers(1);
    let (hold, gate) = register_hold(&mut b);
    let w = b.start().expect("start");
    let c = add_callable(variant);
    let h = w.register_chip(&c).expect("register");
    let live = w.submit(subs(hold, 1)).expect("submit");
    w.unregister(h).expect("unregister while a run is live");
    gate.wait();
    let give_up = std::time::Instant::now() + HANG;
    while !live.is_done() {
        assert!(std::time::Instant::now() < give_up, "the run never finished");
        std::thread::sleep(Duration::from_millis(1));
    }
    (w, live, c)
}

#[test]
fn content_whose_pinning_run_finished_unwaited_is_registrable_again() {
    // Nobody waits for the run: its finish alone, seen by the registration, ends the removal.
    let (w, live, c) = finished_unwaited_pinning_run(8);
    w.register_chip(&c).expect("registrable again");
    assert_eq!(w.chip_callable_refs(WorkerId(0), c.id()).expect("refs"), 1, "one reference");
    live.wait().expect("run");
}

#[test]
fn a_pinning_run_cleaned_up_on_a_chip_lane_still_releases_the_chip_callable() {
    // The cleanup runs in a closure on chip 0's lane, from which the chip's release cannot be
    // queued: it stays pending, and happens off the lane.
    let (w, live, c) = finished_unwaited_pinning_run(9);
    let cleaned = w.with_sim_faults(WorkerId(0), move |_| {
        let _ = live.result();
    });
    if !common::process_mode() {
        assert!(cleaned.expect("lane"));
    }
    w.register_chip(&c).expect("registrable again");
    assert_eq!(w.chip_callable_refs(WorkerId(0), c.id()).expect("refs"), 1, "one reference");
}

#[test]
fn post_start_chip_registration_is_all_or_nothing() {
    let w = host().chips(&[0, 1]).start().expect("start");
    for i in 0..64 {
        w.register_chip_on(&add_callable(200 + i), &[WorkerId(1)]).expect("fill chip 1");
    }
    let shared = add_callable(7);
    let existing = w.register_chip_on(&shared, &[WorkerId(0)]).expect("existing on chip 0");
    let e = w.register_chip(&shared).expect_err("chip 1 is full");
    match e {
        WorkerError::Registration { chip, rollback_failed, .. } => {
            assert_eq!(chip, WorkerId(1));
            assert!(rollback_failed.is_empty());
        }
        other => panic!("unexpected {other}"),
    }
    // Chip 0 was rolled back to the existing handle's single reference, which survives.
    assert_eq!(w.chip_callable_refs(WorkerId(0), shared.id()).expect("refs"), 1);
    assert_eq!(w.chip_callable_refs(WorkerId(1), shared.id()).expect("refs"), 0);
    w.unregister(existing).expect("existing handle still valid");
}

#[test]
fn a_chip_named_twice_in_one_registration_is_refused_and_takes_no_reference() {
    // A chip registered twice over took two references and gave one back at unregistration.
    let l2 =
        Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph).start().expect("l2");
    let l3 = host().chips(&[0, 1]).start().expect("l3");
    for (w, chips) in
        [(&l2, &[WorkerId(0), WorkerId(0)][..]), (&l3, &[WorkerId(1), WorkerId(0), WorkerId(1)])]
    {
        let c = add_callable(9);
        let e = w.register_chip_on(&c, chips).expect_err("a chip named twice");
        assert!(matches!(&e, WorkerError::DuplicateChip { chip, .. } if *chip == chips[0]), "{e}");
        for chip in [WorkerId(0)].iter().chain(chips) {
            assert_eq!(w.chip_callable_refs(*chip, c.id()).expect("refs"), 0, "{chip}");
        }
    }
}

#[test]
fn unknown_foreign_and_wrong_kind_handles_are_rejected_at_submit() {
    let (w, h, _) = noop_sub(1);
    let (other, oh, _) = noop_sub(1);
    let build_cause = |r: Result<simpler_worker::RunHandle, WorkerError>| match r {
        Err(WorkerError::Build { cause: BuildFailure::Callback(e), .. }) => e.to_string(),
        other => panic!("expected a build error, got {other:?}"),
    };
    let t = build_cause(w.submit(subs(oh, 1)));
    assert!(t.contains("another worker"), "{t}");
    w.unregister(h).expect("unregister");
    let t = build_cause(w.submit(subs(h, 1)));
    assert!(t.contains("not registered"), "{t}");
    let chip_w = host().chips(&[0]).sub_workers(1).start().expect("start");
    let ch = chip_w.register_chip(&add_callable(3)).expect("chip");
    let t = build_cause(chip_w.submit(one_sub_task(ch)));
    assert!(t.contains("cannot run on a sub worker"), "{t}");
    drop(other);
}

#[test]
fn close_drops_every_registered_closure_and_its_captures() {
    let token = Arc::new(());
    let weak = Arc::downgrade(&token);
    let mut b = host().sub_workers(1);
    b.register_host("holds", move |_| {
        let _ = &token;
        Ok(())
    });
    let w = b.start().expect("start");
    assert!(weak.upgrade().is_some());
    w.close().expect("close");
    assert!(weak.upgrade().is_none());
}

// ---- Submit, RunHandle, cleanup ----------------------------------------------------------

#[test]
fn submit_returns_after_the_callback_before_completion() {
    let mut b = host().sub_workers(1);
    let (hold, gate) = register_hold(&mut b);
    let w = b.start().expect("start");
    let handle = w.submit(subs(hold, 1)).expect("submit");
    assert!(!handle.is_done());
    assert!(handle.wait_timeout(Duration::from_millis(5)).is_none());
    assert!(!handle.is_done());
    gate.wait();
    assert!(handle.wait().is_ok());
    assert!(handle.wait().is_ok());
    assert!(matches!(handle.result(), Some(Ok(()))));
    assert!(handle.is_done());
}

#[test]
fn callback_error_or_panic_comes_back_from_submit_and_the_next_submit_succeeds() {
    let (w, h, count) = noop_sub(1);
    let e =
        w.submit(Orchestration::graph(|_, _, _| Err("no graph today".into()))).expect_err("err");
    assert!(
        matches!(&e, WorkerError::Build { cause: BuildFailure::Callback(c), .. } if c.to_string() == "no graph today"),
        "{e}"
    );
    let e = w
        .submit(Orchestration::graph(move |g, _, _| {
            g.submit_sub(h, TaskArgs::new())?;
            panic!("boom in graph")
        }))
        .expect_err("panic");
    assert!(
        matches!(&e, WorkerError::Build { cause: BuildFailure::Panicked(p), .. } if p == "boom in graph"),
        "{e}"
    );
    w.run(subs(h, 1)).expect("next run");
    assert!(count.load(Ordering::SeqCst) >= 1);
}

#[test]
fn task_failure_is_reported_by_the_handle_and_two_successful_runs_follow() {
    let mut b = host().sub_workers(1);
    let bad = b.register_host("bad", |_| Err("kaput".into()));
    let good = b.register_host("good", |_| Ok(()));
    let w = b.start().expect("start");
    let handle = w.submit(subs(bad, 1)).expect("submit succeeds");
    let e = handle.wait().expect_err("task fails");
    assert_eq!(e.kind(), &RunErrorKind::TaskFailed);
    assert!(e.to_string().contains("kaput"), "{e}");
    assert!(e.to_string().contains("'bad'"), "{e}");
    w.run(subs(good, 1)).expect("second");
    w.run(subs(good, 1)).expect("third");
}

#[test]
fn submit_in_a_callback_after_a_task_of_that_run_failed_returns_that_error() {
    let mut b = host().sub_workers(1);
    let bad = b.register_host("bad", |_| Err("first failure".into()));
    let good = b.register_host("good", |_| Ok(()));
    let w = b.start().expect("start");
    let e = w
        .submit(Orchestration::graph(move |g, _, _| {
            g.submit_sub(bad, TaskArgs::new())?;
            for _ in 0..200_000 {
                g.submit_sub(good, TaskArgs::new())?;
                std::thread::yield_now();
            }
            Ok(())
        }))
        .expect_err("fail-fast");
    match e {
        WorkerError::Build { cause: BuildFailure::Engine(s), .. } => {
            assert!(s.to_string().contains("first failure"), "{s}");
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn run_is_submit_then_wait_and_keep_alives_live_until_terminal() {
    let (w, h, _) = noop_sub(1);
    let held = Arc::new(5u32);
    let weak = Arc::downgrade(&held);
    let captured = Arc::new(());
    let weak_closure = Arc::downgrade(&captured);
    let mut b = host().sub_workers(1);
    let (hold, gate) = register_hold(&mut b);
    let w2 = b.start().expect("start");
    let handle = w2
        .submit(
            Orchestration::graph(move |g, _, _| {
                let _ = &captured;
                g.submit_sub(hold, TaskArgs::new())?;
                Ok(())
            })
            .keep_alive(held),
        )
        .expect("submit");
    assert!(weak.upgrade().is_some() && weak_closure.upgrade().is_some());
    gate.wait();
    handle.wait().expect("wait");
    assert!(weak.upgrade().is_none() && weak_closure.upgrade().is_none());
    w.run(subs(h, 1)).expect("run");
}

#[test]
fn user_scopes_four_deep_run_and_a_scope_left_open_is_closed() {
    let (w, h, count) = noop_sub(1);
    w.run(Orchestration::graph(move |g, _, _| {
        g.scope(|g| {
            g.scope(|g| g.scope(|g| g.scope(|g| g.submit_sub(h, TaskArgs::new()).map(|_| ()))))
        })?????;
        // The scope opened here is left open on purpose: the worker closes it.
        g.scope_begin()?;
        g.submit_sub(h, TaskArgs::new())?;
        Ok(())
    }))
    .expect("scopes");
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[test]
fn intermediate_allocations_over_eight_runs_are_reclaimed() {
    let (w, h, _) = {
        let count = Arc::new(AtomicUsize::new(0));
        let mut b =
            host().sub_workers(1).heap_ring_size(1 << 20).alloc_timeout(Duration::from_secs(5));
        let h = b.register_host("touch", |a| {
            assert_eq!(a.tensors.len(), 1);
            Ok(())
        });
        (b.start().expect("start"), h, count)
    };
    for _ in 0..8 {
        w.run(Orchestration::graph(move |g, _, _| {
            let t = g.alloc(&[128 * 1024], DataType::Float32)?; // 512 KiB of a 1 MiB ring
            let mut a = TaskArgs::new();
            a.add_output(t)?;
            g.submit_sub(h, a)?;
            Ok(())
        }))
        .expect("run");
    }
}

#[test]
fn submit_run_and_close_from_a_callback_or_closure_are_reentrant() {
    let slot: Arc<Mutex<Option<Arc<Worker>>>> = Arc::new(Mutex::new(None));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (s2, seen2) = (Arc::clone(&slot), Arc::clone(&seen));
    let mut b = host().sub_workers(1);
    let inner = b.register_host("reenter", move |_| {
        let w = s2.lock().unwrap().clone().expect("set");
        let r = w.submit(Orchestration::graph(|_, _, _| Ok(())));
        seen2.lock().unwrap().push(format!("{:?}", r.err()));
        let c = w.close();
        seen2.lock().unwrap().push(format!("{}", c.is_err_and(|e| e.reentrant)));
        Ok(())
    });
    let w = Arc::new(b.start().expect("start"));
    *slot.lock().unwrap() = Some(Arc::clone(&w));
    let w2 = Arc::clone(&w);
    w.run(Orchestration::graph(move |g, _, _| {
        assert!(matches!(
            w2.run(Orchestration::graph(|_, _, _| Ok(()))),
            Err(WorkerError::Reentrant { op: "run", .. })
        ));
        g.submit_sub(inner, TaskArgs::new())?;
        Ok(())
    }))
    .expect("outer run");
    let seen = seen.lock().unwrap().clone();
    assert!(seen[0].contains("Reentrant"), "{seen:?}");
    assert_eq!(seen[1], "true");
    slot.lock().unwrap().take();
    w.close().expect("close");
}

/// How a closure waits for its own run.
#[derive(Clone, Copy, Debug)]
enum OwnWait {
    Wait,
    /// `wait_timeout(Duration::MAX)`, which means no deadline.
    Forever,
    /// `wait_timeout` with a long finite timeout, which would stall the run for all of it.
    Long,
}

#[test]
fn waiting_for_its_own_run_from_a_closure_is_reentrant_not_a_hang() {
    for how in [OwnWait::Wait, OwnWait::Forever, OwnWait::Long] {
        let own: Arc<Mutex<Option<RunHandle>>> = Arc::new(Mutex::new(None));
        let seen: Arc<Mutex<Option<Result<(), RunErrorKind>>>> = Arc::new(Mutex::new(None));
        let (own2, seen2) = (Arc::clone(&own), Arc::clone(&seen));
        let mut b = host().sub_workers(1);
        let h = b.register_host("wait-own", move |_| {
            // The submitter stores the handle as soon as `submit` returns.
            let handle = loop {
                if let Some(h) = own2.lock().unwrap().clone() {
                    break h;
                }
                std::thread::yield_now();
            };
            let got = match how {
                OwnWait::Wait => Some(handle.wait()),
                OwnWait::Forever => handle.wait_timeout(Duration::MAX),
                OwnWait::Long => handle.wait_timeout(HANG * 2),
            };
            *seen2.lock().unwrap() = got.map(|r| r.map_err(|e| e.kind().clone()));
            Ok(())
        });
        let w = b.start().expect("start");
        let handle = w.submit(subs(h, 1)).expect("submit");
        *own.lock().unwrap() = Some(handle.clone());
        // The closure's wait is refused, so the closure returns and the run ends.
        let result = handle.wait_timeout(HANG);
        if !matches!(result, Some(Ok(()))) {
            // The closure is stuck in its wait: dropping the worker would wait for it too.
            std::mem::forget(w);
            panic!("{how:?}: the run never ended: {result:?}");
        }
        assert_eq!(*seen.lock().unwrap(), Some(Err(RunErrorKind::Reentrant)), "{how:?}");
        own.lock().unwrap().take();
        w.close().expect("close");
    }
}

/// A value whose drop waits (up to five seconds) for the run handle put in its slot and notes
/// whether that wait saw the run's result.
struct WaitsWhenDropped {
    run: Arc<Mutex<Option<RunHandle>>>,
    saw_result: Arc<Mutex<Option<bool>>>,
}

impl Drop for WaitsWhenDropped {
    fn drop(&mut self) {
        if let Some(h) = self.run.lock().unwrap().take() {
            let got = h.wait_timeout(Duration::from_secs(5));
            *self.saw_result.lock().unwrap() = Some(matches!(got, Some(Ok(()))));
        }
    }
}

#[test]
fn a_closure_unregistered_during_a_run_is_dropped_after_that_run_is_published() {
    // The closure's removal waits for the run in flight, and the cleanup of that run drops it.
    // A captured value whose drop waits for that run must find it published, not wait on the
    // cleanup that is dropping it (its own thread, still the run's elected waiter).
    let slot: Arc<Mutex<Option<RunHandle>>> = Arc::new(Mutex::new(None));
    let saw_result = Arc::new(Mutex::new(None));
    let mut b = host().sub_workers(1);
    let (hold, gate) = register_hold(&mut b);
    let w = b.start().expect("start");
    let captured = WaitsWhenDropped { run: Arc::clone(&slot), saw_result: Arc::clone(&saw_result) };
    let c = w
        .register_host("captures", move |_| {
            let _ = &captured;
            Ok(())
        })
        .expect("register");
    let run = w.submit(subs(hold, 1)).expect("submit");
    w.unregister(c).expect("unregister, deferred behind the run");
    *slot.lock().unwrap() = Some(run.clone());
    gate.wait();
    run.wait_timeout(HANG).expect("no hang").expect("run");
    assert_eq!(*saw_result.lock().unwrap(), Some(true), "the drop waited on its own cleanup");
    w.close().expect("close");
}

// ---- Close -----------------------------------------------------------------------------------

#[test]
fn close_waits_for_a_run_in_flight_then_submit_and_registration_are_closed() {
    let mut b = host().sub_workers(1);
    let (hold, gate) = register_hold(&mut b);
    let w = Arc::new(b.start().expect("start"));
    let handle = w.submit(subs(hold, 1)).expect("submit");
    let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (w2, r2) = (Arc::clone(&w), Arc::clone(&released));
    let closer = std::thread::spawn(move || (w2.close(), r2.load(Ordering::SeqCst)));
    // The closer has claimed the close (the worker reads `Closed`) while the task is still
    // held at the barrier, so the close must wait for the run in flight: it cannot return
    // before the task is released below.
    let deadline = std::time::Instant::now() + HANG;
    while w.lifecycle() != Lifecycle::Closed {
        assert!(std::time::Instant::now() < deadline, "the closer never claimed the close");
        std::thread::yield_now();
    }
    assert!(!handle.is_done(), "the held task cannot have finished");
    released.store(true, Ordering::SeqCst);
    gate.wait();
    let (closed, after_release) = closer.join().expect("closer");
    closed.expect("close");
    assert!(after_release, "close returned while the run was still in flight");
    assert!(matches!(handle.result(), Some(Ok(()))), "the run completed, not aborted");
    assert!(matches!(w.submit(subs(hold, 1)), Err(WorkerError::Closed)));
    assert!(matches!(w.register_host("x", |_| Ok(())), Err(WorkerError::Closed)));
}

#[test]
fn close_timeout_keeps_its_budget_while_another_close_is_in_flight() {
    let mut b = host().sub_workers(1);
    let (hold, gate) = register_hold(&mut b);
    let w = Arc::new(b.start().expect("start"));
    let handle = w.submit(subs(hold, 1)).expect("submit");
    let w2 = Arc::clone(&w);
    let closer = std::thread::spawn(move || w2.close());
    let deadline = std::time::Instant::now() + HANG;
    while w.lifecycle() != Lifecycle::Closed {
        assert!(std::time::Instant::now() < deadline, "the closer never claimed the close");
        std::thread::yield_now();
    }
    // The first close waits for the held run; a second closer with a budget must not.
    let (tx, rx) = std::sync::mpsc::channel();
    let w3 = Arc::clone(&w);
    let second = std::thread::spawn(move || {
        let _ = tx.send(w3.close_timeout(Duration::from_millis(50)));
    });
    let timed = rx.recv_timeout(HANG);
    gate.wait();
    second.join().expect("second closer");
    closer.join().expect("closer").expect("close");
    let err = timed.expect("close_timeout waited past its budget for the other close").unwrap_err();
    assert!(err.is_retryable() && err.drain_timeout.is_some(), "{err}");
    assert!(matches!(handle.result(), Some(Ok(()))));
    // The first close finished: a later close_timeout returns its result.
    w.close_timeout(Duration::from_millis(50)).expect("the finished close");
}

/// Submits, on another thread, a run whose orchestration callback parks until the returned
/// barrier is passed and then submits one task of `h`; returns once the callback is parked,
/// that is while the submit is an operation in flight.
fn submit_parked_in_its_callback(
    w: &Arc<Worker>,
    h: simpler_worker::CallableHandle,
) -> (JoinHandle<Result<RunHandle, WorkerError>>, Arc<Barrier>) {
    let in_cb = Arc::new(Barrier::new(2));
    let release = Arc::new(Barrier::new(2));
    let (a, r) = (Arc::clone(&in_cb), Arc::clone(&release));
    let w2 = Arc::clone(w);
    let submitter = std::thread::spawn(move || {
        w2.submit(Orchestration::graph(move |g, _, _| {
            a.wait();
            r.wait();
            g.submit_sub(h, TaskArgs::new())?;
            Ok(())
        }))
    });
    in_cb.wait();
    (submitter, release)
}

#[test]
fn submit_admitted_before_close_finishes_its_callback_and_is_drained() {
    let (w, h, count) = noop_sub(1);
    let w = Arc::new(w);
    let (submitter, release) = submit_parked_in_its_callback(&w, h);
    let w3 = Arc::clone(&w);
    let closer = std::thread::spawn(move || w3.close());
    release.wait();
    let handle = submitter.join().expect("submitter").expect("admitted submit");
    closer.join().expect("closer").expect("close");
    assert!(handle.is_done());
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[test]
fn close_timeout_with_an_operation_in_flight_is_a_retryable_drain_timeout() {
    let (w, h, _) = noop_sub(1);
    let w = Arc::new(w);
    let (submitter, release) = submit_parked_in_its_callback(&w, h);
    let e = w.close_timeout(Duration::from_millis(10)).expect_err("drain timeout");
    assert!(e.is_retryable());
    assert_eq!(e.drain_timeout.as_ref().map(|d| d.in_flight_ops), Some(1));
    assert_eq!(w.lifecycle(), Lifecycle::Closed);
    release.wait();
    submitter.join().expect("submitter").expect("submit");
    w.close().expect("a later close drains and completes");
}

#[test]
fn a_closure_whose_drop_calls_close_during_teardown_does_not_deadlock() {
    struct CloseOnDrop(Arc<Mutex<Option<Arc<Worker>>>>);
    impl Drop for CloseOnDrop {
        fn drop(&mut self) {
            if let Some(w) = self.0.lock().unwrap().take() {
                let _ = w.close();
            }
        }
    }
    let slot = Arc::new(Mutex::new(None));
    let guard = CloseOnDrop(Arc::clone(&slot));
    let mut b = host().sub_workers(1);
    b.register_host("guarded", move |_| {
        let _ = &guard;
        Ok(())
    });
    let w = Arc::new(b.start().expect("start"));
    *slot.lock().unwrap() = Some(Arc::clone(&w));
    w.close().expect("close");
}

#[test]
fn close_reports_the_errors_of_runs_nobody_waited_for_and_only_those() {
    let mut b = host().sub_workers(1);
    let bad = b.register_host("bad", |_| Err("unseen".into()));
    let w = b.start().expect("start");
    let waited = w.submit(subs(bad, 1)).expect("submit");
    let _ = waited.wait();
    let unwaited = w.submit(subs(bad, 1)).expect("submit");
    let id = unwaited.run_id();
    drop(unwaited);
    let e = w.close().expect_err("one unobserved failure");
    assert_eq!(e.unobserved_runs.len(), 1);
    assert_eq!(e.unobserved_runs[0].run_id(), id);
}

// ---- Sub workers, groups, composition --------------------------------------------------------

#[test]
fn sub_tasks_run_exactly_once_on_one_or_two_sub_workers() {
    let (w, h, count) = noop_sub(1);
    w.run(subs(h, 1)).expect("one");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    for _ in 0..3 {
        w.run(subs(h, 1)).expect("three");
    }
    assert_eq!(count.load(Ordering::SeqCst), 4);
    w.run(subs(h, 20)).expect("twenty");
    assert_eq!(count.load(Ordering::SeqCst), 24);
    let (w2, h2, c2) = noop_sub(2);
    w2.run(subs(h2, 20)).expect("twenty over two");
    assert_eq!(c2.load(Ordering::SeqCst), 20);
}

#[test]
fn the_closure_sees_tensor_count_shape_scalar_and_empty_args() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let mut b = host().sub_workers(1);
    let look = b.register_host("look", move |a| {
        s.lock().unwrap().push((
            a.tensors.len(),
            a.tensors.first().map(|t| t.shape().to_vec()),
            a.scalar(0),
        ));
        Ok(())
    });
    let w = b.start().expect("start");
    let buf = vec![0f32; 12];
    let t = Tensor::external(buf.as_ptr() as u64, &[3, 4], DataType::Float32).expect("tensor");
    w.run(Orchestration::graph(move |g, _, _| {
        let mut a = TaskArgs::new();
        a.add_input(t)?.add_scalar(42)?;
        g.submit_sub(look, a)?;
        Ok(())
    }))
    .expect("run");
    w.run(subs(look, 1)).expect("empty");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen[0], (1, Some(vec![3, 4]), Some(42)));
    assert_eq!(seen[1], (0, None, None));
    drop(buf);
}

#[test]
fn a_closure_error_or_panic_fails_its_task_naming_callable_sub_worker_and_cause() {
    let mut b = host().sub_workers(1);
    let err = b.register_host("errs", |_| Err("bad input".into()));
    let pan = b.register_host("panics", |_| panic!("boom"));
    let ok = b.register_host("ok", |_| Ok(()));
    let w = b.start().expect("start");
    let e = w.submit(subs(err, 1)).expect("submit").wait().expect_err("err");
    let t = e.to_string();
    assert!(t.contains("'errs'") && t.contains("on sub 0") && t.contains("bad input"), "{t}");
    let e = w.submit(subs(pan, 1)).expect("submit").wait().expect_err("panic");
    let t = e.to_string();
    assert!(t.contains("'panics'") && t.contains("panicked: boom"), "{t}");
    w.run(subs(ok, 1)).expect("the sub worker still serves");
}

#[test]
fn sub_groups_and_output_members_on_one_key_then_a_consumer_all_run() {
    let (w, h, count) = noop_sub(2);
    w.run(Orchestration::graph(move |g, _, _| {
        g.submit_sub_group(h, vec![TaskArgs::new(), TaskArgs::new()])?;
        g.submit_sub_group(h, vec![TaskArgs::new()])?;
        Ok(())
    }))
    .expect("groups");
    assert_eq!(count.load(Ordering::SeqCst), 3);
    let buf = vec![0u8; 64];
    let t = Tensor::external(buf.as_ptr() as u64, &[64], DataType::UInt8).expect("tensor");
    w.run(Orchestration::graph(move |g, _, _| {
        let mut a = TaskArgs::new();
        a.add_output(t.slice(0, 0, 32, 1)?)?;
        let mut b2 = TaskArgs::new();
        b2.add_output(t.slice(0, 32, 64, 1)?)?;
        g.submit_sub_group(h, vec![a, b2])?;
        let mut c = TaskArgs::new();
        c.add_input(t)?;
        g.submit_sub(h, c)?;
        Ok(())
    }))
    .expect("producers then consumer");
    assert_eq!(count.load(Ordering::SeqCst), 6);
    drop(buf);
}

#[test]
fn l4_with_two_l3_children_runs_a_task_on_each() {
    let count = Arc::new(AtomicUsize::new(0));
    let mut l4 = Worker::composite(4);
    let mut handles = Vec::new();
    for _ in 0..2 {
        let c = Arc::clone(&count);
        let mut l3 = host().sub_workers(1);
        handles.push(l3.register_host("leaf", move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }));
        l4.child(l3).expect("adopt");
    }
    let leaf = handles.clone();
    let g = l4.register_graph("l3_orch", move |g, args, _| {
        let which = args.scalar(0).unwrap_or(0) as usize;
        g.submit_sub(leaf[which], TaskArgs::new())?;
        Ok(())
    });
    let w = l4.start().expect("start");
    assert_eq!(w.child_ids(), vec![WorkerId(0), WorkerId(1)]);
    w.run(Orchestration::graph(move |b, _, _| {
        for child in 0..2u32 {
            let mut a = TaskArgs::new();
            a.add_scalar(u64::from(child))?;
            b.submit_next_level(g, a, &CallConfig::default(), WorkerId(child))?;
        }
        Ok(())
    }))
    .expect("run");
    assert_eq!(count.load(Ordering::SeqCst), 2);
    w.close().expect("close");
}

#[test]
fn a_sub_failure_under_l4_surfaces_with_one_frame_per_level_and_the_child_keeps_serving() {
    let mut l3 = host().sub_workers(2);
    let boom = l3.register_host("verify", |_| panic!("boom"));
    let fine = l3.register_host("fine", |_| Ok(()));
    let mut l4 = Worker::composite(4);
    l4.child(l3).expect("adopt");
    let orch = l4.register_graph("l3_orch", move |g, args, _| {
        let h = if args.scalar(0) == Some(1) { boom } else { fine };
        g.submit_sub(h, TaskArgs::new())?;
        Ok(())
    });
    let w = l4.start().expect("start");
    let task = move |which: u64| {
        Orchestration::graph(move |b, _, _| {
            let mut a = TaskArgs::new();
            a.add_scalar(which)?;
            b.submit_next_level(orch, a, &CallConfig::default(), WorkerId(0))?;
            Ok(())
        })
    };
    let e = w.submit(task(1)).expect("submit").wait().expect_err("fails");
    let levels: Vec<u8> = e.frames().iter().map(|f| f.level).collect();
    assert_eq!(levels, vec![4, 3], "{e}");
    let t = e.to_string();
    assert!(t.starts_with("L4 "), "{t}");
    assert!(t.contains("(graph 'l3_orch') on child 0: L3 "), "{t}");
    assert!(t.contains("(host 'verify') on sub") && t.ends_with("panicked: boom"), "{t}");
    w.run(task(0)).expect("the child runs its next task normally");
}

#[test]
fn submit_run_and_close_from_a_child_run_on_the_parent_are_reentrant() {
    let parent: Arc<Mutex<Option<Arc<Worker>>>> = Arc::new(Mutex::new(None));
    let seen = Arc::new(Mutex::new(String::new()));
    let mut l3 = host().sub_workers(1);
    let fine = l3.register_host("fine", |_| Ok(()));
    let mut l4 = Worker::composite(4);
    l4.child(l3).expect("adopt");
    let (p2, s2) = (Arc::clone(&parent), Arc::clone(&seen));
    let orch = l4.register_graph("calls_parent", move |g, _, _| {
        if let Some(p) = p2.lock().unwrap().clone() {
            *s2.lock().unwrap() =
                format!("{:?}", p.submit(Orchestration::graph(|_, _, _| Ok(()))).err());
        }
        g.submit_sub(fine, TaskArgs::new())?;
        Ok(())
    });
    let w = Arc::new(l4.start().expect("start"));
    *parent.lock().unwrap() = Some(Arc::clone(&w));
    w.run(Orchestration::graph(move |b, _, _| {
        b.submit_next_level(orch, TaskArgs::new(), &CallConfig::default(), WorkerId(0))?;
        Ok(())
    }))
    .expect("run");
    assert!(seen.lock().unwrap().contains("Reentrant"), "{}", seen.lock().unwrap());
    parent.lock().unwrap().take();
}

// ---- Chips -----------------------------------------------------------------------------------

#[test]
fn l3_chip_task_computes_on_the_simulated_chip() {
    let mut b = host().chips(&[0]);
    let add = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let mem = w.chip_memory(WorkerId(0)).expect("chip 0");
    let n = 256usize;
    let (a, bb, f) = (
        mem.malloc(4 * n as u64).unwrap(),
        mem.malloc(4 * n as u64).unwrap(),
        mem.malloc(4 * n as u64).unwrap(),
    );
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    mem.copy_to(&a, 0, &f32_to_le_bytes(&xs)).unwrap();
    mem.copy_to(&bb, 0, &f32_to_le_bytes(&xs)).unwrap();
    let mut args = TaskArgs::new();
    for buf in [&a, &bb, &f] {
        args.add_inout(buf.tensor(&[n as u32], DataType::Float32).unwrap()).unwrap();
    }
    w.run(Orchestration::graph(move |g, _, _| {
        g.submit_next_level(add, args.clone(), &CallConfig::default(), WorkerId(0))?;
        Ok(())
    }))
    .expect("run");
    let mut out = vec![0u8; 4 * n];
    mem.copy_from(&f, 0, &mut out).unwrap();
    assert_eq!(f32_from_le_bytes(&out), xs.iter().map(|x| 2.0 * x).collect::<Vec<_>>());
    assert!(w.committed_device_memory().unwrap() > 0);
    assert!(mem.ledger().unwrap().user_allocations >= 3 * 4 * n as u64);
    for buf in [a, bb, f] {
        mem.free(buf).unwrap();
    }
}

#[test]
fn a_chip_memory_tensor_sent_to_another_chip_fails_at_submit() {
    let mut b = host().chips(&[0, 1]);
    let add = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let buf = w.chip_memory(WorkerId(0)).unwrap().malloc(256).unwrap();
    let mut args = TaskArgs::new();
    for _ in 0..3 {
        args.add_inout(buf.tensor(&[16], DataType::Float32).unwrap()).unwrap();
    }
    let e = w
        .submit(Orchestration::graph(move |g, _, _| {
            g.submit_next_level(add, args.clone(), &CallConfig::default(), WorkerId(1))?;
            Ok(())
        }))
        .expect_err("wrong chip");
    match e {
        WorkerError::Build { cause: BuildFailure::Callback(c), .. } => {
            let w = c.downcast_ref::<WorkerError>().expect("a worker error");
            assert!(
                matches!(
                    w,
                    WorkerError::Memory(simpler_worker::MemError::WrongChip {
                        buffer_chip: WorkerId(0),
                        chip: WorkerId(1)
                    })
                ),
                "{w}"
            );
        }
        other => panic!("unexpected {other}"),
    }
}

/// A tensor based inside a chip buffer would be a buffer of its own to the engine, unordered
/// against the buffer's views; it is refused at submit, naming the buffer.
#[test]
fn a_chip_memory_tensor_based_inside_a_device_buffer_is_refused_at_submit() {
    let mut b = host().chips(&[0]);
    let add = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let mem = w.chip_memory(WorkerId(0)).unwrap();
    let (x, buf) = (mem.malloc(256).unwrap(), mem.malloc(256).unwrap());
    let x = x.tensor(&[16], DataType::Float32).unwrap();
    let whole = buf.tensor(&[16], DataType::Float32).unwrap();
    let inner = Tensor::with_buffer(buf.addr() + 64, 192, &[16], DataType::Float32)
        .unwrap()
        .child_memory(true);
    // Two writes of the buffer's bytes 64..128, one through a view, one through the tensor
    // based inside it: unrefused, they would run unordered.
    let e = w
        .run(Orchestration::graph(move |g, _, _| {
            let mut args = TaskArgs::new();
            args.add_input(x)?.add_input(x)?.add_output(whole)?;
            g.submit_next_level(add, args, &CallConfig::default(), WorkerId(0))?;
            let mut args = TaskArgs::new();
            args.add_input(x)?.add_input(x)?.add_output(inner)?;
            g.submit_next_level(add, args, &CallConfig::default(), WorkerId(0))?;
            Ok(())
        }))
        .expect_err("refused");
    let WorkerError::Build { cause: BuildFailure::Callback(c), .. } = &e else {
        panic!("unexpected {e}");
    };
    match c.downcast_ref::<WorkerError>() {
        Some(WorkerError::ChipTensorOffsetBase { arg: 2, chip: WorkerId(0), addr, buffer })
            if *addr == buf.addr() + 64 && *buffer == buf.addr() => {}
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("DeviceBuffer::tensor"), "{e}");
    // An empty tensor there names no bytes, so nothing could be left unordered: it runs.
    let empty = Tensor::with_buffer(buf.addr() + 64, 0, &[0], DataType::Float32)
        .unwrap()
        .child_memory(true);
    let y = w.chip_memory(WorkerId(0)).unwrap().malloc(256).unwrap();
    let y = y.tensor(&[16], DataType::Float32).unwrap();
    w.run(Orchestration::graph(move |g, _, _| {
        let mut args = TaskArgs::new();
        args.add_input(x)?.add_input(empty)?.add_output(y)?;
        g.submit_next_level(add, args, &CallConfig::default(), WorkerId(0))?;
        Ok(())
    }))
    .expect("an empty tensor inside a buffer runs");
    w.close().expect("close");
}

#[test]
fn free_waits_until_runs_accepted_before_it_are_published() {
    let mut b = host().chips(&[0]).sub_workers(1);
    let (hold, gate) = register_hold(&mut b);
    let w = Arc::new(b.start().expect("start"));
    let buf = w.chip_memory(WorkerId(0)).unwrap().malloc(1024).unwrap();
    let handle = w.submit(subs(hold, 1)).expect("submit");
    let (w2, h2) = (Arc::clone(&w), handle.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    let freer = std::thread::spawn(move || {
        w2.chip_memory(WorkerId(0)).unwrap().free(buf).expect("free");
        let _ = tx.send(());
        h2.is_done()
    });
    // While the run is held, the free has not returned (this can only miss a bug, never
    // fail a correct implementation).
    let freed_early = rx.recv_timeout(Duration::from_millis(50)).is_ok();
    gate.wait();
    assert!(!freed_early, "free did not wait for the run");
    assert!(freer.join().expect("freer"), "free returned before the earlier run was done");
    handle.wait().expect("run");
}

#[test]
fn l2_submit_returns_a_live_handle_and_memory_calls_check_ownership_and_range() {
    let mut b = Worker::chip(Platform::A2a3Sim, 3, RuntimeVariant::HostBuildGraph);
    let add = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let mem = w.memory().expect("l2 memory");
    let n = 64u32;
    let bufs: Vec<_> = (0..3).map(|_| mem.malloc(u64::from(n) * 4).unwrap()).collect();
    mem.copy_to(&bufs[0], 0, &f32_to_le_bytes(&vec![1.5; n as usize])).unwrap();
    mem.copy_to(&bufs[1], 0, &f32_to_le_bytes(&vec![2.0; n as usize])).unwrap();
    let mut args = TaskArgs::new();
    for buf in &bufs {
        args.add_inout(buf.tensor(&[n], DataType::Float32).unwrap()).unwrap();
    }
    // A slow kernel keeps the run on the chip after `submit` returned: the handle is live.
    let delayed = w
        .with_sim_faults(WorkerId(0), |plan| plan.kernel_delay(0, Duration::from_secs(1)))
        .expect("lane");
    assert!(delayed);
    let handle = w.submit(Orchestration::chip(add, args)).expect("submit");
    assert!(!handle.is_done());
    handle.wait_timeout(HANG).expect("no hang").expect("run");
    assert!(handle.is_done());
    w.with_sim_faults(WorkerId(0), |plan| plan.clear()).expect("lane");
    let mut out = vec![0u8; n as usize * 4];
    mem.copy_from(&bufs[2], 0, &mut out).unwrap();
    assert!(f32_from_le_bytes(&out).iter().all(|&v| v == 3.5));
    // The error names the buffer (its chip and address) besides the access.
    use simpler_worker::MemError;
    let err = mem.copy_to(&bufs[0], 250, &[0u8; 8]);
    let buffer = simpler_worker::BufferName::Device { chip: WorkerId(0), addr: bufs[0].addr() };
    assert!(
        matches!(
            &err,
            Err(WorkerError::Memory(MemError::OutOfRange { buffer: b, offset: 250, .. }))
                if *b == buffer
        ),
        "{err:?}"
    );
    let text = err.unwrap_err().to_string();
    assert!(text.contains(&format!("buffer {:#x} of chip 0", bufs[0].addr())), "{text}");
    let other =
        Worker::chip(Platform::A2a3Sim, 4, RuntimeVariant::HostBuildGraph).start().expect("other");
    let other_mem = other.memory().unwrap();
    assert!(matches!(
        other_mem.free(bufs[0]),
        Err(WorkerError::Memory(simpler_worker::MemError::WrongChip { .. }))
    ));
    assert!(matches!(w.chip_memory(WorkerId(0)), Err(WorkerError::WrongLevel { .. })));
    assert!(matches!(
        w.submit(Orchestration::graph(|_, _, _| Ok(()))),
        Err(WorkerError::WrongLevel { level: 2, .. })
    ));
}

#[test]
fn l2_prepare_failure_comes_back_from_submit_and_the_next_run_succeeds() {
    let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
    let add = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let e = w.submit(Orchestration::chip(add, TaskArgs::new())).expect_err("wrong arg count");
    assert!(matches!(e, WorkerError::Build { cause: BuildFailure::Device(_), .. }), "{e}");
    let mem = w.memory().unwrap();
    let mut args = TaskArgs::new();
    for _ in 0..3 {
        args.add_inout(mem.malloc(64).unwrap().tensor(&[16], DataType::Float32).unwrap()).unwrap();
    }
    w.run(Orchestration::chip(add, args)).expect("next run");
}

/// The error an L3 orchestration returns in `a_childs_build_failure_reaches_the_parent_typed`.
#[derive(Debug)]
struct ShardMissing(u32);

impl std::fmt::Display for ShardMissing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "shard {} missing", self.0)
    }
}

impl std::error::Error for ShardMissing {}

#[test]
fn a_childs_build_failure_reaches_the_parent_typed() {
    let mut l4 = Worker::composite(4);
    l4.child(host().sub_workers(1)).expect("adopt");
    let orch = l4.register_graph("refuses", |_, _, _| Err(Box::new(ShardMissing(7)) as _));
    let w = l4.start().expect("start");
    let e = w
        .run(Orchestration::graph(move |b, _, _| {
            b.submit_next_level(orch, TaskArgs::new(), &CallConfig::default(), WorkerId(0))?;
            Ok(())
        }))
        .expect_err("the child's orchestration fails");
    let WorkerError::Run(e) = e else { panic!("{e}") };
    let child = e.frames().iter().find_map(|f| f.worker_error()).expect("the child's error");
    let WorkerError::Build { cause: BuildFailure::Callback(source), .. } = child else {
        panic!("{child}")
    };
    assert_eq!(source.downcast_ref::<ShardMissing>().map(|s| s.0), Some(7), "{e}");
    w.close().expect("close");
}

/// Set in the child process of the test below.
const TLS_CHILD: &str = "SIMPLER_TEST_THREAD_LOCAL_CHILD";

#[test]
fn a_worker_kept_in_a_thread_local_is_closed_when_its_thread_exits() {
    // The worker's drop closes it while the thread's locals are torn down, after those the
    // worker's calls set up on the thread (registered later, destroyed first). A panic there
    // would abort the process, so the thread runs in a child process of this test binary.
    if std::env::var_os(TLS_CHILD).is_some() {
        use std::cell::RefCell;
        thread_local! {
            static KEPT: RefCell<Option<Worker>> = const { RefCell::new(None) };
        }
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        std::thread::spawn(move || {
            let mut b = host().sub_workers(1);
            let h = b.register_host("count", move |_| {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            });
            KEPT.with(|k| *k.borrow_mut() = Some(b.start().expect("start")));
            KEPT.with(|k| k.borrow().as_ref().map(|w| w.run(one_sub_task(h))))
                .expect("a worker")
                .expect("run");
        })
        .join()
        .expect("the thread exits");
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        return;
    }
    let this = "a_worker_kept_in_a_thread_local_is_closed_when_its_thread_exits";
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", this, "--test-threads=1"])
        .env(TLS_CHILD, "1")
        .output()
        .expect("the child runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
