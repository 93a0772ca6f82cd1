//! What device queueing needs of CANN: the runner's event handle (destroyed in its runner's
//! context) and the optional functions attach requires when queueing is on.

use std::mem::ManuallyDrop;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::owners::Event;
use super::reset::{self, Binds};
use crate::abi::codes::AclCode;
use crate::backend::{EventState, StreamFault};

/// An event as the runner keeps it. CANN destroys an event in the calling thread's context,
/// so dropping it binds the thread for its runner first; an event that cannot be destroyed in
/// its context is left to the device's reset.
#[derive(Debug)]
pub(super) struct OnboardEvent {
    pub(super) event: ManuallyDrop<Event>,
    pub(super) binds: Weak<Mutex<Binds>>,
}

impl Drop for OnboardEvent {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used again.
        let event = unsafe { ManuallyDrop::take(&mut self.event) };
        let ctx = Arc::clone(event.ctx());
        let mut event = Some(event);
        reset::release_in_context(&ctx, &self.binds, || drop(event.take()));
        // Not destroyed in its context: left to the device's reset.
        if let Some(event) = event {
            event.disown();
        }
    }
}

impl EventState for OnboardEvent {
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

/// What a call given an event another backend recorded answers.
pub(super) fn foreign_event() -> StreamFault {
    StreamFault::new(AclCode::INTERNAL_ERROR, "the event was not recorded by this device")
}

/// The functions device queueing calls that CANN may lack (events, and a stream that stops at
/// its first failed task).
pub(super) const QUEUE_FUNCTIONS: [&str; 7] = [
    "aclrtCreateEvent",
    "aclrtDestroyEvent",
    "aclrtRecordEvent",
    "aclrtQueryEventStatus",
    "aclrtSynchronizeEventWithTimeout",
    "aclrtStreamWaitEvent",
    "aclrtSetStreamFailureMode",
];
