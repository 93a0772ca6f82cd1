//! Device queueing on the simulator: runs launched behind a launched, unreaped run on the same
//! streams, each completed by its own events; a fault charged to its run with the runs queued
//! behind it abandoned, whatever order they are reaped in; dropped queued handles, which a
//! poll or a reap with a deadline never waits for beyond that deadline (`docs/pipelining.md`,
//! "Device queueing").

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use simpler_device_a2a3::kernel::model_device_time;
use simpler_device_a2a3::programs::{add, vector};
use simpler_device_a2a3::{
    AcceptanceSignal, ActiveRun, ChipSlot, DeviceError, DeviceHealth, DeviceRunner, FaultPlan,
    KernelKind, Overlap, RunRequest, RunnerOptions,
};
use simpler_types::CallConfig;

/// How long the first run's multiply is held so the later launches find it executing.
const HOLD: Duration = Duration::from_millis(200);

/// Four slots, device queueing on, budgets well above [`HOLD`].
fn queue_options() -> RunnerOptions {
    fast_options(0)
        .with_pipeline_slots(4)
        .with_device_queue(true)
        .with_scheduler_timeout(Duration::from_secs(1))
        .with_op_execute_timeout(Duration::from_millis(1500))
        .with_stream_sync_timeout(Duration::from_secs(4))
}

/// Prepares and launches one run per vector set back to back, with no reap in between; every
/// acceptance is published before any run is reaped.
fn launch_queue(
    r: &mut DeviceRunner,
    slot: ChipSlot,
    runs: &[VectorRun],
    cfg: &CallConfig,
) -> Vec<ActiveRun> {
    let signals: Vec<_> = runs.iter().map(|_| Arc::new(AcceptanceSignal::new())).collect();
    let mut active = Vec::new();
    for (i, (v, signal)) in runs.iter().zip(&signals).enumerate() {
        let id = run_id(i as u64 + 1);
        let req = RunRequest::new(id, slot, &v.args, cfg).with_acceptance(signal);
        let p = r.prepare(&req).unwrap();
        active.push(r.launch_run(p).unwrap());
    }
    for (i, s) in signals.iter().enumerate() {
        assert_eq!(s.accepted(), Some(i as u64 + 1), "run {} was queued on the device", i + 1);
    }
    active
}

#[test]
fn four_queued_runs_complete_by_their_own_events_with_their_own_results() {
    let mut r = DeviceRunner::attach(queue_options()).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let runs: Vec<_> = [256, 1024, 64, 512].map(|n| VectorRun::new(&mut r, n)).into();
    let cfg = CallConfig::default();
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, HOLD);
    let active = launch_queue(&mut r, slot, &runs, &cfg);
    assert!(!r.poll_run(&active[3]).unwrap(), "the last run waits behind the held first run");
    // Out of order: the last run is polled and reaped first; it completes after the others
    // (the streams are FIFO), by its own events.
    let mut active: Vec<Option<ActiveRun>> = active.into_iter().map(Some).collect();
    for i in [3, 1, 0, 2] {
        let a = active[i].take().unwrap();
        assert!(r.reap_run(&a, None).unwrap());
        assert!(r.poll_run(&a).unwrap(), "a reaped run polls done");
        let rep = r.complete_run(a).unwrap();
        assert_eq!(rep.run_id, Some(run_id(i as u64 + 1)));
    }
    for v in &runs {
        v.check(&mut r);
    }
    assert!(r.health().is_healthy());
    for v in runs {
        v.free(&mut r);
    }
    r.finalize().unwrap();
}

/// Queues four runs whose `faulty`th (1-based) multiply faults, reaps them in `order` and
/// checks each outcome: earlier runs succeed, the faulty run carries its own error, the runs
/// behind it are abandoned after it. Then the runner recovers through finalize. (Outputs are
/// checked by the all-success test: copies are refused while runs are launched, and on an
/// unusable runner.)
fn fault_in_queue(faulty: u64, order: [usize; 4], arm: fn(&FaultPlan, u32)) {
    fault_in_queue_with(queue_options(), faulty, order, arm);
}

fn fault_in_queue_with(
    opts: RunnerOptions,
    faulty: u64,
    order: [usize; 4],
    arm: fn(&FaultPlan, u32),
) {
    let mut r = DeviceRunner::attach(opts).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let runs: Vec<_> = (0..4).map(|_| VectorRun::new(&mut r, 256)).collect();
    let cfg = CallConfig::default();
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, HOLD / 4);
    arm(r.sim_faults().unwrap(), faulty as u32);
    let mut active: Vec<Option<ActiveRun>> =
        launch_queue(&mut r, slot, &runs, &cfg).into_iter().map(Some).collect();
    for i in order {
        let a = active[i].take().unwrap();
        let n = i as u64 + 1;
        let reaped = r.reap_run(&a, None).and_then(|_| r.complete_run(a));
        match n.cmp(&faulty) {
            std::cmp::Ordering::Less => {
                let rep = reaped.unwrap_or_else(|e| panic!("run {n} ran before the fault: {e}"));
                assert_eq!(rep.run_id, Some(run_id(n)));
            }
            std::cmp::Ordering::Equal => {
                let e = reaped.unwrap_err();
                assert!(
                    matches!(e, DeviceError::DeviceFault { .. } | DeviceError::Timeout { .. }),
                    "run {n} carries its own fault: {e}"
                );
                assert_eq!(e.run_id(), Some(run_id(n)), "{e}");
            }
            std::cmp::Ordering::Greater => {
                let e = reaped.unwrap_err();
                assert!(
                    matches!(&e, DeviceError::Abandoned { run_id: id, after, .. }
                        if *id == run_id(n) && *after == run_id(faulty)),
                    "run {n} is abandoned after run {faulty}: {e}"
                );
            }
        }
    }
    match r.health() {
        DeviceHealth::Unusable { cause } => assert_eq!(cause.run_id, run_id(faulty)),
        h => panic!("the fault made the device unusable: {h:?}"),
    }
    drop(runs);
    r.finalize().unwrap();
    let mut fresh = DeviceRunner::attach(queue_options()).unwrap();
    vector_once(&mut fresh, 1, &CallConfig::default());
    fresh.finalize().unwrap();
}

/// A core exception in the `nth` multiply.
fn fault(plan: &FaultPlan, nth: u32) {
    plan.kernel_fault(FUNC_MUL, nth);
}

#[test]
fn a_hung_kernel_in_run_three_is_its_own_failure_and_run_four_is_abandoned_reaped_first() {
    // Nobody synchronises a stream: run 4's event wait must end when run 3's hang is detected
    // (the scheduler's watchdog stops run 3's AICPU, whose failure fails run 4's records).
    fault_in_queue(3, [3, 2, 0, 1], |plan, nth| plan.kernel_hang(FUNC_MUL, nth));
}

#[test]
fn a_fault_in_run_two_of_four_fails_exactly_run_two_and_abandons_the_rest_in_order() {
    fault_in_queue(2, [0, 1, 2, 3], fault);
}

#[test]
fn a_fault_in_run_two_of_four_is_charged_to_it_when_the_runs_are_reaped_backwards() {
    fault_in_queue(2, [3, 2, 1, 0], fault);
}

#[test]
fn a_fault_in_the_first_queued_run_abandons_all_three_behind_it() {
    fault_in_queue(1, [2, 0, 3, 1], fault);
}

/// Queues `healthy + 2` runs (the first `healthy` succeed, the next faults, the last is queued
/// behind it), then a launch that fails by itself while they execute (the device's first cause
/// is that launch). The faulty run is reaped first and leaves its slot; the run behind it is
/// still charged to it, not to a healthy run ahead of it nor to the failed launch after it.
fn run_behind_a_reaped_fault_with_a_later_launch_failure(healthy: u64) {
    let mut r = DeviceRunner::attach(queue_options()).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let runs: Vec<_> = (0..healthy + 3).map(|_| VectorRun::new(&mut r, 256)).collect();
    let cfg = CallConfig::default();
    let (faulty, behind, refused) = (healthy + 1, healthy + 2, healthy + 3);
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, HOLD / 4);
    fault(r.sim_faults().unwrap(), faulty as u32);
    let active = launch_queue(&mut r, slot, &runs[..behind as usize], &cfg);
    r.sim_faults().unwrap().fail_launch(KernelKind::AiCore, 1);
    let req = RunRequest::new(run_id(refused), slot, &runs[behind as usize].args, &cfg);
    let p = r.prepare(&req).unwrap();
    let e = r.launch_run(p).unwrap_err();
    assert!(matches!(e, DeviceError::Launch { run_id: id, .. } if id == run_id(refused)), "{e}");
    let mut active: Vec<Option<ActiveRun>> = active.into_iter().map(Some).collect();
    let mut reap = |r: &mut DeviceRunner, n: u64| {
        let a = active[n as usize - 1].take().unwrap();
        r.reap_run(&a, None).and_then(|_| r.complete_run(a))
    };
    let e = reap(&mut r, faulty).unwrap_err();
    assert_eq!(e.run_id(), Some(run_id(faulty)), "the faulty run carries its own error: {e}");
    let e = reap(&mut r, behind).unwrap_err();
    assert!(
        matches!(&e, DeviceError::Abandoned { run_id: id, after, .. }
            if *id == run_id(behind) && *after == run_id(faulty)),
        "run {behind} is abandoned after run {faulty}, which was reaped before it: {e}"
    );
    for n in 1..=healthy {
        let rep = reap(&mut r, n).unwrap_or_else(|e| panic!("run {n} ran before the fault: {e}"));
        assert_eq!(rep.run_id, Some(run_id(n)));
    }
    match r.health() {
        DeviceHealth::Unusable { cause } => assert_eq!(cause.run_id, run_id(refused)),
        h => panic!("the failed launch made the device unusable: {h:?}"),
    }
    drop(runs);
    r.finalize().unwrap();
}

#[test]
fn a_run_behind_a_reaped_fault_is_charged_to_it_not_to_a_later_failed_launch() {
    run_behind_a_reaped_fault_with_a_later_launch_failure(0);
}

#[test]
fn a_run_behind_a_reaped_fault_is_charged_to_it_not_to_a_healthy_run_ahead_of_it() {
    run_behind_a_reaped_fault_with_a_later_launch_failure(1);
}

#[test]
fn dropped_queued_handles_are_reclaimed_and_the_queue_keeps_working() {
    let mut r = DeviceRunner::attach(queue_options()).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let runs: Vec<_> = (0..3).map(|_| VectorRun::new(&mut r, 128)).collect();
    let cfg = CallConfig::default();
    // Held long enough that run 2 still executes when run 1's completion looks at it, and
    // well inside the scheduler budget.
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, HOLD * 2);
    let cleanups = r.stats().terminal_cleanups;
    let p1 = r.prepare(&RunRequest::new(run_id(1), slot, &runs[0].args, &cfg)).unwrap();
    let a1 = r.launch_run(p1).unwrap();
    let p2 = r.prepare(&RunRequest::new(run_id(2), slot, &runs[1].args, &cfg)).unwrap();
    let a2 = r.launch_run(p2).unwrap();
    let p3 = r.prepare(&RunRequest::new(run_id(3), slot, &runs[2].args, &cfg)).unwrap();
    // A launched run queued behind run 1, and a prepared one, dropped.
    drop(a2);
    drop(p3);
    assert!(r.reap_run(&a1, None).unwrap());
    r.complete_run(a1).unwrap();
    assert_eq!(r.stats().terminal_cleanups, cleanups + 2, "run 2 behind run 1 still executes");
    // All four slots are free again: the prepare that needs run 2's slot waits for it.
    r.sim_faults().unwrap().clear();
    let again: Vec<_> = (0..4)
        .map(|i| r.prepare(&RunRequest::new(run_id(10 + i), slot, &runs[0].args, &cfg)).unwrap())
        .collect();
    assert_eq!(r.stats().terminal_cleanups, cleanups + 3, "every run got its cleanup");
    let mut it = again.into_iter();
    let first = r.launch_run(it.next().unwrap()).unwrap();
    for p in it {
        r.abandon(p).unwrap();
    }
    r.reap_run(&first, None).unwrap();
    r.complete_run(first).unwrap();
    runs[0].check(&mut r);
    runs[1].check(&mut r);
    assert!(r.health().is_healthy());
    for v in runs {
        v.free(&mut r);
    }
    r.finalize().unwrap();
}

/// Four runs of one second each, one behind the other, under a 3.6 s stream-sync budget: the
/// last one ends about 4 s after the first started, beyond one budget, while each run needs far
/// less. (The scheduler budget, which must stay over 1.5 s below the stream-sync one, keeps a
/// second of margin over a held kernel.) `reap_last` reaps run 4 first; runs 1–3 follow in
/// order, and every run must succeed with its own result.
fn four_one_second_runs_reaping_the_last_first(
    reap_last: impl FnOnce(&mut DeviceRunner, &ActiveRun),
) {
    let hold = Duration::from_secs(1);
    let opts = fast_options(0)
        .with_pipeline_slots(4)
        .with_device_queue(true)
        .with_scheduler_timeout(Duration::from_secs(2))
        .with_op_execute_timeout(Duration::from_millis(2500))
        .with_stream_sync_timeout(Duration::from_millis(3600));
    let mut r = DeviceRunner::attach(opts).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let runs: Vec<_> = (0..4).map(|_| VectorRun::new(&mut r, 256)).collect();
    let cfg = CallConfig::default();
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, hold);
    let mut active = launch_queue(&mut r, slot, &runs, &cfg);
    let last = active.pop().unwrap();
    reap_last(&mut r, &last);
    assert_eq!(r.complete_run(last).unwrap().run_id, Some(run_id(4)));
    for (i, a) in active.into_iter().enumerate() {
        let n = i as u64 + 1;
        r.reap_run(&a, None).unwrap_or_else(|e| panic!("run {n}: {e}"));
        assert_eq!(r.complete_run(a).unwrap().run_id, Some(run_id(n)));
    }
    assert!(r.health().is_healthy());
    for v in &runs {
        v.check(&mut r);
    }
    for v in runs {
        v.free(&mut r);
    }
    r.finalize().unwrap();
}

#[test]
fn a_queued_run_reaped_first_gets_the_stream_sync_budget_for_itself_not_for_the_runs_ahead() {
    four_one_second_runs_reaping_the_last_first(|r, last| {
        r.reap_run(last, None).unwrap_or_else(|e| panic!("run 4: {e}"));
    });
}

#[test]
fn a_queued_run_reaped_in_slices_keeps_the_budget_it_had_while_runs_were_ahead_of_it() {
    // Reaped in short slices, as the L2 lane does: the budget fixed at its first reap, with
    // three runs ahead, still covers its end after they finished.
    four_one_second_runs_reaping_the_last_first(|r, last| {
        let mut slices = 0u32;
        while !r.reap_run(last, Some(Duration::from_millis(50))).unwrap_or_else(|e| panic!("{e}")) {
            slices += 1;
            assert!(slices < 1_000, "run 4 never ended");
        }
        assert!(slices > 0, "run 4 was still behind the others at its first slice");
    });
}

/// The stream-sync budget of the slow-run-ahead test (the least the runner accepts over its
/// scheduler budget), and the time its run 1 declares on the chip: 2.3 budgets, as a long run
/// of short kernels would take (no kernel overruns the op-execute watchdog).
const SLOW_BUDGET: Duration = Duration::from_millis(2000);
/// Device times the product kernels below declare, in milliseconds: a run ahead slower than
/// the budgets of a queued run behind it (4.6 s), a run shorter than a budget (1 s), and a run
/// ahead that outlasts both the budgets behind it and its own after them (7.5 s).
const SLOW_RUN_MS: u64 = 4600;
const MID_RUN_MS: u64 = 1000;
const OVERRUN_MS: u64 = 7500;
/// A run ahead that ends 0.3 s before the two budgets of the run queued behind it run out.
const NEARLY_TWO_BUDGETS_MS: u64 = 3700;

/// `g = d · e`, declaring `MS` milliseconds on the chip.
unsafe extern "C-unwind" fn declaring_mul<const MS: u64>(args: *mut i64) {
    // SAFETY: the runtime's argument vector for the product task, passed on unchanged.
    unsafe { vector::mul(args) };
    model_device_time(Duration::from_millis(MS));
}

/// The queue options with [`SLOW_BUDGET`] as the stream-sync budget (the others to match).
fn slow_budget_options() -> simpler_device_a2a3::RunnerOptions {
    queue_options()
        .with_scheduler_timeout(SLOW_BUDGET / 8)
        .with_op_execute_timeout(SLOW_BUDGET / 4)
        .with_stream_sync_timeout(SLOW_BUDGET)
}

/// Registers the vector program whose product kernel declares `MS` milliseconds.
fn declaring<const MS: u64>(r: &mut DeviceRunner) -> simpler_device_a2a3::ChipSlot {
    // SAFETY: `declaring_mul` runs the program's own product kernel for `MUL`.
    let builder = unsafe { vector::builder_with_mul(declaring_mul::<MS>) };
    r.register_callable(&builder.build().unwrap()).unwrap()
}

/// Runs 1 (`first`) and 2 (`second`, queued behind it) over vectors of 256, launched.
fn launch_two(
    r: &mut DeviceRunner,
    first: simpler_device_a2a3::ChipSlot,
    second: simpler_device_a2a3::ChipSlot,
) -> (Vec<VectorRun>, ActiveRun, ActiveRun) {
    let runs: Vec<_> = (0..2).map(|_| VectorRun::new(r, 256)).collect();
    let cfg = CallConfig::default();
    let p1 = r.prepare(&RunRequest::new(run_id(1), first, &runs[0].args, &cfg)).unwrap();
    let a1 = r.launch_run(p1).unwrap();
    let p2 = r.prepare(&RunRequest::new(run_id(2), second, &runs[1].args, &cfg)).unwrap();
    let a2 = r.launch_run(p2).unwrap();
    (runs, a1, a2)
}

#[test]
fn a_queued_run_whose_budget_ran_out_behind_a_slow_run_that_then_ended_gets_its_own_budget() {
    // Run 2, queued behind run 1, only adds. Its reap (first, with two budgets: one for run 1,
    // one for itself) runs out while run 1 still executes; run 1 then ends within the budget
    // it is given, and only then can run 2 begin: its timeout would not be its own.
    let mut r = DeviceRunner::attach(slow_budget_options()).unwrap();
    let slow = declaring::<SLOW_RUN_MS>(&mut r);
    let sum = r.register_callable(&add::callable().unwrap()).unwrap();
    let (runs, first, second) = launch_two(&mut r, slow, sum);
    let reaped = r.reap_run(&second, None).unwrap_or_else(|e| panic!("run 2 never overran: {e}"));
    assert!(reaped);
    assert_eq!(r.complete_run(second).unwrap().run_id, Some(run_id(2)));
    assert!(r.reap_run(&first, None).unwrap());
    assert_eq!(r.complete_run(first).unwrap().run_id, Some(run_id(1)));
    assert!(r.health().is_healthy());
    runs[0].check(&mut r);
    drop(runs);
    r.finalize().unwrap();
}

/// Completes run 2 (reaped already), reaps and completes run 1, and checks both results on a
/// healthy device before finalizing it.
fn complete_both_healthy(
    mut r: DeviceRunner,
    runs: Vec<VectorRun>,
    first: ActiveRun,
    second: ActiveRun,
) {
    assert_eq!(r.complete_run(second).unwrap().run_id, Some(run_id(2)));
    assert!(r.reap_run(&first, None).unwrap());
    assert_eq!(r.complete_run(first).unwrap().run_id, Some(run_id(1)));
    assert!(r.health().is_healthy());
    for v in &runs {
        v.check(&mut r);
    }
    drop(runs);
    r.finalize().unwrap();
}

#[test]
fn a_queued_run_that_began_just_before_its_budget_ran_out_behind_a_slow_run_is_not_charged_for_it()
{
    // Run 1 ends shortly before run 2's two budgets (4 s) run out, so run 2 has begun, and is a
    // few hundred milliseconds into its own second, when its wait ends: the time was run 1's.
    let mut r = DeviceRunner::attach(slow_budget_options()).unwrap();
    let slow = declaring::<NEARLY_TWO_BUDGETS_MS>(&mut r);
    let mid = declaring::<MID_RUN_MS>(&mut r);
    let (runs, first, second) = launch_two(&mut r, slow, mid);
    let reaped = r.reap_run(&second, None).unwrap_or_else(|e| panic!("run 2 was charged: {e}"));
    assert!(reaped);
    complete_both_healthy(r, runs, first, second);
}

#[test]
fn a_queued_run_given_its_own_budget_behind_a_slow_run_is_not_waited_for_past_the_reaps_deadline() {
    // As above, but run 2 takes a second of its own and is reaped with a deadline between run
    // 1's end (4.6 s) and run 2's (5.6 s): run 2's two budgets run out while run 1 still
    // executes, run 1 ends, and run 2 gets its own budget from then; the reap must return at
    // its deadline with run 2 still launched, not wait for run 2 within that new budget.
    let mut r = DeviceRunner::attach(slow_budget_options()).unwrap();
    let slow = declaring::<SLOW_RUN_MS>(&mut r);
    let mid = declaring::<MID_RUN_MS>(&mut r);
    let (runs, first, second) = launch_two(&mut r, slow, mid);
    let deadline = SLOW_BUDGET * 5 / 2;
    let reaped = r.reap_run(&second, Some(deadline)).unwrap_or_else(|e| panic!("run 2: {e}"));
    assert!(!reaped, "the reap waited past its deadline for run 2, which had just begun");
    assert!(r.reap_run(&second, None).unwrap(), "run 2 ends within its own budget");
    complete_both_healthy(r, runs, first, second);
}

#[test]
fn a_queued_run_reaped_in_slices_behind_a_run_that_overruns_its_budget_is_abandoned_in_time() {
    // Run 1 overruns: run 2's two budgets (4 s) pass, and run 1's own budget from then (2 s)
    // passes too, before it ends at 7.5 s.
    let mut r = DeviceRunner::attach(slow_budget_options()).unwrap();
    let slow = declaring::<OVERRUN_MS>(&mut r);
    let sum = r.register_callable(&add::callable().unwrap()).unwrap();
    let (runs, first, second) = launch_two(&mut r, slow, sum);
    // A deadline just past run 2's budgets: the wait for run 1 stops there too.
    let deadline = SLOW_BUDGET * 2 + SLOW_BUDGET / 20;
    let first_look = r.reap_run(&second, Some(deadline));
    assert!(
        matches!(first_look, Ok(false)),
        "the reap returns at its deadline, run 1 undecided, not past it: {first_look:?}"
    );
    // Slices from there: run 1's budget runs from the first look at it, so run 2 ends as
    // abandoned behind it once that budget has passed, before run 1 ends.
    let mut slices = 0;
    let e = loop {
        match r.reap_run(&second, Some(SLOW_BUDGET / 4)) {
            Ok(false) if slices < 40 => slices += 1,
            other => break other.expect_err("run 2 is abandoned behind run 1, which overran"),
        }
    };
    assert!(
        matches!(&e, DeviceError::Abandoned { run_id: two, after: one, .. }
            if *two == run_id(2) && *one == run_id(1)),
        "{e:?}"
    );
    assert!(r.reap_run(&first, None).is_err(), "run 1 overran its budget");
    assert!(!r.health().is_healthy());
    drop(runs);
    let _ = r.finalize();
}

#[test]
fn a_run_launched_before_a_launch_that_unwound_reaps_as_itself() {
    let mut r = DeviceRunner::attach(queue_options()).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let runs: Vec<_> = (0..2).map(|_| VectorRun::new(&mut r, 256)).collect();
    let cfg = CallConfig::default();
    // Held well past the unwind, so that run 1 is still executing when the device is poisoned.
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, HOLD * 4);
    let p1 = r.prepare(&RunRequest::new(run_id(1), slot, &runs[0].args, &cfg)).unwrap();
    let a1 = r.launch_run(p1).unwrap();
    // Run 2's launch unwinds right after its AICore kernel was enqueued, while run 1 executes:
    // the device is unusable through run 2, which run 1 did not stand behind.
    r.sim_faults().unwrap().panic_after_launch(KernelKind::AiCore, 1);
    let p2 = r.prepare(&RunRequest::new(run_id(2), slot, &runs[1].args, &cfg)).unwrap();
    assert!(catch_unwind(AssertUnwindSafe(|| r.launch_run(p2))).is_err());
    assert!(!r.poll_run(&a1).unwrap(), "run 1 still executes behind the poisoning");
    match r.health() {
        DeviceHealth::Unusable { cause } => assert_eq!(cause.run_id, run_id(2)),
        h => panic!("the unwound launch made the device unusable: {h:?}"),
    }
    assert!(r.reap_run(&a1, None).unwrap_or_else(|e| panic!("run 1 ran ahead of run 2: {e}")));
    assert_eq!(r.complete_run(a1).unwrap().run_id, Some(run_id(1)));
    drop(runs);
    r.finalize().unwrap();
}

#[test]
fn runs_of_one_engine_run_queued_behind_its_failing_run_are_abandoned_not_taken_for_it() {
    // Runs 1 and 2 are two tasks of one engine run: the same run id, told apart by origin.
    let mut r = DeviceRunner::attach(queue_options()).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let runs: Vec<_> = (0..3).map(|_| VectorRun::new(&mut r, 256)).collect();
    let cfg = CallConfig::default();
    let task = |seq| simpler_types::TaskId::new(run_id(5), seq);
    let request = |i: usize| RunRequest::new(run_id(5), slot, &runs[i].args, &cfg);
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, HOLD * 4);
    let p0 = r.prepare(&request(0).with_origin(task(0))).unwrap();
    let a0 = r.launch_run(p0).unwrap();
    let p2 = r.prepare(&request(2).with_origin(task(2))).unwrap();
    // Task 1's launch unwinds once its AICore kernel is enqueued behind task 0's run.
    r.sim_faults().unwrap().panic_after_launch(KernelKind::AiCore, 1);
    let p1 = r.prepare(&request(1).with_origin(task(1))).unwrap();
    assert!(catch_unwind(AssertUnwindSafe(|| r.launch_run(p1))).is_err());
    // Task 2's run, launched after the failing one, is abandoned behind it.
    let err = r.launch_run(p2).unwrap_err();
    assert!(matches!(err, DeviceError::Abandoned { after, .. } if after == run_id(5)), "{err}");
    // Task 0's run, ahead of the failure, still reaps as itself.
    assert!(r.reap_run(&a0, None).unwrap_or_else(|e| panic!("task 0 ran ahead: {e}")));
    r.complete_run(a0).unwrap();
    drop(runs);
    r.finalize().unwrap();
}

#[test]
fn a_fault_report_names_the_core_type_of_the_launch_that_ran_not_of_the_one_queued_behind_it() {
    use simpler_device_a2a3::abi::CoreType;
    let mut r = DeviceRunner::attach(queue_options()).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let runs: Vec<_> = (0..3).map(|_| VectorRun::new(&mut r, 256)).collect();
    let shape = |block_dim| CallConfig::builder().block_dim(block_dim).build().unwrap();
    let (wide, narrow) = (shape(2), shape(1));
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, HOLD * 4);
    let p0 = r.prepare(&RunRequest::new(run_id(1), slot, &runs[0].args, &wide)).unwrap();
    let a0 = r.launch_run(p0).unwrap();
    // Once run 1's cores handshook (its multiply is being held), the next handshake of core 1
    // (run 2's) reports a bad id.
    wait_fired(&r, |f| matches!(f, simpler_device_a2a3::FiredFault::KernelDelayed { .. }));
    assert!(!r.poll_run(&a0).unwrap(), "run 1 is held");
    r.sim_faults().unwrap().handshake_fault(1, 80);
    // Run 2 runs one cluster, where core 1 is an AIV; run 3, queued behind it, two clusters,
    // where core 1 is an AIC.
    let p1 = r.prepare(&RunRequest::new(run_id(2), slot, &runs[1].args, &narrow)).unwrap();
    let a1 = r.launch_run(p1).unwrap();
    let p2 = r.prepare(&RunRequest::new(run_id(3), slot, &runs[2].args, &wide)).unwrap();
    let a2 = r.launch_run(p2).unwrap();
    assert!(r.reap_run(&a0, None).unwrap());
    r.complete_run(a0).unwrap();
    let err = r.reap_run(&a1, None).unwrap_err();
    let DeviceError::DeviceFault { faults, .. } = &err else { panic!("{err}") };
    let named: Vec<_> = faults.iter().filter_map(|f| f.core).collect();
    assert!(named.contains(&(1, CoreType::Aiv)), "{err}: {named:?}");
    assert!(matches!(r.reap_run(&a2, None), Err(DeviceError::Abandoned { .. })));
    drop(runs);
    r.finalize().unwrap();
}

/// How long the multiply of a run whose handle is dropped is held, in the tests of the calls
/// that must not wait for it. They assert a bound on how long a call blocked, not a speed: half
/// or three quarters of this, where waiting for the dropped run would take nearly all of it;
/// long enough that a loaded machine's scheduling delays stay well inside those bounds.
const DROPPED_HOLD: Duration = Duration::from_secs(3);

#[test]
fn a_run_prepared_behind_queued_runs_overlaps_the_last_launched_whatever_slot_it_holds() {
    let mut r = DeviceRunner::attach(queue_options()).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let runs: Vec<_> = (0..4).map(|_| VectorRun::new(&mut r, 256)).collect();
    let cfg = CallConfig::default();
    let prepare = |r: &mut DeviceRunner, n: u64| {
        r.prepare(&RunRequest::new(run_id(n), slot, &runs[n as usize - 1].args, &cfg)).unwrap()
    };
    let p = prepare(&mut r, 1);
    let a1 = r.launch_run(p).unwrap();
    let p = prepare(&mut r, 2);
    let a2 = r.launch_run(p).unwrap();
    // Runs 1 and 2 are queued: run 3 is prepared behind run 2, the last launched.
    let p = prepare(&mut r, 3);
    let a3 = r.launch_run(p).unwrap();
    assert!(r.reap_run(&a1, None).unwrap());
    let (slot1, report1) = (a1.slot(), r.complete_run(a1).unwrap());
    // Run 4 takes run 1's slot, ahead of the slots of runs 2 and 3 in slot order.
    let p = prepare(&mut r, 4);
    assert_eq!(p.slot(), slot1);
    let a4 = r.launch_run(p).unwrap();
    let mut overlaps = vec![report1.overlap];
    for a in [a2, a3, a4] {
        assert!(r.reap_run(&a, None).unwrap());
        overlaps.push(r.complete_run(a).unwrap().overlap);
    }
    let with = |n| Overlap::Overlapped { with: run_id(n) };
    assert_eq!(overlaps, [Overlap::NothingInFlight, with(1), with(2), with(3)]);
    for v in &runs {
        v.check(&mut r);
    }
    drop(runs);
    r.finalize().unwrap();
}

/// Two slots and device queueing on.
fn two_slot_queue() -> RunnerOptions {
    // Budgets that let a run held [`DROPPED_HOLD`], and one queued behind it, end on their own.
    fast_options(0)
        .with_pipeline_slots(2)
        .with_device_queue(true)
        .with_scheduler_timeout(DROPPED_HOLD * 2)
        .with_op_execute_timeout(DROPPED_HOLD * 5 / 2)
        .with_stream_sync_timeout(DROPPED_HOLD * 18 / 5)
}

/// Runs 1 and 2 of the vector example queued back to back, each held [`DROPPED_HOLD`]; run 1's
/// handle is dropped while it executes. Returns run 2's handle and the cleanups before the drop.
fn second_behind_a_dropped_first(
    r: &mut DeviceRunner,
    runs: &[VectorRun],
    cfg: &CallConfig,
) -> (ActiveRun, u64) {
    let slot = r.register_callable(&vector_callable()).unwrap();
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, DROPPED_HOLD);
    let mut active = launch_queue(r, slot, runs, cfg);
    let second = active.pop().unwrap();
    let cleanups = r.stats().terminal_cleanups;
    drop(active);
    (second, cleanups)
}

/// Both slots take a run again, and finalize finds nothing left over.
fn both_slots_free_and_nothing_left(mut r: DeviceRunner, runs: Vec<VectorRun>) {
    assert!(r.health().is_healthy());
    let slot = r.register_callable(&vector_callable()).unwrap();
    let cfg = CallConfig::default();
    let again: Vec<_> = (0..2)
        .map(|i| r.prepare(&RunRequest::new(run_id(10 + i), slot, &runs[0].args, &cfg)).unwrap())
        .collect();
    for p in again {
        r.abandon(p).unwrap();
    }
    for v in runs {
        v.free(&mut r);
    }
    assert_eq!(r.finalize().unwrap().abandoned_run, None, "no run was left to finalize");
}

#[test]
fn a_poll_never_waits_for_a_dropped_run_still_executing_ahead_and_a_later_poll_cleans_it_up() {
    let mut r = DeviceRunner::attach(two_slot_queue()).unwrap();
    let runs: Vec<_> = (0..2).map(|_| VectorRun::new(&mut r, 256)).collect();
    let cfg = CallConfig::default();
    let (second, cleanups) = second_behind_a_dropped_first(&mut r, &runs, &cfg);
    let started = Instant::now();
    assert!(!r.poll_run(&second).unwrap(), "run 2 is queued behind the held run 1");
    let took = started.elapsed();
    assert!(took < DROPPED_HOLD / 2, "the poll waited {took:?} for the dropped run 1");
    assert_eq!(r.stats().terminal_cleanups, cleanups, "run 1 still executes: it stays queued");
    // Run 1 ends before run 2, and the poll that sees run 2 done has cleaned run 1 up.
    let give_up = Instant::now() + 4 * DROPPED_HOLD;
    while !r.poll_run(&second).unwrap() {
        assert!(Instant::now() < give_up, "run 2 never ended");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(r.stats().terminal_cleanups, cleanups + 1, "the dropped run 1 was cleaned up");
    assert!(r.reap_run(&second, None).unwrap());
    assert_eq!(r.complete_run(second).unwrap().run_id, Some(run_id(2)));
    assert_eq!(r.stats().terminal_cleanups, cleanups + 2);
    for v in &runs {
        v.check(&mut r);
    }
    r.sim_faults().unwrap().clear();
    both_slots_free_and_nothing_left(r, runs);
}

#[test]
fn a_reap_with_a_deadline_waits_no_longer_than_it_for_a_dropped_run_queued_ahead() {
    let mut r = DeviceRunner::attach(two_slot_queue()).unwrap();
    let runs: Vec<_> = (0..2).map(|_| VectorRun::new(&mut r, 256)).collect();
    let cfg = CallConfig::default();
    let (second, cleanups) = second_behind_a_dropped_first(&mut r, &runs, &cfg);
    let started = Instant::now();
    assert!(!r.reap_run(&second, Some(Duration::from_millis(50))).unwrap(), "run 2 is behind");
    let took = started.elapsed();
    assert!(took < DROPPED_HOLD / 2, "the reap waited {took:?} for the dropped run 1");
    assert_eq!(r.stats().terminal_cleanups, cleanups, "run 1 still executes: it stays queued");
    // Without a deadline the dropped run ahead is reaped first, then run 2.
    second_completes_and_all_is_released(r, second, runs, cleanups);
}

#[test]
fn a_reap_with_a_deadline_does_not_wait_for_a_dropped_run_queued_behind() {
    let mut r = DeviceRunner::attach(two_slot_queue()).unwrap();
    let sum = r.register_callable(&add::callable().unwrap()).unwrap();
    let vector = r.register_callable(&vector_callable()).unwrap();
    let runs: Vec<_> = (0..2).map(|_| VectorRun::new(&mut r, 256)).collect();
    let cfg = CallConfig::default();
    // Run 1 only adds; run 2, queued behind it, runs the held multiply.
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, DROPPED_HOLD);
    let p1 = r.prepare(&RunRequest::new(run_id(1), sum, &runs[0].args, &cfg)).unwrap();
    let first = r.launch_run(p1).unwrap();
    let p2 = r.prepare(&RunRequest::new(run_id(2), vector, &runs[1].args, &cfg)).unwrap();
    let cleanups = r.stats().terminal_cleanups;
    drop(r.launch_run(p2).unwrap());
    let started = Instant::now();
    assert!(r.reap_run(&first, Some(DROPPED_HOLD / 2)).unwrap(), "run 1 ends on its own");
    let took = started.elapsed();
    // Waiting for run 2 would take its whole hold; run 1 alone ends well before it.
    assert!(took < DROPPED_HOLD * 3 / 4, "the reap waited {took:?} for the dropped run 2 behind");
    assert_eq!(r.stats().terminal_cleanups, cleanups, "run 2 still executes: it stays queued");
    // Neither a reap without a deadline nor the completion of run 1 waits for run 2 behind it.
    assert!(r.reap_run(&first, None).unwrap());
    assert_eq!(r.complete_run(first).unwrap().run_id, Some(run_id(1)));
    let took = started.elapsed();
    assert!(took < DROPPED_HOLD * 3 / 4, "run 1's completion waited {took:?} for run 2 behind");
    assert_eq!(r.stats().terminal_cleanups, cleanups + 1, "run 2 still executes: it stays queued");
    // A call that needs the device to itself (a copy) still waits for it.
    runs[1].check(&mut r);
    assert_eq!(r.stats().terminal_cleanups, cleanups + 2, "the dropped run 2 was cleaned up");
    let sums = download_f32(&mut r, runs[0].ptrs[2], runs[0].a.len());
    let expected: Vec<f32> = runs[0].a.iter().zip(&runs[0].b).map(|(a, b)| a + b).collect();
    assert_eq!(sums, expected);
    r.sim_faults().unwrap().clear();
    both_slots_free_and_nothing_left(r, runs);
}

/// Run 1 of the vector example, held [`DROPPED_HOLD`], launched and its handle dropped at
/// once; returns the runner, both runs' buffers, the callable and the cleanups before the drop.
fn first_launched_and_dropped(
    opts: RunnerOptions,
) -> (DeviceRunner, Vec<VectorRun>, ChipSlot, u64) {
    let mut r = DeviceRunner::attach(opts).unwrap();
    let runs: Vec<_> = (0..2).map(|_| VectorRun::new(&mut r, 256)).collect();
    let slot = r.register_callable(&vector_callable()).unwrap();
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, DROPPED_HOLD);
    let cfg = CallConfig::default();
    let p1 = r.prepare(&RunRequest::new(run_id(1), slot, &runs[0].args, &cfg)).unwrap();
    let cleanups = r.stats().terminal_cleanups;
    drop(r.launch_run(p1).unwrap());
    (r, runs, slot, cleanups)
}

/// Run 2's reap (which waits for the dropped run 1 ahead of it, then for run 2) leaves run 1
/// cleaned up; run 2 completes as itself, both outputs are right, and both slots are free again.
fn second_completes_and_all_is_released(
    mut r: DeviceRunner,
    second: ActiveRun,
    runs: Vec<VectorRun>,
    cleanups: u64,
) {
    assert!(r.reap_run(&second, None).unwrap());
    assert_eq!(r.stats().terminal_cleanups, cleanups + 1, "the dropped run 1 was cleaned up");
    assert_eq!(r.complete_run(second).unwrap().run_id, Some(run_id(2)));
    for v in &runs {
        v.check(&mut r);
    }
    r.sim_faults().unwrap().clear();
    both_slots_free_and_nothing_left(r, runs);
}

#[test]
fn the_next_run_is_prepared_and_queued_behind_a_dropped_run_without_waiting_for_it() {
    let (mut r, runs, slot, cleanups) = first_launched_and_dropped(two_slot_queue());
    let cfg = CallConfig::default();
    let started = Instant::now();
    let p2 = r.prepare(&RunRequest::new(run_id(2), slot, &runs[1].args, &cfg)).unwrap();
    let second = r.launch_run(p2).unwrap();
    let took = started.elapsed();
    assert!(took < DROPPED_HOLD / 2, "prepare and launch waited {took:?} for the dropped run 1");
    assert_eq!(r.stats().terminal_cleanups, cleanups, "run 1 still executes: it stays queued");
    // Run 2's reap waits for run 1 ahead of it, then for itself.
    second_completes_and_all_is_released(r, second, runs, cleanups);
}

#[test]
fn without_device_queueing_a_free_slot_is_prepared_at_once_and_the_launch_waits_for_the_dropped_run()
 {
    let (mut r, runs, slot, cleanups) =
        first_launched_and_dropped(two_slot_queue().with_device_queue(false));
    let cfg = CallConfig::default();
    let started = Instant::now();
    let p2 = r.prepare(&RunRequest::new(run_id(2), slot, &runs[1].args, &cfg)).unwrap();
    let took = started.elapsed();
    assert!(took < DROPPED_HOLD / 2, "the prepare waited {took:?} for the dropped run 1");
    assert_eq!(r.stats().terminal_cleanups, cleanups, "run 1 still executes: it stays queued");
    // The exclusive execution claim: the launch waits for run 1 instead of refusing run 2.
    let second = r.launch_run(p2).unwrap();
    assert_eq!(r.stats().terminal_cleanups, cleanups + 1, "the launch cleaned up run 1");
    second_completes_and_all_is_released(r, second, runs, cleanups);
}
