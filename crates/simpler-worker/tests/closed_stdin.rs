//! A worker whose process runs with its standard input closed (a daemon, `prog <&-`) still
//! starts chip processes: the mailbox a chip process inherits must not take descriptor 0, which
//! the spawn sets to the child's own standard input before it hands the mailbox on.
//!
//! Its own test binary: it closes this process's descriptor 0 for good.

mod common;

use common::{add_callable, host};
use simpler_worker::{ChildMode, ProcessOptions};

#[test]
fn chip_processes_start_when_the_workers_standard_input_is_closed() {
    // SAFETY: descriptor 0 is this process's standard input, which nothing in this test binary
    // reads or holds as an owned descriptor; the one test here runs alone.
    unsafe { rustix::io::close(0) };
    let opts = ProcessOptions::default().child_path(env!("CARGO_BIN_EXE_simpler-chip-child"));
    let mut b = host().chips(&[0]).chip_mode(ChildMode::Process).process_options(opts);
    b.register_chip(add_callable(0));
    let w = b.start().expect("a chip process starts with this process's stdin closed");
    assert!(w.chip_process_id(simpler_types::WorkerId(0)).unwrap().is_some());
    w.close().expect("close");
}
