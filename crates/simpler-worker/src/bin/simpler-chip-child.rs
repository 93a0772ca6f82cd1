//! The chip process of a worker in PROCESS mode (`docs/process-mode.md`): started by the worker,
//! never by hand; it serves one chip through the mailbox it inherits.

fn main() {
    // SAFETY: this binary is what the worker's spawner starts in PROCESS mode, with the
    // arguments it reads, and its `main` opens no descriptor before the call, so the one
    // `--mailbox-fd` names is the inherited mailbox, owned by nothing else in the process.
    std::process::exit(unsafe { simpler_worker::chip_child_main() });
}
