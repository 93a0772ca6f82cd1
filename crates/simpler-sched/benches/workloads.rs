//! The engine workloads P1–P6 of `docs/benchmarks-sched.md`, measured the way that page
//! reports them: for each workload the median of 5 runs after 1 warm-up, with min–max, of end-to-end µs per task, the
//! orchestration (submit) µs per task, the drain µs per task for gated variants, allocations
//! per task inside the timed window (a counting global allocator over every thread), context
//! switches per task of all threads (from `/proc/self/task/*/status`: voluntary ones are parks
//! and yields that gave the CPU away, involuntary ones preemptions), and the process's peak
//! resident memory (reset before each workload; the task window keeps its capacity across
//! workloads, so only the first workload's figure is its own). The header and the last line give
//! the round trip of a cache line between two threads, the floor of every cross-thread hand-off,
//! which on a virtual machine changes with where the host places the vCPUs.
//!
//! `cargo bench -p simpler-sched --bench workloads [-- NAME]` runs everything (or the workloads
//! whose name contains NAME); `-- --test` runs each workload once at a tiny size.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use common::{Harness, P6_SIZES, Timing, Workload, fit_line};

/// Counts every allocation (and reallocation) of the process, on every thread.
struct Counting;

/// Allocations since start. Relaxed: a statistic read after the threads it counts have
/// synchronized with the reader through the engine's own fence.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract holds exactly as it does for `System`; counting touches no memory
// the allocator hands out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; `ptr` came from this allocator, which is `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` came from this allocator, which is `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Resets the kernel's peak-RSS mark for this process (Linux ≥ 4.0); harmless elsewhere.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Peak resident set size in MiB (`VmHWM`), if the platform reports it.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Context switches of every thread of this process so far: `(voluntary, involuntary)`.
/// Voluntary ones are parks (futex waits) and yields that gave the CPU away; involuntary ones
/// are preemptions, which on a shared machine mostly measure other tenants.
fn context_switches() -> (u64, u64) {
    let mut total = (0, 0);
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return total };
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else { continue };
        for line in status.lines() {
            let value = || line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok());
            if line.starts_with("voluntary_ctxt_switches:") {
                total.0 += value().unwrap_or(0);
            } else if line.starts_with("nonvoluntary_ctxt_switches:") {
                total.1 += value().unwrap_or(0);
            }
        }
    }
    total
}

/// Median, minimum and maximum of `values`.
fn stats(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn show(values: &[f64], digits: usize) -> String {
    let (med, min, max) = stats(values);
    format!("{med:.digits$} ({min:.digits$}–{max:.digits$})")
}

/// Per-task figures of `samples`, in µs (or allocations).
fn per_task(samples: &[Timing], f: impl Fn(&Timing) -> f64) -> Vec<f64> {
    samples.iter().map(|t| f(t) / t.tasks as f64).collect()
}

struct Plan {
    warmups: usize,
    samples: usize,
    quick: bool,
}

fn measure(h: &Harness, plan: &Plan, name: &str, workload: Workload, gated: bool) {
    reset_peak_rss();
    let mut switches = Vec::new();
    let samples: Vec<Timing> = (0..plan.warmups + plan.samples)
        .map(|_| {
            let before = context_switches();
            let t = h.run_probed(workload, gated, &allocations);
            let after = context_switches();
            switches.push((after.0 - before.0, after.1 - before.1));
            t
        })
        .skip(plan.warmups)
        .collect();
    let switches = &switches[plan.warmups..];
    let tasks = workload.tasks() as f64;
    let voluntary: Vec<f64> = switches.iter().map(|s| s.0 as f64 / tasks).collect();
    let involuntary: Vec<f64> = switches.iter().map(|s| s.1 as f64 / tasks).collect();
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
    let e2e = per_task(&samples, |t| us(t.e2e));
    let submit = per_task(&samples, |t| us(t.submit));
    let drain = if gated {
        show(&per_task(&samples, |t| t.drain.map_or(0.0, us)), 3)
    } else {
        "—".to_owned()
    };
    let allocs = per_task(&samples, |t| t.probed as f64);
    let rss = peak_rss_mib().map_or("?".to_owned(), |m| format!("{m:.0}"));
    println!(
        "| {name} | {} | {} | {} | {} | {} | {} / {} | {rss} |",
        workload.tasks(),
        show(&e2e, 3),
        show(&submit, 3),
        drain,
        show(&allocs, 4),
        show(&voluntary, 3),
        show(&involuntary, 3),
    );
    if let Workload::Diamonds { reps, .. } = workload {
        let ms: Vec<f64> =
            samples.iter().map(|t| t.e2e.as_secs_f64() * 1e3 / reps as f64).collect();
        println!("|   (P3 per diamond) | | {} ms | | | | | |", show(&ms, 3));
    }
}

/// P6: per-run fixed cost. Each sample times many runs of every size and fits a + b·tasks.
fn measure_p6(h: &Harness, plan: &Plan) {
    reset_peak_rss();
    let runs_of = |n: u64| if plan.quick { 2 } else { (4096 / n).max(64) };
    let mut a_values = Vec::new();
    let mut b_values = Vec::new();
    let mut per_size: Vec<Vec<f64>> = vec![Vec::new(); P6_SIZES.len()];
    let mut allocs_per_run: Vec<Vec<f64>> = vec![Vec::new(); P6_SIZES.len()];
    for sample in 0..plan.warmups + plan.samples {
        let mut points = Vec::new();
        for (k, &n) in P6_SIZES.iter().enumerate() {
            let runs = runs_of(n);
            let before = allocations();
            let start = Instant::now();
            for _ in 0..runs {
                h.run(Workload::Independent { tasks: n }, false);
            }
            let per_run = start.elapsed().as_secs_f64() * 1e6 / runs as f64;
            let allocs = (allocations() - before) as f64 / runs as f64;
            points.push((n as f64, per_run));
            if sample >= plan.warmups {
                per_size[k].push(per_run);
                allocs_per_run[k].push(allocs);
            }
        }
        if sample >= plan.warmups {
            let (a, b) = fit_line(&points);
            a_values.push(a);
            b_values.push(b);
        }
    }
    let rss = peak_rss_mib().map_or("?".to_owned(), |m| format!("{m:.0}"));
    println!();
    println!("P6 (runs of independent 1-byte-Output tasks, begin → release), peak RSS {rss} MiB:");
    println!("| tasks per run | µs per run | allocations per run |");
    println!("|---|---|---|");
    for (k, n) in P6_SIZES.iter().enumerate() {
        println!("| {n} | {} | {} |", show(&per_size[k], 2), show(&allocs_per_run[k], 1));
    }
    println!("fit: a = {} µs per run, b = {} µs per task", show(&a_values, 2), show(&b_values, 3));
}

/// Median nanoseconds of one round trip of a cache line between two spinning threads (usually
/// on two CPUs): what every cross-thread hand-off of the engine pays at least. On a virtual
/// machine it changes with where the host places the vCPUs (50–150 ns or 350–380 ns on the
/// development machine), and every engine's figures move with it, so the header reports it at
/// the start and at the end.
fn cross_thread_round_trip_ns(quick: bool) -> f64 {
    const BATCHES: u64 = 4;
    let trips: u64 = if quick { 500 } else { 20_000 };
    let wait_for = |flag: &AtomicU64, value: u64| {
        let mut spins = 0u32;
        while flag.load(Ordering::Acquire) != value {
            spins += 1;
            if spins.is_multiple_of(1024) {
                // Both threads on one CPU: let the other one run.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    };
    let flag = AtomicU64::new(0);
    let mut batches: Vec<f64> = std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..trips * BATCHES {
                wait_for(&flag, 2 * i + 1);
                flag.store(2 * i + 2, Ordering::Release);
            }
        });
        // The first batch is a warm-up: a new thread starts on its parent's CPU and is moved
        // to the other one by the kernel's balancing only after a while.
        (0..BATCHES)
            .map(|b| {
                let start = Instant::now();
                for i in b * trips..(b + 1) * trips {
                    flag.store(2 * i + 1, Ordering::Release);
                    wait_for(&flag, 2 * i + 2);
                }
                start.elapsed().as_secs_f64() * 1e9 / trips as f64
            })
            .skip(1)
            .collect()
    });
    batches.sort_by(f64::total_cmp);
    batches[batches.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--test");
    let filter = args.iter().find(|a| !a.starts_with("--")).cloned();
    // A filter naming a workload exactly selects it alone; otherwise it is a substring.
    let names = ["P1", "P1 gated", "P1a", "P2", "P2 gated", "P3", "P6", "P1 idle SUB"];
    let wanted = |name: &str| {
        filter
            .as_deref()
            .is_none_or(|f| if names.contains(&f) { name == f } else { name.contains(f) })
    };
    // `SIMPLER_BENCH_SAMPLES=N` takes N samples instead of 5 (e.g. 1 and 6 under callgrind:
    // the difference is the instruction count of five steady-state runs).
    let samples = std::env::var("SIMPLER_BENCH_SAMPLES").ok().and_then(|v| v.parse().ok());
    let plan = if quick {
        Plan { warmups: 0, samples: 1, quick }
    } else {
        Plan { warmups: 1, samples: samples.unwrap_or(5).max(1), quick }
    };
    let (p1, p2, reps, width) = if quick { (200, 200, 2, 16) } else { (100_000, 10_000, 20, 1000) };
    let workloads = [
        ("P1", Workload::Independent { tasks: p1 }, false),
        ("P1 gated", Workload::Independent { tasks: p1 }, true),
        ("P1a", Workload::Bare { tasks: p1 }, false),
        ("P2", Workload::Chain { tasks: p2 }, false),
        ("P2 gated", Workload::Chain { tasks: p2 }, true),
        ("P3", Workload::Diamonds { reps, width }, false),
    ];

    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or_default().trim().to_owned())
        })
        .unwrap_or_default();
    println!(
        "simpler-sched workloads: {cpus} CPUs ({model}); median of {} after {} warm-up; \
         cross-thread round trip {:.0} ns",
        plan.samples,
        plan.warmups,
        cross_thread_round_trip_ns(quick)
    );
    println!();
    println!(
        "| Workload | tasks | e2e µs/task | submit µs/task | drain µs/task | allocations/task \
         | context switches/task (voluntary / involuntary) | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let h = Harness::start();
    for (name, workload, gated) in workloads {
        if wanted(name) {
            measure(&h, &plan, name, workload, gated);
        }
    }
    if wanted("P6") {
        measure_p6(&h, &plan);
    }
    // P1 on an engine that also has an idle SUB endpoint, whose thread stays parked.
    if wanted("P1 idle SUB") {
        drop(h);
        let h = Harness::start_with_subs(1);
        measure(&h, &plan, "P1 idle SUB", Workload::Independent { tasks: p1 }, false);
    }
    println!();
    println!("cross-thread round trip at the end: {:.0} ns", cross_thread_round_trip_ns(quick));
}
