//! The runner's callable table: 64 slots, uploaded chip buffers deduplicated by content, and
//! registration (`docs/device-runner.md`, "Memory and callables").

use std::collections::HashMap;
use std::sync::Arc;

use super::{Core, oom, unusable};
use crate::abi::MAX_CALLABLE_SLOTS;
use crate::abi::MAX_FUNC_IDS;
use crate::abi::image::KernelArity;
use crate::abi::launch::CoreKernelHeader;
use crate::backend::{LoadedCode, ResolvedKernels};
use crate::callable::{ChipCallable, Orchestration};
use crate::error::{CallableProblem, DeviceError, MemPurpose};
use crate::options::RuntimeVariant;
use crate::runner::ChipSlot;
use crate::runtime::{DeviceOrchestration, arity};

/// One registered callable.
#[derive(Debug)]
pub(crate) struct Registered {
    pub(crate) callable: Arc<ChipCallable>,
    /// Registration generation, stamped into the image as part of the active callable
    /// (preparation step 13).
    pub(crate) generation: u64,
    /// Content hash of the uploaded chip buffer.
    pub(crate) buffer_hash: u64,
    /// Kernel entry address per func id (0 = unset); written into each run's image.
    pub(crate) func_table: Box<[u64]>,
    /// The arity of every kernel, in ascending func id; written into each trb run's image.
    pub(crate) kernels: Box<[KernelArity]>,
    /// Code holding kernels of this callable (and its orchestration, when the AICPU side
    /// loaded it); unloaded when it is unregistered.
    pub(crate) code: Vec<LoadedCode>,
    /// The orchestration as the AICPU side loaded it (a `DeviceObject` under
    /// tensormap_and_ringbuffer).
    pub(crate) device_orchestration: Option<DeviceOrchestration>,
}

/// An uploaded chip buffer and how many registrations share it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChipBuffer {
    pub(crate) addr: u64,
    pub(crate) refs: u32,
}

/// The 64 slots and the chip buffers.
#[derive(Debug, Default)]
pub(crate) struct CallableTable {
    pub(crate) slots: Vec<Option<Registered>>,
    pub(crate) buffers: HashMap<u64, ChipBuffer>,
    pub(crate) next_generation: u64,
    /// Code of callables unregistered while the runner was unusable: a simulated thread stuck
    /// in one of their kernels may still be executing it, so it stays loaded until `finalize`
    /// has confirmed every thread gone (and forever otherwise).
    pub(crate) retired_code: Vec<LoadedCode>,
}

/// FNV-1a, 64 bit.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The chip buffer bytes of `c`: one header per kernel, in func-id order.
pub(crate) fn chip_buffer_bytes(c: &ChipCallable, resolved: &ResolvedKernels) -> Vec<u8> {
    let mut headers = vec![CoreKernelHeader::default(); c.children().len().max(1)];
    for (h, ((id, k), (_, addr))) in
        headers.iter_mut().zip(c.children().iter().zip(&resolved.kernels))
    {
        let sig = k.signature();
        h.func_id = *id;
        h.signature_len = sig.len() as u32;
        h.kernel = *addr;
        for (dst, d) in h.signature.iter_mut().zip(sig) {
            *dst = *d as u8;
        }
    }
    bytemuck::cast_slice(&headers).to_vec()
}

/// Kernel addresses by func id.
pub(crate) fn func_table_of(resolved: &ResolvedKernels) -> Box<[u64]> {
    let mut table = vec![0u64; MAX_FUNC_IDS].into_boxed_slice();
    for &(id, addr) in &resolved.kernels {
        if let Some(slot) = table.get_mut(id as usize) {
            *slot = addr;
        }
    }
    table
}

/// The arity of each of `c`'s kernels, in ascending func id.
pub(crate) fn kernel_arities(c: &ChipCallable) -> Box<[KernelArity]> {
    let mut kernels: Vec<KernelArity> =
        c.children().iter().map(|(id, k)| arity::arity_of(*id, k.signature())).collect();
    kernels.sort_unstable_by_key(|k| k.func_id);
    kernels.into_boxed_slice()
}

impl CallableTable {
    pub(crate) fn new() -> CallableTable {
        CallableTable {
            slots: (0..MAX_CALLABLE_SLOTS).map(|_| None).collect(),
            buffers: HashMap::new(),
            next_generation: 1,
            retired_code: Vec::new(),
        }
    }

    /// The lowest free slot.
    pub(crate) fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(Option::is_none)
    }

    pub(crate) fn get(&self, slot: u32) -> Option<&Registered> {
        self.slots.get(slot as usize).and_then(Option::as_ref)
    }
}

impl Core {
    /// Registers `c` in the lowest free slot: resolve its kernels on the backend, upload (or
    /// share) its chip buffer, record its func table.
    pub(super) fn register(&mut self, c: &ChipCallable) -> Result<ChipSlot, DeviceError> {
        unusable(self)?;
        self.runtime.check_callable(c)?;
        let Some(slot) = self.callables.free_slot() else {
            return Err(DeviceError::TooManyCallables { capacity: MAX_CALLABLE_SLOTS });
        };
        let mut resolved = self.backend.resolve_kernels(c)?;
        let bytes = chip_buffer_bytes(c, &resolved);
        let hash = fnv1a64(&bytes);
        let headers_base = match self.callables.buffers.get_mut(&hash) {
            Some(buf) => {
                buf.refs += 1;
                self.stats.chip_buffer_dedupe_hits += 1;
                buf.addr
            }
            None => {
                let addr = self
                    .backend
                    .malloc(bytes.len() as u64, MemPurpose::ChipBuffer)
                    .map_err(|f| oom(None, bytes.len() as u64, MemPurpose::ChipBuffer, f))?;
                if let Err(e) = self.backend.write(addr, &bytes) {
                    self.backend.free(addr);
                    return Err(e);
                }
                self.callables.buffers.insert(hash, ChipBuffer { addr, refs: 1 });
                self.stats.chip_buffer_uploads += 1;
                addr
            }
        };
        let device_orchestration = match self.load_orchestration(slot, c, &mut resolved.code) {
            Ok(d) => d,
            Err(e) => {
                self.release_buffer(hash);
                return Err(e);
            }
        };
        let func_table = func_table_of(&resolved);
        tracing::debug!(
            device = self.opts.device_id,
            slot,
            chip_buffer = headers_base,
            kernels = c.children().len(),
            "callable registered"
        );
        let generation = self.callables.next_generation;
        self.callables.next_generation += 1;
        self.callables.slots[slot] = Some(Registered {
            callable: Arc::new(c.clone()),
            generation,
            buffer_hash: hash,
            func_table,
            kernels: kernel_arities(c),
            code: resolved.code,
            device_orchestration,
        });
        self.stats.registrations += 1;
        Ok(ChipSlot(slot as u32))
    }

    /// Where `c`'s orchestration runs under this runner's runtime: host_build_graph runs a
    /// `Native` one on the host; tensormap_and_ringbuffer runs a `Native` one on the AICPU
    /// where the backend can call host code (the simulator with its compiled-in scheduler, not
    /// with the built AICPU program), and has the backend load a `DeviceObject` there (`code`
    /// keeps it loaded).
    fn load_orchestration(
        &mut self,
        slot: usize,
        c: &ChipCallable,
        code: &mut Vec<LoadedCode>,
    ) -> Result<Option<DeviceOrchestration>, DeviceError> {
        let refuse = |problem| Err(DeviceError::InvalidCallable { run_id: None, problem });
        match (self.opts.runtime, c.orchestration()) {
            (RuntimeVariant::HostBuildGraph, Orchestration::Native { .. }) => Ok(None),
            (RuntimeVariant::HostBuildGraph, Orchestration::DeviceObject(o)) => {
                let entry = o.entry().to_owned();
                refuse(CallableProblem::DeviceObjectUnderHostBuildGraph { entry })
            }
            (RuntimeVariant::TensormapAndRingbuffer, Orchestration::Native { .. }) => {
                if self.backend.runs_native_device_orchestration() {
                    Ok(None)
                } else {
                    refuse(CallableProblem::NativeOrchestrationOnDevice)
                }
            }
            (RuntimeVariant::TensormapAndRingbuffer, Orchestration::DeviceObject(o)) => {
                self.no_run_launched("register_callable")?;
                let (loaded, held) = self.backend.load_orchestration(
                    slot as u32,
                    o.image(),
                    o.entry(),
                    o.config(),
                )?;
                code.extend(held);
                Ok(Some(loaded))
            }
        }
    }

    /// Frees `slot`; a slot a prepared or in-flight run uses is `CallableInUse`.
    pub(super) fn unregister(&mut self, slot: ChipSlot) -> Result<(), DeviceError> {
        if self.callables.get(slot.0).is_none() {
            return Err(DeviceError::UnknownCallable { run_id: None, slot: slot.0 });
        }
        if let Some(run) = self.runs().find(|r| r.callable == slot) {
            return Err(DeviceError::CallableInUse { slot: slot.0, run_id: run.run_id });
        }
        if self.callables.get(slot.0).is_some_and(|r| r.device_orchestration.is_some()) {
            self.no_run_launched("unregister_callable")?;
        }
        let Some(mut reg) = self.callables.slots[slot.0 as usize].take() else {
            return Err(DeviceError::UnknownCallable { run_id: None, slot: slot.0 });
        };
        if !self.health.get().is_healthy() {
            // A failed run may have left a simulated thread inside one of this callable's
            // kernels; unloading the code would unmap what it is executing. A healthy runner
            // has no such thread: the only runs that can execute kernels are the ones in its
            // slots, and their callables are refused above.
            self.callables.retired_code.append(&mut reg.code);
        }
        if reg.device_orchestration.is_some() && self.health.get().is_healthy() {
            // As for the code above: only a healthy runner knows no thread is inside it.
            self.backend.unload_orchestration(slot.0);
        }
        self.release_buffer(reg.buffer_hash);
        Ok(())
    }

    /// Closes every orchestration the AICPU side holds for this runner (before finalize
    /// resets the device), when no thread can be inside one.
    pub(super) fn unload_orchestrations(&mut self) {
        if !self.health.get().is_healthy() {
            return;
        }
        for slot in 0..MAX_CALLABLE_SLOTS {
            if self.callables.get(slot as u32).is_some_and(|r| r.device_orchestration.is_some()) {
                self.backend.unload_orchestration(slot as u32);
            }
        }
    }

    /// Refuses `call` while a run is launched: loading or closing an orchestration object is a
    /// launch on the AICPU stream, which would queue behind the run and take its completion
    /// (and a fault of the run) as its own.
    fn no_run_launched(&self, call: &'static str) -> Result<(), DeviceError> {
        match self.runs().find(|r| r.stage == super::Stage::Launched) {
            Some(r) => Err(super::busy(
                call,
                format!(
                    "{} is launched (a device-object orchestration loads on the AICPU stream)",
                    r.run_id
                ),
            )),
            None => Ok(()),
        }
    }

    /// Drops one registration's reference to the chip buffer of content `hash`, freeing it
    /// with the last one.
    fn release_buffer(&mut self, hash: u64) {
        if let Some(buf) = self.callables.buffers.get_mut(&hash) {
            buf.refs -= 1;
            if buf.refs == 0 {
                let addr = buf.addr;
                self.callables.buffers.remove(&hash);
                if self.health.get().is_healthy() {
                    self.backend.free(addr);
                }
            }
        }
    }
}
