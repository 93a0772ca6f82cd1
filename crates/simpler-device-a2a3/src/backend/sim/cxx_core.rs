//! Running the C++ AICore executor (`SimOptions::aicore_executor`) on the simulated cores.
//!
//! The executor is the code written for the AICore (`simpler-onboard-programs/aicore`), built
//! for the host with its platform header mapped onto this simulator: its register window is the
//! core's register block (registers at their MMIO offsets), and the parts only the simulator can
//! do (parking on the block's event count, waking the AICPU owner of `COND`, the fault plan and
//! the kernel call with its panic boundary) are the callbacks of [`CoreEnv`]. This module builds
//! that environment for one core of a launch and calls the executor's entry; the preamble
//! (argument block, core place, image view) is the one of the Rust executor.

use std::ffi::c_void;
use std::path::Path;

use simpler_types::DeviceTaskId;

use super::aicore::{CoreHost, KernelOutcome, call_kernel};
use super::loader::SharedObject;
use super::regs::RegBlock;
use super::stream::LaunchEntry;
use super::wait::SpinPolicy;
use crate::abi::CorePlace;
use crate::abi::codes::AclCode;
use crate::abi::launch::PROFILE_SWIMLANE;
use crate::error::{CoreFault, StreamKind};

/// The executor's result when the launch was torn down under it.
const EXECUTOR_ABORTED: i32 = -1;

/// The environment of one core (C layout, mirrored by `aicore_platform_host.h`).
#[repr(C)]
struct CoreEnv {
    ctx: *const c_void,
    window: u64,
    handshake: u64,
    swimlane_header: u64,
    swimlane_records: u64,
    swimlane_capacity: u32,
    core_index: u32,
    core_type: u32,
    physical_core_id: u32,
    epoch: extern "C" fn(*const c_void) -> u64,
    idle: extern "C" fn(*const c_void, u64, u32),
    should_stop: extern "C" fn(*const c_void) -> u32,
    write_cond: extern "C" fn(*const c_void, u32),
    counter: extern "C" fn(*const c_void) -> u64,
    report_in: extern "C" fn(*const c_void),
    call_kernel: extern "C" fn(*const c_void, u64, u32, u64, *mut i64) -> i32,
}

type ExecuteFn = unsafe extern "C" fn(env: *const CoreEnv) -> i32;

/// The loaded host build of the C++ executor.
#[derive(Debug)]
pub(crate) struct CxxExecutor {
    execute: ExecuteFn,
    /// Keeps the code mapped; dropped after every simulated thread was joined.
    _object: SharedObject,
}

impl CxxExecutor {
    /// Opens the executor at `path` and resolves its entry.
    pub(crate) fn open(path: &Path) -> Result<CxxExecutor, String> {
        // SAFETY: the executor is C++ of this project without static constructors.
        let object = unsafe { SharedObject::open(path) }?;
        let sym = object.symbol("simpler_aicore_execute")?;
        // SAFETY: the entry is `extern "C" int32_t simpler_aicore_execute(const env *)`.
        let execute: ExecuteFn = unsafe { std::mem::transmute(sym) };
        Ok(CxxExecutor { execute, _object: object })
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

fn ctx<'a, H: CoreHost>(p: *const c_void) -> &'a Ctx<'a, H> {
    // SAFETY: `p` is the `Ctx` of the `run_core` call in progress, which outlives the
    // executor's call.
    unsafe { &*p.cast::<Ctx<'a, H>>() }
}

extern "C" fn epoch<H: CoreHost>(p: *const c_void) -> u64 {
    ctx::<H>(p).regs.wake.epoch()
}

extern "C" fn idle<H: CoreHost>(p: *const c_void, observed: u64, round: u32) {
    let c = ctx::<H>(p);
    c.spin.backoff(round, &c.regs.wake, observed, None);
}

extern "C" fn should_stop<H: CoreHost>(p: *const c_void) -> u32 {
    let c = ctx::<H>(p);
    u32::from(c.dev.is_reset() || c.entry.is_aborted())
}

extern "C" fn write_cond<H: CoreHost>(p: *const c_void, v: u32) {
    let c = ctx::<H>(p);
    c.dev.store_cond(c.w, v);
}

extern "C" fn counter<H: CoreHost>(p: *const c_void) -> u64 {
    ctx::<H>(p).dev.ticks()
}

extern "C" fn report_in<H: CoreHost>(p: *const c_void) {
    ctx::<H>(p).dev.notify_all_aicpu();
}

extern "C" fn kernel<H: CoreHost>(
    p: *const c_void,
    kernel: u64,
    func_id: u32,
    task_id: u64,
    args: *mut i64,
) -> i32 {
    let c = ctx::<H>(p);
    let (message, code) = match call_kernel(c.dev, c.entry, c.regs, c.w, kernel, func_id, args) {
        KernelOutcome::Finished => return 0,
        KernelOutcome::Faulted(m) => (m, AclCode::AICORE_EXCEPTION),
        KernelOutcome::Hung => {
            ("kernel hung until the op-execute watchdog fired".to_owned(), AclCode::AICORE_TIMEOUT)
        }
    };
    c.dev.record_fault(CoreFault {
        code,
        stream: StreamKind::AiCore,
        core: Some((c.w, c.place.core_type)),
        func_id: Some(func_id),
        task: Some(DeviceTaskId(task_id)),
        message,
        at_ticks: c.dev.ticks(),
    });
    code.get()
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
    let (Some(view), Some(regs)) = (dev.core_image_view(&args), dev.regs(w)) else {
        return AclCode::AICORE_EXCEPTION.get();
    };
    let swimlane = args.profiling & PROFILE_SWIMLANE != 0 && view.header().swimlane_capacity > 0;
    let (sw_header, sw_records) = if swimlane {
        let (h, r) = view.swimlane(w);
        (h as *const _ as u64, r as u64)
    } else {
        (0, 0)
    };
    let c = Ctx { dev, entry, regs, w, place, spin: dev.spin_policy() };
    let env = CoreEnv {
        ctx: (&c as *const Ctx<'_, H>).cast(),
        window: regs.window_base(),
        handshake: view.handshake(w) as *const _ as u64,
        swimlane_header: sw_header,
        swimlane_records: sw_records,
        swimlane_capacity: if swimlane { view.header().swimlane_capacity } else { 0 },
        core_index: w,
        core_type: place.core_type as u32,
        physical_core_id: dev.faults().on_handshake(w).unwrap_or(w),
        epoch: epoch::<H>,
        idle: idle::<H>,
        should_stop: should_stop::<H>,
        write_cond: write_cond::<H>,
        counter: counter::<H>,
        report_in: report_in::<H>,
        call_kernel: kernel::<H>,
    };
    // SAFETY: `env` and `c` outlive the call; the window, handshake record, swimlane buffers
    // and payload pairs it names are memory of the device, alive while the launch runs. The
    // executor reads payloads only after acquiring the token that published them, as the Rust
    // executor does.
    match unsafe { (exe.execute)(&env) } {
        EXECUTOR_ABORTED => AclCode::TASK_ABORT.get(),
        code => code,
    }
}
