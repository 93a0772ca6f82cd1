//! Thread accounting: nothing is started lazily by the first submit, and no thread outlives a
//! dropped or closed worker. One test function, so that no other test of this binary starts
//! threads meanwhile.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{add_callable, host, one_sub_task, register_hold, thread_count, thread_count_settled};
use simpler_device_a2a3::{Platform, RuntimeVariant};
use simpler_types::TaskArgs;
use simpler_worker::{Orchestration, Worker};

fn l4_tree() -> Worker {
    let mut l4 = Worker::composite(4);
    let mut leaf = host().chips(&[0]).sub_workers(2);
    let h = leaf.register_host("leaf", |_| Ok(()));
    leaf.register_chip(add_callable(0));
    l4.child(leaf).expect("adopt");
    let g = l4.register_graph("g", move |g, _, _| {
        g.submit_sub(h, TaskArgs::new())?;
        Ok(())
    });
    let w = l4.start().expect("start");
    w.run(Orchestration::graph(move |b, _, _| {
        b.submit_next_level(g, TaskArgs::new(), &Default::default(), simpler_types::WorkerId(0))?;
        Ok(())
    }))
    .expect("run");
    w
}

#[test]
fn no_thread_is_started_by_submit_and_none_outlives_a_worker() {
    let baseline = thread_count();

    // A zero startup timeout starts nothing.
    assert!(host().chips(&[0]).startup_timeout(std::time::Duration::ZERO).start().is_err());
    assert_eq!(thread_count_settled(baseline), baseline);

    // Start-then-close with no run; the first submit starts no thread.
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    let mut b = host().chips(&[0]).sub_workers(2);
    let h = b.register_host("count", move |_| {
        c.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let w = b.start().expect("start");
    let started = thread_count();
    assert!(started > baseline);
    w.run(one_sub_task(h)).expect("run");
    assert_eq!(thread_count(), started);
    w.close().expect("close");
    assert_eq!(thread_count_settled(baseline), baseline, "close joins every thread");

    // Dropping a started worker without close joins every thread and finalizes every chip.
    let w = host().chips(&[0, 1]).sub_workers(1).start().expect("start");
    drop(w);
    assert_eq!(thread_count_settled(baseline), baseline, "drop joins every thread");

    // Dropping an L2 worker and an L4 tree.
    drop(Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph).start().expect("l2"));
    assert_eq!(thread_count_settled(baseline), baseline);
    drop(l4_tree());
    assert_eq!(thread_count_settled(baseline), baseline, "an L4 tree leaves no thread");

    // Drop without close while a run is in flight: drop drains it.
    let mut b = host().sub_workers(1);
    let (hold, gate) = register_hold(&mut b);
    let w = b.start().expect("start");
    let handle = w.submit(one_sub_task(hold)).expect("submit");
    let releaser = std::thread::spawn(move || gate.wait());
    drop(w);
    releaser.join().expect("releaser");
    assert!(handle.is_done());
    assert!(matches!(handle.result(), Some(Ok(()))));
    drop(handle);
    assert_eq!(thread_count_settled(baseline), baseline);
}
