//! The glibc check of the AICPU program: the AICPU's operating system ships one glibc, and a
//! program that needs a newer symbol version fails to load there with an AICPU exception that
//! names nothing. So the build reads the versions the shared object needs (its GNU version
//! requirements, `.gnu.version_r`) and refuses one newer than the configured baseline.
//!
//! The baseline is `GLIBC_2.17` (the first glibc for aarch64, which Rust's
//! `aarch64-unknown-linux-gnu` standard library also targets) unless
//! `SIMPLER_AICPU_GLIBC_BASELINE` names another (`2.28` or `GLIBC_2.28`).

use std::fmt;

use crate::onboard_elf::{SHT_GNU_VERNEED, c_str, malformed, sections, u16_at, u32_at};

/// The environment variable that overrides [`DEFAULT_BASELINE`].
pub const BASELINE_VAR: &str = "SIMPLER_AICPU_GLIBC_BASELINE";

/// The default AICPU glibc baseline.
pub const DEFAULT_BASELINE: GlibcVersion = GlibcVersion(2, 17);

/// A glibc symbol version `GLIBC_<major>.<minor>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct GlibcVersion(pub u32, pub u32);

impl GlibcVersion {
    /// `GLIBC_2.28`, `2.28` or `2.28.1` (the patch level does not change symbol versions).
    pub fn parse(text: &str) -> Option<GlibcVersion> {
        let v = text.trim();
        let v = v.strip_prefix("GLIBC_").unwrap_or(v);
        let mut parts = v.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
        Some(GlibcVersion(major, minor))
    }
}

impl fmt::Display for GlibcVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GLIBC_{}.{}", self.0, self.1)
    }
}

/// The baseline from the environment, or the default; a value that is no version is an error.
pub fn baseline() -> Result<GlibcVersion, String> {
    match std::env::var(BASELINE_VAR) {
        Ok(v) => GlibcVersion::parse(&v)
            .ok_or_else(|| format!("{BASELINE_VAR}=`{v}` is no glibc version (e.g. 2.28)")),
        Err(_) => Ok(DEFAULT_BASELINE),
    }
}

/// The glibc versions a little-endian ELF64 object requires, as (version, library), highest
/// first; an empty list when it requires none. A malformed object is an error.
pub fn required(elf: &[u8]) -> Result<Vec<(GlibcVersion, String)>, String> {
    let (sections, _) = sections(elf)?;
    let mut out = Vec::new();
    for s in sections.iter().filter(|s| s.kind == SHT_GNU_VERNEED) {
        let strtab = sections.get(s.link).ok_or_else(malformed)?.offset;
        let mut need = s.offset;
        for _ in 0..s.info {
            let file = c_str(elf, strtab + u32_at(elf, need + 4)?)?;
            let mut aux = need + u32_at(elf, need + 8)?;
            for _ in 0..u16_at(elf, need + 2)? {
                let name = c_str(elf, strtab + u32_at(elf, aux + 8)?)?;
                if let Some(v) = name.strip_prefix("GLIBC_").and_then(GlibcVersion::parse) {
                    out.push((v, file.to_owned()));
                }
                aux += u32_at(elf, aux + 12)?;
            }
            let next = u32_at(elf, need + 12)?;
            if next == 0 {
                break;
            }
            need += next;
        }
    }
    out.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    Ok(out)
}

/// Refuses `elf` (named `name` in the message) when it requires a glibc newer than `baseline`;
/// otherwise returns the highest version it requires, if any.
pub fn check(
    name: &str,
    elf: &[u8],
    baseline: GlibcVersion,
) -> Result<Option<GlibcVersion>, String> {
    let needs = required(elf).map_err(|e| format!("{name}: {e}"))?;
    match needs.first() {
        Some((v, lib)) if *v > baseline => {
            let newer: Vec<String> = needs
                .iter()
                .filter(|(n, _)| *n > baseline)
                .map(|(n, l)| format!("{n} ({l})"))
                .collect();
            Err(format!(
                "{name} needs {v} from {lib}, newer than the AICPU's glibc baseline {baseline} \
                 (all newer: {}); it would fail to load on the device. Build it with CANN's \
                 cross toolchain, avoid the newer functions, or set {BASELINE_VAR} if the \
                 device's AICPU OS has that glibc",
                newer.join(", ")
            ))
        }
        first => Ok(first.map(|(v, _)| *v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_order_and_print() {
        assert_eq!(GlibcVersion::parse("GLIBC_2.28"), Some(GlibcVersion(2, 28)));
        assert_eq!(GlibcVersion::parse("2.17.1"), Some(GlibcVersion(2, 17)));
        assert_eq!(GlibcVersion::parse("2"), Some(GlibcVersion(2, 0)));
        assert_eq!(GlibcVersion::parse("new"), None);
        assert!(GlibcVersion(2, 9) < GlibcVersion(2, 17));
        assert_eq!(GlibcVersion(2, 34).to_string(), "GLIBC_2.34");
    }

    #[test]
    fn garbage_and_objects_without_requirements_are_told_apart() {
        assert!(required(b"\x7fELF\x02\x01 too short").is_err());
        assert!(required(&[0u8; 128]).is_err());
        // A header whose section table lies outside the file.
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x28..0x30].copy_from_slice(&4096u64.to_le_bytes());
        elf[0x3a] = 64;
        elf[0x3c] = 1;
        assert!(required(&elf).is_err());
        elf[0x3c] = 0;
        assert_eq!(required(&elf).unwrap(), []);
    }

    /// The stand-in CANN library and the host build of the AICPU program are real shared
    /// objects of this machine: both need some glibc, the highest is what `ldd`-like tools
    /// report, and a baseline below it refuses the object naming the version.
    #[test]
    fn host_built_objects_need_their_glibc_and_a_lower_baseline_refuses_them() {
        let standin = simpler_acl_sys::standin::library(None).unwrap();
        let program = crate::onboard_build::aicpu_program(None).unwrap();
        for path in [standin, program] {
            let elf = std::fs::read(&path).unwrap();
            let needs = required(&elf).unwrap();
            assert!(!needs.is_empty(), "{}", path.display());
            assert!(needs.iter().any(|(_, lib)| lib.starts_with("libc.so")), "{needs:?}");
            let highest = needs[0].0;
            assert_eq!(check("x.so", &elf, highest).unwrap(), Some(highest));
            let err = check("x.so", &elf, GlibcVersion(2, 0)).unwrap_err();
            assert!(
                err.contains(&format!("x.so needs {highest}")) && err.contains(BASELINE_VAR),
                "{err}"
            );
        }
    }
}
