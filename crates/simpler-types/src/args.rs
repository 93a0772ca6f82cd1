//! Task-argument builders, their borrowed view, and the encoded blob (see `docs/types.md`).
//!
//! [`Args`] holds three parallel lists: tensors, one access tag per tensor, and `u64` scalars.
//! The two aliases differ only in their caps: [`TaskArgs`] (L3+ members and chip entry calls,
//! 128 tensors / 128 scalars) and [`CoreArgs`] (one AICore kernel task, 32 / 16).
//!
//! Storage is inline for up to [`INLINE_TENSORS`] tensors and [`INLINE_SCALARS`] scalars, so
//! building the arguments of a small task allocates nothing; the engine takes `TaskArgs` by value
//! and has a zero-allocations-per-task target. Larger argument lists spill to the heap once.
//!
//! Caps and the "tensors before scalars" rule are checked when an argument is added (decision:
//! the original checked the caps only when a child converted the arguments), and a failed `add_*`
//! leaves the builder unchanged. Tags travel with their tensors from submit to the chip entry:
//! the orchestrator reads them to order tasks, and [`Args::view`] (the one borrowed form every
//! endpoint, host closure and chip orchestration receives) carries them, so a callable sees the
//! tags its caller passed at every level. Only the blob does not carry them.
//!
//! Blob layout (little-endian): `[i32 T][i32 S][T × 128-byte Tensor][S × u64]`, total
//! `8 + 128·T + 8·S` bytes. Tensors in a blob are only 8-byte aligned, so the decoder copies each
//! one out. The decoder ignores bytes after the encoded length, because a blob usually sits in a
//! fixed-size mailbox.

use smallvec::SmallVec;

use crate::constants::{
    ARGS_BLOB_HEADER, CHIP_MAX_SCALAR_ARGS, CHIP_MAX_TENSOR_ARGS, CORE_MAX_SCALAR_ARGS,
    CORE_MAX_TENSOR_ARGS, TENSOR_DESC_SIZE,
};
use crate::dtype::{Scalar, from_scalar, to_scalar};
use crate::error::TypesError;
use crate::tag::TensorArgType;
use crate::tensor::Tensor;

/// Tensors (and tags) stored inline before an [`Args`] allocates.
pub const INLINE_TENSORS: usize = 4;
/// Scalars stored inline before an [`Args`] allocates.
pub const INLINE_SCALARS: usize = 4;

/// Arguments of one L3+ task member or chip entry call: at most 128 tensors and 128 scalars.
pub type TaskArgs = Args<CHIP_MAX_TENSOR_ARGS, CHIP_MAX_SCALAR_ARGS>;
/// The arguments of a chip entry call; the same type as [`TaskArgs`].
pub type ChipTaskArgs = TaskArgs;
/// Arguments of one AICore kernel task: at most 32 tensors and 16 scalars.
pub type CoreArgs = Args<CORE_MAX_TENSOR_ARGS, CORE_MAX_SCALAR_ARGS>;

/// A task-argument builder capped at `MAX_T` tensors and `MAX_S` scalars.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct Args<const MAX_T: usize, const MAX_S: usize> {
    tensors: SmallVec<[Tensor; INLINE_TENSORS]>,
    tags: SmallVec<[TensorArgType; INLINE_TENSORS]>,
    scalars: SmallVec<[u64; INLINE_SCALARS]>,
}

impl<const MAX_T: usize, const MAX_S: usize> Args<MAX_T, MAX_S> {
    /// Most tensors this kind of argument list accepts.
    pub const MAX_TENSORS: usize = MAX_T;
    /// Most scalars this kind of argument list accepts.
    pub const MAX_SCALARS: usize = MAX_S;

    /// An empty argument list; allocates nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tensor with its access tag.
    ///
    /// Fails with `TensorAfterScalar` once a scalar was added and with `TooManyTensors` at the
    /// cap; on failure the builder is unchanged.
    pub fn add_tensor(&mut self, t: Tensor, tag: TensorArgType) -> Result<&mut Self, TypesError> {
        if !self.scalars.is_empty() {
            return Err(TypesError::TensorAfterScalar { scalars: self.scalars.len() });
        }
        if self.tensors.len() >= MAX_T {
            return Err(TypesError::TooManyTensors { count: MAX_T + 1, cap: MAX_T });
        }
        self.tensors.push(t);
        self.tags.push(tag);
        Ok(self)
    }

    /// Adds a tensor the task reads ([`TensorArgType::Input`]).
    pub fn add_input(&mut self, t: Tensor) -> Result<&mut Self, TypesError> {
        self.add_tensor(t, TensorArgType::Input)
    }

    /// Adds a tensor the task overwrites ([`TensorArgType::Output`]).
    pub fn add_output(&mut self, t: Tensor) -> Result<&mut Self, TypesError> {
        self.add_tensor(t, TensorArgType::Output)
    }

    /// Adds a tensor the task updates in place ([`TensorArgType::InOut`]).
    pub fn add_inout(&mut self, t: Tensor) -> Result<&mut Self, TypesError> {
        self.add_tensor(t, TensorArgType::InOut)
    }

    /// Adds an existing buffer the task overwrites without ordering against its previous writer
    /// ([`TensorArgType::OutputExisting`]).
    pub fn add_output_existing(&mut self, t: Tensor) -> Result<&mut Self, TypesError> {
        self.add_tensor(t, TensorArgType::OutputExisting)
    }

    /// Adds a tensor the runtime does not track ([`TensorArgType::NoDep`]).
    pub fn add_no_dep(&mut self, t: Tensor) -> Result<&mut Self, TypesError> {
        self.add_tensor(t, TensorArgType::NoDep)
    }

    /// Adds a raw scalar slot. Fails with `TooManyScalars` at the cap, leaving the builder
    /// unchanged.
    pub fn add_scalar(&mut self, v: u64) -> Result<&mut Self, TypesError> {
        if self.scalars.len() >= MAX_S {
            return Err(TypesError::TooManyScalars { count: MAX_S + 1, cap: MAX_S });
        }
        self.scalars.push(v);
        Ok(self)
    }

    /// Adds a typed scalar, packed by [`to_scalar`].
    pub fn add_scalar_of<T: Scalar>(&mut self, v: T) -> Result<&mut Self, TypesError> {
        self.add_scalar(to_scalar(v))
    }

    /// Empties all three lists and keeps their capacity.
    pub fn clear(&mut self) {
        self.tensors.clear();
        self.tags.clear();
        self.scalars.clear();
    }

    /// The tensors, in the order added.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The tensors, mutably. The count cannot change through this; it exists so that a layer
    /// which moves buffers (for example from host to device memory) can rewrite descriptors in
    /// place.
    pub fn tensors_mut(&mut self) -> &mut [Tensor] {
        &mut self.tensors
    }

    /// One access tag per tensor.
    pub fn tags(&self) -> &[TensorArgType] {
        &self.tags
    }

    /// The scalar slots.
    pub fn scalars(&self) -> &[u64] {
        &self.scalars
    }

    /// Whether no tensor and no scalar was added.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty() && self.scalars.is_empty()
    }

    /// Whether the lists currently live inline (no heap allocation).
    pub fn is_inline(&self) -> bool {
        !self.tensors.spilled() && !self.tags.spilled() && !self.scalars.spilled()
    }

    /// The borrowed view: tensors with their tags, and scalars.
    pub fn view(&self) -> TaskArgsView<'_> {
        TaskArgsView { tensors: &self.tensors, tags: &self.tags, scalars: &self.scalars }
    }

    /// Replaces the contents with a copy of `view` (tags included), keeping capacity.
    ///
    /// Fails like the `add_*` calls (`TooManyTensors`, `TooManyScalars`, and
    /// `MissingTags` when the view has fewer tags than tensors); on failure the builder is
    /// empty.
    pub fn assign(&mut self, view: TaskArgsView<'_>) -> Result<&mut Self, TypesError> {
        self.clear();
        let checked = if view.tags.len() != view.tensors.len() {
            Err(TypesError::MissingTags { tensors: view.tensors.len(), tags: view.tags.len() })
        } else if view.tensors.len() > MAX_T {
            Err(TypesError::TooManyTensors { count: view.tensors.len(), cap: MAX_T })
        } else if view.scalars.len() > MAX_S {
            Err(TypesError::TooManyScalars { count: view.scalars.len(), cap: MAX_S })
        } else {
            Ok(())
        };
        checked?;
        self.tensors.extend_from_slice(view.tensors);
        self.tags.extend_from_slice(view.tags);
        self.scalars.extend_from_slice(view.scalars);
        Ok(self)
    }

    /// An owned copy of `view`; see [`assign`](Self::assign).
    pub fn from_view(view: TaskArgsView<'_>) -> Result<Self, TypesError> {
        let mut a = Self::default();
        a.assign(view)?;
        Ok(a)
    }

    /// Length of the encoded blob: `8 + 128·T + 8·S`.
    pub fn encoded_len(&self) -> usize {
        ARGS_BLOB_HEADER + TENSOR_DESC_SIZE * self.tensors.len() + 8 * self.scalars.len()
    }

    /// Encodes into the front of `out` and returns the number of bytes written.
    ///
    /// Descriptors are written as they are, unvalidated (neither the builders nor this call
    /// validate them; submit and [`decode`](Self::decode) do), so a blob with a descriptor
    /// [`Tensor::validate`] refuses does not decode: validate first where that matters.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize, TypesError> {
        let needed = self.encoded_len();
        let Some(out) = out.get_mut(..needed) else {
            return Err(TypesError::BlobTooSmall { needed, capacity: out.len() });
        };
        // Counts are at most the caps, which `add_*` keeps far below `i32::MAX`.
        let (t, s) = (self.tensors.len() as i32, self.scalars.len() as i32);
        out[0..4].copy_from_slice(&t.to_le_bytes());
        out[4..8].copy_from_slice(&s.to_le_bytes());
        let (tensor_bytes, scalar_bytes) =
            out[ARGS_BLOB_HEADER..].split_at_mut(TENSOR_DESC_SIZE * self.tensors.len());
        for (chunk, t) in tensor_bytes.chunks_exact_mut(TENSOR_DESC_SIZE).zip(&self.tensors) {
            chunk.copy_from_slice(&t.to_bytes());
        }
        for (chunk, v) in scalar_bytes.chunks_exact_mut(8).zip(&self.scalars) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        Ok(needed)
    }

    /// Encodes into a new vector of exactly [`Args::encoded_len`] bytes; descriptors
    /// unvalidated, as [`encode_into`](Self::encode_into) says.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.encoded_len()];
        // The buffer has exactly the needed length, so encoding cannot fail.
        let written = self.encode_into(&mut out);
        debug_assert_eq!(written, Ok(out.len()), "encode_into rejected an exact-size buffer");
        out
    }

    /// Decodes a blob and validates every tensor. Decoded tensors get tag `Input`.
    ///
    /// Errors: `BlobTruncated`, `BlobNegativeCount`, `TooManyTensors`/`TooManyScalars` when the
    /// counts exceed this type's caps, and `BlobTensor { index, .. }` for an invalid tensor.
    pub fn decode(bytes: &[u8]) -> Result<Self, TypesError> {
        let Some((header, body)) = bytes.split_first_chunk::<ARGS_BLOB_HEADER>() else {
            return Err(TypesError::BlobTruncated {
                needed: ARGS_BLOB_HEADER,
                capacity: bytes.len(),
            });
        };
        let tensors = i32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let scalars = i32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let (Ok(t), Ok(s)) = (usize::try_from(tensors), usize::try_from(scalars)) else {
            return Err(TypesError::BlobNegativeCount { tensors, scalars });
        };
        if t > MAX_T {
            return Err(TypesError::TooManyTensors { count: t, cap: MAX_T });
        }
        if s > MAX_S {
            return Err(TypesError::TooManyScalars { count: s, cap: MAX_S });
        }
        let tensor_len = TENSOR_DESC_SIZE * t;
        let needed = ARGS_BLOB_HEADER + tensor_len + 8 * s;
        if bytes.len() < needed {
            return Err(TypesError::BlobTruncated { needed, capacity: bytes.len() });
        }
        let mut args = Self::default();
        for (index, chunk) in body[..tensor_len].chunks_exact(TENSOR_DESC_SIZE).enumerate() {
            let tensor = chunk
                .try_into()
                .map_err(|_| TypesError::BlobTruncated { needed, capacity: bytes.len() })
                .and_then(Tensor::from_bytes)
                .map_err(|e| TypesError::BlobTensor { index, source: Box::new(e) })?;
            args.tensors.push(tensor);
            args.tags.push(TensorArgType::Input);
        }
        for chunk in body[tensor_len..tensor_len + 8 * s].chunks_exact(8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            args.scalars.push(u64::from_le_bytes(word));
        }
        Ok(args)
    }
}

/// Borrowed view of a task's arguments — tensors with their access tags, and scalars — as
/// endpoints, host closures, graph callbacks and chip orchestrations see them.
///
/// `tags[i]` is the tag tensor `i` was submitted with; a view built by [`Args::view`] always
/// has one tag per tensor.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct TaskArgsView<'a> {
    /// The tensors, in the order added.
    pub tensors: &'a [Tensor],
    /// One access tag per tensor.
    pub tags: &'a [TensorArgType],
    /// The scalar slots.
    pub scalars: &'a [u64],
}

impl<'a> TaskArgsView<'a> {
    /// A view with no arguments.
    pub const EMPTY: TaskArgsView<'static> = TaskArgsView { tensors: &[], tags: &[], scalars: &[] };

    /// Tensor `i`, or `None` past the end.
    pub fn tensor(&self, i: usize) -> Option<&'a Tensor> {
        self.tensors.get(i)
    }

    /// The tag of tensor `i`, or `None` past the end.
    pub fn tag(&self, i: usize) -> Option<TensorArgType> {
        self.tags.get(i).copied()
    }

    /// Raw scalar slot `i`, or `None` past the end.
    pub fn scalar(&self, i: usize) -> Option<u64> {
        self.scalars.get(i).copied()
    }

    /// Scalar slot `i` read as `T` (see [`from_scalar`]), or `None` past the end.
    pub fn scalar_of<T: Scalar>(&self, i: usize) -> Option<T> {
        self.scalar(i).map(from_scalar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DataType;

    fn tensor(addr: u64) -> Tensor {
        Tensor::external(addr, &[4], DataType::Int32).unwrap()
    }

    #[test]
    fn small_args_stay_inline_and_clear_keeps_capacity() {
        let mut a = TaskArgs::new();
        a.add_input(tensor(0x100)).unwrap().add_output(tensor(0x200)).unwrap();
        a.add_scalar_of(-1i32).unwrap().add_scalar(7).unwrap();
        assert!(a.is_inline());
        assert_eq!(a.tags(), &[TensorArgType::Input, TensorArgType::Output]);
        assert_eq!(a.view().scalar_of::<i32>(0), Some(-1));
        for i in 0..10 {
            a.add_scalar(i).unwrap();
        }
        assert!(!a.is_inline());
        a.clear();
        assert!(a.is_empty());
        // Capacity survives the clear, so the next fill does not allocate again.
        assert!(!a.is_inline());
    }

    #[test]
    fn a_view_carries_tags_and_copies_back_into_a_builder() {
        let mut a = TaskArgs::new();
        a.add_output(tensor(0x100)).unwrap().add_no_dep(tensor(0x200)).unwrap();
        a.add_scalar(9).unwrap();
        let v = a.view();
        assert_eq!(v.tag(1), Some(TensorArgType::NoDep));
        assert_eq!(v.tag(2), None);
        assert_eq!(TaskArgs::from_view(v).unwrap(), a);
        let short = TaskArgsView { tags: &v.tags[..1], ..v };
        let mut b = a.clone();
        assert_eq!(
            b.assign(short).map(|_| ()),
            Err(TypesError::MissingTags { tensors: 2, tags: 1 })
        );
        assert!(b.is_empty());
        assert_eq!(
            CoreArgs::from_view(TaskArgsView { scalars: &[0; 17], ..TaskArgsView::EMPTY }),
            Err(TypesError::TooManyScalars { count: 17, cap: 16 })
        );
    }

    #[test]
    fn encode_layout_is_header_tensors_scalars() {
        let mut a = CoreArgs::new();
        a.add_inout(tensor(0x100)).unwrap().add_scalar(0x0102_0304_0506_0708).unwrap();
        let blob = a.encode();
        assert_eq!(blob.len(), 8 + 128 + 8);
        assert_eq!(&blob[..8], &[1, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(&blob[8..136], &tensor(0x100).to_bytes());
        assert_eq!(&blob[136..], &[8, 7, 6, 5, 4, 3, 2, 1]);
        let back = CoreArgs::decode(&blob).unwrap();
        assert_eq!(back.tags(), &[TensorArgType::Input]);
        assert_eq!((back.tensors(), back.scalars()), (a.tensors(), a.scalars()));
        let mut small = [0u8; 100];
        assert_eq!(
            a.encode_into(&mut small),
            Err(TypesError::BlobTooSmall { needed: 144, capacity: 100 })
        );
    }

    #[test]
    fn decode_rejects_bad_headers_and_tensors() {
        let mut blob = vec![0u8; 8];
        blob[0..4].copy_from_slice(&(-1i32).to_le_bytes());
        assert_eq!(
            TaskArgs::decode(&blob),
            Err(TypesError::BlobNegativeCount { tensors: -1, scalars: 0 })
        );
        blob[0..4].copy_from_slice(&33i32.to_le_bytes());
        assert_eq!(CoreArgs::decode(&blob), Err(TypesError::TooManyTensors { count: 33, cap: 32 }));
        blob[0..4].copy_from_slice(&0i32.to_le_bytes());
        blob[4..8].copy_from_slice(&17i32.to_le_bytes());
        assert_eq!(CoreArgs::decode(&blob), Err(TypesError::TooManyScalars { count: 17, cap: 16 }));

        let mut a = TaskArgs::new();
        a.add_input(tensor(0x100)).unwrap().add_input(tensor(0x200)).unwrap();
        let mut blob = a.encode();
        blob[8 + 128 + 40] = 99; // dtype byte of tensor 1
        assert_eq!(
            TaskArgs::decode(&blob),
            Err(TypesError::BlobTensor {
                index: 1,
                source: Box::new(TypesError::UnknownDataType(99))
            })
        );
    }
}
