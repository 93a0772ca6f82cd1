//! The reference model: what a run's tasks must depend on, and which submits the engine must
//! refuse, computed from the plan with std collections only.
//!
//! Dependency rules (`docs/tensormap.md`):
//! - `Input` and `InOut` depend on every writer entry of the same buffer whose footprint
//!   overlaps (read after write);
//! - `Output`, `OutputExisting` and `InOut` depend on every overlapping reader entry, and on every
//!   overlapping writer entry that orders later writes (write after read);
//! - `Input` adds a reader entry beside the others; `Output`, `OutputExisting` and `InOut` drop
//!   the writer and reader entries lying entirely inside their own footprint and add a writer
//!   entry, which orders later writes when the writer is `InOut` or dropped an entry that did
//!   (so two blind writers of one span with no read between them have no edge); a blind writer
//!   of a view with gaps (not contiguous) drops the reader entries and the writer entries that
//!   order later writes only;
//! - `NoDep` and null tensors do neither; a task never depends on itself;
//! - all lookups of a task (every member, every tensor) come before any of its records, as the
//!   engine decided (`submit.rs`, step 3): a member's read then sees the buffer's earlier writers
//!   even when another member of the same group writes it.
//!
//! The model never erases entries when a task is reclaimed. Its entries are therefore a
//! superset of the engine's, and every extra entry names a task that had already finished when
//! the engine erased it. So the model's `producers` are exactly the engine's edges while nothing
//! has finished (gated runs), and a superset afterwards. What the engine must guarantee in every
//! run is `ordered_after`: each task starts after every earlier task it conflicts with —
//! the writers its reads see, the writers an `InOut` follows, and every earlier reader of bytes
//! it writes, superseded or not.

use std::collections::{BTreeMap, BTreeSet};

use simpler_sched::SchedError;
use simpler_types::{
    CallableId, CallableKind, CallableNamespace, TaskArgs, TensorArgType, WorkerId,
};

use super::plan::{
    Buffer, BufferRef, EngineShape, Footprint, SHARED, Shape, TaskKind, TaskPlan, UNKNOWN_WORKER,
    resolve,
};

/// The tensor map as the model sees it: per buffer, writer entries `(footprint, seq, orders
/// later writes)` and reader entries `(footprint, seq)`.
#[derive(Clone, Debug, Default)]
pub struct MapModel {
    writers: BTreeMap<u64, Vec<(Footprint, u32, bool)>>,
    readers: BTreeMap<u64, Vec<(Footprint, u32)>>,
    /// Every read ever recorded, never superseded: the write-after-read pairs that must hold.
    all_reads: Vec<(Footprint, u32)>,
}

impl MapModel {
    /// Adds the tasks an access of `fp` with `tag` orders after (its edges) to `edges`, and the
    /// tasks it conflicts with to `conflicts`.
    pub fn lookup(
        &self,
        fp: &Footprint,
        tag: TensorArgType,
        edges: &mut BTreeSet<u32>,
        conflicts: &mut BTreeSet<u32>,
    ) {
        let writers = self.writers.get(&fp.key).into_iter().flatten();
        let readers = self.readers.get(&fp.key).into_iter().flatten();
        for &(_, seq, orders_writes) in writers.filter(|(e, ..)| e.overlaps(fp)) {
            if tag.reads() || (tag.writes() && orders_writes) {
                edges.insert(seq);
            }
            if tag.reads() {
                conflicts.insert(seq);
            }
        }
        if tag.writes() {
            edges.extend(readers.filter(|(e, _)| e.overlaps(fp)).map(|&(_, seq)| seq));
            conflicts.extend(self.all_reads.iter().filter(|(e, _)| e.overlaps(fp)).map(|r| r.1));
        }
    }

    /// Records the access of `fp` with `tag` by `seq`.
    pub fn record(&mut self, fp: Footprint, tag: TensorArgType, seq: u32) {
        if tag.reads() {
            self.all_reads.push((fp, seq));
        }
        if !tag.writes() {
            self.readers.entry(fp.key).or_default().push((fp, seq));
            return;
        }
        let readers = self.readers.entry(fp.key).or_default();
        let mut orders_writes =
            tag == TensorArgType::InOut || readers.iter().any(|(e, _)| e.inside(&fp));
        readers.retain(|(e, _)| !e.inside(&fp));
        let writers = self.writers.entry(fp.key).or_default();
        orders_writes |= writers.iter().any(|&(e, _, o)| o && e.inside(&fp));
        // A blind write of a view with gaps replaces only the writers it ordered after (those
        // that order later writes): the bytes in its gaps of any other writer are theirs.
        let every = fp.dense || tag.reads();
        writers.retain(|&(e, _, o)| !(e.inside(&fp) && (every || o)));
        writers.push((fp, seq, orders_writes));
    }
}

/// A task the engine accepted.
#[derive(Clone, Debug)]
pub struct AcceptedTask {
    /// Position of its op in the run plan (echoed by the endpoints).
    pub plan_index: usize,
    /// Its plan.
    pub plan: TaskPlan,
    /// Stable id of each member's NEXT_LEVEL target; empty for a SUB task.
    pub targets: Vec<u32>,
    /// Sequence numbers of the tasks it waits for, as edges (allocs excluded: they are finished
    /// when created).
    pub producers: BTreeSet<u32>,
    /// Sequence numbers of the earlier tasks it conflicts with and must start after (module
    /// docs); allocs excluded.
    pub ordered_after: BTreeSet<u32>,
}

/// Everything the model knows about the run being built.
#[derive(Clone, Debug, Default)]
pub struct RunModel {
    /// Producers by footprint.
    pub map: MapModel,
    /// Accepted tasks by sequence number.
    pub tasks: BTreeMap<u32, AcceptedTask>,
    /// Sequence numbers of non-null allocs.
    pub allocs: BTreeSet<u32>,
    /// Buffers returned by non-null allocs, in order.
    pub alloc_buffers: Vec<Buffer>,
    /// The sequence number of each of `alloc_buffers`.
    pub alloc_seqs: Vec<u32>,
    /// The sequence number the next charged task or alloc gets.
    pub next_seq: u32,
    /// Open user scopes, innermost last, each with the charges registered in it.
    pub frames: Vec<Vec<u32>>,
    /// For charges whose user scope has ended: the index of the op that ended it.
    pub scope_ended_at: BTreeMap<u32, usize>,
}

/// A validation error the engine must return (`docs/engine-protocols.md` §3, in its order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// Check 3.
    DuplicateTarget {
        /// The repeated id.
        worker: u32,
    },
    /// Check 4.
    UnknownWorker {
        /// The unregistered id.
        worker: u32,
    },
    /// Check 6.
    GroupLargerThanPool {
        /// Members.
        size: usize,
        /// SUB endpoints.
        pool: usize,
    },
    /// Check 9.
    OutputWithoutBuffer {
        /// Member index.
        member: usize,
        /// Argument index.
        arg: usize,
        /// The write tag.
        tag: TensorArgType,
    },
    /// Check 12: a tensor of an `alloc()` buffer whose scope ended.
    NotAnAllocBuffer {
        /// Member index.
        member: usize,
        /// Argument index.
        arg: usize,
    },
    /// Check 11.
    OverlappingWrites {
        /// Member index.
        member: usize,
        /// The earlier argument.
        first: usize,
        /// The later argument.
        second: usize,
    },
}

impl Rejection {
    /// Whether `err` is this rejection, field for field.
    pub fn matches(&self, err: &SchedError) -> bool {
        match (self, err) {
            (Rejection::DuplicateTarget { worker }, SchedError::DuplicateTarget { worker: w })
            | (Rejection::UnknownWorker { worker }, SchedError::UnknownWorker { worker: w }) => {
                *w == WorkerId(*worker)
            }
            (
                Rejection::GroupLargerThanPool { size, pool },
                SchedError::GroupLargerThanPool { size: s, pool: p },
            ) => size == s && pool == p,
            (
                Rejection::OutputWithoutBuffer { member, arg, tag },
                SchedError::OutputWithoutBuffer { member: m, arg: a, tag: t },
            ) => member == m && arg == a && tag == t,
            (
                Rejection::OverlappingWrites { member, first, second },
                SchedError::OverlappingWrites { member: m, first: f, second: s },
            ) => member == m && first == f && second == s,
            (
                Rejection::NotAnAllocBuffer { member, arg },
                SchedError::NotAnAllocBuffer { member: m, arg: a, .. },
            ) => member == m && arg == a,
            _ => false,
        }
    }
}

/// A submit, resolved against the model's current buffers.
#[derive(Debug)]
pub struct PreparedSubmit {
    /// Arguments per member: the tensors, then scalars `[plan index, action code, delay µs]`.
    pub args: Vec<TaskArgs>,
    /// NEXT_LEVEL target ids per member (empty for SUB).
    pub targets: Vec<u32>,
    /// Tag and footprint of every tensor, per member.
    pub footprints: Vec<Vec<(TensorArgType, Option<Footprint>)>>,
    /// The error the engine must return, if the submit is invalid.
    pub rejection: Option<Rejection>,
}

/// The NEXT_LEVEL callable for an engine of `level` (`Chip` at L3, `Graph` above).
pub fn next_level_callable(level: u8) -> CallableId {
    let kind = if level <= 3 { CallableKind::Chip } else { CallableKind::Graph };
    CallableId::new([level; 32], kind, CallableNamespace::LocalChip)
}

/// The SUB callable.
pub fn sub_callable() -> CallableId {
    CallableId::new([0xab; 32], CallableKind::Host, CallableNamespace::LocalHost)
}

impl RunModel {
    /// Whether `r` names an `alloc()` buffer the engine no longer takes: no buffer whose scope
    /// is open sits at its address with at least its bytes (its own scope ended, and the
    /// address was not handed out again to a buffer as large).
    fn alloc_scope_ended(&self, r: BufferRef) -> bool {
        let BufferRef::Alloc(i) = r else { return false };
        if self.alloc_buffers.is_empty() {
            return false;
        }
        let bytes = |b: &Buffer| match b.shape {
            Shape::Flat(n) => n,
            Shape::Grid { rows, cols } => rows * cols,
        };
        let named = self.alloc_buffers[usize::from(i) % self.alloc_buffers.len()];
        !self.alloc_buffers.iter().zip(&self.alloc_seqs).any(|(b, seq)| {
            b.base == named.base
                && bytes(b) >= bytes(&named)
                && !self.scope_ended_at.contains_key(seq)
        })
    }

    /// The buffer a tensor plan names, given the allocs made so far.
    pub fn buffer(&self, r: BufferRef) -> Buffer {
        let shared = |i: u8| {
            let s = SHARED[usize::from(i) % SHARED.len()];
            Buffer { base: s.base, shape: s.shape }
        };
        match r {
            BufferRef::Shared(i) => shared(i),
            BufferRef::Alloc(i) if self.alloc_buffers.is_empty() => shared(i),
            BufferRef::Alloc(i) => self.alloc_buffers[usize::from(i) % self.alloc_buffers.len()],
            BufferRef::Null => Buffer { base: 0, shape: Shape::Flat(8) },
        }
    }

    /// Resolves `plan` (op `plan_index`) into arguments and predicts the engine's verdict.
    pub fn prepare(
        &self,
        plan_index: usize,
        plan: &TaskPlan,
        shape: &EngineShape,
    ) -> PreparedSubmit {
        let n = plan.members.len();
        let mut targets = Vec::new();
        let mut rejection = None;
        match plan.kind {
            TaskKind::NextLevel { first, unknown_target } => {
                let pool = &shape.next_level;
                targets = (0..n).map(|i| pool[(usize::from(first) + i) % pool.len()]).collect();
                if unknown_target && let Some(last) = targets.last_mut() {
                    *last = UNKNOWN_WORKER;
                }
                let duplicate = (0..n).find(|&i| targets[..i].contains(&targets[i]));
                rejection = match duplicate {
                    Some(i) => Some(Rejection::DuplicateTarget { worker: targets[i] }),
                    None => targets
                        .iter()
                        .find(|t| !pool.contains(t))
                        .map(|&worker| Rejection::UnknownWorker { worker }),
                };
            }
            TaskKind::Sub => {
                let pool = shape.subs as usize;
                if n > pool {
                    rejection = Some(Rejection::GroupLargerThanPool { size: n, pool });
                }
            }
        }
        let mut args = Vec::with_capacity(n);
        let mut footprints = Vec::with_capacity(n);
        for (member, m) in plan.members.iter().enumerate() {
            let mut a = TaskArgs::new();
            let mut fps: Vec<(TensorArgType, Option<Footprint>)> = Vec::new();
            for (arg, t) in m.tensors.iter().enumerate() {
                let (tensor, fp) = resolve(t.view, self.buffer(t.buffer));
                a.add_tensor(tensor, t.tag).expect("argument fits");
                if rejection.is_none() && t.tag.writes() && fp.is_none() {
                    rejection = Some(Rejection::OutputWithoutBuffer { member, arg, tag: t.tag });
                }
                if rejection.is_none() && self.alloc_scope_ended(t.buffer) {
                    rejection = Some(Rejection::NotAnAllocBuffer { member, arg });
                }
                let overlapped = || {
                    fps.iter().position(|(tag, other): &(TensorArgType, Option<Footprint>)| {
                        tag.writes() && other.zip(fp).is_some_and(|(o, f)| o.overlaps(&f))
                    })
                };
                if rejection.is_none()
                    && t.tag.writes()
                    && let Some(first) = overlapped()
                {
                    rejection = Some(Rejection::OverlappingWrites { member, first, second: arg });
                }
                fps.push((t.tag, fp));
            }
            for scalar in [plan_index as u64, m.action.code(), u64::from(m.delay_us)] {
                a.add_scalar(scalar).expect("scalar fits");
            }
            args.push(a);
            footprints.push(fps);
        }
        PreparedSubmit { args, targets, footprints, rejection }
    }

    /// User scopes currently open.
    pub fn user_scopes(&self) -> usize {
        self.frames.len()
    }

    /// A user scope opened.
    pub fn scope_begin(&mut self) {
        self.frames.push(Vec::new());
    }

    /// The innermost user scope ended at op `op`.
    pub fn scope_end(&mut self, op: usize) {
        for seq in self.frames.pop().unwrap_or_default() {
            self.scope_ended_at.insert(seq, op);
        }
    }

    /// Takes the next sequence number and registers it in the innermost scope.
    fn charge(&mut self) -> u32 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(frame) = self.frames.last_mut() {
            frame.push(seq);
        }
        seq
    }

    /// Records an accepted task and infers its producers (module docs).
    pub fn accept(&mut self, plan_index: usize, plan: &TaskPlan, prepared: &PreparedSubmit) {
        let seq = self.charge();
        let mut found = BTreeSet::new();
        let mut conflicts = BTreeSet::new();
        let tensors =
            || prepared.footprints.iter().flatten().filter_map(|(t, f)| Some((*t, (*f)?)));
        let tracked = || tensors().filter(|(tag, _)| *tag != TensorArgType::NoDep);
        for (tag, fp) in tracked() {
            self.map.lookup(&fp, tag, &mut found, &mut conflicts);
        }
        for (tag, fp) in tracked() {
            self.map.record(fp, tag, seq);
        }
        found.remove(&seq);
        conflicts.remove(&seq);
        let producers = found.into_iter().filter(|p| !self.allocs.contains(p)).collect();
        let ordered_after = conflicts.into_iter().filter(|p| !self.allocs.contains(p)).collect();
        self.tasks.insert(
            seq,
            AcceptedTask {
                plan_index,
                plan: plan.clone(),
                targets: prepared.targets.clone(),
                producers,
                ordered_after,
            },
        );
    }

    /// Records a non-null alloc of `bytes` at `addr`: a finished producer of its whole slab.
    pub fn accept_alloc(&mut self, addr: u64, bytes: u32) {
        let seq = self.charge();
        self.allocs.insert(seq);
        let buffer = Buffer { base: addr, shape: Shape::Flat(bytes) };
        self.alloc_buffers.push(buffer);
        self.alloc_seqs.push(seq);
        let slab = Footprint { key: addr, lo: addr, hi: addr + u64::from(bytes), dense: true };
        self.map.record(slab, TensorArgType::OutputExisting, seq);
    }
}
