//! Worker benchmarks (`docs/benchmarks-worker.md`): W1 (an L3 run of one chip task, submit → wait, against the
//! chip's own `DeviceRunner::run` time), W2 (two chips running the vector program in one L3
//! run) and P6 through the worker (runs of 1..256 host-closure tasks, fit `a + b·tasks`).
//!
//! `cargo bench -p simpler-worker --bench worker` prints the median of 5 repetitions after one
//! warm-up, with min–max. `-- --test` runs every workload once, briefly; `-- w1 --profile`
//! also prints, for W1, each thread's CPU time, run-queue wait and context switches per run.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use simpler_device_a2a3::programs::{add, vector};
use simpler_device_a2a3::{
    ChipCallable, DevicePtr, DeviceRunner, Platform, RunRequest, RunnerOptions, RuntimeVariant,
};
use simpler_types::{CallConfig, DataType, RunId, TaskArgs, Tensor, WorkerId};
use simpler_worker::{CallableHandle, Orchestration, Worker};

/// The vector example's five-task program, or the one-task program `f = a + b`.
fn program(vector_example: bool) -> ChipCallable {
    if vector_example { vector::callable() } else { add::callable() }.expect("valid program")
}

struct Plan {
    reps: usize,
    runs: usize,
    /// Print per-thread CPU time and context switches for W1 (`-- --profile`).
    profile: bool,
}

/// Median, min and max of `reps` repetitions of the mean time of `runs` calls of `f`.
fn measure(plan: &Plan, mut f: impl FnMut()) -> (Duration, Duration, Duration) {
    for _ in 0..plan.runs.min(20) {
        f();
    }
    let mut means: Vec<Duration> = (0..plan.reps)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..plan.runs {
                f();
            }
            t0.elapsed() / plan.runs as u32
        })
        .collect();
    means.sort();
    (means[means.len() / 2], means[0], means[means.len() - 1])
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn report(name: &str, (med, min, max): (Duration, Duration, Duration)) {
    println!("{name:<44} median {:>9.2} µs  (min {:.2}, max {:.2})", us(med), us(min), us(max));
}

const N: u32 = 1024;

/// One thread's scheduler counters: on-CPU time, run-queue wait (both ns, from
/// `/proc/self/task/<tid>/schedstat`), voluntary and involuntary context switches.
#[derive(Clone, Copy, Default)]
struct Sched {
    run_ns: u64,
    wait_ns: u64,
    voluntary: u64,
    involuntary: u64,
}

/// Counters of every live thread, by thread id, with the thread's name.
fn sched_snapshot() -> BTreeMap<String, (String, Sched)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return out };
    for e in dir.flatten() {
        let path = e.path();
        let read = |f: &str| std::fs::read_to_string(path.join(f)).unwrap_or_default();
        let name = read("comm").trim().to_owned();
        let stat = read("schedstat");
        let mut fields = stat.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
        let (run_ns, wait_ns) = (fields.next().unwrap_or(0), fields.next().unwrap_or(0));
        let status = read("status");
        let count = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let s = Sched {
            run_ns,
            wait_ns,
            voluntary: count("voluntary_ctxt_switches:"),
            involuntary: count("nonvoluntary_ctxt_switches:"),
        };
        out.insert(e.file_name().to_string_lossy().into_owned(), (name, s));
    }
    out
}

/// Runs `f` `runs` times and prints, per thread name (digits folded), the on-CPU time,
/// run-queue wait and context switches per run that the threads alive at the end spent.
fn profile_threads(label: &str, runs: usize, mut f: impl FnMut()) {
    let before = sched_snapshot();
    for _ in 0..runs {
        f();
    }
    let after = sched_snapshot();
    let mut by_name: BTreeMap<String, (usize, Sched)> = BTreeMap::new();
    for (tid, (name, a)) in &after {
        let b = before.get(tid).map(|(_, s)| *s).unwrap_or_default();
        let key: String = name.chars().filter(|c| !c.is_ascii_digit()).collect();
        let e = by_name.entry(key).or_default();
        e.0 += 1;
        e.1.run_ns += a.run_ns - b.run_ns;
        e.1.wait_ns += a.wait_ns - b.wait_ns;
        e.1.voluntary += a.voluntary - b.voluntary;
        e.1.involuntary += a.involuntary - b.involuntary;
    }
    let per = |v: u64| v as f64 / runs as f64;
    println!("  threads during {label} (per run; cpu and run-queue wait in µs):");
    let mut total = 0.0;
    for (name, (n, s)) in &by_name {
        if s.run_ns == 0 && s.voluntary == 0 && s.involuntary == 0 {
            continue;
        }
        total += per(s.run_ns) / 1e3;
        println!(
            "    {name:<18} x{n:<2} cpu {:>7.2}  wait {:>7.2}  switches {:>6.2} voluntary, {:>6.2} involuntary",
            per(s.run_ns) / 1e3,
            per(s.wait_ns) / 1e3,
            per(s.voluntary),
            per(s.involuntary)
        );
    }
    println!("    total cpu {total:.2} µs per run");
}

fn device_args(ptrs: &[DevicePtr], n: u32) -> TaskArgs {
    let mut args = TaskArgs::new();
    for (i, p) in ptrs.iter().enumerate() {
        let t =
            Tensor::external(p.addr(), &[n], DataType::Float32).expect("tensor").child_memory(true);
        if i < 2 { args.add_input(t) } else { args.add_output(t) }.expect("arg");
    }
    args
}

fn w1(plan: &Plan) {
    // Baseline: the chip's own run, driven directly.
    let mut runner = DeviceRunner::attach(RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph))
        .expect("attach");
    let slot = runner.register_callable(&program(false)).expect("register");
    let ptrs: Vec<DevicePtr> =
        (0..3).map(|_| runner.malloc(u64::from(N) * 4).expect("malloc")).collect();
    let args = device_args(&ptrs, N);
    let cfg = CallConfig::default();
    let mut next = 1u64;
    let chip = measure(plan, || {
        let id = RunId::from_raw(next).expect("id");
        next += 1;
        runner.run(&RunRequest::new(id, slot, &args, &cfg)).expect("chip run");
    });
    report("W1 baseline: DeviceRunner::run (1 task)", chip);
    if plan.profile {
        profile_threads("the baseline", plan.runs, || {
            let id = RunId::from_raw(next).expect("id");
            next += 1;
            runner.run(&RunRequest::new(id, slot, &args, &cfg)).expect("chip run");
        });
    }

    // The same run on another thread behind a channel: the cost of one hand-off each way.
    let (job_tx, job_rx) = std::sync::mpsc::channel::<u64>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let lane = std::thread::spawn(move || {
        while let Ok(id) = job_rx.recv() {
            let id = RunId::from_raw(id).expect("id");
            runner.run(&RunRequest::new(id, slot, &args, &cfg)).expect("chip run");
            let _ = done_tx.send(());
        }
    });
    let hand_off = measure(plan, || {
        job_tx.send(next).expect("send");
        next += 1;
        done_rx.recv().expect("done");
    });
    report("W1 reference: the same run behind a channel", hand_off);
    drop(job_tx);
    lane.join().expect("lane");

    let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).chips(&[0]);
    let h = b.register_chip(program(false));
    let w = b.start().expect("start");
    let mem = w.chip_memory(WorkerId(0)).expect("chip");
    let bufs: Vec<_> = (0..3).map(|_| mem.malloc(u64::from(N) * 4).expect("malloc")).collect();
    let ptrs: Vec<DevicePtr> = bufs.iter().map(|b| DevicePtr(b.addr())).collect();
    let args = device_args(&ptrs, N);
    let l3 = measure(plan, || {
        let a = args.clone();
        w.run(Orchestration::graph(move |g, _, _| {
            g.submit_next_level(h, a.clone(), &CallConfig::default(), WorkerId(0))?;
            Ok(())
        }))
        .expect("l3 run");
    });
    report("W1: L3 run of 1 chip task, submit -> wait", l3);
    if plan.profile {
        profile_threads("the L3 runs", plan.runs, || {
            let a = args.clone();
            w.run(Orchestration::graph(move |g, _, _| {
                g.submit_next_level(h, a.clone(), &CallConfig::default(), WorkerId(0))?;
                Ok(())
            }))
            .expect("l3 run");
        });
    }
    println!(
        "W1 overhead on top of the chip's run: {:.2} µs/run by median, {:.2} µs/run by minimum",
        us(l3.0) - us(chip.0),
        us(l3.1) - us(chip.1)
    );
}

fn w2(plan: &Plan) {
    let n = 16384;
    let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph)
        .chips(&[0, 1])
        .sub_workers(1);
    let h = b.register_chip(program(true));
    let w = b.start().expect("start");
    let mut per_chip = Vec::new();
    for chip in [WorkerId(0), WorkerId(1)] {
        let mem = w.chip_memory(chip).expect("chip");
        let ptrs: Vec<DevicePtr> = (0..3)
            .map(|_| DevicePtr(mem.malloc(u64::from(n) * 4).expect("malloc").addr()))
            .collect();
        per_chip.push((chip, device_args(&ptrs, n)));
    }
    let r = measure(plan, || {
        let p = per_chip.clone();
        w.run(Orchestration::graph(move |g, _, _| {
            for (chip, a) in &p {
                g.submit_next_level(h, a.clone(), &CallConfig::default(), *chip)?;
            }
            Ok(())
        }))
        .expect("w2 run");
    });
    report("W2: 2 chips x vector program (16384 f32)", r);
}

fn p6(plan: &Plan) {
    let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(2);
    let noop: CallableHandle = b.register_host("noop", |_| Ok(()));
    let w = b.start().expect("start");
    let sizes = [1usize, 4, 16, 64, 256];
    let mut points = Vec::new();
    for &tasks in &sizes {
        let r = measure(plan, || {
            w.run(Orchestration::graph(move |g, _, _| {
                for _ in 0..tasks {
                    g.submit_sub(noop, TaskArgs::new())?;
                }
                Ok(())
            }))
            .expect("p6 run");
        });
        report(&format!("P6: run of {tasks} host-closure task(s)"), r);
        points.push((tasks as f64, us(r.0)));
    }
    let n = points.len() as f64;
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (sxx, sxy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x * x, b + x * y));
    let slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    let intercept = (sy - slope * sx) / n;
    println!("P6 fit: a = {intercept:.2} µs per run, b = {slope:.3} µs per task");
}

fn main() {
    let test = std::env::args().any(|a| a == "--test");
    let profile = std::env::args().any(|a| a == "--profile");
    let plan = if test {
        Plan { reps: 1, runs: 2, profile }
    } else {
        Plan { reps: 5, runs: 400, profile }
    };
    // Positional arguments select workloads (`w1`, `w2`, `p6`); none selects all.
    let picked: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let run = |name: &str| picked.is_empty() || picked.iter().any(|p| p == name);
    if run("w1") {
        w1(&plan);
    }
    if run("w2") {
        w2(&Plan { runs: plan.runs / 4 + 1, ..plan });
    }
    if run("p6") {
        p6(&Plan { runs: plan.runs / 4 + 1, ..plan });
    }
}
