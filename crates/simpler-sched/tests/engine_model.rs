//! Engine state-machine property test: random DAG descriptions — tags over
//! overlapping views of shared buffers and of `alloc()` slabs, groups, SUB tasks, nested and
//! unbalanced scopes, failing and panicking endpoints, failed, aborted and dropped submissions —
//! run one after another on one engine with fake endpoints, each checked against a reference
//! model built from std collections (`support::model`).
//!
//! Per run: the fence fires, no slot stays active, the tensor map holds nothing of the run, no
//! task ran before its producers finished or after one failed, each task ran at most once and
//! groups ran all-or-nothing; in gated runs (endpoints hold every member until the graph is
//! built) the engine's edges equal the model's exactly. After every release: no live slot and
//! every heap ring rewound.
//! After the engine: every charge reclaimed, every endpoint and engine thread gone.
//!
//! Cases default to 48; set `PROPTEST_CASES` for more. Failures are persisted in
//! `proptest-regressions/engine_model.txt`.

mod support;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

use support::driver::{Driver, finish_engine};
use support::endpoint::Recorder;
use support::env::start_engine;
use support::plan::{EngineShape, RunPlan};
use support::strategy::{Sizes, engine_shape, run_plan};

/// Engine level of this test (an L4-style engine: NEXT_LEVEL callables are graphs).
const LEVEL: u8 = 5;

/// Small runs with frequent failures; no endpoint delays (interleavings are the stress test's
/// business), so cases are quick and shrink well.
const SIZES: Sizes = Sizes { max_ops: 24, delays: false, failures_per_mille: 30 };

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48);
    ProptestConfig {
        cases,
        // A hang costs a full fence timeout per shrinking step; bound the search.
        max_shrink_time: 120_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/engine_model.txt",
        ))),
        ..ProptestConfig::default()
    }
}

fn check(shape: &EngineShape, plans: &[RunPlan]) -> Result<(), TestCaseError> {
    let recorder = Recorder::new();
    let engine = start_engine(shape, LEVEL, &recorder);
    let driver =
        Driver { engine: &engine, shape, level: LEVEL, recorder: &recorder, exclusive: true };
    let mut reports = Vec::with_capacity(plans.len());
    for (k, plan) in plans.iter().enumerate() {
        let report = driver.run(plan).map_err(TestCaseError::fail)?;
        prop_assert_eq!(report.run.get(), k as u64 + 1, "run ids are issued in order from 1");
        reports.push(report);
    }
    finish_engine(engine, shape, LEVEL, &recorder, &reports).map_err(TestCaseError::fail)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn runs_match_the_reference_model(
        (shape, plans) in engine_shape().prop_flat_map(|shape| {
            let plans = proptest::collection::vec(run_plan(SIZES, &shape), 1..=3);
            (Just(shape), plans)
        }),
    ) {
        check(&shape, &plans)?;
    }
}
