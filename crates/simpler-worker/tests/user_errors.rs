//! Errors a worker's user meets keep their type and speak the worker's vocabulary: hints name
//! the worker's own settings, task references use one format, a limit names the value and the
//! limit it broke.

mod common;

use common::{host, one_sub_task};
use std::time::Duration;

use simpler_device_a2a3::Platform;
use simpler_ring::RingError;
use simpler_sched::SchedError;
use simpler_types::{CallConfig, DataType, FailureMechanism, TaskArgs, WorkerId};
use simpler_worker::{
    BuildFailure, CallableHandle, ConfigError, Frame, MAX_SUB_WORKERS, Orchestration, RunErrorKind,
    StartCause, StartError, Worker, WorkerError,
};

#[derive(Debug, thiserror::Error)]
#[error("the input is not ready")]
struct NotReady;

#[test]
fn an_error_a_graph_callback_returns_keeps_its_type() {
    let w = host().start().expect("start");
    let err = w.run(Orchestration::graph(|_, _, _| Err(NotReady.into()))).expect_err("fails");
    let WorkerError::Build { cause: BuildFailure::Callback(e), .. } = &err else {
        panic!("{err:?}");
    };
    assert!(e.downcast_ref::<NotReady>().is_some(), "{e:?}");
    w.close().expect("close");
}

#[test]
fn an_error_a_host_closure_returns_keeps_its_type_on_its_frame() {
    let mut b = host().sub_workers(1);
    let h = b.register_host("not_ready", |_| Err(NotReady.into()));
    let w = b.start().expect("start");
    let err = w.run(one_sub_task(h)).expect_err("fails");
    let WorkerError::Run(e) = &err else { panic!("{err:?}") };
    let typed = e.frames().iter().find_map(|f| f.error()?.downcast_ref::<NotReady>());
    assert!(typed.is_some(), "{e}");
    w.close().expect("close");
}

/// The engine error a graph callback's `alloc` met, as the run reports it.
fn alloc_failure(w: &simpler_worker::Worker, elems: u32, times: usize) -> WorkerError {
    w.run(Orchestration::graph(move |g, _, _| {
        for _ in 0..times {
            g.alloc(&[elems], DataType::Float32)?;
        }
        Ok(())
    }))
    .expect_err("the heap ring refuses")
}

/// Asserts that `err` is the engine's typed capacity error and that its text ends with `tail`
/// and names no ring field the worker's user cannot set.
fn assert_capacity_text(err: &WorkerError, tail: &str) {
    let WorkerError::Build { cause: BuildFailure::Engine(SchedError::Capacity { .. }), .. } = err
    else {
        panic!("{err:?}");
    };
    let text = err.to_string();
    assert!(text.ends_with(tail), "{text}");
    // What a chain printer shows (`{:?}` of anyhow or eyre walks `source()`) names no ring field.
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        assert!(
            !text.contains("heap_bytes_per_ring") && !text.contains("max_live_slots"),
            "{text}"
        );
        next = e.source();
    }
}

#[test]
fn a_heap_ring_that_is_too_small_is_reported_with_the_worker_setting() {
    let w = host().sub_workers(1).heap_ring_size(1 << 16).start().expect("start");
    let err = alloc_failure(&w, 1 << 20, 1);
    assert_capacity_text(
        &err,
        "capacity exhausted: request of 4194304 bytes (4194304 aligned) can never fit ring 0 of \
         65536 bytes; raise the worker builder's heap_ring_size",
    );
    w.close().expect("close");
}

#[test]
fn a_full_heap_ring_is_reported_with_the_worker_settings() {
    let w = host().heap_ring_size(1 << 16).alloc_timeout(Duration::ZERO).start().expect("start");
    let err = alloc_failure(&w, 1 << 14, 2);
    assert_capacity_text(
        &err,
        "; raise the worker builder's heap_ring_size or alloc_timeout, or use a scope \
         (GraphBuilder::scope) that keeps less alive",
    );
    w.close().expect("close");
}

#[test]
fn disabled_heaps_are_reported_with_the_worker_setting() {
    let w = host().heap_ring_size(0).start().expect("start");
    let err = alloc_failure(&w, 16, 1);
    assert_capacity_text(
        &err,
        "capacity exhausted: heap allocation of 64 bytes refused: heaps are disabled; set the \
         worker builder's heap_ring_size above 0",
    );
    w.close().expect("close");
}

#[test]
fn an_l4_heap_ring_that_is_too_small_is_reported_with_the_worker_setting() {
    let mut l4 = simpler_worker::Worker::composite(4).heap_ring_size(1 << 16);
    l4.child(host()).expect("adopt");
    let w = l4.alloc_timeout(Duration::ZERO).start().expect("start");
    let err = alloc_failure(&w, 1 << 20, 1);
    assert_capacity_text(
        &err,
        "can never fit ring 0 of 65536 bytes; raise the worker builder's heap_ring_size",
    );
    w.close().expect("close");
}

#[test]
fn a_heap_ring_size_the_ring_refuses_is_named_by_the_worker_setting() {
    let err = host().heap_ring_size(1000).start().expect_err("not a multiple of 1024");
    assert!(matches!(err.cause, StartCause::HeapRingSize { value: 1000, align: 1024 }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("heap_ring_size = 1000 is not a multiple of 1024 bytes"), "{text}");
    assert!(!text.contains("heap_bytes_per_ring"), "{text}");
}

#[test]
fn an_engine_that_cannot_start_is_reported_with_its_typed_error() {
    // Aligned, but beyond the address space: the ring's own refusal, kept typed.
    let err = host().heap_ring_size(1 << 63).start().expect_err("too large");
    match &err.cause {
        StartCause::Engine(e) => {
            assert!(matches!(**e, SchedError::Ring(RingError::InvalidConfig { .. })), "{e:?}");
        }
        other => panic!("{other:?}"),
    }
    let source = std::error::Error::source(&err).expect("a source");
    assert!(source.is::<SchedError>(), "{source:?}");
}

#[test]
fn a_failed_task_is_named_in_the_one_task_reference_format() {
    let mut b = host().sub_workers(1);
    let ok = b.register_host("ok", |_| Ok(()));
    let fail = b.register_host("fail", |_| Err("no".into()));
    let w = b.start().expect("start");
    let err = w
        .run(Orchestration::graph(move |g, _, _| {
            g.submit_sub(ok, TaskArgs::new())?;
            g.submit_sub(fail, TaskArgs::new())?;
            Ok(())
        }))
        .expect_err("fails");
    let text = err.to_string();
    assert!(text.contains("run#1/task#1 (host 'fail')"), "{text}");
    w.close().expect("close");
}

#[test]
fn a_clean_close_that_reports_unobserved_failures_says_the_close_itself_succeeded() {
    let mut b = host().sub_workers(1);
    let bad = b.register_host("bad", |_| Err("unseen".into()));
    let w = b.start().expect("start");
    let handle = w.submit(one_sub_task(bad)).expect("submit");
    drop(handle);
    let e = w.close().expect_err("one unobserved failure");
    let text = e.to_string();
    assert!(
        text.starts_with("the worker closed cleanly, but 1 run(s) failed that nobody waited for: "),
        "{text}"
    );
    assert!(text.contains("unseen"), "{text}");
    assert!(e.worker_closed_cleanly(), "{e:?}");
    // Nothing in the words says the close itself went wrong.
    for teardown_word in ["teardown", "leaked", "timed out", "close failed", "closing failed"] {
        assert!(!text.contains(teardown_word), "{text}");
    }
}

#[test]
fn debug_output_shows_addresses_in_hex() {
    let w = host().chips(&[0]).start().expect("start");
    let mem = w.chip_memory(simpler_types::WorkerId(0)).expect("memory");
    let buf = mem.malloc(4096).expect("malloc");
    let text = format!("{buf:?}");
    assert!(text.contains(&format!("addr: {:#x}", buf.addr())), "{text}");
    let host = simpler_worker::HostBuffer::new(16).expect("buffer");
    assert!(format!("{host:?}").contains(&format!("addr: {:#x}", host.addr())));
    let ptr = simpler_device_a2a3::DevicePtr(0x12c0000);
    assert_eq!(format!("{ptr:?}"), "DevicePtr(0x12c0000)");
    let e = WorkerError::HostTensorAtL2 { arg: 1, addr: simpler_worker::HostAddr(0x1000) };
    assert_eq!(format!("{e:?}"), "HostTensorAtL2 { arg: 1, addr: HostAddr(0x1000) }");
    assert!(e.to_string().contains("names host memory at 0x1000"), "{e}");
    mem.free(buf).expect("free");
    w.close().expect("close");
}

/// An error whose `Display` panics.
#[derive(Debug)]
struct Unprintable;

impl std::fmt::Display for Unprintable {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        panic!("no words for it")
    }
}

impl std::error::Error for Unprintable {}

/// A panic payload whose drop panics.
struct GoesOffWhenDropped;

impl Drop for GoesOffWhenDropped {
    fn drop(&mut self) {
        panic!("the payload went off");
    }
}

/// Runs the one host task `h` on `w`, expecting it to fail by a panic; returns its frame.
fn failed_by_panic(w: &Worker, h: CallableHandle, name: &str) -> Frame {
    let err = w.run(one_sub_task(h)).expect_err("fails");
    let WorkerError::Run(e) = &err else { panic!("{err:?}") };
    assert_eq!(e.kind(), &RunErrorKind::TaskFailed, "{e}");
    let frame = e.frames().iter().find(|f| f.callable.as_deref() == Some(name));
    let frame = frame.unwrap_or_else(|| panic!("no frame of '{name}': {e}")).clone();
    assert_eq!(frame.mechanism, Some(FailureMechanism::Panicked), "{e}");
    frame
}

#[test]
fn a_host_task_error_whose_display_panics_fails_the_task_by_that_panic() {
    let mut b = host().sub_workers(1);
    let bad = b.register_host("unprintable", |_| Err(Unprintable.into()));
    let ok = b.register_host("ok", |_| Ok(()));
    let w = b.start().expect("start");
    let frame = failed_by_panic(&w, bad, "unprintable");
    assert!(
        frame.message.contains("panicked: while formatting the task's error: no words for it"),
        "{}",
        frame.message
    );
    still_serves_then_closes(w, ok);
}

#[test]
fn a_host_task_panic_payload_whose_drop_panics_fails_the_task_by_both_panics() {
    let mut b = host().sub_workers(1);
    let bad = b.register_host("explosive", |_| std::panic::panic_any(GoesOffWhenDropped));
    let ok = b.register_host("ok", |_| Ok(()));
    let w = b.start().expect("start");
    let frame = failed_by_panic(&w, bad, "explosive");
    assert!(
        frame.message.contains(
            "panicked: non-string panic payload; then, while dropping its panic payload: \
             the payload went off"
        ),
        "{}",
        frame.message
    );
    still_serves_then_closes(w, ok);
}

/// The sub worker keeps serving after a task failed: `ok` runs, then `w` closes cleanly.
fn still_serves_then_closes(w: Worker, ok: CallableHandle) {
    w.run(one_sub_task(ok)).expect("the next run");
    w.close().expect("close");
}

/// Asserts that `err` is the configuration error refusing `subs` sub workers at `path`.
fn assert_too_many_subs(err: &StartError, subs: usize, path: &str) {
    let StartCause::Config(config) = &err.cause else { panic!("{err:?}") };
    assert_eq!(config, &ConfigError::TooManySubWorkers { given: subs, limit: MAX_SUB_WORKERS });
    assert_eq!(
        config.to_string(),
        format!(
            "sub_workers = {subs} exceeds the limit of {MAX_SUB_WORKERS} sub workers per level"
        )
    );
    assert_eq!(err.path, path);
}

#[test]
fn a_sub_worker_count_beyond_the_limit_is_refused_at_start() {
    let counts = [MAX_SUB_WORKERS + 1, u32::MAX as usize, 1 << 32, usize::MAX];
    for subs in counts {
        let err = host().sub_workers(subs).start().expect_err("too many sub workers");
        assert_too_many_subs(&err, subs, "L3");
        // At L4 it is refused before any child starts.
        let mut l4 = Worker::composite(4).sub_workers(subs);
        l4.child(host()).expect("child");
        let err = l4.start().expect_err("too many sub workers");
        assert_too_many_subs(&err, subs, "L4");
        // Also for an L4 child of an L5.
        let mut l4 = Worker::composite(4).sub_workers(subs);
        l4.child(host()).expect("child");
        let mut l5 = Worker::composite(5);
        l5.child(l4).expect("child");
        let err = l5.start().expect_err("too many sub workers in the child");
        let StartCause::ChildFailed { child } = &err.cause else { panic!("{err:?}") };
        assert!(child.to_string().contains(&format!("sub_workers = {subs} exceeds")), "{err}");
        assert_eq!(err.path, "L5 / child 0 (L4)");
    }
}

#[test]
fn a_child_of_level_255_is_a_config_error() {
    for parent in [4, 5, 255] {
        let mut b = Worker::composite(parent);
        let err = b.child(Worker::composite(255)).expect_err("level 255 is no child of these");
        assert_eq!(err, ConfigError::ChildLevel { parent, child: 255 });
        assert_eq!(
            err.to_string(),
            format!("an L{parent} worker adopts L{} children, not L255", parent - 1)
        );
    }
}

#[test]
fn a_composite_level_below_4_is_a_config_error_naming_the_level() {
    for level in [0, 3] {
        let mut b = Worker::composite(level);
        let err = b.child(host()).expect_err("no composite worker below L4");
        assert_eq!(err, ConfigError::CompositeLevel { level });
        let err = Worker::composite(level).start().expect_err("no composite worker below L4");
        assert!(
            matches!(err.cause, StartCause::Config(ConfigError::CompositeLevel { level: l }) if l == level),
            "{err:?}"
        );
        assert_eq!(err.path, format!("L{level}"));
    }
}

#[test]
fn a_device_id_given_twice_is_a_config_error_naming_it_and_the_ids() {
    let err = host().chips(&[3, 1, 3]).start().expect_err("device 3 twice");
    let StartCause::Config(ConfigError::DuplicateDevice { duplicate, devices }) = &err.cause else {
        panic!("{err:?}");
    };
    assert_eq!((*duplicate, devices.as_slice()), (3, [3, 1, 3].as_slice()));
    assert_eq!(err.path, "L3");
}

#[test]
fn chip_options_with_chips_in_processes_is_a_config_error() {
    let err = host()
        .chips(&[0])
        .chip_mode(simpler_worker::ChildMode::Process)
        .chip_options(|o| o)
        .start()
        .expect_err("a closure does not cross processes");
    assert!(
        matches!(err.cause, StartCause::Config(ConfigError::ChipOptionsInProcessMode)),
        "{err:?}"
    );
}

#[test]
fn platform_limits_are_checked_at_l3_submit_with_an_error_naming_the_task_value_and_limit() {
    let mut b = host().chips(&[0, 1]);
    let add = b.register_chip(common::add_callable(0));
    let w = b.start().expect("start");
    let limits = Platform::A2a3Sim.limits();
    let cases = [
        (CallConfig::builder().block_dim(100), "CallConfig.block_dim", 100, limits.max_block_dim),
        (
            CallConfig::builder().aicpu_thread_num(9),
            "CallConfig.aicpu_thread_num",
            9,
            limits.max_aicpu_threads,
        ),
    ];
    for (config, want_setting, want_value, want_limit) in cases {
        let config = config.build().expect("a valid CallConfig");
        for group in [false, true] {
            let config = config.clone();
            let e = w
                .submit(Orchestration::graph(move |g, _, _| {
                    if group {
                        let members = vec![TaskArgs::new(), TaskArgs::new()];
                        g.submit_next_level_group(
                            add,
                            members,
                            &config,
                            &[WorkerId(1), WorkerId(0)],
                        )?;
                    } else {
                        g.submit_next_level(add, TaskArgs::new(), &config, WorkerId(1))?;
                    }
                    Ok(())
                }))
                .expect_err("refused at submit");
            let WorkerError::Build { run, cause: simpler_worker::BuildFailure::Callback(e) } = e
            else {
                panic!("expected a callback build failure, got {e:?}");
            };
            match *e.downcast::<WorkerError>().expect("a WorkerError") {
                WorkerError::ConfigOutOfRange { run: r, callable, chip, setting, value, limit } => {
                    assert_eq!(r, run);
                    assert_eq!(callable, "add_0");
                    assert_eq!(chip, WorkerId(1));
                    assert_eq!((setting, value, limit), (want_setting, want_value, want_limit));
                }
                other => panic!("expected ConfigOutOfRange, got {other}"),
            }
        }
    }
    w.close().expect("close");
}

#[test]
fn an_engine_refusal_on_the_lane_is_the_lane_faults_source() {
    use std::error::Error;
    let fault = simpler_worker::LaneFault::Engine(SchedError::ShuttingDown);
    let source = fault.source().expect("the engine's error is the source");
    assert!(matches!(source.downcast_ref::<SchedError>(), Some(SchedError::ShuttingDown)));
}

#[test]
fn a_copy_of_a_freed_buffer_is_refused_even_where_a_later_allocation_took_its_address() {
    let w = host().chips(&[0]).start().expect("start");
    let mem = w.chip_memory(simpler_types::WorkerId(0)).expect("memory");
    let a = mem.malloc(64).expect("malloc");
    let stale = a;
    mem.free(a).expect("free");
    // The simulator's allocator usually hands a freed block out again at once (other tests'
    // threads may take it first): allocate a few times to get the address back, so that the
    // stale copy names someone else's live allocation. Either way the copy must be refused as
    // freed, not reach the device (which would refuse an address it no longer has otherwise).
    let mut live = Vec::new();
    for _ in 0..8 {
        let b = mem.malloc(64).expect("malloc");
        mem.copy_to(&b, 0, &[7; 8]).expect("copy to a live buffer");
        let reused = b.addr() == stale.addr();
        live.push(b);
        if reused {
            break;
        }
    }
    let freed = |r: Result<(), WorkerError>| match r {
        Err(WorkerError::Memory(simpler_worker::MemError::Freed { addr, .. })) => {
            assert_eq!(addr, stale.addr());
        }
        other => panic!("the stale copy reached the device: {other:?}"),
    };
    freed(mem.copy_to(&stale, 0, &[1; 8]));
    freed(mem.copy_from(&stale, 0, &mut [0; 8]));
    freed(mem.free(stale));
    // The allocations, the one that may have reused the address included, are untouched.
    for b in live {
        let mut back = [0u8; 8];
        mem.copy_from(&b, 0, &mut back).expect("copy from a live buffer");
        assert_eq!(back, [7; 8]);
        mem.free(b).expect("free");
    }
    w.close().expect("close");
}

/// An error whose `Display` fails, which `to_string` turns into a panic.
#[derive(Debug)]
struct FailsToFormat;

impl std::fmt::Display for FailsToFormat {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Err(std::fmt::Error)
    }
}

impl std::error::Error for FailsToFormat {}

#[test]
fn a_graph_callback_whose_error_or_panic_cannot_be_formatted_or_dropped_still_gets_build() {
    let mut b = host().sub_workers(1);
    let ok = b.register_host("ok", |_| Ok(()));
    let w = b.start().expect("start");
    let graphs: [Orchestration; 3] = [
        Orchestration::graph(|_, _, _| Err(Box::new(FailsToFormat))),
        Orchestration::graph(|_, _, _| Err(Unprintable.into())),
        Orchestration::graph(|_, _, _| std::panic::panic_any(GoesOffWhenDropped)),
    ];
    for (i, orch) in graphs.into_iter().enumerate() {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.submit(orch)));
        match r {
            Ok(Err(WorkerError::Build { .. })) => {}
            Ok(other) => panic!("graph {i}: {:?}", other.map(|_| ())),
            Err(_) => panic!("graph {i}: submit panicked instead of returning Build"),
        }
    }
    // Every run was observed: the close has nothing unobserved to report.
    still_serves_then_closes(w, ok);
}

/// Sets its flag when dropped; panics then too when `panics`.
struct DropFlag {
    dropped: std::sync::Arc<std::sync::atomic::AtomicBool>,
    panics: bool,
}

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.dropped.store(true, std::sync::atomic::Ordering::SeqCst);
        if self.panics {
            panic!("this capture panics when dropped");
        }
    }
}

#[test]
fn a_closure_whose_capture_panics_when_dropped_at_close_leaves_the_others_dropped() {
    let mut b = host().sub_workers(1);
    let mut flags = Vec::new();
    for i in 0..9 {
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let capture = DropFlag { dropped: std::sync::Arc::clone(&dropped), panics: i == 4 };
        b.register_host(&format!("holds_{i}"), move |_| {
            let _ = &capture;
            Ok(())
        });
        flags.push(dropped);
    }
    b.start().expect("start").close().expect("close");
    for (i, f) in flags.iter().enumerate() {
        assert!(
            f.load(std::sync::atomic::Ordering::SeqCst),
            "closure {i}'s capture was not dropped"
        );
    }
}
