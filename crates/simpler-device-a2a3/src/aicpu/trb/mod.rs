//! The tensormap_and_ringbuffer side of `exec` (`docs/device-trb.md`).
//!
//! With `N` AICPU threads, thread `N − 1` orchestrates and threads `0 … N − 2` schedule:
//!
//! 1. The orchestration thread builds the engine over the arena the image names (which resets
//!    what a run reads), publishes "runtime ready" (`ready_published`, release) and calls the
//!    orchestration through the trb ops table. A submit that must wait for room idles on the
//!    platform's wait; a stall or an invalid call latches a runtime code, its message and the
//!    failing ring's sizes and usage. When the orchestration returns, the thread closes the
//!    outer scope, stores the task count and sets `orch_done` (release), then waits for every
//!    task to complete and records the rings' high-water marks.
//! 2. Every scheduler thread `t` owns clusters `t, t + N − 1, …`, handshakes their cores, waits
//!    for "runtime ready" (spin, then park), then loops: poll its busy cores' `COND`, complete
//!    tasks whose last member finished (which may make consumers ready), and dispatch ready
//!    tasks it popped to its idle cores. A thread without cores pops nothing.
//! 3. The run ends when `orch_done` is set and every submitted task completed, when a runtime
//!    code is latched, a thread aborted, or the platform says stop; a scheduler whose run made
//!    no progress for the scheduler budget latches SCHEDULER_TIMEOUT, as under
//!    host_build_graph.

mod orchestration;
mod record;
mod schedule;

use core::sync::atomic::Ordering::Relaxed;

use orchestration::orchestrate;
use schedule::schedule;

use super::AicpuPlatform;
use super::view::ImageView;
use crate::abi::MAX_AICPU_THREADS;
use crate::abi::image::{ImageHeader, TrbHeader};
use crate::abi::launch::InitArgs;
use crate::aicpu::scheduler::TICKS_PER_MS;
use crate::runtime::trb::sizing::{MAX_TASK_WINDOW, RingSizes};
use crate::runtime::trb::storage::{ArenaLayout, ArenaShape};

/// `exec` result: clean shutdown (the run's outcome is in the latched status).
const EXEC_OK: i32 = super::EXEC_OK;

/// The arena layout the runtime section describes, if it is usable.
fn layout_of(t: &TrbHeader) -> Option<ArenaLayout> {
    let rings = [0, 1, 2, 3].map(|r| RingSizes {
        task_window: t.task_window[r],
        heap_bytes: t.heap_bytes[r],
        dep_pool: t.dep_pool[r],
    });
    let usable = rings.iter().all(|s| {
        (4..=MAX_TASK_WINDOW).contains(&s.task_window)
            && s.task_window.is_power_of_two()
            && s.heap_bytes > 0
            && s.heap_bytes.is_multiple_of(1024)
            && s.dep_pool >= 4
    }) && t.map_buckets.is_power_of_two()
        && t.arena_base != 0
        && t.arena_base.is_multiple_of(1024);
    if !usable {
        return None;
    }
    let shape = ArenaShape { rings, map_entries: t.map_entries, map_buckets: t.map_buckets };
    ArenaLayout::of(shape).filter(|l| l.len <= t.arena_len)
}

/// Whether scheduler thread `thread`'s part ends at once (it owns no cluster); the last thread
/// orchestrates and never is.
pub(super) fn part_is_brief(h: &ImageHeader, thread: u32) -> bool {
    thread + 1 < h.aicpu_threads.clamp(1, MAX_AICPU_THREADS) && thread >= h.block_dim
}

/// The trb `exec` of AICPU thread `thread`.
pub(super) fn exec<P: AicpuPlatform>(
    p: &P,
    init: &InitArgs,
    view: &ImageView<'_>,
    thread: u32,
) -> i32 {
    let h = view.header();
    let threads = h.aicpu_threads.clamp(1, MAX_AICPU_THREADS);
    let phase = view.phase(thread);
    phase.start.store(p.counter(), Relaxed);
    let (Some(trb), Some(status)) = (view.trb_header(), view.trb_status()) else {
        return EXEC_OK;
    };
    if thread == threads - 1 {
        let tensor_wait = u64::from(init.tensor_wait_ms).max(1) * TICKS_PER_MS;
        orchestrate(p, view, trb, status, layout_of(trb), threads, tensor_wait);
        phase.orchestration_end.store(p.counter(), Relaxed);
        phase.end.store(p.counter(), Relaxed);
        return EXEC_OK;
    }
    schedule(p, init, view, trb, status, thread, threads - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(task_window: u32) -> TrbHeader {
        let mut t = TrbHeader {
            arena_base: 1 << 20,
            arena_len: u64::MAX,
            task_window: [16; 4],
            dep_pool: [16; 4],
            heap_bytes: [1024; 4],
            map_entries: 64,
            map_buckets: 16,
            ..TrbHeader::default()
        };
        t.task_window[2] = task_window;
        t
    }

    #[test]
    fn an_image_whose_window_does_not_fit_the_task_handle_has_no_layout() {
        assert!(layout_of(&header(16)).is_some());
        assert!(layout_of(&header(MAX_TASK_WINDOW)).is_some());
        assert!(layout_of(&header(MAX_TASK_WINDOW << 1)).is_none());
    }
}
