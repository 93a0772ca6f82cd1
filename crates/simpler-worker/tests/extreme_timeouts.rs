//! Timeouts at their extremes (zero, one nanosecond, `Duration::MAX`) are valid settings: a
//! worker started, waited on or closed with one works, never overflows a deadline and never hangs.

mod common;

use std::time::Duration;

use common::{bounded, host, one_sub_task};

#[test]
fn wait_timeout_with_duration_max_waits_without_a_deadline() {
    let mut b = host().sub_workers(1);
    let h = b.register_host("noop", |_| Ok(()));
    let w = b.start().expect("start");
    let rh = w.submit(one_sub_task(h)).expect("submit");
    let r = bounded("wait_timeout(MAX)", move || rh.wait_timeout(Duration::MAX).map(|r| r.is_ok()));
    assert_eq!(r, Ok(Some(true)));
    w.close().expect("close");
}

#[test]
fn an_alloc_timeout_of_zero_one_nanosecond_or_duration_max_starts_runs_and_closes() {
    for timeout in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
        let r = bounded("alloc_timeout", move || {
            let mut b = host().sub_workers(1).alloc_timeout(timeout);
            let h = b.register_host("noop", |_| Ok(()));
            let w = b.start().expect("start");
            let rh = w.submit(one_sub_task(h)).expect("submit");
            let done = rh.wait().is_ok();
            done && w.close().is_ok()
        });
        assert_eq!(r, Ok(true), "alloc_timeout {timeout:?}");
    }
}

#[test]
fn close_timeout_with_duration_max_closes_without_a_deadline() {
    let r = bounded("close_timeout(MAX)", || {
        let w = host().start().expect("start");
        w.close_timeout(Duration::MAX).is_ok()
    });
    assert_eq!(r, Ok(true));
}

#[test]
fn start_with_a_duration_max_startup_timeout_starts() {
    let r = bounded("start with startup_timeout(MAX)", || {
        let w = host().chips(&[0]).startup_timeout(Duration::MAX).start().expect("start");
        w.close().is_ok()
    });
    assert_eq!(r, Ok(true));
    let r = bounded("composite start with startup_timeout(MAX)", || {
        let mut l4 = simpler_worker::Worker::composite(4).startup_timeout(Duration::MAX);
        l4.child(host().startup_timeout(Duration::MAX)).expect("child");
        l4.start().expect("start").close().is_ok()
    });
    assert_eq!(r, Ok(true));
}
