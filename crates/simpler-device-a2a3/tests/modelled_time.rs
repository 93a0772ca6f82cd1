//! Modelled device time on the simulator: a kernel that declares its time on the chip delays
//! what the host sees of its run by that much, runs queued behind it start their own time after
//! it, and results stay exact (`docs/device-simulator.md`, "Modelled device time").

mod common;

use std::time::{Duration, Instant};

use common::*;
use simpler_device_a2a3::kernel::model_device_time;
use simpler_device_a2a3::programs::vector;
use simpler_device_a2a3::{DeviceRunner, RunRequest};
use simpler_types::CallConfig;

/// The time the product kernel declares: long enough that a test thread descheduled between
/// the launch and its first look still finds the run pending.
const CHIP_TIME: Duration = Duration::from_millis(400);

/// `g = d · e`, declaring [`CHIP_TIME`] on the chip.
unsafe extern "C-unwind" fn mul_declaring(args: *mut i64) {
    // SAFETY: the runtime's argument vector for the product task, passed on unchanged.
    unsafe { vector::mul(args) };
    model_device_time(CHIP_TIME);
}

fn runner(queued: bool) -> DeviceRunner {
    let opts = fast_options(0).with_pipeline_slots(4).with_device_queue(queued);
    DeviceRunner::attach(opts).unwrap()
}

#[test]
fn a_run_is_seen_complete_only_after_the_time_its_kernel_declared() {
    let mut r = runner(false);
    // SAFETY: `mul_declaring` calls the program's own product kernel, for `MUL`'s signature.
    let builder = unsafe { vector::builder_with_mul(mul_declaring) };
    let slot = r.register_callable(&builder.build().unwrap()).unwrap();
    let v = VectorRun::new(&mut r, 1024);
    let cfg = CallConfig::default();
    let launched = Instant::now();
    let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    let a = r.launch_run(p).unwrap();
    assert!(!r.poll_run(&a).unwrap(), "pending while the declared time runs");
    assert!(r.reap_run(&a, None).unwrap());
    assert!(launched.elapsed() >= CHIP_TIME, "reaped before the declared time passed");
    r.complete_run(a).unwrap();
    v.check(&mut r);
    v.free(&mut r);
    r.finalize().unwrap();
}

#[test]
fn queued_runs_take_their_declared_times_one_after_another() {
    let mut r = runner(true);
    // SAFETY: `mul_declaring` calls the program's own product kernel, for `MUL`'s signature.
    let builder = unsafe { vector::builder_with_mul(mul_declaring) };
    let slot = r.register_callable(&builder.build().unwrap()).unwrap();
    let runs: Vec<_> = [256, 1024, 64].map(|n| VectorRun::new(&mut r, n)).into();
    let cfg = CallConfig::default();
    let launched = Instant::now();
    let active: Vec<_> = runs
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let p = r.prepare(&RunRequest::new(run_id(i as u64 + 1), slot, &v.args, &cfg)).unwrap();
            r.launch_run(p).unwrap()
        })
        .collect();
    // Reaped last first: the third run's time starts after the first two runs' times.
    let mut active: Vec<_> = active.into_iter().map(Some).collect();
    for (i, at_least) in [(2, 3), (0, 1), (1, 2)] {
        let a = active[i].take().unwrap();
        assert!(r.reap_run(&a, None).unwrap());
        assert!(
            launched.elapsed() >= CHIP_TIME * at_least,
            "run {} was seen complete before {at_least} declared times had passed",
            i + 1
        );
        r.complete_run(a).unwrap();
    }
    for v in runs {
        v.check(&mut r);
        v.free(&mut r);
    }
    r.finalize().unwrap();
}
