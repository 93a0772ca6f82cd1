//! Pipelined runs through an L2 worker (`docs/pipelining.md`), depth 1 against depth 2 in the
//! same invocation, alternating:
//!
//! - **W3**: back-to-back runs of the vector program (16384 f32) whose simulated device time is
//!   set, with the simulator's kernel-delay hook, to about its measured host preparation time
//!   (the delay parks the simulated core like a real device does not use a host CPU).
//!   Throughput (runs/s) and per-run latency (submit → result) at each depth.
//! - **W3 parked**: the same with one cluster (`block_dim` 1) over 1024 f32 and a fixed 300 µs
//!   kernel delay, so most of the device time is parked rather than simulated on the host's
//!   cores — closer to a real chip, whose execution does not compete with host preparation.
//! - **S1 back to back**: the same program with no delay, 100 runs at each depth; and S1
//!   serial (`run` = submit + wait, one run at a time), which pipelining cannot speed up and
//!   must not slow down much (the lane polls a run in flight between jobs).
//!
//! - **Runner modes**: the same shapes on a runner directly, so the lane's hand-offs are out of
//!   the picture: depth 1 (`run`), depth 2 (prepare N+1 while N executes, launch it after
//!   reaping N) and queued (device queueing: N+1 is launched before N is reaped). Per run the
//!   host time of each phase (prepare, launch, the wait in reap, complete) is reported, which
//!   says where the host time goes.
//!
//! `cargo bench --bench pipelined [-- RUNS ROUNDS]` (defaults 1000 and 3; `-- --test` runs
//! a short version). Plain timing with medians over the rounds, not criterion: one sample is
//! a whole stream of runs.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use simpler::device_a2a3::programs::{f32_to_le_bytes, vector};
use simpler::device_a2a3::{DeviceRunner, Platform, RunRequest, RunnerOptions, RuntimeVariant};
use simpler::types::{CallConfig, DataType, RunId, TaskArgs, Tensor, WorkerId};
use simpler::worker::{ChipMemory, Orchestration, Worker};

const N: usize = 16384;

/// One workload of the stream: elements, cluster count (0 = default), kernel delay.
#[derive(Clone, Copy)]
struct Shape {
    n: usize,
    block_dim: u32,
    delay: Option<Duration>,
}

fn program_args(mem: &ChipMemory<'_>, n: usize) -> TaskArgs {
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 - (i % 13) as f32).collect();
    let mut args = TaskArgs::new();
    for (i, data) in [Some(&a), Some(&b), None].into_iter().enumerate() {
        let buf = mem.malloc((n * 4) as u64).expect("malloc");
        if let Some(d) = data {
            mem.copy_to(&buf, 0, &f32_to_le_bytes(d)).expect("copy");
        }
        let t = buf.tensor(&[n as u32], DataType::Float32).expect("tensor");
        if i < 2 { args.add_input(t) } else { args.add_output(t) }.expect("arg");
    }
    args
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Host preparation time and device time (launch → reaped) of one run of the program,
/// measured on a runner directly (medians of `samples`).
fn calibrate(samples: usize) -> (Duration, Duration) {
    let mut r = DeviceRunner::attach(RunnerOptions::sim(9, RuntimeVariant::HostBuildGraph))
        .expect("attach");
    let slot = r.register_callable(&vector::callable().expect("program")).expect("register");
    let mut args = TaskArgs::new();
    let mut ptrs = Vec::new();
    for i in 0..3 {
        let p = r.malloc((N * 4) as u64).expect("malloc");
        ptrs.push(p);
        let t = Tensor::external(p.addr(), &[N as u32], DataType::Float32)
            .expect("tensor")
            .child_memory(true);
        if i < 2 { args.add_input(t) } else { args.add_output(t) }.expect("arg");
    }
    let cfg = CallConfig::default();
    let (mut prep, mut device) = (Vec::new(), Vec::new());
    for i in 0..samples {
        let id = RunId::from_raw(i as u64 + 1).expect("id");
        let t0 = Instant::now();
        let p = r.prepare(&RunRequest::new(id, slot, &args, &cfg)).expect("prepare");
        let t1 = Instant::now();
        let a = r.launch_run(p).expect("launch");
        r.reap_run(&a, None).expect("reap");
        let t2 = Instant::now();
        r.complete_run(a).expect("complete");
        prep.push(t1 - t0);
        device.push(t2 - t1);
    }
    for p in ptrs {
        r.free(p).expect("free");
    }
    r.finalize().expect("finalize");
    (median(prep), median(device))
}

/// How a runner-level stream drives its runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// `run`: prepare, launch, reap, complete, one run at a time.
    Depth1,
    /// Prepare N+1 while N executes; launch N+1 after reaping N.
    Depth2,
    /// Device queueing: prepare and launch N+1 while N executes, then reap N.
    Queued,
}

/// Host time per phase, summed over a runner-level stream.
#[derive(Default, Clone, Copy)]
struct Phases {
    prepare: Duration,
    launch: Duration,
    reap: Duration,
    complete: Duration,
}

/// `runs` back-to-back runs on a runner directly in `mode`; wall time per run and the host
/// time of each phase per run.
fn runner_stream(mode: Mode, runs: usize, shape: Shape) -> (Duration, Phases) {
    let opts = RunnerOptions::sim(8, RuntimeVariant::HostBuildGraph)
        .with_pipeline_slots(if mode == Mode::Depth1 { 1 } else { 2 })
        .with_device_queue(mode == Mode::Queued);
    let mut r = DeviceRunner::attach(opts).expect("attach");
    let slot = r.register_callable(&vector::callable().expect("program")).expect("register");
    let mut args = TaskArgs::new();
    let mut ptrs = Vec::new();
    for i in 0..3 {
        let p = r.malloc((shape.n * 4) as u64).expect("malloc");
        ptrs.push(p);
        let t = Tensor::external(p.addr(), &[shape.n as u32], DataType::Float32)
            .expect("tensor")
            .child_memory(true);
        if i < 2 { args.add_input(t) } else { args.add_output(t) }.expect("arg");
    }
    if let Some(d) = shape.delay {
        r.sim_faults().expect("sim").kernel_delay(vector::MUL, d);
    }
    let cfg = CallConfig::builder().block_dim(shape.block_dim).build().expect("config");
    let mut ph = Phases::default();
    let timed = |acc: &mut Duration, t: Instant| *acc += t.elapsed();
    let mut next_id = 0u64;
    let mut req_id = || {
        next_id += 1;
        RunId::from_raw(next_id).expect("id")
    };
    let t0 = Instant::now();
    let mut in_flight = None;
    for i in 0..=runs {
        // Prepare run i (while run i-1 executes at depth 2 and queued).
        let mut prepared = (i < runs).then(|| {
            let t = Instant::now();
            let p = r.prepare(&RunRequest::new(req_id(), slot, &args, &cfg)).expect("prepare");
            timed(&mut ph.prepare, t);
            p
        });
        let mut launch = |r: &mut DeviceRunner, p| {
            let t = Instant::now();
            let a = r.launch_run(p).expect("launch");
            timed(&mut ph.launch, t);
            a
        };
        let mut queued = None;
        if mode == Mode::Queued {
            queued = prepared.take().map(|p| launch(&mut r, p));
        }
        if let Some(a) = in_flight.take() {
            let t = Instant::now();
            r.reap_run(&a, None).expect("reap");
            timed(&mut ph.reap, t);
            let t = Instant::now();
            r.complete_run(a).expect("complete");
            timed(&mut ph.complete, t);
        }
        in_flight = match mode {
            Mode::Queued => queued,
            Mode::Depth1 | Mode::Depth2 => {
                let a = prepared.take().map(|p| launch(&mut r, p));
                if mode == Mode::Depth1
                    && let Some(a) = a
                {
                    let t = Instant::now();
                    r.reap_run(&a, None).expect("reap");
                    timed(&mut ph.reap, t);
                    let t = Instant::now();
                    r.complete_run(a).expect("complete");
                    timed(&mut ph.complete, t);
                    None
                } else {
                    a
                }
            }
        };
    }
    let total = t0.elapsed();
    for p in ptrs {
        r.free(p).expect("free");
    }
    r.finalize().expect("finalize");
    let per = |d: Duration| d / runs as u32;
    let phases = Phases {
        prepare: per(ph.prepare),
        launch: per(ph.launch),
        reap: per(ph.reap),
        complete: per(ph.complete),
    };
    (total / runs as u32, phases)
}

struct Stream {
    per_run: Duration,
    latency: Duration,
    serial: Duration,
}

/// `runs` back-to-back submits through an L2 worker with `slots` resource slots (depth
/// `min(slots, 2)`); a waiter thread takes the results in order.
fn stream(slots: usize, runs: usize, shape: Shape) -> Stream {
    let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph)
        .chip_options(move |o| o.with_pipeline_slots(slots));
    let h = b.register_chip(vector::callable().expect("program"));
    let w = b.start().expect("start");
    assert_eq!(w.pipeline_depth(), slots.min(2));
    let args = program_args(&w.memory().expect("memory"), shape.n);
    let cfg = CallConfig::builder().block_dim(shape.block_dim).build().expect("config");
    let run = || Orchestration::chip(h, args.clone()).config(cfg.clone());
    if let Some(d) = shape.delay {
        w.with_sim_faults(WorkerId(0), move |plan| plan.kernel_delay(vector::MUL, d))
            .expect("fault plan");
    }
    // Warm up (arenas of every slot).
    for _ in 0..4 {
        w.run(run()).expect("warm-up run");
    }
    let (tx, rx) = mpsc::channel::<(Instant, simpler::worker::RunHandle)>();
    let waiter = std::thread::spawn(move || {
        let mut latencies = Vec::new();
        for (submitted, handle) in rx {
            handle.wait().expect("run");
            latencies.push(submitted.elapsed());
        }
        latencies
    });
    let mut serial = Vec::new();
    for _ in 0..runs.min(100) {
        let t = Instant::now();
        w.run(run()).expect("serial run");
        serial.push(t.elapsed());
    }
    let t0 = Instant::now();
    for _ in 0..runs {
        let submitted = Instant::now();
        let handle = w.submit(run()).expect("submit");
        tx.send((submitted, handle)).expect("waiter");
    }
    drop(tx);
    let latencies = waiter.join().expect("waiter thread");
    let total = t0.elapsed();
    w.close().expect("close");
    Stream { per_run: total / runs as u32, latency: median(latencies), serial: median(serial) }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let quick = std::env::args().any(|a| a == "--test");
    let runs: usize =
        args.first().and_then(|s| s.parse().ok()).unwrap_or(if quick { 20 } else { 1000 });
    let rounds: usize =
        args.get(1).and_then(|s| s.parse().ok()).unwrap_or(if quick { 1 } else { 3 });
    let s1_runs = if quick { 10 } else { 100 };

    let (prep, device) = calibrate(if quick { 5 } else { 50 });
    // The hook can only lengthen the device time: when the device is already slower than the
    // host preparation, W3 runs with no delay and the report says so.
    let delay = prep.saturating_sub(device);
    let device_w3 = device + delay;
    println!(
        "calibration: host preparation {:.1} us, device time {:.1} us without delay; W3 adds a {:.1} us kernel delay (device time about {:.1} us)",
        prep.as_secs_f64() * 1e6,
        device.as_secs_f64() * 1e6,
        delay.as_secs_f64() * 1e6,
        device_w3.as_secs_f64() * 1e6,
    );
    let w3_shape = Shape { n: N, block_dim: 0, delay: Some(delay).filter(|d| !d.is_zero()) };
    let parked = Shape { n: 1024, block_dim: 1, delay: Some(Duration::from_micros(300)) };
    let s1_shape = Shape { n: N, block_dim: 0, delay: None };
    let mut w3: [Vec<Stream>; 2] = [Vec::new(), Vec::new()];
    let mut w3p: [Vec<Stream>; 2] = [Vec::new(), Vec::new()];
    let mut s1: [Vec<Stream>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (i, slots) in [1usize, 2].into_iter().enumerate() {
            w3[i].push(stream(slots, runs, w3_shape));
            w3p[i].push(stream(slots, runs, parked));
            s1[i].push(stream(slots, s1_runs, s1_shape));
        }
    }
    let modes = [Mode::Depth1, Mode::Depth2, Mode::Queued];
    for (name, n, shape) in [
        ("W3 runner", runs, w3_shape),
        ("W3 parked runner", runs, parked),
        ("S1 runner", s1_runs, s1_shape),
    ] {
        let mut per_mode = Vec::new();
        for mode in modes {
            let mut walls = Vec::new();
            let mut last = Phases::default();
            for _ in 0..rounds {
                let (wall, ph) = runner_stream(mode, n, shape);
                walls.push(wall);
                last = ph;
            }
            per_mode.push((mode, median(walls), last));
        }
        let d1 = per_mode[0].1;
        for (mode, wall, ph) in per_mode {
            println!(
                "{name}: {n} runs, {mode:?}: {:.1} us/run ({:.2}x depth 1); host per run: prepare {:.1} us, launch {:.1} us, reap wait {:.1} us, complete {:.1} us",
                wall.as_secs_f64() * 1e6,
                d1.as_secs_f64() / wall.as_secs_f64(),
                ph.prepare.as_secs_f64() * 1e6,
                ph.launch.as_secs_f64() * 1e6,
                ph.reap.as_secs_f64() * 1e6,
                ph.complete.as_secs_f64() * 1e6,
            );
        }
    }
    let med = |v: &[Stream], f: fn(&Stream) -> Duration| median(v.iter().map(f).collect());
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for (name, n, data) in
        [("W3", runs, &w3), ("W3 parked", runs, &w3p), ("S1 back to back", s1_runs, &s1)]
    {
        let d1 = med(&data[0], |s| s.per_run);
        let d2 = med(&data[1], |s| s.per_run);
        println!(
            "{name}: {n} runs x {rounds} rounds: depth 1 {:.1} us/run (latency {:.1} us, serial run {:.1} us), depth 2 {:.1} us/run (latency {:.1} us, serial run {:.1} us); throughput depth 2 / depth 1 = {:.2}x",
            us(d1),
            us(med(&data[0], |s| s.latency)),
            us(med(&data[0], |s| s.serial)),
            us(d2),
            us(med(&data[1], |s| s.latency)),
            us(med(&data[1], |s| s.serial)),
            d1.as_secs_f64() / d2.as_secs_f64(),
        );
    }
}
