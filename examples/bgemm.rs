//! Batched tile GEMM on the simulated chip (benchmark workload S3): `C = Σ_k A[k]·B[k]` with 64×64 f32
//! tiles, 4×4 output tiles and k = 4. Each product runs as an AIC task into a temporary tile;
//! each accumulation `C[i][j] += P` runs as an AIV task ordered on its output tile (InOut), so
//! the 128 tasks form 16 independent chains of GEMM → accumulate pairs.
//!
//! Run it with `cargo run --release --example bgemm [--runtime hbg|trb]` (default hbg). It checks the result against a host
//! GEMM, prints the per-run time, and exits non-zero if the check fails.

mod common;

use std::process::ExitCode;
use std::time::Instant;

use common::Cli;
use simpler_device_a2a3::programs::bgemm::{self, N};
use simpler_device_a2a3::programs::{f32_from_le_bytes, f32_to_le_bytes};
use simpler_device_a2a3::{DeviceRunner, RunRequest, RunnerOptions};
use simpler_types::{CallConfig, DataType, RunId, TaskArgs, Tensor, TensorArgType};

const RUNS: usize = 5;

fn main() -> ExitCode {
    common::main_with(run)
}

fn run(cli: &Cli) -> Result<bool, Box<dyn std::error::Error>> {
    let a: Vec<f32> = (0..N * N).map(|x| ((x * 7) % 13) as f32 * 0.125 - 0.75).collect();
    let b: Vec<f32> = (0..N * N).map(|x| ((x * 5) % 11) as f32 * 0.25 - 1.25).collect();
    let expected = bgemm::tile_major(&bgemm::reference(&a, &b));

    let callable = bgemm::callable()?;
    let mut runner = DeviceRunner::attach(RunnerOptions::sim(0, cli.runtime))?;
    let slot = runner.register_callable(&callable)?;
    let bytes = (N * N * 4) as u64;
    let shape = bgemm::shape();
    let mut args = TaskArgs::new();
    let mut ptrs = Vec::new();
    for (m, tag) in [
        (bgemm::tile_major(&a), TensorArgType::Input),
        (bgemm::tile_major(&b), TensorArgType::Input),
    ] {
        let p = runner.malloc(bytes)?;
        runner.copy_to_device(p, &f32_to_le_bytes(&m))?;
        args.add_tensor(
            Tensor::external(p.addr(), &shape, DataType::Float32)?.child_memory(true),
            tag,
        )?;
        ptrs.push(p);
    }
    let pc = runner.malloc(bytes)?;
    args.add_inout(Tensor::external(pc.addr(), &shape, DataType::Float32)?.child_memory(true))?;
    ptrs.push(pc);

    let cfg = CallConfig::default();
    let mut times = Vec::new();
    // Every run's C is checked (outside the timed part): the product tiles live in the run's
    // heap, where a run whose GEMM tasks wrote nothing would find the previous run's products.
    // The error is the largest over all runs, and a NaN anywhere stays the maximum.
    let mut max_err = 0f32;
    let mut raw = vec![0u8; N * N * 4];
    for run in 0..RUNS as u64 {
        runner.memset(pc, 0, bytes)?;
        let id = RunId::from_raw(run + 1).ok_or("run id")?;
        let t0 = Instant::now();
        runner.run(&RunRequest::new(id, slot, &args, &cfg))?;
        times.push(t0.elapsed());
        runner.copy_from_device(&mut raw, pc)?;
        for (g, w) in f32_from_le_bytes(&raw).iter().zip(&expected) {
            let err = (g - w).abs();
            if err.is_nan() || err > max_err {
                max_err = err;
            }
        }
    }
    for p in ptrs {
        runner.free(p)?;
    }
    runner.finalize()?;

    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
    let ok = max_err <= 1e-5 * scale;
    println!(
        "check: {} (max |C - host GEMM| = {max_err:.3e} over {} elements, {RUNS} runs)",
        if ok { "PASS" } else { "FAIL" },
        N * N
    );
    times.sort();
    println!(
        "per run (64 GEMM + 64 accumulate tasks): median {:.3} ms (min {:.3} ms, max {:.3} ms, {RUNS} runs)",
        times[RUNS / 2].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[RUNS - 1].as_secs_f64() * 1e3
    );
    Ok(ok)
}
