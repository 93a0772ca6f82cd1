//! W5 (`docs/benchmarks-worker.md`): a one-task run on a remote L3 through L4 over MPI, next to
//! W1 (the same one-task chip run on an in-process L3), measured alternately on rank 0 of one
//! `mpirun -np 3 --oversubscribe` job on one machine.
//!
//! `cargo bench -p simpler-worker --features mpi --bench remote` launches itself under
//! `mpirun` and prints the median of 5 repetitions of the mean of 200 runs (`-- --test`: a
//! few runs only).

use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use simpler_device_a2a3::programs::add;
use simpler_device_a2a3::{Platform, RuntimeVariant};
use simpler_types::{CallConfig, DataType, TaskArgs, WorkerId};
use simpler_worker::remote::{MpiJob, RemoteL3, ServedGraphs, serve_l3};
use simpler_worker::{CallableHandle, DeviceBuffer, HostWorkerBuilder, Orchestration, Worker};

const N: u32 = 1024;
type Res<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> ExitCode {
    let quick = std::env::args().any(|a| a == "--test");
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_none() {
        let exe = match std::env::current_exe() {
            Ok(e) => e,
            Err(e) => {
                eprintln!("remote bench: {e}");
                return ExitCode::FAILURE;
            }
        };
        let status = Command::new("mpirun")
            .args(["-np", "3", "--oversubscribe"])
            .arg(exe)
            .args(quick.then_some("--test"))
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .status();
        return match status {
            Ok(s) if s.success() => ExitCode::SUCCESS,
            Ok(s) => {
                eprintln!("remote bench: the mpirun job failed ({s})");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("remote bench: could not start mpirun ({e}); install openmpi-bin");
                ExitCode::FAILURE
            }
        };
    }
    match rank_main(quick) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remote bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// An L3 builder with one simulated chip and the one-task program; returns the program's
/// handle and the graphs `setup` (chip buffers) and `one_task` (one chip task on them).
fn l3(device: u32) -> (HostWorkerBuilder, CallableHandle, ServedGraphs) {
    let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).chips(&[device]);
    let add = b.register_chip(add::callable().expect("valid program"));
    let bufs: Arc<Mutex<Option<[DeviceBuffer; 3]>>> = Arc::default();
    let mut graphs = ServedGraphs::new();
    let s = Arc::clone(&bufs);
    graphs.register("setup", move |g, _, _| {
        let mem = g.chip_memory(WorkerId(0))?;
        let bytes = u64::from(N) * 4;
        *s.lock().map_err(|_| "poisoned")? =
            Some([mem.malloc(bytes)?, mem.malloc(bytes)?, mem.malloc(bytes)?]);
        Ok(())
    });
    graphs.register("one_task", move |g, _, _| {
        let b = bufs.lock().map_err(|_| "poisoned")?.ok_or("not set up")?;
        g.submit_next_level(add, chip_args(&b)?, &CallConfig::default(), WorkerId(0))?;
        Ok(())
    });
    (b, add, graphs)
}

fn chip_args(b: &[DeviceBuffer; 3]) -> Res<TaskArgs> {
    let mut a = TaskArgs::new();
    a.add_input(b[0].tensor(&[N], DataType::Float32)?)?
        .add_input(b[1].tensor(&[N], DataType::Float32)?)?
        .add_output(b[2].tensor(&[N], DataType::Float32)?)?;
    Ok(a)
}

fn rank_main(quick: bool) -> Res {
    let job = MpiJob::init()?;
    if job.rank() != 0 {
        let (b, _, graphs) = l3(0);
        serve_l3(&job, b, graphs)?;
        job.finalize()?;
        return Ok(());
    }
    // W1: an in-process L3 with one chip.
    let (b, add, _) = l3(0);
    let local = b.start()?;
    let mem = local.chip_memory(WorkerId(0))?;
    let bytes = u64::from(N) * 4;
    let bufs = [mem.malloc(bytes)?, mem.malloc(bytes)?, mem.malloc(bytes)?];
    let args = chip_args(&bufs)?;
    let w1 = || {
        let a = args.clone();
        let orch = Orchestration::graph(move |g, _, _| {
            g.submit_next_level(add, a.clone(), &CallConfig::default(), WorkerId(0))?;
            Ok(())
        });
        local.run(orch).expect("W1 run");
    };
    // W5: an L4 whose child 0 is rank 1's L3.
    let mut l4 = Worker::composite(4);
    let setup = l4.register_graph("setup", |_, _, _| Err("runs on rank 1".into()));
    let one = l4.register_graph("one_task", |_, _, _| Err("runs on rank 1".into()));
    l4.child(RemoteL3::new(&job, 1))?;
    l4.child(RemoteL3::new(&job, 2))?;
    let l4 = l4.start()?;
    let on_rank1 = |graph: CallableHandle| {
        Orchestration::graph(move |g, _, _| {
            g.submit_next_level(graph, TaskArgs::new(), &CallConfig::default(), WorkerId(0))?;
            Ok(())
        })
    };
    l4.run(on_rank1(setup))?;
    let w5 = || l4.run(on_rank1(one)).expect("W5 run");

    let (reps, runs) = if quick { (1, 3) } else { (5, 200) };
    let mut t1 = Vec::new();
    let mut t5 = Vec::new();
    for _ in 0..runs.min(20) {
        w1();
        w5();
    }
    for _ in 0..reps {
        t1.push(mean(runs, w1));
        t5.push(mean(runs, w5));
    }
    let (m1, m5) = (median(&mut t1), median(&mut t5));
    println!("W1: L3 run of 1 chip task (in-process)          median {:>9.2} µs", us(m1));
    println!("W5: L4 run of 1 task on a remote L3 (rank 1)    median {:>9.2} µs", us(m5));
    println!(
        "W5 per-run overhead over W1: {:.2} µs ({reps} x {runs} runs, alternating)",
        us(m5.saturating_sub(m1))
    );
    l4.close()?;
    local.close()?;
    job.finalize()?;
    Ok(())
}

fn mean(runs: usize, f: impl Fn()) -> Duration {
    let t0 = Instant::now();
    for _ in 0..runs {
        f();
    }
    t0.elapsed() / runs as u32
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
