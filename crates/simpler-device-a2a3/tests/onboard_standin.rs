//! The onboard backend against the stand-in CANN library: the order and arguments of every
//! CANN call, read from the stand-in's call log, and the runner conformance bodies that apply
//! to both backends, run on the simulator and on the onboard backend.
//!
//! What a stand-in run covers: the whole host path of a run (preparation, image upload through
//! the host mapping, both launches with their arguments, both stream syncs with the budget, the
//! reap, the latched-status read, copy-back and cleanup). What it does not: nothing executes
//! the AICPU or AICore programs, so a "completed" run's outputs hold whatever the host wrote,
//! and the device-side handshake, scheduler and timing records are never produced (the report
//! carries the "timing incomplete" warning).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::standin::{
    AddRun, Onboard, STREAM_SYNC_MS, add_callable_with, add_object_callable, count, names, position,
};
use simpler_acl_sys::LoadError;
use simpler_acl_sys::standin::{Call, FakeInstall, ObjectKind};
use simpler_device_a2a3::programs::add;
use simpler_device_a2a3::{
    AcceptanceSignal, ActiveRun, ChipCallable, CopyKind, DeviceError, DeviceHealth, DeviceRunner,
    ErrorClass, InitFailure, InitStep, KernelKind, MemPurpose, RunRequest, RunnerOptions,
    RuntimeVariant, StreamKind,
};
use simpler_types::{CallConfig, RunId, TimeoutBudget};

fn run_id(n: u64) -> RunId {
    RunId::from_raw(n).unwrap()
}

// ----- The two backends behind one interface -----

/// A backend the shared test bodies run on.
trait Bench {
    fn options(&self, device: u32) -> RunnerOptions;
    /// The one-task `f = a + b` program in the code form the backend executes.
    fn add_callable(&self) -> ChipCallable;
    /// Makes the next AICore launch fail.
    fn fail_next_aicore_launch(&self, r: &DeviceRunner);
    /// Whether kernels run, so outputs can be checked.
    fn executes_kernels(&self) -> bool;
}

struct Sim;

impl Bench for Sim {
    fn options(&self, device: u32) -> RunnerOptions {
        common::fast_options(device)
    }

    fn add_callable(&self) -> ChipCallable {
        add::callable().unwrap()
    }

    fn fail_next_aicore_launch(&self, r: &DeviceRunner) {
        r.sim_faults().unwrap().fail_launch(KernelKind::AiCore, 1);
    }

    fn executes_kernels(&self) -> bool {
        true
    }
}

impl Bench for Onboard {
    fn options(&self, device: u32) -> RunnerOptions {
        self.options_on(device, RuntimeVariant::HostBuildGraph)
    }

    fn add_callable(&self) -> ChipCallable {
        common::standin::add_callable()
    }

    fn fail_next_aicore_launch(&self, r: &DeviceRunner) {
        let next = r.stats().aicore_launches + 1;
        self.install.fail_call("rtKernelLaunchWithHandleV2", next, 207_001).unwrap();
    }

    fn executes_kernels(&self) -> bool {
        false
    }
}

/// One successful run; on a backend that executes kernels, the output is checked.
fn run_add(b: &dyn Bench, r: &mut DeviceRunner, run: u64) {
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(r);
    r.run(&RunRequest::new(run_id(run), slot, &v.args, &CallConfig::default())).unwrap();
    if b.executes_kernels() {
        assert_eq!(v.output(r), vec![3.0; 64]);
    }
    v.free(r);
    r.unregister_callable(slot).unwrap();
}

// ----- Shared bodies -----

fn memory_range_checks(b: &dyn Bench) {
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    assert!(matches!(
        r.malloc(0),
        Err(DeviceError::InvalidArgs { problem: simpler_device_a2a3::ArgsProblem::ZeroMalloc, .. })
    ));
    let p = r.malloc(3000).unwrap();
    assert_eq!(p.addr() % 1024, 0);
    let mut buf = vec![0xAB; 3000];
    r.copy_from_device(&mut buf, p).unwrap();
    assert!(buf.iter().all(|&x| x == 0), "fresh memory reads as zero");
    assert!(matches!(
        r.copy_to_device(p.offset(2999), &[1, 2]),
        Err(DeviceError::BadDevicePointer { len: 2, .. })
    ));
    assert!(matches!(r.memset(p.offset(4096), 0, 1), Err(DeviceError::BadDevicePointer { .. })));
    r.memset(p, 7, 3000).unwrap();
    r.copy_from_device(&mut buf, p).unwrap();
    assert!(buf.iter().all(|&x| x == 7));
    assert!(matches!(r.free(p.offset(8)), Err(DeviceError::BadDevicePointer { .. })));
    r.free(p).unwrap();
    assert!(matches!(r.free(p), Err(DeviceError::BadDevicePointer { .. })));
    let _leak = r.malloc(100).unwrap();
    assert_eq!(r.stats().live_allocations, 1);
    let report = r.finalize().unwrap();
    assert!(report.freed_allocations >= 1);
}

fn unusable_fails_fast_and_finalize_recovers(b: &dyn Bench) {
    let mut r = DeviceRunner::attach(b.options(4)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    let cfg = CallConfig::default();
    b.fail_next_aicore_launch(&r);
    let cleanups = r.stats().terminal_cleanups;
    let err = r.run(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap_err();
    assert!(matches!(err, DeviceError::Launch { kernel: KernelKind::AiCore, .. }), "{err}");
    assert_eq!(r.stats().terminal_cleanups, cleanups + 1, "terminal cleanup exactly once");
    assert!(matches!(r.health(), DeviceHealth::Unusable { .. }));
    let unusable = |e: DeviceError| matches!(e, DeviceError::Unusable { device_id: 4, .. });
    assert!(unusable(r.run(&RunRequest::new(run_id(2), slot, &v.args, &cfg)).unwrap_err()));
    assert!(unusable(r.malloc(16).unwrap_err()));
    assert!(unusable(r.copy_to_device(v.ptrs[0], &[0; 4]).unwrap_err()));
    assert!(unusable(r.copy_from_device(&mut [0; 4], v.ptrs[0]).unwrap_err()));
    assert!(unusable(r.memset(v.ptrs[0], 0, 4).unwrap_err()));
    assert!(unusable(r.register_callable(&b.add_callable()).unwrap_err()));
    v.free(&mut r);
    r.finalize().unwrap();
    let mut fresh = DeviceRunner::attach(b.options(4)).unwrap();
    assert!(fresh.health().is_healthy());
    run_add(b, &mut fresh, 1);
    fresh.finalize().unwrap();
}

fn finalize_then_reattach_runs(b: &dyn Bench) {
    for round in 0..2 {
        let mut r = DeviceRunner::attach(b.options(1)).unwrap();
        run_add(b, &mut r, round + 1);
        r.finalize().unwrap();
    }
}

fn pipelined_handles_and_launch_acceptance(b: &dyn Bench) {
    let mut r = DeviceRunner::attach(b.options(2)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let (v1, v2) = (AddRun::new(&mut r), AddRun::new(&mut r));
    let cfg = CallConfig::default();
    let signal = Arc::new(AcceptanceSignal::new());
    let first = r
        .prepare(&RunRequest::new(run_id(1), slot, &v1.args, &cfg).with_acceptance(&signal))
        .unwrap();
    assert_eq!(signal.accepted(), None, "nothing is accepted before the launch");
    let active = r.launch_run(first).unwrap();
    assert_eq!(signal.accepted(), Some(1), "published right after the launch, before the reap");
    // The next run is prepared in the other slot while the first one is in flight.
    let second = r.prepare(&RunRequest::new(run_id(2), slot, &v2.args, &cfg)).unwrap();
    assert_ne!(second.slot(), active.slot());
    assert!(r.reap_run(&active, None).unwrap());
    r.complete_run(active).unwrap();
    assert_eq!(signal.accepted(), Some(1), "sticky: the runner never clears it");
    let active = r.launch_run(second).unwrap();
    r.reap_run(&active, None).unwrap();
    r.complete_run(active).unwrap();
    if b.executes_kernels() {
        assert_eq!(v1.output(&mut r), vec![3.0; 64]);
        assert_eq!(v2.output(&mut r), vec![3.0; 64]);
    }
    // A launch failure publishes nothing.
    signal.reset();
    let v3 = AddRun::new(&mut r);
    b.fail_next_aicore_launch(&r);
    let req = RunRequest::new(run_id(3), slot, &v3.args, &cfg).with_acceptance(&signal);
    assert!(matches!(r.run(&req), Err(DeviceError::Launch { .. })));
    assert_eq!(signal.accepted(), None, "a failed launch is never accepted");
    for v in [v1, v2, v3] {
        v.free(&mut r);
    }
    r.finalize().unwrap();
}

macro_rules! on_both_backends {
    ($($name:ident => $body:ident;)*) => {
        mod sim {
            $(#[test] fn $name() { super::$body(&super::Sim); })*
        }
        mod onboard {
            $(#[test] fn $name() {
                let b = super::Onboard::new();
                super::$body(&b);
                assert_eq!(b.live(), [0; 5], "every CANN object released");
            })*
        }
    };
}

on_both_backends! {
    memory_ranges_are_checked_by_the_runner => memory_range_checks;
    an_unusable_runner_fails_fast_and_finalize_recovers => unusable_fails_fast_and_finalize_recovers;
    finalize_then_reattach_runs_again => finalize_then_reattach_runs;
    runs_are_pipelined_through_handles_and_publish_launch_acceptance => pipelined_handles_and_launch_acceptance;
}

// ----- Log-driven tests (onboard only) -----

/// The two stream handles, AICPU first, from an attach log.
fn streams(log: &[Call]) -> (u64, u64) {
    let s: Vec<u64> =
        log.iter().filter(|c| c.func == "rtStreamCreate").filter_map(|c| c.stream).collect();
    assert_eq!(s.len(), 2, "{:?}", names(log));
    (s[0], s[1])
}

#[test]
fn attach_initializes_in_the_original_order() {
    let b = Onboard::new();
    let r = DeviceRunner::attach(b.options(0)).unwrap();
    let log = b.log();
    let order = [
        "dlog_setlevel",
        "rtSetDevice",
        "aclrtSetOpExecuteTimeOutV2",
        "rtStreamCreate",
        "aclrtGetStreamResLimit",
        "rtAicpuKernelLaunchExWithArgs",
        "rtsBinaryLoadFromFile",
        "rtRegisterAllKernel",
        "rtsLaunchCpuKernel",
    ];
    let at: Vec<usize> = order.iter().map(|f| position(&log, f)).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{:?}", names(&log));
    let device_calls = ["rtSetDevice", "aclrtSetDevice", "rtStreamCreate", "rtMalloc"];
    assert!(
        log[..at[0]].iter().all(|c| !device_calls.contains(&c.func.as_str())),
        "the log level is set before the first bind: {:?}",
        names(&log)
    );
    let (aicpu, aicore) = streams(&log);
    assert!(aicpu < aicore, "AICPU stream first");
    assert_eq!(log[at[4]].stream, Some(aicore), "core limits queried on a stream");
    let op_us = log[at[2]].timeout;
    assert_eq!(op_us, Some(600_000));
    // The bootstrap and the init launch each wait on the AICPU stream with the 50 s budget.
    let syncs: Vec<&Call> =
        log.iter().filter(|c| c.func == "aclrtSynchronizeStreamWithTimeout").collect();
    assert_eq!(syncs.len(), 2);
    assert!(syncs.iter().all(|c| c.stream == Some(aicpu) && c.timeout == Some(50_000)));
    let init = &log[at[8]];
    assert_eq!((init.block_dim, init.stream), (Some(1), Some(aicpu)));
    assert!(init.text.starts_with("simpler_aicpu_init_"), "{init}");
    assert_eq!(log[at[5]].text, "AST_DYN_AICPU");
    assert_eq!(count(&log, "rtsFuncGetByName"), 2, "init and exec entries");
    drop(r);
}

#[test]
fn a_run_launches_aicore_then_aicpu_and_syncs_aicpu_then_aicore_with_the_budget() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let (aicpu, aicore) = streams(&b.log());
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    b.log();
    let cfg = CallConfig::builder().block_dim(2).build().unwrap();
    let report = r.run(&RunRequest::new(run_id(7), slot, &v.args, &cfg)).unwrap();
    assert_eq!(report.block_dim, 2);
    let log = b.log();
    let l2 = position(&log, "rtKernelLaunchWithHandleV2");
    assert_eq!(
        (count(&log, "rtKernelLaunchWithHandleV2"), count(&log, "rtsLaunchCpuKernel")),
        (1, 1),
        "one launch each: {:?}",
        names(&log)
    );
    assert_eq!(
        log[l2 + 1].func,
        "rtsLaunchCpuKernel",
        "nothing between the launches: {:?}",
        names(&log)
    );
    assert_eq!((log[l2].stream, log[l2].block_dim, log[l2].size), (Some(aicore), Some(2), Some(8)));
    assert_eq!(log[l2].value, Some(1), "batch schedule mode");
    assert_eq!(log[l2 + 1].stream, Some(aicpu));
    assert!(log[l2 + 1].text.starts_with("simpler_aicpu_exec_"));
    let syncs: Vec<(Option<u64>, Option<i64>)> = log[l2..]
        .iter()
        .filter(|c| c.func == "aclrtSynchronizeStreamWithTimeout")
        .map(|c| (c.stream, c.timeout))
        .collect();
    // The AICPU sync has the whole budget, the AICore sync what is left of it (the stand-in's
    // AICPU sync returns at once, so nearly all of it).
    assert_eq!(syncs.len(), 2, "{syncs:?}");
    assert_eq!(syncs[0], (Some(aicpu), Some(STREAM_SYNC_MS)));
    assert_eq!(syncs[1].0, Some(aicore));
    let left = syncs[1].1.unwrap();
    assert!((1..=STREAM_SYNC_MS).contains(&left), "{syncs:?}");
    assert_eq!(
        log[l2 + 2].func,
        "aclrtSynchronizeStreamWithTimeout",
        "the reap follows the launches"
    );
    assert!(
        !names(&log[..l2]).contains(&"aclrtSynchronizeStreamWithTimeout"),
        "no sync before the launch"
    );
    assert!(r.health().is_healthy());
    v.free(&mut r);
    r.unregister_callable(slot).unwrap();
    r.finalize().unwrap();
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn the_aicore_binary_is_registered_once_per_runner() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    run_add(&b, &mut r, 1);
    run_add(&b, &mut r, 2);
    let log = b.log();
    assert_eq!(count(&log, "rtRegisterAllKernel"), 1);
    assert_eq!(count(&log, "rtKernelLaunchWithHandleV2"), 2);
    r.finalize().unwrap();
}

#[test]
fn the_aicore_executor_is_unregistered_at_a_healthy_finalize_and_left_to_a_forced_one() {
    let b = Onboard::new();
    let registered = || b.install.live(ObjectKind::KernelBinaries).unwrap();
    for n in 1..=3 {
        let mut r = DeviceRunner::attach(b.options(0)).unwrap();
        run_add(&b, &mut r, n);
        assert_eq!(registered(), 1);
        r.finalize().unwrap();
        assert_eq!(registered(), 0, "attach {n} left its executor registered");
    }
    assert_eq!(count(&b.log(), "rtDevBinaryUnRegister"), 3);

    // A device whose stream fault leaves it to the force reset may still run the executor.
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    b.install.fail_call("aclrtSynchronizeStreamWithTimeout", 0, 507_018).unwrap();
    let cfg = CallConfig::default();
    r.run(&RunRequest::new(run_id(4), slot, &v.args, &cfg)).unwrap_err();
    v.free(&mut r);
    let _ = r.finalize();
    assert_eq!(registered(), 1, "left registered with the reset device");
    assert_eq!(count(&b.log(), "rtDevBinaryUnRegister"), 0);
}

#[test]
fn an_executor_unregister_cann_refuses_is_the_finalize_error() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    run_add(&b, &mut r, 1);
    b.install.fail_call("rtDevBinaryUnRegister", 0, 507_899).unwrap();
    let err = r.finalize().unwrap_err();
    assert_eq!(
        acl_source(&err).map(|a| (a.func, a.code)),
        Some(("rtDevBinaryUnRegister", 507_899)),
        "{err:?}"
    );
}

/// Attaches, registers and uploads, then clears the log.
fn prepared(b: &Onboard) -> (DeviceRunner, simpler_device_a2a3::ChipSlot, AddRun, (u64, u64)) {
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let s = streams(&b.log());
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    b.log();
    (r, slot, v, s)
}

/// The CANN call a launch error's typed source names, and its code.
fn refusing_call(err: &DeviceError) -> (&'static str, i32) {
    let acl = acl_source(err).expect("a launch refusal without its CANN error");
    (acl.func, acl.code)
}

#[test]
fn a_run_launched_without_queueing_is_seen_finished_by_a_poll() {
    let b = Onboard::new();
    let (mut r, slot, v, _) = prepared(&b);
    let p = r.prepare(&RunRequest::new(run_id(3), slot, &v.args, &CallConfig::default())).unwrap();
    let a = r.launch_run(p).unwrap();
    // Without per-run events a poll asks each stream with CANN's shortest sync.
    let started = Instant::now();
    while !r.poll_run(&a).unwrap() {
        assert!(started.elapsed() < Duration::from_secs(20), "no poll saw the run finish");
        std::thread::sleep(Duration::from_millis(5));
    }
    let log = b.log();
    let polls: Vec<&Call> =
        log.iter().filter(|c| c.func == "aclrtSynchronizeStreamWithTimeout").collect();
    assert!(!polls.is_empty() && polls.iter().all(|c| c.timeout == Some(1)), "{polls:?}");
    assert!(r.reap_run(&a, None).unwrap());
    r.complete_run(a).unwrap();
    v.free(&mut r);
    r.finalize().unwrap();
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn a_run_whose_image_cannot_be_mapped_to_the_host_is_refused_not_passed_as_a_success() {
    // Without the mapping neither the handshake clear before the launch nor the read of the
    // run's latched status after it can happen: the run used to launch and reap as a success.
    let b = Onboard::new();
    let (mut r, slot, v, _) = prepared(&b);
    b.install.fail_call("halHostRegister", 0, 207_000).unwrap();
    let err =
        r.run(&RunRequest::new(run_id(5), slot, &v.args, &CallConfig::default())).unwrap_err();
    let DeviceError::Unsupported { run_id: Some(id), feature, cause: Some(cause) } = &err else {
        panic!("{err}")
    };
    assert!(*id == run_id(5) && feature.contains("host view"), "{err}");
    // The driver's refusal is the error's typed cause, not only a line in the log.
    match &**cause {
        DeviceError::Acl { source, .. } => {
            assert_eq!((source.func, source.code), ("halHostRegister", 207_000));
        }
        e => panic!("{e}"),
    }
    assert_eq!(count(&b.log(), "rtKernelLaunchWithHandleV2"), 0, "nothing was launched");
    assert!(r.health().is_healthy(), "the device itself is fine");
    v.free(&mut r);
    r.finalize().unwrap();
}

#[test]
fn a_fault_a_poll_saw_is_the_reaps_error_even_when_the_device_does_not_report_it_again() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    let p = r.prepare(&RunRequest::new(run_id(4), slot, &v.args, &CallConfig::default())).unwrap();
    let a = r.launch_run(p).unwrap();
    // The poll's first sync fails, once: the stand-in's later syncs all succeed.
    let nth = count(&b.log(), "aclrtSynchronizeStreamWithTimeout") as u64 + 1;
    b.install.fail_call("aclrtSynchronizeStreamWithTimeout", nth, 507_015).unwrap();
    assert!(r.poll_run(&a).unwrap(), "a faulted run is decided");
    let err = r.reap_run(&a, None).unwrap_err();
    assert!(
        matches!(&err, DeviceError::DeviceFault { run_id: id, code, .. }
            if *id == run_id(4) && code.get() == 507_015),
        "{err}"
    );
    assert!(!r.health().is_healthy(), "the fault made the device unusable");
    v.free(&mut r);
    let _ = r.finalize();
}

#[test]
fn a_failed_aicore_launch_drains_once_marks_unusable_and_never_launches_the_aicpu() {
    let b = Onboard::new();
    let (mut r, slot, v, _) = prepared(&b);
    b.install.fail_call("rtKernelLaunchWithHandleV2", 1, 207_001).unwrap();
    let cleanups = r.stats().terminal_cleanups;
    let err =
        r.run(&RunRequest::new(run_id(3), slot, &v.args, &CallConfig::default())).unwrap_err();
    match &err {
        DeviceError::Launch { run_id: id, kernel: KernelKind::AiCore, code, .. } => {
            assert_eq!((*id, code.get()), (run_id(3), 207_001));
        }
        e => panic!("{e}"),
    }
    assert!(err.to_string().contains("ACL_ERROR_RT_MEMORY_ALLOCATION"), "{err}");
    assert_eq!(refusing_call(&err), ("rtKernelLaunchWithHandleV2", 207_001), "{err:?}");
    let log = b.log();
    let l2 = position(&log, "rtKernelLaunchWithHandleV2");
    assert_eq!(log[l2].ret, 207_001);
    assert_eq!(count(&log, "rtsLaunchCpuKernel"), 0, "{:?}", names(&log));
    assert_eq!(count(&log, "aclrtSynchronizeStreamWithTimeout"), 0);
    let drains: Vec<&Call> =
        log.iter().filter(|c| c.func == "aclrtSynchronizeDeviceWithTimeout").collect();
    assert_eq!(drains.len(), 1, "one bounded drain");
    assert_eq!(drains[0].timeout, Some(STREAM_SYNC_MS));
    assert_eq!(r.stats().terminal_cleanups, cleanups + 1);
    assert!(matches!(r.health(), DeviceHealth::Unusable { .. }));
    v.free(&mut r);
    r.finalize().unwrap();
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn a_recovery_drain_cann_refuses_is_logged_with_its_code() {
    let b = Onboard::new();
    let (mut r, slot, v, _) = prepared(&b);
    b.install.fail_call("rtKernelLaunchWithHandleV2", 1, 207_001).unwrap();
    b.install.fail_call("aclrtSynchronizeDeviceWithTimeout", 1, 507_899).unwrap();
    let cfg = CallConfig::default();
    let text = common::logged(|| {
        r.run(&RunRequest::new(run_id(3), slot, &v.args, &cfg)).unwrap_err();
    });
    assert!(
        text.contains("drain failed")
            && text.contains("aclrtSynchronizeDeviceWithTimeout")
            && text.contains("507899"),
        "logged: {text:?}"
    );
    v.free(&mut r);
    r.finalize().unwrap();
}

#[test]
fn a_failed_aicpu_launch_drains_once_and_marks_unusable() {
    let b = Onboard::new();
    let (mut r, slot, v, _) = prepared(&b);
    // The first `rtsLaunchCpuKernel` was the init launch.
    b.install.fail_call("rtsLaunchCpuKernel", 2, 507_018).unwrap();
    let cleanups = r.stats().terminal_cleanups;
    let err =
        r.run(&RunRequest::new(run_id(4), slot, &v.args, &CallConfig::default())).unwrap_err();
    assert!(matches!(err, DeviceError::Launch { kernel: KernelKind::Aicpu, .. }), "{err}");
    assert!(err.to_string().contains("ACL_ERROR_RT_AICPU_EXCEPTION"), "{err}");
    assert_eq!(refusing_call(&err), ("rtsLaunchCpuKernel", 507_018), "{err:?}");
    let log = b.log();
    assert!(position(&log, "rtKernelLaunchWithHandleV2") < position(&log, "rtsLaunchCpuKernel"));
    assert_eq!(count(&log, "aclrtSynchronizeDeviceWithTimeout"), 1);
    assert_eq!(count(&log, "aclrtSynchronizeStreamWithTimeout"), 0);
    assert_eq!(r.stats().terminal_cleanups, cleanups + 1);
    assert!(matches!(r.health(), DeviceHealth::Unusable { .. }));
    v.free(&mut r);
    r.finalize().unwrap();
    assert_eq!(b.live(), [0; 5]);
}

fn sync_timeout_on(stream_index: i64) -> (Onboard, DeviceError, Vec<Call>, (u64, u64)) {
    let b = Onboard::new();
    let (mut r, slot, v, s) = prepared(&b);
    b.install.set_value("sync_timeout_stream", stream_index).unwrap();
    let err =
        r.run(&RunRequest::new(run_id(5), slot, &v.args, &CallConfig::default())).unwrap_err();
    let log = b.log();
    assert!(matches!(r.health(), DeviceHealth::Unusable { .. }));
    v.free(&mut r);
    r.finalize().unwrap();
    assert_eq!(count(&b.log(), "aclrtResetDeviceForce"), 1, "a timed-out device is force-reset");
    assert_eq!(b.live(), [0; 5]);
    (b, err, log, s)
}

#[test]
fn an_aicpu_stream_sync_timeout_stops_there_and_is_a_stream_sync_timeout() {
    let (_b, err, log, (aicpu, _)) = sync_timeout_on(1);
    match &err {
        DeviceError::Timeout { budget: TimeoutBudget::StreamSync, limit, .. } => {
            assert_eq!(*limit, Duration::from_millis(STREAM_SYNC_MS as u64));
        }
        e => panic!("{e}"),
    }
    let syncs: Vec<&Call> =
        log.iter().filter(|c| c.func == "aclrtSynchronizeStreamWithTimeout").collect();
    assert_eq!(syncs.len(), 1, "the AICore stream is not synced after the first error");
    assert_eq!((syncs[0].stream, syncs[0].ret), (Some(aicpu), 507_046));
    assert_eq!(count(&log, "aclrtSynchronizeDeviceWithTimeout"), 1);
}

#[test]
fn an_aicore_stream_sync_timeout_follows_a_good_aicpu_sync() {
    let (_b, err, log, (aicpu, aicore)) = sync_timeout_on(2);
    assert!(matches!(err, DeviceError::Timeout { budget: TimeoutBudget::StreamSync, .. }), "{err}");
    let syncs: Vec<(Option<u64>, i64)> = log
        .iter()
        .filter(|c| c.func == "aclrtSynchronizeStreamWithTimeout")
        .map(|c| (c.stream, c.ret))
        .collect();
    assert_eq!(syncs, [(Some(aicpu), 0), (Some(aicore), 507_046)]);
}

#[test]
fn a_run_reaped_in_slices_on_a_device_that_never_finishes_times_out_at_the_stream_sync_budget() {
    let b = Onboard::new();
    let (mut r, slot, v, (aicpu, _)) = prepared(&b);
    // Every sync of the AICPU stream runs out: the device never finishes the run.
    b.install.set_value("sync_timeout_stream", 1).unwrap();
    let p = r.prepare(&RunRequest::new(run_id(6), slot, &v.args, &CallConfig::default())).unwrap();
    let a = r.launch_run(p).unwrap();
    // Reaped the way the L2 lane does between jobs: short bounded waits that give up, with the
    // lane's other work in between.
    let mut slices = 0u32;
    let end = loop {
        match r.reap_run(&a, Some(Duration::from_millis(5))) {
            Ok(false) => slices += 1,
            other => break other,
        }
        assert!(slices < 6_000, "the slices never used up the stream-sync budget");
        std::thread::sleep(Duration::from_millis(5));
    };
    match &end {
        Err(DeviceError::Timeout { budget: TimeoutBudget::StreamSync, limit, .. }) => {
            assert_eq!(*limit, Duration::from_millis(STREAM_SYNC_MS as u64));
        }
        other => panic!("a run the device never finishes must time out, got {other:?}"),
    }
    assert!(slices > 0, "the slices before the budget passed left the run launched");
    // The last sync asked only for what was left of the budget.
    let log = b.log();
    let last = log.iter().rev().find(|c| c.func == "aclrtSynchronizeStreamWithTimeout").unwrap();
    assert_eq!(last.stream, Some(aicpu));
    assert!(last.timeout.is_some_and(|t| (0..=5).contains(&t)), "{last:?}");
    assert!(matches!(r.health(), DeviceHealth::Unusable { .. }));
    v.free(&mut r);
    r.finalize().unwrap();
    assert_eq!(b.live(), [0; 5]);
}

/// A run launched and reaped once in a slice whose first stream sync (of the AICPU stream) ran
/// out: the caller gave up before the device finished.
fn launched_and_reaped_in_a_slice_that_ran_out(b: &Onboard) -> (DeviceRunner, AddRun, ActiveRun) {
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    let p = r.prepare(&RunRequest::new(run_id(8), slot, &v.args, &CallConfig::default())).unwrap();
    let a = r.launch_run(p).unwrap();
    // Faults count calls since the install was made, so the log is counted from there.
    let nth = count(&b.log(), "aclrtSynchronizeStreamWithTimeout") as u64 + 1;
    b.install.fail_call("aclrtSynchronizeStreamWithTimeout", nth, 507_046).unwrap();
    assert!(!r.reap_run(&a, Some(Duration::from_millis(1))).unwrap());
    (r, v, a)
}

#[test]
fn a_stream_sync_that_runs_out_at_the_callers_deadline_leaves_the_device_healthy() {
    let b = Onboard::new();
    let (mut r, v, a) = launched_and_reaped_in_a_slice_that_ran_out(&b);
    assert!(r.reap_run(&a, None).unwrap());
    r.complete_run(a).unwrap();
    assert!(matches!(r.health(), DeviceHealth::Healthy), "{:?}", r.health());
    v.free(&mut r);
    r.finalize().unwrap();
    // A run that ended well leaves nothing to recover from: a plain reset, no force reset.
    let log = b.log();
    assert_eq!(count(&log, "aclrtResetDeviceForce"), 0, "{:?}", names(&log));
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn finalize_with_a_launched_run_force_resets_the_device() {
    let b = Onboard::new();
    // The run may still execute when the caller gives up and finalizes.
    let (r, v, a) = launched_and_reaped_in_a_slice_that_ran_out(&b);
    drop(a);
    drop(v);
    r.finalize().unwrap();
    let log = b.log();
    assert_eq!(count(&log, "aclrtResetDeviceForce"), 1, "{:?}", names(&log));
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn finalize_with_a_launched_run_from_a_thread_that_cannot_bind_still_force_resets() {
    let b = Onboard::new();
    let (r, v, a) = launched_and_reaped_in_a_slice_that_ran_out(&b);
    drop(a);
    drop(v);
    // Every later bind is refused: the finalizing thread is not the one bound.
    b.install.fail_call("rtSetDevice", 0, 107_000).unwrap();
    let finalized = std::thread::spawn(move || r.finalize().map(drop)).join().unwrap();
    let log = b.log();
    assert_eq!(count(&log, "aclrtResetDeviceForce"), 1, "{finalized:?}: {:?}", names(&log));
}

/// The device takes `DELAY_MS` of the stream-sync budget to finish the AICPU stream's work
/// and never finishes the AICore stream's.
const DELAY_MS: i64 = STREAM_SYNC_MS * 2 / 3;

fn slow_aicpu_then_stuck_aicore(install: &FakeInstall) {
    // Stream creation indices: 1 the AICPU stream, 2 the AICore stream.
    install.set_value("sync_delay_stream", 1).unwrap();
    install.set_value("sync_delay_ms", DELAY_MS).unwrap();
    install.set_value("sync_timeout_stream", 2).unwrap();
}

/// The timeout argument of the last logged call of `func`, in milliseconds.
fn last_timeout(log: &[Call], func: &str) -> i64 {
    let last = log.iter().rev().find(|c| c.func == func).unwrap();
    last.timeout.unwrap()
}

#[test]
fn the_two_stream_syncs_of_a_reap_share_its_budget() {
    let b = Onboard::new();
    let (mut r, slot, v, _) = prepared(&b);
    slow_aicpu_then_stuck_aicore(&b.install);
    let err =
        r.run(&RunRequest::new(run_id(7), slot, &v.args, &CallConfig::default())).unwrap_err();
    assert!(matches!(err, DeviceError::Timeout { budget: TimeoutBudget::StreamSync, .. }), "{err}");
    // The AICore sync may wait only what the AICPU sync left, not a whole budget again.
    let aicore = last_timeout(&b.log(), "aclrtSynchronizeStreamWithTimeout");
    assert!((1..=STREAM_SYNC_MS - DELAY_MS).contains(&aicore), "AICore sync given {aicore} ms");
    v.free(&mut r);
    r.finalize().unwrap();
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn the_two_end_event_syncs_of_a_queued_reap_share_its_budget() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0).with_device_queue(true)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default())).unwrap();
    let a = r.launch_run(p).unwrap();
    slow_aicpu_then_stuck_aicore(&b.install);
    let err = r.reap_run(&a, None).unwrap_err();
    assert!(matches!(err, DeviceError::Timeout { budget: TimeoutBudget::StreamSync, .. }), "{err}");
    let aicore = last_timeout(&b.log(), "aclrtSynchronizeEventWithTimeout");
    assert!(
        (1..=STREAM_SYNC_MS - DELAY_MS).contains(&aicore),
        "AICore end-event sync given {aicore} ms"
    );
    v.free(&mut r);
    r.finalize().unwrap();
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn an_unusable_runner_makes_no_cann_call_at_all() {
    let b = Onboard::new();
    let (mut r, slot, v, _) = prepared(&b);
    b.install.fail_call("rtKernelLaunchWithHandleV2", 1, 207_001).unwrap();
    let cfg = CallConfig::default();
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap_err();
    b.log();
    assert!(r.run(&RunRequest::new(run_id(2), slot, &v.args, &cfg)).is_err());
    assert!(r.malloc(16).is_err());
    assert!(r.copy_to_device(v.ptrs[0], &[0; 4]).is_err());
    assert!(r.copy_from_device(&mut [0; 4], v.ptrs[0]).is_err());
    assert!(r.memset(v.ptrs[0], 0, 4).is_err());
    assert!(r.register_callable(&b.add_callable()).is_err());
    assert!(r.prewarm(&cfg).is_err());
    for p in v.ptrs {
        r.free(p).unwrap();
    }
    assert_eq!(b.log(), [], "fast-fail touches no device");
    r.finalize().unwrap();
}

#[test]
fn finalize_destroys_streams_without_sync_then_unloads_frees_and_resets() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let _kept = r.malloc(256).unwrap();
    let v = AddRun::new(&mut r);
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default())).unwrap();
    let before = b.log();
    let mallocs = count(&before, "rtMalloc");
    let frees_before = count(&before, "rtFree");
    r.finalize().unwrap();
    let log = b.log();
    let first_destroy = position(&log, "rtStreamDestroy");
    assert_eq!(count(&log, "rtStreamDestroy"), 2);
    assert!(
        !names(&log[..first_destroy]).iter().any(|f| f.contains("Synchronize")),
        "no sync before the streams go: {:?}",
        names(&log)
    );
    assert!(first_destroy < position(&log, "rtsBinaryUnload"));
    assert!(position(&log, "rtsBinaryUnload") < position(&log, "rtDeviceReset"));
    let last_free = log.iter().rposition(|c| c.func == "rtFree").unwrap();
    assert!(last_free < position(&log, "rtDeviceReset"));
    assert_eq!(
        frees_before + count(&log, "rtFree"),
        mallocs,
        "every allocation freed exactly once"
    );
    assert!(log.iter().all(|c| c.ret == 0), "{:?}", names(&log));
    assert_eq!(
        count(&log, "aclrtResetDeviceForce"),
        0,
        "a healthy device gets the soft reset only"
    );
    assert_eq!(b.live(), [0; 5]);
}

/// Poisons a runner, makes the force-reset probe fail `k` times, finalizes.
fn finalize_with_probe_failures(k: i64) -> (Onboard, Result<(), DeviceError>, Vec<Call>) {
    let b = Onboard::new();
    let (mut r, slot, v, _) = prepared(&b);
    b.install.fail_call("rtKernelLaunchWithHandleV2", 1, 207_001).unwrap();
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default())).unwrap_err();
    v.free(&mut r);
    b.install.set_value("reset_probe_failures", k).unwrap();
    b.log();
    let result = r.finalize().map(drop);
    let log = b.log();
    (b, result, log)
}

#[test]
fn an_unusable_device_is_force_reset_until_the_probe_passes() {
    for k in 0..3 {
        let (b, result, log) = finalize_with_probe_failures(k);
        result.unwrap();
        assert_eq!(count(&log, "aclrtResetDeviceForce"), k as usize + 1, "k = {k}");
        assert!(log.iter().filter(|c| c.func.contains("Reset")).all(|c| c.ret == 0), "k = {k}");
        // The runner's buffers are never freed, before the reset or after it: the reset gives
        // them back with the device, and ACL is finalized last.
        let end = position(&log, "aclFinalize") + 1;
        assert_eq!(end, log.len(), "k = {k}: {:?}", names(&log));
        let reset = &log[..];
        assert_eq!(count(reset, "rtFree"), 0, "k = {k}: {:?}", names(&log));
        // No soft reset first: it would release the device, and CANN then refuses the force
        // reset. A retry binds again, since the attempt before it released the device.
        assert_eq!(count(reset, "rtDeviceReset"), 0, "k = {k}: {:?}", names(&log));
        assert_eq!(count(reset, "rtSetDevice"), k as usize, "k = {k}: {:?}", names(&log));
        // The last probe passed: a stream created and destroyed, 64 bytes allocated and freed.
        let n = reset.len();
        let tail: Vec<&str> = names(&reset[n - 7..]);
        assert_eq!(
            tail,
            [
                "aclrtSetDevice",
                "aclrtCreateStream",
                "aclrtDestroyStream",
                "aclrtMalloc",
                "aclrtFree",
                "aclrtResetDevice",
                "aclFinalize"
            ],
            "k = {k}"
        );
        assert_eq!(reset[n - 4].size, Some(64));
        assert_eq!(b.live(), [0; 5]);
        let fresh = DeviceRunner::attach(b.options(0)).unwrap();
        assert!(fresh.health().is_healthy());
    }
}

#[test]
fn three_failed_force_resets_are_the_finalize_error() {
    let (b, result, log) = finalize_with_probe_failures(3);
    let err = result.unwrap_err();
    assert_eq!(count(&log, "aclrtResetDeviceForce"), 3);
    match &err {
        DeviceError::Acl { init: None, source, .. } => {
            assert_eq!((source.func, source.code), ("aclrtCreateStream", 507_899));
        }
        e => panic!("{e}"),
    }
    let text = err.to_string();
    assert!(text.contains("aclrtCreateStream: 507899 ACL_ERROR_RT_DRV_INTERNAL_ERROR"), "{text}");
    assert!(text.contains("symptom of an earlier device fault"), "{text}");
    // The device may still use the runner's buffers: they are leaked, not freed (the
    // stand-in's force resets took them back all the same).
    assert_eq!(count(&log, "rtFree"), 0, "{:?}", names(&log));
    assert_eq!(b.live(), [0; 5]);
}

/// A healthy runner with the add program registered, its buffers, and a release (an `rtFree`
/// in `free`) that failed and waits to be reported.
fn with_a_failed_release(b: &Onboard) -> (DeviceRunner, simpler_device_a2a3::ChipSlot, AddRun) {
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    let p = r.malloc(128).unwrap();
    let next_free = count(&b.log(), "rtFree") as u64 + 1;
    b.install.fail_call("rtFree", next_free, 507_899).unwrap();
    r.free(p).unwrap();
    (r, slot, v)
}

#[test]
fn a_device_the_force_resets_did_not_recover_outweighs_an_older_failed_release() {
    let b = Onboard::new();
    let (mut r, slot, v) = with_a_failed_release(&b);
    b.install.fail_call("rtKernelLaunchWithHandleV2", 1, 207_001).unwrap();
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default())).unwrap_err();
    v.free(&mut r);
    b.install.set_value("reset_probe_failures", 3).unwrap();
    match r.finalize().unwrap_err() {
        DeviceError::Acl { init: None, source, .. } => {
            assert_eq!((source.func, source.code), ("aclrtCreateStream", 507_899));
        }
        e => panic!("{e}"),
    }
}

#[test]
fn both_streams_stop_on_failure() {
    let b = Onboard::new();
    let r = DeviceRunner::attach(b.options(0)).unwrap();
    let log = b.log();
    let (aicpu, aicore) = streams(&log);
    let modes: Vec<(Option<u64>, Option<i64>)> = log
        .iter()
        .filter(|c| c.func == "aclrtSetStreamFailureMode")
        .map(|c| (c.stream, c.value))
        .collect();
    assert_eq!(modes, [(Some(aicpu), Some(1)), (Some(aicore), Some(1))], "{:?}", names(&log));
    drop(r);
}

#[test]
fn device_queueing_on_a_cann_without_events_is_refused_at_attach_as_a_load_failure() {
    let b =
        Onboard::from_install(FakeInstall::standard_omitting(Some("aclrtRecordEvent")).unwrap());
    let err = DeviceRunner::attach(b.options(0).with_device_queue(true)).unwrap_err();
    match &err {
        DeviceError::Load { source } => match &**source {
            LoadError::Incomplete { missing } => match missing.as_slice() {
                [LoadError::Symbol { symbol: "aclrtRecordEvent", .. }] => {}
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        },
        e => panic!("{e}"),
    }
    assert!(b.log().iter().all(|c| c.func != "rtSetDevice"), "refused before any device call");
    // Without queueing nothing needs events: the runner attaches and runs.
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    let run = RunId::from_raw(1).unwrap();
    r.run(&RunRequest::new(run, slot, &v.args, &CallConfig::default())).unwrap();
    r.finalize().unwrap();
}

#[test]
fn device_queueing_refuses_streams_that_cannot_stop_on_failure() {
    let b = Onboard::new();
    b.install.fail_call("aclrtSetStreamFailureMode", 1, 207_000).unwrap();
    let err = DeviceRunner::attach(b.options(0).with_device_queue(true)).unwrap_err();
    match &err {
        DeviceError::Acl { init: Some(InitStep::CreateStream), source, .. } => {
            assert_eq!((source.func, source.code), ("aclrtSetStreamFailureMode", 207_000));
        }
        e => panic!("{e}"),
    }
    assert_eq!(b.live(), [0; 5], "both streams were destroyed");
    // Without queueing the runner attaches: nothing it does relies on the mode.
    let b = Onboard::new();
    b.install.fail_call("aclrtSetStreamFailureMode", 1, 207_000).unwrap();
    DeviceRunner::attach(b.options(0)).unwrap().finalize().unwrap();
}

#[test]
fn a_failed_second_stream_destroys_the_first_and_names_the_code() {
    let b = Onboard::new();
    b.install.fail_call("rtStreamCreate", 2, 207_001).unwrap();
    let err = DeviceRunner::attach(b.options(0)).unwrap_err();
    match &err {
        DeviceError::Acl { init: Some(InitStep::CreateStream), source, .. } => {
            assert_eq!((source.func, source.code), ("rtStreamCreate", 207_001));
        }
        e => panic!("{e}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("create stream: rtStreamCreate: 207001 ACL_ERROR_RT_MEMORY_ALLOCATION (the device could not allocate memory)"),
        "{text}"
    );
    let log = b.log();
    assert_eq!(count(&log, "rtStreamDestroy"), 1);
    assert!(!names(&log).iter().any(|f| f.contains("Synchronize")));
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn the_core_limits_bound_block_dim_and_a_failed_query_gives_24() {
    let b = Onboard::new();
    b.install.set_value("cube_core_limit", 4).unwrap();
    b.install.set_value("vector_core_limit", 8).unwrap();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    let too_big = CallConfig::builder().block_dim(5).build().unwrap();
    let err = r.run(&RunRequest::new(run_id(1), slot, &v.args, &too_big)).unwrap_err();
    assert!(matches!(err, DeviceError::InvalidConfig { .. }), "{err}");
    let ok = CallConfig::builder().block_dim(4).build().unwrap();
    r.run(&RunRequest::new(run_id(2), slot, &v.args, &ok)).unwrap();
    v.free(&mut r);
    r.finalize().unwrap();

    let b = Onboard::new();
    b.install.fail_call("aclrtGetStreamResLimit", 0, 507_000).unwrap();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    let cfg = CallConfig::builder().block_dim(24).build().unwrap();
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    v.free(&mut r);
    r.finalize().unwrap();
}

#[test]
fn a_missing_or_malformed_manifest_is_a_load_programs_error_naming_the_file() {
    let b = Onboard::new();
    let missing = b.manifest.with_file_name("nope.json");
    let opts = b.options(0).with_onboard_manifest(&missing);
    match DeviceRunner::attach(opts).unwrap_err() {
        DeviceError::Init {
            step: InitStep::LoadPrograms,
            failure: InitFailure::Manifest { path, problem },
            ..
        } => {
            assert_eq!(path, missing);
            assert!(
                matches!(&*problem, simpler_device_a2a3::ManifestProblem::Read(e)
                    if e.kind() == std::io::ErrorKind::NotFound),
                "{problem}"
            );
        }
        e => panic!("{e}"),
    }
    std::fs::write(&b.manifest, "{ not json").unwrap();
    match DeviceRunner::attach(b.options(0)).unwrap_err() {
        DeviceError::Init {
            step: InitStep::LoadPrograms,
            failure: InitFailure::Manifest { path, problem },
            ..
        } => {
            assert_eq!(path, b.manifest);
            assert!(
                matches!(*problem, simpler_device_a2a3::ManifestProblem::Parse(_)),
                "{problem}"
            );
        }
        e => panic!("{e}"),
    }
    std::fs::write(&b.manifest, r#"{ "abi_version": 99, "artifacts": {} }"#).unwrap();
    let err = DeviceRunner::attach(b.options(0)).unwrap_err();
    assert!(err.to_string().contains("ABI 99"), "{err}");
    assert_eq!(b.live(), [0; 5], "a failed init releases what it built");
}

#[test]
fn a_missing_library_lists_every_path_tried() {
    let mut install = FakeInstall::empty().unwrap();
    install.place(simpler_acl_sys::Library::Acl, "usr/local/Ascend/cann/lib64").unwrap();
    let b = Onboard::from_install(install);
    let err = DeviceRunner::attach(b.options(0)).unwrap_err();
    assert!(matches!(err, DeviceError::Load { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("libruntime.so"), "{text}");
    assert!(text.contains("ascend-toolkit/latest"), "the default roots are listed: {text}");
    assert!(text.contains("libascend_hal.so"), "every missing library at once: {text}");
}

#[test]
fn a_missing_symbol_is_named() {
    let install = FakeInstall::standard_omitting(Some("rtsLaunchCpuKernel")).unwrap();
    let b = Onboard::from_install(install);
    let err = DeviceRunner::attach(b.options(0)).unwrap_err();
    assert!(matches!(err, DeviceError::Load { .. }), "{err}");
    assert!(err.to_string().contains("rtsLaunchCpuKernel"), "{err}");
    assert_eq!(b.log(), [], "nothing is called before the probe passed");
}

#[test]
fn a_kernel_the_chip_cannot_execute_is_refused() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let err = r.register_callable(&add::callable().unwrap()).unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::InvalidCallable {
                problem: simpler_device_a2a3::CallableProblem::KernelCode {
                    code: simpler_device_a2a3::KernelCodeKind::Native,
                    ..
                },
                ..
            }
        ),
        "{err}"
    );
    r.finalize().unwrap();
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn a_release_that_fails_in_drop_is_returned_by_the_next_fallible_call() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let p = r.malloc(128).unwrap();
    let next_free = count(&b.log(), "rtFree") as u64 + 1;
    b.install.fail_call("rtFree", next_free, 507_899).unwrap();
    r.free(p).unwrap();
    let err = r.register_callable(&b.add_callable()).unwrap_err();
    match &err {
        DeviceError::Acl { source, .. } => {
            assert_eq!((source.func, source.code), ("rtFree", 507_899))
        }
        e => panic!("{e}"),
    }
    // Reported once: the call after it succeeds.
    r.register_callable(&b.add_callable()).unwrap();
    r.finalize().unwrap();
}

#[test]
fn a_release_that_failed_in_drop_fails_no_launch_and_leaves_the_device_healthy() {
    let b = Onboard::new();
    let (mut r, slot, v) = with_a_failed_release(&b);
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default())).unwrap();
    assert_eq!(r.health(), DeviceHealth::Healthy);
    assert_eq!(count(&b.log(), "aclrtResetDeviceForce"), 0);
    v.free(&mut r);
    // The release's failure is finalize's, as itself.
    match r.finalize().unwrap_err() {
        DeviceError::Acl { source, .. } => {
            assert_eq!((source.func, source.code), ("rtFree", 507_899))
        }
        e => panic!("{e}"),
    }
}

#[test]
fn a_device_that_maps_no_aicore_control_window_fails_init_instead_of_timing_out_every_run() {
    let b = Onboard::new();
    b.install.fail_call("halMemCtl", 1, 507_899).unwrap();
    match DeviceRunner::attach(b.options(0)).unwrap_err() {
        DeviceError::Acl { init: Some(InitStep::QueryCores), source, .. } => {
            assert_eq!((source.func, source.code), ("halMemCtl", 507_899))
        }
        e => panic!("{e}"),
    }
    // Nothing is left behind, and the next attach maps the window.
    assert_eq!(b.live(), [0; 5]);
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default())).unwrap();
    v.free(&mut r);
    r.finalize().unwrap();
}

#[test]
fn a_cann_of_another_major_version_is_refused_naming_both() {
    let b = Onboard::new();
    b.install.set_value("version_major", 9).unwrap();
    let err = DeviceRunner::attach(b.options(0)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("CANN 9.") && text.contains("8.2.RC1"), "{text}");
}

#[test]
fn a_runner_moved_to_another_thread_binds_it_once() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    b.log();
    let r = std::thread::spawn(move || {
        let v = AddRun::new(&mut r);
        r.run(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default())).unwrap();
        r.run(&RunRequest::new(run_id(2), slot, &v.args, &CallConfig::default())).unwrap();
        v.free(&mut r);
        r
    })
    .join()
    .unwrap();
    let log = b.log();
    assert_eq!(count(&log, "rtSetDevice"), 1, "{:?}", names(&log));
    assert_eq!(log[0].func, "rtSetDevice", "the new thread binds before its first call");
    r.finalize().unwrap();
}

#[test]
fn a_refused_bind_is_a_bind_device_error_with_the_code_named() {
    let b = Onboard::new();
    b.install.fail_call("rtSetDevice", 1, 507_899).unwrap();
    let err = DeviceRunner::attach(b.options(0)).unwrap_err();
    assert!(matches!(err, DeviceError::Acl { init: Some(InitStep::BindDevice), .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("bind device: rtSetDevice: 507899 ACL_ERROR_RT_DRV_INTERNAL_ERROR"),
        "{text}"
    );
    assert_eq!(b.live(), [0; 5]);
    // The refused runner tries no second bind on its way out, so it has nothing to reset.
    let log = b.log();
    let binds = count(&log, "rtSetDevice");
    let resets = count(&log, "rtDeviceReset");
    assert_eq!((binds, resets), (1, 0), "{:?}", names(&log));
}

#[test]
fn queued_runs_are_framed_by_cann_events_and_reaped_by_event_syncs_not_stream_syncs() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0).with_device_queue(true)).unwrap();
    let (aicpu, aicore) = streams(&b.log());
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let (v1, v2) = (AddRun::new(&mut r), AddRun::new(&mut r));
    b.log();
    let cfg = CallConfig::default();
    let p1 = r.prepare(&RunRequest::new(run_id(1), slot, &v1.args, &cfg)).unwrap();
    let a1 = r.launch_run(p1).unwrap();
    let p2 = r.prepare(&RunRequest::new(run_id(2), slot, &v2.args, &cfg)).unwrap();
    let a2 = r.launch_run(p2).unwrap();
    let log = b.log();
    assert_eq!(count(&log, "aclrtRecordEvent"), 8, "begin and end on both streams, per run");
    // The second run's AICore kernel waits on the first run's AICPU end; each AICPU kernel
    // waits on its own run's AICore begin.
    let waits: Vec<Option<u64>> =
        log.iter().filter(|c| c.func == "aclrtStreamWaitEvent").map(|c| c.stream).collect();
    assert_eq!(waits, [Some(aicpu), Some(aicore), Some(aicpu)], "{:?}", names(&log));
    assert_eq!(count(&log, "aclrtSynchronizeStreamWithTimeout"), 0, "no host round trip");
    assert!(r.poll_run(&a2).unwrap(), "the stand-in completes recorded events at once");
    for a in [a1, a2] {
        assert!(r.reap_run(&a, None).unwrap());
        r.complete_run(a).unwrap();
    }
    let log = b.log();
    assert_eq!(count(&log, "aclrtSynchronizeEventWithTimeout"), 4, "{:?}", names(&log));
    assert_eq!(count(&log, "aclrtSynchronizeStreamWithTimeout"), 0, "{:?}", names(&log));
    v1.free(&mut r);
    v2.free(&mut r);
    r.unregister_callable(slot).unwrap();
    r.finalize().unwrap();
    assert_eq!(b.live(), [0; 5], "every event was destroyed");
}

/// Launches run 1 and then run 2 on a queueing runner whose `nth` call of `func` fails with
/// 507899; returns run 2's launch error, after checking that run 1 reaps as itself.
fn second_launch_with_failing(func: &str, nth: u64) -> DeviceError {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0).with_device_queue(true)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let (v1, v2) = (AddRun::new(&mut r), AddRun::new(&mut r));
    let cfg = CallConfig::default();
    b.install.fail_call(func, nth, 507_899).unwrap();
    let p1 = r.prepare(&RunRequest::new(run_id(1), slot, &v1.args, &cfg)).unwrap();
    let a1 = r.launch_run(p1).unwrap();
    let accepted = Arc::new(AcceptanceSignal::new());
    let p2 =
        r.prepare(&RunRequest::new(run_id(2), slot, &v2.args, &cfg).with_acceptance(&accepted));
    let err = r.launch_run(p2.unwrap()).unwrap_err();
    assert_eq!(accepted.accepted(), None, "a failed launch is never accepted");
    assert!(matches!(r.health(), DeviceHealth::Unusable { .. }), "{:?}", r.health());
    // Run 1 was launched before the failure and reaps as itself.
    assert!(r.reap_run(&a1, None).unwrap());
    r.complete_run(a1).unwrap();
    drop((v1, v2));
    let _ = r.finalize();
    err
}

#[test]
fn a_stream_wait_that_fails_to_enqueue_fails_the_launch_it_frames() {
    // Run 2's AICore stream must wait for run 1's AICPU end: the second stream wait overall.
    let err = second_launch_with_failing("aclrtStreamWaitEvent", 2);
    assert!(
        matches!(err, DeviceError::Launch { run_id: id, kernel: KernelKind::AiCore, code, .. }
            if id == run_id(2) && code.get() == 507_899),
        "{err}"
    );
    assert_eq!(refusing_call(&err), ("aclrtStreamWaitEvent", 507_899), "{err:?}");
}

#[test]
fn an_event_that_fails_to_record_fails_the_launch_it_frames() {
    // Run 1 records four events; run 2's AICore end, after its AICore kernel, is the sixth.
    let err = second_launch_with_failing("aclrtRecordEvent", 6);
    assert!(
        matches!(err, DeviceError::Launch { run_id: id, kernel: KernelKind::Aicpu, code, .. }
            if id == run_id(2) && code.get() == 507_899),
        "{err}"
    );
    assert_eq!(refusing_call(&err), ("aclrtRecordEvent", 507_899), "{err:?}");
}

#[test]
fn a_queued_run_whose_event_wait_runs_out_is_still_running_not_a_device_fault() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0).with_device_queue(true)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    let cfg = CallConfig::default();
    let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    let a = r.launch_run(p).unwrap();
    // CANN answers an event wait that ran out with ACL_ERROR_RT_EVENT_SYNC_TIMEOUT: within a
    // caller's short deadline the run is still executing, and the chip stays usable.
    b.install.fail_call("aclrtSynchronizeEventWithTimeout", 1, 507_047).unwrap();
    assert!(!r.reap_run(&a, Some(Duration::from_millis(1))).unwrap());
    assert!(matches!(r.health(), DeviceHealth::Healthy), "{:?}", r.health());
    assert!(r.reap_run(&a, None).unwrap());
    r.complete_run(a).unwrap();
    // With the whole stream-sync budget spent it is a timeout of that budget, not a fault.
    let p = r.prepare(&RunRequest::new(run_id(2), slot, &v.args, &cfg)).unwrap();
    let a = r.launch_run(p).unwrap();
    // Calls are counted since the install was made: the first reap made one event wait, the
    // second two (both end events), so run 2's AICPU end wait is the fourth.
    b.install.fail_call("aclrtSynchronizeEventWithTimeout", 4, 507_047).unwrap();
    let err = r.reap_run(&a, None).unwrap_err();
    assert!(matches!(err, DeviceError::Timeout { budget: TimeoutBudget::StreamSync, .. }), "{err}");
    drop(v);
    let _ = r.finalize();
}

/// Launches runs 1 and 2 back to back on a queueing runner, with `before_launch` applied to
/// the stand-in first, and returns what `reap` makes of them; the runner is finalized after.
fn with_two_queued_runs<T>(
    before_launch: impl FnOnce(&FakeInstall),
    reap: impl FnOnce(&mut DeviceRunner, &FakeInstall, &ActiveRun, &ActiveRun) -> T,
) -> T {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0).with_device_queue(true)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let (v1, v2) = (AddRun::new(&mut r), AddRun::new(&mut r));
    let cfg = CallConfig::default();
    before_launch(&b.install);
    let p1 = r.prepare(&RunRequest::new(run_id(1), slot, &v1.args, &cfg)).unwrap();
    let a1 = r.launch_run(p1).unwrap();
    let p2 = r.prepare(&RunRequest::new(run_id(2), slot, &v2.args, &cfg)).unwrap();
    let a2 = r.launch_run(p2).unwrap();
    let out = reap(&mut r, &b.install, &a1, &a2);
    drop((v1, v2));
    let _ = r.finalize();
    out
}

/// Queues runs 1 and 2 on a device that stops after `records` more event records (each run
/// records four: AICore begin and end, then AICPU begin and end) and goes on again after
/// `resume` more event syncs (−1: never), reaps run 2 first and then run 1; returns both
/// results and the health in between.
fn reap_the_second_first_on_a_device_stopping_after(
    records: i64,
    resume: i64,
) -> (Result<bool, DeviceError>, DeviceHealth, Result<bool, DeviceError>) {
    let stop = |install: &FakeInstall| {
        install.set_value("pending_after_records", records).unwrap();
        install.set_value("reach_after_syncs", resume).unwrap();
    };
    with_two_queued_runs(stop, |r, _, a1, a2| {
        let second = r.reap_run(a2, None);
        let health = r.health();
        (second, health, r.reap_run(a1, None))
    })
}

#[test]
fn a_queued_run_that_never_began_times_out_as_abandoned_behind_the_run_the_device_stopped_in() {
    // The device stops inside run 1: its AICore begin is reached, nothing after it.
    let (second, health, first) = reap_the_second_first_on_a_device_stopping_after(1, -1);
    assert!(
        matches!(second, Err(DeviceError::Abandoned { run_id: id, after, .. })
            if id == run_id(2) && after == run_id(1)),
        "run 2 never began, so it is abandoned behind run 1: {second:?}"
    );
    assert!(matches!(health, DeviceHealth::Unusable { cause } if cause.run_id == run_id(1)));
    // Run 1 began and never ended: its own reap is its own stream-sync timeout.
    assert!(
        matches!(first, Err(DeviceError::Timeout { run_id: id, budget: TimeoutBudget::StreamSync, .. })
            if id == run_id(1)),
        "{first:?}"
    );
}

#[test]
fn a_run_ahead_that_ends_while_it_is_checked_is_not_blamed_and_the_run_behind_it_completes() {
    // The device stops inside run 1 and goes on right after run 2's wait ran out: run 1 ends
    // within the budget it is given when run 2's timeout is looked into, and run 2, which could
    // begin only then, gets a budget of its own and completes.
    let (second, health, first) = reap_the_second_first_on_a_device_stopping_after(1, 1);
    assert!(matches!(second, Ok(true)), "run 2 ran once run 1 ended: {second:?}");
    assert!(health.is_healthy(), "{health:?}");
    assert!(matches!(first, Ok(true)), "run 1 ended: {first:?}");
}

#[test]
fn a_queued_run_that_never_began_behind_runs_that_all_ended_times_out_itself() {
    // Run 1 ends (all four of its records are reached) and the device stops before run 2.
    let (second, health, first) = reap_the_second_first_on_a_device_stopping_after(4, -1);
    assert!(
        matches!(second, Err(DeviceError::Timeout { run_id: id, budget: TimeoutBudget::StreamSync, .. })
            if id == run_id(2)),
        "nothing ahead of run 2 is left to blame: {second:?}"
    );
    assert!(matches!(health, DeviceHealth::Unusable { cause } if cause.run_id == run_id(2)));
    assert!(matches!(first, Ok(true)), "run 1 ended before the device stopped: {first:?}");
}

/// Checks that every event sync and drain in `log` asked for the shortest wait (1 ms).
fn no_wait_asked(log: &[Call]) {
    let waits = ["aclrtSynchronizeEventWithTimeout", "aclrtSynchronizeDeviceWithTimeout"];
    for c in log.iter().filter(|c| waits.contains(&c.func.as_str())) {
        assert_eq!(c.timeout, Some(1), "a poll asked the device for a wait: {c:?}");
    }
}

#[test]
fn a_dropped_queued_run_only_ever_polled_past_asks_for_no_long_wait_and_still_times_out() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0).with_device_queue(true)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let (v1, v2) = (AddRun::new(&mut r), AddRun::new(&mut r));
    let cfg = CallConfig::default();
    // The device stops inside run 1 (its AICPU end is never reached) and never goes on.
    b.install.set_value("pending_after_records", 3).unwrap();
    let p1 = r.prepare(&RunRequest::new(run_id(1), slot, &v1.args, &cfg)).unwrap();
    let a1 = r.launch_run(p1).unwrap();
    let p2 = r.prepare(&RunRequest::new(run_id(2), slot, &v2.args, &cfg)).unwrap();
    let a2 = r.launch_run(p2).unwrap();
    drop(a1);
    b.log();
    // Run 2 is only polled: each poll looks at the dropped run 1 without waiting for it, and
    // run 1 still times out once its stream-sync budget, begun at the first poll, has passed.
    let started = Instant::now();
    let mut polls = 0u32;
    while !r.poll_run(&a2).unwrap() {
        polls += 1;
        assert!(started.elapsed() < Duration::from_secs(20), "the dropped run 1 never timed out");
        std::thread::sleep(Duration::from_millis(5));
    }
    let log = b.log();
    no_wait_asked(&log);
    assert_eq!(count(&log, "aclrtSynchronizeDeviceWithTimeout"), 1, "one recovery drain");
    assert!(polls > 0, "the first polls left run 1 queued");
    assert!(started.elapsed() >= Duration::from_millis(STREAM_SYNC_MS as u64));
    assert!(matches!(r.health(), DeviceHealth::Unusable { cause } if cause.run_id == run_id(1)));
    let err = r.reap_run(&a2, None).unwrap_err();
    assert!(
        matches!(err, DeviceError::Abandoned { run_id: id, after, .. }
            if id == run_id(2) && after == run_id(1)),
        "{err}"
    );
    v1.free(&mut r);
    v2.free(&mut r);
    r.finalize().unwrap();
    // The short drain still marked the timed-out device for the force reset.
    assert_eq!(count(&b.log(), "aclrtResetDeviceForce"), 1);
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn polls_never_blame_a_dropped_run_that_never_began_on_the_run_ahead_before_that_runs_budget() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0).with_device_queue(true)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let (v1, v2) = (AddRun::new(&mut r), AddRun::new(&mut r));
    let cfg = CallConfig::default();
    // The device stops inside run 1 (only its AICore begin is reached): run 2 never begins.
    b.install.set_value("pending_after_records", 1).unwrap();
    let p1 = r.prepare(&RunRequest::new(run_id(1), slot, &v1.args, &cfg)).unwrap();
    let a1 = r.launch_run(p1).unwrap();
    let p2 = r.prepare(&RunRequest::new(run_id(2), slot, &v2.args, &cfg)).unwrap();
    drop(r.launch_run(p2).unwrap());
    b.log();
    // Run 1 is only polled, past the budget of the dropped run 2 (two budgets: run 1 was
    // ahead of it). Run 1's own budget has not begun (it was never reaped), so the polls
    // cannot tell whether run 1 is stuck: run 2 stays queued and nobody is blamed.
    let past = Duration::from_millis(2 * STREAM_SYNC_MS as u64 + 500);
    let started = Instant::now();
    while started.elapsed() < past {
        assert!(!r.poll_run(&a1).unwrap(), "run 1 never ends");
        std::thread::sleep(Duration::from_millis(5));
    }
    no_wait_asked(&b.log());
    assert!(r.health().is_healthy(), "a poll blamed a run: {:?}", r.health());
    // Reaped without a deadline, run 1 is the run the device stopped in.
    let err = r.reap_run(&a1, None).unwrap_err();
    assert!(
        matches!(err, DeviceError::Timeout { run_id: id, budget: TimeoutBudget::StreamSync, .. }
            if id == run_id(1)),
        "{err}"
    );
    assert!(matches!(r.health(), DeviceHealth::Unusable { cause } if cause.run_id == run_id(1)));
    v1.free(&mut r);
    v2.free(&mut r);
    assert_eq!(r.finalize().unwrap().abandoned_run, None, "the dropped run 2 was cleaned up");
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn a_poll_past_the_budget_a_short_reap_began_says_the_reap_would_return_at_once() {
    for queue in [false, true] {
        let b = Onboard::new();
        let mut r = DeviceRunner::attach(b.options(0).with_device_queue(queue)).unwrap();
        let slot = r.register_callable(&b.add_callable()).unwrap();
        let v = AddRun::new(&mut r);
        let cfg = CallConfig::default();
        // The device stops inside run 1 and never goes on: with device queueing only its
        // AICore begin is reached; without, its AICPU stream never finishes.
        if queue {
            b.install.set_value("pending_after_records", 1).unwrap();
        } else {
            b.install.set_value("sync_timeout_stream", 1).unwrap();
        }
        let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
        let a = r.launch_run(p).unwrap();
        // A reap with a short deadline begins run 1's budget (after `started`) and leaves it
        // launched.
        let started = Instant::now();
        let first = r.reap_run(&a, Some(Duration::from_millis(20)));
        assert!(matches!(first, Ok(false)), "queue {queue}: {first:?}");
        // A caller that reaps only once a poll says the reap would not wait: once the budget
        // has passed, the reap times out at once, and the poll must say so.
        while !r.poll_run(&a).unwrap() {
            let waited = started.elapsed();
            assert!(waited < Duration::from_secs(20), "queue {queue}: polled past the budget");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(started.elapsed() >= Duration::from_millis(STREAM_SYNC_MS as u64));
        let reaped = Instant::now();
        let err = r.reap_run(&a, None).unwrap_err();
        assert!(reaped.elapsed() < Duration::from_secs(1), "queue {queue}: the reap waited");
        assert!(
            matches!(err, DeviceError::Timeout { run_id: id, budget: TimeoutBudget::StreamSync, .. }
                if id == run_id(1)),
            "queue {queue}: {err}"
        );
        drop(v);
        let _ = r.finalize();
    }
}

#[test]
fn a_poll_past_a_spent_budget_stays_undecided_while_a_run_queued_ahead_is_unfinished() {
    // The device stops inside run 1: run 2, queued behind it, never begins.
    let stop = |install: &FakeInstall| install.set_value("pending_after_records", 1).unwrap();
    with_two_queued_runs(stop, |r, _, a1, a2| {
        let first = r.reap_run(a2, Some(Duration::from_millis(20)));
        assert!(matches!(first, Ok(false)), "{first:?}");
        // Run 2's budget (two stream-sync budgets: one run ahead) passes; its reap would now
        // wait for run 1's budget, which no reap began, so the poll must not say it would not.
        std::thread::sleep(Duration::from_millis(2 * STREAM_SYNC_MS as u64 + 200));
        assert!(!r.poll_run(a2).unwrap(), "the poll said run 2's reap would not wait");
        let err = r.reap_run(a1, None).unwrap_err();
        assert!(matches!(err, DeviceError::Timeout { .. }), "{err}");
        let err = r.reap_run(a2, None).unwrap_err();
        assert!(matches!(err, DeviceError::Abandoned { .. }), "{err}");
    });
}

/// A runner on `b` with the add program and the one that stamps its output before adding
/// registered, and two add runs' buffers.
fn add_and_stamping(
    b: &Onboard,
) -> (DeviceRunner, simpler_device_a2a3::ChipSlot, simpler_device_a2a3::ChipSlot, AddRun, AddRun) {
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let stamping = add_callable_with(common::stamp_then_add, "stamp_then_add");
    let stamping = r.register_callable(&stamping).unwrap();
    let (v1, v2) = (AddRun::new(&mut r), AddRun::new(&mut r));
    (r, slot, stamping, v1, v2)
}

#[test]
fn a_device_that_did_not_drain_is_not_drained_again_by_a_later_failure() {
    let b = Onboard::new();
    let (mut r, slot, stamping, v1, v2) = add_and_stamping(&b);
    let cfg = CallConfig::default();
    // The device never finishes anything: every AICPU stream sync and every drain runs out.
    b.install.set_value("sync_timeout_stream", 1).unwrap();
    b.install.set_value("drain_result", 507_046).unwrap();
    let p1 = r.prepare(&RunRequest::new(run_id(1), slot, &v1.args, &cfg)).unwrap();
    drop(r.launch_run(p1).unwrap());
    b.log();
    let before = r.stats().recoveries;
    // Run 2's write waits for the dropped run 1, gives up, and drains the device once.
    let err = r.prepare(&RunRequest::new(run_id(2), stamping, &v2.args, &cfg)).unwrap_err();
    assert!(matches!(&err, DeviceError::Abandoned { after, .. } if *after == run_id(1)), "{err}");
    assert_eq!(count(&b.log(), "aclrtSynchronizeDeviceWithTimeout"), 1, "one drain");
    // The next call that reaps the dropped run 1, which that wait charged: no second drain.
    r.unregister_callable(stamping).unwrap();
    let log = b.log();
    assert_eq!(count(&log, "aclrtSynchronizeDeviceWithTimeout"), 0, "{:?}", names(&log));
    assert_eq!(r.stats().recoveries, before + 1);
    assert!(!r.health().is_healthy());
    v1.free(&mut r);
    v2.free(&mut r);
    let _ = r.finalize();
}

/// The timeouts (ms) of the syncs in `log` (stream, event and device) given more than 50 ms:
/// under the stand-in's sync delay each of them waits that long.
fn long_syncs(log: &[Call]) -> Vec<i64> {
    let syncs = log.iter().filter(|c| c.func.starts_with("aclrtSynchronize"));
    syncs.filter_map(|c| c.timeout).filter(|&t| t > 50).collect()
}

#[test]
fn an_unusable_runner_refuses_or_frees_without_waiting_for_a_dropped_run() {
    let b = Onboard::new();
    let (mut r, slot, stamping, v1, v2) = add_and_stamping(&b);
    let (spare, kept) = (r.malloc(1024).unwrap(), r.malloc(1024).unwrap());
    let cfg = CallConfig::default();
    // The device never finishes anything: every sync of the AICPU stream (creation index 1)
    // runs out after its whole timeout, and a drain finds the device busy.
    b.install.set_value("sync_delay_stream", 1).unwrap();
    b.install.set_value("sync_delay_ms", 60_000).unwrap();
    b.install.set_value("drain_result", 507_046).unwrap();
    let p1 = r.prepare(&RunRequest::new(run_id(1), slot, &v1.args, &cfg)).unwrap();
    drop(r.launch_run(p1).unwrap());
    // Run 2's preparation looks at the dropped run 1 (one 1 ms sync), then its write's wait
    // for run 1 fails at once with a fault: the runner is unusable, and run 1, still
    // outstanding, has nearly its whole stream-sync budget left.
    let syncs = count(&b.log(), "aclrtSynchronizeStreamWithTimeout") as u64;
    b.install.fail_call("aclrtSynchronizeStreamWithTimeout", syncs + 2, 507_015).unwrap();
    let err = r.prepare(&RunRequest::new(run_id(2), stamping, &v2.args, &cfg)).unwrap_err();
    assert!(matches!(&err, DeviceError::Abandoned { after, .. } if *after == run_id(1)), "{err}");
    assert!(!r.health().is_healthy());
    b.log();
    // A preparation with a diagnostic needs the device alone, so a healthy runner would wait
    // for run 1 first; an unusable one refuses after only looking.
    let dir = tempfile::tempdir().unwrap();
    let diag = CallConfig::builder().dep_gen(true).output_prefix(dir.path()).build().unwrap();
    let err = r.prepare(&RunRequest::new(run_id(3), slot, &v1.args, &diag)).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Unusable { cause, .. } if cause.run_id == run_id(1)),
        "{err}"
    );
    let waited = long_syncs(&b.log());
    assert!(waited.is_empty(), "prepare waited for run 1: syncs of {waited:?} ms");
    // A free only forgets the pointer, and malloc and prewarm refuse, each without waiting.
    r.free(spare).unwrap();
    let waited = long_syncs(&b.log());
    assert!(waited.is_empty(), "free waited for run 1: syncs of {waited:?} ms");
    let err = r.malloc(1024).unwrap_err();
    assert!(matches!(err, DeviceError::Unusable { .. }), "{err}");
    let err = r.prewarm(&cfg).unwrap_err();
    assert!(matches!(err, DeviceError::Unusable { .. }), "{err}");
    let waited = long_syncs(&b.log());
    assert!(waited.is_empty(), "malloc or prewarm waited for run 1: syncs of {waited:?} ms");
    // So do a fill, both copies and a registration.
    let mut back = [0u8; 4];
    let refusals = [
        r.memset(kept, 0, 4).unwrap_err(),
        r.copy_to_device(kept, &[1; 4]).unwrap_err(),
        r.copy_from_device(&mut back, kept).unwrap_err(),
        r.register_callable(&b.add_callable()).unwrap_err(),
    ];
    for err in refusals {
        assert!(matches!(err, DeviceError::Unusable { .. }), "{err}");
    }
    let waited = long_syncs(&b.log());
    assert!(waited.is_empty(), "a copy or registration waited for run 1: syncs of {waited:?} ms");
    v1.free(&mut r);
    v2.free(&mut r);
    let _ = r.finalize();
}

#[test]
fn a_write_whose_wait_failed_as_the_run_ahead_ended_well_blames_no_run_but_its_own() {
    // The wait running out (a stream-sync timeout), and the stream reporting a fault.
    for code in [507_046, 507_015] {
        let b = Onboard::new();
        let mut r = DeviceRunner::attach(b.options(0).with_device_queue(true)).unwrap();
        let slot = r.register_callable(&b.add_callable()).unwrap();
        let stamping = add_callable_with(common::stamp_then_add, "stamp_then_add");
        let stamping = r.register_callable(&stamping).unwrap();
        let (v1, v2) = (AddRun::new(&mut r), AddRun::new(&mut r));
        let cfg = CallConfig::default();
        let p1 = r.prepare(&RunRequest::new(run_id(1), slot, &v1.args, &cfg)).unwrap();
        let a1 = r.launch_run(p1).unwrap();
        // Run 1 has ended (the stand-in reaches its end events at once), but the wait of run
        // 2's write for the streams fails, as it does when run 1 ends just after the wait.
        let syncs = count(&b.log(), "aclrtSynchronizeStreamWithTimeout") as u64;
        b.install.fail_call("aclrtSynchronizeStreamWithTimeout", syncs + 1, code).unwrap();
        let err = r.prepare(&RunRequest::new(run_id(2), stamping, &v2.args, &cfg)).unwrap_err();
        // Run 1 ended well, so the failed wait is run 2's own. The wait's first sync is the
        // AICPU stream's, and the stand-in records no core faults: a fault is the stream's
        // report alone, with the CANN call that reported it.
        match &err {
            DeviceError::Timeout {
                run_id: id,
                budget: TimeoutBudget::StreamSync,
                runtime,
                faults,
                ..
            } if code == 507_046 => {
                assert_eq!(*id, run_id(2), "{err}");
                assert!(runtime.is_none() && faults.is_empty(), "{err:?}");
            }
            DeviceError::DeviceFault {
                run_id: id,
                code: reported,
                stream,
                faults,
                runtime,
                acl,
            } if code == 507_015 => {
                assert_eq!(*id, run_id(2), "{err}");
                assert_eq!((reported.get(), *stream), (507_015, StreamKind::Aicpu), "{err:?}");
                assert_eq!(faults.len(), 1, "{err:?}");
                assert_eq!((faults[0].code.get(), faults[0].stream), (507_015, StreamKind::Aicpu));
                assert!(runtime.is_none(), "{err:?}");
                let acl = acl.as_deref().unwrap_or_else(|| panic!("no CANN error in {err:?}"));
                assert_eq!((acl.func, acl.code), ("aclrtSynchronizeStreamWithTimeout", 507_015));
            }
            _ => panic!("code {code}: run 1 ended well, so the failed wait is run 2's own: {err}"),
        }
        // The device is unusable after the failed sync, but run 1 is not behind it.
        assert!(!r.health().is_healthy(), "code {code}");
        assert!(r.reap_run(&a1, None).unwrap(), "code {code}");
        assert_eq!(r.complete_run(a1).unwrap().run_id, Some(run_id(1)), "code {code}");
        v1.free(&mut r);
        v2.free(&mut r);
        let _ = r.finalize();
        assert_eq!(b.live(), [0; 5], "code {code}");
    }
}

/// Queues runs 1 and 2, arms a fault with `arm`, reaps run 1 and returns its error after
/// checking that run 2 then ends `Abandoned { after: run 1 }`.
fn first_of_two_queued_runs_fails(arm: impl FnOnce(&FakeInstall)) -> DeviceError {
    with_two_queued_runs(
        |_| {},
        |r, install, a1, a2| {
            arm(install);
            let first = r.reap_run(a1, None).unwrap_err();
            let err = r.reap_run(a2, None).unwrap_err();
            assert!(
                matches!(err, DeviceError::Abandoned { run_id: id, after, .. } if id == run_id(2) && after == run_id(1)),
                "{err}"
            );
            first
        },
    )
}

#[test]
fn a_queued_run_behind_a_run_whose_wait_timed_out_is_abandoned_though_its_events_completed() {
    // Run 1's AICPU end wait runs out with the whole budget: run 1's own timeout. A timeout
    // stops no stream, so run 2's events still completed (the stand-in completes them at
    // once); it stood behind run 1 all the same and must not pass for a good run.
    let err = first_of_two_queued_runs_fails(|install| {
        install.fail_call("aclrtSynchronizeEventWithTimeout", 1, 507_047).unwrap();
    });
    assert!(matches!(err, DeviceError::Timeout { run_id: id, .. } if id == run_id(1)), "{err}");
}

#[test]
fn a_queued_run_behind_a_run_whose_event_sync_failed_is_abandoned_after_it() {
    // Run 1's AICPU end event reports an AICPU exception and the device stays failed.
    let err = first_of_two_queued_runs_fails(|install| {
        install.poison_at("aclrtSynchronizeEventWithTimeout", 1, 507_018).unwrap();
    });
    assert!(matches!(err, DeviceError::DeviceFault { run_id: id, .. } if id == run_id(1)), "{err}");
}

/// How run 1 stands when run 2's queued launch is refused.
#[derive(Clone, Copy, Debug)]
enum RunAhead {
    /// Still fine: nothing it reports fails.
    Healthy,
    /// Faulted with 507018: the next look at its AICPU end event reports it, once, and so do
    /// its event syncs.
    Faulted,
    /// Faulted with 507018, and the device fails every call from that look on.
    FaultedSticky,
}

/// Queues run 1, puts it in state `ahead`, makes run 2's AICore launch fail with `launch_code`,
/// and returns run 2's launch error, the health after it and run 1's reap.
fn launch_behind(
    ahead: RunAhead,
    launch_code: i32,
) -> (DeviceError, DeviceHealth, Result<bool, DeviceError>) {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0).with_device_queue(true)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let (v1, v2) = (AddRun::new(&mut r), AddRun::new(&mut r));
    let cfg = CallConfig::default();
    let p1 = r.prepare(&RunRequest::new(run_id(1), slot, &v1.args, &cfg)).unwrap();
    let a1 = r.launch_run(p1).unwrap();
    let p2 = r.prepare(&RunRequest::new(run_id(2), slot, &v2.args, &cfg)).unwrap();
    // Counted from the whole log, which nothing above took.
    let next_query = count(&b.log(), "aclrtQueryEventStatus") as u64 + 1;
    match ahead {
        RunAhead::Healthy => {}
        RunAhead::Faulted => {
            b.install.fail_call("aclrtQueryEventStatus", next_query, 507_018).unwrap();
            b.install.fail_call("aclrtSynchronizeEventWithTimeout", 0, 507_018).unwrap();
        }
        RunAhead::FaultedSticky => {
            b.install.poison_at("aclrtQueryEventStatus", next_query, 507_018).unwrap();
        }
    }
    let next_launch = r.stats().aicore_launches + 1;
    b.install.fail_call("rtKernelLaunchWithHandleV2", next_launch, launch_code).unwrap();
    let second = r.launch_run(p2).unwrap_err();
    let health = r.health();
    let first = r.reap_run(&a1, None);
    drop((v1, v2));
    let _ = r.finalize();
    (second, health, first)
}

#[test]
fn a_queued_launch_refused_after_the_run_ahead_faulted_is_abandoned_behind_that_run() {
    // Run 1 faults on the device while run 2 is being queued: the device reports the fault
    // again at run 2's AICore launch, and on run 1's end event. Run 2 is abandoned behind run
    // 1, and run 1's reap is its own fault — also on a device that fails every later call.
    for ahead in [RunAhead::Faulted, RunAhead::FaultedSticky] {
        let (second, health, first) = launch_behind(ahead, 507_018);
        assert!(
            matches!(&second, DeviceError::Abandoned { run_id: id, after, .. }
                if *id == run_id(2) && *after == run_id(1)),
            "{ahead:?}: run 2's refused launch stands behind run 1's fault: {second}"
        );
        assert!(matches!(health, DeviceHealth::Unusable { cause } if cause.run_id == run_id(1)));
        assert!(
            matches!(&first, Err(DeviceError::DeviceFault { run_id: id, .. }) if *id == run_id(1)),
            "{ahead:?}: run 1 carries its own fault: {first:?}"
        );
    }
}

#[test]
fn a_queued_launch_refused_with_another_code_than_the_run_ahead_reports_is_its_own_failure() {
    // The launch is refused with a code no kernel fault reports: not the fault of run 1 again.
    let (second, health, _) = launch_behind(RunAhead::Faulted, 207_001);
    assert!(
        matches!(&second, DeviceError::Launch { run_id: id, .. } if *id == run_id(2)),
        "{second}"
    );
    assert!(matches!(health, DeviceHealth::Unusable { cause } if cause.run_id == run_id(2)));
}

#[test]
fn a_queued_launch_refused_while_the_run_ahead_is_healthy_is_its_own_failure() {
    let (second, health, first) = launch_behind(RunAhead::Healthy, 507_018);
    assert!(
        matches!(&second, DeviceError::Launch { run_id: id, .. } if *id == run_id(2)),
        "{second}"
    );
    assert!(matches!(health, DeviceHealth::Unusable { cause } if cause.run_id == run_id(2)));
    // Run 1 was launched before the failure: it is reaped as itself.
    first.expect("run 1 ran before run 2's failed launch");
}

// ----- tensormap_and_ringbuffer: `DeviceObject` orchestrations through the register entry -----

fn register_launches(log: &[Call]) -> Vec<&Call> {
    log.iter()
        .filter(|c| {
            c.func == "rtsLaunchCpuKernel" && c.text.starts_with("simpler_aicpu_register_callable")
        })
        .collect()
}

#[test]
fn a_trb_device_object_is_loaded_and_closed_through_the_register_entry() {
    let b = Onboard::new();
    let mut r =
        DeviceRunner::attach(b.options_on(0, RuntimeVariant::TensormapAndRingbuffer)).unwrap();
    let before = b.live()[2];
    b.log();
    let slot = r.register_callable(&add_object_callable()).unwrap();
    let log = b.log();
    let launches = register_launches(&log);
    assert_eq!(launches.len(), 1, "{:?}", names(&log));
    // One 296-byte argument block on the AICPU stream, then a sync of that stream.
    assert_eq!((launches[0].size, launches[0].block_dim), (Some(296), Some(1)));
    let at = log.iter().position(|c| std::ptr::eq(c, launches[0])).unwrap();
    let sync = log[at..].iter().position(|c| c.func == "aclrtSynchronizeStreamWithTimeout");
    assert!(sync.is_some(), "no sync after the register launch: {:?}", names(&log));
    assert_eq!(log[at + sync.unwrap()].stream, launches[0].stream);
    // The object's and the reply's staging buffers are freed; the kernel's text and the chip
    // buffer stay.
    assert_eq!(b.live()[2], before + 2);
    // A run takes the loaded orchestration; unregistering closes it through the same entry.
    let v = AddRun::new(&mut r);
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default())).unwrap();
    v.free(&mut r);
    b.log();
    r.unregister_callable(slot).unwrap();
    assert_eq!(register_launches(&b.log()).len(), 1);
    r.finalize().unwrap();
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn a_register_entry_that_refuses_or_never_answers_is_a_typed_error_and_nothing_leaks() {
    use simpler_device_a2a3::abi::launch::RegisterFailure;
    let b = Onboard::new();
    let mut r =
        DeviceRunner::attach(b.options_on(0, RuntimeVariant::TensormapAndRingbuffer)).unwrap();
    let before = b.live()[2];
    for (knob, want) in [(4, Some(RegisterFailure::Symbol)), (-1, None)] {
        b.install.set_value("register_reply", knob).unwrap();
        match r.register_callable(&add_object_callable()) {
            Err(DeviceError::OrchestrationLoad { failure, entry, slot: 0, cause }) => {
                assert_eq!((failure, entry.as_str()), (want, "add"), "{cause}");
            }
            other => panic!("register_reply {knob}: expected OrchestrationLoad, got {other:?}"),
        }
        assert_eq!(b.live()[2], before, "register_reply {knob}: a buffer leaked");
        assert!(r.health().is_healthy());
    }
    b.install.set_value("register_reply", 0).unwrap();
    let slot = r.register_callable(&add_object_callable()).unwrap();
    r.unregister_callable(slot).unwrap();
    r.finalize().unwrap();
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn onboard_a_native_trb_orchestration_and_an_hbg_device_object_are_refused() {
    let b = Onboard::new();
    let mut r =
        DeviceRunner::attach(b.options_on(0, RuntimeVariant::TensormapAndRingbuffer)).unwrap();
    match r.register_callable(&b.add_callable()) {
        Err(DeviceError::InvalidCallable {
            problem: simpler_device_a2a3::CallableProblem::NativeOrchestrationOnDevice,
            ..
        }) => {}
        other => panic!("expected InvalidCallable, got {other:?}"),
    }
    r.finalize().unwrap();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    match r.register_callable(&add_object_callable()) {
        Err(DeviceError::InvalidCallable {
            problem: simpler_device_a2a3::CallableProblem::DeviceObjectUnderHostBuildGraph { entry },
            ..
        }) => assert_eq!(entry, "add"),
        other => panic!("expected InvalidCallable, got {other:?}"),
    }
    r.finalize().unwrap();
    assert_eq!(b.live(), [0; 5]);
}

// ----- Refused allocations and copies keep CANN's error -----

/// The CANN error in `err`'s source chain, if any (boxed, as `DeviceError` keeps it).
fn acl_source(err: &DeviceError) -> Option<&simpler_acl_sys::AclError> {
    use simpler_acl_sys::AclError;
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        if let Some(acl) = s.downcast_ref::<AclError>() {
            return Some(acl);
        }
        if let Some(acl) = s.downcast_ref::<Box<AclError>>() {
            return Some(acl);
        }
        source = s.source();
    }
    None
}

#[test]
fn an_allocation_cann_refuses_for_another_reason_than_memory_carries_cann_s_code() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    b.install.fail_call("rtMalloc", 0, 107_000).unwrap();
    let err = r.malloc(4096).unwrap_err();
    assert!(!matches!(err, DeviceError::OutOfMemory { .. }), "not out of memory: {err}");
    assert_eq!(err.device_code().map(|c| c.code), Some(107_000), "{err}");
    let acl = acl_source(&err).unwrap_or_else(|| panic!("no CANN error in {err:?}"));
    assert_eq!((acl.func, acl.code), ("rtMalloc", 107_000));
    assert!(
        matches!(
            err,
            DeviceError::AllocRefused { run_id: None, bytes: 4096, purpose: MemPurpose::User, .. }
        ),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::Setup);
    assert!(r.health().is_healthy());
    r.finalize().unwrap();
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn an_allocation_cann_refuses_for_want_of_memory_is_a_resources_error_with_its_code() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    b.install.fail_call("rtMalloc", 0, 207_001).unwrap();
    let err = r.malloc(4096).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Resources, "{err}");
    assert_eq!(acl_source(&err).map(|a| a.code), Some(207_001), "{err:?}");
    assert!(err.to_string().contains("ACL_ERROR_RT_MEMORY_ALLOCATION"), "{err}");
    r.finalize().unwrap();
}

#[test]
fn a_kernel_text_upload_cann_refuses_is_typed_as_any_allocation_or_copy() {
    // Every allocation, then every copy, refused: a registration's first is its first kernel's
    // text.
    for (func, code) in [("rtMalloc", 207_001), ("rtMemcpy", 507_899)] {
        let b = Onboard::new();
        let mut r = DeviceRunner::attach(b.options(0)).unwrap();
        b.install.fail_call(func, 0, code).unwrap();
        let err = r.register_callable(&b.add_callable()).unwrap_err();
        let typed = match func {
            "rtMalloc" => {
                matches!(err, DeviceError::AllocRefused { purpose: MemPurpose::ChipBuffer, .. })
                    && err.class() == ErrorClass::Resources
            }
            _ => matches!(err, DeviceError::CopyRefused { kind: CopyKind::ToDevice, .. }),
        };
        assert!(typed, "{func}: {err:?}");
        assert_eq!(acl_source(&err).map(|a| (a.func, a.code)), Some((func, code)), "{err:?}");
        assert!(r.health().is_healthy());
        r.finalize().unwrap();
        assert_eq!(b.live(), [0; 5], "{func}: a refused upload left memory behind");
    }
}

#[test]
fn a_copy_or_memset_cann_refuses_carries_cann_s_code_and_is_no_bad_pointer() {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0)).unwrap();
    let p = r.malloc(4096).unwrap();
    b.install.fail_call("rtMemcpy", 0, 507_899).unwrap();
    b.install.fail_call("aclrtMemset", 0, 507_899).unwrap();
    let refused = [
        ("rtMemcpy", CopyKind::ToDevice, r.copy_to_device(p, &[1; 16]).unwrap_err()),
        ("rtMemcpy", CopyKind::FromDevice, r.copy_from_device(&mut [0; 16], p).unwrap_err()),
        ("aclrtMemset", CopyKind::Fill, r.memset(p, 7, 16).unwrap_err()),
    ];
    for (func, kind, err) in refused {
        assert!(!matches!(err, DeviceError::BadDevicePointer { .. }), "{func}: {err}");
        assert_eq!(err.device_code().map(|c| c.code), Some(507_899), "{func}: {err}");
        let acl = acl_source(&err).unwrap_or_else(|| panic!("{func}: no CANN error in {err:?}"));
        assert_eq!((acl.func, acl.code), (func, 507_899));
        assert!(
            matches!(err, DeviceError::CopyRefused { kind: k, len: 16, addr, .. } if k == kind && addr == p),
            "{err:?}"
        );
        assert!(err.to_string().contains("ACL_ERROR_RT_DRV_INTERNAL_ERROR"), "{err}");
    }
    // A range the runner's table refuses is still a bad pointer, without a device call.
    assert!(matches!(
        r.copy_to_device(p.offset(4095), &[1, 2]),
        Err(DeviceError::BadDevicePointer { len: 2, .. })
    ));
    assert!(r.health().is_healthy());
    r.finalize().unwrap();
}

#[test]
fn a_refused_image_upload_fails_the_run_it_prepares_with_cann_s_code() {
    let b = Onboard::new();
    let (mut r, slot, v, _) = prepared(&b);
    b.install.fail_call("rtMemcpy", 0, 507_899).unwrap();
    let cfg = CallConfig::default();
    let err = r.prepare(&RunRequest::new(run_id(3), slot, &v.args, &cfg)).unwrap_err();
    assert_eq!(err.run_id(), Some(run_id(3)), "{err}");
    assert!(!matches!(err, DeviceError::BadDevicePointer { .. }), "{err}");
    assert_eq!(acl_source(&err).map(|a| (a.func, a.code)), Some(("rtMemcpy", 507_899)), "{err:?}");
    assert!(matches!(err, DeviceError::CopyRefused { kind: CopyKind::ToDevice, .. }), "{err:?}");
    r.finalize().unwrap();
}

// ----- A refused stream or event sync keeps CANN's error -----

/// The sync a reap makes, by whether runs are queued on the device: the stream sync, or the
/// event sync.
const SYNCS: [(bool, &str); 2] =
    [(false, "aclrtSynchronizeStreamWithTimeout"), (true, "aclrtSynchronizeEventWithTimeout")];

/// Runs the add program once with the reap's sync `func` failing with `code`: the bench, the
/// runner, the run's buffers and its error.
fn run_with_a_failed_sync(
    queue: bool,
    func: &str,
    code: i32,
) -> (Onboard, DeviceRunner, AddRun, DeviceError) {
    let b = Onboard::new();
    let mut r = DeviceRunner::attach(b.options(0).with_device_queue(queue)).unwrap();
    let slot = r.register_callable(&b.add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    b.install.fail_call(func, 0, code).unwrap();
    let cfg = CallConfig::default();
    let err = r.run(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap_err();
    (b, r, v, err)
}

#[test]
fn a_stream_sync_cann_refuses_reaches_the_runs_error_with_cann_s_typed_error() {
    for (queue, func) in SYNCS {
        let (_b, mut r, v, err) = run_with_a_failed_sync(queue, func, 507_018);
        let acl = acl_source(&err).unwrap_or_else(|| panic!("{func}: no CANN error in {err:?}"));
        assert_eq!((acl.func, acl.code), (func, 507_018), "{err:?}");
        assert!(acl.recent.as_deref().is_some_and(|m| m.contains("injected fault")), "{acl:?}");
        match &err {
            DeviceError::DeviceFault { acl: Some(acl), stream, .. } => {
                assert_eq!((acl.func, acl.code, *stream), (func, 507_018, StreamKind::Aicpu));
            }
            other => panic!("{func}: {other:?}"),
        }
        v.free(&mut r);
        r.finalize().unwrap();
    }
}

#[test]
fn an_aicore_timeout_a_sync_reports_is_an_op_execute_timeout_with_cann_s_typed_error() {
    for (queue, func) in SYNCS {
        let (_b, mut r, v, err) = run_with_a_failed_sync(queue, func, 507_014);
        match &err {
            DeviceError::Timeout { budget: TimeoutBudget::OpExecute, acl: Some(acl), .. } => {
                assert_eq!((acl.func, acl.code), (func, 507_014), "{err:?}");
            }
            other => panic!("{func}: {other:?}"),
        }
        assert_eq!(acl_source(&err).map(|a| a.func), Some(func), "{err:?}");
        v.free(&mut r);
        let _ = r.finalize();
    }
}

#[test]
fn a_failed_run_whose_recovery_drain_succeeded_has_its_image_read_for_diagnostics() {
    // The recovery drain proves the device idle, so the export reads the swimlane records
    // (empty here: the stand-in runs no device program) and writes them; with the drain
    // failing the image is not read and no records file is written.
    for drained in [true, false] {
        let b = Onboard::new();
        let mut r = DeviceRunner::attach(b.options(0)).unwrap();
        let slot = r.register_callable(&b.add_callable()).unwrap();
        let v = AddRun::new(&mut r);
        if !drained {
            b.install.set_value("drain_result", 507_046).unwrap();
        }
        b.install.fail_call("aclrtSynchronizeStreamWithTimeout", 0, 507_018).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cfg = CallConfig::builder()
            .swimlane(simpler_types::SwimlaneLevel::AicpuTiming)
            .output_prefix(dir.path())
            .build()
            .unwrap();
        let err = r.run(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap_err();
        assert!(matches!(err, DeviceError::DeviceFault { .. }), "{err:?}");
        let written = dir.path().join("l2_swimlane_records.json").exists();
        assert_eq!(written, drained, "drained: {drained}, files: {:?}", files_in(dir.path()));
        v.free(&mut r);
        let _ = r.finalize();
    }
}

/// The names of the files under `dir`, for a failure message.
fn files_in(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

#[test]
fn a_program_load_that_fails_removes_its_op_description_and_names_the_step() {
    for func in ["rtsBinaryLoadFromFile", "rtsFuncGetByName"] {
        let b = Onboard::new();
        b.install.fail_call(func, 1, 507_899).unwrap();
        let err = DeviceRunner::attach(b.options(0)).unwrap_err();
        assert!(
            matches!(&err, DeviceError::Acl { init: Some(InitStep::LoadPrograms), source, .. }
                if source.code == 507_899),
            "{func}: {err:?}"
        );
        let log = b.log();
        let description = &log[position(&log, "rtsBinaryLoadFromFile")].text;
        assert!(description.ends_with(".json"), "{func}: {description:?}");
        assert!(
            !std::path::Path::new(description).exists(),
            "{func}: the failed load left {description} behind"
        );
    }
}
