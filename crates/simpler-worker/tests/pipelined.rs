//! Depth-2 pipelining of an L2 worker's chip lane (`docs/pipelining.md`): run N+1 is prepared
//! while run N executes and launched after N's result is published; results stay per run; a
//! run submitted behind one that made the chip unusable fails as abandoned at every depth,
//! never with N's error; memory calls queue behind the run in flight exactly as at depth 1.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{HANG, add_callable};
use simpler_device_a2a3::programs::{f32_from_le_bytes, f32_to_le_bytes};
use simpler_types::{DataType, TaskArgs, WorkerId};
use simpler_worker::{ChipMemory, DeviceBuffer, Orchestration, RunHandle, Worker};

/// Three fresh buffers `(a, b, f)` of `n` f32 with `a = x`, `b = 1`.
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

fn l2(slots: usize) -> (Worker, simpler_worker::CallableHandle) {
    common::l2_with(move |o| o.with_pipeline_slots(slots))
}

#[test]
fn an_l2_worker_pipelines_at_depth_two_and_each_run_keeps_its_own_result() {
    let (w, add) = l2(2);
    assert_eq!(w.pipeline_depth(), 2);
    let mem = w.memory().unwrap();
    let n = 256;
    let runs: Vec<_> = (0..6).map(|i| buffers(&mem, n, i as f32)).collect();
    // Slow kernels keep each run on the chip while the next one is submitted and prepared.
    w.with_sim_faults(WorkerId(0), |p| p.kernel_delay(0, Duration::from_millis(100))).unwrap();
    let mut handles: Vec<RunHandle> = Vec::new();
    for (i, (_, a)) in runs.iter().enumerate() {
        handles.push(w.submit(Orchestration::chip(add, a.clone())).unwrap());
        if i > 0 {
            // Admitted and prepared while the previous run is still on the chip (at depth 1
            // the submit would have waited for its result).
            assert!(!handles[i - 1].is_done(), "run {i} was admitted only after run {}", i - 1);
        }
    }
    for h in &handles {
        h.wait_timeout(HANG).expect("no hang").expect("run");
    }
    for (i, (bufs, _)) in runs.iter().enumerate() {
        assert!(output(&mem, &bufs[2], n).iter().all(|&v| v == i as f32 + 1.0), "run {i}");
    }
    w.close().expect("close");
}

/// At depth 2 (with and without device queueing) a submit returns while the run before it is
/// still on the chip, but only once the run before that one is published: at most two accepted
/// runs are unpublished, however early the lane is handed the next run's job.
#[test]
fn a_third_submit_is_admitted_only_once_the_head_is_published() {
    for queue in [false, true] {
        let (w, add) = common::l2_with(move |o| o.with_pipeline_slots(2).with_device_queue(queue));
        let mem = w.memory().unwrap();
        let runs: Vec<_> = (0..5).map(|i| buffers(&mem, 64, i as f32)).collect();
        w.with_sim_faults(WorkerId(0), |p| p.kernel_delay(0, Duration::from_millis(30))).unwrap();
        // Each run keeps a token alive until its result is published (by a waiter, such as a
        // later submit's admission wait), which nothing else here does: the lane's order
        // alone only sets the run's fence.
        let tokens: Vec<Arc<()>> = runs.iter().map(|_| Arc::new(())).collect();
        let mut handles: Vec<RunHandle> = Vec::new();
        for (i, (_, a)) in runs.iter().enumerate() {
            let orch = Orchestration::chip(add, a.clone()).keep_alive(Arc::clone(&tokens[i]));
            handles.push(w.submit(orch).unwrap());
            if i >= 2 {
                assert_eq!(
                    Arc::strong_count(&tokens[i - 2]),
                    1,
                    "queue {queue}: run {i} admitted before run {} was published",
                    i - 2
                );
            }
        }
        for h in &handles {
            h.wait_timeout(HANG).expect("no hang").expect("run");
        }
        for (i, (bufs, _)) in runs.iter().enumerate() {
            assert!(output(&mem, &bufs[2], 64).iter().all(|&v| v == i as f32 + 1.0), "run {i}");
        }
        w.close().expect("close");
    }
}

#[test]
fn one_resource_slot_means_depth_one() {
    let (w, add) = l2(1);
    assert_eq!(w.pipeline_depth(), 1);
    let mem = w.memory().unwrap();
    let (bufs, args) = buffers(&mem, 64, 2.0);
    for _ in 0..3 {
        w.run(Orchestration::chip(add, args.clone())).expect("run");
    }
    assert!(output(&mem, &bufs[2], 64).iter().all(|&v| v == 3.0));
    w.close().expect("close");
}

#[test]
fn a_run_behind_a_run_that_made_the_chip_unusable_is_abandoned_not_charged_its_error() {
    // At depth 1 the lane retires run 1 before it prepares run 2; at depth 2 it prepares run 2
    // first; with device queueing it also launches it. Run 2 was submitted while run 1 had not
    // finished in each case, so it is abandoned behind run 1 in each, and a submit after run 1
    // was published is refused as unusable.
    for (slots, queue) in [(1, false), (2, false), (2, true)] {
        let (w, add) =
            common::l2_with(move |o| o.with_pipeline_slots(slots).with_device_queue(queue));
        let mem = w.memory().unwrap();
        let (_b1, a1) = buffers(&mem, 64, 1.0);
        let (_b2, a2) = buffers(&mem, 64, 2.0);
        let (_b3, a3) = buffers(&mem, 64, 3.0);
        // Run 2 is submitted while run 1 is still on the device.
        common::hold_then_poison(&w);
        let h1 = w.submit(Orchestration::chip(add, a1)).expect("first submit");
        let h2 = w.submit(Orchestration::chip(add, a2)).unwrap_or_else(|e| {
            panic!("{slots} slots, queue {queue}: run 2 was refused, not abandoned: {e}")
        });
        // At depth 1 the second submit itself waits for run 1 (after noting it unfinished).
        if slots > 1 {
            assert!(!h1.is_done(), "the machine was too slow: run 1 ended before run 2's submit");
        }
        let e1 = h1.wait_timeout(HANG).expect("no hang").expect_err("run 1 faults");
        let text1 = format!("{e1} {e1:?}");
        assert!(!text1.contains("Abandoned"), "run 1 carries its own fault: {text1}");
        let e2 = h2.wait_timeout(HANG).expect("no hang").expect_err("run 2 never runs");
        let text2 = format!("{e2} {e2:?}");
        assert!(
            text2.contains("Abandoned { run_id: run#2, after: run#1"),
            "{slots} slots, queue {queue}: run 2 is abandoned behind run 1: {text2}"
        );
        let e3 = w.submit(Orchestration::chip(add, a3)).expect_err("the chip is unusable");
        assert!(e3.to_string().contains("unusable"), "{e3}");
        let _ = w.close();
    }
}

/// `a[..] = 7` through `set_tensor_data` (a write into user memory, which waits for the runs
/// the device is executing), then `f = a + b` as the add program does.
fn stamp_then_add(
    ctx: &mut simpler_device_a2a3::OrchCtx<'_>,
    args: &simpler_device_a2a3::OrchArgs<'_>,
) -> Result<(), simpler_device_a2a3::OrchError> {
    let a = *args.tensor(0).expect("three arguments");
    ctx.set_tensor_data(&a, &f32_to_le_bytes(&vec![7.0; a.numel() as usize]))?;
    simpler_device_a2a3::programs::add::orchestration(ctx, args)
}

#[test]
fn a_run_whose_orchestration_write_waited_for_a_run_that_faulted_is_abandoned_behind_it() {
    use simpler_device_a2a3::programs::add;
    // Run 2's orchestration writes run 1's input while run 1 is on the device (depth 2: the
    // lane prepares run 2 then), so the write waits for run 1, which faults. Run 2 never ran:
    // it is accepted and abandoned behind run 1, as when the chip was found unusable, not
    // refused at `submit` with a preparation error. (At depth 1 the lane retires run 1 first
    // and finds the chip unusable, which the test above covers.)
    for (slots, queue) in [(2, false), (2, true)] {
        let mut b = simpler_worker::Worker::chip(
            simpler_device_a2a3::Platform::A2a3Sim,
            0,
            simpler_device_a2a3::RuntimeVariant::HostBuildGraph,
        )
        .chip_options(move |o| {
            common::short_budgets(o).with_pipeline_slots(slots).with_device_queue(queue)
        });
        let plain = b.register_chip(add_callable(0));
        let stamping = add::builder_with(simpler_device_a2a3::Orchestration::Native {
            entry: stamp_then_add,
            config: |_| simpler_device_a2a3::OrchConfig { expected_arg_count: 3 },
        })
        .names("stamp_then_add", "stamp_then_add_config")
        .build()
        .expect("valid callable");
        let stamping = b.register_chip(stamping);
        let w = b.start().expect("start");
        let mem = w.memory().unwrap();
        let (_b1, a1) = buffers(&mem, 64, 1.0);
        // Run 1 holds the device for some 600 ms, and the lane looks for the next job between
        // reap slices of at most 5 ms: run 2 is prepared while run 1 executes (its submit
        // returns only after that preparation, so after run 1 ended).
        common::hold_then_poison(&w);
        let h1 = w.submit(Orchestration::chip(plain, a1.clone())).expect("first submit");
        let h2 = w.submit(Orchestration::chip(stamping, a1)).unwrap_or_else(|e| {
            panic!("{slots} slots, queue {queue}: run 2 was refused, not abandoned: {e}")
        });
        let e1 = h1.wait_timeout(HANG).expect("no hang").expect_err("run 1 faults");
        assert!(!format!("{e1:?}").contains("Abandoned"), "run 1 carries its own fault: {e1:?}");
        let e2 = h2.wait_timeout(HANG).expect("no hang").expect_err("run 2 never runs");
        let text2 = format!("{e2} {e2:?}");
        assert!(
            text2.contains("Abandoned { run_id: run#2, after: run#1"),
            "{slots} slots, queue {queue}: run 2 is abandoned behind run 1: {text2}"
        );
        let _ = w.close();
    }
}

#[test]
fn a_memory_call_waits_for_the_run_in_flight_as_at_depth_one() {
    let (w, add) = l2(2);
    let mem = w.memory().unwrap();
    let (bufs, args) = buffers(&mem, 64, 4.0);
    w.with_sim_faults(WorkerId(0), |p| p.kernel_delay(0, Duration::from_millis(50))).unwrap();
    let h = w.submit(Orchestration::chip(add, args)).unwrap();
    // Queued behind the run in flight: the lane retires it first, then copies.
    assert!(output(&mem, &bufs[2], 64).iter().all(|&v| v == 5.0));
    assert!(h.is_done());
    h.wait().expect("run");
    w.close().expect("close");
}

#[test]
fn submitters_and_memory_calls_on_several_threads_hammer_the_depth_two_lane() {
    // Three threads submit runs over their own buffers back to back while a fourth reads and
    // writes memory through the lane; every run must see its own inputs and every result must
    // arrive (no run lost, none published twice, no hang).
    let rounds: usize =
        std::env::var("SIMPLER_SOAK_CYCLES").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let (w, add) = l2(2);
    let mem = w.memory().unwrap();
    let n = 64;
    let per_thread: Vec<_> = (0..3).map(|t| buffers(&mem, n, t as f32 * 10.0)).collect();
    let (scratch, _) = buffers(&mem, n, 0.0);
    std::thread::scope(|s| {
        for (t, (bufs, args)) in per_thread.iter().enumerate() {
            let w = &w;
            s.spawn(move || {
                let mem = w.memory().unwrap();
                for round in 0..rounds {
                    // A fresh input per round: a run reading another round's input would show.
                    let x = t as f32 * 10.0 + round as f32;
                    mem.copy_to(&bufs[0], 0, &f32_to_le_bytes(&vec![x; n as usize])).unwrap();
                    let first = w.submit(Orchestration::chip(add, args.clone())).unwrap();
                    let second = w.submit(Orchestration::chip(add, args.clone())).unwrap();
                    first.wait_timeout(HANG).expect("no hang").expect("run");
                    second.wait_timeout(HANG).expect("no hang").expect("run");
                    let out = output(&mem, &bufs[2], n);
                    assert!(out.iter().all(|&v| v == x + 1.0), "thread {t} round {round}: {out:?}");
                }
            });
        }
        let w = &w;
        let scratch = &scratch;
        s.spawn(move || {
            let mem = w.memory().unwrap();
            for i in 0..rounds * 4 {
                let v = vec![i as f32; n as usize];
                mem.copy_to(&scratch[0], 0, &f32_to_le_bytes(&v)).unwrap();
                assert_eq!(output(&mem, &scratch[0], n), v);
            }
        });
    });
    w.close().expect("close");
}

#[test]
fn a_callable_unregistered_during_a_pipelined_loop_is_removed_without_the_loop_going_idle() {
    let (w, keep) = l2(2);
    assert_eq!(w.pipeline_depth(), 2);
    let other = add_callable(1);
    let dropped = w.register_chip(&other).expect("register");
    let mem = w.memory().unwrap();
    let (_bufs, args) = buffers(&mem, 64, 1.0);
    // A run is always live from here on: at depth 2 each submit waits only for the older run.
    let mut prev = w.submit(Orchestration::chip(keep, args.clone())).expect("submit");
    w.unregister(dropped).expect("unregister while a run is live");
    for _ in 0..20 {
        let next = w.submit(Orchestration::chip(keep, args.clone())).expect("submit");
        prev.wait_timeout(HANG).expect("no hang").expect("run");
        prev = next;
    }
    assert_eq!(w.chip_callable_refs(WorkerId(0), other.id()).unwrap(), 0, "still on the chip");
    w.register_chip(&other).expect("the same content registers again");
    prev.wait_timeout(HANG).expect("no hang").expect("run");
    w.close().expect("close");
}

#[test]
fn a_callable_unregistered_while_its_run_executes_is_removed_only_after_that_run() {
    let (w, add) = l2(2);
    let mem = w.memory().unwrap();
    let (bufs, args) = buffers(&mem, 64, 6.0);
    w.with_sim_faults(WorkerId(0), |p| p.kernel_delay(0, Duration::from_millis(50))).unwrap();
    let h = w.submit(Orchestration::chip(add, args.clone())).unwrap();
    w.unregister(add).expect("unregister while its run executes");
    h.wait_timeout(HANG).expect("no hang").expect("the run keeps its callable");
    assert!(output(&mem, &bufs[2], 64).iter().all(|&v| v == 7.0));
    assert_eq!(w.chip_callable_refs(WorkerId(0), add_callable(0).id()).unwrap(), 0);
    let refused = w.submit(Orchestration::chip(add, args));
    assert!(matches!(refused, Err(simpler_worker::WorkerError::UnknownCallable { .. })));
    w.close().expect("close");
}
