//! The ACL session: one `aclInit` and one `aclFinalize` shared by every caller in the process
//! that needs ACL initialised at the same time.
//!
//! CANN initialises ACL once per process (per loaded `libascendcl.so`): a second `aclInit`
//! answers `ACL_ERROR_REPEAT_INITIALIZE`, and one `aclFinalize` ends ACL for every thread. So
//! callers that each paired their own `aclInit` with an `aclFinalize` would finalize ACL under
//! one another. They take a lease instead ([`Cann::acl_session`]).
//!
//! Callers that call nothing needing ACL initialised but must not see it finalized under them
//! while they live (a device runner between its attach and its finalize, whose device another
//! runner's force reset would otherwise outlive ACL for) take a hold instead
//! ([`Cann::acl_hold`]): it keeps ACL from being finalized but initialises nothing.
//!
//! # Lease protocol
//!
//! 1. A process-wide table holds at most one entry per loaded ACL library, keyed by the address
//!    its `aclInit` resolves to: loaders that opened the same library share the entry, and
//!    distinct copies of the library (the stand-in's installs) have one each, as each has its
//!    own ACL state. An entry counts its live sessions and holds apart, and knows whether ACL is
//!    initialised for its sessions and whether the project initialised it.
//! 2. A session on a library whose entry does not know ACL initialised (no entry, or one whose
//!    live leases are holds only) resolves `aclFinalize`, so that whoever initialises ACL can
//!    finalize it, then calls `aclInit` with the table locked: concurrent sessions wait for that
//!    one outcome. 0: the project initialised ACL, and the entry will finalize it.
//!    `ACL_ERROR_REPEAT_INITIALIZE`: something outside the project did, and the entry never
//!    finalizes it. Any other code fails the session and leaves the entry as it was (none is
//!    made).
//! 3. A later session counts itself in the entry; it calls nothing. A hold always just counts
//!    itself in, making an entry that knows nothing initialised if there is none.
//! 4. A session or hold ends ([`AclSession::end`], [`AclHold::end`], or a drop) by counting
//!    itself out. When the last session of an entry whose ACL was initialised outside ends,
//!    the entry forgets that ACL is initialised: whoever initialised it may finalize it, so the
//!    next session asks `aclInit` again. The last session or hold removes the entry and, only
//!    if the project initialised ACL, calls `aclFinalize` with the table still locked, so no
//!    new session calls `aclInit` while ACL is being finalized. `end` returns the failure of
//!    that `aclFinalize`; a drop logs it. The entry is gone either way: the next session's
//!    `aclInit` finds out again who holds ACL.
//! 5. A key is never reused while its entry lives: every session borrows its [`Cann`] and every
//!    hold owns one, which keeps the library loaded, so no other library can be loaded at that
//!    address meanwhile. A session or hold passed to `mem::forget` never ends: its library's
//!    ACL is then never finalized. A forgotten hold also keeps its library loaded for good; a
//!    library loaded later at the address a forgotten session's library had would count itself
//!    in the stale entry without calling `aclInit`.
//!
//! The table stays locked while `aclInit` or `aclFinalize` runs, so a slow one delays sessions
//! and holds on every library (a device runner's attach and finalize among them). When
//! `aclFinalize` fails, ACL stays initialised and the next session's `aclInit` answers
//! `ACL_ERROR_REPEAT_INITIALIZE`: from then on the project takes ACL for initialised outside it
//! and leaves it initialised.

use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, LoadError};
use crate::generated::types::ACL_ERROR_REPEAT_INITIALIZE;
use crate::loader::{Cann, Library};

/// The sessions and holds of one loaded ACL library.
struct Entry {
    /// The address `aclInit` resolves to in that library.
    key: usize,
    /// Live sessions.
    sessions: usize,
    /// Live holds; `sessions + holds` is at least 1.
    holds: usize,
    /// Whether ACL is initialised for the entry's sessions: a session's `aclInit` answered 0
    /// or `ACL_ERROR_REPEAT_INITIALIZE`, and the entry has not forgotten it since.
    initialised: bool,
    /// Whether that `aclInit` initialised ACL (the last session or hold then finalizes it).
    finalizes: bool,
}

/// Whether a session or a hold counts itself in or out.
#[derive(Clone, Copy)]
enum Lease {
    Session,
    Hold,
}

impl Entry {
    fn count(&mut self, lease: Lease) -> &mut usize {
        match lease {
            Lease::Session => &mut self.sessions,
            Lease::Hold => &mut self.holds,
        }
    }
}

/// Every library with a live session or hold; a handful at most, so a list.
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
    /// A lease on ACL being initialised, shared with every other session and hold of the
    /// process on the same library (see the [lease protocol](crate::session)): a session that
    /// finds ACL not known initialised calls `aclInit`, and the last session or hold to end
    /// calls `aclFinalize` if the project's `aclInit` initialised ACL. An ACL initialised
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
        let at = match sessions.iter().position(|e| e.key == key) {
            Some(at) if sessions[at].initialised => at,
            found => {
                // SAFETY: a null configuration path is allowed (CANN's defaults).
                let code = unsafe { self.aclInit(std::ptr::null()) }?;
                let finalizes = match code {
                    0 => true,
                    ACL_ERROR_REPEAT_INITIALIZE => false,
                    _ => return Err(Error::Acl(self.error("aclInit", code))),
                };
                let at = found.unwrap_or_else(|| new_entry(&mut sessions, key));
                (sessions[at].initialised, sessions[at].finalizes) = (true, finalizes);
                at
            }
        };
        sessions[at].sessions = sessions[at].sessions.saturating_add(1);
        Ok(AclSession { cann: self, key })
    }

    /// A hold on this loader's ACL library: while it lives, no session of the process
    /// finalizes ACL (see the [lease protocol](crate::session)). It calls nothing itself; when
    /// it is the last session or hold of its library to end and a session of the project
    /// initialised ACL, it finalizes ACL.
    ///
    /// # Errors
    ///
    /// [`Error::Load`] when `aclInit` or `aclFinalize` is missing.
    pub fn acl_hold(self: &Arc<Self>) -> Result<AclHold, Error> {
        let key = self.acl_key()?;
        let mut sessions = SESSIONS.lock();
        let at = match sessions.iter().position(|e| e.key == key) {
            Some(at) => at,
            None => new_entry(&mut sessions, key),
        };
        sessions[at].holds = sessions[at].holds.saturating_add(1);
        Ok(AclHold { cann: Arc::clone(self), key, ended: false })
    }

    /// The key of this loader's ACL library, with `aclFinalize` resolved too.
    fn acl_key(&self) -> Result<usize, LoadError> {
        self.resolve(&self.slots.aclFinalize, Library::Acl, "aclFinalize")?;
        let init = self.resolve(&self.slots.aclInit, Library::Acl, "aclInit")?;
        Ok(init as usize)
    }
}

/// Appends an entry of `key` that counts nothing and knows ACL not initialised; its index.
fn new_entry(sessions: &mut Vec<Entry>, key: usize) -> usize {
    sessions.push(Entry { key, sessions: 0, holds: 0, initialised: false, finalizes: false });
    sessions.len() - 1
}

/// Counts a `lease` of `key` out (protocol step 4).
fn release(cann: &Cann, key: usize, lease: Lease) -> Result<(), Error> {
    let mut sessions = SESSIONS.lock();
    // Always found: the session or hold is counted in its entry until now.
    let Some(at) = sessions.iter().position(|e| e.key == key) else { return Ok(()) };
    let entry = &mut sessions[at];
    let count = entry.count(lease);
    *count = count.saturating_sub(1);
    if entry.sessions == 0 && !entry.finalizes {
        entry.initialised = false;
    }
    if entry.sessions + entry.holds > 0 || !sessions.swap_remove(at).finalizes {
        return Ok(());
    }
    // SAFETY: no arguments; the last session or hold ends, so nothing of the project uses ACL
    // any more, and the table stays locked until ACL is finalized.
    let code = unsafe { cann.aclFinalize() }?;
    cann.check("aclFinalize", code).map_err(Error::from)
}

impl AclSession<'_> {
    /// Ends the lease; the last session or hold of its library finalizes ACL if the project
    /// initialised it.
    ///
    /// # Errors
    ///
    /// [`Error::Acl`] (or [`Error::Load`]) when that `aclFinalize` fails. ACL's session ends
    /// all the same: the next lease calls `aclInit` again.
    pub fn end(self) -> Result<(), Error> {
        let session = ManuallyDrop::new(self);
        release(session.cann, session.key, Lease::Session)
    }
}

impl Drop for AclSession<'_> {
    fn drop(&mut self) {
        if let Err(error) = release(self.cann, self.key, Lease::Session) {
            tracing::error!(%error, "the last ACL session could not finalize ACL");
        }
    }
}

/// A hold on a loaded ACL library ([`Cann::acl_hold`]): while it lives, ACL is not finalized
/// by any session of the process. It owns its loader.
///
/// End it with [`AclHold::end`] to see whether the `aclFinalize` it may make fails; a dropped
/// hold logs that failure instead.
#[must_use = "dropping the hold may finalize ACL at once"]
pub struct AclHold {
    cann: Arc<Cann>,
    key: usize,
    /// Counted out by [`AclHold::end`] already: the drop does nothing.
    ended: bool,
}

impl fmt::Debug for AclHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AclHold").field("key", &format_args!("{:#x}", self.key)).finish()
    }
}

/// Which loaded ACL library a hold is on: holds on one library (every loader that opened it)
/// compare equal, holds on distinct copies do not. Stable while the hold lives, which keeps its
/// library loaded; a library loaded later may get the same value.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AclLibrary(usize);

impl fmt::Debug for AclLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AclLibrary({:#x})", self.0)
    }
}

impl AclHold {
    /// The library this hold is on.
    pub fn library(&self) -> AclLibrary {
        AclLibrary(self.key)
    }

    /// Ends the hold; the last session or hold of its library finalizes ACL if a session of
    /// the project initialised it.
    ///
    /// # Errors
    ///
    /// [`Error::Acl`] (or [`Error::Load`]) when that `aclFinalize` fails; the hold ends all the
    /// same.
    pub fn end(mut self) -> Result<(), Error> {
        self.ended = true;
        release(&self.cann, self.key, Lease::Hold)
    }
}

impl Drop for AclHold {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        if let Err(error) = release(&self.cann, self.key, Lease::Hold) {
            tracing::error!(%error, "the last ACL hold could not finalize ACL");
        }
    }
}
