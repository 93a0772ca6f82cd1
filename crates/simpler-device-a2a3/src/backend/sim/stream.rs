//! Simulated streams, launch entries and events (`docs/device-simulator.md`).
//!
//! A stream is a FIFO of entries under a mutex and a condition variable. `launch` appends and
//! returns. The head entry starts by handing a job to each participant (AICore cores
//! `[0, 3B)` or AICPU threads `[0, n)`); it completes when the last participant returns, and
//! that participant starts the next entry. An entry's result is the first non-zero participant
//! result. A failed entry puts the stream into a sticky error state: later entries are
//! discarded as abandoned, every event recorded behind it fails with that error (and so does
//! every stream waiting on such an event), and every sync reports the error until the device
//! is reset.
//!
//! Protocol of an entry (who does what):
//!
//! 1. Host: `enqueue` appends it; if nothing runs, the host starts it (step 2).
//! 2. Starter (host or the last participant of the previous entry), under the stream lock:
//!    stamp `started`, make it the running entry, post one job per participant.
//! 3. Participants run and call `finish` with their code; the first non-zero code is kept
//!    (`result` CAS from 0).
//! 4. The participant whose `remaining` decrement reaches zero completes the entry under the
//!    stream lock (latching the sticky error if the result is non-zero) and starts the next one.
//! 5. A sync or query that finds an AICore entry running longer than the op-execute budget fails
//!    it (sticky 507014) and sets `aborted`, which releases the participants' waits; the entry
//!    still completes in step 4 once they return.
//!
//! Modelled device time (`docs/device-simulator.md`): kernels may declare how long they take
//! on the chip ([`crate::kernel::model_device_time`]). Each stream keeps `busy_until`, the
//! modelled end of its latest completed entry. An entry that starts before it has its modelled
//! start moved there; at completion `busy_until` becomes at least modelled start + the time
//! its kernels declared. Entries still run in real time at once: only what the host (or
//! another stream) observes waits for the modelled time. An event takes the stream's
//! `busy_until` when it fires as the instant it becomes visible; a stream waiting on it takes
//! that instant into its own `busy_until`. Both only grow, so a later record on a stream never
//! becomes visible before an earlier one.
//!
//! Lock order: stream lock → mailbox lock. Event callbacks run after the stream lock is
//! released.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::wait::{deadline_after, earliest, linger, sleep_until_precisely, wait_on};
use crate::abi::codes::AclCode;
use crate::backend::{StreamFault, StreamStatus, SyncError};
use crate::error::StreamKind;

/// What an entry runs.
#[derive(Debug)]
pub(crate) enum EntryKind {
    /// The AICore executor on `3 * block_dim` cores.
    AiCore { block_dim: u32 },
    /// The AICPU `exec` entry on `threads` threads.
    Aicpu { threads: u32 },
    /// Completes the event once every earlier entry completed.
    Record(Arc<SimEvent>),
    /// Holds later entries until the event completed.
    WaitEvent(Arc<SimEvent>),
}

/// One launch (or event operation) on a stream.
#[derive(Debug)]
pub(crate) struct LaunchEntry {
    pub(crate) kind: EntryKind,
    /// Device address of the launch's `KernelArgs`.
    pub(crate) args: u64,
    /// Participants still running; written by participants (`fetch_sub`), read by the last.
    remaining: AtomicU32,
    /// First non-zero participant result; CAS from 0 by participants, read at completion.
    result: AtomicI32,
    /// Set by the op-execute watchdog or a device reset; read by participants' waits.
    pub(crate) aborted: AtomicBool,
    /// Counter ticks + 1 when the entry started (0 = not started); written by the starter.
    pub(crate) started_ticks: AtomicU64,
    /// Host instant when the entry started; written by the starter, read by the watchdog.
    started_at: Mutex<Option<Instant>>,
    /// Time on the chip its kernels declared, in nanoseconds; added to by the kernels'
    /// threads, read by the completing participant.
    modelled_ns: AtomicU64,
}

impl LaunchEntry {
    pub(crate) fn new(kind: EntryKind, args: u64) -> Arc<LaunchEntry> {
        let participants = match kind {
            EntryKind::AiCore { block_dim } => 3 * block_dim,
            EntryKind::Aicpu { threads } => threads,
            EntryKind::Record(_) | EntryKind::WaitEvent(_) => 0,
        };
        Arc::new(LaunchEntry {
            kind,
            args,
            remaining: AtomicU32::new(participants),
            result: AtomicI32::new(0),
            aborted: AtomicBool::new(false),
            started_ticks: AtomicU64::new(0),
            started_at: Mutex::new(None),
            modelled_ns: AtomicU64::new(0),
        })
    }

    /// Whether the entry is being torn down (its waits must give up).
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Records a participant's result; returns `true` for the last participant.
    pub(crate) fn finish_participant(&self, code: i32) -> bool {
        if code != 0 {
            // Relaxed on failure: only the first non-zero value matters, and it is read after
            // the AcqRel decrement below by the completing participant.
            let _ = self.result.compare_exchange(0, code, Ordering::AcqRel, Ordering::Relaxed);
        }
        // AcqRel: the completing participant must see every other participant's result.
        self.remaining.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Adds time on the chip a kernel of this entry declared (`ns` nanoseconds; all kernels of
    /// the entry, on every core, count as if they ran one after another), saturating.
    pub(crate) fn add_modelled_time(&self, ns: u64) {
        if ns > 0 {
            // Relaxed: read by the completing participant after its AcqRel `remaining`
            // decrement. A core's participant ends after the kernels it served returned, and the
            // thread that ends it has synchronised with the one that ran them (the core's
            // completion store and the exit handshake), so the decrements order the additions
            // before the read.
            let _ = self
                .modelled_ns
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_add(ns)));
        }
    }

    fn result(&self) -> i32 {
        self.result.load(Ordering::Acquire)
    }

    fn is_aicore(&self) -> bool {
        matches!(self.kind, EntryKind::AiCore { .. })
    }
}

#[derive(Debug, Default)]
struct StreamState {
    queue: VecDeque<Arc<LaunchEntry>>,
    running: Option<Arc<LaunchEntry>>,
    enqueued: u64,
    completed: u64,
    error: Option<StreamFault>,
    /// Modelled end of the latest completed entry (module docs); `None` or past when the
    /// stream's modelled time has caught up with the host's clock.
    busy_until: Option<Instant>,
    /// Modelled start of the running entry: when it started, or `busy_until` if that was later.
    modelled_start: Option<Instant>,
}

impl StreamState {
    /// The stream's modelled end if it is still ahead of the host's clock at `now`.
    fn busy_at(&self, now: Instant) -> Option<Instant> {
        self.busy_until.filter(|t| *t > now)
    }

    /// Takes `visible_at` (an event this stream waited on) into `busy_until`.
    fn wait_for_modelled(&mut self, visible_at: Option<Instant>) {
        self.busy_until = latest(self.busy_until, visible_at);
    }
}

/// A simulated event: completes when the entries before its record completed, or fails when
/// its record was discarded behind the stream's sticky error.
#[derive(Debug, Default)]
pub(crate) struct SimEvent {
    state: Mutex<EventInner>,
    cv: Condvar,
}

/// How an event ended: `Ok` completed, `Err` discarded behind this sticky error.
pub(crate) type EventOutcome = Result<(), StreamFault>;

#[derive(Debug, Default)]
struct EventInner {
    /// `None` while pending; set once by `fire`.
    outcome: Option<EventOutcome>,
    /// When the ending becomes visible (the recording stream's modelled time); `None` = at once.
    visible_at: Option<Instant>,
    waiting_streams: Vec<usize>,
}

/// An event's ending as the device sees it: the outcome and when the host may see it.
type Ending = (EventOutcome, Option<Instant>);

impl EventInner {
    fn ending(&self) -> Option<Ending> {
        self.outcome.clone().map(|o| (o, self.visible_at))
    }
}

impl crate::backend::EventState for SimEvent {
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

impl SimEvent {
    /// How the event ended as the host sees it: `None` while it is pending or its modelled
    /// time has not passed. Never blocks on the device.
    pub(crate) fn outcome(&self) -> Option<EventOutcome> {
        let (outcome, visible_at) = self.ending()?;
        visible_at.is_none_or(|t| Instant::now() >= t).then_some(outcome)
    }

    /// The ending as the device sees it, whatever its modelled time.
    fn ending(&self) -> Option<Ending> {
        self.state.lock().ending()
    }

    /// Waits until the host may see the event's ending or `wake` passes; returns the outcome if
    /// it may. The modelled time is waited for without the event's lock.
    pub(crate) fn wait_until(&self, wake: Option<Instant>) -> Option<EventOutcome> {
        let ending = {
            let mut st = self.state.lock();
            if st.outcome.is_none() && wake.is_none_or(|w| Instant::now() < w) {
                let ended = || self.state.try_lock().is_some_and(|st| st.outcome.is_some());
                parking_lot::MutexGuard::unlocked(&mut st, || linger(ended, wake));
            }
            if st.outcome.is_none() {
                wait_on(&self.cv, &mut st, wake);
            }
            st.ending()
        };
        let (outcome, visible_at) = ending?;
        if let Some(t) = visible_at {
            sleep_until_precisely(wake.map_or(t, |w| w.min(t)));
            if Instant::now() < t {
                return None;
            }
        }
        Some(outcome)
    }

    /// Either returns how the event ended or registers `stream` to be resumed by it.
    fn ending_or_register(&self, stream: usize) -> Option<Ending> {
        let mut st = self.state.lock();
        if st.outcome.is_none() {
            st.waiting_streams.push(stream);
        }
        st.ending()
    }

    /// Ends the event (the first ending stays); returns the streams waiting on it.
    fn fire(&self, outcome: EventOutcome, visible_at: Option<Instant>) -> Vec<usize> {
        let mut st = self.state.lock();
        if st.outcome.is_none() {
            st.outcome = Some(outcome);
            st.visible_at = visible_at;
        }
        self.cv.notify_all();
        std::mem::take(&mut st.waiting_streams)
    }
}

/// Events that ended while a stream lock was held, with their outcome and visible instant;
/// their waiting streams are resumed by `resume_waiters` after the lock is released.
pub(crate) type Fired = Vec<(Arc<SimEvent>, EventOutcome, Option<Instant>)>;

/// Who starts the participants of an entry (the device's job posting).
pub(crate) trait Starter {
    /// Posts one job per participant of `entry`, running on stream `stream`.
    fn post(&self, stream: usize, entry: &Arc<LaunchEntry>);
    /// The device counter now.
    fn ticks(&self) -> u64;
}

/// One simulated stream.
#[derive(Debug)]
pub(crate) struct SimStream {
    pub(crate) kind: StreamKind,
    index: usize,
    state: Mutex<StreamState>,
    cv: Condvar,
}

impl SimStream {
    pub(crate) fn new(kind: StreamKind, index: usize) -> SimStream {
        SimStream { kind, index, state: Mutex::new(StreamState::default()), cv: Condvar::new() }
    }

    /// Appends `entry`; starts it when the stream is idle. Returns the events fired on the way.
    pub(crate) fn enqueue(&self, entry: Arc<LaunchEntry>, starter: &dyn Starter) -> Fired {
        let mut st = self.state.lock();
        st.enqueued += 1;
        st.queue.push_back(entry);
        self.advance_locked(&mut st, starter)
    }

    /// Starts queued entries until one is running or the queue is empty. Returns the events that
    /// ended (their waiters are resumed by the caller after unlocking): behind a sticky error
    /// every entry is discarded and every record fails with that error, so a waiter on it
    /// never hangs and never takes it for a completion.
    fn advance_locked(&self, st: &mut StreamState, starter: &dyn Starter) -> Fired {
        let mut fired = Vec::new();
        while st.running.is_none() {
            let Some(e) = st.queue.pop_front() else { break };
            if let Some(err) = &st.error {
                st.completed += 1;
                if let EntryKind::Record(ev) = &e.kind {
                    fired.push((ev.clone(), Err(err.clone()), st.busy_until));
                }
                continue;
            }
            match &e.kind {
                EntryKind::Record(ev) => {
                    st.completed += 1;
                    fired.push((ev.clone(), Ok(()), st.busy_until));
                }
                EntryKind::WaitEvent(ev) => match ev.ending_or_register(self.index) {
                    Some(ending) => {
                        st.completed += 1;
                        self.latch_waited(st, ending);
                    }
                    None => st.running = Some(e),
                },
                EntryKind::AiCore { .. } | EntryKind::Aicpu { .. } => {
                    e.started_ticks.store(starter.ticks() + 1, Ordering::Release);
                    let now = Instant::now();
                    *e.started_at.lock() = Some(now);
                    st.modelled_start = latest(Some(now), st.busy_until);
                    st.running = Some(e.clone());
                    starter.post(self.index, &e);
                }
            }
        }
        self.cv.notify_all();
        fired
    }

    /// A wait on a failed event fails this stream with the same error: what was ordered after
    /// the failed work must not run. A completed one moves the stream's modelled time up to the
    /// event's.
    fn latch_waited(&self, st: &mut StreamState, (outcome, visible_at): Ending) {
        st.wait_for_modelled(visible_at);
        if let Err(f) = outcome
            && st.error.is_none()
        {
            let message = format!("{} waited on a failed event: {}", self.kind, f.message);
            st.error = Some(StreamFault::new(f.code, message));
        }
    }

    /// Completes the running entry `entry` (called by its last participant, or when an event it
    /// waits on fired). Returns the events fired while starting the next entries.
    pub(crate) fn complete(&self, entry: &Arc<LaunchEntry>, starter: &dyn Starter) -> Fired {
        let mut st = self.state.lock();
        if st.running.as_ref().is_some_and(|r| Arc::ptr_eq(r, entry)) {
            st.running = None;
            st.completed += 1;
            if let Some(start) = st.modelled_start.take() {
                let declared = Duration::from_nanos(entry.modelled_ns.load(Ordering::Relaxed));
                st.busy_until = latest(st.busy_until, start.checked_add(declared));
            }
            let code = entry.result();
            if code != 0 && st.error.is_none() {
                st.error = Some(StreamFault::new(
                    self.fault_code(code),
                    format!("{} entry failed with participant code {code}", self.kind),
                ));
            }
        }
        self.advance_locked(&mut st, starter)
    }

    /// Completes a running event wait (its event ended).
    pub(crate) fn resume_event_wait(&self, starter: &dyn Starter) -> Fired {
        let mut st = self.state.lock();
        let waited = match st.running.as_ref().map(|r| &r.kind) {
            Some(EntryKind::WaitEvent(ev)) => ev.ending(),
            _ => None,
        };
        if let Some(ending) = waited {
            st.running = None;
            st.completed += 1;
            self.latch_waited(&mut st, ending);
        }
        self.advance_locked(&mut st, starter)
    }

    fn fault_code(&self, participant_code: i32) -> AclCode {
        match self.kind {
            // The AICPU kernel returning non-zero is an AICPU exception.
            StreamKind::Aicpu => AclCode::AICPU_EXCEPTION,
            // AICore cores return the device code of their fault.
            StreamKind::AiCore => {
                if participant_code > 100_000 {
                    AclCode(participant_code)
                } else {
                    AclCode::AICORE_EXCEPTION
                }
            }
        }
    }

    /// Applies the op-execute watchdog to the running entry (locked).
    fn watchdog_locked(
        &self,
        st: &mut StreamState,
        op_budget: Option<Duration>,
        wake_all: &dyn Fn(),
    ) {
        let Some(budget) = op_budget else { return };
        let Some(running) = st.running.clone() else { return };
        if !running.is_aicore() || running.is_aborted() {
            return;
        }
        let started = *running.started_at.lock();
        if started.is_some_and(|t| t.elapsed() >= budget) {
            running.aborted.store(true, Ordering::Release);
            if st.error.is_none() {
                st.error = Some(StreamFault::new(
                    AclCode::AICORE_TIMEOUT,
                    format!("AICore entry exceeded the op-execute budget of {budget:?}"),
                ));
            }
            wake_all();
            self.cv.notify_all();
        }
    }

    fn op_deadline(st: &StreamState, op_budget: Option<Duration>) -> Option<Instant> {
        let budget = op_budget?;
        let running = st.running.as_ref()?;
        if !running.is_aicore() || running.is_aborted() {
            return None;
        }
        running.started_at.lock().and_then(|t| t.checked_add(budget))
    }

    /// Applies the op-execute watchdog without waiting; returns when it must look again (the
    /// running AICore entry's op deadline), for waits that are not on this stream.
    pub(crate) fn watchdog(
        &self,
        op_budget: Option<Duration>,
        wake_all: &dyn Fn(),
    ) -> Option<Instant> {
        let mut st = self.state.lock();
        self.watchdog_locked(&mut st, op_budget, wake_all);
        Self::op_deadline(&st, op_budget)
    }

    /// Waits for the entries enqueued before the call (`docs/device-simulator.md`).
    pub(crate) fn synchronize(
        &self,
        timeout: Duration,
        op_budget: Option<Duration>,
        wake_all: &dyn Fn(),
    ) -> Result<(), SyncError> {
        let deadline = deadline_after(timeout);
        let mut st = self.state.lock();
        let target = st.enqueued;
        let mut lingered = false;
        loop {
            self.watchdog_locked(&mut st, op_budget, wake_all);
            let now = Instant::now();
            // Completed or failed on the device; visible once the modelled time of the entries
            // before has passed (a device starts an entry only after they ended, so it cannot
            // fail earlier). Looked at before the deadline, so a sync without time left still
            // sees a finished stream.
            let busy = st.busy_at(now);
            if let Some(e) = st.error.as_ref().filter(|_| busy.is_none()) {
                return Err(SyncError::Fault(e.clone()));
            }
            if st.completed >= target && busy.is_none() {
                return Ok(());
            }
            if deadline.is_some_and(|d| now >= d) {
                return Err(SyncError::Timeout);
            }
            if let Some(busy) = busy.filter(|_| st.completed >= target || st.error.is_some()) {
                let until = deadline.map_or(busy, |d| d.min(busy));
                parking_lot::MutexGuard::unlocked(&mut st, || sleep_until_precisely(until));
                continue;
            }
            if !lingered {
                lingered = true;
                let done = || {
                    self.state
                        .try_lock()
                        .is_some_and(|st| st.completed >= target || st.error.is_some())
                };
                let wake = earliest(Self::op_deadline(&st, op_budget), deadline);
                parking_lot::MutexGuard::unlocked(&mut st, || linger(done, wake));
                continue;
            }
            let wake = earliest(Self::op_deadline(&st, op_budget), deadline);
            wait_on(&self.cv, &mut st, wake);
        }
    }

    /// Never blocks.
    pub(crate) fn query(&self, op_budget: Option<Duration>, wake_all: &dyn Fn()) -> StreamStatus {
        let mut st = self.state.lock();
        self.watchdog_locked(&mut st, op_budget, wake_all);
        // As in `synchronize`: a fault shows once the modelled time before it has passed.
        let busy = st.busy_at(Instant::now());
        match &st.error {
            Some(e) if busy.is_none() => StreamStatus::Failed(e.clone()),
            None if st.running.is_none() && st.queue.is_empty() && busy.is_none() => {
                StreamStatus::Idle
            }
            _ => StreamStatus::Busy,
        }
    }

    /// Waits until nothing runs or is queued (whatever the error state) up to `deadline`.
    pub(crate) fn wait_idle(
        &self,
        deadline: Option<Instant>,
        op_budget: Option<Duration>,
        wake_all: &dyn Fn(),
    ) -> bool {
        let mut st = self.state.lock();
        loop {
            self.watchdog_locked(&mut st, op_budget, wake_all);
            if st.running.is_none() && st.queue.is_empty() {
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            let wake = earliest(Self::op_deadline(&st, op_budget), deadline);
            wait_on(&self.cv, &mut st, wake);
        }
    }

    /// Aborts the running entry (device reset) so its participants' waits return.
    pub(crate) fn abort_running(&self) {
        let st = self.state.lock();
        if let Some(r) = &st.running {
            r.aborted.store(true, Ordering::Release);
        }
    }
}

/// Ends the fired events in the order they were fired and resumes every stream waiting on
/// them. The order matters: a run's `begin` record precedes its `end` record on a stream, and a
/// host that sees `end` fail must find `begin` already ended (that is how it tells its own
/// failure from an earlier run's).
pub(crate) fn resume_waiters(fired: Fired, streams: &[SimStream], starter: &dyn Starter) {
    let mut pending: VecDeque<_> = fired.into();
    while let Some((ev, outcome, visible_at)) = pending.pop_front() {
        for s in ev.fire(outcome, visible_at) {
            if let Some(stream) = streams.get(s) {
                pending.extend(stream.resume_event_wait(starter));
            }
        }
    }
}

/// Waits until `ev` ended or `deadline` passes, applying the op-execute watchdog of `streams`
/// meanwhile: nobody may be synchronising the stream whose overdue AICore entry holds the event
/// back. An entry that starts while this waits does not wake it, so it looks again at least
/// every `op_execute`, and once more before it reports a timeout.
pub(crate) fn synchronize_event(
    ev: &SimEvent,
    streams: &[SimStream],
    deadline: Option<Instant>,
    op_execute: Duration,
    wake_all: &dyn Fn(),
) -> Result<(), SyncError> {
    loop {
        let mut wake = earliest(deadline, Instant::now().checked_add(op_execute));
        for s in streams {
            wake = earliest(wake, s.watchdog(Some(op_execute), wake_all));
        }
        let outcome = match ev.wait_until(wake) {
            None if deadline.is_some_and(|d| Instant::now() >= d) => {
                for s in streams {
                    s.watchdog(Some(op_execute), wake_all);
                }
                match ev.outcome() {
                    None => return Err(SyncError::Timeout),
                    ended => ended,
                }
            }
            outcome => outcome,
        };
        match outcome {
            Some(Ok(())) => return Ok(()),
            Some(Err(f)) => return Err(SyncError::Fault(f)),
            None => {}
        }
    }
}

/// The later of two optional instants (`None` = none).
fn latest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records which entries were started; participants are driven by the test.
    #[derive(Default)]
    struct FakeStarter {
        posted: Mutex<Vec<(usize, Arc<LaunchEntry>)>>,
    }

    impl Starter for FakeStarter {
        fn post(&self, stream: usize, entry: &Arc<LaunchEntry>) {
            self.posted.lock().push((stream, entry.clone()));
        }
        fn ticks(&self) -> u64 {
            0
        }
    }

    fn streams() -> [SimStream; 2] {
        [SimStream::new(StreamKind::Aicpu, 0), SimStream::new(StreamKind::AiCore, 1)]
    }

    fn finish_all(
        s: &[SimStream],
        starter: &FakeStarter,
        e: &Arc<LaunchEntry>,
        stream: usize,
        code: i32,
    ) {
        let n = match e.kind {
            EntryKind::AiCore { block_dim } => 3 * block_dim,
            EntryKind::Aicpu { threads } => threads,
            _ => 0,
        };
        for _ in 0..n {
            if e.finish_participant(code) {
                let fired = s[stream].complete(e, starter);
                resume_waiters(fired, s, starter);
            }
        }
    }

    /// Enqueues a one-participant kernel entry on `stream` (an AICPU entry on stream 0, an
    /// AICore entry on stream 1) and returns it.
    fn launch(s: &[SimStream], st: &FakeStarter, stream: usize) -> Arc<LaunchEntry> {
        let kind = match stream {
            0 => EntryKind::Aicpu { threads: 1 },
            _ => EntryKind::AiCore { block_dim: 1 },
        };
        let entry = LaunchEntry::new(kind, 0);
        resume_waiters(s[stream].enqueue(entry.clone(), st), s, st);
        entry
    }

    /// Enqueues a record on `stream` and returns its event.
    fn record(s: &[SimStream], st: &FakeStarter, stream: usize) -> Arc<SimEvent> {
        let ev = Arc::new(SimEvent::default());
        let entry = LaunchEntry::new(EntryKind::Record(ev.clone()), 0);
        resume_waiters(s[stream].enqueue(entry, st), s, st);
        ev
    }

    /// Enqueues a wait on `ev` on `stream`.
    fn wait_event(s: &[SimStream], st: &FakeStarter, stream: usize, ev: &Arc<SimEvent>) {
        let entry = LaunchEntry::new(EntryKind::WaitEvent(ev.clone()), 0);
        resume_waiters(s[stream].enqueue(entry, st), s, st);
    }

    #[test]
    fn a_stream_waiting_on_an_event_holds_later_entries_until_the_record_completes() {
        let s = streams();
        let st = FakeStarter::default();
        let first = launch(&s, &st, 0);
        let ev = record(&s, &st, 0);
        wait_event(&s, &st, 1, &ev);
        let held = launch(&s, &st, 1);
        assert_eq!(st.posted.lock().len(), 1, "only the first AICPU entry started");
        assert_eq!(ev.outcome(), None);
        finish_all(&s, &st, &first, 0, 0);
        assert_eq!(ev.outcome(), Some(Ok(())), "the record completed after the entry before it");
        assert_eq!(st.posted.lock().len(), 2, "the held entry started once the event fired");
        assert_eq!(s[1].query(None, &|| {}), StreamStatus::Busy);
        finish_all(&s, &st, &held, 1, 0);
        assert_eq!(s[1].synchronize(Duration::from_secs(1), None, &|| {}), Ok(()));
        assert_eq!(ev.wait_until(None), Some(Ok(())));
    }

    #[test]
    fn an_event_behind_a_failed_entry_fails_and_fails_the_stream_waiting_on_it() {
        let s = streams();
        let st = FakeStarter::default();
        let bad = launch(&s, &st, 0);
        let behind = record(&s, &st, 0);
        wait_event(&s, &st, 1, &behind);
        launch(&s, &st, 1);
        let after = record(&s, &st, 1);
        assert_eq!(behind.outcome(), None, "pending while the entry before it runs");
        finish_all(&s, &st, &bad, 0, 7);
        let Some(Err(f)) = behind.wait_until(None) else { panic!("the record must fail") };
        assert_eq!(f.code, AclCode::AICPU_EXCEPTION);
        assert!(matches!(
            after.outcome(),
            Some(Err(StreamFault { code: AclCode::AICPU_EXCEPTION, .. }))
        ));
        assert_eq!(st.posted.lock().len(), 1, "nothing ordered after the failure started");
        assert!(matches!(s[1].query(None, &|| {}), StreamStatus::Failed(_)), "the waiter failed");
    }

    #[test]
    fn a_failed_entry_makes_the_stream_sticky_and_abandons_later_entries() {
        let s = streams();
        let st = FakeStarter::default();
        let a = launch(&s, &st, 1);
        launch(&s, &st, 1);
        finish_all(&s, &st, &a, 1, AclCode::AICORE_EXCEPTION.get());
        assert_eq!(st.posted.lock().len(), 1, "the entry behind the failure never started");
        let err = s[1].synchronize(Duration::from_secs(1), None, &|| {}).unwrap_err();
        assert!(matches!(
            err,
            SyncError::Fault(StreamFault { code: AclCode::AICORE_EXCEPTION, .. })
        ));
        assert!(matches!(s[1].query(None, &|| {}), StreamStatus::Failed(_)), "sticky");
    }

    #[test]
    fn the_op_execute_watchdog_fails_an_overdue_aicore_entry_and_aborts_it() {
        let s = streams();
        let st = FakeStarter::default();
        let a = launch(&s, &st, 1);
        let woke = std::sync::atomic::AtomicBool::new(false);
        let err = s[1]
            .synchronize(Duration::from_secs(5), Some(Duration::from_millis(20)), &|| {
                woke.store(true, Ordering::SeqCst)
            })
            .unwrap_err();
        assert!(matches!(err, SyncError::Fault(StreamFault { code: AclCode::AICORE_TIMEOUT, .. })));
        assert!(a.is_aborted() && woke.load(Ordering::SeqCst), "participants were released");
        finish_all(&s, &st, &a, 1, AclCode::TASK_ABORT.get());
        let deadline = Instant::now() + Duration::from_secs(1);
        assert!(s[1].wait_idle(Some(deadline), None, &|| {}));
    }

    #[test]
    fn an_event_wait_sees_an_aicore_entry_that_starts_after_it_parked_overrun_op_execute() {
        let s = streams();
        let st = FakeStarter::default();
        // The AICore stream waits on `gate`, then runs an entry nobody finishes, then records.
        let gate = Arc::new(SimEvent::default());
        wait_event(&s, &st, 1, &gate);
        let stuck = launch(&s, &st, 1);
        let end = record(&s, &st, 1);
        assert!(st.posted.lock().is_empty(), "nothing runs before the gate fires");
        // The gate fires, and the stuck entry starts, while the host is parked on `end`.
        std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                resume_waiters(vec![(gate.clone(), Ok(()), None)], &s, &st);
                // The stuck entry's cores leave once the watchdog aborted it, as on the device.
                let give_up = Instant::now() + Duration::from_secs(6);
                while !stuck.is_aborted() && Instant::now() < give_up {
                    std::thread::sleep(Duration::from_millis(5));
                }
                finish_all(&s, &st, &stuck, 1, AclCode::TASK_ABORT.get());
            });
            let deadline = Instant::now() + Duration::from_secs(5);
            let r = synchronize_event(&end, &s, Some(deadline), Duration::from_millis(100), &|| {});
            assert!(
                matches!(
                    r,
                    Err(SyncError::Fault(StreamFault { code: AclCode::AICORE_TIMEOUT, .. }))
                ),
                "{r:?}"
            );
        });
        assert!(stuck.is_aborted(), "the watchdog released the stuck entry");
    }

    #[test]
    fn modelled_time_holds_back_what_the_host_sees_and_queues_behind_earlier_modelled_time() {
        // Long enough that a test thread descheduled between the finish and the first looks
        // still finds the records pending.
        const MODELLED: Duration = Duration::from_millis(500);
        let s = streams();
        let st = FakeStarter::default();
        let started = Instant::now();
        let a = launch(&s, &st, 1);
        let after_a = record(&s, &st, 1);
        let b = launch(&s, &st, 1);
        let after_b = record(&s, &st, 1);
        // The AICPU stream waits on `after_b`, then records: it inherits b's modelled end.
        wait_event(&s, &st, 0, &after_b);
        let behind_wait = record(&s, &st, 0);

        a.add_modelled_time(MODELLED.as_nanos() as u64);
        finish_all(&s, &st, &a, 1, 0);
        assert_eq!(st.posted.lock().len(), 2, "b runs at once in real time");
        b.add_modelled_time(MODELLED.as_nanos() as u64);
        finish_all(&s, &st, &b, 1, 0);
        assert_eq!(after_a.outcome(), None, "a's modelled time has not passed");
        assert_eq!(behind_wait.outcome(), None, "the waiting stream took b's modelled end");
        assert_eq!(s[1].query(None, &|| {}), StreamStatus::Busy, "busy for the host meanwhile");

        assert_eq!(after_a.wait_until(None), Some(Ok(())));
        assert!(started.elapsed() >= MODELLED, "a's record became visible early");
        assert_eq!(
            s[1].synchronize(Duration::from_secs(5), None, &|| {}),
            Ok(()),
            "the sync waits out the modelled time"
        );
        assert!(started.elapsed() >= 2 * MODELLED, "b's modelled time starts after a's");
        assert_eq!(after_b.outcome(), Some(Ok(())));
        assert_eq!(s[1].query(None, &|| {}), StreamStatus::Idle);
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(synchronize_event(&behind_wait, &s, Some(deadline), MODELLED, &|| {}), Ok(()));
    }

    #[test]
    fn a_failure_behind_modelled_time_never_becomes_visible_before_the_record_ahead_of_it() {
        let s = streams();
        let st = FakeStarter::default();
        let a = launch(&s, &st, 1);
        let begin = record(&s, &st, 1);
        let bad = launch(&s, &st, 1);
        let end = record(&s, &st, 1);
        a.add_modelled_time(Duration::from_millis(500).as_nanos() as u64);
        finish_all(&s, &st, &a, 1, 0);
        finish_all(&s, &st, &bad, 1, AclCode::AICORE_EXCEPTION.get());
        assert_eq!(end.outcome(), None, "the failure waits for the modelled time ahead of it");
        let Some(Err(_)) = end.wait_until(None) else { panic!("the end record must fail") };
        assert_eq!(begin.outcome(), Some(Ok(())), "the record ahead was visible first");
    }

    #[test]
    fn a_sync_without_time_left_sees_a_finished_stream_and_times_out_inside_modelled_time() {
        let s = streams();
        let st = FakeStarter::default();
        assert_eq!(s[1].synchronize(Duration::ZERO, None, &|| {}), Ok(()), "idle stream");
        let a = launch(&s, &st, 1);
        let end = record(&s, &st, 1);
        a.add_modelled_time(Duration::from_secs(60).as_nanos() as u64);
        finish_all(&s, &st, &a, 1, 0);
        let short = Duration::from_millis(20);
        assert_eq!(s[1].synchronize(short, None, &|| {}), Err(SyncError::Timeout));
        let deadline = Some(Instant::now() + short);
        assert_eq!(synchronize_event(&end, &s, deadline, short, &|| {}), Err(SyncError::Timeout));
        assert_eq!(end.outcome(), None, "still inside the modelled time");
    }

    #[test]
    fn a_sync_times_out_with_the_stream_sync_budget() {
        let s = streams();
        let st = FakeStarter::default();
        let a = launch(&s, &st, 0);
        assert_eq!(
            s[0].synchronize(Duration::from_millis(10), None, &|| {}),
            Err(SyncError::Timeout)
        );
        finish_all(&s, &st, &a, 0, 0);
        assert_eq!(s[0].synchronize(Duration::from_millis(10), None, &|| {}), Ok(()));
    }
}
