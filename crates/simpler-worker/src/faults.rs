//! Injected chip faults for the rollback and teardown paths the simulator cannot produce on
//! demand: a failed attach, a failed registration or removal, a failed finalize and residue
//! left after finalize (`docs/worker-protocols.md` §2 and §6 step 6).
//!
//! Faults are armed per chip index through a handle shared by a builder and the chip states it
//! creates, so a test can arm one before `start` or while the worker runs. Outside tests the
//! handle is empty and every check is `false`.

use simpler_types::WorkerId;

/// One point where a chip call can be made to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Fault {
    /// Attaching the chip at start fails.
    Attach,
    /// Preparing a chip callable fails.
    Register,
    /// Removing a chip callable from the chip fails (it stays on the device).
    Unregister,
    /// Finalizing the chip reports an error (the runner is still finalized).
    Finalize,
    /// Finalizing the chip leaves a device thread behind.
    Leak,
    /// Finalizing the chip panics (after the runner was finalized).
    FinalizePanic,
    /// Preparing a chip run panics inside the chip state, before the runner's `prepare`.
    PreparePanic,
    /// Launching an L2 run panics on the lane.
    LaunchPanic,
    /// An L3 start's deadline passes right after its chips attached (armed on chip 0).
    DeadlineAfterAttach,
    /// A level's engine refuses to start after its chips or children did (armed on 0): its
    /// ring is swapped for one of 1000 heap bytes, which the engine refuses.
    EngineRefused,
    /// The system refuses the thread that would attach the chip at start.
    AttachThreadRefused,
}

/// The faults armed for the chips of one worker.
#[derive(Clone, Debug, Default)]
pub(crate) struct Faults {
    #[cfg(test)]
    armed: std::sync::Arc<parking_lot::Mutex<std::collections::HashSet<(u32, Fault)>>>,
}

impl Faults {
    /// Whether `fault` is armed for `chip`.
    pub(crate) fn hit(&self, chip: WorkerId, fault: Fault) -> bool {
        #[cfg(test)]
        let hit = self.armed.lock().contains(&(chip.0, fault));
        #[cfg(not(test))]
        let hit = {
            let _ = (chip, fault);
            false
        };
        hit
    }

    /// Arms `fault` for chip index `chip` until disarmed.
    #[cfg(test)]
    pub(crate) fn arm(&self, chip: u32, fault: Fault) {
        self.armed.lock().insert((chip, fault));
    }

    /// Disarms `fault` for chip index `chip`.
    #[cfg(test)]
    pub(crate) fn disarm(&self, chip: u32, fault: Fault) {
        self.armed.lock().remove(&(chip, fault));
    }
}

#[cfg(test)]
mod tests {
    use simpler_device_a2a3::{
        ChipCallable, DeviceError, OrchArgs, OrchConfig, OrchCtx, OrchError, Platform,
        RuntimeVariant,
    };
    use simpler_types::WorkerId;

    use super::Fault;
    use crate::{
        LaneFault, Leak, Leaked, StartCause, TeardownCause, TeardownError, TeardownPart, Worker,
        WorkerError,
    };

    /// Whether `t` is chip `chip`'s finalize failing with the injected device error.
    fn injected_finalize(t: &TeardownError, chip: u32) -> bool {
        let finalize = matches!(
            &t.cause,
            TeardownCause::Device(e) if matches!(
                &**e,
                simpler_device_a2a3::DeviceError::Busy { call: "finalize", .. }
            )
        );
        finalize && t.what == TeardownPart::Chip(WorkerId(chip))
    }

    /// The injected stuck device thread of chip `chip`, under the parts `outer`.
    fn injected_leak(outer: &[TeardownPart], chip: u32) -> Leak {
        let mut at = outer.to_vec();
        at.push(TeardownPart::Chip(WorkerId(chip)));
        Leak { at, what: Leaked::DeviceThread("(injected)".to_owned()) }
    }

    fn orchestration(_: &mut OrchCtx<'_>, _: &OrchArgs<'_>) -> Result<(), OrchError> {
        Ok(())
    }

    fn config(_: &OrchArgs<'_>) -> OrchConfig {
        OrchConfig { expected_arg_count: 0 }
    }

    /// Chip content without kernels; `variant` makes it distinct.
    fn content(variant: u32) -> ChipCallable {
        ChipCallable::native(orchestration, config)
            .names(format!("empty_{variant}"), "empty_config")
            .build()
            .expect("valid callable")
    }

    fn child0() -> TeardownPart {
        TeardownPart::Child(WorkerId(0))
    }

    fn host() -> crate::HostWorkerBuilder {
        Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph)
    }

    #[test]
    fn a_second_failure_during_start_rollback_is_attached_to_the_start_error() {
        // L3: chip 1 fails to attach; finalizing chip 0 during the rollback fails too.
        let b = host().chips(&[0, 1]);
        b.faults().arm(1, Fault::Attach);
        b.faults().arm(0, Fault::Finalize);
        let e = b.start().expect_err("chip 1 fails");
        assert!(matches!(e.cause, StartCause::Device { chip: WorkerId(1), .. }), "{e}");
        assert!(e.path.contains("chip 1 (device 1)"), "{}", e.path);
        assert_eq!(e.rollback.len(), 1, "{e}");
        assert!(injected_finalize(&e.rollback[0], 0), "{e:?}");
        assert_eq!(e.rollback[0].path, "L3");

        // L4: child 1 fails; closing the started child 0 fails while rolling back.
        let mut l4 = Worker::composite(4);
        let first = host().chips(&[0]);
        first.faults().arm(0, Fault::Finalize);
        let second = host().chips(&[1]);
        second.faults().arm(0, Fault::Attach);
        l4.child(first).expect("child 0");
        l4.child(second).expect("child 1");
        let e = l4.start().expect_err("child 1 fails");
        assert!(matches!(e.cause, StartCause::ChildFailed { .. }), "{e}");
        assert!(e.path.contains("L4 / child 1 (L3) / chip 0 (device 1)"), "{}", e.path);
        assert_eq!(e.rollback.len(), 1, "{e}");
        assert_eq!((e.rollback[0].path.as_str(), &e.rollback[0].what), ("L4", &child0()));
        match &e.rollback[0].cause {
            TeardownCause::Child(close) => {
                assert_eq!(close.teardown.len(), 1, "{close}");
                assert!(injected_finalize(&close.teardown[0], 0), "{close:?}");
                assert!(close.leaked.is_empty(), "{close}");
            }
            other => panic!("closing child 0 gave {other:?}"),
        }
    }

    #[test]
    fn a_refused_attach_thread_still_finalizes_the_chips_already_attaching_before_start_returns() {
        // Chip 1's attach thread is refused; chip 0 was attaching on its own thread by then.
        let b = host().chips(&[0, 1, 2]);
        b.faults().arm(1, Fault::AttachThreadRefused);
        b.faults().arm(0, Fault::Finalize);
        let e = b.start().expect_err("no thread for chip 1");
        assert!(matches!(e.cause, StartCause::ThreadSpawn { .. }), "{e}");
        assert!(e.path.contains("chip 1 (device 1)"), "{}", e.path);
        // Chip 0 was waited for and finalized into the rollback; chip 2 never began.
        assert_eq!(e.rollback.len(), 1, "{e}");
        assert!(injected_finalize(&e.rollback[0], 0), "{e:?}");
    }

    #[test]
    fn a_refused_attach_thread_stays_the_cause_when_the_deadline_passes_while_waiting() {
        // With a one-nanosecond budget the deadline passes while chip 0 still attaches: the
        // refused thread of chip 1 stays the cause, and chip 0 is in its rollback.
        let b = host().chips(&[0, 1]).startup_timeout(std::time::Duration::from_nanos(1));
        b.faults().arm(1, Fault::AttachThreadRefused);
        let e = b.start().expect_err("no thread for chip 1");
        assert!(matches!(e.cause, StartCause::ThreadSpawn { .. }), "{e}");
        assert!(e.path.contains("chip 1 (device 1)"), "{}", e.path);
        let chip0 = |t: &TeardownError| t.what == TeardownPart::Chip(WorkerId(0));
        assert!(e.rollback.iter().all(chip0), "{e:?}");
    }

    #[test]
    fn a_chip_that_failed_to_attach_stays_the_cause_when_the_deadline_passes_while_waiting() {
        // Chip 0 fails at once; chip 1 is still in its options closure (which chip 0 never
        // reaches) when the deadline passes. The first error wins: chip 0's failure is the
        // cause, and chip 1, detached at the deadline, is in its rollback.
        let b = host()
            .chips(&[0, 1])
            .startup_timeout(std::time::Duration::from_secs(1))
            .chip_options(|o| {
                std::thread::sleep(std::time::Duration::from_secs(3));
                o
            });
        b.faults().arm(0, Fault::Attach);
        let e = b.start().expect_err("chip 0 fails to attach");
        assert!(matches!(e.cause, StartCause::Device { chip: WorkerId(0), .. }), "{e}");
        assert!(e.path.contains("chip 0 (device 0)"), "{}", e.path);
        let detached = |t: &TeardownError| {
            t.what == TeardownPart::Chip(WorkerId(1))
                && matches!(t.cause, TeardownCause::AttachDetached { device: 1 })
        };
        assert!(e.rollback.len() == 1 && detached(&e.rollback[0]), "{e:?}");
    }

    #[test]
    fn a_deadline_passed_after_the_chips_attached_finalizes_them_into_the_rollback() {
        let b = host().chips(&[0, 1]);
        b.faults().arm(0, Fault::DeadlineAfterAttach);
        b.faults().arm(1, Fault::Finalize);
        let e = b.start().expect_err("the deadline passed");
        assert!(matches!(e.cause, StartCause::DeadlineExceeded { .. }), "{e}");
        assert_eq!(e.rollback.len(), 1, "{e}");
        assert!(injected_finalize(&e.rollback[0], 1), "{e:?}");
    }

    #[test]
    fn a_ring_the_engine_would_refuse_is_refused_before_any_chip_or_child_starts() {
        // A chip armed to fail its attach would fail the start first if it were attached.
        let b = host().chips(&[0]).heap_ring_size(1000);
        b.faults().arm(0, Fault::Attach);
        let e = b.start().expect_err("ring refused");
        assert!(matches!(e.cause, StartCause::HeapRingSize { value: 1000, .. }), "{e}");
        assert!(e.rollback.is_empty(), "{e}");
        let mut l4 = Worker::composite(4).heap_ring_size(1000);
        let child = host().chips(&[0]);
        child.faults().arm(0, Fault::Attach);
        l4.child(child).expect("adopt");
        let e = l4.start().expect_err("ring refused");
        assert!(matches!(e.cause, StartCause::HeapRingSize { value: 1000, .. }), "{e}");
        assert!(e.rollback.is_empty(), "{e}");
    }

    #[test]
    fn a_failing_engine_start_finalizes_the_chips_and_closes_the_children_attaching_failures() {
        // L3: the chips attached, then the engine refuses the ring size.
        let b = host().chips(&[0]);
        b.faults().arm(0, Fault::Finalize);
        b.faults().arm(0, Fault::EngineRefused);
        let e = b.start().expect_err("engine fails");
        assert!(matches!(e.cause, StartCause::HeapRingSize { value: 1000, .. }), "{e}");
        assert_eq!(e.rollback.len(), 1, "{e}");
        assert!(injected_finalize(&e.rollback[0], 0), "{e:?}");

        // L4: the child started, then the L4 engine refuses the ring size.
        let mut l4 = Worker::composite(4);
        l4.faults().arm(0, Fault::EngineRefused);
        let child = host().chips(&[0]);
        child.faults().arm(0, Fault::Leak);
        l4.child(child).expect("adopt");
        let e = l4.start().expect_err("engine fails");
        assert!(matches!(e.cause, StartCause::HeapRingSize { value: 1000, .. }), "{e}");
        assert_eq!(e.rollback.len(), 1, "{e}");
        // A leak in a rollback is the error of its outermost part.
        assert_eq!(e.rollback[0].what, child0());
        match &e.rollback[0].cause {
            TeardownCause::Leaked(leak) => assert_eq!(*leak, injected_leak(&[], 0)),
            other => panic!("the child's leak gave {other:?}"),
        }
        assert!(
            e.to_string().ends_with("L4 / child 0: leaked: chip 0: stuck device thread (injected)"),
            "{e}"
        );
    }

    #[test]
    fn a_failed_registration_rollback_marks_the_pair_unusable_and_says_so() {
        let b = host().chips(&[0, 1]);
        let faults = b.faults();
        let w = b.start().expect("start");
        let shared = content(1);
        let existing = w.register_chip_on(&shared, &[WorkerId(0)]).expect("existing on chip 0");
        faults.arm(1, Fault::Register);
        faults.arm(0, Fault::Unregister);

        // Content already on chip 0: the rollback only drops a reference, so it cannot fail,
        // and the existing handle survives.
        match w.register_chip(&shared).expect_err("chip 1 fails") {
            WorkerError::Registration { chip, rollback_failed, .. } => {
                assert_eq!(chip, WorkerId(1));
                assert!(rollback_failed.is_empty());
            }
            other => panic!("unexpected {other}"),
        }
        assert_eq!(w.chip_callable_refs(WorkerId(0), shared.id()).expect("refs"), 1);

        // New content: chip 0 prepared it, chip 1 failed, removing it from chip 0 failed.
        let fresh = content(2);
        let e = w.register_chip(&fresh).expect_err("chip 1 fails");
        assert!(e.to_string().contains("rollback failed on chip(s) 0; marked unusable"), "{e}");
        match e {
            WorkerError::Registration { chip, rollback_failed, .. } => {
                assert_eq!(chip, WorkerId(1));
                assert_eq!(rollback_failed, vec![WorkerId(0)]);
            }
            other => panic!("unexpected {other}"),
        }
        faults.disarm(1, Fault::Register);
        faults.disarm(0, Fault::Unregister);

        // The pair (chip 0, fresh) stays unusable; chip 1 and the existing handle are fine.
        match w.register_chip(&fresh).expect_err("unusable on chip 0") {
            WorkerError::CallableUnusable { chip, callable } => {
                assert_eq!(chip, WorkerId(0));
                assert_eq!(callable, "empty_2");
            }
            other => panic!("unexpected {other}"),
        }
        assert_eq!(w.chip_callable_refs(WorkerId(0), fresh.id()).expect("refs"), 0);
        w.register_chip_on(&fresh, &[WorkerId(1)]).expect("usable on chip 1");
        w.unregister(existing).expect("existing handle still valid");
        w.close().expect("close");
    }

    #[test]
    fn a_failed_unregistration_on_one_chip_still_releases_the_others_and_names_the_failures() {
        let b = host().chips(&[0, 1, 2]);
        let faults = b.faults();
        let w = b.start().expect("start");
        let c = content(4);
        let h = w.register_chip(&c).expect("register");
        faults.arm(0, Fault::Unregister);
        match w.unregister(h).expect_err("chip 0 fails") {
            WorkerError::Registration { chip, rollback_failed, .. } => {
                assert_eq!(chip, WorkerId(0));
                assert_eq!(rollback_failed, vec![WorkerId(0)]);
            }
            other => panic!("unexpected {other}"),
        }
        faults.disarm(0, Fault::Unregister);
        for chip in [1, 2] {
            assert_eq!(w.chip_callable_refs(WorkerId(chip), c.id()).expect("refs"), 0);
        }
        assert!(matches!(
            w.register_chip(&c),
            Err(WorkerError::CallableUnusable { chip: WorkerId(0), .. })
        ));
        w.close().expect("close");
    }

    #[test]
    fn a_panic_on_the_l2_lane_fails_the_run_and_the_lane_keeps_serving() {
        let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
        let h = b.register_chip(content(3));
        let faults = b.faults();
        let w = b.start().expect("start");
        faults.arm(0, Fault::LaunchPanic);
        let run = w.submit(crate::Orchestration::chip(h, simpler_types::TaskArgs::new()));
        let waited = run.expect("prepared").wait_timeout(std::time::Duration::from_secs(60));
        let e = waited.expect("the run's fence is set").expect_err("the launch panicked");
        assert!(e.to_string().contains("the run's launch panicked"), "{e}");
        // Before the runner's launch: the device is left usable, and the run failed as a task.
        assert!(!e.device_error().expect("the device error").poisons_device(), "{e}");
        faults.disarm(0, Fault::LaunchPanic);

        // A user closure panicking on the lane fails that call only.
        let r = w.with_sim_faults(WorkerId(0), |_| panic!("user closure panics"));
        assert!(
            matches!(
                &r,
                Err(WorkerError::Lane { fault: LaneFault::Panicked { message }, .. })
                    if message == "user closure panics"
            ),
            "{r:?}"
        );
        w.memory().expect("memory").malloc(64).expect("the lane still serves");
        w.run(crate::Orchestration::chip(h, simpler_types::TaskArgs::new())).expect("run");
        w.close().expect("close");
    }

    #[test]
    fn a_panic_preparing_a_chip_run_fails_it_with_the_panics_text_at_l2_and_l3() {
        let is_prepare_panic = |e: Option<&DeviceError>| {
            matches!(
                e,
                Some(DeviceError::RunPanicked {
                    step: simpler_device_a2a3::RunStep::Prepare,
                    message,
                    unusable: None,
                    ..
                }) if message == "injected panic in prepare"
            )
        };
        let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
        let h = b.register_chip(content(6));
        let faults = b.faults();
        let w = b.start().expect("start");
        faults.arm(0, Fault::PreparePanic);
        let e = w
            .submit(crate::Orchestration::chip(h, simpler_types::TaskArgs::new()))
            .expect_err("the preparation panicked");
        let device = match &e {
            WorkerError::Build { cause: crate::BuildFailure::Device(d), .. } => Some(&**d),
            _ => None,
        };
        assert!(is_prepare_panic(device), "{e:?}");
        faults.disarm(0, Fault::PreparePanic);
        w.run(crate::Orchestration::chip(h, simpler_types::TaskArgs::new())).expect("run");
        w.close().expect("close");

        let mut b = host().chips(&[0]);
        let h = b.register_chip(content(7));
        let faults = b.faults();
        let w = b.start().expect("start");
        faults.arm(0, Fault::PreparePanic);
        let e = w
            .run(crate::Orchestration::graph(move |g, _, _| {
                let cfg = simpler_types::CallConfig::default();
                g.submit_next_level(h, simpler_types::TaskArgs::new(), &cfg, WorkerId(0))?;
                Ok(())
            }))
            .expect_err("the chip task's preparation panicked");
        let WorkerError::Run(e) = e else { panic!("not a run error: {e:?}") };
        assert!(is_prepare_panic(e.device_error()), "{e:?}");
        w.close().expect("close");
    }

    #[test]
    fn a_panic_inside_the_runners_launch_fails_the_run_as_the_device_it_left_unusable() {
        let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
        let h = b.register_chip(content(4));
        let w = b.start().expect("start");
        let kind = simpler_device_a2a3::KernelKind::AiCore;
        w.with_sim_faults(WorkerId(0), move |p| p.panic_after_launch(kind, 1)).expect("armed");
        let run = w.submit(crate::Orchestration::chip(h, simpler_types::TaskArgs::new()));
        let waited = run.expect("prepared").wait_timeout(std::time::Duration::from_secs(60));
        let e = waited.expect("the run's fence is set").expect_err("the launch panicked");
        let device = e.device_error().expect("the device error");
        assert!(
            matches!(
                device,
                DeviceError::RunPanicked {
                    step: simpler_device_a2a3::RunStep::Launch,
                    unusable: Some(_),
                    ..
                }
            ),
            "{device:?}"
        );
        assert!(device.poisons_device(), "{device}");
        assert!(e.to_string().contains("the device is unusable"), "{e}");
        // The L2 frame names the chip callable, as an L3 task's frame does.
        assert_eq!(e.frames()[0].callable.as_deref(), Some("empty_4"));
        assert!(e.to_string().contains("'empty_4'"), "{e}");
        // As the error says: the device refuses what comes next until the chip is finalized.
        assert!(w.memory().expect("memory").malloc(64).is_err());
        let _ = w.close();
    }

    #[test]
    fn chip_diagnostics_after_close_answer_closed() {
        let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
        let c = content(5);
        b.register_chip(c.clone());
        let w = b.start().expect("start");
        assert_eq!(w.chip_callable_refs(WorkerId(0), c.id()).expect("refs"), 1);
        w.close().expect("close");
        let refs = w.chip_callable_refs(WorkerId(0), c.id());
        assert!(matches!(refs, Err(WorkerError::Closed)), "{refs:?}");
        let faults = w.with_sim_faults(WorkerId(0), |_| {});
        assert!(matches!(faults, Err(WorkerError::Closed)), "{faults:?}");
        let pid = w.chip_process_id(WorkerId(0));
        assert!(matches!(pid, Err(WorkerError::Closed)), "{pid:?}");
    }

    /// Counts its drops: registered closures are dropped once, after the teardown.
    struct DropCounter(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl Drop for DropCounter {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn concurrent_closes_run_the_teardown_once_and_share_its_result() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::{Arc, Barrier};

        let drops = Arc::new(AtomicUsize::new(0));
        let counter = DropCounter(Arc::clone(&drops));
        let gate = Arc::new(Barrier::new(2));
        let g2 = Arc::clone(&gate);
        let mut b = host().chips(&[0]).sub_workers(1);
        let hold = b.register_host("hold", move |_| {
            let _ = &counter;
            g2.wait();
            Ok(())
        });
        b.faults().arm(0, Fault::Leak);
        let w = Arc::new(b.start().expect("start"));
        let run = w
            .submit(crate::Orchestration::graph(move |g, _, _| {
                g.submit_sub(hold, simpler_types::TaskArgs::new())?;
                Ok(())
            }))
            .expect("submit");
        let start = Arc::new(Barrier::new(5));
        let closers: Vec<_> = (0..4)
            .map(|_| {
                let (w, start) = (Arc::clone(&w), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    w.close()
                })
            })
            .collect();
        start.wait();
        gate.wait();
        let results: Vec<_> = closers.into_iter().map(|t| t.join().expect("closer")).collect();
        let first = results[0].clone().expect_err("the chip leaks");
        // One teardown: one residue entry, the same for every closer, closures dropped once.
        assert_eq!(first.leaked, [injected_leak(&[], 0)]);
        for r in &results {
            assert_eq!(r.as_ref().expect_err("same result").leaked, first.leaked);
        }
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(run.is_done());
    }

    #[test]
    fn residue_after_teardown_is_leaked_and_replayed_by_later_closes() {
        // L2: the lane's chip leaves a device thread behind.
        let b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
        b.faults().arm(0, Fault::Leak);
        let w = b.start().expect("start");
        let e = w.close().expect_err("residue");
        assert_eq!(e.leaked, [injected_leak(&[], 0)]);
        assert!(e.teardown.is_empty() && !e.is_retryable(), "{e}");
        let again = w.close().expect_err("replayed");
        assert_eq!(again.leaked, e.leaked);
        drop(w);

        // L3: residue is leaked, a failed finalize is a teardown error.
        let b = host().chips(&[0, 1]);
        b.faults().arm(1, Fault::Leak);
        b.faults().arm(0, Fault::Finalize);
        let w = b.start().expect("start");
        let e = w.close().expect_err("residue");
        assert_eq!(e.leaked, [injected_leak(&[], 1)]);
        assert_eq!(e.teardown.len(), 1, "{e}");
        assert!(injected_finalize(&e.teardown[0], 0), "{e:?}");
        assert!(e.to_string().contains(" / chip 0: finalize failed: busy: "), "{e}");
        assert_eq!(w.close().expect_err("replayed").leaked, e.leaked);

        // L3: a finalize that panics on the endpoint thread is a teardown error too.
        let b = host().chips(&[0]);
        b.faults().arm(0, Fault::FinalizePanic);
        let w = b.start().expect("start");
        let e = w.close().expect_err("the panic is reported");
        match e.teardown.as_slice() {
            [TeardownError { what: TeardownPart::Chip(WorkerId(0)), cause, .. }] => match cause {
                TeardownCause::Panicked { step: "finalize", message } => {
                    assert_eq!(message, "chip 0: finalize panicked (injected)");
                }
                other => panic!("a finalize panic gave {other:?}"),
            },
            other => panic!("a finalize panic gave {other:?}"),
        }
        drop(w);

        // L4: a child's residue is the parent's residue.
        let mut l4 = Worker::composite(4);
        let child = host().chips(&[0]);
        child.faults().arm(0, Fault::Leak);
        l4.child(child).expect("adopt");
        let w = l4.start().expect("start");
        let e = w.close().expect_err("residue");
        assert_eq!(e.leaked, [injected_leak(&[child0()], 0)]);
        assert!(e.teardown.is_empty(), "{e}");
        assert_eq!(e.to_string(), "leaked: child 0: chip 0: stuck device thread (injected)");
        assert_eq!(w.close().expect_err("replayed").leaked, e.leaked);
        drop(w);

        // L4: a child whose close fails is a teardown error naming the child, its own close
        // error inside.
        let mut l4 = Worker::composite(4);
        let child = host().chips(&[0]);
        child.faults().arm(0, Fault::Finalize);
        l4.child(child).expect("adopt");
        let w = l4.start().expect("start");
        let e = w.close().expect_err("the child's close failed");
        match e.teardown.as_slice() {
            [TeardownError { what, cause: TeardownCause::Child(close), .. }] => {
                assert_eq!(*what, child0());
                assert!(matches!(close.teardown.as_slice(), [t] if injected_finalize(t, 0)));
            }
            other => panic!("a failing child close gave {other:?}"),
        }
        assert!(e.leaked.is_empty(), "{e}");
    }
}
