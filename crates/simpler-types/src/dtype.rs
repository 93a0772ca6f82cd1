//! `DataType` and scalar packing (see `docs/types.md`).
//!
//! Scalars travel as `u64`. A value narrower than 8 bytes is stored as its own bit pattern in
//! the low bytes with the high bytes zero: no sign extension, so an `i32` of −1 becomes
//! `0x0000_0000_FFFF_FFFF`, and an `f32` keeps its IEEE bits in the low 32 bits. Kernels read
//! the low bytes of the slot with the width they expect, which is why the high bytes must be
//! predictable.

use std::fmt;
use std::str::FromStr;

use crate::error::TypesError;

/// Element type of a tensor. The wire values are frozen; new types may only be appended.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
#[non_exhaustive]
pub enum DataType {
    /// IEEE 754 binary32.
    Float32 = 0,
    /// IEEE 754 binary16.
    Float16 = 1,
    /// Signed 32-bit integer.
    Int32 = 2,
    /// Signed 16-bit integer.
    Int16 = 3,
    /// Signed 8-bit integer.
    Int8 = 4,
    /// Unsigned 8-bit integer.
    UInt8 = 5,
    /// bfloat16.
    BFloat16 = 6,
    /// Signed 64-bit integer.
    Int64 = 7,
    /// Unsigned 64-bit integer.
    UInt64 = 8,
    /// Unsigned 16-bit integer.
    UInt16 = 9,
    /// Unsigned 32-bit integer.
    UInt32 = 10,
    /// One byte, 0 or 1.
    Bool = 11,
}

impl DataType {
    /// Every data type in wire-value order.
    pub const ALL: [DataType; 12] = [
        DataType::Float32,
        DataType::Float16,
        DataType::Int32,
        DataType::Int16,
        DataType::Int8,
        DataType::UInt8,
        DataType::BFloat16,
        DataType::Int64,
        DataType::UInt64,
        DataType::UInt16,
        DataType::UInt32,
        DataType::Bool,
    ];

    /// Bytes per element; never 0.
    pub const fn element_size(self) -> u64 {
        match self {
            DataType::Int8 | DataType::UInt8 | DataType::Bool => 1,
            DataType::Float16 | DataType::BFloat16 | DataType::Int16 | DataType::UInt16 => 2,
            DataType::Float32 | DataType::Int32 | DataType::UInt32 => 4,
            DataType::Int64 | DataType::UInt64 => 8,
        }
    }

    /// The upper-case name: `FLOAT32`, `FLOAT16`, …, `BOOL`.
    pub const fn name(self) -> &'static str {
        match self {
            DataType::Float32 => "FLOAT32",
            DataType::Float16 => "FLOAT16",
            DataType::Int32 => "INT32",
            DataType::Int16 => "INT16",
            DataType::Int8 => "INT8",
            DataType::UInt8 => "UINT8",
            DataType::BFloat16 => "BFLOAT16",
            DataType::Int64 => "INT64",
            DataType::UInt64 => "UINT64",
            DataType::UInt16 => "UINT16",
            DataType::UInt32 => "UINT32",
            DataType::Bool => "BOOL",
        }
    }

    /// The wire value.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// Decodes a wire value; `None` for an unknown byte. `TryFrom<u8>` is the erroring form.
    pub const fn from_u8(v: u8) -> Option<DataType> {
        if (v as usize) < DataType::ALL.len() { Some(DataType::ALL[v as usize]) } else { None }
    }
}

impl TryFrom<u8> for DataType {
    type Error = TypesError;

    fn try_from(v: u8) -> Result<DataType, TypesError> {
        DataType::from_u8(v).ok_or(TypesError::UnknownDataType(v))
    }
}

impl From<DataType> for u8 {
    fn from(d: DataType) -> u8 {
        d.as_u8()
    }
}

/// Parses the names returned by [`DataType::name`]. Matching ignores ASCII case so that
/// command-line and config-file input such as `float16` is accepted.
impl FromStr for DataType {
    type Err = TypesError;

    fn from_str(s: &str) -> Result<DataType, TypesError> {
        DataType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| TypesError::UnknownDataTypeName(s.to_owned()))
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    /// The packing rule behind [`super::Scalar`]; private so the set of scalar types is closed.
    pub trait Sealed: Copy {
        fn pack(self) -> u64;
        fn unpack(bits: u64) -> Self;
    }
}

/// A Rust type that can travel in a `u64` scalar slot (see `docs/types.md`).
///
/// Implemented for `f32, f64, i8, i16, i32, i64, u8, u16, u32, u64, bool`; sealed, because the
/// packing rule is part of the kernel ABI.
pub trait Scalar: sealed::Sealed {}

macro_rules! scalar_int {
    ($($t:ty => $u:ty),* $(,)?) => {$(
        impl sealed::Sealed for $t {
            fn pack(self) -> u64 {
                // Reinterpret as the unsigned type of the same width first, so that widening
                // zero-fills the high bytes instead of sign-extending.
                u64::from(self as $u)
            }
            fn unpack(bits: u64) -> Self {
                // Truncation to the low bytes is the documented rule.
                bits as $u as $t
            }
        }
        impl Scalar for $t {}
    )*};
}

scalar_int!(i8 => u8, i16 => u16, i32 => u32, i64 => u64, u8 => u8, u16 => u16, u32 => u32, u64 => u64);

impl sealed::Sealed for f32 {
    fn pack(self) -> u64 {
        u64::from(self.to_bits())
    }
    fn unpack(bits: u64) -> Self {
        f32::from_bits(bits as u32)
    }
}
impl Scalar for f32 {}

impl sealed::Sealed for f64 {
    fn pack(self) -> u64 {
        self.to_bits()
    }
    fn unpack(bits: u64) -> Self {
        f64::from_bits(bits)
    }
}
impl Scalar for f64 {}

impl sealed::Sealed for bool {
    fn pack(self) -> u64 {
        u64::from(self)
    }
    /// Any non-zero low byte reads as `true`, matching how a C kernel tests a `bool`.
    fn unpack(bits: u64) -> Self {
        bits as u8 != 0
    }
}
impl Scalar for bool {}

/// Packs `v` into a scalar slot: own bit pattern in the low bytes, high bytes zero.
pub fn to_scalar<T: Scalar>(v: T) -> u64 {
    v.pack()
}

/// Reads a scalar slot as `T` from its low `size_of::<T>()` bytes (a `bool` is true when its
/// low byte is non-zero).
pub fn from_scalar<T: Scalar>(bits: u64) -> T {
    T::unpack(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values_sizes_and_names() {
        let expect = [
            (0, 4, "FLOAT32"),
            (1, 2, "FLOAT16"),
            (2, 4, "INT32"),
            (3, 2, "INT16"),
            (4, 1, "INT8"),
            (5, 1, "UINT8"),
            (6, 2, "BFLOAT16"),
            (7, 8, "INT64"),
            (8, 8, "UINT64"),
            (9, 2, "UINT16"),
            (10, 4, "UINT32"),
            (11, 1, "BOOL"),
        ];
        for (code, size, name) in expect {
            let d = DataType::try_from(code).unwrap();
            assert_eq!((d.as_u8(), d.element_size(), d.name()), (code, size, name));
            assert_eq!(name.parse::<DataType>(), Ok(d));
            assert_eq!(name.to_ascii_lowercase().parse::<DataType>(), Ok(d));
        }
        assert_eq!(DataType::try_from(12), Err(TypesError::UnknownDataType(12)));
        assert_eq!(
            "FLOAT64".parse::<DataType>(),
            Err(TypesError::UnknownDataTypeName("FLOAT64".into()))
        );
    }

    #[test]
    fn scalar_packing_zero_fills_high_bytes() {
        assert_eq!(to_scalar(-1i32), 0xFFFF_FFFF);
        assert_eq!(to_scalar(-1i8), 0xFF);
        assert_eq!(to_scalar(-2i16), 0xFFFE);
        assert_eq!(to_scalar(-1i64), u64::MAX);
        assert_eq!(to_scalar(1.5f32), 0x3FC0_0000);
        assert_eq!(to_scalar(1.5f64), 1.5f64.to_bits());
        assert_eq!((to_scalar(true), to_scalar(false)), (1, 0));
        assert_eq!(from_scalar::<f32>(to_scalar(1.5f32)), 1.5);
        assert_eq!(from_scalar::<i32>(to_scalar(-7i32)), -7);
        assert_eq!(from_scalar::<i16>(0xDEAD_0000_0000_FFFF), -1);
        assert_eq!(from_scalar::<u8>(0x1234), 0x34);
        assert!(from_scalar::<bool>(0x100_0001));
        assert!(!from_scalar::<bool>(0x100));
    }
}
