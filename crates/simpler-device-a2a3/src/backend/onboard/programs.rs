//! Registering the device programs of a manifest (ensure_initialized step 2): the bootstrap
//! that installs the AICPU program on the device, the op description CANN loads it from, its
//! entries, and the AICore executor (registered once per runner, unregistered at its finalize).

use std::ffi::{CString, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use simpler_acl_sys::Error as CannError;
use simpler_acl_sys::types::{
    KERNEL_TYPE_AICPU_KFC, RT_DEV_BINARY_MAGIC_ELF, rtAicpuArgsEx_t, rtDevBinary_t, rtFuncHandle,
};
use simpler_onboard_programs::{DeviceArgs, fingerprint, installed_name, kernel_args_bytes};

use super::acl;
use super::manifest::Programs;
use super::owners::{CpuBinary, Ctx, DeviceBuffer, Stream};
use crate::error::InitFailure;
use crate::options::RuntimeVariant;
use crate::{DeviceError, InitStep};

/// The AICPU program's C entries.
const ENTRY_INIT: &str = "simpler_aicpu_init";
const ENTRY_EXEC: &str = "simpler_aicpu_exec";
const ENTRY_REGISTER: &str = "simpler_aicpu_register_callable";

/// The op CANN's AICPU framework runs the dispatcher's init entry through.
const BOOTSTRAP_OP: &std::ffi::CStr = c"AST_DYN_AICPU";
const BOOTSTRAP_SO: &str = "libaicpu_extend_kernels.so";
const BOOTSTRAP_KERNEL: &str = "DynTileFwkKernelServerInit";

/// A process-wide counter that keeps the op-description files of concurrent runners apart.
static DESCRIPTIONS: AtomicU64 = AtomicU64::new(0);

/// The loaded programs of one runner.
#[derive(Debug)]
pub(crate) struct Loaded {
    /// Unloaded on drop.
    _binary: CpuBinary,
    pub(crate) init: rtFuncHandle,
    pub(crate) exec: rtFuncHandle,
    /// The trb callable-registration entry. Resolved at init so that a program lacking it is
    /// refused there; launched by callable registration once trb runs onboard.
    #[allow(dead_code)]
    pub(crate) register: Option<rtFuncHandle>,
    /// The op description CANN loaded the program from.
    _description: OpDescription,
}

// SAFETY: function handles are opaque tokens CANN accepts from any bound thread.
unsafe impl Send for Loaded {}

/// An op-description file in the temporary directory, removed when dropped: once the program
/// is unloaded, or as soon as a load that wrote it fails.
#[derive(Debug)]
struct OpDescription {
    path: PathBuf,
    /// `path` as CANN takes it.
    c_path: CString,
}

impl OpDescription {
    /// Writes `text` to a file of its own in `dir` (the fingerprint, the process and a counter
    /// keep concurrent runners' files apart).
    fn write(dir: &Path, fp: u64, text: &str) -> Result<OpDescription, DeviceError> {
        let n = DESCRIPTIONS.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("simpler_inner_{fp:016x}_{}_{n}.json", std::process::id()));
        let refuse =
            |failure| DeviceError::Init { run_id: None, step: InitStep::LoadPrograms, failure };
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| refuse(InitFailure::OpDescriptionPath { path: path.clone() }))?;
        if let Err(source) = std::fs::write(&path, text) {
            // A write that failed part way may have left the file.
            let _ = std::fs::remove_file(&path);
            return Err(refuse(InitFailure::OpDescription { path, source }));
        }
        Ok(OpDescription { path, c_path })
    }
}

impl Drop for OpDescription {
    fn drop(&mut self) {
        // Best effort: a leftover file in the temporary directory harms nothing.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The AICore executor's registration (`rtRegisterAllKernel` / `rtDevBinaryUnRegister`), kept
/// for the runner's life. Dropping it unregisters the executor and frees its image. On a device
/// left to its force reset (a launch may still be running the executor) nothing is
/// unregistered: the registration stays, and the image with it, since CANN may read it for as
/// long as the registration lives. So does a registration whose unregister CANN refuses.
#[derive(Debug)]
pub(crate) struct AicoreBinary {
    ctx: Arc<Ctx>,
    pub(crate) handle: *mut c_void,
    image: Vec<u8>,
}

// SAFETY: an opaque handle CANN accepts from any bound thread; the image is only read by CANN.
unsafe impl Send for AicoreBinary {}

impl Drop for AicoreBinary {
    fn drop(&mut self) {
        let image = std::mem::take(&mut self.image);
        let (ctx, handle) = (&self.ctx, self.handle);
        let unregistered = !ctx.is_poisoned()
            // SAFETY: `handle` is this owner's live registration; it is unregistered once.
            && ctx.release("rtDevBinaryUnRegister", || unsafe {
                ctx.cann.rtDevBinaryUnRegister(handle)
            });
        if !unregistered {
            image.leak();
        }
    }
}

/// Registers the AICore executor ELF (`rtRegisterAllKernel`, magic ELF, version 0).
pub(crate) fn register_aicore(ctx: &Arc<Ctx>, image: Vec<u8>) -> Result<AicoreBinary, CannError> {
    let bin = rtDevBinary_t {
        magic: RT_DEV_BINARY_MAGIC_ELF,
        version: 0,
        data: image.as_ptr().cast(),
        length: image.len() as u64,
    };
    let mut handle: *mut c_void = std::ptr::null_mut();
    // SAFETY: `bin` points at `image`, alive for the call (and, moved into the owner, for as
    // long as the registration lives); `handle` is a valid out-pointer.
    let ret = unsafe { ctx.cann.rtRegisterAllKernel(&bin, &mut handle) };
    ctx.check("rtRegisterAllKernel", ret)?;
    Ok(AicoreBinary { ctx: Arc::clone(ctx), handle, image })
}

/// Installs the AICPU program through the dispatcher, waits at most `sync_ms` for it, then
/// loads the op description and resolves the entries. A failed CANN call is a
/// [`DeviceError::Acl`] of the `LoadPrograms` step; an op description that cannot be written is a
/// [`DeviceError::Init`] of that step.
pub(crate) fn load_aicpu(
    ctx: &Arc<Ctx>,
    aicpu: &Stream,
    programs: &Programs,
    runtime: RuntimeVariant,
    sync_ms: i32,
) -> Result<Loaded, DeviceError> {
    let cann = |e| acl(Some(InitStep::LoadPrograms), e);
    let fp = fingerprint(&programs.aicpu_program);
    bootstrap(ctx, aicpu, programs, sync_ms).map_err(cann)?;
    let mut entries = vec![ENTRY_INIT, ENTRY_EXEC];
    if runtime == RuntimeVariant::TensormapAndRingbuffer {
        entries.push(ENTRY_REGISTER);
    }
    let so = installed_name(fp, ctx.device as u64);
    let ops: Vec<serde_json::Value> = entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "opType": op_type(e, fp),
                "functionName": e,
                "kernelSo": so,
                "opKernelLib": "AICPUKernel",
            })
        })
        .collect();
    let description = OpDescription::write(
        &std::env::temp_dir(),
        fp,
        &serde_json::json!({ "ops": ops }).to_string(),
    )?;
    let binary = CpuBinary::load(ctx, &description.c_path).map_err(cann)?;
    let func = |e: &str| {
        let name = CString::new(op_type(e, fp)).map_err(|_| DeviceError::Init {
            run_id: None,
            step: InitStep::LoadPrograms,
            failure: InitFailure::EntryName { name: e.to_owned() },
        })?;
        binary.function(&name).map_err(cann)
    };
    let init = func(ENTRY_INIT)?;
    let exec = func(ENTRY_EXEC)?;
    let register = if entries.len() > 2 { Some(func(ENTRY_REGISTER)?) } else { None };
    Ok(Loaded { _binary: binary, init, exec, register, _description: description })
}

fn op_type(entry: &str, fp: u64) -> String {
    format!("{entry}_{fp:016x}")
}

/// Uploads dispatcher and program, writes their `DeviceArgs`, launches the framework's init
/// kernel on one AICPU and waits for it. The buffers are freed when it returns, unless the
/// wait failed: the kernel may still read them, so they are left to the device reset.
fn bootstrap(
    ctx: &Arc<Ctx>,
    aicpu: &Stream,
    programs: &Programs,
    sync_ms: i32,
) -> Result<(), CannError> {
    let dispatcher = DeviceBuffer::upload(ctx, &programs.dispatcher)?;
    let program = DeviceBuffer::upload(ctx, &programs.aicpu_program)?;
    let device_args = DeviceArgs {
        dispatcher: (dispatcher.addr(), programs.dispatcher.len() as u64),
        device_id: ctx.device as u64,
        program: (program.addr(), programs.aicpu_program.len() as u64),
    };
    let args_buf = DeviceBuffer::upload(ctx, &device_args.to_bytes())?;
    // The host argument block: the framework's kernel arguments, then the two names it reads
    // at the offsets given in the descriptor.
    let mut block = kernel_args_bytes(args_buf.addr()).to_vec();
    let so_offset = block.len() as u32;
    block.extend_from_slice(BOOTSTRAP_SO.as_bytes());
    block.push(0);
    let kernel_offset = block.len() as u32;
    block.extend_from_slice(BOOTSTRAP_KERNEL.as_bytes());
    block.push(0);
    let args = rtAicpuArgsEx_t {
        args: block.as_mut_ptr().cast(),
        hostInputInfoPtr: std::ptr::null_mut(),
        kernelOffsetInfoPtr: std::ptr::null_mut(),
        argsSize: block.len() as u32,
        hostInputInfoNum: 0,
        kernelOffsetInfoNum: 0,
        soNameAddrOffset: so_offset,
        kernelNameAddrOffset: kernel_offset,
        isNoNeedH2DCopy: false,
        timeout: 0,
        reserved: 0,
    };
    // SAFETY: the op name is NUL-terminated, `args` points at `block`, alive for the call (CANN
    // copies it); the stream is live; smDesc is null as the original.
    let ret = unsafe {
        ctx.cann.rtAicpuKernelLaunchExWithArgs(
            KERNEL_TYPE_AICPU_KFC,
            BOOTSTRAP_OP.as_ptr(),
            1,
            &args,
            std::ptr::null_mut(),
            aicpu.raw(),
            0,
        )
    };
    ctx.check("rtAicpuKernelLaunchExWithArgs", ret)?;
    let waited = wait_setup(ctx, aicpu, sync_ms);
    if waited.is_err() {
        std::mem::forget((dispatcher, program, args_buf));
    }
    waited
}

/// The wait for a setup kernel just launched on `stream` (the bootstrap, the init or the
/// register entry). A failed wait leaves the kernel running or the device in an unknown
/// state, so finalize must force-reset.
pub(crate) fn wait_setup(ctx: &Ctx, stream: &Stream, ms: i32) -> Result<(), CannError> {
    sync(ctx, stream, ms).inspect_err(|_| ctx.poison())
}

/// `aclrtSynchronizeStreamWithTimeout` of `stream` with `ms`.
pub(crate) fn sync(ctx: &Ctx, stream: &Stream, ms: i32) -> Result<(), CannError> {
    // SAFETY: live stream.
    let ret = unsafe { ctx.cann.aclrtSynchronizeStreamWithTimeout(stream.raw(), ms) };
    ctx.check("aclrtSynchronizeStreamWithTimeout", ret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_op_description_that_cannot_be_written_is_an_init_failure_naming_the_file() {
        let missing = std::env::temp_dir().join("simpler-no-such-directory").join("below");
        let err = OpDescription::write(&missing, 7, "{}").unwrap_err();
        match err {
            DeviceError::Init {
                step: InitStep::LoadPrograms,
                failure: InitFailure::OpDescription { path, source },
                run_id: None,
            } => {
                assert!(path.starts_with(&missing), "{path:?}");
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_op_description_is_removed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let written = OpDescription::write(dir.path(), 7, "{}").unwrap();
        let path = written.path.clone();
        assert!(path.exists());
        drop(written);
        assert!(!path.exists());
    }
}
