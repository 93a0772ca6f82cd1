//! One onboard runner per device of a loaded CANN at a time.
//!
//! A poisoned runner's finalize force-resets its device (`aclrtResetDeviceForce`), which
//! releases everything the process holds on that device: a second runner attached to the same
//! device would keep streams, programs and memory CANN freed under it, and could free an
//! address CANN has since handed to someone else. So an attach claims its device for the
//! runner's life and a second attach to a claimed device is refused; the claim ends after the
//! runner's last device reset. Two copies of CANN (stand-in installs) have devices of their
//! own, as each has its own state.

use parking_lot::Mutex;
use simpler_acl_sys::AclLibrary;

/// Devices with an attached runner, per loaded ACL library; a handful at most, so a list.
static CLAIMED: Mutex<Vec<(AclLibrary, i32)>> = Mutex::new(Vec::new());

/// A device claimed by one runner; dropping it ends the claim.
#[derive(Debug)]
pub(super) struct DeviceClaim {
    library: AclLibrary,
    device: i32,
}

impl DeviceClaim {
    /// Claims `device` of `library`; `None` while another runner holds it.
    pub(super) fn take(library: AclLibrary, device: i32) -> Option<DeviceClaim> {
        let mut claimed = CLAIMED.lock();
        if claimed.contains(&(library, device)) {
            return None;
        }
        claimed.push((library, device));
        Some(DeviceClaim { library, device })
    }
}

impl Drop for DeviceClaim {
    fn drop(&mut self) {
        let mut claimed = CLAIMED.lock();
        if let Some(at) = claimed.iter().position(|&c| c == (self.library, self.device)) {
            claimed.swap_remove(at);
        }
    }
}
