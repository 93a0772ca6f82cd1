//! The stall diagnostic (spec 30 §6.3): a group head blocked for `stall_warn_after` while an idle
//! target it reserves holds queued singles produces one warning naming the group, its busy
//! targets and the held singles. The warning comes from the scheduler thread, so this binary
//! installs a process-wide subscriber and holds this single test.

mod common;

use std::time::Duration;

use common::*;
use simpler_sched::{Engine, EngineConfig};
use simpler_types::WorkerType;

#[test]
fn a_group_blocked_while_its_idle_target_holds_singles_is_reported_once() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(capture.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let h = Harness::new();
    let e = Engine::start(EngineConfig {
        next_level: [0, 1].map(|id| Fake::boxed(WorkerType::NextLevel, id, &h, true)).into(),
        stall_warn_after: Duration::from_millis(50),
        ..EngineConfig::default()
    })
    .unwrap();
    let mut b = e.begin_run().unwrap();
    let busy = b.submit_next_level(&chip(1), args(&[]), &cfg(), w(0), None).unwrap();
    h.wait_running(busy, 0);
    let g = b.submit_next_level_group(
        &chip(1),
        vec![args(&[]), args(&[])],
        &cfg(),
        &[w(0), w(1)],
        None,
    );
    let g = g.unwrap();
    let held = b.submit_next_level(&chip(1), args(&[]), &cfg(), w(1), None).unwrap();
    eventually("the stall warning", || capture.text().contains("blocked for"));
    std::thread::sleep(Duration::from_millis(120));
    let text = capture.text();
    assert_eq!(text.matches("blocked for").count(), 1, "one warning per episode: {text}");
    for needle in [g.to_string(), held.to_string(), "next-level worker 0".to_owned()] {
        assert!(text.contains(&needle), "{needle} missing from {text}");
    }
    h.open();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
}
