//! The tensormap_and_ringbuffer diagnostics beyond the conformance item: the dependency graph
//! of a graph that streams through reclaimed rings, and records that do not fit the device's
//! fixed buffers, which are counted and reported, never lost silently.

mod common;

use common::*;
use simpler_device_a2a3::programs::streaming;
use simpler_device_a2a3::{DeviceRunner, RingDefaults, RunReport, RunRequest, RuntimeVariant};
use simpler_types::{CallConfig, SwimlaneLevel};

/// Lanes of the streaming output.
const LANES: usize = 64;

fn small_rings() -> DeviceRunner {
    let mut o = options_on(0, RuntimeVariant::TensormapAndRingbuffer);
    o.rings = RingDefaults { task_window: 256, heap_bytes: 256 << 10, dep_pool: 1024 };
    DeviceRunner::attach(o).unwrap()
}

/// One streaming run of `tasks` tasks in chains of `chain_len` with `cfg`, checked against
/// the reference.
fn stream(r: &mut DeviceRunner, tasks: u64, chain_len: u64, cfg: &CallConfig) -> RunReport {
    let slot = r.register_callable(&streaming::callable().unwrap()).unwrap();
    let (p, lanes) = upload_f32(r, &[0.0; LANES]);
    let args = streaming::run_args(lanes, tasks, chain_len).unwrap();
    let rep = r.run(&RunRequest::new(run_id(1), slot, &args, cfg)).unwrap();
    assert_eq!(download_f32(r, p, LANES), streaming::reference(tasks, chain_len, LANES));
    r.free(p).unwrap();
    r.unregister_callable(slot).unwrap();
    rep
}

fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn edges(deps: &serde_json::Value) -> Vec<(u64, u64)> {
    let id = |v: &serde_json::Value| v.as_str().unwrap().parse::<u64>().unwrap();
    deps["edges"].as_array().unwrap().iter().map(|e| (id(&e["pred"]), id(&e["succ"]))).collect()
}

#[test]
fn dep_gen_of_a_graph_streaming_through_reclaimed_rings_agrees_with_the_device_wiring() {
    // 1 500 tasks in chains of 10 through a 256-slot window: scopes close and their tasks are
    // reclaimed while later chains are submitted, so the device does not wire edges to
    // producers it already retired, which the replay derives and must not call a difference.
    let dir = temp_dir("trb-stream-deps");
    let mut r = small_rings();
    let cfg = CallConfig::builder().dep_gen(true).output_prefix(&dir).build().unwrap();
    let rep = stream(&mut r, 1500, 10, &cfg);
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    let deps = json(&dir.join("deps.json"));
    assert_eq!(deps["complete"], true);
    assert_eq!(deps["tasks"].as_array().unwrap().len(), 1500);
    let edges = edges(&deps);
    // Each chain of ten is nine edges between consecutive tasks of its scope, at least.
    assert!(edges.len() >= 150 * 9, "{} edges", edges.len());
    // Every edge runs forward in submit order (ids are per ring; compare submit positions).
    let order: std::collections::HashMap<u64, usize> = deps["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, t)| (t["task_id"].as_str().unwrap().parse().unwrap(), i))
        .collect();
    assert!(edges.iter().all(|(p, s)| order[p] < order[s]));
    r.finalize().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn submits_beyond_the_record_buffer_are_counted_and_the_graph_is_marked_incomplete() {
    let dir = temp_dir("trb-deps-dropped");
    let mut r = small_rings();
    let cfg = CallConfig::builder().dep_gen(true).output_prefix(&dir).build().unwrap();
    let rep = stream(&mut r, 2148, 1, &cfg);
    let warned = rep.warnings.iter().any(|w| w.contains("dep_gen: 100 submits did not fit"));
    assert!(warned, "{:?}", rep.warnings);
    let deps = json(&dir.join("deps.json"));
    assert_eq!(deps["complete"], false);
    assert_eq!(deps["tasks"].as_array().unwrap().len(), 2048);
    r.finalize().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn swimlane_records_beyond_a_cores_buffer_are_counted_as_dropped() {
    // One cluster: 10 000 single-dispatch tasks on its two AIV cores overflow their 4 096
    // records each.
    let dir = temp_dir("trb-swimlane-dropped");
    let mut r = small_rings();
    let cfg = CallConfig::builder()
        .block_dim(1)
        .swimlane(SwimlaneLevel::AicoreTiming)
        .output_prefix(&dir)
        .build()
        .unwrap();
    let rep = stream(&mut r, 10_000, 1, &cfg);
    let records = json(&dir.join("l2_swimlane_records.json"));
    let kept = records["aicore_tasks"].as_array().unwrap().len() as u64;
    let dropped: u64 = records["metadata"]["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .sum();
    assert!(dropped > 0);
    assert_eq!(rep.swimlane_dropped, dropped);
    assert_eq!(kept + dropped, 10_000, "every dispatch is either recorded or counted");
    r.finalize().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
