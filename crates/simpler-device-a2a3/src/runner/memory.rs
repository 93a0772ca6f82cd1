//! The runner's device memory: user allocations and their range checks, the three pooled
//! arenas (GM heap, runtime image, staging), staging of host tensors, and the memory view a
//! chip runtime builds a run with.
//!
//! Arena rule: an equal-or-smaller request reuses the arena; a larger one frees it and
//! allocates anew; any failed arena allocation releases all three, so the retry starts from
//! free device memory.

use simpler_types::{RunId, Tensor, TensorArgType};

use super::staging::{StagedTensor, host_slice};
use super::{ActiveRun, Core, oom};
use crate::backend::Backend;
use crate::error::{DeviceError, MemPurpose};
use crate::runtime::BuildEnv;

/// One pooled allocation.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Arena {
    pub(super) addr: u64,
    pub(super) len: u64,
}

/// The pooled arenas, kept across runs.
#[derive(Debug, Default)]
pub(super) struct Arenas {
    pub(super) heap: Option<Arena>,
    pub(super) image: Option<Arena>,
    pub(super) staging: Option<Arena>,
}

/// Whether kernels may be handed memory of this purpose: user allocations, the GM heap and
/// staging. Runtime images, kernel arguments and chip buffers are the runtime's own; a tensor
/// pointing into them could let a kernel rewrite what the scheduler trusts.
fn kernel_visible(p: Option<MemPurpose>) -> bool {
    matches!(p, Some(MemPurpose::User | MemPurpose::HeapArena | MemPurpose::Staging))
}

/// The device memory a chip runtime may use while it binds a run.
pub(super) struct RunMemory<'a> {
    pub(super) backend: &'a dyn Backend,
    pub(super) heap: &'a mut Option<Arena>,
    pub(super) run_id: RunId,
    /// Arena allocations this bind made (arena-cache misses).
    pub(super) misses: u64,
}

impl BuildEnv for RunMemory<'_> {
    fn device_range_ok(&self, addr: u64, len: u64) -> bool {
        kernel_visible(self.backend.find(addr, len))
    }

    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        self.backend.read(addr, out)
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> bool {
        self.backend.write(addr, data)
    }

    fn heap_arena(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        if let Some(a) = *self.heap {
            if a.len >= bytes {
                return Ok(a.addr);
            }
            self.backend.free(a.addr);
            *self.heap = None;
        }
        self.misses += 1;
        let addr = self
            .backend
            .malloc(bytes, MemPurpose::HeapArena)
            .map_err(|f| oom(Some(self.run_id), bytes, MemPurpose::HeapArena, f))?;
        *self.heap = Some(Arena { addr, len: bytes });
        Ok(addr)
    }
}

impl Core {
    /// Allocates `bytes` of user memory.
    pub(super) fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        if bytes == 0 {
            return Err(DeviceError::InvalidArgs {
                run_id: None,
                message: "malloc of 0 bytes".into(),
            });
        }
        let addr = self
            .backend
            .malloc(bytes, MemPurpose::User)
            .map_err(|f| oom(None, bytes, MemPurpose::User, f))?;
        self.user_allocs.insert(addr, bytes);
        Ok(addr)
    }

    /// Checks that `[addr, addr + len)` lies inside one user allocation.
    pub(super) fn check_user_range(&self, addr: u64, len: u64) -> Result<(), DeviceError> {
        let ok = self.user_allocs.range(..=addr).next_back().is_some_and(|(&start, &n)| {
            addr.checked_add(len).is_some_and(|end| end <= start + n) && addr < start + n.max(1)
        });
        if ok { Ok(()) } else { Err(DeviceError::BadDevicePointer { run_id: None, addr, len }) }
    }

    /// The image arena, grown when too small (any failure releases all arenas).
    pub(super) fn image_arena(&mut self, run_id: RunId, len: u64) -> Result<u64, DeviceError> {
        if let Some(a) = self.arenas.image {
            if a.len >= len {
                self.stats.arena_cache_hits += 1;
                return Ok(a.addr);
            }
            self.backend.free(a.addr);
            self.arenas.image = None;
        }
        self.stats.arena_cache_misses += 1;
        let alloc_len = len.next_power_of_two().max(1 << 16);
        match self.backend.malloc(alloc_len, MemPurpose::ImageArena) {
            Ok(addr) => {
                self.arenas.image = Some(Arena { addr, len: alloc_len });
                Ok(addr)
            }
            Err(f) => {
                self.release_arenas();
                Err(oom(Some(run_id), alloc_len, MemPurpose::ImageArena, f))
            }
        }
    }

    /// Frees every pooled arena.
    pub(super) fn release_arenas(&mut self) {
        for a in [self.arenas.heap.take(), self.arenas.image.take(), self.arenas.staging.take()]
            .into_iter()
            .flatten()
        {
            self.backend.free(a.addr);
        }
    }

    /// Preparation step 7, staging: device tensors pass through (range-checked); host tensors
    /// get a staging slice, copied in unless `Output`/`OutputExisting`. Returns the tensors the
    /// orchestration sees.
    pub(super) fn stage_tensors(
        &mut self,
        req: &super::RunRequest<'_>,
        run: &mut ActiveRun,
    ) -> Result<Vec<Tensor>, DeviceError> {
        let run_id = req.run_id;
        let mut out: Vec<Tensor> = req.args.tensors().to_vec();
        let tags = req.args.tags();
        let mut total = 0u64;
        for (i, t) in out.iter().enumerate() {
            let tag = tags.get(i).copied().unwrap_or_default();
            if t.is_null() {
                if !tag.allows_null() {
                    return Err(DeviceError::InvalidArgs {
                        run_id: Some(run_id),
                        message: format!(
                            "chip argument {i} ({tag}) is null; a written tensor needs a buffer"
                        ),
                    });
                }
                continue;
            }
            t.validate().map_err(|e| DeviceError::InvalidArgs {
                run_id: Some(run_id),
                message: format!("chip argument {i}: {e}"),
            })?;
            if t.is_child_memory() {
                if self.backend.find(t.addr, t.size) != Some(MemPurpose::User) {
                    return Err(DeviceError::BadDevicePointer {
                        run_id: Some(run_id),
                        addr: t.addr,
                        len: t.size,
                    });
                }
            } else {
                if !req.allows_host_tensors() {
                    return Err(DeviceError::InvalidArgs {
                        run_id: Some(run_id),
                        message: format!(
                            "chip argument {i} is host memory at {:#x} (child_memory = 0); pass device memory from malloc with child_memory set, or build the request with RunRequest::with_host_tensors",
                            t.addr
                        ),
                    });
                }
                total = total.saturating_add(t.size.div_ceil(1024) * 1024);
            }
        }
        if total == 0 {
            return Ok(out);
        }
        let base = self.staging_arena(run_id, total)?;
        let mut off = 0u64;
        for (i, t) in out.iter_mut().enumerate() {
            if t.is_null() || t.is_child_memory() {
                continue;
            }
            let tag = tags.get(i).copied().unwrap_or_default();
            let dev = base + off;
            off += t.size.div_ceil(1024) * 1024;
            if !matches!(tag, TensorArgType::Output | TensorArgType::OutputExisting) {
                // SAFETY: `with_host_tensors`' contract makes the host range readable.
                let Some(src) = (unsafe { host_slice(t.addr, t.size) }) else {
                    return Err(DeviceError::InvalidArgs {
                        run_id: Some(run_id),
                        message: format!("chip argument {i}: size overflows"),
                    });
                };
                self.backend.write(dev, src);
            }
            run.staged.push(StagedTensor {
                host_addr: t.addr,
                dev_addr: dev,
                bytes: t.size,
                copy_back: !matches!(tag, TensorArgType::Input | TensorArgType::NoDep),
            });
            t.addr = dev;
            t.child_memory = 1;
        }
        Ok(out)
    }

    fn staging_arena(&mut self, run_id: RunId, bytes: u64) -> Result<u64, DeviceError> {
        if let Some(a) = self.arenas.staging {
            if a.len >= bytes {
                return Ok(a.addr);
            }
            self.backend.free(a.addr);
            self.arenas.staging = None;
        }
        match self.backend.malloc(bytes, MemPurpose::Staging) {
            Ok(addr) => {
                self.arenas.staging = Some(Arena { addr, len: bytes });
                Ok(addr)
            }
            Err(f) => {
                self.release_arenas();
                Err(oom(Some(run_id), bytes, MemPurpose::Staging, f))
            }
        }
    }
}
