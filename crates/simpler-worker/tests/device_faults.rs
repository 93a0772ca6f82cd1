//! Device faults through the worker: a faulting kernel fails its run with the device's code in
//! the error chain; an unusable chip fails later work on it fast while other chips carry on; the
//! device's own error stays typed in the source chain of every call that met it.

mod common;

use std::error::Error;
use std::time::Duration;

use common::{add_callable, host, register_hold};
use simpler_device_a2a3::DeviceError;
use simpler_types::{CallConfig, DataType, TaskArgs, WorkerId};
use simpler_worker::{CallableHandle, MemError, Orchestration, RunErrorKind, Worker, WorkerError};

fn chip_args(w: &Worker, chip: WorkerId) -> TaskArgs {
    let mem = w.chip_memory(chip).expect("chip");
    let mut args = TaskArgs::new();
    for _ in 0..3 {
        args.add_inout(mem.malloc(256).unwrap().tensor(&[64], DataType::Float32).unwrap()).unwrap();
    }
    args
}

fn on_chip(h: CallableHandle, args: TaskArgs, chip: WorkerId) -> Orchestration {
    Orchestration::graph(move |g, _, _| {
        g.submit_next_level(h, args.clone(), &CallConfig::default(), chip)?;
        Ok(())
    })
}

#[test]
fn a_kernel_fault_fails_the_run_with_the_device_code_and_other_chips_carry_on() {
    // Short device budgets so that the injected fault is detected quickly.
    let mut b = host().chips(&[0, 1]).chip_options(|o| {
        o.with_scheduler_timeout(Duration::from_millis(300))
            .with_op_execute_timeout(Duration::from_micros(500_000))
            .with_stream_sync_timeout(Duration::from_millis(2_000))
            .with_shutdown_budget(Duration::from_millis(300))
    });
    let add = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let (a0, a1) = (chip_args(&w, WorkerId(0)), chip_args(&w, WorkerId(1)));
    assert!(w.with_sim_faults(WorkerId(0), |plan| plan.kernel_fault(0, 1)).expect("lane"));
    let e =
        w.submit(on_chip(add, a0.clone(), WorkerId(0))).expect("submit").wait().expect_err("fault");
    assert!(
        matches!(e.kind(), RunErrorKind::DeviceFault { .. } | RunErrorKind::EndpointFailed),
        "{e}"
    );
    assert!(e.device_code().is_some(), "{e}");
    assert_eq!(e.frames()[0].level, 3);
    assert!(e.to_string().contains("on chip 0"), "{e}");
    // The other chip is unaffected.
    w.run(on_chip(add, a1, WorkerId(1))).expect("chip 1 still works");
    // The fault made chip 0 unusable: memory calls say so, and later runs fail fast.
    match w.chip_memory(WorkerId(0)).expect("chip 0").malloc(64) {
        Err(WorkerError::DeviceUnusable { chip, code, .. }) => {
            assert_eq!(chip, WorkerId(0));
            assert!(code.is_some());
        }
        other => panic!("expected DeviceUnusable, got {other:?}"),
    }
    let e = w.submit(on_chip(add, a0, WorkerId(0))).expect("submit").wait().expect_err("fast");
    assert!(e.to_string().contains("unusable"), "{e}");
    assert!(matches!(
        w.register_chip(&add_callable(9)),
        Err(WorkerError::DeviceUnusable { chip: WorkerId(0), .. })
    ));
}

/// The first [`DeviceError`] in `e`'s source chain, `e` included.
fn device_in_chain<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a DeviceError> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(d) = e.downcast_ref::<DeviceError>() {
            return Some(d);
        }
        next = e.source();
    }
    None
}

/// An L2 worker (its chip always in this process) with short device budgets.
fn l2() -> (Worker, CallableHandle) {
    common::l2_with(|o| o.with_memory_limit(1 << 30))
}

#[test]
fn a_malloc_beyond_the_memory_limit_keeps_the_devices_error_typed() {
    let (w, _) = l2();
    let e = w.memory().unwrap().malloc(2 << 30).expect_err("beyond the simulator's limit");
    let next = Error::source(&e).and_then(|s| s.downcast_ref::<DeviceError>());
    assert!(matches!(next, Some(DeviceError::OutOfMemory { .. })), "{e:?}");
    match &e {
        WorkerError::Memory(MemError::Device { chip: WorkerId(0), device: Some(d), .. }) => {
            assert!(matches!(**d, DeviceError::OutOfMemory { .. }), "{d}")
        }
        other => panic!("expected a device memory error, got {other:?}"),
    }
    w.close().expect("close");
}

#[test]
fn an_unusable_chip_keeps_the_devices_error_typed_for_memory_registration_and_submit() {
    let (w, add) = l2();
    let mem = w.memory().unwrap();
    let mut args = TaskArgs::new();
    for _ in 0..3 {
        args.add_inout(mem.malloc(256).unwrap().tensor(&[64], DataType::Float32).unwrap()).unwrap();
    }
    assert!(w.with_sim_faults(WorkerId(0), |plan| plan.kernel_fault(0, 1)).expect("lane"));
    // A run that failed on the device: the device's error is in its chain too.
    let e = w.run(Orchestration::chip(add, args.clone())).expect_err("the kernel faults");
    assert!(matches!(e, WorkerError::Run(_)), "{e:?}");
    assert!(device_in_chain(&e).is_some(), "{e:?}");
    let unusable = |e: &WorkerError| {
        let next = Error::source(e).and_then(|s| s.downcast_ref::<DeviceError>());
        assert!(matches!(next, Some(DeviceError::Unusable { .. })), "{e:?}");
        assert!(
            matches!(
                e,
                WorkerError::DeviceUnusable { chip: WorkerId(0), device: Some(d), .. }
                    if matches!(**d, DeviceError::Unusable { .. })
            ),
            "{e:?}"
        );
    };
    unusable(&mem.malloc(64).expect_err("memory"));
    unusable(&w.register_chip(&add_callable(1)).expect_err("registration"));
    // A run refused at its preparation: the device's error is in the build failure's chain.
    let e = w.submit(Orchestration::chip(add, args)).expect_err("refused at prepare");
    assert!(matches!(e, WorkerError::Build { .. }), "{e:?}");
    assert!(matches!(device_in_chain(&e), Some(DeviceError::Unusable { .. })), "{e:?}");
    let _ = w.close();
}

#[test]
fn a_panic_while_attaching_a_chip_is_a_device_error_naming_the_chip() {
    let e = host()
        .chips(&[0, 1])
        .chip_options(|o| if o.device_id == 1 { panic!("options refused") } else { o })
        .start()
        .expect_err("chip 1 panics");
    match &e.cause {
        simpler_worker::StartCause::Device { chip, message, .. } => {
            assert_eq!(*chip, WorkerId(1), "{e}");
            assert!(message.contains("options refused"), "{e}");
        }
        other => panic!("unexpected cause {other:?}"),
    }
    assert!(e.path.contains("chip 1 (device 1)"), "{}", e.path);
}

#[test]
fn a_run_error_names_a_chip_callable_unregistered_while_the_run_was_live() {
    // The error's frames are named when the run is waited for, after the unregistration.
    let mut b = host().chips(&[0]).sub_workers(1).chip_options(|o| {
        o.with_scheduler_timeout(Duration::from_millis(300))
            .with_op_execute_timeout(Duration::from_micros(500_000))
            .with_stream_sync_timeout(Duration::from_millis(2_000))
            .with_shutdown_budget(Duration::from_millis(300))
    });
    let (hold, gate) = register_hold(&mut b);
    let w = b.start().expect("start");
    let c = add_callable(6);
    let add = w.register_chip(&c).expect("register");
    let args = chip_args(&w, WorkerId(0));
    assert!(w.with_sim_faults(WorkerId(0), |plan| plan.kernel_fault(0, 1)).expect("lane"));
    let live = w
        .submit(Orchestration::graph(move |g, _, _| {
            g.submit_sub(hold, TaskArgs::new())?;
            g.submit_next_level(add, args.clone(), &CallConfig::default(), WorkerId(0))?;
            Ok(())
        }))
        .expect("submit");
    w.unregister(add).expect("unregister while the run is live");
    gate.wait();
    let e = live.wait().expect_err("the kernel faulted");
    let named = e.frames().iter().any(|f| f.callable.as_deref() == Some(c.entry_name()));
    assert!(named, "{e}");
}
