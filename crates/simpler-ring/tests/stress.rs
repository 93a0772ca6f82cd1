//! Multi-threaded stress: producers allocate with back-pressure on a small ring, releasers free
//! slots in scrambled order from other threads (one of them in release batches), and a final
//! shutdown wakes a blocked allocation. A ledger checks that no live slot is handed out twice,
//! live slabs never overlap, and every successful allocation is released exactly once.

mod common;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use common::{K, RING, eventually};
use simpler_ring::{HeapSpan, RingError};
use simpler_types::SlotId;

const PRODUCERS: usize = 3;
const RELEASERS: usize = 2;
const ALLOCS_PER_PRODUCER: usize = 1500;
const SIZES: [u64; 6] = [0, 100, 1024, 3000, 5000, 8192];

/// A small deterministic generator, one per thread.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn concurrent_allocations_and_releases_lose_nothing_and_never_overlap() {
    let ring = common::capped_ring(6);
    let ledger: Mutex<HashMap<SlotId, Option<HeapSpan>>> = Mutex::new(HashMap::new());
    let queue: Mutex<VecDeque<SlotId>> = Mutex::new(VecDeque::new());
    let queued = Condvar::new();
    let producers_done = AtomicUsize::new(0);
    let allocated = AtomicU64::new(0);
    let released = AtomicU64::new(0);

    std::thread::scope(|s| {
        for p in 0..PRODUCERS {
            let (ring, ledger, queue, queued) = (&ring, &ledger, &queue, &queued);
            let (producers_done, allocated) = (&producers_done, &allocated);
            s.spawn(move || {
                let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (p as u64 + 1));
                for _ in 0..ALLOCS_PER_PRODUCER {
                    let bytes = SIZES[(rng.next() % SIZES.len() as u64) as usize];
                    let depth = (rng.next() % 5) as usize;
                    let a = ring.alloc(bytes, depth).expect("allocation under back-pressure");
                    ring.slot(a.slot)
                        .expect("a fresh slot is live")
                        .value
                        .store(a.slot.pack(), Ordering::Relaxed);
                    {
                        let mut ledger = ledger.lock().unwrap();
                        if let Some(span) = a.heap {
                            for other in ledger.values().flatten() {
                                assert!(
                                    span.addr + span.len <= other.addr
                                        || other.addr + other.len <= span.addr,
                                    "{span:?} overlaps live {other:?}"
                                );
                            }
                        }
                        assert!(
                            ledger.insert(a.slot, a.heap).is_none(),
                            "{} handed out twice",
                            a.slot
                        );
                    }
                    allocated.fetch_add(1, Ordering::Relaxed);
                    queue.lock().unwrap().push_back(a.slot);
                    queued.notify_one();
                }
                producers_done.fetch_add(1, Ordering::SeqCst);
                queued.notify_all();
            });
        }
        for r in 0..RELEASERS {
            let (ring, ledger, queue, queued) = (&ring, &ledger, &queue, &queued);
            let (producers_done, released) = (&producers_done, &released);
            s.spawn(move || {
                let mut rng = XorShift(0xD1B5_4A32_D192_ED03 ^ (r as u64 + 1));
                // The second releaser returns window entries in batches of one to four,
                // flushing before it waits (the producers may be waiting for those entries).
                let mut batch = (r == 1).then(|| ring.release_batch());
                let mut batched = 0;
                loop {
                    let id = {
                        let mut q = queue.lock().unwrap();
                        loop {
                            if !q.is_empty() {
                                // Scrambled order: releases often hit a slab behind a live one.
                                let i = (rng.next() % q.len() as u64) as usize;
                                break q.swap_remove_back(i);
                            }
                            if let Some(batch) = &mut batch {
                                batch.flush();
                            }
                            if producers_done.load(Ordering::SeqCst) == PRODUCERS {
                                break None;
                            }
                            q = queued.wait_timeout(q, Duration::from_millis(10)).unwrap().0;
                        }
                    };
                    let Some(id) = id else { return };
                    let payload = ring.slot(id).expect("a queued slot is live");
                    assert_eq!(payload.value.load(Ordering::Relaxed), id.pack());
                    assert!(ledger.lock().unwrap().remove(&id).is_some());
                    let first = match &mut batch {
                        Some(batch) => batch.release(id),
                        None => ring.release(id),
                    };
                    assert!(first, "first release of {id}");
                    assert!(!ring.release(id), "second release of {id}");
                    if let Some(batch) = &mut batch {
                        batched += 1;
                        if batched > rng.next() % 4 {
                            batch.flush();
                            batched = 0;
                        }
                    }
                    released.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });

    let total = (PRODUCERS * ALLOCS_PER_PRODUCER) as u64;
    assert_eq!(allocated.load(Ordering::Relaxed), total);
    assert_eq!(released.load(Ordering::Relaxed), total);
    assert!(ledger.lock().unwrap().is_empty());
    let stats = ring.stats();
    assert_eq!((stats.window.live, stats.window.total_allocs), (0, total));
    assert!(stats.window.peak_live <= 6);
    // Entries are reused, never lost: an index a release failed to return would make the
    // window materialize more entries than it ever holds live.
    assert!(stats.window.capacity <= 6, "{} entries for at most 6 live", stats.window.capacity);
    let heap_waits: u64 = stats.heaps.iter().map(|h| h.waits).sum();
    eprintln!("window waits {}, heap waits {heap_waits}", stats.window.waits);
    assert!(stats.window.waits + heap_waits > 0, "the test must exercise back-pressure");
    for h in stats.heaps {
        assert_eq!((h.live_bytes, h.live_allocs, h.top, h.tail), (0, 0, 0, 0), "{h:?}");
        assert!(h.peak_live_bytes <= RING);
    }

    // Shutdown: a blocked allocation wakes with `Shutdown`, and live slots still release.
    let full = ring.alloc(RING, 2).unwrap();
    let small = ring.alloc(K, 0).unwrap();
    std::thread::scope(|s| {
        let waits_before = ring.stats().heaps[2].waits;
        let waiter = s.spawn(|| ring.alloc_until(K, 2, None));
        eventually("the allocation to block", || ring.stats().heaps[2].waits > waits_before);
        ring.shutdown();
        assert_eq!(waiter.join().unwrap(), Err(RingError::Shutdown));
    });
    assert_eq!(ring.alloc(0, 0), Err(RingError::Shutdown));
    assert!(ring.release(full.slot) && ring.release(small.slot));
    assert_eq!(ring.stats().window.live, 0);
    ring.reset_to_empty().unwrap();
}
