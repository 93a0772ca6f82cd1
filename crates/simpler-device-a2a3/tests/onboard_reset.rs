//! How the onboard backend gives the device back at finalize, against the stand-in CANN
//! library, which counts device binds as CANN does (a reset takes one off and releases the
//! device at 0, a force reset releases it at once, either is refused once it is released):
//! every bind is reset, a refused bind resets nothing, a finalize that cannot bind leaves
//! every handle to the reset, the last queued run's end event is
//! destroyed before the reset, a setup kernel whose wait failed keeps its buffers until
//! the force reset it leads to, a run still launched at finalize keeps every tracked
//! allocation until the force reset passed (leaked when it never does), two runners
//! force-resetting at once never finalize ACL under each other, one chip's force reset leaves
//! ACL initialised for another chip's runner still attached, a refused `aclInit` is
//! finalize's error only when no force reset passes, and a device has one runner at a time.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::standin::{
    AddRun, Onboard, add_callable, add_object_callable, codes, count, names, position,
};
use simpler_acl_sys::standin::Call;
use simpler_device_a2a3::{ActiveRun, DeviceError, DeviceRunner, InitFailure, RunRequest};
use simpler_types::{CallConfig, RunId};

fn succeeded(log: &[Call], funcs: &[&str]) -> usize {
    log.iter().filter(|c| c.ret == 0 && funcs.contains(&c.func.as_str())).count()
}

/// Asserts that `log` holds calls of `func` (releasing `what`) and that every one succeeded:
/// none was made in another device's context, which the stand-in refuses as CANN does.
fn called_and_all_succeeded(log: &[Call], func: &str, what: &str) {
    let calls = count(log, func);
    assert!(calls > 0, "{what}: no {func}: {:?}", names(log));
    assert_eq!(
        succeeded(log, &[func]),
        calls,
        "{what}: {func} in another device's context: {:?}",
        codes(log)
    );
}

/// Binds and resets that CANN counted in `log`; equal when the device is released.
fn binds_and_resets(log: &[Call]) -> (usize, usize) {
    (
        succeeded(log, &["rtSetDevice", "aclrtSetDevice"]),
        succeeded(log, &["rtDeviceReset", "aclrtResetDevice"]),
    )
}

#[test]
fn a_runner_used_from_three_threads_is_reset_once_per_bind() {
    let b = Onboard::new();
    let options = b.options(0);
    // Attached on one thread, run on this one, finalized on a third: three binds.
    let mut r = std::thread::spawn(move || DeviceRunner::attach(options).unwrap()).join().unwrap();
    let slot = r.register_callable(&add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    let run = RunId::from_raw(1).unwrap();
    r.run(&RunRequest::new(run, slot, &v.args, &CallConfig::default())).unwrap();
    v.free(&mut r);
    std::thread::spawn(move || r.finalize().unwrap()).join().unwrap();
    let log = b.log();
    let (binds, resets) = binds_and_resets(&log);
    assert!(binds >= 3, "{:?}", names(&log));
    assert_eq!(resets, binds, "the device stays set after finalize: {:?}", names(&log));
    assert!(log.iter().all(|c| c.ret == 0), "{:?}", names(&log));
    assert_eq!(count(&log, "aclrtResetDeviceForce"), 0);
}

#[test]
fn a_callable_registered_on_another_thread_than_the_attach_is_uploaded_after_a_bind() {
    let b = Onboard::new();
    let options = b.options(0);
    let mut r = std::thread::spawn(move || DeviceRunner::attach(options).unwrap()).join().unwrap();
    b.log();
    r.register_callable(&add_callable()).unwrap();
    let log = b.log();
    assert!(
        position(&log, "rtSetDevice") < position(&log, "rtMalloc"),
        "the kernel text was uploaded before this thread was bound: {:?}",
        names(&log)
    );
    r.finalize().unwrap();
}

#[test]
fn a_callable_unregistered_on_a_thread_bound_for_another_runner_is_freed_in_its_own_context() {
    let b = Onboard::new();
    let mut zero = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = zero.register_callable(&add_callable()).unwrap();
    // This thread is bound for device 1 now: freeing runner 0's chip buffer and kernel text
    // must bind it back (the stand-in refuses a free in another device's context, as CANN).
    let one = DeviceRunner::attach(b.options(1)).unwrap();
    b.log();
    zero.unregister_callable(slot).unwrap();
    called_and_all_succeeded(&b.log(), "rtFree", "the kernel text");
    zero.finalize().unwrap();
    one.finalize().unwrap();
}

#[test]
fn kernel_code_whose_bind_fails_is_left_to_finalize_not_freed_in_another_context() {
    let b = Onboard::new();
    let mut zero = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = zero.register_callable(&add_callable()).unwrap();
    // This thread is bound for device 1 now; the binds for the chip buffer's free and for the
    // kernel text's both fail.
    let one = DeviceRunner::attach(b.options(1)).unwrap();
    let next_bind = count(&b.log(), "rtSetDevice") as u64 + 1;
    b.install.fail_call("rtSetDevice", next_bind, 507_899).unwrap();
    b.install.fail_call("rtSetDevice", next_bind + 1, 507_899).unwrap();
    zero.unregister_callable(slot).unwrap();
    let log = b.log();
    assert_eq!(count(&log, "rtFree"), 0, "freed in device 1's context: {:?}", names(&log));
    zero.finalize().unwrap_err();
    let finalized = b.log();
    let frees = count(&finalized, "rtFree");
    assert_eq!(succeeded(&finalized, &["rtFree"]), frees, "{:?}", codes(&finalized));
    one.finalize().unwrap();
    assert_eq!(b.live(), [0; 5], "finalize freed the chip buffer and the kernel text");
}

#[test]
fn a_free_whose_bind_fails_leaves_the_memory_to_finalize_and_reports_the_bind() {
    let b = Onboard::new();
    let mut zero = DeviceRunner::attach(b.options(0)).unwrap();
    let p = zero.malloc(64).unwrap();
    // This thread is bound for device 1 now, and binding it back for the free fails.
    let one = DeviceRunner::attach(b.options(1)).unwrap();
    let next_bind = count(&b.log(), "rtSetDevice") as u64 + 1;
    b.install.fail_call("rtSetDevice", next_bind, 507_899).unwrap();
    zero.free(p).unwrap();
    let freed = b.log();
    assert_eq!(count(&freed, "rtFree"), 0, "freed in device 1's context: {:?}", names(&freed));
    let err = zero.register_callable(&add_callable()).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Acl { source, .. } if source.func == "rtSetDevice" && source.code == 507_899),
        "{err:?}"
    );
    zero.finalize().unwrap();
    let finalized = b.log();
    let frees: Vec<&Call> = finalized.iter().filter(|c| c.func == "rtFree").collect();
    assert!(
        frees.iter().any(|c| c.value == Some(p.addr() as i64) && c.ret == 0),
        "finalize did not free the memory: {:?}",
        names(&finalized)
    );
    one.finalize().unwrap();
}

/// Calls that release a handle (memory, a mapping, a stream, an event, a program).
const RELEASES: [&str; 5] =
    ["rtFree", "halHostUnregister", "rtStreamDestroy", "aclrtDestroyEvent", "rtsBinaryUnload"];

#[test]
fn a_finalize_whose_bind_fails_leaves_every_handle_to_the_reset_and_reports_the_bind() {
    let b = Onboard::new();
    let mut zero = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = zero.register_callable(&add_callable()).unwrap();
    let v = AddRun::new(&mut zero);
    let run = RunId::from_raw(1).unwrap();
    zero.run(&RunRequest::new(run, slot, &v.args, &CallConfig::default())).unwrap();
    // This thread is bound for device 1 now, and binding it back for finalize fails.
    let one = DeviceRunner::attach(b.options(1)).unwrap();
    let next_bind = count(&b.log(), "rtSetDevice") as u64 + 1;
    b.install.fail_call("rtSetDevice", next_bind, 507_899).unwrap();
    let finalized = zero.finalize();
    let log = b.log();
    let released: Vec<(&str, i64)> =
        codes(&log).into_iter().filter(|(f, _)| RELEASES.contains(f)).collect();
    assert!(released.is_empty(), "released in device 1's context: {:?}", codes(&log));
    match finalized {
        Err(DeviceError::Acl { source, .. }) => {
            assert_eq!((source.func, source.code), ("rtSetDevice", 507_899));
        }
        other => panic!("the failed bind is finalize's error: {other:?}"),
    }
    assert!(count(&log, "rtDeviceReset") > 0, "the device was not reset: {:?}", names(&log));
    one.finalize().unwrap();
    // Left to the device's reset, which releases a context's handles on CANN (the stand-in keeps
    // counting them, so that a leak elsewhere still shows).
    let [streams, _, allocations, _, programs] = b.live();
    assert_eq!((streams, programs), (2, 1), "{:?}", b.live());
    assert!(allocations >= v.ptrs.len(), "{:?}", b.live());
}

#[test]
fn a_thread_bound_for_another_runner_since_is_bound_again() {
    let b = Onboard::new();
    let mut zero = DeviceRunner::attach(b.options(0)).unwrap();
    let mut one = DeviceRunner::attach(b.options(1)).unwrap();
    let mut all = b.log();
    // This thread is bound for device 1 now: runner 0's allocation must bind it back.
    let p = zero.malloc(64).unwrap();
    let log = b.log();
    let bind = log.iter().position(|c| c.func == "rtSetDevice" && c.device == Some(0));
    let bind = bind.unwrap_or_else(|| panic!("not bound back to device 0: {:?}", names(&log)));
    assert!(bind < position(&log, "rtMalloc"), "{:?}", names(&log));
    all.extend(log);
    zero.free(p).unwrap();
    let p = one.malloc(64).unwrap();
    one.free(p).unwrap();
    zero.finalize().unwrap();
    one.finalize().unwrap();
    all.extend(b.log());
    let (binds, resets) = binds_and_resets(&all);
    assert_eq!(binds, resets, "every bind is reset: {:?}", names(&all));
}

#[test]
fn a_runner_whose_bind_was_refused_resets_nothing() {
    let b = Onboard::new();
    // Every bind refused (the one at attach is the only one).
    b.install.fail_call("rtSetDevice", 0, 107_000).unwrap();
    DeviceRunner::attach(b.options(0)).unwrap_err();
    let log = b.log();
    assert_eq!(binds_and_resets(&log), (0, 0), "{:?}", names(&log));
    assert_eq!(count(&log, "rtDeviceReset"), 0, "a reset with nothing bound: {:?}", names(&log));
}

/// A device-queueing runner of device 0 after one run: it still holds the run's end event.
fn after_a_queued_run(b: &Onboard) -> DeviceRunner {
    let mut r = DeviceRunner::attach(b.options(0).with_device_queue(true)).unwrap();
    let slot = r.register_callable(&add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    let run = RunId::from_raw(1).unwrap();
    r.run(&RunRequest::new(run, slot, &v.args, &CallConfig::default())).unwrap();
    v.free(&mut r);
    r
}

#[test]
fn the_last_queued_runs_end_event_is_destroyed_before_the_device_is_reset() {
    let b = Onboard::new();
    let r = after_a_queued_run(&b);
    b.log();
    r.finalize().unwrap();
    let log = b.log();
    let last_destroy = log.iter().rposition(|c| c.func == "aclrtDestroyEvent");
    let last_destroy =
        last_destroy.unwrap_or_else(|| panic!("no event destroyed: {:?}", names(&log)));
    assert!(last_destroy < position(&log, "rtDeviceReset"), "{:?}", names(&log));
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn events_are_destroyed_in_their_own_context_on_a_thread_bound_for_another_runner() {
    let b = Onboard::new();
    let zero = after_a_queued_run(&b);
    // This thread is bound for device 1 now; runner 0 still holds its last run's end event.
    let one = DeviceRunner::attach(b.options(1)).unwrap();
    b.log();
    zero.finalize().unwrap();
    called_and_all_succeeded(&b.log(), "aclrtDestroyEvent", "the event");
    one.finalize().unwrap();
    assert_eq!(b.live(), [0; 5]);
}

#[test]
fn an_event_whose_bind_fails_is_left_to_the_reset_not_destroyed_in_another_context() {
    let b = Onboard::new();
    let zero = after_a_queued_run(&b);
    let one = DeviceRunner::attach(b.options(1)).unwrap();
    let next_bind = count(&b.log(), "rtSetDevice") as u64 + 1;
    b.install.fail_call("rtSetDevice", next_bind, 507_899).unwrap();
    let finalized = zero.finalize();
    let log = b.log();
    assert_eq!(
        succeeded(&log, &["aclrtDestroyEvent"]),
        count(&log, "aclrtDestroyEvent"),
        "an event was destroyed in another device's context: {:?}",
        codes(&log)
    );
    match finalized {
        Err(DeviceError::Acl { source, .. }) => assert_eq!(source.func, "rtSetDevice"),
        other => panic!("the failed bind is finalize's error: {other:?}"),
    }
    one.finalize().unwrap();
    // Left to the device's reset, which releases a context's events on CANN (the stand-in keeps
    // counting it, so that a leak elsewhere still shows).
    assert_eq!(b.live(), [0, 1, 0, 0, 0], "only the event is left, to the reset");
}

#[test]
fn a_bootstrap_wait_that_fails_leaves_its_buffers_to_the_force_reset() {
    let b = Onboard::new();
    // The first stream sync is the wait for the bootstrap kernel.
    b.install.fail_call("aclrtSynchronizeStreamWithTimeout", 1, 507_046).unwrap();
    DeviceRunner::attach(b.options(0)).unwrap_err();
    let log = b.log();
    let failed = position(&log, "aclrtSynchronizeStreamWithTimeout");
    let freed = count(&log[failed..], "rtFree");
    assert_eq!(freed, 0, "freed while the kernel may still read them: {:?}", names(&log));
    assert_eq!(count(&log, "aclrtResetDeviceForce"), 1, "{:?}", names(&log));
    assert!(log.iter().filter(|c| c.func.contains("Reset")).all(|c| c.ret == 0));
}

/// A trb runner on the stand-in whose next call of `func` (the register entry's, at the next
/// registration) fails with `code`.
fn trb_runner_failing_next(func: &str, code: i32) -> (Onboard, DeviceRunner) {
    let b = Onboard::new();
    let r = DeviceRunner::attach(
        b.options_on(0, simpler_device_a2a3::RuntimeVariant::TensormapAndRingbuffer),
    )
    .unwrap();
    let calls = count(&b.log(), func) as u64;
    b.install.fail_call(func, calls + 1, code).unwrap();
    (b, r)
}

#[test]
fn a_register_wait_that_fails_keeps_the_staged_object_and_reply_until_the_reset() {
    let (b, mut r) = trb_runner_failing_next("aclrtSynchronizeStreamWithTimeout", 507_046);
    let before = b.live()[2];
    r.register_callable(&add_object_callable()).unwrap_err();
    // The callable's own buffers go; the staged object and reply stay for the entry that may
    // still read and write them.
    assert_eq!(b.live()[2], before + 2, "{:?}", names(&b.log()));
    let before_drop = b.log();
    drop(r);
    let log = b.log();
    assert_eq!(count(&log, "aclrtResetDeviceForce"), 1, "{:?}", names(&log));
    // Never freed, neither at finalize before the reset nor after it: the reset gave them back.
    assert_eq!(freed(&log), [0i64; 0], "after {:?}: {:?}", names(&before_drop), names(&log));
    assert_eq!(b.live()[2], 0, "{:?}", names(&log));
}

#[test]
fn a_refused_register_launch_frees_its_staged_buffers_at_once() {
    let (b, mut r) = trb_runner_failing_next("rtsLaunchCpuKernel", 507_899);
    let before = b.live()[2];
    r.register_callable(&add_object_callable()).unwrap_err();
    assert_eq!(b.live()[2], before, "nothing runs, so nothing is kept: {:?}", names(&b.log()));
    r.finalize().unwrap();
    assert_eq!(b.live()[2], 0);
}

/// A runner whose run is still launched: the one reap so far gave up at the caller's deadline,
/// so the device may still be executing it. The log is cleared.
fn with_a_launched_run(b: &Onboard) -> (DeviceRunner, AddRun, ActiveRun) {
    with_a_launched_run_on(b, b.options(0))
}

/// [`with_a_launched_run`] with `options`.
fn with_a_launched_run_on(
    b: &Onboard,
    options: simpler_device_a2a3::RunnerOptions,
) -> (DeviceRunner, AddRun, ActiveRun) {
    let mut r = DeviceRunner::attach(options).unwrap();
    let slot = r.register_callable(&add_callable()).unwrap();
    let v = AddRun::new(&mut r);
    let run = RunId::from_raw(1).unwrap();
    let p = r.prepare(&RunRequest::new(run, slot, &v.args, &CallConfig::default())).unwrap();
    let a = r.launch_run(p).unwrap();
    // Faults count calls since the install was made, and nothing drained the log before.
    let nth = count(&b.log(), "aclrtSynchronizeStreamWithTimeout") as u64 + 1;
    b.install.fail_call("aclrtSynchronizeStreamWithTimeout", nth, 507_046).unwrap();
    assert!(!r.reap_run(&a, Some(Duration::from_millis(1))).unwrap());
    b.log();
    (r, v, a)
}

/// The addresses `rtFree` was called with in `log`.
fn freed(log: &[Call]) -> Vec<i64> {
    log.iter().filter(|c| c.func == "rtFree").filter_map(|c| c.value).collect()
}

#[test]
fn a_run_still_launched_at_finalize_has_its_buffers_given_back_by_the_force_reset_unfreed() {
    for by_drop in [false, true] {
        let b = Onboard::new();
        let (r, _v, a) = with_a_launched_run(&b);
        drop(a);
        if by_drop {
            drop(r);
        } else {
            r.finalize().unwrap();
        }
        let log = b.log();
        assert!(count(&log, "aclrtResetDeviceForce") >= 1, "by drop: {by_drop}: {:?}", names(&log));
        // Not freed before the reset (the launch may still use them), nor after it (the reset
        // gave them back with the device): only the probe's own allocation is freed.
        assert_eq!(freed(&log), [0i64; 0], "by drop: {by_drop}: {:?}", names(&log));
        // Nor are its streams destroyed or its AICPU program unloaded under the stuck launch:
        // the force reset releases them with the device.
        for f in ["rtStreamDestroy", "rtsBinaryUnload"] {
            assert_eq!(count(&log, f), 0, "by drop: {by_drop}: {:?}", names(&log));
        }
        assert!(log.iter().all(|c| c.ret == 0), "by drop: {by_drop}: {:?}", names(&log));
        assert_eq!(b.live(), [0; 5], "by drop: {by_drop}");
    }
}

#[test]
fn a_force_reset_that_passed_disowns_the_held_buffers_even_if_acl_finalize_fails() {
    let b = Onboard::new();
    let cann = Arc::new(b.install.cann());
    let (r, v, a) = with_a_launched_run_on(&b, b.options(0).with_cann(Arc::clone(&cann)));
    drop(a);
    b.install.fail_call("aclFinalize", 1, 507_000).unwrap();
    r.finalize().unwrap_err();
    let log = b.log();
    assert!(count(&log, "aclrtResetDeviceForce") >= 1, "{:?}", names(&log));
    drop(v);
    // A leaked allocation keeps the library loaded through its context.
    assert_eq!(Arc::strong_count(&cann), 1, "buffers the force reset gave back were leaked");
}

#[test]
fn a_run_still_launched_when_every_force_reset_fails_leaks_its_buffers() {
    let b = Onboard::new();
    let (r, _v, a) = with_a_launched_run(&b);
    drop(a);
    // Every probe after a force reset fails: the device may still be running the launch.
    b.install.set_value("reset_probe_failures", 3).unwrap();
    r.finalize().unwrap_err();
    let log = b.log();
    assert_eq!(count(&log, "aclrtResetDeviceForce"), 3, "{:?}", names(&log));
    assert_eq!(freed(&log), [0i64; 0], "freed on a device that was never reset: {:?}", names(&log));
}

/// The calls of a force reset and its probes, which need ACL initialised.
const FORCE_RESET_CALLS: [&str; 7] = [
    "aclrtResetDeviceForce",
    "aclrtSetDevice",
    "aclrtCreateStream",
    "aclrtDestroyStream",
    "aclrtMalloc",
    "aclrtFree",
    "aclrtResetDevice",
];

/// The force-reset calls of `log` made while ACL was not initialised: after an `aclFinalize`
/// and before the next `aclInit` that initialised it.
fn force_resets_without_acl(log: &[Call]) -> Vec<String> {
    let mut initialised = false;
    let mut outside = Vec::new();
    for (at, c) in log.iter().enumerate() {
        match c.func.as_str() {
            "aclInit" if c.ret == 0 => initialised = true,
            "aclFinalize" if c.ret == 0 => initialised = false,
            f if FORCE_RESET_CALLS.contains(&f) && !initialised => {
                outside.push(format!("{at}: {c}"))
            }
            _ => {}
        }
    }
    outside
}

#[test]
fn two_runners_force_resetting_at_once_never_finalize_acl_under_each_other() {
    const ROUNDS: usize = 10;
    // Rounds whose two resets held ACL at once: one `aclInit` for both sessions.
    let mut overlapped = 0;
    for round in 0..ROUNDS {
        let b = Onboard::new();
        // A force reset that takes a while, as on a device, lets the other runner's reset
        // begin meanwhile.
        b.install.set_value("force_reset_delay_ms", 50).unwrap();
        // Both runners still have a run launched at finalize: each force-resets its device.
        let runners: Vec<_> = (0..2)
            .map(|device| {
                let mut r = DeviceRunner::attach(b.options(device)).unwrap();
                let slot = r.register_callable(&add_callable()).unwrap();
                let v = AddRun::new(&mut r);
                let run = RunId::from_raw(1).unwrap();
                let config = CallConfig::default();
                let prepared = r.prepare(&RunRequest::new(run, slot, &v.args, &config)).unwrap();
                drop(r.launch_run(prepared).unwrap());
                (r, v)
            })
            .collect();
        b.log();
        let start = std::sync::Barrier::new(runners.len());
        std::thread::scope(|scope| {
            for (r, _v) in runners {
                let start = &start;
                scope.spawn(move || {
                    start.wait();
                    r.finalize().unwrap();
                });
            }
        });
        let log = b.log();
        assert_eq!(count(&log, "aclrtResetDeviceForce"), 2, "{:?}", names(&log));
        let outside = force_resets_without_acl(&log);
        assert!(
            outside.is_empty(),
            "round {round}: force-reset calls after ACL was finalized: {outside:?} in {:?}",
            codes(&log)
        );
        assert!(!b.install.acl_initialized().unwrap(), "round {round}: ACL left initialised");
        overlapped += usize::from(count(&log, "aclInit") == 1);
    }
    // Otherwise the rounds ran one reset after the other and tested no sharing.
    assert!(overlapped > 0, "in none of {ROUNDS} rounds did the two force resets overlap");
}

#[test]
fn one_chips_force_reset_leaves_acl_initialised_for_another_chips_runner_still_attached() {
    let b = Onboard::new();
    let mut other = DeviceRunner::attach(b.options(1)).unwrap();
    let (r, _v, a) = with_a_launched_run(&b);
    drop(a);
    r.finalize().unwrap();
    let log = b.log();
    assert!(count(&log, "aclrtResetDeviceForce") >= 1, "{:?}", names(&log));
    assert_eq!(count(&log, "aclInit"), 1, "{:?}", names(&log));
    assert_eq!(count(&log, "aclFinalize"), 0, "ACL finalized under device 1: {:?}", names(&log));
    assert!(b.install.acl_initialized().unwrap());
    // The runner still attached goes on, and its finalize ends the ACL the reset initialised.
    let slot = other.register_callable(&add_callable()).unwrap();
    let v = AddRun::new(&mut other);
    let run = RunId::from_raw(1).unwrap();
    other.run(&RunRequest::new(run, slot, &v.args, &CallConfig::default())).unwrap();
    v.free(&mut other);
    other.finalize().unwrap();
    let log = b.log();
    assert_eq!(count(&log, "aclFinalize"), 1, "{:?}", names(&log));
    // ACL is finalized after the runner's last call to its device.
    let finalized = position(&log, "aclFinalize");
    let last_reset = log.iter().rposition(|c| c.func == "rtDeviceReset");
    assert!(last_reset.is_some_and(|r| r < finalized), "{:?}", names(&log));
    assert!(log.iter().all(|c| c.ret == 0), "{:?}", codes(&log));
    assert!(!b.install.acl_initialized().unwrap(), "ACL left initialised");
}

#[test]
fn a_failed_acl_init_fails_finalize_only_when_every_force_reset_fails_too() {
    for probes_fail in [false, true] {
        let b = Onboard::new();
        let (r, _v, a) = with_a_launched_run(&b);
        drop(a);
        // A poisoned device may refuse even `aclInit`; the force resets are tried all the same.
        b.install.fail_call("aclInit", 1, 507_899).unwrap();
        if probes_fail {
            b.install.set_value("reset_probe_failures", 3).unwrap();
        }
        let finalized = r.finalize();
        let log = b.log();
        assert!(count(&log, "aclrtResetDeviceForce") >= 1, "{:?}", names(&log));
        assert_eq!(count(&log, "aclFinalize"), 0, "ACL was never initialised: {:?}", names(&log));
        match finalized {
            Ok(_) => assert!(!probes_fail, "every force reset failed, yet finalize passed"),
            Err(DeviceError::Acl { source, .. }) => {
                assert!(probes_fail, "a force reset passed, yet finalize failed: {source}");
                assert_eq!((source.func, source.code), ("aclInit", 507_899));
            }
            Err(other) => panic!("not the aclInit failure: {other:?}"),
        }
    }
}

#[test]
fn a_second_runner_on_an_attached_device_is_refused_until_the_first_is_finalized() {
    let b = Onboard::new();
    let mut first = DeviceRunner::attach(b.options(0)).unwrap();
    let slot = first.register_callable(&add_callable()).unwrap();
    b.log();
    // A force reset of either runner would release the other's handles: refused before any
    // call on the device.
    let refused = DeviceRunner::attach(b.options(0)).unwrap_err();
    assert!(
        matches!(
            refused,
            DeviceError::Init { failure: InitFailure::DeviceAttached { device: 0 }, .. }
        ),
        "{refused:?}"
    );
    let log = b.log();
    assert_eq!(
        binds_and_resets(&log),
        (0, 0),
        "the refused attach used the device: {:?}",
        names(&log)
    );
    assert_eq!(count(&log, "aclFinalize"), 0, "{:?}", names(&log));

    // The first runner is untouched by the refusal.
    let v = AddRun::new(&mut first);
    first
        .run(&RunRequest::new(RunId::from_raw(1).unwrap(), slot, &v.args, &CallConfig::default()))
        .unwrap();
    v.free(&mut first);
    // Another device of the same CANN, and the same device of another copy of CANN, attach.
    DeviceRunner::attach(b.options(1)).unwrap().finalize().unwrap();
    let other = Onboard::new();
    DeviceRunner::attach(other.options(0)).unwrap().finalize().unwrap();

    first.finalize().unwrap();
    let again = DeviceRunner::attach(b.options(0)).expect("the device is free after finalize");
    again.finalize().unwrap();
    // A runner dropped without finalize gives the device back too.
    drop(DeviceRunner::attach(b.options(0)).unwrap());
    DeviceRunner::attach(b.options(0)).unwrap().finalize().unwrap();
}
