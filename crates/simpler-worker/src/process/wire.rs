//! Frames of the chip-process protocol: operations, replies and their little-endian encoding
//! (`docs/process-mode.md`, "Frames").
//!
//! One representation per hop: arguments travel as the `TaskArgs` blob followed by their tags
//! (the blob carries none), a run's configuration as its builder settings, failures as a
//! failure frame that keeps outcome, mechanism, device code and text.

use std::time::Duration;

use simpler_device_a2a3::{CallableProblem, DeviceError};
use simpler_types::{
    CallConfig, DeviceCode, EndpointOutcome, FailureMechanism, RingOverride, RingSel, TaskArgs,
    TensorArgType, TimeoutBudget,
};

/// Operations of a request frame.
pub(crate) mod op {
    /// Start the chip: platform, runtime, device, chip index, prewarm config.
    pub(crate) const INIT: u32 = 1;
    /// Prepare content: digest, content bytes.
    pub(crate) const REGISTER: u32 = 2;
    /// Drop one reference to content: digest.
    pub(crate) const RELEASE: u32 = 3;
    /// References held on content and whether it is unusable: digest.
    pub(crate) const QUERY: u32 = 4;
    /// A chip run: digest, origin task, config, args blob.
    pub(crate) const RUN: u32 = 5;
    /// Device allocation: bytes.
    pub(crate) const MALLOC: u32 = 6;
    /// Device free: address.
    pub(crate) const FREE: u32 = 7;
    /// Host to device copy: address, bytes.
    pub(crate) const COPY_TO: u32 = 8;
    /// Device to host copy: address, length.
    pub(crate) const COPY_FROM: u32 = 9;
    /// The memory ledger.
    pub(crate) const LEDGER: u32 = 10;
    /// Arm a crash fault for the next run (simulator builds only).
    pub(crate) const ARM_FAULT: u32 = 11;
}

/// Status of a reply frame.
pub(crate) mod status {
    /// Done; the payload holds the result.
    pub(crate) const OK: u32 = 0;
    /// Failed; the payload holds a failure frame.
    pub(crate) const FAILED: u32 = 1;
}

/// A malformed frame.
#[derive(Debug, thiserror::Error)]
#[error("malformed frame: {0}")]
pub(crate) struct Malformed(pub(crate) &'static str);

/// Appends little-endian fields.
#[derive(Default)]
pub(crate) struct Writer(pub(crate) Vec<u8>);

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }
    pub(crate) fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
}

/// Reads little-endian fields; every read checks the length.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.0.len() < n {
            return Err(Malformed("truncated"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().map_err(|_| Malformed("u32"))?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, Malformed> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().map_err(|_| Malformed("u64"))?))
    }
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], Malformed> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub(crate) fn str(&mut self) -> Result<&'a str, Malformed> {
        std::str::from_utf8(self.bytes()?).map_err(|_| Malformed("text is not UTF-8"))
    }
    pub(crate) fn digest(&mut self) -> Result<[u8; 32], Malformed> {
        self.take(32)?.try_into().map_err(|_| Malformed("digest"))
    }
}

/// A failure as it crosses the mailbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FailureFrame {
    pub(crate) outcome: EndpointOutcome,
    pub(crate) mechanism: FailureMechanism,
    pub(crate) code: Option<DeviceCode>,
    pub(crate) message: String,
    /// Set by a refused registration: which device error it was, `message` holding its text
    /// field, so the parent returns the error a chip lane in its own process would.
    pub(crate) refusal: Option<Refusal>,
}

/// The device errors a registration in a chip process can end with, by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `DeviceError::TooManyCallables`.
    TooManyCallables { capacity: u32 },
    /// `DeviceError::InvalidCallable` (message: the problem's text; it arrives as
    /// `CallableProblem::Relayed`).
    InvalidCallable,
    /// `DeviceError::Busy` of `register_callable` (message: the state).
    Busy,
    /// `DeviceError::Finalized` of `register_callable`.
    Finalized,
}

impl Refusal {
    /// The kind of `e` and its text field; `None` for errors a registration does not end
    /// with (they cross as text, like any failure).
    pub(crate) fn of(e: &DeviceError) -> Option<(Refusal, String)> {
        Some(match e {
            DeviceError::TooManyCallables { capacity } => {
                (Refusal::TooManyCallables { capacity: *capacity as u32 }, String::new())
            }
            DeviceError::InvalidCallable { problem, .. } => {
                (Refusal::InvalidCallable, problem.to_string())
            }
            DeviceError::Busy { state, .. } => (Refusal::Busy, state.clone()),
            DeviceError::Finalized { .. } => (Refusal::Finalized, String::new()),
            _ => return None,
        })
    }

    /// The device error of this kind with text `message`.
    pub(crate) fn device_error(self, message: String) -> DeviceError {
        const CALL: &str = "register_callable";
        match self {
            Refusal::TooManyCallables { capacity } => {
                DeviceError::TooManyCallables { capacity: capacity as usize }
            }
            Refusal::InvalidCallable => DeviceError::InvalidCallable {
                run_id: None,
                problem: CallableProblem::Relayed { text: message },
            },
            Refusal::Busy => DeviceError::Busy { call: CALL, state: message },
            Refusal::Finalized => DeviceError::Finalized { call: CALL },
        }
    }
}

impl FailureFrame {
    /// Encodes the frame in at most `limit` bytes (after what `w` holds), cutting its message
    /// (at a character boundary, marked) if it would not fit: the outcome, mechanism and device
    /// code always cross, so a failure that makes the chip unusable stays one.
    pub(crate) fn encode_within(&self, w: &mut Writer, limit: usize) {
        const CUT: &str = "… (cut to fit the mailbox)";
        let start = w.0.len();
        self.encode(w);
        let len = w.0.len() - start;
        if len <= limit {
            return;
        }
        w.0.truncate(start);
        let keep = self.message.len().saturating_sub(len - limit + CUT.len());
        let mut end = keep;
        while !self.message.is_char_boundary(end) {
            end -= 1;
        }
        let message = format!("{}{CUT}", &self.message[..end]);
        FailureFrame { message, ..self.clone() }.encode(w);
    }

    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u8(match self.outcome {
            EndpointOutcome::TaskFailure => 1,
            _ => 2,
        });
        match &self.mechanism {
            FailureMechanism::TaskFailed => w.u8(0),
            FailureMechanism::Panicked => w.u8(1),
            FailureMechanism::DeviceFault => w.u8(3),
            FailureMechanism::Timeout { budget, limit } => {
                w.u8(4).u8(budget_tag(budget)).u64(limit.as_nanos() as u64)
            }
            FailureMechanism::CapacityExhausted { what } => w.u8(5).str(what),
            _ => w.u8(2),
        };
        encode_code(w, self.code);
        w.str(&self.message);
        match self.refusal {
            None => w.u8(0),
            Some(Refusal::TooManyCallables { capacity }) => w.u8(1).u32(capacity),
            Some(Refusal::InvalidCallable) => w.u8(2),
            Some(Refusal::Busy) => w.u8(3),
            Some(Refusal::Finalized) => w.u8(4),
        };
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<FailureFrame, Malformed> {
        // Every tag is one the encoder writes: anything else is a corrupt frame, not a default.
        let outcome = match r.u8()? {
            1 => EndpointOutcome::TaskFailure,
            2 => EndpointOutcome::EndpointFailure,
            _ => return Err(Malformed("outcome")),
        };
        let mechanism = match r.u8()? {
            0 => FailureMechanism::TaskFailed,
            1 => FailureMechanism::Panicked,
            2 => FailureMechanism::EndpointFailed,
            3 => FailureMechanism::DeviceFault,
            4 => {
                let budget = budget_of(r.u8()?)?;
                FailureMechanism::Timeout { budget, limit: Duration::from_nanos(r.u64()?) }
            }
            5 => FailureMechanism::CapacityExhausted { what: r.str()?.to_owned() },
            _ => return Err(Malformed("mechanism")),
        };
        let code = decode_code(r)?;
        let message = r.str()?.to_owned();
        let refusal = match r.u8()? {
            0 => None,
            1 => Some(Refusal::TooManyCallables { capacity: r.u32()? }),
            2 => Some(Refusal::InvalidCallable),
            3 => Some(Refusal::Busy),
            4 => Some(Refusal::Finalized),
            _ => return Err(Malformed("refusal kind")),
        };
        Ok(FailureFrame { outcome, mechanism, code, message, refusal })
    }
}

fn budget_tag(b: &TimeoutBudget) -> u8 {
    match b {
        TimeoutBudget::OpExecute => 0,
        TimeoutBudget::StreamSync => 1,
        TimeoutBudget::DeviceScheduler => 2,
        TimeoutBudget::Handshake => 3,
        TimeoutBudget::RingAlloc => 4,
        TimeoutBudget::Admission => 5,
        _ => 6,
    }
}

fn budget_of(tag: u8) -> Result<TimeoutBudget, Malformed> {
    Ok(match tag {
        0 => TimeoutBudget::OpExecute,
        1 => TimeoutBudget::StreamSync,
        2 => TimeoutBudget::DeviceScheduler,
        3 => TimeoutBudget::Handshake,
        4 => TimeoutBudget::RingAlloc,
        5 => TimeoutBudget::Admission,
        6 => TimeoutBudget::Other("a budget of the chip process"),
        _ => return Err(Malformed("timeout budget")),
    })
}

/// Writes a device's code, when it reported one.
pub(crate) fn encode_code(w: &mut Writer, code: Option<DeviceCode>) {
    match code {
        Some(c) => w.u8(1).u32(c.code as u32).str(c.name),
        None => w.u8(0),
    };
}

/// Reads what [`encode_code`] wrote.
pub(crate) fn decode_code(r: &mut Reader<'_>) -> Result<Option<DeviceCode>, Malformed> {
    match r.u8()? {
        0 => Ok(None),
        1 => {
            let code = r.u32()? as i32;
            Ok(Some(DeviceCode::new(code, crate::code_names::intern(r.str()?))))
        }
        _ => Err(Malformed("device code tag")),
    }
}

/// Encodes a run's arguments: the `TaskArgs` blob, then one tag code per tensor.
pub(crate) fn encode_args(args: &TaskArgs, w: &mut Writer) {
    w.bytes(&args.encode());
    w.u32(args.tags().len() as u32);
    for tag in args.tags() {
        w.u8(tag.as_i32() as u8);
    }
}

/// The arguments `blob` (decoded from what [`encode_args`] wrote) with the tags that follow it,
/// which the chip's orchestration reads as its caller passed them.
pub(crate) fn with_tags(blob: &TaskArgs, r: &mut Reader<'_>) -> Result<TaskArgs, Malformed> {
    if r.u32()? as usize != blob.tensors().len() {
        return Err(Malformed("tag count differs from the tensor count"));
    }
    let mut args = TaskArgs::new();
    for t in blob.tensors() {
        let tag = TensorArgType::from_i32(i32::from(r.u8()?)).ok_or(Malformed("tensor tag"))?;
        args.add_tensor(*t, tag).map_err(|_| Malformed("tensor count"))?;
    }
    for &s in blob.scalars() {
        args.add_scalar(s).map_err(|_| Malformed("scalar count"))?;
    }
    Ok(args)
}

/// Encodes every setting of `c` the builder can set again.
pub(crate) fn encode_config(c: &CallConfig, w: &mut Writer) {
    w.u32(c.block_dim()).u32(c.aicpu_thread_num());
    w.u32(c.swimlane() as u32).u32(c.dump_args() as u32);
    w.u32(c.pmu().map_or(0, |p| p as u32));
    w.u8(u8::from(c.dep_gen())).u8(u8::from(c.scope_stats()));
    for o in c.runtime_env() {
        w.u64(o.task_window.map_or(0, u64::from));
        w.u64(o.heap_bytes.unwrap_or(0));
        w.u64(o.dep_pool.map_or(0, u64::from));
    }
    match c.output_prefix() {
        Some(p) => w.u8(1).str(&p.to_string_lossy()),
        None => w.u8(0),
    };
}

/// Rebuilds a configuration written by [`encode_config`].
pub(crate) fn decode_config(r: &mut Reader<'_>) -> Result<CallConfig, Malformed> {
    let mut b = CallConfig::builder().block_dim(r.u32()?).aicpu_thread_num(r.u32()?);
    b = b.swimlane_level(r.u32()?).dump_args_level(r.u32()?);
    let pmu = r.u32()?;
    if pmu != 0 {
        b = b.pmu_event(pmu);
    }
    b = b.dep_gen(r.u8()? != 0).scope_stats(r.u8()? != 0);
    for ring in 0..simpler_types::HEAP_RING_COUNT as u32 {
        let nonzero = |v: u64| (v != 0).then_some(v);
        let task_window = nonzero(r.u64()?).map(|v| v as u32);
        let heap_bytes = nonzero(r.u64()?);
        let dep_pool = nonzero(r.u64()?).map(|v| v as u32);
        let o = RingOverride { task_window, heap_bytes, dep_pool };
        if !o.is_unset() {
            b = b.ring_override(RingSel::Ring(ring), o);
        }
    }
    if r.u8()? == 1 {
        b = b.output_prefix(r.str()?);
    }
    b.build().map_err(|_| Malformed("a configuration the builder refuses"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_arguments_cross_with_their_tags() {
        use simpler_types::{DataType, Tensor};
        let t = |addr| Tensor::external(addr, &[4], DataType::Float32).expect("valid tensor");
        let mut args = TaskArgs::new();
        args.add_input(t(0x1000)).expect("arg");
        args.add_output(t(0x2000)).expect("arg");
        args.add_inout(t(0x3000)).expect("arg");
        args.add_no_dep(t(0x4000)).expect("arg");
        args.add_output_existing(t(0x5000)).expect("arg");
        args.add_scalar(7).expect("arg");
        let mut w = Writer::default();
        encode_args(&args, &mut w);
        let mut r = Reader(&w.0);
        let blob = TaskArgs::decode(r.bytes().expect("blob")).expect("valid blob");
        let got = with_tags(&blob, &mut r).expect("tags");
        assert_eq!(got.tags(), args.tags());
        assert_eq!(got.tensors(), args.tensors());
        assert_eq!(got.scalars(), args.scalars());
        assert!(r.0.is_empty(), "{} bytes left over", r.0.len());

        // A tag code no tag has, and a count that disagrees with the blob, are malformed.
        let at = w.0.len() - 1;
        w.0[at] = 9;
        assert!(with_tags(&blob, &mut Reader(&w.0[w.0.len() - 9..])).is_err());
        let mut short = Writer::default();
        short.u32(4);
        assert!(with_tags(&blob, &mut Reader(&short.0)).is_err());
    }

    #[test]
    fn a_failure_frame_too_long_for_the_mailbox_keeps_its_outcome_and_code() {
        // Multi-byte characters, so that the cut must find a character boundary.
        let f = FailureFrame {
            outcome: EndpointOutcome::EndpointFailure,
            mechanism: FailureMechanism::DeviceFault,
            code: Some(DeviceCode::new(507015, "ACL_ERROR_RT_AICORE_EXCEPTION")),
            message: "é".repeat(100_000),
            refusal: None,
        };
        let mut w = Writer::default();
        w.u8(9);
        f.encode_within(&mut w, 1000);
        assert!(w.0.len() <= 1001, "{} bytes", w.0.len());
        let mut r = Reader(&w.0[1..]);
        let back = FailureFrame::decode(&mut r).expect("decodes");
        assert_eq!((back.outcome, back.code), (f.outcome, f.code));
        assert_eq!(back.mechanism, f.mechanism);
        assert!(back.message.starts_with("éé") && back.message.ends_with("mailbox)"));
        // A frame that fits is written as it is.
        let mut fits = Writer::default();
        let short = FailureFrame { message: "short".into(), ..f.clone() };
        short.encode_within(&mut fits, 1000);
        assert_eq!(FailureFrame::decode(&mut Reader(&fits.0)).unwrap(), short);
    }

    #[test]
    fn a_failure_frame_round_trips() {
        let f = FailureFrame {
            outcome: EndpointOutcome::TaskFailure,
            mechanism: FailureMechanism::Timeout {
                budget: TimeoutBudget::StreamSync,
                limit: Duration::from_millis(5),
            },
            code: Some(DeviceCode::new(507015, "ACL_ERROR_RT_AICORE_EXCEPTION")),
            message: "r1: boom".into(),
            refusal: None,
        };
        let mut w = Writer::default();
        f.encode(&mut w);
        assert_eq!(FailureFrame::decode(&mut Reader(&w.0)).expect("decodes"), f);
        assert!(FailureFrame::decode(&mut Reader(&w.0[..3])).is_err());
        for refusal in [
            Refusal::TooManyCallables { capacity: 64 },
            Refusal::InvalidCallable,
            Refusal::Busy,
            Refusal::Finalized,
        ] {
            let f = FailureFrame { refusal: Some(refusal), ..f.clone() };
            let mut w = Writer::default();
            f.encode(&mut w);
            assert_eq!(FailureFrame::decode(&mut Reader(&w.0)).expect("decodes"), f);
        }
    }

    #[test]
    fn an_invalid_callable_refusal_arrives_as_its_problem_s_text() {
        let problem = CallableProblem::DuplicateFuncId { func_id: 3 };
        let e = DeviceError::InvalidCallable { run_id: None, problem: problem.clone() };
        let (refusal, text) = Refusal::of(&e).expect("a registration refusal");
        assert_eq!(refusal, Refusal::InvalidCallable);
        match refusal.device_error(text) {
            DeviceError::InvalidCallable {
                run_id: None,
                problem: CallableProblem::Relayed { text },
            } => {
                assert_eq!(text, problem.to_string())
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failure_frame_with_a_tag_the_encoder_never_writes_is_malformed() {
        let f = FailureFrame {
            outcome: EndpointOutcome::TaskFailure,
            mechanism: FailureMechanism::Timeout {
                budget: TimeoutBudget::StreamSync,
                limit: Duration::from_millis(5),
            },
            code: None,
            message: "m".into(),
            refusal: None,
        };
        let mut w = Writer::default();
        f.encode(&mut w);
        // Outcome, mechanism, budget, and the code tag after the 8-byte limit.
        for (at, what) in
            [(0, "outcome"), (1, "mechanism"), (2, "timeout budget"), (11, "device code tag")]
        {
            let mut bytes = w.0.clone();
            bytes[at] = 0xee;
            match FailureFrame::decode(&mut Reader(&bytes)) {
                Err(Malformed(m)) => assert_eq!(m, what),
                Ok(back) => panic!("tag {at} decoded as {back:?}"),
            }
        }
    }

    #[test]
    fn a_config_round_trips() {
        let c = CallConfig::builder()
            .block_dim(3)
            .aicpu_thread_num(2)
            .dep_gen(true)
            .output_prefix("/tmp/simpler-diagnostics")
            .heap_bytes(RingSel::Ring(1), 4096)
            .build()
            .expect("valid");
        let mut w = Writer::default();
        encode_config(&c, &mut w);
        assert_eq!(decode_config(&mut Reader(&w.0)).expect("decodes"), c);
    }
}
