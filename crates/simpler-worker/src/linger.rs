//! Waits that yield for a short while before they park (`docs/pipelining.md`, "The L2 chip
//! lane at depth 2", step 7).
//!
//! A stream of runs hands each run over twice: the submitter's job to the lane, and the lane's
//! reply to the submitter one preparation later; whoever waits for an L2 run then waits for the
//! lane to publish its fence. Each usually arrives within a few microseconds, and on a virtual
//! machine a parked thread woken from another vCPU costs about 10 µs of wall time and CPU on
//! both sides. So the receiving side yields first.

use std::sync::mpsc::{Receiver, RecvError, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

/// How long a wait yields before it parks.
pub(crate) const LINGER: Duration = Duration::from_micros(30);

/// Receives from `rx`, yielding for up to [`LINGER`] before it blocks.
pub(crate) fn recv<T>(rx: &Receiver<T>) -> Result<T, RecvError> {
    match try_recv(rx, None) {
        Err(TryRecvError::Empty) => rx.recv(),
        got => got.map_err(|_| RecvError),
    }
}

/// Receives from `rx` until `deadline`, yielding for up to [`LINGER`] before it blocks.
pub(crate) fn recv_until<T>(rx: &Receiver<T>, deadline: Instant) -> Result<T, RecvTimeoutError> {
    match try_recv(rx, Some(deadline)) {
        Err(TryRecvError::Empty) => {
            rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        }
        got => got.map_err(|_| RecvTimeoutError::Disconnected),
    }
}

/// Yields until `rx` holds a message, [`LINGER`] has passed or `until` comes: the message, or
/// what the last look found (`Empty` once the time is up, `Disconnected` at once).
fn try_recv<T>(rx: &Receiver<T>, until: Option<Instant>) -> Result<T, TryRecvError> {
    try_recv_for(rx, LINGER, until)
}

fn try_recv_for<T>(
    rx: &Receiver<T>,
    budget: Duration,
    until: Option<Instant>,
) -> Result<T, TryRecvError> {
    let look = || match rx.try_recv() {
        Err(TryRecvError::Empty) => None,
        got => Some(got),
    };
    poll_for(look, budget, until).unwrap_or(Err(TryRecvError::Empty))
}

/// Yields until `done()` holds, [`LINGER`] has passed or `deadline` comes; whether it held.
pub(crate) fn until(done: impl FnMut() -> bool, deadline: Option<Instant>) -> bool {
    until_for(done, LINGER, deadline)
}

/// As [`until`], for `budget` instead of [`LINGER`].
#[cfg(not(simpler_loom))]
pub(crate) fn until_for(
    mut done: impl FnMut() -> bool,
    budget: Duration,
    deadline: Option<Instant>,
) -> bool {
    poll_for(|| done().then_some(()), budget, deadline).is_some()
}

/// One look: loom explores the interleavings itself, and a yielding loop would only multiply
/// its states.
#[cfg(simpler_loom)]
pub(crate) fn until_for(
    mut done: impl FnMut() -> bool,
    _budget: Duration,
    _deadline: Option<Instant>,
) -> bool {
    done()
}

/// Yields between looks until `look` finds something, `budget` has passed or `until` comes.
fn poll_for<T>(
    mut look: impl FnMut() -> Option<T>,
    budget: Duration,
    until: Option<Instant>,
) -> Option<T> {
    let end = match (Instant::now().checked_add(budget), until) {
        (Some(e), Some(u)) => Some(e.min(u)),
        (e, u) => e.or(u),
    };
    loop {
        if let Some(found) = look() {
            return Some(found);
        }
        if end.is_some_and(|e| Instant::now() >= e) {
            return None;
        }
        std::thread::yield_now();
    }
}

// Under loom `until` looks once, so its budget test holds only in normal builds.
#[cfg(all(test, not(simpler_loom)))]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, mpsc};

    use super::*;

    #[test]
    fn a_linger_takes_a_message_sent_meanwhile_and_gives_up_after_its_budget() {
        let (tx, rx) = mpsc::channel();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1));
            tx.send(7).expect("send");
            tx
        });
        // A budget long enough for any machine: only a linger that stops looking misses it.
        assert_eq!(try_recv_for(&rx, Duration::from_secs(60), None), Ok(7));
        let tx = sender.join().expect("sender");
        let start = Instant::now();
        assert_eq!(try_recv(&rx, None), Err(TryRecvError::Empty));
        assert!(start.elapsed() >= LINGER, "gave up before its budget");
        let past = Some(Instant::now());
        assert_eq!(try_recv_for(&rx, Duration::from_secs(60), past), Err(TryRecvError::Empty));
        assert!(
            past.is_some_and(|p| p.elapsed() < Duration::from_secs(30)),
            "the deadline ends it"
        );
        drop(tx);
        assert_eq!(
            try_recv_for(&rx, Duration::from_secs(60), None),
            Err(TryRecvError::Disconnected)
        );
    }

    #[test]
    fn a_flag_linger_sees_a_flag_set_meanwhile_and_honours_its_budget_and_deadline() {
        let flag = Arc::new(AtomicBool::new(false));
        let setter = {
            let flag = Arc::clone(&flag);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(1));
                flag.store(true, Ordering::Release);
            })
        };
        let look = || flag.load(Ordering::Acquire).then_some(());
        assert_eq!(poll_for(look, Duration::from_secs(60), None), Some(()), "missed the flag");
        setter.join().expect("setter");
        let start = Instant::now();
        assert!(!until(|| false, None));
        assert!(start.elapsed() >= LINGER, "gave up before its budget");
        let past = Some(Instant::now());
        let mut looks = 0;
        assert!(!until(
            || {
                looks += 1;
                false
            },
            past
        ));
        assert_eq!(looks, 1, "a deadline already passed allows one look");
        assert!(until(|| true, past), "a flag already set is seen past the deadline too");
    }

    #[test]
    fn a_receive_blocks_once_its_linger_is_over_and_a_timed_one_ends_at_its_deadline() {
        let (tx, rx) = mpsc::channel();
        let sender = std::thread::spawn(move || {
            // Well past the linger, so only the blocking fallback can take it.
            std::thread::sleep(Duration::from_millis(5));
            tx.send(7).expect("send");
            tx
        });
        assert_eq!(recv(&rx), Ok(7));
        let tx = sender.join().expect("sender");
        let start = Instant::now();
        let deadline = start + Duration::from_millis(2);
        assert_eq!(recv_until(&rx, deadline), Err(RecvTimeoutError::Timeout));
        assert!(Instant::now() >= deadline, "gave up before its deadline");
        drop(tx);
        assert_eq!(recv(&rx), Err(RecvError));
        assert_eq!(recv_until(&rx, Instant::now()), Err(RecvTimeoutError::Disconnected));
    }
}
