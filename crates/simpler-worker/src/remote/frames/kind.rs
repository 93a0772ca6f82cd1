//! The kind byte of a frame: which message of the protocol it is.

/// Which message of the protocol a frame is; its discriminant is the frame's kind byte
/// (`docs/multi-host.md` §"Frames").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u8)]
pub enum FrameKind {
    /// Rank 0 opens a session.
    Hello = 1,
    /// A serving rank's registrations, or its start error.
    Manifest = 2,
    /// Rank 0 accepts the manifest.
    Accept = 3,
    /// Rank 0 refuses the start.
    Refuse = 4,
    /// A task for a serving rank.
    Task = 5,
    /// How a task ended.
    Completion = 6,
    /// Rank 0 ends the session.
    Shutdown = 7,
    /// The serving rank's worker is closed.
    ShutdownDone = 8,
    /// Health probe.
    Ping = 9,
    /// Health answer.
    Pong = 10,
    /// Phase 1 of a registration after start.
    Prepare = 11,
    /// The answer to `Prepare`.
    Prepared = 12,
    /// Phase 2: serve the prepared graph.
    Commit = 13,
    /// Phase 2: forget the prepared graph.
    Abort = 14,
    /// A serving rank ended its session with an error.
    Left = 15,
}

impl FrameKind {
    /// The frames that may answer a serving rank's `Manifest`.
    pub(crate) const ANSWERS_TO_MANIFEST: &'static [FrameKind] =
        &[FrameKind::Accept, FrameKind::Refuse];

    /// What rank 0 sends a serving rank during an accepted session.
    pub(crate) const SESSION_REQUESTS: &'static [FrameKind] = &[
        FrameKind::Prepare,
        FrameKind::Commit,
        FrameKind::Abort,
        FrameKind::Task,
        FrameKind::Shutdown,
    ];

    /// Every kind, in code order.
    const ALL: [FrameKind; 15] = [
        FrameKind::Hello,
        FrameKind::Manifest,
        FrameKind::Accept,
        FrameKind::Refuse,
        FrameKind::Task,
        FrameKind::Completion,
        FrameKind::Shutdown,
        FrameKind::ShutdownDone,
        FrameKind::Ping,
        FrameKind::Pong,
        FrameKind::Prepare,
        FrameKind::Prepared,
        FrameKind::Commit,
        FrameKind::Abort,
        FrameKind::Left,
    ];

    /// The kind whose byte is `code`.
    pub(crate) fn from_code(code: u8) -> Option<FrameKind> {
        FrameKind::ALL.into_iter().find(|k| *k as u8 == code)
    }
}

impl std::fmt::Display for FrameKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}
