//! Regressions of faults found in review: unbounded timeouts, reentrancy through a child,
//! keep-alives dropped under a lock, panics on the chip lane and attach threads. Each hang is
//! turned into a bounded failure by running the body on a thread and waiting with a generous
//! bound.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::{HANG, host};
use simpler_types::TaskArgs;
use simpler_worker::Orchestration;

/// Runs `body` on its own thread and returns its result, or `Err` naming `what` if it panicked
/// or did not finish within [`HANG`].
fn bounded<T: Send + 'static>(
    what: &str,
    body: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(body());
    });
    rx.recv_timeout(HANG).map_err(|e| format!("{what}: {e:?} (panicked or hung)"))
}

#[test]
fn wait_timeout_with_duration_max_waits_without_a_deadline() {
    let mut b = host().sub_workers(1);
    let h = b.register_host("noop", |_| Ok(()));
    let w = b.start().expect("start");
    let rh = w
        .submit(Orchestration::graph(move |g, _, _| {
            g.submit_sub(h, TaskArgs::new())?;
            Ok(())
        }))
        .expect("submit");
    let r = bounded("wait_timeout(MAX)", move || rh.wait_timeout(Duration::MAX).map(|r| r.is_ok()));
    assert_eq!(r, Ok(Some(true)));
    w.close().expect("close");
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
