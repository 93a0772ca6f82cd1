//! Unit tests of the run-state machine that need the runner's internals: terminal-cleanup
//! latches, the unwind guard, the L1 handshake clear, the launch order and the separation of
//! a prepared run's slot from the executing run's.
//!
//! Step labels (P1–P18, L1–L3, R1–R3, C1–C3) are the run-lifecycle steps defined in
//! `docs/device-runner.md`.

use std::panic::AssertUnwindSafe;

use simpler_types::{CallConfig, TaskArgs, Tensor};

use super::*;
use crate::callable::{ChipCallable, OrchArgs, OrchConfig};
use crate::options::RuntimeVariant;
use crate::runtime::orch::{OrchCtx, OrchError};

fn empty_orch(_: &mut OrchCtx<'_>, _: &OrchArgs<'_>) -> Result<(), OrchError> {
    Ok(())
}

#[test]
fn the_runner_is_send() {
    fn send<T: Send>() {}
    send::<DeviceRunner>();
}

#[test]
fn terminal_cleanup_called_twice_exports_once() {
    let opts = RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph);
    let mut r = DeviceRunner::attach(opts).unwrap();
    let c = ChipCallable::native(empty_orch, |_| OrchConfig::default()).build().unwrap();
    let slot = r.register_callable(&c).unwrap();
    let dir = std::env::temp_dir().join(format!("simpler-cleanup-twice-{}", std::process::id()));
    let cfg = CallConfig::builder().dep_gen(true).output_prefix(&dir).build().unwrap();
    let args = TaskArgs::new();
    let prepared = r.prepare(&RunRequest::new(RunId::FIRST, slot, &args, &cfg)).unwrap();
    let core = r.core.as_mut().unwrap();
    let mut run = core.slots[prepared.slot()].run.take().unwrap();
    let before = core.stats;
    core.finish(&mut run, Outcome::FailedBeforeLaunch);
    let deps = dir.join("deps.json");
    let first = std::fs::metadata(&deps).unwrap().modified().unwrap();
    std::fs::remove_file(&deps).unwrap();
    core.finish(&mut run, Outcome::Success);
    assert_eq!(core.stats.exports, before.exports + 1);
    assert_eq!(core.stats.terminal_cleanups, before.terminal_cleanups + 1);
    assert!(!deps.exists(), "the second call exported nothing (first export at {first:?})");
    r.finalize().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_panic_while_a_run_is_held_runs_the_terminal_cleanup() {
    let opts = RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph);
    let mut r = DeviceRunner::attach(opts).unwrap();
    let c = ChipCallable::native(empty_orch, |_| OrchConfig::default()).build().unwrap();
    let slot = r.register_callable(&c).unwrap();
    let args = TaskArgs::new();
    let cfg = CallConfig::default();
    let prepared = r.prepare(&RunRequest::new(RunId::FIRST, slot, &args, &cfg)).unwrap();
    let s = prepared.slot();
    let core = r.core.as_mut().unwrap();
    let mut run = core.slots[s].run.take().unwrap();
    let before = core.stats;
    let caught = std::panic::catch_unwind(AssertUnwindSafe(|| {
        core.guarded(s, &mut run, Outcome::FailedBeforeLaunch, |_, _| panic!("injected"))
    }));
    assert!(caught.is_err());
    assert_eq!(core.stats.terminal_cleanups, before.terminal_cleanups + 1);
    assert_eq!(core.stats.exports, before.exports + 1);
    assert!(run.latches.released && run.latches.stopped);
    // A normal exit leaves the run to its caller.
    let kept = core.guarded(s, &mut run, Outcome::FailedBeforeLaunch, |_, _| 7);
    assert_eq!((kept, core.stats.terminal_cleanups), (7, before.terminal_cleanups + 1));
    // The unwind freed the slot: the handle that outlived it is stale and, dropped once a new
    // run took the slot, cleans up nothing of that run.
    let next =
        r.prepare(&RunRequest::new(RunId::FIRST.next().unwrap(), slot, &args, &cfg)).unwrap();
    assert_eq!(next.slot(), s, "the lowest free slot is taken again");
    drop(prepared);
    let a = r.launch_run(next).expect("the run prepared after the unwind is its slot's owner");
    r.reap_run(&a, None).unwrap();
    r.complete_run(a).unwrap();
    r.finalize().unwrap();
}

#[test]
fn a_runner_call_made_from_a_drop_during_an_unwind_is_not_its_own_panic() {
    // An RAII wrapper that reaps and completes its run in `drop`, dropped by an unrelated
    // panic: the calls return normally, so the run completes and the device stays healthy.
    struct CompleteOnDrop<'a> {
        runner: &'a std::cell::RefCell<DeviceRunner>,
        run: Option<ActiveRun>,
        result: &'a std::cell::RefCell<Option<Result<RunReport, DeviceError>>>,
    }
    impl Drop for CompleteOnDrop<'_> {
        fn drop(&mut self) {
            let mut r = self.runner.borrow_mut();
            let Some(a) = self.run.take() else { return };
            let done = r.reap_run(&a, None).and_then(|_| r.complete_run(a));
            *self.result.borrow_mut() = Some(done);
        }
    }
    let opts = RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph);
    let runner = std::cell::RefCell::new(DeviceRunner::attach(opts).unwrap());
    let c = ChipCallable::native(empty_orch, |_| OrchConfig::default()).build().unwrap();
    let (args, cfg) = (TaskArgs::new(), CallConfig::default());
    let active = {
        let mut r = runner.borrow_mut();
        let slot = r.register_callable(&c).unwrap();
        let p = r.prepare(&RunRequest::new(RunId::FIRST, slot, &args, &cfg)).unwrap();
        r.launch_run(p).unwrap()
    };
    let result = std::cell::RefCell::new(None);
    let caught = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let _wrapper = CompleteOnDrop { runner: &runner, run: Some(active), result: &result };
        panic!("unrelated");
    }));
    assert!(caught.is_err());
    let done = result.into_inner().expect("the wrapper ran");
    assert_eq!(done.expect("completed during the unwind").run_id, Some(RunId::FIRST));
    let r = runner.into_inner();
    assert!(r.health().is_healthy());
    r.finalize().unwrap();
}

/// Writes 1.0 into every element of its one output tensor.
unsafe extern "C-unwind" fn fill_ones(args: *mut i64) {
    // SAFETY: the runner passes one tensor descriptor, the run's output buffer.
    let k = unsafe { crate::kernel::KernelCall::from_raw(args, 1) };
    // SAFETY: the output is a device buffer of f32 only this task writes.
    if let Some(out) = unsafe { k.slice_mut::<f32>(0) } {
        out.fill(1.0);
    }
}

fn fill_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = simpler_types::CoreArgs::new();
    a.add_output(*args.tensor(0).unwrap()).unwrap();
    ctx.submit(crate::runtime::orch::Kernels::Aiv(0), &a)?;
    Ok(())
}

/// A runner on `opts` with a registered callable of `orch` around the fill kernel, and a
/// 1024-float device buffer.
fn fill_runner(
    opts: RunnerOptions,
    orch: crate::callable::NativeOrchFn,
) -> (DeviceRunner, ChipSlot, DevicePtr, Tensor) {
    let mut r = DeviceRunner::attach(opts).unwrap();
    // SAFETY: `fill_ones` writes its one output tensor.
    let fill = unsafe {
        crate::callable::CoreCallable::native(vec![crate::callable::ArgDirection::Out], fill_ones)
    };
    let c = ChipCallable::native(orch, |_| OrchConfig { expected_arg_count: 1 })
        .kernel(0, fill)
        .build()
        .unwrap();
    let slot = r.register_callable(&c).unwrap();
    let p = r.malloc(4096).unwrap();
    let t = Tensor::external(p.addr(), &[1024], simpler_types::DataType::Float32)
        .unwrap()
        .child_memory(true);
    (r, slot, p, t)
}

/// A runner with a registered fill callable and a 1024-float output buffer.
fn fill_setup() -> (DeviceRunner, ChipSlot, DevicePtr, TaskArgs) {
    let opts = RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph);
    let (r, slot, p, t) = fill_runner(opts, fill_orch);
    let mut args = TaskArgs::new();
    args.add_output(t).unwrap();
    (r, slot, p, args)
}

fn read_ones(r: &mut DeviceRunner, p: DevicePtr) -> bool {
    let mut b = vec![0u8; 4096];
    r.copy_from_device(&mut b, p).unwrap();
    b.chunks_exact(4).all(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) == 1.0)
}

#[test]
fn a_stale_aicore_done_in_the_image_is_cleared_before_launch_and_opens_no_window_early() {
    let (mut r, slot, p, args) = fill_setup();
    let cfg = CallConfig::builder().block_dim(2).build().unwrap();
    let prepared = r.prepare(&RunRequest::new(RunId::FIRST, slot, &args, &cfg)).unwrap();
    let core = r.core.as_mut().unwrap();
    let run = core.slots[prepared.slot()].run.take().unwrap();
    let cores = 3 * run.block_dim;
    let done = |core: &Core, c: u32| {
        image_view(&*core.backend, &run).unwrap().handshake(c).aicore_done.load(Ordering::Relaxed)
    };
    let stale = |core: &Core| {
        // A stale report from an earlier launch: every core claims to be in already.
        let view = image_view(&*core.backend, &run).unwrap();
        for c in 0..cores {
            view.handshake(c).aicore_done.store(c + 1, Ordering::Relaxed);
        }
    };
    stale(core);
    core.clear_handshakes(&run).unwrap();
    for c in 0..cores {
        assert_eq!(done(core, c), 0, "core {c}'s aicore_done after L1");
    }
    // Stale again, then the whole launch: the run still completes with every task executed,
    // so no dispatch went to a core that had not reported in.
    stale(core);
    core.slots[prepared.slot()].run = Some(run);
    let active = r.launch_run(prepared).unwrap();
    r.reap_run(&active, None).unwrap();
    r.complete_run(active).unwrap();
    assert!(read_ones(&mut r, p));
    r.finalize().unwrap();
}

#[test]
fn each_run_launches_aicore_then_aicpu_without_a_sync_between_then_syncs_aicpu_then_aicore() {
    use crate::backend::sim::HostCall;
    let (mut r, slot, p, args) = fill_setup();
    let cfg = CallConfig::default();
    let log = |r: &DeviceRunner| r.core.as_ref().unwrap().backend.sim().unwrap().take_host_log();
    log(&r);
    for run in 1..=3 {
        let id = RunId::from_raw(run).unwrap();
        r.run(&RunRequest::new(id, slot, &args, &cfg)).unwrap();
        assert_eq!(
            log(&r),
            [
                HostCall::LaunchAiCore,
                HostCall::LaunchAicpu,
                HostCall::Sync(StreamKind::Aicpu),
                HostCall::Sync(StreamKind::AiCore),
            ],
            "run {run}"
        );
    }
    assert!(read_ones(&mut r, p));
    r.finalize().unwrap();
}

/// Writes four bytes with `set_tensor_data` at the address passed as scalar 0.
fn poke_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let addr = args.scalar(0).unwrap_or(0);
    let t = Tensor::external(addr, &[4], simpler_types::DataType::UInt8).unwrap();
    ctx.set_tensor_data(&t, &[0xEE; 4])
}

#[test]
fn set_tensor_data_cannot_write_the_runtimes_own_buffers() {
    let opts = RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph);
    let mut r = DeviceRunner::attach(opts).unwrap();
    let c = ChipCallable::native(poke_orch, |_| OrchConfig::default()).build().unwrap();
    let slot = r.register_callable(&c).unwrap();
    let cfg = CallConfig::default();
    // Slot 0's kernel argument block exists after a first run (which writes user memory).
    let p = r.malloc(1024).unwrap();
    let mut user = TaskArgs::new();
    user.add_scalar(p.addr()).unwrap();
    r.run(&RunRequest::new(RunId::from_raw(9).unwrap(), slot, &user, &cfg)).unwrap();
    let kernel_args = r.core.as_ref().unwrap().slots[0].res.kernel_args.unwrap();
    let mut args = TaskArgs::new();
    args.add_scalar(kernel_args).unwrap();
    let err = r.run(&RunRequest::new(RunId::FIRST, slot, &args, &cfg)).unwrap_err();
    assert!(err.to_string().contains("set_tensor_data"), "{err}");
    let mut b = [0u8; 4];
    r.core.as_ref().unwrap().backend.read(kernel_args, &mut b).unwrap();
    assert_ne!(b, [0xEE; 4], "the kernel argument block was not written");
    // A user allocation stays writable.
    r.copy_from_device(&mut b, p).unwrap();
    assert_eq!(b, [0xEE; 4]);
    r.finalize().unwrap();
}

#[test]
fn runs_after_runs_start_from_cleared_handshakes() {
    // After a completed run, the next run's device image is made stale after its upload (every
    // core claims to be in already); the AICore launch is then refused, so the AICore never
    // runs and only L1 can have cleared the records the AICPU would read.
    let (mut r, slot, _out, args) = fill_setup();
    r.run(&RunRequest::new(RunId::FIRST, slot, &args, &CallConfig::default())).unwrap();
    let cfg = CallConfig::builder().block_dim(3).build().unwrap();
    let prepared =
        r.prepare(&RunRequest::new(RunId::from_raw(2).unwrap(), slot, &args, &cfg)).unwrap();
    let core = r.core.as_mut().unwrap();
    let run = core.slots[prepared.slot()].run.as_ref().unwrap();
    let (addr, len, cores) = (run.image_addr, run.image_len, 3 * run.block_dim);
    let view = image_view(&*core.backend, run).unwrap();
    for c in 0..cores {
        view.handshake(c).aicore_done.store(c + 1, Ordering::Relaxed);
    }
    core.backend.sim().unwrap().faults().fail_launch(KernelKind::AiCore, 1);
    assert!(matches!(
        r.launch_run(prepared),
        Err(DeviceError::Launch { kernel: KernelKind::AiCore, .. })
    ));
    let backend = &*r.core.as_ref().unwrap().backend;
    let base = backend.host_map(addr, len).unwrap();
    // SAFETY: the pooled image arena stays allocated after the failed launch, and no device
    // thread runs it: the AICore launch was refused and the AICPU kernel never launched.
    let view = unsafe { HostImageView::from_raw(base, len) }.unwrap();
    for c in 0..cores {
        assert_eq!(view.handshake(c).aicore_done.load(Ordering::Relaxed), 0, "core {c} after L1");
    }
    r.finalize().unwrap();
}

/// A hash of `len` device bytes at `addr`, read through the backend (the runner's copies are
/// refused while a run is launched).
fn device_hash(core: &Core, addr: u64, len: u64) -> u64 {
    let mut bytes = vec![0u8; len as usize];
    core.backend.read(addr, &mut bytes).unwrap();
    hash_bytes(&bytes)
}

#[test]
fn preparing_the_next_run_writes_nothing_the_executing_run_reads() {
    use crate::programs::vector;
    let opts = RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph).with_device_queue(true);
    let mut r = DeviceRunner::attach(opts).unwrap();
    let slot = r.register_callable(&vector::callable().unwrap()).unwrap();
    let n = 4096usize;
    let mut sets = Vec::new();
    for k in 0..2 {
        let a: Vec<f32> = (0..n).map(|i| (i + k) as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| 2.0 - (i * (k + 1)) as f32).collect();
        let mut args = TaskArgs::new();
        let mut ptrs = Vec::new();
        for (i, data) in [Some(&a), Some(&b), None].into_iter().enumerate() {
            let p = r.malloc((n * 4) as u64).unwrap();
            if let Some(d) = data {
                r.copy_to_device(p, &crate::programs::f32_to_le_bytes(d)).unwrap();
            }
            let t = Tensor::external(p.addr(), &[n as u32], simpler_types::DataType::Float32)
                .unwrap()
                .child_memory(true);
            if i < 2 { args.add_input(t) } else { args.add_output(t) }.unwrap();
            ptrs.push(p);
        }
        sets.push((args, ptrs, vector::reference(&a, &b)));
    }
    let cfg = CallConfig::default();
    r.sim_faults().unwrap().kernel_delay(vector::MUL, std::time::Duration::from_millis(400));
    let p1 = r.prepare(&RunRequest::new(RunId::FIRST, slot, &sets[0].0, &cfg)).unwrap();
    let a1 = r.launch_run(p1).unwrap();
    // What run 1 reads and does not write itself: its kernel arguments, the slot's host image,
    // its input tensors.
    let snapshot = |r: &mut DeviceRunner| {
        let core = r.core.as_ref().unwrap();
        let s = a1.slot();
        let run = core.slots[s].run.as_ref().unwrap();
        let ka = device_hash(core, run.kernel_args, size_of::<KernelArgs>() as u64);
        let host = hash_bytes(&core.slots[s].res.host_image);
        let inputs = [0, 1].map(|i| device_hash(core, sets[0].1[i].addr(), (n * 4) as u64));
        (ka, host, inputs, run.image_addr, run.image_len, run.kernel_args)
    };
    let before = snapshot(&mut r);
    let p2 = r.prepare(&RunRequest::new(RunId::from_raw(2).unwrap(), slot, &sets[1].0, &cfg));
    let p2 = p2.unwrap();
    assert!(!r.poll_run(&a1).unwrap(), "run 1 still executes (its multiply is held)");
    let after = snapshot(&mut r);
    assert_eq!(before, after, "run 2's preparation changed a byte run 1 reads");
    {
        let core = r.core.as_ref().unwrap();
        let run2 = core.slots[p2.slot()].run.as_ref().unwrap();
        let (img1, len1, ka1) = (before.3, before.4, before.5);
        assert!(
            run2.image_addr + run2.image_len <= img1 || img1 + len1 <= run2.image_addr,
            "the two runs' images overlap"
        );
        assert_ne!(run2.kernel_args, ka1, "the two runs share a kernel-argument block");
    }
    let a2 = r.launch_run(p2).unwrap();
    for a in [a1, a2] {
        assert!(r.reap_run(&a, None).unwrap());
        r.complete_run(a).unwrap();
    }
    for (_, ptrs, expected) in &sets {
        let mut bytes = vec![0u8; n * 4];
        r.copy_from_device(&mut bytes, ptrs[2]).unwrap();
        let got: Vec<f32> =
            bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        assert_eq!(&got, expected);
    }
    r.finalize().unwrap();
}

fn hash_bytes(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// 160 tasks of 65 536 blocks each: a ready-queue cell per block makes an image of about
/// 80 MiB.
fn many_blocks_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = simpler_types::CoreArgs::new();
    a.add_inout(*args.tensor(0).unwrap()).unwrap();
    for _ in 0..160 {
        ctx.submit_blocks(crate::runtime::orch::Kernels::Aiv(0), &a, 1 << 16)?;
    }
    Ok(())
}

#[test]
fn the_host_copy_of_an_oversized_image_is_not_kept_for_the_next_run() {
    // The device refuses the image's arena (64 MiB in all), after the host has built it.
    let opts = RunnerOptions::sim(0, RuntimeVariant::HostBuildGraph).with_memory_limit(64 << 20);
    let (mut r, slot, p, t) = fill_runner(opts, many_blocks_orch);
    let mut args = TaskArgs::new();
    args.add_inout(t).unwrap();
    let err = r.run(&RunRequest::new(RunId::FIRST, slot, &args, &CallConfig::default()));
    assert!(matches!(err, Err(DeviceError::OutOfMemory { .. })), "{err:?}");
    let core = r.core.as_ref().unwrap();
    let kept = core.slots.iter().map(|s| s.res.host_image.capacity()).max().unwrap();
    assert!(kept <= memory::KEEP_HOST_IMAGE_BYTES, "{kept} bytes of host image kept");
    r.free(p).unwrap();
    r.finalize().unwrap();
}
