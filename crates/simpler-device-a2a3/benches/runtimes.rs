//! The chip runtimes side by side (results in `docs/benchmarks-device.md`):
//!
//! - S4, the streaming graph (`programs::streaming`): 10 000, 100 000 and 1 000 000 tasks,
//!   independent and in chains of 100, per-task host time of `run()` and the process's resident
//!   memory after each size (current and peak, from `/proc/self/status`). tensormap_and_ringbuffer
//!   streams it through a 1024-slot window and 1 MiB of heap per ring; host_build_graph holds the
//!   whole graph, so its window is sized to the task count (the contrast is the point: its
//!   memory grows with the graph), up to 100 000 tasks.
//! - S5, S1 (the vector example) and S3 (bgemm) under both runtimes in one invocation, in
//!   alternating rounds: cold and warm per-run times, the trb/hbg ratio of the warm medians, and
//!   whether the two runtimes' outputs are equal bit for bit.
//!
//! A runtime that refuses runs (`Unsupported`) is reported as refused and skipped, so the bench
//! covers trb as soon as the simulator runs it. `cargo bench -p simpler-device-a2a3 --bench
//! runtimes` runs both; `-- s4` or `-- s5` selects one; `-- --test` runs each once at a small
//! size (what CI uses to check that the bench still works). `SIMPLER_BENCH_S4_MAX` caps the S4
//! task count (default 1 000 000); `SIMPLER_BENCH_S4=trbi` (runtime, then `i` independent or
//! `c` chains) runs one S4 variant only, e.g. under a profiler.

use std::time::{Duration, Instant};

use simpler_device_a2a3::programs::{bgemm, f32_from_le_bytes, f32_to_le_bytes, streaming, vector};
use simpler_device_a2a3::{
    ChipCallable, ChipSlot, DeviceError, DevicePtr, DeviceRunner, RingDefaults, RunRequest,
    RunnerOptions, RuntimeVariant,
};
use simpler_types::{CallConfig, DataType, RunId, TaskArgs, Tensor, TensorArgType};

/// Lanes of the streaming output.
const LANES: usize = 64;

/// The largest S4 graph host_build_graph is asked to hold.
const HBG_MAX_TASKS: u64 = 100_000;

struct Chip {
    runtime: RuntimeVariant,
    runner: DeviceRunner,
    next_run: u64,
}

impl Chip {
    fn attach(runtime: RuntimeVariant, rings: RingDefaults) -> Chip {
        // A million-task run takes seconds; the default stream-sync budget would cut it short.
        let mut o =
            RunnerOptions::sim(0, runtime).with_stream_sync_timeout(Duration::from_secs(600));
        o.rings = rings;
        Chip { runtime, runner: DeviceRunner::attach(o).expect("attach"), next_run: 1 }
    }

    fn run(&mut self, slot: ChipSlot, args: &TaskArgs) -> Result<Duration, DeviceError> {
        let id = RunId::from_raw(self.next_run).expect("run id");
        self.next_run += 1;
        let t0 = Instant::now();
        self.runner.run(&RunRequest::new(id, slot, args, &CallConfig::default()))?;
        Ok(t0.elapsed())
    }

    fn upload(&mut self, values: &[f32], shape: &[u32]) -> (DevicePtr, Tensor) {
        let bytes = f32_to_le_bytes(values);
        let p = self.runner.malloc(bytes.len() as u64).expect("malloc");
        self.runner.copy_to_device(p, &bytes).expect("copy");
        let t = Tensor::external(p.addr(), shape, DataType::Float32).expect("tensor");
        (p, t.child_memory(true))
    }

    fn download(&mut self, p: DevicePtr, n: usize) -> Vec<f32> {
        let mut b = vec![0u8; n * 4];
        self.runner.copy_from_device(&mut b, p).expect("copy back");
        f32_from_le_bytes(&b)
    }

    fn name(&self) -> &'static str {
        self.runtime.short_name()
    }
}

/// Whether `e` says the runtime refuses runs (the bench then skips it).
fn refused(e: &DeviceError) -> bool {
    matches!(e, DeviceError::Unsupported { .. })
}

/// `VmRSS` and `VmHWM` of this process in MiB.
fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ----- S4: the streaming graph -----

fn s4(quick: bool) {
    let max: u64 = std::env::var("SIMPLER_BENCH_S4_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let sizes: Vec<u64> = if quick {
        vec![1_000]
    } else {
        [10_000, 100_000, 1_000_000].into_iter().filter(|&n| n <= max).collect()
    };
    println!("S4 streaming graph (lanes {LANES}; host time of run() / tasks; RSS after the run)");
    'runtime: for runtime in RuntimeVariant::ALL {
        for chain_len in [1, streaming::CHAIN] {
            let shape = if chain_len == 1 { "independent" } else { "chains of 100" };
            let variant =
                format!("{}{}", runtime.short_name(), if chain_len == 1 { 'i' } else { 'c' });
            if std::env::var("SIMPLER_BENCH_S4").is_ok_and(|only| only != variant) {
                continue;
            }
            for &tasks in &sizes {
                if runtime == RuntimeVariant::HostBuildGraph && tasks > HBG_MAX_TASKS {
                    println!(
                        "  hbg {shape:<13} {tasks:>9} tasks: not run (a resident graph of this size only shows more growth)"
                    );
                    continue;
                }
                let rings = match runtime {
                    RuntimeVariant::HostBuildGraph => RingDefaults {
                        task_window: tasks.next_power_of_two().max(4) as u32,
                        ..RingDefaults::default()
                    },
                    _ => RingDefaults {
                        task_window: 1024,
                        heap_bytes: 1 << 20,
                        ..RingDefaults::default()
                    },
                };
                let mut chip = Chip::attach(runtime, rings);
                let slot = chip
                    .runner
                    .register_callable(&streaming::callable().expect("callable"))
                    .expect("register");
                let (p, lanes) = chip.upload(&[0.0; LANES], &[LANES as u32]);
                let args = streaming::run_args(lanes, tasks, chain_len).expect("args");
                let result = chip.run(slot, &args);
                let (rss, peak) = rss_mib();
                let name = chip.name();
                match result {
                    Ok(t) => {
                        let out = chip.download(p, LANES);
                        chip.runner.finalize().expect("finalize");
                        assert_eq!(out, streaming::reference(tasks, chain_len, LANES), "S4 result");
                        println!(
                            "  {name} {shape:<13} {tasks:>9} tasks (window {}): {:.3} µs/task; RSS {rss:.1} MiB, peak {peak:.1} MiB",
                            rings.task_window,
                            t.as_secs_f64() * 1e6 / tasks as f64,
                        );
                    }
                    Err(e) if refused(&e) => {
                        println!("  {name}: refused ({e}); skipped");
                        continue 'runtime;
                    }
                    Err(e) => panic!("S4 {name} {shape} {tasks}: {e}"),
                }
            }
        }
    }
}

// ----- S5: S1 and S3 under both runtimes -----

/// One program set up on one chip: its slot, arguments and output buffer.
struct Prepared {
    chip: Chip,
    slot: ChipSlot,
    args: TaskArgs,
    out: (DevicePtr, usize),
    times: Vec<Duration>,
    cold: Option<Duration>,
    refused: Option<String>,
}

impl Prepared {
    fn new(
        runtime: RuntimeVariant,
        callable: &ChipCallable,
        inputs: &[(Vec<f32>, TensorArgType)],
        shape: &[u32],
    ) -> Prepared {
        let mut chip = Chip::attach(runtime, RingDefaults::default());
        let slot = chip.runner.register_callable(callable).expect("register");
        let mut args = TaskArgs::new();
        let mut out = None;
        for (values, tag) in inputs {
            let (p, t) = chip.upload(values, shape);
            args.add_tensor(t, *tag).expect("argument");
            out = Some((p, values.len()));
        }
        let out = out.expect("an output");
        Prepared { chip, slot, args, out, times: Vec::new(), cold: None, refused: None }
    }

    /// One run (the first is the cold one); a refused runtime is noted and not run again.
    fn round(&mut self, reset: &[f32]) {
        if self.refused.is_some() {
            return;
        }
        let bytes = f32_to_le_bytes(reset);
        self.chip.runner.copy_to_device(self.out.0, &bytes).expect("reset");
        match self.chip.run(self.slot, &self.args) {
            Ok(t) if self.cold.is_none() => self.cold = Some(t),
            Ok(t) => self.times.push(t),
            Err(e) if refused(&e) => self.refused = Some(e.to_string()),
            Err(e) => panic!("S5 {}: {e}", self.chip.name()),
        }
    }

    fn output(&mut self) -> Option<Vec<f32>> {
        let (p, n) = self.out;
        self.refused.is_none().then(|| self.chip.download(p, n))
    }
}

fn s5_program(
    label: &str,
    callable: &ChipCallable,
    inputs: &[(Vec<f32>, TensorArgType)],
    shape: &[u32],
    expected: &dyn Fn(&[f32]) -> bool,
    runs: usize,
) {
    let reset = inputs.last().expect("an output").0.clone();
    let mut chips: Vec<Prepared> =
        RuntimeVariant::ALL.iter().map(|&r| Prepared::new(r, callable, inputs, shape)).collect();
    for _ in 0..=runs {
        for chip in &mut chips {
            chip.round(&reset);
        }
    }
    println!("  {label}");
    let mut outputs = Vec::new();
    for chip in &mut chips {
        let name = chip.chip.name();
        match (chip.output(), &chip.refused) {
            (Some(out), _) => {
                assert!(expected(&out), "S5 {label} on {name}: result differs from the host");
                println!(
                    "    {name}: cold {:.3} ms, warm median {:.3} ms over {runs} runs",
                    ms(chip.cold.unwrap_or_default()),
                    ms(median(chip.times.clone()))
                );
                outputs.push((name, out));
            }
            (None, why) => {
                println!("    {name}: refused ({}); skipped", why.as_deref().unwrap_or(""))
            }
        }
    }
    if let [(_, hbg), (_, trb)] = outputs.as_slice() {
        let warm = |i: usize| median(chips[i].times.clone()).as_secs_f64();
        let same = hbg.iter().zip(trb).all(|(a, b)| a.to_bits() == b.to_bits());
        println!(
            "    trb / hbg warm: {:.2}×; outputs equal bit for bit: {same}",
            warm(1) / warm(0)
        );
        assert!(same, "S5 {label}: the runtimes' outputs differ");
    }
    for chip in chips {
        chip.chip.runner.finalize().expect("finalize");
    }
}

fn s5(quick: bool) {
    use TensorArgType::{InOut, Input, Output};
    let runs = if quick { 2 } else { 100 };
    println!("S5 S1 and S3 under both runtimes (alternating rounds; host time of run())");
    let n = 16384;
    let a: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.25).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.5 - (i % 13) as f32).collect();
    let want = vector::reference(&a, &b);
    let inputs = [(a, Input), (b, Input), (vec![0.0; n], Output)];
    let check = move |got: &[f32]| got == want.as_slice();
    s5_program(
        "S1 vector example (16384 f32, 5 tasks)",
        &vector::callable().expect("vector"),
        &inputs,
        &[n as u32],
        &check,
        runs,
    );

    let m = bgemm::N * bgemm::N;
    let a: Vec<f32> = (0..m).map(|x| ((x * 7) % 13) as f32 * 0.125).collect();
    let b: Vec<f32> = (0..m).map(|x| ((x * 5) % 11) as f32 * 0.25).collect();
    let want = bgemm::tile_major(&bgemm::reference(&a, &b));
    let inputs =
        [(bgemm::tile_major(&a), Input), (bgemm::tile_major(&b), Input), (vec![0.0; m], InOut)];
    let scale = want.iter().fold(1f32, |s, v| s.max(v.abs()));
    let check = move |got: &[f32]| {
        got.len() == want.len() && got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-5 * scale)
    };
    let s3_runs = if quick { 1 } else { 10 };
    s5_program(
        "S3 bgemm (4×4 tiles of 64×64 f32, k = 4, 128 tasks)",
        &bgemm::callable().expect("bgemm"),
        &inputs,
        &bgemm::shape(),
        &check,
        s3_runs,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--test");
    let names: Vec<&str> =
        args.iter().map(String::as_str).filter(|a| !a.starts_with("--")).collect();
    let wanted = |name: &str| names.is_empty() || names.contains(&name);
    if wanted("s4") {
        s4(quick);
    }
    if wanted("s5") {
        s5(quick);
    }
}
