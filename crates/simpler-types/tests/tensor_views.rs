//! Tensor views against a reference model: every view operation is applied both to a `Tensor`
//! and to an explicit list of the buffer elements the view reaches, and the two must agree on
//! success or the exact error, on the elements reached, on contiguity and on the byte footprint.
//! A second property feeds corrupted descriptors to every accessor and operation.

mod common;

use proptest::prelude::*;
use simpler_types::{DataType, Tensor, TypesError};

/// The reference model: the view's shape and, in row-major order of the view, the buffer element
/// index of each element.
#[derive(Clone, Debug)]
struct Model {
    shape: Vec<u32>,
    idx: Vec<u64>,
}

impl Model {
    fn numel(&self) -> usize {
        self.shape.iter().map(|&n| n as usize).product()
    }

    /// Row-major position of a multi-index.
    fn flat(&self, at: &[u32]) -> usize {
        at.iter().zip(&self.shape).fold(0, |acc, (&i, &n)| acc * n as usize + i as usize)
    }

    /// Builds a view of the given shape whose element at multi-index `j` is this model's element
    /// at `source(j)`.
    fn gather(&self, shape: Vec<u32>, source: impl Fn(&[u32]) -> Vec<u32>) -> Model {
        let mut idx = Vec::new();
        for_each_index(&shape, |j| idx.push(self.idx[self.flat(&source(j))]));
        Model { shape, idx }
    }

    /// Contiguous means the elements are consecutive in the buffer, in order.
    fn contiguous(&self) -> bool {
        self.idx.windows(2).all(|w| w[1] == w[0] + 1)
    }
}

/// Calls `f` with every multi-index of `shape` in row-major order.
fn for_each_index(shape: &[u32], mut f: impl FnMut(&[u32])) {
    if shape.contains(&0) {
        return;
    }
    let mut at = vec![0u32; shape.len()];
    loop {
        f(&at);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            at[d] += 1;
            if at[d] < shape[d] {
                break;
            }
            at[d] = 0;
        }
    }
}

/// The buffer element indices a descriptor reaches, in row-major order of its view.
fn reached(t: &Tensor) -> Vec<u64> {
    let mut out = Vec::new();
    for_each_index(t.shape(), |at| {
        let off: u64 = at.iter().zip(t.stride()).map(|(&i, &s)| u64::from(i) * u64::from(s)).sum();
        out.push(t.start_offset + off);
    });
    out
}

/// A generated operation: seeds that `concretize` turns into arguments for the current view,
/// valid most of the time and deliberately wrong with `raw`.
#[derive(Clone, Debug)]
enum Op {
    View {
        seeds: Vec<(u32, u32)>,
        raw: u8,
    },
    Slice {
        dim: usize,
        a: u32,
        b: u32,
        step: u32,
        raw: bool,
    },
    Transpose {
        a: usize,
        b: usize,
        raw: bool,
    },
    /// A shuffle of 0..5, restricted to the current rank: always a permutation.
    PermuteValid(Vec<usize>),
    /// Arbitrary dimension lists: usually not a permutation.
    PermuteRaw(Vec<usize>),
    /// A shape derived from the current element count (`kind` picks how), or an arbitrary one.
    Reshape {
        kind: u8,
        a: u32,
        raw: Vec<u32>,
    },
}

/// An operation with concrete arguments, applied to both the model and the tensor.
#[derive(Clone, Debug)]
enum Concrete {
    View { lens: Vec<u32>, offs: Vec<u32> },
    Slice { dim: usize, start: u32, end: u32, step: u32 },
    Transpose { a: usize, b: usize },
    Permute(Vec<usize>),
    Reshape(Vec<u32>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (proptest::collection::vec((any::<u32>(), any::<u32>()), 5), 0u8..12)
            .prop_map(|(seeds, raw)| Op::View { seeds, raw }),
        4 => (0usize..6, any::<u32>(), any::<u32>(), 0u32..4, proptest::bool::weighted(0.15))
            .prop_map(|(dim, a, b, step, raw)| Op::Slice { dim, a, b, step, raw }),
        2 => (0usize..6, 0usize..6, proptest::bool::weighted(0.15))
            .prop_map(|(a, b, raw)| Op::Transpose { a, b, raw }),
        2 => Just(vec![0usize, 1, 2, 3, 4]).prop_shuffle().prop_map(Op::PermuteValid),
        1 => proptest::collection::vec(0usize..6, 0..6).prop_map(Op::PermuteRaw),
        3 => (0u8..4, 1u32..8, proptest::collection::vec(0u32..5, 0..7))
            .prop_map(|(kind, a, raw)| Op::Reshape { kind, a, raw }),
    ]
}

/// Turns seeds into arguments for a view of shape `shape` and `numel` elements.
fn concretize(op: &Op, shape: &[u32]) -> Concrete {
    let rank = shape.len();
    match op {
        Op::View { seeds, raw } => {
            let mut lens = Vec::new();
            let mut offs = Vec::new();
            for (d, &len) in shape.iter().enumerate() {
                let off = seeds[d].0 % (len + 1);
                lens.push(seeds[d].1 % (len - off + 1));
                offs.push(off);
            }
            match raw {
                // Leave the parent along one dimension.
                0 => lens[seeds[0].0 as usize % rank] += shape[seeds[0].0 as usize % rank] + 1,
                1 => lens.push(1),
                2 => {
                    offs.pop();
                }
                _ => {}
            }
            Concrete::View { lens, offs }
        }
        &Op::Slice { dim, a, b, step, raw } => {
            if raw {
                return Concrete::Slice { dim, start: a % 8, end: b % 9, step };
            }
            let dim = dim % rank;
            let len = shape[dim].max(1);
            let start = a % len;
            let end = start + 1 + b % (len - start);
            Concrete::Slice { dim, start, end, step: step.max(1) }
        }
        &Op::Transpose { a, b, raw } => {
            if raw {
                Concrete::Transpose { a, b }
            } else {
                Concrete::Transpose { a: a % rank, b: b % rank }
            }
        }
        Op::PermuteValid(order) => {
            Concrete::Permute(order.iter().copied().filter(|&d| d < rank).collect())
        }
        Op::PermuteRaw(order) => Concrete::Permute(order.clone()),
        Op::Reshape { kind, a, raw } => {
            let n: u32 = shape.iter().product();
            Concrete::Reshape(match kind {
                0 => vec![n],
                1 => {
                    // The smallest divisor of n that is at least `a` (n itself if none is
                    // smaller).
                    let d = (*a..=n.max(1)).find(|&d| n.is_multiple_of(d)).unwrap_or(1);
                    vec![d, n / d.max(1)]
                }
                2 => vec![1, n, 1],
                _ => raw.clone(),
            })
        }
    }
}

fn dtype() -> impl Strategy<Value = DataType> {
    proptest::sample::select(DataType::ALL.to_vec())
}

/// What the model says an operation returns.
fn apply_model(m: &Model, op: &Concrete, ndims: u32) -> Result<Model, TypesError> {
    let rank = m.shape.len();
    match op {
        Concrete::View { lens, offs } => {
            for got in [lens.len(), offs.len()] {
                if got != rank {
                    return Err(TypesError::RankMismatch {
                        expected: rank as u64,
                        got: got as u64,
                    });
                }
            }
            for dim in 0..rank {
                if offs[dim] + lens[dim] > m.shape[dim] {
                    return Err(TypesError::ViewOutsideParent {
                        dim,
                        offset: offs[dim],
                        len: lens[dim],
                        parent_len: m.shape[dim],
                    });
                }
            }
            Ok(m.gather(lens.clone(), |j| j.iter().zip(offs).map(|(&i, &o)| i + o).collect()))
        }
        &Concrete::Slice { dim, start, end, step } => {
            if dim >= rank {
                return Err(TypesError::DimOutOfRange { dim, ndims });
            }
            let len = m.shape[dim];
            if step == 0 || start >= end || end > len {
                return Err(TypesError::InvalidSlice { dim, start, end, step, len });
            }
            let mut shape = m.shape.clone();
            shape[dim] = (end - start).div_ceil(step);
            Ok(m.gather(shape, |j| {
                let mut src = j.to_vec();
                src[dim] = start + j[dim] * step;
                src
            }))
        }
        &Concrete::Transpose { a, b } => {
            if let Some(dim) = [a, b].into_iter().find(|&d| d >= rank) {
                return Err(TypesError::DimOutOfRange { dim, ndims });
            }
            let mut order: Vec<usize> = (0..rank).collect();
            order.swap(a, b);
            Ok(permuted(m, &order))
        }
        Concrete::Permute(order) => {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            if sorted != (0..rank).collect::<Vec<_>>() {
                return Err(TypesError::InvalidPermutation { order: order.clone(), ndims });
            }
            Ok(permuted(m, order))
        }
        Concrete::Reshape(shape) => {
            if !m.contiguous() {
                return Err(TypesError::NotContiguous);
            }
            if !(1..=5).contains(&shape.len()) {
                return Err(TypesError::InvalidRank { ndims: shape.len() as u64 });
            }
            let to: u64 = shape.iter().map(|&n| u64::from(n)).product();
            if to != m.numel() as u64 {
                return Err(TypesError::ReshapeMismatch {
                    from_numel: m.numel() as u64,
                    to_numel: to,
                });
            }
            Ok(Model { shape: shape.clone(), idx: m.idx.clone() })
        }
    }
}

fn permuted(m: &Model, order: &[usize]) -> Model {
    let shape = order.iter().map(|&d| m.shape[d]).collect();
    m.gather(shape, |j| {
        let mut src = vec![0; order.len()];
        for (i, &d) in order.iter().enumerate() {
            src[d] = j[i];
        }
        src
    })
}

fn apply_tensor(t: &Tensor, op: &Concrete) -> Result<Tensor, TypesError> {
    match op {
        Concrete::View { lens, offs } => t.view(lens, offs),
        &Concrete::Slice { dim, start, end, step } => t.slice(dim, start, end, step),
        &Concrete::Transpose { a, b } => t.transpose(a, b),
        Concrete::Permute(order) => t.permute(order),
        Concrete::Reshape(shape) => t.reshape(shape),
    }
}

/// Everything a valid descriptor must satisfy given the model of the elements it reaches.
fn check_agrees(t: &Tensor, m: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(t.validate(), Ok(()));
    prop_assert_eq!(Tensor::from_bytes(&t.to_bytes()), Ok(*t));
    prop_assert_eq!(t.shape(), &m.shape[..]);
    prop_assert_eq!(reached(t), m.idx.clone());
    prop_assert_eq!(t.numel(), m.idx.len() as u64);
    prop_assert_eq!(t.contiguous(), m.contiguous());
    let elem = t.element_size().unwrap();
    match (m.idx.iter().min(), m.idx.iter().max()) {
        (Some(&lo), Some(&hi)) if !t.is_null() => {
            // The footprint is the tight bounding span of the reached elements.
            prop_assert_eq!(t.byte_span(), Some((t.addr + lo * elem, t.addr + (hi + 1) * elem)));
            prop_assert_eq!(lo, t.start_offset);
            // The view-fits rule, solved for the extent.
            prop_assert!(t.extent() <= t.size / elem - t.start_offset);
            prop_assert!((hi + 1) * elem <= t.size);
        }
        _ => prop_assert_eq!(t.byte_span(), None),
    }
    Ok(())
}

proptest! {
    #![proptest_config(common::proptest_config(256, "proptest-regressions/tensor_views.txt"))]

    #[test]
    fn views_agree_with_the_element_model(
        shape in proptest::collection::vec(0u32..6, 1..=5),
        dtype in dtype(),
        extra in 0u64..64,
        null in proptest::bool::weighted(0.1),
        page in 1u64..1 << 20,
        ops in proptest::collection::vec(op(), 0..12),
    ) {
        let addr = if null { 0 } else { page << 12 };
        let numel: u64 = shape.iter().map(|&n| u64::from(n)).product();
        let bytes = (numel + extra) * dtype.element_size();
        let mut t = Tensor::with_buffer(addr, bytes, &shape, dtype).unwrap();
        let mut m = Model { shape: shape.clone(), idx: (0..numel).collect() };
        check_agrees(&t, &m)?;
        for op in &ops {
            let op = concretize(op, &m.shape);
            let expected = apply_model(&m, &op, t.ndims);
            let got = apply_tensor(&t, &op);
            match (expected, got) {
                (Ok(next_model), Ok(next)) => {
                    check_agrees(&next, &next_model)?;
                    t = next;
                    m = next_model;
                }
                (Err(e), Err(g)) => prop_assert_eq!(g, e, "op {:?}", op),
                (e, g) => prop_assert!(false, "op {:?}: model says {:?}, tensor gave {:?}", op, e.map(|m| m.shape), g),
            }
        }
    }

    #[test]
    fn corrupted_descriptors_never_panic_and_validated_ones_fit(
        shape in proptest::collection::vec(1u32..6, 1..=5),
        dtype in dtype(),
        edits in proptest::collection::vec((0usize..128, any::<u8>()), 1..6),
        ops in proptest::collection::vec(op(), 0..4),
    ) {
        let t = Tensor::external(0x4000, &shape, dtype).unwrap();
        let mut bytes = t.to_bytes();
        for (at, v) in edits {
            bytes[at] = v;
        }
        let raw: Tensor = bytemuck::pod_read_unaligned(&bytes);
        // Accessors are total on foreign bytes.
        let _ = (raw.numel(), raw.nbytes(), raw.data_addr(), raw.extent(), raw.byte_span());
        let _ = (raw.shape(), raw.stride(), raw.element_size(), raw.data_type(), raw.owner());
        let _ = format!("{raw:?} {raw}");
        for op in &ops {
            let _ = apply_tensor(&raw, &concretize(op, &shape));
        }
        match Tensor::from_bytes(&bytes) {
            Ok(v) => {
                prop_assert_eq!(v, raw);
                if let Some((lo, hi)) = v.byte_span() {
                    prop_assert!(v.addr <= lo && lo < hi && hi <= v.addr + v.size);
                } else {
                    prop_assert!(v.is_null() || v.numel() == 0);
                }
            }
            Err(e) => prop_assert_eq!(raw.validate(), Err(e)),
        }
    }
}

#[test]
fn a_stride_that_never_moves_may_exceed_u32() {
    // The leading dimension's stride would be 2^32 elements: of length 1 or of an empty view it
    // never moves over a byte, so the layout is built; of length 2 it is refused.
    for shape in [[1, 65536, 65536], [0, 65536, 65536]] {
        let t = Tensor::external(0x1000, &shape, DataType::Int8).expect("a layout");
        assert_eq!(t.validate(), Ok(()), "{shape:?}");
        assert!(t.contiguous(), "{shape:?}");
    }
    let whole = Tensor::external(0x1000, &[65536, 65536], DataType::Int8).unwrap();
    assert!(whole.reshape(&[1, 65536, 65536]).is_ok());
    assert_eq!(
        Tensor::external(0x1000, &[2, 65536, 65536], DataType::Int8),
        Err(TypesError::SizeOverflow { what: "stride" })
    );
}

#[test]
fn a_reshape_to_a_shape_whose_element_count_overflows_says_so() {
    let t = Tensor::external(0x1000, &[4], DataType::Int8).unwrap();
    assert_eq!(
        t.reshape(&[u32::MAX, u32::MAX, u32::MAX]),
        Err(TypesError::SizeOverflow { what: "element count" })
    );
}
