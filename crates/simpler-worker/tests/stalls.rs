//! A run that does not end (a host task that never returns) is never waited for in silence: a
//! wait logs what it waits for at the builder's interval, a bounded close names the pending
//! runs and the running tasks, and a drop after a bounded close that gave up returns.

mod common;

use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use common::{HANG, host, one_sub_task};
use simpler_worker::Worker;

/// Log lines written by a `tracing` subscriber.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Capture {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}

/// Everything this test binary logged so far (one process-wide subscriber: a scoped one may
/// miss events of call sites first reached on other threads).
fn captured() -> String {
    static CAPTURE: OnceLock<Capture> = OnceLock::new();
    let capture = CAPTURE.get_or_init(|| {
        let capture = Capture::default();
        let subscriber =
            tracing_subscriber::fmt().with_writer(capture.clone()).with_ansi(false).finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        capture
    });
    capture.text()
}

/// An L3 worker warning every 50 ms, with one host closure `hold` that says it started on the
/// returned receiver, then returns once the returned sender sends (or is dropped).
fn held_worker() -> (Worker, simpler_worker::CallableHandle, mpsc::Sender<()>, mpsc::Receiver<()>) {
    let (release, held) = mpsc::channel::<()>();
    let (started, running) = mpsc::channel::<()>();
    let (held, started) = (Mutex::new(held), Mutex::new(started));
    let mut b = host().sub_workers(1).still_waiting_warning(Duration::from_millis(50));
    let h = b.register_host("hold", move |_| {
        let _ = started.lock().unwrap_or_else(|e| e.into_inner()).send(());
        let _ = held.lock().unwrap_or_else(|e| e.into_inner()).recv();
        Ok(())
    });
    (b.start().expect("start"), h, release, running)
}

#[test]
fn a_wait_for_a_run_that_does_not_end_says_what_it_waits_for() {
    captured();
    let (w, h, release, running) = held_worker();
    let run = w.submit(one_sub_task(h)).expect("submit");
    // The timed calls below look for the running task: it must have started.
    running.recv_timeout(HANG).expect("the held task started");
    let waited = run.wait_timeout(Duration::from_millis(400));
    assert!(waited.is_none(), "the held run ended: {waited:?}");
    let text = captured();
    let id = run.run_id().to_string();
    assert!(text.contains("WARN") && text.contains(&format!("still waiting for {id}")), "{text}");
    assert!(text.contains(&format!("running {id}/task#0")), "the busy task is named: {text}");
    release.send(()).expect("release");
    run.wait().expect("the run ends once released");
    w.close().expect("close");
}

#[test]
fn a_drop_after_a_close_that_gave_up_returns_and_the_close_names_what_it_waited_for() {
    let (w, h, release, running) = held_worker();
    let run = w.submit(one_sub_task(h)).expect("submit");
    // The timed calls below look for the running task: it must have started.
    running.recv_timeout(HANG).expect("the held task started");
    let id = run.run_id().to_string();
    let e = w.close_timeout(Duration::from_millis(100)).expect_err("the drain cannot end");
    let timed_out = e.drain_timeout.as_ref().expect("a drain timeout");
    assert_eq!(timed_out.pending.len(), 1);
    let text = e.to_string();
    assert!(text.contains(&format!("1 run(s) pending: {id})")), "{text}");
    assert!(text.contains("busy: ") && text.contains(&format!("running {id}/task#0")), "{text}");
    // The drop must not wait for the held task: the caller asked for a bound.
    let (dropped, done) = mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        drop(w);
        let _ = dropped.send(());
    });
    done.recv_timeout(HANG).unwrap_or_else(|_| panic!("the drop waited for the held run"));
    assert!(started.elapsed() < HANG);
    // Released, the run ends and the detached close finishes it.
    release.send(()).expect("release");
    run.wait().expect("the run ends once released");
}

#[test]
fn a_warning_interval_past_what_an_instant_holds_never_warns_and_never_panics() {
    let (release, held) = mpsc::channel::<()>();
    let held = Mutex::new(held);
    let mut b = host().sub_workers(1).still_waiting_warning(Duration::MAX);
    let h = b.register_host("hold", move |_| {
        let _ = held.lock().unwrap_or_else(|e| e.into_inner()).recv();
        Ok(())
    });
    let w = b.start().expect("start");
    let run = w.submit(one_sub_task(h)).expect("submit");
    assert!(run.wait_timeout(Duration::from_millis(100)).is_none());
    release.send(()).expect("release");
    run.wait().expect("the run ends once released");
    w.close().expect("close");
}

#[test]
fn a_drop_after_a_close_that_gave_up_closes_in_place_once_the_runs_ended() {
    /// Sets its flag when dropped: with the closure that owns it, at the end of the close.
    struct Flag(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = Flag(Arc::clone(&closed));
    let (release, held) = mpsc::channel::<()>();
    let held = Mutex::new(held);
    let mut b = host().sub_workers(1);
    let h = b.register_host("hold", move |_| {
        let _ = &flag;
        let _ = held.lock().unwrap_or_else(|e| e.into_inner()).recv();
        Ok(())
    });
    let w = b.start().expect("start");
    let run = w.submit(one_sub_task(h)).expect("submit");
    assert!(w.close_timeout(Duration::from_millis(50)).is_err_and(|e| e.is_retryable()));
    release.send(()).expect("release");
    run.wait().expect("the run ends once released");
    drop(w);
    assert!(
        closed.load(std::sync::atomic::Ordering::SeqCst),
        "the drop returned before the close tore the worker down"
    );
}

#[test]
fn a_chip_run_whose_diagnostics_could_not_be_written_succeeds_and_says_so_in_the_log() {
    captured(); // the capture is installed before the worker's threads log
    let (w, add) = common::l2_with(|o| o);
    let mem = w.memory().unwrap();
    let mut args = simpler_types::TaskArgs::new();
    for _ in 0..3 {
        let t = mem.malloc(256).unwrap().tensor(&[64], simpler_types::DataType::Float32).unwrap();
        args.add_inout(t).unwrap();
    }
    // `deps.json` cannot replace the non-empty directory of that name: the export fails
    // after the run, which stays a success.
    let prefix = std::env::temp_dir().join(format!("simpler-stalls-{}", std::process::id()));
    std::fs::create_dir_all(prefix.join("deps.json")).unwrap();
    std::fs::write(prefix.join("deps.json").join("keep"), b"").unwrap();
    let cfg = simpler_types::CallConfig::builder().dep_gen(true).output_prefix(&prefix).build();
    let run = simpler_worker::Orchestration::chip(add, args).config(cfg.unwrap());
    w.run(run).expect("the run itself succeeds");
    let log = captured();
    assert!(log.contains("chip run finished with a warning"), "{log}");
    assert!(log.contains("writing deps.json under"), "{log}");
    w.close().expect("close");
    let _ = std::fs::remove_dir_all(&prefix);
}
