//! Receives that yield for a short while before they park (`docs/pipelining.md`, "The L2
//! chip lane at depth 2", step 7).
//!
//! A stream of runs hands each run over twice: the submitter's job to the lane, and the lane's
//! reply to the submitter one preparation later. Each usually arrives within a few
//! microseconds, and on a virtual machine a parked thread woken from another vCPU costs about
//! 10 µs of wall time and CPU on both sides. So the receiving side yields first.

use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

/// How long a receive yields before it parks.
pub(crate) const LINGER: Duration = Duration::from_micros(30);

/// Yields until `rx` holds a message, [`LINGER`] has passed or `until` comes: the message, or
/// what the last look found (`Empty` once the time is up, `Disconnected` at once).
pub(crate) fn try_recv<T>(rx: &Receiver<T>, until: Option<Instant>) -> Result<T, TryRecvError> {
    try_recv_for(rx, LINGER, until)
}

fn try_recv_for<T>(
    rx: &Receiver<T>,
    budget: Duration,
    until: Option<Instant>,
) -> Result<T, TryRecvError> {
    let end = match (Instant::now().checked_add(budget), until) {
        (Some(e), Some(u)) => Some(e.min(u)),
        (e, u) => e.or(u),
    };
    loop {
        match rx.try_recv() {
            Err(TryRecvError::Empty) if end.is_none_or(|e| Instant::now() < e) => {
                std::thread::yield_now()
            }
            got => return got,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

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
}
