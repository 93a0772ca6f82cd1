//! `TaskSlot`: the per-task payload stored in each task-window entry (`docs/engine-protocols.md`
//! §1).
//!
//! A slot has three parts, each with its own access rule:
//!
//! | Part | Writers → readers |
//! |---|---|
//! | [`StateWord`] (state + occupant generation, one atomic) | the transitions of `task_protocol` →
//! everyone, lock-free |
//! | `sync: Mutex<SlotSync>` (counts, edges, failure, group bookkeeping, run) | any thread, only
//! under the lock |
//! | `payload: RwLock<Payload>` (callable, config, member arguments and targets, output keys) | the
//! orchestration thread while the slot is `Building` (or before an alloc slot is visible) and the
//! reclaimer → workers and the scheduler (shared reads, never contended by a writer) |
//!
//! The payload sits behind a reader-writer lock only because this crate has no `unsafe`: it is
//! written before publication and after reclamation, and read in between, so its lock is never
//! contended on the hot path. Workers hold a read guard while their endpoint runs, which is why
//! the arguments need no copy.
//!
//! Slots are recycled: resetting one clears its vectors but keeps their capacity, so a steady
//! stream of tasks allocates nothing per task.

use std::sync::Arc;

use smallvec::SmallVec;

use simpler_tensormap::{Access, TensorKey};
use simpler_types::{
    CallConfig, CallableId, CallableKind, CallableNamespace, GroupMemberState, SlotId, TaskArgs,
    TaskArgsView, TaskFailure, TaskId, TaskState, Tensor, TensorArgType, WorkerType,
};

use crate::outcome::TaskSnapshot;
use crate::run_record::RunRecord;
use crate::sync::{AtomicU64, Mutex, Ordering, RwLock};

/// The pseudo-callable recorded for `alloc()` buffers, which never run.
pub(crate) const ALLOC_CALLABLE: CallableId =
    CallableId::new([0; 32], CallableKind::Host, CallableNamespace::LocalHost);

/// Where a ready task is queued.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Route {
    /// Never queued (`alloc()` buffers).
    #[default]
    Unrouted,
    /// A NEXT_LEVEL single, on the worker with this registration index.
    Single {
        /// Registration index of the target.
        worker: u32,
    },
    /// A NEXT_LEVEL group (targets in the payload).
    Group,
    /// A SUB task of `size` members.
    Sub {
        /// Members, each needing a distinct idle SUB worker.
        size: u32,
    },
}

/// One dependency edge as seen from one end: the slot at the other end and its task id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Edge {
    /// The other slot.
    pub(crate) slot: SlotId,
    /// The other slot's task, for introspection after that slot is reclaimed.
    pub(crate) task: TaskId,
}

/// A task state tagged with the generation of the occupant it describes, in one atomic word:
/// bits 0..8 hold the [`TaskState`], bits 8..40 the generation.
///
/// Tagging closes the ABA window of lock-free claims: a stale queue entry's compare-and-swap
/// names the old generation and therefore fails against a recycled entry (decision: a bare
/// `AtomicU8` state would let such a claim succeed).
///
/// Writers: the transitions in `task_protocol` (under the slot lock, except the dispatch claim
/// `Ready → Running`, a lock-free compare-and-swap by the scheduler). Readers: anyone.
#[derive(Default, Debug)]
pub(crate) struct StateWord(AtomicU64);

impl StateWord {
    fn pack(id: SlotId, state: TaskState) -> u64 {
        (u64::from(id.generation) << 8) | u64::from(state.as_u8())
    }

    /// The state of occupant `id`; `None` if the entry now belongs to another generation.
    pub(crate) fn get(&self, id: SlotId) -> Option<TaskState> {
        // Acquire pairs with the Release of every transition, so a reader that sees a state also
        // sees the writes that preceded it (for a lock-free reader: the published payload).
        let word = self.0.load(Ordering::Acquire);
        if (word >> 8) as u32 != id.generation {
            return None;
        }
        TaskState::from_u8(word as u8)
    }

    /// Sets the state of occupant `id` unconditionally (initialization, and transitions made
    /// under the slot lock that no lock-free writer can race).
    pub(crate) fn set(&self, id: SlotId, state: TaskState) {
        // Release publishes the writes before the transition to Acquire readers.
        self.0.store(Self::pack(id, state), Ordering::Release);
    }

    /// Compare-and-swap `from → to` for occupant `id`.
    pub(crate) fn transition(&self, id: SlotId, from: TaskState, to: TaskState) -> bool {
        // AcqRel: the winner both publishes its prior writes and observes the previous
        // transition's writes. Exactly one of two racing claims (dispatch vs failure) wins.
        self.0
            .compare_exchange(
                Self::pack(id, from),
                Self::pack(id, to),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }
}

/// Identity of a slot's current occupant.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Head {
    /// The occupant's slot id (generation included).
    pub(crate) id: SlotId,
    /// Its task id.
    pub(crate) task: TaskId,
    /// What it runs ([`ALLOC_CALLABLE`] for allocs).
    pub(crate) callable: CallableId,
}

/// Everything about a slot that changes after publication, guarded by the slot lock.
#[derive(Default)]
pub(crate) struct SlotSync {
    /// The occupant; `None` while free or once consumed. Every lock holder compares it with the
    /// id it was given (the generation re-check, `docs/ring.md` §1).
    pub(crate) head: Option<Head>,
    /// The run the slot is charged to; moved out by the reclaimer.
    pub(crate) run: Option<Arc<RunRecord>>,
    /// Where the task is queued when ready.
    pub(crate) route: Route,
    /// Whether the task left reader entries in the tensor map, which the pass that processes
    /// its finish retires (set at publication; most tasks read nothing and skip that step).
    pub(crate) reads: bool,
    /// Whether the slot is an `alloc()` buffer.
    pub(crate) is_alloc: bool,
    /// Live producers counted at publication.
    pub(crate) fanin_count: u32,
    /// Producer completions counted so far (may run ahead of publication).
    pub(crate) fanin_released: u32,
    /// Producers this task holds a reference on.
    pub(crate) producers: Vec<Edge>,
    /// Consumers that hold a reference on this task.
    pub(crate) consumers: Vec<Edge>,
    /// References to wait for: 1 (scope) + attached consumers.
    pub(crate) fanout_total: u32,
    /// References released: self, scope, one per finished consumer.
    pub(crate) fanout_released: u32,
    /// The task's failure, once `Failed`.
    pub(crate) failure: Option<Arc<TaskFailure>>,
    /// A failure claim made while the slot was `Building` left the propagation to the
    /// submitter (or to cancellation once submission is closed).
    pub(crate) propagation_owed: bool,
    /// Per-member states (one entry for a single task).
    pub(crate) members: SmallVec<[GroupMemberState; 4]>,
    /// Members in a terminal state.
    pub(crate) members_terminal: u32,
    /// The first member failure of a running task.
    pub(crate) first_failure: Option<Arc<TaskFailure>>,
}

impl SlotSync {
    /// Whether `id` names the current occupant.
    pub(crate) fn is(&self, id: SlotId) -> bool {
        self.head.is_some_and(|h| h.id == id)
    }

    /// Clears everything, keeping vector capacities.
    pub(crate) fn clear(&mut self) {
        self.head = None;
        self.run = None;
        self.route = Route::Unrouted;
        self.reads = false;
        self.is_alloc = false;
        self.fanin_count = 0;
        self.fanin_released = 0;
        self.producers.clear();
        self.consumers.clear();
        self.fanout_total = 0;
        self.fanout_released = 0;
        self.failure = None;
        self.propagation_owed = false;
        self.members.clear();
        self.members_terminal = 0;
        self.first_failure = None;
    }
}

/// Where one member's arguments sit in the payload's flat vectors, and where it runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MemberSpan {
    /// First tensor of the member in `Payload::tensors`.
    pub(crate) tensors_from: u32,
    /// One past its last tensor.
    pub(crate) tensors_to: u32,
    /// First scalar of the member in `Payload::scalars`.
    pub(crate) scalars_from: u32,
    /// One past its last scalar.
    pub(crate) scalars_to: u32,
    /// Registration index of the NEXT_LEVEL target (unused for SUB members).
    pub(crate) target: u32,
}

/// What the slot's task runs, immutable between publication and reclamation.
///
/// Member arguments are stored flattened (tensors, their tags and scalars of every member, in
/// member order) in vectors that keep their capacity across occupants. This keeps a slot small,
/// which matters because a run may hold hundreds of thousands of slots live and every stage of a
/// task's life touches its slot. Tags are kept so that an endpoint sees the tags its caller
/// passed.
#[derive(Default)]
pub(crate) struct Payload {
    /// The occupant (checked by readers against the id they were given).
    pub(crate) id: Option<SlotId>,
    /// Its task id.
    pub(crate) task: Option<TaskId>,
    /// What it runs.
    pub(crate) callable: Option<CallableId>,
    /// Queue family; `None` for allocs.
    pub(crate) worker_type: Option<WorkerType>,
    /// Tensors of every member.
    pub(crate) tensors: Vec<Tensor>,
    /// One tag per entry of `tensors`. Up to four are stored in the slot itself, like the first
    /// key of each journal below: a small task's submit then touches no heap line for them,
    /// which at 100 000 live tasks is a cache miss each (`docs/decisions/sched.md`, "Small
    /// slots"), unless the slot once held a larger task (a list that grew keeps its heap block,
    /// as a vector keeps its capacity). The slot stays at eight cache lines.
    pub(crate) tags: SmallVec<[TensorArgType; 4]>,
    /// Scalars of every member.
    pub(crate) scalars: Vec<u64>,
    /// One span per member.
    pub(crate) members: SmallVec<[MemberSpan; 1]>,
    /// The task's configuration when it is not the default one. The box is kept across
    /// occupants (like a vector's capacity), so a steady stream of tasks with a custom
    /// configuration allocates nothing.
    config: Option<Box<CallConfig>>,
    /// Whether `config` holds this occupant's configuration (otherwise it is the default).
    custom_config: bool,
    /// Keys this task recorded in the tensor map as a writer (journal for the owner-checked
    /// erase at reclamation).
    pub(crate) map_keys: SmallVec<[TensorKey; 1]>,
    /// Keys this task recorded as a reader. Their entries go when the task finishes
    /// (`Core::retire_reads`, which then empties this list), or at reclamation for a task that
    /// never finished, so a finished reader's reclamation does not look its keys up again.
    pub(crate) read_keys: SmallVec<[TensorKey; 1]>,
}

impl Payload {
    /// Clears everything, keeping vector capacities and the configuration box.
    pub(crate) fn clear(&mut self) {
        self.id = None;
        self.task = None;
        self.callable = None;
        self.worker_type = None;
        self.tensors.clear();
        self.tags.clear();
        self.scalars.clear();
        self.members.clear();
        self.custom_config = false;
        self.map_keys.clear();
        self.read_keys.clear();
    }

    /// Journals a key the task records in the tensor map, by kind of entry.
    pub(crate) fn journal(&mut self, key: TensorKey, access: Access) {
        match access {
            Access::Read => self.read_keys.push(key),
            Access::Overwrite | Access::Scatter | Access::Update => self.map_keys.push(key),
        }
    }

    /// Appends one member's arguments.
    pub(crate) fn push_member(&mut self, args: &TaskArgs, target: u32) {
        let tensors_from = self.tensors.len() as u32;
        let scalars_from = self.scalars.len() as u32;
        self.tensors.extend_from_slice(args.tensors());
        self.tags.extend_from_slice(args.tags());
        self.scalars.extend_from_slice(args.scalars());
        self.members.push(MemberSpan {
            tensors_from,
            tensors_to: self.tensors.len() as u32,
            scalars_from,
            scalars_to: self.scalars.len() as u32,
            target,
        });
    }

    /// The arguments of member `m`, as endpoints see them.
    pub(crate) fn member_args(&self, m: &MemberSpan) -> TaskArgsView<'_> {
        let tensors = m.tensors_from as usize..m.tensors_to as usize;
        TaskArgsView {
            tensors: self.tensors.get(tensors.clone()).unwrap_or(&[]),
            tags: self.tags.get(tensors).unwrap_or(&[]),
            scalars: self
                .scalars
                .get(m.scalars_from as usize..m.scalars_to as usize)
                .unwrap_or(&[]),
        }
    }

    /// Records the task's configuration (a copy only when it is not the default, which
    /// `Core::default_config` always is).
    pub(crate) fn set_config(&mut self, config: &CallConfig) {
        if config.is_default() {
            self.custom_config = false;
            return;
        }
        match &mut self.config {
            Some(b) => (**b).clone_from(config),
            None => self.config = Some(Box::new(config.clone())),
        }
        self.custom_config = true;
    }

    /// The task's configuration, `default` unless a custom one was recorded.
    pub(crate) fn config<'a>(&'a self, default: &'a CallConfig) -> &'a CallConfig {
        match (&self.config, self.custom_config) {
            (Some(b), true) => b,
            _ => default,
        }
    }
}

/// The payload of one task-window entry.
///
/// Aligned to a cache line so that neighbouring entries, which different threads work on at the
/// same time (a worker completing task i while the orchestration thread wires task i + 1), never
/// share a line; `repr(C)` keeps the state word and the slot lock together in the first line.
/// Measured: without the alignment, taking the lock of a slot just initialized cost most of a
/// publication (the line was being pulled back and forth by the neighbour's worker).
#[derive(Default)]
#[repr(C, align(64))]
pub(crate) struct TaskSlot {
    /// Lifecycle state, tagged with the occupant's generation.
    pub(crate) state: StateWord,
    /// Mutable bookkeeping.
    pub(crate) sync: Mutex<SlotSync>,
    /// Immutable-after-publication task description.
    pub(crate) payload: RwLock<Payload>,
}

impl TaskSlot {
    /// Introspection of occupant `id` (task `task`); a slot that no longer holds it reports the
    /// task as `Consumed`.
    pub(crate) fn snapshot(&self, id: SlotId, task: TaskId) -> TaskSnapshot {
        let s = self.sync.lock();
        if !s.is(id) {
            return TaskSnapshot::consumed(task);
        }
        let state = self.state.get(id).unwrap_or(TaskState::Consumed);
        let mut members = s.members.to_vec();
        // A single's dispatch claims the slot lock-free and leaves its one member's state to the
        // completion (no slot lock on the hot path): while the task runs, so does the member.
        if state == TaskState::Running
            && let [m @ GroupMemberState::NotDispatched] = members.as_mut_slice()
        {
            *m = GroupMemberState::Running;
        }
        TaskSnapshot {
            task,
            state,
            worker_type: match s.route {
                Route::Unrouted => None,
                Route::Single { .. } | Route::Group => Some(WorkerType::NextLevel),
                Route::Sub { .. } => Some(WorkerType::Sub),
            },
            is_alloc: s.is_alloc,
            fanin_count: s.fanin_count,
            fanin_released: s.fanin_released,
            producers: s.producers.iter().map(|e| e.task).collect(),
            consumers: s.consumers.iter().map(|e| e.task).collect(),
            fanout_total: s.fanout_total,
            fanout_released: s.fanout_released,
            members,
            failure: s.failure.clone(),
        }
    }
}

#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use super::TaskSlot;

    #[test]
    fn a_slot_fits_in_eight_cache_lines() {
        // Every live task holds one; a larger slot costs P1 more than it saves (see the
        // decisions record, "Small slots").
        let size = size_of::<TaskSlot>();
        assert!(size <= 512, "a task slot takes {size} bytes");
    }
}
