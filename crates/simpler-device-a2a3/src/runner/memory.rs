//! The runner's device memory: user allocations and their range checks, the three pooled
//! arenas (GM heap, runtime image, staging), staging of host tensors, and the memory view a
//! chip runtime builds a run with.
//!
//! Arena rule: an equal-or-smaller request reuses the arena; a larger one frees it and
//! allocates anew; any failed arena allocation releases all three, so the retry starts from
//! free device memory.

use std::time::{Duration, Instant};

use simpler_types::{RunId, Tensor};

use super::reap::{SYNC_ORDER, WaitLimits, typed_sync_failure};
use super::staging::{StagedTensor, host_slice};
use super::{Core, DevicePtr, RunState, oom};
use crate::backend::{Backend, SyncError};
use crate::error::{ArgSite, ArgsProblem, DeviceError, MemPurpose, PoisonCause, StreamKind};
use crate::runtime::{BuildEnv, HeapArena};

/// One pooled allocation.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Arena {
    pub(super) addr: u64,
    pub(super) len: u64,
}

impl Arena {
    /// Whether `len` bytes at `addr` lie inside the arena.
    fn holds(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.addr + self.len)
    }
}

/// The pooled arenas of one resource slot, kept across the slot's runs.
#[derive(Debug, Default)]
pub(super) struct Arenas {
    pub(super) heap: Option<Arena>,
    pub(super) image: Option<Arena>,
    pub(super) staging: Option<Arena>,
}

/// One host range staged for a run: every host tensor over it (views of one tensor) shares its
/// staging slice.
struct HostRange {
    addr: u64,
    size: u64,
    /// The first chip argument naming it.
    arg: usize,
    /// Its staging slice.
    dev: u64,
    /// Whether the slice is filled from the host first.
    fill: bool,
    /// Byte ranges (within the range) that write-tagged views can touch: copied back.
    written: Vec<(u64, u64)>,
}

impl HostRange {
    fn new(arg: usize, addr: u64, size: u64) -> HostRange {
        HostRange { addr, size, arg, dev: 0, fill: false, written: Vec::new() }
    }

    fn overlaps(&self, addr: u64, size: u64) -> bool {
        ranges_meet((self.addr, self.size), (addr, size))
    }
}

/// Whether the byte ranges `[addr, addr + size)` given as `(addr, size)` share a byte (an
/// empty range meets none).
fn ranges_meet(a: (u64, u64), b: (u64, u64)) -> bool {
    a.1 > 0 && b.1 > 0 && b.0 < a.0.saturating_add(a.1) && a.0 < b.0.saturating_add(b.1)
}

/// `spans` sorted, with overlapping or touching ones joined.
fn merged(spans: &mut [(u64, u64)]) -> Vec<(u64, u64)> {
    spans.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for &(lo, hi) in spans.iter() {
        match out.last_mut() {
            Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// Bytes a host tensor of `size` bytes takes in the staging arena (1024-byte slices); `None`
/// when that does not fit in a `u64`.
fn staging_bytes(size: u64) -> Option<u64> {
    size.div_ceil(1024).checked_mul(1024)
}

/// The device memory a chip runtime may use while it binds a run.
pub(super) struct RunMemory<'a> {
    pub(super) backend: &'a dyn Backend,
    /// The slot's GM heap arena.
    pub(super) heap: &'a mut Option<Arena>,
    /// The slot's staging arena, where the run's host tensors were staged before the bind.
    pub(super) staging: Option<Arena>,
    pub(super) run_id: RunId,
    /// Arena allocations this bind made (arena-cache misses).
    pub(super) misses: u64,
    /// The heap arena's allocation was refused (every pooled arena is then released).
    pub(super) heap_refused: bool,
    /// The runs on the device while this one prepares, until an access of user memory waited
    /// for them.
    pub(super) executing: Option<Executing>,
    /// When an access of user memory began waiting for them, and the budget it gave each run
    /// that no reap had begun (by `launch_seq`): those budgets run from there for the runs' own
    /// reaps too ([`Core::begin_budgets`]).
    pub(super) budgets_begun: Option<(Instant, Vec<(u64, Duration)>)>,
    /// The run an access of user memory by the orchestration waited for, if one had to, and
    /// why (the reason the run's report gives).
    pub(super) waited_for: Option<(RunId, &'static str)>,
    /// Why that wait failed (the runs ahead faulted or did not finish): the run being
    /// prepared can never be launched behind them.
    pub(super) ahead_failed: Option<FailedWait>,
}

/// An access's wait for the launched runs that failed: what it names (the last run launched, the
/// stream and the code the wait ended with), how long it waited at most, the stream it failed
/// on and how (a fault carries what the stream reported, onboard with the typed CANN error).
#[derive(Clone, Debug)]
pub(super) struct FailedWait {
    pub(super) cause: PoisonCause,
    pub(super) limit: Duration,
    pub(super) stream: StreamKind,
    pub(super) error: SyncError,
}

/// The launched runs a preparation overlaps with: the last one launched (the streams finish
/// it after every run launched before it) and the stream-sync budget of each, as its reap has
/// it: its `launch_seq`, when the budget began (`None`: not yet, it begins with the wait) and
/// how long it is.
pub(super) struct Executing {
    pub(super) last: RunId,
    pub(super) budgets: Vec<(u64, Option<Instant>, Duration)>,
    pub(super) op_execute: Duration,
}

impl Executing {
    /// When the last budget of the runs ends, for a wait that begins at `now`.
    fn deadline(&self, now: Instant) -> Instant {
        self.budgets
            .iter()
            .filter_map(|&(_, started, budget)| started.unwrap_or(now).checked_add(budget))
            .max()
            .unwrap_or(now)
    }
}

impl RunMemory<'_> {
    /// Before an access of `len` bytes at `addr` by the orchestration: when they are user
    /// memory, [`wait_for_executing`](Self::wait_for_executing); `false` when that wait failed.
    fn before_access(&mut self, addr: u64, len: usize, reason: &'static str) -> bool {
        let user = self.backend.find(addr, len as u64) == Some(MemPurpose::User);
        !user || self.wait_for_executing(reason)
    }

    /// Waits until the device has finished every launched run. A user allocation the
    /// orchestration reads or writes may be one an executing run still writes or reads: the
    /// access may happen only after it (`docs/pipelining.md`, "What a preparation may write").
    fn wait_for_executing(&mut self, reason: &'static str) -> bool {
        if self.ahead_failed.is_some() {
            // Once refused, every later access of the preparation is too: its run is abandoned.
            return false;
        }
        let Some(e) = self.executing.take() else { return true };
        // The wait gives each run what its own reap would: what is left of its budget, or a
        // whole one from now. So a run it gives up on has spent its budget, and the run's own
        // reap says so as well, instead of reporting success for a run named as the culprit.
        let now = Instant::now();
        let begun = e.budgets.iter().filter(|b| b.1.is_none()).map(|&(seq, _, b)| (seq, b));
        self.budgets_begun = Some((now, begun.collect()));
        let deadline = e.deadline(now);
        let limit = deadline.saturating_duration_since(now);
        for (stream, step) in SYNC_ORDER {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Err(error) = self.backend.synchronize(stream, left, e.op_execute) {
                let cause = PoisonCause { run_id: e.last, step, code: error.code() };
                self.ahead_failed = Some(FailedWait { cause, limit, stream, error });
                return false;
            }
        }
        self.waited_for = Some((e.last, reason));
        true
    }
}

impl BuildEnv for RunMemory<'_> {
    /// Kernels and the orchestration may be handed user allocations and this slot's own
    /// staging. Runtime images, kernel arguments and chip buffers are the runtime's own (a
    /// tensor pointing into them could let a kernel rewrite what the scheduler trusts); another
    /// slot's arenas belong to a run that may be executing while this one prepares. This
    /// slot's heap arena is the builder's to check, against the buffers its `alloc` handed out:
    /// the arena kept from an earlier run is freed by this run's first `alloc` when too small.
    fn device_range_ok(&self, addr: u64, len: u64) -> bool {
        match self.backend.find(addr, len) {
            Some(MemPurpose::User) => true,
            Some(MemPurpose::Staging) => self.staging.is_some_and(|a| a.holds(addr, len)),
            _ => false,
        }
    }

    // The orchestration API answers with a status code only; the typed refusal is logged. A
    // user allocation passed to the run unstaged may be written by a launched run meanwhile:
    // it is read once the device has finished those, as a write would wait.
    fn read(&mut self, addr: u64, out: &mut [u8]) -> bool {
        if !self.before_access(addr, out.len(), "the orchestration read user memory") {
            return false;
        }
        let read = self.backend.read(addr, out);
        read.inspect_err(
            |e| tracing::warn!(run = %self.run_id, error = %e, "orchestration read refused"),
        )
        .is_ok()
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> bool {
        if !self.before_access(addr, data.len(), "the orchestration wrote user memory") {
            return false;
        }
        let written = self.backend.write(addr, data);
        written
            .inspect_err(
                |e| tracing::warn!(run = %self.run_id, error = %e, "orchestration write refused"),
            )
            .is_ok()
    }

    fn heap_arena(&mut self, bytes: u64) -> Result<HeapArena, DeviceError> {
        if let Some(a) = *self.heap {
            if a.len >= bytes {
                return Ok(HeapArena { addr: a.addr, kept: true });
            }
            self.backend.free(a.addr);
            *self.heap = None;
        }
        self.misses += 1;
        let addr = self.backend.malloc(bytes, MemPurpose::HeapArena).map_err(|f| {
            self.heap_refused = true;
            oom(Some(self.run_id), bytes, MemPurpose::HeapArena, f)
        })?;
        *self.heap = Some(Arena { addr, len: bytes });
        Ok(HeapArena { addr, kept: false })
    }
}

impl Core {
    /// The error of a preparation whose orchestration could not write what it asked for: a
    /// run ahead faulted or did not finish within its whole budget, which makes the device
    /// unusable as its reap would. The run being prepared is abandoned behind that run, never
    /// failed with an error of its own. When every launched run has ended well by the time
    /// this looks (the last just after the wait ran out), none is blamed: the failed wait is
    /// the run's own, typed as a reap types its failed wait (the device's faults and the
    /// stream's report, earliest first, [`typed_sync_failure`]), and it makes the device
    /// unusable as any stream sync that timed out or faulted does, charged after every launched
    /// run, so that those still reap as the successes they were.
    pub(super) fn abandoned_behind_failed_wait(
        &mut self,
        run_id: RunId,
        failed: FailedWait,
    ) -> DeviceError {
        let device_id = self.opts.device_id;
        let Some((culprit, seq)) = self.first_unfinished_launched() else {
            let cause = failed.cause;
            let after_every_launch = self.launches.saturating_add(1);
            self.recover_or_mark_unusable(run_id, after_every_launch, cause.step, cause.code, None);
            let faults = self.backend.take_faults();
            let limits =
                WaitLimits { stream_sync: failed.limit, op_execute: self.timeouts.op_execute };
            return typed_sync_failure(run_id, failed.stream, failed.error, faults, limits, None);
        };
        let cause = PoisonCause { run_id: culprit, ..failed.cause };
        self.recover_or_mark_unusable(culprit, seq, cause.step, cause.code, None);
        DeviceError::Abandoned { run_id, after: culprit, device_id, cause }
    }

    /// The first launched run, in launch order, that has not ended well (with its launch
    /// sequence): the one a preparation whose wait for the launched runs failed names.
    pub(super) fn first_unfinished_launched(&self) -> Option<(RunId, u64)> {
        self.launched_before(u64::MAX)
            .filter(|r| r.events.is_none() || self.queued_end(r) != Some(Ok(())))
            .min_by_key(|r| r.launch_seq)
            .map(|r| (r.run_id, r.launch_seq))
    }

    /// The runs launched and not reaped, as a preparation overlapping them sees them.
    pub(super) fn executing(&self) -> Option<Executing> {
        let last = self.launched_before(u64::MAX).max_by_key(|r| r.launch_seq)?;
        let budgets = self
            .launched_before(u64::MAX)
            .map(|r| (r.launch_seq, r.reap_started.map(|(t, _)| t), self.reap_budget(r).0))
            .collect();
        Some(Executing { last: last.run_id, budgets, op_execute: self.timeouts.op_execute })
    }

    /// Allocates `bytes` of user memory.
    pub(super) fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        if bytes == 0 {
            return Err(DeviceError::InvalidArgs {
                run_id: None,
                problem: ArgsProblem::ZeroMalloc,
            });
        }
        let addr = self
            .backend
            .malloc(bytes, MemPurpose::User)
            .map_err(|f| oom(None, bytes, MemPurpose::User, f))?;
        self.user_allocs.insert(addr, bytes);
        Ok(addr)
    }

    /// Checks that `[addr, addr + len)` lies inside one user allocation.
    pub(super) fn check_user_range(&self, addr: u64, len: u64) -> Result<(), DeviceError> {
        let ok = self.user_allocs.range(..=addr).next_back().is_some_and(|(&start, &n)| {
            addr.checked_add(len).is_some_and(|end| end <= start + n) && addr < start + n.max(1)
        });
        if ok {
            Ok(())
        } else {
            Err(DeviceError::BadDevicePointer {
                run_id: None,
                arg: None,
                addr: DevicePtr(addr),
                len,
            })
        }
    }

    /// The image arena, grown when too small (any failure releases all arenas).
    pub(super) fn image_arena(
        &mut self,
        s: usize,
        run_id: RunId,
        len: u64,
    ) -> Result<u64, DeviceError> {
        if let Some(a) = self.slots[s].res.arenas.image {
            if a.len >= len {
                self.stats.arena_cache_hits += 1;
                return Ok(a.addr);
            }
            self.backend.free(a.addr);
            self.slots[s].res.arenas.image = None;
        }
        self.stats.arena_cache_misses += 1;
        let alloc_len = len.next_power_of_two().max(1 << 16);
        match self.backend.malloc(alloc_len, MemPurpose::ImageArena) {
            Ok(addr) => {
                self.slots[s].res.arenas.image = Some(Arena { addr, len: alloc_len });
                Ok(addr)
            }
            Err(f) => {
                self.release_arenas(s);
                Err(oom(Some(run_id), alloc_len, MemPurpose::ImageArena, f))
            }
        }
    }

    /// Frees the pooled arenas of slot `s` (whose run is being prepared) and of every slot
    /// without a run; a slot whose run is prepared or executing keeps its arenas.
    pub(super) fn release_arenas(&mut self, s: usize) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if i != s && slot.run.is_some() {
                continue;
            }
            let a = &mut slot.res.arenas;
            for arena in [a.heap.take(), a.image.take(), a.staging.take()].into_iter().flatten() {
                self.backend.free(arena.addr);
            }
        }
    }

    /// Preparation step 7, staging: device tensors pass through (range-checked); host tensors
    /// share one staging slice per host range (views of one tensor), filled from the host
    /// unless every view of it is a contiguous blind write over all of it, and only the bytes
    /// write-tagged views can touch are copied back. Returns the tensors the orchestration sees.
    pub(super) fn stage_tensors(
        &mut self,
        s: usize,
        req: &super::RunRequest<'_>,
        run: &mut RunState,
    ) -> Result<Vec<Tensor>, DeviceError> {
        let run_id = req.run_id;
        let mut out: Vec<Tensor> = req.args.tensors().to_vec();
        let tags = req.args.tags();
        let invalid = |problem| DeviceError::InvalidArgs { run_id: Some(run_id), problem };
        let mut total = 0u64;
        let mut ranges: Vec<HostRange> = Vec::new();
        // The range each argument stages into (`None`: device memory, null, or empty).
        let mut range_of: Vec<Option<usize>> = vec![None; out.len()];
        for (i, t) in out.iter().enumerate() {
            let tag = tags.get(i).copied().unwrap_or_default();
            if t.is_null() {
                if t.lacks_buffer_for(tag) {
                    let site = ArgSite::Chip { arg: i };
                    return Err(invalid(ArgsProblem::NullWrittenTensor { site, tag }));
                }
                continue;
            }
            t.validate().map_err(|source| DeviceError::InvalidTaskArgs {
                run_id: Some(run_id),
                arg: Some(i),
                source,
            })?;
            if t.is_child_memory() {
                if self.backend.find(t.addr, t.size) != Some(MemPurpose::User) {
                    return Err(DeviceError::BadDevicePointer {
                        run_id: Some(run_id),
                        arg: Some(i),
                        addr: DevicePtr(t.addr),
                        len: t.size,
                    });
                }
                let aliased = out[..i]
                    .iter()
                    .enumerate()
                    .filter(|(_, o)| !o.is_null() && o.is_child_memory() && o.addr != t.addr)
                    .find(|(_, o)| ranges_meet((o.addr, o.size), (t.addr, t.size)));
                if let Some((other_arg, o)) = aliased {
                    let (addr, other_addr) = (t.addr, o.addr);
                    let arg = i;
                    return Err(invalid(ArgsProblem::DeviceBaseAlias {
                        arg,
                        addr,
                        other_arg,
                        other_addr,
                    }));
                }
                continue;
            }
            if !req.allows_host_tensors() {
                return Err(invalid(ArgsProblem::HostTensorRefused { arg: i, addr: t.addr }));
            }
            if t.size == 0 {
                continue;
            }
            let k = match ranges.iter().position(|r| r.addr == t.addr && r.size == t.size) {
                Some(k) => k,
                None => {
                    if let Some(r) = ranges.iter().find(|r| r.overlaps(t.addr, t.size)) {
                        return Err(invalid(ArgsProblem::HostRangeOverlap {
                            arg: i,
                            addr: t.addr,
                            len: t.size,
                            other_addr: r.addr,
                            other_len: r.size,
                        }));
                    }
                    total = staging_bytes(t.size).and_then(|n| total.checked_add(n)).ok_or_else(
                        || {
                            let (addr, len) = (t.addr, t.size);
                            invalid(ArgsProblem::StagingOverflow { arg: i, addr, len })
                        },
                    )?;
                    ranges.push(HostRange::new(i, t.addr, t.size));
                    ranges.len() - 1
                }
            };
            let span = t
                .byte_span()
                .filter(|&(lo, hi)| lo >= t.addr && hi - t.addr <= t.size)
                .map(|(lo, hi)| (lo - t.addr, hi - t.addr));
            let r = &mut ranges[k];
            r.fill |= !t.overwrites_whole(tag, t.addr, t.size);
            if tag.writes() {
                r.written.push(span.unwrap_or((0, t.size)));
            }
            range_of[i] = Some(k);
        }
        if total == 0 {
            return Ok(out);
        }
        let base = self.staging_arena(s, run_id, total)?;
        let mut off = 0u64;
        for r in &mut ranges {
            // Cannot overflow: the first pass summed these sizes into `total` with checked ops.
            r.dev = base + off;
            off += staging_bytes(r.size).unwrap_or(0);
            if r.fill {
                // SAFETY: `with_host_tensors`' contract makes the host range readable.
                let Some(src) = (unsafe { host_slice(r.addr, r.size) }) else {
                    let (arg, addr, len) = (r.arg, r.addr, r.size);
                    return Err(invalid(ArgsProblem::StagingOverflow { arg, addr, len }));
                };
                self.backend.write(r.dev, src).map_err(|e| e.in_run(run_id))?;
            } else {
                // Every byte comes back, written or not: one the run leaves unwritten must
                // come back as zero, never as what an earlier run (or process) left in the
                // slice.
                self.backend.fill(r.dev, 0, r.size).map_err(|e| e.in_run(run_id))?;
            }
            for (lo, hi) in merged(&mut r.written) {
                run.staged.push(StagedTensor {
                    host_addr: r.addr + lo,
                    dev_addr: r.dev + lo,
                    bytes: hi - lo,
                });
            }
        }
        for (t, k) in out.iter_mut().zip(&range_of) {
            if let Some(k) = k {
                t.addr = ranges[*k].dev;
                t.child_memory = 1;
            } else if !t.is_null() && !t.is_child_memory() {
                // Empty: it touches nothing, but must name device memory like the others.
                t.addr = base;
                t.child_memory = 1;
            }
        }
        Ok(out)
    }

    fn staging_arena(&mut self, s: usize, run_id: RunId, bytes: u64) -> Result<u64, DeviceError> {
        if let Some(a) = self.slots[s].res.arenas.staging {
            if a.len >= bytes {
                return Ok(a.addr);
            }
            self.backend.free(a.addr);
            self.slots[s].res.arenas.staging = None;
        }
        match self.backend.malloc(bytes, MemPurpose::Staging) {
            Ok(addr) => {
                self.slots[s].res.arenas.staging = Some(Arena { addr, len: bytes });
                Ok(addr)
            }
            Err(f) => {
                self.release_arenas(s);
                Err(oom(Some(run_id), bytes, MemPurpose::Staging, f))
            }
        }
    }
}

/// The host copy of an image is kept for the slot's next run, unless it is larger than this:
/// one run with an unusually large graph must not pin its image's host memory for good.
pub(super) const KEEP_HOST_IMAGE_BYTES: usize = 64 << 20;

/// Gives back a host image buffer larger than [`KEEP_HOST_IMAGE_BYTES`] once it was uploaded
/// (or refused).
pub(super) fn release_oversized(host_image: &mut Vec<u8>) {
    if host_image.capacity() > KEEP_HOST_IMAGE_BYTES {
        *host_image = Vec::new();
    }
}
