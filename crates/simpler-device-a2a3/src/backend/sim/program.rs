//! Running the built AICPU program (`SimOptions::aicpu_program`) through its C entries.
//!
//! The program is the shared object the onboard backend installs on a chip, built for the host.
//! Its exec entry gets the launch's argument bytes exactly as onboard (the address of a
//! `KernelArgs`); the only difference is `KernelArgs::host_services`, which points at a
//! [`HostServices`] table whose functions reach the simulator: register stores wake the parked
//! core, idle waits park on the thread's event count, faults and logs go where the compiled-in
//! scheduler's go (`docs/onboard-programs.md`).

use std::ffi::c_void;
use std::path::Path;

use super::loader::SharedObject;
use super::stream::LaunchEntry;
use super::{SimAicpu, SimShared};
use crate::abi::launch::{InitArgs, KernelArgs, RegisterArgs};
use crate::abi::services::HostServices;
use crate::aicpu::{AicpuPlatform, LogLevel};
use crate::error::ObjectError;

/// The program's entry type: the launch's argument bytes in, a result code out.
type EntryFn = unsafe extern "C" fn(args: *const c_void) -> i32;

/// A loaded AICPU program.
#[derive(Debug)]
pub(crate) struct AicpuProgram {
    init: EntryFn,
    exec: EntryFn,
    /// The register entry, which a program built for host_build_graph only may lack.
    register: Option<EntryFn>,
    /// Keeps the entries' code mapped; dropped after every thread that could run it was joined.
    _object: SharedObject,
}

impl AicpuProgram {
    /// Opens the program at `path` and resolves its entries, refusing another ABI version.
    pub(crate) fn open(path: &Path) -> Result<AicpuProgram, ObjectError> {
        // SAFETY: the contract of `RunnerOptions::with_aicpu_program`, the only way to set the
        // path: the object is the host build of this workspace's AICPU program, a Rust cdylib
        // whose initializers are the standard library's.
        let object = unsafe { SharedObject::open(path) }?;
        let version = object.symbol("simpler_aicpu_abi_version")?;
        // SAFETY: the program exports `extern "C" fn() -> u32` under that name.
        let version: extern "C" fn() -> u32 = unsafe { std::mem::transmute(version) };
        let v = version();
        if v != crate::abi::ABI_VERSION {
            return Err(ObjectError::AbiVersion {
                path: path.to_owned(),
                found: v,
                expected: crate::abi::ABI_VERSION,
            });
        }
        // SAFETY: both symbols are `unsafe extern "C" fn(*const c_void) -> i32` in the program
        // (`RunnerOptions::with_aicpu_program`'s contract).
        let init: EntryFn = unsafe { std::mem::transmute(object.symbol("simpler_aicpu_init")?) };
        // SAFETY: as above.
        let exec: EntryFn = unsafe { std::mem::transmute(object.symbol("simpler_aicpu_exec")?) };
        let register = match object.symbol("simpler_aicpu_register_callable") {
            // SAFETY: as above.
            Ok(sym) => Some(unsafe { std::mem::transmute::<*mut c_void, EntryFn>(sym) }),
            Err(_) => None,
        };
        Ok(AicpuProgram { init, exec, register, _object: object })
    }

    /// Runs the register entry on `args` (the launch's argument bytes); `None` when the
    /// program exports no register entry.
    pub(crate) fn register(&self, args: &RegisterArgs) -> Option<i32> {
        // SAFETY: the entry reads a `RegisterArgs` from the pointer, which is one; its reply
        // block and object range are device memory of this simulator, live across the call.
        self.register.map(|entry| unsafe { entry((args as *const RegisterArgs).cast()) })
    }

    /// Runs the init entry with the runner's init arguments.
    pub(crate) fn init(&self, init: &InitArgs) -> i32 {
        // SAFETY: the entry reads an `InitArgs` from the pointer, which is one.
        unsafe { (self.init)((init as *const InitArgs).cast()) }
    }

    /// Runs one exec participant of `entry` whose `KernelArgs` are `args` (already read from
    /// device memory and checked to name a valid image).
    pub(crate) fn exec(
        &self,
        dev: &SimShared,
        entry: &LaunchEntry,
        args: &KernelArgs,
        init: InitArgs,
    ) -> i32 {
        let host = Host { dev, entry };
        let services = HostServices {
            ctx: (&host as *const Host<'_>).cast(),
            init,
            counter,
            wait_epoch,
            idle_wait,
            notify_core,
            notify_schedulers,
            claim_core,
            should_stop,
            log,
            report_fault,
        };
        let mut ka = *args;
        ka.host_services = &services as *const HostServices as u64;
        let bytes = (&ka as *const KernelArgs as u64).to_le_bytes();
        // SAFETY: the argument bytes hold the address of `ka`, a `KernelArgs` whose image was
        // checked by the caller and whose register table is the device's (blocks live as long
        // as the device); `services` and `host` outlive the call, which returns before this
        // frame ends.
        unsafe { (self.exec)(bytes.as_ptr().cast()) }
    }
}

/// What the services' `ctx` points at.
struct Host<'a> {
    dev: &'a SimShared,
    entry: &'a LaunchEntry,
}

/// The simulator platform of AICPU thread `thread`.
///
/// # Safety
///
/// `ctx` is the `Host` of the exec call in progress (`AicpuProgram::exec`).
unsafe fn platform<'a>(ctx: *const c_void, thread: u32) -> SimAicpu<'a> {
    // SAFETY: the caller's contract.
    let h = unsafe { &*ctx.cast::<Host<'a>>() };
    let thread = thread.min(crate::abi::MAX_AICPU_THREADS - 1);
    SimAicpu::new(h.dev, h.entry, thread)
}

/// # Safety
///
/// `msg`, unless null, points at `len` readable bytes.
unsafe fn text<'a>(msg: *const u8, len: usize) -> std::borrow::Cow<'a, str> {
    if msg.is_null() {
        return "".into();
    }
    // SAFETY: the caller's contract.
    String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(msg, len) })
}

/// # Safety (of every service below)
///
/// `ctx` is the `Host` of the exec call in progress; `msg`, if any, points at `len` readable
/// bytes.
unsafe extern "C" fn counter(ctx: *const c_void) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { platform(ctx, 0) }.counter()
}

unsafe extern "C" fn wait_epoch(ctx: *const c_void, thread: u32) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { platform(ctx, thread) }.wait_epoch()
}

unsafe extern "C" fn idle_wait(
    ctx: *const c_void,
    thread: u32,
    observed: u64,
    round: u32,
    deadline: u64,
) {
    // SAFETY: the caller's contract.
    unsafe { platform(ctx, thread) }.idle_wait(observed, round, deadline)
}

unsafe extern "C" fn notify_core(ctx: *const c_void, core: u32) {
    // SAFETY: the caller's contract.
    let p = unsafe { platform(ctx, 0) };
    if let Some(b) = p.dev.regs.get(core as usize) {
        // A kernel served here runs inside this callback: a panic must not cross the C
        // boundary (kernel panics are caught at the kernel; this guards the simulator's own).
        let rung =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.dev.ring_core(core, b)));
        if rung.is_err() {
            b.wake.notify();
        }
    }
}

unsafe extern "C" fn notify_schedulers(ctx: *const c_void) {
    // SAFETY: the caller's contract.
    unsafe { platform(ctx, 0) }.notify_schedulers()
}

unsafe extern "C" fn claim_core(ctx: *const c_void, thread: u32, core: u32) {
    // SAFETY: the caller's contract.
    unsafe { platform(ctx, thread) }.claim_core(core)
}

unsafe extern "C" fn should_stop(ctx: *const c_void) -> u32 {
    // SAFETY: the caller's contract.
    u32::from(unsafe { platform(ctx, 0) }.should_stop())
}

unsafe extern "C" fn log(ctx: *const c_void, thread: u32, level: u32, msg: *const u8, len: usize) {
    let level = match level {
        0 => LogLevel::Error,
        1 => LogLevel::Warn,
        2 => LogLevel::Info,
        _ => LogLevel::Debug,
    };
    // SAFETY: the caller's contract.
    let (p, line) = unsafe { (platform(ctx, thread), text(msg, len)) };
    p.log(level, format_args!("{line}"))
}

unsafe extern "C" fn report_fault(
    ctx: *const c_void,
    thread: u32,
    core: i64,
    msg: *const u8,
    len: usize,
) {
    let core = u32::try_from(core).ok();
    // SAFETY: the caller's contract.
    let (p, line) = unsafe { (platform(ctx, thread), text(msg, len)) };
    p.report_fault(core, format_args!("{line}"))
}
