//! Tests that call the reference kernels directly, one call at a time, over host buffers: the
//! split among blocks and copies ([`share`], [`copy_share`]), what each call of a task writes,
//! and the views a kernel refuses.

use simpler_types::{Tensor, to_scalar};

use super::*;
use crate::abi::payload::{GLOBAL_CONTEXT_SLOT, GlobalContext, LOCAL_CONTEXT_SLOT, LocalContext};
use crate::callable::KernelCode;

/// The bits an element nobody wrote keeps: a NaN, so that it equals no computed value.
const POISON: u32 = u32::MAX;

#[test]
fn the_shares_of_a_task_cover_every_element_once_in_block_and_copy_order() {
    for n in [0usize, 1, 2, 3, 7, 10, 64, 1000] {
        for blocks in 1..=9u32 {
            let mut next = 0;
            for b in 0..blocks {
                let r = share(n, b, blocks);
                assert_eq!(r.start, next, "n {n}, block {b} of {blocks}");
                assert!(r.end >= r.start && r.end - r.start <= n.div_ceil(blocks as usize));
                next = r.end;
            }
            assert_eq!(next, n, "n {n}, {blocks} blocks");
            assert!(share(n, blocks, blocks).is_empty(), "a block past the last gets nothing");
        }
        assert_eq!(share(n, 0, 0), 0..n, "a task of 0 blocks counts as one");
        for (blocks, copies) in (1..=5u32).flat_map(|b| (1..=3u32).map(move |c| (b, c))) {
            let mut next = 0;
            for (b, c) in (0..blocks).flat_map(|b| (0..copies).map(move |c| (b, c))) {
                let r = copy_share(n, (b, blocks), (c, copies));
                assert_eq!(r.start, next, "n {n}, block {b} of {blocks}, copy {c} of {copies}");
                assert!(r.end >= r.start);
                next = r.end;
            }
            assert_eq!(next, n, "n {n}, {blocks} blocks of {copies} copies");
            assert!(copy_share(n, (0, blocks), (copies, copies)).is_empty(), "past the last copy");
        }
        assert_eq!(copy_share(n, (0, 1), (0, 0)), 0..n, "a block of 0 copies counts as one");
    }
    // No overflow at the ends of the ranges.
    let top = share(usize::MAX, u32::MAX - 1, u32::MAX);
    assert_eq!(top.end, usize::MAX);
    assert!(top.start < top.end);
    assert!(share(usize::MAX, u32::MAX, u32::MAX).is_empty());
}

/// Kernel `func` of `callable`.
fn kernel_of(callable: Result<ChipCallable, DeviceError>, func: u32) -> KernelFn {
    let callable = callable.expect("a reference program builds");
    let code = callable.children().iter().find(|(f, _)| *f == func).map(|(_, k)| k.code());
    match code {
        Some(KernelCode::Native(f)) => *f,
        other => panic!("func {func} of {} is {other:?}", callable.entry_name()),
    }
}

/// One kernel over host buffers of f32 bits: the buffers' initial contents, its scalars, and
/// which buffer it writes.
struct Case {
    name: &'static str,
    kernel: KernelFn,
    buffers: Vec<Vec<u32>>,
    scalars: Vec<u64>,
    out: usize,
    /// Whether the first copy of block 0 writes the whole output and every other call nothing.
    whole_in_block_0: bool,
}

impl Case {
    /// The output after running the kernel as block `block.0` of `block.1`, copy `copy.0` of
    /// `copy.1`, over fresh copies of the buffers, each tensor one-dimensional over its whole
    /// buffer, but for buffer `odd.0`, whose tensor is placed as `odd.1` says.
    fn run_odd(&self, block: (u32, u32), copy: (u16, u16), odd: (usize, Odd)) -> Vec<u32> {
        // One more word each, for a skewed view to end in.
        let mut buffers: Vec<Vec<u32>> =
            self.buffers.iter().map(|b| [b.as_slice(), &[0]].concat()).collect();
        let tensors: Vec<Tensor> = buffers
            .iter_mut()
            .enumerate()
            .map(|(j, b)| {
                let len = (b.len() - 1) as u32;
                let addr = match odd {
                    (k, Odd::Skewed(skew)) if k == j => b.as_mut_ptr() as u64 + skew,
                    (k, Odd::Null) if k == j => 0,
                    _ => b.as_mut_ptr() as u64,
                };
                Tensor::external(addr, &[len], DataType::Float32).expect("a tensor")
            })
            .collect();
        let local = LocalContext { block_idx: block.0, block_num: block.1, async_ctx: 0 };
        let global = GlobalContext { copy_idx: copy.0, copy_num: copy.1, ..Default::default() };
        let mut args = [0i64; 50];
        for (slot, t) in args.iter_mut().zip(&tensors) {
            *slot = t as *const Tensor as i64;
        }
        for (slot, s) in args[tensors.len()..].iter_mut().zip(&self.scalars) {
            *slot = *s as i64;
        }
        args[LOCAL_CONTEXT_SLOT] = &local as *const LocalContext as i64;
        args[GLOBAL_CONTEXT_SLOT] = &global as *const GlobalContext as i64;
        // SAFETY: the argument vector the runtime would build for this task: one descriptor
        // per tensor of the kernel's signature, then its scalars and the two contexts, all
        // alive for the call; the descriptors name the buffers, which nothing else touches
        // during the call.
        unsafe { (self.kernel)(args.as_mut_ptr()) };
        let mut out = buffers.swap_remove(self.out);
        out.pop();
        out
    }

    fn run(&self, block: (u32, u32), copy: (u16, u16)) -> Vec<u32> {
        self.run_odd(block, copy, (0, Odd::Skewed(0)))
    }
}

/// How [`Case::run_odd`] places one tensor.
#[derive(Clone, Copy)]
enum Odd {
    /// `n` bytes into its buffer.
    Skewed(u64),
    /// At address 0, the null tensor an optional input is given as.
    Null,
}

fn f32s(values: impl IntoIterator<Item = f32>) -> Vec<u32> {
    values.into_iter().map(f32::to_bits).collect()
}

fn ramp(n: usize, scale: f32) -> Vec<u32> {
    f32s((0..n).map(|i| ((i % 17) as f32 - 8.0) * scale + 0.5))
}

fn poison(n: usize) -> Vec<u32> {
    vec![POISON; n]
}

/// Every reference kernel, over inputs for which it changes every element of its output.
fn cases() -> Vec<Case> {
    let n = 10;
    let tile = bgemm::TILE * bgemm::TILE;
    let (dim, tokens) = (4, 6);
    let case = |name, kernel, buffers, scalars, out| Case {
        name,
        kernel,
        buffers,
        scalars,
        out,
        whole_in_block_0: false,
    };
    let vector = || vector::callable();
    let pa = || paged_attention::callable();
    let st = || streaming::callable();
    let mut update_state = vec![f32::NEG_INFINITY.to_bits(), 0];
    update_state.extend(poison(dim).iter().map(|_| 0f32.to_bits()));
    vec![
        case(
            "add",
            kernel_of(add::callable(), add::ADD),
            vec![ramp(n, 1.0), ramp(n, 0.5), poison(n)],
            vec![],
            2,
        ),
        case(
            "add_scalar",
            kernel_of(vector(), vector::ADD_SCALAR),
            vec![ramp(n, 1.0), poison(n)],
            vec![to_scalar(1.5f32)],
            1,
        ),
        case(
            "mul",
            kernel_of(vector(), vector::MUL),
            vec![ramp(n, 1.0), ramp(n, 0.5), poison(n)],
            vec![],
            2,
        ),
        case(
            "gemm",
            kernel_of(bgemm::callable(), bgemm::GEMM),
            vec![ramp(tile, 0.25), ramp(tile, 0.125), poison(tile)],
            vec![],
            2,
        ),
        case(
            "accumulate",
            kernel_of(bgemm::callable(), bgemm::ACC),
            vec![ramp(n, 1.0), f32s((0..n).map(|i| i as f32 + 1.0))],
            vec![],
            0,
        ),
        case("set", kernel_of(st(), streaming::SET), vec![poison(n)], vec![to_scalar(3.0f32)], 0),
        case(
            "streaming add_scalar",
            kernel_of(st(), streaming::ADD_SCALAR),
            vec![ramp(n, 1.0)],
            vec![to_scalar(1.0f32)],
            0,
        ),
        case(
            "streaming accumulate",
            kernel_of(st(), streaming::ACCUMULATE),
            vec![ramp(n, 1.0), f32s((0..n).map(|i| i as f32 + 1.0))],
            vec![],
            0,
        ),
        case("init", kernel_of(pa(), paged_attention::INIT), vec![poison(dim + 2)], vec![], 0),
        case(
            "scores",
            kernel_of(pa(), paged_attention::SCORES),
            vec![ramp(dim, 0.5), ramp(tokens * dim, 0.25), poison(tokens)],
            vec![to_scalar(0.5f32)],
            2,
        ),
        Case {
            whole_in_block_0: true,
            ..case(
                "update",
                kernel_of(pa(), paged_attention::UPDATE),
                vec![update_state, ramp(tokens, 0.1), ramp(tokens * dim, 0.25)],
                vec![to_scalar(tokens as u32)],
                0,
            )
        },
        case(
            "finish",
            kernel_of(pa(), paged_attention::FINISH),
            vec![f32s([0.5, 2.0, 1.0, -3.0, 5.0, 7.0]), poison(dim)],
            vec![],
            1,
        ),
    ]
}

#[test]
fn each_call_of_a_task_writes_exactly_its_share_of_every_reference_kernels_output() {
    for case in cases() {
        let name = case.name;
        let before = &case.buffers[case.out];
        let whole = case.run((0, 1), (0, 1));
        assert!(
            whole.iter().zip(before).all(|(w, b)| w != b),
            "{name}: a one-block run changes every element, so that a write shows"
        );
        assert_eq!(case.run((0, 0), (0, 1)), whole, "{name}: a task of 0 blocks runs as one block");
        assert_eq!(case.run((0, 1), (0, 0)), whole, "{name}: a block of 0 copies runs as one copy");
        // Every call of tasks of 1 to 4 blocks whose blocks run the kernel on 1 to 3 members of
        // a MIX cluster, then per shape a block past the last and a copy past the last, which
        // write nothing.
        let shapes = (1..=4u32).flat_map(|blocks| (1..=3u16).map(move |copies| (blocks, copies)));
        let real = shapes.clone().flat_map(|(blocks, copies)| {
            (0..blocks).flat_map(move |b| (0..copies).map(move |c| ((b, blocks), (c, copies))))
        });
        let past = shapes.flat_map(|(blocks, copies)| {
            [((blocks, blocks), (0, copies)), ((0, blocks), (copies, copies))]
        });
        for (block, copy) in real.chain(past) {
            let got = case.run(block, copy);
            let mine = match (case.whole_in_block_0, block.0, copy.0) {
                (true, 0, 0) => 0..whole.len(),
                (true, _, _) => 0..0,
                (false, _, _) => {
                    copy_share(whole.len(), block, (u32::from(copy.0), u32::from(copy.1)))
                }
            };
            for (i, (g, (w, b))) in got.iter().zip(whole.iter().zip(before)).enumerate() {
                let (want, what) =
                    if mine.contains(&i) { (w, "written") } else { (b, "untouched") };
                assert_eq!(
                    g,
                    want,
                    "{name}: element {i} of {}, block {} of {}, copy {} of {}, should be {what}",
                    whole.len(),
                    block.0,
                    block.1,
                    copy.0,
                    copy.1
                );
            }
        }
    }
}

#[test]
fn a_kernel_with_a_view_that_is_not_4_byte_aligned_writes_nothing() {
    for case in cases() {
        for j in 0..case.buffers.len() {
            for skew in [1, 2, 3] {
                let got = case.run_odd((0, 1), (0, 1), (j, Odd::Skewed(skew)));
                assert!(
                    got == case.buffers[case.out],
                    "{}: tensor {j} skewed by {skew} bytes, yet the output was written",
                    case.name
                );
            }
        }
    }
}

#[test]
fn a_kernel_given_a_null_tensor_writes_nothing_and_reads_nothing() {
    for case in cases() {
        for j in 0..case.buffers.len() {
            let got = case.run_odd((0, 1), (0, 1), (j, Odd::Null));
            assert!(
                got == case.buffers[case.out],
                "{}: tensor {j} null, yet the output was written",
                case.name
            );
        }
    }
}
