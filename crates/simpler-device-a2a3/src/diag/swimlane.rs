//! Swimlane traces (`docs/device-chip.md`).
//!
//! `l2_swimlane_records.json` keeps the raw 50 MHz counters; `swimlane.perfetto.json` is Chrome
//! Trace Event JSON for ui.perfetto.dev: one `X` event per (task, block) dispatch on one track
//! per core (`AIC<k>`/`AIV<k>`), AICPU thread phases and dispatches from level 2, the trb
//! orchestration's submit spans from level 4, and flow arrows per dependency edge when dep-gen
//! is on.

use serde_json::{Value, json};
use simpler_types::TaskId;

use super::origin_json;
use super::timing::ThreadPhases;
use crate::abi::image::{AicpuRecord, SwimlaneRecord};
use crate::abi::{COUNTER_HZ, CorePlace, CoreType, NS_PER_TICK};
use crate::aicpu::trace::SUBMIT_SPAN_CORE;
use crate::aicpu::view::HostImageView;

/// What a run captured.
#[derive(Clone, Debug, Default)]
pub(crate) struct SwimlaneCapture {
    pub(crate) level: u32,
    pub(crate) block_dim: u32,
    pub(crate) threads: u32,
    /// `(core, record)` in per-core order.
    pub(crate) records: Vec<(u32, SwimlaneRecord)>,
    /// Records each core could not store.
    pub(crate) dropped: Vec<u32>,
    /// `(AICPU thread, record)` from level 2.
    pub(crate) aicpu: Vec<(u32, AicpuRecord)>,
    /// AICPU records the threads could not store.
    pub(crate) aicpu_dropped: u32,
    pub(crate) phases: Vec<ThreadPhases>,
}

impl SwimlaneCapture {
    /// Reads what the image's swimlane sections captured; `level` is the run's swimlane level.
    pub(crate) fn read(image: &HostImageView<'_>, level: u32, threads: u32) -> SwimlaneCapture {
        let h = image.header();
        let mut records = Vec::new();
        let mut dropped = Vec::new();
        for c in 0..h.num_aicore {
            let (r, d) = image.swimlane_records(c);
            records.extend(r.map(|r| (c, r)));
            dropped.push(d);
        }
        let aicpu =
            (0..threads).flat_map(|t| image.aicpu_records(t).map(move |r| (t, r))).collect();
        SwimlaneCapture {
            level,
            block_dim: h.block_dim,
            threads,
            records,
            dropped,
            aicpu,
            aicpu_dropped: (0..threads).map(|t| image.aicpu_dropped(t)).sum(),
            phases: super::timing::phases(image, threads),
        }
    }

    /// Every record a core or an AICPU thread could not store.
    pub(crate) fn total_dropped(&self) -> u64 {
        self.dropped.iter().map(|&d| u64::from(d)).sum::<u64>() + u64::from(self.aicpu_dropped)
    }
}

fn core_name(w: u32, block_dim: u32) -> String {
    match CorePlace::of(w, block_dim) {
        Some(p) if p.core_type == CoreType::Aic => format!("AIC{w}"),
        Some(_) => format!("AIV{}", w - block_dim),
        None => format!("core{w}"),
    }
}

/// `l2_swimlane_records.json`.
pub(crate) fn records_json(c: &SwimlaneCapture) -> Value {
    let num_cores = 3 * c.block_dim;
    let core_types: Vec<&str> = (0..num_cores)
        .map(|w| CorePlace::of(w, c.block_dim).map_or("?", |p| p.core_type.name()))
        .collect();
    let core_to_thread: Vec<u32> = (0..num_cores)
        .map(|w| CorePlace::of(w, c.block_dim).map_or(0, |p| p.cluster % c.threads.max(1)))
        .collect();
    let aicore: Vec<Value> = c
        .records
        .iter()
        .map(|(w, r)| json!([w, r.task_id, r.token, r.func_id, r.start, r.end]))
        .collect();
    let phases: Vec<Value> = c
        .phases
        .iter()
        .enumerate()
        .map(|(t, p)| {
            json!({"thread": t, "start": p.start, "orchestration_end": p.orchestration_end,
                   "handshake_end": p.handshake_end, "scheduling_end": p.scheduling_end,
                   "end": p.end, "tasks_completed": p.tasks_completed})
        })
        .collect();
    json!({
        "version": 1,
        "level": c.level,
        "metadata": {
            "clock_freq_hz": COUNTER_HZ,
            "num_cores": num_cores,
            "core_types": core_types,
            "core_to_thread": core_to_thread,
            "dropped": c.dropped,
            "aicpu_dropped": c.aicpu_dropped,
        },
        "aicore_tasks": aicore,
        "aicpu_tasks": c.aicpu.iter().map(|(t, r)| json!([t, r.task_id, r.core, r.token, r.dispatch, r.finish])).collect::<Vec<_>>(),
        "phases": phases,
    })
}

/// Writes both swimlane files of a run (`l2_swimlane_records.json`, `swimlane.perfetto.json`)
/// through `out`; `edges` and `names` as for [`perfetto_json`].
pub(crate) fn export(
    out: &mut super::Exporter<'_>,
    c: &SwimlaneCapture,
    edges: &[(u64, u64)],
    names: &crate::diag::dot::KernelNames,
) {
    out.write("l2_swimlane_records.json", records_json(c).to_string().as_bytes());
    let perfetto = perfetto_json(c, edges, names, out.origin()).to_string();
    out.write("swimlane.perfetto.json", perfetto.as_bytes());
}

/// `swimlane.perfetto.json`. `edges` are `(pred, succ)` device task ids for flow arrows; a
/// kernel's slices are named by `names` (its func id when it has no name); `origin` (the engine
/// task that started the run) goes into the trace metadata.
pub(crate) fn perfetto_json(
    c: &SwimlaneCapture,
    edges: &[(u64, u64)],
    names: &crate::diag::dot::KernelNames,
    origin: Option<TaskId>,
) -> Value {
    let t0 = c
        .records
        .iter()
        .map(|(_, r)| r.start)
        .chain(c.phases.iter().map(|p| p.start).filter(|&s| s > 0))
        .min()
        .unwrap_or(0);
    let us = |t: u64| t.saturating_sub(t0) as f64 * NS_PER_TICK as f64 / 1000.0;
    let mut events =
        vec![json!({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "AICore"}})];
    for w in 0..3 * c.block_dim {
        events.push(json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": w,
                           "args": {"name": core_name(w, c.block_dim)}}));
    }
    for (w, r) in &c.records {
        events.push(json!({
            "ph": "X", "pid": 1, "tid": w,
            "name": i32::try_from(r.func_id).ok().and_then(|f| names.get(&f)).cloned()
                .unwrap_or_else(|| format!("func {}", r.func_id)),
            "ts": us(r.start), "dur": us(r.end) - us(r.start),
            "args": {"task_id": r.task_id, "func_id": r.func_id, "block_idx": r.block_idx, "reg_token": r.token},
        }));
    }
    if c.level >= 2 {
        events
            .push(json!({"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "AICPU"}}));
        for (t, p) in c.phases.iter().enumerate() {
            events.push(json!({"ph": "M", "name": "thread_name", "pid": 2, "tid": t,
                               "args": {"name": format!("AICPU{t}")}}));
            let spans = [
                ("boot", p.start, p.orchestration_end),
                ("handshake", p.orchestration_end, p.handshake_end),
                ("scheduling", p.handshake_end, p.scheduling_end),
                ("shutdown", p.scheduling_end, p.end),
            ];
            for (name, s, e) in spans {
                if s > 0 && e >= s {
                    events.push(json!({"ph": "X", "pid": 2, "tid": t, "name": name,
                                       "ts": us(s), "dur": us(e) - us(s)}));
                }
            }
        }
        // One track per AICPU thread for its dispatches (token written → completion observed),
        // and the trb orchestration thread's submit spans (level 4) in a process of their own.
        for (t, r) in &c.aicpu {
            if r.finish >= r.dispatch && r.finish > 0 {
                let (pid, name) = if r.core == SUBMIT_SPAN_CORE {
                    (4, "submit".to_owned())
                } else {
                    (3, format!("dispatch to {}", core_name(r.core, c.block_dim)))
                };
                events.push(json!({
                    "ph": "X", "pid": pid, "tid": t, "name": name,
                    "ts": us(r.dispatch), "dur": us(r.finish) - us(r.dispatch),
                    "args": {"task_id": r.task_id, "core": r.core, "reg_token": r.token},
                }));
            }
        }
        let (spans, dispatches): (Vec<_>, Vec<_>) =
            c.aicpu.iter().partition(|(_, r)| r.core == SUBMIT_SPAN_CORE);
        if !dispatches.is_empty() {
            events.push(json!({"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "AICPU dispatch"}}));
            for t in 0..c.threads {
                events.push(json!({"ph": "M", "name": "thread_name", "pid": 3, "tid": t,
                                   "args": {"name": format!("AICPU{t} dispatch")}}));
            }
        }
        if let Some((t, _)) = spans.first() {
            events.push(json!({"ph": "M", "name": "process_name", "pid": 4, "args": {"name": "AICPU orchestration"}}));
            events.push(json!({"ph": "M", "name": "thread_name", "pid": 4, "tid": t,
                               "args": {"name": format!("AICPU{t} submits")}}));
        }
    }
    // Flow arrows: from the last dispatch of the producer to the first of the consumer.
    for (n, (pred, succ)) in edges.iter().enumerate() {
        let from = c.records.iter().filter(|(_, r)| r.task_id == *pred).max_by_key(|(_, r)| r.end);
        let to = c.records.iter().filter(|(_, r)| r.task_id == *succ).min_by_key(|(_, r)| r.start);
        if let (Some((wf, rf)), Some((wt, rt))) = (from, to) {
            events.push(json!({"ph": "s", "id": n, "pid": 1, "tid": wf, "name": "dep", "cat": "dep", "ts": us(rf.end)}));
            events.push(json!({"ph": "f", "bp": "e", "id": n, "pid": 1, "tid": wt, "name": "dep", "cat": "dep", "ts": us(rt.start)}));
        }
    }
    json!({
        "displayTimeUnit": "ns",
        "metadata": {"origin": origin_json(origin)},
        "traceEvents": events,
    })
}
