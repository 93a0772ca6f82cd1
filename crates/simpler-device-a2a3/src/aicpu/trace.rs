//! AICPU dispatch records (swimlane level 2 and up), shared by both runtimes' schedulers.
//!
//! A scheduler thread appends one [`AicpuRecord`] per dispatch it sends (the counter when the
//! token was written) to its own block of the image's AICPU swimlane section, and stamps the
//! record's finish time when it observes that dispatch's completion. A core has at most two
//! dispatches in flight and completes them in issue order, so a two-entry FIFO per owned core
//! pairs completions with records. A full block counts the dispatch as dropped.
//!
//! The orchestration thread of tensormap_and_ringbuffer (swimlane level 4) uses its own block
//! for its submit spans, marked by [`SUBMIT_SPAN_CORE`].

use core::sync::atomic::Ordering::Relaxed;

use crate::abi::MAX_LAUNCH_CORES;
use crate::abi::image::AicpuRecord;
use crate::aicpu::view::ImageView;

/// The `core` of an AICPU record that is an orchestration submit span, not a dispatch.
pub(crate) const SUBMIT_SPAN_CORE: u32 = u32::MAX;

/// Marks a dispatch whose record did not fit.
const NO_RECORD: u32 = u32::MAX;

/// One scheduler thread's dispatch records: per owned core, the record indices of its
/// in-flight dispatches in issue order.
pub(crate) struct Trace {
    thread: u32,
    capacity: u32,
    fifo: [[u32; 2]; MAX_LAUNCH_CORES],
    len: [u8; MAX_LAUNCH_CORES],
}

impl Trace {
    /// The records of AICPU thread `thread` when the image asks for them (level 2 and up).
    pub(crate) fn of(view: &ImageView<'_>, thread: u32) -> Option<Trace> {
        let h = view.header();
        (h.swimlane_level >= 2 && h.aicpu_swimlane_capacity > 0).then_some(Trace {
            thread,
            capacity: h.aicpu_swimlane_capacity,
            fifo: [[NO_RECORD; 2]; MAX_LAUNCH_CORES],
            len: [0; MAX_LAUNCH_CORES],
        })
    }

    /// Appends a record for a dispatch to owned core `idx` at counter `now`.
    pub(crate) fn dispatch(
        &mut self,
        view: &ImageView<'_>,
        idx: usize,
        now: u64,
        task_id: u64,
        core: u32,
        token: u32,
    ) {
        let rec = append(
            view,
            self.thread,
            self.capacity,
            AicpuRecord { task_id, core, token, dispatch: now, finish: 0 },
        );
        let len = self.len[idx] as usize;
        if len < 2 {
            self.fifo[idx][len] = rec;
            self.len[idx] += 1;
        }
    }

    /// Stamps `now` as the finish time of the oldest in-flight dispatch of owned core `idx`.
    pub(crate) fn finish(&mut self, view: &ImageView<'_>, idx: usize, now: u64) {
        if self.len[idx] == 0 {
            return;
        }
        let rec = self.fifo[idx][0];
        self.fifo[idx][0] = self.fifo[idx][1];
        self.len[idx] -= 1;
        if rec != NO_RECORD && rec < self.capacity {
            let (_, records) = view.aicpu_swimlane(self.thread);
            // SAFETY: record `rec` < capacity was written by this thread (`append`) and lies
            // inside its block; only the `finish` field is written, through a raw pointer.
            unsafe { core::ptr::addr_of_mut!((*records.add(rec as usize)).finish).write(now) };
        }
    }
}

/// Appends `r` to AICPU thread `thread`'s block (of `capacity` records); returns its index, or
/// counts it dropped and returns `NO_RECORD`.
pub(crate) fn append(view: &ImageView<'_>, thread: u32, capacity: u32, r: AicpuRecord) -> u32 {
    let (h, records) = view.aicpu_swimlane(thread);
    // Relaxed: only this thread writes the count; the host reads it after the run.
    let n = h.count.load(Relaxed);
    if n < capacity {
        // SAFETY: record `n` < capacity lies inside this thread's block, which only this
        // thread writes during the run.
        unsafe { records.add(n as usize).write(r) };
        h.count.store(n + 1, Relaxed);
        n
    } else {
        h.dropped.fetch_add(1, Relaxed);
        NO_RECORD
    }
}
