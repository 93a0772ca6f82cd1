//! The serving side: an L3 worker on rank `1..N` that runs rank 0's tasks
//! (`docs/multi-host.md` §"Session").
//!
//! 1. Open the inbox for rank 0 and wait for `Hello`.
//! 2. Start the L3 worker; reply `Manifest` (graphs and chip callables in registration order,
//!    or the start error, after which `serve_l3` returns it).
//! 3. `Refuse` → close the worker, return [`RemoteError::Refused`]. `Accept` → serve.
//! 4. Serve: each `Task` runs the named graph once as a whole L3 run on the calling thread
//!    (one task at a time), over host buffers of this rank holding the task's tensors
//!    (`tensors`), and is answered by `Completion` with the outcome: on success the bytes its
//!    write-tagged tensors can touch, on failure the failure chain.
//! 5. `Shutdown` → close the worker, reply `ShutdownDone` with what the close reported, wait
//!    (its liveness budget, but at least 1 s) until MPI has sent it, close the inbox and return
//!    what the close reported; a reply that MPI refuses, or does not confirm sent within that
//!    wait (it may then still arrive), is returned beside the close's errors
//!    ([`ServeError::CloseUnreported`]), never instead, and a `Left` saying so follows it to rank
//!    0 when MPI takes that.
//!
//! Between tasks, rank 0 may register a graph after start, in two phases: `Prepare` (answered
//! `Prepared`, ready or with the refusal) and then `Commit` or `Abort`. A graph listed with
//! [`ServedGraphs::register_later`] is prepared when its name comes as the next ordinal; on
//! `Commit` it is served under that ordinal, on `Abort` it stays waiting.
//!
//! Throughout, the rank pings rank 0 four times per its liveness budget
//! ([`ServedGraphs::liveness`]): a wait for rank 0's next frame that hears nothing from it past
//! the budget ends the session with [`RemoteError::Unresponsive`] instead of waiting for good.

use std::sync::Arc;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use simpler_types::{CallConfig, TaskArgsView};

use super::endpoint::DEFAULT_LIVENESS;
use super::error::{
    LeftCause, ProtocolViolation, RemoteError, RemoteRunFailure, RemoteRunKind, ServeError,
};
use super::frames::{FrameKind, ManifestEntry, Outcome, Packet, WireArgs};
use super::tensors::unpack;
use super::transport::{InboxRx, MAX_FRAME_BYTES, Transport, check_frame};
use super::{MpiJob, graph_entry};
use crate::builder::HostWorkerBuilder;
use crate::error::{BoxError, CloseError, RunErrorKind, StartError, WorkerError};
use crate::graph::{GraphBuilder, Orchestration};
use crate::handle::GraphFn;
use crate::sub::{dispose, text_of};
use crate::worker::Worker;

/// How often a serving rank that waits for rank 0 checks that its transport still runs and
/// that rank 0 answers.
const WAIT_SLICE: Duration = Duration::from_millis(100);
/// The level of rank 0's worker, named when it stops answering.
const RANK0_LEVEL: u8 = 4;
/// The least a serving rank waits for MPI to send the last frame of a session (its
/// `ShutdownDone`, or the `Manifest` of a start that failed). The liveness budget measures rank
/// 0's silence, not how long this rank's MPI thread takes to send a frame, so a short budget
/// alone would report a frame still on its way as unconfirmed.
const LAST_FRAME_FLOOR: Duration = Duration::from_secs(1);

/// The graphs a serving rank runs for rank 0, registered in the same order and under the same
/// names as rank 0 registers them on its L4 worker (checked at start).
pub struct ServedGraphs {
    entries: Vec<(String, Arc<GraphFn>)>,
    /// Graphs served once rank 0 registers them after start (by name).
    later: Vec<(String, Arc<GraphFn>)>,
    /// How long rank 0 may stay silent before the session is given up.
    liveness: Duration,
}

impl Default for ServedGraphs {
    fn default() -> Self {
        ServedGraphs { entries: Vec::new(), later: Vec::new(), liveness: DEFAULT_LIVENESS }
    }
}

impl std::fmt::Debug for ServedGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.entries.iter().map(|(n, _)| n)).finish()
    }
}

impl ServedGraphs {
    /// An empty list.
    pub fn new() -> ServedGraphs {
        ServedGraphs::default()
    }

    /// Adds a graph; it gets the serving L3 worker's graph builder, so it submits with
    /// handles registered on that worker's builder.
    pub fn register(
        &mut self,
        name: &str,
        g: impl Fn(&mut GraphBuilder<'_>, TaskArgsView<'_>, &CallConfig) -> Result<(), BoxError>
        + Send
        + Sync
        + 'static,
    ) -> &mut Self {
        self.entries.push((name.to_owned(), Arc::new(g)));
        self
    }

    /// Adds a graph that rank 0 registers on its started L4 worker (`Worker::register_graph`):
    /// it is not in this rank's start manifest and is served from the moment that
    /// registration commits, under the ordinal rank 0 gives it.
    pub fn register_later(
        &mut self,
        name: &str,
        g: impl Fn(&mut GraphBuilder<'_>, TaskArgsView<'_>, &CallConfig) -> Result<(), BoxError>
        + Send
        + Sync
        + 'static,
    ) -> &mut Self {
        self.later.push((name.to_owned(), Arc::new(g)));
        self
    }

    /// How long rank 0 may stay silent (its MPI thread answers no ping) while this rank waits
    /// for its next frame before `serve_l3` gives the session up with
    /// [`RemoteError::Unresponsive`] (default [`DEFAULT_LIVENESS`]). A rank 0 that is only idle
    /// keeps answering.
    pub fn liveness(&mut self, budget: Duration) -> &mut Self {
        self.liveness = budget;
        self
    }

    /// Phase 1 of a registration after start: whether graph `name` can be served as
    /// `ordinal`, and its index among the later graphs.
    fn prepare(&self, ordinal: u32, name: &str) -> Result<usize, String> {
        if ordinal as usize != self.entries.len() {
            return Err(format!(
                "graph '{name}' comes as ordinal {ordinal}, but this rank serves {} graphs",
                self.entries.len()
            ));
        }
        self.later.iter().position(|(n, _)| n == name).ok_or_else(|| {
            format!(
                "this rank has no graph '{name}' to serve after start \
                 (ServedGraphs::register_later)"
            )
        })
    }
}

/// Serves rank 0's tasks with the L3 worker `builder` starts, until rank 0 shuts the session
/// down (protocol in the module docs). Call it on ranks `1..N`; it may be called again for
/// the next session.
pub fn serve_l3(
    job: &MpiJob,
    builder: HostWorkerBuilder,
    graphs: ServedGraphs,
) -> Result<(), ServeError> {
    let t = &*job.transport;
    if t.rank == 0 {
        return Err(RemoteError::WrongRank { rank: 0, op: "serve an L3 worker" }.into());
    }
    let serving = Serving::open(t, graphs.liveness / 4)?;
    let rank0 = Rank0 { t, inbox: &serving.inbox, liveness: graphs.liveness };
    serve_session(&rank0, builder, graphs)
}

/// This rank's hold on rank 0 while it serves: rank 0's inbox, open, and pings to it. However
/// the session ends (a panic included), dropping it stops the pings, closes the inbox so that a
/// later `serve_l3` can open it again, and clears the session this rank's pongs report.
struct Serving<'a> {
    t: &'a Transport,
    inbox: InboxRx,
}

impl<'a> Serving<'a> {
    fn open(t: &'a Transport, ping_every: Duration) -> Result<Serving<'a>, RemoteError> {
        let inbox = t.open_inbox(0)?;
        t.watch(0, ping_every);
        Ok(Serving { t, inbox })
    }
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.t.set_serving(0);
        self.t.unwatch(0);
        self.t.close_inbox(0, &self.inbox);
    }
}

/// Rank 0 as a serving session hears it.
struct Rank0<'a> {
    t: &'a Transport,
    inbox: &'a InboxRx,
    liveness: Duration,
}

impl Rank0<'_> {
    /// Sends the last frame of a session to rank 0 and waits for MPI to confirm it sent, at
    /// least [`LAST_FRAME_FLOOR`]: nothing later from rank 0 would tell of its loss.
    fn send_last(&self, packet: &Packet) -> Result<(), RemoteError> {
        self.t.send_confirmed(0, packet, self.liveness.max(LAST_FRAME_FLOOR))
    }

    /// The next frame from rank 0; fails when the transport stops, a frame from rank 0 was
    /// lost, or rank 0 stays silent past the liveness budget.
    fn next(&self) -> Result<Packet, RemoteError> {
        loop {
            let slice = (self.liveness / 4).clamp(Duration::from_millis(1), WAIT_SLICE);
            // At every call and wake, not only when idle: a frame from rank 0 lost while others
            // keep arriving (its next task, say) would otherwise never be noticed. Before the
            // receive, so that a frame taken is never dropped.
            if let Some(e) = self.t.lost_frame(0) {
                return Err(e);
            }
            match self.inbox.recv_timeout(slice) {
                Ok(p) => return Ok(p),
                Err(RecvTimeoutError::Timeout) if !self.t.is_stopped() => {
                    if self.t.silent_for(0) > self.liveness {
                        return Err(RemoteError::Unresponsive {
                            rank: 0,
                            level: RANK0_LEVEL,
                            budget: self.liveness,
                            run: None,
                            task: None,
                        });
                    }
                }
                Err(_) => return Err(RemoteError::Finalized),
            }
        }
    }
}

fn serve_session(
    rank0: &Rank0<'_>,
    builder: HostWorkerBuilder,
    mut graphs: ServedGraphs,
) -> Result<(), ServeError> {
    let t = rank0.t;
    // 1. Rank 0 refuses a rank its start never reached (it failed before).
    let session = loop {
        match rank0.next()? {
            Packet::Hello { session } => {
                // Before the `Manifest`: a pong answering a ping sent once rank 0 has it
                // reports this session for as long as this rank serves it.
                t.set_serving(session);
                break session;
            }
            Packet::Refuse { session: None, reason } => {
                return Err(RemoteError::Refused { reason }.into());
            }
            other => {
                tracing::debug!(kind = ?other.kind(), "ignoring a frame before the session opened")
            }
        }
    };
    // 2.
    let mut entries: Vec<ManifestEntry> =
        graphs.entries.iter().enumerate().map(|(i, (name, _))| graph_entry(i, name)).collect();
    entries.extend(builder.chip_manifest());
    let host = t.host.clone();
    let worker = match builder.start() {
        Ok(w) => w,
        Err(e) => {
            // The session ends with this frame: one MPI does not confirm sent must be seen here
            // and told as this rank's `Left`, or rank 0 waits out its start deadline for it.
            let manifest =
                Packet::Manifest { session, host, entries, start_error: Some(e.to_string()) };
            let told = rank0.send_last(&manifest);
            if let Err(lost) = &told {
                let cause = LeftCause::from(lost);
                if let Err(send) = t.send(0, &Packet::Left { session, cause }) {
                    tracing::warn!(error = %send, "could not tell rank 0 its Manifest was lost");
                }
            }
            return Err(start_failed(e, told));
        }
    };
    t.send(0, &Packet::Manifest { session, host, entries, start_error: None })?;
    // From here rank 0 may be waiting on this rank: a failure that ends the session here is
    // told to it (`Left`) before the worker is closed.
    let left = |e: RemoteError| {
        if !t.is_stopped()
            && let Err(send) = t.send(0, &Packet::Left { session, cause: LeftCause::from(&e) })
        {
            tracing::warn!(error = %send, "could not tell rank 0 this rank left its session");
        }
        e
    };
    // A `Hello` from here on opens another session: rank 0 has given this one up (it keeps one
    // session per rank). The newer session is told that this rank leaves, so that rank 0's start
    // fails at once rather than at its deadline, and this one ends as if its `Left` were sent.
    let superseded = |newer: u64, expected: &'static [FrameKind]| {
        let e = RemoteError::Protocol {
            rank: 0,
            violation: ProtocolViolation::UnexpectedFrame { got: FrameKind::Hello, expected },
        };
        let cause = LeftCause::from(&e);
        // Confirmed, so that a lost one is at least logged: rank 0's newer start would wait out
        // its deadline for this rank's `Manifest`.
        if let Err(send) = rank0.send_last(&Packet::Left { session: newer, cause }) {
            tracing::warn!(error = %send, "could not tell rank 0's newer session this rank left");
        }
        e
    };
    // 3. (A refusal of an earlier session, left over, is skipped.)
    loop {
        let next = rank0.next().map_err(left)?;
        if let Packet::Hello { session: newer } = next {
            let e = superseded(newer, FrameKind::ANSWERS_TO_MANIFEST);
            return Err(e.into());
        }
        match answer(session, next).map_err(left)? {
            Answer::Accept => break,
            Answer::Refuse(reason) => return Err(refused(reason, worker.close())),
            Answer::Skip => tracing::debug!("skipping a refusal of another session"),
        }
    }
    // 4.
    // The later graph prepared by phase 1 of a registration: (ordinal, index in `later`).
    let mut prepared: Option<(u32, usize)> = None;
    loop {
        match rank0.next().map_err(left)? {
            Packet::Prepare { seq, ordinal, name } => {
                let ready = graphs.prepare(ordinal, &name);
                prepared = ready.as_ref().ok().map(|&k| (ordinal, k));
                let refusal = ready.err();
                t.send(0, &Packet::Prepared { seq, refusal }).map_err(left)?;
            }
            Packet::Commit { ordinal } => match prepared.take() {
                Some((o, k)) if o == ordinal => {
                    let g = graphs.later.remove(k);
                    graphs.entries.push(g);
                }
                other => tracing::warn!(ordinal, ?other, "a commit for nothing prepared"),
            },
            Packet::Abort { .. } => prepared = None,
            Packet::Task { seq, graph, config, args } => {
                let outcome = run_task(&worker, &graphs, graph, config, args);
                let frame = completion_frame(seq, outcome, worker.level(), MAX_FRAME_BYTES);
                t.send_encoded(0, frame).map_err(left)?;
            }
            // 5.
            Packet::Shutdown => {
                let closed = worker.close();
                let errors = closed.as_ref().err().map(|e| vec![e.to_string()]).unwrap_or_default();
                // Nothing more is heard from rank 0 after this: a `ShutdownDone` MPI refuses or
                // does not confirm sent must be seen here, or rank 0 may wait out its shutdown
                // budget on a rank that serves on. An unconfirmed one may still arrive.
                let done = Packet::ShutdownDone { errors };
                let told = rank0.send_last(&done);
                if let Err(unconfirmed) = &told {
                    let cause = LeftCause::ShutdownDoneLost {
                        lost: Box::new(LeftCause::from(unconfirmed)),
                        close: closed.as_ref().err().map(ToString::to_string),
                    };
                    if let Err(send) = t.send(0, &Packet::Left { session, cause }) {
                        tracing::warn!(
                            error = %send,
                            "could not tell rank 0 its ShutdownDone was not confirmed sent"
                        );
                    }
                }
                return shut_down(closed, told);
            }
            Packet::Hello { session: newer } => {
                let e = superseded(newer, FrameKind::SESSION_REQUESTS);
                return Err(e.into());
            }
            other => {
                tracing::warn!(kind = ?other.kind(), "ignoring an unexpected frame from rank 0")
            }
        }
    }
}

/// What `serve_l3` returns once the worker closed at `Shutdown` (`closed`) and its
/// `ShutdownDone` was sent to rank 0 (`told`, an error when not confirmed sent). A close error
/// comes first; a send not confirmed as well stays beside it, and is logged with it, rather
/// than replacing it.
fn shut_down(
    closed: Result<(), CloseError>,
    told: Result<(), RemoteError>,
) -> Result<(), ServeError> {
    match (closed, told) {
        (closed, Ok(())) => closed.map_err(ServeError::from),
        (Ok(()), Err(report)) => {
            tracing::error!(error = %report, "ShutdownDone to rank 0 was not confirmed sent");
            Err(report.into())
        }
        (Err(close), Err(report)) => {
            tracing::error!(
                close = %close,
                error = %report,
                "closing the L3 worker failed, and its ShutdownDone was not confirmed sent"
            );
            Err(ServeError::CloseUnreported { close: Box::new(close), report })
        }
    }
}

/// The encoded `Completion` of task `seq`; when its written bytes make it larger than `limit`,
/// a failed completion that says so instead, so that rank 0's task fails rather than waits.
fn completion_frame(seq: u64, outcome: Outcome, level: u8, limit: usize) -> Vec<u8> {
    let frame = Packet::Completion { seq, outcome }.encode();
    match check_frame(0, frame.len(), limit) {
        Ok(()) => frame,
        Err(_) => {
            let failure =
                RemoteRunFailure::ReplyTooLarge { bytes: frame.len() as u64, limit: limit as u64 };
            Packet::Completion { seq, outcome: Outcome::RunFailed { level, failure } }.encode()
        }
    }
}

/// Rank 0's answer to this rank's manifest (step 3).
#[derive(Debug, PartialEq)]
enum Answer {
    Accept,
    /// The start of this session was refused, for this reason.
    Refuse(String),
    /// A refusal of another session, left over: skipped.
    Skip,
}

/// Rank 0's frame `p`, the answer to the manifest of `session`: any other frame breaks the
/// protocol.
fn answer(session: u64, p: Packet) -> Result<Answer, RemoteError> {
    match p {
        Packet::Accept => Ok(Answer::Accept),
        Packet::Refuse { session: Some(s), reason } if s == session => Ok(Answer::Refuse(reason)),
        Packet::Refuse { .. } => Ok(Answer::Skip),
        other => Err(RemoteError::Protocol {
            rank: 0,
            violation: ProtocolViolation::UnexpectedFrame {
                got: other.kind(),
                expected: FrameKind::ANSWERS_TO_MANIFEST,
            },
        }),
    }
}

/// Runs one task as a whole L3 run over host buffers of this rank and turns its result into
/// an outcome (with the bytes its write-tagged tensors can touch, on success).
fn run_task(
    worker: &Worker,
    graphs: &ServedGraphs,
    graph: u32,
    config: CallConfig,
    args: WireArgs,
) -> Outcome {
    let level = worker.level();
    let failed = |failure| Outcome::RunFailed { level, failure };
    let Some((_, g)) = graphs.entries.get(graph as usize) else {
        return failed(RemoteRunFailure::UnknownOrdinal { ordinal: graph });
    };
    let inbound = match unpack(args) {
        Ok(a) => a,
        Err(problem) => return failed(RemoteRunFailure::Arguments(problem)),
    };
    let g = Arc::clone(g);
    let orch = Orchestration::graph(move |gb, view, cfg| g(gb, view, cfg))
        .args(inbound.args.clone())
        .config(config);
    match worker.run(orch) {
        Ok(()) => Outcome::Ok { written: inbound.written() },
        Err(WorkerError::Run(e)) => match e.run_failure().and_then(|r| r.task_failure()) {
            Some(t) => Outcome::TaskFailed { failure: (**t).clone() },
            None => {
                let kind = kind_of(e.kind());
                failed(RemoteRunFailure::Run { kind, message: text_of(&e) })
            }
        },
        Err(e) => {
            // The graph's build failed before the run began (its error went to the submit),
            // the chip is out of use, or the worker turned the run down.
            let kind = match &e {
                WorkerError::Build { .. } => RemoteRunKind::SubmissionFailed,
                WorkerError::DeviceUnusable { .. } | WorkerError::Device { .. } => {
                    RemoteRunKind::DeviceFault
                }
                _ => RemoteRunKind::Refused,
            };
            // A graph's own error is user code: its text is formatted, and the error dropped,
            // where a panic cannot end this rank's session.
            let message = text_of(&e);
            dispose(e);
            failed(RemoteRunFailure::Run { kind, message })
        }
    }
}

/// The kind a run error crosses as.
fn kind_of(kind: &RunErrorKind) -> RemoteRunKind {
    match kind {
        RunErrorKind::TaskFailed => RemoteRunKind::TaskFailed,
        RunErrorKind::EndpointFailed => RemoteRunKind::EndpointFailed,
        RunErrorKind::DeviceFault { .. } => RemoteRunKind::DeviceFault,
        RunErrorKind::Timeout { .. } => RemoteRunKind::Timeout,
        RunErrorKind::Capacity { .. } => RemoteRunKind::Capacity,
        RunErrorKind::SubmissionFailed => RemoteRunKind::SubmissionFailed,
        RunErrorKind::Aborted => RemoteRunKind::Aborted,
        RunErrorKind::CleanupFailed { .. } | RunErrorKind::CleanupInterrupted => {
            RemoteRunKind::CleanupFailed
        }
        // A wait refused as reentrant never reaches here (the serving thread waits for its own
        // run); counted as refused, like any call the worker turned down.
        RunErrorKind::Reentrant => RemoteRunKind::Refused,
        RunErrorKind::Internal => RemoteRunKind::Internal,
    }
}

/// What a serving rank whose worker failed to start returns, having `told` rank 0 or not: the
/// start's error, with the failed send beside it when rank 0 was not told.
fn start_failed(start: StartError, told: Result<(), RemoteError>) -> ServeError {
    match told {
        Ok(()) => start.into(),
        Err(report) => {
            tracing::error!(error = %start, report = %report, "the L3 worker failed to start, and the Manifest could not tell rank 0");
            ServeError::StartUnreported { start: Box::new(start), report }
        }
    }
}

/// What a serving rank refused by rank 0 returns once it `closed` the worker it started: the
/// refusal, with the close's errors beside it when there were any.
fn refused(reason: String, closed: Result<(), CloseError>) -> ServeError {
    match closed {
        Ok(()) => RemoteError::Refused { reason }.into(),
        Err(close) => ServeError::RefusedThenClose { reason, close: Box::new(close) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::frames::WrittenSpan;

    fn written(n: usize) -> Outcome {
        Outcome::Ok { written: vec![WrittenSpan { buffer: 0, offset: 0, bytes: vec![7; n] }] }
    }

    #[test]
    fn a_session_that_panics_leaves_rank_0_free_to_serve_again() {
        let (t, _wire) = crate::remote::transport::detached::rank(1, 2);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _serving = Serving::open(&t, Duration::from_secs(1)).unwrap();
            panic!("a session that panics");
        }));
        assert!(panicked.is_err());
        let again = Serving::open(&t, Duration::from_secs(1));
        assert!(again.is_ok(), "{:?}", again.err());
    }

    #[test]
    fn a_graph_error_whose_text_cannot_be_formatted_fails_its_task_only() {
        #[derive(Debug)]
        struct Unprintable;
        impl std::fmt::Display for Unprintable {
            fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                Err(std::fmt::Error)
            }
        }
        impl std::error::Error for Unprintable {}
        let worker = crate::Worker::host(
            simpler_device_a2a3::Platform::A2a3Sim,
            simpler_device_a2a3::RuntimeVariant::HostBuildGraph,
        )
        .chips(&[0])
        .start()
        .unwrap();
        let mut graphs = ServedGraphs::new();
        graphs.register("unprintable", |_, _, _| Err(Box::new(Unprintable)));
        match run_task(&worker, &graphs, 0, CallConfig::default(), WireArgs::default()) {
            Outcome::RunFailed {
                failure: RemoteRunFailure::Run { kind: RemoteRunKind::SubmissionFailed, message },
                ..
            } => assert!(message.contains("could not be formatted"), "{message}"),
            other => panic!("a graph whose error cannot be printed gave {other:?}"),
        }
        // The worker still serves.
        graphs.register("fine", |_, _, _| Ok(()));
        let ok = run_task(&worker, &graphs, 1, CallConfig::default(), WireArgs::default());
        assert!(matches!(ok, Outcome::Ok { .. }), "{ok:?}");
        worker.close().unwrap();
    }

    #[test]
    fn a_completion_too_large_for_one_frame_comes_back_as_a_failed_run() {
        let small = completion_frame(5, written(16), 3, 1024);
        assert!(matches!(
            Packet::decode(&small),
            Ok(Packet::Completion { seq: 5, outcome: Outcome::Ok { .. } })
        ));
        let large = completion_frame(6, written(4096), 3, 1024);
        match Packet::decode(&large) {
            Ok(Packet::Completion {
                seq: 6,
                outcome:
                    Outcome::RunFailed {
                        level: 3,
                        failure: RemoteRunFailure::ReplyTooLarge { bytes, limit: 1024 },
                    },
            }) => assert!(bytes > 1024, "{bytes}"),
            other => panic!("{other:?}"),
        }
        assert!(large.len() <= 1024);
    }

    #[test]
    fn a_frame_other_than_accept_or_refuse_after_the_manifest_names_its_kind() {
        assert_eq!(answer(3, Packet::Accept), Ok(Answer::Accept));
        let refuse = |session| Packet::Refuse { session, reason: "r".to_owned() };
        assert_eq!(answer(3, refuse(Some(3))), Ok(Answer::Refuse("r".to_owned())));
        assert_eq!(answer(3, refuse(Some(2))), Ok(Answer::Skip));
        assert_eq!(answer(3, refuse(None)), Ok(Answer::Skip));
        let e = answer(3, Packet::Commit { ordinal: 1 }).unwrap_err();
        match &e {
            RemoteError::Protocol {
                rank: 0,
                violation: ProtocolViolation::UnexpectedFrame { got: FrameKind::Commit, expected },
            } => assert_eq!(*expected, [FrameKind::Accept, FrameKind::Refuse]),
            other => panic!("a Commit in answer to the manifest gave {other:?}"),
        }
        assert_eq!(
            e.to_string(),
            "protocol error with rank 0: expected Accept or Refuse, got Commit"
        );
    }

    #[test]
    fn a_close_error_that_could_not_reach_rank_0_is_returned_with_the_failed_send_beside_it() {
        let close = || CloseError {
            teardown: vec![crate::error::TeardownError {
                path: "L3".to_owned(),
                what: crate::TeardownPart::Chip(simpler_types::WorkerId(0)),
                cause: crate::TeardownCause::Unwound,
            }],
            ..CloseError::default()
        };
        match shut_down(Err(close()), Err(RemoteError::Finalized)) {
            Err(ServeError::CloseUnreported { close, report: RemoteError::Finalized }) => {
                assert!(matches!(close.teardown[0].cause, crate::TeardownCause::Unwound));
            }
            other => panic!("a close error whose ShutdownDone was lost gave {other:?}"),
        }
        let text = shut_down(Err(close()), Err(RemoteError::Finalized)).unwrap_err().to_string();
        assert!(text.starts_with(&close().to_string()), "the close error comes first: {text}");
        assert!(text.contains(&RemoteError::Finalized.to_string()), "{text}");
        // Only one of them failed: that one, as before.
        assert!(matches!(shut_down(Err(close()), Ok(())), Err(ServeError::Close(_))));
        assert!(matches!(
            shut_down(Ok(()), Err(RemoteError::Finalized)),
            Err(ServeError::Remote(RemoteError::Finalized))
        ));
        assert!(shut_down(Ok(()), Ok(())).is_ok());
    }

    #[test]
    fn a_failed_start_whose_manifest_is_not_confirmed_sent_is_unreported_and_told_as_left() {
        // The start fails; MPI never confirms the `Manifest` that says so (the detached wire
        // drops its receipt). Rank 0 must hear `Left` instead of waiting out its start deadline,
        // and the rank's error must not claim rank 0 was told.
        let (t, wire) = crate::remote::transport::detached::rank(1, 2);
        let inbox = t.open_inbox(0).unwrap();
        let rank0 = Rank0 { t: &t, inbox: &inbox, liveness: Duration::from_secs(10) };
        wire.answer(0, &Packet::Hello { session: 7 });
        let rank0_side = std::thread::spawn(move || {
            let mut frames = Vec::new();
            while frames.len() < 2
                && let Some((_, p)) = wire.sent(Duration::from_secs(5))
            {
                frames.push(p);
            }
            frames
        });
        // Too many sub workers: the L3 worker cannot start.
        let builder = crate::Worker::host(
            simpler_device_a2a3::Platform::A2a3Sim,
            simpler_device_a2a3::RuntimeVariant::HostBuildGraph,
        )
        .sub_workers(crate::MAX_SUB_WORKERS + 1);
        let served = serve_session(&rank0, builder, ServedGraphs::default());
        assert!(matches!(served, Err(ServeError::StartUnreported { .. })), "{served:?}");
        let frames = rank0_side.join().unwrap();
        assert!(matches!(frames.first(), Some(Packet::Manifest { session: 7, .. })), "{frames:?}");
        assert!(
            matches!(frames.get(1), Some(Packet::Left { session: 7, .. })),
            "no Left after the lost Manifest: {frames:?}"
        );
        t.close_inbox(0, &inbox);
    }

    #[test]
    fn a_start_failure_or_a_refusal_is_returned_whatever_comes_after_it() {
        let start = || StartError {
            path: "L3".to_owned(),
            cause: crate::error::StartCause::Config(crate::error::ConfigError::NoChips),
            rollback: Vec::new(),
        };
        match start_failed(start(), Err(RemoteError::Finalized)) {
            ServeError::StartUnreported { start, report: RemoteError::Finalized } => {
                assert!(start.to_string().contains("no chips"), "{start}");
            }
            other => panic!("a start failure whose Manifest was lost gave {other:?}"),
        }
        assert!(matches!(start_failed(start(), Ok(())), ServeError::Start(_)));
        let thread = crate::Leaked::DeviceThread("t".to_owned());
        let leak = crate::Leak::new(crate::TeardownPart::Chip(simpler_types::WorkerId(0)), thread);
        let close = CloseError { leaked: vec![leak.clone()], ..CloseError::default() };
        match refused("a duplicate host".to_owned(), Err(close)) {
            ServeError::RefusedThenClose { reason, close } => {
                assert_eq!(reason, "a duplicate host");
                assert_eq!(close.leaked, [leak]);
            }
            other => panic!("a refusal whose close failed gave {other:?}"),
        }
        assert!(matches!(
            refused("r".to_owned(), Ok(())),
            ServeError::Remote(RemoteError::Refused { .. })
        ));
    }
}
