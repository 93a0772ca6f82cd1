//! Pipelined runs on the simulator: resource slots and run handles, launch acceptance, runs
//! prepared while another executes, dropped handles, stale leases, a fault charged to the run
//! that caused it, and a hammer of handles dropped from several threads
//! (`docs/pipelining.md`).

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;
use simpler_device_a2a3::{
    AcceptanceSignal, DeviceError, DeviceHealth, DeviceRunner, KernelKind, Overlap, RunRequest,
};
use simpler_types::CallConfig;

/// A kernel delay long enough that a launched run is still executing when the next host call
/// runs (the fault plan holds the kernel; no clock is asserted).
const HOLD: Duration = Duration::from_millis(250);

/// The test options with a scheduler budget well above [`HOLD`].
fn options() -> simpler_device_a2a3::RunnerOptions {
    fast_options(0)
        .with_scheduler_timeout(Duration::from_secs(1))
        .with_op_execute_timeout(Duration::from_millis(1500))
        .with_stream_sync_timeout(Duration::from_secs(4))
}

#[test]
fn acceptance_is_published_after_the_launch_before_the_run_completes_and_stays() {
    let mut r = DeviceRunner::attach(options()).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 256);
    let cfg = CallConfig::default();
    let signal = Arc::new(AcceptanceSignal::new());
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, HOLD);
    let req = RunRequest::new(run_id(1), slot, &v.args, &cfg).with_acceptance(&signal);
    let p = r.prepare(&req).unwrap();
    assert_eq!(signal.accepted(), None);
    let a = r.launch_run(p).unwrap();
    assert_eq!(signal.accepted(), Some(1));
    assert!(!r.poll_run(&a).unwrap(), "the held kernel keeps the run executing");
    // A deadline shorter than the run leaves it launched and changes nothing.
    assert!(!r.reap_run(&a, Some(Duration::from_millis(1))).unwrap());
    assert!(r.reap_run(&a, None).unwrap());
    r.complete_run(a).unwrap();
    assert_eq!(signal.accepted(), Some(1), "sticky after completion");
    v.check(&mut r);
    // A failed AICPU launch (the AICore one succeeded) publishes nothing either.
    signal.reset();
    r.sim_faults().unwrap().clear();
    r.sim_faults().unwrap().fail_launch(KernelKind::Aicpu, 1);
    let req = RunRequest::new(run_id(2), slot, &v.args, &cfg).with_acceptance(&signal);
    assert!(matches!(r.run(&req), Err(DeviceError::Launch { kernel: KernelKind::Aicpu, .. })));
    assert_eq!(signal.accepted(), None);
    v.free(&mut r);
    r.finalize().unwrap();
}

#[test]
fn a_run_prepared_while_another_executes_leaves_the_executing_run_intact() {
    let mut r = DeviceRunner::attach(options()).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let (v1, v2) = (VectorRun::new(&mut r, 2048), VectorRun::new(&mut r, 512));
    let cfg = CallConfig::default();
    for round in 0..3u64 {
        r.sim_faults().unwrap().kernel_delay(FUNC_MUL, HOLD / 3);
        let p1 = r.prepare(&RunRequest::new(run_id(10 * round + 1), slot, &v1.args, &cfg)).unwrap();
        let a1 = r.launch_run(p1).unwrap();
        // Prepared while run 1 executes: its image, kernel arguments and arenas are its own
        // slot's, so run 1 still computes its own graph on its own buffers.
        let p2 = r.prepare(&RunRequest::new(run_id(10 * round + 2), slot, &v2.args, &cfg)).unwrap();
        assert_ne!(p2.slot(), a1.slot());
        r.reap_run(&a1, None).unwrap();
        let rep1 = r.complete_run(a1).unwrap();
        r.sim_faults().unwrap().clear();
        let a2 = r.launch_run(p2).unwrap();
        r.reap_run(&a2, None).unwrap();
        let rep2 = r.complete_run(a2).unwrap();
        assert_eq!(rep2.overlap, Overlap::Overlapped { with: run_id(10 * round + 1) });
        assert_eq!(rep1.overlap, Overlap::NothingInFlight);
        v1.check(&mut r);
        v2.check(&mut r);
    }
    v1.free(&mut r);
    v2.free(&mut r);
    assert_eq!(r.stats().exports, r.stats().terminal_cleanups, "one cleanup per run");
    r.finalize().unwrap();
}

#[test]
fn diagnostics_need_exclusive_use_and_the_report_says_so() {
    let mut r = DeviceRunner::attach(options()).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let dir = temp_dir("pipelining-exclusive");
    let traced = CallConfig::builder().dep_gen(true).output_prefix(&dir).build().unwrap();
    let plain = CallConfig::default();
    let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &plain)).unwrap();
    let err = r.prepare(&RunRequest::new(run_id(2), slot, &v.args, &traced)).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Busy { call: "prepare", state } if state.contains("exclusive")),
        "{err}"
    );
    r.abandon(p).unwrap();
    let traced_run = r.prepare(&RunRequest::new(run_id(3), slot, &v.args, &traced)).unwrap();
    let err = r.prepare(&RunRequest::new(run_id(4), slot, &v.args, &plain)).unwrap_err();
    assert!(matches!(err, DeviceError::Busy { call: "prepare", .. }), "{err}");
    let a = r.launch_run(traced_run).unwrap();
    r.reap_run(&a, None).unwrap();
    let rep = r.complete_run(a).unwrap();
    assert_eq!(rep.overlap, Overlap::Exclusive { reason: "dependency capture" });
    v.free(&mut r);
    r.finalize().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn dropped_prepared_and_launched_runs_are_cleaned_up_and_free_their_slots() {
    let mut r = DeviceRunner::attach(options()).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 1024);
    let cfg = CallConfig::default();
    let cleanups = r.stats().terminal_cleanups;
    let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    drop(p);
    assert_eq!(r.stats().terminal_cleanups, cleanups, "cleanup waits for the runner's next call");
    // Both slots are free again: two prepares succeed.
    let p2 = r.prepare(&RunRequest::new(run_id(2), slot, &v.args, &cfg)).unwrap();
    assert_eq!(r.stats().terminal_cleanups, cleanups + 1);
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, HOLD / 3);
    let a2 = r.launch_run(p2).unwrap();
    drop(a2);
    // The dropped launched run is reaped (the device finishes it) before its slot is reused.
    let p3 = r.prepare(&RunRequest::new(run_id(3), slot, &v.args, &cfg)).unwrap();
    let p4 = r.prepare(&RunRequest::new(run_id(4), slot, &v.args, &cfg)).unwrap();
    assert_eq!(r.stats().terminal_cleanups, cleanups + 2);
    assert!(r.health().is_healthy());
    r.abandon(p4).unwrap();
    r.sim_faults().unwrap().clear();
    let a3 = r.launch_run(p3).unwrap();
    assert!(r.reap_run(&a3, None).unwrap());
    r.complete_run(a3).unwrap();
    v.check(&mut r);
    v.free(&mut r);
    assert_eq!(r.stats().live_allocations, 0);
    r.finalize().unwrap();
}

#[test]
fn malloc_and_a_host_orchestration_registration_only_look_at_a_dropped_run_still_executing() {
    // Neither needs the run gone: new memory is nobody's, and a native orchestration loads
    // nothing on the device. The hung kernel keeps the run executing until the scheduler's
    // stall watchdog (1 s), so a call that waited for it would see it cleaned up.
    let mut r = DeviceRunner::attach(options()).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 1024);
    r.sim_faults().unwrap().kernel_hang(FUNC_MUL, 1);
    let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default())).unwrap();
    let cleanups = r.stats().terminal_cleanups;
    drop(r.launch_run(p).unwrap());
    r.malloc(64).unwrap();
    let again = r.register_callable(&vector_callable()).unwrap();
    assert_eq!(r.stats().terminal_cleanups, cleanups, "a call waited for the dropped run");
    r.unregister_callable(again).unwrap();
    assert_eq!(r.stats().terminal_cleanups, cleanups + 1, "unregister waits for it");
    r.sim_faults().unwrap().clear();
    drop(v);
    r.finalize().unwrap();
}

#[test]
fn a_fault_is_charged_to_its_run_and_the_run_prepared_behind_it_is_abandoned() {
    let mut r = DeviceRunner::attach(fast_options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let (v1, v2) = (VectorRun::new(&mut r, 256), VectorRun::new(&mut r, 256));
    let cfg = CallConfig::default();
    r.sim_faults().unwrap().kernel_fault(FUNC_MUL, 1);
    let p1 = r.prepare(&RunRequest::new(run_id(1), slot, &v1.args, &cfg)).unwrap();
    let a1 = r.launch_run(p1).unwrap();
    let p2 = r.prepare(&RunRequest::new(run_id(2), slot, &v2.args, &cfg)).unwrap();
    let err = r.reap_run(&a1, None).unwrap_err();
    assert_eq!(err.run_id(), Some(run_id(1)), "the fault is run 1's: {err}");
    assert!(matches!(err, DeviceError::DeviceFault { .. } | DeviceError::Timeout { .. }), "{err}");
    assert!(matches!(r.complete_run(a1), Err(DeviceError::StaleRun { .. })), "run 1 ended");
    let err = r.launch_run(p2).unwrap_err();
    assert!(
        matches!(err, DeviceError::Abandoned { run_id: id, after, .. } if id == run_id(2) && after == run_id(1)),
        "{err}"
    );
    assert!(matches!(r.health(), DeviceHealth::Unusable { .. }));
    drop((v1, v2));
    r.finalize().unwrap();
    let mut fresh = DeviceRunner::attach(options()).unwrap();
    vector_once(&mut fresh, 1, &CallConfig::default());
    fresh.finalize().unwrap();
}

#[test]
fn handles_dropped_from_several_threads_while_the_runner_runs_are_all_reclaimed() {
    // Hammer of the return queue: two threads drop prepared handles at once while the owning
    // thread runs a third run; every round must find every slot free again and count one
    // terminal cleanup per run.
    let rounds: u64 =
        std::env::var("SIMPLER_SOAK_CYCLES").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    let mut r = DeviceRunner::attach(options().with_pipeline_slots(3)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let cfg = CallConfig::default();
    let start = r.stats().terminal_cleanups;
    let mut next = 1u64;
    let mut id = || {
        next += 1;
        run_id(next)
    };
    for _ in 0..rounds {
        let handles = [
            r.prepare(&RunRequest::new(id(), slot, &v.args, &cfg)).unwrap(),
            r.prepare(&RunRequest::new(id(), slot, &v.args, &cfg)).unwrap(),
        ];
        let gate = Arc::new(Barrier::new(3));
        let droppers: Vec<_> = handles
            .into_iter()
            .map(|h| {
                let gate = Arc::clone(&gate);
                std::thread::spawn(move || {
                    gate.wait();
                    drop(h);
                })
            })
            .collect();
        gate.wait();
        r.run(&RunRequest::new(id(), slot, &v.args, &cfg)).unwrap();
        for d in droppers {
            d.join().unwrap();
        }
    }
    // Every slot is free: three prepares succeed.
    let all: Vec<_> =
        (0..3).map(|_| r.prepare(&RunRequest::new(id(), slot, &v.args, &cfg)).unwrap()).collect();
    for p in all {
        r.abandon(p).unwrap();
    }
    assert_eq!(r.stats().terminal_cleanups - start, 3 * rounds + 3);
    v.check(&mut r);
    v.free(&mut r);
    r.finalize().unwrap();
}

#[test]
fn a_run_completed_before_it_was_reaped_is_reaped_first_and_its_outcome_returned() {
    let mut r = DeviceRunner::attach(options()).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 256);
    let cfg = CallConfig::default();
    // Still executing when completed: it is waited for, and its result is checked.
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, HOLD);
    let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    let a = r.launch_run(p).unwrap();
    let rep = r.complete_run(a).unwrap();
    assert_eq!(rep.run_id, Some(run_id(1)));
    v.check(&mut r);
    // One that faults: the fault is this call's error, not `Busy`.
    r.sim_faults().unwrap().clear();
    r.sim_faults().unwrap().kernel_fault(FUNC_MUL, 1);
    let p = r.prepare(&RunRequest::new(run_id(2), slot, &v.args, &cfg)).unwrap();
    let a = r.launch_run(p).unwrap();
    let err = r.complete_run(a).unwrap_err();
    assert_eq!(err.run_id(), Some(run_id(2)), "the run's fault is complete_run's error: {err}");
    assert!(matches!(err, DeviceError::DeviceFault { .. } | DeviceError::Timeout { .. }), "{err}");
    drop(v);
    r.finalize().unwrap();
}

#[test]
fn the_slot_count_is_checked_at_attach() {
    for bad in [0, 5] {
        let err = DeviceRunner::attach(fast_options(0).with_pipeline_slots(bad)).unwrap_err();
        assert!(matches!(err, DeviceError::InvalidConfig { .. }), "{bad}: {err}");
    }
}

/// The tensor run 1's orchestration allocated in its slot's heap, kept for run 2.
static STASHED: std::sync::Mutex<Option<simpler_types::Tensor>> = std::sync::Mutex::new(None);

fn stash_orch(
    ctx: &mut simpler_device_a2a3::OrchCtx<'_>,
    _: &simpler_device_a2a3::OrchArgs<'_>,
) -> Result<(), simpler_device_a2a3::OrchError> {
    let t = ctx.alloc_tensor(&[16], simpler_types::DataType::Float32)?;
    *STASHED.lock().unwrap() = Some(t);
    Ok(())
}

fn write_stashed_orch(
    ctx: &mut simpler_device_a2a3::OrchCtx<'_>,
    _: &simpler_device_a2a3::OrchArgs<'_>,
) -> Result<(), simpler_device_a2a3::OrchError> {
    let t = STASHED.lock().unwrap().expect("run 1 stashed its tensor");
    ctx.set_tensor_data(&t, &[0; 64])
}

#[test]
fn an_orchestration_cannot_write_into_the_heap_of_another_slots_run() {
    use simpler_device_a2a3::{ChipCallable, OrchConfig};
    let mut r = DeviceRunner::attach(options()).unwrap();
    let callable = |orch| {
        ChipCallable::native(orch, |_| OrchConfig { expected_arg_count: 0 }).build().unwrap()
    };
    let stash = r.register_callable(&callable(stash_orch)).unwrap();
    let write = r.register_callable(&callable(write_stashed_orch)).unwrap();
    let (cfg, args) = (CallConfig::default(), simpler_types::TaskArgs::new());
    // Run 1 allocates in slot 0's heap and stays prepared; run 2 prepares in slot 1 meanwhile.
    let p1 = r.prepare(&RunRequest::new(run_id(1), stash, &args, &cfg)).unwrap();
    let err = r.prepare(&RunRequest::new(run_id(2), write, &args, &cfg)).unwrap_err();
    assert!(
        matches!(
            &err,
            DeviceError::InvalidArgs {
                problem: simpler_device_a2a3::ArgsProblem::DataOutsideAllocation { .. },
                ..
            }
        ),
        "{err}"
    );
    r.abandon(p1).unwrap();
    r.finalize().unwrap();
}

/// A runner with the add program twice, plainly and behind [`stamp_then_add`], and the buffers
/// of two runs sharing `a` and `b`: (runner, plain, stamping, [a, b, f1, f2], a, b, args 1, args 2).
#[allow(clippy::type_complexity)]
fn stamping_runner(
    opts: simpler_device_a2a3::RunnerOptions,
) -> (
    DeviceRunner,
    simpler_device_a2a3::ChipSlot,
    simpler_device_a2a3::ChipSlot,
    [simpler_device_a2a3::DevicePtr; 4],
    Vec<f32>,
    Vec<f32>,
    simpler_types::TaskArgs,
    simpler_types::TaskArgs,
) {
    use simpler_device_a2a3::Orchestration;
    use simpler_device_a2a3::programs::add;
    let mut r = DeviceRunner::attach(opts).unwrap();
    let plain = r.register_callable(&add::callable().unwrap()).unwrap();
    let stamping = add::builder_with(Orchestration::Native {
        entry: stamp_then_add,
        config: |_| simpler_device_a2a3::OrchConfig { expected_arg_count: 3 },
    })
    .names("stamp_then_add", "stamp_then_add_config")
    .build()
    .unwrap();
    let stamping = r.register_callable(&stamping).unwrap();
    let a: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let b = vec![1.0f32; 64];
    let ((pa, ta), (pb, tb)) = (upload_f32(&mut r, &a), upload_f32(&mut r, &b));
    let (p1, t1) = upload_f32(&mut r, &[0.0; 64]);
    let (p2, t2) = upload_f32(&mut r, &[0.0; 64]);
    let args = |out| {
        let mut args = simpler_types::TaskArgs::new();
        args.add_input(ta).unwrap().add_input(tb).unwrap().add_output(out).unwrap();
        args
    };
    let (args1, args2) = (args(t1), args(t2));
    (r, plain, stamping, [pa, pb, p1, p2], a, b, args1, args2)
}

#[test]
fn an_orchestration_writing_user_memory_waits_for_the_run_executing_before_it() {
    use simpler_device_a2a3::programs::add;
    let (mut r, plain, stamping, [pa, pb, p1, p2], a, b, args1, args2) = stamping_runner(options());
    let cfg = CallConfig::default();
    // Run 1's add reads `a` only once the kernel delay has passed; run 2's orchestration
    // overwrites `a` while run 2 is prepared, which is while run 1 executes.
    r.sim_faults().unwrap().kernel_delay(add::ADD, HOLD);
    let p = r.prepare(&RunRequest::new(run_id(1), plain, &args1, &cfg)).unwrap();
    let first = r.launch_run(p).unwrap();
    let p = r.prepare(&RunRequest::new(run_id(2), stamping, &args2, &cfg)).unwrap();
    r.sim_faults().unwrap().clear();
    assert!(r.reap_run(&first, None).unwrap());
    assert_eq!(r.complete_run(first).unwrap().overlap, Overlap::NothingInFlight);
    assert_eq!(download_f32(&mut r, p1, 64), add::reference(&a, &b), "run 1 read the old `a`");
    let second = r.launch_run(p).unwrap();
    assert!(r.reap_run(&second, None).unwrap());
    let report = r.complete_run(second).unwrap();
    assert_eq!(
        report.overlap,
        Overlap::Waited { with: run_id(1), reason: "the orchestration wrote user memory" }
    );
    let stamped = vec![STAMP; 64];
    assert_eq!(download_f32(&mut r, p2, 64), add::reference(&stamped, &b));
    for p in [pa, pb, p1, p2] {
        r.free(p).unwrap();
    }
    r.finalize().unwrap();
}

#[test]
fn an_orchestration_reading_user_memory_waits_for_the_run_writing_it() {
    use simpler_device_a2a3::Orchestration;
    use simpler_device_a2a3::programs::add;
    let (mut r, plain, _, [pa, pb, p1, p2], a, b, args1, stamped) = stamping_runner(options());
    let peeking = add::builder_with(Orchestration::Native {
        entry: peek_then_add,
        config: |_| simpler_device_a2a3::OrchConfig { expected_arg_count: 3 },
    })
    .names("peek_then_add", "peek_then_add_config")
    .build()
    .unwrap();
    let peeking = r.register_callable(&peeking).unwrap();
    let cfg = CallConfig::default();
    // Run 1 writes `f1` only once the kernel delay has passed; run 2's orchestration reads
    // `f1` (its first argument) while run 2 is prepared, which is while run 1 executes.
    let (f1, tb, f2) = (args1.tensors()[2], args1.tensors()[1], stamped.tensors()[2]);
    let mut args2 = simpler_types::TaskArgs::new();
    args2.add_input(f1).unwrap().add_input(tb).unwrap().add_output(f2).unwrap();
    r.sim_faults().unwrap().kernel_delay(add::ADD, HOLD);
    let p = r.prepare(&RunRequest::new(run_id(1), plain, &args1, &cfg)).unwrap();
    let first = r.launch_run(p).unwrap();
    let p = r.prepare(&RunRequest::new(run_id(2), peeking, &args2, &cfg)).unwrap();
    r.sim_faults().unwrap().clear();
    let expected = add::reference(&a, &b);
    let peeked: Vec<f32> = PEEKED
        .lock()
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(peeked, expected, "the orchestration read `f1` before run 1 wrote it");
    assert!(r.reap_run(&first, None).unwrap());
    r.complete_run(first).unwrap();
    let second = r.launch_run(p).unwrap();
    assert!(r.reap_run(&second, None).unwrap());
    let report = r.complete_run(second).unwrap();
    assert_eq!(
        report.overlap,
        Overlap::Waited { with: run_id(1), reason: "the orchestration read user memory" }
    );
    assert_eq!(download_f32(&mut r, p2, 64), add::reference(&expected, &b));
    for p in [pa, pb, p1, p2] {
        r.free(p).unwrap();
    }
    r.finalize().unwrap();
}

#[test]
fn an_orchestration_writing_behind_a_run_that_faults_abandons_its_run() {
    use simpler_device_a2a3::programs::add;
    let (mut r, plain, stamping, _, _, _, args1, args2) = stamping_runner(options());
    let cfg = CallConfig::default();
    r.sim_faults().unwrap().kernel_fault(add::ADD, 1);
    let p = r.prepare(&RunRequest::new(run_id(1), plain, &args1, &cfg)).unwrap();
    let first = r.launch_run(p).unwrap();
    // Run 2's write waits for run 1, which never finishes its add: run 2 is abandoned behind
    // run 1, not failed with an error of its own.
    let err = r.prepare(&RunRequest::new(run_id(2), stamping, &args2, &cfg)).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Abandoned { run_id: r2, after, cause, .. }
            if *r2 == run_id(2) && *after == run_id(1) && cause.run_id == run_id(1)),
        "{err}"
    );
    assert!(!r.health().is_healthy(), "run 1's failure made the device unusable");
    let own = r.reap_run(&first, None).unwrap_err();
    assert_eq!(own.run_id(), Some(run_id(1)), "{own}");
    r.finalize().unwrap();
}

/// The stream-sync budget of [`an_orchestration_write_that_gives_up_on_a_run_gives_that_runs_reap_the_same_verdict`].
const SHORT_BUDGET: Duration = Duration::from_millis(2000);

/// `g = d · e`, declaring one and a half [`SHORT_BUDGET`]s on the chip.
unsafe extern "C-unwind" fn overrunning_mul(args: *mut i64) {
    // SAFETY: the runtime's argument vector for the product task, passed on unchanged.
    unsafe { simpler_device_a2a3::programs::vector::mul(args) };
    simpler_device_a2a3::kernel::model_device_time(SHORT_BUDGET * 3 / 2);
}

#[test]
fn an_orchestration_write_that_gives_up_on_a_run_gives_that_runs_reap_the_same_verdict() {
    use simpler_device_a2a3::programs::vector;
    // Run 1 takes longer than a budget of short kernels (no watchdog fires); run 2's
    // orchestration writes user memory while run 1 executes, so the write waits for it and
    // gives up after a budget. The device is unusable through run 1, and run 2 abandoned behind
    // it; run 1's own reap, later, must not report it successful: neither at once (its budget
    // ran from the write's wait) nor once it has ended after all (as it may in the recovery
    // drain, or before anybody reaps it).
    for reap_after_its_end in [false, true] {
        let opts = options()
            .with_scheduler_timeout(SHORT_BUDGET / 8)
            .with_op_execute_timeout(SHORT_BUDGET / 4)
            .with_stream_sync_timeout(SHORT_BUDGET);
        let (mut r, _, stamping, _, _, _, _, args2) = stamping_runner(opts);
        // SAFETY: `overrunning_mul` calls the program's own product kernel, for `MUL`'s signature.
        let builder = unsafe { vector::builder_with_mul(overrunning_mul) };
        let slow = r.register_callable(&builder.build().unwrap());
        let v = VectorRun::new(&mut r, 64);
        let cfg = CallConfig::default();
        let p = r.prepare(&RunRequest::new(run_id(1), slow.unwrap(), &v.args, &cfg)).unwrap();
        let first = r.launch_run(p).unwrap();
        let err = r.prepare(&RunRequest::new(run_id(2), stamping, &args2, &cfg)).unwrap_err();
        assert!(
            matches!(&err, DeviceError::Abandoned { run_id: r2, after, .. }
                if *r2 == run_id(2) && *after == run_id(1)),
            "{err}"
        );
        assert!(!r.health().is_healthy(), "the device is unusable through run 1");
        if reap_after_its_end {
            // Run 1 declares one and a half budgets; one has passed in the write's wait.
            std::thread::sleep(SHORT_BUDGET);
        }
        let own = r.reap_run(&first, None);
        assert!(
            matches!(&own, Err(e) if e.run_id() == Some(run_id(1))),
            "reaped after its end: {reap_after_its_end}; run 1, named as the culprit, reaped \
             as: {own:?}"
        );
        drop(v);
        r.finalize().unwrap();
    }
}

#[test]
fn a_write_behind_queued_runs_names_the_first_that_failed_not_the_last_launched() {
    use simpler_device_a2a3::programs::add;
    let opts = options().with_pipeline_slots(3).with_device_queue(true);
    let (mut r, plain, stamping, _, _, _, args1, args2) = stamping_runner(opts);
    let cfg = CallConfig::default();
    // Run 1 faults; run 2, queued behind it, never starts.
    r.sim_faults().unwrap().kernel_fault(add::ADD, 1);
    let p = r.prepare(&RunRequest::new(run_id(1), plain, &args1, &cfg)).unwrap();
    let first = r.launch_run(p).unwrap();
    let p = r.prepare(&RunRequest::new(run_id(2), plain, &args2, &cfg)).unwrap();
    let second = r.launch_run(p).unwrap();
    let err = r.prepare(&RunRequest::new(run_id(3), stamping, &args2, &cfg)).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Abandoned { after, cause, .. }
            if *after == run_id(1) && cause.run_id == run_id(1)),
        "{err}"
    );
    assert_eq!(r.reap_run(&first, None).unwrap_err().run_id(), Some(run_id(1)));
    let behind = r.reap_run(&second, None).unwrap_err();
    assert!(
        matches!(behind, DeviceError::Abandoned { after, .. } if after == run_id(1)),
        "{behind}"
    );
    r.finalize().unwrap();
}

/// How long [`slow_mul`] declares on the chip.
const SLOW_MUL: Duration = Duration::from_millis(2500);

/// `g = d · e`, declaring [`SLOW_MUL`] on the chip: its run is still executing, as the device
/// sees it, after the host's kernels returned.
unsafe extern "C-unwind" fn slow_mul(args: *mut i64) {
    // SAFETY: the runtime's argument vector for the product task, passed on unchanged.
    unsafe { simpler_device_a2a3::programs::vector::mul(args) };
    simpler_device_a2a3::kernel::model_device_time(SLOW_MUL);
}

#[test]
fn a_fault_queued_behind_a_run_still_executing_on_the_chip_is_charged_to_the_faulting_run() {
    use simpler_device_a2a3::programs::vector;
    // Run 1 is healthy and takes 2.5 s on the chip, longer than the device takes to report
    // run 2's fault; run 2, queued behind it, faults. A
    // device runs run 2 only once run 1 has ended, so run 2's fault cannot be seen while run 1
    // still executes: run 3's write, which waits for both, must blame run 2, and run 1 end well.
    let opts = options().with_pipeline_slots(3).with_device_queue(true);
    let (mut r, _, stamping, _, _, _, _, args2) = stamping_runner(opts);
    // SAFETY: `slow_mul` calls the program's own product kernel, for `MUL`'s signature.
    let builder = unsafe { vector::builder_with_mul(slow_mul) };
    let slow = r.register_callable(&builder.build().unwrap()).unwrap();
    let plain = r.register_callable(&vector_callable()).unwrap();
    let (v1, v2) = (VectorRun::new(&mut r, 64), VectorRun::new(&mut r, 64));
    let cfg = CallConfig::default();
    // The second product executed is run 2's.
    r.sim_faults().unwrap().kernel_fault(FUNC_MUL, 2);
    let p = r.prepare(&RunRequest::new(run_id(1), slow, &v1.args, &cfg)).unwrap();
    let first = r.launch_run(p).unwrap();
    let p = r.prepare(&RunRequest::new(run_id(2), plain, &v2.args, &cfg)).unwrap();
    let second = r.launch_run(p).unwrap();
    let err = r.prepare(&RunRequest::new(run_id(3), stamping, &args2, &cfg)).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Abandoned { run_id: r3, after, cause, .. }
            if *r3 == run_id(3) && *after == run_id(2) && cause.run_id == run_id(2)),
        "{err}"
    );
    assert!(r.reap_run(&first, None).unwrap());
    r.complete_run(first).unwrap();
    let own = r.reap_run(&second, None).unwrap_err();
    assert_eq!(own.run_id(), Some(run_id(2)), "{own}");
    assert!(matches!(own, DeviceError::DeviceFault { .. }), "{own}");
    drop((v1, v2));
    r.finalize().unwrap();
}

/// Submits a task naming a func id no kernel has: on tensormap_and_ringbuffer the orchestration
/// runs on the device, which latches INVALID_ARGS and ends the run.
fn unknown_func_orch(
    ctx: &mut simpler_device_a2a3::OrchCtx<'_>,
    args: &simpler_device_a2a3::OrchArgs<'_>,
) -> Result<(), simpler_device_a2a3::OrchError> {
    let mut a = simpler_types::CoreArgs::new();
    a.add_inout(*args.tensor(0).expect("one argument")).expect("a tensor");
    ctx.submit(simpler_device_a2a3::Kernels::Aiv(2000), &a)?;
    Ok(())
}

#[test]
fn a_dropped_run_whose_device_latched_a_fault_is_logged_naming_the_run_and_the_fault() {
    use simpler_device_a2a3::{ArgDirection, ChipCallable, RuntimeVariant};
    let mut r =
        DeviceRunner::attach(options_on(0, RuntimeVariant::TensormapAndRingbuffer)).unwrap();
    let callable = ChipCallable::native(unknown_func_orch, |_| Default::default())
        .kernel(FUNC_NOOP, noop_core(vec![ArgDirection::InOut]))
        .build()
        .unwrap();
    let slot = r.register_callable(&callable).unwrap();
    let (p, t) = upload_f32(&mut r, &[0.0; 4]);
    let mut args = simpler_types::TaskArgs::new();
    args.add_inout(t).unwrap();
    let cfg = CallConfig::default();
    let prepared = r.prepare(&RunRequest::new(run_id(1), slot, &args, &cfg)).unwrap();
    let active = r.launch_run(prepared).unwrap();
    let give_up = std::time::Instant::now() + Duration::from_secs(20);
    while !r.poll_run(&active).unwrap() {
        assert!(std::time::Instant::now() < give_up, "the run never ended");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The device ended the run; its handle goes without a reap, so no error carries the
    // fault: the next call cleans the run up and must log it.
    drop(active);
    let text = logged(|| {
        vector_once(&mut r, 2, &cfg);
    });
    assert!(
        text.contains("WARN") && text.contains("run#1") && text.contains("2000"),
        "logged: {text:?}"
    );
    r.free(p).unwrap();
    r.finalize().unwrap();
}
