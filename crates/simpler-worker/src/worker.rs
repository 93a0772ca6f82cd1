//! `Worker`: submit and admission at every level (`docs/worker-protocols.md` §5); registration
//! is in the `registration` module, closing in the `close` module.
//!
//! # Lifecycle
//!
//! `New` (a builder) → `Starting` (the body of `start`) → `Ready` (a returned `Worker`) →
//! `Closed`. A failed start rolls back before it returns, so no failed worker exists.
//!
//! # Locks
//!
//! Lock order: the admission lock, then the chip-registration lock, then the inner locks.
//! Two inner locks are nested: the lifecycle lock before the accepted set (close counts the
//! pending runs when a drain times out) and the registry write lock before the accepted set
//! and the pending-chip list (unregister decides and queues a deferred removal atomically with
//! respect to admission and retirement). At L2 the registry lock is also held while a job is
//! queued on the lane (a run by submit, a release by unregister), never while one is waited
//! for. Every other inner lock (a run's cell, the owned-allocation map) is taken alone. The
//! admission lock is held across a submit's callback (a callback may still register:
//! registration never takes it); nothing else is held while user code runs or while waiting
//! for a run.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use simpler_device_a2a3::{DeviceError, Platform, PlatformLimits, RuntimeVariant};
use simpler_sched::{EndpointFailure, Engine};
use simpler_types::{CallableId, CallableKind, RunFailure, RunId, Tensor, WorkerId, WorkerRef};

use crate::builder::{ChipWorkerBuilder, CompositeWorkerBuilder, HostWorkerBuilder};
use crate::chip::{ChipLane, ChipState};
use crate::chip_endpoint::ChipEndpoint;
use crate::close::{CloseGate, Lifecycle, UnobservedFailures};
use crate::deferred_drop;
use crate::error::{BuildFailure, Frame, LaneFault, Residue, RunError, WorkerError};
use crate::graph::{GraphBuilder, OrchBody, Orchestration};
use crate::handle::{Registry, SharedRegistry, name_in};
use crate::lane_fence::LaneFence;
use crate::memory::{ChipAllocations, ChipMemory};
use crate::reentry;
use crate::run::{Fence, RunHandle, RunShared, frames_of, kind_of, kind_of_mechanism, panic_text};

pub(crate) enum Body {
    Chip(ChipLane),
    Engine {
        engine: Engine,
        chips: Vec<WorkerId>,
        children: Vec<WorkerId>,
        residue: Arc<Mutex<Vec<Residue>>>,
    },
}

/// The shared state behind a [`Worker`].
pub(crate) struct Inner {
    pub(crate) instance: u64,
    /// How often a wait for a run that has not ended logs what it waits for.
    pub(crate) still_waiting: Duration,
    pub(crate) level: u8,
    pub(crate) label: String,
    pub(crate) registry: SharedRegistry,
    /// Registries of the subtree, for naming callables in lower frames.
    pub(crate) name_sources: Vec<SharedRegistry>,
    /// This worker and its ancestors (see [`reentry`]).
    pub(crate) lineage: reentry::Lineage,
    /// The lineages of every worker below this one, extended when an ancestor adopts it.
    pub(crate) subtree_lineages: Vec<reentry::Lineage>,
    pub(crate) body: Body,
    /// Launch limits of the chips' platform, checked at graph submit (L3 only).
    pub(crate) chip_limits: Option<PlatformLimits>,
    /// The children that are L3 workers on other MPI ranks (L4+): their tasks are checked at
    /// submit (graphs they serve, tensors that can cross hosts).
    #[cfg(feature = "mpi")]
    pub(crate) remote_children: crate::remote::RemoteChildren,
    pub(crate) subs: usize,
    /// Lifecycle, operation leases and the close attempt (`gate`).
    pub(crate) gate: CloseGate,
    pub(crate) accepted: Mutex<VecDeque<Arc<RunShared>>>,
    pub(crate) admission: Mutex<()>,
    /// Serializes chip registrations.
    pub(crate) chip_registration: Mutex<()>,
    /// Failed runs published before anybody read them (`close` reports them; bounded).
    pub(crate) failed_runs: Mutex<UnobservedFailures>,
    /// Chip callables whose handle was unregistered while runs were live (L3; an L2 lane orders
    /// the release behind its runs instead).
    pub(crate) chip_pending: Mutex<Vec<(CallableId, Vec<WorkerId>)>>,
    /// Device allocations made through the memory helpers, per chip. Read at submit to refuse a
    /// chip-memory tensor sent to a chip that does not own it.
    pub(crate) owned: Mutex<HashMap<WorkerId, ChipAllocations>>,
    #[cfg(test)]
    pub(crate) injected: Mutex<Vec<(&'static str, bool)>>,
    /// Teardowns performed (exactly one per worker; tests read it).
    #[cfg(test)]
    pub(crate) teardowns: std::sync::atomic::AtomicU32,
}

/// Where a chip-memory tensor lies among a worker's recorded chip allocations.
pub(crate) enum ChipPlacement {
    /// In an allocation of the chip it is sent to at its start, or in none recorded.
    Fine,
    /// In an allocation of this other chip only.
    OtherChip(WorkerId),
    /// Its base address inside the target's allocation starting here, not at it.
    InsideBuffer(u64),
}

impl Inner {
    pub(crate) fn engine(&self) -> Option<&Engine> {
        match &self.body {
            Body::Engine { engine, .. } => Some(engine),
            Body::Chip(_) => None,
        }
    }

    /// Where chip-memory tensor `t`, sent to `target`, lies among the allocations made through
    /// the memory helpers (L3), under one look at them: a tensor naming no bytes lies nowhere.
    pub(crate) fn chip_placement(&self, target: WorkerId, t: &Tensor) -> ChipPlacement {
        let Some((start, end)) = t.byte_span() else { return ChipPlacement::Fine };
        let owned = self.owned.lock();
        // The start of the allocation of `m` holding `[lo, hi)`, if one does.
        let holding = |m: &ChipAllocations, lo: u64, hi: u64| {
            let (&base, &(len, _)) = m.by_addr.range(..=lo).next_back()?;
            (hi <= base.saturating_add(len)).then_some(base)
        };
        let mine = owned.get(&target);
        if mine.and_then(|m| holding(m, start, end)).is_none()
            && let Some((&chip, _)) =
                owned.iter().find(|(c, m)| **c != target && holding(m, start, end).is_some())
        {
            return ChipPlacement::OtherChip(chip);
        }
        match mine.and_then(|m| holding(m, t.addr, t.addr.saturating_add(1))) {
            Some(buffer) if buffer != t.addr => ChipPlacement::InsideBuffer(buffer),
            _ => ChipPlacement::Fine,
        }
    }

    pub(crate) fn chip_memory(&self, chip: WorkerId) -> Result<ChipMemory<'_>, WorkerError> {
        if self.level != 3 {
            return Err(WorkerError::WrongLevel { op: "chip_memory", level: self.level });
        }
        if !self.chips().contains(&chip) {
            return Err(WorkerError::NoSuchChild { id: chip });
        }
        Ok(ChipMemory { inner: self, chip })
    }

    pub(crate) fn chips(&self) -> Vec<WorkerId> {
        match &self.body {
            Body::Chip(lane) => vec![lane.chip],
            Body::Engine { chips, .. } => chips.clone(),
        }
    }

    fn reentrant(&self, op: &'static str) -> Result<(), WorkerError> {
        if reentry::is_acting_for(self.instance) {
            return Err(WorkerError::Reentrant { op, worker: self.label.clone() });
        }
        Ok(())
    }

    /// Injected cleanup failures (tests only): `(step, panic)`.
    pub(crate) fn inject(&self, step: &'static str) -> Result<(), String> {
        #[cfg(test)]
        {
            let hit = self.injected.lock().iter().find(|(s, _)| *s == step).copied();
            if let Some((_, panic)) = hit {
                if panic {
                    panic!("injected panic in cleanup step {step}");
                }
                return Err(format!("injected failure in cleanup step {step}"));
            }
        }
        let _ = step;
        Ok(())
    }

    /// `Reentrant` when the current thread is running a call on a lane of this worker, for a
    /// call that would wait for one of its lanes: on its own lane the call would queue behind
    /// the running one and wait for itself; on another lane it could wait for a lane that waits
    /// for this one (two closures calling each other's chips, or a registration that holds the
    /// registration lock while it waits for this lane).
    pub(crate) fn off_lane(&self, op: &'static str) -> Result<(), WorkerError> {
        if reentry::is_on_a_lane_of(self.instance) {
            return Err(WorkerError::Reentrant { op, worker: self.label.clone() });
        }
        Ok(())
    }

    /// Runs `f` on chip `chip`'s lane, behind work already queued there. From a call already
    /// running on that lane it is `Reentrant`.
    ///
    /// While `f` runs, its thread also acts for this worker and its ancestors: a run of theirs
    /// may need this very lane, so `submit`, `run`, `close` or a wait for a run from `f` would
    /// wait for itself and are `Reentrant` instead.
    pub(crate) fn on_chip<R: Send + 'static>(
        &self,
        chip: WorkerId,
        f: impl FnOnce(&mut ChipState) -> R + Send + 'static,
    ) -> Result<R, WorkerError> {
        self.off_lane("a call on the chip's lane")?;
        let instance = self.instance;
        let lineage = Arc::clone(&self.lineage);
        let f = move |s: &mut ChipState| {
            let _on_lane = reentry::enter_lane(instance, &lineage);
            f(s)
        };
        match &self.body {
            Body::Chip(lane) if lane.chip == chip => lane.call(f),
            Body::Engine { engine, chips, .. } if chips.contains(&chip) => {
                let rx = engine
                    .on_endpoint(WorkerRef::next_level(chip.0), move |ep| {
                        let any: &mut dyn Any = ep;
                        any.downcast_mut::<ChipEndpoint>().map(|c| f(&mut c.state))
                    })
                    .map_err(|e| WorkerError::Lane { chip, fault: LaneFault::Engine(e) })?;
                match rx.recv() {
                    Ok(Some(r)) => Ok(r),
                    Ok(None) => Err(WorkerError::Lane { chip, fault: LaneFault::NotChipEndpoint }),
                    Err(e) => Err(WorkerError::Lane { chip, fault: LaneFault::Engine(e) }),
                }
            }
            _ => Err(WorkerError::NoSuchChild { id: chip }),
        }
    }

    #[cfg(feature = "sim")]
    pub(crate) fn with_sim_faults(
        &self,
        chip: WorkerId,
        f: impl FnOnce(&simpler_device_a2a3::FaultPlan) + Send + 'static,
    ) -> Result<bool, WorkerError> {
        self.on_chip(chip, move |s| match s.runner.as_ref().and_then(|r| r.sim_faults()) {
            Some(plan) => {
                f(plan);
                true
            }
            None => false,
        })
    }

    pub(crate) fn name_of(&self, id: &CallableId) -> Option<String> {
        std::iter::once(&self.registry)
            .chain(&self.name_sources)
            .find_map(|r| name_in(&r.read(), id))
    }

    pub(crate) fn run_error(&self, f: &Arc<RunFailure>) -> RunError {
        let frames = frames_of(self.level, f, &|id| self.name_of(id));
        RunError::new(f.run(), kind_of(f), frames, Vec::new(), Some(Arc::clone(f)))
    }

    /// The error of L2 run `run` of the chip callable registered as `callable`, from the chip
    /// lane's failure (mapped by [`device_failure`](crate::chip::device_failure)).
    pub(crate) fn lane_error(&self, run: RunId, callable: &str, f: &EndpointFailure) -> RunError {
        let kind = kind_of_mechanism(&f.mechanism, f.device_code);
        let frame = Frame {
            callable: Some(callable.to_owned()),
            kind: Some(CallableKind::Chip),
            worker: Some(WorkerRef::next_level(self.chips().first().map_or(0, |c| c.0))),
            mechanism: Some(f.mechanism.clone()),
            device_code: f.device_code,
            source: f.source.clone(),
            ..Frame::of_run(2, run, f.message.clone())
        };
        RunError::new(run, kind, vec![frame], Vec::new(), None)
    }

    /// Removes `run` from the accepted set; when none is left, performs deferred
    /// unregistrations.
    pub(crate) fn retire(&self, run: &Arc<RunShared>) {
        let empty = {
            let mut acc = self.accepted.lock();
            acc.retain(|r| !Arc::ptr_eq(r, run));
            acc.is_empty()
        };
        if empty {
            #[cfg(all(test, not(simpler_loom)))]
            retire_hook::before_flush();
            self.flush_removals();
        }
    }

    /// Carries out the unregistrations deferred while runs were live, unless a run was accepted
    /// since the set was seen empty: a removal holds the registry lock while it reads the set,
    /// so one deferred for that run is flushed by its retirement, not here.
    fn flush_removals(&self) {
        let (dropped, pending) = {
            let mut reg = self.registry.write();
            if !self.accepted.lock().is_empty() {
                return;
            }
            // From a lane of this worker a chip's release cannot be queued (the lane would wait
            // for itself): the releases stay pending for the next flush off a lane.
            let pending = if reentry::is_on_a_lane_of(self.instance) {
                Vec::new()
            } else {
                std::mem::take(&mut *self.chip_pending.lock())
            };
            (reg.flush_removals(), pending)
        };
        // Outside the registry lock, and after the enclosing admission or close (module docs
        // of `deferred_drop`).
        deferred_drop::drop_logged(
            None,
            dropped.into_iter().map(|r| Box::new(r) as Box<dyn Any + Send>).collect(),
        );
        for (id, chips) in pending {
            for chip in chips {
                match self.on_chip(chip, move |s| s.release(&id)) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(%chip, "deferred unregistration of {id} failed: {e}")
                    }
                    Err(e) => tracing::warn!(%chip, "deferred unregistration of {id} failed: {e}"),
                }
            }
        }
    }

    /// Waits, as an ordinary waiter, until every run accepted so far is published.
    pub(crate) fn wait_accepted(&self) {
        self.wait_accepted_below(1);
    }

    /// Waits, as an ordinary waiter, until fewer than `depth` of the runs accepted so far are
    /// unpublished (the oldest ones are waited for; runs publish in acceptance order).
    pub(crate) fn wait_accepted_below(&self, depth: usize) {
        let runs: Vec<Arc<RunShared>> = {
            let acc = self.accepted.lock();
            let keep = depth.saturating_sub(1);
            acc.iter().take(acc.len().saturating_sub(keep)).cloned().collect()
        };
        for run in runs {
            self.wait_as_bystander(&run, None);
        }
    }

    /// Waits for `run` until `deadline` as an ordinary waiter, not its user: the cleanup runs if
    /// nobody's has, and a failure counts as unobserved.
    fn wait_as_bystander(&self, run: &Arc<RunShared>, deadline: Option<std::time::Instant>) {
        if let Some(r) = run.wait_until(deadline) {
            self.note_published(run, &r);
        }
    }

    /// Cleans up, as an ordinary waiter, the accepted runs whose fence has fired but whom nobody
    /// has waited for yet: what they held back (deferred unregistrations) is released now.
    pub(crate) fn retire_finished(&self) {
        let done: Vec<Arc<RunShared>> =
            self.accepted.lock().iter().filter(|r| r.fence_fired()).cloned().collect();
        for run in done {
            self.wait_as_bystander(&run, Some(std::time::Instant::now()));
        }
        // Releases a cleanup on a lane had to leave pending.
        self.flush_removals();
    }

    /// The oldest accepted run whose fence is not set yet: the run a new submit queues behind.
    pub(crate) fn oldest_unfinished_run(&self) -> Option<RunId> {
        self.accepted.lock().iter().find(|r| !r.fence_fired()).map(|r| r.run)
    }

    /// A waiter that is not the run's user saw `run` published with `result`.
    pub(crate) fn note_published(&self, run: &Arc<RunShared>, result: &Result<(), RunError>) {
        if let Err(e) = result {
            self.failed_runs.lock().enter(run, e);
        }
    }

    /// A user reads `run`'s result: it is observed, and leaves the unobserved failures.
    pub(crate) fn note_observed(&self, run: &RunShared) {
        self.failed_runs.lock().observe(run);
    }
}

/// A started worker at any level. `Send + Sync`; every method takes `&self`, so a serving
/// process may share one in an `Arc`. Dropping it closes it (errors are logged).
pub struct Worker {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("label", &self.inner.label).finish_non_exhaustive()
    }
}

impl Worker {
    /// An L2 worker over one chip.
    pub fn chip(platform: Platform, device: u32, runtime: RuntimeVariant) -> ChipWorkerBuilder {
        ChipWorkerBuilder::new(platform, device, runtime)
    }

    /// An L3 worker over chips and sub workers.
    pub fn host(platform: Platform, runtime: RuntimeVariant) -> HostWorkerBuilder {
        HostWorkerBuilder::new(platform, runtime)
    }

    /// An L4+ worker composing workers of level − 1.
    pub fn composite(level: u8) -> CompositeWorkerBuilder {
        CompositeWorkerBuilder::new(level)
    }

    /// The level label (2, 3, 4, …).
    pub fn level(&self) -> u8 {
        self.inner.level
    }

    /// `Ready` or `Closed`.
    pub fn lifecycle(&self) -> Lifecycle {
        self.inner.lifecycle()
    }

    /// The chips of this level (L2: its chip; L4+: none).
    pub fn chip_ids(&self) -> Vec<WorkerId> {
        self.inner.chips()
    }

    /// The children of an L4+ worker, in adoption order.
    pub fn child_ids(&self) -> Vec<WorkerId> {
        match &self.inner.body {
            Body::Engine { children, .. } => children.clone(),
            Body::Chip(_) => Vec::new(),
        }
    }

    /// Number of sub workers.
    pub fn sub_workers(&self) -> usize {
        self.inner.subs
    }

    /// Runs admitted at once: 2 for an L2 worker whose chip has at least two resource slots
    /// (its lane prepares run N+1 while run N executes, and with device queueing launches it
    /// behind N; runs with diagnostics still execute alone), else 1. L3 and higher levels run
    /// chip tasks at depth 1 (`docs/pipelining.md`, "Depth at L3").
    pub fn pipeline_depth(&self) -> usize {
        match &self.inner.body {
            Body::Chip(lane) => lane.depth,
            Body::Engine { .. } => 1,
        }
    }

    /// Runs `f` with the fault plan of simulated chip `chip` (on its lane, behind queued
    /// work); `Ok(false)` on a real chip. For fault-injection tests of code built on workers.
    #[cfg(feature = "sim")]
    pub fn with_sim_faults(
        &self,
        chip: WorkerId,
        f: impl FnOnce(&simpler_device_a2a3::FaultPlan) + Send + 'static,
    ) -> Result<bool, WorkerError> {
        // The worker's own entry takes a lease (after close: `Closed`); the graph context's
        // runs inside an orchestration the close drains, so it does not.
        let _lease = self.inner.lease()?;
        self.inner.with_sim_faults(chip, f)
    }

    /// References held on chip callable content `id` on `chip` (for diagnostics and tests).
    pub fn chip_callable_refs(&self, chip: WorkerId, id: CallableId) -> Result<usize, WorkerError> {
        let _lease = self.inner.lease()?;
        self.inner.on_chip(chip, move |s| s.refs(&id))
    }

    /// Submits a run and returns its handle once the graph is built (L3+) or the run is
    /// prepared on the chip (L2). Graph-construction errors come back here, after the run was
    /// drained and retired; task and device errors belong to the handle. At L2 a run whose
    /// preparation found the chip made unusable by a run that had not finished when this
    /// submit began, or whose orchestration's write into user memory waited for such a run
    /// and it failed, is accepted too: its handle reports it `Abandoned` behind that run
    /// (`docs/pipelining.md`, step 2).
    pub fn submit(&self, orch: Orchestration) -> Result<RunHandle, WorkerError> {
        self.inner.reentrant("submit")?;
        // Declared before the lease and the admission lock, so it drops what it parked after
        // both are released (a keep-alive whose drop closes the worker waits for leases).
        let _deferred = deferred_drop::scope();
        let _lease = self.inner.lease()?;
        let admission = self.inner.admission.lock();
        let r = match &self.inner.body {
            Body::Chip(lane) => self.submit_chip(lane, orch),
            Body::Engine { engine, .. } => {
                // Wait, as an ordinary waiter, until fewer than the pipeline depth of the
                // earlier accepted runs are unpublished.
                self.inner.wait_accepted_below(self.pipeline_depth());
                self.submit_graph(engine, orch)
            }
        };
        drop(admission);
        r
    }

    fn submit_chip(&self, lane: &ChipLane, orch: Orchestration) -> Result<RunHandle, WorkerError> {
        let Orchestration { body, args, config, keep } = orch;
        // User values not yet owned by a run: an early return drops them outside admission.
        let mut keep = deferred_drop::Pending::new(keep);
        let handle = match body {
            OrchBody::Chip(handle) => handle,
            other => {
                keep.push(other);
                return Err(WorkerError::WrongLevel { op: "a graph orchestration", level: 2 });
            }
        };
        if handle.worker != self.inner.instance {
            return Err(WorkerError::ForeignHandle { handle });
        }
        if let Some((arg, t)) = crate::staging::first_host_tensor(&args) {
            return Err(WorkerError::HostTensorAtL2 { arg, addr: crate::HostAddr(t.addr) });
        }
        let fence = Arc::new(LaneFence::default());
        let lane_fence = Arc::clone(&fence);
        let id = handle.id;
        // A run that poisons the device from here on was ahead of this one in the queue: this
        // run is then abandoned behind it, whether the lane got to prepare it before retiring
        // that run (depth 2) or after (depth 1, or a quick failure).
        let behind = self.inner.oldest_unfinished_run();
        let (tx, rx) = mpsc::sync_channel::<(Option<RunId>, Result<(), DeviceError>)>(1);
        let (instance, lineage) = (self.inner.instance, Arc::clone(&self.inner.lineage));
        let job = Box::new(move |s: &mut ChipState| {
            // The preparation runs user code (a native orchestration) on this lane: a call from
            // it back into the worker is `Reentrant`, never a wait for this very lane.
            let _on_lane = reentry::enter_lane(instance, &lineage);
            let (run, prepared) = s.begin_run(&id, args.view(), &config, None);
            match (run, prepared) {
                (Some(run), Ok(p)) => {
                    let _ = tx.send((Some(run), Ok(())));
                    s.launch_pipelined(run, p, lane_fence, config.diagnostics_any());
                }
                (run, Err(e)) => match crate::chip::queued_behind(e, run, behind) {
                    Ok((run, abandoned)) => {
                        let _ = tx.send((Some(run), Ok(())));
                        s.abandon(lane_fence, abandoned);
                    }
                    Err(e) => {
                        let _ = tx.send((run, Err(e)));
                    }
                },
                (None, Ok(_)) => {
                    let _ = tx.send((None, Ok(())));
                }
            }
        });
        // Looked up and queued under the registry lock: an unregister of the handle, which
        // queues the chip's release under the write lock, either comes first (the lookup
        // fails) or queues the release behind this run.
        let pin = {
            let reg = self.inner.registry.read();
            let Some((_, r)) = reg.handles.get(&handle.seq) else {
                return Err(WorkerError::UnknownCallable { handle });
            };
            let pin = r.clone();
            lane.post_run(job)?;
            pin
        };
        // The job is queued before the admission wait: the lane takes it up the moment it has
        // published the head (it publishes in FIFO order and prepares one run at a time), not
        // after this thread has woken to post it. The same order makes the reply come after
        // that publication, so the wait below, as an ordinary waiter, until fewer than the
        // pipeline depth of the earlier accepted runs are unpublished, finds them published.
        // The reply usually comes one preparation later: yield for it before parking.
        let reply = crate::linger::recv(&rx);
        self.inner.wait_accepted_below(self.pipeline_depth());
        let (run, prepared) = reply
            .map_err(|_| WorkerError::Lane { chip: lane.chip, fault: LaneFault::RunDropped })?;
        let run = match (run, prepared) {
            (Some(run), Ok(())) => run,
            (Some(run), Err(e)) => {
                deferred_drop::drop_logged(Some(run), keep.take());
                return Err(WorkerError::Build { run, cause: BuildFailure::Device(Box::new(e)) });
            }
            (None, Err(e)) => {
                return Err(WorkerError::Device { chip: lane.chip, source: Box::new(e) });
            }
            (None, Ok(())) => {
                return Err(WorkerError::Lane { chip: lane.chip, fault: LaneFault::NoRunId });
            }
        };
        let callable = Arc::clone(&pin.name);
        let shared = RunShared::new(run, Arc::clone(&self.inner), Fence::Lane { fence, callable });
        shared.keep(keep.take());
        shared.keep([Box::new(pin) as Box<dyn Any + Send>]);
        self.inner.accepted.lock().push_back(Arc::clone(&shared));
        Ok(RunHandle { shared })
    }

    fn submit_graph(&self, engine: &Engine, orch: Orchestration) -> Result<RunHandle, WorkerError> {
        let Orchestration { body, args, config, keep } = orch;
        // User values not yet owned by a run: an early return drops them outside admission.
        let mut keep = deferred_drop::Pending::new(keep);
        let mut f = match body {
            OrchBody::Graph(f) => f,
            other => {
                keep.push(other);
                return Err(WorkerError::WrongLevel {
                    op: "a chip orchestration",
                    level: self.inner.level,
                });
            }
        };
        let rb = match engine.begin_run() {
            Ok(rb) => rb,
            Err(e) => {
                keep.push(f);
                return Err(match e {
                    simpler_sched::SchedError::ShuttingDown => WorkerError::Closed,
                    other => WorkerError::Engine(other),
                });
            }
        };
        let run = rb.id();
        let shared = RunShared::new(run, Arc::clone(&self.inner), Fence::Engine);
        self.inner.accepted.lock().push_back(Arc::clone(&shared));
        let mut gb = GraphBuilder {
            rb: Some(rb),
            inner: &self.inner,
            pins: Vec::new(),
            keep: Vec::new(),
            kept_hosts: std::collections::HashSet::new(),
        };
        let outcome = {
            let _acting = reentry::enter(self.inner.instance);
            catch_unwind(AssertUnwindSafe(|| f(&mut gb, args.view(), &config)))
        };
        let GraphBuilder { rb, pins, keep: graph_keep, .. } = gb;
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(match e.downcast::<WorkerError>() {
                Ok(w) => match *w {
                    WorkerError::Engine(s) => BuildFailure::Engine(s),
                    other => BuildFailure::Callback(Box::new(other)),
                },
                Err(e) => BuildFailure::Callback(e),
            }),
            Err(p) => {
                let text = panic_text(p.as_ref());
                crate::sub::dispose(p);
                Some(BuildFailure::Panicked(text))
            }
        };
        shared.keep([Box::new(f) as Box<dyn Any + Send>, Box::new(args), Box::new(config)]);
        shared.keep(keep.take());
        shared.keep(graph_keep);
        shared.keep(pins.into_iter().map(|p| Box::new(p) as Box<dyn Any + Send>));
        match (failure, rb) {
            (None, Some(rb)) => {
                rb.close();
                Ok(RunHandle { shared })
            }
            (failure, rb) => {
                let cause =
                    failure.unwrap_or(BuildFailure::Panicked("the run builder was lost".into()));
                // The callback's error is user code: its text is formatted where it cannot
                // panic out of this call, which still returns it typed.
                if let Some(rb) = rb {
                    rb.fail(crate::sub::text_of(&cause));
                }
                self.inner.note_observed(&shared);
                let _ = shared.wait_until(None);
                Err(WorkerError::Build { run, cause })
            }
        }
    }

    /// `submit` then `wait`.
    pub fn run(&self, orch: Orchestration) -> Result<(), WorkerError> {
        self.inner.reentrant("run")?;
        self.submit(orch)?.wait().map_err(WorkerError::Run)
    }

    /// Memory calls on the chip of an L2 worker.
    pub fn memory(&self) -> Result<ChipMemory<'_>, WorkerError> {
        match &self.inner.body {
            Body::Chip(lane) => Ok(ChipMemory { inner: &self.inner, chip: lane.chip }),
            Body::Engine { .. } => {
                Err(WorkerError::WrongLevel { op: "memory", level: self.inner.level })
            }
        }
    }

    /// Memory calls on chip `chip` of an L3 worker.
    pub fn chip_memory(&self, chip: WorkerId) -> Result<ChipMemory<'_>, WorkerError> {
        self.inner.chip_memory(chip)
    }

    /// Committed device memory: L2 its chip, L3 the sum over its chips.
    pub fn committed_device_memory(&self) -> Result<u64, WorkerError> {
        if self.inner.level > 3 {
            return Err(WorkerError::WrongLevel {
                op: "committed_device_memory",
                level: self.inner.level,
            });
        }
        let _lease = self.inner.lease()?;
        let mut total = 0;
        for chip in self.inner.chips() {
            total += self.inner.on_chip(chip, |s| s.ledger())??.committed;
        }
        Ok(total)
    }

    #[cfg(test)]
    pub(crate) fn inject_cleanup_failure(&self, step: &'static str, panic: bool) {
        self.inner.injected.lock().push((step, panic));
    }
}

pub(crate) fn new_inner(
    instance: u64,
    level: u8,
    body: Body,
    registry: Registry,
    name_sources: Vec<SharedRegistry>,
    subs: usize,
) -> Inner {
    Inner {
        instance,
        level,
        label: format!("L{level} worker #{instance}"),
        registry: Arc::new(RwLock::new(registry)),
        name_sources,
        lineage: reentry::lineage_of(instance),
        subtree_lineages: Vec::new(),
        body,
        chip_limits: None,
        #[cfg(feature = "mpi")]
        remote_children: crate::remote::RemoteChildren::default(),
        subs,
        gate: CloseGate::new(),
        still_waiting: crate::run::DEFAULT_STILL_WAITING,
        accepted: Mutex::new(VecDeque::new()),
        admission: Mutex::new(()),
        chip_registration: Mutex::new(()),
        failed_runs: Mutex::new(UnobservedFailures::default()),
        chip_pending: Mutex::new(Vec::new()),
        owned: Mutex::new(HashMap::new()),
        #[cfg(test)]
        injected: Mutex::new(Vec::new()),
        #[cfg(test)]
        teardowns: std::sync::atomic::AtomicU32::new(0),
    }
}

/// A test seam: code run on a retiring thread that saw the accepted set empty, before it
/// flushes the deferred unregistrations.
#[cfg(all(test, not(simpler_loom)))]
pub(crate) mod retire_hook {
    use std::cell::RefCell;

    thread_local! {
        static BEFORE_FLUSH: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
    }

    /// Runs `hook` once, in this thread's next retirement that flushes.
    pub(crate) fn set(hook: Box<dyn FnOnce()>) {
        BEFORE_FLUSH.with(|h| *h.borrow_mut() = Some(hook));
    }

    pub(super) fn before_flush() {
        if let Some(hook) = BEFORE_FLUSH.with(|h| h.borrow_mut().take()) {
            hook();
        }
    }
}
