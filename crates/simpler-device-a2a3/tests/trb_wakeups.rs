//! Who wakes whom under tensormap_and_ringbuffer: a task the orchestration makes ready while
//! every scheduler thread is parked must wake them, and its completion must wake the
//! orchestration waiting for it. A parked thread also wakes at its no-progress budget, which is
//! two minutes here, so a lost wake-up shows as a run that has not ended long after its 0.1 s of
//! paced submits (the test gives it 30 s).

mod common;

use std::time::Duration;

use common::*;
use simpler_device_a2a3::{
    ArgDirection, ChipCallable, CoreCallable, DeviceRunner, Kernels, OrchArgs, OrchConfig, OrchCtx,
    OrchError, RunRequest, RuntimeVariant,
};
use simpler_types::{CallConfig, CoreArgs, DataType, RunId, TaskArgs};

const NOOP: u32 = 0;

unsafe extern "C-unwind" fn noop(_args: *mut i64) {}

/// Submits `scalar(0)` tasks one at a time, each after a pause long enough for every scheduler
/// thread to run out of work, spin, yield and park, and reads each task's output back (which
/// waits for the task), so the next submit comes only after the task ran.
fn paced(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let bad = OrchError::from_status(-1);
    let n = args.scalar(0).ok_or(bad)?;
    for _ in 0..n {
        std::thread::sleep(Duration::from_millis(20));
        let out = ctx.alloc_tensor(&[1], DataType::Float32)?;
        let mut task = CoreArgs::new();
        task.add_output(out).map_err(|_| bad)?;
        ctx.submit(Kernels::Aiv(NOOP), &task)?;
        ctx.tensor_data(&out, &mut [0u8; 4])?;
    }
    Ok(())
}

#[test]
fn a_task_submitted_while_every_scheduler_is_parked_wakes_them() {
    let opts = options_on(0, RuntimeVariant::TensormapAndRingbuffer)
        .with_scheduler_timeout(Duration::from_secs(120))
        .with_op_execute_timeout(Duration::from_secs(200))
        .with_stream_sync_timeout(Duration::from_secs(300));
    let mut r = DeviceRunner::attach(opts).unwrap();
    let c = ChipCallable::native(paced, |_| OrchConfig { expected_arg_count: 1 })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(NOOP, unsafe { CoreCallable::native(vec![ArgDirection::Out], noop) })
        .build()
        .unwrap();
    let slot = r.register_callable(&c).unwrap();
    let mut args = TaskArgs::new();
    args.add_scalar(5).unwrap();
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let cfg = CallConfig::default();
        let report = r.run(&RunRequest::new(RunId::from_raw(1).unwrap(), slot, &args, &cfg));
        let _ = done.send(report.map(|rep| rep.tasks));
        r.finalize().unwrap();
    });
    let tasks = ended
        .recv_timeout(Duration::from_secs(30))
        .expect("the run is still going: a scheduler missed the wake-up of a submitted task");
    assert_eq!(tasks.unwrap(), 5);
}
