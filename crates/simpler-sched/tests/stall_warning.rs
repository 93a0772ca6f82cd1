//! The stall diagnostic (`docs/engine-protocols.md` §6): a group head blocked for `stall_warn_after` while an idle
//! target it reserves holds queued singles produces one warning per episode, naming the group,
//! its busy targets and the held singles. The warning comes from the scheduler thread, so this
//! binary installs one process-wide subscriber and runs its tests one at a time, each reading
//! only what was logged after it started.

mod common;

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use common::*;
use simpler_sched::{Engine, EngineConfig};
use simpler_types::TensorArgType::*;
use simpler_types::WorkerType;

const X: u64 = 0x10_0000;

/// The shared log capture, installed once, and a guard that serialises the tests.
fn capture() -> (&'static Capture, MutexGuard<'static, ()>) {
    static CAPTURE: OnceLock<Capture> = OnceLock::new();
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let capture = CAPTURE.get_or_init(|| {
        let capture = Capture::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(capture.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        capture
    });
    (capture, guard)
}

fn stall_engine(h: &std::sync::Arc<Harness>, workers: &[u32]) -> Engine {
    Engine::start(EngineConfig {
        next_level: workers
            .iter()
            .map(|&id| Fake::boxed(WorkerType::NextLevel, id, h, true))
            .collect(),
        stall_warn_after: Duration::from_millis(50),
        ..EngineConfig::default()
    })
    .unwrap()
}

#[test]
fn a_group_blocked_while_its_idle_target_holds_singles_is_reported_once() {
    let (capture, _serial) = capture();
    let start = capture.text().len();
    let log = || capture.text()[start..].to_owned();

    let h = Harness::new();
    let e = stall_engine(&h, &[0, 1]);
    let mut b = e.begin_run().unwrap();
    let busy = noop_on(&mut b, 0).unwrap();
    h.wait_running(busy, 0);
    let g = noop_group_on(&mut b, [0, 1]);
    let g = g.unwrap();
    let held = noop_on(&mut b, 1).unwrap();
    eventually("the stall warning", || log().contains("blocked for"));
    // A negative check: had a second warning been due for this episode, it would have come
    // after another `stall_warn_after`, well within this wait.
    std::thread::sleep(Duration::from_millis(120));
    let text = log();
    assert_eq!(text.matches("blocked for").count(), 1, "one warning per episode: {text}");
    for needle in [g.to_string(), held.to_string(), "next-level worker 0".to_owned()] {
        assert!(text.contains(&needle), "{needle} missing from {text}");
    }
    h.open();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
}

#[test]
fn a_stall_episode_opening_as_a_reported_one_ends_is_reported_too() {
    let (capture, _serial) = capture();
    let start = capture.text().len();
    let log = || capture.text()[start..].to_owned();

    let h = Harness::new();
    let e = stall_engine(&h, &[0, 1, 2]);
    let mut b = e.begin_run().unwrap();
    let first = b.submit_next_level(&chip(1), args(&[(buf(X, 64), Output)]), &cfg(), w(0), None);
    let first = first.unwrap();
    h.wait_running(first, 0);
    let pair = || vec![args(&[]), args(&[])];
    let g1 = b.submit_next_level_group(&chip(1), pair(), &cfg(), &[w(0), w(1)], None).unwrap();
    // Episode 1: g1 waits for worker 0 while idle worker 1 holds a single.
    noop_on(&mut b, 1).unwrap();
    let g2 = b.submit_next_level_group(&chip(1), pair(), &cfg(), &[w(1), w(2)], None).unwrap();
    // Queued on worker 2 only once `first` finishes.
    let late = b.submit_next_level(&chip(1), args(&[(buf(X, 64), Input)]), &cfg(), w(2), None);
    let late = late.unwrap();
    eventually("the first stall warning", || log().contains(&g1.to_string()));
    // `first` finishing starts g1, which ends episode 1, and queues `late`, which opens
    // episode 2 in the same pass: g2 waits for worker 1 while idle worker 2 holds `late`.
    h.release(first, Action::Succeed);
    h.wait_running(g1, 1);
    eventually("the second stall warning", || log().matches("blocked for").count() == 2);
    let text = log();
    for needle in [g2.to_string(), late.to_string()] {
        assert!(text.contains(&needle), "{needle} missing from {text}");
    }
    h.open();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
}
