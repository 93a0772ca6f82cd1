//! The onboard case set (`harness = false`): one process runs every case of one device and one
//! runtime in sequence with one reused runner, fault-injection cases last, and reports each case
//! as a JSON line on stdout (`cargo xtask onboard-test` reads them, enforces the limits and
//! writes the summary; `docs/onboard-programs.md`).
//!
//! Two runners serve the cases. The onboard runner (the real chip through CANN, or the stand-in
//! CANN library) carries every CANN-side step. Kernels execute on the chip; the stand-in
//! executes nothing, so with it the steps that need kernels to run (golden checks, the hanging
//! kernel, the diagnostics files) also run on the simulator with the device programs of the
//! manifest: the host builds of the AICPU program and the C++ AICore executor, the code that
//! ships.
//!
//! Environment:
//! - `SIMPLER_ONBOARD_TEST_DEVICE` (default 0), `SIMPLER_ONBOARD_TEST_RUNTIME` (`hbg`, `trb`).
//! - `SIMPLER_ONBOARD_TEST_OUT`: the directory of per-case output directories (default: a
//!   temporary one).
//! - `SIMPLER_ONBOARD_TEST_STANDIN=0` runs on the real chip through CANN; anything else (and
//!   the default) runs against the stand-in CANN library, with the manifest from
//!   `SIMPLER_ONBOARD_ARTIFACTS` or, without it, placeholder programs and the simulator's
//!   compiled-in scheduler and executor (what `cargo test` does).
//! - `ASCEND_PROCESS_LOG_PATH`: where CANN (and the stand-in) write their logs; the bytes a
//!   case appended there are copied into the case's `device-log/`.
//! - `SIMPLER_ONBOARD_TEST_HANG_CASE=<case>`: that case never returns (to test the limits).
//! - The budgets come from `SIMPLER_SCHEDULER_TIMEOUT_MS`, `SIMPLER_OP_EXECUTE_TIMEOUT_US` and
//!   `SIMPLER_STREAM_SYNC_TIMEOUT_MS`, validated as a set before the first case.
//!
//! Exit code: 0 when every case passed or was skipped, 1 otherwise, 2 when the set cannot start
//! (invalid budgets, no stand-in library, bad environment).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use simpler_acl_sys::standin::{Call, FakeInstall};
use simpler_device_a2a3::programs::{add, vector};
use simpler_device_a2a3::{
    ArgDirection, CapacityResource, ChipCallable, ChipCallableBuilder, CoreCallable, DeviceError,
    DevicePtr, DeviceRunner, KernelCode, Kernels, OrchArgs, OrchConfig, OrchCtx, OrchError,
    Orchestration, OrchestrationObject, RunRequest, RunnerOptions, RuntimeVariant,
    abi::codes::RuntimeCode,
};
use simpler_types::{
    CallConfig, CoreArgs, DataType, RingSel, RunId, SwimlaneLevel, TaskArgs, Tensor,
};

/// Device codes after which the device is treated as poisoned, whatever `health()` says.
const POISON_CODES: [i32; 8] =
    [207_001, 507_000, 507_014, 507_015, 507_017, 507_018, 507_046, 507_899];

/// Golden-check tolerances: `|got - want| <= ATOL + RTOL * |want|`.
const RTOL: f32 = 1e-5;
const ATOL: f32 = 1e-5;

/// Why a case step did not pass.
enum Fail {
    Device(DeviceError),
    Check(String),
    Skip(String),
}

impl From<DeviceError> for Fail {
    fn from(e: DeviceError) -> Fail {
        Fail::Device(e)
    }
}

type Step<T> = Result<T, Fail>;

/// The error of a step that must fail; a success is a failed check, and `Unsupported` stays an
/// error (the case is skipped).
fn failure_of(step: Step<()>, what: &str) -> Step<DeviceError> {
    match step {
        Ok(()) => Err(Fail::Check(format!("{what} succeeded"))),
        Err(Fail::Device(e @ DeviceError::Unsupported { .. })) => Err(Fail::Device(e)),
        Err(Fail::Device(e)) => Ok(e),
        Err(other) => Err(other),
    }
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Step<()> {
    if ok { Ok(()) } else { Err(Fail::Check(what())) }
}

/// Which runner a step uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    /// The onboard backend: the chip, or the stand-in CANN library.
    Onboard,
    /// The simulator running the manifest's device programs (stand-in mode only).
    Programs,
}

/// Everything a case may use.
struct Bench {
    device: u32,
    runtime: RuntimeVariant,
    /// The stand-in install (`None` on a real chip).
    standin: Option<FakeInstall>,
    manifest: PathBuf,
    /// The host builds of the AICPU program and AICore executor the manifest names (`None` for
    /// placeholder programs: the simulator then runs its compiled-in ones).
    programs: Option<(&'static Path, &'static Path)>,
    /// Keeps placeholder programs alive.
    _placeholders: Option<tempfile::TempDir>,
    runner: Option<DeviceRunner>,
    sim: Option<DeviceRunner>,
    next_run: u64,
    /// Every stand-in call taken from its log so far (the log hands out each call once).
    seen: Vec<Call>,
    /// The running case's output directory.
    case_dir: PathBuf,
    /// The running case's host-log lines.
    notes: Vec<String>,
}

impl Bench {
    fn onboard_options(&self) -> RunnerOptions {
        let o = RunnerOptions::onboard(self.device, self.runtime)
            .with_onboard_manifest(&self.manifest)
            .with_env_overrides();
        match &self.standin {
            Some(install) => o.with_cann(Arc::new(install.cann())),
            None => o,
        }
    }

    /// The simulator's options; the batch's budgets come from the environment in `on`.
    fn sim_options(&self) -> RunnerOptions {
        // The onboard shutdown budget, so an unanswered exit costs what it costs on a chip.
        let mut o = RunnerOptions::sim(self.device, self.runtime)
            .with_shutdown_budget(Duration::from_secs(1));
        if let Some((program, executor)) = self.programs {
            // SAFETY: the host builds of this workspace's AICPU program and C++ AICore
            // executor that the manifest under test names (`manifest_programs`).
            o = unsafe { o.with_aicpu_program(program).with_aicore_executor(executor) };
        }
        o
    }

    /// The targets that execute kernels: the chip, or with the stand-in the simulator.
    fn kernel_target(&self) -> Target {
        if self.standin.is_some() { Target::Programs } else { Target::Onboard }
    }

    fn slot(&mut self, t: Target) -> &mut Option<DeviceRunner> {
        match t {
            Target::Onboard => &mut self.runner,
            Target::Programs => &mut self.sim,
        }
    }

    fn on(&mut self, t: Target) -> Result<&mut DeviceRunner, DeviceError> {
        if self.slot(t).is_none() {
            let o = match t {
                Target::Onboard => self.onboard_options(),
                Target::Programs => self.sim_options().with_env_overrides(),
            };
            *self.slot(t) = Some(DeviceRunner::attach(o)?);
        }
        Ok(self.slot(t).as_mut().expect("attached above"))
    }

    fn runner(&mut self) -> Result<&mut DeviceRunner, DeviceError> {
        self.on(Target::Onboard)
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
    fn recover(&mut self, t: Target) -> Result<Option<String>, DeviceError> {
        let note = self.slot(t).take().and_then(|r| r.finalize().err()).map(|e| e.to_string());
        self.on(t)?;
        Ok(note)
    }

    fn healthy(&self, t: Target) -> bool {
        let r = match t {
            Target::Onboard => &self.runner,
            Target::Programs => &self.sim,
        };
        r.as_ref().is_none_or(|r| r.health().is_healthy())
    }

    fn run_id(&mut self) -> RunId {
        self.next_run += 1;
        RunId::from_raw(self.next_run).expect("run ids start at 1")
    }

    /// Finalizes the current runner (force-resetting a poisoned device) and attaches a fresh
    /// one.
    fn reattach(&mut self, t: Target) -> Result<(), DeviceError> {
        if let Some(r) = self.slot(t).take() {
            r.finalize()?;
        }
        self.on(t)?;
        Ok(())
    }

    fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }
}

// ----- Programs -----

/// The programs the cases run.
#[derive(Clone, Copy, Debug)]
enum Program {
    /// `f = a + b`.
    Add,
    /// The five-task vector example.
    Vector,
}

/// The code the manifest names beside the device programs: the test kernels (`kernel_<name>`;
/// on a chip their ccec-built `.text`) and the C orchestration object (`orchestrations`).
#[derive(Default)]
struct ManifestCode {
    kernels: BTreeMap<String, Vec<u8>>,
    orchestrations: Option<Vec<u8>>,
}

/// Read once in `setup`; empty with placeholder programs.
static CODE: std::sync::OnceLock<ManifestCode> = std::sync::OnceLock::new();

fn code() -> &'static ManifestCode {
    CODE.get_or_init(ManifestCode::default)
}

impl ManifestCode {
    /// The kernels and the object `manifest` names (a name it lacks stays absent).
    fn read(manifest: &Path) -> Result<ManifestCode, String> {
        let v = manifest_json(manifest)?;
        let base = manifest.parent().unwrap_or(Path::new("."));
        let file = |name: &str| -> Result<Option<Vec<u8>>, String> {
            let Some(p) = v["artifacts"][name]["path"].as_str() else { return Ok(None) };
            let p = base.join(p);
            std::fs::read(&p).map(Some).map_err(|e| format!("{name} at {}: {e}", p.display()))
        };
        let mut kernels = BTreeMap::new();
        for k in simpler_onboard_programs::BUILT_KERNELS {
            if let Some(bytes) = file(&format!("kernel_{}", k.name))? {
                kernels.insert(k.name.to_owned(), bytes);
            }
        }
        Ok(ManifestCode { kernels, orchestrations: file("orchestrations")? })
    }

    /// What `program` under `runtime` lacks to run real code on a chip, if anything.
    fn missing_for(&self, program: Program, runtime: RuntimeVariant) -> Option<String> {
        self.missing_with(program, &program.kernels(), runtime)
    }

    /// [`missing_for`](Self::missing_for) with `kernels` as the program's kernels.
    fn missing_with(
        &self,
        program: Program,
        kernels: &[(u32, Vec<ArgDirection>, &str)],
        runtime: RuntimeVariant,
    ) -> Option<String> {
        let mut missing: Vec<String> = kernels
            .iter()
            .filter(|(_, _, name)| !self.kernels.contains_key(*name))
            .map(|(_, _, name)| format!("kernel_{name}"))
            .collect();
        if runtime == RuntimeVariant::TensormapAndRingbuffer && self.orchestrations.is_none() {
            missing.push("orchestrations".into());
        }
        (!missing.is_empty()).then(|| {
            format!(
                "{}: the manifest names no {} (`cargo xtask build --platform a2a3` builds them)",
                program.name(),
                missing.join(", ")
            )
        })
    }
}

/// Placeholder kernel code, for a kernel the manifest does not name. Only the stand-in, which
/// executes nothing, runs it; on a chip the cases that would launch it are skipped (the runtime
/// error fixtures fail before any launch).
fn placeholder() -> KernelCode {
    KernelCode::Text(vec![0; 64])
}

/// `base` with each of `kernels` as the manifest's code, or placeholder code where it names
/// none.
fn with_kernel_code(
    mut base: ChipCallableBuilder,
    kernels: &[(u32, Vec<ArgDirection>, &str)],
) -> ChipCallable {
    for (func, sig, name) in kernels {
        let code =
            code().kernels.get(*name).map_or_else(placeholder, |c| KernelCode::Text(c.clone()));
        // SAFETY: the kernel is written for the signature it is paired with.
        base = base.kernel(*func, unsafe { CoreCallable::new(sig.clone(), code) });
    }
    base.build().expect("a valid callable")
}

fn three_args(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 3 }
}

impl Program {
    fn name(self) -> &'static str {
        match self {
            Program::Add => "vector_add",
            Program::Vector => "vector_example",
        }
    }

    /// The program's kernels: func id, signature, test-kernel name.
    fn kernels(self) -> Vec<(u32, Vec<ArgDirection>, &'static str)> {
        use ArgDirection::{In, Out, Scalar};
        match self {
            Program::Add => vec![(add::ADD, vec![In, In, Out], "add")],
            Program::Vector => vec![
                (vector::ADD, vec![In, In, Out], "add"),
                (vector::ADD_SCALAR, vec![In, Out, Scalar], "add_scalar"),
                (vector::MUL, vec![In, In, Out], "mul"),
            ],
        }
    }

    /// The callable for `t` under `runtime`: native kernels on the simulator, the manifest's
    /// kernel code onboard, where tensormap_and_ringbuffer runs the manifest's C orchestration
    /// object as a `DeviceObject`.
    fn callable(self, t: Target, runtime: RuntimeVariant) -> ChipCallable {
        self.callable_with(t, runtime, &self.kernels())
    }

    /// [`callable`](Self::callable) with `kernels` as the onboard kernels (e.g. the hanging
    /// kernel in place of one of them).
    fn callable_with(
        self,
        t: Target,
        runtime: RuntimeVariant,
        kernels: &[(u32, Vec<ArgDirection>, &str)],
    ) -> ChipCallable {
        use ArgDirection::{In, Out};
        let onboard_trb = t == Target::Onboard && runtime == RuntimeVariant::TensormapAndRingbuffer;
        if onboard_trb {
            return self.device_object_callable(kernels);
        }
        if t == Target::Programs && runtime == RuntimeVariant::TensormapAndRingbuffer {
            // The C orchestration, as on the chip: a simulator running the built AICPU program
            // refuses a Native one, as the device does.
            let (entry, config) = self.c_entry();
            let orchestration = common::c_orchestration(entry, config);
            let built = match self {
                Program::Add => add::builder_with(orchestration).build(),
                Program::Vector => vector::builder_with(orchestration).build(),
            };
            return built.expect("a valid callable");
        }
        if t == Target::Programs {
            return match self {
                Program::Add => add::callable().expect("a valid callable"),
                Program::Vector => vector::callable().expect("a valid callable"),
            };
        }
        let native = match self {
            Program::Add => {
                ChipCallable::native(add::orchestration, three_args).names("add", "add_config")
            }
            Program::Vector => ChipCallable::native(vector::orchestration, three_args)
                .names("vector_example", "vector_config"),
        };
        with_kernel_code(native.signature(vec![In, In, Out]), kernels)
    }

    /// The program as a `DeviceObject` callable: the manifest's orchestration object with the
    /// program's C entry, or a placeholder object where the manifest names none (only the
    /// stand-in, which plays the register entry and loads nothing, takes that one).
    fn device_object_callable(self, kernels: &[(u32, Vec<ArgDirection>, &str)]) -> ChipCallable {
        use ArgDirection::{In, Out};
        let (entry, config) = self.c_entry();
        let bytes = code()
            .orchestrations
            .clone()
            .unwrap_or_else(|| b"\x7fELF placeholder orchestration".to_vec());
        // SAFETY: the manifest's object is the project's C orchestrations, built by `cargo
        // xtask build` for the target the manifest is for; its entries have the orchestration
        // ABI and touch only what the ops table hands out. The placeholder never reaches a chip
        // (the cases that would register it there are skipped) and the stand-in loads nothing.
        let object = unsafe { OrchestrationObject::new(bytes, entry, config) };
        let base = ChipCallable::builder(Orchestration::DeviceObject(object))
            .names(entry, config)
            .signature(vec![In, In, Out]);
        with_kernel_code(base, kernels)
    }

    /// The entry and config of the program's C orchestration.
    fn c_entry(self) -> (&'static str, &'static str) {
        match self {
            Program::Add => simpler_onboard_programs::ADD_ORCHESTRATION,
            Program::Vector => simpler_onboard_programs::VECTOR_ORCHESTRATION,
        }
    }

    fn reference(self, a: &[f32], b: &[f32]) -> Vec<f32> {
        match self {
            Program::Add => add::reference(a, b),
            Program::Vector => vector::reference(a, b),
        }
    }
}

fn upload(r: &mut DeviceRunner, values: &[f32]) -> Result<(DevicePtr, Tensor), DeviceError> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let p = r.malloc(bytes.len() as u64)?;
    r.copy_to_device(p, &bytes)?;
    let t = Tensor::external(p.addr(), &[values.len() as u32], DataType::Float32)
        .expect("a valid tensor")
        .child_memory(true);
    Ok((p, t))
}

fn download(r: &mut DeviceRunner, p: DevicePtr, n: usize) -> Result<Vec<f32>, DeviceError> {
    let mut bytes = vec![0u8; n * 4];
    r.copy_from_device(&mut bytes, p)?;
    Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// The first element outside the tolerances, if any.
fn golden_mismatch(got: &[f32], want: &[f32]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} elements, expected {}", got.len(), want.len()));
    }
    got.iter().zip(want).enumerate().find_map(|(i, (g, w))| {
        let ok = (g - w).abs() <= ATOL + RTOL * w.abs();
        (!ok).then(|| format!("element {i}: {g}, expected {w}"))
    })
}

/// 128 × 128 f32 elements, as the conformance set's vector runs.
const ELEMENTS: usize = 128 * 128;

/// One run of `program` on `r` with fresh inputs; with `golden`, the output is compared with
/// the host computation. The buffers and the callable are released on every path the device
/// still accepts.
fn run_program(
    r: &mut DeviceRunner,
    run: RunId,
    program: Program,
    (t, runtime): (Target, RuntimeVariant),
    cfg: &CallConfig,
    golden: bool,
) -> Step<()> {
    run_callable(r, run, program, &program.callable(t, runtime), cfg, golden)
}

/// One run of `callable` (which computes `program`) on `r`, with its buffers freed and its
/// slot unregistered afterwards while the runner is healthy.
fn run_callable(
    r: &mut DeviceRunner,
    run: RunId,
    program: Program,
    callable: &ChipCallable,
    cfg: &CallConfig,
    golden: bool,
) -> Step<()> {
    let slot = r.register_callable(callable)?;
    let a: Vec<f32> = (0..ELEMENTS).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..ELEMENTS).map(|i| 3.0 - i as f32 * 0.25).collect();
    let mut ptrs = Vec::new();
    let mut go = |r: &mut DeviceRunner| -> Step<()> {
        let mut args = TaskArgs::new();
        for (values, out) in [(&a, false), (&b, false), (&vec![0.0; ELEMENTS], true)] {
            let (p, tensor) = upload(r, values)?;
            ptrs.push(p);
            let added = if out { args.add_output(tensor) } else { args.add_input(tensor) };
            added.expect("three tensors fit a task");
        }
        r.run(&RunRequest::new(run, slot, &args, cfg))?;
        if golden {
            let f = download(r, ptrs[2], ELEMENTS)?;
            if let Some(m) = golden_mismatch(&f, &program.reference(&a, &b)) {
                return Err(Fail::Check(format!("{}: {m}", program.name())));
            }
        }
        Ok(())
    };
    let result = go(r);
    if r.health().is_healthy() {
        for p in ptrs {
            r.free(p)?;
        }
        r.unregister_callable(slot)?;
    }
    result
}

/// One `vector_add` run through the onboard runner, without a golden check.
fn add_onboard(b: &mut Bench) -> Step<()> {
    let (run, rt) = (b.run_id(), b.runtime);
    run_program(
        b.runner()?,
        run,
        Program::Add,
        (Target::Onboard, rt),
        &CallConfig::default(),
        false,
    )
}

/// The shapes golden checks run: `block_dim` 1–3 with 2–4 AICPU threads.
fn shapes() -> Vec<CallConfig> {
    [(1, 2), (2, 3), (3, 4)]
        .into_iter()
        .map(|(b, t)| {
            CallConfig::builder().block_dim(b).aicpu_thread_num(t).build().expect("valid")
        })
        .collect()
}

/// `program` with golden checks where kernels execute, and (with the stand-in) once through
/// the onboard runner, whose run proves the CANN-side path.
fn golden(b: &mut Bench, program: Program) -> Step<String> {
    let rt = b.runtime;
    if b.standin.is_none() {
        return golden_on_chip(b, program);
    }
    let run = b.run_id();
    b.new_calls();
    run_program(b.runner()?, run, program, (Target::Onboard, rt), &CallConfig::default(), false)?;
    b.note(format!("{}: the stand-in CANN run completed", program.name()));
    if let (RuntimeVariant::TensormapAndRingbuffer, Some(object)) = (rt, &code().orchestrations) {
        // The manifest's object, not a placeholder, went to the device for the register entry.
        let len = object.len() as i64;
        let copied =
            b.new_calls().iter().any(|c| c.func.ends_with("Memcpy") && c.size == Some(len));
        check(copied, || format!("no copy of the manifest's {len}-byte orchestration object"))?;
        b.note(format!("{}: the manifest's orchestration object was registered", program.name()));
    }
    let shapes = shapes();
    for cfg in &shapes {
        let run = b.run_id();
        run_program(b.on(Target::Programs)?, run, program, (Target::Programs, rt), cfg, true)?;
    }
    let which = if b.programs.is_some() {
        "the built AICPU program and AICore executor"
    } else {
        "the compiled-in scheduler and executor (no manifest)"
    };
    Ok(format!(
        "stand-in CANN run completed; on the simulator with {which}: {} elements × {} shapes \
         within rtol = atol = {RTOL:e}",
        ELEMENTS,
        shapes.len()
    ))
}

// ----- Cases -----

fn acl_smoke(b: &mut Bench) -> Step<String> {
    let r = b.runner()?;
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let p = r.malloc(data.len() as u64)?;
    r.copy_to_device(p, &data)?;
    let mut back = vec![0u8; data.len()];
    r.copy_from_device(&mut back, p)?;
    r.free(p)?;
    check(back == data, || "the bytes copied back differ".into())?;
    Ok("4096-byte round trip".into())
}

fn attach_finalize_reattach(b: &mut Bench) -> Step<String> {
    b.reattach(Target::Onboard)?;
    b.reattach(Target::Onboard)?;
    Ok("finalized and re-attached twice".into())
}

fn vector_add(b: &mut Bench) -> Step<String> {
    golden(b, Program::Add)
}

fn vector_example(b: &mut Bench) -> Step<String> {
    golden(b, Program::Vector)
}

fn launch_order(b: &mut Bench) -> Step<String> {
    if b.standin.is_none() {
        return Err(Fail::Skip("the launch order is read from the stand-in's call log".into()));
    }
    b.new_calls();
    add_onboard(b)?;
    let log = b.new_calls();
    // The run's launches, not the register entry's (tensormap_and_ringbuffer loads its
    // orchestration object at registration, through an AICPU launch of its own).
    let at = |name: &str| {
        log.iter()
            .position(|c| c.func == name && !c.text.starts_with("simpler_aicpu_register_callable"))
    };
    match (at("rtKernelLaunchWithHandleV2"), at("rtsLaunchCpuKernel")) {
        (Some(core), Some(cpu)) if core < cpu => Ok("AICore launch before AICPU launch".into()),
        other => Err(Fail::Check(format!("launch positions (AICore, AICPU) = {other:?}"))),
    }
}

// Runtime error fixtures (host_build_graph: the graph is built on the host, so each fails
// before any launch).

fn noop_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let n = args.scalar(0).unwrap_or(0);
    let Some(t) = args.tensor(0) else { return Ok(()) };
    for _ in 0..n {
        let mut a = CoreArgs::new();
        // Status 5: the fixture's arguments are malformed.
        a.add_inout(*t).map_err(|_| OrchError::from_status(5))?;
        ctx.submit(Kernels::Aiv(NOOP), &a)?;
    }
    Ok(())
}

fn alloc_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let kib = args.scalar(0).unwrap_or(0) as u32;
    for _ in 0..4 {
        let _ = ctx.alloc_tensor(&[kib, 256], DataType::Float32);
    }
    Ok(())
}

fn fatal_orch(ctx: &mut OrchCtx<'_>, _args: &OrchArgs<'_>) -> Result<(), OrchError> {
    ctx.report_fatal(0, "the fixture gives up");
    Ok(())
}

/// Func id of the fixtures' kernel.
const NOOP: u32 = 3;

fn fixture(orch: simpler_device_a2a3::NativeOrchFn, expected: u32, t: Target) -> ChipCallable {
    let config: simpler_device_a2a3::NativeConfigFn = match expected {
        0 => |_| OrchConfig { expected_arg_count: 0 },
        _ => |_| OrchConfig { expected_arg_count: 5 },
    };
    let base = ChipCallable::native(orch, config);
    match t {
        Target::Programs => base
            .kernel(NOOP, common::noop_core(vec![ArgDirection::InOut]))
            .build()
            .expect("a valid callable"),
        Target::Onboard => with_kernel_code(base, &[(NOOP, vec![ArgDirection::InOut], "noop")]),
    }
}

/// The fixtures on `t`; returns what each produced.
fn fixtures_on(b: &mut Bench, t: Target) -> Step<Vec<String>> {
    let runs: Vec<RunId> = (0..4).map(|_| b.run_id()).collect();
    let r = b.on(t)?;
    let launches = r.stats().aicore_launches;
    let (p, tensor) = upload(r, &[0.0; 256])?;
    let mut seen = Vec::new();
    let mut expect = |r: &mut DeviceRunner,
                      what: &str,
                      callable: ChipCallable,
                      args: TaskArgs,
                      cfg: CallConfig,
                      want: &dyn Fn(&DeviceError) -> bool,
                      run: RunId|
     -> Step<()> {
        let slot = r.register_callable(&callable)?;
        let res = r.run(&RunRequest::new(run, slot, &args, &cfg)).map(|_| ()).map_err(Fail::from);
        r.unregister_callable(slot)?;
        match failure_of(res, what)? {
            e if want(&e) => {
                seen.push(format!("{what}: {e}"));
                Ok(())
            }
            e => Err(Fail::Check(format!("{what}: unexpected {e}"))),
        }
    };
    let mut window = TaskArgs::new();
    window.add_inout(tensor).expect("fits").add_scalar(20).expect("fits");
    expect(
        r,
        "task window",
        fixture(noop_orch, 0, t),
        window,
        CallConfig::builder().task_window(RingSel::Ring(0), 16).build().expect("valid"),
        &|e| {
            matches!(
                e,
                DeviceError::Capacity {
                    ring: 0,
                    resource: CapacityResource::TaskWindow,
                    capacity: 16,
                    needed: 20,
                    ..
                }
            )
        },
        runs[0],
    )?;
    let mut heap = TaskArgs::new();
    heap.add_scalar(256).expect("fits");
    expect(
        r,
        "heap",
        fixture(alloc_orch, 0, t),
        heap,
        CallConfig::builder().heap_bytes(RingSel::Ring(0), 512 << 10).build().expect("valid"),
        &|e| matches!(e, DeviceError::Capacity { ring: 0, resource: CapacityResource::Heap, .. }),
        runs[1],
    )?;
    let code = |want: RuntimeCode| move |e: &DeviceError| matches!(e, DeviceError::Runtime { fault, .. } if fault.code == want);
    expect(
        r,
        "code 9",
        fixture(fatal_orch, 0, t),
        TaskArgs::new(),
        CallConfig::default(),
        &code(RuntimeCode::OrchestrationFatal),
        runs[2],
    )?;
    expect(
        r,
        "code 5",
        fixture(fatal_orch, 5, t),
        TaskArgs::new(),
        CallConfig::default(),
        &code(RuntimeCode::InvalidArgs),
        runs[3],
    )?;
    r.free(p)?;
    check(r.stats().aicore_launches == launches, || {
        format!("{t:?}: a fixture that fails on the host launched the device")
    })?;
    check(r.health().is_healthy(), || format!("{t:?}: the device is not healthy: {}", r.health()))?;
    Ok(seen)
}

/// `program` on the chip at every shape with golden checks, with the manifest's kernels (and
/// under trb its orchestration object).
fn golden_on_chip(b: &mut Bench, program: Program) -> Step<String> {
    let rt = b.runtime;
    if let Some(why) = code().missing_for(program, rt) {
        return Err(Fail::Skip(why));
    }
    let shapes = shapes();
    for cfg in &shapes {
        let run = b.run_id();
        run_program(b.runner()?, run, program, (Target::Onboard, rt), cfg, true)?;
    }
    Ok(format!(
        "on the chip with the manifest's kernels: {ELEMENTS} elements × {} shapes within \
         rtol = atol = {RTOL:e}",
        shapes.len()
    ))
}

fn runtime_error_fixtures(b: &mut Bench) -> Step<String> {
    if b.runtime == RuntimeVariant::TensormapAndRingbuffer {
        // These fixtures overflow host_build_graph's resident graph; trb streams such a graph
        // through its rings, and its own stall errors are tested on the simulator.
        return Err(Fail::Skip(
            "the capacity fixtures are host_build_graph's (tensormap_and_ringbuffer streams a \
             graph beyond its window); trb's ring stalls are tested on the simulator"
                .into(),
        ));
    }
    let mut targets = vec![Target::Onboard];
    if b.standin.is_some() {
        targets.push(Target::Programs);
    }
    for t in targets {
        for line in fixtures_on(b, t)? {
            b.note(format!("{t:?}: {line}"));
        }
    }
    // The device stays healthy: the next vector run passes.
    let follow = golden(b, Program::Vector);
    match follow {
        Ok(_) => Ok("capacity (task window, heap), codes 5 and 9 reported; the device stayed \
                     healthy and vector_example passed after them"
            .into()),
        Err(Fail::Skip(why)) => Ok(format!(
            "capacity (task window, heap), codes 5 and 9 reported and the device stayed healthy; \
             the follow-up vector run was skipped: {why}"
        )),
        Err(e) => Err(e),
    }
}

/// The diagnostics files of one traced vector run on `t`, checked to exist and parse.
fn diagnostics_on(b: &mut Bench, t: Target, dir: &Path) -> Step<Vec<String>> {
    let rt = b.runtime;
    let cfg = CallConfig::builder()
        .swimlane(SwimlaneLevel::AicpuTiming)
        .dep_gen(true)
        .scope_stats(true)
        .output_prefix(dir)
        .build()
        .expect("valid");
    let run = b.run_id();
    run_program(b.on(t)?, run, Program::Vector, (t, rt), &cfg, false)?;
    let json = |name: &str| -> Step<serde_json::Value> {
        let path = dir.join(name);
        let bytes =
            std::fs::read(&path).map_err(|e| Fail::Check(format!("{}: {e}", path.display())))?;
        serde_json::from_slice(&bytes).map_err(|e| Fail::Check(format!("{}: {e}", path.display())))
    };
    let deps = json("deps.json")?;
    let tasks = deps["tasks"].as_array().map_or(0, Vec::len);
    // The stand-in executes nothing, so there are no device records to export; under
    // tensormap_and_ringbuffer the graph itself is built on the device, so it lists no task.
    let nothing_ran = t == Target::Onboard && b.standin.is_some();
    let expected =
        if nothing_ran && b.runtime == RuntimeVariant::TensormapAndRingbuffer { 0 } else { 5 };
    check(tasks == expected, || format!("deps.json lists {tasks} tasks, expected {expected}"))?;
    let mut found = vec!["deps.json".to_owned()];
    if nothing_ran {
        return Ok(found);
    }
    let perfetto = json("swimlane.perfetto.json")?;
    let x = perfetto["traceEvents"]
        .as_array()
        .map_or(0, |e| e.iter().filter(|e| e["ph"] == "X" && e["pid"] == 1).count());
    check(x == 5, || format!("swimlane.perfetto.json has {x} task events, expected 5"))?;
    let records = json("l2_swimlane_records.json")?;
    let n = records["aicore_tasks"].as_array().map_or(0, Vec::len);
    check(n == 5, || format!("l2_swimlane_records.json has {n} AICore records, expected 5"))?;
    let stats_path = dir.join("scope_stats/scope_stats.jsonl");
    let text = std::fs::read_to_string(&stats_path)
        .map_err(|e| Fail::Check(format!("{}: {e}", stats_path.display())))?;
    for (i, line) in text.lines().enumerate() {
        serde_json::from_str::<serde_json::Value>(line)
            .map_err(|e| Fail::Check(format!("{} line {}: {e}", stats_path.display(), i + 1)))?;
    }
    check(!text.trim().is_empty(), || format!("{} is empty", stats_path.display()))?;
    found.extend(
        ["swimlane.perfetto.json", "l2_swimlane_records.json", "scope_stats/scope_stats.jsonl"]
            .map(str::to_owned),
    );
    Ok(found)
}

fn diagnostics_smoke(b: &mut Bench) -> Step<String> {
    if b.standin.is_none()
        && let Some(why) = code().missing_for(Program::Vector, b.runtime)
    {
        // Placeholder kernel code must never reach an AICore.
        return Err(Fail::Skip(format!("the traced run on a chip: {why}")));
    }
    let mut done = Vec::new();
    let mut targets = vec![Target::Onboard];
    if b.standin.is_some() {
        targets.push(Target::Programs);
    }
    for t in targets {
        let dir = b.case_dir.join(match t {
            Target::Onboard => "onboard",
            Target::Programs => "simulator",
        });
        let files = diagnostics_on(b, t, &dir)?;
        done.push(format!("{} under {}", files.join(", "), dir.display()));
    }
    Ok(format!("parsed {}", done.join("; ")))
}

fn poison_then_recover(b: &mut Bench) -> Step<String> {
    let rt = b.runtime;
    if b.standin.is_none() {
        return Err(Fail::Skip(
            "poisoning on demand needs the stand-in; on a chip the hanging kernel poisons".into(),
        ));
    }
    let next = b.calls_of("rtKernelLaunchWithHandleV2") + 1;
    if let Some(install) = &b.standin {
        install
            .poison_at("rtKernelLaunchWithHandleV2", next, 507_899)
            .map_err(|e| Fail::Check(format!("arming the stand-in: {e}")))?;
    }
    let run = b.run_id();
    let r = b.runner()?;
    let step =
        run_program(r, run, Program::Add, (Target::Onboard, rt), &CallConfig::default(), false);
    let poisoned = failure_of(step, "the poisoned launch")?;
    check(!b.healthy(Target::Onboard), || format!("the device stayed healthy after {poisoned}"))?;
    b.recover(Target::Onboard)?;
    add_onboard(b)?;
    Ok(format!("poisoned ({poisoned}); finalize, re-attach, vector_add completed"))
}

fn hang_then_recover(b: &mut Bench) -> Step<String> {
    let rt = b.runtime;
    let t = b.kernel_target();
    if t == Target::Onboard {
        return hang_on_chip(b);
    }
    // The simulated hang runs on a runner of its own with short budgets, so the case takes
    // seconds whatever the batch's budgets are; the fresh runner after it has the batch's.
    if let Some(r) = b.sim.take() {
        r.finalize()?;
    }
    let short = b
        .sim_options()
        .with_scheduler_timeout(Duration::from_millis(300))
        .with_op_execute_timeout(Duration::from_micros(600_000))
        .with_stream_sync_timeout(Duration::from_millis(3_000));
    let r = b.sim.insert(DeviceRunner::attach(short)?);
    let faults =
        r.sim_faults().ok_or_else(|| Fail::Check("no fault plan on the simulator".into()))?;
    faults.kernel_hang(vector::ADD_SCALAR, 1);
    let run = b.run_id();
    let step = run_program(b.on(t)?, run, Program::Vector, (t, rt), &CallConfig::default(), false);
    let hung = failure_of(step, "the run with a hanging kernel")?;
    check(!b.healthy(t), || format!("the device stayed healthy after {hung}"))?;
    let note = b.recover(t)?;
    if let Some(n) = note {
        b.note(format!("finalize after the hang reported: {n}"));
    }
    let run = b.run_id();
    run_program(b.on(t)?, run, Program::Add, (t, rt), &CallConfig::default(), true)?;
    Ok(format!("hang → {hung}; finalize, re-attach, vector_add passed its golden check"))
}

/// The vector example with the manifest's hanging kernel in place of `add_scalar`: the
/// op-execute watchdog ends it and poisons the chip; finalize, re-attach, then `vector_add`
/// must pass its golden check on the fresh runner.
fn hang_on_chip(b: &mut Bench) -> Step<String> {
    let rt = b.runtime;
    let hang = simpler_onboard_programs::HANG_KERNEL;
    let kernels: Vec<_> = Program::Vector
        .kernels()
        .into_iter()
        .map(|(f, sig, name)| if f == hang.func_id { (f, sig, hang.name) } else { (f, sig, name) })
        .collect();
    let missing = code()
        .missing_with(Program::Vector, &kernels, rt)
        .or_else(|| code().missing_for(Program::Add, rt));
    if let Some(why) = missing {
        return Err(Fail::Skip(format!("the hanging kernel on a chip: {why}")));
    }
    let callable = Program::Vector.callable_with(Target::Onboard, rt, &kernels);
    let run = b.run_id();
    let step =
        run_callable(b.runner()?, run, Program::Vector, &callable, &CallConfig::default(), false);
    let hung = failure_of(step, "the run with the hanging kernel")?;
    check(!b.healthy(Target::Onboard), || format!("the chip stayed healthy after {hung}"))?;
    if let Some(n) = b.recover(Target::Onboard)? {
        b.note(format!("finalize after the hang reported: {n}"));
    }
    let run = b.run_id();
    let cfg = CallConfig::default();
    run_program(b.runner()?, run, Program::Add, (Target::Onboard, rt), &cfg, true)?;
    Ok(format!("hang → {hung}; finalize, re-attach, vector_add passed its golden check"))
}

type Case = fn(&mut Bench) -> Step<String>;

/// In order; fault-injection cases last.
const CASES: &[(&str, Case)] = &[
    ("acl_smoke", acl_smoke),
    ("attach_finalize_reattach", attach_finalize_reattach),
    ("vector_add", vector_add),
    ("vector_example", vector_example),
    ("launch_order", launch_order),
    ("runtime_error_fixtures", runtime_error_fixtures),
    ("diagnostics_smoke", diagnostics_smoke),
    ("poison_then_recover", poison_then_recover),
    ("hang_then_recover", hang_then_recover),
];

// ----- Device logs -----

/// Sizes of the files under a log directory when a case started.
struct LogMark {
    sizes: BTreeMap<PathBuf, u64>,
}

fn log_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(ft) if ft.is_dir() => dirs.push(p),
                Ok(ft) if ft.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out
}

impl LogMark {
    fn take(root: &Path) -> LogMark {
        let sizes = log_files(root)
            .into_iter()
            .filter_map(|p| Some((p.clone(), std::fs::metadata(&p).ok()?.len())))
            .collect();
        LogMark { sizes }
    }

    /// Copies what was appended under `root` since the mark into `dest`, keeping the relative
    /// paths; returns the bytes copied.
    fn copy_appended(&self, root: &Path, dest: &Path) -> std::io::Result<u64> {
        use std::io::{Read, Seek, SeekFrom};
        let mut copied = 0;
        for path in log_files(root) {
            let from = self.sizes.get(&path).copied().unwrap_or(0);
            let mut f = std::fs::File::open(&path)?;
            if f.metadata()?.len() <= from {
                continue;
            }
            f.seek(SeekFrom::Start(from))?;
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes)?;
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let target = dest.join(rel);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&target, &bytes)?;
            copied += bytes.len() as u64;
        }
        Ok(copied)
    }
}

// ----- Driver -----

fn json_line(v: serde_json::Value) {
    println!("{v}");
}

fn env(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

/// The host builds of the AICPU program and AICore executor a manifest names (relative paths
/// are relative to the manifest).
fn manifest_programs(manifest: &Path) -> Result<(&'static Path, &'static Path), String> {
    let v = manifest_json(manifest)?;
    let path = |name: &str| -> Result<&'static Path, String> {
        let p = v["artifacts"][name]["path"]
            .as_str()
            .ok_or_else(|| format!("{} names no {name}", manifest.display()))?;
        let p = manifest.parent().unwrap_or(Path::new(".")).join(p);
        Ok(Box::leak(p.into_boxed_path()))
    };
    Ok((path("aicpu_program")?, path("aicore_executor")?))
}

fn manifest_json(manifest: &Path) -> Result<serde_json::Value, String> {
    let text =
        std::fs::read_to_string(manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", manifest.display()))
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
    let (placeholders, manifest, programs) = match env("SIMPLER_ONBOARD_ARTIFACTS") {
        Some(m) => {
            let m = PathBuf::from(m);
            let programs = if standin { Some(manifest_programs(&m)?) } else { None };
            let _ = CODE.set(ManifestCode::read(&m)?);
            (None, m, programs)
        }
        None if standin => {
            let (d, m) = common::standin::placeholder_programs().map_err(|e| e.to_string())?;
            (Some(d), m, None)
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
        programs,
        _placeholders: placeholders,
        runner: None,
        sim: None,
        next_run: 0,
        seen: Vec::new(),
        case_dir: out.clone(),
        notes: Vec::new(),
    };
    Ok((bench, out, out_tmp))
}

/// How a case ended, as reported.
struct Report {
    status: &'static str,
    class: Option<String>,
    code: Option<(i32, &'static str)>,
    message: String,
    /// Failed only because the device was already poisoned (fast-fail): re-run after recovery.
    fast_fail: bool,
    /// The case left a device poisoned.
    poisoning: bool,
}

fn report_of(step: Step<String>) -> Report {
    let plain = |status, message| Report {
        status,
        class: None,
        code: None,
        message,
        fast_fail: false,
        poisoning: false,
    };
    match step {
        Ok(m) => plain("passed", m),
        Err(Fail::Skip(m)) => plain("skipped", m),
        // What this build cannot do on this backend yet is skipped with the cause.
        Err(Fail::Device(e @ DeviceError::Unsupported { .. })) => plain("skipped", e.to_string()),
        Err(Fail::Check(m)) => plain("failed", m),
        Err(Fail::Device(e)) => {
            let class = format!("{:?}", e.class());
            let code = e.device_code().map(|c| (c.code, c.name));
            Report {
                status: "failed",
                fast_fail: class == "Poisoned",
                poisoning: code.is_some_and(|(c, _)| POISON_CODES.contains(&c)),
                class: Some(class),
                code,
                message: e.to_string(),
            }
        }
    }
}

/// Runs one case with its output directory, host log and device-log copy; prints its lines.
fn run_case(b: &mut Bench, out: &Path, name: &str, case: Case, rerun: bool) -> Report {
    json_line(serde_json::json!({ "event": "start", "case": name }));
    let dir = out.join(name);
    let _ = std::fs::create_dir_all(&dir);
    b.case_dir = dir.clone();
    b.notes.clear();
    let log_root = env("ASCEND_PROCESS_LOG_PATH").map(PathBuf::from);
    let mark = log_root.as_deref().map(LogMark::take);
    let started = Instant::now();
    let r = report_of(case(b));
    let ms = started.elapsed().as_millis() as u64;
    let device_log = dir.join("device-log");
    let log_bytes = match (&log_root, &mark) {
        (Some(root), Some(mark)) => {
            let _ = std::fs::create_dir_all(&device_log);
            mark.copy_appended(root, &device_log).unwrap_or_else(|e| {
                b.note(format!("copying the device log failed: {e}"));
                0
            })
        }
        _ => 0,
    };
    let mut host = b.notes.join("\n");
    host.push_str(&format!("\n{}: {}\n", r.status, r.message));
    let _ = std::fs::write(dir.join("host.log"), host.trim_start());
    json_line(serde_json::json!({
        "event": "end", "case": name, "status": r.status, "ms": ms,
        "error_class": r.class, "error_code": r.code.map(|c| c.0), "error_name": r.code.map(|c| c.1),
        "message": r.message, "rerun": rerun, "dir": dir, "device_log_bytes": log_bytes,
    }));
    r
}

fn main() -> ExitCode {
    let (mut bench, out, _out_tmp) = match setup() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("onboard cases: {e}");
            return ExitCode::from(2);
        }
    };
    let budgets = match bench.onboard_options().resolve_timeouts() {
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
    for &(name, case) in CASES {
        if let Some(cause) = &quarantined {
            json_line(serde_json::json!({ "event": "start", "case": name }));
            let dir = out.join(name);
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(
                dir.join("host.log"),
                format!("skipped: device quarantined: {cause}\n"),
            );
            json_line(serde_json::json!({
                "event": "end", "case": name, "status": "skipped", "ms": 0,
                "message": format!("device quarantined: {cause}"), "dir": out.join(name),
            }));
            continue;
        }
        if hang.as_deref() == Some(name) {
            json_line(serde_json::json!({ "event": "start", "case": name }));
            loop {
                std::thread::park();
            }
        }
        let r = run_case(&mut bench, &out, name, case, false);
        failed |= r.status == "failed" && !r.fast_fail;
        if r.fast_fail {
            fast_failed.push((name, case));
        }
        // Poison handling: a device left unusable (or by a poisoning code) is finalized
        // (force reset) and re-attached; one that will not come back is quarantined.
        for t in [Target::Onboard, Target::Programs] {
            let attached = match t {
                Target::Onboard => bench.runner.is_some(),
                Target::Programs => bench.sim.is_some(),
            };
            if !attached || (bench.healthy(t) && !(r.poisoning && t == Target::Onboard)) {
                continue;
            }
            match bench.recover(t) {
                Err(e) => {
                    quarantined = Some(format!("{t:?} runner: {e}"));
                    failed = true;
                }
                Ok(_) => {
                    for (name, case) in std::mem::take(&mut fast_failed) {
                        let r = run_case(&mut bench, &out, name, case, true);
                        failed |= r.status == "failed";
                    }
                }
            }
        }
    }
    failed |= !fast_failed.is_empty();
    for r in [bench.runner.take(), bench.sim.take()].into_iter().flatten() {
        if let Err(e) = r.finalize() {
            eprintln!("onboard cases: the final finalize failed: {e}");
            failed = true;
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
