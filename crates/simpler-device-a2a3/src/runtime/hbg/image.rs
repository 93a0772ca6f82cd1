//! Writes a built graph into the host_build_graph image layout (`abi::image`).
//!
//! The image is written into a host buffer the runner keeps across runs and then uploaded byte
//! for byte; internal references are offsets, so nothing is relocated. The plain header is
//! copied as its bytes; the records that contain atomics are written field by field at their
//! `offset_of!` positions, which needs no raw-pointer access.
//!
//! Step labels (P1–P18, L1–L3, R1–R3, C1–C3) are the run-lifecycle steps defined in
//! `docs/device-runner.md`.

use std::mem::{offset_of, size_of};

use simpler_types::DeviceTaskId;

use super::builder::BuiltGraph;
use crate::abi::handshake::Handshake;
use crate::abi::image::{
    HBG_IMAGE_MAGIC, ImageHeader, ImageLayout, ImageParams, NO_FUNC, READY_QUEUE_COUNT,
    ReadyQueueHeader, SECTION_ALIGN, SharedHeader, TaskRecord, TaskShape, launch_cores,
};
use crate::abi::{ABI_VERSION, CoreType, MAX_FUNC_IDS};

/// Launch facts the image records.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ImageInputs<'a> {
    pub(crate) block_dim: u32,
    pub(crate) aicpu_threads: u32,
    pub(crate) profiling: u32,
    pub(crate) swimlane_capacity: u32,
    pub(crate) swimlane_level: u32,
    pub(crate) aicpu_swimlane_capacity: u32,
    pub(crate) active_callable: u64,
    /// Kernel entry address per func id (0 = unset); at most 1024 entries.
    pub(crate) func_table: &'a [u64],
}

pub(crate) fn put(buf: &mut [u8], off: u64, bytes: &[u8]) {
    let start = off as usize;
    match buf.get_mut(start..start + bytes.len()) {
        Some(dst) => dst.copy_from_slice(bytes),
        None => debug_assert!(false, "image write at {off} outside the layout"),
    }
}

pub(crate) fn put_u32(buf: &mut [u8], off: u64, v: u32) {
    put(buf, off, &v.to_le_bytes());
}

pub(crate) fn put_i32(buf: &mut [u8], off: u64, v: i32) {
    put(buf, off, &v.to_le_bytes());
}

pub(crate) fn put_u64(buf: &mut [u8], off: u64, v: u64) {
    put(buf, off, &v.to_le_bytes());
}

fn align(v: u64) -> u64 {
    v.div_ceil(SECTION_ALIGN) * SECTION_ALIGN
}

fn members(funcs: &[i32; 3], shape: TaskShape) -> u32 {
    match shape {
        TaskShape::Dummy => 1,
        _ => funcs.iter().filter(|&&f| f != NO_FUNC).count() as u32,
    }
}

/// Total member dispatches of the graph (an upper bound of any core's swimlane records).
pub(crate) fn total_dispatches(g: &BuiltGraph) -> u64 {
    g.tasks
        .iter()
        .filter(|t| t.shape != TaskShape::Dummy)
        .map(|t| u64::from(t.block_num) * u64::from(members(&t.func_ids, t.shape)))
        .sum()
}

/// The header of an image of `layout` whose magic names the runtime.
pub(crate) fn frame_header(
    layout: &ImageLayout,
    inp: &ImageInputs<'_>,
    magic: u32,
    task_count: u32,
    edge_count: u32,
) -> ImageHeader {
    ImageHeader {
        magic,
        abi_version: ABI_VERSION,
        image_len: layout.len,
        block_dim: inp.block_dim,
        num_aicore: 3 * inp.block_dim,
        aicpu_threads: inp.aicpu_threads,
        task_count,
        edge_count,
        profiling: inp.profiling,
        active_callable: inp.active_callable,
        handshake_off: layout.handshake_off,
        func_table_off: layout.func_table_off,
        shared_off: layout.shared_off,
        tasks_off: layout.tasks_off,
        edges_off: layout.edges_off,
        ready_off: layout.ready_off,
        cores_off: layout.cores_off,
        payloads_off: layout.payloads_off,
        swimlane_off: layout.swimlane_off,
        swimlane_capacity: inp.swimlane_capacity,
        swimlane_level: inp.swimlane_level,
        phases_off: layout.phases_off,
        aicpu_swimlane_off: layout.aicpu_swimlane_off,
        aicpu_swimlane_capacity: inp.aicpu_swimlane_capacity,
        ..ImageHeader::default()
    }
}

/// Writes the parts every runtime's image shares: the header, the pre-typed handshake
/// records (L1, P6), the func table and the shared header's "none" markers.
pub(crate) fn write_frame(
    b: &mut [u8],
    layout: &ImageLayout,
    header: &ImageHeader,
    inp: &ImageInputs<'_>,
) {
    put(b, 0, bytemuck::bytes_of(header));
    for w in 0..launch_cores(header.num_aicore) {
        let ty = if w < inp.block_dim { CoreType::Aic } else { CoreType::Aiv };
        let off = layout.handshake_off + u64::from(w) * size_of::<Handshake>() as u64;
        put_u32(b, off + offset_of!(Handshake, core_type) as u64, ty as u32);
    }
    // One pass over the section rather than a bounds-checked write per entry: the table is
    // half the image of a small graph.
    let table = &inp.func_table[..inp.func_table.len().min(MAX_FUNC_IDS)];
    let start = layout.func_table_off as usize;
    match b.get_mut(start..start + 8 * table.len()) {
        Some(dst) => {
            for (d, addr) in dst.chunks_exact_mut(8).zip(table) {
                d.copy_from_slice(&addr.to_le_bytes());
            }
        }
        None => debug_assert!(false, "function table outside the layout"),
    }
    put_u32(b, layout.shared_off + offset_of!(SharedHeader, fault_ring) as u64, u32::MAX);
    put_u64(b, layout.shared_off + offset_of!(SharedHeader, stuck_task) as u64, u64::MAX);
}

/// The per-task tables `write_image` computes, kept by the runtime so a stream of runs writes
/// its images without allocating.
#[derive(Debug, Default)]
pub(crate) struct ImageScratch {
    arg_offs: Vec<u64>,
    fan_count: Vec<u32>,
    fan_start: Vec<u32>,
    fill: Vec<u32>,
}

/// Writes the image of `g` into `buf` (resized); returns its layout, or `None` when the sizes
/// overflow.
pub(crate) fn write_image(
    buf: &mut Vec<u8>,
    g: &BuiltGraph,
    inp: &ImageInputs<'_>,
    scratch: &mut ImageScratch,
) -> Option<ImageLayout> {
    let n = g.tasks.len();
    let task_count = u32::try_from(n).ok()?;
    let ImageScratch { arg_offs, fan_count, fan_start, fill } = scratch;
    // Per-task argument blocks.
    arg_offs.clear();
    let mut args_bytes = 0u64;
    for t in &g.tasks {
        arg_offs.push(args_bytes);
        let bytes = 128 * t.tensors.len() as u64 + 8 * t.scalars.len() as u64;
        args_bytes = args_bytes.checked_add(align(bytes))?;
    }
    // Fanout lists (CSR by producer).
    fan_count.clear();
    fan_count.resize(n, 0);
    for &p in g.tasks.iter().flat_map(|t| g.preds_of(t)) {
        if let Some(c) = fan_count.get_mut(p as usize) {
            *c += 1;
        }
    }
    fan_start.clear();
    let mut acc = 0u32;
    for c in fan_count.iter() {
        fan_start.push(acc);
        acc = acc.checked_add(*c)?;
    }
    let edge_count = acc;
    let mut queue_capacity = [0u32; READY_QUEUE_COUNT];
    for t in &g.tasks {
        let blocks = if t.shape == TaskShape::Dummy { 1 } else { t.block_num };
        let q = &mut queue_capacity[t.shape as usize];
        *q = q.checked_add(blocks)?;
    }
    let layout = ImageLayout::compute(&ImageParams {
        task_count,
        edge_count,
        args_bytes,
        num_aicore: 3 * inp.block_dim,
        queue_capacity,
        swimlane_capacity: inp.swimlane_capacity,
        aicpu_swimlane_capacity: inp.aicpu_swimlane_capacity,
    })?;
    let b = crate::runtime::sized_image(buf, layout.len)?;

    let header = frame_header(&layout, inp, HBG_IMAGE_MAGIC, task_count, edge_count);
    write_frame(b, &layout, &header, inp);

    // Tasks, arguments, fanout.
    fill.clear();
    fill.extend_from_slice(fan_start);
    for (i, t) in g.tasks.iter().enumerate() {
        let off = layout.tasks_off + i as u64 * size_of::<TaskRecord>() as u64;
        let f = |field: usize| off + field as u64;
        put_u64(b, f(offset_of!(TaskRecord, task_id)), DeviceTaskId::new(0, i as u32).0);
        for (k, id) in t.func_ids.iter().enumerate() {
            put_i32(b, f(offset_of!(TaskRecord, func_ids)) + 4 * k as u64, *id);
        }
        put_u32(b, f(offset_of!(TaskRecord, shape)), t.shape as u32);
        put_u32(b, f(offset_of!(TaskRecord, block_num)), t.block_num);
        put_u32(b, f(offset_of!(TaskRecord, num_tensors)), t.tensors.len() as u32);
        put_u32(b, f(offset_of!(TaskRecord, num_scalars)), t.scalars.len() as u32);
        let preds = g.preds_of(t);
        put_u32(b, f(offset_of!(TaskRecord, fanin_count)), preds.len() as u32);
        put_u32(b, f(offset_of!(TaskRecord, fanout_start)), fan_start[i]);
        put_u32(b, f(offset_of!(TaskRecord, fanout_count)), fan_count[i]);
        let args_off = layout.args_off + arg_offs[i];
        put_u64(b, f(offset_of!(TaskRecord, args_off)), args_off);
        put_u32(b, f(offset_of!(TaskRecord, fanin_refcount)), preds.len() as u32);
        let blocks = if t.shape == TaskShape::Dummy { 1 } else { t.block_num };
        put_u32(
            b,
            f(offset_of!(TaskRecord, members_remaining)),
            blocks * members(&t.func_ids, t.shape),
        );
        for (k, tensor) in g.tensors[t.tensors.clone()].iter().enumerate() {
            put(b, args_off + 128 * k as u64, &tensor.to_bytes());
        }
        let scalars_off = args_off + 128 * t.tensors.len() as u64;
        for (k, s) in g.scalars[t.scalars.clone()].iter().enumerate() {
            put_u64(b, scalars_off + 8 * k as u64, *s);
        }
        for &p in preds {
            let slot = &mut fill[p as usize];
            put_u32(b, layout.edges_off + 4 * u64::from(*slot), i as u32);
            *slot += 1;
        }
    }

    // Ready-queue headers.
    for (q, cap) in queue_capacity.iter().enumerate() {
        let off = layout.ready_off + q as u64 * size_of::<ReadyQueueHeader>() as u64;
        put_u32(b, off + offset_of!(ReadyQueueHeader, capacity) as u64, *cap);
        put_u64(b, off + offset_of!(ReadyQueueHeader, cells_off) as u64, layout.ready_cells_off[q]);
    }
    Some(layout)
}
