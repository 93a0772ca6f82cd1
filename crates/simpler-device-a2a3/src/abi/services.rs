//! The host services table: what a host that runs the AICPU program itself provides to it.
//!
//! On a chip the AICPU program needs nothing from the host during a launch: registers are MMIO,
//! the counter is the system counter, an idle wait is a bounded spin. When the simulator runs
//! the built program instead of its own copy of the scheduler, the program's register stores
//! must also wake the simulated cores parked on them, and its idle waits must park on the
//! simulator's event counts. The simulator passes this table by address in
//! [`KernelArgs::host_services`](super::launch::KernelArgs::host_services); onboard the field
//! is 0 and the program uses the hardware directly (`docs/onboard-programs.md`).
//!
//! Every function receives `ctx` back unchanged; `thread` is the AICPU thread index the program
//! claimed. Strings are UTF-8 bytes with a length, not NUL-terminated.

use core::ffi::c_void;

use super::launch::InitArgs;

/// The table (C layout, function pointers with the C calling convention).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct HostServices {
    /// Opaque host state passed back to every function.
    pub ctx: *const c_void,
    /// The init arguments of the runner the launch belongs to (a process may run several
    /// simulated devices through one loaded program, so the program's own copy from its init
    /// entry is not used when this table is present).
    pub init: InitArgs,
    /// The 50 MHz counter.
    pub counter: unsafe extern "C" fn(ctx: *const c_void) -> u64,
    /// The epoch of `thread`'s wakeup counter.
    pub wait_epoch: unsafe extern "C" fn(ctx: *const c_void, thread: u32) -> u64,
    /// Spin, then park until the epoch moves past `observed` or the counter reaches `deadline`.
    pub idle_wait: unsafe extern "C" fn(
        ctx: *const c_void,
        thread: u32,
        observed: u64,
        round: u32,
        deadline: u64,
    ),
    /// Called after every store to one of `core`'s registers (wakes a parked core).
    pub notify_core: unsafe extern "C" fn(ctx: *const c_void, core: u32),
    /// Wakes every AICPU thread of the launch.
    pub notify_schedulers: unsafe extern "C" fn(ctx: *const c_void),
    /// `thread` owns `core`, so the core's `COND` writes wake it.
    pub claim_core: unsafe extern "C" fn(ctx: *const c_void, thread: u32, core: u32),
    /// Non-zero when the launch is being torn down.
    pub should_stop: unsafe extern "C" fn(ctx: *const c_void) -> u32,
    /// A log line at `level` (0 error, 1 warn, 2 info, 3 debug).
    pub log: unsafe extern "C" fn(
        ctx: *const c_void,
        thread: u32,
        level: u32,
        msg: *const u8,
        len: usize,
    ),
    /// A fault for the host to report; `core` is a core index or −1.
    pub report_fault: unsafe extern "C" fn(
        ctx: *const c_void,
        thread: u32,
        core: i64,
        msg: *const u8,
        len: usize,
    ),
}
