//! Tests of the transport's shared state: lost frames and their sessions.
use super::super::error::ProtocolViolation;
use super::super::frames::DecodeError;
use super::inbox::MAX_BACKLOG_BYTES;
use super::*;

#[test]
fn a_frame_that_does_not_decode_fails_the_waits_on_its_rank() {
    let (t, _wire) = detached::rank0(3);
    let shared = &t.shared;
    let rx = t.open_inbox(1).unwrap();
    route(shared, 1, Packet::Hello { session: 1 }.encode());
    route(shared, 1, vec![0xff; 5]);
    // The MPI thread only hands the bytes on: the thread that takes them decodes them.
    assert!(shared.lost_frame(1).is_none());
    let first = rx.recv_timeout(Duration::from_secs(5));
    assert!(matches!(first, Ok(Packet::Hello { session: 1 })), "{first:?}");
    let second = rx.recv_timeout(Duration::from_secs(5));
    assert!(matches!(second, Err(RecvTimeoutError::Timeout)), "{second:?}");
    // Five bytes: a version of 0xffff, which this build does not speak.
    let malformed = ProtocolViolation::Malformed(DecodeError::Version {
        found: 0xffff,
        expected: super::super::frames::VERSION,
    });
    assert_eq!(shared.lost_frame(1), Some(RemoteError::Protocol { rank: 1, violation: malformed }));
    assert!(shared.lost_frame(2).is_none(), "only that rank's waits fail");
    assert!(shared.lost_frame(7).is_none());
}

#[test]
fn a_send_lost_after_its_session_ended_does_not_fail_the_next_session() {
    // A serving rank's last frame of a session (its `Left`, say) is queued, the session
    // returns, the next one opens the inbox again, and only then does MPI refuse the frame:
    // that loss concerns the ended session, not the new one.
    let (t, wire) = detached::rank0(2);
    let rx = t.open_inbox(1).unwrap();
    t.send(1, &Packet::Accept).unwrap();
    let (to, ended) = wire.sent_under(Duration::from_secs(5)).expect("queued");
    assert_eq!((to, ended), (1, t.shared.opening(1)), "a send is queued under the open inbox");
    t.close_inbox(1, &rx);
    let _rx = t.open_inbox(1).unwrap();
    t.send(1, &Packet::Accept).unwrap();
    let (_, current) = wire.sent_under(Duration::from_secs(5)).expect("queued");
    assert_ne!(current, ended, "the next session's sends are queued under another opening");
    lose(&t.shared, 1, Way::Out(ended), REFUSED_BY_DRILL);
    assert!(t.lost_frame(1).is_none(), "a loss of the ended session failed the new one");
    lose(&t.shared, 1, Way::Out(current), REFUSED_BY_DRILL);
    assert_eq!(t.lost_frame(1), Some(REFUSED_BY_DRILL));
    // A receive's loss always concerns the rank's current session.
    lose(&t.shared, 1, Way::In, REFUSED_BY_DRILL);
    assert_eq!(t.lost_count(1), 2);
}

#[test]
fn a_wait_begun_after_a_loss_fails_with_the_first_frame_lost_since() {
    let shared = Shared::new(2);
    let refused = |code| RemoteError::Mpi { op: "MPI_Isend", code };
    shared.lose_frame(1, None, refused(1));
    // A wait whose request went out now: the loss before it does not concern it.
    let mark = shared.lost_count(1);
    assert_eq!(shared.lost_since(1, mark), None);
    shared.lose_frame(1, None, refused(2));
    shared.lose_frame(1, None, refused(3));
    assert_eq!(shared.lost_since(1, mark), Some(refused(2)));
    assert_eq!(shared.lost_since(1, 0), Some(refused(1)), "a wait from the start: the first");
    // More lost since the mark than are kept: the earliest kept.
    for code in 4..40 {
        shared.lose_frame(1, None, refused(code));
    }
    let earliest_kept = 40 - KEPT_LOSSES as i32;
    assert_eq!(shared.lost_since(1, mark), Some(refused(earliest_kept)));
    assert_eq!(shared.lost_since(1, 0), Some(refused(1)));
    assert_eq!(shared.lost_since(1, 39), None);
}

#[test]
fn a_frame_reaches_its_inbox_as_the_bytes_received_without_a_copy() {
    let shared = Shared::new(2);
    let (tx, rx) = mpsc::channel();
    shared.inboxes.lock()[1] = Inbox::Open(tx);
    let frame = Packet::Hello { session: 1 }.encode();
    let at = frame.as_ptr();
    route(&shared, 1, frame);
    let received = rx.try_recv().unwrap();
    assert_eq!(received.bytes.as_ptr(), at);
}

#[test]
fn the_backlog_of_a_closed_inbox_keeps_the_newest_frames_within_its_bytes() {
    let shared = Shared::new(2);
    let big = MAX_BACKLOG_BYTES / 4;
    for i in 0..8u8 {
        route(&shared, 1, vec![i; big]);
    }
    let inboxes = shared.inboxes.lock();
    let Inbox::Closed(backlog) = &inboxes[1] else { panic!("the inbox is closed") };
    assert!(backlog.bytes <= MAX_BACKLOG_BYTES, "{} bytes kept", backlog.bytes);
    assert_eq!(backlog.frames.back().map(|f| f[0]), Some(7), "the newest frame is kept");
    assert_eq!(backlog.frames.len(), 4);
}

#[test]
fn a_malformed_frame_from_before_the_session_does_not_fail_it() {
    // It arrived while no session was open, so it belongs to none of this session's waits: the
    // session skips it and its waits go on.
    let (t, _wire) = detached::rank0(2);
    route(&t.shared, 1, vec![0xff; 5]);
    route(&t.shared, 1, Packet::Hello { session: 1 }.encode());
    let rx = t.open_inbox(1).unwrap();
    let first = rx.recv_timeout(Duration::from_secs(5));
    assert!(matches!(first, Err(RecvTimeoutError::Timeout)), "{first:?}");
    assert!(t.lost_frame(1).is_none(), "a loss of no session of this one");
    let second = rx.recv_timeout(Duration::from_secs(5));
    assert!(matches!(second, Ok(Packet::Hello { session: 1 })), "{second:?}");
}
