//! The device allocations of a chip's processes, as the worker tracks them
//! (`docs/process-mode.md`, "Failures").
//!
//! A task's tensor carries an address only, not the process whose allocation it lies in. So
//! the worker keeps, per chip, the allocations of its current process (through the memory
//! helpers and host-tensor staging alike) and those of the processes that ended before it.
//! Before a run is sent, every chip-memory tensor is looked up here: one that touches an
//! allocation of an ended process and lies in no allocation of the current one is refused,
//! never sent to the new process, which may have handed that memory to someone else.
//!
//! Invariant: `live` holds exactly the allocations the current process answered and has not
//! freed; `stale` every allocation that was live when its process ended, with the number of
//! that process, until the worker closes; `stale_max` is at least every stale length.

use std::collections::BTreeMap;

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

/// The allocations of one chip's processes.
#[derive(Default)]
pub(crate) struct Buffers {
    /// The current process's allocations: address → length.
    live: BTreeMap<u64, u64>,
    /// Allocations of ended processes: address → (length, process). Of two at one address,
    /// the longer is kept, which covers every byte the shorter did.
    stale: BTreeMap<u64, (u64, u64)>,
    /// The longest stale allocation, which bounds the search for one overlapping a span.
    stale_max: u64,
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

    /// Process `process` ended: its allocations ended with it.
    pub(crate) fn process_ended(&mut self, process: u64) {
        for (addr, len) in std::mem::take(&mut self.live) {
            self.stale_max = self.stale_max.max(len);
            let kept = self.stale.entry(addr).or_insert((len, process));
            if len > kept.0 {
                *kept = (len, process);
            }
        }
    }

    /// The allocation of an ended process that the bytes `[start, end)` touch, when they lie
    /// in no allocation of the current process.
    pub(crate) fn stale_under(&self, start: u64, end: u64) -> Option<Stale> {
        let in_live = self
            .live
            .range(..=start)
            .next_back()
            .is_some_and(|(&a, &l)| end <= a.saturating_add(l));
        if in_live || self.stale.is_empty() || start >= end {
            return None;
        }
        // Only an allocation starting at most `stale_max` bytes before `start` can reach it.
        self.stale
            .range(start.saturating_sub(self.stale_max)..end)
            .find(|(a, (l, _))| a.saturating_add(*l) > start)
            .map(|(&addr, &(len, process))| Stale { addr, len, process })
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
}
