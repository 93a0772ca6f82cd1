//! Scheduler and worker conformance (`docs/engine-protocols.md` §6–§7; one behaviour is a unit
//! test beside the scheduler because a stale completion cannot be forged through the public API).

mod common;

use std::time::Duration;

use common::*;
use simpler_sched::{Engine, EngineConfig, SchedError};
use simpler_types::TensorArgType::*;
use simpler_types::{
    FailureMechanism, GroupMemberState, RunFailure, TaskArgs, TaskState, WorkerId, WorkerType,
};

const A: u64 = 0x10_0000;

fn ran_on(h: &Harness, task: simpler_types::TaskId, member: u32) -> simpler_types::WorkerRef {
    h.log().into_iter().find(|d| d.task == task && d.member == member).expect("dispatched").worker
}

#[test]
fn c34_duplicate_next_level_ids_fail_engine_start() {
    let h = Harness::new();
    let err = Engine::start(EngineConfig {
        next_level: vec![
            Fake::boxed(WorkerType::NextLevel, 0, &h, false),
            Fake::boxed(WorkerType::NextLevel, 0, &h, false),
        ],
        ..EngineConfig::default()
    })
    .unwrap_err();
    assert!(matches!(err, SchedError::DuplicateWorkerId { id: WorkerId(0) }));
}

#[test]
fn c37_an_independent_task_reaches_its_endpoint_with_address_and_callable_then_is_reclaimed() {
    let h = Harness::new();
    let e = engine(&[0, 1], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    let t =
        b.submit_next_level(&chip(42), args(&[(buf(A, 64), Input)]), &cfg(), w(1), None).unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    let d = h.log().into_iter().find(|d| d.task == t).unwrap();
    assert_eq!((d.addrs, d.callable, d.worker.id), (vec![A], chip(42), WorkerId(1)));
    assert_eq!(snap(&e, t).state, TaskState::Consumed);
    assert_eq!(e.stats().ring.window.live, 0);
}

#[test]
fn c38_a_dependent_task_is_dispatched_only_after_its_producer_completes() {
    let r = rig(&[0, 1], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let p =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    let c =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(1), None).unwrap();
    h.wait_running(p, 0);
    // An independent probe queued on the consumer's worker after it: a consumer made ready at
    // submit would be dispatched there first and hold the worker, so the probe running shows
    // the consumer was not dispatched.
    let probe = noop_on(&mut b, 1).unwrap();
    h.wait_running(probe, 0);
    assert!(!h.log().iter().any(|d| d.task == c), "the consumer waits for its producer");
    h.release(probe, Action::Succeed);
    h.release(p, Action::Succeed);
    h.release(c, Action::Succeed);
    let run = b.close();
    assert!(wait(e, run).is_completed());
    assert!(h.position(Event::End(p, 0)) < h.position(Event::Start(c, 0)));
}

#[test]
fn c39_a_task_with_76_tensors_and_2_scalars_dispatches_and_completes() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let mut a = TaskArgs::new();
    for i in 0..76u64 {
        a.add_input(buf(A + i * 0x1000, 64)).unwrap();
    }
    a.add_scalar(7).unwrap();
    a.add_scalar(8).unwrap();
    assert!(a.encoded_len() <= 17_416);
    let mut b = e.begin_run().unwrap();
    let t = b.submit_next_level(&chip(1), a, &cfg(), w(0), None).unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    let d = h.log().into_iter().find(|d| d.task == t).unwrap();
    assert_eq!((d.tensors, d.scalars), (76, vec![7, 8]));
}

#[test]
fn c40_a_failing_producer_fails_the_run_and_its_consumer_never_runs() {
    // Gated, so that the consumer is submitted before its producer fails (a submit into a run
    // that has failed is refused, and the consumer would then not exist to be checked).
    let h = Harness::new();
    let e = engine(&[0, 1], 0, &h, true);
    let mut b = e.begin_run().unwrap();
    let p = b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None);
    let p = p.unwrap();
    let c = b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(1), None);
    let c = c.unwrap();
    let run = b.close();
    h.release(p, Action::Fail("no good".into()));
    let o = wait(&e, run);
    assert!(matches!(failure_of(&o), RunFailure::Task(f) if f.task == p && f.message == "no good"));
    assert!(h.log().iter().any(|d| d.task == p), "the log shows dispatches");
    assert!(h.log().iter().all(|d| d.task != c), "the consumer never ran");
    assert_eq!(e.stats().ring.window.live, 0, "both were reclaimed");
}

#[test]
fn c41_a_two_member_group_sends_member_i_to_target_i() {
    let h = Harness::new();
    let e = engine(&[0, 1], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    let g = noop_group_on(&mut b, [0, 1]);
    let g = g.unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    assert_eq!((ran_on(&h, g, 0).id, ran_on(&h, g, 1).id), (WorkerId(0), WorkerId(1)));
}

#[test]
fn c42_targets_name_workers_by_id_not_position() {
    let h = Harness::new();
    let e = engine(&[0, 1], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    let g = noop_group_on(&mut b, [1, 0]);
    let g = g.unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    assert_eq!((ran_on(&h, g, 0).id, ran_on(&h, g, 1).id), (WorkerId(1), WorkerId(0)));
}

#[test]
fn c43_after_one_member_completes_the_group_is_still_running() {
    let r = rig(&[0, 1], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let g = noop_group_on(&mut b, [0, 1]);
    let g = g.unwrap();
    h.wait_running(g, 1);
    h.release_member(g, 0, Action::Succeed);
    eventually("member 0 to be recorded", || {
        snap(e, g).members == vec![GroupMemberState::Success, GroupMemberState::Running]
    });
    assert_eq!(snap(e, g).state, TaskState::Running);
    h.release_member(g, 1, Action::Succeed);
    wait_state(e, g, TaskState::Completed);
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn a_running_single_reports_its_member_running() {
    let r = rig(&[0], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let t = noop_on(&mut b, 0).unwrap();
    h.wait_running(t, 0);
    let s = snap(e, t);
    assert_eq!((s.state, s.members), (TaskState::Running, vec![GroupMemberState::Running]));
    h.release(t, Action::Succeed);
    wait_state(e, t, TaskState::Completed);
    assert_eq!(snap(e, t).members, vec![GroupMemberState::Success]);
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c44_a_blocked_group_reserves_its_idle_target_against_later_singles() {
    let r = rig(&[0, 1, 3], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let busy = noop_on(&mut b, 0).unwrap();
    h.wait_running(busy, 0);
    let g = noop_group_on(&mut b, [0, 1]);
    let g = g.unwrap();
    let held = noop_on(&mut b, 1).unwrap();
    let outside = noop_on(&mut b, 3).unwrap();
    h.wait_running(outside, 0);
    assert!(!h.log().iter().any(|d| d.task == held), "idle worker 1 is reserved for the group");
    assert_eq!(e.stats().queued_next_level[1], 1);
    h.release(busy, Action::Succeed);
    h.wait_running(g, 0);
    h.wait_running(g, 1);
    assert!(!h.log().iter().any(|d| d.task == held));
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
    assert!(h.position(Event::Start(g, 1)) < h.position(Event::Start(held, 0)));
}

#[test]
fn c45_when_its_targets_free_the_group_is_dispatched_before_singles_queued_for_them() {
    let r = rig(&[0, 1], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let a0 = noop_on(&mut b, 0).unwrap();
    let a1 = noop_on(&mut b, 1).unwrap();
    h.wait_running(a0, 0);
    h.wait_running(a1, 0);
    let g = noop_group_on(&mut b, [0, 1]);
    let g = g.unwrap();
    let s0 = noop_on(&mut b, 0).unwrap();
    let s1 = noop_on(&mut b, 1).unwrap();
    h.release(a0, Action::Succeed);
    h.release(a1, Action::Succeed);
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
    assert!(h.position(Event::Start(g, 0)) < h.position(Event::Start(s0, 0)));
    assert!(h.position(Event::Start(g, 1)) < h.position(Event::Start(s1, 0)));
}

#[test]
fn c46_a_failing_member_fails_the_run_at_once_and_the_group_waits_for_its_peer() {
    let r = rig(&[0, 1], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let g = noop_group_on(&mut b, [0, 1]);
    let g = g.unwrap();
    h.wait_running(g, 1);
    h.release_member(g, 0, Action::Fail("member 0 failed".into()));
    eventually("the run to read as failed", || b.status().failure.is_some());
    assert_eq!(snap(e, g).state, TaskState::Running);
    assert!(h.is_running(g, 1));
    h.release_member(g, 1, Action::Succeed);
    wait_state(e, g, TaskState::Failed);
    let run = b.close();
    let o = wait(e, run);
    assert!(matches!(failure_of(&o), RunFailure::Task(f) if f.member == Some(0) && f.task == g));
    assert_eq!(snap(e, g).state, TaskState::Consumed);
}

#[test]
fn c48_a_target_inside_its_eligible_set_is_used() {
    let h = Harness::new();
    let e = engine(&[0, 1], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    let t = b.submit_next_level(&chip(1), args(&[]), &cfg(), w(1), Some(&[w(0), w(1)])).unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    assert_eq!(ran_on(&h, t, 0).id, WorkerId(1));
}

#[test]
fn c49_a_busy_worker_does_not_block_another_workers_fifo_and_each_fifo_runs_in_order() {
    let r = rig(&[0, 1], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let busy = noop_on(&mut b, 0).unwrap();
    h.wait_running(busy, 0);
    let q0: Vec<_> = (0..3).map(|_| noop_on(&mut b, 0).unwrap()).collect();
    let q1: Vec<_> = (0..3).map(|_| noop_on(&mut b, 1).unwrap()).collect();
    for &t in &q1 {
        h.release(t, Action::Succeed);
    }
    for &t in &q1 {
        wait_state(e, t, TaskState::Completed);
    }
    assert!(h.is_running(busy, 0), "worker 1's FIFO drained while worker 0 stayed busy");
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
    for q in [&q0, &q1] {
        let starts: Vec<_> = q.iter().map(|&t| h.position(Event::Start(t, 0)).unwrap()).collect();
        assert!(starts.windows(2).all(|p| p[0] < p[1]), "FIFO order kept");
    }
}

#[test]
fn c50_a_released_consumer_goes_to_its_own_target() {
    let h = Harness::new();
    let e = engine(&[0, 1, 3], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    let c =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(3), None).unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    assert_eq!(ran_on(&h, c, 0).id, WorkerId(3));
}

#[test]
fn c51_a_target_outside_its_eligible_set_is_rejected_at_submit() {
    let r = rig(&[0, 1, 3], 0);
    let mut b = r.e.begin_run().unwrap();
    let err =
        b.submit_next_level(&chip(1), args(&[]), &cfg(), w(3), Some(&[w(0), w(1)])).unwrap_err();
    assert!(matches!(err, SchedError::TargetNotEligible { member: 0, worker: WorkerId(3) }));
    let err = b
        .submit_next_level_group(
            &chip(1),
            vec![args(&[]), args(&[])],
            &cfg(),
            &[w(0), w(1)],
            Some(&[vec![w(0)], vec![w(3)]]),
        )
        .unwrap_err();
    assert!(matches!(err, SchedError::TargetNotEligible { member: 1, worker: WorkerId(1) }));
    b.close();
}

#[test]
fn c52_unknown_target_or_eligible_ids_are_rejected_before_scheduling() {
    let r = rig(&[0, 1], 0);
    let mut b = r.e.begin_run().unwrap();
    let err = noop_on(&mut b, 5).unwrap_err();
    assert!(matches!(err, SchedError::UnknownWorker { worker: WorkerId(5) }));
    let err =
        b.submit_next_level(&chip(1), args(&[]), &cfg(), w(0), Some(&[w(0), w(6)])).unwrap_err();
    assert!(matches!(err, SchedError::UnknownWorker { worker: WorkerId(6) }));
    assert_eq!(r.e.stats().dispatched, 0);
    assert_eq!(b.status().tasks_submitted, 0);
    b.close();
}

#[test]
fn c53_ids_7_and_9_map_targets_by_id() {
    let h = Harness::new();
    let e = engine(&[7, 9], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    let t = noop_on(&mut b, 9).unwrap();
    let g = noop_group_on(&mut b, [9, 7]);
    let g = g.unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    assert_eq!(ran_on(&h, t, 0).id, WorkerId(9));
    assert_eq!((ran_on(&h, g, 0).id, ran_on(&h, g, 1).id), (WorkerId(9), WorkerId(7)));
}

#[test]
fn c55_a_sub_task_runs_while_the_only_next_level_worker_is_busy() {
    let r = rig(&[0], 1);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let busy = noop_on(&mut b, 0).unwrap();
    h.wait_running(busy, 0);
    let s = b.submit_sub(&host(1), args(&[])).unwrap();
    assert_eq!(h.wait_running(s, 0).ty, WorkerType::Sub);
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c56_a_group_of_two_outputs_on_one_key_then_a_reader_makes_exactly_three_dispatches() {
    let h = Harness::new();
    let e = engine(&[0, 1], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    let members = vec![args(&[(buf(A, 64), Output)]), args(&[(buf(A, 64), Output)])];
    let g = b.submit_next_level_group(&chip(1), members, &cfg(), &[w(0), w(1)], None).unwrap();
    let c =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(0), None).unwrap();
    let producers = snap(&e, c).producers;
    assert!(producers == vec![g] || producers.is_empty(), "at most the group, once");
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    assert_eq!(h.dispatched(), 3);
    assert!(h.position(Event::End(g, 0)) < h.position(Event::Start(c, 0)));
    assert!(h.position(Event::End(g, 1)) < h.position(Event::Start(c, 0)));
}

#[test]
fn c57_an_oversized_sub_group_is_rejected_and_a_sub_group_at_the_head_is_not_overtaken() {
    let r = rig(&[], 2);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let err = b.submit_sub_group(&host(1), vec![args(&[]), args(&[]), args(&[])]).unwrap_err();
    assert!(matches!(err, SchedError::GroupLargerThanPool { size: 3, pool: 2 }));
    let first = b.submit_sub(&host(1), args(&[])).unwrap();
    h.wait_running(first, 0);
    let group = b.submit_sub_group(&host(1), vec![args(&[]), args(&[])]).unwrap();
    let later = b.submit_sub(&host(1), args(&[])).unwrap();
    // Counters are published at the end of a pass, after its dispatch: a pass that saw both
    // queued with one SUB worker idle and did not start the later single.
    eventually("the group and the later single to be queued", || e.stats().queued_sub == 2);
    assert!(!h.log().iter().any(|d| d.task == later), "the later single does not overtake");
    h.release(first, Action::Succeed);
    h.wait_running(group, 0);
    h.wait_running(group, 1);
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
    let group_start = h.position(Event::Start(group, 0)).min(h.position(Event::Start(group, 1)));
    assert!(group_start < h.position(Event::Start(later, 0)));
    let workers: std::collections::HashSet<_> =
        h.log().iter().filter(|d| d.task == group).map(|d| d.worker).collect();
    assert_eq!(workers.len(), 2, "members run on distinct sub workers");
}

#[test]
fn c58_with_an_unplaceable_group_blocked_the_scheduler_sleeps() {
    let r = rig(&[0, 1], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let busy = noop_on(&mut b, 0).unwrap();
    h.wait_running(busy, 0);
    noop_group_on(&mut b, [0, 1]).unwrap();
    eventually("the group to be queued", || e.stats().queued_groups == 1);
    let before = e.stats().scheduler_iterations;
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(e.stats().scheduler_iterations, before, "no pass without an event");
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c59_a_panicking_endpoint_fails_its_task_as_endpoint_failed_and_the_worker_serves_the_next() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    h.script(next_task(&b), Action::Panic("kaboom".into()));
    noop_on(&mut b, 0).unwrap();
    let run = b.close();
    let o = wait(&e, run);
    match failure_of(&o) {
        RunFailure::Task(f) => {
            assert_eq!(f.mechanism, FailureMechanism::EndpointFailed);
            assert!(f.message.contains("endpoint panicked: kaboom"), "{}", f.message);
        }
        other => panic!("{other:?}"),
    }
    let mut b = e.begin_run().unwrap();
    let next = noop_on(&mut b, 0).unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    assert!(h.log().iter().any(|d| d.task == next));
}

#[test]
fn an_unbounded_stall_warning_delay_never_warns_and_neither_poisons_nor_stops_the_scheduler() {
    // `Duration::MAX` is the natural way to switch the stall warning off. An episode opened under
    // it must be tracked without arithmetic overflow, both in passes and on the scheduler thread
    // (which must survive to let shutdown finish).
    stall_episode_under(Duration::MAX);
}

#[test]
fn a_zero_or_one_nanosecond_stall_warning_delay_neither_poisons_nor_stops_the_scheduler() {
    // The delay has already passed when the episode opens: the warning fires at once.
    for delay in [Duration::ZERO, Duration::from_nanos(1)] {
        stall_episode_under(delay);
    }
}

/// Opens a stall episode (a blocked group holding an idle worker) under `stall_warn_after`,
/// looks at it again from a later pass, then completes the run and shuts down.
fn stall_episode_under(stall_warn_after: Duration) {
    let h = Harness::new();
    let e = std::sync::Arc::new(
        Engine::start(EngineConfig {
            ring: small_rings(),
            next_level: [0, 1, 3].map(|id| Fake::boxed(WorkerType::NextLevel, id, &h, true)).into(),
            stall_warn_after,
            ..EngineConfig::default()
        })
        .unwrap(),
    );
    let mut b = e.begin_run().unwrap();
    let busy = noop_on(&mut b, 0).unwrap();
    h.wait_running(busy, 0);
    let group = [args(&[]), args(&[])].into();
    b.submit_next_level_group(&chip(1), group, &cfg(), &[w(0), w(1)], None).unwrap();
    // Opens the stall episode: the blocked group holds idle worker 1, which has a single queued.
    noop_on(&mut b, 1).unwrap();
    // A later pass looks at the same open episode again.
    let outside = noop_on(&mut b, 3).unwrap();
    h.wait_running(outside, 0);
    assert!(!e.is_poisoned(), "{stall_warn_after:?} poisoned the engine");
    h.open();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    let (tx, rx) = std::sync::mpsc::channel();
    let stopper = std::sync::Arc::clone(&e);
    std::thread::spawn(move || {
        let _ = tx.send(stopper.shutdown(std::time::Instant::now() + PATIENCE));
    });
    let stopped = rx.recv_timeout(PATIENCE).expect("shutdown finishes");
    assert!(stopped.is_ok(), "{stopped:?}");
}
