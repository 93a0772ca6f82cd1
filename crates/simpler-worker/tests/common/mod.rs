//! Shared fixtures: a small chip program (`out = x + y` over f32) and worker builders.

#![allow(dead_code)]

use std::time::Duration;

use simpler_device_a2a3::{
    ArgDirection, ChipCallable, CoreCallable, KernelCall, Kernels, OrchArgs, OrchConfig, OrchCtx,
    OrchError, Platform, RuntimeVariant,
};
use simpler_types::{CoreArgs, TensorArgType};
use simpler_worker::{HostWorkerBuilder, Worker};

/// Generous upper bound that only catches hangs.
pub const HANG: Duration = Duration::from_secs(60);

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

fn orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let (a, b, f) = match (args.tensor(0), args.tensor(1), args.tensor(2)) {
        (Some(a), Some(b), Some(f)) => (*a, *b, *f),
        _ => return Err(OrchError::from_status(-1)),
    };
    let mut k = CoreArgs::new();
    let bad = |_| OrchError::from_status(-1);
    k.add_tensor(a, TensorArgType::Input).map_err(bad)?;
    k.add_tensor(b, TensorArgType::Input).map_err(bad)?;
    k.add_tensor(f, TensorArgType::Output).map_err(bad)?;
    ctx.submit(Kernels::Aiv(0), &k)?;
    Ok(())
}

fn config(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 3 }
}

/// The chip program `f = a + b`; `variant` makes content distinct (different entry names).
pub fn add_callable(variant: u32) -> ChipCallable {
    use ArgDirection::{In, Out};
    ChipCallable::native(orchestration, config)
        .names(format!("add_{variant}"), "add_config")
        .signature(vec![In, In, Out])
        .kernel(0, CoreCallable::native(vec![In, In, Out], add))
        .build()
        .expect("valid callable")
}

/// An L3 builder on the simulator.
pub fn host() -> HostWorkerBuilder {
    Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph)
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn f32_from(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Threads of this process.
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// Names of this process's threads starting with `prefix`.
pub fn threads_named(prefix: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| s.starts_with(prefix))
        .collect()
}
