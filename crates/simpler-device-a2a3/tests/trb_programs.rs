//! The reference programs under tensormap_and_ringbuffer on the simulated chip: each runs on
//! both runtimes and the outputs must be equal bit for bit.

mod common;

use common::*;
use simpler_device_a2a3::programs::{add, bgemm, vector};
use simpler_device_a2a3::{
    ChipCallable, ChipSlot, DeviceRunner, RingDefaults, RunReport, RunRequest, RunnerOptions,
    RuntimeVariant,
};
use simpler_types::{CallConfig, DataType, RunId, TaskArgs, Tensor, TensorArgType};

/// Options for `runtime` with the usual generous budgets.
fn options_for(runtime: RuntimeVariant) -> RunnerOptions {
    let mut o = options(0);
    o.runtime = runtime;
    o
}

/// One argument of a program run: host values, tag and shape.
struct Arg {
    values: Vec<f32>,
    tag: TensorArgType,
    shape: Vec<u32>,
}

/// Runs `slot` once with `args` and returns the bytes of every written argument and the run's
/// report.
fn run_once(
    r: &mut DeviceRunner,
    slot: ChipSlot,
    run: u64,
    args: &[Arg],
    cfg: &CallConfig,
) -> (Vec<u8>, RunReport) {
    let mut ptrs = Vec::new();
    let mut task_args = TaskArgs::new();
    for a in args {
        let (p, flat) = upload_f32(r, &a.values);
        let t =
            Tensor::external(flat.addr, &a.shape, DataType::Float32).unwrap().child_memory(true);
        task_args.add_tensor(t, a.tag).unwrap();
        ptrs.push(p);
    }
    let req = RunRequest::new(RunId::from_raw(run).unwrap(), slot, &task_args, cfg);
    let report = r.run(&req).unwrap();
    let mut out = Vec::new();
    for (a, p) in args.iter().zip(&ptrs) {
        if a.tag != TensorArgType::Input {
            let mut bytes = vec![0u8; a.values.len() * 4];
            r.copy_from_device(&mut bytes, *p).unwrap();
            out.extend_from_slice(&bytes);
        }
    }
    for p in ptrs {
        r.free(p).unwrap();
    }
    (out, report)
}

fn vector_args(n: usize) -> Vec<Arg> {
    let a = (0..n).map(|i| i as f32 * 0.5).collect();
    let b = (0..n).map(|i| 3.0 - i as f32).collect();
    let shape = vec![n as u32];
    vec![
        Arg { values: a, tag: TensorArgType::Input, shape: shape.clone() },
        Arg { values: b, tag: TensorArgType::Input, shape: shape.clone() },
        Arg { values: vec![0.0; n], tag: TensorArgType::Output, shape },
    ]
}

fn bgemm_args() -> Vec<Arg> {
    let n = bgemm::N * bgemm::N;
    let a: Vec<f32> = (0..n).map(|x| ((x * 7) % 13) as f32 * 0.125).collect();
    let b: Vec<f32> = (0..n).map(|x| ((x * 5) % 11) as f32 * 0.25).collect();
    let shape = bgemm::shape().to_vec();
    vec![
        Arg { values: bgemm::tile_major(&a), tag: TensorArgType::Input, shape: shape.clone() },
        Arg { values: bgemm::tile_major(&b), tag: TensorArgType::Input, shape: shape.clone() },
        Arg { values: vec![0.0; n], tag: TensorArgType::InOut, shape },
    ]
}

/// Runs `callable` with `args` on both runtimes and returns trb's output after checking it
/// equals hbg's bit for bit.
fn same_on_both(callable: &ChipCallable, args: &[Arg], cfg: &CallConfig) -> Vec<u8> {
    let mut outputs = Vec::new();
    for runtime in [RuntimeVariant::HostBuildGraph, RuntimeVariant::TensormapAndRingbuffer] {
        let mut r = DeviceRunner::attach(options_for(runtime)).unwrap();
        let slot = r.register_callable(callable).unwrap();
        outputs.push(run_once(&mut r, slot, 1, args, cfg).0);
        r.finalize().unwrap();
    }
    assert!(outputs[0] == outputs[1], "trb's output differs from hbg's");
    outputs.pop().unwrap()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

#[test]
fn add_gives_the_same_bits_on_both_runtimes() {
    let args = vector_args(4096);
    let got = f32s(&same_on_both(&add::callable().unwrap(), &args, &CallConfig::default()));
    assert_eq!(got, add::reference(&args[0].values, &args[1].values));
}

#[test]
fn vector_gives_the_same_bits_on_both_runtimes() {
    let args = vector_args(16384);
    let got = f32s(&same_on_both(&vector::callable().unwrap(), &args, &CallConfig::default()));
    assert_eq!(got, vector::reference(&args[0].values, &args[1].values));
}

#[test]
fn bgemm_gives_the_same_bits_on_both_runtimes() {
    let args = bgemm_args();
    let cfg = CallConfig::builder().block_dim(3).build().unwrap();
    let got = f32s(&same_on_both(&bgemm::callable().unwrap(), &args, &cfg));
    let n = bgemm::N * bgemm::N;
    let a: Vec<f32> = (0..n).map(|x| ((x * 7) % 13) as f32 * 0.125).collect();
    let b: Vec<f32> = (0..n).map(|x| ((x * 5) % 11) as f32 * 0.25).collect();
    let want = bgemm::tile_major(&bgemm::reference(&a, &b));
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    let max_err = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
    assert!(max_err <= 1e-5 * scale, "max error {max_err}");
}

#[test]
fn trb_runs_repeat_on_one_runner_with_small_rings_and_report_high_water_marks() {
    let mut o = options_for(RuntimeVariant::TensormapAndRingbuffer);
    o.rings = RingDefaults { task_window: 16, heap_bytes: 1 << 20, dep_pool: 16 };
    let mut r = DeviceRunner::attach(o).unwrap();
    let slot = r.register_callable(&vector::callable().unwrap()).unwrap();
    let args = vector_args(1024);
    let want = vector::reference(&args[0].values, &args[1].values);
    for run in 1..=3 {
        let (bytes, report) = run_once(&mut r, slot, run, &args, &CallConfig::default());
        assert_eq!(f32s(&bytes), want, "run {run}");
        // Five tasks at the top level, all held by the outer scope; four buffers of 4 KiB.
        assert_eq!(report.tasks, 5, "run {run}");
        assert_eq!(report.rings[0].task_window_max, 5, "run {run}");
        assert_eq!(report.rings[0].heap_max, 4 * 4096, "run {run}");
    }
    r.finalize().unwrap();
}
