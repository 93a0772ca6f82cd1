//! `loom` models of the core protocols (run with
//! `RUSTFLAGS="--cfg simpler_loom" cargo test -p simpler-sched --release --lib loom`).
//!
//! Each model drives the single-slot steps of `task_protocol` or the run fence of `run_record`
//! from several threads and checks the protocol's promise under every interleaving loom
//! explores.

use std::sync::Arc;

use loom::sync::atomic::AtomicUsize;
use loom::thread;
use simpler_types::{
    CallableId, CallableKind, CallableNamespace, CancelReason, FailureMechanism, RunFailure, RunId,
    RunState, SlotId, TaskFailure, TaskId, TaskState,
};

use crate::held_ready::{HeldReady, Holding, hand_over_held, publish_ready, take};
use crate::inbox::{
    IdleDriver, Inbox, InboxBatch, ReadyEntry, WorkerSlot, deliver_ready, drive, locked_then_drive,
};
use crate::outcome::RunOutcome;
use crate::run_record::RunRecord;
use crate::slot::{Edge, Head, Route, TaskSlot};
use crate::sync::{Mutex, MutexGuard, Ordering};
use crate::task_protocol::{Attach, Claim, ClaimCause, MemberDone, OnBuilding, Publish};

const CALLABLE: CallableId =
    CallableId::new([7; 32], CallableKind::Chip, CallableNamespace::LocalChip);

fn model(f: impl Fn() + Sync + Send + 'static) {
    model_bounded(3, f);
}

fn model_bounded(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b.check(f);
}

fn run() -> Arc<RunRecord> {
    Arc::new(RunRecord::new(RunId::FIRST, tracing::Span::none()))
}

/// A slot initialized as task `seq` in `state` (via the legal transitions).
fn task(run: &Arc<RunRecord>, index: u32, state: TaskState) -> (Arc<TaskSlot>, SlotId, TaskId) {
    let slot = Arc::new(TaskSlot::default());
    let id = SlotId::new(index, 1);
    let task = TaskId::new(run.id, index);
    slot.init_task(
        Head { id, task, callable: CALLABLE },
        Arc::clone(run),
        Route::Single { worker: 0 },
        1,
    );
    match state {
        TaskState::Building => {}
        TaskState::Ready | TaskState::Running => {
            assert_eq!(
                slot.publish(id, &[], 0, false, false),
                Publish::Ready(Route::Single { worker: 0 })
            );
            if state == TaskState::Running {
                assert!(slot.claim_dispatch(id));
            }
        }
        other => unreachable!("model setup for {other:?}"),
    }
    (slot, id, task)
}

fn failure(task: TaskId, message: &str) -> Arc<TaskFailure> {
    Arc::new(TaskFailure::new(task, CALLABLE, FailureMechanism::TaskFailed, message))
}

/// Two producers complete while their consumer attaches and publishes: the consumer becomes
/// `Ready` exactly once (no lost fanin release, no double queueing).
#[test]
fn loom_publication_races_two_completing_producers_and_readies_once() {
    model(|| {
        let r = run();
        let (p1, id1, _) = task(&r, 1, TaskState::Running);
        let (p2, id2, _) = task(&r, 2, TaskState::Running);
        let (c, idc, tc) = task(&r, 3, TaskState::Building);
        let readied = Arc::new(AtomicUsize::new(0));

        let producers: Vec<_> = [(p1.clone(), id1), (p2.clone(), id2)]
            .into_iter()
            .map(|(p, id)| {
                let (c, readied) = (c.clone(), readied.clone());
                thread::spawn(move || {
                    let (mut consumers, mut releases) = (Vec::new(), Vec::new());
                    let done = p.complete_member(id, 0, None, &mut consumers, &mut releases);
                    assert!(matches!(done, MemberDone::Finished { failure: None, .. }));
                    for cid in consumers {
                        if let crate::task_protocol::Fanin::Ready(_) = c.release_fanin(cid) {
                            readied.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();

        let me = Edge { slot: idc, task: tc };
        let mut attached = Vec::new();
        let mut live = 0;
        for (p, id) in [(&p1, id1), (&p2, id2)] {
            match p.attach(id, me) {
                Attach::Live(t) => {
                    live += 1;
                    attached.push(Edge { slot: id, task: t });
                }
                Attach::Finished(t) => attached.push(Edge { slot: id, task: t }),
                other => panic!("unexpected attach result {other:?}"),
            }
        }
        if let Publish::Ready(_) = c.publish(idc, &attached, live, false, false) {
            readied.fetch_add(1, Ordering::SeqCst);
        }
        for t in producers {
            t.join().unwrap();
        }
        assert_eq!(readied.load(Ordering::SeqCst), 1, "consumer readied exactly once");
        assert_eq!(c.state.get(idc), Some(TaskState::Ready));
    });
}

/// A producer fails while its consumer attaches and publishes: the consumer ends `Failed`, and
/// exactly one side (the failing producer's propagation or the submitter) owns its
/// propagation, so its references are released exactly once.
#[test]
fn loom_publication_races_a_failing_producer_and_propagates_once() {
    model(|| {
        let r = run();
        let (p, idp, tp) = task(&r, 1, TaskState::Running);
        let (c, idc, tc) = task(&r, 2, TaskState::Building);
        let owners = Arc::new(AtomicUsize::new(0));

        let producer = {
            let (p, c, owners) = (p.clone(), c.clone(), owners.clone());
            thread::spawn(move || {
                let (mut consumers, mut releases) = (Vec::new(), Vec::new());
                let f = failure(tp, "boom");
                let done =
                    p.complete_member(idp, 0, Some(f.clone()), &mut consumers, &mut releases);
                assert!(matches!(done, MemberDone::Finished { failure: Some(_), .. }));
                for cid in consumers {
                    let mut more = Vec::new();
                    let claim = c.claim_failure(
                        cid,
                        ClaimCause::Poison(&f),
                        OnBuilding::Defer,
                        false,
                        &mut more,
                        &mut Vec::new(),
                    );
                    if claim == Claim::Owned {
                        owners.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        };

        let me = Edge { slot: idc, task: tc };
        let (attached, root) = match p.attach(idp, me) {
            Attach::Live(t) => (Edge { slot: idp, task: t }, None),
            Attach::Failed(t, f) => (Edge { slot: idp, task: t }, Some(f)),
            other => panic!("unexpected attach result {other:?}"),
        };
        let live = u32::from(root.is_none());
        if c.publish(idc, &[attached], live, root.is_some(), false) == Publish::Poisoned {
            let mut releases = Vec::new();
            assert!(c.fail_at_submit(idc, root.as_ref(), &mut releases).is_some());
            owners.fetch_add(1, Ordering::SeqCst);
        }
        producer.join().unwrap();
        assert_eq!(c.state.get(idc), Some(TaskState::Failed));
        assert_eq!(owners.load(Ordering::SeqCst), 1, "propagation owned exactly once");
    });
}

/// The dispatch claim and a cancellation race on a ready task: exactly one wins.
#[test]
fn loom_dispatch_claim_races_cancellation_and_exactly_one_wins() {
    model(|| {
        let r = run();
        let (c, id, _) = task(&r, 1, TaskState::Ready);
        let dispatcher = {
            let c = c.clone();
            thread::spawn(move || c.claim_dispatch(id))
        };
        let claim = c.claim_failure(
            id,
            ClaimCause::Cancel(CancelReason::RunAborted),
            OnBuilding::Own,
            true,
            &mut Vec::new(),
            &mut Vec::new(),
        );
        let dispatched = dispatcher.join().unwrap();
        assert!(dispatched != (claim == Claim::Owned), "exactly one claim wins");
        let want = if dispatched { TaskState::Running } else { TaskState::Failed };
        assert_eq!(c.state.get(id), Some(want));
    });
}

/// Two threads release the last two references of a finished task: it is reclaimed once.
#[test]
fn loom_two_releasers_reclaim_once() {
    model(|| {
        let r = run();
        let (p, id, t) = task(&r, 1, TaskState::Running);
        // One consumer attached (fanout_total 2), then the task completes (self release).
        assert!(matches!(p.attach(id, Edge { slot: SlotId::new(9, 1), task: t }), Attach::Live(_)));
        let done = p.complete_member(id, 0, None, &mut Vec::new(), &mut Vec::new());
        assert!(matches!(done, MemberDone::Finished { reclaim: None, .. }));
        let other = {
            let p = p.clone();
            thread::spawn(move || p.release_ref(id).is_some())
        };
        let mine = p.release_ref(id).is_some();
        let theirs = other.join().unwrap();
        assert!(mine != theirs, "exactly one releaser reclaims");
        assert_eq!(p.state.get(id), Some(TaskState::Consumed));
    });
}

/// A consumer attaches while the producer's last reference is released: either the edge lands
/// first (the producer stays alive for the consumer) or attach sees `Consumed` and skips.
#[test]
fn loom_attach_races_reclamation_and_never_attaches_to_a_consumed_slot() {
    model(|| {
        let r = run();
        let (p, id, t) = task(&r, 1, TaskState::Running);
        let done = p.complete_member(id, 0, None, &mut Vec::new(), &mut Vec::new());
        assert!(matches!(done, MemberDone::Finished { reclaim: None, .. }));
        let releaser = {
            let p = p.clone();
            thread::spawn(move || p.release_ref(id).is_some())
        };
        let attach = p.attach(id, Edge { slot: SlotId::new(9, 1), task: t });
        let reclaimed = releaser.join().unwrap();
        match attach {
            Attach::Finished(_) => assert!(!reclaimed, "an attached consumer keeps its producer"),
            Attach::Skipped => assert!(reclaimed, "attach skips only a consumed producer"),
            other => panic!("unexpected attach result {other:?}"),
        }
    });
}

/// Close races the last two reclamations while a waiter sleeps: the fence fires exactly once
/// and the waiter wakes with the outcome.
#[test]
fn loom_run_fence_fires_once_and_wakes_the_waiter() {
    model(|| {
        let r = run();
        r.charge(SlotId::new(1, 1)).unwrap();
        r.charge(SlotId::new(2, 1)).unwrap();
        let fired = Arc::new(AtomicUsize::new(0));
        let reclaimers: Vec<_> = (0..2)
            .map(|_| {
                let (r, fired) = (r.clone(), fired.clone());
                thread::spawn(move || {
                    if r.reclaimed(1) {
                        fired.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        let waiter = {
            let r = r.clone();
            thread::spawn(move || r.wait_until(None))
        };
        if r.close() {
            fired.fetch_add(1, Ordering::SeqCst);
        }
        for t in reclaimers {
            t.join().unwrap();
        }
        assert_eq!(waiter.join().unwrap(), Some(RunOutcome::Completed));
        assert_eq!(fired.load(Ordering::SeqCst), 1, "the fence fires exactly once");
        assert_eq!(r.phase(), RunState::Completed);
    });
}

/// Two failures race into one run: the first stored wins, and every reader sees the same `Arc`.
#[test]
fn loom_first_run_failure_wins_and_every_waiter_sees_the_same_arc() {
    model(|| {
        let r = run();
        let recorder = {
            let r = r.clone();
            thread::spawn(move || {
                r.record(RunFailure::Submission { run: r.id, message: "a".into() })
            })
        };
        let waiter = {
            let r = r.clone();
            thread::spawn(move || r.wait_until(None))
        };
        let mine = r.record(RunFailure::Submission { run: r.id, message: "b".into() });
        let theirs = recorder.join().unwrap();
        assert!(mine != theirs, "exactly one failure is stored");
        r.close();
        let seen = waiter.join().unwrap();
        let (Some(RunOutcome::Failed(a)), Some(RunOutcome::Failed(b))) = (seen, r.outcome()) else {
            panic!("run did not fail");
        };
        assert!(Arc::ptr_eq(&a, &b), "every waiter gets the same Arc");
        let expected = if mine { "b" } else { "a" };
        assert!(matches!(&*a, RunFailure::Submission { message, .. } if message == expected));
    });
}

/// Two producers deliver two events each while each may find the scheduler lock taken, and the
/// scheduler thread runs a pass of its own (taking the lock blocking): every event is processed
/// by some lock holder before everyone returns (no event stranded in the inbox). Loom treats
/// mutex operations as sequentially consistent, so this model checks the drive loops'
/// re-checking; the SeqCst fences they rely on for weaker hardware are argued in the `inbox`
/// docs.
#[test]
fn loom_combining_never_strands_an_event() {
    model_bounded(4, || {
        let inbox = Arc::new(Inbox::default());
        // (events processed, scratch batch)
        let sched = Arc::new(Mutex::new((0usize, InboxBatch::default())));
        let pass = |state: &mut (usize, InboxBatch), inbox: &Inbox, own: bool| {
            // A real pass synchronizes with other threads before and after it drains the
            // inbox; give loom points to preempt the lock holder there.
            thread::yield_now();
            inbox.take(&mut state.1);
            state.0 += state.1.ready.len() + usize::from(own);
            state.1.ready.clear();
            thread::yield_now();
        };
        let deliver = move |inbox: Arc<Inbox>, sched: Arc<Mutex<(usize, InboxBatch)>>, i: u32| {
            match sched.try_lock() {
                Some(mut g) => pass(&mut g, &inbox, true),
                None => inbox
                    .push_ready(ReadyEntry { slot: SlotId::new(i, 1), route: Route::Group })
                    .unwrap(),
            }
            drive(&inbox, &sched, |g| pass(g, &inbox, false));
        };
        let producer = {
            let (inbox, sched) = (inbox.clone(), sched.clone());
            thread::spawn(move || {
                deliver(inbox.clone(), sched.clone(), 1);
                deliver(inbox, sched, 2);
            })
        };
        let scheduler_thread = {
            let (inbox, sched) = (inbox.clone(), sched.clone());
            thread::spawn(move || {
                locked_then_drive(
                    &inbox,
                    &sched,
                    |g| pass(g, &inbox, false),
                    |g| pass(g, &inbox, false),
                );
            })
        };
        deliver(inbox.clone(), sched.clone(), 3);
        producer.join().unwrap();
        scheduler_thread.join().unwrap();
        assert_eq!(sched.lock().0, 3, "every event was processed");
    });
}

/// A model scheduler: the count of ready tasks processed, and a pass's scratch batch.
type ModelSched = Arc<Mutex<(usize, InboxBatch)>>;

/// A fresh inbox, idle-driver role, held-entry buffer and model scheduler.
fn ready_model() -> (Arc<Inbox>, Arc<IdleDriver>, Arc<HeldReady>, ModelSched) {
    let sched = Arc::new(Mutex::new((0, InboxBatch::default())));
    (Arc::new(Inbox::default()), Arc::new(IdleDriver::default()), Arc::default(), sched)
}

/// A model pass: drains the inbox and counts the ready tasks it found.
fn count_pass(state: &mut (usize, InboxBatch), inbox: &Inbox) {
    inbox.take(&mut state.1);
    state.0 += state.1.ready.len();
    state.1.ready.clear();
}

/// A producer publishing `n` ready tasks that may be held or join (`held_ready::publish_ready`,
/// as the submit does), then returning without handing over, as a submitting thread that stops
/// submitting would. Its own pass counts only its own task, not the inbox, so that it rescues
/// nothing another thread owes.
fn publish_ready_tasks(
    inbox: &Inbox,
    driver: &IdleDriver,
    held: &HeldReady,
    sched: &ModelSched,
    n: u32,
) -> Holding {
    let mut holding = Holding::default();
    for i in 1..=n {
        // Alternating targets, so that the two endpoint threads of the models below each
        // decide for their own tasks (`held_ready`, step 11).
        let entry = ReadyEntry { slot: SlotId::new(i, 1), route: Route::Single { worker: i % 2 } };
        let own = |g: &mut MutexGuard<'_, (usize, InboxBatch)>, _| g.0 += 1;
        publish_ready(held, driver, inbox, sched, entry, true, &mut holding, own, |g| {
            count_pass(g, inbox)
        })
        .unwrap();
    }
    holding
}

/// Held tasks and idle endpoint threads (`held_ready`, steps 11–16): a producer publishes two
/// ready tasks and then stops, without handing over, as a submitting thread that stops
/// submitting would. Two endpoint threads each try once to take the role (taking held tasks,
/// looking once, giving the role back) and then park, so the role can change hands between the
/// producer's steps. Parking here is the mark and the last take of step 14, not the sleep.
/// Every task is processed by some pass before everyone returns, whether the producer ran it,
/// held it, or found a thread parked. (A thread taking the role a second time would rescue what
/// an earlier holder missed and hide exactly the defects this model is for.)
#[test]
fn loom_idle_driver_never_strands_a_ready_task() {
    model_bounded(3, || {
        let (inbox, driver, held, sched) = ready_model();
        let endpoint = |inbox: Arc<Inbox>,
                        driver: Arc<IdleDriver>,
                        held: Arc<HeldReady>,
                        sched: ModelSched,
                        who: WorkerSlot| {
            thread::spawn(move || {
                let mut taken = Vec::new();
                let count = |g: &mut MutexGuard<'_, (usize, InboxBatch)>| count_pass(g, &inbox);
                if driver.take() {
                    if take(&held, &inbox, &mut taken) {
                        drive(&inbox, &sched, count);
                    }
                    let _ = inbox.pending();
                    driver.give_back_then_drive(&inbox, &held, &mut taken, &sched, count);
                }
                held.parking(who);
                if take(&held, &inbox, &mut taken) {
                    drive(&inbox, &sched, count);
                }
            })
        };
        let threads = [0, 1].map(|i| {
            let who = WorkerSlot::NextLevel(i);
            endpoint(inbox.clone(), driver.clone(), held.clone(), sched.clone(), who)
        });
        publish_ready_tasks(&inbox, &driver, &held, &sched, 2);
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(sched.lock().0, 2, "every ready task was processed");
    });
}

/// A model scheduler that records the slots of the ready tasks it processes, in order.
type Recorded = Arc<Mutex<(Vec<u32>, InboxBatch)>>;

/// A model pass for [`Recorded`]: drains the inbox and records the ready tasks it found.
fn record_pass(state: &mut (Vec<u32>, InboxBatch), inbox: &Inbox) {
    inbox.take(&mut state.1);
    state.0.extend(state.1.ready.drain(..).map(|r| r.slot.index));
}

/// Held tasks judged per target (`held_ready`, steps 11 and 16). `parker` runs on a thread
/// beside a producer that publishes `routes` (slots 1, 2, …) as ready tasks that may be held
/// and then stops without handing over; returns the slots processed, in order, once both are
/// done.
fn per_target_model(
    routes: &[Route],
    parker: impl FnOnce(&HeldReady, &Inbox, &Recorded) + Send + 'static,
) -> Vec<u32> {
    let (inbox, driver, held, _) = ready_model();
    let sched: Recorded = Arc::new(Mutex::new((Vec::new(), InboxBatch::default())));
    let parker = {
        let (inbox, held, sched) = (inbox.clone(), held.clone(), sched.clone());
        thread::spawn(move || parker(&held, &inbox, &sched))
    };
    let mut holding = Holding::default();
    for (index, &route) in (1..).zip(routes) {
        let entry = ReadyEntry { slot: SlotId::new(index, 1), route };
        let own = |g: &mut MutexGuard<'_, (Vec<u32>, InboxBatch)>, e: ReadyEntry| {
            g.0.push(e.slot.index);
        };
        publish_ready(&held, &driver, &inbox, &sched, entry, true, &mut holding, own, |g| {
            record_pass(g, &inbox)
        })
        .unwrap();
    }
    parker.join().unwrap();
    std::mem::take(&mut sched.lock().0)
}

/// A parking endpoint thread's mark and last take (step 14), not the sleep.
fn park_and_take(held: &HeldReady, inbox: &Inbox, sched: &Recorded, who: WorkerSlot) {
    let mut taken = Vec::new();
    held.parking(who);
    if take(held, inbox, &mut taken) {
        drive(inbox, sched, |g| record_pass(g, inbox));
    }
}

/// NEXT_LEVEL thread 0 parks while thread 1 stays busy and never takes. The producer publishes
/// a task for thread 1, then one for thread 0. The task for the parked thread is processed
/// before everyone returns, whichever side saw the other; the one for the busy thread may stay
/// held (that thread takes it when it runs out of mail, parks or sees it stale).
#[test]
fn loom_a_task_for_a_parked_thread_is_not_held_behind_one_for_a_busy_thread() {
    model_bounded(3, || {
        let routes = [Route::Single { worker: 1 }, Route::Single { worker: 0 }];
        let processed = per_target_model(&routes, |held, inbox, sched| {
            park_and_take(held, inbox, sched, WorkerSlot::NextLevel(0));
        });
        // The first task is always held first, and every move takes all that is held.
        assert_eq!(processed, [1, 2], "the task for the parked thread stayed held");
    });
}

/// As above for a SUB thread that parks twice within the producer's steps (mark and take, then
/// mail unmarks it, then mark and take again), as a SUB worker that runs a task between two
/// idle spells does; its count, not a bit, decides. The producer publishes a task for a busy
/// NEXT_LEVEL thread, then two SUB tasks. Both SUB tasks are processed, after the first task.
#[test]
fn loom_sub_tasks_are_not_held_while_their_thread_parks_twice() {
    model_bounded(2, || {
        let sub = Route::Sub { size: 1 };
        let processed = per_target_model(&[Route::Single { worker: 1 }, sub, sub], |h, i, s| {
            park_and_take(h, i, s, WorkerSlot::Sub(0));
            h.unparked(WorkerSlot::Sub(0));
            park_and_take(h, i, s, WorkerSlot::Sub(0));
        });
        assert_eq!(processed, [1, 2, 3], "a SUB task stayed held while its thread slept");
    });
}

/// The submitter's own hand-over (`held_ready`, step 12) against a holder that gives the role
/// back meanwhile: the producer holds two tasks, then hands over (as at a full batch, a pending
/// publish or the end of submission). Every task is processed once, whoever took it.
#[test]
fn loom_handing_over_held_tasks_races_a_take_without_loss_or_duplicates() {
    model_bounded(3, || {
        let (inbox, driver, held, sched) = ready_model();
        assert!(driver.take());
        let holder = {
            let (inbox, driver, held, sched) =
                (inbox.clone(), driver.clone(), held.clone(), sched.clone());
            thread::spawn(move || {
                thread::yield_now();
                let mut taken = Vec::new();
                driver.give_back_then_drive(&inbox, &held, &mut taken, &sched, |g| {
                    count_pass(g, &inbox)
                });
            })
        };
        let mut holding = publish_ready_tasks(&inbox, &driver, &held, &sched, 2);
        hand_over_held(&held, &driver, &inbox, &sched, &mut holding, |g| count_pass(g, &inbox))
            .unwrap();
        holder.join().unwrap();
        assert_eq!(sched.lock().0, 2, "every ready task was processed exactly once");
    });
}

/// Joining a pending inbox (`inbox`, step 1's join): a producer delivers three ready tasks that
/// may be joined while another thread holds the scheduler lock for a pass of its own and drives
/// after it, so the later tasks can join an inbox that the first made pending instead of
/// driving. Every task is processed by some pass before everyone returns: a join rides on the
/// drain owed to the event that made the inbox pending.
#[test]
fn loom_joining_a_pending_inbox_never_strands_a_ready_task() {
    model_bounded(3, || {
        let (inbox, _, _, sched) = ready_model();
        let completing = {
            let (inbox, sched) = (inbox.clone(), sched.clone());
            thread::spawn(move || {
                let body = |g: &mut MutexGuard<'_, (usize, InboxBatch)>| {
                    thread::yield_now();
                    count_pass(g, &inbox);
                };
                locked_then_drive(&inbox, &sched, body, |g| count_pass(g, &inbox));
            })
        };
        for i in 1..=3 {
            // Alternating targets, so that the two endpoint threads of the models below each
            // decide for their own tasks (`held_ready`, step 11).
            let entry =
                ReadyEntry { slot: SlotId::new(i, 1), route: Route::Single { worker: i % 2 } };
            let own = |g: &mut MutexGuard<'_, (usize, InboxBatch)>, _| g.0 += 1;
            deliver_ready(&inbox, &sched, entry, true, own, |g| count_pass(g, &inbox)).unwrap();
        }
        completing.join().unwrap();
        assert_eq!(sched.lock().0, 3, "every ready task was processed");
    });
}
