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

use simpler_types::DeviceTaskId;

use super::faults::{FaultPlan, KernelAction};
use super::regs::RegBlock;
use super::stream::LaunchEntry as SimLaunch;
use super::wait::SpinPolicy;
use crate::abi::CorePlace;
use crate::abi::codes::AclCode;
use crate::abi::image::{SwimlaneHeader, SwimlaneRecord};
use crate::abi::launch::KernelArgs;
use crate::abi::launch::PROFILE_SWIMLANE;
use crate::abi::payload::DispatchPayload;
use crate::abi::regs::{AICPU_IDLE, Cond, EXIT_SIGNAL, EXITED_VALUE, IDLE_VALUE, RegId};
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

pub(crate) enum KernelOutcome {
    Finished,
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

/// Runs core `w` of an AICore launch entry; returns 0 or the device code of its fault.
pub(crate) fn run_core<H: CoreHost>(dev: &H, entry: &Arc<SimLaunch>, w: u32) -> i32 {
    let stop = || dev.is_reset() || entry.is_aborted();
    let Some(args) = dev.read_kernel_args(entry.args) else {
        return AclCode::AICORE_EXCEPTION.get();
    };
    let Some(place) = CorePlace::of(w, args.block_dim) else {
        return 0;
    };
    let fault = |message: String, func_id: Option<u32>, task: Option<u64>, code: AclCode| {
        dev.record_fault(CoreFault {
            code,
            stream: StreamKind::AiCore,
            core: Some((w, place.core_type)),
            func_id,
            task: task.map(DeviceTaskId),
            message,
            at_ticks: dev.ticks(),
        });
        code.get()
    };
    let Some(view) = dev.core_image_view(&args) else {
        return fault(
            "the launch names no valid runtime image".into(),
            None,
            None,
            AclCode::AICORE_EXCEPTION,
        );
    };
    let Some(regs) = dev.regs(w) else { return 0 };
    let spin = dev.spin_policy();

    // Step 1: report in.
    let hs = view.handshake(w);
    let phys = dev.faults().on_handshake(w).unwrap_or(w);
    hs.physical_core_id.store(phys, Ordering::Relaxed);
    hs.core_type.store(place.core_type as u32, Ordering::Relaxed);
    // Release: the AICPU acquires `aicore_done` and then reads the two fields above.
    hs.aicore_done.store(w + 1, Ordering::Release);
    dev.notify_all_aicpu();

    // Step 2: wait for the window.
    spin.wait_until(&regs.wake, None, || regs.load(RegId::DataMainBaseLow) != 0 || stop());
    match regs.load(RegId::DataMainBaseLow) {
        0 => return AclCode::TASK_ABORT.get(),
        // The AICPU gave up before opening the window (a handshake failure) and asks this
        // core to leave: answer without touching the payload.
        EXIT_SIGNAL => {
            dev.store_cond(w, EXITED_VALUE);
            return 0;
        }
        _ => {}
    }

    // Step 3.
    dev.store_cond(w, IDLE_VALUE);
    let pair = hs.task.load(Ordering::Acquire);
    if pair != view.payload_pair_addr(w) {
        return fault(
            format!("handshake task address {pair:#x} is not this core's payload pair"),
            None,
            None,
            AclCode::AICORE_EXCEPTION,
        );
    }
    let swimlane = args.profiling & PROFILE_SWIMLANE != 0 && view.header().swimlane_capacity > 0;
    let (lane, records) = view.swimlane(w);
    let Some(mut slot) = lock_serving(regs, &stop) else {
        return kernel_outlived_launch(dev, w, place.core_type);
    };
    *slot = Some(Serving {
        w,
        place_type: place.core_type,
        last: AICPU_IDLE,
        entry: entry.clone(),
        payloads: [view.payload_ptr(w, 0), view.payload_ptr(w, 1)],
        swimlane: swimlane.then_some((lane as *const SwimlaneHeader, records)),
        swimlane_capacity: view.header().swimlane_capacity,
        ended: None,
        short_kernels: true,
    });
    regs.abandoned.store(false, Ordering::SeqCst);
    drop(slot);
    // Leaves the loop: the serving state goes before the core's participant ends, so no
    // AICPU thread serves a token from an image the launch no longer keeps alive. A failure
    // an AICPU thread saw while serving for this core wins over a plain abort.
    let leave = |slot: &mut Option<Serving>, code: i32| {
        let code = slot.as_ref().and_then(|s| s.ended).unwrap_or(code);
        *slot = None;
        code
    };
    let mut round = 0u32;

    // Step 4.
    loop {
        let epoch = regs.wake.epoch();
        let Some(mut slot) = lock_serving(regs, &stop) else {
            return kernel_outlived_launch(dev, w, place.core_type);
        };
        let Some(s) = slot.as_mut() else { return AclCode::TASK_ABORT.get() };
        if let Some(code) = s.ended {
            // The AICPU thread that served the last token saw its kernel fail.
            return leave(&mut slot, code);
        }
        let v = regs.load(RegId::DataMainBaseLow);
        match step_for(v, s.last) {
            Step::Exit => {
                dev.store_cond(w, EXITED_VALUE);
                return leave(&mut slot, 0);
            }
            Step::Wait if stop() => return leave(&mut slot, AclCode::TASK_ABORT.get()),
            Step::Wait => {
                drop(slot);
                spin.backoff(round, &regs.wake, epoch, None);
                round = round.saturating_add(1);
            }
            Step::Run => {
                round = 0;
                match serve(dev, regs, s, v, Gate::Wait) {
                    Served::Done | Served::Declined => {}
                    Served::Ended(code) => return leave(&mut slot, code),
                }
            }
        }
    }
}

/// How long a core's thread waits for its serving lock between looks at whether the launch
/// was stopped (an AICPU thread holds the lock while it runs a kernel for the core).
const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(2);

/// The core's serving lock, or `None` once the launch is stopped while an AICPU thread still
/// holds it: a kernel it serves for this core has not returned.
fn lock_serving<'r>(
    regs: &'r RegBlock,
    stop: &impl Fn() -> bool,
) -> Option<parking_lot::MutexGuard<'r, Option<Serving>>> {
    loop {
        if let Some(guard) = regs.serving.try_lock_for(LOCK_POLL) {
            return Some(guard);
        }
        if stop() {
            return None;
        }
    }
}

/// The core's thread leaves a stopped launch while an AICPU thread is still inside a kernel
/// it serves for the core: the core's participant ends as a hang, and the state, which that
/// thread still holds, is marked abandoned so nothing is served from it again.
fn kernel_outlived_launch<H: CoreHost>(dev: &H, w: u32, core_type: crate::abi::CoreType) -> i32 {
    if let Some(regs) = dev.regs(w) {
        regs.abandoned.store(true, Ordering::SeqCst);
    }
    dev.record_fault(CoreFault {
        code: AclCode::AICORE_TIMEOUT,
        stream: StreamKind::AiCore,
        core: Some((w, core_type)),
        func_id: None,
        task: None,
        message: "a kernel the AICPU thread runs for this core had not returned when the launch \
                  was stopped"
            .into(),
        at_ticks: dev.ticks(),
    });
    AclCode::AICORE_TIMEOUT.get()
}

/// A core's state between tokens while it serves a launch (steps 3 and 4), kept in its
/// register block so the AICPU thread that writes a token can serve it itself
/// (`docs/device-simulator.md`, "Who runs a dispatch"). Present from step 3 until the
/// core's thread leaves the loop; whoever holds the block's `serving` lock serves.
#[derive(Debug)]
pub(crate) struct Serving {
    w: u32,
    place_type: crate::abi::CoreType,
    /// The last token served.
    last: u32,
    entry: Arc<SimLaunch>,
    /// The core's two payload buffers in the launch's image.
    payloads: [*mut DispatchPayload; 2],
    /// The core's swimlane header and records, when the launch records a swimlane.
    swimlane: Option<(*const SwimlaneHeader, *mut SwimlaneRecord)>,
    swimlane_capacity: u32,
    /// The code the core's participant ends with, set when a token served by another thread
    /// failed (its thread then leaves with it).
    ended: Option<i32>,
    /// Whether every kernel served on an AICPU thread for this launch returned within
    /// [`INLINE_KERNEL_LIMIT`]; once one did not, the core's thread serves the rest.
    short_kernels: bool,
}

/// The longest kernel after which a core's later tokens of the launch are still served on the
/// AICPU thread: an AICPU thread inside a kernel neither polls its other cores nor watches for
/// stalls, so long kernels go back to the core's own thread.
const INLINE_KERNEL_LIMIT: std::time::Duration = std::time::Duration::from_millis(1);

// SAFETY: the pointers address the launch's image, which stays alive while the core's
// participant runs; the state is only reached through the block's lock, and the core's thread
// removes it before its participant ends.
unsafe impl Send for Serving {}

/// Whether serving may wait for a gated payload's doorbell.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gate {
    Wait,
    Decline,
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
fn serve<H: CoreHost>(dev: &H, regs: &RegBlock, s: &mut Serving, v: u32, gate: Gate) -> Served {
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
    if src != 0 {
        if gate == Gate::Decline {
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
    let failed = match call_kernel(dev, &s.entry, regs, w, kernel, func_id, args_ptr) {
        KernelOutcome::Finished => None,
        KernelOutcome::Faulted(msg) => Some((msg, AclCode::AICORE_EXCEPTION)),
        KernelOutcome::Hung => Some((
            "kernel hung until the op-execute watchdog fired".to_owned(),
            AclCode::AICORE_TIMEOUT,
        )),
    };
    if let Some((message, code)) = failed {
        dev.record_fault(CoreFault {
            code,
            stream: StreamKind::AiCore,
            core: Some((w, s.place_type)),
            func_id: Some(func_id),
            task: Some(DeviceTaskId(task_id)),
            message,
            at_ticks: dev.ticks(),
        });
        return Served::Ended(code.get());
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

/// Serves the token just written to core `c` on the calling (AICPU) thread instead of waking
/// the core's thread; returns whether it did. It does not when the core's thread holds its
/// state, is not serving yet (handshake), the register holds no new token (exit, idle), the
/// payload is gated, or the kernel failed — then the caller wakes the core's thread, which
/// reports the failure as its own.
pub(crate) fn serve_here<H: CoreHost>(dev: &H, c: u32) -> bool {
    let Some(regs) = dev.regs(c) else { return false };
    let Some(mut slot) = regs.serving.try_lock() else { return false };
    if regs.abandoned.swap(false, Ordering::SeqCst) {
        // Left behind by a kernel that outlived its launch (`kernel_outlived_launch`).
        *slot = None;
        return false;
    }
    let Some(s) = slot.as_mut() else { return false };
    if s.ended.is_some() || !s.short_kernels {
        return false;
    }
    let v = regs.load(RegId::DataMainBaseLow);
    if step_for(v, s.last) != Step::Run {
        return false;
    }
    let start = std::time::Instant::now();
    // A panic here would be the simulator's own (a kernel's is caught at the kernel): it
    // ends the core's participant as a fault instead of unwinding through the AICPU program.
    let served =
        std::panic::catch_unwind(AssertUnwindSafe(|| serve(dev, regs, s, v, Gate::Decline)))
            .unwrap_or(Served::Ended(AclCode::AICORE_EXCEPTION.get()));
    if start.elapsed() > INLINE_KERNEL_LIMIT {
        s.short_kernels = false;
    }
    if regs.abandoned.swap(false, Ordering::SeqCst) {
        // The core's thread left while the kernel ran: its state must not outlive this call.
        *slot = None;
        return true;
    }
    match served {
        Served::Done => true,
        Served::Declined => false,
        Served::Ended(code) => {
            s.ended = Some(code);
            false
        }
    }
}

pub(crate) fn call_kernel<H: CoreHost>(
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
    // SAFETY: non-zero kernel addresses in payloads come from the image's func table, which the
    // host filled from the `KernelFn` pointers of the run's callable. A `Native` pointer is code
    // of the process and stays valid; a shared-object pointer stays valid while its object is
    // open, and the runner keeps it open while a thread may run this launch: the run's callable
    // cannot be unregistered until the run ended, a callable unregistered after a failed run
    // keeps its objects until finalize has joined every simulated thread, and a thread finalize
    // had to detach keeps them open for the life of the process.
    let f: KernelFn = unsafe { std::mem::transmute::<usize, KernelFn>(kernel as usize) };
    // SAFETY: `args` points at the payload's 50 argument slots, laid out as the kernel ABI
    // requires; what the kernel does with its tensors is its own contract.
    match std::panic::catch_unwind(AssertUnwindSafe(|| unsafe { f(args) })) {
        Ok(()) => KernelOutcome::Finished,
        Err(p) => KernelOutcome::Faulted(format!("kernel panicked: {}", panic_message(&*p))),
    }
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
