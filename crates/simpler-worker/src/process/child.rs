//! The chip process: one chip's `ChipState` served through the inherited mailbox
//! (`docs/process-mode.md`, "Start" and "Requests").
//!
//! Exit statuses: 0 after a shutdown, 1 when the chip failed to start, 2 when orphaned, 3 for
//! bad arguments or a refused mailbox, 4 for a protocol violation by the worker.

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use simpler_device_a2a3::{
    CallableProblem, DeviceError, DeviceRunner, MemPurpose, Platform, RunnerOptions, RuntimeVariant,
};
use simpler_types::{
    CallableId, EndpointOutcome, FailureMechanism, RunId, TaskArgs, TaskId, WorkerId,
};

use super::catalog;
use super::mailbox::{Mailbox, PAYLOAD_BYTES, state};
use super::wire::{
    FailureFrame, Malformed, Reader, Refusal, Writer, decode_config, encode_code, op, status,
    with_tags,
};
use crate::chip::ChipState;
use crate::error::{Leak, Leaked, MemError, RegistrationFailure, Residue, TeardownCause};
use crate::faults::Faults;

/// How often a waiting child checks that its parent is alive.
const PARENT_CHECK: Duration = Duration::from_millis(10);

fn arg(name: &str) -> Option<u32> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

fn parent_alive(parent: u32) -> bool {
    rustix::process::getppid().is_some_and(|p| p.as_raw_nonzero().get() as u32 == parent)
}

/// The chip process's main function (see [`crate::chip_child_main`] for its contract).
pub(crate) fn main() -> i32 {
    let (Some(chip), Some(parent), Some(mailbox_fd)) =
        (arg("--chip"), arg("--parent"), arg("--mailbox-fd").and_then(|f| i32::try_from(f).ok()))
    else {
        eprintln!("simpler-chip-child is started by a worker in PROCESS mode, not by hand");
        return 3;
    };
    // Dies with the worker's spawner thread, which lives as long as the worker's process; the
    // parent check below covers the window before this call.
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    if !parent_alive(parent) {
        return 2;
    }
    // SAFETY: the caller of `chip_child_main` vouches that the worker's spawner started this
    // process and left the mailbox open at this descriptor across the exec, so it is open for
    // as long as it is borrowed here.
    let borrowed = unsafe { BorrowedFd::borrow_raw(mailbox_fd) };
    // Refuses anything but a memfd sealed as the worker seals its mailboxes, before taking the
    // descriptor over: one that is not the mailbox is left open to whoever owns it.
    let mailbox = match Mailbox::open(borrowed, parent) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("simpler-chip-child: descriptor {mailbox_fd}: {e}");
            return 3;
        }
    };
    // SAFETY: as above, and nothing else in this process owns or closes the inherited mailbox
    // descriptor (the contract of `chip_child_main`), so it is closed once, here; the mapping
    // stays valid without it.
    drop(unsafe { OwnedFd::from_raw_fd(mailbox_fd) });
    let mut child = Child {
        mailbox,
        parent,
        state: None,
        chip: WorkerId(chip),
        contents: HashMap::new(),
        last_seq: 0,
        request: Vec::new(),
        out: Writer::default(),
        fault: 0,
        hang_after_exit: false,
        abort_after_exit: false,
    };
    if !child.init() {
        return 1;
    }
    child.serve()
}

struct Child {
    mailbox: Mailbox,
    parent: u32,
    state: Option<ChipState>,
    chip: WorkerId,
    /// Digest → the id of the content as this process built it.
    contents: HashMap<[u8; 32], CallableId>,
    last_seq: u64,
    /// The private copy of the current request.
    request: Vec<u8>,
    out: Writer,
    /// The armed crash fault (0 = none).
    fault: u8,
    /// Fault 12, armed beside any other: the process hangs after it stored `EXITED`.
    hang_after_exit: bool,
    /// Fault 14, armed beside any other.
    abort_after_exit: bool,
}

fn frame(outcome: EndpointOutcome, message: String) -> FailureFrame {
    FailureFrame {
        outcome,
        mechanism: FailureMechanism::EndpointFailed,
        code: None,
        message,
        refusal: None,
    }
}

/// A refused registration: typed when the parent can rebuild the error (see [`Refusal`]).
fn refusal_frame(e: &DeviceError) -> FailureFrame {
    match Refusal::of(e) {
        Some((refusal, message)) => {
            FailureFrame { message, refusal: Some(refusal), ..device_frame(e) }
        }
        None => device_frame(e),
    }
}

/// A failed registration or removal of this process's chip. Its chip lives in this process,
/// so the failure is the device's; a chip process's failure would cross as text.
fn registration_frame(
    e: &RegistrationFailure,
    refusal: fn(&DeviceError) -> FailureFrame,
) -> FailureFrame {
    match e {
        RegistrationFailure::Device(d) => refusal(d),
        other => frame(EndpointOutcome::EndpointFailure, other.to_string()),
    }
}

fn device_frame(e: &DeviceError) -> FailureFrame {
    let outcome = if e.poisons_device() {
        EndpointOutcome::EndpointFailure
    } else {
        EndpointOutcome::TaskFailure
    };
    FailureFrame {
        outcome,
        mechanism: e.mechanism(),
        code: e.device_code(),
        message: e.to_string(),
        refusal: None,
    }
}

fn mem_frame(e: &MemError) -> FailureFrame {
    match e {
        MemError::DeviceUnusable { message, code, .. } => FailureFrame {
            outcome: EndpointOutcome::EndpointFailure,
            mechanism: FailureMechanism::EndpointFailed,
            code: *code,
            message: message.clone(),
            refusal: None,
        },
        MemError::Device { message, code, .. } => FailureFrame {
            outcome: EndpointOutcome::TaskFailure,
            mechanism: FailureMechanism::TaskFailed,
            code: *code,
            message: message.clone(),
            refusal: None,
        },
        other => frame(EndpointOutcome::TaskFailure, other.to_string()),
    }
}

impl Child {
    /// Reads the INIT frame, attaches the chip and publishes `READY` or `INIT_FAILED`.
    fn init(&mut self) -> bool {
        let read = self.mailbox.read_payload(&mut self.request);
        let request = std::mem::take(&mut self.request);
        let attached = match read {
            Ok(()) => self.attach(&request),
            Err(e) => Err(frame(EndpointOutcome::EndpointFailure, e.to_string())),
        };
        self.request = request;
        self.out.0.clear();
        match attached {
            Ok(state) => {
                self.state = Some(state);
                self.mailbox.publish(state::READY);
                true
            }
            Err(f) => {
                f.encode_within(&mut self.out, PAYLOAD_BYTES);
                let _ = self.mailbox.write_reply(status::FAILED, 0, &self.out.0);
                self.mailbox.publish(state::INIT_FAILED);
                false
            }
        }
    }

    fn attach(&self, request: &[u8]) -> Result<ChipState, FailureFrame> {
        let malformed = |e: Malformed| frame(EndpointOutcome::EndpointFailure, e.to_string());
        let mut r = Reader(request);
        let platform = match r.u8().map_err(malformed)? {
            0 => Platform::A2a3Sim,
            _ => Platform::A2a3,
        };
        let runtime = match r.u8().map_err(malformed)? {
            0 => RuntimeVariant::HostBuildGraph,
            _ => RuntimeVariant::TensormapAndRingbuffer,
        };
        let device = r.u32().map_err(malformed)?;
        let _chip = r.u32().map_err(malformed)?;
        let prewarm = match r.u8().map_err(malformed)? {
            1 => Some(decode_config(&mut r).map_err(malformed)?),
            _ => None,
        };
        let mut runner = DeviceRunner::attach(RunnerOptions::new(platform, device, runtime))
            .map_err(|e| device_frame(&e))?;
        if let Some(cfg) = &prewarm {
            runner.prewarm(cfg).map_err(|e| device_frame(&e))?;
        }
        Ok(ChipState::new(self.chip, runner, Faults::default()))
    }

    /// Serves requests until `SHUTDOWN`; returns the exit status.
    fn serve(&mut self) -> i32 {
        let mut seen = state::READY;
        loop {
            let s = self.mailbox.wait_while(seen, PARENT_CHECK);
            match s {
                state::REQUEST => {
                    let (code, seq) = self.mailbox.request();
                    if seq <= self.last_seq {
                        eprintln!(
                            "simpler-chip-child: request {seq} after {}: duplicate or decreasing",
                            self.last_seq
                        );
                        return 4;
                    }
                    self.last_seq = seq;
                    let read = self.mailbox.read_payload(&mut self.request);
                    // Quiet: the worker waits for DONE, whose store wakes it.
                    self.mailbox.set_quietly(state::ACCEPTED);
                    let st = match read {
                        Ok(()) => self.execute(code),
                        Err(e) => {
                            self.out.0.clear();
                            frame(EndpointOutcome::EndpointFailure, e.to_string())
                                .encode(&mut self.out);
                            status::FAILED
                        }
                    };
                    if self.mailbox.write_reply(st, seq, &self.out.0).is_err() {
                        // A reply too large for the mailbox: send the failure instead.
                        self.out.0.clear();
                        frame(
                            EndpointOutcome::TaskFailure,
                            "the reply does not fit the mailbox".into(),
                        )
                        .encode(&mut self.out);
                        let _ = self.mailbox.write_reply(status::FAILED, seq, &self.out.0);
                    }
                    self.mailbox.publish(state::DONE);
                    seen = state::DONE;
                }
                state::SHUTDOWN => {
                    if self.fault == 4 {
                        loop {
                            std::thread::sleep(Duration::from_secs(1));
                        }
                    }
                    let residue = self.state.take().map(|mut s| s.finalize()).unwrap_or_default();
                    self.out.0.clear();
                    encode_residue_within(&mut self.out, &residue, PAYLOAD_BYTES);
                    // Fits by construction: a refused write would leave the last reply there,
                    // which the parent would read as this report.
                    let _ = self.mailbox.write_reply(status::OK, self.last_seq, &self.out.0);
                    self.mailbox.publish(state::EXITED);
                    // Fault 12: the process hangs after it said it exits; 14: it aborts.
                    if self.hang_after_exit {
                        loop {
                            std::thread::sleep(Duration::from_secs(1));
                        }
                    }
                    if self.abort_after_exit {
                        std::process::abort();
                    }
                    return 0;
                }
                other => {
                    if other == seen && !parent_alive(self.parent) {
                        return 2;
                    }
                    seen = other;
                }
            }
        }
    }

    /// Executes the request in `self.request` into `self.out`; returns the status.
    fn execute(&mut self, code: u32) -> u32 {
        self.out.0.clear();
        let request = std::mem::take(&mut self.request);
        let r = self.dispatch(code, &mut Reader(&request));
        self.request = request;
        match r {
            Ok(()) => status::OK,
            Err(f) => {
                self.out.0.clear();
                f.encode_within(&mut self.out, PAYLOAD_BYTES);
                status::FAILED
            }
        }
    }

    fn dispatch(&mut self, code: u32, r: &mut Reader<'_>) -> Result<(), FailureFrame> {
        let malformed = |e: Malformed| frame(EndpointOutcome::EndpointFailure, e.to_string());
        let Some(state) = self.state.as_mut() else {
            return Err(frame(EndpointOutcome::EndpointFailure, "the chip is finalized".into()));
        };
        match code {
            op::REGISTER => {
                // Faults 7, 8, 9 and 13 act on the next registration: an abort, a hang, a
                // refusal, a mailbox state that flips for ever.
                match self.fault {
                    7 => Self::crash_if_armed(2),
                    8 => Self::crash_if_armed(3),
                    13 => self.flip_state_for_ever(),
                    _ => {}
                }
                let digest = r.digest().map_err(malformed)?;
                let bytes = r.bytes().map_err(malformed)?;
                // Fault 9 refuses this registration only, as a chip whose callable buffer
                // cannot be allocated would.
                if self.fault == 9 {
                    self.fault = 0;
                    return Err(refusal_frame(&DeviceError::OutOfMemory {
                        run_id: None,
                        bytes: bytes.len() as u64,
                        purpose: MemPurpose::ChipBuffer,
                        limit: None,
                    }));
                }
                let c = catalog::resolve(bytes, &digest).map_err(|e| {
                    // The refusal crosses to the parent as text.
                    refusal_frame(&DeviceError::InvalidCallable {
                        run_id: None,
                        problem: CallableProblem::Relayed { text: e.to_string() },
                    })
                })?;
                if state.is_unusable(&c.id()) {
                    return Err(refusal_frame(&DeviceError::Busy {
                        call: "register_callable",
                        state: format!("unusable on chip {} after a failed removal", self.chip),
                    }));
                }
                state.register(&c).map_err(|e| registration_frame(&e, refusal_frame))?;
                self.contents.insert(digest, c.id());
            }
            op::RELEASE => {
                let digest = r.digest().map_err(malformed)?;
                let Some(id) = self.contents.get(&digest).copied() else { return Ok(()) };
                // Fault 11 makes the chip refuse the removal (the release of the last reference).
                let refuse = self.fault == 11 && state.refs(&id) == 1;
                if refuse {
                    self.fault = 0;
                }
                let released = state.release_or_refuse(&id, refuse);
                // Content whose removal failed stays known as unusable, so that `QUERY` says so.
                if state.refs(&id) == 0 && !state.is_unusable(&id) {
                    self.contents.remove(&digest);
                }
                released.map_err(|e| registration_frame(&e, device_frame))?;
            }
            op::QUERY => {
                let digest = r.digest().map_err(malformed)?;
                let (refs, unusable) = match self.contents.get(&digest) {
                    Some(id) => (state.refs(id), state.is_unusable(id)),
                    None => (0, false),
                };
                self.out.u64(refs as u64).u8(u8::from(unusable));
            }
            op::RUN => {
                let digest = r.digest().map_err(malformed)?;
                let run = RunId::from_raw(r.u64().map_err(malformed)?)
                    .ok_or(Malformed("run id 0"))
                    .map_err(malformed)?;
                let origin = TaskId::new(run, r.u32().map_err(malformed)?);
                let config = decode_config(r).map_err(malformed)?;
                let blob = TaskArgs::decode(r.bytes().map_err(malformed)?)
                    .map_err(|e| frame(EndpointOutcome::TaskFailure, e.to_string()))?;
                let args = with_tags(&blob, r).map_err(malformed)?;
                Self::crash_if_armed(self.fault);
                let id = self.contents.get(&digest).copied().ok_or_else(|| {
                    frame(EndpointOutcome::TaskFailure, "content not prepared on this chip".into())
                })?;
                state.run(&id, args.view(), &config, origin).map_err(|f| FailureFrame {
                    outcome: f.outcome,
                    mechanism: f.mechanism,
                    code: f.device_code,
                    message: f.message,
                    refusal: None,
                })?;
            }
            op::MALLOC => {
                let (addr, _) =
                    state.malloc(r.u64().map_err(malformed)?).map_err(|e| mem_frame(&e))?;
                // Fault 10 answers a wild address instead (the allocation stays the chip's).
                let addr = if self.fault == 10 {
                    self.fault = 0;
                    u64::MAX
                } else {
                    addr
                };
                self.out.u64(addr);
            }
            op::FREE => state.free(r.u64().map_err(malformed)?).map_err(|e| mem_frame(&e))?,
            op::COPY_TO => {
                let addr = r.u64().map_err(malformed)?;
                let data = r.bytes().map_err(malformed)?;
                state.copy_to(addr, data).map_err(|e| mem_frame(&e))?;
            }
            op::COPY_FROM => {
                // Fault 5 counts down to the second copy (6), which crashes.
                match self.fault {
                    5 => self.fault = 6,
                    6 => Self::crash_if_armed(1),
                    _ => {}
                }
                let addr = r.u64().map_err(malformed)?;
                let len = r.u64().map_err(malformed)? as usize;
                let data = state.copy_from(addr, len).map_err(|e| mem_frame(&e))?;
                self.out.0.extend_from_slice(&data);
            }
            op::LEDGER => {
                let l = state.ledger().map_err(|e| mem_frame(&e))?;
                self.out.u64(l.committed).u64(l.user_allocations);
                self.out.u64(l.pooled_arenas).u64(l.runtime_buffers);
            }
            op::ARM_FAULT => match r.u8().map_err(malformed)? {
                12 => self.hang_after_exit = true,
                14 => self.abort_after_exit = true,
                fault => self.fault = fault,
            },
            other => {
                return Err(frame(
                    EndpointOutcome::EndpointFailure,
                    format!("unknown operation {other}"),
                ));
            }
        }
        Ok(())
    }

    /// The crash faults of the crash-isolation tests (armed only through the simulator-only
    /// `Worker::arm_chip_process_fault`).
    /// Fault 13: flips the mailbox between REQUEST and ACCEPTED, waking the parent each time,
    /// until killed.
    fn flip_state_for_ever(&self) -> ! {
        loop {
            for s in [state::REQUEST, state::ACCEPTED] {
                self.mailbox.publish(s);
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }

    fn crash_if_armed(fault: u8) {
        match fault {
            1 => loop {
                // The first delivery may meet the runtime's stack-overflow handler, which
                // restores the default action and returns; the next one then kills.
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::SEGV,
                );
                std::thread::sleep(Duration::from_millis(1));
            },
            2 => std::process::abort(),
            3 => loop {
                std::thread::sleep(Duration::from_secs(1));
            },
            // Acted on at shutdown.
            4 => {}
            _ => {}
        }
    }
}

/// The finalize report: a count, then as many entries of `residue` as fit in `limit` bytes; the
/// ones left out are counted in a last entry saying so.
fn encode_residue_within(w: &mut Writer, residue: &[Residue], limit: usize) {
    /// Room kept for the closing entry that counts what did not fit.
    const CLOSING_ROOM: usize = 128;
    let start = w.0.len();
    w.u32(0);
    let mut written = 0u32;
    for (i, r) in residue.iter().enumerate() {
        let before = w.0.len();
        encode_residue(w, r);
        let last = i + 1 == residue.len();
        let room = if last { limit } else { limit.saturating_sub(CLOSING_ROOM) };
        if w.0.len() - start > room {
            w.0.truncate(before);
            let left = residue.len() - i;
            w.u8(0);
            encode_code(w, None);
            w.str(&format!("{left} more finalize failures did not fit the chip's mailbox"));
            written += 1;
            break;
        }
        written += 1;
    }
    w.0[start..start + 4].copy_from_slice(&written.to_le_bytes());
}

/// Writes what finalizing the chip left for the parent, which names the chip and this process
/// itself: a stuck device thread's name (tag 1), or a failure's device code and text (tag 0).
fn encode_residue(w: &mut Writer, r: &Residue) {
    match r {
        Residue::Leaked(Leak { what: Leaked::DeviceThread(name), .. }) => {
            w.u8(1).str(name);
        }
        Residue::Failed { cause: TeardownCause::Device(e), .. } => {
            w.u8(0);
            encode_code(w, e.device_code());
            w.str(&e.to_string());
        }
        Residue::Failed { cause, .. } => {
            w.u8(0);
            encode_code(w, None);
            w.str(&cause.to_string());
        }
        // A chip's finalize leaks only device threads; a remote worker is never a chip's.
        #[cfg(feature = "mpi")]
        Residue::Leaked(leak) => {
            w.u8(0);
            encode_code(w, None);
            w.str(&format!("leaked: {leak}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{PAYLOAD_BYTES, encode_residue_within};
    use crate::error::{Leak, Leaked, Residue};
    use crate::process::wire::{Reader, Writer, decode_code};

    fn thread(i: usize) -> Residue {
        Residue::Leaked(Leak { at: Vec::new(), what: Leaked::DeviceThread(format!("{i:0>100}")) })
    }

    /// Decodes a finalize report as the parent does: its entries' messages (thread names).
    fn entries(bytes: &[u8]) -> Vec<String> {
        let mut r = Reader(bytes);
        let n = r.u32().expect("count");
        let out: Vec<String> = (0..n)
            .map(|_| match r.u8().expect("kind") {
                1 => r.str().expect("name").to_owned(),
                _ => {
                    decode_code(&mut r).expect("code");
                    r.str().expect("message").to_owned()
                }
            })
            .collect();
        assert!(r.0.is_empty(), "bytes left after {n} entries");
        out
    }

    #[test]
    fn a_finalize_report_larger_than_the_mailbox_is_cut_and_says_how_much_is_missing() {
        let many: Vec<Residue> = (0..2000).map(thread).collect();
        let mut w = Writer::default();
        encode_residue_within(&mut w, &many, PAYLOAD_BYTES);
        assert!(w.0.len() <= PAYLOAD_BYTES, "{} bytes", w.0.len());
        let got = entries(&w.0);
        let kept = got.len() - 1;
        assert!(kept > 0);
        let left = 2000 - kept;
        let last = got.last().expect("a closing entry");
        assert_eq!(*last, format!("{left} more finalize failures did not fit the chip's mailbox"));

        // A report that fits is sent whole.
        let few: Vec<Residue> = (0..3).map(thread).collect();
        let mut w = Writer::default();
        encode_residue_within(&mut w, &few, PAYLOAD_BYTES);
        assert_eq!(entries(&w.0).len(), 3);
    }
}
