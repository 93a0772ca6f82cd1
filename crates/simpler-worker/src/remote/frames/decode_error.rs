//! Why a frame did not decode: where in the frame, and what was found there.

use simpler_types::TypesError;

/// A frame that could not be decoded; offsets count bytes from the frame's start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The frame is of another version of the frame layout.
    #[error("malformed frame: version {found}, expected {expected}")]
    Version {
        /// The version the frame carries.
        found: u16,
        /// This build's version.
        expected: u16,
    },
    /// The frame ends before a field.
    #[error(
        "malformed frame: truncated: {wanted} bytes wanted at offset {at} of a {len}-byte frame"
    )]
    Truncated {
        /// Where the field starts.
        at: usize,
        /// The field's size.
        wanted: usize,
        /// The frame's size.
        len: usize,
    },
    /// Bytes follow the last field.
    #[error("malformed frame: {} trailing bytes after offset {at}", len - at)]
    Trailing {
        /// Where the last field ends.
        at: usize,
        /// The frame's size.
        len: usize,
    },
    /// A count claims more items than the rest of the frame can hold.
    #[error(
        "malformed frame: a count of {count} at offset {at} needs at least {needed} bytes, \
         {left} are left"
    )]
    Count {
        /// Where the count is.
        at: usize,
        /// The count.
        count: u32,
        /// The fewest bytes that many items take.
        needed: u64,
        /// The bytes after the count.
        left: usize,
    },
    /// A field holds a code that means nothing there.
    #[error("malformed frame: {field} code {code} at offset {at}")]
    Code {
        /// Which field.
        field: WireField,
        /// The code found.
        code: u8,
        /// Where it is.
        at: usize,
    },
    /// A string is not UTF-8.
    #[error(
        "malformed frame: the text at offset {at} is not UTF-8 past its first {valid_up_to} \
         bytes"
    )]
    Text {
        /// Where its bytes start.
        at: usize,
        /// How many of them are valid UTF-8.
        valid_up_to: usize,
    },
    /// A run id is 0, which no run has.
    #[error("malformed frame: run id 0 at offset {at}")]
    RunIdZero {
        /// Where it is.
        at: usize,
    },
    /// A failure chain has more levels than a completion carries.
    #[error("malformed frame: a failure chain of {levels} levels, more than {max}")]
    ChainTooDeep {
        /// The levels the frame claims.
        levels: u32,
        /// The most a completion carries.
        max: u32,
    },
    /// A failed task's chain has no level.
    #[error("malformed frame: an empty failure chain at offset {at}")]
    EmptyChain {
        /// Where its count is.
        at: usize,
    },
    /// A task's call configuration breaks a rule of `CallConfig` (boxed to keep the error
    /// small).
    #[error("malformed frame: call config: {0}")]
    Config(Box<TypesError>),
}

/// A field of a frame that holds a code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireField {
    /// The frame's kind byte.
    FrameKind,
    /// A presence flag (0 or 1).
    Flag,
    /// A callable's kind.
    CallableKind,
    /// A callable's namespace.
    Namespace,
    /// The type of the worker a failure happened on.
    WorkerType,
    /// A tensor's access tag.
    TensorTag,
    /// What a task's remote run ended with.
    Outcome,
    /// Why a remote run failed with no task to blame.
    RunFailure,
    /// The kind of a remote run's error.
    RunFailureKind,
    /// How a task failed.
    Mechanism,
    /// Why a task was cancelled.
    CancelReason,
    /// Why a task's arguments did not unpack.
    ArgumentsProblem,
    /// Which rule a tensor descriptor breaks.
    TensorRule,
    /// A name a broken rule holds (a quantity, field or cache of the descriptor).
    TensorQuantity,
}

impl std::fmt::Display for WireField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WireField::FrameKind => "frame kind",
            WireField::Flag => "flag",
            WireField::CallableKind => "callable kind",
            WireField::Namespace => "callable namespace",
            WireField::WorkerType => "worker type",
            WireField::TensorTag => "tensor tag",
            WireField::Outcome => "outcome",
            WireField::RunFailure => "run failure",
            WireField::RunFailureKind => "run failure kind",
            WireField::Mechanism => "failure mechanism",
            WireField::CancelReason => "cancel reason",
            WireField::ArgumentsProblem => "arguments problem",
            WireField::TensorRule => "tensor rule",
            WireField::TensorQuantity => "tensor quantity",
        })
    }
}
