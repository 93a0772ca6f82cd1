//! The scheduler inbox and the combining protocol that drains it (`docs/engine-protocols.md` §6,
//! decision in `docs/decisions/sched.md`).
//!
//! The scheduler's queues live behind one lock (`Core::sched`). Whichever thread produces an
//! event — the orchestration thread publishing a ready task, an endpoint thread reporting a
//! completion — runs the scheduler pass itself if it can take that lock; otherwise it leaves the
//! event in this inbox for the current holder. This removes the thread handoff per event that a
//! dedicated scheduler thread costs (a context switch on a machine with fewer cores than engine
//! threads), while every queue stays private to the lock holder.
//!
//! # Combining protocol
//!
//! 1. **Deliver.** A producer with an event tries the scheduler lock. With it, it runs a pass
//!    that first drains the inbox (so earlier events keep their order) and then handles its own
//!    event. Without it, it appends the event here (`pending := true`, under the inbox lock).
//!    - **Join.** A ready task that may be held (step 10) and finds events already waiting
//!      (checked under the inbox lock) is appended behind them, up to [`JOIN_LIMIT`] waiting
//!      ready tasks, and its producer neither drives nor reads the role: whoever made the inbox
//!      pending owes it a drain (step 2, 3 or 8), and a drain takes everything appended before
//!      it. A stream of ready tasks then costs one inbox lock each instead of a lock, a fence
//!      and a contended scheduler-lock attempt or role read. The price: joined tasks wait for
//!      that owner, which the operating system may have descheduled, as tasks appended behind
//!      a pass in progress always have (`docs/decisions/sched.md`).
//! 2. **Drive.** Every producer then (except one that joined, held its task, or handed it over
//!    to the idle driver: steps 7 and 11–12), and every lock holder after unlocking — including
//!    the scheduler thread, which takes the lock blocking ([`locked_then_drive`]) — loops:
//!    SeqCst fence; if `pending` is false, stop; if the lock cannot be taken, stop (its holder
//!    will drive after unlocking); otherwise run a pass and repeat.
//! 3. **Why nothing is lost.** A producer's append (before its fence) and a holder's unlock
//!    (before its fence) are ordered by the two SeqCst fences: either the holder's check sees
//!    `pending`, or the producer's `try_lock` sees the lock free (or taken by a later holder,
//!    who will drive in turn). Modelled in `loom_models`.
//! 4. **Drain.** Passes take events only while holding the scheduler lock, swapping the inbox
//!    vectors with their own so neither side allocates; `pending` is cleared in the same inbox
//!    critical section.
//! 5. **Close.** The scheduler's final drain closes the inbox: later appends are refused and the
//!    producer resolves what it owned itself.
//!
//! # Idle driver
//!
//! A submitting thread that runs the pass for every task it publishes ready pays for the
//! scheduler's work on the thread that orchestrates, usually the bottleneck. When an endpoint
//! thread is idle anyway, it can run that pass instead. [`IdleDriver`] is that hand-off:
//!
//! 6. **Take the role.** An endpoint thread about to spin for mail takes the role if nobody holds
//!    it (one holder at most, so two idle threads never race each other for the scheduler lock).
//!    While spinning it also watches `pending` and stops spinning when an event is waiting and
//!    the scheduler lock looks free.
//! 7. **Hold and hand over.** A submitting thread with a ready task that may be held (step 10)
//!    holds it while the threads that could run it are awake (`held_ready`, steps 11–16) and
//!    hands the held tasks over in batches: it appends them here, then reads the role with a
//!    read-modify-write; still held, it returns, leaving the pass to the holder; otherwise it
//!    drives (step 2) itself.
//! 8. **Give back.** The holder stops spinning (mail arrived, an event is waiting, held tasks
//!    went stale, or its spin is over) by clearing the role with a read-modify-write, takes the tasks the submitting
//!    thread holds (`held_ready`, step 13), then drives (step 2), before it takes its own mail.
//!    It never keeps or drops the role any other way.
//! 9. **Why nothing is lost.** Every write to the role is a read-modify-write, so they are
//!    totally ordered and each reads the latest value. If the producer's read comes first, it
//!    found the role held and returned; the holder's clear comes later in that order and reads
//!    from it or from a later write of the chain (the producer's release, the clear's acquire),
//!    so the append happens before the clear, and before the SeqCst fence of the drive that
//!    follows: that drive sees `pending`, or finds the lock taken by a holder that drives after
//!    unlocking (step 2). If the clear comes first, the producer finds the role clear and drives
//!    itself — unless another thread took the role in between, which then owes the same clear
//!    and drive. Modelled in `loom_models`.
//! 10. **Only where throughput counts.** Holding trades the submitting thread's time for the
//!     endpoint threads' reaction time (a batch, running out of mail, or a stale period). A
//!     short run is all latency, so a run's first tasks are never held or joined (the submit
//!     decides). When a run's submission ends, its thread waits for the run from then on, so it
//!     hands over what it holds and drives (step 2) once: nothing it held or handed over waits
//!     for an endpoint thread.
//!
//! | Field | Writers | Readers |
//! |---|---|---|
//! | `pending` | producers (step 1, only when it changes) and drainers (steps 4 and 5), under
//! the inbox lock | joiners (step 1), under the inbox lock; drivers (step 2), lock-free after a
//! SeqCst fence; the idle driver while spinning and producers before joining (hints) |
//! | `IdleDriver::held` | endpoint threads (steps 6 and 8) and producers (steps 7 and 12), by
//! read-modify-writes only (a plain store would break step 9) | the same, and first looks
//! (hints) |

use crossbeam_utils::CachePadded;
use simpler_types::SlotId;

use crate::endpoint::EndpointFailure;
use crate::held_ready::{self, HeldReady};
use crate::slot::Route;
use crate::sync::{self, AtomicBool, Mutex, MutexGuard, Ordering};

/// A task that became ready at publication.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadyEntry {
    /// The task's slot.
    pub(crate) slot: SlotId,
    /// Its queue.
    pub(crate) route: Route,
}

/// Which worker a completion comes from: its type and registration index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WorkerSlot {
    /// NEXT_LEVEL worker at this registration index.
    NextLevel(u32),
    /// SUB worker at this index.
    Sub(u32),
}

/// One member's result, echoed from the dispatch the worker received.
#[derive(Debug)]
pub(crate) struct MemberCompletion {
    /// The task's slot.
    pub(crate) slot: SlotId,
    /// The member index that was dispatched.
    pub(crate) member: u32,
    /// The worker that ran it.
    pub(crate) worker: WorkerSlot,
    /// What the endpoint returned.
    pub(crate) result: Result<(), EndpointFailure>,
}

/// Events taken in one drain.
#[derive(Debug, Default)]
pub(crate) struct InboxBatch {
    /// Ready tasks, in publication order.
    pub(crate) ready: Vec<ReadyEntry>,
    /// Completions, in arrival order.
    pub(crate) completions: Vec<MemberCompletion>,
    /// A stop was requested (reported by exactly one drain).
    pub(crate) stop: bool,
}

#[derive(Default)]
struct InboxState {
    batch: InboxBatch,
    closed: bool,
}

/// Events left for the scheduler lock's holder.
#[derive(Default)]
pub(crate) struct Inbox {
    state: Mutex<InboxState>,
    /// See the module docs. On a cache line of its own, written only when it changes: the idle
    /// driver reads it in a tight spin, which must not pull the inbox lock away from producers.
    pending: CachePadded<AtomicBool>,
}

/// The inbox was closed by the scheduler's final drain; the event was not delivered.
#[derive(Debug)]
pub(crate) struct Closed;

impl Inbox {
    /// The inbox locked for an append; `Err(Closed)` once the scheduler's final drain closed it.
    fn open_for_append(&self) -> Result<MutexGuard<'_, InboxState>, Closed> {
        let s = self.state.lock();
        if s.closed { Err(Closed) } else { Ok(s) }
    }

    fn push(&self, f: impl FnOnce(&mut InboxBatch)) -> Result<(), Closed> {
        let mut s = self.open_for_append()?;
        f(&mut s.batch);
        // Relaxed: published by the inbox unlock and, for drivers, by the SeqCst fences of
        // protocol step 3. Every write is made under the inbox lock, so the load is exact.
        if !self.pending.load(Ordering::Relaxed) {
            self.pending.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Step 1's join: appends `entry` if events are already waiting and fewer than `limit`
    /// ready tasks among them, and reports whether it did. Such an append owes no drive: the
    /// event that set `pending` is owed a drain, and a drain takes everything appended before it.
    pub(crate) fn join_pending(&self, entry: ReadyEntry, limit: usize) -> Result<bool, Closed> {
        let mut s = self.open_for_append()?;
        // Relaxed: under the inbox lock, like every write of `pending`.
        if !self.pending.load(Ordering::Relaxed) || s.batch.ready.len() >= limit {
            return Ok(false);
        }
        s.batch.ready.push(entry);
        Ok(true)
    }

    /// Ready tasks waiting in the inbox.
    #[cfg(all(test, not(simpler_loom)))]
    pub(crate) fn waiting_ready(&self) -> usize {
        self.state.lock().batch.ready.len()
    }

    /// Step 1 for a ready task whose publisher could not take the scheduler lock.
    pub(crate) fn push_ready(&self, entry: ReadyEntry) -> Result<(), Closed> {
        self.push(|b| b.ready.push(entry))
    }

    /// Steps 12–15 (`held_ready`): appends every entry of `entries` (moved out, so `entries`
    /// is left empty), or none once the inbox is closed.
    pub(crate) fn push_ready_all(&self, entries: &mut Vec<ReadyEntry>) -> Result<(), Closed> {
        self.push(|b| b.ready.append(entries))
    }

    /// Step 1 for a completion whose worker could not take the scheduler lock. Cannot be
    /// refused in practice: the inbox closes only when no worker is busy.
    pub(crate) fn push_completion(&self, completion: MemberCompletion) -> Result<(), Closed> {
        self.push(|b| b.completions.push(completion))
    }

    /// Records a stop request (`docs/engine-protocols.md` §8 step 4) for the next pass.
    pub(crate) fn request_stop(&self) {
        // Once closed, the scheduler has already stopped; nothing to record.
        let _ = self.push(|b| b.stop = true);
    }

    /// Step 2's check: whether an event may be waiting (call after a SeqCst fence).
    pub(crate) fn pending(&self) -> bool {
        // Relaxed: the caller's SeqCst fence orders this load against its own earlier unlock
        // (protocol step 3); a stale `true` only costs a pass over an empty inbox.
        self.pending.load(Ordering::Relaxed)
    }

    /// Step 4: swaps everything pending into `batch` (whose vectors must be empty).
    pub(crate) fn take(&self, batch: &mut InboxBatch) {
        debug_assert!(batch.ready.is_empty() && batch.completions.is_empty());
        if !self.pending() {
            return;
        }
        let mut s = self.state.lock();
        std::mem::swap(&mut s.batch.ready, &mut batch.ready);
        std::mem::swap(&mut s.batch.completions, &mut batch.completions);
        batch.stop |= std::mem::take(&mut s.batch.stop);
        // Relaxed: cleared under the inbox lock together with the events it announced; a
        // concurrent push sets it again under the same lock.
        self.pending.store(false, Ordering::Relaxed);
    }

    /// Step 5: refuses every later push and appends what arrived since the last take.
    pub(crate) fn close(&self, batch: &mut InboxBatch) {
        let mut s = self.state.lock();
        s.closed = true;
        batch.ready.append(&mut s.batch.ready);
        batch.completions.append(&mut s.batch.completions);
        // Relaxed: as in `take`; nothing can be pushed after this.
        self.pending.store(false, Ordering::Relaxed);
    }
}

/// The idle-driver role (module docs, steps 6–9).
#[derive(Default)]
pub(crate) struct IdleDriver {
    held: AtomicBool,
}

impl IdleDriver {
    /// Step 6: takes the role if nobody holds it. The holder must give it back with
    /// [`give_back_then_drive`](Self::give_back_then_drive).
    pub(crate) fn take(&self) -> bool {
        // Relaxed: taking the role orders nothing; steps 7 and 8 do (step 9).
        self.held.compare_exchange(false, true, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// Step 7's read-modify-write, after an append: whether the role is still held, so that
    /// the holder will run the pass (otherwise the caller drives). It writes nothing new (step
    /// 9); release, so that the give-back that reads from it sees the append.
    pub(crate) fn still_held(&self) -> bool {
        self.held.fetch_or(false, Ordering::Release)
    }

    /// Step 8: gives the role back, takes the entries the submitting thread holds
    /// (`held_ready`, step 13; `scratch` must be empty and is left empty), then drives if an
    /// event is waiting.
    pub(crate) fn give_back_then_drive<S>(
        &self,
        inbox: &Inbox,
        held: &HeldReady,
        scratch: &mut Vec<ReadyEntry>,
        lock: &Mutex<S>,
        pass: impl FnMut(&mut MutexGuard<'_, S>),
    ) {
        // A read-modify-write (step 9); acquire, so that an append whose producer read the role
        // held is seen by the drive below.
        self.held.swap(false, Ordering::Acquire);
        held_ready::take(held, inbox, scratch);
        drive(inbox, lock, pass);
    }
}

/// Step 1 for a task published ready, with the join when `may_join` (past a run's first tasks,
/// step 10): joins events already waiting; otherwise runs `own_pass` on it under `lock` if the
/// lock is free, or appends it; then drives (step 2) unless the task joined. (Past a run's first
/// tasks a ready task is held instead while the threads that could run it are awake,
/// `held_ready`.)
pub(crate) fn deliver_ready<S>(
    inbox: &Inbox,
    lock: &Mutex<S>,
    entry: ReadyEntry,
    may_join: bool,
    own_pass: impl FnOnce(&mut MutexGuard<'_, S>, ReadyEntry),
    pass: impl FnMut(&mut MutexGuard<'_, S>),
) -> Result<(), Closed> {
    if may_join && inbox.pending() && inbox.join_pending(entry, JOIN_LIMIT)? {
        return Ok(());
    }
    match lock.try_lock() {
        Some(mut guard) => own_pass(&mut guard, entry),
        None => inbox.push_ready(entry)?,
    }
    drive(inbox, lock, pass);
    Ok(())
}

/// Most ready tasks waiting in the inbox that a producer joins instead of delivering (step 1):
/// the most that wait on a thread that has fallen behind. Measured (P1, 8 alternating rounds):
/// 8 and 32 gave the same gain.
pub(crate) const JOIN_LIMIT: usize = 32;

/// Takes `lock` (blocking), runs `body` under it, unlocks, then drives (step 2): events left in
/// the inbox by threads that found the lock taken meanwhile are never stranded.
pub(crate) fn locked_then_drive<S, R>(
    inbox: &Inbox,
    lock: &Mutex<S>,
    body: impl FnOnce(&mut MutexGuard<'_, S>) -> R,
    pass: impl FnMut(&mut MutexGuard<'_, S>),
) -> R {
    let mut guard = lock.lock();
    let r = body(&mut guard);
    drop(guard);
    drive(inbox, lock, pass);
    r
}

/// Step 2: runs `pass` under `lock` while events are pending and the lock is free.
pub(crate) fn drive<S>(
    inbox: &Inbox,
    lock: &Mutex<S>,
    mut pass: impl FnMut(&mut MutexGuard<'_, S>),
) {
    loop {
        sync::fence_seq_cst();
        if !inbox.pending() {
            return;
        }
        let Some(mut guard) = lock.try_lock() else {
            return;
        };
        pass(&mut guard);
        drop(guard);
    }
}

#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use std::time::{Duration, Instant};

    use simpler_types::{CallConfig, TaskArgs, TaskState, WorkerId, WorkerType};

    use crate::endpoint::{DispatchedMember, Endpoint, EndpointCaps, EndpointFailure};
    use crate::engine::{Engine, EngineConfig};
    use crate::outcome::RunOutcome;
    use crate::scheduler::tests::{chip, gated_engine, wait_until};

    /// A NEXT_LEVEL endpoint that finishes every member at once.
    struct Quick(WorkerId);

    impl Endpoint for Quick {
        fn caps(&self) -> EndpointCaps {
            EndpointCaps {
                worker_type: WorkerType::NextLevel,
                id: self.0,
                remote: false,
                name: "quick".into(),
            }
        }

        fn run(&mut self, _: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
            Ok(())
        }
    }

    #[test]
    fn ready_tasks_held_while_the_endpoint_threads_are_awake_all_run() {
        // The orchestration submits independent tasks and pauses now and then, so that the
        // endpoint threads run out of mail, take the idle-driver role and park; tasks published
        // while both are awake are held (`held_ready`) and handed over in batches. Each run's
        // last task is submitted after a pause and must run before the run is closed (closing
        // hands over and drives, and would rescue it): only an endpoint thread's take can find
        // it then.
        let engine = Engine::start(EngineConfig {
            next_level: vec![Box::new(Quick(WorkerId(0))), Box::new(Quick(WorkerId(1)))],
            ..EngineConfig::default()
        })
        .unwrap();
        let cfg = CallConfig::default();
        for r in 0..20 {
            let mut b = engine.begin_run().unwrap();
            let mut last = None;
            for i in 0..400u32 {
                if i % 40 == 0 || i == 399 {
                    std::thread::sleep(Duration::from_micros(50));
                }
                let target = WorkerId(i % 2);
                last = Some(b.submit_next_level(&chip(), TaskArgs::new(), &cfg, target, None));
            }
            let last = last.unwrap().unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            while engine.task_snapshot(last).unwrap().state != TaskState::Completed {
                assert!(Instant::now() < deadline, "run {r}: a ready task was stranded");
                std::thread::yield_now();
            }
            let outcome = engine.wait_timeout(b.close(), Duration::from_secs(20)).unwrap();
            assert_eq!(outcome, Some(RunOutcome::Completed), "run {r}");
        }
        let takes = engine.core().held_ready.takes.load(std::sync::atomic::Ordering::Relaxed);
        assert!(takes > 0, "no endpoint thread took a held task: nothing was tested");
        assert!(engine.shutdown(Instant::now() + Duration::from_secs(20)).is_ok());
    }

    #[test]
    fn held_ready_tasks_are_taken_at_give_back_handed_over_in_batches_and_at_close() {
        // The test thread holds the idle-driver role, as an endpoint thread spinning for mail
        // would; the gate keeps every task from finishing, so no completion pass drains anything.
        // Past the first sixteen, a ready task is held (`held_ready`, step 11); giving the role
        // back takes it (step 13); with the role held again, the sixteenth held task hands all
        // sixteen over to the inbox without a pass (the holder owes it, step 12), and closing
        // the run hands over and drives what is left (step 10).
        let (engine, tx) = gated_engine();
        let core = engine.core();
        let mut taken = crate::held_ready::EndpointTake::default();
        // The gate's thread holds the role while it spins after starting; it gives it back when
        // it parks.
        wait_until(|| core.idle_driver.take());
        let cfg = CallConfig::default();
        let mut b = engine.begin_run().unwrap();
        let mut submit = || {
            b.submit_next_level(&chip(), TaskArgs::new(), &cfg, WorkerId(0), None).unwrap();
        };
        for _ in 0..16 {
            submit();
        }
        // The gate's thread counts as awake once it has its first task (`held_ready`, step 14).
        wait_until(|| core.held_ready.parked() == 0);
        submit();
        assert_eq!(core.held_ready.len(), 1, "the seventeenth task was not held");
        assert_eq!(core.inbox.waiting_ready(), 0);
        core.give_back_idle_driver(&mut taken);
        assert_eq!(core.held_ready.len(), 0, "giving the role back did not take the held task");
        assert_eq!(core.inbox.waiting_ready(), 0, "the taken task did not reach a pass");
        assert!(taken.refused.is_empty());

        assert!(core.idle_driver.take());
        for held in 1..crate::held_ready::READY_BATCH {
            submit();
            assert_eq!(core.held_ready.len(), held);
        }
        submit();
        assert_eq!(core.held_ready.len(), 0, "a full batch was not handed over");
        assert_eq!(core.inbox.waiting_ready(), crate::held_ready::READY_BATCH);
        submit();
        assert_eq!(core.held_ready.len(), 1);
        let run = b.close();
        let stranded = core.inbox.pending() || core.held_ready.len() > 0;
        core.give_back_idle_driver(&mut taken);
        for _ in 0..18 + crate::held_ready::READY_BATCH {
            tx.send(()).unwrap();
        }
        assert_eq!(
            engine.wait_timeout(run, Duration::from_secs(20)).unwrap(),
            Some(RunOutcome::Completed)
        );
        assert!(!stranded, "closing left a task held or in the inbox");
    }
}
