//! `simpler-aicpu-program` — the AICPU program of an Ascend A2/A3 chip, as a shared object.
//!
//! It is a `cdylib` with no Rust API: nothing here is meant to be called from Rust; it is built
//! and loaded as a file, and its C entries below are the whole interface.
//!
//! Layer: a leaf above `simpler-device-a2a3` (feature `aicpu-program`): the device crate's
//! AICPU scheduler behind the C entries the onboard loader resolves. Nothing here but the
//! entries; `docs/onboard-programs.md` describes the launches that call them, how the program is
//! built (`cargo xtask build --platform a2a3`, profile `aicpu-program`: `panic = "abort"`, a GNU
//! build id) and how the simulator loads the host build of this very object to test it.
//!
//! Entries (each receives the launch's argument bytes):
//! - `simpler_aicpu_init`: the runner's `InitArgs`; 0 or a non-zero refusal (ABI mismatch).
//! - `simpler_aicpu_exec`: the device address of the run's `KernelArgs`; the scheduler's exec
//!   result.
//! - `simpler_aicpu_register_callable`: a `RegisterArgs` block (tensormap_and_ringbuffer: load
//!   or close a `DeviceObject` orchestration under a callable slot); the reply goes to device
//!   memory the block names.
//! - `simpler_aicpu_abi_version`: the ABI version this object speaks (the loader checks it).
//!
//! Unsafe inventory:
//! - `src/lib.rs`: the C entries are `unsafe extern "C"` functions forwarding raw argument
//!   pointers to the device crate's entries, whose contracts they restate.

use core::ffi::c_void;

/// The init entry.
///
/// # Safety
///
/// `args` points at the launch's `InitArgs` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn simpler_aicpu_init(args: *const c_void) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { simpler_device_a2a3::aicpu::program::init_entry(args.cast()) }
}

/// The exec entry, run by every AICPU thread of a launch.
///
/// # Safety
///
/// `args` points at the launch's argument bytes: the device address of its `KernelArgs`, whose
/// image, register table and windows are valid for the launch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn simpler_aicpu_exec(args: *const c_void) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { simpler_device_a2a3::aicpu::program::exec_entry(args.cast()) }
}

/// The register entry (tensormap_and_ringbuffer): loads or closes a `DeviceObject`
/// orchestration under a callable slot and writes the reply the host reads back.
///
/// # Safety
///
/// `args` points at the launch's `RegisterArgs` bytes, whose reply block and object range are
/// valid device memory for the launch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn simpler_aicpu_register_callable(args: *const c_void) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { simpler_device_a2a3::aicpu::program::register_entry(args.cast()) }
}

/// The ABI version of the layouts this object was built against.
#[unsafe(no_mangle)]
pub extern "C" fn simpler_aicpu_abi_version() -> u32 {
    simpler_device_a2a3::abi::ABI_VERSION
}
