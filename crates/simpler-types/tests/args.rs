//! Task-argument builders and the encoded blob: caps, ordering rule, unchanged-on-error, and an
//! op-sequence property test against a plain `Vec` model.

mod common;

use proptest::prelude::*;
use simpler_types::{
    Args, CoreArgs, DataType, TaskArgs, TaskArgsView, Tensor, TensorArgType, TypesError, to_scalar,
};

fn tensor(i: u64) -> Tensor {
    Tensor::external(0x1_0000 + i * 0x100, &[2, 2], DataType::Float32).unwrap()
}

#[test]
fn tensor_after_scalar_fails_and_leaves_builder_unchanged() {
    let mut a = TaskArgs::new();
    a.add_input(tensor(0)).unwrap().add_scalar(5).unwrap();
    let before = a.clone();
    assert_eq!(a.add_output(tensor(1)).err(), Some(TypesError::TensorAfterScalar { scalars: 1 }));
    assert_eq!(a, before);
}

fn fill_to_caps<const T: usize, const S: usize>() -> Args<T, S> {
    let mut a = Args::<T, S>::new();
    for i in 0..T {
        a.add_inout(tensor(i as u64)).unwrap();
    }
    for i in 0..S {
        a.add_scalar(i as u64).unwrap();
    }
    a
}

#[test]
fn task_args_reject_the_129th_tensor_and_the_129th_scalar() {
    let mut a = TaskArgs::new();
    for i in 0..128 {
        a.add_input(tensor(i)).unwrap();
    }
    let before = a.clone();
    assert_eq!(
        a.add_input(tensor(128)).err(),
        Some(TypesError::TooManyTensors { count: 129, cap: 128 })
    );
    assert_eq!(a, before);

    let mut full = fill_to_caps::<128, 128>();
    let before = full.clone();
    assert_eq!(full.add_scalar(1).err(), Some(TypesError::TooManyScalars { count: 129, cap: 128 }));
    assert_eq!(
        full.add_scalar_of(1.0f32).err(),
        Some(TypesError::TooManyScalars { count: 129, cap: 128 })
    );
    assert_eq!(full, before);
    // The largest legal blob is 8 + 128·128 + 128·8 bytes.
    assert_eq!(full.encoded_len(), 17_416);
    assert_eq!(TaskArgs::decode(&full.encode()).unwrap().tensors(), full.tensors());
}

#[test]
fn core_args_reject_the_33rd_tensor_and_the_17th_scalar() {
    let mut a = CoreArgs::new();
    for i in 0..32 {
        a.add_no_dep(tensor(i)).unwrap();
    }
    let before = a.clone();
    assert_eq!(
        a.add_no_dep(tensor(32)).err(),
        Some(TypesError::TooManyTensors { count: 33, cap: 32 })
    );
    assert_eq!(a, before);

    let mut full = fill_to_caps::<32, 16>();
    let before = full.clone();
    assert_eq!(full.add_scalar(1).err(), Some(TypesError::TooManyScalars { count: 17, cap: 16 }));
    assert_eq!(full, before);
    // A TaskArgs blob with more than 32 tensors does not decode as CoreArgs.
    let big = fill_to_caps::<128, 0>();
    assert_eq!(
        CoreArgs::decode(&big.encode()),
        Err(TypesError::TooManyTensors { count: 128, cap: 32 })
    );
}

#[test]
fn every_tagged_adder_records_its_tag() {
    let mut a = CoreArgs::new();
    a.add_input(tensor(0))
        .and_then(|a| a.add_output(tensor(1)))
        .and_then(|a| a.add_inout(tensor(2)))
        .and_then(|a| a.add_output_existing(tensor(3)))
        .and_then(|a| a.add_no_dep(tensor(4)))
        .and_then(|a| a.add_tensor(tensor(5), TensorArgType::default()))
        .unwrap();
    use TensorArgType::*;
    assert_eq!(a.tags(), &[Input, Output, InOut, OutputExisting, NoDep, Input]);
}

#[test]
fn view_keeps_tags_and_reads_typed_scalars() {
    let mut a = TaskArgs::new();
    a.add_output(tensor(0)).unwrap();
    a.add_scalar_of(-1i32).unwrap().add_scalar_of(2.5f64).unwrap().add_scalar_of(true).unwrap();
    let v: TaskArgsView<'_> = a.view();
    assert_eq!(v.tensors, a.tensors());
    assert_eq!(v.tags, &[TensorArgType::Output]);
    assert_eq!(v.tag(0), Some(TensorArgType::Output));
    assert_eq!(v.scalars, &[0xFFFF_FFFF, 2.5f64.to_bits(), 1]);
    assert_eq!(v.scalar_of::<i32>(0), Some(-1));
    assert_eq!(v.scalar_of::<f64>(1), Some(2.5));
    assert_eq!(v.scalar_of::<bool>(2), Some(true));
    assert_eq!(v.scalar(3), None);
    assert_eq!(v.tensor(0), Some(&tensor(0)));
    assert_eq!(TaskArgsView::EMPTY.tensor(0), None);
}

#[test]
fn building_a_small_task_does_not_allocate() {
    let mut a = TaskArgs::new();
    for i in 0..4 {
        a.add_tensor(tensor(i), TensorArgType::InOut).unwrap();
        a.clear();
    }
    for i in 0..4 {
        a.add_input(tensor(i)).unwrap();
    }
    for i in 0..4 {
        a.add_scalar(i).unwrap();
    }
    assert!(a.is_inline(), "four tensors and four scalars must fit inline");
    a.add_scalar(4).unwrap();
    assert!(!a.is_inline());
}

#[derive(Clone, Debug)]
enum Op {
    AddTensor(u8, TensorArgType),
    AddScalar(u64),
    /// Adds `n` tensors in a row, so that long sequences reach the caps.
    AddTensors(u8),
    /// Adds `n` scalars in a row.
    AddScalars(u8),
    Clear,
    RoundTrip {
        cuts: Vec<usize>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let tag = prop_oneof![
        Just(TensorArgType::Input),
        Just(TensorArgType::Output),
        Just(TensorArgType::InOut),
        Just(TensorArgType::OutputExisting),
        Just(TensorArgType::NoDep),
    ];
    prop_oneof![
        8 => (any::<u8>(), tag).prop_map(|(i, t)| Op::AddTensor(i, t)),
        6 => any::<u64>().prop_map(Op::AddScalar),
        1 => (0u8..140).prop_map(Op::AddTensors),
        1 => (0u8..140).prop_map(Op::AddScalars),
        1 => Just(Op::Clear),
        2 => proptest::collection::vec(any::<usize>(), 0..6).prop_map(|cuts| Op::RoundTrip { cuts }),
    ]
}

/// Runs `ops` against both the builder and a `Vec` model and checks they agree after each step.
fn check_against_model<const T: usize, const S: usize>(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut args = Args::<T, S>::new();
    let mut tensors: Vec<(Tensor, TensorArgType)> = Vec::new();
    let mut scalars: Vec<u64> = Vec::new();
    let expanded = ops.iter().flat_map(|op| match op {
        Op::AddTensors(n) => (0..*n).map(|i| Op::AddTensor(i, TensorArgType::InOut)).collect(),
        Op::AddScalars(n) => (0..*n).map(|i| Op::AddScalar(u64::from(i))).collect(),
        other => vec![other.clone()],
    });
    for op in expanded {
        match &op {
            Op::AddTensor(i, tag) => {
                let t = tensor(u64::from(*i));
                let expected = if !scalars.is_empty() {
                    Err(TypesError::TensorAfterScalar { scalars: scalars.len() })
                } else if tensors.len() == T {
                    Err(TypesError::TooManyTensors { count: T + 1, cap: T })
                } else {
                    tensors.push((t, *tag));
                    Ok(())
                };
                prop_assert_eq!(args.add_tensor(t, *tag).map(|_| ()), expected);
            }
            Op::AddScalar(v) => {
                let expected = if scalars.len() == S {
                    Err(TypesError::TooManyScalars { count: S + 1, cap: S })
                } else {
                    scalars.push(*v);
                    Ok(())
                };
                prop_assert_eq!(args.add_scalar(*v).map(|_| ()), expected);
            }
            Op::AddTensors(_) | Op::AddScalars(_) => unreachable!("expanded above"),
            Op::Clear => {
                args.clear();
                tensors.clear();
                scalars.clear();
            }
            Op::RoundTrip { cuts } => {
                let blob = args.encode();
                prop_assert_eq!(blob.len(), 8 + 128 * tensors.len() + 8 * scalars.len());
                let back = Args::<T, S>::decode(&blob).unwrap();
                prop_assert_eq!(back.tensors(), args.tensors());
                prop_assert_eq!(back.scalars(), args.scalars());
                prop_assert!(back.tags().iter().all(|&t| t == TensorArgType::Input));
                // Trailing bytes after the blob (a larger mailbox) are ignored.
                let mut padded = blob.clone();
                padded.extend_from_slice(&[0xAB; 16]);
                prop_assert_eq!(Args::<T, S>::decode(&padded).unwrap(), back);
                // Every truncation is reported as such, never a panic or a wrong decode.
                let fixed = [0, 1, 7, 8, blob.len().saturating_sub(1)];
                for cut in fixed.into_iter().chain(cuts.iter().map(|c| c % blob.len())) {
                    if cut >= blob.len() {
                        continue;
                    }
                    let err = Args::<T, S>::decode(&blob[..cut]).unwrap_err();
                    let needed = if cut < 8 { 8 } else { blob.len() };
                    prop_assert_eq!(err, TypesError::BlobTruncated { needed, capacity: cut });
                }
                let mut short = vec![0u8; blob.len().saturating_sub(1)];
                prop_assert_eq!(
                    args.encode_into(&mut short),
                    Err(TypesError::BlobTooSmall { needed: blob.len(), capacity: short.len() })
                );
            }
        }
        let model_tensors: Vec<Tensor> = tensors.iter().map(|(t, _)| *t).collect();
        let model_tags: Vec<TensorArgType> = tensors.iter().map(|(_, g)| *g).collect();
        prop_assert_eq!(args.tensors(), &model_tensors[..]);
        prop_assert_eq!(args.tags(), &model_tags[..]);
        prop_assert_eq!(args.scalars(), &scalars[..]);
    }
    Ok(())
}

proptest! {
    #![proptest_config(common::proptest_config(128, "proptest-regressions/args.txt"))]

    #[test]
    fn core_args_follow_the_vec_model(ops in proptest::collection::vec(op(), 0..80)) {
        check_against_model::<32, 16>(&ops)?;
    }

    #[test]
    fn task_args_follow_the_vec_model(ops in proptest::collection::vec(op(), 0..300)) {
        check_against_model::<128, 128>(&ops)?;
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = TaskArgs::decode(&bytes);
        let _ = CoreArgs::decode(&bytes);
    }

    #[test]
    fn scalar_packing_round_trips(i in any::<i32>(), f in any::<f32>(), b in any::<bool>(), s in any::<i8>()) {
        let mut a = CoreArgs::new();
        a.add_scalar_of(i).unwrap().add_scalar_of(f).unwrap().add_scalar_of(b).unwrap().add_scalar_of(s).unwrap();
        let v = a.view();
        prop_assert_eq!(v.scalars[0] >> 32, 0);
        prop_assert_eq!(v.scalar_of::<i32>(0), Some(i));
        prop_assert_eq!(v.scalar_of::<f32>(1).map(f32::to_bits), Some(f.to_bits()));
        prop_assert_eq!(v.scalar_of::<bool>(2), Some(b));
        prop_assert_eq!(v.scalars[3], to_scalar(s));
        prop_assert_eq!(v.scalars[3] >> 8, 0);
    }
}
