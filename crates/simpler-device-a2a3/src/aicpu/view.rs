//! Typed access to a runtime image in device memory.
//!
//! The image is one region of device memory (`docs/device-chip.md`). [`ImageView::from_raw`]
//! checks its header once (magic, ABI version, every section inside the region, aligned, past
//! the header and apart from the others) and from then on hands out references to the
//! sections. This is sound because of how the image is used:
//!
//! - Plain (non-atomic) fields are written by the host before the launch and by nobody while
//!   the view exists, so shared references to them never alias a write.
//! - Every field written during the run is an atomic, so shared references are fine.
//! - The payload pairs are the exception: the owning AICPU thread writes them and the AICore
//!   reads them, ordered by the token protocol (`docs/device-handshake.md`). They are only reached through raw
//!   pointers ([`ImageView::payload_ptr`]), never through references.
//! - The swimlane records are written by their core (AICore records) or their AICPU thread
//!   (AICPU records) only and read by the host after the run; they are likewise reached through
//!   raw pointers.

use core::mem::size_of;
use core::sync::atomic::AtomicU64;

use crate::abi::handshake::Handshake;
use crate::abi::image::{
    AicpuRecord, CoreSlot, HBG_IMAGE_MAGIC, ImageHeader, KernelArity, MAX_PHASE_THREADS,
    PhaseRecord, READY_QUEUE_COUNT, ReadyQueueHeader, SECTION_ALIGN, ScopeRecord, SharedHeader,
    SubmitRecord, SwimlaneHeader, SwimlaneRecord, TRB_IMAGE_MAGIC, TaskRecord, TrbDiagHeader,
    TrbHeader, TrbStatus, aicpu_swimlane_block_bytes, launch_cores, swimlane_block_bytes,
    trb_diag_bytes,
};
use crate::abi::payload::{DispatchPayload, PayloadPair};
use crate::abi::{ABI_VERSION, MAX_FUNC_IDS, MAX_LAUNCH_CORES};

/// Why an image was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewError {
    /// The base address is null or misaligned.
    Base,
    /// The header's magic or ABI version does not match.
    Header,
    /// A section lies outside the region or is misaligned.
    Section(&'static str),
}

/// The most sections an image has: the eleven of every image, each ready queue's cells, and a
/// trb image's five.
const MAX_SECTIONS: usize = 11 + READY_QUEUE_COUNT + 5;

/// The byte ranges of an image's sections, each with whether the run writes it. A section is
/// added only past the header and apart from those added before: the view's shared references
/// to plain fields then alias no write (a zeroed or corrupted offset would put a section the
/// run writes over the header, or over another section).
#[derive(Default)]
struct Sections {
    ranges: [(u64, u64, bool); MAX_SECTIONS],
    count: usize,
}

impl Sections {
    /// Adds `[off, off + bytes)`, which the caller checked to lie inside the image, as a
    /// section the run writes (`written`) or only reads. An empty section names no bytes.
    fn add(
        &mut self,
        off: u64,
        bytes: u64,
        written: bool,
        name: &'static str,
    ) -> Result<(), ViewError> {
        if bytes == 0 {
            return Ok(());
        }
        let end = off.saturating_add(bytes);
        let apart = self.ranges[..self.count].iter().all(|&(s, e, _)| end <= s || e <= off);
        let slot = self.ranges.get_mut(self.count);
        match slot {
            Some(slot) if apart && off >= size_of::<ImageHeader>() as u64 => {
                *slot = (off, end, written);
                self.count += 1;
                Ok(())
            }
            _ => Err(ViewError::Section(name)),
        }
    }

    /// Whether `[off, end)` reaches into the header or into a section the run writes.
    fn touches_written(&self, off: u64, end: u64) -> bool {
        off < size_of::<ImageHeader>() as u64
            || self.ranges[..self.count].iter().any(|&(s, e, w)| w && off < e && s < end)
    }
}

/// A checked view of a runtime image.
#[derive(Clone, Copy, Debug)]
pub struct ImageView<'a> {
    base: *mut u8,
    header: &'a ImageHeader,
}

// SAFETY: the view only hands out shared references to plain fields nobody writes while it
// exists and to atomics, plus raw pointers whose use is governed by the dispatch protocol; the
// AICPU threads and AICore cores of one launch share it.
unsafe impl Send for ImageView<'_> {}
// SAFETY: as above; concurrent use from several threads is the point of the image.
unsafe impl Sync for ImageView<'_> {}

impl<'a> ImageView<'a> {
    /// Checks the header of the image at `base` (`len` bytes) and every task's argument block
    /// and fanout list, and returns a view.
    ///
    /// # Safety
    ///
    /// `base..base + len` must be readable and writable memory that stays valid for `'a`, laid
    /// out by the host image writer of this crate, and not written by anyone except through
    /// this view's atomics and payload pointers while the view exists (non-atomic fields are
    /// host-written before the launch only).
    pub unsafe fn from_raw(base: *mut u8, len: u64) -> Result<ImageView<'a>, ViewError> {
        // SAFETY: forwarded from the caller.
        let (view, sections) = unsafe { ImageView::from_raw_sections(base, len) }?;
        let header = view.header;
        // Every task's arguments and fanout list must lie inside the image, so later accesses
        // need no checks, and the arguments apart from the header and from every section the
        // run writes, so that the shared references to them alias no write.
        for i in 0..header.task_count {
            let t = view.task(i);
            let arg_bytes = u64::from(t.num_tensors) * 128 + u64::from(t.num_scalars) * 8;
            let end = t.args_off.checked_add(arg_bytes).ok_or(ViewError::Section("task args"))?;
            if !t.args_off.is_multiple_of(SECTION_ALIGN)
                || end > len
                || (arg_bytes > 0 && sections.touches_written(t.args_off, end))
            {
                return Err(ViewError::Section("task args"));
            }
            let fan_end = u64::from(t.fanout_start) + u64::from(t.fanout_count);
            if fan_end > u64::from(header.edge_count) {
                return Err(ViewError::Section("fanout"));
            }
        }
        Ok(view)
    }

    /// Checks the header and the sections only (constant time): each inside the image,
    /// aligned, past the header and apart from the others. The per-task checks that
    /// [`ImageView::task`]'s callers rely on are [`ImageView::from_raw`]'s.
    ///
    /// # Safety
    ///
    /// As [`ImageView::from_raw`].
    unsafe fn from_raw_sections(
        base: *mut u8,
        len: u64,
    ) -> Result<(ImageView<'a>, Sections), ViewError> {
        if base.is_null() || !(base as usize).is_multiple_of(SECTION_ALIGN as usize) {
            return Err(ViewError::Base);
        }
        if len < size_of::<ImageHeader>() as u64 {
            return Err(ViewError::Section("header"));
        }
        // SAFETY: the caller guarantees `len` readable bytes at `base`, which is 64-aligned and
        // long enough for the header (checked above); the header is plain data written by the
        // host before the launch.
        let header = unsafe { &*(base as *const ImageHeader) };
        let magic_ok = header.magic == HBG_IMAGE_MAGIC || header.magic == TRB_IMAGE_MAGIC;
        if !magic_ok || header.abi_version != ABI_VERSION {
            return Err(ViewError::Header);
        }
        // A launch has at least one block of three cores: `swimlane` and `handshake` clamp a
        // core index into `0..num_aicore`, which needs the range to be non-empty. Checked
        // before the sections, whose sizes it bounds.
        if header.block_dim == 0
            || header.num_aicore as usize > MAX_LAUNCH_CORES
            || header.block_dim.checked_mul(3) != Some(header.num_aicore)
        {
            return Err(ViewError::Section("launch shape"));
        }
        let inside = |off: u64, bytes: u64, name: &'static str| -> Result<(), ViewError> {
            let end = off.checked_add(bytes).ok_or(ViewError::Section(name))?;
            if !off.is_multiple_of(SECTION_ALIGN) || end > len || end > header.image_len {
                return Err(ViewError::Section(name));
            }
            Ok(())
        };
        let mut sections = Sections::default();
        // Whether the run writes a section: a plain field must lie in none of those.
        let (written, read) = (true, false);
        let mut check = |off: u64, bytes: u64, w: bool, name: &'static str| {
            inside(off, bytes, name)?;
            sections.add(off, bytes, w, name)
        };
        let cores = u64::from(launch_cores(header.num_aicore));
        // The writer reserves one record for an empty graph (`ImageLayout::compute`).
        let tasks = u64::from(header.task_count.max(1));
        check(header.handshake_off, cores * size_of::<Handshake>() as u64, written, "handshake")?;
        check(header.func_table_off, MAX_FUNC_IDS as u64 * 8, read, "func table")?;
        check(header.shared_off, size_of::<SharedHeader>() as u64, written, "shared header")?;
        // Task records hold the fanin counters the schedulers count down.
        check(header.tasks_off, tasks * size_of::<TaskRecord>() as u64, written, "tasks")?;
        check(header.edges_off, u64::from(header.edge_count) * 4, read, "edges")?;
        check(
            header.ready_off,
            READY_QUEUE_COUNT as u64 * size_of::<ReadyQueueHeader>() as u64,
            written,
            "ready queues",
        )?;
        check(header.cores_off, cores * size_of::<CoreSlot>() as u64, written, "core slots")?;
        check(header.payloads_off, cores * size_of::<PayloadPair>() as u64, written, "payloads")?;
        check(
            header.swimlane_off,
            u64::from(header.num_aicore) * swimlane_block_bytes(header.swimlane_capacity),
            written,
            "swimlane",
        )?;
        check(
            header.phases_off,
            MAX_PHASE_THREADS as u64 * size_of::<PhaseRecord>() as u64,
            written,
            "phases",
        )?;
        check(
            header.aicpu_swimlane_off,
            MAX_PHASE_THREADS as u64 * aicpu_swimlane_block_bytes(header.aicpu_swimlane_capacity),
            written,
            "AICPU swimlane",
        )?;
        let view = ImageView { base, header };
        if header.magic == TRB_IMAGE_MAGIC {
            check(header.runtime_off, size_of::<TrbHeader>() as u64, read, "trb header")?;
            let trb = view.trb_header_unchecked();
            check(trb.status_off, size_of::<TrbStatus>() as u64, written, "trb status")?;
            let n = u64::from(trb.num_tensors);
            let args = (n * 132).div_ceil(8) * 8 + u64::from(trb.num_scalars) * 8;
            check(trb.args_off, args, read, "trb arguments")?;
            let kernels = u64::from(trb.kernel_count) * size_of::<KernelArity>() as u64;
            check(trb.kernels_off, kernels, read, "trb kernels")?;
            if trb.diag_off != 0 {
                inside(trb.diag_off, size_of::<TrbDiagHeader>() as u64, "trb diagnostics")?;
                // SAFETY: the header was just checked to lie inside the image; plain u32
                // capacities written by the host.
                let d = unsafe { view.at::<TrbDiagHeader>(trb.diag_off) };
                let bytes = trb_diag_bytes(d.scope_capacity, d.submit_capacity);
                check(trb.diag_off, bytes, written, "trb diagnostics")?;
            }
        }
        for q in 0..READY_QUEUE_COUNT {
            let rq = view.ready_header(q);
            if rq.capacity > 0 {
                // Ready cells hold u64 values.
                check(rq.cells_off, u64::from(rq.capacity) * 8, written, "ready cells")?;
            }
        }
        Ok((view, sections))
    }

    fn trb_header_unchecked(&self) -> &'a TrbHeader {
        // SAFETY: only called after the section was checked to lie inside the image (64-byte
        // aligned); the header is plain data written by the host before the launch.
        unsafe { self.at(self.header.runtime_off) }
    }

    /// The trb runtime section, if this is a trb image.
    pub fn trb_header(&self) -> Option<&'a TrbHeader> {
        (self.header.magic == TRB_IMAGE_MAGIC).then(|| self.trb_header_unchecked())
    }

    /// The arities of the callable's kernels, in ascending func id (empty unless this is a trb
    /// image).
    pub fn trb_kernels(&self) -> &'a [KernelArity] {
        let Some(t) = self.trb_header() else { return &[] };
        // SAFETY: checked in `from_raw_sections` to lie inside the image, 64-aligned (the
        // records need 4); plain data written by the host before the launch.
        unsafe {
            core::slice::from_raw_parts(
                self.base.add(t.kernels_off as usize).cast::<KernelArity>(),
                t.kernel_count as usize,
            )
        }
    }

    /// The trb orchestration's status record, if this is a trb image.
    pub fn trb_status(&self) -> Option<&'a TrbStatus> {
        // SAFETY: checked in `from_raw_sections` for a trb image; all fields are atomics.
        self.trb_header().map(|t| unsafe { self.at(t.status_off) })
    }

    /// The trb diagnostics header and raw pointers to its scope and submit records
    /// (capacities in the header), if the image has them. Only the orchestration thread writes
    /// the records; the host reads them after the run.
    pub fn trb_diag(&self) -> Option<(&'a TrbDiagHeader, *mut ScopeRecord, *mut SubmitRecord)> {
        let off = self.trb_header()?.diag_off;
        if off == 0 {
            return None;
        }
        // SAFETY: checked in `from_raw_sections` with its records; the header's counts are
        // atomics and its capacities plain data written by the host.
        let h = unsafe { self.at::<TrbDiagHeader>(off) };
        let scopes = off + size_of::<TrbDiagHeader>() as u64;
        let submits = scopes + u64::from(h.scope_capacity) * size_of::<ScopeRecord>() as u64;
        // SAFETY: both record blocks lie inside the checked section.
        let (sp, up) = unsafe { (self.base.add(scopes as usize), self.base.add(submits as usize)) };
        Some((h, sp.cast(), up.cast()))
    }

    /// The image base as a device address.
    pub fn base_addr(&self) -> u64 {
        self.base as u64
    }

    /// The header.
    pub fn header(&self) -> &'a ImageHeader {
        self.header
    }

    /// # Safety
    /// `off..off + size_of::<T>()` must have been checked to lie inside the image and be
    /// aligned for `T`, and `T` must be plain data or atomics as described in the module docs.
    unsafe fn at<T>(&self, off: u64) -> &'a T {
        // SAFETY: guaranteed by the caller (the offsets come from the checked header).
        unsafe { &*(self.base.add(off as usize) as *const T) }
    }

    /// The shared header.
    pub fn shared(&self) -> &'a SharedHeader {
        // SAFETY: checked in `from_raw`; all fields are atomics.
        unsafe { self.at(self.header.shared_off) }
    }

    /// The index of core `w`'s records, clamped into the image's records (a `w` past the
    /// launch's cores reads the last core's).
    fn core_record(&self, w: u32) -> u64 {
        u64::from(w.min(launch_cores(self.header.num_aicore) - 1))
    }

    /// Handshake record of core `w` (< `num_aicore`).
    pub fn handshake(&self, w: u32) -> &'a Handshake {
        let w = self.core_record(w);
        // SAFETY: the section holds `launch_cores(num_aicore)` records (checked in
        // `from_raw_sections`); `w` is clamped to them.
        unsafe { self.at(self.header.handshake_off + w * size_of::<Handshake>() as u64) }
    }

    /// Device address of the kernel registered for `func_id`, 0 if none.
    pub fn func_addr(&self, func_id: u32) -> u64 {
        if func_id as usize >= MAX_FUNC_IDS {
            return 0;
        }
        // SAFETY: the func table holds 1024 host-written u64 entries (checked in `from_raw`).
        unsafe { *self.at::<u64>(self.header.func_table_off + u64::from(func_id) * 8) }
    }

    /// Task record `i` (< task count).
    pub fn task(&self, i: u32) -> &'a TaskRecord {
        debug_assert!(i < self.header.task_count, "task index {i} out of range");
        let i = u64::from(i.min(self.header.task_count.saturating_sub(1)));
        // SAFETY: the section holds `max(task_count, 1)` records (checked in `from_raw`; an
        // empty graph's image reserves one zeroed record nothing writes), and `i` is clamped
        // to at most `max(task_count, 1) - 1` (callers only pass indices read from the image,
        // which the host bounded).
        unsafe { self.at(self.header.tasks_off + i * size_of::<TaskRecord>() as u64) }
    }

    /// Fanout list of task `t` (consumer task indices).
    pub fn fanout(&self, t: &TaskRecord) -> &'a [u32] {
        // SAFETY: `fanout_start + fanout_count <= edge_count` was checked for every task in
        // `from_raw`, and the edge section holds `edge_count` host-written u32 values.
        unsafe {
            core::slice::from_raw_parts(
                self.base.add((self.header.edges_off + u64::from(t.fanout_start) * 4) as usize)
                    as *const u32,
                t.fanout_count as usize,
            )
        }
    }

    /// Device address of task `t`'s first tensor descriptor.
    pub fn tensor_args_addr(&self, t: &TaskRecord) -> u64 {
        self.base_addr() + t.args_off
    }

    /// Scalars of task `t`.
    pub fn scalars(&self, t: &TaskRecord) -> &'a [u64] {
        // SAFETY: the argument block lies inside the image (checked per task in `from_raw`);
        // scalars follow the 128-byte descriptors, so they are 8-aligned, and they are
        // host-written plain data.
        unsafe {
            core::slice::from_raw_parts(
                self.base.add((t.args_off + u64::from(t.num_tensors) * 128) as usize) as *const u64,
                t.num_scalars as usize,
            )
        }
    }

    /// Header of ready queue `q` (< `READY_QUEUE_COUNT`).
    pub fn ready_header(&self, q: usize) -> &'a ReadyQueueHeader {
        let q = q.min(READY_QUEUE_COUNT - 1) as u64;
        // SAFETY: the section holds four headers (checked in `from_raw`); `q` is clamped.
        unsafe { self.at(self.header.ready_off + q * size_of::<ReadyQueueHeader>() as u64) }
    }

    /// Cells of ready queue `q`.
    pub fn ready_cells(&self, q: usize) -> &'a [AtomicU64] {
        let h = self.ready_header(q);
        if h.capacity == 0 {
            return &[];
        }
        // SAFETY: the cells lie inside the image (checked in `from_raw`), are 64-aligned and
        // are atomics.
        unsafe {
            core::slice::from_raw_parts(
                self.base.add(h.cells_off as usize) as *const AtomicU64,
                h.capacity as usize,
            )
        }
    }

    /// Slot of core `w`.
    pub fn core_slot(&self, w: u32) -> &'a CoreSlot {
        let w = self.core_record(w);
        // SAFETY: `launch_cores(num_aicore)` slots (checked in `from_raw_sections`); `w` is
        // clamped to them; all fields are atomics.
        unsafe { self.at(self.header.cores_off + w * size_of::<CoreSlot>() as u64) }
    }

    /// Device address of core `w`'s payload pair.
    pub fn payload_pair_addr(&self, w: u32) -> u64 {
        let w = self.core_record(w);
        self.base_addr() + self.header.payloads_off + w * size_of::<PayloadPair>() as u64
    }

    /// Raw pointer to payload `which` (0 or 1) of core `w`; see the module docs for who may
    /// write and read through it.
    pub fn payload_ptr(&self, w: u32, which: u32) -> *mut DispatchPayload {
        (self.payload_pair_addr(w) + u64::from(which & 1) * size_of::<DispatchPayload>() as u64)
            as *mut DispatchPayload
    }

    /// Swimlane header of core `w` (< `num_aicore`) and a raw pointer to its records
    /// (capacity in the header).
    pub fn swimlane(&self, w: u32) -> (&'a SwimlaneHeader, *mut SwimlaneRecord) {
        let w = u64::from(w.min(self.header.num_aicore.saturating_sub(1)));
        let off =
            self.header.swimlane_off + w * swimlane_block_bytes(self.header.swimlane_capacity);
        // SAFETY: `num_aicore ≥ 3` blocks of at least a header each lie inside the image
        // (checked in `from_raw_sections`, which refuses `block_dim == 0`); `w` is clamped into
        // `0..num_aicore`; the header is atomics.
        let header = unsafe { self.at::<SwimlaneHeader>(off) };
        // SAFETY: the records follow the 64-byte header inside the same checked block.
        let records = unsafe { self.base.add((off + size_of::<SwimlaneHeader>() as u64) as usize) }
            as *mut SwimlaneRecord;
        (header, records)
    }

    /// AICPU dispatch-record header of thread `t` (< 4) and a raw pointer to its records
    /// (capacity in the image header); only thread `t` writes them.
    pub fn aicpu_swimlane(&self, t: u32) -> (&'a SwimlaneHeader, *mut AicpuRecord) {
        let t = (t as usize).min(MAX_PHASE_THREADS - 1) as u64;
        let off = self.header.aicpu_swimlane_off
            + t * aicpu_swimlane_block_bytes(self.header.aicpu_swimlane_capacity);
        // SAFETY: four blocks lie inside the image (checked in `from_raw`); `t` is clamped; the
        // header is atomics.
        let header = unsafe { self.at::<SwimlaneHeader>(off) };
        // SAFETY: the records follow the 64-byte header inside the same checked block.
        let records = unsafe { self.base.add((off + size_of::<SwimlaneHeader>() as u64) as usize) }
            as *mut AicpuRecord;
        (header, records)
    }

    /// Phase record of AICPU thread `t` (< 4).
    pub fn phase(&self, t: u32) -> &'a PhaseRecord {
        let t = (t as usize).min(MAX_PHASE_THREADS - 1) as u64;
        // SAFETY: four records (checked in `from_raw`); `t` is clamped; all fields are atomics.
        unsafe { self.at(self.header.phases_off + t * size_of::<PhaseRecord>() as u64) }
    }
}

/// The part of a runtime image an AICore core uses: header, handshake records, payload
/// pairs and swimlane blocks.
///
/// Building it checks the header and the section bounds but not the task records: those
/// checks take time proportional to the task count, only the task accessors of
/// [`ImageView`] rely on them, and all `3 · block_dim` cores would repeat them at every
/// launch (at block_dim 8 and 10 000 tasks, 24 walks over the task section per run). Not
/// exposing the task accessors keeps the skipped checks from mattering.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CoreImageView<'a> {
    view: ImageView<'a>,
}

impl<'a> CoreImageView<'a> {
    /// Checks the header and section bounds of the image at `base` (`len` bytes).
    ///
    /// # Safety
    ///
    /// As [`ImageView::from_raw`].
    pub(crate) unsafe fn from_raw(base: *mut u8, len: u64) -> Result<CoreImageView<'a>, ViewError> {
        // SAFETY: forwarded from the caller.
        unsafe { ImageView::from_raw_sections(base, len) }.map(|(view, _)| CoreImageView { view })
    }

    /// The header.
    pub(crate) fn header(&self) -> &'a ImageHeader {
        self.view.header()
    }

    /// The shared header (the run's abort flag).
    pub(crate) fn shared(&self) -> &'a SharedHeader {
        self.view.shared()
    }

    /// Handshake record of core `w` (< `num_aicore`).
    pub(crate) fn handshake(&self, w: u32) -> &'a Handshake {
        self.view.handshake(w)
    }

    /// Device address of core `w`'s payload pair.
    pub(crate) fn payload_pair_addr(&self, w: u32) -> u64 {
        self.view.payload_pair_addr(w)
    }

    /// Raw pointer to payload `which` (0 or 1) of core `w`.
    pub(crate) fn payload_ptr(&self, w: u32, which: u32) -> *mut DispatchPayload {
        self.view.payload_ptr(w, which)
    }

    /// Swimlane header of core `w` and a raw pointer to its records.
    pub(crate) fn swimlane(&self, w: u32) -> (&'a SwimlaneHeader, *mut SwimlaneRecord) {
        self.view.swimlane(w)
    }
}

/// The host's view of a runtime image after (or before) a launch: header, shared header,
/// handshake records, phase records and the swimlane sections — the one decoder the runner and
/// the diagnostics read the image with.
///
/// Like [`CoreImageView`] it checks the header and the section bounds only. The host builds it
/// over the image's host mapping when no device thread runs: before the launch (to clear the
/// handshake records) and after both streams completed or drained (to read the results), so
/// the records written during the run are complete and nobody writes them while it reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostImageView<'a> {
    view: ImageView<'a>,
}

impl<'a> HostImageView<'a> {
    /// Checks the header and section bounds of the image at `base` (`len` bytes).
    ///
    /// # Safety
    ///
    /// As [`ImageView::from_raw`], and no device thread may run the image while the view
    /// exists (so the swimlane records it reads are not being written).
    pub(crate) unsafe fn from_raw(base: *mut u8, len: u64) -> Result<HostImageView<'a>, ViewError> {
        // SAFETY: forwarded from the caller.
        unsafe { ImageView::from_raw_sections(base, len) }.map(|(view, _)| HostImageView { view })
    }

    /// The header.
    pub(crate) fn header(&self) -> &'a ImageHeader {
        self.view.header()
    }

    /// The shared header.
    pub(crate) fn shared(&self) -> &'a SharedHeader {
        self.view.shared()
    }

    /// Handshake record of core `c` (< `num_aicore`).
    pub(crate) fn handshake(&self, c: u32) -> &'a Handshake {
        self.view.handshake(c)
    }

    /// Phase record of AICPU thread `t` (< 4).
    pub(crate) fn phase(&self, t: u32) -> &'a PhaseRecord {
        self.view.phase(t)
    }

    /// The trb orchestration's status record, if this is a trb image.
    pub(crate) fn trb_status(&self) -> Option<&'a TrbStatus> {
        self.view.trb_status()
    }

    /// The trb diagnostics header and its scope and submit record blocks, if the image has a
    /// diagnostics section; no device thread writes them while this view exists.
    pub(crate) fn trb_diag(
        &self,
    ) -> Option<(&'a TrbDiagHeader, *const ScopeRecord, *const SubmitRecord)> {
        self.view.trb_diag().map(|(h, s, u)| (h, s.cast_const(), u.cast_const()))
    }

    /// The swimlane records core `c` (< `num_aicore`) wrote, and how many it dropped.
    pub(crate) fn swimlane_records(
        &self,
        c: u32,
    ) -> (impl Iterator<Item = SwimlaneRecord> + 'a, u32) {
        use core::sync::atomic::Ordering::Acquire;
        let cap = self.header().swimlane_capacity;
        let (h, records) = self.view.swimlane(c);
        let live = cap > 0 && c < self.header().num_aicore;
        let n = if live { h.count.load(Acquire).min(cap) as usize } else { 0 };
        // SAFETY: the first `n ≤ capacity` records lie inside core `c`'s checked block, were
        // written by that core before it bumped `count`, and no device thread runs (the
        // constructor's contract); records are plain data read by value.
        let read = (0..n).map(move |i| unsafe { records.add(i).read() });
        (read, if live { h.dropped.load(Acquire) } else { 0 })
    }

    /// The AICPU dispatch records thread `t` (< 4) wrote.
    pub(crate) fn aicpu_records(&self, t: u32) -> impl Iterator<Item = AicpuRecord> + 'a {
        use core::sync::atomic::Ordering::Acquire;
        let cap = self.header().aicpu_swimlane_capacity;
        let (h, records) = self.view.aicpu_swimlane(t);
        let live = cap > 0 && (t as usize) < MAX_PHASE_THREADS;
        let n = if live { h.count.load(Acquire).min(cap) as usize } else { 0 };
        // SAFETY: as in `swimlane_records`, for thread `t`'s checked block.
        (0..n).map(move |i| unsafe { records.add(i).read() })
    }

    /// The AICPU records thread `t` (< 4) could not store.
    pub(crate) fn aicpu_dropped(&self, t: u32) -> u32 {
        use core::sync::atomic::Ordering::Acquire;
        let live = self.header().aicpu_swimlane_capacity > 0 && (t as usize) < MAX_PHASE_THREADS;
        if live { self.view.aicpu_swimlane(t).0.dropped.load(Acquire) } else { 0 }
    }
}

/// A push-once multi-producer, multi-consumer queue over one ready-queue section.
///
/// Protocol (every task block enters at most one queue at most once per run, so cells are
/// never reused within a run):
///
/// 1. Push: `i = tail.fetch_add(1)`; store `value + 1` into cell `i` with release.
/// 2. Pop: read `head`; if `head >= tail` the queue is empty; load cell `head` with acquire; 0
///    means its pusher reserved it but has not stored yet, so report empty for now (the pusher
///    notifies after storing); otherwise CAS `head` from `head` to `head + 1` and, on success,
///    own the value.
#[derive(Clone, Copy, Debug)]
pub struct ReadyQueue<'a> {
    header: &'a ReadyQueueHeader,
    cells: &'a [AtomicU64],
}

impl<'a> ReadyQueue<'a> {
    /// Queue `q` of `view`.
    pub fn of(view: &ImageView<'a>, q: usize) -> ReadyQueue<'a> {
        ReadyQueue { header: view.ready_header(q), cells: view.ready_cells(q) }
    }

    /// Empties the queue (boot step; no other thread uses it yet).
    pub fn reset(&self) {
        use core::sync::atomic::Ordering::Relaxed;
        // Relaxed: the boot thread publishes the reset queues with the release store of
        // `ready_published`, which every other thread acquires before touching a queue.
        self.header.head.store(0, Relaxed);
        self.header.tail.store(0, Relaxed);
        for c in self.cells {
            c.store(0, Relaxed);
        }
    }

    /// Pushes `value` (any value except `u64::MAX`); `false` if the queue is full, which the
    /// host's sizing rules out.
    pub fn push(&self, value: u64) -> bool {
        use core::sync::atomic::Ordering::{AcqRel, Release};
        // AcqRel: reserving a cell needs no ordering with other data, but pairing with the
        // popper's load of `tail` keeps the reasoning simple; the value itself is published by
        // the release store below.
        let i = self.header.tail.fetch_add(1, AcqRel) as usize;
        match self.cells.get(i) {
            Some(cell) => {
                cell.store(value + 1, Release);
                true
            }
            None => false,
        }
    }

    /// Pops one value, if one is published.
    pub fn pop(&self) -> Option<u64> {
        use core::sync::atomic::Ordering::{AcqRel, Acquire};
        loop {
            let head = self.header.head.load(Acquire);
            let tail = self.header.tail.load(Acquire);
            if head >= tail || head as usize >= self.cells.len() {
                return None;
            }
            // Acquire pairs with the pusher's release store: the task record writes made before
            // the push are visible once the value is.
            let v = self.cells[head as usize].load(Acquire);
            if v == 0 {
                return None;
            }
            if self.header.head.compare_exchange_weak(head, head + 1, AcqRel, Acquire).is_ok() {
                return Some(v - 1);
            }
        }
    }

    /// Values pushed and not yet popped (a snapshot).
    pub fn len(&self) -> u32 {
        use core::sync::atomic::Ordering::Relaxed;
        // Relaxed: used only for stall statistics.
        self.header.tail.load(Relaxed).saturating_sub(self.header.head.load(Relaxed))
    }

    /// Whether the snapshot length is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Empty-graph images for tests of the view and of its readers.
#[cfg(test)]
pub(crate) mod test_image {
    use crate::abi::ABI_VERSION;
    use crate::abi::image::{
        HBG_IMAGE_MAGIC, ImageHeader, ImageLayout, ImageParams, READY_QUEUE_COUNT,
    };

    /// Section-aligned backing memory for a test image.
    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    pub(crate) struct Block([u8; 64]);

    /// A zeroed empty-graph image laid out for `layout_cores` cores whose header claims
    /// `block_dim` and `num_aicore`; its length in bytes is `64 * len()`.
    pub(crate) fn empty(layout_cores: u32, block_dim: u32, num_aicore: u32) -> Vec<Block> {
        let l = ImageLayout::compute(&ImageParams {
            task_count: 0,
            edge_count: 0,
            args_bytes: 0,
            num_aicore: layout_cores,
            queue_capacity: [0; READY_QUEUE_COUNT],
            swimlane_capacity: 0,
            aicpu_swimlane_capacity: 0,
        })
        .unwrap();
        let header = ImageHeader {
            magic: HBG_IMAGE_MAGIC,
            abi_version: ABI_VERSION,
            image_len: l.len.div_ceil(64) * 64,
            block_dim,
            num_aicore,
            handshake_off: l.handshake_off,
            func_table_off: l.func_table_off,
            shared_off: l.shared_off,
            tasks_off: l.tasks_off,
            edges_off: l.edges_off,
            ready_off: l.ready_off,
            cores_off: l.cores_off,
            payloads_off: l.payloads_off,
            swimlane_off: l.swimlane_off,
            phases_off: l.phases_off,
            aicpu_swimlane_off: l.aicpu_swimlane_off,
            ..ImageHeader::default()
        };
        let mut mem = vec![Block([0; 64]); (l.len as usize).div_ceil(64)];
        let bytes = bytemuck::bytes_of(&header);
        // SAFETY: `mem` holds at least `l.len ≥ size_of::<ImageHeader>()` bytes.
        unsafe {
            core::ptr::copy_nonoverlapping(bytes.as_ptr(), mem.as_mut_ptr().cast(), bytes.len())
        };
        mem
    }

    /// Lets `edit` change the header of the image in `mem`, given the image's bytes too (for
    /// the sections the header places).
    pub(crate) fn edit(mem: &mut [Block], edit: impl FnOnce(&mut ImageHeader, &mut [u8])) {
        let len = mem.len() * 64;
        // SAFETY: a block is 64 plain bytes; the slice covers exactly the blocks of `mem`.
        let bytes: &mut [u8] =
            unsafe { core::slice::from_raw_parts_mut(mem.as_mut_ptr().cast(), len) };
        let head = size_of::<ImageHeader>();
        let mut header: ImageHeader = bytemuck::pod_read_unaligned(&bytes[..head]);
        edit(&mut header, bytes);
        bytes[..head].copy_from_slice(bytemuck::bytes_of(&header));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::image::{ImageLayout, ImageParams};

    /// A zeroed image whose header has a consistent layout for `num_aicore` cores and claims
    /// `block_dim`, checked by `HostImageView::from_raw`.
    fn host_view_of(block_dim: u32, num_aicore: u32) -> Result<(), ViewError> {
        image_laid_out_for(num_aicore, block_dim, num_aicore)
    }

    /// A view of an image laid out for `layout_cores` cores whose header claims `block_dim`
    /// and `num_aicore`.
    fn image_laid_out_for(
        layout_cores: u32,
        block_dim: u32,
        num_aicore: u32,
    ) -> Result<(), ViewError> {
        let mut mem = test_image::empty(layout_cores, block_dim, num_aicore);
        let len = (mem.len() * 64) as u64;
        // SAFETY: `mem` is `len` zeroed (but for the header), 64-aligned bytes that outlive
        // the view, and nothing else touches them meanwhile.
        let view = unsafe { HostImageView::from_raw(mem.as_mut_ptr().cast(), len) }?;
        // Core 0's swimlane header must lie inside the checked section.
        let (records, dropped) = view.swimlane_records(0);
        assert_eq!((records.count(), dropped), (0, 0));
        Ok(())
    }

    /// An empty-graph image for one block whose header `edit` changes, checked as a whole.
    fn edited(edit: impl FnOnce(&mut ImageHeader, &mut [u8])) -> Result<(), ViewError> {
        let mut mem = test_image::empty(3, 1, 3);
        test_image::edit(&mut mem, edit);
        let len = (mem.len() * 64) as u64;
        // SAFETY: `mem` is `len` 64-aligned bytes that outlive the view, touched only through
        // it meanwhile.
        unsafe { ImageView::from_raw(mem.as_mut_ptr().cast(), len) }.map(drop)
    }

    #[test]
    fn a_section_over_the_header_or_over_another_section_is_refused() {
        assert_eq!(edited(|_, _| {}), Ok(()));
        // A zeroed offset: the payloads the schedulers write would be the header.
        assert_eq!(edited(|h, _| h.payloads_off = 0), Err(ViewError::Section("payloads")));
        // Two sections the run writes, over each other.
        let over_handshake = |h: &mut ImageHeader, _: &mut [u8]| h.payloads_off = h.handshake_off;
        assert_eq!(edited(over_handshake), Err(ViewError::Section("payloads")));
        let over_tasks = |h: &mut ImageHeader, _: &mut [u8]| h.cores_off = h.tasks_off;
        assert_eq!(edited(over_tasks), Err(ViewError::Section("core slots")));
    }

    #[test]
    fn task_arguments_in_a_section_the_run_writes_are_refused() {
        // The empty graph's one reserved record, made a task with six scalars.
        let task_with_args_at = |at: fn(&ImageHeader) -> u64| {
            move |h: &mut ImageHeader, bytes: &mut [u8]| {
                h.task_count = 1;
                let record = h.tasks_off as usize;
                let scalars = record + core::mem::offset_of!(TaskRecord, num_scalars);
                bytes[scalars..scalars + 4].copy_from_slice(&6u32.to_le_bytes());
                let args = record + core::mem::offset_of!(TaskRecord, args_off);
                bytes[args..args + 8].copy_from_slice(&at(h).to_le_bytes());
            }
        };
        assert_eq!(edited(task_with_args_at(|h| h.func_table_off)), Ok(()), "a read-only section");
        let refused = Err(ViewError::Section("task args"));
        assert_eq!(edited(task_with_args_at(|h| h.payloads_off)), refused);
        assert_eq!(edited(task_with_args_at(|_| 0)), refused, "the header");
    }

    #[test]
    fn a_launch_shape_without_cores_or_with_an_overflowing_core_count_is_refused() {
        assert_eq!(host_view_of(1, 3), Ok(()));
        assert_eq!(host_view_of(24, 72), Ok(()));
        // No cores: the swimlane section is empty, so no core index can be clamped into it.
        assert_eq!(host_view_of(0, 0), Err(ViewError::Section("launch shape")));
        // `3 * block_dim` wraps to 2 in u32.
        assert_eq!(host_view_of(0x5555_5556, 2), Err(ViewError::Section("launch shape")));
    }

    #[test]
    fn a_header_claiming_more_cores_than_its_records_hold_is_refused() {
        assert_eq!(image_laid_out_for(6, 2, 6), Ok(()));
        // Laid out for one block, the header claims two: the per-core sections are too short
        // (or overlap the next section) for the cores it names.
        assert!(image_laid_out_for(3, 2, 6).is_err());
        assert!(image_laid_out_for(3, 24, 72).is_err());
    }

    #[test]
    fn an_empty_graphs_task_section_still_holds_the_record_a_clamped_index_reads() {
        let p = ImageParams {
            task_count: 0,
            edge_count: 0,
            args_bytes: 0,
            num_aicore: 3,
            queue_capacity: [0; READY_QUEUE_COUNT],
            swimlane_capacity: 0,
            aicpu_swimlane_capacity: 0,
        };
        let l = ImageLayout::compute(&p).unwrap();
        // `task(0)` on an empty graph reads the record at `tasks_off`: it must not be the start
        // of the next section.
        assert!(
            l.tasks_off + size_of::<TaskRecord>() as u64 <= l.edges_off,
            "task section {} .. edges at {}",
            l.tasks_off,
            l.edges_off
        );
    }
}
