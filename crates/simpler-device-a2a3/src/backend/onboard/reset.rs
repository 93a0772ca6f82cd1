//! Giving the device back at finalize (steps 5 and 6 of the module docs of `onboard`): the
//! runner's binds, which CANN counts per device and process, the soft resets that balance
//! them on a healthy device, and on a poisoned one the force-reset loop with its probe and
//! the release of the allocations that had to outlive it.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use simpler_acl_sys::Error as CannError;

use super::owners::Ctx;
use super::{Allocation, FORCE_RESETS, OnboardDevice, acl};
use crate::error::DeviceError;

/// The binds of one runner: CANN counts every `rtSetDevice` per device and process.
#[derive(Debug)]
pub(super) struct Binds {
    /// This runner's identity among the process's runners, for [`BOUND_FOR`].
    identity: u64,
    /// Successful binds not yet reset.
    pub(super) count: u64,
    /// Set once finalize reset the device: a handle released after that needs no bind (and
    /// one would never be reset).
    released: bool,
}

/// The binds of a runner, shared with the handles that must be released in its device's
/// context (events), which may be dropped on any thread.
pub(super) type SharedBinds = Arc<Mutex<Binds>>;

/// Binds the calling thread for the runner of `binds` unless it is bound for it already (not
/// since bound for another runner: CANN binds one device per thread).
pub(super) fn bind_for(ctx: &Ctx, binds: &Mutex<Binds>) -> Result<(), CannError> {
    bind_held(ctx, &mut binds.lock())
}

fn bind_held(ctx: &Ctx, bound: &mut Binds) -> Result<(), CannError> {
    if bound.here() {
        return Ok(());
    }
    // SAFETY: plain integer argument.
    ctx.check("rtSetDevice", unsafe { ctx.cann.rtSetDevice(ctx.device) })?;
    bound.bound_here();
    Ok(())
}

/// Binds the calling thread for the runner of `binds` and runs `release`, which releases one of
/// its handles in its context. Not when the runner is gone or its device was reset (that
/// released the handle; a bind now would never be reset), nor when the bind fails (recorded for
/// the runner's next call): the handle is then left to the device's reset. The check, the bind
/// and `release` share one critical section, so a finalize cannot reset the device between them.
pub(super) fn release_in_context(ctx: &Ctx, binds: &Weak<Mutex<Binds>>, release: impl FnOnce()) {
    let Some(binds) = binds.upgrade() else { return };
    let mut bound = binds.lock();
    if bound.released {
        return;
    }
    match bind_held(ctx, &mut bound) {
        Ok(()) => release(),
        Err(e) => ctx.record(e),
    }
}

thread_local! {
    /// The runner (its [`Binds`] identity) this thread was last bound for. CANN binds one
    /// device per thread, so a thread bound since for another runner, of another device or of
    /// the same one, must be bound again before it calls for this one.
    static BOUND_FOR: Cell<u64> = const { Cell::new(0) };
}

/// Identities of runners, from 1 (0: no runner).
static NEXT_IDENTITY: AtomicU64 = AtomicU64::new(1);

impl Binds {
    pub(super) fn new() -> Binds {
        Binds { identity: NEXT_IDENTITY.fetch_add(1, Ordering::Relaxed), count: 0, released: false }
    }

    /// Whether the calling thread is bound for this runner.
    pub(super) fn here(&self) -> bool {
        BOUND_FOR.with(Cell::get) == self.identity
    }

    /// Counts a bind of the calling thread for this runner.
    pub(super) fn bound_here(&mut self) {
        self.count = self.count.saturating_add(1);
        BOUND_FOR.with(|b| b.set(self.identity));
    }
}

impl OnboardDevice {
    /// Finalize steps 5 and 6 (see the module docs): the first error, and whether a force
    /// reset passed (it gave the device's memory back, whatever failed after it).
    pub(super) fn reset_device(&mut self) -> (Result<(), DeviceError>, bool) {
        let cann = Arc::clone(&self.ctx.cann);
        let device = self.ctx.device;
        let binds = {
            let mut bound = self.bound.lock();
            bound.released = true;
            std::mem::take(&mut bound.count)
        };
        if !self.ctx.is_poisoned() {
            let mut first = None;
            for _ in 0..binds {
                // SAFETY: plain integer argument.
                let soft = self.ctx.check("rtDeviceReset", unsafe { cann.rtDeviceReset(device) });
                if let Err(e) = soft {
                    first.get_or_insert(e);
                }
            }
            return (first.map_or(Ok(()), |e| Err(acl(None, e))), false);
        }
        // ACL is process-wide: a session shares it with every other runner's reset and query,
        // so none finalizes it under another. A poisoned device may refuse even `aclInit`; the
        // force resets are still the way back, so its failure is only reported if they do not
        // succeed either.
        let (session, init_error) = match cann.acl_session() {
            Ok(session) => (Some(session), None),
            Err(e) => (None, Some(e)),
        };
        let mut last = None;
        let mut forced_back = false;
        for attempt in 1..=FORCE_RESETS {
            // CANN refuses a force reset of a device released already: the runner's binds
            // count for the first attempt; an earlier attempt (or its probe) released it.
            let set = if attempt == 1 && binds > 0 {
                Ok(())
            } else {
                // SAFETY: plain integer argument.
                self.ctx.check("rtSetDevice", unsafe { cann.rtSetDevice(device) })
            };
            let forced = set.and_then(|()| {
                // SAFETY: plain integer argument.
                let ret = unsafe { cann.aclrtResetDeviceForce(device) };
                self.ctx.check("aclrtResetDeviceForce", ret)
            });
            match forced.and_then(|()| self.probe()) {
                Ok(()) => {
                    tracing::info!(device, attempt, "device recovered by a force reset");
                    last = None;
                    forced_back = true;
                    break;
                }
                Err(e) => {
                    tracing::warn!(device, attempt, error = %e, "force reset not verified");
                    last = Some(e);
                }
            }
        }
        // The runner's own hold outlives the session, so this end finalizes nothing; the hold's
        // end does (finalize step 7). Its error is kept should that ever change.
        if let Some(Err(e)) = session.map(simpler_acl_sys::AclSession::end) {
            last.get_or_insert(e);
        }
        let result = match last.map(|e| init_error.unwrap_or(e)) {
            Some(e) => Err(acl(None, e)),
            None => Ok(()),
        };
        (result, forced_back)
    }

    /// Lets go of `held`, the allocations a launch could still use until the force reset,
    /// without freeing them: a passed force reset gave the device's memory back with it (a
    /// free now would name memory CANN no longer tracks), so every handle is left to it and
    /// they are dropped; without one the device may still use them, so they are leaked.
    pub(super) fn forget_after_reset(&self, held: BTreeMap<u64, Allocation>, reset_passed: bool) {
        if held.is_empty() {
            return;
        }
        let (device, allocations) = (self.ctx.device, held.len());
        let bytes: u64 = held.values().map(|a| a.buffer.len()).sum();
        if reset_passed {
            tracing::debug!(
                device,
                allocations,
                bytes,
                "device memory given back by the force reset"
            );
            self.ctx.leave_to_reset();
            drop(held);
        } else {
            tracing::warn!(
                device,
                allocations,
                bytes,
                "leaking {bytes} bytes of device memory: no force reset passed, so a launch may still use it"
            );
            std::mem::forget(held);
        }
    }

    /// The force-reset probe: bind, create and destroy a stream, allocate and free 64 bytes,
    /// unbind.
    fn probe(&self) -> Result<(), CannError> {
        let (cann, device) = (&self.ctx.cann, self.ctx.device);
        // SAFETY: plain integer argument.
        self.ctx.check("aclrtSetDevice", unsafe { cann.aclrtSetDevice(device) })?;
        let result = (|| {
            let mut s = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            self.ctx.check("aclrtCreateStream", unsafe { cann.aclrtCreateStream(&mut s) })?;
            // SAFETY: the stream just created.
            self.ctx.check("aclrtDestroyStream", unsafe { cann.aclrtDestroyStream(s) })?;
            let mut p = std::ptr::null_mut();
            // SAFETY: valid out-pointer; policy ACL_MEM_MALLOC_HUGE_FIRST.
            let ret = unsafe {
                cann.aclrtMalloc(&mut p, 64, simpler_acl_sys::types::ACL_MEM_MALLOC_HUGE_FIRST)
            };
            self.ctx.check("aclrtMalloc", ret)?;
            // SAFETY: the allocation just made.
            self.ctx.check("aclrtFree", unsafe { cann.aclrtFree(p) })
        })();
        // SAFETY: plain integer argument; pairs with the bind above.
        let unbind = self.ctx.check("aclrtResetDevice", unsafe { cann.aclrtResetDevice(device) });
        result.and(unbind)
    }
}
