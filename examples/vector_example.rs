//! The vector example on the simulated chip: `f = (a + b + 1)(a + b + 2) + (a + b)` over 16384
//! f32 values, as five kernel tasks (add, add-scalar, add-scalar, mul, add) built on the host
//! (host_build_graph) and scheduled by the simulated AICPU onto simulated AICore cores.
//!
//! Run it with `cargo run --release --example vector_example [output_dir] [--runtime hbg|trb]`
//! (default hbg). It checks every
//! element against a host computation, prints the cold and warm per-run times, writes a
//! Perfetto swimlane trace (one lane per simulated core) and exits non-zero if the check fails.

mod common;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use common::Cli;
use simpler_device_a2a3::programs::{f32_from_le_bytes, f32_to_le_bytes, vector};
use simpler_device_a2a3::{DevicePtr, DeviceRunner, RunRequest, RunnerOptions};
use simpler_types::{CallConfig, DataType, RunId, SwimlaneLevel, TaskArgs, Tensor};

const N: usize = 16384;
const WARM_RUNS: usize = 100;

fn main() -> ExitCode {
    common::main_with(run)
}

fn run(cli: &Cli) -> Result<bool, Box<dyn std::error::Error>> {
    let out_dir: PathBuf = cli
        .positional
        .first()
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("simpler-vector-example"));

    let a: Vec<f32> = (0..N).map(|i| (i % 97) as f32 * 0.25).collect();
    let b: Vec<f32> = (0..N).map(|i| 1.5 - (i % 13) as f32).collect();
    let expected = vector::reference(&a, &b);

    let callable = vector::callable()?;

    let mut runner = DeviceRunner::attach(RunnerOptions::sim(0, cli.runtime))?;
    let slot = runner.register_callable(&callable)?;
    let bytes = (N * 4) as u64;
    let (pa, pb, pf): (DevicePtr, DevicePtr, DevicePtr) =
        (runner.malloc(bytes)?, runner.malloc(bytes)?, runner.malloc(bytes)?);
    runner.copy_to_device(pa, &f32_to_le_bytes(&a))?;
    runner.copy_to_device(pb, &f32_to_le_bytes(&b))?;
    let tensor = |p: DevicePtr| {
        Tensor::external(p.addr(), &[N as u32], DataType::Float32).map(|t| t.child_memory(true))
    };
    let mut args = TaskArgs::new();
    args.add_input(tensor(pa)?)?.add_input(tensor(pb)?)?.add_output(tensor(pf)?)?;

    let plain = CallConfig::default();
    let mut next_run = 1u64;
    let mut timed_run =
        |runner: &mut DeviceRunner,
         cfg: &CallConfig|
         -> Result<(Duration, simpler_device_a2a3::RunReport), Box<dyn std::error::Error>> {
            let id = RunId::from_raw(next_run).ok_or("run id overflow")?;
            next_run += 1;
            let t0 = Instant::now();
            let report = runner.run(&RunRequest::new(id, slot, &args, cfg))?;
            Ok((t0.elapsed(), report))
        };

    // Before each checked run the output is poisoned (0xFF bytes are NaN, which equals
    // nothing), so that its check passes only if that run wrote every element. The first run is
    // checked as well as the last: its intermediates live in a fresh heap, where a later run's
    // tasks could find the values an earlier run left.
    let output = |runner: &mut DeviceRunner| -> Result<Vec<f32>, Box<dyn std::error::Error>> {
        let mut raw = vec![0u8; N * 4];
        runner.copy_from_device(&mut raw, pf)?;
        Ok(f32_from_le_bytes(&raw))
    };
    runner.memset(pf, 0xFF, bytes)?;
    let (cold, _) = timed_run(&mut runner, &plain)?;
    let first = output(&mut runner)?;
    let mut warm = Vec::with_capacity(WARM_RUNS);
    let mut device_wall = Vec::with_capacity(WARM_RUNS);
    for _ in 0..WARM_RUNS {
        let (t, report) = timed_run(&mut runner, &plain)?;
        warm.push(t);
        if let Some(w) = report.device_wall {
            device_wall.push(w);
        }
    }
    warm.sort();
    device_wall.sort();

    // The checked run also collects the trace and the dependency graph (either runtime).
    let traced = CallConfig::builder()
        .swimlane(SwimlaneLevel::AicpuTiming)
        .dep_gen(true)
        .output_prefix(&out_dir)
        .build()?;
    runner.memset(pf, 0xFF, bytes)?;
    let (_, report) = timed_run(&mut runner, &traced)?;
    let last = output(&mut runner)?;
    for p in [pa, pb, pf] {
        runner.free(p)?;
    }
    runner.finalize()?;

    let mut passed = true;
    for (which, f) in [("first", &first), ("last", &last)] {
        let mismatches: Vec<usize> = (0..N).filter(|&i| f[i] != expected[i]).collect();
        if let Some(&i) = mismatches.first() {
            passed = false;
            println!(
                "check: FAIL in the {which} run ({} of {N} elements differ; first at {i}: got {}, \
                 expected {})",
                mismatches.len(),
                f[i],
                expected[i]
            );
        }
    }
    if passed {
        println!("check: PASS ({N} elements match the host computation, first and last run)");
    }
    println!("cold run (first run on a fresh runner): {:.3} ms", cold.as_secs_f64() * 1e3);
    println!(
        "warm run (median of {WARM_RUNS}): {:.3} ms (min {:.3} ms, max {:.3} ms)",
        warm[WARM_RUNS / 2].as_secs_f64() * 1e3,
        warm[0].as_secs_f64() * 1e3,
        warm[WARM_RUNS - 1].as_secs_f64() * 1e3
    );
    if let Some(w) = device_wall.get(device_wall.len() / 2) {
        println!("device wall time (median): {:.3} ms", w.as_secs_f64() * 1e3);
    }
    match report.outputs.iter().find(|p| p.ends_with("swimlane.perfetto.json")) {
        Some(p) => println!("swimlane trace (open in ui.perfetto.dev): {}", p.display()),
        None => println!("swimlane trace: not written ({})", report.warnings.join("; ")),
    }
    for p in report.outputs.iter().filter(|p| !p.ends_with("swimlane.perfetto.json")) {
        println!("also written: {}", p.display());
    }
    Ok(passed)
}
