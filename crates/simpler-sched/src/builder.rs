//! `RunBuilder`: the one live orchestration of an engine — submits, `alloc()`, scopes, close
//! and fail (`docs/engine-protocols.md` §2, §3).
//!
//! The builder owns the orchestrator state (scope stack and scratch buffers) while it lives:
//! admission hands it over together with the building mark, and `close`, `fail` or `Drop` hand
//! it back, so submits take no lock for it. The builder borrows the engine, so the engine cannot
//! be dropped under it; `Engine::shutdown(&self)` may still run on another thread, after which
//! submits return `ShuttingDown` and `close`/`fail` stay harmless.
//!
//! # Scope references
//!
//! Every task and alloc is registered in the innermost scope frame when it is charged, which
//! accounts for its scope reference (`fanout_total` starts at 1). `scope_end` releases one
//! reference on each task of the popped frame; `close` and `fail` pop every frame, innermost
//! first, the run's outer frame last (decision: the original left the run's frame open whenever
//! a user scope was left open, so the fence never fired).

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use simpler_ring::{Allocation, RingError, ScopeStack};
use simpler_tensormap::{ByteSpan, TensorKey, footprint};
use simpler_types::{
    CallConfig, CallableId, CancelReason, DataType, MAX_TENSOR_DIMS, RunFailure, RunId, RunStatus,
    SlotId, TaskArgs, TaskId, Tensor, WorkerId,
};

use crate::core::Core;
use crate::engine::Engine;
use crate::error::SchedError;
use crate::graph::GraphScratch;
use crate::held_ready::Holding;
use crate::run_record::RunRecord;
use crate::slot::{ALLOC_CALLABLE, Edge, Head};
use crate::submit::{Eligible, Placement, Tracked};

/// Orchestrator state that outlives one run: the scope stack and reusable scratch buffers.
#[derive(Default)]
pub(crate) struct OrchState {
    /// Scope frames of the building run.
    pub(crate) scopes: ScopeStack,
    /// Tasks and allocs charged so far in the building run.
    pub(crate) issued: u32,
    /// Ready tasks held while the threads that could run them are awake (`held_ready`).
    pub(crate) holding: Holding,
    /// Footprint of every tensor of the current submit, members flattened.
    pub(crate) footprints: Vec<Option<(TensorKey, ByteSpan)>>,
    /// The current submit's tracked accesses, in argument order: what its lookups and records
    /// walk, derived once by validation.
    pub(crate) tracked: Vec<Tracked>,
    /// Producers found for the current submit.
    pub(crate) producers: Vec<SlotId>,
    /// Producers only a blind write of the current submit found (tasks that read what it
    /// writes): one that finished needs no edge.
    pub(crate) overwritten: Vec<SlotId>,
    /// Producers the current submit attached to.
    pub(crate) attached: Vec<Edge>,
    /// Registration indices of the current submit's targets.
    pub(crate) targets: SmallVec<[u32; 4]>,
    /// Slots whose references are to be released.
    pub(crate) released: Vec<SlotId>,
    /// Work lists for failures and cancellation.
    pub(crate) graph: GraphScratch,
    /// The building run's `alloc()` buffers whose scope is open: base address → the buffer's
    /// slot (its creator, which that scope keeps from being reclaimed) and bytes.
    pub(crate) open_allocs: FxHashMap<u64, (SlotId, u64)>,
    /// The same buffers with the depth of the scope frame they belong to, in allocation
    /// order, so that a scope's end closes its own.
    pub(crate) alloc_frames: Vec<(usize, u64)>,
}

/// The live orchestration of one run. `!Sync`; borrows the engine.
///
/// Dropping it without [`close`](RunBuilder::close) or [`fail`](RunBuilder::fail) fails the
/// run with "run builder dropped without close" ("orchestration panicked" while unwinding).
pub struct RunBuilder<'e> {
    pub(crate) engine: &'e Engine,
    pub(crate) run: Arc<RunRecord>,
    pub(crate) orch: Box<OrchState>,
    finished: bool,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for RunBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunBuilder")
            .field("run", &self.run.id)
            .field("scope_depth", &self.orch.scopes.depth())
            .finish_non_exhaustive()
    }
}

impl<'e> RunBuilder<'e> {
    /// Starts building `run`: opens its outer scope (depth 1).
    pub(crate) fn new(engine: &'e Engine, run: Arc<RunRecord>, mut orch: Box<OrchState>) -> Self {
        orch.issued = 0;
        orch.open_allocs.clear();
        orch.alloc_frames.clear();
        debug_assert_eq!(orch.scopes.depth(), 0, "scope stack leaked from an earlier run");
        // Depth 0 → 1 cannot exceed the limit.
        let _ = orch.scopes.begin();
        RunBuilder { engine, run, orch, finished: false, _not_sync: PhantomData }
    }

    pub(crate) fn core(&self) -> &'e Core {
        self.engine.core()
    }

    /// The run's id.
    pub fn id(&self) -> RunId {
        self.run.id
    }

    /// A snapshot of the run's status.
    pub fn status(&self) -> RunStatus {
        crate::engine::status_of(&self.run)
    }

    /// Submits a single NEXT_LEVEL task to worker `target` (its stable id). `eligible`, when
    /// given, must contain `target`.
    ///
    /// ```
    /// # use simpler_sched::{
    /// #     CallConfig, CallableId, CallableKind, DispatchedMember, Endpoint, EndpointCaps,
    /// #     EndpointFailure, Engine, EngineConfig, TaskArgs, WorkerId, WorkerType,
    /// # };
    /// # struct Child(u32);
    /// # impl Endpoint for Child {
    /// #     fn caps(&self) -> EndpointCaps {
    /// #         let name = format!("child {}", self.0);
    /// #         EndpointCaps { worker_type: WorkerType::NextLevel, id: WorkerId(self.0), remote: false, name }
    /// #     }
    /// #     fn run(&mut self, _: DispatchedMember<'_>) -> Result<(), EndpointFailure> { Ok(()) }
    /// # }
    /// // An L4 engine over two child workers, which run graph callables.
    /// let engine = Engine::start(EngineConfig {
    ///     level: 4,
    ///     next_level: vec![Box::new(Child(0)), Box::new(Child(1))],
    ///     ..EngineConfig::default()
    /// })?;
    /// let step = CallableId::host_named("step", CallableKind::Graph);
    /// let mut run = engine.begin_run()?;
    /// run.submit_next_level(&step, TaskArgs::new(), &CallConfig::default(), WorkerId(1), None)?;
    /// let id = run.close();
    /// engine.wait(id)?.into_result()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn submit_next_level(
        &mut self,
        callable: &CallableId,
        args: TaskArgs,
        config: &CallConfig,
        target: WorkerId,
        eligible: Option<&[WorkerId]>,
    ) -> Result<TaskId, SchedError> {
        let eligible = eligible.map_or(Eligible::Any, Eligible::One);
        self.submit(
            callable,
            std::slice::from_ref(&args),
            Some(config),
            Placement::NextLevel { targets: std::slice::from_ref(&target), eligible },
        )
    }

    /// Submits a NEXT_LEVEL group: member i runs on `targets[i]`; all members are dispatched
    /// together or not at all.
    ///
    /// ```
    /// # use simpler_sched::{
    /// #     CallConfig, CallableId, CallableKind, DispatchedMember, Endpoint, EndpointCaps,
    /// #     EndpointFailure, Engine, EngineConfig, TaskArgs, WorkerId, WorkerType,
    /// # };
    /// # struct Child(u32);
    /// # impl Endpoint for Child {
    /// #     fn caps(&self) -> EndpointCaps {
    /// #         let name = format!("child {}", self.0);
    /// #         EndpointCaps { worker_type: WorkerType::NextLevel, id: WorkerId(self.0), remote: false, name }
    /// #     }
    /// #     fn run(&mut self, _: DispatchedMember<'_>) -> Result<(), EndpointFailure> { Ok(()) }
    /// # }
    /// // An L4 engine over two child workers, which run graph callables.
    /// let engine = Engine::start(EngineConfig {
    ///     level: 4,
    ///     next_level: vec![Box::new(Child(0)), Box::new(Child(1))],
    ///     ..EngineConfig::default()
    /// })?;
    /// let step = CallableId::host_named("step", CallableKind::Graph);
    /// let mut run = engine.begin_run()?;
    /// let members = vec![TaskArgs::new(), TaskArgs::new()];
    /// let targets = [WorkerId(0), WorkerId(1)];
    /// run.submit_next_level_group(&step, members, &CallConfig::default(), &targets, None)?;
    /// let id = run.close();
    /// engine.wait(id)?.into_result()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit_next_level_group(
        &mut self,
        callable: &CallableId,
        args: Vec<TaskArgs>,
        config: &CallConfig,
        targets: &[WorkerId],
        eligible: Option<&[Vec<WorkerId>]>,
    ) -> Result<TaskId, SchedError> {
        let eligible = eligible.map_or(Eligible::Any, Eligible::PerMember);
        self.submit(callable, &args, Some(config), Placement::NextLevel { targets, eligible })
    }

    /// Submits a single SUB task (any idle SUB worker; default configuration).
    ///
    /// ```
    /// # use simpler_sched::{
    /// #     CallableId, CallableKind, DispatchedMember, Endpoint, EndpointCaps, EndpointFailure,
    /// #     Engine, EngineConfig, TaskArgs, WorkerId, WorkerType,
    /// # };
    /// # struct Sub(u32);
    /// # impl Endpoint for Sub {
    /// #     fn caps(&self) -> EndpointCaps {
    /// #         let name = format!("sub {}", self.0);
    /// #         EndpointCaps { worker_type: WorkerType::Sub, id: WorkerId(self.0), remote: false, name }
    /// #     }
    /// #     fn run(&mut self, _: DispatchedMember<'_>) -> Result<(), EndpointFailure> { Ok(()) }
    /// # }
    /// // Two sub workers (host closures, here endpoints that accept every task).
    /// let engine = Engine::start(EngineConfig {
    ///     sub: vec![Box::new(Sub(0)), Box::new(Sub(1))],
    ///     ..EngineConfig::default()
    /// })?;
    /// let check = CallableId::host_named("check", CallableKind::Host);
    /// let mut run = engine.begin_run()?;
    /// run.submit_sub(&check, TaskArgs::new())?;
    /// let id = run.close();
    /// engine.wait(id)?.into_result()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn submit_sub(
        &mut self,
        callable: &CallableId,
        args: TaskArgs,
    ) -> Result<TaskId, SchedError> {
        self.submit(callable, std::slice::from_ref(&args), None, Placement::Sub)
    }

    /// Submits a SUB group: each member on a distinct idle SUB worker, all at once.
    ///
    /// ```
    /// # use simpler_sched::{
    /// #     CallableId, CallableKind, DispatchedMember, Endpoint, EndpointCaps, EndpointFailure,
    /// #     Engine, EngineConfig, TaskArgs, WorkerId, WorkerType,
    /// # };
    /// # struct Sub(u32);
    /// # impl Endpoint for Sub {
    /// #     fn caps(&self) -> EndpointCaps {
    /// #         let name = format!("sub {}", self.0);
    /// #         EndpointCaps { worker_type: WorkerType::Sub, id: WorkerId(self.0), remote: false, name }
    /// #     }
    /// #     fn run(&mut self, _: DispatchedMember<'_>) -> Result<(), EndpointFailure> { Ok(()) }
    /// # }
    /// // Two sub workers (host closures, here endpoints that accept every task).
    /// let engine = Engine::start(EngineConfig {
    ///     sub: vec![Box::new(Sub(0)), Box::new(Sub(1))],
    ///     ..EngineConfig::default()
    /// })?;
    /// let check = CallableId::host_named("check", CallableKind::Host);
    /// let mut run = engine.begin_run()?;
    /// run.submit_sub_group(&check, vec![TaskArgs::new(); 2])?;
    /// let id = run.close();
    /// engine.wait(id)?.into_result()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit_sub_group(
        &mut self,
        callable: &CallableId,
        args: Vec<TaskArgs>,
    ) -> Result<TaskId, SchedError> {
        self.submit(callable, &args, None, Placement::Sub)
    }

    /// Allocates a host buffer of `shape` × `dtype` from the heap ring of the current scope
    /// depth and returns a contiguous tensor over it (`docs/engine-protocols.md` §3).
    ///
    /// The slab stays allocated until its scope ends and every task that touched the buffer
    /// under any tag has finished. A shape with a zero extent returns a null tensor, which any
    /// tag accepts, and allocates nothing. Blocks while the ring is full, up to the ring's
    /// deadline.
    pub fn alloc(&mut self, shape: &[u32], dtype: DataType) -> Result<Tensor, SchedError> {
        let core = self.core();
        self.check_open()?;
        if shape.is_empty() || shape.len() > MAX_TENSOR_DIMS {
            return Err(SchedError::InvalidShape { dims: shape.len() });
        }
        let overflow = || SchedError::SizeOverflow {
            shape: shape.to_vec(),
            element_size: dtype.element_size(),
        };
        let bytes = shape
            .iter()
            .try_fold(dtype.element_size(), |acc, &d| acc.checked_mul(u64::from(d)))
            .ok_or_else(overflow)?;
        let mut tensor = Tensor::external(0, shape, dtype).map_err(|_| overflow())?;
        if bytes == 0 {
            return Ok(tensor);
        }
        if self.orch.issued == u32::MAX {
            return Err(SchedError::TooManyTasks { run: self.run.id });
        }
        let depth = self.orch.scopes.depth().saturating_sub(1);
        let allocation = self.claim(bytes, depth)?;
        let id = allocation.slot;
        let (Some(heap), Some(slot)) = (allocation.heap, core.ring.slot(id)) else {
            core.ring.release(id);
            return Err(SchedError::Internal {
                message: format!("{id}: slab allocation without a slab"),
            });
        };
        let task = match self.run.charge(id) {
            Ok(task) => task,
            Err(_) => {
                core.ring.release(id);
                return Err(SchedError::TooManyTasks { run: self.run.id });
            }
        };
        self.orch.issued += 1;
        slot.init_alloc(Head { id, task, callable: ALLOC_CALLABLE }, Arc::clone(&self.run));
        self.orch.scopes.register(id);
        tensor.addr = heap.addr;
        let fp = footprint(&tensor, None).ok().flatten();
        {
            let mut payload = slot.payload.write();
            payload.id = Some(id);
            payload.task = Some(task);
            payload.callable = Some(ALLOC_CALLABLE);
            if let Some((key, _)) = fp {
                payload.map_keys.push(key);
            }
        }
        if let Some((key, span)) = fp {
            core.tensor_map.insert(self.run.id, key, span, id);
        }
        let frame = self.orch.scopes.depth();
        self.orch.open_allocs.insert(heap.addr, (id, tensor.size));
        self.orch.alloc_frames.push((frame, heap.addr));
        tracing::trace!(parent: &self.run.span, %task, addr = heap.addr, bytes, "alloc");
        Ok(tensor)
    }

    /// Claims a slot (and a slab for `bytes > 0`) on the ring of scope depth `depth`: without
    /// waiting when there is room, which needs no clock read, otherwise blocking up to the
    /// ring's deadline, after handing over the ready tasks it holds (`held_ready`, step 12: the
    /// space it waits for may be theirs).
    pub(crate) fn claim(&mut self, bytes: u64, depth: usize) -> Result<Allocation, SchedError> {
        let core = self.core();
        if let Ok(allocation) = core.ring.probe_alloc(bytes, depth) {
            return Ok(allocation);
        }
        let orch = &mut *self.orch;
        core.hand_over(&mut orch.holding, &mut orch.graph);
        core.ring.alloc(bytes, depth).map_err(|e| self.alloc_error(e))
    }

    /// Translates a ring allocation error, naming the task whose slab pins the ring's tail.
    pub(crate) fn alloc_error(&self, err: RingError) -> SchedError {
        let oldest = match &err {
            RingError::HeapExhausted(h) => h.oldest_live.and_then(|s| self.core().task_of(s)),
            _ => None,
        };
        SchedError::from_alloc(err, oldest)
    }

    /// Fails with `ShuttingDown` or `RunFailed` when nothing more may be added (fail-fast).
    pub(crate) fn check_open(&self) -> Result<(), SchedError> {
        if self.core().is_stopping() {
            return Err(SchedError::ShuttingDown);
        }
        match self.run.failure() {
            Some(f) => Err(SchedError::RunFailed(f)),
            None => Ok(()),
        }
    }

    /// Opens a user scope. Depth counts the run's outer frame; at most 64 frames.
    pub fn scope_begin(&mut self) -> Result<(), SchedError> {
        self.check_open()?;
        self.orch.scopes.begin().map_err(|e| match e {
            RingError::ScopeDepthExceeded { max } => SchedError::ScopeDepthExceeded { max },
            other => SchedError::Ring(other),
        })
    }

    /// Closes the innermost user scope, releasing one reference on each of its tasks (in
    /// registration order); never waits for them. The run's outer frame cannot be closed here.
    pub fn scope_end(&mut self) -> Result<(), SchedError> {
        if self.orch.scopes.depth() <= 1 {
            return Err(SchedError::ScopeUnderflow);
        }
        let core = self.core();
        let orch = &mut *self.orch;
        let frame = orch.scopes.depth();
        orch.scopes.end_into(&mut orch.released).map_err(|_| SchedError::ScopeUnderflow)?;
        while let Some(&(depth, addr)) = orch.alloc_frames.last()
            && depth >= frame
        {
            orch.alloc_frames.pop();
            orch.open_allocs.remove(&addr);
        }
        core.release_all(&mut orch.released);
        Ok(())
    }

    /// Runs `body` inside a user scope, closing the scope when it returns.
    pub fn scope<R>(&mut self, body: impl FnOnce(&mut Self) -> R) -> Result<R, SchedError> {
        self.scope_begin()?;
        let r = body(self);
        self.scope_end()?;
        Ok(r)
    }

    /// Closes submission (`docs/engine-protocols.md` §2): unwinds every scope (warning if user
    /// scopes were left open), ends the building phase and checks the fence. Returns the run's id
    /// for waiting.
    pub fn close(mut self) -> RunId {
        self.finished = true;
        let core = self.core();
        // Tasks held or left for an idle endpoint thread are dispatched now rather than when it
        // notices (`inbox`, steps 10 and 12): from here on the caller waits for the run, and the
        // bookkeeping below overlaps them.
        let mut orch = std::mem::take(&mut self.orch);
        core.hand_over(&mut orch.holding, &mut orch.graph);
        core.drive();
        let open = orch.scopes.depth().saturating_sub(1);
        drop_run_entries(core, &self.run);
        unwind_all(core, &mut orch);
        core.registry.end_building(self.run.id, orch);
        self.run.close();
        // Last: a tracing layer that panics on the warning finds the run closed and the engine
        // admitting the next one (warned earlier, such a panic left the building mark set).
        if open > 0 {
            tracing::warn!(
                parent: &self.run.span,
                run = %self.run.id,
                "closed with {open} user scope(s) still open; unwound them"
            );
        }
        self.run.id
    }

    /// Fails the submission with `cause` (`docs/engine-protocols.md` §2): records it as the run's
    /// failure (an earlier task failure stays first), cancels every unstarted task, unwinds every
    /// scope, ends the building phase, and only then closes submission and checks the fence, so a
    /// thread that sees the run terminal can begin the next run at once. `wait` then returns
    /// the failure.
    pub fn fail(mut self, cause: impl Into<String>) -> RunId {
        self.fail_inner(cause.into());
        self.run.id
    }

    fn fail_inner(&mut self, message: String) {
        self.finished = true;
        let core = self.core();
        let run = Arc::clone(&self.run);
        // Submission stays open until the building mark is cleared: the fence can then fire
        // no earlier than in `close` below, never while the mark still refuses `begin_run`.
        run.mark_failed(RunFailure::Submission { run: run.id, message });
        let mut orch = std::mem::take(&mut self.orch);
        core.cancel_run(&run, CancelReason::SubmissionFailed, true, &mut orch.graph);
        // Held tasks were cancelled just above; the pass skips them.
        core.hand_over(&mut orch.holding, &mut orch.graph);
        drop_run_entries(core, &run);
        unwind_all(core, &mut orch);
        core.registry.end_building(run.id, orch);
        run.close();
    }
}

impl Drop for RunBuilder<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let cause = if std::thread::panicking() {
                "orchestration panicked"
            } else {
                "run builder dropped without close"
            };
            self.fail_inner(cause.to_owned());
        }
    }
}

/// Drops the run's tensor-map entries all at once when submission ends
/// (`docs/tensormap.md` §6): only a submit or an `alloc` of the run can look them up, so from
/// here on they would be erased one by one at reclamation for nothing but their memory. The
/// reclaims that follow (most of a run whose outer scope holds its tasks) see the run's mark
/// and skip the map.
fn drop_run_entries(core: &Core, run: &RunRecord) {
    core.tensor_map.erase_run(run.id);
    run.mark_map_entries_dropped();
}

/// Pops every frame, innermost first, and releases the scope reference of each slot.
fn unwind_all(core: &Core, orch: &mut OrchState) {
    orch.scopes.unwind_into(&mut orch.released, 0);
    core.release_all(&mut orch.released);
}

#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use simpler_types::{CallConfig, DataType, TaskArgs, TaskState, Tensor, WorkerId};

    use crate::outcome::RunOutcome;
    use crate::scheduler::tests::{chip, gated_engine, wait_until};

    fn output(addr: u64) -> TaskArgs {
        let mut args = TaskArgs::new();
        args.add_output(Tensor::external(addr, &[64], DataType::UInt8).unwrap()).unwrap();
        args
    }

    #[test]
    fn ending_submission_drops_the_runs_map_entries_while_its_tasks_still_run() {
        let (engine, tx) = gated_engine();
        let map = &engine.core().tensor_map;
        let cfg = CallConfig::default();
        for close in [true, false] {
            let mut b = engine.begin_run().unwrap();
            let run = b.id();
            let first = b.submit_next_level(&chip(), output(0x1000), &cfg, WorkerId(0), None);
            let first = first.unwrap();
            b.submit_next_level(&chip(), output(0x2000), &cfg, WorkerId(0), None).unwrap();
            assert_eq!(map.len_run(run), 2);
            wait_until(|| engine.task_snapshot(first).unwrap().state == TaskState::Running);
            let run = if close { b.close() } else { b.fail("abandoned") };
            assert_eq!(map.len_run(run), 0, "entries left after the submission ended");
            assert_eq!(engine.task_snapshot(first).unwrap().state, TaskState::Running);
            tx.send(()).unwrap();
            if close {
                tx.send(()).unwrap();
            }
            let outcome = engine.wait(run).unwrap();
            assert_eq!(matches!(outcome, RunOutcome::Completed), close, "{outcome:?}");
            engine.release(run).unwrap();
        }
        assert!(map.is_empty());
    }

    #[test]
    fn a_task_reclaimed_while_submission_is_open_erases_its_own_map_entries() {
        // Reclaimers skip the erase once submission has ended; one that skipped it before
        // would leave an entry per reclaimed task for the rest of the run.
        let (engine, tx) = gated_engine();
        let map = &engine.core().tensor_map;
        let cfg = CallConfig::default();
        let mut b = engine.begin_run().unwrap();
        let run = b.id();
        for i in 0..4u64 {
            let t = b
                .scope(|b| {
                    b.submit_next_level(&chip(), output(0x1000 * (i + 1)), &cfg, WorkerId(0), None)
                })
                .unwrap()
                .unwrap();
            assert_eq!(map.len_run(run), 1);
            tx.send(()).unwrap();
            // Counted after the reclamation's erase.
            wait_until(|| engine.stats().reclaimed == i + 1);
            assert_eq!(engine.task_snapshot(t).unwrap().state, TaskState::Consumed);
            assert_eq!(map.len_run(run), 0, "task {i} left its entry behind");
        }
        let run = b.close();
        assert!(engine.wait(run).unwrap().is_completed());
        engine.release(run).unwrap();
    }
}
