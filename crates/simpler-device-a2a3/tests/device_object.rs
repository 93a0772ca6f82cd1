//! `DeviceObject` orchestrations under tensormap_and_ringbuffer on the simulator: the vector
//! example written in C (`orch_abi.h`), built for the host and registered as an object, gives
//! the same bytes as the Rust orchestration at every shape; the AICPU side's refusals are
//! typed and leave the runner healthy; host_build_graph refuses an object.
//!
//! The built AICPU program's register entry runs the same object in `aicpu_program.rs`.

mod common;

use common::*;
use simpler_device_a2a3::abi::codes::RuntimeCode;
use simpler_device_a2a3::abi::launch::RegisterFailure;
use simpler_device_a2a3::programs::add;
use simpler_device_a2a3::{
    ChipCallable, DeviceError, DeviceRunner, ObjectError, OrchLoadCause, Orchestration,
    OrchestrationObject, RunRequest, RuntimeVariant,
};
use simpler_onboard_programs::{
    ADD_ORCHESTRATION, AIV_WITH_EXTRA_KERNELS, FAILING_ENTRY, FOUR_ARGS_CONFIG,
    VECTOR_ORCHESTRATION,
};
use simpler_types::{CallConfig, RunId};

const N: usize = 4096;

fn trb() -> DeviceRunner {
    DeviceRunner::attach(options_on(0, RuntimeVariant::TensormapAndRingbuffer)).unwrap()
}

/// The output bytes of one vector run of `callable` on `r` at `cfg`.
fn output_bytes(
    r: &mut DeviceRunner,
    run: u64,
    callable: &ChipCallable,
    cfg: &CallConfig,
) -> Vec<u8> {
    let slot = r.register_callable(callable).unwrap();
    let v = VectorRun::new(r, N);
    r.run(&RunRequest::new(RunId::from_raw(run).unwrap(), slot, &v.args, cfg)).unwrap();
    v.check(r);
    let mut out = vec![0u8; N * 4];
    r.copy_from_device(&mut out, v.ptrs[2]).unwrap();
    v.free(r);
    r.unregister_callable(slot).unwrap();
    out
}

fn shapes() -> impl Iterator<Item = CallConfig> {
    [(1, 2), (2, 3), (3, 4)]
        .into_iter()
        .map(|(b, t)| CallConfig::builder().block_dim(b).aicpu_thread_num(t).build().unwrap())
}

#[test]
fn the_c_vector_orchestration_gives_the_rust_ones_bytes_at_every_shape() {
    let mut r = trb();
    let (entry, config) = VECTOR_ORCHESTRATION;
    let c = c_vector_callable(entry, config);
    let native = vector_callable();
    for (i, cfg) in shapes().enumerate() {
        let run = 10 * i as u64;
        let from_c = output_bytes(&mut r, run + 1, &c, &cfg);
        let from_rust = output_bytes(&mut r, run + 2, &native, &cfg);
        assert!(from_c == from_rust, "shape {i}: the C orchestration's output differs");
    }
    r.finalize().unwrap();
}

#[test]
fn the_c_add_orchestration_adds() {
    let mut r = trb();
    let (entry, config) = ADD_ORCHESTRATION;
    let c = add::builder_with(c_orchestration(entry, config)).build().unwrap();
    let slot = r.register_callable(&c).unwrap();
    let v = VectorRun::new(&mut r, N);
    r.run(&RunRequest::new(RunId::from_raw(1).unwrap(), slot, &v.args, &CallConfig::default()))
        .unwrap();
    assert_eq!(download_f32(&mut r, v.ptrs[2], N), add::reference(&v.a, &v.b));
    v.free(&mut r);
    r.unregister_callable(slot).unwrap();
    r.finalize().unwrap();
}

#[test]
fn an_object_registered_twice_in_two_slots_runs_from_both() {
    let mut r = trb();
    let (entry, config) = VECTOR_ORCHESTRATION;
    let c = c_vector_callable(entry, config);
    let first = r.register_callable(&c).unwrap();
    let second = r.register_callable(&c).unwrap();
    assert_ne!(first, second);
    for (run, slot) in [(1, first), (2, second), (3, first)] {
        let v = VectorRun::new(&mut r, N);
        let cfg = CallConfig::default();
        r.run(&RunRequest::new(RunId::from_raw(run).unwrap(), slot, &v.args, &cfg)).unwrap();
        v.check(&mut r);
        v.free(&mut r);
    }
    r.unregister_callable(first).unwrap();
    r.unregister_callable(second).unwrap();
    r.finalize().unwrap();
}

/// Registers `c`, expecting an `OrchestrationLoad` with `failure`; returns its cause.
fn load_refusal(r: &mut DeviceRunner, c: &ChipCallable, failure: RegisterFailure) -> OrchLoadCause {
    match r.register_callable(c) {
        Err(DeviceError::OrchestrationLoad { failure: f, cause, entry, .. }) => {
            assert_eq!(f, Some(failure), "{entry}: {cause}");
            cause
        }
        other => panic!("expected an OrchestrationLoad {failure:?}, got {other:?}"),
    }
}

#[test]
fn objects_the_aicpu_side_cannot_load_are_refused_typed_and_the_runner_stays_usable() {
    let mut r = trb();
    let missing = c_vector_callable("no_such_entry", "vector_config");
    let m = load_refusal(&mut r, &missing, RegisterFailure::Symbol);
    assert!(
        matches!(&m, OrchLoadCause::Object(e)
            if matches!(&**e, ObjectError::MissingSymbol { symbol, .. } if symbol == "no_such_entry")),
        "{m}"
    );
    // SAFETY: the bytes are no object at all; the loader refuses them before running anything.
    let garbage = unsafe { OrchestrationObject::new(vec![0x5a; 512], "e", "c") };
    let garbage = vector::builder_with(Orchestration::DeviceObject(garbage)).build().unwrap();
    let m = load_refusal(&mut r, &garbage, RegisterFailure::Load);
    assert!(
        matches!(&m, OrchLoadCause::Object(e) if matches!(**e, ObjectError::Open { .. })),
        "{m}"
    );
    // Nothing leaked: every slot is still free, and the next registration runs.
    let before = r.stats();
    let (entry, config) = VECTOR_ORCHESTRATION;
    let out = output_bytes(&mut r, 1, &c_vector_callable(entry, config), &CallConfig::default());
    assert_eq!(out.len(), N * 4);
    assert_eq!(r.stats().registrations, before.registrations + 1);
    r.finalize().unwrap();
}

/// Runs `c` once, expecting a latched runtime error of `code`; returns its message.
fn run_fault(r: &mut DeviceRunner, run: u64, c: &ChipCallable, code: RuntimeCode) -> String {
    let slot = r.register_callable(c).unwrap();
    let v = VectorRun::new(r, N);
    let cfg = CallConfig::default();
    let err = r.run(&RunRequest::new(RunId::from_raw(run).unwrap(), slot, &v.args, &cfg));
    v.free(r);
    r.unregister_callable(slot).unwrap();
    match err {
        Err(DeviceError::Runtime { fault, .. }) => {
            assert_eq!(fault.code, code, "{fault:?}");
            fault.message.clone()
        }
        other => panic!("expected a runtime {code:?}, got {other:?}"),
    }
}

#[test]
fn a_c_config_asking_for_more_arguments_and_a_failing_c_entry_fail_the_run_typed() {
    let mut r = trb();
    let (entry, config) = VECTOR_ORCHESTRATION;
    let m =
        run_fault(&mut r, 1, &c_vector_callable(entry, FOUR_ARGS_CONFIG), RuntimeCode::InvalidArgs);
    assert!(m.contains("expects 4 arguments") && m.contains("got 3"), "{m}");
    let m = run_fault(
        &mut r,
        2,
        &c_vector_callable(FAILING_ENTRY, config),
        RuntimeCode::OrchestrationFatal,
    );
    assert!(m.contains("status 7"), "{m}");
    // The device stayed healthy: the vector example runs after both.
    assert!(r.health().is_healthy());
    output_bytes(&mut r, 3, &c_vector_callable(entry, config), &CallConfig::default());
    r.finalize().unwrap();
}

#[test]
fn an_aiv_task_naming_kernels_in_its_other_slots_is_invalid_args_not_a_hang() {
    let mut r = trb();
    // One AIV block runs one kernel: counting the other two as members would leave the task
    // waiting for dispatches that never come.
    let (entry, config) = AIV_WITH_EXTRA_KERNELS;
    let m = run_fault(&mut r, 1, &c_vector_callable(entry, config), RuntimeCode::InvalidArgs);
    assert!(m.contains("an AIV task needs exactly one AIV kernel"), "{m}");
    assert!(r.health().is_healthy());
    let (entry, config) = VECTOR_ORCHESTRATION;
    output_bytes(&mut r, 2, &c_vector_callable(entry, config), &CallConfig::default());
    r.finalize().unwrap();
}

#[test]
fn host_build_graph_refuses_a_device_object_orchestration() {
    let mut r = DeviceRunner::attach(options_on(0, RuntimeVariant::HostBuildGraph)).unwrap();
    let (entry, config) = VECTOR_ORCHESTRATION;
    match r.register_callable(&c_vector_callable(entry, config)) {
        Err(DeviceError::InvalidCallable {
            problem: simpler_device_a2a3::CallableProblem::DeviceObjectUnderHostBuildGraph { entry },
            ..
        }) => assert_eq!(entry, VECTOR_ORCHESTRATION.0),
        other => panic!("expected InvalidCallable, got {other:?}"),
    }
    r.finalize().unwrap();
}

#[test]
fn loading_or_closing_an_object_while_a_run_is_launched_is_busy() {
    let mut r = trb();
    let (entry, config) = VECTOR_ORCHESTRATION;
    let c = c_vector_callable(entry, config);
    let loaded = r.register_callable(&c).unwrap();
    let native = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, N);
    let cfg = CallConfig::default();
    let prepared = r.prepare(&RunRequest::new(RunId::from_raw(1).unwrap(), native, &v.args, &cfg));
    let active = r.launch_run(prepared.unwrap()).unwrap();
    for refused in [r.register_callable(&c).map(|_| ()), r.unregister_callable(loaded)] {
        match refused {
            Err(DeviceError::Busy { state, .. }) => assert!(state.contains("run#1"), "{state}"),
            other => panic!("expected Busy, got {other:?}"),
        }
    }
    r.reap_run(&active, None).unwrap();
    r.complete_run(active).unwrap();
    v.check(&mut r);
    v.free(&mut r);
    // Once the run is reaped both go through, and the object still runs.
    r.unregister_callable(loaded).unwrap();
    output_bytes(&mut r, 2, &c, &cfg);
    r.unregister_callable(native).unwrap();
    r.finalize().unwrap();
}
