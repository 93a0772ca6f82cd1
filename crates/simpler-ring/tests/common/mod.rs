//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use simpler_ring::{HeapBacking, HeapRegion, Ring, RingConfig};

/// 1 KiB, the heap alignment.
pub const K: u64 = 1024;
/// Ring size used by most tests: small, so wraps and exhaustion are frequent.
pub const RING: u64 = 16 * K;

/// A payload with something to observe.
#[derive(Debug, Default)]
pub struct Payload {
    pub value: AtomicU64,
}

/// Four disjoint external regions of `size` bytes (never dereferenced by the ring).
pub fn regions(size: u64) -> [HeapRegion; 4] {
    [0u64, 1, 2, 3].map(|i| HeapRegion { base: (1 << 40) + i * (size + (1 << 20)), len: size })
}

/// A config over external regions of `size` bytes with the given timeout.
pub fn config(size: u64, timeout: Duration) -> RingConfig {
    RingConfig {
        heap_bytes_per_ring: size,
        alloc_timeout: timeout,
        max_live_slots: None,
        backing: HeapBacking::External(regions(size)),
    }
}

/// A 16 KiB-per-ring ring that never waits.
pub fn ring() -> Ring<Payload> {
    Ring::new(config(RING, Duration::ZERO)).unwrap()
}

/// A 16 KiB-per-ring ring with the given timeout.
pub fn ring_with_timeout(timeout: Duration) -> Ring<Payload> {
    Ring::new(config(RING, timeout)).unwrap()
}

/// A 16 KiB-per-ring ring of at most `slots` live slots, waiting up to 60 s.
pub fn capped_ring(slots: u32) -> Ring<Payload> {
    let config = config(RING, Duration::from_secs(60));
    Ring::new(RingConfig { max_live_slots: Some(slots), ..config }).unwrap()
}

/// Polls `cond` until it holds; panics after a generous bound so a bug shows as a failure, not a
/// hang. Not a timing assertion: the bound only catches hangs.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < give_up, "gave up waiting for: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}
