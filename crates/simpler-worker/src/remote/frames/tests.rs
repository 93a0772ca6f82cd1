//! Round trips and refusals of the frame codec.

use super::*;
use crate::remote::error::{
    ArgumentsProblem, LeftCause, ProtocolViolation, SpanMismatch, WrittenAt,
};

/// Arguments with a view of a copied-in buffer, a blind output, a null tensor and scalars.
fn wire_args() -> WireArgs {
    let t = Tensor::with_buffer(0, 64, &[4, 4], simpler_types::DataType::Float32).unwrap();
    let view = t.view(&[2, 2], &[1, 1]).unwrap().manual_dep(true).version(3);
    WireArgs {
        tensors: vec![
            WireTensor { tensor: view, tag: TensorArgType::InOut, buffer: Some(0) },
            WireTensor { tensor: t, tag: TensorArgType::Output, buffer: Some(1) },
            WireTensor { tensor: t, tag: TensorArgType::Input, buffer: None },
        ],
        scalars: vec![42, u64::MAX],
        buffers: vec![
            WireBuffer { len: 64, bytes: Some(vec![5; 64]) },
            WireBuffer { len: 64, bytes: None },
        ],
    }
}

fn round_trip(p: Packet) {
    let bytes = p.encode();
    assert_eq!(Packet::decode(&bytes), Ok(p));
}

#[test]
fn a_failure_chain_crosses_at_most_its_outer_levels_and_a_deeper_one_is_refused() {
    let run = RunId::from_raw(7).unwrap();
    let id = CallableId::new([3; 32], CallableKind::Host, CallableNamespace::LocalHost);
    let level = |seq| TaskFailure::new(TaskId::new(run, seq), id, FailureMechanism::Panicked, "");
    let mut chain = level(0);
    for seq in 1..=40 {
        chain = level(seq).caused_by(std::sync::Arc::new(chain));
    }
    let bytes =
        Packet::Completion { seq: 1, outcome: Outcome::TaskFailed { failure: chain } }.encode();
    let Ok(Packet::Completion { outcome: Outcome::TaskFailed { failure }, .. }) =
        Packet::decode(&bytes)
    else {
        panic!("the chain decodes");
    };
    let seqs: Vec<u32> = failure.chain().map(|f| f.task.seq).collect();
    assert_eq!(seqs, (9..=40).rev().collect::<Vec<u32>>(), "the outer 32 levels");
    // A frame that claims more levels than that is refused before anything is reserved.
    // A frame of valid levels, one more than the cap, is refused; so is a count no frame
    // could hold, before anything is reserved.
    for (claimed, written) in [(MAX_CHAIN_LEVELS as u32 + 1, MAX_CHAIN_LEVELS + 1), (u32::MAX, 2)] {
        let mut w = Writer(Vec::new());
        w.u16(VERSION);
        w.u8(FrameKind::Completion as u8);
        w.u64(1);
        w.u8(1);
        w.u32(claimed);
        let mut budget = MAX_ERROR_BYTES;
        for seq in 0..written as u32 {
            w.failure(&level(seq), &mut budget);
        }
        let refused = Packet::decode(&w.0);
        let levels = claimed;
        let max = MAX_CHAIN_LEVELS as u32;
        assert!(
            matches!(refused, Err(DecodeError::ChainTooDeep { levels: l, max: m }) if l == levels && m == max)
                || matches!(refused, Err(DecodeError::Count { count, .. }) if count == claimed),
            "{claimed} levels: {refused:?}"
        );
    }
}

#[test]
fn every_frame_round_trips() {
    let config = CallConfig::builder()
        .block_dim(4)
        .heap_bytes(RingSel::Ring(2), 4096)
        .output_prefix("out")
        .build()
        .unwrap();
    let run = RunId::from_raw(7).unwrap();
    let id = CallableId::new([3; 32], CallableKind::Host, CallableNamespace::LocalHost);
    let mut inner = TaskFailure::new(TaskId::new(run, 2), id, FailureMechanism::Panicked, "boom")
        .on_worker(WorkerRef::sub(1));
    // The code's name crosses too.
    inner.device_code =
        Some(simpler_types::DeviceCode::new(507_015, "ACL_ERROR_RT_AICORE_EXCEPTION"));
    let outer = TaskFailure::new(
        TaskId::new(run, 1),
        id,
        FailureMechanism::Timeout {
            budget: TimeoutBudget::RingAlloc,
            limit: Duration::from_secs(3),
        },
        "outer",
    )
    .caused_by(std::sync::Arc::new(inner));
    for p in [
        Packet::Hello { session: 3 },
        Packet::Manifest {
            session: 3,
            host: "h".into(),
            entries: vec![ManifestEntry {
                kind: CallableKind::Graph,
                name: "g".into(),
                digest: [9; 32],
            }],
            start_error: Some("no".into()),
        },
        Packet::Accept,
        Packet::Refuse { session: Some(3), reason: "r".into() },
        Packet::Refuse { session: None, reason: "not reached".into() },
        Packet::Left { session: 3, cause: LeftCause::Finalized },
        Packet::Task { seq: 5, graph: 1, config, args: wire_args() },
        Packet::Completion {
            seq: 5,
            outcome: Outcome::Ok {
                written: vec![WrittenSpan { buffer: 1, offset: 8, bytes: vec![7; 12] }],
            },
        },
        Packet::Completion { seq: 6, outcome: Outcome::TaskFailed { failure: outer } },
        Packet::Completion {
            seq: 7,
            outcome: Outcome::RunFailed {
                level: 3,
                failure: RemoteRunFailure::Run {
                    kind: RemoteRunKind::Refused,
                    message: "closed".into(),
                },
            },
        },
        Packet::Completion {
            seq: 8,
            outcome: Outcome::RunFailed {
                level: 3,
                failure: RemoteRunFailure::UnknownOrdinal { ordinal: 9 },
            },
        },
        Packet::Completion {
            seq: 10,
            outcome: Outcome::RunFailed {
                level: 3,
                failure: RemoteRunFailure::ReplyTooLarge { bytes: 5000, limit: 1024 },
            },
        },
        Packet::Shutdown,
        Packet::ShutdownDone { errors: vec!["e".into()] },
        Packet::Ping { nonce: 1 },
        Packet::Pong { nonce: 1, session: 7 },
        Packet::Prepare { seq: 7, ordinal: 2, name: "late".into() },
        Packet::Prepared { seq: 7, refusal: None },
        Packet::Prepared { seq: 7, refusal: Some("no".into()) },
        Packet::Commit { ordinal: 2 },
        Packet::Abort { ordinal: 2 },
    ] {
        round_trip(p);
    }
    // Every kind of a run failure keeps its code.
    for kind in [
        RemoteRunKind::TaskFailed,
        RemoteRunKind::EndpointFailed,
        RemoteRunKind::DeviceFault,
        RemoteRunKind::Timeout,
        RemoteRunKind::Capacity,
        RemoteRunKind::SubmissionFailed,
        RemoteRunKind::Aborted,
        RemoteRunKind::CleanupFailed,
        RemoteRunKind::Internal,
        RemoteRunKind::Refused,
    ] {
        let failure = RemoteRunFailure::Run { kind, message: "m".into() };
        round_trip(Packet::Completion {
            seq: 1,
            outcome: Outcome::RunFailed { level: 3, failure },
        });
    }
}

#[test]
fn a_cancelled_task_crosses_with_each_cancel_reason() {
    let run = RunId::from_raw(7).unwrap();
    let id = CallableId::new([3; 32], CallableKind::Host, CallableNamespace::LocalHost);
    // The wire's table lists every reason there is, so none crosses as another mechanism.
    for &reason in CancelReason::ALL {
        assert!(CANCEL_REASONS.contains(&reason), "{reason} has no wire code");
    }
    for reason in CANCEL_REASONS {
        let mechanism = FailureMechanism::Cancelled { reason };
        let failure = TaskFailure::new(TaskId::new(run, 1), id, mechanism, "cancelled");
        round_trip(Packet::Completion { seq: 1, outcome: Outcome::TaskFailed { failure } });
    }
}

#[test]
fn corrupt_frames_are_errors_not_panics() {
    let good = Packet::Task { seq: 1, graph: 0, config: CallConfig::default(), args: wire_args() }
        .encode();
    for cut in 0..good.len() {
        assert!(Packet::decode(&good[..cut]).is_err(), "prefix of {cut} bytes decoded");
    }
    let mut other_version = good.clone();
    other_version[0] = 99;
    assert!(Packet::decode(&other_version).is_err());
    let mut trailing = good;
    trailing.push(0);
    assert!(Packet::decode(&trailing).is_err());
}

#[test]
fn error_text_is_bounded() {
    let run = RunId::from_raw(1).unwrap();
    let id = CallableId::new([0; 32], CallableKind::Host, CallableNamespace::LocalHost);
    let f = TaskFailure::new(
        TaskId::new(run, 1),
        id,
        FailureMechanism::TaskFailed,
        "x".repeat(MAX_ERROR_BYTES * 2),
    );
    let bytes = Packet::Completion { seq: 1, outcome: Outcome::TaskFailed { failure: f } }.encode();
    assert!(bytes.len() < MAX_ERROR_BYTES + 256, "{} bytes", bytes.len());
}

/// A frame of kind `kind` whose body `body` writes.
fn frame(kind: FrameKind, body: impl FnOnce(&mut Writer)) -> Vec<u8> {
    let mut w = Writer(Vec::new());
    w.u16(VERSION);
    w.u8(kind as u8);
    body(&mut w);
    w.0
}

#[test]
fn a_refused_frame_names_the_offset_and_what_was_found_there() {
    let hello = Packet::Hello { session: 5 }.encode();
    assert_eq!(
        Packet::decode(&hello[..7]),
        Err(DecodeError::Truncated { at: 3, wanted: 8, len: 7 })
    );
    let mut other = hello.clone();
    other[..2].copy_from_slice(&99u16.to_le_bytes());
    assert_eq!(Packet::decode(&other), Err(DecodeError::Version { found: 99, expected: VERSION }));
    let mut unknown = hello.clone();
    unknown[2] = 99;
    assert_eq!(
        Packet::decode(&unknown),
        Err(DecodeError::Code { field: WireField::FrameKind, code: 99, at: 2 })
    );
    let mut trailing = hello;
    trailing.extend_from_slice(&[0, 0]);
    let refused = Packet::decode(&trailing);
    assert_eq!(refused, Err(DecodeError::Trailing { at: 11, len: 13 }));
    assert_eq!(
        refused.unwrap_err().to_string(),
        "malformed frame: 2 trailing bytes after offset 11"
    );
    let count = frame(FrameKind::ShutdownDone, |w| w.u32(1000));
    assert_eq!(
        Packet::decode(&count),
        Err(DecodeError::Count { at: 3, count: 1000, needed: 4000, left: 0 })
    );
    let flag = frame(FrameKind::Prepared, |w| {
        w.u64(1);
        w.u8(2);
    });
    assert_eq!(
        Packet::decode(&flag),
        Err(DecodeError::Code { field: WireField::Flag, code: 2, at: 11 })
    );
    let text = frame(FrameKind::Prepare, |w| {
        w.u64(1);
        w.u32(0);
        w.blob(&[b'o', b'k', 0xff]);
    });
    assert_eq!(Packet::decode(&text), Err(DecodeError::Text { at: 19, valid_up_to: 2 }));
    let outcome = frame(FrameKind::Completion, |w| {
        w.u64(1);
        w.u8(7);
    });
    assert_eq!(
        Packet::decode(&outcome),
        Err(DecodeError::Code { field: WireField::Outcome, code: 7, at: 11 })
    );
    let empty_chain = frame(FrameKind::Completion, |w| {
        w.u64(1);
        w.u8(1);
        w.u32(0);
    });
    assert_eq!(Packet::decode(&empty_chain), Err(DecodeError::EmptyChain { at: 12 }));
    // A failure level whose run id is 0, which no run has.
    let run_zero = frame(FrameKind::Completion, |w| {
        w.u64(1);
        w.u8(1);
        w.u32(1);
        let id = CallableId::new([3; 32], CallableKind::Host, CallableNamespace::LocalHost);
        let run = RunId::from_raw(7).unwrap();
        let level = TaskFailure::new(TaskId::new(run, 1), id, FailureMechanism::Panicked, "");
        let mut budget = MAX_ERROR_BYTES;
        w.failure(&level, &mut budget);
        w.0[16..24].copy_from_slice(&0u64.to_le_bytes());
    });
    assert_eq!(Packet::decode(&run_zero), Err(DecodeError::RunIdZero { at: 16 }));
    // A call config of swimlane level 9, which CallConfig refuses.
    let config = frame(FrameKind::Task, |w| {
        w.u64(1);
        w.u32(0);
        let at = w.0.len();
        w.config(&CallConfig::default());
        w.0[at + 8..at + 12].copy_from_slice(&9u32.to_le_bytes());
        w.args(&WireArgs::default());
    });
    assert_eq!(
        Packet::decode(&config),
        Err(DecodeError::Config(Box::new(simpler_types::TypesError::InvalidSwimlaneLevel(9))))
    );
    // The tag of the first tensor of a task's arguments.
    let tag = frame(FrameKind::Task, |w| {
        w.u64(1);
        w.u32(0);
        w.config(&CallConfig::default());
        let at = w.0.len() + 4 + WIRE_TENSOR_MIN - 2;
        w.args(&wire_args());
        w.0[at] = 9;
    });
    let Err(DecodeError::Code { field: WireField::TensorTag, code: 9, at }) = Packet::decode(&tag)
    else {
        panic!("a tensor tag of 9 gave {:?}", Packet::decode(&tag));
    };
    assert_eq!(tag[at], 9);
}

#[test]
fn a_task_of_more_buffers_than_its_tensors_can_name_is_refused_before_they_are_read() {
    let task = |buffers: Vec<WireBuffer>| {
        frame(FrameKind::Task, |w| {
            w.u64(1);
            w.u32(0);
            w.config(&CallConfig::default());
            w.args(&WireArgs { tensors: Vec::new(), scalars: Vec::new(), buffers });
        })
    };
    // Tiny buffers sent without their bytes, or with them: rank 0 sends neither this many.
    let without = WireBuffer { len: 1, bytes: None };
    let with = WireBuffer { len: 1, bytes: Some(vec![7]) };
    for buffer in [without, with] {
        let at_cap = task(vec![buffer.clone(); MAX_WIRE_BUFFERS]);
        assert!(Packet::decode(&at_cap).is_ok(), "{MAX_WIRE_BUFFERS} buffers are refused");
        let over = task(vec![buffer; MAX_WIRE_BUFFERS + 1]);
        let refused = Packet::decode(&over).map(|_| "a Task frame");
        let (count, cap) = (MAX_WIRE_BUFFERS as u32 + 1, MAX_WIRE_BUFFERS as u32);
        let Err(e @ DecodeError::TooManyBuffers { at, count: c, cap: k }) = refused else {
            panic!("{count} buffers gave {refused:?}");
        };
        assert_eq!((c, k), (count, cap));
        assert_eq!(over[at..at + 4], count.to_le_bytes(), "the count is at {at}");
        let text = e.to_string();
        assert!(text.contains(&format!("{count} buffers")), "{text}");
        assert!(text.contains(&format!("the {cap} its tensors")), "{text}");
    }
}

#[test]
fn a_completion_of_more_spans_than_a_tasks_tensors_can_name_is_refused_before_they_are_read() {
    let completion = |n: usize| {
        let span = WrittenSpan { buffer: 0, offset: 0, bytes: Vec::new() };
        Packet::Completion { seq: 1, outcome: Outcome::Ok { written: vec![span; n] } }.encode()
    };
    let cap = TaskArgs::MAX_TENSORS;
    assert!(Packet::decode(&completion(cap)).is_ok(), "{cap} spans are refused");
    let over = completion(cap + 1);
    let refused = Packet::decode(&over).map(|_| "a Completion frame");
    let Err(e @ DecodeError::TooManySpans { at, count, cap: k }) = refused else {
        panic!("{} empty spans gave {refused:?}", cap + 1);
    };
    assert_eq!((count as usize, k as usize), (cap + 1, cap));
    assert_eq!(over[at..at + 4], count.to_le_bytes(), "the count is at {at}");
    assert!(e.to_string().contains(&format!("{count} written spans")), "{e}");
}

#[test]
fn a_trailing_error_built_with_its_offset_past_the_frame_still_displays() {
    // The fields are public: a value no decoder returns must still render, not overflow.
    let e = DecodeError::Trailing { at: 21, len: 19 };
    assert_eq!(e.to_string(), "malformed frame: 0 trailing bytes after offset 21");
}

/// One of each reason a task's arguments do not unpack, with each descriptor rule that crosses.
fn arguments_problems() -> Vec<ArgumentsProblem> {
    use simpler_types::TypesError;
    let rules = [
        TypesError::InvalidRank { ndims: 6 },
        TypesError::UnknownDataType(200),
        TypesError::InvalidFlag { offset: 41, value: 2 },
        TypesError::ZeroStride { dim: 1 },
        TypesError::UnusedDimNonZero { field: "strides", dim: 4, value: 9 },
        TypesError::SizeOverflow { what: "buffer end address" },
        TypesError::StaleLayoutCache { field: "extent_elems", stored: 3, computed: 4 },
        TypesError::ViewOutOfBounds { needed_bytes: (1 << 70) + 5, buffer_bytes: 64 },
    ];
    let mut all = vec![
        ArgumentsProblem::NoBuffer { tensor: 1 },
        ArgumentsProblem::NoSuchBuffer { tensor: 2, buffer: 7, buffers: 3 },
        ArgumentsProblem::OutsideBuffer { tensor: 3, buffer: 1, offset: 8, size: 64, len: 48 },
        ArgumentsProblem::NoSpan { tensor: 4, buffer: 0, len: 16 },
        ArgumentsProblem::OutputsTooLarge { bytes: 1 << 40, limit: 1 << 31 },
        ArgumentsProblem::BufferBytes { buffer: 2, carried: 10, len: 12 },
        ArgumentsProblem::EmptyBuffer { buffer: 5 },
        ArgumentsProblem::Allocation { buffer: 6, len: 1 << 62 },
        ArgumentsProblem::InvalidTensor { tensor: 9, error: None },
        ArgumentsProblem::TooManyTensors { count: 40, cap: 16 },
        ArgumentsProblem::TooManyScalars { count: 300, cap: 128 },
        ArgumentsProblem::NotWrittenBack { buffer: 3, len: 1 << 30, cap: 16 << 20 },
    ];
    for (tensor, rule) in rules.into_iter().enumerate() {
        assert!(arguments::carries(&rule), "{rule:?} has no wire code");
        let error = Some(Box::new(rule));
        all.push(ArgumentsProblem::InvalidTensor { tensor: tensor as u32, error });
    }
    all
}

#[test]
fn why_arguments_did_not_unpack_crosses_typed_with_its_numbers() {
    for problem in arguments_problems() {
        round_trip(Packet::Completion {
            seq: 9,
            outcome: Outcome::RunFailed { level: 3, failure: RemoteRunFailure::Arguments(problem) },
        });
    }
    // An unknown reason, and an unknown name inside a rule, are refused where they stand.
    let failed = |problem: &ArgumentsProblem| {
        Packet::Completion {
            seq: 9,
            outcome: Outcome::RunFailed {
                level: 3,
                failure: RemoteRunFailure::Arguments(problem.clone()),
            },
        }
        .encode()
    };
    // Version, kind, seq, outcome, level and the run failure's code come first.
    let at = 2 + 1 + 8 + 1 + 1 + 1;
    let mut unknown = failed(&ArgumentsProblem::EmptyBuffer { buffer: 5 });
    unknown[at] = 12;
    assert_eq!(
        Packet::decode(&unknown),
        Err(DecodeError::Code { field: WireField::ArgumentsProblem, code: 12, at })
    );
    let overflow = simpler_types::TypesError::SizeOverflow { what: "byte size" };
    let mut name =
        failed(&ArgumentsProblem::InvalidTensor { tensor: 0, error: Some(Box::new(overflow)) });
    // Past the reason's code: the tensor, the flag and the rule's code.
    let name_at = at + 1 + 4 + 1 + 1;
    name[name_at] = 5;
    assert_eq!(
        Packet::decode(&name),
        Err(DecodeError::Code { field: WireField::TensorQuantity, code: 5, at: name_at })
    );
}

/// One of each cause a serving rank leaves its session with, with each protocol violation and
/// each decode error that crosses, and a `DecodeError::Code` of every wire field.
fn left_causes() -> Vec<LeftCause> {
    let span = |buffer, offset, len| WrittenAt { buffer, offset, len };
    let mut violations = vec![
        ProtocolViolation::UnexpectedFrame {
            got: FrameKind::Commit,
            expected: FrameKind::ANSWERS_TO_MANIFEST,
        },
        ProtocolViolation::UnexpectedFrame {
            got: FrameKind::Hello,
            expected: FrameKind::SESSION_REQUESTS,
        },
        ProtocolViolation::WrittenSpans(Box::new(SpanMismatch {
            index: 2,
            got: Some(span(1, 8, 16)),
            expected: None,
            carried: 3,
            named: 2,
        })),
        ProtocolViolation::WrittenSpans(Box::new(SpanMismatch {
            index: 0,
            got: None,
            expected: Some(span(0, 0, 4)),
            carried: 0,
            named: 1,
        })),
        ProtocolViolation::SpanOutsideBuffer { span: span(3, 1 << 40, 17), size: 64 },
    ];
    let errors = [
        DecodeError::Version { found: 6, expected: VERSION },
        DecodeError::Truncated { at: 11, wanted: 8, len: 15 },
        DecodeError::Trailing { at: 19, len: 21 },
        DecodeError::Count { at: 3, count: 1000, needed: 4000, left: 12 },
        DecodeError::Text { at: 19, valid_up_to: 2 },
        DecodeError::RunIdZero { at: 16 },
        DecodeError::ChainTooDeep { levels: 33, max: 32 },
        DecodeError::EmptyChain { at: 12 },
        DecodeError::TooManyBuffers { at: 140, count: 17, cap: 16 },
        DecodeError::TooManySpans { at: 9, count: 129, cap: 128 },
    ];
    violations.extend(errors.into_iter().map(ProtocolViolation::Malformed));
    violations.extend(WireField::ALL.into_iter().enumerate().map(|(at, field)| {
        ProtocolViolation::Malformed(DecodeError::Code { field, code: 200, at })
    }));
    let lost = LeftCause::Mpi { op: "MPI_Isend (drill)", code: -1 };
    let mut all = vec![
        LeftCause::Unresponsive { budget: Duration::from_millis(1500) },
        LeftCause::Mpi { op: "MPI_Test", code: 17 },
        LeftCause::FrameTooLarge { bytes: 1 << 32, limit: (1 << 31) - 1 },
        LeftCause::SendUnconfirmed {
            frame: FrameKind::ShutdownDone,
            waited: Duration::from_secs(10),
        },
        LeftCause::Finalized,
        LeftCause::ShutdownDoneLost { lost: Box::new(lost.clone()), close: None },
        LeftCause::ShutdownDoneLost {
            lost: Box::new(LeftCause::SendUnconfirmed {
                frame: FrameKind::ShutdownDone,
                waited: Duration::from_secs(60),
            }),
            close: Some("the device did not release".into()),
        },
        LeftCause::Other { text: "a cause added later".into() },
    ];
    all.extend(violations.into_iter().map(LeftCause::Protocol));
    all
}

#[test]
fn why_a_serving_rank_left_crosses_typed_with_its_numbers() {
    for cause in left_causes() {
        round_trip(Packet::Left { session: 4, cause });
    }
}

/// Decodes `bytes`, failing the test with what `what` names if the decoder panics.
fn decode_or_fail(bytes: &[u8], what: impl Fn() -> String) -> Result<Packet, DecodeError> {
    std::panic::catch_unwind(|| Packet::decode(bytes))
        .unwrap_or_else(|_| panic!("decoding {} panicked", what()))
}

#[test]
fn every_typed_error_frame_cut_short_or_damaged_is_an_error_not_a_panic() {
    let failed = |problem| Packet::Completion {
        seq: 9,
        outcome: Outcome::RunFailed { level: 3, failure: RemoteRunFailure::Arguments(problem) },
    };
    let left = |cause| Packet::Left { session: 4, cause };
    let frames =
        arguments_problems().into_iter().map(failed).chain(left_causes().into_iter().map(left));
    for p in frames {
        let good = p.encode();
        for cut in 0..good.len() {
            let decoded = decode_or_fail(&good[..cut], || format!("{cut} bytes of {p:?}"));
            assert!(decoded.is_err(), "{cut} bytes of {p:?} decoded as {decoded:?}");
        }
        // A damaged byte may still make a valid frame: only a panic is wrong.
        for at in 0..good.len() {
            for byte in [0x00, 0xff, good[at] ^ 0x01, good[at] ^ 0x80] {
                let mut damaged = good.clone();
                damaged[at] = byte;
                let _ = decode_or_fail(&damaged, || format!("{p:?} with {byte:#04x} at {at}"));
            }
        }
    }
}

#[test]
fn a_left_cause_without_a_code_crosses_as_its_text() {
    let decoded =
        |cause: LeftCause| match Packet::decode(&Packet::Left { session: 4, cause }.encode()) {
            Ok(Packet::Left { session: 4, cause }) => cause,
            other => panic!("a Left frame decoded as {other:?}"),
        };
    let other = |c: &LeftCause| LeftCause::Other { text: c.to_string() };
    let unlisted = LeftCause::Mpi { op: "MPI_Barrier", code: 3 };
    assert_eq!(decoded(unlisted.clone()), other(&unlisted));
    let config = simpler_types::TypesError::InvalidSwimlaneLevel(9);
    let config =
        LeftCause::Protocol(ProtocolViolation::Malformed(DecodeError::Config(Box::new(config))));
    assert_eq!(decoded(config.clone()), other(&config));
    let unexpected = LeftCause::Protocol(ProtocolViolation::UnexpectedFrame {
        got: FrameKind::Task,
        expected: &[FrameKind::Hello],
    });
    assert_eq!(decoded(unexpected.clone()), other(&unexpected));
    // A lost `ShutdownDone` is one level deep: one inside another crosses as its text.
    let inner = LeftCause::ShutdownDoneLost { lost: Box::new(LeftCause::Finalized), close: None };
    let outer =
        LeftCause::ShutdownDoneLost { lost: Box::new(inner.clone()), close: Some("close".into()) };
    assert_eq!(
        decoded(outer),
        LeftCause::ShutdownDoneLost { lost: Box::new(other(&inner)), close: Some("close".into()) }
    );
}

#[test]
fn an_unknown_code_in_a_left_cause_is_refused_where_it_stands() {
    let left = |body: &[u8]| {
        Packet::decode(&frame(FrameKind::Left, |w| {
            w.u64(4);
            w.bytes_fixed(body);
        }))
    };
    let code = |field, code, at| Err(DecodeError::Code { field, code, at });
    // Version, kind and session come first: the cause's code is at 11.
    assert_eq!(left(&[8]), code(WireField::LeftCause, 8, 11));
    assert_eq!(left(&[6, 6]), code(WireField::LeftCause, 6, 12), "a lost ShutdownDone in one");
    assert_eq!(left(&[1, 7]), code(WireField::MpiFunction, 7, 12));
    assert_eq!(left(&[3, 0]), code(WireField::FrameKind, 0, 12));
    assert_eq!(left(&[5, 4]), code(WireField::ProtocolViolation, 4, 12));
    assert_eq!(left(&[5, 1, 4, 2]), code(WireField::ExpectedFrames, 2, 14));
    assert_eq!(left(&[5, 0, 11]), code(WireField::DecodeError, 11, 13));
    assert_eq!(left(&[5, 0, 4, 20]), code(WireField::WireField, 20, 14));
    assert_eq!(left(&[5, 2, 0, 0, 0, 0, 0, 0, 0, 0, 2]), code(WireField::Flag, 2, 21));
}

#[test]
fn a_shutdown_done_claiming_many_close_errors_keeps_a_few_and_counts_the_rest() {
    let errors: Vec<String> = (0..super::MAX_SHUTDOWN_ERRORS + 24).map(|i| i.to_string()).collect();
    let bytes = Packet::ShutdownDone { errors: errors.clone() }.encode();
    let Ok(Packet::ShutdownDone { errors: kept }) = Packet::decode(&bytes) else {
        panic!("not a ShutdownDone")
    };
    assert_eq!(kept.len(), super::MAX_SHUTDOWN_ERRORS + 1);
    assert_eq!(kept[..super::MAX_SHUTDOWN_ERRORS], errors[..super::MAX_SHUTDOWN_ERRORS]);
    assert_eq!(kept[super::MAX_SHUTDOWN_ERRORS], "(24 more close errors not kept)");
}

#[test]
fn the_longest_health_frame_fits_the_health_receive_buffer() {
    let pong = Packet::Pong { nonce: u64::MAX, session: u64::MAX }.encode();
    assert_eq!(pong.len(), super::super::receives::HEALTH_FRAME_BYTES);
    assert!(Packet::Ping { nonce: u64::MAX }.encode().len() <= pong.len());
}
