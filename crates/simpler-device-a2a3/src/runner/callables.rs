//! The runner's callable table: 64 slots, uploaded chip buffers deduplicated by content
//! (spec §3.4).

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::sync::Arc;

use crate::abi::MAX_CALLABLE_SLOTS;
use crate::abi::MAX_FUNC_IDS;
use crate::abi::launch::CoreKernelHeader;
use crate::backend::sim::SharedObject;
use crate::callable::{ChipCallable, KernelCode, Orchestration};
use crate::error::DeviceError;

/// One registered callable.
#[derive(Debug)]
pub(crate) struct Registered {
    pub(crate) callable: Arc<ChipCallable>,
    /// Registration generation, stamped into the image as part of the active callable (P13).
    pub(crate) generation: u64,
    /// Content hash of the uploaded chip buffer.
    pub(crate) buffer_hash: u64,
    /// Kernel entry address per func id (0 = unset); written into each run's image.
    pub(crate) func_table: Box<[u64]>,
    /// Which func ids are registered.
    pub(crate) funcs: Vec<bool>,
    /// Shared objects holding kernels of this callable; closed when it is unregistered.
    pub(crate) objects: Vec<SharedObject>,
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
    /// Shared objects of callables unregistered while the runner was unusable: a simulated
    /// thread stuck in one of their kernels may still be executing their code, so they stay
    /// mapped until `finalize` has confirmed every thread gone (and forever otherwise).
    pub(crate) retired_objects: Vec<SharedObject>,
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

/// Kernel addresses a callable resolved to, and the objects that hold them.
#[derive(Debug, Default)]
pub(crate) struct Resolved {
    /// `(func id, kernel entry address)`, in func-id order.
    pub(crate) kernels: Vec<(u32, u64)>,
    /// Shared objects kept open while the callable is registered.
    pub(crate) objects: Vec<SharedObject>,
}

/// Resolves every kernel of `c` to an address the simulator can call; anything it cannot run
/// is `InvalidCallable`.
pub(crate) fn resolve_for_sim(c: &ChipCallable) -> Result<Resolved, DeviceError> {
    if let Orchestration::DeviceObject { entry, .. } = c.orchestration() {
        return Err(DeviceError::InvalidCallable {
            run_id: None,
            reason: format!(
                "orchestration {entry:?} is a device object, which only the onboard tensormap_and_ringbuffer runtime can run; the simulator needs a Native orchestration"
            ),
        });
    }
    let mut r = Resolved::default();
    for (id, k) in c.children() {
        let addr = match k.code() {
            KernelCode::Native(f) => *f as usize as u64,
            KernelCode::SharedObject(so) => {
                let fail = |e: String| DeviceError::InvalidCallable {
                    run_id: None,
                    reason: format!("kernel {id}: {e}"),
                };
                // SAFETY: `SharedObjectKernel::new`'s contract: the object may be loaded and its
                // `kernel_entry` has the kernel ABI.
                let obj = unsafe { SharedObject::open(so.path()) }.map_err(fail)?;
                // SAFETY: as above.
                let entry = unsafe { obj.kernel_entry() }.map_err(fail)?;
                r.objects.push(obj);
                entry as usize as u64
            }
            KernelCode::Text(_) => {
                return Err(DeviceError::InvalidCallable {
                    run_id: None,
                    reason: format!(
                        "kernel {id} is device text, which only the onboard backend can run"
                    ),
                });
            }
        };
        r.kernels.push((*id, addr));
    }
    Ok(r)
}

/// The chip buffer bytes of `c`: one header per kernel, in func-id order.
pub(crate) fn chip_buffer_bytes(c: &ChipCallable, resolved: &Resolved) -> Vec<u8> {
    let mut out = vec![0u8; c.children().len().max(1) * size_of::<CoreKernelHeader>()];
    for (i, ((id, k), (_, addr))) in c.children().iter().zip(&resolved.kernels).enumerate() {
        let base = i * size_of::<CoreKernelHeader>();
        let sig: Vec<u8> = k.signature().iter().map(|d| *d as u8).collect();
        let put = |out: &mut [u8], off: usize, b: &[u8]| {
            out[base + off..base + off + b.len()].copy_from_slice(b)
        };
        put(&mut out, offset_of!(CoreKernelHeader, func_id), &id.to_le_bytes());
        put(
            &mut out,
            offset_of!(CoreKernelHeader, signature_len),
            &(sig.len() as u32).to_le_bytes(),
        );
        put(&mut out, offset_of!(CoreKernelHeader, kernel), &addr.to_le_bytes());
        put(&mut out, offset_of!(CoreKernelHeader, signature), &sig[..sig.len().min(32)]);
    }
    out
}

/// Kernel addresses by func id, and the set of func ids.
pub(crate) fn func_table_of(resolved: &Resolved) -> (Box<[u64]>, Vec<bool>) {
    let mut table = vec![0u64; MAX_FUNC_IDS].into_boxed_slice();
    let mut funcs = vec![false; MAX_FUNC_IDS];
    for &(id, addr) in &resolved.kernels {
        if let Some(slot) = table.get_mut(id as usize) {
            *slot = addr;
            funcs[id as usize] = true;
        }
    }
    (table, funcs)
}

impl CallableTable {
    pub(crate) fn new() -> CallableTable {
        CallableTable {
            slots: (0..MAX_CALLABLE_SLOTS).map(|_| None).collect(),
            buffers: HashMap::new(),
            next_generation: 1,
            retired_objects: Vec::new(),
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
