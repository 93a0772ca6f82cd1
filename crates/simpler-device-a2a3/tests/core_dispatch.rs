//! Which host thread runs a dispatched kernel (`docs/device-simulator.md`, "Who runs a
//! dispatch"), and scheduling threads that own no cluster, on both chip runtimes.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::diag::json;
use common::*;
use simpler_device_a2a3::abi::codes::AclCode;
use simpler_device_a2a3::{
    ArgDirection, ChipCallable, CoreCallable, CoreDispatch, DeviceError, DeviceRunner, KernelCall,
    Kernels, OrchArgs, OrchConfig, OrchCtx, OrchError, RunRequest, RunnerOptions, RuntimeVariant,
};
use simpler_types::{CallConfig, CoreArgs, SwimlaneLevel, TaskArgs, TimeoutBudget};

const RUNTIMES: [RuntimeVariant; 2] =
    [RuntimeVariant::HostBuildGraph, RuntimeVariant::TensormapAndRingbuffer];

/// Tasks of one run: a chain, each an `InOut` of the same one-element tensor.
const CHAIN: u64 = 12;

const WHERE: u32 = 0;
const PANICS: u32 = 1;
const SPINS: u32 = 2;
const SLOW: u32 = 3;
const NAPS: u32 = 4;
const NAPS_300US: u32 = 5;
const STALLS: u32 = 6;

/// What `where_am_i` adds for a kernel run on an AICPU thread, and on a core's own thread.
const ON_AICPU: f32 = 1.0;
const ON_CORE: f32 = 1000.0;

fn on_aicpu_thread() -> bool {
    std::thread::current().name().unwrap_or_default().contains("-aicpu")
}

/// Adds [`ON_AICPU`] or [`ON_CORE`] to its tensor, by the thread it runs on.
unsafe extern "C-unwind" fn where_am_i(args: *mut i64) {
    // SAFETY: the runtime passes a valid argument vector with one f32 tensor.
    let k = unsafe { KernelCall::from_raw(args, 1) };
    // SAFETY: the task's only tensor; the chain orders every task touching it.
    let out = unsafe { k.slice_mut::<f32>(0) }.unwrap();
    out[0] += if on_aicpu_thread() { ON_AICPU } else { ON_CORE };
}

/// Panics on an AICPU thread; `where_am_i` on a core's own thread.
unsafe extern "C-unwind" fn panics_on_aicpu(args: *mut i64) {
    if on_aicpu_thread() {
        panic!("deliberate kernel panic");
    }
    // SAFETY: forwarded.
    unsafe { where_am_i(args) };
}

/// Released by the test that makes `spins_on_aicpu` hang, once it is done.
static RELEASE: AtomicBool = AtomicBool::new(false);

/// Does not return on an AICPU thread until [`RELEASE`]; `where_am_i` on a core's own thread.
unsafe extern "C-unwind" fn spins_on_aicpu(args: *mut i64) {
    if on_aicpu_thread() {
        while !RELEASE.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    // SAFETY: forwarded.
    unsafe { where_am_i(args) };
}

/// Takes 3 ms on an AICPU thread (longer than the simulator runs kernels there); then
/// `where_am_i`.
unsafe extern "C-unwind" fn slow_on_aicpu(args: *mut i64) {
    if on_aicpu_thread() {
        std::thread::sleep(Duration::from_millis(3));
    }
    // SAFETY: forwarded.
    unsafe { where_am_i(args) };
}

/// Microseconds `naps` sleeps, wherever it runs.
static NAP_US: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Sleeps [`NAP_US`]; then `where_am_i`.
unsafe extern "C-unwind" fn naps(args: *mut i64) {
    std::thread::sleep(Duration::from_micros(NAP_US.load(Ordering::Relaxed)));
    // SAFETY: forwarded.
    unsafe { where_am_i(args) };
}

/// While set, `naps_300us` does not sleep (one test owns it).
static NAP_300US_QUICK: AtomicBool = AtomicBool::new(false);

/// Sleeps 300 us, wherever it runs (unless [`NAP_300US_QUICK`]); then `where_am_i`.
unsafe extern "C-unwind" fn naps_300us(args: *mut i64) {
    if !NAP_300US_QUICK.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_micros(300));
    }
    // SAFETY: forwarded.
    unsafe { where_am_i(args) };
}

/// Sleeps 1.5 s wherever it runs, far past the stall watchdog of [`fast_options_on`]; then
/// `where_am_i`.
unsafe extern "C-unwind" fn stalls(args: *mut i64) {
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: forwarded.
    unsafe { where_am_i(args) };
}

/// `scalar(1)` AIV tasks of kernel `scalar(0)`, each an `InOut` of tensor 0.
fn chain(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let bad = OrchError::from_status(-1);
    let func = args.scalar(0).ok_or(bad)? as u32;
    for _ in 0..args.scalar(1).ok_or(bad)? {
        let mut task = CoreArgs::new();
        task.add_inout(*args.tensor(0).ok_or(bad)?).map_err(|_| bad)?;
        ctx.submit(Kernels::Aiv(func), &task)?;
    }
    Ok(())
}

fn callable() -> ChipCallable {
    let inout = || vec![ArgDirection::InOut];
    ChipCallable::native(chain, |_| OrchConfig { expected_arg_count: 3 })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(WHERE, unsafe { CoreCallable::native(inout(), where_am_i) })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(PANICS, unsafe { CoreCallable::native(inout(), panics_on_aicpu) })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(SPINS, unsafe { CoreCallable::native(inout(), spins_on_aicpu) })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(SLOW, unsafe { CoreCallable::native(inout(), slow_on_aicpu) })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(NAPS, unsafe { CoreCallable::native(inout(), naps) })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(NAPS_300US, unsafe { CoreCallable::native(inout(), naps_300us) })
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(STALLS, unsafe { CoreCallable::native(inout(), stalls) })
        .build()
        .unwrap()
}

/// A simulator planned for one host core, with the Rust core executor (the C++ one always runs
/// kernels on the core's thread): every awake thread makes the host "busy".
fn one_host_core(o: RunnerOptions) -> RunnerOptions {
    o.without_aicore_executor().with_host_cores(1)
}

/// Runs a chain of `tasks` kernels `func` on one cluster; returns the tensor's final value
/// (how many ran on an AICPU thread is `value % ON_CORE`) or the run's error.
fn run_chain(
    r: &mut DeviceRunner,
    run: u64,
    func: u32,
    tasks: u64,
    cfg: &CallConfig,
) -> Result<f32, DeviceError> {
    let slot = r.register_callable(&callable()).unwrap();
    let (p, t) = upload_f32(r, &[0.0]);
    let mut args = TaskArgs::new();
    args.add_inout(t).unwrap();
    args.add_scalar(u64::from(func)).unwrap();
    args.add_scalar(tasks).unwrap();
    let result = r.run(&RunRequest::new(run_id(run), slot, &args, cfg));
    let out = result.map(|_| download_f32(r, p, 1)[0]);
    r.free(p).unwrap();
    out
}

fn one_cluster() -> CallConfig {
    CallConfig::builder().block_dim(1).build().unwrap()
}

/// One cluster, with AICore swimlane records written under `dir`.
fn one_cluster_traced(dir: &std::path::Path) -> CallConfig {
    CallConfig::builder()
        .block_dim(1)
        .swimlane(SwimlaneLevel::AicoreTiming)
        .output_prefix(dir)
        .build()
        .unwrap()
}

/// How many of a chain's kernels ran on a core's own thread and how many on an AICPU thread,
/// from the chain's final value.
fn split(value: f32) -> (u64, u64) {
    ((value / ON_CORE) as u64, (value % ON_CORE) as u64)
}

#[test]
fn kernels_run_on_the_dispatching_thread_only_when_core_dispatch_allows_it() {
    for runtime in RUNTIMES {
        for dispatch in [CoreDispatch::Auto, CoreDispatch::CoreThread] {
            let dir = temp_dir(&format!("where-{runtime:?}-{dispatch:?}"));
            let o = one_host_core(options_on(0, runtime)).with_core_dispatch(dispatch);
            let mut r = DeviceRunner::attach(o).unwrap();
            let value = run_chain(&mut r, 1, WHERE, CHAIN, &one_cluster_traced(&dir)).unwrap();
            r.finalize().unwrap();
            let (on_core, on_aicpu) = split(value);
            assert_eq!(on_core + on_aicpu, CHAIN, "{runtime:?} {dispatch:?}: {value}");
            match dispatch {
                CoreDispatch::CoreThread => assert_eq!(on_aicpu, 0, "{runtime:?}: {value}"),
                // A core's thread serves a token only when it is at it already (the first of
                // a launch, say); a chain's later tokens find it parked.
                _ => assert!(on_aicpu > 0, "{runtime:?} {dispatch:?}: {value}"),
            }
            // Tokens served on the AICPU thread keep the core's swimlane records.
            let records = json(&dir.join("l2_swimlane_records.json"));
            let tasks = records["aicore_tasks"].as_array().unwrap();
            assert_eq!(tasks.len() as u64, CHAIN, "{runtime:?} {dispatch:?}");
            for t in tasks {
                let (start, end) = (t[4].as_u64().unwrap(), t[5].as_u64().unwrap());
                assert!(0 < start && start <= end, "{runtime:?} {dispatch:?}: {t}");
            }
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[test]
fn a_kernel_panicking_on_the_dispatching_thread_is_one_aicore_fault_and_the_device_works_after() {
    for runtime in RUNTIMES {
        let mut r = DeviceRunner::attach(one_host_core(fast_options_on(1, runtime))).unwrap();
        let err = run_chain(&mut r, 1, PANICS, CHAIN, &one_cluster()).unwrap_err();
        let DeviceError::DeviceFault { faults, .. } = &err else { panic!("{runtime:?}: {err}") };
        // The chain stops at the first kernel that ran on an AICPU thread.
        let panicked: Vec<_> = faults.iter().filter(|f| f.func_id == Some(PANICS)).collect();
        assert_eq!(panicked.len(), 1, "{runtime:?}: {err}");
        let f = panicked[0];
        assert_eq!(f.code, AclCode::AICORE_EXCEPTION, "{runtime:?}: {err}");
        assert!(f.core.is_some() && f.task.is_some(), "{runtime:?}: {err}");
        assert!(f.message.contains("deliberate kernel panic"), "{runtime:?}: {err}");
        assert!(r.finalize().unwrap().stuck_threads.is_empty(), "{runtime:?}");
        let mut r = DeviceRunner::attach(one_host_core(options_on(1, runtime))).unwrap();
        let value = run_chain(&mut r, 2, WHERE, CHAIN, &one_cluster()).unwrap();
        let (on_core, on_aicpu) = split(value);
        assert_eq!(on_core + on_aicpu, CHAIN, "{runtime:?}");
        r.finalize().unwrap();
    }
}

/// After a kernel that ran long on an AICPU thread, the core's later tokens of the launch go to
/// the core's own thread, so the AICPU thread keeps polling its cores and watching for stalls.
#[test]
fn a_long_kernel_sends_the_rest_of_its_cores_launch_back_to_the_core_thread() {
    for runtime in RUNTIMES {
        let mut r = DeviceRunner::attach(one_host_core(options_on(4, runtime))).unwrap();
        let value = run_chain(&mut r, 1, SLOW, CHAIN, &one_cluster()).unwrap();
        r.finalize().unwrap();
        let (on_core, on_aicpu) = split(value);
        assert_eq!(on_core + on_aicpu, CHAIN, "{runtime:?}: {value}");
        // At most one per AIV core of the cluster ran long on the AICPU thread.
        assert!(on_aicpu <= 2, "{runtime:?}: {on_aicpu} of {CHAIN} on the AICPU thread");
    }
}

/// A simulator planned for a host with cores to spare (no awake thread makes it "busy"),
/// running its own AICPU program (a built one's register stores are not held).
fn many_host_cores(o: RunnerOptions) -> RunnerOptions {
    o.without_aicore_executor().without_aicpu_program().with_host_cores(64)
}

/// With host cores to spare, an AICPU thread still runs a dispatch itself when it is the only
/// one in flight, the thread has nothing else to do and the core's last kernel returned
/// quickly: once each core ran a kernel, a chain never needs a core's thread. (The first run's
/// first kernels go to the cores' threads; preempted on a loaded host, a kernel can take
/// longer than the simulator runs kernels there and send its core's later tokens to the
/// core's thread; one clean run of five is required.)
#[test]
fn with_host_cores_to_spare_a_chain_runs_on_the_aicpu_thread_that_has_nothing_else_to_do() {
    for runtime in RUNTIMES {
        let mut r = DeviceRunner::attach(many_host_cores(options_on(12, runtime))).unwrap();
        let mut splits = Vec::new();
        for n in 1..=6 {
            let (on_core, on_aicpu) =
                split(run_chain(&mut r, n, WHERE, CHAIN, &one_cluster()).unwrap());
            assert_eq!(on_core + on_aicpu, CHAIN, "{runtime:?}");
            splits.push((on_core, on_aicpu));
        }
        r.finalize().unwrap();
        assert!(splits[0].0 > 0, "{runtime:?}: a core's first kernel ran inline: {splits:?}");
        assert!(splits[1..].contains(&(0, CHAIN)), "{runtime:?}: (on cores, on AICPU) {splits:?}");
    }
}

/// With host cores to spare, a kernel new to a core runs on the core's own thread, however
/// quick the core's other kernels were: one that never returned would be caught there by the
/// stall watchdog instead of holding the AICPU thread (`spins_on_aicpu` would not return on an
/// AICPU thread).
#[test]
fn with_host_cores_to_spare_a_kernel_new_to_a_core_runs_on_its_own_thread() {
    for runtime in RUNTIMES {
        let mut r = DeviceRunner::attach(many_host_cores(fast_options_on(14, runtime))).unwrap();
        // The cores' quick history is of another kernel.
        run_chain(&mut r, 1, WHERE, CHAIN, &one_cluster()).unwrap();
        run_chain(&mut r, 2, WHERE, CHAIN, &one_cluster()).unwrap();
        let value = run_chain(&mut r, 3, SPINS, 1, &one_cluster()).unwrap();
        r.finalize().unwrap();
        assert_eq!(split(value), (1, 0), "{runtime:?}: {value}");
    }
}

/// With host cores to spare, a kernel an AICPU thread ran only because it had nothing else to
/// do sends its core's later tokens of the launch to the core's thread once it ran longer than
/// a few thread wake-ups (newly ready work for the thread's other cores would wait for it).
#[test]
fn with_host_cores_to_spare_a_kernel_over_100us_sends_its_cores_later_tokens_to_its_thread() {
    for runtime in RUNTIMES {
        let mut r = DeviceRunner::attach(many_host_cores(options_on(13, runtime))).unwrap();
        // The naps quick on each core first (a kernel runs on the AICPU thread only after it
        // returned quickly on the core before), then long. A quick run preempted on a loaded
        // host leaves a long history, so up to three attempts; none may run more than one long
        // nap per core on the AICPU thread.
        let mut on_aicpu_per_attempt = Vec::new();
        for attempt in 0..3 {
            NAP_300US_QUICK.store(true, Ordering::Relaxed);
            run_chain(&mut r, 2 * attempt + 1, NAPS_300US, CHAIN, &one_cluster()).unwrap();
            NAP_300US_QUICK.store(false, Ordering::Relaxed);
            let value = run_chain(&mut r, 2 * attempt + 2, NAPS_300US, CHAIN, &one_cluster());
            let (on_core, on_aicpu) = split(value.unwrap());
            assert_eq!(on_core + on_aicpu, CHAIN, "{runtime:?}");
            // At most one per AIV core of the cluster ran on the AICPU thread.
            assert!(on_aicpu <= 2, "{runtime:?}: {on_aicpu} of {CHAIN} on the AICPU thread");
            on_aicpu_per_attempt.push(on_aicpu);
            if on_aicpu > 0 {
                break;
            }
        }
        r.finalize().unwrap();
        assert!(
            on_aicpu_per_attempt.iter().any(|&n| n > 0),
            "{runtime:?}: no long nap ran on the AICPU thread: {on_aicpu_per_attempt:?}"
        );
    }
}

/// A kernel that never returns on the AICPU thread serving it: the run fails with a typed
/// timeout instead of hanging, the core's own thread leaves the stopped launch (it does not wait
/// for the state that thread holds), and finalize names the one AICPU thread it had to leave.
#[test]
fn a_kernel_that_never_returns_on_the_dispatching_thread_fails_the_run_and_finalize_names_it() {
    let o = one_host_core(fast_options_on(2, RuntimeVariant::HostBuildGraph));
    let mut r = DeviceRunner::attach(o).unwrap();
    let err = run_chain(&mut r, 1, SPINS, CHAIN, &one_cluster()).unwrap_err();
    let stuck = r.finalize().unwrap().stuck_threads;
    RELEASE.store(true, Ordering::Release);
    // The AICPU stream cannot end while its thread is inside the kernel: the run times out on
    // the stream-sync budget, with the op-execute watchdog's verdict on the AICore stream.
    assert!(err.is_timeout() && err.run_id() == Some(run_id(1)), "{err}");
    let DeviceError::Timeout { faults, .. } = &err else { panic!("{err}") };
    assert!(faults.iter().any(|f| f.code == AclCode::AICORE_TIMEOUT), "{err:?}");
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert!(stuck[0].contains("-aicpu"), "{stuck:?}");
}

/// On a busy host, a kernel new to its core runs on the core's own thread, not on the AICPU
/// thread that dispatched it: that thread keeps watching for stalls, so a first run that never
/// ends is a scheduler stall naming the task, not a wait for the stream-sync budget.
#[test]
fn on_a_busy_host_a_kernel_new_to_its_core_stays_where_the_stall_watchdog_sees_it() {
    for runtime in RUNTIMES {
        let mut r = DeviceRunner::attach(one_host_core(fast_options_on(3, runtime))).unwrap();
        let err = run_chain(&mut r, 1, STALLS, 1, &one_cluster());
        let err = err.expect_err("the kernel outlasts the stall watchdog");
        let DeviceError::DeviceFault { runtime: Some(rt), .. } = &err else {
            panic!("{runtime:?}: {err}")
        };
        let stall = rt.stall.as_ref().expect("stall details");
        assert!(stall.stuck_task.is_some() && stall.stuck_core.is_some(), "{runtime:?}: {err}");
        assert_eq!(
            err.timed_out().map(|(budget, _)| budget),
            Some(TimeoutBudget::DeviceScheduler),
            "{runtime:?}: {err}"
        );
        assert!(r.finalize().unwrap().stuck_threads.is_empty(), "{runtime:?}");
    }
}

#[test]
fn scheduling_threads_without_a_cluster_end_before_the_run_does() {
    const DELAY: Duration = Duration::from_millis(40);
    // Counter ticks (50 MHz) of half the delay.
    const MARGIN: u64 = 20 * 50_000;
    for runtime in RUNTIMES {
        let dir = temp_dir(&format!("coreless-{runtime:?}"));
        let mut r = DeviceRunner::attach(options_on(3, runtime)).unwrap();
        r.sim_faults().unwrap().kernel_delay(WHERE, DELAY);
        run_chain(&mut r, 1, WHERE, 2, &one_cluster_traced(&dir)).unwrap();
        r.finalize().unwrap();
        let records = json(&dir.join("l2_swimlane_records.json"));
        let phases = records["phases"].as_array().unwrap();
        let at = |t: usize, key: &str| phases[t][key].as_u64().unwrap();
        // trb's last thread orchestrates; every other thread schedules. Only thread 0 owns the
        // one cluster, and it schedules until the delayed kernels finished.
        let schedulers = match runtime {
            RuntimeVariant::TensormapAndRingbuffer => phases.len() - 1,
            _ => phases.len(),
        };
        assert!(schedulers >= 2, "{runtime:?}: {phases:?}");
        let busy_until = at(0, "scheduling_end");
        for t in 1..schedulers {
            assert!(
                0 < at(t, "start") && at(t, "start") <= at(t, "end"),
                "{runtime:?}: {phases:?}"
            );
            assert!(
                at(t, "end") + MARGIN < busy_until,
                "{runtime:?}: thread {t} without a cluster stayed until {} (thread 0 scheduled until {busy_until})",
                at(t, "end")
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Context switches so far of the threads whose names start with `prefix` (Linux thread
/// stats).
#[cfg(target_os = "linux")]
fn thread_switches(prefix: &str) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        for line in status.lines() {
            if let Some(n) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                total += n.trim().parse::<u64>().unwrap();
            }
        }
    }
    total
}

/// Under `Auto` on a busy host, launches neither wake nor run the simulated core threads: the
/// thread that starts the AICore entry reports each core in, and the AICPU thread opens, serves
/// and ends its part. Under `CoreThread` every launch runs them.
#[cfg(target_os = "linux")]
#[test]
fn under_auto_launches_leave_the_core_threads_parked() {
    // The switch count of a thread that has just parked can still move once (its last switch
    // into the wait); read it until two readings agree.
    let settled = |device: u32| settled_switches(&format!("sim{device}-aicore"));
    for runtime in RUNTIMES {
        for (device, dispatch) in [(6, CoreDispatch::Auto), (7, CoreDispatch::CoreThread)] {
            let o = one_host_core(options_on(device, runtime)).with_core_dispatch(dispatch);
            let mut r = DeviceRunner::attach(o).unwrap();
            // The first run spawns the core threads.
            run_chain(&mut r, 1, WHERE, 4, &one_cluster()).unwrap();
            // A kernel preempted for over a millisecond on a loaded host sends the rest of its
            // core's launch to the core's thread (the inline limit), so `Auto` needs one clean
            // launch of three; `CoreThread` wakes the core threads in every one.
            let mut switched = Vec::new();
            for n in 2..=4 {
                wait_all_parked(&r);
                let before = settled(device);
                let value = run_chain(&mut r, n, WHERE, 4, &one_cluster()).unwrap();
                let (on_core, on_aicpu) = split(value);
                assert_eq!(on_core + on_aicpu, 4);
                wait_all_parked(&r);
                switched.push(settled(device) - before);
            }
            r.finalize().unwrap();
            match dispatch {
                CoreDispatch::CoreThread => {
                    assert!(switched.iter().all(|&s| s > 0), "{runtime:?}: {switched:?}")
                }
                _ => assert!(switched.contains(&0), "{runtime:?}: core threads ran: {switched:?}"),
            }
        }
    }
}

/// [`thread_switches`] once two readings agree: the count of a thread that has just parked can
/// still move once (its last switch into the wait).
#[cfg(target_os = "linux")]
fn settled_switches(prefix: &str) -> u64 {
    let give_up = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let a = thread_switches(prefix);
        std::thread::sleep(Duration::from_millis(20));
        if thread_switches(prefix) == a {
            return a;
        }
        assert!(std::time::Instant::now() < give_up, "the threads of {prefix} never settled");
    }
}

/// Under `Auto`, an AICPU thread whose part of a launch never waits (it owns no cluster and
/// does not orchestrate) is not woken for it: the part runs on the thread of a participant that
/// is woken anyway, before that participant's own part. With one cluster and three AICPU
/// threads that is thread 1 under both runtimes. Under `CoreThread` every participant runs on
/// its own thread.
#[cfg(target_os = "linux")]
#[test]
fn aicpu_parts_that_never_wait_ride_along_under_auto() {
    for runtime in RUNTIMES {
        for (device, dispatch) in [(10, CoreDispatch::Auto), (11, CoreDispatch::CoreThread)] {
            // The compiled-in AICPU program: the simulator asks it which parts never wait.
            let o = one_host_core(options_on(device, runtime))
                .with_core_dispatch(dispatch)
                .without_aicpu_program();
            let mut r = DeviceRunner::attach(o).unwrap();
            // The first run spawns the threads.
            run_chain(&mut r, 1, WHERE, 4, &one_cluster()).unwrap();
            let thread1 = format!("sim{device}-aicpu1");
            let mut switched = Vec::new();
            for n in 2..=4 {
                wait_all_parked(&r);
                let before = settled_switches(&thread1);
                let (on_core, on_aicpu) =
                    split(run_chain(&mut r, n, WHERE, 4, &one_cluster()).unwrap());
                assert_eq!(on_core + on_aicpu, 4);
                wait_all_parked(&r);
                switched.push(settled_switches(&thread1) - before);
            }
            r.finalize().unwrap();
            match dispatch {
                CoreDispatch::CoreThread => {
                    assert!(switched.iter().all(|&s| s > 0), "{runtime:?}: {switched:?}")
                }
                _ => assert!(
                    switched.iter().all(|&s| s == 0),
                    "{runtime:?}: AICPU thread 1 ran: {switched:?}"
                ),
            }
        }
    }
}

/// Hammers the hand-offs between an AICPU thread serving a core, the core's thread adopting
/// it, the watchdogs and `finalize`: chains of kernels that sleep around the scheduler and
/// op-execute budgets, so that stall latches, exit signals, aborts and resets meet a core
/// served on either thread at every point. Whatever each run's outcome, it must end (typed)
/// and `finalize` must find no thread stuck; a fresh runner works afterwards.
#[test]
fn runs_ending_by_any_path_leave_no_thread_behind() {
    for runtime in RUNTIMES {
        for round in 0..12u64 {
            // 0.2 to 4.6 ms per kernel against a 1 ms scheduler and 3 ms op-execute budget.
            NAP_US.store(200 + (round * 397) % 4400, Ordering::Relaxed);
            let mut o = one_host_core(RunnerOptions::sim(8, runtime))
                .with_scheduler_timeout(Duration::from_millis(1))
                .with_op_execute_timeout(Duration::from_millis(3))
                .with_stream_sync_timeout(Duration::from_millis(2_000))
                .with_shutdown_budget(Duration::from_millis(50));
            o.sim.join_budget = Duration::from_secs(5);
            let mut r = DeviceRunner::attach(o).unwrap();
            if let Err(err) = run_chain(&mut r, 1, NAPS, 6, &one_cluster()) {
                // A core whose participant never ended would hold its entry to the
                // stream-sync budget: every run must end by its own verdict first.
                let lost =
                    matches!(&err, DeviceError::Timeout { budget: TimeoutBudget::StreamSync, .. });
                assert!(
                    !lost && err.run_id() == Some(run_id(1)),
                    "{runtime:?} round {round}: {err}"
                );
            }
            let stuck = r.finalize().unwrap().stuck_threads;
            assert!(stuck.is_empty(), "{runtime:?} round {round}: {stuck:?}");
        }
        NAP_US.store(0, Ordering::Relaxed);
        let mut r = DeviceRunner::attach(one_host_core(options_on(8, runtime))).unwrap();
        let (on_core, on_aicpu) = split(run_chain(&mut r, 2, NAPS, 6, &one_cluster()).unwrap());
        assert_eq!(on_core + on_aicpu, 6, "{runtime:?}");
        r.finalize().unwrap();
    }
}
