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

/// Yields until `rx` holds a message or [`LINGER`] has passed: the message, or what the last
/// look found (`Empty` after the linger, `Disconnected` at once).
pub(crate) fn try_recv<T>(rx: &Receiver<T>) -> Result<T, TryRecvError> {
    let end = Instant::now() + LINGER;
    loop {
        match rx.try_recv() {
            Err(TryRecvError::Empty) if Instant::now() < end => std::thread::yield_now(),
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
            std::thread::sleep(Duration::from_micros(5));
            tx.send(7).expect("send");
            tx
        });
        // The sender may be late on a loaded machine: then the linger ends empty, and the
        // message is still there for the next receive.
        let got = try_recv(&rx).or_else(|_| rx.recv().map_err(|_| TryRecvError::Disconnected));
        assert_eq!(got, Ok(7));
        let tx = sender.join().expect("sender");
        let start = Instant::now();
        assert_eq!(try_recv(&rx), Err(TryRecvError::Empty));
        assert!(start.elapsed() >= LINGER, "gave up before its budget");
        drop(tx);
        assert_eq!(try_recv(&rx), Err(TryRecvError::Disconnected));
    }
}
