//! The shared-memory mailbox between the worker and one chip process (`docs/process-mode.md`).
//!
//! One anonymous `memfd` of [`MAILBOX_BYTES`], created by the worker and inherited by the child,
//! so nothing named is left behind whichever side dies. It holds a header (magic, version,
//! layout size, both pids, reserved bytes that must be zero), the request lane (state word,
//! operation, sequence numbers, status, payload length) and the payload area.
//!
//! Invariant: the state word orders every other field. A side writes the payload and the
//! small fields, then stores the state with `Release`; the other side loads the state with
//! `Acquire` before it reads them. Only the side the state hands the mailbox to touches the
//! payload: the worker while the state is `IDLE` or `DONE`, the child while it is `REQUEST`
//! or `STARTING`.
//!
//! The other process is not trusted to keep to that: a child may write any byte of the mapping
//! at any time (after it posted `DONE`, say). So this process accesses the mapping only through
//! atomics — the header and lane fields, the reserved words, and the payload area as a slice of
//! `AtomicU64` words copied in and out with relaxed loads and stores — never through a plain
//! reference to bytes or a `memcpy`. A peer that writes concurrently then makes this side read
//! torn or wrong values, which every reader validates (a payload length beyond the area is
//! refused, frames are decoded with checked reads), never a data race in this process.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use memmap2::MmapRaw;
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::thread::futex;

/// Size of a mailbox in bytes.
pub(crate) const MAILBOX_BYTES: usize = 64 * 1024;
const MAGIC: u64 = u64::from_le_bytes(*b"SMPLRMBX");
/// Bumped whenever the layout or a frame changes.
pub(crate) const VERSION: u32 = 4;
const HEADER_BYTES: usize = 64;
const LANE_BYTES: usize = 64;
const PAYLOAD_OFFSET: usize = HEADER_BYTES + LANE_BYTES;
/// Bytes available to one request or reply payload.
pub(crate) const PAYLOAD_BYTES: usize = MAILBOX_BYTES - PAYLOAD_OFFSET;
const RESERVED_BYTES: usize = HEADER_BYTES - 24;
/// The payload area as 8-byte words (it starts 8-aligned and its size is a multiple of 8).
const PAYLOAD_WORDS: usize = PAYLOAD_BYTES / 8;
const _: () = assert!(PAYLOAD_OFFSET.is_multiple_of(8) && PAYLOAD_BYTES.is_multiple_of(8));

/// States of the request lane (the futex word).
pub(crate) mod state {
    /// The child has not finished its start yet.
    pub(crate) const STARTING: u32 = 0;
    /// The child started its chip and waits for requests.
    pub(crate) const READY: u32 = 1;
    /// The child could not start its chip; the payload holds the error frame.
    pub(crate) const INIT_FAILED: u32 = 2;
    /// No request in flight.
    pub(crate) const IDLE: u32 = 3;
    /// The worker published a request.
    pub(crate) const REQUEST: u32 = 4;
    /// The child copied the request and executes it.
    pub(crate) const ACCEPTED: u32 = 5;
    /// The child published the reply.
    pub(crate) const DONE: u32 = 6;
    /// The worker asks the child to finalize its chip and exit.
    pub(crate) const SHUTDOWN: u32 = 7;
    /// The child finalized its chip; the payload holds what finalize left behind.
    pub(crate) const EXITED: u32 = 8;
}

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    layout: AtomicU32,
    parent_pid: AtomicU32,
    child_pid: AtomicU32,
    reserved: [AtomicU64; RESERVED_BYTES / 8],
}

#[repr(C)]
struct Lane {
    state: AtomicU32,
    op: AtomicU32,
    seq: AtomicU64,
    reply_seq: AtomicU64,
    status: AtomicU32,
    len: AtomicU32,
}

const _: () = assert!(size_of::<Header>() == HEADER_BYTES);
const _: () = assert!(size_of::<Lane>() <= LANE_BYTES);

/// A mapped mailbox, on either side.
pub(crate) struct Mailbox {
    map: MmapRaw,
}

/// Why a child refused the mailbox it was given.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    #[error(
        "the descriptor is not a mailbox: a worker's mailbox is a memfd sealed against shrinking, \
         growing and further sealing, and this one {0}"
    )]
    NotSealed(String),
    #[error("cannot map the mailbox: {0}")]
    Map(std::io::Error),
    #[error("the mailbox has {found} bytes, expected {MAILBOX_BYTES}")]
    Size { found: usize },
    #[error("bad mailbox header: {0}")]
    Header(&'static str),
}

/// A payload length field that names more bytes than the payload area holds (a corrupt or
/// hostile peer); nothing was copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the payload length field says {len} bytes, the mailbox holds {PAYLOAD_BYTES}")]
pub(crate) struct BadLength {
    /// The length field as read.
    pub(crate) len: u32,
}

impl Mailbox {
    /// Creates a fresh mailbox (close-on-exec; the spawner passes it on explicitly).
    pub(crate) fn create() -> std::io::Result<(Mailbox, OwnedFd)> {
        let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        let fd = rustix::fs::memfd_create("simpler-chip-mailbox", flags)?;
        // Above the standard streams: in a process that closed one of them the memfd would
        // take its number, and the spawn, which sets the child's standard streams before it
        // hands the mailbox on, would replace it.
        let fd = if fd.as_raw_fd() <= 2 { rustix::io::fcntl_dupfd_cloexec(&fd, 3)? } else { fd };
        rustix::fs::ftruncate(&fd, MAILBOX_BYTES as u64)?;
        // Sealed at its size: a child that shrank it would make this process fault (SIGBUS)
        // on its next access of the mapping.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let map = MmapRaw::map_raw(&File::from(fd.try_clone()?))?;
        let mailbox = Mailbox { map };
        let h = mailbox.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.layout.store(MAILBOX_BYTES as u32, Ordering::Relaxed);
        h.parent_pid.store(std::process::id(), Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Relaxed);
        mailbox.lane().state.store(state::STARTING, Ordering::Release);
        Ok((mailbox, fd))
    }

    /// Maps an inherited mailbox and checks its header against this build and `parent`. Only a
    /// memfd carrying the seals [`Mailbox::create`] sets is mapped: any other descriptor (a
    /// file, a pipe, a memfd the other side could resize) is refused before it is touched.
    pub(crate) fn open(fd: impl AsFd, parent: u32) -> Result<Mailbox, OpenError> {
        const SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW).union(SealFlags::SEAL);
        match rustix::fs::fcntl_get_seals(&fd) {
            Ok(seals) if seals.contains(SEALS) => {}
            Ok(seals) => return Err(OpenError::NotSealed(format!("has the seals {seals:?}"))),
            Err(e) => return Err(OpenError::NotSealed(format!("has no seals ({e})"))),
        }
        let file = File::from(fd.as_fd().try_clone_to_owned().map_err(OpenError::Map)?);
        let map = MmapRaw::map_raw(&file).map_err(OpenError::Map)?;
        if map.len() != MAILBOX_BYTES {
            return Err(OpenError::Size { found: map.len() });
        }
        let mailbox = Mailbox { map };
        let h = mailbox.header();
        if h.magic.load(Ordering::Acquire) != MAGIC {
            return Err(OpenError::Header("wrong magic"));
        }
        if h.version.load(Ordering::Relaxed) != VERSION {
            return Err(OpenError::Header("another protocol version"));
        }
        if h.layout.load(Ordering::Relaxed) != MAILBOX_BYTES as u32 {
            return Err(OpenError::Header("another layout size"));
        }
        if h.parent_pid.load(Ordering::Relaxed) != parent {
            return Err(OpenError::Header("created by another process than the parent"));
        }
        if h.reserved.iter().any(|w| w.load(Ordering::Relaxed) != 0) {
            return Err(OpenError::Header("reserved bytes are not zero"));
        }
        h.child_pid.store(std::process::id(), Ordering::Relaxed);
        Ok(mailbox)
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is page-aligned, at least `MAILBOX_BYTES` long and lives as long
        // as `self`; `Header` is `repr(C)` of atomics only, valid for any bit pattern, and
        // atomics may be written by the other process at any time.
        unsafe { &*self.map.as_ptr().cast::<Header>() }
    }

    fn lane(&self) -> &Lane {
        // SAFETY: as in `header`; `Lane` is all atomics at an 8-aligned offset in the mapping.
        unsafe { &*self.map.as_ptr().add(HEADER_BYTES).cast::<Lane>() }
    }

    /// The payload area, as the only view this process takes of it: atomic words.
    fn payload(&self) -> &[AtomicU64] {
        // SAFETY: `PAYLOAD_OFFSET + PAYLOAD_WORDS * 8 == MAILBOX_BYTES`, inside the mapping,
        // which lives as long as `self`; the offset is 8-aligned in a page-aligned mapping;
        // `AtomicU64` is valid for any bit pattern and has the size and alignment of `u64`.
        // Every access through this slice is atomic, so the other process writing any of these
        // words at any time is not a data race here (module invariant).
        unsafe {
            std::slice::from_raw_parts(
                self.map.as_ptr().add(PAYLOAD_OFFSET).cast::<AtomicU64>(),
                PAYLOAD_WORDS,
            )
        }
    }

    /// The lane state (`Acquire`: the fields the other side wrote before it are visible).
    pub(crate) fn state(&self) -> u32 {
        self.lane().state.load(Ordering::Acquire)
    }

    /// Publishes `s` (`Release`) and wakes the other side.
    pub(crate) fn publish(&self, s: u32) {
        let lane = self.lane();
        lane.state.store(s, Ordering::Release);
        // Waking fails only for a bad address, which a live mapping is not.
        let _ = futex::wake(&lane.state, futex::Flags::empty(), u32::MAX);
    }

    /// Stores `s` without waking anyone (the worker's `DONE → IDLE`, which no one waits for).
    pub(crate) fn set_quietly(&self, s: u32) {
        self.lane().state.store(s, Ordering::Release);
    }

    /// Parks while the state is `seen`, for at most `timeout`; returns the state then.
    /// Spins briefly first: a reply often comes within microseconds.
    pub(crate) fn wait_while(&self, seen: u32, timeout: Duration) -> u32 {
        for i in 0..256u32 {
            let s = self.state();
            if s != seen {
                return s;
            }
            if i < 192 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let ts = rustix::thread::futex::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        // EAGAIN (the state changed already), EINTR and ETIMEDOUT all mean "look again".
        let _ = futex::wait(&self.lane().state, futex::Flags::empty(), seen, Some(&ts));
        self.state()
    }

    /// The pid the child wrote when it opened the mailbox (0 before).
    pub(crate) fn child_pid(&self) -> u32 {
        self.header().child_pid.load(Ordering::Relaxed)
    }

    /// Writes a frame: operation, sequence number and payload. `Err(len)` when the payload
    /// does not fit, before anything changed.
    pub(crate) fn write_request(&self, op: u32, seq: u64, payload: &[u8]) -> Result<(), usize> {
        self.write_payload(payload)?;
        let lane = self.lane();
        lane.op.store(op, Ordering::Relaxed);
        lane.seq.store(seq, Ordering::Relaxed);
        Ok(())
    }

    /// Writes a reply frame: status, the echoed sequence number and payload.
    pub(crate) fn write_reply(&self, status: u32, seq: u64, payload: &[u8]) -> Result<(), usize> {
        self.write_payload(payload)?;
        let lane = self.lane();
        lane.status.store(status, Ordering::Relaxed);
        lane.reply_seq.store(seq, Ordering::Relaxed);
        Ok(())
    }

    fn write_payload(&self, payload: &[u8]) -> Result<(), usize> {
        if payload.len() > PAYLOAD_BYTES {
            return Err(payload.len());
        }
        let words = self.payload();
        let mut chunks = payload.chunks_exact(8);
        for (word, chunk) in words.iter().zip(&mut chunks) {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(chunk);
            word.store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            // The last word, zero past the end of the payload (the area is whole words).
            let mut bytes = [0u8; 8];
            bytes[..tail.len()].copy_from_slice(tail);
            words[payload.len() / 8].store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
        }
        self.lane().len.store(payload.len() as u32, Ordering::Relaxed);
        Ok(())
    }

    /// The operation and sequence number of the request frame.
    pub(crate) fn request(&self) -> (u32, u64) {
        let lane = self.lane();
        (lane.op.load(Ordering::Relaxed), lane.seq.load(Ordering::Relaxed))
    }

    /// The status and echoed sequence number of the reply frame.
    pub(crate) fn reply(&self) -> (u32, u64) {
        let lane = self.lane();
        (lane.status.load(Ordering::Relaxed), lane.reply_seq.load(Ordering::Relaxed))
    }

    /// Copies the current payload into `out` (cleared first). A length field beyond the area
    /// (a corrupt or hostile peer) is refused before anything is copied: `out` stays empty.
    pub(crate) fn read_payload(&self, out: &mut Vec<u8>) -> Result<(), BadLength> {
        out.clear();
        let field = self.lane().len.load(Ordering::Relaxed);
        let len = field as usize;
        if len > PAYLOAD_BYTES {
            return Err(BadLength { len: field });
        }
        out.reserve(len);
        for word in &self.payload()[..len.div_ceil(8)] {
            let bytes = word.load(Ordering::Relaxed).to_ne_bytes();
            let take = (len - out.len()).min(8);
            out.extend_from_slice(&bytes[..take]);
        }
        Ok(())
    }

    /// Stores a raw payload length field, as a corrupt peer would (tests of the reader).
    #[cfg(test)]
    pub(crate) fn set_payload_len(&self, len: u32) {
        self.lane().len.store(len, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mailbox_cannot_be_resized_by_the_other_side() {
        let (_mb, fd) = Mailbox::create().expect("memfd");
        assert!(rustix::fs::ftruncate(&fd, 4096).is_err(), "shrunk under the mapping");
        assert!(rustix::fs::ftruncate(&fd, 2 * MAILBOX_BYTES as u64).is_err(), "grown");
        let seals = rustix::fs::fcntl_get_seals(&fd).expect("seals");
        assert!(seals.contains(SealFlags::SEAL), "the seals themselves are sealed: {seals:?}");
    }

    #[test]
    fn only_a_memfd_sealed_at_its_size_is_opened_as_a_mailbox() {
        use std::io::{Read, Write};
        let (_mb, fd) = Mailbox::create().expect("memfd");
        let mut bytes = Vec::new();
        File::from(fd.try_clone().expect("dup")).read_to_end(&mut bytes).expect("read");
        assert_eq!(bytes.len(), MAILBOX_BYTES);
        // The same valid header and size, in a memfd the other side could still resize.
        let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        let unsealed = rustix::fs::memfd_create("unsealed", flags).expect("memfd");
        File::from(unsealed.try_clone().expect("dup")).write_all(&bytes).expect("write");
        let err = Mailbox::open(&unsealed, std::process::id()).err().expect("refused");
        assert!(matches!(&err, OpenError::NotSealed(_)), "{err}");
        rustix::fs::fcntl_add_seals(&unsealed, SealFlags::GROW | SealFlags::SEAL).expect("seal");
        let err = Mailbox::open(&unsealed, std::process::id()).err().expect("refused");
        assert!(matches!(&err, OpenError::NotSealed(_)), "{err}");
        // Not a memfd at all.
        let (pipe, _writer) = std::io::pipe().expect("pipe");
        let err = Mailbox::open(&pipe, std::process::id()).err().expect("refused");
        assert!(err.to_string().contains("not a mailbox"), "{err}");
        assert!(Mailbox::open(&fd, std::process::id()).is_ok());
    }

    #[test]
    fn a_mailbox_round_trips_a_frame_and_checks_its_header() {
        let (mb, fd) = Mailbox::create().expect("memfd");
        mb.write_request(7, 3, b"hello").expect("fits");
        let child = Mailbox::open(&fd, std::process::id()).expect("header is valid");
        assert_eq!(child.request(), (7, 3));
        let mut buf = Vec::new();
        child.read_payload(&mut buf).expect("a valid length");
        assert_eq!(buf, b"hello");
        assert_eq!(mb.child_pid(), std::process::id());
        assert!(matches!(Mailbox::open(&fd, 1), Err(OpenError::Header(_))));
    }

    #[test]
    fn an_oversized_payload_is_refused_before_anything_changes() {
        let (mb, _fd) = Mailbox::create().expect("memfd");
        mb.write_request(1, 1, b"x").expect("fits");
        let big = vec![0u8; PAYLOAD_BYTES + 1];
        assert_eq!(mb.write_request(2, 2, &big), Err(PAYLOAD_BYTES + 1));
        assert_eq!(mb.request(), (1, 1));
        assert_eq!(mb.state(), state::STARTING);
    }

    #[test]
    fn payloads_of_every_tail_length_and_the_whole_area_round_trip() {
        let (mb, fd) = Mailbox::create().expect("memfd");
        let peer = Mailbox::open(&fd, std::process::id()).expect("header is valid");
        let mut buf = Vec::new();
        for len in (0..=17).chain([PAYLOAD_BYTES - 1, PAYLOAD_BYTES]) {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            mb.write_reply(1, len as u64, &payload).expect("fits");
            peer.read_payload(&mut buf).expect("a valid length");
            assert_eq!(buf, payload, "{len} bytes");
        }
    }

    #[test]
    fn a_length_field_beyond_the_area_is_refused_before_anything_is_copied() {
        let (mb, fd) = Mailbox::create().expect("memfd");
        let peer = Mailbox::open(&fd, std::process::id()).expect("header is valid");
        mb.write_reply(0, 1, b"reply").expect("fits");
        let mut buf = b"left over".to_vec();
        for len in [PAYLOAD_BYTES as u32 + 1, u32::MAX] {
            mb.set_payload_len(len);
            assert_eq!(peer.read_payload(&mut buf), Err(BadLength { len }));
            assert!(buf.is_empty(), "{len}: {buf:?}");
        }
    }

    #[test]
    fn a_peer_writing_the_payload_while_it_is_read_yields_bytes_never_a_fault() {
        // The peer of a real mailbox is another process; a second mapping on a thread writes
        // the same pages just as freely while this side copies them out.
        let (mb, fd) = Mailbox::create().expect("memfd");
        let peer = Mailbox::open(&fd, std::process::id()).expect("header is valid");
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut n = 0u8;
                while !stop.load(Ordering::Relaxed) {
                    n = n.wrapping_add(1);
                    let _ = peer.write_reply(0, 1, &vec![n; PAYLOAD_BYTES - usize::from(n)]);
                    peer.set_payload_len(u32::from(n) << 12);
                }
            });
            let mut buf = Vec::new();
            for _ in 0..2000 {
                match mb.read_payload(&mut buf) {
                    Ok(()) => assert!(buf.len() <= PAYLOAD_BYTES),
                    Err(BadLength { len }) => assert!(len as usize > PAYLOAD_BYTES),
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
}
