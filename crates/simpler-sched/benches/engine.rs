//! Criterion benches of whole engine runs in the workload harness (two no-op NEXT_LEVEL
//! endpoints, round-robin placement): P1 and P2 at reduced size, one P3 diamond, and P6 runs.
//! One iteration is one run: begin, submit, close, wait, release. The full-size figures with
//! medians, allocations and peak memory come from the `workloads` bench.

// The criterion macros generate undocumented public functions.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use common::{Harness, P6_SIZES, Workload};

fn bench_runs(c: &mut Criterion) {
    let h = Harness::start();
    let mut group = c.benchmark_group("engine");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let workloads = [
        ("p1_independent_10k", Workload::Independent { tasks: 10_000 }),
        ("p2_chain_10k", Workload::Chain { tasks: 10_000 }),
        ("p3_diamond_1000", Workload::Diamonds { reps: 1, width: 1000 }),
    ];
    for (name, w) in workloads {
        group.throughput(Throughput::Elements(w.tasks()));
        group.bench_function(name, |b| b.iter(|| h.run(w, false)));
    }
    for n in P6_SIZES {
        let w = Workload::Independent { tasks: n };
        group.throughput(Throughput::Elements(n));
        group.bench_function(format!("p6_run_of_{n}"), |b| b.iter(|| h.run(w, false)));
    }
    group.finish();
}

criterion_group!(benches, bench_runs);
criterion_main!(benches);
