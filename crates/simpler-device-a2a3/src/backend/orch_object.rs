//! The host side of the AICPU program's register entry, shared by every backend that runs the
//! program: stage the orchestration object and an unanswered reply in device memory, have the
//! backend launch the entry on the block, read the reply back (`docs/onboard-programs.md`).

use super::Backend;
use crate::abi::launch::{
    REGISTER_NO_REPLY, REGISTER_OK, RegisterArgs, RegisterFailure, RegisterReply,
};
use crate::error::{CallableProblem, DeviceError, MemPurpose, OrchLoadCause};
use crate::runtime::DeviceOrchestration;

/// What one register call asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RegisterOp<'a> {
    /// Load `object` exporting `entry` and `config`, writing it into `dir` on the AICPU side.
    Load { object: &'a [u8], entry: &'a str, config: &'a str, dir: &'a str },
    /// Close the object kept under the slot.
    Unload,
}

/// A register launch that failed. `may_run`: the entry was launched but not seen to finish,
/// so it may still read the staged object and write the reply.
pub(crate) struct LaunchFailed {
    pub(crate) error: DeviceError,
    pub(crate) may_run: bool,
}

impl From<DeviceError> for LaunchFailed {
    /// A refused launch: nothing runs.
    fn from(error: DeviceError) -> LaunchFailed {
        LaunchFailed { error, may_run: false }
    }
}

/// Runs one register call for `owner`'s `slot` on `dev`: `launch` runs the entry with the
/// block as its argument bytes and returns once the entry finished. The staging buffers are
/// freed when it returns, unless the entry may still be running: then they are abandoned to
/// the device reset ([`Backend::abandon`]).
pub(crate) fn call(
    dev: &dyn Backend,
    (owner, slot): (u32, u32),
    op: RegisterOp<'_>,
    launch: impl FnOnce(&RegisterArgs) -> Result<(), LaunchFailed>,
) -> Result<RegisterReply, DeviceError> {
    let mut staged = Staged { dev, addrs: Vec::new() };
    let reply_addr = staged.put(bytemuck::bytes_of(&RegisterReply::unanswered()))?;
    let args = match op {
        RegisterOp::Load { object, entry, config, dir } => {
            let object_addr = staged.put(object)?;
            RegisterArgs::load(
                (owner, slot),
                (object_addr, object.len() as u64),
                reply_addr,
                entry,
                config,
                dir,
            )
            .ok_or_else(|| DeviceError::InvalidCallable {
                run_id: None,
                problem: CallableProblem::RegistrationNames {
                    entry: entry.to_owned(),
                    config: config.to_owned(),
                    dir: dir.to_owned(),
                },
            })?
        }
        RegisterOp::Unload => RegisterArgs::unload((owner, slot), reply_addr),
    };
    if let Err(LaunchFailed { error, may_run }) = launch(&args) {
        if may_run {
            for addr in staged.addrs.drain(..) {
                dev.abandon(addr);
            }
        }
        return Err(error);
    }
    let mut reply = RegisterReply::unanswered();
    dev.read(reply_addr, bytemuck::bytes_of_mut(&mut reply))?;
    Ok(reply)
}

/// The loaded orchestration a reply names, or the typed refusal naming `slot` and `entry`.
pub(crate) fn loaded(
    slot: u32,
    entry: &str,
    reply: &RegisterReply,
) -> Result<DeviceOrchestration, DeviceError> {
    let refuse = |failure: Option<RegisterFailure>, cause| {
        Err(DeviceError::OrchestrationLoad { slot, entry: entry.to_owned(), failure, cause })
    };
    match reply.status {
        REGISTER_OK if reply.entry != 0 && reply.config != 0 => {
            Ok(DeviceOrchestration { entry: reply.entry, config: reply.config })
        }
        REGISTER_OK => refuse(None, OrchLoadCause::NoAddress),
        REGISTER_NO_REPLY => refuse(None, OrchLoadCause::NoReply),
        status => match RegisterFailure::from_raw(status) {
            Some(f) => refuse(Some(f), OrchLoadCause::Refused { text: reply.message() }),
            None => refuse(None, OrchLoadCause::UnknownStatus { status, text: reply.message() }),
        },
    }
}

/// Device buffers of one register call, freed on drop.
struct Staged<'a> {
    dev: &'a dyn Backend,
    addrs: Vec<u64>,
}

impl Staged<'_> {
    /// Copies `bytes` into a fresh device buffer; its address.
    fn put(&mut self, bytes: &[u8]) -> Result<u64, DeviceError> {
        let len = bytes.len() as u64;
        let addr = self
            .dev
            .malloc(len, MemPurpose::Runtime)
            .map_err(|f| crate::runner::oom(None, len, MemPurpose::Runtime, f))?;
        self.addrs.push(addr);
        self.dev.write(addr, bytes).map(|()| addr)
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        for &a in &self.addrs {
            self.dev.free(a);
        }
    }
}
