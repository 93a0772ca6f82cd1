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
