//! Starting a chip process: a fresh `exec` of the `simpler-chip-child` binary, never a fork
//! that keeps running this (threaded) process's code (`docs/process-mode.md`, "Start").
//!
//! The child becomes the leader of a process group of its own, so a stuck subtree can be
//! killed as a whole, and inherits exactly one descriptor beyond its standard streams: the
//! mailbox, whose number it is given as `--mailbox-fd`. Every other descriptor of this process
//! is marked close-on-exec in the forked child before `exec`, whether or not whoever opened it
//! asked for that (a pipe or socket left open in a chip process would keep its peer from ever
//! seeing it closed). Every child is started from one spawner thread that lives as long as any
//! child does: Linux sends the parent-death signal when the *thread* that started a child
//! ends, and start-up threads end right after `start`.

use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// The name of the chip-process binary.
pub(crate) const BINARY: &str = "simpler-chip-child";

/// Why a chip process could not be started.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum SpawnFault {
    /// No chip-process binary exists at any path tried.
    NoBinary {
        /// The paths tried: the one given, else those beside the current executable (none
        /// when the current executable is unknown).
        tried: Vec<PathBuf>,
    },
    /// The shared mailbox could not be created (memfd, its seals or its mapping).
    Mailbox {
        /// The system's refusal (the source).
        source: Arc<std::io::Error>,
    },
    /// The start request does not fit the mailbox.
    InitTooLarge {
        /// Its length.
        len: usize,
        /// The mailbox's payload capacity.
        capacity: usize,
    },
    /// The binary was not started by the deadline: its `exec` stalled (a binary on a hung file
    /// system, say), or a spawn posted before this one did. Should it start later, the process
    /// is killed and reaped as it does.
    Stalled {
        /// The binary.
        binary: PathBuf,
        /// How long the spawn was waited for.
        waited: Duration,
    },
    /// The system refused to start the binary.
    Exec {
        /// The binary.
        binary: PathBuf,
        /// The system's refusal (the source).
        source: Arc<std::io::Error>,
    },
}

impl fmt::Display for SpawnFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpawnFault::NoBinary { tried } => {
                write!(f, "no {BINARY} binary at {}", fmt_paths(tried))
            }
            SpawnFault::Mailbox { source } => write!(f, "cannot create the mailbox: {source}"),
            SpawnFault::InitTooLarge { len, capacity } => {
                write!(f, "the start request has {len} bytes, the mailbox holds {capacity}")
            }
            SpawnFault::Stalled { binary, waited } => {
                write!(f, "{} was not started within {waited:?}", binary.display())
            }
            SpawnFault::Exec { binary, source } => {
                write!(f, "cannot execute {}: {source}", binary.display())
            }
        }
    }
}

// Written out so that the system's error is next in a source chain as itself, not as its `Arc`.
impl std::error::Error for SpawnFault {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SpawnFault::Mailbox { source } | SpawnFault::Exec { source, .. } => Some(&**source),
            SpawnFault::NoBinary { .. }
            | SpawnFault::InitTooLarge { .. }
            | SpawnFault::Stalled { .. } => None,
        }
    }
}

fn fmt_paths(tried: &[PathBuf]) -> String {
    if tried.is_empty() {
        return "(no path)".into();
    }
    let list: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    list.join(", ")
}

/// The binary to start: `explicit`, else beside the current executable.
pub(crate) fn resolve_binary(explicit: Option<&Path>) -> Result<PathBuf, SpawnFault> {
    let tried: Vec<PathBuf> = match explicit {
        Some(p) => vec![p.to_owned()],
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| vec![d.join(BINARY), d.join("..").join(BINARY)]))
            .unwrap_or_default(),
    };
    match tried.iter().find(|p| p.is_file()) {
        Some(p) => Ok(p.clone()),
        None => Err(SpawnFault::NoBinary { tried }),
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The spawner thread, alive while any chip process is: it must outlive every child it
/// started (their parent-death signal fires when it ends), and no thread may outlive the
/// workers that needed it.
///
/// Invariant: `live` counts children spawned and not yet reaped, `pending` spawns posted and
/// not yet finished; the thread exists iff `tx` is `Some`, and it is stopped exactly when both
/// are 0 (joined, or left to end by itself when it is the thread that stops it). A spawn's job
/// settles both counts itself, so a caller that stopped waiting for it changes neither. The
/// lock is never held while a spawn runs: an `exec` that stalls (a binary on a hung file
/// system) must not hold up the reaps of other chips.
struct Spawner {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    live: usize,
    pending: usize,
}

static SPAWNER: Mutex<Spawner> =
    Mutex::new(Spawner { tx: None, thread: None, live: 0, pending: 0 });

fn spawner() -> std::sync::MutexGuard<'static, Spawner> {
    SPAWNER.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why [`on_spawner`] returned no value.
#[derive(Debug)]
enum Unanswered {
    /// The job failed, or the spawner thread is gone.
    Io(std::io::Error),
    /// The deadline passed first.
    Late { waited: Duration },
}

/// Runs `f` on the spawner thread (started if needed) and waits for its answer until
/// `deadline`. The job counts one more live child when `f` returns `Ok`; the spawn counts as
/// pending from its post until then, so a concurrent last [`child_reaped`] cannot stop the
/// thread in between. The lock is not held meanwhile. An answer that comes after the deadline
/// is dropped where it is refused, so `T` must end what it stands for when dropped
/// ([`Spawned`] kills and reaps its process).
fn on_spawner<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    deadline: Option<Instant>,
) -> Result<T, Unanswered> {
    let lost = || Unanswered::Io(std::io::Error::other("the spawner thread is gone"));
    let posted = Instant::now();
    let answer = {
        let mut s = spawner();
        if s.tx.is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            let thread = std::thread::Builder::new()
                .name("simpler-chip-spawner".into())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                })
                .map_err(Unanswered::Io)?;
            s.tx = Some(tx);
            s.thread = Some(thread);
        }
        // One answer into a buffer of one: the job's send never blocks.
        let (rtx, rrx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move || {
            let r = f();
            settle(r.is_ok());
            // Refused once the caller stopped waiting: the answer is dropped here.
            let _ = rtx.send(r);
        });
        s.tx.as_ref().ok_or_else(lost)?.send(job).map_err(|_| lost())?;
        s.pending += 1;
        rrx
    };
    let r = match deadline {
        Some(d) => answer.recv_timeout(d.saturating_duration_since(Instant::now())),
        None => answer.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
    };
    match r {
        Ok(r) => r.map_err(Unanswered::Io),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(Unanswered::Late { waited: posted.elapsed() }),
        // The job ended without answering, so without settling: settle it here.
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            settle(false);
            Err(lost())
        }
    }
}

/// The end of a posted spawn: it is no longer pending, and it started a child if `started`.
fn settle(started: bool) {
    let mut s = spawner();
    s.pending -= 1;
    if started {
        s.live += 1;
    } else if s.live == 0 && s.pending == 0 {
        stop(&mut s);
    }
}

fn stop(s: &mut Spawner) {
    s.tx = None;
    if let Some(t) = s.thread.take() {
        // The thread only waits for jobs; with the sender gone it returns at once. On the
        // spawner thread itself (a job that settles or drops a late answer) it returns once
        // that job has, and cannot be joined from within.
        if t.thread().id() != std::thread::current().id() {
            let _ = t.join();
        }
    }
}

/// Called once for every child [`spawn`] started, after it was reaped.
pub(crate) fn child_reaped() {
    let mut s = spawner();
    s.live = s.live.saturating_sub(1);
    if s.live == 0 && s.pending == 0 {
        stop(&mut s);
    }
}

/// A started chip process on its way to the caller of [`spawn`]. Dropped before it was taken
/// (an answer that came after the caller's deadline), it kills the process's group and reaps
/// it: nobody else knows of that process. The drop never waits long, on whichever thread it
/// runs: a process killed while still loading its binary from a hung file system may not end
/// before that file system answers.
struct Spawned(Option<Child>);

/// How long a dropped [`Spawned`] waits for its killed process before a thread of its own
/// reaps it.
const LATE_CHILD_REAP: Duration = Duration::from_millis(200);

/// A late process on its way to being reaped: it counts as live (it holds the spawner, as any
/// child does) until dropped, once reaped.
struct LateChild(Child);

impl Drop for LateChild {
    fn drop(&mut self) {
        child_reaped();
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let Some(child) = self.0.take() else { return };
        // Unreaped and ours, so its pid is still its own group's id (it leads its group).
        let pid = rustix::process::Pid::from_child(&child);
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        if let Err((late, e)) = reap_within(LateChild(child), |l| &mut l.0, LATE_CHILD_REAP) {
            let pid = late.0.id();
            tracing::error!(pid, error = %e, "no thread to reap a late chip process; it stays a zombie");
            // Never reaped, so still counted live.
            std::mem::forget(late);
        }
    }
}

/// Waits at most `bound` for the process `owner` holds (`child` finds its handle) to end, and
/// then drops `owner`: `Ok(true)`. Past the bound a thread of its own waits for the process and
/// then drops `owner`, and this returns `Ok(false)`: the caller never waits longer than
/// `bound`. With no thread to be had, `owner` comes back with the system's refusal.
pub(crate) fn reap_within<T: Send + 'static>(
    mut owner: T,
    child: fn(&mut T) -> &mut Child,
    bound: Duration,
) -> Result<bool, (T, std::io::Error)> {
    let until = Instant::now().checked_add(bound);
    loop {
        match child(&mut owner).try_wait() {
            // ECHILD: reaped elsewhere, nothing left to wait for.
            Ok(Some(_)) | Err(_) => return Ok(true),
            Ok(None) if until.is_some_and(|u| Instant::now() >= u) => break,
            Ok(None) => std::thread::sleep(Duration::from_micros(200)),
        }
    }
    // Shared with the thread, so that a refused thread leaves `owner` here to give back.
    let slot = Arc::new(Mutex::new(Some(owner)));
    let theirs = Arc::clone(&slot);
    let spawn_reaper = move || {
        std::thread::Builder::new().name("simpler-chip-reap".into()).spawn(move || {
            let taken = theirs.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(mut owner) = taken {
                let _ = child(&mut owner).wait();
            }
        })
    };
    #[cfg(test)]
    let reaper = if tests::REAPER_REFUSED.with(std::cell::Cell::get) {
        Err(std::io::Error::other("reaper thread refused by the test"))
    } else {
        spawn_reaper()
    };
    #[cfg(not(test))]
    let reaper = spawn_reaper();
    match reaper {
        Ok(_) => Ok(false),
        Err(e) => match slot.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(owner) => Err((owner, e)),
            None => Ok(false),
        },
    }
}

/// Starts `binary` for chip `chip` with `mailbox` as its only inherited descriptor beyond the
/// standard streams, waiting for the spawner thread until `deadline`. The caller calls
/// [`child_reaped`] once it reaped the child.
pub(crate) fn spawn(
    binary: &Path,
    chip: u32,
    mailbox: OwnedFd,
    deadline: Option<Instant>,
) -> Result<Child, SpawnFault> {
    let raw = mailbox.as_raw_fd();
    let mut cmd = Command::new(binary);
    cmd.arg("--chip")
        .arg(chip.to_string())
        .arg("--parent")
        .arg(std::process::id().to_string())
        .arg("--mailbox-fd")
        .arg(raw.to_string())
        .stdin(Stdio::null())
        .process_group(0);
    // SAFETY: the hook runs in the forked child before `exec` and only makes system calls
    // (`close_range`, else `open`, `getdents64`, `fcntl` and `close`), allocating nothing;
    // `raw` stays open in the parent until `spawn` returned (the `OwnedFd` is moved into the
    // closure below and dropped after it), so the forked child has it at the same number.
    unsafe {
        cmd.pre_exec(move || {
            close_on_exec_from(3)?;
            // The mailbox alone survives the exec.
            if libc::fcntl(raw, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let spawned = on_spawner(
        move || {
            #[cfg(test)]
            tests::stall_if_armed(chip);
            let child = cmd.spawn();
            #[cfg(test)]
            if let Ok(c) = &child {
                tests::started(chip, c.id());
            }
            drop(mailbox);
            child.map(|c| Spawned(Some(c)))
        },
        deadline,
    );
    let binary = binary.to_owned();
    match spawned {
        Ok(mut s) => s.0.take().ok_or_else(|| SpawnFault::Exec {
            binary,
            source: Arc::new(std::io::Error::other("the spawn answered without a process")),
        }),
        Err(Unanswered::Io(e)) => Err(SpawnFault::Exec { binary, source: Arc::new(e) }),
        Err(Unanswered::Late { waited }) => Err(SpawnFault::Stalled { binary, waited }),
    }
}

/// Marks every descriptor from `first` up close-on-exec: in one `close_range` call (Linux
/// 5.11), else one `fcntl` per descriptor `/proc/self/fd` lists. System calls only, no
/// allocation: it runs in a forked child before `exec`.
fn close_on_exec_from(first: u32) -> std::io::Result<()> {
    // SAFETY: plain integer arguments.
    let marked =
        unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    if marked == 0 {
        return Ok(());
    }
    mark_listed_from(i32::try_from(first).unwrap_or(i32::MAX))
}

/// Marks every open descriptor from `first` up close-on-exec, as `/proc/self/fd` lists them
/// (`getdents64` into a buffer on the stack).
fn mark_listed_from(first: i32) -> std::io::Result<()> {
    // The fixed part of a `linux_dirent64`: inode, offset, record length, type; the name follows.
    const NAME_AT: usize = 19;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated path and plain flags.
    let dir = unsafe { libc::open(c"/proc/self/fd".as_ptr(), flags) };
    if dir < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut buf = [0u8; 2048];
    let listed = loop {
        // SAFETY: `buf` is valid for writes of its whole length.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len()) };
        let Ok(n) = usize::try_from(n) else { break Err(std::io::Error::last_os_error()) };
        if n == 0 {
            break Ok(());
        }
        let mut at = 0;
        while at + NAME_AT <= n {
            let len = usize::from(u16::from_ne_bytes([buf[at + 16], buf[at + 17]]));
            if len < NAME_AT || at + len > n {
                break;
            }
            // Entries are descriptor numbers, besides "." and "..".
            let mut name = buf[at + NAME_AT..at + len].iter().take_while(|&&b| b != 0);
            let fd = name.try_fold(0i32, |fd, &b| {
                let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
                fd.checked_mul(10)?.checked_add(i32::from(digit))
            });
            if let Some(fd) = fd.filter(|&fd| fd >= first && fd != dir) {
                // SAFETY: plain integer arguments.
                unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            }
            at += len;
        }
    };
    // SAFETY: `dir` is the descriptor opened above, closed once.
    unsafe { libc::close(dir) };
    listed
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::fd::{AsFd, AsRawFd};

    use super::*;

    thread_local! {
        /// Whether a reap on this thread is refused a reaper thread, as a system out of threads
        /// refuses one.
        pub(crate) static REAPER_REFUSED: std::cell::Cell<bool> =
            const { std::cell::Cell::new(false) };
    }

    #[test]
    fn the_listing_fallback_marks_every_descriptor_from_the_first_close_on_exec() {
        let (reader, writer) = std::io::pipe().expect("pipe");
        let (low, high) = if reader.as_raw_fd() < writer.as_raw_fd() {
            (reader.as_fd(), writer.as_fd())
        } else {
            (writer.as_fd(), reader.as_fd())
        };
        for fd in [low, high] {
            rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()).expect("unmarked");
        }
        // Only descriptors from the higher one up: the rest of the test process is untouched.
        mark_listed_from(high.as_raw_fd()).expect("listed");
        let marked =
            |fd| rustix::io::fcntl_getfd(fd).expect("flags").contains(rustix::io::FdFlags::CLOEXEC);
        assert!(marked(high), "the descriptor at the first number is marked");
        assert!(!marked(low), "a descriptor below it is not");
    }

    /// Spawns for these chips wait before their `exec` until the test releases them.
    static STALLED: Mutex<Vec<(u32, mpsc::Receiver<()>)>> = Mutex::new(Vec::new());

    /// The spawn of `chip` waits, before its `exec`, until the returned sender sends or drops.
    pub(crate) fn stall(chip: u32) -> mpsc::Sender<()> {
        let (release, stalled) = mpsc::channel();
        STALLED.lock().unwrap().push((chip, stalled));
        release
    }

    pub(super) fn stall_if_armed(chip: u32) {
        let armed = {
            let mut stalled = STALLED.lock().unwrap();
            let at = stalled.iter().position(|(c, _)| *c == chip);
            at.map(|i| stalled.swap_remove(i).1)
        };
        if let Some(stalled) = armed {
            let _ = stalled.recv();
        }
    }

    /// The processes test spawns started: (chip, pid).
    static STARTED: Mutex<Vec<(u32, u32)>> = Mutex::new(Vec::new());

    pub(super) fn started(chip: u32, pid: u32) {
        STARTED.lock().unwrap().push((chip, pid));
    }

    /// Waits (at most 10 s) for the spawn of `chip` to start a process, and returns its pid.
    pub(crate) fn pid_of(chip: u32) -> u32 {
        let began = Instant::now();
        loop {
            if let Some(&(_, pid)) = STARTED.lock().unwrap().iter().find(|(c, _)| *c == chip) {
                return pid;
            }
            assert!(began.elapsed() < Duration::from_secs(10), "chip {chip} never started");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// An executable shell script `file` with `body` in a fresh temporary directory named for
    /// the test (`name`), which the caller removes; returns both paths.
    pub(crate) fn script(name: &str, file: &str, body: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("simpler-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let script = dir.join(file);
        std::fs::write(&script, format!("#!/bin/sh\n{body}\n")).expect("script");
        let mut perms = std::fs::metadata(&script).expect("script").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&script, perms).expect("chmod");
        (dir, script)
    }

    #[test]
    fn spawns_held_up_past_their_deadline_fail_and_their_late_processes_are_killed_and_reaped() {
        let (dir, script) = script("stalled", "late.sh", "exec sleep 30");
        let fd = || OwnedFd::from(std::fs::File::open("/dev/null").expect("/dev/null"));

        // The first spawn stalls in its exec; the second waits behind it on the spawner thread.
        let (stalled, queued) = (7001, 7002);
        let release = stall(stalled);
        let deadline = || Some(Instant::now() + Duration::from_millis(300));
        let first = {
            let (script, fd) = (script.clone(), fd());
            std::thread::spawn(move || spawn(&script, stalled, fd, deadline()))
        };
        // Posted once the first is held up in its exec (its stall was taken).
        let began = Instant::now();
        while STALLED.lock().unwrap().iter().any(|(c, _)| *c == stalled) {
            assert!(began.elapsed() < Duration::from_secs(10), "the first spawn never ran");
            std::thread::yield_now();
        }
        let second = spawn(&script, queued, fd(), deadline());
        let first = first.join().unwrap();
        for r in [first, second] {
            let Err(SpawnFault::Stalled { waited, .. }) = r else { panic!("{r:?}") };
            assert!(waited < Duration::from_secs(10), "waited {waited:?}");
        }

        // Both start once the exec goes on, with nobody waiting for them: each is killed and
        // reaped (a zombie keeps its `/proc` entry until then).
        drop(release);
        for chip in [stalled, queued] {
            let pid = pid_of(chip);
            let entry = std::path::PathBuf::from(format!("/proc/{pid}"));
            let began = Instant::now();
            while entry.exists() {
                assert!(began.elapsed() < Duration::from_secs(10), "{pid} still there");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_spawn_that_stalls_holds_no_lock_that_a_reap_needs() {
        let (release, stalled) = mpsc::channel::<()>();
        let spawning = std::thread::spawn(move || {
            on_spawner(
                move || {
                    let _ = stalled.recv();
                    Ok(())
                },
                None,
            )
        });
        // Looked at without waiting for the lock, which a broken spawn would hold for good.
        let posted = || SPAWNER.try_lock().is_ok_and(|s| s.pending > 0);
        let began = std::time::Instant::now();
        while !posted() {
            assert!(began.elapsed() < std::time::Duration::from_secs(20), "never posted");
            std::thread::yield_now();
        }
        // A reap elsewhere while the spawn is stuck in its `exec` takes the lock and returns
        // (other tests' spawns hold it only for moments, so one of a few tries gets it).
        let free = (0..200).any(|_| {
            let got = SPAWNER.try_lock().is_ok();
            std::thread::sleep(std::time::Duration::from_millis(1));
            got
        });
        assert!(free, "the stalled spawn holds the spawner's lock");
        release.send(()).unwrap();
        spawning.join().unwrap().unwrap();
        // The fake child is "reaped": the counts go back to what they were.
        child_reaped();
    }
}
