//! proptest strategies for engine shapes and run plans, used by the property test (with
//! shrinking) and by the stress test (drawn from a seeded deterministic runner).

use proptest::prelude::*;
use proptest::sample::subsequence;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use simpler_types::TensorArgType;

use super::plan::{
    Action, BufferRef, EngineShape, MemberPlan, Op, RunEnd, RunPlan, TaskKind, TaskPlan,
    TensorPlan, ViewPlan,
};

/// How large and how eventful generated runs are.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Most ops per run.
    pub max_ops: usize,
    /// Whether endpoints yield and sleep (up to ~300 µs) to vary interleavings.
    pub delays: bool,
    /// Chance per member, in thousandths, that it fails (spread over the four failure kinds).
    pub failures_per_mille: u32,
}

/// Engines of one to three NEXT_LEVEL endpoints with ids drawn from a sparse set (so ids and
/// registration positions differ) and zero to two SUB endpoints.
pub fn engine_shape() -> impl Strategy<Value = EngineShape> {
    (subsequence(vec![0u32, 1, 2, 3, 7, 9], 1..=3).prop_shuffle(), 0u32..=2)
        .prop_map(|(next_level, subs)| EngineShape { next_level, subs })
}

fn tag() -> impl Strategy<Value = TensorArgType> {
    prop_oneof![
        4 => Just(TensorArgType::Input),
        2 => Just(TensorArgType::Output),
        3 => Just(TensorArgType::InOut),
        1 => Just(TensorArgType::OutputExisting),
        1 => Just(TensorArgType::NoDep),
    ]
}

fn buffer() -> impl Strategy<Value = BufferRef> {
    prop_oneof![
        24 => any::<u8>().prop_map(BufferRef::Shared),
        12 => any::<u8>().prop_map(BufferRef::Alloc),
        1 => Just(BufferRef::Null),
    ]
}

fn view() -> impl Strategy<Value = ViewPlan> {
    prop_oneof![
        2 => Just(ViewPlan::Whole),
        3 => (any::<u8>(), any::<u8>()).prop_map(|(start, len)| ViewPlan::Range { start, len }),
        2 => (any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(start, count, step)| ViewPlan::Strided { start, count, step }),
        2 => (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(row, col, rows, cols)| ViewPlan::Window { row, col, rows, cols }),
    ]
}

fn tensor() -> impl Strategy<Value = TensorPlan> {
    (buffer(), view(), tag()).prop_map(|(buffer, view, tag)| TensorPlan { buffer, view, tag })
}

fn action(per_mille: u32) -> impl Strategy<Value = Action> {
    let each = per_mille.div_ceil(4).max(1);
    prop_oneof![
        1000u32.saturating_sub(4 * each).max(1) => Just(Action::Succeed),
        each => Just(Action::Fail),
        each => Just(Action::EndpointFail),
        each => Just(Action::Panic),
        each => Just(Action::PanickedResult),
    ]
}

fn delay(delays: bool) -> BoxedStrategy<u16> {
    if delays {
        prop_oneof![6 => Just(0u16), 2 => Just(1u16), 2 => 2u16..300].boxed()
    } else {
        Just(0u16).boxed()
    }
}

fn member(sizes: Sizes) -> impl Strategy<Value = MemberPlan> {
    (
        proptest::collection::vec(tensor(), 0..=3),
        action(sizes.failures_per_mille),
        delay(sizes.delays),
    )
        .prop_map(|(tensors, action, delay_us)| MemberPlan { tensors, action, delay_us })
}

/// Member counts: mostly one, groups up to the pool (`pool` endpoints), and now and then one
/// more than the pool, which the engine must refuse.
fn member_count(pool: usize) -> BoxedStrategy<usize> {
    if pool > 1 {
        prop_oneof![12 => Just(1usize), 3 => 2..=pool.min(3), 1 => Just(pool + 1)].boxed()
    } else {
        prop_oneof![12 => Just(1usize), 1 => Just(pool + 1)].boxed()
    }
}

fn task(sizes: Sizes, shape: &EngineShape) -> impl Strategy<Value = TaskPlan> + use<> {
    let subs = shape.subs as usize;
    let next_level =
        (any::<u8>(), prop::bool::weighted(0.01), member_count(shape.next_level.len())).prop_map(
            |(first, unknown_target, n)| (TaskKind::NextLevel { first, unknown_target }, n),
        );
    let sub = member_count(subs).prop_map(|n| (TaskKind::Sub, n));
    // Without SUB endpoints, SUB tasks are rare (each one is refused).
    let sub_weight = if subs == 0 { 1 } else { 5 };
    prop_oneof![20 => next_level, sub_weight => sub].prop_flat_map(move |(kind, n)| {
        proptest::collection::vec(member(sizes), n)
            .prop_map(move |members| TaskPlan { kind, members })
    })
}

fn op(sizes: Sizes, shape: &EngineShape) -> BoxedStrategy<Op> {
    let alloc = prop_oneof![1 => Just(0u32), 6 => 1u32..=256, 1 => 257u32..=4096]
        .prop_map(|bytes| Op::Alloc { bytes });
    let base = prop_oneof![
        14 => task(sizes, shape).prop_map(Op::Submit),
        3 => alloc,
        1 => Just(Op::ScopeBegin),
        1 => Just(Op::ScopeEnd),
    ];
    if sizes.delays {
        // Orchestration pauses let tasks finish, and fail, while submission goes on.
        prop_oneof![19 => base, 1 => (1u16..200).prop_map(|us| Op::Pause { us })].boxed()
    } else {
        base.boxed()
    }
}

fn end() -> impl Strategy<Value = RunEnd> {
    prop_oneof![
        16 => Just(RunEnd::Close),
        2 => Just(RunEnd::Abort),
        2 => Just(RunEnd::Fail),
        1 => Just(RunEnd::DropBuilder),
    ]
}

/// One run of up to `sizes.max_ops` ops on an engine of `shape`.
pub fn run_plan(sizes: Sizes, shape: &EngineShape) -> impl Strategy<Value = RunPlan> + use<> {
    (
        proptest::collection::vec(op(sizes, shape), 0..=sizes.max_ops),
        end(),
        prop::bool::weighted(0.25),
    )
        .prop_map(|(ops, end, gated)| RunPlan { ops, end, gated })
}

/// Draws values deterministically from one seed (no shrinking).
pub struct Draw {
    runner: TestRunner,
}

impl Draw {
    /// A generator seeded by `seed`.
    pub fn new(seed: u64) -> Draw {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        bytes[8..16].copy_from_slice(b"schedstr");
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
        Draw { runner: TestRunner::new_with_rng(Config::default(), rng) }
    }

    /// One value of `strategy`.
    pub fn value<S: Strategy>(&mut self, strategy: S) -> S::Value {
        strategy.new_tree(&mut self.runner).expect("strategies here never reject").current()
    }
}
