//! Model checks of the ring's core protocols under every interleaving `loom` explores.
//!
//! Run with `RUSTFLAGS="--cfg simpler_loom" cargo test -p simpler-ring --release --test loom`.
//! The window free list, ring locks, condition variables, generation words and the shutdown
//! flag all go through the crate's `sync` shim, so `loom` sees every synchronization the
//! protocols rely on. The entry table itself (`boxcar`) keeps its own std atomics; the tests
//! allocate entries before spawning, so its appends are ordered by the spawn.

#![cfg(simpler_loom)]

use loom::sync::Arc;
use loom::thread;
use simpler_ring::{HeapBacking, HeapRegion, Ring, RingConfig, RingError};

const K: u64 = 1024;
const SIZE: u64 = 4 * K;

fn ring(max_live_slots: Option<u32>) -> Arc<Ring<()>> {
    let regions =
        [0u64, 1, 2, 3].map(|i| HeapRegion { base: (1 << 30) + i * (1 << 20), len: SIZE });
    let config = RingConfig {
        heap_bytes_per_ring: SIZE,
        alloc_timeout: std::time::Duration::ZERO,
        max_live_slots,
        backing: HeapBacking::External(regions),
    };
    Arc::new(Ring::new(config).unwrap())
}

#[test]
fn concurrent_release_of_one_id_frees_it_exactly_once() {
    loom::model(|| {
        let ring = ring(None);
        let a = ring.try_alloc(K, 0).unwrap();
        let other = Arc::clone(&ring);
        let t = thread::spawn(move || other.release(a.slot));
        let mine = ring.release(a.slot);
        let theirs = t.join().unwrap();
        assert!(mine ^ theirs, "exactly one release wins (mine {mine}, theirs {theirs})");
        let stats = ring.stats();
        assert_eq!(stats.window.live, 0);
        assert_eq!((stats.heaps[0].live_bytes, stats.heaps[0].top, stats.heaps[0].tail), (0, 0, 0));
        let again = ring.try_alloc(SIZE, 0).unwrap();
        assert_eq!(again.slot.index, a.slot.index);
        assert_eq!(again.slot.generation, a.slot.generation + 1);
    });
}

#[test]
fn a_blocked_allocation_is_woken_by_a_release_on_its_ring() {
    loom::model(|| {
        let ring = ring(None);
        let full = ring.try_alloc(SIZE, 1).unwrap();
        let other = Arc::clone(&ring);
        let waiter = thread::spawn(move || other.alloc_until(K, 1, None));
        assert!(ring.release(full.slot));
        let got = waiter.join().unwrap().unwrap();
        assert_eq!(got.heap.unwrap().offset, 0);
    });
}

#[test]
fn a_blocked_allocation_is_woken_by_shutdown() {
    loom::model(|| {
        let ring = ring(None);
        let _full = ring.try_alloc(SIZE, 2).unwrap();
        let other = Arc::clone(&ring);
        let waiter = thread::spawn(move || other.alloc_until(K, 2, None));
        ring.shutdown();
        assert_eq!(waiter.join().unwrap(), Err(RingError::Shutdown));
    });
}

#[test]
fn an_allocation_blocked_on_a_full_window_is_woken_by_a_release() {
    loom::model(|| {
        let ring = ring(Some(1));
        let first = ring.try_alloc(0, 0).unwrap();
        let other = Arc::clone(&ring);
        let waiter = thread::spawn(move || other.alloc_until(0, 0, None));
        assert!(ring.release(first.slot));
        let got = waiter.join().unwrap().unwrap();
        assert_eq!(got.slot.index, first.slot.index);
    });
}

#[test]
fn allocations_blocked_on_a_full_window_are_woken_by_a_release_batch() {
    // Two waiters, two entries returned by one flush: both must wake (a batch notifies every
    // waiter, where a single release notifies one).
    loom::model(|| {
        let ring = ring(Some(2));
        let first = ring.try_alloc(0, 0).unwrap();
        let second = ring.try_alloc(0, 0).unwrap();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let other = Arc::clone(&ring);
                thread::spawn(move || other.alloc_until(0, 0, None))
            })
            .collect();
        let mut batch = ring.release_batch();
        assert!(batch.release(first.slot) && batch.release(second.slot));
        drop(batch);
        let mut got: Vec<u32> =
            waiters.into_iter().map(|w| w.join().unwrap().unwrap().slot.index).collect();
        got.sort_unstable();
        assert_eq!(got, vec![first.slot.index, second.slot.index]);
    });
}

#[test]
fn a_reset_racing_an_allocation_keeps_the_window_and_heap_peaks_in_step() {
    loom::model(|| {
        let ring = ring(None);
        // The entry exists before the spawn (see the module comment).
        let warm = ring.try_alloc(0, 0).unwrap();
        assert!(ring.release(warm.slot));
        ring.reset_to_empty().unwrap();
        let other = Arc::clone(&ring);
        let t = thread::spawn(move || {
            let a = other.try_alloc(K, 0).unwrap();
            assert!(other.release(a.slot));
        });
        let reset = ring.reset_to_empty();
        t.join().unwrap();
        if reset.is_ok() {
            // The allocation came wholly before the reset (both peaks back to 0) or after it
            // (both 1): never counted by one and forgotten by the other.
            let s = ring.stats();
            assert_eq!(s.window.peak_live, s.heaps[0].peak_live_allocs, "{s:?}");
        }
    });
}
