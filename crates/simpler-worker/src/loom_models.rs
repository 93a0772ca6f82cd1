//! `loom` models of the worker's close gate, cleanup election and L2 run fence (run with
//! `RUSTFLAGS="--cfg simpler_loom" cargo test -p simpler-worker --release --lib loom`).
//!
//! Each model drives the real [`Gate`], [`Election`] or [`LaneFence`] from several threads,
//! with the worker's other work (teardown, the run's fence in the election's model, the
//! cleanup) stood in by counters and flags, and checks the protocol's promise under every
//! interleaving loom explores. A lost wake-up shows
//! as a deadlock, which loom reports.

use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

use crate::election::{Election, Turn};
use crate::gate::Gate;
use crate::lane_fence::LaneFence;
use crate::sync::{Condvar, Mutex};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// A flag one thread sets and others wait for (the run's fence in the election model).
#[derive(Default)]
struct Flag {
    set: Mutex<bool>,
    cv: Condvar,
}

impl Flag {
    fn set(&self) {
        *self.set.lock() = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut g = self.set.lock();
        while !*g {
            g = self.cv.wait(g);
        }
    }
}

/// Two closers race each other and an operation: one teardown, one shared result, and a lease
/// taken before the claim is returned before the teardown, none after it.
#[test]
fn loom_concurrent_closes_tear_down_once_and_share_the_result() {
    model(|| {
        let gate = Arc::new(Gate::<usize>::new());
        let teardowns = Arc::new(AtomicUsize::new(0));
        let leased = Arc::new(AtomicBool::new(false));
        let op_done = Arc::new(AtomicBool::new(false));
        let closer = {
            let (gate, teardowns) = (Arc::clone(&gate), Arc::clone(&teardowns));
            let (leased, op_done) = (Arc::clone(&leased), Arc::clone(&op_done));
            move || match gate.claim(|_| false, || usize::MAX, None) {
                Err(result) => result.expect("no deadline"),
                Ok(claim) => {
                    assert_eq!(claim.drain_leases(None), Ok(()));
                    if leased.load(Ordering::SeqCst) {
                        assert!(op_done.load(Ordering::SeqCst), "teardown under a lease");
                    }
                    let n = teardowns.fetch_add(1, Ordering::SeqCst) + 1;
                    claim.finish(n);
                    n
                }
            }
        };
        let a = thread::spawn(closer.clone());
        let b = thread::spawn(closer);
        if let Some(lease) = gate.lease() {
            leased.store(true, Ordering::SeqCst);
            op_done.store(true, Ordering::SeqCst);
            drop(lease);
        }
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert_eq!((a, b), (1, 1), "both closers get the one attempt's result");
        assert_eq!(teardowns.load(Ordering::SeqCst), 1);
        assert!(gate.lease().is_none(), "no lease after the close");
        assert!(gate.is_finished(|_| false));
    });
}

/// A retryable result (a drain timeout) is retried by the next closer; a final one is kept.
#[test]
fn loom_a_retryable_close_is_retried_once_and_then_final() {
    model(|| {
        let gate = Arc::new(Gate::<usize>::new());
        let attempts = Arc::new(AtomicUsize::new(0));
        let closer = {
            let (gate, attempts) = (Arc::clone(&gate), Arc::clone(&attempts));
            // The first attempt times out (result 0, retryable); later ones succeed (1).
            move || match gate.claim(|r| *r == 0, || usize::MAX, None) {
                Err(result) => result.expect("no deadline"),
                Ok(claim) => {
                    let n = attempts.fetch_add(1, Ordering::SeqCst);
                    let result = usize::from(n > 0);
                    claim.finish(result);
                    result
                }
            }
        };
        let a = thread::spawn(closer.clone());
        let b = thread::spawn(closer);
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        // Whichever closes second (parked or not) retries the timed-out attempt.
        assert!(matches!((a, b), (0, 1) | (1, 0)), "{a} {b}");
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
        assert!(gate.is_finished(|r| *r == 0));
    });
}

/// Two waiters and a third that gives up when elected (its deadline passed): exactly one
/// cleanup, both waiters get the same published result, and nobody parks for good.
#[test]
fn loom_waiters_elect_one_cleanup_and_share_its_result() {
    model(|| {
        let election = Arc::new(Election::<Arc<u32>>::new());
        let fence = Arc::new(Flag::default());
        let cleanups = Arc::new(AtomicUsize::new(0));
        let waiter = {
            let (election, fence) = (Arc::clone(&election), Arc::clone(&fence));
            let cleanups = Arc::clone(&cleanups);
            move || match election.enter(None, crate::linger::LINGER) {
                Turn::Published(r) => Some(r),
                Turn::Expired => None,
                Turn::Elected => {
                    fence.wait();
                    cleanups.fetch_add(1, Ordering::SeqCst);
                    let r = Arc::new(7);
                    drop(election.publish(Arc::clone(&r)));
                    Some(r)
                }
            }
        };
        let quitter = {
            let election = Arc::clone(&election);
            move || match election.enter(None, crate::linger::LINGER) {
                Turn::Published(_) | Turn::Expired => {}
                Turn::Elected => election.give_up(),
            }
        };
        let w = thread::spawn(waiter.clone());
        let q = thread::spawn(quitter);
        fence.set();
        let mine = waiter();
        q.join().unwrap();
        let theirs = w.join().unwrap();
        let (Some(mine), Some(theirs)) = (mine, theirs) else {
            panic!("a waiter without a deadline returned no result");
        };
        assert!(Arc::ptr_eq(&mine, &theirs), "one published result");
        assert_eq!(cleanups.load(Ordering::SeqCst), 1);
    });
}

/// The lane sets an L2 run's fence while two waiters wait for it: a waiter returns only once
/// the fence is set, then finds the lane's result (the flag is never ahead of the result), and
/// nobody parks for good.
#[test]
fn loom_a_lane_fence_waiter_returns_only_with_the_result_in_place() {
    model(|| {
        let fence = Arc::new(LaneFence::default());
        let waiter = {
            let fence = Arc::clone(&fence);
            move || {
                assert!(fence.wait(None), "a wait without a deadline returned unset");
                assert!(fence.is_set());
                fence.with_result(|r| assert!(matches!(r, Some(Ok(()))), "result not in place"));
            }
        };
        let w = thread::spawn(waiter.clone());
        let lane = {
            let fence = Arc::clone(&fence);
            thread::spawn(move || fence.set(Ok(())))
        };
        waiter();
        lane.join().unwrap();
        w.join().unwrap();
    });
}
