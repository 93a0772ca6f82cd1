//! The chip process of a worker in PROCESS mode (`docs/process-mode.md`): started by the worker,
//! never by hand; it serves one chip through the mailbox it inherits.

fn main() {
    std::process::exit(simpler_worker::chip_child_main());
}
