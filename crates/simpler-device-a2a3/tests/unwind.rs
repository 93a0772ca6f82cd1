//! A panic that unwinds out of the runner between the launch and the end of the reap: the
//! runner is marked unusable before the cleanup and before any logging, so `prepare` is refused
//! and `free` releases nothing (the simulated cores may still use the memory) until
//! `finalize`; a fresh runner on the same device then works.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};

use common::*;
use simpler_device_a2a3::{
    ChipSlot, DeviceError, DeviceHealth, DeviceRunner, FiredFault, KernelKind, PoisonStep,
    RunRequest,
};
use simpler_types::CallConfig;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// A tracing subscriber whose every error event panics, like a logging layer that fails.
struct PanicOnError;

impl Subscriber for PanicOnError {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        *m.level() == Level::ERROR
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {
        panic!("the logging layer panicked");
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// After an unwind out of the runner: unusable with `step`, `prepare` refused, `free` keeps the
/// memory allocated; then `finalize` and a fresh runner on the same device work.
fn assert_refused_until_finalize(
    mut r: DeviceRunner,
    slot: ChipSlot,
    v: VectorRun,
    step: PoisonStep,
) {
    match r.health() {
        DeviceHealth::Unusable { cause } => assert_eq!(cause.step, step),
        h => panic!("expected unusable after the unwind, got {h}"),
    }
    // The slot was registered before the unwind, so only the poisoning can refuse it.
    let cfg = CallConfig::default();
    let err = r.prepare(&RunRequest::new(run_id(2), slot, &v.args, &cfg)).unwrap_err();
    assert!(matches!(err, DeviceError::Unusable { .. }), "prepare after the unwind: {err}");
    let err = r.register_callable(&vector_callable()).unwrap_err();
    assert!(matches!(err, DeviceError::Unusable { .. }), "register after the unwind: {err}");
    let user_bytes = r.stats().memory.user_allocations;
    for p in v.ptrs {
        r.free(p).unwrap();
    }
    assert_eq!(
        r.stats().memory.user_allocations,
        user_bytes,
        "free released memory the simulated cores may still use"
    );
    assert!(r.finalize().unwrap().stuck_threads.is_empty());
    let mut fresh = DeviceRunner::attach(options(0)).unwrap();
    vector_once(&mut fresh, 1, &CallConfig::default());
    fresh.finalize().unwrap();
}

#[test]
fn a_panic_right_after_either_launch_leaves_the_runner_unusable_until_finalize() {
    for kind in [KernelKind::AiCore, KernelKind::Aicpu] {
        let mut r = DeviceRunner::attach(fast_options(0)).unwrap();
        let slot = r.register_callable(&vector_callable()).unwrap();
        let v = VectorRun::new(&mut r, 1024);
        let cfg = CallConfig::default();
        let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
        r.sim_faults().unwrap().panic_after_launch(kind, 1);
        let caught = catch_unwind(AssertUnwindSafe(|| r.launch_run(p)));
        assert!(caught.is_err(), "{kind:?}: the injected panic unwound out of launch_run");
        assert_eq!(r.sim_faults().unwrap().fired(), [FiredFault::PanickedAfterLaunch(kind)]);
        assert_refused_until_finalize(r, slot, v, PoisonStep::Unwind);
    }
}

#[test]
fn a_panicking_log_layer_in_the_reap_cannot_skip_the_poisoning() {
    let mut r = DeviceRunner::attach(fast_options(0)).unwrap();
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 1024);
    let cfg = CallConfig::default();
    r.sim_faults().unwrap().kernel_fault(FUNC_MUL, 1);
    let p = r.prepare(&RunRequest::new(run_id(1), slot, &v.args, &cfg)).unwrap();
    let a = r.launch_run(p).unwrap();
    // The reap's sync fails; recover-or-mark-unusable logs an error, which panics.
    let caught = tracing::subscriber::with_default(PanicOnError, || {
        catch_unwind(AssertUnwindSafe(|| r.reap_run(&a, None)))
    });
    assert!(caught.is_err(), "the log layer's panic unwound out of reap_run");
    assert_refused_until_finalize(r, slot, v, PoisonStep::SyncAicpu);
}
