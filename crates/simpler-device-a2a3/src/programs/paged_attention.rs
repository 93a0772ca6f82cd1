//! A paged-attention-shaped program: one attention head per request over a key/value cache
//! stored in fixed-size blocks that requests reach through a block table.
//!
//! Chip arguments, in order: `q` (in, f32 `[requests, head_dim]`), `k_cache` and `v_cache` (in,
//! f32 `[pool_blocks, block_tokens, head_dim]`), `block_table` (in, i32 `[requests,
//! max_blocks]`), `context_lens` (in, i32 `[requests]`) and `out` (out, f32 `[requests,
//! head_dim]`). Request `r` attends to its first `context_lens[r]` tokens, which live in the
//! cache blocks `block_table[r][0..⌈context_lens[r] / block_tokens⌉)`:
//! `out[r] = softmax(q[r] · Kᵀ · scale) · V` with `scale = 1/√head_dim`, and zeros for an empty
//! context.
//!
//! The orchestration reads the block table and the context lengths from device memory, so the
//! number of tasks depends on the data: per request, in a scope of its own, one task resets a
//! running softmax state (`[max, sum, acc[head_dim]]`, allocated in the scope), then per block a
//! score task on AIC (`s = q · K_blockᵀ · scale` over a slice of the shared key cache) and an
//! update task on AIV (the online-softmax step over the block's valid tokens and its slice of
//! the value cache, in-out on the state, so a request's blocks are folded in order), and a last
//! task that writes `acc / sum` into the request's row of `out`.
//!
//! The device computes in f32 with the online softmax; [`PagedAttention::reference`] computes
//! the plain softmax in f64. They agree within [`TOLERANCE`] for the bounded inputs
//! [`PagedAttention::example`] makes (values in `[−1, 1]`); the device results of the two
//! runtimes agree bit for bit, since every kernel runs its arithmetic in a fixed order.

use super::*;

/// Func id of the state reset `state = [−∞, 0, 0…]` (AIV): tensor `state` (out).
pub const INIT: u32 = 0;
/// Func id of the block scores `s = q · K_blockᵀ · scale` (AIC): tensors `q` (in, one row),
/// `k` (in, one block), `s` (out, one score per block token), then the f32 scalar `scale`.
pub const SCORES: u32 = 1;
/// Func id of the online-softmax update (AIV): tensors `state` (in-out), `s` (in), `v` (in,
/// one block), then the u32 scalar `valid` (tokens of the block that count).
pub const UPDATE: u32 = 2;
/// Func id of the output `out = acc / sum` (AIV): tensors `state` (in), `out` (out, one row).
pub const FINISH: u32 = 3;

/// Largest absolute difference allowed between a device output and [`PagedAttention::reference`]
/// for inputs in `[−1, 1]`.
pub const TOLERANCE: f32 = 1e-5;

/// The score scale of a head of `head_dim` elements, `1/√head_dim`.
pub fn scale(head_dim: usize) -> f32 {
    1.0 / (head_dim.max(1) as f32).sqrt()
}

/// `state = [−∞, 0, 0…]`: tensor `state` (out).
unsafe extern "C-unwind" fn init_kernel(args: *mut i64) {
    // SAFETY: the runtime passes this kernel's argument vector; its signature has one tensor.
    let k = unsafe { KernelCall::from_raw(args, 1) };
    let Some(state) = f32_view(&k, 0) else { return };
    let init = |i: usize| if i == 0 { f32::NEG_INFINITY } else { 0.0 };
    // SAFETY: `state.1` bounds the view; the view names this task's device buffer.
    unsafe { elementwise(state, call_share(&k, state.1), init) };
}

/// `s[t] = scale · Σ_d q[d] · k[t][d]`: tensors `q` (in), `k` (in), `s` (out), scalar `scale`.
unsafe extern "C-unwind" fn scores_kernel(args: *mut i64) {
    // SAFETY: the runtime passes this kernel's argument vector; its signature has three tensors.
    let k = unsafe { KernelCall::from_raw(args, 3) };
    let (Some(scale), Some(q), Some(kb), Some(s)) =
        (k.scalar_of::<f32>(0), f32_view(&k, 0), f32_view(&k, 1), f32_view(&k, 2))
    else {
        return;
    };
    if q.1 == 0 || Some(kb.1) != s.1.checked_mul(q.1) {
        return;
    }
    // SAFETY: whole views of this task's device buffers, copied out before anything is written.
    let (q, kb) = unsafe { (copy_out(q), copy_out(kb)) };
    // The score of token `t`: row `t` of the block (in range, as `kb` holds `s.1` rows).
    let dim = q.len();
    let score = |t: usize| {
        let row = kb.iter().skip(t * dim).take(dim);
        row.zip(&q).map(|(a, b)| a * b).sum::<f32>() * scale
    };
    // SAFETY: the call's share of the output view's elements, of this task's device buffer.
    unsafe { elementwise(s, call_share(&k, s.1), score) };
}

/// The online-softmax step over the first `valid` tokens of a block: tensors `state` (in-out,
/// `[max, sum, acc…]`), `s` (in), `v` (in), scalar `valid`.
///
/// Every element of the new state depends on the whole old one, so the first copy of block 0
/// of the task does the whole step and every other call returns at once: calls that split the
/// state would read elements another call has already written, and a second call doing the
/// whole step would apply it twice.
unsafe extern "C-unwind" fn update_kernel(args: *mut i64) {
    // SAFETY: as in `scores_kernel`.
    let k = unsafe { KernelCall::from_raw(args, 3) };
    if k.block_idx() != 0 || k.copy_idx() != 0 {
        return;
    }
    let (Some(valid), Some(state), Some(s), Some(v)) =
        (k.scalar_of::<u32>(0), f32_view(&k, 0), f32_view(&k, 1), f32_view(&k, 2))
    else {
        return;
    };
    let Some(dim) = state.1.checked_sub(2).filter(|&d| d > 0) else { return };
    if Some(v.1) != s.1.checked_mul(dim) {
        return;
    }
    let valid = (valid as usize).min(s.1);
    if valid == 0 {
        return;
    }
    // SAFETY: whole views of this task's device buffers, copied out before anything is written.
    let (st, s, v) = unsafe { (copy_out(state), copy_out(s), copy_out(v)) };
    let block_max = s[..valid].iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let max = st[0].max(block_max);
    // The first block finds max = −∞ in the state: the correction is exp(−∞) = 0.
    let correction = (st[0] - max).exp();
    let mut sum = st[1] * correction;
    let mut acc: Vec<f32> = st[2..].iter().map(|a| a * correction).collect();
    for (t, row) in v.chunks_exact(dim).take(valid).enumerate() {
        let p = (s[t] - max).exp();
        sum += p;
        for (a, x) in acc.iter_mut().zip(row) {
            *a += p * x;
        }
    }
    let new_state = |i: usize| match i {
        0 => max,
        1 => sum,
        _ => acc[i - 2],
    };
    // SAFETY: the state view has `dim + 2` elements, as `new_state` covers.
    unsafe { elementwise(state, 0..dim + 2, new_state) };
}

/// `out = acc / sum` (zeros when nothing was attended): tensors `state` (in), `out` (out).
unsafe extern "C-unwind" fn finish_kernel(args: *mut i64) {
    // SAFETY: the runtime passes this kernel's argument vector; its signature has two tensors.
    let k = unsafe { KernelCall::from_raw(args, 2) };
    let (Some(state), Some(out)) = (f32_view(&k, 0), f32_view(&k, 1)) else { return };
    if Some(state.1) != out.1.checked_add(2) {
        return;
    }
    // SAFETY: a whole view of this task's device buffer.
    let st = unsafe { copy_out(state) };
    let sum = st[1];
    let value = |i: usize| if sum > 0.0 { st[i + 2] / sum } else { 0.0 };
    // SAFETY: `out.1` bounds the output view; the view names this task's device buffer.
    unsafe { elementwise(out, call_share(&k, out.1), value) };
}

/// The chip arguments as the orchestration checked them.
struct Operands {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    requests: u32,
    head_dim: u32,
    block_tokens: u32,
    pool_blocks: u32,
    max_blocks: u32,
}

impl Operands {
    /// The six chip arguments, when their ranks, shapes and data types fit together.
    fn check(args: &OrchArgs<'_>) -> Option<(Operands, Tensor, Tensor)> {
        let [q, k, v, table, lens, out] = std::array::from_fn(|i| args.tensor(i).copied());
        let (q, k, v, table, lens, out) = (q?, k?, v?, table?, lens?, out?);
        let f32s = [q, k, v, out].iter().all(|t| t.data_type().ok() == Some(DataType::Float32));
        let i32s = [table, lens].iter().all(|t| t.data_type().ok() == Some(DataType::Int32));
        let (&[requests, head_dim], &[pool_blocks, block_tokens, k_dim], &[rows, max_blocks]) =
            (q.shape(), k.shape(), table.shape())
        else {
            return None;
        };
        let fits = f32s
            && i32s
            && head_dim > 0
            && block_tokens > 0
            && k_dim == head_dim
            && v.shape() == k.shape()
            && out.shape() == q.shape()
            && rows == requests
            && lens.shape() == [requests];
        let ops =
            Operands { q, k, v, out, requests, head_dim, block_tokens, pool_blocks, max_blocks };
        fits.then_some((ops, table, lens))
    }
}

/// The i32 values of a whole chip tensor, read through the orchestration API. The read is sized
/// from the tensor's shape, so the shape is checked against the buffer it names before
/// anything is allocated for it (a null tensor names no bytes).
fn read_i32s(ctx: &mut OrchCtx<'_>, t: &Tensor) -> Result<Vec<i32>, OrchError> {
    let bytes = t
        .numel()
        .checked_mul(4)
        .filter(|&b| t.addr != 0 && b <= t.size)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(bad_arguments)?;
    let mut raw = Vec::new();
    raw.try_reserve_exact(bytes).map_err(|_| bad_arguments())?;
    raw.resize(bytes, 0);
    ctx.tensor_data(t, &mut raw)?;
    Ok(raw.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// The orchestration: per request a scope with the state reset, a score and an update task per
/// block its context covers, and the output task.
pub fn orchestration(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let (ops, table, lens) = Operands::check(args).ok_or_else(bad_arguments)?;
    let table = read_i32s(ctx, &table)?;
    let lens = read_i32s(ctx, &lens)?;
    let scale = scale(ops.head_dim as usize);
    for r in 0..ops.requests {
        let len = u32::try_from(lens[r as usize]).map_err(|_| bad_arguments())?;
        let blocks = len.div_ceil(ops.block_tokens);
        if blocks > ops.max_blocks {
            return Err(bad_arguments());
        }
        let row = (r as usize).checked_mul(ops.max_blocks as usize).ok_or_else(bad_arguments)?;
        let end = row.checked_add(blocks as usize).ok_or_else(bad_arguments)?;
        let blocks = table.get(row..end).ok_or_else(bad_arguments)?;
        ctx.scope(|ctx| submit_request(ctx, &ops, r, len, blocks, scale))??;
    }
    Ok(())
}

/// Submits request `r`'s tasks over its `len` tokens in the cache blocks `blocks`.
fn submit_request(
    ctx: &mut OrchCtx<'_>,
    ops: &Operands,
    r: u32,
    len: u32,
    blocks: &[i32],
    scale: f32,
) -> Result<(), OrchError> {
    use TensorArgType::{InOut, Input, Output};
    let (dim, tokens) = (ops.head_dim, ops.block_tokens);
    let bad = |_| bad_arguments();
    let q_row = ops.q.view(&[1, dim], &[r, 0]).map_err(bad)?;
    let state =
        ctx.alloc_tensor(&[dim.checked_add(2).ok_or_else(bad_arguments)?], DataType::Float32)?;
    ctx.submit(Kernels::Aiv(INIT), &task_args(&[(state, Output)], None)?)?;
    for (j, &block) in blocks.iter().enumerate() {
        let block =
            u32::try_from(block).ok().filter(|&b| b < ops.pool_blocks).ok_or_else(bad_arguments)?;
        let k_block = ops.k.view(&[1, tokens, dim], &[block, 0, 0]).map_err(bad)?;
        let v_block = ops.v.view(&[1, tokens, dim], &[block, 0, 0]).map_err(bad)?;
        let s = ctx.alloc_tensor(&[tokens], DataType::Float32)?;
        let score = [(q_row, Input), (k_block, Input), (s, Output)];
        ctx.submit(Kernels::Aic(SCORES), &task_args(&score, Some(scale))?)?;
        let valid = tokens.min(len - j as u32 * tokens);
        let mut update = task_args(&[(state, InOut), (s, Input), (v_block, Input)], None)?;
        update.add_scalar_of(valid).map_err(|_| bad_arguments())?;
        ctx.submit(Kernels::Aiv(UPDATE), &update)?;
    }
    let out_row = ops.out.view(&[1, dim], &[r, 0]).map_err(bad)?;
    ctx.submit(Kernels::Aiv(FINISH), &task_args(&[(state, Input), (out_row, Output)], None)?)?;
    Ok(())
}

/// The config: six chip tensors.
fn config(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 6 }
}

/// The program's builder, named `paged_attention` / `paged_attention_config`.
pub fn builder() -> ChipCallableBuilder {
    use ArgDirection::{In, InOut, Out, Scalar};
    // SAFETY: each kernel reads exactly the arguments of the signature it is paired with:
    // `init_kernel` one output, `scores_kernel` three tensors and a scalar, `update_kernel` an
    // updated tensor, two inputs and a scalar, `finish_kernel` an input and an output.
    let (init, scores, update, finish) = unsafe {
        (
            CoreCallable::native(vec![Out], init_kernel),
            CoreCallable::native(vec![In, In, Out, Scalar], scores_kernel),
            CoreCallable::native(vec![InOut, In, In, Scalar], update_kernel),
            CoreCallable::native(vec![In, Out], finish_kernel),
        )
    };
    ChipCallable::native(orchestration, config)
        .names("paged_attention", "paged_attention_config")
        .signature(vec![In, In, In, In, In, Out])
        .kernel(INIT, init)
        .kernel(SCORES, scores)
        .kernel(UPDATE, update)
        .kernel(FINISH, finish)
}

/// The program as a callable.
pub fn callable() -> Result<ChipCallable, DeviceError> {
    builder().build()
}

/// One problem: the host values of the five inputs and their dimensions.
#[derive(Clone, PartialEq, Debug)]
pub struct PagedAttention {
    /// Requests (rows of `q` and `out`).
    pub requests: usize,
    /// Elements of one head.
    pub head_dim: usize,
    /// Tokens of one cache block.
    pub block_tokens: usize,
    /// Blocks of the key and value caches.
    pub pool_blocks: usize,
    /// Columns of the block table.
    pub max_blocks: usize,
    /// `[requests, head_dim]`.
    pub q: Vec<f32>,
    /// `[pool_blocks, block_tokens, head_dim]`.
    pub k_cache: Vec<f32>,
    /// `[pool_blocks, block_tokens, head_dim]`.
    pub v_cache: Vec<f32>,
    /// `[requests, max_blocks]`: cache block of each request's `j`-th block of tokens.
    pub block_table: Vec<i32>,
    /// `[requests]`: tokens each request attends to.
    pub context_lens: Vec<i32>,
}

impl PagedAttention {
    /// A deterministic problem of `requests` requests with 16-element heads, 16-token blocks,
    /// 8 blocks per request at most and a 32-block cache; the context lengths cycle through
    /// empty, one token, exactly one block, one block and a token, and longer contexts up to
    /// the full 128 tokens, and requests share cache blocks (as prefix sharing does). Every
    /// value lies in `[−1, 1]`.
    pub fn example(requests: usize) -> PagedAttention {
        let (head_dim, block_tokens, pool_blocks, max_blocks) = (16, 16, 32, 8);
        let mut x = 0x2545_f491_u32;
        let mut next = move || {
            // A linear congruential generator: reproducible inputs without a dependency.
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        };
        let q = (0..requests * head_dim).map(|_| next()).collect();
        let cache = pool_blocks * block_tokens * head_dim;
        let k_cache = (0..cache).map(|_| next()).collect();
        let v_cache = (0..cache).map(|_| next()).collect();
        const LENS: [i32; 8] = [0, 1, 16, 17, 40, 77, 100, 128];
        let context_lens = (0..requests).map(|r| LENS[r % LENS.len()]).collect();
        let block_table = (0..requests * max_blocks)
            .map(|i| ((i / max_blocks * 5 + i % max_blocks * 3) % pool_blocks) as i32)
            .collect();
        PagedAttention {
            requests,
            head_dim,
            block_tokens,
            pool_blocks,
            max_blocks,
            q,
            k_cache,
            v_cache,
            block_table,
            context_lens,
        }
    }

    /// Checks that the dimensions are non-zero and fit the chip's `u32` shapes, and that every
    /// vector holds what they say. The values themselves (a block outside the cache, a context
    /// past the table) are the orchestration's to refuse; [`reference`](Self::reference) checks
    /// those too.
    pub fn check_shapes(&self) -> Result<(), InvalidProblem> {
        let dims = [
            ("requests", self.requests),
            ("head_dim", self.head_dim),
            ("block_tokens", self.block_tokens),
            ("pool_blocks", self.pool_blocks),
            ("max_blocks", self.max_blocks),
        ];
        for (what, value) in dims {
            if value == 0 {
                return Err(InvalidProblem::Zero { what });
            }
            if u32::try_from(value).is_err() {
                return Err(InvalidProblem::TooLarge { what, value });
            }
        }
        let product = |a: usize, b: usize, c: usize| a.checked_mul(b)?.checked_mul(c);
        let cache = product(self.pool_blocks, self.block_tokens, self.head_dim);
        let lengths = [
            ("q", self.q.len(), self.requests.checked_mul(self.head_dim)),
            ("k_cache", self.k_cache.len(), cache),
            ("v_cache", self.v_cache.len(), cache),
            ("block_table", self.block_table.len(), self.requests.checked_mul(self.max_blocks)),
            ("context_lens", self.context_lens.len(), Some(self.requests)),
        ];
        for (what, len, needed) in lengths {
            if needed != Some(len) {
                return Err(InvalidProblem::Length { what, len, needed });
            }
        }
        Ok(())
    }

    /// The five inputs in chip-argument order, each as its little-endian bytes, shape and data
    /// type.
    pub fn inputs(&self) -> Result<[HostInput; 5], InvalidProblem> {
        self.check_shapes()?;
        // Every dimension fits in u32 (checked above).
        let dims = |d: &[usize]| d.iter().map(|&x| x as u32).collect::<Vec<u32>>();
        let i32_bytes = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let cache = dims(&[self.pool_blocks, self.block_tokens, self.head_dim]);
        Ok([
            (f32_to_le_bytes(&self.q), dims(&[self.requests, self.head_dim]), DataType::Float32),
            (f32_to_le_bytes(&self.k_cache), cache.clone(), DataType::Float32),
            (f32_to_le_bytes(&self.v_cache), cache, DataType::Float32),
            (
                i32_bytes(&self.block_table),
                dims(&[self.requests, self.max_blocks]),
                DataType::Int32,
            ),
            (i32_bytes(&self.context_lens), dims(&[self.requests]), DataType::Int32),
        ])
    }

    /// The shape of `out` (and `q`), `[requests, head_dim]`.
    pub fn out_shape(&self) -> Result<Vec<u32>, InvalidProblem> {
        self.check_shapes()?;
        Ok(vec![self.requests as u32, self.head_dim as u32])
    }

    /// Tasks the orchestration submits: per request two, plus two per block its context covers.
    pub fn tasks(&self) -> Result<u64, InvalidProblem> {
        self.check_shapes()?;
        let blocks =
            |len: &i32| u64::from(len.max(&0).unsigned_abs()).div_ceil(self.block_tokens as u64);
        Ok(self.context_lens.iter().map(|len| 2 + 2 * blocks(len)).sum())
    }

    /// The host computation of `out` (row-major `[requests, head_dim]`): the plain softmax over
    /// each request's tokens in f64, zeros for an empty context. Refuses what the orchestration
    /// refuses: a context longer than the table's row, a block outside the cache.
    pub fn reference(&self) -> Result<Vec<f32>, InvalidProblem> {
        self.check_shapes()?;
        let (dim, tokens) = (self.head_dim, self.block_tokens);
        let scale = f64::from(scale(dim));
        let mut out = vec![0f32; self.requests * dim];
        for (r, row) in out.chunks_exact_mut(dim).enumerate() {
            let len = self.context_lens[r];
            let max = self.max_blocks * tokens;
            let len = usize::try_from(len)
                .ok()
                .filter(|&l| l <= max)
                .ok_or(InvalidProblem::ContextLength { request: r, len, max })?;
            let q = &self.q[r * dim..(r + 1) * dim];
            // Offsets of the request's tokens in the caches.
            let mut at: Vec<usize> = Vec::with_capacity(len);
            for t in 0..len {
                let entry = self.block_table[r * self.max_blocks + t / tokens];
                let block = usize::try_from(entry).ok().filter(|&b| b < self.pool_blocks).ok_or(
                    InvalidProblem::BlockOutside {
                        request: r,
                        entry,
                        pool_blocks: self.pool_blocks,
                    },
                )?;
                at.push((block * tokens + t % tokens) * dim);
            }
            let scores: Vec<f64> = at
                .iter()
                .map(|&o| {
                    let k = &self.k_cache[o..o + dim];
                    q.iter().zip(k).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() * scale
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            for (d, slot) in row.iter_mut().enumerate() {
                let acc: f64 =
                    at.iter().zip(&weights).map(|(&o, w)| w * f64::from(self.v_cache[o + d])).sum();
                *slot = if sum > 0.0 { (acc / sum) as f32 } else { 0.0 };
            }
        }
        Ok(out)
    }
}

/// One input of a problem: its little-endian bytes, shape and data type.
pub type HostInput = (Vec<u8>, Vec<u32>, DataType);

/// Why a [`PagedAttention`] problem's fields do not describe a problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidProblem {
    /// A dimension is 0.
    #[error("paged attention: {what} is 0")]
    Zero {
        /// The field.
        what: &'static str,
    },
    /// A dimension does not fit a chip tensor's `u32` shape.
    #[error("paged attention: {what} = {value} does not fit in u32")]
    TooLarge {
        /// The field.
        what: &'static str,
        /// Its value.
        value: usize,
    },
    /// A vector does not hold what the dimensions say (`needed` is `None` when their product
    /// overflows).
    #[error("paged attention: {what} holds {len} values, the dimensions need {needed:?}")]
    Length {
        /// The field.
        what: &'static str,
        /// Values it holds.
        len: usize,
        /// Values the dimensions need.
        needed: Option<usize>,
    },
    /// A request's context is negative or longer than its row of the block table covers.
    #[error("paged attention: request {request} has context length {len}, outside 0..={max}")]
    ContextLength {
        /// The request.
        request: usize,
        /// Its context length.
        len: i32,
        /// The longest its row covers.
        max: usize,
    },
    /// A block of a request's context is outside the cache.
    #[error(
        "paged attention: request {request} names cache block {entry}, outside the {pool_blocks} \
         blocks the cache holds"
    )]
    BlockOutside {
        /// The request.
        request: usize,
        /// The table's entry.
        entry: i32,
        /// Blocks of the cache.
        pool_blocks: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_covers_empty_partial_and_full_contexts_within_its_table() {
        let p = PagedAttention::example(8);
        assert_eq!(p.context_lens, vec![0, 1, 16, 17, 40, 77, 100, 128]);
        let blocks = [0, 1, 1, 2, 3, 5, 7, 8];
        assert_eq!(p.tasks(), Ok(blocks.iter().map(|b| 2 + 2 * b).sum::<u64>()));
        assert!(p.block_table.iter().all(|&b| (0..p.pool_blocks as i32).contains(&b)));
        let r = p.reference().unwrap();
        assert!(r[..p.head_dim].iter().all(|&x| x == 0.0), "an empty context attends to nothing");
        // One token: the output is that token's value row.
        let one = (p.block_table[p.max_blocks] as usize * p.block_tokens) * p.head_dim;
        assert_eq!(&r[p.head_dim..2 * p.head_dim], &p.v_cache[one..one + p.head_dim]);
    }

    #[test]
    fn inconsistent_fields_are_refused_not_panicked_on() {
        let p = PagedAttention::example(4);
        let zero = PagedAttention { block_tokens: 0, ..p.clone() };
        assert_eq!(zero.tasks(), Err(InvalidProblem::Zero { what: "block_tokens" }));
        assert_eq!(
            PagedAttention { head_dim: 0, ..p.clone() }.reference(),
            Err(InvalidProblem::Zero { what: "head_dim" })
        );
        let short = PagedAttention { q: vec![0.0; 3], ..p.clone() };
        assert_eq!(
            short.reference(),
            Err(InvalidProblem::Length { what: "q", len: 3, needed: Some(64) })
        );
        let wide = PagedAttention { requests: usize::MAX, ..p.clone() };
        let e = wide.inputs().unwrap_err();
        assert_eq!(e, InvalidProblem::TooLarge { what: "requests", value: usize::MAX });
        let mut outside = p.clone();
        outside.block_table[3 * p.max_blocks + 1] = p.pool_blocks as i32;
        assert!(outside.inputs().is_ok(), "the orchestration's to refuse");
        assert!(matches!(
            outside.reference(),
            Err(InvalidProblem::BlockOutside { request: 3, .. })
        ));
        let mut negative = p.clone();
        negative.context_lens[1] = -1;
        assert!(matches!(negative.reference(), Err(InvalidProblem::ContextLength { .. })));
    }
}
