//! Rank 0's side of a remote L3 child: the start handshake and the NEXT_LEVEL endpoint
//! (`docs/multi-host.md` §"Session" and §"Liveness").
//!
//! Start (inside the L4 worker's start, one child after another):
//! 1. Open the inbox for the rank, start pinging it, send `Hello`.
//! 2. Wait for its `Manifest` within the startup deadline while the rank keeps answering
//!    pings; a silent rank fails the start as [`RemoteError::Unresponsive`].
//! 3. Compare: its graphs must equal the L4 worker's graphs (names, order); its chip
//!    callables must equal those of the first remote child (entry names, order). A
//!    mismatch sends `Refuse` and fails the start naming rank and entry.
//! 4. Send `Accept`.
//!
//! Tasks: one at a time (the engine runs one task per endpoint thread). The endpoint sends
//! `Task` with a sequence number unique in the job, then waits for the `Completion` of that
//! number, skipping stale ones. While it waits it checks how long the rank has been silent:
//! past the liveness budget the task fails with `Unresponsive` and the endpoint stays failed
//! (later tasks fail fast; no automatic re-add).
//!
//! Registration after start (`Worker::register_graph` on the started L4 worker), serialized
//! among registrations and holding every session, so no task of a rank runs in between:
//! phase 1 sends `Prepare` (the next ordinal, the name) to every rank in turn and waits for
//! its `Prepared`; phase 2 sends `Commit` to every rank when all were ready, else `Abort` to
//! every rank and fails naming the first rank that refused or failed. The graph's id gets its
//! ordinal only after the commit, so no task of it can be submitted before. A rank the `Commit`
//! cannot be sent to (MPI did not confirm it within the liveness budget) does not serve the graph
//! while the others do: its session fails for good with [`RemoteError::CommitLost`], so its tasks
//! fail at once rather than reach it. So does a session that lost any frame: its next task or
//! registration fails with that loss before anything is sent.
//!
//! Shutdown (engine shutdown, or drop after a failed start): send `Shutdown`, wait for
//! `ShutdownDone` (silence budget as above, at most `SHUTDOWN_BUDGET` in all, warning every
//! 10 s while it waits; a `Left` from the rank ends the wait at once), stop pinging, close the
//! inbox. What the remote close reported, a `Left` saying the `ShutdownDone` was lost (which
//! carries what the close did), or a rank that never confirmed (any other `Left` included,
//! which says nothing of the close) becomes residue of the L4 close. A start that fails or
//! unwinds before its endpoints exist shuts its sessions down together: every `Shutdown` first,
//! then the waits, sharing one budget. Endpoints dropped unstarted, after an engine that
//! failed to start, do the same: the first one dropped shuts down every session of its start
//! that is still open.

use std::cell::Cell;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use simpler_sched::{DispatchedMember, Endpoint, EndpointCaps, EndpointFailure};
use simpler_types::{CallableId, CallableKind, FailureSource, WorkerId, WorkerType};

use super::error::{LeftCause, RemoteError, RemoteRunFailure, RemoteRunKind};
use super::frames::{ManifestEntry, Outcome, Packet};
use super::transport::{InboxRx, Transport};
use super::{MpiJob, describe, graph_entry};
use crate::error::{
    Leaked, Residue, StartCause, StartError, TeardownCause, TeardownError, TeardownPart,
};
use crate::run::panic_text;

/// Default liveness budget: how long a rank may stay silent before it counts as hung.
pub const DEFAULT_LIVENESS: Duration = Duration::from_secs(10);
/// The longest rank 0 waits for a remote L3 worker to confirm its shutdown.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(60);
/// How often a wait for a rank's `ShutdownDone` warns that it still waits.
const STILL_WAITING: Duration = crate::run::DEFAULT_STILL_WAITING;
/// The level of a remote child.
const REMOTE_LEVEL: u8 = 3;
/// The longest rank 0 waits for a rank's answer to phase 1 of a registration.
const PREPARE_BUDGET: Duration = Duration::from_secs(30);

/// Graph callable id → (manifest ordinal, name): the graphs every remote child serves.
type GraphOrdinals = Arc<RwLock<HashMap<CallableId, (u32, String)>>>;

/// A child of an L4 worker that is the L3 worker served by another MPI rank.
pub struct RemoteL3 {
    transport: Arc<Transport>,
    rank: i32,
    liveness: Duration,
}

impl std::fmt::Debug for RemoteL3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteL3")
            .field("rank", &self.rank)
            .field("liveness", &self.liveness)
            .finish()
    }
}

impl RemoteL3 {
    /// The L3 worker that `rank` serves with `serve_l3`; adopt it with
    /// `CompositeWorkerBuilder::child` on rank 0.
    pub fn new(job: &MpiJob, rank: i32) -> RemoteL3 {
        RemoteL3 { transport: Arc::clone(&job.transport), rank, liveness: DEFAULT_LIVENESS }
    }

    /// How long the rank may stay silent (not answering health pings) before the runs that
    /// wait on it fail (default 10 s; pings go out four times per budget).
    #[must_use]
    pub fn liveness(mut self, budget: Duration) -> RemoteL3 {
        self.liveness = budget;
        self
    }

    /// The rank.
    pub fn rank(&self) -> i32 {
        self.rank
    }

    /// Child `rank` of a rank 0 without an MPI thread, and a probe that returns the reason of the
    /// next `Refuse` sent to it within a bound (`None` if none was).
    #[cfg(test)]
    pub(crate) fn detached(rank: i32) -> (RemoteL3, impl Fn(Duration) -> Option<String>) {
        let (t, wire) = super::transport::detached::rank0(rank + 1);
        let spec = RemoteL3 { transport: Arc::new(t), rank, liveness: DEFAULT_LIVENESS };
        let refusal = move |within| match wire.sent(within) {
            Some((to, Packet::Refuse { session: None, reason })) if to == rank => Some(reason),
            _ => None,
        };
        (spec, refusal)
    }

    /// Tells the rank that rank 0's start failed before it reached this child, so that its
    /// `serve_l3` returns `Refused` instead of waiting for a session that never opens.
    pub(crate) fn refuse_unreached(&self, reason: &str) {
        let t = &self.transport;
        if t.rank != 0 || self.rank < 1 || self.rank >= t.size {
            return;
        }
        let refuse = Packet::Refuse { session: None, reason: reason.to_owned() };
        if let Err(e) = t.send(self.rank, &refuse) {
            tracing::warn!(rank = self.rank, error = %e, "could not refuse an unreached rank");
        }
    }
}

/// The remote children of one L4 start, and what their manifests are compared with.
pub(crate) struct Adoption {
    graphs: Vec<ManifestEntry>,
    ids: GraphOrdinals,
    /// The first remote child's chip callables, with its rank.
    chips: Option<(i32, Vec<ManifestEntry>)>,
    started: Vec<(WorkerId, Arc<Mutex<Session>>)>,
}

impl Adoption {
    /// The context for an L4 worker whose graphs are `graphs`, in registration order.
    pub(crate) fn new<'a>(graphs: impl Iterator<Item = (CallableId, &'a str)>) -> Adoption {
        let mut entries = Vec::new();
        let mut ids = HashMap::new();
        for (i, (id, name)) in graphs.enumerate() {
            entries.push(graph_entry(i, name));
            ids.insert(id, (i as u32, name.to_owned()));
        }
        let ids = Arc::new(RwLock::new(ids));
        Adoption { graphs: entries, ids, chips: None, started: Vec::new() }
    }

    /// Starts the session with `spec`'s rank as child `id` (steps 1–4).
    pub(crate) fn start(
        &mut self,
        id: WorkerId,
        spec: RemoteL3,
        deadline: Option<Instant>,
        startup_timeout: Duration,
        path: &str,
    ) -> Result<(), StartError> {
        let fail = |cause: RemoteError| StartError {
            cause: StartCause::Remote(cause),
            path: path.to_owned(),
            rollback: Vec::new(),
        };
        let t = &spec.transport;
        if t.rank != 0 {
            return Err(fail(RemoteError::WrongRank {
                rank: t.rank,
                op: "adopt a remote L3 child",
            }));
        }
        if spec.rank < 1 || spec.rank >= t.size {
            return Err(fail(RemoteError::NoSuchRank { rank: spec.rank, size: t.size }));
        }
        // 1.
        let inbox = t.open_inbox(spec.rank).map_err(fail)?;
        t.watch(spec.rank, spec.liveness / 4);
        // Session numbers come from the job's sequence, so a manifest or a `Left` of an earlier
        // session (one that arrived after rank 0 gave up on it) never answers this one.
        let nonce = t.next_seq();
        let mut session = Session {
            transport: Arc::clone(t),
            rank: spec.rank,
            nonce,
            host: String::new(),
            liveness: spec.liveness,
            inbox,
            failed: None,
            open: true,
            pings_mark: None,
            left_seen: Cell::new(None),
        };
        if let Err(e) = t.send(spec.rank, &Packet::Hello { session: nonce }) {
            session.end();
            return Err(fail(e));
        }
        // 2.
        let manifest = session.wait(
            deadline,
            None,
            0,
            |p| matches!(p, Packet::Manifest { session, .. } if *session == nonce),
        );
        let (host, entries, start_error) = match manifest {
            Ok(Packet::Manifest { host, entries, start_error, .. }) => (host, entries, start_error),
            Ok(_) => unreachable!("wait returns only frames its filter accepts"),
            Err(Waited::Deadline) => {
                session.refuse("the startup deadline passed");
                return Err(StartError {
                    cause: StartCause::DeadlineExceeded {
                        pending: vec![path.to_owned()],
                        budget: startup_timeout,
                    },
                    path: path.to_owned(),
                    rollback: Vec::new(),
                });
            }
            Err(Waited::Failed(e)) => {
                session.refuse(&e.to_string());
                return Err(fail(e));
            }
        };
        session.host = host.clone();
        // From here a pong answering a later ping reports this session while the rank serves it.
        session.pings_mark = Some(t.pings_sent());
        if let Some(message) = start_error {
            // The rank already left its session.
            session.end();
            return Err(fail(RemoteError::RemoteStart { rank: spec.rank, host, message }));
        }
        // 3.
        let (graphs, chips): (Vec<ManifestEntry>, Vec<ManifestEntry>) =
            entries.into_iter().partition(|e| e.kind == CallableKind::Graph);
        let mut checked = compare(spec.rank, &self.graphs, &graphs);
        if checked.is_ok()
            && let Some((_, reference)) = &self.chips
        {
            checked = compare(spec.rank, reference, &chips);
        }
        if let Err(e) = checked {
            session.refuse(&e.to_string());
            return Err(fail(e));
        }
        // 4.
        if let Err(e) = t.send(spec.rank, &Packet::Accept) {
            // The rank waits for `Accept` or `Refuse`: a refusal, if it gets through, ends it.
            session.refuse(&format!("rank 0 could not accept the start: {e}"));
            return Err(fail(e));
        }
        self.chips.get_or_insert((spec.rank, chips));
        self.started.push((id, Arc::new(Mutex::new(session))));
        Ok(())
    }

    /// Shuts the started sessions down together after a failed start ([`shutdown_all`]),
    /// reporting into `rollback`.
    pub(crate) fn rollback(mut self, rollback: &mut Vec<TeardownError>, path: &str) {
        let started = std::mem::take(&mut self.started);
        for (_, residue) in shutdown_all(&started) {
            rollback.extend(residue.into_iter().map(|r| r.into_teardown(path)));
        }
    }

    /// What submits to the started children are checked against.
    pub(crate) fn children(&self) -> RemoteChildren {
        RemoteChildren {
            ranks: self.started.iter().map(|(id, s)| (*id, s.lock().rank)).collect(),
            sessions: self.started.iter().map(|(_, s)| Arc::clone(s)).collect(),
            graphs: Arc::clone(&self.ids),
            registering: Mutex::new(()),
        }
    }

    /// The NEXT_LEVEL endpoints of the started sessions.
    pub(crate) fn into_endpoints(
        mut self,
        residue: &Arc<Mutex<Vec<Residue>>>,
    ) -> Vec<RemoteEndpoint> {
        let ids = Arc::clone(&self.ids);
        let siblings = Siblings {
            sessions: std::mem::take(&mut self.started).into(),
            engaged: Arc::default(),
        };
        siblings
            .sessions
            .iter()
            .map(|(id, session)| {
                let rank = session.lock().rank;
                RemoteEndpoint {
                    id: *id,
                    rank,
                    session: Arc::clone(session),
                    graphs: Arc::clone(&ids),
                    residue: Arc::clone(residue),
                    siblings: siblings.clone(),
                    shut_down: false,
                }
            })
            .collect()
    }
}

/// The remote children of a started L4 worker, for the submit-time checks of their tasks.
#[derive(Default)]
pub(crate) struct RemoteChildren {
    /// Child id → rank.
    ranks: HashMap<WorkerId, i32>,
    /// Every remote child's session, shared with its endpoint.
    sessions: Vec<Arc<Mutex<Session>>>,
    /// The graphs every remote child serves: those compared at start and those registered
    /// after it.
    graphs: GraphOrdinals,
    /// Serializes registrations after start (each takes the next ordinal).
    registering: Mutex<()>,
}

impl RemoteChildren {
    /// Refuses a task for remote child `target` whose tensors cannot cross hosts. Returns the
    /// host buffers the run keeps alive for the endpoint; nothing for a local child.
    pub(crate) fn check_task(
        &self,
        args: &simpler_types::TaskArgs,
        target: WorkerId,
    ) -> Result<Vec<crate::HostBuffer>, crate::WorkerError> {
        let Some(&rank) = self.ranks.get(&target) else { return Ok(Vec::new()) };
        super::tensors::refuse_unshippable(args, target, rank)
    }

    /// Registers graph `name` on every remote child in two phases (module docs); `local`
    /// makes the handle on rank 0 once every rank committed. Without remote children it is
    /// just `local`.
    pub(crate) fn register_graph(
        &self,
        name: &str,
        local: impl FnOnce() -> crate::CallableHandle,
    ) -> Result<crate::CallableHandle, crate::WorkerError> {
        if self.sessions.is_empty() {
            return Ok(local());
        }
        let _serial = self.registering.lock();
        let ordinal = self.graphs.read().len() as u32;
        let mut sessions: Vec<_> = self.sessions.iter().map(|s| s.lock()).collect();
        // Phase 1: one budget for all ranks, not one per rank.
        let deadline = Instant::now().checked_add(PREPARE_BUDGET);
        let refused = sessions.iter_mut().find_map(|s| s.prepare(ordinal, name, deadline).err());
        // Phase 2. The decision stands once taken: a rank the commit cannot be sent to does
        // not serve the graph the others serve from now on, so its session fails for good, and
        // its tasks fail at once instead of reaching a rank that does not know the graph.
        let decision =
            if refused.is_some() { Packet::Abort { ordinal } } else { Packet::Commit { ordinal } };
        for s in &mut sessions {
            // A `Commit` waits until MPI has sent it: a loss found only later by the MPI thread
            // would leave the session open, and the rank's next task would reach it.
            let sent = match decision {
                Packet::Commit { .. } => s.transport.send_confirmed(s.rank, &decision, s.liveness),
                _ => s.transport.send(s.rank, &decision),
            };
            let Err(e) = sent else { continue };
            if refused.is_some() {
                tracing::warn!(rank = s.rank, graph = name, error = %e, "could not send {decision:?}");
                continue;
            }
            let lost = RemoteError::CommitLost {
                rank: s.rank,
                graph: name.to_owned(),
                ordinal,
                cause: Box::new(e),
            };
            tracing::error!(rank = s.rank, graph = name, error = %lost, "the rank's session fails");
            s.failed = Some(lost);
        }
        if let Some((rank, cause)) = refused {
            return Err(crate::WorkerError::RemoteRegistration {
                graph: name.to_owned(),
                rank,
                cause,
            });
        }
        let handle = local();
        self.graphs.write().insert(handle.id, (ordinal, name.to_owned()));
        drop(sessions);
        Ok(handle)
    }
}

/// Step 3: the first differing entry, if any.
fn compare(
    rank: i32,
    expected: &[ManifestEntry],
    found: &[ManifestEntry],
) -> Result<(), RemoteError> {
    let n = expected.len().max(found.len());
    for index in 0..n {
        let (e, f) = (expected.get(index), found.get(index));
        if !same_entry(e, f) {
            let show = |x: Option<&ManifestEntry>| x.map_or_else(|| "nothing".to_owned(), describe);
            return Err(RemoteError::ManifestMismatch {
                rank,
                index,
                expected: show(e),
                found: show(f),
            });
        }
    }
    Ok(())
}

/// Whether two manifest entries name the same callable. Chip callables compare by kind and
/// name only: the content digest of an in-process (native) program hashes function
/// addresses, which differ between processes.
fn same_entry(a: Option<&ManifestEntry>, b: Option<&ManifestEntry>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) if a.kind == CallableKind::Chip => b.kind == a.kind && a.name == b.name,
        (a, b) => a == b,
    }
}

/// Why a wait for a frame ended without one.
enum Waited {
    Deadline,
    Failed(RemoteError),
}

/// An open session with one serving rank.
pub(crate) struct Session {
    transport: Arc<Transport>,
    rank: i32,
    /// The session number its `Hello` carried.
    nonce: u64,
    host: String,
    liveness: Duration,
    inbox: InboxRx,
    /// Set once the rank was declared unresponsive: later tasks fail fast with it.
    failed: Option<RemoteError>,
    /// Whether inbox and pings are still open.
    open: bool,
    /// The latest ping sent when the rank's `Manifest` arrived: a pong answering a later one
    /// reports the session the rank serves. `None` (no wait looks at pongs) until then, and again
    /// once `Shutdown` went out: the rank then leaves the session as asked, and its pongs may say
    /// so before its `ShutdownDone` (or the `Left` that reports it lost) arrives over a slower
    /// data path, so they no longer end a wait (the shutdown budget does).
    pings_mark: Option<u64>,
    /// When a wait first saw the rank's pongs report another session than this one.
    left_seen: Cell<Option<Instant>>,
}

impl Session {
    /// Waits for a frame `want` accepts (others are logged and skipped) until `deadline`,
    /// failing when the rank stays silent past its liveness budget or a frame to or from it is
    /// lost (beyond the `lost_before` lost when the wait's request was sent).
    fn wait(
        &self,
        deadline: Option<Instant>,
        task: Option<&DispatchedMember<'_>>,
        lost_before: u64,
        want: impl Fn(&Packet) -> bool,
    ) -> Result<Packet, Waited> {
        let slice = (self.liveness / 8).clamp(Duration::from_millis(1), Duration::from_millis(50));
        loop {
            match self.inbox.recv_timeout(slice) {
                Ok(Packet::Left { session, cause }) if session == self.nonce => {
                    return Err(Waited::Failed(RemoteError::Left { rank: self.rank, cause }));
                }
                Ok(p) if want(&p) => return Ok(p),
                // The kind only: a stale frame may carry gigabytes of tensor bytes.
                Ok(p) => {
                    tracing::debug!(rank = self.rank, kind = ?p.kind(), "skipping a stale frame")
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Waited::Failed(RemoteError::Finalized));
                }
            }
            if let Some(e) = self.transport.lost_since(self.rank, lost_before) {
                return Err(Waited::Failed(e));
            }
            if self.transport.silent_for(self.rank) > self.liveness {
                return Err(Waited::Failed(RemoteError::Unresponsive {
                    rank: self.rank,
                    level: REMOTE_LEVEL,
                    budget: self.liveness,
                    run: task.map(|t| t.task.run),
                    task: task.map(|t| t.task),
                }));
            }
            if self.transport.is_stopped() {
                return Err(Waited::Failed(RemoteError::Finalized));
            }
            if let Some(e) = self.left_without_a_word(task) {
                return Err(Waited::Failed(e));
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err(Waited::Deadline);
            }
        }
    }

    /// The rank's pongs report another session than this one (it left, and its `Left` was lost,
    /// or it has not arrived yet): once that has lasted the liveness budget with no frame ending
    /// the wait, the session is over. The budget leaves room for a `Left` or a reply the rank
    /// sent before it left, which travel on another communicator than the pong.
    fn left_without_a_word(&self, task: Option<&DispatchedMember<'_>>) -> Option<RemoteError> {
        let serving = self.transport.serving_after(self.rank, self.pings_mark?)?;
        if serving == self.nonce {
            return None;
        }
        let seen = self.left_seen.get().unwrap_or_else(Instant::now);
        self.left_seen.set(Some(seen));
        (seen.elapsed() > self.liveness).then(|| RemoteError::SessionEnded {
            rank: self.rank,
            session: self.nonce,
            serving,
            run: task.map(|t| t.task.run),
            task: task.map(|t| t.task),
        })
    }

    /// A wait's failure, returned as it is and kept, so later tasks fail at once without
    /// reaching the rank: every one ends the session for good (the rank stopped answering or
    /// left, the transport stopped, or a frame to or from the rank was lost, of whatever kind:
    /// the loss stays recorded, so every later wait would fail on it only after its request had
    /// been sent and run).
    fn wait_failed(&mut self, e: RemoteError) -> RemoteError {
        self.failed = Some(e.clone());
        e
    }

    /// Tells the rank its start was refused, then ends the session.
    fn refuse(&mut self, reason: &str) {
        if let Err(e) = self.transport.send(
            self.rank,
            &Packet::Refuse { session: Some(self.nonce), reason: reason.to_owned() },
        ) {
            tracing::warn!(rank = self.rank, error = %e, "could not send Refuse");
        }
        self.end();
    }

    /// Stops pinging the rank and closes its inbox.
    fn end(&mut self) {
        if std::mem::take(&mut self.open) {
            self.transport.unwatch(self.rank);
            self.transport.close_inbox(self.rank, &self.inbox);
        }
    }

    /// Runs one task remotely (see the module docs).
    fn call(&mut self, graph: u32, task: &DispatchedMember<'_>) -> Result<Outcome, RemoteError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if let Some(e) = self.transport.lost_frame(self.rank) {
            return Err(self.wait_failed(e));
        }
        let (args, back) = super::tensors::pack(self.rank, task.task, task.args)?;
        let seq = self.transport.next_seq();
        let packet = Packet::Task { seq, graph, config: task.config.clone(), args };
        self.transport.send(self.rank, &packet)?;
        let wanted = |p: &Packet| matches!(p, Packet::Completion { seq: s, .. } if *s == seq);
        match self.wait(None, Some(task), 0, wanted) {
            Ok(Packet::Completion { outcome: Outcome::Ok { written }, .. }) => {
                back.write_back(self.rank, &written)?;
                Ok(Outcome::Ok { written: Vec::new() })
            }
            Ok(Packet::Completion { outcome, .. }) => Ok(outcome),
            Ok(_) => unreachable!("wait returns only frames its filter accepts"),
            Err(Waited::Failed(e)) => Err(self.wait_failed(e)),
            Err(Waited::Deadline) => unreachable!("a task wait has no deadline"),
        }
    }

    /// Phase 1 of a registration after start on this rank, answered by `deadline`: `Err` with
    /// the rank when it refused or failed.
    fn prepare(
        &mut self,
        ordinal: u32,
        name: &str,
        deadline: Option<Instant>,
    ) -> Result<(), (i32, RemoteError)> {
        let rank = self.rank;
        if let Some(e) = &self.failed {
            return Err((rank, e.clone()));
        }
        if let Some(e) = self.transport.lost_frame(rank) {
            return Err((rank, self.wait_failed(e)));
        }
        if !self.open {
            return Err((rank, RemoteError::Finalized));
        }
        let seq = self.transport.next_seq();
        let packet = Packet::Prepare { seq, ordinal, name: name.to_owned() };
        self.transport.send(rank, &packet).map_err(|e| (rank, e))?;
        let refused = |reason: String| RemoteError::RegistrationRefused {
            rank,
            graph: name.to_owned(),
            reason,
        };
        match self.wait(
            deadline,
            None,
            0,
            |p| matches!(p, Packet::Prepared { seq: s, .. } if *s == seq),
        ) {
            Ok(Packet::Prepared { refusal: None, .. }) => Ok(()),
            Ok(Packet::Prepared { refusal: Some(reason), .. }) => Err((rank, refused(reason))),
            Ok(_) => unreachable!("wait returns only frames its filter accepts"),
            Err(Waited::Deadline) => Err((
                rank,
                RemoteError::RegistrationTimedOut {
                    rank,
                    graph: name.to_owned(),
                    budget: PREPARE_BUDGET,
                },
            )),
            Err(Waited::Failed(e)) => Err((rank, self.wait_failed(e))),
        }
    }

    /// Waits for the rank's `ShutdownDone` until `until` (`None`: without limit), warning every
    /// [`STILL_WAITING`] while it does not come, so that a long wait is never silent.
    fn wait_shutdown_done(
        &self,
        lost_before: u64,
        until: Option<Instant>,
    ) -> Result<Packet, Waited> {
        let since = Instant::now();
        let done = |p: &Packet| matches!(p, Packet::ShutdownDone { .. });
        loop {
            let slice = Instant::now().checked_add(STILL_WAITING);
            let deadline = match (slice, until) {
                (Some(s), Some(u)) => Some(s.min(u)),
                (s, u) => s.or(u),
            };
            match self.wait(deadline, None, lost_before, done) {
                Err(Waited::Deadline) if until.is_none_or(|u| Instant::now() < u) => {
                    tracing::warn!(
                        rank = self.rank,
                        host = %self.host,
                        waited = ?since.elapsed(),
                        budget = ?SHUTDOWN_BUDGET,
                        "still waiting for the rank's L3 worker to confirm its shutdown"
                    );
                }
                other => return other,
            }
        }
    }

    /// The part of a worker this session is, as child `child`.
    fn part(&self, child: WorkerId) -> TeardownPart {
        TeardownPart::Remote { child, rank: self.rank, host: self.host.clone() }
    }

    /// Ends the session of child `child` with `Shutdown`; returns what the remote close
    /// reported.
    fn shutdown(&mut self, child: WorkerId) -> Vec<Residue> {
        match self.send_shutdown(child) {
            ShutdownSent::Awaiting { lost_before } => {
                let until = Instant::now().checked_add(SHUTDOWN_BUDGET);
                self.await_shutdown(child, lost_before, until)
            }
            ShutdownSent::Ended(residue) => residue,
        }
    }

    /// The first half of [`shutdown`](Self::shutdown): sends `Shutdown` unless the session has
    /// ended already (closed, or the rank left it), in which case it is over here.
    fn send_shutdown(&mut self, child: WorkerId) -> ShutdownSent {
        if !self.open {
            return ShutdownSent::Ended(Vec::new());
        }
        let part = self.part(child);
        if let Some(e @ (RemoteError::Left { .. } | RemoteError::SessionEnded { .. })) =
            &self.failed
        {
            // The rank already left this session: nobody there would answer a `Shutdown`. Its
            // `Left` is judged as one arriving in answer to `Shutdown` is, below; a departure
            // only its pongs told of leaves its worker's close unknown.
            let residue = vec![left_residue(part, e.clone())];
            self.end();
            return ShutdownSent::Ended(residue);
        }
        // A frame lost earlier in the session (a damaged reply) does not keep the rank from
        // answering `Shutdown`: only one lost from now on ends this wait early.
        let lost_before = self.transport.lost_count(self.rank);
        self.pings_mark = None;
        match self.transport.send(self.rank, &Packet::Shutdown) {
            Ok(()) => ShutdownSent::Awaiting { lost_before },
            Err(e) => {
                self.end();
                ShutdownSent::Ended(vec![Residue::failed(part, TeardownCause::RemoteShutdown(e))])
            }
        }
    }

    /// The second half of [`shutdown`](Self::shutdown): waits for the rank's `ShutdownDone`
    /// until `until`, then ends the session; returns what the remote close reported.
    fn await_shutdown(
        &mut self,
        child: WorkerId,
        lost_before: u64,
        until: Option<Instant>,
    ) -> Vec<Residue> {
        let part = self.part(child);
        let mut residue = Vec::new();
        match self.wait_shutdown_done(lost_before, until) {
            Ok(Packet::ShutdownDone { errors }) => {
                residue.extend(errors.into_iter().map(|report| {
                    Residue::failed(part.clone(), TeardownCause::RemoteClose { report })
                }));
            }
            Ok(_) => unreachable!("wait returns only frames its filter accepts"),
            Err(Waited::Failed(e @ RemoteError::Left { .. })) => {
                residue.push(left_residue(part, e));
            }
            Err(Waited::Deadline) => residue
                .push(Residue::leaked(part, Leaked::RemoteUnconfirmed { budget: SHUTDOWN_BUDGET })),
            Err(Waited::Failed(e)) => {
                residue.push(Residue::leaked(part, Leaked::RemoteLost(e)));
            }
        }
        self.end();
        residue
    }
}

/// How sending a session's `Shutdown` went.
enum ShutdownSent {
    /// Sent: the rank's `ShutdownDone` is awaited, counting frames lost after this count.
    Awaiting { lost_before: u64 },
    /// The session is over without a wait, with what is left of it.
    Ended(Vec<Residue>),
}

/// Shuts `sessions` down together: every `Shutdown` is sent before any `ShutdownDone` is waited
/// for, and the waits share one [`SHUTDOWN_BUDGET`], so ranks that never confirm cost one budget
/// in all, not one each. A step that panics is that session's residue; the others go on.
/// Returns each child's residue, in order.
fn shutdown_all(sessions: &[(WorkerId, Arc<Mutex<Session>>)]) -> Vec<(WorkerId, Vec<Residue>)> {
    let sent: Vec<ShutdownSent> = sessions
        .iter()
        .map(|(id, s)| guarded(*id, s, |s| s.send_shutdown(*id), |r| ShutdownSent::Ended(vec![r])))
        .collect();
    let until = Instant::now().checked_add(SHUTDOWN_BUDGET);
    let awaited = sessions.iter().zip(sent).map(|((id, s), sent)| match sent {
        ShutdownSent::Awaiting { lost_before } => {
            let wait = |s: &mut Session| s.await_shutdown(*id, lost_before, until);
            (*id, guarded(*id, s, wait, |r| vec![r]))
        }
        ShutdownSent::Ended(residue) => (*id, residue),
    });
    awaited.collect()
}

/// Runs one step of child `id`'s shutdown on its session; a panic becomes its residue, which
/// `panicked` turns into the step's result.
fn guarded<T>(
    id: WorkerId,
    session: &Mutex<Session>,
    step: impl FnOnce(&mut Session) -> T,
    panicked: impl FnOnce(Residue) -> T,
) -> T {
    catch_unwind(AssertUnwindSafe(|| step(&mut session.lock()))).unwrap_or_else(|p| {
        let message = panic_text(p.as_ref());
        let part = session.lock().part(id);
        panicked(Residue::failed(part, TeardownCause::Panicked { step: "shutdown", message }))
    })
}

/// What a serving rank's `Left` leaves of its session at close, whenever it came. One saying
/// its `ShutdownDone` was lost also says what its close did: nothing is unaccounted for. A
/// `Left` for any other cause (a frame lost or damaged) says nothing of the close: the rank's
/// worker may have leaked.
fn left_residue(part: TeardownPart, left: RemoteError) -> Residue {
    match left {
        RemoteError::Left { cause: LeftCause::ShutdownDoneLost { .. }, .. } => {
            Residue::failed(part, TeardownCause::Remote(left))
        }
        other => Residue::leaked(part, Leaked::RemoteLost(other)),
    }
}

/// A start that unwound between adopting a session and handing it to an endpoint (a panic in a
/// later child's start, say) would leave the rank serving a session nobody closes: the rank
/// keeps answering pings, so nothing on either side would ever end it. The sessions still held
/// here are shut down together as a rollback would, within one shutdown budget; what is left is
/// logged, there being no caller to report it to.
impl Drop for Adoption {
    fn drop(&mut self) {
        let started = std::mem::take(&mut self.started);
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| shutdown_all(&started))) {
            Ok(residue) => {
                for (id, r) in
                    residue.into_iter().flat_map(|(id, r)| r.into_iter().map(move |r| (id, r)))
                {
                    tracing::error!(child = id.0, residue = ?r, "remote session of an unwound start");
                }
            }
            Err(p) => tracing::error!(
                panic = %crate::run::panic_text(p.as_ref()),
                "shutting down the remote sessions of an unwound start panicked"
            ),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.end();
    }
}

/// Every session one start handed to endpoints, with its child's id, and whether any of those
/// endpoints reached an engine thread (the engine started them).
#[derive(Clone)]
struct Siblings {
    sessions: Arc<[(WorkerId, Arc<Mutex<Session>>)]>,
    engaged: Arc<std::sync::atomic::AtomicBool>,
}

/// The L4 endpoint of one remote L3 child.
pub(crate) struct RemoteEndpoint {
    id: WorkerId,
    rank: i32,
    /// Shared with [`RemoteChildren`] for registrations after start.
    session: Arc<Mutex<Session>>,
    graphs: GraphOrdinals,
    residue: Arc<Mutex<Vec<Residue>>>,
    /// The sessions of every endpoint of the same start, this one's included: an endpoint
    /// dropped while none of them was started shuts those still open down together.
    siblings: Siblings,
    /// Whether the engine shut this endpoint down.
    shut_down: bool,
}

impl RemoteEndpoint {
    /// The child id this endpoint serves.
    pub(crate) fn id(&self) -> WorkerId {
        self.id
    }
}

fn failure_of(e: RemoteError) -> EndpointFailure {
    let f = match &e {
        // The task's own arguments or graph: the endpoint is fine.
        RemoteError::Unshippable { .. }
        | RemoteError::UnknownGraph { .. }
        | RemoteError::FrameTooLarge { .. } => EndpointFailure::task_failed(e.to_string()),
        _ => EndpointFailure::endpoint_failed(e.to_string()),
    };
    f.with_source(FailureSource::new(e))
}

impl Endpoint for RemoteEndpoint {
    fn caps(&self) -> EndpointCaps {
        EndpointCaps {
            worker_type: WorkerType::NextLevel,
            id: self.id,
            remote: true,
            name: format!("child {} (L3 on rank {})", self.id, self.rank),
        }
    }

    fn run(&mut self, task: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
        let rank = self.rank;
        let Some(graph) = self.graphs.read().get(task.callable).map(|(o, _)| *o) else {
            return Err(failure_of(RemoteError::UnknownGraph {
                rank,
                graph: format!("{:?}", task.callable),
            }));
        };
        let mut session = self.session.lock();
        match session.call(graph, &task).map_err(failure_of)? {
            Outcome::Ok { .. } => Ok(()),
            Outcome::TaskFailed { failure } => {
                let e = RemoteError::TaskFailed {
                    rank,
                    host: session.host.clone(),
                    level: REMOTE_LEVEL,
                    run: failure.task.run,
                    task: Some(failure.task.seq),
                    message: failure.to_string(),
                };
                Err(EndpointFailure::task_failed(e.to_string())
                    .with_source(FailureSource::new(e))
                    .with_cause(Arc::new(failure)))
            }
            Outcome::RunFailed { level, failure } => {
                let task = fails_the_task(&failure);
                let e = RemoteError::RunFailed { rank, host: session.host.clone(), level, failure };
                let f = if task {
                    EndpointFailure::task_failed(e.to_string())
                } else {
                    EndpointFailure::endpoint_failed(e.to_string())
                };
                Err(f.with_source(FailureSource::new(e)))
            }
        }
    }

    fn on_thread_start(&mut self) {
        // Release pairs with the Acquire load of a sibling's drop.
        self.siblings.engaged.store(true, std::sync::atomic::Ordering::Release);
    }

    fn shutdown(&mut self) {
        let r = guarded(self.id, &self.session, |s| s.shutdown(self.id), |r| vec![r]);
        self.shut_down = true;
        self.residue.lock().extend(r);
    }
}

/// Whether a remote run that failed without a failed task failed this task, as a local child
/// run's failure would (`child.rs`): its graph's build failed, or its written bytes cannot come
/// back. Anything else (a graph the rank does not serve, arguments that do not unpack there, a
/// run that failed without a failed task, a worker that turned the run down) failed the path.
fn fails_the_task(failure: &RemoteRunFailure) -> bool {
    match failure {
        RemoteRunFailure::ReplyTooLarge { .. } => true,
        RemoteRunFailure::Run { kind, .. } => *kind == RemoteRunKind::SubmissionFailed,
        RemoteRunFailure::UnknownOrdinal { .. } | RemoteRunFailure::Arguments(_) => false,
    }
}

impl Drop for RemoteEndpoint {
    /// An endpoint the engine never shut down. When no endpoint of its start reached an engine
    /// thread (an engine that failed to start, which drops its endpoints one after the other),
    /// the first one dropped shuts down every session of its start still open together, as a
    /// rollback does, so that the ranks share one shutdown budget instead of waiting in turn;
    /// the sessions it closed are no-ops for the drops that follow. Otherwise (an endpoint
    /// thread that unwound) only its own session, whose siblings the engine still uses. Never
    /// unwinds out of the drop.
    fn drop(&mut self) {
        if self.shut_down {
            return;
        }
        let residue = if self.siblings.engaged.load(std::sync::atomic::Ordering::Acquire) {
            guarded(self.id, &self.session, |s| s.shutdown(self.id), |r| vec![r])
        } else {
            shutdown_all(&self.siblings.sessions).into_iter().flat_map(|(_, r)| r).collect()
        };
        self.residue.lock().extend(residue);
    }
}

#[cfg(test)]
mod tests;
