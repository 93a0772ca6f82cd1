//! The two ways [`Tensor::validate`] judges a descriptor.
//!
//! Submit validates every tensor argument of every task, and nearly every descriptor it sees is
//! well formed, so the rulebook is run in two stages:
//!
//! 1. [`is_well_formed`] answers yes or no in one pass over the used dimensions, compiled once
//!    per rank so that it unrolls into straight-line code with checked `u64` arithmetic. It builds no error value and formats nothing; it only loads fields,
//!    compares and multiplies. Contiguous and strided views take the same pass: the row-major
//!    test falls out of the running element count, which is the stride a row-major dimension
//!    must have.
//! 2. Only when it says no does [`first_violation`] (cold, never inlined) run the checks one by
//!    one in the documented order and build the error for the first that fails.
//!
//! Why the split cannot change behaviour: `validate` returns `Ok(())` straight away only when
//! [`is_well_formed`] holds, and [`is_well_formed`] holds only for descriptors that
//! [`first_violation`] accepts (it tests the same rules, and gives up whenever its `u64`
//! arithmetic would overflow, which on a valid descriptor can happen only where the in-order
//! checks would fail too). Every other descriptor gets exactly the in-order answer. The two
//! agree in both directions on every descriptor whose view is non-empty; an empty view (a
//! zero-length used dimension) is always left to [`first_violation`], because whether its byte
//! size "overflows" depends on the order in which its shape product is formed, and empty views
//! are too rare on submit to be worth a second copy of that rule. A property test in this
//! module compares the two stages on random valid and corrupted descriptors.

use crate::constants::MAX_TENSOR_DIMS;
use crate::dtype::DataType;
use crate::error::TypesError;

use super::{FLAG_OFFSETS, Tensor, checked_numel, checked_rank, is_row_major, span_elems};

/// Whether `t` passes every rule of [`Tensor::validate`]. `false` means "not proven here":
/// the descriptor is invalid, or its view is empty.
#[inline]
pub(super) fn is_well_formed(t: &Tensor) -> bool {
    // One copy of the pass per rank, so that every loop below has a constant trip count and
    // unrolls into straight-line code.
    match t.ndims {
        1 => is_well_formed_with_rank::<1>(t),
        2 => is_well_formed_with_rank::<2>(t),
        3 => is_well_formed_with_rank::<3>(t),
        4 => is_well_formed_with_rank::<4>(t),
        5 => is_well_formed_with_rank::<5>(t),
        _ => false,
    }
}

/// [`is_well_formed`] for a descriptor whose `ndims` is `RANK` (1..=5).
#[inline]
fn is_well_formed_with_rank<const RANK: usize>(t: &Tensor) -> bool {
    let Some(dtype) = DataType::from_u8(t.dtype) else {
        return false;
    };
    // A byte above 1 has a bit above bit 0, which survives the OR.
    if (t.manual_dep | t.is_contiguous | t.child_memory) > 1 {
        return false;
    }
    let mut unused = 0u32;
    for d in RANK..MAX_TENSOR_DIMS {
        unused |= t.shapes[d] | t.strides[d];
    }
    if unused != 0 {
        return false;
    }
    // One pass from the innermost dimension out. `numel` is the element count of the
    // dimensions seen so far, which is also the stride a row-major dimension must have here
    // (length-1 dimensions multiply by 1 and their stride is ignored).
    let mut numel: u64 = 1;
    let mut span: u64 = 0;
    let mut row_major = true;
    for d in (0..RANK).rev() {
        let (n, s) = (u64::from(t.shapes[d]), u64::from(t.strides[d]));
        // An empty view is left to the in-order checks.
        if n == 0 || s == 0 {
            return false;
        }
        row_major &= n == 1 || s == numel;
        // Both factors are below 2^32, so the product fits `u64`; only the sum can overflow,
        // and then `extent_elems` cannot hold the true span.
        let Some(next_span) = span.checked_add((n - 1) * s) else {
            return false;
        };
        // Every factor is at least 1, so a product that fits was formed without overflow in
        // any order, as `checked_numel` forms it.
        let Some(next_numel) = numel.checked_mul(n) else {
            return false;
        };
        span = next_span;
        numel = next_numel;
    }
    let elem = dtype.element_size();
    if numel.checked_mul(elem).is_none()
        || row_major != t.contiguous()
        || span.checked_add(1) != Some(t.extent_elems)
    {
        return false;
    }
    if t.addr == 0 {
        return true;
    }
    // If `(start_offset + extent) × element_size` leaves `u64` it certainly exceeds `size`.
    t.addr.checked_add(t.size).is_some()
        && t.start_offset
            .checked_add(t.extent_elems)
            .and_then(|end| end.checked_mul(elem))
            .is_some_and(|needed_bytes| needed_bytes <= t.size)
}

/// Runs the rules of [`Tensor::validate`] one by one in their documented order and returns the
/// error of the first that fails, or `Ok(())` if none does.
#[cold]
#[inline(never)]
pub(super) fn first_violation(t: &Tensor) -> Result<(), TypesError> {
    let rank = checked_rank(u64::from(t.ndims))?;
    let dtype = t.data_type()?;
    for (offset, value) in
        FLAG_OFFSETS.into_iter().zip([t.manual_dep, t.is_contiguous, t.child_memory])
    {
        if value > 1 {
            return Err(TypesError::InvalidFlag { offset, value });
        }
    }
    let (shape, stride) = (&t.shapes[..rank], &t.strides[..rank]);
    if let Some(dim) = stride.iter().position(|&s| s == 0) {
        return Err(TypesError::ZeroStride { dim });
    }
    for (field, entries) in [("shapes", &t.shapes), ("strides", &t.strides)] {
        if let Some(dim) = (rank..MAX_TENSOR_DIMS).find(|&d| entries[d] != 0) {
            return Err(TypesError::UnusedDimNonZero { field, dim, value: entries[dim] });
        }
    }
    if checked_numel(shape).and_then(|n| n.checked_mul(dtype.element_size())).is_none() {
        return Err(TypesError::SizeOverflow { what: "byte size" });
    }
    let contiguous = is_row_major(shape, stride);
    if t.contiguous() != contiguous {
        return Err(TypesError::StaleLayoutCache {
            field: "is_contiguous",
            stored: u64::from(t.is_contiguous),
            computed: u64::from(contiguous),
        });
    }
    // An extent past `u64` fits no cache: it is the overflow the API reports for the same view.
    let Ok(extent) = u64::try_from(span_elems(shape, stride)) else {
        return Err(TypesError::SizeOverflow { what: "extent" });
    };
    if t.extent_elems != extent {
        return Err(TypesError::StaleLayoutCache {
            field: "extent_elems",
            stored: t.extent_elems,
            computed: extent,
        });
    }
    if t.is_null() {
        return Ok(());
    }
    // Empty views too: code that checks a buffer's range adds its size to its address.
    if t.addr.checked_add(t.size).is_none() {
        return Err(TypesError::SizeOverflow { what: "buffer end address" });
    }
    if extent == 0 {
        return Ok(());
    }
    // `start_offset < 2^64`, `extent < 2^67` and `element_size ≤ 8`: no overflow in u128.
    let needed_bytes =
        (u128::from(t.start_offset) + u128::from(extent)) * u128::from(dtype.element_size());
    if needed_bytes > u128::from(t.size) {
        return Err(TypesError::ViewOutOfBounds { needed_bytes, buffer_bytes: t.size });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bytemuck::Zeroable;
    use proptest::prelude::*;
    use proptest::test_runner::Config;

    use super::*;

    /// Modest case count for normal runs; `PROPTEST_CASES` overrides it for longer soaks.
    fn config() -> Config {
        let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok());
        Config { cases: cases.unwrap_or(512), ..Config::default() }
    }

    /// Shape entries: mostly small, with 0, 1 and lengths near `u32::MAX` mixed in.
    fn extent_entry() -> impl Strategy<Value = u32> {
        prop_oneof![
            6 => 1u32..9,
            1 => Just(0u32),
            2 => Just(1u32),
            1 => (u32::MAX - 4)..=u32::MAX,
            1 => any::<u32>(),
        ]
    }

    /// Stride entries: row-major (`None`) most of the time, else small or arbitrary values.
    fn stride_entry() -> impl Strategy<Value = Option<u32>> {
        prop_oneof![
            4 => Just(None),
            3 => (1u32..64).prop_map(Some),
            1 => any::<u32>().prop_map(Some),
        ]
    }

    /// One random edit of a descriptor: a raw byte, or a nudge aimed at one rule.
    #[derive(Clone, Debug)]
    enum Corruption {
        Byte { at: usize, value: u8 },
        Extent(i8),
        Size(i8),
        StartOffset(i8),
        FlipContiguous,
        Flag { offset: usize, value: u8 },
        UnusedEntry { dim: usize, value: u32, stride: bool },
        ZeroStride(usize),
        Rank(u32),
    }

    fn corruption() -> impl Strategy<Value = Corruption> {
        prop_oneof![
            3 => (0usize..128, any::<u8>()).prop_map(|(at, value)| Corruption::Byte { at, value }),
            1 => any::<i8>().prop_map(Corruption::Extent),
            1 => any::<i8>().prop_map(Corruption::Size),
            1 => any::<i8>().prop_map(Corruption::StartOffset),
            1 => Just(Corruption::FlipContiguous),
            1 => (prop::sample::select(FLAG_OFFSETS.to_vec()), 0u8..4)
                .prop_map(|(offset, value)| Corruption::Flag { offset, value }),
            1 => (0usize..5, 1u32..4, any::<bool>())
                .prop_map(|(dim, value, stride)| Corruption::UnusedEntry { dim, value, stride }),
            1 => (0usize..5).prop_map(Corruption::ZeroStride),
            1 => (0u32..8).prop_map(Corruption::Rank),
        ]
    }

    fn corrupt(t: &mut Tensor, c: &Corruption) {
        let nudge = |v: u64, by: i8| v.wrapping_add_signed(i64::from(by));
        match *c {
            Corruption::Byte { at, value } => {
                let mut bytes = t.to_bytes();
                bytes[at] = value;
                *t = bytemuck::pod_read_unaligned(&bytes);
            }
            Corruption::Extent(by) => t.extent_elems = nudge(t.extent_elems, by),
            Corruption::Size(by) => t.size = nudge(t.size, by),
            Corruption::StartOffset(by) => t.start_offset = nudge(t.start_offset, by),
            Corruption::FlipContiguous => t.is_contiguous ^= 1,
            Corruption::Flag { offset, value } => {
                let mut bytes = t.to_bytes();
                bytes[offset] = value;
                *t = bytemuck::pod_read_unaligned(&bytes);
            }
            Corruption::UnusedEntry { dim, value, stride } => {
                let entries = if stride { &mut t.strides } else { &mut t.shapes };
                entries[dim] = value;
            }
            Corruption::ZeroStride(dim) => t.strides[dim] = 0,
            Corruption::Rank(ndims) => t.ndims = ndims,
        }
    }

    /// A descriptor whose caches are computed from its shape and strides, in a buffer of
    /// exactly the needed size plus `slack` (which may be negative), at one of a few addresses.
    fn descriptor() -> impl Strategy<Value = Tensor> {
        (
            proptest::collection::vec((extent_entry(), stride_entry()), 1..=5),
            0u8..12,
            prop_oneof![Just(0u64), Just(0x1_0000_0000u64), Just(u64::MAX - 0xff), any::<u64>()],
            prop_oneof![4 => 0u64..64, 1 => any::<u64>()],
            prop_oneof![4 => 0i64..64, 1 => -4i64..0, 1 => any::<i64>()],
            any::<bool>(),
        )
            .prop_map(|(dims, dtype, addr, start_offset, slack, flags)| {
                let mut t = Tensor::zeroed();
                let rank = dims.len();
                let mut row_major: u64 = 1;
                for (d, &(n, stride)) in dims.iter().enumerate().rev() {
                    t.shapes[d] = n;
                    let fallback = u32::try_from(row_major).unwrap_or(u32::MAX);
                    t.strides[d] = stride.unwrap_or(fallback);
                    row_major = row_major.saturating_mul(u64::from(n.max(1)));
                }
                let (shape, stride) = (&t.shapes[..rank], &t.strides[..rank]);
                t.ndims = rank as u32;
                t.dtype = dtype;
                t.is_contiguous = u8::from(is_row_major(shape, stride));
                let extent = span_elems(shape, stride);
                t.extent_elems = u64::try_from(extent).unwrap_or(u64::MAX);
                t.addr = addr;
                t.start_offset = start_offset;
                let elem = DataType::from_u8(dtype).map_or(1, DataType::element_size);
                let needed = (u128::from(start_offset) + extent) * u128::from(elem);
                let size = needed.saturating_add_signed(i128::from(slack));
                t.size = u64::try_from(size).unwrap_or(u64::MAX);
                t.manual_dep = u8::from(flags);
                t.child_memory = u8::from(!flags);
                t
            })
    }

    /// Whether the used shape has a zero-length dimension (the one case the one-pass check
    /// leaves to the in-order checks even when the descriptor is valid).
    fn is_empty_view(t: &Tensor) -> bool {
        (1..=MAX_TENSOR_DIMS).contains(&(t.ndims as usize)) && t.shape().contains(&0)
    }

    /// Checks the two stages against each other and `validate` against the in-order checks.
    fn stages_agree(t: &Tensor) -> Result<(), TestCaseError> {
        let fast = is_well_formed(t);
        let in_order = first_violation(t);
        if is_empty_view(t) {
            prop_assert!(!fast, "the one-pass check accepted an empty view: {:?}", t);
        } else {
            prop_assert_eq!(fast, in_order.is_ok(), "descriptor {:?}: {:?}", t, in_order);
        }
        prop_assert_eq!(t.validate(), in_order);
        Ok(())
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn one_pass_check_agrees_with_in_order_checks(
            t in descriptor(),
            corruptions in proptest::collection::vec(corruption(), 0..3),
        ) {
            stages_agree(&t)?;
            let mut bad = t;
            for c in &corruptions {
                corrupt(&mut bad, c);
                stages_agree(&bad)?;
            }
        }
    }

    #[test]
    fn a_descriptor_whose_extent_does_not_fit_u64_is_refused_as_an_overflow_not_a_stale_cache() {
        // (2^32 - 1)^2 elements of one byte fit `u64`, but the strides spread them over about
        // 2^65 elements: no cached extent can match.
        let mut t = Tensor::zeroed();
        t.ndims = 2;
        t.dtype = DataType::Int8 as u8;
        t.shapes = [u32::MAX, u32::MAX, 0, 0, 0];
        t.strides = [u32::MAX, u32::MAX, 0, 0, 0];
        t.extent_elems = u64::MAX;
        let overflow = Err(TypesError::SizeOverflow { what: "extent" });
        assert_eq!(t.validate(), overflow);
        assert_eq!(Tensor::from_bytes(&t.to_bytes()).map(drop), overflow);
        assert!(!is_well_formed(&t));
    }

    #[test]
    fn an_empty_view_of_a_buffer_that_wraps_the_address_space_is_refused() {
        let wraps = Tensor::with_buffer(u64::MAX - 3, 64, &[0], DataType::Float32)
            .and_then(|t| t.validate().map(|()| t));
        assert_eq!(wraps, Err(TypesError::SizeOverflow { what: "buffer end address" }));
        // At address 0 (null) there is no buffer to wrap.
        assert!(Tensor::with_buffer(0, 64, &[0], DataType::Float32).unwrap().validate().is_ok());
    }

    #[test]
    fn one_pass_check_accepts_descriptors_built_by_the_api() {
        let base = Tensor::external(0x1000, &[8, 16, 32], DataType::Float16).unwrap();
        let views = [
            base,
            Tensor::external(0x1000, &[4096], DataType::Float32).unwrap(),
            Tensor::external(0, &[7, 1, 3], DataType::Int64).unwrap(),
            base.view(&[4, 8, 16], &[1, 2, 3]).unwrap(),
            base.view(&[1, 1, 1], &[7, 15, 31]).unwrap(),
            base.slice(2, 1, 32, 5).unwrap(),
            base.transpose(0, 2).unwrap(),
        ];
        for v in views {
            assert!(is_well_formed(&v), "{v:?}");
        }
        let empty = base.view(&[0, 16, 32], &[8, 0, 0]).unwrap();
        assert!(!is_well_formed(&empty));
        assert_eq!(empty.validate(), Ok(()));
    }
}
