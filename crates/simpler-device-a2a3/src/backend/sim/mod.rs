//! The simulated A2/A3 chip (`docs/device-simulator.md`).
//!
//! A [`SimDevice`] owns its memory, two streams, 72 register blocks, the persistent threads, a
//! fault plan and a virtual 50 MHz counter. Nothing is global: any number of devices coexist in
//! one process. Four AICPU threads (`sim<d>-aicpu<i>`) start in `ensure_initialized`; AICore
//! cores (`sim<d>-aicore<i>`) start on first need, up to `3 * max(block_dim used)`; none is
//! re-spawned per run. Between launches every thread parks on its mailbox without a timeout (an
//! AICPU thread after lingering 30 µs for the next job), so an idle device uses no CPU.
//!
//! The AICPU threads run the real scheduler ([`crate::aicpu`]) through [`SimAicpu`]
//! (`platform`), the simulator's AICPU platform, or, with `SimOptions::aicpu_program`, the
//! built AICPU program through its C entries (`program`); the AICore cores run the simulated executor
//! (`aicore`) or, with `SimOptions::aicore_executor`, the C++ executor written for the AICore
//! (`cxx_core`).
//!
//! Module graph, without a circle: this module uses `aicore` (the simulated core's side of
//! the protocol, reached through the `CoreHost` trait this module's shared state implements),
//! `faults`, `loader`, `memory`, `regs`, `stream` and `wait`; `aicore` uses only `faults`,
//! `regs`, `stream` and `wait`; `stream` reaches the device through its `Starter` trait.
//!
//! Thread protocol (numbered, per thread):
//!
//! 1. Park on the mailbox until it holds a job or `Quit`.
//! 2. On a job: run the participant (AICPU `exec` or the AICore executor), catching panics.
//! 3. Report the result to the entry; the last participant completes the entry and starts the
//!    next one on that stream.
//! 4. Go to 1. On `Quit`: leave; the exit guard counts the thread as gone.
//!
//! Shutdown (finalize): set `reset` (every simulated wait gives up), abort running entries,
//! wake every waiter, post `Quit` to every mailbox, then join the threads within the join
//! budget; a thread stuck in user kernel code is detached and named (`docs/device-runner.md`).
//!
//! Step labels (P1–P18, L1–L3, R1–R3, C1–C3) are the run-lifecycle steps defined in
//! `docs/device-runner.md`.

mod aicore;
mod cxx_core;
mod drive;
mod faults;
mod loader;
mod mailbox;
mod memory;
mod orchestration;
mod platform;
mod program;
mod regs;
mod stream;
mod threads;
mod wait;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

pub use self::faults::{FaultPlan, FiredFault};
use self::loader::SharedObject;
pub(crate) use self::wait::{EventCount, SpinGate, SpinPolicy};

use self::aicore::{CoreHost, Server};
use self::mailbox::{Mail, Mailbox};
use self::memory::SimMemory;
pub(crate) use self::platform::SimAicpu;
use self::regs::RegBlock;
use self::stream::{
    EntryKind, LaunchEntry, SimEvent, SimStream, Starter, resume_waiters, synchronize_event,
};
use crate::abi::codes::AclCode;
use crate::abi::launch::{InitArgs, KernelArgs};
use crate::abi::regs::RegId;
use crate::abi::{
    CorePlace, CoreType, MAX_AICPU_THREADS, MAX_LAUNCH_CORES, NS_PER_TICK, PHYSICAL_CORE_LIMIT,
};
use crate::aicpu::view::{CoreImageView, ImageView};
use crate::backend::{
    AllocFailure, Backend, EventHandle, EventStatus, LaunchHandle, LaunchState, LoadedCode,
    MemoryCounts, NoHostView, ResolvedKernels, StreamFault, StreamStatus, SyncError, ThreadStats,
    in_range,
};
use crate::callable::{ChipCallable, KernelCode};
use crate::error::{
    CallableProblem, CoreFault, DeviceError, InitFailure, InitStep, KernelCodeKind, KernelKind,
    MemPurpose, StreamKind,
};
use crate::options::{CoreDispatch, SimOptions};
use crate::runtime::DeviceOrchestration;

use self::stream::LaunchEntry as SimLaunch;

/// Stream index of the AICPU stream.
pub(crate) const AICPU_STREAM: usize = 0;
/// Stream index of the AICore stream.
pub(crate) const AICORE_STREAM: usize = 1;

/// Role of a simulated thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Aicpu,
    AiCore,
}

/// State shared by the device handle and its threads.
pub(crate) struct SimShared {
    pub(crate) device_id: u32,
    pub(crate) opts: SimOptions,
    origin: Instant,
    pub(crate) regs: Box<[RegBlock]>,
    aicpu_wake: [EventCount; MAX_AICPU_THREADS as usize],
    /// AICPU thread + 1 that owns each core's `COND` (0 = unknown); written by that thread
    /// before it opens the window (release), read by the core when it writes `COND`.
    owner: Box<[AtomicU32]>,
    /// Set once by finalize (release); read by every simulated wait (acquire), which then
    /// gives up.
    pub(crate) reset: AtomicBool,
    pub(crate) faults: FaultPlan,
    fault_log: Mutex<Vec<CoreFault>>,
    pub(crate) memory: SimMemory,
    streams: [SimStream; 2],
    init: Mutex<Option<InitArgs>>,
    /// The built AICPU program the AICPU threads run (`SimOptions::aicpu_program`); set once
    /// by `start_programs` before any AICPU launch.
    program: std::sync::OnceLock<self::program::AicpuProgram>,
    /// The C++ AICore executor the cores run (`SimOptions::aicore_executor`); set once by
    /// `start_programs` before any AICore launch.
    executor: std::sync::OnceLock<self::cxx_core::CxxExecutor>,
    aicpu_mail: Box<[Mailbox]>,
    aicore_mail: Box<[Mailbox]>,
    /// Spin rounds of every wait (`SimOptions::spin_iters`, default 64); written at attach,
    /// read relaxed by waiters.
    spins: AtomicU32,
    /// Awake simulated threads, gating the spin phase of every wait.
    gate: SpinGate,
    /// `block_dim` of the AICore launch that started last (a queued one may follow it); set
    /// when its entry starts, read relaxed by fault reports only (stale: a mislabelled type).
    block_dim: AtomicU32,
    /// Threads alive: incremented by the host at spawn, decremented by each thread's exit guard
    /// under `exit_lock`; read by finalize (waiting on `exit_cv`) and statistics.
    alive: AtomicU32,
    /// Threads parked on their mailbox: each thread increments it before waiting and
    /// decrements it after; read relaxed by statistics only.
    parked: AtomicU32,
    exit_lock: Mutex<()>,
    exit_cv: Condvar,
}

impl fmt::Debug for SimShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimShared").field("device_id", &self.device_id).finish_non_exhaustive()
    }
}

impl SimShared {
    /// The virtual 50 MHz counter (host monotonic clock / 20 ns).
    pub(crate) fn ticks(&self) -> u64 {
        (self.origin.elapsed().as_nanos() / u128::from(NS_PER_TICK)) as u64
    }

    /// The host instant of counter value `ticks`.
    pub(crate) fn instant_of(&self, ticks: u64) -> Instant {
        self.origin + Duration::from_nanos(ticks.saturating_mul(NS_PER_TICK).min(u64::MAX / 2))
    }

    /// The spin policy of the current launch.
    pub(crate) fn spin_policy(&self) -> SpinPolicy<'_> {
        SpinPolicy {
            spins: self.spins.load(Ordering::Relaxed),
            yields: self.opts.yield_iters,
            gate: &self.gate,
        }
    }

    /// Whether the device is being reset.
    pub(crate) fn is_reset(&self) -> bool {
        self.reset.load(Ordering::Acquire)
    }

    /// Stores `COND` of core `w` and wakes the AICPU thread that owns it.
    pub(crate) fn store_cond(&self, w: u32, v: u32) {
        let Some(block) = self.regs.get(w as usize) else { return };
        block.store(RegId::Cond, v);
        match self.owner[w as usize].load(Ordering::Acquire) {
            0 => self.notify_all_aicpu(),
            t => self.aicpu_wake[(t - 1) as usize % self.aicpu_wake.len()].notify(),
        }
    }

    /// After a store to core `c`'s `DATA_MAIN_BASE`: serves a new token on this thread when
    /// the options allow it, otherwise wakes the core's thread (`docs/device-simulator.md`,
    /// "Who runs a dispatch").
    pub(crate) fn ring_core(&self, c: u32, block: &RegBlock) {
        self.after_ring(c, block, drive::ring(self, c, self.ring_server()));
    }

    /// Who serves a token an AICPU thread's store rang, unless that thread holds it: the
    /// thread itself while every host core is taken by an awake simulated thread and the
    /// options allow it, otherwise nobody here (the core's thread).
    fn ring_server(&self) -> Server {
        match self.may_spare_threads() && self.gate.saturated() {
            true => Server::BUSY_HOST,
            false => Server::Nobody,
        }
    }

    /// Does what a ring of core `c` left to do.
    fn after_ring(&self, c: u32, block: &RegBlock, ring: drive::Ring) {
        match ring {
            drive::Ring::Handled => {}
            drive::Ring::Wake => block.wake.notify(),
            drive::Ring::Adopt => self.post(Role::AiCore, c, Mail::Adopt),
            drive::Ring::Finish(stream, entry, code) => self.finish(stream, &entry, code),
        }
    }

    /// Hands the held tokens of `cores` to the cores' threads.
    fn hand_over(&self, cores: u128) {
        for c in drive::cores_of(cores) {
            if let Some(block) = self.regs.get(c as usize) {
                self.after_ring(c, block, drive::ring(self, c, Server::Nobody));
            }
        }
    }

    /// Whether the simulator may spare its threads wake-ups (`drive.rs`, and brief AICPU parts
    /// riding along with another participant): under `CoreDispatch::Auto`, and not while a
    /// fault is armed (an injected hang, delay or handshake fault needs the core's own thread).
    fn may_spare_threads(&self) -> bool {
        self.opts.core_dispatch == CoreDispatch::Auto && !self.faults.is_armed()
    }

    /// Wakes every AICPU thread.
    pub(crate) fn notify_all_aicpu(&self) {
        for ec in &self.aicpu_wake {
            ec.notify();
        }
    }

    /// Wakes every simulated thread's waits (an abort or a reset): core threads parked on
    /// their register block, and those whose launch AICPU threads drive, which must adopt it.
    fn wake_all(&self) {
        self.notify_all_aicpu();
        for (c, block) in self.regs.iter().enumerate() {
            block.wake.notify();
            if block.unthreaded.lock().is_some() {
                self.post(Role::AiCore, c as u32, Mail::Adopt);
            }
        }
    }

    /// Records a fault for the host to report with the run's error.
    pub(crate) fn record_fault(&self, fault: CoreFault) {
        tracing::warn!(device = self.device_id, %fault, "simulated device fault");
        self.fault_log.lock().push(fault);
    }

    /// Reads the `KernelArgs` at device address `addr`, if it is tracked memory.
    pub(crate) fn read_kernel_args(&self, addr: u64) -> Option<KernelArgs> {
        self.memory.find(addr, size_of::<KernelArgs>() as u64)?;
        if !addr.is_multiple_of(align_of::<KernelArgs>() as u64) {
            return None;
        }
        // SAFETY: the range lies inside a live tracked allocation (checked above), is aligned,
        // and the host wrote it before the launch; nobody writes it while the launch runs.
        Some(unsafe { std::ptr::read(addr as *const KernelArgs) })
    }

    /// A checked view of the launch's runtime image.
    pub(crate) fn image_view(&self, args: &KernelArgs) -> Option<ImageView<'_>> {
        self.memory.find(args.image_base, args.image_len)?;
        // SAFETY: the image lies inside one live tracked allocation (checked above) that the
        // runner keeps alive and unwritten by the host while the launch runs; the simulated
        // threads hold the device (and so the memory) alive for the view's lifetime.
        unsafe { ImageView::from_raw(args.image_base as *mut u8, args.image_len) }.ok()
    }

    /// The AICore's view of the launch's runtime image (no per-task checks).
    pub(crate) fn core_image_view(&self, args: &KernelArgs) -> Option<CoreImageView<'_>> {
        self.memory.find(args.image_base, args.image_len)?;
        // SAFETY: as in `image_view`.
        unsafe { CoreImageView::from_raw(args.image_base as *mut u8, args.image_len) }.ok()
    }

    fn mailbox(&self, role: Role, index: u32) -> &Mailbox {
        match role {
            Role::Aicpu => &self.aicpu_mail[index as usize],
            Role::AiCore => &self.aicore_mail[index as usize],
        }
    }

    fn post(&self, role: Role, index: u32, mail: Mail) {
        self.mailbox(role, index).put(mail);
    }

    pub(super) fn finish(&self, stream: usize, entry: &Arc<LaunchEntry>, code: i32) {
        if entry.finish_participant(code) {
            let fired = self.streams[stream].complete(entry, self);
            resume_waiters(fired, &self.streams, self);
        }
    }

    /// Runs one AICPU exec participant.
    fn run_aicpu(&self, entry: &LaunchEntry, thread: u32) -> i32 {
        let Some(args) = self.read_kernel_args(entry.args) else {
            self.record_aicpu_fault(
                None,
                "AICPU launch argument block is not device memory".into(),
            );
            return 3;
        };
        let Some(view) = self.image_view(&args) else {
            self.record_aicpu_fault(None, "AICPU launch names no valid runtime image".into());
            return 3;
        };
        if thread == 0 && self.faults.on_aicpu_start() {
            panic!("injected AICPU panic");
        }
        let init = (*self.init.lock()).unwrap_or_default();
        let code = match self.program.get() {
            Some(program) => program.exec(self, entry, &args, init),
            None => {
                let platform = SimAicpu::new(self, entry, thread);
                crate::aicpu::exec(&platform, &init, &view, thread)
            }
        };
        if thread == 0 && self.faults.on_aicpu_entry() {
            self.record_aicpu_fault(None, "injected AICPU fault".into());
            return code.max(1);
        }
        code
    }

    /// The AICPU participants of `entry` (a bit per thread) whose parts never wait, which may
    /// run on another participant's thread: none unless the simulator runs its own AICPU
    /// program (a built one numbers its threads itself) and [`may_spare_threads`](Self::may_spare_threads).
    fn brief_aicpu_parts(&self, entry: &LaunchEntry, threads: u32) -> u32 {
        if !self.may_spare_threads() || self.program.get().is_some() {
            return 0;
        }
        let Some(args) = self.read_kernel_args(entry.args) else { return 0 };
        // The header is all it needs: no walk over the task section under the stream's lock.
        let Some(view) = self.core_image_view(&args) else { return 0 };
        (0..threads.min(u32::BITS))
            .filter(|&t| crate::aicpu::part_is_brief(view.header(), t))
            .fold(0, |set, t| set | 1 << t)
    }

    pub(super) fn record_aicpu_fault(&self, core: Option<u32>, message: String) {
        self.record_fault(CoreFault {
            code: AclCode::AICPU_EXCEPTION,
            stream: StreamKind::Aicpu,
            core: core.map(|w| (w, core_type_of(w, self))),
            func_id: None,
            task: None,
            message,
            at_ticks: self.ticks(),
        });
    }
}

/// Core type of core `w` in the current launch shape (for fault reports).
pub(crate) fn core_type_of(w: u32, dev: &SimShared) -> CoreType {
    let b = dev.block_dim.load(Ordering::Relaxed);
    CorePlace::of(w, b).map_or(CoreType::Aiv, |p| p.core_type)
}

impl Starter for SimShared {
    fn post(&self, stream: usize, entry: &Arc<LaunchEntry>) {
        match entry.kind {
            EntryKind::AiCore { block_dim } => {
                self.block_dim.store(block_dim, Ordering::Relaxed); // Relaxed: see the field.
                // Unthreaded when AICPU threads may do the cores' part, unless another
                // executor runs the cores.
                let unthreaded = self.may_spare_threads() && self.executor.get().is_none();
                for w in 0..3 * block_dim {
                    let block = &self.regs[w as usize];
                    // Silicon resets DATA_MAIN_BASE at launch; the simulator also clears COND
                    // so a stale value from the previous run is never observed.
                    block.store(RegId::DataMainBaseLow, 0);
                    block.store(RegId::DataMainBaseHigh, 0);
                    block.store(RegId::Cond, 0);
                    self.owner[w as usize].store(0, Ordering::Relaxed);
                    if !(unthreaded && drive::start_unthreaded(self, stream, entry, w)) {
                        let job = Mail::Job { stream, entry: entry.clone(), brief: 0 };
                        self.post(Role::AiCore, w, job);
                    }
                }
            }
            EntryKind::Aicpu { threads } => {
                // Parts that never wait ride along with the first part that may: waking a
                // thread only to record that it owns nothing costs more than the part itself.
                let brief = self.brief_aicpu_parts(entry, threads);
                let host = (0..threads).find(|t| brief & (1 << t) == 0).unwrap_or(0);
                for t in (0..threads).filter(|&t| t == host || brief & (1 << t) == 0) {
                    let brief = if t == host { brief & !(1 << t) } else { 0 };
                    self.post(Role::Aicpu, t, Mail::Job { stream, entry: entry.clone(), brief });
                }
            }
            EntryKind::Record(_) | EntryKind::WaitEvent(_) => {}
        }
    }

    fn ticks(&self) -> u64 {
        SimShared::ticks(self)
    }
}

/// A simulated A2/A3 chip.
pub(crate) struct SimDevice {
    shared: Arc<SimShared>,
    threads: Vec<(String, JoinHandle<()>)>,
    aicore_spawned: u32,
    /// AICPU threads started so far; a retried start resumes from here.
    aicpu_spawned: u32,
    /// Where the AICPU side writes `DeviceObject` orchestrations.
    orch_dir: self::orchestration::ObjectDir,
    /// Successful spawns still allowed before spawning fails (unit tests of partial starts).
    #[cfg(test)]
    spawn_budget: Option<u32>,
    /// Every launch and stream synchronisation the host issued, in order (read by the launch-order test).
    #[cfg(test)]
    host_log: Mutex<Vec<HostCall>>,
}

/// A launch or synchronisation the host issued, as recorded in the test launch log.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostCall {
    /// An accepted AICore launch (L2).
    LaunchAiCore,
    /// An accepted AICPU launch (L3).
    LaunchAicpu,
    /// A synchronisation of this stream.
    Sync(StreamKind),
}

impl fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimDevice")
            .field("device_id", &self.shared.device_id)
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

impl SimDevice {
    pub(crate) fn new(device_id: u32, opts: SimOptions) -> SimDevice {
        let mailboxes = |n: usize| (0..n).map(|_| Mailbox::default()).collect::<Box<[_]>>();
        let shared = SimShared {
            device_id,
            opts,
            origin: Instant::now(),
            regs: (0..MAX_LAUNCH_CORES).map(|_| RegBlock::default()).collect(),
            aicpu_wake: Default::default(),
            owner: (0..MAX_LAUNCH_CORES).map(|_| AtomicU32::new(0)).collect(),
            reset: AtomicBool::new(false),
            faults: FaultPlan::default(),
            fault_log: Mutex::new(Vec::new()),
            memory: SimMemory::new(opts.memory_limit),
            streams: [
                SimStream::new(StreamKind::Aicpu, AICPU_STREAM),
                SimStream::new(StreamKind::AiCore, AICORE_STREAM),
            ],
            init: Mutex::new(None),
            program: std::sync::OnceLock::new(),
            executor: std::sync::OnceLock::new(),
            aicpu_mail: mailboxes(MAX_AICPU_THREADS as usize),
            aicore_mail: mailboxes(MAX_LAUNCH_CORES),
            spins: AtomicU32::new(opts.spin_iters.unwrap_or(64)),
            gate: SpinGate::new(opts.host_cores.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
            })),
            block_dim: AtomicU32::new(0),
            alive: AtomicU32::new(0),
            parked: AtomicU32::new(0),
            exit_lock: Mutex::new(()),
            exit_cv: Condvar::new(),
        };
        SimDevice {
            shared: Arc::new(shared),
            threads: Vec::new(),
            aicore_spawned: 0,
            aicpu_spawned: 0,
            orch_dir: self::orchestration::ObjectDir::new(device_id),
            #[cfg(test)]
            spawn_budget: None,
            #[cfg(test)]
            host_log: Mutex::new(Vec::new()),
        }
    }

    fn spawn(&mut self, role: Role, index: u32) -> std::io::Result<()> {
        let name = match role {
            Role::Aicpu => format!("sim{}-aicpu{index}", self.shared.device_id),
            Role::AiCore => format!("sim{}-aicore{index}", self.shared.device_id),
        };
        #[cfg(test)]
        if let Some(left) = self.spawn_budget.as_mut() {
            if *left == 0 {
                return Err(std::io::Error::other("injected spawn failure"));
            }
            *left -= 1;
        }
        let dev = self.shared.clone();
        self.shared.alive.fetch_add(1, Ordering::AcqRel);
        match std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || threads::thread_main(dev, role, index))
        {
            Ok(h) => {
                self.threads.push((name, h));
                Ok(())
            }
            Err(e) => {
                self.shared.alive.fetch_sub(1, Ordering::AcqRel);
                Err(e)
            }
        }
    }

    /// Starts the four persistent AICPU threads (ensure_initialized step 2). After a partial
    /// failure a retry starts only the threads still missing, so no mailbox gets two threads.
    pub(crate) fn start_aicpu_threads(&mut self) -> Result<(), InitFailure> {
        while self.aicpu_spawned < MAX_AICPU_THREADS {
            let thread = self.aicpu_spawned;
            self.spawn(Role::Aicpu, thread)
                .map_err(|source| InitFailure::ThreadSpawn { thread, source })?;
            self.aicpu_spawned += 1;
        }
        Ok(())
    }

    fn ensure_aicore_cores(&mut self, n: u32) -> std::io::Result<()> {
        while self.aicore_spawned < n {
            self.spawn(Role::AiCore, self.aicore_spawned)?;
            self.aicore_spawned += 1;
        }
        Ok(())
    }

    /// The fault plan.
    pub(crate) fn faults(&self) -> &FaultPlan {
        &self.shared.faults
    }

    /// Takes the launch log recorded so far.
    #[cfg(test)]
    pub(crate) fn take_host_log(&self) -> Vec<HostCall> {
        std::mem::take(&mut *self.host_log.lock())
    }

    /// Resets the device and joins its threads within `budget`; returns the names of threads
    /// that had to be detached. Memory is freed once every thread is gone (a detached thread
    /// keeps it alive until it returns).
    fn shutdown_within(&mut self, budget: Duration) -> Vec<String> {
        let dev = &*self.shared;
        dev.reset.store(true, Ordering::Release);
        for s in &dev.streams {
            s.abort_running();
        }
        dev.wake_all();
        for i in 0..MAX_AICPU_THREADS {
            dev.post(Role::Aicpu, i, Mail::Quit);
        }
        for i in 0..self.aicore_spawned {
            dev.post(Role::AiCore, i, Mail::Quit);
        }
        let deadline = wait::deadline_after(budget);
        let all_left = {
            let mut g = dev.exit_lock.lock();
            while dev.alive.load(Ordering::Acquire) > 0 {
                if wait::wait_on(&dev.exit_cv, &mut g, deadline) {
                    break;
                }
            }
            dev.alive.load(Ordering::Acquire) == 0
        };
        let mut stuck = Vec::new();
        for (name, h) in self.threads.drain(..) {
            // A thread whose exit guard ran is past all simulated work and only unwinding its
            // stack, so joining it cannot block for long.
            if all_left || h.is_finished() {
                let _ = h.join();
            } else {
                tracing::error!(thread = %name, "simulated thread did not exit within the join budget; detached");
                stuck.push(name);
            }
        }
        if stuck.is_empty() {
            dev.memory.free_all();
        }
        stuck
    }
}

/// The simulator's own event behind `event`, `None` if another backend recorded it.
fn sim_event(event: &EventHandle) -> Option<Arc<SimEvent>> {
    event.clone().into_any().downcast::<SimEvent>().ok()
}

/// A launch the simulated device refuses, as CANN refuses one: `LAUNCH_FAILED`, with why.
fn refused(why: impl Into<String>) -> StreamFault {
    StreamFault::new(AclCode::LAUNCH_FAILED, why)
}

fn foreign_event() -> StreamFault {
    StreamFault::new(AclCode::INTERNAL_ERROR, "the event was not recorded by this simulated device")
}

/// The simulated streams by kind.
fn stream_index(s: StreamKind) -> usize {
    match s {
        StreamKind::Aicpu => AICPU_STREAM,
        StreamKind::AiCore => AICORE_STREAM,
    }
}

impl LaunchState for SimLaunch {
    fn started_ticks(&self) -> u64 {
        // The entry stores ticks + 1 so that 0 can mean "not started".
        self.started_ticks.load(Ordering::Acquire).saturating_sub(1)
    }
}

/// Resolves every kernel of `c` to a host function the simulated cores can call: `Native`
/// kernels directly, shared objects through the loader (kept open in the result).
fn resolve_for_sim(c: &ChipCallable) -> Result<ResolvedKernels, DeviceError> {
    let mut r = ResolvedKernels::default();
    for (id, k) in c.children() {
        let addr = match k.code() {
            KernelCode::Native(f) => *f as usize as u64,
            KernelCode::SharedObject(so) => {
                let fail = |e| DeviceError::InvalidCallable {
                    run_id: None,
                    problem: CallableProblem::KernelObject { func_id: *id, source: Box::new(e) },
                };
                // SAFETY: `SharedObjectKernel::new`'s contract: the object may be loaded and its
                // `kernel_entry` has the kernel ABI.
                let obj = unsafe { SharedObject::open(so.path()) }.map_err(fail)?;
                // SAFETY: as above.
                let entry = unsafe { obj.kernel_entry() }.map_err(fail)?;
                r.code.push(LoadedCode::new(obj));
                entry as usize as u64
            }
            KernelCode::Text(_) => {
                return Err(DeviceError::InvalidCallable {
                    run_id: None,
                    problem: CallableProblem::KernelCode {
                        func_id: *id,
                        code: KernelCodeKind::Text,
                    },
                });
            }
        };
        r.kernels.push((*id, addr));
    }
    Ok(r)
}

impl Backend for SimDevice {
    fn start_programs(&mut self) -> Result<(), DeviceError> {
        let refuse =
            |failure| DeviceError::Init { run_id: None, step: InitStep::LoadPrograms, failure };
        if let Some(path) = self.shared.opts.aicpu_program
            && self.shared.program.get().is_none()
        {
            let program = self::program::AicpuProgram::open(path)
                .map_err(|e| refuse(InitFailure::Program(Box::new(e))))?;
            // Threads only read the cell, after it was set (no AICPU launch ran yet).
            let _ = self.shared.program.set(program);
        }
        if let Some(path) = self.shared.opts.aicore_executor
            && self.shared.executor.get().is_none()
        {
            let exe = self::cxx_core::CxxExecutor::open(path)
                .map_err(|e| refuse(InitFailure::Program(Box::new(e))))?;
            // Cores only read the cell, after it was set (no AICore launch ran yet).
            let _ = self.shared.executor.set(exe);
        }
        self.start_aicpu_threads().map_err(refuse)
    }

    fn init_aicpu(&mut self, init: InitArgs) -> Result<(), DeviceError> {
        if let Some(program) = self.shared.program.get() {
            let code = program.init(&init);
            if code != 0 {
                return Err(DeviceError::Init {
                    run_id: None,
                    step: InitStep::AicpuInit,
                    failure: InitFailure::AicpuInitEntry { code },
                });
            }
        }
        *self.shared.init.lock() = Some(init);
        Ok(())
    }

    fn default_block_dim(&self) -> u32 {
        self.shared.opts.default_block_dim
    }

    fn resolve_kernels(&self, c: &ChipCallable) -> Result<ResolvedKernels, DeviceError> {
        resolve_for_sim(c)
    }

    fn runs_native_device_orchestration(&self) -> bool {
        // The simulated AICPU threads run in this process, so a Rust orchestration's function
        // pointer is callable there, but only by the simulator's own scheduler: the built AICPU
        // program is a separate compilation (its types are not this crate's, and it aborts on
        // panic, so an unwinding orchestration would cross its frames), as on the device.
        self.shared.opts.aicpu_program.is_none()
    }

    fn load_orchestration(
        &mut self,
        slot: u32,
        object: &[u8],
        entry: &str,
        config: &str,
    ) -> Result<(DeviceOrchestration, Option<LoadedCode>), DeviceError> {
        self::orchestration::load(self, slot, object, entry, config)
    }

    fn unload_orchestration(&mut self, slot: u32) {
        self::orchestration::unload(self, slot);
    }

    fn malloc(&self, bytes: u64, purpose: MemPurpose) -> Result<u64, AllocFailure> {
        self.shared.memory.alloc(bytes, purpose)
    }

    fn free(&self, addr: u64) -> Option<MemPurpose> {
        self.shared.memory.free(addr)
    }

    fn find(&self, addr: u64, len: u64) -> Option<MemPurpose> {
        self.shared.memory.find(addr, len)
    }

    fn write(&self, dst: u64, src: &[u8]) -> Result<(), DeviceError> {
        in_range(self.shared.memory.write(dst, src), dst, src.len() as u64)
    }

    fn read(&self, src: u64, dst: &mut [u8]) -> Result<(), DeviceError> {
        let done = !self.shared.faults.on_read() && self.shared.memory.read(src, dst);
        in_range(done, src, dst.len() as u64)
    }

    fn fill(&self, dst: u64, value: u8, len: u64) -> Result<(), DeviceError> {
        in_range(self.shared.memory.fill(dst, value, len), dst, len)
    }

    fn host_map(&self, addr: u64, len: u64) -> Result<*mut u8, NoHostView> {
        // Simulated device memory is host memory: the mapping is the identity.
        let found = self.shared.memory.find(addr, len);
        found.map(|_| addr as usize as *mut u8).ok_or(NoHostView::NotOneAllocation)
    }

    fn memory_counts(&self) -> MemoryCounts {
        self.shared.memory.counts()
    }

    fn register_table(&self) -> Result<Vec<u64>, DeviceError> {
        // A simulated core's physical id is its core index.
        let mut table: Vec<u64> = self.shared.regs.iter().map(RegBlock::window_base).collect();
        table.resize(table.len().max(PHYSICAL_CORE_LIMIT as usize), 0);
        Ok(table)
    }

    fn launch_aicore(&mut self, block_dim: u32, args: u64) -> Result<LaunchHandle, StreamFault> {
        if self.shared.faults.on_launch(KernelKind::AiCore) {
            return Err(refused("the fault plan refused the AICore launch"));
        }
        // An entry of no cores would never complete, and hold its stream for good.
        let cores = block_dim.checked_mul(3).filter(|&n| n != 0 && n as usize <= MAX_LAUNCH_CORES);
        let Some(cores) = cores else {
            return Err(refused(format!(
                "block_dim {block_dim} needs 1 to {} AICore cores per block",
                MAX_LAUNCH_CORES / 3
            )));
        };
        self.ensure_aicore_cores(cores).map_err(|e| {
            refused(format!("the {cores} simulated AICore cores could not be started: {e}"))
        })?;
        let entry = LaunchEntry::new(EntryKind::AiCore { block_dim }, args);
        #[cfg(test)]
        self.host_log.lock().push(HostCall::LaunchAiCore);
        let fired = self.shared.streams[AICORE_STREAM].enqueue(entry.clone(), &*self.shared);
        resume_waiters(fired, &self.shared.streams, &*self.shared);
        self.shared.faults.after_launch(KernelKind::AiCore);
        Ok(entry)
    }

    fn launch_aicpu(&mut self, threads: u32, args: u64) -> Result<LaunchHandle, StreamFault> {
        if self.shared.faults.on_launch(KernelKind::Aicpu) {
            return Err(refused("the fault plan refused the AICPU launch"));
        }
        if self.aicpu_spawned < MAX_AICPU_THREADS {
            return Err(refused("the simulated AICPU threads are not started"));
        }
        if threads == 0 || threads > MAX_AICPU_THREADS {
            return Err(refused(format!(
                "{threads} AICPU threads asked for, 1 to {MAX_AICPU_THREADS} exist"
            )));
        }
        let entry = LaunchEntry::new(EntryKind::Aicpu { threads }, args);
        #[cfg(test)]
        self.host_log.lock().push(HostCall::LaunchAicpu);
        let fired = self.shared.streams[AICPU_STREAM].enqueue(entry.clone(), &*self.shared);
        resume_waiters(fired, &self.shared.streams, &*self.shared);
        self.shared.faults.after_launch(KernelKind::Aicpu);
        Ok(entry)
    }

    fn synchronize(
        &self,
        stream: StreamKind,
        timeout: Duration,
        op_execute: Duration,
    ) -> Result<(), SyncError> {
        #[cfg(test)]
        self.host_log.lock().push(HostCall::Sync(stream));
        let dev = &*self.shared;
        dev.streams[stream_index(stream)].synchronize(timeout, Some(op_execute), &|| dev.wake_all())
    }

    fn query(&self, stream: StreamKind, op_execute: Duration) -> StreamStatus {
        let dev = &*self.shared;
        dev.streams[stream_index(stream)].query(Some(op_execute), &|| dev.wake_all())
    }

    fn record_event(&mut self, stream: StreamKind) -> Result<EventHandle, StreamFault> {
        let ev = Arc::new(SimEvent::default());
        let entry = LaunchEntry::new(EntryKind::Record(ev.clone()), 0);
        let fired = self.shared.streams[stream_index(stream)].enqueue(entry, &*self.shared);
        resume_waiters(fired, &self.shared.streams, &*self.shared);
        Ok(ev)
    }

    fn wait_event(&mut self, stream: StreamKind, event: &EventHandle) -> Result<(), StreamFault> {
        let Some(ev) = sim_event(event) else { return Err(foreign_event()) };
        let entry = LaunchEntry::new(EntryKind::WaitEvent(ev), 0);
        let fired = self.shared.streams[stream_index(stream)].enqueue(entry, &*self.shared);
        resume_waiters(fired, &self.shared.streams, &*self.shared);
        Ok(())
    }

    fn event_status(&self, event: &EventHandle, op_execute: Duration) -> EventStatus {
        let Some(ev) = sim_event(event) else {
            return EventStatus::Failed(foreign_event());
        };
        let dev = &*self.shared;
        for s in &dev.streams {
            s.watchdog(Some(op_execute), &|| dev.wake_all());
        }
        match ev.outcome() {
            None => EventStatus::Pending,
            Some(Ok(())) => EventStatus::Complete,
            Some(Err(f)) => EventStatus::Failed(f),
        }
    }

    fn event_synchronize(
        &self,
        event: &EventHandle,
        timeout: Duration,
        op_execute: Duration,
    ) -> Result<(), SyncError> {
        let Some(ev) = sim_event(event) else {
            return Err(SyncError::Fault(foreign_event()));
        };
        let dev = &*self.shared;
        let deadline = wait::deadline_after(timeout);
        synchronize_event(&ev, &dev.streams, deadline, op_execute, &|| dev.wake_all())
    }

    fn drain(&self, timeout: Duration, op_execute: Duration) -> bool {
        let dev = &*self.shared;
        let deadline = wait::deadline_after(timeout);
        dev.streams.iter().all(|s| s.wait_idle(deadline, Some(op_execute), &|| dev.wake_all()))
    }

    fn take_faults(&self) -> Vec<CoreFault> {
        let mut v = std::mem::take(&mut *self.shared.fault_log.lock());
        v.sort_by_key(|f| f.at_ticks);
        v
    }

    fn thread_stats(&self) -> ThreadStats {
        ThreadStats {
            spawned: self.threads.len() as u32,
            alive: self.shared.alive.load(Ordering::Acquire),
            parked: self.shared.parked.load(Ordering::Relaxed),
        }
    }

    fn shutdown(&mut self) -> Vec<String> {
        let budget = self.shared.opts.join_budget;
        self.shutdown_within(budget)
    }

    fn sim(&self) -> Option<&SimDevice> {
        Some(self)
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            let budget = self.shared.opts.join_budget;
            self.shutdown_within(budget);
        }
    }
}

impl CoreHost for SimShared {
    fn is_reset(&self) -> bool {
        SimShared::is_reset(self)
    }

    fn ticks(&self) -> u64 {
        SimShared::ticks(self)
    }

    fn read_kernel_args(&self, addr: u64) -> Option<KernelArgs> {
        SimShared::read_kernel_args(self, addr)
    }

    fn core_image_view(&self, args: &KernelArgs) -> Option<CoreImageView<'_>> {
        SimShared::core_image_view(self, args)
    }

    fn regs(&self, c: u32) -> Option<&RegBlock> {
        self.regs.get(c as usize)
    }

    fn spin_policy(&self) -> SpinPolicy<'_> {
        SimShared::spin_policy(self)
    }

    fn faults(&self) -> &FaultPlan {
        &self.faults
    }

    fn record_fault(&self, fault: CoreFault) {
        SimShared::record_fault(self, fault)
    }

    fn store_cond(&self, c: u32, v: u32) {
        SimShared::store_cond(self, c, v)
    }

    fn notify_all_aicpu(&self) {
        SimShared::notify_all_aicpu(self)
    }
}

#[cfg(test)]
mod tests;
