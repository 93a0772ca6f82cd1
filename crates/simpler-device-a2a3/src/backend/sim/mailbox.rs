//! A simulated thread's mailbox: at most one job, or the quit request (`docs/device-simulator.md`,
//! "Device object and threads").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Condvar, Mutex};

use super::stream::LaunchEntry;

/// A thread's mailbox: at most one job, or the quit request.
#[derive(Debug, Default)]
pub(super) struct Mailbox {
    pub(super) state: Mutex<Mail>,
    pub(super) cv: Condvar,
    /// Set by `put` after it left mail; read without the lock by a thread lingering before it
    /// parks, cleared by that thread under the lock before each look at the mail.
    pub(super) posted: AtomicBool,
}

/// What a mailbox holds.
#[derive(Debug, Default)]
pub(super) enum Mail {
    #[default]
    Empty,
    Job {
        stream: usize,
        entry: Arc<LaunchEntry>,
        /// Other AICPU participants of the same entry whose parts never wait (a bit per
        /// thread index): this thread runs them, in index order, before its own part.
        brief: u32,
    },
    /// A core's thread takes over the launch AICPU threads were driving for it (`drive.rs`).
    Adopt,
    Quit,
}

impl Mailbox {
    /// Leaves `mail` for the thread and wakes it. A thread told to quit serves nothing more: a
    /// job a queued launch starts during the shutdown must not take the place of the `Quit`
    /// the thread has not read yet (it would then park for good).
    /// An adoption never replaces a job: a core with a posted launch has no launch to adopt
    /// (an adoption asked for before that launch was posted is stale).
    pub(super) fn put(&self, mail: Mail) {
        let mut st = self.state.lock();
        let keep = matches!((&*st, &mail), (Mail::Quit, _) | (Mail::Job { .. }, Mail::Adopt));
        if !keep {
            *st = mail;
        }
        // Release: a lingering thread that sees the flag finds the mail under the lock anyway;
        // the flag only ends its linger early.
        self.posted.store(true, Ordering::Release);
        drop(st);
        self.cv.notify_one();
    }
}
