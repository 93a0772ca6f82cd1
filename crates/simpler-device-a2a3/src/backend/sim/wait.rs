//! Spin briefly, then park on an event count (`docs/device-simulator.md`).
//!
//! Every wait of the simulator follows the same pattern:
//!
//! 1. Read the [`EventCount`] epoch.
//! 2. Check the condition; if it holds, stop.
//! 3. Spin (`spin_loop` hints) for the first rounds — at most `spins`, fewer after this
//!    thread's recent spin phases ran out, none while its latest yield ran another thread
//!    ([`WaitState`]), and only while every awake thread of the device has a host core
//!    ([`SpinGate`]) — then `yield_now` for `yields` rounds, then
//!    park until the epoch differs from the one read in step 1 or the deadline passes; go to 1.
//!
//! Two waits [`linger`] instead before they park (an AICPU thread's empty mailbox, a host
//! thread's stream or event synchronisation): they yield for up to 30 µs whatever the gate says.
//!
//! Every writer of a waited-for value changes the value first and then calls
//! [`EventCount::notify`], which bumps the epoch. A waiter that read the epoch before the write
//! either sees the new value in step 2 or finds the epoch changed when it parks, so no wakeup is
//! lost (see `EventCount::park` for the lock argument). The deadline is the nearest watchdog
//! deadline of the waiter, so watchdogs fire while it is parked.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

/// Counts the simulated threads of one device that are not parked, so a waiter spins only
/// when every awake thread has a host core (decision: rather than "no spinning when simulated
/// threads outnumber host cores", counting awake threads instead of all threads keeps spinning
/// useful when most simulated cores are idle, which is the common case, e.g. a chain of tasks
/// where one scheduler thread and one simulated core hand off to each other).
///
/// `awake` is incremented by a thread when it stops parking and decremented when it starts;
/// it is read relaxed by waiters deciding whether to spin (a stale value only costs a few
/// wasted or skipped spins).
#[derive(Debug)]
pub(crate) struct SpinGate {
    awake: AtomicU32,
    cores: u32,
}

impl SpinGate {
    /// A gate for a host with `cores` cores and no awake thread.
    pub(crate) fn new(cores: u32) -> SpinGate {
        SpinGate { awake: AtomicU32::new(0), cores: cores.max(1) }
    }

    /// A thread stopped parking.
    pub(crate) fn wake(&self) {
        self.awake.fetch_add(1, Ordering::Relaxed);
    }

    /// A thread is about to park.
    pub(crate) fn sleep(&self) {
        self.awake.fetch_sub(1, Ordering::Relaxed);
    }

    /// Spinning needs a core nobody else of the device wants: every awake thread (the waiter
    /// and whoever it waits on included) must have a core of its own. The host thread that
    /// launched the run is parked in stream synchronisation meanwhile (after its first 30 µs,
    /// [`linger`]), so it needs no core.
    fn may_spin(&self) -> bool {
        self.awake.load(Ordering::Relaxed) <= self.cores
    }

    /// Every host core is taken by an awake thread of the device: a thread woken now would
    /// have to take a core from one of them.
    pub(crate) fn saturated(&self) -> bool {
        self.awake.load(Ordering::Relaxed) >= self.cores
    }
}

/// An epoch counter with parked waiters.
///
/// `epoch` is bumped by every notifier and read by every waiter; `waiters` counts threads
/// inside `park`, so a notifier skips the lock when nobody sleeps. Both use `SeqCst`: the
/// notifier's "bump epoch, then read waiters" and the waiter's "count itself, then re-read the
/// epoch under the lock" must not be reordered against each other (a Dekker pattern).
#[derive(Debug, Default)]
pub(crate) struct EventCount {
    epoch: AtomicU64,
    waiters: AtomicU32,
    lock: Mutex<()>,
    cv: Condvar,
}

impl EventCount {
    /// The current epoch; read it before checking the condition.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Bumps the epoch and wakes every parked waiter.
    pub(crate) fn notify(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this wakeup after any waiter that is between its epoch
            // re-check and `cv.wait`, which holds the lock across that window.
            let _guard = self.lock.lock();
            self.cv.notify_all();
        }
    }

    /// Parks until the epoch differs from `observed` or `deadline` passes.
    pub(crate) fn park(&self, observed: u64, deadline: Option<Instant>, gate: &SpinGate) {
        gate.sleep();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut guard = self.lock.lock();
        while self.epoch.load(Ordering::SeqCst) == observed {
            if wait_on(&self.cv, &mut guard, deadline) {
                break;
            }
        }
        drop(guard);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        gate.wake();
    }
}

/// The instant `budget` from now, or `None` — no deadline — when it is not representable
/// (a budget of `Duration::MAX` means "wait forever", never a panic).
pub(crate) fn deadline_after(budget: Duration) -> Option<Instant> {
    Instant::now().checked_add(budget)
}

/// Waits on `cv` until notified or `deadline` passes (`None` = no deadline); returns whether
/// the deadline passed.
pub(crate) fn wait_on<T>(
    cv: &Condvar,
    guard: &mut MutexGuard<'_, T>,
    deadline: Option<Instant>,
) -> bool {
    match deadline {
        Some(d) => cv.wait_until(guard, d).timed_out(),
        None => {
            cv.wait(guard);
            false
        }
    }
}

/// Spin rounds a thread still tries after its spin phases stopped paying off (about 15
/// `spin_loop` hints, well under a microsecond).
const PROBE_SPIN_ROUNDS: u32 = 4;

/// A yield that returns sooner than this found no other thread to run on its core. On the
/// 2-vCPU virtual machine the figures were measured on, a yield that switches nowhere takes
/// 0.5 µs and one that runs another thread and comes back at least 2.6 µs; a misjudged yield
/// costs at most one short spin phase, which the spin budget then shortens.
const LONE_YIELD: Duration = Duration::from_micros(2);

/// What one backoff round does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backoff {
    Spin,
    Yield,
    Park,
}

/// A simulated thread's own backoff state, adapted to how its recent waits ended.
///
/// - **Spin budget.** The awake-thread gate cannot see other processes: on a loaded host a
///   spinning waiter may share its core with the very thread it waits for, and then every spin
///   round only delays that thread (a convoy). So each thread keeps its own budget: a wait that
///   ended during its spin phase doubles it (up to the policy's spin rounds); a spin phase that
///   ran out without success halves it (down to [`PROBE_SPIN_ROUNDS`]).
/// - **Yield count.** A wait yields at most the policy's yield rounds, counted from where its
///   spin phase ended, before it parks. Spin rounds the gate refused are not turned into
///   yields: on an oversubscribed host a yield is a context switch (more than a microsecond on
///   a virtual machine), and 24 idle simulated cores yielding 68 times each at every launch cost more
///   than the whole dispatch of a thousand tasks.
/// - **Shared core.** A yield that takes longer than [`LONE_YIELD`] ran another thread — on a
///   loaded host, another process — so this thread's core is not its own and it does not spin
///   until a yield comes back quickly again. Without this, a chain of tasks handed between two
///   spinning threads ran slower under outside load than with no spinning at all.
///
/// Thread-local, so it costs no shared cache line. Round 0 starts a new wait.
#[derive(Debug)]
struct WaitState {
    /// Spin rounds the next wait may use.
    spin_rounds: Cell<u32>,
    /// Whether this thread's latest backoff round was a spin round; a new wait that follows
    /// one means the previous wait ended while spinning.
    spinning: Cell<bool>,
    /// Yields made by the current wait.
    yields: Cell<u32>,
    /// Whether this thread's latest yield ran another thread.
    shared_core: Cell<bool>,
}

impl WaitState {
    /// The state of a thread that has not waited yet: full spin budget, core assumed free.
    const fn new() -> WaitState {
        WaitState {
            spin_rounds: Cell::new(u32::MAX),
            spinning: Cell::new(false),
            yields: Cell::new(0),
            shared_core: Cell::new(false),
        }
    }

    /// Decides round `round` of a wait under `policy`.
    fn step(&self, round: u32, policy: &SpinPolicy<'_>) -> Backoff {
        let mut budget = self.spin_rounds.get().min(policy.spins);
        if round == 0 {
            self.yields.set(0);
            if self.spinning.replace(false) {
                // `max` then `min`, not `clamp`: a policy may allow fewer rounds than the probe.
                budget = budget.saturating_mul(2).max(PROBE_SPIN_ROUNDS).min(policy.spins);
                self.spin_rounds.set(budget);
            }
        }
        if round < budget && !self.shared_core.get() && policy.gate.may_spin() {
            self.spinning.set(true);
            return Backoff::Spin;
        }
        if self.spinning.replace(false) && round >= budget {
            self.spin_rounds.set((budget / 2).max(PROBE_SPIN_ROUNDS));
        }
        let yields = self.yields.get();
        if yields < policy.yields {
            self.yields.set(yields + 1);
            Backoff::Yield
        } else {
            Backoff::Park
        }
    }
}

/// Waits until `t` on the host's clock and ends within a few microseconds of it: a timed sleep
/// while more than [`PRECISE_WINDOW`] remains, then yields until `t`. A host wait for modelled
/// device time uses it: a timed sleep alone ends 10–20 µs late on a virtual machine even
/// without timer slack, which would lengthen every modelled time by that much.
pub(crate) fn sleep_until_precisely(t: Instant) {
    loop {
        let now = Instant::now();
        let Some(left) = t.checked_duration_since(now).filter(|d| !d.is_zero()) else { return };
        match left.checked_sub(PRECISE_WINDOW) {
            Some(coarse) if !coarse.is_zero() => std::thread::sleep(coarse),
            _ => {
                std::hint::spin_loop();
                std::thread::yield_now();
            }
        }
    }
}

/// Yields until `ready()` holds, [`LINGER`] has passed or `until` comes, before a wait parks:
/// on a virtual machine a parked thread woken from another vCPU costs about 10 µs of wall time
/// and CPU on both sides, more than a short device step takes. Returns whether `ready()` held.
pub(crate) fn linger(ready: impl Fn() -> bool, until: Option<Instant>) -> bool {
    linger_for(ready, LINGER, until)
}

fn linger_for(ready: impl Fn() -> bool, budget: Duration, until: Option<Instant>) -> bool {
    let end = Instant::now().checked_add(budget);
    let end = earliest(end, until);
    loop {
        if ready() {
            return true;
        }
        if end.is_none_or(|e| Instant::now() >= e) {
            return false;
        }
        std::hint::spin_loop();
        std::thread::yield_now();
    }
}

/// The earlier of two optional deadlines (`None` = no deadline).
pub(crate) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// How long a thread about to park keeps looking (see [`linger`]).
const LINGER: Duration = Duration::from_micros(30);

/// How much of a precise wait is spent yielding rather than asleep: more than a timed sleep's
/// lateness with the default 50 µs timer slack.
const PRECISE_WINDOW: Duration = Duration::from_micros(100);

/// Makes this thread's timed sleeps end when asked. Linux lets a normal thread's timers fire up
/// to 50 µs late (its timer slack), which would turn a 80 µs kernel delay into 130 µs of device
/// time; a chip's timers have no such slack. Best effort: a kernel that refuses keeps its slack.
pub(crate) fn exact_timers() {
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1)) {
        tracing::debug!(error = %e, "simulated thread keeps the default timer slack");
    }
}

thread_local! {
    static WAIT_STATE: WaitState = const { WaitState::new() };
}

/// How long a waiter spins and yields before it parks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpinPolicy<'a> {
    /// Most rounds of `spin_loop` hints a wait makes.
    pub(crate) spins: u32,
    /// Rounds of `yield_now` after the spin phase.
    pub(crate) yields: u32,
    /// The device's awake-thread count.
    pub(crate) gate: &'a SpinGate,
}

impl SpinPolicy<'_> {
    /// One round of backing off before re-checking; parks (on `ec`, until its epoch moves past
    /// `observed` or `deadline`) once the spin and yield rounds are used up. `round` counts the
    /// rounds of the current wait from 0.
    pub(crate) fn backoff(
        self,
        round: u32,
        ec: &EventCount,
        observed: u64,
        deadline: Option<Instant>,
    ) {
        match WAIT_STATE.with(|w| w.step(round, &self)) {
            Backoff::Spin => {
                for _ in 0..(1u32 << round.min(4)) {
                    std::hint::spin_loop();
                }
            }
            Backoff::Yield => {
                let start = Instant::now();
                std::thread::yield_now();
                let shared = start.elapsed() > LONE_YIELD;
                WAIT_STATE.with(|w| w.shared_core.set(shared));
            }
            Backoff::Park => ec.park(observed, deadline, self.gate),
        }
    }

    /// Waits until `done()` holds or `deadline` passes; returns whether it holds.
    pub(crate) fn wait_until(
        self,
        ec: &EventCount,
        deadline: Option<Instant>,
        mut done: impl FnMut() -> bool,
    ) -> bool {
        let mut round = 0u32;
        loop {
            let observed = ec.epoch();
            if done() {
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            self.backoff(round, ec, observed, deadline);
            round = round.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    #[test]
    fn notify_wakes_a_parked_waiter_without_loss() {
        for _ in 0..200 {
            let ec = Arc::new(EventCount::default());
            let flag = Arc::new(AtomicBool::new(false));
            let (ec2, flag2) = (ec.clone(), flag.clone());
            let t = std::thread::spawn(move || {
                let gate = SpinGate::new(1);
                let policy = SpinPolicy { spins: 0, yields: 0, gate: &gate };
                policy.wait_until(&ec2, Some(Instant::now() + Duration::from_secs(20)), || {
                    flag2.load(Ordering::SeqCst)
                })
            });
            flag.store(true, Ordering::SeqCst);
            ec.notify();
            assert!(t.join().unwrap());
        }
    }

    /// The rounds of one wait that never succeeds, up to `rounds`.
    fn rounds(state: &WaitState, policy: &SpinPolicy<'_>, rounds: u32) -> Vec<Backoff> {
        (0..rounds).map(|r| state.step(r, policy)).collect()
    }

    #[test]
    fn a_closed_gate_yields_the_yield_rounds_only_and_then_parks() {
        let gate = SpinGate::new(1);
        gate.wake();
        gate.wake();
        let policy = SpinPolicy { spins: 64, yields: 4, gate: &gate };
        let state = WaitState::new();
        let got = rounds(&state, &policy, 7);
        let mut want = vec![Backoff::Yield; 4];
        want.extend([Backoff::Park; 3]);
        assert_eq!(got, want);
    }

    #[test]
    fn an_open_gate_spins_then_yields_then_parks() {
        // Two awake threads on two cores: each has a core of its own.
        let gate = SpinGate::new(2);
        gate.wake();
        gate.wake();
        let policy = SpinPolicy { spins: 8, yields: 2, gate: &gate };
        let state = WaitState::new();
        let got = rounds(&state, &policy, 11);
        let mut want = vec![Backoff::Spin; 8];
        want.extend([Backoff::Yield, Backoff::Yield, Backoff::Park]);
        assert_eq!(got, want);
    }

    #[test]
    fn a_policy_with_fewer_spin_rounds_than_the_probe_never_spins() {
        let gate = SpinGate::new(2);
        gate.wake();
        let state = WaitState::new();
        // A wait under a spinning policy ends while spinning ...
        let spinning = SpinPolicy { spins: 64, yields: 1, gate: &gate };
        assert_eq!(state.step(0, &spinning), Backoff::Spin);
        // ... and the thread's next wait runs under a policy without spin rounds.
        let none = SpinPolicy { spins: 0, yields: 1, gate: &gate };
        assert_eq!(rounds(&state, &none, 2), [Backoff::Yield, Backoff::Park]);
    }

    #[test]
    fn a_thread_whose_last_yield_ran_someone_else_does_not_spin() {
        let gate = SpinGate::new(2);
        gate.wake();
        let policy = SpinPolicy { spins: 8, yields: 2, gate: &gate };
        let state = WaitState::new();
        state.shared_core.set(true);
        assert_eq!(rounds(&state, &policy, 3), [Backoff::Yield, Backoff::Yield, Backoff::Park]);
        state.shared_core.set(false);
        assert_eq!(state.step(0, &policy), Backoff::Spin);
    }

    #[test]
    fn a_spin_phase_that_runs_out_halves_the_budget_and_success_doubles_it() {
        let gate = SpinGate::new(2);
        gate.wake();
        let policy = SpinPolicy { spins: 64, yields: 1, gate: &gate };
        let state = WaitState::new();
        let spins_of = |state: &WaitState| {
            rounds(state, &policy, 80).iter().filter(|&&b| b == Backoff::Spin).count()
        };
        // Failed waits: 64, then 32, 16, 8, 4 and never fewer than the probe rounds.
        let failed: Vec<usize> = (0..6).map(|_| spins_of(&state)).collect();
        assert_eq!(failed, [64, 32, 16, 8, 4, 4]);
        // A wait that succeeds during its spin phase (after two spin rounds) lets the next wait
        // spin twice as long; that one failed, so it halved the budget again.
        let succeed = |state: &WaitState| {
            assert_eq!(state.step(0, &policy), Backoff::Spin);
            assert_eq!(state.step(1, &policy), Backoff::Spin);
        };
        succeed(&state);
        assert_eq!(spins_of(&state), 8);
        succeed(&state);
        succeed(&state);
        succeed(&state);
        assert_eq!(spins_of(&state), 32);
    }

    #[test]
    fn a_linger_ends_when_the_condition_holds_or_after_its_budget() {
        let looks = std::cell::Cell::new(0);
        let third = || {
            looks.set(looks.get() + 1);
            looks.get() == 3
        };
        assert!(linger_for(third, Duration::from_secs(60), None));
        assert_eq!(looks.get(), 3, "it stops looking once the condition held");
        let start = Instant::now();
        assert!(!linger(|| false, None));
        assert!(start.elapsed() >= LINGER, "gave up before its budget");
        let past = Some(Instant::now());
        assert!(!linger_for(|| false, Duration::from_secs(60), past), "the deadline ends it");
    }

    #[test]
    fn park_returns_at_the_deadline() {
        let ec = EventCount::default();
        let gate = SpinGate::new(1);
        let policy = SpinPolicy { spins: 1, yields: 1, gate: &gate };
        assert!(!policy.wait_until(&ec, Some(Instant::now() + Duration::from_millis(5)), || false));
    }
}
