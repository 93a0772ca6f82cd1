//! Tests of the host graph builder: validation, dependency edges, scopes, data access.

use simpler_types::DataType;

use super::*;
use crate::error::ArityMismatch;

const BUF: u64 = 0x10_0000;

#[derive(Default)]
struct FakeEnv;

impl BuildEnv for FakeEnv {
    fn device_range_ok(&self, addr: u64, len: u64) -> bool {
        addr >= BUF && addr + len <= BUF + 0x10_0000
    }
    fn read(&mut self, addr: u64, out: &mut [u8]) -> bool {
        out.fill(7);
        self.device_range_ok(addr, out.len() as u64)
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> bool {
        self.device_range_ok(addr, data.len() as u64)
    }
    fn heap_arena(&mut self, _bytes: u64) -> Result<HeapArena, DeviceError> {
        Ok(HeapArena { addr: BUF + 0x8_0000, kept: false })
    }
}

/// Func id 1 registered; the tests of the graph pass it whatever arguments they need, so its
/// arity is checked only where a test says so.
const KERNELS: [KernelArity; 1] =
    [KernelArity { func_id: 1, tensors: 0, scalars: 0, reads: 0, writes: 0 }];

fn limits() -> BuildLimits<'static> {
    BuildLimits {
        task_window: 64,
        heap_bytes: 1 << 16,
        block_dim: 2,
        kernels: &KERNELS,
        check_arity: false,
    }
}

/// What a builder borrows: the device and the scratch kept across builds.
#[derive(Default)]
struct Fixture {
    env: FakeEnv,
    scratch: BuildScratch,
}

fn buf(offset: u64, n: u32) -> Tensor {
    Tensor::external(BUF + offset, &[n], DataType::Float32).unwrap()
}

const AIV: [i32; 3] = [NO_FUNC, 1, NO_FUNC];

fn problem(e: DeviceError) -> ArgsProblem {
    match e {
        DeviceError::InvalidArgs { problem, .. } => problem,
        other => panic!("expected InvalidArgs, got {other}"),
    }
}

fn builder(f: &mut Fixture) -> GraphBuilder<'_> {
    build_run(f, RunId::FIRST)
}

/// The chip entry is one 64-byte buffer at `BUF`; the tests' other buffers lie past it (a
/// tensor based inside it would be refused).
fn build_run(f: &mut Fixture, run: RunId) -> GraphBuilder<'_> {
    GraphBuilder::new(run, limits(), &mut f.env, &[buf(0, 16)], &mut f.scratch)
}

#[test]
fn a_buffer_too_large_to_round_up_to_the_heap_alignment_is_invalid() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    // 2 147 483 647 × 2 147 483 649 f32: 2^64 − 4 bytes, a valid shape.
    let mut t = [Tensor::external(0, &[2_147_483_647, 2_147_483_649], DataType::Float32).unwrap()];
    assert_eq!(b.alloc(&mut t), ORCH_INVALID);
    let p = problem(b.finish().unwrap_err());
    assert_eq!(p, ArgsProblem::AllocTooLarge { index: 0, bytes: u64::MAX - 3 });
}

#[test]
fn too_many_tensors_or_scalars_are_rejected_naming_the_counts() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let ts = vec![buf(0, 4); 33];
    assert!(b.submit(AIV, TaskShape::Aiv as u32, 1, &ts, &[0; 33], &[]) < 0);
    let p = problem(b.finish().unwrap_err());
    assert_eq!(p, ArgsProblem::TooManyArgs { task: 0, tensors: 33, scalars: 0 });
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    assert!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[], &[], &[0; 17]) < 0);
    let p = problem(b.finish().unwrap_err());
    assert_eq!(p, ArgsProblem::TooManyArgs { task: 0, tensors: 0, scalars: 17 });
}

#[test]
fn a_null_or_misaligned_argument_array_with_a_count_is_refused_not_read_as_empty() {
    let ts = [buf(0, 4)];
    let tags = [0i32; 2];
    let scalars = [0u64; 2];
    let desc =
        |tensors: *const Tensor, tags: *const i32, scalars: *const u64, ns: u32| SubmitDesc {
            func_ids: AIV,
            shape: TaskShape::Aiv as u32,
            block_num: 1,
            num_tensors: 1,
            num_scalars: ns,
            reserved: 0,
            tensors,
            tags,
            scalars,
        };
    // One tag one byte into the array: misaligned for an `i32`.
    let misaligned_tags = tags.as_ptr().cast::<u8>().wrapping_add(1).cast::<i32>();
    for (what, d) in [
        ("null tensors", desc(std::ptr::null(), tags.as_ptr(), scalars.as_ptr(), 0)),
        ("null tags", desc(ts.as_ptr(), std::ptr::null(), scalars.as_ptr(), 0)),
        ("misaligned tags", desc(ts.as_ptr(), misaligned_tags, scalars.as_ptr(), 0)),
        ("null scalars", desc(ts.as_ptr(), tags.as_ptr(), std::ptr::null(), 1)),
    ] {
        let mut f = Fixture::default();
        let mut b = builder(&mut f);
        let rt = (&mut b as *mut GraphBuilder<'_>).cast::<c_void>();
        // SAFETY: `rt` is a live builder; `d` names arrays that are live (or null/misaligned,
        // which is what is refused).
        let status = unsafe { op_submit(rt, &d) };
        assert_eq!(status, i64::from(ORCH_INVALID), "{what}");
        let p = problem(b.finish().unwrap_err());
        let scalars = d.num_scalars as usize;
        assert_eq!(p, ArgsProblem::BadTaskArrays { task: 0, tensors: 1, scalars }, "{what}");
    }
    // Null arrays with zero counts are empty, as C passes them.
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let rt = (&mut b as *mut GraphBuilder<'_>).cast::<c_void>();
    let mut d = desc(std::ptr::null(), std::ptr::null(), std::ptr::null(), 0);
    d.num_tensors = 0;
    // SAFETY: as above.
    assert!(unsafe { op_submit(rt, &d) } >= 0);
}

#[test]
fn func_ids_must_be_in_range_and_registered() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    assert!(b.submit([NO_FUNC, 1024, NO_FUNC], TaskShape::Aiv as u32, 1, &[], &[], &[]) < 0);
    let p = problem(b.finish().unwrap_err());
    assert_eq!(p, ArgsProblem::FuncIdRange { task: 0, func_id: 1024, limit: MAX_FUNC_IDS });
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    assert!(b.submit([NO_FUNC, 7, NO_FUNC], TaskShape::Aiv as u32, 1, &[], &[], &[]) < 0);
    let p = problem(b.finish().unwrap_err());
    assert_eq!(p, ArgsProblem::UnknownFunc { task: 0, func_id: 7 });
}

#[test]
fn a_malformed_descriptor_names_its_task_argument_and_rule() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let mut bad = buf(0, 16);
    bad.strides[0] = 0;
    let inout = TensorArgType::InOut;
    assert!(
        b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(64, 4), bad], &[0, inout.as_i32()], &[]) < 0
    );
    let p = problem(b.finish().unwrap_err());
    let source = simpler_types::TypesError::ZeroStride { dim: 0 };
    assert_eq!(p, ArgsProblem::Descriptor { task: 0, arg: 1, tag: inout, source: source.clone() });
    assert_eq!(std::error::Error::source(&p).map(|e| e.to_string()), Some(source.to_string()));
}

#[test]
fn a_task_whose_kernels_do_not_fit_its_shape_names_both() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let funcs = [1, NO_FUNC, NO_FUNC];
    assert!(b.submit(funcs, TaskShape::Aiv as u32, 1, &[], &[], &[]) < 0);
    let shape = TaskShape::Aiv;
    assert_eq!(
        problem(b.finish().unwrap_err()),
        ArgsProblem::ShapeKernels { task: 0, shape, funcs }
    );
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    assert!(b.submit(AIV, 9, 1, &[], &[], &[]) < 0);
    assert_eq!(problem(b.finish().unwrap_err()), ArgsProblem::UnknownShape { task: 0, shape: 9 });
}

#[test]
fn set_tensor_data_names_the_bytes_it_refuses() {
    // Bytes a task already uses.
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let t = buf(0x1000, 16);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[t], &[0], &[]), 0);
    assert!(b.set_data(&t, &[0u8; 64]) < 0);
    let (addr, len) = (BUF + 0x1000, 64);
    assert_eq!(problem(b.finish().unwrap_err()), ArgsProblem::DataInUse { addr, len });
    // Bytes outside every allocation.
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let stray = Tensor::external(0x40, &[4], DataType::Float32).unwrap();
    assert!(b.set_data(&stray, &[0u8; 16]) < 0);
    let (addr, len) = (0x40, 16);
    assert_eq!(problem(b.finish().unwrap_err()), ArgsProblem::DataOutsideAllocation { addr, len });
    // A buffer of another size than the view.
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    assert!(b.set_data(&buf(0, 16), &[0u8; 8]) < 0);
    let op = OrchOp::SetTensorData;
    assert_eq!(
        problem(b.finish().unwrap_err()),
        ArgsProblem::DataShape { op, contiguous: true, view_bytes: 64, buffer_bytes: 8 }
    );
}

#[test]
fn alloc_tensors_refuses_a_descriptor_with_a_buffer() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let mut ts = [buf(0, 4)];
    assert_eq!(b.alloc(&mut ts), ORCH_INVALID);
    let p = problem(b.finish().unwrap_err());
    assert_eq!(p, ArgsProblem::AllocHasBuffer { index: 0, addr: BUF });
}

#[test]
fn a_task_must_pass_its_kernels_what_their_signatures_declare() {
    use crate::callable::ArgDirection::{In, Out};
    let kernels = [crate::runtime::arity::arity_of(1, &[In, In, Out])];
    let (input, output) = (TensorArgType::Input.as_i32(), TensorArgType::Output.as_i32());
    let ts = [buf(0, 4), buf(64, 4), buf(128, 4)];
    let submit = |tensors: &[Tensor], tags: &[i32], scalars: &[u64]| {
        let mut f = Fixture::default();
        let limits = BuildLimits { kernels: &kernels, check_arity: true, ..limits() };
        let mut b =
            GraphBuilder::new(RunId::FIRST, limits, &mut f.env, &[buf(0, 16)], &mut f.scratch);
        let status = b.submit(AIV, TaskShape::Aiv as u32, 1, tensors, tags, scalars);
        (status, b.finish().err().map(problem))
    };
    assert!(submit(&ts, &[input, input, output], &[]).0 >= 0);
    // Scalars where the kernel looks for descriptors.
    let (status, e) = submit(&[], &[], &[1, 2, 3]);
    assert_eq!(status, i64::from(ORCH_INVALID));
    let source = ArityMismatch::Counts { func_id: 1, declared: (3, 0), passed: (0, 3) };
    assert_eq!(e, Some(ArgsProblem::Arity { task: 0, source }));
    assert_eq!(
        e.unwrap().to_string(),
        "task#0: func id 1 takes 3 tensors and 0 scalars; the task passes 0 and 3"
    );
    // A tensor the kernel writes, tagged as read only.
    let (status, e) = submit(&ts, &[input, input, input], &[]);
    assert_eq!(status, i64::from(ORCH_INVALID));
    let tag = TensorArgType::Input;
    let source = ArityMismatch::Tag { func_id: 1, index: 2, tag, written: true };
    assert_eq!(e, Some(ArgsProblem::Arity { task: 0, source }));
}

#[test]
fn written_tensors_need_device_buffers() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let null = Tensor::external(0, &[4], DataType::Float32).unwrap();
    assert!(
        b.submit(AIV, TaskShape::Aiv as u32, 1, &[null], &[TensorArgType::Output.as_i32()], &[])
            < 0
    );
    let (site, tag) = (ArgSite::Task { task: 0, arg: 0 }, TensorArgType::Output);
    assert_eq!(problem(b.finish().unwrap_err()), ArgsProblem::NullWrittenTensor { site, tag });
    // A null view with no elements has nothing to write: a write tag takes it.
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let empty = Tensor::external(0, &[4, 0], DataType::Float32).unwrap();
    let out = [TensorArgType::Output.as_i32()];
    assert!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[empty], &out, &[]) >= 0);
    assert!(b.finish().is_ok());
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let stray = Tensor::external(0x40, &[4], DataType::Float32).unwrap();
    assert!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[stray], &[0], &[]) < 0);
    let p = problem(b.finish().unwrap_err());
    assert_eq!(p, ArgsProblem::TensorOutsideAllocation { task: 0, arg: 0, addr: 0x40, len: 16 });
}

#[test]
fn disjoint_slice_writers_are_independent_and_a_whole_reader_depends_on_both() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let whole = buf(0, 1024);
    let lo = whole.view(&[512], &[0]).unwrap();
    let hi = whole.view(&[512], &[512]).unwrap();
    let out = TensorArgType::Output.as_i32();
    let inp = TensorArgType::Input.as_i32();
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[lo], &[out], &[]), 0);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[hi], &[out], &[]), 1);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[whole], &[inp], &[]), 2);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[lo], &[inp], &[]), 3);
    let g = b.finish().unwrap();
    assert!(g.preds_of(&g.tasks[1]).is_empty(), "disjoint slices never create an edge");
    assert_eq!(g.preds_of(&g.tasks[2]), vec![0, 1]);
    assert_eq!(g.preds_of(&g.tasks[3]), vec![0]);
    let overlap =
        |pred, succ| g.edges.iter().find(|e| e.pred == pred && e.succ == succ).unwrap().overlap;
    assert_eq!(overlap(0, 2), Overlap::Partial);
    assert_eq!(overlap(0, 3), Overlap::Covered);
}

#[test]
fn a_write_after_a_read_waits_for_the_reader() {
    // The original's issue #1306: W0 InOut, R0 Input, W1 InOut on one buffer.
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let t = buf(0, 256);
    let (inout, inp) = (TensorArgType::InOut.as_i32(), TensorArgType::Input.as_i32());
    let out = TensorArgType::Output.as_i32();
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[t], &[inout], &[]), 0);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[t], &[inp], &[]), 1);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[t], &[inp], &[]), 2);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[t], &[inout], &[]), 3);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[t], &[out], &[]), 4);
    let g = b.finish().unwrap();
    assert!(g.preds_of(&g.tasks[2]) == vec![0], "readers stay concurrent");
    let mut w1 = g.preds_of(&g.tasks[3]).to_vec();
    w1.sort_unstable();
    assert_eq!(w1, vec![0, 1, 2], "the second write waits for both readers");
    assert_eq!(g.preds_of(&g.tasks[4]), vec![3], "a blind write after an InOut waits for it");
}

#[test]
fn a_tensor_based_inside_a_heap_buffer_is_refused_at_submit_and_in_data_calls() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let mut heap = [Tensor::external(0, &[64], DataType::Float32).unwrap()];
    assert_eq!(b.alloc(&mut heap), ORCH_OK);
    let [h] = heap;
    let out = TensorArgType::Output.as_i32();
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[h], &[out], &[]), 0);
    // The second half of the buffer, named by its own base address: as a buffer of its own it
    // would never wait for the task writing the whole.
    let tail = Tensor::external(h.addr + 128, &[32], DataType::Float32).unwrap();
    let inp = TensorArgType::Input.as_i32();
    assert!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[tail], &[inp], &[]) < 0);
    let want =
        ArgsProblem::HeapBaseAlias { task: Some(1), arg: 0, addr: h.addr + 128, heap_addr: h.addr };
    assert_eq!(problem(b.finish().unwrap_err()), want);

    let mut b = builder(&mut f);
    let mut heap = [Tensor::external(0, &[64], DataType::Float32).unwrap()];
    assert_eq!(b.alloc(&mut heap), ORCH_OK);
    let tail = Tensor::external(heap[0].addr + 128, &[32], DataType::Float32).unwrap();
    assert!(b.get_data(&tail, &mut [0u8; 128]) < 0);
    let want =
        ArgsProblem::HeapBaseAlias { task: None, arg: 0, addr: tail.addr, heap_addr: heap[0].addr };
    assert_eq!(problem(b.finish().unwrap_err()), want);

    // A view of the buffer keeps its base and is ordered after the write.
    let mut b = builder(&mut f);
    let mut heap = [Tensor::external(0, &[64], DataType::Float32).unwrap()];
    assert_eq!(b.alloc(&mut heap), ORCH_OK);
    let [h] = heap;
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[h], &[out], &[]), 0);
    let view = h.view(&[32], &[32]).unwrap();
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[view], &[inp], &[]), 1);
    let g = b.finish().unwrap();
    assert_eq!(g.preds_of(&g.tasks[1]), vec![0]);
}

#[test]
fn a_tensor_based_inside_the_entry_buffer_is_refused_at_submit_and_in_data_calls() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let inner = Tensor::external(BUF + 16, &[4], DataType::Float32).unwrap();
    let inp = TensorArgType::Input.as_i32();
    assert!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(0, 16), inner], &[inp, inp], &[]) < 0);
    let want =
        ArgsProblem::EntryBaseAlias { task: Some(0), arg: 1, addr: BUF + 16, entry_addr: BUF };
    assert_eq!(problem(b.finish().unwrap_err()), want);
    let mut b = builder(&mut f);
    assert!(b.get_data(&inner, &mut [0u8; 16]) < 0);
    let want = ArgsProblem::EntryBaseAlias { task: None, arg: 0, addr: BUF + 16, entry_addr: BUF };
    assert_eq!(problem(b.finish().unwrap_err()), want);
    // A zero-byte tensor there names no memory, and a null entry argument (an optional input
    // left out) names none either: neither is refused.
    let empty = Tensor::external(BUF + 16, &[0], DataType::Float32).unwrap();
    let null = Tensor::external(0, &[1 << 20], DataType::Float32).unwrap();
    let mut b =
        GraphBuilder::new(RunId::FIRST, limits(), &mut f.env, &[buf(0, 16), null], &mut f.scratch);
    assert!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(0, 16), empty], &[inp, inp], &[]) >= 0);
    assert!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(64, 4)], &[inp], &[]) >= 0);
    b.finish().unwrap();
}

#[test]
fn tensor_data_reads_staged_inputs_but_not_in_graph_outputs() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let input = buf(0, 16);
    let mut out = [0u8; 64];
    assert_eq!(b.get_data(&input, &mut out), ORCH_OK);
    assert_eq!(out[0], 7);
    let produced = buf(0x1000, 16);
    b.submit(AIV, TaskShape::Aiv as u32, 1, &[produced], &[TensorArgType::Output.as_i32()], &[]);
    assert!(b.get_data(&produced, &mut out) < 0);
    let (addr, len) = (BUF + 0x1000, 64);
    assert_eq!(problem(b.finish().unwrap_err()), ArgsProblem::DataNotWritten { addr, len });
}

#[test]
fn a_zero_size_manual_dep_tensor_still_orders_after_its_creator() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let out = TensorArgType::Output.as_i32();
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(0, 16)], &[out], &[]), 0);
    let empty = Tensor::external(BUF + 0x100, &[0], DataType::Float32)
        .unwrap()
        .manual_dep(true)
        .with_owner(DeviceTaskId::new(0, 0));
    let inp = TensorArgType::Input.as_i32();
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[empty], &[inp], &[]), 1);
    let g = b.finish().unwrap();
    assert_eq!(g.preds_of(&g.tasks[1]), vec![0]);
    assert_eq!(g.edges[0].source, EdgeSource::Creator);
}

#[test]
fn tensor_data_refuses_bytes_a_manual_dep_tensor_writes() {
    // The map does not track `manual_dep` tensors, but no task of the graph has run while
    // it is built: the staged bytes would be the value from before that write.
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let input = buf(0, 16);
    let out = TensorArgType::Output.as_i32();
    let manual = input.manual_dep(true);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[manual], &[out], &[]), 0);
    let mut data = [0u8; 64];
    assert!(b.get_data(&input, &mut data) < 0);
    let (addr, len) = (BUF, 64);
    assert_eq!(problem(b.finish().unwrap_err()), ArgsProblem::DataNotWritten { addr, len });
}

#[test]
fn tensor_data_refuses_bytes_a_kernel_may_write_through_an_untracked_tensor() {
    // A kernel may write through a tensor tagged `NoDep`, and a `manual_dep` tensor tagged
    // `NoDep` is no read either: the staged bytes may be the value from before that write.
    // Only an `Input` among the untracked ones is known not to write.
    let nodep = TensorArgType::NoDep.as_i32();
    let inp = TensorArgType::Input.as_i32();
    for (tensor, tag, refused) in [
        (buf(0, 16), nodep, true),
        (buf(0, 16).manual_dep(true), nodep, true),
        (buf(0, 16).manual_dep(true), inp, false),
    ] {
        let mut f = Fixture::default();
        let mut b = builder(&mut f);
        assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[tensor], &[tag], &[]), 0);
        let mut data = [0u8; 64];
        let status = b.get_data(&buf(0, 16), &mut data);
        assert_eq!(status < 0, refused, "tag {tag}, manual_dep {}", tensor.is_manual_dep());
        if refused {
            let (addr, len) = (BUF, 64);
            assert_eq!(problem(b.finish().unwrap_err()), ArgsProblem::DataNotWritten { addr, len });
        }
    }
}

#[test]
fn the_first_error_wins_and_later_calls_are_refused() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    assert!(b.scope_end() < 0);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[], &[], &[]), i64::from(ORCH_FAILED));
    assert_eq!(problem(b.finish().unwrap_err()), ArgsProblem::ScopeUnbalanced);
}

#[test]
fn a_reused_scratch_carries_nothing_from_one_build_into_the_next() {
    let mut f = Fixture::default();
    let (out, inp) = (TensorArgType::Output.as_i32(), TensorArgType::Input.as_i32());
    let manual = buf(0x2000, 16).manual_dep(true);
    let second = RunId::FIRST.next().unwrap();
    // The same run id twice as well: a runner reuses none, but the scratch must not care.
    for run in [RunId::FIRST, RunId::FIRST, second] {
        let mut b = build_run(&mut f, run);
        assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(0x1000, 16)], &[inp], &[]), 0);
        assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(0x1000, 16)], &[out], &[]), 1);
        assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[manual], &[out], &[]), 2);
        let g = b.finish().unwrap();
        assert_eq!(g.tasks.len(), 3, "{run}: only this build's tasks");
        assert!(g.preds_of(&g.tasks[0]).is_empty(), "{run}: no edge to an earlier build's writer");
        assert_eq!(g.preds_of(&g.tasks[1]), [0], "{run}");
        assert_eq!((g.edges.len(), g.edge_count()), (1, 1), "{run}");
        assert!(f.scratch.is_empty(), "{run}: the builder emptied the scratch");
        f.scratch.recycle(g);
    }
    // Nothing of the builds above is still known: their buffers are free for set_tensor_data
    // and tensor_data.
    let mut b = build_run(&mut f, second);
    assert_eq!(b.set_data(&buf(0x1000, 16), &[0u8; 64]), ORCH_OK);
    let mut data = [0u8; 64];
    assert_eq!(b.get_data(&buf(0, 16), &mut data), ORCH_OK);
    b.finish().unwrap();
}

#[test]
fn a_builder_dropped_unfinished_leaves_the_scratch_empty() {
    // What a panicking orchestration leaves behind: the builder is dropped without `finish`.
    let mut f = Fixture::default();
    let out = TensorArgType::Output.as_i32();
    let mut b = builder(&mut f);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(0x1000, 16)], &[out], &[]), 0);
    drop(b);
    assert!(f.scratch.is_empty());
    let mut b = builder(&mut f);
    let inp = TensorArgType::Input.as_i32();
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(0x1000, 16)], &[inp], &[]), 0);
    let g = b.finish().unwrap();
    assert_eq!(g.tasks.len(), 1, "the unfinished graph's task is gone");
    assert!(g.preds_of(&g.tasks[0]).is_empty());
}

#[test]
fn an_image_written_with_reused_scratch_matches_one_written_fresh() {
    use crate::runtime::hbg::image::{ImageInputs, ImageScratch, write_image};
    let (out, inp) = (TensorArgType::Output.as_i32(), TensorArgType::Input.as_i32());
    let func_table = vec![0x4000u64; MAX_FUNC_IDS];
    let inputs = ImageInputs {
        block_dim: 1,
        aicpu_threads: 1,
        profiling: 0,
        swimlane_capacity: 0,
        swimlane_level: 0,
        aicpu_swimlane_capacity: 0,
        active_callable: 1,
        func_table: &func_table,
    };
    // A fan-out of `n` readers of one writer, then a fan-in.
    let graph = |f: &mut Fixture, n: u64| {
        let mut b = builder(f);
        b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(0, 16)], &[out], &[]);
        for i in 0..n {
            b.submit(
                AIV,
                TaskShape::Aiv as u32,
                1,
                &[buf(0, 16), buf(0x100 * (i + 1), 16)],
                &[inp, out],
                &[],
            );
        }
        let all: Vec<Tensor> = (0..n).map(|i| buf(0x100 * (i + 1), 16)).collect();
        b.submit(AIV, TaskShape::Aiv as u32, 1, &all, &vec![inp; all.len()], &[]);
        b.finish().unwrap()
    };
    let mut f = Fixture::default();
    let (mut reused, mut image) = (ImageScratch::default(), Vec::new());
    let large = graph(&mut f, 8);
    write_image(&mut image, &large, &inputs, &mut reused).unwrap();
    f.scratch.recycle(large);
    let small = graph(&mut f, 3);
    write_image(&mut image, &small, &inputs, &mut reused).unwrap();
    let mut fresh = Vec::new();
    write_image(&mut fresh, &small, &inputs, &mut ImageScratch::default()).unwrap();
    assert_eq!(image, fresh, "the larger graph left nothing in the smaller one's image");
}

#[test]
fn views_of_one_user_allocation_under_two_bases_are_refused_at_submit_and_in_data_calls() {
    // A user allocation named under two overlapping bases would be keyed twice: a reader of
    // one would not wait for a writer of the other.
    let (out, inp) = (TensorArgType::Output.as_i32(), TensorArgType::Input.as_i32());
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(0x1100, 128)], &[out], &[]), 0);
    assert!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(0x1200, 64)], &[inp], &[]) < 0);
    let (addr, other_addr) = (BUF + 0x1200, BUF + 0x1100);
    let want = ArgsProblem::BufferBaseAlias { task: Some(1), arg: 0, addr, other_addr };
    assert_eq!(problem(b.finish().unwrap_err()), want);
    // A base below an earlier one whose bytes reach it, and a data call.
    let mut b = builder(&mut f);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(0x1200, 64)], &[out], &[]), 0);
    assert!(b.get_data(&buf(0x1100, 128), &mut [0u8; 512]) < 0);
    let (addr, other_addr) = (BUF + 0x1100, BUF + 0x1200);
    let want = ArgsProblem::BufferBaseAlias { task: None, arg: 0, addr, other_addr };
    assert_eq!(problem(b.finish().unwrap_err()), want);
    // Views of one base, and buffers side by side, are fine.
    let mut b = builder(&mut f);
    let whole = buf(0x1100, 128);
    let part = whole.view(&[32], &[64]).unwrap();
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[whole], &[out], &[]), 0);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[part], &[inp], &[]), 1);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[buf(0x1300, 4)], &[inp], &[]), 2);
    b.finish().unwrap();
}

#[test]
fn data_calls_refuse_a_bad_descriptor_and_fail_after_a_latched_error() {
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let mut bad = buf(0x1000, 16);
    bad.ndims = 9;
    assert!(b.set_data(&bad, &[0u8; 64]) < 0);
    let got = problem(b.finish().unwrap_err());
    assert!(
        matches!(got, ArgsProblem::DataDescriptor { op: OrchOp::SetTensorData, .. }),
        "{got:?}"
    );
    let mut b = builder(&mut f);
    assert!(b.scope_end() < 0);
    assert_eq!(b.set_data(&buf(0x1000, 16), &[0u8; 64]), ORCH_FAILED);
    assert_eq!(b.get_data(&buf(0, 16), &mut [0u8; 64]), ORCH_FAILED);
    assert_eq!(problem(b.finish().unwrap_err()), ArgsProblem::ScopeUnbalanced);
}

#[test]
fn a_heap_buffer_named_after_its_scope_ended_is_refused_at_submit_and_in_data_calls() {
    let out = TensorArgType::Output.as_i32();
    let mut f = Fixture::default();
    let mut b = builder(&mut f);
    let mut outer = [Tensor::external(0, &[16], DataType::Float32).unwrap()];
    assert_eq!(b.alloc(&mut outer), ORCH_OK);
    assert_eq!(b.scope_begin(), ORCH_OK);
    let mut inner = [Tensor::external(0, &[16], DataType::Float32).unwrap()];
    assert_eq!(b.alloc(&mut inner), ORCH_OK);
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &inner, &[out], &[]), 0);
    assert_eq!(b.scope_end(), ORCH_OK);
    // The buffer of the enclosing scope is still live.
    assert_eq!(b.submit(AIV, TaskShape::Aiv as u32, 1, &outer, &[out], &[]), 1);
    let view = inner[0].view(&[8], &[8]).unwrap();
    assert!(b.submit(AIV, TaskShape::Aiv as u32, 1, &[view], &[out], &[]) < 0);
    let (addr, heap_addr) = (inner[0].addr, inner[0].addr);
    let want = ArgsProblem::HeapBufferAfterScope { task: Some(2), arg: 0, addr, heap_addr };
    assert_eq!(problem(b.finish().unwrap_err()), want);

    let mut b = builder(&mut f);
    assert_eq!(b.scope_begin(), ORCH_OK);
    let mut inner = [Tensor::external(0, &[16], DataType::Float32).unwrap()];
    assert_eq!(b.alloc(&mut inner), ORCH_OK);
    assert_eq!(b.scope_end(), ORCH_OK);
    assert!(b.set_data(&inner[0], &[0u8; 64]) < 0);
    let (addr, heap_addr) = (inner[0].addr, inner[0].addr);
    let want = ArgsProblem::HeapBufferAfterScope { task: None, arg: 0, addr, heap_addr };
    assert_eq!(problem(b.finish().unwrap_err()), want);
}
