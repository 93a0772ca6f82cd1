//! Conformance of the simulator and host_build_graph: vector runs, launch order, protocol
//! details, fault handling, health, cleanup, threads, memory, callable limits, timeouts, the
//! kernel ABI and the diagnostics files (protocols in `docs/device-*.md`).

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::diag::*;
use common::*;
use simpler_device_a2a3::abi::codes::RuntimeCode;
use simpler_device_a2a3::{
    ArgDirection, CapacityResource, ChipCallable, CoreCallable, DeviceError, DeviceHealth,
    DevicePtr, DeviceRunner, KernelCall, KernelKind, Kernels, OrchArgs, OrchConfig, OrchCtx,
    OrchError, RunRequest,
};
use simpler_types::{
    CallConfig, CoreArgs, DataType, RingSel, SwimlaneLevel, TaskArgs, Tensor, TensorArgType,
};

// ----- 1. vector_add on every shape -----

fn vector_add_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    a.add_input(*args.tensor(0).unwrap()).unwrap();
    a.add_input(*args.tensor(1).unwrap()).unwrap();
    a.add_output(*args.tensor(2).unwrap()).unwrap();
    ctx.submit(Kernels::Aiv(FUNC_ADD), &a)?;
    Ok(())
}

#[test]
fn vector_add_and_the_vector_example_pass_for_block_dim_1_to_3_and_2_to_4_threads() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    use ArgDirection::{In, Out};
    let add = ChipCallable::native(vector_add_orch, three_args)
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(FUNC_ADD, unsafe { CoreCallable::native(vec![In, In, Out], add_kernel) })
        .build()
        .unwrap();
    let add_slot = r.register_callable(&add).unwrap();
    let ex_slot = r.register_callable(&vector_callable()).unwrap();
    let n = 128 * 128;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let (px, tx) = upload_f32(&mut r, &x);
    let (py, ty) = upload_f32(&mut r, &x);
    let (pz, tz) = upload_f32(&mut r, &vec![0.0; n]);
    let mut add_args = TaskArgs::new();
    add_args.add_input(tx).unwrap().add_input(ty).unwrap().add_output(tz).unwrap();
    let v = VectorRun::new(&mut r, n);
    let mut run = 1;
    for block_dim in 1..=3 {
        for threads in 2..=4 {
            let cfg = CallConfig::builder()
                .block_dim(block_dim)
                .aicpu_thread_num(threads)
                .build()
                .unwrap();
            r.memset(pz, 0, (n * 4) as u64).unwrap();
            let rep = r.run(&RunRequest::new(run_id(run), add_slot, &add_args, &cfg)).unwrap();
            assert_eq!(rep.tasks, 1);
            let z = download_f32(&mut r, pz, n);
            assert!(
                z.iter().enumerate().all(|(i, v)| *v == 2.0 * i as f32),
                "vector_add, block_dim {block_dim}, threads {threads}"
            );
            // Cleared first, so an earlier shape's result cannot pass for this one's.
            r.memset(v.ptrs[2], 0, (n * 4) as u64).unwrap();
            let rep = r.run(&RunRequest::new(run_id(run + 1), ex_slot, &v.args, &cfg)).unwrap();
            assert_eq!(rep.tasks, 5);
            v.check(&mut r);
            run += 2;
        }
    }
    v.free(&mut r);
    for p in [px, py, pz] {
        r.free(p).unwrap();
    }
    r.finalize().unwrap();
}

// ----- 2 (simulator part). A stale aicore_done never opens a window early -----

#[test]
fn back_to_back_runs_of_different_shapes_complete() {
    // Every run's image carries zeroed handshake records and L1 clears them again on the
    // device (the runner's unit test `runs_after_runs_start_from_cleared_handshakes` shows L1
    // on its own); back-to-back runs with different shapes would deadlock or misroute
    // otherwise.
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    for (i, b) in [3u32, 1, 2, 1, 3].into_iter().enumerate() {
        let cfg = CallConfig::builder().block_dim(b).build().unwrap();
        vector_once(&mut r, i as u64 + 1, &cfg);
    }
    r.finalize().unwrap();
}

// ----- 7 (hbg). Capacity and orchestration codes; the device stays healthy -----

fn many_tasks_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let n = args.scalar(0).unwrap_or(0);
    let t = *args.tensor(0).unwrap();
    for _ in 0..n {
        let mut a = CoreArgs::new();
        a.add_inout(t).unwrap();
        ctx.submit(Kernels::Aiv(FUNC_NOOP), &a)?;
    }
    Ok(())
}

fn big_alloc_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let kib = args.scalar(0).unwrap_or(0) as u32;
    for _ in 0..4 {
        let _ = ctx.alloc_tensor(&[kib, 256], DataType::Float32);
    }
    Ok(())
}

fn fatal_orch(ctx: &mut OrchCtx<'_>, _args: &OrchArgs<'_>) -> Result<(), OrchError> {
    ctx.report_fatal(0, "the orchestration gave up");
    Ok(())
}

fn noop_callable(orch: simpler_device_a2a3::NativeOrchFn, expected: u32) -> ChipCallable {
    let config: simpler_device_a2a3::NativeConfigFn = match expected {
        0 => |_| OrchConfig { expected_arg_count: 0 },
        _ => |_| OrchConfig { expected_arg_count: 5 },
    };
    ChipCallable::native(orch, config)
        .kernel(FUNC_NOOP, noop_core(vec![ArgDirection::InOut]))
        .build()
        .unwrap()
}

#[test]
fn hbg_capacity_and_orchestration_errors_fail_before_launch_and_leave_the_device_healthy() {
    let hbg = simpler_device_a2a3::RuntimeVariant::HostBuildGraph;
    let mut r = DeviceRunner::attach(options_on(0, hbg)).unwrap();
    let (p, t) = upload_f32(&mut r, &[0.0; 256]);
    let many = r.register_callable(&noop_callable(many_tasks_orch, 0)).unwrap();
    let alloc = r.register_callable(&noop_callable(big_alloc_orch, 0)).unwrap();
    let fatal = r.register_callable(&noop_callable(fatal_orch, 0)).unwrap();
    let expects5 = r.register_callable(&noop_callable(fatal_orch, 5)).unwrap();
    let launches = r.stats().aicore_launches;

    // Task window: 20 tasks into a window of 16.
    let cfg = CallConfig::builder().task_window(RingSel::Ring(0), 16).build().unwrap();
    let mut args = TaskArgs::new();
    args.add_inout(t).unwrap().add_scalar(20).unwrap();
    let err = r.run(&RunRequest::new(run_id(1), many, &args, &cfg)).unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::Capacity {
                ring: 0,
                resource: CapacityResource::TaskWindow,
                capacity: 16,
                needed: 20,
                at_least: false,
                ..
            }
        ),
        "{err}"
    );
    // A graph far past the window is stopped at 4 × its capacity: the orchestration's submit
    // returns the capacity status, and `needed` is a lower bound.
    let mut args = TaskArgs::new();
    args.add_inout(t).unwrap().add_scalar(100_000).unwrap();
    let err = r.run(&RunRequest::new(run_id(6), many, &args, &cfg)).unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::Capacity {
                resource: CapacityResource::TaskWindow,
                capacity: 16,
                needed: 65,
                at_least: true,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("needed at least 65"), "{err}");
    // Heap: four 256 KiB tensors into 512 KiB.
    let cfg = CallConfig::builder().heap_bytes(RingSel::Ring(0), 512 << 10).build().unwrap();
    let mut args = TaskArgs::new();
    args.add_scalar(256).unwrap();
    let err = r.run(&RunRequest::new(run_id(2), alloc, &args, &cfg)).unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::Capacity {
                ring: 0,
                resource: CapacityResource::Heap,
                capacity: 524_288,
                needed: 1_048_576,
                ..
            }
        ),
        "{err}"
    );
    // Code 9: report_fatal.
    let err = r
        .run(&RunRequest::new(run_id(3), fatal, &TaskArgs::new(), &CallConfig::default()))
        .unwrap_err();
    let DeviceError::Runtime { fault, .. } = &err else { panic!("{err}") };
    assert_eq!(fault.code, RuntimeCode::OrchestrationFatal);
    assert!(fault.message.contains("gave up"));
    // Code 5: fewer chip args than the config expects.
    let err = r
        .run(&RunRequest::new(run_id(4), expects5, &TaskArgs::new(), &CallConfig::default()))
        .unwrap_err();
    assert!(
        matches!(&err, DeviceError::Runtime { fault, .. } if fault.code == RuntimeCode::InvalidArgs),
        "{err}"
    );

    assert_eq!(
        r.stats().aicore_launches,
        launches,
        "no device call for a graph that failed on the host"
    );
    assert_eq!(r.health(), DeviceHealth::Healthy);
    let mut args = TaskArgs::new();
    args.add_inout(t).unwrap().add_scalar(3).unwrap();
    r.run(&RunRequest::new(run_id(5), many, &args, &CallConfig::default())).unwrap();
    r.free(p).unwrap();
    r.finalize().unwrap();
}

// ----- 8. An unusable runner fails fast -----

#[test]
fn an_unusable_runner_rejects_device_calls_and_a_new_runner_runs() {
    let mut r = DeviceRunner::attach(fast_options(4)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    r.sim_faults().unwrap().fail_launch(KernelKind::AiCore, 1);
    let cfg = CallConfig::default();
    assert!(r.run(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).is_err());
    let probe = r.health_probe();
    let cause = match probe.health() {
        DeviceHealth::Unusable { cause } => cause,
        h => panic!("{h}"),
    };
    assert_eq!(cause.run_id, run_id(1));
    let launches = r.stats().aicore_launches;
    let unusable = |e: DeviceError| matches!(e, DeviceError::Unusable { device_id: 4, .. });
    assert!(unusable(r.run(&RunRequest::new(run_id(2), slot, &v.args, &cfg)).unwrap_err()));
    assert!(unusable(r.malloc(16).unwrap_err()));
    assert!(unusable(r.copy_to_device(v.ptrs[0], &[0; 4]).unwrap_err()));
    assert!(unusable(r.copy_from_device(&mut [0; 4], v.ptrs[0]).unwrap_err()));
    assert!(unusable(r.memset(v.ptrs[0], 0, 4).unwrap_err()));
    assert!(unusable(r.register_callable(&vector_callable()).unwrap_err()));
    assert_eq!(r.stats().aicore_launches, launches, "no backend call");
    v.free(&mut r);
    r.finalize().unwrap();
    assert!(!probe.is_healthy(), "the probe keeps the last state");
    let mut fresh = DeviceRunner::attach(options(4)).unwrap();
    assert!(fresh.health().is_healthy());
    vector_once(&mut fresh, 1, &CallConfig::default());
    fresh.finalize().unwrap();
}

// ----- 9. Terminal cleanup on every path; drop joins threads -----

fn sim_threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|c| c.starts_with(prefix))
                })
                .count()
        })
        .unwrap_or(0)
}

/// [`sim_threads_named`] once it reaches 0, or after two seconds. A join returns when the
/// kernel clears the thread's id, slightly before the thread leaves `/proc/self/task`; a thread
/// that was never joined stays there.
fn sim_threads_left(prefix: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let n = sim_threads_named(prefix);
        if n == 0 || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn terminal_cleanup_runs_once_on_every_exit_path() {
    // A short scheduler budget for the latched timeout below, and a shutdown budget long enough
    // that the delayed kernel always answers the exit signal. host_build_graph: the runs export
    // their dependency graph, a diagnostic only that runtime collects.
    let hbg = simpler_device_a2a3::RuntimeVariant::HostBuildGraph;
    let mut r = DeviceRunner::attach(
        fast_options_on(0, hbg).with_shutdown_budget(std::time::Duration::from_secs(10)),
    )
    .unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let cfg = CallConfig::default();
    let cleanups = |r: &DeviceRunner| r.stats().terminal_cleanups;
    let c0 = cleanups(&r);
    // Success.
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    assert_eq!(cleanups(&r), c0 + 1);
    // P7 failure: a chip argument that is not device memory.
    let mut bad = TaskArgs::new();
    let stray = Tensor::external(0x10, &[4], DataType::Float32).unwrap().child_memory(true);
    let good = v.args.tensors()[0];
    bad.add_input(good).unwrap().add_input(stray).unwrap().add_output(stray).unwrap();
    let err = r.run(&RunRequest::new(run_id(2), slot, &bad, &cfg)).unwrap_err();
    assert!(
        matches!(err, DeviceError::BadDevicePointer { addr: DevicePtr(0x10), run_id: Some(id), arg: Some(1), .. } if id == run_id(2)),
        "{err}"
    );
    assert_eq!(cleanups(&r), c0 + 2);
    // Abandoning a prepared run.
    let p = r.prepare(&RunRequest::new(run_id(3), slot, &v.args, &cfg)).unwrap();
    r.abandon(p).unwrap();
    assert_eq!(cleanups(&r), c0 + 3);
    // Validation failure in complete_run: a latched scheduler timeout with a clean shutdown
    // (the delayed kernel answers the exit signal in time), which leaves the device healthy.
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, std::time::Duration::from_millis(400));
    let err = r.run(&RunRequest::new(run_id(4), slot, &v.args, &cfg)).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Runtime { fault, .. } if fault.code == RuntimeCode::SchedulerTimeout),
        "{err}"
    );
    assert_eq!(cleanups(&r), c0 + 4);
    assert!(r.health().is_healthy());
    r.sim_faults().unwrap().clear();
    r.run(&RunRequest::new(run_id(5), slot, &v.args, &cfg)).unwrap();
    assert_eq!(cleanups(&r), c0 + 5);
    assert_eq!(r.stats().exports, r.stats().terminal_cleanups, "one export pass per run");
    assert_eq!(r.stats().live_allocations, 3, "runs leave no allocation behind");

    // Drop with a prepared run: the cleanup runs from Drop and exports the host-built graph.
    let dir = temp_dir("drop-cleanup");
    let traced = CallConfig::builder().dep_gen(true).output_prefix(&dir).build().unwrap();
    let prepared = r.prepare(&RunRequest::new(run_id(6), slot, &v.args, &traced)).unwrap();
    drop(r);
    drop(prepared);
    let deps: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("deps.json")).unwrap()).unwrap();
    assert_eq!(deps["complete"], false);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn dropping_a_runner_without_finalize_joins_its_threads() {
    let mut r = DeviceRunner::attach(options(91)).unwrap();
    vector_once(&mut r, 1, &CallConfig::default());
    assert!(sim_threads_named("sim91-") > 0);
    drop(r);
    assert_eq!(sim_threads_left("sim91-"), 0);
}

#[test]
fn dropping_a_runner_with_a_launched_run_stops_and_joins_everything() {
    let mut r = DeviceRunner::attach(fast_options(92)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 4096);
    r.sim_faults().unwrap().kernel_hang(FUNC_MUL, 1);
    let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default())).unwrap();
    let _active = r.launch_run(p).unwrap();
    drop(r);
    assert_eq!(sim_threads_left("sim92-"), 0);
}

// ----- 10. Persistent threads, parked between runs; several devices at once -----

#[test]
fn two_hundred_runs_spawn_no_threads_after_the_first_and_park_between_runs() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 256);
    let cfg = CallConfig::default();
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    let spawned = r.stats().sim_threads_spawned;
    for i in 2..=200 {
        r.run(&RunRequest::new(run_id(i), slot, &v.args, &cfg)).unwrap();
        if i % 50 == 0 {
            wait_all_parked(&r);
        }
    }
    assert_eq!(r.stats().sim_threads_spawned, spawned);
    v.check(&mut r);
    v.free(&mut r);
    r.finalize().unwrap();
}

#[test]
fn four_simulated_devices_with_block_dim_8_run_concurrently() {
    let handles: Vec<_> = (0..4)
        .map(|d| {
            std::thread::spawn(move || {
                let mut r = DeviceRunner::attach(options(d)).unwrap();
                let cfg = CallConfig::builder().block_dim(8).build().unwrap();
                for i in 0..5 {
                    vector_once(&mut r, i + 1, &cfg);
                }
                r.finalize().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Each block's kernel writes the timer slack of the simulated core thread running it.
#[cfg(target_os = "linux")]
unsafe extern "C-unwind" fn timer_slack_kernel(args: *mut i64) {
    // SAFETY: the probe task has one tensor.
    let k = unsafe { KernelCall::from_raw(args, 1) };
    let out = k.tensor(0).unwrap();
    let slack = rustix::thread::current_timer_slack().unwrap_or(u64::MAX);
    // SAFETY: block b writes word b of the 4-word output; the task runs 4 blocks.
    unsafe { (out.data_addr() as *mut u64).add(k.block_idx() as usize).write(slack) };
}

#[cfg(target_os = "linux")]
fn timer_slack_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    a.add_tensor(*args.tensor(0).unwrap(), TensorArgType::OutputExisting).unwrap();
    ctx.submit_blocks(Kernels::Aiv(13), &a, 4)?;
    Ok(())
}

/// A kernel delay is device time: the simulated threads' timers fire when asked, without the
/// 50 µs of slack Linux gives a normal thread (which made an 83 µs delay take 138 µs). The
/// kernels read their own thread's slack, which needs no privilege.
#[cfg(target_os = "linux")]
#[test]
fn simulated_threads_run_their_timers_without_slack() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let c = ChipCallable::native(timer_slack_orch, |_| OrchConfig { expected_arg_count: 1 })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(13, unsafe { CoreCallable::native(vec![ArgDirection::Out], timer_slack_kernel) })
        .build()
        .unwrap();
    let slot = r.register_callable(&c).unwrap();
    let p = r.malloc(32).unwrap();
    let t = Tensor::external(p.addr(), &[4], DataType::UInt64).unwrap().child_memory(true);
    let mut args = TaskArgs::new();
    args.add_output(t).unwrap();
    let cfg = CallConfig::builder().block_dim(2).build().unwrap();
    r.run(&RunRequest::new(run_id(1), slot, &args, &cfg)).unwrap();
    let mut raw = [0u8; 32];
    r.copy_from_device(&mut raw, p).unwrap();
    let slacks: Vec<u64> =
        raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(slacks, [1; 4], "timer slack (ns) of the core thread of each block");
    r.free(p).unwrap();
    r.unregister_callable(slot).unwrap();
    r.finalize().unwrap();
}

// ----- 11. Memory -----

#[test]
fn memory_errors_are_typed_and_allocations_are_aligned_and_zeroed() {
    let mut opts = options(0);
    opts.sim.memory_limit = 8 << 20;
    let mut r = DeviceRunner::attach(opts).unwrap();
    assert!(matches!(
        r.malloc(0),
        Err(DeviceError::InvalidArgs { problem: simpler_device_a2a3::ArgsProblem::ZeroMalloc, .. })
    ));
    assert!(matches!(
        r.malloc(64 << 20),
        Err(DeviceError::OutOfMemory { bytes: 67_108_864, limit: Some(8_388_608), .. })
    ));
    let p = r.malloc(3000).unwrap();
    assert_eq!(p.addr() % 1024, 0);
    let mut buf = vec![0xAB; 3000];
    r.copy_from_device(&mut buf, p).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    assert!(matches!(
        r.copy_to_device(p.offset(2999), &[1, 2]),
        Err(DeviceError::BadDevicePointer { len: 2, .. })
    ));
    assert!(matches!(r.memset(p.offset(4096), 0, 1), Err(DeviceError::BadDevicePointer { .. })));
    assert!(matches!(r.free(p.offset(8)), Err(DeviceError::BadDevicePointer { .. })));
    r.free(p).unwrap();
    assert!(matches!(r.free(p), Err(DeviceError::BadDevicePointer { .. })));
    let _leak = r.malloc(100).unwrap();
    assert_eq!(r.stats().live_allocations, 1);
    let report = r.finalize().unwrap();
    assert!(report.freed_allocations >= 1);
}

// ----- 12. Callable limits -----

#[test]
fn callable_limits_are_enforced_with_the_values_named() {
    use ArgDirection::In;
    let base = || ChipCallable::native(vector::orchestration, three_args);
    use simpler_device_a2a3::{CallableName, CallableProblem as P, KernelCodeKind};
    let invalid = |r: Result<ChipCallable, DeviceError>, want: P| match r {
        Err(DeviceError::InvalidCallable { problem, .. }) => assert_eq!(problem, want),
        other => panic!("expected InvalidCallable, got {other:?}"),
    };
    invalid(
        base().kernel(1024, noop_core(vec![ArgDirection::InOut])).build(),
        P::FuncIdRange { func_id: 1024, limit: 1024 },
    );
    invalid(
        base()
            .kernel(3, noop_core(vec![ArgDirection::InOut]))
            .kernel(3, noop_core(vec![ArgDirection::InOut]))
            .build(),
        P::DuplicateFuncId { func_id: 3 },
    );
    invalid(
        base().kernel(0, noop_core(vec![In; 33])).build(),
        P::KernelSignatureTooLong { func_id: 0, entries: 33, max: 32 },
    );
    invalid(
        base().kernel(0, noop_core(vec![ArgDirection::Scalar; 17])).build(),
        P::TooManyScalars { func_id: 0, scalars: 17, max: 16 },
    );
    invalid(
        base().signature(vec![In; 129]).build(),
        P::ChipSignatureTooLong { entries: 129, max: 128 },
    );
    invalid(
        base().names("e".repeat(64), "c").build(),
        P::NameTooLong { which: CallableName::Entry, name: "e".repeat(64), max: 63 },
    );
    // No code to load: an empty kernel text, an empty orchestration object.
    invalid(
        base()
            // SAFETY: never registered, the build refuses it.
            .kernel(2, unsafe {
                CoreCallable::new(vec![], simpler_device_a2a3::KernelCode::Text(vec![]))
            })
            .build(),
        P::EmptyCode { func_id: Some(2) },
    );
    // SAFETY: never registered, the build refuses it.
    let empty = unsafe { simpler_device_a2a3::OrchestrationObject::new(vec![], "e", "c") };
    invalid(
        ChipCallable::builder(simpler_device_a2a3::Orchestration::DeviceObject(empty)).build(),
        P::EmptyCode { func_id: None },
    );

    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let text = base()
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(0, unsafe {
            CoreCallable::new(vec![], simpler_device_a2a3::KernelCode::Text(vec![0; 8]))
        })
        .build()
        .unwrap();
    assert!(matches!(
        r.register_callable(&text),
        Err(DeviceError::InvalidCallable {
            problem: P::KernelCode { func_id: 0, code: KernelCodeKind::Text },
            ..
        })
    ));
    let c = vector_callable();
    let slots: Vec<_> = (0..64).map(|_| r.register_callable(&c).unwrap()).collect();
    assert_eq!(r.stats().chip_buffer_uploads, 1, "identical chip buffers are uploaded once");
    assert!(matches!(r.register_callable(&c), Err(DeviceError::TooManyCallables { capacity: 64 })));
    let v = VectorRun::new(&mut r, 64);
    let cfg = CallConfig::default();
    let p = r.prepare(&RunRequest::new(run_id(1), slots[5], &v.args, &cfg)).unwrap();
    assert!(matches!(
        r.unregister_callable(slots[5]),
        Err(DeviceError::CallableInUse { slot: 5, .. })
    ));
    let a = r.launch_run(p).unwrap();
    r.reap_run(&a, None).unwrap();
    r.complete_run(a).unwrap();
    r.unregister_callable(slots[5]).unwrap();
    assert_eq!(r.register_callable(&c).unwrap().index(), 5, "the lowest free slot is reused");
    v.free(&mut r);
    r.finalize().unwrap();
}

// ----- 15. Kernel ABI probe -----

const PROBE_WORDS: usize = 8;

fn probe(args: *mut i64, member: u64) {
    // SAFETY: the probe task has one tensor and one scalar.
    let k = unsafe { KernelCall::from_raw(args, 1) };
    let out = k.tensor(0).unwrap();
    let slot = (k.block_idx() as u64 * 3 + member) as usize * PROBE_WORDS;
    // SAFETY: slot 48 and 49 are readable argument slots.
    let (l, g) = unsafe { (*args.add(48), *args.add(49)) };
    let words = [
        k.block_idx() as u64,
        k.block_num() as u64,
        k.sub_block_id() as u64,
        k.scalar(0).unwrap(),
        out.addr,
        // SAFETY: slot 0 holds the descriptor address.
        unsafe { *args } as u64,
        (l != 0 && g != 0) as u64,
        1,
    ];
    let base = out.data_addr() as *mut u64;
    for (i, w) in words.iter().enumerate() {
        // SAFETY: each (block, member) writes its own 8 words inside the 6 × 8-word buffer.
        unsafe { base.add(slot + i).write(*w) };
    }
}

unsafe extern "C-unwind" fn probe_aic(args: *mut i64) {
    probe(args, 0)
}
unsafe extern "C-unwind" fn probe_aiv0(args: *mut i64) {
    probe(args, 1)
}
unsafe extern "C-unwind" fn probe_aiv1(args: *mut i64) {
    probe(args, 2)
}

fn probe_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    a.add_tensor(*args.tensor(0).unwrap(), TensorArgType::OutputExisting).unwrap();
    a.add_scalar_of(-1i32).unwrap();
    ctx.submit_blocks(Kernels::Mix { aic: Some(10), aiv0: Some(11), aiv1: Some(12) }, &a, 2)?;
    Ok(())
}

/// Registers `c`, runs it once in 2 blocks over a fresh buffer of `words` u64 words (its one
/// output), and returns the buffer and the words the probe kernels wrote.
fn run_probe(
    r: &mut DeviceRunner,
    c: &ChipCallable,
    words: usize,
) -> (simpler_device_a2a3::DevicePtr, Vec<u64>) {
    let slot = r.register_callable(c).unwrap();
    let p = r.malloc((words * 8) as u64).unwrap();
    let t =
        Tensor::external(p.addr(), &[words as u32], DataType::UInt64).unwrap().child_memory(true);
    let mut args = TaskArgs::new();
    args.add_output(t).unwrap();
    let cfg = CallConfig::builder().block_dim(2).build().unwrap();
    r.run(&RunRequest::new(run_id(1), slot, &args, &cfg)).unwrap();
    let mut raw = vec![0u8; words * 8];
    r.copy_from_device(&mut raw, p).unwrap();
    (p, raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect())
}

#[test]
fn the_kernel_abi_probe_sees_descriptors_scalars_and_contexts() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let c = ChipCallable::native(probe_orch, |_| OrchConfig { expected_arg_count: 1 })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(10, unsafe {
            CoreCallable::native(vec![ArgDirection::Out, ArgDirection::Scalar], probe_aic)
        })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(11, unsafe {
            CoreCallable::native(vec![ArgDirection::Out, ArgDirection::Scalar], probe_aiv0)
        })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(12, unsafe {
            CoreCallable::native(vec![ArgDirection::Out, ArgDirection::Scalar], probe_aiv1)
        })
        .build()
        .unwrap();
    let (p, w) = run_probe(&mut r, &c, 6 * PROBE_WORDS);
    for block in 0..2u64 {
        for member in 0..3u64 {
            let o = ((block * 3 + member) as usize) * PROBE_WORDS;
            let rec = &w[o..o + PROBE_WORDS];
            assert_eq!(rec[7], 1, "block {block} member {member} ran");
            assert_eq!(rec[0], block, "block_idx");
            assert_eq!(rec[1], 2, "block_num");
            assert_eq!(rec[2], if member == 2 { 1 } else { 0 }, "sub_block_id");
            assert_eq!(rec[3], 0x0000_0000_FFFF_FFFF, "scalar low bytes, zero-extended");
            assert_eq!(rec[4], p.addr(), "args[0] is a descriptor naming the buffer");
            assert_ne!(rec[5], p.addr(), "args[0] is the descriptor's address, not the data");
            assert_eq!(rec[6], 1, "contexts at args[48] and args[49]");
        }
    }
    r.free(p).unwrap();
    r.finalize().unwrap();
}

/// Records `[copy_num, sub_block_id]` of the call at record `scalar + 3 · block_idx + copy_idx`.
unsafe extern "C-unwind" fn copy_probe(args: *mut i64) {
    // SAFETY: the copy probe's tasks pass one tensor and one scalar.
    let k = unsafe { KernelCall::from_raw(args, 1) };
    let (out, base) = (k.tensor(0).unwrap(), k.scalar(0).unwrap());
    let record = base + 3 * u64::from(k.block_idx()) + u64::from(k.copy_idx());
    let words = out.data_addr() as *mut u64;
    for (i, w) in [u64::from(k.copy_num()), u64::from(k.sub_block_id())].into_iter().enumerate() {
        // SAFETY: every call writes its own two words inside the 18 records of the buffer.
        unsafe { words.add(2 * record as usize + i).write(w) };
    }
}

const COPY_PROBE: u32 = 13;

/// Two blocks each of: a MIX task running the copy probe on all three members, one running it
/// on both AIV sub-blocks, and an AIV task; at records 0, 6 and 12.
fn copy_probe_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let f = Some(COPY_PROBE);
    let tasks = [
        Kernels::Mix { aic: f, aiv0: f, aiv1: f },
        Kernels::Mix { aic: None, aiv0: f, aiv1: f },
        Kernels::Aiv(COPY_PROBE),
    ];
    for (i, kernels) in tasks.into_iter().enumerate() {
        let mut a = CoreArgs::new();
        a.add_tensor(*args.tensor(0).unwrap(), TensorArgType::OutputExisting).unwrap();
        a.add_scalar(6 * i as u64).unwrap();
        ctx.submit_blocks(kernels, &a, 2)?;
    }
    Ok(())
}

#[test]
fn the_members_of_a_mix_block_running_one_kernel_are_its_numbered_copies() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let sig = vec![ArgDirection::Out, ArgDirection::Scalar];
    let c = ChipCallable::native(copy_probe_orch, |_| OrchConfig { expected_arg_count: 1 })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(COPY_PROBE, unsafe { CoreCallable::native(sig, copy_probe) })
        .build()
        .unwrap();
    let (p, w) = run_probe(&mut r, &c, 18 * 2);
    // Per task, `copy_num` and `sub_block_id` of copies 0, 1, 2 (`copy_num` 0: no such copy;
    // an AIV task may run on either sub-block).
    let want: [[(u64, Option<u64>); 3]; 3] = [
        [(3, Some(0)), (3, Some(0)), (3, Some(1))],
        [(2, Some(0)), (2, Some(1)), (0, Some(0))],
        [(1, None), (0, Some(0)), (0, Some(0))],
    ];
    for (task, copies) in want.iter().enumerate() {
        for block in 0..2 {
            for (copy, &(copy_num, sub_block)) in copies.iter().enumerate() {
                let at = 2 * (6 * task + 3 * block + copy);
                let here = format!("task {task}, block {block}, copy {copy}");
                assert_eq!(w[at], copy_num, "{here}: copy_num");
                if let Some(sub_block) = sub_block {
                    assert_eq!(w[at + 1], sub_block, "{here}: sub_block_id");
                }
            }
        }
    }
    r.free(p).unwrap();
    r.finalize().unwrap();
}

// ----- 16. Diagnostics files -----

#[test]
fn diagnostics_write_parseable_files_only_under_the_prefix() {
    let dir = temp_dir("diag");
    let mut r =
        DeviceRunner::attach(options_on(0, simpler_device_a2a3::RuntimeVariant::HostBuildGraph))
            .unwrap();
    let cfg = CallConfig::builder()
        .swimlane(SwimlaneLevel::AicpuTiming)
        .dep_gen(true)
        .output_prefix(&dir)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let rep = vector_once(&mut r, 1, &cfg);
    let host = t0.elapsed();
    let wall = rep.device_wall.expect("device wall time");
    assert!(wall > std::time::Duration::ZERO && wall <= host, "wall {wall:?} host {host:?}");

    let names: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "deps.dot".into(),
            "deps.json".into(),
            "l2_swimlane_records.json".into(),
            "swimlane.perfetto.json".into()
        ])
    );
    let perfetto = json(&dir.join("swimlane.perfetto.json"));
    let cores = x_events(&perfetto, 1);
    assert_eq!(cores.len(), 5, "one X event per (task, block) dispatch");
    let kernels: BTreeSet<&str> = cores.iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(kernels, BTreeSet::from(["add", "add_scalar", "mul"]), "slices named by kernel");
    let records = json(&dir.join("l2_swimlane_records.json"));
    assert_eq!(records["aicore_tasks"].as_array().unwrap().len(), 5);
    // Level 2 adds one AICPU record per dispatch: token written, then completion observed.
    let aicpu = records["aicpu_tasks"].as_array().unwrap();
    assert_eq!(aicpu.len(), 5);
    assert!(aicpu.iter().all(|r| r[5].as_u64().unwrap() >= r[4].as_u64().unwrap() && r[4].as_u64().unwrap() > 0));
    assert_eq!(x_events(&perfetto, 3).len(), 5, "AICPU dispatch spans");
    assert_eq!(records["metadata"]["clock_freq_hz"], 50_000_000);

    // deps.json edges equal a replay of its own submit records through the tensor map.
    let deps = json(&dir.join("deps.json"));
    assert_eq!(deps["complete"], true);
    let wired = wired_edges(&deps);
    assert_eq!(wired, replayed_edges(&deps));
    assert_eq!(wired, BTreeSet::from([(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (0, 4)]));

    // Scope statistics: one begin and one end per scope; a 3-block task is 3 dispatches.
    let dir2 = temp_dir("scopes");
    let slot = r.register_callable(&scoped_callable()).unwrap();
    let (p, t) = upload_f32(&mut r, &[0.0; 8]);
    let mut args = TaskArgs::new();
    args.add_inout(t).unwrap();
    let cfg = CallConfig::builder()
        .scope_stats(true)
        .swimlane(SwimlaneLevel::AicoreTiming)
        .output_prefix(&dir2)
        .build()
        .unwrap();
    r.run(&RunRequest::new(run_id(2), slot, &args, &cfg)).unwrap();
    let lines = scope_stats(&dir2);
    assert_eq!(lines[0]["total"], 4);
    assert_eq!(lines[1..].iter().filter(|l| l["phase"] == "begin").count(), 2);
    assert_eq!(lines[1..].iter().filter(|l| l["phase"] == "end").count(), 2);
    assert_eq!(x_events(&json(&dir2.join("swimlane.perfetto.json")), 1).len(), 3);

    // Diagnostics off writes nothing, even with a prefix.
    let dir3 = temp_dir("quiet");
    let cfg = CallConfig::builder().output_prefix(&dir3).build().unwrap();
    r.run(&RunRequest::new(run_id(3), slot, &args, &cfg)).unwrap();
    assert_eq!(std::fs::read_dir(&dir3).unwrap().count(), 0);
    r.free(p).unwrap();
    r.finalize().unwrap();
    for d in [dir, dir2, dir3] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn the_engine_task_that_started_a_run_is_recorded_in_its_report_trace_and_deps() {
    let dir = temp_dir("origin");
    let mut r =
        DeviceRunner::attach(options_on(0, simpler_device_a2a3::RuntimeVariant::HostBuildGraph))
            .unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 256);
    let cfg = CallConfig::builder()
        .swimlane(SwimlaneLevel::AicpuTiming)
        .dep_gen(true)
        .output_prefix(&dir)
        .build()
        .unwrap();
    let origin = simpler_types::TaskId::new(run_id(41), 7);
    let req = RunRequest::new(run_id(3), slot, &v.args, &cfg).with_origin(origin);
    let rep = r.run(&req).unwrap();
    assert_eq!(rep.origin, Some(origin));
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap()
    };
    let want = serde_json::json!({"run": "41", "task": 7});
    assert_eq!(read("deps.json")["origin"], want);
    assert_eq!(read("swimlane.perfetto.json")["metadata"]["origin"], want);
    // A run started directly names no origin.
    let rep = r.run(&RunRequest::new(run_id(4), slot, &v.args, &cfg)).unwrap();
    assert_eq!(rep.origin, None);
    assert!(read("deps.json")["origin"].is_null());
    v.free(&mut r);
    r.finalize().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

// ----- 17. The scheduler has no simulator-only branches -----

#[test]
fn the_aicpu_scheduler_reaches_hardware_only_through_its_platform_trait() {
    let sources = [
        include_str!("../src/aicpu/mod.rs"),
        include_str!("../src/aicpu/scheduler.rs"),
        include_str!("../src/aicpu/dispatch.rs"),
        include_str!("../src/aicpu/view.rs"),
        include_str!("../src/aicpu/trace.rs"),
        include_str!("../src/aicpu/trb/record.rs"),
    ];
    for src in sources {
        // Unit tests may use std freely; only the scheduler code itself is checked.
        let src = src.split("#[cfg(test)]").next().unwrap_or(src);
        for forbidden in [
            "crate::backend",
            "SimShared",
            "SimDevice",
            "sim::",
            "cfg(feature",
            "std::thread",
            "Mutex",
            "Vec<",
            "Box<",
        ] {
            assert!(!src.contains(forbidden), "the AICPU scheduler mentions {forbidden:?}");
        }
    }
}
