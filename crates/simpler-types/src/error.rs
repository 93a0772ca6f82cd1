//! `TypesError`: every way a constructor or validator in this crate can refuse its input
//! (see `docs/types.md`).
//!
//! Each variant carries the values the caller needs to see what was wrong without a debugger:
//! the offending number, the limit it broke, the dimension or argument index.

/// Errors returned by the constructors and validators of `simpler-types`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TypesError {
    // ----- DataType -----
    /// A byte is not the wire value of any [`crate::DataType`].
    #[error("unknown data type code {0} (known codes are 0..=11)")]
    UnknownDataType(u8),
    /// A string is not the name of any [`crate::DataType`] (in any case): the string as given,
    /// since an unknown name has no typed form.
    #[error(
        "unknown data type name {0:?} (expected a name such as FLOAT32 or BFLOAT16, in any case)"
    )]
    UnknownDataTypeName(String),

    // ----- Tensor construction, views and validation -----
    /// A descriptor needs 1..=5 dimensions.
    #[error("tensor rank {ndims} is invalid: a descriptor carries 1..=5 dimensions")]
    InvalidRank {
        /// The rank that was given or decoded.
        ndims: u64,
    },
    /// An element count, byte size, stride or offset does not fit its field.
    #[error("tensor {what} overflows its field")]
    SizeOverflow {
        /// Which quantity overflowed (for example "byte size" or "stride of dim 0").
        what: &'static str,
    },
    /// A view reaches past the end of its backing buffer (the view-fits rule, `docs/types.md`).
    #[error("tensor view needs {needed_bytes} bytes but its buffer has {buffer_bytes}")]
    ViewOutOfBounds {
        /// `(start_offset + extent) × element_size`, computed without overflow.
        needed_bytes: u128,
        /// The descriptor's `size` field.
        buffer_bytes: u64,
    },
    /// A view window leaves the parent view along one dimension.
    #[error(
        "view window [{offset}, {offset} + {len}) leaves dimension {dim} of length {parent_len}"
    )]
    ViewOutsideParent {
        /// The dimension.
        dim: usize,
        /// Requested offset along `dim`.
        offset: u32,
        /// Requested length along `dim`.
        len: u32,
        /// The parent's length along `dim`.
        parent_len: u32,
    },
    /// An operation was given a shape or offset list of the wrong rank.
    #[error("expected {expected} dimensions, got {got}")]
    RankMismatch {
        /// The tensor's rank.
        expected: u64,
        /// The length that was passed.
        got: u64,
    },
    /// A dimension index is not below the tensor's rank.
    #[error("dimension {dim} is out of range for a tensor of rank {ndims}")]
    DimOutOfRange {
        /// The dimension that was named.
        dim: usize,
        /// The tensor's rank.
        ndims: u32,
    },
    /// A slice needs `step ≥ 1` and `start < end ≤ len`.
    #[error(
        "invalid slice {start}..{end} step {step} of dimension {dim} with length {len} \
         (need step >= 1 and start < end <= length)"
    )]
    InvalidSlice {
        /// The sliced dimension.
        dim: usize,
        /// First index.
        start: u32,
        /// One past the last index.
        end: u32,
        /// Step between taken indices.
        step: u32,
        /// Length of the dimension before slicing.
        len: u32,
    },
    /// A dimension order is not a permutation of `0..ndims`.
    #[error("{order:?} is not a permutation of the {ndims} dimensions")]
    InvalidPermutation {
        /// The order that was given.
        order: Vec<usize>,
        /// The tensor's rank.
        ndims: u32,
    },
    /// `reshape` needs a contiguous view.
    #[error("reshape needs a contiguous view; this view is strided")]
    NotContiguous,
    /// `reshape` must keep the element count.
    #[error("cannot reshape {from_numel} elements into {to_numel}")]
    ReshapeMismatch {
        /// Elements of the source view.
        from_numel: u64,
        /// Elements of the requested shape.
        to_numel: u64,
    },
    /// A byte that must be 0 or 1 holds something else.
    #[error("descriptor byte at offset {offset} holds {value}; only 0 or 1 is allowed")]
    InvalidFlag {
        /// Byte offset in the 128-byte descriptor.
        offset: usize,
        /// The value found.
        value: u8,
    },
    /// A used dimension has stride 0.
    #[error("dimension {dim} has stride 0; used dimensions need a positive stride")]
    ZeroStride {
        /// The dimension.
        dim: usize,
    },
    /// A shape or stride entry at or beyond `ndims` is not zero.
    #[error("unused {field} entry {dim} holds {value}; entries at or beyond ndims must be 0")]
    UnusedDimNonZero {
        /// `"shapes"` or `"strides"`.
        field: &'static str,
        /// The entry index.
        dim: usize,
        /// The value found.
        value: u32,
    },
    /// A cached layout field disagrees with the shapes and strides it summarises.
    #[error("cached {field} is {stored} but the shapes and strides give {computed}")]
    StaleLayoutCache {
        /// `"is_contiguous"` or `"extent_elems"`.
        field: &'static str,
        /// The cached value.
        stored: u64,
        /// The value recomputed from shapes and strides.
        computed: u64,
    },

    // ----- Task-argument builders -----
    /// Tensors must all precede the first scalar.
    #[error("cannot add a tensor after {scalars} scalar(s): tensors must precede scalars")]
    TensorAfterScalar {
        /// Scalars already in the builder.
        scalars: usize,
    },
    /// More tensors than the argument list holds.
    #[error("{count} tensor arguments, but the cap is {cap}")]
    TooManyTensors {
        /// How many there would have been (one past the cap for an `add_*` call; the view's or
        /// the blob's count otherwise).
        count: usize,
        /// The cap of this argument kind.
        cap: usize,
    },
    /// More scalars than the argument list holds.
    #[error("{count} scalar arguments, but the cap is {cap}")]
    TooManyScalars {
        /// How many there would have been (as for `TooManyTensors`).
        count: usize,
        /// The cap of this argument kind.
        cap: usize,
    },
    /// A view to copy has a tag count that differs from its tensor count.
    #[error("an argument view with {tensors} tensor(s) carries {tags} tag(s)")]
    MissingTags {
        /// Tensors in the view.
        tensors: usize,
        /// Tags in the view.
        tags: usize,
    },

    // ----- Argument blob -----
    /// The output buffer cannot hold the encoded blob.
    #[error("argument blob needs {needed} bytes but the buffer holds {capacity}")]
    BlobTooSmall {
        /// Encoded length.
        needed: usize,
        /// Length of the buffer given.
        capacity: usize,
    },
    /// The input ends before the blob its header describes.
    #[error("argument blob is truncated: it needs {needed} bytes but only {capacity} are present")]
    BlobTruncated {
        /// Bytes the header implies (or the header itself).
        needed: usize,
        /// Bytes present.
        capacity: usize,
    },
    /// The blob header holds a negative count.
    #[error("argument blob header has negative counts: {tensors} tensors, {scalars} scalars")]
    BlobNegativeCount {
        /// Decoded tensor count.
        tensors: i32,
        /// Decoded scalar count.
        scalars: i32,
    },
    /// One tensor of a blob failed validation.
    #[error("tensor argument {index} of the blob is invalid: {source}")]
    BlobTensor {
        /// Position of the tensor in the blob.
        index: usize,
        /// Why it was rejected.
        source: Box<TypesError>,
    },

    // ----- CallConfig -----
    /// Swimlane level above 4.
    #[error("swimlane level {0} is unknown (known levels are 0..=4)")]
    InvalidSwimlaneLevel(u32),
    /// Dump-args level above 3.
    #[error("dump-args level {0} is unknown (known levels are 0..=3)")]
    InvalidDumpArgsLevel(u32),
    /// PMU event code not in the list.
    #[error("PMU event {0} is unknown (known events are 1, 2, 4, 5, 6, 7, 8)")]
    InvalidPmuEvent(u32),
    /// A ring override named a ring above 3.
    #[error("ring index {0} is out of range (rings are 0..=3)")]
    InvalidRingIndex(u32),
    /// A task-window override is not a power of two in `[4, 2^30]`.
    #[error("task window {value} for ring {ring} must be a power of two in [4, 1073741824]")]
    TaskWindowOutOfRange {
        /// The ring.
        ring: u8,
        /// The value given.
        value: u64,
    },
    /// A heap override that is not a non-zero multiple of 1024 bytes (the heap alignment).
    #[error("heap size {value} for ring {ring} must be a non-zero multiple of 1024 bytes")]
    HeapSizeInvalid {
        /// The ring.
        ring: u8,
        /// The value given.
        value: u64,
    },
    /// A dependency-pool override outside `[4, i32::MAX]`.
    #[error("dependency pool {value} for ring {ring} must be in [4, 2147483647]")]
    DepPoolOutOfRange {
        /// The ring.
        ring: u8,
        /// The value given.
        value: u64,
    },
    /// Diagnostics were enabled without a directory to write them to.
    #[error("output_prefix is required because these diagnostics are on: {}", enabled.join(", "))]
    OutputPrefixRequired {
        /// Names of the switches that are on.
        enabled: Vec<&'static str>,
    },
    /// The output prefix is unusable.
    #[error("output_prefix is invalid: {reason}")]
    OutputPrefixInvalid {
        /// What is wrong with it.
        reason: String,
    },
}
