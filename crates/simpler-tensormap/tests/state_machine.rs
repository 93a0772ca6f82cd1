//! Property test: the map against a plain list of `(run, key, span, producer)` entries
//! (the map invariants, and the footprint rules of `docs/tensormap.md` §4).
//!
//! The universe is small on purpose (3 runs, 4 workers, 16 addresses, most spans inside 20
//! bytes, 12 slot ids) so that the same key, overlapping spans and the same owner recur often.
//! Scatters of up to 80 one-byte writes push a key's list past its plain size (32 entries), and
//! wide writes (up to byte 121, and `ByteSpan::ALL`) supersede such a list down to a few entries
//! and then meet it with an entry longer than any it held.

use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, FileFailurePersistence};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};
use simpler_tensormap::{ByteSpan, RemoteSpace, TensorKey, TensorMap};
use simpler_types::{RunId, SlotId, WorkerId};

const RUNS: u64 = 3;
const WORKERS: u32 = 4;
const ADDRS: u64 = 16;
/// Probe spans cover bytes `0..PROBE_END`, where most generated spans lie.
const PROBE_END: u64 = 20;
/// Single-byte probes beyond `PROBE_END`, inside and past long scatters and wide writes (which
/// reach byte 121) and far beyond them (only `ByteSpan::ALL` reaches there).
const FAR_PROBES: [u64; 8] = [20, 39, 40, 79, 80, 100, 121, 5000];

fn run(i: u64) -> RunId {
    RunId::from_raw(i).expect("run ids in the universe are non-zero")
}

fn runs() -> impl Iterator<Item = RunId> {
    (1..=RUNS).map(run)
}

/// Every key of the universe, for invariant 8 (no two distinct keys alias).
fn all_keys() -> Vec<TensorKey> {
    let mut keys: Vec<TensorKey> = (0..ADDRS).map(|addr| TensorKey::Host { addr }).collect();
    for w in 0..WORKERS {
        keys.extend((0..ADDRS).map(|addr| TensorKey::Child { worker: WorkerId(w), addr }));
    }
    for space in [RemoteSpace::Buffer, RemoteSpace::HostInline] {
        for owner in 0..WORKERS {
            for (buffer_id, generation, offset) in
                [(0, 0, 0), (0, 0, 64), (0, 1, 0), (1, 0, 0), (1, 1, 64)]
            {
                keys.push(TensorKey::Remote {
                    space,
                    owner: WorkerId(owner),
                    buffer_id,
                    generation,
                    offset,
                });
            }
        }
    }
    keys
}

fn key_strategy() -> impl Strategy<Value = TensorKey> {
    // Low addresses are drawn more often so that keys collide.
    let addr = prop_oneof![3 => 0..4_u64, 1 => 0..ADDRS];
    let remote = (
        prop_oneof![Just(RemoteSpace::Buffer), Just(RemoteSpace::HostInline)],
        0..WORKERS,
        0..2_u64,
        0..2_u64,
        prop_oneof![Just(0_u64), Just(64)],
    )
        .prop_map(|(space, owner, buffer_id, generation, offset)| TensorKey::Remote {
            space,
            owner: WorkerId(owner),
            buffer_id,
            generation,
            offset,
        });
    prop_oneof![
        4 => addr.clone().prop_map(|addr| TensorKey::Host { addr }),
        3 => (0..WORKERS, addr).prop_map(|(w, addr)| TensorKey::Child { worker: WorkerId(w), addr }),
        1 => remote,
    ]
}

/// Keys for the fan-in ops (`Scatter`, `Reclaim`, `Chain`): two buffers, so that these ops meet
/// each other's lists often.
fn hot_key_strategy() -> impl Strategy<Value = TensorKey> {
    (0..2_u64).prop_map(|addr| TensorKey::Host { addr })
}

/// Spans up to and past the width of a scatter, and every byte: they supersede a fan-in down to
/// a few entries, then meet the list with an entry longer than any it held.
fn wide_span_strategy() -> impl Strategy<Value = ByteSpan> {
    prop_oneof![
        // Mostly from byte 0, where scatters start, so that one write can cover a whole scatter.
        3 => (prop_oneof![3 => Just(0_u64), 1 => 1..3_u64], 20..120_u64)
            .prop_map(|(s, l)| ByteSpan { start: s, end: s + l }),
        2 => Just(ByteSpan::ALL),
    ]
}

fn span_strategy() -> impl Strategy<Value = ByteSpan> {
    prop_oneof![
        8 => (0..16_u64, 1..5_u64).prop_map(|(s, l)| ByteSpan { start: s, end: s + l }),
        2 => (0..8_u64, 8..13_u64).prop_map(|(s, l)| ByteSpan { start: s, end: s + l }),
        1 => Just(ByteSpan::ALL),
        2 => wide_span_strategy(),
        // Empty and inverted spans: the map must ignore them.
        1 => (0..PROBE_END, 0..3_u64).prop_map(|(s, d)| ByteSpan { start: s, end: s.saturating_sub(d) }),
    ]
}

fn slot_strategy() -> impl Strategy<Value = SlotId> {
    (0..6_u32, 1..3_u32).prop_map(|(i, g)| SlotId::new(i, g))
}

fn run_strategy() -> impl Strategy<Value = RunId> {
    (1..=RUNS).prop_map(run)
}

/// The one-byte span at `i`.
fn byte(i: u64) -> ByteSpan {
    ByteSpan { start: i, end: i + 1 }
}

/// The producer of byte `i` in a `Scatter` starting at slot number `first`: one of 80 producers
/// of their own when `distinct`, else one of the 12 slots of the universe (so a scatter longer
/// than 12 bytes gives some producers several entries).
fn scatter_slot(first: u32, i: u64, distinct: bool) -> SlotId {
    let n = u64::from(first) + i;
    if distinct {
        return SlotId::new(100 + (n % 80) as u32, 1);
    }
    let n = n % 12;
    SlotId::new((n % 6) as u32, 1 + (n / 6) as u32)
}

/// Owners for `EraseOwned`: mostly the 12-slot universe, sometimes a distinct scatter producer.
fn owner_strategy() -> impl Strategy<Value = SlotId> {
    prop_oneof![3 => slot_strategy(), 1 => (100..180_u32).prop_map(|i| SlotId::new(i, 1))]
}

#[derive(Clone, Debug)]
enum Op {
    Insert {
        run: RunId,
        key: TensorKey,
        span: ByteSpan,
        slot: SlotId,
        guarded: bool,
    },
    Lookup {
        run: RunId,
        key: TensorKey,
        span: ByteSpan,
        guarded: bool,
    },
    EraseOwned {
        run: RunId,
        owner: SlotId,
        keys: Vec<TensorKey>,
        guarded: bool,
    },
    EraseRun {
        run: RunId,
        guarded: bool,
    },
    /// A fan-in shape: `count` one-byte writes of consecutive bytes, under one guard. Long
    /// enough to push a key's list into its indexed mode. With `distinct` every byte has its own
    /// producer; otherwise producers repeat from the 12-slot universe.
    Scatter {
        run: RunId,
        key: TensorKey,
        count: u64,
        first: u32,
        distinct: bool,
    },
    /// The reclamation of a fan-in: one `erase_owned` of `key` for each of `count` scatter
    /// producers, in order, under one guard.
    Reclaim {
        run: RunId,
        key: TensorKey,
        first: u32,
        count: u32,
        distinct: bool,
    },
    /// The life of one buffer under one guard: writes, reads and reclaims of `key` in order.
    Chain {
        run: RunId,
        key: TensorKey,
        steps: Vec<Step>,
    },
    /// A whole submit under one guard: lookups and inserts of several tensors.
    Submit {
        run: RunId,
        slot: SlotId,
        accesses: Vec<(TensorKey, ByteSpan, bool)>,
    },
}

/// One step of a `Chain`.
#[derive(Clone, Debug)]
enum Step {
    Write(ByteSpan, SlotId),
    Read(ByteSpan),
    Reclaim(SlotId),
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (span_strategy(), slot_strategy()).prop_map(|(span, slot)| Step::Write(span, slot)),
        2 => (wide_span_strategy(), slot_strategy()).prop_map(|(span, slot)| Step::Write(span, slot)),
        2 => span_strategy().prop_map(Step::Read),
        2 => owner_strategy().prop_map(Step::Reclaim),
    ]
}

/// What one `Chain` step must return: a count for writes and reclaims, a producer set for reads.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Count(usize),
    Seen(BTreeSet<SlotId>),
}

type ModelEntry = (RunId, TensorKey, ByteSpan, SlotId);

#[derive(Clone, Debug, Default)]
struct Model {
    entries: Vec<ModelEntry>,
    /// `(run, key)` pairs the ops have named; probed with many spans after every op.
    touched: BTreeSet<(RunId, TensorKey)>,
    /// What the last mutating op must return.
    expected: usize,
    /// What the lookups of the last `Submit` must visit, in order.
    expected_lookups: Vec<BTreeSet<SlotId>>,
    /// What each step of the last `Chain` must return, in order.
    expected_steps: Vec<Outcome>,
}

impl Model {
    fn insert(&mut self, run: RunId, key: TensorKey, span: ByteSpan, slot: SlotId) -> usize {
        if span.is_empty() {
            return 0;
        }
        let before = self.entries.len();
        self.entries.retain(|&(r, k, s, _)| !(r == run && k == key && span.contains(s)));
        let superseded = before - self.entries.len();
        self.entries.push((run, key, span, slot));
        superseded
    }

    fn erase_owned(&mut self, run: RunId, owner: SlotId, keys: &[TensorKey]) -> usize {
        let before = self.entries.len();
        self.entries.retain(|&(r, k, _, s)| !(r == run && s == owner && keys.contains(&k)));
        before - self.entries.len()
    }

    fn erase_run(&mut self, run: RunId) -> usize {
        let before = self.entries.len();
        self.entries.retain(|&(r, ..)| r != run);
        before - self.entries.len()
    }

    /// The producers a lookup must visit: distinct slots of overlapping entries.
    fn overlapping(&self, run: RunId, key: &TensorKey, span: ByteSpan) -> BTreeSet<SlotId> {
        self.entries
            .iter()
            .filter(|&&(r, k, s, _)| r == run && k == *key && s.overlaps(span))
            .map(|&(.., slot)| slot)
            .collect()
    }

    fn len_run(&self, run: RunId) -> usize {
        self.entries.iter().filter(|&&(r, ..)| r == run).count()
    }
}

struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Model;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Model> {
        Just(Model::default()).boxed()
    }

    fn transitions(_state: &Model) -> BoxedStrategy<Op> {
        let keys = prop::collection::vec(key_strategy(), 0..5);
        let access = (key_strategy(), span_strategy(), any::<bool>());
        prop_oneof![
            6 => (run_strategy(), key_strategy(), span_strategy(), slot_strategy(), any::<bool>())
                .prop_map(|(run, key, span, slot, guarded)| Op::Insert { run, key, span, slot, guarded }),
            2 => (run_strategy(), key_strategy(), span_strategy(), any::<bool>())
                .prop_map(|(run, key, span, guarded)| Op::Lookup { run, key, span, guarded }),
            4 => (run_strategy(), owner_strategy(), keys, any::<bool>())
                .prop_map(|(run, owner, keys, guarded)| Op::EraseOwned { run, owner, keys, guarded }),
            1 => (run_strategy(), any::<bool>()).prop_map(|(run, guarded)| Op::EraseRun { run, guarded }),
            1 => (run_strategy(), hot_key_strategy(), 17..80_u64, 0..80_u32, any::<bool>())
                .prop_map(|(run, key, count, first, distinct)| Op::Scatter { run, key, count, first, distinct }),
            1 => (run_strategy(), hot_key_strategy(), 0..80_u32, 1..80_u32, any::<bool>())
                .prop_map(|(run, key, first, count, distinct)| Op::Reclaim { run, key, first, count, distinct }),
            3 => (run_strategy(), hot_key_strategy(), prop::collection::vec(step_strategy(), 1..10))
                .prop_map(|(run, key, steps)| Op::Chain { run, key, steps }),
            2 => (run_strategy(), slot_strategy(), prop::collection::vec(access, 1..4))
                .prop_map(|(run, slot, accesses)| Op::Submit { run, slot, accesses }),
        ]
        .boxed()
    }

    fn apply(mut model: Model, op: &Op) -> Model {
        match op {
            Op::Insert { run, key, span, slot, .. } => {
                model.touched.insert((*run, *key));
                model.expected = model.insert(*run, *key, *span, *slot);
            }
            Op::Lookup { run, key, .. } => {
                model.touched.insert((*run, *key));
            }
            Op::EraseOwned { run, owner, keys, .. } => {
                model.touched.extend(keys.iter().map(|k| (*run, *k)));
                model.expected = model.erase_owned(*run, *owner, keys);
            }
            Op::EraseRun { run, .. } => model.expected = model.erase_run(*run),
            Op::Scatter { run, key, count, first, distinct } => {
                model.touched.insert((*run, *key));
                model.expected = (0..*count)
                    .map(|i| model.insert(*run, *key, byte(i), scatter_slot(*first, i, *distinct)))
                    .sum();
            }
            Op::Reclaim { run, key, first, count, distinct } => {
                model.touched.insert((*run, *key));
                model.expected = (0..*count)
                    .map(|i| {
                        model.erase_owned(
                            *run,
                            scatter_slot(*first, u64::from(i), *distinct),
                            &[*key],
                        )
                    })
                    .sum();
            }
            Op::Chain { run, key, steps } => {
                model.touched.insert((*run, *key));
                model.expected_steps = steps
                    .iter()
                    .map(|step| match *step {
                        Step::Write(span, slot) => {
                            Outcome::Count(model.insert(*run, *key, span, slot))
                        }
                        Step::Read(span) => Outcome::Seen(model.overlapping(*run, key, span)),
                        Step::Reclaim(owner) => {
                            Outcome::Count(model.erase_owned(*run, owner, &[*key]))
                        }
                    })
                    .collect();
            }
            Op::Submit { run, slot, accesses } => {
                // Tensors are walked in order; each one looks up, then inserts if it writes.
                let mut superseded = 0;
                model.expected_lookups.clear();
                for (key, span, writes) in accesses {
                    model.touched.insert((*run, *key));
                    let seen = model.overlapping(*run, key, *span);
                    model.expected_lookups.push(seen);
                    if *writes {
                        superseded += model.insert(*run, *key, *span, *slot);
                    }
                }
                model.expected = superseded;
            }
        }
        model
    }
}

struct MapUnderTest;

/// Runs a lookup and checks that no producer is visited twice (rule D.2).
fn visit_set(map: &TensorMap, run: RunId, key: &TensorKey, span: ByteSpan) -> BTreeSet<SlotId> {
    let mut visited = Vec::new();
    map.lookup_overlapping(run, key, span, |s| visited.push(s));
    let set: BTreeSet<SlotId> = visited.iter().copied().collect();
    assert_eq!(set.len(), visited.len(), "a producer was visited twice: {visited:?}");
    set
}

/// Snapshot of every whole-buffer lookup of the runs other than `run`, for invariant 5.
fn other_runs_view(map: &TensorMap, model: &Model, run: RunId) -> Vec<BTreeSet<SlotId>> {
    model
        .touched
        .iter()
        .filter(|(r, _)| *r != run)
        .map(|(r, k)| visit_set(map, *r, k, ByteSpan::ALL))
        .collect()
}

impl StateMachineTest for MapUnderTest {
    type SystemUnderTest = TensorMap;
    type Reference = Reference;

    fn init_test(_model: &Model) -> TensorMap {
        TensorMap::new()
    }

    fn apply(map: TensorMap, model: &Model, op: Op) -> TensorMap {
        let op_run = match &op {
            Op::Insert { run, .. }
            | Op::Lookup { run, .. }
            | Op::EraseOwned { run, .. }
            | Op::EraseRun { run, .. }
            | Op::Scatter { run, .. }
            | Op::Reclaim { run, .. }
            | Op::Chain { run, .. }
            | Op::Submit { run, .. } => *run,
        };
        let others_before = other_runs_view(&map, model, op_run);
        match op {
            Op::Insert { run, key, span, slot, guarded } => {
                let superseded = if guarded {
                    map.lock().insert(run, key, span, slot)
                } else {
                    map.insert(run, key, span, slot)
                };
                // Invariant D.6 / A.6.2: the count of superseded entries matches, and afterwards
                // the new producer is found over its own span.
                assert_eq!(superseded, model.expected, "insert {key} {span} by {slot}");
                if !span.is_empty() {
                    assert!(visit_set(&map, run, &key, span).contains(&slot));
                }
            }
            Op::Lookup { run, key, span, guarded } => {
                let mut visited = Vec::new();
                if guarded {
                    map.lock().lookup_overlapping(run, &key, span, |s| visited.push(s));
                } else {
                    map.lookup_overlapping(run, &key, span, |s| visited.push(s));
                }
                let set: BTreeSet<SlotId> = visited.iter().copied().collect();
                assert_eq!(set.len(), visited.len(), "a producer was visited twice");
                assert_eq!(set, model.overlapping(run, &key, span), "lookup {run} {key} {span}");
            }
            Op::EraseOwned { run, owner, keys, guarded } => {
                let len_before = map.len();
                let removed = if guarded {
                    map.lock().erase_owned(run, owner, &keys)
                } else {
                    map.erase_owned(run, owner, &keys)
                };
                // A.6.3 and A.6.4: the count matches, and an empty list removes nothing.
                assert_eq!(removed, model.expected, "erase_owned {run} {owner} {keys:?}");
                if keys.is_empty() {
                    assert_eq!((removed, map.len()), (0, len_before));
                }
                for key in &keys {
                    assert!(
                        !visit_set(&map, run, key, ByteSpan::ALL).contains(&owner),
                        "{owner} still produces {key} after its erase"
                    );
                }
            }
            Op::EraseRun { run, guarded } => {
                let removed = if guarded { map.lock().erase_run(run) } else { map.erase_run(run) };
                // A.6.7: the run is empty afterwards.
                assert_eq!(removed, model.expected);
                assert_eq!(map.len_run(run), 0);
            }
            Op::Scatter { run, key, count, first, distinct } => {
                let mut guard = map.lock();
                let superseded: usize = (0..count)
                    .map(|i| guard.insert(run, key, byte(i), scatter_slot(first, i, distinct)))
                    .sum();
                assert_eq!(superseded, model.expected);
            }
            Op::Reclaim { run, key, first, count, distinct } => {
                let mut guard = map.lock();
                let removed: usize = (0..count)
                    .map(|i| {
                        guard.erase_owned(run, scatter_slot(first, u64::from(i), distinct), &[key])
                    })
                    .sum();
                assert_eq!(removed, model.expected);
            }
            Op::Chain { run, key, steps } => {
                let mut guard = map.lock();
                for (step, expected) in steps.into_iter().zip(&model.expected_steps) {
                    let outcome = match step {
                        Step::Write(span, slot) => {
                            Outcome::Count(guard.insert(run, key, span, slot))
                        }
                        Step::Read(span) => {
                            let mut seen = BTreeSet::new();
                            guard.lookup_overlapping(run, &key, span, |s| assert!(seen.insert(s)));
                            Outcome::Seen(seen)
                        }
                        Step::Reclaim(owner) => {
                            Outcome::Count(guard.erase_owned(run, owner, &[key]))
                        }
                    };
                    assert_eq!(&outcome, expected, "chain on {run} {key}");
                }
            }
            Op::Submit { run, slot, accesses } => {
                let mut guard = map.lock();
                let mut superseded = 0;
                for ((key, span, writes), expected) in
                    accesses.into_iter().zip(&model.expected_lookups)
                {
                    let mut seen = BTreeSet::new();
                    guard.lookup_overlapping(run, &key, span, |s| assert!(seen.insert(s)));
                    assert_eq!(&seen, expected, "submit lookup {key} {span}");
                    if writes {
                        superseded += guard.insert(run, key, span, slot);
                    }
                }
                assert_eq!(superseded, model.expected);
            }
        }
        // A.6.5: no operation on one run changes what another run sees.
        assert_eq!(other_runs_view(&map, model, op_run), others_before, "op on {op_run} leaked");
        map
    }

    fn check_invariants(map: &TensorMap, model: &Model) {
        // A.6.6: counts.
        assert_eq!(map.len(), model.entries.len());
        assert_eq!(map.is_empty(), model.entries.is_empty());
        let per_run: Vec<usize> = runs().map(|r| map.len_run(r)).collect();
        assert_eq!(per_run, runs().map(|r| model.len_run(r)).collect::<Vec<_>>());
        assert_eq!(per_run.iter().sum::<usize>(), map.len());
        {
            let guard = map.lock();
            assert_eq!(
                (guard.len(), guard.is_empty()),
                (model.entries.len(), model.entries.is_empty())
            );
            assert!(runs().all(|r| guard.len_run(r) == model.len_run(r)));
        }
        // A.6.1 and A.6.8 over the whole universe with a whole-buffer span: every key sees
        // exactly its own producers, so no two distinct keys alias.
        for r in runs() {
            for key in all_keys() {
                let expected = model.overlapping(r, &key, ByteSpan::ALL);
                assert_eq!(visit_set(map, r, &key, ByteSpan::ALL), expected, "{r} {key}");
            }
        }
        // D.6 on the keys in play: every single byte and every two-byte window sees exactly the
        // overlapping producers, so partially covered entries survive and disjoint spans of
        // one buffer never produce an edge.
        for (r, key) in &model.touched {
            for start in 0..PROBE_END {
                for len in [1, 2] {
                    let probe = ByteSpan { start, end: start + len };
                    assert_eq!(
                        visit_set(map, *r, key, probe),
                        model.overlapping(*r, key, probe),
                        "{r} {key} {probe}"
                    );
                }
            }
            for probe in FAR_PROBES.map(byte) {
                assert_eq!(
                    visit_set(map, *r, key, probe),
                    model.overlapping(*r, key, probe),
                    "{r} {key} {probe}"
                );
            }
        }
    }
}

/// Case count: `PROPTEST_CASES` when set, else a modest default for ordinary test runs.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(96);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/state_machine.txt",
        ))),
        ..ProptestConfig::default()
    }
}

prop_state_machine! {
    #![proptest_config(config())]

    #[test]
    fn map_matches_the_entry_list_model(sequential 1..60 => MapUnderTest);
}
