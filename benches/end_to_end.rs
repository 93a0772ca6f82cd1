//! End-to-end workloads through the whole stack, as a user drives it (user → `Worker` →
//! engine → simulated chip):
//!
//! - **S1 through an L2 worker**: the vector example's chip program (five AIV tasks over 16384
//!   f32), `Worker::run` per iteration. The device crate's S1 (`sim_chip`) times
//!   `DeviceRunner::run` itself; the difference is the worker's lane hand-offs.
//! - **W1**: an L3 run of one chip task (`f = a + b` over 1024 f32), submit → wait.
//! - **W2**: an L3 run of the vector program on two chips plus one sub-worker task.
//!
//! `cargo bench --bench end_to_end [-- s1|w1|w2]`; `-- --test` runs each workload once. The
//! per-crate benches measure the layers on their own (`simpler-worker`'s `worker` bench
//! compares W1 with the chip's own run time).

use std::time::Duration;

use criterion::Criterion;
use simpler::device_a2a3::programs::{add, f32_to_le_bytes, vector};
use simpler::device_a2a3::{ChipCallable, Platform, RuntimeVariant};
use simpler::types::{CallConfig, DataType, TaskArgs, WorkerId};
use simpler::worker::{ChipMemory, Orchestration, Worker};

/// The arguments `(a: Input, b: Input, f: Output)` of the reference programs over fresh
/// buffers of `n` f32 on `mem`, with `a` and `b` filled.
fn program_args(mem: &ChipMemory<'_>, n: usize) -> TaskArgs {
    let bytes = (n * 4) as u64;
    let shape = [n as u32];
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 - (i % 13) as f32).collect();
    let mut args = TaskArgs::new();
    for (i, data) in [Some(&a), Some(&b), None].into_iter().enumerate() {
        let buf = mem.malloc(bytes).expect("malloc");
        if let Some(d) = data {
            mem.copy_to(&buf, 0, &f32_to_le_bytes(d)).expect("copy");
        }
        let t = buf.tensor(&shape, DataType::Float32).expect("tensor");
        if i < 2 { args.add_input(t) } else { args.add_output(t) }.expect("arg");
    }
    args
}

fn program(c: Result<ChipCallable, simpler::device_a2a3::DeviceError>) -> ChipCallable {
    c.expect("valid program")
}

fn s1(c: &mut Criterion) {
    let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
    let h = b.register_chip(program(vector::callable()));
    let w = b.start().expect("start");
    let args = program_args(&w.memory().expect("memory"), 16384);
    c.bench_function("s1_vector_program_l2_16384_f32", |bench| {
        bench.iter(|| w.run(Orchestration::chip(h, args.clone())).expect("run"));
    });
    w.close().expect("close");
}

fn w1(c: &mut Criterion) {
    let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).chips(&[0]);
    let h = b.register_chip(program(add::callable()));
    let w = b.start().expect("start");
    let args = program_args(&w.chip_memory(WorkerId(0)).expect("memory"), 1024);
    c.bench_function("w1_l3_one_chip_task_submit_wait", |bench| {
        bench.iter(|| {
            let a = args.clone();
            w.run(Orchestration::graph(move |g, _, _| {
                g.submit_next_level(h, a.clone(), &CallConfig::default(), WorkerId(0))?;
                Ok(())
            }))
            .expect("run");
        });
    });
    w.close().expect("close");
}

fn w2(c: &mut Criterion) {
    let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph)
        .chips(&[0, 1])
        .sub_workers(1);
    let h = b.register_chip(program(vector::callable()));
    let note = b.register_host("note", |_| Ok(()));
    let w = b.start().expect("start");
    let per_chip: Vec<(WorkerId, TaskArgs)> = [WorkerId(0), WorkerId(1)]
        .into_iter()
        .map(|chip| (chip, program_args(&w.chip_memory(chip).expect("memory"), 16384)))
        .collect();
    c.bench_function("w2_l3_vector_on_two_chips_and_a_sub_task", |bench| {
        bench.iter(|| {
            let p = per_chip.clone();
            w.run(Orchestration::graph(move |g, _, _| {
                for (chip, a) in &p {
                    g.submit_next_level(h, a.clone(), &CallConfig::default(), *chip)?;
                }
                g.submit_sub(note, TaskArgs::new())?;
                Ok(())
            }))
            .expect("run");
        });
    });
    w.close().expect("close");
}

// Written out rather than through `criterion_group!`, whose generated public function would
// carry no documentation.
fn main() {
    // The machines this runs on are shared: short, repeated samples say more than long ones.
    let mut criterion = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    s1(&mut criterion);
    w1(&mut criterion);
    w2(&mut criterion);
    criterion.final_summary();
}
