//! Development tasks for the simpler workspace, run as `cargo xtask <task>`.
//!
//! Every task is a short sequence of cargo invocations; each step prints what it runs so a
//! failure names the command to rerun by hand. Tasks:
//!
//! - `ci`: everything CI checks, in order: tidy, format, lints, tests, the simulator suites on
//!   the built AICPU program and C++ AICore executor, docs, a short benchmark smoke run, the examples (the README's main job
//!   first) and the `loom` models.
//! - `tidy`: repository rules rustfmt and clippy do not check (see [`tidy`]).
//! - `test [--deep] [--runtime hbg|trb|all]`: the workspace tests; `--deep` raises the
//!   property-test case count; `--runtime` picks the chip runtimes the device suites run under
//!   (module `runtime_variants`).
//! - `loom`: the `loom` model checks of the concurrency protocols (`cfg(simpler_loom)`).
//! - `bench [cargo bench args]`: the criterion benchmarks in release mode.
//! - `build [--runtime hbg|trb|all]`: the workspace and each runtime's host-built device programs
//!   (module `runtime_variants`).
//! - `build --platform a2a3` and `onboard-test`: the tasks for a real A2/A3 server; on any other
//!   machine they list what is missing and exit 2 (module `onboard`).
//! - `bindgen [--check]`: regenerate (or check) the CANN bindings of `simpler-acl-sys`.
//! - `mpi-test`: the multi-host tests (`simpler-worker` feature `mpi`), which launch
//!   themselves under `mpirun -np 3 --oversubscribe`; `ci` runs them with the workspace tests
//!   and checks first that Open MPI is installed.

#![forbid(unsafe_code)]

mod bindgen;
mod onboard;
mod onboard_arch;
mod onboard_build;
mod onboard_elf;
mod onboard_glibc;
mod onboard_test;
mod runtime_variants;
mod tidy;

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// Crates whose concurrency protocols have `loom` models, with the test target holding them
/// (an integration test named `loom`, or the library's unit tests filtered by `loom`).
const LOOM_TARGETS: &[(&str, &[&str])] = &[
    ("simpler-ring", &["--test", "loom"]),
    ("simpler-ring", &["--test", "fixed_loom"]),
    ("simpler-sched", &["--lib", "loom"]),
    ("simpler-worker", &["--lib", "loom"]),
    ("simpler-device-a2a3", &["--lib", "loom"]),
];

/// Examples CI runs end to end (release builds; each checks its own result and exits non-zero
/// on a mismatch). The first is the README's main job.
const EXAMPLES: &[&str] = &["vector_example", "bgemm", "l3_two_chips", "l4_compose"];

/// Crates and feature lists that `ci` checks with `--no-default-features`.
const NARROW_BUILDS: &[(&str, &str)] = &[
    ("simpler-tensormap", ""),
    ("simpler-device-a2a3", ""),
    ("simpler-device-a2a3", "onboard"),
    ("simpler-device-a2a3", "aicpu-program"),
];

/// Property-test cases per test in `test --deep` (the tests' own defaults are kept modest so
/// that CI stays fast).
const DEEP_PROPTEST_CASES: &str = "4096";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((task, rest)) => (task.as_str(), rest),
        None => {
            eprintln!("{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    let result = match task {
        "ci" => ci(),
        "tidy" => tidy::run(&workspace_root()),
        "test" => runtime_variants::test(rest),
        "loom" => loom(),
        "bench" => bench(rest),
        "build" => return runtime_variants::build(rest),
        "onboard-test" => return onboard::onboard_test(rest),
        "bindgen" => bindgen::run(rest.iter().any(|a| a == "--check")),
        "mpi-test" => mpi_test(),
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown task `{other}`\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "usage: cargo xtask <task>
tasks:
  ci               tidy, format check, clippy -D warnings, tests, docs, bench smoke run, examples, loom models
  tidy             self-contained references, module docs, file sizes, unsafe inventories
  test [--deep] [--runtime hbg|trb|all]
                   workspace tests (--deep: many more property-test cases); --runtime picks the
                   chip runtimes the device suites run under (default hbg)
  loom             loom model checks of the concurrency protocols
  bench [ARGS]     criterion benchmarks (release): every bench of the workspace, or ARGS as
                   `cargo bench`'s arguments (`-p simpler-sched --bench workloads`)
  build [--runtime hbg|trb|all]
                   every workspace target and each runtime's host-built device programs
  build --platform a2a3 [--runtime hbg|trb|all] [--standin]
                   onboard programs (needs CANN; lists what is missing, exit 2); --standin
                   builds them for the host and writes target/simpler-onboard/standin/<rt>/manifest.json
  onboard-test [--device 0|0-3|0,2|auto [--device-num N]] [--standin] [--skip-arch-check]
               [--case-timeout S] [--timeout S]
                   tests on a real A2/A3 server (exit 2 when it cannot run or the npu-smi
                   architecture check refuses a device); --standin runs the whole harness against the stand-in CANN library and host-built programs
  bindgen [--check]  regenerate simpler-acl-sys/src/generated (needs libclang:
                   `apt-get install libclang-dev`); --check fails when it is stale
  mpi-test         multi-host tests under `mpirun -np 3 --oversubscribe` (needs Open MPI:
                   `apt-get install openmpi-bin libopenmpi-dev libclang-dev`)";

fn ci() -> Result<(), String> {
    let started = Instant::now();
    println!("\n==> xtask tidy");
    tidy::run(&workspace_root())?;
    cargo(&["fmt", "--all", "--check"], &[])?;
    // `--all-features` includes the worker's `mpi` feature, whose build needs Open MPI; its
    // install also brings libclang, which the bindings check below needs, and procps, whose
    // `ps` a unit test of the onboard runner's dumps reads.
    require_mpi()?;
    println!("\n==> cargo xtask bindgen --check");
    bindgen::run(true)?;
    cargo(
        &["clippy", "--workspace", "--all-targets", "--all-features", "--", "-D", "warnings"],
        &[],
    )?;
    // The feature sets that must build on their own: the tensor map without `std` (device
    // runtimes), and the device crate without a backend and with only the onboard one.
    for (krate, features) in NARROW_BUILDS {
        let mut args = vec!["check", "-p", krate, "--no-default-features"];
        if !features.is_empty() {
            args.extend(["--features", features]);
        }
        cargo(&args, &[])?;
    }
    runtime_variants::ci_tests()?;
    process_mode_tests()?;
    onboard_build::programs_on_simulator()?;
    println!("\n==> cargo xtask onboard-test --standin --device 0,1");
    match onboard_test::standin_batch(&[], &[0, 1])? {
        0 => {}
        code => return Err(format!("onboard-test --standin exited {code}")),
    }
    cargo(
        &["doc", "--workspace", "--no-deps", "--all-features"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    // Benchmarks only have to build and run once per case here; figures come from `bench`.
    cargo(&["bench", "--workspace", "--benches", "--", "--test"], &[])?;
    cargo(&REMOTE_BENCH.iter().copied().chain(["--", "--test"]).collect::<Vec<_>>(), &[])?;
    for example in EXAMPLES {
        cargo(&["run", "--release", "--example", example], &[])?;
    }
    runtime_variants::ci_trb_examples()?;
    loom()?;
    println!("xtask ci: all steps passed in {:.0?}", started.elapsed());
    Ok(())
}

/// The workspace tests, with `env` set.
fn test(deep: bool, env: &[(&str, &str)]) -> Result<(), String> {
    let mut env = env.to_vec();
    if deep {
        env.push(("PROPTEST_CASES", DEEP_PROPTEST_CASES));
    }
    cargo(&["test", "--workspace", "--all-features", "--no-fail-fast"], &env)
}

/// The MPI tests alone; `test` (and so `ci`) runs them too, as part of the workspace tests.
fn mpi_test() -> Result<(), String> {
    require_mpi()?;
    cargo(&["test", "-p", "simpler-worker", "--features", "mpi,sim", "--test", "mpi_remote"], &[])
}

/// Makes sure the system packages the builds and tests need are there: Open MPI (with
/// libclang, for `mpi-sys`'s bindings) for the `mpi` feature and its tests, and `ps` (procps),
/// with which a case that outlives its limit dumps the processes. When one is missing and this
/// is a root shell with `apt-get` (a fresh machine of the kind CI runs on), installs the
/// distribution's packages, as `.ci/run` does; otherwise fails early naming them (a build
/// script failing inside `mpi-sys` says much less).
fn require_mpi() -> Result<(), String> {
    let found = |tool: &str, arg: &str| {
        Command::new(tool).arg(arg).output().is_ok_and(|o| o.status.success())
    };
    let mpi = || found("mpicc", "--showme:version") && found("mpirun", "--version");
    let ps = || found("ps", "--version");
    let missing = || {
        let mut packages = Vec::new();
        if !mpi() {
            packages.extend(["openmpi-bin", "libopenmpi-dev", "libclang-dev"]);
        }
        if !ps() {
            packages.push("procps");
        }
        packages
    };
    let packages = missing();
    if packages.is_empty() {
        return Ok(());
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root && found("apt-get", "--version") {
        println!("\n==> apt-get install {} (missing)", packages.join(" "));
        let installed =
            Command::new("apt-get").arg("update").arg("-qq").status().is_ok_and(|s| s.success())
                && Command::new("apt-get")
                    .args(["install", "-y", "-qq"])
                    .args(&packages)
                    .status()
                    .is_ok_and(|s| s.success());
        if installed && missing().is_empty() {
            return Ok(());
        }
    }
    Err(format!(
        "system packages are missing (Open MPI's `mpicc` and `mpirun` for the `mpi` feature and \
         its tests, `ps` for the dumps of hung cases): apt-get install {}",
        packages.join(" ")
    ))
}

/// The worker tests that apply to PROCESS mode, again with every L3 worker's chips in child
/// processes.
fn process_mode_tests() -> Result<(), String> {
    let mut args = vec!["test", "-p", "simpler-worker"];
    let suites = [
        "conformance",
        "threads",
        "close_races",
        "last_handle_dropped_inside",
        "host_tensors",
        "reentrancy",
    ];
    for t in suites {
        args.extend(["--test", t]);
    }
    cargo(&args, &[("SIMPLER_TEST_CHIP_MODE", "process")])
}

fn loom() -> Result<(), String> {
    // loom builds need their own cfg, so they get their own target directory to avoid
    // invalidating the normal build.
    let target = target_dir().join("loom");
    let target = target.to_string_lossy().into_owned();
    for (krate, selector) in LOOM_TARGETS {
        let mut args = vec!["test", "--release", "-p", krate];
        args.extend_from_slice(selector);
        cargo(
            &args,
            &[
                ("RUSTFLAGS", "--cfg simpler_loom"),
                ("CARGO_TARGET_DIR", target.as_str()),
                ("LOOM_MAX_PREEMPTIONS", "3"),
            ],
        )?;
    }
    Ok(())
}

/// The multi-host bench (W5), which the workspace's default features leave out: it needs the
/// worker's `mpi` feature.
const REMOTE_BENCH: [&str; 7] =
    ["bench", "-p", "simpler-worker", "--features", "mpi,sim", "--bench", "remote"];

/// `cargo bench` over the workspace's benches and the multi-host one, or with `extra` as its
/// arguments instead (a `--` in them passes what follows to the bench binaries).
fn bench(extra: &[String]) -> Result<(), String> {
    if extra.is_empty() {
        cargo(&["bench", "--workspace", "--benches"], &[])?;
        require_mpi()?;
        return cargo(&REMOTE_BENCH, &[]);
    }
    let mut args = vec!["bench"];
    args.extend(extra.iter().map(String::as_str));
    cargo(&args, &[])
}

/// The workspace's target directory (honours `CARGO_TARGET_DIR`).
fn target_dir() -> PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// Runs one cargo command from the workspace root, echoing it first.
fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    println!("\n==> {} cargo {}", shown.join(" "), args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(workspace_root())
        .status()
        .map_err(|e| format!("could not start `{cargo}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}
