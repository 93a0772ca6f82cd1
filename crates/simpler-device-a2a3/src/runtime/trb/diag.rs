//! The host half of the trb diagnostics (`docs/device-trb.md`): what a run asks the device to
//! record, and turning the records into the same files host_build_graph writes.
//!
//! - Swimlane: the AICore and AICPU records use the image's swimlane sections as under
//!   host_build_graph; level 4 adds the orchestration thread's submit spans to its AICPU block.
//! - `dep_gen`: the orchestration thread records every submit (task id, scope depth, kernels,
//!   blocks, tensor arguments and tags, and the producers its tensor map found). The host
//!   replays the records through host_build_graph's builder (the host tensor map) and writes
//!   `deps.json` from the replay; every edge on which the device's wiring and the replay
//!   disagree is a report warning.
//! - `scope_stats`: one record per scope begin and end with the usage of the scope's ring.
//!
//! The device buffers are fixed: records that do not fit are counted, and the report and the
//! files say how many were lost.

use std::collections::HashMap;

use simpler_types::{DeviceTaskId, RunId, Tensor};

use crate::abi::image::{
    FINISHED_PRODUCER, KernelArity, SUBMIT_RECORD_PRODUCERS, ScopeRecord, SubmitRecord,
};
use crate::aicpu::view::HostImageView;
use crate::diag::scopes::{ScopeLine, ScopeSummary};
use crate::error::DeviceError;
use crate::runner::RunReport;
use crate::runtime::hbg::builder::{
    BuildEnv, BuildLimits, BuildScratch, BuiltGraph, GraphBuilder, HeapArena,
};

/// AICore swimlane records per core.
pub(crate) const SWIMLANE_RECORDS_PER_CORE: u32 = 4096;
/// AICPU swimlane records per AICPU thread (dispatches, or the orchestration's submit spans).
pub(crate) const AICPU_RECORDS_PER_THREAD: u32 = 16_384;
/// Scope begin and end records per run.
pub(crate) const SCOPE_RECORDS: u32 = 4096;
/// Submit records per run.
pub(crate) const SUBMIT_RECORDS: u32 = 2048;

/// What a trb orchestration thread recorded for the diagnostics.
#[derive(Clone, Debug, Default)]
pub(crate) struct TrbDiagRecords {
    /// Scope begin and end records, in order.
    pub(crate) scopes: Vec<ScopeRecord>,
    /// Scope events that did not fit.
    pub(crate) scope_dropped: u32,
    /// Submit records, in submit order.
    pub(crate) submits: Vec<SubmitRecord>,
    /// Submits that did not fit.
    pub(crate) submit_dropped: u32,
}

impl TrbDiagRecords {
    /// The records of `image` (empty when it has no diagnostics section).
    pub(crate) fn read(image: &HostImageView<'_>) -> TrbDiagRecords {
        use std::sync::atomic::Ordering::Acquire;
        let Some((h, scopes, submits)) = image.trb_diag() else {
            return TrbDiagRecords::default();
        };
        let ns = h.scope_count.load(Acquire).min(h.scope_capacity) as usize;
        let nu = h.submit_count.load(Acquire).min(h.submit_capacity) as usize;
        // SAFETY: the first `count ≤ capacity` records of each block lie inside the section
        // the view checked, were written by the orchestration thread before it bumped the
        // count, and no device thread runs while a host view exists; records are integers read
        // by value.
        let (scopes, submits) = unsafe {
            (
                (0..ns).map(|i| scopes.add(i).read()).collect(),
                (0..nu).map(|i| submits.add(i).read()).collect(),
            )
        };
        TrbDiagRecords {
            scopes,
            scope_dropped: h.scope_dropped.load(Acquire),
            submits,
            submit_dropped: h.submit_dropped.load(Acquire),
        }
    }
}

/// The replay's device: every range is accepted (the device checked them), nothing is read.
struct ReplayEnv;

impl BuildEnv for ReplayEnv {
    fn device_range_ok(&self, _: u64, _: u64) -> bool {
        true
    }
    fn read(&mut self, _: u64, _: &mut [u8]) -> bool {
        false
    }
    fn write(&mut self, _: u64, _: &[u8]) -> bool {
        false
    }
    fn heap_arena(&mut self, bytes: u64) -> Result<HeapArena, DeviceError> {
        Err(DeviceError::Unsupported {
            cause: None,
            run_id: None,
            feature: format!("allocating {bytes} bytes while replaying a dependency graph"),
        })
    }
}

/// Scope instances during a replay (0 = the outer scope).
struct ScopeTrack {
    /// The open instances, innermost last.
    open: Vec<usize>,
    /// Per instance, the submit count at which it closed (`u64::MAX` while open).
    closed_at: Vec<u64>,
}

impl ScopeTrack {
    fn apply(&mut self, b: &mut GraphBuilder<'_>, s: &ScopeRecord) {
        if s.begin != 0 {
            b.scope_begin();
            self.open.push(self.closed_at.len());
            self.closed_at.push(u64::MAX);
        } else {
            b.scope_end();
            if let Some(inst) = self.open.pop().filter(|&i| i != 0) {
                self.closed_at[inst] = s.submitted;
            }
        }
    }
}

/// The submit records replayed on the host.
#[derive(Debug)]
pub(crate) struct Replay {
    /// The replayed graph; task `i` is device task `ids[i]`.
    pub(crate) graph: BuiltGraph,
    pub(crate) ids: Vec<u64>,
    /// Edges on which the device's wiring and the replay disagree, described.
    pub(crate) mismatches: Vec<String>,
}

/// Replays `records` (of a run of `run_id` on `block_dim` clusters whose callable registers
/// `kernels`) through the host tensor map; an error names the record the builder refused.
pub(crate) fn replay(
    records: &TrbDiagRecords,
    run_id: RunId,
    block_dim: u32,
    kernels: &[KernelArity],
) -> Result<Replay, String> {
    // The device checked each submit against the kernels' signatures; the records keep no
    // scalars to check again.
    let limits = BuildLimits {
        task_window: u32::MAX,
        heap_bytes: u64::MAX,
        block_dim,
        kernels,
        check_arity: false,
    };
    let mut env = ReplayEnv;
    let mut scratch = BuildScratch::default();
    let mut b = GraphBuilder::new(run_id, limits, &mut env, &[], &mut scratch);
    let mut ids: Vec<u64> = Vec::with_capacity(records.submits.len());
    let mut index: HashMap<u64, u32> = HashMap::new();
    let mut track = ScopeTrack { open: vec![0], closed_at: vec![u64::MAX] };
    let mut scope_of = Vec::with_capacity(records.submits.len());
    let mut scopes = records.scopes.iter().peekable();
    for (k, r) in records.submits.iter().enumerate() {
        while let Some(s) = scopes.next_if(|s| s.submitted <= k as u64) {
            track.apply(&mut b, s);
        }
        let n = (r.num_tensors as usize).min(r.tensors.len());
        let mut tensors = Vec::with_capacity(n);
        for (i, bytes) in r.tensors[..n].iter().enumerate() {
            let mut t = Tensor::from_bytes(bytes)
                .map_err(|e| format!("task {}: tensor {i} does not decode: {e}", r.task_id))?;
            // The builder names tasks by submit index: so are the creators of the buffers.
            let owner = index.get(&t.owner_task_id).copied().unwrap_or(k as u32);
            t.owner_task_id = DeviceTaskId::new(0, owner).0;
            tensors.push(t);
        }
        if b.submit(r.func_ids, r.shape, r.block_num, &tensors, &r.tags[..n], &[]) < 0 {
            return Err(format!("the replay refused task {}", task_name(r.task_id)));
        }
        index.insert(r.task_id, k as u32);
        ids.push(r.task_id);
        scope_of.push(*track.open.last().unwrap_or(&0));
    }
    for s in scopes {
        track.apply(&mut b, s);
    }
    let graph = b.finish().map_err(|e| format!("the replay failed: {e}"))?;
    let mismatches = compare(&graph, &ids, &records.submits, &scope_of, &track.closed_at);
    Ok(Replay { graph, ids, mismatches })
}

/// A device task id as `r<ring>:<local>`.
fn task_name(id: u64) -> String {
    format!("r{}:{}", id >> 32, id as u32)
}

/// The edges on which the device's wiring (each record's producers) and the replay disagree.
/// A replayed edge the device did not wire is a disagreement only while the producer's scope
/// was still open at the consumer's submit and the device did not list the producer as found
/// finished: once the scope closed, the producer may have finished and been retired, and a
/// finished producer needs no edge from a blind write or from an in-place update after its read;
/// in both cases the device rightly waits for nothing.
fn compare(
    g: &BuiltGraph,
    ids: &[u64],
    submits: &[SubmitRecord],
    scope_of: &[usize],
    closed_at: &[u64],
) -> Vec<String> {
    let mut out = Vec::new();
    for (i, (task, r)) in g.tasks.iter().zip(submits).enumerate() {
        let succ = task_name(ids[i]);
        let listed = (r.num_producers as usize).min(SUBMIT_RECORD_PRODUCERS);
        let (wired, finished): (Vec<u64>, Vec<u64>) =
            r.producers[..listed].iter().partition(|&&p| p & FINISHED_PRODUCER == 0);
        let finished: Vec<u64> = finished.iter().map(|&p| p & !FINISHED_PRODUCER).collect();
        let replayed: Vec<u64> = g.preds_of(task).iter().map(|&p| ids[p as usize]).collect();
        for &p in wired.iter().filter(|p| !replayed.contains(p)) {
            out.push(format!(
                "the device wired {} → {succ}; the replay has no such edge",
                task_name(p)
            ));
        }
        if r.num_producers as usize > listed {
            continue;
        }
        for (&p, &pi) in replayed.iter().zip(g.preds_of(task)) {
            let scope_open = closed_at[scope_of[pi as usize]] > i as u64;
            if scope_open && !wired.contains(&p) && !finished.contains(&p) {
                out.push(format!(
                    "the replay derives {} → {succ}; the device did not wire it",
                    task_name(p)
                ));
            }
        }
    }
    out
}

/// The scope lines and summary of `records` for a run whose report holds the high-water marks.
pub(crate) fn scope_stats(records: &TrbDiagRecords, report: &RunReport, fatal: bool) -> String {
    let lines: Vec<ScopeLine> = records
        .scopes
        .iter()
        .map(|s| ScopeLine {
            begin: s.begin != 0,
            depth: s.depth,
            ring: s.ring,
            tasks: s.task_window,
            heap: s.heap,
            deps: s.dep_pool,
            tensormap: u64::from(s.tensormap),
        })
        .collect();
    let summary = ScopeSummary {
        fatal,
        dropped: u64::from(records.scope_dropped),
        task_window_max: report.rings.map(|r| r.task_window_max),
        heap_max: report.rings.map(|r| r.heap_max),
        dep_pool_max: report.rings.map(|r| r.dep_pool_max),
        tensormap_max: report.tensormap_max,
    };
    crate::diag::scopes::jsonl(&summary, &lines)
}

#[cfg(test)]
mod tests {
    use simpler_types::{DataType, TensorArgType};

    use super::*;
    use crate::abi::image::{NO_FUNC, TaskShape};

    const FUNC: i32 = 3;

    fn buffer() -> Tensor {
        Tensor::external(1 << 20, &[256], DataType::Float32).unwrap()
    }

    /// A record of an AIV task `id` accessing `buffer()` under `tag`, wired to `producers`.
    fn submit(id: u64, depth: u32, tag: TensorArgType, producers: &[u64]) -> SubmitRecord {
        let mut r = SubmitRecord {
            task_id: id,
            scope_depth: depth,
            shape: TaskShape::Aiv as u32,
            func_ids: [NO_FUNC, FUNC, NO_FUNC],
            block_num: 1,
            num_tensors: 1,
            num_producers: producers.len() as u32,
            reserved: [0; 6],
            producers: [0; SUBMIT_RECORD_PRODUCERS],
            tags: [0; 16],
            tensors: [[0; 128]; 16],
        };
        r.producers[..producers.len()].copy_from_slice(producers);
        r.tags[0] = tag.as_i32();
        r.tensors[0] = buffer().to_bytes();
        r
    }

    fn scope(begin: bool, depth: u32, submitted: u64) -> ScopeRecord {
        ScopeRecord {
            begin: u32::from(begin),
            depth,
            ring: depth,
            submitted,
            ..ScopeRecord::default()
        }
    }

    fn replayed(records: &TrbDiagRecords) -> Replay {
        let kernels = [KernelArity { func_id: FUNC as u32, ..KernelArity::default() }];
        replay(records, RunId::FIRST, 1, &kernels).unwrap()
    }

    const W: u64 = 0; // ring 0, local 0
    const R: u64 = 1; // ring 0, local 1

    #[test]
    fn a_wiring_equal_to_the_replay_is_no_warning_and_keeps_the_device_ids() {
        let records = TrbDiagRecords {
            submits: vec![
                submit(W, 0, TensorArgType::Output, &[]),
                submit(R, 0, TensorArgType::Input, &[W]),
            ],
            ..TrbDiagRecords::default()
        };
        let r = replayed(&records);
        assert_eq!(r.mismatches, Vec::<String>::new());
        assert_eq!(r.ids, [W, R]);
        assert_eq!(r.graph.preds_of(&r.graph.tasks[1]), [0]);
    }

    #[test]
    fn an_edge_the_device_missed_while_the_producer_was_held_is_a_warning() {
        let records = TrbDiagRecords {
            submits: vec![
                submit(W, 0, TensorArgType::Output, &[]),
                submit(R, 0, TensorArgType::Input, &[]),
            ],
            ..TrbDiagRecords::default()
        };
        let r = replayed(&records);
        assert_eq!(r.mismatches.len(), 1, "{:?}", r.mismatches);
        assert!(r.mismatches[0].contains("r0:0 → r0:1"), "{:?}", r.mismatches);
    }

    #[test]
    fn an_edge_to_a_producer_whose_scope_closed_may_be_missing() {
        let id_r = 2 << 32; // the reader is in ring 0 after the writer's ring-1 scope closed
        let records = TrbDiagRecords {
            scopes: vec![scope(true, 1, 0), scope(false, 1, 1)],
            submits: vec![
                submit(1 << 32, 1, TensorArgType::Output, &[]),
                submit(id_r, 0, TensorArgType::Input, &[]),
            ],
            ..TrbDiagRecords::default()
        };
        let r = replayed(&records);
        assert_eq!(r.mismatches, Vec::<String>::new());
        assert_eq!(r.graph.preds_of(&r.graph.tasks[1]), [0], "the replay still derives the edge");
        assert_eq!(r.graph.tasks[0].scope_depth, 1);
    }

    #[test]
    fn an_edge_the_replay_does_not_derive_is_a_warning() {
        let records = TrbDiagRecords {
            submits: vec![
                submit(W, 0, TensorArgType::Input, &[]),
                submit(R, 0, TensorArgType::Input, &[W]),
            ],
            ..TrbDiagRecords::default()
        };
        let r = replayed(&records);
        assert_eq!(r.mismatches.len(), 1, "{:?}", r.mismatches);
        assert!(r.mismatches[0].contains("the device wired r0:0 → r0:1"), "{:?}", r.mismatches);
    }

    #[test]
    fn an_edge_to_a_producer_the_device_found_finished_is_no_warning() {
        // A blind write after a writer that already completed: the device lists it as found
        // finished and waits for nothing; the replay derives the edge. Listed as waited-for
        // instead, or not at all, the same edge is a difference.
        let as_finished = [W | FINISHED_PRODUCER];
        let cases: [(&[u64], usize); 3] = [(&as_finished, 0), (&[], 1), (&[W], 0)];
        for (listed, warnings) in cases {
            let records = TrbDiagRecords {
                submits: vec![
                    submit(W, 0, TensorArgType::Output, &[]),
                    submit(R, 0, TensorArgType::InOut, listed),
                ],
                ..TrbDiagRecords::default()
            };
            let r = replayed(&records);
            assert_eq!(r.mismatches.len(), warnings, "{listed:x?}: {:?}", r.mismatches);
        }
        let finished_only = TrbDiagRecords {
            submits: vec![
                submit(W, 0, TensorArgType::Output, &[]),
                submit(R, 0, TensorArgType::Output, &[W | FINISHED_PRODUCER]),
            ],
            ..TrbDiagRecords::default()
        };
        // A producer listed as finished is never read as one the device wired.
        assert_eq!(replayed(&finished_only).mismatches, Vec::<String>::new());
    }
}
