//! An L3 worker with two simulated chips and one sub worker. Each chip runs the vector
//! example's chip program `f = (a + b + 1)(a + b + 2) + (a + b)` over 16384 f32 values on its
//! own inputs, and in the same graph a sub task checks both outputs against a host computation.
//! Inputs and outputs are [`HostBuffer`]s: each chip's lane copies the inputs to the chip and
//! the output back, and the engine runs the check after both chip tasks because its tensors
//! read what they wrote.
//!
//! Run it with `cargo run --release --example l3_two_chips [iterations] [--runtime hbg|trb]`
//! (default hbg). It prints the check
//! result and the median time per iteration (one graph: both chips, then the check), and exits
//! non-zero if a check fails.

mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Cli;
use simpler_device_a2a3::Platform;
use simpler_device_a2a3::programs::{f32_from_le_bytes, f32_to_le_bytes, vector};
use simpler_types::{CallConfig, DataType, TaskArgs, WorkerId};
use simpler_worker::{HostBuffer, Orchestration, Worker};

const N: usize = 16384;

/// One chip's buffers: inputs `a`, `b` and output `f`.
struct ChipBuffers {
    chip: WorkerId,
    bufs: [HostBuffer; 3],
    expected: Vec<f32>,
}

fn main() -> ExitCode {
    common::main_with(run)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn run(cli: &Cli) -> Result<bool, Box<dyn std::error::Error>> {
    let iterations: usize = cli.positional_or(0, 20)?;
    let mut builder = Worker::host(Platform::A2a3Sim, cli.runtime).chips(&[0, 1]).sub_workers(1);
    let program = builder.register_chip(vector::callable()?);

    // Inputs differ per chip.
    let mut chips = Vec::new();
    for chip in [WorkerId(0), WorkerId(1)] {
        let k = chip.0 as f32;
        let a: Vec<f32> = (0..N).map(|i| (i % 97) as f32 * 0.25 + k).collect();
        let b: Vec<f32> = (0..N).map(|i| 1.5 - (i % 13) as f32 * (k + 1.0)).collect();
        let bufs = [
            HostBuffer::from_bytes(&f32_to_le_bytes(&a))?,
            HostBuffer::from_bytes(&f32_to_le_bytes(&b))?,
            HostBuffer::new(N * 4)?,
        ];
        chips.push(ChipBuffers { chip, bufs, expected: vector::reference(&a, &b) });
    }
    let expected: Vec<Vec<f32>> = chips.iter().map(|c| c.expected.clone()).collect();

    // The check reads each output it is given (tensor i is chip i's `f`); a mismatch fails the
    // task and with it the run.
    let verify = builder.register_host("verify", move |args| {
        for (i, want) in expected.iter().enumerate() {
            let out = args.tensor(i).and_then(HostBuffer::of_tensor).ok_or("no output buffer")?;
            let got = f32_from_le_bytes(&out.to_vec());
            let bad = got.iter().zip(want).filter(|(g, e)| g != e).count();
            if bad > 0 {
                return Err(format!("chip {i}: {bad} of {N} elements differ").into());
            }
        }
        Ok(())
    });
    let worker = builder.start()?;

    let shape = [N as u32];
    let mut chip_args = Vec::new();
    let mut check_args = TaskArgs::new();
    for c in &chips {
        let mut args = TaskArgs::new();
        args.add_input(c.bufs[0].tensor(&shape, DataType::Float32)?)?
            .add_input(c.bufs[1].tensor(&shape, DataType::Float32)?)?
            .add_output(c.bufs[2].tensor(&shape, DataType::Float32)?)?;
        chip_args.push((c.chip, args));
        check_args.add_input(c.bufs[2].tensor(&shape, DataType::Float32)?)?;
    }
    let chip_args = Arc::new(chip_args);

    let compute_then_check = || {
        let chip_args = Arc::clone(&chip_args);
        let check_args = check_args.clone();
        Orchestration::graph(move |g, _, _| {
            for (chip, args) in chip_args.iter() {
                g.submit_next_level(program, args.clone(), &CallConfig::default(), *chip)?;
            }
            g.submit_sub(verify, check_args.clone())?;
            Ok(())
        })
    };

    let mut iteration_times = Vec::with_capacity(iterations);
    let mut ok = true;
    for _ in 0..iterations.max(1) {
        // Clear the outputs so that each iteration checks what this run wrote.
        for c in &chips {
            c.bufs[2].with_bytes(|b| b.fill(0));
        }
        let t0 = Instant::now();
        if let Err(e) = worker.run(compute_then_check()) {
            if let Some(refused) = common::refusal(cli.runtime, &e) {
                return Err(refused.into());
            }
            // Only the check's own failure is a wrong result; any other failure (a chip fault,
            // a timeout, a staging error) is an error of the run, reported as such.
            let mismatch = matches!(&e, simpler_worker::WorkerError::Run(r)
                if r.frames().iter().any(|f| f.callable.as_deref() == Some("verify")));
            if !mismatch {
                return Err(e.into());
            }
            eprintln!("check failed: {e}");
            ok = false;
            break;
        }
        iteration_times.push(t0.elapsed());
    }
    println!(
        "l3_two_chips: {} — {} iteration(s); compute (2 chips) + check in one graph, median {:.3} ms",
        if ok { "both chips correct" } else { "MISMATCH" },
        iteration_times.len(),
        median(iteration_times).as_secs_f64() * 1e3,
    );
    worker.close()?;
    Ok(ok)
}
