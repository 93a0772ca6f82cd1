//! The streaming graph: `tasks` small AIV tasks grouped into chains, each chain producing one
//! value that is folded into a lane of the output; chip arguments `out` (in-out, f32, one
//! element per lane), then the scalars `tasks` and `chain_len`.
//!
//! Chain `c` holds the tasks `[c · chain_len, (c + 1) · chain_len)` (the last one may be
//! shorter) and is worth `seed(c) + (len − 2)` for a chain of `len ≥ 2` tasks: its first task
//! sets a one-element accumulator to `seed(c)`, the middle ones add 1 each, the last adds the
//! accumulator into lane `c mod lanes`. A chain of one task (`chain_len` 1: independent tasks)
//! adds `seed(c)` into its lane directly. Every value is a small integer, so the f32 sums are
//! exact and a run matches [`reference()`] bit for bit on either runtime.
//!
//! The graph is built to stream through bounded rings: the orchestration opens one scope per
//! chain (or per [`SCOPE_TASKS`] independent tasks), and the only allocation is a chain's
//! accumulator inside its scope, so a runtime that reclaims task slots and heap at scope ends
//! runs any task count in a window of a few scopes' tasks and a heap of a few accumulators.
//! The host graph builder keeps the whole graph resident instead, so there the task count is
//! bounded by its task window.

use simpler_types::{TaskArgs, TypesError};

use super::*;

/// Func id of the kernel `x = s` for an f32 scalar `s` (AIV): tensor `x` (out).
pub const SET: u32 = 0;
/// Func id of the kernel `x += s` for an f32 scalar `s` (AIV): tensor `x` (in-out).
pub const ADD_SCALAR: u32 = 1;
/// Func id of the kernel `x += y` (AIV): tensors `x` (in-out), `y` (in).
pub const ACCUMULATE: u32 = 2;

/// Independent tasks per scope when `chain_len` is 1 (a chain always has a scope of its own).
pub const SCOPE_TASKS: u64 = 100;
/// The chain length of the chained streaming workload.
pub const CHAIN: u64 = 100;

/// The value chain `c` starts from: 1 to 7.
pub fn seed(chain: u64) -> f32 {
    (chain % 7 + 1) as f32
}

/// `x = s`: tensor `x` (out), then the f32 scalar `s`.
unsafe extern "C-unwind" fn set_kernel(args: *mut i64) {
    // SAFETY: the runtime passes this kernel's argument vector; its signature has one tensor.
    let k = unsafe { KernelCall::from_raw(args, 1) };
    let (Some(s), Some(x)) = (k.scalar_of::<f32>(0), f32_view(&k, 0)) else { return };
    // SAFETY: `x.1` bounds the view; the view names this task's device buffer.
    unsafe { elementwise(x, call_share(&k, x.1), |_| s) };
}

/// `x += s`: tensor `x` (in-out), then the f32 scalar `s`.
unsafe extern "C-unwind" fn add_scalar_kernel(args: *mut i64) {
    // SAFETY: as in `set_kernel`.
    let k = unsafe { KernelCall::from_raw(args, 1) };
    let (Some(s), Some(x)) = (k.scalar_of::<f32>(0), f32_view(&k, 0)) else { return };
    // SAFETY: as in `set_kernel`; each element is read before the same call writes it, and no
    // other call handles it.
    unsafe { elementwise(x, call_share(&k, x.1), |i| load(x, i) + s) };
}

/// `x += y`: tensors `x` (in-out), `y` (in).
unsafe extern "C-unwind" fn accumulate_kernel(args: *mut i64) {
    // SAFETY: the runtime passes this kernel's argument vector; its signature has two tensors.
    let k = unsafe { KernelCall::from_raw(args, 2) };
    let (Some(x), Some(y)) = (f32_view(&k, 0), f32_view(&k, 1)) else { return };
    // SAFETY: the shorter length bounds both views; the views name this task's device buffers.
    unsafe { elementwise(x, call_share(&k, x.1.min(y.1)), |i| load(x, i) + load(y, i)) };
}

/// The chip arguments of a streaming run over the lanes `out` (f32, one dimension).
pub fn run_args(out: Tensor, tasks: u64, chain_len: u64) -> Result<TaskArgs, TypesError> {
    let mut args = TaskArgs::new();
    args.add_inout(out)?.add_scalar(tasks)?.add_scalar(chain_len)?;
    Ok(args)
}

/// The orchestration: the chains in order, each in a scope of its own, or [`SCOPE_TASKS`]
/// one-task chains per scope when `chain_len` is 1.
pub fn orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let (Some(out), Some(tasks), Some(chain_len)) =
        (args.tensor(0), args.scalar(0), args.scalar(1))
    else {
        return Err(bad_arguments());
    };
    let lanes = u32::try_from(out.numel()).map_err(|_| bad_arguments())?;
    if chain_len == 0 || lanes == 0 || out.rank() != 1 {
        return Err(bad_arguments());
    }
    let chains = tasks.div_ceil(chain_len);
    let per_scope = (SCOPE_TASKS / chain_len).max(1);
    let mut chain = 0;
    while chain < chains {
        let last = chains.min(chain + per_scope);
        ctx.scope(|ctx| {
            (chain..last).try_for_each(|c| {
                let len = chain_len.min(tasks - c * chain_len);
                submit_chain(ctx, out, lanes, c, len)
            })
        })??;
        chain = last;
    }
    Ok(())
}

/// Submits chain `c` of `len` tasks, folding its value into lane `c mod lanes` of `out`.
fn submit_chain(
    ctx: &mut OrchCtx<'_>,
    out: &Tensor,
    lanes: u32,
    c: u64,
    len: u64,
) -> Result<(), OrchError> {
    use TensorArgType::{InOut, Input, Output};
    let lane = (c % u64::from(lanes)) as u32;
    let lane = out.view(&[1], &[lane]).map_err(|_| bad_arguments())?;
    if len == 1 {
        let fold = task_args(&[(lane, InOut)], Some(seed(c)))?;
        ctx.submit(Kernels::Aiv(ADD_SCALAR), &fold)?;
        return Ok(());
    }
    let acc = ctx.alloc_tensor(&[1], DataType::Float32)?;
    ctx.submit(Kernels::Aiv(SET), &task_args(&[(acc, Output)], Some(seed(c)))?)?;
    let step = task_args(&[(acc, InOut)], Some(1.0))?;
    for _ in 2..len {
        ctx.submit(Kernels::Aiv(ADD_SCALAR), &step)?;
    }
    ctx.submit(Kernels::Aiv(ACCUMULATE), &task_args(&[(lane, InOut), (acc, Input)], None)?)?;
    Ok(())
}

/// The config: the lanes tensor and two scalars.
fn config(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 3 }
}

/// The program's builder, named `streaming` / `streaming_config`.
pub fn builder() -> ChipCallableBuilder {
    use ArgDirection::{In, InOut, Out, Scalar};
    // SAFETY: each kernel reads exactly the arguments of the signature it is paired with:
    // `set_kernel` an output and a scalar, `add_scalar_kernel` an updated tensor and a scalar,
    // `accumulate_kernel` an updated tensor and an input.
    let (set, add_scalar, accumulate) = unsafe {
        (
            CoreCallable::native(vec![Out, Scalar], set_kernel),
            CoreCallable::native(vec![InOut, Scalar], add_scalar_kernel),
            CoreCallable::native(vec![InOut, In], accumulate_kernel),
        )
    };
    ChipCallable::native(orchestration, config)
        .names("streaming", "streaming_config")
        .signature(vec![InOut, Scalar, Scalar])
        .kernel(SET, set)
        .kernel(ADD_SCALAR, add_scalar)
        .kernel(ACCUMULATE, accumulate)
}

/// The program as a callable.
pub fn callable() -> Result<ChipCallable, DeviceError> {
    builder().build()
}

/// The lanes after a run of `tasks` tasks in chains of `chain_len` (at least 1) over `lanes`
/// lanes that started at zero.
pub fn reference(tasks: u64, chain_len: u64, lanes: usize) -> Vec<f32> {
    let mut out = vec![0f32; lanes];
    let chain_len = chain_len.max(1);
    if lanes == 0 {
        return out;
    }
    for c in 0..tasks.div_ceil(chain_len) {
        let len = chain_len.min(tasks - c * chain_len);
        out[(c % lanes as u64) as usize] += seed(c) + len.saturating_sub(2) as f32;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_sums_every_chain_into_its_lane() {
        // Chains of 3: values seed(0)+1 = 2, seed(1)+1 = 3, and a one-task tail seed(2) = 3.
        assert_eq!(reference(7, 3, 2), vec![2.0 + 3.0, 3.0]);
        // Independent tasks: one seed each.
        assert_eq!(reference(3, 1, 4), vec![1.0, 2.0, 3.0, 0.0]);
    }
}
