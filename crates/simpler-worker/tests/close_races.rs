//! Close races under stress, several seeds each: submit against close and drop without close
//! while runs are in flight (close against close is a unit test of the close module, where the
//! teardowns can be counted). Every accepted run must end done, every other
//! submit must see `Closed`, and nothing may hang (generous upper bounds only).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use common::{HANG, host};
use simpler_types::TaskArgs;
use simpler_worker::{CallableHandle, Orchestration, Worker, WorkerError};

/// A small deterministic generator (xorshift), so that a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const SEEDS: [u64; 6] = [1, 7, 42, 1234, 99_991, 0xdead_beef];

fn worker(subs: usize) -> (Worker, CallableHandle, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    let mut b = host().sub_workers(subs);
    let h = b.register_host("spin", move |a| {
        let n = a.scalar(0).unwrap_or(0);
        for _ in 0..n {
            std::hint::spin_loop();
        }
        c.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    (b.start().expect("start"), h, count)
}

fn tasks(h: CallableHandle, n: u64, spin: u64) -> Orchestration {
    Orchestration::graph(move |g, _, _| {
        for _ in 0..n {
            let mut a = TaskArgs::new();
            a.add_scalar(spin)?;
            g.submit_sub(h, a)?;
        }
        Ok(())
    })
}

/// Runs `f` on a thread and fails the test if it does not finish within `HANG`.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(HANG).unwrap_or_else(|_| panic!("{what} hung"))
}

#[test]
fn submit_racing_close_either_drains_the_run_or_sees_closed() {
    for seed in SEEDS {
        bounded("submit vs close", move || {
            let mut rng = Rng(seed);
            let (w, h, count) = worker(2);
            let w = Arc::new(w);
            let submitted = Arc::new(AtomicUsize::new(0));
            let submitters: Vec<_> = (0..3)
                .map(|i| {
                    let (w, submitted) = (Arc::clone(&w), Arc::clone(&submitted));
                    let (n, spin) = (1 + rng.below(4), rng.below(2000));
                    std::thread::spawn(move || {
                        let mut handles = Vec::new();
                        for _ in 0..(5 + i) {
                            match w.submit(tasks(h, n, spin)) {
                                Ok(handle) => {
                                    submitted.fetch_add(n as usize, Ordering::SeqCst);
                                    handles.push(handle);
                                }
                                Err(WorkerError::Closed) => break,
                                Err(e) => panic!("seed {seed}: unexpected {e}"),
                            }
                        }
                        handles
                    })
                })
                .collect();
            for _ in 0..rng.below(50) {
                std::thread::yield_now();
            }
            w.close().expect("close");
            for t in submitters {
                for handle in t.join().expect("submitter") {
                    assert!(handle.is_done(), "seed {seed}: an accepted run was not drained");
                    assert!(matches!(handle.result(), Some(Ok(()))));
                }
            }
            assert_eq!(
                count.load(Ordering::SeqCst),
                submitted.load(Ordering::SeqCst),
                "seed {seed}"
            );
        });
    }
}

#[test]
fn drop_without_close_drains_runs_in_flight() {
    for seed in SEEDS {
        bounded("drop in flight", move || {
            let mut rng = Rng(seed);
            let (w, h, count) = worker(2);
            let n = 1 + rng.below(16);
            let handle = w.submit(tasks(h, n, rng.below(5000))).expect("submit");
            let unwaited = if rng.below(2) == 0 { None } else { Some(handle.clone()) };
            drop(w);
            assert!(handle.is_done(), "seed {seed}");
            assert_eq!(count.load(Ordering::SeqCst), n as usize, "seed {seed}");
            drop(unwaited);
        });
    }
}

#[test]
fn unwaited_handles_are_cleaned_up_by_the_next_admission() {
    let (w, h, count) = worker(1);
    for _ in 0..50 {
        drop(w.submit(tasks(h, 2, 0)).expect("submit"));
    }
    w.run(tasks(h, 1, 0)).expect("run");
    assert_eq!(count.load(Ordering::SeqCst), 101);
}

/// Sleeps when dropped, to hold the thread that drops it.
struct SlowDrop;

impl Drop for SlowDrop {
    fn drop(&mut self) {
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
}

#[test]
fn a_failure_read_by_wait_timeout_is_not_reported_unobserved_by_a_close_meanwhile() {
    let mut b = host().sub_workers(1);
    let (started, running) = mpsc::channel::<()>();
    let (release, held) = mpsc::channel::<()>();
    let (started, held) = (std::sync::Mutex::new(started), std::sync::Mutex::new(held));
    let slow = SlowDrop;
    let fail = b.register_host("fail", move |_| {
        let _ = &slow;
        let _ = started.lock().unwrap().send(());
        let _ = held.lock().unwrap().recv();
        Err("the closure fails".into())
    });
    let w = Arc::new(b.start().expect("start"));
    let run = w.submit(Orchestration::graph(move |g, _, _| {
        g.submit_sub(fail, TaskArgs::new())?;
        Ok(())
    }));
    let run = run.expect("accepted");
    running.recv_timeout(HANG).expect("the closure started");
    // Unregistered while the run is live: the closure (and its slow capture) is dropped after
    // the run's publication, by the waiter that cleans the run up.
    w.unregister(fail).expect("unregister");
    let reader = std::thread::spawn(move || run.wait_timeout(HANG));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let closer = {
        let w = Arc::clone(&w);
        std::thread::spawn(move || w.close())
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    release.send(()).unwrap();
    let read = reader.join().unwrap();
    assert!(matches!(read, Some(Err(_))), "{read:?}");
    let closed = closer.join().unwrap();
    assert!(closed.is_ok(), "the failure was read, yet close reports: {closed:?}");
}
