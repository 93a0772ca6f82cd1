//! Endpoint threads: one per endpoint, fed through a mailbox (`docs/engine-protocols.md` §7).
//!
//! # Endpoint thread
//!
//! 0. Call `on_thread_start` (an endpoint with per-thread state, such as a thread-bound
//!    context, sets it up here: every later call of the endpoint comes from this thread).
//! 1. Take the next mail: spin briefly on the mailbox's `pending` hint, then park. Out of mail,
//!    hold the idle-driver role while spinning if it is free: run the scheduler pass for tasks
//!    the orchestration published ready meanwhile, so that its thread does not (`inbox`, steps
//!    6–10), and take the ready tasks it holds when taking and giving back the role, before
//!    parking, and when they have waited too long (`held_ready`, steps 13–15).
//! 2. A task member: read its arguments from the slot (immutable since publication; the slot
//!    stays `Running` until this member reports), call `Endpoint::run` under `catch_unwind`,
//!    release the arguments, and deliver the completion to the scheduler (combining protocol in
//!    `inbox`: this thread runs the scheduler pass itself when the scheduler lock is free, which
//!    often dispatches its own next task without any wake-up). The completion is processed
//!    before the worker can be considered idle, because only a scheduler pass marks it idle, when
//!    it processes that completion.
//! 3. A control job: run it (it catches its own panic and sends its result).
//! 4. Repeat. On `Stop`, which is always the last mail (the mailbox refuses pushes after it),
//!    call `shutdown` and exit; everything queued before it has been served.
//!
//! # Mailbox handoff
//!
//! The same as the scheduler inbox: a sender locks, appends, sets `pending`, and notifies only if
//! the worker announced under the lock that it sleeps. One lock and at most one wake per
//! dispatch.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use simpler_types::{SlotId, WorkerRef};

use crate::core::Core;
use crate::endpoint::{
    DispatchedMember, Endpoint, EndpointFailure, drop_quietly, into_panic_message, quietly,
    thread_span,
};
use crate::error::SchedError;
use crate::held_ready::EndpointTake;
use crate::inbox::{MemberCompletion, WorkerSlot};
use crate::sync::{self, AtomicBool, AtomicU64, Condvar, Mutex, Ordering};

/// A control job queued for one worker.
pub(crate) type Job = Box<dyn FnOnce(&mut dyn Endpoint) + Send>;

/// One item of a worker's mailbox.
pub(crate) enum Mail {
    /// Run member `member` of the task in `slot`.
    Task {
        /// The task's slot.
        slot: SlotId,
        /// The member index.
        member: u32,
    },
    /// Run a control job.
    Job(Job),
    /// Serve nothing more.
    Stop,
}

#[derive(Default)]
struct MailboxState {
    queue: VecDeque<Mail>,
    sleeping: bool,
    closed: bool,
}

/// A worker's FIFO of dispatches and control jobs.
#[derive(Default)]
pub(crate) struct Mailbox {
    state: Mutex<MailboxState>,
    wake: Condvar,
    /// Hint for the spinning worker (see module docs). Writers: senders and the worker, under
    /// the lock. Reader: the worker, lock-free.
    pending: AtomicBool,
    /// The slot whose member this worker is running, packed (`SlotId::pack`), 0 when idle.
    /// Writer: the scheduler (dispatch and completion). Reader: shutdown's progress warning.
    busy_with: AtomicU64,
}

/// The worker stopped; nothing more is accepted.
#[derive(Debug)]
pub(crate) struct MailboxClosed;

impl Mailbox {
    /// Queues a dispatched member (scheduler only).
    pub(crate) fn send_task(&self, slot: SlotId, member: u32) {
        // Relaxed: read only by the shutdown warning, which tolerates a stale value.
        self.busy_with.store(slot.pack(), Ordering::Relaxed);
        let mut s = self.state.lock();
        debug_assert!(!s.closed, "dispatch to a stopped worker");
        s.queue.push_back(Mail::Task { slot, member });
        self.wake_locked(&mut s);
    }

    /// Marks the worker idle for the shutdown warning (scheduler only).
    pub(crate) fn set_idle(&self) {
        // Relaxed: read only by the shutdown warning, which tolerates a stale value.
        self.busy_with.store(0, Ordering::Relaxed);
    }

    /// The slot the worker is running, if any.
    pub(crate) fn busy_with(&self) -> Option<SlotId> {
        // Relaxed: a diagnostic snapshot.
        match self.busy_with.load(Ordering::Relaxed) {
            0 => None,
            raw => Some(SlotId::unpack(raw)),
        }
    }

    /// Queues a control job.
    pub(crate) fn send_job(&self, job: Job) -> Result<(), MailboxClosed> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(MailboxClosed);
        }
        s.queue.push_back(Mail::Job(job));
        self.wake_locked(&mut s);
        Ok(())
    }

    /// Queues the final `Stop` and refuses everything after it.
    pub(crate) fn stop(&self) {
        let mut s = self.state.lock();
        if !s.closed {
            s.closed = true;
            s.queue.push_back(Mail::Stop);
            self.wake_locked(&mut s);
        }
    }

    fn wake_locked(&self, s: &mut MailboxState) {
        // Relaxed: a hint; the queue itself is read under the lock.
        self.pending.store(true, Ordering::Relaxed);
        if s.sleeping {
            s.sleeping = false;
            self.wake.notify_one();
        }
    }

    /// Takes the next mail, spinning briefly and then parking until one arrives. While it
    /// spins, the thread may hold the idle-driver role and run the passes of tasks published
    /// ready meanwhile (`inbox`, steps 6–10), and it takes the ready tasks the submitting thread
    /// holds when it has run out of mail, before it parks, and when they have waited too long
    /// (`held_ready`, steps 13–15; `take` is the thread's state for those).
    fn recv(&self, core: &Core, who: WorkerSlot, take: &mut EndpointTake) -> Mail {
        loop {
            // Relaxed: only decides whether to spin; the queue is read under the lock. Mail
            // waiting is taken at once, without the role: step 13 is for a thread out of mail.
            if self.pending.load(Ordering::Relaxed) {
                break;
            }
            let holds_role = core.idle_driver.take();
            if holds_role {
                core.take_held(take);
            }
            let mut stale = false;
            // Relaxed: as above; the inbox is read by the drive after the role is given back.
            let interrupted = sync::spin_until(|| {
                stale = core.held_ready.is_stale();
                self.pending.load(Ordering::Relaxed)
                    || (holds_role && core.inbox.pending() && !core.pass_in_progress())
                    || stale
            });
            if holds_role {
                // Before this thread's own mail: the passes may dispatch to it anyway, and a
                // holder owes its drive however its spin ended.
                core.give_back_idle_driver(take);
            } else if stale {
                core.take_held(take);
            }
            // Spin over, or mail arrived (possibly sent by the pass just run): take it or park.
            if !interrupted || self.pending.load(Ordering::Relaxed) {
                break;
            }
        }
        if let Some(mail) = self.pop(&mut self.state.lock()) {
            return mail;
        }
        // Marked as parked before the last look at the held tasks (`held_ready`, step 14).
        core.held_ready.parking(who);
        core.take_held(take);
        let mut s = self.state.lock();
        let mail = loop {
            if let Some(mail) = self.pop(&mut s) {
                break mail;
            }
            s.sleeping = true;
            s = self.wake.wait(s);
        };
        drop(s);
        core.held_ready.unparked(who);
        mail
    }

    fn pop(&self, s: &mut MailboxState) -> Option<Mail> {
        let mail = s.queue.pop_front()?;
        if s.queue.is_empty() {
            // Relaxed: cleared under the mailbox lock; a sender sets it again under it.
            self.pending.store(false, Ordering::Relaxed);
        }
        Some(mail)
    }
}

/// One-shot receiver of a control job's result
/// ([`Engine::on_endpoint`](crate::Engine::on_endpoint)).
pub struct JobReceiver<R> {
    rx: mpsc::Receiver<Result<R, String>>,
    worker: WorkerRef,
}

impl<R> std::fmt::Debug for JobReceiver<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobReceiver").field("worker", &self.worker).finish_non_exhaustive()
    }
}

impl<R> JobReceiver<R> {
    pub(crate) fn new(rx: mpsc::Receiver<Result<R, String>>, worker: WorkerRef) -> Self {
        JobReceiver { rx, worker }
    }

    /// The worker the job runs on.
    pub fn worker(&self) -> WorkerRef {
        self.worker
    }

    /// Blocks until the job has run and returns its result.
    ///
    /// Errors: [`SchedError::JobPanicked`] if the job panicked, [`SchedError::WorkerStopped`]
    /// if the worker stopped without running it.
    pub fn recv(self) -> Result<R, SchedError> {
        match self.rx.recv() {
            Ok(r) => self.map(r),
            Err(_) => Err(SchedError::WorkerStopped { worker: self.worker }),
        }
    }

    /// As [`recv`](Self::recv), giving up after `timeout` with `Ok(None)` (the job may still
    /// run; call again to collect it).
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<R>, SchedError> {
        match self.rx.recv_timeout(timeout) {
            Ok(r) => self.map(r).map(Some),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(SchedError::WorkerStopped { worker: self.worker })
            }
        }
    }

    fn map(&self, r: Result<R, String>) -> Result<R, SchedError> {
        r.map_err(|message| SchedError::JobPanicked { worker: self.worker, message })
    }
}

/// Wraps a typed job so that it reports its result (or its panic) through a channel.
pub(crate) fn wrap_job<R: Send + 'static>(
    job: impl FnOnce(&mut dyn Endpoint) -> R + Send + 'static,
) -> (Job, mpsc::Receiver<Result<R, String>>) {
    let (tx, rx) = mpsc::sync_channel(1);
    let job: Job = Box::new(move |endpoint: &mut dyn Endpoint| {
        let result = catch_unwind(AssertUnwindSafe(|| job(endpoint))).map_err(into_panic_message);
        // The receiver may have been dropped; the job ran either way, and its result is
        // dropped here, on the endpoint thread.
        if let Err(mpsc::SendError(unsent)) = tx.send(result) {
            drop_quietly(unsent);
        }
    });
    (job, rx)
}

/// Body of one endpoint thread.
pub(crate) fn endpoint_thread_main(
    core: Arc<Core>,
    who: WorkerSlot,
    name: WorkerRef,
    mut endpoint: Box<dyn Endpoint>,
) {
    // A tracing layer may panic entering or leaving a span, or on an event. Such a panic must
    // not end this thread: its mails would go unserved and their runs would never end.
    let span = thread_span(|| {
        tracing::debug_span!("worker", level = core.level, worker = %name).entered()
    });
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| endpoint.on_thread_start())) {
        let message = into_panic_message(p);
        quietly(|| tracing::error!(worker = %name, "on_thread_start panicked: {message}"));
    }
    let mailbox = core.mailbox(who);
    let mut take = EndpointTake::default();
    loop {
        match mailbox.recv(&core, who, &mut take) {
            Mail::Task { slot, member } => {
                let run = || run_member(&core, endpoint.as_mut(), slot, member);
                let result = catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|p| {
                    Err(EndpointFailure::endpoint_failed(format!(
                        "the endpoint thread panicked around the task: {}",
                        into_panic_message(p)
                    )))
                });
                core.deliver_completion(MemberCompletion { slot, member, worker: who, result });
                // A thread that never runs out of mail still takes held tasks that have waited
                // too long (`held_ready`, step 15).
                if core.held_ready.is_stale() {
                    core.take_held(&mut take);
                }
            }
            // The job catches its closure's panic; what may still panic around it (a tracing
            // layer) must not end the thread either.
            Mail::Job(job) => {
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| job(endpoint.as_mut()))) {
                    let message = into_panic_message(p);
                    quietly(
                        || tracing::error!(worker = %name, "a control job panicked: {message}"),
                    );
                }
            }
            Mail::Stop => break,
        }
    }
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| endpoint.shutdown())) {
        let message = into_panic_message(p);
        quietly(|| tracing::error!(worker = %name, "endpoint shutdown panicked: {message}"));
    }
    drop_quietly(span);
}

/// Step 2: runs one dispatched member and returns what the endpoint said.
fn run_member(
    core: &Core,
    endpoint: &mut dyn Endpoint,
    slot: SlotId,
    member: u32,
) -> Result<(), EndpointFailure> {
    let stale = || EndpointFailure::endpoint_failed(format!("dispatched {slot} is not live"));
    let Some(entry) = core.ring.slot(slot) else {
        return Err(stale());
    };
    let payload = entry.payload.read();
    let (Some(task), Some(callable)) = (payload.task, payload.callable.as_ref()) else {
        return Err(stale());
    };
    if payload.id != Some(slot) {
        return Err(stale());
    }
    let Some(m) = payload.members.get(member as usize) else {
        return Err(EndpointFailure::endpoint_failed(format!(
            "{task} has no member {member} (group of {})",
            payload.members.len()
        )));
    };
    let dispatched = DispatchedMember {
        task,
        member,
        group_size: payload.members.len() as u32,
        callable,
        config: payload.config(&core.default_config),
        args: payload.member_args(m),
    };
    // The task's span is isolated from the task: a tracing layer that panics entering or
    // leaving it changes nothing of what the endpoint did (the task still runs, and its result
    // stands).
    let span = catch_unwind(AssertUnwindSafe(
        || tracing::debug_span!("task", run.id = task.run.get(), %task, member),
    ))
    .map_err(drop_quietly)
    .ok();
    let entered = span.as_ref().and_then(|span| {
        catch_unwind(AssertUnwindSafe(|| span.enter()))
            .map_err(|payload| {
                drop_quietly(payload);
                // The subscriber may have entered the span before its layer panicked: exit it
                // again, or its per-thread stack of entered spans keeps one for every task.
                if let Some(id) = span.id() {
                    quietly(|| tracing::dispatcher::get_default(|d| d.exit(&id)));
                }
            })
            .ok()
    });
    let result = match catch_unwind(AssertUnwindSafe(|| endpoint.run(dispatched))) {
        Ok(result) => result,
        Err(payload) => Err(EndpointFailure::endpoint_failed(format!(
            "endpoint panicked: {}",
            into_panic_message(payload)
        ))),
    };
    quietly(|| drop(entered));
    quietly(|| drop(span));
    result
}
