//! Typed errors end to end: a kernel fault on a simulated chip reaches the caller as the
//! device's own error, which it can `match` on, at L2, L3 and L4.

use std::time::Duration;

use simpler::device_a2a3::abi::codes::AclCode;
use simpler::device_a2a3::programs::add;
use simpler::device_a2a3::{DeviceError, Platform, RunnerOptions, RuntimeVariant};
use simpler::types::{CallConfig, DataType, TaskArgs, WorkerId};
use simpler::worker::{CallableHandle, ChipMemory, Orchestration, RunError, Worker};

/// Short device budgets so that the injected fault is detected quickly.
fn quick(o: RunnerOptions) -> RunnerOptions {
    o.with_scheduler_timeout(Duration::from_millis(300))
        .with_op_execute_timeout(Duration::from_millis(500))
        .with_stream_sync_timeout(Duration::from_secs(2))
        .with_shutdown_budget(Duration::from_millis(300))
}

/// The program's three tensors over fresh buffers of `mem`.
fn add_args(mem: &ChipMemory<'_>) -> Result<TaskArgs, Box<dyn std::error::Error + Send + Sync>> {
    let mut args = TaskArgs::new();
    for _ in 0..3 {
        args.add_inout(mem.malloc(256)?.tensor(&[64], DataType::Float32)?)?;
    }
    Ok(args)
}

/// A started L3 worker with one simulated chip, the add program registered on it, its
/// arguments in chip memory, and a kernel fault armed for the program's `nth` execution.
fn l3_add_with_fault(nth: u32) -> (Worker, CallableHandle, TaskArgs) {
    let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph)
        .chips(&[0])
        .chip_options(quick);
    let h = b.register_chip(add::callable().expect("program"));
    let w = b.start().expect("start");
    let args = add_args(&w.chip_memory(WorkerId(0)).expect("memory")).expect("args");
    assert!(w.with_sim_faults(WorkerId(0), move |plan| plan.kernel_fault(0, nth)).expect("lane"));
    (w, h, args)
}

/// The kernel fault the simulator injects: an AICore exception on the chip's AICore stream.
fn assert_kernel_fault(e: &RunError) {
    match e.device_error() {
        Some(DeviceError::DeviceFault { code, run_id, .. }) => {
            assert_eq!(*code, AclCode::AICORE_EXCEPTION, "{e}");
            assert!(run_id.get() > 0);
        }
        other => panic!("expected a device fault, got {other:?} in {e}"),
    }
    assert_eq!(e.device_code().map(|c| c.code), Some(AclCode::AICORE_EXCEPTION.0), "{e}");
}

#[test]
fn an_l2_kernel_fault_is_the_device_error() {
    let mut b =
        Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph).chip_options(quick);
    let h = b.register_chip(add::callable().expect("program"));
    let w = b.start().expect("start");
    let args = add_args(&w.memory().expect("memory")).expect("args");
    assert!(w.with_sim_faults(WorkerId(0), |plan| plan.kernel_fault(0, 1)).expect("lane"));
    let e = w.submit(Orchestration::chip(h, args)).expect("submit").wait().expect_err("fault");
    assert_kernel_fault(&e);
    assert_eq!(e.frames()[0].level, 2);
    assert!(e.frames()[0].device_error().is_some());
}

#[test]
fn an_l3_kernel_fault_is_the_device_error_of_its_chip_frame() {
    let (w, h, args) = l3_add_with_fault(1);
    let run = Orchestration::graph(move |g, _, _| {
        g.submit_next_level(h, args.clone(), &CallConfig::default(), WorkerId(0))?;
        Ok(())
    });
    let e = w.submit(run).expect("submit").wait().expect_err("fault");
    assert_kernel_fault(&e);
    assert_eq!(e.frames()[0].level, 3);
    assert!(e.frames()[0].device_error().is_some());
}

#[test]
fn an_l4_kernel_fault_is_the_device_error_of_the_innermost_frame() {
    let mut l3 = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph)
        .chips(&[0])
        .chip_options(quick);
    let h = l3.register_chip(add::callable().expect("program"));
    let mut l4 = Worker::composite(4);
    l4.child(l3).expect("child");
    // Runs on the child: arms the fault on its chip, then runs the program there.
    let faulty = l4.register_graph("faulty_add", move |g, _, cfg| {
        g.with_sim_faults(WorkerId(0), |plan| plan.kernel_fault(0, 1))?;
        let args = add_args(&g.chip_memory(WorkerId(0))?)?;
        g.submit_next_level(h, args, cfg, WorkerId(0))?;
        Ok(())
    });
    let w = l4.start().expect("start");
    let run = Orchestration::graph(move |g, _, _| {
        g.submit_next_level(faulty, TaskArgs::new(), &CallConfig::default(), WorkerId(0))?;
        Ok(())
    });
    let e = w.submit(run).expect("submit").wait().expect_err("fault");
    assert_kernel_fault(&e);
    let levels: Vec<u8> = e.frames().iter().map(|f| f.level).collect();
    assert_eq!(levels, vec![4, 3], "{e}");
    assert!(e.frames()[0].device_error().is_none(), "the L4 frame is the child's task");
    assert!(e.frames()[1].device_error().is_some());
}

#[test]
fn every_chip_run_of_an_l3_run_has_its_own_device_run_id() {
    // The second chip task of the run faults; its device run is the chip's second.
    let (w, h, args) = l3_add_with_fault(2);
    let run = Orchestration::graph(move |g, _, _| {
        for _ in 0..2 {
            g.submit_next_level(h, args.clone(), &CallConfig::default(), WorkerId(0))?;
        }
        Ok(())
    });
    let e = w.submit(run).expect("submit").wait().expect_err("fault");
    assert_kernel_fault(&e);
    let device_run = e.device_error().and_then(DeviceError::run_id).expect("device run id");
    assert_eq!(device_run.get(), 2, "{e}");
    assert_eq!(e.run_id().get(), 1, "one engine run");
}
