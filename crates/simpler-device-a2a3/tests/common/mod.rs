//! Shared fixtures of the integration tests: kernels, the vector example program (the reference
//! one of `simpler_device_a2a3::programs`) and runner helpers.
#![allow(dead_code)]

pub mod diag;
#[cfg(feature = "onboard")]
pub mod standin;

use std::time::Duration;

pub use simpler_device_a2a3::programs::vector;
use simpler_device_a2a3::{
    ArgDirection, ChipCallable, CoreCallable, DevicePtr, DeviceRunner, KernelCall, OrchArgs,
    OrchConfig, RunnerOptions, RuntimeVariant,
};
use simpler_types::{DataType, Tensor};

pub const FUNC_ADD: u32 = vector::ADD;
pub const FUNC_ADD_SCALAR: u32 = vector::ADD_SCALAR;
pub const FUNC_MUL: u32 = vector::MUL;
pub const FUNC_NOOP: u32 = 3;

/// `c = a + b` over f32, as far as all three reach; nothing for a null or misaligned tensor.
/// For tasks on one block: each call takes the whole of `c`.
pub unsafe extern "C-unwind" fn add_kernel(args: *mut i64) {
    // SAFETY: the runtime passes a valid argument vector; the task has 3 tensors.
    let k = unsafe { KernelCall::from_raw(args, 3) };
    // SAFETY: the fixtures pass three f32 buffers and submit this kernel on one block, and the
    // runtimes refuse a task whose output (the kernel's third argument, whatever its tag)
    // overlaps another argument, so nothing else reads or writes `c`'s bytes meanwhile.
    let (Some(a), Some(b), Some(c)) =
        (unsafe { (k.slice::<f32>(0), k.slice::<f32>(1), k.slice_mut::<f32>(2)) })
    else {
        return;
    };
    for ((c, a), b) in c.iter_mut().zip(a).zip(b) {
        *c = a + b;
    }
}

/// Does nothing.
pub unsafe extern "C-unwind" fn noop_kernel(_args: *mut i64) {}

/// [`noop_kernel`] with `signature`.
pub fn noop_core(signature: Vec<ArgDirection>) -> CoreCallable {
    // SAFETY: `noop_kernel` reads no argument, so it suits every signature.
    unsafe { CoreCallable::native(signature, noop_kernel) }
}

/// Panics.
pub unsafe extern "C-unwind" fn panicking_kernel(_args: *mut i64) {
    panic!("kernel panicked on purpose");
}

pub fn three_args(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 3 }
}

/// The value [`stamp_then_add`] writes into its first argument before adding.
pub const STAMP: f32 = 100.0;

/// `a[..] = STAMP` through `set_tensor_data`, then `f = a + b` (the add program's task): an
/// orchestration that writes a user allocation, so its preparation waits for the launched runs
/// first.
pub fn stamp_then_add(
    ctx: &mut simpler_device_a2a3::OrchCtx<'_>,
    args: &OrchArgs<'_>,
) -> Result<(), simpler_device_a2a3::OrchError> {
    let a = *args.tensor(0).expect("three arguments");
    let bytes: Vec<u8> =
        std::iter::repeat_n(STAMP.to_ne_bytes(), a.numel() as usize).flatten().collect();
    ctx.set_tensor_data(&a, &bytes)?;
    simpler_device_a2a3::programs::add::orchestration(ctx, args)
}

/// The bytes `peek_then_add` read from its first argument, by run.
pub static PEEKED: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

/// Reads all of `a` through `tensor_data` into [`PEEKED`], then `f = a + b` (the add program's
/// task): an orchestration that reads a user allocation, so its preparation waits for the
/// launched runs first.
pub fn peek_then_add(
    ctx: &mut simpler_device_a2a3::OrchCtx<'_>,
    args: &OrchArgs<'_>,
) -> Result<(), simpler_device_a2a3::OrchError> {
    let a = *args.tensor(0).expect("three arguments");
    let mut bytes = vec![0u8; a.nbytes() as usize];
    ctx.tensor_data(&a, &mut bytes)?;
    *PEEKED.lock().unwrap() = bytes;
    simpler_device_a2a3::programs::add::orchestration(ctx, args)
}

/// The vector example's callable.
pub fn vector_callable() -> ChipCallable {
    vector::callable().unwrap()
}

/// The variable naming the chip runtime the shared suites run under: `hbg` (the default) or
/// `trb` (`cargo xtask test --runtime`).
pub const ENV_TEST_RUNTIME: &str = "SIMPLER_TEST_RUNTIME";

/// The chip runtime [`options`] and [`fast_options`] attach with, from [`ENV_TEST_RUNTIME`];
/// a name that is not a runtime stops the test with the variable named.
pub fn runtime_under_test() -> RuntimeVariant {
    match std::env::var(ENV_TEST_RUNTIME) {
        Ok(name) => name.parse().unwrap_or_else(|e| panic!("{ENV_TEST_RUNTIME}: {e}")),
        Err(_) => RuntimeVariant::HostBuildGraph,
    }
}

/// Options for tests that expect success: budgets generous enough that a loaded machine never
/// trips a watchdog (the environment is never read unless asked), on the runtime under test.
pub fn options(device_id: u32) -> RunnerOptions {
    options_on(device_id, runtime_under_test())
}

/// [`options`] on `runtime`, for tests that name their runtime.
pub fn options_on(device_id: u32, runtime: RuntimeVariant) -> RunnerOptions {
    with_built_programs(
        RunnerOptions::sim(device_id, runtime)
            .with_scheduler_timeout(Duration::from_millis(5_000))
            .with_op_execute_timeout(Duration::from_micros(10_000_000))
            .with_stream_sync_timeout(Duration::from_millis(30_000)),
    )
}

/// Applies the built device programs named by `SIMPLER_SIM_AICPU_PROGRAM` (the host build of
/// the AICPU program) and `SIMPLER_SIM_AICORE_EXECUTOR` (the host build of the C++ AICore
/// executor), so CI can run these suites on the code that ships (`cargo xtask ci`).
pub fn with_built_programs(mut o: RunnerOptions) -> RunnerOptions {
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;
    fn from_env(cell: &'static OnceLock<Option<PathBuf>>, var: &str) -> Option<&'static Path> {
        cell.get_or_init(|| std::env::var_os(var).map(PathBuf::from)).as_deref()
    }
    static PROGRAM: OnceLock<Option<PathBuf>> = OnceLock::new();
    static EXECUTOR: OnceLock<Option<PathBuf>> = OnceLock::new();
    if let Some(p) = from_env(&PROGRAM, "SIMPLER_SIM_AICPU_PROGRAM") {
        // SAFETY: the variable is this repository's test opt-in, which `cargo xtask ci` sets
        // to the AICPU program it has just built from this workspace for the host.
        o = unsafe { o.with_aicpu_program(p) };
    }
    if let Some(p) = from_env(&EXECUTOR, "SIMPLER_SIM_AICORE_EXECUTOR") {
        // SAFETY: as above, for the host build of the workspace's C++ AICore executor.
        o = unsafe { o.with_aicore_executor(p) };
    }
    o
}

/// Options with short budgets so failure tests stay fast, on the runtime under test.
pub fn fast_options(device_id: u32) -> RunnerOptions {
    fast_options_on(device_id, runtime_under_test())
}

/// [`fast_options`] on `runtime`, for tests that name their runtime.
#[allow(dead_code)]
pub fn fast_options_on(device_id: u32, runtime: RuntimeVariant) -> RunnerOptions {
    let mut o = RunnerOptions::sim(device_id, runtime)
        .with_scheduler_timeout(Duration::from_millis(300))
        .with_op_execute_timeout(Duration::from_micros(600_000))
        .with_stream_sync_timeout(Duration::from_millis(3_000))
        .with_shutdown_budget(Duration::from_millis(200));
    o.sim.join_budget = Duration::from_secs(5);
    with_built_programs(o)
}

/// A device f32 buffer of `n` elements filled with `values`.
pub fn upload_f32(r: &mut DeviceRunner, values: &[f32]) -> (DevicePtr, Tensor) {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let p = r.malloc(bytes.len() as u64).unwrap();
    r.copy_to_device(p, &bytes).unwrap();
    let t = Tensor::external(p.addr(), &[values.len() as u32], DataType::Float32)
        .unwrap()
        .child_memory(true);
    (p, t)
}

pub fn download_f32(r: &mut DeviceRunner, p: DevicePtr, n: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; n * 4];
    r.copy_from_device(&mut bytes, p).unwrap();
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// The host build of the C orchestration object (the vector example and its error fixtures),
/// compiled once per test process.
pub fn c_orchestrations() -> &'static [u8] {
    use std::sync::OnceLock;
    static OBJECT: OnceLock<Vec<u8>> = OnceLock::new();
    OBJECT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let so = simpler_onboard_programs::build_host_orchestrations(dir.path()).unwrap();
        std::fs::read(so).unwrap()
    })
}

/// The vector example's kernels around the C orchestration object's `entry` and `config`.
pub fn c_vector_callable(entry: &str, config: &str) -> ChipCallable {
    vector::builder_with(c_orchestration(entry, config)).build().unwrap()
}

/// [`c_orchestrations`] as a `DeviceObject` orchestration with `entry` and `config`.
pub fn c_orchestration(entry: &str, config: &str) -> simpler_device_a2a3::Orchestration {
    // SAFETY: the object is the project's own C orchestrations built for this host; its
    // functions have the orchestration ABI and touch only what the ops table hands out.
    let object = unsafe {
        simpler_device_a2a3::OrchestrationObject::new(c_orchestrations().to_vec(), entry, config)
    };
    simpler_device_a2a3::Orchestration::DeviceObject(object)
}

/// Device buffers and chip arguments of one vector-example run of `n` elements.
pub struct VectorRun {
    pub ptrs: [DevicePtr; 3],
    pub args: simpler_types::TaskArgs,
    pub a: Vec<f32>,
    pub b: Vec<f32>,
}

impl VectorRun {
    pub fn new(r: &mut DeviceRunner, n: usize) -> VectorRun {
        let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..n).map(|i| 3.0 - i as f32).collect();
        let (pa, ta) = upload_f32(r, &a);
        let (pb, tb) = upload_f32(r, &b);
        let (pf, tf) = upload_f32(r, &vec![0.0; n]);
        let mut args = simpler_types::TaskArgs::new();
        args.add_input(ta).unwrap().add_input(tb).unwrap().add_output(tf).unwrap();
        VectorRun { ptrs: [pa, pb, pf], args, a, b }
    }

    /// Checks the output against the host computation.
    pub fn check(&self, r: &mut DeviceRunner) {
        let f = download_f32(r, self.ptrs[2], self.a.len());
        let expected = vector::reference(&self.a, &self.b);
        assert_eq!(f.len(), expected.len());
        for (i, (f, e)) in f.iter().zip(&expected).enumerate() {
            assert_eq!(f, e, "element {i}");
        }
    }

    /// Zeroes the output, so that the next check sees only what the next run wrote.
    pub fn clear(&self, r: &mut DeviceRunner) {
        r.copy_to_device(self.ptrs[2], &vec![0u8; 4 * self.a.len()]).unwrap();
    }

    pub fn free(self, r: &mut DeviceRunner) {
        for p in self.ptrs {
            r.free(p).unwrap();
        }
    }
}

/// Waits (bounded) until the simulator's fault plan of `r` reports a fired fault `fired`
/// matches, such as a delayed kernel that has started.
pub fn wait_fired(r: &DeviceRunner, fired: impl Fn(&simpler_device_a2a3::FiredFault) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !r.sim_faults().expect("a simulated runner").fired().iter().any(&fired) {
        assert!(std::time::Instant::now() < deadline, "the fault never fired");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits (bounded) until every simulated thread of `r` is parked on its mailbox.
pub fn wait_all_parked(r: &DeviceRunner) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = r.stats();
        if s.sim_threads_parked == s.sim_threads_alive {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "threads still busy: {s:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub fn run_id(n: u64) -> simpler_types::RunId {
    simpler_types::RunId::from_raw(n).unwrap()
}

/// A fresh, empty directory for one test's outputs.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("simpler-device-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the vector example once with `cfg` on a fresh registration; returns the report.
pub fn vector_once(
    r: &mut DeviceRunner,
    run: u64,
    cfg: &simpler_types::CallConfig,
) -> simpler_device_a2a3::RunReport {
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(r, 1024);
    let rep =
        r.run(&simpler_device_a2a3::RunRequest::new(run_id(run), slot, &v.args, cfg)).unwrap();
    v.check(r);
    v.free(r);
    r.unregister_callable(slot).unwrap();
    rep
}

/// Builds the C source `src` into `dir/lib{name}.so` with the system C compiler (`CC`, else
/// `cc`); `None` (with a note) when there is no C compiler, so the calling test is skipped.
pub fn build_c_object(dir: &std::path::Path, name: &str, src: &str) -> Option<std::path::PathBuf> {
    let c = dir.join(format!("{name}.c"));
    let so = dir.join(format!("lib{name}.so"));
    std::fs::write(&c, src).unwrap();
    let out = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(&c)
        .output();
    match out {
        Ok(o) if o.status.success() => Some(so),
        Ok(o) => panic!("the C compiler failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("no C compiler ({e}); skipping the test that needs {name}");
            None
        }
    }
}

/// What `tracing` logs while `f` runs, as the `fmt` subscriber writes it.
pub fn logged(f: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("the log").extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).finish();
    tracing::subscriber::with_default(subscriber, f);
    let bytes = captured.0.lock().expect("the log").clone();
    String::from_utf8_lossy(&bytes).into_owned()
}
