//! `Core`: the state every engine thread shares (ring, tensor map, alloc registry, inbox,
//! registry, worker table, counters).

use std::time::Duration;

use crossbeam_utils::CachePadded;

use simpler_ring::Ring;
use simpler_tensormap::TensorMap;
use simpler_types::{
    CallConfig, CancelReason, RingIndex, RunFailure, SlotId, TaskId, WorkerId, WorkerRef,
    WorkerType,
};

use crate::endpoint::quietly;
use crate::endpoint_thread::Mailbox;
use crate::graph::GraphScratch;
use crate::held_ready::HeldReady;
use crate::inbox::{IdleDriver, Inbox, WorkerSlot};
use crate::registry::Registry;
use crate::run_record::AbortCheck;
use crate::scheduler::SchedState;
use crate::slot::TaskSlot;
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Mutex, Ordering, Signal};

/// One registered endpoint, as the engine's threads see it.
pub(crate) struct WorkerInfo {
    /// How errors and traces name it.
    pub(crate) worker: WorkerRef,
    /// The endpoint's own name.
    pub(crate) name: String,
    /// Its dispatch and control-job FIFO (padded: each is written by its own worker).
    pub(crate) mailbox: CachePadded<Mailbox>,
    /// Ready singles queued for it, as of the scheduler's last pass. Writer: the scheduler.
    /// Reader: `Engine::stats`.
    pub(crate) queued: AtomicU32,
}

/// Monotonic counters. Single-writer counters are written by the scheduler only.
#[derive(Default)]
pub(crate) struct Counters {
    /// Scheduler loop iterations that took events (writer: scheduler).
    pub(crate) iterations: AtomicU64,
    /// Members dispatched (writer: scheduler).
    pub(crate) dispatched: AtomicU64,
    /// Completions processed (writer: scheduler).
    pub(crate) completions: AtomicU64,
    /// Slots reclaimed (writers: every reclaimer).
    pub(crate) reclaimed: AtomicU64,
    /// Runs admitted (writer: `begin_run`).
    pub(crate) runs_begun: AtomicU64,
    /// Ready groups queued at the last pass (writer: scheduler).
    pub(crate) queued_groups: AtomicU32,
    /// Ready SUB tasks queued at the last pass (writer: scheduler).
    pub(crate) queued_sub: AtomicU32,
}

/// Shared engine state.
pub(crate) struct Core {
    /// Level label (3 = L3, ≥ 4 = L4+).
    pub(crate) level: u8,
    /// Task window and heap rings.
    pub(crate) ring: Ring<TaskSlot>,
    /// `(run, buffer) → producers`.
    pub(crate) tensor_map: TensorMap,
    /// Events left for the scheduler lock's holder.
    pub(crate) inbox: CachePadded<Inbox>,
    /// The scheduler's queues; a pass runs on whichever thread holds this lock.
    pub(crate) sched: CachePadded<Mutex<SchedState>>,
    /// Wakes the scheduler thread (stop, stall deadlines); consumed by each wait.
    pub(crate) attention: Signal,
    /// Runs, admission, building mark.
    pub(crate) registry: Registry,
    /// NEXT_LEVEL endpoints in registration order.
    pub(crate) next_level: Vec<WorkerInfo>,
    /// SUB endpoints in registration order (their ids are their indices).
    pub(crate) sub: Vec<WorkerInfo>,
    /// `(stable id, registration index)` of NEXT_LEVEL workers, sorted by id.
    next_level_ids: Vec<(WorkerId, u32)>,
    /// How long a blocked group may hold idle targets before a warning.
    pub(crate) stall_warn_after: Duration,
    /// The configuration of every task submitted without a custom one (SUB tasks always).
    pub(crate) default_config: CallConfig,
    /// Statistics (padded: written on every pass).
    pub(crate) counters: CachePadded<Counters>,
    /// Held by an endpoint thread that spins for mail and runs the passes of tasks published
    /// ready meanwhile (padded: touched by ready submits and by idle endpoint threads).
    pub(crate) idle_driver: CachePadded<IdleDriver>,
    /// Ready tasks the submitting thread holds (padded: the submitter's lock, taken on every
    /// held task).
    pub(crate) held_ready: CachePadded<HeldReady>,
    /// Set once by shutdown step 1. Readers: every submit and alloc, lock-free.
    pub(crate) stopping: AtomicBool,
    /// Set once, when the scheduler thread has left its loop.
    pub(crate) scheduler_exit: Signal,
}

/// Everything `Core::new` needs besides the ring.
pub(crate) struct CoreParts {
    pub(crate) level: u8,
    pub(crate) next_level: Vec<(WorkerRef, String)>,
    pub(crate) sub: Vec<(WorkerRef, String)>,
    pub(crate) stall_warn_after: Duration,
    pub(crate) registry: Registry,
}

impl Core {
    /// Assembles the shared state; worker ids must already be validated as distinct.
    pub(crate) fn new(ring: Ring<TaskSlot>, parts: CoreParts) -> Core {
        let info = |(worker, name): (WorkerRef, String)| WorkerInfo {
            worker,
            name,
            mailbox: CachePadded::new(Mailbox::default()),
            queued: AtomicU32::new(0),
        };
        let next_level: Vec<WorkerInfo> = parts.next_level.into_iter().map(info).collect();
        let mut next_level_ids: Vec<(WorkerId, u32)> =
            next_level.iter().enumerate().map(|(i, w)| (w.worker.id, i as u32)).collect();
        next_level_ids.sort_unstable();
        Core {
            level: parts.level,
            ring,
            tensor_map: TensorMap::new(),
            inbox: CachePadded::new(Inbox::default()),
            sched: CachePadded::new(Mutex::new(SchedState::new(next_level.len(), parts.sub.len()))),
            attention: Signal::default(),
            registry: parts.registry,
            next_level,
            sub: parts.sub.into_iter().map(info).collect(),
            next_level_ids,
            stall_warn_after: parts.stall_warn_after,
            default_config: CallConfig::default(),
            counters: CachePadded::new(Counters::default()),
            idle_driver: CachePadded::new(IdleDriver::default()),
            held_ready: CachePadded::new(HeldReady::default()),
            stopping: AtomicBool::new(false),
            scheduler_exit: Signal::default(),
        }
    }

    /// Registration index of the NEXT_LEVEL worker with stable id `id`.
    pub(crate) fn next_level_index(&self, id: WorkerId) -> Option<u32> {
        self.next_level_ids
            .binary_search_by_key(&id, |&(w, _)| w)
            .ok()
            .map(|i| self.next_level_ids[i].1)
    }

    /// Whether `[addr, addr + size)` (at least its first byte) reaches into one of the heap
    /// rings.
    pub(crate) fn touches_heap(&self, addr: u64, size: u64) -> bool {
        let end = addr.saturating_add(size.max(1));
        RingIndex::all()
            .filter_map(|r| self.ring.heap_region(r))
            .any(|h| addr < h.base.saturating_add(h.len) && h.base < end)
    }

    /// The worker a completion or dispatch names.
    pub(crate) fn worker(&self, who: WorkerSlot) -> &WorkerInfo {
        match who {
            WorkerSlot::NextLevel(i) => &self.next_level[i as usize],
            WorkerSlot::Sub(i) => &self.sub[i as usize],
        }
    }

    /// The mailbox of `who`.
    pub(crate) fn mailbox(&self, who: WorkerSlot) -> &Mailbox {
        &self.worker(who).mailbox
    }

    /// The worker a user-facing reference names.
    pub(crate) fn find_worker(&self, worker: WorkerRef) -> Option<WorkerSlot> {
        match worker.ty {
            WorkerType::NextLevel => self.next_level_index(worker.id).map(WorkerSlot::NextLevel),
            WorkerType::Sub => {
                (worker.id.0 < self.sub.len() as u32).then_some(WorkerSlot::Sub(worker.id.0))
            }
        }
    }

    /// The task of a live slot.
    pub(crate) fn task_of(&self, id: SlotId) -> Option<TaskId> {
        let slot = self.ring.slot(id)?;
        let s = slot.sync.lock();
        s.head.filter(|h| h.id == id).map(|h| h.task)
    }

    /// Whether shutdown has begun.
    pub(crate) fn is_stopping(&self) -> bool {
        // Acquire pairs with the Release store in shutdown step 1; nothing else is read based
        // on it, so this only needs to see the flag eventually and never "un-see" it.
        self.stopping.load(Ordering::Acquire)
    }

    /// Engine poisoning (`docs/engine-protocols.md` §5): every non-terminal run fails now with an
    /// internal error, its unstarted tasks are cancelled, and `begin_run` refuses new runs.
    ///
    /// The failure is recorded before the cancellation, so a fence that the cancellation fires
    /// reports it; the cancellation comes before the outcome is published, so no task of a run
    /// whose waiter saw it fail is dispatched afterwards (a task claimed for dispatch before
    /// it counts as started, as under an abort).
    ///
    /// Never unwinds: it runs on whichever thread caught the panic (an endpoint thread, the
    /// scheduler thread), which must go on serving, so the runs fail before anything is logged,
    /// a cancellation that panics (the engine's state may be what is broken) is skipped, and a
    /// tracing layer that panics on the report is ignored.
    #[cold]
    pub(crate) fn poison(&self, message: &str) {
        for run in self.registry.poison() {
            let failure = RunFailure::Internal {
                run: run.id,
                message: format!("engine poisoned: {message}"),
            };
            // A terminal run (registered until its release) keeps its outcome.
            if run.mark_aborted(failure.clone(), false) != AbortCheck::Marked {
                continue;
            }
            let cancelled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let reason = CancelReason::EnginePoisoned;
                self.cancel_run(&run, reason, false, &mut GraphScratch::default());
            }));
            if let Err(payload) = cancelled {
                crate::endpoint::drop_quietly(payload);
            }
            run.force_failed(failure);
        }
        quietly(|| tracing::error!(level = self.level, "engine poisoned: {message}"));
    }
}

#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use tracing_subscriber::layer::SubscriberExt;

    use simpler_types::{CallConfig, TaskArgs, TaskState, WorkerId};

    use crate::outcome::RunOutcome;
    use crate::scheduler::tests::{chip, gated_engine, one_running_task, wait_until};

    /// A tracing layer that panics on every event, after noting that it saw one.
    struct PanicsOnEvent(Arc<AtomicBool>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PanicsOnEvent {
        fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            self.0.store(true, Ordering::Relaxed);
            panic!("deliberate: the subscriber panics");
        }
    }

    #[test]
    fn poisoning_fails_every_run_and_never_unwinds_even_when_the_subscriber_panics() {
        let (engine, tx) = gated_engine();
        let (run, _) = one_running_task(&engine);
        let seen = Arc::new(AtomicBool::new(false));
        let subscriber = tracing_subscriber::registry().with(PanicsOnEvent(Arc::clone(&seen)));
        let unwound = tracing::subscriber::with_default(subscriber, || {
            // Another test's thread without a subscriber may have cached the log call's
            // interest as "never"; ask again so that the event reaches this layer.
            tracing::callsite::rebuild_interest_cache();
            let poison = || engine.core().poison("deliberate");
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(poison)).is_err()
        });
        assert!(seen.load(Ordering::Relaxed), "the report never reached the panicking layer");
        assert!(!unwound, "poisoning unwound into the thread that caught the engine's panic");
        assert!(engine.is_poisoned());
        assert!(matches!(engine.wait(run).unwrap(), RunOutcome::Failed(_)));
        tx.send(()).unwrap();
    }

    #[test]
    fn poisoning_cancels_the_unstarted_tasks_so_none_runs_after_its_run_was_reported_failed() {
        // t1 runs on the gate; t2, on the same endpoint, waits its turn in the queue. Once the
        // waiter has seen the run fail, t2 must never reach the endpoint, not even on the pass
        // that takes t1's completion.
        let (engine, tx) = gated_engine();
        let cfg = CallConfig::default();
        let mut b = engine.begin_run().unwrap();
        let t1 = b.submit_next_level(&chip(), TaskArgs::new(), &cfg, WorkerId(0), None).unwrap();
        let t2 = b.submit_next_level(&chip(), TaskArgs::new(), &cfg, WorkerId(0), None).unwrap();
        let run = b.close();
        wait_until(|| engine.task_snapshot(t1).unwrap().state == TaskState::Running);
        assert_eq!(engine.task_snapshot(t2).unwrap().state, TaskState::Ready);
        engine.core().poison("deliberate");
        let RunOutcome::Failed(failure) = engine.wait(run).unwrap() else {
            panic!("a poisoned run completed")
        };
        assert!(failure.to_string().contains("engine poisoned"), "{failure}");
        // Cancelled, and reclaimed at once (its run holds no scope over it any more).
        let t2_now = engine.task_snapshot(t2).unwrap().state;
        assert!(
            matches!(t2_now, TaskState::Failed | TaskState::Consumed),
            "the queued task was left dispatchable: {t2_now:?}"
        );
        tx.send(()).unwrap();
        wait_until(|| engine.stats().completions == 1);
        assert_eq!(engine.stats().dispatched, 1, "t2 was dispatched after its run failed");
        // A spare token, so that a wrongly dispatched t2 cannot hold the gate.
        tx.send(()).unwrap();
    }
}
