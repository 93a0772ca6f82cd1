//! Tensor-map benchmarks: P4 (the map alone over 1 000 000 keys) and the map's share of P3
//! (a fan-in over 1000 one-byte slices of one buffer), benchmarks P3 and P4.
//!
//! Every benchmark reports the time of **one operation** (one insert, one lookup, one erase, for
//! `p3_fan_in/lookup_whole_buffer` one lookup that visits 1000 producers, and for the
//! `p3_fan_in/diamond_*` benchmarks one diamond's whole fan-in): the routine runs
//! the requested number of operations, refilling or emptying the map outside the timed part
//! whenever a pass over the key set is complete.
//!
//! `guard` variants take the lock once per pass (as a submit does), `locked_each` variants take it
//! per operation through the convenience methods.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use simpler_tensormap::{ByteSpan, TensorKey, TensorMap};
use simpler_types::{RunId, SlotId};

/// P4 key count.
const KEYS: usize = 1_000_000;
/// P3 fan-in width.
const FAN_IN: usize = 1000;

const RUN: RunId = RunId::FIRST;

/// Key `i` of the P4 set: distinct host buffers 64 bytes apart, each written as a 1-byte view.
fn p4_key(i: usize) -> (TensorKey, ByteSpan, SlotId) {
    let addr = 0x1_0000_0000 + 64 * i as u64;
    let span = ByteSpan { start: addr, end: addr + 1 };
    (TensorKey::Host { addr }, span, SlotId::new(i as u32, 1))
}

fn p4_keys() -> Vec<(TensorKey, ByteSpan, SlotId)> {
    (0..KEYS).map(p4_key).collect()
}

fn filled(keys: &[(TensorKey, ByteSpan, SlotId)]) -> TensorMap {
    let map = TensorMap::with_capacity(keys.len());
    insert_all(&map, keys);
    map
}

/// Inserts every key into `map` under one guard (one P4 insert pass).
fn insert_all(map: &TensorMap, keys: &[(TensorKey, ByteSpan, SlotId)]) {
    let mut guard = map.lock();
    for &(key, span, slot) in keys {
        black_box(guard.insert(RUN, key, span, slot));
    }
}

/// Erases every key on behalf of its owner under one guard (one P4 erase pass).
fn erase_all(map: &TensorMap, keys: &[(TensorKey, ByteSpan, SlotId)]) {
    let mut guard = map.lock();
    for &(key, _, slot) in keys {
        black_box(guard.erase_owned(RUN, slot, &[key]));
    }
}

/// Times `iters` guarded lookups of `keys` (cycled) in `run`.
fn lookups_timed(
    map: &TensorMap,
    run: RunId,
    keys: &[(TensorKey, ByteSpan, SlotId)],
    iters: u64,
) -> Duration {
    let guard = map.lock();
    let start = Instant::now();
    let mut found = 0_usize;
    for (key, span, _) in keys.iter().cycle().take(iters as usize) {
        guard.lookup_overlapping(run, black_box(key), *span, |_| found += 1);
    }
    black_box(found);
    start.elapsed()
}

/// Runs `iters` operations in passes of at most `pass` operations. `prepare` builds the state for
/// one pass (untimed); `run(state, n)` performs the first `n` operations of a pass (timed).
fn per_op<S>(
    iters: u64,
    pass: usize,
    mut prepare: impl FnMut() -> S,
    mut run: impl FnMut(&mut S, usize),
) -> Duration {
    let mut left = iters as usize;
    let mut total = Duration::ZERO;
    while left > 0 {
        let n = left.min(pass);
        let mut state = prepare();
        let start = Instant::now();
        run(&mut state, n);
        total += start.elapsed();
        drop(state);
        left -= n;
    }
    total
}

/// `keys` in a pseudo-random order (a fixed xorshift-driven Fisher–Yates shuffle).
fn shuffle(keys: &[(TensorKey, ByteSpan, SlotId)]) -> &'static [(TensorKey, ByteSpan, SlotId)] {
    let mut out = keys.to_vec();
    let mut x = 0x9E37_79B9_7F4A_7C15_u64;
    for i in (1..out.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.swap(i, (x % (i as u64 + 1)) as usize);
    }
    out.leak()
}

fn p4(c: &mut Criterion) {
    // Leaked so that benchmark closures can hold it for the whole process, which ends right after.
    let keys: &'static [_] = p4_keys().leak();
    let mut group = c.benchmark_group("p4");
    group.sample_size(10).warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));

    // Steady state: one map reused pass after pass (`erase_run` between passes, untimed), as an
    // engine reuses its map run after run.
    let reused = TensorMap::with_capacity(KEYS);
    group.bench_function("insert/guard", |b| {
        b.iter_custom(|iters| {
            per_op(
                iters,
                KEYS,
                || {
                    reused.erase_run(RUN);
                    &reused
                },
                |map, n| insert_all(map, &keys[..n]),
            )
        })
    });
    // A fresh map per pass: includes the page faults of first touching its memory.
    group.bench_function("insert/guard_fresh_map", |b| {
        b.iter_custom(|iters| {
            per_op(
                iters,
                KEYS,
                || TensorMap::with_capacity(KEYS),
                |map, n| insert_all(map, &keys[..n]),
            )
        })
    });
    group.bench_function("insert/guard_no_capacity", |b| {
        b.iter_custom(|iters| {
            per_op(iters, KEYS, TensorMap::new, |map, n| insert_all(map, &keys[..n]))
        })
    });
    group.bench_function("insert/locked_each", |b| {
        b.iter_custom(|iters| {
            per_op(
                iters,
                KEYS,
                || {
                    reused.erase_run(RUN);
                    &reused
                },
                |map, n| {
                    for &(key, span, slot) in &keys[..n] {
                        black_box(map.insert(RUN, key, span, slot));
                    }
                },
            )
        })
    });

    drop(reused);

    let map = filled(keys);
    let shuffled = shuffle(keys);
    // Keys between the inserted ones: a miss that has to probe the hash table.
    let absent: &'static [_] = keys
        .iter()
        .map(|&(_, span, slot)| {
            let addr = span.start + 32;
            (TensorKey::Host { addr }, ByteSpan { start: addr, end: addr + 1 }, slot)
        })
        .collect::<Vec<_>>()
        .leak();
    let lookups = |run: RunId, keys: &'static [(TensorKey, ByteSpan, SlotId)]| {
        let map = &map;
        move |iters: u64| lookups_timed(map, run, keys, iters)
    };
    group.bench_function("lookup_hit/guard", |b| b.iter_custom(lookups(RUN, keys)));
    // The same keys in a random order: no locality between consecutive lookups.
    group.bench_function("lookup_hit_shuffled/guard", |b| b.iter_custom(lookups(RUN, shuffled)));
    let other_run = RunId::from_raw(2).unwrap_or(RUN);
    group
        .bench_function("lookup_miss_other_run/guard", |b| b.iter_custom(lookups(other_run, keys)));
    group.bench_function("lookup_miss_absent_key/guard", |b| b.iter_custom(lookups(RUN, absent)));
    group.bench_function("lookup_hit/locked_each", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let mut found = 0_usize;
            for (key, span, _) in keys.iter().cycle().take(iters as usize) {
                map.lookup_overlapping(RUN, black_box(key), *span, |_| found += 1);
            }
            black_box(found);
            start.elapsed()
        })
    });
    drop(map);

    group.bench_function("erase_owned/guard", |b| {
        b.iter_custom(|iters| {
            per_op(iters, KEYS, || filled(keys), |map, n| erase_all(map, &keys[..n]))
        })
    });
    group.finish();
}

/// The P4 operations over a key set small enough to stay in cache (4096 keys): what hashing and
/// the map's own work cost once memory latency is out of the picture.
fn p4_cached(c: &mut Criterion) {
    const CACHED: usize = 4096;
    let keys: Vec<_> = (0..CACHED).map(p4_key).collect();
    let mut group = c.benchmark_group("p4_cached");
    group.sample_size(10).warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(1));
    let map = TensorMap::with_capacity(CACHED);
    group.bench_function("insert/guard", |b| {
        b.iter_custom(|iters| {
            per_op(
                iters,
                CACHED,
                || {
                    map.erase_run(RUN);
                    &map
                },
                |map, n| insert_all(map, &keys[..n]),
            )
        })
    });
    group.bench_function("lookup_hit/guard", |b| {
        let map = filled(&keys);
        b.iter_custom(|iters| lookups_timed(&map, RUN, &keys, iters))
    });
    group.bench_function("erase_owned/guard", |b| {
        b.iter_custom(|iters| {
            per_op(
                iters,
                CACHED,
                || {
                    map.erase_run(RUN);
                    insert_all(&map, &keys);
                    &map
                },
                |map, n| erase_all(map, &keys[..n]),
            )
        })
    });
    group.finish();
}

/// The 1000 one-byte slices of the P3 fan-in buffer, written by slots 0..1000.
fn fan_in_slices() -> Vec<(ByteSpan, SlotId)> {
    (0..FAN_IN as u64)
        .map(|i| (ByteSpan { start: 0x2000 + i, end: 0x2001 + i }, SlotId::new(i as u32, 1)))
        .collect()
}

fn fill_fan_in(map: &TensorMap, key: TensorKey, slices: &[(ByteSpan, SlotId)]) {
    let mut guard = map.lock();
    for &(span, slot) in slices {
        guard.insert(RUN, key, span, slot);
    }
}

fn p3_fan_in(c: &mut Criterion) {
    let key = TensorKey::Host { addr: 0x2000 };
    let whole = ByteSpan { start: 0x2000, end: 0x2000 + FAN_IN as u64 };
    let slices = fan_in_slices();
    let mut reversed = slices.clone();
    reversed.reverse();
    let mut group = c.benchmark_group("p3_fan_in");
    group.sample_size(10).warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(2));

    group.bench_function("insert_slice", |b| {
        b.iter_custom(|iters| {
            per_op(
                iters,
                FAN_IN,
                || TensorMap::with_capacity(1),
                |map, n| {
                    let mut guard = map.lock();
                    for &(span, slot) in &slices[..n] {
                        black_box(guard.insert(RUN, key, span, slot));
                    }
                },
            )
        })
    });

    let map = TensorMap::new();
    fill_fan_in(&map, key, &slices);
    group.bench_function("lookup_whole_buffer", |b| {
        b.iter_custom(|iters| {
            let guard = map.lock();
            let start = Instant::now();
            let mut visited = 0_usize;
            for _ in 0..iters {
                guard.lookup_overlapping(RUN, black_box(&key), whole, |_| visited += 1);
            }
            black_box(visited);
            start.elapsed()
        })
    });
    drop(map);

    for (name, order) in [("erase_slice_in_order", &slices), ("erase_slice_reversed", &reversed)] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                per_op(
                    iters,
                    FAN_IN,
                    || {
                        let map = TensorMap::new();
                        fill_fan_in(&map, key, &slices);
                        map
                    },
                    |map, n| {
                        let mut guard = map.lock();
                        for &(_, slot) in &order[..n] {
                            black_box(guard.erase_owned(RUN, slot, &[key]));
                        }
                    },
                )
            })
        });
    }

    // Everything the map does for one P3 diamond's fan-in: 1000 slice inserts, the sink's
    // whole-buffer lookup, and the 1000 erases when the mids are reclaimed. One op = one diamond.
    group.bench_function("diamond_map_work", |b| {
        let map = TensorMap::new();
        b.iter(|| {
            let mut guard = map.lock();
            for &(span, slot) in &slices {
                guard.insert(RUN, key, span, slot);
            }
            let mut visited = 0_usize;
            guard.lookup_overlapping(RUN, &key, whole, |_| visited += 1);
            for &(_, slot) in &slices {
                guard.erase_owned(RUN, slot, &[key]);
            }
            black_box(visited)
        })
    });

    // The fan-in written by `InOut` mids: each looks up its slice before writing it, so lookups
    // in an indexed list are on the path. With a whole-buffer writer (an initializer) still live,
    // the list holds one long entry among the slices; the lookups must stay as cheap as without.
    // One op = one diamond: 1000 lookups and inserts, the sink's lookup, and every erase.
    let writer = SlotId::new(FAN_IN as u32, 1);
    for (name, initializer) in
        [("diamond_inout", false), ("diamond_inout_after_whole_buffer_writer", true)]
    {
        group.bench_function(name, |b| {
            let map = TensorMap::new();
            b.iter(|| {
                let mut guard = map.lock();
                if initializer {
                    guard.insert(RUN, key, whole, writer);
                }
                let mut visited = 0_usize;
                for &(span, slot) in &slices {
                    guard.lookup_overlapping(RUN, &key, span, |_| visited += 1);
                    guard.insert(RUN, key, span, slot);
                }
                guard.lookup_overlapping(RUN, &key, whole, |_| visited += 1);
                for &(_, slot) in &slices {
                    guard.erase_owned(RUN, slot, &[key]);
                }
                guard.erase_owned(RUN, writer, &[key]);
                black_box(visited)
            })
        });
    }
    group.finish();
}

// Written out rather than through `criterion_group!`, whose generated public function would
// carry no documentation.
fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    p4(&mut criterion);
    p4_cached(&mut criterion);
    p3_fan_in(&mut criterion);
    criterion.final_summary();
}
