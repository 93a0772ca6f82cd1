//! C kernels loaded from shared objects (`docs/device-runner.md`) run on the
//! simulated chip. The test builds its kernel with the system C compiler.

mod common;

use std::path::Path;

use common::*;
use simpler_device_a2a3::{
    ArgDirection, CallableProblem, ChipCallable, CoreCallable, DeviceError, DeviceRunner,
    KernelCode, Kernels, ObjectError, OrchArgs, OrchCtx, OrchError, RunRequest, SharedObjectKernel,
};
use simpler_types::{CallConfig, CoreArgs, TaskArgs};

const C_KERNEL: &str = r#"
#include <stddef.h>
#include <stdint.h>

struct tensor {
    uint64_t addr, size, owner_task_id, start_offset;
    int32_t version;
    uint32_t ndims;
    uint8_t dtype, manual_dep, is_contiguous, child_memory;
    uint32_t shapes[5];
    uint64_t extent_elems;
    uint32_t strides[5];
    uint8_t reserved[36];
};
_Static_assert(sizeof(struct tensor) == 128, "descriptor size");
_Static_assert(offsetof(struct tensor, shapes) == 44, "shapes offset");

/* c = a + b over f32, for the first dimension of a. */
void kernel_entry(int64_t *args) {
    const struct tensor *a = (const struct tensor *)(uintptr_t)args[0];
    const struct tensor *b = (const struct tensor *)(uintptr_t)args[1];
    const struct tensor *c = (const struct tensor *)(uintptr_t)args[2];
    const float *pa = (const float *)(uintptr_t)(a->addr + a->start_offset * 4);
    const float *pb = (const float *)(uintptr_t)(b->addr + b->start_offset * 4);
    float *pc = (float *)(uintptr_t)(c->addr + c->start_offset * 4);
    for (uint32_t i = 0; i < a->shapes[0]; i++) pc[i] = pa[i] + pb[i];
}

void not_a_kernel(void) {}
"#;

fn add_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    a.add_input(*args.tensor(0).unwrap()).unwrap();
    a.add_input(*args.tensor(1).unwrap()).unwrap();
    a.add_output(*args.tensor(2).unwrap()).unwrap();
    ctx.submit(Kernels::Aiv(FUNC_ADD), &a)?;
    Ok(())
}

fn callable(so: &Path) -> Result<ChipCallable, DeviceError> {
    use ArgDirection::{In, Out};
    // SAFETY: the object is the kernel built above (or a path that does not load); its
    // `kernel_entry` has the kernel ABI and touches only its tensors.
    let code = KernelCode::SharedObject(unsafe { SharedObjectKernel::new(so) });
    ChipCallable::native(add_orch, three_args)
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(FUNC_ADD, unsafe { CoreCallable::new(vec![In, In, Out], code) })
        .build()
}

#[test]
fn a_c_kernel_from_a_shared_object_runs_on_the_simulated_chip() {
    let dir = temp_dir("shared-object");
    let Some(so) = build_c_object(&dir, "addkernel", C_KERNEL) else { return };
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&callable(&so).unwrap()).unwrap();
    let n = 1000;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let (pa, ta) = upload_f32(&mut r, &a);
    let (pb, tb) = upload_f32(&mut r, &a);
    let (pc, tc) = upload_f32(&mut r, &vec![0.0; n]);
    let mut args = TaskArgs::new();
    args.add_input(ta).unwrap().add_input(tb).unwrap().add_output(tc).unwrap();
    r.run(&RunRequest::new(run_id(1), slot, &args, &CallConfig::default())).unwrap();
    let c = download_f32(&mut r, pc, n);
    assert!(c.iter().enumerate().all(|(i, v)| *v == 2.0 * i as f32));
    for p in [pa, pb, pc] {
        r.free(p).unwrap();
    }
    r.unregister_callable(slot).unwrap();
    r.finalize().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// Why the object of kernel `FUNC_ADD` did not load, when `e` says that.
fn kernel_object(e: &DeviceError) -> Option<&ObjectError> {
    match e {
        DeviceError::InvalidCallable {
            problem: CallableProblem::KernelObject { func_id: FUNC_ADD, source },
            ..
        } => Some(source),
        _ => None,
    }
}

#[test]
fn unloadable_objects_and_missing_entries_are_invalid_callables() {
    let dir = temp_dir("shared-object-bad");
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let missing = dir.join("libnothing.so");
    let err = r.register_callable(&callable(&missing).unwrap()).unwrap_err();
    assert!(
        matches!(kernel_object(&err), Some(ObjectError::Open { path, .. }) if *path == missing),
        "{err}"
    );
    if let Some(so) = build_c_object(&dir, "noentry", "void something_else(void) {}\n") {
        let err = r.register_callable(&callable(&so).unwrap()).unwrap_err();
        assert!(
            matches!(kernel_object(&err), Some(ObjectError::MissingSymbol { path, symbol, .. })
                if *path == so && symbol == "kernel_entry"),
            "{err}"
        );
    }
    assert_eq!(r.stats().registrations, 0, "a failed registration consumes no slot");
    r.finalize().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// Spins for four seconds of host time, well past the failed run's return, then returns.
const SLOW_KERNEL: &str = r#"
#include <stdint.h>
#include <time.h>

void kernel_entry(int64_t *args) {
    (void)args;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) * 1000000000LL + (now.tv_nsec - start.tv_nsec)
             < 4000000000LL);
}
"#;

fn inout_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    a.add_inout(*args.tensor(0).unwrap()).unwrap();
    ctx.submit(Kernels::Aiv(FUNC_NOOP), &a)?;
    Ok(())
}

#[test]
fn unregistering_after_a_failed_run_keeps_a_still_running_kernel_object_loaded() {
    let dir = temp_dir("shared-object-slow");
    let Some(so) = build_c_object(&dir, "slowkernel", SLOW_KERNEL) else { return };
    let mut o = options(0)
        .with_scheduler_timeout(std::time::Duration::from_millis(200))
        .with_op_execute_timeout(std::time::Duration::from_micros(400_000))
        .with_stream_sync_timeout(std::time::Duration::from_millis(2_000))
        .with_shutdown_budget(std::time::Duration::from_millis(200));
    o.sim.join_budget = std::time::Duration::from_secs(20);
    let mut r = DeviceRunner::attach(o).unwrap();
    // SAFETY: the object is the kernel built above; it touches nothing but the clock.
    let code = KernelCode::SharedObject(unsafe { SharedObjectKernel::new(&so) });
    let c = ChipCallable::native(inout_orch, |_| Default::default())
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(FUNC_NOOP, unsafe { CoreCallable::new(vec![ArgDirection::InOut], code) })
        .build()
        .unwrap();
    let slot = r.register_callable(&c).unwrap();
    let (p, t) = upload_f32(&mut r, &[0.0; 16]);
    let mut args = TaskArgs::new();
    args.add_inout(t).unwrap();
    let err = r.run(&RunRequest::new(run_id(1), slot, &args, &CallConfig::default())).unwrap_err();
    assert!(err.poisons_device(), "{err}");
    // The kernel is still spinning on a simulated thread. Unregistering must not unmap its
    // code under it (that crashed the process before).
    r.unregister_callable(slot).unwrap();
    r.free(p).unwrap();
    // Finalize waits for the kernel to return, then joins every thread and closes the object.
    let report = r.finalize().unwrap();
    assert!(report.stuck_threads.is_empty(), "{report:?}");
    let _ = std::fs::remove_dir_all(dir);
}
