//! `deps.json` (`docs/device-chip.md`): the dependency graph of a run.
//!
//! host_build_graph derives its edges on the host through the tensor map, so the file is
//! written from the builder's records. tensormap_and_ringbuffer wires its edges on the device;
//! its submit records are replayed on the host through the same builder (`runtime::trb::replay`)
//! and the file is written from that replay. u64 values are strings, as the format requires.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use simpler_types::TaskId;

use super::origin_json;

use crate::runtime::hbg::builder::{BuiltGraph, EdgeSource, Overlap};

/// `deps.json` of `g`, whose task `i` has device task id `ids(i)`; `complete` is false when
/// the run did not finish (or records were lost); `origin` is the engine task one level up that
/// started the run.
pub(crate) fn deps_json(
    g: &BuiltGraph,
    ids: &dyn Fn(u32) -> u64,
    complete: bool,
    origin: Option<TaskId>,
) -> Value {
    let mut tensor_ids: BTreeMap<(u64, i32), usize> = BTreeMap::new();
    let mut tensors = Vec::new();
    for t in &g.tensors {
        if t.is_null() {
            continue;
        }
        let key = (t.addr, t.version);
        if let std::collections::btree_map::Entry::Vacant(v) = tensor_ids.entry(key) {
            let id = tensors.len();
            v.insert(id);
            tensors.push(json!({
                "tensor_id": id.to_string(),
                "buffer_addr": t.addr.to_string(),
                "version": t.version,
                "dtype": t.data_type().map_or("UNKNOWN", |d| d.name()),
                "numel": t.numel().to_string(),
            }));
        }
    }
    let tasks: Vec<Value> = g
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let args: Vec<Value> = g.tensors[t.tensors.clone()]
                .iter()
                .zip(&g.tags[t.tensors.clone()])
                .map(|(tensor, tag)| {
                    let span = tensor.byte_span().map(|(s, e)| json!([s.to_string(), e.to_string()]));
                    json!({"tag": tag.name(), "range": span, "version": tensor.version,
                           "tensor_id": tensor_ids.get(&(tensor.addr, tensor.version)).map(|id| id.to_string())})
                })
                .collect();
            json!({
                "task_id": ids(i as u32).to_string(),
                "scope": t.scope_depth,
                "kernel_ids": t.func_ids,
                "shape": t.shape.name(),
                "block_num": t.block_num,
                "args": args,
            })
        })
        .collect();
    let edges: Vec<Value> = g
        .edges
        .iter()
        .map(|e| {
            let version = g.tasks.get(e.succ as usize).and_then(|t| g.tensors.get(t.tensors.start + e.arg as usize)).map_or(0, |t| t.version);
            json!({
                "pred": ids(e.pred).to_string(),
                "succ": ids(e.succ).to_string(),
                "arg": e.arg,
                "source": match e.source { EdgeSource::Tensormap => "tensormap", EdgeSource::Creator => "creator" },
                "overlap": match e.overlap { Overlap::Covered => "covered", Overlap::Partial => "partial" },
                "tensor_id": tensor_ids.get(&(e.buffer, version)).map(|id| id.to_string()),
            })
        })
        .collect();
    json!({"version": 1, "complete": complete, "origin": origin_json(origin), "tasks": tasks,
           "tensors": tensors, "edges": edges})
}
