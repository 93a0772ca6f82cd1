//! Device wall time and phases (`docs/device-chip.md`).
//!
//! On the simulator the wall time runs from the AICore launch's start to the last AICPU
//! thread's end, both on the virtual 50 MHz counter; phases come from the AICPU phase records.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::abi::NS_PER_TICK;
use crate::aicpu::view::HostImageView;

/// Where a run's device time went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunPhases {
    /// Launch to the end of the boot step (image wiring, ready seeding).
    pub preamble: Duration,
    /// Boot end to the end of the last handshake (hbg has no device orchestration; this is the
    /// handshake with the AICore cores).
    pub orchestration: Duration,
    /// Handshake end to the last scheduling loop's end.
    pub scheduling: Duration,
    /// Scheduling end to the last thread's return (shutdown handshake).
    pub post_orchestration: Duration,
}

/// One AICPU thread's phase counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ThreadPhases {
    pub(crate) start: u64,
    pub(crate) orchestration_end: u64,
    pub(crate) handshake_end: u64,
    pub(crate) scheduling_end: u64,
    pub(crate) end: u64,
    pub(crate) tasks_completed: u64,
}

/// The phase records of the first `threads` AICPU threads of an image.
pub(crate) fn phases(image: &HostImageView<'_>, threads: u32) -> Vec<ThreadPhases> {
    // Relaxed: the host reads after both streams completed, which orders the writes.
    let r = |a: &std::sync::atomic::AtomicU64| a.load(Relaxed);
    (0..threads)
        .map(|t| {
            let p = image.phase(t);
            ThreadPhases {
                start: r(&p.start),
                orchestration_end: r(&p.orchestration_end),
                handshake_end: r(&p.handshake_end),
                scheduling_end: r(&p.scheduling_end),
                end: r(&p.end),
                tasks_completed: r(&p.tasks_completed),
            }
        })
        .collect()
}

fn ticks(t: u64) -> Duration {
    Duration::from_nanos(t.saturating_mul(NS_PER_TICK))
}

/// Wall time (launch start to the last thread's end) and phases; `None` when the records are
/// missing.
pub(crate) fn wall_and_phases(
    launch_ticks: u64,
    phases: &[ThreadPhases],
) -> Option<(Duration, RunPhases)> {
    let end = phases.iter().map(|p| p.end).max()?;
    if end == 0 || end < launch_ticks {
        return None;
    }
    let max_of = |f: fn(&ThreadPhases) -> u64| phases.iter().map(f).max().unwrap_or(0);
    let boot = max_of(|p| p.orchestration_end).max(launch_ticks);
    let hs = max_of(|p| p.handshake_end).max(boot);
    let sched = max_of(|p| p.scheduling_end).max(hs);
    Some((
        ticks(end - launch_ticks),
        RunPhases {
            preamble: ticks(boot - launch_ticks),
            orchestration: ticks(hs - boot),
            scheduling: ticks(sched - hs),
            post_orchestration: ticks(end.saturating_sub(sched)),
        },
    ))
}
