//! The one thread per rank that calls MPI (funneled threading), and the channels through which
//! every other thread reaches it (`docs/multi-host.md` §"The MPI thread").
//!
//! 1. `Transport::init` starts the thread `simpler-mpi`; it initializes MPI with
//!    `MPI_THREAD_FUNNELED`, sets the errors-return handler on its communicators (so an MPI
//!    error becomes a code, not an abort), duplicates the world communicator into a health
//!    communicator and reports rank, size and host back.
//! 2. Its loop, until `Finalize`: send what the command channel holds; receive every frame
//!    that arrived on the data communicator and hand its bytes, undecoded, to the inbox of its
//!    source rank (a frame for a rank with no open inbox waits in that rank's backlog, up to
//!    `MAX_BACKLOG` frames and `MAX_BACKLOG_BYTES` bytes, until an inbox opens: the peer may be
//!    faster than this rank); the thread that takes a frame from the inbox decodes it, so
//!    that a frame of gigabytes is copied out on that thread, never on this one;
//!    answer every `Ping` on the health communicator with a `Pong`; ping every watched rank
//!    once per its interval. Any frame from a rank refreshes that rank's `last_heard`.
//! 3. It never waits for a send: sends are started and polled (`sends.rs`), so a peer that
//!    does not receive for a while (a stalled host) delays only the frames to it, never the
//!    frames from the other ranks. A rank with a ping or pong still on its way gets no new one.
//!    Nor does it wait for a receive: the receive of a frame that has arrived (a matched
//!    probe) is started and polled (`receives.rs`), and each rank's frames are routed in the
//!    order they arrived, so a large frame from one rank, however slow its bytes, delays no
//!    ping or pong and no frame from another rank. The health communicator's frames are a few
//!    bytes and are received at once, into a buffer of the longest one's size: a longer frame
//!    is cut there, refused and counted as lost (`HealthFrameTooLarge`). While a data frame
//!    being sent or received may still be moving (`Request::hot`) the loop never parks, but
//!    yields between polls when nothing moved; otherwise (idle, or a frame stuck behind a
//!    stalled peer) it yields for a short while, then parks on the command channel with a
//!    timeout that grows to 1 ms.
//! 4. Leaving the loop, it gives the frames still being sent or received a short grace to
//!    complete (a `Shutdown` reply, say), then frees their requests.
//! 5. `Finalize` (from `MpiJob::finalize` or its drop) leaves the loop and finalizes MPI on
//!    the same thread; the caller joins it.
//!
//! Liveness is judged by the waiting threads, not here: a waiter compares `last_heard` of its
//! rank with its budget.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mpi::Threading;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::Source;
use parking_lot::Mutex;

use super::error::{InitError, RemoteError, ThreadingLevel};
use super::frames::{FrameKind, Packet};
use super::receives::{Arriving, receive_health};
use super::sends::{InFlight, Receipt, settle};

mod inbox;

pub(crate) use inbox::InboxRx;
use inbox::{Arrived, Backlog, Inbox, route};

/// After the last activity the thread yields (stays hot) for this long before parking.
const HOT_SPELL: Duration = Duration::from_millis(2);
/// The longest park of an idle MPI thread.
const MAX_PARK: Duration = Duration::from_millis(1);
/// The errors of lost frames kept per rank beside the first one's.
const KEPT_LOSSES: usize = 16;
/// Tag of every frame (communicators keep data and health apart, not tags).
const TAG: i32 = 1;

/// How long a leaving MPI thread waits for the frames it is still sending or receiving.
const LEAVE_GRACE: Duration = Duration::from_millis(500);

/// The largest frame: an MPI message's element count is a C `int`.
pub(crate) const MAX_FRAME_BYTES: usize = i32::MAX as usize;

/// Refuses a frame of `bytes` for `rank` when it is larger than `limit`.
pub(crate) fn check_frame(rank: i32, bytes: usize, limit: usize) -> Result<(), RemoteError> {
    if bytes > limit { Err(RemoteError::FrameTooLarge { rank, bytes, limit }) } else { Ok(()) }
}

/// What other threads ask of the MPI thread.
enum Command {
    Send {
        to: i32,
        health: bool,
        bytes: Vec<u8>,
        /// The opening of the destination's inbox when the frame was queued.
        opening: u64,
        /// Told whether MPI sent the frame, when the sender waits for it.
        receipt: Option<Receipt>,
    },
    /// Stop answering anything for a while (a liveness drill).
    Stall(Duration),
    /// Start the next data frame's send, then stall (a drill: a host hanging part way
    /// through sending a frame).
    StallAfterNextSend(Duration),
    /// Corrupt the next data frame so that it does not decode (a drill: a frame damaged on
    /// its way, or from a peer of another frame version).
    CorruptNextSend,
    /// Refuse the next data frame of this kind as MPI refuses a send (a drill: a frame lost
    /// on its way out).
    RefuseNextSendOf(FrameKind),
    Finalize,
}

/// State shared between the MPI thread and the threads that use it.
///
/// Writers and readers: `last_heard` and `ping_every` are written by the MPI thread (heard)
/// and by `watch`/`unwatch` (any thread), read by both; `inboxes` is locked briefly by the
/// MPI thread to route a frame and by sessions opening or closing their inbox.
struct Shared {
    epoch: Instant,
    /// Per rank: nanoseconds since `epoch` when a frame last arrived from it.
    last_heard: Vec<AtomicU64>,
    /// Per rank: ping interval in nanoseconds; 0 = not watched.
    ping_every: Vec<AtomicU64>,
    inboxes: Mutex<Vec<Inbox>>,
    /// Per rank: the frames lost since its session opened, ones from it that did not decode
    /// or ones to it that MPI refused. Which task's frame it was is unknown, so every wait on
    /// that rank fails with the first lost since its request rather than waiting for a reply
    /// that will not come.
    lost: Mutex<Vec<Lost>>,
    /// Set by the MPI thread when it leaves its loop (finalized or failed).
    stopped: AtomicBool,
    /// The session this rank serves (0: none), which its pongs report.
    serving: AtomicU64,
    /// The nonce of the latest ping the MPI thread sent (to any rank; nonces only grow).
    pings_sent: AtomicU64,
    /// Per rank: the nonce and reported session of the latest pong from it.
    pongs: Mutex<Vec<(u64, u64)>>,
}

impl Shared {
    fn new(size: i32) -> Shared {
        let per_rank = 0..size.max(0);
        Shared {
            epoch: Instant::now(),
            last_heard: per_rank.clone().map(|_| AtomicU64::new(0)).collect(),
            ping_every: per_rank.clone().map(|_| AtomicU64::new(0)).collect(),
            inboxes: Mutex::new(
                per_rank.clone().map(|_| Inbox::Closed(Default::default())).collect(),
            ),
            lost: Mutex::new(per_rank.clone().map(|_| Lost::default()).collect()),
            stopped: AtomicBool::new(false),
            serving: AtomicU64::new(0),
            pings_sent: AtomicU64::new(0),
            pongs: Mutex::new(per_rank.map(|_| (0, 0)).collect()),
        }
    }

    /// Records a pong from `rank` answering ping `nonce` while it served `session`.
    fn record_pong(&self, rank: i32, nonce: u64, session: u64) {
        let mut pongs = self.pongs.lock();
        if let Some(p) = usize::try_from(rank).ok().and_then(|r| pongs.get_mut(r))
            && nonce > p.0
        {
            *p = (nonce, session);
        }
    }

    fn now_nanos(&self) -> u64 {
        self.epoch.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
    }

    /// The error of the first frame lost to or from `rank` after the `before`-th since its
    /// session opened (see [`Lost::since`]).
    fn lost_since(&self, rank: i32, before: u64) -> Option<RemoteError> {
        let lost = self.lost.lock();
        lost.get(usize::try_from(rank).ok()?)?.since(before)
    }

    /// How many frames to or from `rank` were lost since its session opened.
    fn lost_count(&self, rank: i32) -> u64 {
        let lost = self.lost.lock();
        usize::try_from(rank).ok().and_then(|r| lost.get(r)).map_or(0, |l| l.count)
    }

    /// The error of the first frame lost to or from `rank` since its session opened.
    fn lost_frame(&self, rank: i32) -> Option<RemoteError> {
        self.lost_since(rank, 0)
    }

    /// Records `e` as a frame lost to or from `rank`: one received, or one sent under the
    /// inbox's `opening` (a send of an ended session's is only logged).
    fn lose_frame(&self, rank: i32, opening: Option<u64>, e: RemoteError) {
        let mut lost = self.lost.lock();
        if let Some(l) = usize::try_from(rank).ok().and_then(|r| lost.get_mut(r)) {
            if opening.is_some_and(|o| o != l.opening) {
                tracing::debug!(rank, error = %e, "a frame of an ended session was lost");
                return;
            }
            l.record(e);
        }
    }

    /// The current opening of `rank`'s inbox, which a send queued now belongs to.
    fn opening(&self, rank: i32) -> u64 {
        let lost = self.lost.lock();
        usize::try_from(rank).ok().and_then(|r| lost.get(r)).map_or(0, |l| l.opening)
    }
}

/// The frames lost to or from one rank since its session opened.
#[derive(Default)]
struct Lost {
    /// Which opening of the rank's inbox this record belongs to: a send queued under an earlier
    /// one whose loss MPI reports only now concerns a session that has ended (a serving rank's
    /// `Left` refused after its session returned, say) and is not recorded here.
    opening: u64,
    /// The first one's error.
    first: Option<RemoteError>,
    /// The errors of the latest [`KEPT_LOSSES`], each with its number (the first is 1), oldest
    /// first.
    latest: std::collections::VecDeque<(u64, RemoteError)>,
    count: u64,
}

impl Lost {
    fn record(&mut self, e: RemoteError) {
        self.count += 1;
        if self.first.is_none() {
            self.first = Some(e.clone());
        }
        if self.latest.len() == KEPT_LOSSES {
            self.latest.pop_front();
        }
        self.latest.push_back((self.count, e));
    }

    /// The error of the first frame lost after the `before`-th, the one that concerns a wait
    /// whose request went out when `before` were lost; when more were lost since than are
    /// kept, the earliest kept. `None` while no more than `before` were lost.
    fn since(&self, before: u64) -> Option<RemoteError> {
        if self.count <= before {
            return None;
        }
        if before == 0 {
            return self.first.clone();
        }
        self.latest.iter().find(|(n, _)| *n > before).map(|(_, e)| e.clone())
    }
}

/// This rank's handle on the MPI thread.
pub(crate) struct Transport {
    shared: std::sync::Arc<Shared>,
    cmd: Mutex<Sender<Command>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Task sequence numbers, unique over the job so a late reply never matches a new task.
    next_seq: AtomicU64,
    pub(crate) rank: i32,
    pub(crate) size: i32,
    pub(crate) host: String,
}

/// What the MPI thread reports once initialized.
struct Ready {
    rank: i32,
    size: i32,
    host: String,
}

impl Transport {
    /// Starts the MPI thread and initializes MPI on it (step 1).
    pub(crate) fn init() -> Result<Transport, RemoteError> {
        let (cmd_tx, cmd_rx) = mpsc::channel::<Command>();
        let (ready_tx, ready_rx) =
            mpsc::channel::<Result<(Ready, std::sync::Arc<Shared>), RemoteError>>();
        let thread = std::thread::Builder::new()
            .name("simpler-mpi".to_owned())
            .spawn(move || mpi_thread(cmd_rx, ready_tx))
            .map_err(|e| InitError::spawn(&e))?;
        let (ready, shared) = match ready_rx.recv() {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(InitError::ThreadEnded.into());
            }
        };
        Ok(Transport {
            shared,
            cmd: Mutex::new(cmd_tx),
            thread: Mutex::new(Some(thread)),
            next_seq: AtomicU64::new(1),
            rank: ready.rank,
            size: ready.size,
            host: ready.host,
        })
    }

    /// A task sequence number never used before in this process.
    pub(crate) fn next_seq(&self) -> u64 {
        // Relaxed: uniqueness needs only atomicity.
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues `packet` for rank `to` on the data communicator.
    pub(crate) fn send(&self, to: i32, packet: &Packet) -> Result<(), RemoteError> {
        self.send_encoded(to, packet.encode())
    }

    /// Queues an encoded frame for rank `to`; a frame one MPI message cannot carry is refused
    /// here, on the caller's thread, rather than failing inside the MPI thread.
    pub(crate) fn send_encoded(&self, to: i32, bytes: Vec<u8>) -> Result<(), RemoteError> {
        check_frame(to, bytes.len(), MAX_FRAME_BYTES)?;
        let opening = self.shared.opening(to);
        self.command(Command::Send { to, health: false, bytes, opening, receipt: None })
    }

    /// Sends `packet` to rank `to` and waits, at most `within`, until MPI has sent it: for a
    /// frame after which the sender stops listening, so that a loss is seen by the sender
    /// rather than only logged by the MPI thread.
    pub(crate) fn send_confirmed(
        &self,
        to: i32,
        packet: &Packet,
        within: Duration,
    ) -> Result<(), RemoteError> {
        let bytes = packet.encode();
        check_frame(to, bytes.len(), MAX_FRAME_BYTES)?;
        let (tx, rx) = mpsc::channel();
        let opening = self.shared.opening(to);
        self.command(Command::Send { to, health: false, bytes, opening, receipt: Some(tx) })?;
        match rx.recv_timeout(within) {
            Ok(sent) => sent,
            Err(RecvTimeoutError::Timeout) => {
                Err(RemoteError::SendUnconfirmed { rank: to, frame: packet.kind(), waited: within })
            }
            // The MPI thread left and gave the frame up.
            Err(RecvTimeoutError::Disconnected) => Err(RemoteError::Finalized),
        }
    }

    fn command(&self, c: Command) -> Result<(), RemoteError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(RemoteError::Finalized);
        }
        self.cmd.lock().send(c).map_err(|_| RemoteError::Finalized)
    }

    /// Opens the inbox for frames from `rank`; at most one per rank.
    pub(crate) fn open_inbox(&self, rank: i32) -> Result<InboxRx, RemoteError> {
        let mut inboxes = self.shared.inboxes.lock();
        let slot = inboxes
            .get_mut(rank as usize)
            .ok_or(RemoteError::NoSuchRank { rank, size: self.size })?;
        let Inbox::Closed(backlog) = slot else {
            return Err(RemoteError::RankInUse { rank });
        };
        let (tx, rx) = mpsc::channel();
        for bytes in std::mem::take(backlog).frames {
            // The receiver is alive: it is returned below.
            let _ = tx.send(Arrived { early: true, bytes });
        }
        *slot = Inbox::Open(tx);
        if let Some(lost) = self.shared.lost.lock().get_mut(rank as usize) {
            *lost = Lost { opening: lost.opening.wrapping_add(1), ..Lost::default() };
        }
        Ok(InboxRx { rx, rank, shared: std::sync::Arc::clone(&self.shared) })
    }

    /// Closes the inbox of `rank`: frames `rx` has not handed out yet, and later ones, wait
    /// in the rank's backlog for the next session (which skips what it does not expect).
    pub(crate) fn close_inbox(&self, rank: i32, rx: &InboxRx) {
        // Under the lock the MPI thread cannot route into `rx`, so nothing is lost between
        // draining it and closing the slot.
        let mut inboxes = self.shared.inboxes.lock();
        if let Some(slot) = inboxes.get_mut(rank as usize) {
            let mut backlog = Backlog::default();
            for frame in rx.rx.try_iter() {
                backlog.push(rank, frame.bytes);
            }
            *slot = Inbox::Closed(backlog);
        }
    }

    /// Starts pinging `rank` every `interval` and counts it as heard now.
    pub(crate) fn watch(&self, rank: i32, interval: Duration) {
        let now = self.shared.now_nanos();
        if let (Some(h), Some(p)) =
            (self.shared.last_heard.get(rank as usize), self.shared.ping_every.get(rank as usize))
        {
            h.store(now, Ordering::Release);
            let nanos = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX).max(1);
            p.store(nanos, Ordering::Release);
        }
    }

    /// Stops pinging `rank`.
    pub(crate) fn unwatch(&self, rank: i32) {
        if let Some(p) = self.shared.ping_every.get(rank as usize) {
            p.store(0, Ordering::Release);
        }
    }

    /// How long ago a frame last arrived from `rank`.
    pub(crate) fn silent_for(&self, rank: i32) -> Duration {
        let heard =
            self.shared.last_heard.get(rank as usize).map_or(0, |h| h.load(Ordering::Acquire));
        Duration::from_nanos(self.shared.now_nanos().saturating_sub(heard))
    }

    /// The error of the first frame lost to or from `rank` since its inbox opened (one that
    /// did not decode, or a send MPI refused): a wait on `rank` fails with it.
    pub(crate) fn lost_frame(&self, rank: i32) -> Option<RemoteError> {
        self.shared.lost_frame(rank)
    }

    /// The error of the first frame lost to or from `rank` after the `before`-th since its
    /// inbox opened: a wait whose request went out when `before` were lost fails with the
    /// loss that may concern it, not with an earlier one.
    pub(crate) fn lost_since(&self, rank: i32, before: u64) -> Option<RemoteError> {
        self.shared.lost_since(rank, before)
    }

    /// How many frames to or from `rank` were lost since its inbox opened.
    pub(crate) fn lost_count(&self, rank: i32) -> u64 {
        self.shared.lost_count(rank)
    }

    /// Whether the MPI thread has left its loop.
    pub(crate) fn is_stopped(&self) -> bool {
        self.shared.stopped.load(Ordering::Acquire)
    }

    /// Sets the session this rank serves (0: none), which its pongs report from now on.
    pub(crate) fn set_serving(&self, session: u64) {
        // Release, before the `Manifest` is queued: the MPI thread, which sends that frame after
        // taking it from the queue, reads this session when it answers any later ping.
        self.shared.serving.store(session, Ordering::Release);
    }

    /// The nonce of the latest ping sent so far: a pong answering a later one answers a ping
    /// sent after this call (`docs/multi-host.md`, "Liveness").
    pub(crate) fn pings_sent(&self) -> u64 {
        self.shared.pings_sent.load(Ordering::Acquire)
    }

    /// The session `rank` reported serving in its latest pong, if that pong answered a ping
    /// sent after `pings_sent` returned `mark`.
    pub(crate) fn serving_after(&self, rank: i32, mark: u64) -> Option<u64> {
        let pongs = self.shared.pongs.lock();
        let &(nonce, session) = pongs.get(usize::try_from(rank).ok()?)?;
        (nonce > mark).then_some(session)
    }

    /// Makes the MPI thread answer nothing for `d` (liveness drills and tests).
    pub(crate) fn stall(&self, d: Duration) -> Result<(), RemoteError> {
        self.command(Command::Stall(d))
    }

    /// Makes the MPI thread start sending the next data frame and then answer nothing for `d`.
    pub(crate) fn stall_after_next_send(&self, d: Duration) -> Result<(), RemoteError> {
        self.command(Command::StallAfterNextSend(d))
    }

    /// Makes the MPI thread send the next data frame with its version bytes inverted.
    pub(crate) fn corrupt_next_send(&self) -> Result<(), RemoteError> {
        self.command(Command::CorruptNextSend)
    }

    /// Sends `to` a health frame of `bytes` bytes, none of them a valid frame (a drill).
    pub(crate) fn send_health_bytes(&self, to: i32, bytes: usize) -> Result<(), RemoteError> {
        let (bytes, opening) = (vec![0xa5; bytes], self.shared.opening(to));
        self.command(Command::Send { to, health: true, bytes, opening, receipt: None })
    }

    /// Makes the MPI thread refuse the next data frame of `kind` as MPI refuses a send.
    pub(crate) fn refuse_next_send_of(&self, kind: FrameKind) -> Result<(), RemoteError> {
        self.command(Command::RefuseNextSendOf(kind))
    }

    /// Finalizes MPI (step 4) and joins the thread; a second call does nothing.
    pub(crate) fn finalize(&self) -> Result<(), RemoteError> {
        let Some(thread) = self.thread.lock().take() else { return Ok(()) };
        // A send error means the thread already left its loop; joining is still right.
        let _ = self.cmd.lock().send(Command::Finalize);
        thread.join().map_err(|_| RemoteError::ThreadPanicked)
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        if let Err(e) = self.finalize() {
            tracing::error!(error = %e, "finalizing MPI failed");
        }
    }
}

/// Sets MPI_ERRORS_RETURN on `comm`, so MPI reports errors on it as codes.
#[allow(unsafe_code)]
fn errors_return(comm: &SimpleCommunicator) -> Result<(), RemoteError> {
    use mpi::raw::AsRaw;
    // SAFETY: `comm` is a live communicator of an initialized MPI (the caller holds the
    // universe), and RSMPI_ERRORS_RETURN is a predefined error handler, valid after init.
    let code =
        unsafe { mpi::ffi::MPI_Comm_set_errhandler(comm.as_raw(), mpi::ffi::RSMPI_ERRORS_RETURN) };
    if code == 0 { Ok(()) } else { Err(RemoteError::Mpi { op: "MPI_Comm_set_errhandler", code }) }
}

type ReadyTx = Sender<Result<(Ready, std::sync::Arc<Shared>), RemoteError>>;

fn mpi_thread(cmd_rx: Receiver<Command>, ready_tx: ReadyTx) {
    let Some((universe, provided)) = mpi::initialize_with_threading(Threading::Funneled) else {
        let _ = ready_tx.send(Err(InitError::AlreadyInitialized.into()));
        return;
    };
    if provided < Threading::Funneled {
        let required = ThreadingLevel::Funneled;
        let e = InitError::Threading { provided: threading_level(provided), required };
        let _ = ready_tx.send(Err(e.into()));
        return;
    }
    let world = universe.world();
    if let Err(e) = errors_return(&world) {
        let _ = ready_tx.send(Err(e));
        return;
    }
    let health = world.duplicate();
    if let Err(e) = errors_return(&health) {
        let _ = ready_tx.send(Err(e));
        return;
    }
    let size = world.size();
    let shared = std::sync::Arc::new(Shared::new(size));
    let host = mpi::environment::processor_name().unwrap_or_else(|_| "unknown host".to_owned());
    let ready = Ready { rank: world.rank(), size, host };
    if ready_tx.send(Ok((ready, std::sync::Arc::clone(&shared)))).is_err() {
        return;
    }
    // Set however the loop ends (a panic included), so that no caller waits on a thread that
    // will never route another frame.
    let stopped = StopOnExit(&shared);
    serve_loop(&world, &health, &shared, &cmd_rx);
    drop(stopped);
    // Dropping the communicators and then the universe finalizes MPI on this thread.
    drop(health);
    drop(world);
    drop(universe);
}

/// The level of thread support `t` names.
fn threading_level(t: Threading) -> ThreadingLevel {
    match t {
        Threading::Single => ThreadingLevel::Single,
        Threading::Funneled => ThreadingLevel::Funneled,
        Threading::Serialized => ThreadingLevel::Serialized,
        Threading::Multiple => ThreadingLevel::Multiple,
    }
}

/// Marks the transport stopped when dropped.
struct StopOnExit<'a>(&'a Shared);

impl Drop for StopOnExit<'_> {
    fn drop(&mut self) {
        self.0.stopped.store(true, Ordering::Release);
    }
}

/// Step 2 and 3 of the module protocol.
fn serve_loop(
    world: &SimpleCommunicator,
    health: &SimpleCommunicator,
    shared: &Shared,
    cmd_rx: &Receiver<Command>,
) {
    let size = world.size();
    let mut next_ping: Vec<u64> = vec![0; size as usize];
    let mut nonce = 0u64;
    let mut last_activity = Instant::now();
    let mut sending: Vec<InFlight> = Vec::new();
    let mut receiving: Vec<Arriving> = Vec::new();
    let mut drills = Drills::default();
    loop {
        let mut busy = poll_sends(shared, &mut sending);
        let mut pending = Vec::new();
        while let Ok(c) = cmd_rx.try_recv() {
            pending.push(c);
        }
        for c in pending {
            busy = true;
            if !run_command(world, health, shared, &mut sending, &mut drills, c) {
                return drain(shared, &mut sending, &mut receiving);
            }
        }
        while let Some(probed) = world.any_process().immediate_matched_probe() {
            busy = true;
            let from = probed.1.source_rank();
            heard(shared, from);
            match Arriving::start(probed) {
                Ok(frame) => receiving.push(frame),
                Err(e) => lose(shared, from, Way::In, e),
            }
        }
        busy |= poll_receives(shared, &mut receiving);
        while let Some(probed) = health.any_process().immediate_matched_probe() {
            busy = true;
            let from = probed.1.source_rank();
            heard(shared, from);
            let (buf, len) = match receive_health(probed) {
                Ok(frame) => frame,
                Err(e) => {
                    lose(shared, from, Way::In, e);
                    continue;
                }
            };
            match Packet::decode(&buf[..len]) {
                Ok(Packet::Ping { nonce }) if !health_frame_on_its_way(&sending, from) => {
                    // A lost pong only delays hearing from this rank; liveness judges that.
                    let session = shared.serving.load(Ordering::Acquire);
                    let pong = Packet::Pong { nonce, session }.encode();
                    if let Ok(f) = InFlight::start(health, from, true, TAG, pong) {
                        sending.push(f);
                    }
                }
                Ok(Packet::Pong { nonce, session }) => shared.record_pong(from, nonce, session),
                _ => {}
            }
        }
        let now = shared.now_nanos();
        for r in 0..size {
            let every = shared.ping_every[r as usize].load(Ordering::Acquire);
            // A schedule longer than the interval is an earlier session's (a watch with a
            // shorter budget): the next ping is due now, not when that one said.
            let due =
                now >= next_ping[r as usize] || next_ping[r as usize] > now.saturating_add(every);
            if every != 0 && due && !health_frame_on_its_way(&sending, r) {
                nonce += 1;
                // Release, before the ping leaves: a caller that read an earlier nonce read it
                // before this ping was sent.
                shared.pings_sent.store(nonce, Ordering::Release);
                let ping = Packet::Ping { nonce }.encode();
                if let Ok(f) = InFlight::start(health, r, true, TAG, ping) {
                    sending.push(f);
                }
                next_ping[r as usize] = now.saturating_add(every);
            }
        }
        if busy {
            last_activity = Instant::now();
            continue;
        }
        // A data frame still on its way keeps the loop from parking while it may be moving,
        // as some transports move its bytes only inside MPI calls; it yields between polls.
        // One on its way for longer is stuck behind a stalled peer: the loop parks between
        // polls (below) rather than spin for as long as the peer stays stalled.
        let now = Instant::now();
        if sending.iter().any(|f| !f.health && f.hot(now)) || receiving.iter().any(|f| f.hot(now)) {
            std::thread::yield_now();
            continue;
        }
        let idle = last_activity.elapsed();
        if idle < HOT_SPELL {
            std::thread::yield_now();
            continue;
        }
        // Park on the command channel; frames from other ranks are seen at the next wake.
        let park = (idle / 64).clamp(Duration::from_micros(50), MAX_PARK);
        match cmd_rx.recv_timeout(park) {
            Ok(c) => {
                last_activity = Instant::now();
                if !run_command(world, health, shared, &mut sending, &mut drills, c) {
                    return drain(shared, &mut sending, &mut receiving);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return drain(shared, &mut sending, &mut receiving);
            }
        }
    }
}

/// Whether a ping or pong to `rank` is still being sent.
fn health_frame_on_its_way(sending: &[InFlight], rank: i32) -> bool {
    sending.iter().any(|f| f.health && f.to == rank)
}

/// Drops the sends MPI has completed; a data frame MPI failed is recorded as lost. Returns
/// whether any completed.
fn poll_sends(shared: &Shared, sending: &mut Vec<InFlight>) -> bool {
    let before = sending.len();
    sending.retain_mut(|f| match f.done() {
        Ok(done) => !done,
        Err(e) => {
            if !f.health {
                lose(shared, f.to, Way::Out(f.opening), e);
            }
            false
        }
    });
    sending.len() < before
}

/// Routes the frames MPI has received, each rank's in the order they were matched (a frame
/// whose receive completed waits behind an earlier one from its rank); a receive MPI failed is
/// a lost frame. Returns whether any completed.
fn poll_receives(shared: &Shared, receiving: &mut Vec<Arriving>) -> bool {
    let before = receiving.len();
    let mut waiting: Vec<i32> = Vec::new();
    receiving.retain_mut(|f| {
        if waiting.contains(&f.from) {
            return true;
        }
        match f.poll() {
            Ok(Some(bytes)) => {
                heard(shared, f.from);
                route(shared, f.from, bytes);
                false
            }
            Ok(None) => {
                waiting.push(f.from);
                true
            }
            Err(e) => {
                lose(shared, f.from, Way::In, e);
                false
            }
        }
    });
    receiving.len() < before
}

/// Which way a lost frame was going.
#[derive(Clone, Copy)]
enum Way {
    /// To the rank: MPI refused or failed its send, queued under this opening of the rank's
    /// inbox.
    Out(u64),
    /// From the rank: MPI failed its receive.
    In,
}

/// Logs a data frame to or from `rank` that MPI lost and records it, so that the waits on that
/// rank fail with `e` instead of waiting for a reply that will not come.
fn lose(shared: &Shared, rank: i32, way: Way, e: RemoteError) {
    let opening = match way {
        Way::Out(opening) => {
            tracing::error!(rank, error = %e, "a frame could not be sent");
            Some(opening)
        }
        Way::In => {
            tracing::error!(rank, error = %e, "a frame could not be received");
            None
        }
    };
    shared.lose_frame(rank, opening, e);
}

/// Gives the frames still being sent or received [`LEAVE_GRACE`] to complete (a received one
/// is routed as usual); the rest are given up.
fn drain(shared: &Shared, sending: &mut Vec<InFlight>, receiving: &mut Vec<Arriving>) {
    let until = Instant::now() + LEAVE_GRACE;
    while !(sending.is_empty() && receiving.is_empty()) && Instant::now() < until {
        poll_sends(shared, sending);
        poll_receives(shared, receiving);
        std::thread::yield_now();
    }
    if !(sending.is_empty() && receiving.is_empty()) {
        tracing::warn!(
            sending = sending.len(),
            receiving = receiving.len(),
            "leaving with frames still on their way"
        );
    }
    sending.clear();
    receiving.clear();
}

/// Drills armed for the next data frame this rank sends.
#[derive(Default)]
struct Drills {
    stall_after_send: Option<Duration>,
    corrupt_next_send: bool,
    /// Kinds whose next data frame is refused, one frame each.
    refuse_next_send_of: Vec<FrameKind>,
}

/// The error a frame refused by [`Command::RefuseNextSendOf`] is lost with.
pub(crate) const REFUSED_BY_DRILL: RemoteError =
    RemoteError::Mpi { op: "MPI_Isend (drill)", code: -1 };

/// Runs one command; `false` ends the loop.
fn run_command(
    world: &SimpleCommunicator,
    health: &SimpleCommunicator,
    shared: &Shared,
    sending: &mut Vec<InFlight>,
    drills: &mut Drills,
    c: Command,
) -> bool {
    match c {
        Command::Send { to, health: on_health, mut bytes, opening, receipt } => {
            let comm = if on_health { health } else { world };
            let kind = bytes.get(2).copied().and_then(FrameKind::from_code);
            let refused = kind
                .filter(|_| !on_health)
                .and_then(|k| drills.refuse_next_send_of.iter().position(|r| *r == k));
            if let Some(i) = refused {
                drills.refuse_next_send_of.remove(i);
                lose(shared, to, Way::Out(opening), REFUSED_BY_DRILL);
                settle(receipt, Err(REFUSED_BY_DRILL));
                return true;
            }
            if !on_health && std::mem::take(&mut drills.corrupt_next_send) {
                for b in bytes.iter_mut().take(2) {
                    *b = !*b;
                }
            }
            match InFlight::start(comm, to, on_health, TAG, bytes) {
                Ok(mut f) => {
                    f.receipt = receipt;
                    f.opening = opening;
                    sending.push(f);
                }
                Err(e) => {
                    lose(shared, to, Way::Out(opening), e.clone());
                    settle(receipt, Err(e));
                }
            }
            if !on_health && let Some(d) = drills.stall_after_send.take() {
                std::thread::sleep(d);
            }
            true
        }
        Command::Stall(d) => {
            std::thread::sleep(d);
            true
        }
        Command::StallAfterNextSend(d) => {
            drills.stall_after_send = Some(d);
            true
        }
        Command::CorruptNextSend => {
            drills.corrupt_next_send = true;
            true
        }
        Command::RefuseNextSendOf(kind) => {
            drills.refuse_next_send_of.push(kind);
            true
        }
        Command::Finalize => false,
    }
}

fn heard(shared: &Shared, from: i32) {
    if let Some(h) = shared.last_heard.get(from as usize) {
        h.store(shared.now_nanos(), Ordering::Release);
    }
}

/// A transport with no MPI thread, for tests of the threads that use one: the test takes the
/// frames they send and routes answers to them, as the MPI thread would.
#[cfg(test)]
pub(crate) mod detached {
    use super::*;

    /// Where the frames of a detached transport go.
    pub(crate) struct Wire {
        /// `None` once cut: every send then fails, as when the MPI thread has gone.
        cmd: Mutex<Option<Receiver<Command>>>,
        shared: std::sync::Arc<Shared>,
    }

    /// Rank 0 of a job of `size` ranks, and its wire.
    pub(crate) fn rank0(size: i32) -> (Transport, Wire) {
        rank(0, size)
    }

    /// Rank `rank` of a job of `size` ranks, and its wire. The receipt of a frame sent for
    /// confirmation is dropped with the frame, which fails the send as the MPI thread's end does.
    pub(crate) fn rank(rank: i32, size: i32) -> (Transport, Wire) {
        let (tx, rx) = mpsc::channel();
        let shared = std::sync::Arc::new(Shared::new(size));
        let transport = Transport {
            shared: std::sync::Arc::clone(&shared),
            cmd: Mutex::new(tx),
            thread: Mutex::new(None),
            next_seq: AtomicU64::new(1),
            rank,
            size,
            host: "detached".to_owned(),
        };
        (transport, Wire { cmd: Mutex::new(Some(rx)), shared })
    }

    impl Wire {
        /// The next data frame sent within `d`, with the rank it is for.
        pub(crate) fn sent(&self, d: Duration) -> Option<(i32, Packet)> {
            let (to, _, bytes) = self.next_data_frame(d)?;
            Packet::decode(&bytes).ok().map(|p| (to, p))
        }

        /// The destination and inbox opening of the next data frame sent within `d`.
        pub(crate) fn sent_under(&self, d: Duration) -> Option<(i32, u64)> {
            self.next_data_frame(d).map(|(to, opening, _)| (to, opening))
        }

        /// The destination, inbox opening and bytes of the next data frame sent within `d`.
        fn next_data_frame(&self, d: Duration) -> Option<(i32, u64, Vec<u8>)> {
            let until = Instant::now() + d;
            let cmd = self.cmd.lock();
            loop {
                let left = until.saturating_duration_since(Instant::now());
                if let Command::Send { to, health: false, opening, bytes, .. } =
                    cmd.as_ref()?.recv_timeout(left).ok()?
                {
                    return Some((to, opening, bytes));
                }
            }
        }

        /// Records a pong from `rank` answering ping `nonce` while it served `session`.
        pub(crate) fn pong(&self, rank: i32, nonce: u64, session: u64) {
            heard(&self.shared, rank);
            self.shared.record_pong(rank, nonce, session);
        }

        /// Routes `p` as a frame from `rank`.
        pub(crate) fn answer(&self, rank: i32, p: &Packet) {
            route(&self.shared, rank, p.encode());
        }

        /// Records a frame from `rank` lost with `e`, as the MPI thread does for one it could not
        /// receive or decode.
        pub(crate) fn lose_incoming(&self, rank: i32, e: RemoteError) {
            lose(&self.shared, rank, Way::In, e);
        }

        /// From now on every send fails.
        pub(crate) fn cut(&self) {
            self.cmd.lock().take();
        }
    }
}

#[cfg(test)]
mod tests;
