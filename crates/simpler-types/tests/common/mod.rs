//! Helpers shared by the property tests.

use proptest::test_runner::{Config, FileFailurePersistence};

/// Modest case count for normal runs (`PROPTEST_CASES` overrides it for longer soaks), with
/// failures recorded in `proptest-regressions/<file>` of this crate.
pub fn proptest_config(default_cases: u32, regressions_file: &'static str) -> Config {
    let cases =
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default_cases);
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(regressions_file))),
        ..Config::default()
    }
}
