//! The device program manifest: where the AICPU program, the bootstrap dispatcher and the
//! AICore executor of one runtime are, and the ABI they were built for.
//!
//! Format (`docs/device-onboard.md`, "Device programs"):
//!
//! ```json
//! { "abi_version": 1,
//!   "artifacts": { "aicpu_program":   { "path": "libsimpler_aicpu_hbg.so", "sha256": "…" },
//!                  "dispatcher":      { "path": "libsimpler_aicpu_dispatcher.so" },
//!                  "aicore_executor": { "path": "aicore_hbg.o" } } }
//! ```
//!
//! Relative paths are relative to the manifest's directory; `sha256` is optional and, when
//! present, must match the file (a stale manifest is refused).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::abi::ABI_VERSION;
use crate::error::{DeviceError, InitStep};

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

fn refuse(file: &Path, why: impl std::fmt::Display) -> DeviceError {
    DeviceError::Init {
        run_id: None,
        step: InitStep::LoadPrograms,
        message: format!("device program manifest {}: {why}", file.display()),
    }
}

/// Reads and checks the manifest at `path` and the files it names.
pub(crate) fn load(path: &Path) -> Result<Programs, DeviceError> {
    let text = std::fs::read_to_string(path).map_err(|e| refuse(path, e))?;
    let raw: RawManifest = serde_json::from_str(&text).map_err(|e| refuse(path, e))?;
    if raw.abi_version != ABI_VERSION {
        return Err(refuse(
            path,
            format!("built for ABI {} but this crate speaks ABI {ABI_VERSION}", raw.abi_version),
        ));
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let read = |name: &str| -> Result<Vec<u8>, DeviceError> {
        let a =
            raw.artifacts.get(name).ok_or_else(|| refuse(path, format!("no `{name}` artifact")))?;
        let file = base.join(&a.path);
        let bytes = std::fs::read(&file)
            .map_err(|e| refuse(path, format!("`{name}` at {}: {e}", file.display())))?;
        if let Some(want) = &a.sha256 {
            let got = hex(&Sha256::digest(&bytes));
            if !got.eq_ignore_ascii_case(want) {
                return Err(refuse(
                    path,
                    format!(
                        "`{name}` at {} is stale: sha256 {got}, manifest says {want}",
                        file.display()
                    ),
                ));
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
