//! `deps.dot`: the dependency graph of `deps.json` as Graphviz DOT, for people who would rather
//! look than read (`dot -Tsvg deps.dot -o deps.svg`).
//!
//! A node is a task, labelled with its reference (`task#3`) and, per core it runs on, the core
//! and the kernel's name (`AIV add`; `func 2` for a kernel registered without a name); an edge
//! goes from producer to consumer, labelled with the consumer's argument, its tag, the tensor
//! of `deps.json` and how the dependency was found (tensor-map overlap, covered or partial, or
//! a `manual_dep` creator; creator edges are dashed).

use std::collections::BTreeMap;
use std::fmt::Write;

use simpler_types::TaskId;

use crate::abi::image::TaskShape;
use crate::callable::CoreCallable;
use crate::runtime::hbg::builder::{BuiltGraph, EdgeSource, Overlap};

/// Names of a callable's named kernels, by func id.
pub(crate) type KernelNames = BTreeMap<i32, String>;

/// The names of the named kernels among `kernels` (a chip callable's children).
pub(crate) fn kernel_names(kernels: &[(u32, CoreCallable)]) -> KernelNames {
    kernels
        .iter()
        .filter_map(|(id, k)| Some((i32::try_from(*id).ok()?, k.name()?.to_owned())))
        .collect()
}

/// The core a task's kernel slot runs on: AIC, AIV0, AIV1 for a mix task.
fn core_of(shape: TaskShape, slot: usize) -> &'static str {
    match (shape, slot) {
        (TaskShape::Mix, 0) => "AIC",
        (TaskShape::Mix, 1) => "AIV0",
        (TaskShape::Mix, _) => "AIV1",
        (other, _) => other.name(),
    }
}

/// Escapes `text` for a quoted DOT string.
fn quoted(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

/// `deps.dot` of `g`, its kernels named by `names`; `origin` (the engine task one level up)
/// titles the graph.
pub(crate) fn deps_dot(g: &BuiltGraph, names: &KernelNames, origin: Option<TaskId>) -> String {
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
        let mut label = format!("task#{i}");
        for (slot, &f) in t.func_ids.iter().enumerate().filter(|&(_, &f)| f >= 0) {
            let kernel = names.get(&f).map_or_else(|| format!("func {f}"), |n| quoted(n));
            let _ = write!(label, "\\n{} {kernel}", core_of(t.shape, slot));
        }
        if t.func_ids.iter().all(|&f| f < 0) {
            label.push_str("\\n(no kernel)");
        }
        let _ = writeln!(out, "  t{i} [label=\"{label}\"];");
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
