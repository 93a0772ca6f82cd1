//! Batched tile GEMM on the simulated chip (spec 70, S3): `C = Σ_k A[k]·B[k]` with 64×64 f32
//! tiles, 4×4 output tiles and k = 4. Each product runs as an AIC task into a temporary tile;
//! each accumulation `C[i][j] += P` runs as an AIV task ordered on its output tile (InOut), so
//! the 128 tasks form 16 independent chains of GEMM → accumulate pairs.
//!
//! Run it with `cargo run --release --example bgemm`. It checks the result against a host
//! GEMM, prints the per-run time, and exits non-zero if the check fails.

use std::process::ExitCode;
use std::time::Instant;

use simpler_device_a2a3::{
    ArgDirection, ChipCallable, CoreCallable, DeviceRunner, KernelCall, Kernels, OrchArgs,
    OrchConfig, OrchCtx, OrchError, RunRequest, RunnerOptions, RuntimeVariant,
};
use simpler_types::{CallConfig, CoreArgs, DataType, RunId, TaskArgs, Tensor, TensorArgType};

const TILE: usize = 64;
const TILES: usize = 4;
const N: usize = TILE * TILES;
const GEMM: u32 = 0;
const ACC: u32 = 1;
const RUNS: usize = 5;

/// `p = a · b` for one tile.
unsafe extern "C-unwind" fn gemm(args: *mut i64) {
    // SAFETY: the runtime passes this kernel's argument vector; the task has three tensors.
    let k = unsafe { KernelCall::from_raw(args, 3) };
    // SAFETY: three contiguous 64×64 f32 tiles; the output aliases neither input.
    let views = unsafe { (k.slice::<f32>(0), k.slice::<f32>(1), k.slice_mut::<f32>(2)) };
    if let (Some(a), Some(b), Some(p)) = views {
        p.fill(0.0);
        for i in 0..TILE {
            let prow = &mut p[i * TILE..(i + 1) * TILE];
            for (kk, &aik) in a[i * TILE..(i + 1) * TILE].iter().enumerate() {
                for (pv, bv) in prow.iter_mut().zip(&b[kk * TILE..(kk + 1) * TILE]) {
                    *pv += aik * bv;
                }
            }
        }
    }
}

/// `c += p` for one tile.
unsafe extern "C-unwind" fn accumulate(args: *mut i64) {
    // SAFETY: two tensors.
    let k = unsafe { KernelCall::from_raw(args, 2) };
    // SAFETY: contiguous f32 tiles; `c` does not alias `p`.
    let views = unsafe { (k.slice_mut::<f32>(0), k.slice::<f32>(1)) };
    if let (Some(c), Some(p)) = views {
        for (c, p) in c.iter_mut().zip(p) {
            *c += p;
        }
    }
}

fn kernel_args(ts: &[(Tensor, TensorArgType)]) -> Result<CoreArgs, OrchError> {
    let mut a = CoreArgs::new();
    for (t, tag) in ts {
        a.add_tensor(*t, *tag).map_err(|_| OrchError::from_status(-1))?;
    }
    Ok(a)
}

/// Chip arguments: A and B (inputs) and C (accumulated), all tile-major `[4, 4, 64, 64]`.
fn orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    use TensorArgType::{InOut, Input, Output};
    let bad = OrchError::from_status(-1);
    let (a, b, c) = match (args.tensor(0), args.tensor(1), args.tensor(2)) {
        (Some(a), Some(b), Some(c)) => (*a, *b, *c),
        _ => return Err(bad),
    };
    let t = TILE as u32;
    let tile =
        |m: &Tensor, r: u32, col: u32| m.view(&[1, 1, t, t], &[r, col, 0, 0]).map_err(|_| bad);
    for i in 0..TILES as u32 {
        for j in 0..TILES as u32 {
            for k in 0..TILES as u32 {
                let p = ctx.alloc_tensor(&[1, 1, t, t], DataType::Float32)?;
                let product = [(tile(&a, i, k)?, Input), (tile(&b, k, j)?, Input), (p, Output)];
                ctx.submit(Kernels::Aic(GEMM), &kernel_args(&product)?)?;
                ctx.submit(
                    Kernels::Aiv(ACC),
                    &kernel_args(&[(tile(&c, i, j)?, InOut), (p, Input)])?,
                )?;
            }
        }
    }
    Ok(())
}

fn config(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 3 }
}

/// Row-major `N × N` to tile-major `[4, 4, 64, 64]`.
fn tile_major(m: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0; N * N];
    for r in 0..N {
        for c in 0..N {
            out[((r / TILE * TILES + c / TILE) * TILE + r % TILE) * TILE + c % TILE] = m[r * N + c];
        }
    }
    out
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let a: Vec<f32> = (0..N * N).map(|x| ((x * 7) % 13) as f32 * 0.125 - 0.75).collect();
    let b: Vec<f32> = (0..N * N).map(|x| ((x * 5) % 11) as f32 * 0.25 - 1.25).collect();
    let mut host = vec![0f32; N * N];
    for r in 0..N {
        for k in 0..N {
            let x = a[r * N + k];
            for c in 0..N {
                host[r * N + c] += x * b[k * N + c];
            }
        }
    }
    let expected = tile_major(&host);

    use ArgDirection::{In, InOut, Out};
    let callable = ChipCallable::native(orchestration, config)
        .signature(vec![In, In, InOut])
        .kernel(GEMM, CoreCallable::native(vec![In, In, Out], gemm))
        .kernel(ACC, CoreCallable::native(vec![InOut, In], accumulate))
        .build()?;
    let mut runner = DeviceRunner::attach(RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph))?;
    let slot = runner.register_callable(&callable)?;
    let bytes = (N * N * 4) as u64;
    let shape = [TILES as u32, TILES as u32, TILE as u32, TILE as u32];
    let mut args = TaskArgs::new();
    let mut ptrs = Vec::new();
    for (m, tag) in [(tile_major(&a), TensorArgType::Input), (tile_major(&b), TensorArgType::Input)]
    {
        let p = runner.malloc(bytes)?;
        let raw: Vec<u8> = m.iter().flat_map(|v| v.to_le_bytes()).collect();
        runner.copy_to_device(p, &raw)?;
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
    for run in 0..RUNS as u64 {
        runner.memset(pc, 0, bytes)?;
        let id = RunId::from_raw(run + 1).ok_or("run id")?;
        let t0 = Instant::now();
        runner.run(&RunRequest::new(id, slot, &args, &cfg))?;
        times.push(t0.elapsed());
    }
    let mut raw = vec![0u8; N * N * 4];
    runner.copy_from_device(&mut raw, pc)?;
    for p in ptrs {
        runner.free(p)?;
    }
    runner.finalize()?;

    let got: Vec<f32> =
        raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let max_err = got.iter().zip(&expected).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
    let ok = max_err <= 1e-5 * scale;
    println!(
        "check: {} (max |C - host GEMM| = {max_err:.3e} over {} elements)",
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
