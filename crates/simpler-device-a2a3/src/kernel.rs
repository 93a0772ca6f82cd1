//! The kernel ABI (`docs/device-chip.md`): the kernel function type and the accessors kernels use.
//!
//! A kernel is `unsafe extern "C-unwind" fn(args: *mut i64)`. `C-unwind` lets a panicking Rust
//! kernel unwind into the simulated AICore, which turns it into an AICore fault instead of
//! aborting the process; C kernels fit the same type. `args` points at the 50 argument slots of
//! the dispatch payload:
//!
//! - `args[0..T)`: device addresses of the task's 128-byte [`Tensor`] descriptors;
//! - `args[T..T+S)`: scalars as raw 64-bit words (value bytes low, zero-extended);
//! - `args[48]`: address of the [`LocalContext`] (`block_idx`, `block_num`);
//! - `args[49]`: address of the [`GlobalContext`] (`sub_block_id`, `copy_idx`, `copy_num`).
//!
//! Kernels read topology through these accessors, never from hardware intrinsics. A kernel
//! knows its own signature (how many tensors it takes), which [`KernelCall::from_raw`] needs to
//! tell descriptor slots from scalar slots.

use std::cell::Cell;
use std::marker::PhantomData;
use std::time::Duration;

use simpler_types::{Scalar, Tensor, from_scalar};

use crate::abi::payload::{GLOBAL_CONTEXT_SLOT, GlobalContext, LOCAL_CONTEXT_SLOT, LocalContext};

/// The type of every kernel entry.
pub type KernelFn = unsafe extern "C-unwind" fn(args: *mut i64);

/// A kernel's view of its argument slots.
#[derive(Clone, Copy, Debug)]
pub struct KernelCall<'a> {
    args: *const i64,
    num_tensors: usize,
    _life: PhantomData<&'a i64>,
}

impl<'a> KernelCall<'a> {
    /// Wraps the `args` pointer a kernel received; `num_tensors` is the number of tensor
    /// arguments of the kernel's signature.
    ///
    /// # Safety
    ///
    /// `args` must be the pointer the runtime passed to the running kernel (valid for the
    /// kernel call, i.e. `'a`), and the task must have been submitted with at least
    /// `num_tensors` tensors.
    pub unsafe fn from_raw(args: *mut i64, num_tensors: usize) -> KernelCall<'a> {
        KernelCall { args, num_tensors: num_tensors.min(LOCAL_CONTEXT_SLOT), _life: PhantomData }
    }

    fn slot(&self, i: usize) -> i64 {
        debug_assert!(i < 50, "argument slot {i} out of range");
        // SAFETY: `from_raw`'s contract makes all 50 slots readable for `'a`; `i` < 50 (the
        // callers clamp or bound it).
        unsafe { *self.args.add(i.min(49)) }
    }

    fn local(&self) -> LocalContext {
        // SAFETY: the runtime stores the address of the payload's `LocalContext` in slot 48.
        unsafe { *(self.slot(LOCAL_CONTEXT_SLOT) as usize as *const LocalContext) }
    }

    fn global(&self) -> GlobalContext {
        // SAFETY: the runtime stores the address of the payload's `GlobalContext` in slot 49.
        unsafe { *(self.slot(GLOBAL_CONTEXT_SLOT) as usize as *const GlobalContext) }
    }

    /// Index of this block of the task, `0..block_num()`.
    pub fn block_idx(&self) -> u32 {
        self.local().block_idx
    }

    /// Number of blocks the task runs.
    pub fn block_num(&self) -> u32 {
        self.local().block_num
    }

    /// Sub-block id of an AIV core (0 or 1); 0 on AIC.
    pub fn sub_block_id(&self) -> u32 {
        self.global().sub_block_id
    }

    /// Index of this call among the members of its block that name this kernel's function id
    /// (in member order: AIC, AIV0, AIV1), `0..copy_num()`: 0 outside MIX tasks. The copies of a block
    /// see the same `block_idx`, so a kernel that splits its work by block splits each block's
    /// part again by copy, or has one copy do it.
    pub fn copy_idx(&self) -> u32 {
        u32::from(self.global().copy_idx)
    }

    /// How many members of this call's block name this kernel's function id: 1 outside MIX
    /// tasks, up to 3.
    pub fn copy_num(&self) -> u32 {
        u32::from(self.global().copy_num.max(1))
    }

    /// Tensor descriptor `i`, if `i < num_tensors`.
    pub fn tensor(&self, i: usize) -> Option<&'a Tensor> {
        if i >= self.num_tensors {
            return None;
        }
        // SAFETY: slots below the task's tensor count hold addresses of 64-aligned descriptors
        // inside the runtime image, valid for the call.
        Some(unsafe { &*(self.slot(i) as usize as *const Tensor) })
    }

    /// Scalar `j` as its raw 64-bit word (slot `num_tensors + j`).
    pub fn scalar(&self, j: usize) -> Option<u64> {
        let slot = self.num_tensors.checked_add(j)?;
        (slot < LOCAL_CONTEXT_SLOT).then(|| self.slot(slot) as u64)
    }

    /// Scalar `j` unpacked as `T` (the scalar packing of `simpler_types::TaskArgs`).
    pub fn scalar_of<T: Scalar>(&self, j: usize) -> Option<T> {
        self.scalar(j).map(from_scalar::<T>)
    }

    /// The raw value of slot `i` (< 50).
    pub fn raw(&self, i: usize) -> Option<i64> {
        (i < 50).then(|| self.slot(i))
    }

    /// The elements of tensor `i`'s view as a slice, for a contiguous view whose element size
    /// is `T`'s. `None` as well for a null tensor (an optional input the task was not given),
    /// whatever its shape, and for a view not aligned for `T`, which the runtimes both pass
    /// through; an empty view is an empty slice.
    ///
    /// # Safety
    ///
    /// `T` must match the tensor's data type and accept every bit pattern its bytes may hold
    /// (a `bool` over bytes other than 0 and 1 is undefined behaviour), and nothing may write
    /// the same bytes while the slice lives: no other reference, in this or another kernel
    /// running concurrently, and no write through a pointer either (the reference programs'
    /// kernels store every element atomically, which still races the slice's plain reads).
    pub unsafe fn slice<T>(&self, i: usize) -> Option<&'a [T]> {
        let (ptr, len) = self.elements::<T>(i)?;
        if len == 0 {
            return Some(&[]);
        }
        // SAFETY: `elements` checked the pointer non-null and aligned and the length in range;
        // the descriptor names device memory the task was given; the caller guarantees the
        // element type and the absence of concurrent writers.
        Some(unsafe { std::slice::from_raw_parts(ptr, len) })
    }

    /// The elements of tensor `i`'s view as a mutable slice, under the conditions of
    /// [`KernelCall::slice`].
    ///
    /// # Safety
    ///
    /// As [`KernelCall::slice`], and no other live reference may read or write the same bytes
    /// while the returned slice lives. A task on several blocks, or naming the kernel for more
    /// than one core of a mix task, calls it once per block and copy with the same view, on
    /// cores running at the same time: each call must then take only bytes no other call
    /// touches (its own share of the output), never the whole view. The runtimes refuse a task
    /// whose written arguments overlap its others (by tag, or by what the kernel's signature
    /// writes), but cannot tell how the calls of one task split their output.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut<T>(&self, i: usize) -> Option<&'a mut [T]> {
        let (ptr, len) = self.elements::<T>(i)?;
        if len == 0 {
            return Some(&mut []);
        }
        // SAFETY: as in `slice`, plus exclusivity guaranteed by the caller.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr.cast_mut(), len) })
    }

    /// The first element and the element count of tensor `i`'s view, if it is contiguous, of
    /// elements of `T`'s size, and (when not empty) non-null, aligned for `T` and of at most
    /// `isize::MAX` bytes: what a slice over it needs besides valid memory.
    fn elements<T>(&self, i: usize) -> Option<(*const T, usize)> {
        let t = self.tensor(i)?;
        if !t.contiguous() || t.element_size()? != size_of::<T>() as u64 {
            return None;
        }
        let len = usize::try_from(t.numel()).ok()?;
        // A null tensor's view (of an offset, too) names no memory, whatever its data address.
        let ptr = t.data_addr() as usize as *const T;
        let bytes = len.checked_mul(size_of::<T>())?;
        let fits = len == 0
            || (!t.is_null()
                && !ptr.is_null()
                && ptr.is_aligned()
                && bytes <= isize::MAX as usize
                && (ptr as usize).checked_add(bytes).is_some());
        fits.then_some((ptr, len))
    }
}

thread_local! {
    /// Time on the chip the kernel running on this thread declared, in nanoseconds.
    static MODELLED_NS: Cell<u64> = const { Cell::new(0) };
}

/// Declares how long the running kernel takes on the chip (`docs/device-simulator.md`,
/// "Modelled device time"), whatever its host build takes to compute.
///
/// The simulator adds the time to the run's AICore launch, where the declared times of all
/// its kernels on every core add up as if they ran one after another (exact for one kernel or
/// a chain, longer than the chip would take for kernels that run in parallel): the launch's
/// completion, and every event and stream synchronisation behind it, becomes
/// visible to the host no sooner than that long after the launch started, or after the
/// launches ahead of it on the stream ended if that is later. The host build's own compute is
/// hidden inside that time when it is shorter. No simulated thread sleeps or spins for it, as
/// a chip's compute uses no host CPU. Outside a kernel the simulator runs, the call has no
/// effect.
pub fn model_device_time(time: Duration) {
    let ns = u64::try_from(time.as_nanos()).unwrap_or(u64::MAX);
    MODELLED_NS.with(|m| m.set(m.get().saturating_add(ns)));
}

/// Takes the device time declared on this thread since the last call.
pub(crate) fn take_modelled_device_time() -> u64 {
    MODELLED_NS.with(|m| m.replace(0))
}

/// `block_idx` of the running kernel.
///
/// # Safety
///
/// `args` must be the pointer the runtime passed to the running kernel.
pub unsafe fn block_idx(args: *const i64) -> u32 {
    // SAFETY: forwarded contract; no tensor slot is read.
    unsafe { KernelCall::from_raw(args as *mut i64, 0) }.block_idx()
}

/// `block_num` of the running kernel.
///
/// # Safety
///
/// `args` must be the pointer the runtime passed to the running kernel.
pub unsafe fn block_num(args: *const i64) -> u32 {
    // SAFETY: forwarded contract; no tensor slot is read.
    unsafe { KernelCall::from_raw(args as *mut i64, 0) }.block_num()
}

/// `sub_block_id` of the running kernel.
///
/// # Safety
///
/// `args` must be the pointer the runtime passed to the running kernel.
pub unsafe fn sub_block_id(args: *const i64) -> u32 {
    // SAFETY: forwarded contract; no tensor slot is read.
    unsafe { KernelCall::from_raw(args as *mut i64, 0) }.sub_block_id()
}

/// Tensor descriptor `i` of the running kernel.
///
/// # Safety
///
/// `args` must be the pointer the runtime passed to the running kernel and `i` must be below
/// the task's tensor count.
pub unsafe fn tensor<'a>(args: *const i64, i: usize) -> &'a Tensor {
    // SAFETY: slot `i` holds a descriptor address by the caller's contract.
    unsafe { &*(*args.add(i) as usize as *const Tensor) }
}

/// Raw argument slot `i` (< 50) of the running kernel, e.g. a scalar at `T + j`.
///
/// # Safety
///
/// `args` must be the pointer the runtime passed to the running kernel and `i` < 50.
pub unsafe fn scalar(args: *const i64, i: usize) -> u64 {
    // SAFETY: all 50 slots are readable by the caller's contract.
    unsafe { *args.add(i) as u64 }
}

#[cfg(test)]
mod tests {
    use simpler_types::DataType;

    use super::*;

    /// `f` over a kernel call whose only tensor argument is `t`.
    fn with_tensor<R>(t: Tensor, f: impl FnOnce(KernelCall<'_>) -> R) -> R {
        let mut args = [0i64; 50];
        args[0] = &raw const t as i64;
        // SAFETY: `args` outlives the call and slot 0 holds the address of a live descriptor.
        f(unsafe { KernelCall::from_raw(args.as_mut_ptr(), 1) })
    }

    #[test]
    fn a_null_tensor_with_a_shape_gives_no_slice() {
        let null = Tensor::external(0, &[256], DataType::Float32).unwrap();
        // A view at an offset of a null tensor: its data address is not 0.
        let offset = null.slice(0, 4, 8, 1).unwrap();
        assert_ne!(offset.data_addr(), 0);
        for t in [null, offset] {
            // SAFETY: f32 is the tensor's type; nothing else runs.
            assert!(with_tensor(t, |k| unsafe { k.slice::<f32>(0) }.is_none()));
            // SAFETY: as above.
            assert!(with_tensor(t, |k| unsafe { k.slice_mut::<f32>(0) }.is_none()));
        }
    }

    #[test]
    fn a_view_not_aligned_for_its_elements_gives_no_slice() {
        let data = [0f32; 8];
        let odd = Tensor::external(data.as_ptr() as u64 + 1, &[4], DataType::Float32).unwrap();
        // SAFETY: f32 is the tensor's type; nothing writes `data`.
        assert!(with_tensor(odd, |k| unsafe { k.slice::<f32>(0) }.is_none()));
        let even = Tensor::external(data.as_ptr() as u64 + 4, &[4], DataType::Float32).unwrap();
        // SAFETY: as above.
        let got = with_tensor(even, |k| unsafe { k.slice::<f32>(0) }.map(<[f32]>::as_ptr));
        assert_eq!(got, Some(data[1..].as_ptr()));
    }

    #[test]
    fn an_empty_view_gives_an_empty_slice_even_at_address_0() {
        let empty = Tensor::external(0, &[0], DataType::Float32).unwrap();
        // SAFETY: f32 is the tensor's type.
        assert_eq!(with_tensor(empty, |k| unsafe { k.slice::<f32>(0) }.map(<[f32]>::len)), Some(0));
    }
}
