//! Device backends behind the runner (spec §1).
//!
//! Backend methods are thin: launches, syncs and queries, memory, the register table, drain and
//! reset. All validation lives in `runner` (decision; as wgpu-hal says of its backends,
//! validation is the caller's job). The onboard backend (feature `onboard`) is not built yet.

pub(crate) mod sim;

use std::sync::Arc;
use std::time::Duration;

use crate::abi::codes::AclCode;
use crate::abi::launch::InitArgs;
use crate::error::{CoreFault, MemPurpose, StreamKind};

use self::sim::{
    AllocFailure, FaultPlan, MemoryCounts, SimDevice, SimLaunch, SimThreadStats, StreamStatus,
    SyncError,
};

/// A launched kernel, for timing.
#[derive(Debug, Clone)]
pub(crate) enum Launched {
    Sim(Arc<SimLaunch>),
}

impl Launched {
    /// Counter ticks when the launch started executing (0 = not yet).
    pub(crate) fn started_ticks(&self) -> u64 {
        match self {
            Launched::Sim(l) => {
                l.started_ticks.load(std::sync::atomic::Ordering::Acquire).saturating_sub(1)
            }
        }
    }
}

/// The device a runner drives.
#[derive(Debug)]
pub(crate) enum Backend {
    /// The simulated chip.
    Sim(SimDevice),
}

fn stream_index(s: StreamKind) -> usize {
    match s {
        StreamKind::Aicpu => sim::AICPU_STREAM,
        StreamKind::AiCore => sim::AICORE_STREAM,
    }
}

impl Backend {
    pub(crate) fn start_programs(&mut self) -> Result<(), String> {
        match self {
            Backend::Sim(d) => d.start_aicpu_threads(),
        }
    }

    pub(crate) fn init_aicpu(&mut self, init: InitArgs) {
        match self {
            Backend::Sim(d) => d.init_aicpu(init),
        }
    }

    pub(crate) fn malloc(&self, bytes: u64, purpose: MemPurpose) -> Result<u64, AllocFailure> {
        match self {
            Backend::Sim(d) => d.malloc(bytes, purpose),
        }
    }

    pub(crate) fn free(&self, addr: u64) -> Option<MemPurpose> {
        match self {
            Backend::Sim(d) => d.free(addr),
        }
    }

    pub(crate) fn find(&self, addr: u64, len: u64) -> Option<MemPurpose> {
        match self {
            Backend::Sim(d) => d.find(addr, len),
        }
    }

    pub(crate) fn write(&self, dst: u64, src: &[u8]) -> bool {
        match self {
            Backend::Sim(d) => d.write(dst, src),
        }
    }

    pub(crate) fn read(&self, src: u64, dst: &mut [u8]) -> bool {
        match self {
            Backend::Sim(d) => d.read(src, dst),
        }
    }

    pub(crate) fn fill(&self, dst: u64, value: u8, len: u64) -> bool {
        match self {
            Backend::Sim(d) => d.fill(dst, value, len),
        }
    }

    pub(crate) fn memory_counts(&self) -> MemoryCounts {
        match self {
            Backend::Sim(d) => d.memory_counts(),
        }
    }

    pub(crate) fn register_table(&self) -> Vec<u64> {
        match self {
            Backend::Sim(d) => d.register_table(),
        }
    }

    pub(crate) fn launch_aicore(&mut self, block_dim: u32, args: u64) -> Result<Launched, AclCode> {
        match self {
            Backend::Sim(d) => d.launch_aicore(block_dim, args).map(Launched::Sim),
        }
    }

    pub(crate) fn launch_aicpu(&mut self, threads: u32, args: u64) -> Result<Launched, AclCode> {
        match self {
            Backend::Sim(d) => d.launch_aicpu(threads, args).map(Launched::Sim),
        }
    }

    pub(crate) fn synchronize(
        &self,
        s: StreamKind,
        timeout: Duration,
        op_execute: Duration,
    ) -> Result<(), SyncError> {
        match self {
            Backend::Sim(d) => d.synchronize(stream_index(s), timeout, op_execute),
        }
    }

    pub(crate) fn query(&self, s: StreamKind, op_execute: Duration) -> StreamStatus {
        match self {
            Backend::Sim(d) => d.query(stream_index(s), op_execute),
        }
    }

    pub(crate) fn drain(&self, timeout: Duration, op_execute: Duration) -> bool {
        match self {
            Backend::Sim(d) => d.drain(timeout, op_execute),
        }
    }

    pub(crate) fn take_faults(&self) -> Vec<CoreFault> {
        match self {
            Backend::Sim(d) => d.take_faults(),
        }
    }

    pub(crate) fn faults(&self) -> Option<&FaultPlan> {
        match self {
            Backend::Sim(d) => Some(d.faults()),
        }
    }

    pub(crate) fn thread_stats(&self) -> SimThreadStats {
        match self {
            Backend::Sim(d) => d.thread_stats(),
        }
    }

    /// Resets the device and joins its threads; returns the detached thread names.
    pub(crate) fn shutdown(&mut self, budget: Duration) -> Vec<String> {
        match self {
            Backend::Sim(d) => d.shutdown(budget),
        }
    }
}
