//! Running the C++ AICore executor (`SimOptions::aicore_executor`) on the simulated cores.
//!
//! The executor is the code written for the AICore (`simpler-onboard-programs/aicore`), built
//! for the host with its platform header mapped onto this simulator: its register window is the
//! core's register block (registers at their MMIO offsets), and the parts only the simulator can
//! do (parking on the block's event count, waking the AICPU owner of `COND`, the fault plan and
//! the kernel call with its panic boundary) are the callbacks of [`HostCore`]. This module binds
//! that record for one core of a launch to the calling thread and calls the kernel entry of the
//! core's role (`aicore_kernel_0_mix_aic` / `_aiv`) with the launch argument, as CANN launches
//! it on a chip; the entry derives its core index, handshake record and swimlane block itself.
//! The argument block and image are checked here first (a bad address would be a fault on the
//! chip, and must not be a wild read of host memory).

use std::ffi::c_void;
use std::path::Path;

use super::aicore::{CoreHost, call_kernel, kernel_failure};
use super::loader::SharedObject;
use super::regs::RegBlock;
use super::stream::LaunchEntry;
use super::wait::SpinPolicy;
use crate::abi::codes::AclCode;
use crate::abi::{CorePlace, CoreType};

/// The executor's result when the launch was torn down under it.
const EXECUTOR_ABORTED: i32 = -1;

/// One simulated core as the executor's host platform sees it (C layout, mirrored by
/// `aicore_platform_host.h`): its hardware ids, register window, result and callbacks.
#[repr(C)]
struct HostCore {
    ctx: *const c_void,
    window: u64,
    block_idx: u32,
    block_num: u32,
    subblock_id: u32,
    subblock_dim: u32,
    physical_core_id: u32,
    result: i32,
    epoch: unsafe extern "C" fn(*const c_void) -> u64,
    idle: unsafe extern "C" fn(*const c_void, u64, u32),
    should_stop: unsafe extern "C" fn(*const c_void) -> u32,
    write_cond: unsafe extern "C" fn(*const c_void, u32),
    counter: unsafe extern "C" fn(*const c_void) -> u64,
    report_in: unsafe extern "C" fn(*const c_void),
    call_kernel: unsafe extern "C" fn(*const c_void, u64, u32, u64, *mut i64) -> i32,
}

/// The kernel entries of the cube and the vector role, as CANN launches them (the names
/// `simpler_onboard_programs::AICORE_ROLES` gives: the `aicore_executor` test opens the
/// host build through them).
const ENTRIES: [&str; 2] = ["aicore_kernel_0_mix_aic", "aicore_kernel_0_mix_aiv"];
/// The host build's per-thread core binding.
const BIND_ENTRY: &str = "simpler_aicore_bind";

type BindFn = unsafe extern "C" fn(core: *mut HostCore);
type EntryFn = unsafe extern "C" fn(kernel_args: u64);

/// The loaded host build of the C++ executor.
#[derive(Debug)]
pub(crate) struct CxxExecutor {
    bind: BindFn,
    /// The kernel entries of the cube and the vector role.
    aic: EntryFn,
    aiv: EntryFn,
    /// Keeps the code mapped; dropped after every simulated thread was joined.
    _object: SharedObject,
}

impl CxxExecutor {
    /// Opens the executor at `path` and resolves its binding and both kernel entries.
    pub(crate) fn open(path: &Path) -> Result<CxxExecutor, crate::error::ObjectError> {
        // SAFETY: the contract of `RunnerOptions::with_aicore_executor`, the only way to set the
        // path: the object is the host build of this project's C++ executor, which has no
        // static constructors.
        let object = unsafe { SharedObject::open(path) }?;
        let [aic, aiv] = ENTRIES.map(|e| object.symbol(e));
        let bind = object.symbol(BIND_ENTRY)?;
        // SAFETY: the binding is `extern "C" void simpler_aicore_bind(simpler_host_core *)`;
        // the entries are `extern "C" void aicore_kernel_0_mix_*(uint64_t)` in the host build
        // (`RunnerOptions::with_aicore_executor`'s contract).
        unsafe {
            Ok(CxxExecutor {
                bind: std::mem::transmute::<*mut c_void, BindFn>(bind),
                aic: std::mem::transmute::<*mut c_void, EntryFn>(aic?),
                aiv: std::mem::transmute::<*mut c_void, EntryFn>(aiv?),
                _object: object,
            })
        }
    }
}

/// What the callbacks' `ctx` points at.
struct Ctx<'a, H: CoreHost> {
    dev: &'a H,
    entry: &'a LaunchEntry,
    regs: &'a RegBlock,
    w: u32,
    place: CorePlace,
    spin: SpinPolicy<'a>,
}

/// The context `p` names.
///
/// # Safety
///
/// `p` is the `Ctx<H>` of a `run_core` call in progress (the executor passes back the pointer
/// `run_core` bound), and the reference is used only during that call.
unsafe fn ctx<'a, H: CoreHost>(p: *const c_void) -> &'a Ctx<'a, H> {
    // SAFETY: the caller's contract.
    unsafe { &*p.cast::<Ctx<'a, H>>() }
}

// The callbacks of `HostCore`. Safety of each: `p` is the `Ctx<H>` of a `run_core` call in
// progress; the executor calls them only during the `run_core` call that bound it.

/// [`HostCore::epoch`]. Safety: as for every callback (above).
unsafe extern "C" fn epoch<H: CoreHost>(p: *const c_void) -> u64 {
    // SAFETY: the callbacks' contract.
    unsafe { ctx::<H>(p) }.regs.wake.epoch()
}

/// [`HostCore::idle`]. Safety: as for every callback (above).
unsafe extern "C" fn idle<H: CoreHost>(p: *const c_void, observed: u64, round: u32) {
    // SAFETY: the callbacks' contract.
    let c = unsafe { ctx::<H>(p) };
    c.spin.backoff(round, &c.regs.wake, observed, None);
}

/// [`HostCore::should_stop`]. Safety: as for every callback (above).
unsafe extern "C" fn should_stop<H: CoreHost>(p: *const c_void) -> u32 {
    // SAFETY: the callbacks' contract.
    let c = unsafe { ctx::<H>(p) };
    u32::from(c.dev.is_reset() || c.entry.is_aborted())
}

/// [`HostCore::write_cond`]. Safety: as for every callback (above).
unsafe extern "C" fn write_cond<H: CoreHost>(p: *const c_void, v: u32) {
    // SAFETY: the callbacks' contract.
    let c = unsafe { ctx::<H>(p) };
    c.dev.store_cond(c.w, v);
}

/// [`HostCore::counter`]. Safety: as for every callback (above).
unsafe extern "C" fn counter<H: CoreHost>(p: *const c_void) -> u64 {
    // SAFETY: the callbacks' contract.
    unsafe { ctx::<H>(p) }.dev.ticks()
}

/// [`HostCore::report_in`]. Safety: as for every callback (above).
unsafe extern "C" fn report_in<H: CoreHost>(p: *const c_void) {
    // SAFETY: the callbacks' contract.
    unsafe { ctx::<H>(p) }.dev.notify_all_aicpu();
}

/// [`HostCore::call_kernel`]. Safety: as for every callback (above).
unsafe extern "C" fn kernel<H: CoreHost>(
    p: *const c_void,
    kernel: u64,
    func_id: u32,
    task_id: u64,
    args: *mut i64,
) -> i32 {
    // SAFETY: the callbacks' contract.
    let c = unsafe { ctx::<H>(p) };
    // SAFETY: the executor passes the kernel address and argument array of the payload it
    // dispatches, from the image `run_core` checked.
    let outcome = unsafe { call_kernel(c.dev, c.entry, c.regs, c.w, kernel, func_id, args) };
    kernel_failure(c.dev, (c.w, c.place.core_type), func_id, task_id, outcome).unwrap_or(0)
}

/// Runs core `w` of an AICore launch entry through the C++ executor; returns 0 or the device
/// code of its fault.
pub(crate) fn run_core<H: CoreHost>(
    dev: &H,
    entry: &LaunchEntry,
    w: u32,
    exe: &CxxExecutor,
) -> i32 {
    let Some(args) = dev.read_kernel_args(entry.args) else {
        return AclCode::AICORE_EXCEPTION.get();
    };
    let Some(place) = CorePlace::of(w, args.block_dim) else {
        return 0;
    };
    let (Some(_image), Some(regs)) = (dev.core_image_view(&args), dev.regs(w)) else {
        return AclCode::AICORE_EXCEPTION.get();
    };
    // The hardware ids of core `w`: AIC `k` is block `k`; the AIV at `B + j` is sub-block
    // `j % 2` of block `j / 2`.
    let (block_idx, subblock_id, subblock_dim) = match place.core_type {
        CoreType::Aic => (place.cluster, 0, 1),
        CoreType::Aiv => (place.cluster, place.sub_block, 2),
    };
    let c = Ctx { dev, entry, regs, w, place, spin: dev.spin_policy() };
    let mut core = HostCore {
        ctx: (&c as *const Ctx<'_, H>).cast(),
        window: regs.window_base(),
        block_idx,
        block_num: args.block_dim,
        subblock_id,
        subblock_dim,
        physical_core_id: dev.faults().on_handshake(w).unwrap_or(w),
        result: 0,
        epoch: epoch::<H>,
        idle: idle::<H>,
        should_stop: should_stop::<H>,
        write_cond: write_cond::<H>,
        counter: counter::<H>,
        report_in: report_in::<H>,
        call_kernel: kernel::<H>,
    };
    let entry_fn = match place.core_type {
        CoreType::Aic => exe.aic,
        CoreType::Aiv => exe.aiv,
    };
    // SAFETY: `core` and `c` outlive the call, and the binding is cleared before `core` goes
    // away. The argument block and the image it names were checked above and are memory of
    // the device, alive while the launch runs; the entry reads the handshake record, swimlane
    // block and payload pairs inside that image, and payloads only after acquiring the token
    // that published them, as the Rust executor does.
    unsafe {
        (exe.bind)(&mut core);
        entry_fn(entry.args);
        (exe.bind)(std::ptr::null_mut());
    }
    match core.result {
        EXECUTOR_ABORTED => AclCode::TASK_ABORT.get(),
        code => code,
    }
}
