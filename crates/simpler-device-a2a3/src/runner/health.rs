//! Device health (`docs/device-runner.md`).
//!
//! A runner is `Healthy` until a launch fails or a stream sync fails; then it is `Unusable`
//! with the cause, until `finalize`. The [`HealthProbe`] is an atomic view other threads read
//! without the runner.
//!
//! Protocol: the runner's thread (1) stores the cause under the mutex, then (2) sets `unusable`
//! with release. A reader (1) loads `unusable` with acquire and, if set, (2) locks the mutex and
//! reads the cause, which step (1) of the writer made visible.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::error::PoisonCause;

/// Whether a runner can still run work.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DeviceHealth {
    /// Runs are accepted.
    Healthy,
    /// Every device-touching call fails fast until `finalize`.
    Unusable {
        /// What made it unusable.
        cause: PoisonCause,
    },
}

impl DeviceHealth {
    /// Whether the device is healthy.
    pub fn is_healthy(&self) -> bool {
        matches!(self, DeviceHealth::Healthy)
    }
}

impl fmt::Display for DeviceHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceHealth::Healthy => f.write_str("healthy"),
            DeviceHealth::Unusable { cause } => write!(f, "unusable: {cause}"),
        }
    }
}

/// The shared cell behind a runner's health.
#[derive(Debug, Default)]
pub(crate) struct HealthCell {
    /// Written by the runner thread (release), read by probes (acquire).
    unusable: AtomicBool,
    cause: Mutex<Option<PoisonCause>>,
}

impl HealthCell {
    pub(crate) fn get(&self) -> DeviceHealth {
        if !self.unusable.load(Ordering::Acquire) {
            return DeviceHealth::Healthy;
        }
        match *self.cause.lock() {
            Some(cause) => DeviceHealth::Unusable { cause },
            None => DeviceHealth::Healthy,
        }
    }

    pub(crate) fn poison(&self, cause: PoisonCause) {
        let mut c = self.cause.lock();
        if c.is_none() {
            *c = Some(cause);
        }
        drop(c);
        self.unusable.store(true, Ordering::Release);
    }
}

/// A cloneable, thread-safe view of a runner's health.
#[derive(Clone, Debug)]
pub struct HealthProbe {
    pub(crate) cell: Arc<HealthCell>,
}

impl HealthProbe {
    /// The current health.
    pub fn health(&self) -> DeviceHealth {
        self.cell.get()
    }

    /// Whether the runner is healthy.
    pub fn is_healthy(&self) -> bool {
        self.health().is_healthy()
    }
}
