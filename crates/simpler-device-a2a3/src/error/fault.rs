//! The status a chip runtime latched, as read back after a run: the fault record, ring sizes
//! and usage, scheduler stall details and overlapping arguments.

use std::fmt;
use std::time::Duration;

use simpler_types::{DeviceTaskId, RunId};

use super::{DeviceError, fmt_task};
use crate::abi::CoreType;
use crate::abi::codes::{RuntimeCode, StallClass};

/// Ring sizes or usage at a capacity failure: task window, heap bytes, dep pool.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct RingSizes {
    /// Task-window entries.
    pub task_window: u64,
    /// Heap bytes.
    pub heap_bytes: u64,
    /// Dependency-pool entries.
    pub dep_pool: u64,
}

/// Details of a scheduler stall (code 100).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StallInfo {
    /// How the stall was classified.
    pub class: StallClass,
    /// The task that was stuck, if one was identified.
    pub stuck_task: Option<DeviceTaskId>,
    /// The core it was stuck on: index and type.
    pub stuck_core: Option<(u32, CoreType)>,
    /// Member dispatches running at the latch.
    pub running: u32,
    /// Ready tasks at the latch.
    pub ready: u32,
    /// Waiting tasks at the latch.
    pub waiting: u32,
    /// The no-progress budget that expired.
    pub budget: Duration,
}

/// A status latched by a chip runtime (`docs/device-chip.md`), read from the shared header after a run.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RuntimeFault {
    /// The latched code.
    pub code: RuntimeCode,
    /// Failing ring of a capacity error.
    pub ring: Option<u8>,
    /// Ring sizes at the failure.
    pub sizes: Option<RingSizes>,
    /// Ring usage at the failure.
    pub usage: Option<RingSizes>,
    /// The task concerned, if any.
    pub task: Option<DeviceTaskId>,
    /// Stall details of a scheduler timeout.
    pub stall: Option<StallInfo>,
    /// AICPU thread that latched the code, if known.
    pub thread: Option<u32>,
    /// The arguments of an `OVERLAPPING_ARGUMENTS` refusal.
    pub overlap: Option<ArgOverlap>,
    /// What the runtime said, as the text it wrote (the orchestration's `report_fatal`
    /// message, or the device runtime's description of the status it latched): the runtime
    /// reports it as text only.
    pub message: String,
}

/// A submitted task that writes bytes it also names through another argument, as a device-side
/// orchestration reports it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ArgOverlap {
    /// The task's index in submission order.
    pub task: u64,
    /// Index of the written tensor (by its tag, or by its kernel's signature).
    pub written: usize,
    /// Index of the tensor it overlaps.
    pub other: usize,
}

impl RuntimeFault {
    /// A fault with only a code and a message.
    pub fn new(code: RuntimeCode, message: impl Into<String>) -> RuntimeFault {
        RuntimeFault {
            code,
            ring: None,
            sizes: None,
            usage: None,
            task: None,
            stall: None,
            thread: None,
            overlap: None,
            message: message.into(),
        }
    }

    /// The error a run that latched this fault ends with: overlapping arguments are the same
    /// `OverlappingArguments` under every runtime, anything else a `Runtime` error.
    pub(crate) fn into_error(self, run_id: RunId) -> DeviceError {
        match self.overlap {
            Some(ArgOverlap { task, written, other }) => {
                DeviceError::OverlappingArguments { run_id, task, written, other }
            }
            None => DeviceError::Runtime { run_id, fault: Box::new(self) },
        }
    }
}

impl fmt::Display for RuntimeFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(stall) = &self.stall {
            write!(f, "scheduler timeout after {:?} ({}", stall.budget, stall.class)?;
            if let Some(task) = stall.stuck_task {
                write!(f, ", {}", fmt_task(task))?;
            }
            if let Some((idx, ty)) = stall.stuck_core {
                write!(f, " on {}{}", ty.name(), idx)?;
            }
            write!(
                f,
                "; running {}, ready {}, waiting {})",
                stall.running, stall.ready, stall.waiting
            )?;
        } else {
            write!(f, "runtime status {}", self.code)?;
        }
        if let Some(ring) = self.ring {
            write!(f, " on ring {ring}")?;
        }
        if let (Some(s), Some(u)) = (self.sizes, self.usage) {
            write!(
                f,
                " (window {}/{}, heap {}/{} bytes, dep pool {}/{})",
                u.task_window, s.task_window, u.heap_bytes, s.heap_bytes, u.dep_pool, s.dep_pool
            )?;
        }
        if let Some(task) = self.task.filter(|_| self.stall.is_none()) {
            write!(f, ", {}", fmt_task(task))?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}
