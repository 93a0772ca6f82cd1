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
    #[error("malformed frame: {} trailing bytes after offset {at}", len.saturating_sub(*at))]
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
    /// A task's arguments carry more buffers than a task has tensors: rank 0 sends one per
    /// distinct buffer its tensors name, so never more. Refused before anything is reserved for
    /// them.
    #[error(
        "malformed frame: a task's {count} buffers (count at offset {at}) are more than the \
         {cap} its tensors can name"
    )]
    TooManyBuffers {
        /// Where the count is.
        at: usize,
        /// The buffers the frame claims.
        count: u32,
        /// The most a task's tensors name.
        cap: u32,
    },
    /// A completion carries more written spans than a task has tensors: a task's write-tagged
    /// tensors name at most that many, so never more. Refused before any is read.
    #[error(
        "malformed frame: a completion's {count} written spans (count at offset {at}) are more \
         than the {cap} a task's tensors can name"
    )]
    TooManySpans {
        /// Where the count is.
        at: usize,
        /// The spans the frame claims.
        count: u32,
        /// The most a task's tensors name.
        cap: u32,
    },
    /// A task's call configuration breaks a rule of `CallConfig` (boxed to keep the error
    /// small).
    #[error("malformed frame: call config: {0}")]
    Config(Box<TypesError>),
}

/// A field of a frame that holds a code; its discriminant is its own code where a
/// `DecodeError` crosses the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[repr(u8)]
pub enum WireField {
    /// The frame's kind byte.
    FrameKind = 0,
    /// A presence flag (0 or 1).
    Flag = 1,
    /// A callable's kind.
    CallableKind = 2,
    /// A callable's namespace.
    Namespace = 3,
    /// The type of the worker a failure happened on.
    WorkerType = 4,
    /// A tensor's access tag.
    TensorTag = 5,
    /// What a task's remote run ended with.
    Outcome = 6,
    /// Why a remote run failed with no task to blame.
    RunFailure = 7,
    /// The kind of a remote run's error.
    RunFailureKind = 8,
    /// How a task failed.
    Mechanism = 9,
    /// Why a task was cancelled.
    CancelReason = 10,
    /// Why a task's arguments did not unpack.
    ArgumentsProblem = 11,
    /// Which rule a tensor descriptor breaks.
    TensorRule = 12,
    /// A name a broken rule holds (a quantity, field or cache of the descriptor).
    TensorQuantity = 13,
    /// Why a serving rank left its session.
    LeftCause = 14,
    /// How a peer broke the protocol.
    ProtocolViolation = 15,
    /// Why a frame did not decode.
    DecodeError = 16,
    /// The field a refused code was found in.
    WireField = 17,
    /// The MPI function an MPI error names.
    MpiFunction = 18,
    /// The frames a protocol step allows.
    ExpectedFrames = 19,
}

impl WireField {
    /// Every field, in code order.
    pub(crate) const ALL: [WireField; 20] = [
        WireField::FrameKind,
        WireField::Flag,
        WireField::CallableKind,
        WireField::Namespace,
        WireField::WorkerType,
        WireField::TensorTag,
        WireField::Outcome,
        WireField::RunFailure,
        WireField::RunFailureKind,
        WireField::Mechanism,
        WireField::CancelReason,
        WireField::ArgumentsProblem,
        WireField::TensorRule,
        WireField::TensorQuantity,
        WireField::LeftCause,
        WireField::ProtocolViolation,
        WireField::DecodeError,
        WireField::WireField,
        WireField::MpiFunction,
        WireField::ExpectedFrames,
    ];

    /// The field whose code is `code`.
    pub(crate) fn from_code(code: u8) -> Option<WireField> {
        WireField::ALL.into_iter().find(|f| *f as u8 == code)
    }
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
            WireField::LeftCause => "left cause",
            WireField::ProtocolViolation => "protocol violation",
            WireField::DecodeError => "decode error",
            WireField::WireField => "wire field",
            WireField::MpiFunction => "MPI function",
            WireField::ExpectedFrames => "expected frames",
        })
    }
}
