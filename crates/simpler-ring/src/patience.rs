//! [`Patience`]: how long one allocation may still wait, shared by its window and heap steps.

use std::time::{Duration, Instant};

/// The waiting budget of one allocation call.
///
/// A relative timeout is turned into a deadline the first time the call has to wait. Everything
/// before that point is short non-blocking work (two leaf locks at most), so the deadline is
/// still, for any practical purpose, fixed when the call starts; the hot path that never waits
/// does not read the clock at all.
#[derive(Debug)]
pub(crate) struct Patience {
    budget: Budget,
    /// Time spent blocked so far, summed over every wait of this call.
    pub(crate) waited: Duration,
    /// Whether giving up counts as a refusal in the stats (not for a probe that a waiting call
    /// follows).
    pub(crate) counts_refusal: bool,
}

#[derive(Debug, Clone, Copy)]
enum Budget {
    Never,
    For(Duration),
    Until(Instant),
    Forever,
}

impl Patience {
    /// Never waits.
    pub(crate) fn never() -> Self {
        Patience { budget: Budget::Never, waited: Duration::ZERO, counts_refusal: true }
    }

    /// Never waits, and a refusal is not counted: the caller tries again with a waiting call.
    pub(crate) fn probe() -> Self {
        Patience { counts_refusal: false, ..Patience::never() }
    }

    /// Waits up to `timeout` from the first wait; `Duration::ZERO` never waits.
    pub(crate) fn timeout(timeout: Duration) -> Self {
        let budget = if timeout.is_zero() { Budget::Never } else { Budget::For(timeout) };
        Patience { budget, waited: Duration::ZERO, counts_refusal: true }
    }

    /// Waits until `deadline`, or without limit for `None`.
    pub(crate) fn until(deadline: Option<Instant>) -> Self {
        let budget = match deadline {
            Some(deadline) => Budget::Until(deadline),
            None => Budget::Forever,
        };
        Patience { budget, waited: Duration::ZERO, counts_refusal: true }
    }

    /// Whether the call may block now, and until when: `None` = give up, `Some(None)` = wait
    /// without a deadline, `Some(Some(t))` = wait until `t`.
    pub(crate) fn next_wait(&mut self) -> Option<Option<Instant>> {
        if let Budget::For(timeout) = self.budget {
            self.budget = match Instant::now().checked_add(timeout) {
                Some(deadline) => Budget::Until(deadline),
                None => Budget::Forever,
            };
        }
        match self.budget {
            Budget::Never | Budget::For(_) => None,
            Budget::Until(deadline) if Instant::now() >= deadline => None,
            Budget::Until(deadline) => Some(Some(deadline)),
            Budget::Forever => Some(None),
        }
    }
}
