//! [`TaskWindowCore`]: a power-of-two circular task window with monotonic local ids.
//!
//! This is the window shape a device runtime uses (spec 50 §6.2); the host [`Ring`](crate::Ring)
//! keeps generation-tagged recycled entries instead, because its tasks retire out of order.
//!
//! Protocol (plain state transitions; the caller provides mutual exclusion):
//!
//! 1. **Issue.** [`TaskWindowCore::try_issue`] hands out local id `head` and advances `head`,
//!    unless `head − tail` already equals the window size `W`. The id's slot is `local & (W − 1)`.
//! 2. **Retire.** [`TaskWindowCore::retire`] marks a live id finished, in any order.
//! 3. **Advance.** Still inside step 2: while the id at `tail` is marked, `tail` moves on. A slot
//!    is reused only after every older id retired (FIFO), so a slot never names two live ids.
//!
//! Local ids are `u32` and wrap around; all comparisons use wrapping distances, which stay exact
//! because the window holds at most 2³¹ ids.

/// What [`TaskWindowCore::retire`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WindowRetire {
    /// The id is not live (never issued, or its slot was already reclaimed). Nothing changed.
    NotLive,
    /// The id was already retired and still waits for older ids. Nothing changed.
    AlreadyRetired,
    /// The id was retired; the tail advanced by `reclaimed` slots (0 if an older id is live).
    Retired {
        /// Slots freed for reuse by this call.
        reclaimed: u32,
    },
}

/// A circular window of `W` task slots (a power of two) over caller-provided retirement flags.
#[derive(Debug)]
pub struct TaskWindowCore<'a> {
    retired: &'a mut [bool],
    mask: u32,
    head: u32,
    tail: u32,
}

impl<'a> TaskWindowCore<'a> {
    /// Largest supported window: wrapping distances between `u32` ids stay exact below it.
    pub const MAX_WINDOW: usize = 1 << 31;

    /// An empty window with one slot per element of `retired`.
    ///
    /// `None` unless the length is a power of two no larger than [`Self::MAX_WINDOW`].
    pub fn new(retired: &'a mut [bool]) -> Option<Self> {
        let len = retired.len();
        if !len.is_power_of_two() || len > Self::MAX_WINDOW {
            return None;
        }
        let mask = u32::try_from(len - 1).ok()?;
        Some(TaskWindowCore { retired, mask, head: 0, tail: 0 })
    }

    /// Number of slots `W`.
    pub fn capacity(&self) -> u32 {
        // The mask is at most 2³¹ − 1, so this cannot overflow.
        self.mask + 1
    }

    /// The id the next [`try_issue`](Self::try_issue) hands out.
    pub fn head(&self) -> u32 {
        self.head
    }

    /// The oldest id not yet reclaimed (equal to `head` when the window is empty).
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Ids issued and not yet reclaimed.
    pub fn live(&self) -> u32 {
        self.head.wrapping_sub(self.tail)
    }

    /// The slot of local id `local`: `local & (W − 1)`.
    pub fn slot_of(&self, local: u32) -> usize {
        (local & self.mask) as usize
    }

    /// `true` while `local` is issued and its slot not yet reclaimed.
    pub fn is_live(&self, local: u32) -> bool {
        local.wrapping_sub(self.tail) < self.live()
    }

    /// Step 1: issues the next local id, or `None` when all `W` slots are in use.
    pub fn try_issue(&mut self) -> Option<u32> {
        if self.live() as usize >= self.retired.len() {
            return None;
        }
        let local = self.head;
        let slot = self.slot_of(local);
        self.retired[slot] = false;
        self.head = self.head.wrapping_add(1);
        Some(local)
    }

    /// Steps 2–3: retires `local` and advances the tail over every retired id.
    pub fn retire(&mut self, local: u32) -> WindowRetire {
        if !self.is_live(local) {
            return WindowRetire::NotLive;
        }
        let slot = self.slot_of(local);
        if self.retired[slot] {
            return WindowRetire::AlreadyRetired;
        }
        self.retired[slot] = true;
        let mut reclaimed = 0;
        while self.tail != self.head {
            let tail_slot = self.slot_of(self.tail);
            if !self.retired[tail_slot] {
                break;
            }
            self.tail = self.tail.wrapping_add(1);
            reclaimed += 1;
        }
        WindowRetire::Retired { reclaimed }
    }

    /// Empties the window without restarting ids: every id issued before stays not-live.
    pub fn reset(&mut self) {
        self.tail = self.head;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_sizes_must_be_powers_of_two() {
        assert!(TaskWindowCore::new(&mut [false; 3]).is_none());
        assert!(TaskWindowCore::new(&mut []).is_none());
        assert_eq!(TaskWindowCore::new(&mut [false; 4]).unwrap().capacity(), 4);
        assert_eq!(TaskWindowCore::new(&mut [false; 1]).unwrap().capacity(), 1);
    }

    #[test]
    fn ids_are_monotonic_and_slots_are_reclaimed_in_fifo_order() {
        let mut flags = [false; 4];
        let mut w = TaskWindowCore::new(&mut flags).unwrap();
        let ids: Vec<u32> = (0..4).map(|_| w.try_issue().unwrap()).collect();
        assert_eq!(ids, vec![0, 1, 2, 3]);
        assert_eq!(w.try_issue(), None);
        assert_eq!(w.retire(2), WindowRetire::Retired { reclaimed: 0 });
        assert_eq!(w.retire(2), WindowRetire::AlreadyRetired);
        assert_eq!(w.try_issue(), None, "a retired id behind a live one frees nothing");
        assert_eq!(w.retire(0), WindowRetire::Retired { reclaimed: 1 });
        assert_eq!(w.retire(1), WindowRetire::Retired { reclaimed: 2 });
        assert_eq!(w.retire(1), WindowRetire::NotLive);
        assert_eq!(w.try_issue(), Some(4));
        assert_eq!(w.slot_of(4), 0);
        assert!(!w.is_live(0) && w.is_live(4) && w.is_live(3));
        w.reset();
        assert_eq!((w.live(), w.head()), (0, 5));
        assert_eq!(w.retire(4), WindowRetire::NotLive);
    }

    #[test]
    fn ids_keep_working_across_u32_wraparound() {
        let mut flags = [false; 2];
        let mut w = TaskWindowCore::new(&mut flags).unwrap();
        w.head = u32::MAX;
        w.tail = u32::MAX;
        let a = w.try_issue().unwrap();
        let b = w.try_issue().unwrap();
        assert_eq!((a, b), (u32::MAX, 0));
        assert_eq!(w.try_issue(), None);
        assert_eq!(w.retire(a), WindowRetire::Retired { reclaimed: 1 });
        assert_eq!(w.tail(), 0);
        assert!(w.is_live(0) && !w.is_live(u32::MAX));
    }
}
