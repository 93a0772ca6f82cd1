//! The onboard case set (`harness = false`): one process runs every case of one device and one
//! runtime in sequence with one reused runner, fault-injection cases last, and reports each case
//! as a JSON line on stdout (`cargo xtask onboard-test` reads them, enforces the limits and
//! writes the summary; `docs/onboard-programs.md`).
//!
//! Environment:
//! - `SIMPLER_ONBOARD_TEST_DEVICE` (default 0), `SIMPLER_ONBOARD_TEST_RUNTIME` (`hbg`, `trb`).
//! - `SIMPLER_ONBOARD_TEST_OUT`: the directory of per-case output directories (default: a
//!   temporary one).
//! - `SIMPLER_ONBOARD_TEST_STANDIN=0` runs on the real chip through CANN; anything else (and
//!   the default) runs against the stand-in CANN library, with the manifest from
//!   `SIMPLER_ONBOARD_ARTIFACTS` or, without it, placeholder programs (what `cargo test` does).
//! - `SIMPLER_ONBOARD_TEST_HANG_CASE=<case>`: that case never returns (to test the limits).
//! - The budgets come from `SIMPLER_SCHEDULER_TIMEOUT_MS`, `SIMPLER_OP_EXECUTE_TIMEOUT_US` and
//!   `SIMPLER_STREAM_SYNC_TIMEOUT_MS`, validated as a set before the first case.
//!
//! Exit code: 0 when every case passed or was skipped, 1 otherwise, 2 when the set cannot start
//! (invalid budgets, no stand-in library, bad environment).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use simpler_acl_sys::standin::{Call, FakeInstall};
use simpler_device_a2a3::programs::add;
use simpler_device_a2a3::{
    ArgDirection, ChipCallable, CoreCallable, DeviceError, DeviceRunner, KernelCode, OrchArgs,
    OrchConfig, RunRequest, RunnerOptions, RuntimeVariant,
};
use simpler_types::{CallConfig, DataType, RunId, TaskArgs, Tensor};

/// How a case ended.
enum Outcome {
    Passed(String),
    Failed(DeviceError),
    FailedCheck(String),
    Skipped(String),
}

/// Everything a case may use.
struct Bench {
    device: u32,
    runtime: RuntimeVariant,
    /// The stand-in install (`None` on a real chip).
    standin: Option<FakeInstall>,
    manifest: PathBuf,
    /// Keeps placeholder programs alive.
    _placeholders: Option<tempfile::TempDir>,
    runner: Option<DeviceRunner>,
    next_run: u64,
    /// Every stand-in call taken from its log so far (the log hands out each call once).
    seen: Vec<Call>,
}

impl Bench {
    fn options(&self) -> RunnerOptions {
        let o = RunnerOptions::onboard(self.device, self.runtime)
            .with_onboard_manifest(&self.manifest)
            .with_env_overrides();
        match &self.standin {
            Some(install) => o.with_cann(Arc::new(install.cann())),
            None => o,
        }
    }

    fn runner(&mut self) -> Result<&mut DeviceRunner, DeviceError> {
        if self.runner.is_none() {
            self.runner = Some(DeviceRunner::attach(self.options())?);
        }
        Ok(self.runner.as_mut().expect("attached above"))
    }

    /// The stand-in calls since the previous `new_calls`, also kept in `seen`.
    fn new_calls(&mut self) -> Vec<Call> {
        let fresh = self.standin.as_ref().and_then(|i| i.take_log().ok()).unwrap_or_default();
        self.seen.extend(fresh.iter().cloned());
        fresh
    }

    /// How often `func` was called on the stand-in so far.
    fn calls_of(&mut self, func: &str) -> u64 {
        self.new_calls();
        self.seen.iter().filter(|c| c.func == func).count() as u64
    }

    /// Poison handling: finalize the unusable runner (its force reset may report errors of the
    /// poisoned device, which are returned as a note) and attach a fresh one; only a failed
    /// attach is an error (the device did not come back).
    fn recover(&mut self) -> Result<Option<String>, DeviceError> {
        let note = self.runner.take().and_then(|r| r.finalize().err()).map(|e| e.to_string());
        self.runner()?;
        Ok(note)
    }

    fn run_id(&mut self) -> RunId {
        self.next_run += 1;
        RunId::from_raw(self.next_run).expect("run ids start at 1")
    }

    /// Finalizes the current runner (force-resetting a poisoned device) and attaches a fresh
    /// one.
    fn reattach(&mut self) -> Result<(), DeviceError> {
        if let Some(r) = self.runner.take() {
            r.finalize()?;
        }
        self.runner()?;
        Ok(())
    }
}

fn three_args(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 3 }
}

/// `f = a + b`: the reference kernel on a real chip is a ccec object (not built yet), so the
/// callable carries placeholder text, which only the stand-in accepts.
fn add_callable() -> ChipCallable {
    use ArgDirection::{In, Out};
    ChipCallable::native(add::orchestration, three_args)
        .names("add", "add_config")
        .signature(vec![In, In, Out])
        .kernel(add::ADD, CoreCallable::new(vec![In, In, Out], KernelCode::Text(vec![0; 64])))
        .build()
        .expect("a valid callable")
}

fn upload(r: &mut DeviceRunner, values: &[f32]) -> Result<Tensor, DeviceError> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let p = r.malloc(bytes.len() as u64)?;
    r.copy_to_device(p, &bytes)?;
    Ok(Tensor::external(p.addr(), &[values.len() as u32], DataType::Float32)
        .expect("a valid tensor")
        .child_memory(true))
}

// ----- Cases -----

fn acl_smoke(b: &mut Bench) -> Outcome {
    let r = match b.runner() {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(e),
    };
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let mut round_trip = || -> Result<Vec<u8>, DeviceError> {
        let p = r.malloc(data.len() as u64)?;
        r.copy_to_device(p, &data)?;
        let mut back = vec![0u8; data.len()];
        r.copy_from_device(&mut back, p)?;
        r.free(p)?;
        Ok(back)
    };
    match round_trip() {
        Ok(back) if back == data => Outcome::Passed("4096-byte round trip".into()),
        Ok(_) => Outcome::FailedCheck("the bytes copied back differ".into()),
        Err(e) => Outcome::Failed(e),
    }
}

fn attach_finalize_reattach(b: &mut Bench) -> Outcome {
    match b.reattach().and_then(|()| b.reattach()) {
        Ok(()) => Outcome::Passed("finalized and re-attached twice".into()),
        Err(e) => Outcome::Failed(e),
    }
}

fn vector_add(b: &mut Bench) -> Outcome {
    let run = b.run_id();
    let standin = b.standin.is_some();
    let r = match b.runner() {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(e),
    };
    let mut go = || -> Result<(), DeviceError> {
        let slot = r.register_callable(&add_callable())?;
        let mut args = TaskArgs::new();
        let (a, bb, f) =
            (upload(r, &[1.0; 256])?, upload(r, &[2.0; 256])?, upload(r, &[0.0; 256])?);
        args.add_input(a)
            .and_then(|x| x.add_input(bb))
            .and_then(|x| x.add_output(f))
            .expect("three tensors fit a task");
        r.run(&RunRequest::new(run, slot, &args, &CallConfig::default()))?;
        r.unregister_callable(slot)?;
        Ok(())
    };
    match go() {
        Ok(()) if standin => Outcome::Passed(
            "run completed (the stand-in executes no kernel, so no golden check)".into(),
        ),
        Ok(()) => Outcome::Skipped("golden check needs the ccec-built add kernel".into()),
        Err(e) => Outcome::Failed(e),
    }
}

fn launch_order(b: &mut Bench) -> Outcome {
    if b.standin.is_none() {
        return Outcome::Skipped("the launch order is read from the stand-in's call log".into());
    }
    b.new_calls();
    if let Outcome::Failed(e) = vector_add(b) {
        return Outcome::Failed(e);
    }
    let log = b.new_calls();
    let at = |name: &str| log.iter().position(|c| c.func == name);
    match (at("rtKernelLaunchWithHandleV2"), at("rtsLaunchCpuKernel")) {
        (Some(core), Some(cpu)) if core < cpu => {
            Outcome::Passed("AICore launch before AICPU launch".into())
        }
        other => Outcome::FailedCheck(format!("launch positions (AICore, AICPU) = {other:?}")),
    }
}

fn poison_then_recover(b: &mut Bench) -> Outcome {
    if b.standin.is_none() {
        return Outcome::Skipped(
            "the hanging kernel needs a ccec-built kernel (not built yet)".into(),
        );
    }
    let next = b.calls_of("rtKernelLaunchWithHandleV2") + 1;
    if let Some(install) = &b.standin {
        let _ = install.poison_at("rtKernelLaunchWithHandleV2", next, 507_899);
    }
    let poisoned = match vector_add(b) {
        Outcome::Failed(e @ DeviceError::Unsupported { .. }) => return Outcome::Failed(e),
        Outcome::Failed(e) => e,
        _ => return Outcome::FailedCheck("the poisoned launch did not fail".into()),
    };
    let healthy = b.runner.as_ref().is_some_and(|r| r.health().is_healthy());
    if healthy {
        return Outcome::FailedCheck(format!("the device stayed healthy after {poisoned}"));
    }
    if let Err(e) = b.recover() {
        return Outcome::Failed(e);
    }
    match vector_add(b) {
        Outcome::Passed(_) => Outcome::Passed(format!(
            "poisoned ({poisoned}); finalize, re-attach, vector_add passed"
        )),
        other => other,
    }
}

type Case = fn(&mut Bench) -> Outcome;

/// In order; fault-injection cases last.
const CASES: &[(&str, Case)] = &[
    ("acl_smoke", acl_smoke),
    ("attach_finalize_reattach", attach_finalize_reattach),
    ("vector_add", vector_add),
    ("launch_order", launch_order),
    ("poison_then_recover", poison_then_recover),
];

// ----- Driver -----

fn json_line(v: serde_json::Value) {
    println!("{v}");
}

fn env(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

fn placeholders() -> std::io::Result<(tempfile::TempDir, PathBuf)> {
    let dir = tempfile::tempdir()?;
    for (name, bytes) in [
        ("aicpu_program.so", &b"\x7fELF placeholder AICPU program"[..]),
        ("dispatcher.so", b"\x7fELF placeholder dispatcher"),
        ("aicore_executor.o", b"\x7fELF placeholder AICore executor"),
    ] {
        std::fs::write(dir.path().join(name), bytes)?;
    }
    let manifest = dir.path().join("manifest.json");
    let abi = simpler_device_a2a3::abi::ABI_VERSION;
    std::fs::write(
        &manifest,
        format!(
            r#"{{ "abi_version": {abi}, "artifacts": {{
                "aicpu_program": {{ "path": "aicpu_program.so" }},
                "dispatcher": {{ "path": "dispatcher.so" }},
                "aicore_executor": {{ "path": "aicore_executor.o" }} }} }}"#
        ),
    )?;
    Ok((dir, manifest))
}

fn setup() -> Result<(Bench, PathBuf, Option<tempfile::TempDir>), String> {
    let device = env("SIMPLER_ONBOARD_TEST_DEVICE")
        .map_or(Ok(0), |d| d.parse())
        .map_err(|e| format!("SIMPLER_ONBOARD_TEST_DEVICE: {e}"))?;
    let runtime = match env("SIMPLER_ONBOARD_TEST_RUNTIME").as_deref().unwrap_or("hbg") {
        "hbg" => RuntimeVariant::HostBuildGraph,
        "trb" => RuntimeVariant::TensormapAndRingbuffer,
        other => return Err(format!("SIMPLER_ONBOARD_TEST_RUNTIME `{other}` is not hbg or trb")),
    };
    let standin = env("SIMPLER_ONBOARD_TEST_STANDIN").as_deref() != Some("0");
    let install = if standin {
        let i = FakeInstall::standard().map_err(|e| format!("the stand-in CANN library: {e}"))?;
        i.set_value("device_count", 8).map_err(|e| e.to_string())?;
        Some(i)
    } else {
        None
    };
    let (placeholders, manifest) = match env("SIMPLER_ONBOARD_ARTIFACTS") {
        Some(m) => (None, PathBuf::from(m)),
        None if standin => {
            let (d, m) = placeholders().map_err(|e| e.to_string())?;
            (Some(d), m)
        }
        None => return Err("SIMPLER_ONBOARD_ARTIFACTS names no manifest".into()),
    };
    let (out, out_tmp) = match env("SIMPLER_ONBOARD_TEST_OUT") {
        Some(o) => (PathBuf::from(o), None),
        None => {
            let d = tempfile::tempdir().map_err(|e| e.to_string())?;
            (d.path().to_path_buf(), Some(d))
        }
    };
    let bench = Bench {
        device,
        runtime,
        standin: install,
        manifest,
        _placeholders: placeholders,
        runner: None,
        next_run: 0,
        seen: Vec::new(),
    };
    Ok((bench, out, out_tmp))
}

fn write_host_log(dir: &Path, text: &str) {
    let _ = std::fs::create_dir_all(dir);
    let _ = std::fs::write(dir.join("host.log"), text);
}

fn main() -> ExitCode {
    let (mut bench, out, _out_tmp) = match setup() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("onboard cases: {e}");
            return ExitCode::from(2);
        }
    };
    let budgets = match bench.options().resolve_timeouts() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("onboard cases: the budgets are not a valid set: {e}");
            return ExitCode::from(2);
        }
    };
    json_line(serde_json::json!({
        "event": "budgets",
        "scheduler_ms": budgets.scheduler.as_millis() as u64,
        "op_execute_us": budgets.op_execute.as_micros() as u64,
        "stream_sync_ms": budgets.stream_sync.as_millis() as u64,
    }));
    let hang = env("SIMPLER_ONBOARD_TEST_HANG_CASE");
    let mut failed = false;
    let mut quarantined: Option<String> = None;
    let mut fast_failed: Vec<(&str, Case)> = Vec::new();
    let report = |name: &str, o: &Outcome, ms: u128, rerun: bool| {
        let (status, class, message) = match o {
            Outcome::Passed(m) => ("passed", None, m.clone()),
            Outcome::Skipped(m) => ("skipped", None, m.clone()),
            Outcome::FailedCheck(m) => ("failed", None, m.clone()),
            Outcome::Failed(e) => ("failed", Some(format!("{:?}", e.class())), e.to_string()),
        };
        write_host_log(&out.join(name), &format!("{status}: {message}\n"));
        json_line(serde_json::json!({
            "event": "end", "case": name, "status": status, "ms": ms as u64,
            "error_class": class, "message": message, "rerun": rerun,
            "dir": out.join(name),
        }));
        status == "failed"
    };
    for &(name, case) in CASES {
        json_line(serde_json::json!({ "event": "start", "case": name }));
        if let Some(cause) = &quarantined {
            report(name, &Outcome::Skipped(format!("device quarantined: {cause}")), 0, false);
            continue;
        }
        if hang.as_deref() == Some(name) {
            loop {
                std::thread::park();
            }
        }
        let started = Instant::now();
        let o = match case(&mut bench) {
            // What this build cannot do on this backend yet is skipped with the cause.
            Outcome::Failed(e @ DeviceError::Unsupported { .. }) => Outcome::Skipped(e.to_string()),
            o => o,
        };
        let fast_fail =
            matches!(&o, Outcome::Failed(e) if format!("{:?}", e.class()) == "Poisoned");
        failed |= report(name, &o, started.elapsed().as_millis(), false) && !fast_fail;
        if fast_fail {
            fast_failed.push((name, case));
        }
        // Poison handling: a device left unusable is finalized (force reset) and re-attached;
        // one that will not come back is quarantined.
        if bench.runner.as_ref().is_some_and(|r| !r.health().is_healthy()) {
            if let Err(e) = bench.recover() {
                quarantined = Some(e.to_string());
                failed = true;
            } else {
                for (name, case) in std::mem::take(&mut fast_failed) {
                    json_line(serde_json::json!({ "event": "start", "case": name }));
                    let started = Instant::now();
                    let o = case(&mut bench);
                    failed |= report(name, &o, started.elapsed().as_millis(), true);
                }
            }
        }
    }
    failed |= !fast_failed.is_empty();
    if let Some(r) = bench.runner.take()
        && let Err(e) = r.finalize()
    {
        eprintln!("onboard cases: the final finalize failed: {e}");
        failed = true;
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
