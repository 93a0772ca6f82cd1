//! [`InitFailure`]: why setting up the device failed
//! ([`DeviceError::Init`](super::DeviceError::Init)).

#[cfg(feature = "onboard")]
use std::path::PathBuf;

use super::ObjectError;

/// Why setting up the device failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitFailure {
    /// The platform's backend is not built into this crate; there is no fallback.
    #[error(
        "the {feature} backend is not built into this crate: enable the `{feature}` feature of \
         simpler-device-a2a3 (refusing to fall back to another backend)"
    )]
    BackendNotBuilt {
        /// The crate feature that builds it.
        feature: &'static str,
    },
    /// A device program (the simulator's AICPU program or AICore executor) did not load.
    #[error("{0}")]
    Program(#[source] Box<ObjectError>),
    /// A simulated AICPU thread could not be started.
    #[error("spawning AICPU thread {thread}: {source}")]
    ThreadSpawn {
        /// The thread's index.
        thread: u32,
        /// The system's refusal.
        #[source]
        source: std::io::Error,
    },
    /// The AICPU program's init entry returned a non-zero status.
    #[error("the AICPU program's init entry returned {code}")]
    AicpuInitEntry {
        /// The status it returned.
        code: i32,
    },
    /// The register table could not be allocated.
    #[error("allocating the register table ({bytes} bytes) failed")]
    RegisterTable {
        /// Its size.
        bytes: u64,
    },
    /// An init step ran before the one it needs (the streams or the device programs).
    #[cfg(feature = "onboard")]
    #[error("the {missing} do not exist yet")]
    OutOfOrder {
        /// What is missing: "streams" or "device programs".
        missing: &'static str,
    },
    /// The CANN found is of a version this build does not support.
    #[cfg(feature = "onboard")]
    #[error(
        "CANN {} is not supported: this build pins CANN {} (major version {})",
        found.as_ref().map(|v| v.to_string()).unwrap_or_default(),
        simpler_acl_sys::PINNED_CANN_RELEASE,
        simpler_acl_sys::SUPPORTED_MAJOR_VERSION
    )]
    CannVersion {
        /// The version found, if CANN reported one.
        found: Option<simpler_acl_sys::CannVersion>,
    },
    /// The device already has a runner in this process (it may attach again once that one
    /// is finalized): a force reset of either would release the other's memory, streams and
    /// programs.
    #[cfg(feature = "onboard")]
    #[error(
        "device {device} already has a runner in this process: finalize that one first, or \
         attach this one to another device"
    )]
    DeviceAttached {
        /// The device id.
        device: u32,
    },
    /// A CANN failure of a kind other than a load or call failure (the source).
    #[cfg(feature = "onboard")]
    #[error("{0}")]
    Cann(#[source] Box<simpler_acl_sys::Error>),
    /// No device program manifest was named.
    #[cfg(feature = "onboard")]
    #[error(
        "no device program manifest: set it in RunnerOptions (with_onboard_manifest) or in {}",
        crate::ENV_ONBOARD_ARTIFACTS
    )]
    NoManifest,
    /// The device program manifest, or a file it names, is unusable.
    #[cfg(feature = "onboard")]
    #[error("device program manifest {}: {problem}", path.display())]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        #[source]
        problem: Box<ManifestProblem>,
    },
    /// The AICPU program's op description file's path holds a NUL byte.
    #[cfg(feature = "onboard")]
    #[error("the AICPU program's op description {}: the path holds a NUL byte", path.display())]
    OpDescriptionPath {
        /// The file.
        path: PathBuf,
    },
    /// The AICPU program's op description could not be written to its temporary file.
    #[cfg(feature = "onboard")]
    #[error("the AICPU program's op description {}: cannot be written: {source}", path.display())]
    OpDescription {
        /// The file.
        path: PathBuf,
        /// The system's refusal.
        #[source]
        source: std::io::Error,
    },
    /// An AICPU entry's name holds a NUL byte.
    #[cfg(feature = "onboard")]
    #[error("the AICPU entry name {name:?} holds a NUL byte")]
    EntryName {
        /// The name.
        name: String,
    },
}

/// What is wrong with the device program manifest ([`InitFailure::Manifest`]).
#[cfg(feature = "onboard")]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestProblem {
    /// It cannot be read.
    #[error("{0}")]
    Read(#[source] std::io::Error),
    /// It is not a manifest.
    #[error("{0}")]
    Parse(#[source] serde_json::Error),
    /// It was built for another ABI version.
    #[error("built for ABI {found} but this crate speaks ABI {expected}")]
    AbiVersion {
        /// The manifest's.
        found: u32,
        /// This crate's.
        expected: u32,
    },
    /// It names no artifact of that name.
    #[error("no `{name}` artifact")]
    MissingArtifact {
        /// The artifact.
        name: &'static str,
    },
    /// An artifact's file cannot be read.
    #[error("`{name}` at {}: {source}", file.display())]
    ReadArtifact {
        /// The artifact.
        name: &'static str,
        /// Its file.
        file: PathBuf,
        /// The system's refusal.
        #[source]
        source: std::io::Error,
    },
    /// An artifact's SHA-256 differs from the manifest's.
    #[error("`{name}` at {} is stale: sha256 {found}, manifest says {expected}", file.display())]
    Stale {
        /// The artifact.
        name: &'static str,
        /// Its file.
        file: PathBuf,
        /// The file's digest (hex).
        found: String,
        /// The manifest's (hex).
        expected: String,
    },
    /// An artifact's GNU build id differs from the manifest's (or it has none).
    #[error(
        "`{name}` at {} does not match: build id {}, manifest says {expected}",
        file.display(),
        found.as_deref().unwrap_or("(none)")
    )]
    BuildId {
        /// The artifact.
        name: &'static str,
        /// Its file.
        file: PathBuf,
        /// The file's build id (hex), if it has one.
        found: Option<String>,
        /// The manifest's (hex).
        expected: String,
    },
}
