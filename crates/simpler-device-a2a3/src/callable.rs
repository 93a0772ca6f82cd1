//! Chip callables: an orchestration bundled with its kernels by func id (`docs/device-runner.md`).
//!
//! A [`ChipCallable`] is validated when it is built, so a registered callable always satisfies
//! the limits (≤ 128 signature entries, names ≤ 63 bytes, distinct func ids below 1024, core
//! signatures ≤ 32 entries, ≤ 16 of them scalars); a tensormap_and_ringbuffer runner also
//! refuses at registration a kernel declaring more than 16 tensors. Its [`CallableId`] is the SHA-256 of a canonical encoding of its
//! content; for `Native` code that content includes the function addresses, so the identity is
//! per process, which is all a runner needs.

use std::fmt;
use std::path::PathBuf;

use sha2::{Digest, Sha256};
use simpler_types::constants::CORE_MAX_SCALAR_ARGS;
use simpler_types::{CallableId, CallableKind, CallableNamespace, Tensor, TensorArgType};

use crate::abi::MAX_FUNC_IDS;
use crate::error::{CallableName, CallableProblem, DeviceError};
use crate::kernel::KernelFn;
use crate::runtime::orch::{OrchCtx, OrchError};

/// Most entries of a chip callable's signature.
pub const CHIP_SIGNATURE_MAX: usize = 128;
/// Most entries of a core callable's signature.
pub const CORE_SIGNATURE_MAX: usize = 32;
/// Longest entry or config name in bytes.
pub const NAME_MAX: usize = 63;

/// Direction of one signature entry (wire values are the original's).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum ArgDirection {
    /// A scalar.
    Scalar = 0,
    /// A tensor read.
    In = 1,
    /// A tensor written.
    Out = 2,
    /// A tensor read and written.
    InOut = 3,
}

/// The chip entry's arguments as the orchestration sees them: staged tensors (device
/// addresses), their tags, and scalars.
#[derive(Clone, Copy, Debug)]
pub struct OrchArgs<'a> {
    tensors: &'a [Tensor],
    tags: &'a [TensorArgType],
    scalars: &'a [u64],
}

impl<'a> OrchArgs<'a> {
    pub(crate) fn new(
        tensors: &'a [Tensor],
        tags: &'a [TensorArgType],
        scalars: &'a [u64],
    ) -> Self {
        OrchArgs { tensors, tags, scalars }
    }

    /// Tensor `i` (its `addr` is a device address).
    pub fn tensor(&self, i: usize) -> Option<&'a Tensor> {
        self.tensors.get(i)
    }

    /// All tensors.
    pub fn tensors(&self) -> &'a [Tensor] {
        self.tensors
    }

    /// The tag tensor `i` was passed with.
    pub fn tag(&self, i: usize) -> Option<TensorArgType> {
        self.tags.get(i).copied()
    }

    /// Scalar `i`.
    pub fn scalar(&self, i: usize) -> Option<u64> {
        self.scalars.get(i).copied()
    }

    /// All scalars.
    pub fn scalars(&self) -> &'a [u64] {
        self.scalars
    }

    /// Tensors plus scalars.
    pub fn len(&self) -> usize {
        self.tensors.len() + self.scalars.len()
    }

    /// Whether there are no arguments.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What an orchestration's config function returns.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct OrchConfig {
    /// Arguments (tensors plus scalars) the entry expects; fewer → INVALID_ARGS (5).
    pub expected_arg_count: u32,
}

/// A Rust orchestration entry.
pub type NativeOrchFn = fn(&mut OrchCtx<'_>, &OrchArgs<'_>) -> Result<(), OrchError>;
/// A Rust orchestration config function.
pub type NativeConfigFn = fn(&OrchArgs<'_>) -> OrchConfig;

/// The orchestration of a chip callable.
#[derive(Clone)]
#[non_exhaustive]
pub enum Orchestration {
    /// Rust functions over the ops table (simulator, both runtimes; onboard host_build_graph).
    Native {
        /// The entry.
        entry: NativeOrchFn,
        /// The config function.
        config: NativeConfigFn,
    },
    /// A shared object exporting C entry and config functions, loaded on the AICPU side at
    /// registration (tensormap_and_ringbuffer only): an aarch64 object onboard, a host build on
    /// the simulator.
    DeviceObject(OrchestrationObject),
}

/// A `DeviceObject` orchestration: the shared object's bytes and the symbols of its C entry
/// (`COrchEntryFn`) and config (`COrchConfigFn`) functions (`docs/device-chip.md`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OrchestrationObject {
    image: Vec<u8>,
    entry: String,
    config: String,
}

impl OrchestrationObject {
    /// The object `image` exporting `entry` and `config`.
    ///
    /// # Safety
    ///
    /// Registering a callable with this orchestration loads the object on the AICPU side (on
    /// the simulator: into this process), which runs its initializers, and each run calls
    /// `config` and `entry` with the C orchestration ABI. The initializers must be sound to run
    /// there, both symbols must be functions of those types, and the entry must honour the
    /// orchestration contract: touch only the chip entry's tensors and the buffers the ops
    /// table hands out, and call the ops table only during the call, with the context it got.
    pub unsafe fn new(
        image: Vec<u8>,
        entry: impl Into<String>,
        config: impl Into<String>,
    ) -> OrchestrationObject {
        OrchestrationObject { image, entry: entry.into(), config: config.into() }
    }

    /// The object's bytes.
    pub fn image(&self) -> &[u8] {
        &self.image
    }

    /// The entry symbol.
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// The config symbol.
    pub fn config(&self) -> &str {
        &self.config
    }
}

impl fmt::Debug for Orchestration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Orchestration::Native { entry, .. } => write!(f, "Native({:#x})", *entry as usize),
            Orchestration::DeviceObject(o) => {
                write!(f, "DeviceObject({}, {} bytes)", o.entry, o.image.len())
            }
        }
    }
}

/// Code of one kernel.
#[derive(Clone)]
#[non_exhaustive]
pub enum KernelCode {
    /// A Rust or C function in this process (simulator).
    Native(KernelFn),
    /// A C kernel in a shared object exporting `kernel_entry` (simulator).
    SharedObject(SharedObjectKernel),
    /// The raw `.text` of a device kernel object (onboard).
    Text(Vec<u8>),
}

impl fmt::Debug for KernelCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelCode::Native(k) => write!(f, "Native({:#x})", *k as usize),
            KernelCode::SharedObject(k) => write!(f, "SharedObject({})", k.path().display()),
            KernelCode::Text(t) => write!(f, "Text({} bytes)", t.len()),
        }
    }
}

/// A shared object holding a C kernel that exports `kernel_entry(int64_t *args)` with the
/// kernel ABI (`docs/device-chip.md`). The simulator loads it at registration and keeps it open while the
/// callable is registered.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SharedObjectKernel {
    path: PathBuf,
}

impl SharedObjectKernel {
    /// Names the object at `path`.
    ///
    /// # Safety
    ///
    /// Registering a callable with this kernel loads the object, which runs its initializers,
    /// and calls its `kernel_entry` as a kernel: the initializers must be sound to run in this
    /// process and `kernel_entry` must have the kernel ABI and honour the kernel contract (touch
    /// only its tensors' memory).
    pub unsafe fn new(path: impl Into<PathBuf>) -> SharedObjectKernel {
        SharedObjectKernel { path: path.into() }
    }

    /// The object's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

/// One kernel of a chip callable.
#[derive(Clone, Debug)]
pub struct CoreCallable {
    signature: Vec<ArgDirection>,
    code: KernelCode,
    name: Option<String>,
}

impl CoreCallable {
    /// A kernel with its signature: its arguments in order, every entry but
    /// [`ArgDirection::Scalar`] a tensor (the tensors come first in the argument slots, then the
    /// scalars). Every task naming the kernel must pass exactly these, each tensor tagged for
    /// what the kernel does with it, or its submit is refused (`docs/device-chip.md`, "The
    /// kernel ABI").
    ///
    /// # Safety
    ///
    /// The runtime calls `code` with the argument vector of every task that names the kernel,
    /// checked against `signature` only: `code` must be sound to run with any argument vector
    /// that passes those checks (it reads its tensors and scalars as `signature` lists them,
    /// never a slot beyond them, and takes a scalar for a scalar, never for a tensor) and must
    /// honour the kernel contract (it touches only its tensors' memory). Pairing a kernel with
    /// a signature it was not written for is undefined behaviour when a task runs it.
    pub unsafe fn new(signature: Vec<ArgDirection>, code: KernelCode) -> CoreCallable {
        CoreCallable { signature, code, name: None }
    }

    /// Names the kernel (at most [`NAME_MAX`] bytes): diagnostics such as `deps.dot` label its
    /// tasks with the name instead of the func id.
    #[must_use]
    pub fn named(mut self, name: impl Into<String>) -> CoreCallable {
        self.name = Some(name.into());
        self
    }

    /// The kernel's name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// A native kernel.
    ///
    /// # Safety
    ///
    /// As for [`new`](Self::new): `f` must be written for `signature`.
    pub unsafe fn native(signature: Vec<ArgDirection>, f: KernelFn) -> CoreCallable {
        // SAFETY: the caller's contract is `new`'s.
        unsafe { CoreCallable::new(signature, KernelCode::Native(f)) }
    }

    /// The signature.
    pub fn signature(&self) -> &[ArgDirection] {
        &self.signature
    }

    /// The code.
    pub fn code(&self) -> &KernelCode {
        &self.code
    }
}

/// An orchestration and its kernels, validated.
#[derive(Clone, Debug)]
pub struct ChipCallable {
    orchestration: Orchestration,
    signature: Vec<ArgDirection>,
    entry_name: String,
    config_name: String,
    children: Vec<(u32, CoreCallable)>,
    id: CallableId,
}

/// Builder of a [`ChipCallable`].
#[derive(Clone, Debug)]
pub struct ChipCallableBuilder {
    orchestration: Orchestration,
    signature: Vec<ArgDirection>,
    entry_name: String,
    config_name: String,
    children: Vec<(u32, CoreCallable)>,
}

impl ChipCallable {
    /// Starts a callable around `orchestration`.
    pub fn builder(orchestration: Orchestration) -> ChipCallableBuilder {
        ChipCallableBuilder {
            orchestration,
            signature: Vec::new(),
            entry_name: "orchestration_entry".to_owned(),
            config_name: "orchestration_config".to_owned(),
            children: Vec::new(),
        }
    }

    /// Starts a callable around a native orchestration.
    pub fn native(entry: NativeOrchFn, config: NativeConfigFn) -> ChipCallableBuilder {
        ChipCallable::builder(Orchestration::Native { entry, config })
    }

    /// Content identity.
    pub fn id(&self) -> CallableId {
        self.id
    }

    /// The orchestration.
    pub fn orchestration(&self) -> &Orchestration {
        &self.orchestration
    }

    /// The chip signature.
    pub fn signature(&self) -> &[ArgDirection] {
        &self.signature
    }

    /// Entry name.
    pub fn entry_name(&self) -> &str {
        &self.entry_name
    }

    /// Config name.
    pub fn config_name(&self) -> &str {
        &self.config_name
    }

    /// Kernels by func id, in ascending func id order.
    pub fn children(&self) -> &[(u32, CoreCallable)] {
        &self.children
    }
}

fn invalid(problem: CallableProblem) -> DeviceError {
    DeviceError::InvalidCallable { run_id: None, problem }
}

impl ChipCallableBuilder {
    /// Sets the chip signature.
    pub fn signature(mut self, sig: Vec<ArgDirection>) -> Self {
        self.signature = sig;
        self
    }

    /// Sets the entry and config names.
    pub fn names(mut self, entry: impl Into<String>, config: impl Into<String>) -> Self {
        self.entry_name = entry.into();
        self.config_name = config.into();
        self
    }

    /// Adds a kernel under `func_id`.
    pub fn kernel(mut self, func_id: u32, kernel: CoreCallable) -> Self {
        self.children.push((func_id, kernel));
        self
    }

    /// Validates the limits and computes the content digest.
    pub fn build(mut self) -> Result<ChipCallable, DeviceError> {
        if self.signature.len() > CHIP_SIGNATURE_MAX {
            return Err(invalid(CallableProblem::ChipSignatureTooLong {
                entries: self.signature.len(),
                max: CHIP_SIGNATURE_MAX,
            }));
        }
        for (which, name) in
            [(CallableName::Entry, &self.entry_name), (CallableName::Config, &self.config_name)]
        {
            if name.len() > NAME_MAX {
                let name = name.clone();
                return Err(invalid(CallableProblem::NameTooLong { which, name, max: NAME_MAX }));
            }
        }
        if let Orchestration::DeviceObject(o) = &self.orchestration
            && o.image.is_empty()
        {
            return Err(invalid(CallableProblem::EmptyCode { func_id: None }));
        }
        self.children.sort_by_key(|(id, _)| *id);
        for w in self.children.windows(2) {
            if w[0].0 == w[1].0 {
                return Err(invalid(CallableProblem::DuplicateFuncId { func_id: w[0].0 }));
            }
        }
        for &(func_id, ref k) in &self.children {
            if func_id as usize >= MAX_FUNC_IDS {
                return Err(invalid(CallableProblem::FuncIdRange { func_id, limit: MAX_FUNC_IDS }));
            }
            if matches!(&k.code, KernelCode::Text(t) if t.is_empty()) {
                return Err(invalid(CallableProblem::EmptyCode { func_id: Some(func_id) }));
            }
            if let Some(name) = k.name.as_ref().filter(|n| n.len() > NAME_MAX) {
                return Err(invalid(CallableProblem::NameTooLong {
                    which: CallableName::Kernel { func_id },
                    name: name.clone(),
                    max: NAME_MAX,
                }));
            }
            if k.signature.len() > CORE_SIGNATURE_MAX {
                return Err(invalid(CallableProblem::KernelSignatureTooLong {
                    func_id,
                    entries: k.signature.len(),
                    max: CORE_SIGNATURE_MAX,
                }));
            }
            // Every submit must pass exactly the declared scalars, and no task passes more
            // than this: such a kernel could never run.
            let scalars = k.signature.iter().filter(|d| **d == ArgDirection::Scalar).count();
            if scalars > CORE_MAX_SCALAR_ARGS {
                return Err(invalid(CallableProblem::TooManyScalars {
                    func_id,
                    scalars,
                    max: CORE_MAX_SCALAR_ARGS,
                }));
            }
        }
        let id = CallableId::new(digest(&self), CallableKind::Chip, CallableNamespace::LocalChip);
        Ok(ChipCallable {
            orchestration: self.orchestration,
            signature: self.signature,
            entry_name: self.entry_name,
            config_name: self.config_name,
            children: self.children,
            id,
        })
    }
}

fn put_bytes(h: &mut Sha256, b: &[u8]) {
    h.update((b.len() as u64).to_le_bytes());
    h.update(b);
}

fn digest(b: &ChipCallableBuilder) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"simpler-chip-callable-v1");
    match &b.orchestration {
        Orchestration::Native { entry, config } => {
            h.update([0u8]);
            h.update((*entry as usize as u64).to_le_bytes());
            h.update((*config as usize as u64).to_le_bytes());
        }
        Orchestration::DeviceObject(o) => {
            h.update([1u8]);
            put_bytes(&mut h, &o.image);
            put_bytes(&mut h, o.entry.as_bytes());
            put_bytes(&mut h, o.config.as_bytes());
        }
    }
    put_bytes(&mut h, &b.signature.iter().map(|d| *d as u8).collect::<Vec<_>>());
    put_bytes(&mut h, b.entry_name.as_bytes());
    put_bytes(&mut h, b.config_name.as_bytes());
    h.update((b.children.len() as u64).to_le_bytes());
    for (id, k) in &b.children {
        h.update(id.to_le_bytes());
        put_bytes(&mut h, &k.signature.iter().map(|d| *d as u8).collect::<Vec<_>>());
        put_bytes(&mut h, k.name.as_deref().unwrap_or_default().as_bytes());
        match &k.code {
            KernelCode::Native(f) => {
                h.update([0u8]);
                h.update((*f as usize as u64).to_le_bytes());
            }
            KernelCode::SharedObject(k) => {
                h.update([1u8]);
                put_bytes(&mut h, k.path().as_os_str().as_encoded_bytes());
            }
            KernelCode::Text(t) => {
                h.update([2u8]);
                put_bytes(&mut h, t);
            }
        }
    }
    h.finalize().into()
}
