//! The crate's errors: loading failures and CANN return codes with their names.

use std::fmt;

use crate::loader::{Candidate, Library};

/// One place tried for a library and why it did not open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// What was tried.
    pub candidate: Candidate,
    /// `dlerror` (or "no such file" for a path that does not exist).
    pub error: String,
}

/// A CANN library or symbol that could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// No candidate of the library opened.
    #[error("{library} not found; tried: {}", tried_list(.tried))]
    Library {
        /// The library searched for.
        library: Library,
        /// Every place tried, in order, with its `dlerror`.
        tried: Vec<Attempt>,
    },
    /// The library opened but does not export the symbol.
    #[error("{symbol} is not exported by {library} (opened from {from}): {error}")]
    Symbol {
        /// The library searched.
        library: Library,
        /// The C name looked up.
        symbol: &'static str,
        /// Where the library was opened from.
        from: String,
        /// `dlerror` of the lookup.
        error: String,
    },
    /// [`Cann::require`](crate::Cann::require) was asked for a function this crate does not
    /// bind.
    #[error("{symbol} is not a function simpler binds")]
    Unlisted {
        /// The name asked for.
        symbol: String,
    },
    /// [`Cann::probe`](crate::Cann::probe) or [`Cann::require`](crate::Cann::require) found
    /// functions missing: every one of them.
    #[error("CANN is incomplete: {}", missing_list(.missing))]
    Incomplete {
        /// One entry per missing library (once) or symbol.
        missing: Vec<LoadError>,
    },
}

fn tried_list(tried: &[Attempt]) -> String {
    let parts: Vec<String> =
        tried.iter().map(|a| format!("{} ({})", a.candidate, a.error)).collect();
    parts.join("; ")
}

fn missing_list(missing: &[LoadError]) -> String {
    let parts: Vec<String> = missing.iter().map(ToString::to_string).collect();
    parts.join(" | ")
}

/// A CANN call that returned an error code.
///
/// `Display` reads e.g. "aclrtSynchronizeStreamWithTimeout: 507046
/// ACL_ERROR_RT_STREAM_SYNC_TIMEOUT (the host timed out waiting for the stream)", followed by
/// CANN's own recent message when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AclError {
    /// The C function that failed.
    pub func: &'static str,
    /// Its return code.
    pub code: i32,
    /// The code's CANN name, or `"UNKNOWN"`.
    pub name: &'static str,
    /// What the code means, in one line.
    pub meaning: &'static str,
    /// `aclGetRecentErrMsg` right after the failure, when CANN had one.
    pub recent: Option<String>,
}

impl AclError {
    /// The error of `func` returning `code`, named from the error table.
    pub fn new(func: &'static str, code: i32, recent: Option<String>) -> Self {
        let (name, meaning) = error_name(code);
        AclError { func, code, name, meaning, recent }
    }
}

impl fmt::Display for AclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} {} ({})", self.func, self.code, self.name, self.meaning)?;
        if let Some(recent) = &self.recent {
            write!(f, "; CANN says: {recent}")?;
        }
        Ok(())
    }
}

impl std::error::Error for AclError {}

/// The codes simpler names, with one line each on what they mean.
pub const ERROR_NAMES: &[(i32, &str, &str)] = &[
    (
        100002,
        "ACL_ERROR_REPEAT_INITIALIZE",
        "ACL was already initialized in this process; tolerated by aclInit callers",
    ),
    (
        100037,
        "ACL_ERROR_REPEAT_FINALIZE",
        "ACL is not initialized: a finalize without an initialisation still in force",
    ),
    (107000, "ACL_ERROR_RT_PARAM_INVALID", "an argument of the call is invalid"),
    (
        107001,
        "ACL_ERROR_RT_INVALID_DEVICEID",
        "no such device: the id is out of range or not visible to this process",
    ),
    (
        107002,
        "ACL_ERROR_RT_CONTEXT_NULL",
        "the calling thread has no current context (no device bound)",
    ),
    (107003, "ACL_ERROR_RT_STREAM_CONTEXT", "the stream is not in the calling thread's context"),
    (107022, "ACL_ERROR_RT_DEVICE_TASK_ABORT", "the device aborted the task"),
    (207000, "ACL_ERROR_RT_FEATURE_NOT_SUPPORT", "the runtime or device does not support this"),
    (207001, "ACL_ERROR_RT_MEMORY_ALLOCATION", "the device could not allocate memory"),
    (507000, "ACL_ERROR_RT_INTERNAL_ERROR", "internal error of the CANN runtime"),
    (507014, "ACL_ERROR_RT_AICORE_TIMEOUT", "an AICore task exceeded its execution timeout"),
    (507015, "ACL_ERROR_RT_AICORE_EXCEPTION", "an AICore task raised an exception"),
    (507017, "ACL_ERROR_RT_AICPU_TIMEOUT", "an AICPU task exceeded its execution timeout"),
    (507018, "ACL_ERROR_RT_AICPU_EXCEPTION", "an AICPU task raised an exception"),
    (507046, "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT", "the host timed out waiting for the stream"),
    (507047, "ACL_ERROR_RT_EVENT_SYNC_TIMEOUT", "the host timed out waiting for the event"),
    (
        507899,
        "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
        "driver internal error; usually the symptom of an earlier device fault, not its cause",
    ),
];

/// The name and meaning of `code` (`"UNKNOWN"` for a code outside [`ERROR_NAMES`]).
pub fn error_name(code: i32) -> (&'static str, &'static str) {
    ERROR_NAMES
        .iter()
        .find(|(c, ..)| *c == code)
        .map_or(("UNKNOWN", "a code simpler has no name for"), |(_, name, meaning)| {
            (*name, *meaning)
        })
}

/// Either failure of a CANN call made through this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The function could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The function ran and returned an error code.
    #[error(transparent)]
    Acl(#[from] AclError),
}
