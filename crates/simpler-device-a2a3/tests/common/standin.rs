//! The onboard backend's fixture for tests against the stand-in CANN library: a fake install
//! with a manifest of placeholder device programs, runner options pointing at them, and
//! helpers over the stand-in's call log.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use simpler_acl_sys::standin::{Call, FakeInstall, ObjectKind};
use simpler_device_a2a3::programs::add;
use simpler_device_a2a3::{
    ArgDirection, ChipCallable, CoreCallable, DevicePtr, DeviceRunner, KernelCode, Orchestration,
    OrchestrationObject, RunnerOptions, RuntimeVariant,
};
use simpler_types::TaskArgs;

use super::upload_f32;

/// The stream-sync budget of the fixture's options, in ms.
pub const STREAM_SYNC_MS: i64 = 3_000;

/// Placeholder device programs (bytes that look like ELF files) and a manifest naming them:
/// what the stand-in accepts, since it checks only the binary descriptor.
pub fn placeholder_programs() -> std::io::Result<(tempfile::TempDir, PathBuf)> {
    let dir = tempfile::tempdir()?;
    for (name, bytes) in [
        ("libsimpler_aicpu_hbg.so", &b"\x7fELF placeholder AICPU program"[..]),
        ("libsimpler_aicpu_dispatcher.so", b"\x7fELF placeholder dispatcher"),
        ("aicore_hbg.o", b"\x7fELF placeholder AICore executor"),
    ] {
        std::fs::write(dir.path().join(name), bytes)?;
    }
    let manifest = dir.path().join("manifest.json");
    let abi = simpler_device_a2a3::abi::ABI_VERSION;
    std::fs::write(
        &manifest,
        format!(
            r#"{{ "abi_version": {abi}, "artifacts": {{
                "aicpu_program": {{ "path": "libsimpler_aicpu_hbg.so" }},
                "dispatcher": {{ "path": "libsimpler_aicpu_dispatcher.so" }},
                "aicore_executor": {{ "path": "aicore_hbg.o" }} }} }}"#
        ),
    )?;
    Ok((dir, manifest))
}

/// A fake CANN install and a manifest of placeholder device programs.
pub struct Onboard {
    pub install: FakeInstall,
    _programs: tempfile::TempDir,
    pub manifest: PathBuf,
}

impl Onboard {
    pub fn new() -> Onboard {
        Onboard::from_install(FakeInstall::standard().unwrap())
    }

    pub fn from_install(install: FakeInstall) -> Onboard {
        if install.live(ObjectKind::Streams).is_ok() {
            install.set_value("device_count", 8).unwrap();
        }
        let (dir, manifest) = placeholder_programs().unwrap();
        Onboard { install, _programs: dir, manifest }
    }

    pub fn log(&self) -> Vec<Call> {
        self.install.take_log().unwrap()
    }

    pub fn live(&self) -> [usize; 5] {
        [
            ObjectKind::Streams,
            ObjectKind::Events,
            ObjectKind::Allocations,
            ObjectKind::Mappings,
            ObjectKind::CpuBinaries,
        ]
        .map(|k| self.install.live(k).unwrap())
    }
}

impl Onboard {
    /// The bench's options for host_build_graph.
    pub fn options(&self, device: u32) -> RunnerOptions {
        self.options_on(device, RuntimeVariant::HostBuildGraph)
    }

    /// The bench's options under `runtime`.
    pub fn options_on(&self, device: u32, runtime: RuntimeVariant) -> RunnerOptions {
        RunnerOptions::onboard(device, runtime)
            .with_onboard_manifest(&self.manifest)
            .with_cann(Arc::new(self.install.cann()))
            .with_scheduler_timeout(Duration::from_millis(300))
            .with_op_execute_timeout(Duration::from_micros(600_000))
            .with_stream_sync_timeout(Duration::from_millis(STREAM_SYNC_MS as u64))
    }
}

/// The one-task `f = a + b` program with a placeholder AICore kernel (the stand-in runs no
/// device code).
pub fn add_callable() -> ChipCallable {
    add_callable_with(add::orchestration, "add")
}

/// [`add_callable`] with another `orchestration` of the same task, named `name` (its config
/// `add_config`).
pub fn add_callable_with(
    orchestration: simpler_device_a2a3::NativeOrchFn,
    name: &str,
) -> ChipCallable {
    use ArgDirection::{In, Out};
    ChipCallable::native(orchestration, super::three_args)
        .names(name, "add_config")
        .signature(vec![In, In, Out])
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(add::ADD, unsafe {
            CoreCallable::new(vec![In, In, Out], KernelCode::Text(vec![0; 64]))
        })
        .build()
        .unwrap()
}

/// `f = a + b` with a placeholder orchestration object and kernel text: the stand-in plays the
/// register entry and executes nothing.
pub fn add_object_callable() -> ChipCallable {
    use ArgDirection::{In, Out};
    // SAFETY: the stand-in never loads or runs the bytes.
    let object = unsafe {
        OrchestrationObject::new(b"\x7fELF placeholder orchestration".to_vec(), "add", "add_config")
    };
    ChipCallable::builder(Orchestration::DeviceObject(object))
        .signature(vec![In, In, Out])
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(add::ADD, unsafe {
            CoreCallable::new(vec![In, In, Out], KernelCode::Text(vec![0; 64]))
        })
        .build()
        .unwrap()
}

/// Device buffers and arguments of one `f = a + b` run.
pub struct AddRun {
    pub ptrs: [DevicePtr; 3],
    pub args: TaskArgs,
}

impl AddRun {
    pub fn new(r: &mut DeviceRunner) -> AddRun {
        let (pa, ta) = upload_f32(r, &[1.0; 64]);
        let (pb, tb) = upload_f32(r, &[2.0; 64]);
        let (pf, tf) = upload_f32(r, &[0.0; 64]);
        let mut args = TaskArgs::new();
        args.add_input(ta).unwrap().add_input(tb).unwrap().add_output(tf).unwrap();
        AddRun { ptrs: [pa, pb, pf], args }
    }

    pub fn output(&self, r: &mut DeviceRunner) -> Vec<f32> {
        let mut bytes = vec![0u8; 64 * 4];
        r.copy_from_device(&mut bytes, self.ptrs[2]).unwrap();
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    pub fn free(self, r: &mut DeviceRunner) {
        for p in self.ptrs {
            r.free(p).unwrap();
        }
    }
}

pub fn names(log: &[Call]) -> Vec<&str> {
    log.iter().map(|c| c.func.as_str()).collect()
}

/// Each call with its return code, for a failure message.
pub fn codes(log: &[Call]) -> Vec<(&str, i64)> {
    log.iter().map(|c| (c.func.as_str(), c.ret)).collect()
}

pub fn position(log: &[Call], func: &str) -> usize {
    log.iter()
        .position(|c| c.func == func)
        .unwrap_or_else(|| panic!("no {func} in {:?}", names(log)))
}

pub fn count(log: &[Call], func: &str) -> usize {
    log.iter().filter(|c| c.func == func).count()
}
