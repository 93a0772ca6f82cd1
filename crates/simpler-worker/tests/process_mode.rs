//! PROCESS mode: chips in child processes. Start, runs and memory through the mailbox, crash
//! isolation (a segfault or abort kills only its child), a hung child killed after its budget,
//! start failures (a child wedged in a registration during start among them), a child dying
//! during a registration, a restart whose chip refuses content it held, refused content, host
//! buffers on chip tasks (and a child dying while one comes back), a wild reply refused as a
//! protocol failure, content whose removal failed unusable as in THREAD mode, no descriptor of
//! the worker's inherited but the mailbox, chip processes of a killed worker exiting on their
//! own, buffers of a dead process refused by memory calls and as task arguments, what a ready
//! process left behind when its start or restart failed; each test counts what could leak
//! (zombies, descriptors, threads).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{add_callable, host};
use simpler_device_a2a3::programs::{add, f32_from_le_bytes, f32_to_le_bytes};
use simpler_device_a2a3::{Platform, RuntimeVariant};
use simpler_types::{CallConfig, DataType, TaskArgs, WorkerId};
use simpler_worker::{
    CallableHandle, ChildError, ChildExit, ChildFault, ChildMode, DeviceBuffer, HostWorkerBuilder,
    MemError, OnChildDeath, Orchestration, ProcessOptions, ProtocolFault, RunError, ShutdownFault,
    SpawnFault, StartCause, TeardownCause, TeardownError, TeardownPart, Worker, WorkerError,
};

const N: usize = 64;

fn options() -> ProcessOptions {
    ProcessOptions::default().child_path(env!("CARGO_BIN_EXE_simpler-chip-child"))
}

fn process_host(chips: &[u32], opts: ProcessOptions) -> HostWorkerBuilder {
    host().chips(chips).chip_mode(ChildMode::Process).process_options(opts)
}

/// A started worker of one chip process, restarted on its next use after a death, with the
/// add program registered.
fn restarting_add_chip() -> (Worker, CallableHandle) {
    let mut b = process_host(&[0], options().on_child_death(OnChildDeath::Restart));
    let h = b.register_chip(add_callable(0));
    (b.start().expect("start"), h)
}

/// `a`, `b`, `f` on `chip` with `a = i`, `b = 2i`.
fn inputs(w: &Worker, chip: WorkerId) -> (TaskArgs, DeviceBuffer) {
    let (args, [_, _, f]) = input_buffers(w, chip);
    (args, f)
}

/// [`inputs`] with all three buffers.
fn input_buffers(w: &Worker, chip: WorkerId) -> (TaskArgs, [DeviceBuffer; 3]) {
    let mem = w.chip_memory(chip).expect("chip");
    let a: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..N).map(|i| 2.0 * i as f32).collect();
    let (ba, bb, bf) = (
        mem.malloc(4 * N as u64).unwrap(),
        mem.malloc(4 * N as u64).unwrap(),
        mem.malloc(4 * N as u64).unwrap(),
    );
    mem.copy_to(&ba, 0, &f32_to_le_bytes(&a)).unwrap();
    mem.copy_to(&bb, 0, &f32_to_le_bytes(&b)).unwrap();
    let mut args = TaskArgs::new();
    args.add_input(ba.tensor(&[N as u32], DataType::Float32).unwrap()).unwrap();
    args.add_input(bb.tensor(&[N as u32], DataType::Float32).unwrap()).unwrap();
    args.add_output(bf.tensor(&[N as u32], DataType::Float32).unwrap()).unwrap();
    (args, [ba, bb, bf])
}

fn on_chip(h: CallableHandle, args: TaskArgs, chip: WorkerId) -> Orchestration {
    Orchestration::graph(move |g, _, _| {
        g.submit_next_level(h, args.clone(), &CallConfig::default(), chip)?;
        Ok(())
    })
}

fn result(w: &Worker, chip: WorkerId, f: &DeviceBuffer) -> Vec<f32> {
    let mut bytes = vec![0u8; 4 * N];
    w.chip_memory(chip).unwrap().copy_from(f, 0, &mut bytes).unwrap();
    f32_from_le_bytes(&bytes)
}

fn expected() -> Vec<f32> {
    let a: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..N).map(|i| 2.0 * i as f32).collect();
    add::reference(&a, &b)
}

/// Whether `pid` still exists (running or a zombie).
fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Children of this process that are zombies.
fn zombies() -> usize {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            // pid (comm) state ppid ...
            let tail = stat.rsplit_once(')').map_or("", |(_, t)| t);
            let mut f = tail.split_whitespace();
            f.next() == Some("Z") && f.next() == Some(me.as_str())
        })
        .count()
}

/// Mailboxes this process maps or holds open.
fn mailboxes() -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mapped = maps.lines().filter(|l| l.contains("simpler-chip-mailbox")).count();
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, |dir| {
        dir.flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter(|l| l.to_string_lossy().contains("simpler-chip-mailbox"))
            .count()
    });
    mapped + open
}

/// The tests count process-wide things (children, mappings, threads): one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn child_error(e: &RunError) -> Option<ChildError> {
    e.frames().iter().find_map(|f| f.child_error().cloned())
}

#[test]
fn chip_processes_serve_runs_and_memory_and_finalize_on_close() {
    let _serial = serial();
    let mut b = process_host(&[0, 1], options());
    let h = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let pids: Vec<u32> = (0..2)
        .map(|c| w.chip_process_id(WorkerId(c)).unwrap().expect("a process per chip"))
        .collect();
    assert_ne!(pids[0], pids[1]);
    assert!(pids.iter().all(|&p| p != std::process::id() && exists(p)));
    assert_eq!(mailboxes(), 2);
    for chip in [WorkerId(0), WorkerId(1)] {
        let (args, f) = inputs(&w, chip);
        w.run(on_chip(h, args, chip)).expect("run");
        assert_eq!(result(&w, chip, &f), expected());
    }
    assert!(w.chip_memory(WorkerId(0)).unwrap().ledger().unwrap().user_allocations > 0);
    assert_eq!(w.chip_callable_refs(WorkerId(0), add_callable(0).id()).unwrap(), 1);
    w.close().expect("close");
    assert!(pids.iter().all(|&p| !exists(p)), "every chip process was reaped");
    assert_eq!(mailboxes(), 0);
}

#[test]
fn content_whose_removal_the_chip_refused_is_unusable_there_as_with_a_chip_in_this_process() {
    let _serial = serial();
    let w = process_host(&[0], options()).start().expect("start");
    let c = add_callable(0);
    let (first, last) =
        (w.register_chip(&c).expect("register"), w.register_chip(&c).expect("again"));
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::RefuseOnRelease).unwrap());
    // Dropping one of two references removes nothing: the drill waits for the removal.
    w.unregister(first).expect("a reference dropped");
    match w.unregister(last).expect_err("the removal is refused") {
        WorkerError::Registration { chip, rollback_failed, .. } => {
            assert_eq!((chip, rollback_failed), (WorkerId(0), vec![WorkerId(0)]));
        }
        other => panic!("unexpected {other}"),
    }
    match w.register_chip(&c).expect_err("unusable on chip 0") {
        WorkerError::CallableUnusable { chip, callable } => {
            assert_eq!((chip, callable.as_str()), (WorkerId(0), "add_0"));
        }
        other => panic!("unexpected {other}"),
    }
    assert_eq!(w.chip_callable_refs(WorkerId(0), c.id()).unwrap(), 0);
    w.close().expect("close");
    assert_eq!(mailboxes(), 0);
}

#[test]
fn a_wild_allocation_reply_is_a_protocol_failure_of_the_chip_not_a_panic() {
    let _serial = serial();
    let zombies_before = zombies();
    let w = process_host(&[0, 1], options()).start().expect("start");
    let pid = w.chip_process_id(WorkerId(0)).unwrap().expect("pid");
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::WildMalloc).unwrap());
    let e = w.chip_memory(WorkerId(0)).unwrap().malloc(64).expect_err("a wild address");
    assert!(
        matches!(&e, WorkerError::DeviceUnusable { child: Some(c), .. }
        if matches!(**c, ChildError::Protocol {
            chip: WorkerId(0),
            fault: ProtocolFault::AllocationPastAddressSpace { addr: u64::MAX, bytes: 64 },
        })),
        "{e:?}"
    );
    assert!(!exists(pid) || ended(pid), "the chip's process was ended");
    // The other chip is untouched.
    let mem = w.chip_memory(WorkerId(1)).unwrap();
    mem.free(mem.malloc(64).expect("chip 1 allocates")).expect("and frees");
    let _ = w.close();
    assert_eq!(zombies(), zombies_before);
    assert_eq!(mailboxes(), 0);
}

#[test]
fn a_segfault_fails_only_its_run_naming_chip_signal_and_run_and_the_chip_stays_unusable() {
    let _serial = serial();
    let zombies_before = zombies();
    let mut b = process_host(&[0, 1], options());
    let h = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let pid = w.chip_process_id(WorkerId(0)).unwrap().expect("pid");
    let (a0, _) = inputs(&w, WorkerId(0));
    let (a1, f1) = inputs(&w, WorkerId(1));
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::Segfault).unwrap());
    let e = w.submit(on_chip(h, a0.clone(), WorkerId(0))).unwrap().wait().expect_err("crash");
    match child_error(&e) {
        Some(ChildError::Died { chip, pid: p, exit, operation, run, .. }) => {
            assert_eq!(
                (chip, p, exit, operation),
                (WorkerId(0), pid, ChildExit::Signal(11), "run")
            );
            assert!(run.is_some());
        }
        other => panic!("expected a death, got {other:?} ({e})"),
    }
    assert!(e.to_string().contains("signal 11 (SIGSEGV)"), "{e}");
    assert!(!exists(pid), "the dead child was reaped");
    assert_eq!(zombies(), zombies_before);
    // The other chip carries on; chip 0 fails fast.
    w.run(on_chip(h, a1, WorkerId(1))).expect("chip 1 still works");
    assert_eq!(result(&w, WorkerId(1), &f1), expected());
    let e = w.submit(on_chip(h, a0, WorkerId(0))).unwrap().wait().expect_err("fast");
    assert!(matches!(child_error(&e), Some(ChildError::Unusable { .. })), "{e}");
    assert!(matches!(
        w.chip_memory(WorkerId(0)).unwrap().malloc(64),
        Err(WorkerError::DeviceUnusable { chip: WorkerId(0), .. })
    ));
    // Arming a fault says the same, with the process's failure typed as the next source.
    match w.arm_chip_process_fault(WorkerId(0), ChildFault::Abort) {
        Err(e @ WorkerError::DeviceUnusable { chip: WorkerId(0), child: Some(_), .. }) => {
            let next = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<ChildError>());
            assert!(matches!(next, Some(ChildError::Unusable { .. })), "{e}");
        }
        other => panic!("expected an unusable chip, got {other:?}"),
    }
    w.close().expect("close");
    assert_eq!(mailboxes(), 0);
}

#[test]
fn an_aborted_child_restarts_on_next_use_when_so_configured() {
    let _serial = serial();
    let (w, h) = restarting_add_chip();
    let first = w.chip_process_id(WorkerId(0)).unwrap().expect("pid");
    let (args, _) = inputs(&w, WorkerId(0));
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::Abort).unwrap());
    let e = w.submit(on_chip(h, args, WorkerId(0))).unwrap().wait().expect_err("abort");
    assert!(
        matches!(child_error(&e), Some(ChildError::Died { exit: ChildExit::Signal(6), .. })),
        "{e}"
    );
    // The next use starts a new process with the content prepared again; the old
    // allocations died with the old process, so the run uses new ones.
    let (args, f) = inputs(&w, WorkerId(0));
    let second = w.chip_process_id(WorkerId(0)).unwrap().expect("restarted");
    assert_ne!(first, second);
    w.run(on_chip(h, args, WorkerId(0))).expect("runs after the restart");
    assert_eq!(result(&w, WorkerId(0), &f), expected());
    w.close().expect("close");
    assert!(!exists(first) && !exists(second));
}

/// Kills chip `chip`'s process and waits until it can be reaped: waitable, not only a zombie
/// leader (`/proc` shows the leader as a zombie while its other threads still exit, and until
/// they have, the worker cannot see it ended either).
fn kill_idle_child(w: &Worker, chip: WorkerId) -> u32 {
    use rustix::process::{WaitId, WaitIdOptions};
    let pid = w.chip_process_id(chip).unwrap().expect("pid");
    let target = rustix::process::Pid::from_raw(pid as i32).expect("a pid");
    rustix::process::kill_process(target, rustix::process::Signal::KILL).expect("kill");
    let peek = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
    let began = std::time::Instant::now();
    while !rustix::process::waitid(WaitId::Pid(target), peek).is_ok_and(|s| s.is_some()) {
        assert!(began.elapsed() < Duration::from_secs(30), "the killed child never ended");
        std::thread::sleep(Duration::from_millis(5));
    }
    pid
}

#[test]
fn a_child_that_died_while_idle_is_restarted_by_the_next_use_not_failed_by_it() {
    let _serial = serial();
    let (w, h) = restarting_add_chip();
    let first = kill_idle_child(&w, WorkerId(0));
    // The first use after the death restarts the process: its allocation, then the run.
    let (args, f) = inputs(&w, WorkerId(0));
    w.run(on_chip(h, args, WorkerId(0))).expect("the next use restarts the chip");
    assert_eq!(result(&w, WorkerId(0), &f), expected());
    assert_ne!(w.chip_process_id(WorkerId(0)).unwrap(), Some(first));
    w.close().expect("close");
}

#[test]
fn a_child_that_died_while_idle_fails_the_next_call_as_ended_between_requests() {
    let _serial = serial();
    let mut b = process_host(&[0], options());
    let h = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let (args, _) = inputs(&w, WorkerId(0));
    let pid = kill_idle_child(&w, WorkerId(0));
    let e = w.submit(on_chip(h, args, WorkerId(0))).unwrap().wait().expect_err("dead chip");
    match child_error(&e) {
        Some(ChildError::Unusable { cause, .. }) => match *cause {
            ChildError::EndedBetweenRequests { pid: p, exit: ChildExit::Signal(9), .. } => {
                assert_eq!(p, pid)
            }
            other => panic!("the cause is {other:?}"),
        },
        other => panic!("expected an unusable chip, got {other:?}: {e}"),
    }
    assert!(e.to_string().contains("between requests"), "{e}");
    let _ = w.close();
}

#[test]
fn a_buffer_of_a_dead_chip_process_is_refused_never_sent_to_the_restarted_one() {
    let _serial = serial();
    let (w, h) = restarting_add_chip();
    let (args, old) = inputs(&w, WorkerId(0));
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::Abort).unwrap());
    w.submit(on_chip(h, args, WorkerId(0))).unwrap().wait().expect_err("abort");
    // A restarted process starts its allocations afresh: the same requests may well return
    // the same addresses, so a buffer of the dead process would reach another one's memory.
    // The first call below is the one that restarts the chip.
    assert_eq!(w.chip_process_id(WorkerId(0)).unwrap(), None, "dead until the next use");
    let mem = w.chip_memory(WorkerId(0)).unwrap();
    let stale = |e: &WorkerError| {
        matches!(
            e,
            WorkerError::Memory(MemError::StaleBuffer {
                chip: WorkerId(0),
                addr,
                len,
                buffer_process: 1,
                process: 2
            }) if *addr == old.addr() && *len == old.len()
        ) && e.to_string().contains(&format!("{:#x}", old.addr()))
    };
    let e = mem.copy_to(&old, 0, &[0u8; 4]).expect_err("a buffer of the dead process");
    assert!(stale(&e), "{e}");
    let e = mem.copy_from(&old, 0, &mut [0u8; 4]).expect_err("a buffer of the dead process");
    assert!(stale(&e), "{e}");
    let e = mem.free(old).expect_err("a buffer of the dead process");
    assert!(stale(&e), "{e}");
    let (args, f) = inputs(&w, WorkerId(0));
    w.run(on_chip(h, args, WorkerId(0))).expect("runs after the restart");
    assert_eq!(result(&w, WorkerId(0), &f), expected());
    w.close().expect("close");
}

#[test]
fn a_buffer_of_a_chip_process_that_died_while_idle_is_refused_never_sent_to_the_restarted_one() {
    // The death is noticed only by the next use, which restarts the chip: a buffer of the dead
    // process must be refused there too, not pass for one of its successor.
    let _serial = serial();
    let (w, h) = restarting_add_chip();
    let (args, old) = inputs(&w, WorkerId(0));
    kill_idle_child(&w, WorkerId(0));
    let mem = w.chip_memory(WorkerId(0)).unwrap();
    let e = mem.copy_to(&old, 0, &[0u8; 4]).expect_err("a buffer of the dead process");
    assert!(
        matches!(
            e,
            WorkerError::Memory(MemError::StaleBuffer { buffer_process: 1, process: 2, .. })
        ),
        "{e}"
    );
    kill_idle_child(&w, WorkerId(0));
    let e = w.submit(on_chip(h, args, WorkerId(0))).unwrap().wait().expect_err("stale");
    assert!(
        matches!(mem_error(&e), Some(MemError::StaleBuffer { buffer_process: 1, process: 3, .. })),
        "{e}"
    );
    let (args, f) = inputs(&w, WorkerId(0));
    w.run(on_chip(h, args, WorkerId(0))).expect("runs after the restart");
    assert_eq!(result(&w, WorkerId(0), &f), expected());
    w.close().expect("close");
}

/// The memory error a run's failure carries, if any.
fn mem_error(e: &RunError) -> Option<MemError> {
    e.frames().iter().find_map(|f| f.error()?.downcast_ref::<MemError>().cloned())
}

/// A task carries addresses only: the chip's process checks them against the allocations of
/// the processes before it, so a tensor over a buffer of a dead process is refused, typed and
/// naming the buffer, both when the run itself restarts the chip and once it runs again.
#[test]
fn a_task_over_a_buffer_of_a_dead_chip_process_is_refused_never_sent_to_the_restarted_one() {
    let _serial = serial();
    let (w, h) = restarting_add_chip();
    let (args, _) = inputs(&w, WorkerId(0));
    let first = args.tensors()[0];
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::Abort).unwrap());
    w.submit(on_chip(h, args.clone(), WorkerId(0))).unwrap().wait().expect_err("abort");
    assert_eq!(w.chip_process_id(WorkerId(0)).unwrap(), None, "dead until the next use");
    let refused = |e: &RunError| match mem_error(e) {
        Some(MemError::StaleBuffer { chip, addr, len, buffer_process, process }) => {
            (chip, addr, len, buffer_process, process)
                == (WorkerId(0), first.addr, first.size, 1, 2)
                && e.to_string().contains(&format!("{:#x}", first.addr))
        }
        _ => false,
    };
    // This run restarts the chip, whose new process never sees the old addresses.
    let e = w.submit(on_chip(h, args.clone(), WorkerId(0))).unwrap().wait().expect_err("stale");
    assert!(refused(&e), "{e}");
    let second = w.chip_process_id(WorkerId(0)).unwrap().expect("restarted");
    // The chip stays usable: buffers of the new process run, the old ones stay refused.
    let (fresh, buffers) = input_buffers(&w, WorkerId(0));
    w.run(on_chip(h, fresh, WorkerId(0))).expect("runs after the restart");
    assert_eq!(result(&w, WorkerId(0), &buffers[2]), expected());
    // The new process may have answered the very addresses the old one had (it does when
    // addresses are not randomized), and bytes it holds are its own to an address-only
    // tensor: the old ones are refused once it no longer holds them.
    let mem = w.chip_memory(WorkerId(0)).unwrap();
    for b in buffers {
        mem.free(b).expect("a buffer of the new process");
    }
    let e = w.submit(on_chip(h, args, WorkerId(0))).unwrap().wait().expect_err("still stale");
    assert!(refused(&e), "{e}");
    assert_eq!(w.chip_process_id(WorkerId(0)).unwrap(), Some(second), "the chip kept its process");
    w.close().expect("close");
}

#[test]
fn unregistering_one_of_two_handles_while_the_child_is_dead_keeps_the_other_usable() {
    let _serial = serial();
    let mut b = process_host(&[0], options().on_child_death(OnChildDeath::Restart));
    let content = add_callable(0);
    let kept = b.register_chip(content.clone());
    let dropped = b.register_chip(content.clone());
    let w = b.start().expect("start");
    assert_eq!(w.chip_callable_refs(WorkerId(0), content.id()).unwrap(), 2);
    let first = w.chip_process_id(WorkerId(0)).unwrap().expect("pid");
    let (args, _) = inputs(&w, WorkerId(0));
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::Abort).unwrap());
    w.submit(on_chip(kept, args, WorkerId(0))).unwrap().wait().expect_err("abort");
    // The count is the worker's: asking for it neither restarts the dead child nor reads 0.
    assert_eq!(w.chip_callable_refs(WorkerId(0), content.id()).unwrap(), 2);
    assert_eq!(w.chip_process_id(WorkerId(0)).unwrap(), None, "a count restarted the child");
    // The child is dead: the release must not reach a restarted child that was already
    // prepared without this reference.
    w.unregister(dropped).expect("unregister");
    let (args, f) = inputs(&w, WorkerId(0));
    w.run(on_chip(kept, args, WorkerId(0))).expect("the remaining handle still runs");
    assert_eq!(result(&w, WorkerId(0), &f), expected());
    assert_eq!(w.chip_callable_refs(WorkerId(0), content.id()).unwrap(), 1);
    let second = w.chip_process_id(WorkerId(0)).unwrap().expect("restarted");
    w.close().expect("close");
    assert!(!exists(first) && !exists(second));
}

/// The restart failure of chip 0 inside `e`: (restarted pid, callable, device code, device
/// text) when `e` is the chip's refusal to prepare held content again.
fn refused_restore(e: &ChildError) -> Option<(u32, String, Option<i32>, String)> {
    let ChildError::Unusable { chip: WorkerId(0), cause } = e else { return None };
    let ChildError::Restore { chip: WorkerId(0), pid, callable, cause, .. } = &**cause else {
        return None;
    };
    match &**cause {
        ChildError::Device { chip: WorkerId(0), run: None, code, message } => {
            Some((*pid, callable.clone(), code.map(|c| c.code), message.clone()))
        }
        _ => None,
    }
}

/// A restarted process whose chip refuses content the chip held fails the restart: the run that
/// started it gets the refusal typed (chip, callable, device code and text) instead of running
/// without its content, the refusing process is ended and reaped, and the next use tries again.
#[test]
fn a_restart_whose_chip_refuses_held_content_fails_naming_the_callable_and_the_refusal() {
    let _serial = serial();
    let zombies_before = zombies();
    let opts = options()
        .on_child_death(OnChildDeath::Restart)
        .fault_at_restart(ChildFault::RefuseOnRegister);
    let mut b = process_host(&[0], opts);
    let h = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let first = w.chip_process_id(WorkerId(0)).unwrap().expect("pid");
    let (args, _) = inputs(&w, WorkerId(0));
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::Abort).unwrap());
    w.submit(on_chip(h, args.clone(), WorkerId(0))).unwrap().wait().expect_err("abort");
    // This run restarts the chip, whose new process refuses to prepare 'add_0' again.
    let e = w.submit(on_chip(h, args, WorkerId(0))).unwrap().wait().expect_err("refused");
    let Some((second, callable, code, message)) =
        child_error(&e).as_ref().and_then(refused_restore)
    else {
        panic!("expected a failed restart naming the refusal, got {:?} ({e})", child_error(&e));
    };
    assert_eq!((callable.as_str(), code), ("add_0", Some(207_001)), "{e}");
    assert!(message.contains("out of device memory"), "{message}");
    assert!(e.to_string().contains("'add_0'"), "{e}");
    assert_eq!(e.device_code().map(|c| c.code), Some(207_001), "{e}");
    assert_ne!(second, first);
    assert!(!exists(first) && !exists(second), "both processes were reaped");
    assert_eq!(w.chip_process_id(WorkerId(0)).unwrap(), None, "no process holds less than held");
    assert_eq!((mailboxes(), zombies()), (0, zombies_before));
    // The next use restarts again, and is refused the same way by a third process.
    match w.chip_memory(WorkerId(0)).unwrap().malloc(64) {
        Err(WorkerError::DeviceUnusable { chip: WorkerId(0), child: Some(c), code, .. }) => {
            let (third, ..) = refused_restore(&c).unwrap_or_else(|| panic!("{c}"));
            assert!(third != second && !exists(third), "{c}");
            assert_eq!(code.map(|c| c.code), Some(207_001), "{c}");
        }
        other => panic!("expected a failed restart, got {other:?}"),
    }
    w.close().expect("close");
    assert_eq!((mailboxes(), zombies()), (0, zombies_before));
}

#[test]
fn a_hung_child_is_killed_after_its_budget_and_reaped_leaving_nothing_behind() {
    let _serial = serial();
    // The library's threads only (all named `simpler-…` or `sim…`): the test harness starts and
    // ends its own threads while this test runs.
    let threads_before = common::threads_named("sim").len();
    let opts = options().run_timeout(Duration::from_millis(300));
    let mut b = process_host(&[0], opts);
    let h = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let pid = w.chip_process_id(WorkerId(0)).unwrap().expect("pid");
    let (args, _) = inputs(&w, WorkerId(0));
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::Hang).unwrap());
    let e = w.submit(on_chip(h, args, WorkerId(0))).unwrap().wait().expect_err("hang");
    match child_error(&e) {
        Some(ChildError::Unresponsive { pid: p, budget, .. }) => {
            assert_eq!(p, pid);
            assert_eq!(budget, Duration::from_millis(300));
        }
        other => panic!("expected a hung child, got {other:?} ({e})"),
    }
    assert!(!exists(pid), "killed and reaped");
    assert_eq!(w.chip_process_id(WorkerId(0)).unwrap(), None);
    w.close().expect("close");
    assert_eq!(mailboxes(), 0);
    assert_eq!(common::threads_named("sim").len(), threads_before, "no thread outlives the worker");
}

#[test]
fn start_failures_name_the_binary_the_exit_status_or_the_deadline_and_reap_every_child() {
    let _serial = serial();
    let missing = process_host(&[0], ProcessOptions::default().child_path("/nonexistent/child"))
        .start()
        .expect_err("no binary");
    assert!(missing.to_string().contains("/nonexistent/child"), "{missing}");
    let exits = process_host(&[0], ProcessOptions::default().child_path("/bin/false"))
        .start()
        .expect_err("exits before READY");
    assert!(exits.to_string().contains("exited with status 1"), "{exits}");
    // The process's failure stays typed behind the start error.
    let died = std::error::Error::source(&exits).and_then(|s| s.downcast_ref::<ChildError>());
    assert!(matches!(died, Some(ChildError::Died { .. })), "{exits}: {died:?}");
    // A child that exits on its own leaving a process in its group: the group is killed
    // before the child is reaped.
    let left = child_leaving_a_process("exiting", "exit 3", |script| {
        let e = process_host(&[0], ProcessOptions::default().child_path(script))
            .start()
            .expect_err("exits before READY");
        assert!(e.to_string().contains("exited with status 3"), "{e}");
    });
    assert!(!left, "the process the child left in its group was killed");
    // A child (and its subtree) that never gets ready: the start deadline kills the group.
    let left = child_leaving_a_process("hung", "wait", |script| {
        let e = process_host(&[0, 1], ProcessOptions::default().child_path(script))
            .startup_timeout(Duration::from_millis(1500))
            .start()
            .expect_err("never ready");
        assert!(matches!(e.cause, StartCause::DeadlineExceeded { .. }), "{e}");
    });
    assert!(!left, "the stuck subtree died as a group");
    // A chip whose device does not attach in its process (an NPU where none is, or no
    // onboard backend built): the device's failure stays typed behind the start error, as it
    // does for a chip in this process. On a host with a real A2/A3 chip the start succeeds
    // and there is nothing to check here.
    let onboard = Worker::host(Platform::A2a3, RuntimeVariant::HostBuildGraph)
        .chips(&[0])
        .chip_mode(ChildMode::Process)
        .process_options(options())
        .start();
    match onboard {
        Ok(w) => w.close().expect("close"),
        Err(unattached) => {
            let device =
                std::error::Error::source(&unattached).and_then(|s| s.downcast_ref::<ChildError>());
            assert!(
                matches!(device, Some(ChildError::Device { chip: WorkerId(0), run: None, .. })),
                "{unattached}: {device:?}"
            );
        }
    }
    assert_eq!(mailboxes(), 0);
}

#[test]
fn a_child_that_cannot_be_started_names_the_paths_tried_or_the_systems_refusal() {
    let _serial = serial();
    let spawn_fault = |e: &simpler_worker::StartError| match std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<ChildError>())
    {
        Some(ChildError::Spawn { chip: WorkerId(0), fault }) => fault.clone(),
        other => panic!("{e}: {other:?}"),
    };
    let missing = process_host(&[0], ProcessOptions::default().child_path("/nonexistent/child"))
        .start()
        .expect_err("no binary");
    match spawn_fault(&missing) {
        SpawnFault::NoBinary { tried } => assert_eq!(tried, [Path::new("/nonexistent/child")]),
        other => panic!("{missing}: {other:?}"),
    }
    // A file without execute permission: the system's refusal stays an `io::Error`.
    let dir = std::env::temp_dir().join(format!("simpler-unexecutable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("child");
    std::fs::write(&file, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let refused =
        process_host(&[0], ProcessOptions::default().child_path(&file)).start().expect_err("exec");
    let _ = std::fs::remove_dir_all(&dir);
    match spawn_fault(&refused) {
        SpawnFault::Exec { binary, source } => {
            assert_eq!(binary, file);
            assert_eq!(source.kind(), std::io::ErrorKind::PermissionDenied, "{refused}");
        }
        other => panic!("{refused}: {other:?}"),
    }
}

/// Runs `start` with a chip binary that starts `sleep 60` in its group, then runs `then` (a
/// shell line); returns whether that process is still alive two seconds after `start` returned
/// (it is reparented when killed, so this waits for init to reap it).
fn child_leaving_a_process(name: &str, then: &str, start: impl FnOnce(&Path)) -> bool {
    let dir = std::env::temp_dir().join(format!("simpler-{name}-child-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (script, marker) = (dir.join("child"), dir.join("left.pid"));
    let body = format!("#!/bin/sh\nsleep 60 &\necho $! > {}\n{then}\n", marker.display());
    std::fs::write(&script, body).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    start(&script);
    let left: u32 = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
    for _ in 0..200 {
        if !exists(left) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_dir_all(&dir);
    exists(left)
}

#[test]
fn a_child_wedged_registering_during_start_fails_start_at_its_deadline_naming_chip_and_step() {
    let _serial = serial();
    let zombies_before = zombies();
    // The start deadline is far shorter than the control timeout, which the wedged
    // registration must not wait out, and long enough for the child to come up on a loaded
    // machine, so that the step pending at the deadline is the registration.
    let control = Duration::from_secs(90);
    let opts = options().control_timeout(control).fault_at_start(ChildFault::HangOnRegister);
    let startup = Duration::from_secs(10);
    let mut b = process_host(&[0], opts).startup_timeout(startup);
    b.register_chip(add_callable(0));
    let began = std::time::Instant::now();
    let e = b.start().expect_err("the child never answers its registration");
    match &e.cause {
        StartCause::DeadlineExceeded { pending, budget } => {
            assert_eq!(*budget, startup);
            assert_eq!(pending.len(), 1, "{e}");
            assert!(pending[0].contains("chip 0"), "{e}");
            assert!(pending[0].contains("preparing 'add_0' in its process"), "{e}");
        }
        other => panic!("expected the start deadline, got {other}"),
    }
    assert!(e.path.contains("chip 0"), "{}", e.path);
    assert!(began.elapsed() < control, "start waited for the control timeout: {e}");
    assert_eq!(zombies(), zombies_before, "the wedged child was reaped");
    assert_eq!(mailboxes(), 0);
}

#[test]
fn a_child_whose_mailbox_state_keeps_changing_is_still_killed_at_its_budget() {
    let _serial = serial();
    let zombies_before = zombies();
    // The child flips its mailbox between "request" and "accepted" instead of answering its
    // registration, waking the worker at each flip: every wake sees a new state, and the
    // budget must still end the wait, well before the start deadline.
    let control = Duration::from_millis(500);
    let opts = options().control_timeout(control).fault_at_start(ChildFault::FlipStateOnRegister);
    let startup = Duration::from_secs(60);
    let mut b = process_host(&[0], opts).startup_timeout(startup);
    b.register_chip(add_callable(0));
    let began = std::time::Instant::now();
    let e = b.start().expect_err("the child never answers its registration");
    let elapsed = began.elapsed();
    assert!(elapsed < startup / 2, "the wait outlived its budget: {elapsed:?}: {e}");
    let text = e.to_string();
    assert!(text.contains("did not answer") && text.contains("500ms"), "{e}");
    assert_eq!(zombies(), zombies_before, "the flipping child was reaped");
    assert_eq!(mailboxes(), 0);
}

#[test]
fn a_child_that_died_between_requests_is_reported_as_ended_before_its_shutdown() {
    let _serial = serial();
    let zombies_before = zombies();
    let w = process_host(&[0], options()).start().expect("start");
    // Dead but not reaped: nothing asks it anything until the close.
    let pid = kill_idle_child(&w, WorkerId(0));
    let e = w.close().expect_err("chip 0's process was dead before the close");
    match e.teardown.iter().map(chip_process_fault).collect::<Vec<_>>().as_slice() {
        [Some((WorkerId(0), p, ShutdownFault::EndedBefore(ChildExit::Signal(9))))] => {
            assert_eq!(*p, pid)
        }
        other => panic!("a process dead before its shutdown gave {other:?}: {e}"),
    }
    assert!(e.to_string().contains("before it was asked to shut down"), "{e}");
    assert_eq!((mailboxes(), zombies()), (0, zombies_before));
}

/// The chip, the process and what went wrong, when `t` is a chip process's end gone wrong.
fn chip_process_fault(t: &TeardownError) -> Option<(WorkerId, u32, &ShutdownFault)> {
    match (&t.what, &t.cause) {
        (TeardownPart::Chip(chip), TeardownCause::ChipProcess { pid, fault }) => {
            Some((*chip, *pid, fault))
        }
        _ => None,
    }
}

/// Content no chip process can build (native code).
fn native_callable() -> simpler_device_a2a3::ChipCallable {
    simpler_device_a2a3::ChipCallable::native(|_, _| Ok(()), |_| Default::default())
        .names("native_only", "native_config")
        .build()
        .expect("valid")
}

/// A chip process that was ready when its start failed is shut down, and what that left
/// behind (here: it said it exits, then hung and was killed) reaches the start error's
/// rollback, named in its text.
#[test]
fn what_a_ready_chip_process_leaves_when_its_start_fails_is_in_the_start_error() {
    let _serial = serial();
    let zombies_before = zombies();
    let opts = options()
        .shutdown_timeout(Duration::from_millis(300))
        .fault_at_start(ChildFault::HangAfterExit);
    let mut b = process_host(&[0], opts);
    b.register_chip(native_callable());
    let e = b.start().expect_err("native content cannot cross");
    assert!(matches!(e.cause, StartCause::Device { chip: WorkerId(0), .. }), "{e}");
    let left: Vec<_> = e.rollback.iter().filter_map(chip_process_fault).collect();
    let budget = Duration::from_millis(300);
    match left.as_slice() {
        [(WorkerId(0), _, ShutdownFault::NoExit { budget: b })] => assert!(*b <= budget, "{e}"),
        other => panic!("the ready process's end left {other:?}: {e}"),
    }
    assert!(e.to_string().contains("finalized but did not exit"), "{e}");
    assert_eq!((mailboxes(), zombies()), (0, zombies_before));
}

/// A start that fails after some chip processes were ready shuts them down within the start's
/// deadline, not each within its own shutdown budget one after another.
#[test]
fn the_rollback_of_a_failed_start_ends_at_the_start_deadline() {
    let _serial = serial();
    let zombies_before = zombies();
    let dir = std::env::temp_dir().join(format!("simpler-rollback-child-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("child");
    // Chip 2's process exits at once; the others are the real chip binary.
    let body = format!(
        "#!/bin/sh\ncase \" $* \" in *\" --chip 2 \"*) exit 5;; esac\nexec {} \"$@\"\n",
        env!("CARGO_BIN_EXE_simpler-chip-child")
    );
    std::fs::write(&script, body).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let shutdown = Duration::from_secs(20);
    let opts = ProcessOptions::default()
        .child_path(&script)
        .shutdown_timeout(shutdown)
        .fault_at_start(ChildFault::HangOnShutdown);
    let startup = Duration::from_secs(5);
    let began = std::time::Instant::now();
    let e = process_host(&[0, 1, 2], opts).startup_timeout(startup).start().expect_err("chip 2");
    let elapsed = began.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(e.to_string().contains("exited with status 5"), "{e}");
    // Before: two hung shutdowns of 20 s each.
    assert_rollback_cut_to_the_start_deadline(&e, elapsed, shutdown);
    assert_eq!((mailboxes(), zombies()), (0, zombies_before));
}

/// Chips 0 and 1, hung in their shutdowns, were killed within the start deadline of the failed
/// start `e`, which took `elapsed`, not after their `shutdown` budgets.
fn assert_rollback_cut_to_the_start_deadline(
    e: &simpler_worker::StartError,
    elapsed: Duration,
    shutdown: Duration,
) {
    assert!(elapsed < shutdown, "the rollback took {elapsed:?}: {e}");
    let left: Vec<_> = e.rollback.iter().filter_map(chip_process_fault).collect();
    match left.as_slice() {
        [
            (WorkerId(0), _, ShutdownFault::NoFinalize { budget: b0 }),
            (WorkerId(1), _, ShutdownFault::NoFinalize { budget: b1 }),
        ] => assert!(b0 < &shutdown && b1 < &shutdown, "cut to the start deadline: {e}"),
        other => panic!("the ready processes' ends left {other:?}: {e}"),
    }
}

/// An engine that fails to start after every chip process is ready (heap rings larger than
/// the address space: the ring's own check passes, the mapping fails) shuts the chips down
/// within the start's deadline, not each within its own shutdown budget one after another.
#[test]
fn the_rollback_of_an_engine_that_failed_to_start_ends_at_the_start_deadline() {
    let _serial = serial();
    let zombies_before = zombies();
    let shutdown = Duration::from_secs(20);
    let opts = options().shutdown_timeout(shutdown).fault_at_start(ChildFault::HangOnShutdown);
    let startup = Duration::from_secs(3);
    let began = std::time::Instant::now();
    let e = process_host(&[0, 1], opts)
        .heap_ring_size(1 << 47)
        .startup_timeout(startup)
        .start()
        .expect_err("no address space for the heap rings");
    let elapsed = began.elapsed();
    assert!(matches!(e.cause, StartCause::Engine(_)), "{e}");
    assert_rollback_cut_to_the_start_deadline(&e, elapsed, shutdown);
    assert_eq!((mailboxes(), zombies()), (0, zombies_before));
}

/// A restart that fails after its process was ready reports what ending that process left
/// behind with the failure (`ChildError::Restore::residue`), named in its text.
#[test]
fn what_a_failed_restart_leaves_behind_is_in_its_restore_error() {
    let _serial = serial();
    let zombies_before = zombies();
    let opts = options()
        .on_child_death(OnChildDeath::Restart)
        .shutdown_timeout(Duration::from_millis(300))
        .fault_at_restart(ChildFault::HangAfterExit)
        .fault_at_restart(ChildFault::RefuseOnRegister);
    let mut b = process_host(&[0], opts);
    let h = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let (args, _) = inputs(&w, WorkerId(0));
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::Abort).unwrap());
    w.submit(on_chip(h, args.clone(), WorkerId(0))).unwrap().wait().expect_err("abort");
    let e = w.submit(on_chip(h, args, WorkerId(0))).unwrap().wait().expect_err("refused");
    let Some(ChildError::Unusable { cause, .. }) = child_error(&e) else {
        panic!("expected a failed restart, got {e}");
    };
    let ChildError::Restore { pid, residue, .. } = &*cause else {
        panic!("expected a refused restore, got {cause}");
    };
    match residue.iter().map(chip_process_fault).collect::<Vec<_>>().as_slice() {
        [Some((WorkerId(0), p, ShutdownFault::NoExit { .. }))] => assert_eq!(p, pid),
        other => panic!("the restarted process's end left {other:?}: {cause}"),
    }
    assert_eq!(residue[0].path, "", "the restore error names the chip: {cause}");
    assert!(cause.to_string().contains("ending it left: "), "{cause}");
    assert!(!exists(*pid), "the restarted process was reaped");
    w.close().expect("close");
    assert_eq!((mailboxes(), zombies()), (0, zombies_before));
}

#[test]
fn content_a_child_cannot_build_is_refused_at_registration_and_changes_nothing() {
    let _serial = serial();
    let w = process_host(&[0], options()).start().expect("start");
    match w.register_chip(&native_callable()) {
        Err(WorkerError::Registration { chip, source, .. }) => {
            assert_eq!(chip, WorkerId(0));
            assert!(source.to_string().contains("chip process"), "{source}");
        }
        other => panic!("expected a refused registration, got {other:?}"),
    }
    let h = w.register_chip(&add_callable(3)).expect("catalog content crosses");
    let (args, f) = inputs(&w, WorkerId(0));
    w.run(on_chip(h, args, WorkerId(0))).expect("run");
    assert_eq!(result(&w, WorkerId(0), &f), expected());
    w.close().expect("close");
}

#[test]
fn a_child_that_dies_registering_fails_the_registration_with_its_death_typed() {
    let _serial = serial();
    let w = process_host(&[0], options()).start().expect("start");
    let pid = w.chip_process_id(WorkerId(0)).unwrap().expect("pid");
    let kept = w.register_chip(&add_callable(0)).expect("register");
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::AbortOnRegister).unwrap());
    let refused = add_callable(1);
    let e = w.register_chip(&refused).expect_err("the child dies registering");
    // The death is in the error's source chain as itself.
    let mut chain = std::error::Error::source(&e);
    while let Some(next) = chain.filter(|s| !s.is::<ChildError>()) {
        chain = next.source();
    }
    assert!(chain.is_some(), "no ChildError in the source chain of {e}");
    match e {
        WorkerError::Registration { callable, chip, source, .. } => {
            assert_eq!((callable.as_str(), chip), (refused.entry_name(), WorkerId(0)));
            match source.child_error() {
                Some(ChildError::Died { chip, pid: p, exit, operation, .. }) => assert_eq!(
                    (*chip, *p, *exit, *operation),
                    (WorkerId(0), pid, ChildExit::Signal(6), "register")
                ),
                other => panic!("expected the child's death, got {other:?} ({source})"),
            }
        }
        other => panic!("expected a refused registration, got {other:?}"),
    }
    assert!(!exists(pid), "the dead child was reaped");
    // The chip is unusable now: registration, removal and memory each say so with the
    // death as the typed cause.
    let died_registering = |e: &ChildError| match e {
        ChildError::Unusable { cause, .. } => {
            matches!(**cause, ChildError::Died { operation: "register", .. })
        }
        _ => false,
    };
    match w.register_chip(&add_callable(2)) {
        Err(WorkerError::DeviceUnusable { chip: WorkerId(0), child: Some(c), .. }) => {
            assert!(died_registering(&c), "{c}")
        }
        other => panic!("expected an unusable chip, got {other:?}"),
    }
    match w.unregister(kept) {
        Err(WorkerError::Registration { source, .. }) => {
            assert!(source.child_error().is_some_and(died_registering), "{source}")
        }
        other => panic!("expected a failed removal, got {other:?}"),
    }
    match w.chip_memory(WorkerId(0)).unwrap().malloc(64) {
        Err(WorkerError::DeviceUnusable { chip: WorkerId(0), child: Some(c), .. }) => {
            assert!(died_registering(&c), "{c}")
        }
        other => panic!("expected an unusable chip, got {other:?}"),
    }
    w.close().expect("close");
    assert_eq!(mailboxes(), 0);
}

/// What `/proc/<pid>/fd` links to: one entry per open descriptor (`pipe:[inode]`, a path).
fn open_files(pid: &str) -> Vec<std::path::PathBuf> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("the process's descriptors");
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok()).collect()
}

#[test]
fn a_chip_process_inherits_no_descriptor_of_the_worker_but_its_mailbox() {
    use std::os::fd::{AsFd, AsRawFd};
    let _serial = serial();
    // A pipe this process holds without close-on-exec, as code that did not ask for the flag
    // leaves one.
    let (reader, writer) = std::io::pipe().expect("pipe");
    rustix::io::fcntl_setfd(writer.as_fd(), rustix::io::FdFlags::empty()).expect("no cloexec");
    let pipe = std::fs::read_link(format!("/proc/self/fd/{}", writer.as_raw_fd())).expect("name");
    let w = process_host(&[0], options()).start().expect("start");
    let pid = w.chip_process_id(WorkerId(0)).unwrap().expect("pid").to_string();
    let files = open_files(&pid);
    assert!(!files.contains(&pipe), "the chip process holds the worker's {pipe:?}: {files:?}");
    // The mailbox came across (the process started and serves); it maps it and closes it.
    let (args, f) = inputs(&w, WorkerId(0));
    let h = w.register_chip(&add_callable(0)).expect("register");
    w.run(on_chip(h, args, WorkerId(0))).expect("run");
    assert_eq!(result(&w, WorkerId(0), &f), expected());
    w.close().expect("close");
    drop((reader, writer));
}

#[test]
fn a_child_stuck_in_shutdown_is_killed_after_the_deadline_named_and_does_not_delay_the_others() {
    let _serial = serial();
    let opts = options().shutdown_timeout(Duration::from_millis(300));
    let w = process_host(&[0, 1], opts).start().expect("start");
    let pids: Vec<u32> = (0..2).map(|c| w.chip_process_id(WorkerId(c)).unwrap().unwrap()).collect();
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::HangOnShutdown).unwrap());
    let e = w.close().expect_err("chip 0 did not finalize");
    match e.teardown.iter().map(chip_process_fault).collect::<Vec<_>>().as_slice() {
        [Some((WorkerId(0), p, ShutdownFault::NoFinalize { .. }))] => assert_eq!(*p, pids[0]),
        other => panic!("a process stuck in shutdown gave {other:?}: {e}"),
    }
    let text = e.to_string();
    assert!(text.contains("chip 0") && text.contains(&pids[0].to_string()), "{text}");
    assert!(!text.contains("chip 1"), "chip 1 shut down cleanly: {text}");
    assert!(pids.iter().all(|&p| !exists(p)), "both reaped");
    assert_eq!(mailboxes(), 0);
}

#[test]
fn a_child_that_hangs_after_saying_it_exits_is_killed_at_the_shutdown_deadline_and_named() {
    let _serial = serial();
    let opts = options().shutdown_timeout(Duration::from_millis(300));
    let w = process_host(&[0], opts).start().expect("start");
    let pid = w.chip_process_id(WorkerId(0)).unwrap().unwrap();
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::HangAfterExit).unwrap());
    let e = w.close().expect_err("chip 0 did not exit");
    match e.teardown.iter().map(chip_process_fault).collect::<Vec<_>>().as_slice() {
        [Some((WorkerId(0), p, ShutdownFault::NoExit { .. }))] => assert_eq!(*p, pid),
        other => panic!("a process that hung after its exit gave {other:?}: {e}"),
    }
    let text = e.to_string();
    assert!(text.contains("did not exit") && text.contains(&pid.to_string()), "{text}");
    assert!(!exists(pid), "reaped");
    assert_eq!(mailboxes(), 0);
}

#[test]
fn a_child_that_crashes_after_saying_it_exits_is_named_by_the_close() {
    let _serial = serial();
    let w = process_host(&[0], options()).start().expect("start");
    let pid = w.chip_process_id(WorkerId(0)).unwrap().unwrap();
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::AbortAfterExit).unwrap());
    let e = w.close().expect_err("chip 0 aborted after its exit");
    match e.teardown.iter().map(chip_process_fault).collect::<Vec<_>>().as_slice() {
        [Some((WorkerId(0), p, ShutdownFault::Ended(ChildExit::Signal(6))))] => {
            assert_eq!(*p, pid)
        }
        other => panic!("a process that aborted after its exit gave {other:?}: {e}"),
    }
    assert!(!exists(pid), "reaped");
    assert_eq!(mailboxes(), 0);
}

/// Floats of the host-buffer tests: 160 KB per buffer, several mailbox payloads each way.
const BIG: usize = 40_000;

/// `f = a + b` on chip 0 over host buffers of `BIG` floats, `f` filled with 7 and tagged
/// `Output` (a blind write of all of it: no copy in). Returns the buffers `[a, b, f]`, which
/// must outlive the submit.
fn host_add(h: CallableHandle) -> (Orchestration, [simpler_worker::HostBuffer; 3]) {
    let buf = |v: Vec<f32>| simpler_worker::HostBuffer::from_bytes(&f32_to_le_bytes(&v)).unwrap();
    let a = buf((0..BIG).map(|i| i as f32).collect());
    let b = buf((0..BIG).map(|i| 0.5 * i as f32).collect());
    let f = buf(vec![7.0; BIG]);
    let mut args = TaskArgs::new();
    let t = |x: &simpler_worker::HostBuffer| x.tensor(&[BIG as u32], DataType::Float32).unwrap();
    args.add_input(t(&a)).unwrap();
    args.add_input(t(&b)).unwrap();
    args.add_output(t(&f)).unwrap();
    (on_chip(h, args, WorkerId(0)), [a, b, f])
}

fn host_expected() -> Vec<f32> {
    (0..BIG).map(|i| 1.5 * i as f32).collect()
}

/// Open descriptors of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Host buffers on a chip task reach a chip process and its result comes back, in pieces that
/// fit the mailbox; the staging copies are freed in the child.
#[test]
fn host_buffers_on_a_chip_task_cross_to_its_process_and_back() {
    let _serial = serial();
    let mut b = process_host(&[0], options());
    let h = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let ledger = || w.chip_memory(WorkerId(0)).unwrap().ledger().unwrap().user_allocations;
    let before = ledger();
    let (run, [_a, _b, f]) = host_add(h);
    w.run(run).expect("run");
    assert!(f32_from_le_bytes(&f.to_vec()) == host_expected(), "f = a + b came back");
    assert_eq!(ledger(), before, "the staging copies were freed");
    w.close().expect("close");
    assert_eq!(mailboxes(), 0);
}

/// A child that dies while a host tensor's written span comes back leaves the host buffer as
/// it was before the task (copy-back is all or nothing); the death is reaped at once, nothing
/// is restarted until the next use (not even to free the staging copies, which died with the
/// process), nothing leaks, and the restarted chip then runs the task.
#[test]
fn a_child_dying_during_copy_back_leaves_the_host_buffer_untouched_and_leaks_nothing() {
    let _serial = serial();
    let threads_before = common::threads_named("sim").len();
    let (fds_before, zombies_before) = (fds(), zombies());
    let (w, h) = restarting_add_chip();
    let pid = w.chip_process_id(WorkerId(0)).unwrap().expect("pid");
    assert!(w.arm_chip_process_fault(WorkerId(0), ChildFault::SegfaultOnCopyBack).unwrap());
    let (run, [_a, _b, f]) = host_add(h);
    let e = w.submit(run).unwrap().wait().expect_err("crash");
    match child_error(&e) {
        Some(ChildError::Died { pid: p, exit: ChildExit::Signal(11), operation, .. }) => {
            assert_eq!((p, operation), (pid, "copy_from"));
        }
        other => panic!("expected a death during copy-back, got {other:?} ({e})"),
    }
    let changed = f32_from_le_bytes(&f.to_vec()).iter().filter(|&&x| x != 7.0).count();
    assert_eq!(changed, 0, "no byte came back");
    assert!(!exists(pid), "the dead child was reaped");
    assert_eq!(w.chip_process_id(WorkerId(0)).unwrap(), None, "no restart before the next use");
    assert_eq!((mailboxes(), zombies()), (0, zombies_before));
    let (run, [_a, _b, f]) = host_add(h);
    w.run(run).expect("runs after the restart");
    assert!(f32_from_le_bytes(&f.to_vec()) == host_expected(), "f = a + b came back");
    assert_eq!(w.chip_memory(WorkerId(0)).unwrap().ledger().unwrap().user_allocations, 0);
    w.close().expect("close");
    assert_eq!((mailboxes(), zombies(), fds()), (0, zombies_before, fds_before));
    assert_eq!(common::threads_named("sim").len(), threads_before, "no thread outlives the worker");
}

/// Set in the environment of the helper process of the orphan test.
const ORPHAN_HELPER: &str = "SIMPLER_TEST_ORPHAN_HELPER";

/// Whether `pid` has ended: gone, or a zombie waiting for a reaper that is not this process.
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, t)| t.trim_start().starts_with('Z')),
    }
}

/// The helper of the orphan test (does nothing unless started by it): an L3 worker with two
/// chip processes, chip 1 hung inside a task; it prints both pids and waits to be killed.
#[test]
fn orphan_helper() {
    if std::env::var_os(ORPHAN_HELPER).is_none() {
        return;
    }
    let mut b = process_host(&[0, 1], options());
    let h = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let (args, _) = inputs(&w, WorkerId(1));
    // Asked before chip 1's lane is stuck in the task.
    let pid = |c| w.chip_process_id(WorkerId(c)).unwrap().expect("pid");
    let pids = (pid(0), pid(1));
    assert!(w.arm_chip_process_fault(WorkerId(1), ChildFault::Hang).unwrap());
    let _stuck = w.submit(on_chip(h, args, WorkerId(1))).expect("submit");
    // Give chip 1's process time to take the task before the test kills this process.
    std::thread::sleep(Duration::from_millis(200));
    println!("chip-pids {} {}", pids.0, pids.1);
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A worker process killed outright (no close, no drop) leaves no chip process behind: the
/// idle one and the one stuck in a task both exit on their own.
#[test]
fn chip_processes_of_a_killed_worker_exit_on_their_own() {
    use std::io::BufRead;
    let _serial = serial();
    let mut helper = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args(["--exact", "orphan_helper", "--nocapture", "--test-threads=1"])
        .env(ORPHAN_HELPER, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("helper");
    let stdout = helper.stdout.take().expect("stdout");
    let pids: Vec<u32> = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            // The harness may have put "test orphan_helper ... " in front on the same line.
            let (_, p) = l.split_once("chip-pids ")?;
            Some(p.split(' ').map(|n| n.parse().unwrap()).collect())
        })
        .expect("the helper printed its chip pids");
    assert!(pids.iter().all(|&p| !ended(p)), "both chip processes run");
    helper.kill().expect("kill the helper");
    helper.wait().expect("reap the helper");
    // Only catches a chip process that never exits; they normally go within milliseconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !pids.iter().all(|&p| ended(p)) {
        if std::time::Instant::now() > deadline {
            // Leave nothing behind even when failing.
            for &p in &pids {
                let _ = std::process::Command::new("kill").args(["-9", &p.to_string()]).status();
            }
            panic!("a chip process outlived its worker: {pids:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
