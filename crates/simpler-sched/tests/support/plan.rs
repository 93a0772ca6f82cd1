//! Run plans: engine-independent descriptions of random DAGs, and their resolution into the
//! tensors a submit takes together with the byte footprints the reference model uses.
//!
//! Plans are context-free so that proptest can shrink them: a tensor names a shared buffer or
//! "the i-th alloc so far" by a small number that is resolved modulo what exists when the op
//! executes, and view parameters are reduced modulo the buffer's extent.

use simpler_types::{DataType, Tensor, TensorArgType};

/// Three small shared host buffers. Their addresses lie in the first 64 KiB, which the kernel
/// never maps, so they can never coincide with a heap-ring slab (whose creator would then be
/// pinned as a producer by address).
pub const SHARED: [SharedBuffer; 3] = [
    SharedBuffer { base: 0x1000, shape: Shape::Flat(64) },
    SharedBuffer { base: 0x2000, shape: Shape::Flat(48) },
    SharedBuffer { base: 0x3000, shape: Shape::Grid { rows: 8, cols: 8 } },
];

/// One of the shared buffers.
#[derive(Clone, Copy, Debug)]
pub struct SharedBuffer {
    /// Base address (the tensor-map key).
    pub base: u64,
    /// Its u8 layout.
    pub shape: Shape,
}

/// Layout of a u8 buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One dimension of this many bytes.
    Flat(u32),
    /// Row-major `rows × cols` bytes.
    Grid {
        /// Rows.
        rows: u32,
        /// Columns.
        cols: u32,
    },
}

/// The engine a plan sequence runs on.
#[derive(Clone, Debug)]
pub struct EngineShape {
    /// Stable ids of the NEXT_LEVEL endpoints, in registration order.
    pub next_level: Vec<u32>,
    /// Number of SUB endpoints.
    pub subs: u32,
}

/// One run.
#[derive(Clone, Debug)]
pub struct RunPlan {
    /// What the orchestration does, in order.
    pub ops: Vec<Op>,
    /// How the run ends.
    pub end: RunEnd,
    /// Endpoints hold every member until the whole graph is built, so that the engine's edges
    /// can be compared with the model's exactly (nothing finishes, nothing is erased).
    pub gated: bool,
}

/// How a run's submission ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// `close`.
    Close,
    /// `close`, then `abort_run` at once.
    Abort,
    /// `fail` with [`FAIL_CAUSE`].
    Fail,
    /// The builder is dropped without close.
    DropBuilder,
    /// `close`, then `Engine::shutdown` with a zero deadline (the engine's last run).
    Shutdown,
}

/// The cause passed to `RunBuilder::fail`.
pub const FAIL_CAUSE: &str = "the orchestration gave up on purpose";

/// Text of the failure a dropped builder records.
pub const DROP_CAUSE: &str = "run builder dropped without close";

/// One orchestration step.
#[derive(Clone, Debug)]
pub enum Op {
    /// Submit a task.
    Submit(TaskPlan),
    /// `alloc(&[bytes], UInt8)`; zero bytes yields a null tensor and charges nothing.
    Alloc {
        /// Requested size.
        bytes: u32,
    },
    /// `scope_begin`.
    ScopeBegin,
    /// `scope_end` (expected to fail with `ScopeUnderflow` when no user scope is open).
    ScopeEnd,
    /// The orchestration sleeps this long, so that tasks finish (and fail) while it submits.
    Pause {
        /// Microseconds.
        us: u16,
    },
}

/// One task.
#[derive(Clone, Debug)]
pub struct TaskPlan {
    /// Where it runs.
    pub kind: TaskKind,
    /// Its members (one for a single task).
    pub members: Vec<MemberPlan>,
}

/// Where a task runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskKind {
    /// NEXT_LEVEL: member i targets the endpoint at registration position `(first + i) % n`,
    /// so a group larger than the pool names a duplicate target.
    NextLevel {
        /// Position of member 0's target.
        first: u8,
        /// Replace the last member's target by an id no endpoint has.
        unknown_target: bool,
    },
    /// SUB: any idle SUB endpoints.
    Sub,
}

/// An id no endpoint in these tests ever reports.
pub const UNKNOWN_WORKER: u32 = 99;

/// One member of a task.
#[derive(Clone, Debug)]
pub struct MemberPlan {
    /// Tagged tensors, in argument order.
    pub tensors: Vec<TensorPlan>,
    /// What the endpoint does when it runs this member.
    pub action: Action,
    /// Microseconds the endpoint spends before acting: 0 none, 1 a yield, more a sleep.
    pub delay_us: u16,
}

/// What an endpoint does with a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Return `Ok`.
    Succeed,
    /// Return a task failure.
    Fail,
    /// Return an endpoint failure.
    EndpointFail,
    /// Panic out of `Endpoint::run` (the worker's backstop catches it).
    Panic,
    /// Return `EndpointFailure::panicked` (a panic the endpoint caught itself).
    PanickedResult,
}

impl Action {
    /// Wire value carried in the member's scalars.
    pub fn code(self) -> u64 {
        match self {
            Action::Succeed => 0,
            Action::Fail => 1,
            Action::EndpointFail => 2,
            Action::Panic => 3,
            Action::PanickedResult => 4,
        }
    }

    /// Decodes [`code`](Self::code).
    pub fn from_code(code: u64) -> Option<Action> {
        Some(match code {
            0 => Action::Succeed,
            1 => Action::Fail,
            2 => Action::EndpointFail,
            3 => Action::Panic,
            4 => Action::PanickedResult,
            _ => return None,
        })
    }

    /// Whether the member does not succeed.
    pub fn fails(self) -> bool {
        self != Action::Succeed
    }
}

/// How every planned failure message starts.
pub const PLANNED: &str = "planned failure";

/// The message a failing member reports; an escaping panic carries it as its payload.
pub fn failure_message(plan_index: u64, member: u32) -> String {
    format!("{PLANNED} of op {plan_index} member {member}")
}

/// One tagged tensor argument.
#[derive(Clone, Copy, Debug)]
pub struct TensorPlan {
    /// Which buffer.
    pub buffer: BufferRef,
    /// Which part of it.
    pub view: ViewPlan,
    /// Access tag.
    pub tag: TensorArgType,
}

/// Which buffer a tensor refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferRef {
    /// `SHARED[i % 3]`.
    Shared(u8),
    /// The `i % n`-th non-null alloc of the run so far (a shared buffer when there is none).
    Alloc(u8),
    /// A null tensor (untracked for `Input`/`NoDep`, rejected for write tags).
    Null,
}

/// Which part of a buffer a tensor views. Parameters are reduced into range at resolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewPlan {
    /// The whole buffer.
    Whole,
    /// A contiguous window along the outer dimension.
    Range {
        /// First index.
        start: u8,
        /// Length.
        len: u8,
    },
    /// Every `step`-th index along the outer dimension.
    Strided {
        /// First index.
        start: u8,
        /// Number of indices.
        count: u8,
        /// Step.
        step: u8,
    },
    /// A rectangular window of a grid (a `Range` on a flat buffer).
    Window {
        /// First row.
        row: u8,
        /// First column.
        col: u8,
        /// Rows.
        rows: u8,
        /// Columns.
        cols: u8,
    },
}

/// A resolved buffer: base address and layout.
#[derive(Clone, Copy, Debug)]
pub struct Buffer {
    /// Base address; 0 for the null buffer.
    pub base: u64,
    /// Layout.
    pub shape: Shape,
}

/// A byte footprint `[lo, hi)` of the buffer at `key`, computed by the test itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// Base address of the buffer (the tensor-map key).
    pub key: u64,
    /// First byte.
    pub lo: u64,
    /// One past the last byte.
    pub hi: u64,
    /// Whether the view writes every byte of `[lo, hi)` when written (contiguous): a blind
    /// write of a view with gaps replaces no earlier writer.
    pub dense: bool,
}

impl Footprint {
    /// Whether two footprints share a byte of one buffer.
    pub fn overlaps(&self, other: &Footprint) -> bool {
        self.key == other.key && self.lo < other.hi && other.lo < self.hi
    }

    /// Whether `self` lies entirely inside `outer`.
    pub fn inside(&self, outer: &Footprint) -> bool {
        self.key == outer.key && outer.lo <= self.lo && self.hi <= outer.hi
    }
}

/// Reduces `v` into `0..n` (`n > 0`).
fn reduce(v: u8, n: u32) -> u32 {
    u32::from(v) % n
}

/// Builds the tensor a plan describes over `buffer` and its footprint (`None` when null).
pub fn resolve(view: ViewPlan, buffer: Buffer) -> (Tensor, Option<Footprint>) {
    let (t, fp) = resolve_bounds(view, buffer);
    (t, fp.map(|f| Footprint { dense: t.contiguous(), ..f }))
}

/// [`resolve`] with the footprint's bounds only.
fn resolve_bounds(view: ViewPlan, buffer: Buffer) -> (Tensor, Option<Footprint>) {
    let (outer, inner) = match buffer.shape {
        Shape::Flat(n) => (n, 1),
        Shape::Grid { rows, cols } => (rows, cols),
    };
    let dims: &[u32] = match buffer.shape {
        Shape::Flat(n) => &[n],
        Shape::Grid { rows, cols } => &[rows, cols],
    };
    let whole = Tensor::external(buffer.base, dims, DataType::UInt8).expect("valid buffer tensor");
    if buffer.base == 0 {
        return (whole, None);
    }
    let b = buffer.base;
    let grid = matches!(buffer.shape, Shape::Grid { .. });
    let fp = |lo: u32, hi: u32| {
        Some(Footprint { key: b, lo: b + u64::from(lo), hi: b + u64::from(hi), dense: true })
    };
    // A window of a flat buffer is a range of it.
    let view = match (view, grid) {
        (ViewPlan::Window { row, rows, .. }, false) => ViewPlan::Range { start: row, len: rows },
        (v, _) => v,
    };
    match view {
        ViewPlan::Whole => (whole, fp(0, outer * inner)),
        ViewPlan::Range { start, len } => {
            let s = reduce(start, outer);
            let l = 1 + reduce(len, outer - s);
            let mut shape = dims.to_vec();
            shape[0] = l;
            let mut offsets = vec![0; dims.len()];
            offsets[0] = s;
            let t = whole.view(&shape, &offsets).expect("window inside the buffer");
            (t, fp(s * inner, (s + l) * inner))
        }
        ViewPlan::Window { row, col, rows, cols } => {
            let (gr, gc) = (outer, inner);
            let r = reduce(row, gr);
            let c = reduce(col, gc);
            let h = 1 + reduce(rows, gr - r);
            let w = 1 + reduce(cols, gc - c);
            let t = whole.view(&[h, w], &[r, c]).expect("window inside the grid");
            (t, fp(r * gc + c, (r + h - 1) * gc + c + w))
        }
        ViewPlan::Strided { start, count, step } => {
            let s = reduce(start, outer);
            let st = 1 + reduce(step, 4);
            let max_count = (outer - 1 - s) / st + 1;
            let c = 1 + reduce(count, max_count);
            let last = s + (c - 1) * st;
            let t = whole.slice(0, s, last + 1, st).expect("slice inside the buffer");
            (t, fp(s * inner, (last + 1) * inner))
        }
    }
}
