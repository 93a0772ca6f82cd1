//! Simulated-chip workloads S1, S2, S3 and the idle-CPU check (results in
//! `docs/benchmarks-device.md`).
//!
//! S1 and S3 run the crate's reference programs (`programs::vector`, `programs::bgemm`) and
//! check the result against their host references; S2 and the idle check run a no-op program
//! defined here.
//!
//! `cargo bench -p simpler-device-a2a3 --bench sim_chip` prints, per workload, the median of 5
//! measurements after one warm-up with min–max. `-- --test` runs every workload once at a
//! small size (what CI uses to check that the bench still works); workload names (`-- s2
//! idle`; also `s1`, `s3`) select a subset. `SIMPLER_BENCH_SPINS` and `SIMPLER_BENCH_YIELDS`
//! override the simulator's spin and yield rounds; `SIMPLER_BENCH_S2=8c` (block_dim, then `i`
//! independent or `c` chain) runs one S2 variant only.
//!
//! S2 runs every variant under both chip runtimes in the same invocation (host_build_graph,
//! then tensormap_and_ringbuffer, each on its own runner with its default AICPU threads) and
//! prints the trb/hbg ratio of the medians.
//!
//! S2 also reports, per task, the CPU time and the context switches of all the process's
//! threads (from `/proc/self/task/*/{schedstat,status}`): on a shared host they vary far less
//! than wall time, and a context switch is what a hand-off between simulated threads costs.

use std::time::{Duration, Instant};

use simpler_device_a2a3::programs::{bgemm, f32_from_le_bytes, f32_to_le_bytes, vector};
use simpler_device_a2a3::{
    ArgDirection, ChipCallable, ChipSlot, CoreCallable, DevicePtr, DeviceRunner, Kernels, OrchArgs,
    OrchConfig, OrchCtx, OrchError, RunRequest, RunnerOptions, RuntimeVariant,
};
use simpler_types::{CallConfig, CoreArgs, DataType, RunId, TaskArgs, Tensor};

/// Func id of the S2 no-op kernel (AIV).
const NOOP: u32 = 3;
/// Func id of the same no-op kernel for a chain of tasks updating one tensor in place (AIV).
const NOOP_INOUT: u32 = 4;

struct Bench {
    runner: DeviceRunner,
    next_run: u64,
}

impl Bench {
    fn new() -> Bench {
        Bench::with_runtime(RuntimeVariant::HostBuildGraph)
    }

    fn with_runtime(runtime: RuntimeVariant) -> Bench {
        let mut o = RunnerOptions::sim(0, runtime);
        // Knobs for studying the spin policy: spin rounds and yield rounds of every wait.
        if let Some(y) = std::env::var("SIMPLER_BENCH_YIELDS").ok().and_then(|v| v.parse().ok()) {
            o.sim.yield_iters = y;
        }
        if let Some(s) = std::env::var("SIMPLER_BENCH_SPINS").ok().and_then(|v| v.parse().ok()) {
            o.sim.spin_iters = Some(s);
        }
        Bench { runner: DeviceRunner::attach(o).expect("attach"), next_run: 1 }
    }

    fn run(
        &mut self,
        slot: ChipSlot,
        args: &TaskArgs,
        cfg: &CallConfig,
    ) -> (Duration, Option<Duration>) {
        let id = RunId::from_raw(self.next_run).expect("run id");
        self.next_run += 1;
        let t0 = Instant::now();
        let rep = self.runner.run(&RunRequest::new(id, slot, args, cfg)).expect("run");
        (t0.elapsed(), rep.device_wall)
    }

    fn device_f32(&mut self, values: &[f32], shape: &[u32]) -> (DevicePtr, Tensor) {
        let bytes = f32_to_le_bytes(values);
        let p = self.runner.malloc(bytes.len() as u64).expect("malloc");
        self.runner.copy_to_device(p, &bytes).expect("copy");
        (
            p,
            Tensor::external(p.addr(), shape, DataType::Float32)
                .expect("tensor")
                .child_memory(true),
        )
    }

    fn read_f32(&mut self, p: DevicePtr, n: usize) -> Vec<f32> {
        let mut b = vec![0u8; n * 4];
        self.runner.copy_from_device(&mut b, p).expect("copy back");
        f32_from_le_bytes(&b)
    }
}

fn stats(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ----- S1: the vector example -----

fn s1(quick: bool) {
    let n = 16384;
    let t_attach = Instant::now();
    let mut b = Bench::new();
    let c = vector::callable().expect("callable");
    let slot = b.runner.register_callable(&c).expect("register");
    let (a, bv) = (vec![1.0; n], vec![2.0; n]);
    let (_, ta) = b.device_f32(&a, &[n as u32]);
    let (_, tb) = b.device_f32(&bv, &[n as u32]);
    let (pf, tf) = b.device_f32(&vec![0.0; n], &[n as u32]);
    let mut args = TaskArgs::new();
    args.add_input(ta).and_then(|a| a.add_input(tb)).and_then(|a| a.add_output(tf)).expect("args");
    let cfg = CallConfig::default();
    let (cold, _) = b.run(slot, &args, &cfg);
    let attach_and_cold = t_attach.elapsed();
    let runs = if quick { 3 } else { 100 };
    let mut warm = Vec::new();
    let mut wall = Vec::new();
    for _ in 0..runs {
        let (t, w) = b.run(slot, &args, &cfg);
        warm.push(t);
        wall.extend(w);
    }
    assert!(b.read_f32(pf, n) == vector::reference(&a, &bv), "S1 result");
    let (med, lo, hi) = stats(warm);
    let (wmed, _, _) = stats(wall);
    println!("S1 vector example (16384 f32, 5 tasks, block_dim 2, 3 AICPU threads)");
    println!(
        "  cold run: {:.3} ms (attach + register + first run: {:.3} ms)",
        ms(cold),
        ms(attach_and_cold)
    );
    println!(
        "  warm run: median {:.3} ms over {runs} runs (min {:.3}, max {:.3}); device wall median {:.3} ms",
        ms(med),
        ms(lo),
        ms(hi),
        ms(wmed)
    );
}

// ----- S5: S1 under both runtimes -----

/// S1 warm on a fresh runner of `runtime`: the median of `runs` runs and the output bytes.
fn s1_warm(runtime: RuntimeVariant, runs: usize) -> (Duration, Duration, Vec<f32>) {
    let n = 16384;
    let mut b = Bench::with_runtime(runtime);
    let c = vector::callable().expect("callable");
    let slot = b.runner.register_callable(&c).expect("register");
    let (a, bv): (Vec<f32>, Vec<f32>) =
        ((0..n).map(|i| i as f32 * 0.5).collect(), (0..n).map(|i| 3.0 - i as f32).collect());
    let (_, ta) = b.device_f32(&a, &[n as u32]);
    let (_, tb) = b.device_f32(&bv, &[n as u32]);
    let (pf, tf) = b.device_f32(&vec![0.0; n], &[n as u32]);
    let mut args = TaskArgs::new();
    args.add_input(ta).and_then(|a| a.add_input(tb)).and_then(|a| a.add_output(tf)).expect("args");
    let cfg = CallConfig::default();
    b.run(slot, &args, &cfg);
    let mut warm = Vec::new();
    let mut wall = Vec::new();
    for _ in 0..runs {
        let (t, w) = b.run(slot, &args, &cfg);
        warm.push(t);
        wall.extend(w);
    }
    let out = b.read_f32(pf, n);
    assert!(out == vector::reference(&a, &bv), "S5 result under {runtime:?}");
    (stats(warm).0, stats(wall).0, out)
}

fn s5(quick: bool) {
    let runs = if quick { 3 } else { 100 };
    let (hbg, hbg_wall, hbg_out) = s1_warm(RuntimeVariant::HostBuildGraph, runs);
    let (trb, trb_wall, trb_out) = s1_warm(RuntimeVariant::TensormapAndRingbuffer, runs);
    assert!(hbg_out == trb_out, "S5: the runtimes' outputs differ");
    println!("S5 S1 warm under both runtimes (median of {runs} runs; outputs identical)");
    println!("  host_build_graph:         {:.3} ms (device wall {:.3} ms)", ms(hbg), ms(hbg_wall));
    println!(
        "  tensormap_and_ringbuffer: {:.3} ms (device wall {:.3} ms), {:.2}x hbg",
        ms(trb),
        ms(trb_wall),
        trb.as_secs_f64() / hbg.as_secs_f64()
    );
}

// ----- S2: dispatch overhead -----

/// The S2 kernel: does nothing, so a task costs only its dispatch.
unsafe extern "C-unwind" fn noop(_args: *mut i64) {}

fn noop_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let bad = OrchError::from_status(-1);
    let n = args.scalar(0).ok_or(bad)?;
    let chain = args.scalar(1).ok_or(bad)? != 0;
    let t = *args.tensor(0).ok_or(bad)?;
    let empty = CoreArgs::new();
    let mut inout = CoreArgs::new();
    inout.add_inout(t).map_err(|_| bad)?;
    for _ in 0..n {
        if chain {
            ctx.submit(Kernels::Aiv(NOOP_INOUT), &inout)?;
        } else {
            ctx.submit(Kernels::Aiv(NOOP), &empty)?;
        }
    }
    Ok(())
}

/// One runner with the S2 program registered and its chain tensor.
struct S2Chip {
    bench: Bench,
    slot: ChipSlot,
    tensor: Tensor,
    runtime: RuntimeVariant,
}

impl S2Chip {
    fn new(runtime: RuntimeVariant) -> S2Chip {
        let mut bench = Bench::with_runtime(runtime);
        let c = ChipCallable::native(noop_orch, |_| OrchConfig { expected_arg_count: 3 })
            // SAFETY: the kernel is written for the signature it is paired with.
            .kernel(NOOP, unsafe { CoreCallable::native(vec![], noop) })
            // SAFETY: the kernel is written for the signature it is paired with.
            .kernel(NOOP_INOUT, unsafe { CoreCallable::native(vec![ArgDirection::InOut], noop) })
            .build()
            .expect("callable");
        let slot = bench.runner.register_callable(&c).expect("register");
        let (_, tensor) = bench.device_f32(&[0.0; 16], &[16]);
        S2Chip { bench, slot, tensor, runtime }
    }

    /// Runs one S2 variant (one warm-up, then `reps` measured runs) and prints it; returns the
    /// median host time per task in µs.
    fn variant(&mut self, tasks: u64, block_dim: u32, chain: bool, reps: usize) -> f64 {
        let mut args = TaskArgs::new();
        args.add_inout(self.tensor)
            .and_then(|a| a.add_scalar(tasks))
            .and_then(|a| a.add_scalar(u64::from(chain)))
            .expect("args");
        let cfg = CallConfig::builder().block_dim(block_dim).build().expect("config");
        let b = &mut self.bench;
        b.run(self.slot, &args, &cfg);
        let mut host = Vec::new();
        let mut dev = Vec::new();
        let c0 = thread_counters();
        for _ in 0..reps {
            let (h, w) = b.run(self.slot, &args, &cfg);
            host.push(h);
            dev.extend(w);
        }
        let c1 = thread_counters();
        let per_task = |a: u64, b: u64| (b - a) as f64 / (reps as f64 * tasks as f64);
        let (med, lo, hi) = stats(host);
        let (dmed, _, _) = stats(dev);
        let per = |d: Duration| d.as_secs_f64() * 1e6 / tasks as f64;
        println!(
            "  {} block_dim {block_dim}, {:<11}: {:.3} µs/task (min {:.3}, max {:.3}); device wall {:.3} µs/task; CPU {:.3} µs/task; context switches/task {:.2} voluntary, {:.2} involuntary",
            self.runtime.short_name(),
            if chain { "chain" } else { "independent" },
            per(med),
            per(lo),
            per(hi),
            per(dmed),
            per_task(c0.cpu_ns, c1.cpu_ns) / 1000.0,
            per_task(c0.voluntary, c1.voluntary),
            per_task(c0.involuntary, c1.involuntary)
        );
        per(med)
    }
}

fn s2(quick: bool) {
    let mut chips: Vec<S2Chip> = RuntimeVariant::ALL.iter().map(|&r| S2Chip::new(r)).collect();
    let tasks: u64 = if quick { 200 } else { 10_000 };
    let reps = if quick { 1 } else { 5 };
    println!(
        "S2 dispatch overhead ({tasks} no-op AIV kernel tasks in one run; host time of run() / tasks; default AICPU threads: hbg 3, trb 4)"
    );
    for block_dim in [2u32, 8] {
        for chain in [false, true] {
            if let Ok(only) = std::env::var("SIMPLER_BENCH_S2")
                && only != format!("{block_dim}{}", if chain { "c" } else { "i" })
            {
                continue;
            }
            let per: Vec<f64> =
                chips.iter_mut().map(|c| c.variant(tasks, block_dim, chain, reps)).collect();
            if let [hbg, trb] = per.as_slice() {
                println!("    trb / hbg: {:.2}×", trb / hbg);
            }
        }
    }
}

/// Scheduler counters summed over every thread of the process so far (threads that exited are
/// not counted; the simulated threads live as long as the runner).
#[derive(Clone, Copy, Default)]
struct ThreadCounters {
    /// Voluntary context switches (the thread blocked: parked).
    voluntary: u64,
    /// Involuntary context switches (the thread was switched out while runnable: a yield that
    /// ran another thread, or preemption).
    involuntary: u64,
    /// CPU time in nanoseconds.
    cpu_ns: u64,
}

fn thread_counters() -> ThreadCounters {
    let mut total = ThreadCounters::default();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return total };
    for task in dir.flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        for line in status.lines() {
            let field = |key: &str| {
                line.strip_prefix(key).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
            };
            total.voluntary += field("voluntary_ctxt_switches:");
            total.involuntary += field("nonvoluntary_ctxt_switches:");
        }
        // The first field of `schedstat` is the time spent on a CPU, in nanoseconds.
        let sched = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        total.cpu_ns +=
            sched.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    total
}

// ----- S3: bgemm -----

fn s3(quick: bool) {
    let n = bgemm::N;
    let mut b = Bench::new();
    let c = bgemm::callable().expect("callable");
    let slot = b.runner.register_callable(&c).expect("register");
    let a: Vec<f32> = (0..n * n).map(|x| ((x * 7) % 13) as f32 * 0.125 - 0.75).collect();
    let bm: Vec<f32> = (0..n * n).map(|x| ((x * 5) % 11) as f32 * 0.25 - 1.25).collect();
    let shape = bgemm::shape();
    let (_, ta) = b.device_f32(&bgemm::tile_major(&a), &shape);
    let (_, tb) = b.device_f32(&bgemm::tile_major(&bm), &shape);
    let (pc, tc) = b.device_f32(&vec![0.0; n * n], &shape);
    let mut args = TaskArgs::new();
    args.add_input(ta).and_then(|x| x.add_input(tb)).and_then(|x| x.add_inout(tc)).expect("args");
    let cfg = CallConfig::default();
    let reps = if quick { 1 } else { 5 };
    let mut times = Vec::new();
    for _ in 0..=reps {
        b.runner.memset(pc, 0, (n * n * 4) as u64).expect("memset");
        times.push(b.run(slot, &args, &cfg).0);
    }
    times.remove(0);
    let got = b.read_f32(pc, n * n);
    let want = bgemm::tile_major(&bgemm::reference(&a, &bm));
    let max_err = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
    let (med, lo, hi) = stats(times);
    println!(
        "S3 bgemm (C = Σ_k A[k]·B[k], 64×64 f32 tiles, 4×4 output tiles, k = 4; 64 AIC GEMM + 64 AIV accumulate tasks)"
    );
    println!(
        "  per run: median {:.3} ms (min {:.3}, max {:.3}); max |error| vs host GEMM {max_err:.2e}",
        ms(med),
        ms(lo),
        ms(hi)
    );
    assert!(max_err < 1e-2, "bgemm result differs from the host GEMM");
}

// ----- idle CPU -----

fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

fn idle_cpu(quick: bool) {
    let mut b = Bench::new();
    let c = ChipCallable::native(noop_orch, |_| OrchConfig { expected_arg_count: 3 })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(NOOP, unsafe { CoreCallable::native(vec![], noop) })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(NOOP_INOUT, unsafe { CoreCallable::native(vec![ArgDirection::InOut], noop) })
        .build()
        .expect("callable");
    let slot = b.runner.register_callable(&c).expect("register");
    let (_, t) = b.device_f32(&[0.0; 16], &[16]);
    let mut args = TaskArgs::new();
    args.add_inout(t).and_then(|a| a.add_scalar(100)).and_then(|a| a.add_scalar(0)).expect("args");
    b.run(slot, &args, &CallConfig::builder().block_dim(8).build().expect("config"));
    let idle = if quick { Duration::from_millis(100) } else { Duration::from_secs(1) };
    let before = process_cpu();
    std::thread::sleep(idle);
    let used = process_cpu().saturating_sub(before);
    let s = b.runner.stats();
    println!(
        "Idle CPU: {} simulated threads alive, {} parked; process CPU time over an idle {:.1} s: {} ms",
        s.sim_threads_alive,
        s.sim_threads_parked,
        idle.as_secs_f64(),
        used.as_millis()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--test");
    // Workload names select a subset (`-- s2 idle`); flags such as cargo's `--bench` are not
    // names.
    let names: Vec<&str> =
        args.iter().map(String::as_str).filter(|a| !a.starts_with("--")).collect();
    let wanted = |name: &str| names.is_empty() || names.contains(&name);
    if wanted("s1") {
        s1(quick);
    }
    if wanted("s2") {
        s2(quick);
    }
    if wanted("s3") {
        s3(quick);
    }
    if wanted("idle") {
        idle_cpu(quick);
    }
    if wanted("s5") {
        s5(quick);
    }
}
