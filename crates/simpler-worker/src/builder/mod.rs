//! Builders (the `New` state) and `start` of every worker level
//! (`docs/worker-protocols.md` §2).
//!
//! `start` consumes the builder, so registering while starting, starting twice, closing while
//! starting and adopting a started child cannot be written. One deadline covers the whole tree:
//!
//! 1. Validate: timeout > 0, distinct device ids, child levels, eligibility of every
//!    registration.
//! 2. Attach every chip in parallel on start-up threads (prepare the builder's chip callables,
//!    prewarm if asked) and wait for them within the deadline; a chip still starting at the
//!    deadline is detached and listed in the rollback.
//! 3. Start children recursively, each with what is left of the deadline.
//! 4. Build the engine (rings, sub endpoints, one chip or child endpoint per next-level worker).
//!    No engine thread exists before this step.
//! 5. Return the ready `Worker`; nothing is started lazily by the first `submit`.
//!
//! A failure rolls back in reverse before `start` returns (chips finalized, started children
//! closed) and names the path to the failing part, e.g. `L4 / child 1 (L3) / chip 0 (device 5)`.
//! What the rollback itself meets (a chip that fails to finalize, a child whose close fails,
//! residue) is attached to `StartError::rollback`, also when the engine fails to start: its
//! endpoints finalize their chip or close their child when dropped, into the residue list the
//! builder then reads.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use simpler_device_a2a3::{
    ChipCallable, DeviceError, DeviceRunner, Platform, RunnerOptions, RuntimeVariant,
};
use simpler_ring::{RingConfig, RingError};
use simpler_sched::{Endpoint, Engine, EngineConfig, SchedError};
use simpler_types::{CallConfig, CallableId, CallableKind, TaskArgsView, WorkerId};

use crate::child::ChildEndpoint;
use crate::chip::{ChipLane, ChipState};
use crate::chip_endpoint::ChipEndpoint;
use crate::error::{
    BoxError, ConfigError, Residue, StartCause, StartError, TeardownCause, TeardownError,
    TeardownPart,
};
use crate::faults::{Fault, Faults};
use crate::graph::GraphBuilder;
use crate::handle::{
    CallableHandle, Entry, GraphFn, HostFn, Registration, Registry, SharedRegistry,
};
use crate::process::parent::ChipInit;
use crate::process::{ChildMode, ProcessOptions};
use crate::reentry;
use crate::run::panic_text;
use crate::worker::{Body, Worker, new_inner};

mod attach;
mod unreached;

pub(crate) use attach::AttachFailure;
use attach::attach_chips;
#[cfg(feature = "mpi")]
use unreached::remote_children;
use unreached::{Unreached, refuse_unreached};

/// Worker instance numbers: they only tell handles of different workers apart.
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

fn next_instance() -> u64 {
    // Relaxed: uniqueness needs only atomicity.
    NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed)
}

/// Adjusts a chip's runner options before it attaches.
pub type ChipOptionsFn = dyn Fn(RunnerOptions) -> RunnerOptions + Send + Sync + 'static;

/// Default startup deadline of a whole worker tree.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(300);
/// Default bytes per heap ring.
pub const DEFAULT_HEAP_RING_SIZE: u64 = 1 << 30;
/// Default deadline of a blocking heap allocation.
pub const DEFAULT_ALLOC_TIMEOUT: Duration = Duration::from_secs(10);
/// The most sub workers one level may have: each is an engine endpoint with its own thread,
/// so a larger count is taken for a mistake rather than started.
pub const MAX_SUB_WORKERS: usize = 4096;

struct Common {
    instance: u64,
    startup_timeout: Duration,
    prewarm: Option<CallConfig>,
    chip_options: Option<Arc<ChipOptionsFn>>,
    next_seq: u64,
    /// Injected chip faults, shared with the chip states (armed by tests only).
    faults: Faults,
    /// How often a wait for a run that has not ended logs what it waits for.
    still_waiting: Duration,
}

impl Common {
    /// The ring the level's engine starts with, its heap swapped for one the engine refuses
    /// when the fault `EngineRefused` is armed (on 0).
    fn engine_ring(&self, heap_bytes_per_ring: u64, alloc_timeout: Duration) -> RingConfig {
        let mut ring = ring_config(heap_bytes_per_ring, alloc_timeout);
        if self.faults.hit(WorkerId(0), Fault::EngineRefused) {
            ring.heap_bytes_per_ring = 1000;
        }
        ring
    }

    fn new() -> Common {
        Common {
            instance: next_instance(),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            prewarm: None,
            chip_options: None,
            next_seq: 0,
            faults: Faults::default(),
            still_waiting: crate::run::DEFAULT_STILL_WAITING,
        }
    }

    fn handle(&mut self, id: CallableId) -> CallableHandle {
        self.next_seq += 1;
        CallableHandle { worker: self.instance, seq: self.next_seq, id }
    }

    fn closure_handle(&mut self, kind: CallableKind) -> CallableHandle {
        let id = Registry::closure_id(self.instance, self.next_seq + 1, kind);
        self.handle(id)
    }

    fn check_timeout(&self, path: &str) -> Result<(), StartError> {
        if self.startup_timeout.is_zero() {
            return Err(start_err(StartCause::Config(ConfigError::ZeroStartupTimeout), path));
        }
        Ok(())
    }
}

/// The first rank two remote children of `specs` (at any depth) name: a rank serves one
/// session at a time, and a second `Hello` or `Refuse` to it would be taken by its next one.
#[cfg(feature = "mpi")]
fn shared_rank(specs: &[ChildSpec]) -> Option<i32> {
    let mut remote = Vec::new();
    remote_children(specs, &mut remote);
    let mut all: Vec<i32> = remote.iter().map(|r| r.rank()).collect();
    all.sort_unstable();
    all.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

fn start_err(cause: StartCause, path: &str) -> StartError {
    StartError { cause, path: path.to_owned(), rollback: Vec::new() }
}

/// Step 1: the sub worker count a builder was given, if it is at most [`MAX_SUB_WORKERS`].
fn check_sub_workers(subs: usize, path: &str) -> Result<u32, StartError> {
    match u32::try_from(subs) {
        Ok(n) if subs <= MAX_SUB_WORKERS => Ok(n),
        _ => Err(start_err(
            StartCause::Config(ConfigError::TooManySubWorkers {
                given: subs,
                limit: MAX_SUB_WORKERS,
            }),
            path,
        )),
    }
}

/// The deadline `budget` from now; `None` (no deadline) when it lies beyond what `Instant`
/// can represent, as with `Duration::MAX`.
fn deadline_after(budget: Duration) -> Option<Instant> {
    Instant::now().checked_add(budget)
}

fn past(
    deadline: Option<Instant>,
    budget: Duration,
    what: &str,
    path: &str,
) -> Result<(), StartError> {
    if deadline.is_some_and(|d| Instant::now() > d) {
        return Err(start_err(
            StartCause::DeadlineExceeded { pending: vec![what.to_owned()], budget },
            path,
        ));
    }
    Ok(())
}

/// Methods of the builders that own chips (L2, L3); they need the fields `common` and
/// `chip_regs`.
macro_rules! chip_builder_methods {
    () => {
        /// The deadline of the whole start (default 300 s; must be > 0).
        #[must_use]
        pub fn startup_timeout(mut self, t: Duration) -> Self {
            self.common.startup_timeout = t;
            self
        }

        /// Adjusts each chip's runner options (budgets, simulator settings) before it
        /// attaches.
        #[must_use]
        pub fn chip_options(
            mut self,
            f: impl Fn(RunnerOptions) -> RunnerOptions + Send + Sync + 'static,
        ) -> Self {
            self.common.chip_options = Some(Arc::new(f));
            self
        }

        /// Builds every chip's arenas for this sizing at start.
        #[must_use]
        pub fn prewarm(mut self, config: CallConfig) -> Self {
            self.common.prewarm = Some(config);
            self
        }

        /// Registers a chip callable, prepared on every chip during `start`.
        pub fn register_chip(&mut self, c: ChipCallable) -> CallableHandle {
            let h = self.common.handle(c.id());
            self.chip_regs.push((h, c));
            h
        }

        /// The faults armed for this builder's chips (or, armed on 0, its own start), shared
        /// with the worker it starts.
        #[cfg(test)]
        pub(crate) fn faults(&self) -> Faults {
            self.common.faults.clone()
        }
    };
}

/// Methods of the builders that run an engine (L3, L4+); they need the fields `common`,
/// `subs`, `heap_ring_size`, `alloc_timeout` and `host_regs`.
macro_rules! engine_builder_methods {
    () => {
        /// How often a wait for a run that has not ended (`RunHandle::wait`, `close`, a
        /// submit queued behind earlier runs) logs a warning naming the run, how long it
        /// waited and the tasks running (default 10 s, at least 1 ms; `Duration::MAX` never
        /// warns).
        #[must_use]
        pub fn still_waiting_warning(mut self, every: Duration) -> Self {
            self.common.still_waiting = every.max(Duration::from_millis(1));
            self
        }

        /// Number of sub workers (host-closure threads), at most [`MAX_SUB_WORKERS`]; `start`
        /// refuses a larger count with [`ConfigError::TooManySubWorkers`] naming it and the limit,
        /// before anything is started.
        #[must_use]
        pub fn sub_workers(mut self, n: usize) -> Self {
            self.subs = n;
            self
        }

        /// Bytes per heap ring (default 1 GiB, four rings).
        #[must_use]
        pub fn heap_ring_size(mut self, bytes: u64) -> Self {
            self.heap_ring_size = bytes;
            self
        }

        /// Deadline of a blocking heap allocation (default 10 s).
        #[must_use]
        pub fn alloc_timeout(mut self, t: Duration) -> Self {
            self.alloc_timeout = t;
            self
        }

        /// Registers a host closure, run by a sub worker.
        pub fn register_host(
            &mut self,
            name: &str,
            f: impl Fn(TaskArgsView<'_>) -> Result<(), BoxError> + Send + Sync + 'static,
        ) -> CallableHandle {
            let h = self.common.closure_handle(CallableKind::Host);
            self.host_regs.push((h, name.to_owned(), Arc::new(f)));
            h
        }
    };
}

/// Builder of an L2 worker (the `New` state).
pub struct ChipWorkerBuilder {
    common: Common,
    platform: Platform,
    device: u32,
    runtime: RuntimeVariant,
    chip_regs: Vec<(CallableHandle, ChipCallable)>,
}

impl std::fmt::Debug for ChipWorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChipWorkerBuilder").field("device", &self.device).finish_non_exhaustive()
    }
}

impl ChipWorkerBuilder {
    pub(crate) fn new(platform: Platform, device: u32, runtime: RuntimeVariant) -> Self {
        ChipWorkerBuilder {
            common: Common::new(),
            platform,
            device,
            runtime,
            chip_regs: Vec::new(),
        }
    }

    chip_builder_methods!();

    /// Starts the worker: attaches the chip, prepares the callables, starts the lane.
    pub fn start(self) -> Result<Worker, StartError> {
        let path = format!("L2 / chip 0 (device {})", self.device);
        self.common.check_timeout(&path)?;
        let deadline = deadline_after(self.common.startup_timeout);
        let callables: Vec<ChipCallable> = self.chip_regs.iter().map(|(_, c)| c.clone()).collect();
        let mut states = attach_chips(
            self.platform,
            self.runtime,
            &[self.device],
            &callables,
            self.common.prewarm.as_ref(),
            self.common.chip_options.as_ref(),
            &self.common.faults,
            None,
            deadline,
            self.common.startup_timeout,
            "L2",
        )?;
        let Some(state) = states.pop() else {
            return Err(start_err(StartCause::Config(ConfigError::NoChips), &path));
        };
        let lane =
            ChipLane::spawn(state, format!("simpler-l2-chip{}", self.device)).map_err(|e| {
                let cause =
                    StartCause::ThreadSpawn { thread: "the chip lane", source: Arc::new(e) };
                start_err(cause, &path)
            })?;
        let mut registry = Registry::default();
        add_chip_callables(&mut registry, &self.chip_regs, &[WorkerId(0)]);
        registry.next_seq = self.common.next_seq;
        Ok(Worker {
            inner: Arc::new(new_inner(
                self.common.instance,
                2,
                Body::Chip(lane),
                registry,
                Vec::new(),
                0,
            )),
        })
    }
}

/// Builder of an L3 worker (the `New` state).
pub struct HostWorkerBuilder {
    common: Common,
    platform: Platform,
    runtime: RuntimeVariant,
    devices: Vec<u32>,
    subs: usize,
    heap_ring_size: u64,
    alloc_timeout: Duration,
    chip_regs: Vec<(CallableHandle, ChipCallable)>,
    host_regs: Vec<(CallableHandle, String, Arc<HostFn>)>,
    chip_mode: ChildMode,
    process: ProcessOptions,
}

impl std::fmt::Debug for HostWorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostWorkerBuilder")
            .field("devices", &self.devices)
            .field("subs", &self.subs)
            .finish_non_exhaustive()
    }
}

impl HostWorkerBuilder {
    pub(crate) fn new(platform: Platform, runtime: RuntimeVariant) -> Self {
        HostWorkerBuilder {
            common: Common::new(),
            platform,
            runtime,
            devices: Vec::new(),
            subs: 0,
            heap_ring_size: DEFAULT_HEAP_RING_SIZE,
            alloc_timeout: DEFAULT_ALLOC_TIMEOUT,
            chip_regs: Vec::new(),
            host_regs: Vec::new(),
            chip_mode: ChildMode::Thread,
            process: ProcessOptions::default(),
        }
    }

    /// Where the chips run (default [`ChildMode::Thread`]); `ChildMode::Process` starts each
    /// chip in a child process (`docs/process-mode.md`).
    #[must_use]
    pub fn chip_mode(mut self, mode: ChildMode) -> Self {
        self.chip_mode = mode;
        self
    }

    /// Settings of [`ChildMode::Process`].
    #[must_use]
    pub fn process_options(mut self, options: ProcessOptions) -> Self {
        self.process = options;
        self
    }

    chip_builder_methods!();
    engine_builder_methods!();

    /// The chips, by device id (distinct); they get worker ids `0..n` in this order.
    #[must_use]
    pub fn chips(mut self, devices: &[u32]) -> Self {
        self.devices = devices.to_vec();
        self
    }

    /// The registered chip callables as manifest entries (entry name, content digest), in
    /// registration order.
    #[cfg(feature = "mpi")]
    pub(crate) fn chip_manifest(&self) -> Vec<crate::remote::ManifestEntry> {
        self.chip_regs.iter().map(|(_, c)| crate::remote::chip_entry(c)).collect()
    }

    /// Starts the worker (`docs/worker-protocols.md` §2); a failure rolls everything back
    /// before returning.
    pub fn start(self) -> Result<Worker, StartError> {
        let deadline = deadline_after(self.common.startup_timeout);
        self.start_within(deadline, "L3".to_owned())
    }

    fn start_within(self, deadline: Option<Instant>, path: String) -> Result<Worker, StartError> {
        // 1.
        self.common.check_timeout(&path)?;
        let mut seen = self.devices.clone();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            let (duplicate, devices) = (w[0], self.devices.clone());
            return Err(start_err(
                StartCause::Config(ConfigError::DuplicateDevice { duplicate, devices }),
                &path,
            ));
        }
        let subs = check_sub_workers(self.subs, &path)?;
        check_ring(&ring_config(self.heap_ring_size, self.alloc_timeout), &path)?;
        check_host_closures_have_subs(&self.host_regs, self.subs, &path)?;
        if let Some((_, c)) = self.chip_regs.first().filter(|_| self.devices.is_empty()) {
            return Err(start_err(
                StartCause::NoEligibleTarget {
                    callable: c.entry_name().to_owned(),
                    needs: "chips",
                },
                &path,
            ));
        }
        let process =
            (self.chip_mode == ChildMode::Process).then(|| Arc::new(self.process.clone()));
        if process.is_some() && self.common.chip_options.is_some() {
            return Err(start_err(
                StartCause::Config(ConfigError::ChipOptionsInProcessMode),
                &path,
            ));
        }
        // 2.
        let callables: Vec<ChipCallable> = self.chip_regs.iter().map(|(_, c)| c.clone()).collect();
        let mut states = attach_chips(
            self.platform,
            self.runtime,
            &self.devices,
            &callables,
            self.common.prewarm.as_ref(),
            self.common.chip_options.as_ref(),
            &self.common.faults,
            process.as_ref(),
            deadline,
            self.common.startup_timeout,
            &path,
        )?;
        // Chips that attached are finalized into the rollback, as every later failure does.
        let late = self.common.faults.hit(WorkerId(0), Fault::DeadlineAfterAttach);
        let deadline =
            if late { Instant::now().checked_sub(Duration::from_millis(1)) } else { deadline };
        if let Err(mut e) = past(deadline, self.common.startup_timeout, "engine", &path) {
            for mut s in states {
                e.rollback.extend(attach::residue_entries(&path, s.finalize()));
            }
            return Err(e);
        }
        // Until the engine has started too, a chip's shutdown in a rollback still ends at the
        // start deadline.
        let worker_started = Arc::new(AtomicBool::new(false));
        for s in &mut states {
            s.started_with(&worker_started);
        }
        // 4.
        let mut registry = Registry::default();
        let chips: Vec<WorkerId> = (0..self.devices.len() as u32).map(WorkerId).collect();
        add_chip_callables(&mut registry, &self.chip_regs, &chips);
        add_closures(&mut registry, self.host_regs, Entry::Host);
        registry.next_seq = self.common.next_seq;
        let registry = Arc::new(RwLock::new(registry));
        let residue = Arc::new(Mutex::new(Vec::new()));
        let lineage = reentry::lineage_of(self.common.instance);
        let next_level: Vec<Box<dyn Endpoint>> = states
            .into_iter()
            .map(|state| {
                Box::new(ChipEndpoint {
                    state,
                    residue: Arc::clone(&residue),
                    instance: self.common.instance,
                    lineage: Arc::clone(&lineage),
                }) as Box<dyn Endpoint>
            })
            .collect();
        let ring = self.common.engine_ring(self.heap_ring_size, self.alloc_timeout);
        // On failure the endpoints are dropped, which finalizes every chip into `residue`.
        let engine = build_engine(3, ring, next_level, subs, &lineage, &registry, &path)
            .map_err(|e| with_residue(e, &residue, &path))?;
        // Release: a chip wait that sees it set sees a started worker.
        worker_started.store(true, Ordering::Release);
        // 5.
        let body = Body::Engine { engine, chips, children: Vec::new(), residue };
        let mut inner =
            new_inner(self.common.instance, 3, body, Registry::default(), Vec::new(), self.subs);
        inner.chip_limits = Some(self.platform.limits());
        inner.still_waiting = self.common.still_waiting;
        inner.registry = registry;
        inner.lineage = lineage;
        Ok(Worker { inner: Arc::new(inner) })
    }
}

/// Starts a level's engine with `subs` sub workers (checked by [`check_sub_workers`]).
fn build_engine(
    level: u8,
    ring: RingConfig,
    next_level: Vec<Box<dyn Endpoint>>,
    subs: u32,
    lineage: &reentry::Lineage,
    registry: &SharedRegistry,
    path: &str,
) -> Result<Engine, StartError> {
    let sub: Vec<Box<dyn Endpoint>> = (0..subs)
        .map(|index| {
            Box::new(crate::sub::SubEndpoint {
                index,
                level,
                lineage: Arc::clone(lineage),
                registry: Arc::clone(registry),
            }) as Box<dyn Endpoint>
        })
        .collect();
    let heap = ring.heap_bytes_per_ring;
    let config = EngineConfig { ring, next_level, sub, level, ..EngineConfig::default() };
    Engine::start(config).map_err(|e| start_err(engine_cause(e, heap), path))
}

/// The task ring of a level's engine.
fn ring_config(heap_bytes_per_ring: u64, alloc_timeout: Duration) -> RingConfig {
    RingConfig { heap_bytes_per_ring, alloc_timeout, ..RingConfig::default() }
}

/// Refuses a ring the engine would refuse, before any child or chip starts: a refusal after
/// them would have to close each one again.
fn check_ring(ring: &RingConfig, path: &str) -> Result<(), StartError> {
    let heap = ring.heap_bytes_per_ring;
    ring.validate().map_err(|e| start_err(engine_cause(SchedError::Ring(e), heap), path))
}

/// The start cause of the engine's refusal `e` of a ring of `heap` bytes.
fn engine_cause(e: SchedError, heap: u64) -> StartCause {
    match e {
        // The ring names the field of its own configuration; this worker's user set the
        // size through the builder's heap_ring_size.
        SchedError::Ring(RingError::InvalidConfig { .. })
            if !heap.is_multiple_of(simpler_types::HEAP_ALIGN) =>
        {
            StartCause::HeapRingSize { value: heap, align: simpler_types::HEAP_ALIGN }
        }
        other => StartCause::Engine(Arc::new(other)),
    }
}

/// What an L4+ builder adopts as a child: a builder of level − 1.
#[derive(Debug)]
pub enum ChildSpec {
    /// An L3 child.
    Host(HostWorkerBuilder),
    /// An L4+ child.
    Composite(CompositeWorkerBuilder),
    /// An L3 worker served by another MPI rank.
    #[cfg(feature = "mpi")]
    Remote(crate::remote::RemoteL3),
}

#[cfg(feature = "mpi")]
impl From<crate::remote::RemoteL3> for ChildSpec {
    fn from(r: crate::remote::RemoteL3) -> ChildSpec {
        ChildSpec::Remote(r)
    }
}

impl From<HostWorkerBuilder> for ChildSpec {
    fn from(b: HostWorkerBuilder) -> ChildSpec {
        ChildSpec::Host(b)
    }
}

impl From<CompositeWorkerBuilder> for ChildSpec {
    fn from(b: CompositeWorkerBuilder) -> ChildSpec {
        ChildSpec::Composite(b)
    }
}

impl ChildSpec {
    fn level(&self) -> u8 {
        match self {
            ChildSpec::Host(_) => 3,
            ChildSpec::Composite(c) => c.level,
            #[cfg(feature = "mpi")]
            ChildSpec::Remote(_) => 3,
        }
    }

    fn start_within(self, deadline: Option<Instant>, path: String) -> Result<Worker, StartError> {
        match self {
            ChildSpec::Host(b) => b.start_within(deadline, path),
            ChildSpec::Composite(b) => b.start_within(deadline, path),
            // Remote children are started by the parent's adoption, which compares manifests.
            #[cfg(feature = "mpi")]
            ChildSpec::Remote(_) => {
                Err(start_err(StartCause::Config(ConfigError::RemoteChildAlone), &path))
            }
        }
    }
}

/// Builder of an L4+ worker (the `New` state).
pub struct CompositeWorkerBuilder {
    common: Common,
    level: u8,
    children: Vec<ChildSpec>,
    subs: usize,
    heap_ring_size: u64,
    alloc_timeout: Duration,
    host_regs: Vec<(CallableHandle, String, Arc<HostFn>)>,
    graph_regs: Vec<(CallableHandle, String, Arc<GraphFn>)>,
}

impl std::fmt::Debug for CompositeWorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompositeWorkerBuilder")
            .field("level", &self.level)
            .field("children", &self.children)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
impl CompositeWorkerBuilder {
    /// The faults armed for this builder's own start (on 0).
    pub(crate) fn faults(&self) -> Faults {
        self.common.faults.clone()
    }
}

impl CompositeWorkerBuilder {
    pub(crate) fn new(level: u8) -> Self {
        CompositeWorkerBuilder {
            common: Common::new(),
            level,
            children: Vec::new(),
            subs: 0,
            heap_ring_size: DEFAULT_HEAP_RING_SIZE,
            alloc_timeout: DEFAULT_ALLOC_TIMEOUT,
            host_regs: Vec::new(),
            graph_regs: Vec::new(),
        }
    }

    /// The deadline of the whole start, children included (default 300 s; must be > 0).
    #[must_use]
    pub fn startup_timeout(mut self, t: Duration) -> Self {
        self.common.startup_timeout = t;
        self
    }

    /// Adopts a child builder of level − 1; returns its stable id (adoption order).
    pub fn child(&mut self, spec: impl Into<ChildSpec>) -> Result<WorkerId, ConfigError> {
        let spec = spec.into();
        if self.level < 4 {
            return Err(ConfigError::CompositeLevel { level: self.level });
        }
        if spec.level().checked_add(1) != Some(self.level) {
            return Err(ConfigError::ChildLevel { parent: self.level, child: spec.level() });
        }
        self.children.push(spec);
        Ok(WorkerId(self.children.len() as u32 - 1))
    }

    engine_builder_methods!();

    /// Registers a graph a child runs (it gets the child's graph builder).
    pub fn register_graph(
        &mut self,
        name: &str,
        g: impl Fn(&mut GraphBuilder<'_>, TaskArgsView<'_>, &CallConfig) -> Result<(), BoxError>
        + Send
        + Sync
        + 'static,
    ) -> CallableHandle {
        let h = self.common.closure_handle(CallableKind::Graph);
        self.graph_regs.push((h, name.to_owned(), Arc::new(g)));
        h
    }

    /// Starts the children recursively, then this level (`docs/worker-protocols.md` §2).
    pub fn start(self) -> Result<Worker, StartError> {
        let deadline = deadline_after(self.common.startup_timeout);
        let path = format!("L{}", self.level);
        self.start_within(deadline, path)
    }

    /// The checks of step 1 that need no child; returns the checked sub worker count.
    fn check_before_children(&self, path: &str) -> Result<u32, StartError> {
        self.common.check_timeout(path)?;
        if self.level < 4 {
            return Err(start_err(
                StartCause::Config(ConfigError::CompositeLevel { level: self.level }),
                path,
            ));
        }
        let subs = check_sub_workers(self.subs, path)?;
        check_ring(&ring_config(self.heap_ring_size, self.alloc_timeout), path)?;
        check_host_closures_have_subs(&self.host_regs, self.subs, path)?;
        if let Some((_, name, _)) = self.graph_regs.first().filter(|_| self.children.is_empty()) {
            return Err(start_err(
                StartCause::NoEligibleTarget { callable: name.clone(), needs: "child workers" },
                path,
            ));
        }
        #[cfg(feature = "mpi")]
        if let Some(rank) = shared_rank(&self.children) {
            return Err(start_err(
                StartCause::Remote(crate::remote::RemoteError::RankInUse { rank }),
                path,
            ));
        }
        Ok(subs)
    }

    fn start_within(self, deadline: Option<Instant>, path: String) -> Result<Worker, StartError> {
        let subs = match self.check_before_children(&path) {
            Ok(subs) => subs,
            Err(e) => {
                refuse_unreached(self.children, &e);
                return Err(e);
            }
        };
        // 3.
        let mut started: Vec<Worker> = Vec::new();
        let mut local_ids: Vec<WorkerId> = Vec::new();
        #[cfg(feature = "mpi")]
        let mut remote = crate::remote::Adoption::new(
            self.graph_regs.iter().map(|(h, name, _)| (h.id, name.as_str())),
        );
        let child_count = self.children.len();
        let mut children = Unreached(self.children.into_iter().enumerate());
        while let Some((i, spec)) = children.0.next() {
            let child_path = format!("{path} / child {i} (L{})", spec.level());
            #[cfg(feature = "mpi")]
            let spec = match spec {
                ChildSpec::Remote(r) => {
                    let child_path = format!("{path} / child {i} (L3 on rank {})", r.rank());
                    let timeout = self.common.startup_timeout;
                    let r = match past(deadline, timeout, &child_path, &path) {
                        Ok(()) => {
                            remote.start(WorkerId(i as u32), r, deadline, timeout, &child_path)
                        }
                        Err(e) => {
                            refuse_unreached([ChildSpec::Remote(r)], &e);
                            Err(e)
                        }
                    };
                    if let Err(mut e) = r {
                        rollback_children(started, &local_ids, &mut e.rollback, &path);
                        remote.rollback(&mut e.rollback, &path);
                        refuse_unreached(children.0.by_ref().map(|(_, s)| s), &e);
                        return Err(e);
                    }
                    continue;
                }
                local => local,
            };
            let r = match past(deadline, self.common.startup_timeout, &child_path, &path) {
                Ok(()) => spec.start_within(deadline, child_path),
                Err(e) => {
                    refuse_unreached([spec], &e);
                    Err(e)
                }
            };
            match r {
                Ok(w) => {
                    started.push(w);
                    local_ids.push(WorkerId(i as u32));
                }
                Err(e) => {
                    let mut out = StartError {
                        cause: StartCause::ChildFailed { child: Box::new(e.cause) },
                        path: e.path,
                        rollback: e.rollback,
                    };
                    rollback_children(started, &local_ids, &mut out.rollback, &path);
                    #[cfg(feature = "mpi")]
                    remote.rollback(&mut out.rollback, &path);
                    refuse_unreached(children.0.by_ref().map(|(_, s)| s), &out);
                    return Err(out);
                }
            }
        }
        // 4.
        let mut registry = Registry::default();
        add_closures(&mut registry, self.host_regs, Entry::Host);
        add_closures(&mut registry, self.graph_regs, Entry::Graph);
        registry.next_seq = self.common.next_seq;
        let registry = Arc::new(RwLock::new(registry));
        let name_sources: Vec<SharedRegistry> = started
            .iter()
            .flat_map(|w| {
                std::iter::once(Arc::clone(&w.inner.registry))
                    .chain(w.inner.name_sources.iter().cloned())
            })
            .collect();
        // Adoption: every worker of the subtree now also acts for this one (see `reentry`).
        let lineage = reentry::lineage_of(self.common.instance);
        let subtree_lineages: Vec<reentry::Lineage> = started
            .iter()
            .flat_map(|w| {
                std::iter::once(Arc::clone(&w.inner.lineage))
                    .chain(w.inner.subtree_lineages.iter().cloned())
            })
            .collect();
        for l in &subtree_lineages {
            l.write().push(self.common.instance);
        }
        let residue = Arc::new(Mutex::new(Vec::new()));
        let children: Vec<WorkerId> = (0..child_count as u32).map(WorkerId).collect();
        #[allow(unused_mut, reason = "remote children join the list with feature `mpi`")]
        let mut next_level: Vec<Box<dyn Endpoint>> = started
            .into_iter()
            .zip(local_ids)
            .map(|(w, id)| {
                Box::new(ChildEndpoint {
                    id,
                    parent_lineage: Arc::clone(&lineage),
                    parent_registry: Arc::clone(&registry),
                    child: Some(w),
                    residue: Arc::clone(&residue),
                }) as Box<dyn Endpoint>
            })
            .collect();
        #[cfg(feature = "mpi")]
        let remote_children = remote.children();
        #[cfg(feature = "mpi")]
        {
            for ep in remote.into_endpoints(&residue) {
                let at = next_level.partition_point(|e| e.caps().id < ep.id());
                next_level.insert(at, Box::new(ep));
            }
        }
        let ring = self.common.engine_ring(self.heap_ring_size, self.alloc_timeout);
        // On failure the endpoints are dropped, which closes every child into `residue`.
        let engine = build_engine(self.level, ring, next_level, subs, &lineage, &registry, &path)
            .map_err(|e| with_residue(e, &residue, &path))?;
        let body = Body::Engine { engine, chips: Vec::new(), children, residue };
        let mut inner = new_inner(
            self.common.instance,
            self.level,
            body,
            Registry::default(),
            name_sources,
            self.subs,
        );
        inner.still_waiting = self.common.still_waiting;
        inner.registry = registry;
        inner.lineage = lineage;
        inner.subtree_lineages = subtree_lineages;
        #[cfg(feature = "mpi")]
        {
            inner.remote_children = remote_children;
        }
        Ok(Worker { inner: Arc::new(inner) })
    }
}

/// Attaches what the dropped endpoints of a failed engine start left in `residue` (chips
/// finalized, children closed) to the start error.
fn with_residue(mut e: StartError, residue: &Mutex<Vec<Residue>>, path: &str) -> StartError {
    for r in std::mem::take(&mut *residue.lock()) {
        e.rollback.push(r.into_teardown(path));
    }
    e
}

/// Step 1: host closures need sub workers to run on.
fn check_host_closures_have_subs(
    host_regs: &[(CallableHandle, String, Arc<HostFn>)],
    subs: usize,
    path: &str,
) -> Result<(), StartError> {
    match host_regs.first() {
        Some((_, name, _)) if subs == 0 => Err(start_err(
            StartCause::NoEligibleTarget { callable: name.clone(), needs: "sub workers" },
            path,
        )),
        _ => Ok(()),
    }
}

/// Enters chip callables runnable on `chips`. Registrations of equal content share one
/// runnable entry (the first one's), while every handle keeps its own.
fn add_chip_callables(
    registry: &mut Registry,
    regs: &[(CallableHandle, ChipCallable)],
    chips: &[WorkerId],
) {
    for (h, c) in regs {
        let r =
            Registration { name: Arc::from(c.entry_name()), entry: Entry::Chip(chips.to_vec()) };
        registry.runnable.entry(h.id).or_insert_with(|| r.clone());
        registry.handles.insert(h.seq, (h.id, r));
    }
}

/// Enters named closures (host closures or graphs), each wrapped by `entry`. A closure's id is
/// unique to its registration, so its runnable entry is its own.
fn add_closures<F: ?Sized>(
    registry: &mut Registry,
    regs: Vec<(CallableHandle, String, Arc<F>)>,
    entry: impl Fn(Arc<F>) -> Entry,
) {
    for (h, name, f) in regs {
        let r = Registration { name: Arc::from(name.as_str()), entry: entry(f) };
        registry.runnable.insert(h.id, r.clone());
        registry.handles.insert(h.seq, (h.id, r));
    }
}

/// Closes the children started (`ids`: their child ids) of a start that failed.
fn rollback_children(
    started: Vec<Worker>,
    ids: &[WorkerId],
    rollback: &mut Vec<TeardownError>,
    path: &str,
) {
    for (w, &id) in started.into_iter().zip(ids) {
        if let Err(e) = w.close() {
            rollback.push(TeardownError {
                path: path.to_owned(),
                what: TeardownPart::Child(id),
                cause: TeardownCause::Child(Box::new(e)),
            });
        }
    }
}

#[cfg(test)]
mod tests;
