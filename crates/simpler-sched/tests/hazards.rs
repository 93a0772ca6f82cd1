//! One regression test per known hazard of the original that applies to the
//! engine. Races are looped over many runs on several engines at once, so the naive ordering
//! each test guards against would hang (caught by the bounded waits) or fail an assertion.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use simpler_ring::{RingConfig, RingError};
use simpler_sched::{Engine, RunOutcome, SchedError};
use simpler_types::TensorArgType::*;
use simpler_types::{
    CancelReason, DataType, FailureMechanism, RunFailure, RunId, TaskState, Tensor,
};

const A: u64 = 0x10_0000;
const B: u64 = 0x100_0000;

/// Runs `body(engine, harness, round)` for `rounds` rounds on each of `threads` engines in
/// parallel (immediate endpoints: NEXT_LEVEL 0 and 1, one SUB worker).
fn race(threads: usize, rounds: usize, body: impl Fn(&Engine, &Harness, usize) + Sync) {
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let h = Harness::new();
                let e = engine(&[0, 1], 1, &h, false);
                for round in 0..rounds {
                    body(&e, &h, round);
                }
            });
        }
    });
}

#[test]
fn hazard_01_a_producer_finishing_while_its_consumer_is_wired_never_loses_the_release() {
    // Producers are held, then released one by one from another thread while consumers that
    // read all of them are being wired, so producer completions land between a consumer's
    // attach and its publication (where the original overwrote the count or skipped the
    // consumer). Every fourth round one producer fails instead. Three engines race at once.
    std::thread::scope(|s| {
        for thread in 0..3u64 {
            s.spawn(move || {
                for round in 0..16u64 {
                    let r = rig(&[0, 1], 0);
                    let (h, e) = (&r.h, &r.e);
                    let fail = (round + thread) % 4 == 0;
                    let mut b = e.begin_run().unwrap();
                    let mut producers = Vec::new();
                    for i in 0..16u64 {
                        let out = buf(A + i * 0x1000, 64);
                        let p = b.submit_next_level(
                            &chip(1),
                            args(&[(out, Output)]),
                            &cfg(),
                            w((i % 2) as u32),
                            None,
                        );
                        producers.push((p.unwrap(), out));
                    }
                    let reads: Vec<_> = producers.iter().map(|&(_, t)| (t, Input)).collect();
                    let mut consumers = Vec::new();
                    let start = std::sync::Barrier::new(2);
                    std::thread::scope(|s| {
                        s.spawn(|| {
                            start.wait();
                            for (i, &(p, _)) in producers.iter().enumerate() {
                                // Sleeping (not spinning) leaves this core to the endpoint threads,
                                // which process completions while the submitter wires consumers.
                                std::thread::sleep(Duration::from_micros(20));
                                let action = if fail && i == 11 {
                                    Action::Fail("producer failed".into())
                                } else {
                                    Action::Succeed
                                };
                                h.release(p, action);
                            }
                        });
                        start.wait();
                        for j in 0..200u32 {
                            match b.submit_next_level(
                                &chip(1),
                                args(&reads),
                                &cfg(),
                                w(j % 2),
                                None,
                            ) {
                                Ok(c) => consumers.push(c),
                                Err(SchedError::RunFailed(_)) if fail => break,
                                Err(other) => panic!("{other}"),
                            }
                        }
                    });
                    h.open();
                    let run = b.close();
                    let outcome = wait(e, run);
                    assert_eq!(outcome.is_completed(), !fail, "{run}: {outcome:?}");
                    let last_end =
                        producers.iter().filter_map(|&(p, _)| h.position(Event::End(p, 0))).max();
                    for c in consumers {
                        let start = h.position(Event::Start(c, 0));
                        if fail {
                            assert!(start.is_none(), "{c} ran after a failed producer");
                        } else {
                            assert!(last_end < start, "{c} started before its producers ended");
                        }
                    }
                }
            });
        }
    });
}

#[test]
fn hazard_02_a_consumer_never_starts_before_its_producer_ends() {
    race(3, 60, |e, h, _| {
        let mut b = e.begin_run().unwrap();
        // A small layered DAG: every task reads the two buffers of the previous layer.
        let mut prev: Vec<(simpler_types::TaskId, u64)> = Vec::new();
        let mut edges = Vec::new();
        for layer in 0..4u64 {
            let mut cur = Vec::new();
            for j in 0..2u64 {
                let out = A + (layer * 2 + j) * 0x1000;
                let mut tensors = vec![(buf(out, 64), Output)];
                tensors.extend(prev.iter().map(|&(_, addr)| (buf(addr, 64), Input)));
                let t = b.submit_next_level(&chip(1), args(&tensors), &cfg(), w(j as u32), None);
                let t = t.unwrap();
                edges.extend(prev.iter().map(|&(p, _)| (p, t)));
                cur.push((t, out));
            }
            prev = cur;
        }
        let run = b.close();
        assert!(wait(e, run).is_completed());
        for (p, c) in edges {
            assert!(
                h.position(Event::End(p, 0)) < h.position(Event::Start(c, 0)),
                "{c} before {p}"
            );
        }
        e.release(run).unwrap();
    });
}

#[test]
fn hazard_03_reclaiming_an_earlier_unordered_writer_keeps_the_later_writers_entry() {
    let r = rig(&[0, 1, 3], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    b.scope_begin().unwrap();
    let w1 =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    b.scope_end().unwrap();
    let w2 =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(1), None).unwrap();
    h.wait_running(w2, 0);
    h.release(w1, Action::Succeed);
    wait_state(e, w1, TaskState::Consumed);
    let reader =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(3), None).unwrap();
    let s = snap(e, reader);
    assert_eq!((s.state, s.producers.clone()), (TaskState::Pending, vec![w2]));
    h.release(w2, Action::Succeed);
    h.release(reader, Action::Succeed);
    let run = b.close();
    assert!(wait(e, run).is_completed());
    assert!(h.position(Event::End(w2, 0)) < h.position(Event::Start(reader, 0)));
}

#[test]
fn hazard_04_the_scheduler_does_not_spin_on_unplaceable_sub_work() {
    let r = rig(&[], 2);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let first = b.submit_sub(&host(1), args(&[])).unwrap();
    h.wait_running(first, 0);
    b.submit_sub_group(&host(1), vec![args(&[]), args(&[])]).unwrap();
    eventually("the group to be queued", || e.stats().queued_sub == 1);
    let before = e.stats().scheduler_iterations;
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(e.stats().scheduler_iterations, before);
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn hazard_05_a_stream_of_singles_cannot_starve_a_group() {
    let r = rig(&[0, 1], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let busy = noop_on(&mut b, 0).unwrap();
    h.wait_running(busy, 0);
    let g = noop_group_on(&mut b, [0, 1]);
    let g = g.unwrap();
    // Singles keep arriving for worker 1, each released at once if it ever starts.
    let mut singles = Vec::new();
    for _ in 0..20 {
        let s = noop_on(&mut b, 1).unwrap();
        h.release(s, Action::Succeed);
        singles.push(s);
    }
    // Every single has been routed (and a dispatch pass has run after it) once worker 1's
    // queue holds all of them; none may have been taken from it.
    eventually("every single to be queued", || e.stats().queued_next_level[1] == 20);
    assert!(singles.iter().all(|&s| h.position(Event::Start(s, 0)).is_none()));
    h.release(busy, Action::Succeed);
    h.release_member(g, 0, Action::Succeed);
    h.release_member(g, 1, Action::Succeed);
    let run = b.close();
    assert!(wait(e, run).is_completed());
    let group_start = h.position(Event::Start(g, 1)).unwrap();
    assert!(singles.iter().all(|&s| h.position(Event::Start(s, 0)).unwrap() > group_start));
}

#[test]
fn hazard_06_the_sub_fifo_is_strict_and_an_unplaceable_group_is_refused_at_submit() {
    let r = rig(&[], 2);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    assert!(matches!(
        b.submit_sub_group(&host(1), vec![args(&[]); 3]),
        Err(SchedError::GroupLargerThanPool { size: 3, pool: 2 })
    ));
    let blocker = b.submit_sub(&host(1), args(&[])).unwrap();
    h.wait_running(blocker, 0);
    let g = b.submit_sub_group(&host(1), vec![args(&[]), args(&[])]).unwrap();
    let later: Vec<_> = (0..5).map(|_| b.submit_sub(&host(1), args(&[])).unwrap()).collect();
    eventually("the group and the singles to be queued", || e.stats().queued_sub == 6);
    assert!(later.iter().all(|&t| h.position(Event::Start(t, 0)).is_none()), "nothing overtakes");
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
    // The group is dispatched in one pass; a later single can only start on a worker one of
    // its members freed.
    let g_start =
        h.position(Event::Start(g, 0)).unwrap().min(h.position(Event::Start(g, 1)).unwrap());
    assert!(later.iter().all(|&t| h.position(Event::Start(t, 0)).unwrap() > g_start));
}

#[test]
fn hazard_07_shutdown_loses_no_completion() {
    // Generous deadline: the running member finishes and the run completes.
    let h = Harness::new();
    let e = engine(&[0], 0, &h, true);
    let mut b = e.begin_run().unwrap();
    let t = noop_on(&mut b, 0).unwrap();
    let run = b.close();
    h.wait_running(t, 0);
    std::thread::scope(|s| {
        let stopper = s.spawn(|| e.shutdown(Instant::now() + PATIENCE));
        // Shutdown has begun once admission refuses; it then waits for the run, whose running
        // member is released only now.
        eventually("shutdown to begin", || {
            matches!(e.begin_run_until(Instant::now()), Err(SchedError::ShuttingDown))
        });
        h.release(t, Action::Succeed);
        assert!(stopper.join().unwrap().is_ok());
    });
    assert!(wait(&e, run).is_completed());

    // Zero deadline: the run is aborted, yet its running member's completion still resolves
    // the fence for a waiter on another thread.
    let h = Harness::new();
    let e = engine(&[0], 0, &h, true);
    let mut b = e.begin_run().unwrap();
    let t = noop_on(&mut b, 0).unwrap();
    let queued = noop_on(&mut b, 0).unwrap();
    let run = b.close();
    h.wait_running(t, 0);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| wait(&e, run));
        let stopper = s.spawn(|| e.shutdown(Instant::now()));
        // The abort has cancelled the queued task before the running one may finish, so the
        // queued task can never be dispatched.
        eventually("the queued task to be cancelled", || {
            matches!(snap(&e, queued).state, TaskState::Failed | TaskState::Consumed)
        });
        h.release(t, Action::Succeed);
        let errors = stopper.join().unwrap().unwrap_err();
        assert!(
            matches!(errors.errors.as_slice(), [SchedError::AbortedAtShutdown { run: r }] if *r == run)
        );
        let o = waiter.join().unwrap();
        assert!(matches!(
            failure_of(&o),
            RunFailure::Aborted { reason: CancelReason::Shutdown, .. }
        ));
    });
    assert!(h.position(Event::Start(queued, 0)).is_none(), "no dispatch after stop");
    assert!(h.position(Event::End(t, 0)).is_some());
}

#[test]
fn hazard_08_service_threads_survive_panics_and_user_calls_tolerate_unknown_runs() {
    // Gated endpoints: both tasks are submitted before either may panic, since a run that has
    // already failed refuses further submits.
    let h = Harness::new();
    let e = engine(&[0], 1, &h, true);
    for round in 0..5 {
        let mut b = e.begin_run().unwrap();
        let nl = noop_on(&mut b, 0).unwrap();
        let sub = b.submit_sub(&host(1), args(&[])).unwrap();
        let run = b.close();
        h.release(nl, Action::Panic(format!("endpoint panic {round}")));
        h.release(sub, Action::Panic(format!("sub panic {round}")));
        assert!(!wait(&e, run).is_completed());
        e.release(run).unwrap();
    }
    let unknown = RunId::from_raw(999).unwrap();
    assert!(matches!(e.wait(unknown), Err(SchedError::UnknownRun { .. })));
    assert!(matches!(e.is_done(unknown), Err(SchedError::UnknownRun { .. })));
    assert!(matches!(e.status(unknown), Err(SchedError::UnknownRun { .. })));
    assert!(matches!(e.release(unknown), Err(SchedError::UnknownRun { .. })));
    assert!(matches!(
        e.abort_run(unknown, CancelReason::RunAborted),
        Err(SchedError::UnknownRun { .. })
    ));
    assert!(!e.is_poisoned());
    h.open();
    let mut b = e.begin_run().unwrap();
    noop_on(&mut b, 0).unwrap();
    b.submit_sub(&host(1), args(&[])).unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed(), "both endpoint threads still serve");
}

#[test]
fn hazard_09_a_group_completes_only_after_every_dispatched_member_reports() {
    let r = rig(&[0, 1, 3], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let members = vec![args(&[]), args(&[]), args(&[])];
    let g =
        b.submit_next_level_group(&chip(1), members, &cfg(), &[w(0), w(1), w(3)], None).unwrap();
    for m in 0..3 {
        h.wait_running(g, m);
    }
    h.release_member(g, 2, Action::Fail("late member failed".into()));
    h.release_member(g, 0, Action::Succeed);
    eventually("two members recorded", || {
        snap(e, g).members.iter().filter(|m| m.is_terminal()).count() == 2
    });
    assert_eq!(snap(e, g).state, TaskState::Running, "member 1 still runs");
    h.release_member(g, 1, Action::Succeed);
    wait_state(e, g, TaskState::Failed);
    let run = b.close();
    assert!(matches!(failure_of(&wait(e, run)), RunFailure::Task(f) if f.member == Some(2)));
}

#[test]
fn hazard_10_attach_racing_reclamation_never_attaches_to_a_consumed_producer() {
    // Each producer's scope ends at once, so its completion reclaims it unless a consumer has
    // attached. The submitter and a releaser both wait for the producer to start; the releaser
    // then lets it finish after a short, varying delay while the consumer looks it up and
    // attaches — the window in which the original could attach to a reclaimed slot.
    let r = rig(&[0, 1], 0);
    let (h, e) = (&r.h, &r.e);
    for round in 0..32u64 {
        let mut b = e.begin_run().unwrap();
        let pairs = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel::<simpler_types::TaskId>();
            s.spawn(move || {
                for (i, p) in rx.iter().enumerate() {
                    h.wait_started(p, 0);
                    std::thread::sleep(Duration::from_micros((i as u64 * 7 + round) % 40));
                    h.release(p, Action::Succeed);
                }
            });
            for i in 0..60u64 {
                let out = buf(A + i * 0x1000, 64);
                b.scope_begin().unwrap();
                let p = b.submit_next_level(&chip(1), args(&[(out, Output)]), &cfg(), w(0), None);
                let p = p.unwrap();
                b.scope_end().unwrap();
                tx.send(p).unwrap();
                h.wait_started(p, 0);
                // The producer's buffer comes first; the lookups of 100 unwritten buffers that
                // follow widen the window between finding the producer and attaching to it.
                let mut reads = vec![(out, Input)];
                reads.extend((0..100u64).map(|k| (buf(B + k * 0x1000, 8), Input)));
                let c = b.submit_next_level(&chip(1), args(&reads), &cfg(), w(1), None);
                pairs.lock().unwrap().push((p, c.unwrap()));
            }
        });
        h.open();
        let run = b.close();
        assert!(wait(e, run).is_completed());
        for (p, c) in pairs.into_inner().unwrap() {
            assert!(h.position(Event::End(p, 0)) < h.position(Event::Start(c, 0)));
        }
        assert_eq!(e.stats().ring.window.live, 0, "every slot reclaimed exactly once");
        e.release(run).unwrap();
    }
}

#[test]
fn hazard_11_unbalanced_user_scopes_are_unwound_and_never_leak_into_the_next_run() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    assert!(matches!(b.scope_end(), Err(SchedError::ScopeUnderflow)), "the outer frame stays");
    b.scope_begin().unwrap();
    b.scope_begin().unwrap();
    b.alloc(&[1024], DataType::UInt8).unwrap();
    b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed(), "the fence fires despite open scopes");
    e.release(run).unwrap();

    let mut b = e.begin_run().unwrap();
    b.scope_begin().unwrap();
    b.alloc(&[1024], DataType::UInt8).unwrap();
    let run = b.fail("give up with a scope open");
    assert!(!wait(&e, run).is_completed());
    e.release(run).unwrap();

    let mut b = e.begin_run().unwrap();
    b.alloc(&[16], DataType::UInt8).unwrap();
    let heaps = e.stats().ring.heaps;
    assert_eq!((heaps[0].live_allocs, heaps[2].live_allocs), (1, 0), "a new run starts at ring 0");
    assert!(matches!(b.scope_end(), Err(SchedError::ScopeUnderflow)));
    let run = b.close();
    assert!(wait(&e, run).is_completed());
}

#[test]
fn hazard_12_a_working_set_larger_than_its_ring_names_ring_sizes_and_the_oldest_task() {
    let h = Harness::new();
    let ring = RingConfig {
        heap_bytes_per_ring: 8 * 1024,
        alloc_timeout: Duration::from_millis(50),
        ..RingConfig::default()
    };
    let e = engine_with_rings(ring, &[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    let first = b.alloc(&[4096], DataType::UInt8).unwrap();
    b.alloc(&[4096], DataType::UInt8).unwrap();
    let err = b.alloc(&[1024], DataType::UInt8).unwrap_err();
    match &err {
        SchedError::Capacity { source: RingError::HeapExhausted(x), oldest_live } => {
            assert_eq!((x.ring.get(), x.ring_size, x.aligned), (0, 8192, 1024));
            assert_eq!(*oldest_live, Some(simpler_types::TaskId::new(b.id(), 0)));
        }
        other => panic!("{other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("oldest live") && text.contains("ring"), "{text}");
    assert_ne!(first.addr, 0);
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    e.release(run).unwrap();
    // Drained rings rewind: a request of the whole ring succeeds at once.
    let mut b = e.begin_run().unwrap();
    b.alloc(&[8192], DataType::UInt8).unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
}

#[test]
fn hazard_13_and_19_a_recycled_slot_never_answers_for_its_old_task() {
    let r = rig(&[0], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    b.scope_begin().unwrap();
    let old =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    h.release(old, Action::Succeed);
    wait_state(e, old, TaskState::Completed);
    b.scope_end().unwrap();
    assert_eq!(snap(e, old).state, TaskState::Consumed);
    let new =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Output)]), &cfg(), w(0), None).unwrap();
    h.wait_running(new, 0);
    assert_eq!(e.stats().ring.window.capacity, 1, "the entry was recycled");
    assert_eq!(snap(e, old).state, TaskState::Consumed, "the old task stays consumed");
    assert_eq!(snap(e, new).state, TaskState::Running);
    let reader =
        b.submit_next_level(&chip(1), args(&[(buf(A, 64), Input)]), &cfg(), w(0), None).unwrap();
    assert_eq!(snap(e, reader).producers, vec![new]);
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn hazard_14_every_failed_run_carries_its_failure() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let run = e.begin_run().unwrap().fail(String::new());
    match wait(&e, run) {
        RunOutcome::Failed(f) => assert!(matches!(&*f, RunFailure::Submission { .. })),
        RunOutcome::Completed => panic!("a failed submission completed"),
    }
    assert!(e.status(run).unwrap().failure.is_some());
}

#[test]
fn hazard_15_a_nested_begin_run_is_refused_at_once() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let outer = e.begin_run().unwrap();
    let started = Instant::now();
    let nested = e.begin_run_until(Instant::now() + PATIENCE);
    assert!(
        matches!(nested, Err(SchedError::AnotherRunBuilding { building }) if building == outer.id())
    );
    assert!(started.elapsed() < PATIENCE, "refused without waiting");
    outer.close();
}

#[test]
fn hazard_n1_an_alloc_read_through_an_inout_chain_stays_allocated_for_its_reader() {
    let r = rig(&[0, 1], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    b.scope_begin().unwrap();
    let t = b.alloc(&[4, 256], DataType::UInt8).unwrap();
    let row = t.view(&[1, 256], &[2, 0]).unwrap();
    let w1 = b.submit_next_level(&chip(1), args(&[(t, InOut)]), &cfg(), w(0), None).unwrap();
    let w2 = b.submit_next_level(&chip(1), args(&[(t, InOut)]), &cfg(), w(0), None).unwrap();
    let reader = b.submit_next_level(&chip(1), args(&[(row, Input)]), &cfg(), w(1), None).unwrap();
    h.release(w1, Action::Succeed);
    h.release(w2, Action::Succeed);
    h.wait_running(reader, 0);
    b.scope_end().unwrap();
    assert_eq!(e.stats().ring.heaps[1].live_allocs, 1, "the creator is pinned by the reader");
    // The very next slab of that ring must not overlap the reader's bytes.
    b.scope_begin().unwrap();
    let next = b.alloc(&[1024], DataType::UInt8).unwrap();
    assert!(next.addr >= t.addr + t.size || next.addr + next.size <= t.addr);
    h.release(reader, Action::Succeed);
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn a_tensor_into_an_alloc_buffer_not_based_at_it_or_after_its_scope_is_refused() {
    let r = rig(&[0, 1], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    b.scope_begin().unwrap();
    let t = b.alloc(&[1024], DataType::UInt8).unwrap();
    let writer = b.submit_next_level(&chip(1), args(&[(t, Output)]), &cfg(), w(0), None).unwrap();
    // The upper half, described from its own address: the engine knows the buffer by its base,
    // so this read would get no edge to the writer. A view keeps the base and is accepted.
    let inside = Tensor::with_buffer(t.addr + 512, 512, &[512], DataType::UInt8).unwrap();
    let err = b.submit_next_level(&chip(1), args(&[(inside, Input)]), &cfg(), w(1), None);
    assert!(
        matches!(err, Err(SchedError::NotAnAllocBuffer { member: 0, arg: 0, addr, size: 512 })
            if addr == t.addr + 512),
        "{err:?}"
    );
    let bigger = Tensor::with_buffer(t.addr, 2048, &[2048], DataType::UInt8).unwrap();
    let err = b.submit_next_level(&chip(1), args(&[(bigger, Input)]), &cfg(), w(1), None);
    assert!(matches!(err, Err(SchedError::NotAnAllocBuffer { .. })), "{err:?}");
    let half = t.view(&[512], &[512]).unwrap();
    let reader = b.submit_next_level(&chip(1), args(&[(half, Input)]), &cfg(), w(1), None).unwrap();
    let producers = snap(e, reader).producers;
    assert!(producers.contains(&writer), "{producers:?}");
    h.release(writer, Action::Succeed);
    h.release(reader, Action::Succeed);
    b.scope_end().unwrap();
    // The buffer's scope ended (whether or not its slab is reclaimed yet): its descriptor names
    // nothing the run may use any more.
    let err = b.submit_next_level(&chip(1), args(&[(t, Input)]), &cfg(), w(1), None);
    assert!(matches!(err, Err(SchedError::NotAnAllocBuffer { .. })), "{err:?}");
    h.open();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn hazard_b_terminal_state_is_published_without_waiters_and_every_waiter_gets_the_same_arc() {
    let h = Harness::new();
    let e = Arc::new(engine(&[0], 0, &h, false));
    let mut b = e.begin_run().unwrap();
    h.script(next_task(&b), Action::Fail("shared".into()));
    noop_on(&mut b, 0).unwrap();
    let run = b.close();
    eventually("the run to finish with nobody waiting", || e.is_done(run).unwrap());
    let outcomes: Vec<RunOutcome> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4).map(|_| s.spawn(|| wait(&e, run))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let first = outcomes[0].failure().unwrap();
    assert!(outcomes.iter().all(|o| Arc::ptr_eq(o.failure().unwrap(), first)));
    match &**first {
        RunFailure::Task(f) => assert_eq!(f.mechanism, FailureMechanism::TaskFailed),
        other => panic!("{other:?}"),
    }
}

#[test]
fn hazard_1306_a_write_after_a_read_waits_for_the_reader() {
    // The original's issue #1306: `W0: InOut buf, R0: Input buf, W1: InOut buf` let W1
    // overwrite the buffer while R0 still read it. R0 is held running; W1 must stay pending
    // until R0 ends, and a blind `Output` after W1 must wait for W1 (which read the buffer).
    let r = rig(&[0, 1, 3], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let t = buf(A, 64);
    let w0 = b.submit_next_level(&chip(1), args(&[(t, InOut)]), &cfg(), w(0), None).unwrap();
    let r0 = b.submit_next_level(&chip(1), args(&[(t, Input)]), &cfg(), w(1), None).unwrap();
    let w1 = b.submit_next_level(&chip(1), args(&[(t, InOut)]), &cfg(), w(3), None).unwrap();
    let mut w1_producers = snap(e, w1).producers;
    w1_producers.sort();
    assert_eq!(w1_producers, vec![w0, r0], "W1 orders after W0 and after R0");
    let blind = b.submit_next_level(&chip(1), args(&[(t, Output)]), &cfg(), w(0), None).unwrap();
    assert_eq!(snap(e, blind).producers, vec![w1]);
    h.release(w0, Action::Succeed);
    h.wait_running(r0, 0);
    assert_eq!(snap(e, w1).state, TaskState::Pending, "W1 waits while R0 runs");
    h.release(r0, Action::Succeed);
    h.release(w1, Action::Succeed);
    h.release(blind, Action::Succeed);
    let run = b.close();
    assert!(wait(e, run).is_completed());
    assert!(h.position(Event::End(r0, 0)) < h.position(Event::Start(w1, 0)));
    assert!(h.position(Event::End(w1, 0)) < h.position(Event::Start(blind, 0)));
}

#[test]
fn a_finished_reader_no_longer_holds_back_a_later_write() {
    // The outer scope keeps both readers' slots until close; only the running one may still
    // hold back the write.
    let r = rig(&[0, 1, 3], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let t = buf(A, 64);
    let done = b.submit_next_level(&chip(1), args(&[(t, Input)]), &cfg(), w(0), None).unwrap();
    let running = b.submit_next_level(&chip(1), args(&[(t, Input)]), &cfg(), w(1), None).unwrap();
    h.release(done, Action::Succeed);
    // The pass that processes a completion retires the task's reads in its last step. Passes
    // run one at a time, so once a later completion (a probe's) was processed, that pass has
    // ended and the reader entry is gone.
    eventually("the finished reader released itself", || snap(e, done).fanout_released >= 1);
    let probe = b.submit_next_level(&chip(1), args(&[]), &cfg(), w(0), None).unwrap();
    h.release(probe, Action::Succeed);
    eventually("the probe completed", || snap(e, probe).state == TaskState::Completed);
    let write = b.submit_next_level(&chip(1), args(&[(t, Output)]), &cfg(), w(3), None).unwrap();
    assert_eq!(snap(e, write).producers, vec![running], "only the running reader");
    h.release(running, Action::Succeed);
    h.release(write, Action::Succeed);
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn a_blind_write_takes_no_edge_to_a_finished_in_place_update_but_waits_for_a_running_one() {
    // An in-place update's writer entry orders later writes until the update is reclaimed (the
    // outer scope keeps it until close); once the update completed, a blind write of the same
    // bytes needs neither an edge to it nor a hold on its slot.
    let r = rig(&[0, 1, 3], 0);
    let (h, e) = (&r.h, &r.e);
    let mut b = e.begin_run().unwrap();
    let t = buf(A, 64);
    let done = b.submit_next_level(&chip(1), args(&[(t, InOut)]), &cfg(), w(0), None).unwrap();
    h.release(done, Action::Succeed);
    eventually("the update completed", || snap(e, done).state == TaskState::Completed);
    let held = snap(e, done).fanout_total;
    let blind = b.submit_next_level(&chip(1), args(&[(t, Output)]), &cfg(), w(1), None).unwrap();
    assert_eq!(snap(e, blind).producers, vec![], "no edge to the finished update");
    assert_eq!(snap(e, done).fanout_total, held, "the finished update is not held by the write");
    // A running update is still waited for.
    let running = b.submit_next_level(&chip(1), args(&[(t, InOut)]), &cfg(), w(0), None).unwrap();
    let after = b.submit_next_level(&chip(1), args(&[(t, Output)]), &cfg(), w(3), None).unwrap();
    assert_eq!(snap(e, after).producers, vec![running]);
    for task in [blind, running, after] {
        h.release(task, Action::Succeed);
    }
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn a_read_after_a_strided_write_still_waits_for_the_writer_of_the_bytes_in_its_gaps() {
    // A 4×8 f32 matrix: row 0 is written densely, then the even columns through a strided view
    // whose bounding range covers row 0; a read of row 0 needs both writers (the odd columns of
    // row 0 are only the first one's).
    let r = rig(&[0, 1, 3], 0);
    let (h, e) = (&r.h, &r.e);
    let m = simpler_types::Tensor::external(A, &[4, 8], DataType::Float32).unwrap();
    let row = m.view(&[1, 8], &[0, 0]).unwrap();
    let even = m.slice(1, 0, 8, 2).unwrap();
    let mut b = e.begin_run().unwrap();
    let first = b.submit_next_level(&chip(1), args(&[(row, Output)]), &cfg(), w(0), None).unwrap();
    let second =
        b.submit_next_level(&chip(1), args(&[(even, Output)]), &cfg(), w(1), None).unwrap();
    let read = b.submit_next_level(&chip(1), args(&[(row, Input)]), &cfg(), w(3), None).unwrap();
    let mut producers = snap(e, read).producers;
    producers.sort();
    assert_eq!(producers, vec![first, second]);
    for t in [first, second, read] {
        h.release(t, Action::Succeed);
    }
    let run = b.close();
    assert!(wait(e, run).is_completed());
}
