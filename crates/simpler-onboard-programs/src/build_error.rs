//! Why a host build of a device program failed (feature `host-build`).

use std::path::PathBuf;
use std::process::ExitStatus;

/// A failed `build_host_*` or [`write_orchestration_sources`](crate::write_orchestration_sources)
/// call, with the file or command it concerns and the system's own error as its source.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A source could not be written, or its directory created.
    #[error("cannot write {path}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The system's refusal.
        #[source]
        source: std::io::Error,
    },
    /// No C or C++ compiler for the host was found.
    #[error("no host {language} compiler")]
    NoCompiler {
        /// `"C"` or `"C++"`.
        language: &'static str,
        /// What the `cc` crate reported.
        #[source]
        source: cc::Error,
    },
    /// The compiler could not be started.
    #[error("cannot run {command}")]
    Spawn {
        /// The command line.
        command: String,
        /// The system's refusal (`NotFound` for a compiler that is not installed).
        #[source]
        source: std::io::Error,
    },
    /// The compiler ran and failed.
    #[error("{command} failed ({status}):\n{stderr}")]
    Compile {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it wrote to stderr.
        stderr: String,
    },
}
