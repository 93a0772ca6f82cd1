//! The AICPU `exec` entry of the host_build_graph runtime: boot, handshake, scheduling loop,
//! watchdog and shutdown (`docs/device-handshake.md`).
//!
//! Protocol of one launch with `N` AICPU threads and `B` clusters:
//!
//! 1. Thread `N − 1` boots: it resets every task's `fanin_refcount` and `members_remaining`
//!    from the build-time counts, empties the ready queues, pushes every block of every
//!    fanin-free task, and publishes `ready_published` (release).
//! 2. Every thread `t` owns clusters `t, t + N, t + 2N, …` and handshakes their cores: claim
//!    the core, wait for `aicore_done != 0` (acquire), reject a physical core id ≥ 75, store
//!    the payload-pair address into `task` (release), open the window (`FAST_PATH_ENABLE = 0xE`,
//!    low half = AICPU idle), set `aicpu_ready`.
//! 3. Threads other than `N − 1` wait for `ready_published` (acquire).
//! 4. Scheduling loop, per iteration: observe `COND` of busy owned cores and apply ACK/FIN;
//!    complete tasks whose last member finished (decrement consumers' refcounts, pushing those
//!    that reach zero); dispatch ready blocks (MIX needs a whole idle cluster; idle cores are
//!    preferred over pending slots); add the iteration's dispatches and completions to the
//!    shared `running` and `progress` counters in one update each; when nothing progressed,
//!    idle-wait until woken or the watchdog deadline.
//! 5. The loop ends when every task completed, a runtime code is latched, a thread aborted, or
//!    the platform says stop. No progress (the shared `progress` counter unchanged) for the
//!    scheduler budget latches SCHEDULER_TIMEOUT with the stall class and counts.
//! 6. Shutdown: write the exit signal to every owned core, wait (all in parallel) for
//!    `COND == EXITED` within the shutdown budget, then write AICPU idle and close the window.
//!    An unanswered exit makes the shutdown unclean.
//!
//! `exec` returns [`EXEC_OK`] whenever the shutdown was clean, even if the run failed (the
//! failure is in the latched status); [`EXEC_UNCLEAN_SHUTDOWN`] or [`EXEC_HANDSHAKE_FAILED`]
//! otherwise.

use core::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

use super::dispatch::CoreState;
use super::trace::Trace;
use super::view::{ImageView, ReadyQueue};
use super::{AicpuPlatform, LogLevel};
use crate::abi::codes::{RuntimeCode, StallClass};
use crate::abi::image::{
    ImageHeader, NO_FUNC, PhaseRecord, READY_QUEUE_COUNT, TRB_IMAGE_MAGIC, TaskRecord, TaskShape,
};
use crate::abi::launch::InitArgs;
use crate::abi::payload::{
    DispatchPayload, GLOBAL_CONTEXT_SLOT, GlobalContext, LOCAL_CONTEXT_SLOT, LocalContext, mix_copy,
};
use crate::abi::regs::{
    AICPU_IDLE, EXIT_SIGNAL, EXITED_VALUE, FAST_PATH_CLOSE, FAST_PATH_OPEN, RegId,
};
use crate::abi::{COUNTER_HZ, CorePlace, CoreType, MAX_LAUNCH_CORES, PHYSICAL_CORE_LIMIT};

/// `exec` result: clean shutdown.
pub const EXEC_OK: i32 = 0;
/// `exec` result: a core did not answer the exit signal.
pub const EXEC_UNCLEAN_SHUTDOWN: i32 = 1;
/// `exec` result: a core failed the handshake.
pub const EXEC_HANDSHAKE_FAILED: i32 = 2;

/// Ticks per millisecond of the 50 MHz counter.
pub(super) const TICKS_PER_MS: u64 = COUNTER_HZ / 1000;

/// How a bounded wait ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum WaitEnd {
    Done,
    TimedOut,
    Stopped,
}

/// Waits until `done()` holds, the counter reaches `deadline`, or the platform says stop.
pub(super) fn wait_for<P: AicpuPlatform>(
    p: &P,
    deadline: u64,
    mut done: impl FnMut() -> bool,
) -> WaitEnd {
    let mut round = 0u32;
    loop {
        let epoch = p.wait_epoch();
        if done() {
            return WaitEnd::Done;
        }
        if p.should_stop() {
            return WaitEnd::Stopped;
        }
        if p.counter() >= deadline {
            return WaitEnd::TimedOut;
        }
        p.idle_wait(epoch, round, deadline);
        round = round.saturating_add(1);
    }
}

/// The core states a thread owns (at most all 72 cores).
pub(super) struct Owned {
    pub(super) cores: [CoreState; MAX_LAUNCH_CORES],
    pub(super) len: usize,
}

impl Owned {
    pub(super) fn new() -> Owned {
        Owned { cores: [CoreState::new(0, CoreType::Aic, 0, 0); MAX_LAUNCH_CORES], len: 0 }
    }

    pub(super) fn push(&mut self, w: CoreState) {
        if self.len < MAX_LAUNCH_CORES {
            self.cores[self.len] = w;
            self.len += 1;
        }
    }

    pub(super) fn all(&self) -> &[CoreState] {
        &self.cores[..self.len]
    }

    /// How many of the cores have a dispatch in flight.
    pub(super) fn busy(&self) -> u32 {
        self.all().iter().filter(|w| w.busy()).count() as u32
    }

    /// A core of `ty` that can take a token: idle ones first, then pending slots.
    pub(super) fn free_core(&self, ty: CoreType) -> Option<usize> {
        let ws = self.all();
        ws.iter()
            .position(|w| w.core_type == ty && w.is_idle())
            .or_else(|| ws.iter().position(|w| w.core_type == ty && w.can_accept()))
    }

    /// An owned cluster whose three cores are idle: indices into `owned` of AIC, AIV0, AIV1.
    pub(super) fn idle_cluster(&self) -> Option<[usize; 3]> {
        let ws = self.all();
        for (i, aic) in ws.iter().enumerate() {
            if aic.core_type != CoreType::Aic || !aic.is_idle() {
                continue;
            }
            let v0 = ws.iter().position(|w| {
                w.core_type == CoreType::Aiv && w.cluster == aic.cluster && w.sub_block == 0
            });
            let v1 = ws.iter().position(|w| {
                w.core_type == CoreType::Aiv && w.cluster == aic.cluster && w.sub_block == 1
            });
            if let (Some(v0), Some(v1)) = (v0, v1)
                && ws[v0].is_idle()
                && ws[v1].is_idle()
            {
                return Some([i, v0, v1]);
            }
        }
        None
    }
}

/// Number of member kernels of a task (1 for a dummy task, so it completes once).
fn members_per_block(t: &TaskRecord) -> u32 {
    match TaskShape::from_u32(t.shape) {
        Some(TaskShape::Dummy) | None => 1,
        _ => t.func_ids.iter().filter(|&&f| f != NO_FUNC).count() as u32,
    }
}

fn blocks_of(t: &TaskRecord) -> u32 {
    match TaskShape::from_u32(t.shape) {
        Some(TaskShape::Dummy) | None => 1,
        _ => t.block_num.max(1),
    }
}

/// One AICPU thread's scheduler.
struct Scheduler<'a, P: AicpuPlatform> {
    p: &'a P,
    view: ImageView<'a>,
    thread: u32,
    owned: Owned,
    queues: [ReadyQueue<'a>; READY_QUEUE_COUNT],
    task_count: u32,
    completed_here: u64,
    /// Dispatches and completions of this iteration not yet added to the shared `running`
    /// and `progress` counters: they are published once per iteration instead of once per
    /// event, since every scheduler thread updates those two cache lines.
    unpublished: Unpublished,
    /// Set when this thread pushed ready work in the current iteration; other threads are
    /// woken only if that work is still queued after this thread's own dispatch pass, so a
    /// chain of tasks on one thread's cores wakes nobody else.
    pushed: bool,
    /// AICPU dispatch records (swimlane level 2 and up): per owned core, the record indices of
    /// its in-flight dispatches in issue order (completions arrive in that order).
    trace: Option<Trace>,
}

/// Counter changes a scheduler thread batches until the end of its iteration.
#[derive(Clone, Copy, Debug, Default)]
struct Unpublished {
    /// Member dispatches sent.
    dispatched: u32,
    /// Member dispatches finished.
    finished: u32,
    /// Events for the watchdog's `progress` counter (dispatches and task completions).
    progress: u64,
}

impl<'a, P: AicpuPlatform> Scheduler<'a, P> {
    fn push_ready(&self, task: u32) {
        let t = self.view.task(task);
        let q = match TaskShape::from_u32(t.shape) {
            Some(s) => s as usize,
            None => TaskShape::Dummy as usize,
        };
        for b in 0..blocks_of(t) {
            if !self.queues[q].push((u64::from(task) << 32) | u64::from(b)) {
                self.latch_unqueued(q, task);
                return;
            }
        }
    }

    /// Ready queue `q` refused a block of `task`, which can then never run. The image writer
    /// sizes every queue for all its blocks, so only an image written otherwise gets here;
    /// without the latch the run would wait out the scheduler budget and report a stall.
    fn latch_unqueued(&self, q: usize, task: u32) {
        let why = format_args!("ready queue {q} refused task#{task}");
        latch_flow_control_deadlock(self.p, &self.view, self.thread, why);
    }

    /// Step 1: boot.
    fn boot(&self) {
        let shared = self.view.shared();
        for q in &self.queues {
            q.reset();
        }
        for i in 0..self.task_count {
            let t = self.view.task(i);
            // Relaxed: published by the release store of `ready_published` below.
            t.fanin_refcount.store(t.fanin_count, Relaxed);
            t.members_remaining.store(blocks_of(t) * members_per_block(t), Relaxed);
        }
        shared.completed_tasks.store(0, Relaxed);
        shared.running.store(0, Relaxed);
        for i in 0..self.task_count {
            if self.view.task(i).fanin_count == 0 {
                self.push_ready(i);
            }
        }
        shared.orch_done.store(1, Release);
        shared.ready_published.store(1, Release);
        self.p.notify_schedulers();
    }

    /// Step 2: handshake every owned core. Returns the first failing core.
    fn handshake(&mut self, budget: u64) -> Result<(), u32> {
        handshake(self.p, &self.view, self.owned.all(), budget)
    }

    /// Completes one member of `task`; completes the task when it was the last.
    fn member_done(&mut self, task: u32) {
        let t = self.view.task(task);
        // AcqRel: members finishing on other threads' cores must all be ordered before the
        // completion that releases the consumers.
        if t.members_remaining.fetch_sub(1, AcqRel) == 1 {
            self.task_done(task);
        }
    }

    fn task_done(&mut self, task: u32) {
        let t = self.view.task(task);
        for &c in self.view.fanout(t) {
            if c >= self.task_count {
                continue;
            }
            // AcqRel: the producer's results (ordered before this by the FIN acquire) must be
            // visible to whichever thread dispatches the consumer.
            if self.view.task(c).fanin_refcount.fetch_sub(1, AcqRel) == 1 {
                self.push_ready(c);
                self.pushed = true;
            }
        }
        self.completed_here += 1;
        self.unpublished.progress += 1;
        let shared = self.view.shared();
        if shared.completed_tasks.fetch_add(1, AcqRel) + 1 == self.task_count {
            self.p.notify_schedulers();
        }
    }

    /// Polls `COND` of every busy owned core; returns whether anything completed or was
    /// acknowledged.
    fn poll_cores(&mut self) -> bool {
        let mut progressed = false;
        for i in 0..self.owned.len {
            if !self.owned.cores[i].busy() {
                continue;
            }
            let w = self.owned.cores[i].index;
            let before = (self.owned.cores[i].running(), self.owned.cores[i].pending());
            let done = self.owned.cores[i].observe(self.p.reg_load(w, RegId::Cond));
            let after = (self.owned.cores[i].running(), self.owned.cores[i].pending());
            if before != after {
                progressed = true;
            }
            for &task in done.as_slice() {
                self.unpublished.finished += 1;
                self.record_finish(i);
                self.member_done(task);
            }
            if !done.as_slice().is_empty() {
                let slot = self.view.core_slot(w);
                let running_id = self.owned.cores[i]
                    .running()
                    .map_or(0, |d| self.view.task(d.task).task_id.wrapping_add(1));
                slot.running_task.store(running_id, Relaxed);
            }
        }
        progressed
    }

    /// Appends an AICPU record for a dispatch to owned core `idx` (if tracing).
    fn record_dispatch(&mut self, idx: usize, task_id: u64, core: u32, token: u32) {
        if let Some(tr) = self.trace.as_mut() {
            tr.dispatch(&self.view, idx, self.p.counter(), task_id, core, token);
        }
    }

    /// Stamps the finish time of the oldest in-flight dispatch of owned core `idx`.
    fn record_finish(&mut self, idx: usize) {
        if let Some(tr) = self.trace.as_mut() {
            tr.finish(&self.view, idx, self.p.counter());
        }
    }

    /// Fills payload `token & 1` of `ws` and writes the token; `copy` is the dispatch's
    /// `(copy_idx, copy_num)`.
    fn send(&mut self, idx: usize, task: u32, func_id: u32, block: u32, copy: (u16, u16)) {
        let t = self.view.task(task);
        let ws = &mut self.owned.cores[idx];
        let Ok(token) = ws.issue(task) else {
            debug_assert!(false, "send called on a core that cannot accept");
            return;
        };
        let w = ws.index;
        let sub_block = ws.sub_block;
        let ptr = self.view.payload_ptr(w, token & 1);
        let mut payload = DispatchPayload::ZERO;
        payload.kernel = self.view.func_addr(func_id);
        payload.local =
            LocalContext { block_idx: block, block_num: t.block_num.max(1), async_ctx: 0 };
        payload.task_id = t.task_id;
        payload.func_id = func_id;
        payload.global = GlobalContext {
            sub_block_id: sub_block,
            copy_idx: copy.0,
            copy_num: copy.1,
            dma_workspace: [0; 2],
        };
        let tensors = self.view.tensor_args_addr(t);
        let nt = (t.num_tensors as usize).min(LOCAL_CONTEXT_SLOT);
        for i in 0..nt {
            payload.args[i] = (tensors + 128 * i as u64) as i64;
        }
        for (j, &s) in self.view.scalars(t).iter().enumerate() {
            if nt + j < LOCAL_CONTEXT_SLOT {
                payload.args[nt + j] = s as i64;
            }
        }
        let base = ptr as u64;
        payload.args[LOCAL_CONTEXT_SLOT] =
            (base + core::mem::offset_of!(DispatchPayload, local) as u64) as i64;
        payload.args[GLOBAL_CONTEXT_SLOT] =
            (base + core::mem::offset_of!(DispatchPayload, global) as u64) as i64;
        // SAFETY: `ptr` is payload `token & 1` of a core this thread owns; `issue` succeeded,
        // so the core is idle or its running token (the other parity) is acked with nothing
        // pending: the buffer belongs to a finished token and the AICore does not read it until
        // it observes the token stored below (release).
        unsafe { ptr.write(payload) };
        // Bookkeeping first: the store may run the kernel before it returns (a simulator's
        // AICPU thread can serve the token itself), and the dispatch record must precede it.
        self.record_dispatch(idx, t.task_id, w, token);
        self.unpublished.dispatched += 1;
        self.unpublished.progress += 1;
        let slot = self.view.core_slot(w);
        slot.dispatched.fetch_add(1, Relaxed);
        if self.owned.cores[idx].pending().is_none() {
            slot.running_task.store(t.task_id.wrapping_add(1), Relaxed);
        }
        self.p.reg_store(w, RegId::DataMainBaseLow, token);
    }

    /// Dispatches ready blocks to owned cores; returns whether anything happened.
    fn dispatch(&mut self) -> bool {
        let mut progressed = false;
        while let Some(v) = self.queues[TaskShape::Dummy as usize].pop() {
            self.task_done((v >> 32) as u32);
            progressed = true;
        }
        while !self.queues[TaskShape::Mix as usize].is_empty() {
            let Some(cluster) = self.owned.idle_cluster() else { break };
            let Some(v) = self.queues[TaskShape::Mix as usize].pop() else { break };
            let (task, block) = ((v >> 32) as u32, v as u32);
            let funcs = self.view.task(task).func_ids;
            for (m, &f) in funcs.iter().enumerate() {
                if f != NO_FUNC {
                    self.send(cluster[m], task, f as u32, block, mix_copy(&funcs, m));
                }
            }
            progressed = true;
        }
        for (shape, ty, member) in
            [(TaskShape::Aic, CoreType::Aic, 0), (TaskShape::Aiv, CoreType::Aiv, 1)]
        {
            while !self.queues[shape as usize].is_empty() {
                let Some(idx) = self.owned.free_core(ty) else { break };
                let Some(v) = self.queues[shape as usize].pop() else { break };
                let (task, block) = ((v >> 32) as u32, v as u32);
                let f = self.view.task(task).func_ids[member];
                self.send(idx, task, f.max(0) as u32, block, (0, 1));
                progressed = true;
            }
        }
        progressed
    }

    /// Latches SCHEDULER_TIMEOUT with the stall class and counts (first latch wins).
    fn latch_stall(&self) {
        let shared = self.view.shared();
        if shared
            .sched_error_code
            .compare_exchange(0, RuntimeCode::SchedulerTimeout.raw(), AcqRel, Acquire)
            .is_err()
        {
            return;
        }
        let running = shared.running.load(Relaxed);
        let ready: u32 = self.queues.iter().map(|q| q.len()).sum();
        let completed = shared.completed_tasks.load(Relaxed);
        let waiting = self
            .task_count
            .saturating_sub(completed)
            .saturating_sub(ready)
            .saturating_sub(running.min(self.task_count));
        // The stuck task: the oldest dispatch on an owned core, else any core's.
        let mut stuck: Option<(u32, u64)> = self
            .owned
            .all()
            .iter()
            .find_map(|w| w.running().map(|d| (w.index, self.view.task(d.task).task_id)));
        if stuck.is_none() {
            stuck = running_on_any_core(&self.view);
        }
        let class = if running > 0 || stuck.is_some() {
            StallClass::RunningStalled
        } else if ready > 0 {
            StallClass::ReadyNotDispatched
        } else if waiting > 0 {
            StallClass::OnlyWaiting
        } else if shared.orch_done.load(Relaxed) == 0 {
            StallClass::OrchestratorIdle
        } else {
            StallClass::Unknown
        };
        shared.error_thread.store(self.thread, Relaxed);
        shared.stall_class.store(class as u32, Relaxed);
        shared.stall_running.store(running, Relaxed);
        shared.stall_ready.store(ready, Relaxed);
        shared.stall_waiting.store(waiting, Relaxed);
        match stuck {
            Some((w, task)) => {
                shared.stuck_core.store(w + 1, Relaxed);
                shared.stuck_task.store(task, Relaxed);
            }
            None => shared.stuck_task.store(u64::MAX, Relaxed),
        }
        self.p.log(
            LogLevel::Error,
            format_args!(
                "scheduler timeout: {} (running {running}, ready {ready}, waiting {waiting})",
                class.label()
            ),
        );
        self.p.notify_schedulers();
    }

    /// Adds this iteration's dispatches and completions to the shared `running` and
    /// `progress` counters. Called before anything reads them: the watchdog check, an idle
    /// wait (other threads' watchdogs read `progress`), a stall latch and the loop's end.
    fn publish_counters(&mut self) {
        let u = core::mem::take(&mut self.unpublished);
        let shared = self.view.shared();
        // Relaxed: both counters are statistics and watchdog evidence; no data is published
        // through them.
        if u.dispatched != u.finished {
            shared.running.fetch_add(u.dispatched.wrapping_sub(u.finished), Relaxed);
        }
        if u.progress != 0 {
            shared.progress.fetch_add(u.progress, Relaxed);
        }
    }

    fn finished(&self) -> bool {
        let shared = self.view.shared();
        shared.completed_tasks.load(Acquire) >= self.task_count
            || shared.sched_error_code.load(Relaxed) != 0
            || shared.orch_error_code.load(Relaxed) != 0
            || shared.abort.load(Relaxed) != 0
    }

    /// Step 4: the scheduling loop.
    fn run(&mut self, budget: u64) {
        let shared = self.view.shared();
        let mut round = 0u32;
        let mut seen = shared.progress.load(Relaxed);
        let mut since = self.p.counter();
        loop {
            let epoch = self.p.wait_epoch();
            if self.finished() {
                break;
            }
            if self.p.should_stop() {
                break;
            }
            let mut progressed = self.poll_cores();
            progressed |= self.dispatch();
            self.publish_counters();
            if core::mem::take(&mut self.pushed) && self.queues.iter().any(|q| !q.is_empty()) {
                self.p.notify_schedulers();
            }
            if progressed {
                round = 0;
                continue;
            }
            let now = self.p.counter();
            let p = shared.progress.load(Relaxed);
            if p != seen {
                seen = p;
                since = now;
            } else if now.saturating_sub(since) >= budget {
                self.latch_stall();
                break;
            }
            let busy = self.owned.busy();
            self.p.scheduler_idle_wait(epoch, round, since.saturating_add(budget), busy);
            round = round.saturating_add(1);
        }
    }

    /// Step 6: shutdown. Returns whether every owned core answered the exit signal.
    fn shutdown(&self, budget: u64) -> bool {
        shutdown_cores(self.p, self.owned.all().iter().map(|w| w.index), budget)
    }
}

/// The first core any scheduler thread has a task running on, as `(core, device task id)`,
/// read from the shared per-core slots: a stall latched by a thread that does not own the
/// hung core still names it.
/// Latches FLOW_CONTROL_DEADLOCK for `thread` (first latch wins), logs `why` and wakes the
/// schedulers: ready work the ready queue refused can never run.
pub(super) fn latch_flow_control_deadlock<P: AicpuPlatform>(
    p: &P,
    view: &ImageView<'_>,
    thread: u32,
    why: core::fmt::Arguments<'_>,
) {
    let shared = view.shared();
    let code = RuntimeCode::FlowControlDeadlock.raw();
    if shared.sched_error_code.compare_exchange(0, code, AcqRel, Acquire).is_err() {
        return;
    }
    shared.error_thread.store(thread, Relaxed);
    p.log(LogLevel::Error, why);
    p.notify_schedulers();
}

pub(super) fn running_on_any_core(view: &ImageView<'_>) -> Option<(u32, u64)> {
    (0..view.header().num_aicore).find_map(|w| {
        let id = view.core_slot(w).running_task.load(Relaxed);
        (id != 0).then(|| (w, id - 1))
    })
}

/// Step 2: handshakes `owned`'s cores (the image's handshake records, then the register
/// window). Returns the first failing core; every core that reported a usable physical id by
/// then is mapped to it, so that the shutdown's exit signal reaches it.
pub(super) fn handshake<P: AicpuPlatform>(
    p: &P,
    view: &ImageView<'_>,
    owned: &[CoreState],
    budget: u64,
) -> Result<(), u32> {
    let deadline = p.counter().saturating_add(budget);
    // Physical ids mapped so far: two cores of one thread never share a window.
    let mut mapped = 0u128;
    let failed = |w: u32, mapped: u128| {
        map_reported(p, view, owned, mapped);
        Err(w)
    };
    for core in owned {
        let w = core.index;
        p.claim_core(w);
        let hs = view.handshake(w);
        // Acquire pairs with the AICore's release store of `aicore_done`, so its
        // `physical_core_id` and `core_type` writes are visible.
        match wait_for(p, deadline, || hs.aicore_done.load(Acquire) != 0) {
            WaitEnd::Done => {}
            WaitEnd::TimedOut => {
                p.report_fault(
                    Some(w),
                    format_args!("core {w} never reported in (aicore_done stayed 0)"),
                );
                return failed(w, mapped);
            }
            WaitEnd::Stopped => return failed(w, mapped),
        }
        let phys = hs.physical_core_id.load(Relaxed);
        if phys >= PHYSICAL_CORE_LIMIT {
            p.report_fault(
                Some(w),
                format_args!("handshake failed: core {w} reported physical core id {phys} (limit {PHYSICAL_CORE_LIMIT})"),
            );
            return failed(w, mapped);
        }
        if mapped & (1 << phys) != 0 {
            p.report_fault(
                Some(w),
                format_args!("handshake failed: core {w} reported physical core id {phys}, which another core of this thread reported too"),
            );
            return failed(w, mapped);
        }
        mapped |= 1 << phys;
        p.map_core(w, phys);
        // Release: the AICore reads `task` after observing the open window (acquire).
        hs.task.store(view.payload_pair_addr(w), Release);
        p.reg_store(w, RegId::FastPathEnable, FAST_PATH_OPEN);
        p.reg_store(w, RegId::DataMainBaseLow, AICPU_IDLE);
        hs.aicpu_ready.store(1, Relaxed);
    }
    Ok(())
}

/// After a failed handshake: maps every owned core that has reported in with a usable physical
/// id not taken yet (`mapped`), so the exit signal of the shutdown reaches it.
fn map_reported<P: AicpuPlatform>(
    p: &P,
    view: &ImageView<'_>,
    owned: &[CoreState],
    mut mapped: u128,
) {
    for core in owned {
        let hs = view.handshake(core.index);
        if hs.aicore_done.load(Acquire) == 0 {
            continue;
        }
        let phys = hs.physical_core_id.load(Relaxed);
        if phys < PHYSICAL_CORE_LIMIT && mapped & (1 << phys) == 0 {
            mapped |= 1 << phys;
            p.map_core(core.index, phys);
        }
    }
}

/// Sends the exit signal to `cores`, waits for every answer within `budget` ticks, then
/// writes AICPU idle and closes the windows. Returns whether every core answered.
pub fn shutdown_cores<P: AicpuPlatform>(
    p: &P,
    cores: impl Iterator<Item = u32> + Clone,
    budget: u64,
) -> bool {
    for w in cores.clone() {
        p.reg_store(w, RegId::DataMainBaseLow, EXIT_SIGNAL);
    }
    let deadline = p.counter().saturating_add(budget);
    let mut clean = true;
    for w in cores.clone() {
        if wait_for(p, deadline, || p.reg_load(w, RegId::Cond) == EXITED_VALUE) != WaitEnd::Done {
            p.report_fault(
                Some(w),
                format_args!("core {w} did not answer the exit signal within the shutdown budget"),
            );
            clean = false;
        }
    }
    for w in cores {
        p.reg_store(w, RegId::DataMainBaseLow, AICPU_IDLE);
        p.reg_store(w, RegId::FastPathEnable, FAST_PATH_CLOSE);
    }
    clean
}

/// Ends the phases of a scheduling thread that owns no core: it took part in nothing after
/// its start (and, for the last thread, the boot).
pub(super) fn idle_thread_ends<P: AicpuPlatform>(p: &P, phase: &PhaseRecord) {
    let now = p.counter();
    phase.handshake_end.store(now, Relaxed);
    phase.scheduling_end.store(now, Relaxed);
    phase.tasks_completed.store(0, Relaxed);
    phase.end.store(now, Relaxed);
}

/// Whether AICPU thread `thread`'s part of this launch ends without waiting for anything: it
/// owns no cluster, so it only records its phases (and, as the last thread, publishes the
/// boot). A simulator may run such a part on another participant's thread, before that
/// participant's own part (`docs/device-simulator.md`, "Who runs a dispatch").
pub fn part_is_brief(h: &ImageHeader, thread: u32) -> bool {
    if h.magic == TRB_IMAGE_MAGIC {
        return super::trb::part_is_brief(h, thread);
    }
    thread < h.aicpu_threads.clamp(1, crate::abi::MAX_AICPU_THREADS) && thread >= h.block_dim
}

/// The AICPU `exec` entry for thread `thread` of a launch (`docs/device-handshake.md`).
pub fn exec<P: AicpuPlatform>(p: &P, init: &InitArgs, view: &ImageView<'_>, thread: u32) -> i32 {
    if view.trb_header().is_some() {
        return super::trb::exec(p, init, view, thread);
    }
    let h = view.header();
    let threads = h.aicpu_threads.clamp(1, crate::abi::MAX_AICPU_THREADS);
    let phase = view.phase(thread);
    phase.start.store(p.counter(), Relaxed);
    let budget = u64::from(init.scheduler_timeout_ms).max(1) * TICKS_PER_MS;
    let shutdown_budget = u64::from(init.shutdown_budget_ms).max(1) * TICKS_PER_MS;
    let queues = [0, 1, 2, 3].map(|q| ReadyQueue::of(view, q));
    let mut s = Scheduler {
        p,
        view: *view,
        thread,
        owned: Owned::new(),
        queues,
        task_count: h.task_count,
        completed_here: 0,
        unpublished: Unpublished::default(),
        pushed: false,
        trace: Trace::of(view, thread),
    };
    let mut k = thread;
    while k < h.block_dim {
        for w in CorePlace::cluster_cores(k, h.block_dim) {
            if let Some(place) = CorePlace::of(w, h.block_dim) {
                s.owned.push(CoreState::new(w, place.core_type, place.cluster, place.sub_block));
            }
        }
        k += threads;
    }
    if thread == threads - 1 {
        s.boot();
    }
    phase.orchestration_end.store(p.counter(), Relaxed);
    if s.owned.len == 0 {
        // Fewer clusters than threads: this one could only complete dummy tasks, which every
        // thread that owns cores pops too, and those threads watch for stalls themselves.
        idle_thread_ends(p, phase);
        return EXEC_OK;
    }
    if let Err(w) = s.handshake(budget) {
        view.shared().abort.store(1, Release);
        p.notify_schedulers();
        p.log(LogLevel::Error, format_args!("AICPU thread {thread}: handshake failed on core {w}"));
        s.shutdown(shutdown_budget);
        phase.end.store(p.counter(), Relaxed);
        return EXEC_HANDSHAKE_FAILED;
    }
    phase.handshake_end.store(p.counter(), Relaxed);
    let shared = view.shared();
    let ready_deadline = p.counter().saturating_add(budget);
    let published = wait_for(p, ready_deadline, || {
        shared.ready_published.load(Acquire) != 0 || shared.abort.load(Relaxed) != 0
    });
    if published == WaitEnd::Done {
        s.run(budget);
    } else if published == WaitEnd::TimedOut {
        s.latch_stall();
    }
    phase.scheduling_end.store(p.counter(), Relaxed);
    phase.tasks_completed.store(s.completed_here, Relaxed);
    let clean = s.shutdown(shutdown_budget);
    phase.end.store(p.counter(), Relaxed);
    if clean { EXEC_OK } else { EXEC_UNCLEAN_SHUTDOWN }
}

#[cfg(test)]
mod tests {
    use core::cell::{Cell, RefCell};

    use super::*;
    use crate::aicpu::view::test_image::{self, Block};

    /// A scripted platform: registers in cells, a counter that advances on every read, and
    /// cores that answer the exit signal only if told to.
    struct Scripted {
        regs: RefCell<Vec<[u32; RegId::COUNT]>>,
        answers_exit: Vec<bool>,
        clock: Cell<u64>,
        faults: RefCell<Vec<Option<u32>>>,
        mapped: RefCell<Vec<(u32, u32)>>,
    }

    impl Scripted {
        fn new(answers_exit: Vec<bool>) -> Scripted {
            Scripted {
                regs: RefCell::new(vec![[0; RegId::COUNT]; answers_exit.len()]),
                answers_exit,
                clock: Cell::new(0),
                faults: RefCell::new(Vec::new()),
                mapped: RefCell::new(Vec::new()),
            }
        }
    }

    impl AicpuPlatform for Scripted {
        fn reg_load(&self, core: u32, reg: RegId) -> u32 {
            self.regs.borrow()[core as usize][reg.cell()]
        }
        fn reg_store(&self, core: u32, reg: RegId, value: u32) {
            self.regs.borrow_mut()[core as usize][reg.cell()] = value;
            if reg == RegId::DataMainBaseLow
                && value == EXIT_SIGNAL
                && self.answers_exit[core as usize]
            {
                self.regs.borrow_mut()[core as usize][RegId::Cond.cell()] = EXITED_VALUE;
            }
        }
        fn counter(&self) -> u64 {
            self.clock.set(self.clock.get() + 1000);
            self.clock.get()
        }
        fn wait_epoch(&self) -> u64 {
            0
        }
        fn idle_wait(&self, _observed: u64, _round: u32, _deadline: u64) {}
        fn notify_schedulers(&self) {}
        fn claim_core(&self, _core: u32) {}
        fn map_core(&self, core: u32, physical: u32) {
            self.mapped.borrow_mut().push((core, physical));
        }
        fn should_stop(&self) -> bool {
            false
        }
        fn log(&self, _level: LogLevel, _args: core::fmt::Arguments<'_>) {}
        fn report_fault(&self, core: Option<u32>, _args: core::fmt::Arguments<'_>) {
            self.faults.borrow_mut().push(core);
        }
    }

    #[test]
    fn a_ready_queue_that_refuses_a_block_latches_a_flow_control_deadlock() {
        // One fanin-free task, and queues of no cells (an image not laid out by this crate's
        // writer): boot cannot queue the task, and the run fails at once instead of waiting
        // out the scheduler budget for a task that can never run.
        let mut mem = test_image::empty(3, 1, 3);
        test_image::edit(&mut mem, |h, bytes| {
            h.task_count = 1;
            let blocks = h.tasks_off as usize + core::mem::offset_of!(TaskRecord, block_num);
            bytes[blocks..blocks + 4].copy_from_slice(&1u32.to_le_bytes());
        });
        let view = with_view(&mut mem);
        let p = Scripted::new(vec![true; 3]);
        let s = Scheduler {
            p: &p,
            view,
            thread: 0,
            owned: Owned::new(),
            queues: [0, 1, 2, 3].map(|q| ReadyQueue::of(&view, q)),
            task_count: 1,
            completed_here: 0,
            unpublished: Unpublished::default(),
            pushed: false,
            trace: None,
        };
        s.boot();
        let code = view.shared().sched_error_code.load(Relaxed);
        assert_eq!(code, RuntimeCode::FlowControlDeadlock.raw());
    }

    #[test]
    fn an_unanswered_exit_makes_the_shutdown_unclean() {
        let p = Scripted::new(vec![true, false, true]);
        assert!(!shutdown_cores(&p, 0..3, 50_000));
        assert_eq!(*p.faults.borrow(), vec![Some(1)]);
        for w in 0..3 {
            assert_eq!(p.reg_load(w, RegId::DataMainBaseLow), AICPU_IDLE, "window left idle");
            assert_eq!(p.reg_load(w, RegId::FastPathEnable), FAST_PATH_CLOSE, "window closed");
        }
    }

    /// An image of one block (three cores) whose cores reported `(aicore_done, physical id)`.
    fn reported(cores: [(u32, u32); 3]) -> Vec<Block> {
        let mut mem = test_image::empty(3, 1, 3);
        let view = with_view(&mut mem);
        for (w, (done, phys)) in cores.into_iter().enumerate() {
            let hs = view.handshake(w as u32);
            hs.physical_core_id.store(phys, Relaxed);
            hs.aicore_done.store(done, Relaxed);
        }
        mem
    }

    fn with_view(mem: &mut [Block]) -> ImageView<'_> {
        let len = (mem.len() * 64) as u64;
        // SAFETY: `mem` is `len` 64-aligned bytes that outlive the view, touched only through
        // it meanwhile.
        unsafe { ImageView::from_raw(mem.as_mut_ptr().cast(), len) }.unwrap()
    }

    fn owned_cluster() -> [CoreState; 3] {
        [
            CoreState::new(0, CoreType::Aic, 0, 0),
            CoreState::new(1, CoreType::Aiv, 0, 0),
            CoreState::new(2, CoreType::Aiv, 0, 1),
        ]
    }

    #[test]
    fn a_physical_id_reported_twice_fails_the_handshake_and_the_others_are_mapped_for_exit() {
        let mut mem = reported([(1, 10), (1, 10), (1, 20)]);
        let p = Scripted::new(vec![true; 3]);
        assert_eq!(handshake(&p, &with_view(&mut mem), &owned_cluster(), 50_000), Err(1));
        assert_eq!(*p.faults.borrow(), vec![Some(1)]);
        // Core 2 reported in after the failing core: mapped so the exit signal reaches it.
        assert_eq!(*p.mapped.borrow(), vec![(0, 10), (2, 20)]);
    }

    #[test]
    fn a_core_that_never_reported_fails_the_handshake_and_the_ones_that_did_are_mapped() {
        let mut mem = reported([(1, 10), (0, 0), (1, 74)]);
        let p = Scripted::new(vec![true; 3]);
        assert_eq!(handshake(&p, &with_view(&mut mem), &owned_cluster(), 50_000), Err(1));
        assert_eq!(*p.mapped.borrow(), vec![(0, 10), (2, 74)]);
        let mut mem = reported([(1, 75), (1, 3), (1, 4)]);
        let p = Scripted::new(vec![true; 3]);
        assert_eq!(handshake(&p, &with_view(&mut mem), &owned_cluster(), 50_000), Err(0));
        assert_eq!(*p.mapped.borrow(), vec![(1, 3), (2, 4)], "an id past the table is not");
    }

    #[test]
    fn a_fully_answered_exit_is_a_clean_shutdown() {
        let p = Scripted::new(vec![true, true]);
        assert!(shutdown_cores(&p, 0..2, 50_000));
        assert!(p.faults.borrow().is_empty());
    }
}
