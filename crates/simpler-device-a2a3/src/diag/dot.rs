//! `deps.dot`: the dependency graph of `deps.json` as Graphviz DOT, for people who would rather
//! look than read (`dot -Tsvg deps.dot -o deps.svg`).
//!
//! A node is a task, labelled with its index, core shape and kernel func ids; an edge goes from
//! producer to consumer, labelled with the consumer's argument, its tag, the tensor of
//! `deps.json` and how the dependency was found (tensor-map overlap, covered or partial, or a
//! `manual_dep` creator; creator edges are dashed).

use std::collections::BTreeMap;
use std::fmt::Write;

use simpler_types::TaskId;

use crate::runtime::hbg::builder::{BuiltGraph, EdgeSource, Overlap};

/// `deps.dot` of `g`; `origin` (the engine task one level up) titles the graph.
pub(crate) fn deps_dot(g: &BuiltGraph, origin: Option<TaskId>) -> String {
    // Tensor ids as `deps.json` numbers them: by first appearance of (address, version).
    let mut tensor_ids: BTreeMap<(u64, i32), usize> = BTreeMap::new();
    for t in g.tensors.iter().filter(|t| !t.is_null()) {
        let next = tensor_ids.len();
        tensor_ids.entry((t.addr, t.version)).or_insert(next);
    }
    let title = origin.map_or_else(|| "chip run".to_owned(), |t| format!("chip run of {t}"));
    let mut out = String::new();
    // Writing to a `String` cannot fail.
    let _ = writeln!(out, "digraph deps {{");
    let _ = writeln!(out, "  label=\"{title}\"; labelloc=t; rankdir=LR;");
    let _ = writeln!(out, "  node [shape=box, style=rounded, fontname=\"monospace\"];");
    let _ = writeln!(out, "  edge [fontname=\"monospace\", fontsize=10];");
    for (i, t) in g.tasks.iter().enumerate() {
        let kernels: Vec<String> =
            t.func_ids.iter().filter(|&&f| f >= 0).map(|f| f.to_string()).collect();
        let _ = writeln!(
            out,
            "  t{i} [label=\"task {i}\\n{} kernel {}\"];",
            t.shape.name(),
            if kernels.is_empty() { "-".to_owned() } else { kernels.join(",") }
        );
    }
    for e in &g.edges {
        let arg = g.tasks.get(e.succ as usize).map(|t| t.tensors.start + e.arg as usize);
        let tensor = arg.and_then(|i| g.tensors.get(i));
        let tag = arg.and_then(|i| g.tags.get(i)).map_or("?", |t| t.name());
        let id = tensor
            .and_then(|t| tensor_ids.get(&(e.buffer, t.version)))
            .map_or_else(|| "?".to_owned(), |id| format!("tensor {id}"));
        let (kind, style) = match (e.source, e.overlap) {
            (EdgeSource::Creator, _) => ("creator", "dashed"),
            (EdgeSource::Tensormap, Overlap::Covered) => ("covered", "solid"),
            (EdgeSource::Tensormap, Overlap::Partial) => ("partial", "solid"),
        };
        let _ = writeln!(
            out,
            "  t{} -> t{} [label=\"arg {} {tag}\\n{id} {kind}\", style={style}];",
            e.pred, e.succ, e.arg
        );
    }
    out.push_str("}\n");
    out
}
