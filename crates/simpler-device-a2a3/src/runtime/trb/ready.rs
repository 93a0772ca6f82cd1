//! [`ReadyRing`]: the bounded multi-producer, multi-consumer queue of ready task ids that the
//! orchestration and every completing thread push to and the schedulers pop from.
//!
//! Each cell carries a sequence number (the classic bounded-queue scheme of D. Vyukov): cell
//! `i` of a queue of `n` cells is free for the push at position `p` when its sequence is `p`,
//! and holds that push's value for the pop at position `p` when its sequence is `p + 1`; the pop
//! then sets it to `p + n`, freeing it for the push one lap later. Positions are claimed with a
//! compare-and-swap on `tail` (push) or `head` (pop).
//!
//! A pop frees its cell in a second step after its claim, so a push that reaches a cell whose
//! previous value was claimed but not yet freed waits for that step (a few instructions, longer
//! only while the popping thread is preempted between the two) rather than report a full
//! queue and lose a ready task. Only a queue whose every cell holds an unclaimed value refuses.
//!
//! | Access | Ordering | Why |
//! |---|---|---|
//! | load of a cell's sequence | `Acquire` | pairs with the release store of the previous owner of the cell, so its value (push) or its emptying (pop) is visible |
//! | store of a cell's sequence | `Release` | publishes the value stored (push) or the cell's release (pop) |
//! | CAS of `head` / `tail` | `Relaxed` | only claims a position; the cell's sequence carries the data |

use core::sync::atomic::AtomicU64;

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use simpler_ring::fixed::WakeWord;

/// Rounds a push re-reads a cell whose value no pop has claimed before it reports a full queue.
const FULL_ROUNDS: u32 = 16;

/// Waits a little before round `round` of a re-read of a word another thread is about to
/// change (a cell a pop is freeing, a slot lock): spins first, then gives the core away, since
/// a long wait means that thread is not running.
pub(crate) fn backoff(round: u32) {
    if round < 64 {
        core::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// One cell of the queue.
#[derive(Debug, Default)]
pub(crate) struct ReadyCell {
    seq: AtomicU64,
    value: AtomicU64,
}

/// The queue over caller-provided cells.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadyRing<'a> {
    cells: &'a [ReadyCell],
    head: &'a WakeWord,
    tail: &'a WakeWord,
}

impl<'a> ReadyRing<'a> {
    /// An empty queue over `cells` (at least one) and its two cursors; resets all of them, so
    /// no other thread may use them during the call.
    pub(crate) fn new(cells: &'a [ReadyCell], head: &'a WakeWord, tail: &'a WakeWord) -> Self {
        tail.store(cells.len() as u64, Relaxed);
        Self::reuse(cells, head, tail)
    }

    /// An empty queue over cells and cursors that a queue over the same cells left behind, with
    /// nothing written to them since: resets only the cells its pushes used (every push took
    /// the cell of its position, and `tail` counts the pushes), then both cursors. Same
    /// exclusivity as [`new`](Self::new).
    pub(crate) fn reuse(cells: &'a [ReadyCell], head: &'a WakeWord, tail: &'a WakeWord) -> Self {
        let used = tail.load(Relaxed).min(cells.len() as u64) as usize;
        for (i, c) in cells[..used].iter().enumerate() {
            c.seq.store(i as u64, Relaxed);
        }
        head.store(0, Relaxed);
        tail.store(0, Relaxed);
        ReadyRing { cells, head, tail }
    }

    /// The queue over `cells` and cursors that [`new`](Self::new) reset, without resetting them
    /// (for a thread that shares a queue another thread set up).
    pub(crate) fn attach(cells: &'a [ReadyCell], head: &'a WakeWord, tail: &'a WakeWord) -> Self {
        ReadyRing { cells, head, tail }
    }

    fn cell(&self, pos: u64) -> &ReadyCell {
        &self.cells[(pos % self.cells.len() as u64) as usize]
    }

    /// Pushes `value`; `false` when every cell holds a value no pop has claimed yet.
    pub(crate) fn push(&self, value: u64) -> bool {
        let n = self.cells.len() as u64;
        let mut pos = self.tail.load(Relaxed);
        let mut round = 0u32;
        loop {
            let cell = self.cell(pos);
            let seq = cell.seq.load(Acquire);
            if seq == pos {
                match self.tail.compare_exchange_weak(pos, pos + 1, Relaxed, Relaxed) {
                    Ok(_) => {
                        cell.value.store(value, Relaxed);
                        cell.seq.store(pos + 1, Release);
                        return true;
                    }
                    Err(now) => pos = now,
                }
                continue;
            }
            if seq < pos {
                // The cell still holds the value pushed one lap back. Once its pop claimed it
                // (`head` passed that position) the cell is freed next: wait. Unclaimed, every
                // cell is full; a few rounds first, so that a lagging view of `head` is not
                // taken for that.
                let claimed = pos.checked_sub(n).is_some_and(|lap| self.head.load(Relaxed) > lap);
                if !claimed && round >= FULL_ROUNDS {
                    return false;
                }
                backoff(round);
                round = round.saturating_add(1);
            }
            pos = self.tail.load(Relaxed);
        }
    }

    /// Whether every value pushed so far (as far as this thread has seen) was popped. A stale
    /// view only ever errs towards "not empty": `head` never passes `tail`, both only grow, and
    /// a thread sees its own pushes.
    pub(crate) fn looks_empty(&self) -> bool {
        self.head.load(Relaxed) >= self.tail.load(Relaxed)
    }

    /// Pops the oldest published value, if any.
    pub(crate) fn pop(&self) -> Option<u64> {
        let mut pos = self.head.load(Relaxed);
        loop {
            let cell = self.cell(pos);
            let seq = cell.seq.load(Acquire);
            if seq == pos + 1 {
                match self.head.compare_exchange_weak(pos, pos + 1, Relaxed, Relaxed) {
                    Ok(_) => {
                        let value = cell.value.load(Relaxed);
                        cell.seq.store(pos + self.cells.len() as u64, Release);
                        return Some(value);
                    }
                    Err(now) => pos = now,
                }
            } else if seq <= pos {
                return None;
            } else {
                pos = self.head.load(Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    #[test]
    fn values_come_out_in_order_and_a_full_queue_refuses() {
        let cells: Vec<ReadyCell> = (0..4).map(|_| ReadyCell::default()).collect();
        let (h, t) = (WakeWord::new(7), WakeWord::new(9));
        let q = ReadyRing::new(&cells, &h, &t);
        for round in 0..3 {
            for v in 0..4 {
                assert!(q.push(round * 10 + v));
            }
            assert!(!q.push(99), "full");
            for v in 0..4 {
                assert_eq!(q.pop(), Some(round * 10 + v));
            }
            assert_eq!(q.pop(), None);
        }
    }

    #[test]
    fn a_push_waits_for_a_pop_that_claimed_its_cell_instead_of_refusing() {
        let cells: Vec<ReadyCell> = (0..2).map(|_| ReadyCell::default()).collect();
        let (h, t) = (WakeWord::new(0), WakeWord::new(0));
        let q = ReadyRing::new(&cells, &h, &t);
        assert!(q.push(10));
        // A popper claims position 0 and stalls before it frees cell 0.
        assert!(h.compare_exchange(0, 1, Relaxed, Relaxed).is_ok());
        assert!(q.push(11));
        assert_eq!(q.pop(), Some(11));
        // Only 10 is live, but position 2 is cell 0 again: the push waits for the stalled pop.
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(50));
                assert_eq!(cells[0].value.load(Relaxed), 10);
                cells[0].seq.store(2, Release);
            });
            assert!(q.push(12), "a push refused while one value of two cells was live");
        });
        assert_eq!(q.pop(), Some(12));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn reuse_after_a_queue_resets_exactly_the_cells_it_used() {
        let seqs = |cells: &[ReadyCell]| -> Vec<u64> {
            cells.iter().map(|c| c.seq.load(Relaxed)).collect()
        };
        let fresh: Vec<u64> = (0..8).collect();
        for pushes in 0..20u64 {
            let cells: Vec<ReadyCell> = (0..8).map(|_| ReadyCell::default()).collect();
            let (h, t) = (WakeWord::new(0), WakeWord::new(0));
            let q = ReadyRing::new(&cells, &h, &t);
            for v in 0..pushes {
                assert!(q.push(v));
                assert_eq!(q.pop(), Some(v));
            }
            let q = ReadyRing::reuse(&cells, &h, &t);
            assert_eq!(seqs(&cells), fresh, "after {pushes} pushes");
            assert!(q.push(5) && q.pop() == Some(5) && q.pop().is_none());
        }
    }

    #[test]
    fn concurrent_pushers_and_poppers_deliver_every_value_exactly_once() {
        const PER: u64 = 20_000;
        let cells: Vec<ReadyCell> = (0..64).map(|_| ReadyCell::default()).collect();
        let (h, t) = (WakeWord::new(0), WakeWord::new(0));
        let q = ReadyRing::new(&cells, &h, &t);
        let seen: Vec<AtomicBool> = (0..4 * PER).map(|_| AtomicBool::new(false)).collect();
        let popped = AtomicU64::new(0);
        std::thread::scope(|s| {
            for p in 0..4 {
                s.spawn(move || {
                    for v in 0..PER {
                        while !q.push(p * PER + v) {
                            std::thread::yield_now();
                        }
                    }
                });
            }
            for _ in 0..3 {
                s.spawn(|| {
                    while popped.load(Relaxed) < 4 * PER {
                        match q.pop() {
                            Some(v) => {
                                assert!(!seen[v as usize].swap(true, Relaxed), "{v} twice");
                                popped.fetch_add(1, Relaxed);
                            }
                            None => std::thread::yield_now(),
                        }
                    }
                });
            }
        });
        assert!(seen.iter().all(|s| s.load(Relaxed)));
    }
}
