//! `build --platform a2a3` and `onboard-test`: the tasks that need a real A2/A3 server.
//!
//! Both start by detecting what the server must have (the CANN toolkit and its compilers, the
//! aarch64 Rust standard library, the driver's HAL library, and for tests `npu-smi` and a visible
//! device) and explaining, for each missing piece, where it was looked for and the one-line fix.
//! Anything required missing ends the task with exit code 2: an environment problem, never a
//! test failure.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit code for "this machine cannot do it" (missing toolchain, driver or device).
pub const EXIT_ENVIRONMENT: u8 = 2;

/// The requirement naming CANN's aarch64 cross compiler (the AICPU programs' linker).
const CROSS_COMPILER: &str = "aarch64 cross compiler (AICPU programs)";
/// The requirement naming `npu-smi` (only the architecture check needs it).
const NPU_SMI: &str = "npu-smi (architecture check)";
/// The requirements naming the AICore compiler and linker.
const CCEC: &str = "ccec (AICore executor and test kernels)";
const LD_LLD: &str = "ld.lld (links the mixed AICore binary)";
/// The requirement naming the CANN root.
const CANN_ROOT: &str = "CANN toolkit (libascendcl.so)";

/// Which task is asking: tests need the device side too.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Purpose {
    Build,
    Test,
}

/// One requirement and what detection found.
#[derive(Debug)]
pub struct Requirement {
    pub what: &'static str,
    pub found: Option<PathBuf>,
    /// Where it was looked for, in words ("/opt/x/bin/ccec", "`ld.lld` on PATH").
    pub searched: Vec<String>,
    pub fix: &'static str,
}

/// What the detection may look at: environment variables, the file system and `PATH`, so tests
/// can lay out a fake server in a temporary directory.
pub struct Probe<'a> {
    pub var: &'a dyn Fn(&str) -> Option<String>,
    pub exists: &'a dyn Fn(&Path) -> bool,
    /// Entries of `/dev` (device nodes are `davinci<N>`).
    pub dev_entries: &'a dyn Fn() -> Vec<String>,
    /// The Rust sysroot (`rustc --print sysroot`).
    pub sysroot: Option<PathBuf>,
}

impl Probe<'_> {
    /// The first of `candidates` that exists, else the first `program` on `PATH`.
    fn first(
        &self,
        candidates: Vec<PathBuf>,
        program: Option<&str>,
    ) -> (Option<PathBuf>, Vec<String>) {
        let mut found = candidates.iter().find(|p| (self.exists)(p)).cloned();
        let mut searched: Vec<String> =
            candidates.iter().map(|c| c.display().to_string()).collect();
        if let Some(name) = program {
            searched.push(format!("`{name}` on PATH"));
            if found.is_none() {
                found = (self.var)("PATH")
                    .unwrap_or_default()
                    .split(':')
                    .filter(|d| !d.is_empty())
                    .map(|d| Path::new(d).join(name))
                    .find(|p| (self.exists)(p));
            }
        }
        (found, searched)
    }
}

/// The CANN toolkit roots to try, in order: the variables and default locations the runtime's
/// loader tries too (`simpler-acl-sys`), then a toolkit in the user's home.
fn cann_roots(p: &Probe<'_>) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for var in ["ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"] {
        if let Some(home) = (p.var)(var) {
            roots.push(PathBuf::from(home));
        }
    }
    roots.push(PathBuf::from("/usr/local/Ascend/cann"));
    roots.push(PathBuf::from("/usr/local/Ascend/ascend-toolkit/latest"));
    if let Some(home) = (p.var)("HOME") {
        roots.push(Path::new(&home).join("Ascend/ascend-toolkit/latest"));
    }
    roots
}

/// Detects every requirement of `purpose`, in the order they are reported.
pub fn detect(p: &Probe<'_>, purpose: Purpose) -> Vec<Requirement> {
    let roots = cann_roots(p);
    let (root_lib, searched) =
        p.first(roots.iter().map(|r| r.join("lib64/libascendcl.so")).collect(), None);
    let root = root_lib.as_ref().and_then(|l| l.parent()?.parent()).map(Path::to_path_buf);
    let mut out = vec![Requirement {
        what: CANN_ROOT,
        found: root.clone(),
        searched,
        fix: "install the CANN toolkit and `source <toolkit>/set_env.sh`, which sets ASCEND_HOME_PATH",
    }];
    // Without a root, the toolkit's own tools are looked for under every candidate root so the
    // report still says where they would have to be.
    let bases: Vec<PathBuf> = root.clone().map_or(roots, |r| vec![r]);
    let under = |rel: &[&str]| -> Vec<PathBuf> {
        bases.iter().flat_map(|b| rel.iter().map(move |r| b.join(r))).collect()
    };
    let (found, searched) = p.first(under(&["bin/ccec", "compiler/ccec_compiler/bin/ccec"]), None);
    out.push(Requirement {
        what: CCEC,
        found,
        searched,
        fix: "ccec ships with the CANN toolkit (compiler/ccec_compiler/bin); reinstall the toolkit",
    });
    let (found, searched) =
        p.first(under(&["bin/ld.lld", "compiler/ccec_compiler/bin/ld.lld"]), Some("ld.lld"));
    out.push(Requirement {
        what: LD_LLD,
        found,
        searched,
        fix: "ld.lld ships with the CANN toolkit's ccec compiler; or `apt-get install lld`",
    });
    let (found, searched) = p.first(under(&["tools/hcc/bin/aarch64-target-linux-gnu-gcc"]), None);
    out.push(Requirement {
        what: CROSS_COMPILER,
        found,
        searched,
        fix: "the AICPU cross compiler ships with the CANN toolkit (tools/hcc); reinstall the toolkit",
    });
    let std_dir =
        p.sysroot.iter().map(|s| s.join("lib/rustlib/aarch64-unknown-linux-gnu/lib")).collect();
    let (found, mut searched) = p.first(std_dir, None);
    if p.sysroot.is_none() {
        searched.push("the Rust sysroot (`rustc --print sysroot` failed)".into());
    }
    out.push(Requirement {
        what: "Rust standard library for aarch64-unknown-linux-gnu",
        found,
        searched,
        fix: "rustup target add aarch64-unknown-linux-gnu",
    });
    let (found, searched) = p.first(
        vec![
            PathBuf::from("/usr/local/Ascend/driver/lib64/driver/libascend_hal.so"),
            PathBuf::from("/usr/local/Ascend/driver/lib64/libascend_hal.so"),
        ],
        None,
    );
    out.push(Requirement {
        what: "driver HAL library (libascend_hal.so)",
        found,
        searched,
        fix: "install the Ascend NPU driver package (it provides driver/lib64/driver/libascend_hal.so)",
    });
    if purpose == Purpose::Test {
        let smi =
            vec![PathBuf::from("/usr/local/sbin/npu-smi"), PathBuf::from("/usr/local/bin/npu-smi")];
        let (found, searched) = p.first(smi, Some("npu-smi"));
        out.push(Requirement {
            what: NPU_SMI,
            found,
            searched,
            fix: "npu-smi ships with the Ascend NPU driver package; or pass --skip-arch-check",
        });
        let mut nodes: Vec<String> =
            (p.dev_entries)().into_iter().filter(|n| is_device_node(n)).collect();
        nodes.sort();
        out.push(Requirement {
            what: "a visible NPU (/dev/davinci<N>)",
            found: nodes.first().map(|n| Path::new("/dev").join(n)),
            searched: vec!["/dev/davinci<N>".into()],
            fix: "load the NPU driver, or run the container with the davinci device nodes mounted",
        });
    }
    out
}

fn is_device_node(name: &str) -> bool {
    name.strip_prefix("davinci")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Prints the detection report; returns whether everything required was found.
pub fn report(reqs: &[Requirement]) -> bool {
    let mut ok = true;
    for r in reqs {
        match &r.found {
            Some(path) => println!("  found    {:<52} {}", r.what, path.display()),
            None => {
                ok = false;
                println!("  MISSING  {}", r.what);
                for s in &r.searched {
                    println!("             looked at {s}");
                }
                println!("             fix: {}", r.fix);
            }
        }
    }
    ok
}

/// The real machine's probe.
fn host_probe<R>(f: impl FnOnce(&Probe<'_>) -> R) -> R {
    let var = |k: &str| std::env::var(k).ok();
    let exists = |p: &Path| p.exists();
    let dev_entries = || {
        std::fs::read_dir("/dev")
            .map(|d| {
                d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned())).collect()
            })
            .unwrap_or_default()
    };
    let sysroot =
        std::process::Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
            .args(["--print", "sysroot"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    f(&Probe { var: &var, exists: &exists, dev_entries: &dev_entries, sysroot })
}

/// The most devices one range of `--device` may name (far more than a server holds).
const MAX_LISTED_DEVICES: u32 = 256;

/// Devices named by `--device`: `0`, `0-3` or `0,2` (ascending, no repeats).
pub fn parse_devices(spec: &str) -> Result<Vec<u32>, String> {
    let bad =
        || format!("--device `{spec}`: expected a device id, a range like 0-3, or a list like 0,2");
    let mut out = Vec::new();
    for part in spec.split(',') {
        let ids = match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                if b - a >= MAX_LISTED_DEVICES {
                    return Err(format!(
                        "--device `{spec}`: a range of more than {MAX_LISTED_DEVICES} devices"
                    ));
                }
                (a..=b).collect::<Vec<_>>()
            }
            None => vec![part.parse().map_err(|_| bad())?],
        };
        out.extend(ids);
    }
    out.sort_unstable();
    if out.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("--device `{spec}` names a device twice"));
    }
    Ok(out)
}

/// The devices of `listed` that are not among `visible`.
fn not_visible(listed: &[u32], visible: &[u32]) -> Vec<u32> {
    listed.iter().copied().filter(|d| !visible.contains(d)).collect()
}

/// Which devices a batch runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// `--device 0`, `0-3` or `0,2`: exactly these.
    Listed(Vec<u32>),
    /// `--device auto [--device-num N]`: the first `count` of `candidates` (the visible
    /// devices) whose lock another batch does not hold.
    Auto { candidates: Vec<u32>, count: usize },
}

impl DeviceChoice {
    /// The devices the batch may use (the architecture check looks at all of them).
    pub fn candidates(&self) -> &[u32] {
        match self {
            DeviceChoice::Listed(d) => d,
            DeviceChoice::Auto { candidates, .. } => candidates,
        }
    }
}

/// Why `--device` / `--device-num` could not be resolved.
#[derive(Debug, PartialEq, Eq)]
pub enum ChoiceError {
    /// The flags themselves are wrong.
    Usage(String),
    /// `auto` asked for more devices than the server shows: a fact about the machine.
    TooFewVisible { count: usize, visible: Vec<u32> },
}

impl std::fmt::Display for ChoiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChoiceError::Usage(text) => f.write_str(text),
            ChoiceError::TooFewVisible { count, visible } => write!(
                f,
                "--device auto --device-num {count}: only {} device(s) visible ({visible:?})",
                visible.len()
            ),
        }
    }
}

/// The `--device` / `--device-num` choice; `visible` lists the devices `auto` picks from.
pub fn device_choice(
    args: &[String],
    visible: impl FnOnce() -> Vec<u32>,
) -> Result<DeviceChoice, ChoiceError> {
    let spec = flag_value(args, "--device").unwrap_or("0");
    let num = flag_value(args, "--device-num");
    if spec != "auto" {
        if num.is_some() {
            return Err(ChoiceError::Usage("--device-num goes with --device auto".into()));
        }
        return parse_devices(spec).map(DeviceChoice::Listed).map_err(ChoiceError::Usage);
    }
    let count = match num {
        None => 1,
        Some(n) => n.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
            ChoiceError::Usage(format!("--device-num `{n}`: expected a positive number"))
        })?,
    };
    let mut candidates = visible();
    candidates.sort_unstable();
    candidates.dedup();
    if candidates.len() < count {
        return Err(ChoiceError::TooFewVisible { count, visible: candidates });
    }
    Ok(DeviceChoice::Auto { candidates, count })
}

pub fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(String::as_str)
}

/// `cargo xtask build --platform a2a3 [--runtime hbg|trb] [--standin]`.
pub fn build(args: &[String]) -> ExitCode {
    match flag_value(args, "--platform") {
        Some("a2a3") => {}
        other => {
            eprintln!("xtask build: --platform a2a3 is the only platform (got {other:?})");
            return ExitCode::FAILURE;
        }
    }
    let runtime = match flag_value(args, "--runtime").unwrap_or("hbg") {
        r @ ("hbg" | "trb") => r,
        other => {
            eprintln!("xtask build: --runtime is hbg or trb (got `{other}`)");
            return ExitCode::FAILURE;
        }
    };
    if args.iter().any(|a| a == "--standin") {
        return match crate::onboard_build::host_artifacts(runtime) {
            Ok(manifest) => {
                println!("xtask build: host build of the {runtime} device programs");
                println!("manifest {}", manifest.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("xtask build: {e}");
                ExitCode::FAILURE
            }
        };
    }
    println!("xtask build --platform a2a3: checking the onboard toolchain");
    let reqs = host_probe(|p| detect(p, Purpose::Build));
    if !report(&reqs) {
        eprintln!("xtask build: the onboard toolchain is incomplete (see MISSING above)");
        return ExitCode::from(EXIT_ENVIRONMENT);
    }
    let Some(tools) = cann_tools(&reqs) else {
        return ExitCode::from(EXIT_ENVIRONMENT);
    };
    match crate::onboard_build::device_artifacts(runtime, &tools) {
        Ok(manifest) => {
            println!("xtask build: the {runtime} device programs are built");
            println!("manifest {}", manifest.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xtask build: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The CANN tools a complete detection found.
fn cann_tools(reqs: &[Requirement]) -> Option<crate::onboard_build::CannTools> {
    let found = |what: &str| reqs.iter().find(|r| r.what == what).and_then(|r| r.found.clone());
    Some(crate::onboard_build::CannTools {
        ccec: found(CCEC)?,
        ld_lld: found(LD_LLD)?,
        cross_cc: found(CROSS_COMPILER)?,
    })
}

/// Runs `cmd` for its output. A program written just before may still be open in a process
/// another thread forked (`ETXTBSY`), which passes within moments, so that is retried.
pub fn output_of(cmd: &mut std::process::Command) -> std::io::Result<std::process::Output> {
    let mut tries = 0;
    loop {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// `cargo xtask onboard-test [--device SPEC] [--skip-arch-check]`.
pub fn onboard_test(args: &[String]) -> ExitCode {
    let standin = args.iter().any(|a| a == "--standin");
    let visible = || {
        if standin {
            (0..crate::onboard_test::STANDIN_DEVICES).collect()
        } else {
            host_probe(|p| (p.dev_entries)())
                .iter()
                .filter(|n| is_device_node(n))
                .filter_map(|n| n.strip_prefix("davinci")?.parse().ok())
                .collect()
        }
    };
    let devices = match device_choice(args, visible) {
        Ok(d) => d,
        Err(e @ ChoiceError::Usage(_)) => {
            eprintln!("xtask onboard-test: {e}");
            return ExitCode::FAILURE;
        }
        Err(e @ ChoiceError::TooFewVisible { .. }) => {
            // A server short of devices (none at all, without an NPU) is a fact about the
            // machine: what else it lacks is listed too, and the exit says so.
            if !standin {
                println!("xtask onboard-test: checking this server");
                let mut reqs = host_probe(|p| detect(p, Purpose::Test));
                reqs.retain(|r| r.what != NPU_SMI);
                report(&reqs);
            }
            eprintln!("xtask onboard-test: {e}");
            return ExitCode::from(EXIT_ENVIRONMENT);
        }
    };
    if standin {
        return crate::onboard_test::standin(args, &devices);
    }
    let skip_arch = args.iter().any(|a| a == "--skip-arch-check");
    println!("xtask onboard-test: devices {devices:?}; checking this server");
    let mut reqs = host_probe(|p| detect(p, Purpose::Test));
    // The architecture check falls back to `aclrtGetSocName` without `npu-smi`, so a missing
    // one is reported but required by nobody.
    let npu_smi = reqs.iter().position(|r| r.what == NPU_SMI).map(|i| reqs.remove(i));
    if let Some(r) = &npu_smi {
        match &r.found {
            Some(p) => println!("  found    {:<52} {}", r.what, p.display()),
            None => println!("  absent   {} (the arch check asks CANN's aclrtGetSocName)", r.what),
        }
    }
    if !report(&reqs) {
        eprintln!(
            "xtask onboard-test: this machine cannot run the onboard tests (see MISSING above); \
             on a machine without an Ascend A2/A3 NPU this is expected, and `cargo xtask ci` \
             covers everything that runs without one"
        );
        return ExitCode::from(EXIT_ENVIRONMENT);
    }
    if let DeviceChoice::Listed(listed) = &devices {
        let visible = visible();
        let absent = not_visible(listed, &visible);
        if !absent.is_empty() {
            eprintln!(
                "xtask onboard-test: device(s) {absent:?} named by --device have no /dev/davinci \
                 node on this server (visible: {visible:?})"
            );
            return ExitCode::from(EXIT_ENVIRONMENT);
        }
    }
    let found = |what: &str| reqs.iter().find(|r| r.what == what).and_then(|r| r.found.clone());
    let smi = npu_smi.and_then(|r| r.found);
    let fallback = || crate::onboard_arch::acl_soc_name(&simpler_acl_sys::Cann::from_process_env());
    if !arch_precheck(
        devices.candidates(),
        smi.as_deref(),
        found(CANN_ROOT).as_deref(),
        skip_arch,
        &fallback,
    ) {
        return ExitCode::from(EXIT_ENVIRONMENT);
    }
    let Some(tools) = cann_tools(&reqs) else {
        return ExitCode::from(EXIT_ENVIRONMENT);
    };
    // Compile outside the device locks.
    let mut manifests = Vec::new();
    for runtime in ["hbg", "trb"] {
        match crate::onboard_build::device_artifacts(runtime, &tools) {
            Ok(m) => manifests.push((runtime, m)),
            Err(e) => {
                eprintln!("xtask onboard-test: building the {runtime} device programs: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    match crate::onboard_test::run_batch(args, &devices, &manifests, false) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("xtask onboard-test: {e}");
            ExitCode::from(EXIT_ENVIRONMENT)
        }
    }
}

/// The architecture check of every device before any is touched; prints one line per device
/// and returns whether the batch may go on. A refused device always stops it; a device whose
/// architecture cannot be told stops it unless `skip` (`--skip-arch-check`).
pub fn arch_precheck(
    devices: &[u32],
    npu_smi: Option<&Path>,
    ascend_home: Option<&Path>,
    skip: bool,
    fallback: crate::onboard_arch::SocFallback<'_>,
) -> bool {
    use crate::onboard_arch::{Verdict, check, describe};
    let mut ok = true;
    for &d in devices {
        let v = check(npu_smi, ascend_home, d, fallback);
        println!("  arch check: {}", describe(d, &v));
        match v {
            Verdict::A2a3 { .. } => {}
            Verdict::Refused { .. } => ok = false,
            Verdict::Undetectable(_) if skip => {
                println!("  arch check: device {d}: going on without it (--skip-arch-check)");
            }
            Verdict::Undetectable(_) => {
                println!(
                    "             fix: repair npu-smi or CANN, or pass --skip-arch-check if the chip is an A2/A3"
                );
                ok = false;
            }
        }
    }
    if !ok {
        eprintln!("xtask onboard-test: the architecture check refused the batch (see above)");
    }
    ok
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    struct Fake {
        vars: BTreeMap<&'static str, String>,
        files: BTreeSet<PathBuf>,
        dev: Vec<String>,
        sysroot: Option<PathBuf>,
    }

    impl Fake {
        fn detect(&self, purpose: Purpose) -> Vec<Requirement> {
            let var = |k: &str| self.vars.get(k).cloned();
            let exists = |p: &Path| self.files.contains(p);
            let dev = || self.dev.clone();
            detect(
                &Probe {
                    var: &var,
                    exists: &exists,
                    dev_entries: &dev,
                    sysroot: self.sysroot.clone(),
                },
                purpose,
            )
        }
    }

    fn missing(reqs: &[Requirement]) -> Vec<&'static str> {
        reqs.iter().filter(|r| r.found.is_none()).map(|r| r.what).collect()
    }

    fn bare() -> Fake {
        Fake {
            vars: BTreeMap::new(),
            files: BTreeSet::new(),
            dev: vec!["null".into()],
            sysroot: None,
        }
    }

    #[test]
    fn a_machine_without_cann_misses_everything_and_says_where_it_looked() {
        let reqs = bare().detect(Purpose::Test);
        assert_eq!(missing(&reqs).len(), reqs.len(), "{reqs:#?}");
        let toolkit = &reqs[0];
        let default = "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so";
        assert!(toolkit.searched.iter().any(|s| s == default), "{toolkit:?}");
        assert!(reqs.iter().all(|r| !r.fix.is_empty() && !r.searched.is_empty()));
        assert!(!report(&reqs));
    }

    #[test]
    fn a_complete_server_under_ascend_home_path_is_found() {
        let root = PathBuf::from("/opt/cann");
        let mut f = bare();
        f.vars.insert("ASCEND_HOME_PATH", root.display().to_string());
        f.vars.insert("PATH", "/usr/bin:/opt/tools".into());
        for rel in
            ["lib64/libascendcl.so", "bin/ccec", "tools/hcc/bin/aarch64-target-linux-gnu-gcc"]
        {
            f.files.insert(root.join(rel));
        }
        f.files.insert("/opt/tools/ld.lld".into());
        f.files.insert("/usr/local/Ascend/driver/lib64/driver/libascend_hal.so".into());
        f.files.insert("/usr/local/sbin/npu-smi".into());
        f.sysroot = Some("/rust".into());
        f.files.insert("/rust/lib/rustlib/aarch64-unknown-linux-gnu/lib".into());
        f.dev = vec!["davinci_manager".into(), "davinci3".into(), "davinci1".into()];
        let reqs = f.detect(Purpose::Test);
        assert!(missing(&reqs).is_empty(), "{reqs:#?}");
        assert_eq!(reqs[0].found.as_deref(), Some(root.as_path()));
        assert_eq!(reqs[2].found.as_deref(), Some(Path::new("/opt/tools/ld.lld")));
        assert_eq!(reqs.last().unwrap().found.as_deref(), Some(Path::new("/dev/davinci1")));
        // A build does not need the device side.
        f.dev.clear();
        f.files.remove(Path::new("/usr/local/sbin/npu-smi"));
        assert!(missing(&f.detect(Purpose::Build)).is_empty());
        assert_eq!(missing(&f.detect(Purpose::Test)).len(), 2);
    }

    #[test]
    fn a_toolkit_the_runtime_finds_without_configuration_is_found_too() {
        // The default install location of newer CANN, and a root named by ASCEND_TOOLKIT_HOME.
        let home = PathBuf::from("/opt/toolkit");
        for (root, var) in [("/usr/local/Ascend/cann", None), ("/opt/toolkit", Some(&home))] {
            let root = PathBuf::from(root);
            let mut f = bare();
            if let Some(home) = var {
                f.vars.insert("ASCEND_TOOLKIT_HOME", home.display().to_string());
            }
            f.files.insert(root.join("lib64/libascendcl.so"));
            let reqs = f.detect(Purpose::Build);
            assert_eq!(reqs[0].found.as_deref(), Some(root.as_path()), "{reqs:#?}");
        }
    }

    #[test]
    fn only_the_missing_piece_is_reported() {
        let root = PathBuf::from("/usr/local/Ascend/ascend-toolkit/latest");
        let mut f = bare();
        for rel in [
            "lib64/libascendcl.so",
            "compiler/ccec_compiler/bin/ccec",
            "compiler/ccec_compiler/bin/ld.lld",
        ] {
            f.files.insert(root.join(rel));
        }
        f.files.insert("/usr/local/Ascend/driver/lib64/libascend_hal.so".into());
        f.sysroot = Some("/rust".into());
        let reqs = f.detect(Purpose::Build);
        assert_eq!(
            missing(&reqs),
            [
                "aarch64 cross compiler (AICPU programs)",
                "Rust standard library for aarch64-unknown-linux-gnu"
            ]
        );
        let rust = reqs.iter().find(|r| r.what.starts_with("Rust")).unwrap();
        assert_eq!(rust.fix, "rustup target add aarch64-unknown-linux-gnu");
    }

    #[test]
    fn device_lists_ranges_and_single_ids_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_devices("0"), Ok(vec![0]));
        assert_eq!(parse_devices("0-3"), Ok(vec![0, 1, 2, 3]));
        assert_eq!(parse_devices("2,0"), Ok(vec![0, 2]));
        assert_eq!(parse_devices("0-1,4"), Ok(vec![0, 1, 4]));
        for bad in ["", "a", "3-1", "0,,1", "-1", "1-"] {
            assert!(parse_devices(bad).is_err(), "{bad}");
        }
        assert!(parse_devices("0,0-1").unwrap_err().contains("twice"));
        assert!(parse_devices("0-255").is_ok());
        assert!(parse_devices("0-4294967295").unwrap_err().contains("more than 256"));
        assert_eq!(not_visible(&[0, 2, 7], &[0, 1, 2]), [7]);
    }

    #[test]
    fn device_auto_picks_among_the_visible_devices_and_checks_its_count() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let visible = || vec![3, 0, 1];
        assert_eq!(
            device_choice(&args(&["--device", "auto"]), visible),
            Ok(DeviceChoice::Auto { candidates: vec![0, 1, 3], count: 1 })
        );
        let two = device_choice(&args(&["--device", "auto", "--device-num", "2"]), visible);
        assert_eq!(two.unwrap().candidates(), [0, 1, 3]);
        let err = device_choice(&args(&["--device", "auto", "--device-num", "4"]), visible);
        let err = err.unwrap_err();
        assert_eq!(err, ChoiceError::TooFewVisible { count: 4, visible: vec![0, 1, 3] });
        assert!(err.to_string().contains("only 3 device(s) visible"), "{err}");
        for bad in ["0", "x"] {
            let err = device_choice(&args(&["--device", "auto", "--device-num", bad]), visible);
            assert!(matches!(&err, Err(ChoiceError::Usage(t)) if t.contains("positive")), "{bad}");
        }
        assert!(device_choice(&args(&["--device", "0", "--device-num", "2"]), visible).is_err());
        assert_eq!(device_choice(&args(&[]), visible), Ok(DeviceChoice::Listed(vec![0])));
    }

    #[test]
    fn only_numbered_davinci_nodes_count_as_devices() {
        assert!(is_device_node("davinci0") && is_device_node("davinci15"));
        assert!(
            !is_device_node("davinci_manager")
                && !is_device_node("davinci")
                && !is_device_node("davinci1a")
        );
    }
}
