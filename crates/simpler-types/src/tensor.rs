//! `Tensor`: the 128-byte descriptor that kernels and the chip runtime read (see `docs/types.md`).
//!
//! The layout is a fact of the kernel ABI, not a choice: `#[repr(C, align(64))]`, 128 bytes, no
//! implicit padding, every offset asserted at compile time below. Booleans and the dtype are
//! stored as `u8`, so any byte pattern read back from device or shared memory is a valid value
//! of this type and can be decoded safely with `bytemuck`.
//!
//! Because descriptors are decoded from foreign memory, the fields are public and every
//! accessor tolerates arbitrary field values: slices are clamped to five dimensions and
//! arithmetic is checked or saturating. [`Tensor::validate`] is the single rulebook that says
//! whether a descriptor is well formed; the constructors and view operations run it on their
//! result (`transpose` and `permute` excepted: reordering the dimensions of a valid descriptor
//! keeps its extent and size, so their result is valid by construction), so a descriptor built
//! through this API is always valid.
//!
//! Layout rules beyond the descriptor's fixed offsets (decisions):
//! - `is_contiguous` means "row-major once dimensions of length 1 are ignored"; the stride of a
//!   length-1 dimension never affects which bytes a view touches. A view with a zero-length
//!   dimension is contiguous.
//! - `extent_elems` always holds `1 + Σ (shape[i] − 1) × stride[i]` (0 for an empty view), also
//!   for contiguous views, where it equals `numel`. `validate` rejects a descriptor whose cached
//!   `is_contiguous` or `extent_elems` disagrees with its shapes and strides
//!   ([`TypesError::StaleLayoutCache`]), because the engine derives dependency footprints from
//!   them and a stale cache would silently drop an edge.
//! - Shape and stride entries at or beyond `ndims` must be 0 ([`TypesError::UnusedDimNonZero`]),
//!   so equal views have equal bytes.
//! - A non-null buffer may not wrap the address space (`addr + size` fits in `u64`), so the
//!   footprint of a valid, non-empty view is always representable.
//! - Views zero the `reserved` bytes: they lie in line 2, which a view recomputes.

use std::fmt;
use std::mem::{align_of, offset_of, size_of};

use bytemuck::{Pod, Zeroable};

use crate::constants::{MAX_TENSOR_DIMS, TENSOR_DESC_ALIGN, TENSOR_DESC_SIZE};
use crate::dtype::DataType;
use crate::error::TypesError;
use crate::ids::DeviceTaskId;

mod validate;

/// The 128-byte tensor descriptor. See the module docs for the layout rules.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Pod, Zeroable)]
#[repr(C, align(64))]
pub struct Tensor {
    /// Base address of the backing buffer (host, child-device or device byte address);
    /// 0 = null tensor.
    pub addr: u64,
    /// Size of the backing buffer in bytes.
    pub size: u64,
    /// [`DeviceTaskId`] of the chip task that created it; `u64::MAX` for external tensors.
    pub owner_task_id: u64,
    /// Element offset of the view origin inside the buffer.
    pub start_offset: u64,
    /// Version counter used by the chip runtime's overlap tracking; 0 for new tensors.
    pub version: i32,
    /// Dimensions in use, 1..=5.
    pub ndims: u32,
    /// [`DataType`] wire value.
    pub dtype: u8,
    /// 1 = the chip runtime tracks this tensor by creator only.
    pub manual_dep: u8,
    /// Cached: strides are row-major for `shapes` (see the module docs).
    pub is_contiguous: u8,
    /// 0 = host memory; 1 = memory already on the target chip.
    pub child_memory: u8,
    /// View extent per dimension in elements; entries at or beyond `ndims` are 0.
    pub shapes: [u32; MAX_TENSOR_DIMS],
    /// Cached span of the view in elements.
    pub extent_elems: u64,
    /// Element stride per dimension, positive for used dimensions; unused entries 0.
    pub strides: [u32; MAX_TENSOR_DIMS],
    /// Zero when the runtime creates a descriptor.
    pub reserved: [u8; 36],
}

// The kernel ABI, checked at compile time.
const _: () = {
    assert!(size_of::<Tensor>() == TENSOR_DESC_SIZE);
    assert!(align_of::<Tensor>() == TENSOR_DESC_ALIGN);
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

/// Byte offsets of the three flag bytes, reported by [`TypesError::InvalidFlag`].
const FLAG_OFFSETS: [usize; 3] = [
    offset_of!(Tensor, manual_dep),
    offset_of!(Tensor, is_contiguous),
    offset_of!(Tensor, child_memory),
];

/// Rank as a checked `usize`, or `InvalidRank`.
fn checked_rank(ndims: u64) -> Result<usize, TypesError> {
    if (1..=MAX_TENSOR_DIMS as u64).contains(&ndims) {
        Ok(ndims as usize)
    } else {
        Err(TypesError::InvalidRank { ndims })
    }
}

/// Product of `shape`, `None` on `u64` overflow.
fn checked_numel(shape: &[u32]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &s| acc.checked_mul(u64::from(s)))
}

/// `1 + Σ (shape[i] − 1) × stride[i]`, or 0 for an empty view. Five terms of at most
/// `(2^32 − 1)^2` each cannot overflow `u128`.
fn span_elems(shape: &[u32], stride: &[u32]) -> u128 {
    if shape.contains(&0) {
        return 0;
    }
    1 + shape.iter().zip(stride).map(|(&n, &s)| u128::from(n - 1) * u128::from(s)).sum::<u128>()
}

/// Whether `stride` is row-major for `shape`, ignoring length-1 dimensions; empty views are
/// contiguous.
fn is_row_major(shape: &[u32], stride: &[u32]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expected: u128 = 1;
    for (&n, &s) in shape.iter().zip(stride).rev() {
        if n != 1 {
            if u128::from(s) != expected {
                return false;
            }
            // Saturation is harmless: a saturated value can never equal a `u32` stride.
            expected = expected.saturating_mul(u128::from(n));
        }
    }
    true
}

/// Row-major strides for `shape` (a zero-length dimension counts as 1 so strides stay
/// positive). A stride that never moves over a byte (of a length-1 dimension, or of any
/// dimension of an empty view) is saturated rather than refused when it does not fit `u32`.
fn row_major_strides(shape: &[u32]) -> Result<[u32; MAX_TENSOR_DIMS], TypesError> {
    let mut strides = [0u32; MAX_TENSOR_DIMS];
    let empty = shape.contains(&0);
    let mut acc: u64 = 1;
    for (d, &n) in shape.iter().enumerate().rev() {
        strides[d] = match u32::try_from(acc) {
            Ok(stride) => stride,
            Err(_) if n <= 1 || empty => u32::MAX,
            Err(_) => return Err(TypesError::SizeOverflow { what: "stride" }),
        };
        acc = acc.saturating_mul(u64::from(n.max(1)));
    }
    Ok(strides)
}

impl Tensor {
    /// A contiguous row-major tensor owning a buffer of exactly `numel × element_size` bytes at
    /// `addr`: offset 0, version 0, no owner, host memory. `addr` 0 makes a null tensor.
    pub fn external(addr: u64, shape: &[u32], dtype: DataType) -> Result<Tensor, TypesError> {
        checked_rank(shape.len() as u64)?;
        let bytes = checked_numel(shape)
            .and_then(|n| n.checked_mul(dtype.element_size()))
            .ok_or(TypesError::SizeOverflow { what: "byte size" })?;
        Tensor::with_buffer(addr, bytes, shape, dtype)
    }

    /// A contiguous row-major view at offset 0 of a buffer of `buffer_bytes` bytes at `addr`.
    pub fn with_buffer(
        addr: u64,
        buffer_bytes: u64,
        shape: &[u32],
        dtype: DataType,
    ) -> Result<Tensor, TypesError> {
        let rank = checked_rank(shape.len() as u64)?;
        let strides = row_major_strides(shape)?;
        let mut t = Tensor::zeroed();
        t.addr = addr;
        t.size = buffer_bytes;
        t.owner_task_id = DeviceTaskId::NONE.0;
        t.dtype = dtype.as_u8();
        t.set_layout(shape, &strides[..rank])?;
        t.validate()?;
        Ok(t)
    }

    /// Marks the buffer as already on the target chip (`true`) or in host memory (`false`).
    #[must_use]
    pub fn child_memory(mut self, on_child: bool) -> Tensor {
        self.child_memory = u8::from(on_child);
        self
    }

    /// Makes the chip runtime track this tensor by creator only.
    #[must_use]
    pub fn manual_dep(mut self, manual: bool) -> Tensor {
        self.manual_dep = u8::from(manual);
        self
    }

    /// Sets the version counter.
    #[must_use]
    pub fn version(mut self, version: i32) -> Tensor {
        self.version = version;
        self
    }

    /// Records the chip task that created the tensor.
    #[must_use]
    pub fn with_owner(mut self, owner: DeviceTaskId) -> Tensor {
        self.owner_task_id = owner.0;
        self
    }

    // ----- Accessors (total: never panic on foreign bytes) -----

    /// The element type, or `UnknownDataType` for a byte that names none.
    pub fn data_type(&self) -> Result<DataType, TypesError> {
        DataType::try_from(self.dtype)
    }

    /// Bytes per element; `None` for an unknown dtype byte.
    pub fn element_size(&self) -> Option<u64> {
        DataType::from_u8(self.dtype).map(DataType::element_size)
    }

    /// Whether the buffer is already on the target chip.
    pub fn is_child_memory(&self) -> bool {
        self.child_memory != 0
    }

    /// Whether the chip runtime tracks this tensor by creator only.
    pub fn is_manual_dep(&self) -> bool {
        self.manual_dep != 0
    }

    /// The cached contiguity flag.
    pub fn contiguous(&self) -> bool {
        self.is_contiguous != 0
    }

    /// `ndims` clamped to `0..=5`.
    pub fn rank(&self) -> usize {
        (self.ndims as usize).min(MAX_TENSOR_DIMS)
    }

    /// The used shape entries (`ndims` clamped to 5).
    pub fn shape(&self) -> &[u32] {
        &self.shapes[..self.rank()]
    }

    /// The used stride entries (`ndims` clamped to 5).
    pub fn stride(&self) -> &[u32] {
        &self.strides[..self.rank()]
    }

    /// Whether this is a null tensor (`addr == 0`).
    pub fn is_null(&self) -> bool {
        self.addr == 0
    }

    /// The chip task that created the tensor ([`DeviceTaskId::NONE`] for external tensors).
    pub fn owner(&self) -> DeviceTaskId {
        DeviceTaskId(self.owner_task_id)
    }

    /// Number of elements in the view. Exact for a valid descriptor; saturates at `u64::MAX`
    /// on foreign bytes whose shape product overflows.
    pub fn numel(&self) -> u64 {
        checked_numel(self.shape()).unwrap_or(u64::MAX)
    }

    /// `numel × element_size`. Exact for a valid descriptor; saturates on overflow and is 0 for
    /// an unknown dtype.
    pub fn nbytes(&self) -> u64 {
        self.numel().saturating_mul(self.element_size().unwrap_or(0))
    }

    /// Address of the view origin: `addr + start_offset × element_size`. Exact for a valid,
    /// non-empty view; saturates on overflow and is `addr` for an unknown dtype.
    pub fn data_addr(&self) -> u64 {
        let elem = self.element_size().unwrap_or(0);
        self.addr.saturating_add(self.start_offset.saturating_mul(elem))
    }

    /// Span of the view in elements: `numel` when contiguous, else the cached `extent_elems`.
    pub fn extent(&self) -> u64 {
        if self.contiguous() { self.numel() } else { self.extent_elems }
    }

    /// Whether a task accessing this view with `tag` overwrites every byte of
    /// `[addr, addr + len)` without reading any: a blind write (`Output`, `OutputExisting`)
    /// through a contiguous view whose bytes are exactly that range. Only then may a staged
    /// copy of the range skip its copy in: otherwise the copy back returns the bytes the task
    /// did not write (in a view's gaps, or beside it) as garbage.
    pub fn overwrites_whole(&self, tag: crate::TensorArgType, addr: u64, len: u64) -> bool {
        tag.writes()
            && !tag.reads()
            && self.contiguous()
            && self.byte_span() == addr.checked_add(len).map(|end| (addr, end))
    }

    /// Whether a task handed this view under `tag` would write bytes it has no buffer for: a
    /// null tensor under a write tag, unless the view has no elements and so nothing to write
    /// (what a zero-size `alloc` returns).
    pub fn lacks_buffer_for(&self, tag: crate::TensorArgType) -> bool {
        self.is_null() && !tag.allows_null() && self.numel() != 0
    }

    /// The half-open byte footprint `[data_addr, data_addr + extent × element_size)` that
    /// dependency tracking uses.
    ///
    /// `None` for a null tensor, a zero-size view, an unknown dtype, or when the end does not
    /// fit in `u64`. A strided view is covered by its bounding span.
    pub fn byte_span(&self) -> Option<(u64, u64)> {
        if self.is_null() || self.numel() == 0 {
            return None;
        }
        let elem = self.element_size()?;
        let extent = self.extent();
        if extent == 0 {
            return None;
        }
        let start = self.addr.checked_add(self.start_offset.checked_mul(elem)?)?;
        let end = start.checked_add(extent.checked_mul(elem)?)?;
        Some((start, end))
    }

    /// Calls `f(addr, len)` for each run of adjacent bytes the view's elements occupy, in index
    /// order: one run for a contiguous view; for a strided one, one per index of the dimensions
    /// outside its innermost contiguous ones (runs repeat when strides alias). A view with more
    /// elements than its extent (its elements alias) yields its whole span as one run, so the
    /// work stays bounded by the span whatever its shape claims. Every run lies in
    /// [`byte_span`](Self::byte_span); a view without a span, or one whose strides reach past it
    /// (a descriptor that does not validate), yields nothing beyond what lies inside the span.
    pub fn for_each_byte_run(&self, mut f: impl FnMut(u64, u64)) {
        let (Some((start, end)), Some(elem)) = (self.byte_span(), self.element_size()) else {
            return;
        };
        // Elements that alias (more of them than the view spans) could make far more runs
        // than the span has bytes: the span is their union's bound, given as one run.
        if self.numel() > self.extent() {
            f(start, end - start);
            return;
        }
        let (shape, stride) = (self.shape(), self.stride());
        // Innermost dimensions that continue each other form one run; a dimension of one
        // element continues any.
        let mut run = 1u64;
        let mut outer = shape.len();
        while let Some(k) = outer.checked_sub(1) {
            if shape[k] != 1 {
                if u64::from(stride[k]) != run {
                    break;
                }
                run *= u64::from(shape[k]);
            }
            outer = k;
        }
        let Some(len) = run.checked_mul(elem) else { return };
        let mut index = [0u32; MAX_TENSOR_DIMS];
        loop {
            let offset = (0..outer)
                .try_fold(0u64, |o, k| o.checked_add(u64::from(index[k]) * u64::from(stride[k])));
            let at = offset.and_then(|o| start.checked_add(o.checked_mul(elem)?));
            match at.and_then(|a| Some((a, a.checked_add(len)?))) {
                Some((a, e)) if e <= end => f(a, len),
                _ => return,
            }
            // The next index of the outer dimensions, last one fastest.
            let mut k = outer;
            loop {
                let Some(d) = k.checked_sub(1) else { return };
                index[d] += 1;
                if index[d] < shape[d] {
                    break;
                }
                index[d] = 0;
                k = d;
            }
        }
    }

    // ----- Bytes -----

    /// The descriptor's 128 bytes, in memory order.
    pub fn to_bytes(&self) -> [u8; TENSOR_DESC_SIZE] {
        let mut out = [0u8; TENSOR_DESC_SIZE];
        // Both sides are `TENSOR_DESC_SIZE` bytes (asserted at compile time above).
        out.copy_from_slice(bytemuck::bytes_of(self));
        out
    }

    /// Decodes and validates 128 bytes of foreign memory. The input need not be aligned.
    pub fn from_bytes(bytes: &[u8; TENSOR_DESC_SIZE]) -> Result<Tensor, TypesError> {
        let t: Tensor = bytemuck::pod_read_unaligned(bytes);
        t.validate()?;
        Ok(t)
    }

    /// Checks that the descriptor is well formed; used on decode and at submit.
    ///
    /// Checks, in order: rank 1..=5, known dtype, flag bytes 0 or 1, positive strides for used
    /// dimensions, zero unused entries, a byte size that fits `u64`, consistent layout caches,
    /// a buffer that does not wrap the address space, and the view-fits rule
    /// `(start_offset + extent) × element_size ≤ size` for a non-null, non-empty view.
    ///
    /// A well-formed descriptor is recognised in one pass that builds no error value; the
    /// checks run one by one, to name the first failure, only when that pass says no (see
    /// `tensor/validate.rs`).
    #[inline]
    pub fn validate(&self) -> Result<(), TypesError> {
        if validate::is_well_formed(self) { Ok(()) } else { validate::first_violation(self) }
    }

    // ----- Views -----

    /// A window of the same rank: `shape[i]` elements starting at `offsets[i]` along each
    /// dimension. The origin moves by `Σ offsets[i] × stride[i]`; strides are kept.
    pub fn view(&self, shape: &[u32], offsets: &[u32]) -> Result<Tensor, TypesError> {
        self.validate()?;
        let rank = self.rank();
        for got in [shape.len(), offsets.len()] {
            if got != rank {
                return Err(TypesError::RankMismatch { expected: rank as u64, got: got as u64 });
            }
        }
        let mut shift: u128 = 0;
        for dim in 0..rank {
            let (offset, len, parent_len) = (offsets[dim], shape[dim], self.shapes[dim]);
            if u64::from(offset) + u64::from(len) > u64::from(parent_len) {
                return Err(TypesError::ViewOutsideParent { dim, offset, len, parent_len });
            }
            shift += u128::from(offset) * u128::from(self.strides[dim]);
        }
        let mut t = *self;
        t.start_offset = u64::try_from(u128::from(self.start_offset) + shift)
            .map_err(|_| TypesError::SizeOverflow { what: "start offset" })?;
        t.set_layout(shape, self.stride())?;
        t.validate()?;
        Ok(t)
    }

    /// Elements `start, start + step, …` below `end` along `dim`.
    pub fn slice(&self, dim: usize, start: u32, end: u32, step: u32) -> Result<Tensor, TypesError> {
        self.validate()?;
        let rank = self.rank();
        if dim >= rank {
            return Err(TypesError::DimOutOfRange { dim, ndims: self.ndims });
        }
        let len = self.shapes[dim];
        if step == 0 || start >= end || end > len {
            return Err(TypesError::InvalidSlice { dim, start, end, step, len });
        }
        let new_len = (end - start - 1) / step + 1;
        let mut shape = self.shapes;
        let mut stride = self.strides;
        shape[dim] = new_len;
        // A length-1 dimension keeps its stride: it never moves, and multiplying could overflow
        // for no reason.
        if new_len > 1 {
            stride[dim] =
                stride[dim].checked_mul(step).ok_or(TypesError::SizeOverflow { what: "stride" })?;
        }
        let mut t = *self;
        t.start_offset = self
            .start_offset
            .checked_add(u64::from(start) * u64::from(self.strides[dim]))
            .ok_or(TypesError::SizeOverflow { what: "start offset" })?;
        t.set_layout(&shape[..rank], &stride[..rank])?;
        t.validate()?;
        Ok(t)
    }

    /// Swaps dimensions `a` and `b` (shapes and strides); contiguity is recomputed.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor, TypesError> {
        self.validate()?;
        let rank = self.rank();
        if let Some(dim) = [a, b].into_iter().find(|&d| d >= rank) {
            return Err(TypesError::DimOutOfRange { dim, ndims: self.ndims });
        }
        let mut shape = self.shapes;
        let mut stride = self.strides;
        shape.swap(a, b);
        stride.swap(a, b);
        let mut t = *self;
        t.set_layout(&shape[..rank], &stride[..rank])?;
        Ok(t)
    }

    /// Reorders dimensions: dimension `i` of the result is dimension `order[i]` of `self`.
    pub fn permute(&self, order: &[usize]) -> Result<Tensor, TypesError> {
        self.validate()?;
        let rank = self.rank();
        let mut seen = [false; MAX_TENSOR_DIMS];
        let is_permutation = order.len() == rank
            && order.iter().all(|&d| d < rank && !std::mem::replace(&mut seen[d], true));
        if !is_permutation {
            return Err(TypesError::InvalidPermutation {
                order: order.to_vec(),
                ndims: self.ndims,
            });
        }
        let mut shape = [0u32; MAX_TENSOR_DIMS];
        let mut stride = [0u32; MAX_TENSOR_DIMS];
        for (i, &d) in order.iter().enumerate() {
            shape[i] = self.shapes[d];
            stride[i] = self.strides[d];
        }
        let mut t = *self;
        t.set_layout(&shape[..rank], &stride[..rank])?;
        Ok(t)
    }

    /// The same elements under a new row-major shape; only for contiguous views.
    pub fn reshape(&self, shape: &[u32]) -> Result<Tensor, TypesError> {
        self.validate()?;
        if !self.contiguous() {
            return Err(TypesError::NotContiguous);
        }
        let rank = checked_rank(shape.len() as u64)?;
        let from_numel = self.numel();
        let to_numel =
            checked_numel(shape).ok_or(TypesError::SizeOverflow { what: "element count" })?;
        if from_numel != to_numel {
            return Err(TypesError::ReshapeMismatch { from_numel, to_numel });
        }
        let strides = row_major_strides(shape)?;
        let mut t = *self;
        t.set_layout(shape, &strides[..rank])?;
        t.validate()?;
        Ok(t)
    }

    /// Writes line 2 and the shape part of line 1 for the given used dimensions: shapes,
    /// strides (unused entries zeroed), the contiguity flag, the extent cache and `reserved`.
    fn set_layout(&mut self, shape: &[u32], stride: &[u32]) -> Result<(), TypesError> {
        let rank = shape.len();
        self.ndims = rank as u32;
        self.shapes = [0; MAX_TENSOR_DIMS];
        self.strides = [0; MAX_TENSOR_DIMS];
        self.shapes[..rank].copy_from_slice(shape);
        self.strides[..rank].copy_from_slice(stride);
        self.is_contiguous = u8::from(is_row_major(shape, stride));
        self.extent_elems = u64::try_from(span_elems(shape, stride))
            .map_err(|_| TypesError::SizeOverflow { what: "extent" })?;
        self.reserved = [0; 36];
        Ok(())
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Tensor");
        s.field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.size)
            .field("owner_task_id", &format_args!("{:#x}", self.owner_task_id))
            .field("start_offset", &self.start_offset)
            .field("version", &self.version)
            .field("ndims", &self.ndims);
        match DataType::from_u8(self.dtype) {
            Some(d) => s.field("dtype", &d),
            None => s.field("dtype", &self.dtype),
        };
        s.field("manual_dep", &self.manual_dep)
            .field("is_contiguous", &self.is_contiguous)
            .field("child_memory", &self.child_memory)
            .field("shapes", &self.shapes)
            .field("extent_elems", &self.extent_elems)
            .field("strides", &self.strides);
        // Reserved bytes are zero in every descriptor the runtime creates; show them only when
        // they carry something, which is worth noticing.
        if self.reserved.iter().any(|&b| b != 0) {
            s.field("reserved", &self.reserved);
        }
        s.finish()
    }
}

/// The first pair `(written, other)` of one task's tensor arguments where the written tensor
/// `written` shares bytes with `other`: a kernel would hold a writable view over bytes it also
/// reads or writes through another argument. A tensor is written when its tag writes or when
/// bit `i` of `kernel_writes` says the task's kernel writes argument `i` whatever its tag (a
/// `NoDep` tensor, which fits any argument, in an output's place). Spans are
/// [`Tensor::byte_span`]s, so two views of one buffer that only interleave count as overlapping
/// (conservative); empty and null tensors overlap nothing. Both chip runtimes refuse such a
/// task with this pair. Quadratic in the argument count (at most a few dozen) and
/// allocation-free, for device-side submits.
pub fn overlapping_write(
    tensors: &[Tensor],
    tags: &[crate::TensorArgType],
    kernel_writes: u64,
) -> Option<(usize, usize)> {
    for (w, (t, tag)) in tensors.iter().zip(tags).enumerate() {
        let written = tag.writes() || (w < 64 && kernel_writes & (1 << w) != 0);
        let Some((ws, we)) = t.byte_span().filter(|_| written) else { continue };
        let hit = tensors.iter().enumerate().find(|&(o, other)| {
            o != w && other.byte_span().is_some_and(|(os, oe)| os < we && ws < oe)
        });
        if let Some((o, _)) = hit {
            return Some((w, o));
        }
    }
    None
}

/// `FLOAT16[2, 3, 4] @0x1000+0` style: dtype, shape, base address and element offset.
impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match DataType::from_u8(self.dtype) {
            Some(d) => write!(f, "{d}")?,
            None => write!(f, "dtype#{}", self.dtype)?,
        }
        write!(f, "{:?} @{:#x}+{}", self.shape(), self.addr, self.start_offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[u32]) -> Tensor {
        Tensor::external(0x1000, shape, DataType::Float32).unwrap()
    }

    fn runs(t: &Tensor) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        t.for_each_byte_run(|a, n| out.push((a, n)));
        out
    }

    #[test]
    fn byte_runs_are_the_views_contiguous_pieces() {
        let m = t(&[4, 8]);
        assert_eq!(runs(&m), vec![(0x1000, 128)], "contiguous: one run");
        // Rows 1 and 3: two runs of a row each.
        let odd_rows = m.slice(0, 1, 4, 2).unwrap();
        assert_eq!(runs(&odd_rows), vec![(0x1000 + 32, 32), (0x1000 + 96, 32)]);
        // Columns 2..4 of every row: one run of two elements per row.
        let cols = m.view(&[4, 2], &[0, 2]).unwrap();
        assert_eq!(runs(&cols), (0..4).map(|r| (0x1000 + r * 32 + 8, 8)).collect::<Vec<_>>());
        // The transpose: one element at a time, in the view's index order.
        let tr = t(&[2, 3]).transpose(0, 1).unwrap();
        let want: Vec<(u64, u64)> =
            [0, 3, 1, 4, 2, 5].iter().map(|e| (0x1000 + e * 4, 4)).collect();
        assert_eq!(runs(&tr), want);
        // A dimension of one element continues any other.
        let row = m.view(&[1, 8], &[2, 0]).unwrap();
        assert_eq!(runs(&row), vec![(0x1000 + 64, 32)]);
        assert!(runs(&m.view(&[0, 8], &[0, 0]).unwrap()).is_empty(), "no elements");
    }

    #[test]
    fn a_view_whose_elements_alias_is_one_run_over_its_span_however_many_elements() {
        // 65535³ · 16 elements over strides of 1: 196 618 distinct elements, and a walk of its
        // runs would take 65535³ steps.
        let mut v = t(&[196_618]);
        let shape = [65_535, 65_535, 65_535, 16];
        v.ndims = 4;
        v.shapes = [0; MAX_TENSOR_DIMS];
        v.strides = [0; MAX_TENSOR_DIMS];
        v.shapes[..4].copy_from_slice(&shape);
        v.strides[..4].copy_from_slice(&[1; 4]);
        v.is_contiguous = 0;
        v.extent_elems = span_elems(&shape, &[1; 4]) as u64;
        assert_eq!(v.validate(), Ok(()));
        assert_eq!(runs(&v), vec![(0x1000, 196_618 * 4)]);
    }

    #[test]
    fn only_a_blind_write_of_a_contiguous_view_of_exactly_the_range_overwrites_it_whole() {
        use crate::TensorArgType::{InOut, Input, Output, OutputExisting};
        let m = t(&[4, 4]);
        let (addr, len) = (0x1000, 64);
        assert!(m.overwrites_whole(Output, addr, len));
        assert!(m.overwrites_whole(OutputExisting, addr, len));
        assert!(!m.overwrites_whole(InOut, addr, len), "reads the bytes first");
        assert!(!m.overwrites_whole(Input, addr, len));
        assert!(!m.overwrites_whole(Output, addr, len + 4), "a byte beside it");
        assert!(!m.view(&[4, 2], &[0, 0]).unwrap().overwrites_whole(Output, addr, len), "a part");
        // The transpose bounds the same bytes but is not contiguous.
        assert!(!m.transpose(0, 1).unwrap().overwrites_whole(Output, addr, len), "strided");
        assert!(!m.overwrites_whole(Output, u64::MAX, 2), "a range past the address space");
    }

    #[test]
    fn a_write_overlapping_another_argument_names_both_and_adjacent_views_pass() {
        use crate::TensorArgType::{InOut, Input, NoDep, Output};
        let buf = Tensor::external(0x1000, &[64], DataType::Float32).unwrap();
        let (lo, hi) = (buf.view(&[32], &[0]).unwrap(), buf.view(&[32], &[32]).unwrap());
        let mid = buf.view(&[16], &[24]).unwrap();
        let other = Tensor::external(0x9000, &[64], DataType::Float32).unwrap();
        let by_tags = |tensors: &[Tensor], tags: &[_]| overlapping_write(tensors, tags, 0);
        assert_eq!(by_tags(&[buf, other, buf], &[Input, Input, Output]), Some((2, 0)));
        assert_eq!(by_tags(&[other, lo, mid], &[Input, Input, InOut]), Some((2, 1)));
        assert_eq!(by_tags(&[lo, hi], &[Input, Output]), None, "adjacent halves");
        assert_eq!(by_tags(&[buf, buf], &[Input, NoDep]), None, "two readers");
        let empty = buf.view(&[0], &[0]).unwrap();
        assert_eq!(by_tags(&[buf, empty], &[Input, Output]), None, "an empty view");
        // A `NoDep` tensor in the place of an output the kernel writes is written all the same.
        let untracked = [NoDep, Input, NoDep];
        assert_eq!(by_tags(&[buf, other, buf], &untracked), None, "the tags write nothing");
        assert_eq!(overlapping_write(&[buf, other, buf], &untracked, 0b100), Some((2, 0)));
    }

    #[test]
    fn external_is_contiguous_row_major() {
        let x = t(&[2, 3, 4]);
        assert_eq!(x.shape(), &[2, 3, 4]);
        assert_eq!(x.stride(), &[12, 4, 1]);
        assert_eq!((x.numel(), x.nbytes(), x.size, x.extent()), (24, 96, 96, 24));
        assert!(x.contiguous());
        assert_eq!(x.owner(), DeviceTaskId::NONE);
        assert_eq!(x.byte_span(), Some((0x1000, 0x1000 + 96)));
    }

    #[test]
    fn external_rejects_bad_rank_and_overflow() {
        assert_eq!(
            Tensor::external(1, &[], DataType::Int8),
            Err(TypesError::InvalidRank { ndims: 0 })
        );
        assert_eq!(
            Tensor::external(1, &[1; 6], DataType::Int8),
            Err(TypesError::InvalidRank { ndims: 6 })
        );
        assert_eq!(
            Tensor::external(1, &[u32::MAX, u32::MAX, 4], DataType::Int64),
            Err(TypesError::SizeOverflow { what: "byte size" })
        );
    }

    #[test]
    fn with_buffer_checks_the_fit() {
        assert!(Tensor::with_buffer(0x10, 64, &[4, 4], DataType::Float32).is_ok());
        assert_eq!(
            Tensor::with_buffer(0x10, 63, &[4, 4], DataType::Float32),
            Err(TypesError::ViewOutOfBounds { needed_bytes: 64, buffer_bytes: 63 })
        );
        // A null tensor carries a shape but no buffer.
        assert!(Tensor::with_buffer(0, 0, &[4, 4], DataType::Float32).is_ok());
    }

    #[test]
    fn view_moves_origin_and_keeps_strides() {
        let x = t(&[4, 8]);
        let v = x.view(&[2, 3], &[1, 2]).unwrap();
        assert_eq!((v.start_offset, v.stride(), v.shape()), (10, &[8, 1][..], &[2, 3][..]));
        assert!(!v.contiguous());
        assert_eq!(v.extent(), 1 + 8 + 2);
        assert_eq!(v.byte_span(), Some((0x1000 + 40, 0x1000 + 40 + 44)));
        assert_eq!(
            x.view(&[2, 7], &[0, 2]),
            Err(TypesError::ViewOutsideParent { dim: 1, offset: 2, len: 7, parent_len: 8 })
        );
        assert_eq!(x.view(&[2], &[0, 0]), Err(TypesError::RankMismatch { expected: 2, got: 1 }));
        // A full-width row band stays contiguous.
        assert!(x.view(&[2, 8], &[1, 0]).unwrap().contiguous());
    }

    #[test]
    fn empty_views_have_no_footprint() {
        let v = t(&[4, 8]).view(&[0, 8], &[4, 0]).unwrap();
        assert!(v.contiguous());
        assert_eq!((v.numel(), v.extent(), v.byte_span()), (0, 0, None));
    }

    #[test]
    fn slice_with_step() {
        let x = t(&[10]);
        let s = x.slice(0, 1, 10, 3).unwrap();
        assert_eq!((s.shape(), s.stride(), s.start_offset), (&[3][..], &[3][..], 1));
        assert_eq!(s.extent(), 7);
        let one = x.slice(0, 9, 10, 1000).unwrap();
        assert_eq!((one.shape(), one.stride(), one.contiguous()), (&[1][..], &[1][..], true));
        assert_eq!(
            x.slice(0, 3, 3, 1),
            Err(TypesError::InvalidSlice { dim: 0, start: 3, end: 3, step: 1, len: 10 })
        );
        assert!(matches!(x.slice(0, 0, 11, 1), Err(TypesError::InvalidSlice { .. })));
        assert!(matches!(x.slice(0, 0, 5, 0), Err(TypesError::InvalidSlice { .. })));
        assert_eq!(x.slice(1, 0, 1, 1), Err(TypesError::DimOutOfRange { dim: 1, ndims: 1 }));
    }

    #[test]
    fn transpose_permute_and_reshape() {
        let x = t(&[2, 3, 4]);
        let tr = x.transpose(0, 2).unwrap();
        assert_eq!((tr.shape(), tr.stride()), (&[4, 3, 2][..], &[1, 4, 12][..]));
        assert!(!tr.contiguous());
        assert_eq!(tr.extent(), 24);
        assert_eq!(tr.reshape(&[24]), Err(TypesError::NotContiguous));
        let p = x.permute(&[1, 2, 0]).unwrap();
        assert_eq!((p.shape(), p.stride()), (&[3, 4, 2][..], &[4, 1, 12][..]));
        assert!(x.permute(&[0, 2, 0]).unwrap_err().to_string().contains("permutation"));
        assert!(matches!(x.permute(&[0, 1]), Err(TypesError::InvalidPermutation { .. })));
        assert_eq!(x.transpose(0, 3), Err(TypesError::DimOutOfRange { dim: 3, ndims: 3 }));
        let r = x.reshape(&[6, 4]).unwrap();
        assert_eq!((r.shape(), r.stride()), (&[6, 4][..], &[4, 1][..]));
        assert_eq!(
            x.reshape(&[5, 5]),
            Err(TypesError::ReshapeMismatch { from_numel: 24, to_numel: 25 })
        );
        assert_eq!(x.reshape(&[]), Err(TypesError::InvalidRank { ndims: 0 }));
    }

    #[test]
    fn validate_rejects_malformed_descriptors() {
        let good = t(&[2, 3]);
        type Corruption = (fn(&mut Tensor), TypesError);
        let cases: [Corruption; 8] = [
            (|x| x.ndims = 6, TypesError::InvalidRank { ndims: 6 }),
            (|x| x.dtype = 200, TypesError::UnknownDataType(200)),
            (|x| x.child_memory = 2, TypesError::InvalidFlag { offset: 43, value: 2 }),
            (|x| x.manual_dep = 9, TypesError::InvalidFlag { offset: 41, value: 9 }),
            (|x| x.strides[1] = 0, TypesError::ZeroStride { dim: 1 }),
            (
                |x| x.shapes[4] = 1,
                TypesError::UnusedDimNonZero { field: "shapes", dim: 4, value: 1 },
            ),
            (
                |x| x.extent_elems = 5,
                TypesError::StaleLayoutCache { field: "extent_elems", stored: 5, computed: 6 },
            ),
            (|x| x.size = 23, TypesError::ViewOutOfBounds { needed_bytes: 24, buffer_bytes: 23 }),
        ];
        for (corrupt, expected) in cases {
            let mut bad = good;
            corrupt(&mut bad);
            assert_eq!(bad.validate(), Err(expected.clone()));
            assert_eq!(Tensor::from_bytes(&bad.to_bytes()), Err(expected));
        }
    }

    #[test]
    fn accessors_tolerate_garbage() {
        let mut g = Tensor::zeroed();
        g.ndims = u32::MAX;
        g.dtype = 99;
        g.shapes = [u32::MAX; 5];
        g.addr = u64::MAX;
        g.start_offset = u64::MAX;
        g.extent_elems = u64::MAX;
        assert_eq!(g.shape().len(), 5);
        assert_eq!(g.stride().len(), 5);
        assert_eq!((g.numel(), g.nbytes(), g.element_size()), (u64::MAX, 0, None));
        assert_eq!(g.byte_span(), None);
        assert_eq!(g.data_addr(), u64::MAX);
        g.dtype = 7;
        assert_eq!(g.byte_span(), None);
        assert_eq!(g.data_addr(), u64::MAX);
        assert!(g.view(&[1], &[0]).is_err());
        assert!(g.reshape(&[1]).is_err());
        let _ = format!("{g:?} {g}");
    }
}
