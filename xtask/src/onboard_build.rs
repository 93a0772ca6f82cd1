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

/// CI: builds the host AICPU program and runs the simulator test that executes the vector
/// example through its C entries (a missing program fails the test instead of skipping it).
pub fn program_on_simulator() -> Result<(), String> {
    let so = aicpu_program(None)?;
    let so = so.display().to_string();
    cargo(
        &["test", "-p", "simpler-device-a2a3", "--test", "aicpu_program"],
        &[("SIMPLER_AICPU_PROGRAM", so.as_str()), ("SIMPLER_REQUIRE_AICPU_PROGRAM", "1")],
    )
}
