//! The worker's side of one chip process (`docs/process-mode.md`, "Requests").
//!
//! [`ChipProcess`] lives in the chip's `ChipState` on the chip's lane, so requests on one chip
//! are serialized by the lane: one request in flight, sequence numbers strictly increasing.
//! Invariant: while `live` is `Some`, the process is running or unreaped; every path that sees
//! it end (death, kill after a timeout, shutdown) reaps it (or, for a killed process that does
//! not end at once, hands it to a thread that reaps it) and drops the mailbox in the same step,
//! so no zombie, mailbox or descriptor outlives it. An unreaped child keeps its pid, which is
//! why the pid is signalled only through a `Live`.

use std::collections::HashMap;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use simpler_device_a2a3::{ChipCallable, DeviceError, Platform, RuntimeVariant};
use simpler_sched::EndpointFailure;
use simpler_types::{
    CallConfig, CallableId, EndpointOutcome, FailureMechanism, FailureSource, RunId, TaskArgs,
    TaskArgsView, TaskId, WorkerId,
};

use super::buffers::Buffers;
use super::catalog::{self, Content};
use super::mailbox::{BadLength, Mailbox, PAYLOAD_BYTES, state};
use super::spawn::SpawnFault;
use super::wire::{
    FailureFrame, Malformed, Reader, Writer, decode_code, encode_args, encode_config, op, status,
};
use super::{
    ChildError, ChildExit, OnChildDeath, ProcessOptions, ProtocolFault, ReplyFault, ShutdownFault,
    spawn,
};
use crate::chip::device_failure;
use crate::error::{Leaked, MemError, RegistrationFailure, Residue, TeardownCause, TeardownPart};

/// The largest piece of a copy in one request (the payload less its header fields).
const PIECE: usize = PAYLOAD_BYTES - 64;

/// How a memory request failed.
pub(super) enum MemFailure {
    /// The process failed (died, stopped answering, broke the protocol) or is unusable.
    Child(ChildError),
    /// The child's chip refused the request.
    Device(FailureFrame),
}

/// How long a killed chip process is waited for before a thread of its own reaps it: a process
/// in an uninterruptible device call dies only once that call returns.
const REAP_AFTER_KILL: Duration = Duration::from_secs(2);
/// The least time a process that stored `EXITED` gets to exit, however late in its shutdown
/// budget it stored it.
const EXIT_GRACE: Duration = Duration::from_millis(100);

/// A running chip process.
struct Live {
    child: Child,
    pid: u32,
    mailbox: Mailbox,
}

impl Live {
    /// Kills the process group, then reaps the leader. Taking `self` means a reaped process
    /// is never signalled: once reaped, its pid and group id may name another process.
    fn kill_and_reap(self) {
        // Only while the process is still this process's unreaped child: one reaped elsewhere
        // may have had its pid, and so its group id, reused.
        if unreaped_child_ended(self.pid).is_some() {
            kill_group(self.pid);
        }
        let pid = self.pid;
        if !self.reap_within(REAP_AFTER_KILL) {
            tracing::warn!(pid, "a killed chip process has not ended; a thread reaps it later");
        }
    }

    /// Reaps the process if it ends within `bound`. Otherwise a thread of its own reaps it
    /// whenever it ends (or, with no thread to be had, a later sweep of [`UNREAPED`]), and this
    /// returns `false`: the caller never waits longer than `bound`.
    /// The process counts as live (it holds the spawner) until it is reaped.
    fn reap_within(self, bound: Duration) -> bool {
        sweep_unreaped();
        match spawn::reap_within(self, |live| &mut live.child, bound) {
            Ok(reaped) => reaped,
            Err((live, e)) => {
                // No thread to hand it to: a later reap or launch sweeps it (never a wait here).
                tracing::error!(pid = live.pid, error = %e, "no thread to reap a killed chip process; a later reap will");
                UNREAPED.lock().push(live);
                false
            }
        }
    }
}

/// Killed processes that outlived their reap's bound when no thread could be started to reap
/// them: each later [`Live::reap_within`] and launch reaps those that have ended since, so no
/// caller ever waits for one. Until then each holds its zombie and the spawner.
static UNREAPED: parking_lot::Mutex<Vec<Live>> = parking_lot::Mutex::new(Vec::new());

/// Reaps the processes of [`UNREAPED`] that have ended. Never on the spawner's thread: the last
/// reaped child stops it.
fn sweep_unreaped() {
    let ended: Vec<Live> = {
        let mut held = UNREAPED.lock();
        let mut ended = Vec::new();
        let mut i = 0;
        while i < held.len() {
            match held[i].child.try_wait() {
                Ok(None) => i += 1,
                // Ended and now reaped, or reaped elsewhere (ECHILD).
                Ok(Some(_)) | Err(_) => ended.push(held.swap_remove(i)),
            }
        }
        ended
    };
    // Outside the lock: dropping a `Live` tells the spawner, which may join its thread.
    drop(ended);
}

impl Drop for Live {
    /// Every path that drops a `Live` reaped its process first (module invariant).
    fn drop(&mut self) {
        spawn::child_reaped();
    }
}

/// What a chip process is started with (kept for restarts).
#[derive(Clone)]
pub(crate) struct ChipInit {
    pub(crate) platform: Platform,
    pub(crate) runtime: RuntimeVariant,
    pub(crate) device: u32,
    pub(crate) prewarm: Option<CallConfig>,
}

/// One chip's process, seen from the worker.
pub(crate) struct ChipProcess {
    chip: WorkerId,
    init: ChipInit,
    opts: Arc<ProcessOptions>,
    live: Option<Live>,
    /// Processes started so far: the number of the current one. A device buffer names the
    /// process that allocated it; its memory ended with that process.
    generation: u64,
    /// The failure that ended the last process (fail fast, or restart on next use).
    failed: Option<ChildError>,
    /// A sequence of requests in progress that only the process numbered so may serve (a
    /// staged task's copies, a restart's restore): its death fails the next request of the
    /// sequence instead of restarting the chip under it.
    pinned: Option<u64>,
    /// The device allocations of the current process and of the last ones before it.
    buffers: Buffers,
    seq: u64,
    /// While the chip starts: the start deadline, which no wait of its start may pass, its
    /// rollback's included, until `worker_started` is set.
    start_deadline: Option<Instant>,
    /// Set once the whole worker has started (its engine included); `None` while the chip's own
    /// start goes on.
    worker_started: Option<Arc<AtomicBool>>,
    /// Content the chip holds: digest → (content, references), replayed after a restart.
    held: HashMap<[u8; 32], (Content, usize)>,
    /// This process's callable id → the digest it crosses as.
    digests: HashMap<CallableId, [u8; 32]>,
    /// Reused request and reply buffers.
    out: Writer,
    reply: Vec<u8>,
}

impl std::fmt::Debug for ChipProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChipProcess").field("chip", &self.chip).field("pid", &self.pid()).finish()
    }
}

/// How a start-up of a chip process failed.
pub(crate) enum StartFailure {
    /// The process could not be started, or it ended before `READY`.
    Child(ChildError),
    /// It did not reach `READY` within the deadline (it was killed).
    Deadline(ChildError),
    /// Its chip failed to start.
    Device(FailureFrame),
}

fn platform_tag(p: Platform) -> u8 {
    match p {
        Platform::A2a3Sim => 0,
        _ => 1,
    }
}

fn runtime_tag(r: RuntimeVariant) -> u8 {
    match r {
        RuntimeVariant::HostBuildGraph => 0,
        _ => 1,
    }
}

impl ChipProcess {
    /// Starts the process of chip `chip` and waits for `READY` until `deadline`, which also
    /// bounds every later wait until [`started`](Self::started).
    pub(crate) fn start(
        chip: WorkerId,
        init: ChipInit,
        opts: Arc<ProcessOptions>,
        deadline: Option<Instant>,
    ) -> Result<ChipProcess, StartFailure> {
        let mut p = ChipProcess {
            chip,
            init,
            opts,
            live: None,
            generation: 0,
            failed: None,
            pinned: None,
            buffers: Buffers::default(),
            seq: 0,
            start_deadline: deadline,
            worker_started: None,
            held: HashMap::new(),
            digests: HashMap::new(),
            out: Writer::default(),
            reply: Vec::new(),
        };
        p.launch(deadline)?;
        Ok(p)
    }

    /// The chip has started: its waits keep ending at the start deadline until `worker_started`
    /// is set, when the whole worker has started, and have their own budgets only from then on.
    /// A worker whose start fails later (its engine, say) never sets it, so the chip's shutdown
    /// in that rollback still ends at the start deadline.
    pub(crate) fn started_with(&mut self, worker_started: Arc<AtomicBool>) {
        self.worker_started = Some(worker_started);
    }

    /// The deadline of a wait with `budget`, and the budget that can run out: while the chip
    /// starts, no wait passes the start deadline.
    fn wait_deadline(&self, budget: Duration) -> (Option<Instant>, Duration) {
        let now = Instant::now();
        // Acquire pairs with the builder's release store once the worker has started.
        let over = self.worker_started.as_ref().is_some_and(|s| s.load(Ordering::Acquire));
        match (now.checked_add(budget), self.start_deadline.filter(|_| !over)) {
            (Some(own), Some(cap)) if cap < own => (Some(cap), cap.saturating_duration_since(now)),
            (None, Some(cap)) => (Some(cap), cap.saturating_duration_since(now)),
            (own, _) => (own, budget),
        }
    }

    /// The pid of the running process.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.live.as_ref().map(|l| l.pid)
    }

    fn launch(&mut self, deadline: Option<Instant>) -> Result<(), StartFailure> {
        sweep_unreaped();
        let chip = self.chip;
        let spawn_err = |fault: SpawnFault| StartFailure::Child(ChildError::Spawn { chip, fault });
        let binary = spawn::resolve_binary(self.opts.child_path.as_deref()).map_err(spawn_err)?;
        let (mailbox, fd) = Mailbox::create()
            .map_err(|e| spawn_err(SpawnFault::Mailbox { source: Arc::new(e) }))?;
        let mut w = Writer::default();
        w.u8(platform_tag(self.init.platform)).u8(runtime_tag(self.init.runtime));
        w.u32(self.init.device).u32(chip.0);
        match &self.init.prewarm {
            Some(c) => {
                w.u8(1);
                encode_config(c, &mut w);
            }
            None => {
                w.u8(0);
            }
        }
        // Written while the state is STARTING, which hands the payload to the child; the
        // child reads it only after the exec below.
        mailbox
            .write_request(op::INIT, 0, &w.0)
            .map_err(|len| spawn_err(SpawnFault::InitTooLarge { len, capacity: PAYLOAD_BYTES }))?;
        let child = spawn::spawn(&binary, chip.0, fd, deadline).map_err(|fault| match fault {
            // Past the deadline: the start failed by it, whatever held the spawn up.
            SpawnFault::Stalled { .. } => StartFailure::Deadline(ChildError::Spawn { chip, fault }),
            fault => spawn_err(fault),
        })?;
        let pid = child.id();
        self.live = Some(Live { child, pid, mailbox });
        let started = Instant::now();
        let mut seen = state::STARTING;
        loop {
            let live = self.live.as_mut().expect("set above");
            let s = live.mailbox.wait_while(seen, Duration::from_millis(10));
            match s {
                state::READY if live.mailbox.child_pid() != pid => {
                    let fault = ProtocolFault::ForeignPid {
                        mailbox_pid: live.mailbox.child_pid(),
                        child_pid: pid,
                    };
                    return Err(StartFailure::Child(self.protocol(fault)));
                }
                state::READY => {
                    live.mailbox.set_quietly(state::IDLE);
                    // The allocations of the process before ended with it.
                    self.buffers.process_ended(self.generation);
                    self.generation += 1;
                    return Ok(());
                }
                state::INIT_FAILED => {
                    if let Err(BadLength { len }) = live.mailbox.read_payload(&mut self.reply) {
                        let fault = ReplyFault::Length { len, capacity: PAYLOAD_BYTES };
                        return Err(StartFailure::Child(self.bad_reply("start", fault)));
                    }
                    let frame = FailureFrame::decode(&mut Reader(&self.reply));
                    self.reap_after_exit();
                    return Err(match frame {
                        Ok(f) => StartFailure::Device(f),
                        Err(e) => StartFailure::Child(self.malformed("start", e)),
                    });
                }
                _ => {}
            }
            seen = s;
            if let Some(exit) = self.exited() {
                return Err(StartFailure::Child(ChildError::Died {
                    chip,
                    pid,
                    exit,
                    operation: "start",
                    seq: 0,
                    run: None,
                }));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.kill();
                return Err(StartFailure::Deadline(ChildError::Unresponsive {
                    chip,
                    pid,
                    operation: "start",
                    seq: 0,
                    run: None,
                    budget: started.elapsed(),
                }));
            }
        }
    }

    /// `Some` (and reaped) when the process has ended. Processes it left in its group are
    /// killed before it is reaped: until then its pid, and so its group id, are still its own.
    /// One that was reaped elsewhere is never signalled (its pid and group id may be reused).
    fn exited(&mut self) -> Option<ChildExit> {
        let live = self.live.as_mut()?;
        match unreaped_child_ended(live.pid) {
            Some(false) => return None,
            Some(true) => kill_group(live.pid),
            // Not our child any more (reaped elsewhere): `try_wait` below says so.
            None => {}
        }
        let exit = match live.child.try_wait() {
            Ok(Some(status)) => ChildExit::of(status),
            Ok(None) => return None,
            // No such child (ECHILD): something else in this process reaped it, so its status
            // is unknown and its pid is no longer ours to signal.
            Err(_) => ChildExit::Code(-1),
        };
        self.live = None;
        Some(exit)
    }

    /// Waits for a process that announced its exit (`INIT_FAILED`) for a shutdown budget,
    /// then kills its group; reaps it either way.
    fn reap_after_exit(&mut self) {
        let (until, _) = self.wait_deadline(self.opts.shutdown_timeout);
        // A start that failed reports its own cause: how the process then ended adds nothing.
        self.reap_after_exit_by(until);
    }

    /// Waits for a process that announced its exit until `until`, then kills its group; reaps
    /// it either way. How it exited on its own (`Code(-1)` when reaped elsewhere), or `None`
    /// when it had to be killed.
    fn reap_after_exit_by(&mut self, until: Option<Instant>) -> Option<ChildExit> {
        while until.is_none_or(|u| Instant::now() < u) {
            if let Some(exit) = self.exited() {
                return Some(exit);
            }
            if self.live.is_none() {
                return Some(ChildExit::Code(-1));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.kill();
        None
    }

    /// Kills the process group and reaps the process (nothing once it was reaped).
    fn kill(&mut self) {
        if let Some(live) = self.live.take() {
            live.kill_and_reap();
        }
    }

    /// A reply that broke the protocol: the process is killed, the chip fails.
    fn protocol(&mut self, fault: ProtocolFault) -> ChildError {
        self.kill();
        let e = ChildError::Protocol { chip: self.chip, fault };
        self.failed = Some(e.clone());
        e
    }

    /// A reply to `operation` whose payload did not decode.
    pub(super) fn malformed(&mut self, operation: &'static str, e: Malformed) -> ChildError {
        self.protocol(ProtocolFault::Malformed { operation, what: e.0 })
    }

    /// A reply that failed validation: the process is killed, the chip fails.
    fn bad_reply(&mut self, operation: &'static str, fault: ReplyFault) -> ChildError {
        let (chip, pid) = (self.chip, self.pid().unwrap_or_default());
        self.kill();
        let e = ChildError::BadReply { chip, pid, operation, fault };
        self.failed = Some(e.clone());
        e
    }

    /// Reaps a process that ended while no request was in flight, so that the next request is
    /// not sent into its mailbox and reported as dying during it: the chip fails with
    /// `EndedBetweenRequests`, or (policy `Restart`) this use is the next one, which restarts it.
    fn notice_end_between_requests(&mut self) {
        let Some(pid) = self.pid() else { return };
        if let Some(exit) = self.exited() {
            let after = self.seq;
            self.failed =
                Some(ChildError::EndedBetweenRequests { chip: self.chip, pid, exit, after });
        }
    }

    /// A live process: the running one, or (policy `Restart`) a new one with the held content
    /// prepared again; else the failure that ended the last one. A process that ended since its
    /// last request counts as ended, so that nothing of it (its buffers) passes for the next
    /// one's. While [`pinned`](Self::pinned), the failure is returned and nothing restarts.
    pub(super) fn ensure_live(&mut self) -> Result<(), ChildError> {
        self.notice_end_between_requests();
        if self.live.is_some() {
            return Ok(());
        }
        let cause = self
            .failed
            .clone()
            .unwrap_or(ChildError::Protocol { chip: self.chip, fault: ProtocolFault::Gone });
        if self.opts.on_death != OnChildDeath::Restart {
            return Err(ChildError::Unusable { chip: self.chip, cause: Box::new(cause) });
        }
        if self.pinned.is_some() {
            return Err(cause);
        }
        // The buffers of the process that ended are stale from here on: say why, once.
        tracing::warn!(chip = %self.chip, cause = %cause, "restarting the chip's process");
        // Within the start deadline while the worker starts, as every other wait of its start.
        let (deadline, _) = self.wait_deadline(self.opts.control_timeout);
        match self.launch(deadline) {
            Ok(()) => {}
            Err(StartFailure::Child(e) | StartFailure::Deadline(e)) => {
                return Err(ChildError::Unusable { chip: self.chip, cause: Box::new(e) });
            }
            Err(StartFailure::Device(f)) => {
                let e = ChildError::Device {
                    chip: self.chip,
                    run: None,
                    code: f.code,
                    message: f.message,
                };
                return Err(ChildError::Unusable { chip: self.chip, cause: Box::new(e) });
            }
        }
        self.failed = None;
        if let Err(mut e) = self.restore() {
            // The new process lacks content the worker still counts as held: end it (the
            // failed request may have reaped it already), so that the next use starts again
            // from `held`. What that leaves behind is reported with the failure.
            let pid = self.pid();
            let left = self.shutdown();
            match &mut e {
                // The error names the chip and the process: the entries need no path.
                ChildError::Restore { residue, .. } => {
                    residue.extend(left.into_iter().map(|r| r.into_teardown("")));
                }
                _ => {
                    for r in left {
                        tracing::warn!(chip = %self.chip, ?pid, "ending a restarted chip process: {r:?}");
                    }
                }
            }
            self.failed = Some(e.clone());
            return Err(ChildError::Unusable { chip: self.chip, cause: Box::new(e) });
        }
        Ok(())
    }

    /// Prepares every held reference again in a just-restarted process; the first refusal or
    /// failed request is the error, naming the content.
    fn restore(&mut self) -> Result<(), ChildError> {
        // A death during the restore fails it rather than restarting the chip inside it.
        self.in_this_process(Self::restore_held)
    }

    /// Runs `requests` pinned to the current process: requests checked against this process
    /// (its buffers, its reference counts) fail on its death instead of reaching a successor
    /// that a restart inside [`call`](Self::call) would start under them.
    pub(super) fn in_this_process<R>(&mut self, requests: impl FnOnce(&mut Self) -> R) -> R {
        let outer = self.pinned.replace(self.generation);
        let out = requests(self);
        self.pinned = outer;
        out
    }

    /// The requests of [`restore`](Self::restore).
    fn restore_held(&mut self) -> Result<(), ChildError> {
        let (chip, pid) = (self.chip, self.pid().unwrap_or_default());
        #[cfg(feature = "sim")]
        for fault in self.opts.restart_faults.clone() {
            self.arm(fault)?;
        }
        let held: Vec<(Content, usize)> = self.held.values().cloned().collect();
        for (content, refs) in held {
            for _ in 0..refs {
                let cause = match self.register_content(&content) {
                    Ok(None) => continue,
                    Ok(Some(f)) => {
                        let code = f.code;
                        let message = match f.refusal {
                            Some(kind) => kind.device_error(f.message).to_string(),
                            None => f.message,
                        };
                        ChildError::Device { chip, run: None, code, message }
                    }
                    Err(e) => e,
                };
                let callable = content.entry;
                let cause = Box::new(cause);
                return Err(ChildError::Restore {
                    chip,
                    pid,
                    callable,
                    cause,
                    residue: Vec::new(),
                });
            }
        }
        Ok(())
    }

    /// One request: `payload` is the frame in `self.out`. Returns the reply status; the reply
    /// payload is in `self.reply`.
    fn call(
        &mut self,
        code: u32,
        operation: &'static str,
        run: Option<RunId>,
    ) -> Result<u32, ChildError> {
        self.notice_end_between_requests();
        if self.live.is_none() {
            // A restart sends requests of its own; this one waits in `pending`.
            let pending = std::mem::take(&mut self.out.0);
            let restarted = self.ensure_live();
            self.out.0 = pending;
            restarted?;
        }
        let chip = self.chip;
        let budget =
            if code == op::RUN { self.opts.run_timeout } else { self.opts.control_timeout };
        let (deadline, budget) = self.wait_deadline(budget);
        let live = self.live.as_ref().expect("ensured");
        let seq = self.seq + 1;
        live.mailbox.write_request(code, seq, &self.out.0).map_err(|len| {
            ChildError::Oversized { chip, operation, len, capacity: PAYLOAD_BYTES }
        })?;
        self.seq = seq;
        live.mailbox.publish(state::REQUEST);
        let mut seen = state::REQUEST;
        loop {
            let live = self.live.as_ref().expect("live while waiting");
            let pid = live.pid;
            let s = live.mailbox.wait_while(seen, Duration::from_millis(10));
            match s {
                state::DONE => break,
                state::REQUEST | state::ACCEPTED => {}
                state => return Err(self.protocol(ProtocolFault::State { operation, state })),
            }
            // Checked at every wake, a change of state or not: the child may write its mailbox
            // at any time, and one that keeps changing the state must not keep the wait alive.
            if let Some(exit) = self.exited() {
                let e = ChildError::Died { chip, pid, exit, operation, seq, run };
                self.failed = Some(e.clone());
                return Err(e);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.kill();
                let e = ChildError::Unresponsive { chip, pid, operation, seq, run, budget };
                self.failed = Some(e.clone());
                return Err(e);
            }
            seen = s;
        }
        let live = self.live.as_ref().expect("live after DONE");
        let (st, echoed) = live.mailbox.reply();
        if echoed != seq {
            let fault = ProtocolFault::StaleReply { operation, request: seq, reply: echoed };
            return Err(self.protocol(fault));
        }
        if st != status::OK && st != status::FAILED {
            return Err(self.bad_reply(operation, ReplyFault::Status { status: st }));
        }
        if let Err(BadLength { len }) = live.mailbox.read_payload(&mut self.reply) {
            let fault = ReplyFault::Length { len, capacity: PAYLOAD_BYTES };
            return Err(self.bad_reply(operation, fault));
        }
        live.mailbox.set_quietly(state::IDLE);
        Ok(st)
    }

    /// The failure frame a refused `operation` answered.
    fn failure_frame(&mut self, operation: &'static str) -> Result<FailureFrame, ChildError> {
        let r = FailureFrame::decode(&mut Reader(&self.reply));
        r.map_err(|e| self.malformed(operation, e))
    }

    fn register_content(&mut self, content: &Content) -> Result<Option<FailureFrame>, ChildError> {
        self.out.0.clear();
        self.out.0.extend_from_slice(&content.digest);
        self.out.bytes(&content.bytes);
        match self.call(op::REGISTER, "register", None)? {
            status::OK => Ok(None),
            _ => Ok(Some(self.failure_frame("register")?)),
        }
    }

    /// Prepares `c` in the process (or adds a reference). Content the process cannot build
    /// is refused here, before anything is sent.
    pub(crate) fn register(&mut self, c: &ChipCallable) -> Result<(), RegistrationFailure> {
        let Some(content) = catalog::content_of(c) else {
            return Err(DeviceError::Unsupported {
                run_id: None,
                cause: None,
                feature: format!(
                    "'{}' in a chip process: only the reference programs (add, vector, bgemm) \
                     can cross, native code does not",
                    c.entry_name()
                ),
            }
            .into());
        };
        match self.register_content(&content)? {
            None => {
                self.digests.insert(c.id(), content.digest);
                self.held.entry(content.digest).or_insert((content, 0)).1 += 1;
                Ok(())
            }
            Some(f) => Err(self.refusal(f)),
        }
    }

    /// What the child's chip refusing a registration or removal with frame `f` means here:
    /// the device error a chip of this process would give when the frame names its kind, else
    /// the device's failure as the child reported it.
    fn refusal(&self, f: FailureFrame) -> RegistrationFailure {
        match f.refusal {
            Some(refusal) => refusal.device_error(f.message).into(),
            None => {
                let (chip, code, message) = (self.chip, f.code, f.message);
                ChildError::Device { chip, run: None, code, message }.into()
            }
        }
    }

    /// Drops one reference to `id` in the process.
    pub(crate) fn release(&mut self, id: &CallableId) -> Result<(), RegistrationFailure> {
        let Some(digest) = self.digests.get(id).copied() else { return Ok(()) };
        self.out.0.clear();
        self.out.0.extend_from_slice(&digest);
        let mut last = false;
        if let Some((_, refs)) = self.held.get_mut(&digest) {
            *refs -= 1;
            if *refs == 0 {
                self.held.remove(&digest);
                last = true;
            }
        }
        self.notice_end_between_requests();
        let released = if self.live.is_none() && self.opts.on_death == OnChildDeath::Restart {
            // No process holds the reference: the restart prepares what `held` says now, which
            // no longer counts it. Sending the release would restart the process with that
            // count and then drop one reference more.
            Ok(())
        } else {
            // Pinned: a process that ended since the check above would be restarted with
            // `held` already lowered, and the release would then drop one reference more.
            match self.in_this_process(|p| p.call(op::RELEASE, "release", None))? {
                status::OK => Ok(()),
                _ => {
                    let f = self.failure_frame("release")?;
                    Err(self.refusal(f))
                }
            }
        };
        // A refused removal keeps the digest known: the process holds the content as unusable,
        // and a registration asks it so (`is_unusable`).
        if last && released.is_ok() {
            self.digests.remove(id);
        }
        released
    }

    /// References the chip holds on `id`, as the worker counts them (what a restart prepares
    /// again): known here, whether or not a process is running.
    pub(crate) fn refs(&self, id: &CallableId) -> usize {
        self.digests.get(id).and_then(|d| self.held.get(d)).map_or(0, |(_, refs)| *refs)
    }

    /// Whether the running process holds `id` as unusable (removing it failed there). Only a
    /// live process is asked: a dead one is not restarted for this (the registration that
    /// follows restarts it, or fails with why it cannot), and a restarted one starts with no
    /// unusable content. A request that fails ends the process, which that registration then
    /// meets too.
    pub(crate) fn is_unusable(&mut self, id: &CallableId) -> bool {
        let Some(digest) = self.digests.get(id).copied() else { return false };
        if self.live.is_none() {
            return false;
        }
        self.out.0.clear();
        self.out.0.extend_from_slice(&digest);
        let asked = self.in_this_process(|p| p.call(op::QUERY, "query", None));
        if !matches!(asked, Ok(status::OK)) {
            return false;
        }
        let mut r = Reader(&self.reply);
        match (r.u64(), r.u8()) {
            (Ok(_), Ok(0)) => false,
            (Ok(_), Ok(1)) => true,
            (Ok(_), Ok(flag)) => {
                self.protocol(ProtocolFault::UnusableFlag { flag });
                false
            }
            (Err(e), _) | (_, Err(e)) => {
                self.malformed("query", e);
                false
            }
        }
    }

    /// A chip run in the process: one request, one reply.
    pub(crate) fn run(
        &mut self,
        callable: &CallableId,
        args: TaskArgsView<'_>,
        config: &CallConfig,
        origin: TaskId,
    ) -> Result<(), EndpointFailure> {
        let chip = self.chip;
        let run = Some(origin.run);
        let digest = self.digests.get(callable).copied().ok_or_else(|| {
            child_failure(
                ChildError::Device {
                    chip,
                    run,
                    code: None,
                    message: format!("callable {callable} is not prepared on this chip"),
                },
                EndpointOutcome::TaskFailure,
            )
        })?;
        let args = TaskArgs::from_view(args).map_err(|source| {
            device_failure(DeviceError::InvalidTaskArgs { run_id: run, arg: None, source })
        })?;
        // A dead process is restarted before the arguments are checked, so that memory of the
        // process that died is refused too, never sent to its successor. Before the frame is
        // written: a restart sends requests of its own through `self.out`.
        self.ensure_live().map_err(|e| child_failure(e, EndpointOutcome::EndpointFailure))?;
        if let Err(e) = self.check_run_memory(&args) {
            let failure = EndpointFailure::task_failed(e.to_string());
            return Err(failure.with_source(FailureSource::new(e)));
        }
        self.out.0.clear();
        self.out.0.extend_from_slice(&digest);
        self.out.u64(origin.run.get()).u32(origin.seq);
        encode_config(config, &mut self.out);
        encode_args(&args, &mut self.out);
        // Pinned: the arguments were checked against this process's memory.
        match self.in_this_process(|p| p.call(op::RUN, "run", run)) {
            Ok(status::OK) => Ok(()),
            Ok(_) => match self.failure_frame("run") {
                Ok(f) => Err(self.device_refusal(f, run)),
                Err(e) => Err(child_failure(e, EndpointOutcome::EndpointFailure)),
            },
            Err(e @ ChildError::Oversized { .. }) => {
                Err(child_failure(e, EndpointOutcome::TaskFailure))
            }
            Err(e) => Err(child_failure(e, EndpointOutcome::EndpointFailure)),
        }
    }

    /// The endpoint failure of a request the child's chip refused with frame `f`, with
    /// `ChildError::Device` as its typed source.
    pub(super) fn device_refusal(&self, f: FailureFrame, run: Option<RunId>) -> EndpointFailure {
        let source =
            ChildError::Device { chip: self.chip, run, code: f.code, message: f.message.clone() };
        let mut out = EndpointFailure::new(f.outcome, f.mechanism, f.message);
        if let Some(c) = f.code {
            out = out.with_device_code(c);
        }
        out.with_source(FailureSource::new(source))
    }

    /// Whether a process is running (a later request on a dead chip would restart it first).
    pub(super) fn is_live(&self) -> bool {
        self.live.is_some()
    }

    /// Pins the requests that follow to the current process, or (`false`) unpins them.
    pub(super) fn pin(&mut self, on: bool) {
        self.pinned = on.then_some(self.generation);
    }

    /// Arms `fault` in the process: for its next run, or now, as the fault says.
    #[cfg(feature = "sim")]
    pub(crate) fn arm(&mut self, fault: super::ChildFault) -> Result<(), ChildError> {
        self.out.0.clear();
        self.out.u8(match fault {
            super::ChildFault::Segfault => 1,
            super::ChildFault::Abort => 2,
            super::ChildFault::Hang => 3,
            super::ChildFault::HangOnShutdown => 4,
            super::ChildFault::SegfaultOnCopyBack => 5,
            super::ChildFault::AbortOnRegister => 7,
            super::ChildFault::HangOnRegister => 8,
            super::ChildFault::RefuseOnRegister => 9,
            super::ChildFault::WildMalloc => 10,
            super::ChildFault::RefuseOnRelease => 11,
            super::ChildFault::HangAfterExit => 12,
            super::ChildFault::AbortAfterExit => 14,
            super::ChildFault::FlipStateOnRegister => 13,
        });
        self.call(op::ARM_FAULT, "arm fault", None).map(|_| ())
    }

    /// Asks the process to finalize its chip and exit; kills its group when it does not
    /// within the shutdown budget. Returns what finalize left behind.
    pub(crate) fn shutdown(&mut self) -> Vec<Residue> {
        let chip = self.chip;
        let Some(live) = self.live.as_ref() else { return Vec::new() };
        let pid = live.pid;
        let failed = |fault| {
            Residue::failed(TeardownPart::Chip(chip), TeardownCause::ChipProcess { pid, fault })
        };
        // A process that died between requests is only noticed now: not "during shutdown".
        if let Some(exit) = self.exited() {
            return vec![failed(ShutdownFault::EndedBefore(exit))];
        }
        let Some(live) = self.live.as_ref() else { return Vec::new() };
        live.mailbox.publish(state::SHUTDOWN);
        let (deadline, budget) = self.wait_deadline(self.opts.shutdown_timeout);
        let mut seen = state::SHUTDOWN;
        let mut residue = Vec::new();
        loop {
            let Some(live) = self.live.as_ref() else {
                return residue;
            };
            let s = live.mailbox.wait_while(seen, Duration::from_millis(10));
            if s == state::EXITED {
                let read = live.mailbox.read_payload(&mut self.reply);
                let mut r = Reader(&self.reply);
                let decoded = read.is_ok().then(|| {
                    for _ in 0..r.u32().ok()? {
                        residue.push(match r.u8().ok()? {
                            1 => Residue::leaked(
                                TeardownPart::Chip(chip),
                                Leaked::DeviceThread(r.str().ok()?.to_owned()),
                            ),
                            0 => {
                                let code = decode_code(&mut r).ok()?;
                                let message = r.str().ok()?.to_owned();
                                failed(ShutdownFault::Finalize { code, message })
                            }
                            _ => return None,
                        });
                    }
                    Some(())
                });
                if let Err(BadLength { len }) = read {
                    let fault = ReplyFault::Length { len, capacity: PAYLOAD_BYTES };
                    residue.push(failed(ShutdownFault::BadReply(fault)));
                } else if decoded.flatten().is_none() {
                    residue.push(failed(ShutdownFault::Malformed));
                }
                // The same deadline (the exit counts against the shutdown's budget), but never
                // less than a short grace after `EXITED`.
                let grace = Instant::now().checked_add(EXIT_GRACE);
                let until = match (deadline, grace) {
                    (Some(d), Some(g)) => Some(d.max(g)),
                    (d, _) => d,
                };
                match self.reap_after_exit_by(until) {
                    None => residue.push(failed(ShutdownFault::NoExit { budget })),
                    // It finalized, then did not exit cleanly (an exit handler crashed, say). A
                    // status unknown (`Code(-1)`: reaped elsewhere) says nothing either way.
                    Some(exit @ (ChildExit::Signal(_) | ChildExit::Code(1..))) => {
                        residue.push(failed(ShutdownFault::Ended(exit)));
                    }
                    Some(_) => {}
                }
                return residue;
            }
            seen = s;
            if let Some(exit) = self.exited() {
                if exit != ChildExit::Code(0) {
                    residue.push(failed(ShutdownFault::Ended(exit)));
                }
                return residue;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.kill();
                residue.push(failed(ShutdownFault::NoFinalize { budget }));
                return residue;
            }
        }
    }
}

impl Drop for ChipProcess {
    /// A process never outlives its worker: one still running here is killed and reaped.
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether child `pid` has ended, looked at without reaping it (`waitid` with `WNOWAIT`), so
/// its pid and group id stay its own; `None` when it is not an unreaped child of this process
/// any more (reaped elsewhere), whose ids must not be signalled.
fn unreaped_child_ended(pid: u32) -> Option<bool> {
    let peek = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
    let pid = Pid::from_raw(pid as i32)?;
    rustix::process::waitid(WaitId::Pid(pid), peek).ok().map(|status| status.is_some())
}

fn kill_group(pid: u32) {
    #[cfg(test)]
    tests::SIGNALLED.with(|s| s.borrow_mut().push(pid));
    if let Some(p) = Pid::from_raw(pid as i32) {
        // ESRCH: the group is gone already.
        let _ = rustix::process::kill_process_group(p, Signal::KILL);
    }
}

/// A memory (or other control) call met a failed chip process: the chip is unusable, and why
/// stays typed.
pub(super) fn mem_child(chip: WorkerId, e: ChildError) -> MemError {
    let (code, message) = (e.device_code(), e.to_string());
    let child = Some(Box::new(e));
    MemError::DeviceUnusable { chip, message, code, child, device: None }
}

/// The endpoint failure of a child failure: the chip path failed, the typed error rides along.
pub(super) fn child_failure(e: ChildError, outcome: EndpointOutcome) -> EndpointFailure {
    let mechanism = match &e {
        ChildError::Unresponsive { budget, .. } => FailureMechanism::Timeout {
            budget: simpler_types::TimeoutBudget::Other("chip process reply"),
            limit: *budget,
        },
        _ => FailureMechanism::EndpointFailed,
    };
    let mut out = EndpointFailure::new(outcome, mechanism, e.to_string());
    if let Some(c) = e.device_code() {
        out = out.with_device_code(c);
    }
    out.with_source(FailureSource::new(e))
}

mod memory;
#[cfg(test)]
mod tests;
