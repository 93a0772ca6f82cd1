//! Why a serving rank left its session, on the wire: a code per [`LeftCause`] and its fields
//! (`docs/multi-host.md` §"Frames"). A protocol violation crosses as its own code and fields,
//! a `DecodeError` likewise; an MPI function and a set of expected frames cross as indices
//! into fixed tables. A cause these codes cannot carry crosses as `LeftCause::Other`, its text.

use std::time::Duration;

use super::{DecodeError, FrameKind, MAX_ERROR_BYTES, Reader, WireField, Writer, truncate};
use crate::remote::error::{LeftCause, ProtocolViolation, SpanMismatch, WrittenAt};

/// Every MPI function a `RemoteError::Mpi` names.
const MPI_FUNCTIONS: [&str; 7] = [
    "MPI_Isend",
    "MPI_Isend (drill)",
    "MPI_Test",
    "MPI_Get_count",
    "MPI_Imrecv",
    "MPI_Comm_set_errhandler",
    "MPI_Mrecv",
];

/// Every set of frames a `ProtocolViolation::UnexpectedFrame` names as allowed.
const EXPECTED_FRAMES: [&[FrameKind]; 2] =
    [FrameKind::ANSWERS_TO_MANIFEST, FrameKind::SESSION_REQUESTS];

/// The code of the cause that crosses as its text.
const OTHER: u8 = 7;
/// The code of a lost `ShutdownDone`, whose cause is one level deep.
const SHUTDOWN_DONE_LOST: u8 = 6;

fn index<T: PartialEq + ?Sized>(table: &[&T], item: &T) -> Option<u8> {
    table.iter().position(|t| *t == item).map(|i| i as u8)
}

/// Whether the frame format has a code for `v` and everything it holds.
fn carries_violation(v: &ProtocolViolation) -> bool {
    match v {
        ProtocolViolation::Malformed(e) => !matches!(e, DecodeError::Config(_)),
        ProtocolViolation::UnexpectedFrame { expected, .. } => {
            index(&EXPECTED_FRAMES, *expected).is_some()
        }
        ProtocolViolation::WrittenSpans(_) | ProtocolViolation::SpanOutsideBuffer { .. } => true,
    }
}

impl Writer {
    pub(super) fn left_cause(&mut self, c: &LeftCause) {
        self.cause(c, false);
    }

    /// `c`, or its text when the format has no code for it (or when it is a lost
    /// `ShutdownDone` inside another).
    fn cause(&mut self, c: &LeftCause, nested: bool) {
        match c {
            LeftCause::Unresponsive { budget } => {
                self.u8(0);
                self.duration(*budget);
            }
            LeftCause::Mpi { op, code } if let Some(function) = index(&MPI_FUNCTIONS, *op) => {
                self.u8(1);
                self.u8(function);
                self.u32(*code as u32);
            }
            LeftCause::FrameTooLarge { bytes, limit } => {
                self.u8(2);
                self.u64(*bytes);
                self.u64(*limit);
            }
            LeftCause::SendUnconfirmed { frame, waited } => {
                self.u8(3);
                self.u8(*frame as u8);
                self.duration(*waited);
            }
            LeftCause::Finalized => self.u8(4),
            LeftCause::Protocol(v) if carries_violation(v) => {
                self.u8(5);
                self.violation(v);
            }
            LeftCause::ShutdownDoneLost { lost, close } if !nested => {
                self.u8(SHUTDOWN_DONE_LOST);
                self.cause(lost, true);
                self.opt_str(close.as_deref().map(|c| truncate(c, MAX_ERROR_BYTES)));
            }
            other => {
                self.u8(OTHER);
                self.str(truncate(&other.to_string(), MAX_ERROR_BYTES));
            }
        }
    }

    fn duration(&mut self, d: Duration) {
        self.u64(d.as_nanos().min(u128::from(u64::MAX)) as u64);
    }

    /// A violation `carries_violation` accepts.
    fn violation(&mut self, v: &ProtocolViolation) {
        match v {
            ProtocolViolation::Malformed(e) => {
                self.u8(0);
                self.decode_error(e);
            }
            ProtocolViolation::UnexpectedFrame { got, expected } => {
                self.u8(1);
                self.u8(*got as u8);
                self.u8(index(&EXPECTED_FRAMES, *expected).unwrap_or(u8::MAX));
            }
            ProtocolViolation::WrittenSpans(m) => {
                self.u8(2);
                self.u64(m.index as u64);
                self.opt_span(m.got.as_ref());
                self.opt_span(m.expected.as_ref());
                self.u64(m.carried as u64);
                self.u64(m.named as u64);
            }
            ProtocolViolation::SpanOutsideBuffer { span, size } => {
                self.u8(3);
                self.span(span);
                self.u64(*size);
            }
        }
    }

    fn span(&mut self, s: &WrittenAt) {
        self.u32(s.buffer);
        self.u64(s.offset);
        self.u64(s.len);
    }

    fn opt_span(&mut self, s: Option<&WrittenAt>) {
        match s {
            Some(s) => {
                self.u8(1);
                self.span(s);
            }
            None => self.u8(0),
        }
    }

    /// A decode error other than `Config` (which `carries_violation` refuses).
    fn decode_error(&mut self, e: &DecodeError) {
        match e {
            DecodeError::Version { found, expected } => {
                self.u8(0);
                self.u16(*found);
                self.u16(*expected);
            }
            DecodeError::Truncated { at, wanted, len } => {
                self.u8(1);
                self.u64(*at as u64);
                self.u64(*wanted as u64);
                self.u64(*len as u64);
            }
            DecodeError::Trailing { at, len } => {
                self.u8(2);
                self.u64(*at as u64);
                self.u64(*len as u64);
            }
            DecodeError::Count { at, count, needed, left } => {
                self.u8(3);
                self.u64(*at as u64);
                self.u32(*count);
                self.u64(*needed);
                self.u64(*left as u64);
            }
            DecodeError::Code { field, code, at } => {
                self.u8(4);
                self.u8(*field as u8);
                self.u8(*code);
                self.u64(*at as u64);
            }
            DecodeError::Text { at, valid_up_to } => {
                self.u8(5);
                self.u64(*at as u64);
                self.u64(*valid_up_to as u64);
            }
            DecodeError::RunIdZero { at } => {
                self.u8(6);
                self.u64(*at as u64);
            }
            DecodeError::ChainTooDeep { levels, max } => {
                self.u8(7);
                self.u32(*levels);
                self.u32(*max);
            }
            DecodeError::EmptyChain { at } => {
                self.u8(8);
                self.u64(*at as u64);
            }
            DecodeError::TooManyBuffers { at, count, cap } => {
                self.u8(9);
                self.u64(*at as u64);
                self.u32(*count);
                self.u32(*cap);
            }
            DecodeError::TooManySpans { at, count, cap } => {
                self.u8(10);
                self.u64(*at as u64);
                self.u32(*count);
                self.u32(*cap);
            }
            // `carries_violation` refused it: the writer never gets here.
            DecodeError::Config(_) => self.u8(u8::MAX),
        }
    }
}

impl Reader<'_> {
    pub(super) fn left_cause(&mut self) -> Result<LeftCause, DecodeError> {
        self.cause(false)
    }

    fn cause(&mut self, nested: bool) -> Result<LeftCause, DecodeError> {
        let code = self.code(WireField::LeftCause, |c| {
            (c <= OTHER && !(nested && c == SHUTDOWN_DONE_LOST)).then_some(c)
        })?;
        Ok(match code {
            0 => LeftCause::Unresponsive { budget: self.duration()? },
            1 => LeftCause::Mpi {
                op: self
                    .code(WireField::MpiFunction, |c| MPI_FUNCTIONS.get(usize::from(c)).copied())?,
                code: self.u32()? as i32,
            },
            2 => LeftCause::FrameTooLarge { bytes: self.u64()?, limit: self.u64()? },
            3 => LeftCause::SendUnconfirmed {
                frame: self.code(WireField::FrameKind, FrameKind::from_code)?,
                waited: self.duration()?,
            },
            4 => LeftCause::Finalized,
            5 => LeftCause::Protocol(self.violation()?),
            SHUTDOWN_DONE_LOST => LeftCause::ShutdownDoneLost {
                lost: Box::new(self.cause(true)?),
                close: self.opt_str()?,
            },
            _ => LeftCause::Other { text: self.str()? },
        })
    }

    fn duration(&mut self) -> Result<Duration, DecodeError> {
        Ok(Duration::from_nanos(self.u64()?))
    }

    fn violation(&mut self) -> Result<ProtocolViolation, DecodeError> {
        Ok(match self.code(WireField::ProtocolViolation, |c| (c <= 3).then_some(c))? {
            0 => ProtocolViolation::Malformed(self.decode_error()?),
            1 => ProtocolViolation::UnexpectedFrame {
                got: self.code(WireField::FrameKind, FrameKind::from_code)?,
                expected: self.code(WireField::ExpectedFrames, |c| {
                    EXPECTED_FRAMES.get(usize::from(c)).copied()
                })?,
            },
            2 => ProtocolViolation::WrittenSpans(Box::new(SpanMismatch {
                index: self.u64()? as usize,
                got: self.opt_span()?,
                expected: self.opt_span()?,
                carried: self.u64()? as usize,
                named: self.u64()? as usize,
            })),
            _ => ProtocolViolation::SpanOutsideBuffer { span: self.span()?, size: self.u64()? },
        })
    }

    fn span(&mut self) -> Result<WrittenAt, DecodeError> {
        Ok(WrittenAt { buffer: self.u32()?, offset: self.u64()?, len: self.u64()? })
    }

    fn opt_span(&mut self) -> Result<Option<WrittenAt>, DecodeError> {
        if self.flag()? { self.span().map(Some) } else { Ok(None) }
    }

    fn decode_error(&mut self) -> Result<DecodeError, DecodeError> {
        Ok(match self.code(WireField::DecodeError, |c| (c <= 10).then_some(c))? {
            0 => DecodeError::Version { found: self.u16()?, expected: self.u16()? },
            1 => DecodeError::Truncated {
                at: self.u64()? as usize,
                wanted: self.u64()? as usize,
                len: self.u64()? as usize,
            },
            2 => DecodeError::Trailing { at: self.u64()? as usize, len: self.u64()? as usize },
            3 => DecodeError::Count {
                at: self.u64()? as usize,
                count: self.u32()?,
                needed: self.u64()?,
                left: self.u64()? as usize,
            },
            4 => DecodeError::Code {
                field: self.code(WireField::WireField, WireField::from_code)?,
                code: self.u8()?,
                at: self.u64()? as usize,
            },
            5 => DecodeError::Text { at: self.u64()? as usize, valid_up_to: self.u64()? as usize },
            6 => DecodeError::RunIdZero { at: self.u64()? as usize },
            7 => DecodeError::ChainTooDeep { levels: self.u32()?, max: self.u32()? },
            8 => DecodeError::EmptyChain { at: self.u64()? as usize },
            9 => DecodeError::TooManyBuffers {
                at: self.u64()? as usize,
                count: self.u32()?,
                cap: self.u32()?,
            },
            _ => DecodeError::TooManySpans {
                at: self.u64()? as usize,
                count: self.u32()?,
                cap: self.u32()?,
            },
        })
    }
}
