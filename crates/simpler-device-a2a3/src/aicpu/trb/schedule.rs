//! The trb scheduler threads: handshake, then poll, complete and dispatch until the run ends.

use core::ptr::addr_of;
use core::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

use simpler_types::DeviceTaskId;

use super::{EXEC_OK, layout_of};
use crate::abi::codes::{RuntimeCode, StallClass};
use crate::abi::image::{NO_FUNC, TaskShape, TrbHeader, TrbStatus};
use crate::abi::launch::InitArgs;
use crate::abi::payload::{
    DispatchPayload, GLOBAL_CONTEXT_SLOT, GlobalContext, LOCAL_CONTEXT_SLOT, LocalContext, mix_copy,
};
use crate::abi::regs::RegId;
use crate::abi::{CorePlace, CoreType};
use crate::aicpu::dispatch::CoreState;
use crate::aicpu::scheduler::{
    Owned, TICKS_PER_MS, WaitEnd, handshake, idle_thread_ends, latch_flow_control_deadlock,
    running_on_any_core, shutdown_cores, wait_for,
};
use crate::aicpu::trace::Trace;
use crate::aicpu::view::ImageView;
use crate::aicpu::{AicpuPlatform, LogLevel};
use crate::runtime::trb::engine::{Completer, Completion};
use crate::runtime::trb::sizing::{MAX_TASK_WINDOW, SLOT_BITS};
use crate::runtime::trb::storage::{ArenaLayout, MAX_TASK_SCALARS, MAX_TASK_TENSORS, SlotTask};

/// Runs scheduler thread `thread` of `schedulers` (protocol steps 2 and 3).
pub(super) fn schedule<P: AicpuPlatform>(
    p: &P,
    init: &InitArgs,
    view: &ImageView<'_>,
    trb: &TrbHeader,
    status: &TrbStatus,
    thread: u32,
    schedulers: u32,
) -> i32 {
    let h = view.header();
    let phase = view.phase(thread);
    let budget = u64::from(init.scheduler_timeout_ms).max(1) * TICKS_PER_MS;
    let shutdown_budget = u64::from(init.shutdown_budget_ms).max(1) * TICKS_PER_MS;
    let mut s = Scheduler {
        p,
        view: *view,
        status,
        owned: Owned::new(),
        pending: [Pending::NONE; PENDING],
        pending_len: 0,
        completer: None,
        layout: layout_of(trb),
        base: trb.arena_base as *mut u8,
        thread,
        completed_here: 0,
        unpublished: Unpublished::default(),
        trace: Trace::of(view, thread),
        idle: false,
    };
    let mut k = thread;
    while k < h.block_dim {
        for w in CorePlace::cluster_cores(k, h.block_dim) {
            if let Some(place) = CorePlace::of(w, h.block_dim) {
                s.owned.push(CoreState::new(w, place.core_type, place.cluster, place.sub_block));
            }
        }
        k += schedulers;
    }
    phase.orchestration_end.store(p.counter(), Relaxed);
    if s.owned.len == 0 {
        // Fewer clusters than scheduling threads: this one could never dispatch, and the
        // threads that own cores watch for stalls themselves; staying would only put one more
        // thread to wake on every published task.
        idle_thread_ends(p, phase);
        return EXEC_OK;
    }
    if let Err(w) = handshake(p, view, s.owned.all(), budget) {
        view.shared().abort.store(1, Release);
        p.notify_schedulers();
        p.log(LogLevel::Error, format_args!("AICPU thread {thread}: handshake failed on core {w}"));
        shutdown_cores(p, s.owned.all().iter().map(|w| w.index), shutdown_budget);
        phase.end.store(p.counter(), Relaxed);
        return crate::aicpu::EXEC_HANDSHAKE_FAILED;
    }
    phase.handshake_end.store(p.counter(), Relaxed);
    let shared = view.shared();
    let ready_deadline = p.counter().saturating_add(budget);
    let published = wait_for(p, ready_deadline, || {
        shared.ready_published.load(Acquire) != 0 || shared.abort.load(Relaxed) != 0
    });
    if published == WaitEnd::Done {
        if let Some(layout) = s.layout.filter(|_| shared.orch_error_code.load(Relaxed) == 0) {
            // SAFETY: the orchestration thread built its engine over this arena (which resets
            // it) before publishing "runtime ready" (acquired above); the shared sections are
            // only accessed atomically, and the arena stays allocated for the launch.
            s.completer = Some(Completer::attach(unsafe { layout.shared(s.base) }));
        }
        s.run(budget);
    } else if published == WaitEnd::TimedOut {
        s.latch_timeout(StallClass::OrchestratorIdle);
    }
    phase.scheduling_end.store(p.counter(), Relaxed);
    phase.tasks_completed.store(s.completed_here, Relaxed);
    let clean = shutdown_cores(p, s.owned.all().iter().map(|w| w.index), shutdown_budget);
    phase.end.store(p.counter(), Relaxed);
    if clean { EXEC_OK } else { crate::aicpu::EXEC_UNCLEAN_SHUTDOWN }
}

/// Tasks a scheduler thread holds popped but not fully dispatched.
const PENDING: usize = 4;

/// A popped task's blocks still to dispatch.
#[derive(Clone, Copy, Debug)]
struct Pending {
    /// The core-state handle: `(ring << SLOT_BITS) | slot`.
    handle: u32,
    shape: TaskShape,
    funcs: [i32; 3],
    blocks: u32,
    next_block: u32,
}

impl Pending {
    const NONE: Pending = Pending {
        handle: 0,
        shape: TaskShape::Dummy,
        funcs: [NO_FUNC; 3],
        blocks: 0,
        next_block: 0,
    };
}

/// Counter changes and wake-ups a scheduler thread batches until the end of its iteration.
#[derive(Clone, Copy, Debug, Default)]
struct Unpublished {
    dispatched: u32,
    finished: u32,
    progress: u64,
    /// Its completions made consumers ready.
    readied: bool,
    /// A completion reached the count the orchestration thread waits for.
    wake_owner: bool,
}

/// One trb scheduler thread.
struct Scheduler<'a, P: AicpuPlatform> {
    p: &'a P,
    view: ImageView<'a>,
    status: &'a TrbStatus,
    owned: Owned,
    pending: [Pending; PENDING],
    pending_len: usize,
    completer: Option<Completer<'a>>,
    layout: Option<ArenaLayout>,
    base: *mut u8,
    thread: u32,
    completed_here: u64,
    unpublished: Unpublished,
    /// AICPU dispatch records (swimlane level 2 and up).
    trace: Option<Trace>,
    /// Counted in the engine's idle schedulers (has room, found nothing ready).
    idle: bool,
}

impl<'a, P: AicpuPlatform> Scheduler<'a, P> {
    fn task_ptr(&self, handle: u32) -> *mut SlotTask {
        match self.layout {
            Some(l) => {
                let slot = handle & (MAX_TASK_WINDOW - 1);
                l.task_ptr(self.base, (handle >> SLOT_BITS) as usize, slot as usize)
            }
            None => core::ptr::null_mut(),
        }
    }

    fn finished(&self) -> bool {
        let shared = self.view.shared();
        if shared.sched_error_code.load(Relaxed) != 0
            || shared.orch_error_code.load(Relaxed) != 0
            || shared.abort.load(Relaxed) != 0
        {
            return true;
        }
        let Some(c) = self.completer else { return true };
        // Acquire: `submitted` is final once `orch_done` is seen.
        shared.orch_done.load(Acquire) != 0 && c.completed() >= self.status.submitted.load(Relaxed)
    }

    /// Completes `id` and notes whom that must wake.
    fn complete(&mut self, c: Completer<'a>, id: DeviceTaskId) {
        let Completion { readied, wake_owner, unqueued } = c.complete(id);
        if unqueued > 0 {
            self.latch_unqueued(unqueued);
        }
        self.completed_here += 1;
        self.unpublished.progress += 1;
        self.unpublished.readied |= readied > 0;
        self.unpublished.wake_owner |= wake_owner;
    }

    /// Whether this thread could take a ready task now.
    fn has_room(&self) -> bool {
        self.owned.len > 0
            && self.pending_len < PENDING
            && self.owned.all().iter().any(|w| w.can_accept())
    }

    /// One member of the task behind `handle` finished; completes the task after its last.
    fn member_done(&mut self, handle: u32) {
        let t = self.task_ptr(handle);
        let Some(c) = self.completer else { return };
        // SAFETY: the record of a task this thread dispatched, which cannot be reclaimed before
        // its completion below; `task_id` was written before the task was published.
        let (remaining, id) =
            unsafe { (&*addr_of!((*t).members_remaining), addr_of!((*t).task_id).read()) };
        // AcqRel: members finishing on other threads' cores are ordered before the completion.
        if remaining.fetch_sub(1, AcqRel) == 1 {
            self.complete(c, DeviceTaskId(id));
        }
    }

    fn poll_cores(&mut self) -> bool {
        let mut progressed = false;
        for i in 0..self.owned.len {
            if !self.owned.cores[i].busy() {
                continue;
            }
            let w = self.owned.cores[i].index;
            let before = (self.owned.cores[i].running(), self.owned.cores[i].pending());
            let done = self.owned.cores[i].observe(self.p.reg_load(w, RegId::Cond));
            if before != (self.owned.cores[i].running(), self.owned.cores[i].pending()) {
                progressed = true;
            }
            for &handle in done.as_slice() {
                self.unpublished.finished += 1;
                if let Some(tr) = self.trace.as_mut() {
                    tr.finish(&self.view, i, self.p.counter());
                }
                self.member_done(handle);
            }
            if !done.as_slice().is_empty() {
                let running = self.owned.cores[i].running().map_or(0, |d| {
                    // SAFETY: a task still on the core: its record stays until it completes.
                    unsafe { addr_of!((*self.task_ptr(d.task)).task_id).read() }.wrapping_add(1)
                });
                self.view.core_slot(w).running_task.store(running, Relaxed);
            }
        }
        progressed
    }

    /// Fills payload `token & 1` of owned core `idx` and writes the token; `copy` is the
    /// dispatch's `(copy_idx, copy_num)`.
    fn send(
        &mut self,
        idx: usize,
        handle: u32,
        func_id: u32,
        block: u32,
        blocks: u32,
        copy: (u16, u16),
    ) {
        let t = self.task_ptr(handle);
        let ws = &mut self.owned.cores[idx];
        let Ok(token) = ws.issue(handle) else {
            debug_assert!(false, "send called on a core that cannot accept");
            return;
        };
        let w = ws.index;
        let sub_block = ws.sub_block;
        let ptr = self.view.payload_ptr(w, token & 1);
        let mut payload = DispatchPayload::ZERO;
        payload.kernel = self.view.func_addr(func_id);
        payload.local = LocalContext { block_idx: block, block_num: blocks, async_ctx: 0 };
        payload.func_id = func_id;
        payload.global = GlobalContext {
            sub_block_id: sub_block,
            copy_idx: copy.0,
            copy_num: copy.1,
            dma_workspace: [0; 2],
        };
        // SAFETY: the record of a task this thread popped; written before it was published and
        // unchanged until it completes, which needs this dispatch to finish.
        let (task_id, nt, ns) = unsafe {
            (
                addr_of!((*t).task_id).read(),
                (addr_of!((*t).num_tensors).read() as usize).min(MAX_TASK_TENSORS),
                (addr_of!((*t).num_scalars).read() as usize).min(MAX_TASK_SCALARS),
            )
        };
        payload.task_id = task_id;
        for i in 0..nt {
            // SAFETY: as above; the descriptor's address is what the kernel reads.
            payload.args[i] = unsafe { addr_of!((*t).tensors[i]) } as i64;
        }
        for j in 0..ns.min(LOCAL_CONTEXT_SLOT - nt) {
            // SAFETY: as above.
            payload.args[nt + j] = unsafe { addr_of!((*t).scalars[j]).read() } as i64;
        }
        let pbase = ptr as u64;
        payload.args[LOCAL_CONTEXT_SLOT] =
            (pbase + core::mem::offset_of!(DispatchPayload, local) as u64) as i64;
        payload.args[GLOBAL_CONTEXT_SLOT] =
            (pbase + core::mem::offset_of!(DispatchPayload, global) as u64) as i64;
        // SAFETY: `ptr` is payload `token & 1` of a core this thread owns; `issue` succeeded, so
        // the buffer belongs to a finished token and the AICore reads it only after observing
        // the token stored below (release).
        unsafe { ptr.write(payload) };
        // Bookkeeping first: the store may run the kernel before it returns (a simulator's
        // AICPU thread can serve the token itself), and the dispatch record must precede it.
        if let Some(tr) = self.trace.as_mut() {
            tr.dispatch(&self.view, idx, self.p.counter(), task_id, w, token);
        }
        self.unpublished.dispatched += 1;
        self.unpublished.progress += 1;
        let slot = self.view.core_slot(w);
        slot.dispatched.fetch_add(1, Relaxed);
        if self.owned.cores[idx].pending().is_none() {
            slot.running_task.store(task_id.wrapping_add(1), Relaxed);
        }
        self.p.reg_store(w, RegId::DataMainBaseLow, token);
    }

    /// Dispatches what it can of pending entry `k`; returns whether anything was sent.
    fn dispatch_pending(&mut self, k: usize) -> bool {
        let mut sent = false;
        let e = self.pending[k];
        let mut next = e.next_block;
        while next < e.blocks {
            match e.shape {
                TaskShape::Mix => {
                    let Some(cluster) = self.owned.idle_cluster() else { break };
                    for (m, &f) in e.funcs.iter().enumerate() {
                        if f != NO_FUNC {
                            let copy = mix_copy(&e.funcs, m);
                            self.send(cluster[m], e.handle, f as u32, next, e.blocks, copy);
                        }
                    }
                }
                TaskShape::Aic | TaskShape::Aiv => {
                    let (ty, member) = if e.shape == TaskShape::Aic {
                        (CoreType::Aic, 0)
                    } else {
                        (CoreType::Aiv, 1)
                    };
                    let Some(idx) = self.owned.free_core(ty) else { break };
                    let f = e.funcs[member].max(0) as u32;
                    self.send(idx, e.handle, f, next, e.blocks, (0, 1));
                }
                TaskShape::Dummy => break,
            }
            next += 1;
            sent = true;
        }
        self.pending[k].next_block = next;
        sent
    }

    /// Dispatches pending blocks, then pops ready tasks while this thread has room for them.
    fn dispatch(&mut self) -> bool {
        let mut progressed = false;
        let mut k = 0;
        while k < self.pending_len {
            progressed |= self.dispatch_pending(k);
            if self.pending[k].next_block >= self.pending[k].blocks {
                self.pending_len -= 1;
                self.pending[k] = self.pending[self.pending_len];
            } else {
                k += 1;
            }
        }
        let Some(c) = self.completer else { return progressed };
        // A thread without cores pops nothing: it could never run what it took.
        if self.owned.len == 0 {
            return progressed;
        }
        while self.pending_len < PENDING && self.owned.all().iter().any(|w| w.can_accept()) {
            let Some(id) = c.pop_ready() else { break };
            progressed = true;
            let ring = (id.0 >> 32) as u32;
            let window = self.layout.map_or(1, |l| l.shape().rings[ring as usize % 4].task_window);
            // Sizing keeps every window within `MAX_TASK_WINDOW`, so the slot fits its bits.
            let handle = (ring << SLOT_BITS) | (id.0 as u32 & (window - 1));
            let t = self.task_ptr(handle);
            // SAFETY: a task this thread popped: its record was written before the push that
            // published it (the pop acquires it) and stays until it completes.
            let (shape, funcs, blocks) = unsafe {
                (
                    TaskShape::from_u32(addr_of!((*t).shape).read()).unwrap_or(TaskShape::Dummy),
                    addr_of!((*t).func_ids).read(),
                    addr_of!((*t).block_num).read().max(1),
                )
            };
            if shape == TaskShape::Dummy {
                self.complete(c, id);
                continue;
            }
            self.pending[self.pending_len] =
                Pending { handle, shape, funcs, blocks, next_block: 0 };
            self.pending_len += 1;
            let k = self.pending_len - 1;
            self.dispatch_pending(k);
            if self.pending[k].next_block >= blocks {
                self.pending_len -= 1;
            }
        }
        progressed
    }

    fn publish_counters(&mut self) {
        let u = core::mem::take(&mut self.unpublished);
        let shared = self.view.shared();
        // Relaxed: statistics and watchdog evidence; no data is published through them.
        if u.dispatched != u.finished {
            shared.running.fetch_add(u.dispatched.wrapping_sub(u.finished), Relaxed);
        }
        if u.progress != 0 {
            shared.progress.fetch_add(u.progress, Relaxed);
        }
        // Wake the other threads only when someone waits for this: the orchestration thread
        // for the completion count it armed (also how the run's end is heard), idle schedulers
        // for the consumers made ready here.
        let idle_others = || self.completer.is_some_and(|c| c.idle_besides(self.idle));
        if u.wake_owner || (u.readied && idle_others()) {
            self.p.notify_schedulers();
        }
    }

    /// Enters or leaves the engine's idle schedulers: idle while it has room and found
    /// nothing to do. Returns whether it just entered (it must then look again before parking).
    fn track_idle(&mut self, progressed: bool) -> bool {
        let Some(c) = self.completer else { return false };
        let idle = !progressed && self.has_room();
        if idle == self.idle {
            return false;
        }
        self.idle = idle;
        if idle {
            c.idle_enter();
        } else {
            c.idle_leave();
        }
        idle
    }

    /// A completion made `count` consumers ready that the ready queue refused, so they can
    /// never run.
    fn latch_unqueued(&self, count: u32) {
        let why = format_args!("the ready queue refused {count} ready tasks");
        latch_flow_control_deadlock(self.p, &self.view, self.thread, why);
    }

    /// Latches SCHEDULER_TIMEOUT (first latch wins).
    fn latch_timeout(&self, class: StallClass) {
        let shared = self.view.shared();
        if shared
            .sched_error_code
            .compare_exchange(0, RuntimeCode::SchedulerTimeout.raw(), AcqRel, Acquire)
            .is_err()
        {
            return;
        }
        let running = shared.running.load(Relaxed);
        let stuck = self.owned.all().iter().find_map(|w| {
            w.running().map(|d| {
                // SAFETY: a task still on the core: its record stays until it completes.
                (w.index, unsafe { addr_of!((*self.task_ptr(d.task)).task_id).read() })
            })
        });
        let stuck = stuck.or_else(|| running_on_any_core(&self.view));
        let class = if running > 0 || stuck.is_some() { StallClass::RunningStalled } else { class };
        shared.error_thread.store(self.thread, Relaxed);
        shared.stall_class.store(class as u32, Relaxed);
        shared.stall_running.store(running, Relaxed);
        shared.stall_ready.store(self.pending_len as u32, Relaxed);
        match stuck {
            Some((w, task)) => {
                shared.stuck_core.store(w + 1, Relaxed);
                shared.stuck_task.store(task, Relaxed);
            }
            None => shared.stuck_task.store(u64::MAX, Relaxed),
        }
        self.p.log(LogLevel::Error, format_args!("scheduler timeout: {}", class.label()));
        self.p.notify_schedulers();
    }

    /// The scheduling loop (protocol steps 2 and 3).
    fn run(&mut self, budget: u64) {
        let shared = self.view.shared();
        let mut round = 0u32;
        let mut seen = shared.progress.load(Relaxed);
        let mut since = self.p.counter();
        loop {
            let epoch = self.p.wait_epoch();
            if self.finished() || self.p.should_stop() {
                break;
            }
            let mut progressed = self.poll_cores();
            progressed |= self.dispatch();
            self.publish_counters();
            // Announced idle just now: look at the ready queue once more before any park.
            if self.track_idle(progressed) {
                continue;
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
                let class = if shared.orch_done.load(Relaxed) == 0 {
                    StallClass::OrchestratorIdle
                } else {
                    StallClass::OnlyWaiting
                };
                self.latch_timeout(class);
                break;
            }
            let busy = self.owned.busy();
            self.p.scheduler_idle_wait(epoch, round, since.saturating_add(budget), busy);
            round = round.saturating_add(1);
        }
        self.track_idle(true);
    }
}
