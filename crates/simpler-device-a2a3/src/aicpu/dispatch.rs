//! One AICore core's dispatch state, as its owning AICPU thread sees it (`docs/device-handshake.md`).
//!
//! A core holds at most one running and one pending dispatch. The AICore processes tokens in
//! the order they were written, so a `COND` value naming the pending token also proves the
//! running one finished, even when its FIN was never observed (a poll can miss intermediate
//! values). The state machine:
//!
//! | Observed `COND` | running | pending | Effect |
//! |---|---|---|---|
//! | `ACK(r)` | `r`, not acked | — | mark `r` acked (a pending token may now be written) |
//! | `FIN(r)` | `r` | `p` or none | `r` completes; `p` (if any) becomes running, not yet acked |
//! | `ACK(p)` | `r` | `p` | `r` completes; `p` becomes running, acked |
//! | `FIN(p)` | `r` | `p` | `r` and `p` complete |
//! | anything else | | | stale, ignored |
//!
//! A token may be written only while the core is idle, or while its running token is acked
//! and nothing is pending: then the payload buffer being filled (`token & 1`) belongs to a
//! token that has finished, so the AICore is not reading it.

use crate::abi::CoreType;
use crate::abi::regs::{Cond, TokenSeq};

/// A dispatch in flight on a core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatch {
    /// The token it was written with.
    pub token: u32,
    /// Index of its task in the image.
    pub task: u32,
    /// Whether the AICore acknowledged it.
    pub acked: bool,
}

/// One owned core.
#[derive(Clone, Copy, Debug)]
pub struct CoreState {
    /// Core index in the launch.
    pub index: u32,
    /// Cube or vector.
    pub core_type: CoreType,
    /// Sub-block id (AIV only).
    pub sub_block: u32,
    /// Cluster of the core.
    pub cluster: u32,
    seq: TokenSeq,
    running: Option<Dispatch>,
    pending: Option<Dispatch>,
    last_cond: u32,
}

/// Tasks a `COND` observation completed (at most two).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completed {
    tasks: [u32; 2],
    len: u8,
}

impl Completed {
    fn push(&mut self, task: u32) {
        if (self.len as usize) < self.tasks.len() {
            self.tasks[self.len as usize] = task;
            self.len += 1;
        }
    }

    /// The completed task indices, oldest first.
    pub fn as_slice(&self) -> &[u32] {
        &self.tasks[..self.len as usize]
    }
}

/// Why a token could not be issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IssueRefused {
    /// The running token is not acknowledged yet.
    RunningNotAcked,
    /// A pending token is already waiting.
    PendingFull,
}

impl CoreState {
    /// An idle core.
    pub const fn new(index: u32, core_type: CoreType, cluster: u32, sub_block: u32) -> CoreState {
        CoreState {
            index,
            core_type,
            sub_block,
            cluster,
            seq: TokenSeq::new(),
            running: None,
            pending: None,
            last_cond: 0,
        }
    }

    /// The dispatch running on the core.
    pub fn running(&self) -> Option<Dispatch> {
        self.running
    }

    /// The dispatch waiting behind it.
    pub fn pending(&self) -> Option<Dispatch> {
        self.pending
    }

    /// Nothing running.
    pub fn is_idle(&self) -> bool {
        self.running.is_none()
    }

    /// Whether a token may be written now (idle, or running acked with no pending).
    pub fn can_accept(&self) -> bool {
        match (self.running, self.pending) {
            (None, _) => true,
            (Some(r), None) => r.acked,
            (Some(_), Some(_)) => false,
        }
    }

    /// Whether anything is in flight (the core's `COND` needs polling).
    pub fn busy(&self) -> bool {
        self.running.is_some()
    }

    /// Takes the next token for `task`, recording it as running or pending.
    pub fn issue(&mut self, task: u32) -> Result<u32, IssueRefused> {
        match (self.running, self.pending) {
            (Some(r), None) if !r.acked => return Err(IssueRefused::RunningNotAcked),
            (Some(_), Some(_)) => return Err(IssueRefused::PendingFull),
            _ => {}
        }
        let token = self.seq.next_token();
        let d = Dispatch { token, task, acked: false };
        if self.running.is_none() {
            self.running = Some(d);
        } else {
            self.pending = Some(d);
        }
        Ok(token)
    }

    /// Applies an observed `COND` value; returns the tasks it completed.
    pub fn observe(&mut self, raw: u32) -> Completed {
        let mut done = Completed::default();
        if raw == self.last_cond {
            return done;
        }
        self.last_cond = raw;
        let c = Cond(raw);
        if let (Some(r), Some(p)) = (self.running, self.pending)
            && c.token() == p.token
        {
            done.push(r.task);
            self.pending = None;
            if c.is_fin() {
                done.push(p.task);
                self.running = None;
            } else {
                self.running = Some(Dispatch { acked: true, ..p });
            }
            return done;
        }
        if let Some(r) = self.running
            && c.token() == r.token
        {
            if c.is_fin() {
                done.push(r.task);
                self.running = self.pending.take();
            } else {
                self.running = Some(Dispatch { acked: true, ..r });
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core() -> CoreState {
        CoreState::new(0, CoreType::Aiv, 0, 0)
    }

    #[test]
    fn a_second_token_is_never_issued_before_the_first_is_acked() {
        let mut w = core();
        let t1 = w.issue(10).unwrap();
        assert_eq!(w.issue(11), Err(IssueRefused::RunningNotAcked));
        assert!(w.observe(Cond::ack(t1).0).as_slice().is_empty());
        let t2 = w.issue(11).unwrap();
        assert_ne!(t1 & 1, t2 & 1, "consecutive tokens use different payload buffers");
        assert_eq!(w.issue(12), Err(IssueRefused::PendingFull));
    }

    #[test]
    fn fin_of_running_completes_it_and_promotes_pending() {
        let mut w = core();
        let t1 = w.issue(1).unwrap();
        w.observe(Cond::ack(t1).0);
        let t2 = w.issue(2).unwrap();
        assert_eq!(w.observe(Cond::fin(t1).0).as_slice(), &[1]);
        assert_eq!(w.running(), Some(Dispatch { token: t2, task: 2, acked: false }));
        assert_eq!(w.observe(Cond::fin(t2).0).as_slice(), &[2]);
        assert!(w.is_idle());
    }

    #[test]
    fn seeing_the_pending_token_proves_the_running_one_finished() {
        let mut w = core();
        let t1 = w.issue(1).unwrap();
        w.observe(Cond::ack(t1).0);
        let t2 = w.issue(2).unwrap();
        // FIN(t1) and ACK(t2) were missed; FIN(t2) completes both, oldest first.
        assert_eq!(w.observe(Cond::fin(t2).0).as_slice(), &[1, 2]);
        assert!(w.is_idle());
        let t3 = w.issue(3).unwrap();
        w.observe(Cond::ack(t3).0);
        let t4 = w.issue(4).unwrap();
        assert_eq!(w.observe(Cond::ack(t4).0).as_slice(), &[3]);
        assert_eq!(w.running(), Some(Dispatch { token: t4, task: 4, acked: true }));
    }

    #[test]
    fn stale_cond_values_are_ignored() {
        let mut w = core();
        let t1 = w.issue(1).unwrap();
        assert!(w.observe(crate::abi::regs::IDLE_VALUE).as_slice().is_empty());
        assert!(w.observe(Cond::fin(t1 + 5).0).as_slice().is_empty());
        assert_eq!(w.running().map(|d| d.acked), Some(false));
    }
}
