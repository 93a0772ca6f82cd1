//! The reference programs under tensormap_and_ringbuffer on the simulated chip: each runs on
//! both runtimes and the outputs must be equal bit for bit.

mod common;

use common::*;
use simpler_device_a2a3::programs::{add, bgemm, vector};
use simpler_device_a2a3::{
    ChipCallable, ChipSlot, DeviceRunner, NativeConfigFn, NativeOrchFn, RingDefaults, RunReport,
    RunRequest, RunnerOptions, RuntimeVariant,
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
        // Five tasks at the top level and the holder of their four 4 KiB buffers, all held by
        // the outer scope.
        assert_eq!(report.tasks, 5, "run {run}");
        assert_eq!(report.rings[0].task_window_max, 6, "run {run}");
        assert_eq!(report.rings[0].heap_max, 4 * 4096, "run {run}");
    }
    r.finalize().unwrap();
}

// Ring stalls: each scenario fills ring 1 (the first nested scope) with tasks its open scope
// holds, so no completion can make room; the run must end with the typed stall naming the ring,
// its three sizes and its usage, and the runner must serve the next run.

use simpler_device_a2a3::abi::codes::RuntimeCode;
use simpler_device_a2a3::{DeviceError, OrchArgs, OrchConfig, OrchCtx, OrchError};
use simpler_types::{CoreArgs, RingOverride, RingSel};

const SCOPE: u64 = 0;
const HEAP: u64 = 1;
const DEP_POOL: u64 = 2;
const TENSOR_MAP: u64 = 3;

fn one_tensor_one_scalar(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 2 }
}

fn core_args(tensors: &[(Tensor, TensorArgType)]) -> Result<CoreArgs, OrchError> {
    let mut a = CoreArgs::new();
    for (t, tag) in tensors {
        a.add_tensor(*t, *tag).map_err(|_| OrchError::from_status(-1))?;
    }
    Ok(a)
}

/// Scenario `scalar 0` inside one scope, over the scratch buffer `tensor 0` (256 f32).
fn stalling_orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    use TensorArgType::{Input, Output};
    let bad = || OrchError::from_status(-1);
    let scratch = *args.tensor(0).ok_or_else(bad)?;
    let scenario = args.scalar(0).ok_or_else(bad)?;
    ctx.scope(|ctx| -> Result<(), OrchError> {
        match scenario {
            // Five tasks in a four-slot window.
            SCOPE => {
                for _ in 0..5 {
                    ctx.submit_dummy(&CoreArgs::new())?;
                }
            }
            // Five 1 KiB buffers, each produced by a task, in a 4 KiB heap.
            HEAP => {
                for _ in 0..5 {
                    let t = ctx.alloc_tensor(&[256], DataType::Float32)?;
                    ctx.submit_dummy(&core_args(&[(t, Output)])?)?;
                }
            }
            // One producer and five readers of it: one dependency entry each, four in the pool.
            DEP_POOL => {
                ctx.submit_dummy(&core_args(&[(scratch, Output)])?)?;
                for _ in 0..5 {
                    ctx.submit_dummy(&core_args(&[(scratch, Input)])?)?;
                }
            }
            // Tasks reading sixteen disjoint elements each, more than the map holds.
            _ => {
                for task in 0..16u32 {
                    let mut reads = Vec::new();
                    for k in 0..16u32 {
                        let v = scratch.view(&[1], &[task * 16 + k]).map_err(|_| bad())?;
                        reads.push((v, Input));
                    }
                    ctx.submit_dummy(&core_args(&reads)?)?;
                }
            }
        }
        Ok(())
    })?
}

fn stalling_callable() -> ChipCallable {
    over_add_kernels(stalling_orchestration, one_tensor_one_scalar, "trb_stalls")
}

/// `entry` and `config` (named `name` and `name_config`) over the `add` program's kernels.
fn over_add_kernels(entry: NativeOrchFn, config: NativeConfigFn, name: &str) -> ChipCallable {
    let mut b = ChipCallable::native(entry, config).names(name, format!("{name}_config"));
    for (func_id, kernel) in add::callable().unwrap().children() {
        b = b.kernel(*func_id, kernel.clone());
    }
    b.build().unwrap()
}

/// Runs `scenario` with ring 1 sized `ring1` (and every ring's window `window`), checks the
/// stall it ends with, then runs the vector program on the same runner.
fn check_stall(scenario: u64, window: u32, ring1: RingOverride, code: RuntimeCode, text: &str) {
    let mut r = DeviceRunner::attach(options_for(RuntimeVariant::TensormapAndRingbuffer)).unwrap();
    let stalls = r.register_callable(&stalling_callable()).unwrap();
    let vector = r.register_callable(&vector::callable().unwrap()).unwrap();
    let all =
        RingOverride { task_window: Some(window), heap_bytes: Some(64 << 10), dep_pool: Some(64) };
    let cfg = CallConfig::builder()
        .ring_override(RingSel::All, all)
        .ring_override(RingSel::Ring(1), ring1)
        .build()
        .unwrap();
    let (p, scratch) = upload_f32(&mut r, &[0.0; 256]);
    let mut args = TaskArgs::new();
    args.add_tensor(scratch, TensorArgType::NoDep).unwrap();
    args.add_scalar(scenario).unwrap();
    let err =
        r.run(&RunRequest::new(RunId::from_raw(1).unwrap(), stalls, &args, &cfg)).unwrap_err();
    let DeviceError::Runtime { fault, .. } = &err else { panic!("not a runtime fault: {err}") };
    assert_eq!(fault.code, code, "{err}");
    assert_eq!(fault.ring, Some(1), "{err}");
    let sizes = fault.sizes.expect("the ring's sizes");
    assert_eq!(
        (Some(sizes.task_window as u32), Some(sizes.heap_bytes), Some(sizes.dep_pool as u32)),
        (ring1.task_window, ring1.heap_bytes, ring1.dep_pool),
        "{err}"
    );
    assert!(fault.usage.is_some(), "{err}");
    assert!(fault.message.contains(text), "{err}");
    let call = ["submit: task ", "alloc_tensors: descriptor "];
    assert!(call.iter().any(|c| fault.message.starts_with(c)), "the call is not named: {err}");
    r.free(p).unwrap();
    // The runner is still usable.
    let good = vector_args(1024);
    let (bytes, _) = run_once(&mut r, vector, 2, &good, &CallConfig::default());
    assert_eq!(f32s(&bytes), vector::reference(&good[0].values, &good[1].values));
    r.finalize().unwrap();
}

#[test]
fn a_scope_holding_more_tasks_than_its_window_is_a_scope_deadlock() {
    let ring1 = RingOverride { task_window: Some(4), heap_bytes: Some(4096), dep_pool: Some(16) };
    check_stall(
        SCOPE,
        64,
        ring1,
        RuntimeCode::ScopeDeadlock,
        "ring 1: scope needs 5 task slots, window 4",
    );
}

#[test]
fn a_scope_holding_more_buffers_than_its_heap_is_a_heap_ring_deadlock() {
    let ring1 = RingOverride { task_window: Some(16), heap_bytes: Some(4096), dep_pool: Some(16) };
    check_stall(
        HEAP,
        64,
        ring1,
        RuntimeCode::HeapRingDeadlock,
        "ring 1: scope needs 1024 more heap bytes with 4096 of 4096",
    );
}

#[test]
fn a_scope_holding_more_edges_than_its_pool_is_a_dep_pool_overflow() {
    let ring1 = RingOverride { task_window: Some(16), heap_bytes: Some(4096), dep_pool: Some(4) };
    check_stall(
        DEP_POOL,
        64,
        ring1,
        RuntimeCode::DepPoolOverflow,
        "ring 1: a task needs 1 dep entries with 4 of 4 in use",
    );
}

#[test]
fn a_scope_holding_more_accesses_than_the_tensor_map_is_a_tensormap_overflow() {
    // Windows of 4 (ring 1: 32): a map of 4 × 44 = 176 entries; sixteen tasks read 256.
    let ring1 = RingOverride { task_window: Some(32), heap_bytes: Some(4096), dep_pool: Some(16) };
    check_stall(
        TENSOR_MAP,
        4,
        ring1,
        RuntimeCode::TensormapOverflow,
        "ring 1: the tensor map's 176 entries",
    );
}

// The orchestration's own reads and writes of tensor bytes wait for the tasks the tensor map
// knows: a read for the writers, a write for the readers.

use simpler_device_a2a3::Kernels;

const PROBE_ELEMS: u32 = 1 << 16;

fn five_args(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 5 }
}

/// Arguments `a, b` (inputs), `out` (output), `y` (in-out), `z` (output): `x = a + b` by a task,
/// read back at once into `out`; `z = y + y` by a task, then `y` overwritten at once.
fn probing_orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    use TensorArgType::{Input, Output};
    let bad = || OrchError::from_status(-1);
    let t = |i| args.tensor(i).copied().ok_or_else(bad);
    let (a, b, out, y, z) = (t(0)?, t(1)?, t(2)?, t(3)?, t(4)?);
    let x = ctx.alloc_tensor(&[PROBE_ELEMS], DataType::Float32)?;
    ctx.submit(Kernels::Aiv(add::ADD), &core_args(&[(a, Input), (b, Input), (x, Output)])?)?;
    let mut bytes = vec![0u8; PROBE_ELEMS as usize * 4];
    ctx.tensor_data(&x, &mut bytes)?;
    ctx.set_tensor_data(&out, &bytes)?;
    ctx.submit(Kernels::Aiv(add::ADD), &core_args(&[(y, Input), (y, Input), (z, Output)])?)?;
    ctx.set_tensor_data(&y, &vec![0u8; PROBE_ELEMS as usize * 4])?;
    Ok(())
}

/// Uploads each vector and adds it with its tag: the device buffers and the arguments.
fn upload_args(
    r: &mut DeviceRunner,
    tensors: &[(&[f32], TensorArgType)],
) -> (Vec<simpler_device_a2a3::DevicePtr>, TaskArgs) {
    let mut args = TaskArgs::new();
    let ptrs = tensors
        .iter()
        .map(|&(values, tag)| {
            let (p, t) = upload_f32(r, values);
            args.add_tensor(t, tag).unwrap();
            p
        })
        .collect();
    (ptrs, args)
}

#[test]
fn tensor_data_waits_for_the_writer_and_set_tensor_data_for_the_readers() {
    let callable = over_add_kernels(probing_orchestration, five_args, "probe");
    let mut r = DeviceRunner::attach(options_for(RuntimeVariant::TensormapAndRingbuffer)).unwrap();
    let slot = r.register_callable(&callable).unwrap();
    let n = PROBE_ELEMS as usize;
    let av: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let bv: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
    let yv: Vec<f32> = (0..n).map(|i| 1.0 + i as f32).collect();
    use TensorArgType::{InOut, Input, Output};
    let zeros = vec![0.0; n];
    let (ptrs, args) = upload_args(
        &mut r,
        &[(&av, Input), (&bv, Input), (&zeros, Output), (&yv, InOut), (&zeros, Output)],
    );
    r.run(&RunRequest::new(RunId::from_raw(1).unwrap(), slot, &args, &CallConfig::default()))
        .unwrap();
    let out = download_f32(&mut r, ptrs[2], n);
    let z = download_f32(&mut r, ptrs[4], n);
    let y = download_f32(&mut r, ptrs[3], n);
    let want_out: Vec<f32> = av.iter().zip(&bv).map(|(a, b)| a + b).collect();
    let want_z: Vec<f32> = yv.iter().map(|y| y + y).collect();
    assert!(out == want_out, "tensor_data read the buffer before its writer finished");
    assert!(z == want_z, "set_tensor_data overwrote the buffer before its reader finished");
    assert!(y.iter().all(|&v| v == 0.0));
    for p in ptrs {
        r.free(p).unwrap();
    }
    r.finalize().unwrap();
}

/// Arguments `a, b` (inputs), `out` (output): `x = a + b` by a task, then `x` set to ones at
/// once by the orchestration, then `out = x + x` by a task.
fn overwriting_orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    use TensorArgType::{Input, Output};
    let bad = || OrchError::from_status(-1);
    let t = |i| args.tensor(i).copied().ok_or_else(bad);
    let (a, b, out) = (t(0)?, t(1)?, t(2)?);
    let x = ctx.alloc_tensor(&[PROBE_ELEMS], DataType::Float32)?;
    ctx.submit(Kernels::Aiv(add::ADD), &core_args(&[(a, Input), (b, Input), (x, Output)])?)?;
    ctx.set_tensor_data(
        &x,
        &simpler_device_a2a3::programs::f32_to_le_bytes(&vec![1.0; PROBE_ELEMS as usize]),
    )?;
    ctx.submit(Kernels::Aiv(add::ADD), &core_args(&[(x, Input), (x, Input), (out, Output)])?)?;
    Ok(())
}

#[test]
fn set_tensor_data_waits_for_the_writer_of_the_bytes_too() {
    let callable = over_add_kernels(overwriting_orchestration, three_args, "overwrite");
    let mut r = DeviceRunner::attach(options_for(RuntimeVariant::TensormapAndRingbuffer)).unwrap();
    let slot = r.register_callable(&callable).unwrap();
    // The writer of `x` is held on its core well past the orchestration's write.
    r.sim_faults().unwrap().kernel_delay(add::ADD, std::time::Duration::from_millis(50));
    let n = PROBE_ELEMS as usize;
    let av: Vec<f32> = (0..n).map(|i| i as f32).collect();
    use TensorArgType::{Input, Output};
    let (ptrs, args) = upload_args(&mut r, &[(&av, Input), (&av, Input), (&vec![0.0; n], Output)]);
    r.run(&RunRequest::new(RunId::from_raw(1).unwrap(), slot, &args, &CallConfig::default()))
        .unwrap();
    let out = download_f32(&mut r, ptrs[2], n);
    assert!(
        out.iter().all(|&v| v == 2.0),
        "the task writing x overwrote what set_tensor_data wrote (out[1] = {})",
        out[1]
    );
    for p in ptrs {
        r.free(p).unwrap();
    }
    r.finalize().unwrap();
}

/// Arguments `a, b` (inputs), `out`, `twice` (outputs): `x = a + b` by a task that tags `x`
/// `NoDep`, read back at once into `out`; `y = a + b` likewise, then `y` set to ones at once and
/// `twice = y + y` by a task.
fn untracked_orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    use TensorArgType::{Input, NoDep, Output};
    let bad = || OrchError::from_status(-1);
    let t = |i| args.tensor(i).copied().ok_or_else(bad);
    let (a, b, out, twice) = (t(0)?, t(1)?, t(2)?, t(3)?);
    let x = ctx.alloc_tensor(&[PROBE_ELEMS], DataType::Float32)?;
    ctx.submit(Kernels::Aiv(add::ADD), &core_args(&[(a, Input), (b, Input), (x, NoDep)])?)?;
    let mut bytes = vec![0u8; PROBE_ELEMS as usize * 4];
    ctx.tensor_data(&x, &mut bytes)?;
    ctx.set_tensor_data(&out, &bytes)?;
    let y = ctx.alloc_tensor(&[PROBE_ELEMS], DataType::Float32)?;
    ctx.submit(Kernels::Aiv(add::ADD), &core_args(&[(a, Input), (b, Input), (y, NoDep)])?)?;
    let ones = simpler_device_a2a3::programs::f32_to_le_bytes(&vec![1.0; PROBE_ELEMS as usize]);
    ctx.set_tensor_data(&y, &ones)?;
    ctx.submit(Kernels::Aiv(add::ADD), &core_args(&[(y, Input), (y, Input), (twice, Output)])?)?;
    Ok(())
}

#[test]
fn the_orchestrations_data_copies_wait_for_tasks_whose_accesses_are_untracked() {
    let four = |_: &OrchArgs<'_>| OrchConfig { expected_arg_count: 4 };
    let callable = over_add_kernels(untracked_orchestration, four, "untracked");
    let mut r = DeviceRunner::attach(options_for(RuntimeVariant::TensormapAndRingbuffer)).unwrap();
    let slot = r.register_callable(&callable).unwrap();
    // Each writer is held on its core well past the orchestration's copy.
    r.sim_faults().unwrap().kernel_delay(add::ADD, std::time::Duration::from_millis(50));
    let n = PROBE_ELEMS as usize;
    let av: Vec<f32> = (0..n).map(|i| i as f32).collect();
    use TensorArgType::{Input, Output};
    let zeros = vec![0.0; n];
    let (ptrs, args) =
        upload_args(&mut r, &[(&av, Input), (&av, Input), (&zeros, Output), (&zeros, Output)]);
    r.run(&RunRequest::new(RunId::from_raw(1).unwrap(), slot, &args, &CallConfig::default()))
        .unwrap();
    let out = download_f32(&mut r, ptrs[2], n);
    let twice = download_f32(&mut r, ptrs[3], n);
    assert!(
        out.iter().zip(&av).all(|(o, a)| *o == a + a),
        "tensor_data read x before its untracked writer finished (out[1] = {})",
        out[1]
    );
    assert!(
        twice.iter().all(|&v| v == 2.0),
        "the untracked writer of y overwrote what set_tensor_data wrote (twice[1] = {})",
        twice[1]
    );
    for p in ptrs {
        r.free(p).unwrap();
    }
    r.finalize().unwrap();
}

#[test]
fn one_aicpu_thread_is_refused_since_one_orchestrates() {
    let mut r = DeviceRunner::attach(options_for(RuntimeVariant::TensormapAndRingbuffer)).unwrap();
    let slot = r.register_callable(&vector::callable().unwrap()).unwrap();
    let one = CallConfig::builder().aicpu_thread_num(1).build().unwrap();
    let mut args = TaskArgs::new();
    let (p, t) = upload_f32(&mut r, &[0.0; 16]);
    for _ in 0..3 {
        args.add_tensor(t, TensorArgType::NoDep).unwrap();
    }
    let err = r.run(&RunRequest::new(RunId::from_raw(1).unwrap(), slot, &args, &one)).unwrap_err();
    assert!(
        matches!(&err, DeviceError::InvalidConfig { setting, .. } if setting == "aicpu_thread_num"),
        "{err}"
    );
    r.free(p).unwrap();
    let good = vector_args(256);
    let two = CallConfig::builder().aicpu_thread_num(2).block_dim(1).build().unwrap();
    let (bytes, _) = run_once(&mut r, slot, 2, &good, &two);
    assert_eq!(f32s(&bytes), vector::reference(&good[0].values, &good[1].values));
    r.finalize().unwrap();
}

#[test]
fn the_default_config_runs_trb_on_four_aicpu_threads_and_hbg_on_three() {
    let args = vector_args(256);
    for (runtime, threads) in
        [(RuntimeVariant::TensormapAndRingbuffer, 4), (RuntimeVariant::HostBuildGraph, 3)]
    {
        let mut r = DeviceRunner::attach(options_for(runtime)).unwrap();
        let slot = r.register_callable(&vector::callable().unwrap()).unwrap();
        let (bytes, report) = run_once(&mut r, slot, 1, &args, &CallConfig::default());
        assert_eq!(report.aicpu_threads, threads, "{runtime:?}");
        assert_eq!(f32s(&bytes), vector::reference(&args[0].values, &args[1].values));
        r.finalize().unwrap();
    }
}

/// `f = a + b` as one MIX task of two AIV members on each of three blocks, then the same as an
/// AIV task of four blocks: each block computes its share of the sum (the two members of a MIX
/// block half of it each), so the output is `a + b` only when every block ran and the task
/// completed once.
fn mixed_orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    use TensorArgType::{Input, Output};
    let bad = || OrchError::from_status(-1);
    let t = |i| args.tensor(i).copied().ok_or_else(bad);
    let (a, b, f) = (t(0)?, t(1)?, t(2)?);
    let mix = Kernels::Mix { aic: None, aiv0: Some(add::ADD), aiv1: Some(add::ADD) };
    let x = ctx.alloc_tensor(a.shape(), DataType::Float32)?;
    ctx.submit_blocks(mix, &core_args(&[(a, Input), (b, Input), (x, Output)])?, 3)?;
    ctx.submit_blocks(
        Kernels::Aiv(add::ADD),
        &core_args(&[(x, Input), (b, Input), (f, Output)])?,
        4,
    )?;
    Ok(())
}

#[test]
fn mix_and_multi_block_tasks_give_the_same_bits_on_both_runtimes() {
    let callable = over_add_kernels(mixed_orchestration, three_args, "mixed");
    let args = vector_args(4096);
    let cfg = CallConfig::builder().block_dim(2).build().unwrap();
    let got = f32s(&same_on_both(&callable, &args, &cfg));
    let want: Vec<f32> =
        args[0].values.iter().zip(&args[1].values).map(|(a, b)| a + b + b).collect();
    assert_eq!(got, want);
}

/// `x = a + b` by a task of a nested scope into a buffer the top level allocated, then
/// `f = x + b` at the top level, after the nested scope ended.
fn outer_buffer_orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    use TensorArgType::{Input, Output};
    let bad = || OrchError::from_status(-1);
    let t = |i| args.tensor(i).copied().ok_or_else(bad);
    let (a, b, f) = (t(0)?, t(1)?, t(2)?);
    let x = ctx.alloc_tensor(a.shape(), DataType::Float32)?;
    ctx.scope(|ctx| {
        ctx.submit(Kernels::Aiv(add::ADD), &core_args(&[(a, Input), (b, Input), (x, Output)])?)
    })??;
    ctx.submit(Kernels::Aiv(add::ADD), &core_args(&[(x, Input), (b, Input), (f, Output)])?)?;
    Ok(())
}

#[test]
fn a_nested_scope_writes_a_buffer_of_the_top_level_on_both_runtimes() {
    let callable = over_add_kernels(outer_buffer_orchestration, three_args, "outer_buffer");
    let args = vector_args(4096);
    let got = f32s(&same_on_both(&callable, &args, &CallConfig::default()));
    let want: Vec<f32> =
        args[0].values.iter().zip(&args[1].values).map(|(a, b)| a + b + b).collect();
    assert_eq!(got, want);
}

fn four_args(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 4 }
}

/// Arguments `a, b` (inputs), `x` (in-out, zeros), `f` (output): `x = a + b` by a task whose
/// write the tensor map does not see (`NoDep`), then `f = x · a` reading `x` as a `manual_dep`
/// tensor created by the first task, so only the creator edge orders the two.
fn manual_dep_orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    use TensorArgType::{Input, NoDep, Output};
    let bad = || OrchError::from_status(-1);
    let t = |i| args.tensor(i).copied().ok_or_else(bad);
    let (a, b, x, f) = (t(0)?, t(1)?, t(2)?, t(3)?);
    let creator =
        ctx.submit(Kernels::Aiv(vector::ADD), &core_args(&[(a, Input), (b, Input), (x, NoDep)])?)?;
    let x = x.manual_dep(true).with_owner(creator);
    ctx.submit(Kernels::Aiv(vector::MUL), &core_args(&[(x, Input), (a, Input), (f, Output)])?)?;
    Ok(())
}

#[test]
fn a_manual_dep_tensor_waits_for_its_creator_on_both_runtimes() {
    let mut b = ChipCallable::native(manual_dep_orchestration, four_args)
        .names("manual_dep", "manual_dep_config");
    for (func_id, kernel) in vector::callable().unwrap().children() {
        b = b.kernel(*func_id, kernel.clone());
    }
    let callable = b.build().unwrap();
    let mut args = vector_args(1024);
    let n = args[0].values.len();
    args.insert(2, Arg { values: vec![0.0; n], tag: TensorArgType::InOut, shape: vec![n as u32] });
    let mut outputs = Vec::new();
    for runtime in [RuntimeVariant::HostBuildGraph, RuntimeVariant::TensormapAndRingbuffer] {
        let mut r = DeviceRunner::attach(options_for(runtime)).unwrap();
        // A slow creator: a consumer not ordered after it would read `x` still zero.
        r.sim_faults().unwrap().kernel_delay(vector::ADD, std::time::Duration::from_millis(200));
        let slot = r.register_callable(&callable).unwrap();
        outputs.push(run_once(&mut r, slot, 1, &args, &CallConfig::default()).0);
        r.finalize().unwrap();
    }
    assert!(outputs[0] == outputs[1], "trb's output differs from hbg's");
    let got = f32s(&outputs[1]);
    let x = add::reference(&args[0].values, &args[1].values);
    let f: Vec<f32> = x.iter().zip(&args[0].values).map(|(x, a)| x * a).collect();
    assert_eq!(got, [x, f].concat(), "the consumer ran before its manual_dep creator finished");
}

/// Arguments `a, b` (inputs, `PROBE_ELEMS` f32), `f` (output) and a scalar choosing the use:
/// `x = a + b` into a buffer of a scope that then ends (after the write finished, so the
/// buffer's bytes are free at once); a second scope allocates `y`, which takes those bytes, and
/// a task writes it; then the stale descriptor of `x` is read (0), written (1) or submitted (2).
fn stale_buffer_orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    use TensorArgType::{Input, Output};
    let bad = || OrchError::from_status(-1);
    let t = |i| args.tensor(i).copied().ok_or_else(bad);
    let (a, b, f) = (t(0)?, t(1)?, t(2)?);
    let use_of_x = args.scalar(0).ok_or_else(bad)?;
    let mut bytes = vec![0u8; PROBE_ELEMS as usize * 4];
    let x = ctx.scope(|ctx| -> Result<Tensor, OrchError> {
        let x = ctx.alloc_tensor(&[PROBE_ELEMS], DataType::Float32)?;
        ctx.submit(Kernels::Aiv(add::ADD), &core_args(&[(a, Input), (b, Input), (x, Output)])?)?;
        ctx.tensor_data(&x, &mut bytes)?;
        Ok(x)
    })??;
    ctx.scope(|ctx| -> Result<(), OrchError> {
        let y = ctx.alloc_tensor(&[PROBE_ELEMS], DataType::Float32)?;
        ctx.submit(Kernels::Aiv(add::ADD), &core_args(&[(a, Input), (a, Input), (y, Output)])?)?;
        match use_of_x {
            0 => ctx.tensor_data(&x, &mut bytes),
            1 => ctx.set_tensor_data(&x, &bytes),
            _ => ctx
                .submit(Kernels::Aiv(add::ADD), &core_args(&[(x, Input), (b, Input), (f, Output)])?)
                .map(|_| ()),
        }
    })?
}

#[test]
fn a_buffer_used_after_its_scope_ended_is_refused_even_once_its_bytes_are_reused() {
    let callable = over_add_kernels(stale_buffer_orchestration, four_args, "stale");
    let mut r = DeviceRunner::attach(options_for(RuntimeVariant::TensormapAndRingbuffer)).unwrap();
    // A slow writer of `y`: a read of `x`'s bytes not refused would race with it.
    r.sim_faults().unwrap().kernel_delay(add::ADD, std::time::Duration::from_millis(20));
    let slot = r.register_callable(&callable).unwrap();
    let n = PROBE_ELEMS as usize;
    for (run, op) in [(1, "tensor_data"), (2, "set_tensor_data"), (3, "submit")] {
        let mut ptrs = Vec::new();
        let mut args = TaskArgs::new();
        for tag in [TensorArgType::Input, TensorArgType::Input, TensorArgType::Output] {
            let (p, t) = upload_f32(&mut r, &vec![1.0; n]);
            args.add_tensor(t, tag).unwrap();
            ptrs.push(p);
        }
        args.add_scalar(run - 1).unwrap();
        let cfg = CallConfig::default();
        let req = RunRequest::new(RunId::from_raw(run).unwrap(), slot, &args, &cfg);
        let err = r.run(&req).unwrap_err();
        let DeviceError::Runtime { fault, .. } = &err else { panic!("{op}: {err}") };
        assert_eq!(fault.code, RuntimeCode::InvalidArgs, "{op}: {err}");
        assert!(fault.message.starts_with(op), "{op}: {err}");
        assert!(fault.message.contains("does not name its buffer's owner"), "{op}: {err}");
        for p in ptrs {
            r.free(p).unwrap();
        }
    }
    r.sim_faults().unwrap().clear();
    r.finalize().unwrap();
}

#[test]
fn tensor_data_waiting_past_the_tensor_wait_budget_is_a_tensor_wait_timeout() {
    let callable = over_add_kernels(probing_orchestration, five_args, "probe");
    let mut o = options_for(RuntimeVariant::TensormapAndRingbuffer);
    o.budgets.tensor_wait = std::time::Duration::from_millis(50);
    let mut r = DeviceRunner::attach(o).unwrap();
    // The writer `tensor_data` waits for takes far longer than the budget (and far less than
    // the scheduler's no-progress budget, so only the tensor wait can fire).
    r.sim_faults().unwrap().kernel_delay(add::ADD, std::time::Duration::from_millis(1000));
    let slot = r.register_callable(&callable).unwrap();
    let n = PROBE_ELEMS as usize;
    let mut ptrs = Vec::new();
    let mut args = TaskArgs::new();
    use TensorArgType::{InOut, Input, Output};
    for tag in [Input, Input, Output, InOut, Output] {
        let (p, t) = upload_f32(&mut r, &vec![1.0; n]);
        args.add_tensor(t, tag).unwrap();
        ptrs.push(p);
    }
    let err = r
        .run(&RunRequest::new(RunId::from_raw(1).unwrap(), slot, &args, &CallConfig::default()))
        .unwrap_err();
    let DeviceError::Runtime { fault, .. } = &err else { panic!("not a runtime fault: {err}") };
    assert_eq!(fault.code, RuntimeCode::TensorWaitTimeout, "{err}");
    assert!(fault.message.contains("tensor_data") && fault.message.contains("50 ms"), "{err}");
    for p in ptrs {
        r.free(p).unwrap();
    }
    r.sim_faults().unwrap().clear();
    let good = vector_args(256);
    let vector = r.register_callable(&vector::callable().unwrap()).unwrap();
    let (bytes, _) = run_once(&mut r, vector, 2, &good, &CallConfig::default());
    assert_eq!(f32s(&bytes), vector::reference(&good[0].values, &good[1].values));
    r.finalize().unwrap();
}

/// Arguments `a, b` (in-out, input) and `out` (output): `out = a + b` by a task, read back at
/// once (so that task has finished), then `a = b + b` by a task: a blind write after a finished
/// reader, which the device does not wait for.
fn rewriting_a_finished_input(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    use TensorArgType::{Input, Output};
    let bad = || OrchError::from_status(-1);
    let t = |i| args.tensor(i).copied().ok_or_else(bad);
    let (a, b, out) = (t(0)?, t(1)?, t(2)?);
    ctx.submit(Kernels::Aiv(add::ADD), &core_args(&[(a, Input), (b, Input), (out, Output)])?)?;
    let mut bytes = vec![0u8; PROBE_ELEMS as usize * 4];
    ctx.tensor_data(&out, &mut bytes)?;
    ctx.submit(Kernels::Aiv(add::ADD), &core_args(&[(b, Input), (b, Input), (a, Output)])?)?;
    Ok(())
}

#[test]
fn dep_gen_does_not_call_an_edge_the_device_skipped_to_a_finished_reader_a_difference() {
    let callable = over_add_kernels(rewriting_a_finished_input, three_args, "rewrite");
    let mut r = DeviceRunner::attach(options_for(RuntimeVariant::TensormapAndRingbuffer)).unwrap();
    let slot = r.register_callable(&callable).unwrap();
    let n = PROBE_ELEMS as usize;
    let (av, bv): (Vec<f32>, Vec<f32>) = ((0..n).map(|i| i as f32).collect(), vec![1.0; n]);
    use TensorArgType::{InOut, Input, Output};
    let (ptrs, args) = upload_args(&mut r, &[(&av, InOut), (&bv, Input), (&vec![0.0; n], Output)]);
    let dir = temp_dir("trb-finished-reader-deps");
    let cfg = CallConfig::builder().dep_gen(true).output_prefix(&dir).build().unwrap();
    let rep = r.run(&RunRequest::new(RunId::from_raw(1).unwrap(), slot, &args, &cfg)).unwrap();
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    let out = download_f32(&mut r, ptrs[2], n);
    assert!(out.iter().zip(&av).all(|(o, a)| *o == a + 1.0), "out = a + b with a as uploaded");
    assert!(download_f32(&mut r, ptrs[0], n).iter().all(|&v| v == 2.0), "a = b + b");
    for p in ptrs {
        r.free(p).unwrap();
    }
    r.finalize().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

fn oversized_alloc_orchestration(ctx: &mut OrchCtx<'_>, _: &OrchArgs<'_>) -> Result<(), OrchError> {
    // The first call's one descriptor fits; the second's needs 1 MiB, past the 64 KiB heap of
    // the outer ring (each call numbers its descriptors from 0).
    ctx.alloc_tensor(&[16], DataType::Float32)?;
    ctx.alloc_tensor(&[256 << 10], DataType::Float32)?;
    Ok(())
}

fn no_args(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 0 }
}

#[test]
fn an_allocation_larger_than_the_heap_names_the_call_its_descriptor_and_its_bytes() {
    let mut r = DeviceRunner::attach(options_for(RuntimeVariant::TensormapAndRingbuffer)).unwrap();
    let c = over_add_kernels(oversized_alloc_orchestration, no_args, "oversized_alloc");
    let slot = r.register_callable(&c).unwrap();
    let small =
        RingOverride { task_window: Some(16), heap_bytes: Some(64 << 10), dep_pool: Some(16) };
    let cfg = CallConfig::builder().ring_override(RingSel::All, small).build().unwrap();
    let run = RunId::from_raw(1).unwrap();
    let err = r.run(&RunRequest::new(run, slot, &TaskArgs::new(), &cfg)).unwrap_err();
    let DeviceError::Runtime { fault, .. } = &err else { panic!("not a runtime fault: {err}") };
    assert_eq!(fault.code, RuntimeCode::InvalidArgs, "{err}");
    assert!(
        fault.message.starts_with("alloc_tensors: descriptor 0 (1048576 bytes): "),
        "{}",
        fault.message
    );
    assert!(fault.message.ends_with("buffer larger than the ring's heap"), "{}", fault.message);
    r.finalize().unwrap();
}
