//! The vector example on the simulated chip: `f = (a + b + 1)(a + b + 2) + (a + b)` over 16384
//! f32 values, as five kernel tasks (add, add-scalar, add-scalar, mul, add) built on the host
//! (host_build_graph) and scheduled by the simulated AICPU onto simulated AICore workers.
//!
//! Run it with `cargo run --release --example vector_example [output_dir]`. It checks every
//! element against a host computation, prints the cold and warm per-run times, writes a
//! Perfetto swimlane trace (one lane per simulated core) and exits non-zero if the check fails.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use simpler_device_a2a3::{
    ArgDirection, ChipCallable, CoreCallable, DevicePtr, DeviceRunner, KernelCall, Kernels,
    OrchArgs, OrchConfig, OrchCtx, OrchError, RunRequest, RunnerOptions, RuntimeVariant,
};
use simpler_types::{
    CallConfig, CoreArgs, DataType, RunId, SwimlaneLevel, TaskArgs, Tensor, TensorArgType,
};

const N: usize = 16384;
const ADD: u32 = 0;
const ADD_SCALAR: u32 = 1;
const MUL: u32 = 2;
const WARM_RUNS: usize = 100;

/// `out = x + y`.
unsafe extern "C-unwind" fn add(args: *mut i64) {
    // SAFETY: the runtime passes this kernel's argument vector; the task has three tensors.
    let k = unsafe { KernelCall::from_raw(args, 3) };
    // SAFETY: all three are f32 buffers of this task and the output aliases neither input.
    let (x, y, out) = unsafe { (k.slice::<f32>(0), k.slice::<f32>(1), k.slice_mut::<f32>(2)) };
    if let (Some(x), Some(y), Some(out)) = (x, y, out) {
        for ((o, a), b) in out.iter_mut().zip(x).zip(y) {
            *o = a + b;
        }
    }
}

/// `out = x + s`.
unsafe extern "C-unwind" fn add_scalar(args: *mut i64) {
    // SAFETY: two tensors and one scalar.
    let k = unsafe { KernelCall::from_raw(args, 2) };
    let s: f32 = k.scalar_of(0).unwrap_or(0.0);
    // SAFETY: f32 buffers; the output does not alias the input.
    let (x, out) = unsafe { (k.slice::<f32>(0), k.slice_mut::<f32>(1)) };
    if let (Some(x), Some(out)) = (x, out) {
        for (o, a) in out.iter_mut().zip(x) {
            *o = a + s;
        }
    }
}

/// `out = x * y`.
unsafe extern "C-unwind" fn mul(args: *mut i64) {
    // SAFETY: as `add`.
    let k = unsafe { KernelCall::from_raw(args, 3) };
    // SAFETY: as `add`.
    let (x, y, out) = unsafe { (k.slice::<f32>(0), k.slice::<f32>(1), k.slice_mut::<f32>(2)) };
    if let (Some(x), Some(y), Some(out)) = (x, y, out) {
        for ((o, a), b) in out.iter_mut().zip(x).zip(y) {
            *o = a * b;
        }
    }
}

fn core_args(
    tensors: &[(Tensor, TensorArgType)],
    scalar: Option<f32>,
) -> Result<CoreArgs, OrchError> {
    let mut a = CoreArgs::new();
    for (t, tag) in tensors {
        a.add_tensor(*t, *tag).map_err(|_| OrchError::from_status(-1))?;
    }
    if let Some(s) = scalar {
        a.add_scalar_of(s).map_err(|_| OrchError::from_status(-1))?;
    }
    Ok(a)
}

/// The orchestration: chip arguments `a` (in), `b` (in), `f` (out).
fn orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    use TensorArgType::{Input, Output};
    let missing = OrchError::from_status(-1);
    let (a, b, f) = match (args.tensor(0), args.tensor(1), args.tensor(2)) {
        (Some(a), Some(b), Some(f)) => (*a, *b, *f),
        _ => return Err(missing),
    };
    let shape = a.shape().to_vec();
    let c = ctx.alloc_tensor(&shape, DataType::Float32)?;
    let d = ctx.alloc_tensor(&shape, DataType::Float32)?;
    let e = ctx.alloc_tensor(&shape, DataType::Float32)?;
    let g = ctx.alloc_tensor(&shape, DataType::Float32)?;
    ctx.submit(Kernels::Aiv(ADD), &core_args(&[(a, Input), (b, Input), (c, Output)], None)?)?;
    ctx.submit(Kernels::Aiv(ADD_SCALAR), &core_args(&[(c, Input), (d, Output)], Some(1.0))?)?;
    ctx.submit(Kernels::Aiv(ADD_SCALAR), &core_args(&[(c, Input), (e, Output)], Some(2.0))?)?;
    ctx.submit(Kernels::Aiv(MUL), &core_args(&[(d, Input), (e, Input), (g, Output)], None)?)?;
    ctx.submit(Kernels::Aiv(ADD), &core_args(&[(g, Input), (c, Input), (f, Output)], None)?)?;
    Ok(())
}

fn config(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 3 }
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
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
    let out_dir: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("simpler-vector-example"));

    let a: Vec<f32> = (0..N).map(|i| (i % 97) as f32 * 0.25).collect();
    let b: Vec<f32> = (0..N).map(|i| 1.5 - (i % 13) as f32).collect();
    let expected: Vec<f32> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| {
            let s = x + y;
            (s + 1.0) * (s + 2.0) + s
        })
        .collect();

    use ArgDirection::{In, Out, Scalar};
    let callable = ChipCallable::native(orchestration, config)
        .signature(vec![In, In, Out])
        .kernel(ADD, CoreCallable::native(vec![In, In, Out], add))
        .kernel(ADD_SCALAR, CoreCallable::native(vec![In, Out, Scalar], add_scalar))
        .kernel(MUL, CoreCallable::native(vec![In, In, Out], mul))
        .build()?;

    let mut runner = DeviceRunner::attach(RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph))?;
    let slot = runner.register_callable(&callable)?;
    let bytes = (N * 4) as u64;
    let (pa, pb, pf): (DevicePtr, DevicePtr, DevicePtr) =
        (runner.malloc(bytes)?, runner.malloc(bytes)?, runner.malloc(bytes)?);
    runner.copy_to_device(pa, &to_bytes(&a))?;
    runner.copy_to_device(pb, &to_bytes(&b))?;
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

    let (cold, _) = timed_run(&mut runner, &plain)?;
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

    let traced = CallConfig::builder()
        .swimlane(SwimlaneLevel::AicpuTiming)
        .dep_gen(true)
        .output_prefix(&out_dir)
        .build()?;
    // Poison the output (0xFF bytes are NaN, which equals nothing) so the check below only
    // passes if the checked run itself wrote every element.
    runner.memset(pf, 0xFF, bytes)?;
    let (_, report) = timed_run(&mut runner, &traced)?;

    let mut raw = vec![0u8; N * 4];
    runner.copy_from_device(&mut raw, pf)?;
    let f: Vec<f32> =
        raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let mismatches: Vec<usize> = (0..N).filter(|&i| f[i] != expected[i]).collect();
    for p in [pa, pb, pf] {
        runner.free(p)?;
    }
    runner.finalize()?;

    if mismatches.is_empty() {
        println!("check: PASS ({N} elements match the host computation)");
    } else {
        let i = mismatches[0];
        println!(
            "check: FAIL ({} of {N} elements differ; first at {i}: got {}, expected {})",
            mismatches.len(),
            f[i],
            expected[i]
        );
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
    Ok(mismatches.is_empty())
}
