//! Reference chip programs used by the examples, tests and benchmarks.
//!
//! Each program is a [`ChipCallable`] built from native kernels and a native orchestration,
//! together with the host computation its output is checked against:
//!
//! - [`add`]: one AIV task, `f = a + b` over f32.
//! - [`vector`]: the vector example, `f = (a + b + 1)(a + b + 2) + (a + b)` over f32 as five AIV
//!   tasks (add, add-scalar, add-scalar, mul, add) with four intermediate tensors.
//! - [`bgemm`]: batched tile GEMM, `C += Σ_k A[i][k]·B[k][j]` over 64×64 f32 tiles, as 64 AIC
//!   products each followed by an AIV accumulation ordered on its output tile.
//! - [`streaming`]: a graph of any size in chains of small AIV tasks, scoped so that it streams
//!   through bounded task and heap rings.
//! - [`paged_attention`]: attention over a block-paged key/value cache, with task counts the
//!   block table decides.
//!
//! The kernels check what they are handed: a null tensor (an optional input left out), a
//! tensor that is not a contiguous f32 view whose first element is 4-byte aligned, or a
//! missing scalar, makes the kernel write nothing rather than read address 0, out of bounds or
//! misaligned. The orchestrations return an [`OrchError`] with
//! status −1 when a chip argument is missing or a task's arguments do not fit. These kernels
//! are the only unsafe code here: each reads its argument slots through [`KernelCall`], whose
//! contract the runtime upholds when it calls them.
//!
//! A task of several blocks runs its kernel once per block, concurrently. Block `b` of `n`
//! writes only its part of the output, the elements `[len·b/n, len·(b+1)/n)` (a task of 0
//! blocks counts as one), so the blocks of a task write disjoint elements and together write
//! each one once. A `Mix` task whose block runs one kernel on several members (both AIV
//! sub-blocks, say) runs it once per member, each call seeing the block's index: copy `c` of
//! `m` ([`KernelCall::copy_idx`], [`KernelCall::copy_num`]) writes the `c`-th of `m` parts of
//! its block's part, the same split again, so the copies neither repeat nor race each other's
//! work. The exception is the paged-attention update, every element of whose in-out state
//! depends on the whole old state: the first copy of block 0 does all of it and every other
//! call writes nothing. Kernels may still meet on the same bytes: members of a `Mix` task that
//! run different kernels over one buffer, untracked (`NoDep`) tasks on one buffer run
//! concurrently, and a kernel handed aliasing arguments directly (the chip graph builder
//! refuses such tasks) reads what it writes. All of that stays defined, with a meaningless result where the values differ: the
//! kernels never hold a reference over device memory and read and write every element as one
//! relaxed atomic 4-byte word, so their concurrent accesses never race. What a concurrent
//! access reads is any value the element held or was given meanwhile; a word is never torn.
//! A kernel of another program that touches the same bytes concurrently without atomics breaks
//! the contract of [`KernelCall::slice`] and [`KernelCall::slice_mut`].
//!
//! The host-side helpers [`f32_to_le_bytes`] and [`f32_from_le_bytes`] move f32 values to and
//! from the little-endian bytes device memory holds.

use std::ops::Range;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;

use simpler_types::{CoreArgs, DataType, Tensor, TensorArgType};

use crate::callable::{
    ArgDirection, ChipCallable, ChipCallableBuilder, CoreCallable, OrchArgs, OrchConfig,
    Orchestration,
};
use crate::error::DeviceError;
use crate::kernel::{KernelCall, KernelFn};
use crate::runtime::orch::{Kernels, OrchCtx, OrchError};

/// The status every reference orchestration fails with.
const BAD_ARGUMENTS: i32 = -1;

fn bad_arguments() -> OrchError {
    OrchError::from_status(BAD_ARGUMENTS)
}

/// Little-endian bytes of `values`, as device memory holds them.
pub fn f32_to_le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The f32 values of little-endian `bytes`; a trailing partial value is ignored.
pub fn f32_from_le_bytes(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A task's arguments: `tensors` in order, then `scalar` if given.
fn task_args(
    tensors: &[(Tensor, TensorArgType)],
    scalar: Option<f32>,
) -> Result<CoreArgs, OrchError> {
    let mut args = CoreArgs::new();
    for (t, tag) in tensors {
        args.add_tensor(*t, *tag).map_err(|_| bad_arguments())?;
    }
    if let Some(s) = scalar {
        args.add_scalar_of(s).map_err(|_| bad_arguments())?;
    }
    Ok(args)
}

/// The three chip tensors `(a, b, f)` every reference program takes.
fn three_tensors(args: &OrchArgs<'_>) -> Result<(Tensor, Tensor, Tensor), OrchError> {
    match (args.tensor(0), args.tensor(1), args.tensor(2)) {
        (Some(a), Some(b), Some(f)) => Ok((*a, *b, *f)),
        _ => Err(bad_arguments()),
    }
}

/// The config of every reference program: three chip arguments.
fn three_args(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 3 }
}

/// Tensor `i`'s view as `(first element, elements)`, for a contiguous f32 view whose first
/// element is 4-byte aligned (so that every element is: [`element`] accesses them as atomic
/// words). A null tensor has none: the runtimes pass one through for an optional input
/// without checking its shape.
fn f32_view(k: &KernelCall<'_>, i: usize) -> Option<(*mut f32, usize)> {
    let t = k.tensor(i)?;
    if t.is_null() || !t.contiguous() || t.data_type().ok() != Some(DataType::Float32) {
        return None;
    }
    let addr = t.data_addr();
    if addr % align_of::<AtomicU32>() as u64 != 0 {
        return None;
    }
    let len = usize::try_from(t.numel()).ok()?;
    Some((addr as usize as *mut f32, len))
}

/// The part of `n` elements that block `block` of a task of `blocks` blocks handles:
/// `[n·block/blocks, n·(block + 1)/blocks)`. The blocks' parts are disjoint and together cover
/// `0..n`; a task of 0 blocks counts as one, and a block index past the last gets nothing.
fn share(n: usize, block: u32, blocks: u32) -> Range<usize> {
    let blocks = u128::from(blocks.max(1));
    let block = u128::from(block).min(blocks);
    // `n · b / blocks ≤ n` for `b ≤ blocks`, and the product fits u128.
    let bound = |b: u128| usize::try_from(n as u128 * b / blocks).unwrap_or(n);
    bound(block)..bound((block + 1).min(blocks))
}

/// The part of `n` elements that copy `copy.0` of `copy.1` of block `block.0` of `block.1`
/// handles: its block's [`share`], shared again among the block's copies of the kernel. The
/// parts of all copies of all blocks are disjoint and together cover `0..n`.
fn copy_share(n: usize, block: (u32, u32), copy: (u32, u32)) -> Range<usize> {
    let b = share(n, block.0, block.1);
    let c = share(b.len(), copy.0, copy.1);
    b.start + c.start..b.start + c.end
}

/// The part of `n` elements the running call of `k` handles (see [`copy_share`]).
fn call_share(k: &KernelCall<'_>, n: usize) -> Range<usize> {
    copy_share(n, (k.block_idx(), k.block_num()), (k.copy_idx(), k.copy_num()))
}

/// Element `i` of a view from [`f32_view`], as the atomic word every reference kernel reads
/// and writes it through.
///
/// # Safety
///
/// `i` is below the view's length and the view names device memory the task was given.
unsafe fn element<'v>(view: (*mut f32, usize), i: usize) -> &'v AtomicU32 {
    debug_assert!(i < view.1, "element {i} of a view of {}", view.1);
    // SAFETY: the element lies in device memory the task was given (the caller's contract),
    // host memory that stays allocated and writable while the task runs, and it is 4-aligned
    // since the view's first element is (`f32_view`). Other calls of this task, and untracked
    // tasks, may access the same bytes concurrently: the reference kernels
    // do so only through this function, with atomic 4-byte accesses; any other kernel must not
    // touch bytes a concurrent kernel writes (the contracts of `KernelCall::slice` and
    // `slice_mut`); the runner copies between host and device memory only while no run is
    // launched, and a runtime copies the bytes of a task's tensor (the orchestration's
    // `tensor_data`) only while no task accessing them runs. So no access to the word races a
    // non-atomic or differently sized one.
    unsafe { AtomicU32::from_ptr(view.0.add(i).cast::<u32>()) }
}

/// Element `i` of a view from [`f32_view`], read atomically.
///
/// # Safety
///
/// As [`element`].
unsafe fn load(view: (*mut f32, usize), i: usize) -> f32 {
    // SAFETY: the caller's contract.
    f32::from_bits(unsafe { element(view, i) }.load(Relaxed))
}

/// Stores `v` atomically at element `i` of a view from [`f32_view`].
///
/// # Safety
///
/// As [`element`].
unsafe fn store(view: (*mut f32, usize), i: usize, v: f32) {
    // SAFETY: the caller's contract.
    unsafe { element(view, i) }.store(v.to_bits(), Relaxed);
}

/// `out[i] = f(i)` for every `i` in `range`, element by element.
///
/// # Safety
///
/// `range.end` is at most `out`'s length; `out` names device memory the task was given.
unsafe fn elementwise(out: (*mut f32, usize), range: Range<usize>, f: impl Fn(usize) -> f32) {
    debug_assert!(range.end <= out.1, "elements up to {} of a view of {}", range.end, out.1);
    for i in range {
        // SAFETY: `i < range.end <= out.1`, the caller's contract.
        unsafe { store(out, i, f(i)) };
    }
}

/// The elements of a view from [`f32_view`], copied out.
///
/// # Safety
///
/// As [`element`] for every element of the view.
unsafe fn copy_out(view: (*mut f32, usize)) -> Vec<f32> {
    // SAFETY: every `i < view.1`, the caller's contract.
    (0..view.1).map(|i| unsafe { load(view, i) }).collect()
}

/// `out = x + y` over f32: tensors `x` (in), `y` (in), `out` (out).
unsafe extern "C-unwind" fn add_kernel(args: *mut i64) {
    // SAFETY: the runtime passes this kernel's argument vector; its signature has three tensors.
    let k = unsafe { KernelCall::from_raw(args, 3) };
    let (Some(x), Some(y), Some(out)) = (f32_view(&k, 0), f32_view(&k, 1), f32_view(&k, 2)) else {
        return;
    };
    let n = out.1.min(x.1).min(y.1);
    // SAFETY: `n` bounds every view; the views name this task's device buffers.
    unsafe { elementwise(out, call_share(&k, n), |i| load(x, i) + load(y, i)) };
}

/// `out = x + s` over f32: tensors `x` (in), `out` (out), then the f32 scalar `s`.
unsafe extern "C-unwind" fn add_scalar_kernel(args: *mut i64) {
    // SAFETY: the runtime passes this kernel's argument vector; its signature has two tensors.
    let k = unsafe { KernelCall::from_raw(args, 2) };
    let Some(s) = k.scalar_of::<f32>(0) else { return };
    let (Some(x), Some(out)) = (f32_view(&k, 0), f32_view(&k, 1)) else { return };
    let n = out.1.min(x.1);
    // SAFETY: as in `add_kernel`.
    unsafe { elementwise(out, call_share(&k, n), |i| load(x, i) + s) };
}

/// `out = x * y` over f32: tensors `x` (in), `y` (in), `out` (out).
unsafe extern "C-unwind" fn mul_kernel(args: *mut i64) {
    // SAFETY: as in `add_kernel`.
    let k = unsafe { KernelCall::from_raw(args, 3) };
    let (Some(x), Some(y), Some(out)) = (f32_view(&k, 0), f32_view(&k, 1), f32_view(&k, 2)) else {
        return;
    };
    let n = out.1.min(x.1).min(y.1);
    // SAFETY: as in `add_kernel`.
    unsafe { elementwise(out, call_share(&k, n), |i| load(x, i) * load(y, i)) };
}

/// The one-task program `f = a + b` over f32; chip arguments `a` (in), `b` (in), `f` (out).
pub mod add {
    use super::*;

    /// Func id of the add kernel (AIV).
    pub const ADD: u32 = 0;

    /// The orchestration: one AIV task `f = a + b`.
    pub fn orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
        use TensorArgType::{Input, Output};
        let (a, b, f) = three_tensors(args)?;
        ctx.submit(Kernels::Aiv(ADD), &task_args(&[(a, Input), (b, Input), (f, Output)], None)?)?;
        Ok(())
    }

    /// The program's builder, named `add` / `add_config`; rename it with
    /// [`ChipCallableBuilder::names`] to get a callable of distinct content.
    pub fn builder() -> ChipCallableBuilder {
        builder_with(Orchestration::Native { entry: orchestration, config: three_args })
    }

    /// The program's kernel and signature around another `orchestration` of the same task,
    /// such as the C one a `DeviceObject` carries.
    pub fn builder_with(orchestration: Orchestration) -> ChipCallableBuilder {
        use ArgDirection::{In, Out};
        // SAFETY: `add_kernel` reads exactly two input tensors and writes one output.
        let add = unsafe { CoreCallable::native(vec![In, In, Out], add_kernel) };
        ChipCallable::builder(orchestration)
            .names("add", "add_config")
            .signature(vec![In, In, Out])
            .kernel(ADD, add.named("add"))
    }

    /// The program as a callable.
    pub fn callable() -> Result<ChipCallable, DeviceError> {
        builder().build()
    }

    /// The host computation of `f` (pairs beyond the shorter input are dropped).
    pub fn reference(a: &[f32], b: &[f32]) -> Vec<f32> {
        a.iter().zip(b).map(|(x, y)| x + y).collect()
    }
}

/// The vector example `f = (a + b + 1)(a + b + 2) + (a + b)` over f32; chip arguments `a` (in),
/// `b` (in), `f` (out), all of one shape.
pub mod vector {
    use super::*;

    /// Func id of the kernel `out = x + y` (AIV).
    pub const ADD: u32 = 0;
    /// Func id of the kernel `out = x + s` with an f32 scalar `s` (AIV).
    pub const ADD_SCALAR: u32 = 1;
    /// Func id of the kernel `out = x * y` (AIV).
    pub const MUL: u32 = 2;

    /// The orchestration: five AIV tasks over four intermediate tensors of `a`'s shape,
    /// `c = a + b`, `d = c + 1`, `e = c + 2`, `g = d · e`, `f = g + c`.
    pub fn orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
        use TensorArgType::{Input, Output};
        let (a, b, f) = three_tensors(args)?;
        let shape = a.shape().to_vec();
        let c = ctx.alloc_tensor(&shape, DataType::Float32)?;
        let d = ctx.alloc_tensor(&shape, DataType::Float32)?;
        let e = ctx.alloc_tensor(&shape, DataType::Float32)?;
        let g = ctx.alloc_tensor(&shape, DataType::Float32)?;
        ctx.submit(Kernels::Aiv(ADD), &task_args(&[(a, Input), (b, Input), (c, Output)], None)?)?;
        ctx.submit(Kernels::Aiv(ADD_SCALAR), &task_args(&[(c, Input), (d, Output)], Some(1.0))?)?;
        ctx.submit(Kernels::Aiv(ADD_SCALAR), &task_args(&[(c, Input), (e, Output)], Some(2.0))?)?;
        ctx.submit(Kernels::Aiv(MUL), &task_args(&[(d, Input), (e, Input), (g, Output)], None)?)?;
        ctx.submit(Kernels::Aiv(ADD), &task_args(&[(g, Input), (c, Input), (f, Output)], None)?)?;
        Ok(())
    }

    /// The program's builder, named `vector_example` / `vector_config`.
    pub fn builder() -> ChipCallableBuilder {
        builder_with(Orchestration::Native { entry: orchestration, config: orch_config })
    }

    /// The program's kernels and signature around another `orchestration` of the same graph,
    /// such as the C one a `DeviceObject` carries.
    pub fn builder_with(orchestration: Orchestration) -> ChipCallableBuilder {
        // SAFETY: `mul_kernel` is the program's own kernel for `MUL`.
        unsafe { kernels_around(orchestration, mul_kernel) }
    }

    /// The program with another kernel for `g = d · e` ([`MUL`]), such as one that calls
    /// [`mul`] and declares a time on the chip (see [`builder_with_orchestration_and_mul`]).
    ///
    /// # Safety
    ///
    /// `mul` must be a kernel for [`MUL`]'s signature (`d`, `e` in, `g` out), as
    /// [`CoreCallable::new`] requires.
    pub unsafe fn builder_with_mul(mul: KernelFn) -> ChipCallableBuilder {
        // SAFETY: the caller's contract.
        unsafe {
            builder_with_orchestration_and_mul(
                Orchestration::Native { entry: orchestration, config: orch_config },
                mul,
            )
        }
    }

    /// The program with both another orchestration and another kernel for `g = d · e`
    /// ([`MUL`]; tensors `d`, `e` in, `g` out). The orchestration must submit the same graph as
    /// [`orchestration`] (for instance by calling it, then doing host work of its own) and take
    /// its config from [`orch_config`]; the kernel must compute the same f32 products (for
    /// instance by calling [`mul`], then declaring a time on the chip). Then [`reference()`]
    /// still holds.
    ///
    /// # Safety
    ///
    /// `mul` must be a kernel for [`MUL`]'s signature (`d`, `e` in, `g` out), as
    /// [`CoreCallable::new`] requires.
    pub unsafe fn builder_with_orchestration_and_mul(
        orchestration: Orchestration,
        mul: KernelFn,
    ) -> ChipCallableBuilder {
        // SAFETY: the caller's contract.
        unsafe { kernels_around(orchestration, mul) }
    }

    /// The orchestration's config function: three arguments (`a`, `b`, `f`).
    pub fn orch_config(args: &OrchArgs<'_>) -> OrchConfig {
        three_args(args)
    }

    /// The program's own `g = d · e` kernel ([`MUL`]), for a replacement to build on.
    ///
    /// # Safety
    ///
    /// `args` must be the argument vector the runtime passed to a task of [`MUL`]'s signature.
    pub unsafe extern "C-unwind" fn mul(args: *mut i64) {
        // SAFETY: forwarded contract.
        unsafe { mul_kernel(args) }
    }

    /// # Safety
    ///
    /// `mul` must be a kernel for [`MUL`]'s signature.
    unsafe fn kernels_around(orchestration: Orchestration, mul: KernelFn) -> ChipCallableBuilder {
        use ArgDirection::{In, Out, Scalar};
        // SAFETY: each kernel reads exactly the arguments of the signature it is paired with
        // (`add_kernel` two inputs and an output, `add_scalar_kernel` an input, an output and a
        // scalar); `mul` is the caller's, for `MUL`'s signature.
        let (add, add_scalar, mul) = unsafe {
            (
                CoreCallable::native(vec![In, In, Out], add_kernel),
                CoreCallable::native(vec![In, Out, Scalar], add_scalar_kernel),
                CoreCallable::native(vec![In, In, Out], mul),
            )
        };
        ChipCallable::builder(orchestration)
            .names("vector_example", "vector_config")
            .signature(vec![In, In, Out])
            .kernel(ADD, add.named("add"))
            .kernel(ADD_SCALAR, add_scalar.named("add_scalar"))
            .kernel(MUL, mul.named("mul"))
    }

    /// The program as a callable.
    pub fn callable() -> Result<ChipCallable, DeviceError> {
        builder().build()
    }

    /// The host computation of `f`, in the same f32 operation order as the kernels so that the
    /// device result matches it exactly (pairs beyond the shorter input are dropped).
    pub fn reference(a: &[f32], b: &[f32]) -> Vec<f32> {
        a.iter()
            .zip(b)
            .map(|(x, y)| {
                let s = x + y;
                (s + 1.0) * (s + 2.0) + s
            })
            .collect()
    }
}

/// Batched tile GEMM: `C += A·B` for `N × N` f32 matrices stored tile-major as
/// `[TILES, TILES, TILE, TILE]`; chip arguments `A` (in), `B` (in), `C` (in-out).
pub mod bgemm {
    use super::*;

    /// Rows and columns of one tile.
    pub const TILE: usize = 64;
    /// Tiles along each matrix dimension.
    pub const TILES: usize = 4;
    /// Rows and columns of each matrix.
    pub const N: usize = TILE * TILES;
    /// Func id of the tile product `p = a · b` (AIC).
    pub const GEMM: u32 = 0;
    /// Func id of the tile accumulation `c += p` (AIV).
    pub const ACC: u32 = 1;

    /// `p = a · b` for one tile: tensors `a` (in), `b` (in), `p` (out).
    unsafe extern "C-unwind" fn gemm_kernel(args: *mut i64) {
        // SAFETY: the runtime passes this kernel's argument vector; its signature has three
        // tensors.
        let k = unsafe { KernelCall::from_raw(args, 3) };
        let views = (f32_view(&k, 0), f32_view(&k, 1), f32_view(&k, 2));
        let (Some(a), Some(b), Some(out)) = views else { return };
        if a.1 != TILE * TILE || b.1 != TILE * TILE || out.1 != TILE * TILE {
            return;
        }
        // SAFETY: whole views of this task's device tiles, copied out before anything is written.
        let (a, b) = unsafe { (copy_out(a), copy_out(b)) };
        // Element `(r, c)` of the product, summed over `k` in order from zero.
        let product = |i: usize| {
            let (r, c) = (i / TILE, i % TILE);
            let row = a.iter().skip(r * TILE).take(TILE);
            let col = b.iter().skip(c).step_by(TILE);
            row.zip(col).fold(0.0f32, |acc, (x, y)| acc + x * y)
        };
        // SAFETY: the call's share of the output view's elements, of this task's device tile.
        unsafe { elementwise(out, call_share(&k, out.1), product) };
    }

    /// `c += p` for one tile: tensors `c` (in-out), `p` (in).
    unsafe extern "C-unwind" fn accumulate_kernel(args: *mut i64) {
        // SAFETY: the runtime passes this kernel's argument vector; its signature has two
        // tensors.
        let k = unsafe { KernelCall::from_raw(args, 2) };
        let (Some(c), Some(p)) = (f32_view(&k, 0), f32_view(&k, 1)) else { return };
        // SAFETY: the length bounds both views; the views name this task's device tiles. Each
        // element of `c` is read before the same call writes it, and no other call handles it.
        unsafe { elementwise(c, call_share(&k, c.1.min(p.1)), |i| load(c, i) + load(p, i)) };
    }

    /// The orchestration: for every output tile `(i, j)` and every `k`, a product task into a
    /// fresh temporary tile, then an accumulation into `C[i][j]` (InOut, so the accumulations
    /// of one tile run in order).
    pub fn orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
        use TensorArgType::{InOut, Input, Output};
        let (a, b, c) = three_tensors(args)?;
        let t = TILE as u32;
        let tile = |m: &Tensor, r: u32, col: u32| {
            m.view(&[1, 1, t, t], &[r, col, 0, 0]).map_err(|_| bad_arguments())
        };
        for i in 0..TILES as u32 {
            for j in 0..TILES as u32 {
                for k in 0..TILES as u32 {
                    let p = ctx.alloc_tensor(&[1, 1, t, t], DataType::Float32)?;
                    let product = [(tile(&a, i, k)?, Input), (tile(&b, k, j)?, Input), (p, Output)];
                    ctx.submit(Kernels::Aic(GEMM), &task_args(&product, None)?)?;
                    let acc = [(tile(&c, i, j)?, InOut), (p, Input)];
                    ctx.submit(Kernels::Aiv(ACC), &task_args(&acc, None)?)?;
                }
            }
        }
        Ok(())
    }

    /// The program's builder, named `bgemm` / `bgemm_config`.
    pub fn builder() -> ChipCallableBuilder {
        use ArgDirection::{In, InOut, Out};
        // SAFETY: `gemm_kernel` reads two input tiles and writes an output one;
        // `accumulate_kernel` updates its first tile with its second.
        let (gemm, accumulate) = unsafe {
            (
                CoreCallable::native(vec![In, In, Out], gemm_kernel),
                CoreCallable::native(vec![InOut, In], accumulate_kernel),
            )
        };
        ChipCallable::native(orchestration, three_args)
            .names("bgemm", "bgemm_config")
            .signature(vec![In, In, InOut])
            .kernel(GEMM, gemm.named("gemm"))
            .kernel(ACC, accumulate.named("accumulate"))
    }

    /// The program as a callable.
    pub fn callable() -> Result<ChipCallable, DeviceError> {
        builder().build()
    }

    /// The chip-argument shape of each matrix, `[TILES, TILES, TILE, TILE]`.
    pub fn shape() -> [u32; 4] {
        [TILES as u32, TILES as u32, TILE as u32, TILE as u32]
    }

    /// Row-major `N × N` to tile-major `[TILES, TILES, TILE, TILE]`; missing elements of a
    /// short `m` read as zero.
    pub fn tile_major(m: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0; N * N];
        for (i, v) in m.iter().take(N * N).enumerate() {
            let (r, c) = (i / N, i % N);
            out[((r / TILE * TILES + c / TILE) * TILE + r % TILE) * TILE + c % TILE] = *v;
        }
        out
    }

    /// The host GEMM `A·B` of row-major `N × N` matrices, row-major (missing elements of a
    /// short input read as zero).
    pub fn reference(a: &[f32], b: &[f32]) -> Vec<f32> {
        let at = |m: &[f32], i: usize| m.get(i).copied().unwrap_or(0.0);
        let mut out = vec![0f32; N * N];
        for r in 0..N {
            for k in 0..N {
                let x = at(a, r * N + k);
                for c in 0..N {
                    out[r * N + c] += x * at(b, k * N + c);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod kernel_tests;
pub mod paged_attention;
pub mod streaming;

#[cfg(all(test, feature = "sim"))]
mod tests {
    use simpler_types::{CallConfig, RunId, TaskArgs};

    use super::*;
    use crate::options::{RunnerOptions, RuntimeVariant};
    use crate::runner::{DevicePtr, DeviceRunner, RunRequest};

    /// Runs `callable` once on a fresh simulated chip over f32 chip arguments `inputs` (each
    /// `(values, tag)`, all of `shape`) and returns the last argument's contents afterwards.
    fn run_once(
        callable: &ChipCallable,
        shape: &[u32],
        inputs: &[(Vec<f32>, TensorArgType)],
    ) -> Vec<f32> {
        let mut runner =
            DeviceRunner::attach(RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph))
                .expect("attach");
        let slot = runner.register_callable(callable).expect("register");
        let mut args = TaskArgs::new();
        let mut ptrs: Vec<(DevicePtr, usize)> = Vec::new();
        for (values, tag) in inputs {
            let bytes = f32_to_le_bytes(values);
            let p = runner.malloc(bytes.len() as u64).expect("malloc");
            runner.copy_to_device(p, &bytes).expect("copy in");
            let t = Tensor::external(p.addr(), shape, DataType::Float32).expect("tensor");
            args.add_tensor(t.child_memory(true), *tag).expect("argument");
            ptrs.push((p, bytes.len()));
        }
        let id = RunId::from_raw(1).expect("run id");
        runner.run(&RunRequest::new(id, slot, &args, &CallConfig::default())).expect("run");
        let (out, len) = *ptrs.last().expect("an output");
        let mut raw = vec![0u8; len];
        runner.copy_from_device(&mut raw, out).expect("copy out");
        for (p, _) in ptrs {
            runner.free(p).expect("free");
        }
        runner.finalize().expect("finalize");
        f32_from_le_bytes(&raw)
    }

    fn inputs(n: usize) -> (Vec<f32>, Vec<f32>) {
        let a = (0..n).map(|i| (i % 97) as f32 * 0.25).collect();
        let b = (0..n).map(|i| 1.5 - (i % 13) as f32).collect();
        (a, b)
    }

    #[test]
    fn the_add_and_vector_programs_match_their_host_references_exactly() {
        use TensorArgType::{Input, Output};
        let n = 1000;
        let (a, b) = inputs(n);
        // NaN outputs (all bits set) equal nothing, so only written elements can match.
        let poisoned = vec![f32::from_bits(u32::MAX); n];
        // A replacement orchestration and product kernel built on the program's own.
        fn wrapped(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
            vector::orchestration(ctx, args)
        }
        // SAFETY: `vector::mul` is the program's own kernel for `MUL`.
        let rebuilt = unsafe {
            vector::builder_with_orchestration_and_mul(
                Orchestration::Native { entry: wrapped, config: vector::orch_config },
                vector::mul,
            )
        }
        .names("vector_rebuilt", "vector_rebuilt_config")
        .build()
        .expect("rebuilt vector");
        for (callable, reference) in [
            (add::callable().expect("add"), add::reference(&a, &b)),
            (vector::callable().expect("vector"), vector::reference(&a, &b)),
            (rebuilt, vector::reference(&a, &b)),
        ] {
            let args = [(a.clone(), Input), (b.clone(), Input), (poisoned.clone(), Output)];
            let got = run_once(&callable, &[n as u32], &args);
            assert_eq!(got, reference, "program {}", callable.entry_name());
        }
    }

    #[test]
    fn the_bgemm_program_matches_the_host_gemm() {
        use TensorArgType::{InOut, Input};
        let a: Vec<f32> = (0..bgemm::N * bgemm::N).map(|x| ((x * 7) % 13) as f32 * 0.125).collect();
        let b: Vec<f32> = (0..bgemm::N * bgemm::N).map(|x| ((x * 5) % 11) as f32 * 0.25).collect();
        let args = [
            (bgemm::tile_major(&a), Input),
            (bgemm::tile_major(&b), Input),
            (vec![0.0; bgemm::N * bgemm::N], InOut),
        ];
        let got = run_once(&bgemm::callable().expect("bgemm"), &bgemm::shape(), &args);
        let expected = bgemm::tile_major(&bgemm::reference(&a, &b));
        let scale = expected.iter().fold(1f32, |m, v| m.max(v.abs()));
        let max_err = got.iter().zip(&expected).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
        assert_eq!(got.len(), expected.len());
        assert!(max_err <= 1e-5 * scale, "max error {max_err} against scale {scale}");
    }

    #[test]
    fn a_missing_chip_argument_is_reported_not_panicked() {
        let empty = TaskArgs::new();
        let mut runner =
            DeviceRunner::attach(RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph))
                .expect("attach");
        let slot = runner.register_callable(&vector::callable().expect("vector")).expect("reg");
        let id = RunId::from_raw(1).expect("run id");
        let r = runner.run(&RunRequest::new(id, slot, &empty, &CallConfig::default()));
        assert!(r.is_err(), "a run without its three chip arguments must fail: {r:?}");
        runner.finalize().expect("finalize");
    }
}
