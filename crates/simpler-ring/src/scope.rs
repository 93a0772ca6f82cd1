//! [`ScopeStack`]: the orchestrator's stack of scope frames (`docs/ring.md` §3).
//!
//! Plain data, owned by one orchestration thread. Frames are reusable vectors: a popped frame
//! keeps its capacity for the next `begin`, so steady-state scoping allocates nothing. The stack
//! only hands slots back; turning them into reference releases is the engine's job.

use simpler_types::{MAX_SCOPE_DEPTH, RingIndex, SlotId};

use crate::error::RingError;

/// A stack of scope frames, each listing the slots registered while it was innermost.
#[derive(Debug, Default, Clone)]
pub struct ScopeStack {
    /// `frames[..depth]` are open; the rest are spare vectors kept for reuse (always empty).
    frames: Vec<Vec<SlotId>>,
    depth: usize,
}

impl ScopeStack {
    /// An empty stack (depth 0).
    pub fn new() -> Self {
        ScopeStack::default()
    }

    /// Pushes a frame. Depth counts every frame, the run's outer frame included; at
    /// [`MAX_SCOPE_DEPTH`] the call fails with `ScopeDepthExceeded` and changes nothing.
    pub fn begin(&mut self) -> Result<(), RingError> {
        if self.depth >= MAX_SCOPE_DEPTH {
            return Err(RingError::ScopeDepthExceeded { max: MAX_SCOPE_DEPTH });
        }
        if self.frames.len() == self.depth {
            self.frames.push(Vec::new());
        }
        self.depth += 1;
        Ok(())
    }

    /// Appends `slot` to the innermost frame; a no-op at depth 0.
    pub fn register(&mut self, slot: SlotId) {
        if let Some(frame) = self.depth.checked_sub(1).and_then(|top| self.frames.get_mut(top)) {
            frame.push(slot);
        }
    }

    /// Pops the innermost frame, appending its slots to `out` in registration order.
    pub fn end_into(&mut self, out: &mut Vec<SlotId>) -> Result<(), RingError> {
        let top = self.depth.checked_sub(1).ok_or(RingError::ScopeUnderflow)?;
        if let Some(frame) = self.frames.get_mut(top) {
            out.append(frame);
        }
        self.depth = top;
        Ok(())
    }

    /// Pops frames, innermost first, until the depth equals `to_depth`, appending each frame's
    /// slots to `out` in registration order. Does nothing when `to_depth >= depth()`.
    pub fn unwind_into(&mut self, out: &mut Vec<SlotId>, to_depth: usize) {
        while self.depth > to_depth {
            // Cannot fail: the depth is positive inside the loop.
            let _ = self.end_into(out);
        }
    }

    /// Open frames, the run's outer frame included.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The heap ring for allocations made now: `min(depth − 1, 3)`, ring 0 at depth ≤ 1.
    pub fn ring_index(&self) -> RingIndex {
        RingIndex::for_depth(self.depth.saturating_sub(1))
    }
}
