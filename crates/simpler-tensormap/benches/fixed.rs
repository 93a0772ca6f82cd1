//! The fixed-capacity map next to the host map, in the same invocation.
//!
//! Every benchmark reports the time of one operation:
//!
//! - `chain/*`: one submit of a task in a chain over one buffer (its lookup, then its insert):
//!   `in_out` is a chain of read-writes; `write_read` alternates a read-write and a read, where
//!   the fixed map also records the reader (the host map tracks writers only, so its read is a
//!   lookup alone).
//! - `keys/*`: one insert, or one lookup, over 60 000 distinct buffers, the fixed map sized as the
//!   device sizes it (65 536 entries, 4 096 buckets) and with one bucket per entry.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use simpler_tensormap::fixed::{AccessMode, FixedTensorMap, MapEntry};
use simpler_tensormap::{ByteSpan, TensorKey, TensorMap, TensorMapGuard};
use simpler_types::{RunId, SlotId};

const RUN: RunId = RunId::FIRST;
const NOTHING_RETIRED: fn(u64) -> bool = |_| false;
const KEYS: u64 = 60_000;
const POOL: usize = 65_536;

fn buffer(i: u64) -> (u64, ByteSpan) {
    let addr = 0x1_0000_0000 + 1024 * i;
    (addr, ByteSpan { start: addr, end: addr + 1024 })
}

fn slot(task: u64) -> SlotId {
    SlotId::new(task as u32, 1)
}

/// Mode of task `task` in a chain: every task, or every other one, reads and writes.
fn chain_mode(task: u64, alternate: bool) -> AccessMode {
    if alternate && task % 2 == 1 { AccessMode::Read } else { AccessMode::ReadWrite }
}

fn chain(c: &mut Criterion) {
    let mut group = c.benchmark_group("chain");
    group.sample_size(20).warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    let (addr, span) = buffer(0);
    for (name, alternate) in [("in_out", false), ("write_read", true)] {
        group.bench_function(format!("{name}/fixed"), |b| {
            let mut entries = vec![MapEntry::<u64>::default(); 16];
            let mut buckets = vec![0u32; 16];
            let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
            let mut task = 0u64;
            b.iter(|| {
                task += 1;
                let mode = chain_mode(task, alternate);
                map.lookup(&addr, span, mode, NOTHING_RETIRED, |p| {
                    black_box(p);
                });
                black_box(map.insert(addr, span, mode, task, NOTHING_RETIRED).unwrap());
            });
        });
        group.bench_function(format!("{name}/host"), |b| {
            let map = TensorMap::with_capacity(16);
            let key = TensorKey::Host { addr };
            let mut task = 0u64;
            b.iter(|| {
                task += 1;
                let mut guard = map.lock();
                guard.lookup_overlapping(RUN, &key, span, |p| {
                    black_box(p);
                });
                if chain_mode(task, alternate) != AccessMode::Read {
                    black_box(guard.insert(RUN, key, span, slot(task)));
                }
            });
        });
    }
    group.finish();
}

/// Times `iters` operations, each `op(map, i)` for `i` cycling over the keys; `refill` runs
/// untimed whenever a pass over the keys completes.
fn cycle<M>(
    iters: u64,
    map: &mut M,
    mut refill: impl FnMut(&mut M),
    mut op: impl FnMut(&mut M, u64),
) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        refill(map);
        let n = (iters - done).min(KEYS);
        let start = Instant::now();
        for i in 0..n {
            op(map, i);
        }
        total += start.elapsed();
        done += n;
    }
    total
}

fn keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("keys");
    group.sample_size(10).warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    for buckets in [4_096usize, POOL] {
        let mut entries = vec![MapEntry::<u64>::default(); POOL];
        let mut bucket_array = vec![0u32; buckets];
        let mut map = FixedTensorMap::new(&mut entries, &mut bucket_array).unwrap();
        let fill = |map: &mut FixedTensorMap<'_, u64>| {
            map.clear();
            for i in 0..KEYS {
                let (addr, span) = buffer(i);
                map.insert(addr, span, AccessMode::Write, i, NOTHING_RETIRED).unwrap();
            }
        };
        group.bench_function(format!("insert/fixed_{buckets}_buckets"), |b| {
            b.iter_custom(|iters| {
                let op = |map: &mut FixedTensorMap<'_, u64>, i| {
                    let (addr, span) = buffer(i);
                    black_box(map.insert(addr, span, AccessMode::Write, i, NOTHING_RETIRED)).ok();
                };
                cycle(iters, &mut map, FixedTensorMap::clear, op)
            });
        });
        fill(&mut map);
        group.bench_function(format!("lookup/fixed_{buckets}_buckets"), |b| {
            b.iter_custom(|iters| {
                let op = |map: &mut FixedTensorMap<'_, u64>, i| {
                    let (addr, span) = buffer(i);
                    map.lookup(&addr, span, AccessMode::Read, NOTHING_RETIRED, |p| {
                        black_box(p);
                    });
                };
                cycle(iters, &mut map, |_| {}, op)
            });
        });
    }
    // The host map's guard is held over each timed pass, so neither side pays for a lock.
    let host = TensorMap::with_capacity(POOL);
    let mut guard = host.lock();
    let host_key = |i| {
        let (addr, span) = buffer(i);
        (TensorKey::Host { addr }, span)
    };
    group.bench_function("insert/host", |b| {
        b.iter_custom(|iters| {
            let refill = |g: &mut TensorMapGuard<'_>| {
                g.erase_run(RUN);
            };
            let op = |g: &mut TensorMapGuard<'_>, i| {
                let (key, span) = host_key(i);
                black_box(g.insert(RUN, key, span, slot(i)));
            };
            cycle(iters, &mut guard, refill, op)
        });
    });
    for i in 0..KEYS {
        let (key, span) = host_key(i);
        guard.insert(RUN, key, span, slot(i));
    }
    group.bench_function("lookup/host", |b| {
        b.iter_custom(|iters| {
            let op = |g: &mut TensorMapGuard<'_>, i| {
                let (key, span) = host_key(i);
                g.lookup_overlapping(RUN, &key, span, |p| {
                    black_box(p);
                });
            };
            cycle(iters, &mut guard, |_| {}, op)
        });
    });
    group.finish();
}

// Written out rather than through `criterion_group!`, whose generated public function would need
// a doc comment of its own.
fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    chain(&mut criterion);
    keys(&mut criterion);
    criterion.final_summary();
}
