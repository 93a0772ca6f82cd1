//! An L3 worker with two simulated chips and one sub worker. Each chip runs the vector
//! example's chip program `f = (a + b + 1)(a + b + 2) + (a + b)` over 16384 f32 values on its
//! own inputs; then a sub task reads both outputs back and checks them against a host
//! computation.
//!
//! Run it with `cargo run --release --example l3_two_chips [iterations]`. It prints the check
//! result and the median time per compute run (both chips) and per iteration (compute run plus
//! the verifying run), and exits non-zero if a check fails.

use std::process::ExitCode;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use simpler_device_a2a3::programs::{f32_from_le_bytes, f32_to_le_bytes, vector};
use simpler_device_a2a3::{Platform, RuntimeVariant};
use simpler_types::{CallConfig, DataType, TaskArgs, WorkerId};
use simpler_worker::{DeviceBuffer, Orchestration, Worker};

const N: usize = 16384;

/// One chip's buffers: inputs `a`, `b` and output `f`.
struct ChipBuffers {
    chip: WorkerId,
    bufs: [DeviceBuffer; 3],
    expected: Vec<f32>,
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let iterations: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    let mut builder = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph)
        .chips(&[0, 1])
        .sub_workers(1);
    let program = builder.register_chip(vector::callable()?);
    let worker = Arc::new(builder.start()?);

    // Inputs differ per chip.
    let mut chips = Vec::new();
    for chip in [WorkerId(0), WorkerId(1)] {
        let k = chip.0 as f32;
        let a: Vec<f32> = (0..N).map(|i| (i % 97) as f32 * 0.25 + k).collect();
        let b: Vec<f32> = (0..N).map(|i| 1.5 - (i % 13) as f32 * (k + 1.0)).collect();
        let mem = worker.chip_memory(chip)?;
        let bytes = (N * 4) as u64;
        let bufs = [mem.malloc(bytes)?, mem.malloc(bytes)?, mem.malloc(bytes)?];
        mem.copy_to(&bufs[0], 0, &f32_to_le_bytes(&a))?;
        mem.copy_to(&bufs[1], 0, &f32_to_le_bytes(&b))?;
        chips.push(ChipBuffers { chip, bufs, expected: vector::reference(&a, &b) });
    }
    let chips = Arc::new(chips);

    // The sub task reads both outputs back through the worker's chip memory. It holds the
    // worker weakly so that the registry does not keep the worker alive.
    let weak: Weak<Worker> = Arc::downgrade(&worker);
    let check_chips = Arc::clone(&chips);
    let verify = worker.register_host("verify", move |_| {
        let worker = weak.upgrade().ok_or("the worker is gone")?;
        for c in check_chips.iter() {
            let mut raw = vec![0u8; N * 4];
            worker.chip_memory(c.chip)?.copy_from(&c.bufs[2], 0, &mut raw)?;
            let got = f32_from_le_bytes(&raw);
            let bad = got.iter().zip(&c.expected).filter(|(g, e)| g != e).count();
            if bad > 0 {
                return Err(format!("chip {}: {bad} of {N} elements differ", c.chip).into());
            }
        }
        Ok(())
    })?;

    let mut chip_args = Vec::new();
    for c in chips.iter() {
        let mut args = TaskArgs::new();
        args.add_input(c.bufs[0].tensor(&[N as u32], DataType::Float32)?)?
            .add_input(c.bufs[1].tensor(&[N as u32], DataType::Float32)?)?
            .add_output(c.bufs[2].tensor(&[N as u32], DataType::Float32)?)?;
        chip_args.push((c.chip, args));
    }
    let chip_args = Arc::new(chip_args);

    let compute = || {
        let chip_args = Arc::clone(&chip_args);
        Orchestration::graph(move |g, _, _| {
            for (chip, args) in chip_args.iter() {
                g.submit_next_level(program, args.clone(), &CallConfig::default(), *chip)?;
            }
            Ok(())
        })
    };
    let check = || {
        Orchestration::graph(move |g, _, _| {
            g.submit_sub(verify, TaskArgs::new())?;
            Ok(())
        })
    };

    let mut compute_times = Vec::with_capacity(iterations);
    let mut iteration_times = Vec::with_capacity(iterations);
    let mut ok = true;
    for _ in 0..iterations.max(1) {
        let t0 = Instant::now();
        worker.run(compute())?;
        let t1 = Instant::now();
        if let Err(e) = worker.run(check()) {
            eprintln!("check failed: {e}");
            ok = false;
            break;
        }
        compute_times.push(t1 - t0);
        iteration_times.push(t0.elapsed());
    }
    println!(
        "l3_two_chips: {} — {} iteration(s); compute run (2 chips) median {:.3} ms; compute + verify median {:.3} ms",
        if ok { "both chips correct" } else { "MISMATCH" },
        compute_times.len(),
        median(compute_times).as_secs_f64() * 1e3,
        median(iteration_times).as_secs_f64() * 1e3,
    );
    for c in chips.iter() {
        let mem = worker.chip_memory(c.chip)?;
        for b in c.bufs {
            mem.free(b)?;
        }
    }
    worker.close()?;
    Ok(ok)
}
