//! Writes a tensormap_and_ringbuffer image: the frame every image has (header, handshake
//! records, func table, shared header), then the runtime section — [`TrbHeader`], the
//! [`TrbStatus`] the orchestration thread fills, the orchestration's arguments, the diagnostics
//! records when asked for, and the kernels' arities every submit is checked against.

use core::mem::{offset_of, size_of};
use core::sync::atomic::Ordering::{Acquire, Relaxed};

use simpler_types::constants::HEAP_RING_COUNT;
use simpler_types::{Tensor, TensorArgType};

use super::storage::ArenaLayout;
use crate::abi::image::{
    ImageLayout, ImageParams, KernelArity, READY_QUEUE_COUNT, SECTION_ALIGN, TRB_IMAGE_MAGIC,
    TRB_MESSAGE_BYTES, TrbDiagHeader, TrbHeader, TrbStatus, trb_diag_bytes,
};
use crate::runtime::hbg::image::{
    ImageInputs, frame_header, put, put_i32, put_u32, put_u64, write_frame,
};

/// What the runtime section records.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TrbImage<'a> {
    /// Device address of the orchestration entry.
    pub(crate) orch_entry: u64,
    /// Device address of a C orchestration's config function (0 for a `Native` one).
    pub(crate) orch_config: u64,
    /// `ORCH_KIND_NATIVE` or `ORCH_KIND_C`.
    pub(crate) orch_kind: u32,
    /// Device address of the arena.
    pub(crate) arena_base: u64,
    /// The arena holds what the previous run of its resource slot left (`TrbHeader::arena_kept`).
    pub(crate) arena_kept: bool,
    /// The arena's layout.
    pub(crate) arena: ArenaLayout,
    /// The orchestration's tensors, tags and scalars.
    pub(crate) tensors: &'a [Tensor],
    pub(crate) tags: &'a [TensorArgType],
    pub(crate) scalars: &'a [u64],
    /// The callable's kernels, in ascending func id.
    pub(crate) kernels: &'a [KernelArity],
    /// Scope records the diagnostics section holds (0 = none).
    pub(crate) scope_records: u32,
    /// Submit records the diagnostics section holds (0 = none).
    pub(crate) submit_records: u32,
}

/// Bytes of the orchestration's arguments: descriptors, tags, then 8-aligned scalars.
fn args_bytes(tensors: usize, scalars: usize) -> u64 {
    (132 * tensors as u64).div_ceil(8) * 8 + 8 * scalars as u64
}

/// Writes the image into `buf` (resized); `None` when the sizes overflow.
pub(crate) fn write_image(
    buf: &mut Vec<u8>,
    frame: &ImageInputs<'_>,
    trb: &TrbImage<'_>,
) -> Option<ImageLayout> {
    let head = (size_of::<TrbHeader>() + size_of::<TrbStatus>()) as u64;
    let args = args_bytes(trb.tensors.len(), trb.scalars.len());
    // The diagnostics section follows the arguments, 64-aligned.
    let diag_rel = (head + args).div_ceil(SECTION_ALIGN) * SECTION_ALIGN;
    let with_diag = trb.scope_records > 0 || trb.submit_records > 0;
    let diag = if with_diag { trb_diag_bytes(trb.scope_records, trb.submit_records) } else { 0 };
    // The kernels' arities follow, 64-aligned.
    let kernels_rel = diag_rel.checked_add(diag)?.div_ceil(SECTION_ALIGN) * SECTION_ALIGN;
    let kernels = trb.kernels.len() as u64 * size_of::<KernelArity>() as u64;
    let layout = ImageLayout::compute(&ImageParams {
        task_count: 0,
        edge_count: 0,
        args_bytes: kernels_rel.checked_add(kernels)?,
        num_aicore: 3 * frame.block_dim,
        queue_capacity: [0; READY_QUEUE_COUNT],
        swimlane_capacity: frame.swimlane_capacity,
        aicpu_swimlane_capacity: frame.aicpu_swimlane_capacity,
    })?;
    let b = crate::runtime::sized_image(buf, layout.len)?;
    let mut header = frame_header(&layout, frame, TRB_IMAGE_MAGIC, 0, 0);
    header.runtime_off = layout.args_off;
    write_frame(b, &layout, &header, frame);
    let shape = trb.arena.shape();
    let args_off = layout.args_off + head;
    let section = TrbHeader {
        orch_entry: trb.orch_entry,
        arena_base: trb.arena_base,
        arena_len: trb.arena.len,
        task_window: [0, 1, 2, 3].map(|r| shape.rings[r].task_window),
        dep_pool: [0, 1, 2, 3].map(|r| shape.rings[r].dep_pool),
        heap_bytes: [0, 1, 2, 3].map(|r| shape.rings[r].heap_bytes),
        map_entries: shape.map_entries,
        map_buckets: shape.map_buckets,
        num_tensors: trb.tensors.len() as u32,
        num_scalars: trb.scalars.len() as u32,
        args_off,
        status_off: layout.args_off + size_of::<TrbHeader>() as u64,
        diag_off: if with_diag { layout.args_off + diag_rel } else { 0 },
        orch_config: trb.orch_config,
        orch_kind: trb.orch_kind,
        arena_kept: u32::from(trb.arena_kept),
        kernels_off: layout.args_off + kernels_rel,
        kernel_count: u32::try_from(trb.kernels.len()).ok()?,
        reserved0: 0,
        reserved1: [0; 4],
    };
    put(b, layout.args_off, bytemuck::bytes_of(&section));
    if with_diag {
        let off = section.diag_off;
        put_u32(b, off + offset_of!(TrbDiagHeader, scope_capacity) as u64, trb.scope_records);
        put_u32(b, off + offset_of!(TrbDiagHeader, submit_capacity) as u64, trb.submit_records);
    }
    put(b, section.kernels_off, bytemuck::cast_slice(trb.kernels));
    let n = trb.tensors.len() as u64;
    for (i, t) in trb.tensors.iter().enumerate() {
        put(b, args_off + 128 * i as u64, &t.to_bytes());
    }
    for (i, tag) in trb.tags.iter().enumerate() {
        put_i32(b, args_off + 128 * n + 4 * i as u64, tag.as_i32());
    }
    let scalars_off = args_off + args_bytes(trb.tensors.len(), 0);
    for (i, &s) in trb.scalars.iter().enumerate() {
        put_u64(b, scalars_off + 8 * i as u64, s);
    }
    Some(layout)
}

/// What the orchestration thread reported, read after the run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TrbReport {
    /// Tasks submitted.
    pub(crate) submitted: u64,
    /// Per ring: task slots, heap bytes and dependency entries at their highest.
    pub(crate) peaks: [[u64; 3]; HEAP_RING_COUNT],
    /// Live tensor-map entries at their highest.
    pub(crate) map_peak: u64,
    /// The run reset only what the previous run over its arena used.
    pub(crate) arena_partial_reset: bool,
    /// The latched error's text.
    pub(crate) message: String,
}

impl TrbReport {
    /// Reads `status` (after both streams completed).
    pub(crate) fn read(status: &TrbStatus) -> TrbReport {
        let len = (status.message_len.load(Acquire) as usize).min(TRB_MESSAGE_BYTES);
        let bytes: Vec<u8> =
            status.message.iter().flat_map(|w| w.load(Relaxed).to_le_bytes()).collect();
        TrbReport {
            submitted: status.submitted.load(Relaxed),
            peaks: [0, 1, 2, 3].map(|r| [0, 1, 2].map(|k| status.peaks[r][k].load(Relaxed))),
            map_peak: status.map_peak.load(Relaxed),
            arena_partial_reset: status.arena_partial_reset.load(Relaxed) != 0,
            message: String::from_utf8_lossy(&bytes[..len]).into_owned(),
        }
    }
}
