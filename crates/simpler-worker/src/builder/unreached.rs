//! Remote ranks a start never reached: each is told so (`Refuse` of no session), whether the
//! start failed or unwound before reaching it, so that no serving rank waits for a session that
//! never opens (`docs/multi-host.md`, "Session", step 3).

use super::ChildSpec;
use crate::error::StartError;
#[cfg(feature = "mpi")]
use crate::remote::RemoteL3;

/// Tells every remote L3 rank among `specs` (and their subtrees) that the start failed before
/// reaching it (`e`), so that no serving rank waits for a session that never opens.
/// Each rank once: a second `Refuse` would be left over for that rank's next session.
pub(super) fn refuse_unreached(specs: impl IntoIterator<Item = ChildSpec>, e: &StartError) {
    refuse_unreached_because(specs, || {
        format!("rank 0's start failed before reaching this rank: {e}")
    });
}

/// [`refuse_unreached`] with the reason the ranks are given.
fn refuse_unreached_because(
    specs: impl IntoIterator<Item = ChildSpec>,
    reason: impl FnOnce() -> String,
) {
    #[cfg(feature = "mpi")]
    {
        let specs: Vec<ChildSpec> = specs.into_iter().collect();
        let mut unreached = Vec::new();
        remote_children(&specs, &mut unreached);
        if unreached.is_empty() {
            return;
        }
        let reason = reason();
        let mut refused = std::collections::BTreeSet::new();
        for r in unreached.iter().filter(|r| refused.insert(r.rank())) {
            r.refuse_unreached(&reason);
        }
    }
    #[cfg(not(feature = "mpi"))]
    let _ = (specs.into_iter(), reason);
}

/// The children a start has yet to reach. Should the start unwind (a child's start panicked),
/// the remote ranks among them are refused as a failed start refuses them, rather than left
/// waiting for a session that never opens.
pub(super) struct Unreached(pub(super) std::iter::Enumerate<std::vec::IntoIter<ChildSpec>>);

impl Drop for Unreached {
    fn drop(&mut self) {
        if std::thread::panicking() {
            refuse_unreached_because(self.0.by_ref().map(|(_, s)| s), || {
                "rank 0's start panicked before reaching this rank".to_owned()
            });
        }
    }
}

/// The remote L3 children among `specs` and their subtrees, in order.
#[cfg(feature = "mpi")]
pub(super) fn remote_children<'a>(specs: &'a [ChildSpec], out: &mut Vec<&'a RemoteL3>) {
    for spec in specs {
        match spec {
            ChildSpec::Remote(r) => out.push(r),
            ChildSpec::Composite(c) => remote_children(&c.children, out),
            ChildSpec::Host(_) => {}
        }
    }
}
