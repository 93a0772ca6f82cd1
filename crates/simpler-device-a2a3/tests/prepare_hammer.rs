//! Preparation against an executing run, hammered (`docs/pipelining.md`, "Resource slots and
//! run handles"): several runners on their own threads each prepare run N+1 while run N
//! executes (held on the device by a kernel delay), while handles of other prepared runs are
//! dropped on other threads. Every run must compute with its own tensors: its output is zeroed right before its
//! launch, so a preparation that wrote anything the executing run reads (its image, its kernel
//! arguments) would make that run compute the other run's tensors and leave its own output
//! zero. `SIMPLER_SOAK_CYCLES` sets the runs per thread (default 60).

mod common;

use std::time::Duration;

use common::*;
use simpler_device_a2a3::{DeviceRunner, Overlap, RunRequest};
use simpler_types::CallConfig;

/// Runner threads (each with its own simulated device).
const THREADS: u32 = 3;

fn hammer(device: u32, runs: u64) {
    let mut r = DeviceRunner::attach(fast_options(device).with_pipeline_slots(3)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    // Two argument sets of different sizes: their images and kernel arguments differ.
    let sets = [VectorRun::new(&mut r, 256 + device as usize * 64), VectorRun::new(&mut r, 96)];
    let cfg = CallConfig::default();
    r.sim_faults().unwrap().kernel_delay(FUNC_MUL, Duration::from_micros(500));
    let zero = |r: &mut DeviceRunner, set: &VectorRun| {
        r.memset(set.ptrs[2], 0, set.a.len() as u64 * 4).unwrap();
    };
    let request = |n: u64| RunRequest::new(run_id(n), slot, &sets[(n % 2) as usize].args, &cfg);
    zero(&mut r, &sets[1]);
    let first = r.prepare(&request(1)).unwrap();
    let mut active = r.launch_run(first).unwrap();
    for n in 1..=runs {
        // Run n executes; run n + 1 is prepared in the other slot meanwhile.
        let next = (n < runs).then(|| r.prepare(&request(n + 1)).unwrap());
        // Every third run, a third run is prepared and its handle dropped on another thread
        // while run n executes and is reaped: the runner reclaims that slot at a later call.
        let dropper = (n % 3 == 0).then(|| {
            let p = r.prepare(&request(10_000 + n)).unwrap();
            std::thread::spawn(move || drop(p))
        });
        r.reap_run(&active, None).unwrap();
        let report = r.complete_run(active).unwrap();
        if n > 1 {
            assert_eq!(report.overlap, Overlap::Overlapped { with: run_id(n - 1) }, "run {n}");
        }
        sets[(n % 2) as usize].check(&mut r);
        if let Some(d) = dropper {
            d.join().unwrap();
        }
        let Some(next) = next else { break };
        zero(&mut r, &sets[((n + 1) % 2) as usize]);
        active = r.launch_run(next).unwrap();
    }
    for set in sets {
        set.free(&mut r);
    }
    r.finalize().unwrap();
}

#[test]
fn preparing_the_next_run_never_writes_what_the_executing_run_reads() {
    let runs: u64 =
        std::env::var("SIMPLER_SOAK_CYCLES").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || hammer(40 + t, runs));
        }
    });
}
