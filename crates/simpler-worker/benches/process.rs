//! W4 (`docs/benchmarks-worker.md`): W1 — an L3 run of one chip task `f = a + b` over 1024 f32,
//! submit → wait — with the chip in its own process, against the same run in THREAD mode,
//! measured in the same invocation with the repetitions interleaved (thread, process, thread,
//! …) so that both see the same machine load. Only one worker exists at a time: an idle
//! simulated chip's threads would otherwise compete with the measured one.
//!
//! `cargo bench -p simpler-worker --bench process` prints the median of 7 repetitions of the
//! mean over 400 runs for each mode and the difference; `-- --test` runs each mode briefly.

use std::time::{Duration, Instant};

use simpler_device_a2a3::programs::add;
use simpler_device_a2a3::{Platform, RuntimeVariant};
use simpler_types::{CallConfig, DataType, TaskArgs, WorkerId};
use simpler_worker::{CallableHandle, ChildMode, Orchestration, ProcessOptions, Worker};

const N: u32 = 1024;

struct Setup {
    worker: Worker,
    callable: CallableHandle,
    args: TaskArgs,
}

fn setup(mode: ChildMode) -> Setup {
    let options = ProcessOptions::default().child_path(env!("CARGO_BIN_EXE_simpler-chip-child"));
    let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph)
        .chips(&[0])
        .chip_mode(mode)
        .process_options(options);
    let callable = b.register_chip(add::callable().expect("add"));
    let worker = b.start().expect("start");
    let mem = worker.chip_memory(WorkerId(0)).expect("chip");
    let mut args = TaskArgs::new();
    for _ in 0..3 {
        let buf = mem.malloc(u64::from(N) * 4).expect("malloc");
        args.add_inout(buf.tensor(&[N], DataType::Float32).expect("tensor")).expect("arg");
    }
    Setup { worker, callable, args }
}

fn run_once(s: &Setup) {
    let (h, a) = (s.callable, s.args.clone());
    s.worker
        .run(Orchestration::graph(move |g, _, _| {
            g.submit_next_level(h, a.clone(), &CallConfig::default(), WorkerId(0))?;
            Ok(())
        }))
        .expect("run");
}

/// Mean time of one run over `runs` runs.
fn mean(s: &Setup, runs: usize) -> Duration {
    let t0 = Instant::now();
    for _ in 0..runs {
        run_once(s);
    }
    t0.elapsed() / runs as u32
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let test = std::env::args().any(|a| a == "--test");
    let (reps, runs) = if test { (1, 2) } else { (7, 400) };
    let (mut t, mut p) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        for (mode, out) in [(ChildMode::Thread, &mut t), (ChildMode::Process, &mut p)] {
            let s = setup(mode);
            mean(&s, runs.min(50));
            out.push(mean(&s, runs));
            s.worker.close().expect("close");
        }
    }
    t.sort();
    p.sort();
    let (tm, pm) = (t[t.len() / 2], p[p.len() / 2]);
    println!(
        "W1 thread mode:  median {:>8.2} µs/run (min {:.2}, max {:.2})",
        us(tm),
        us(t[0]),
        us(t[t.len() - 1])
    );
    println!(
        "W4 process mode: median {:>8.2} µs/run (min {:.2}, max {:.2})",
        us(pm),
        us(p[0]),
        us(p[p.len() - 1])
    );
    println!(
        "W4 overhead over thread mode: {:.2} µs/run by median, {:.2} µs/run by minimum (ratio {:.2})",
        us(pm) - us(tm),
        us(p[0]) - us(t[0]),
        us(pm) / us(tm)
    );
}
