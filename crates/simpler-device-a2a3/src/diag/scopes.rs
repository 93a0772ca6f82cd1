//! `scope_stats/scope_stats.jsonl` (`docs/device-chip.md`).
//!
//! host_build_graph keeps the whole graph resident in ring 0, so a scope's usage is the task
//! count and heap bytes at its begin and end; dep-pool and tensor-map figures are reported as
//! the graph totals.

use serde_json::json;

use crate::runtime::hbg::builder::BuiltGraph;

/// The file's lines.
pub(crate) fn scope_stats_jsonl(g: &BuiltGraph) -> String {
    let tasks = g.tasks.len() as u64;
    let edges = g.edge_count as u64;
    let mut out = json!({
        "version": 1,
        "fatal": false,
        "dropped": 0,
        "total": g.scopes.len(),
        "task_window_max": [tasks, 0, 0, 0],
        "heap_max": [g.heap_used, 0, 0, 0],
        "dep_pool_max": [edges, 0, 0, 0],
        "tensormap_max": g.tensors.len(),
    })
    .to_string();
    out.push('\n');
    // Pair each end with its begin to report start and end usage on one line per event.
    let mut open: Vec<(u64, u64)> = Vec::new();
    for (site, ev) in g.scopes.iter().enumerate() {
        let (tw_start, heap_start) = if ev.begin {
            open.push((ev.tasks, ev.heap));
            (ev.tasks, ev.heap)
        } else {
            open.pop().unwrap_or((ev.tasks, ev.heap))
        };
        let line = json!({
            "site": site,
            "phase": if ev.begin { "begin" } else { "end" },
            "depth": ev.depth,
            "ring": 0,
            "task_window_start": tw_start,
            "task_window_end": ev.tasks,
            "heap_start": heap_start,
            "heap_end": ev.heap,
            "dep_pool_start": 0,
            "dep_pool_end": edges,
            "tensormap": g.tensors.len(),
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}
