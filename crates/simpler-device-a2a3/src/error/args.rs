//! [`ArgsProblem`]: what was wrong with the arguments of a call or of a task submitted while a
//! graph was built ([`DeviceError::InvalidArgs`](super::DeviceError::InvalidArgs)).

use std::fmt;

use simpler_types::{
    CORE_MAX_SCALAR_ARGS, CORE_MAX_TENSOR_ARGS, HEAP_RING_COUNT, TensorArgType, TypesError,
};

use super::RingSizes;
use crate::abi::image::TaskShape;

pub use crate::runtime::arity::ArityMismatch;

/// Which tensor argument a problem names.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum ArgSite {
    /// A tensor of a chip call's argument list (its index).
    Chip {
        /// Its index among the call's tensors.
        arg: usize,
    },
    /// A tensor of a task the orchestration submitted.
    Task {
        /// The task's index in submission order.
        task: u64,
        /// Its index among the task's tensors.
        arg: usize,
    },
}

impl fmt::Display for ArgSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgSite::Chip { arg } => write!(f, "chip argument {arg}"),
            ArgSite::Task { task, arg } => write!(f, "task#{task}, tensor {arg}"),
        }
    }
}

/// An operation of the orchestration's ops table.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum OrchOp {
    /// `submit`.
    Submit,
    /// `alloc_tensors`.
    AllocTensors,
    /// `tensor_data`.
    TensorData,
    /// `set_tensor_data`.
    SetTensorData,
}

impl fmt::Display for OrchOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OrchOp::Submit => "submit",
            OrchOp::AllocTensors => "alloc_tensors",
            OrchOp::TensorData => "tensor_data",
            OrchOp::SetTensorData => "set_tensor_data",
        })
    }
}

/// A pointer an ops-table call received.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum PointerArg {
    /// The task descriptor of `submit`.
    TaskDescriptor,
    /// The tensor descriptor (or array of them) of the call.
    Descriptor,
    /// The destination of `tensor_data`.
    Destination,
    /// The source of `set_tensor_data`.
    Source,
}

impl fmt::Display for PointerArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PointerArg::TaskDescriptor => "task descriptor",
            PointerArg::Descriptor => "tensor descriptor",
            PointerArg::Destination => "destination",
            PointerArg::Source => "source",
        })
    }
}

/// What was wrong with the arguments of a call, or of a task the orchestration submitted while
/// a graph was built. A chip call's descriptor that breaks a rule of `simpler-types` is
/// [`DeviceError::InvalidTaskArgs`](super::DeviceError::InvalidTaskArgs) instead.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArgsProblem {
    /// `malloc` of zero bytes.
    #[error("malloc of 0 bytes")]
    ZeroMalloc,
    /// A task names a shape no task has.
    #[error("task#{task}: unknown task shape {shape}")]
    UnknownShape {
        /// The task's index in submission order.
        task: u64,
        /// The raw shape.
        shape: u32,
    },
    /// A task's block count is zero or above the limit.
    #[error("task#{task}: block_num {block_num} out of range 1..={max}")]
    BlockNum {
        /// The task's index in submission order.
        task: u64,
        /// The block count.
        block_num: u32,
        /// The largest block count.
        max: u32,
    },
    /// The kernels a task names do not fit its shape: a dummy task names none, an AIC task
    /// exactly the AIC kernel, an AIV task exactly one AIV kernel, a MIX task at least one.
    #[error("task#{task}: {} (func ids {funcs:?})", shape_rule(*shape))]
    ShapeKernels {
        /// The task's index in submission order.
        task: u64,
        /// Its shape.
        shape: TaskShape,
        /// The func ids of its AIC, AIV0 and AIV1 members (-1 for none).
        funcs: [i32; 3],
    },
    /// A task names a func id outside the func table.
    #[error("task#{task}: func id {func_id} out of range 0..{limit}")]
    FuncIdRange {
        /// The task's index in submission order.
        task: u64,
        /// The func id.
        func_id: i32,
        /// One past the largest func id.
        limit: usize,
    },
    /// A task names a func id the callable does not register.
    #[error("task#{task}: func id {func_id} is not registered in the callable")]
    UnknownFunc {
        /// The task's index in submission order.
        task: u64,
        /// The func id.
        func_id: i32,
    },
    /// A task passes more tensors or scalars than a kernel task takes.
    #[error(
        "task#{task}: {tensors} tensors and {scalars} scalars exceed the per-task caps of \
         {CORE_MAX_TENSOR_ARGS} tensors, {CORE_MAX_SCALAR_ARGS} scalars and {} argument slots",
        crate::abi::payload::LOCAL_CONTEXT_SLOT
    )]
    TooManyArgs {
        /// The task's index in submission order.
        task: u64,
        /// Tensors it passes.
        tensors: usize,
        /// Scalars it passes.
        scalars: usize,
    },
    /// A task's tensor carries a tag no tensor argument has.
    #[error("{site}: unknown tag {raw}")]
    UnknownTag {
        /// The tensor.
        site: ArgSite,
        /// The raw tag.
        raw: i32,
    },
    /// A tensor the task writes has no buffer.
    #[error(
        "{site} ({tag}) is null; a written tensor needs a buffer (pass one or get it from alloc_tensors)"
    )]
    NullWrittenTensor {
        /// The tensor.
        site: ArgSite,
        /// Its tag.
        tag: TensorArgType,
    },
    /// A submitted task's tensor descriptor breaks a rule of `simpler-types` (the source).
    #[error("task#{task}, tensor {arg} ({tag}): invalid descriptor: {source}")]
    Descriptor {
        /// The task's index in submission order.
        task: u64,
        /// The tensor's index among the task's tensors.
        arg: usize,
        /// Its tag.
        tag: TensorArgType,
        /// The rule it broke.
        #[source]
        source: TypesError,
    },
    /// A submitted task's buffer is not inside one device allocation of the run (a user
    /// allocation, or the run's heap or staging arena).
    #[error(
        "task#{task}, tensor {arg}: buffer of {len} bytes at {addr:#x} is not inside one device \
         allocation of this run (a user allocation, or this run's heap or staging arena)"
    )]
    TensorOutsideAllocation {
        /// The task's index in submission order.
        task: u64,
        /// The tensor's index among the task's tensors.
        arg: usize,
        /// The buffer's address.
        addr: u64,
        /// Its size in bytes.
        len: u64,
    },
    /// A tensor of the orchestration (a task's argument, or the tensor of `tensor_data` /
    /// `set_tensor_data`: task `None`, argument 0) overlaps a chip argument's buffer under
    /// another base address. Views of one buffer share its base address, by which the runtimes
    /// order accesses, so it would not be ordered against that buffer's views: make it a view
    /// of the argument (its base, an element offset).
    #[error(
        "{}tensor {arg} at {addr:#x} overlaps the chip argument buffer at {entry_addr:#x} \
         under another base address; make it a view of that argument (the same base, an \
         element offset)",
        task.map(|t| format!("task#{t}: ")).unwrap_or_default()
    )]
    EntryBaseAlias {
        /// The task's index in submission order (`None`: a data call).
        task: Option<u64>,
        /// The tensor's index among the task's tensors.
        arg: usize,
        /// The tensor's base address.
        addr: u64,
        /// The base address of the argument buffer it overlaps.
        entry_addr: u64,
    },
    /// A tensor of the orchestration (as for [`EntryBaseAlias`](Self::EntryBaseAlias))
    /// overlaps a buffer `alloc_tensors` gave it under another base address, so it would not
    /// be ordered against that buffer's views: make it a view of the buffer.
    #[error(
        "{}tensor {arg} at {addr:#x} overlaps the heap buffer at {heap_addr:#x} under another \
         base address; make it a view of that buffer (the same base, an element offset)",
        task.map(|t| format!("task#{t}: ")).unwrap_or_default()
    )]
    HeapBaseAlias {
        /// The task's index in submission order (`None`: a data call).
        task: Option<u64>,
        /// The tensor's index among the task's tensors.
        arg: usize,
        /// The tensor's base address.
        addr: u64,
        /// The base address of the heap buffer it overlaps.
        heap_addr: u64,
    },
    /// A tensor of the orchestration names a buffer `alloc_tensors` gave it inside a scope that
    /// has ended: the buffer lives only as long as that scope.
    #[error(
        "{}tensor {arg} at {addr:#x} uses the heap buffer at {heap_addr:#x} after the scope that \
         allocated it ended",
        task.map(|t| format!("task#{t}: ")).unwrap_or_default()
    )]
    HeapBufferAfterScope {
        /// The task's index in submission order (`None`: a data call).
        task: Option<u64>,
        /// The tensor's index among the task's tensors.
        arg: usize,
        /// The tensor's base address.
        addr: u64,
        /// The base address of the heap buffer.
        heap_addr: u64,
    },
    /// A tensor of the orchestration overlaps, under another base address, device memory an
    /// earlier task or data call of the run named (a user allocation that is neither a chip
    /// argument nor a heap buffer), so the two would not be ordered against each other: make
    /// both views of one base.
    #[error(
        "{}tensor {arg} at {addr:#x} overlaps the buffer at {other_addr:#x} an earlier task or \
         data call named, under another base address; make both views of one base (the same \
         base, an element offset)",
        task.map(|t| format!("task#{t}: ")).unwrap_or_default()
    )]
    BufferBaseAlias {
        /// The task's index in submission order (`None`: a data call).
        task: Option<u64>,
        /// The tensor's index among the task's tensors.
        arg: usize,
        /// The tensor's base address.
        addr: u64,
        /// The base address of the buffer it overlaps.
        other_addr: u64,
    },
    /// A `tensor_data` or `set_tensor_data` descriptor breaks a rule of `simpler-types` (the
    /// source).
    #[error("{op}: invalid descriptor: {source}")]
    DataDescriptor {
        /// The call.
        op: OrchOp,
        /// The rule it broke.
        #[source]
        source: TypesError,
    },
    /// A task's tensors, tags or scalar count do not match the signature of a kernel it names
    /// (the source).
    #[error("task#{task}: {source}")]
    Arity {
        /// The task's index in submission order.
        task: u64,
        /// How they differ.
        #[source]
        source: ArityMismatch,
    },
    /// A pointer an ops-table call received is null or misaligned.
    #[error("{op}: null or misaligned {pointer}")]
    BadPointer {
        /// The call.
        op: OrchOp,
        /// The pointer.
        pointer: PointerArg,
    },
    /// A `submit`'s tensor, tag or scalar array is null or misaligned while its count says
    /// it holds elements.
    #[error(
        "task#{task}: a null or misaligned array for its {tensors} tensors (and tags) or \
         {scalars} scalars"
    )]
    BadTaskArrays {
        /// The task's index in submission order.
        task: u64,
        /// The tensors its descriptor states.
        tensors: usize,
        /// The scalars its descriptor states.
        scalars: usize,
    },
    /// A length an ops-table call received does not fit the host's address space.
    #[error("{op}: length {len} overflows")]
    LengthOverflow {
        /// The call.
        op: OrchOp,
        /// The length.
        len: u64,
    },
    /// `alloc_tensors` was given a descriptor that already names a buffer.
    #[error("alloc_tensors: descriptor {index} already has a buffer at {addr:#x}")]
    AllocHasBuffer {
        /// The descriptor's index.
        index: usize,
        /// The buffer's address.
        addr: u64,
    },
    /// `alloc_tensors` was given a descriptor whose data type has no element size.
    #[error("alloc_tensors: descriptor {index} has an unknown dtype {dtype}")]
    AllocUnknownDtype {
        /// The descriptor's index.
        index: usize,
        /// The raw data type.
        dtype: u8,
    },
    /// `alloc_tensors` was given a descriptor larger than any heap holds.
    #[error("alloc_tensors: descriptor {index} needs {bytes} bytes, more than any heap holds")]
    AllocTooLarge {
        /// The descriptor's index.
        index: usize,
        /// The bytes it needs.
        bytes: u64,
    },
    /// `tensor_data` or `set_tensor_data` named a tensor without bytes.
    #[error("{op}: the tensor has no bytes")]
    DataEmpty {
        /// The call.
        op: OrchOp,
    },
    /// `tensor_data` or `set_tensor_data` named a view that is not contiguous or whose size
    /// differs from the host buffer's.
    #[error(
        "{op}: needs a contiguous view whose {view_bytes} bytes match the {buffer_bytes}-byte \
         buffer{}",
        if *contiguous { "" } else { " (the view is not contiguous)" }
    )]
    DataShape {
        /// The call.
        op: OrchOp,
        /// Whether the view is contiguous.
        contiguous: bool,
        /// The bytes the view spans.
        view_bytes: u64,
        /// The host buffer's length.
        buffer_bytes: usize,
    },
    /// `tensor_data` named bytes a task of the graph writes, which has not run yet (the graph
    /// runs after it is built).
    #[error(
        "tensor_data: [{addr:#x}, +{len}) is written by a task of this graph, which has not run \
         yet (host_build_graph runs tasks after the whole graph is built)"
    )]
    DataNotWritten {
        /// Start of the bytes.
        addr: u64,
        /// Their length.
        len: u64,
    },
    /// `tensor_data` named bytes outside the run's chip arguments (its host-staged inputs and
    /// the device allocations it was passed).
    #[error("tensor_data: [{addr:#x}, +{len}) is not inside a chip argument of this run")]
    DataNotStaged {
        /// Start of the bytes.
        addr: u64,
        /// Their length.
        len: u64,
    },
    /// `set_tensor_data` named bytes a task of the graph already uses.
    #[error("set_tensor_data: [{addr:#x}, +{len}) is already used by a task of this graph")]
    DataInUse {
        /// Start of the bytes.
        addr: u64,
        /// Their length.
        len: u64,
    },
    /// `set_tensor_data` named bytes outside every user allocation and the run's heap and
    /// staging arena.
    #[error(
        "set_tensor_data: [{addr:#x}, +{len}) is not inside one user allocation or this run's \
         heap or staging arena"
    )]
    DataOutsideAllocation {
        /// Start of the bytes.
        addr: u64,
        /// Their length.
        len: u64,
    },
    /// `tensor_data` or `set_tensor_data` named bytes the device memory does not hold.
    #[error("{op}: [{addr:#x}, +{len}) is not device memory")]
    DataNotDeviceMemory {
        /// The call.
        op: OrchOp,
        /// Start of the bytes.
        addr: u64,
        /// Their length.
        len: u64,
    },
    /// `scope_begin` would nest deeper than the user levels.
    #[error("scope depth would exceed {max} user levels")]
    ScopeTooDeep {
        /// The user levels.
        max: usize,
    },
    /// `scope_end` without a matching `scope_begin`.
    #[error("scope_end without a matching scope_begin")]
    ScopeUnbalanced,
    /// The run's graph or arguments do not fit a runtime image.
    #[error("the run's graph and arguments do not fit a runtime image")]
    ImageTooLarge,
    /// The chip entry has more tensors than a tensormap_and_ringbuffer orchestration takes.
    #[error(
        "the chip entry has {tensors} tensors; a tensormap_and_ringbuffer orchestration takes \
         at most {max}"
    )]
    TooManyEntryTensors {
        /// Tensors the entry has.
        tensors: usize,
        /// The most it may have.
        max: usize,
    },
    /// The rings' resolved sizes need more than one arena holds.
    #[error("the ring sizes ({}) are too large for one arena", fmt_rings(&sizes[..]))]
    RingsTooLarge {
        /// Each ring's task window, heap bytes and dependency pool.
        sizes: Box<[RingSizes; HEAP_RING_COUNT]>,
    },
    /// A chip argument is host memory and the request does not stage host tensors.
    #[error(
        "chip argument {arg} is host memory at {addr:#x} (child_memory = 0); pass device memory \
         from malloc with child_memory set, or build the request with \
         RunRequest::with_host_tensors"
    )]
    HostTensorRefused {
        /// The argument's index.
        arg: usize,
        /// Its address.
        addr: u64,
    },
    /// A chip argument's host range overlaps another argument's without being the same range.
    #[error(
        "chip argument {arg}: host memory [{addr:#x}, +{len}) overlaps another argument's \
         [{other_addr:#x}, +{other_len}) without being the same range; pass views of one tensor"
    )]
    HostRangeOverlap {
        /// The argument's index.
        arg: usize,
        /// Its range's start.
        addr: u64,
        /// Its range's length.
        len: u64,
        /// The other range's start.
        other_addr: u64,
        /// The other range's length.
        other_len: u64,
    },
    /// Two device-memory chip arguments overlap but name different base addresses. Views of
    /// one buffer share its base address (the runtimes order accesses by it), so the two would
    /// never be ordered against each other.
    #[error(
        "chip argument {arg}: device memory at {addr:#x} overlaps argument {other_arg}'s at \
         {other_addr:#x} under another base address; pass views of one tensor (the same base, \
         an element offset)"
    )]
    DeviceBaseAlias {
        /// The argument's index.
        arg: usize,
        /// Its base address.
        addr: u64,
        /// The earlier argument it overlaps.
        other_arg: usize,
        /// That argument's base address.
        other_addr: u64,
    },
    /// The host tensors to stage need more bytes than a `u64` counts, or than the host's
    /// address space holds.
    #[error("chip argument {arg}: host memory [{addr:#x}, +{len}) overflows the staging size")]
    StagingOverflow {
        /// The index of the first argument naming the range.
        arg: usize,
        /// The range's start.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// A chip argument's host memory is not inside a live `HostBuffer`.
    #[error("chip argument {arg}: host tensor at {addr:#x} is not inside a live HostBuffer")]
    NotInHostBuffer {
        /// The argument's index.
        arg: usize,
        /// The tensor's address.
        addr: u64,
    },
    /// A chip argument's address is inside a live `HostBuffer`, but the bytes its view can
    /// touch run past that buffer.
    #[error(
        "chip argument {arg}: the view at {addr:#x} reaches bytes outside its HostBuffer \
         [{buffer_addr:#x}, +{buffer_len})"
    )]
    LeavesHostBuffer {
        /// The argument's index.
        arg: usize,
        /// The tensor's address.
        addr: u64,
        /// The start of the buffer holding that address.
        buffer_addr: u64,
        /// That buffer's length.
        buffer_len: u64,
    },
}

/// The rule [`ArgsProblem::ShapeKernels`] names for `shape`.
fn shape_rule(shape: TaskShape) -> &'static str {
    match shape {
        TaskShape::Dummy => "a dummy task names kernels",
        TaskShape::Aic => "an AIC task needs exactly the AIC kernel",
        TaskShape::Aiv => "an AIV task needs exactly one AIV kernel",
        TaskShape::Mix => "a MIX task names no kernel",
    }
}

/// Each ring's sizes, as [`ArgsProblem::RingsTooLarge`] names them.
fn fmt_rings(sizes: &[RingSizes]) -> String {
    let ring = |(i, r): (usize, &RingSizes)| {
        format!(
            "ring {i}: task window {}, heap {} bytes, dep pool {}",
            r.task_window, r.heap_bytes, r.dep_pool
        )
    };
    sizes.iter().enumerate().map(ring).collect::<Vec<_>>().join("; ")
}
