//! An L2 worker whose chip queues runs on the device (`RunnerOptions::with_device_queue`,
//! `docs/pipelining.md`, "The L2 chip lane at depth 2", step 6): the lane launches run N+1 behind
//! run N before it retires N; results stay per run and publish in FIFO order; a fault is
//! charged to its run and the run queued behind it is abandoned.

mod common;

use std::time::Duration;

use common::HANG;
use simpler_device_a2a3::programs::{f32_from_le_bytes, f32_to_le_bytes};
use simpler_types::{DataType, TaskArgs, WorkerId};
use simpler_worker::{CallableHandle, ChipMemory, DeviceBuffer, Orchestration, RunHandle, Worker};

fn buffers(mem: &ChipMemory<'_>, n: u32, x: f32) -> ([DeviceBuffer; 3], TaskArgs) {
    let bufs = [(); 3].map(|_| mem.malloc(u64::from(n) * 4).unwrap());
    mem.copy_to(&bufs[0], 0, &f32_to_le_bytes(&vec![x; n as usize])).unwrap();
    mem.copy_to(&bufs[1], 0, &f32_to_le_bytes(&vec![1.0; n as usize])).unwrap();
    let mut args = TaskArgs::new();
    for b in &bufs {
        args.add_inout(b.tensor(&[n], DataType::Float32).unwrap()).unwrap();
    }
    (bufs, args)
}

fn output(mem: &ChipMemory<'_>, f: &DeviceBuffer, n: u32) -> Vec<f32> {
    let mut out = vec![0u8; n as usize * 4];
    mem.copy_from(f, 0, &mut out).unwrap();
    f32_from_le_bytes(&out)
}

fn queued_l2() -> (Worker, CallableHandle) {
    common::l2_with(|o| o.with_pipeline_slots(2).with_device_queue(true))
}

#[test]
fn a_queueing_lane_runs_at_depth_two_and_each_run_keeps_its_own_result() {
    let (w, add) = queued_l2();
    assert_eq!(w.pipeline_depth(), 2);
    let mem = w.memory().unwrap();
    let n = 256;
    let runs: Vec<_> = (0..8).map(|i| buffers(&mem, n, i as f32)).collect();
    w.with_sim_faults(WorkerId(0), |p| p.kernel_delay(0, Duration::from_millis(40))).unwrap();
    let mut handles: Vec<RunHandle> = Vec::new();
    for (i, (_, a)) in runs.iter().enumerate() {
        handles.push(w.submit(Orchestration::chip(add, a.clone())).unwrap());
        if i > 0 {
            assert!(!handles[i - 1].is_done(), "run {i} was admitted only after run {}", i - 1);
        }
    }
    for (i, h) in handles.iter().enumerate() {
        h.wait_timeout(HANG).expect("no hang").expect("run");
        // FIFO: every earlier run was published before this one.
        assert!(handles[..i].iter().all(RunHandle::is_done), "run {i} published out of order");
    }
    for (i, (bufs, _)) in runs.iter().enumerate() {
        assert!(output(&mem, &bufs[2], n).iter().all(|&v| v == i as f32 + 1.0), "run {i}");
    }
    w.close().expect("close");
}

#[test]
fn a_fault_on_a_queueing_lane_is_charged_to_its_run_and_the_queued_run_is_abandoned() {
    let (w, add) = queued_l2();
    let mem = w.memory().unwrap();
    let (_b1, a1) = buffers(&mem, 64, 1.0);
    let (_b2, a2) = buffers(&mem, 64, 2.0);
    // Run 2 is prepared and queued behind run 1 while run 1 is still on the device.
    common::hold_then_poison(&w);
    let h1 = w.submit(Orchestration::chip(add, a1)).expect("first submit");
    let h2 = w.submit(Orchestration::chip(add, a2)).expect("second submit");
    assert!(!h1.is_done(), "run 2 was prepared while run 1 executes");
    let e1 = h1.wait_timeout(HANG).expect("no hang").expect_err("run 1 faults");
    let text1 = format!("{e1} {e1:?}");
    assert!(!text1.contains("Abandoned"), "run 1 carries its own fault: {text1}");
    let e2 = h2.wait_timeout(HANG).expect("no hang").expect_err("run 2 never succeeds");
    let text2 = format!("{e2} {e2:?}");
    assert!(
        text2.contains("Abandoned { run_id: run#2, after: run#1"),
        "run 2 is abandoned behind run 1, not charged its fault: {text2}"
    );
    let _ = w.close();
}
