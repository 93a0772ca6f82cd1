//! [`TaskWindowCore`]: a power-of-two circular task window with monotonic local ids, whose
//! retirement flags live in caller-provided shared memory.
//!
//! This is the window shape a device runtime uses; the host [`Ring`](crate::Ring) keeps
//! generation-tagged recycled entries instead, because its tasks retire out of order.
//!
//! # Roles
//!
//! - The **owner** holds the [`TaskWindowCore`] (by `&mut`): it issues ids and reclaims slots.
//!   On a device this is the orchestration thread.
//! - **Retirers** hold a [`WindowRetirer`] (a `Copy` handle over the same words): they mark ids
//!   finished, from any thread, in any order. On a device these are the scheduler threads.
//!
//! # Protocol
//!
//! Each slot has one [`SlotWord`] holding a *tag* `local << 1 | retired`: which id the slot
//! currently belongs to and whether that id has finished.
//!
//! 1. **Issue** (owner). [`TaskWindowCore::try_issue`] first reclaims (step 3), then hands out
//!    local id `head`, stores the tag `live(head)` into its slot and advances `head`, unless
//!    `head − tail` already equals the window size `W`. The id's slot is `local & (W − 1)`. The
//!    owner then publishes the id to retirers through its own channels (a ready queue, a task
//!    record), which orders the tag store before any retirer sees the id.
//! 2. **Retire** (any retirer). [`WindowRetirer::retire`] swaps the slot's tag from `live(local)`
//!    to `retired(local)` with one compare-and-swap. Any other tag means the id is not live (or
//!    was retired already), and nothing is written, so a stale or made-up id cannot disturb the
//!    slot's current owner.
//! 3. **Reclaim** (owner). [`TaskWindowCore::reclaim`]: while the tag of the slot at `tail` is
//!    `retired(tail)`, `tail` moves on. A slot is reused only after every older id retired
//!    (FIFO), so a slot never names two live ids.
//!
//! # Atomics
//!
//! The slot words are the only shared state; `head` and `tail` belong to the owner.
//!
//! | Access | Who | Ordering | Why it suffices |
//! |---|---|---|---|
//! | store `live(L)` (issue) | owner | `Relaxed` | A retirer learns `L` only through the owner's own publication of the task, which is a release/acquire pair after this store; so the retirer's CAS reads this store or a later one (coherence). No other data is published through the word. |
//! | CAS `live(L)` → `retired(L)` (retire) | retirers | `Release` on success, `Relaxed` on failure | The success store publishes everything the task did before retiring (its outputs, its payload's final state) to the owner's acquire load in step 3, so the owner reuses the slot and the task's heap only after the task is done with them. A failed CAS writes nothing and publishes nothing. |
//! | load (reclaim, `is_retired`) | owner | `Acquire` | Pairs with the retirer's release CAS (see above). |
//! | store `retired(s − W)` (construction) | owner | `Relaxed` | Precedes every issue on the owner's thread, and a retirer acts only on ids it learned through the owner's publication after an issue, so its CAS reads this store or a later one. A retire of an id not yet issued either fails or is overwritten by this store or by that id's issue. |
//!
//! Local ids are `u32` and wrap around; all comparisons use wrapping distances, which stay exact
//! because the window holds at most 2³¹ ids. Ids repeat after 2³² issues, so a retirer must not
//! hold on to an id that long.

#[cfg(not(simpler_loom))]
use core::sync::atomic::{AtomicU64, Ordering};
#[cfg(simpler_loom)]
use loom::sync::atomic::{AtomicU64, Ordering};

/// The shared word of one window slot: the atomic a caller provides one of per slot.
///
/// In normal builds this is [`core::sync::atomic::AtomicU64`], so a device runtime can place the
/// words in memory it shares between threads; model-checking builds (`cfg(simpler_loom)`) swap
/// in `loom`'s atomic. Its contents before [`TaskWindowCore::new`] do not matter.
pub type SlotWord = AtomicU64;

/// What [`WindowRetirer::retire`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WindowRetire {
    /// The id is not live: never issued, or its slot already belongs to a later id. Nothing
    /// changed.
    NotLive,
    /// The id was already retired (its slot may even have been reclaimed since, as long as no
    /// later id took it). Nothing changed.
    AlreadyRetired,
    /// The id was live and is now retired; the owner reclaims its slot once every older id is
    /// retired too.
    Retired,
}

const fn live_tag(local: u32) -> u64 {
    (local as u64) << 1
}

const fn retired_tag(local: u32) -> u64 {
    live_tag(local) | 1
}

/// A handle that retires ids of one [`TaskWindowCore`] from any thread.
///
/// It is `Copy`, `Send` and `Sync`: it borrows only the shared slot words.
#[derive(Clone, Copy, Debug)]
pub struct WindowRetirer<'a> {
    words: &'a [SlotWord],
    mask: u32,
}

impl<'a> WindowRetirer<'a> {
    /// A retirer over the slot words of a window that [`TaskWindowCore::new`] set up (or will
    /// set up before any id is issued), for a thread that reaches the words on its own rather
    /// than through [`TaskWindowCore::retirer`].
    ///
    /// `None` under the same length rule as [`TaskWindowCore::new`]. Retiring through words no
    /// window owns is harmless: every call then returns [`WindowRetire::NotLive`] or changes a
    /// tag no owner reads.
    pub fn new(words: &'a [SlotWord]) -> Option<Self> {
        let len = words.len();
        if !len.is_power_of_two() || len > TaskWindowCore::MAX_WINDOW {
            return None;
        }
        Some(WindowRetirer { words, mask: u32::try_from(len - 1).ok()? })
    }

    /// Protocol step 2: marks the live id `local` finished.
    pub fn retire(&self, local: u32) -> WindowRetire {
        let word = &self.words[(local & self.mask) as usize];
        // Orderings: see the module docs' table. The failure value tells the two refusals apart.
        match word.compare_exchange(
            live_tag(local),
            retired_tag(local),
            Ordering::Release,
            Ordering::Relaxed,
        ) {
            Ok(_) => WindowRetire::Retired,
            Err(tag) if tag == retired_tag(local) => WindowRetire::AlreadyRetired,
            Err(_) => WindowRetire::NotLive,
        }
    }
}

/// A circular window of `W` task slots (a power of two) over caller-provided slot words; the
/// owner's side of the protocol in the module docs.
#[derive(Debug)]
pub struct TaskWindowCore<'a> {
    words: &'a [SlotWord],
    mask: u32,
    head: u32,
    tail: u32,
}

impl<'a> TaskWindowCore<'a> {
    /// Largest supported window: wrapping distances between `u32` ids stay exact below it.
    pub const MAX_WINDOW: usize = 1 << 31;

    /// An empty window with one slot per element of `words`, whose first id is 0.
    ///
    /// `None` unless the length is a power of two no larger than [`Self::MAX_WINDOW`]. Every
    /// word is overwritten, so the memory may hold anything before.
    pub fn new(words: &'a [SlotWord]) -> Option<Self> {
        Self::reuse(words, words.len())
    }

    /// An empty window over words that a window over the same words left behind after issuing
    /// `issued` ids, rewriting only the first `min(issued, W)` words: the ones those ids took.
    ///
    /// With nothing written to the words since, the result is the window [`new`](Self::new)
    /// builds, for a cost proportional to what the previous window used rather than to `W`.
    /// An `issued` that undercounts leaves words holding old tags; the protocol still holds for
    /// every id issued from then on (each issue overwrites its slot first), but a retire of an
    /// id never issued may then match a leftover tag. `None` under the same length rule as
    /// [`new`](Self::new).
    pub fn reuse(words: &'a [SlotWord], issued: usize) -> Option<Self> {
        let mask = WindowRetirer::new(words)?.mask;
        let window = TaskWindowCore { words, mask, head: 0, tail: 0 };
        for (slot, word) in (0u32..).zip(&words[..issued.min(words.len())]) {
            // The id one lap before the first: retired and stale, so no retire matches it.
            word.store(retired_tag(slot.wrapping_sub(window.capacity())), Ordering::Relaxed);
        }
        Some(window)
    }

    /// A handle for retiring ids from other threads.
    pub fn retirer(&self) -> WindowRetirer<'a> {
        WindowRetirer { words: self.words, mask: self.mask }
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

    /// Ids issued and not yet reclaimed (retired ones behind an older live id included).
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

    /// `true` once the issued id `local` has been retired (whether or not it was reclaimed);
    /// `false` for a live unretired id and for an id whose slot belongs to another id.
    pub fn is_retired(&self, local: u32) -> bool {
        // Acquire: pairs with the retirer's release CAS (module docs).
        self.words[self.slot_of(local)].load(Ordering::Acquire) == retired_tag(local)
    }

    /// Protocol steps 3 then 1: reclaims what it can, then issues the next local id, or `None`
    /// when all `W` slots hold unreclaimed ids.
    pub fn try_issue(&mut self) -> Option<u32> {
        if self.live() == self.capacity() {
            self.reclaim();
            if self.live() == self.capacity() {
                return None;
            }
        }
        let local = self.head;
        // Relaxed: see the module docs' table (the id is published through the owner's channels).
        self.words[self.slot_of(local)].store(live_tag(local), Ordering::Relaxed);
        self.head = self.head.wrapping_add(1);
        Some(local)
    }

    /// Step 2 on the owner's thread: the same as [`WindowRetirer::retire`].
    pub fn retire(&self, local: u32) -> WindowRetire {
        self.retirer().retire(local)
    }

    /// Step 3: advances the tail over every retired id at the front of the window and returns
    /// how many slots became free.
    pub fn reclaim(&mut self) -> u32 {
        let mut reclaimed = 0;
        while self.tail != self.head && self.is_retired(self.tail) {
            self.tail = self.tail.wrapping_add(1);
            reclaimed += 1;
        }
        reclaimed
    }

    /// Empties the window without restarting ids: every id issued before stays not-live, and a
    /// late retire of one of them changes nothing a later id depends on.
    pub fn reset(&mut self) {
        self.tail = self.head;
    }
}

#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use super::*;

    fn words(n: usize) -> Vec<SlotWord> {
        (0..n).map(|_| SlotWord::new(u64::MAX)).collect()
    }

    #[test]
    fn window_sizes_must_be_powers_of_two() {
        assert!(TaskWindowCore::new(&words(3)).is_none());
        assert!(TaskWindowCore::new(&[]).is_none());
        assert_eq!(TaskWindowCore::new(&words(4)).unwrap().capacity(), 4);
        assert_eq!(TaskWindowCore::new(&words(1)).unwrap().capacity(), 1);
    }

    #[test]
    fn ids_are_monotonic_and_slots_are_reclaimed_in_fifo_order() {
        let words = words(4);
        let mut w = TaskWindowCore::new(&words).unwrap();
        let ids: Vec<u32> = (0..4).map(|_| w.try_issue().unwrap()).collect();
        assert_eq!(ids, vec![0, 1, 2, 3]);
        assert_eq!(w.try_issue(), None);
        assert_eq!(w.retire(2), WindowRetire::Retired);
        assert_eq!(w.retire(2), WindowRetire::AlreadyRetired);
        assert_eq!(w.reclaim(), 0, "a retired id behind a live one frees nothing");
        assert_eq!(w.try_issue(), None);
        assert_eq!(w.retire(0), WindowRetire::Retired);
        assert_eq!(w.retire(1), WindowRetire::Retired);
        assert_eq!(w.reclaim(), 3);
        assert_eq!(w.retire(1), WindowRetire::AlreadyRetired, "reclaimed, slot not reused yet");
        assert_eq!(w.retire(7), WindowRetire::NotLive, "never issued");
        assert_eq!(w.try_issue(), Some(4));
        assert_eq!(w.slot_of(4), 0);
        assert_eq!(w.retire(0), WindowRetire::NotLive, "its slot belongs to id 4 now");
        assert!(!w.is_live(0) && w.is_live(4) && w.is_live(3));
        w.reset();
        assert_eq!((w.live(), w.head()), (0, 5));
        assert_eq!(w.retire(4), WindowRetire::Retired, "a late retire after reset is harmless");
        assert_eq!(w.try_issue(), Some(5));
        assert_eq!(w.reclaim(), 0, "id 5 is live; the late retire of 4 is behind the tail");
    }

    #[test]
    fn a_full_window_reclaims_on_issue() {
        let words = words(2);
        let mut w = TaskWindowCore::new(&words).unwrap();
        let a = w.try_issue().unwrap();
        w.try_issue().unwrap();
        w.retirer().retire(a);
        assert_eq!(w.try_issue(), Some(2));
        assert_eq!((w.tail(), w.live()), (1, 2));
    }

    #[test]
    fn construction_overwrites_whatever_the_words_held() {
        // Garbage that happens to be id 0's live and retired tags.
        let garbage = [SlotWord::new(live_tag(0)), SlotWord::new(retired_tag(1))];
        let mut w = TaskWindowCore::new(&garbage).unwrap();
        assert_eq!(w.retire(0), WindowRetire::NotLive);
        assert_eq!(w.retire(1), WindowRetire::NotLive);
        assert_eq!(w.try_issue(), Some(0));
        assert_eq!(w.reclaim(), 0);
    }

    #[test]
    fn reuse_after_a_window_rewrites_exactly_the_words_it_used() {
        let fresh: Vec<u64> = {
            let words = words(8);
            TaskWindowCore::new(&words).unwrap();
            words.iter().map(|w| w.load(Ordering::Relaxed)).collect()
        };
        for issued in 0..12 {
            let words = words(8);
            let mut w = TaskWindowCore::new(&words).unwrap();
            for _ in 0..issued {
                let local = w.try_issue().unwrap_or_else(|| {
                    w.retire(w.tail());
                    w.try_issue().unwrap()
                });
                if local.is_multiple_of(3) {
                    w.retire(local);
                }
            }
            let mut again = TaskWindowCore::reuse(&words, issued).unwrap();
            let now: Vec<u64> = words.iter().map(|w| w.load(Ordering::Relaxed)).collect();
            assert_eq!(now, fresh, "after {issued} issues");
            assert_eq!((again.head(), again.live()), (0, 0));
            assert_eq!(again.retire(0), WindowRetire::NotLive);
            assert_eq!(again.try_issue(), Some(0));
        }
    }

    #[test]
    fn ids_keep_working_across_u32_wraparound() {
        let words = words(2);
        let mut w = TaskWindowCore::new(&words).unwrap();
        w.head = u32::MAX;
        w.tail = u32::MAX;
        let a = w.try_issue().unwrap();
        let b = w.try_issue().unwrap();
        assert_eq!((a, b), (u32::MAX, 0));
        assert_eq!(w.try_issue(), None);
        assert_eq!(w.retire(a), WindowRetire::Retired);
        assert_eq!(w.reclaim(), 1);
        assert_eq!(w.tail(), 0);
        assert!(w.is_live(0) && !w.is_live(u32::MAX));
    }

    #[test]
    fn the_retirer_is_shareable_across_threads() {
        fn send_sync<T: Send + Sync + Copy>() {}
        send_sync::<WindowRetirer<'static>>();
    }
}
