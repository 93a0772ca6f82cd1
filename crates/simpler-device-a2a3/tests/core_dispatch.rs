//! Which host thread runs a dispatched kernel (`docs/device-simulator.md`, "Who runs a
//! dispatch"), and scheduling threads that own no cluster, on both chip runtimes.

mod common;

use std::time::Duration;

use common::diag::json;
use common::*;
use simpler_device_a2a3::abi::codes::AclCode;
use simpler_device_a2a3::{
    ArgDirection, ChipCallable, CoreCallable, CoreDispatch, DeviceError, DeviceRunner, KernelCall,
    Kernels, OrchArgs, OrchConfig, OrchCtx, OrchError, RunRequest, RunnerOptions, RuntimeVariant,
};
use simpler_types::{CallConfig, CoreArgs, SwimlaneLevel, TaskArgs};

const RUNTIMES: [RuntimeVariant; 2] =
    [RuntimeVariant::HostBuildGraph, RuntimeVariant::TensormapAndRingbuffer];

/// Tasks (and output tensors) of one run.
const TASKS: usize = 4;

const WHERE: u32 = 0;
const PANICS: u32 = 1;

/// Writes 1 to its output if it runs on a simulated AICPU thread, 2 on a simulated core's.
unsafe extern "C-unwind" fn where_am_i(args: *mut i64) {
    // SAFETY: the runtime passes a valid argument vector with one f32 tensor.
    let k = unsafe { KernelCall::from_raw(args, 1) };
    // SAFETY: the task's only tensor, written by this task alone.
    let out = unsafe { k.slice_mut::<f32>(0) }.unwrap();
    let name = std::thread::current().name().unwrap_or_default().to_owned();
    out[0] = if name.contains("-aicpu") {
        1.0
    } else if name.contains("-aicore") {
        2.0
    } else {
        -1.0
    };
}

/// Panics when it runs on a simulated AICPU thread; writes 2 on a core's own thread.
unsafe extern "C-unwind" fn panics_on_aicpu(args: *mut i64) {
    if std::thread::current().name().unwrap_or_default().contains("-aicpu") {
        panic!("deliberate kernel panic");
    }
    // SAFETY: as in `where_am_i`.
    unsafe { where_am_i(args) };
}

/// One AIV task per argument tensor, running `scalar(0)` as its kernel.
fn one_task_per_tensor(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let bad = OrchError::from_status(-1);
    let func = args.scalar(0).ok_or(bad)? as u32;
    for i in 0..TASKS {
        let mut task = CoreArgs::new();
        task.add_inout(*args.tensor(i).ok_or(bad)?).map_err(|_| bad)?;
        ctx.submit(Kernels::Aiv(func), &task)?;
    }
    Ok(())
}

fn callable() -> ChipCallable {
    ChipCallable::native(one_task_per_tensor, |_| OrchConfig {
        expected_arg_count: TASKS as u32 + 1,
    })
    .kernel(WHERE, CoreCallable::native(vec![ArgDirection::InOut], where_am_i))
    .kernel(PANICS, CoreCallable::native(vec![ArgDirection::InOut], panics_on_aicpu))
    .build()
    .unwrap()
}

/// The Rust core executor: the C++ one always runs kernels on the core's thread.
fn rust_cores(mut o: RunnerOptions) -> RunnerOptions {
    o.sim.aicore_executor = None;
    o
}

/// Runs `func` once per output on `r`; returns the outputs or the run's error.
fn run(
    r: &mut DeviceRunner,
    run: u64,
    func: u32,
    cfg: &CallConfig,
) -> Result<Vec<f32>, DeviceError> {
    let slot = r.register_callable(&callable()).unwrap();
    let mut args = TaskArgs::new();
    let mut ptrs = Vec::new();
    for _ in 0..TASKS {
        let (p, t) = upload_f32(r, &[0.0]);
        args.add_inout(t).unwrap();
        ptrs.push(p);
    }
    args.add_scalar(u64::from(func)).unwrap();
    let result = r.run(&RunRequest::new(run_id(run), slot, &args, cfg));
    let out = result.map(|_| ptrs.iter().map(|&p| download_f32(r, p, 1)[0]).collect());
    for p in ptrs {
        r.free(p).unwrap();
    }
    out
}

/// A simulator planned for one host core: every kernel may run on the dispatching thread.
fn one_host_core(o: RunnerOptions) -> RunnerOptions {
    rust_cores(o).with_host_cores(1)
}

#[test]
fn kernels_run_on_the_dispatching_thread_only_when_core_dispatch_allows_it() {
    for runtime in RUNTIMES {
        for dispatch in [CoreDispatch::Auto, CoreDispatch::CoreThread] {
            let o = one_host_core(options_on(0, runtime)).with_core_dispatch(dispatch);
            let mut r = DeviceRunner::attach(o).unwrap();
            let mut outputs = Vec::new();
            for n in 1..=3 {
                outputs.extend(run(&mut r, n, WHERE, &CallConfig::default()).unwrap());
            }
            r.finalize().unwrap();
            assert!(outputs.iter().all(|&v| v == 1.0 || v == 2.0), "{runtime:?}: {outputs:?}");
            // Auto: a core's thread serves a token only when it is at the token already (the
            // first one of a launch, say); the rest run where they were dispatched.
            let on_aicpu = outputs.iter().filter(|&&v| v == 1.0).count();
            match dispatch {
                CoreDispatch::CoreThread => assert_eq!(on_aicpu, 0, "{runtime:?}: {outputs:?}"),
                _ => assert!(on_aicpu > 0, "{runtime:?} {dispatch:?}: {outputs:?}"),
            }
        }
    }
}

#[test]
fn a_kernel_panicking_on_the_dispatching_thread_is_an_aicore_fault_and_the_device_recovers() {
    for runtime in RUNTIMES {
        let mut faulted = false;
        for attempt in 1..=5 {
            let mut r = DeviceRunner::attach(one_host_core(fast_options_on(1, runtime))).unwrap();
            match run(&mut r, attempt, PANICS, &CallConfig::default()) {
                // Every kernel happened to run on its core's thread.
                Ok(out) => assert_eq!(out, [2.0; TASKS], "{runtime:?}"),
                Err(err) => {
                    let DeviceError::DeviceFault { faults, .. } = &err else {
                        panic!("{runtime:?}: {err}")
                    };
                    assert!(
                        faults.iter().any(|f| f.code == AclCode::AICORE_EXCEPTION
                            && f.func_id == Some(PANICS)
                            && f.core.is_some()
                            && f.message.contains("deliberate kernel panic")),
                        "{runtime:?}: {err}"
                    );
                    faulted = true;
                }
            }
            assert!(r.finalize().unwrap().stuck_threads.is_empty(), "{runtime:?}");
            if faulted {
                break;
            }
        }
        assert!(faulted, "{runtime:?}: no kernel ran on a dispatching thread in 5 runs");
        let mut r = DeviceRunner::attach(one_host_core(options_on(1, runtime))).unwrap();
        let out = run(&mut r, 9, WHERE, &CallConfig::default()).unwrap();
        assert!(out.iter().all(|&v| v == 1.0 || v == 2.0), "{runtime:?}: {out:?}");
        r.finalize().unwrap();
    }
}

#[test]
fn scheduling_threads_without_a_cluster_end_before_the_run_does() {
    const DELAY: Duration = Duration::from_millis(40);
    // Counter ticks (50 MHz) of half the delay.
    const MARGIN: u64 = 20 * 50_000;
    for runtime in RUNTIMES {
        let dir = temp_dir(&format!("coreless-{runtime:?}"));
        let mut r = DeviceRunner::attach(options_on(2, runtime)).unwrap();
        r.sim_faults().unwrap().kernel_delay(WHERE, DELAY);
        let cfg = CallConfig::builder()
            .block_dim(1)
            .swimlane(SwimlaneLevel::AicoreTiming)
            .output_prefix(&dir)
            .build()
            .unwrap();
        run(&mut r, 1, WHERE, &cfg).unwrap();
        r.finalize().unwrap();
        let records = json(&dir.join("l2_swimlane_records.json"));
        let phases = records["phases"].as_array().unwrap();
        let at = |t: usize, key: &str| phases[t][key].as_u64().unwrap();
        // trb's last thread orchestrates; every other thread schedules. Only thread 0 owns the
        // one cluster, and it schedules until the delayed kernels finished.
        let schedulers = match runtime {
            RuntimeVariant::TensormapAndRingbuffer => phases.len() - 1,
            _ => phases.len(),
        };
        assert!(schedulers >= 2, "{runtime:?}: {phases:?}");
        let busy_until = at(0, "scheduling_end");
        for t in 1..schedulers {
            assert!(
                at(t, "end") + MARGIN < busy_until,
                "{runtime:?}: thread {t} without a cluster stayed until {} (thread 0 scheduled until {busy_until})",
                at(t, "end")
            );
            assert_eq!(at(t, "tasks_completed"), 0);
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
