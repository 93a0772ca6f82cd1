//! Diagnostics (spec §7): device wall time, swimlane traces, the dependency graph and scope
//! statistics.
//!
//! Everything here works on host copies of device data read after a run, so it is plain safe
//! code. Files go under the run's `output_prefix` and are written to a temporary name and then
//! renamed, so a reader never sees a half-written file.
//!
//! - `timing`: wall time and phases from the AICPU phase records.
//! - `swimlane`: `l2_swimlane_records.json` and `swimlane.perfetto.json`.
//! - `deps`: `deps.json`.
//! - `scopes`: `scope_stats/scope_stats.jsonl`.

pub(crate) mod deps;
pub(crate) mod scopes;
pub(crate) mod swimlane;
pub(crate) mod timing;

use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `dir/name` through a temporary file and a rename.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all().ok();
    }
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Reads a little-endian `u32` at `off` of a host copy (0 if out of range).
pub(crate) fn le_u32(b: &[u8], off: u64) -> u32 {
    let o = off as usize;
    b.get(o..o + 4).map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// Reads a little-endian `u64` at `off` of a host copy (0 if out of range).
pub(crate) fn le_u64(b: &[u8], off: u64) -> u64 {
    let o = off as usize;
    b.get(o..o + 8).map_or(0, |s| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        u64::from_le_bytes(a)
    })
}

/// Reads a little-endian `i32` at `off` of a host copy (0 if out of range).
pub(crate) fn le_i32(b: &[u8], off: u64) -> i32 {
    le_u32(b, off) as i32
}
