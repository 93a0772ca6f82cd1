//! Randomized stress tests of the engine: many runs of random DAGs across seeds, endpoints that
//! yield and sleep to vary thread interleavings, and eight threads submitting runs back to
//! back against one engine.
//!
//! Every run is checked against the reference model of `support` (dependencies from tags and
//! byte footprints, failure propagation, at-most-once and all-or-nothing dispatch, outcome and
//! summary, nothing left in the tensor map or the rings), and every engine after it shuts down
//! (all charges reclaimed, no endpoint or engine thread left).
//!
//! Scale with `SIMPLER_STRESS_RUNS` (default 360 runs for the seed sweep, 8 per thread for the
//! threaded test); replay one engine's seed with `SIMPLER_STRESS_SEED`.

mod support;

use std::sync::Mutex;

use support::driver::{Coverage, Driver, RunReport, finish_engine};
use support::endpoint::Recorder;
use support::env::start_engine;
use support::plan::{Action, EngineShape, MemberPlan, Op, RunEnd, RunPlan, TaskKind, TaskPlan};
use support::strategy::{Draw, Sizes, engine_shape, run_plan};

/// Levels of the engines here; each test owns one so that engine threads are told apart by
/// name while the tests run in parallel.
const SWEEP_LEVEL: u8 = 7;
const THREADED_LEVEL: u8 = 8;
const STALL_LEVEL: u8 = 9;
const PEAKS_LEVEL: u8 = 10;

/// Runs per engine in the seed sweep.
const RUNS_PER_ENGINE: usize = 6;

/// Large runs, delays on, occasional failures.
const SWEEP: Sizes = Sizes { max_ops: 100, delays: true, failures_per_mille: 8 };

/// Smaller runs for the threaded test, where eight builders take turns.
const THREADED: Sizes = Sizes { max_ops: 30, delays: true, failures_per_mille: 4 };

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs one engine of seed `seed` through `runs` plans; the last run of every other engine
/// ends by shutting the engine down under it.
fn sweep_engine(seed: u64, runs: usize, coverage: &mut Coverage) -> Result<(), String> {
    let mut draw = Draw::new(seed);
    let shape = draw.value(engine_shape());
    let mut plans: Vec<RunPlan> = (0..runs).map(|_| draw.value(run_plan(SWEEP, &shape))).collect();
    if seed % 2 == 1
        && let Some(last) = plans.last_mut()
    {
        last.end = RunEnd::Shutdown;
    }
    let recorder = Recorder::new();
    let engine = start_engine(&shape, SWEEP_LEVEL, &recorder);
    let driver = Driver {
        engine: &engine,
        shape: &shape,
        level: SWEEP_LEVEL,
        recorder: &recorder,
        exclusive: true,
    };
    let mut reports = Vec::with_capacity(runs);
    for (k, plan) in plans.iter().enumerate() {
        let report = driver.run(plan).map_err(|e| {
            format!("seed {seed}, run {k} of engine {shape:?}: {e}\nplan: {plan:?}")
        })?;
        if report.run.get() != k as u64 + 1 {
            return Err(format!("seed {seed}: run {k} got id {}", report.run));
        }
        coverage.add(&report);
        reports.push(report);
    }
    finish_engine(engine, &shape, SWEEP_LEVEL, &recorder, &reports)
        .map_err(|e| format!("seed {seed}, engine {shape:?}: {e}"))
}

#[test]
fn random_dags_keep_every_engine_guarantee_across_seeds() {
    let total = env_number("SIMPLER_STRESS_RUNS").unwrap_or(360) as usize;
    let first = env_number("SIMPLER_STRESS_SEED");
    let engines = if first.is_some() { 1 } else { total.div_ceil(RUNS_PER_ENGINE) };
    let mut coverage = Coverage::default();
    for i in 0..engines as u64 {
        let seed = first.unwrap_or(i);
        if let Err(e) = sweep_engine(seed, RUNS_PER_ENGINE, &mut coverage) {
            panic!("{e}\nreplay with SIMPLER_STRESS_SEED={seed}");
        }
    }
    eprintln!("stress sweep: {coverage:?}");
    if first.is_none() {
        // The default sweep must actually exercise what it claims to check.
        let c = coverage;
        assert!(c.ran > 1000 && c.edges > 1000, "too little work: {c:?}");
        assert!(c.failed > 0 && c.refused > 0 && c.rejected > 0, "no failures: {c:?}");
        assert!(c.cancelled > 0 && c.aborted_runs > 0 && c.dropped_runs > 0, "{c:?}");
    }
}

#[test]
fn eight_threads_submitting_back_to_back_neither_hang_nor_leak() {
    let per_thread = env_number("SIMPLER_STRESS_RUNS").map_or(8, |n| (n as usize).div_ceil(8));
    let shape = EngineShape { next_level: vec![0, 1], subs: 2 };
    let recorder = Recorder::new();
    let engine = start_engine(&shape, THREADED_LEVEL, &recorder);
    let reports: Mutex<Vec<RunReport>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (engine, shape, recorder, reports) = (&engine, &shape, &recorder, &reports);
            s.spawn(move || {
                let mut draw = Draw::new(1_000 + t);
                let driver =
                    Driver { engine, shape, level: THREADED_LEVEL, recorder, exclusive: false };
                for k in 0..per_thread {
                    let plan = draw.value(run_plan(THREADED, shape));
                    match driver.run(&plan) {
                        Ok(r) => reports.lock().unwrap().push(r),
                        Err(e) => panic!("thread {t}, run {k}: {e}\nplan: {plan:?}"),
                    }
                }
            });
        }
    });
    let mut reports = reports.into_inner().unwrap();
    let mut coverage = Coverage::default();
    reports.iter().for_each(|r| coverage.add(r));
    eprintln!("threaded stress: {coverage:?}");
    reports.sort_by_key(|r| r.run);
    let ids: Vec<u64> = reports.iter().map(|r| r.run.get()).collect();
    let expected: Vec<u64> = (1..=8 * per_thread as u64).collect();
    assert_eq!(ids, expected, "every admitted run got its own id, in order");
    let ring = engine.stats().ring;
    assert_eq!(ring.window.live, 0, "no slot outlives its run");
    assert!(ring.heaps.iter().all(|h| h.live_bytes == 0), "no slab outlives its run: {ring:?}");
    finish_engine(engine, &shape, THREADED_LEVEL, &recorder, &reports).unwrap();
}

/// A single task on NEXT_LEVEL position `first` whose endpoint spends `delay_us`.
fn single(first: u8, delay_us: u16) -> Op {
    Op::Submit(TaskPlan {
        kind: TaskKind::NextLevel { first, unknown_target: false },
        members: vec![MemberPlan { tensors: Vec::new(), action: Action::Succeed, delay_us }],
    })
}

/// Regression: the scheduler thread once released the scheduler lock after its own pass without
/// driving the inbox, stranding a completion delivered meanwhile (the run hung).
#[test]
fn completions_delivered_while_the_scheduler_thread_runs_a_pass_are_not_lost() {
    // Each round blocks a group on busy worker 0 while idle worker 1 holds a queued single: the
    // pass that sees this opens a stall episode and wakes the scheduler thread, whose own pass
    // then races with worker 0 delivering its completion.
    let shape = EngineShape { next_level: vec![0, 1], subs: 0 };
    let recorder = Recorder::new();
    let engine = start_engine(&shape, STALL_LEVEL, &recorder);
    let driver = Driver {
        engine: &engine,
        shape: &shape,
        level: STALL_LEVEL,
        recorder: &recorder,
        exclusive: true,
    };
    let mut reports = Vec::new();
    for r in 0..20u16 {
        let mut ops = Vec::new();
        for i in 0..50u16 {
            let group = MemberPlan { tensors: Vec::new(), action: Action::Succeed, delay_us: 0 };
            ops.push(single(0, 1 + (r * 50 + i) % 100));
            ops.push(Op::Submit(TaskPlan {
                kind: TaskKind::NextLevel { first: 0, unknown_target: false },
                members: vec![group.clone(), group],
            }));
            ops.push(single(1, 0));
        }
        let plan = RunPlan { ops, end: RunEnd::Close, gated: false };
        reports.push(driver.run(&plan).unwrap_or_else(|e| panic!("round {r}: {e}")));
    }
    finish_engine(engine, &shape, STALL_LEVEL, &recorder, &reports).unwrap();
}

#[test]
fn ring_peaks_of_a_run_survive_a_concurrent_release_of_the_previous_run() {
    // Four threads run one-task runs back to back; each release may race with another
    // thread's admission and first task.
    let shape = EngineShape { next_level: vec![0], subs: 0 };
    let recorder = Recorder::new();
    let engine = start_engine(&shape, PEAKS_LEVEL, &recorder);
    let single = RunPlan { ops: vec![single(0, 0)], end: RunEnd::Close, gated: false };
    std::thread::scope(|s| {
        for t in 0..4 {
            let (engine, shape, recorder, single) = (&engine, &shape, &recorder, &single);
            s.spawn(move || {
                let driver =
                    Driver { engine, shape, level: PEAKS_LEVEL, recorder, exclusive: false };
                for k in 0..500 {
                    let report = driver.run(single).unwrap_or_else(|e| panic!("{t}/{k}: {e}"));
                    assert!(report.window_peak > 0, "thread {t}, {}: window peak lost", report.run);
                }
            });
        }
    });
}
