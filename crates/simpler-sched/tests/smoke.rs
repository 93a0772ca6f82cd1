//! End-to-end smoke tests: the engine runs independent tasks, chains and groups to completion.

mod common;

use common::*;
use simpler_types::TensorArgType::*;

#[test]
fn independent_tasks_complete_and_the_run_releases() {
    let h = Harness::new();
    let e = engine(&[0, 1], 1, &h, false);
    let mut b = e.begin_run().unwrap();
    for i in 0..200u64 {
        let a = args(&[(buf(0x10_000 + i * 64, 64), Output)]);
        b.submit_next_level(&chip(1), a, &cfg(), w((i % 2) as u32), None).unwrap();
    }
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    let s = e.release(run).unwrap();
    assert_eq!(s.tasks, 200);
    assert_eq!(h.dispatched(), 200);
    assert_eq!(e.stats().ring.window.live, 0);
}

#[test]
fn an_inout_chain_runs_in_order() {
    let h = Harness::new();
    let e = engine(&[0, 1], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    let t = buf(0x20_000, 16);
    let mut ids = Vec::new();
    for i in 0..100u32 {
        ids.push(
            b.submit_next_level(&chip(1), args(&[(t, InOut)]), &cfg(), w(i % 2), None).unwrap(),
        );
    }
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    let order: Vec<_> = h.log().iter().map(|d| d.task).collect();
    assert_eq!(order, ids);
    e.release(run).unwrap();
}
