//! Fault injection (`docs/device-simulator.md`): each case asserts the typed error,
//! that the terminal cleanup ran exactly once, that nothing leaked, that no simulated thread is
//! left running, and that a fresh runner on the same device id works afterwards.

mod common;

use std::time::Duration;

use common::*;
use simpler_device_a2a3::abi::codes::{AclCode, RuntimeCode, StallClass};
use simpler_device_a2a3::{
    ArgDirection, ChipCallable, CoreCallable, DeviceError, DeviceHealth, DeviceRunner, ErrorClass,
    FiredFault, KernelKind, OrchFailure, PoisonStep, RunRequest, StreamKind,
};
use simpler_types::{CallConfig, FailureMechanism, TimeoutBudget};

/// Runs one vector example expecting failure; returns the error after checking the shared
/// post-conditions.
fn failing_run(r: &mut DeviceRunner, run: u64) -> DeviceError {
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(r, 1024);
    let before = r.stats();
    let cfg = CallConfig::default();
    let err = r.run(&RunRequest::new(run_id(run), slot, &v.args, &cfg)).unwrap_err();
    let after = r.stats();
    assert_eq!(
        after.terminal_cleanups,
        before.terminal_cleanups + 1,
        "terminal cleanup ran exactly once"
    );
    assert_eq!(after.exports, before.exports + 1, "export ran exactly once");
    assert_eq!(err.run_id(), Some(run_id(run)));
    v.free(r);
    assert_eq!(r.stats().live_allocations, 0, "no allocation left behind");
    wait_all_parked(r);
    err
}

fn fresh_runner_works() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 1024);
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default())).unwrap();
    v.check(&mut r);
    v.free(&mut r);
    r.finalize().unwrap();
}

fn assert_unusable(r: &mut DeviceRunner, step: PoisonStep) {
    match r.health() {
        DeviceHealth::Unusable { cause } => assert_eq!(cause.step, step),
        h => panic!("expected unusable, got {h}"),
    }
    assert!(!r.health_probe().is_healthy());
    assert!(matches!(r.malloc(64), Err(DeviceError::Unusable { .. })));
}

#[test]
fn failed_aicore_launch_is_typed_poisons_and_launches_no_aicpu() {
    let mut r = DeviceRunner::attach(fast_options(0)).unwrap();
    r.sim_faults().unwrap().fail_launch(KernelKind::AiCore, 1);
    let before = r.stats();
    let err = failing_run(&mut r, 7);
    assert!(
        matches!(
            err,
            DeviceError::Launch { kernel: KernelKind::AiCore, code: AclCode::LAUNCH_FAILED, .. }
        ),
        "{err}"
    );
    assert!(err.to_string().ends_with("the fault plan refused the AICore launch"), "{err}");
    let s = r.stats();
    assert_eq!(
        s.aicpu_launches, before.aicpu_launches,
        "no AICPU launch after a failed AICore launch"
    );
    assert_eq!(s.recoveries, before.recoveries + 1, "drained once");
    assert_unusable(&mut r, PoisonStep::LaunchAiCore);
    let report = r.finalize().unwrap();
    assert!(report.stuck_threads.is_empty());
    fresh_runner_works();
}

#[test]
fn failed_aicpu_launch_poisons_and_finalize_releases_the_aicore_cores() {
    let mut r = DeviceRunner::attach(fast_options(0)).unwrap();
    r.sim_faults().unwrap().fail_launch(KernelKind::Aicpu, 1);
    let before = r.stats();
    let err = failing_run(&mut r, 8);
    assert!(matches!(err, DeviceError::Launch { kernel: KernelKind::Aicpu, .. }), "{err}");
    let s = r.stats();
    assert_eq!(s.aicore_launches, before.aicore_launches + 1);
    assert_eq!(s.aicpu_launches, before.aicpu_launches);
    assert_eq!(s.recoveries, before.recoveries + 1);
    assert_unusable(&mut r, PoisonStep::LaunchAicpu);
    let report = r.finalize().unwrap();
    assert!(report.stuck_threads.is_empty(), "{:?}", report.stuck_threads);
    fresh_runner_works();
}

#[test]
fn kernel_fault_is_a_device_fault_naming_func_id_and_core_with_s1_attached() {
    let mut r = DeviceRunner::attach(fast_options(0)).unwrap();
    r.sim_faults().unwrap().kernel_fault(FUNC_MUL, 1);
    let err = failing_run(&mut r, 9);
    let DeviceError::DeviceFault { code, stream, faults, runtime, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(*code, AclCode::AICORE_EXCEPTION, "{err}");
    assert_eq!(*stream, StreamKind::AiCore);
    let core_fault =
        faults.iter().find(|f| f.func_id == Some(FUNC_MUL)).expect("the fault names the func id");
    assert!(core_fault.core.is_some(), "the fault names the core");
    let rt = runtime.as_ref().expect("latched runtime status attached");
    assert_eq!(rt.code, RuntimeCode::SchedulerTimeout);
    let stall = rt.stall.as_ref().unwrap();
    assert_eq!(stall.class, StallClass::RunningStalled);
    assert_eq!(stall.stuck_core.map(|c| c.0), core_fault.core.map(|c| c.0));
    assert!(stall.running >= 1, "the faulted dispatch still counts as running: {stall:?}");
    // A kernel that faulted did not hang: the watchdog's stall is a consequence, not the cause.
    assert!(!err.is_timeout(), "{err}");
    assert_eq!(err.class(), ErrorClass::DeviceFault);
    assert_eq!(err.mechanism(), FailureMechanism::DeviceFault);
    assert!(
        r.sim_faults()
            .unwrap()
            .fired()
            .iter()
            .any(|f| matches!(f, FiredFault::KernelFaulted { func_id: FUNC_MUL, .. }))
    );
    assert_unusable(&mut r, PoisonStep::SyncAicpu);
    assert!(r.finalize().unwrap().stuck_threads.is_empty());
    fresh_runner_works();
}

#[test]
fn kernel_hang_reports_scheduler_timeout_and_the_drain_ends_it_by_op_timeout() {
    let mut r = DeviceRunner::attach(fast_options(0)).unwrap();
    r.sim_faults().unwrap().kernel_hang(FUNC_ADD_SCALAR, 1);
    let err = failing_run(&mut r, 10);
    let DeviceError::DeviceFault { code, faults, runtime, .. } = &err else { panic!("{err}") };
    assert_eq!(*code, AclCode::AICPU_EXCEPTION, "unclean shutdown: {err}");
    let rt = runtime.as_ref().expect("latched runtime status attached");
    let stall = rt.stall.as_ref().expect("stall details");
    assert_eq!(stall.class, StallClass::RunningStalled);
    assert!(stall.stuck_task.is_some() && stall.stuck_core.is_some(), "{err}");
    assert!(
        faults
            .iter()
            .any(|f| f.code == AclCode::AICORE_TIMEOUT && f.func_id == Some(FUNC_ADD_SCALAR)),
        "the AICore entry ended by op timeout: {err}"
    );
    // Code asking "did it time out or hang?" finds the hang, with the budget that fired.
    assert_eq!(err.timed_out(), Some((TimeoutBudget::DeviceScheduler, stall.budget)), "{err}");
    assert_eq!(err.class(), ErrorClass::Hang);
    assert!(
        matches!(err.mechanism(), FailureMechanism::Timeout { budget: TimeoutBudget::DeviceScheduler, limit } if limit == stall.budget),
        "{:?}",
        err.mechanism()
    );
    assert_unusable(&mut r, PoisonStep::SyncAicpu);
    assert!(r.finalize().unwrap().stuck_threads.is_empty());
    fresh_runner_works();
}

#[test]
fn handshake_failure_is_an_aicpu_fault_naming_the_core() {
    let mut r = DeviceRunner::attach(fast_options(0)).unwrap();
    r.sim_faults().unwrap().handshake_fault(1, 80);
    let err = failing_run(&mut r, 11);
    let DeviceError::DeviceFault { code, stream, faults, .. } = &err else { panic!("{err}") };
    assert_eq!((*code, *stream), (AclCode::AICPU_EXCEPTION, StreamKind::Aicpu));
    assert!(
        faults
            .iter()
            .any(|f| f.message.contains("physical core id 80") && f.core.map(|c| c.0) == Some(1)),
        "{err}"
    );
    assert_unusable(&mut r, PoisonStep::SyncAicpu);
    r.finalize().unwrap();
    fresh_runner_works();
}

#[test]
fn aicpu_fault_surfaces_as_an_aicpu_exception() {
    let mut r = DeviceRunner::attach(fast_options(0)).unwrap();
    r.sim_faults().unwrap().aicpu_fault(1);
    let err = failing_run(&mut r, 12);
    assert!(
        matches!(err, DeviceError::DeviceFault { code: AclCode::AICPU_EXCEPTION, .. }),
        "{err}"
    );
    r.finalize().unwrap();
}

#[test]
fn a_panicking_aicpu_thread_fails_its_run_with_its_text_and_releases_the_cores() {
    // Budgets far above the run's own time: without the release, the cores the panicked
    // thread never served would wait for the op-execute watchdog and fail as its timeout.
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    r.sim_faults().unwrap().aicpu_panic(1);
    let err = failing_run(&mut r, 13);
    let DeviceError::DeviceFault { code, faults, .. } = &err else { panic!("{err}") };
    assert_eq!(*code, AclCode::AICPU_EXCEPTION, "{err}");
    assert!(
        faults.iter().any(|f| f.code == AclCode::AICPU_EXCEPTION
            && f.message.contains("AICPU thread 0 panicked: injected AICPU panic")),
        "{faults:?}"
    );
    assert!(faults.iter().all(|f| f.code != AclCode::AICORE_TIMEOUT), "{faults:?}");
    assert_eq!(r.sim_faults().unwrap().fired(), [FiredFault::AicpuPanicked]);
    fresh_runner_works();
    r.finalize().unwrap();
}

unsafe extern "C-unwind" fn panics(_args: *mut i64) {
    panic!("deliberate kernel panic");
}

fn panicking_orch(
    ctx: &mut simpler_device_a2a3::OrchCtx<'_>,
    args: &simpler_device_a2a3::OrchArgs<'_>,
) -> Result<(), simpler_device_a2a3::OrchError> {
    let mut a = simpler_types::CoreArgs::new();
    a.add_inout(*args.tensor(0).unwrap()).unwrap();
    ctx.submit(simpler_device_a2a3::Kernels::Aic(5), &a)?;
    Ok(())
}

#[test]
fn a_panicking_native_kernel_is_an_aicore_fault_not_an_abort() {
    let mut r = DeviceRunner::attach(fast_options(0)).unwrap();
    let c = ChipCallable::native(panicking_orch, |_| Default::default())
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(5, unsafe { CoreCallable::native(vec![ArgDirection::InOut], panics) })
        .build()
        .unwrap();
    let slot = r.register_callable(&c).unwrap();
    let (p, t) = upload_f32(&mut r, &[1.0; 16]);
    let mut args = simpler_types::TaskArgs::new();
    args.add_inout(t).unwrap();
    let err = r.run(&RunRequest::new(run_id(3), slot, &args, &CallConfig::default())).unwrap_err();
    let DeviceError::DeviceFault { faults, .. } = &err else { panic!("{err}") };
    assert!(
        faults.iter().any(|f| f.code == AclCode::AICORE_EXCEPTION
            && f.func_id == Some(5)
            && f.message.contains("deliberate kernel panic")),
        "{err}"
    );
    r.free(p).unwrap();
    assert!(r.finalize().unwrap().stuck_threads.is_empty());
}

fn panicking_config(_: &simpler_device_a2a3::OrchArgs<'_>) -> simpler_device_a2a3::OrchConfig {
    panic!("deliberate config panic")
}

#[test]
fn a_panicking_config_function_is_an_orchestration_error_with_cleanup() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    // SAFETY: `add_kernel` reads two input tensors and writes one output.
    let add = unsafe {
        CoreCallable::native(
            vec![ArgDirection::In, ArgDirection::In, ArgDirection::Out],
            add_kernel,
        )
    };
    let c = ChipCallable::native(vector::orchestration, panicking_config)
        .kernel(FUNC_ADD, add)
        .build()
        .unwrap();
    let slot = r.register_callable(&c).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let before = r.stats();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        r.run(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default()))
    }));
    let err = outcome.expect("the panic stays inside the runner").unwrap_err();
    assert!(
        matches!(&err, DeviceError::Orchestration {
                run_id: id,
                failure: OrchFailure::ConfigPanicked { message },
            } if *id == run_id(1) && message.contains("deliberate config panic")),
        "{err}"
    );
    assert_eq!(r.stats().terminal_cleanups, before.terminal_cleanups + 1);
    assert_eq!(r.health(), DeviceHealth::Healthy);
    v.free(&mut r);
    vector_once(&mut r, 2, &CallConfig::default());
    r.finalize().unwrap();
}

#[test]
fn finalize_releases_a_delayed_kernel_instead_of_detaching_its_core() {
    let mut opts = fast_options(0);
    opts.sim.join_budget = Duration::from_secs(5);
    let mut r = DeviceRunner::attach(opts).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let cfg = CallConfig::default();
    // Far longer than the join budget: only a delay the reset ends lets finalize join it.
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, Duration::from_secs(30));
    let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    let active = r.launch_run(p).unwrap();
    wait_fired(&r, |f| matches!(f, FiredFault::KernelDelayed { .. }));
    drop(active);
    let report = r.finalize().unwrap();
    assert!(report.stuck_threads.is_empty(), "detached: {:?}", report.stuck_threads);
}
