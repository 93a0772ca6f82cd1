//! The trb orchestration thread: its call of the orchestration and the ops table behind it.

use core::ffi::c_void;
use core::fmt;
use core::ptr::{addr_of, addr_of_mut};
use core::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::panic::AssertUnwindSafe;

use simpler_tensormap::ByteSpan;
use simpler_tensormap::fixed::AccessMode;
use simpler_types::constants::HEAP_RING_COUNT;
use simpler_types::{DeviceTaskId, TENSOR_DESC_SIZE, Tensor, TensorArgType};

use super::record::{self, OrchRecords};
use crate::abi::codes::RuntimeCode;
use crate::abi::image::{
    MAX_BLOCK_NUM, NO_FUNC, ORCH_KIND_C, ORCH_KIND_NATIVE, TRB_MESSAGE_BYTES, TaskShape, TrbHeader,
    TrbStatus,
};
use crate::aicpu::scheduler::TICKS_PER_MS;
use crate::aicpu::text::FixedText;
use crate::aicpu::view::ImageView;
use crate::aicpu::{AicpuPlatform, LogLevel};
use crate::callable::{NativeOrchFn, OrchArgs};
use crate::runtime::arity;
use crate::runtime::orch::{
    COrchArgs, COrchConfigFn, COrchEntryFn, ORCH_CAPACITY, ORCH_FAILED, ORCH_INVALID, ORCH_OK,
    OrchCtx, OrchError, SubmitDesc,
};
use crate::runtime::trb::accesses::Accesses;
use crate::runtime::trb::engine::{ArenaReset, Engine, RingStall, SubmitRefusal};
use crate::runtime::trb::storage::{
    ArenaLayout, MAX_ENTRY_TENSORS, MAX_TASK_SCALARS, MAX_TASK_TENSORS,
};
use ops::ops_table;

mod ops;

/// A submit refused for room waits until `1 / WAIT_FRACTION` of the tasks in flight completed.
const WAIT_FRACTION: u64 = 4;

/// Stores `args` as the status record's message.
fn store_message(status: &TrbStatus, args: fmt::Arguments<'_>) {
    let t = FixedText::<TRB_MESSAGE_BYTES>::format(args);
    for (word, chunk) in status.message.iter().zip(t.padded().chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        word.store(u64::from_le_bytes(b), Relaxed);
    }
    status.message_len.store(t.as_bytes().len() as u32, Relaxed);
}

/// How a wait for completions ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Waited {
    /// The completion count reached the target.
    Reached,
    /// The run was torn down or failed first.
    Stopped,
    /// The caller's deadline passed first.
    Deadline,
}

/// The orchestration thread's state: the ops table's context.
struct TrbOrch<'a, P: AicpuPlatform> {
    p: &'a P,
    view: ImageView<'a>,
    status: &'a TrbStatus,
    layout: ArenaLayout,
    base: *mut u8,
    engine: Engine<'a>,
    /// The chip entry's tensors: the buffers outside the arena an orchestration may touch.
    entry: &'a [Tensor],
    /// An error is latched (by this thread or a scheduler); every further call fails.
    failed: bool,
    /// Scope and submit records, when the host asked for them.
    records: Option<OrchRecords<'a>>,
    /// Submit spans are recorded (swimlane level 4), into this thread's AICPU block.
    spans: Option<u32>,
    /// The tensor-wait budget in counter ticks.
    tensor_wait: u64,
}

/// What a latched fault carries beyond its code and message, in the shared fault cells.
#[derive(Clone, Copy)]
enum FaultDetail<'s> {
    None,
    /// A ring stall: the ring, its sizes and its usage.
    Stall(&'s RingStall),
    /// Overlapping arguments: the task's index, the written and the other argument.
    Overlap {
        task: u64,
        written: usize,
        other: usize,
    },
}

/// Runs the orchestration on this thread (protocol step 1).
pub(super) fn orchestrate<P: AicpuPlatform>(
    p: &P,
    view: &ImageView<'_>,
    trb: &TrbHeader,
    status: &TrbStatus,
    layout: Option<ArenaLayout>,
    threads: u32,
    tensor_wait: u64,
) {
    let shared = view.shared();
    let fail = |code: RuntimeCode, args: fmt::Arguments<'_>| {
        if shared.orch_error_code.compare_exchange(0, code.raw(), AcqRel, Acquire).is_ok() {
            store_message(status, args);
        }
        shared.orch_done.store(1, Release);
        shared.ready_published.store(1, Release);
        p.notify_schedulers();
    };
    let Some(layout) = layout else {
        return fail(RuntimeCode::InvalidArgs, format_args!("the image names no usable arena"));
    };
    if threads < 2 {
        return fail(
            RuntimeCode::InvalidArgs,
            format_args!("tensormap_and_ringbuffer needs at least 2 AICPU threads, got {threads}"),
        );
    }
    let n = trb.num_tensors as usize;
    if n > MAX_ENTRY_TENSORS || trb.orch_entry == 0 || !known_kind(trb) {
        return fail(RuntimeCode::InvalidArgs, format_args!("malformed orchestration arguments"));
    }
    let args_base = view.base_addr() + trb.args_off;
    let mut tensors = [<Tensor as bytemuck::Zeroable>::zeroed(); MAX_ENTRY_TENSORS];
    let mut tags = [TensorArgType::NoDep; MAX_ENTRY_TENSORS];
    let mut wire_tags = [0i32; MAX_ENTRY_TENSORS];
    for i in 0..n {
        // SAFETY: the argument section was checked to lie inside the image (`ImageView`); it is
        // host-written plain data.
        let (bytes, tag) = unsafe {
            (
                ((args_base + 128 * i as u64) as *const [u8; TENSOR_DESC_SIZE]).read(),
                ((args_base + 128 * n as u64 + 4 * i as u64) as *const i32).read(),
            )
        };
        match (Tensor::from_bytes(&bytes), TensorArgType::from_i32(tag)) {
            (Ok(t), Some(t_tag)) => (tensors[i], tags[i], wire_tags[i]) = (t, t_tag, tag),
            _ => {
                return fail(
                    RuntimeCode::InvalidArgs,
                    format_args!("orchestration argument {i} is malformed"),
                );
            }
        }
    }
    let scalars_off = (132 * n as u64).div_ceil(8) * 8;
    // SAFETY: as above; the scalars are 8-byte aligned `u64`s inside the checked section.
    let scalars = unsafe {
        core::slice::from_raw_parts(
            (args_base + scalars_off) as *const u64,
            trb.num_scalars as usize,
        )
    };
    let c_args = COrchArgs {
        tensors: tensors.as_ptr(),
        tags: wire_tags.as_ptr(),
        scalars: scalars.as_ptr(),
        num_tensors: n as u32,
        num_scalars: trb.num_scalars,
    };
    if trb.orch_kind == ORCH_KIND_C {
        // SAFETY: the host wrote the config address the AICPU side resolved when it loaded the
        // orchestration object (`docs/device-trb.md`); `c_args` and what it points at live
        // across the call.
        let config =
            unsafe { core::mem::transmute::<usize, COrchConfigFn>(trb.orch_config as usize) };
        // SAFETY: as above.
        match std::panic::catch_unwind(AssertUnwindSafe(|| unsafe { config(&c_args) })) {
            Err(payload) => {
                return fail(
                    RuntimeCode::OrchestrationFatal,
                    format_args!(
                        "the orchestration's config function panicked: {}",
                        crate::runtime::hbg::panic_text(&*payload)
                    ),
                );
            }
            Ok(expected) if (n + scalars.len()) < expected as usize => {
                return fail(
                    RuntimeCode::InvalidArgs,
                    format_args!(
                        "the orchestration expects {expected} arguments, the chip entry got {}",
                        n + scalars.len()
                    ),
                );
            }
            Ok(_) => {}
        }
    }
    let base = trb.arena_base as *mut u8;
    // SAFETY: the host allocated `arena_len` bytes at `arena_base` for this launch (checked
    // against the layout's length in `layout_of`); this thread is the only one that touches the
    // owner sections, and the schedulers attach to the shared ones only after "runtime ready".
    let storage = unsafe { layout.owner(base) };
    let mut engine = Engine::new(storage, trb.arena_kept != 0);
    let records = OrchRecords::of(view);
    if records.as_ref().is_some_and(OrchRecords::submits) {
        engine.note_finished_producers();
    }
    // "Runtime ready": the engine reset the shared sections.
    shared.ready_published.store(1, Release);
    p.notify_schedulers();
    let mut rt = TrbOrch {
        p,
        view: *view,
        status,
        layout,
        base,
        engine,
        entry: &tensors[..n],
        failed: false,
        records,
        spans: record::spans_on(view).then_some(threads - 1),
        tensor_wait,
    };
    let ops = ops_table::<P>();
    let ctx_ptr = (&mut rt as *mut TrbOrch<'_, P>).cast::<c_void>();
    let outcome = if trb.orch_kind == ORCH_KIND_C {
        // SAFETY: the host wrote the entry address the AICPU side resolved when it loaded the
        // orchestration object.
        let entry = unsafe { core::mem::transmute::<usize, COrchEntryFn>(trb.orch_entry as usize) };
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: `ctx_ptr` is `rt`, used by nobody else during the call; the table's
            // functions expect exactly that context; `c_args` lives across the call.
            let status = unsafe { entry(&ops, ctx_ptr, &c_args) };
            if status == ORCH_OK { Ok(()) } else { Err(OrchError::from_status(status)) }
        }))
    } else {
        let args = OrchArgs::new(&tensors[..n], &tags[..n], scalars);
        // SAFETY: the host wrote the address of a `NativeOrchFn` of this build of the crate
        // (the runtime's bind writes `ORCH_KIND_NATIVE` only for a `Native` orchestration, and
        // a backend registers one only where this scheduler is the host's own, compiled in).
        let entry: NativeOrchFn =
            unsafe { core::mem::transmute::<usize, NativeOrchFn>(trb.orch_entry as usize) };
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: `ctx_ptr` is `rt`, not used by anyone else while the context exists; the
            // table's functions expect exactly that context.
            let mut ctx = unsafe { OrchCtx::new(&ops, ctx_ptr) };
            entry(&mut ctx, &args)
        }))
    };
    match outcome {
        Err(payload) => rt.latch(
            RuntimeCode::OrchestrationFatal,
            format_args!(
                "the orchestration panicked: {}",
                crate::runtime::hbg::panic_text(&*payload)
            ),
            FaultDetail::None,
        ),
        Ok(Err(e)) if !rt.failed => rt.latch(
            RuntimeCode::OrchestrationFatal,
            format_args!("the orchestration returned an error: {e}"),
            FaultDetail::None,
        ),
        Ok(_) => {}
    }
    if !rt.failed && rt.engine.finish().is_err() {
        rt.latch(
            RuntimeCode::InvalidArgs,
            format_args!("the outer scope was closed twice"),
            FaultDetail::None,
        );
    }
    status.submitted.store(rt.engine.submitted(), Relaxed);
    shared.orch_done.store(1, Release);
    p.notify_schedulers();
    if !rt.failed {
        let all = rt.engine.completion_target(u64::MAX);
        if rt.wait_completions(all) && shared.orch_error_code.load(Acquire) == 0 {
            rt.engine.end_clean();
        }
        // Schedulers parked with nothing to do hear the run's end here.
        p.notify_schedulers();
    }
    rt.record_peaks();
}

/// Whether the header names an orchestration kind this program calls (a C kind needs its
/// config function too).
fn known_kind(trb: &TrbHeader) -> bool {
    match trb.orch_kind {
        ORCH_KIND_NATIVE => true,
        ORCH_KIND_C => trb.orch_config != 0,
        _ => false,
    }
}

/// Member kernels per block of a task of `shape` running `funcs`, or why those kernels do not
/// fit the shape (host_build_graph's rules). An AIC or AIV block is one dispatch of one kernel,
/// so a second kernel named beside it would be counted as a member no core ever runs.
fn members_per_block(shape: TaskShape, funcs: &[i32; 3]) -> Result<u32, &'static str> {
    let named = funcs.map(|f| f != NO_FUNC);
    match shape {
        TaskShape::Dummy if named != [false; 3] => Err("a dummy task names kernels"),
        TaskShape::Dummy => Ok(1),
        TaskShape::Aic if named != [true, false, false] => {
            Err("an AIC task needs exactly the AIC kernel")
        }
        TaskShape::Aiv if named != [false, true, false] => {
            Err("an AIV task needs exactly one AIV kernel")
        }
        TaskShape::Mix if named == [false; 3] => Err("a MIX task names no kernel"),
        _ => Ok(named.iter().filter(|&&n| n).count() as u32),
    }
}

impl<'a, P: AicpuPlatform> TrbOrch<'a, P> {
    /// Latches `code` with a message (the first latch wins) and fails every further call.
    fn latch(&mut self, code: RuntimeCode, args: fmt::Arguments<'_>, detail: FaultDetail<'_>) {
        self.failed = true;
        let shared = self.view.shared();
        if shared.orch_error_code.compare_exchange(0, code.raw(), AcqRel, Acquire).is_err() {
            return;
        }
        store_message(self.status, args);
        let usage = match detail {
            FaultDetail::None => None,
            FaultDetail::Stall(s) => {
                shared.fault_ring.store(u32::from(s.ring), Relaxed);
                let sizes =
                    [u64::from(s.sizes.task_window), s.sizes.heap_bytes, s.sizes.dep_pool.into()];
                for (cell, v) in shared.fault_sizes.iter().zip(sizes) {
                    cell.store(v, Relaxed);
                }
                Some([u64::from(s.tasks), s.heap, s.deps])
            }
            FaultDetail::Overlap { task, written, other } => {
                Some([task, written as u64, other as u64])
            }
        };
        for (cell, v) in shared.fault_usage.iter().zip(usage.into_iter().flatten()) {
            cell.store(v, Relaxed);
        }
        self.p.log(LogLevel::Error, format_args!("orchestration failed: {code}"));
        self.p.notify_schedulers();
    }

    fn invalid(&mut self, args: fmt::Arguments<'_>) -> i32 {
        if self.failed {
            return ORCH_FAILED;
        }
        self.latch(RuntimeCode::InvalidArgs, args, FaultDetail::None);
        ORCH_INVALID
    }

    /// Latches a refusal of `op` (the call and what it was given, for the message) that is not a
    /// wait.
    fn refused(&mut self, op: &dyn fmt::Display, r: SubmitRefusal) -> i32 {
        match r {
            SubmitRefusal::Stall(s) => {
                self.latch(s.code(), format_args!("{op}: {s}"), FaultDetail::Stall(&s));
                ORCH_CAPACITY
            }
            SubmitRefusal::Invalid(m) => self.invalid(format_args!("{op}: {m}")),
            SubmitRefusal::Unqueued(id) => {
                let (ring, local) = (id.0 >> 32, id.0 as u32);
                self.latch(
                    RuntimeCode::FlowControlDeadlock,
                    format_args!("the ready queue refused task r{ring}:{local}"),
                    FaultDetail::None,
                );
                ORCH_FAILED
            }
            SubmitRefusal::Unrecorded { id, key, error } => {
                let (ring, local) = (id.0 >> 32, id.0 as u32);
                self.latch(
                    RuntimeCode::TensormapOverflow,
                    format_args!(
                        "the tensor map did not record task r{ring}:{local}'s access of buffer \
                         {key:#x} after its room check: {error}"
                    ),
                    FaultDetail::None,
                );
                ORCH_FAILED
            }
            SubmitRefusal::Wait => ORCH_OK,
        }
    }

    /// Whether waiting for completions can still end: no error latched elsewhere, no abort, no
    /// teardown.
    fn may_wait(&mut self) -> bool {
        let shared = self.view.shared();
        if self.p.should_stop()
            || shared.sched_error_code.load(Relaxed) != 0
            || shared.abort.load(Relaxed) != 0
        {
            self.failed = true;
            return false;
        }
        true
    }

    /// Retries `attempt` of `op` while the engine says to wait, idling on the platform's wait.
    fn retry<T>(
        &mut self,
        op: &dyn fmt::Display,
        mut attempt: impl FnMut(&mut Self) -> Result<T, SubmitRefusal>,
    ) -> Result<T, i32> {
        loop {
            match attempt(self) {
                Ok(v) => return Ok(v),
                Err(SubmitRefusal::Wait) => {
                    // Back-pressure in batches: sleep until a quarter of the tasks in flight
                    // completed instead of waking for every completion; the rest keep the
                    // schedulers busy meanwhile.
                    let more = (self.engine.incomplete() / WAIT_FRACTION).max(1);
                    let target = self.engine.completion_target(more);
                    if !self.wait_completions(target) {
                        return Err(ORCH_FAILED);
                    }
                }
                Err(r) => return Err(self.refused(op, r)),
            }
        }
    }

    /// Parks until the completion count reaches `target` (from
    /// [`Engine::completion_target`]); `false` when the run is torn down or failed first.
    fn wait_completions(&mut self, target: u64) -> bool {
        self.wait_completions_until(target, u64::MAX) == Waited::Reached
    }

    /// [`Self::wait_completions`] that gives up once the platform counter reaches `deadline`.
    fn wait_completions_until(&mut self, target: u64, deadline: u64) -> Waited {
        let mut round = 0u32;
        loop {
            let epoch = self.p.wait_epoch();
            if self.engine.arm_completions(target) {
                return Waited::Reached;
            }
            if !self.may_wait() {
                return Waited::Stopped;
            }
            if self.p.counter() >= deadline {
                return Waited::Deadline;
            }
            // The completion that reaches the target wakes this thread; the deadline only
            // bounds how long a torn-down platform that notifies nobody keeps it.
            self.p.idle_wait(epoch, round, self.p.counter().saturating_add(TICKS_PER_MS));
            round = round.saturating_add(1);
        }
    }

    /// Whether `[addr, addr + len)` lies in one ring heap of the arena, or in one of the chip
    /// entry's buffers whose base address is `buffer`: the map keys accesses by base address,
    /// so a tensor based inside an entry buffer would not be ordered against its other views.
    fn range_ok(&self, buffer: u64, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else { return false };
        let base = self.base as u64;
        let in_heap = (0..HEAP_RING_COUNT).any(|r| {
            let start = base + self.layout.heap_off(r);
            addr >= start && end <= start + self.layout.shape().rings[r].heap_bytes
        });
        in_heap
            || self
                .entry
                .iter()
                .any(|t| t.size > 0 && t.addr == buffer && addr >= t.addr && end <= t.addr + t.size)
    }

    /// The holder of the runtime-heap buffer `t` names (`None` for a tensor outside the
    /// heaps), or why its bytes are not a buffer of an open scope: a heap tensor must start at
    /// a live buffer from `alloc_tensors` and, unless `manual_dep` (whose owner is its
    /// creator), name that buffer's holder as its owner, so that a descriptor kept past its
    /// scope is refused even once its bytes belong to another buffer.
    fn heap_buffer(&self, t: &Tensor) -> Result<Option<u64>, &'static str> {
        let base = self.base as u64;
        let rings = self.layout.shape().rings;
        let heap = (0..HEAP_RING_COUNT).find_map(|r| {
            let start = base + self.layout.heap_off(r);
            (t.addr >= start && t.addr - start < rings[r].heap_bytes).then(|| (r, t.addr - start))
        });
        let Some((r, offset)) = heap else { return Ok(None) };
        let holder = self.engine.buffer_holder(r, offset, t.size)?;
        if !t.is_manual_dep() && t.owner_task_id != holder {
            return Err("a tensor in the runtime heap does not name its buffer's owner: a \
                        descriptor of a buffer whose scope ended, its bytes since reallocated?");
        }
        Ok(Some(holder))
    }

    fn submit(&mut self, d: &SubmitDesc) -> i64 {
        if self.failed {
            return ORCH_FAILED.into();
        }
        let span_start = if self.spans.is_some() { self.p.counter() } else { 0 };
        let (nt, ns) = (d.num_tensors as usize, d.num_scalars as usize);
        if nt > MAX_TASK_TENSORS || ns > MAX_TASK_SCALARS {
            return self
                .invalid(format_args!(
                    "submit: {nt} tensors and {ns} scalars; a task takes at most \
                     {MAX_TASK_TENSORS} and {MAX_TASK_SCALARS}"
                ))
                .into();
        }
        // SAFETY: the caller passes arrays of these lengths, valid for the call (the ops
        // table's contract); null and misaligned ones are refused.
        let Some((tensors, raw_tags, scalars)) = (unsafe { d.arrays() }) else {
            return self.invalid(format_args!("submit: null or misaligned argument array")).into();
        };
        let mut tags = [TensorArgType::NoDep; MAX_TASK_TENSORS];
        for (i, &raw) in raw_tags.iter().enumerate() {
            match TensorArgType::from_i32(raw) {
                Some(t) => tags[i] = t,
                None => {
                    return self.invalid(format_args!("submit: tag {raw} of tensor {i}")).into();
                }
            }
        }
        let tags = &tags[..nt];
        let Some(shape) = TaskShape::from_u32(d.shape) else {
            return self.invalid(format_args!("submit: unknown task shape {}", d.shape)).into();
        };
        let funcs = d.func_ids;
        for &f in &funcs {
            if f != NO_FUNC && (f < 0 || self.view.func_addr(f as u32) == 0) {
                return self
                    .invalid(format_args!("submit: func id {f} is not registered by the callable"))
                    .into();
            }
        }
        if let Err(m) = arity::check_task(self.view.trb_kernels(), &funcs, tags, scalars.len()) {
            return self.invalid(format_args!("submit: {m}")).into();
        }
        let members = match members_per_block(shape, &funcs) {
            Ok(m) => m,
            Err(why) => return self.invalid(format_args!("submit: {why}")).into(),
        };
        let blocks = if shape == TaskShape::Dummy { 1 } else { d.block_num };
        if blocks == 0 {
            return self
                .invalid(format_args!("submit: a {} task needs ≥ 1 block", shape.name()))
                .into();
        }
        if blocks > MAX_BLOCK_NUM {
            return self
                .invalid(format_args!(
                    "submit: block_num {blocks} out of range 1..={MAX_BLOCK_NUM}"
                ))
                .into();
        }
        let mut keep = [0u64; MAX_TASK_TENSORS];
        let mut kept = 0;
        let (mut creators, mut made) = ([0u64; MAX_TASK_TENSORS], 0);
        for (i, (t, &tag)) in tensors.iter().zip(tags).enumerate() {
            if t.is_null() {
                if !t.lacks_buffer_for(tag) {
                    continue;
                }
                return self
                    .invalid(format_args!(
                        "submit: tensor {i} is written but has no buffer: pass one or get it \
                         from alloc_tensors"
                    ))
                    .into();
            }
            // A zero-byte buffer names no memory (a host tensor of no elements is not staged,
            // so its address is the host's): nothing to check.
            if t.validate().is_err() || (t.size != 0 && !self.range_ok(t.addr, t.addr, t.size)) {
                return self
                    .invalid(format_args!(
                        "submit: tensor {i} ({} bytes at {:#x}) is neither a view of an argument \
                         buffer (based at its address) nor inside the runtime heap",
                        t.size, t.addr
                    ))
                    .into();
            }
            // A buffer in the runtime heap is held by its holder while this task runs.
            if t.size != 0 {
                match self.heap_buffer(t) {
                    Ok(None) => {}
                    Ok(Some(holder)) => {
                        keep[kept] = holder;
                        kept += 1;
                    }
                    Err(why) => {
                        return self.invalid(format_args!("submit: tensor {i}: {why}")).into();
                    }
                }
            }
            if t.is_manual_dep() && t.owner_task_id != DeviceTaskId::NONE.0 {
                creators[made] = t.owner_task_id;
                made += 1;
            }
        }
        let kernel_writes = arity::writes_of(self.view.trb_kernels(), &funcs);
        if let Some((written, other)) =
            simpler_types::overlapping_write(tensors, tags, kernel_writes)
        {
            // The refused task's index in submission order.
            let task = self.engine.submitted();
            let tag = tags[written];
            self.latch(
                RuntimeCode::OverlappingArguments,
                format_args!(
                    "submit: task {task}: tensor {written} ({tag}) writes bytes tensor {other} \
                     also names"
                ),
                FaultDetail::Overlap { task, written, other },
            );
            return ORCH_INVALID.into();
        }
        let accesses = match Accesses::of(tensors, tags) {
            Ok(a) => a,
            Err(e) => {
                return self.invalid(format_args!("submit: {} tracked tensors", e.tracked)).into();
            }
        };
        let task = TaskFill { funcs, shape, blocks, members, tensors, scalars };
        let (layout, base) = (self.layout, self.base);
        let keep = &keep[..kept];
        let creators = &creators[..made];
        let index = self.engine.submitted();
        let submitted = self.retry(&format_args!("submit: task {index}"), |o| {
            o.engine.submit_with(accesses.as_slice(), 0, keep, creators, |id| {
                // SAFETY: `base` is this orchestration's arena of `layout`, `id` the id the
                // engine has just issued (the callback runs before the task is published), and
                // the counts were checked against the record's arrays above.
                unsafe { write_task(layout, base, id, &task) }
            })
        });
        match submitted {
            Ok(s) => {
                for span in Accesses::untracked(tensors, tags) {
                    self.engine.note_untracked(s.id, span);
                }
                if s.wake_schedulers {
                    self.p.notify_schedulers();
                }
                // Relaxed: watchdog evidence that the orchestration is busy.
                self.view.shared().progress.fetch_add(1, Relaxed);
                if let Some(rec) = &self.records {
                    rec.submit(&record::SubmitFacts {
                        id: s.id.0,
                        shape,
                        funcs,
                        blocks,
                        tensors,
                        tags,
                        producers: self.engine.last_producers(),
                        finished: self.engine.last_finished(),
                        finished_beyond: self.engine.last_finished_beyond(),
                    });
                }
                if let Some(thread) = self.spans {
                    record::submit_span(&self.view, thread, s.id.0, span_start, self.p.counter());
                }
                s.id.0 as i64
            }
            Err(status) => status.into(),
        }
    }

    /// Places each descriptor's buffer in the current ring's heap for the innermost open scope;
    /// the descriptor names the buffer's holder as its owner.
    fn alloc(&mut self, tensors: &mut [Tensor]) -> i32 {
        if self.failed {
            return ORCH_FAILED;
        }
        for (i, t) in tensors.iter_mut().enumerate() {
            if !t.is_null() {
                let addr = t.addr;
                return self.invalid(format_args!(
                    "alloc_tensors: descriptor {i} already has a buffer at {addr:#x}"
                ));
            }
            let Some(bytes) = t.element_size().map(|e| e.saturating_mul(t.numel())) else {
                let dtype = t.dtype;
                return self.invalid(format_args!(
                    "alloc_tensors: descriptor {i} has an unknown dtype {dtype}"
                ));
            };
            let op = format_args!("alloc_tensors: descriptor {i} ({bytes} bytes)");
            match self.retry(&op, |o| o.engine.alloc(bytes)) {
                Ok(a) => {
                    t.addr = self.base as u64 + self.layout.heap_off(a.ring) + a.offset;
                    t.size = bytes;
                    t.owner_task_id = a.owner.0;
                }
                Err(status) => return status,
            }
        }
        ORCH_OK
    }

    /// Checks `t` for a copy of `len` bytes by `op` (a view inside an entry buffer, or inside a
    /// heap buffer whose scope is still open) and waits for the tasks an access in `mode` would
    /// order after (a read: the writers; an in-out access: the readers and writers).
    fn data_span(
        &mut self,
        t: &Tensor,
        len: u64,
        mode: AccessMode,
        op: &str,
    ) -> Result<ByteSpan, i32> {
        if self.failed {
            return Err(ORCH_FAILED);
        }
        let Some(span) = ByteSpan::of_tensor(t) else {
            return Err(self.invalid(format_args!("{op}: the tensor has no bytes")));
        };
        if !t.contiguous() || span.len() != len {
            return Err(self.invalid(format_args!(
                "{op}: needs a contiguous view whose {} bytes match the {len}-byte buffer",
                span.len()
            )));
        }
        // The buffer, as at submit (a valid descriptor's view lies inside it): a view of heap
        // bytes based outside every heap buffer would be keyed by a base no accessor of those
        // bytes names, and its copy would not wait for them.
        if t.validate().is_err() || !self.range_ok(t.addr, t.addr, t.size) {
            return Err(self.invalid(format_args!(
                "{op}: {span} is neither in a view of an argument buffer (based at its address) \
                 nor inside the runtime heap"
            )));
        }
        // The bytes of a heap buffer stay allocated while its scope is open, which only this
        // thread can end, so they cannot become another buffer's during the copy.
        if let Err(why) = self.heap_buffer(t) {
            return Err(self.invalid(format_args!("{op}: {why}")));
        }
        // Each round waits for the next completion, which may be one of the accessors or of the
        // tasks with untracked accesses of the bytes, which no map entry names; the
        // tensor-wait budget bounds the whole wait.
        let deadline = self.p.counter().saturating_add(self.tensor_wait);
        while !self.engine.accessors_done(t.addr, span, mode) || !self.engine.untracked_done(span) {
            let next = self.engine.completion_target(1);
            match self.wait_completions_until(next, deadline) {
                Waited::Reached => {}
                Waited::Stopped => return Err(ORCH_FAILED),
                Waited::Deadline => return Err(self.tensor_wait_timed_out(op, span)),
            }
        }
        Ok(span)
    }

    /// Latches TENSOR_WAIT_TIMEOUT for a `tensor_data`/`set_tensor_data` whose accessors did not
    /// finish within the tensor-wait budget.
    fn tensor_wait_timed_out(&mut self, op: &str, span: ByteSpan) -> i32 {
        let ms = self.tensor_wait / TICKS_PER_MS;
        self.latch(
            RuntimeCode::TensorWaitTimeout,
            format_args!("{op}: the tasks accessing {span} did not finish within {ms} ms"),
            FaultDetail::None,
        );
        ORCH_FAILED
    }

    /// Writes the rings' and the tensor map's high-water marks into the status record.
    fn record_peaks(&mut self) {
        for r in 0..HEAP_RING_COUNT {
            let peaks = [
                u64::from(self.engine.ring_tasks(r).1),
                self.engine.ring_heap(r).1,
                self.engine.ring_deps(r).1,
            ];
            for (cell, v) in self.status.peaks[r].iter().zip(peaks) {
                cell.store(v, Relaxed);
            }
        }
        self.status.map_peak.store(u64::from(self.engine.map_entries().1), Relaxed);
        let partial = self.engine.arena_reset() == ArenaReset::Partial;
        self.status.arena_partial_reset.store(u32::from(partial), Relaxed);
    }
}

/// What the dispatch record of a submitted task holds.
struct TaskFill<'t> {
    funcs: [i32; 3],
    shape: TaskShape,
    blocks: u32,
    members: u32,
    tensors: &'t [Tensor],
    scalars: &'t [u64],
}

/// Writes `task`'s dispatch record into the slot `id` was issued.
///
/// # Safety
///
/// `base` is the arena `layout` describes, `id` a task id its engine has just issued and not
/// yet published, and `task`'s tensor and scalar counts fit the record's arrays.
unsafe fn write_task(layout: ArenaLayout, base: *mut u8, id: DeviceTaskId, task: &TaskFill<'_>) {
    let ring = ((id.0 >> 32) as usize).min(HEAP_RING_COUNT - 1);
    let window = layout.shape().rings[ring].task_window;
    let t = layout.task_ptr(base, ring, (id.0 as u32 & (window - 1)) as usize);
    // SAFETY: the caller's contract: the record of a slot just issued to this task: no
    // scheduler reads it before the task is published (pushed ready, ordered by the queue's
    // release), and the slot's previous task was reclaimed, so nobody reads it now. The counts
    // fit the record's arrays.
    unsafe {
        addr_of_mut!((*t).task_id).write(id.0);
        addr_of_mut!((*t).func_ids).write(task.funcs);
        addr_of_mut!((*t).shape).write(task.shape as u32);
        addr_of_mut!((*t).block_num).write(task.blocks);
        addr_of_mut!((*t).num_tensors).write(task.tensors.len() as u32);
        addr_of_mut!((*t).num_scalars).write(task.scalars.len() as u32);
        for (i, tensor) in task.tensors.iter().enumerate() {
            addr_of_mut!((*t).tensors[i]).write(tensor.to_bytes());
        }
        for (i, &s) in task.scalars.iter().enumerate() {
            addr_of_mut!((*t).scalars[i]).write(s);
        }
        (*addr_of!((*t).members_remaining)).store(task.blocks * task.members, Relaxed);
    }
}

#[cfg(test)]
mod tests;
