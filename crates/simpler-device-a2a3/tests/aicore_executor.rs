//! The C++ AICore executor (the code written for the AICore), built for the host and run by
//! the simulated cores in place of the Rust executor: the vector example, a handshake failure,
//! a kernel fault and a hanging kernel behave as with the Rust executor.
//!
//! The executor is compiled once per test process with the host's C++ compiler.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::*;
use simpler_device_a2a3::{DeviceError, DeviceRunner, RunRequest};
use simpler_types::CallConfig;

fn executor() -> &'static Path {
    static BUILT: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let so = simpler_onboard_programs::build_host_executor(dir.path()).unwrap();
        (dir, so)
    });
    path
}

fn attach(fast: bool) -> DeviceRunner {
    let o = if fast { fast_options(0) } else { options(0) };
    // SAFETY: the host build of this workspace's C++ AICore executor, built by `executor`.
    DeviceRunner::attach(unsafe { o.with_aicore_executor(executor()) }).unwrap()
}

fn run_vector(r: &mut DeviceRunner, run: u64, cfg: &CallConfig) -> Result<(), DeviceError> {
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(r, 2048);
    let res = r.run(&RunRequest::new(run_id(run), slot, &v.args, cfg)).map(|_| ());
    if res.is_ok() {
        v.check(r);
    }
    v.free(r);
    r.unregister_callable(slot).unwrap();
    res
}

#[test]
fn the_vector_example_passes_on_the_cxx_executor_for_several_shapes() {
    let mut r = attach(false);
    let mut run = 1;
    for block_dim in [1, 3] {
        for threads in [2, 4] {
            let cfg = CallConfig::builder()
                .block_dim(block_dim)
                .aicpu_thread_num(threads)
                .build()
                .unwrap();
            run_vector(&mut r, run, &cfg).unwrap();
            run += 1;
        }
    }
    r.finalize().unwrap();
}

#[test]
fn a_bad_physical_core_id_from_the_cxx_executor_fails_the_handshake_and_recovers() {
    let mut r = attach(true);
    r.sim_faults().unwrap().handshake_fault(1, 80);
    let err = run_vector(&mut r, 1, &CallConfig::default()).unwrap_err();
    assert!(matches!(err, DeviceError::DeviceFault { .. }), "{err:?}");
    r.finalize().unwrap();
    let mut r = attach(true);
    run_vector(&mut r, 2, &CallConfig::default()).unwrap();
    r.finalize().unwrap();
}

#[test]
fn a_kernel_fault_under_the_cxx_executor_names_the_func_id() {
    let mut r = attach(true);
    r.sim_faults().unwrap().kernel_fault(FUNC_MUL, 1);
    let err = run_vector(&mut r, 1, &CallConfig::default()).unwrap_err();
    let text = format!("{err:?}");
    assert!(text.contains(&format!("func_id: Some({FUNC_MUL})")), "{text}");
    r.finalize().unwrap();
}

#[test]
fn a_hanging_kernel_under_the_cxx_executor_ends_by_the_watchdogs() {
    let mut r = attach(true);
    r.sim_faults().unwrap().kernel_hang(FUNC_ADD_SCALAR, 1);
    let err = run_vector(&mut r, 1, &CallConfig::default()).unwrap_err();
    let text = format!("{err:?}");
    assert!(
        text.contains("507014") || text.contains("AICORE_TIMEOUT") || text.contains("op-execute"),
        "{text}"
    );
    r.finalize().unwrap();
}
