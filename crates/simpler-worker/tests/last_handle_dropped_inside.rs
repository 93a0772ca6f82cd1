//! A worker whose last handle is dropped inside its own host closure or child run still closes: every
//! engine thread ends and nothing is joined from the thread that dropped it. One test function,
//! so that no other test of this binary starts threads meanwhile.

mod common;

use std::sync::{Arc, Barrier};
use std::time::Instant;

use common::{HANG, host, one_sub_task, thread_count};
use parking_lot::Mutex;
use simpler_types::{TaskArgs, WorkerId};
use simpler_worker::{Orchestration, Worker};

/// Polls the thread count until it is back at `baseline`; the bound only catches a leak.
fn settles_at(baseline: usize) -> bool {
    let give_up = Instant::now() + HANG.min(std::time::Duration::from_secs(10));
    while Instant::now() < give_up {
        if thread_count() == baseline {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    false
}

#[test]
fn dropping_the_last_handle_inside_a_host_closure_or_child_run_closes_the_worker_and_joins_its_threads()
 {
    let baseline = thread_count();
    let slot: Arc<Mutex<Option<Worker>>> = Arc::new(Mutex::new(None));
    let gate = Arc::new(Barrier::new(2));
    let (s2, g2) = (Arc::clone(&slot), Arc::clone(&gate));
    let mut b = host().chips(&[0]).sub_workers(1);
    let drop_last = b.register_host("drop_last", move |_| {
        g2.wait();
        // The last handle to the worker ends here, on one of the worker's own threads.
        drop(s2.lock().take());
        Ok(())
    });
    let w = b.start().expect("start");
    assert!(thread_count() > baseline);
    let handle = w.submit(one_sub_task(drop_last)).expect("submit");
    *slot.lock() = Some(w);
    // Nobody waits for the run: only a close can retire it.
    drop(handle);
    gate.wait();
    assert!(settles_at(baseline), "{} threads left, {baseline} before", thread_count());

    // The same from a child run: an L4's graph, running on the L4's child endpoint, drops the
    // last handle to the L4 (and with it the whole tree).
    let slot: Arc<Mutex<Option<Worker>>> = Arc::new(Mutex::new(None));
    let gate = Arc::new(Barrier::new(2));
    let (s2, g2) = (Arc::clone(&slot), Arc::clone(&gate));
    let mut l4 = Worker::composite(4);
    l4.child(host().chips(&[0]).sub_workers(1)).expect("adopt");
    let drop_parent = l4.register_graph("drop_parent", move |_, _, _| {
        g2.wait();
        drop(s2.lock().take());
        Ok(())
    });
    let w = l4.start().expect("start");
    let handle = w
        .submit(Orchestration::graph(move |g, _, _| {
            g.submit_next_level(drop_parent, TaskArgs::new(), &Default::default(), WorkerId(0))?;
            Ok(())
        }))
        .expect("submit");
    *slot.lock() = Some(w);
    drop(handle);
    gate.wait();
    assert!(settles_at(baseline), "{} threads left, {baseline} before", thread_count());
}
