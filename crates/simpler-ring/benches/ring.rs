//! Steady-state cost of one allocation plus its release: slot-only, and with a 1 KiB slab.

// The criterion macros generate undocumented public functions.
#![allow(missing_docs)]

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use simpler_ring::{Ring, RingConfig};
use simpler_types::SlotId;

/// A payload of realistic size, so entries do not all share one cache line.
#[derive(Default)]
struct Payload {
    _words: [u64; 16],
}

fn bench_alloc_release(c: &mut Criterion) {
    let mut group = c.benchmark_group("ring");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));

    let slot_only: Ring<Payload> =
        Ring::new(RingConfig { heap_bytes_per_ring: 0, ..RingConfig::default() }).unwrap();
    group.bench_function("slot_only_alloc_release", |b| {
        b.iter(|| {
            let a = slot_only.alloc(0, 0).unwrap();
            black_box(slot_only.release(black_box(a.slot)));
        })
    });

    let heap: Ring<Payload> =
        Ring::new(RingConfig { heap_bytes_per_ring: 64 << 20, ..RingConfig::default() }).unwrap();
    // Keep a window of 16 live slabs and release the oldest after each allocation: the steady
    // state of a run is a moving FIFO window that wraps, not a ring that drains every time.
    let mut live: VecDeque<SlotId> = (0..16).map(|_| heap.alloc(1024, 1).unwrap().slot).collect();
    group.bench_function("heap_1k_alloc_release", |b| {
        b.iter(|| {
            let a = heap.alloc(black_box(1024), 1).unwrap();
            live.push_back(a.slot);
            if let Some(oldest) = live.pop_front() {
                black_box(heap.release(oldest));
            }
        })
    });

    group.finish();
}

criterion_group!(benches, bench_alloc_release);
criterion_main!(benches);
