//! Diagnostics (`docs/device-chip.md`): device wall time, swimlane traces, the dependency graph and scope
//! statistics.
//!
//! Everything here works on host copies of device data read after a run, so it is plain safe
//! code. Files go under the run's `output_prefix` and are written to a temporary name and then
//! renamed, so a reader never sees a half-written file.
//!
//! - `timing`: wall time and phases from the AICPU phase records.
//! - `swimlane`: `l2_swimlane_records.json` and `swimlane.perfetto.json`.
//! - `deps`: `deps.json`; `dot`: the same graph as Graphviz DOT, `deps.dot`.
//! - `scopes`: `scope_stats/scope_stats.jsonl`.

pub(crate) mod deps;
pub(crate) mod dot;
pub(crate) mod scopes;
pub(crate) mod swimlane;
pub(crate) mod timing;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use simpler_types::TaskId;

use crate::runner::RunReport;

/// How a run ended, for the terminal cleanup's export step.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Outcome {
    /// Completed with no latched status.
    Success,
    /// Failed before the AICore launch: only host-side data exists.
    FailedBeforeLaunch,
    /// Failed after (or during) the launch.
    FailedAfterLaunch,
}

/// The diagnostics a run latched at preparation step 1.
#[derive(Clone, Debug, Default)]
pub(crate) struct DiagPlan {
    /// `CallConfig::swimlane` level (0 = off).
    pub(crate) swimlane: u32,
    /// Dependency-graph capture.
    pub(crate) dep_gen: bool,
    /// Scope statistics.
    pub(crate) scope_stats: bool,
    /// Where files go.
    pub(crate) prefix: Option<Arc<Path>>,
}

/// Writes a run's files under its prefix and records them (or the failure) in its report.
/// Export I/O errors never fail the run; they become report warnings.
#[derive(Debug)]
pub(crate) struct Exporter<'a> {
    prefix: &'a Path,
    report: &'a mut RunReport,
}

impl<'a> Exporter<'a> {
    /// An exporter writing under `prefix` into `report`.
    pub(crate) fn new(prefix: &'a Path, report: &'a mut RunReport) -> Exporter<'a> {
        Exporter { prefix, report }
    }

    /// The engine task one level up that asked for the run, if any.
    pub(crate) fn origin(&self) -> Option<TaskId> {
        self.report.origin
    }

    /// The report, for counts the exported data yields (dropped swimlane records).
    pub(crate) fn report(&mut self) -> &mut RunReport {
        self.report
    }

    /// Writes `bytes` to `name` under the prefix.
    pub(crate) fn write(&mut self, name: &str, bytes: &[u8]) {
        match write_atomic(self.prefix, name, bytes) {
            Ok(p) => self.report.outputs.push(p),
            Err(e) => self
                .report
                .warnings
                .push(format!("writing {name} under {}: {e}", self.prefix.display())),
        }
    }

    /// A warning about data that could not be exported.
    pub(crate) fn warn(&mut self, message: impl Into<String>) {
        self.report.warnings.push(message.into());
    }
}

/// The `"origin"` object of the trace metadata and `deps.json`: the engine run and task one
/// level up that started this chip run, `null` when the run was started directly.
pub(crate) fn origin_json(origin: Option<TaskId>) -> serde_json::Value {
    match origin {
        Some(t) => serde_json::json!({"run": t.run.get().to_string(), "task": t.seq}),
        None => serde_json::Value::Null,
    }
}

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
