//! The kernel ABI of the tensor descriptor: size, alignment, field offsets and the exact bytes of
//! a known descriptor.

use std::mem::{align_of, offset_of, size_of};

use simpler_types::{DataType, DeviceTaskId, TENSOR_DESC_ALIGN, TENSOR_DESC_SIZE, Tensor};

// The same facts the crate asserts internally, restated from the outside so that a change to
// the crate's own asserts cannot silently move the ABI.
const _: () = {
    assert!(size_of::<Tensor>() == 128 && TENSOR_DESC_SIZE == 128);
    assert!(align_of::<Tensor>() == 64 && TENSOR_DESC_ALIGN == 64);
    assert!(offset_of!(Tensor, addr) == 0);
    assert!(offset_of!(Tensor, size) == 8);
    assert!(offset_of!(Tensor, owner_task_id) == 16);
    assert!(offset_of!(Tensor, start_offset) == 24);
    assert!(offset_of!(Tensor, version) == 32);
    assert!(offset_of!(Tensor, ndims) == 36);
    assert!(offset_of!(Tensor, dtype) == 40);
    assert!(offset_of!(Tensor, manual_dep) == 41);
    assert!(offset_of!(Tensor, is_contiguous) == 42);
    assert!(offset_of!(Tensor, child_memory) == 43);
    assert!(offset_of!(Tensor, shapes) == 44);
    assert!(offset_of!(Tensor, extent_elems) == 64);
    assert!(offset_of!(Tensor, strides) == 72);
    assert!(offset_of!(Tensor, reserved) == 92);
};

/// `Tensor::external(0x1000, &[2, 3, 4], Float16)`, written out by hand from the layout table.
#[rustfmt::skip]
const GOLDEN_F16_2X3X4_AT_0X1000: [u8; 128] = [
    // 0: addr = 0x1000
    0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    // 8: size = 24 elements × 2 bytes = 48
    0x30, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    // 16: owner_task_id = u64::MAX (external)
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    // 24: start_offset = 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    // 32: version = 0
    0x00, 0x00, 0x00, 0x00,
    // 36: ndims = 3
    0x03, 0x00, 0x00, 0x00,
    // 40: dtype = FLOAT16 (1), manual_dep = 0, is_contiguous = 1, child_memory = 0
    0x01, 0x00, 0x01, 0x00,
    // 44: shapes = [2, 3, 4, 0, 0]
    0x02, 0x00, 0x00, 0x00,
    0x03, 0x00, 0x00, 0x00,
    0x04, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00,
    // 64: extent_elems = 24
    0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    // 72: strides = [12, 4, 1, 0, 0]
    0x0c, 0x00, 0x00, 0x00,
    0x04, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00,
    // 92: reserved, 36 zero bytes
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

#[test]
fn external_descriptor_encodes_to_the_golden_bytes() {
    let t = Tensor::external(0x1000, &[2, 3, 4], DataType::Float16).unwrap();
    assert_eq!(t.to_bytes(), GOLDEN_F16_2X3X4_AT_0X1000);
}

#[test]
fn golden_bytes_decode_to_the_expected_descriptor() {
    let t = Tensor::from_bytes(&GOLDEN_F16_2X3X4_AT_0X1000).unwrap();
    assert_eq!(t.addr, 0x1000);
    assert_eq!(t.size, 48);
    assert_eq!(t.owner(), DeviceTaskId::NONE);
    assert_eq!(t.data_type(), Ok(DataType::Float16));
    assert_eq!(t.shape(), &[2, 3, 4]);
    assert_eq!(t.stride(), &[12, 4, 1]);
    assert_eq!((t.numel(), t.nbytes(), t.extent()), (24, 48, 24));
    assert!(t.contiguous() && !t.is_child_memory() && !t.is_manual_dep());
    assert_eq!(t.byte_span(), Some((0x1000, 0x1030)));
}

#[test]
fn setters_land_on_their_bytes() {
    let t = Tensor::external(0x1000, &[2, 3, 4], DataType::Float16)
        .unwrap()
        .child_memory(true)
        .manual_dep(true)
        .version(-2)
        .with_owner(DeviceTaskId::new(2, 5));
    let b = t.to_bytes();
    assert_eq!(&b[16..24], &[5, 0, 0, 0, 2, 0, 0, 0]);
    assert_eq!(&b[32..36], &(-2i32).to_le_bytes());
    assert_eq!((b[41], b[43]), (1, 1));
    assert_eq!(Tensor::from_bytes(&b), Ok(t));
}
