//! Readers of the diagnostics files shared by the conformance suites of both runtimes.

use std::collections::BTreeSet;
use std::path::Path;

use simpler_device_a2a3::{
    ArgDirection, ChipCallable, Kernels, OrchArgs, OrchConfig, OrchCtx, OrchError,
};
use simpler_tensormap::{ByteSpan, TensorKey, TensorMap};
use simpler_types::{CoreArgs, SlotId};

use super::{FUNC_NOOP, noop_core};

/// Two nested scopes around one 3-block task on tensor 0.
pub fn scoped_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let t = *args.tensor(0).unwrap();
    ctx.scope(|ctx| {
        ctx.scope(|ctx| {
            let mut a = CoreArgs::new();
            a.add_inout(t).unwrap();
            ctx.submit_blocks(Kernels::Aiv(FUNC_NOOP), &a, 3)
        })
    })???;
    Ok(())
}

/// `scoped_orch` with the no-op kernel, taking one tensor.
pub fn scoped_callable() -> ChipCallable {
    ChipCallable::native(scoped_orch, |_| OrchConfig { expected_arg_count: 1 })
        .kernel(FUNC_NOOP, noop_core(vec![ArgDirection::InOut]))
        .build()
        .unwrap()
}

pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The Perfetto complete ("X") events of one process track.
pub fn x_events(perfetto: &serde_json::Value, pid: u64) -> Vec<&serde_json::Value> {
    perfetto["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == pid)
        .collect()
}

/// Every file under `dir`, relative to it.
pub fn files_under(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.insert(p.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// The (pred, succ) task ids `deps.json` says were wired.
pub fn wired_edges(deps: &serde_json::Value) -> BTreeSet<(u64, u64)> {
    deps["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["pred"].as_str().unwrap().parse().unwrap(),
                e["succ"].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

/// The (pred, succ) task ids a replay of `deps.json`'s own task records through the host tensor
/// map derives (reads after writes; every buffer is one key, as the records carry byte ranges).
pub fn replayed_edges(deps: &serde_json::Value) -> BTreeSet<(u64, u64)> {
    let run = simpler_types::RunId::FIRST;
    let map = TensorMap::new();
    let tasks = deps["tasks"].as_array().unwrap();
    let ids: Vec<u64> =
        tasks.iter().map(|t| t["task_id"].as_str().unwrap().parse().unwrap()).collect();
    let key = TensorKey::Host { addr: 0 };
    let mut replayed = BTreeSet::new();
    for (i, task) in tasks.iter().enumerate() {
        let mut writes = Vec::new();
        for arg in task["args"].as_array().unwrap() {
            let range = arg["range"].as_array().unwrap();
            let span = ByteSpan::new(
                range[0].as_str().unwrap().parse().unwrap(),
                range[1].as_str().unwrap().parse().unwrap(),
            )
            .unwrap();
            let tag = arg["tag"].as_str().unwrap();
            if tag == "INPUT" || tag == "INOUT" {
                map.lookup_overlapping(run, &key, span, |p| {
                    replayed.insert((ids[p.index as usize], ids[i]));
                });
            }
            if tag != "INPUT" && tag != "NO_DEP" {
                writes.push(span);
            }
        }
        for w in writes {
            map.insert(run, key, w, SlotId::new(i as u32, 1));
        }
    }
    replayed
}

/// The lines of a run's `scope_stats/scope_stats.jsonl` under `dir`.
pub fn scope_stats(dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("scope_stats/scope_stats.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}
