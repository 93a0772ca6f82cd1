//! Staging of host-memory tensors on L3 chip tasks (`docs/worker-protocols.md`, "Host tensors
//! on chip tasks").
//!
//! A chip task whose tensors name a [`HostBuffer`] runs on a copy: the lane allocates one
//! device buffer per distinct host buffer, copies the bytes in unless every tensor of that
//! buffer is a contiguous blind write (`Output`, `OutputExisting`) over all of it, rewrites the
//! tensors to the device copy,
//! runs the task and, after a successful run, copies back the bytes its write-tagged tensors
//! touch and nothing else: another task may be writing the buffer's other bytes meanwhile,
//! including bytes in the gaps of a strided view (two blind writes of interleaved rows are not
//! ordered against each other). The device's bytes of each write view's bounding span are read,
//! and only the view's own elements are written into the buffer. The device copies are freed on
//! every path.
//!
//! Tensors of one host buffer share one device copy, so views of the same bytes stay aliased
//! on the chip as they are on the host.
//!
//! The device side is a [`StagingChip`]: the chip's runner in this process, or its child process
//! in PROCESS mode (`process::host_tensors`), where every call is a mailbox request.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use simpler_device_a2a3::{ArgsProblem, DeviceError, DevicePtr, DeviceRunner};
use simpler_sched::EndpointFailure;
use simpler_types::{
    CallConfig, CallableId, TaskArgs, TaskArgsView, TaskId, Tensor, TensorArgType,
};

use crate::chip::{ChipState, device_failure};
use crate::error::WorkerError;
use crate::host_buffer::{HostAddr, HostBuffer};

/// Whether tensor `t` names host memory a chip lane has to stage.
fn is_host(t: &Tensor) -> bool {
    !t.is_null() && !t.is_child_memory()
}

/// Whether any tensor of `args` is host memory.
pub(crate) fn has_host_tensors(args: TaskArgsView<'_>) -> bool {
    args.tensors.iter().any(is_host)
}

/// The first host-memory tensor of `args` and its index.
pub(crate) fn first_host_tensor(args: &TaskArgs) -> Option<(usize, &Tensor)> {
    args.tensors().iter().enumerate().find(|(_, t)| is_host(t))
}

/// The submit-time check of one chip task's arguments: every host-memory tensor lies in a live
/// [`HostBuffer`], starts at its address and is not tagged `NoDep` (the lane could not tell
/// whether the task writes it); the buffers are returned so that the run keeps them alive.
pub(crate) fn host_buffers_of(args: &TaskArgs) -> Result<Vec<HostBuffer>, WorkerError> {
    let mut out: Vec<HostBuffer> = Vec::new();
    for (arg, t) in args.tensors().iter().enumerate().filter(|(_, t)| is_host(t)) {
        let buf = HostBuffer::covering(t.addr, t.size).ok_or(WorkerError::HostTensorNotStaged {
            arg,
            addr: HostAddr(t.addr),
            len: t.size,
        })?;
        check_base(arg, t, &buf)?;
        if args.tags().get(arg) == Some(&TensorArgType::NoDep) {
            return Err(WorkerError::HostTensorNoDep { arg });
        }
        push_unique(&mut out, buf);
    }
    Ok(out)
}

/// The host buffers a sub task's tensors lie in (other host memory is the caller's own), so
/// that the run keeps them alive; refuses views whose base is inside a buffer but not at it.
pub(crate) fn sub_host_buffers_of(args: &TaskArgs) -> Result<Vec<HostBuffer>, WorkerError> {
    let mut out: Vec<HostBuffer> = Vec::new();
    for (arg, t) in args.tensors().iter().enumerate().filter(|(_, t)| is_host(t)) {
        if let Some(buf) = HostBuffer::covering(t.addr, t.size) {
            check_base(arg, t, &buf)?;
            push_unique(&mut out, buf);
        }
    }
    Ok(out)
}

/// Refuses a group in which one member writes host bytes another member also touches: each
/// member's lane stages its own copy of the buffer, so which copy came back last would decide
/// the result. (The engine orders members against earlier tasks, never against each other.)
pub(crate) fn check_group_host_writes(members: &[TaskArgs]) -> Result<(), WorkerError> {
    let spans = |m: &TaskArgs| -> Vec<(usize, (u64, u64), bool)> {
        let tags = m.tags();
        m.tensors()
            .iter()
            .enumerate()
            .filter(|(_, t)| is_host(t))
            .filter_map(|(arg, t)| {
                let writes = tags.get(arg).is_some_and(|tag| tag.writes());
                t.byte_span().map(|span| (arg, span, writes))
            })
            .collect()
    };
    let all: Vec<_> = members.iter().map(spans).collect();
    for (member, mine) in all.iter().enumerate() {
        for &(arg, (lo, hi), _) in mine.iter().filter(|s| s.2) {
            for (other, theirs) in all.iter().enumerate().filter(|(o, _)| *o != member) {
                if let Some(&(other_arg, ..)) =
                    theirs.iter().find(|&&(_, (l, h), _)| l < hi && lo < h)
                {
                    return Err(WorkerError::HostTensorSharedInGroup {
                        member,
                        arg,
                        other,
                        other_arg,
                    });
                }
            }
        }
    }
    Ok(())
}

/// The engine keys tensors by base address: a base inside `buf` but not at its start would not
/// be ordered against the buffer's other views.
fn check_base(arg: usize, t: &Tensor, buf: &HostBuffer) -> Result<(), WorkerError> {
    if t.addr == buf.addr() {
        return Ok(());
    }
    Err(WorkerError::HostTensorOffsetBase {
        arg,
        addr: HostAddr(t.addr),
        buffer: HostAddr(buf.addr()),
    })
}

/// Adds `buf` to `out` unless a handle of the same bytes is there already.
pub(crate) fn push_unique(out: &mut Vec<HostBuffer>, buf: HostBuffer) {
    if !out.iter().any(|b| HostBuffer::same(b, &buf)) {
        out.push(buf);
    }
}

/// One host buffer staged for a chip task.
struct Staged {
    host: HostBuffer,
    /// The device copy's address on the chip.
    dev: u64,
    copy_in: bool,
    /// The task's write-tagged views of the buffer (host addresses), each with elements: only
    /// their bytes are copied back, since the engine may run a task writing other bytes of the
    /// same buffer at the same time.
    written: Vec<Tensor>,
}

impl Staged {
    /// The bounding spans of the written views (offsets into the buffer), sorted and joined:
    /// what is read back from the device.
    fn written(&self) -> Vec<(usize, usize)> {
        let (base, len) = (self.host.addr(), self.host.len());
        let spans: Vec<_> = self.written.iter().filter_map(|t| span_in(t, base, len)).collect();
        merged(&spans)
    }

    /// Writes the bytes the written views touch into the host buffer, from `read`: the
    /// device's bytes of each span of [`written`](Self::written), in order.
    fn write_back(&self, read: &[(usize, Vec<u8>)]) {
        let spans: Vec<(usize, &[u8])> = read.iter().map(|(lo, b)| (*lo, b.as_slice())).collect();
        let base = self.host.addr();
        self.host.with_bytes(|host| write_touched(&self.written, base, host, &spans));
    }
}

/// Copies into `host` (the bytes of the buffer at address `base`) every byte run of `views`
/// from `spans`, sorted disjoint `(offset, bytes)` pieces of the device's copy that together
/// hold each view's bounding span. A run outside them (which the callers rule out) is skipped.
pub(crate) fn write_touched(
    views: &[Tensor],
    base: u64,
    host: &mut [u8],
    spans: &[(usize, &[u8])],
) {
    for v in views {
        v.for_each_byte_run(|addr, len| {
            let (Some(off), Ok(len)) = (addr.checked_sub(base), usize::try_from(len)) else {
                return;
            };
            let Ok(off) = usize::try_from(off) else { return };
            let Some(k) = spans.partition_point(|(lo, _)| *lo <= off).checked_sub(1) else {
                return;
            };
            let (lo, bytes) = spans[k];
            let from = off - lo;
            let src = from.checked_add(len).and_then(|end| bytes.get(from..end));
            let dst = off.checked_add(len).and_then(|end| host.get_mut(off..end));
            if let (Some(src), Some(dst)) = (src, dst) {
                dst.copy_from_slice(src);
            }
        });
    }
}

/// The device side of staging: the chip in this process (THREAD mode) or in a child process
/// (PROCESS mode, where every call is a mailbox request). Failures come back already mapped to
/// the task's endpoint failure, each with its typed source.
pub(crate) trait StagingChip {
    /// Before a task's first device call: every call until [`end`](Self::end) goes to the
    /// device as it is now (a chip process that ends meanwhile fails them, and is not
    /// restarted under copies it held).
    fn begin(&mut self) -> Result<(), EndpointFailure> {
        Ok(())
    }
    /// After the task's last device call, its copies' frees included.
    fn end(&mut self) {}
    /// Allocates a device copy of `len` bytes for task `origin`.
    fn malloc(&mut self, len: u64, origin: TaskId) -> Result<u64, EndpointFailure>;
    /// Copies all of `host` to the device copy at `dev`.
    fn copy_in(
        &mut self,
        dev: u64,
        host: &HostBuffer,
        origin: TaskId,
    ) -> Result<(), EndpointFailure>;
    /// Runs the task on the rewritten arguments.
    fn run(
        &mut self,
        callable: &CallableId,
        args: TaskArgsView<'_>,
        config: &CallConfig,
        origin: TaskId,
    ) -> Result<(), EndpointFailure>;
    /// Copies `out.len()` bytes of a device copy from device address `dev` into `out`.
    fn copy_out(&mut self, dev: u64, out: &mut [u8], origin: TaskId)
    -> Result<(), EndpointFailure>;
    /// Frees a device copy; a failure is only logged (the task's own result says more).
    fn free(&mut self, dev: u64, origin: TaskId);
}

/// Runs a chip task whose arguments name host memory, staging it as the module docs say.
pub(crate) fn run_staged(
    state: &mut ChipState,
    callable: &CallableId,
    args: TaskArgsView<'_>,
    config: &CallConfig,
    origin: TaskId,
) -> Result<(), EndpointFailure> {
    match state.process.as_mut() {
        Some(p) => stage_and_run(p, callable, args, config, origin),
        None => stage_and_run(state, callable, args, config, origin),
    }
}

fn stage_and_run(
    chip: &mut impl StagingChip,
    callable: &CallableId,
    args: TaskArgsView<'_>,
    config: &CallConfig,
    origin: TaskId,
) -> Result<(), EndpointFailure> {
    let mut device_args = TaskArgs::from_view(args).map_err(|source| {
        device_failure(DeviceError::InvalidTaskArgs { run_id: None, arg: None, source })
    })?;
    let mut staged: Vec<Staged> = Vec::new();
    chip.begin()?;
    // A panic on the way (a step, a logging layer) still frees the device copies made so far
    // (the runner refuses a free the device may still need), then goes on unwinding.
    let result = catch_unwind(AssertUnwindSafe(|| {
        stage_in(chip, &mut device_args, &mut staged, origin)
            .and_then(|()| chip.run(callable, device_args.view(), config, origin))
            .and_then(|()| copy_back(chip, &staged, origin))
    }));
    for s in &staged {
        chip.free(s.dev, origin);
    }
    chip.end();
    result.unwrap_or_else(|panic| resume_unwind(panic))
}

/// Copies the written bytes of every device copy back into its host buffer, all or nothing:
/// every written span is read from the device first, and the host buffers are written only once
/// all of them were (a failed read changes no host byte).
fn copy_back(
    chip: &mut impl StagingChip,
    staged: &[Staged],
    origin: TaskId,
) -> Result<(), EndpointFailure> {
    let mut read: Vec<Vec<(usize, Vec<u8>)>> = Vec::with_capacity(staged.len());
    for s in staged {
        let mut spans = Vec::new();
        for (lo, hi) in s.written() {
            let mut bytes = vec![0u8; hi - lo];
            chip.copy_out(s.dev + lo as u64, &mut bytes, origin)?;
            spans.push((lo, bytes));
        }
        read.push(spans);
    }
    for (s, spans) in staged.iter().zip(&read) {
        s.write_back(spans);
    }
    Ok(())
}

impl StagingChip for ChipState {
    fn malloc(&mut self, len: u64, _: TaskId) -> Result<u64, EndpointFailure> {
        runner(self).and_then(|r| r.malloc(len)).map(|p| p.0).map_err(device_failure)
    }

    fn copy_in(&mut self, dev: u64, host: &HostBuffer, _: TaskId) -> Result<(), EndpointFailure> {
        let runner = runner(self).map_err(device_failure)?;
        host.with_bytes(|b| runner.copy_to_device(DevicePtr(dev), b)).map_err(device_failure)
    }

    fn run(
        &mut self,
        callable: &CallableId,
        args: TaskArgsView<'_>,
        config: &CallConfig,
        origin: TaskId,
    ) -> Result<(), EndpointFailure> {
        ChipState::run(self, callable, args, config, origin)
    }

    fn copy_out(&mut self, dev: u64, out: &mut [u8], _: TaskId) -> Result<(), EndpointFailure> {
        let runner = runner(self).map_err(device_failure)?;
        runner.copy_from_device(out, DevicePtr(dev)).map_err(device_failure)
    }

    fn free(&mut self, dev: u64, origin: TaskId) {
        // Freeing a device copy can only fail on a chip that is already failing.
        if let Some(runner) = self.runner.as_mut()
            && let Err(e) = runner.free(DevicePtr(dev))
        {
            tracing::warn!(chip = %self.chip, %origin, "freeing a staging copy failed: {e}");
        }
    }
}

fn runner(state: &mut ChipState) -> Result<&mut DeviceRunner, DeviceError> {
    state.runner.as_mut().ok_or(DeviceError::Finalized { call: "stage host tensors" })
}

/// Allocates and fills the device copies and points the tensors of `args` at them.
fn stage_in(
    chip: &mut impl StagingChip,
    args: &mut TaskArgs,
    staged: &mut Vec<Staged>,
    origin: TaskId,
) -> Result<(), EndpointFailure> {
    let tags: Vec<TensorArgType> = args.tags().to_vec();
    for (i, t) in args.tensors_mut().iter_mut().enumerate() {
        if !is_host(t) {
            continue;
        }
        let tag = tags.get(i).copied().unwrap_or_default();
        let host = HostBuffer::covering(t.addr, t.size).ok_or_else(|| {
            device_failure(DeviceError::InvalidArgs {
                run_id: None,
                problem: ArgsProblem::NotInHostBuffer { arg: i, addr: t.addr },
            })
        })?;
        // A view that overwrites the whole buffer needs no copy in; any other with elements
        // does, or the copy back would return the bytes it did not write as garbage. An empty
        // view touches no byte.
        let empty = t.numel() == 0;
        let whole = empty || t.overwrites_whole(tag, host.addr(), host.len());
        let k = match staged.iter().position(|s| HostBuffer::same(&s.host, &host)) {
            Some(k) => k,
            None => {
                let dev = chip.malloc(host.len(), origin)?;
                staged.push(Staged { host, dev, copy_in: false, written: Vec::new() });
                staged.len() - 1
            }
        };
        let s = &mut staged[k];
        s.copy_in |= !whole;
        if tag.writes() && !empty {
            written_span(i, t, &s.host).map_err(device_failure)?;
            s.written.push(*t);
        }
        t.addr = s.dev + (t.addr - s.host.addr());
        t.child_memory = 1;
    }
    for s in staged.iter().filter(|s| s.copy_in) {
        chip.copy_in(s.dev, &s.host, origin)?;
    }
    Ok(())
}

/// The offsets `[lo, hi)` into `host` of the bytes tensor `t` (chip argument `arg`) can touch
/// (its bounding span, the one the engine orders by).
fn written_span(arg: usize, t: &Tensor, host: &HostBuffer) -> Result<(usize, usize), DeviceError> {
    span_in(t, host.addr(), host.len()).ok_or(DeviceError::InvalidArgs {
        run_id: None,
        problem: ArgsProblem::LeavesHostBuffer {
            arg,
            addr: t.addr,
            buffer_addr: host.addr(),
            buffer_len: host.len(),
        },
    })
}

/// The offsets `[lo, hi)` into the buffer of `len` bytes at `base` of the bytes tensor `t` can
/// touch (its bounding span), if they lie inside it.
pub(crate) fn span_in(t: &Tensor, base: u64, len: u64) -> Option<(usize, usize)> {
    let (start, end) = t.byte_span()?;
    if start < base || end > base.checked_add(len)? {
        return None;
    }
    Some((usize::try_from(start - base).ok()?, usize::try_from(end - base).ok()?))
}

/// `spans` sorted, with overlapping or touching ones joined.
pub(crate) fn merged(spans: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut sorted = spans.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(sorted.len());
    for (lo, hi) in sorted {
        match out.last_mut() {
            Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use simpler_types::{CallableKind, CallableNamespace, DataType, RunId};

    use super::*;

    /// A chip whose device copies are byte vectors, numbered from 1 (the address is the number
    /// shifted left 32). Its "kernel" panics when `panics`; otherwise it sets every byte of each
    /// copy to 0xAB (the gaps of a strided view included), and meanwhile another task writes
    /// `others` into the host buffer, as a task the engine runs at the same time may.
    #[derive(Default)]
    struct MemChip {
        copies: Vec<Vec<u8>>,
        others: Vec<(HostBuffer, u64, Vec<u8>)>,
        panics: bool,
        freed: Vec<u64>,
    }

    impl StagingChip for MemChip {
        fn malloc(&mut self, len: u64, _: TaskId) -> Result<u64, EndpointFailure> {
            self.copies.push(vec![0; len as usize]);
            Ok((self.copies.len() as u64) << 32)
        }
        fn copy_in(
            &mut self,
            dev: u64,
            host: &HostBuffer,
            _: TaskId,
        ) -> Result<(), EndpointFailure> {
            self.copies[(dev >> 32) as usize - 1] = host.to_vec();
            Ok(())
        }
        fn run(
            &mut self,
            _: &CallableId,
            _: TaskArgsView<'_>,
            _: &CallConfig,
            _: TaskId,
        ) -> Result<(), EndpointFailure> {
            assert!(!self.panics, "the run panicked on purpose");
            self.copies.iter_mut().for_each(|c| c.fill(0xAB));
            for (host, offset, bytes) in &self.others {
                host.write(*offset, bytes).unwrap();
            }
            Ok(())
        }
        fn copy_out(&mut self, dev: u64, out: &mut [u8], _: TaskId) -> Result<(), EndpointFailure> {
            let copy = &self.copies[(dev >> 32) as usize - 1];
            let at = (dev & 0xFFFF_FFFF) as usize;
            out.copy_from_slice(&copy[at..at + out.len()]);
            Ok(())
        }
        fn free(&mut self, dev: u64, _: TaskId) {
            self.freed.push(dev);
        }
    }

    fn run_on(chip: &mut MemChip, args: &TaskArgs) -> Result<(), EndpointFailure> {
        let id = CallableId::new([1; 32], CallableKind::Chip, CallableNamespace::LocalChip);
        let origin = TaskId::new(RunId::from_raw(1).unwrap(), 0);
        stage_and_run(chip, &id, args.view(), &CallConfig::default(), origin)
    }

    #[test]
    fn a_panic_while_running_a_staged_task_still_frees_its_device_copies() {
        let (a, f) = (HostBuffer::new(64).unwrap(), HostBuffer::new(64).unwrap());
        let mut args = TaskArgs::new();
        args.add_input(a.tensor(&[16], DataType::Float32).unwrap()).unwrap();
        args.add_output(f.tensor(&[16], DataType::Float32).unwrap()).unwrap();
        let mut chip = MemChip { panics: true, ..MemChip::default() };
        let unwound = catch_unwind(AssertUnwindSafe(|| run_on(&mut chip, &args)));
        assert!(unwound.is_err(), "the panic goes on unwinding");
        assert_eq!(chip.freed, vec![1 << 32, 2 << 32], "both device copies were freed");
    }

    #[test]
    fn a_strided_write_copies_back_its_own_elements_not_the_gaps_another_task_writes() {
        // Rows 1 and 3 of a 4 x 8 matrix of bytes; another task writes rows 0 and 2 meanwhile
        // (two blind writes of interleaved rows are not ordered against each other).
        let buf = HostBuffer::new(32).unwrap();
        let m = buf.tensor(&[4, 8], DataType::UInt8).unwrap();
        let mut args = TaskArgs::new();
        args.add_output(m.slice(0, 1, 4, 2).unwrap()).unwrap();
        let others = vec![(buf.clone(), 0, vec![7; 8]), (buf.clone(), 16, vec![7; 8])];
        let mut chip = MemChip { others, ..MemChip::default() };
        run_on(&mut chip, &args).expect("run");
        let rows: Vec<Vec<u8>> = buf.to_vec().chunks(8).map(<[u8]>::to_vec).collect();
        assert_eq!(rows, vec![vec![7; 8], vec![0xAB; 8], vec![7; 8], vec![0xAB; 8]]);
    }

    #[test]
    fn an_empty_write_view_of_a_host_buffer_runs_and_writes_nothing_back() {
        let buf = HostBuffer::from_bytes(&[5; 16]).unwrap();
        let mut args = TaskArgs::new();
        args.add_output(buf.tensor(&[0], DataType::Float32).unwrap()).unwrap();
        let mut chip = MemChip::default();
        run_on(&mut chip, &args).expect("an empty view touches no byte");
        assert_eq!(buf.to_vec(), vec![5; 16]);
    }

    #[test]
    fn a_view_reaching_past_its_host_buffer_names_the_argument_and_the_buffer() {
        let buf = HostBuffer::new(64).unwrap();
        let t = Tensor::with_buffer(buf.addr(), 128, &[32], DataType::Float32).unwrap();
        let err = written_span(3, &t, &buf).unwrap_err();
        let DeviceError::InvalidArgs { problem, .. } = &err else { panic!("{err:?}") };
        let want = ArgsProblem::LeavesHostBuffer {
            arg: 3,
            addr: buf.addr(),
            buffer_addr: buf.addr(),
            buffer_len: 64,
        };
        assert_eq!(*problem, want);
        assert!(err.to_string().contains("outside its HostBuffer"), "{err}");
    }
}
