//! Who drives a simulated core's launch: its own thread, or the AICPU thread that writes its
//! registers (`docs/device-simulator.md`, "Who runs a dispatch").
//!
//! A core's launch state ([`CoreLaunch`]) sits in its register block under a lock. A launch
//! the simulator starts *unthreaded* is reported in by whoever starts the AICore entry, and
//! then advanced by the owning AICPU thread after each of its register stores: opening the
//! window, serving tokens, answering the exit signal and ending the core's participant. The
//! core's thread stays parked on its mailbox unless something needs a thread: a token the
//! AICPU thread may not serve (the host has a free core for it, a fault is armed, the payload
//! is gated, or a kernel ran long), an abort or a reset. Then the core's thread is posted
//! `Adopt`, takes the state over and drives the rest of the launch as a threaded one.
//!
//! Invariants:
//! - A core's participant ends exactly once. A threaded launch is ended by the core's thread
//!   (an AICPU thread that saw its kernel fail only records the code in the state). An
//!   unthreaded launch is ended by whoever takes `RegBlock::unthreaded` (the AICPU thread that
//!   answers the exit signal or sees a kernel fail, or the core's thread that adopts it), and
//!   the state is removed, under the lock, before the end is reported.
//! - Every register store either advances the state, or finds it locked or threaded and wakes
//!   the core's thread (whose loop reads the epoch before it takes the lock), or asks it to
//!   adopt: no store goes unseen. A token that asks for adoption may be held by the AICPU thread
//!   that stored it ([`Held`]) until that thread next idles or waits; it is then served there or
//!   the adoption is asked for, never dropped.
//! - While a launch is unthreaded, anything that must reach the core's thread (an abort, a
//!   reset) posts it `Adopt`.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;

use super::aicore::{CoreHost, CoreLaunch, Moved, Server, advance, prepare, record_core_fault};
use super::regs::RegBlock;
use super::stream::LaunchEntry as SimLaunch;
use crate::abi::CoreType;
use crate::abi::codes::AclCode;

/// How long a core's thread waits for its lock between looks at whether the launch was
/// stopped (an AICPU thread holds the lock while it runs a kernel for the core).
const LOCK_POLL: Duration = Duration::from_millis(2);

/// What the simulator must do after an AICPU thread's register store rang a core.
pub(crate) enum Ring {
    /// Nothing: the store was handled (or needs nothing).
    Handled,
    /// Wake the core's thread parked on its register block.
    Wake,
    /// Post the core's thread `Adopt`.
    Adopt,
    /// The core's participant ended here: report `code` to its entry.
    Finish(usize, Arc<SimLaunch>, i32),
}

/// Runs core `w`'s part of `entry` on the core's own thread (a launch posted to it).
pub(crate) fn run_on_thread<H: CoreHost>(dev: &H, entry: &Arc<SimLaunch>, w: u32) -> i32 {
    let Some(regs) = dev.regs(w) else { return 0 };
    let launch = match prepare(dev, entry, w, true) {
        Ok(l) => l,
        Err(why) => return why.end(dev, w),
    };
    let core_type = launch.core_type;
    let stop = || dev.is_reset() || entry.is_aborted();
    let Some(mut slot) = lock(regs, &stop) else {
        return kernel_outlived_launch(dev, w, core_type);
    };
    regs.abandoned.store(false, Ordering::SeqCst);
    slot.insert(launch).report_in(dev);
    drop(slot);
    drive_on_thread(dev, regs, w, entry, core_type)
}

/// Starts core `w`'s part of `entry` unthreaded: reports in and leaves the rest to the AICPU
/// thread's register stores. `false` when it cannot (the state is held by a kernel that outlived
/// an earlier launch, or the launch is unusable): the caller posts the launch to the thread.
pub(crate) fn start_unthreaded<H: CoreHost>(
    dev: &H,
    stream: usize,
    entry: &Arc<SimLaunch>,
    w: u32,
) -> bool {
    let Some(regs) = dev.regs(w) else { return false };
    let Ok(launch) = prepare(dev, entry, w, false) else { return false };
    let Some(mut slot) = regs.serving.try_lock() else { return false };
    regs.abandoned.store(false, Ordering::SeqCst);
    *regs.unthreaded.lock() = Some((stream, entry.clone()));
    // Reported in under the lock: the AICPU opens the window only after it, and a store that
    // finds the lock held while the launch is unthreaded waits for it (`ring`).
    slot.insert(launch).report_in(dev);
    true
}

/// A launch a core's thread took over from the AICPU threads.
pub(crate) struct Adopted {
    pub(crate) stream: usize,
    pub(crate) entry: Arc<SimLaunch>,
    core_type: CoreType,
}

/// What a core's thread got from [`adopt`].
pub(crate) enum Adoption {
    /// The launch, to drive to its end.
    Taken(Adopted),
    /// A launch that ends at once ([`end_outlived`]): the core's thread could not take the
    /// state before the launch was stopped, because an AICPU thread is still inside a kernel
    /// it serves for the core.
    GaveUp { stream: usize, entry: Arc<SimLaunch> },
}

/// Takes over core `w`'s launch if AICPU threads drive it.
pub(crate) fn adopt<H: CoreHost>(dev: &H, w: u32) -> Option<Adoption> {
    let regs = dev.regs(w)?;
    let (stream, entry) = regs.unthreaded.lock().clone()?;
    let stop = || dev.is_reset() || entry.is_aborted();
    let Some(mut slot) = lock(regs, &stop) else {
        // Whoever takes the launch ends it; the AICPU thread drops the state when it returns.
        // Only the launch this thread was asked about: it may have ended meanwhile and the
        // core's next launch taken its place.
        let (stream, entry) = regs.unthreaded.lock().take_if(|(_, e)| Arc::ptr_eq(e, &entry))?;
        return Some(Adoption::GaveUp { stream, entry });
    };
    let l = slot.as_mut().filter(|l| !l.threaded && Arc::ptr_eq(&l.entry, &entry))?;
    regs.unthreaded.lock().take()?;
    l.threaded = true;
    Some(Adoption::Taken(Adopted { stream, entry, core_type: l.core_type }))
}

/// Ends core `w`'s part of `entry`, which its thread gave up adopting
/// ([`Adoption::GaveUp`]); returns the code to report.
pub(crate) fn end_outlived<H: CoreHost>(dev: &H, entry: &SimLaunch, w: u32) -> i32 {
    let core_type = dev
        .read_kernel_args(entry.args)
        .and_then(|a| crate::abi::CorePlace::of(w, a.block_dim))
        .map_or(CoreType::Aiv, |p| p.core_type);
    kernel_outlived_launch(dev, w, core_type)
}

/// Runs an adopted launch to its end on the core's thread; returns the code to report.
pub(crate) fn drive_adopted<H: CoreHost>(dev: &H, w: u32, a: &Adopted) -> i32 {
    let Some(regs) = dev.regs(w) else { return AclCode::TASK_ABORT.get() };
    drive_on_thread(dev, regs, w, &a.entry, a.core_type)
}

/// The core thread's loop over a threaded launch (steps 2–4, waiting between moves).
fn drive_on_thread<H: CoreHost>(
    dev: &H,
    regs: &RegBlock,
    w: u32,
    entry: &SimLaunch,
    core_type: CoreType,
) -> i32 {
    let stop = || dev.is_reset() || entry.is_aborted();
    let spin = dev.spin_policy();
    let mut round = 0u32;
    loop {
        let epoch = regs.wake.epoch();
        let Some(mut slot) = lock(regs, &stop) else {
            return kernel_outlived_launch(dev, w, core_type);
        };
        let Some(l) = slot.as_mut() else { return AclCode::TASK_ABORT.get() };
        match advance(dev, regs, l, Server::CoreThread) {
            Moved::Progress => round = 0,
            Moved::Ended(code) => return leave(&mut slot, code),
            Moved::Wait | Moved::Declined if stop() => {
                return leave(&mut slot, AclCode::TASK_ABORT.get());
            }
            Moved::Wait | Moved::Declined => {
                drop(slot);
                spin.backoff(round, &regs.wake, epoch, None);
                round = round.saturating_add(1);
            }
        }
    }
}

/// Ends the launch in `slot`: a failure an AICPU thread saw while serving for the core wins
/// over the caller's code (a plain abort, typically).
fn leave(slot: &mut Option<CoreLaunch>, code: i32) -> i32 {
    let code = slot.as_ref().and_then(|l| l.ended).unwrap_or(code);
    *slot = None;
    code
}

/// The core's lock, or `None` once `stop` holds while another thread still has it: a kernel an
/// AICPU thread serves for this core has not returned.
fn lock<'r>(
    regs: &'r RegBlock,
    stop: &dyn Fn() -> bool,
) -> Option<MutexGuard<'r, Option<CoreLaunch>>> {
    loop {
        if let Some(guard) = regs.serving.try_lock_for(LOCK_POLL) {
            return Some(guard);
        }
        if stop() {
            return None;
        }
    }
}

/// The core's thread leaves a stopped launch while an AICPU thread is still inside a kernel it
/// serves for the core: the participant ends as a hang, and the state, which that thread still
/// holds, is marked abandoned so that nothing is served from it again.
fn kernel_outlived_launch<H: CoreHost>(dev: &H, w: u32, core_type: CoreType) -> i32 {
    if let Some(regs) = dev.regs(w) {
        regs.abandoned.store(true, Ordering::SeqCst);
    }
    record_core_fault(
        dev,
        AclCode::AICORE_TIMEOUT,
        (w, core_type),
        None,
        "a kernel the AICPU thread runs for this core had not returned when the launch was \
         stopped"
            .into(),
    )
}

/// Takes the mark `kernel_outlived_launch` leaves (a plain load first: the mark is rare and
/// this runs after every move an AICPU thread makes for a core).
fn take_abandoned(regs: &RegBlock) -> bool {
    regs.abandoned.load(Ordering::SeqCst) && regs.abandoned.swap(false, Ordering::SeqCst)
}

/// After an AICPU thread stored to core `c`'s `DATA_MAIN_BASE`: advances the core's launch on
/// this thread as far as it goes without waiting, serving tokens only as `server` allows
/// ([`Server::Nobody`] or [`Server::Aicpu`]); says what else the simulator must do.
pub(crate) fn ring<H: CoreHost>(dev: &H, c: u32, server: Server) -> Ring {
    let Some(regs) = dev.regs(c) else { return Ring::Handled };
    let mut slot = loop {
        if let Some(guard) = regs.serving.try_lock() {
            break guard;
        }
        // Held by the thread that started an unthreaded launch, for the few stores of step 1,
        // or by the core's thread, which reads the registers again after it.
        if regs.unthreaded.lock().is_none() {
            return Ring::Wake;
        }
        std::thread::yield_now();
    };
    if take_abandoned(regs) {
        // Left behind by a kernel that outlived its launch (`kernel_outlived_launch`).
        *slot = None;
        return Ring::Wake;
    }
    let Some(l) = slot.as_mut() else { return Ring::Wake };
    if l.threaded && (server == Server::Nobody || l.ended.is_some()) {
        return Ring::Wake;
    }
    loop {
        // A panic here would be the simulator's own (a kernel's is caught at the kernel): it
        // ends the core's participant as a fault instead of unwinding through the AICPU program.
        let moved = std::panic::catch_unwind(AssertUnwindSafe(|| advance(dev, regs, l, server)))
            .unwrap_or(Moved::Ended(AclCode::AICORE_EXCEPTION.get()));
        if take_abandoned(regs) {
            // The core's thread left while the kernel ran: the state must not outlive this call.
            *slot = None;
            return Ring::Handled;
        }
        match (moved, l.threaded) {
            (Moved::Progress, false) => {}
            // A threaded core's thread reads the registers itself; this served the one token.
            (Moved::Progress, true) => return Ring::Handled,
            (Moved::Wait, _) => return Ring::Handled,
            (Moved::Declined, true) => return Ring::Wake,
            (Moved::Declined, false) => return Ring::Adopt,
            (Moved::Ended(code), true) => {
                l.ended = Some(code);
                return Ring::Wake;
            }
            (Moved::Ended(code), false) => {
                *slot = None;
                // Taken by a core's thread that gave up waiting for this kernel: it reported
                // the end.
                let Some((stream, entry)) = regs.unthreaded.lock().take() else {
                    return Ring::Handled;
                };
                return Ring::Finish(stream, entry, code);
            }
        }
    }
}

/// The cores whose tokens one AICPU thread's stores rang while the host had a free core for
/// their threads, held instead of posting those threads `Adopt` at once
/// (`docs/device-simulator.md`, "Who runs a dispatch"). Only tokens of launches AICPU threads
/// drive are held, and such a core accepts no second token before it acknowledged the first, so
/// a held bit stands for at most one unserved token. A held token is never forgotten: when the
/// AICPU thread has nothing else to do and no core of its own runs a kernel on its thread, it
/// runs the first itself when that kernel returned quickly on the core before (and the others
/// too while their cores' last kernels were quick and the time stays under what waking a
/// thread costs) and hands the rest to their cores' threads; otherwise it hands them over at
/// its next idle wait, at the start of an iteration of its loop once the oldest was held for
/// that long, or when its part ends (also by unwinding).
#[derive(Debug, Default)]
pub(crate) struct Held {
    cores: Cell<u128>,
    /// When the oldest of `cores` was held.
    since: Cell<Option<Instant>>,
}

/// How long an AICPU thread runs held tokens itself, or holds one while busy with other work,
/// before it hands the rest to their cores' threads: about what waking a parked thread costs on
/// a virtual machine.
pub(crate) const HOLD_BUDGET: Duration = Duration::from_micros(20);

impl Held {
    /// Holds core `c`; `false` when it cannot (the caller wakes the core's thread now).
    pub(crate) fn hold(&self, c: u32) -> bool {
        let Some(bit) = 1u128.checked_shl(c) else { return false };
        if self.cores.get() == 0 {
            self.since.set(Some(Instant::now()));
        }
        self.cores.set(self.cores.get() | bit);
        true
    }

    /// At the start of an iteration: every held core once the oldest was held past
    /// [`HOLD_BUDGET`], to hand to their threads now.
    pub(crate) fn overdue(&self) -> u128 {
        self.overdue_at(Instant::now())
    }

    /// [`overdue`](Self::overdue) as of `now`.
    fn overdue_at(&self, now: Instant) -> u128 {
        match self.since.get() {
            Some(t) if now.saturating_duration_since(t) > HOLD_BUDGET => self.take_all(),
            _ => 0,
        }
    }

    /// At an idle wait of a scheduling thread, `busy` of whose cores have a dispatch in flight
    /// (the held ones included): every held core, and whether the thread may run them itself
    /// (no core of its own is running a kernel on its thread).
    pub(crate) fn take_at_idle(&self, busy: u32) -> (u128, bool) {
        let cores = self.take_all();
        (cores, cores != 0 && cores.count_ones() == busy)
    }

    /// Every held core.
    pub(crate) fn take_all(&self) -> u128 {
        self.since.set(None);
        self.cores.replace(0)
    }
}

/// The members of `set` (cores, or AICPU participants), lowest first.
pub(crate) fn cores_of(mut set: u128) -> impl Iterator<Item = u32> {
    std::iter::from_fn(move || {
        let c = (set != 0).then(|| set.trailing_zeros())?;
        set &= set - 1;
        Some(c)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_of_yields_the_set_bits_lowest_first() {
        assert_eq!(cores_of(0).count(), 0);
        let set = (1u128 << 127) | (1 << 64) | (1 << 3) | 1;
        assert_eq!(cores_of(set).collect::<Vec<_>>(), [0, 3, 64, 127]);
    }

    #[test]
    fn held_cores_go_to_the_thread_at_idle_only_when_they_are_all_its_busy_cores() {
        let held = Held::default();
        assert!(held.hold(1) && held.hold(2));
        assert!(!held.hold(128), "a core past the set is woken at once");
        // Core 5 runs a kernel on its own thread: the held ones go to their threads.
        assert_eq!(held.take_at_idle(3), (0b110, false));
        assert_eq!(held.take_all(), 0, "taken once");
        assert!(held.hold(7));
        assert_eq!(held.take_at_idle(1), (1 << 7, true));
    }

    #[test]
    fn a_core_held_past_the_budget_is_overdue_at_the_next_iteration() {
        // Explicit instants: a test thread can be descheduled for longer than the budget.
        let held = Held::default();
        assert_eq!(held.overdue(), 0);
        let before = Instant::now();
        held.hold(4);
        assert_eq!(held.overdue_at(before), 0, "held just now");
        held.hold(9);
        let later = Instant::now() + HOLD_BUDGET * 2;
        assert_eq!(held.overdue_at(later), (1 << 4) | (1 << 9), "the oldest decides");
        assert_eq!(held.overdue_at(later), 0);
    }
}
