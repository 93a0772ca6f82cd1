//! Building the device programs: the AICPU program (a cdylib of `simpler-aicpu-program`,
//! profile `aicpu-program`), for the host (so the simulator can run the very object that ships)
//! and, on a server with the CANN cross compiler, for the AICPU.

use std::path::{Path, PathBuf};

use simpler_onboard_programs::{
    AICORE_ROLES, BUILT_KERNELS, BuildError, EXECUTOR_ENTRY_SOURCE, ROLE_DEFINE, TestKernel,
};

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
    simpler_onboard_programs::build_host_executor(&dir).map_err(report)
}

/// A failed host build as xtask prints it: the error and each of its causes.
fn report(e: BuildError) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
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
    /// Manifest key (`aicpu_program`, `dispatcher`, `aicore_executor`, `kernel_<name>`).
    name: String,
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
        artifacts.insert(b.name.clone(), a);
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
    let dispatcher =
        simpler_onboard_programs::build_host_dispatcher(&work, &install).map_err(report)?;
    let cc = simpler_onboard_programs::host_compiler_identity(false);
    let cxx = simpler_onboard_programs::host_compiler_identity(true);
    let rustc = command_line(&std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()), &["-V"]);
    let executor_src: String = simpler_onboard_programs::EXECUTOR_SOURCES
        .iter()
        .map(|(n, t)| format!("{n}\n{t}"))
        .collect();
    let built = [
        Built {
            name: "aicpu_program".into(),
            file: program,
            inputs: format!("{rustc}\n{PROGRAM_PROFILE}"),
        },
        Built {
            name: "dispatcher".into(),
            file: dispatcher,
            inputs: format!("{cc}\n{}", simpler_onboard_programs::DISPATCHER_SOURCE),
        },
        Built {
            name: "aicore_executor".into(),
            file: executor,
            inputs: format!("{cxx}\n{executor_src}"),
        },
    ];
    let orchestrations = simpler_onboard_programs::build_host_orchestrations(
        &target_dir().join("simpler-onboard").join("host-orchestrations"),
    )
    .map_err(report)?;
    let orchestrations = Built {
        name: "orchestrations".into(),
        file: orchestrations,
        inputs: orchestration_inputs(&cc),
    };
    let kernels = target_dir().join("simpler-onboard").join("host-kernels");
    let built: Vec<Built> = built
        .into_iter()
        .chain([orchestrations])
        .chain(
            simpler_onboard_programs::build_host_kernels(&kernels)
                .map_err(report)?
                .into_iter()
                .map(|(k, so)| Built {
                    name: format!("kernel_{}", k.name),
                    file: so,
                    inputs: kernel_inputs(&cxx, &k),
                }),
        )
        .collect();
    let dir = target_dir().join("simpler-onboard").join("standin").join(runtime);
    let toolchain = serde_json::json!({ "rustc": rustc, "cc": cc, "c++": cxx, "target": "host" });
    cache_and_manifest(&built, runtime, &dir, toolchain)
}

// ----- The build with CANN's toolchain -----

/// The CANN tools the device build runs (found by `onboard::detect`).
#[derive(Clone, Debug)]
pub struct CannTools {
    /// `ccec`, the AICore compiler.
    pub ccec: PathBuf,
    /// `ld.lld`, which links the mixed AICore binary.
    pub ld_lld: PathBuf,
    /// CANN's aarch64 cross compiler (the AICPU programs).
    pub cross_cc: PathBuf,
}

/// One tool invocation: the program and its arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl Invocation {
    fn new(program: &Path, args: Vec<String>) -> Invocation {
        Invocation { program: program.to_path_buf(), args }
    }

    /// Runs it; a failure names the command line and what the tool printed.
    pub fn run(&self) -> Result<(), String> {
        let line = format!("{} {}", self.program.display(), self.args.join(" "));
        println!("  {line}");
        let out =
            crate::onboard::output_of(std::process::Command::new(&self.program).args(&self.args))
                .map_err(|e| format!("could not run `{line}`: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`{line}` failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

/// The CCE code-generation settings of the executor (the AICore stack sizes and cache handling
/// the original's AICore build uses).
const CCE_CODEGEN: [&str; 10] = [
    "-mllvm",
    "-cce-aicore-stack-size=0x8000",
    "-mllvm",
    "-cce-aicore-function-stack-size=0x8000",
    "-mllvm",
    "-cce-aicore-record-overflow=false",
    "-mllvm",
    "-cce-aicore-addr-transform",
    "-mllvm",
    "-cce-aicore-dcci-insert-for-scalar=false",
];

/// `ccec` once per role over the executor's entry in `src` (the role's define selects the
/// entry it defines), then `ld.lld` linking both objects into the mixed ELF `out` (static,
/// text at address 0), required to define every role's entry.
pub fn aicore_invocations(
    tools: &CannTools,
    src: &Path,
    work: &Path,
    out: &Path,
) -> Vec<Invocation> {
    let mut steps = Vec::new();
    let mut objects = Vec::new();
    for role in AICORE_ROLES {
        let object = work.join(format!("executor_{}.o", role.suffix));
        let mut args: Vec<String> =
            ["-c", "-x", "cce", "--cce-aicore-only", "-O3", "-std=c++17"].map(str::to_owned).into();
        args.push(format!("--cce-aicore-arch={}", role.arch));
        args.extend(CCE_CODEGEN.map(str::to_owned));
        args.push(format!("-D{ROLE_DEFINE}={}", role.vec));
        args.push(format!("-I{}", src.display()));
        args.extend(["-o".to_owned(), object.display().to_string()]);
        args.push(src.join(EXECUTOR_ENTRY_SOURCE).display().to_string());
        steps.push(Invocation::new(&tools.ccec, args));
        objects.push(object.display().to_string());
    }
    let mut link: Vec<String> =
        ["-m", "aicorelinux", "-Ttext=0", "-static", "-n"].map(str::to_owned).to_vec();
    link.extend(AICORE_ROLES.map(|r| format!("--require-defined={}", r.entry)));
    link.extend(["-o".to_owned(), out.display().to_string()]);
    link.extend(objects);
    steps.push(Invocation::new(&tools.ld_lld, link));
    steps
}

/// The bootstrap dispatcher, cross-compiled for the AICPU with its on-device install
/// directory and a GNU build id.
pub fn dispatcher_invocation(tools: &CannTools, src: &Path, out: &Path) -> Invocation {
    let define = format!(
        "-D{}=\"{}\"",
        simpler_onboard_programs::INSTALL_DIR_DEFINE,
        simpler_onboard_programs::DEVICE_INSTALL_DIR
    );
    Invocation::new(
        &tools.cross_cc,
        [
            "-std=c99",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-D_POSIX_C_SOURCE=200809L",
            &define,
            "-shared",
            "-fPIC",
            "-Wl,--build-id=sha1",
            "-o",
            &out.display().to_string(),
            &src.join("dispatcher.c").display().to_string(),
        ]
        .map(str::to_owned)
        .to_vec(),
    )
}

/// The orchestration object (the C orchestrations a tensormap_and_ringbuffer run registers as a
/// `DeviceObject`), cross-compiled for the AICPU with the host build's flags and a build id.
pub fn orchestration_invocation(tools: &CannTools, src: &Path, out: &Path) -> Invocation {
    let mut args: Vec<String> =
        simpler_onboard_programs::ORCHESTRATION_CFLAGS.map(str::to_owned).to_vec();
    args.extend(["-shared", "-fPIC", "-Wl,--build-id=sha1", "-o"].map(str::to_owned));
    args.push(out.display().to_string());
    args.extend(
        simpler_onboard_programs::ORCHESTRATION_SOURCES
            .iter()
            .map(|(f, _)| src.join(f).display().to_string()),
    );
    Invocation::new(&tools.cross_cc, args)
}

/// Writes the orchestration sources into `work/src` and cross-compiles the object into `work`.
pub fn device_orchestrations(tools: &CannTools, work: &Path) -> Result<PathBuf, String> {
    let src = work.join("src");
    simpler_onboard_programs::write_orchestration_sources(&src).map_err(report)?;
    let out = work.join(simpler_onboard_programs::ORCHESTRATION_OBJECT);
    orchestration_invocation(tools, &src, &out).run()?;
    Ok(out)
}

/// What identifies the orchestration object's build: the compiler, the flags and the sources.
fn orchestration_inputs(compiler: &str) -> String {
    let sources: String = simpler_onboard_programs::ORCHESTRATION_FILES
        .iter()
        .map(|(n, t)| format!("{n}\n{t}"))
        .collect();
    format!("{compiler}\n{:?}\n{sources}", simpler_onboard_programs::ORCHESTRATION_CFLAGS)
}

/// The role entries whose names the linked binary does not contain (its symbol names are in
/// its string table, so a missing name is a missing entry; the linker already refuses to
/// link without them, this checks the file that is shipped).
pub fn missing_entries(binary: &[u8]) -> Vec<&'static str> {
    AICORE_ROLES
        .into_iter()
        .map(|r| r.entry)
        .filter(|e| !binary.windows(e.len()).any(|w| w == e.as_bytes()))
        .collect()
}

/// Compiles the dispatcher and the AICore executor with CANN's tools into `work`; returns the
/// dispatcher's and the mixed binary's paths.
pub fn device_programs(
    tools: &CannTools,
    work: &Path,
    runtime: &str,
) -> Result<(PathBuf, PathBuf), String> {
    let src = work.join("src");
    let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    std::fs::create_dir_all(&src).map_err(|e| io(&src, e))?;
    let sources = simpler_onboard_programs::EXECUTOR_SOURCES
        .iter()
        .chain([&("dispatcher.c", simpler_onboard_programs::DISPATCHER_SOURCE)]);
    for (name, text) in sources {
        std::fs::write(src.join(name), text).map_err(|e| io(&src.join(name), e))?;
    }
    let dispatcher = work.join("libsimpler_aicpu_dispatcher.so");
    dispatcher_invocation(tools, &src, &dispatcher).run()?;
    let executor = work.join(format!("aicore_{runtime}.o"));
    for step in aicore_invocations(tools, &src, work, &executor) {
        step.run()?;
    }
    let bytes = std::fs::read(&executor).map_err(|e| io(&executor, e))?;
    let missing = missing_entries(&bytes);
    if !missing.is_empty() {
        return Err(format!(
            "{} lacks the entries {missing:?} the onboard backend launches",
            executor.display()
        ));
    }
    Ok((dispatcher, executor))
}

/// What identifies a test kernel's build: the compiler, the kernel and the sources it reads.
fn kernel_inputs(compiler: &str, k: &TestKernel) -> String {
    let (header, abi) = simpler_onboard_programs::KERNEL_ABI_HEADER;
    format!("{compiler}\n{}\n{}\n{}\n{header}\n{abi}", k.name, k.file, k.source)
}

/// The architecture the test kernels are compiled for (they run on the vector cores).
const KERNEL_ARCH: &str = "dav-c220-vec";

/// `ccec` on one test kernel for the vector cores, into the object `out`.
pub fn kernel_invocation(tools: &CannTools, src: &Path, k: &TestKernel, out: &Path) -> Invocation {
    let mut args: Vec<String> =
        ["-c", "-x", "cce", "--cce-aicore-only", "-O3", "-std=c++17"].map(str::to_owned).into();
    args.push(format!("--cce-aicore-arch={KERNEL_ARCH}"));
    args.extend(CCE_CODEGEN.map(str::to_owned));
    args.push(format!("-I{}", src.display()));
    args.extend(["-o".to_owned(), out.display().to_string()]);
    args.push(src.join(k.file).display().to_string());
    Invocation::new(&tools.ccec, args)
}

/// The code of a kernel object: its `.text`, which is copied to device memory as it is and
/// never linked, so an object with relocations against it (or without a `.text`) is refused.
pub fn kernel_text(name: &str, elf: &[u8]) -> Result<Vec<u8>, String> {
    use crate::onboard_elf::{SHT_NOBITS, SHT_REL, SHT_RELA, bytes, c_str, sections};
    let fail = |why: String| format!("kernel {name}: {why}");
    let (sections, shstrndx) = sections(elf).map_err(fail)?;
    let names = sections.get(shstrndx).ok_or_else(|| fail("no section-name table".into()))?;
    let mut text = None;
    for (i, s) in sections.iter().enumerate() {
        if c_str(elf, names.offset + s.name).map_err(fail)? == ".text" && s.kind != SHT_NOBITS {
            text = Some(i);
        }
    }
    let text = text.ok_or_else(|| fail("the object has no .text".into()))?;
    if let Some(r) =
        sections.iter().find(|s| (s.kind == SHT_REL || s.kind == SHT_RELA) && s.info == text)
    {
        let relocs = r.size / if r.kind == SHT_RELA { 24 } else { 16 };
        return Err(fail(format!(
            "its .text has {relocs} relocation(s); a kernel must be position independent and \
             self-contained (no calls to other objects or global data), since its code is copied \
             to the device unlinked"
        )));
    }
    bytes(elf, &sections[text]).map(<[u8]>::to_vec).map_err(fail)
}

/// Compiles the test kernels with `ccec` into `work` and writes each one's code as
/// `<name>.text`; returns (kernel, code file) in [`BUILT_KERNELS`] order.
pub fn device_kernels(
    tools: &CannTools,
    work: &Path,
) -> Result<Vec<(TestKernel, PathBuf)>, String> {
    let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    std::fs::create_dir_all(work).map_err(|e| io(work, e))?;
    let (header, abi) = simpler_onboard_programs::KERNEL_ABI_HEADER;
    std::fs::write(work.join(header), abi).map_err(|e| io(&work.join(header), e))?;
    let mut out = Vec::new();
    for k in BUILT_KERNELS {
        std::fs::write(work.join(k.file), k.source).map_err(|e| io(&work.join(k.file), e))?;
        let object = work.join(format!("{}.o", k.name));
        kernel_invocation(tools, work, &k, &object).run()?;
        let elf = std::fs::read(&object).map_err(|e| io(&object, e))?;
        let text = work.join(format!("{}.text", k.name));
        std::fs::write(&text, kernel_text(k.name, &elf)?).map_err(|e| io(&text, e))?;
        out.push((k, text));
    }
    Ok(out)
}

/// `build --platform a2a3` with CANN: the three programs for the chip, cached, and their
/// manifest at `target/simpler-onboard/<runtime>/manifest.json`.
pub fn device_artifacts(runtime: &str, tools: &CannTools) -> Result<PathBuf, String> {
    let program = aicpu_program(Some((AICPU_TARGET, &tools.cross_cc)))?;
    let baseline = crate::onboard_glibc::baseline()?;
    let bytes = std::fs::read(&program).map_err(|e| format!("{}: {e}", program.display()))?;
    let glibc = crate::onboard_glibc::check(&program.display().to_string(), &bytes, baseline)?;
    println!(
        "  glibc: the AICPU program needs {}, baseline {baseline}",
        glibc.map_or("no versioned glibc symbol".to_owned(), |v| v.to_string())
    );
    let work = target_dir().join("simpler-onboard").join("device-build").join(runtime);
    let (dispatcher, executor) = device_programs(tools, &work, runtime)?;
    let version = |p: &Path| command_line(&p.display().to_string(), &["--version"]);
    let (ccec, lld, cc) = (version(&tools.ccec), version(&tools.ld_lld), version(&tools.cross_cc));
    let rustc = command_line(&std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()), &["-V"]);
    let executor_src: String = simpler_onboard_programs::EXECUTOR_SOURCES
        .iter()
        .map(|(n, t)| format!("{n}\n{t}"))
        .collect();
    let built = [
        Built {
            name: "aicpu_program".into(),
            file: program,
            inputs: format!("{rustc}\n{cc}\n{AICPU_TARGET}\n{PROGRAM_PROFILE}"),
        },
        Built {
            name: "dispatcher".into(),
            file: dispatcher,
            inputs: format!("{cc}\n{}", simpler_onboard_programs::DISPATCHER_SOURCE),
        },
        Built {
            name: "aicore_executor".into(),
            file: executor,
            inputs: format!("{ccec}\n{lld}\n{AICORE_ROLES:?}\n{CCE_CODEGEN:?}\n{executor_src}"),
        },
    ];
    let orchestrations = Built {
        name: "orchestrations".into(),
        file: device_orchestrations(tools, &work.join("orchestrations"))?,
        inputs: orchestration_inputs(&cc),
    };
    let kernels = device_kernels(tools, &work.join("kernels"))?;
    let built: Vec<Built> = built
        .into_iter()
        .chain([orchestrations])
        .chain(kernels.into_iter().map(|(k, text)| Built {
            name: format!("kernel_{}", k.name),
            file: text,
            inputs: kernel_inputs(&format!("{ccec}\n{CCE_CODEGEN:?}"), &k),
        }))
        .collect();
    let dir = target_dir().join("simpler-onboard").join(runtime);
    let toolchain = serde_json::json!({
        "rustc": rustc, "ccec": ccec, "ld.lld": lld, "aarch64 cc": cc, "target": AICPU_TARGET,
        "glibc baseline": baseline.to_string(),
        "glibc required": glibc.map(|v| v.to_string()),
    });
    cache_and_manifest(&built, runtime, &dir, toolchain)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn tools(dir: &Path) -> CannTools {
        CannTools {
            ccec: dir.join("bin/ccec"),
            ld_lld: dir.join("bin/ld.lld"),
            cross_cc: dir.join("tools/hcc/bin/aarch64-target-linux-gnu-gcc"),
        }
    }

    #[test]
    fn the_executor_is_compiled_per_role_and_linked_into_one_binary_defining_both_entries() {
        let t = tools(Path::new("/cann"));
        let steps =
            aicore_invocations(&t, Path::new("/s"), Path::new("/w"), Path::new("/w/aicore_hbg.o"));
        assert_eq!(steps.len(), 3);
        for (step, (arch, role, vec)) in
            steps.iter().zip([("dav-c220-cube", "aic", 0), ("dav-c220-vec", "aiv", 1)])
        {
            assert_eq!(step.program, Path::new("/cann/bin/ccec"));
            let args = step.args.join(" ");
            assert!(
                args.starts_with(&format!(
                    "-c -x cce --cce-aicore-only -O3 -std=c++17 --cce-aicore-arch={arch} -mllvm"
                )),
                "{args}"
            );
            assert!(
                args.ends_with(&format!(
                    "-DSIMPLER_AICORE_VEC={vec} -I/s -o /w/executor_{role}.o /s/entry.cpp"
                )),
                "{args}"
            );
        }
        assert_eq!(steps[2].program, Path::new("/cann/bin/ld.lld"));
        assert_eq!(
            steps[2].args.join(" "),
            "-m aicorelinux -Ttext=0 -static -n --require-defined=aicore_kernel_0_mix_aic \
             --require-defined=aicore_kernel_0_mix_aiv -o /w/aicore_hbg.o /w/executor_aic.o \
             /w/executor_aiv.o"
        );
    }

    /// The host build compiles the same entry source per role with the same define as the
    /// ccec lines above: each role's object defines exactly the entry the link requires of
    /// it, and the shared object exports both.
    #[test]
    fn the_host_build_of_each_role_defines_the_entry_the_link_requires() {
        let dir = scratch("roles");
        let so = simpler_onboard_programs::build_host_executor(&dir).unwrap();
        let defined = |file: &Path| -> Vec<String> {
            let out = std::process::Command::new("nm")
                .args(["--defined-only", "-g"])
                .arg(file)
                .output()
                .expect("nm");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
                .filter(|s| s.starts_with("aicore_kernel_"))
                .collect()
        };
        let link = &aicore_invocations(&tools(&dir), &dir, &dir, &dir.join("x.o"))[2];
        for role in AICORE_ROLES {
            assert_eq!(defined(&dir.join(format!("entry_{}.o", role.suffix))), [role.entry]);
            assert!(link.args.contains(&format!("--require-defined={}", role.entry)));
        }
        let mut exported = defined(&so);
        exported.sort();
        assert_eq!(exported, AICORE_ROLES.map(|r| r.entry));
        assert!(missing_entries(&std::fs::read(&so).unwrap()).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_dispatcher_is_cross_compiled_with_its_device_install_dir_and_a_build_id() {
        let t = tools(Path::new("/cann"));
        let step = dispatcher_invocation(&t, Path::new("/s"), Path::new("/w/d.so"));
        assert_eq!(step.program, Path::new("/cann/tools/hcc/bin/aarch64-target-linux-gnu-gcc"));
        let args = step.args.join(" ");
        assert!(
            args.contains("-DSIMPLER_DISPATCHER_INSTALL_DIR=\"/usr/lib64/aicpu_kernels/0/aicpu_kernels_device\""),
            "{args}"
        );
        assert!(
            args.ends_with("-shared -fPIC -Wl,--build-id=sha1 -o /w/d.so /s/dispatcher.c"),
            "{args}"
        );
    }

    /// The cross compiler's arguments are the host compiler's, so the host's `cc` standing in
    /// for it builds the very object the chip would get, for the host: it exports every C
    /// entry and config the programs name.
    #[test]
    fn the_orchestration_object_is_cross_compiled_with_every_entry_and_a_build_id() {
        let t = tools(Path::new("/cann"));
        let step = orchestration_invocation(&t, Path::new("/s"), Path::new("/w/liborch.so"));
        assert_eq!(step.program, t.cross_cc);
        assert_eq!(
            step.args.join(" "),
            "-std=c11 -O2 -Wall -Wextra -Werror -shared -fPIC -Wl,--build-id=sha1 \
             -o /w/liborch.so /s/vector_orch.c /s/fixtures_orch.c"
        );
        let dir = scratch("orch");
        let t = tools(&dir);
        std::fs::create_dir_all(t.cross_cc.parent().unwrap()).unwrap();
        std::fs::write(&t.cross_cc, "#!/bin/sh\nexec cc \"$@\"\n").unwrap();
        std::fs::set_permissions(&t.cross_cc, std::fs::Permissions::from_mode(0o755)).unwrap();
        let so = device_orchestrations(&t, &dir.join("work")).unwrap();
        let out = std::process::Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(&so)
            .output()
            .expect("nm");
        let symbols = String::from_utf8_lossy(&out.stdout);
        let (vector, add) = (
            simpler_onboard_programs::VECTOR_ORCHESTRATION,
            simpler_onboard_programs::ADD_ORCHESTRATION,
        );
        for name in [vector.0, vector.1, add.0, add.1, simpler_onboard_programs::FAILING_ENTRY] {
            assert!(symbols.lines().any(|l| l.ends_with(&format!(" {name}"))), "{name}: {symbols}");
        }
        let elf = std::fs::read(&so).unwrap();
        assert!(elf.windows(4).any(|w| w == b"GNU\0"), "a GNU build-id note");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A fake CANN whose tools log their arguments and write their `-o` output; `ld.lld`
    /// writes `entries` into the binary.
    fn fake_cann(dir: &Path, entries: &str) -> CannTools {
        let t = tools(dir);
        let log = dir.join("calls.log");
        let script = |path: &Path, body: &str| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(
                path,
                format!(
                    "#!/bin/sh\necho \"$(basename $0) $*\" >> {}\nwhile [ $# -gt 0 ]; do\n  if [ \"$1\" = -o ]; then out=$2; fi\n  shift\ndone\n{body}\n",
                    log.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        script(&t.ccec, "echo object > \"$out\"");
        script(&t.cross_cc, "echo dispatcher > \"$out\"");
        script(&t.ld_lld, &format!("printf '{entries}' > \"$out\""));
        t
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-cce-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn with_the_tools_present_the_device_programs_are_built_by_them() {
        let dir = scratch("ok");
        let t = fake_cann(&dir, "\\0aicore_kernel_0_mix_aic\\0aicore_kernel_0_mix_aiv\\0");
        let (dispatcher, executor) = device_programs(&t, &dir.join("work"), "hbg").unwrap();
        assert!(dispatcher.is_file() && executor.ends_with("aicore_hbg.o"));
        let calls = std::fs::read_to_string(dir.join("calls.log")).unwrap();
        let tools: Vec<&str> = calls.lines().map(|l| l.split(' ').next().unwrap()).collect();
        assert_eq!(tools, ["aarch64-target-linux-gnu-gcc", "ccec", "ccec", "ld.lld"]);
        assert!(
            dir.join("work/src/entry.cpp").is_file() && dir.join("work/src/dispatcher.c").is_file()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_mixed_binary_without_both_entries_or_a_failing_tool_fails_the_build() {
        let dir = scratch("entries");
        let t = fake_cann(&dir, "\\0aicore_kernel_0_mix_aic\\0");
        let err = device_programs(&t, &dir.join("work"), "hbg").unwrap_err();
        assert!(err.contains("aicore_kernel_0_mix_aiv") && !err.contains("mix_aic\""), "{err}");
        std::fs::write(&t.ccec, "#!/bin/sh\necho 'error: unknown target' >&2\nexit 1\n").unwrap();
        let err = device_programs(&t, &dir.join("work"), "hbg").unwrap_err();
        assert!(err.contains("ccec") && err.contains("unknown target"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn each_test_kernel_is_compiled_by_ccec_for_the_vector_cores() {
        let t = tools(Path::new("/cann"));
        let k = &BUILT_KERNELS[1];
        let args = kernel_invocation(&t, Path::new("/s"), k, Path::new("/w/add_scalar.o")).args;
        let args = args.join(" ");
        assert!(
            args.starts_with(
                "-c -x cce --cce-aicore-only -O3 -std=c++17 --cce-aicore-arch=dav-c220-vec -mllvm"
            ),
            "{args}"
        );
        assert!(args.ends_with("-I/s -o /w/add_scalar.o /s/add_scalar.cpp"), "{args}");
    }

    /// A ccec stand-in that compiles the kernel with the host's C++ compiler (same source, same
    /// include directory, same output), so `device_kernels` handles real ELF objects.
    fn host_ccec(dir: &Path) -> CannTools {
        let t = tools(dir);
        std::fs::create_dir_all(t.ccec.parent().unwrap()).unwrap();
        std::fs::write(
            &t.ccec,
            "#!/bin/sh\nfor a in \"$@\"; do\n  case \"$a\" in -I*) inc=$a;; esac\n  [ \"$prev\" = -o ] && out=$a\n  prev=$a; src=$a\ndone\nexec c++ -std=c++17 -O2 -fno-exceptions -c \"$inc\" -o \"$out\" \"$src\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&t.ccec, std::fs::Permissions::from_mode(0o755)).unwrap();
        t
    }

    #[test]
    fn the_kernels_code_is_their_text_and_an_object_with_relocations_is_refused() {
        let dir = scratch("kernels");
        let t = host_ccec(&dir);
        let built = device_kernels(&t, &dir.join("work")).unwrap();
        assert_eq!(
            built.iter().map(|(k, _)| k.name).collect::<Vec<_>>(),
            ["add", "add_scalar", "mul", "hang"]
        );
        for (k, text) in &built {
            let code = std::fs::read(text).unwrap();
            assert!(!code.is_empty() && !code.starts_with(b"\x7fELF"), "{}", k.name);
        }
        // A kernel calling into another object needs a relocation against its .text.
        let src = dir.join("work/calls.cpp");
        std::fs::write(&src, "extern \"C\" void other(long *);\nextern \"C\" void kernel_entry(long *a) { other(a); }\n").unwrap();
        let object = dir.join("work/calls.o");
        let status = std::process::Command::new("c++")
            .args(["-c", "-O2", "-o"])
            .arg(&object)
            .arg(&src)
            .status()
            .unwrap();
        assert!(status.success());
        let err = kernel_text("calls", &std::fs::read(&object).unwrap()).unwrap_err();
        assert!(err.contains("kernel calls") && err.contains("relocation"), "{err}");
        assert!(kernel_text("junk", b"not an object").unwrap_err().contains("well-formed"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
