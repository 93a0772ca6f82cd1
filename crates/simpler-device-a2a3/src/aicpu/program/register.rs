//! The register entry: loads a tensormap_and_ringbuffer `DeviceObject` orchestration on the
//! AICPU side and keeps it under its callable slot (`docs/onboard-programs.md`).
//!
//! A load writes the object's bytes into the directory the host names, under a name derived
//! from its content (by temporary file and rename, skipping an identical file already there),
//! opens it with the dynamic loader, resolves the entry and config symbols and replies with
//! their addresses, which the host writes into each run's `TrbHeader`. An unload closes the
//! object kept under the slot. The table is behind a mutex: registration is rare and never on a
//! run's path.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::invalidate;
use crate::abi::launch::{
    REGISTER_LOAD, REGISTER_MESSAGE_BYTES, REGISTER_OK, REGISTER_UNLOAD, RegisterArgs,
    RegisterFailure, RegisterReply, unpadded,
};
use crate::abi::{ABI_VERSION, MAX_CALLABLE_SLOTS};

/// The largest object a load accepts.
const MAX_OBJECT_BYTES: u64 = 256 << 20;

/// An orchestration object kept open under an owner's slot.
struct Loaded {
    owner: u32,
    slot: u32,
    /// Keeps the entry and config functions mapped while the slot holds them.
    _library: libloading::Library,
}

/// The loaded objects: at most `MAX_CALLABLE_SLOTS` per owner (onboard one owner per device).
static LOADED: Mutex<Vec<Loaded>> = Mutex::new(Vec::new());

/// A refusal: its status and text.
struct Refusal(RegisterFailure, String);

/// The register entry.
///
/// # Safety
///
/// `args` must point at a readable [`RegisterArgs`] (no alignment assumed) whose `reply_addr` is
/// 0 or names [`RegisterReply`]-sized writable device memory and, for a load, whose object
/// range is readable device memory, both valid for the call.
pub unsafe fn register_entry(args: *const u8) -> i32 {
    if args.is_null() {
        return super::ENTRY_BAD_ARGS;
    }
    // SAFETY: the caller guarantees a readable block.
    let a = unsafe { args.cast::<RegisterArgs>().read_unaligned() };
    let result = match a.op {
        _ if a.abi_version != ABI_VERSION => Err(Refusal(
            RegisterFailure::BadArgs,
            format!("the host speaks ABI {}, this program ABI {ABI_VERSION}", a.abi_version),
        )),
        _ if a.slot as usize >= MAX_CALLABLE_SLOTS => {
            Err(Refusal(RegisterFailure::BadArgs, format!("slot {} is out of range", a.slot)))
        }
        // SAFETY: the caller's guarantee on the object range.
        REGISTER_LOAD => unsafe { load(&a) },
        REGISTER_UNLOAD => {
            table().retain(|l| (l.owner, l.slot) != (a.owner, a.slot));
            Ok((0, 0))
        }
        op => Err(Refusal(RegisterFailure::BadArgs, format!("unknown op {op}"))),
    };
    let reply = match &result {
        Ok((entry, config)) => {
            RegisterReply { status: REGISTER_OK, entry: *entry, config: *config, ..zeroed() }
        }
        Err(Refusal(failure, text)) => {
            let mut r = RegisterReply { status: *failure as u32, ..zeroed() };
            let n = floor_char_boundary(text, REGISTER_MESSAGE_BYTES);
            r.message[..n].copy_from_slice(&text.as_bytes()[..n]);
            r.message_len = n as u32;
            r
        }
    };
    if a.reply_addr == 0 {
        return if result.is_ok() { 0 } else { super::ENTRY_BAD_ARGS };
    }
    let dst = a.reply_addr as *mut RegisterReply;
    // SAFETY: the caller guarantees a writable reply block at that address.
    unsafe { dst.write_unaligned(reply) };
    // Written back to memory, so that the host's copy reads it.
    invalidate(dst.cast(), size_of::<RegisterReply>());
    // A refusal the reply carries is an answer: a non-zero return would fail the AICPU
    // stream's sync on a real device, which the host then takes for a device fault.
    0
}

fn zeroed() -> RegisterReply {
    bytemuck::Zeroable::zeroed()
}

/// The table, whatever a panicking holder left (the entries stay consistent: each store is one
/// assignment).
fn table() -> std::sync::MutexGuard<'static, Vec<Loaded>> {
    LOADED.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The largest index `<= max` that is a char boundary of `s`.
fn floor_char_boundary(s: &str, max: usize) -> usize {
    let mut n = s.len().min(max);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// Writes, opens and resolves the object of `a`; the entry and config addresses.
///
/// # Safety
///
/// The object range of `a` is readable device memory for the call.
unsafe fn load(a: &RegisterArgs) -> Result<(u64, u64), Refusal> {
    let bad = |what: &str| Refusal(RegisterFailure::BadArgs, what.to_owned());
    let entry = unpadded(&a.entry_name).ok_or_else(|| bad("the entry name is malformed"))?;
    let config = unpadded(&a.config_name).ok_or_else(|| bad("the config name is malformed"))?;
    let dir = unpadded(&a.dir).ok_or_else(|| bad("the directory is malformed"))?;
    if a.object_addr == 0 || a.object_len == 0 || a.object_len > MAX_OBJECT_BYTES {
        return Err(bad(&format!(
            "the object range {:#x}+{} is empty or larger than {MAX_OBJECT_BYTES} bytes",
            a.object_addr, a.object_len
        )));
    }
    invalidate(a.object_addr as *const u8, a.object_len as usize);
    // SAFETY: the caller's guarantee; the host wrote the bytes before the launch.
    let bytes =
        unsafe { core::slice::from_raw_parts(a.object_addr as *const u8, a.object_len as usize) };
    let path = install(Path::new(dir), bytes, a.slot)
        .map_err(|e| Refusal(RegisterFailure::Write, format!("{dir}: {e}")))?;
    // SAFETY: the host registered this object as an orchestration for this program: its
    // initializers are the C runtime's and the object's own, run once here.
    let library = unsafe { open(&path) }
        .map_err(|e| Refusal(RegisterFailure::Load, format!("{}: {e}", path.display())))?;
    let symbol = |name: &str| {
        // SAFETY: only the symbol's address is taken, nothing is called or read through it
        // here; the orchestration thread calls it with the types of the orchestration ABI.
        unsafe { library.get::<*const core::ffi::c_void>(name.as_bytes()) }
            .map(|s| *s as usize as u64)
            .map_err(|e| {
                Refusal(RegisterFailure::Symbol, format!("{}: `{name}`: {e}", path.display()))
            })
    };
    let entry_addr = symbol(entry)?;
    let config_addr = symbol(config)?;
    // A slot loaded again replaces its object (the old one is closed here).
    let mut t = table();
    t.retain(|l| (l.owner, l.slot) != (a.owner, a.slot));
    t.push(Loaded { owner: a.owner, slot: a.slot, _library: library });
    Ok((entry_addr, config_addr))
}

/// Opens `path` with every symbol bound now and kept local to the object.
///
/// # Safety
///
/// As `libloading::os::unix::Library::open`: the object's initializers run.
unsafe fn open(path: &Path) -> Result<libloading::Library, libloading::Error> {
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    // SAFETY: the caller's guarantee.
    unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map(Into::into)
}

/// Writes `bytes` into `dir` under a name derived from them, unless an identical file is there;
/// the file's path.
fn install(dir: &Path, bytes: &[u8], slot: u32) -> std::io::Result<PathBuf> {
    let digest = Sha256::digest(bytes);
    let name: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!("simpler_orch_{name}.so"));
    if fs::read(&path).is_ok_and(|existing| existing == bytes) {
        return Ok(path);
    }
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("simpler_orch_{name}.so.{}.{slot}.tmp", std::process::id()));
    let written = fs::File::create(&tmp).and_then(|mut f| f.write_all(bytes));
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, &path)) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_written_to_the_reply_returns_0_and_one_without_a_reply_returns_bad_args() {
        let mut reply = zeroed();
        let mut args: RegisterArgs = bytemuck::Zeroable::zeroed();
        args.abi_version = ABI_VERSION + 1;
        args.op = REGISTER_UNLOAD;
        args.reply_addr = std::ptr::addr_of_mut!(reply) as u64;
        // SAFETY: a readable block and a writable reply, both alive for the call.
        let code = unsafe { register_entry(std::ptr::addr_of!(args).cast()) };
        assert_eq!(code, 0, "the refusal is in the reply");
        assert_eq!(reply.status, RegisterFailure::BadArgs as u32);
        args.reply_addr = 0;
        // SAFETY: as above, with no reply.
        let code = unsafe { register_entry(std::ptr::addr_of!(args).cast()) };
        assert_eq!(code, crate::aicpu::program::ENTRY_BAD_ARGS);
    }
}
