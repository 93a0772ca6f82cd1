//! `scope_stats/scope_stats.jsonl` (`docs/device-chip.md`).
//!
//! Line 1 is the run's summary (high-water marks per ring, records dropped); then one line per
//! scope begin or end with the usage of the scope's ring at its begin (`*_start`) and at this
//! event (`*_end`). host_build_graph keeps the whole graph resident in ring 0, so its usage is
//! the task count and heap bytes so far, with the graph's totals for the dependency pool and the
//! tensor map; tensormap_and_ringbuffer records the live usage on the device.

use serde_json::json;

use crate::runtime::hbg::builder::BuiltGraph;

/// One scope begin or end and its ring's usage at that moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ScopeLine {
    pub(crate) begin: bool,
    pub(crate) depth: u32,
    pub(crate) ring: u32,
    pub(crate) tasks: u64,
    pub(crate) heap: u64,
    pub(crate) deps: u64,
    pub(crate) tensormap: u64,
}

/// The summary line's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ScopeSummary {
    /// The run failed.
    pub(crate) fatal: bool,
    /// Scope events that did not fit the device's record buffer.
    pub(crate) dropped: u64,
    pub(crate) task_window_max: [u64; 4],
    pub(crate) heap_max: [u64; 4],
    pub(crate) dep_pool_max: [u64; 4],
    pub(crate) tensormap_max: u64,
}

/// The file's lines.
pub(crate) fn jsonl(summary: &ScopeSummary, lines: &[ScopeLine]) -> String {
    let mut out = json!({
        "version": 1,
        "fatal": summary.fatal,
        "dropped": summary.dropped,
        "total": lines.len() as u64 + summary.dropped,
        "task_window_max": summary.task_window_max,
        "heap_max": summary.heap_max,
        "dep_pool_max": summary.dep_pool_max,
        "tensormap_max": summary.tensormap_max,
    })
    .to_string();
    out.push('\n');
    // Pair each end with its begin to report start and end usage on one line per event.
    let mut open: Vec<ScopeLine> = Vec::new();
    for (site, ev) in lines.iter().enumerate() {
        let start = if ev.begin {
            open.push(*ev);
            *ev
        } else {
            open.pop().unwrap_or(*ev)
        };
        let line = json!({
            "site": site,
            "phase": if ev.begin { "begin" } else { "end" },
            "depth": ev.depth,
            "ring": ev.ring,
            "task_window_start": start.tasks,
            "task_window_end": ev.tasks,
            "heap_start": start.heap,
            "heap_end": ev.heap,
            "dep_pool_start": start.deps,
            "dep_pool_end": ev.deps,
            "tensormap": ev.tensormap,
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

/// The file of a host_build_graph graph.
pub(crate) fn scope_stats_jsonl(g: &BuiltGraph) -> String {
    let edges = g.edge_count() as u64;
    let tensors = g.tensors.len() as u64;
    let summary = ScopeSummary {
        task_window_max: [g.tasks.len() as u64, 0, 0, 0],
        heap_max: [g.heap_used, 0, 0, 0],
        dep_pool_max: [edges, 0, 0, 0],
        tensormap_max: tensors,
        ..ScopeSummary::default()
    };
    let lines: Vec<ScopeLine> = g
        .scopes
        .iter()
        .map(|ev| ScopeLine {
            begin: ev.begin,
            depth: ev.depth,
            ring: 0,
            tasks: ev.tasks,
            heap: ev.heap,
            deps: edges,
            tensormap: tensors,
        })
        .collect();
    jsonl(&summary, &lines)
}
