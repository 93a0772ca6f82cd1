//! `DeviceObject` orchestrations on the simulated AICPU side (tensormap_and_ringbuffer).
//!
//! With the built AICPU program (`SimOptions::aicpu_program`) the object goes through the
//! program's register entry, exactly as onboard: staged in device memory, written into a
//! directory, loaded and resolved by the program, which keeps it under the slot until the
//! unload call. Without it the simulator loads the object itself and keeps it with the
//! callable's code. Either way the object must be built for this host, and the orchestration
//! thread calls its C entry over the ops table.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::SimDevice;
use super::loader::SharedObject;
use crate::backend::LoadedCode;
use crate::backend::orch_object::{self, RegisterOp};
use crate::error::{DeviceError, OrchLoadCause};
use crate::runtime::DeviceOrchestration;

/// Distinguishes the object directories and files of the simulated devices of one process.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// The simulated AICPU filesystem's directory for orchestration objects: one per device,
/// created on first use and removed with the device.
/// Its number is also the device's owner id in the register calls, so the runners of one
/// process, which share one loaded program, keep their slots apart.
#[derive(Debug)]
pub(crate) struct ObjectDir {
    path: PathBuf,
    owner: u32,
}

impl ObjectDir {
    pub(crate) fn new(device_id: u32) -> ObjectDir {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("simpler-sim-orch-{}-{device_id}-{n}", std::process::id());
        ObjectDir { path: std::env::temp_dir().join(name), owner: n as u32 }
    }
}

impl Drop for ObjectDir {
    fn drop(&mut self) {
        // Loaded objects stay mapped after their files are gone.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Loads `object` under `slot`: through the program's register entry when the device runs the
/// built program, by the simulator's own loader otherwise.
pub(super) fn load(
    dev: &SimDevice,
    slot: u32,
    object: &[u8],
    entry: &str,
    config: &str,
) -> Result<(DeviceOrchestration, Option<LoadedCode>), DeviceError> {
    let dir = &dev.orch_dir.path;
    let Some(program) = dev.shared.program.get() else {
        return load_here(dir, slot, object, entry, config);
    };
    let dir_text = dir.to_str().ok_or_else(|| DeviceError::OrchestrationLoad {
        slot,
        entry: entry.to_owned(),
        failure: None,
        cause: OrchLoadCause::DirNotUtf8 { dir: dir.clone() },
    })?;
    let op = RegisterOp::Load { object, entry, config, dir: dir_text };
    let reply = orch_object::call(dev, (dev.orch_dir.owner, slot), op, |args| {
        match program.register(args) {
            Some(_) => Ok(()),
            None => Err(DeviceError::OrchestrationLoad {
                slot,
                entry: entry.to_owned(),
                failure: None,
                cause: OrchLoadCause::NoRegisterEntry,
            }
            .into()),
        }
    })?;
    Ok((orch_object::loaded(slot, entry, &reply)?, None))
}

/// Closes the object the program keeps under `slot` (nothing to do for one the simulator
/// loaded itself: dropping the callable's code closes it).
pub(super) fn unload(dev: &SimDevice, slot: u32) {
    let Some(program) = dev.shared.program.get() else { return };
    let reply = orch_object::call(dev, (dev.orch_dir.owner, slot), RegisterOp::Unload, |args| {
        program.register(args);
        Ok(())
    });
    match reply {
        Ok(r) if r.status == crate::abi::launch::REGISTER_OK => {}
        Ok(r) => {
            tracing::warn!(slot, status = r.status, message = %r.message(), "closing an orchestration object failed")
        }
        Err(e) => tracing::warn!(slot, error = %e, "closing an orchestration object failed"),
    }
}

/// The simulator's own load: the object written to a file of its own, opened, resolved, and
/// the file removed (the mapping stays).
fn load_here(
    dir: &std::path::Path,
    slot: u32,
    object: &[u8],
    entry: &str,
    config: &str,
) -> Result<(DeviceOrchestration, Option<LoadedCode>), DeviceError> {
    let refuse = |failure, cause| DeviceError::OrchestrationLoad {
        slot,
        entry: entry.to_owned(),
        failure: Some(failure),
        cause,
    };
    use crate::abi::launch::RegisterFailure::{Load, Symbol, Write};
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("orch_{slot}_{n}.so"));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, object))
        .map_err(|source| refuse(Write, OrchLoadCause::Write { path: path.clone(), source }))?;
    // SAFETY: `OrchestrationObject::new`'s contract: the object's initializers may run in this
    // process and its symbols have the orchestration ABI.
    let opened = unsafe { SharedObject::open(&path) };
    let _ = std::fs::remove_file(&path);
    let obj = opened.map_err(|e| refuse(Load, OrchLoadCause::Object(Box::new(e))))?;
    let symbol = |e| refuse(Symbol, OrchLoadCause::Object(Box::new(e)));
    let entry_addr = obj.symbol(entry).map_err(symbol)? as u64;
    let config_addr = obj.symbol(config).map_err(symbol)? as u64;
    let loaded = DeviceOrchestration { entry: entry_addr, config: config_addr };
    Ok((loaded, Some(LoadedCode::new(obj))))
}
