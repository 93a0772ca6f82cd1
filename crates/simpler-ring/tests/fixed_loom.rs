//! Model checks of `TaskWindowCore`'s shared retirement words under every interleaving `loom`
//! explores.
//!
//! Run with `RUSTFLAGS="--cfg simpler_loom" cargo test -p simpler-ring --release --test
//! fixed_loom`. Under that cfg the window's slot words are `loom` atomics, so `loom` sees the
//! retire CAS and the owner's reclaim load, including the weak-memory outcomes of their orderings.

#![cfg(simpler_loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use simpler_ring::fixed::{SlotWord, TaskWindowCore, WindowRetire, WindowRetirer};

fn words(n: usize) -> Arc<Vec<SlotWord>> {
    Arc::new((0..n).map(|_| SlotWord::new(0)).collect())
}

/// Reclaims until the tail has passed `target` (another thread retires the ids).
fn reclaim_up_to(window: &mut TaskWindowCore<'_>, target: u32) {
    while window.tail() != target {
        if window.reclaim() == 0 {
            thread::yield_now();
        }
    }
}

#[test]
fn a_reclaimed_slot_shows_everything_its_retirer_wrote_before_retiring() {
    loom::model(|| {
        let words = words(2);
        let output = Arc::new(AtomicU64::new(0));
        let mut window = TaskWindowCore::new(&words).unwrap();
        let id = window.try_issue().unwrap();
        let t = {
            let (words, output) = (Arc::clone(&words), Arc::clone(&output));
            thread::spawn(move || {
                // The task's result, published only by the retire.
                output.store(7, Ordering::Relaxed);
                WindowRetirer::new(&words).unwrap().retire(id)
            })
        };
        reclaim_up_to(&mut window, id + 1);
        assert_eq!(output.load(Ordering::Relaxed), 7, "reclaimed before the result was visible");
        assert_eq!(t.join().unwrap(), WindowRetire::Retired);
    });
}

#[test]
fn two_retirers_of_one_id_win_once_and_a_late_loser_leaves_the_reused_slot_alone() {
    loom::model(|| {
        let words = words(1);
        let mut window = TaskWindowCore::new(&words).unwrap();
        let first = window.try_issue().unwrap();
        let spawn_retirer = || {
            let words = Arc::clone(&words);
            thread::spawn(move || WindowRetirer::new(&words).unwrap().retire(first))
        };
        let (a, b) = (spawn_retirer(), spawn_retirer());
        reclaim_up_to(&mut window, first + 1);
        // The only slot now belongs to the next id, possibly before a loser's retire runs.
        let second = window.try_issue().unwrap();
        let outcomes = [a.join().unwrap(), b.join().unwrap()];
        let wins = outcomes.iter().filter(|&&o| o == WindowRetire::Retired).count();
        assert_eq!(wins, 1, "outcomes {outcomes:?}");
        assert!(!window.is_retired(second), "a late retire of {first} touched {second}");
        assert_eq!(window.retire(second), WindowRetire::Retired);
        assert_eq!(window.reclaim(), 1);
    });
}

/// The waiter of a [`CountWatch`] either finds its target reached when it arms, or the advance
/// that reaches it reports so: the "park" (waiting for a reported notification) always ends.
#[test]
fn a_count_watch_never_loses_the_wake_up_of_its_target() {
    use simpler_ring::fixed::{CountWatch, WakeWord};
    // Two advancers and a yielding waiter: a bound of three preemptions keeps the model to
    // seconds and still covers every order of the two fences and the arm's store.
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let words = Arc::new([WakeWord::new(0), WakeWord::new(0)]);
        let notified = Arc::new(AtomicU64::new(0));
        CountWatch::new(&words[0], &words[1]).reset();
        let advancers: Vec<_> = (0..2)
            .map(|_| {
                let (words, notified) = (Arc::clone(&words), Arc::clone(&notified));
                thread::spawn(move || {
                    if CountWatch::new(&words[0], &words[1]).advance() {
                        notified.fetch_add(1, Ordering::Release);
                    }
                })
            })
            .collect();
        let w = CountWatch::new(&words[0], &words[1]);
        if !w.arm(2) {
            while notified.load(Ordering::Acquire) == 0 {
                thread::yield_now();
            }
        }
        for a in advancers {
            a.join().unwrap();
        }
        assert!(notified.load(Ordering::Relaxed) <= 1, "one target reported twice");
    });
}

/// A consumer that entered [`Idlers`] and found no work parks only if the producer that
/// publishes work afterwards is told to wake it.
#[test]
fn idlers_never_let_a_consumer_park_past_published_work() {
    use simpler_ring::fixed::{Idlers, WakeWord};
    loom::model(|| {
        let idle = Arc::new(WakeWord::new(0));
        let work = Arc::new(AtomicU64::new(0));
        let woken = Arc::new(AtomicU64::new(0));
        let producer = {
            let (idle, work, woken) = (Arc::clone(&idle), Arc::clone(&work), Arc::clone(&woken));
            thread::spawn(move || {
                work.store(1, Ordering::Release);
                if Idlers::new(&idle).any_besides(false) {
                    woken.store(1, Ordering::Release);
                }
            })
        };
        let idlers = Idlers::new(&idle);
        idlers.enter();
        if work.load(Ordering::Acquire) == 0 {
            // Parks: only the producer's notification ends the wait.
            while woken.load(Ordering::Acquire) == 0 {
                thread::yield_now();
            }
        }
        idlers.leave();
        producer.join().unwrap();
    });
}
