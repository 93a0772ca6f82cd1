//! The chip orchestration API (`docs/device-chip.md`): a `#[repr(C)]` ops table and the safe [`OrchCtx`]
//! wrapped around it.
//!
//! Orchestration code reaches the runtime only through [`OrchOps`], so a `Native` Rust
//! orchestration and a `DeviceObject` C orchestration behave alike, and the same table serves
//! the host graph builder (host_build_graph) and, later, the device executor. Every operation
//! returns a status (0 = success); the runtime behind the table latches the detailed, typed
//! error of a failed operation and reports it as the run's error, so [`OrchError`] only carries
//! the status.

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;

use simpler_types::{CoreArgs, DataType, DeviceTaskId, Tensor};

use crate::abi::image::{NO_FUNC, TaskShape};

/// Version of the ops table layout.
pub const ORCH_OPS_VERSION: u32 = 1;

/// Status: success.
pub const ORCH_OK: i32 = 0;
/// Status: the arguments of the call were invalid (detail latched by the runtime).
pub const ORCH_INVALID: i32 = -1;
/// Status: a capacity ran out (detail latched by the runtime).
pub const ORCH_CAPACITY: i32 = -2;
/// Status: an earlier error is latched; the runtime refuses further work.
pub const ORCH_FAILED: i32 = -3;

/// One submitted kernel task, as it crosses the ops table.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct SubmitDesc {
    /// Func ids of the AIC, AIV0 and AIV1 kernels (`-1` = none).
    pub func_ids: [i32; 3],
    /// [`TaskShape`] as `u32`.
    pub shape: u32,
    /// Blocks to run (≥ 1).
    pub block_num: u32,
    /// Tensor arguments.
    pub num_tensors: u32,
    /// Scalar arguments.
    pub num_scalars: u32,
    /// Padding.
    pub reserved: u32,
    /// `num_tensors` descriptors.
    pub tensors: *const Tensor,
    /// `num_tensors` tags (`TensorArgType` wire values).
    pub tags: *const i32,
    /// `num_scalars` scalars.
    pub scalars: *const u64,
}

impl SubmitDesc {
    /// The descriptor's tensors, tags and scalars; `None` when an array with a non-zero count
    /// is null or misaligned (C passes null for an empty one).
    ///
    /// # Safety
    ///
    /// Each non-null, aligned array holds the count the descriptor states, valid for `'a`.
    pub(crate) unsafe fn arrays<'a>(&self) -> Option<(&'a [Tensor], &'a [i32], &'a [u64])> {
        let (nt, ns) = (self.num_tensors as usize, self.num_scalars as usize);
        // SAFETY: the caller's contract.
        unsafe {
            Some((c_slice(self.tensors, nt)?, c_slice(self.tags, nt)?, c_slice(self.scalars, ns)?))
        }
    }
}

/// The operations an orchestration may call. Every function receives the runtime's opaque
/// context pointer first.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct OrchOps {
    /// [`ORCH_OPS_VERSION`].
    pub version: u32,
    /// Submits a task; returns its device task id, or a negative status.
    pub submit: unsafe extern "C-unwind" fn(rt: *mut c_void, desc: *const SubmitDesc) -> i64,
    /// Opens a scope.
    pub scope_begin: unsafe extern "C-unwind" fn(rt: *mut c_void) -> i32,
    /// Closes the innermost scope.
    pub scope_end: unsafe extern "C-unwind" fn(rt: *mut c_void) -> i32,
    /// Allocates buffers for `count` descriptors (shape and dtype set, address 0).
    pub alloc_tensors:
        unsafe extern "C-unwind" fn(rt: *mut c_void, tensors: *mut Tensor, count: u32) -> i32,
    /// Copies a tensor's bytes out.
    pub get_tensor_data: unsafe extern "C-unwind" fn(
        rt: *mut c_void,
        t: *const Tensor,
        dst: *mut u8,
        len: u64,
    ) -> i32,
    /// Copies bytes into a tensor.
    pub set_tensor_data: unsafe extern "C-unwind" fn(
        rt: *mut c_void,
        t: *const Tensor,
        src: *const u8,
        len: u64,
    ) -> i32,
    /// Clusters of the launch.
    pub available_clusters: unsafe extern "C-unwind" fn(rt: *mut c_void) -> u32,
    /// AIV cores of the launch.
    pub available_aiv_cores: unsafe extern "C-unwind" fn(rt: *mut c_void) -> u32,
    /// Fails the run with `code` and a message.
    pub report_fatal:
        unsafe extern "C-unwind" fn(rt: *mut c_void, code: i32, msg: *const u8, len: usize),
    /// Writes a log line (level 0 error … 3 debug).
    pub log: unsafe extern "C-unwind" fn(rt: *mut c_void, level: u32, msg: *const u8, len: usize),
}

/// The arguments a C orchestration's entry and config functions receive: the chip entry's
/// tensors, their tags (`TensorArgType` wire values) and its scalars, valid for the call.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct COrchArgs {
    /// `num_tensors` descriptors.
    pub tensors: *const Tensor,
    /// `num_tensors` tags.
    pub tags: *const i32,
    /// `num_scalars` scalars.
    pub scalars: *const u64,
    /// Tensor arguments.
    pub num_tensors: u32,
    /// Scalar arguments.
    pub num_scalars: u32,
}

/// The entry of a `DeviceObject` orchestration: builds the run's graph through `ops` with the
/// runtime context `rt`; 0 = success, anything else fails the run with that status.
pub type COrchEntryFn = unsafe extern "C-unwind" fn(
    ops: *const OrchOps,
    rt: *mut c_void,
    args: *const COrchArgs,
) -> i32;

/// The config function of a `DeviceObject` orchestration: the number of arguments (tensors plus
/// scalars) its entry expects.
pub type COrchConfigFn = unsafe extern "C-unwind" fn(args: *const COrchArgs) -> u32;

/// An ops-table call failed; the runtime latched the detailed error, which the run reports.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub struct OrchError {
    /// The status the runtime returned.
    pub status: i32,
}

impl OrchError {
    /// An error an orchestration raises itself (for example a missing argument); the run fails
    /// with `Orchestration` naming the status.
    pub fn from_status(status: i32) -> OrchError {
        OrchError { status }
    }
}

impl fmt::Display for OrchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "orchestration call rejected with status {}", self.status)
    }
}

impl std::error::Error for OrchError {}

fn check(status: i32) -> Result<(), OrchError> {
    if status == ORCH_OK { Ok(()) } else { Err(OrchError { status }) }
}

/// Which kernels a task runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kernels {
    /// One AIC kernel per block.
    Aic(u32),
    /// One AIV kernel per block.
    Aiv(u32),
    /// Kernels on one cluster per block; at least one must be set.
    Mix {
        /// The cube kernel.
        aic: Option<u32>,
        /// The kernel of AIV sub-block 0.
        aiv0: Option<u32>,
        /// The kernel of AIV sub-block 1.
        aiv1: Option<u32>,
    },
}

impl Kernels {
    fn encode(self) -> ([i32; 3], TaskShape) {
        let id = |f: Option<u32>| f.map_or(NO_FUNC, |v| i32::try_from(v).unwrap_or(i32::MAX));
        match self {
            Kernels::Aic(f) => ([id(Some(f)), NO_FUNC, NO_FUNC], TaskShape::Aic),
            Kernels::Aiv(f) => ([NO_FUNC, id(Some(f)), NO_FUNC], TaskShape::Aiv),
            Kernels::Mix { aic, aiv0, aiv1 } => ([id(aic), id(aiv0), id(aiv1)], TaskShape::Mix),
        }
    }
}

/// The safe handle an orchestration uses.
pub struct OrchCtx<'a> {
    ops: &'a OrchOps,
    rt: *mut c_void,
    _rt: PhantomData<&'a mut ()>,
}

impl fmt::Debug for OrchCtx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OrchCtx").finish_non_exhaustive()
    }
}

impl<'a> OrchCtx<'a> {
    /// Wraps an ops table and its runtime context.
    ///
    /// # Safety
    ///
    /// Every function of `ops` must be sound to call with `rt` and the documented arguments for
    /// `'a`, and `rt` must not be used by anyone else while the context exists.
    pub(crate) unsafe fn new(ops: &'a OrchOps, rt: *mut c_void) -> OrchCtx<'a> {
        OrchCtx { ops, rt, _rt: PhantomData }
    }

    fn submit_raw(
        &mut self,
        funcs: [i32; 3],
        shape: TaskShape,
        args: &CoreArgs,
        block_num: u32,
    ) -> Result<DeviceTaskId, OrchError> {
        let tags: smallvec_tags::Tags = args.tags().iter().map(|t| t.as_i32()).collect();
        let desc = SubmitDesc {
            func_ids: funcs,
            shape: shape as u32,
            block_num,
            num_tensors: args.tensors().len() as u32,
            num_scalars: args.scalars().len() as u32,
            reserved: 0,
            tensors: args.tensors().as_ptr(),
            tags: tags.as_ptr(),
            scalars: args.scalars().as_ptr(),
        };
        // SAFETY: `new`'s contract; `desc` and the arrays it points at live across the call.
        let r = unsafe { (self.ops.submit)(self.rt, &desc) };
        if r < 0 { Err(OrchError { status: r as i32 }) } else { Ok(DeviceTaskId(r as u64)) }
    }

    /// Submits a one-block task running `kernels` with `args`.
    pub fn submit(&mut self, kernels: Kernels, args: &CoreArgs) -> Result<DeviceTaskId, OrchError> {
        self.submit_blocks(kernels, args, 1)
    }

    /// Submits a task of `block_num` blocks.
    pub fn submit_blocks(
        &mut self,
        kernels: Kernels,
        args: &CoreArgs,
        block_num: u32,
    ) -> Result<DeviceTaskId, OrchError> {
        let (funcs, shape) = kernels.encode();
        self.submit_raw(funcs, shape, args, block_num)
    }

    /// Submits a dependency-only task (no kernel): it orders its tensors like a real task and
    /// completes as soon as its producers did.
    pub fn submit_dummy(&mut self, args: &CoreArgs) -> Result<DeviceTaskId, OrchError> {
        self.submit_raw([NO_FUNC; 3], TaskShape::Dummy, args, 1)
    }

    /// Runs `f` inside a scope.
    pub fn scope<R>(&mut self, f: impl FnOnce(&mut OrchCtx<'a>) -> R) -> Result<R, OrchError> {
        // SAFETY: `new`'s contract.
        check(unsafe { (self.ops.scope_begin)(self.rt) })?;
        let r = f(self);
        // SAFETY: `new`'s contract.
        check(unsafe { (self.ops.scope_end)(self.rt) })?;
        Ok(r)
    }

    /// Allocates a contiguous runtime buffer of `shape` and `dtype`.
    pub fn alloc_tensor(&mut self, shape: &[u32], dtype: DataType) -> Result<Tensor, OrchError> {
        let mut t =
            Tensor::external(0, shape, dtype).map_err(|_| OrchError { status: ORCH_INVALID })?;
        self.alloc_tensors(std::slice::from_mut(&mut t))?;
        Ok(t)
    }

    /// Allocates buffers for descriptors that carry a shape and dtype but no address.
    pub fn alloc_tensors(&mut self, tensors: &mut [Tensor]) -> Result<(), OrchError> {
        let n = u32::try_from(tensors.len()).map_err(|_| OrchError { status: ORCH_INVALID })?;
        // SAFETY: `new`'s contract; the slice is valid for `n` descriptors.
        check(unsafe { (self.ops.alloc_tensors)(self.rt, tensors.as_mut_ptr(), n) })
    }

    /// Copies the bytes of `t`'s view (contiguous) into `out` (whose length must match).
    pub fn tensor_data(&mut self, t: &Tensor, out: &mut [u8]) -> Result<(), OrchError> {
        // SAFETY: `new`'s contract; `out` is valid for its length.
        check(unsafe { (self.ops.get_tensor_data)(self.rt, t, out.as_mut_ptr(), out.len() as u64) })
    }

    /// Copies `data` into `t`'s view (contiguous; lengths must match).
    pub fn set_tensor_data(&mut self, t: &Tensor, data: &[u8]) -> Result<(), OrchError> {
        // SAFETY: `new`'s contract; `data` is valid for its length.
        check(unsafe { (self.ops.set_tensor_data)(self.rt, t, data.as_ptr(), data.len() as u64) })
    }

    /// Clusters of the launch.
    pub fn available_clusters(&self) -> u32 {
        // SAFETY: `new`'s contract.
        unsafe { (self.ops.available_clusters)(self.rt) }
    }

    /// AIV cores of the launch.
    pub fn available_aiv_cores(&self) -> u32 {
        // SAFETY: `new`'s contract.
        unsafe { (self.ops.available_aiv_cores)(self.rt) }
    }

    /// Fails the run with `code` (0 = ORCHESTRATION_FATAL) and `message`.
    pub fn report_fatal(&mut self, code: i32, message: &str) {
        // SAFETY: `new`'s contract; the message is valid for its length.
        unsafe { (self.ops.report_fatal)(self.rt, code, message.as_ptr(), message.len()) }
    }

    /// Writes an info-level log line.
    pub fn log(&self, message: &str) {
        // SAFETY: `new`'s contract; the message is valid for its length.
        unsafe { (self.ops.log)(self.rt, 2, message.as_ptr(), message.len()) }
    }
}

/// Inline storage for the tag array of one submit (≤ 32 tags), so submitting allocates nothing.
mod smallvec_tags {
    /// Up to 32 tags inline.
    pub(super) struct Tags {
        buf: [i32; 32],
        len: usize,
    }

    impl Tags {
        pub(super) fn as_ptr(&self) -> *const i32 {
            self.buf[..self.len].as_ptr()
        }
    }

    impl FromIterator<i32> for Tags {
        fn from_iter<I: IntoIterator<Item = i32>>(iter: I) -> Tags {
            let mut t = Tags { buf: [0; 32], len: 0 };
            for v in iter {
                if t.len < 32 {
                    t.buf[t.len] = v;
                    t.len += 1;
                }
            }
            t
        }
    }
}

/// The `n` elements a caller of the ops table passed at `p`: empty for `n == 0` whatever `p`
/// is (C passes null for an empty array); `None` when `p` is null or misaligned.
///
/// # Safety
///
/// A non-null, aligned `p` with `n > 0` points at `n` initialised elements valid for `'a`.
pub(crate) unsafe fn c_slice<'a, T>(p: *const T, n: usize) -> Option<&'a [T]> {
    if n == 0 {
        return Some(&[]);
    }
    if p.is_null() || !p.is_aligned() {
        return None;
    }
    // SAFETY: non-null and aligned; the caller's guarantee for the rest.
    Some(unsafe { core::slice::from_raw_parts(p, n) })
}

/// The element a caller of the ops table passed at `p`; `None` when null or misaligned.
///
/// # Safety
///
/// A non-null, aligned `p` points at an initialised element valid for `'a`.
pub(crate) unsafe fn c_ref<'a, T>(p: *const T) -> Option<&'a T> {
    if !p.is_aligned() {
        return None;
    }
    // SAFETY: aligned; null gives `None`; the caller's guarantee for the rest.
    unsafe { p.as_ref() }
}
