//! Calls back into a worker from code the worker runs — a host closure of a child, a closure on
//! a chip's own lane, the drop of a keep-alive or of a closure's captures — are reentrant: they
//! are served or refused, never deadlocked. Each would-be hang is turned into a bounded failure by
//! running the body on a thread and waiting with a generous bound.

mod common;

use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Duration;

use common::{HANG, bounded, host, one_sub_task};
#[cfg(feature = "sim")]
use simpler_device_a2a3::{Platform, RuntimeVariant};
use simpler_types::{CallConfig, TaskArgs, WorkerId};
use simpler_worker::{Orchestration, Worker, WorkerError};

/// What an L3 child's host closure did to its L4 parent, reported over a channel.
type Report = mpsc::Receiver<String>;

/// An L3 builder whose chips run in this process, whatever mode the suite checks: a chip lane
/// to call back from exists only there (a chip process runs no closure of this one).
#[cfg(feature = "sim")]
fn lane_host() -> simpler_worker::HostWorkerBuilder {
    Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph)
}

/// Starts an L4 worker whose one L3 child runs `act` (given the L4 worker) in a host closure,
/// and submits one parent run that reaches that closure. The closure reports `act`'s answer.
fn l4_with_child_closure(
    act: impl Fn(&Worker) -> String + Send + Sync + 'static,
) -> (Arc<Worker>, simpler_worker::RunHandle, Report) {
    let parent: Arc<OnceLock<Arc<Worker>>> = Arc::new(OnceLock::new());
    let p2 = Arc::clone(&parent);
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let mut l3 = host().sub_workers(1);
    let inner = l3.register_host("acts_on_parent", move |_| {
        let l4 = p2.get().ok_or("no parent")?;
        let _ = tx.lock().map(|t| t.send(act(l4)));
        Ok(())
    });
    let mut l4 = Worker::composite(4);
    l4.child(l3).expect("child");
    let gr = l4.register_graph("g", move |g, _, _| {
        g.submit_sub(inner, TaskArgs::new())?;
        Ok(())
    });
    let w = Arc::new(l4.start().expect("start"));
    let _ = parent.set(Arc::clone(&w));
    let h = w
        .submit(Orchestration::graph(move |g, _, _| {
            g.submit_next_level(gr, TaskArgs::new(), &CallConfig::default(), WorkerId(0))?;
            Ok(())
        }))
        .expect("submit");
    (w, h, rx)
}

#[test]
fn run_and_close_on_an_l4_worker_from_its_l3_childs_host_closure_are_reentrant() {
    let (w, h, rx) = l4_with_child_closure(|l4| {
        let run = l4.run(Orchestration::graph(|_, _, _| Ok(())));
        let submit = l4.submit(Orchestration::graph(|_, _, _| Ok(()))).map(|_| ());
        let close = l4.close();
        format!(
            "{} {} {}",
            matches!(run, Err(WorkerError::Reentrant { .. })),
            matches!(submit, Err(WorkerError::Reentrant { .. })),
            close.is_err_and(|e| e.reentrant)
        )
    });
    assert_eq!(rx.recv_timeout(HANG).as_deref(), Ok("true true true"));
    assert!(matches!(h.wait_timeout(HANG), Some(Ok(()))), "the parent run never finished");
    // The parent's cycle through the OnceLock is broken by closing; the Arc is then dropped.
    w.close().expect("close");
}

#[test]
fn dropping_the_last_l4_handle_inside_its_l3_childs_host_closure_does_not_hang() {
    let slot: Arc<Mutex<Option<Worker>>> = Arc::new(Mutex::new(None));
    let s2 = Arc::clone(&slot);
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let gate = Arc::new(std::sync::Barrier::new(2));
    let g2 = Arc::clone(&gate);
    let mut l3 = host().sub_workers(1);
    let inner = l3.register_host("drops_parent", move |_| {
        g2.wait();
        let last = s2.lock().map(|mut s| s.take()).ok().flatten();
        drop(last);
        let _ = tx.lock().map(|t| t.send(()));
        Ok(())
    });
    let mut l4 = Worker::composite(4);
    l4.child(l3).expect("child");
    let gr = l4.register_graph("g", move |g, _, _| {
        g.submit_sub(inner, TaskArgs::new())?;
        Ok(())
    });
    let w = l4.start().expect("start");
    let h = w
        .submit(Orchestration::graph(move |g, _, _| {
            g.submit_next_level(gr, TaskArgs::new(), &CallConfig::default(), WorkerId(0))?;
            Ok(())
        }))
        .expect("submit");
    *slot.lock().expect("slot") = Some(w);
    gate.wait();
    assert_eq!(rx.recv_timeout(HANG), Ok(()), "the drop inside the closure never returned");
    assert!(h.wait_timeout(HANG).is_some(), "the parent run never finished");
}

/// A keep-alive that, when dropped, submits to or closes the worker it was given to.
struct TouchesWorkerOnDrop {
    worker: Arc<Mutex<Option<Arc<Worker>>>>,
    close: bool,
    report: mpsc::Sender<bool>,
}

impl Drop for TouchesWorkerOnDrop {
    fn drop(&mut self) {
        let w = self.worker.lock().ok().and_then(|mut w| w.take());
        if let Some(w) = w {
            let ok = if self.close {
                w.close().is_ok()
            } else {
                w.submit(Orchestration::graph(|_, _, _| Ok(()))).is_ok()
            };
            let _ = self.report.send(ok);
        }
    }
}

/// Submits a run nobody waits for, carrying a [`TouchesWorkerOnDrop`]; then a second thread
/// submits again (or closes), which publishes the first run and drops its keep-alive. Returns
/// what the keep-alive's own submit or close answered.
fn keep_alive_touching_the_worker_when_dropped(close: bool) -> Result<bool, String> {
    let slot = Arc::new(Mutex::new(None));
    let (tx, rx) = mpsc::channel();
    let mut b = host().sub_workers(1);
    let h = b.register_host("noop", |_| Ok(()));
    let w = Arc::new(b.start().expect("start"));
    *slot.lock().expect("slot") = Some(Arc::clone(&w));
    let keep = TouchesWorkerOnDrop { worker: slot, close, report: tx };
    let orch = one_sub_task(h);
    drop(w.submit(orch.keep_alive(keep)).expect("submit"));
    std::thread::spawn(move || {
        if close {
            let _ = w.close();
        } else {
            let _ = w.submit(Orchestration::graph(|_, _, _| Ok(())));
        }
    });
    rx.recv_timeout(HANG).map_err(|e| format!("the keep-alive's drop never returned: {e:?}"))
}

#[test]
fn a_keep_alive_dropped_by_the_next_submit_may_submit_to_the_worker() {
    assert_eq!(keep_alive_touching_the_worker_when_dropped(false), Ok(true));
}

#[test]
fn a_keep_alive_dropped_by_close_may_close_the_worker() {
    assert_eq!(keep_alive_touching_the_worker_when_dropped(true), Ok(true));
}

#[test]
fn a_closure_whose_captures_close_the_worker_may_be_unregistered() {
    let slot = Arc::new(Mutex::new(None));
    let (tx, rx) = mpsc::channel();
    let mut b = host().sub_workers(1);
    let keep = TouchesWorkerOnDrop { worker: Arc::clone(&slot), close: true, report: tx };
    // The closure owns the keep-alive: unregistering its last handle drops it.
    let h = b.register_host("closes on drop", move |_| {
        let _owned = &keep;
        Ok(())
    });
    let w = Arc::new(b.start().expect("start"));
    *slot.lock().expect("slot") = Some(Arc::clone(&w));
    let unregistered = bounded("unregister", move || w.unregister(h).is_ok());
    assert_eq!(unregistered, Ok(true));
    assert_eq!(rx.recv_timeout(HANG), Ok(true), "the captured value's close never returned");
}

#[test]
fn a_keep_alive_of_a_refused_orchestration_may_submit_to_the_worker_when_dropped() {
    let slot = Arc::new(Mutex::new(None));
    let (tx, rx) = mpsc::channel();
    let mut b = host().sub_workers(1);
    let h = b.register_host("noop", |_| Ok(()));
    let w = Arc::new(b.start().expect("start"));
    *slot.lock().expect("slot") = Some(Arc::clone(&w));
    let keep = TouchesWorkerOnDrop { worker: slot, close: false, report: tx };
    // A chip orchestration on an L3 worker is refused; its keep-alive is dropped by submit.
    let refused = bounded("refused submit", move || {
        matches!(
            w.submit(Orchestration::chip(h, TaskArgs::new()).keep_alive(keep)),
            Err(WorkerError::WrongLevel { .. })
        )
    });
    assert_eq!(refused, Ok(true));
    assert_eq!(rx.recv_timeout(HANG), Ok(true));
}

#[test]
fn a_keep_alive_dropped_by_free_may_close_the_worker() {
    let slot = Arc::new(Mutex::new(None));
    let (tx, rx) = mpsc::channel();
    let mut b = host().chips(&[0]).sub_workers(1);
    let h = b.register_host("noop", |_| Ok(()));
    let w = Arc::new(b.start().expect("start"));
    let buf = w.chip_memory(WorkerId(0)).expect("chip 0").malloc(64).expect("malloc");
    *slot.lock().expect("slot") = Some(Arc::clone(&w));
    let keep = TouchesWorkerOnDrop { worker: slot, close: true, report: tx };
    let orch = one_sub_task(h);
    drop(w.submit(orch.keep_alive(keep)).expect("submit"));
    // `free` waits for the unwaited run, publishing it and dropping its keep-alive.
    std::thread::spawn(move || {
        let _ = w.chip_memory(WorkerId(0)).map(|m| m.free(buf));
    });
    assert_eq!(rx.recv_timeout(HANG), Ok(true), "the keep-alive's close never returned");
}

#[cfg(feature = "sim")]
/// Every memory call on `chip`, made from a closure running on `chip`'s own lane; then a
/// malloc and a registration on `other` (if any) from the same closure.
fn memory_calls_from_the_lane(
    w: Arc<Worker>,
    chip: WorkerId,
    other: Option<WorkerId>,
) -> Result<Vec<String>, String> {
    let buf = w.chip_memory(chip).or_else(|_| w.memory()).unwrap().malloc(64).unwrap();
    bounded("memory calls on the lane", move || {
        let (tx, rx) = mpsc::channel();
        let w2 = Arc::clone(&w);
        let ran_on_lane = w.with_sim_faults(chip, move |_| {
            let mem = w2.chip_memory(chip).or_else(|_| w2.memory()).unwrap();
            let mut out = [0u8; 4];
            let results = [
                mem.malloc(64).map(drop),
                mem.copy_to(&buf, 0, &[1, 2, 3, 4]),
                mem.copy_from(&buf, 0, &mut out),
                mem.ledger().map(drop),
                mem.free(buf),
            ];
            let mut ops: Vec<String> = results
                .into_iter()
                .map(|r| match r {
                    Err(WorkerError::Reentrant { op, .. }) => op.to_owned(),
                    other => format!("not reentrant: {other:?}"),
                })
                .collect();
            if let Some(other) = other {
                let on_other = [
                    w2.chip_memory(other).unwrap().malloc(64).map(drop),
                    w2.register_chip_on(&common::add_callable(4), &[other]).map(drop),
                ];
                ops.extend(on_other.into_iter().map(|r| match r {
                    Err(WorkerError::Reentrant { op, .. }) => format!("other chip: {op}"),
                    other => format!("other chip, not reentrant: {other:?}"),
                }));
            }
            let _ = tx.send(ops);
        });
        assert_eq!(ran_on_lane.map_err(|e| e.to_string()), Ok(true), "the closure ran on the lane");
        let ops = rx.recv().expect("the closure ran");
        // The buffer is still allocated and usable from outside the lane.
        let mem = w.chip_memory(chip).or_else(|_| w.memory()).unwrap();
        mem.free(buf).expect("free from outside the lane");
        ops
    })
}

#[cfg(feature = "sim")]
#[test]
fn a_memory_call_from_a_closure_on_its_own_l2_chip_lane_is_reentrant() {
    let w = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph).start().unwrap();
    let ops = memory_calls_from_the_lane(Arc::new(w), WorkerId(0), None);
    assert_eq!(ops.unwrap(), ["malloc", "copy_to", "copy_from", "ledger", "free"]);
}

#[cfg(feature = "sim")]
#[test]
fn a_chip_call_from_a_closure_on_an_l3_chip_lane_is_reentrant_on_every_chip_of_the_worker() {
    // A call that waits for another lane could wait for a lane that waits for this one: two
    // closures calling each other's chips, or a registration holding the registration lock
    // while it waits for this lane. Each would hang for good.
    let w = lane_host().chips(&[0, 1]).start().unwrap();
    let ops = memory_calls_from_the_lane(Arc::new(w), WorkerId(0), Some(WorkerId(1)));
    let expected = ["malloc", "copy_to", "copy_from", "ledger", "free"]
        .into_iter()
        .map(str::to_owned)
        .chain(["other chip: malloc".to_owned(), "other chip: register_chip".to_owned()]);
    assert_eq!(ops.unwrap(), expected.collect::<Vec<_>>());
}

#[cfg(feature = "sim")]
#[test]
fn registering_and_unregistering_from_a_closure_on_the_chips_own_lane_is_reentrant() {
    let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
    let add = b.register_chip(common::add_callable(0));
    let w = Arc::new(b.start().unwrap());
    let w2 = Arc::clone(&w);
    let answers = bounded("registration calls on the lane", move || {
        let (tx, rx) = mpsc::channel();
        let w3 = Arc::clone(&w2);
        let ran_on_lane = w2.with_sim_faults(WorkerId(0), move |_| {
            let name = |r: Result<(), WorkerError>| match r {
                Err(WorkerError::Reentrant { op, .. }) => op.to_owned(),
                other => format!("not reentrant: {other:?}"),
            };
            let registered = w3.register_chip(&common::add_callable(1)).map(drop);
            let _ = tx.send([name(registered), name(w3.unregister(add))]);
        });
        assert_eq!(ran_on_lane.map_err(|e| e.to_string()), Ok(true), "the closure ran on the lane");
        rx.recv().expect("the closure ran")
    });
    assert_eq!(answers.unwrap(), ["register_chip", "unregister"]);
    // Nothing changed: the handle still works and holds its one reference.
    assert_eq!(w.chip_callable_refs(WorkerId(0), common::add_callable(0).id()).unwrap(), 1);
    w.unregister(add).expect("unregister from outside the lane");
    assert_eq!(w.chip_callable_refs(WorkerId(0), common::add_callable(0).id()).unwrap(), 0);
}

#[test]
fn free_during_another_threads_graph_callback_waits_for_that_run() {
    let mut b = host().chips(&[0]).sub_workers(1);
    let noop = b.register_host("noop", |_| Ok(()));
    let w = Arc::new(b.start().expect("start"));
    let buf = w.chip_memory(WorkerId(0)).expect("chip 0").malloc(64).expect("malloc");
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let builder = Arc::clone(&w);
    let submitter = std::thread::spawn(move || {
        let handle = builder.submit(Orchestration::graph(move |g, _, _| {
            g.submit_sub(noop, TaskArgs::new())?;
            let _ = entered_tx.send(());
            // Held open until the test lets it go: the run is still being built meanwhile.
            let _ = release_rx.recv_timeout(HANG);
            Ok(())
        }))?;
        Ok::<_, WorkerError>(handle.wait())
    });
    entered_rx.recv_timeout(HANG).expect("the graph callback ran");
    let (freed_tx, freed_rx) = mpsc::channel();
    let freer = Arc::clone(&w);
    std::thread::spawn(move || {
        let _ = freed_tx.send(freer.chip_memory(WorkerId(0)).and_then(|m| m.free(buf)));
    });
    // The free waits for the run being built; it must not return while the callback is open.
    let early = freed_rx.recv_timeout(Duration::from_millis(200));
    assert!(early.is_err(), "free returned while the run was still being built: {early:?}");
    release_tx.send(()).expect("the callback waits");
    let waited = submitter.join().expect("the submitting thread");
    assert!(matches!(waited, Ok(Ok(()))), "the run's own outcome: {waited:?}");
    let freed = freed_rx.recv_timeout(HANG).expect("free returned after the run");
    assert!(freed.is_ok(), "{freed:?}");
    w.close().expect("close");
}

#[cfg(feature = "sim")]
/// `submit`, `run` and `close` on `w`, made from a closure running on chip `chip`'s own lane;
/// `orch` makes an orchestration that needs that chip.
fn run_calls_from_the_lane(
    w: Arc<Worker>,
    chip: WorkerId,
    orch: impl Fn() -> Orchestration + Send + 'static,
) -> Result<[String; 3], String> {
    bounded("submit, run and close on the lane", move || {
        let (tx, rx) = mpsc::channel();
        let w2 = Arc::clone(&w);
        let ran_on_lane = w.with_sim_faults(chip, move |_| {
            let name = |r: Result<(), WorkerError>| match r {
                Err(WorkerError::Reentrant { op, .. }) => op.to_owned(),
                other => format!("not reentrant: {other:?}"),
            };
            let submitted = name(w2.submit(orch()).map(drop));
            let ran = name(w2.run(orch()));
            let closed = match w2.close() {
                Err(e) if e.reentrant => "close".to_owned(),
                other => format!("not reentrant: {other:?}"),
            };
            let _ = tx.send([submitted, ran, closed]);
        });
        assert_eq!(ran_on_lane.map_err(|e| e.to_string()), Ok(true), "the closure ran on the lane");
        let answers = rx.recv().expect("the closure ran");
        // Nothing was left behind on the lane or in the close gate.
        w.close().expect("close from outside the lane");
        answers
    })
}

#[cfg(feature = "sim")]
#[test]
fn submit_run_and_close_from_a_closure_on_an_l2_workers_lane_are_reentrant() {
    let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
    let add = b.register_chip(common::add_callable(0));
    let w = Arc::new(b.start().unwrap());
    let answers =
        run_calls_from_the_lane(w, WorkerId(0), move || Orchestration::chip(add, TaskArgs::new()));
    assert_eq!(answers.unwrap(), ["submit", "run", "close"]);
}

#[cfg(feature = "sim")]
#[test]
fn submit_run_and_close_from_a_closure_on_an_l3_chip_lane_are_reentrant() {
    let mut b = lane_host().chips(&[0]);
    let add = b.register_chip(common::add_callable(0));
    let w = Arc::new(b.start().unwrap());
    let answers = run_calls_from_the_lane(w, WorkerId(0), move || {
        Orchestration::graph(move |g, _, _| {
            g.submit_next_level(add, TaskArgs::new(), &CallConfig::default(), WorkerId(0))?;
            Ok(())
        })
    });
    assert_eq!(answers.unwrap(), ["submit", "run", "close"]);
}

/// The worker and chip a native orchestration calls back into, and what it was answered.
#[cfg(feature = "sim")]
static CALLED_BACK: Mutex<Option<(Arc<Worker>, WorkerId)>> = Mutex::new(None);
#[cfg(feature = "sim")]
static ANSWERS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A native orchestration that asks its own worker for the chip's memory ledger: a memory call
/// made on the chip's lane, where the preparation runs it.
#[cfg(feature = "sim")]
fn asks_its_worker(
    _: &mut simpler_device_a2a3::OrchCtx<'_>,
    _: &simpler_device_a2a3::OrchArgs<'_>,
) -> Result<(), simpler_device_a2a3::OrchError> {
    let target = CALLED_BACK.lock().unwrap().clone();
    if let Some((w, chip)) = target {
        let answer = match w.chip_memory(chip).or_else(|_| w.memory()).map(|m| m.ledger()) {
            Ok(Err(WorkerError::Reentrant { op, .. })) => op.to_owned(),
            other => format!("not reentrant: {:?}", other.map(|r| r.map(drop))),
        };
        ANSWERS.lock().unwrap().push(answer);
    }
    Ok(())
}

#[cfg(feature = "sim")]
fn asks_its_worker_callable() -> simpler_device_a2a3::ChipCallable {
    simpler_device_a2a3::ChipCallable::native(asks_its_worker, |_| Default::default())
        .names("asks_its_worker", "asks_its_worker_config")
        .build()
        .expect("valid")
}

#[cfg(feature = "sim")]
#[test]
fn a_native_orchestration_calling_back_into_its_worker_is_reentrant_at_l2_and_l3() {
    // The orchestration of a host_build_graph run is prepared on the chip's lane; a memory call
    // from it would queue behind the preparation that waits for it.
    let mut l2 = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
    let at_l2 = l2.register_chip(asks_its_worker_callable());
    let mut l3 = lane_host().chips(&[0]);
    let at_l3 = l3.register_chip(asks_its_worker_callable());
    let l2 = Arc::new(l2.start().unwrap());
    let l3 = Arc::new(l3.start().unwrap());
    let runs: [(Arc<Worker>, Orchestration); 2] = [
        (Arc::clone(&l2), Orchestration::chip(at_l2, TaskArgs::new())),
        (
            Arc::clone(&l3),
            Orchestration::graph(move |g, _, _| {
                g.submit_next_level(at_l3, TaskArgs::new(), &CallConfig::default(), WorkerId(0))?;
                Ok(())
            }),
        ),
    ];
    for (w, orch) in runs {
        *CALLED_BACK.lock().unwrap() = Some((Arc::clone(&w), WorkerId(0)));
        let ran = bounded("a run whose orchestration calls back", move || w.run(orch).is_ok());
        *CALLED_BACK.lock().unwrap() = None;
        assert!(ran.is_ok(), "{ran:?}");
    }
    assert_eq!(*ANSWERS.lock().unwrap(), ["ledger", "ledger"]);
    for w in [l2, l3] {
        Arc::into_inner(w).expect("the only handle").close().expect("close");
    }
}
