//! The dependency rules every tensor-map implementation must derive (`docs/tensormap.md`):
//! reads order after writers, every write after the live earlier readers of its bytes, `InOut`
//! also after writers, blind writes not after writers, readers never after readers.
//!
//! The suite is written against the small [`DependencyMap`] trait, and [`dependency_rules!`]
//! instantiates every behaviour and the property test for one implementation, so another map
//! (a fixed-capacity one, say) is checked by implementing the trait and adding one line.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use simpler_tensormap::fixed::{AccessMode, FixedTensorMap, MapEntry};
use simpler_tensormap::{Access, ByteSpan, TensorKey, TensorMap};
use simpler_types::{RunId, SlotId};

/// What the rules need from a map: the lookups of one access, its record, and the erase of a
/// retired task's entries.
pub trait DependencyMap {
    /// The tasks an `access` of `span` of `key` in `run` orders after, deduplicated.
    fn dependencies(
        &mut self,
        run: RunId,
        key: TensorKey,
        span: ByteSpan,
        access: Access,
    ) -> BTreeSet<SlotId>;
    /// Records the access.
    fn record(&mut self, run: RunId, key: TensorKey, span: ByteSpan, access: Access, slot: SlotId);
    /// Erases the entries of a retired task, given the keys it recorded.
    fn retire(&mut self, run: RunId, slot: SlotId, keys: &[TensorKey]);
    /// Live entries of `run`, readers and writers.
    fn entries(&self, run: RunId) -> usize;
}

impl DependencyMap for TensorMap {
    fn dependencies(
        &mut self,
        run: RunId,
        key: TensorKey,
        span: ByteSpan,
        access: Access,
    ) -> BTreeSet<SlotId> {
        let mut out = BTreeSet::new();
        TensorMap::dependencies(self, run, &key, span, access, |s| {
            out.insert(s);
        });
        out
    }

    fn record(&mut self, run: RunId, key: TensorKey, span: ByteSpan, access: Access, slot: SlotId) {
        TensorMap::record(self, run, key, span, access, slot);
    }

    fn retire(&mut self, run: RunId, slot: SlotId, keys: &[TensorKey]) {
        self.erase_owned(run, slot, keys);
    }

    fn entries(&self, run: RunId) -> usize {
        self.len_run(run)
    }
}

/// The fixed-capacity map over storage of its own (leaked: a test owns it for its whole life),
/// with owners as packed slot ids and the retired tasks as its retirement predicate. It keeps
/// one run, which is all the suite uses.
pub struct Fixed {
    map: FixedTensorMap<'static, TensorKey>,
    retired: BTreeSet<u64>,
}

impl Fixed {
    /// A map with `entries` pool slots and `buckets` buckets.
    pub fn new(entries: usize, buckets: usize) -> Fixed {
        let pool = Box::leak(vec![MapEntry::vacant(buf(0)); entries].into_boxed_slice());
        let heads = Box::leak(vec![0_u32; buckets].into_boxed_slice());
        Fixed { map: FixedTensorMap::new(pool, heads).unwrap(), retired: BTreeSet::new() }
    }
}

impl DependencyMap for Fixed {
    fn dependencies(
        &mut self,
        _: RunId,
        key: TensorKey,
        span: ByteSpan,
        access: Access,
    ) -> BTreeSet<SlotId> {
        let mut out = BTreeSet::new();
        let retired = &self.retired;
        self.map.lookup(
            &key,
            span,
            AccessMode::from(access),
            |o| retired.contains(&o),
            |o| {
                out.insert(SlotId::unpack(o));
            },
        );
        out
    }

    fn record(&mut self, _: RunId, key: TensorKey, span: ByteSpan, access: Access, slot: SlotId) {
        let retired = &self.retired;
        self.map
            .insert(key, span, AccessMode::from(access), slot.pack(), |o| retired.contains(&o))
            .unwrap();
    }

    fn retire(&mut self, _: RunId, slot: SlotId, keys: &[TensorKey]) {
        self.map.erase_owned(slot.pack(), keys);
        self.retired.insert(slot.pack());
    }

    fn entries(&self, _: RunId) -> usize {
        self.map.len() as usize
    }
}

const RUN: RunId = RunId::FIRST;

fn slot(i: u32) -> SlotId {
    SlotId::new(i, 1)
}

fn buf(addr: u64) -> TensorKey {
    TensorKey::Host { addr }
}

fn span(start: u64, end: u64) -> ByteSpan {
    ByteSpan::new(start, end).unwrap()
}

/// One task's accesses, submitted the way the engine does: every lookup, then every record.
/// Returns the task's dependencies without itself.
fn submit<M: DependencyMap>(
    map: &mut M,
    task: u32,
    accesses: &[(TensorKey, ByteSpan, Access)],
) -> BTreeSet<u32> {
    let mut deps = BTreeSet::new();
    for &(key, s, access) in accesses {
        deps.extend(map.dependencies(RUN, key, s, access).into_iter().map(|d| d.index));
    }
    for &(key, s, access) in accesses {
        map.record(RUN, key, s, access, slot(task));
    }
    deps.remove(&task);
    deps
}

fn set(items: &[u32]) -> BTreeSet<u32> {
    items.iter().copied().collect()
}

use Access::{Overwrite, Read, Scatter, Update};

/// The original's issue #1306: `W0: InOut buf, R0: Input buf, W1: InOut buf`. `W1` must not
/// overwrite `buf` while `R0` still reads it.
pub fn the_1306_shape_orders_the_second_write_after_the_reader<M: DependencyMap>(mut map: M) {
    let b = (buf(0x100), span(0x100, 0x200));
    assert_eq!(submit(&mut map, 0, &[(b.0, b.1, Update)]), set(&[]));
    assert_eq!(submit(&mut map, 1, &[(b.0, b.1, Read)]), set(&[0]));
    assert_eq!(submit(&mut map, 2, &[(b.0, b.1, Update)]), set(&[0, 1]), "W1 after W0 and R0");
}

/// Readers of one buffer stay concurrent; the next write waits for all of them.
pub fn readers_stay_concurrent_and_the_next_write_waits_for_all<M: DependencyMap>(mut map: M) {
    let (k, s) = (buf(0x100), span(0x100, 0x200));
    submit(&mut map, 0, &[(k, s, Overwrite)]);
    for r in 1..=3 {
        assert_eq!(submit(&mut map, r, &[(k, s, Read)]), set(&[0]), "reader {r}");
    }
    assert_eq!(submit(&mut map, 4, &[(k, s, Overwrite)]), set(&[1, 2, 3]));
}

/// A blind write keeps its contract (no edge to the previous writer) but gains the edges to
/// the readers; two blind writes with no read between them stay unordered.
pub fn blind_writes_order_after_readers_only<M: DependencyMap>(mut map: M) {
    let (k, s) = (buf(0x100), span(0x100, 0x200));
    submit(&mut map, 0, &[(k, s, Overwrite)]);
    assert_eq!(submit(&mut map, 1, &[(k, s, Overwrite)]), set(&[]), "no write-after-write");
    assert_eq!(submit(&mut map, 2, &[(k, s, Read)]), set(&[1]));
    assert_eq!(submit(&mut map, 3, &[(k, s, Overwrite)]), set(&[2]), "after the reader only");
    // 3 superseded the reader, so it stands in for it: a later blind write orders after 3 and
    // thereby after the reader, which may still run.
    assert_eq!(submit(&mut map, 4, &[(k, s, Overwrite)]), set(&[3]));
    // An `InOut` reads, so a blind write after it waits for it.
    let (k2, s2) = (buf(0x900), span(0x900, 0x910));
    submit(&mut map, 5, &[(k2, s2, Update)]);
    assert_eq!(submit(&mut map, 6, &[(k2, s2, Overwrite)]), set(&[5]));
}

/// Disjoint slices create no edge; a write of part of a reader's bytes waits for it and leaves
/// it in place for the writers of its other bytes.
pub fn partial_overlaps_order_and_keep_the_reader<M: DependencyMap>(mut map: M) {
    let k = buf(0x100);
    submit(&mut map, 0, &[(k, span(0x100, 0x140), Read)]);
    assert_eq!(submit(&mut map, 1, &[(k, span(0x140, 0x180), Overwrite)]), set(&[]), "disjoint");
    assert_eq!(submit(&mut map, 2, &[(k, span(0x100, 0x120), Overwrite)]), set(&[0]));
    assert_eq!(submit(&mut map, 3, &[(k, span(0x120, 0x140), Overwrite)]), set(&[0]));
}

/// A blind write of a view with gaps (`Scatter`: its footprint is the bounding range) orders
/// like any blind write, but the writers of bytes in its gaps keep their entries: a later read
/// of those bytes still waits for them. A dense overwrite then takes the place of both.
pub fn a_scatter_write_keeps_the_writers_in_its_gaps<M: DependencyMap>(mut map: M) {
    let k = buf(0x100);
    submit(&mut map, 0, &[(k, span(0x100, 0x120), Overwrite)]);
    submit(&mut map, 1, &[(k, span(0x110, 0x130), Read)]);
    assert_eq!(submit(&mut map, 2, &[(k, span(0x100, 0x17c), Scatter)]), set(&[1]), "readers only");
    assert_eq!(submit(&mut map, 3, &[(k, span(0x100, 0x120), Read)]), set(&[0, 2]), "0 stays");
    assert_eq!(submit(&mut map, 4, &[(k, span(0x100, 0x17c), Overwrite)]), set(&[2, 3]));
    assert_eq!(submit(&mut map, 5, &[(k, span(0x100, 0x120), Read)]), set(&[4]));
}

/// A scatter write replaces the covered writers it ordered after (those that order later
/// writes): a later access of their bytes finds the scatter, which orders after them. So a loop
/// of strided writes and reads of one buffer keeps constant state.
pub fn a_scatter_write_replaces_the_writers_it_ordered_after<M: DependencyMap>(mut map: M) {
    let k = buf(0x100);
    let (head, hull) = (span(0x100, 0x120), span(0x100, 0x17c));
    submit(&mut map, 0, &[(k, head, Overwrite)]);
    submit(&mut map, 1, &[(k, head, Read)]);
    assert_eq!(submit(&mut map, 2, &[(k, head, Overwrite)]), set(&[1]));
    assert_eq!(submit(&mut map, 3, &[(k, hull, Scatter)]), set(&[2]));
    assert_eq!(map.entries(RUN), 1, "the scatter replaced write 2, which it ordered after");
    assert_eq!(submit(&mut map, 4, &[(k, head, Read)]), set(&[3]));
    for round in 0..100_u32 {
        let t = 5 + 2 * round;
        // The scatter before (which replaced readers) and the reader since.
        assert_eq!(submit(&mut map, t, &[(k, hull, Scatter)]), set(&[t - 2, t - 1]));
        assert_eq!(submit(&mut map, t + 1, &[(k, hull, Read)]), set(&[t]));
        assert!(map.entries(RUN) <= 2, "round {round}: {} entries", map.entries(RUN));
    }
}

/// A retired reader is forgotten: the next write takes no edge to it.
pub fn a_retired_reader_is_erased_owner_checked<M: DependencyMap>(mut map: M) {
    let (k, s) = (buf(0x100), span(0x100, 0x200));
    submit(&mut map, 0, &[(k, s, Overwrite)]);
    submit(&mut map, 1, &[(k, s, Read)]);
    submit(&mut map, 2, &[(k, s, Read)]);
    map.retire(RUN, slot(1), &[k]);
    map.retire(RUN, slot(7), &[k]);
    assert_eq!(submit(&mut map, 3, &[(k, s, Update)]), set(&[0, 2]));
}

/// A fan-in read of 1000 slices, then a covering write that waits for every reader; the next
/// write finds the covering write only, not the 1000 readers again.
pub fn a_covering_write_takes_a_fan_in_of_readers_once<M: DependencyMap>(mut map: M) {
    let k = buf(0);
    submit(&mut map, 0, &[(k, span(0, 1000), Overwrite)]);
    for i in 1..=1000 {
        let byte = u64::from(i - 1);
        assert_eq!(submit(&mut map, i, &[(k, span(byte, byte + 1), Read)]), set(&[0]));
    }
    let all: BTreeSet<u32> = (1..=1000).collect();
    let mut w = all.clone();
    w.insert(0);
    assert_eq!(submit(&mut map, 1001, &[(k, span(0, 1000), Update)]), w);
    assert_eq!(map.entries(RUN), 1, "the readers were superseded");
    assert_eq!(submit(&mut map, 1002, &[(k, span(0, 1000), Overwrite)]), set(&[1001]));
}

/// A W→R→W→R… chain keeps at most the readers since the last covering write.
pub fn an_alternating_chain_keeps_constant_state<M: DependencyMap>(mut map: M) {
    let (k, s) = (buf(0x100), span(0x100, 0x200));
    for i in 0..1000_u32 {
        let access = match i % 3 {
            0 => Update,
            1 => Read,
            _ => Overwrite,
        };
        submit(&mut map, i, &[(k, s, access)]);
        assert!(map.entries(RUN) <= 2, "task {i}: {} entries", map.entries(RUN));
    }
}

/// A group whose one member reads a buffer that another writes: lookups come first, so the
/// read sees the earlier writer and the task does not depend on itself.
pub fn lookups_before_records_within_one_task<M: DependencyMap>(mut map: M) {
    let (k, s) = (buf(0x100), span(0x100, 0x200));
    submit(&mut map, 0, &[(k, s, Overwrite)]);
    assert_eq!(submit(&mut map, 1, &[(k, s, Read), (k, s, Overwrite)]), set(&[0]));
    assert_eq!(submit(&mut map, 2, &[(k, s, Overwrite)]), set(&[1]), "1 read the buffer");
}

// ---------------------------------------------------------------------------------------------
// Property test: a random access sequence against an exact model.

/// One step of a random sequence.
#[derive(Clone, Debug)]
pub enum Step {
    /// A task with these accesses `(buffer, start, len, access)`.
    Task(Vec<(u64, u64, u64, Access)>),
    /// Retire the `n`-th oldest task that may retire (all its dependencies retired).
    Retire(usize),
}

fn access() -> impl Strategy<Value = Access> {
    prop_oneof![3 => Just(Read), 2 => Just(Overwrite), 2 => Just(Update), 1 => Just(Scatter)]
}

/// The bytes an access of `len` bytes at `start` touches: every one, but for a scatter write
/// only every other one (its footprint, all the maps see, is the bounding range; the bytes in
/// its gaps keep their earlier writer).
fn touched(start: u64, len: u64, access: Access) -> impl Iterator<Item = u64> {
    let step = if access == Scatter { 2 } else { 1 };
    (start..start + len).step_by(step)
}

/// Random steps over three buffers of 24 bytes, so overlaps and coverings are frequent.
pub fn steps() -> impl Strategy<Value = Vec<Step>> {
    let one = (0..3_u64, 0..24_u64, 1..12_u64, access());
    let step = prop_oneof![
        4 => prop::collection::vec(one, 1..3).prop_map(Step::Task),
        1 => (0..4_usize).prop_map(Step::Retire),
    ];
    prop::collection::vec(step, 1..60)
}

/// What the sequence requires (`docs/tensormap.md`, the rules), computed per byte and never
/// forgetting a reader: `after[t]` holds every earlier unretired task `t` must start after.
#[derive(Default)]
struct Exact {
    /// Per (buffer, byte): the last writer, and every reader ever (with the task index).
    last_writer: BTreeMap<(u64, u64), u32>,
    readers: BTreeMap<(u64, u64), BTreeSet<u32>>,
}

impl Exact {
    fn conflicts(&self, accesses: &[(u64, u64, u64, Access)]) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        for &(b, start, len, access) in accesses {
            for byte in touched(start, len, access) {
                if access.after_writers()
                    && let Some(&w) = self.last_writer.get(&(b, byte))
                {
                    out.insert(w);
                }
                if access.after_readers() {
                    out.extend(self.readers.get(&(b, byte)).into_iter().flatten());
                }
            }
        }
        out
    }

    fn record(&mut self, task: u32, accesses: &[(u64, u64, u64, Access)]) {
        for &(b, start, len, access) in accesses {
            for byte in touched(start, len, access) {
                if access.after_writers() || access == Read {
                    self.readers.entry((b, byte)).or_default().insert(task);
                }
                if access != Read {
                    self.last_writer.insert((b, byte), task);
                }
            }
        }
    }
}

/// One entry as the model sees it: buffer, footprint, task, access, and whether it orders later
/// writes (a read, an `InOut`, or a write that took that duty over from an entry it
/// superseded: a stand-in).
type ModelEntry = (u64, ByteSpan, u32, Access, bool);

/// Runs `steps` against `map` and checks, after every task:
/// 1. every conflict of the exact model with an unretired task is implied by the derived edges
///    (directly or through a chain of unretired tasks);
/// 2. every derived edge names an unretired, earlier task whose bytes overlap, and is an exact
///    conflict or a write after a write that stands in for superseded readers;
/// 3. no reader ever orders after a reader through a direct edge;
/// 4. the live entries are exactly the accesses of unretired tasks not yet superseded by a
///    covering write (so a superseded reader is never visited again, and per-key state is the
///    readers since the last covering write plus the writers it only partly covers).
pub fn check_steps<M: DependencyMap>(mut map: M, steps: &[Step]) -> Result<(), TestCaseError> {
    let mut exact = Exact::default();
    let mut deps: Vec<BTreeSet<u32>> = Vec::new();
    let mut accesses_of: Vec<Vec<(u64, u64, u64, Access)>> = Vec::new();
    let mut retired: BTreeSet<u32> = BTreeSet::new();
    // Accesses not superseded yet: the entries the maps must hold.
    let mut unsuperseded: Vec<ModelEntry> = Vec::new();
    for step in steps {
        match step {
            Step::Task(accesses) => {
                let task = deps.len() as u32;
                let keyed: Vec<(TensorKey, ByteSpan, Access)> = accesses
                    .iter()
                    .map(|&(b, s, l, a)| {
                        (buf(b * 0x1000), span(b * 0x1000 + s, b * 0x1000 + s + l), a)
                    })
                    .collect();
                let derived = submit(&mut map, task, &keyed);
                let required: BTreeSet<u32> = exact
                    .conflicts(accesses)
                    .into_iter()
                    .filter(|t| !retired.contains(t))
                    .collect();
                // 1. Closure over unretired tasks.
                let mut reach: BTreeSet<u32> = BTreeSet::new();
                let mut work: Vec<u32> = derived.iter().copied().collect();
                while let Some(t) = work.pop() {
                    if reach.insert(t) {
                        work.extend(deps[t as usize].iter().copied());
                    }
                }
                for r in &required {
                    prop_assert!(
                        reach.contains(r),
                        "task {task} must order after {r}: {derived:?}"
                    );
                }
                // 2 and 3. Besides exact conflicts, an edge may come from an entry a later write
                // only partly covered (footprints are kept conservatively; a scatter's is its
                // bounding range), or from a stand-in.
                let entry_edge = |d: u32| {
                    unsuperseded.iter().any(|&(eb, es, et, ea, orders)| {
                        et == d
                            && keyed.iter().any(|&(key, s, a)| {
                                key_addr(key) == eb
                                    && s.overlaps(es)
                                    && ((a.after_writers() && ea != Read)
                                        || (a.after_readers() && orders))
                            })
                    })
                };
                for &d in &derived {
                    prop_assert!(!retired.contains(&d), "task {task} depends on retired {d}");
                    prop_assert!(
                        required.contains(&d) || entry_edge(d),
                        "task {task} depends on {d} without a conflict"
                    );
                }
                accesses_of.push(accesses.clone());
                // Representation bound, and stand-in bookkeeping: a write covering an access that
                // orders later writes becomes a stand-in. A write supersedes what it covers; a
                // scatter only what it ordered after (the covered entries that order writes).
                for &(key, s, access) in &keyed {
                    let b = key_addr(key);
                    let mut orders = matches!(access, Read | Update);
                    if access != Read {
                        let covered = |&(eb, es, ..): &ModelEntry| eb == b && s.contains(es);
                        let duty = |e: &ModelEntry| covered(e) && e.4;
                        orders |= unsuperseded.iter().any(duty);
                        if access == Scatter {
                            unsuperseded.retain(|e| !duty(e));
                        } else {
                            unsuperseded.retain(|e| !covered(e));
                        }
                    }
                    unsuperseded.push((b, s, task, access, orders));
                }
                exact.record(task, accesses);
                deps.push(derived);
                prop_assert!(
                    map.entries(RUN) == unsuperseded.len(),
                    "{} entries, {} unsuperseded accesses",
                    map.entries(RUN),
                    unsuperseded.len()
                );
            }
            Step::Retire(n) => {
                let ready = (0..deps.len() as u32).filter(|t| {
                    !retired.contains(t) && deps[*t as usize].iter().all(|d| retired.contains(d))
                });
                if let Some(t) = ready.clone().nth(*n % ready.count().max(1)) {
                    let keys: Vec<TensorKey> =
                        accesses_of[t as usize].iter().map(|a| buf(a.0 * 0x1000)).collect();
                    map.retire(RUN, slot(t), &keys);
                    retired.insert(t);
                    unsuperseded.retain(|&(_, _, et, ..)| et != t);
                }
            }
        }
    }
    Ok(())
}

fn key_addr(key: TensorKey) -> u64 {
    match key {
        TensorKey::Host { addr } => addr,
        _ => unreachable!("the suite uses host keys only"),
    }
}

/// Case count: `PROPTEST_CASES` when set, else a modest default for ordinary test runs.
pub fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

/// Instantiates every behaviour of this suite, and the property test, for the map `$make`
/// builds (an expression evaluated once per test).
macro_rules! dependency_rules {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn the_1306_shape_orders_the_second_write_after_the_reader() {
                super::the_1306_shape_orders_the_second_write_after_the_reader($make);
            }
            #[test]
            fn readers_stay_concurrent_and_the_next_write_waits_for_all() {
                super::readers_stay_concurrent_and_the_next_write_waits_for_all($make);
            }
            #[test]
            fn blind_writes_order_after_readers_only() {
                super::blind_writes_order_after_readers_only($make);
            }
            #[test]
            fn partial_overlaps_order_and_keep_the_reader() {
                super::partial_overlaps_order_and_keep_the_reader($make);
            }
            #[test]
            fn a_scatter_write_keeps_the_writers_in_its_gaps() {
                super::a_scatter_write_keeps_the_writers_in_its_gaps($make);
            }
            #[test]
            fn a_scatter_write_replaces_the_writers_it_ordered_after() {
                super::a_scatter_write_replaces_the_writers_it_ordered_after($make);
            }
            #[test]
            fn a_retired_reader_is_erased_owner_checked() {
                super::a_retired_reader_is_erased_owner_checked($make);
            }
            #[test]
            fn a_covering_write_takes_a_fan_in_of_readers_once() {
                super::a_covering_write_takes_a_fan_in_of_readers_once($make);
            }
            #[test]
            fn an_alternating_chain_keeps_constant_state() {
                super::an_alternating_chain_keeps_constant_state($make);
            }
            #[test]
            fn lookups_before_records_within_one_task() {
                super::lookups_before_records_within_one_task($make);
            }

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(cases()))]

                #[test]
                fn derived_edges_match_the_exact_rules(steps in steps()) {
                    check_steps($make, &steps)?;
                }
            }
        }
    };
}

dependency_rules!(host_map, TensorMap::new());
// Pools large enough for the 1000-reader fan-in; few buckets, so keys share chains.
dependency_rules!(fixed_map, Fixed::new(2048, 4));

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// `TensorMapGuard::access` (one probe) derives what `dependencies` then `record` derive.
    #[test]
    fn one_probe_access_matches_lookup_then_record(
        steps in prop::collection::vec((0..3_u64, 0..24_u64, 1..12_u64, access()), 1..80)
    ) {
        let (single, twin) = (TensorMap::new(), TensorMap::new());
        for (task, &(b, s, l, a)) in steps.iter().enumerate() {
            let (key, sp) = (buf(b * 0x1000), span(b * 0x1000 + s, b * 0x1000 + s + l));
            let mut got = BTreeSet::new();
            let superseded = single.lock().access(RUN, key, sp, a, slot(task as u32), |d| {
                got.insert(d);
            });
            let mut want = BTreeSet::new();
            twin.dependencies(RUN, &key, sp, a, |d| {
                want.insert(d);
            });
            prop_assert_eq!(superseded, twin.record(RUN, key, sp, a, slot(task as u32)));
            prop_assert_eq!(got, want);
            prop_assert_eq!(single.len_run(RUN), twin.len_run(RUN));
        }
    }
}
