//! A `finalize` that unwinds (a tracing layer panicking) while a kernel of a loaded shared
//! object still runs on a device thread must not unload that object under the thread: the
//! runner shuts the device down first and keeps the code loaded when it had to leave the
//! thread behind. The layer is process-wide, so this binary holds this one test. Without the
//! rule the spinning thread runs unmapped code and the whole binary dies of SIGSEGV.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use common::*;
use simpler_device_a2a3::{
    ArgDirection, ChipCallable, CoreCallable, DeviceRunner, KernelCode, Kernels, OrchArgs,
    OrchConfig, OrchCtx, OrchError, RunRequest, SharedObjectKernel,
};
use simpler_types::{CallConfig, CoreArgs, TaskArgs};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// Sets the `int32_t` its second scalar points at, then spins until the one its first scalar
/// points at is non-zero.
const SPIN_KERNEL: &str = r#"
#include <stdint.h>
void kernel_entry(int64_t *args) {
    volatile int32_t *release = (volatile int32_t *)(uintptr_t)args[0];
    volatile int32_t *started = (volatile int32_t *)(uintptr_t)args[1];
    *started = 1;
    while (!*release) { }
}
"#;

/// What releases the kernel: it lives in this binary, not in the object.
static RELEASE: AtomicI32 = AtomicI32::new(0);
/// What the kernel sets once it runs inside the object.
static STARTED: AtomicI32 = AtomicI32::new(0);

/// Panics on the warning `finalize` gives when a launched run is still on the device.
struct PanicsOnFinalizeWithALaunchedRun;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PanicsOnFinalizeWithALaunchedRun {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        if m.0.contains("finalize with a launched run") {
            panic!("this layer refuses finalize's warning");
        }
    }
}

/// One task of the spinning kernel, its scalars the chip argument's.
fn spin_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let bad = OrchError::from_status(-1);
    let mut a = CoreArgs::new();
    for i in 0..2 {
        a.add_scalar(args.scalar(i).ok_or(bad)?).map_err(|_| bad)?;
    }
    ctx.submit(Kernels::Aiv(0), &a)?;
    Ok(())
}

#[test]
fn a_finalize_unwinding_while_a_loaded_kernel_runs_keeps_its_object_loaded() {
    let dir = temp_dir("finalize-unwind");
    let Some(so) = build_c_object(&dir, "spin", SPIN_KERNEL) else { return };
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(PanicsOnFinalizeWithALaunchedRun),
    )
    .expect("the only subscriber of this binary");

    let mut r = DeviceRunner::attach(fast_options(0)).unwrap();
    // SAFETY: the object is the kernel built above: `kernel_entry` has the kernel ABI and reads
    // only the flag its scalar names, which lives for the whole test.
    let code = KernelCode::SharedObject(unsafe { SharedObjectKernel::new(&so) });
    let callable = ChipCallable::native(spin_orch, |_| OrchConfig::default())
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(0, unsafe {
            CoreCallable::new(vec![ArgDirection::Scalar, ArgDirection::Scalar], code)
        })
        .build()
        .unwrap();
    let slot = r.register_callable(&callable).unwrap();
    let mut args = TaskArgs::new();
    args.add_scalar(RELEASE.as_ptr() as u64).unwrap();
    args.add_scalar(STARTED.as_ptr() as u64).unwrap();
    let cfg = CallConfig::default();
    let prepared = r.prepare(&RunRequest::new(run_id(1), slot, &args, &cfg)).unwrap();
    let launched = r.launch_run(prepared).unwrap();
    // The kernel is spinning inside the object before finalize begins.
    let give_up = std::time::Instant::now() + Duration::from_secs(20);
    while STARTED.load(Ordering::Acquire) == 0 {
        assert!(std::time::Instant::now() < give_up, "the kernel never started");
        std::thread::sleep(Duration::from_millis(1));
    }

    let unwound = catch_unwind(AssertUnwindSafe(move || r.finalize()));
    assert!(unwound.is_err(), "the layer's panic unwinds out of finalize");
    drop(launched);
    // The spinning thread was left behind with the object still loaded: let it return.
    RELEASE.store(1, Ordering::Release);
    std::thread::sleep(Duration::from_millis(100));
    let _ = std::fs::remove_dir_all(dir);
}
