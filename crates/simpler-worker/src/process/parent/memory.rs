//! Memory requests of a chip process: allocations, copies in pieces that fit the mailbox, the
//! ledger, and the refusal of memory of an earlier process of the chip
//! (`docs/process-mode.md`, "Failures").

use simpler_device_a2a3::MemoryLedger;
use simpler_types::{EndpointOutcome, TaskArgs};

use super::{ChipProcess, MemFailure, PIECE, mem_child};
use crate::error::MemError;
use crate::process::ProtocolFault;
use crate::process::wire::{Malformed, Reader, op, status};

impl ChipProcess {
    /// One memory request (its frame in `self.out`): the child's own failure, or its chip's
    /// refusal as a frame.
    fn mem_request(&mut self, code: u32, operation: &'static str) -> Result<(), MemFailure> {
        match self.call(code, operation, None) {
            Ok(status::OK) => Ok(()),
            Ok(_) => Err(self
                .failure_frame(operation)
                .map_or_else(MemFailure::Child, MemFailure::Device)),
            Err(e) => Err(MemFailure::Child(e)),
        }
    }

    /// The memory error of `f`, as a chip in this process would return it.
    fn mem_error(&self, f: MemFailure) -> MemError {
        let chip = self.chip;
        match f {
            MemFailure::Child(e) => mem_child(chip, e),
            MemFailure::Device(f) if f.outcome == EndpointOutcome::EndpointFailure => {
                let (message, code) = (f.message, f.code);
                MemError::DeviceUnusable { chip, message, code, child: None, device: None }
            }
            MemFailure::Device(f) => {
                MemError::Device { chip, message: f.message, code: f.code, device: None }
            }
        }
    }

    pub(in crate::process) fn device_malloc(&mut self, bytes: u64) -> Result<u64, MemFailure> {
        self.out.0.clear();
        self.out.u64(bytes);
        self.mem_request(op::MALLOC, "malloc")?;
        let addr = Reader(&self.reply)
            .u64()
            .map_err(|e| MemFailure::Child(self.malformed("malloc", e)))?;
        // Every later address of the allocation is `addr` plus an offset inside it.
        if addr.checked_add(bytes).is_none() {
            let fault = ProtocolFault::AllocationPastAddressSpace { addr, bytes };
            return Err(MemFailure::Child(self.protocol(fault)));
        }
        self.buffers.allocated(addr, bytes);
        Ok(addr)
    }

    pub(in crate::process) fn device_free(&mut self, addr: u64) -> Result<(), MemFailure> {
        self.out.0.clear();
        self.out.u64(addr);
        self.mem_request(op::FREE, "free")?;
        self.buffers.freed(addr);
        Ok(())
    }

    /// Copies `data` to `addr` in pieces that fit the mailbox.
    pub(in crate::process) fn device_copy_to(
        &mut self,
        addr: u64,
        data: &[u8],
    ) -> Result<(), MemFailure> {
        for (i, piece) in data.chunks(PIECE).enumerate() {
            self.out.0.clear();
            self.out.u64(addr + (i * PIECE) as u64).bytes(piece);
            self.mem_request(op::COPY_TO, "copy_to")?;
        }
        Ok(())
    }

    /// Fills `out` from `addr` in pieces that fit the mailbox.
    pub(in crate::process) fn device_copy_from(
        &mut self,
        addr: u64,
        out: &mut [u8],
    ) -> Result<(), MemFailure> {
        if out.is_empty() {
            // Still one request, so that a bad address is refused as in THREAD mode.
            self.out.0.clear();
            self.out.u64(addr).u64(0);
            return self.mem_request(op::COPY_FROM, "copy_from");
        }
        for (i, piece) in out.chunks_mut(PIECE).enumerate() {
            self.out.0.clear();
            self.out.u64(addr + (i * PIECE) as u64).u64(piece.len() as u64);
            self.mem_request(op::COPY_FROM, "copy_from")?;
            if self.reply.len() != piece.len() {
                let fault = ProtocolFault::CopyLength { asked: piece.len(), got: self.reply.len() };
                return Err(MemFailure::Child(self.protocol(fault)));
            }
            piece.copy_from_slice(&self.reply);
        }
        Ok(())
    }

    /// The number of the current process (the first is 1).
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Refuses buffer `addr` (`len` bytes) of an earlier process of this chip: its memory ended
    /// with that process, and the current one may have handed its address to another buffer.
    /// The process is made live first (restarted, under that policy), so a buffer of a process
    /// that died since is refused too, never sent to its successor.
    pub(crate) fn current_buffer(
        &mut self,
        generation: u64,
        addr: u64,
        len: u64,
    ) -> Result<(), MemError> {
        self.ensure_live().map_err(|e| mem_child(self.chip, e))?;
        if generation != self.generation {
            return Err(MemError::StaleBuffer {
                chip: self.chip,
                addr,
                len,
                buffer_process: generation,
                process: self.generation,
            });
        }
        Ok(())
    }

    /// Refuses the arguments of a run that name memory of an earlier process of this chip: a
    /// chip-memory tensor that touches an allocation of a process that ended and lies in no
    /// allocation of the current one. The caller made the process live first, so that a
    /// restart it needed has ended the allocations of the process before.
    pub(in crate::process) fn check_run_memory(&self, args: &TaskArgs) -> Result<(), MemError> {
        for t in args.tensors().iter().filter(|t| t.is_child_memory()) {
            let Some((start, end)) = t.byte_span() else { continue };
            if let Some(stale) = self.buffers.stale_under(start, end) {
                return Err(MemError::StaleBuffer {
                    chip: self.chip,
                    addr: stale.addr,
                    len: stale.len,
                    buffer_process: stale.process,
                    process: self.generation,
                });
            }
        }
        Ok(())
    }

    pub(crate) fn malloc(&mut self, bytes: u64) -> Result<u64, MemError> {
        self.device_malloc(bytes).map_err(|f| self.mem_error(f))
    }

    // `free` and the copies name an address the caller checked against the current process
    // (`current_buffer`): they are pinned to it, so that its death fails them instead of
    // restarting the chip and sending the address, or the rest of a copy, to the successor.

    pub(crate) fn free(&mut self, addr: u64) -> Result<(), MemError> {
        self.in_this_process(|p| p.device_free(addr)).map_err(|f| self.mem_error(f))
    }

    pub(crate) fn copy_to(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        self.in_this_process(|p| p.device_copy_to(addr, data)).map_err(|f| self.mem_error(f))
    }

    pub(crate) fn copy_from(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, MemError> {
        let mut out = vec![0u8; len];
        self.in_this_process(|p| p.device_copy_from(addr, &mut out))
            .map_err(|f| self.mem_error(f))?;
        Ok(out)
    }

    pub(crate) fn ledger(&mut self) -> Result<MemoryLedger, MemError> {
        self.out.0.clear();
        self.mem_request(op::LEDGER, "ledger").map_err(|f| self.mem_error(f))?;
        let mut r = Reader(&self.reply);
        let mut read = || -> Result<MemoryLedger, Malformed> {
            Ok(MemoryLedger {
                committed: r.u64()?,
                user_allocations: r.u64()?,
                pooled_arenas: r.u64()?,
                runtime_buffers: r.u64()?,
            })
        };
        read().map_err(|e| mem_child(self.chip, self.malformed("ledger", e)))
    }
}
