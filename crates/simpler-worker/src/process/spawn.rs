//! Starting a chip process: a fresh `exec` of the `simpler-chip-child` binary, never a fork
//! that keeps running this (threaded) process's code (`docs/process-mode.md`, "Start").
//!
//! The child becomes the leader of a process group of its own, so a stuck subtree can be
//! killed as a whole, and inherits exactly one extra descriptor: the mailbox, as fd
//! [`MAILBOX_FD`]. Every child is started from one long-lived spawner thread: Linux sends the
//! parent-death signal when the *thread* that started a child ends, and start-up threads end
//! right after `start`.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};

/// The descriptor number of the mailbox in the child.
pub(crate) const MAILBOX_FD: i32 = 3;
/// The name of the chip-process binary.
pub(crate) const BINARY: &str = "simpler-chip-child";

/// The binary to start: `explicit`, else beside the current executable. `Err` names every
/// path tried.
pub(crate) fn resolve_binary(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let tried: Vec<PathBuf> = match explicit {
        Some(p) => vec![p.to_owned()],
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| vec![d.join(BINARY), d.join("..").join(BINARY)]))
            .unwrap_or_default(),
    };
    tried.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        let list: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
        format!(
            "no {BINARY} binary at {}",
            if list.is_empty() { "(no path)".into() } else { list.join(", ") }
        )
    })
}

type Job = Box<dyn FnOnce() + Send>;

/// Runs `f` on the spawner thread (started on first use, alive until the process exits).
fn on_spawner<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> std::io::Result<R> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let lost = || std::io::Error::other("the spawner thread is gone");
    let tx = match SPAWNER.get() {
        Some(tx) => tx,
        None => {
            let (tx, rx) = mpsc::channel::<Job>();
            std::thread::Builder::new().name("simpler-chip-spawner".into()).spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })?;
            SPAWNER.get_or_init(|| Mutex::new(tx))
        }
    };
    let (rtx, rrx) = mpsc::sync_channel(1);
    tx.lock()
        .map_err(|_| lost())?
        .send(Box::new(move || {
            let _ = rtx.send(f());
        }))
        .map_err(|_| lost())?;
    rrx.recv().map_err(|_| lost())
}

/// Starts `binary` for chip `chip` with `mailbox` as its fd [`MAILBOX_FD`].
pub(crate) fn spawn(binary: &Path, chip: u32, mailbox: OwnedFd) -> std::io::Result<Child> {
    let mut cmd = Command::new(binary);
    cmd.arg("--chip")
        .arg(chip.to_string())
        .arg("--parent")
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .process_group(0);
    let raw = mailbox.as_raw_fd();
    // SAFETY: the hook runs in the forked child before `exec` and only calls `dup2` or `fcntl`,
    // which are async-signal-safe; `raw` stays open in the parent until `spawn` returned (the
    // `OwnedFd` is moved into the closure below and dropped after it). `dup2` gives the copy
    // no close-on-exec flag, so exactly this descriptor survives the exec.
    unsafe {
        cmd.pre_exec(move || {
            // Already at its place, the descriptor only needs its close-on-exec flag cleared.
            let r = if raw == MAILBOX_FD {
                libc::fcntl(raw, libc::F_SETFD, 0)
            } else {
                libc::dup2(raw, MAILBOX_FD)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    on_spawner(move || {
        let child = cmd.spawn();
        drop(mailbox);
        child
    })?
}
