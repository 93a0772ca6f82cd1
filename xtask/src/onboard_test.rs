//! `onboard-test --standin` and the parts of `onboard-test` that do not need a chip: device
//! locks, budgets, the case processes under their limits, the summary.
//!
//! Flow: detect (stand-in: nothing from CANN is required) → build the device programs and the
//! case binary outside the device locks → lock every device for the batch → per device, one
//! process per runtime runs the case set (`tests/onboard.rs`), reporting JSON lines that this
//! module reads under the per-case and whole-run limits → summary table and `summary.json`
//! under `target/onboard-test/<timestamp>/`. Exit: 0 all passed, 1 failures, 2 environment,
//! 124 a limit was hit (the process group is killed, its process tree and the live case's last
//! log lines are printed).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::onboard::DeviceChoice;
use crate::target_dir;

/// Exit code of a run that hit a limit (as `timeout(1)`).
pub const EXIT_TIMEOUT: u8 = 124;

/// Default per-case limit.
const CASE_LIMIT: Duration = Duration::from_secs(120);
/// Default whole-run limit.
const RUN_LIMIT: Duration = Duration::from_secs(20 * 60);
/// Default budgets: scheduler ms, op-execute µs, stream-sync ms.
const BUDGETS: [(&str, &str); 3] = [
    ("SIMPLER_SCHEDULER_TIMEOUT_MS", "2000"),
    ("SIMPLER_OP_EXECUTE_TIMEOUT_US", "3000000"),
    ("SIMPLER_STREAM_SYNC_TIMEOUT_MS", "4000"),
];

/// A device held exclusively for the batch: an exclusive OS lock on `device-<N>.lock`, which
/// the kernel drops when the holder closes the file or dies, so there are no stale locks to
/// judge and no window between creating the file and owning it. The file holds the holder's
/// pid for the message of a refused batch; it stays in place between batches.
#[derive(Debug)]
pub struct DeviceLock {
    _file: std::fs::File,
}

impl DeviceLock {
    pub fn acquire(dir: &Path, device: u32) -> Result<DeviceLock, String> {
        use std::io::{Read, Seek, Write};
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join(format!("device-{device}.lock"));
        let shown = |e: std::io::Error| format!("{}: {e}", path.display());
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(shown)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut owner = String::new();
                let _ = file.read_to_string(&mut owner);
                let owner = owner.trim();
                let who = if owner.is_empty() { "another process" } else { owner };
                return Err(format!(
                    "device {device} is locked by process {who} ({})",
                    path.display()
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(shown(e)),
        }
        file.set_len(0).map_err(shown)?;
        file.rewind().map_err(shown)?;
        writeln!(file, "{}", std::process::id()).map_err(shown)?;
        Ok(DeviceLock { _file: file })
    }
}

/// Takes the devices of `choice` for the batch: every listed one (a held lock refuses the
/// batch), or the first free ones of `auto` in ascending order (busy ones are skipped; too few
/// free refuses the batch, naming the busy ones, and releases what it took).
pub fn lock_devices(dir: &Path, choice: &DeviceChoice) -> Result<Vec<(u32, DeviceLock)>, String> {
    match choice {
        DeviceChoice::Listed(devices) => {
            devices.iter().map(|&d| Ok((d, DeviceLock::acquire(dir, d)?))).collect()
        }
        DeviceChoice::Auto { candidates, count } => {
            let mut taken = Vec::new();
            let mut busy = Vec::new();
            for &d in candidates {
                if taken.len() == *count {
                    break;
                }
                match DeviceLock::acquire(dir, d) {
                    Ok(lock) => taken.push((d, lock)),
                    Err(e) => busy.push(e),
                }
            }
            if taken.len() < *count {
                return Err(format!(
                    "--device auto: {} of {count} device(s) free among {candidates:?}: {}",
                    taken.len(),
                    busy.join("; ")
                ));
            }
            Ok(taken)
        }
    }
}

/// The devices `--device auto` picks from under `--standin`.
pub const STANDIN_DEVICES: u32 = 8;

/// One case's result as the summary reports it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CaseResult {
    pub case: String,
    pub device: u32,
    pub runtime: String,
    pub status: String,
    pub duration_ms: u64,
    pub error_class: Option<String>,
    /// The device or runtime code of the error, and its name.
    pub error_code: Option<i64>,
    pub error_name: Option<String>,
    pub message: String,
    /// The case's output directory (`host.log`, `device-log/`, diagnostics files).
    pub dir: String,
    /// Bytes of CANN's logs the case appended (copied into `device-log/`).
    pub device_log_bytes: u64,
    /// A re-run after the device was recovered (the first run failed by fast-fail).
    pub rerun: bool,
    /// The effective budgets the case process reported.
    pub budgets: Option<serde_json::Value>,
}

impl CaseResult {
    /// A case that ended without its own report (killed, or its process died).
    fn unreported(
        case: String,
        device: u32,
        runtime: &str,
        status: &str,
        ms: u64,
        why: String,
    ) -> Self {
        CaseResult {
            case,
            device,
            runtime: runtime.to_owned(),
            status: status.into(),
            duration_ms: ms,
            error_class: None,
            error_code: None,
            error_name: None,
            message: why,
            dir: String::new(),
            device_log_bytes: 0,
            rerun: false,
            budgets: None,
        }
    }
}

/// What one case process did.
#[derive(Debug, Default)]
pub struct ProcessResult {
    pub cases: Vec<CaseResult>,
    pub budgets: Option<serde_json::Value>,
    /// Set when a limit was hit: which, and the dump.
    pub timed_out: Option<String>,
    pub exit: Option<i32>,
}

/// Runs `cmd` (a case process) in its own process group, reading its JSON lines; kills the
/// group when the live case exceeds `case_limit` or the run reaches `run_deadline`.
pub fn run_cases(
    mut cmd: Command,
    device: u32,
    runtime: &str,
    out: &Path,
    case_limit: Duration,
    run_deadline: Instant,
) -> Result<ProcessResult, String> {
    cmd.stdout(Stdio::piped()).process_group(0);
    let mut child = cmd.spawn().map_err(|e| format!("starting the case process: {e}"))?;
    let stdout = child.stdout.take().ok_or("the case process has no stdout")?;
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut result = ProcessResult::default();
    let mut live: Option<(String, Instant)> = None;
    loop {
        let now = Instant::now();
        let case_deadline =
            live.as_ref().map_or(run_deadline, |(_, t)| (*t + case_limit).min(run_deadline));
        let wait = case_deadline.saturating_duration_since(now);
        match rx.recv_timeout(wait) {
            Ok(line) => {
                println!("  [{device}/{runtime}] {line}");
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
                match v["event"].as_str() {
                    Some("budgets") => {
                        let mut b = v;
                        if let Some(m) = b.as_object_mut() {
                            m.remove("event");
                        }
                        result.budgets = Some(b);
                    }
                    Some("start") => {
                        live = Some((v["case"].as_str().unwrap_or("?").to_owned(), Instant::now()));
                    }
                    Some("end") => {
                        live = None;
                        let s = |k: &str| v[k].as_str().unwrap_or("").to_owned();
                        result.cases.push(CaseResult {
                            case: s("case"),
                            device,
                            runtime: runtime.to_owned(),
                            status: s("status"),
                            duration_ms: v["ms"].as_u64().unwrap_or(0),
                            error_class: v["error_class"].as_str().map(str::to_owned),
                            error_code: v["error_code"].as_i64(),
                            error_name: v["error_name"].as_str().map(str::to_owned),
                            message: s("message"),
                            dir: s("dir"),
                            device_log_bytes: v["device_log_bytes"].as_u64().unwrap_or(0),
                            rerun: v["rerun"].as_bool().unwrap_or(false),
                            budgets: result.budgets.clone(),
                        });
                    }
                    _ => {}
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let which = match &live {
                    Some((case, _)) if Instant::now() < run_deadline => {
                        format!("case `{case}` exceeded its limit of {case_limit:?}")
                    }
                    _ => "the whole-run limit was reached".to_owned(),
                };
                let dump = dump_group(child.id(), live.as_ref().map(|(c, _)| out.join(c)));
                // The case leads its own group (`process_group(0)`) and is not reaped yet, so
                // the group id is still its own. A kill that fails leaves it running, and the
                // wait below would then hang on it: stop the batch instead.
                let group = rustix::process::Pid::from_child(&child);
                rustix::process::kill_process_group(group, rustix::process::Signal::KILL)
                    .map_err(|e| format!("cannot kill the hung case process group: {e}\n{dump}"))?;
                let _ = child.wait();
                if let Some((case, started)) = live.take() {
                    let ms = started.elapsed().as_millis() as u64;
                    let mut c =
                        CaseResult::unreported(case, device, runtime, "timeout", ms, which.clone());
                    c.dir = out.join(&c.case).display().to_string();
                    c.budgets = result.budgets.clone();
                    result.cases.push(c);
                }
                result.timed_out = Some(format!("{which}\n{dump}"));
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().map_err(|e| e.to_string())?;
                result.exit = status.code();
                if let Some((case, started)) = live.take() {
                    let ms = started.elapsed().as_millis() as u64;
                    let why = format!("the case process ended mid-case ({status})");
                    let mut c = CaseResult::unreported(case, device, runtime, "failed", ms, why);
                    c.dir = out.join(&c.case).display().to_string();
                    c.budgets = result.budgets.clone();
                    result.cases.push(c);
                }
                break;
            }
        }
    }
    let _ = reader.join();
    Ok(result)
}

/// The process tree of group `pgid` and the last lines of the live case's host log.
fn dump_group(pgid: u32, case_dir: Option<PathBuf>) -> String {
    // Every process, kept by its group id (the third column): `ps -g` selects by session.
    let tree = Command::new("ps")
        .args(["-e", "-o", "pid,ppid,pgid,stat,etime,args"])
        .output()
        .map(|o| {
            let all = String::from_utf8_lossy(&o.stdout).into_owned();
            let pgid = pgid.to_string();
            let in_group = |(i, line): &(usize, &str)| {
                *i == 0 || line.split_whitespace().nth(2) == Some(pgid.as_str())
            };
            all.lines().enumerate().filter(in_group).map(|(_, l)| format!("{l}\n")).collect()
        })
        .unwrap_or_else(|e| format!("(ps failed: {e})"));
    let log = case_dir
        .map(|d| d.join("host.log"))
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|t| {
            t.lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_else(|| "(the live case has written no host log yet)".into());
    format!("process tree:\n{tree}last host log lines of the live case:\n{log}")
}

/// The exit code of a batch. A case re-run after recovery counts by its re-run.
pub fn exit_code(results: &[ProcessResult]) -> u8 {
    let mut last = std::collections::BTreeMap::new();
    for c in results.iter().flat_map(|r| &r.cases) {
        last.insert((c.device, c.runtime.as_str(), c.case.as_str()), c.status.as_str());
    }
    if results.iter().any(|r| r.timed_out.is_some()) {
        EXIT_TIMEOUT
    } else if results.iter().any(|r| r.exit == Some(2) && r.cases.is_empty()) {
        crate::onboard::EXIT_ENVIRONMENT
    } else if results.iter().any(|r| r.exit != Some(0))
        || last.values().any(|s| *s != "passed" && *s != "skipped")
    {
        1
    } else {
        0
    }
}

fn print_summary(results: &[ProcessResult]) {
    println!(
        "\n{:<26} {:>6} {:<7} {:<8} {:>8}  {:<12} {:<8} detail",
        "case", "device", "runtime", "status", "ms", "class", "code"
    );
    for c in results.iter().flat_map(|r| &r.cases) {
        let mut detail = c.message.clone();
        detail.truncate(90);
        let status = if c.rerun { format!("{}*", c.status) } else { c.status.clone() };
        println!(
            "{:<26} {:>6} {:<7} {:<8} {:>8}  {:<12} {:<8} {detail}",
            c.case,
            c.device,
            c.runtime,
            status,
            c.duration_ms,
            c.error_class.as_deref().unwrap_or("-"),
            c.error_code.map_or("-".to_owned(), |c| c.to_string())
        );
    }
    if results.iter().flat_map(|r| &r.cases).any(|c| c.rerun) {
        println!("(* = re-run after the device was finalized and re-attached)");
    }
}

/// The batch's output directory name: seconds since the epoch (sortable, unique per second,
/// suffixed by the pid).
fn timestamp() -> String {
    let s = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{s}-{}", std::process::id())
}

/// Builds the case binary (`--features onboard`) and returns its path.
fn case_binary() -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let args = [
        "test",
        "-p",
        "simpler-device-a2a3",
        "--features",
        "onboard",
        "--test",
        "onboard",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ];
    println!("\n==> cargo {}", args.join(" "));
    let out = Command::new(&cargo)
        .args(args)
        .current_dir(crate::workspace_root())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("could not start `{cargo}`: {e}"))?;
    if !out.status.success() {
        return Err(format!("building the onboard case binary failed ({})", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"]["name"] == "onboard")
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo reported no onboard case binary".into())
}

fn seconds(args: &[String], flag: &str, default: Duration) -> Result<Duration, String> {
    match crate::onboard::flag_value(args, flag) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map(Duration::from_secs)
            .map_err(|_| format!("{flag} `{v}`: expected whole seconds")),
    }
}

/// `cargo xtask onboard-test --standin [--device SPEC] [--case-timeout S] [--timeout S]`.
pub fn standin(args: &[String], devices: &DeviceChoice) -> ExitCode {
    match standin_choice(args, devices) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("xtask onboard-test: {e}");
            ExitCode::from(crate::onboard::EXIT_ENVIRONMENT)
        }
    }
}

/// The stand-in batch; returns its exit code (`Err` = it could not start: exit 2).
pub fn standin_batch(args: &[String], devices: &[u32]) -> Result<u8, String> {
    standin_choice(args, &DeviceChoice::Listed(devices.to_vec()))
}

/// The stand-in batch on `devices`.
fn standin_choice(args: &[String], devices: &DeviceChoice) -> Result<u8, String> {
    println!("xtask onboard-test --standin: devices {devices:?}");
    println!(
        "  detect: stand-in mode, the stand-in CANN library replaces CANN, npu-smi and the driver"
    );
    println!("  arch check: skipped (the stand-in is no chip)");
    // Compile outside the device locks.
    let mut manifests = Vec::new();
    for runtime in ["hbg", "trb"] {
        manifests.push((runtime, crate::onboard_build::host_artifacts(runtime)?));
    }
    run_batch(args, devices, &manifests, true)
}

/// Builds the case binary, locks the devices and runs one case process per device and runtime
/// (`manifests`: runtime → its manifest) under the limits; prints the summary, writes
/// `summary.json` and returns the batch's exit code. With `standin` the case processes use the
/// stand-in CANN library.
pub fn run_batch(
    args: &[String],
    choice: &DeviceChoice,
    manifests: &[(&str, PathBuf)],
    standin: bool,
) -> Result<u8, String> {
    let case_limit = seconds(args, "--case-timeout", CASE_LIMIT)?;
    let run_limit = seconds(args, "--timeout", RUN_LIMIT)?;
    let exe = case_binary()?;
    let run_deadline = Instant::now() + run_limit;
    let root = target_dir().join("onboard-test");
    let locks = lock_devices(&root.join("locks"), choice)?;
    let devices: Vec<u32> = locks.iter().map(|(d, _)| *d).collect();
    if matches!(choice, DeviceChoice::Auto { .. }) {
        println!("  devices: {devices:?} (the first free of {:?})", choice.candidates());
    }
    let batch = root.join(timestamp());
    println!(
        "  budgets: scheduler {} ms, op execute {} us, stream sync {} ms; limits: {case_limit:?} per case, {run_limit:?} per run",
        BUDGETS[0].1, BUDGETS[1].1, BUDGETS[2].1
    );
    let mut results = Vec::new();
    'devices: for &device in &devices {
        for (runtime, manifest) in manifests {
            let out = batch.join(device.to_string()).join(runtime);
            // CANN's (and the stand-in's) log directory for the process, created beforehand;
            // the case process copies what each case appended into the case's `device-log/`.
            let ascend_log = out.join("ascend-log");
            std::fs::create_dir_all(&ascend_log)
                .map_err(|e| format!("{}: {e}", ascend_log.display()))?;
            let mut cmd = Command::new(&exe);
            cmd.envs(BUDGETS)
                .env("SIMPLER_ONBOARD_TEST_DEVICE", device.to_string())
                .env("SIMPLER_ONBOARD_TEST_RUNTIME", runtime)
                .env("SIMPLER_ONBOARD_TEST_OUT", &out)
                .env("SIMPLER_ONBOARD_TEST_STANDIN", if standin { "1" } else { "0" })
                .env("SIMPLER_ONBOARD_ARTIFACTS", manifest)
                .env("ASCEND_PROCESS_LOG_PATH", &ascend_log);
            let r = run_cases(cmd, device, runtime, &out, case_limit, run_deadline)?;
            let stop = r.timed_out.is_some();
            if let Some(t) = &r.timed_out {
                eprintln!("xtask onboard-test: {t}");
            }
            results.push(r);
            if stop {
                break 'devices;
            }
        }
    }
    print_summary(&results);
    let mut code = exit_code(&results);
    let problems = if standin { output_problems(&results) } else { Vec::new() };
    for p in &problems {
        eprintln!("xtask onboard-test: harness output: {p}");
    }
    if code == 0 && !problems.is_empty() {
        code = 1;
    }
    let summary = serde_json::json!({
        "exit": code,
        "standin": standin,
        "budgets": results.iter().find_map(|r| r.budgets.clone()),
        "limits": { "case_s": case_limit.as_secs(), "run_s": run_limit.as_secs() },
        "timed_out": results.iter().find_map(|r| r.timed_out.clone()),
        "harness_problems": problems,
        "cases": results.iter().flat_map(|r| r.cases.clone()).collect::<Vec<_>>(),
    });
    std::fs::create_dir_all(&batch).map_err(|e| format!("{}: {e}", batch.display()))?;
    let path = batch.join("summary.json");
    let text = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("summary {}\nxtask onboard-test: exit {code}", path.display());
    Ok(code)
}

/// The harness's own outputs, checked after a stand-in batch (the stand-in writes a process
/// log, so every case process must have copied some of it): each reported case has its
/// `host.log`, and each process copied device-log bytes into its cases.
pub fn output_problems(results: &[ProcessResult]) -> Vec<String> {
    let mut problems = Vec::new();
    for r in results.iter().filter(|r| r.timed_out.is_none()) {
        for c in r.cases.iter().filter(|c| !c.dir.is_empty() && c.status != "timeout") {
            let log = Path::new(&c.dir).join("host.log");
            if !log.is_file() {
                problems.push(format!(
                    "{}/{} {}: no {}",
                    c.device,
                    c.runtime,
                    c.case,
                    log.display()
                ));
            }
        }
        if let Some(c) = r.cases.first()
            && r.cases.iter().all(|c| c.device_log_bytes == 0)
        {
            problems.push(format!(
                "{}/{}: no case copied any device-log bytes from ASCEND_PROCESS_LOG_PATH",
                c.device, c.runtime
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    fn run(script: &str, case_limit: Duration) -> ProcessResult {
        let dir = std::env::temp_dir();
        run_cases(sh(script), 0, "hbg", &dir, case_limit, Instant::now() + Duration::from_secs(30))
            .unwrap()
    }

    const PASS: &str = r#"echo '{"event":"start","case":"a"}'; echo '{"event":"end","case":"a","status":"passed","ms":1}'"#;

    #[test]
    fn passed_cases_exit_0_and_a_failed_case_exits_1() {
        let ok = run(PASS, Duration::from_secs(10));
        assert_eq!(ok.cases.len(), 1);
        assert_eq!(exit_code(&[ok]), 0);
        let bad = run(
            r#"echo '{"event":"start","case":"a"}'; echo '{"event":"end","case":"a","status":"failed","ms":1}'; exit 1"#,
            Duration::from_secs(10),
        );
        assert_eq!(exit_code(&[bad]), 1);
    }

    #[test]
    fn a_fast_failed_case_that_passes_its_rerun_counts_as_passed() {
        let script = r#"echo '{"event":"start","case":"a"}'
echo '{"event":"end","case":"a","status":"failed","ms":1,"error_class":"Poisoned","error_code":507899}'
echo '{"event":"start","case":"a"}'
echo '{"event":"end","case":"a","status":"passed","ms":1,"rerun":true}'"#;
        let r = run(script, Duration::from_secs(10));
        assert_eq!(r.cases.len(), 2);
        assert_eq!(r.cases[0].error_code, Some(507_899));
        assert!(r.cases[1].rerun);
        assert_eq!(exit_code(&[r]), 0);
    }

    #[test]
    fn a_case_over_its_limit_is_killed_with_a_dump_and_exit_124() {
        let started = Instant::now();
        let r =
            run(r#"echo '{"event":"start","case":"hangs"}'; sleep 30"#, Duration::from_millis(300));
        assert!(started.elapsed() < Duration::from_secs(20), "the hang was not killed");
        let t = r.timed_out.as_deref().unwrap();
        assert!(t.contains("case `hangs` exceeded") && t.contains("process tree"), "{t}");
        assert!(t.contains("sleep 30"), "the dump lists the group's processes: {t}");
        assert_eq!(r.cases[0].status, "timeout");
        assert_eq!(exit_code(&[r]), EXIT_TIMEOUT);
    }

    #[test]
    fn a_process_dying_mid_case_fails_that_case_and_an_environment_exit_is_2() {
        let r = run(r#"echo '{"event":"start","case":"a"}'; kill -9 $$"#, Duration::from_secs(10));
        assert_eq!(r.cases[0].status, "failed");
        assert_eq!(exit_code(&[r]), 1);
        let env = run("exit 2", Duration::from_secs(10));
        assert_eq!(exit_code(&[env]), 2);
    }

    #[test]
    fn a_device_lock_is_exclusive_a_left_over_file_is_free_and_drop_releases() {
        let dir = tempdir();
        let a = DeviceLock::acquire(&dir, 3).unwrap();
        let pid = std::process::id().to_string();
        let err = DeviceLock::acquire(&dir, 3).unwrap_err();
        assert!(err.contains(&format!("locked by process {pid}")), "{err}");
        drop(a);
        let _b = DeviceLock::acquire(&dir, 3).unwrap();
        // A file left by a holder that is gone, whatever it holds (a dead pid, nothing at all:
        // the moment between creating a pid file and writing it), is no lock.
        std::fs::write(dir.join("device-4.lock"), "999999999\n").unwrap();
        let _c = DeviceLock::acquire(&dir, 4).unwrap();
        std::fs::write(dir.join("device-5.lock"), "").unwrap();
        let d = DeviceLock::acquire(&dir, 5).unwrap();
        assert!(
            DeviceLock::acquire(&dir, 5).is_err(),
            "a held lock is held however its file reads"
        );
        drop(d);
        // A holder that has not written its pid yet still holds the device.
        let early = std::fs::File::create(dir.join("device-6.lock")).unwrap();
        early.try_lock().unwrap();
        let err = DeviceLock::acquire(&dir, 6).unwrap_err();
        assert!(err.contains("device 6 is locked by process another process"), "{err}");
    }

    #[test]
    fn auto_takes_the_first_free_devices_and_refuses_when_too_few_are_free() {
        let dir = tempdir().join("auto");
        let held = DeviceLock::acquire(&dir, 1).unwrap();
        // A stale lock (its owner is gone) counts as free.
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("device-2.lock"), "999999999\n").unwrap();
        let auto = |count| DeviceChoice::Auto { candidates: vec![0, 1, 2, 3], count };
        let taken = lock_devices(&dir, &auto(3)).unwrap();
        assert_eq!(taken.iter().map(|(d, _)| *d).collect::<Vec<_>>(), [0, 2, 3]);
        // Everything is held now: a second batch gets nothing and says who holds device 1.
        let err = lock_devices(&dir, &auto(1)).unwrap_err();
        assert!(err.contains("0 of 1") && err.contains("device 1 is locked"), "{err}");
        drop(taken);
        // Too few free: what was taken is released again.
        let err = lock_devices(&dir, &auto(4)).unwrap_err();
        assert!(err.contains("3 of 4"), "{err}");
        assert_eq!(lock_devices(&dir, &auto(3)).unwrap().len(), 3);
        // A listed device that is held refuses the batch.
        let err = lock_devices(&dir, &DeviceChoice::Listed(vec![0, 1])).unwrap_err();
        assert!(err.contains("device 1 is locked"), "{err}");
        drop(held);
        assert_eq!(lock_devices(&dir, &DeviceChoice::Listed(vec![0, 1])).unwrap().len(), 2);
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "xtask-locks-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }
}
