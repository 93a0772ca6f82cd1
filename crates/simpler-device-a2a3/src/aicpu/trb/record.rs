//! The trb orchestration thread's diagnostic records: scope begin/end usage and submit records
//! into the image's trb diagnostics section, and submit spans (swimlane level 4) into its
//! AICPU swimlane block. Each is written only when the host asked for it; a full block counts
//! the record as dropped.

use core::ptr::addr_of_mut;
use core::sync::atomic::Ordering::Relaxed;

use simpler_types::constants::HEAP_RING_COUNT;
use simpler_types::{Tensor, TensorArgType};

use crate::abi::image::{
    AicpuRecord, FINISHED_PRODUCER, SUBMIT_RECORD_PRODUCERS, SUBMIT_RECORD_TENSORS, ScopeRecord,
    SubmitRecord, TaskShape, TrbDiagHeader,
};
use crate::aicpu::trace::{SUBMIT_SPAN_CORE, append};
use crate::aicpu::view::ImageView;
use crate::runtime::trb::engine::Engine;

/// The record blocks of one run, as the orchestration thread (their only writer) holds them.
pub(super) struct OrchRecords<'a> {
    header: &'a TrbDiagHeader,
    scopes: *mut ScopeRecord,
    submits: *mut SubmitRecord,
    /// Scope depth now (the outer scope is 0).
    pub(super) depth: u32,
}

/// What one submit record says about its task.
pub(super) struct SubmitFacts<'t> {
    pub(super) id: u64,
    pub(super) shape: TaskShape,
    pub(super) funcs: [i32; 3],
    pub(super) blocks: u32,
    pub(super) tensors: &'t [Tensor],
    pub(super) tags: &'t [TensorArgType],
    pub(super) producers: &'t [u64],
    /// Producers found finished and not waited for.
    pub(super) finished: &'t [u64],
    /// Further producers found finished, not in `finished`.
    pub(super) finished_beyond: usize,
}

impl<'a> OrchRecords<'a> {
    /// The blocks of `view`, if the host asked for scope or submit records.
    pub(super) fn of(view: &ImageView<'a>) -> Option<OrchRecords<'a>> {
        let (header, scopes, submits) = view.trb_diag()?;
        (header.scope_capacity > 0 || header.submit_capacity > 0).then_some(OrchRecords {
            header,
            scopes,
            submits,
            depth: 0,
        })
    }

    /// Whether the host asked for submit records.
    pub(super) fn submits(&self) -> bool {
        self.header.submit_capacity > 0
    }

    /// Appends a scope record.
    pub(super) fn scope(&self, r: ScopeRecord) {
        let h = self.header;
        let n = h.scope_count.load(Relaxed);
        if n < h.scope_capacity {
            // SAFETY: record `n` < capacity lies inside the checked scope block, which only this
            // thread writes during the run.
            unsafe { self.scopes.add(n as usize).write(r) };
            h.scope_count.store(n + 1, Relaxed);
        } else if h.scope_capacity > 0 {
            h.scope_dropped.fetch_add(1, Relaxed);
        }
    }

    /// Appends a submit record.
    pub(super) fn submit(&self, f: &SubmitFacts<'_>) {
        let h = self.header;
        if h.submit_capacity == 0 {
            return;
        }
        let n = h.submit_count.load(Relaxed);
        if n >= h.submit_capacity {
            h.submit_dropped.fetch_add(1, Relaxed);
            return;
        }
        // SAFETY: record `n` < capacity lies inside the checked submit block, which only this
        // thread writes during the run; fields are written in place (the record is large).
        unsafe {
            let r = self.submits.add(n as usize);
            addr_of_mut!((*r).task_id).write(f.id);
            addr_of_mut!((*r).scope_depth).write(self.depth);
            addr_of_mut!((*r).shape).write(f.shape as u32);
            addr_of_mut!((*r).func_ids).write(f.funcs);
            addr_of_mut!((*r).block_num).write(f.blocks);
            let nt = f.tensors.len().min(SUBMIT_RECORD_TENSORS);
            addr_of_mut!((*r).num_tensors).write(nt as u32);
            let found = f.producers.len() + f.finished.len() + f.finished_beyond;
            addr_of_mut!((*r).num_producers).write(found as u32);
            let finished = f.finished.iter().map(|&p| p | FINISHED_PRODUCER);
            let listed = f.producers.iter().copied().chain(finished);
            for (i, p) in listed.take(SUBMIT_RECORD_PRODUCERS).enumerate() {
                addr_of_mut!((*r).producers[i]).write(p);
            }
            for i in 0..nt {
                addr_of_mut!((*r).tags[i]).write(f.tags[i].as_i32());
                addr_of_mut!((*r).tensors[i]).write(f.tensors[i].to_bytes());
            }
        }
        h.submit_count.store(n + 1, Relaxed);
    }
}

/// Whether the image asks for the orchestration's submit spans (swimlane level 4).
pub(super) fn spans_on(view: &ImageView<'_>) -> bool {
    let h = view.header();
    h.swimlane_level >= 4 && h.aicpu_swimlane_capacity > 0
}

/// Appends the span `[start, end]` of the submit of task `id` to thread `thread`'s AICPU block.
pub(super) fn submit_span(view: &ImageView<'_>, thread: u32, id: u64, start: u64, end: u64) {
    let cap = view.header().aicpu_swimlane_capacity;
    let r =
        AicpuRecord { task_id: id, core: SUBMIT_SPAN_CORE, token: 0, dispatch: start, finish: end };
    append(view, thread, cap, r);
}

/// A scope record of the scope at `depth` with its ring's usage in `engine` now.
pub(super) fn scope_usage(engine: &mut Engine<'_>, begin: bool, depth: u32) -> ScopeRecord {
    let ring = (depth as usize).min(HEAP_RING_COUNT - 1);
    ScopeRecord {
        begin: u32::from(begin),
        depth,
        ring: ring as u32,
        tensormap: engine.map_entries().0,
        submitted: engine.submitted(),
        task_window: u64::from(engine.ring_tasks(ring).0),
        heap: engine.ring_heap(ring).0,
        dep_pool: engine.ring_deps(ring).0,
    }
}
