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
