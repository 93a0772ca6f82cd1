//! Ring stalls: a submit that no completion can make room for, typed and worded for the
//! diagnostics (`docs/device-trb.md`, "Stalls").

use std::fmt;

use crate::abi::codes::RuntimeCode;
use crate::runtime::trb::sizing::RingSizes;

/// What stalled, in the words of the runtime codes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum StallKind {
    /// One scope needs more task slots than the window holds.
    Scope,
    /// The heap cannot place a slab and the slabs in the way belong to an open scope.
    Heap,
    /// The heap has room, but its table of slab records is full and its oldest records belong
    /// to an open scope (a record per task slab and per buffer allocated for a task).
    HeapRecords,
    /// The dependency pool cannot take a task's edges.
    DepPool,
    /// The tensor map holds only accesses of tasks that will not complete while the
    /// orchestration waits.
    Tensormap,
}

/// A wait that can never end: the ring, its three sizes and its usage at the failure.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct RingStall {
    /// What stalled.
    pub(crate) kind: StallKind,
    /// The ring.
    pub(crate) ring: u8,
    /// The ring's sizes.
    pub(crate) sizes: RingSizes,
    /// Unreclaimed task slots of the ring.
    pub(crate) tasks: u32,
    /// Occupied heap bytes of the ring.
    pub(crate) heap: u64,
    /// Unreclaimed dependency entries of the ring.
    pub(crate) deps: u64,
    /// What the refused submit needed: slots, bytes, entries or map entries by `kind`.
    pub(crate) needed: u64,
    /// Tensor-map entries (capacity) for a tensor-map stall.
    pub(crate) map_capacity: u32,
    /// Heap records of the ring (capacity), for a heap-record stall.
    pub(crate) heap_records: u32,
}

impl RingStall {
    /// The runtime code the stall latches.
    pub(crate) fn code(&self) -> RuntimeCode {
        match self.kind {
            StallKind::Scope => RuntimeCode::ScopeDeadlock,
            StallKind::Heap | StallKind::HeapRecords => RuntimeCode::HeapRingDeadlock,
            StallKind::DepPool => RuntimeCode::DepPoolOverflow,
            StallKind::Tensormap => RuntimeCode::TensormapOverflow,
        }
    }
}

impl fmt::Display for RingStall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.sizes;
        write!(f, "ring {}: ", self.ring)?;
        match self.kind {
            StallKind::Scope => write!(
                f,
                "scope needs {} task slots, window {}",
                u64::from(self.tasks) + self.needed,
                s.task_window
            )?,
            StallKind::Heap => write!(
                f,
                "scope needs {} more heap bytes with {} of {} held by the open scope",
                self.needed, self.heap, s.heap_bytes
            )?,
            StallKind::HeapRecords => write!(
                f,
                "scope needs a heap record with all {} in use (twice the window)",
                self.heap_records
            )?,
            StallKind::DepPool => write!(
                f,
                "a task needs {} dep entries with {} of {} in use",
                self.needed, self.deps, s.dep_pool
            )?,
            StallKind::Tensormap => write!(
                f,
                "the tensor map's {} entries all hold accesses of tasks that cannot complete, \
                 {} more needed",
                self.map_capacity, self.needed
            )?,
        }
        write!(
            f,
            " (sizes: window {}, heap {} bytes, dep pool {}; usage: {} tasks, {} heap bytes, \
             {} dep entries)",
            s.task_window, s.heap_bytes, s.dep_pool, self.tasks, self.heap, self.deps
        )
    }
}
