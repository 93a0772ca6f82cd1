//! [`CallableProblem`]: why a callable cannot be registered or run
//! ([`DeviceError::InvalidCallable`](super::DeviceError::InvalidCallable)), and
//! [`ObjectError`]: why a shared object did not load.

use std::fmt;
use std::path::PathBuf;

/// A name a callable carries.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum CallableName {
    /// The orchestration's entry symbol.
    Entry,
    /// The orchestration's config symbol.
    Config,
    /// The name of kernel `func_id`.
    Kernel {
        /// The kernel's func id.
        func_id: u32,
    },
}

impl fmt::Display for CallableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallableName::Entry => f.write_str("entry name"),
            CallableName::Config => f.write_str("config name"),
            CallableName::Kernel { func_id } => write!(f, "kernel {func_id} name"),
        }
    }
}

/// The kind of a kernel's code (`KernelCode`'s variants).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum KernelCodeKind {
    /// A function in this process.
    Native,
    /// A C kernel in a shared object.
    SharedObject,
    /// The text of a device kernel object.
    Text,
}

/// Why a callable cannot be registered, or cannot run under the runner's runtime and backend.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallableProblem {
    /// The chip signature has more entries than allowed.
    #[error("chip signature has {entries} entries, at most {max} allowed")]
    ChipSignatureTooLong {
        /// Its entries.
        entries: usize,
        /// The most allowed.
        max: usize,
    },
    /// A kernel's signature has more entries than allowed.
    #[error("kernel {func_id} signature has {entries} entries, at most {max} allowed")]
    KernelSignatureTooLong {
        /// The kernel's func id.
        func_id: u32,
        /// Its entries.
        entries: usize,
        /// The most allowed.
        max: usize,
    },
    /// A name is longer than allowed.
    #[error("{which} {name:?} is {} bytes, at most {max} allowed", name.len())]
    NameTooLong {
        /// Which name.
        which: CallableName,
        /// The name.
        name: String,
        /// The most bytes allowed.
        max: usize,
    },
    /// Two kernels share a func id.
    #[error("func id {func_id} is used twice")]
    DuplicateFuncId {
        /// The func id.
        func_id: u32,
    },
    /// A kernel's func id is outside the func table.
    #[error("func id {func_id} is out of range (must be below {limit})")]
    FuncIdRange {
        /// The func id.
        func_id: u32,
        /// One past the largest func id.
        limit: usize,
    },
    /// A kernel's signature declares more scalars than a task passes.
    #[error("kernel {func_id} signature declares {scalars} scalars, at most {max} per task")]
    TooManyScalars {
        /// The kernel's func id.
        func_id: u32,
        /// The scalars it declares.
        scalars: usize,
        /// The most a task passes.
        max: usize,
    },
    /// A kernel's signature declares more tensors than a tensormap_and_ringbuffer task holds.
    #[error(
        "kernel {func_id}{} signature declares {tensors} tensors, at most {max} per task under \
         tensormap_and_ringbuffer",
        name.as_ref().map(|n| format!(" ({n:?})")).unwrap_or_default()
    )]
    TooManyTensors {
        /// The kernel's func id.
        func_id: u32,
        /// The kernel's name, if it has one.
        name: Option<String>,
        /// The tensors it declares.
        tensors: usize,
        /// The most a task holds.
        max: usize,
    },
    /// A device-object orchestration's image, or a kernel's device text, holds no byte: there
    /// is no code to load.
    #[error("{}", empty_code(*func_id))]
    EmptyCode {
        /// The kernel's func id; `None` for the orchestration object.
        func_id: Option<u32>,
    },
    /// A device-object orchestration under host_build_graph, which runs a `Native` one on the
    /// host.
    #[error(
        "orchestration {entry:?} is a device object, which runs only under \
         tensormap_and_ringbuffer; host_build_graph runs a Native orchestration on the host"
    )]
    DeviceObjectUnderHostBuildGraph {
        /// The orchestration's entry symbol.
        entry: String,
    },
    /// A `Native` orchestration under tensormap_and_ringbuffer on a device whose AICPU cannot
    /// run host code.
    #[error(
        "a Native orchestration is host code, which this device's AICPU cannot run; \
         tensormap_and_ringbuffer here needs a DeviceObject orchestration"
    )]
    NativeOrchestrationOnDevice,
    /// A device-object orchestration the AICPU side did not load at registration.
    #[error(
        "the device-object orchestration {entry:?} was not loaded on the AICPU side at \
         registration"
    )]
    OrchestrationNotLoaded {
        /// The orchestration's entry symbol.
        entry: String,
    },
    /// An orchestration's entry or config name, or the directory its object goes to, does not
    /// fit a registration (too long, or holds a NUL byte).
    #[error(
        "orchestration entry {entry:?}, config {config:?} or directory {dir:?} is too long or \
         holds a NUL byte"
    )]
    RegistrationNames {
        /// The entry symbol.
        entry: String,
        /// The config symbol.
        config: String,
        /// The directory.
        dir: String,
    },
    /// A kernel's code is of a kind this backend cannot execute: the simulator runs `Native`
    /// and `SharedObject` kernels, the onboard backend `Text` ones.
    #[error("func id {func_id}: {}", code_rule(*code))]
    KernelCode {
        /// The kernel's func id.
        func_id: u32,
        /// The kind of its code.
        code: KernelCodeKind,
    },
    /// A kernel's shared object did not load (the source).
    #[error("kernel {func_id}: {source}")]
    KernelObject {
        /// The kernel's func id.
        func_id: u32,
        /// Why it did not load.
        #[source]
        source: Box<ObjectError>,
    },
    /// A problem a chip process found with the callable, as its text: the chip process's wire
    /// carries the refusal's text only.
    #[error("{text}")]
    Relayed {
        /// The problem's text.
        text: String,
    },
}

fn empty_code(func_id: Option<u32>) -> String {
    match func_id {
        Some(id) => format!("func id {id}: the kernel's device text is empty"),
        None => "the device-object orchestration's image is empty".into(),
    }
}

fn code_rule(code: KernelCodeKind) -> String {
    match code {
        KernelCodeKind::Text => {
            "the kernel is device text, which only the onboard backend can run".into()
        }
        other => format!(
            "the onboard backend executes only device code (KernelCode::Text), not {other:?}"
        ),
    }
}

/// Why a shared object (a kernel, an orchestration, the AICPU program or the AICore executor)
/// did not load.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectError {
    /// The path holds a NUL byte.
    #[error("{} contains a NUL byte", path.display())]
    NulInPath {
        /// The path.
        path: PathBuf,
    },
    /// The loader refused the object.
    #[error("loading {}: {loader}", path.display())]
    Open {
        /// The object's path.
        path: PathBuf,
        /// The loader's message (`dlerror`: the system reports it as text only).
        loader: String,
    },
    /// The object does not export a symbol (or the symbol's name holds a NUL byte).
    #[error("{} exports no `{symbol}`: {loader}", path.display())]
    MissingSymbol {
        /// The object's path.
        path: PathBuf,
        /// The symbol.
        symbol: String,
        /// The loader's message (`dlerror`: the system reports it as text only).
        loader: String,
    },
    /// The object speaks another ABI version than this crate.
    #[error("{} speaks ABI {found}, this crate speaks ABI {expected}", path.display())]
    AbiVersion {
        /// The object's path.
        path: PathBuf,
        /// The version it reports.
        found: u32,
        /// This crate's.
        expected: u32,
    },
}

/// Why an orchestration object was not loaded at registration
/// ([`DeviceError::OrchestrationLoad`](super::DeviceError::OrchestrationLoad)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OrchLoadCause {
    /// The register entry refused, with its own text (written on the AICPU side).
    #[error("{text}")]
    Refused {
        /// What the register entry wrote.
        text: String,
    },
    /// The register entry replied with a status no failure has, and its text.
    #[error("unknown reply status {status}: {text}")]
    UnknownStatus {
        /// The status.
        status: u32,
        /// What the register entry wrote.
        text: String,
    },
    /// The AICPU program did not answer.
    #[error("the AICPU program did not answer")]
    NoReply,
    /// The reply reports success but names no function address.
    #[error("the reply names no function address")]
    NoAddress,
    /// The AICPU program exports no register entry.
    #[error("the AICPU program exports no simpler_aicpu_register_callable")]
    NoRegisterEntry,
    /// The device programs are not loaded yet.
    #[error("the device programs are not loaded")]
    ProgramsNotLoaded,
    /// The directory the object is written to is not UTF-8, which the register entry needs.
    #[error("the object directory {} is not UTF-8", dir.display())]
    DirNotUtf8 {
        /// The directory.
        dir: PathBuf,
    },
    /// The object could not be written to its file.
    #[error("{}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The system's refusal.
        #[source]
        source: std::io::Error,
    },
    /// The loader refused the object, or it lacks the entry or config symbol (the source).
    #[error("{0}")]
    Object(#[source] Box<ObjectError>),
}
