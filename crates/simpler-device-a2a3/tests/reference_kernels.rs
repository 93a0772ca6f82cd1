//! The reference kernels on the simulated chip, in tasks of several blocks: block `b` of `n`
//! writes only the elements `[len·b/n, len·(b+1)/n)` of its output, so the blocks of a task
//! together compute it once; and a kernel handed a view that is not 4-byte aligned writes
//! nothing. On the runtime under test (`SIMPLER_TEST_RUNTIME`).

mod common;

use common::*;
use simpler_device_a2a3::programs::add;
use simpler_device_a2a3::{
    DevicePtr, DeviceRunner, KernelFn, Kernels, OrchArgs, OrchCtx, OrchError, Orchestration,
    RunRequest,
};
use simpler_types::{CallConfig, CoreArgs, DataType, RunId, TaskArgs, Tensor, TensorArgType};

/// The bits of an element no kernel wrote: a NaN, equal to no computed value.
const POISON: u32 = u32::MAX;

fn bad() -> OrchError {
    OrchError::from_status(-1)
}

fn core_args(
    tensors: &[(Tensor, TensorArgType)],
    scalar: Option<f32>,
) -> Result<CoreArgs, OrchError> {
    let mut a = CoreArgs::new();
    for (t, tag) in tensors {
        a.add_tensor(*t, *tag).map_err(|_| bad())?;
    }
    if let Some(s) = scalar {
        a.add_scalar_of(s).map_err(|_| bad())?;
    }
    Ok(a)
}

/// The vector example's graph with every task as wide as the launch (`block_dim` blocks).
fn wide_vector(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    use TensorArgType::{Input, Output};
    let blocks = ctx.available_clusters();
    let t = |i| args.tensor(i).copied().ok_or_else(bad);
    let (a, b, f) = (t(0)?, t(1)?, t(2)?);
    let shape = a.shape().to_vec();
    let c = ctx.alloc_tensor(&shape, DataType::Float32)?;
    let d = ctx.alloc_tensor(&shape, DataType::Float32)?;
    let e = ctx.alloc_tensor(&shape, DataType::Float32)?;
    let g = ctx.alloc_tensor(&shape, DataType::Float32)?;
    let mut submit = |func, tensors: &[(Tensor, TensorArgType)], s| {
        ctx.submit_blocks(Kernels::Aiv(func), &core_args(tensors, s)?, blocks)
    };
    submit(vector::ADD, &[(a, Input), (b, Input), (c, Output)], None)?;
    submit(vector::ADD_SCALAR, &[(c, Input), (d, Output)], Some(1.0))?;
    submit(vector::ADD_SCALAR, &[(c, Input), (e, Output)], Some(2.0))?;
    submit(vector::MUL, &[(d, Input), (e, Input), (g, Output)], None)?;
    submit(vector::ADD, &[(g, Input), (c, Input), (f, Output)], None)?;
    Ok(())
}

/// One task `f = a · b` of the product kernel, as wide as the launch.
fn wide_mul(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    use TensorArgType::{Input, Output};
    let blocks = ctx.available_clusters();
    let t = |i| args.tensor(i).copied().ok_or_else(bad);
    let tensors = [(t(0)?, Input), (t(1)?, Input), (t(2)?, Output)];
    ctx.submit_blocks(Kernels::Aiv(vector::MUL), &core_args(&tensors, None)?, blocks)?;
    Ok(())
}

/// The vector program's product kernel in block `B` of its task only; the other blocks return
/// at once, so the output shows what block `B` wrote.
unsafe extern "C-unwind" fn mul_in_block<const B: u32>(args: *mut i64) {
    // SAFETY: `args` is the argument vector the runtime passed to this kernel.
    if unsafe { simpler_device_a2a3::kernel::block_idx(args) } == B {
        // SAFETY: the task has the product kernel's signature (`wide_mul`).
        unsafe { vector::mul(args) }
    }
}

/// Device buffers of `values` each, and chip arguments naming them as `tags`, the last one
/// `skew` bytes into its buffer.
struct Buffers {
    allocs: Vec<DevicePtr>,
    ptrs: Vec<(DevicePtr, usize)>,
    args: TaskArgs,
}

impl Buffers {
    fn new(r: &mut DeviceRunner, values: &[(&[u32], TensorArgType)], skew: u64) -> Buffers {
        let (mut allocs, mut ptrs) = (Vec::new(), Vec::new());
        let mut args = TaskArgs::new();
        for (i, (v, tag)) in values.iter().enumerate() {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            // Room for a skewed view to end in.
            let p = r.malloc(bytes.len() as u64 + 4).unwrap();
            let skew = if i + 1 == values.len() { skew } else { 0 };
            let at = p.offset(skew);
            r.copy_to_device(p, &vec![0; bytes.len() + 4]).unwrap();
            r.copy_to_device(at, &bytes).unwrap();
            let t = Tensor::external(at.addr(), &[v.len() as u32], DataType::Float32).unwrap();
            args.add_tensor(t.child_memory(true), *tag).unwrap();
            allocs.push(p);
            ptrs.push((at, bytes.len()));
        }
        Buffers { allocs, ptrs, args }
    }

    fn free(self, r: &mut DeviceRunner) {
        for p in self.allocs {
            r.free(p).unwrap();
        }
    }

    /// The bits of the last buffer.
    fn last(&self, r: &mut DeviceRunner) -> Vec<u32> {
        let (p, len) = *self.ptrs.last().unwrap();
        let mut raw = vec![0u8; len];
        r.copy_from_device(&mut raw, p).unwrap();
        raw.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
}

fn run(
    r: &mut DeviceRunner,
    slot: simpler_device_a2a3::ChipSlot,
    args: &TaskArgs,
    blocks: u32,
    id: u64,
) {
    let cfg = CallConfig::builder().block_dim(blocks).build().unwrap();
    let id = RunId::from_raw(id).unwrap();
    r.run(&RunRequest::new(id, slot, args, &cfg)).unwrap();
}

fn inputs(n: usize) -> (Vec<f32>, Vec<f32>) {
    let a = (0..n).map(|i| (i % 97) as f32 * 0.25).collect();
    let b = (0..n).map(|i| 1.5 - (i % 13) as f32).collect();
    (a, b)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn the_vector_graph_in_tasks_of_1_to_4_blocks_matches_its_reference_exactly() {
    use TensorArgType::{Input, Output};
    let n = 1001;
    let (a, b) = inputs(n);
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let callable = vector::builder_with(Orchestration::Native {
        entry: wide_vector,
        config: vector::orch_config,
    })
    .names("wide_vector", "wide_vector_config")
    .build()
    .unwrap();
    let slot = r.register_callable(&callable).unwrap();
    for blocks in 1..=4 {
        let poison = vec![POISON; n];
        let buffers =
            Buffers::new(&mut r, &[(&bits(&a), Input), (&bits(&b), Input), (&poison, Output)], 0);
        run(&mut r, slot, &buffers.args, blocks, u64::from(blocks));
        let got = buffers.last(&mut r);
        buffers.free(&mut r);
        let want = bits(&vector::reference(&a, &b));
        assert_eq!(got.len(), want.len());
        if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
            let (g, w) = (got[i], want[i]);
            panic!("{blocks} blocks: element {i} of {n} has bits {g:#x}, not {w:#x}");
        }
    }
    r.finalize().unwrap();
}

#[test]
fn each_block_of_a_product_task_writes_only_its_share_of_the_output() {
    use TensorArgType::{Input, Output};
    let n = 1001;
    let (a, b) = inputs(n);
    let want: Vec<u32> = a.iter().zip(&b).map(|(x, y)| (x * y).to_bits()).collect();
    let kernels: [KernelFn; 4] =
        [mul_in_block::<0>, mul_in_block::<1>, mul_in_block::<2>, mul_in_block::<3>];
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let mut id = 0;
    for (block, kernel) in (0u32..).zip(kernels) {
        let orchestration = Orchestration::Native { entry: wide_mul, config: vector::orch_config };
        // SAFETY: each `mul_in_block` kernel runs the program's own product kernel for `MUL`.
        let builder = unsafe { vector::builder_with_orchestration_and_mul(orchestration, kernel) };
        let callable = builder
            .names(format!("mul_in_block_{block}"), format!("mul_in_block_{block}_config"))
            .build()
            .unwrap();
        let slot = r.register_callable(&callable).unwrap();
        for blocks in block + 1..=4 {
            let poison = vec![POISON; n];
            let buffers = Buffers::new(
                &mut r,
                &[(&bits(&a), Input), (&bits(&b), Input), (&poison, Output)],
                0,
            );
            id += 1;
            run(&mut r, slot, &buffers.args, blocks, id);
            let got = buffers.last(&mut r);
            buffers.free(&mut r);
            let (lo, hi) =
                (n * block as usize / blocks as usize, n * (block as usize + 1) / blocks as usize);
            for (i, g) in got.iter().enumerate() {
                let (expected, what) = if (lo..hi).contains(&i) {
                    (want[i], "written")
                } else {
                    (POISON, "untouched")
                };
                assert_eq!(
                    *g, expected,
                    "element {i} of {n}, block {block} of {blocks}, should be {what}"
                );
            }
        }
        r.unregister_callable(slot).unwrap();
    }
    r.finalize().unwrap();
}

#[test]
fn an_add_task_whose_output_view_is_not_4_byte_aligned_writes_nothing() {
    use TensorArgType::{Input, Output};
    let n = 64;
    let (a, b) = inputs(n);
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&add::callable().unwrap()).unwrap();
    for (skew, id) in [(0, 1), (2, 2), (1, 3)] {
        let poison = vec![POISON; n];
        let buffers = Buffers::new(
            &mut r,
            &[(&bits(&a), Input), (&bits(&b), Input), (&poison, Output)],
            skew,
        );
        run(&mut r, slot, &buffers.args, 1, id);
        let got = buffers.last(&mut r);
        buffers.free(&mut r);
        if skew == 0 {
            assert_eq!(got, bits(&add::reference(&a, &b)), "the aligned view is written");
        } else {
            assert_eq!(got, poison, "a view {skew} bytes off 4-byte alignment");
        }
    }
    r.finalize().unwrap();
}
