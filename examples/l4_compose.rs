//! An L4 worker composing two L3 workers, each with one simulated chip and one sub worker.
//!
//! Graphs registered on the L4 worker run as whole L3 runs on a child: `setup` allocates and
//! fills the child's chip buffers, `compute` runs the chip program `f = a + b` and a sub task on
//! the child, and `verify` reads the result back and fails its task on a mismatch, which
//! reaches the L4 run with one error frame per level.
//!
//! Run it with `cargo run --release --example l4_compose [iterations] [--runtime hbg|trb]`
//! (default hbg).

mod common;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Cli;
use simpler_device_a2a3::Platform;
use simpler_device_a2a3::programs::{add, f32_from_le_bytes, f32_to_le_bytes};
use simpler_types::{CallConfig, DataType, TaskArgs, WorkerId};
use simpler_worker::{CallableHandle, DeviceBuffer, Orchestration, Worker};

const N: usize = 4096;

fn input(child: u64, which: u64) -> Vec<f32> {
    (0..N).map(|i| (i as f32) * 0.5 + (child * 10 + which) as f32).collect()
}

/// What each child's graphs share: its handles and its chip buffers.
struct ChildState {
    add: CallableHandle,
    note: CallableHandle,
    bufs: Mutex<Option<[DeviceBuffer; 3]>>,
}

fn main() -> ExitCode {
    common::main_with(run)
}

fn run(cli: &Cli) -> Result<bool, Box<dyn std::error::Error>> {
    let iterations: usize = cli.positional_or(0, 20)?;
    let notes = Arc::new(AtomicUsize::new(0));
    let mut l4 = Worker::composite(4);
    let mut children: HashMap<u64, ChildState> = HashMap::new();
    for (i, device) in [(0u64, 0u32), (1, 1)] {
        let mut l3 = Worker::host(Platform::A2a3Sim, cli.runtime).chips(&[device]).sub_workers(1);
        let add = l3.register_chip(add::callable()?);
        let n = Arc::clone(&notes);
        let note = l3.register_host("note", move |_| {
            n.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        l4.child(l3)?;
        children.insert(i, ChildState { add, note, bufs: Mutex::new(None) });
    }
    let children = Arc::new(children);
    let child_of = |args: simpler_types::TaskArgsView<'_>| args.scalar(0).unwrap_or(0);

    let c = Arc::clone(&children);
    let setup = l4.register_graph("setup", move |g, args, _| {
        let child = child_of(args);
        let state = c.get(&child).ok_or("unknown child")?;
        let mem = g.chip_memory(WorkerId(0))?;
        let bytes = (N * 4) as u64;
        let bufs = [mem.malloc(bytes)?, mem.malloc(bytes)?, mem.malloc(bytes)?];
        mem.copy_to(&bufs[0], 0, &f32_to_le_bytes(&input(child, 0)))?;
        mem.copy_to(&bufs[1], 0, &f32_to_le_bytes(&input(child, 1)))?;
        *state.bufs.lock().map_err(|_| "poisoned")? = Some(bufs);
        Ok(())
    });
    let c = Arc::clone(&children);
    let compute = l4.register_graph("compute", move |g, args, _| {
        let state = c.get(&child_of(args)).ok_or("unknown child")?;
        let bufs = state.bufs.lock().map_err(|_| "poisoned")?.ok_or("not set up")?;
        let mut chip_args = TaskArgs::new();
        chip_args
            .add_input(bufs[0].tensor(&[N as u32], DataType::Float32)?)?
            .add_input(bufs[1].tensor(&[N as u32], DataType::Float32)?)?
            .add_output(bufs[2].tensor(&[N as u32], DataType::Float32)?)?;
        g.submit_next_level(state.add, chip_args, &CallConfig::default(), WorkerId(0))?;
        g.submit_sub(state.note, TaskArgs::new())?;
        Ok(())
    });
    let c = Arc::clone(&children);
    let verify = l4.register_graph("verify", move |g, args, _| {
        let child = child_of(args);
        let state = c.get(&child).ok_or("unknown child")?;
        let bufs = state.bufs.lock().map_err(|_| "poisoned")?.ok_or("not set up")?;
        let mut raw = vec![0u8; N * 4];
        g.chip_memory(WorkerId(0))?.copy_from(&bufs[2], 0, &mut raw)?;
        let expected = add::reference(&input(child, 0), &input(child, 1));
        let got = f32_from_le_bytes(&raw);
        let bad = got.iter().zip(&expected).filter(|(g, e)| g != e).count();
        if bad > 0 {
            return Err(format!("child {child}: {bad} of {N} elements differ").into());
        }
        Ok(())
    });
    let worker = l4.start()?;

    let on_each_child = |graph: CallableHandle| {
        Orchestration::graph(move |g, _, _| {
            for child in 0..2u32 {
                let mut a = TaskArgs::new();
                a.add_scalar(u64::from(child))?;
                g.submit_next_level(graph, a, &CallConfig::default(), WorkerId(child))?;
            }
            Ok(())
        })
    };

    worker.run(on_each_child(setup))?;
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations.max(1) {
        let t0 = Instant::now();
        worker.run(on_each_child(compute))?;
        times.push(t0.elapsed());
    }
    let ok = match worker.run(on_each_child(verify)) {
        Ok(()) => true,
        Err(e) => {
            if let Some(refused) = common::refusal(cli.runtime, &e) {
                return Err(refused.into());
            }
            eprintln!("verify failed: {e}");
            false
        }
    };
    times.sort();
    let median = times.get(times.len() / 2).copied().unwrap_or(Duration::ZERO);
    println!(
        "l4_compose: {} — {} L4 run(s) over two L3 children, {} sub task(s); median {:.3} ms per L4 run",
        if ok { "both children correct" } else { "MISMATCH" },
        times.len(),
        notes.load(Ordering::SeqCst),
        median.as_secs_f64() * 1e3
    );
    worker.close()?;
    Ok(ok)
}
