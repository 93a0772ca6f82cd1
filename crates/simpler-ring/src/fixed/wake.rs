//! Deciding *when* to wake a waiting thread, so that threads hand work to each other without a
//! wake-up per item: [`CountWatch`] (a waiter wants to hear once a shared count reaches a
//! target) and [`Idlers`] (producers want to know whether any consumer may be about to park).
//!
//! Neither type parks or notifies anybody itself: a caller waits on its platform's event
//! count (read the epoch, re-check, park until the epoch moves) and notifies it when these
//! types say so. What they guarantee is that the decision never loses a wake-up.
//!
//! # The pattern both follow
//!
//! Each is a store-buffering (Dekker) pair between a *waiter* and a *publisher*:
//!
//! | Waiter | Publisher |
//! |---|---|
//! | 1. announce (store a target / raise the idle count) | 1. publish (advance the count / push work) |
//! | 2. `fence(SeqCst)` | 2. `fence(SeqCst)` |
//! | 3. re-check the condition, park only if it fails | 3. read the announcement, notify if it asks |
//!
//! The two fences are ordered one way or the other in the single total order of `SeqCst`
//! fences: if the waiter's comes first, the publisher's step 3 sees the announcement and
//! notifies; otherwise the waiter's step 3 sees the publication and does not park. The waiter
//! reads its event count's epoch before step 3, so a notification that lands between step 3
//! and the park still ends the park. Plain `SeqCst` accesses would give the same on real
//! hardware, but fences are what the `loom` model checker models faithfully.

#[cfg(not(simpler_loom))]
use core::sync::atomic::{AtomicU64, Ordering, fence};
#[cfg(simpler_loom)]
use loom::sync::atomic::{AtomicU64, Ordering, fence};

/// The shared word of a [`CountWatch`] or [`Idlers`]: an atomic the caller provides (an
/// `AtomicU64`, `loom`'s under `cfg(simpler_loom)`). Its contents before `reset` do not matter.
pub type WakeWord = AtomicU64;

/// No target armed.
const DISARMED: u64 = u64::MAX;

/// A count that any thread advances by one, watched by one waiter for a target.
///
/// The waiter [`arm`](Self::arm)s a target and parks unless it was reached; the advance that
/// brings the count to the target or past it reports that the waiter must be woken — exactly
/// one advance per armed target, so a waiter that wants to hear after `k` more advances is
/// woken once, not `k` times.
///
/// | Access | Ordering | Why |
/// |---|---|---|
/// | advance: `fetch_add` of the count | `Release` | publishes what the advancing thread did before (its task's effects) to a reader of the count |
/// | `fence` after announcing / advancing | `SeqCst` | the Dekker pair of the module docs: a waiter that parks was seen by the advance that reaches its target |
/// | claim: CAS of the target to disarmed | `Relaxed` | picks the single notifier; no data travels through it |
/// | [`count`](Self::count) | `Acquire` | pairs with the advances' release |
#[derive(Clone, Copy, Debug)]
pub struct CountWatch<'a> {
    count: &'a WakeWord,
    target: &'a WakeWord,
}

impl<'a> CountWatch<'a> {
    /// A watch over a count and a target word; [`reset`](Self::reset) before first use.
    pub fn new(count: &'a WakeWord, target: &'a WakeWord) -> CountWatch<'a> {
        CountWatch { count, target }
    }

    /// Count 0, nothing armed. No other thread may use the words during the call.
    pub fn reset(&self) {
        self.count.store(0, Ordering::Relaxed);
        self.target.store(DISARMED, Ordering::Relaxed);
    }

    /// The count (acquire: the effects of every advance counted are visible).
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// Adds one; returns whether this advance reached the armed target, in which case the
    /// caller must notify the waiter (the target is disarmed, so later advances do not).
    pub fn advance(&self) -> bool {
        let now = self.count.fetch_add(1, Ordering::Release) + 1;
        fence(Ordering::SeqCst);
        let target = self.target.load(Ordering::Relaxed);
        now >= target
            && self
                .target
                .compare_exchange(target, DISARMED, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Arms `target` (the waiter only; one target at a time) and returns whether the count
    /// already reached it, in which case it is disarmed again and the waiter must not park.
    /// Otherwise the advance that reaches it reports so; a wait that ends for another reason
    /// leaves it armed, and the next `arm` replaces it.
    pub fn arm(&self, target: u64) -> bool {
        self.target.store(target, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.count.load(Ordering::Acquire) >= target {
            self.target.store(DISARMED, Ordering::Relaxed);
            return true;
        }
        false
    }
}

/// How many consumers may be about to park for want of work.
///
/// A consumer that found no work [`enter`](Self::enter)s, re-checks for work and only then
/// parks; it [`leave`](Self::leave)s once it has work again. A producer that published work
/// asks [`any_besides`](Self::any_besides) and notifies the consumers when it says so; while
/// every consumer is busy that costs one fence and one load, and no notification.
///
/// | Access | Ordering | Why |
/// |---|---|---|
/// | `enter` / `leave`: `fetch_add` / `fetch_sub` | `Relaxed` | a count; the fences order it |
/// | `fence` after entering / publishing | `SeqCst` | the Dekker pair of the module docs |
/// | load in `any_besides` | `Relaxed` | ordered by the fence before it |
#[derive(Clone, Copy, Debug)]
pub struct Idlers<'a> {
    count: &'a WakeWord,
}

impl<'a> Idlers<'a> {
    /// Idlers counted in `count`; [`reset`](Self::reset) before first use.
    pub fn new(count: &'a WakeWord) -> Idlers<'a> {
        Idlers { count }
    }

    /// Nobody idle. No other thread may use the word during the call.
    pub fn reset(&self) {
        self.count.store(0, Ordering::Relaxed);
    }

    /// This consumer is idle; it must re-check for work before it parks.
    pub fn enter(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// This consumer (which entered) has work again.
    pub fn leave(&self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }

    /// After publishing work: whether a consumer other than the caller may be parked or about
    /// to park (`caller_idle`: the caller itself is counted as idle, so it does not count).
    pub fn any_besides(&self, caller_idle: bool) -> bool {
        fence(Ordering::SeqCst);
        self.count.load(Ordering::Relaxed) > u64::from(caller_idle)
    }
}

#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use super::*;

    #[test]
    fn one_advance_reports_each_armed_target() {
        let (c, t) = (WakeWord::new(5), WakeWord::new(9));
        let w = CountWatch::new(&c, &t);
        w.reset();
        assert!(!w.advance(), "nothing armed");
        assert!(!w.arm(3));
        assert!(!w.advance());
        assert!(w.advance(), "count 3 reaches the target");
        assert!(!w.advance(), "reported once");
        assert!(w.arm(4), "already reached");
        assert!(!w.advance(), "disarmed by the arm that found it reached");
        assert_eq!(w.count(), 5);
    }

    #[test]
    fn idlers_count_everyone_but_the_caller() {
        let c = WakeWord::new(3);
        let i = Idlers::new(&c);
        i.reset();
        assert!(!i.any_besides(false));
        i.enter();
        assert!(i.any_besides(false));
        assert!(!i.any_besides(true));
        i.enter();
        assert!(i.any_besides(true));
        i.leave();
        i.leave();
        assert!(!i.any_besides(false));
    }

    /// Threads advancing while a waiter arms targets and "parks" (spins on a flag set only by
    /// the reported notifications): every wait ends, and no target is reported twice.
    #[test]
    fn a_waiter_hammered_by_advancers_is_always_woken() {
        use std::sync::atomic::AtomicBool;
        const PER: u64 = 50_000;
        const THREADS: u64 = 3;
        let (c, t) = (WakeWord::new(0), WakeWord::new(0));
        let w = CountWatch::new(&c, &t);
        w.reset();
        let woken = AtomicBool::new(false);
        let notifies = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..PER {
                        if w.advance() {
                            notifies.fetch_add(1, Ordering::Relaxed);
                            woken.store(true, Ordering::Release);
                        }
                    }
                });
            }
            let mut arms = 0u64;
            loop {
                let now = w.count();
                if now == THREADS * PER {
                    break;
                }
                woken.store(false, Ordering::Relaxed);
                let target = (now + 7).min(THREADS * PER);
                arms += 1;
                if !w.arm(target) {
                    // The "park": only a reported notification (or the run's end) ends it.
                    while !woken.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                }
            }
            assert!(notifies.load(Ordering::Relaxed) <= arms);
        });
    }
}
