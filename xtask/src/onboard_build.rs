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

/// One built artifact on its way into the cache and the manifest.
struct Built {
    /// Manifest key (`aicpu_program`, `dispatcher`, `aicore_executor`).
    name: &'static str,
    file: PathBuf,
    /// What identifies the inputs: source text, compiler identity and flags.
    inputs: String,
}

/// The ABI version the device crate speaks, read from its source (xtask does not link the
/// device crate).
pub fn abi_version() -> Result<u32, String> {
    let src = crate::workspace_root().join("crates/simpler-device-a2a3/src/abi/mod.rs");
    let text = std::fs::read_to_string(&src).map_err(|e| format!("{}: {e}", src.display()))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("pub const ABI_VERSION: u32 = "))
        .and_then(|v| v.trim_end_matches(';').parse().ok())
        .ok_or_else(|| format!("{} defines no ABI_VERSION", src.display()))
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn command_line(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").to_owned())
        .unwrap_or_else(|| "unknown".into())
}

/// Copies each artifact into `target/simpler-onboard/cache/<key>/` (key = sha256 of the
/// artifact name, its inputs, its bytes and the ABI version; an existing entry is reused) and
/// writes `<dir>/manifest.json`; returns the manifest's path.
fn cache_and_manifest(
    built: &[Built],
    runtime: &str,
    dir: &Path,
    toolchain: serde_json::Value,
) -> Result<PathBuf, String> {
    let abi = abi_version()?;
    let cache = target_dir().join("simpler-onboard").join("cache");
    let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    let mut artifacts = serde_json::Map::new();
    for b in built {
        let bytes = std::fs::read(&b.file).map_err(|e| io(&b.file, e))?;
        let sha = sha256_hex(&bytes);
        let key = sha256_hex(format!("{}\n{}\n{sha}\nabi {abi}", b.name, b.inputs).as_bytes());
        let entry = cache.join(&key[..32]);
        let file_name =
            b.file.file_name().ok_or_else(|| format!("{}: no name", b.file.display()))?;
        let cached = entry.join(file_name);
        if !cached.is_file() {
            std::fs::create_dir_all(&entry).map_err(|e| io(&entry, e))?;
            let tmp = entry.join(format!(".{}.tmp", std::process::id()));
            std::fs::write(&tmp, &bytes).map_err(|e| io(&tmp, e))?;
            std::fs::rename(&tmp, &cached).map_err(|e| io(&cached, e))?;
        }
        let mut a = serde_json::json!({ "path": cached, "sha256": sha });
        if let Some(id) = simpler_onboard_programs::build_id(&bytes) {
            a["build_id"] = id.iter().map(|b| format!("{b:02x}")).collect::<String>().into();
        }
        artifacts.insert(b.name.into(), a);
    }
    let manifest = serde_json::json!({
        "abi_version": abi,
        "runtime": runtime,
        "artifacts": artifacts,
        "toolchain": toolchain,
    });
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let path = dir.join("manifest.json");
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| io(&path, e))?;
    Ok(path)
}

/// `build --platform a2a3 --standin`: the three device programs built for the host (what the
/// stand-in CANN library and the simulator load), cached, and their manifest at
/// `target/simpler-onboard/standin/<runtime>/manifest.json`.
pub fn host_artifacts(runtime: &str) -> Result<PathBuf, String> {
    let program = aicpu_program(None)?;
    let executor = host_executor()?;
    let work = target_dir().join("simpler-onboard").join("host-dispatcher");
    let install = target_dir().join("simpler-onboard").join("standin-install");
    let dispatcher = simpler_onboard_programs::build_host_dispatcher(&work, &install)?;
    let cc = simpler_onboard_programs::host_compiler_identity(false);
    let cxx = simpler_onboard_programs::host_compiler_identity(true);
    let rustc = command_line(&std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()), &["-V"]);
    let executor_src: String = simpler_onboard_programs::EXECUTOR_SOURCES
        .iter()
        .map(|(n, t)| format!("{n}\n{t}"))
        .collect();
    let built = [
        Built {
            name: "aicpu_program",
            file: program,
            inputs: format!("{rustc}\n{PROGRAM_PROFILE}"),
        },
        Built {
            name: "dispatcher",
            file: dispatcher,
            inputs: format!("{cc}\n{}", simpler_onboard_programs::DISPATCHER_SOURCE),
        },
        Built { name: "aicore_executor", file: executor, inputs: format!("{cxx}\n{executor_src}") },
    ];
    let dir = target_dir().join("simpler-onboard").join("standin").join(runtime);
    let toolchain = serde_json::json!({ "rustc": rustc, "cc": cc, "c++": cxx, "target": "host" });
    cache_and_manifest(&built, runtime, &dir, toolchain)
}
