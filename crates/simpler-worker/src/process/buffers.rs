//! The device allocations of a chip's processes, as the worker tracks them
//! (`docs/process-mode.md`, "Failures").
//!
//! A task's tensor carries an address only, not the process whose allocation it lies in. So
//! the worker keeps, per chip, the allocations of its current process (through the memory
//! helpers and host-tensor staging alike) and those of the last [`KEPT_ENDED`] processes that
//! ended before it. Before a run is sent, every chip-memory tensor is looked up here: one that
//! touches an allocation of an ended process and lies in no allocation of the current one is
//! refused, never sent to the new process, which may have handed that memory to someone else.
//! Bytes the current process has allocated are its own: an address alone cannot tell a tensor
//! over them from one over an ended process's allocation at the same bytes.
//!
//! Invariant: `live` holds exactly the allocations the current process answered and has not
//! freed; `ended` the allocations that were live when each of the last `KEPT_ENDED` processes
//! ended (those that ended with none have no entry), oldest first, each with its longest.

use std::collections::{BTreeMap, VecDeque};

/// How many ended processes' allocations are kept. A restart adds one process; the oldest
/// record goes once this many newer processes have ended, so the record holds at most this
/// many processes' worth of allocations however often the chip restarts.
pub(crate) const KEPT_ENDED: u64 = 8;

/// An allocation of a process that has ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stale {
    /// Its device address.
    pub(crate) addr: u64,
    /// Its length in bytes.
    pub(crate) len: u64,
    /// The process that allocated it (the first is 1).
    pub(crate) process: u64,
}

/// The allocations that were live when one process ended.
struct Ended {
    process: u64,
    /// Address → length.
    allocations: BTreeMap<u64, u64>,
    /// The longest, which bounds the search for one overlapping a span.
    longest: u64,
}

impl Ended {
    /// The allocation that the bytes `[start, end)` touch (`start < end`).
    fn touched_by(&self, start: u64, end: u64) -> Option<Stale> {
        // Only an allocation starting at most `longest` bytes before `start` can reach it.
        self.allocations
            .range(start.saturating_sub(self.longest)..end)
            .find(|(a, l)| a.saturating_add(**l) > start)
            .map(|(&addr, &len)| Stale { addr, len, process: self.process })
    }
}

/// The allocations of one chip's processes.
#[derive(Default)]
pub(crate) struct Buffers {
    /// The current process's allocations: address → length.
    live: BTreeMap<u64, u64>,
    /// Allocations of the last `KEPT_ENDED` processes that ended, oldest first.
    ended: VecDeque<Ended>,
}

impl Buffers {
    /// The current process answered `len` bytes at `addr`.
    pub(crate) fn allocated(&mut self, addr: u64, len: u64) {
        self.live.insert(addr, len);
    }

    /// The current process freed the allocation at `addr`.
    pub(crate) fn freed(&mut self, addr: u64) {
        self.live.remove(&addr);
    }

    /// Process `process` ended: its allocations ended with it, and the record of a process
    /// `KEPT_ENDED` or more before it is dropped.
    pub(crate) fn process_ended(&mut self, process: u64) {
        while self.ended.front().is_some_and(|e| e.process.saturating_add(KEPT_ENDED) <= process) {
            self.ended.pop_front();
        }
        let allocations = std::mem::take(&mut self.live);
        if let Some(longest) = allocations.values().copied().max() {
            self.ended.push_back(Ended { process, allocations, longest });
        }
    }

    /// The allocation of an ended process that the bytes `[start, end)` touch, when they lie
    /// in no allocation of the current process: of the newest process that has one.
    pub(crate) fn stale_under(&self, start: u64, end: u64) -> Option<Stale> {
        let in_live = self
            .live
            .range(..=start)
            .next_back()
            .is_some_and(|(&a, &l)| end <= a.saturating_add(l));
        if in_live || start >= end {
            return None;
        }
        self.ended.iter().rev().find_map(|e| e.touched_by(start, end))
    }

    /// The allocations recorded for ended processes.
    #[cfg(test)]
    fn ended_allocations(&self) -> usize {
        self.ended.iter().map(|e| e.allocations.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_in_an_ended_process_s_allocation_is_stale_unless_a_live_one_holds_it() {
        let mut b = Buffers::default();
        b.allocated(0x1000, 0x1000);
        b.allocated(0x4000, 0x10);
        assert_eq!(b.stale_under(0x1800, 0x1900), None, "live");
        b.process_ended(1);
        let big = Stale { addr: 0x1000, len: 0x1000, process: 1 };
        assert_eq!(b.stale_under(0x1800, 0x1900), Some(big));
        // Touching is enough: a span that starts before the allocation or runs past it.
        assert_eq!(b.stale_under(0x0f00, 0x1001), Some(big));
        assert_eq!(b.stale_under(0x1fff, 0x3000), Some(big));
        assert_eq!(b.stale_under(0x2000, 0x3000), None, "past it");
        assert_eq!(b.stale_under(0x1800, 0x1800), None, "empty");
        // The new process answers an address inside the old allocation: spans in the new
        // allocation are its own; the rest of the old one stays refused.
        b.allocated(0x1800, 0x100);
        assert_eq!(b.stale_under(0x1800, 0x1900), None);
        assert_eq!(b.stale_under(0x1000, 0x1010), Some(big));
        // A short allocation after a long one does not hide the long one.
        b.allocated(0x1f00, 0x10);
        b.freed(0x1800);
        b.process_ended(2);
        assert_eq!(b.stale_under(0x1f80, 0x1f90), Some(big));
        // Process 2 freed its allocation at 0x1800; process 1's around it is still stale.
        assert_eq!(b.stale_under(0x1800, 0x1810), Some(big));
        assert_eq!(b.stale_under(0x4000, 0x4008).map(|s| s.process), Some(1));
    }

    #[test]
    fn a_shorter_allocation_at_the_same_address_by_a_later_process_keeps_the_longer_stale() {
        let mut b = Buffers::default();
        b.allocated(0x10_0000, 0x10_0000);
        b.process_ended(1);
        b.allocated(0x10_0000, 0x40);
        b.process_ended(2);
        let long = Stale { addr: 0x10_0000, len: 0x10_0000, process: 1 };
        assert_eq!(b.stale_under(0x10_1000, 0x10_1010), Some(long));
    }

    #[test]
    fn bytes_the_current_process_allocated_again_are_its_own_the_rest_of_an_ended_one_stays_stale()
    {
        let mut b = Buffers::default();
        b.allocated(0x1000, 0x200);
        b.process_ended(1);
        // The restarted process answers the very address the ended one had.
        b.allocated(0x1000, 0x100);
        assert_eq!(b.stale_under(0x1000, 0x1100), None, "the current process's buffer");
        let old = Stale { addr: 0x1000, len: 0x200, process: 1 };
        assert_eq!(b.stale_under(0x1000, 0x1200), Some(old), "runs past the current buffer");
        assert_eq!(b.stale_under(0x1100, 0x1108), Some(old), "only in the ended one");
    }

    #[test]
    fn the_record_keeps_the_last_kept_ended_processes_however_often_the_chip_restarts() {
        let mut b = Buffers::default();
        let base = |process: u64| process * 0x1_0000;
        let last = 10 * KEPT_ENDED;
        for process in 1..=last {
            // Addresses of its own in every process, as under address-space randomization.
            b.allocated(base(process), 0x100);
            b.allocated(base(process) + 0x1000, 0x100);
            b.process_ended(process);
            let kept = b.ended_allocations();
            assert!(kept <= 2 * KEPT_ENDED as usize, "{kept} allocations kept after {process}");
        }
        let oldest = last - KEPT_ENDED + 1;
        let stale = |b: &Buffers, p: u64| b.stale_under(base(p), base(p) + 8).map(|s| s.process);
        assert_eq!(stale(&b, oldest), Some(oldest), "one of the last {KEPT_ENDED} processes");
        assert_eq!(stale(&b, last), Some(last));
        assert_eq!(stale(&b, oldest - 1), None, "a process before the last {KEPT_ENDED}");
        // Processes that end with no allocation count too: the record is of processes.
        for process in last + 1..last + KEPT_ENDED {
            b.process_ended(process);
        }
        assert_eq!(stale(&b, last), Some(last), "it is among the last {KEPT_ENDED} to end");
        b.process_ended(last + KEPT_ENDED);
        assert_eq!((stale(&b, last), b.ended_allocations()), (None, 0));
    }
}
