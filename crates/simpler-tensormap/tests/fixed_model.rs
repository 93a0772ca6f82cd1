//! The fixed-capacity map against reference models, on random access sequences.
//!
//! A sequence submits tasks (each with one to three accesses to overlapping slices of a few
//! small buffers), retires earlier tasks (with or without an owner-checked erase) and prunes.
//! Every implementation sits behind [`Tracker`]: the fixed map with two key types, and the host
//! map. Two models judge them:
//!
//! - [`EntryModel`]: a plain list of `(buffer, span, owner, role, orders later writes)` entries
//!   with the same lookup, supersede, hand-over and capacity rules, written as directly as possible. The map must report the same
//!   producers for every submit, `Full` exactly when the model's live entries would exceed the
//!   capacity, and the same live entries per buffer.
//! - [`ByteModel`]: per byte, the last writer and the readers since; it yields the dependencies
//!   the rules stand for (read after write, write after read, and write after write for
//!   read-writes), restricted to unretired tasks. The map may add edges (a partly overwritten
//!   entry stays whole) but must never miss one of these.

use std::collections::BTreeSet;
use std::hash::Hash;

use proptest::prelude::*;
use simpler_tensormap::fixed::{AccessMode, FixedMapError, FixedTensorMap, MapEntry, Role};
use simpler_tensormap::{ByteSpan, TensorKey, TensorMap};
use simpler_types::{RunId, SlotId, WorkerId};

/// Buffers per sequence, and bytes per buffer (8 units of 8 bytes).
const BUFFERS: usize = 3;
const UNIT: u64 = 8;
const UNITS: u64 = 8;

/// One access of a task: a buffer, a unit range inside it, and a mode.
#[derive(Clone, Copy, Debug)]
struct Access {
    buffer: usize,
    start: u64,
    end: u64,
    mode: AccessMode,
}

impl Access {
    fn is_whole_write(&self) -> bool {
        self.mode != AccessMode::Read && self.start == 0 && self.end == UNITS
    }
}

/// What one submit produced: the tasks it depends on and, if an insert was refused, which one.
#[derive(Debug, PartialEq, Eq)]
struct Submitted {
    producers: BTreeSet<u64>,
    full_at: Option<usize>,
}

/// A dependency tracker under test. `retired` says which tasks have retired; a tracker must
/// behave as if their entries were gone, whether or not it removed them yet.
trait Tracker {
    /// Looks up every access of `task`, then inserts every access in order, stopping at the
    /// first refused insert.
    fn submit(&mut self, task: u64, accesses: &[Access], retired: &BTreeSet<u64>) -> Submitted;
    /// `task` has just retired; with `erase`, the tracker is told which buffers it touched.
    fn retired(&mut self, task: u64, buffers: &[usize], erase: bool, retired: &BTreeSet<u64>);
    /// A quiet moment: drop what retired tasks left behind.
    fn prune(&mut self, retired: &BTreeSet<u64>);
    /// Live (unretired owners') entries of one buffer, if the tracker can tell.
    fn live_entries(&self, buffer: usize, retired: &BTreeSet<u64>) -> Option<usize>;
}

/// The fixed map, with a way to name buffers as keys of type `K` at absolute byte addresses.
struct FixedTracker<'a, K> {
    map: FixedTensorMap<'a, K>,
    key: fn(usize) -> K,
    base: fn(usize) -> u64,
    capacity: u32,
}

impl<K: Copy + Eq + Hash> FixedTracker<'_, K> {
    fn span(&self, a: &Access) -> ByteSpan {
        let base = (self.base)(a.buffer);
        ByteSpan::new(base + a.start * UNIT, base + a.end * UNIT).unwrap()
    }
}

impl<K: Copy + Eq + Hash> Tracker for FixedTracker<'_, K> {
    fn submit(&mut self, task: u64, accesses: &[Access], retired: &BTreeSet<u64>) -> Submitted {
        let is_retired = |owner: u64| retired.contains(&owner);
        let mut producers = BTreeSet::new();
        for a in accesses {
            let key = (self.key)(a.buffer);
            self.map.lookup(&key, self.span(a), a.mode, is_retired, |o| {
                producers.insert(o);
            });
        }
        let mut full_at = None;
        for (i, a) in accesses.iter().enumerate() {
            let key = (self.key)(a.buffer);
            match self.map.insert(key, self.span(a), a.mode, task, is_retired) {
                Ok(_) => {}
                Err(FixedMapError::Full { capacity, writers, readers }) => {
                    assert_eq!((capacity, writers + readers), (self.capacity, self.capacity));
                    full_at = Some(i);
                    break;
                }
                Err(e) => panic!("unexpected {e}"),
            }
        }
        Submitted { producers, full_at }
    }

    fn retired(&mut self, task: u64, buffers: &[usize], erase: bool, _: &BTreeSet<u64>) {
        if erase {
            let keys: Vec<K> = buffers.iter().map(|&b| (self.key)(b)).collect();
            self.map.erase_owned(task, &keys);
            assert!(keys.iter().all(|k| self.map.entries_of(k).all(|e| e.owner() != task)));
        }
    }

    fn prune(&mut self, retired: &BTreeSet<u64>) {
        self.map.prune_retired(|o| retired.contains(&o));
        assert!((0..BUFFERS).all(|b| {
            let key = (self.key)(b);
            self.map.entries_of(&key).all(|e| !retired.contains(&e.owner()))
        }));
    }

    fn live_entries(&self, buffer: usize, retired: &BTreeSet<u64>) -> Option<usize> {
        let key = (self.key)(buffer);
        Some(self.map.entries_of(&key).filter(|e| !retired.contains(&e.owner())).count())
    }
}

/// The reference: every entry in one list, every rule spelled out.
struct EntryModel {
    /// `(buffer, start, end, owner, role, orders later writes)`, in insertion order.
    entries: Vec<ModelEntry>,
    capacity: usize,
}

type ModelEntry = (usize, u64, u64, u64, Role, bool);

impl Tracker for EntryModel {
    fn submit(&mut self, task: u64, accesses: &[Access], retired: &BTreeSet<u64>) -> Submitted {
        let mut producers = BTreeSet::new();
        for a in accesses {
            for &(b, s, e, owner, role, orders) in &self.entries {
                let overlaps = s < a.end && a.start < e;
                let finds = a.mode.finds(role) || (a.mode.finds_readers() && orders);
                if b == a.buffer && overlaps && finds && !retired.contains(&owner) {
                    producers.insert(owner);
                }
            }
        }
        let mut full_at = None;
        for (i, a) in accesses.iter().enumerate() {
            let role = a.mode.records_as();
            let superseded = |&(b, s, e, ..): &ModelEntry| {
                role == Role::Writer && b == a.buffer && a.start <= s && e <= a.end
            };
            let live_after =
                self.entries.iter().filter(|e| !retired.contains(&e.3) && !superseded(e)).count();
            if live_after + 1 > self.capacity {
                full_at = Some(i);
                break;
            }
            // A covering write takes over the duty of the live entries it supersedes.
            let inherits =
                self.entries.iter().any(|e| superseded(e) && !retired.contains(&e.3) && e.5);
            self.entries.retain(|e| !superseded(e));
            let orders = role == Role::Reader || a.mode == AccessMode::ReadWrite || inherits;
            self.entries.push((a.buffer, a.start, a.end, task, role, orders));
        }
        Submitted { producers, full_at }
    }

    fn retired(&mut self, _: u64, _: &[usize], _: bool, _: &BTreeSet<u64>) {}

    fn prune(&mut self, _: &BTreeSet<u64>) {}

    fn live_entries(&self, buffer: usize, retired: &BTreeSet<u64>) -> Option<usize> {
        Some(self.entries.iter().filter(|e| e.0 == buffer && !retired.contains(&e.3)).count())
    }
}

/// The host map, with unbounded capacity and no retirement predicate.
struct HostTracker {
    map: TensorMap,
}

fn host_key(buffer: usize) -> (TensorKey, u64) {
    (TensorKey::Host { addr: 0x1000 * (buffer as u64 + 1) }, 0x1000 * (buffer as u64 + 1))
}

fn host_access(mode: AccessMode) -> simpler_tensormap::Access {
    match mode {
        AccessMode::Read => simpler_tensormap::Access::Read,
        AccessMode::Write => simpler_tensormap::Access::Overwrite,
        AccessMode::ScatterWrite => simpler_tensormap::Access::Scatter,
        AccessMode::ReadWrite => simpler_tensormap::Access::Update,
    }
}

impl Tracker for HostTracker {
    fn submit(&mut self, task: u64, accesses: &[Access], retired: &BTreeSet<u64>) -> Submitted {
        let span = |a: &Access| {
            let base = host_key(a.buffer).1;
            ByteSpan::new(base + a.start * UNIT, base + a.end * UNIT).unwrap()
        };
        let mut guard = self.map.lock();
        let mut producers = BTreeSet::new();
        for a in accesses {
            let key = host_key(a.buffer).0;
            guard.dependencies(RunId::FIRST, &key, span(a), host_access(a.mode), |s| {
                producers.insert(u64::from(s.index));
            });
        }
        producers.retain(|p| !retired.contains(p));
        for a in accesses {
            let (key, slot) = (host_key(a.buffer).0, SlotId::new(task as u32, 1));
            guard.record(RunId::FIRST, key, span(a), host_access(a.mode), slot);
        }
        Submitted { producers, full_at: None }
    }

    /// The host map knows no retirement predicate: a retired task's entries are always erased
    /// (otherwise a covering write would still take over the duty of a retired reader).
    fn retired(&mut self, task: u64, buffers: &[usize], _: bool, _: &BTreeSet<u64>) {
        let keys: Vec<TensorKey> = buffers.iter().map(|&b| host_key(b).0).collect();
        self.map.erase_owned(RunId::FIRST, SlotId::new(task as u32, 1), &keys);
    }

    fn prune(&mut self, _: &BTreeSet<u64>) {}

    fn live_entries(&self, _: usize, _: &BTreeSet<u64>) -> Option<usize> {
        None
    }
}

/// Per byte unit: the task that wrote it last and the tasks that read it since.
struct ByteModel {
    last_writer: [[Option<u64>; UNITS as usize]; BUFFERS],
    readers: [[Vec<u64>; UNITS as usize]; BUFFERS],
}

impl ByteModel {
    fn new() -> ByteModel {
        ByteModel { last_writer: [[None; UNITS as usize]; BUFFERS], readers: Default::default() }
    }

    /// The dependencies `task` must have, then records its accesses (writes before reads, so a
    /// task that reads and overwrites the same bytes stays their reader).
    fn submit(&mut self, task: u64, accesses: &[Access], retired: &BTreeSet<u64>) -> Vec<u64> {
        let mut needed = Vec::new();
        for a in accesses {
            for u in a.start as usize..a.end as usize {
                if a.mode.finds_writers() {
                    needed.extend(self.last_writer[a.buffer][u]);
                }
                if a.mode.finds_readers() {
                    needed.extend(&self.readers[a.buffer][u]);
                }
            }
        }
        needed.retain(|t| !retired.contains(t) && *t != task);
        for a in accesses.iter().filter(|a| a.mode != AccessMode::Read) {
            for u in a.start as usize..a.end as usize {
                self.last_writer[a.buffer][u] = Some(task);
                self.readers[a.buffer][u].clear();
            }
        }
        for a in accesses.iter().filter(|a| a.mode == AccessMode::Read) {
            for u in a.start as usize..a.end as usize {
                self.readers[a.buffer][u].push(task);
            }
        }
        needed
    }
}

#[derive(Clone, Debug)]
enum Op {
    Submit(Vec<Access>),
    /// Retire the `n`-th unretired task (modulo their number), erasing its entries or not.
    Retire(prop::sample::Index, bool),
    Prune,
}

fn access(with_reads: bool) -> impl Strategy<Value = Access> {
    let reads = u32::from(with_reads);
    let mode = prop_oneof![
        reads => Just(AccessMode::Read),
        1 => Just(AccessMode::Write),
        1 => Just(AccessMode::ReadWrite),
    ];
    (0..BUFFERS, 0..UNITS, 1..=UNITS, any::<bool>(), mode).prop_map(
        |(buffer, start, len, whole, mode)| {
            let (start, end) = if whole { (0, UNITS) } else { (start, (start + len).min(UNITS)) };
            Access { buffer, start, end, mode }
        },
    )
}

fn op(with_reads: bool) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop::collection::vec(access(with_reads), 1..=3).prop_map(Op::Submit),
        3 => (any::<prop::sample::Index>(), any::<bool>()).prop_map(|(i, e)| Op::Retire(i, e)),
        1 => Just(Op::Prune),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

/// Drives `subject` and the models through `ops`, checking after every step.
fn check(subject: &mut dyn Tracker, capacity: usize, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut model = EntryModel { entries: Vec::new(), capacity };
    let mut bytes = ByteModel::new();
    let mut bytes_valid = true;
    let mut retired = BTreeSet::new();
    let mut unretired: Vec<(u64, Vec<usize>)> = Vec::new();
    // Per buffer: live entries a bound allows since the last whole-buffer write.
    let mut since_cover = [usize::MAX; BUFFERS];
    for (task, op) in (1u64..).zip(ops) {
        match op {
            Op::Submit(accesses) => {
                let got = subject.submit(task, accesses, &retired);
                let want = model.submit(task, accesses, &retired);
                prop_assert_eq!(&got, &want, "task {} {:?}", task, accesses);
                if bytes_valid {
                    for needed in bytes.submit(task, accesses, &retired) {
                        prop_assert!(
                            got.producers.contains(&needed),
                            "task {} misses its dependency on {}",
                            task,
                            needed
                        );
                    }
                }
                let done = got.full_at.unwrap_or(accesses.len());
                // After a refused insert a real run stops; the byte model no longer applies.
                bytes_valid &= got.full_at.is_none();
                for a in &accesses[..done] {
                    if a.is_whole_write() {
                        since_cover[a.buffer] = 1;
                    } else {
                        since_cover[a.buffer] = since_cover[a.buffer].saturating_add(1);
                    }
                }
                let buffers: BTreeSet<usize> = accesses.iter().map(|a| a.buffer).collect();
                unretired.push((task, buffers.into_iter().collect()));
            }
            Op::Retire(pick, erase) => {
                if unretired.is_empty() {
                    continue;
                }
                let (done, buffers) = unretired.remove(pick.index(unretired.len()));
                retired.insert(done);
                subject.retired(done, &buffers, *erase, &retired);
            }
            Op::Prune => subject.prune(&retired),
        }
        for (b, &bound) in since_cover.iter().enumerate() {
            let Some(live) = subject.live_entries(b, &retired) else { continue };
            prop_assert_eq!(Some(live), model.live_entries(b, &retired), "buffer {}", b);
            prop_assert!(live <= bound, "buffer {} holds {} entries, more than {}", b, live, bound);
        }
    }
    Ok(())
}

/// Drives the fixed map through `ops` with inserts that know only the retired owners `knows`
/// admits (lookups and prunes know them all), as the device runtime does: every producer the
/// byte model requires is still found, and none is retired.
fn check_narrow_inserts(
    map: &mut FixedTensorMap<'_, u64>,
    knows: impl Fn(u64) -> bool,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let base = |b: usize| 0x1000 * (b as u64 + 1);
    let span = |a: &Access| {
        ByteSpan::new(base(a.buffer) + a.start * UNIT, base(a.buffer) + a.end * UNIT).unwrap()
    };
    let mut bytes = ByteModel::new();
    let mut retired = BTreeSet::new();
    let mut unretired: Vec<u64> = Vec::new();
    for (task, op) in (1u64..).zip(ops) {
        match op {
            Op::Submit(accesses) => {
                let mut producers = BTreeSet::new();
                for a in accesses {
                    let is_retired = |o: u64| retired.contains(&o);
                    map.lookup(&base(a.buffer), span(a), a.mode, is_retired, |o| {
                        producers.insert(o);
                    });
                }
                for needed in bytes.submit(task, accesses, &retired) {
                    prop_assert!(producers.contains(&needed), "task {} misses {}", task, needed);
                }
                for a in accesses {
                    let insert_knows = |o: u64| retired.contains(&o) && knows(o);
                    if map.insert(base(a.buffer), span(a), a.mode, task, insert_knows).is_err() {
                        // A refused insert ends a real run; the byte model no longer applies.
                        return Ok(());
                    }
                }
                unretired.push(task);
            }
            Op::Retire(pick, _) => {
                if !unretired.is_empty() {
                    retired.insert(unretired.remove(pick.index(unretired.len())));
                }
            }
            Op::Prune => {
                map.prune_retired(|o| retired.contains(&o));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn inserts_that_know_fewer_retired_owners_lose_no_dependency(
        ops in prop::collection::vec(op(true), 1..80),
        capacity in 1usize..12,
        log_buckets in 0u32..3,
        known_every in 1u64..4,
    ) {
        let mut entries = vec![MapEntry::<u64>::default(); capacity];
        let mut buckets = vec![0u32; 1 << log_buckets];
        let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        // 1: inserts know every retired owner; 2 and 3: only every second or third one.
        check_narrow_inserts(&mut map, |o| o % known_every == 0, &ops)?;
    }

    #[test]
    fn fixed_map_with_address_keys_matches_the_models(
        ops in prop::collection::vec(op(true), 1..80),
        capacity in 1usize..12,
        log_buckets in 0u32..3,
    ) {
        let mut entries = vec![MapEntry::<u64>::default(); capacity];
        let mut buckets = vec![0u32; 1 << log_buckets];
        let map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        let base = |b: usize| 0x1000 * (b as u64 + 1);
        let mut subject = FixedTracker { map, key: base, base, capacity: capacity as u32 };
        check(&mut subject, capacity, &ops)?;
    }

    #[test]
    fn fixed_map_with_tensor_keys_keeps_same_address_buffers_apart(
        ops in prop::collection::vec(op(true), 1..80),
        capacity in 1usize..12,
        log_buckets in 0u32..3,
    ) {
        let mut entries = vec![MapEntry::vacant(TensorKey::Host { addr: 0 }); capacity];
        let mut buckets = vec![0u32; 1 << log_buckets];
        let map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        // Three buffers at one address: host memory and the memory of two children.
        let key = |b: usize| match b {
            0 => TensorKey::Host { addr: 0x1000 },
            n => TensorKey::Child { worker: WorkerId(n as u32 - 1), addr: 0x1000 },
        };
        let mut subject = FixedTracker { map, key, base: |_| 0x1000, capacity: capacity as u32 };
        check(&mut subject, capacity, &ops)?;
    }

    #[test]
    fn fixed_map_reused_after_a_sequence_is_a_new_map(
        first in prop::collection::vec(op(true), 1..80),
        then in prop::collection::vec(op(true), 1..80),
        capacity in 1usize..12,
        log_buckets in 0u32..3,
    ) {
        let mut entries = vec![MapEntry::<u64>::default(); capacity];
        let mut buckets = vec![0u32; 1 << log_buckets];
        let base = |b: usize| 0x1000 * (b as u64 + 1);
        let map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        let mut subject = FixedTracker { map, key: base, base, capacity: capacity as u32 };
        check(&mut subject, capacity, &first)?;
        let handed_out = subject.map.handed_out();
        FixedTensorMap::reuse(&mut entries, &mut buckets, handed_out).unwrap();
        prop_assert!(buckets.iter().all(|&b| b == u32::MAX), "every bucket empty: {:?}", buckets);
        let map = FixedTensorMap::reuse(&mut entries, &mut buckets, 0).unwrap();
        let mut subject = FixedTracker { map, key: base, base, capacity: capacity as u32 };
        check(&mut subject, capacity, &then)?;
    }

    #[test]
    fn fixed_map_reused_over_storage_it_was_not_promised_is_a_new_map(
        first in prop::collection::vec(op(true), 0..80),
        then in prop::collection::vec(op(true), 1..80),
        capacity in 1usize..12,
        log_buckets in 0u32..3,
        handed_out in any::<prop::sample::Index>(),
        heads in prop::collection::vec(prop::option::of(0u32..14), 4),
    ) {
        // Leftovers of a sequence (or none), then a wrong hand-out count and bucket values no
        // map wrote: slots of the pool (chained, vacant or never handed out) and beyond it.
        let mut entries = vec![MapEntry::<u64>::default(); capacity];
        let mut buckets = vec![0u32; 1 << log_buckets];
        let base = |b: usize| 0x1000 * (b as u64 + 1);
        let map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
        let mut subject = FixedTracker { map, key: base, base, capacity: capacity as u32 };
        check(&mut subject, capacity, &first)?;
        for (bucket, head) in buckets.iter_mut().zip(heads) {
            *bucket = head.unwrap_or(*bucket);
        }
        let handed_out = handed_out.index(capacity + 1) as u32;
        let map = FixedTensorMap::reuse(&mut entries, &mut buckets, handed_out).unwrap();
        let mut subject = FixedTracker { map, key: base, base, capacity: capacity as u32 };
        check(&mut subject, capacity, &then)?;
    }

    #[test]
    fn host_map_matches_the_entry_model(
        ops in prop::collection::vec(op(true), 1..80),
    ) {
        let mut subject = HostTracker { map: TensorMap::new() };
        check(&mut subject, usize::MAX, &ops)?;
    }
}
