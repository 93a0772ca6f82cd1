//! Building the device programs: the AICPU program (a cdylib of `simpler-aicpu-program`,
//! profile `aicpu-program`), for the host (so the simulator can run the very object that ships)
//! and, on a server with the CANN cross compiler, for the AICPU.

use std::path::{Path, PathBuf};

use crate::{cargo, target_dir};

/// The cargo profile of the AICPU program (`panic = "abort"`, see the root manifest).
pub const PROGRAM_PROFILE: &str = "aicpu-program";
/// The AICPU's Rust target.
pub const AICPU_TARGET: &str = "aarch64-unknown-linux-gnu";

/// Builds the AICPU program for the host (`target = None`) or for `target` with `linker`, and
/// returns the built shared object's path.
pub fn aicpu_program(target: Option<(&str, &Path)>) -> Result<PathBuf, String> {
    let mut args = vec!["build", "-p", "simpler-aicpu-program", "--profile", PROGRAM_PROFILE];
    let mut env = Vec::new();
    let linker_var;
    let linker_value;
    let out = match target {
        Some((triple, linker)) => {
            args.extend(["--target", triple]);
            linker_var = format!("CARGO_TARGET_{}_LINKER", triple.to_uppercase().replace('-', "_"));
            linker_value = linker.display().to_string();
            env.push((linker_var.as_str(), linker_value.as_str()));
            target_dir().join(triple).join(PROGRAM_PROFILE)
        }
        None => target_dir().join(PROGRAM_PROFILE),
    };
    cargo(&args, &env)?;
    let so = out.join("libsimpler_aicpu_program.so");
    if so.is_file() {
        Ok(so)
    } else {
        Err(format!("the AICPU program build produced no {}", so.display()))
    }
}

/// Test targets of the device crate that CI runs on the built programs: the program's own test
/// and the conformance, fault and end-to-end suites.
const SUITES_ON_BUILT_PROGRAMS: &[&str] = &["aicpu_program", "conformance", "faults", "end_to_end"];

/// The host build of the C++ AICore executor, in `target/simpler-onboard/host-executor/`.
pub fn host_executor() -> Result<PathBuf, String> {
    let dir = target_dir().join("simpler-onboard").join("host-executor");
    println!("\n==> compiling the AICore executor for the host into {}", dir.display());
    simpler_onboard_programs::build_host_executor(&dir)
}

/// CI: builds the host AICPU program and the host AICore executor, then runs the device
/// crate's suites with the simulator running both (a missing program fails instead of
/// skipping).
pub fn programs_on_simulator() -> Result<(), String> {
    let so = aicpu_program(None)?.display().to_string();
    let exe = host_executor()?.display().to_string();
    let mut args = vec!["test", "-p", "simpler-device-a2a3"];
    for t in SUITES_ON_BUILT_PROGRAMS {
        args.extend(["--test", t]);
    }
    cargo(
        &args,
        &[
            ("SIMPLER_AICPU_PROGRAM", so.as_str()),
            ("SIMPLER_REQUIRE_AICPU_PROGRAM", "1"),
            ("SIMPLER_SIM_AICPU_PROGRAM", so.as_str()),
            ("SIMPLER_SIM_AICORE_EXECUTOR", exe.as_str()),
        ],
    )
}
