//! Pipelined runs through an L2 worker (`docs/pipelining.md`): depth 1, depth 2 and device
//! queueing in the same invocation, alternating.
//!
//! - **W3**: back-to-back runs of the vector program over 1024 f32 on one cluster whose
//!   orchestration also does 20 µs of host CPU work (standing in for the build of a larger
//!   graph, without the simulated dispatch of its tasks) and whose `g = d · e` kernel
//!   declares a time on the chip (`model_device_time`) chosen so that a run's device time
//!   equals the host's part of a depth-1 run: candidate times are measured at depth 1 and the
//!   closest pair (relative to the larger) wins. The simulator's threads neither sleep nor
//!   spin for the declared time, as a chip's compute uses no host CPU
//!   (`docs/benchmarks-worker.md`, W3, says why this is the faithful model). Throughput and
//!   per-run latency (submit → result) at each lane mode.
//! - **W3 lean host**: the same without host work, so that the preparation is the runtime's
//!   own few microseconds and the simulator's own work per run is most of the device time.
//! - **W3 streaming**: the streaming program's independent one-element tasks, as many as make
//!   its device time (the simulated AICPU dispatching each task) equal to its host
//!   preparation (building each task), both measured on a runner at depth 1 for 10 to 80
//!   tasks; nothing is declared. Unlike W3, both sides are CPU work on the host's cores.
//! - **W3 long device time**: the same shape with a fixed 300 us on the chip, so that the
//!   device time dominates.
//! - **W3 CPU-bound**: the vector program over 16384 f32 with no delay: its simulated device
//!   time is CPU work on the host's own cores, competing with the host's preparation.
//! - **S1 back to back**: the CPU-bound shape, 100 runs in each lane mode; and S1 serial
//!   (`run` = submit + wait, one run at a time), which pipelining cannot speed up.
//! - **Runner modes**: the W3 shapes on a runner directly, so the lane's hand-offs are out of
//!   the picture: depth 1 (`run`), depth 2 (prepare N+1 while N executes, launch it after
//!   reaping N) and queued (device queueing: N+1 is launched before N is reaped). Per run the
//!   host time of each phase (prepare, launch, the wait in reap, complete) is reported.
//!
//! `cargo bench --bench pipelined [-- RUNS ROUNDS HOST_WORK_US]` (defaults 1000, 3 and W3's
//! 20 µs of host work; `-- --test` runs a short version). Plain timing with medians over the
//! rounds, not criterion: one sample is a whole stream of runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cpu_time::ProcessTime;

use simpler::device_a2a3::kernel::model_device_time;
use simpler::device_a2a3::programs::{f32_to_le_bytes, streaming, vector};
use simpler::device_a2a3::{
    ChipCallable, ChipSlot, DevicePtr, DeviceRunner, OrchArgs, OrchCtx, OrchError,
    Orchestration as ChipOrchestration, Platform, RunRequest, RunnerOptions, RuntimeVariant,
};
use simpler::types::{CallConfig, DataType, RunId, TaskArgs, Tensor};
use simpler::worker::{ChipMemory, Orchestration, Worker};

const N: usize = 16384;

/// Nanoseconds the `g = d · e` kernel declares it takes on the chip.
static CHIP_TIME_NS: AtomicU64 = AtomicU64::new(0);

/// Iterations of [`host_work`] the vector program's orchestration runs after building its graph.
static HOST_WORK_ITERS: AtomicU64 = AtomicU64::new(0);

/// Iterations of [`host_work`] per microsecond on this machine (an `f64`'s bits), measured
/// once by [`calibrate_host_work`]; 0 until then.
static HOST_WORK_PER_US: AtomicU64 = AtomicU64::new(0);

/// `iters` rounds of a multiply-xor mix whose result the caller keeps: CPU work that the
/// compiler cannot drop, standing in for the orchestration of a larger graph (W3).
fn host_work(iters: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..iters {
        x = std::hint::black_box(x.rotate_left(7) ^ i).wrapping_mul(0x0100_0000_01b3);
    }
    x
}

/// Measures [`HOST_WORK_PER_US`]: the fastest of five timed blocks, so that a preemption
/// during one does not count as work.
fn calibrate_host_work() {
    const ITERS: u64 = 2_000_000;
    let fastest = (0..5)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(host_work(ITERS));
            t.elapsed()
        })
        .min()
        .expect("five blocks");
    let per_us = (ITERS as f64 / (fastest.as_secs_f64() * 1e6)).max(1.0);
    HOST_WORK_PER_US.store(per_us.to_bits(), Ordering::Relaxed);
}

/// The vector program's orchestration, then [`HOST_WORK_ITERS`] of host work.
fn orchestration_with_host_work(
    ctx: &mut OrchCtx<'_>,
    args: &OrchArgs<'_>,
) -> Result<(), OrchError> {
    vector::orchestration(ctx, args)?;
    std::hint::black_box(host_work(HOST_WORK_ITERS.load(Ordering::Relaxed)));
    Ok(())
}

/// `g = d · e`, declaring [`CHIP_TIME_NS`] of time on the chip.
unsafe extern "C-unwind" fn mul_declaring_chip_time(args: *mut i64) {
    // SAFETY: the runtime's argument vector for the product task, passed on unchanged.
    unsafe { vector::mul(args) };
    model_device_time(Duration::from_nanos(CHIP_TIME_NS.load(Ordering::Relaxed)));
}

/// The chip program of `shape`: the vector program with [`orchestration_with_host_work`] and
/// [`mul_declaring_chip_time`] as its product kernel, or the streaming program.
fn program(shape: Shape) -> ChipCallable {
    match shape.program {
        // SAFETY: `mul_declaring_chip_time` is the program's own product kernel plus a declared
        // time, for `MUL`'s signature.
        Program::Vector => unsafe {
            vector::builder_with_orchestration_and_mul(
                ChipOrchestration::Native {
                    entry: orchestration_with_host_work,
                    config: vector::orch_config,
                },
                mul_declaring_chip_time,
            )
        }
        .build()
        .expect("program"),
        Program::Streaming { .. } => streaming::callable().expect("program"),
    }
}

/// Sets the time on the chip the product kernel declares and the host work of the
/// orchestration, for the streams that follow.
fn apply_shape(shape: Shape) {
    let ns = shape.chip_time.map_or(0, |d| d.as_nanos() as u64);
    CHIP_TIME_NS.store(ns, Ordering::Relaxed);
    let per_us = f64::from_bits(HOST_WORK_PER_US.load(Ordering::Relaxed));
    assert!(shape.host_work.is_zero() || per_us > 0.0, "host work before its calibration");
    let iters = (shape.host_work.as_secs_f64() * 1e6 * per_us).round() as u64;
    HOST_WORK_ITERS.store(iters, Ordering::Relaxed);
}

/// Which chip program a stream runs.
#[derive(Clone, Copy)]
enum Program {
    /// The vector program over `n` f32 (five tasks).
    Vector,
    /// The streaming program: `tasks` independent one-element tasks into `n` lanes
    /// (`tasks <= n`), whose device time is the simulated AICPU's dispatch of each task.
    Streaming { tasks: u64 },
}

/// One workload of the stream: program, elements (lanes of the streaming program), cluster
/// count (0 = default), the vector product kernel's declared time on the chip (`None`: the
/// simulator's own work is the device time) and the vector orchestration's host work.
#[derive(Clone, Copy)]
struct Shape {
    program: Program,
    n: usize,
    block_dim: u32,
    chip_time: Option<Duration>,
    host_work: Duration,
}

/// The chip arguments of `shape` over buffers that `malloc` returns (child memory): the vector
/// program's `a`, `b` (filled by `fill`) and `f`, or the streaming program's lanes.
fn shape_args<B>(
    shape: Shape,
    mut malloc: impl FnMut(u64) -> B,
    mut fill: impl FnMut(&B, &[f32]),
    tensor: impl Fn(&B, u32) -> Tensor,
) -> (TaskArgs, Vec<B>) {
    let n = shape.n;
    if let Program::Streaming { tasks } = shape.program {
        assert!(tasks <= n as u64, "{tasks} tasks share {n} lanes: they would not be independent");
        let lanes = malloc((n * 4) as u64);
        let args = streaming::run_args(tensor(&lanes, n as u32), tasks, 1).expect("arguments");
        return (args, vec![lanes]);
    }
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 - (i % 13) as f32).collect();
    let mut args = TaskArgs::new();
    let mut bufs = Vec::new();
    for (i, data) in [Some(&a), Some(&b), None].into_iter().enumerate() {
        let buf = malloc((n * 4) as u64);
        if let Some(d) = data {
            fill(&buf, d);
        }
        let t = tensor(&buf, n as u32);
        if i < 2 { args.add_input(t) } else { args.add_output(t) }.expect("arg");
        bufs.push(buf);
    }
    (args, bufs)
}

/// [`shape_args`] in a worker's chip memory.
fn program_args(mem: &ChipMemory<'_>, shape: Shape) -> TaskArgs {
    shape_args(
        shape,
        |bytes| mem.malloc(bytes).expect("malloc"),
        |buf, d| mem.copy_to(buf, 0, &f32_to_le_bytes(d)).expect("copy"),
        |buf, n| buf.tensor(&[n], DataType::Float32).expect("tensor"),
    )
    .0
}

/// A runner with `shape`'s program registered and its arguments in the runner's memory (the
/// vector program's inputs and the streaming program's lanes left unfilled: results are not
/// checked here).
fn runner_with(
    opts: RunnerOptions,
    shape: Shape,
) -> (DeviceRunner, ChipSlot, TaskArgs, Vec<DevicePtr>) {
    let mut r = DeviceRunner::attach(opts).expect("attach");
    let slot = r.register_callable(&program(shape)).expect("register");
    let (args, ptrs) = shape_args(
        shape,
        |bytes| r.malloc(bytes).expect("malloc"),
        |_, _| {},
        |p, n| {
            Tensor::external(p.addr(), &[n], DataType::Float32).expect("tensor").child_memory(true)
        },
    );
    (r, slot, args, ptrs)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Host time (prepare + launch + complete) and device time (the wait in `reap_run`) of one run
/// of `shape`, measured on a runner directly (medians of `samples`).
fn calibrate(samples: usize, shape: Shape) -> (Duration, Duration) {
    apply_shape(shape);
    let opts = RunnerOptions::sim(9, RuntimeVariant::HostBuildGraph);
    let (mut r, slot, args, ptrs) = runner_with(opts, shape);
    let cfg = CallConfig::builder().block_dim(shape.block_dim).build().expect("config");
    let (mut host, mut device) = (Vec::new(), Vec::new());
    for i in 0..samples {
        let id = RunId::from_raw(i as u64 + 1).expect("id");
        let t0 = Instant::now();
        let p = r.prepare(&RunRequest::new(id, slot, &args, &cfg)).expect("prepare");
        let a = r.launch_run(p).expect("launch");
        let t1 = Instant::now();
        r.reap_run(&a, None).expect("reap");
        let t2 = Instant::now();
        r.complete_run(a).expect("complete");
        host.push((t1 - t0) + t2.elapsed());
        device.push(t2 - t1);
    }
    for p in ptrs {
        r.free(p).expect("free");
    }
    r.finalize().expect("finalize");
    (median(host), median(device))
}

/// Task counts W3 streaming tries.
const STREAMING_TASKS: [u64; 4] = [10, 20, 40, 80];

/// The host work W3's orchestration does per run, in microseconds (the bench's third argument
/// changes it).
const W3_HOST_WORK_US: u64 = 20;

/// Declared times W3 tries, as multiples of its host work (its host part is the host work,
/// plus the preparation's own few microseconds, plus the lane's hand-offs through the worker).
const W3_CANDIDATES: [f64; 9] = [0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4];

/// Declared times "W3 lean host" tries, in microseconds.
const LEAN_CANDIDATES_US: [u64; 10] = [2, 4, 6, 8, 10, 12, 14, 16, 20, 24];

/// One candidate declared time of a W3 shape, measured at depth 1 (medians of three streams
/// each).
struct Candidate {
    declared: Duration,
    /// The runner's launch and its wait in `reap_run` per run: the time the run is on the
    /// device as the host sees it (a declared time runs from the launch's start).
    device: Duration,
    /// A runner stream's time per run.
    runner_d1: Duration,
    /// A stream's time per run through an L2 worker.
    worker_d1: Duration,
}

impl Candidate {
    /// The host's part of a runner stream's run: its time less the device time.
    fn runner_host(&self) -> Duration {
        self.runner_d1.saturating_sub(self.device)
    }

    /// The host's part of a run through the worker.
    fn worker_host(&self) -> Duration {
        self.worker_d1.saturating_sub(self.device)
    }
}

fn measure_candidate(runs: usize, shape: Shape, declared: Duration) -> Candidate {
    let shape = Shape { chip_time: Some(declared), ..shape };
    let runner: Vec<(Duration, Phases)> =
        (0..3).map(|_| runner_stream(Mode::Depth1, runs, shape)).collect();
    Candidate {
        declared,
        device: median(runner.iter().map(|r| r.1.launch + r.1.reap).collect()),
        runner_d1: median(runner.iter().map(|r| r.0).collect()),
        worker_d1: median((0..3).map(|_| stream(Lane::Depth1, runs, shape).per_run).collect()),
    }
}

/// How far apart two times are, relative to the larger (0 when equal).
fn relative_gap(a: Duration, b: Duration) -> f64 {
    let larger = a.max(b).as_secs_f64();
    if larger == 0.0 { 0.0 } else { a.abs_diff(b).as_secs_f64() / larger }
}

/// The candidate whose host part is relatively closest to its device time, and that gap.
fn closest(scan: &[Candidate], host: fn(&Candidate) -> Duration) -> (&Candidate, f64) {
    scan.iter()
        .map(|c| (c, relative_gap(host(c), c.device)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("at least one candidate")
}

/// Untimed runs before a runner-level stream.
const RUNNER_WARM_UP: usize = 20;

/// How a runner-level stream drives its runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// `run`: prepare, launch, reap, complete, one run at a time.
    Depth1,
    /// Prepare N+1 while N executes; launch N+1 after reaping N.
    Depth2,
    /// Device queueing: prepare and launch N+1 while N executes, then reap N.
    Queued,
}

/// Host time per phase, summed over a runner-level stream.
#[derive(Default, Clone, Copy)]
struct Phases {
    prepare: Duration,
    launch: Duration,
    reap: Duration,
    complete: Duration,
    /// CPU time of the whole process per run (host thread and simulated device threads).
    cpu: Duration,
}

/// `runs` back-to-back runs on a runner directly in `mode`; wall time per run and the host
/// time of each phase per run.
fn runner_stream(mode: Mode, runs: usize, shape: Shape) -> (Duration, Phases) {
    let opts = RunnerOptions::sim(8, RuntimeVariant::HostBuildGraph)
        .with_pipeline_slots(if mode == Mode::Depth1 { 1 } else { 2 })
        .with_device_queue(mode == Mode::Queued);
    let (mut r, slot, args, ptrs) = runner_with(opts, shape);
    apply_shape(shape);
    let cfg = CallConfig::builder().block_dim(shape.block_dim).build().expect("config");
    let mut ph = Phases::default();
    let timed = |acc: &mut Duration, t: Instant| *acc += t.elapsed();
    let mut next_id = 0u64;
    let mut req_id = || {
        next_id += 1;
        RunId::from_raw(next_id).expect("id")
    };
    // Warm up (the simulated cores' threads, the build scratch, the first slot's arena), as the
    // worker streams do, so that a short stream measures runs rather than a runner's first runs.
    for _ in 0..RUNNER_WARM_UP {
        r.run(&RunRequest::new(req_id(), slot, &args, &cfg)).expect("warm-up run");
    }
    let (t0, cpu0) = (Instant::now(), ProcessTime::now());
    let mut in_flight = None;
    for i in 0..=runs {
        // Prepare run i (while run i-1 executes at depth 2 and queued).
        let mut prepared = (i < runs).then(|| {
            let t = Instant::now();
            let p = r.prepare(&RunRequest::new(req_id(), slot, &args, &cfg)).expect("prepare");
            timed(&mut ph.prepare, t);
            p
        });
        let mut launch = |r: &mut DeviceRunner, p| {
            let t = Instant::now();
            let a = r.launch_run(p).expect("launch");
            timed(&mut ph.launch, t);
            a
        };
        let mut queued = None;
        if mode == Mode::Queued {
            queued = prepared.take().map(|p| launch(&mut r, p));
        }
        if let Some(a) = in_flight.take() {
            let t = Instant::now();
            r.reap_run(&a, None).expect("reap");
            timed(&mut ph.reap, t);
            let t = Instant::now();
            r.complete_run(a).expect("complete");
            timed(&mut ph.complete, t);
        }
        in_flight = match mode {
            Mode::Queued => queued,
            Mode::Depth1 | Mode::Depth2 => {
                let a = prepared.take().map(|p| launch(&mut r, p));
                if mode == Mode::Depth1
                    && let Some(a) = a
                {
                    let t = Instant::now();
                    r.reap_run(&a, None).expect("reap");
                    timed(&mut ph.reap, t);
                    let t = Instant::now();
                    r.complete_run(a).expect("complete");
                    timed(&mut ph.complete, t);
                    None
                } else {
                    a
                }
            }
        };
    }
    let (total, cpu) = (t0.elapsed(), cpu0.elapsed());
    for p in ptrs {
        r.free(p).expect("free");
    }
    r.finalize().expect("finalize");
    let per = |d: Duration| d / runs as u32;
    let phases = Phases {
        prepare: per(ph.prepare),
        launch: per(ph.launch),
        reap: per(ph.reap),
        complete: per(ph.complete),
        cpu: per(cpu),
    };
    (total / runs as u32, phases)
}

struct Stream {
    per_run: Duration,
    /// CPU time of the whole process (host threads and simulated device threads) per run.
    cpu: Duration,
    latency: Duration,
    serial: Duration,
}

/// How an L2 worker's lane runs a stream.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lane {
    /// One resource slot: each run is prepared, launched, reaped and completed alone.
    Depth1,
    /// Two slots: run N+1 is prepared while N executes and launched after N is reaped.
    Depth2,
    /// Two slots and device queueing: N+1 is launched behind N before N is reaped.
    Queued,
}

/// How long the collecting thread of a stream yields for the next handle before it parks (the
/// worker's own waits linger as long).
const COLLECTOR_LINGER: Duration = Duration::from_micros(30);

/// The next handle of a stream, `None` once the submitter is done. The collector yields for up
/// to [`COLLECTOR_LINGER`] before it parks on the channel, as the worker's own waits do: at depth
/// 1 the next handle comes only after the run just collected was published, so a collector that
/// parked at once would be woken by the submitting thread once per run, and on a virtual machine
/// that wake-up costs the submitter more than the lane's work per run.
fn next_handle<T>(rx: &mpsc::Receiver<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(h) => return Some(h),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) if start.elapsed() < COLLECTOR_LINGER => {
                std::thread::yield_now()
            }
            Err(mpsc::TryRecvError::Empty) => return rx.recv().ok(),
        }
    }
}

/// `runs` back-to-back submits through an L2 worker whose lane runs as `lane`; a waiter thread
/// takes the results in order.
fn stream(lane: Lane, runs: usize, shape: Shape) -> Stream {
    let slots = if lane == Lane::Depth1 { 1 } else { 2 };
    let mut b =
        Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph).chip_options(move |o| {
            o.with_pipeline_slots(slots).with_device_queue(lane == Lane::Queued)
        });
    let h = b.register_chip(program(shape));
    let w = b.start().expect("start");
    assert_eq!(w.pipeline_depth(), slots);
    let args = program_args(&w.memory().expect("memory"), shape);
    let cfg = CallConfig::builder().block_dim(shape.block_dim).build().expect("config");
    let run = || Orchestration::chip(h, args.clone()).config(cfg.clone());
    apply_shape(shape);
    // Warm up (arenas of every slot).
    for _ in 0..4 {
        w.run(run()).expect("warm-up run");
    }
    let (tx, rx) = mpsc::channel::<(Instant, simpler::worker::RunHandle)>();
    let waiter = std::thread::spawn(move || {
        let mut latencies = Vec::new();
        while let Some((submitted, handle)) = next_handle(&rx) {
            handle.wait().expect("run");
            latencies.push(submitted.elapsed());
        }
        latencies
    });
    let mut serial = Vec::new();
    for _ in 0..runs.min(100) {
        let t = Instant::now();
        w.run(run()).expect("serial run");
        serial.push(t.elapsed());
    }
    let (t0, cpu0) = (Instant::now(), ProcessTime::now());
    for _ in 0..runs {
        let submitted = Instant::now();
        let handle = w.submit(run()).expect("submit");
        tx.send((submitted, handle)).expect("waiter");
    }
    drop(tx);
    let latencies = waiter.join().expect("waiter thread");
    let (total, cpu) = (t0.elapsed(), cpu0.elapsed());
    w.close().expect("close");
    let per = |d: Duration| d / runs as u32;
    Stream {
        per_run: per(total),
        cpu: per(cpu),
        latency: median(latencies),
        serial: median(serial),
    }
}

/// W3's calibration for `base` (`docs/benchmarks-worker.md`, W3): each candidate declared
/// time is measured at depth 1 on a runner and through the worker, and the candidate whose
/// device time is closest to the host's part of a run wins, separately for each level (the
/// worker's lane and waiter add to the runner's host part). The device time is the runner's
/// launch plus its wait in `reap_run` (from the launch's start to the run's end as the host
/// sees it): the declared time, or the simulator's own work when that is longer.
/// Returns the picked shapes (worker, runner) and the worker pick's device time.
fn pick_declared(
    name: &str,
    runs: usize,
    base: Shape,
    candidates: &[Duration],
) -> (Shape, Shape, Duration) {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let scan: Vec<Candidate> =
        candidates.iter().map(|&declared| measure_candidate(runs, base, declared)).collect();
    println!("{name} (host work in the orchestration {:.0} us):", us(base.host_work));
    for c in &scan {
        println!(
            "  declared {:.0} us: device time {:.1} us; runner depth 1 {:.1} us/run (host part {:.1} us); worker depth 1 {:.1} us/run (host part {:.1} us)",
            us(c.declared),
            us(c.device),
            us(c.runner_d1),
            us(c.runner_host()),
            us(c.worker_d1),
            us(c.worker_host()),
        );
    }
    let (runner_pick, runner_gap) = closest(&scan, Candidate::runner_host);
    let (worker_pick, worker_gap) = closest(&scan, Candidate::worker_host);
    for (level, pick, host_part, gap) in [
        ("the worker", worker_pick, worker_pick.worker_host(), worker_gap),
        ("the runner", runner_pick, runner_pick.runner_host(), runner_gap),
    ] {
        let edge = [scan.first(), scan.last()].into_iter().flatten();
        if scan.len() > 1 && edge.into_iter().any(|c| c.declared == pick.declared) {
            println!(
                "{name} through {level} picked the {} candidate ({:.0} us declared): the closest pair may lie outside the list",
                if pick.declared == scan[0].declared { "smallest" } else { "largest" },
                us(pick.declared),
            );
        }
        if gap > 0.25 {
            println!(
                "{name} condition not met through {level}: no candidate's device time and host part are within 25 % of the larger (closest: device {:.1} us, host part {:.1} us), so {name} there measures that pair",
                us(pick.device),
                us(host_part),
            );
        }
    }
    println!(
        "{name} declares {:.0} us through the worker (device {:.1} us, host part {:.1} us) and {:.0} us on the runner (device {:.1} us, host part {:.1} us)",
        us(worker_pick.declared),
        us(worker_pick.device),
        us(worker_pick.worker_host()),
        us(runner_pick.declared),
        us(runner_pick.device),
        us(runner_pick.runner_host()),
    );
    (
        Shape { chip_time: Some(worker_pick.declared), ..base },
        Shape { chip_time: Some(runner_pick.declared), ..base },
        worker_pick.device,
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let quick = std::env::args().any(|a| a == "--test");
    let runs: usize =
        args.first().and_then(|s| s.parse().ok()).unwrap_or(if quick { 20 } else { 1000 });
    let rounds: usize =
        args.get(1).and_then(|s| s.parse().ok()).unwrap_or(if quick { 1 } else { 3 }).max(1);
    let s1_runs = if quick { 10 } else { 100 };
    let samples = if quick { 5 } else { 50 };
    let us = |d: Duration| d.as_secs_f64() * 1e6;

    let w3_host_work =
        Duration::from_micros(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(W3_HOST_WORK_US));
    calibrate_host_work();
    let small = Shape {
        program: Program::Vector,
        n: 1024,
        block_dim: 1,
        chip_time: None,
        host_work: Duration::ZERO,
    };
    let (host, device) = calibrate(samples, small);
    println!(
        "calibration (1024 f32, one cluster): runner prepare + launch + complete {:.1} us per run, simulated device time without a declared time {:.1} us (the host build's compute and hand-offs)",
        us(host),
        us(device),
    );
    let calibration_runs = if quick { 20 } else { 1000 };
    let w3_base = Shape { host_work: w3_host_work, ..small };
    let w3_candidates: Vec<Duration> = if quick { &[1.0, 1.4][..] } else { &W3_CANDIDATES[..] }
        .iter()
        .map(|&m| w3_host_work.mul_f64(m))
        .collect();
    let lean_candidates: Vec<Duration> = if quick { &[4, 12][..] } else { &LEAN_CANDIDATES_US[..] }
        .iter()
        .map(|&m| Duration::from_micros(m))
        .collect();
    let (w3, w3_runner, w3_device) = pick_declared("W3", calibration_runs, w3_base, &w3_candidates);
    let (lean, lean_runner, lean_device) =
        pick_declared("W3 lean host", calibration_runs, small, &lean_candidates);
    let long = Shape { chip_time: Some(Duration::from_micros(300)), ..small };
    // W3 CPU-bound: the vector program over 16384 f32, whose simulated device time is host
    // CPU work on the same cores as the host's preparation.
    let big = Shape { n: N, block_dim: 0, ..small };
    let (host_big, device_big) = calibrate(samples, big);
    println!(
        "calibration (16384 f32): host time per run {:.1} us, simulated device time {:.1} us (CPU work, nothing declared)",
        us(host_big),
        us(device_big),
    );
    // W3 streaming: the streaming program with as many independent tasks as make its device
    // time (the simulated AICPU dispatching each task) equal to its host preparation (building
    // each task), both measured on a runner at depth 1; no time is declared.
    let streaming_counts: &[u64] = if quick { &[10, 20] } else { &STREAMING_TASKS };
    let streaming = |tasks| Shape { program: Program::Streaming { tasks }, n: 128, ..small };
    let streaming_scan: Vec<(u64, Duration, Duration)> = streaming_counts
        .iter()
        .map(|&tasks| {
            let (host, device) = calibrate(samples, streaming(tasks));
            (tasks, host, device)
        })
        .collect();
    for (tasks, host, device) in &streaming_scan {
        println!(
            "  streaming, {tasks} tasks: host preparation {:.1} us, device time {:.1} us per run",
            us(*host),
            us(*device),
        );
    }
    let &(streaming_tasks, streaming_host, streaming_device) = streaming_scan
        .iter()
        .min_by(|a, b| relative_gap(a.1, a.2).total_cmp(&relative_gap(b.1, b.2)))
        .expect("at least one count");
    let streaming_w3 = streaming(streaming_tasks);
    println!(
        "W3 streaming runs {streaming_tasks} tasks (host preparation {:.1} us, device {:.1} us: {}within 25 %)",
        us(streaming_host),
        us(streaming_device),
        if relative_gap(streaming_host, streaming_device) > 0.25 { "not " } else { "" },
    );
    let lanes = [Lane::Depth1, Lane::Depth2, Lane::Queued];
    // W3 long device time: 300 us on the chip, so the device time dominates.
    // The device time each calibrated workload was matched with, for the check of its rounds.
    let workloads = [
        ("W3", runs, w3, Some(w3_device)),
        ("W3 lean host", runs, lean, Some(lean_device)),
        ("W3 streaming", runs, streaming_w3, None),
        ("W3 long device time (300 us)", runs, long, None),
        ("W3 CPU-bound", runs, big, None),
        ("S1 back to back", s1_runs, big, None),
    ];
    let mut lane_results: Vec<[Vec<Stream>; 3]> =
        workloads.iter().map(|_| [Vec::new(), Vec::new(), Vec::new()]).collect();
    for _ in 0..rounds {
        for (w, (_, n, shape, _)) in workloads.iter().enumerate() {
            for (l, lane) in lanes.into_iter().enumerate() {
                lane_results[w][l].push(stream(lane, *n, *shape));
            }
        }
    }
    let modes = [Mode::Depth1, Mode::Depth2, Mode::Queued];
    for (name, n, shape) in [
        ("W3 runner", runs, w3_runner),
        ("W3 lean host runner", runs, lean_runner),
        ("W3 streaming runner", runs, streaming_w3),
        ("W3 CPU-bound runner", runs, big),
    ] {
        let mut per_mode = Vec::new();
        for mode in modes {
            // The round of median wall time gives the row, its host split and CPU included.
            let mut per_round: Vec<(Duration, Phases)> =
                (0..rounds).map(|_| runner_stream(mode, n, shape)).collect();
            per_round.sort_by_key(|&(wall, _)| wall);
            let (wall, ph) = per_round[per_round.len() / 2];
            per_mode.push((mode, wall, ph));
        }
        let d1 = per_mode[0].1;
        for (mode, wall, ph) in per_mode {
            println!(
                "{name}: {n} runs, {mode:?}: {:.1} us/run ({:.2}x depth 1), CPU {:.1} us/run; host per run: prepare {:.1} us, launch {:.1} us, reap wait {:.1} us, complete {:.1} us",
                us(wall),
                d1.as_secs_f64() / wall.as_secs_f64(),
                us(ph.cpu),
                us(ph.prepare),
                us(ph.launch),
                us(ph.reap),
                us(ph.complete),
            );
        }
    }
    let med = |v: &[Stream], f: fn(&Stream) -> Duration| median(v.iter().map(f).collect());
    for ((name, n, _, matched), data) in workloads.iter().zip(&lane_results) {
        let d1 = med(&data[0], |s| s.per_run);
        for (lane, streams) in lanes.iter().zip(data) {
            let per_run = med(streams, |s| s.per_run);
            println!(
                "{name}: {n} runs x {rounds} rounds through an L2 worker, {lane:?}: {:.1} us/run ({:.2}x depth 1), CPU {:.1} us/run, latency {:.1} us, serial run {:.1} us",
                us(per_run),
                d1.as_secs_f64() / per_run.as_secs_f64(),
                us(med(streams, |s| s.cpu)),
                us(med(streams, |s| s.latency)),
                us(med(streams, |s| s.serial)),
            );
        }
        // The calibration's pair holds only if these depth-1 streams saw the same host part.
        if let Some(device) = *matched {
            let host_part = d1.saturating_sub(device);
            println!(
                "{name} depth-1 streams above: host part {:.1} us against the device's {:.1} us ({}within 25 %)",
                us(host_part),
                us(device),
                if relative_gap(host_part, device) > 0.25 { "not " } else { "" },
            );
        }
    }
}
