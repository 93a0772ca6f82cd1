//! Multi-host L4 over MPI: rank 0 runs an L4 worker whose children are the L3 workers of the
//! other ranks, each with one simulated chip and one sub worker (`docs/multi-host.md`).
//!
//! Every rank runs this same program (SPMD). Each serving rank registers the graphs `compute`
//! (the chip program `f = a + b` on its chip, over inputs that depend on the rank) and `check`
//! (reads the result back, compares it with the reference on a sub worker); rank 0 registers
//! the same names on its L4 worker and runs `compute` then `check` on every remote L3.
//!
//! ```sh
//! cargo build --release --features mpi --example l4_mpi
//! mpirun -np 3 --oversubscribe target/release/examples/l4_mpi [--runtime hbg|trb]
//! ```
//!
//! `--runtime` picks the serving ranks' chip runtime (default hbg).
//!
//! (As root, add `--allow-run-as-root`.) Open MPI comes from the distribution:
//! `apt-get install openmpi-bin libopenmpi-dev libclang-dev`.

mod common;

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use common::Cli;
use simpler_device_a2a3::programs::{add, f32_from_le_bytes, f32_to_le_bytes};
use simpler_device_a2a3::{Platform, RuntimeVariant};
use simpler_types::{CallConfig, DataType, TaskArgs, WorkerId};
use simpler_worker::remote::{MpiJob, RemoteL3, ServedGraphs, serve_l3};
use simpler_worker::{DeviceBuffer, Orchestration, Worker};

const N: usize = 4096;
type Res<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> ExitCode {
    let cli = match Cli::from_env() {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("l4_mpi: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(cli.runtime) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("l4_mpi: {}", common::explain(cli.runtime, e));
            ExitCode::FAILURE
        }
    }
}

fn run(runtime: RuntimeVariant) -> Res {
    let job = MpiJob::init()?;
    if job.size() < 2 {
        return Err("run it under mpirun with at least 2 ranks (see the file's docs)".into());
    }
    let done = if job.rank() == 0 { drive(&job) } else { serve(&job, runtime) };
    if let Err(e) = done {
        // Finalizing is collective and the other ranks may still wait for this one: exit
        // without it, which makes mpirun end the whole job.
        let e = common::explain(runtime, e);
        eprintln!("l4_mpi: rank {}: {e}", job.rank());
        std::process::exit(1);
    }
    job.finalize()?;
    Ok(())
}

/// Rank 0: the L4 worker. Its graph bodies never run; the serving ranks run their own.
fn drive(job: &MpiJob) -> Res {
    let mut l4 = Worker::composite(4);
    let compute = l4.register_graph("compute", |_, _, _| Err("runs on a serving rank".into()));
    let check = l4.register_graph("check", |_, _, _| Err("runs on a serving rank".into()));
    for rank in 1..job.size() {
        l4.child(RemoteL3::new(job, rank))?;
    }
    let worker = l4.start()?;
    let children = job.size() as u32 - 1;
    for graph in [compute, check] {
        worker.run(Orchestration::graph(move |g, _, _| {
            for child in 0..children {
                g.submit_next_level(
                    graph,
                    TaskArgs::new(),
                    &CallConfig::default(),
                    WorkerId(child),
                )?;
            }
            Ok(())
        }))?;
    }
    println!("l4_mpi: rank 0 ran compute and check on {children} remote L3 worker(s): all correct");
    worker.close()?;
    Ok(())
}

/// Ranks 1..N: an L3 worker with one simulated chip and one sub worker.
fn serve(job: &MpiJob, runtime: RuntimeVariant) -> Res {
    let rank = job.rank();
    let mut b = Worker::host(Platform::A2a3Sim, runtime).chips(&[0]).sub_workers(1);
    let add_handle = b.register_chip(add::callable()?);
    let input = move |which: usize| -> Vec<f32> {
        (0..N).map(|i| i as f32 * 0.5 + (rank as usize * 10 + which) as f32).collect()
    };
    let result: Arc<Mutex<Vec<f32>>> = Arc::default();
    let r = Arc::clone(&result);
    let compare = b.register_host("compare", move |_| {
        let got = r.lock().map_err(|_| "poisoned")?;
        if *got != add::reference(&input(0), &input(1)) {
            return Err(format!("rank {rank}: wrong sum").into());
        }
        Ok(())
    });
    let bufs: Arc<Mutex<Option<[DeviceBuffer; 3]>>> = Arc::default();
    let mut graphs = ServedGraphs::new();
    let s = Arc::clone(&bufs);
    graphs.register("compute", move |g, _, _| {
        let mem = g.chip_memory(WorkerId(0))?;
        let bytes = (N * 4) as u64;
        let b = [mem.malloc(bytes)?, mem.malloc(bytes)?, mem.malloc(bytes)?];
        mem.copy_to(&b[0], 0, &f32_to_le_bytes(&input(0)))?;
        mem.copy_to(&b[1], 0, &f32_to_le_bytes(&input(1)))?;
        let mut a = TaskArgs::new();
        a.add_input(b[0].tensor(&[N as u32], DataType::Float32)?)?
            .add_input(b[1].tensor(&[N as u32], DataType::Float32)?)?
            .add_output(b[2].tensor(&[N as u32], DataType::Float32)?)?;
        g.submit_next_level(add_handle, a, &CallConfig::default(), WorkerId(0))?;
        *s.lock().map_err(|_| "poisoned")? = Some(b);
        Ok(())
    });
    graphs.register("check", move |g, _, _| {
        let b = bufs.lock().map_err(|_| "poisoned")?.ok_or("compute did not run")?;
        let mut raw = vec![0u8; N * 4];
        g.chip_memory(WorkerId(0))?.copy_from(&b[2], 0, &mut raw)?;
        *result.lock().map_err(|_| "poisoned")? = f32_from_le_bytes(&raw);
        g.submit_sub(compare, TaskArgs::new())?;
        Ok(())
    });
    serve_l3(job, b, graphs)?;
    Ok(())
}
