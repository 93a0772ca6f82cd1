//! Host tensors of remote tasks (`docs/multi-host.md` §"Tensors across hosts").
//!
//! A task for a remote L3 child may name host memory in [`HostBuffer`]s of rank 0. Its frame
//! carries each distinct buffer once: its length, and its bytes unless every tensor of it only
//! overwrites all of it (`Output`, `OutputExisting`, contiguous over the whole buffer). Tensors name
//! (buffer of the frame, offset) instead of an address. The serving rank puts each buffer in a
//! fresh `HostBuffer` of its own, runs the task on those, and after a successful run sends back
//! the bytes each write-tagged tensor can touch (its bounding span, merged per buffer) and
//! nothing else: another task may be using the buffer's other bytes meanwhile. Rank 0 checks
//! that the spans it gets are exactly the ones it expects and writes into its buffers only the
//! bytes of the written views themselves: a strided view's span has gaps, which another task
//! that blindly writes interleaved elements may be writing (two blind writes are not ordered).
//!
//! Chip memory of rank 0 means nothing on another host, so a chip-memory tensor, like host
//! memory outside a `HostBuffer` and a `NoDep` tag, is refused when the task is submitted
//! ([`refuse_unshippable`]).

use simpler_types::{TaskArgs, TaskArgsView, TaskId, Tensor, TensorArgType, WorkerId};

use super::error::{
    ArgumentsProblem, ProtocolViolation, RemoteError, SpanMismatch, TensorProblem, TensorRefusal,
    WrittenAt,
};
use super::frames::{WireArgs, WireBuffer, WireTensor, WrittenSpan, carries_types_error};
use super::transport::MAX_FRAME_BYTES;
use crate::error::WorkerError;
use crate::host_buffer::{HostAddr, HostBuffer};
use crate::staging::{merged, push_unique, span_in, write_touched};

/// The most bytes a serving rank allocates, for one task, for the buffers sent without their
/// bytes that the task does not write back whole: enough for the empty views of ordinary
/// buffers, and no more, since their bytes matter to nobody.
pub(crate) const NOT_WRITTEN_BACK_CAP: u64 = 16 << 20;

/// The submit-time check of a task for remote child `child` (on `rank`): every tensor is null
/// or lies in a live [`HostBuffer`] at its base and is not tagged `NoDep`, and the buffers only
/// empty views name fit what a serving rank allocates for them ([`NOT_WRITTEN_BACK_CAP`]).
/// Returns the buffers, which the run keeps alive until the endpoint has shipped them.
pub(crate) fn refuse_unshippable(
    args: &TaskArgs,
    child: WorkerId,
    rank: i32,
) -> Result<Vec<HostBuffer>, WorkerError> {
    let out = shippable_buffers(args, child, rank)?;
    // Rank 0 sends a buffer without its bytes, and the serving rank allocates it in full,
    // when only empty views name it (the serving rank's own check, refused here already).
    let mut empty_only = 0u64;
    for buf in &out {
        let named = |t: &&Tensor| !t.is_null() && t.addr == buf.addr();
        if args.tensors().iter().filter(named).all(|t| t.numel() == 0) {
            empty_only = empty_only.saturating_add(buf.len());
            if empty_only > NOT_WRITTEN_BACK_CAP {
                let arg = args.tensors().iter().position(|t| t.addr == buf.addr()).unwrap_or(0);
                let problem = TensorProblem::EmptyViewsOnly {
                    addr: HostAddr(buf.addr()),
                    len: empty_only,
                    cap: NOT_WRITTEN_BACK_CAP,
                };
                return Err(WorkerError::RemoteTensor(TensorRefusal { arg, child, rank, problem }));
            }
        }
    }
    Ok(out)
}

/// The per-tensor part of [`refuse_unshippable`]: the distinct buffers, in order.
fn shippable_buffers(
    args: &TaskArgs,
    child: WorkerId,
    rank: i32,
) -> Result<Vec<HostBuffer>, WorkerError> {
    let mut out = Vec::new();
    for (arg, t) in args.tensors().iter().enumerate().filter(|(_, t)| !t.is_null()) {
        let refuse =
            |problem| WorkerError::RemoteTensor(TensorRefusal { arg, child, rank, problem });
        if t.is_child_memory() {
            return Err(refuse(TensorProblem::ChipMemory { addr: HostAddr(t.addr) }));
        }
        let Some(buf) = HostBuffer::covering(t.addr, t.size) else {
            return Err(refuse(TensorProblem::NotHostBuffer {
                addr: HostAddr(t.addr),
                len: t.size,
            }));
        };
        if t.addr != buf.addr() {
            return Err(WorkerError::HostTensorOffsetBase {
                arg,
                addr: HostAddr(t.addr),
                buffer: HostAddr(buf.addr()),
            });
        }
        if args.tags().get(arg) == Some(&TensorArgType::NoDep) {
            return Err(refuse(TensorProblem::NoDep));
        }
        push_unique(&mut out, buf);
    }
    Ok(out)
}

/// What rank 0 keeps of a packed task: where its written bytes go when they come back.
pub(crate) struct WriteBack {
    /// Rank 0's buffers, in frame order.
    buffers: Vec<HostBuffer>,
    /// The spans the serving rank must send back, in order.
    expected: Vec<(u32, usize, usize)>,
    /// The task's write-tagged views with elements, by buffer: only their bytes of the spans
    /// that come back are written (the bounding span of a strided view has gaps another task
    /// may be writing).
    views: Vec<Vec<Tensor>>,
}

/// Packs `args` of `task` for `rank` (see the module docs). The submit check ran already; a
/// tensor that fails it anyway fails only this task.
pub(crate) fn pack(
    rank: i32,
    task: TaskId,
    args: TaskArgsView<'_>,
) -> Result<(WireArgs, WriteBack), RemoteError> {
    let refuse = |arg, problem| RemoteError::Unshippable { rank, task, arg, problem };
    let mut buffers: Vec<HostBuffer> = Vec::new();
    let mut copy_in: Vec<bool> = Vec::new();
    let mut spans: Vec<(u32, (usize, usize))> = Vec::new();
    let mut views: Vec<(usize, Tensor)> = Vec::new();
    let mut tensors = Vec::with_capacity(args.tensors.len());
    for (i, t) in args.tensors.iter().enumerate() {
        let tag = args.tags.get(i).copied().unwrap_or_default();
        if t.is_null() {
            tensors.push(WireTensor { tensor: *t, tag, buffer: None });
            continue;
        }
        if t.is_child_memory() {
            return Err(refuse(i, TensorProblem::ChipMemory { addr: HostAddr(t.addr) }));
        }
        if tag == TensorArgType::NoDep {
            return Err(refuse(i, TensorProblem::NoDep));
        }
        let host = HostBuffer::covering(t.addr, t.size).ok_or_else(|| {
            refuse(i, TensorProblem::NotHostBuffer { addr: HostAddr(t.addr), len: t.size })
        })?;
        let k = match buffers.iter().position(|b| HostBuffer::same(b, &host)) {
            Some(k) => k,
            None => {
                buffers.push(host);
                copy_in.push(false);
                buffers.len() - 1
            }
        };
        let host = &buffers[k];
        // An empty view touches no byte: it needs none of the buffer's bytes and sends none back.
        if t.numel() != 0 {
            let span = span_in(t, host.addr(), host.len()).ok_or_else(|| {
                refuse(i, TensorProblem::NoSpan { addr: HostAddr(host.addr()), len: host.len() })
            })?;
            copy_in[k] |= !t.overwrites_whole(tag, host.addr(), host.len());
            if tag.writes() {
                spans.push((k as u32, span));
                views.push((k, *t));
            }
        }
        let mut wire = *t;
        wire.addr = t.addr - host.addr();
        tensors.push(WireTensor { tensor: wire, tag, buffer: Some(k as u32) });
    }
    let wire_buffers = buffers
        .iter()
        .zip(&copy_in)
        .map(|(b, &copy)| WireBuffer { len: b.len(), bytes: copy.then(|| b.to_vec()) })
        .collect();
    let expected = write_back_plan(spans, buffers.len());
    let mut by_buffer = vec![Vec::new(); buffers.len()];
    for (k, t) in views {
        by_buffer[k].push(t);
    }
    let wire = WireArgs { tensors, scalars: args.scalars.to_vec(), buffers: wire_buffers };
    Ok((wire, WriteBack { buffers, expected, views: by_buffer }))
}

impl WriteBack {
    /// Writes the spans the serving rank sent back into rank 0's buffers, after checking they
    /// are exactly the expected ones (anything else would write bytes the engine did not
    /// order for this task).
    pub(crate) fn write_back(&self, rank: i32, written: &[WrittenSpan]) -> Result<(), RemoteError> {
        // Compared pair by pair, so a reply of many spans costs no more than the expected ones:
        // the first index past the shorter list differs.
        let at = |s: &WrittenSpan| WrittenAt {
            buffer: s.buffer,
            offset: s.offset,
            len: s.bytes.len() as u64,
        };
        let got = |i: usize| written.get(i).map(at);
        let want = |i: usize| {
            let &(buffer, lo, hi) = self.expected.get(i)?;
            Some(WrittenAt { buffer, offset: lo as u64, len: (hi - lo) as u64 })
        };
        let violation = |violation| RemoteError::Protocol { rank, violation };
        let compared = written.len().min(self.expected.len()) + 1;
        if let Some(index) = (0..compared).find(|&i| got(i) != want(i)) {
            return Err(violation(ProtocolViolation::WrittenSpans(Box::new(SpanMismatch {
                index,
                got: got(index),
                expected: want(index),
                carried: written.len(),
                named: self.expected.len(),
            }))));
        }
        // The spans are the expected ones, which lie inside rank 0's buffers; one that leaves
        // its buffer anyway is refused before anything is written.
        for s in written {
            let buffer = &self.buffers[s.buffer as usize];
            let end = s.offset.checked_add(s.bytes.len() as u64);
            if end.is_none_or(|end| end > buffer.len()) {
                let size = buffer.len();
                return Err(violation(ProtocolViolation::SpanOutsideBuffer { span: at(s), size }));
            }
        }
        for (k, buffer) in self.buffers.iter().enumerate() {
            let spans: Vec<(usize, &[u8])> = written
                .iter()
                .filter(|s| s.buffer as usize == k)
                .map(|s| (s.offset as usize, s.bytes.as_slice()))
                .collect();
            if spans.is_empty() {
                continue;
            }
            let base = buffer.addr();
            buffer.with_bytes(|host| write_touched(&self.views[k], base, host, &spans));
        }
        Ok(())
    }
}

/// A task's arguments unpacked on the serving rank, over buffers of its own.
pub(crate) struct Inbound {
    pub(crate) args: TaskArgs,
    buffers: Vec<HostBuffer>,
    plan: Vec<(u32, usize, usize)>,
}

/// Unpacks `wire` into arguments over fresh host buffers of this rank.
pub(crate) fn unpack(wire: WireArgs) -> Result<Inbound, ArgumentsProblem> {
    unpack_within(wire, MAX_FRAME_BYTES as u64)
}

/// [`unpack`], with `limit` the bytes one reply frame carries.
fn unpack_within(wire: WireArgs, limit: u64) -> Result<Inbound, ArgumentsProblem> {
    // Counts come from a decoded frame, whose counts are `u32`; its buffers are no more than
    // a task's tensors, which decoding checked before it read them (`MAX_WIRE_BUFFERS`).
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let caps = (TaskArgs::MAX_TENSORS, TaskArgs::MAX_SCALARS);
    if wire.tensors.len() > caps.0 {
        return Err(ArgumentsProblem::TooManyTensors {
            count: count(wire.tensors.len()),
            cap: count(caps.0),
        });
    }
    if wire.scalars.len() > caps.1 {
        return Err(ArgumentsProblem::TooManyScalars {
            count: count(wire.scalars.len()),
            cap: count(caps.1),
        });
    }
    // The tensors are checked on their descriptors alone, before anything is allocated on a
    // peer's word.
    let mut spans = Vec::new();
    for (i, w) in wire.tensors.iter().enumerate() {
        let (t, tensor) = (&w.tensor, count(i));
        let Some(buffer) = w.buffer else {
            if t.is_null() {
                continue;
            }
            return Err(ArgumentsProblem::NoBuffer { tensor });
        };
        let len = wire
            .buffers
            .get(buffer as usize)
            .ok_or(ArgumentsProblem::NoSuchBuffer {
                tensor,
                buffer,
                buffers: count(wire.buffers.len()),
            })?
            .len;
        // The memory the tensor names (`size` bytes at its offset), as its view's bytes, must
        // lie inside its buffer, whether it is read or written.
        if t.addr.checked_add(t.size).is_none_or(|end| end > len) {
            let (offset, size) = (t.addr, t.size);
            return Err(ArgumentsProblem::OutsideBuffer { tensor, buffer, offset, size, len });
        }
        if t.numel() != 0 {
            let span =
                span_at_offset(t, len).ok_or(ArgumentsProblem::NoSpan { tensor, buffer, len })?;
            if w.tag.writes() {
                spans.push((buffer, span));
            }
        }
    }
    let plan = write_back_plan(spans, wire.buffers.len());
    // What is written into the buffers sent without their bytes has to come back in one frame,
    // so together it may be no larger than one. Only the bytes that come back count: a buffer
    // that only empty views name sends nothing back, whatever its length.
    let unsent = plan
        .iter()
        .filter(|&&(k, _, _)| wire.buffers[k as usize].bytes.is_none())
        .map(|&(_, lo, hi)| (hi - lo) as u64)
        .fold(0u64, u64::saturating_add);
    if unsent > limit {
        return Err(ArgumentsProblem::OutputsTooLarge { bytes: unsent, limit });
    }
    // Rank 0 sends a buffer without its bytes when every view of it that touches a byte
    // overwrites all of it, so the task writes it back whole, within the bound above; or when
    // only empty views name it, whose zeros nobody reads or gets back. Buffers of the second
    // kind, and any other a frame may name, are allocated only up to a small cap together.
    let mut not_written_back = 0u64;
    for (k, b) in wire.buffers.iter().enumerate() {
        let whole =
            |&(p, lo, hi): &(u32, usize, usize)| p as usize == k && lo == 0 && hi as u64 == b.len;
        if b.bytes.is_some() || plan.iter().any(whole) {
            continue;
        }
        not_written_back = not_written_back.saturating_add(b.len);
        if not_written_back > NOT_WRITTEN_BACK_CAP {
            let (buffer, len, cap) = (count(k), b.len, NOT_WRITTEN_BACK_CAP);
            return Err(ArgumentsProblem::NotWrittenBack { buffer, len, cap });
        }
    }
    let mut buffers = Vec::with_capacity(wire.buffers.len());
    for (k, b) in wire.buffers.into_iter().enumerate() {
        let (buffer, len) = (count(k), b.len);
        if len == 0 {
            return Err(ArgumentsProblem::EmptyBuffer { buffer });
        }
        // Its length is not 0, so only the allocation can fail.
        let buf = match b.bytes {
            Some(bytes) if bytes.len() as u64 == len => HostBuffer::from_bytes(&bytes).ok(),
            Some(bytes) => {
                let carried = bytes.len() as u64;
                return Err(ArgumentsProblem::BufferBytes { buffer, carried, len });
            }
            None => usize::try_from(len).ok().and_then(|n| HostBuffer::new(n).ok()),
        };
        buffers.push(buf.ok_or(ArgumentsProblem::Allocation { buffer, len })?);
    }
    let mut args = TaskArgs::new();
    for (i, w) in wire.tensors.into_iter().enumerate() {
        let mut t: Tensor = w.tensor;
        let tensor = count(i);
        if let Some(k) = w.buffer {
            // Its buffer exists and holds it (checked above).
            let b = &buffers[k as usize];
            t.addr = b.addr().checked_add(t.addr).ok_or(ArgumentsProblem::OutsideBuffer {
                tensor,
                buffer: k,
                offset: t.addr,
                size: t.size,
                len: b.len(),
            })?;
        }
        t.validate().map_err(|e| invalid_tensor(tensor, e))?;
        // Within the cap (checked above), and no scalar was added yet.
        args.add_tensor(t, w.tag).map_err(|e| invalid_tensor(tensor, e))?;
    }
    let scalars = count(wire.scalars.len());
    for v in wire.scalars {
        // Within the cap (checked above).
        args.add_scalar(v)
            .map_err(|_| ArgumentsProblem::TooManyScalars { count: scalars, cap: count(caps.1) })?;
    }
    Ok(Inbound { args, buffers, plan })
}

/// Tensor `tensor` of a task breaks a rule of its descriptor, `e`; a rule the frame format has
/// no code for crosses unnamed, and is logged here.
fn invalid_tensor(tensor: u32, e: simpler_types::TypesError) -> ArgumentsProblem {
    let error = if carries_types_error(&e) {
        Some(Box::new(e))
    } else {
        tracing::warn!(tensor, error = %e, "a task's tensor breaks a rule rank 0 cannot be told");
        None
    };
    ArgumentsProblem::InvalidTensor { tensor, error }
}

/// The offsets `[lo, hi)` of the bytes tensor `t` can touch in a buffer of `len` bytes, its
/// `addr` holding its offset there (as on the wire), if they lie inside it.
fn span_at_offset(t: &Tensor, len: u64) -> Option<(usize, usize)> {
    // A tensor at address 0 is the null tensor: measure it at a base of 1 instead.
    let mut at = *t;
    at.addr = t.addr.checked_add(1)?;
    span_in(&at, 1, len)
}

impl Inbound {
    /// The bytes the task's write-tagged tensors can touch, to send back after a successful
    /// run.
    pub(crate) fn written(&self) -> Vec<WrittenSpan> {
        self.plan
            .iter()
            .map(|&(buffer, lo, hi)| {
                let mut bytes = vec![0u8; hi - lo];
                // The plan's spans lie inside their buffers (checked in `unpack`).
                self.buffers[buffer as usize].with_bytes(|b| bytes.copy_from_slice(&b[lo..hi]));
                WrittenSpan { buffer, offset: lo as u64, bytes }
            })
            .collect()
    }
}

/// The written spans merged per buffer, buffers in frame order: what travels back, computed
/// the same way on both sides.
fn write_back_plan(spans: Vec<(u32, (usize, usize))>, buffers: usize) -> Vec<(u32, usize, usize)> {
    let mut per_buffer: Vec<Vec<(usize, usize)>> = vec![Vec::new(); buffers];
    for (k, span) in spans {
        per_buffer[k as usize].push(span);
    }
    per_buffer
        .iter()
        .enumerate()
        .flat_map(|(k, s)| merged(s).into_iter().map(move |(lo, hi)| (k as u32, lo, hi)))
        .collect()
}

#[cfg(test)]
mod tests {
    use simpler_types::DataType;

    use super::*;

    /// One input tensor of 64 bytes at `offset` into a 64-byte buffer sent with its bytes.
    fn input_at(offset: u64) -> WireArgs {
        let tensor = Tensor::with_buffer(offset, 64, &[4, 4], DataType::Float32).unwrap();
        WireArgs {
            tensors: vec![WireTensor { tensor, tag: TensorArgType::Input, buffer: Some(0) }],
            scalars: Vec::new(),
            buffers: vec![WireBuffer { len: 64, bytes: Some(vec![1; 64]) }],
        }
    }

    #[test]
    fn a_blind_output_over_a_whole_buffer_skips_the_copy_in_only_when_it_has_no_gaps() {
        let task = TaskId::new(simpler_types::RunId::from_raw(1).unwrap(), 0);
        let sent = |strided: bool| {
            let buf = HostBuffer::new(16).unwrap();
            let whole = buf.tensor(&[4], DataType::Float32).unwrap();
            let t = if strided { whole.slice(0, 0, 4, 3).unwrap() } else { whole };
            let mut args = TaskArgs::new();
            args.add_output(t).unwrap();
            let (wire, _) = pack(1, task, args.view()).map_err(|e| e.to_string()).unwrap();
            wire.buffers[0].bytes.is_some()
        };
        assert!(!sent(false), "a dense overwrite needs none of the old bytes");
        assert!(sent(true), "the bytes in a strided view's gaps must travel and come back");
    }

    #[test]
    fn a_tensor_naming_part_of_its_buffer_and_an_empty_view_cross_as_they_run_locally() {
        let task = TaskId::new(simpler_types::RunId::from_raw(1).unwrap(), 0);
        let buf = HostBuffer::from_bytes(&[3; 64]).unwrap();
        // 16 bytes at the buffer's base, in a 64-byte buffer: accepted at submit.
        let part = Tensor::external(buf.addr(), &[4], DataType::Float32).unwrap();
        let empty = buf.tensor(&[0], DataType::Float32).unwrap();
        let mut args = TaskArgs::new();
        args.add_input(part).unwrap().add_output(empty).unwrap();
        assert!(refuse_unshippable(&args, WorkerId(0), 1).is_ok());
        let (wire, back) = pack(1, task, args.view()).map_err(|e| e.to_string()).unwrap();
        let inbound = unpack(wire).unwrap();
        assert_eq!(inbound.args.tensors()[0].size, 16);
        assert!(inbound.written().is_empty(), "an empty output sends nothing back");
        back.write_back(1, &inbound.written()).unwrap();
    }

    #[test]
    fn a_tensor_that_cannot_be_packed_fails_its_task_naming_what_is_wrong_typed() {
        let task = TaskId::new(simpler_types::RunId::from_raw(1).unwrap(), 0);
        let buf = HostBuffer::new(64).unwrap();
        let whole = buf.tensor(&[16], DataType::Float32).unwrap();
        let outside = [0u8; 64];
        let elsewhere =
            Tensor::external(outside.as_ptr() as u64, &[16], DataType::Float32).unwrap();
        // Eight elements in, sixteen of them end 32 bytes past the buffer.
        let past_end = Tensor { start_offset: 8, ..whole };
        let refused = |t: Tensor, tag: TensorArgType| {
            let view = TaskArgsView { tensors: &[t], tags: &[tag], scalars: &[] };
            match pack(3, task, view) {
                Err(RemoteError::Unshippable { rank: 3, task: t, arg: 0, problem }) => {
                    assert_eq!(t, task);
                    problem
                }
                Err(e) => panic!("{e}"),
                Ok(_) => panic!("{t:?} was packed"),
            }
        };
        assert_eq!(
            refused(whole.child_memory(true), TensorArgType::Input),
            TensorProblem::ChipMemory { addr: HostAddr(buf.addr()) }
        );
        assert_eq!(refused(whole, TensorArgType::NoDep), TensorProblem::NoDep);
        assert_eq!(
            refused(elsewhere, TensorArgType::Input),
            TensorProblem::NotHostBuffer { addr: HostAddr(elsewhere.addr), len: 64 }
        );
        assert_eq!(
            refused(past_end, TensorArgType::Output),
            TensorProblem::NoSpan { addr: HostAddr(buf.addr()), len: 64 }
        );
    }

    /// One tensor overwriting a whole buffer of `len` bytes sent without its bytes, `copies`
    /// times.
    fn outputs_over(len: u64, copies: usize) -> WireArgs {
        let shape = [(len >> 20) as u32, 1 << 20];
        let tensor = Tensor::with_buffer(0, len, &shape, DataType::UInt8).unwrap();
        WireArgs {
            tensors: (0..copies)
                .map(|k| WireTensor { tensor, tag: TensorArgType::Output, buffer: Some(k as u32) })
                .collect(),
            scalars: Vec::new(),
            buffers: (0..copies).map(|_| WireBuffer { len, bytes: None }).collect(),
        }
    }

    #[test]
    fn a_completion_whose_written_spans_differ_names_the_first_that_does() {
        let task = TaskId::new(simpler_types::RunId::from_raw(1).unwrap(), 0);
        let buf = HostBuffer::new(64).unwrap();
        let half = buf.tensor(&[16], DataType::Float32).unwrap().view(&[8], &[4]).unwrap();
        let mut args = TaskArgs::new();
        args.add_output(half).unwrap();
        let (_, back) = pack(1, task, args.view()).map_err(|e| e.to_string()).unwrap();
        let named = WrittenAt { buffer: 0, offset: 16, len: 32 };
        let span = |offset: u64, len: usize| WrittenSpan { buffer: 0, offset, bytes: vec![7; len] };
        let mismatch = |written: &[WrittenSpan]| match back.write_back(2, written) {
            Err(RemoteError::Protocol {
                rank: 2,
                violation: ProtocolViolation::WrittenSpans(m),
            }) => *m,
            other => panic!("{written:?} gave {other:?}"),
        };
        // The named span, one byte short.
        assert_eq!(
            mismatch(&[span(16, 31)]),
            SpanMismatch {
                index: 0,
                got: Some(WrittenAt { len: 31, ..named }),
                expected: Some(named),
                carried: 1,
                named: 1,
            }
        );
        // The named span, then one more.
        assert_eq!(
            mismatch(&[span(16, 32), span(0, 8)]),
            SpanMismatch {
                index: 1,
                got: Some(WrittenAt { buffer: 0, offset: 0, len: 8 }),
                expected: None,
                carried: 2,
                named: 1,
            }
        );
        // Far more spans than named: the first one past the named span differs.
        let many = vec![span(16, 32); 100_000];
        assert_eq!(
            mismatch(&many),
            SpanMismatch { index: 1, got: Some(named), expected: None, carried: 100_000, named: 1 }
        );
        assert_eq!(
            mismatch(&[]),
            SpanMismatch { index: 0, got: None, expected: Some(named), carried: 0, named: 1 }
        );
        assert!(buf.to_vec().iter().all(|&b| b == 0), "nothing was written");
        back.write_back(2, &[span(16, 32)]).unwrap();
        assert_eq!(buf.to_vec()[16..48], [7; 32]);
    }

    #[test]
    fn a_strided_write_comes_back_as_its_own_elements_not_the_gaps_of_its_span() {
        // Rows 1 and 3 of a 4 x 8 matrix of bytes: the span is rows 1 to 3, and row 2, in its
        // gap, is another task's to write meanwhile.
        let task = TaskId::new(simpler_types::RunId::from_raw(1).unwrap(), 0);
        let buf = HostBuffer::new(32).unwrap();
        let m = buf.tensor(&[4, 8], DataType::UInt8).unwrap();
        let mut args = TaskArgs::new();
        args.add_output(m.slice(0, 1, 4, 2).unwrap()).unwrap();
        let (_, back) = pack(1, task, args.view()).map_err(|e| e.to_string()).unwrap();
        buf.write(16, &[7; 8]).unwrap();
        back.write_back(1, &[WrittenSpan { buffer: 0, offset: 8, bytes: vec![0xAB; 24] }]).unwrap();
        let rows: Vec<Vec<u8>> = buf.to_vec().chunks(8).map(<[u8]>::to_vec).collect();
        assert_eq!(rows, vec![vec![0; 8], vec![0xAB; 8], vec![7; 8], vec![0xAB; 8]]);
    }

    #[test]
    fn a_tensor_outside_its_buffer_or_a_buffer_no_frame_could_return_is_refused() {
        assert!(unpack(input_at(0)).is_ok());
        // An input is read on this rank: it must lie inside its buffer as a written one must.
        let outside = unpack(input_at(8)).err();
        assert_eq!(
            outside,
            Some(ArgumentsProblem::OutsideBuffer {
                tensor: 0,
                buffer: 0,
                offset: 8,
                size: 64,
                len: 64
            })
        );
        let limit = MAX_FRAME_BYTES as u64;
        let refused = unpack(outputs_over(1 << 40, 1)).err();
        assert_eq!(refused, Some(ArgumentsProblem::OutputsTooLarge { bytes: 1 << 40, limit }));
        // Nor may many buffers that each fit a frame, together.
        let refused = unpack(outputs_over(1 << 30, 3)).err();
        assert_eq!(refused, Some(ArgumentsProblem::OutputsTooLarge { bytes: 3 << 30, limit }));
    }

    #[test]
    fn rank_0_refuses_at_submit_the_empty_views_a_serving_rank_would_refuse() {
        let (small, big) = (HostBuffer::new(1 << 20).unwrap(), HostBuffer::new(32 << 20).unwrap());
        let args = |bufs: &[&HostBuffer]| {
            let mut args = TaskArgs::new();
            for b in bufs {
                args.add_output(b.tensor(&[0], DataType::Float32).unwrap()).unwrap();
            }
            args
        };
        assert!(refuse_unshippable(&args(&[&small]), WorkerId(0), 1).is_ok());
        match refuse_unshippable(&args(&[&small, &big]), WorkerId(0), 1) {
            Err(WorkerError::RemoteTensor(TensorRefusal {
                arg: 1,
                problem: TensorProblem::EmptyViewsOnly { addr, len, cap },
                ..
            })) => {
                assert_eq!(
                    (addr, len, cap),
                    (HostAddr(big.addr()), 33 << 20, NOT_WRITTEN_BACK_CAP)
                );
            }
            other => panic!("an empty view of a 32 MiB buffer gave {other:?}"),
        }
        // A buffer a non-empty view also names travels with its bytes: no cap applies.
        let mut mixed = args(&[&big]);
        mixed.add_input(big.tensor(&[4], DataType::Float32).unwrap()).unwrap();
        assert!(refuse_unshippable(&mixed, WorkerId(0), 1).is_ok());
    }

    #[test]
    fn a_buffer_sent_without_bytes_that_is_not_written_back_whole_is_allocated_only_under_a_cap() {
        let cap = NOT_WRITTEN_BACK_CAP;
        // `views[k]` is an output view of buffer k, of `len` bytes, sent without its bytes:
        // empty, or covering all of it.
        let frame = |views: &[(u64, bool)], unnamed: u64| {
            let tensors = views.iter().enumerate().map(|(k, &(len, empty))| {
                let shape = if empty { [0, 1] } else { [(len >> 10) as u32, 1 << 10] };
                let tensor = Tensor::with_buffer(0, len, &shape, DataType::UInt8).unwrap();
                WireTensor { tensor, tag: TensorArgType::Output, buffer: Some(k as u32) }
            });
            let lens = views.iter().map(|&(len, _)| len).chain((unnamed > 0).then_some(unnamed));
            WireArgs {
                tensors: tensors.collect(),
                scalars: Vec::new(),
                buffers: lens.map(|len| WireBuffer { len, bytes: None }).collect(),
            }
        };
        // 1 GiB named only by an empty output view: nothing of it is read or comes back.
        let refused = unpack(frame(&[(1 << 30, true)], 0)).err();
        assert_eq!(
            refused,
            Some(ArgumentsProblem::NotWrittenBack { buffer: 0, len: 1 << 30, cap })
        );
        // Nor by no view at all, after a buffer the task writes back whole.
        let refused = unpack(frame(&[(1 << 20, false)], 1 << 30)).err();
        assert_eq!(
            refused,
            Some(ArgumentsProblem::NotWrittenBack { buffer: 1, len: 1 << 30, cap })
        );
        // Buffers that each fit count together.
        let half = cap / 2 + 1024;
        let refused = unpack(frame(&[(half, true), (half, true)], 0)).err();
        assert_eq!(refused, Some(ArgumentsProblem::NotWrittenBack { buffer: 1, len: half, cap }));
        // An empty view of a buffer within the cap crosses, as does one written back whole.
        let inbound = unpack(frame(&[(half, true), (1 << 20, false)], 0)).unwrap();
        assert_eq!(inbound.written().len(), 1);
    }

    #[test]
    fn each_way_arguments_do_not_unpack_names_its_tensor_or_buffer_and_numbers() {
        let refused = |edit: &dyn Fn(&mut WireArgs)| {
            let mut wire = input_at(0);
            edit(&mut wire);
            unpack(wire).err()
        };
        // Offset 8 with no buffer: not the null tensor, which is at 0.
        let no_buffer = |w: &mut WireArgs| {
            w.tensors[0].buffer = None;
            w.tensors[0].tensor.addr = 8;
        };
        assert_eq!(refused(&no_buffer), Some(ArgumentsProblem::NoBuffer { tensor: 0 }));
        let no_such_buffer = |w: &mut WireArgs| {
            w.buffers.push(w.buffers[0].clone());
            w.tensors[0].buffer = Some(4);
        };
        assert_eq!(
            refused(&no_such_buffer),
            Some(ArgumentsProblem::NoSuchBuffer { tensor: 0, buffer: 4, buffers: 2 })
        );
        assert_eq!(
            refused(&|w| w.buffers[0].bytes = Some(vec![1; 60])),
            Some(ArgumentsProblem::BufferBytes { buffer: 0, carried: 60, len: 64 })
        );
        // An input (nothing comes back) in a buffer sent without its bytes.
        let cap = NOT_WRITTEN_BACK_CAP;
        assert_eq!(
            refused(&|w| w.buffers[0] = WireBuffer { len: 1 << 62, bytes: None }),
            Some(ArgumentsProblem::NotWrittenBack { buffer: 0, len: 1 << 62, cap })
        );
        // A second buffer of length 0, which only a null tensor could name.
        assert_eq!(
            refused(&|w| w.buffers.push(WireBuffer { len: 0, bytes: None })),
            Some(ArgumentsProblem::EmptyBuffer { buffer: 1 })
        );
        // A second tensor whose stride 0 breaks a rule of its descriptor.
        let zero_stride = |w: &mut WireArgs| {
            let mut t = w.tensors[0].clone();
            t.tensor.strides[1] = 0;
            t.tensor.shapes[1] = 1;
            t.tensor.extent_elems = 4;
            t.tensor.is_contiguous = 0;
            w.tensors.push(t);
        };
        match refused(&zero_stride) {
            Some(ArgumentsProblem::InvalidTensor { tensor: 1, error: Some(e) }) => {
                assert_eq!(*e, simpler_types::TypesError::ZeroStride { dim: 1 });
            }
            other => panic!("a stride of 0 gave {other:?}"),
        }
        let cap = TaskArgs::MAX_TENSORS;
        let many = |w: &mut WireArgs| w.tensors = vec![w.tensors[0].clone(); cap + 1];
        assert_eq!(
            refused(&many),
            Some(ArgumentsProblem::TooManyTensors { count: cap as u32 + 1, cap: cap as u32 })
        );
        let cap = TaskArgs::MAX_SCALARS;
        assert_eq!(
            refused(&|w| w.scalars = vec![0; cap + 2]),
            Some(ArgumentsProblem::TooManyScalars { count: cap as u32 + 2, cap: cap as u32 })
        );
    }

    #[test]
    fn a_buffer_only_empty_views_name_counts_nothing_against_the_reply_frame() {
        let task = TaskId::new(simpler_types::RunId::from_raw(1).unwrap(), 0);
        // Two 64-byte buffers of rank 0, against a reply frame of 48 bytes: one named only by
        // an empty output view, the other overwritten whole, so both cross without their bytes.
        let (a, b) = (HostBuffer::new(64).unwrap(), HostBuffer::new(64).unwrap());
        let empty = a.tensor(&[0], DataType::Float32).unwrap();
        let whole = b.tensor(&[16], DataType::Float32).unwrap();
        let packed = |tensors: &[Tensor]| {
            let mut args = TaskArgs::new();
            for t in tensors {
                args.add_output(*t).unwrap();
            }
            let (wire, _) = pack(1, task, args.view()).map_err(|e| e.to_string()).unwrap();
            assert!(wire.buffers.iter().all(|b| b.bytes.is_none() && b.len == 64));
            wire
        };
        match unpack_within(packed(&[empty]), 48) {
            Ok(inbound) => assert!(inbound.written().is_empty()),
            Err(e) => panic!("an empty view's buffer, of which nothing comes back: {e}"),
        }
        let refused = unpack_within(packed(&[empty, whole]), 48).err();
        assert_eq!(refused, Some(ArgumentsProblem::OutputsTooLarge { bytes: 64, limit: 48 }));
    }
}
