//! Swimlane traces (spec §7, second bullet).
//!
//! `l2_swimlane_records.json` keeps the raw 50 MHz counters; `swimlane.perfetto.json` is Chrome
//! Trace Event JSON for ui.perfetto.dev: one `X` event per (task, block) dispatch on one track
//! per core (`AIC<k>`/`AIV<k>`), AICPU thread phases from level 2, and flow arrows per
//! dependency edge when dep-gen is on.

use std::mem::{offset_of, size_of};

use serde_json::{Value, json};

use super::timing::ThreadPhases;
use super::{le_u32, le_u64};
use crate::abi::image::{
    AicpuRecord, SwimlaneHeader, SwimlaneRecord, aicpu_swimlane_block_bytes, swimlane_block_bytes,
};
use crate::abi::{COUNTER_HZ, CoreType, NS_PER_TICK, WorkerPlace};

/// What a run captured.
#[derive(Clone, Debug, Default)]
pub(crate) struct SwimlaneCapture {
    pub(crate) level: u32,
    pub(crate) block_dim: u32,
    pub(crate) threads: u32,
    /// `(worker, record)` in per-worker order.
    pub(crate) records: Vec<(u32, SwimlaneRecord)>,
    /// Records each worker could not store.
    pub(crate) dropped: Vec<u32>,
    /// `(AICPU thread, record)` from level 2.
    pub(crate) aicpu: Vec<(u32, AicpuRecord)>,
    pub(crate) phases: Vec<ThreadPhases>,
}

/// Parses the swimlane section (a host copy) of `num_aicore` workers.
pub(crate) fn parse(
    bytes: &[u8],
    num_aicore: u32,
    capacity: u32,
) -> (Vec<(u32, SwimlaneRecord)>, Vec<u32>) {
    let block = swimlane_block_bytes(capacity);
    let mut records = Vec::new();
    let mut dropped = Vec::new();
    for w in 0..num_aicore {
        let base = u64::from(w) * block;
        let count = le_u32(bytes, base + offset_of!(SwimlaneHeader, count) as u64).min(capacity);
        dropped.push(le_u32(bytes, base + offset_of!(SwimlaneHeader, dropped) as u64));
        for i in 0..u64::from(count) {
            let r =
                base + size_of::<SwimlaneHeader>() as u64 + i * size_of::<SwimlaneRecord>() as u64;
            records.push((
                w,
                SwimlaneRecord {
                    task_id: le_u64(bytes, r + offset_of!(SwimlaneRecord, task_id) as u64),
                    token: le_u32(bytes, r + offset_of!(SwimlaneRecord, token) as u64),
                    func_id: le_u32(bytes, r + offset_of!(SwimlaneRecord, func_id) as u64),
                    start: le_u64(bytes, r + offset_of!(SwimlaneRecord, start) as u64),
                    end: le_u64(bytes, r + offset_of!(SwimlaneRecord, end) as u64),
                    block_idx: le_u32(bytes, r + offset_of!(SwimlaneRecord, block_idx) as u64),
                    reserved: 0,
                },
            ));
        }
    }
    (records, dropped)
}

/// Parses the AICPU record section (a host copy) of `threads` threads.
pub(crate) fn parse_aicpu(bytes: &[u8], threads: u32, capacity: u32) -> Vec<(u32, AicpuRecord)> {
    let block = aicpu_swimlane_block_bytes(capacity);
    let mut out = Vec::new();
    for t in 0..threads {
        let base = u64::from(t) * block;
        let count = le_u32(bytes, base + offset_of!(SwimlaneHeader, count) as u64).min(capacity);
        for i in 0..u64::from(count) {
            let r = base + size_of::<SwimlaneHeader>() as u64 + i * size_of::<AicpuRecord>() as u64;
            out.push((
                t,
                AicpuRecord {
                    task_id: le_u64(bytes, r + offset_of!(AicpuRecord, task_id) as u64),
                    worker: le_u32(bytes, r + offset_of!(AicpuRecord, worker) as u64),
                    token: le_u32(bytes, r + offset_of!(AicpuRecord, token) as u64),
                    dispatch: le_u64(bytes, r + offset_of!(AicpuRecord, dispatch) as u64),
                    finish: le_u64(bytes, r + offset_of!(AicpuRecord, finish) as u64),
                },
            ));
        }
    }
    out
}

fn core_name(w: u32, block_dim: u32) -> String {
    match WorkerPlace::of(w, block_dim) {
        Some(p) if p.core_type == CoreType::Aic => format!("AIC{w}"),
        Some(_) => format!("AIV{}", w - block_dim),
        None => format!("core{w}"),
    }
}

/// `l2_swimlane_records.json`.
pub(crate) fn records_json(c: &SwimlaneCapture) -> Value {
    let num_cores = 3 * c.block_dim;
    let core_types: Vec<&str> = (0..num_cores)
        .map(|w| WorkerPlace::of(w, c.block_dim).map_or("?", |p| p.core_type.name()))
        .collect();
    let core_to_thread: Vec<u32> = (0..num_cores)
        .map(|w| WorkerPlace::of(w, c.block_dim).map_or(0, |p| p.cluster % c.threads.max(1)))
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
        },
        "aicore_tasks": aicore,
        "aicpu_tasks": c.aicpu.iter().map(|(t, r)| json!([t, r.task_id, r.worker, r.token, r.dispatch, r.finish])).collect::<Vec<_>>(),
        "phases": phases,
    })
}

/// `swimlane.perfetto.json`. `edges` are `(pred, succ)` device task ids for flow arrows.
pub(crate) fn perfetto_json(c: &SwimlaneCapture, edges: &[(u64, u64)]) -> Value {
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
            "name": format!("func {}", r.func_id),
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
        // One track per AICPU thread for its dispatches: token written → completion observed.
        for (t, r) in &c.aicpu {
            if r.finish >= r.dispatch && r.finish > 0 {
                events.push(json!({
                    "ph": "X", "pid": 3, "tid": t,
                    "name": format!("dispatch to {}", core_name(r.worker, c.block_dim)),
                    "ts": us(r.dispatch), "dur": us(r.finish) - us(r.dispatch),
                    "args": {"task_id": r.task_id, "worker": r.worker, "reg_token": r.token},
                }));
            }
        }
        if !c.aicpu.is_empty() {
            events.push(json!({"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "AICPU dispatch"}}));
            for t in 0..c.threads {
                events.push(json!({"ph": "M", "name": "thread_name", "pid": 3, "tid": t,
                                   "args": {"name": format!("AICPU{t} dispatch")}}));
            }
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
    json!({"displayTimeUnit": "ns", "traceEvents": events})
}
