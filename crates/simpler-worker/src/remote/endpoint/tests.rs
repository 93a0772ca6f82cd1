//! Tests of rank 0's side of a remote session.

use simpler_types::{CallConfig, RunId, TaskArgs, TaskId};

use super::super::error::ProtocolViolation;
use super::super::frames::DecodeError;
use super::super::transport::detached;
use super::*;

/// Runs task 0 of run 1 (graph 0, no arguments, callable `callable`) through `s`.
fn call(s: &mut Session, callable: CallableId) -> Result<Outcome, RemoteError> {
    let (config, args) = (CallConfig::default(), TaskArgs::new());
    let member = DispatchedMember {
        task: TaskId::new(RunId::from_raw(1).unwrap(), 0),
        member: 0,
        group_size: 1,
        callable: &callable,
        config: &config,
        args: args.view(),
    };
    s.call(0, &member)
}

/// An open session of rank 0 with `rank`, over `t`.
fn session(t: &Arc<Transport>, rank: i32) -> Arc<Mutex<Session>> {
    let inbox = t.open_inbox(rank).unwrap();
    t.watch(rank, Duration::from_secs(1));
    Arc::new(Mutex::new(Session {
        transport: Arc::clone(t),
        rank,
        nonce: 1,
        host: format!("host{rank}"),
        liveness: Duration::from_secs(10),
        inbox,
        failed: None,
        open: true,
        pings_mark: Some(0),
        left_seen: std::cell::Cell::new(None),
    }))
}

#[test]
fn a_remote_run_that_failed_without_a_failed_task_fails_the_path_as_a_local_child_run_does() {
    use super::super::error::ArgumentsProblem;
    let run = |kind| RemoteRunFailure::Run { kind, message: String::new() };
    // The task's own doing: its graph's build, or more written bytes than a reply carries.
    assert!(fails_the_task(&run(RemoteRunKind::SubmissionFailed)));
    assert!(fails_the_task(&RemoteRunFailure::ReplyTooLarge { bytes: 2, limit: 1 }));
    // The path's: no failed task to blame.
    for kind in [
        RemoteRunKind::EndpointFailed,
        RemoteRunKind::DeviceFault,
        RemoteRunKind::Timeout,
        RemoteRunKind::Capacity,
        RemoteRunKind::Aborted,
        RemoteRunKind::CleanupFailed,
        RemoteRunKind::Internal,
        RemoteRunKind::Refused,
        RemoteRunKind::TaskFailed,
    ] {
        assert!(!fails_the_task(&run(kind)), "{kind:?}");
    }
    assert!(!fails_the_task(&RemoteRunFailure::UnknownOrdinal { ordinal: 3 }));
    let unpacked = ArgumentsProblem::NoBuffer { tensor: 0 };
    assert!(!fails_the_task(&RemoteRunFailure::Arguments(unpacked)));
}

#[test]
fn a_start_unwinding_after_a_session_was_adopted_still_shuts_that_session_down() {
    let (t, wire) = detached::rank0(2);
    let t = Arc::new(t);
    // Rank 1 as a serving rank: answers `Hello` with an empty manifest, then reports
    // whether the session it accepted is ever closed.
    let rank = std::thread::spawn(move || {
        let Some((1, Packet::Hello { session })) = wire.sent(Duration::from_secs(10)) else {
            return Err("no Hello sent to rank 1");
        };
        let manifest =
            Packet::Manifest { session, host: "host1".into(), entries: vec![], start_error: None };
        wire.answer(1, &manifest);
        let Some((1, Packet::Accept)) = wire.sent(Duration::from_secs(10)) else {
            return Err("the session was not accepted");
        };
        let Some((1, Packet::Shutdown)) = wire.sent(Duration::from_secs(10)) else {
            return Err("the accepted session was never shut down");
        };
        wire.answer(1, &Packet::ShutdownDone { errors: vec![] });
        Ok(())
    });
    let spec = RemoteL3 { transport: Arc::clone(&t), rank: 1, liveness: Duration::from_secs(10) };
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut adoption = Adoption::new(std::iter::empty());
        let started =
            adoption.start(WorkerId(0), spec, None, Duration::from_secs(10), "L4 / child 0");
        assert!(started.is_ok(), "{started:?}");
        // A later child's start panics while the adoption still holds the session.
        panic!("a later child's start panicked");
    }));
    assert!(unwound.is_err());
    assert_eq!(rank.join().unwrap(), Ok(()));
}

/// Ranks 1 and 2 of `wire` accept the sessions rank 0 opens with them; returns the ranks.
fn accept_two(wire: &detached::Wire) -> Result<Vec<i32>, String> {
    let mut sessions = Vec::new();
    for rank in [1, 2] {
        let Some((r, Packet::Hello { session })) = wire.sent(Duration::from_secs(10)) else {
            return Err(format!("no Hello sent to rank {rank}"));
        };
        let host = format!("host{r}");
        let manifest = Packet::Manifest { session, host, entries: vec![], start_error: None };
        wire.answer(r, &manifest);
        let Some((_, Packet::Accept)) = wire.sent(Duration::from_secs(10)) else {
            return Err(format!("rank {r}'s session was not accepted"));
        };
        sessions.push(r);
    }
    Ok(sessions)
}

/// Ranks 1 and 2 of `wire` as serving ranks that confirm nothing until both got their
/// `Shutdown`: shut down one after the other, the second `Shutdown` would wait for the first
/// rank's whole budget.
fn ranks_confirming_after_both_shutdowns(
    wire: detached::Wire,
) -> std::thread::JoinHandle<Result<(), String>> {
    std::thread::spawn(move || {
        let sessions = accept_two(&wire)?;
        let mut shut = Vec::new();
        while shut.len() < 2 {
            match wire.sent(Duration::from_secs(10)) {
                Some((r, Packet::Shutdown)) => shut.push(r),
                Some(_) => {}
                None => return Err(format!("only {shut:?} got a Shutdown before any confirmed")),
            }
        }
        for r in sessions {
            wire.answer(r, &Packet::ShutdownDone { errors: vec![] });
        }
        Ok(())
    })
}

/// An adoption of ranks 1 and 2 of `t` as children 0 and 1.
fn adopt_two(t: &Arc<Transport>) -> Adoption {
    let mut adoption = Adoption::new(std::iter::empty());
    for rank in [1, 2] {
        let spec = RemoteL3 { transport: Arc::clone(t), rank, liveness: Duration::from_secs(10) };
        let child = WorkerId(rank as u32 - 1);
        let started = adoption.start(child, spec, None, Duration::from_secs(10), "L4");
        assert!(started.is_ok(), "{started:?}");
    }
    adoption
}

#[test]
fn a_rollback_sends_every_shutdown_before_it_waits_for_any_confirmation() {
    let (t, wire) = detached::rank0(3);
    let t = Arc::new(t);
    let ranks = ranks_confirming_after_both_shutdowns(wire);
    let adoption = adopt_two(&t);
    let mut rollback = Vec::new();
    adoption.rollback(&mut rollback, "L4");
    assert_eq!(ranks.join().unwrap(), Ok(()));
    assert!(rollback.is_empty(), "{rollback:?}");
}

#[test]
fn endpoints_dropped_unstarted_send_every_shutdown_before_they_wait_for_any_confirmation() {
    // An engine that failed to start drops its endpoints one after the other.
    let (t, wire) = detached::rank0(3);
    let t = Arc::new(t);
    let ranks = ranks_confirming_after_both_shutdowns(wire);
    let residue = Arc::new(Mutex::new(Vec::new()));
    let endpoints = adopt_two(&t).into_endpoints(&residue);
    assert_eq!(endpoints.len(), 2);
    for endpoint in endpoints {
        drop(endpoint);
    }
    assert_eq!(ranks.join().unwrap(), Ok(()));
    assert!(residue.lock().is_empty(), "{:?}", residue.lock());
}

#[test]
fn a_left_during_shutdown_accounts_for_the_close_only_when_it_says_shutdown_done_was_lost() {
    // What closing rank 1's session reports when the rank answers `Shutdown` with `Left`.
    let residue = |cause: LeftCause| {
        let (t, wire) = detached::rank0(2);
        let t = Arc::new(t);
        let s = session(&t, 1);
        let rank = std::thread::spawn(move || {
            let Some((1, Packet::Shutdown)) = wire.sent(Duration::from_secs(10)) else {
                return Err("no Shutdown sent to rank 1");
            };
            wire.answer(1, &Packet::Left { session: 1, cause });
            Ok(())
        });
        let residue = s.lock().shutdown(WorkerId(0));
        assert_eq!(rank.join().unwrap(), Ok(()));
        residue
    };
    let part = TeardownPart::Remote { child: WorkerId(0), rank: 1, host: "host1".into() };
    let lost = LeftCause::ShutdownDoneLost {
        lost: Box::new(LeftCause::Mpi { op: "MPI_Isend (drill)", code: -1 }),
        close: None,
    };
    match residue(lost.clone()).as_slice() {
        [
            Residue::Failed {
                what,
                cause: TeardownCause::Remote(RemoteError::Left { rank: 1, cause }),
            },
        ] => assert_eq!((what, cause), (&part, &lost)),
        other => panic!("a lost ShutdownDone gave {other:?}"),
    }
    let damaged = LeftCause::Protocol(ProtocolViolation::Malformed(DecodeError::Version {
        found: 99,
        expected: 9,
    }));
    match residue(damaged.clone()).as_slice() {
        [Residue::Leaked(leak)] => {
            let left = RemoteError::Left { rank: 1, cause: damaged.clone() };
            assert_eq!(leak.at, [part]);
            assert_eq!(leak.what, Leaked::RemoteLost(left));
        }
        other => panic!("a Left for a damaged frame gave {other:?}"),
    }
    // The same `Left`, met before the close (a task's wait saw it), is judged alike.
    let (t, _wire) = detached::rank0(2);
    let t = Arc::new(t);
    let s = session(&t, 1);
    let left = RemoteError::Left { rank: 1, cause: damaged };
    s.lock().failed = Some(left.clone());
    match s.lock().shutdown(WorkerId(0)).as_slice() {
        [Residue::Leaked(leak)] => assert_eq!(leak.what, Leaked::RemoteLost(left)),
        other => panic!("a Left met before the close gave {other:?}"),
    }
}

#[test]
fn a_rank_the_commit_could_not_reach_fails_its_tasks_at_once_naming_the_lost_commit() {
    let (t, wire) = detached::rank0(3);
    let t = Arc::new(t);
    let sessions = vec![session(&t, 1), session(&t, 2)];
    let children = RemoteChildren {
        sessions: sessions.clone(),
        graphs: Arc::default(),
        ..RemoteChildren::default()
    };
    let id = crate::handle::Registry::closure_id(1, 1, CallableKind::Graph);
    // Both ranks are ready; the transport fails before the commits go out.
    let ranks = std::thread::spawn(move || {
        for _ in 0..2 {
            let Some((rank, Packet::Prepare { seq, .. })) = wire.sent(Duration::from_secs(10))
            else {
                return Err("no Prepare sent");
            };
            if rank == 2 {
                wire.cut();
            }
            wire.answer(rank, &Packet::Prepared { seq, refusal: None });
        }
        Ok(())
    });
    let handle = crate::CallableHandle { worker: 1, seq: 1, id };
    let registered = children.register_graph("late", || handle);
    assert_eq!(ranks.join().unwrap(), Ok(()));
    assert!(registered.is_ok(), "{registered:?}");
    for (rank, s) in [(1, &sessions[0]), (2, &sessions[1])] {
        match call(&mut s.lock(), id) {
            Err(RemoteError::CommitLost { rank: r, graph, ordinal: 0, cause })
                if r == rank && graph == "late" =>
            {
                assert_eq!(*cause, RemoteError::Finalized);
            }
            other => panic!("a task on rank {rank}, which missed the commit: {other:?}"),
        }
    }
}

#[test]
fn a_task_wait_ends_when_the_ranks_pongs_say_it_left_the_session_and_no_left_came() {
    let (t, wire) = detached::rank0(2);
    let t = Arc::new(t);
    let s = session(&t, 1);
    let liveness = Duration::from_millis(500);
    s.lock().liveness = liveness;
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let callable = crate::handle::Registry::closure_id(1, 1, CallableKind::Graph);
        let _ = tx.send(call(&mut s.lock(), callable));
    });
    let Some((1, Packet::Task { .. })) = wire.sent(Duration::from_secs(10)) else {
        panic!("no task sent to rank 1");
    };
    // The rank answers pings while it serves this session (1): the task waits on, well past the
    // liveness budget, since nothing says it will not be answered.
    let mut nonce = 0;
    let mut pong_for = |session: u64, d: Duration| {
        let until = std::time::Instant::now() + d;
        while std::time::Instant::now() < until {
            nonce += 1;
            wire.pong(1, nonce, session);
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    pong_for(1, liveness * 3);
    assert!(rx.try_recv().is_err(), "a task on a rank serving its session stopped waiting");
    // Then it serves no session, and its `Left` never arrives: the wait ends within about
    // the budget, however long the rank keeps answering.
    pong_for(0, liveness * 4);
    let ended = rx.recv_timeout(Duration::from_secs(10)).expect("the task wait never ended");
    match ended {
        Err(RemoteError::SessionEnded {
            rank: 1, session: 1, serving: 0, task: Some(_), ..
        }) => {}
        other => panic!("a task on a rank that left its session gave {other:?}"),
    }
    waiter.join().unwrap();
}

#[test]
fn a_lost_health_frame_fails_the_session_so_later_tasks_never_reach_the_rank() {
    // A health frame too long to be one is a lost frame: every later task fails on it before
    // its `Task` is sent (the rank would run it for nothing).
    let (t, wire) = detached::rank0(2);
    let t = Arc::new(t);
    let s = session(&t, 1);
    wire.lose_incoming(1, RemoteError::HealthFrameTooLarge { rank: 1, bytes: 64, limit: 19 });
    let graph = crate::handle::Registry::closure_id(1, 1, CallableKind::Graph);
    let first = call(&mut s.lock(), graph);
    assert!(matches!(first, Err(RemoteError::HealthFrameTooLarge { .. })), "{first:?}");
    let second = call(&mut s.lock(), graph);
    assert!(matches!(second, Err(RemoteError::HealthFrameTooLarge { .. })), "{second:?}");
    let sent = wire.sent(Duration::from_millis(200));
    assert!(sent.is_none(), "a task was sent to a failed session: {sent:?}");
}

#[test]
fn an_endpoint_dropped_once_its_start_reached_the_engine_shuts_down_only_its_own_session() {
    // An endpoint thread that unwound drops its endpoint while the engine still uses the
    // others: their sessions must stay open.
    let (t, wire) = detached::rank0(3);
    let t = Arc::new(t);
    let ranks = std::thread::spawn(move || {
        accept_two(&wire)?;
        let mut shut = Vec::new();
        while let Some((r, p)) = wire.sent(Duration::from_secs(2)) {
            if matches!(p, Packet::Shutdown) {
                shut.push(r);
                wire.answer(r, &Packet::ShutdownDone { errors: vec![] });
            }
        }
        Ok::<_, String>(shut)
    });
    let residue = Arc::new(Mutex::new(Vec::new()));
    let mut endpoints = adopt_two(&t).into_endpoints(&residue);
    for e in &mut endpoints {
        e.on_thread_start();
    }
    let second = endpoints.pop().expect("two endpoints");
    drop(endpoints);
    assert_eq!(ranks.join().unwrap(), Ok(vec![1]), "only the dropped endpoint's rank");
    assert!(second.session.lock().open, "the other session was shut down under its engine");
}
