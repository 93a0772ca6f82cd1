//! Bad input gets a typed error naming the offending value, and the runner keeps working.

mod common;

use common::*;
use simpler_device_a2a3::abi::codes::RuntimeCode;
use simpler_device_a2a3::programs;
use simpler_device_a2a3::{
    ArgDirection, ArgsProblem, ArityMismatch, ChipCallable, ChipSlot, CoreCallable, DeviceError,
    DeviceRunner, Kernels, MemPurpose, OrchArgs, OrchConfig, OrchCtx, OrchError, RunRequest,
    RuntimeVariant,
};
use simpler_types::{
    CallConfig, CoreArgs, DataType, RingSel, SwimlaneLevel, TaskArgs, Tensor, TypesError,
};

/// `orch` with the default config and the no-op kernel as `FUNC_NOOP`.
fn with_noop_kernel(orch: simpler_device_a2a3::NativeOrchFn) -> ChipCallable {
    ChipCallable::native(orch, |_| OrchConfig::default())
        .kernel(FUNC_NOOP, noop_core(vec![ArgDirection::InOut]))
        .build()
        .unwrap()
}

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
    let c = with_noop_kernel(far_func_orch);
    let slot = r.register_callable(&c).unwrap();
    let (p, t) = upload_f32(&mut r, &[0.0; 4]);
    let mut args = TaskArgs::new();
    args.add_inout(t).unwrap();
    let err = r.run(&RunRequest::new(run_id(1), slot, &args, &CallConfig::default())).unwrap_err();
    // host_build_graph refuses it while building the graph on the host; under
    // tensormap_and_ringbuffer the orchestration runs on the device, which latches INVALID_ARGS.
    let named = match &err {
        DeviceError::InvalidArgs {
            problem: ArgsProblem::FuncIdRange { func_id: 2000, limit: 1024, .. },
            ..
        } => true,
        DeviceError::Runtime { fault, .. } => {
            fault.code == RuntimeCode::InvalidArgs && fault.message.contains("func id 2000")
        }
        _ => false,
    };
    assert!(named, "{err}");
    r.free(p).unwrap();
    still_works(&mut r, 2);
}

/// A MIX task of three kernels whose block count, times its three members per block, wraps a
/// `u32` to 2: a runtime that multiplied unchecked would complete it after two of its billions
/// of members, and its consumers would run early.
fn wrapping_blocks_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    a.add_inout(*args.tensor(0).unwrap()).unwrap();
    let f = Some(FUNC_NOOP);
    ctx.submit_blocks(Kernels::Mix { aic: f, aiv0: f, aiv1: f }, &a, 0x5555_5556)?;
    Ok(())
}

fn one_block_too_many_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    a.add_inout(*args.tensor(0).unwrap()).unwrap();
    ctx.submit_blocks(Kernels::Aiv(FUNC_NOOP), &a, (1 << 16) + 1)?;
    Ok(())
}

#[test]
fn a_task_of_more_than_65536_blocks_is_invalid_args_on_either_runtime() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let (p, t) = upload_f32(&mut r, &[0.0; 4]);
    let mut args = TaskArgs::new();
    args.add_inout(t).unwrap();
    for (run, orch, blocks) in
        [(1, wrapping_blocks_orch as _, 1_431_655_766u32), (2, one_block_too_many_orch as _, 65537)]
    {
        let slot = r.register_callable(&with_noop_kernel(orch)).unwrap();
        let err =
            r.run(&RunRequest::new(run_id(run), slot, &args, &CallConfig::default())).unwrap_err();
        let named = match &err {
            DeviceError::InvalidArgs {
                problem: ArgsProblem::BlockNum { task: 0, block_num, max: 65536 },
                ..
            } => *block_num == blocks,
            DeviceError::Runtime { fault, .. } => {
                fault.code == RuntimeCode::InvalidArgs
                    && fault.message.contains(&blocks.to_string())
            }
            _ => false,
        };
        assert!(named, "block_num {blocks}: {err}");
    }
    r.free(p).unwrap();
    still_works(&mut r, 3);
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
    assert!(matches!(a.add_input(t), Err(TypesError::TooManyTensors { count: 33, cap: 32 })));
    let mut s = CoreArgs::new();
    for _ in 0..16 {
        s.add_scalar(0).unwrap();
    }
    assert!(matches!(s.add_scalar(0), Err(TypesError::TooManyScalars { count: 17, cap: 16 })));
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
        matches!(&err, DeviceError::InvalidArgs {
            problem: ArgsProblem::HostTensorRefused { arg: 0, addr },
            ..
        } if *addr == host.as_ptr() as u64),
        "{err}"
    );
    v.free(&mut r);
    still_works(&mut r, 3);
}

#[test]
fn a_malformed_tensor_descriptor_is_refused_with_the_rule_it_broke() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let mut bad = v.args.tensors()[1];
    bad.strides[0] = 0;
    let mut args = TaskArgs::new();
    args.add_input(v.args.tensors()[0]).unwrap();
    args.add_input(bad).unwrap();
    args.add_output(v.args.tensors()[2]).unwrap();
    let err = r.run(&RunRequest::new(run_id(1), slot, &args, &CallConfig::default())).unwrap_err();
    assert!(
        matches!(
            &err,
            DeviceError::InvalidTaskArgs {
                run_id: Some(id),
                arg: Some(1),
                source: TypesError::ZeroStride { dim: 0 },
            } if *id == run_id(1)
        ),
        "{err:?}"
    );
    v.free(&mut r);
    still_works(&mut r, 2);
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
fn an_output_prefix_that_cannot_be_created_is_refused_with_the_systems_error() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    // A directory under a regular file cannot be created.
    let file = std::env::temp_dir().join(format!("simpler-prefix-file-{}", std::process::id()));
    std::fs::write(&file, b"").unwrap();
    let prefix = file.join("out");
    let cfg = CallConfig::builder().dep_gen(true).output_prefix(&prefix).build().unwrap();
    let err = r.run(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap_err();
    let _ = std::fs::remove_file(&file);
    match &err {
        DeviceError::OutputDirectory { run_id: Some(id), path, source } => {
            assert_eq!((*id, path), (run_id(1), &prefix));
            assert_eq!(source.kind(), std::io::ErrorKind::NotADirectory, "{err}");
        }
        other => panic!("{other:?}"),
    }
    v.free(&mut r);
    still_works(&mut r, 2);
}

#[test]
fn calls_out_of_order_are_busy_and_a_full_set_of_slots_refuses_prepare() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    assert_eq!(r.pipeline_slots(), 2, "two resource slots by default");
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let cfg = CallConfig::default();
    let first = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    let second = r.prepare(&RunRequest::new(run_id(2), slot, &v.args, &cfg)).unwrap();
    assert_ne!(first.slot(), second.slot());
    assert!(matches!(
        r.prepare(&RunRequest::new(run_id(3), slot, &v.args, &cfg)),
        Err(DeviceError::Busy { call: "prepare", state }) if state.contains("all 2 resource slots")
    ));
    r.abandon(second).unwrap();
    let active = r.launch_run(first).unwrap();
    assert!(
        matches!(r.copy_to_device(v.ptrs[0], &[0; 4]), Err(DeviceError::Busy { .. })),
        "no copies under a launched run"
    );
    // The exclusive execution claim: a second launch while one is unreaped is refused.
    let third = r.prepare(&RunRequest::new(run_id(4), slot, &v.args, &cfg)).unwrap();
    assert!(matches!(r.launch_run(third), Err(DeviceError::Busy { call: "launch_run", .. })));
    assert!(r.reap_run(&active, None).unwrap());
    assert!(r.poll_run(&active).unwrap(), "a reaped run polls as done");
    r.complete_run(active).unwrap();
    v.check(&mut r);
    v.free(&mut r);
    still_works(&mut r, 5);
}

#[test]
fn a_handle_of_an_ended_run_is_stale_and_refused() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let cfg = CallConfig::default();
    let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    let a = r.launch_run(p).unwrap();
    assert!(r.reap_run(&a, None).unwrap());
    // A second runner's handle is refused by this one.
    let mut other = DeviceRunner::attach(options(0)).unwrap();
    let oslot = other.register_callable(&vector_callable()).unwrap();
    let ov = VectorRun::new(&mut other, 64);
    let op = other.prepare(&RunRequest::new(run_id(1), oslot, &ov.args, &cfg)).unwrap();
    assert!(matches!(r.abandon(op), Err(DeviceError::StaleRun { call: "abandon", .. })));
    r.complete_run(a).unwrap();
    // The same slot, a new generation: a lease kept from the first run would be stale; the
    // fresh one works.
    let p = r.prepare(&RunRequest::new(run_id(2), slot, &v.args, &cfg)).unwrap();
    assert_eq!(p.slot(), 0, "the lowest free slot is reused");
    r.abandon(p).unwrap();
    ov.free(&mut other);
    other.finalize().unwrap();
    v.free(&mut r);
    still_works(&mut r, 3);
}

/// The vector program's arguments `a`, `b` → `f` over host memory (for
/// `RunRequest::with_host_tensors`). The output is named through a pointer taken from a unique
/// borrow, since the runner writes it.
fn host_vector_args(a: &[f32], b: &[f32], f: &mut [f32]) -> TaskArgs {
    let shape = [f.len() as u32];
    let t = |addr: u64| Tensor::external(addr, &shape, DataType::Float32).unwrap();
    let mut args = TaskArgs::new();
    args.add_input(t(a.as_ptr() as u64)).unwrap();
    args.add_input(t(b.as_ptr() as u64)).unwrap();
    args.add_output(t(f.as_mut_ptr() as u64)).unwrap();
    args
}

#[test]
fn host_tensors_are_staged_in_and_copied_back() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let n = 300;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let mut f = vec![0f32; n];
    let args = host_vector_args(&a, &b, &mut f);
    let cfg = CallConfig::default();
    // SAFETY: the three vectors live until the end of the run and nothing else touches them.
    let req = unsafe { RunRequest::with_host_tensors(run_id(1), slot, &args, &cfg) };
    r.run(&req).unwrap();
    for (i, v) in f.iter().enumerate() {
        assert_eq!(*v, 2.0 * 3.0 + 1.0, "element {i}");
    }
    r.finalize().unwrap();
}

#[test]
fn views_of_one_host_tensor_share_one_staged_copy_and_only_written_bytes_come_back() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let n = 256u32;
    // One host tensor of 2n floats: the run reads its lower half (as `a`) and writes its upper
    // half; the lower half must come back as it was, not as the staging slice's old bytes.
    let mut x: Vec<f32> = (0..2 * n).map(|i| 7.0 + i as f32).collect();
    let b = vec![0.5f32; n as usize];
    let whole = Tensor::external(x.as_mut_ptr() as u64, &[2 * n], DataType::Float32).unwrap();
    let lo = whole.view(&[n], &[0]).unwrap();
    let hi = whole.view(&[n], &[n]).unwrap();
    let tb = Tensor::external(b.as_ptr() as u64, &[n], DataType::Float32).unwrap();
    let mut args = TaskArgs::new();
    args.add_input(lo).unwrap().add_input(tb).unwrap().add_output(hi).unwrap();
    let cfg = CallConfig::default();
    // A staging slice used before holds old bytes: run once over other data first.
    let mut scratch = vec![0f32; 2 * n as usize];
    let other = host_vector_args(&b, &b, &mut scratch[..n as usize]);
    // SAFETY: `b` and `scratch` live until the end of the run and nothing else touches them.
    r.run(&unsafe { RunRequest::with_host_tensors(run_id(1), slot, &other, &cfg) }).unwrap();
    // SAFETY: `x` and `b` live until the end of the run and nothing else touches them.
    r.run(&unsafe { RunRequest::with_host_tensors(run_id(2), slot, &args, &cfg) }).unwrap();
    for i in 0..n as usize {
        let a = 7.0 + i as f32;
        assert_eq!(x[i], a, "element {i} of the half only read");
        // The vector program: c = a + b, f = (c + 1)(c + 2) + c.
        let c = a + 0.5;
        assert_eq!(x[n as usize + i], (c + 1.0) * (c + 2.0) + c, "element {i} of the written half");
    }
    r.finalize().unwrap();
}

/// An orchestration that submits nothing: its outputs stay unwritten.
fn writes_nothing(_: &mut OrchCtx<'_>, _: &OrchArgs<'_>) -> Result<(), OrchError> {
    Ok(())
}

#[test]
fn an_unwritten_host_output_comes_back_as_zeros_not_as_an_earlier_runs_staged_bytes() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let vector = r.register_callable(&vector_callable()).unwrap();
    let idle = r.register_callable(&with_noop_kernel(writes_nothing)).unwrap();
    let n = 64;
    let (a, b) = (vec![3f32; n], vec![4f32; n]);
    let mut f = vec![0f32; n];
    let cfg = CallConfig::default();
    // The first run stages `a`, `b` and `f` in the slot's staging arena.
    let args = host_vector_args(&a, &b, &mut f);
    // SAFETY: the three vectors live until the end of the run and nothing else touches them.
    r.run(&unsafe { RunRequest::with_host_tensors(run_id(1), vector, &args, &cfg) }).unwrap();
    // The second declares an output over all of `out` and writes none of it.
    let mut out = vec![-1f32; n];
    let t = Tensor::external(out.as_mut_ptr() as u64, &[n as u32], DataType::Float32).unwrap();
    let mut args = TaskArgs::new();
    args.add_output(t).unwrap();
    // SAFETY: `out` lives until the end of the run and nothing else touches it.
    r.run(&unsafe { RunRequest::with_host_tensors(run_id(2), idle, &args, &cfg) }).unwrap();
    assert!(out.iter().all(|v| *v == 0.0), "{out:?}");
    r.finalize().unwrap();
}

#[test]
fn a_refused_copy_back_fails_the_run_naming_the_range() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let n = 64;
    let a = vec![1f32; n];
    let b = vec![2f32; n];
    let mut f = vec![0f32; n];
    let args = host_vector_args(&a, &b, &mut f);
    let cfg = CallConfig::default();
    r.sim_faults().unwrap().fail_read(1);
    // SAFETY: the three vectors live until the end of the run and nothing else touches them.
    let req = unsafe { RunRequest::with_host_tensors(run_id(1), slot, &args, &cfg) };
    let err = r.run(&req).unwrap_err();
    assert!(
        matches!(err, DeviceError::BadDevicePointer { run_id: Some(id), len, .. }
            if id == run_id(1) && len == 4 * n as u64),
        "{err}"
    );
    assert!(f.iter().all(|v| *v == 0.0), "stale host bytes were not passed off as output");
    still_works(&mut r, 2);
}

#[test]
fn free_is_refused_while_a_prepared_run_references_device_memory() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let cfg = CallConfig::default();
    let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    // The prepared image already holds the output's address; freeing it now would hand the
    // launch a dangling pointer.
    let err = r.free(v.ptrs[2]).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Busy { call: "free", state } if state.contains("prepared")),
        "{err}"
    );
    let a = r.launch_run(p).unwrap();
    assert!(matches!(r.free(v.ptrs[2]), Err(DeviceError::Busy { call: "free", .. })));
    r.reap_run(&a, None).unwrap();
    r.complete_run(a).unwrap();
    v.check(&mut r);
    // Once the run ended, and after an abandoned preparation, free works again.
    let p = r.prepare(&RunRequest::new(run_id(2), slot, &v.args, &cfg)).unwrap();
    r.abandon(p).unwrap();
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
    // Small windows and dep pools too, so that tensormap_and_ringbuffer's arena (task records
    // per window slot) fits the limit as well.
    let sized = |heap: u64| {
        CallConfig::builder()
            .heap_bytes(RingSel::All, heap)
            .task_window(RingSel::All, 64)
            .dep_pool(RingSel::All, 64)
            .build()
            .unwrap()
    };
    let small = sized(1 << 20);
    r.run(&RunRequest::new(run_id(1), slot, &v.args, &small)).unwrap();
    assert!(r.stats().memory.pooled_arenas > 0, "the run pooled its heap and image arenas");
    let huge = sized(64 << 20);
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

/// The error of run 1 of `args`, whose host tensors the runner must refuse before staging
/// touches their memory (they need not be readable).
fn refused_host_run(r: &mut DeviceRunner, slot: ChipSlot, args: &TaskArgs) -> DeviceError {
    let cfg = CallConfig::default();
    // SAFETY: every caller's tensors are refused before staging reads or writes them, which
    // the callers assert by the error they expect.
    let req = unsafe { RunRequest::with_host_tensors(run_id(1), slot, args, &cfg) };
    r.run(&req).expect_err("refused before staging")
}

#[test]
fn host_tensors_whose_staging_sizes_sum_past_u64_are_invalid_args() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let (a, b, f) = (vec![0f32; 4], vec![0f32; 4], vec![0f32; 4]);
    let host = |v: &[f32], size: u64| {
        let mut t = Tensor::external(v.as_ptr() as u64, &[4], DataType::Float32).unwrap();
        t.size = size;
        t
    };
    // Two outputs of 2^63 bytes each: each is a valid tensor, their staging sizes would sum
    // past u64::MAX, and their ranges overlap the input's and each other's (no two such ranges
    // can be apart; which argument is named depends on where the vectors are). They are refused
    // before anything is staged, so no host byte beyond the vectors is touched.
    let mut args = TaskArgs::new();
    args.add_input(host(&a, 16)).unwrap();
    args.add_output(host(&b, 1 << 63)).unwrap();
    args.add_output(host(&f, 1 << 63)).unwrap();
    let err = refused_host_run(&mut r, slot, &args);
    assert!(
        matches!(
            &err,
            DeviceError::InvalidArgs { problem: ArgsProblem::HostRangeOverlap { .. }, .. }
        ),
        "{err}"
    );
    still_works(&mut r, 2);
}

#[test]
fn a_host_tensor_whose_staging_size_passes_u64_names_its_argument() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let (a, b) = (vec![0f32; 4], vec![0f32; 4]);
    let at = |v: &[f32]| Tensor::external(v.as_ptr() as u64, &[4], DataType::Float32).unwrap();
    // A range of 2^64 − 257 bytes from address 256 fits the address space, but its staging
    // slice, rounded up to whole KiB, would not fit a u64.
    let huge = Tensor::with_buffer(256, u64::MAX - 256, &[4], DataType::Float32).unwrap();
    // First, so that no earlier range overlaps it (a range that large overlaps every other).
    let mut args = TaskArgs::new();
    args.add_input(huge).unwrap();
    args.add_input(at(&a)).unwrap();
    args.add_output(at(&b)).unwrap();
    let err = refused_host_run(&mut r, slot, &args);
    assert!(
        matches!(
            &err,
            DeviceError::InvalidArgs {
                problem: ArgsProblem::StagingOverflow { arg: 0, addr: 256, .. },
                ..
            }
        ),
        "{err}"
    );
    still_works(&mut r, 2);
}

#[test]
fn device_arguments_overlapping_under_two_base_addresses_are_refused_naming_both() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let (p, whole) = upload_f32(&mut r, &[0.0; 64]);
    // Bytes 64.. of the same allocation, as a buffer of its own: the runtimes order accesses
    // by base address, so its accesses would never meet the whole buffer's.
    let inner = Tensor::with_buffer(whole.addr + 64, 192, &[48], DataType::Float32)
        .unwrap()
        .child_memory(true);
    let mut args = TaskArgs::new();
    args.add_input(whole).unwrap();
    args.add_input(whole).unwrap();
    args.add_output(inner).unwrap();
    let err = r.run(&RunRequest::new(run_id(1), slot, &args, &CallConfig::default())).unwrap_err();
    let want = ArgsProblem::DeviceBaseAlias {
        arg: 2,
        addr: whole.addr + 64,
        other_arg: 0,
        other_addr: whole.addr,
    };
    assert!(matches!(&err, DeviceError::InvalidArgs { problem, .. } if *problem == want), "{err}");
    r.free(p).unwrap();
    still_works(&mut r, 2);
}

/// Chip argument 0 from its 65th byte on, as a buffer of its own.
fn inside_argument_0(args: &OrchArgs<'_>) -> Tensor {
    let e = *args.tensor(0).unwrap();
    Tensor::with_buffer(e.addr + 64, e.size - 64, &[16], DataType::Float32)
        .unwrap()
        .child_memory(e.is_child_memory())
}

fn submits_inside_an_argument_orch(
    ctx: &mut OrchCtx<'_>,
    args: &OrchArgs<'_>,
) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    a.add_inout(*args.tensor(0).unwrap()).unwrap();
    ctx.submit(Kernels::Aiv(FUNC_NOOP), &a)?;
    let mut b = CoreArgs::new();
    b.add_inout(inside_argument_0(args)).unwrap();
    ctx.submit(Kernels::Aiv(FUNC_NOOP), &b)?;
    Ok(())
}

fn writes_inside_an_argument_orch(
    ctx: &mut OrchCtx<'_>,
    args: &OrchArgs<'_>,
) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    a.add_inout(*args.tensor(0).unwrap()).unwrap();
    ctx.submit(Kernels::Aiv(FUNC_NOOP), &a)?;
    ctx.set_tensor_data(&inside_argument_0(args), &[0; 64])?;
    Ok(())
}

#[test]
fn a_tensor_based_inside_a_chip_argument_is_refused_by_submit_and_set_tensor_data() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let cases: [(simpler_device_a2a3::NativeOrchFn, Option<u64>, &str); 2] = [
        (submits_inside_an_argument_orch, Some(1), "submit"),
        (writes_inside_an_argument_orch, None, "set_tensor_data"),
    ];
    for (run, (orch, task, op)) in (1..).zip(cases) {
        let slot = r.register_callable(&with_noop_kernel(orch)).unwrap();
        let (p, t) = upload_f32(&mut r, &[0.0; 32]);
        let mut args = TaskArgs::new();
        args.add_inout(t).unwrap();
        let err =
            r.run(&RunRequest::new(run_id(run), slot, &args, &CallConfig::default())).unwrap_err();
        // host_build_graph refuses it while building; tensormap_and_ringbuffer's orchestration
        // latches INVALID_ARGS on the device.
        let named = match &err {
            DeviceError::InvalidArgs {
                problem: ArgsProblem::EntryBaseAlias { task: got, addr, entry_addr, .. },
                ..
            } => *got == task && *addr == t.addr + 64 && *entry_addr == t.addr,
            DeviceError::Runtime { fault, .. } => {
                fault.code == RuntimeCode::InvalidArgs
                    && fault.message.contains("a view of an argument buffer")
            }
            _ => false,
        };
        assert!(named, "{op}: {err}");
        r.free(p).unwrap();
    }
    still_works(&mut r, 10);
}

#[test]
fn a_run_id_already_used_on_the_runner_is_refused_and_origins_keep_tasks_apart() {
    use simpler_types::TaskId;
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let cfg = CallConfig::default();
    vector_once(&mut r, 1, &cfg);
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let err = r.run(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap_err();
    assert!(
        matches!(err, DeviceError::RunIdReused { run_id: id, origin: None } if id == run_id(1)),
        "{err}"
    );
    assert!(err.to_string().contains("run#1"), "{err}");
    // A prepare refused before the run existed (an unknown slot) leaves its id free.
    let unknown = ChipSlot::from_index(60);
    let err = r.run(&RunRequest::new(run_id(7), unknown, &v.args, &cfg)).unwrap_err();
    assert!(matches!(err, DeviceError::UnknownCallable { .. }), "{err}");
    r.run(&RunRequest::new(run_id(7), slot, &v.args, &cfg)).unwrap();
    // The tasks of one engine run share its id and differ by origin.
    let task = |seq| TaskId::new(run_id(9), seq);
    r.run(&RunRequest::new(run_id(9), slot, &v.args, &cfg).with_origin(task(0))).unwrap();
    r.run(&RunRequest::new(run_id(9), slot, &v.args, &cfg).with_origin(task(1))).unwrap();
    let err =
        r.run(&RunRequest::new(run_id(9), slot, &v.args, &cfg).with_origin(task(1))).unwrap_err();
    assert!(matches!(err, DeviceError::RunIdReused { origin: Some(t), .. } if t == task(1)));
    v.check(&mut r);
    v.free(&mut r);
    r.finalize().unwrap();
}

#[test]
fn a_task_writing_bytes_another_of_its_arguments_names_is_refused_naming_both() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let c = simpler_device_a2a3::programs::add::builder().build().unwrap();
    let slot = r.register_callable(&c).unwrap();
    let (pa, ta) = upload_f32(&mut r, &[1.0; 64]);
    let (pb, tb) = upload_f32(&mut r, &[2.0; 64]);
    let cfg = CallConfig::default();
    // The output equal to input 0; then the output a view overlapping half of input 1.
    let half = tb.view(&[32], &[16]).unwrap();
    for (n, (x, y, out, other)) in [(ta, tb, ta, 0usize), (ta, tb, half, 1)].into_iter().enumerate()
    {
        let mut args = TaskArgs::new();
        args.add_input(x).unwrap().add_input(y).unwrap().add_output(out).unwrap();
        let err = r.run(&RunRequest::new(run_id(1 + n as u64), slot, &args, &cfg)).unwrap_err();
        assert!(
            matches!(err, DeviceError::OverlappingArguments { task: 0, written: 2, other: o, .. } if o == other),
            "case {n}: {err}"
        );
        assert!(
            err.to_string().contains("tensor 2")
                && err.to_string().contains(&format!("tensor {other}"))
        );
    }
    // Adjacent, disjoint halves of one buffer are fine.
    let (lo, hi) = (ta.view(&[32], &[0]).unwrap(), ta.view(&[32], &[32]).unwrap());
    let mut args = TaskArgs::new();
    args.add_input(lo)
        .unwrap()
        .add_input(tb.view(&[32], &[0]).unwrap())
        .unwrap()
        .add_output(hi)
        .unwrap();
    r.run(&RunRequest::new(run_id(3), slot, &args, &cfg)).unwrap();
    let f = download_f32(&mut r, pa, 64);
    assert!(f[..32].iter().all(|&x| x == 1.0) && f[32..].iter().all(|&x| x == 3.0), "{f:?}");
    r.free(pa).unwrap();
    r.free(pb).unwrap();
    still_works(&mut r, 4);
}

/// Two good `c = a + b` tasks, then `a = a + b`: the third task writes its own input.
fn third_task_overlaps_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let (a, b, c) = (*args.tensor(0).unwrap(), *args.tensor(1).unwrap(), *args.tensor(2).unwrap());
    for out in [c, c, a] {
        let mut t = CoreArgs::new();
        t.add_input(a).unwrap();
        t.add_input(b).unwrap();
        t.add_output(out).unwrap();
        ctx.submit(Kernels::Aiv(FUNC_ADD), &t)?;
    }
    Ok(())
}

/// Runs `orch` (over the add kernel) once on a fresh runner, checks that it fails with the
/// `OverlappingArguments` `want` says (task, written, other), and that the runner still works.
fn overlap_of(orch: simpler_device_a2a3::NativeOrchFn, want: (u64, usize, usize)) {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    // SAFETY: `add_kernel` reads two input tensors and writes one output.
    let add = unsafe {
        CoreCallable::native(
            vec![ArgDirection::In, ArgDirection::In, ArgDirection::Out],
            add_kernel,
        )
    };
    let c = ChipCallable::native(orch, three_args).kernel(FUNC_ADD, add).build().unwrap();
    let slot = r.register_callable(&c).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let err =
        r.run(&RunRequest::new(run_id(1), slot, &v.args, &CallConfig::default())).unwrap_err();
    assert!(
        matches!(err, DeviceError::OverlappingArguments { task, written, other, .. }
            if (task, written, other) == want),
        "{err}"
    );
    v.free(&mut r);
    still_works(&mut r, 2);
}

/// The refusal names the task by its index in submission order under both runtimes (under
/// tensormap_and_ringbuffer the index travels from the device in the fault cells).
#[test]
fn an_overlapping_task_after_good_ones_is_named_by_its_submission_index() {
    overlap_of(third_task_overlaps_orch, (2, 2, 0));
}

fn untracked_output_over_an_input_orch(
    ctx: &mut OrchCtx<'_>,
    args: &OrchArgs<'_>,
) -> Result<(), OrchError> {
    let (a, b) = (*args.tensor(0).unwrap(), *args.tensor(1).unwrap());
    let mut t = CoreArgs::new();
    t.add_no_dep(a).unwrap().add_input(b).unwrap().add_no_dep(a).unwrap();
    ctx.submit(Kernels::Aiv(FUNC_ADD), &t)?;
    Ok(())
}

/// `NoDep` fits any argument of a kernel, an output's too, but the kernel still writes that
/// argument: passing the bytes it writes as an input too is refused as any such overlap is,
/// whatever the tags say.
#[test]
fn an_untracked_tensor_in_an_outputs_place_overlapping_an_input_is_refused() {
    overlap_of(untracked_output_over_an_input_orch, (0, 2, 0));
}

fn reports_the_overlap_code_orch(ctx: &mut OrchCtx<'_>, _: &OrchArgs<'_>) -> Result<(), OrchError> {
    ctx.report_fatal(RuntimeCode::OverlappingArguments.raw(), "the orchestration's own words");
    Ok(())
}

/// Only the runtime writes an overlap's detail: an orchestration reporting that code itself
/// gets its own fatal error with its message, never an `OverlappingArguments` of zeros.
#[test]
fn an_orchestration_reporting_the_overlap_code_is_its_own_fatal_error() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let c = with_noop_kernel(reports_the_overlap_code_orch);
    let slot = r.register_callable(&c).unwrap();
    let err = r
        .run(&RunRequest::new(run_id(1), slot, &TaskArgs::new(), &CallConfig::default()))
        .unwrap_err();
    assert!(
        matches!(&err, DeviceError::Runtime { fault, .. }
            if fault.code == RuntimeCode::OrchestrationFatal
                && fault.message.contains("the orchestration's own words")),
        "{err}"
    );
    still_works(&mut r, 2);
}

#[test]
fn zero_element_chip_tensors_are_empty_views_the_kernels_see_as_empty() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 16);
    let cfg = CallConfig::default();
    // Device tensors with a zero-length dimension over real allocations: the run succeeds and
    // writes nothing.
    let empty = |i: usize| {
        let t = v.args.tensors()[i];
        t.view(&[0], &[0]).unwrap()
    };
    let mut args = TaskArgs::new();
    args.add_input(empty(0)).unwrap().add_input(empty(1)).unwrap().add_output(empty(2)).unwrap();
    r.run(&RunRequest::new(run_id(1), slot, &args, &cfg)).unwrap();
    assert_eq!(
        download_f32(&mut r, v.ptrs[2], 16),
        vec![0.0; 16],
        "an empty output is not written"
    );
    // Host tensors of zero elements stage nothing and copy nothing back.
    let (a, b, f) = (vec![1f32; 4], vec![2f32; 4], vec![5f32; 4]);
    let host = |x: &[f32]| Tensor::external(x.as_ptr() as u64, &[0], DataType::Float32).unwrap();
    let mut args = TaskArgs::new();
    args.add_input(host(&a)).unwrap().add_input(host(&b)).unwrap().add_output(host(&f)).unwrap();
    // SAFETY: the vectors outlive the run and nothing else touches them.
    let req = unsafe { RunRequest::with_host_tensors(run_id(2), slot, &args, &cfg) };
    r.run(&req).unwrap();
    assert_eq!(std::hint::black_box(&f).clone(), vec![5f32; 4]);
    v.free(&mut r);
    still_works(&mut r, 3);
}

#[test]
fn a_failed_kernel_argument_allocation_is_out_of_memory_for_the_runtime_not_an_init_failure() {
    let small = CallConfig::builder()
        .heap_bytes(RingSel::All, 1 << 20)
        .task_window(RingSel::All, 64)
        .dep_pool(RingSel::All, 64)
        .build()
        .unwrap();
    // What a first run commits, measured on a runner without a tight limit: the kernel argument
    // block is the last allocation of a slot's first run.
    let committed = {
        let mut r = DeviceRunner::attach(options(0)).unwrap();
        let slot = r.register_callable(&vector_callable()).unwrap();
        let v = VectorRun::new(&mut r, 64);
        r.run(&RunRequest::new(run_id(1), slot, &v.args, &small)).unwrap();
        let committed = r.stats().memory.committed;
        v.free(&mut r);
        r.finalize().unwrap();
        committed
    };
    let mut o = options(0);
    o.sim.memory_limit = committed - 1;
    let mut r = DeviceRunner::attach(o).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 64);
    let err = r.run(&RunRequest::new(run_id(1), slot, &v.args, &small)).unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::OutOfMemory { run_id: Some(run), purpose: MemPurpose::Runtime, .. }
                if run == run_id(1)
        ),
        "{err:?}"
    );
    assert_eq!(r.health(), simpler_device_a2a3::DeviceHealth::Healthy, "nothing ran");
    v.free(&mut r);
    r.finalize().unwrap();
}

/// Submits the reference `add` kernel (three tensors: in, in, out) with no tensors and three
/// scalars that hold the addresses of host descriptors.
fn scalars_as_descriptors_orch(
    ctx: &mut OrchCtx<'_>,
    args: &OrchArgs<'_>,
) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    for j in 0..3 {
        a.add_scalar(args.scalar(j).unwrap()).unwrap();
    }
    ctx.submit(Kernels::Aiv(programs::add::ADD), &a)?;
    Ok(())
}

/// Tags the output of the reference `add` kernel as an input.
fn output_tagged_input_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    for i in 0..3 {
        a.add_input(*args.tensor(i).unwrap()).unwrap();
    }
    ctx.submit(Kernels::Aiv(programs::add::ADD), &a)?;
    Ok(())
}

/// A kernel tells its descriptor slots from its scalar slots by its signature alone: a task
/// that passes scalars where the signature declares tensors would have the kernel take them for
/// descriptor addresses (here of host memory the runtime was never given), and an output tagged
/// as an input would be written while readers run beside it. Both runtimes refuse such tasks.
#[test]
fn a_task_whose_arguments_do_not_match_its_kernels_signature_is_refused_before_it_runs() {
    use simpler_device_a2a3::Orchestration;
    use simpler_device_a2a3::programs::add;

    let three = |_: &OrchArgs<'_>| OrchConfig { expected_arg_count: 3 };
    for runtime in [RuntimeVariant::HostBuildGraph, RuntimeVariant::TensormapAndRingbuffer] {
        let mut r = DeviceRunner::attach(options_on(0, runtime)).unwrap();
        // Host memory never handed to the runtime, described by host descriptors.
        let source = [1.5f32; 16];
        let mut victim = [0f32; 16];
        let x =
            Box::new(Tensor::external(source.as_ptr() as u64, &[16], DataType::Float32).unwrap());
        let out = Box::new(
            Tensor::external(victim.as_mut_ptr() as u64, &[16], DataType::Float32).unwrap(),
        );
        let entry = Orchestration::Native { entry: scalars_as_descriptors_orch, config: three };
        let c = add::builder_with(entry).names("scalars", "scalars_config").build().unwrap();
        let slot = r.register_callable(&c).unwrap();
        let mut args = TaskArgs::new();
        for d in [&*x, &*x, &*out] {
            args.add_scalar(d as *const Tensor as u64).unwrap();
        }
        let err = r.run(&RunRequest::new(run_id(1), slot, &args, &CallConfig::default()));
        let want = ArityMismatch::Counts { func_id: 0, declared: (3, 0), passed: (0, 3) };
        assert!(refused_for(&err, want), "{runtime:?}: {err:?}");
        assert!(victim.iter().all(|&v| v == 0.0), "{runtime:?}: the kernel wrote {victim:?}");
        // The output tagged as an input.
        let entry = Orchestration::Native { entry: output_tagged_input_orch, config: three };
        let c = add::builder_with(entry).names("tags", "tags_config").build().unwrap();
        let slot = r.register_callable(&c).unwrap();
        let v = VectorRun::new(&mut r, 16);
        let err = r.run(&RunRequest::new(run_id(2), slot, &v.args, &CallConfig::default()));
        let tag = simpler_types::TensorArgType::Input;
        let want = ArityMismatch::Tag { func_id: 0, index: 2, tag, written: true };
        assert!(refused_for(&err, want), "{runtime:?}: {err:?}");
        v.free(&mut r);
        still_works(&mut r, 3);
        r.finalize().unwrap();
    }
}

/// Whether `res` is the invalid-arguments refusal of either runtime for `mismatch`: typed on
/// host_build_graph, in the latched message of the device-side orchestration otherwise.
fn refused_for<T>(res: &Result<T, DeviceError>, mismatch: ArityMismatch) -> bool {
    match res {
        Err(DeviceError::InvalidArgs { problem: ArgsProblem::Arity { source, .. }, .. }) => {
            *source == mismatch
        }
        Err(DeviceError::Runtime { fault, .. }) => {
            fault.code == RuntimeCode::InvalidArgs && fault.message.contains(&mismatch.to_string())
        }
        _ => false,
    }
}

#[test]
fn a_null_output_is_refused_unless_it_has_no_elements() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&programs::add::callable().unwrap()).unwrap();
    let cfg = CallConfig::default();
    let args = |shape: &[u32]| {
        let null = Tensor::external(0, shape, DataType::Float32).unwrap();
        let mut a = TaskArgs::new();
        a.add_input(null).unwrap().add_input(null).unwrap().add_output(null).unwrap();
        a
    };
    let err = r.run(&RunRequest::new(run_id(1), slot, &args(&[4]), &cfg)).unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::InvalidArgs { problem: ArgsProblem::NullWrittenTensor { .. }, .. }
        ),
        "{err}"
    );
    // An empty view has nothing to write, as a zero-size `alloc` on the host returns: the run,
    // whose task gets the same null views, goes through.
    r.run(&RunRequest::new(run_id(2), slot, &args(&[4, 0]), &cfg)).unwrap();
    still_works(&mut r, 3);
}

/// The heap buffer run 1 of the test below allocated, for run 2's orchestration to name.
static EARLIER_HEAP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn alloc_then_add_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let t = ctx.alloc_tensor(&[256], DataType::Float32)?;
    EARLIER_HEAP.store(t.addr, std::sync::atomic::Ordering::SeqCst);
    programs::add::orchestration(ctx, args)
}

/// Writes the earlier run's heap buffer before this run's first `alloc`.
fn earlier_heap_then_alloc_orch(
    ctx: &mut OrchCtx<'_>,
    args: &OrchArgs<'_>,
) -> Result<(), OrchError> {
    let addr = EARLIER_HEAP.load(std::sync::atomic::Ordering::SeqCst);
    let earlier = Tensor::external(addr, &[16], DataType::Float32).unwrap();
    let mut a = CoreArgs::new();
    a.add_input(*args.tensor(0).unwrap()).unwrap();
    a.add_input(*args.tensor(1).unwrap()).unwrap();
    a.add_output(earlier).unwrap();
    ctx.submit(Kernels::Aiv(programs::add::ADD), &a)?;
    ctx.alloc_tensor(&[1], DataType::Float32)?;
    Ok(())
}

/// host_build_graph keeps a slot's heap arena from run to run and frees it at a run's first
/// `alloc` when that run needs a larger one. A task naming the kept arena before that `alloc`
/// would have its kernel write freed memory: only buffers this run allocated are the heap's.
#[test]
fn a_task_naming_an_earlier_runs_heap_buffer_is_refused() {
    use simpler_device_a2a3::Orchestration;
    let three = |_: &OrchArgs<'_>| OrchConfig { expected_arg_count: 3 };
    let mut r = DeviceRunner::attach(options_on(0, RuntimeVariant::HostBuildGraph)).unwrap();
    let native = |entry: simpler_device_a2a3::NativeOrchFn, name: &str| {
        let c = programs::add::builder_with(Orchestration::Native { entry, config: three });
        c.names(name, format!("{name}_config")).build().unwrap()
    };
    let first = r.register_callable(&native(alloc_then_add_orch, "first")).unwrap();
    let second = r.register_callable(&native(earlier_heap_then_alloc_orch, "second")).unwrap();
    let v = VectorRun::new(&mut r, 16);
    let heap = |kib: u64| CallConfig::builder().heap_bytes(RingSel::Ring(0), kib << 10).build();
    r.run(&RunRequest::new(run_id(1), first, &v.args, &heap(64).unwrap())).unwrap();
    let err = r.run(&RunRequest::new(run_id(2), second, &v.args, &heap(128).unwrap()));
    assert!(
        matches!(
            err,
            Err(DeviceError::InvalidArgs {
                problem: ArgsProblem::TensorOutsideAllocation { task: 0, arg: 2, .. },
                ..
            })
        ),
        "{err:?}"
    );
    v.free(&mut r);
    still_works(&mut r, 3);
    r.finalize().unwrap();
}

/// Writes a descriptor based 64 bytes before a heap buffer a task is writing, whose view is
/// exactly that buffer: its bytes are in the heap, its base is not a heap buffer's.
fn writes_a_heap_buffer_through_an_alias_orch(
    ctx: &mut OrchCtx<'_>,
    _: &OrchArgs<'_>,
) -> Result<(), OrchError> {
    let buf = ctx.alloc_tensor(&[256], DataType::Float32)?;
    let mut a = CoreArgs::new();
    a.add_inout(buf).unwrap();
    ctx.submit(Kernels::Aiv(FUNC_NOOP), &a)?;
    let mut alias =
        Tensor::with_buffer(buf.addr - 64, 64 + 1024, &[256], DataType::Float32).unwrap();
    alias.start_offset = 16;
    alias = alias.child_memory(buf.is_child_memory());
    ctx.set_tensor_data(&alias, &[0; 1024])?;
    Ok(())
}

#[test]
fn a_data_call_on_a_view_of_heap_bytes_based_outside_any_heap_buffer_is_refused() {
    // Its base names no heap buffer, so no wait would find the task writing those bytes: the
    // copy would race the kernel.
    let o = options_on(0, RuntimeVariant::TensormapAndRingbuffer);
    let mut r = DeviceRunner::attach(o).unwrap();
    let slot = r.register_callable(&with_noop_kernel(writes_a_heap_buffer_through_an_alias_orch));
    let err = r
        .run(&RunRequest::new(run_id(1), slot.unwrap(), &TaskArgs::new(), &CallConfig::default()))
        .unwrap_err();
    assert!(
        matches!(&err, DeviceError::Runtime { fault, .. }
            if fault.code == RuntimeCode::InvalidArgs
                && fault.message.contains("set_tensor_data")),
        "{err}"
    );
    still_works(&mut r, 2);
}
