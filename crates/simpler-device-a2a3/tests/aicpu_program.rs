//! The built AICPU program (`simpler-aicpu-program`, host build) run by the simulator through
//! its C entries: the vector example on both the program and the compiled-in scheduler gives the
//! same result, and a program that cannot be loaded is refused at attach naming the file.
//!
//! The program's path comes from `SIMPLER_AICPU_PROGRAM` (`cargo xtask ci` builds it and sets
//! it). Without it the run test reports itself skipped, unless `SIMPLER_REQUIRE_AICPU_PROGRAM`
//! is set, which makes a missing program a failure.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use simpler_device_a2a3::{
    DeviceError, DeviceRunner, InitFailure, InitStep, ObjectError, RunRequest,
};
use simpler_types::{CallConfig, RunId, TaskArgs};

fn program() -> Option<&'static Path> {
    match std::env::var_os("SIMPLER_AICPU_PROGRAM") {
        Some(p) => Some(Box::leak(PathBuf::from(p).into_boxed_path())),
        None => {
            assert!(
                std::env::var_os("SIMPLER_REQUIRE_AICPU_PROGRAM").is_none(),
                "SIMPLER_REQUIRE_AICPU_PROGRAM is set but SIMPLER_AICPU_PROGRAM is not"
            );
            eprintln!("skipped: set SIMPLER_AICPU_PROGRAM to the built AICPU program");
            None
        }
    }
}

/// Options of a tensormap_and_ringbuffer runner on the built AICPU program, when there is one
/// ([`program`]).
fn trb_on_program() -> Option<simpler_device_a2a3::RunnerOptions> {
    let path = program()?;
    let o = options_on(0, simpler_device_a2a3::RuntimeVariant::TensormapAndRingbuffer);
    // SAFETY: `SIMPLER_AICPU_PROGRAM` names the host build of this workspace's AICPU program
    // (the test's opt-in, set by `cargo xtask ci`).
    Some(unsafe { o.with_aicpu_program(path) })
}

fn vector_run(r: &mut DeviceRunner, run: u64, cfg: &CallConfig) {
    let slot = r.register_callable(&vector_callable()).unwrap();
    let n = 4096;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let (pa, ta) = upload_f32(r, &a);
    let (pb, tb) = upload_f32(r, &b);
    let (pf, tf) = upload_f32(r, &vec![0.0; n]);
    let mut args = TaskArgs::new();
    args.add_input(ta).unwrap().add_input(tb).unwrap().add_output(tf).unwrap();
    r.run(&RunRequest::new(RunId::from_raw(run).unwrap(), slot, &args, cfg)).unwrap();
    let f = download_f32(r, pf, n);
    for p in [pa, pb, pf] {
        r.free(p).unwrap();
    }
    for i in 0..n {
        let s = a[i] + b[i];
        assert_eq!(f[i], (s + 1.0) * (s + 2.0) + s, "element {i}");
    }
    r.unregister_callable(slot).unwrap();
}

#[test]
fn the_vector_example_runs_through_the_built_programs_c_entries() {
    let Some(path) = program() else { return };
    // SAFETY: `SIMPLER_AICPU_PROGRAM` names the host build of this workspace's AICPU program
    // (the test's opt-in, set by `cargo xtask ci`).
    let mut r = DeviceRunner::attach(unsafe { options(0).with_aicpu_program(path) }).unwrap();
    for (run, threads) in (1..).zip([2, 3, 4]) {
        let cfg = CallConfig::builder().block_dim(2).aicpu_thread_num(threads).build().unwrap();
        vector_run(&mut r, run, &cfg);
    }
    r.finalize().unwrap();
}

#[test]
fn a_program_that_cannot_be_loaded_is_refused_naming_the_file() {
    let path: &'static Path = Path::new("/nonexistent/libsimpler_aicpu_program.so");
    // SAFETY: no object exists at the path, so nothing is loaded or called.
    let err = match DeviceRunner::attach(unsafe { options(0).with_aicpu_program(path) }) {
        Ok(mut r) => r.ensure_initialized().expect_err("a missing program was accepted"),
        Err(e) => e,
    };
    match &err {
        DeviceError::Init {
            step: InitStep::LoadPrograms,
            failure: InitFailure::Program(e),
            ..
        } => {
            assert!(matches!(&**e, ObjectError::Open { path: p, .. } if p == path), "{e}");
        }
        other => panic!("expected a LoadPrograms error, got {other:?}"),
    }
}

#[test]
fn a_c_orchestration_loads_through_the_programs_register_entry_and_runs() {
    use simpler_onboard_programs::VECTOR_ORCHESTRATION;
    let Some(o) = trb_on_program() else { return };
    let mut r = DeviceRunner::attach(o).unwrap();
    let (entry, config) = VECTOR_ORCHESTRATION;
    let c = c_vector_callable(entry, config);
    // Registered, run, unloaded and registered again: the unload left the slot loadable.
    for (run, threads) in (1..).zip([2, 3, 4]) {
        let slot = r.register_callable(&c).unwrap();
        let v = VectorRun::new(&mut r, 4096);
        let cfg = CallConfig::builder().block_dim(2).aicpu_thread_num(threads).build().unwrap();
        r.run(&RunRequest::new(RunId::from_raw(run).unwrap(), slot, &v.args, &cfg)).unwrap();
        v.check(&mut r);
        v.free(&mut r);
        r.unregister_callable(slot).unwrap();
    }
    // The program's own refusal comes back typed.
    match r.register_callable(&c_vector_callable("no_such_entry", config)) {
        Err(DeviceError::OrchestrationLoad {
            failure,
            cause: simpler_device_a2a3::OrchLoadCause::Refused { text },
            ..
        }) => {
            assert_eq!(failure, Some(simpler_device_a2a3::abi::launch::RegisterFailure::Symbol));
            assert!(text.contains("no_such_entry"), "{text}");
        }
        other => panic!("expected an OrchestrationLoad, got {other:?}"),
    }
    r.finalize().unwrap();
}

#[test]
fn a_native_orchestration_is_refused_under_the_built_program_as_on_the_device() {
    use simpler_device_a2a3::CallableProblem;
    let Some(o) = trb_on_program() else { return };
    let mut r = DeviceRunner::attach(o).unwrap();
    // Host code the program would call across its own, separately compiled frames.
    match r.register_callable(&vector_callable()) {
        Err(DeviceError::InvalidCallable {
            problem: CallableProblem::NativeOrchestrationOnDevice,
            ..
        }) => {}
        other => panic!("expected NativeOrchestrationOnDevice, got {other:?}"),
    }
    r.finalize().unwrap();
}

#[test]
fn two_runners_over_one_loaded_program_keep_their_orchestration_slots_apart() {
    use simpler_onboard_programs::VECTOR_ORCHESTRATION;
    let Some(o) = trb_on_program() else { return };
    let (mut first, mut second) =
        (DeviceRunner::attach(o.clone()).unwrap(), DeviceRunner::attach(o).unwrap());
    let (entry, config) = VECTOR_ORCHESTRATION;
    let c = c_vector_callable(entry, config);
    // Both take slot 0 of the one program this process loaded.
    let a = first.register_callable(&c).unwrap();
    let b = second.register_callable(&c).unwrap();
    assert_eq!((a.index(), b.index()), (0, 0));
    second.unregister_callable(b).unwrap();
    second.finalize().unwrap();
    // The second runner's load and unload left the first runner's object open.
    let v = VectorRun::new(&mut first, 4096);
    let cfg = CallConfig::default();
    first.run(&RunRequest::new(RunId::from_raw(1).unwrap(), a, &v.args, &cfg)).unwrap();
    v.check(&mut first);
    v.free(&mut first);
    first.unregister_callable(a).unwrap();
    first.finalize().unwrap();
}

#[test]
fn finalize_with_a_run_still_inside_an_orchestration_object_leaves_the_object_loaded() {
    use std::time::Duration;

    use simpler_onboard_programs::WAITING_ADD_ORCHESTRATION;
    let Some(o) = trb_on_program() else { return };
    let mut r = DeviceRunner::attach(o).unwrap();
    let (entry, config) = WAITING_ADD_ORCHESTRATION;
    let slot = r.register_callable(&c_vector_callable(entry, config)).unwrap();
    let v = VectorRun::new(&mut r, 1024);
    // The entry waits inside the object for its add task, which takes three seconds.
    r.sim_faults().unwrap().kernel_delay(FUNC_ADD, Duration::from_secs(3));
    let cfg = CallConfig::default();
    let p = r.prepare(&RunRequest::new(RunId::from_raw(1).unwrap(), slot, &v.args, &cfg)).unwrap();
    let active = r.launch_run(p).unwrap();
    // Until the add task is held (the orchestration submitted it), then a moment for the
    // orchestration to reach its wait for it: the run is still executing then.
    wait_fired(&r, |f| matches!(f, simpler_device_a2a3::FiredFault::KernelDelayed { .. }));
    std::thread::sleep(Duration::from_millis(100));
    assert!(!r.poll_run(&active).unwrap(), "the add task is still held");
    // Closing the object now would unmap the code the AICPU thread returns into once the
    // device reset ends its wait: the process would crash here.
    drop(active);
    let report = r.finalize().unwrap();
    assert_eq!(report.abandoned_run, Some(RunId::from_raw(1).unwrap()));
}
