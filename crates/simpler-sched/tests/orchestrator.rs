//! Orchestrator conformance (run lifecycle, submit, alloc and scopes: `docs/engine-protocols.md` §2–§3).
//!
//! Fixture: 1 MiB rings, NEXT_LEVEL workers 0, 1 and 3 whose endpoints hold every member until
//! the test releases it ("completed by hand").

mod common;

use common::*;
use simpler_sched::SchedError;
use simpler_types::TensorArgType::*;
use simpler_types::{
    CancelReason, DataType, FailureMechanism, RunFailure, TaskState, Tensor, WorkerId,
};

const A: u64 = 0x10_0000;
const B: u64 = 0x20_0000;

fn fixture() -> Rig {
    rig(&[0, 1, 3], 0)
}

#[test]
fn c01_output_only_task_is_ready_and_sits_in_its_targets_fifo() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let blocker = noop_on(&mut b, 0).unwrap();
    h.wait_running(blocker, 0);
    let t =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    assert_eq!(snap(e, t).state, TaskState::Ready);
    eventually("the task to sit in worker 0's FIFO", || e.stats().queued_next_level[0] == 1);
    h.release(blocker, Action::Succeed);
    h.release(t, Action::Succeed);
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c02_bad_targets_are_rejected_before_any_slot_is_claimed() {
    let r = fixture();
    let e = &r.e;
    let mut b = e.begin_run().unwrap();
    let unknown = noop_on(&mut b, 2);
    assert!(matches!(unknown, Err(SchedError::UnknownWorker { worker: WorkerId(2) })));
    let two_members_one_target =
        b.submit_next_level_group(&chip(1), vec![args(&[]), args(&[])], &cfg(), &[w(0)], None);
    assert!(matches!(
        two_members_one_target,
        Err(SchedError::TargetCountMismatch { targets: 1, members: 2 })
    ));
    let duplicate = noop_group_on(&mut b, [1, 1]);
    assert!(matches!(duplicate, Err(SchedError::DuplicateTarget { worker: WorkerId(1) })));
    assert_eq!(e.stats().ring.window.live, 0, "no slot was claimed");
    assert_eq!(b.status().tasks_submitted, 0);
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c03_input_of_an_earlier_output_is_pending_with_one_live_fanin_and_not_queued() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let p =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    h.wait_running(p, 0);
    let c =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(1), None).unwrap();
    let s = snap(e, c);
    assert_eq!((s.state, s.fanin_count, s.fanin_released), (TaskState::Pending, 1, 0));
    assert_eq!(s.producers, vec![p]);
    assert_eq!(e.stats().queued_next_level[1], 0);
    h.release(p, Action::Succeed);
    h.release(c, Action::Succeed);
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c04_a_group_whose_members_read_one_key_records_the_producer_once() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let p =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    h.wait_running(p, 0);
    let members = vec![args(&[(buf(A, 64), Input)]), args(&[(buf(A, 64), Input)])];
    let g = b.submit_next_level_group(&chip(1), members, &cfg(), &[w(1), w(3)], None).unwrap();
    let s = snap(e, g);
    assert_eq!((s.fanin_count, s.producers.clone()), (1, vec![p]));
    assert_eq!(snap(e, p).fanout_total, 2, "one scope reference and one consumer");
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c05_a_consumer_of_a_failed_producer_fails_with_its_message_never_runs_and_both_are_consumed() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let p =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    h.wait_running(p, 0);
    let c =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(1), None).unwrap();
    h.release(p, Action::Fail("producer broke".into()));
    wait_state(e, c, TaskState::Failed);
    let s = snap(e, c);
    let f = s.failure.expect("consumer failure");
    assert_eq!(f.message, "producer broke");
    assert_eq!(f.mechanism, FailureMechanism::Poisoned { root: p });
    assert_eq!(s.producers, vec![p]);
    assert_eq!(e.stats().queued_next_level[1], 0);
    let run = b.close();
    assert!(matches!(failure_of(&wait(e, run)), RunFailure::Task(t) if t.task == p));
    assert_eq!(snap(e, p).state, TaskState::Consumed);
    assert_eq!(snap(e, c).state, TaskState::Consumed);
    assert!(h.log().iter().all(|d| d.task != c), "the consumer never ran");
}

#[test]
fn c06_a_later_reader_of_an_output_key_depends_on_its_writer() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let p =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    let c =
        b.submit_next_level(&chip(1), args(&[(buf(A, 16), Input)]), &cfg(), w(1), None).unwrap();
    assert_eq!(snap(e, c).producers, vec![p]);
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c07_reclaiming_a_completed_slot_erases_its_keys_and_leaves_it_consumed() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    b.scope_begin().unwrap();
    let p =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    h.release(p, Action::Succeed);
    wait_state(e, p, TaskState::Completed);
    b.scope_end().unwrap();
    assert_eq!(snap(e, p).state, TaskState::Consumed);
    let c =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(1), None).unwrap();
    let s = snap(e, c);
    assert!(s.producers.is_empty(), "the erased key names no producer");
    assert_eq!(s.fanin_count, 0);
    h.release(c, Action::Succeed);
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c08_a_task_holds_one_scope_reference_and_is_consumed_after_completion_and_scope_end() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    b.scope_begin().unwrap();
    let t = noop_on(&mut b, 0).unwrap();
    assert_eq!(snap(e, t).fanout_total, 1);
    h.release(t, Action::Succeed);
    wait_state(e, t, TaskState::Completed);
    let s = snap(e, t);
    assert_eq!((s.fanout_total, s.fanout_released), (1, 1), "self release counted");
    b.scope_end().unwrap();
    assert_eq!(snap(e, t).state, TaskState::Consumed);
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c09_no_dep_on_a_produced_key_is_ready_without_fanin() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let p =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    h.wait_running(p, 0);
    let t =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), NoDep)]), &cfg(), w(1), None).unwrap();
    let s = snap(e, t);
    assert!(matches!(s.state, TaskState::Ready | TaskState::Running));
    assert!(s.producers.is_empty() && s.fanin_count == 0);
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c10_a_group_stores_each_members_arguments_and_both_keys_name_the_group() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let members = vec![args(&[(buf(A, 64), Output)]), args(&[(buf(B, 64), Output)])];
    let g = b.submit_next_level_group(&chip(1), members, &cfg(), &[w(0), w(1)], None).unwrap();
    let ra =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(3), None).unwrap();
    let rb =
        b.submit_next_level(&chip(1), args(&[(buf(B, 64), Input)]), &cfg(), w(3), None).unwrap();
    assert_eq!(snap(e, ra).producers, vec![g]);
    assert_eq!(snap(e, rb).producers, vec![g]);
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
    let log = h.log();
    let m0 = log.iter().find(|d| d.task == g && d.member == 0).unwrap();
    let m1 = log.iter().find(|d| d.task == g && d.member == 1).unwrap();
    assert_eq!((m0.addrs.clone(), m0.group_size), (vec![A], 2));
    assert_eq!((m1.addrs.clone(), m1.group_size), (vec![B], 2));
}

#[test]
fn c11_a_single_task_stores_its_arguments_directly() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let mut a = args(&[(buf(A, 64), InOut)]);
    a.add_scalar(42).unwrap();
    let t = b.submit_next_level(&chip(9), a, &cfg(), w(3), None).unwrap();
    h.release(t, Action::Succeed);
    let run = b.close();
    assert!(wait(e, run).is_completed());
    let d = h.log().into_iter().find(|d| d.task == t).unwrap();
    assert_eq!((d.member, d.group_size, d.worker.id), (0, 1, WorkerId(3)));
    assert_eq!((d.addrs, d.scalars, d.callable), (vec![A], vec![42], chip(9)));
}

#[test]
fn c12_write_tags_without_a_buffer_are_rejected_and_alloc_returns_an_aligned_ring_0_buffer() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let null = Tensor::external(0, &[16], DataType::Float32).unwrap();
    for tag in [Output, OutputExisting, InOut] {
        let r = b.submit_next_level(&chip(1), args(&[(null, tag)]), &cfg(), w(0), None);
        match r {
            Err(err @ SchedError::OutputWithoutBuffer { member: 0, arg: 0, tag: t })
                if t == tag =>
            {
                assert!(err.to_string().contains("use alloc() or pass a buffer"), "{err}");
            }
            other => panic!("{tag}: {other:?}"),
        }
    }
    assert_eq!(e.stats().ring.window.live, 0, "no slot was claimed");
    let t = b.alloc(&[256], DataType::Float32).unwrap();
    assert_eq!(t.addr % 1024, 0);
    assert_eq!(t.size, 1024);
    let ring0 = &e.stats().ring.heaps[0];
    assert_eq!((ring0.live_allocs, ring0.live_bytes), (1, 1024));
    let reader = b.submit_next_level(&chip(1), args(&[(t, Input)]), &cfg(), w(0), None).unwrap();
    assert_eq!(snap(e, reader).producers.len(), 1, "the alloc is registered as the producer");
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c12_an_empty_alloc_is_null_and_every_tag_takes_it() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let empty = b.alloc(&[4, 0], DataType::Float32).unwrap();
    assert!(empty.is_null());
    for tag in [Output, OutputExisting, InOut, Input, NoDep] {
        let r = b.submit_next_level(&chip(1), args(&[(empty, tag)]), &cfg(), w(0), None);
        assert!(r.is_ok(), "{tag}: {r:?}");
    }
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c17_inout_on_an_alloc_attaches_without_live_fanin_and_becomes_the_producer() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let t = b.alloc(&[64], DataType::UInt8).unwrap();
    let alloc = snap(e, simpler_types::TaskId::new(b.id(), 0));
    assert!(alloc.is_alloc && alloc.state == TaskState::Completed);
    let wr = b.submit_next_level(&chip(1), args(&[(t, InOut)]), &cfg(), w(0), None).unwrap();
    let s = snap(e, wr);
    assert_eq!((s.fanin_count, s.producers.clone()), (0, vec![alloc.task]));
    let a = snap(e, alloc.task);
    assert_eq!((a.fanout_total, a.consumers.clone()), (2, vec![wr]));
    h.wait_running(wr, 0);
    let rd = b.submit_next_level(&chip(1), args(&[(t, Input)]), &cfg(), w(1), None).unwrap();
    let r = snap(e, rd);
    assert!(r.producers.contains(&wr), "the map now names the writer");
    assert_eq!(r.fanin_count, 1, "only the running writer is live");
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c18_blind_writers_of_a_provided_buffer_take_no_producer_and_replace_the_previous_one() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let w1 =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    let w2 =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(1), None).unwrap();
    let w3 = b
        .submit_next_level(&chip(1), args(&[(buf(A, 64), OutputExisting)]), &cfg(), w(3), None)
        .unwrap();
    for t in [w2, w3] {
        let s = snap(e, t);
        assert!(s.producers.is_empty() && s.fanin_count == 0, "{t} takes no producer");
    }
    assert_eq!(snap(e, w1).fanout_total, 1, "the previous writer gains no consumer");
    let r =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(0), None).unwrap();
    assert_eq!(snap(e, r).producers, vec![w3], "the last writer replaced the others");
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn c19_an_empty_run_is_not_done_before_close_and_completed_right_after() {
    let r = fixture();
    let e = &r.e;
    let b = e.begin_run().unwrap();
    let id = b.id();
    assert!(!e.is_done(id).unwrap());
    let run = b.close();
    assert!(e.is_done(run).unwrap());
    assert!(wait(e, run).is_completed());
    let summary = e.release(run).unwrap();
    assert_eq!((summary.id, summary.tasks), (run, 0));
}

#[test]
fn c20_wait_timeout_zero_polls() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let t = noop_on(&mut b, 0).unwrap();
    let id = b.id();
    assert_eq!(e.wait_timeout(id, std::time::Duration::ZERO).unwrap(), None);
    let run = b.close();
    assert_eq!(e.wait_timeout(run, std::time::Duration::ZERO).unwrap(), None);
    h.release(t, Action::Succeed);
    eventually("the run to finish", || {
        e.wait_timeout(run, std::time::Duration::ZERO).unwrap().is_some()
    });
    assert!(e.wait_timeout(run, std::time::Duration::ZERO).unwrap().unwrap().is_completed());
}

#[test]
fn c21_a_one_task_run_is_not_done_after_close_until_its_task_is_reclaimed() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let t = noop_on(&mut b, 1).unwrap();
    let run = b.close();
    h.wait_running(t, 0);
    assert!(!e.is_done(run).unwrap());
    assert_eq!(e.status(run).unwrap().tasks_active, 1);
    h.release(t, Action::Succeed);
    assert!(wait(e, run).is_completed());
    assert_eq!(e.status(run).unwrap().tasks_active, 0);
}

#[test]
fn c22_sequential_runs_get_increasing_ids_and_a_task_failure_fails_only_its_run() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b1 = e.begin_run().unwrap();
    let t1 = noop_on(&mut b1, 0).unwrap();
    h.release(t1, Action::Fail("run 1 only".into()));
    let r1 = b1.close();
    assert!(matches!(failure_of(&wait(e, r1)), RunFailure::Task(f) if f.message == "run 1 only"));
    let mut b2 = e.begin_run().unwrap();
    let t2 = noop_on(&mut b2, 0).unwrap();
    h.release(t2, Action::Succeed);
    let r2 = b2.close();
    assert!(r2 > r1);
    assert!(wait(e, r2).is_completed());
}

#[test]
fn c23_failing_an_empty_run_makes_it_done_and_failed() {
    let r = fixture();
    let e = &r.e;
    let run = e.begin_run().unwrap().fail("nothing to do");
    assert!(e.is_done(run).unwrap());
    assert!(matches!(
        failure_of(&wait(e, run)),
        RunFailure::Submission { message, .. } if message == "nothing to do"
    ));
}

#[test]
fn c24_releasing_run_1_never_disturbs_the_live_slots_of_run_2() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b1 = e.begin_run().unwrap();
    b1.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    h.open();
    let r1 = b1.close();
    assert!(wait(e, r1).is_completed());
    let mut b2 = e.begin_run().unwrap();
    let t2 =
        b2.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(1), None).unwrap();
    e.release(r1).unwrap();
    let s = snap(e, t2);
    assert!(matches!(s.state, TaskState::Ready | TaskState::Running | TaskState::Completed));
    assert!(e.stats().ring.window.live >= 1, "run 2's slot is still live");
    let r =
        b2.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(3), None).unwrap();
    assert!(snap(e, r).producers == vec![t2] || snap(e, t2).state == TaskState::Completed);
    let r2 = b2.close();
    assert!(wait(e, r2).is_completed());
}

#[test]
fn c25_recording_into_a_terminal_or_released_run_changes_nothing() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b1 = e.begin_run().unwrap();
    noop_on(&mut b1, 0).unwrap();
    h.open();
    let r1 = b1.close();
    assert!(wait(e, r1).is_completed());
    assert!(!e.abort_run(r1, CancelReason::RunAborted).unwrap());
    assert!(wait(e, r1).is_completed(), "a terminal run keeps its outcome");
    e.release(r1).unwrap();
    assert!(matches!(
        e.abort_run(r1, CancelReason::RunAborted),
        Err(SchedError::UnknownRun { .. })
    ));
    let mut b2 = e.begin_run().unwrap();
    noop_on(&mut b2, 0).unwrap();
    let r2 = b2.close();
    assert!(wait(e, r2).is_completed(), "no live run was failed");
}

#[test]
fn c27_aborting_a_closed_run_with_a_running_task_fails_it_once_that_task_is_reclaimed() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let running =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    let pending =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(1), None).unwrap();
    h.wait_running(running, 0);
    let run = b.close();
    assert_eq!(snap(e, pending).state, TaskState::Pending);
    assert!(e.abort_run(run, CancelReason::RunAborted).unwrap());
    // Cancelled and, its scope already closed, reclaimed at once.
    assert_eq!(snap(e, pending).state, TaskState::Consumed);
    assert!(!e.is_done(run).unwrap(), "the running task is still charged");
    h.release(running, Action::Succeed);
    assert!(matches!(
        failure_of(&wait(e, run)),
        RunFailure::Aborted { reason: CancelReason::RunAborted, .. }
    ));
    assert!(h.log().iter().all(|d| d.task != pending));
    let summary = e.release(run).unwrap();
    assert_eq!((summary.cancelled, summary.failed), (1, 0));
}

#[test]
fn c28_a_failed_submissions_cause_reaches_wait_verbatim() {
    let r = fixture();
    let e = &r.e;
    let mut b = e.begin_run().unwrap();
    b.alloc(&[4], DataType::Int32).unwrap();
    let run = b.fail("verbatim: ünïcode and 'quotes'");
    let o = wait(e, run);
    assert!(matches!(
        failure_of(&o),
        RunFailure::Submission { message, .. } if message == "verbatim: ünïcode and 'quotes'"
    ));
}

#[test]
fn c29_close_with_two_user_scopes_open_unwinds_them_and_the_run_completes() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    b.scope_begin().unwrap();
    b.alloc(&[16], DataType::UInt8).unwrap();
    b.scope_begin().unwrap();
    b.submit_next_level(&chip(1), args(&[(buf(A, 8), Output)]), &cfg(), w(0), None).unwrap();
    b.alloc(&[16], DataType::UInt8).unwrap();
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
    assert_eq!(e.status(run).unwrap().tasks_active, 0);
    e.release(run).unwrap();
    let next = e.begin_run().unwrap();
    assert_eq!(next.status().tasks_submitted, 0);
    next.close();
}

#[test]
fn c30_fail_cancels_unstarted_tasks_lets_the_running_one_finish_and_resolves_the_fence() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let running =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    h.wait_running(running, 0);
    let ready = noop_on(&mut b, 0).unwrap();
    let pending =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(1), None).unwrap();
    assert_eq!(snap(e, ready).state, TaskState::Ready);
    assert_eq!(snap(e, pending).state, TaskState::Pending);
    let run = b.fail("stop here");
    for t in [ready, pending] {
        // Cancelled and, with every scope unwound, reclaimed at once.
        assert_eq!(snap(e, t).state, TaskState::Consumed);
    }
    assert!(!e.is_done(run).unwrap());
    h.release(running, Action::Succeed);
    let o = wait(e, run);
    assert!(
        matches!(failure_of(&o), RunFailure::Submission { message, .. } if message == "stop here")
    );
    let dispatched: Vec<_> = h.log().iter().map(|d| d.task).collect();
    assert_eq!(dispatched, vec![running], "cancelled tasks never ran");
    let summary = e.release(run).unwrap();
    assert_eq!((summary.cancelled, summary.failed), (2, 0));
}

#[test]
fn c31_dropping_a_builder_without_close_fails_the_run_with_the_drop_cause() {
    let r = fixture();
    let e = &r.e;
    let b = e.begin_run().unwrap();
    let run = b.id();
    drop(b);
    assert!(matches!(
        failure_of(&wait(e, run)),
        RunFailure::Submission { message, .. } if message == "run builder dropped without close"
    ));
    let id = std::sync::Mutex::new(None);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let b = e.begin_run().unwrap();
        *id.lock().unwrap() = Some(b.id());
        panic!("orchestration bug");
    }));
    assert!(r.is_err());
    let run = id.lock().unwrap().unwrap();
    assert!(matches!(
        failure_of(&wait(e, run)),
        RunFailure::Submission { message, .. } if message == "orchestration panicked"
    ));
}

#[test]
fn c32_begin_run_while_a_run_is_building_returns_another_run_building_at_once() {
    let r = fixture();
    let e = &r.e;
    let b = e.begin_run().unwrap();
    let err = e.begin_run().unwrap_err();
    assert!(matches!(err, SchedError::AnotherRunBuilding { building } if building == b.id()));
    b.close();
}

#[test]
fn c33_a_reader_of_an_alloc_written_through_an_inout_chain_keeps_the_slab_until_it_ends() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    b.scope_begin().unwrap();
    let t = b.alloc(&[256], DataType::UInt8).unwrap();
    let writer = b.submit_next_level(&chip(1), args(&[(t, InOut)]), &cfg(), w(0), None).unwrap();
    let reader = b.submit_next_level(&chip(1), args(&[(t, Input)]), &cfg(), w(1), None).unwrap();
    h.release(writer, Action::Succeed);
    h.wait_running(reader, 0);
    b.scope_end().unwrap();
    let ring1 = e.stats().ring.heaps[1];
    assert_eq!(ring1.live_allocs, 1, "the slab outlives its scope while the reader runs");
    h.release(reader, Action::Succeed);
    eventually("the slab to be freed", || e.stats().ring.heaps[1].live_allocs == 0);
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn a_group_reading_a_buffer_another_member_writes_still_waits_for_the_earlier_writer() {
    let r = fixture();
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let earlier =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    h.wait_running(earlier, 0);
    // Member 0 overwrites the whole buffer; member 1 reads it. The read must still see the
    // earlier writer, which member 0's write would otherwise hide.
    let members = vec![args(&[(buf(A, 64), OutputExisting)]), args(&[(buf(A, 64), Input)])];
    let g = b.submit_next_level_group(&chip(1), members, &cfg(), &[w(1), w(3)], None).unwrap();
    let s = snap(e, g);
    assert_eq!(
        (s.state, s.producers.clone(), s.fanin_count),
        (TaskState::Pending, vec![earlier], 1)
    );
    let reader =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(0), None).unwrap();
    assert_eq!(snap(e, reader).producers, vec![g], "the group is now the buffer's producer");
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
    assert!(h.position(Event::End(earlier, 0)) < h.position(Event::Start(g, 1)));
}
