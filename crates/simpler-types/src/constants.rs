//! Sizes, caps and defaults shared by every layer (see `docs/types.md`).

use std::time::Duration;

/// Dimensions a tensor descriptor can carry.
pub const MAX_TENSOR_DIMS: usize = 5;
/// Size of [`crate::Tensor`] in bytes: two 64-byte cache lines.
pub const TENSOR_DESC_SIZE: usize = 128;
/// Alignment of [`crate::Tensor`] in memory the runtime owns.
pub const TENSOR_DESC_ALIGN: usize = 64;
/// Heap rings per level, one per clamped scope depth.
pub const HEAP_RING_COUNT: usize = 4;
/// Every heap allocation is rounded up to this many bytes.
pub const HEAP_ALIGN: u64 = 1024;
/// Default size of one heap ring (virtual address space; committed on touch).
pub const DEFAULT_HEAP_RING_BYTES: u64 = 1 << 30;
/// Default back-pressure deadline of a blocking ring allocation.
pub const DEFAULT_ALLOC_TIMEOUT: Duration = Duration::from_secs(10);
/// Scope frames per run, including the run's own outer frame (63 user levels).
pub const MAX_SCOPE_DEPTH: usize = 64;
/// Tensor arguments of one L3+ task member or chip entry call.
pub const CHIP_MAX_TENSOR_ARGS: usize = 128;
/// Scalar arguments of one L3+ task member or chip entry call.
pub const CHIP_MAX_SCALAR_ARGS: usize = 128;
/// Tensor arguments of one AICore kernel task inside a chip.
pub const CORE_MAX_TENSOR_ARGS: usize = 32;
/// Scalar arguments of one AICore kernel task inside a chip.
pub const CORE_MAX_SCALAR_ARGS: usize = 16;
/// Header bytes of the encoded argument blob (two `i32` counts).
pub const ARGS_BLOB_HEADER: usize = 8;
/// Length of a callable's SHA-256 content digest.
pub const CALLABLE_DIGEST_LEN: usize = 32;
/// Longest `output_prefix` in bytes (fits a 1024-byte NUL-terminated field).
pub const OUTPUT_PREFIX_MAX: usize = 1023;
/// Largest power of two not above `i32::MAX`: the upper bound of a task-window override.
pub const RING_TASK_WINDOW_MAX: u64 = 1 << 30;
