//! Every public `Duration` option of the device crate over 0, 1 ns and `Duration::MAX`: attach
//! either accepts the value or refuses it with a typed error naming the setting, a run on an
//! accepted runner ends (with success or a typed error), and both `finalize` and `Drop` return
//! — an unrepresentable deadline means "no deadline", never a panic.

mod common;

use std::time::Duration;

use common::*;
use simpler_device_a2a3::{DeviceError, DeviceRunner, RunRequest, RunnerOptions, RuntimeVariant};
use simpler_types::CallConfig;

/// Sets one duration option.
type Setter = fn(RunnerOptions, Duration) -> RunnerOptions;

/// Every public duration option, as a setter on the test's base options.
fn options_under_test() -> Vec<(&'static str, Setter)> {
    vec![
        ("scheduler", |o, d| o.with_scheduler_timeout(d)),
        ("op_execute", |o, d| o.with_op_execute_timeout(d)),
        ("stream_sync", |o, d| o.with_stream_sync_timeout(d)),
        ("shutdown_ack", |o, d| o.with_shutdown_budget(d)),
        ("init_sync", |mut o, d| {
            o.budgets.init_sync = d;
            o
        }),
        ("tensor_wait", |mut o, d| {
            o.budgets.tensor_wait = d;
            o
        }),
        ("collector_idle", |mut o, d| {
            o.budgets.collector_idle = d;
            o
        }),
        ("join_budget", |mut o, d| {
            o.sim.join_budget = d;
            o
        }),
    ]
}

/// The base: every budget generous, so only the option under test is extreme.
fn base() -> RunnerOptions {
    let mut o = RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph)
        .with_scheduler_timeout(Duration::from_millis(5_000))
        .with_op_execute_timeout(Duration::from_micros(10_000_000))
        .with_stream_sync_timeout(Duration::from_millis(30_000));
    o.sim.join_budget = Duration::from_secs(10);
    o
}

fn one_vector_run(r: &mut DeviceRunner) -> Result<(), DeviceError> {
    let slot = r.register_callable(&vector_callable())?;
    let v = VectorRun::new(r, 256);
    let res = r.run(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default()));
    if res.is_ok() {
        v.check(r);
    }
    res.map(drop)
}

#[test]
fn every_public_duration_option_accepts_or_refuses_zero_one_nanosecond_and_max_without_panicking() {
    for (name, set) in options_under_test() {
        for value in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
            for end_by_drop in [false, true] {
                let what = format!(
                    "{name} = {value:?}, ended by {}",
                    ["finalize", "drop"][usize::from(end_by_drop)]
                );
                let mut r = match DeviceRunner::attach(set(base(), value)) {
                    Ok(r) => r,
                    Err(DeviceError::InvalidConfig { setting, .. }) => {
                        assert!(setting.contains(name), "{what}: refused as {setting}");
                        continue;
                    }
                    Err(e) => panic!("{what}: attach failed with {e}"),
                };
                // A budget this small may fail the run; it must end with a typed error.
                let _ = one_vector_run(&mut r);
                if end_by_drop {
                    drop(r);
                } else {
                    r.finalize().unwrap_or_else(|e| panic!("{what}: finalize failed with {e}"));
                }
            }
        }
    }
}
