//! Device wall time and phases (spec §7, first bullet).
//!
//! On the simulator the wall time runs from the AICore launch's start to the last AICPU
//! thread's end, both on the virtual 50 MHz counter; phases come from the AICPU phase records.

use std::mem::offset_of;
use std::time::Duration;

use super::le_u64;
use crate::abi::NS_PER_TICK;
use crate::abi::image::PhaseRecord;

/// Where a run's device time went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunPhases {
    /// Launch to the end of the boot step (image wiring, ready seeding).
    pub preamble: Duration,
    /// Boot end to the end of the last handshake (hbg has no device orchestration; this is the
    /// handshake with the AICore workers).
    pub orchestration: Duration,
    /// Handshake end to the last scheduling loop's end.
    pub scheduling: Duration,
    /// Scheduling end to the last thread's return (shutdown handshake).
    pub post_orchestration: Duration,
}

/// One thread's phase counters read from a host copy of the phase section.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ThreadPhases {
    pub(crate) start: u64,
    pub(crate) orchestration_end: u64,
    pub(crate) handshake_end: u64,
    pub(crate) scheduling_end: u64,
    pub(crate) end: u64,
    pub(crate) tasks_completed: u64,
}

/// Parses the phase records of `threads` threads from `bytes` (a copy of the phase section).
pub(crate) fn parse_phases(bytes: &[u8], threads: u32) -> Vec<ThreadPhases> {
    (0..threads as u64)
        .map(|t| {
            let o = t * size_of::<PhaseRecord>() as u64;
            ThreadPhases {
                start: le_u64(bytes, o + offset_of!(PhaseRecord, start) as u64),
                orchestration_end: le_u64(
                    bytes,
                    o + offset_of!(PhaseRecord, orchestration_end) as u64,
                ),
                handshake_end: le_u64(bytes, o + offset_of!(PhaseRecord, handshake_end) as u64),
                scheduling_end: le_u64(bytes, o + offset_of!(PhaseRecord, scheduling_end) as u64),
                end: le_u64(bytes, o + offset_of!(PhaseRecord, end) as u64),
                tasks_completed: le_u64(bytes, o + offset_of!(PhaseRecord, tasks_completed) as u64),
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
