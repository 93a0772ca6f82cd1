//! Identifiers: runs, tasks, slots, workers, rings and callables (see `docs/types.md`).

use std::fmt;
use std::num::NonZeroU64;

use crate::constants::{CALLABLE_DIGEST_LEN, HEAP_RING_COUNT};

/// Identity of one run, issued by one engine: first id 1, strictly increasing, never reused.
///
/// 0 is unrepresentable, so `Option<RunId>` is the same size as `RunId`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunId(NonZeroU64);

impl RunId {
    /// The first id an engine issues.
    pub const FIRST: RunId = RunId(NonZeroU64::MIN);

    /// Wraps a raw id; `None` for 0.
    pub const fn from_raw(raw: u64) -> Option<RunId> {
        match NonZeroU64::new(raw) {
            Some(v) => Some(RunId(v)),
            None => None,
        }
    }

    /// The raw, non-zero value.
    pub const fn get(self) -> u64 {
        self.0.get()
    }

    /// The id issued after this one; `None` once `u64::MAX` is reached.
    pub const fn next(self) -> Option<RunId> {
        match self.0.checked_add(1) {
            Some(v) => Some(RunId(v)),
            None => None,
        }
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "run#{}", self.0)
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// User-facing name of a task: its run and its submission sequence number.
///
/// `seq` counts every task and every `alloc()` of the run from 0 in submission order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId {
    /// The run the task belongs to.
    pub run: RunId,
    /// Position in the run's submission order (tasks and allocs).
    pub seq: u32,
}

impl TaskId {
    /// Names task `seq` of `run`.
    pub const fn new(run: RunId, seq: u32) -> TaskId {
        TaskId { run, seq }
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/task#{}", self.run, self.seq)
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Engine-internal handle of one task-window entry, tagged with the entry's generation.
///
/// The generation starts at 1 and grows each time the entry is recycled, so a stale id never
/// names the entry's new occupant.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotId {
    /// Index of the entry in the task window.
    pub index: u32,
    /// Generation of the entry when this id was issued (≥ 1 for issued ids).
    pub generation: u32,
}

impl SlotId {
    /// Builds an id from its parts.
    pub const fn new(index: u32, generation: u32) -> SlotId {
        SlotId { index, generation }
    }

    /// Packs into one `u64`: `generation << 32 | index`.
    pub const fn pack(self) -> u64 {
        ((self.generation as u64) << 32) | self.index as u64
    }

    /// Inverse of [`SlotId::pack`].
    pub const fn unpack(raw: u64) -> SlotId {
        SlotId { index: raw as u32, generation: (raw >> 32) as u32 }
    }
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slot#{}@{}", self.index, self.generation)
    }
}

impl fmt::Debug for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The chip runtime's task id as stored in `Tensor.owner_task_id`.
///
/// Bits 32..40 hold the ring id, bits 0..32 the ring-local id; `u64::MAX` means "none"
/// (an external tensor).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct DeviceTaskId(pub u64);

impl DeviceTaskId {
    /// The "no owner" value carried by external tensors.
    pub const NONE: DeviceTaskId = DeviceTaskId(u64::MAX);

    /// Builds an id from a ring and a ring-local id.
    pub const fn new(ring: u8, local: u32) -> DeviceTaskId {
        DeviceTaskId(((ring as u64) << 32) | local as u64)
    }

    /// The ring id (bits 32..40).
    pub const fn ring(self) -> u8 {
        (self.0 >> 32) as u8
    }

    /// The ring-local id (bits 0..32).
    pub const fn local(self) -> u32 {
        self.0 as u32
    }

    /// `false` for [`DeviceTaskId::NONE`].
    pub const fn is_valid(self) -> bool {
        self.0 != u64::MAX
    }
}

/// Identity of a worker within its type's namespace.
///
/// NEXT_LEVEL ids are stable and user-visible (chips 0..n−1 in the order given; L4+ children in
/// adoption order). SUB ids are internal registration indices in a separate namespace.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct WorkerId(pub u32);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Names one of the [`HEAP_RING_COUNT`] heap rings (0..=3).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct RingIndex(u8);

impl RingIndex {
    /// Ring 0, used by a run's outer scope.
    pub const ZERO: RingIndex = RingIndex(0);

    /// Wraps `index`; `None` unless it is below [`HEAP_RING_COUNT`].
    pub const fn new(index: u8) -> Option<RingIndex> {
        if (index as usize) < HEAP_RING_COUNT { Some(RingIndex(index)) } else { None }
    }

    /// The ring for scope depth `depth` below the run's outer frame: `min(depth, 3)`.
    pub const fn for_depth(depth: usize) -> RingIndex {
        let max = HEAP_RING_COUNT - 1;
        RingIndex(if depth < max { depth as u8 } else { max as u8 })
    }

    /// The index as a `u8`.
    pub const fn get(self) -> u8 {
        self.0
    }

    /// The index as a `usize`, for indexing per-ring arrays.
    pub const fn as_usize(self) -> usize {
        self.0 as usize
    }

    /// All rings in order.
    pub fn all() -> impl Iterator<Item = RingIndex> {
        (0..HEAP_RING_COUNT as u8).map(RingIndex)
    }
}

impl fmt::Display for RingIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ring {}", self.0)
    }
}

/// Kind of worker a task runs on.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum WorkerType {
    /// A chip at L3, a child `Worker` at L4+.
    NextLevel = 0,
    /// A host closure worker.
    Sub = 1,
}

impl fmt::Display for WorkerType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WorkerType::NextLevel => "next-level",
            WorkerType::Sub => "sub",
        })
    }
}

/// How errors and traces name a worker: its type and its id within that type.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct WorkerRef {
    /// Worker type (separate id namespaces).
    pub ty: WorkerType,
    /// Id within the type's namespace.
    pub id: WorkerId,
}

impl WorkerRef {
    /// A NEXT_LEVEL worker.
    pub const fn next_level(id: u32) -> WorkerRef {
        WorkerRef { ty: WorkerType::NextLevel, id: WorkerId(id) }
    }

    /// A SUB worker.
    pub const fn sub(id: u32) -> WorkerRef {
        WorkerRef { ty: WorkerType::Sub, id: WorkerId(id) }
    }
}

impl fmt::Display for WorkerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} worker {}", self.ty, self.id)
    }
}

/// What a registered callable is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum CallableKind {
    /// A chip program (orchestration + kernels).
    Chip = 1,
    /// A host closure run by a SUB worker.
    Host = 2,
    /// A graph (orchestration) function run by a child `Worker` (L4+).
    Graph = 3,
}

impl fmt::Display for CallableKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CallableKind::Chip => "chip",
            CallableKind::Host => "host",
            CallableKind::Graph => "graph",
        })
    }
}

/// Which registry resolves a callable digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum CallableNamespace {
    /// The chips of this level.
    LocalChip = 1,
    /// The host workers and child Workers of this level.
    LocalHost = 2,
    /// A remote task dispatcher.
    Remote = 3,
}

/// Content identity of a registered callable. Equality and hashing use all three fields.
///
/// Computing the digest belongs to the registering crate; constructing an id cannot fail.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallableId {
    /// SHA-256 digest of the callable's descriptor.
    pub digest: [u8; CALLABLE_DIGEST_LEN],
    /// What the callable is.
    pub kind: CallableKind,
    /// Which registry resolves it.
    pub namespace: CallableNamespace,
}

impl CallableId {
    /// Builds an id from its parts.
    pub const fn new(
        digest: [u8; CALLABLE_DIGEST_LEN],
        kind: CallableKind,
        namespace: CallableNamespace,
    ) -> CallableId {
        CallableId { digest, kind, namespace }
    }

    /// The id of a host-side callable (a host closure or a graph) named `name`: the SHA-256
    /// digest of the kind and the name, in the [`LocalHost`](CallableNamespace::LocalHost)
    /// namespace. Equal names of one kind give equal ids, so name each callable of an engine
    /// distinctly.
    ///
    /// ```
    /// use simpler_types::{CallableId, CallableKind};
    ///
    /// let check = CallableId::host_named("check", CallableKind::Host);
    /// assert_eq!(check, CallableId::host_named("check", CallableKind::Host));
    /// assert_ne!(check, CallableId::host_named("load", CallableKind::Host));
    /// ```
    pub fn host_named(name: &str, kind: CallableKind) -> CallableId {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(b"simpler host callable\0");
        h.update([kind as u8]);
        h.update(name.as_bytes());
        CallableId::new(h.finalize().into(), kind, CallableNamespace::LocalHost)
    }
}

impl fmt::Display for CallableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:")?;
        for b in &self.digest {
            write!(f, "{b:02x}")?;
        }
        write!(f, " ({})", self.kind)
    }
}

impl fmt::Debug for CallableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_id_zero_is_unrepresentable_and_displays_with_prefix() {
        assert!(RunId::from_raw(0).is_none());
        let r = RunId::from_raw(7).unwrap();
        assert_eq!(r.to_string(), "run#7");
        assert_eq!(TaskId::new(r, 12).to_string(), "run#7/task#12");
        assert_eq!(RunId::from_raw(u64::MAX).unwrap().next(), None);
        assert_eq!(std::mem::size_of::<Option<RunId>>(), 8);
    }

    #[test]
    fn slot_id_pack_round_trips() {
        for (i, g) in [(0, 1), (5, 9), (u32::MAX, u32::MAX), (123_456, 1)] {
            let s = SlotId::new(i, g);
            assert_eq!(SlotId::unpack(s.pack()), s);
            assert_eq!(s.pack(), (u64::from(g) << 32) | u64::from(i));
        }
    }

    #[test]
    fn device_task_id_fields() {
        let d = DeviceTaskId::new(3, 77);
        assert_eq!((d.ring(), d.local(), d.is_valid()), (3, 77, true));
        assert!(!DeviceTaskId::NONE.is_valid());
    }

    #[test]
    fn ring_index_rules() {
        assert_eq!(RingIndex::new(3).map(RingIndex::get), Some(3));
        assert!(RingIndex::new(4).is_none());
        let by_depth: Vec<u8> = [0, 1, 2, 3, 4, 64].map(|d| RingIndex::for_depth(d).get()).into();
        assert_eq!(by_depth, vec![0, 1, 2, 3, 3, 3]);
    }
}
