//! Multi-host conformance under `mpirun -np 3 --oversubscribe` with simulated chips: rank 0
//! runs an L4 worker whose two children are the L3 workers of ranks 1 and 2.
//!
//! Run without MPI's launcher, the binary launches itself twice under `mpirun` and checks
//! the jobs' exit codes: the conformance job (a remote task on each L3, a remote task error
//! with its rank frame, a stalled rank that does not silence the others while a large frame
//! waits for it, nor while a large frame from it is half received, a damaged reply failing its
//! task while the session still closes cleanly, a lost `ShutdownDone` reported at once, a lost
//! reply failing its task at once with the serving rank's own cause, typed, a rank still in a
//! session whose `Shutdown` was lost leaving the next one at once, a hung rank failing
//! its runs within the liveness budget, a manifest
//! mismatch refusing start, clean shutdown of every rank, serving ranks giving a silent rank 0
//! up) must exit 0; the killed-rank job
//! (rank 2 aborts in a task) must exit non-zero within its budget instead of hanging.
//! Without `mpirun` on `PATH` it fails when `CI` is set and says it is skipped otherwise.
//! `cargo xtask mpi-test` runs it alone.

use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use simpler_device_a2a3::programs::{add, f32_from_le_bytes, f32_to_le_bytes};
use simpler_device_a2a3::{Platform, RuntimeVariant};
use simpler_types::{CallConfig, DataType, TaskArgs, Tensor, WorkerId};
use simpler_worker::remote::{
    DEFAULT_LIVENESS, DecodeError, FrameKind, InitError, LeftCause, MpiJob, ProtocolViolation,
    RemoteError, RemoteL3, RemoteRunFailure, RemoteRunKind, ServeError, ServedGraphs,
    TensorProblem, TensorRefusal, serve_l3,
};
use simpler_worker::{
    CallableHandle, CloseError, CompositeWorkerBuilder, DeviceBuffer, HostBuffer, Leaked,
    Orchestration, RunHandle, StartCause, TeardownCause, TeardownError, TeardownPart, Worker,
    WorkerError,
};

const RANKS: &str = "3";
/// Upper bounds that only catch hangs (the jobs take seconds).
const CONFORMANCE_BUDGET: Duration = Duration::from_secs(120);
const KILLED_RANK_BUDGET: Duration = Duration::from_secs(90);
/// The liveness budget of the hung-rank case, and how long the hung rank stays silent.
const SHORT_LIVENESS: Duration = Duration::from_millis(1500);
const STALL: Duration = Duration::from_secs(5);
const N: usize = 1024;

/// The graphs every rank registers, in this order (rank 2 renames one in the mismatch case).
const GRAPHS: [&str; 13] = [
    "setup",
    "compute",
    "verify",
    "fail",
    "stall",
    "die",
    "host_add",
    "stall_soon",
    "sink",
    "sleep",
    "stall_mid_reply",
    "build_fails",
    "corrupt_reply",
];
/// The longest a close (or a task) may take to report a lost reply. What matters is that it is
/// well under rank 0's shutdown budget (60 s), which a close would otherwise wait out; it times
/// a whole close, on a machine that may run three ranks on two cores among other work, so it
/// leaves room for a slow close rather than measuring how fast one is.
const LOST_REPLY_BUDGET: Duration = Duration::from_secs(20);
/// How long after answering `stall_soon` the rank's MPI thread stalls.
const STALL_DELAY: Duration = Duration::from_millis(300);
/// How long the `sleep` task computes: longer than [`SHORT_LIVENESS`].
const LONG_TASK: Duration = Duration::from_millis(2500);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_none() {
        return launch(args.iter().any(|a| a == "--list"));
    }
    let case = args.first().map(String::as_str).unwrap_or("conformance");
    match rank_main(case) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mpi_remote [{case}]: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Outside `mpirun`: launch both jobs and check how they ended.
fn launch(list: bool) -> ExitCode {
    if list {
        // `cargo test -- --list` asks harness-less binaries for their tests.
        println!("mpi_remote: test");
        return ExitCode::SUCCESS;
    }
    let found = Command::new("mpirun").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        let why = "`mpirun` not found on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev)";
        if std::env::var_os("CI").is_some() {
            eprintln!("mpi_remote: FAILED: {why}; CI must run the multi-host tests");
            return ExitCode::FAILURE;
        }
        println!("mpi_remote: skipped: {why}");
        return ExitCode::SUCCESS;
    }
    let started = Instant::now();
    let ok = match job("conformance", CONFORMANCE_BUDGET) {
        Ok((true, t, _)) => {
            println!("mpi_remote: conformance job passed in {t:.1?}");
            true
        }
        Ok((false, t, _)) => {
            eprintln!("mpi_remote: conformance job FAILED (non-zero exit after {t:.1?})");
            false
        }
        Err(e) => {
            eprintln!("mpi_remote: conformance job FAILED: {e}");
            false
        }
    };
    let killed_ok = match job("killed-rank", KILLED_RANK_BUDGET) {
        // The launcher must have ended the job because rank 2 died, not for another reason.
        Ok((false, t, log)) if log.contains("exited on signal") => {
            println!("mpi_remote: killed-rank job exited non-zero after {t:.1?}, as it must");
            true
        }
        Ok((false, t, _)) => {
            eprintln!(
                "mpi_remote: killed-rank job FAILED: non-zero after {t:.1?}, but no rank died"
            );
            false
        }
        Ok((true, t, _)) => {
            eprintln!("mpi_remote: killed-rank job FAILED: it exited 0 after {t:.1?}");
            false
        }
        Err(e) => {
            eprintln!("mpi_remote: killed-rank job FAILED: {e}");
            false
        }
    };
    println!("mpi_remote: both jobs took {:.1?}", started.elapsed());
    if ok && killed_ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Runs this binary as `case` under `mpirun -np 3`; `Ok((exited 0, time, output))`, or an
/// error when it could not start or outlived `budget` (then it is killed). The job's output
/// goes through a file (echoed afterwards), so a chatty job cannot block on a full pipe.
fn job(case: &str, budget: Duration) -> Result<(bool, Duration, String), String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let log_path =
        std::env::temp_dir().join(format!("mpi_remote-{}-{case}.log", std::process::id()));
    let log =
        std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let err = log.try_clone().map_err(|e| format!("{}: {e}", log_path.display()))?;
    let t0 = Instant::now();
    let mut child = Command::new("mpirun")
        .args(["-np", RANKS, "--oversubscribe"])
        // Without single-copy shared memory a large frame's bytes move only while its sender's
        // MPI thread runs, as across hosts (and as where the kernel refuses the copy).
        .args(["--mca", "btl_vader_single_copy_mechanism", "none"])
        .arg(&exe)
        .arg(case)
        // CI runs as root, which mpirun refuses unless told so.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("could not start mpirun: {e}"))?;
    let ended = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok((status.success(), t0.elapsed())),
            Ok(None) if t0.elapsed() > budget => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!("the `{case}` job did not end within {budget:?}: killed"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => break Err(format!("waiting for mpirun: {e}")),
        }
    };
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    println!("---- output of the `{case}` job ----\n{output}---- end of the `{case}` job ----");
    ended.map(|(ok, t)| (ok, t, output))
}

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn rank_main(case: &str) -> Res {
    let job = Arc::new(MpiJob::init()?);
    // One job per process: a second init says so, typed, and leaves the first job working.
    match MpiJob::init() {
        Err(RemoteError::Init(InitError::AlreadyInitialized)) => {}
        other => return Err(format!("a second MpiJob::init gave {other:?}").into()),
    }
    if let Err(e) = run_case(&job, case) {
        // Finalizing is collective: the other ranks may wait in a session that will never
        // come. Exiting without it makes mpirun end the whole job.
        eprintln!("mpi_remote [{case}]: rank {}: FAILED: {e}", job.rank());
        std::process::exit(1);
    }
    let rank = job.rank();
    Arc::try_unwrap(job).map_err(|_| "the job is still shared")?.finalize()?;
    println!("mpi_remote [{case}]: rank {rank} done");
    Ok(())
}

fn run_case(job: &Arc<MpiJob>, case: &str) -> Res {
    if job.size() != 3 {
        return Err(format!("needs 3 ranks, got {}", job.size()).into());
    }
    match (case, job.rank()) {
        ("conformance", 0) => conformance_rank0(job)?,
        ("conformance", _) => conformance_serving(job)?,
        ("killed-rank", 0) => killed_rank0(job)?,
        ("killed-rank", _) => {
            // Rank 2 aborts inside its task; mpirun then ends the whole job.
            serve(job, &GRAPHS)?;
        }
        (other, _) => return Err(format!("unknown case {other}").into()),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Rank 0

/// Rank 0's L4 worker with ranks 1 and 2 as children 0 and 1. The graph bodies here never
/// run: remote children run their own registration of each name.
fn l4(job: &MpiJob, liveness: Duration) -> (CompositeWorkerBuilder, Vec<CallableHandle>) {
    let mut b = Worker::composite(4);
    let handles = GRAPHS
        .iter()
        .map(|name| b.register_graph(name, |_, _, _| Err("runs on a serving rank".into())))
        .collect();
    for rank in [1, 2] {
        b.child(RemoteL3::new(job, rank).liveness(liveness)).expect("an L3 child of an L4");
    }
    (b, handles)
}

fn on_child(graph: CallableHandle, child: u32) -> Orchestration {
    Orchestration::graph(move |g, _, _| {
        g.submit_next_level(graph, TaskArgs::new(), &CallConfig::default(), WorkerId(child))?;
        Ok(())
    })
}

fn on_both(graph: CallableHandle) -> Orchestration {
    Orchestration::graph(move |g, _, _| {
        for child in 0..2 {
            g.submit_next_level(graph, TaskArgs::new(), &CallConfig::default(), WorkerId(child))?;
        }
        Ok(())
    })
}

fn check(cond: bool, what: impl FnOnce() -> String) -> Res {
    if cond { Ok(()) } else { Err(what().into()) }
}

fn conformance_rank0(job: &MpiJob) -> Res {
    // A task on each remote L3, a remote task error, clean shutdown.
    let (b, h) = l4(job, Duration::from_secs(10));
    let w = b.start()?;
    for graph in [h[0], h[1], h[2]] {
        w.run(on_both(graph))?;
    }
    println!("rank 0: setup, compute and verify ran on both remote L3 workers");
    let e = match w.run(on_child(h[3], 1)) {
        Err(WorkerError::Run(e)) => e,
        other => return Err(format!("the failing remote task gave {other:?}").into()),
    };
    let text = e.to_string();
    check(text.contains("rank 2") && text.contains("boom on rank 2"), || {
        format!("the remote error does not name rank and cause: {text}")
    })?;
    let frames = e.frames();
    let remote = frames.iter().find_map(|f| f.remote_error());
    check(
        matches!(remote, Some(RemoteError::TaskFailed { rank: 2, level: 3, task: Some(_), .. })),
        || format!("no rank frame naming rank 2, level 3 and the task: {remote:?}"),
    )?;
    check(frames.first().is_some_and(|f| f.level == 4), || format!("outer frame: {frames:?}"))?;
    check(frames.iter().any(|f| f.level == 3 && f.message.contains("boom on rank 2")), || {
        format!("no L3 frame with the remote message: {frames:?}")
    })?;
    println!("rank 0: remote task error arrived: {text}");
    // A remote run that fails with no task to blame crosses typed: what kind, and the message.
    let e = match w.run(on_child(h[11], 0)) {
        Err(WorkerError::Run(e)) => e,
        other => return Err(format!("the failing remote build gave {other:?}").into()),
    };
    let remote = e.frames().iter().find_map(|f| f.remote_error()).cloned();
    check(
        matches!(&remote, Some(RemoteError::RunFailed {
            rank: 1,
            level: 3,
            failure: RemoteRunFailure::Run { kind: RemoteRunKind::SubmissionFailed, message },
            ..
        }) if message.contains("no build on rank 1")),
        || format!("the failed remote build arrived as {remote:?}"),
    )?;
    println!("rank 0: remote build failure arrived typed: {e}");
    w.run(on_both(h[1]))?;
    w.run(on_both(h[2]))?;
    w.close()?;
    println!("rank 0: clean shutdown of both remote L3 workers");

    host_buffers_across_hosts(job)?;
    stalled_rank_does_not_silence_the_others(job)?;
    half_received_frame_does_not_silence_the_others(job)?;
    damaged_frame_fails_its_task_and_the_session_still_closes(job)?;
    lost_shutdown_done_is_told_at_once(job)?;
    lost_completion_fails_its_task_with_the_cause_rank_1_left_with(job)?;
    lost_completion_and_left_fail_the_task_within_the_budget(job)?;

    // A hung rank: rank 2's MPI thread stops answering; its run fails within the budget
    // while rank 1 keeps working.
    let (b, h) = l4(job, SHORT_LIVENESS);
    let w = b.start()?;
    let t0 = Instant::now();
    let e = match w.run(on_child(h[4], 1)) {
        Err(WorkerError::Run(e)) => e,
        other => return Err(format!("the hung rank's run gave {other:?}").into()),
    };
    let waited = t0.elapsed();
    let remote = e.frames().iter().find_map(|f| f.remote_error()).cloned();
    check(
        matches!(remote, Some(RemoteError::Unresponsive { rank: 2, task: Some(_), .. })),
        || format!("the hung rank's run failed with {e} ({remote:?})"),
    )?;
    println!("rank 0: hung rank 2 failed its run after {waited:.2?} (budget {SHORT_LIVENESS:?})");
    // Rank 1 keeps working; rank 2 stays failed and fails its next task at once.
    w.run(on_child(h[0], 0))?;
    w.run(on_child(h[1], 0))?;
    w.run(on_child(h[2], 0))?;
    let again = w.run(on_child(h[1], 1));
    check(matches!(&again, Err(WorkerError::Run(e)) if e.to_string().contains("rank 2")), || {
        format!("a failed endpoint took another task: {again:?}")
    })?;
    match w.close() {
        Ok(()) => println!("rank 0: closed after the hung rank"),
        Err(e) => {
            check(e.to_string().contains("rank 2"), || format!("close blamed someone else: {e}"))?;
            println!("rank 0: close reported the hung rank: {e}");
        }
    }

    // A manifest mismatch on rank 2 refuses the start, naming the rank.
    start_refused_by_mismatch(job, 2)?;
    // A mismatch on rank 1, the first child: the start fails before it reaches rank 2, which
    // is told so instead of waiting for a session that never opens.
    start_refused_by_mismatch(job, 1)?;

    // Two children on one rank: refused before any session opens, and the rank told once
    // (a second refusal would be taken by its next session).
    let mut b = Worker::composite(4);
    for name in GRAPHS {
        b.register_graph(name, |_, _, _| Err("runs on a serving rank".into()));
    }
    for _ in 0..2 {
        b.child(RemoteL3::new(job, 1)).expect("an L3 child of an L4");
    }
    match b.start() {
        Err(e) if matches!(e.cause, StartCause::Remote(RemoteError::RankInUse { rank: 1 })) => {
            println!("rank 0: two children on rank 1 refused: {e}");
        }
        Err(e) => return Err(format!("start failed for another reason: {e}").into()),
        Ok(w) => {
            w.close()?;
            return Err("an L4 with two children on one rank started".into());
        }
    }
    // The next start on both ranks is served as usual.
    let (b, h) = l4(job, Duration::from_secs(10));
    let w = b.start()?;
    w.run(on_both(h[0]))?;
    w.close()?;
    println!("rank 0: the next session on both ranks ran");
    superseded_session_is_left_at_once(job)?;
    oversized_health_frame_ends_the_session(job)?;

    // This rank stops answering while ranks 1 and 2 wait for a session; each gives it up
    // within its short budget (checked there). Finalizing waits for them.
    job.stall_for(STALL)?;
    std::thread::sleep(STALL + STALL_DELAY);
    Ok(())
}

/// Rank 0's `Shutdown` to rank 1 is lost, so rank 1 still serves that session when rank 0
/// starts the next one: rank 1 answers the newer `Hello` with a `Left`, which fails the start at
/// once rather than at its deadline; rank 2, not reached, is refused.
fn superseded_session_is_left_at_once(job: &MpiJob) -> Res {
    let mut b = Worker::composite(4);
    let h: Vec<CallableHandle> = GRAPHS
        .iter()
        .map(|name| b.register_graph(name, |_, _, _| Err("runs on a serving rank".into())))
        .collect();
    b.child(RemoteL3::new(job, 1)).expect("an L3 child of an L4");
    let w = b.start()?;
    w.run(on_child(h[0], 0))?;
    job.refuse_next_send_of(FrameKind::Shutdown)?;
    check(w.close().is_err(), || "a close whose Shutdown was lost reported nothing".into())?;
    let (b, _) = l4(job, Duration::from_secs(10));
    let budget = Duration::from_secs(60);
    let t0 = Instant::now();
    let e = match b.startup_timeout(budget).start() {
        Err(e) => e,
        Ok(w) => {
            w.close()?;
            return Err("a start on a rank serving an older session succeeded".into());
        }
    };
    let waited = t0.elapsed();
    check(
        matches!(
            &e.cause,
            StartCause::Remote(RemoteError::Left {
                rank: 1,
                cause: LeftCause::Protocol(ProtocolViolation::UnexpectedFrame {
                    got: FrameKind::Hello,
                    ..
                }),
            })
        ),
        || format!("a start on a rank serving an older session failed with {e}"),
    )?;
    check(waited < budget / 2, || format!("the start failed only after {waited:.1?}"))?;
    println!("rank 0: rank 1, still in a superseded session, left the next at once: {e}");
    Ok(())
}

/// Rank 0 sends rank 1 a health frame longer than any ping (a drill): rank 1 refuses it without
/// allocating it and leaves its session saying why, so a task on it fails.
fn oversized_health_frame_ends_the_session(job: &MpiJob) -> Res {
    let (b, h) = l4(job, Duration::from_secs(10));
    let w = b.start()?;
    job.send_health_bytes(1, 1024)?;
    // The frame travels on the health communicator, the tasks on the data one: a task may
    // still be answered before rank 1 has seen the frame.
    let mut failed = None;
    for _ in 0..100 {
        match w.run(on_child(h[0], 0)) {
            Ok(()) => std::thread::sleep(Duration::from_millis(50)),
            Err(WorkerError::Run(e)) => {
                failed = Some(e);
                break;
            }
            Err(other) => return Err(format!("a task after the health frame gave {other}").into()),
        }
    }
    let Some(e) = failed else {
        return Err("rank 1 kept serving after a 1024-byte health frame".into());
    };
    let remote = e.frames().iter().find_map(|f| f.remote_error()).cloned();
    check(
        matches!(&remote, Some(RemoteError::Left { rank: 1, cause: LeftCause::Other { text } })
            if text.contains("1024-byte health frame")),
        || format!("the task on rank 1 failed with {e} ({remote:?})"),
    )?;
    w.run(on_child(h[0], 1))?;
    check(w.close().is_err(), || "the close did not report rank 1's departure".into())?;
    println!("rank 0: rank 1 refused an oversized health frame and left: {e}");
    Ok(())
}

/// Starts the usual L4 and checks that `rank`'s manifest mismatch refuses it, naming the rank.
fn start_refused_by_mismatch(job: &MpiJob, rank: i32) -> Res {
    let (b, _) = l4(job, Duration::from_secs(20));
    match b.start() {
        Err(e) => match &e.cause {
            StartCause::Remote(RemoteError::ManifestMismatch { rank: r, index: 1, .. })
                if *r == rank =>
            {
                println!("rank 0: start refused by rank {rank}: {e}");
                Ok(())
            }
            other => Err(format!("start failed for another reason: {other:?}").into()),
        },
        Ok(w) => {
            w.close()?;
            Err("an L4 with a mismatched remote manifest started".into())
        }
    }
}

/// Rank 2's MPI thread stalls (a hung host) while rank 0 sends it a 1 MiB frame, which MPI
/// sends by rendezvous: rank 0's MPI thread must keep hearing rank 1, whose task computes for
/// longer than the liveness budget and must succeed. Rank 2's task fails as unresponsive.
fn stalled_rank_does_not_silence_the_others(job: &MpiJob) -> Res {
    let (b, h) = l4(job, SHORT_LIVENESS);
    let w = b.start()?;
    w.run(on_child(h[7], 1))?;
    let stall_ends = Instant::now() + STALL_DELAY + STALL;
    std::thread::sleep(STALL_DELAY + Duration::from_secs(1));
    let big = HostBuffer::from_bytes(&vec![0u8; 1 << 20])?;
    let t = big.tensor(&[1 << 20], DataType::UInt8)?;
    let sink = h[8];
    let to_stalled = w.submit(Orchestration::graph(move |g, _, _| {
        let mut a = TaskArgs::new();
        a.add_input(t)?;
        g.submit_next_level(sink, a, &CallConfig::default(), WorkerId(1))?;
        Ok(())
    }))?;
    let (cpu, t0) = (mpi_thread_cpu(), Instant::now());
    long_task_succeeds(&w, h[9], 0, "rank 2 was stalled")?;
    // The frame stuck behind the stalled rank does not keep the MPI thread spinning.
    let (cpu, wall) = (mpi_thread_cpu().saturating_sub(cpu), t0.elapsed());
    check(cpu < wall / 4, || format!("the MPI thread took {cpu:?} of CPU in {wall:.2?}"))?;
    println!("rank 0: the MPI thread took {cpu:?} of CPU in {wall:.2?} beside a stuck frame");
    after_the_stall(w, to_stalled, 2, stall_ends)?;
    drop(big);
    Ok(())
}

/// CPU time this process's MPI thread (`simpler-mpi`) has taken so far, from `/proc` (whose
/// clock ticks are 10 ms); zero where that cannot be read.
fn mpi_thread_cpu() -> Duration {
    let ticks = |stat: &str| -> Option<u64> {
        let (head, rest) = stat.rsplit_once(')')?;
        if !head.ends_with("(simpler-mpi") {
            return None;
        }
        // After the name: the state (field 3) on, so user and system time (fields 14 and 15)
        // are the 12th and 13th.
        let f: Vec<&str> = rest.split_whitespace().collect();
        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
    };
    let tasks = std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten();
    let stats = tasks.filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok());
    Duration::from_millis(10 * stats.filter_map(|s| ticks(&s)).sum::<u64>())
}

/// Runs `sleep` (a task that computes for longer than the short liveness budget) on `child`,
/// which must succeed while `meanwhile` holds.
fn long_task_succeeds(w: &Worker, sleep: CallableHandle, child: u32, meanwhile: &str) -> Res {
    let rank = child + 1;
    let t0 = Instant::now();
    let long = w.run(on_child(sleep, child));
    check(long.is_ok(), || {
        format!("rank {rank}'s task failed while {meanwhile} ({:.2?}): {long:?}", t0.elapsed())
    })?;
    println!("rank 0: rank {rank}'s {LONG_TASK:?} task succeeded while {meanwhile}");
    Ok(())
}

/// Checks that the task on the stalled `rank` failed naming it and that closing `w` blamed
/// nobody else, then waits until the rank is awake again (the next session starts with the
/// same short budget).
fn after_the_stall(w: Worker, task: RunHandle, rank: i32, stall_ends: Instant) -> Res {
    let stalled = task.wait();
    let named = format!("rank {rank}");
    check(matches!(&stalled, Err(e) if e.to_string().contains(&named)), || {
        format!("the task to the stalled rank gave {stalled:?}")
    })?;
    match w.close() {
        Ok(()) => println!("rank 0: closed after the stalled {named}"),
        Err(e) => {
            check(e.to_string().contains(&named), || format!("close blamed someone else: {e}"))?;
            println!("rank 0: close reported the stalled rank: {e}");
        }
    }
    std::thread::sleep(stall_ends.saturating_duration_since(Instant::now()) + STALL_DELAY);
    Ok(())
}

/// Rank 1's MPI thread hangs part way through sending rank 0 an 8 MiB reply (the job runs
/// without single-copy shared memory, so, as across hosts, a frame's bytes move only while its
/// sender's MPI thread runs): rank 0's MPI thread must keep hearing rank 2 while that frame is
/// half received, so rank 2's task, which computes for longer than the liveness budget, must
/// succeed. Rank 1's task fails as unresponsive.
fn half_received_frame_does_not_silence_the_others(job: &MpiJob) -> Res {
    const REPLY: usize = 8 << 20;
    let (b, h) = l4(job, SHORT_LIVENESS);
    let w = b.start()?;
    let reply = HostBuffer::from_bytes(&vec![0u8; REPLY])?;
    let t = reply.tensor(&[REPLY as u32], DataType::UInt8)?;
    let stall_mid_reply = h[10];
    let stall_ends = Instant::now() + STALL;
    let to_stalling = w.submit(Orchestration::graph(move |g, _, _| {
        let mut a = TaskArgs::new();
        a.add_output(t)?;
        g.submit_next_level(stall_mid_reply, a, &CallConfig::default(), WorkerId(0))?;
        Ok(())
    }))?;
    // Let rank 1 run its task and start its reply.
    std::thread::sleep(STALL_DELAY);
    long_task_succeeds(&w, h[9], 1, "a frame from rank 1 was half received")?;
    after_the_stall(w, to_stalling, 1, stall_ends)?;
    drop(reply);
    Ok(())
}

/// Rank 1's reply to a task arrives damaged (it does not decode): that task fails with a
/// protocol error naming rank 1, and closing the worker still gets rank 1's confirmation of its
/// shutdown instead of reporting its worker leaked.
fn damaged_frame_fails_its_task_and_the_session_still_closes(job: &MpiJob) -> Res {
    let (b, h) = l4(job, Duration::from_secs(10));
    let w = b.start()?;
    let e = match w.run(on_child(h[12], 0)) {
        Err(WorkerError::Run(e)) => e,
        other => return Err(format!("the damaged reply gave {other:?}").into()),
    };
    let remote = e.frames().iter().find_map(|f| f.remote_error()).cloned();
    // The drill inverts the version bytes: the frame is refused for its version, typed.
    check(
        matches!(
            remote,
            Some(RemoteError::Protocol {
                rank: 1,
                violation: ProtocolViolation::Malformed(DecodeError::Version { .. }),
            })
        ),
        || format!("the damaged reply failed its task with {e} ({remote:?})"),
    )?;
    w.run(on_child(h[0], 1))?;
    let closed = w.close();
    check(closed.is_ok(), || format!("close after a damaged frame: {closed:?}"))?;
    println!("rank 0: a damaged reply failed its task ({e}); the session closed cleanly");
    Ok(())
}

/// Rank 1's MPI thread loses its `ShutdownDone` (a drill refuses the send): rank 1 sees the
/// loss and tells rank 0 with a `Left`, so closing the worker reports it at once instead of
/// after waiting out the shutdown budget (60 s) on a rank that goes on serving.
fn lost_shutdown_done_is_told_at_once(job: &MpiJob) -> Res {
    let (b, h) = l4(job, Duration::from_secs(10));
    let w = b.start()?;
    w.run(on_both(h[0]))?;
    let t0 = Instant::now();
    let closed = w.close();
    let waited = t0.elapsed();
    let text = closed.as_ref().err().map(|e| e.to_string()).unwrap_or_default();
    // Rank 1's worker closed cleanly there: only its ShutdownDone was lost.
    let lost = remote_left(&closed, 1)
        .is_some_and(|cause| matches!(cause, LeftCause::ShutdownDoneLost { close: None, .. }));
    check(lost, || format!("close after a lost ShutdownDone gave {closed:?}"))?;
    check(waited < LOST_REPLY_BUDGET, || {
        format!("close waited {waited:.2?} for a ShutdownDone that was lost")
    })?;
    println!("rank 0: a lost ShutdownDone was reported after {waited:.2?}: {text}");
    Ok(())
}

/// Why `rank` left its session, when that is the one error `closed` reports: a teardown error
/// of the remote child served by `rank`.
fn remote_left(closed: &Result<(), CloseError>, rank: i32) -> Option<&LeftCause> {
    let e = closed.as_ref().err()?;
    match (e.teardown.as_slice(), e.leaked.is_empty()) {
        (
            [
                TeardownError {
                    what: TeardownPart::Remote { rank: r, .. },
                    cause: TeardownCause::Remote(RemoteError::Left { rank: left, cause }),
                    ..
                },
            ],
            true,
        ) if *r == rank && *left == rank => Some(cause),
        _ => None,
    }
}

/// Rank 1's MPI thread loses the `Completion` of its task (a drill refuses the send): rank 1
/// leaves its session and tells rank 0 why with a `Left`, so the task fails at once with rank
/// 1's own error, typed as rank 1 saw it, while rank 2 keeps working; the close sends rank 1
/// no `Shutdown` and reports its worker as possibly leaked, since that `Left` says nothing of
/// rank 1's close.
fn lost_completion_fails_its_task_with_the_cause_rank_1_left_with(job: &MpiJob) -> Res {
    let (b, h) = l4(job, Duration::from_secs(10));
    let w = b.start()?;
    let t0 = Instant::now();
    let e = match w.run(on_child(h[0], 0)) {
        Err(WorkerError::Run(e)) => e,
        other => return Err(format!("the task whose reply was lost gave {other:?}").into()),
    };
    let waited = t0.elapsed();
    let remote = e.frames().iter().find_map(|f| f.remote_error()).cloned();
    check(
        matches!(
            remote,
            Some(RemoteError::Left {
                rank: 1,
                cause: LeftCause::Mpi { op: "MPI_Isend (drill)", code: -1 },
            })
        ),
        || format!("the task whose reply was lost failed with {e} ({remote:?})"),
    )?;
    check(waited < LOST_REPLY_BUDGET, || {
        format!("the task waited {waited:.2?} for a reply that was lost")
    })?;
    w.run(on_child(h[0], 1))?;
    let closed = w.close();
    let leaked = closed.as_ref().err().map(|e| (e.teardown.is_empty(), e.leaked.as_slice()));
    let reported = match leaked {
        Some((true, [leak])) => match (&leak.at[..], &leak.what) {
            (
                [TeardownPart::Remote { rank: 1, .. }],
                Leaked::RemoteLost(RemoteError::Left { rank: 1, cause }),
            ) => Some(cause),
            _ => None,
        },
        _ => None,
    };
    check(matches!(reported, Some(LeftCause::Mpi { op: "MPI_Isend (drill)", code: -1 })), || {
        format!("close after rank 1 left gave {closed:?}")
    })?;
    println!("rank 0: a lost reply failed its task after {waited:.2?} with rank 1's cause: {e}");
    Ok(())
}

/// Rank 1 loses both its reply and the `Left` saying why, then serves on (waiting for the next
/// session): its pongs tell rank 0 it left, and the task fails within the liveness budget
/// instead of waiting for good.
fn lost_completion_and_left_fail_the_task_within_the_budget(job: &MpiJob) -> Res {
    let liveness = Duration::from_secs(2);
    let (b, h) = l4(job, liveness);
    let w = b.start()?;
    let t0 = Instant::now();
    let e = match w.run(on_child(h[0], 0)) {
        Err(WorkerError::Run(e)) => e,
        other => {
            return Err(format!("the task whose reply and Left were lost gave {other:?}").into());
        }
    };
    let waited = t0.elapsed();
    let remote = e.frames().iter().find_map(|f| f.remote_error()).cloned();
    check(
        matches!(
            remote,
            Some(RemoteError::SessionEnded { rank: 1, serving: 0, task: Some(_), .. })
        ),
        || format!("the task whose reply and Left were lost failed with {e} ({remote:?})"),
    )?;
    check(waited < LOST_REPLY_BUDGET, || {
        format!("the task waited {waited:.2?} for a rank that had left")
    })?;
    w.run(on_child(h[0], 1))?;
    let closed = w.close();
    let leaked = closed.as_ref().err().map(|e| (e.teardown.is_empty(), e.leaked.as_slice()));
    check(
        matches!(leaked, Some((true, [leak])) if matches!(
            (&leak.at[..], &leak.what),
            (
                [TeardownPart::Remote { rank: 1, .. }],
                Leaked::RemoteLost(RemoteError::SessionEnded { rank: 1, .. }),
            )
        )),
        || format!("close after rank 1 left without a word gave {closed:?}"),
    )?;
    println!("rank 0: a rank that left without a word failed its task after {waited:.2?}: {e}");
    Ok(())
}

/// Host buffers of rank 0 cross hosts: on each remote L3 a task reads two of them and writes
/// the first half of a third (InOut), whose chip lane stages them there; a sub task of rank 0
/// ordered after it by that buffer checks the sum and that the other half kept its bytes.
/// Chip memory of rank 0 and host memory outside a HostBuffer are refused at submit.
fn host_buffers_across_hosts(job: &MpiJob) -> Res {
    let (b, h) = l4(job, Duration::from_secs(10));
    let mut b = b.sub_workers(1);
    let checked = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&checked);
    let verify_sum = b.register_host("verify_sum", move |args| {
        let (x, y, c) = (host_f32(&args, 0)?, host_f32(&args, 1)?, host_f32(&args, 2)?);
        let expected: Vec<f32> =
            add::reference(&x, &y).into_iter().chain(std::iter::repeat_n(-1.0, N)).collect();
        let verdict = if c == expected { "ok".to_owned() } else { "wrong bytes".to_owned() };
        seen.lock().map_err(|_| "poisoned")?.push(verdict);
        Ok(())
    });
    let w = b.start()?;
    for child in 0..2u32 {
        let x = HostBuffer::from_bytes(&f32_to_le_bytes(&ramp(child, 0)))?;
        let y = HostBuffer::from_bytes(&f32_to_le_bytes(&ramp(child, 1)))?;
        let c = HostBuffer::from_bytes(&f32_to_le_bytes(&vec![-1.0; 2 * N]))?;
        let (tx, ty) =
            (x.tensor(&[N as u32], DataType::Float32)?, y.tensor(&[N as u32], DataType::Float32)?);
        let tc = c.tensor(&[2 * N as u32], DataType::Float32)?;
        let first_half = tc.view(&[N as u32], &[0])?;
        let host_add = h[6];
        w.run(Orchestration::graph(move |g, _, _| {
            let mut a = TaskArgs::new();
            a.add_input(tx)?.add_input(ty)?.add_inout(first_half)?;
            g.submit_next_level(host_add, a, &CallConfig::default(), WorkerId(child))?;
            let mut a = TaskArgs::new();
            a.add_input(tx)?.add_input(ty)?.add_input(tc)?;
            g.submit_sub(verify_sum, a)?;
            Ok(())
        }))?;
    }
    let verdicts = checked.lock().map_err(|_| "poisoned")?.clone();
    check(verdicts == ["ok", "ok"], || {
        format!("the sub tasks after the remote tasks saw {verdicts:?}")
    })?;
    println!(
        "rank 0: host buffers went to both remote L3 workers and their written halves came back"
    );

    // Refused at submit, with the typed error: chip memory of this host, plain host memory.
    let chip_memory =
        Tensor::with_buffer(0x10_0000, 4096, &[N as u32], DataType::Float32)?.child_memory(true);
    let plain = vec![0u8; 4096];
    let plain = Tensor::with_buffer(plain.as_ptr() as u64, 4096, &[N as u32], DataType::Float32)?;
    let host_add = h[6];
    let refusals = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::clone(&refusals);
    w.run(Orchestration::graph(move |g, _, _| {
        for t in [chip_memory, plain] {
            let mut a = TaskArgs::new();
            a.add_input(t)?;
            let r = g.submit_next_level(host_add, a, &CallConfig::default(), WorkerId(1));
            out.lock().map_err(|_| "poisoned")?.push(r.map(|_| ()));
        }
        Ok(())
    }))?;
    let refusals = std::mem::take(&mut *refusals.lock().map_err(|_| "poisoned")?);
    let problems: Vec<Option<TensorProblem>> = refusals
        .iter()
        .map(|r| match r {
            Err(WorkerError::RemoteTensor(TensorRefusal {
                arg: 0,
                child: WorkerId(1),
                rank: 2,
                problem,
            })) => Some(problem.clone()),
            _ => None,
        })
        .collect();
    check(
        matches!(
            problems.as_slice(),
            [Some(TensorProblem::ChipMemory { .. }), Some(TensorProblem::NotHostBuffer { .. })]
        ),
        || format!("the unshippable tensors were not refused at submit: {refusals:?}"),
    )?;
    for r in &refusals {
        println!(
            "rank 0: refused at submit: {}",
            r.as_ref().err().map(|e| e.to_string()).unwrap_or_default()
        );
    }

    // Graphs registered after start reach both ranks in two phases: "late" is served by both;
    // "only_on_1" is refused by rank 2, which rolls it back on rank 1 too: "late2" then takes
    // the next ordinal on both ranks and runs rank 1's own body.
    let late = w.register_graph("late", |_, _, _| Err("runs on a serving rank".into()))?;
    w.run(on_both(late))?;
    println!("rank 0: a graph registered after start ran on both remote L3 workers");
    let refused = w.register_graph("only_on_1", |_, _, _| Ok(()));
    check(
        matches!(
            &refused,
            Err(WorkerError::RemoteRegistration {
                rank: 2,
                cause: RemoteError::RegistrationRefused { rank: 2, .. },
                ..
            })
        ),
        || format!("a graph rank 2 does not serve gave {refused:?}"),
    )?;
    println!(
        "rank 0: registration refused: {}",
        refused.err().map(|e| e.to_string()).unwrap_or_default()
    );
    let late2 = w.register_graph("late2", |_, _, _| Ok(()))?;
    let ran = w.run(on_child(late2, 0));
    check(matches!(&ran, Err(e) if e.to_string().contains("late2 ran on rank 1")), || {
        format!("late2 on rank 1 gave {ran:?}")
    })?;
    w.run(on_both(h[0]))?;

    // The `Commit` of "late3" to rank 1 is lost (the MPI thread refuses it after the send was
    // queued): rank 1's session fails for good, so its next task fails with that loss instead
    // of reaching a rank that does not serve the graph the others serve. Rank 2 serves it.
    job.refuse_next_send_of(FrameKind::Commit)?;
    let late3 = w.register_graph("late3", |_, _, _| Err("runs on a serving rank".into()))?;
    let ran = w.run(on_child(h[0], 0));
    let lost = match &ran {
        Err(WorkerError::Run(e)) => e.frames().iter().find_map(|f| f.remote_error()).cloned(),
        _ => None,
    };
    check(
        matches!(&lost, Some(RemoteError::CommitLost { rank: 1, graph, .. }) if graph == "late3"),
        || format!("a task on rank 1 after its lost Commit gave {ran:?}"),
    )?;
    w.run(on_child(late3, 1))?;
    println!("rank 0: a lost Commit failed rank 1's next task: {lost:?}");
    w.close()?;
    Ok(())
}

/// The input `which` of remote child `child`'s host-buffer task.
fn ramp(child: u32, which: u32) -> Vec<f32> {
    (0..N).map(|i| i as f32 * 0.5 + (child * 100 + which * 10) as f32).collect()
}

/// Host tensor `i` of a sub task, read from its HostBuffer.
fn host_f32(args: &simpler_types::TaskArgsView<'_>, i: usize) -> Result<Vec<f32>, String> {
    let t = args.tensor(i).ok_or(format!("no tensor {i}"))?;
    let buf = HostBuffer::of_tensor(t).ok_or(format!("tensor {i} is not a HostBuffer"))?;
    Ok(f32_from_le_bytes(&buf.to_vec()))
}

fn killed_rank0(job: &MpiJob) -> Res {
    let (b, h) = l4(job, Duration::from_secs(3));
    let w = b.start()?;
    w.run(on_both(h[0]))?;
    let r = w.run(on_child(h[5], 1));
    // Usually mpirun has ended the job before this line runs; if not, the dead rank's
    // silence failed the run, and this rank ends the job with a non-zero code.
    eprintln!("rank 0: the run on the killed rank ended: {r:?}");
    std::process::exit(3);
}

// ---------------------------------------------------------------------------------------
// Serving ranks

fn conformance_serving(job: &Arc<MpiJob>) -> Res {
    // Remote tasks and errors; host buffers; a stalled rank 2 not silencing rank 1; a damaged
    // reply.
    for _ in 0..5 {
        serve(job, &GRAPHS)?;
    }
    // Rank 1's ShutdownDone is lost: its serve_l3 says so instead of returning Ok.
    if job.rank() == 1 {
        job.refuse_next_send_of(FrameKind::ShutdownDone)?;
        match serve(job, &GRAPHS) {
            Err(ServeError::Remote(RemoteError::Mpi { op: "MPI_Isend (drill)", .. })) => {}
            other => return Err(format!("rank 1: a lost ShutdownDone gave {other:?}").into()),
        }
    } else {
        serve(job, &GRAPHS)?;
    }
    // Rank 1's Completion is lost: it leaves the session and says why.
    if job.rank() == 1 {
        job.refuse_next_send_of(FrameKind::Completion)?;
        match serve(job, &GRAPHS) {
            Err(ServeError::Remote(RemoteError::Mpi { op: "MPI_Isend (drill)", .. })) => {}
            other => return Err(format!("rank 1: a lost Completion gave {other:?}").into()),
        }
    } else {
        serve(job, &GRAPHS)?;
    }
    // Rank 1 loses its Completion and then its Left, and serves on.
    if job.rank() == 1 {
        job.refuse_next_send_of(FrameKind::Completion)?;
        job.refuse_next_send_of(FrameKind::Left)?;
        match serve(job, &GRAPHS) {
            Err(ServeError::Remote(RemoteError::Mpi { op: "MPI_Isend (drill)", .. })) => {}
            other => {
                return Err(format!("rank 1: a lost Completion and Left gave {other:?}").into());
            }
        }
    } else {
        serve(job, &GRAPHS)?;
    }
    // The hung rank.
    serve(job, &GRAPHS)?;
    let mut renamed = GRAPHS;
    if job.rank() == 2 {
        renamed[1] = "compute_v2";
    }
    match (job.rank(), serve(job, &renamed)) {
        (1, Ok(())) => {}
        (2, Err(ServeError::Remote(RemoteError::Refused { reason }))) => {
            check(reason.contains("rank 2"), || format!("refusal without the rank: {reason}"))?;
        }
        (rank, other) => return Err(format!("rank {rank}: mismatch session: {other:?}").into()),
    }
    let mut renamed = GRAPHS;
    if job.rank() == 1 {
        renamed[1] = "compute_v2";
    }
    match (job.rank(), serve(job, &renamed)) {
        (1, Err(ServeError::Remote(RemoteError::Refused { reason }))) => {
            check(reason.contains("rank 1"), || format!("refusal without the rank: {reason}"))?;
        }
        (2, Err(ServeError::Remote(RemoteError::Refused { reason }))) => {
            check(reason.contains("before reaching this rank"), || {
                format!("an unreached rank's refusal does not say so: {reason}")
            })?;
        }
        (rank, other) => {
            return Err(format!("rank {rank}: first-child mismatch session: {other:?}").into());
        }
    }
    if job.rank() == 1 {
        match serve(job, &GRAPHS) {
            Err(ServeError::Remote(RemoteError::Refused { reason })) => {
                check(reason.contains("before reaching this rank"), || {
                    format!("a refusal before the session does not say so: {reason}")
                })?;
            }
            other => return Err(format!("rank 1: two-children session: {other:?}").into()),
        }
    }
    serve(job, &GRAPHS)?;
    // Rank 0's Shutdown to rank 1 is lost; its next start finds rank 1 still serving.
    let superseded = serve(job, &GRAPHS);
    match (job.rank(), superseded) {
        (
            1,
            Err(ServeError::Remote(RemoteError::Protocol {
                rank: 0,
                violation: ProtocolViolation::UnexpectedFrame { got: FrameKind::Hello, .. },
            })),
        ) => {}
        (2, Err(ServeError::Remote(RemoteError::Refused { reason })))
            if reason.contains("before reaching this rank") => {}
        (rank, other) => {
            return Err(format!("rank {rank}: superseded session: {other:?}").into());
        }
    }
    // Rank 0 sends rank 1 a health frame longer than any ping.
    match (job.rank(), serve(job, &GRAPHS)) {
        (
            1,
            Err(ServeError::Remote(RemoteError::HealthFrameTooLarge {
                rank: 0, bytes: 1024, ..
            })),
        ) => {}
        (2, Ok(())) => {}
        (rank, other) => {
            return Err(format!("rank {rank}: oversized health frame: {other:?}").into());
        }
    }
    // Rank 0 stops answering while this rank waits for its next session: the wait ends with
    // rank 0 unresponsive within the short budget, not when rank 0 comes back.
    let t0 = Instant::now();
    match serve_within(job, &GRAPHS, SHORT_LIVENESS) {
        Err(ServeError::Remote(RemoteError::Unresponsive { rank: 0, level: 4, .. })) => {
            println!("rank {}: gave silent rank 0 up after {:.2?}", job.rank(), t0.elapsed());
        }
        other => return Err(format!("rank {}: silent rank 0: {other:?}", job.rank()).into()),
    }
    Ok(())
}

/// One session: an L3 worker with one simulated chip and one sub worker, serving `names`.
fn serve(job: &Arc<MpiJob>, names: &[&str; 13]) -> Result<(), ServeError> {
    serve_within(job, names, DEFAULT_LIVENESS)
}

/// [`serve`], giving the session up when rank 0 stays silent past `liveness`.
fn serve_within(
    job: &Arc<MpiJob>,
    names: &[&str; 13],
    liveness: Duration,
) -> Result<(), ServeError> {
    let rank = job.rank();
    let mut b =
        Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).chips(&[0]).sub_workers(1);
    let add = b.register_chip(add::callable().expect("the add program builds"));
    let boom = b.register_host("boom", move |_| Err(format!("boom on rank {rank}").into()));
    let j = Arc::clone(job);
    let stall = b.register_host("stall", move |_| Ok(j.stall_for(STALL)?));
    let die = b.register_host("die", |_| std::process::abort());
    let j = Arc::clone(job);
    let stall_soon = b.register_host("stall_soon", move |_| {
        // Answered first: the MPI thread stalls only once the completion is on its way.
        let j = Arc::clone(&j);
        std::thread::spawn(move || {
            std::thread::sleep(STALL_DELAY);
            let _ = j.stall_for(STALL);
        });
        Ok(())
    });
    let j = Arc::clone(job);
    // The reply goes out damaged, and then this rank's MPI thread stalls for a second, so that
    // rank 0's shutdown of the session waits past its first slice for the confirmation.
    let corrupt_reply = b.register_host("corrupt_reply", move |_| {
        j.corrupt_next_send()?;
        Ok(j.stall_after_next_send(Duration::from_secs(1))?)
    });
    let j = Arc::clone(job);
    let stall_mid_reply =
        b.register_host("stall_mid_reply", move |_| Ok(j.stall_after_next_send(STALL)?));
    let sleep = b.register_host("sleep", |_| {
        std::thread::sleep(LONG_TASK);
        Ok(())
    });
    let bufs: Arc<Mutex<Option<[DeviceBuffer; 3]>>> = Arc::default();
    let input = move |which: usize| -> Vec<f32> {
        (0..N).map(|i| i as f32 + (rank as usize * 10 + which) as f32).collect()
    };

    let mut graphs = ServedGraphs::new();
    let s = Arc::clone(&bufs);
    graphs.register(names[0], move |g, _, _| {
        let mem = g.chip_memory(WorkerId(0))?;
        let bytes = (N * 4) as u64;
        let b = [mem.malloc(bytes)?, mem.malloc(bytes)?, mem.malloc(bytes)?];
        mem.copy_to(&b[0], 0, &f32_to_le_bytes(&input(0)))?;
        mem.copy_to(&b[1], 0, &f32_to_le_bytes(&input(1)))?;
        *s.lock().map_err(|_| "poisoned")? = Some(b);
        Ok(())
    });
    let s = Arc::clone(&bufs);
    graphs.register(names[1], move |g, _, _| {
        let b = s.lock().map_err(|_| "poisoned")?.ok_or("not set up")?;
        let mut a = TaskArgs::new();
        a.add_input(b[0].tensor(&[N as u32], DataType::Float32)?)?
            .add_input(b[1].tensor(&[N as u32], DataType::Float32)?)?
            .add_output(b[2].tensor(&[N as u32], DataType::Float32)?)?;
        g.submit_next_level(add, a, &CallConfig::default(), WorkerId(0))?;
        Ok(())
    });
    let s = Arc::clone(&bufs);
    graphs.register(names[2], move |g, _, _| {
        let b = s.lock().map_err(|_| "poisoned")?.ok_or("not set up")?;
        let mut raw = vec![0u8; N * 4];
        g.chip_memory(WorkerId(0))?.copy_from(&b[2], 0, &mut raw)?;
        if f32_from_le_bytes(&raw) != add::reference(&input(0), &input(1)) {
            return Err(format!("rank {rank}: wrong sum").into());
        }
        Ok(())
    });
    for (name, closure) in [(names[3], boom), (names[4], stall), (names[5], die)] {
        graphs.register(name, move |g, _, _| {
            g.submit_sub(closure, TaskArgs::new())?;
            Ok(())
        });
    }
    // Rank 0's host buffers, staged onto this rank's chip by its lane.
    graphs.register(names[6], move |g, view, _| {
        g.submit_next_level(add, TaskArgs::from_view(view)?, &CallConfig::default(), WorkerId(0))?;
        Ok(())
    });
    graphs.register(names[7], move |g, _, _| {
        g.submit_sub(stall_soon, TaskArgs::new())?;
        Ok(())
    });
    // Takes rank 0's host buffers and does nothing with them.
    graphs.register(names[8], |_, _, _| Ok(()));
    graphs.register(names[9], move |g, _, _| {
        g.submit_sub(sleep, TaskArgs::new())?;
        Ok(())
    });
    // Writes nothing, but its reply carries back the bytes of its output; this rank's MPI
    // thread stalls once that reply is on its way.
    graphs.register(names[10], move |g, _, _| {
        g.submit_sub(stall_mid_reply, TaskArgs::new())?;
        Ok(())
    });
    graphs.register(names[11], move |_, _, _| Err(format!("no build on rank {rank}").into()));
    graphs.register(names[12], move |g, _, _| {
        g.submit_sub(corrupt_reply, TaskArgs::new())?;
        Ok(())
    });
    // Registered by rank 0 after start (the host-buffer session); rank 2 lacks "only_on_1".
    graphs.register_later("late", |_, _, _| Ok(()));
    if rank == 1 {
        graphs.register_later("only_on_1", |_, _, _| Ok(()));
    }
    graphs.register_later("late2", move |_, _, _| Err(format!("late2 ran on rank {rank}").into()));
    graphs.register_later("late3", |_, _, _| Ok(()));
    graphs.liveness(liveness);
    serve_l3(job, b, graphs)
}
