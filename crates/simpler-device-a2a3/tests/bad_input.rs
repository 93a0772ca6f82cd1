//! Bad input gets a typed error naming the offending value, and the runner keeps working.

mod common;

use common::*;
use simpler_device_a2a3::{
    ChipCallable, ChipSlot, CoreCallable, DeviceError, DeviceRunner, Kernels, MemPurpose, OrchArgs,
    OrchConfig, OrchCtx, OrchError, RunRequest,
};
use simpler_types::{
    CallConfig, CoreArgs, DataType, RingSel, SwimlaneLevel, TaskArgs, Tensor, TypesError,
};

fn still_works(r: &mut DeviceRunner, run: u64) {
    vector_once(r, run, &CallConfig::default());
}

#[test]
fn an_unknown_slot_is_named() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let err = r
        .run(&RunRequest::new(
            run_id(1),
            ChipSlot::from_index(17),
            &TaskArgs::new(),
            &CallConfig::default(),
        ))
        .unwrap_err();
    assert!(matches!(err, DeviceError::UnknownCallable { slot: 17, run_id: Some(_) }), "{err}");
    assert!(err.to_string().contains("17"));
    still_works(&mut r, 2);
}

fn far_func_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    a.add_inout(*args.tensor(0).unwrap()).unwrap();
    ctx.submit(Kernels::Aiv(2000), &a)?;
    Ok(())
}

#[test]
fn a_submit_with_an_out_of_range_func_id_is_invalid_args() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let c = ChipCallable::native(far_func_orch, |_| OrchConfig::default())
        .kernel(FUNC_NOOP, CoreCallable::native(vec![], noop_kernel))
        .build()
        .unwrap();
    let slot = r.register_callable(&c).unwrap();
    let (p, t) = upload_f32(&mut r, &[0.0; 4]);
    let mut args = TaskArgs::new();
    args.add_inout(t).unwrap();
    let err = r.run(&RunRequest::new(run_id(1), slot, &args, &CallConfig::default())).unwrap_err();
    assert!(
        matches!(&err, DeviceError::InvalidArgs { message, .. } if message.contains("func id 2000")),
        "{err}"
    );
    r.free(p).unwrap();
    still_works(&mut r, 2);
}

#[test]
fn kernel_tasks_are_capped_at_32_tensors_and_16_scalars() {
    // The builder refuses the 33rd tensor and 17th scalar; raw ops-table callers are checked
    // again by the graph builder (unit tests of `runtime::hbg::builder`).
    let mut a = CoreArgs::new();
    let t = Tensor::external(0, &[1], DataType::Float32).unwrap();
    for _ in 0..32 {
        a.add_input(t).unwrap();
    }
    assert!(matches!(a.add_input(t), Err(TypesError::TooManyTensors { cap: 32 })));
    let mut s = CoreArgs::new();
    for _ in 0..16 {
        s.add_scalar(0).unwrap();
    }
    assert!(matches!(s.add_scalar(0), Err(TypesError::TooManyScalars { cap: 16 })));
}

#[test]
fn pointers_outside_device_memory_are_bad_device_pointers() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    // A view reaching past its allocation.
    let big = Tensor::with_buffer(v.ptrs[0].addr(), 64 * 4 + 4096, &[64], DataType::Float32)
        .unwrap()
        .child_memory(true);
    let mut args = TaskArgs::new();
    args.add_input(big).unwrap().add_input(big).unwrap().add_output(v.args.tensors()[2]).unwrap();
    let err = r.run(&RunRequest::new(run_id(1), slot, &args, &CallConfig::default())).unwrap_err();
    assert!(
        matches!(err, DeviceError::BadDevicePointer { len: 4352, run_id: Some(id), .. } if id == run_id(1)),
        "{err}"
    );
    // Host memory without the staging constructor.
    let host = vec![0f32; 64];
    let t = Tensor::external(host.as_ptr() as u64, &[64], DataType::Float32).unwrap();
    let mut args = TaskArgs::new();
    args.add_input(t).unwrap().add_input(t).unwrap().add_output(v.args.tensors()[2]).unwrap();
    let err = r.run(&RunRequest::new(run_id(2), slot, &args, &CallConfig::default())).unwrap_err();
    assert!(
        matches!(&err, DeviceError::InvalidArgs { message, .. } if message.contains("host memory")),
        "{err}"
    );
    v.free(&mut r);
    still_works(&mut r, 3);
}

#[test]
fn block_dim_and_thread_count_out_of_range_are_invalid_config() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    for (cfg, setting, value) in [
        (CallConfig::builder().block_dim(25).build().unwrap(), "CallConfig.block_dim", "25"),
        (
            CallConfig::builder().aicpu_thread_num(5).build().unwrap(),
            "CallConfig.aicpu_thread_num",
            "5",
        ),
    ] {
        let err = r.run(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap_err();
        match err {
            DeviceError::InvalidConfig { setting: s, value: val, .. } => {
                assert_eq!((s.as_str(), val.as_str()), (setting, value))
            }
            other => panic!("{other}"),
        }
    }
    v.free(&mut r);
    still_works(&mut r, 2);
}

#[test]
fn a_timeout_set_breaking_the_ordering_rules_is_refused_at_attach() {
    let o = options(0)
        .with_scheduler_timeout(std::time::Duration::from_millis(5_000))
        .with_op_execute_timeout(std::time::Duration::from_micros(1_000_000))
        .with_stream_sync_timeout(std::time::Duration::from_millis(60_000));
    match DeviceRunner::attach(o) {
        Err(DeviceError::InvalidConfig { setting, value, rule, .. }) => {
            assert_eq!(setting, "RunnerOptions.timeouts.op_execute");
            assert_eq!(value, "1000000");
            assert!(rule.contains("must exceed the scheduler budget"), "{rule}");
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    let r = DeviceRunner::attach(options(0)).unwrap();
    let t = r.timeouts().unwrap();
    assert_eq!(
        t.scheduler,
        std::time::Duration::from_millis(5_000),
        "the effective set is reported"
    );
}

#[test]
fn a_tensor_pointing_into_runtime_memory_is_refused() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default())).unwrap();
    // An address that is no longer a user allocation (freed, and possibly reused by the
    // runtime's own buffers) is refused, whoever owns it now.
    let p = r.malloc(4096).unwrap();
    r.free(p).unwrap();
    let stale = Tensor::external(p.addr(), &[64], DataType::Float32).unwrap().child_memory(true);
    let mut args = TaskArgs::new();
    args.add_input(stale).unwrap().add_input(stale).unwrap().add_output(stale).unwrap();
    let err = r.run(&RunRequest::new(run_id(2), slot, &args, &CallConfig::default())).unwrap_err();
    assert!(matches!(err, DeviceError::BadDevicePointer { .. }), "{err}");
    v.free(&mut r);
    still_works(&mut r, 3);
}

#[test]
fn a_diagnostic_switch_without_output_prefix_is_rejected_when_the_config_is_built() {
    let err = CallConfig::builder().swimlane(SwimlaneLevel::AicoreTiming).build().unwrap_err();
    assert!(matches!(err, TypesError::OutputPrefixRequired { .. }), "{err}");
}

#[test]
fn calls_out_of_order_are_busy() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    assert!(matches!(r.launch_run(), Err(DeviceError::Busy { call: "launch_run", .. })));
    assert!(matches!(r.reap_run(), Err(DeviceError::Busy { call: "reap_run", .. })));
    assert!(matches!(r.complete_run(), Err(DeviceError::Busy { call: "complete_run", .. })));
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let cfg = CallConfig::default();
    r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    assert!(matches!(
        r.prepare(&RunRequest::new(run_id(2), slot, &v.args, &cfg)),
        Err(DeviceError::Busy { call: "prepare", .. })
    ));
    assert!(matches!(r.reap_run(), Err(DeviceError::Busy { call: "reap_run", .. })));
    r.launch_run().unwrap();
    assert!(
        matches!(r.copy_to_device(v.ptrs[0], &[0; 4]), Err(DeviceError::Busy { .. })),
        "no copies under a launched run"
    );
    assert!(matches!(r.complete_run(), Err(DeviceError::Busy { .. })));
    r.reap_run().unwrap();
    r.complete_run().unwrap();
    v.check(&mut r);
    v.free(&mut r);
    still_works(&mut r, 3);
}

#[test]
fn host_tensors_are_staged_in_and_copied_back() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let n = 300;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let mut f = vec![0f32; n];
    let t =
        |v: &[f32]| Tensor::external(v.as_ptr() as u64, &[n as u32], DataType::Float32).unwrap();
    let mut args = TaskArgs::new();
    args.add_input(t(&a)).unwrap().add_input(t(&b)).unwrap().add_output(t(&f)).unwrap();
    let cfg = CallConfig::default();
    // SAFETY: the three vectors live until the end of the run and nothing else touches them.
    let req = unsafe { RunRequest::with_host_tensors(run_id(1), slot, &args, &cfg) };
    r.run(&req).unwrap();
    let f_copy = std::hint::black_box(&mut f).clone();
    for (i, v) in f_copy.iter().enumerate() {
        assert_eq!(*v, 2.0 * 3.0 + 1.0, "element {i}");
    }
    r.finalize().unwrap();
}

#[test]
fn free_is_refused_while_a_prepared_run_references_device_memory() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let cfg = CallConfig::default();
    r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    // The prepared image already holds the output's address; freeing it now would hand the
    // launch a dangling pointer.
    let err = r.free(v.ptrs[2]).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Busy { call: "free", state } if state.contains("prepared")),
        "{err}"
    );
    r.launch_run().unwrap();
    assert!(matches!(r.free(v.ptrs[2]), Err(DeviceError::Busy { call: "free", .. })));
    r.reap_run().unwrap();
    r.complete_run().unwrap();
    v.check(&mut r);
    // Once the run ended, and after an abandoned preparation, free works again.
    r.prepare(&RunRequest::new(run_id(2), slot, &v.args, &cfg)).unwrap();
    r.abandon_prepared().unwrap();
    v.free(&mut r);
    still_works(&mut r, 3);
}

#[test]
fn a_failed_heap_arena_allocation_releases_every_pooled_arena() {
    let mut o = options(0);
    o.sim.memory_limit = 32 << 20;
    let mut r = DeviceRunner::attach(o).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let small = CallConfig::builder().heap_bytes(RingSel::All, 1 << 20).build().unwrap();
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &small)).unwrap();
    assert!(r.stats().memory.pooled_arenas > 0, "the run pooled its heap and image arenas");
    let huge = CallConfig::builder().heap_bytes(RingSel::All, 64 << 20).build().unwrap();
    let err = r.run(&RunRequest::new(run_id(2), slot, &v.args, &huge)).unwrap_err();
    assert!(
        matches!(err, DeviceError::OutOfMemory { purpose: MemPurpose::HeapArena, .. }),
        "{err}"
    );
    assert_eq!(r.stats().memory.pooled_arenas, 0, "no arena stays pooled after the failure");
    r.run(&RunRequest::new(run_id(3), slot, &v.args, &small)).unwrap();
    v.check(&mut r);
    v.free(&mut r);
    r.finalize().unwrap();
}
