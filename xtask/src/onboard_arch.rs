//! The architecture check `onboard-test` runs before it touches a device.
//!
//! A device of another architecture accepts the A2/A3 programs and then fails them with
//! AICPU exceptions or a poisoned device (507018, 507899), which look like runtime bugs, so the
//! batch refuses such a device up front:
//!
//! 1. `npu-smi info -t board -i <device> -c 0` prints `Key : value` lines. An A2 names
//!    `Chip Type` and `Chip Name` (`Ascend` + `910B3`), an A3 `Chip Name` and `NPU Name`
//!    (`Ascend910` + `9392`); the SoC name is `<type><name>` or `<name>_<npu name>`
//!    (`Ascend910B3`, `Ascend910_9392`).
//! 2. The SoC's short version is the `Short_SoC_version` of
//!    `$ASCEND_HOME_PATH/<arch>-linux/data/platform_config/<SoC>.ini`; without that file it is
//!    read off the SoC name's known prefixes.
//! 3. `Ascend910B` (A2) and `Ascend910_93` (A3) pass; `Ascend950` (A5) and anything else are
//!    refused, naming the SoC.
//! 4. When `npu-smi` is missing, fails or prints nothing usable, the SoC name comes from CANN
//!    itself: `aclrtGetSocName` after `aclInit` (no device is opened), then steps 2 and 3. A
//!    check that still cannot tell is an environment problem, unless `--skip-arch-check` is
//!    given.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What the check found for one device.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// An A2 or A3 chip.
    A2a3 { soc: String, short: String, source: String },
    /// A chip of another architecture: refused.
    Refused { soc: String, short: String, why: String },
    /// The check could not tell.
    Undetectable(String),
}

/// How long `npu-smi` may take before the check gives up on it.
const NPU_SMI_LIMIT: Duration = Duration::from_secs(20);

/// The SoC name from `npu-smi info -t board` output.
pub fn soc_name(board: &str) -> Result<String, String> {
    let field = |key: &str| {
        board.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_owned()).filter(|v| !v.is_empty())
        })
    };
    let name = field("Chip Name").ok_or("npu-smi printed no `Chip Name`")?;
    let soc = match (field("NPU Name"), field("Chip Type")) {
        (Some(npu), _) => format!("{name}_{npu}"),
        (None, Some(kind)) => format!("{kind}{name}"),
        (None, None) => return Err("npu-smi printed neither `NPU Name` nor `Chip Type`".into()),
    };
    if is_soc_name(&soc) {
        Ok(soc)
    } else {
        Err(format!("npu-smi printed a chip name that is no SoC name: `{soc}`"))
    }
}

/// The name becomes a file name: letters, digits and `_` only.
fn is_soc_name(soc: &str) -> bool {
    !soc.is_empty() && soc.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Where the check gets the SoC name when `npu-smi` cannot give it.
pub type SocFallback<'a> = &'a dyn Fn() -> Result<String, String>;

/// The SoC name CANN reports (`Cann::soc_name`: `aclrtGetSocName` within an ACL session, no
/// device opened), CANN loaded by `cann`.
pub fn acl_soc_name(cann: &simpler_acl_sys::Cann) -> Result<String, String> {
    match cann.soc_name() {
        Ok(Some(name)) => Ok(name),
        Ok(None) => Err("aclrtGetSocName returned no name".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The platform-config files that may describe `soc`, host architecture first.
fn ini_candidates(home: &Path, soc: &str) -> Vec<PathBuf> {
    let mut arches = vec![std::env::consts::ARCH];
    arches.extend(["aarch64", "x86_64"].into_iter().filter(|a| *a != std::env::consts::ARCH));
    arches.iter().map(|a| home.join(format!("{a}-linux/data/platform_config/{soc}.ini"))).collect()
}

/// `Short_SoC_version` of `soc` and where it came from.
pub fn short_soc_version(soc: &str, ascend_home: Option<&Path>) -> Option<(String, String)> {
    for ini in ascend_home.map(|h| ini_candidates(h, soc)).unwrap_or_default() {
        let Ok(text) = std::fs::read_to_string(&ini) else { continue };
        let short = text.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "Short_SoC_version").then(|| v.trim().to_owned())
        });
        if let Some(short) = short.filter(|s| !s.is_empty()) {
            return Some((short, ini.display().to_string()));
        }
    }
    const PREFIXES: [&str; 3] = ["Ascend910B", "Ascend910_93", "Ascend950"];
    PREFIXES
        .iter()
        .find(|p| soc.starts_with(*p))
        .map(|p| ((*p).to_owned(), "the SoC name (no platform_config file)".to_owned()))
}

/// The verdict on a SoC and its short version.
pub fn classify(soc: String, short: Option<(String, String)>) -> Verdict {
    let Some((short, source)) = short else {
        return Verdict::Refused {
            soc: soc.clone(),
            short: "unknown".into(),
            why: format!("{soc} is not a known A2/A3 SoC (expected Ascend910B* or Ascend910_93*)"),
        };
    };
    match short.as_str() {
        "Ascend910B" | "Ascend910_93" => Verdict::A2a3 { soc, short, source },
        "Ascend950" => Verdict::Refused {
            why: format!(
                "{soc} is an A5 chip ({short}); simpler's device programs are built for A2/A3, \
                 and on an A5 they fail as AICPU exceptions (507018) or a poisoned device (507899)"
            ),
            soc,
            short,
        },
        _ => Verdict::Refused {
            why: format!("{soc} ({short}) is not an A2/A3 chip (Ascend910B or Ascend910_93)"),
            soc,
            short,
        },
    }
}

/// Runs `npu-smi` for `device` and returns what it printed, or why it could not.
fn board_info(npu_smi: &Path, device: u32) -> Result<String, String> {
    let spawn = || {
        Command::new(npu_smi)
            .args(["info", "-t", "board", "-i", &device.to_string(), "-c", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
    };
    // A script written just before may still be open in a process another thread forked
    // (ETXTBSY); that passes within moments.
    let mut child = {
        let mut tries = 0;
        loop {
            match spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other,
            }
        }
    }
    .map_err(|e| format!("could not run {}: {e}", npu_smi.display()))?;
    let deadline = Instant::now() + NPU_SMI_LIMIT;
    let status = loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(s) => break s,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not answer within {NPU_SMI_LIMIT:?}",
                    npu_smi.display()
                ));
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    if status.success() {
        Ok(out)
    } else {
        let said = err.lines().chain(out.lines()).find(|l| !l.trim().is_empty()).unwrap_or("");
        Err(format!("`npu-smi info -t board -i {device} -c 0` failed ({status}): {said}"))
    }
}

/// The check of `device` with `npu_smi` (as detection found it) and the CANN root; when
/// `npu-smi` cannot name the SoC, `fallback` does.
pub fn check(
    npu_smi: Option<&Path>,
    ascend_home: Option<&Path>,
    device: u32,
    fallback: SocFallback<'_>,
) -> Verdict {
    let why = match npu_smi_soc(npu_smi, device) {
        Ok(soc) => {
            let short = short_soc_version(&soc, ascend_home);
            return classify(soc, short);
        }
        Err(why) => why,
    };
    match fallback() {
        Ok(soc) if is_soc_name(&soc) => {
            let short = short_soc_version(&soc, ascend_home).map(|(short, source)| {
                (short, format!("{source}; SoC name from aclrtGetSocName ({why})"))
            });
            classify(soc, short)
        }
        Ok(soc) => Verdict::Undetectable(format!(
            "{why}; aclrtGetSocName answered `{soc}`, which is no SoC name"
        )),
        Err(e) => Verdict::Undetectable(format!("{why}; the fallback failed too: {e}")),
    }
}

/// The SoC name `npu-smi` gives for `device`, or why it gives none.
fn npu_smi_soc(npu_smi: Option<&Path>, device: u32) -> Result<String, String> {
    let npu_smi = npu_smi.ok_or("npu-smi was not found")?;
    let board = board_info(npu_smi, device)?;
    soc_name(&board).map_err(|e| format!("device {device}: {e}"))
}

/// One line for the report.
pub fn describe(device: u32, v: &Verdict) -> String {
    match v {
        Verdict::A2a3 { soc, short, source } => {
            let which = if short == "Ascend910B" { "A2" } else { "A3" };
            format!("device {device}: {soc} → {short} ({which}), from {source}")
        }
        Verdict::Refused { why, .. } => format!("device {device}: REFUSED: {why}"),
        Verdict::Undetectable(why) => {
            format!("device {device}: cannot tell the architecture: {why}")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    const A2: &str = "        NPU ID                         : 0\n        Chip ID                        : 0\n        Chip Type                      : Ascend\n        Chip Name                      : 910B3\n        Chip Version                   : V1\n";
    const A3: &str = "        NPU ID                         : 0\n        NPU Name                       : 9392\n        Chip ID                        : 0\n        Chip Name                      : Ascend910\n";
    const A5: &str = "        Chip Type                      : Ascend\n        Chip Name                      : 950PR\n";

    /// A directory holding an `npu-smi` script that prints `stdout` and exits `code`, plus a
    /// CANN root with the platform-config files of `inis` (SoC, short version).
    struct FakeServer {
        dir: PathBuf,
    }

    impl FakeServer {
        fn new(tag: &str, script: Option<&str>, inis: &[(&str, &str)]) -> FakeServer {
            let dir = std::env::temp_dir().join(format!("xtask-arch-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("bin")).unwrap();
            if let Some(body) = script {
                let path = dir.join("bin/npu-smi");
                std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            for (soc, short) in inis {
                let cfg =
                    dir.join(format!("cann/{}-linux/data/platform_config", std::env::consts::ARCH));
                std::fs::create_dir_all(&cfg).unwrap();
                std::fs::write(
                    cfg.join(format!("{soc}.ini")),
                    format!("[version]\nSoC_version={soc}\nShort_SoC_version={short}\n"),
                )
                .unwrap();
            }
            FakeServer { dir }
        }

        /// Runs the check with the server's `bin` as the whole `PATH`.
        fn check(&self, device: u32) -> Verdict {
            let path = format!("{}:/nonexistent", self.dir.join("bin").display());
            let npu_smi = on_path(&path, "npu-smi");
            check(npu_smi.as_deref(), Some(&self.dir.join("cann")), device, &|| {
                Err("no CANN here".into())
            })
        }

        /// As `check`, with the SoC name fallback asking the stand-in CANN library.
        fn check_with(&self, device: u32, cann: &simpler_acl_sys::standin::FakeInstall) -> Verdict {
            let path = format!("{}:/nonexistent", self.dir.join("bin").display());
            let npu_smi = on_path(&path, "npu-smi");
            let fallback = || acl_soc_name(&cann.cann());
            check(npu_smi.as_deref(), Some(&self.dir.join("cann")), device, &fallback)
        }
    }

    /// The first `name` in the directories of a `PATH` value.
    pub fn on_path(path_var: &str, name: &str) -> Option<PathBuf> {
        path_var
            .split(':')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
    }

    impl Drop for FakeServer {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn printing(text: &str) -> String {
        format!("cat <<'EOF'\n{text}EOF")
    }

    #[test]
    fn an_a2_passes_with_the_short_version_from_its_platform_config() {
        let s = FakeServer::new("a2", Some(&printing(A2)), &[("Ascend910B3", "Ascend910B")]);
        match s.check(0) {
            Verdict::A2a3 { soc, short, source } => {
                assert_eq!((soc.as_str(), short.as_str()), ("Ascend910B3", "Ascend910B"));
                assert!(source.ends_with("platform_config/Ascend910B3.ini"), "{source}");
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn an_a3_passes_and_without_a_platform_config_the_name_decides() {
        let s = FakeServer::new("a3", Some(&printing(A3)), &[]);
        match s.check(0) {
            Verdict::A2a3 { soc, short, source } => {
                assert_eq!((soc.as_str(), short.as_str()), ("Ascend910_9392", "Ascend910_93"));
                assert!(source.contains("SoC name"), "{source}");
            }
            v => panic!("{v:?}"),
        }
        assert!(describe(0, &s.check(0)).contains("(A3)"));
    }

    #[test]
    fn the_device_id_reaches_npu_smi() {
        // The script answers as an A2 for device 3 only.
        let body = format!("[ \"$5\" = 3 ] || exit 1\n{}", printing(A2));
        let s = FakeServer::new("dev", Some(&body), &[]);
        assert!(matches!(s.check(3), Verdict::A2a3 { .. }));
        assert!(matches!(s.check(0), Verdict::Undetectable(_)));
    }

    #[test]
    fn an_a5_and_an_unknown_soc_are_refused_naming_the_soc() {
        let s = FakeServer::new("a5", Some(&printing(A5)), &[("Ascend950PR", "Ascend950")]);
        match s.check(0) {
            Verdict::Refused { soc, why, .. } => {
                assert_eq!(soc, "Ascend950PR");
                assert!(why.contains("A5") && why.contains("507018"), "{why}");
            }
            v => panic!("{v:?}"),
        }
        let other = "Chip Type : Ascend\nChip Name : 310P3\n";
        let s = FakeServer::new("310", Some(&printing(other)), &[("Ascend310P3", "Ascend310P")]);
        match s.check(0) {
            Verdict::Refused { soc, short, why } => {
                assert_eq!((soc.as_str(), short.as_str()), ("Ascend310P3", "Ascend310P"));
                assert!(why.contains("not an A2/A3"), "{why}");
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_missing_failing_or_garbled_npu_smi_is_undetectable() {
        let none = FakeServer::new("none", None, &[]);
        assert!(matches!(none.check(0),
            Verdict::Undetectable(why) if why.starts_with("npu-smi was not found")));
        let failing =
            FakeServer::new("fail", Some("echo 'dcmi module initialize failed' >&2; exit 8"), &[]);
        match failing.check(0) {
            Verdict::Undetectable(why) => {
                assert!(why.contains("dcmi module initialize failed"), "{why}")
            }
            v => panic!("{v:?}"),
        }
        let garbage = FakeServer::new(
            "garbage",
            Some("echo 'Segmentation fault'; head -c 64 /dev/urandom | od"),
            &[],
        );
        match garbage.check(0) {
            Verdict::Undetectable(why) => assert!(why.contains("no `Chip Name`"), "{why}"),
            v => panic!("{v:?}"),
        }
        // A name that would escape the platform_config directory is no SoC name.
        let sneaky =
            FakeServer::new("sneaky", Some(&printing("Chip Type : ../../x\nChip Name : y\n")), &[]);
        assert!(
            matches!(sneaky.check(0), Verdict::Undetectable(why) if why.contains("no SoC name"))
        );
    }

    #[test]
    fn without_a_usable_npu_smi_the_soc_name_comes_from_acl_rt_get_soc_name() {
        let cann = simpler_acl_sys::standin::FakeInstall::standard().unwrap();
        let none = FakeServer::new("acl-none", None, &[("Ascend910B1", "Ascend910B")]);
        match none.check_with(0, &cann) {
            Verdict::A2a3 { soc, short, source } => {
                assert_eq!((soc.as_str(), short.as_str()), ("Ascend910B1", "Ascend910B"));
                assert!(source.contains("Ascend910B1.ini"), "{source}");
                assert!(source.contains("aclrtGetSocName (npu-smi was not found)"), "{source}");
            }
            v => panic!("{v:?}"),
        }
        let garbled = FakeServer::new("acl-garbled", Some("echo 'Segmentation fault'"), &[]);
        cann.set_value("soc_name", 1).unwrap();
        assert!(matches!(garbled.check_with(0, &cann),
            Verdict::A2a3 { short, .. } if short == "Ascend910_93"));
        cann.set_value("soc_name", 2).unwrap();
        match garbled.check_with(0, &cann) {
            Verdict::Refused { soc, why, .. } => {
                assert_eq!(soc, "Ascend950PR_9599");
                assert!(why.contains("A5"), "{why}");
            }
            v => panic!("{v:?}"),
        }
        cann.set_value("soc_name", 3).unwrap();
        match garbled.check_with(0, &cann) {
            Verdict::Undetectable(why) => {
                assert!(why.contains("no `Chip Name`") && why.contains("returned no name"), "{why}")
            }
            v => panic!("{v:?}"),
        }
    }
}
