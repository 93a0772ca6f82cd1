//! The whole stack from the facade: user → `Worker` → engine → simulated chip, at L2, L3 and
//! L4, each result checked element by element against the program's host reference.

use std::sync::{Arc, Mutex};

use simpler::device_a2a3::programs::{add, f32_from_le_bytes, f32_to_le_bytes, vector};
use simpler::device_a2a3::{Platform, RuntimeVariant};
use simpler::types::{CallConfig, DataType, TaskArgs, WorkerId};
use simpler::worker::{ChipMemory, DeviceBuffer, Orchestration, Worker};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const N: usize = 4096;

fn inputs(seed: u32) -> (Vec<f32>, Vec<f32>) {
    let a = (0..N).map(|i| (i % 89) as f32 * 0.5 + seed as f32).collect();
    let b = (0..N).map(|i| 2.0 - (i % 7) as f32 * (seed + 1) as f32).collect();
    (a, b)
}

/// Buffers `a`, `b`, `f` on `mem` with `a` and `b` filled, and the program's arguments
/// `(a: Input, b: Input, f: Output)`.
fn stage(
    mem: &ChipMemory<'_>,
    a: &[f32],
    b: &[f32],
) -> Result<([DeviceBuffer; 3], TaskArgs), BoxError> {
    let bytes = (N * 4) as u64;
    let bufs = [mem.malloc(bytes)?, mem.malloc(bytes)?, mem.malloc(bytes)?];
    mem.copy_to(&bufs[0], 0, &f32_to_le_bytes(a))?;
    mem.copy_to(&bufs[1], 0, &f32_to_le_bytes(b))?;
    let shape = [N as u32];
    let mut args = TaskArgs::new();
    args.add_input(bufs[0].tensor(&shape, DataType::Float32)?)?
        .add_input(bufs[1].tensor(&shape, DataType::Float32)?)?
        .add_output(bufs[2].tensor(&shape, DataType::Float32)?)?;
    Ok((bufs, args))
}

fn read(mem: &ChipMemory<'_>, buf: &DeviceBuffer) -> Vec<f32> {
    let mut raw = vec![0u8; N * 4];
    mem.copy_from(buf, 0, &mut raw).expect("copy back");
    f32_from_le_bytes(&raw)
}

#[test]
fn an_l2_worker_runs_the_vector_program_on_its_chip() {
    let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
    let h = b.register_chip(vector::callable().expect("program"));
    let w = b.start().expect("start");
    let mem = w.memory().expect("memory");
    let (a, bv) = inputs(1);
    let (bufs, args) = stage(&mem, &a, &bv).expect("stage");
    for _ in 0..3 {
        // Poisoned (0xFF bytes are NaN) so that each run's check sees what that run wrote.
        mem.copy_to(&bufs[2], 0, &[0xFF; N * 4]).expect("poison");
        w.run(Orchestration::chip(h, args.clone())).expect("run");
        assert_eq!(read(&mem, &bufs[2]), vector::reference(&a, &bv));
    }
    w.close().expect("close");
}

#[test]
fn an_l3_worker_runs_two_chips_and_a_sub_task_in_one_run() {
    let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph)
        .chips(&[0, 1])
        .sub_workers(1);
    let h = b.register_chip(vector::callable().expect("program"));
    let sub_ran: Arc<Mutex<usize>> = Arc::default();
    let count = Arc::clone(&sub_ran);
    let note = b.register_host("note", move |_| {
        *count.lock().map_err(|_| "poisoned")? += 1;
        Ok(())
    });
    let w = b.start().expect("start");
    let mut staged = Vec::new();
    for chip in [WorkerId(0), WorkerId(1)] {
        let (a, bv) = inputs(chip.0 + 2);
        let (bufs, args) = stage(&w.chip_memory(chip).expect("memory"), &a, &bv).expect("stage");
        staged.push((chip, bufs, args, vector::reference(&a, &bv)));
    }
    let runs: Vec<(WorkerId, TaskArgs)> = staged.iter().map(|s| (s.0, s.2.clone())).collect();
    w.run(Orchestration::graph(move |g, _, _| {
        for (chip, args) in &runs {
            g.submit_next_level(h, args.clone(), &CallConfig::default(), *chip)?;
        }
        g.submit_sub(note, TaskArgs::new())?;
        Ok(())
    }))
    .expect("run");
    for (chip, bufs, _, expected) in &staged {
        assert_eq!(read(&w.chip_memory(*chip).expect("memory"), &bufs[2]), *expected, "{chip}");
    }
    assert_eq!(*sub_ran.lock().expect("count"), 1);
    w.close().expect("close");
}

#[test]
fn an_l4_worker_runs_whole_l3_runs_on_its_child() {
    let mut l3 = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).chips(&[0]);
    let h = l3.register_chip(add::callable().expect("program"));
    let mut l4 = Worker::composite(4);
    l4.child(l3).expect("child");
    let (a, bv) = inputs(5);
    let expected = add::reference(&a, &bv);
    let staged: Arc<Mutex<Option<[DeviceBuffer; 3]>>> = Arc::default();
    // Runs on the child: stages the inputs and runs the chip program.
    let keep = Arc::clone(&staged);
    let compute = l4.register_graph("compute", move |g, _, cfg| {
        let (bufs, args) = stage(&g.chip_memory(WorkerId(0))?, &a, &bv)?;
        *keep.lock().map_err(|_| "poisoned")? = Some(bufs);
        g.submit_next_level(h, args, cfg, WorkerId(0))?;
        Ok(())
    });
    // Runs on the child in a later run: reads the result back and checks it.
    let verify = l4.register_graph("verify", move |g, _, _| {
        let bufs = staged.lock().map_err(|_| "poisoned")?.ok_or("not staged")?;
        let got = read(&g.chip_memory(WorkerId(0))?, &bufs[2]);
        if got != expected {
            return Err("the child's result differs from the reference".into());
        }
        Ok(())
    });
    let w = l4.start().expect("start");
    for graph in [compute, verify] {
        w.run(Orchestration::graph(move |g, _, _| {
            g.submit_next_level(graph, TaskArgs::new(), &CallConfig::default(), WorkerId(0))?;
            Ok(())
        }))
        .expect("run");
    }
    w.close().expect("close");
}
