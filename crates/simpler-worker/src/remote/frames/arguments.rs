//! Why a task's arguments did not unpack, on the wire: a code and its numeric fields
//! (`docs/multi-host.md` §"Frames"). A tensor's broken rule crosses as the code of its
//! `TypesError` variant, and the names that variant holds as indices into fixed tables.

use simpler_types::TypesError;

use super::{DecodeError, Reader, WireField, Writer};
use crate::remote::error::ArgumentsProblem;

/// The quantities `TypesError::SizeOverflow` names.
const OVERFLOWS: [&str; 5] =
    ["byte size", "buffer end address", "stride", "start offset", "extent"];
/// The fields `TypesError::UnusedDimNonZero` names.
const DIM_FIELDS: [&str; 2] = ["shapes", "strides"];
/// The caches `TypesError::StaleLayoutCache` names.
const CACHES: [&str; 2] = ["is_contiguous", "extent_elems"];

/// Whether the frame format has a code for `e`: the variants `Tensor::validate` returns, with
/// the names they hold today.
pub(crate) fn carries(e: &TypesError) -> bool {
    match e {
        TypesError::SizeOverflow { what } => index(&OVERFLOWS, what).is_some(),
        TypesError::UnusedDimNonZero { field, .. } => index(&DIM_FIELDS, field).is_some(),
        TypesError::StaleLayoutCache { field, .. } => index(&CACHES, field).is_some(),
        TypesError::InvalidRank { .. }
        | TypesError::UnknownDataType(_)
        | TypesError::InvalidFlag { .. }
        | TypesError::ZeroStride { .. }
        | TypesError::ViewOutOfBounds { .. } => true,
        _ => false,
    }
}

fn index(table: &[&str], name: &str) -> Option<u8> {
    table.iter().position(|n| *n == name).map(|i| i as u8)
}

impl Writer {
    pub(super) fn arguments_problem(&mut self, p: &ArgumentsProblem) {
        match p {
            ArgumentsProblem::NoBuffer { tensor } => {
                self.u8(0);
                self.u32(*tensor);
            }
            ArgumentsProblem::NoSuchBuffer { tensor, buffer, buffers } => {
                self.u8(1);
                self.u32(*tensor);
                self.u32(*buffer);
                self.u32(*buffers);
            }
            ArgumentsProblem::OutsideBuffer { tensor, buffer, offset, size, len } => {
                self.u8(2);
                self.u32(*tensor);
                self.u32(*buffer);
                self.u64(*offset);
                self.u64(*size);
                self.u64(*len);
            }
            ArgumentsProblem::NoSpan { tensor, buffer, len } => {
                self.u8(3);
                self.u32(*tensor);
                self.u32(*buffer);
                self.u64(*len);
            }
            ArgumentsProblem::OutputsTooLarge { bytes, limit } => {
                self.u8(4);
                self.u64(*bytes);
                self.u64(*limit);
            }
            ArgumentsProblem::BufferBytes { buffer, carried, len } => {
                self.u8(5);
                self.u32(*buffer);
                self.u64(*carried);
                self.u64(*len);
            }
            ArgumentsProblem::EmptyBuffer { buffer } => {
                self.u8(6);
                self.u32(*buffer);
            }
            ArgumentsProblem::Allocation { buffer, len } => {
                self.u8(7);
                self.u32(*buffer);
                self.u64(*len);
            }
            ArgumentsProblem::InvalidTensor { tensor, error } => {
                self.u8(8);
                self.u32(*tensor);
                match error.as_deref().filter(|e| carries(e)) {
                    Some(e) => {
                        self.u8(1);
                        self.types_error(e);
                    }
                    None => self.u8(0),
                }
            }
            ArgumentsProblem::TooManyTensors { count, cap } => {
                self.u8(9);
                self.u32(*count);
                self.u32(*cap);
            }
            ArgumentsProblem::TooManyScalars { count, cap } => {
                self.u8(10);
                self.u32(*count);
                self.u32(*cap);
            }
            ArgumentsProblem::NotWrittenBack { buffer, len, cap } => {
                self.u8(11);
                self.u32(*buffer);
                self.u64(*len);
                self.u64(*cap);
            }
        }
    }

    /// A rule `carries` has a code for (any other is never passed).
    fn types_error(&mut self, e: &TypesError) {
        let name = |table: &[&str], n: &str| index(table, n).unwrap_or(u8::MAX);
        match e {
            TypesError::InvalidRank { ndims } => {
                self.u8(0);
                self.u64(*ndims);
            }
            TypesError::UnknownDataType(code) => {
                self.u8(1);
                self.u8(*code);
            }
            TypesError::InvalidFlag { offset, value } => {
                self.u8(2);
                self.u64(*offset as u64);
                self.u8(*value);
            }
            TypesError::ZeroStride { dim } => {
                self.u8(3);
                self.u64(*dim as u64);
            }
            TypesError::UnusedDimNonZero { field, dim, value } => {
                self.u8(4);
                self.u8(name(&DIM_FIELDS, field));
                self.u64(*dim as u64);
                self.u32(*value);
            }
            TypesError::SizeOverflow { what } => {
                self.u8(5);
                self.u8(name(&OVERFLOWS, what));
            }
            TypesError::StaleLayoutCache { field, stored, computed } => {
                self.u8(6);
                self.u8(name(&CACHES, field));
                self.u64(*stored);
                self.u64(*computed);
            }
            TypesError::ViewOutOfBounds { needed_bytes, buffer_bytes } => {
                self.u8(7);
                self.u64(*needed_bytes as u64);
                self.u64((*needed_bytes >> 64) as u64);
                self.u64(*buffer_bytes);
            }
            // `carries` refused it: the writer never gets here.
            _ => self.u8(u8::MAX),
        }
    }
}

impl Reader<'_> {
    pub(super) fn arguments_problem(&mut self) -> Result<ArgumentsProblem, DecodeError> {
        let code = self.code(WireField::ArgumentsProblem, |c| (c <= 11).then_some(c))?;
        Ok(match code {
            0 => ArgumentsProblem::NoBuffer { tensor: self.u32()? },
            1 => ArgumentsProblem::NoSuchBuffer {
                tensor: self.u32()?,
                buffer: self.u32()?,
                buffers: self.u32()?,
            },
            2 => ArgumentsProblem::OutsideBuffer {
                tensor: self.u32()?,
                buffer: self.u32()?,
                offset: self.u64()?,
                size: self.u64()?,
                len: self.u64()?,
            },
            3 => ArgumentsProblem::NoSpan {
                tensor: self.u32()?,
                buffer: self.u32()?,
                len: self.u64()?,
            },
            4 => ArgumentsProblem::OutputsTooLarge { bytes: self.u64()?, limit: self.u64()? },
            5 => ArgumentsProblem::BufferBytes {
                buffer: self.u32()?,
                carried: self.u64()?,
                len: self.u64()?,
            },
            6 => ArgumentsProblem::EmptyBuffer { buffer: self.u32()? },
            7 => ArgumentsProblem::Allocation { buffer: self.u32()?, len: self.u64()? },
            8 => {
                let tensor = self.u32()?;
                let error = if self.flag()? { Some(Box::new(self.types_error()?)) } else { None };
                ArgumentsProblem::InvalidTensor { tensor, error }
            }
            9 => ArgumentsProblem::TooManyTensors { count: self.u32()?, cap: self.u32()? },
            10 => ArgumentsProblem::TooManyScalars { count: self.u32()?, cap: self.u32()? },
            _ => ArgumentsProblem::NotWrittenBack {
                buffer: self.u32()?,
                len: self.u64()?,
                cap: self.u64()?,
            },
        })
    }

    fn types_error(&mut self) -> Result<TypesError, DecodeError> {
        let name = |r: &mut Self, table: &'static [&'static str]| {
            r.code(WireField::TensorQuantity, |c| table.get(usize::from(c)).copied())
        };
        Ok(match self.code(WireField::TensorRule, |c| (c <= 7).then_some(c))? {
            0 => TypesError::InvalidRank { ndims: self.u64()? },
            1 => TypesError::UnknownDataType(self.u8()?),
            2 => TypesError::InvalidFlag { offset: self.u64()? as usize, value: self.u8()? },
            3 => TypesError::ZeroStride { dim: self.u64()? as usize },
            4 => TypesError::UnusedDimNonZero {
                field: name(self, &DIM_FIELDS)?,
                dim: self.u64()? as usize,
                value: self.u32()?,
            },
            5 => TypesError::SizeOverflow { what: name(self, &OVERFLOWS)? },
            6 => TypesError::StaleLayoutCache {
                field: name(self, &CACHES)?,
                stored: self.u64()?,
                computed: self.u64()?,
            },
            _ => {
                let low = u128::from(self.u64()?);
                let high = u128::from(self.u64()?);
                TypesError::ViewOutOfBounds {
                    needed_bytes: high << 64 | low,
                    buffer_bytes: self.u64()?,
                }
            }
        })
    }
}
