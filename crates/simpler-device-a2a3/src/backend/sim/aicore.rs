//! The simulated AICore executor: one core's side of the handshake and dispatch protocol
//! (`docs/device-handshake.md` steps 2, 3, 5, 7 and 11).
//!
//! 1. Write `physical_core_id` (the core index) and `core_type`, then `aicore_done = index +
//!    1` (release), without waiting.
//! 2. Wait until the low half of `DATA_MAIN_BASE` is non-zero: the window is open.
//! 3. Write `COND = IDLE_VALUE`, read `task` (acquire), set `last = AICPU idle`.
//! 4. Loop: read the low half `v`. Exit signal → `COND = EXITED_VALUE`, return. AICPU idle or
//!    `v == last` → wait. Otherwise select payload `v & 1`; if it is gated, wait for the doorbell
//!    (high half == `v`) or the exit signal (exit wins); `COND = ACK(v)`; call the kernel;
//!    `last = v`; record swimlane timing; `COND = FIN(v)`.
//! 5. A kernel that faults (a panic, or an injected fault) reports the fault and returns without
//!    FIN; an injected hang parks until the entry is aborted (op-execute watchdog) or the device
//!    resets.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use simpler_types::DeviceTaskId;

use super::faults::{FaultPlan, KernelAction};
use super::regs::RegBlock;
use super::stream::LaunchEntry as SimLaunch;
use super::wait::SpinPolicy;
use crate::abi::codes::AclCode;
use crate::abi::handshake::Handshake;
use crate::abi::image::{SwimlaneHeader, SwimlaneRecord};
use crate::abi::launch::KernelArgs;
use crate::abi::launch::PROFILE_SWIMLANE;
use crate::abi::payload::DispatchPayload;
use crate::abi::regs::{AICPU_IDLE, Cond, EXIT_SIGNAL, EXITED_VALUE, IDLE_VALUE, RegId};
use crate::abi::{CorePlace, CoreType};
use crate::aicpu::view::CoreImageView;
use crate::error::{CoreFault, StreamKind};
use crate::kernel::KernelFn;

/// What a simulated core needs from its device. The device's shared state implements it, so
/// this module depends on its sibling modules only, never on the device module that runs it.
pub(crate) trait CoreHost {
    /// Whether the device is being reset (every wait gives up).
    fn is_reset(&self) -> bool;
    /// The virtual 50 MHz counter.
    fn ticks(&self) -> u64;
    /// The `KernelArgs` at device address `addr`, if it is tracked memory.
    fn read_kernel_args(&self, addr: u64) -> Option<KernelArgs>;
    /// A core's view of the launch's runtime image.
    fn core_image_view(&self, args: &KernelArgs) -> Option<CoreImageView<'_>>;
    /// Core `c`'s register block.
    fn regs(&self, c: u32) -> Option<&RegBlock>;
    /// The spin policy of the current launch.
    fn spin_policy(&self) -> SpinPolicy<'_>;
    /// The device's fault plan.
    fn faults(&self) -> &FaultPlan;
    /// Records a fault for the host to report with the run's error.
    fn record_fault(&self, fault: CoreFault);
    /// Stores `COND` of core `c` and wakes the AICPU thread that owns it.
    fn store_cond(&self, c: u32, v: u32);
    /// Wakes every AICPU thread.
    fn notify_all_aicpu(&self);
}

/// What the loop does with an observed low-half value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Answer the exit signal and leave.
    Exit,
    /// Nothing new: wait.
    Wait,
    /// Run token `v`.
    Run,
}

/// Step 4's decision for low-half value `v` given the last token run.
pub(crate) fn step_for(v: u32, last: u32) -> Step {
    if v == EXIT_SIGNAL {
        Step::Exit
    } else if v == AICPU_IDLE || v == last {
        Step::Wait
    } else {
        Step::Run
    }
}

/// The decision while a gated payload waits for its doorbell: exit wins over a doorbell.
pub(crate) fn doorbell_step(low: u32, high: u32, v: u32) -> Step {
    if low == EXIT_SIGNAL {
        Step::Exit
    } else if high == v {
        Step::Run
    } else {
        Step::Wait
    }
}

/// How a simulated kernel ended.
pub(crate) enum KernelOutcome {
    Finished,
    /// The kernel faulted; the text becomes the core fault's `CoreFault::message` (a panic's
    /// payload is text only).
    Faulted(String),
    Hung,
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "kernel panicked".to_owned()
    }
}

/// Records a fault of core `core` (with the func id and device task id of the kernel it ran,
/// if any) for the host to report; returns its device code.
pub(crate) fn record_core_fault<H: CoreHost>(
    dev: &H,
    code: AclCode,
    core: (u32, CoreType),
    kernel: Option<(u32, u64)>,
    message: String,
) -> i32 {
    dev.record_fault(CoreFault {
        code,
        stream: StreamKind::AiCore,
        core: Some(core),
        func_id: kernel.map(|(f, _)| f),
        task: kernel.map(|(_, t)| DeviceTaskId(t)),
        message,
        at_ticks: dev.ticks(),
    });
    code.get()
}

/// Records a kernel call that did not finish as core `core`'s fault; returns its device code,
/// or `None` when the kernel finished.
pub(crate) fn kernel_failure<H: CoreHost>(
    dev: &H,
    core: (u32, CoreType),
    func_id: u32,
    task_id: u64,
    outcome: KernelOutcome,
) -> Option<i32> {
    let (message, code) = match outcome {
        KernelOutcome::Finished => return None,
        KernelOutcome::Faulted(m) => (m, AclCode::AICORE_EXCEPTION),
        KernelOutcome::Hung => {
            ("kernel hung until the op-execute watchdog fired".to_owned(), AclCode::AICORE_TIMEOUT)
        }
    };
    Some(record_core_fault(dev, code, core, Some((func_id, task_id)), message))
}

/// A core's part in the AICore launch it serves, from step 1 until it leaves. It lives in the
/// core's register block under a lock (`RegBlock::serving`); whoever holds the lock advances
/// it: the core's own thread, or an AICPU thread that just wrote one of the core's registers
/// (`drive.rs`; `docs/device-simulator.md`, "Who runs a dispatch").
#[derive(Debug)]
pub(crate) struct CoreLaunch {
    /// The entry the core's participant belongs to.
    pub(super) entry: Arc<SimLaunch>,
    w: u32,
    pub(super) core_type: CoreType,
    /// Whether the core's own thread drives the launch (it was posted the launch, or adopted
    /// it); otherwise AICPU threads do while the thread sits on its mailbox.
    pub(super) threaded: bool,
    /// Step 3 is done: the window is open.
    open: bool,
    /// The core's handshake record and the payload pair address its `task` must hold.
    hs: *const Handshake,
    pair: u64,
    /// The last token served.
    last: u32,
    /// The core's two payload buffers in the launch's image.
    payloads: [*mut DispatchPayload; 2],
    /// The core's swimlane header and records, when the launch records a swimlane.
    swimlane: Option<(*const SwimlaneHeader, *mut SwimlaneRecord)>,
    swimlane_capacity: u32,
    /// The code a threaded launch ends with, set when an AICPU thread serving one of its
    /// tokens saw the kernel fail (the core's thread then leaves with it).
    pub(super) ended: Option<i32>,
    /// Whether every kernel an AICPU thread served for this launch returned within the limit
    /// it was served under ([`Server::Aicpu`]); once one did not, the core's thread serves the
    /// rest.
    pub(super) short_kernels: bool,
}

/// The longest kernel an AICPU thread runs for want of other work ([`Server::LONE`]).
pub(crate) const LONE_KERNEL_LIMIT: Duration = Duration::from_micros(100);

/// Who may serve a core's token in an [`advance`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Server {
    /// Nobody here: a token needs the core's thread (the move declines it).
    Nobody,
    /// The core's own thread, which may wait for a gated payload's doorbell.
    CoreThread,
    /// The AICPU thread that wrote the core's registers, which may not wait. An AICPU thread
    /// inside a kernel neither polls its other cores nor watches for stalls, so a kernel that
    /// runs longer than `limit` sends the core's later tokens of the launch to its thread.
    /// With `proven`, only a kernel whose last run on this core returned within `limit`: a
    /// kernel new to the core, which might never return, stays where the stall watchdog can
    /// see it.
    Aicpu { limit: Duration, proven: bool },
}

impl Server {
    /// An AICPU thread serving because every host core is taken by an awake simulated thread
    /// (`docs/device-simulator.md`, "Who runs a dispatch"). Proven kernels only: a kernel new
    /// to the core that never returns would hold the thread that watches for stalls.
    pub(crate) const BUSY_HOST: Server =
        Server::Aicpu { limit: Duration::from_millis(1), proven: true };
    /// An AICPU thread serving its only dispatch in flight when it had nothing else to do. A
    /// newly ready task for its other cores waits for the kernel, so the limit is a few
    /// wake-ups of a parked thread on a virtual machine, the cost serving here saves.
    pub(crate) const LONE: Server = Server::Aicpu { limit: LONE_KERNEL_LIMIT, proven: true };
}

// SAFETY: the pointers address the launch's image, which stays alive while the core's
// participant runs; the state is only reached through the block's lock, and whoever ends the
// participant removes it first.
unsafe impl Send for CoreLaunch {}

/// Why a core's launch state could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unprepared {
    /// The launch does not use the core: its participant ends at once with 0.
    NotUsed,
    /// The launch's argument block is not device memory.
    NoArgs,
    /// The launch names no valid runtime image.
    NoImage(CoreType),
}

impl Unprepared {
    /// Records the fault (if any) and returns the code the core's participant ends with.
    pub(crate) fn end<H: CoreHost>(self, dev: &H, w: u32) -> i32 {
        match self {
            Unprepared::NotUsed => 0,
            Unprepared::NoArgs => AclCode::AICORE_EXCEPTION.get(),
            Unprepared::NoImage(core_type) => record_core_fault(
                dev,
                AclCode::AICORE_EXCEPTION,
                (w, core_type),
                None,
                "the launch names no valid runtime image".into(),
            ),
        }
    }
}

/// Reads core `w`'s view of `entry` for step 1.
pub(crate) fn prepare<H: CoreHost>(
    dev: &H,
    entry: &Arc<SimLaunch>,
    w: u32,
    threaded: bool,
) -> Result<CoreLaunch, Unprepared> {
    let args = dev.read_kernel_args(entry.args).ok_or(Unprepared::NoArgs)?;
    let place = CorePlace::of(w, args.block_dim).ok_or(Unprepared::NotUsed)?;
    let view = dev.core_image_view(&args).ok_or(Unprepared::NoImage(place.core_type))?;
    // The image's records are for its own launch shape: a core it has no record for must not
    // take another core's (the view clamps indices into its records).
    let h = view.header();
    if h.block_dim != args.block_dim || h.num_aicore != args.num_aicore {
        return Err(Unprepared::NoImage(place.core_type));
    }
    let swimlane = args.profiling & PROFILE_SWIMLANE != 0 && h.swimlane_capacity > 0;
    let (lane, records) = view.swimlane(w);
    Ok(CoreLaunch {
        entry: entry.clone(),
        w,
        core_type: place.core_type,
        threaded,
        open: false,
        hs: view.handshake(w),
        pair: view.payload_pair_addr(w),
        last: AICPU_IDLE,
        payloads: [view.payload_ptr(w, 0), view.payload_ptr(w, 1)],
        swimlane: swimlane.then_some((lane as *const SwimlaneHeader, records)),
        swimlane_capacity: view.header().swimlane_capacity,
        ended: None,
        short_kernels: true,
    })
}

impl CoreLaunch {
    fn handshake(&self) -> &Handshake {
        // SAFETY: the core's record in the launch's image, alive while the launch is (above).
        unsafe { &*self.hs }
    }

    /// Step 1: reports in.
    pub(crate) fn report_in<H: CoreHost>(&self, dev: &H) {
        let hs = self.handshake();
        let phys = dev.faults().on_handshake(self.w).unwrap_or(self.w);
        hs.physical_core_id.store(phys, Ordering::Relaxed);
        hs.core_type.store(self.core_type as u32, Ordering::Relaxed);
        // Release: the AICPU acquires `aicore_done` and then reads the two fields above.
        hs.aicore_done.store(self.w + 1, Ordering::Release);
        dev.notify_all_aicpu();
    }
}

/// What one move of a core's launch did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Moved {
    /// Opened the window or served a token; look again.
    Progress,
    /// Nothing to do until a register changes.
    Wait,
    /// A token is waiting that this mover may not serve (or a gated one it may not wait for).
    Declined,
    /// The core's participant ends with this code.
    Ended(i32),
}

/// Advances `l` by one move without waiting for anything but, for the core's own thread, a
/// gated payload's doorbell: step 2's check and step 3 once the window opened, then step 4
/// (a token, or the exit signal). A token is served when `server` may serve it.
pub(crate) fn advance<H: CoreHost>(
    dev: &H,
    regs: &RegBlock,
    l: &mut CoreLaunch,
    server: Server,
) -> Moved {
    if let Some(code) = l.ended {
        return Moved::Ended(code);
    }
    let v = regs.load(RegId::DataMainBaseLow);
    if !l.open {
        return match v {
            0 => Moved::Wait,
            // The AICPU gave up before opening the window (a handshake failure) and asks this
            // core to leave: answer without touching the payload.
            EXIT_SIGNAL => {
                dev.store_cond(l.w, EXITED_VALUE);
                Moved::Ended(0)
            }
            _ => open_window(dev, l),
        };
    }
    match step_for(v, l.last) {
        Step::Exit => {
            dev.store_cond(l.w, EXITED_VALUE);
            Moved::Ended(0)
        }
        Step::Wait => Moved::Wait,
        Step::Run if server == Server::Nobody => Moved::Declined,
        Step::Run if matches!(server, Server::Aicpu { .. }) && !l.short_kernels => Moved::Declined,
        Step::Run => match serve(dev, regs, l, v, server) {
            Served::Done => Moved::Progress,
            Served::Declined => Moved::Declined,
            Served::Ended(code) => Moved::Ended(code),
        },
    }
}

/// Step 3.
fn open_window<H: CoreHost>(dev: &H, l: &mut CoreLaunch) -> Moved {
    dev.store_cond(l.w, IDLE_VALUE);
    let pair = l.handshake().task.load(Ordering::Acquire);
    if pair != l.pair {
        return Moved::Ended(record_core_fault(
            dev,
            AclCode::AICORE_EXCEPTION,
            (l.w, l.core_type),
            None,
            format!("handshake task address {pair:#x} is not this core's payload pair"),
        ));
    }
    l.open = true;
    Moved::Progress
}

/// What serving one token did.
enum Served {
    /// ACK, kernel, FIN.
    Done,
    /// Nothing: the payload is gated and this server may not wait.
    Declined,
    /// The core's participant ends with this code (a fault without FIN, exit, or abort).
    Ended(i32),
}

/// Serves token `v` of the core whose state is `s` (step 4 from the payload read to FIN).
fn serve<H: CoreHost>(
    dev: &H,
    regs: &RegBlock,
    s: &mut CoreLaunch,
    v: u32,
    server: Server,
) -> Served {
    let w = s.w;
    let p = s.payloads[(v & 1) as usize];
    // SAFETY: the AICPU filled payload `v & 1` before storing `v` (release), which was loaded
    // with acquire; it does not write the payload again until this token is ACKed or FINed.
    // Only plain fields are read, by value.
    let (kernel, src, task_id, func_id, block_idx) = unsafe {
        (
            std::ptr::addr_of!((*p).kernel).read(),
            std::ptr::addr_of!((*p).src_payload).read(),
            std::ptr::addr_of!((*p).task_id).read(),
            std::ptr::addr_of!((*p).func_id).read(),
            std::ptr::addr_of!((*p).local.block_idx).read(),
        )
    };
    if let Server::Aicpu { limit, proven: true } = server
        && !regs.kernel_times.ran_within(kernel, limit)
    {
        return Served::Declined;
    }
    if src != 0 {
        if server != Server::CoreThread {
            return Served::Declined;
        }
        // Gated early dispatch (reserved): wait for the doorbell; exit wins.
        let stop = || dev.is_reset() || s.entry.is_aborted();
        let mut gate_round = 0u32;
        loop {
            let e = regs.wake.epoch();
            match doorbell_step(
                regs.load(RegId::DataMainBaseLow),
                regs.load(RegId::DataMainBaseHigh),
                v,
            ) {
                Step::Exit => {
                    dev.store_cond(w, EXITED_VALUE);
                    return Served::Ended(0);
                }
                Step::Run => break,
                Step::Wait if stop() => return Served::Ended(AclCode::TASK_ABORT.get()),
                Step::Wait => {
                    dev.spin_policy().backoff(gate_round, &regs.wake, e, None);
                    gate_round = gate_round.saturating_add(1);
                }
            }
        }
    }
    dev.store_cond(w, Cond::ack(v).0);
    // The counter is read only for swimlane records: a clock read per kernel edge is a
    // measurable share of a no-op task.
    let start = if s.swimlane.is_some() { dev.ticks() } else { 0 };
    // SAFETY: `p` points at a payload inside the image; `args` is its argument array.
    let args_ptr = unsafe { std::ptr::addr_of_mut!((*p).args) } as *mut i64;
    let started = Instant::now();
    // SAFETY: `kernel` was read from the payload the image's func table filled, `args_ptr` is
    // that payload's argument array.
    let outcome = unsafe { call_kernel(dev, &s.entry, regs, w, kernel, func_id, args_ptr) };
    let took = started.elapsed();
    regs.kernel_times.record(kernel, took);
    if let Server::Aicpu { limit, .. } = server
        && took > limit
    {
        s.short_kernels = false;
    }
    if let Some(code) = kernel_failure(dev, (w, s.core_type), func_id, task_id, outcome) {
        return Served::Ended(code);
    }
    s.last = v;
    if let Some((h, records)) = s.swimlane {
        let end = dev.ticks();
        // SAFETY: the header lies in this core's swimlane block of the live image.
        let h = unsafe { &*h };
        let n = h.count.load(Ordering::Relaxed);
        if n < s.swimlane_capacity {
            let rec =
                SwimlaneRecord { task_id, token: v, func_id, start, end, block_idx, reserved: 0 };
            // SAFETY: record `n` < capacity lies inside this core's swimlane block, which
            // only the holder of this core's serving lock writes during the run.
            unsafe { records.add(n as usize).write(rec) };
            // Relaxed: the host reads the records after the stream completed.
            h.count.store(n + 1, Ordering::Relaxed);
        } else {
            h.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
    dev.store_cond(w, Cond::fin(v).0);
    Served::Done
}

/// Runs the kernel at `kernel` (0: none registered) on the argument slots at `args`, with the
/// simulator's fault plan and the kernel's modelled time.
///
/// # Safety
///
/// `kernel` is 0 or an address the launch image's func table holds (filled by the host from the
/// run's callable, whose code the runner keeps loaded while a thread may run the launch), and
/// `args` points at a payload's argument slots, laid out as the kernel ABI requires.
pub(crate) unsafe fn call_kernel<H: CoreHost>(
    dev: &H,
    entry: &SimLaunch,
    regs: &RegBlock,
    w: u32,
    kernel: u64,
    func_id: u32,
    args: *mut i64,
) -> KernelOutcome {
    let park = match dev.faults().on_kernel(func_id, w) {
        KernelAction::Run => None,
        KernelAction::Fault => return KernelOutcome::Faulted("injected kernel fault".into()),
        KernelAction::Hang => Some(None),
        KernelAction::Delay(d) => Some(std::time::Instant::now().checked_add(d)),
    };
    if let Some(until) = park {
        // Parked, not asleep: a reset or the op-execute watchdog releases a hung kernel, and a
        // delayed one before its time, so finalize never has to detach the core's thread.
        let stop = || dev.is_reset() || entry.is_aborted();
        if dev.spin_policy().wait_until(&regs.wake, until, stop) {
            return KernelOutcome::Hung;
        }
    }
    if kernel == 0 {
        return KernelOutcome::Faulted(format!("no kernel registered for func id {func_id}"));
    }
    // SAFETY: the caller's contract: non-zero kernel addresses come from the image's func table,
    // which the host filled from the `KernelFn` pointers of the run's callable. A `Native`
    // pointer is code of the process and stays valid; a shared-object pointer stays valid while
    // its object is open, and the runner keeps it open while a thread may run this launch: the
    // run's callable cannot be unregistered until the run ended, a callable unregistered after a
    // failed run keeps its objects until finalize has joined every simulated thread, and a
    // thread finalize had to detach keeps them open for the life of the process.
    let f: KernelFn = unsafe { std::mem::transmute::<usize, KernelFn>(kernel as usize) };
    // Time declared on this thread outside a kernel belongs to no launch.
    crate::kernel::take_modelled_device_time();
    // SAFETY: the caller's contract: `args` points at the payload's 50 argument slots, laid out
    // as the kernel ABI requires; what the kernel does with its tensors is its own contract.
    let outcome = match std::panic::catch_unwind(AssertUnwindSafe(|| unsafe { f(args) })) {
        Ok(()) => KernelOutcome::Finished,
        Err(p) => KernelOutcome::Faulted(format!("kernel panicked: {}", panic_message(&*p))),
    };
    entry.add_modelled_time(crate::kernel::take_modelled_device_time());
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_wins_over_a_pending_doorbell() {
        assert_eq!(doorbell_step(EXIT_SIGNAL, 7, 7), Step::Exit);
        assert_eq!(doorbell_step(7, 7, 7), Step::Run);
        assert_eq!(doorbell_step(7, 0, 7), Step::Wait);
    }

    #[test]
    fn the_loop_waits_on_idle_and_on_the_last_token() {
        assert_eq!(step_for(AICPU_IDLE, 5), Step::Wait);
        assert_eq!(step_for(5, 5), Step::Wait);
        assert_eq!(step_for(6, 5), Step::Run);
        assert_eq!(step_for(EXIT_SIGNAL, 5), Step::Exit);
    }
}
