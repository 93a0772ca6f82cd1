//! Ready tasks the submitting thread holds while the threads that could run them are awake,
//! handed over in batches (steps 11–16, continuing the combining protocol of `inbox`;
//! `docs/engine-protocols.md` §6).
//!
//! Handing one ready task to the scheduler costs the submitting thread the inbox lock, the
//! inbox's `pending` word and the role word, each last written by the thread that drained the
//! task before: a cache-line transfer apiece, per task, on the thread that is usually the
//! bottleneck. Past a run's first tasks, while the endpoint threads that could run it are
//! awake, a ready task is held here instead and handed over [`READY_BATCH`] at a time, or taken
//! by an endpoint thread.
//!
//! # Protocol
//!
//! 11. **Hold.** The submitter appends the entry under the buffer lock. An entry that made the
//!     buffer non-empty opens a new period in `period`, then (after a SeqCst fence) reads which
//!     endpoint threads are parked (`parked`) into the submitter's snapshot. An entry whose
//!     threads the snapshot shows parked is handed over at once (step 12), with everything held
//!     before it: a thread that could run it sleeps. A single's thread is its target; a SUB
//!     task's are the SUB threads, a group's the NEXT_LEVEL threads, and either is handed over
//!     if any of them is parked. Other entries ride on the take the period is owed (steps
//!     13–16), as a join does (step 1). A submit with nothing held whose threads look parked
//!     delivers as in steps 1–10 instead of holding.
//! 12. **Hand over.** The submitter moves every held entry to the inbox under the buffer lock,
//!     then reads the role as in step 7 and drives (step 2) unless a holder will. It hands over
//!     when [`READY_BATCH`] entries are held, when it publishes a task that is not ready (it
//!     may wait for held ones), before it waits for window or heap space, and when the run's
//!     submission ends.
//! 13. **Take when out of mail.** An endpoint thread with an empty mailbox moves the held
//!     entries to the inbox (under the buffer lock, so they keep their order) when it takes the
//!     idle-driver role and when it gives it back (step 8), and drives.
//! 14. **Take before parking.** An endpoint thread about to park marks itself in `parked` (a
//!     read-modify-write, then a SeqCst fence), takes the held entries, and only then locks its
//!     mailbox and parks; it leaves `parked` once it has mail.
//! 15. **Take when stale.** An endpoint thread that finds, after a completion or while it
//!     spins, that the open period began [`STALE_AFTER`] ago or more takes the held entries:
//!     a submitting thread that pauses without closing while every endpoint thread stays busy
//!     delays its held tasks by that much plus the task an endpoint thread is running, not
//!     until an endpoint thread runs out of mail.
//! 16. **Why nothing is held forever.** The append that opened a period and a parking thread's
//!     mark are each followed by a SeqCst fence and a read of the other's word, so at least one
//!     of them sees the other: either the period's snapshot shows the thread parked, and every
//!     entry it could run is handed over when appended, or the thread reads `period` as that
//!     period or a later state and takes what is then held. An entry appended behind others
//!     joins a period nobody has taken since it opened (the buffer is not empty), so the take
//!     it rides on is still owed; one appended after that take finds the buffer empty and
//!     opens a period whose snapshot is read after the thread's mark. So an entry is held only
//!     while no thread that could run it was parked when its period opened, and a thread that
//!     parks later takes it first; an awake thread takes it when it next runs out of mail,
//!     parks, or sees it stale. Modelled in `loom_models`.
//!
//! The buffer lock is a leaf except that a hand-over or take holds it while it appends to the
//! inbox (lock-order rule 1). Held entries are ready slots charged to the run: an abort or a
//! failure that cancels them finds them there, and a pass that meets a cancelled one skips it.
//! Threads are judged per target rather than engine-wide, so that an idle pool of SUB workers,
//! parked beside busy NEXT_LEVEL ones, does not switch holding off for the NEXT_LEVEL tasks
//! (measured: a P1 stream 35–45 % slower per task with one parked SUB thread in the engine).
//! `parked` keeps one bit per NEXT_LEVEL thread below [`PARKED_BITS`], a count of the SUB
//! threads, and a count of the NEXT_LEVEL threads past the bits; a SUB task is held only while
//! its count is zero, a group only while no NEXT_LEVEL thread is marked, a single for a thread
//! past the bits only while theirs is zero.

use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use simpler_types::CancelReason;

use crate::core::Core;
use crate::graph::GraphScratch;
use crate::inbox::{Closed, IdleDriver, Inbox, ReadyEntry, WorkerSlot, deliver_ready, drive};
use crate::scheduler::Own;
use crate::slot::Route;
use crate::sync::{self, AtomicU64, Mutex, MutexGuard, Ordering};

/// Most ready tasks held before the submitter hands them over (holding as a whole took a P1
/// task from 0.38–0.41 to 0.27–0.29 µs in the machine's fast mode; 4, 8 and 32 measured alike
/// in a first version).
pub(crate) const READY_BATCH: usize = 16;

/// How long one period of held entries may last before an endpoint thread that sees it takes
/// them (step 15). A submitting thread that keeps submitting hands a batch over in a few
/// microseconds.
pub(crate) const STALE_AFTER: Duration = Duration::from_micros(50);

/// NEXT_LEVEL threads with a bit of their own in `parked` (registration indices below this).
pub(crate) const PARKED_BITS: u32 = 64;

/// Which endpoint threads are parked or about to park (step 14). Each thread adds its own
/// share when it marks itself and subtracts it when it has mail ([`ParkedWords::share`]), one
/// read-modify-write each: a bit is only ever added while clear and subtracted while set, so
/// the adds and subtracts act as setting and clearing it.
#[derive(Default)]
struct ParkedWords {
    /// Bit `i`: NEXT_LEVEL thread `i` (for `i` below [`PARKED_BITS`]).
    next_level: AtomicU64,
    /// NEXT_LEVEL threads past the bits.
    next_level_past: AtomicU64,
    /// SUB threads.
    sub: AtomicU64,
}

impl ParkedWords {
    /// The word `who` marks itself in, and what it adds there.
    fn share(&self, who: WorkerSlot) -> (&AtomicU64, u64) {
        match who {
            WorkerSlot::NextLevel(i) if i < PARKED_BITS => (&self.next_level, 1 << i),
            WorkerSlot::NextLevel(_) => (&self.next_level_past, 1),
            WorkerSlot::Sub(_) => (&self.sub, 1),
        }
    }
}

/// The submitter's reading of `parked` when it opened a period (step 11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Parked {
    next_level: u64,
    next_level_past: u64,
    sub: u64,
}

impl Parked {
    /// Every thread parked: what a submitter's holding assumes before it has read a snapshot
    /// of its own, so that an entry appended to a period it did not open is handed over.
    const ALL: Parked = Parked { next_level: u64::MAX, next_level_past: u64::MAX, sub: u64::MAX };

    /// Whether a thread that could run an entry with `route` is parked in this reading.
    pub(crate) fn blocks(self, route: Route) -> bool {
        match route {
            Route::Single { worker } if worker < PARKED_BITS => self.next_level >> worker & 1 == 1,
            Route::Single { .. } => self.next_level_past != 0,
            Route::Group => self.next_level != 0 || self.next_level_past != 0,
            Route::Sub { .. } => self.sub != 0,
            // Never queued; never held either.
            Route::Unrouted => true,
        }
    }
}

#[derive(Default)]
struct Held {
    entries: Vec<ReadyEntry>,
    /// Periods opened so far (step 11).
    periods: u64,
}

/// The held entries (one submitting thread at a time: a single run builds).
pub(crate) struct HeldReady {
    held: Mutex<Held>,
    /// `periods << 1 | 1` while entries are held, `periods << 1` otherwise. Written under the
    /// lock when a period opens (the submitter) and when it closes (whoever moves the entries);
    /// read without it by endpoint threads (steps 13–15).
    period: CachePadded<AtomicU64>,
    /// When the open period began, in nanoseconds since `epoch` (step 15). Written with
    /// `period`, under the lock.
    opened: AtomicU64,
    epoch: Instant,
    /// Nanoseconds a period may last before it is stale ([`STALE_AFTER`]; tests change it).
    stale_after: AtomicU64,
    /// Endpoint threads parked or about to park (step 14). Read by the submitter when it
    /// starts holding (a hint) and after opening a period (step 16).
    parked: CachePadded<ParkedWords>,
    /// Takes by endpoint threads that found entries, for tests.
    #[cfg(all(test, not(simpler_loom)))]
    pub(crate) takes: std::sync::atomic::AtomicU64,
}

impl Default for HeldReady {
    fn default() -> HeldReady {
        HeldReady {
            held: Mutex::default(),
            period: CachePadded::default(),
            opened: AtomicU64::new(0),
            epoch: Instant::now(),
            stale_after: AtomicU64::new(STALE_AFTER.as_nanos() as u64),
            parked: CachePadded::default(),
            #[cfg(all(test, not(simpler_loom)))]
            takes: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl HeldReady {
    /// Nanoseconds since `epoch`.
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Step 11's append. Returns whether the entry opened a period, and how many entries are
    /// held now.
    fn append(&self, entry: ReadyEntry) -> (bool, usize) {
        let mut held = self.held.lock();
        let first = held.entries.is_empty();
        held.entries.push(entry);
        if first {
            held.periods += 1;
            // Relaxed: written under the lock; readers that act on it take the lock, and step
            // 16's fences order the parking thread's read. A stale read of `opened` only makes
            // a take early or late by one period.
            self.opened.store(self.now(), Ordering::Relaxed);
            self.period.store(held.periods << 1 | 1, Ordering::Relaxed);
        }
        (first, held.entries.len())
    }

    /// Moves every held entry to the inbox (steps 12–15); `Ok(false)` when none was held. On
    /// `Err(Closed)` the entries are moved to `refused` instead: the scheduler has stopped.
    fn move_to(&self, inbox: &Inbox, refused: &mut Vec<ReadyEntry>) -> Result<bool, Closed> {
        let mut held = self.held.lock();
        if held.entries.is_empty() {
            return Ok(false);
        }
        let moved = inbox.push_ready_all(&mut held.entries);
        if moved.is_err() {
            refused.append(&mut held.entries);
        }
        // Relaxed: under the lock, like every write.
        self.period.store(held.periods << 1, Ordering::Relaxed);
        moved.map(|()| true)
    }

    /// Whether entries seem held (steps 13–15; exact after the fences of step 16).
    fn seems_held(&self) -> bool {
        // Relaxed: see `append`.
        self.period.load(Ordering::Relaxed) & 1 == 1
    }

    /// Which endpoint threads are parked (a hint, or step 11's snapshot after its fence).
    fn parked_now(&self) -> Parked {
        // Relaxed: a hint, or ordered by the fences of step 16.
        Parked {
            next_level: self.parked.next_level.load(Ordering::Relaxed),
            next_level_past: self.parked.next_level_past.load(Ordering::Relaxed),
            sub: self.parked.sub.load(Ordering::Relaxed),
        }
    }

    /// Step 14's mark, before the take; [`unparked`](Self::unparked) must follow once the
    /// thread has mail.
    pub(crate) fn parking(&self, who: WorkerSlot) {
        let (word, share) = self.parked.share(who);
        // The fence pairs with the submitter's (step 16).
        word.fetch_add(share, Ordering::SeqCst);
        sync::fence_seq_cst();
    }

    /// Step 14's end: the thread has mail again.
    pub(crate) fn unparked(&self, who: WorkerSlot) {
        let (word, share) = self.parked.share(who);
        // Relaxed: the mark only; step 16's fences order what depends on it.
        word.fetch_sub(share, Ordering::Relaxed);
    }

    /// Step 15's look: whether a period is open and began at least `stale_after` ago. Reads
    /// the clock only while entries are held.
    pub(crate) fn is_stale(&self) -> bool {
        // Relaxed: a hint; the take that follows works under the lock.
        if !self.seems_held() {
            return false;
        }
        let opened = self.opened.load(Ordering::Relaxed);
        self.now().saturating_sub(opened) >= self.stale_after.load(Ordering::Relaxed)
    }

    /// Makes a period stale after `after` (tests that must not see step 15).
    #[cfg(all(test, not(simpler_loom)))]
    pub(crate) fn set_stale_after(&self, after: Duration) {
        let nanos = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
        self.stale_after.store(nanos, Ordering::Relaxed);
    }

    /// Entries held, for tests.
    #[cfg(all(test, not(simpler_loom)))]
    pub(crate) fn len(&self) -> usize {
        self.held.lock().entries.len()
    }

    /// Endpoint threads marked as parked, for tests.
    #[cfg(all(test, not(simpler_loom)))]
    pub(crate) fn parked(&self) -> u64 {
        let p = self.parked_now();
        u64::from(p.next_level.count_ones()) + p.next_level_past + p.sub
    }

    /// Whether exactly the SUB threads `sub` are marked as parked, and no NEXT_LEVEL one.
    #[cfg(all(test, not(simpler_loom)))]
    pub(crate) fn only_sub_parked(&self, sub: u64) -> bool {
        let p = self.parked_now();
        p == Parked { next_level: 0, next_level_past: 0, sub }
    }
}

/// Step 11: holds `entry`; `true` when the caller must hand over now (step 12). `parked` is
/// the snapshot of the period the entry belongs to: read here when the entry opens one.
pub(crate) fn hold(held: &HeldReady, entry: ReadyEntry, parked: &mut Parked) -> bool {
    match held.append(entry) {
        (true, _) => {
            // Pairs with the parking thread's fence (step 16).
            sync::fence_seq_cst();
            *parked = held.parked_now();
            parked.blocks(entry.route)
        }
        (false, len) => len >= READY_BATCH || parked.blocks(entry.route),
    }
}

/// Step 12: moves every held entry to the inbox, then drives unless a holder will.
/// `Err(Closed)` leaves the entries in `refused`: the scheduler has stopped for good, and the
/// caller must cancel them.
pub(crate) fn hand_over<S>(
    held: &HeldReady,
    driver: &IdleDriver,
    inbox: &Inbox,
    lock: &Mutex<S>,
    refused: &mut Vec<ReadyEntry>,
    pass: impl FnMut(&mut MutexGuard<'_, S>),
) -> Result<(), Closed> {
    if held.move_to(inbox, refused)? && !driver.still_held() {
        drive(inbox, lock, pass);
    }
    Ok(())
}

/// Steps 13–15's take, for an endpoint thread: moves the held entries, if any, to the inbox;
/// `true` when it moved some (the caller then drives). `refused` must be empty; entries a
/// closed inbox refuses are left in it, and the caller must cancel them.
pub(crate) fn take(held: &HeldReady, inbox: &Inbox, refused: &mut Vec<ReadyEntry>) -> bool {
    if !held.seems_held() {
        return false;
    }
    let moved = held.move_to(inbox, refused).unwrap_or(false);
    #[cfg(all(test, not(simpler_loom)))]
    if moved {
        held.takes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    moved
}

/// An endpoint thread's state for taking held tasks (steps 13–15).
#[derive(Default)]
pub(crate) struct EndpointTake {
    /// Entries a closed inbox refused, to cancel (empty between takes).
    pub(crate) refused: Vec<ReadyEntry>,
    /// Work lists for cancelling them.
    pub(crate) graph: GraphScratch,
}

/// What the submitting thread keeps for holding (in the orchestrator state).
pub(crate) struct Holding {
    /// Entries may be held (the submitter held one and has not handed over since; an endpoint
    /// thread may have taken them meanwhile).
    active: bool,
    /// The snapshot of the last period this submitter opened (step 11).
    parked: Parked,
    /// After `Err(Closed)`, the entries the stopped scheduler refused (kept for its capacity).
    refused: Vec<ReadyEntry>,
}

impl Default for Holding {
    fn default() -> Holding {
        Holding { active: false, parked: Parked::ALL, refused: Vec::new() }
    }
}

/// A task published ready: held (step 11) past a run's first tasks (`may_hold`) while entries
/// are held already or its threads look awake; otherwise delivered as in steps 1–10
/// (`own_pass` runs on it if the scheduler lock is free). `Err(Closed)` once the scheduler has
/// stopped for good, with the refused entries in `holding.refused`.
#[allow(clippy::too_many_arguments, reason = "the protocol's parts, passed apart for the models")]
pub(crate) fn publish_ready<S>(
    held: &HeldReady,
    driver: &IdleDriver,
    inbox: &Inbox,
    lock: &Mutex<S>,
    entry: ReadyEntry,
    may_hold: bool,
    holding: &mut Holding,
    own_pass: impl FnOnce(&mut MutexGuard<'_, S>, ReadyEntry),
    mut pass: impl FnMut(&mut MutexGuard<'_, S>),
) -> Result<(), Closed> {
    if may_hold && (holding.active || !held.parked_now().blocks(entry.route)) {
        holding.active = true;
        if hold(held, entry, &mut holding.parked) {
            return hand_over_held(held, driver, inbox, lock, holding, pass);
        }
        return Ok(());
    }
    deliver_ready(inbox, lock, entry, may_hold, own_pass, &mut pass).inspect_err(|_| {
        holding.refused.push(entry);
    })
}

/// Step 12 for the submitting thread, if it may hold entries. `Err(Closed)` as for
/// [`publish_ready`].
pub(crate) fn hand_over_held<S>(
    held: &HeldReady,
    driver: &IdleDriver,
    inbox: &Inbox,
    lock: &Mutex<S>,
    holding: &mut Holding,
    pass: impl FnMut(&mut MutexGuard<'_, S>),
) -> Result<(), Closed> {
    if !std::mem::take(&mut holding.active) {
        return Ok(());
    }
    hand_over(held, driver, inbox, lock, &mut holding.refused, pass)
}

impl Core {
    /// A task published ready (submit step 8; [`publish_ready`]). Cancels what the stopped
    /// scheduler refuses.
    pub(crate) fn publish_ready(
        &self,
        entry: ReadyEntry,
        may_hold: bool,
        holding: &mut Holding,
        graph: &mut GraphScratch,
    ) {
        let published = publish_ready(
            &self.held_ready,
            &self.idle_driver,
            &self.inbox,
            &self.sched,
            entry,
            may_hold,
            holding,
            |state, entry| self.run_pass(state, Own::Ready(entry)),
            |state| self.run_pass(state, Own::Nothing),
        );
        if published.is_err() {
            self.cancel_refused(&mut holding.refused, graph);
        }
    }

    /// Step 12, when the submitting thread may hold entries.
    pub(crate) fn hand_over(&self, holding: &mut Holding, graph: &mut GraphScratch) {
        let handed = hand_over_held(
            &self.held_ready,
            &self.idle_driver,
            &self.inbox,
            &self.sched,
            holding,
            |state| self.run_pass(state, Own::Nothing),
        );
        if handed.is_err() {
            self.cancel_refused(&mut holding.refused, graph);
        }
    }

    /// Steps 13–15 for an endpoint thread: takes the held entries, if any, and drives.
    pub(crate) fn take_held(&self, state: &mut EndpointTake) {
        if take(&self.held_ready, &self.inbox, &mut state.refused) {
            self.drive();
        }
        self.cancel_refused(&mut state.refused, &mut state.graph);
    }

    /// The scheduler has stopped for good: the tasks a closed inbox refused can never run.
    /// An endpoint thread's take meets this when a run's builder outlived the scheduler (a
    /// builder still submitting after a shutdown aborted its run, say).
    pub(crate) fn cancel_refused(&self, refused: &mut Vec<ReadyEntry>, graph: &mut GraphScratch) {
        for entry in refused.drain(..) {
            self.cancel_unstarted(entry.slot, CancelReason::Shutdown, graph);
        }
    }
}

#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use simpler_types::{
        CallConfig, CallableId, CallableKind, CallableNamespace, DataType, TaskArgs, TaskId,
        TaskState, Tensor, WorkerId, WorkerType,
    };

    use crate::builder::RunBuilder;
    use crate::endpoint::{DispatchedMember, Endpoint, EndpointCaps, EndpointFailure};
    use crate::engine::{Engine, EngineConfig};
    use crate::outcome::RunOutcome;
    use crate::scheduler::tests::{Gate, chip, gated_engine, wait_until};

    /// A SUB endpoint that finishes every member at once.
    struct Quick;

    impl Endpoint for Quick {
        fn caps(&self) -> EndpointCaps {
            EndpointCaps {
                worker_type: WorkerType::Sub,
                id: WorkerId(0),
                remote: false,
                name: "quick".into(),
            }
        }

        fn run(&mut self, _: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
            Ok(())
        }
    }

    /// A gated NEXT_LEVEL endpoint (the test's tokens finish its members) beside an idle SUB
    /// one.
    fn next_level_beside_a_sub() -> (Engine, mpsc::Sender<()>) {
        let (tx, rx) = mpsc::channel();
        let engine = Engine::start(EngineConfig {
            next_level: vec![Box::new(Gate(rx))],
            sub: vec![Box::new(Quick)],
            ..EngineConfig::default()
        })
        .unwrap();
        (engine, tx)
    }

    /// Opens a run whose first task occupies the NEXT_LEVEL thread, then submits sixteen more
    /// for it (past `LATENCY_BOUND_TASKS`, so the last may be held), once the SUB thread alone
    /// is parked. With the stale rule off, nothing but the submitting thread can then hand
    /// held tasks over: the NEXT_LEVEL thread waits for a token and the SUB thread sleeps.
    /// Returns the builder and the last task.
    fn busy_next_level_while_the_sub_thread_sleeps(engine: &Engine) -> (RunBuilder<'_>, TaskId) {
        let core = engine.core();
        core.held_ready.set_stale_after(Duration::MAX);
        let cfg = CallConfig::default();
        let mut b = engine.begin_run().unwrap();
        let first = b.submit_next_level(&chip(), TaskArgs::new(), &cfg, WorkerId(0), None).unwrap();
        // Running is set at dispatch, before the thread has left its park: wait for the marks
        // themselves (step 14) to show the NEXT_LEVEL thread awake and the SUB thread parked.
        wait_until(|| engine.task_snapshot(first).unwrap().state == TaskState::Running);
        wait_until(|| core.held_ready.only_sub_parked(1));
        let mut last = first;
        for _ in 1..17 {
            last = b.submit_next_level(&chip(), TaskArgs::new(), &cfg, WorkerId(0), None).unwrap();
        }
        (b, last)
    }

    fn host() -> CallableId {
        CallableId::new([2; 32], CallableKind::Host, CallableNamespace::LocalHost)
    }

    #[test]
    fn a_parked_sub_thread_does_not_stop_next_level_tasks_from_being_held() {
        let (engine, tx) = next_level_beside_a_sub();
        let (b, _) = busy_next_level_while_the_sub_thread_sleeps(&engine);
        let core = engine.core();
        assert_eq!(core.held_ready.len(), 1, "the seventeenth task was not held");
        for _ in 0..17 {
            tx.send(()).unwrap();
        }
        let outcome = engine.wait_timeout(b.close(), Duration::from_secs(20)).unwrap();
        assert_eq!(outcome, Some(RunOutcome::Completed));
    }

    #[test]
    fn a_sub_task_published_behind_held_tasks_runs_while_the_next_level_thread_stays_busy() {
        // The SUB thread is parked when its task is published behind a held NEXT_LEVEL task,
        // and nothing else would take the held tasks. The SUB task must be handed over at once
        // (step 11), not held behind the others.
        let (engine, tx) = next_level_beside_a_sub();
        let (mut b, last) = busy_next_level_while_the_sub_thread_sleeps(&engine);
        let core = engine.core();
        assert_eq!(core.held_ready.len(), 1, "the seventeenth task was not held");
        let sub = b.submit_sub(&host(), TaskArgs::new()).unwrap();
        wait_until(|| engine.task_snapshot(sub).unwrap().state == TaskState::Completed);
        assert_eq!(engine.task_snapshot(last).unwrap().state, TaskState::Ready);
        for _ in 0..17 {
            tx.send(()).unwrap();
        }
        let outcome = engine.wait_timeout(b.close(), Duration::from_secs(20)).unwrap();
        assert_eq!(outcome, Some(RunOutcome::Completed));
    }

    /// A NEXT_LEVEL endpoint whose every task takes `0.2 ms`.
    struct Slow;

    impl Endpoint for Slow {
        fn caps(&self) -> EndpointCaps {
            EndpointCaps {
                worker_type: WorkerType::NextLevel,
                id: WorkerId(0),
                remote: false,
                name: "slow".into(),
            }
        }

        fn run(&mut self, _: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
            std::thread::sleep(Duration::from_micros(200));
            Ok(())
        }
    }

    #[test]
    fn a_task_held_while_its_endpoint_never_runs_out_of_mail_is_taken_once_stale() {
        // The endpoint runs a chain of 100 tasks, each completion dispatching the next to the
        // same thread, so its mailbox is never empty for 20 ms and it never parks. A task
        // published meanwhile is held (step 11) and the submitting thread then stops submitting
        // without closing: only the take of a stale period (step 15) can find it before the
        // chain ends.
        let engine = Engine::start(EngineConfig {
            next_level: vec![Box::new(Slow)],
            ..EngineConfig::default()
        })
        .unwrap();
        let core = engine.core();
        let cfg = CallConfig::default();
        let buffer = Tensor::external(0x1000, &[64], DataType::UInt8).unwrap();
        let mut b = engine.begin_run().unwrap();
        let mut chain = Vec::new();
        for _ in 0..100 {
            let mut args = TaskArgs::new();
            args.add_inout(buffer).unwrap();
            chain.push(b.submit_next_level(&chip(), args, &cfg, WorkerId(0), None).unwrap());
        }
        wait_until(|| engine.task_snapshot(chain[1]).unwrap().state == TaskState::Completed);
        assert_eq!(core.held_ready.parked(), 0);
        let held = b.submit_next_level(&chip(), TaskArgs::new(), &cfg, WorkerId(0), None).unwrap();
        wait_until(|| engine.task_snapshot(held).unwrap().state == TaskState::Completed);
        let last = engine.task_snapshot(chain[99]).unwrap().state;
        assert_ne!(last, TaskState::Completed, "the held task waited for the whole chain");
        let takes = core.held_ready.takes.load(std::sync::atomic::Ordering::Relaxed);
        assert!(takes > 0, "the task was not held and taken: nothing was tested");
        let outcome = engine.wait_timeout(b.close(), Duration::from_secs(20)).unwrap();
        assert_eq!(outcome, Some(RunOutcome::Completed));
    }

    #[test]
    fn a_task_held_while_its_endpoint_was_busy_runs_when_the_endpoint_parks_without_the_role() {
        // The endpoint thread is busy (its first task waits at the gate) when the seventeenth
        // task is published, so the task is held (step 11). The test thread holds the
        // idle-driver role throughout, so the endpoint, once out of mail, never takes it
        // (step 13): only its take before parking (step 14) can find the held task. The run
        // stays open, so closing does not hand it over either.
        let (engine, tx) = gated_engine();
        let core = engine.core();
        // Nor may a stale period (step 15) rescue it.
        core.held_ready.set_stale_after(Duration::MAX);
        wait_until(|| core.idle_driver.take());
        let cfg = CallConfig::default();
        let mut b = engine.begin_run().unwrap();
        let mut submit = || b.submit_next_level(&chip(), TaskArgs::new(), &cfg, WorkerId(0), None);
        let first = submit().unwrap();
        wait_until(|| engine.task_snapshot(first).unwrap().state == TaskState::Running);
        // Awake once it has its first task (step 14).
        wait_until(|| core.held_ready.parked() == 0);
        let mut last = first;
        for _ in 1..17 {
            last = submit().unwrap();
        }
        assert_eq!(core.held_ready.len(), 1, "the seventeenth task was not held");
        for _ in 0..17 {
            tx.send(()).unwrap();
        }
        wait_until(|| engine.task_snapshot(last).unwrap().state == TaskState::Completed);
        core.give_back_idle_driver(&mut crate::held_ready::EndpointTake::default());
        let run = b.close();
        let outcome = engine.wait_timeout(run, Duration::from_secs(20)).unwrap();
        assert_eq!(outcome, Some(RunOutcome::Completed));
    }
}
