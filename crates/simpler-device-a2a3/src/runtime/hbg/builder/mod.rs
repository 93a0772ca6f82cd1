//! The host graph builder of host_build_graph (`docs/device-chip.md`): the ops table's
//! implementation on the host.
//!
//! The orchestration calls `submit` for each task; the builder validates the task (func ids
//! registered, argument counts, descriptors, device pointers, write tags with buffers), derives
//! its predecessors from the tensor map over byte footprints (the rules of `docs/tensormap.md`:
//! reads order after overlapping writers, every write after overlapping live readers, `InOut`
//! also after writers, `NoDep` does neither, `manual_dep` tensors depend on their creator only),
//! and records it. The whole graph stays
//! resident, so the task window must hold every task and the heap every allocation: exceeding
//! either is `Capacity { ring: 0, … }`, before anything is launched (decision). Past the task
//! window the submits are still counted, so that the error reports the total the orchestration
//! needed, up to 4 × the window: from there on every submit returns [`ORCH_CAPACITY`] and
//! `needed` is a lower bound (`at_least`). An alloc past the heap returns [`ORCH_CAPACITY`].
//!
//! Otherwise the first error wins: it is latched, every later call returns [`ORCH_FAILED`],
//! and the run reports the latched error.
//!
//! Deviation (recorded in the decisions file): dependencies use the host `TensorMap` keyed by
//! the run id, not the fixed-capacity device map, which the device runtime will need only once
//! orchestration moves onto the AICPU.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::ops::Range;

use simpler_tensormap::{Access, ByteSpan, TensorKey, TensorMap};
use simpler_types::{
    CORE_MAX_SCALAR_ARGS, CORE_MAX_TENSOR_ARGS, DeviceTaskId, HEAP_ALIGN, MAX_SCOPE_DEPTH, RunId,
    SlotId, Tensor, TensorArgType,
};

use crate::abi::MAX_FUNC_IDS;
use crate::abi::codes::RuntimeCode;
use crate::abi::image::{KernelArity, MAX_BLOCK_NUM, NO_FUNC, TaskShape};
use crate::abi::payload::LOCAL_CONTEXT_SLOT;
use crate::error::{
    ArgSite, ArgsProblem, CapacityResource, DeviceError, OrchOp, PointerArg, RuntimeFault,
};
use crate::runtime::arity;
use crate::runtime::orch::{
    ORCH_CAPACITY, ORCH_FAILED, ORCH_INVALID, ORCH_OK, ORCH_OPS_VERSION, OrchOps, SubmitDesc,
    c_ref, c_slice,
};

/// What the builder needs from the device.
pub(crate) trait BuildEnv {
    /// Whether `[addr, addr + len)` lies inside one device allocation a task may name, other
    /// than the heap arena: the builder accepts the arena's bytes only inside the buffers this
    /// build's `alloc` handed out, since the arena kept from an earlier run may be freed by this
    /// run's first `alloc`.
    fn device_range_ok(&self, addr: u64, len: u64) -> bool;
    /// Reads device memory (of a user allocation, once no launched run can still write it).
    fn read(&mut self, addr: u64, out: &mut [u8]) -> bool;
    /// Writes device memory.
    fn write(&mut self, addr: u64, data: &[u8]) -> bool;
    /// A heap arena of at least `bytes` bytes (allocated on first use).
    fn heap_arena(&mut self, bytes: u64) -> Result<HeapArena, DeviceError>;
}

/// How many times its capacity the task window's overflow is counted before the orchestration
/// is told to stop: the capacity error then reports at least that many tasks.
const COUNT_PAST_WINDOW: u64 = 4;

/// The heap arena a run uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct HeapArena {
    /// Its device address.
    pub(crate) addr: u64,
    /// It is the allocation the previous run of the same resource slot used, untouched since,
    /// rather than one made for this run.
    pub(crate) kept: bool,
}

/// Limits of one build.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BuildLimits<'a> {
    /// Task-window entries of ring 0 (the whole graph).
    pub(crate) task_window: u32,
    /// Heap bytes of ring 0.
    pub(crate) heap_bytes: u64,
    /// Clusters of the launch.
    pub(crate) block_dim: u32,
    /// The arity of every kernel the callable registers, in ascending func id.
    pub(crate) kernels: &'a [KernelArity],
    /// Whether a task's arguments must match its kernels' signatures (every build but the
    /// replay of submits the device already checked, whose records keep no scalars).
    pub(crate) check_arity: bool,
}

/// Where a dependency edge came from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum EdgeSource {
    /// An overlap lookup in the tensor map.
    Tensormap,
    /// A `manual_dep` tensor's creator.
    Creator,
}

/// How the successor's footprint relates to the predecessor's access.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Overlap {
    /// The predecessor wrote (or, before a write, read) every byte the successor touches.
    Covered,
    /// It touched some of them.
    Partial,
}

/// One dependency, as `deps.json` reports it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct DepEdge {
    pub(crate) pred: u32,
    pub(crate) succ: u32,
    pub(crate) arg: u32,
    pub(crate) source: EdgeSource,
    pub(crate) overlap: Overlap,
    pub(crate) buffer: u64,
}

/// One recorded task.
#[derive(Clone, Debug)]
pub(crate) struct HostTask {
    pub(crate) func_ids: [i32; 3],
    pub(crate) shape: TaskShape,
    pub(crate) block_num: u32,
    pub(crate) tensors: Range<usize>,
    pub(crate) scalars: Range<usize>,
    /// Into [`BuiltGraph::preds`].
    pub(crate) preds: Range<usize>,
    pub(crate) scope_depth: u32,
}

/// One scope begin or end, for scope statistics.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScopeEvent {
    pub(crate) begin: bool,
    pub(crate) depth: u32,
    pub(crate) tasks: u64,
    pub(crate) heap: u64,
}

/// A finished graph. Tasks name their tensors, scalars and predecessors by range into the
/// graph's shared vectors, so a graph reused for the next build allocates nothing.
#[derive(Debug, Default)]
pub(crate) struct BuiltGraph {
    pub(crate) tasks: Vec<HostTask>,
    pub(crate) tensors: Vec<Tensor>,
    pub(crate) tags: Vec<TensorArgType>,
    pub(crate) scalars: Vec<u64>,
    pub(crate) preds: Vec<u32>,
    pub(crate) edges: Vec<DepEdge>,
    pub(crate) heap_used: u64,
    pub(crate) scopes: Vec<ScopeEvent>,
}

impl BuiltGraph {
    /// The predecessors of `task`, in the order they were found.
    pub(crate) fn preds_of(&self, task: &HostTask) -> &[u32] {
        &self.preds[task.preds.clone()]
    }

    /// Dependency edges between distinct tasks (each task's predecessors counted once).
    pub(crate) fn edge_count(&self) -> usize {
        self.preds.len()
    }

    /// Empties the graph, keeping its capacity.
    fn clear(&mut self) {
        let BuiltGraph { tasks, tensors, tags, scalars, preds, edges, heap_used, scopes } = self;
        tasks.clear();
        tensors.clear();
        tags.clear();
        scalars.clear();
        preds.clear();
        edges.clear();
        scopes.clear();
        *heap_used = 0;
    }
}

/// A tracked access of a recorded task, for telling covered from partial edges.
#[derive(Clone, Copy, Debug)]
struct TrackedAccess {
    addr: u64,
    span: ByteSpan,
    writes: bool,
    reads: bool,
}

/// What one build uses and the next may reuse: the tensor maps, the per-task accesses and the
/// entry spans (all emptied when the builder drops) and a spare graph (cleared when the next
/// builder takes it). A runtime keeps one, so a stream of runs of one shape builds without
/// allocating per task; what a graph larger than [`RETAINED_TASKS`] grew is not kept.
#[derive(Debug, Default)]
pub(crate) struct BuildScratch {
    map: TensorMap,
    /// Every span a task names, tracked or not (`set_tensor_data` refuses them).
    touched: TensorMap,
    /// Spans a task may write through a tensor `map` does not track (`manual_dep`, or tagged
    /// `NoDep`, which a kernel may write through): `tensor_data` refuses them like tracked
    /// writes.
    untracked_writes: TensorMap,
    /// The tracked accesses of every task so far; task `i`'s are `task_accesses[i]`.
    accesses: Vec<TrackedAccess>,
    task_accesses: Vec<Range<usize>>,
    /// The predecessors one lookup found.
    found: Vec<u32>,
    entry_spans: Vec<ByteSpan>,
    /// The entry's non-empty buffers as `(base address, bytes)`.
    entry_buffers: Vec<(u64, u64)>,
    /// The buffers `alloc_tensors` gave out as `(base address, bytes of its slab)`.
    heap_buffers: Vec<(u64, u64)>,
    /// How many of `heap_buffers` each open scope found when it began: its own come after.
    heap_scopes: Vec<usize>,
    /// The heap buffers of scopes that have ended, which no task or data call may name.
    ended_heap: Vec<(u64, u64)>,
    /// Other device memory a task or data call named (user allocations), as base address →
    /// the most bytes named at it: pairwise disjoint, since one overlapping another under a
    /// different base is refused.
    named_buffers: BTreeMap<u64, u64>,
    spare: Option<BuiltGraph>,
}

/// Tasks whose per-task storage a scratch keeps for the next build; a larger graph's is freed,
/// so one huge run does not pin its memory for the runner's lifetime.
const RETAINED_TASKS: usize = 4096;

impl BuildScratch {
    /// Keeps `graph`'s allocations for the next build, unless it grew past [`RETAINED_TASKS`].
    pub(crate) fn recycle(&mut self, graph: BuiltGraph) {
        if graph.tasks.capacity() <= RETAINED_TASKS {
            self.spare = Some(graph);
        }
    }

    /// Whether nothing of a build is left (the state every build starts from).
    fn is_empty(&self) -> bool {
        self.map.is_empty()
            && self.touched.is_empty()
            && self.untracked_writes.is_empty()
            && self.accesses.is_empty()
            && self.task_accesses.is_empty()
            && self.entry_spans.is_empty()
            && self.entry_buffers.is_empty()
            && self.heap_buffers.is_empty()
            && self.named_buffers.is_empty()
            && self.heap_scopes.is_empty()
            && self.ended_heap.is_empty()
    }

    /// Whether task `pred` wrote every byte of `span` of the buffer at `addr` or, when the
    /// successor writes, read them: the edge to it is then `Covered`.
    fn covers(&self, pred: u32, addr: u64, span: ByteSpan, successor_writes: bool) -> bool {
        let accesses =
            self.task_accesses.get(pred as usize).and_then(|r| self.accesses.get(r.clone()));
        accesses.is_some_and(|accesses| {
            accesses.iter().any(|a| {
                a.addr == addr
                    && (a.writes || (successor_writes && a.reads))
                    && a.span.contains(span)
            })
        })
    }
}

/// The builder. Its address is the `rt` pointer of the ops table.
pub(crate) struct GraphBuilder<'e> {
    run_id: RunId,
    limits: BuildLimits<'e>,
    env: &'e mut dyn BuildEnv,
    scratch: &'e mut BuildScratch,
    task_total: u64,
    graph: BuiltGraph,
    heap_base: Option<u64>,
    heap_needed: u64,
    scope_depth: u32,
    error: Option<DeviceError>,
}

fn span_of(t: &Tensor) -> Option<ByteSpan> {
    t.byte_span().and_then(|(s, e)| ByteSpan::new(s, e))
}

fn slot_of(task: u32) -> SlotId {
    SlotId::new(task, 1)
}

impl<'e> GraphBuilder<'e> {
    /// A builder for `run_id`; `entry` are the chip entry's (staged) tensors, readable through
    /// `tensor_data`. It builds into `scratch`'s spare graph, if any, and empties what it used
    /// of `scratch` when it drops.
    pub(crate) fn new(
        run_id: RunId,
        limits: BuildLimits<'e>,
        env: &'e mut dyn BuildEnv,
        entry: &[Tensor],
        scratch: &'e mut BuildScratch,
    ) -> Self {
        debug_assert!(scratch.is_empty(), "the previous builder emptied the scratch");
        let mut graph = scratch.spare.take().unwrap_or_default();
        graph.clear();
        scratch.entry_spans.clear();
        scratch.entry_spans.extend(entry.iter().filter_map(span_of));
        scratch.entry_buffers.clear();
        let named = |t: &&Tensor| !t.is_null() && t.size > 0;
        scratch.entry_buffers.extend(entry.iter().filter(named).map(|t| (t.addr, t.size)));
        GraphBuilder {
            run_id,
            limits,
            env,
            scratch,
            task_total: 0,
            graph,
            heap_base: None,
            heap_needed: 0,
            scope_depth: 0,
            error: None,
        }
    }

    fn latch(&mut self, e: DeviceError) -> i32 {
        let status = match &e {
            DeviceError::Capacity { .. } => ORCH_CAPACITY,
            _ => ORCH_INVALID,
        };
        if self.error.is_none() {
            self.error = Some(e);
        }
        status
    }

    fn invalid(&mut self, problem: ArgsProblem) -> i32 {
        let run_id = Some(self.run_id);
        self.latch(DeviceError::InvalidArgs { run_id, problem })
    }

    /// Records one task; returns its device task id or a negative status.
    pub(crate) fn submit(
        &mut self,
        func_ids: [i32; 3],
        shape: u32,
        block_num: u32,
        tensors: &[Tensor],
        tags: &[i32],
        scalars: &[u64],
    ) -> i64 {
        match &self.error {
            // The task window's overflow was counted to its bound: the orchestration was told
            // to stop, and is told again.
            Some(DeviceError::Capacity {
                resource: CapacityResource::TaskWindow,
                at_least: true,
                ..
            }) => return i64::from(ORCH_CAPACITY),
            // Tasks are still counted (below) after a capacity error.
            None | Some(DeviceError::Capacity { .. }) => {}
            Some(_) => return i64::from(ORCH_FAILED),
        }
        let task = self.task_total;
        let Some(shape) = TaskShape::from_u32(shape) else {
            return i64::from(self.invalid(ArgsProblem::UnknownShape { task, shape }));
        };
        if let Err(p) = self.check_kernels(task, func_ids, shape, block_num) {
            return i64::from(self.invalid(p));
        }
        if tensors.len() > CORE_MAX_TENSOR_ARGS
            || scalars.len() > CORE_MAX_SCALAR_ARGS
            || tensors.len() + scalars.len() > LOCAL_CONTEXT_SLOT
        {
            let (tensors, scalars) = (tensors.len(), scalars.len());
            return i64::from(self.invalid(ArgsProblem::TooManyArgs { task, tensors, scalars }));
        }
        let mut parsed_tags = [TensorArgType::Input; CORE_MAX_TENSOR_ARGS];
        for (arg, t) in tensors.iter().enumerate() {
            let raw = tags.get(arg).copied().unwrap_or(0);
            let Some(tag) = TensorArgType::from_i32(raw) else {
                let site = ArgSite::Task { task, arg };
                return i64::from(self.invalid(ArgsProblem::UnknownTag { site, raw }));
            };
            parsed_tags[arg] = tag;
            if let Err(p) = self.check_tensor(task, arg, t, tag) {
                return i64::from(self.invalid(p));
            }
            self.note_base(t);
        }
        let parsed_tags = &parsed_tags[..tensors.len()];
        if self.limits.check_arity
            && let Err(source) =
                arity::check_task(self.limits.kernels, &func_ids, parsed_tags, scalars.len())
        {
            return i64::from(self.invalid(ArgsProblem::Arity { task, source }));
        }
        let kernel_writes = arity::writes_of(self.limits.kernels, &func_ids);
        if let Some((written, other)) =
            simpler_types::overlapping_write(tensors, parsed_tags, kernel_writes)
        {
            let run_id = self.run_id;
            return i64::from(self.latch(DeviceError::OverlappingArguments {
                run_id,
                task,
                written,
                other,
            }));
        }
        self.task_total += 1;
        let window = u64::from(self.limits.task_window);
        if self.task_total > window {
            // Keep counting so the error reports what the whole graph needs, up to a bound:
            // past it the orchestration is told to stop, so that one whose graph has no end
            // in sight (its size read from data) still ends its preparation.
            let stop = self.task_total > window.saturating_mul(COUNT_PAST_WINDOW);
            let e = DeviceError::Capacity {
                run_id: self.run_id,
                ring: 0,
                resource: CapacityResource::TaskWindow,
                capacity: window,
                needed: self.task_total,
                at_least: stop,
            };
            match &mut self.error {
                Some(DeviceError::Capacity {
                    resource: CapacityResource::TaskWindow,
                    needed,
                    at_least,
                    ..
                }) => (*needed, *at_least) = (self.task_total, stop),
                None => self.error = Some(e),
                Some(_) => {}
            }
            if stop {
                return i64::from(ORCH_CAPACITY);
            }
            return DeviceTaskId::new(0, task as u32).0 as i64;
        }
        if self.error.is_some() {
            return i64::from(ORCH_FAILED);
        }
        let idx = task as u32;
        let preds_start = self.graph.preds.len();
        let scratch = &mut *self.scratch;
        let graph = &mut self.graph;
        let add_pred = |preds: &mut Vec<u32>, pred: u32| {
            if !preds[preds_start..].contains(&pred) {
                preds.push(pred);
            }
        };
        // Look-ups first, inserts after, so a task never depends on itself.
        for (i, t) in tensors.iter().enumerate() {
            let tag = parsed_tags[i];
            // A `manual_dep` tensor orders after its creator whatever its size, as on trb.
            if t.is_manual_dep() {
                let owner = t.owner();
                if owner.is_valid() && owner.ring() == 0 && owner.local() < idx {
                    let pred = owner.local();
                    graph.edges.push(DepEdge {
                        pred,
                        succ: idx,
                        arg: i as u32,
                        source: EdgeSource::Creator,
                        overlap: Overlap::Covered,
                        buffer: t.addr,
                    });
                    add_pred(&mut graph.preds, pred);
                }
                continue;
            }
            let Some(span) = span_of(t) else { continue };
            if let Some(access) = Access::of_view(tag, t) {
                let key = TensorKey::Host { addr: t.addr };
                let found = &mut scratch.found;
                found.clear();
                scratch.map.dependencies(self.run_id, &key, span, access, |slot| {
                    if !found.contains(&slot.index) {
                        found.push(slot.index);
                    }
                });
                for &pred in &scratch.found {
                    let covered = scratch.covers(pred, t.addr, span, tag.writes());
                    graph.edges.push(DepEdge {
                        pred,
                        succ: idx,
                        arg: i as u32,
                        source: EdgeSource::Tensormap,
                        overlap: if covered { Overlap::Covered } else { Overlap::Partial },
                        buffer: t.addr,
                    });
                    add_pred(&mut graph.preds, pred);
                }
            }
        }
        let accesses_start = scratch.accesses.len();
        for (i, t) in tensors.iter().enumerate() {
            let tag = parsed_tags[i];
            let Some(span) = span_of(t) else { continue };
            let key = TensorKey::Host { addr: t.addr };
            scratch.touched.insert(self.run_id, key, span, slot_of(idx));
            let untracked = t.is_manual_dep() || Access::of_view(tag, t).is_none();
            if untracked && tag != TensorArgType::Input {
                scratch.untracked_writes.insert(self.run_id, key, span, slot_of(idx));
            }
            if let (Some(access), false) = (Access::of_view(tag, t), t.is_manual_dep()) {
                scratch.map.record(self.run_id, key, span, access, slot_of(idx));
                if tag.writes() || tag.reads() {
                    scratch.accesses.push(TrackedAccess {
                        addr: t.addr,
                        span,
                        writes: tag.writes(),
                        reads: tag.reads(),
                    });
                }
            }
        }
        scratch.task_accesses.push(accesses_start..scratch.accesses.len());
        let t0 = graph.tensors.len();
        graph.tensors.extend_from_slice(tensors);
        graph.tags.extend_from_slice(&parsed_tags[..tensors.len()]);
        let s0 = graph.scalars.len();
        graph.scalars.extend_from_slice(scalars);
        graph.tasks.push(HostTask {
            func_ids,
            shape,
            block_num: block_num.max(1),
            tensors: t0..graph.tensors.len(),
            scalars: s0..graph.scalars.len(),
            preds: preds_start..graph.preds.len(),
            scope_depth: self.scope_depth,
        });
        DeviceTaskId::new(0, idx).0 as i64
    }

    fn check_kernels(
        &self,
        task: u64,
        funcs: [i32; 3],
        shape: TaskShape,
        block_num: u32,
    ) -> Result<(), ArgsProblem> {
        if block_num == 0 || block_num > MAX_BLOCK_NUM {
            return Err(ArgsProblem::BlockNum { task, block_num, max: MAX_BLOCK_NUM });
        }
        let mut named = [(0usize, 0i32); 3];
        let mut count = 0;
        for (slot, f) in funcs.iter().copied().enumerate().filter(|(_, f)| *f != NO_FUNC) {
            named[count] = (slot, f);
            count += 1;
        }
        let set = &named[..count];
        let fits = match shape {
            TaskShape::Dummy => set.is_empty(),
            TaskShape::Aic => set.len() == 1 && set[0].0 == 0,
            TaskShape::Aiv => set.len() == 1 && set[0].0 == 1,
            TaskShape::Mix => !set.is_empty(),
        };
        if !fits {
            return Err(ArgsProblem::ShapeKernels { task, shape, funcs });
        }
        for &(_, func_id) in set {
            if func_id < 0 || func_id as usize >= MAX_FUNC_IDS {
                return Err(ArgsProblem::FuncIdRange { task, func_id, limit: MAX_FUNC_IDS });
            }
            if arity::find(self.limits.kernels, func_id as u32).is_none() {
                return Err(ArgsProblem::UnknownFunc { task, func_id });
            }
        }
        Ok(())
    }

    fn check_tensor(
        &self,
        task: u64,
        arg: usize,
        t: &Tensor,
        tag: TensorArgType,
    ) -> Result<(), ArgsProblem> {
        if t.is_null() {
            return if t.lacks_buffer_for(tag) {
                Err(ArgsProblem::NullWrittenTensor { site: ArgSite::Task { task, arg }, tag })
            } else {
                Ok(())
            };
        }
        t.validate().map_err(|source| ArgsProblem::Descriptor { task, arg, tag, source })?;
        self.not_after_its_scope(Some(task), arg, t)?;
        if t.size > 0 && !self.range_ok(t.addr, t.size) {
            let (addr, len) = (t.addr, t.size);
            return Err(ArgsProblem::TensorOutsideAllocation { task, arg, addr, len });
        }
        self.base_alias(Some(task), arg, t)
    }

    /// Whether a task or a data call may name `[addr, addr + len)`: inside one heap buffer this
    /// build allocated, or in memory the device lets tasks name (`BuildEnv::device_range_ok`).
    fn range_ok(&self, addr: u64, len: u64) -> bool {
        let end = addr.checked_add(len);
        let in_heap_buffer = |&(base, bytes): &(u64, u64)| {
            base <= addr && end.is_some_and(|e| e <= base.saturating_add(bytes))
        };
        self.scratch.heap_buffers.iter().any(in_heap_buffer) || self.env.device_range_ok(addr, len)
    }

    /// Refuses `t` (argument `arg` of `task`, or of a data call) when it names a heap buffer
    /// whose scope has ended.
    pub(super) fn not_after_its_scope(
        &self,
        task: Option<u64>,
        arg: usize,
        t: &Tensor,
    ) -> Result<(), ArgsProblem> {
        let inside = |&&(base, bytes): &&(u64, u64)| base <= t.addr && t.addr - base < bytes;
        let ended = self.scratch.ended_heap.iter().find(inside);
        let addr = t.addr;
        ended.map_or(Ok(()), |&(heap_addr, _)| {
            Err(ArgsProblem::HeapBufferAfterScope { task, arg, addr, heap_addr })
        })
    }

    /// Refuses `t` (argument `arg` of `task`, or of a data call) when its buffer overlaps an
    /// entry buffer or a heap buffer under another base address: the maps key accesses by base
    /// address, so `t` would not be ordered against that buffer's views.
    fn base_alias(&self, task: Option<u64>, arg: usize, t: &Tensor) -> Result<(), ArgsProblem> {
        // A null or zero-byte tensor names no memory: nothing to order.
        if t.is_null() || t.size == 0 {
            return Ok(());
        }
        let end = t.addr.saturating_add(t.size);
        let alias = |buffers: &[(u64, u64)]| {
            buffers
                .iter()
                .find(|&&(base, bytes)| {
                    base != t.addr && t.addr < base.saturating_add(bytes) && base < end
                })
                .map(|&(base, _)| base)
        };
        let addr = t.addr;
        if let Some(entry_addr) = alias(&self.scratch.entry_buffers) {
            return Err(ArgsProblem::EntryBaseAlias { task, arg, addr, entry_addr });
        }
        if let Some(heap_addr) = alias(&self.scratch.heap_buffers) {
            return Err(ArgsProblem::HeapBaseAlias { task, arg, addr, heap_addr });
        }
        // The named buffers are disjoint: only the nearest one below can reach `t.addr`.
        let named = &self.scratch.named_buffers;
        let below =
            named.range(..t.addr).next_back().filter(|&(&b, &n)| b.saturating_add(n) > addr);
        let above = named.range(addr.saturating_add(1)..end).next();
        if let Some((&other_addr, _)) = below.or(above) {
            return Err(ArgsProblem::BufferBaseAlias { task, arg, addr, other_addr });
        }
        Ok(())
    }

    /// Records the base of `t`, which passed [`base_alias`](Self::base_alias), unless it is a
    /// chip argument's or a heap buffer's (those have lists of their own).
    pub(super) fn note_base(&mut self, t: &Tensor) {
        if t.is_null() || t.size == 0 {
            return;
        }
        let s = &mut *self.scratch;
        let at_base = |buffers: &[(u64, u64)]| buffers.iter().any(|&(base, _)| base == t.addr);
        if at_base(&s.entry_buffers) || at_base(&s.heap_buffers) {
            return;
        }
        let bytes = s.named_buffers.entry(t.addr).or_insert(0);
        *bytes = (*bytes).max(t.size);
    }

    /// Whether a latched error stops every later call: any but a capacity overflow (retried).
    pub(super) fn stopped(&self) -> bool {
        self.error.as_ref().is_some_and(|e| !matches!(e, DeviceError::Capacity { .. }))
    }

    fn alloc(&mut self, tensors: &mut [Tensor]) -> i32 {
        if self.stopped() {
            return ORCH_FAILED;
        }
        for (index, t) in tensors.iter_mut().enumerate() {
            if !t.is_null() {
                return self.invalid(ArgsProblem::AllocHasBuffer { index, addr: t.addr });
            }
            let Some(bytes) = t.element_size().map(|e| e.saturating_mul(t.numel())) else {
                return self.invalid(ArgsProblem::AllocUnknownDtype { index, dtype: t.dtype });
            };
            let Some(aligned) = bytes.max(1).checked_next_multiple_of(HEAP_ALIGN) else {
                return self.invalid(ArgsProblem::AllocTooLarge { index, bytes });
            };
            let offset = self.heap_needed;
            self.heap_needed = self.heap_needed.saturating_add(aligned);
            if self.heap_needed > self.limits.heap_bytes {
                let needed = self.heap_needed;
                match &mut self.error {
                    Some(DeviceError::Capacity {
                        resource: CapacityResource::Heap,
                        needed: n,
                        ..
                    }) => *n = needed,
                    None => {
                        self.error = Some(DeviceError::Capacity {
                            run_id: self.run_id,
                            ring: 0,
                            resource: CapacityResource::Heap,
                            capacity: self.limits.heap_bytes,
                            needed,
                            // The alloc that ran out returns the capacity status.
                            at_least: true,
                        })
                    }
                    Some(_) => {}
                }
                return ORCH_CAPACITY;
            }
            let base = match self.heap_base {
                Some(b) => b,
                None => match self.env.heap_arena(self.limits.heap_bytes) {
                    Ok(a) => {
                        self.heap_base = Some(a.addr);
                        a.addr
                    }
                    Err(e) => return self.latch(e),
                },
            };
            t.addr = base + offset;
            t.size = bytes;
            t.owner_task_id = DeviceTaskId::NONE.0;
            self.scratch.heap_buffers.push((t.addr, aligned));
        }
        ORCH_OK
    }

    pub(crate) fn scope_begin(&mut self) -> i32 {
        if self.scope_depth as usize + 1 >= MAX_SCOPE_DEPTH {
            return self.invalid(ArgsProblem::ScopeTooDeep { max: MAX_SCOPE_DEPTH - 1 });
        }
        self.scope_depth += 1;
        self.scratch.heap_scopes.push(self.scratch.heap_buffers.len());
        self.graph.scopes.push(ScopeEvent {
            begin: true,
            depth: self.scope_depth,
            tasks: self.task_total,
            heap: self.heap_needed,
        });
        ORCH_OK
    }

    pub(crate) fn scope_end(&mut self) -> i32 {
        if self.scope_depth == 0 {
            return self.invalid(ArgsProblem::ScopeUnbalanced);
        }
        self.graph.scopes.push(ScopeEvent {
            begin: false,
            depth: self.scope_depth,
            tasks: self.task_total,
            heap: self.heap_needed,
        });
        self.scope_depth -= 1;
        // The scope's heap buffers end with it, as under tensormap_and_ringbuffer.
        if let Some(first) = self.scratch.heap_scopes.pop() {
            let s = &mut *self.scratch;
            s.ended_heap.extend(s.heap_buffers.drain(first.min(s.heap_buffers.len())..));
        }
        ORCH_OK
    }

    fn report_fatal(&mut self, code: i32, message: String) {
        let code = RuntimeCode::reported_by_orchestration(code);
        let run_id = self.run_id;
        if self.error.is_none() {
            self.error = Some(DeviceError::Runtime {
                run_id,
                fault: Box::new(RuntimeFault::new(code, message)),
            });
        }
    }

    /// Finishes the build: the latched error, or the graph.
    pub(crate) fn finish(mut self) -> Result<BuiltGraph, DeviceError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        while self.scope_depth > 0 {
            self.scope_end();
        }
        self.graph.heap_used = self.heap_needed;
        Ok(std::mem::take(&mut self.graph))
    }

    /// The latched error, if any (without finishing).
    pub(crate) fn has_error(&self) -> bool {
        self.error.is_some()
    }
}

impl Drop for GraphBuilder<'_> {
    /// Leaves the scratch empty for the next build, whatever ended this one (a finished graph,
    /// a latched error, a panicking orchestration); an unfinished graph becomes the spare.
    fn drop(&mut self) {
        let s = &mut *self.scratch;
        for map in [&mut s.map, &mut s.touched, &mut s.untracked_writes] {
            map.erase_run(self.run_id);
            // Only this run's entries were ever inserted, so anything left means a record
            // was interrupted (a panic inside the map): start the next build from a new map.
            if !map.is_empty() {
                *map = TensorMap::new();
            }
        }
        s.accesses.clear();
        s.task_accesses.clear();
        s.entry_spans.clear();
        s.entry_buffers.clear();
        s.heap_buffers.clear();
        s.named_buffers.clear();
        s.heap_scopes.clear();
        s.ended_heap.clear();
        if s.task_accesses.capacity() > RETAINED_TASKS {
            s.accesses = Vec::new();
            s.task_accesses = Vec::new();
        }
        if s.spare.is_none() && self.graph.tasks.capacity() > 0 {
            s.recycle(std::mem::take(&mut self.graph));
        }
    }
}

/// The builder behind `rt`.
///
/// # Safety
///
/// `rt` must be the `GraphBuilder` the runner passed to `OrchCtx::new`, exclusively borrowed
/// for the orchestration call that is running.
unsafe fn builder<'a>(rt: *mut c_void) -> &'a mut GraphBuilder<'a> {
    // SAFETY: the caller's contract.
    unsafe { &mut *(rt as *mut GraphBuilder<'a>) }
}

unsafe extern "C-unwind" fn op_submit(rt: *mut c_void, desc: *const SubmitDesc) -> i64 {
    // SAFETY: the ops table is only handed out with a live builder as `rt`.
    let b = unsafe { builder(rt) };
    // SAFETY: a non-null, aligned descriptor points at a `SubmitDesc` for the duration of the
    // call.
    let Some(d) = (unsafe { c_ref(desc) }) else {
        let pointer = PointerArg::TaskDescriptor;
        return i64::from(b.invalid(ArgsProblem::BadPointer { op: OrchOp::Submit, pointer }));
    };
    if d.num_tensors as usize > CORE_MAX_TENSOR_ARGS
        || d.num_scalars as usize > CORE_MAX_SCALAR_ARGS
    {
        return i64::from(b.invalid(ArgsProblem::TooManyArgs {
            task: b.task_total,
            tensors: d.num_tensors as usize,
            scalars: d.num_scalars as usize,
        }));
    }
    // SAFETY: the descriptor's arrays hold the counts it states (the orchestration's contract,
    // upheld by `OrchCtx`); the counts were bounded above; null and misaligned ones are refused.
    let Some((tensors, tags, scalars)) = (unsafe { d.arrays() }) else {
        return i64::from(b.invalid(ArgsProblem::BadTaskArrays {
            task: b.task_total,
            tensors: d.num_tensors as usize,
            scalars: d.num_scalars as usize,
        }));
    };
    b.submit(d.func_ids, d.shape, d.block_num, tensors, tags, scalars)
}

unsafe extern "C-unwind" fn op_scope_begin(rt: *mut c_void) -> i32 {
    // SAFETY: see `op_submit`.
    unsafe { builder(rt) }.scope_begin()
}

unsafe extern "C-unwind" fn op_scope_end(rt: *mut c_void) -> i32 {
    // SAFETY: see `op_submit`.
    unsafe { builder(rt) }.scope_end()
}

unsafe extern "C-unwind" fn op_alloc_tensors(
    rt: *mut c_void,
    tensors: *mut Tensor,
    count: u32,
) -> i32 {
    // SAFETY: see `op_submit`.
    let b = unsafe { builder(rt) };
    if count == 0 {
        return ORCH_OK;
    }
    if tensors.is_null() || !tensors.is_aligned() {
        let pointer = PointerArg::Descriptor;
        return b.invalid(ArgsProblem::BadPointer { op: OrchOp::AllocTensors, pointer });
    }
    // SAFETY: the caller passes `count` descriptors it exclusively owns for the call.
    let ts = unsafe { std::slice::from_raw_parts_mut(tensors, count as usize) };
    b.alloc(ts)
}

unsafe extern "C-unwind" fn op_get_tensor_data(
    rt: *mut c_void,
    t: *const Tensor,
    dst: *mut u8,
    len: u64,
) -> i32 {
    // SAFETY: see `op_submit`.
    let b = unsafe { builder(rt) };
    let op = OrchOp::TensorData;
    // SAFETY: a non-null, aligned descriptor pointer is valid for the call.
    let Some(t) = (unsafe { c_ref(t) }) else {
        return b.invalid(ArgsProblem::BadPointer { op, pointer: PointerArg::Descriptor });
    };
    let t = *t;
    if dst.is_null() && len > 0 {
        return b.invalid(ArgsProblem::BadPointer { op, pointer: PointerArg::Destination });
    }
    let Ok(n) = usize::try_from(len) else {
        return b.invalid(ArgsProblem::LengthOverflow { op, len });
    };
    let out: &mut [u8] = if n == 0 {
        &mut []
    } else {
        // SAFETY: the caller passes a destination valid for `len` bytes.
        unsafe { std::slice::from_raw_parts_mut(dst, n) }
    };
    b.get_data(&t, out)
}

unsafe extern "C-unwind" fn op_set_tensor_data(
    rt: *mut c_void,
    t: *const Tensor,
    src: *const u8,
    len: u64,
) -> i32 {
    // SAFETY: see `op_submit`.
    let b = unsafe { builder(rt) };
    let op = OrchOp::SetTensorData;
    // SAFETY: a non-null, aligned descriptor pointer is valid for the call.
    let Some(t) = (unsafe { c_ref(t) }) else {
        return b.invalid(ArgsProblem::BadPointer { op, pointer: PointerArg::Descriptor });
    };
    let t = *t;
    let Ok(n) = usize::try_from(len) else {
        return b.invalid(ArgsProblem::LengthOverflow { op, len });
    };
    // SAFETY: the caller passes a source valid for `len` bytes.
    let Some(data) = (unsafe { c_slice(src, n) }) else {
        return b.invalid(ArgsProblem::BadPointer { op, pointer: PointerArg::Source });
    };
    b.set_data(&t, data)
}

unsafe extern "C-unwind" fn op_available_clusters(rt: *mut c_void) -> u32 {
    // SAFETY: see `op_submit`.
    unsafe { builder(rt) }.limits.block_dim
}

unsafe extern "C-unwind" fn op_available_aiv_cores(rt: *mut c_void) -> u32 {
    // SAFETY: see `op_submit`.
    unsafe { builder(rt) }.limits.block_dim * 2
}

unsafe extern "C-unwind" fn op_report_fatal(
    rt: *mut c_void,
    code: i32,
    msg: *const u8,
    len: usize,
) {
    // SAFETY: see `op_submit`.
    let b = unsafe { builder(rt) };
    // SAFETY: the caller passes a message valid for `len` bytes.
    let text = String::from_utf8_lossy(unsafe { c_slice(msg, len) }.unwrap_or(&[])).into_owned();
    b.report_fatal(code, text);
}

unsafe extern "C-unwind" fn op_log(rt: *mut c_void, level: u32, msg: *const u8, len: usize) {
    // SAFETY: see `op_submit`.
    let b = unsafe { builder(rt) };
    // SAFETY: the caller passes a message valid for `len` bytes.
    let text = String::from_utf8_lossy(unsafe { c_slice(msg, len) }.unwrap_or(&[]));
    let run = b.run_id.get();
    match level {
        0 => tracing::error!(run, "orchestration: {text}"),
        1 => tracing::warn!(run, "orchestration: {text}"),
        2 => tracing::info!(run, "orchestration: {text}"),
        _ => tracing::debug!(run, "orchestration: {text}"),
    }
}

/// The host_build_graph ops table.
pub(crate) static HBG_OPS: OrchOps = OrchOps {
    version: ORCH_OPS_VERSION,
    submit: op_submit,
    scope_begin: op_scope_begin,
    scope_end: op_scope_end,
    alloc_tensors: op_alloc_tensors,
    get_tensor_data: op_get_tensor_data,
    set_tensor_data: op_set_tensor_data,
    available_clusters: op_available_clusters,
    available_aiv_cores: op_available_aiv_cores,
    report_fatal: op_report_fatal,
    log: op_log,
};

mod data;
#[cfg(test)]
mod tests;
