//! Deriving keys and byte spans from tensor descriptors (`docs/tensormap.md` §1–§2).

use simpler_tensormap::{Access, ByteSpan, TensorKey, TensorMap, TensorMapError, footprint};
use simpler_types::{DataType, RunId, SlotId, Tensor, TensorArgType, WorkerId};

const BASE: u64 = 0x1000;

/// A 4 × 8 matrix of f32 (128 bytes) at `BASE`, row-major: strides [8, 1].
fn matrix() -> Tensor {
    Tensor::external(BASE, &[4, 8], DataType::Float32).unwrap()
}

fn span(start: u64, end: u64) -> ByteSpan {
    ByteSpan::new(start, end).unwrap()
}

fn host_footprint(t: &Tensor) -> (TensorKey, ByteSpan) {
    footprint(t, None).unwrap().expect("a non-empty host tensor is tracked")
}

#[test]
fn a_contiguous_tensor_covers_its_whole_buffer() {
    assert_eq!(host_footprint(&matrix()), (TensorKey::Host { addr: BASE }, span(BASE, BASE + 128)));
}

#[test]
fn a_view_keeps_the_buffer_key_and_covers_its_bounding_bytes() {
    // Rows 1..3, columns 2..6: origin at element 1·8 + 2 = 10, last element at 10 + 8 + 3 = 21.
    let v = matrix().view(&[2, 4], &[1, 2]).unwrap();
    assert_eq!(host_footprint(&v), (TensorKey::Host { addr: BASE }, span(BASE + 40, BASE + 88)));
}

#[test]
fn row_slices_are_disjoint_and_the_whole_tensor_overlaps_both() {
    let (key_a, top) = host_footprint(&matrix().slice(0, 0, 2, 1).unwrap());
    let (key_b, bottom) = host_footprint(&matrix().slice(0, 2, 4, 1).unwrap());
    let (_, whole) = host_footprint(&matrix());
    assert_eq!((key_a, key_b), (TensorKey::Host { addr: BASE }, TensorKey::Host { addr: BASE }));
    assert_eq!((top, bottom), (span(BASE, BASE + 64), span(BASE + 64, BASE + 128)));
    assert!(!top.overlaps(bottom));
    assert!(whole.overlaps(top) && whole.overlaps(bottom));
}

#[test]
fn a_strided_view_is_covered_by_its_bounding_span() {
    // Even columns: shape [4, 4], strides [8, 2]; last element at 3·8 + 3·2 = 30.
    let even = matrix().slice(1, 0, 8, 2).unwrap();
    let (_, bounding) = host_footprint(&even);
    assert_eq!(bounding, span(BASE, BASE + 31 * 4));
    // Conservative: the odd columns interleave with it, so the two count as overlapping.
    let (_, odd) = host_footprint(&matrix().slice(1, 1, 8, 2).unwrap());
    assert!(bounding.overlaps(odd));
}

#[test]
fn a_transposed_view_covers_the_same_bytes() {
    let t = matrix().transpose(0, 1).unwrap();
    assert_eq!(host_footprint(&t), host_footprint(&matrix()));
    let r = matrix().reshape(&[32]).unwrap();
    assert_eq!(host_footprint(&r), host_footprint(&matrix()));
}

#[test]
fn a_zero_size_view_is_untracked() {
    let empty = Tensor::external(BASE, &[0, 8], DataType::Float32).unwrap();
    assert_eq!(footprint(&empty, None), Ok(None));
    assert_eq!(ByteSpan::of_tensor(&empty), None);
    assert_eq!(TensorKey::for_tensor(&empty, None), Ok(Some(TensorKey::Host { addr: BASE })));
}

#[test]
fn a_null_tensor_is_untracked_even_as_child_memory() {
    let null = Tensor::external(0, &[4], DataType::Float32).unwrap();
    assert_eq!(footprint(&null, None), Ok(None));
    assert_eq!(footprint(&null.child_memory(true), None), Ok(None));
    assert_eq!(TensorKey::for_tensor(&null, Some(WorkerId(0))), Ok(None));
}

#[test]
fn child_memory_is_keyed_per_target_worker() {
    let t = matrix().child_memory(true);
    let (k0, s0) = footprint(&t, Some(WorkerId(0))).unwrap().unwrap();
    let (k1, s1) = footprint(&t, Some(WorkerId(1))).unwrap().unwrap();
    assert_eq!(k0, TensorKey::Child { worker: WorkerId(0), addr: BASE });
    assert_eq!(k1, TensorKey::Child { worker: WorkerId(1), addr: BASE });
    assert_ne!(k0, k1);
    assert_eq!(s0, s1);
    assert_ne!(k0, host_footprint(&matrix()).0, "host and child memory are different buffers");
}

#[test]
fn host_memory_ignores_the_target() {
    let (key, _) = footprint(&matrix(), Some(WorkerId(3))).unwrap().unwrap();
    assert_eq!(key, TensorKey::Host { addr: BASE });
}

#[test]
fn child_memory_without_a_target_is_an_error_naming_the_address() {
    let t = matrix().child_memory(true);
    let err = footprint(&t, None).unwrap_err();
    assert_eq!(err, TensorMapError::ChildMemoryWithoutTarget { addr: BASE });
    assert!(err.to_string().contains("0x1000"), "{err}");
    assert_eq!(TensorKey::for_tensor(&t, None), Err(err));
    // The rule is about which memory the task names, not how much of it.
    let empty = Tensor::external(BASE, &[0], DataType::Float32).unwrap().child_memory(true);
    assert_eq!(footprint(&empty, None), Err(err));
}

#[test]
fn an_unmeasurable_descriptor_is_covered_to_the_end_of_the_address_space() {
    let mut t = matrix();
    t.dtype = 0xEE;
    assert_eq!(ByteSpan::of_tensor(&t), Some(span(BASE, u64::MAX)));
}

#[test]
fn an_output_of_an_unmeasurable_descriptor_supersedes_no_earlier_writer() {
    let (map, run) = (TensorMap::new(), RunId::FIRST);
    let good = matrix();
    let mut bad = matrix();
    bad.dtype = 0xEE;
    let overwrite = |t: &Tensor| Access::of_view(TensorArgType::Output, t).unwrap();
    assert_eq!(overwrite(&bad), Access::Scatter);
    let (key, good_span) = host_footprint(&good);
    let (_, bad_span) = host_footprint(&bad);
    let (w0, b) = (SlotId::new(0, 1), SlotId::new(1, 1));
    map.record(run, key, good_span, overwrite(&good), w0);
    assert_eq!(map.record(run, key, bad_span, overwrite(&bad), b), 0, "W0's entry superseded");
    // A reader of W0's bytes still waits for W0 (and for the unmeasurable write, which may
    // touch them too).
    let mut producers = Vec::new();
    map.dependencies(run, &key, good_span, Access::Read, |p| producers.push(p));
    producers.sort_unstable();
    assert_eq!(producers, [w0, b]);
}

#[test]
fn slice_writers_and_a_whole_tensor_reader_meet_in_the_map() {
    let map = TensorMap::new();
    let run = RunId::FIRST;
    let mut guard = map.lock();
    for (i, rows) in [(0, 2), (2, 4)].into_iter().enumerate() {
        let (key, span) = host_footprint(&matrix().slice(0, rows.0, rows.1, 1).unwrap());
        guard.insert(run, key, span, SlotId::new(i as u32, 1));
    }
    let (key, whole) = host_footprint(&matrix());
    let mut producers = Vec::new();
    guard.lookup_overlapping(run, &key, whole, |s| producers.push(s));
    producers.sort_unstable();
    assert_eq!(producers, [SlotId::new(0, 1), SlotId::new(1, 1)]);
    let (_, last_row) = host_footprint(&matrix().slice(0, 3, 4, 1).unwrap());
    let mut only_bottom = Vec::new();
    guard.lookup_overlapping(run, &key, last_row, |s| only_bottom.push(s));
    assert_eq!(only_bottom, [SlotId::new(1, 1)]);
}
