//! The ACL session: one `aclInit` and one `aclFinalize` shared by every caller in the process
//! that needs ACL initialised at the same time.
//!
//! CANN initialises ACL once per process (per loaded `libascendcl.so`): a second `aclInit`
//! answers `ACL_ERROR_REPEAT_INITIALIZE`, and one `aclFinalize` ends ACL for every thread. So
//! callers that each paired their own `aclInit` with an `aclFinalize` would finalize ACL under
//! one another. They take a lease instead ([`Cann::acl_session`]).
//!
//! # Lease protocol
//!
//! 1. A process-wide table holds at most one entry per loaded ACL library, keyed by the address
//!    its `aclInit` resolves to: loaders that opened the same library share the entry, and
//!    distinct copies of the library (the stand-in's installs) have one each, as each has its
//!    own ACL state.
//! 2. The first lease on a library (no entry) resolves `aclFinalize`, so that whoever
//!    initialises ACL can finalize it, then calls `aclInit` with the table locked: concurrent
//!    first leases wait for that one outcome. 0: the project initialised ACL, and the entry
//!    will finalize it. `ACL_ERROR_REPEAT_INITIALIZE`: something outside the project did, and
//!    the entry never finalizes it. Any other code fails the lease and makes no entry.
//! 3. A later lease counts itself in the entry; it calls nothing.
//! 4. A lease ends ([`AclSession::end`], or its drop) by counting itself out. The last one
//!    removes the entry and, only if the project initialised ACL, calls `aclFinalize` with the
//!    table still locked, so no new lease calls `aclInit` while ACL is being finalized. `end`
//!    returns the failure of that `aclFinalize`; a drop logs it. The entry is gone either way:
//!    the next lease's `aclInit` finds out again who holds ACL.
//! 5. A key is never reused while its entry lives: every lease borrows its [`Cann`], which
//!    keeps the library loaded, so no other library can be loaded at that address meanwhile.
//!    A lease passed to `mem::forget` never ends: its library's ACL is then never finalized,
//!    and a library loaded later at the same address would count itself in the stale entry
//!    without calling `aclInit`.
//!
//! The table stays locked while `aclInit` or `aclFinalize` runs, so a slow one delays leases
//! on every library. When `aclFinalize` fails, ACL stays initialised and the next lease's
//! `aclInit` answers `ACL_ERROR_REPEAT_INITIALIZE`: from then on the project takes ACL for
//! initialised outside it and leaves it initialised.

use std::fmt;
use std::mem::ManuallyDrop;

use parking_lot::Mutex;

use crate::error::{Error, LoadError};
use crate::generated::types::ACL_ERROR_REPEAT_INITIALIZE;
use crate::loader::{Cann, Library};

/// The leases of one loaded ACL library.
struct Entry {
    /// The address `aclInit` resolves to in that library.
    key: usize,
    /// Live leases, at least 1.
    leases: usize,
    /// Whether the first lease's `aclInit` initialised ACL (the last lease then finalizes it).
    finalizes: bool,
}

/// Every library with a live lease; a handful at most, so a list.
static SESSIONS: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// A lease on ACL being initialised: while it lives, ACL stays initialised for its loader's
/// library, whoever else in the process initialises or finalizes through a session.
///
/// End it with [`AclSession::end`] to see whether the `aclFinalize` it may make fails; a
/// dropped session logs that failure instead.
#[must_use = "dropping the session may finalize ACL at once"]
pub struct AclSession<'a> {
    cann: &'a Cann,
    key: usize,
}

impl fmt::Debug for AclSession<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AclSession").field("key", &format_args!("{:#x}", self.key)).finish()
    }
}

impl Cann {
    /// A lease on ACL being initialised, shared with every other session of the process on
    /// the same library (see the [lease protocol](crate::session)): the first calls `aclInit`,
    /// the last calls `aclFinalize` if that `aclInit` initialised ACL. An ACL initialised
    /// outside the project is used as it is and never finalized.
    ///
    /// # Errors
    ///
    /// [`Error::Load`] when `aclInit` or `aclFinalize` is missing; [`Error::Acl`] when
    /// `aclInit` fails with a code other than `ACL_ERROR_REPEAT_INITIALIZE` (no session is
    /// left behind: the next call tries `aclInit` again).
    pub fn acl_session(&self) -> Result<AclSession<'_>, Error> {
        let key = self.acl_key()?;
        let mut sessions = SESSIONS.lock();
        if let Some(entry) = sessions.iter_mut().find(|e| e.key == key) {
            entry.leases = entry.leases.saturating_add(1);
            return Ok(AclSession { cann: self, key });
        }
        // SAFETY: a null configuration path is allowed (CANN's defaults).
        let code = unsafe { self.aclInit(std::ptr::null()) }?;
        let finalizes = match code {
            0 => true,
            ACL_ERROR_REPEAT_INITIALIZE => false,
            _ => return Err(Error::Acl(self.error("aclInit", code))),
        };
        sessions.push(Entry { key, leases: 1, finalizes });
        Ok(AclSession { cann: self, key })
    }

    /// The key of this loader's ACL library, with `aclFinalize` resolved too.
    fn acl_key(&self) -> Result<usize, LoadError> {
        self.resolve(&self.slots.aclFinalize, Library::Acl, "aclFinalize")?;
        let init = self.resolve(&self.slots.aclInit, Library::Acl, "aclInit")?;
        Ok(init as usize)
    }
}

impl AclSession<'_> {
    /// Ends the lease; the last one of its library finalizes ACL if the project initialised it.
    ///
    /// # Errors
    ///
    /// [`Error::Acl`] (or [`Error::Load`]) when that `aclFinalize` fails. ACL's session ends
    /// all the same: the next lease calls `aclInit` again.
    pub fn end(self) -> Result<(), Error> {
        let session = ManuallyDrop::new(self);
        session.release()
    }

    fn release(&self) -> Result<(), Error> {
        let mut sessions = SESSIONS.lock();
        // Always found: this lease is counted in its entry until now.
        let Some(at) = sessions.iter().position(|e| e.key == self.key) else { return Ok(()) };
        let entry = &mut sessions[at];
        entry.leases = entry.leases.saturating_sub(1);
        if entry.leases > 0 || !sessions.swap_remove(at).finalizes {
            return Ok(());
        }
        // SAFETY: no arguments; the last lease ends, so no session uses ACL any more, and the
        // table stays locked until ACL is finalized.
        let code = unsafe { self.cann.aclFinalize() }?;
        self.cann.check("aclFinalize", code).map_err(Error::from)
    }
}

impl Drop for AclSession<'_> {
    fn drop(&mut self) {
        if let Err(error) = self.release() {
            tracing::error!(%error, "the last ACL session could not finalize ACL");
        }
    }
}
