//! Shared fixtures: the one-task chip program `f = a + b` under distinct names, worker builders,
//! a host closure held at a barrier, and thread counts.

#![allow(dead_code)]

use std::sync::{Arc, Barrier};
use std::time::Duration;

use simpler_device_a2a3::programs::add;
use simpler_device_a2a3::{ChipCallable, Platform, RunnerOptions, RuntimeVariant};
use simpler_worker::{CallableHandle, HostWorkerBuilder, Orchestration, Worker};

/// An orchestration of one sub task running the host closure `h` with no arguments.
pub fn one_sub_task(h: CallableHandle) -> Orchestration {
    Orchestration::graph(move |g, _, _| {
        g.submit_sub(h, simpler_types::TaskArgs::new())?;
        Ok(())
    })
}

/// Short device budgets for an L2 worker's chip: a faulting kernel is detected by the scheduler
/// budget within a fraction of a second.
pub fn short_budgets(o: RunnerOptions) -> RunnerOptions {
    o.with_scheduler_timeout(Duration::from_millis(300))
        .with_op_execute_timeout(Duration::from_millis(600))
        .with_stream_sync_timeout(Duration::from_secs(3))
        .with_shutdown_budget(Duration::from_millis(200))
}

/// An L2 worker on the simulator with [`short_budgets`], `options` applied on top, and the add
/// program registered.
pub fn l2_with(
    options: impl Fn(RunnerOptions) -> RunnerOptions + Send + Sync + 'static,
) -> (Worker, CallableHandle) {
    let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph)
        .chip_options(move |o| options(short_budgets(o)));
    let add = b.register_chip(add_callable(0));
    (b.start().expect("start"), add)
}

/// Arms chip 0 of the L2 worker `w` (built with [`short_budgets`]) so that its next run holds
/// the device for some 600 ms (a one-second kernel, ended by the op-execute watchdog) and then
/// fails in its AICPU entry, which makes the chip unusable. A kernel fault would not do: it ends
/// the run at once, skipping the kernel's delay.
pub fn hold_then_poison(w: &Worker) {
    w.with_sim_faults(simpler_types::WorkerId(0), |p| {
        p.kernel_delay(0, Duration::from_secs(1));
        p.aicpu_fault(1);
    })
    .expect("fault plan");
}

/// Generous upper bound that only catches hangs.
pub const HANG: Duration = Duration::from_secs(60);

/// The chip program `f = a + b`; `variant` makes content distinct (different entry names).
pub fn add_callable(variant: u32) -> ChipCallable {
    add::builder().names(format!("add_{variant}"), "add_config").build().expect("valid callable")
}

/// An L3 builder on the simulator; with `SIMPLER_TEST_CHIP_MODE=process` its chips run in
/// child processes, so the same tests check PROCESS mode (`cargo xtask ci` runs both).
pub fn host() -> HostWorkerBuilder {
    let b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph);
    if process_mode() {
        let options = simpler_worker::ProcessOptions::default()
            .child_path(env!("CARGO_BIN_EXE_simpler-chip-child"));
        b.chip_mode(simpler_worker::ChildMode::Process).process_options(options)
    } else {
        b
    }
}

/// Whether this test run checks PROCESS mode (`SIMPLER_TEST_CHIP_MODE=process`).
pub fn process_mode() -> bool {
    std::env::var("SIMPLER_TEST_CHIP_MODE").is_ok_and(|m| m == "process")
}

/// Registers the host closure `hold`, which waits at the returned two-party barrier: a task of
/// it stays running until the test calls `gate.wait()`.
pub fn register_hold(b: &mut HostWorkerBuilder) -> (CallableHandle, Arc<Barrier>) {
    let gate = Arc::new(Barrier::new(2));
    let g2 = Arc::clone(&gate);
    let hold = b.register_host("hold", move |_| {
        g2.wait();
        Ok(())
    });
    (hold, gate)
}

/// Threads of this process.
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// The thread count once it reaches `want`, or after 5 s the count then: a joined thread can
/// still be listed in `/proc/self/task` for a moment, until the kernel has reaped it, so a count
/// taken right after a join may be one high on a loaded machine. A leaked thread stays counted.
#[allow(dead_code)]
pub fn thread_count_settled(want: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let n = thread_count();
        if n == want || std::time::Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Names of this process's threads starting with `prefix`.
pub fn threads_named(prefix: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| s.starts_with(prefix))
        .collect()
}

/// Runs `body` on its own thread and returns its result, or `Err` naming `what` if it panicked
/// or did not finish within [`HANG`].
pub fn bounded<T: Send + 'static>(
    what: &str,
    body: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(body());
    });
    rx.recv_timeout(HANG).map_err(|e| format!("{what}: {e:?} (panicked or hung)"))
}
