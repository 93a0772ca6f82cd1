//! The device program manifest: where the AICPU program, the bootstrap dispatcher and the
//! AICore executor of one runtime are, and the ABI they were built for.
//!
//! Format (`docs/device-onboard.md`, "Pointing it at CANN"):
//!
//! ```json
//! { "abi_version": 5,
//!   "artifacts": { "aicpu_program":   { "path": "libsimpler_aicpu_hbg.so", "sha256": "…" },
//!                  "dispatcher":      { "path": "libsimpler_aicpu_dispatcher.so" },
//!                  "aicore_executor": { "path": "aicore_hbg.o" } } }
//! ```
//!
//! Relative paths are relative to the manifest's directory; `sha256` and `build_id` (the GNU
//! build id of an ELF, hex) are optional and, when present, must match the file (a stale or
//! mismatched manifest is refused). `cargo xtask build --platform a2a3` writes both, with the
//! toolchain versions (ignored here).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::abi::ABI_VERSION;
use crate::error::{DeviceError, InitFailure, InitStep, ManifestProblem};

/// The environment variable naming the manifest when `RunnerOptions` does not.
pub const ENV_ONBOARD_ARTIFACTS: &str = "SIMPLER_ONBOARD_ARTIFACTS";

#[derive(Deserialize)]
struct RawManifest {
    abi_version: u32,
    artifacts: BTreeMap<String, RawArtifact>,
}

#[derive(Deserialize)]
struct RawArtifact {
    path: PathBuf,
    sha256: Option<String>,
    /// The GNU build id (hex) of an ELF artifact.
    build_id: Option<String>,
}

/// The three device programs, read into memory.
#[derive(Debug)]
pub(crate) struct Programs {
    /// The AICPU program (a shared object for the AICPU OS).
    pub(crate) aicpu_program: Vec<u8>,
    /// The bootstrap dispatcher CANN's AICPU framework loads.
    pub(crate) dispatcher: Vec<u8>,
    /// The AICore executor ELF.
    pub(crate) aicore_executor: Vec<u8>,
}

fn refuse(file: &Path, problem: ManifestProblem) -> DeviceError {
    DeviceError::Init {
        run_id: None,
        step: InitStep::LoadPrograms,
        failure: InitFailure::Manifest { path: file.to_owned(), problem: Box::new(problem) },
    }
}

/// Reads and checks the manifest at `path` and the files it names.
pub(crate) fn load(path: &Path) -> Result<Programs, DeviceError> {
    let text = std::fs::read_to_string(path).map_err(|e| refuse(path, ManifestProblem::Read(e)))?;
    let raw: RawManifest =
        serde_json::from_str(&text).map_err(|e| refuse(path, ManifestProblem::Parse(e)))?;
    if raw.abi_version != ABI_VERSION {
        let (found, expected) = (raw.abi_version, ABI_VERSION);
        return Err(refuse(path, ManifestProblem::AbiVersion { found, expected }));
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let read = |name: &'static str| -> Result<Vec<u8>, DeviceError> {
        let a = raw
            .artifacts
            .get(name)
            .ok_or_else(|| refuse(path, ManifestProblem::MissingArtifact { name }))?;
        let file = base.join(&a.path);
        let bytes = match std::fs::read(&file) {
            Ok(bytes) => bytes,
            Err(source) => {
                return Err(refuse(path, ManifestProblem::ReadArtifact { name, file, source }));
            }
        };
        if let Some(want) = &a.sha256 {
            let found = hex(&Sha256::digest(&bytes));
            if !found.eq_ignore_ascii_case(want) {
                let expected = want.clone();
                return Err(refuse(path, ManifestProblem::Stale { name, file, found, expected }));
            }
        }
        if let Some(want) = &a.build_id {
            let found = simpler_onboard_programs::build_id(&bytes).map(hex);
            if found.as_deref().is_none_or(|g| !g.eq_ignore_ascii_case(want)) {
                let expected = want.clone();
                return Err(refuse(path, ManifestProblem::BuildId { name, file, found, expected }));
            }
        }
        Ok(bytes)
    };
    Ok(Programs {
        aicpu_program: read("aicpu_program")?,
        dispatcher: read("dispatcher")?,
        aicore_executor: read("aicore_executor")?,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest of three small files in a temporary directory; `edit` changes its JSON.
    fn layout(edit: impl FnOnce(&mut serde_json::Value)) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let mut artifacts = serde_json::Map::new();
        for name in ["aicpu_program", "dispatcher", "aicore_executor"] {
            let bytes = format!("{name} bytes");
            std::fs::write(dir.path().join(name), &bytes).unwrap();
            artifacts.insert(
                name.into(),
                serde_json::json!({ "path": name, "sha256": hex(&Sha256::digest(bytes.as_bytes())) }),
            );
        }
        let mut json = serde_json::json!({ "abi_version": ABI_VERSION, "artifacts": artifacts });
        edit(&mut json);
        let path = dir.path().join("manifest.json");
        std::fs::write(&path, json.to_string()).unwrap();
        (dir, path)
    }

    /// What `load` finds wrong with the manifest at `path` (and that it names `path`).
    fn refusal(path: &Path) -> ManifestProblem {
        match load(path) {
            Err(DeviceError::Init {
                step: InitStep::LoadPrograms,
                failure: InitFailure::Manifest { path: named, problem },
                ..
            }) => {
                assert_eq!(named, path);
                *problem
            }
            other => panic!("expected a LoadPrograms refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_complete_manifest_loads_the_three_programs() {
        let (_d, path) = layout(|_| {});
        let p = load(&path).unwrap();
        assert_eq!(p.dispatcher, b"dispatcher bytes");
    }

    #[test]
    fn a_stale_artifact_is_refused_naming_the_manifest_and_the_artifact() {
        let (_d, path) = layout(|_| {});
        std::fs::write(path.with_file_name("dispatcher"), "rebuilt").unwrap();
        let m = refusal(&path);
        assert!(matches!(m, ManifestProblem::Stale { name: "dispatcher", .. }), "{m}");
    }

    #[test]
    fn an_abi_mismatch_and_a_missing_artifact_are_refused() {
        let (_d, path) = layout(|j| j["abi_version"] = serde_json::json!(ABI_VERSION + 1));
        let m = refusal(&path);
        let expected = ABI_VERSION;
        assert!(matches!(m, ManifestProblem::AbiVersion { found, .. } if found == expected + 1));
        let (_d, path) = layout(|j| {
            j["artifacts"].as_object_mut().unwrap().remove("aicore_executor");
        });
        let m = refusal(&path);
        assert!(matches!(m, ManifestProblem::MissingArtifact { name: "aicore_executor" }), "{m}");
        let (_d, path) = layout(|_| {});
        std::fs::remove_file(path.with_file_name("aicpu_program")).unwrap();
        let m = refusal(&path);
        assert!(matches!(m, ManifestProblem::ReadArtifact { name: "aicpu_program", .. }), "{m}");
        let (d, _) = layout(|_| {});
        let m = refusal(&d.path().join("absent.json"));
        assert!(matches!(&m, ManifestProblem::Read(e) if e.kind() == std::io::ErrorKind::NotFound));
    }

    #[test]
    fn a_build_id_that_does_not_match_the_elf_is_refused() {
        let (_d, path) =
            layout(|j| j["artifacts"]["aicpu_program"]["build_id"] = serde_json::json!("abcd"));
        let m = refusal(&path);
        assert!(
            matches!(&m, ManifestProblem::BuildId { found: None, expected, .. } if expected == "abcd"),
            "{m}"
        );
    }
}
