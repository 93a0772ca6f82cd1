//! The chip runtimes as xtask sees them: `test --runtime hbg|trb|all`, `build --runtime …`,
//! and the per-runtime test step of `ci`.
//!
//! The runtime is chosen when a device runner attaches, so one build serves both; what differs
//! per runtime is which suites run and under which runtime. The device crate's shared test
//! fixtures attach with the runtime named by [`ENV_TEST_RUNTIME`] (host_build_graph when
//! unset), so the suites in [`DEVICE_SUITES`] run once per runtime; everything else (the rest
//! of the workspace, the hbg-specific and trb-specific tests, which name their runtime) runs
//! in the hbg step.

use std::process::ExitCode;

/// The variable the device crate's test fixtures read: `hbg` or `trb`.
pub const ENV_TEST_RUNTIME: &str = "SIMPLER_TEST_RUNTIME";

/// The device crate's integration suites that run once per runtime.
pub const DEVICE_SUITES: &[&str] =
    &["conformance", "end_to_end", "streaming_paged", "faults", "bad_input", "write_after_read"];

/// One chip runtime.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Runtime {
    /// host_build_graph.
    Hbg,
    /// tensormap_and_ringbuffer.
    Trb,
}

impl Runtime {
    /// The name `--runtime` and [`ENV_TEST_RUNTIME`] use.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Hbg => "hbg",
            Runtime::Trb => "trb",
        }
    }
}

/// The runtimes `--runtime` selects in `args` (`hbg`, `trb` or `all`); `default` when absent.
pub fn selection(args: &[String], default: &[Runtime]) -> Result<Vec<Runtime>, String> {
    let value = match args.iter().position(|a| a == "--runtime") {
        Some(i) => args.get(i + 1).map(String::as_str).ok_or("--runtime needs hbg, trb or all")?,
        None => match args.iter().find_map(|a| a.strip_prefix("--runtime=")) {
            Some(v) => v,
            None => return Ok(default.to_vec()),
        },
    };
    match value {
        "hbg" => Ok(vec![Runtime::Hbg]),
        "trb" => Ok(vec![Runtime::Trb]),
        "all" => Ok(vec![Runtime::Hbg, Runtime::Trb]),
        other => Err(format!("--runtime is hbg, trb or all (got `{other}`)")),
    }
}

/// `cargo xtask test [--deep] [--runtime hbg|trb|all]`: the workspace tests (hbg, the default),
/// and [`DEVICE_SUITES`] under trb.
pub fn test(args: &[String]) -> Result<(), String> {
    let deep = args.iter().any(|a| a == "--deep");
    let runtimes = selection(args, &[Runtime::Hbg])?;
    run_tests(&runtimes, deep)
}

/// The test step of `ci`: the workspace tests, then the device suites under trb.
pub fn ci_tests() -> Result<(), String> {
    run_tests(&[Runtime::Hbg, Runtime::Trb], false)
}

fn run_tests(runtimes: &[Runtime], deep: bool) -> Result<(), String> {
    for &runtime in runtimes {
        match runtime {
            Runtime::Hbg => crate::test(deep, &[(ENV_TEST_RUNTIME, Runtime::Hbg.name())])?,
            Runtime::Trb => device_suites(Runtime::Trb, deep)?,
        }
    }
    Ok(())
}

/// [`DEVICE_SUITES`] with the fixtures attaching under `runtime`.
fn device_suites(runtime: Runtime, deep: bool) -> Result<(), String> {
    let mut args = vec!["test", "-p", "simpler-device-a2a3", "--all-features", "--no-fail-fast"];
    for suite in DEVICE_SUITES {
        args.extend(["--test", suite]);
    }
    let mut env = vec![(ENV_TEST_RUNTIME, runtime.name())];
    if deep {
        env.push(("PROPTEST_CASES", crate::DEEP_PROPTEST_CASES));
    }
    crate::cargo(&args, &env)
}

/// The chip-program examples `ci` runs again under trb (release builds, as the hbg runs).
const TRB_EXAMPLES: &[&str] = &["vector_example", "bgemm"];

/// The examples step of `ci` for trb: [`TRB_EXAMPLES`] with `--runtime trb`.
pub fn ci_trb_examples() -> Result<(), String> {
    for example in TRB_EXAMPLES {
        crate::cargo(&["run", "--release", "--example", example, "--", "--runtime", "trb"], &[])?;
    }
    Ok(())
}

/// `cargo xtask build [--runtime hbg|trb|all] [--platform a2a3 [--standin]]`. With
/// `--platform`, the onboard build of each selected runtime (module `onboard`). Without, the
/// simulator build: every workspace target, then per runtime the device programs as the host
/// builds them, with their manifest at `target/simpler-onboard/standin/<runtime>/`.
pub fn build(args: &[String]) -> ExitCode {
    let runtimes = match selection(args, &[Runtime::Hbg]) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("xtask build: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.iter().any(|a| a == "--platform" || a.starts_with("--platform=")) {
        for runtime in runtimes {
            let code = crate::onboard::build(&with_runtime(args, runtime));
            if code != ExitCode::SUCCESS {
                return code;
            }
        }
        return ExitCode::SUCCESS;
    }
    if let Err(e) = crate::cargo(&["build", "--workspace", "--all-targets", "--all-features"], &[])
    {
        eprintln!("xtask build: {e}");
        return ExitCode::FAILURE;
    }
    for runtime in runtimes {
        match crate::onboard_build::host_artifacts(runtime.name()) {
            Ok(manifest) => {
                println!("xtask build: {} device programs: {}", runtime.name(), manifest.display())
            }
            Err(e) => {
                eprintln!("xtask build: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// `args` with `--runtime` set to `runtime` (replacing a given value, `all` included).
fn with_runtime(args: &[String], runtime: Runtime) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len() + 2);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--runtime" {
            it.next();
        } else if !a.starts_with("--runtime=") {
            out.push(a.clone());
        }
    }
    out.extend(["--runtime".to_owned(), runtime.name().to_owned()]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn the_runtime_selection_reads_both_spellings_and_defaults() {
        let hbg = [Runtime::Hbg];
        assert_eq!(selection(&args(&["--deep"]), &hbg).unwrap(), hbg);
        assert_eq!(selection(&args(&["--runtime", "trb"]), &hbg).unwrap(), [Runtime::Trb]);
        assert_eq!(
            selection(&args(&["--runtime=all"]), &hbg).unwrap(),
            [Runtime::Hbg, Runtime::Trb]
        );
        assert!(selection(&args(&["--runtime", "x"]), &hbg).unwrap_err().contains("`x`"));
        assert!(selection(&args(&["--runtime"]), &hbg).is_err());
    }

    #[test]
    fn the_onboard_build_gets_one_runtime_at_a_time() {
        let given = args(&["--platform", "a2a3", "--runtime", "all", "--standin"]);
        assert_eq!(
            with_runtime(&given, Runtime::Trb),
            args(&["--platform", "a2a3", "--standin", "--runtime", "trb"])
        );
    }
}
