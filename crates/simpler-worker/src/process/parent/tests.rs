//! Unit tests of the worker's side of a chip process: what is signalled once a process was
//! reaped, and replies that fail validation or break the protocol.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use rustix::process::{Pid, WaitOptions};
use simpler_device_a2a3::{Platform, RuntimeVariant};
use simpler_types::{DataType, TaskArgs, Tensor, WorkerId};

use super::super::wire::op;
use super::super::{ChildError, ProtocolFault, ReplyFault};
use super::{ChipInit, ChipProcess, Live, Mailbox, PAYLOAD_BYTES, ProcessOptions, Writer, spawn};
use crate::error::MemError;
use crate::process::mailbox::state;

thread_local! {
    /// Every pid whose process group `kill_group` signalled on this thread.
    pub(super) static SIGNALLED: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// A chip process around a running `/bin/true` (it ignores the chip arguments).
fn process_of_true() -> (ChipProcess, u32) {
    let (mailbox, fd) = Mailbox::create().expect("memfd");
    let child = spawn::spawn(Path::new("/bin/true"), 0, fd, None).expect("spawn /bin/true");
    let pid = child.id();
    (process_around(child, mailbox), pid)
}

fn process_around(child: std::process::Child, mailbox: Mailbox) -> ChipProcess {
    let pid = child.id();
    ChipProcess {
        chip: WorkerId(0),
        init: ChipInit {
            platform: Platform::A2a3Sim,
            runtime: RuntimeVariant::HostBuildGraph,
            device: 0,
            prewarm: None,
        },
        opts: Arc::new(ProcessOptions::default()),
        live: Some(Live { child, pid, mailbox }),
        generation: 1,
        failed: None,
        pinned: None,
        buffers: Default::default(),
        seq: 0,
        start_deadline: None,
        worker_started: None,
        held: HashMap::new(),
        digests: HashMap::new(),
        out: Writer::default(),
        reply: Vec::new(),
    }
}

/// A chip process whose process only sleeps, and a mapping of its mailbox for this test to
/// answer from as a hostile child would.
/// The script stays until the caller removes the directory returned (the shell opens it after
/// the exec).
fn process_answered_here(name: &str) -> (ChipProcess, Mailbox, std::path::PathBuf) {
    let (dir, script) = spawn::tests::script(name, "sleep.sh", "exec sleep 30");
    let (mailbox, fd) = Mailbox::create().expect("memfd");
    let peer = Mailbox::open(&fd, std::process::id()).expect("header is valid");
    let child = spawn::spawn(&script, 0, fd, None).expect("spawn");
    mailbox.set_quietly(state::IDLE);
    (process_around(child, mailbox), peer, dir)
}

/// Answers the next request on `peer` with `status`, `payload` and then the raw length field
/// `len`, when given.
fn answer_once(peer: &Mailbox, status: u32, payload: &[u8], len: Option<u32>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while peer.state() != state::REQUEST {
        assert!(std::time::Instant::now() < deadline, "no request came");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let (_, seq) = peer.request();
    peer.write_reply(status, seq, payload).expect("fits");
    if let Some(len) = len {
        peer.set_payload_len(len);
    }
    peer.publish(state::DONE);
}

#[test]
fn a_reply_whose_length_field_runs_past_the_mailbox_is_a_typed_failure_of_the_chip() {
    let (mut p, peer, dir) = process_answered_here("bad-length");
    let pid = p.pid().expect("live");
    let len = PAYLOAD_BYTES as u32 + 1;
    let e = std::thread::scope(|s| {
        s.spawn(|| answer_once(&peer, 0, b"", Some(len)));
        p.out.0.clear();
        p.call(op::LEDGER, "ledger", None).expect_err("a length beyond the area")
    });
    let fault = ReplyFault::Length { len, capacity: PAYLOAD_BYTES };
    assert!(
        matches!(&e, ChildError::BadReply { pid: q, operation: "ledger", fault: f, .. }
            if *q == pid && *f == fault),
        "{e:?}"
    );
    assert!(p.live.is_none(), "the process that sent it was not ended");
    assert!(p.reply.is_empty(), "bytes were copied: {}", p.reply.len());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reply_with_an_unknown_status_is_a_typed_failure_of_the_chip() {
    let (mut p, peer, dir) = process_answered_here("bad-status");
    let e = std::thread::scope(|s| {
        s.spawn(|| answer_once(&peer, 7, b"", None));
        p.out.0.clear();
        p.call(op::LEDGER, "ledger", None).expect_err("status 7")
    });
    let fault = ReplyFault::Status { status: 7 };
    assert!(matches!(&e, ChildError::BadReply { fault: f, .. } if *f == fault), "{e:?}");
    assert!(p.live.is_none(), "the process that sent it was not ended");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_process_reaped_elsewhere_is_dropped_without_a_signal() {
    let (mut p, pid) = process_of_true();
    // Reaped behind the `Child`'s back, as a `waitpid(-1)` elsewhere in the process would: from
    // here on the pid and its group id may belong to an unrelated process.
    let raw = Pid::from_raw(pid as i32).expect("pid > 0");
    rustix::process::waitpid(Some(raw), WaitOptions::empty()).expect("reap");
    assert!(p.exited().is_some(), "a child that cannot be waited for has ended");
    assert!(p.live.is_none());
    drop(p);
    SIGNALLED.with(|s| assert!(!s.borrow().contains(&pid), "signalled reaped pid {pid}"));
}

#[test]
fn a_process_reaped_elsewhere_is_not_signalled_by_a_kill_either() {
    let (mut p, pid) = process_of_true();
    let raw = Pid::from_raw(pid as i32).expect("pid > 0");
    rustix::process::waitpid(Some(raw), WaitOptions::empty()).expect("reap");
    // The path of a timeout, a protocol error or a drop: it must not signal a pid that may
    // name another process by now.
    p.kill();
    assert!(p.live.is_none());
    SIGNALLED.with(|s| assert!(!s.borrow().contains(&pid), "signalled reaped pid {pid}"));
}

/// A `Live` around a script (in a fresh temporary directory, returned) that sleeps `seconds`
/// and exits: a process that ends on its own a while later.
fn late_child(name: &str, seconds: &str) -> (Live, u32, std::path::PathBuf) {
    let (dir, script) = spawn::tests::script(name, "late.sh", &format!("sleep {seconds}"));
    let (mailbox, fd) = Mailbox::create().expect("memfd");
    let child = spawn::spawn(&script, 0, fd, None).expect("spawn");
    let pid = child.id();
    (Live { child, pid, mailbox }, pid, dir)
}

/// Waits until `pid` is reaped (within 10 s of `started`), calling `between` at each look.
fn wait_reaped(pid: u32, started: std::time::Instant, mut between: impl FnMut()) {
    let proc_entry = std::path::PathBuf::from(format!("/proc/{pid}"));
    let deadline = started + std::time::Duration::from_secs(10);
    // A zombie keeps its `/proc` entry: the entry goes only once the process is reaped.
    while proc_entry.exists() {
        assert!(std::time::Instant::now() < deadline, "process {pid} was never reaped");
        std::thread::sleep(std::time::Duration::from_millis(5));
        between();
    }
}

#[test]
fn a_process_that_outlives_the_reap_bound_is_reaped_by_a_thread_of_its_own() {
    // A process that ends on its own a while later stands for a killed one stuck in a device
    // call: the reap gives up at its bound and the process is still reaped once it ends.
    // It runs for 3 s, so that a reap returning within 2 s did not wait it out even on a
    // loaded machine.
    let (live, pid, dir) = late_child("reap", "3");
    let started = std::time::Instant::now();
    assert!(!live.reap_within(std::time::Duration::from_millis(20)), "it was still running");
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "the reap waited it out");
    wait_reaped(pid, started, || {});
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_process_that_outlives_the_reap_bound_with_no_reaper_thread_is_reaped_by_a_later_sweep() {
    // The system refuses the reaper thread: the reap still returns at its bound, and the
    // process is reaped by a sweep once it has ended.
    let (live, pid, dir) = late_child("unreaped", "3");
    spawn::tests::REAPER_REFUSED.with(|r| r.set(true));
    let started = std::time::Instant::now();
    let reaped = live.reap_within(std::time::Duration::from_millis(20));
    let returned_after = started.elapsed();
    spawn::tests::REAPER_REFUSED.with(|r| r.set(false));
    assert!(!reaped, "it was still running");
    // The process runs for 3 s: a reap that waited for it took that long.
    assert!(returned_after < std::time::Duration::from_secs(2), "waited {returned_after:?}");
    wait_reaped(pid, started, super::sweep_unreaped);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_query_reply_whose_unusable_flag_is_not_0_or_1_fails_the_chip() {
    let (mut p, peer, dir) = process_answered_here("bad-flag");
    let id = simpler_types::CallableId::new(
        [7; 32],
        simpler_types::CallableKind::Chip,
        simpler_types::CallableNamespace::LocalChip,
    );
    p.digests.insert(id, [7; 32]);
    let mut reply = 1u64.to_le_bytes().to_vec();
    reply.push(9);
    let unusable = std::thread::scope(|s| {
        s.spawn(|| answer_once(&peer, 0, &reply, None));
        p.is_unusable(&id)
    });
    assert!(!unusable);
    assert!(p.live.is_none(), "the process that sent it was not ended");
    assert!(
        matches!(
            &p.failed,
            Some(ChildError::Protocol { fault: ProtocolFault::UnusableFlag { flag: 9 }, .. })
        ),
        "{:?}",
        p.failed
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reply_to_another_request_names_the_operation_and_both_sequence_numbers() {
    let (mut p, peer, dir) = process_answered_here("stale-reply");
    p.seq = 41;
    let e = std::thread::scope(|s| {
        s.spawn(|| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while peer.state() != state::REQUEST {
                assert!(std::time::Instant::now() < deadline, "no request came");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            peer.write_reply(0, 7, b"").expect("fits");
            peer.publish(state::DONE);
        });
        p.out.0.clear();
        p.call(op::LEDGER, "ledger", None).expect_err("a reply to request 7")
    });
    let fault = ProtocolFault::StaleReply { operation: "ledger", request: 42, reply: 7 };
    assert!(matches!(&e, ChildError::Protocol { fault: f, .. } if *f == fault), "{e:?}");
    assert!(p.live.is_none(), "the process that sent it was not ended");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_refusal_whose_failure_frame_does_not_decode_names_the_operation_and_the_field() {
    let (mut p, peer, dir) = process_answered_here("bad-frame");
    let e = std::thread::scope(|s| {
        // Outcome tag 9 is none the encoder writes.
        s.spawn(|| answer_once(&peer, 1, &[9], None));
        p.ledger().expect_err("a refusal that does not decode")
    });
    let fault = ProtocolFault::Malformed { operation: "ledger", what: "outcome" };
    assert!(
        matches!(&e, crate::error::MemError::DeviceUnusable { child: Some(c), .. }
            if matches!(**c, ChildError::Protocol { fault: f, .. } if f == fault)),
        "{e:?}"
    );
    assert!(p.live.is_none(), "the process that sent it was not ended");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Answers the next `MALLOC` on `peer` with `addr`.
fn answer_malloc(peer: &Mailbox, addr: u64) {
    answer_once(peer, 0, &addr.to_le_bytes(), None);
}

#[test]
fn a_restarted_process_s_buffer_at_an_ended_one_s_address_is_told_apart_by_its_handle_only() {
    let (mut p, peer, dir) = process_answered_here("same-address");
    let addr = 0x10_0000;
    std::thread::scope(|s| {
        s.spawn(|| answer_malloc(&peer, addr));
        assert_eq!(p.malloc(0x200).expect("process 1 allocates"), addr);
    });
    // What a restart does to the record once the next process is ready.
    p.buffers.process_ended(p.generation);
    p.generation += 1;
    std::thread::scope(|s| {
        s.spawn(|| answer_malloc(&peer, addr));
        assert_eq!(p.malloc(0x100).expect("process 2 allocates"), addr);
    });
    // A `DeviceBuffer` names its process: the ended one's is refused, the current one's not.
    match p.current_buffer(1, addr, 0x200) {
        Err(MemError::StaleBuffer {
            addr: a, len: 0x200, buffer_process: 1, process: 2, ..
        }) if a == addr => {}
        other => panic!("{other:?}"),
    }
    p.current_buffer(2, addr, 0x100).expect("the current process's buffer");
    // A tensor names an address only: over the current buffer's bytes it is the current
    // process's (a tensor of the ended buffer over them cannot be told apart); past them, it
    // can only be the ended buffer's.
    let args = |bytes: u32| {
        let t = Tensor::external(addr, &[bytes], DataType::UInt8).expect("tensor");
        let mut args = TaskArgs::new();
        args.add_input(t.child_memory(true)).expect("one input");
        args
    };
    p.check_run_memory(&args(0x100)).expect("the current process's buffer");
    match p.check_run_memory(&args(0x200)) {
        Err(MemError::StaleBuffer {
            addr: a, len: 0x200, buffer_process: 1, process: 2, ..
        }) if a == addr => {}
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_chip_whose_process_is_not_started_by_the_start_deadline_fails_naming_that_step() {
    // The exec of the chip binary stalls past the start deadline: the attach fails by the
    // deadline, at it, naming the step, and the process that starts later is killed and reaped.
    let chip = 7003;
    let release = spawn::tests::stall(chip);
    let opts = Arc::new(ProcessOptions::default().child_path("/bin/true"));
    let init = ChipInit {
        platform: Platform::A2a3Sim,
        runtime: RuntimeVariant::HostBuildGraph,
        device: 0,
        prewarm: None,
    };
    let started = std::time::Instant::now();
    let deadline = Some(started + std::time::Duration::from_millis(300));
    let r =
        crate::process::start_chip(WorkerId(chip), init, opts, deadline, &[], Default::default());
    let waited = started.elapsed();
    match r {
        Err(crate::builder::AttachFailure::Deadline { step, residue }) => {
            assert!(step.contains("starting its process (/bin/true)"), "{step}");
            assert!(residue.is_empty());
        }
        Err(crate::builder::AttachFailure::Failed { message, .. }) => panic!("{message}"),
        Ok(_) => panic!("started"),
    }
    assert!(waited < std::time::Duration::from_secs(10), "waited {waited:?}");
    drop(release);
    let pid = spawn::tests::pid_of(chip);
    wait_reaped(pid, std::time::Instant::now(), || {});
}

/// Waits until `pid` has ended and can be reaped (without reaping it).
fn wait_ended(pid: u32) {
    use rustix::process::{WaitId, WaitIdOptions};
    let target = Pid::from_raw(pid as i32).expect("pid > 0");
    let peek = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
    let began = std::time::Instant::now();
    while !rustix::process::waitid(WaitId::Pid(target), peek).is_ok_and(|s| s.is_some()) {
        assert!(began.elapsed() < std::time::Duration::from_secs(30), "{pid} never ended");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn a_pinned_sequence_fails_on_the_death_of_its_process_instead_of_restarting_the_chip() {
    use crate::staging::StagingChip;
    use simpler_types::{RunId, TaskId};

    let (mut p, pid) = process_of_true();
    let restart = ProcessOptions::default().on_child_death(super::super::OnChildDeath::Restart);
    p.opts = Arc::new(restart);
    p.pin(true);
    wait_ended(pid);
    // A staged task's next copy: its process ended between two of its requests.
    let origin = TaskId::new(RunId::FIRST, 0);
    let failure = StagingChip::malloc(&mut p, 64, origin).expect_err("its process ended");
    let cause = failure.source.as_ref().and_then(|s| s.downcast_ref::<ChildError>());
    assert!(
        matches!(cause, Some(ChildError::EndedBetweenRequests { pid: p, .. }) if *p == pid),
        "{failure:?}"
    );
    assert_eq!(p.generation(), 1, "the chip was restarted under the task");
    assert!(p.live.is_none());
}

#[test]
fn memory_requests_on_a_checked_address_fail_on_the_death_of_its_process_instead_of_restarting() {
    // The caller checked the address against process 1; the process ended before the request.
    // A restart inside the request would send the address to process 2, where it may belong to
    // another allocation.
    let ended_between = |e: &MemError, pid: u32| {
        matches!(
            e,
            MemError::DeviceUnusable { child: Some(c), .. }
                if matches!(**c, ChildError::EndedBetweenRequests { pid: p, .. } if p == pid)
        )
    };
    let restart = ProcessOptions::default().on_child_death(super::super::OnChildDeath::Restart);
    for request in ["copy_to", "copy_from", "free"] {
        let (mut p, pid) = process_of_true();
        p.opts = Arc::new(restart.clone());
        wait_ended(pid);
        let e = match request {
            "copy_to" => p.copy_to(0x1000, &[1, 2, 3]).expect_err("its process ended"),
            "copy_from" => p.copy_from(0x1000, 3).expect_err("its process ended"),
            _ => p.free(0x1000).expect_err("its process ended"),
        };
        assert!(ended_between(&e, pid), "{request}: {e:?}");
        assert_eq!(p.generation(), 1, "{request}: the chip was restarted under the request");
        assert!(p.live.is_none(), "{request}");
    }
}
