//! End-to-end runs of host_build_graph on the simulated chip.

mod common;

use common::*;
use simpler_device_a2a3::{ChipSlot, DeviceRunner, RunRequest};
use simpler_types::{CallConfig, RunId, TaskArgs};

fn vector_run(
    r: &mut DeviceRunner,
    slot: ChipSlot,
    run: u64,
    n: usize,
    cfg: &CallConfig,
) -> Vec<f32> {
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 3.0 - i as f32).collect();
    let (pa, ta) = upload_f32(r, &a);
    let (pb, tb) = upload_f32(r, &b);
    let (pf, tf) = upload_f32(r, &vec![0.0; n]);
    let mut args = TaskArgs::new();
    args.add_input(ta).unwrap().add_input(tb).unwrap().add_output(tf).unwrap();
    let req = RunRequest::new(RunId::from_raw(run).unwrap(), slot, &args, cfg);
    r.run(&req).unwrap();
    let f = download_f32(r, pf, n);
    for p in [pa, pb, pf] {
        r.free(p).unwrap();
    }
    for i in 0..n {
        let s = a[i] + b[i];
        let want = (s + 1.0) * (s + 2.0) + s;
        assert_eq!(f[i], want, "element {i}");
    }
    f
}

#[test]
fn vector_example_matches_the_host_computation() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    vector_run(&mut r, slot, 1, 16384, &CallConfig::default());
    r.finalize().unwrap();
}

#[test]
fn vector_example_passes_for_every_block_dim_and_thread_count() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let mut run = 1;
    for block_dim in 1..=3 {
        for threads in 2..=4 {
            let cfg = CallConfig::builder()
                .block_dim(block_dim)
                .aicpu_thread_num(threads)
                .build()
                .unwrap();
            vector_run(&mut r, slot, run, 128 * 128, &cfg);
            run += 1;
        }
    }
    r.finalize().unwrap();
}

/// `deps.dot` beside `deps.json` has one labelled node per task and one labelled edge per
/// dependency of the JSON file.
#[test]
fn the_dependency_graph_is_also_written_as_graphviz_dot() {
    let dir = std::env::temp_dir().join(format!("simpler-deps-dot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut r =
        DeviceRunner::attach(options_on(0, simpler_device_a2a3::RuntimeVariant::HostBuildGraph))
            .unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let cfg = CallConfig::builder().dep_gen(true).output_prefix(&dir).build().unwrap();
    vector_run(&mut r, slot, 1, 256, &cfg);
    r.finalize().unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("deps.json")).unwrap()).unwrap();
    let dot = std::fs::read_to_string(dir.join("deps.dot")).unwrap();
    assert!(dot.starts_with("digraph deps {") && dot.trim_end().ends_with('}'), "{dot}");
    let nodes = dot.lines().filter(|l| l.contains("[label=\"task#")).count();
    let edges: Vec<&str> = dot.lines().filter(|l| l.contains(" -> ")).collect();
    assert_eq!(nodes, json["tasks"].as_array().unwrap().len());
    assert_eq!(edges.len(), json["edges"].as_array().unwrap().len());
    assert_eq!(nodes, 5, "the vector example has five tasks");
    // Tasks are labelled with their core and kernel name, not with func ids.
    assert!(dot.contains("[label=\"task#0\\nAIV add\"]"), "{dot}");
    assert!(dot.contains("[label=\"task#1\\nAIV add_scalar\"]"), "{dot}");
    assert!(dot.contains("[label=\"task#3\\nAIV mul\"]"), "{dot}");
    // c = a + b feeds d = c + 1: an edge from task 0 into task 1's input, tensor-map covered.
    assert!(
        edges
            .iter()
            .any(|e| e.starts_with("  t0 -> t1 ") && e.contains("INPUT") && e.contains("covered")),
        "{dot}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
