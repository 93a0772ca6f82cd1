//! The stand-in CANN library for tests: compiling it, laying it out as a fake install, and its
//! control API (call log and knobs).
//!
//! `standin/standin.c` is compiled once per test process (per variant) with `cc`, for the
//! target this crate was built for, into this crate's build directory. A [`FakeInstall`] is a
//! temporary directory used as the file-system root of a [`SearchConfig`]; each library placed
//! in it is a copy of the compiled object, opened `RTLD_LOCAL`, so every test has its own
//! stand-in state and tests run in parallel. The copies of one install share one state (the
//! first copy's, kept alive by every copy that uses it), so the [log](FakeInstall::take_log)
//! is one ordered sequence across libraries, and a [`Cann`] may outlive its install.
//!
//! Knobs ([`FakeInstall::set_value`]): `sync_timeout_stream` (creation index, 1-based, of the
//! stream whose stream syncs return 507046 and event syncs 507047), `pending_after_records`
//! (how many more event records complete; every later one stays pending — its query answers
//! "not reached", its sync 507047 — as on a device that stopped there; −1, the default, lets
//! every record complete), `reach_after_syncs` (after that many more event syncs the stopped
//! device goes on: every pending event is reached and later records complete; −1, the
//! default, never), `sync_delay_stream` and `sync_delay_ms` (every sync of that stream, or of
//! a reached event recorded on it, takes that many milliseconds, or runs out after its timeout
//! when that is shorter; 0, the default, no delay), `reset_probe_failures`
//! (stream creations right after a force reset that fail with 507899), `force_reset_delay_ms`
//! (how long `aclrtResetDeviceForce` takes before it returns, during which other threads' calls
//! go on; 0, the default, no delay), `drain_result` (code of
//! `aclrtSynchronizeDeviceWithTimeout`), `cube_core_limit`, `vector_core_limit`,
//! `aicpu_occupy_mask`, `aicore_valid_mask`, `device_count`, `version_major`/`_minor`/`_patch`,
//! `poisoned`, `soc_name` (what `aclrtGetSocName` answers: 0 `Ascend910B1` (default), 1
//! `Ascend910_9391`, 2 `Ascend950PR_9599`, anything else no name), `register_reply` (how a
//! launch of the AICPU program's `simpler_aicpu_register_callable` answers, played by the
//! stand-in: 0 success with the object's address as both functions, a positive value that
//! failure status, a negative one no reply at all). Faults ([`FakeInstall::fail_call`], [`FakeInstall::poison_at`]) make the nth
//! call of a function return a chosen code.
//!
//! ACL is initialised per install, as CANN's is per process: `aclInit` initialises it (and
//! answers 100002 when it is initialised already), `aclFinalize` ends it (and answers 100037
//! when it is not initialised), and
//! [`FakeInstall::acl_initialized`] tells which holds.
//!
//! Device sets are counted per device as CANN counts them: `rtSetDevice`/`aclrtSetDevice` add
//! one, `rtDeviceReset`/`aclrtResetDevice` take one off, `aclrtResetDeviceForce` releases the
//! device at once, and a reset of a device with no set left returns 107000. A force reset also
//! releases the streams, events and AICPU binaries created on the device (a later destroy or
//! unload of one returns 107000).
//!
//! Device memory is host memory and a host mapping (`halHostRegister`) answers the device
//! address itself, so whatever gives memory back (`rtFree`/`aclrtFree`, the release of a
//! device's memory by `aclrtResetDeviceForce`, [`FakeInstall::reset`]) frees the storage only
//! when no live mapping covers it; covered storage is kept until its last mapping is
//! unregistered ([`ObjectKind::Retired`]), so nothing that holds a mapping reads freed memory.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use libloading::os::unix::{Library as RawLibrary, RTLD_LOCAL, RTLD_NOW};

use crate::loader::{Cann, Library, OpenScope, SearchConfig};

const SOURCE: &str = include_str!("../standin/standin.c");
const SOURCE_NAME: &str = "standin.c";

/// A stand-in failure: building or placing the library, or a control call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StandInError {
    /// The C compiler could not be found or failed.
    #[error("building the stand-in library failed: {0}")]
    Build(String),
    /// A file operation on the fake install failed.
    #[error("{path}: {source}")]
    Io {
        /// The path operated on.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// A placed copy could not be opened or lacks a control function.
    #[error("stand-in copy {path}: {error}")]
    Open {
        /// The copy.
        path: PathBuf,
        /// `dlerror`.
        error: String,
    },
    /// The log filled up and calls were not recorded; an order check would be wrong.
    #[error("the stand-in log overflowed: {0} calls were not recorded")]
    LogOverflow(u64),
    /// A knob or function name was refused by the stand-in.
    #[error("the stand-in refused `{0}`")]
    Refused(String),
}

/// Path of the compiled stand-in, built once per process for each omitted symbol (or none).
///
/// # Errors
///
/// [`StandInError::Build`] when no C compiler works.
pub fn library(omit: Option<&str>) -> Result<PathBuf, StandInError> {
    static BUILT: OnceLock<Mutex<HashMap<Option<String>, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let key = omit.map(str::to_owned);
    if let Some(path) = built.get(&key) {
        return Ok(path.clone());
    }
    let path = compile(omit)?;
    built.insert(key, path.clone());
    Ok(path)
}

fn compile(omit: Option<&str>) -> Result<PathBuf, StandInError> {
    let dir = PathBuf::from(env!("OUT_DIR")).join("standin").join(std::process::id().to_string());
    std::fs::create_dir_all(&dir)
        .map_err(|source| StandInError::Io { path: dir.clone(), source })?;
    let src = dir.join(SOURCE_NAME);
    std::fs::write(&src, SOURCE)
        .map_err(|source| StandInError::Io { path: src.clone(), source })?;
    let variant = omit.unwrap_or("full");
    let out = dir.join(format!("libstandin-{variant}.so"));
    let target = env!("SIMPLER_ACL_SYS_TARGET");
    let compiler = cc::Build::new()
        .target(target)
        .host(target)
        .opt_level(1)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .pic(true)
        .try_get_compiler()
        .map_err(|e| StandInError::Build(e.to_string()))?;
    let mut command: Command = compiler.to_command();
    command.args(["-shared", "-fPIC", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Werror", "-o"]);
    command.arg(&out).arg(&src).arg("-lpthread");
    if let Some(symbol) = omit {
        // A version script that keeps the symbol local leaves it out of the dynamic table, so
        // dlsym cannot find it: the variant for the lazy-resolution and probe tests.
        let script = dir.join(format!("omit-{symbol}.map"));
        let text = format!("{{ global: *; local: {symbol}; }};\n");
        std::fs::write(&script, text)
            .map_err(|source| StandInError::Io { path: script.clone(), source })?;
        command.arg(format!("-Wl,--version-script={}", script.display()));
    }
    let output = command.output().map_err(|e| StandInError::Build(format!("{command:?}: {e}")))?;
    if !output.status.success() {
        return Err(StandInError::Build(format!(
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(out)
}

/// One entry of the stand-in's call log, as the C side records it (`standin_call`).
#[repr(C)]
#[derive(Clone, Copy)]
struct RawCall {
    func: [c_char; 48],
    device: i64,
    stream: u64,
    block_dim: i64,
    size: i64,
    timeout: i64,
    value: i64,
    text: [c_char; 128],
    ret: i64,
}

/// One logged call. Fields a function does not have are `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The C function.
    pub func: String,
    /// Device id (bind, reset, driver calls).
    pub device: Option<i64>,
    /// Stream handle (small integers from 1).
    pub stream: Option<u64>,
    /// Block dim of a launch.
    pub block_dim: Option<i64>,
    /// Bytes (allocations, copies, memset, mappings, argument blocks).
    pub size: Option<i64>,
    /// Timeout as passed (ms for syncs, µs for the op-execute timeout).
    pub timeout: Option<i64>,
    /// A function-specific value: copy kind, priority, log level, resource type, schedule
    /// mode, kernel type, address, handle.
    pub value: Option<i64>,
    /// Names: op name, kernel name, JSON path, config path.
    pub text: String,
    /// The return code.
    pub ret: i64,
}

fn text_of(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl From<&RawCall> for Call {
    fn from(raw: &RawCall) -> Self {
        let opt = |v: i64| (v != -1).then_some(v);
        Call {
            func: text_of(&raw.func),
            device: opt(raw.device),
            stream: (raw.stream != 0).then_some(raw.stream),
            block_dim: opt(raw.block_dim),
            size: opt(raw.size),
            timeout: opt(raw.timeout),
            value: opt(raw.value),
            text: text_of(&raw.text),
            ret: raw.ret,
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.func)?;
        let fields = [
            ("device", self.device),
            ("stream", self.stream.map(|s| s as i64)),
            ("block_dim", self.block_dim),
            ("size", self.size),
            ("timeout", self.timeout),
            ("value", self.value),
        ];
        for (name, value) in fields {
            if let Some(v) = value {
                write!(f, " {name}={v}")?;
            }
        }
        if !self.text.is_empty() {
            write!(f, " text={:?}", self.text)?;
        }
        write!(f, " -> {}", self.ret)
    }
}

type TakeLog = unsafe extern "C" fn(*mut RawCall, usize) -> usize;
type Dropped = unsafe extern "C" fn() -> u64;
type SetFault = unsafe extern "C" fn(*const c_char, u64, i32, c_int) -> c_int;
type SetValue = unsafe extern "C" fn(*const c_char, i64) -> c_int;
type Reset = unsafe extern "C" fn();
type Live = unsafe extern "C" fn(c_int) -> usize;
type AclInitialized = unsafe extern "C" fn() -> c_int;
type StatePtr = unsafe extern "C" fn() -> *mut c_void;
type ShareState = unsafe extern "C" fn(*mut c_void);

/// The control functions of the first copy of an install (whose state every copy shares).
struct Control {
    take_log: TakeLog,
    dropped: Dropped,
    set_fault: SetFault,
    set_value: SetValue,
    reset: Reset,
    live: Live,
    acl_initialized: AclInitialized,
}

/// An opened copy, with the state and control functions when it is the install's first.
type Linked = (RawLibrary, Option<(*mut c_void, Control)>);

/// A fake CANN install in a temporary directory, used as the file-system root of the search.
pub struct FakeInstall {
    root: tempfile::TempDir,
    omit: Option<String>,
    // Kept open so that the state outlives every `Cann` of the test; `Cann` opens the same
    // files and so gets the same (already initialised) objects.
    copies: Vec<(Library, PathBuf, RawLibrary)>,
    control: Option<Control>,
    state: *mut c_void,
}

// SAFETY: the raw state pointer is only handed to the stand-in's own `standin_share_state`,
// and the stand-in guards its state with a mutex, so the install may move between and be used
// from several threads.
unsafe impl Send for FakeInstall {}
// SAFETY: as above; every control call goes through the stand-in's mutex.
unsafe impl Sync for FakeInstall {}

impl fmt::Debug for FakeInstall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let placed: Vec<_> = self.copies.iter().map(|(l, p, _)| (l, p)).collect();
        f.debug_struct("FakeInstall")
            .field("root", &self.root.path())
            .field("placed", &placed)
            .finish()
    }
}

/// Where a [`FakeInstall::standard`] install puts each library, relative to the root.
pub const STANDARD_LAYOUT: &[(Library, &str)] = &[
    (Library::Acl, "usr/local/Ascend/cann/lib64"),
    (Library::Runtime, "usr/local/Ascend/cann/lib64"),
    (Library::Dlog, "usr/local/Ascend/cann/lib64"),
    (Library::Hccl, "usr/local/Ascend/cann/lib64"),
    (Library::Hal, "usr/local/Ascend/driver/lib64/driver"),
];

impl FakeInstall {
    /// An empty install (nothing placed yet).
    ///
    /// # Errors
    ///
    /// When the temporary directory cannot be created.
    pub fn empty() -> Result<Self, StandInError> {
        Self::empty_omitting(None)
    }

    /// An empty install whose copies will lack `symbol`.
    ///
    /// # Errors
    ///
    /// When the temporary directory cannot be created.
    pub fn empty_omitting(symbol: Option<&str>) -> Result<Self, StandInError> {
        let root = tempfile::Builder::new()
            .prefix("simpler-standin-")
            .tempdir()
            .map_err(|source| StandInError::Io { path: std::env::temp_dir(), source })?;
        Ok(FakeInstall {
            root,
            omit: symbol.map(str::to_owned),
            copies: Vec::new(),
            control: None,
            state: std::ptr::null_mut(),
        })
    }

    /// Every library at its default install location ([`STANDARD_LAYOUT`]).
    ///
    /// # Errors
    ///
    /// When building or placing the stand-in fails.
    pub fn standard() -> Result<Self, StandInError> {
        Self::standard_omitting(None)
    }

    /// [`FakeInstall::standard`] with copies lacking `symbol`.
    ///
    /// # Errors
    ///
    /// When building or placing the stand-in fails.
    pub fn standard_omitting(symbol: Option<&str>) -> Result<Self, StandInError> {
        let mut install = Self::empty_omitting(symbol)?;
        for (library, dir) in STANDARD_LAYOUT {
            install.place(*library, dir)?;
        }
        Ok(install)
    }

    /// The install's root directory.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Copies the stand-in into `<root>/<dir>/<first soname of library>` and links it to the
    /// install's shared state. Returns the file's path.
    ///
    /// The copy is written and linked under a temporary name that no search looks for, and
    /// only then renamed to its path, so a loader on another thread (over a configuration of
    /// this install) either finds no file there or finds the copy already linked: no call runs
    /// on a copy while its state changes. A loader that opened an earlier file at that path
    /// keeps using that one.
    ///
    /// # Errors
    ///
    /// When building, copying or opening the copy fails.
    pub fn place(&mut self, library: Library, dir: &str) -> Result<PathBuf, StandInError> {
        static PLACED: AtomicU64 = AtomicU64::new(0);
        let object = self::library(self.omit.as_deref())?;
        let dir = self.root.path().join(dir);
        std::fs::create_dir_all(&dir)
            .map_err(|source| StandInError::Io { path: dir.clone(), source })?;
        let path = dir.join(library.name());
        // Unique in the process: the dynamic linker also matches objects by the name they were
        // opened with, so a name used before would answer the earlier object.
        let n = PLACED.fetch_add(1, Ordering::Relaxed);
        let staging = dir.join(format!(".{}.placing-{n}", library.name()));
        let placed = self.link_copy(&object, &staging).and_then(|linked| {
            // The dynamic linker identifies an object by its file too, so a loader opening
            // `path` after the rename gets this object, already linked.
            std::fs::rename(&staging, &path)
                .map_err(|source| StandInError::Io { path: path.clone(), source })?;
            Ok(linked)
        });
        let (raw, first) = match placed {
            Ok(linked) => linked,
            Err(e) => {
                // Dropping an unplaced copy unloads it; a linked one gives its reference to
                // the shared state back as it unloads.
                let _ = std::fs::remove_file(&staging);
                return Err(e);
            }
        };
        if let Some((state, control)) = first {
            // Kept only with the copy that provides them, which `copies` keeps loaded.
            self.state = state;
            self.control = Some(control);
        }
        self.copies.push((library, path.clone(), raw));
        Ok(path)
    }

    /// Copies `object` to `path`, opens the copy and links it to the install's shared state:
    /// the first copy provides the state and the control functions (returned with it), every
    /// later one is pointed at that state.
    fn link_copy(&self, object: &Path, path: &Path) -> Result<Linked, StandInError> {
        // A copy, not a link: the dynamic linker identifies objects by file, and each install
        // needs objects of its own.
        std::fs::copy(object, path)
            .map_err(|source| StandInError::Io { path: path.to_path_buf(), source })?;
        let open_error = |error: libloading::Error| StandInError::Open {
            path: path.to_path_buf(),
            error: error.to_string(),
        };
        // SAFETY: the stand-in's initialisers only set up its own state.
        let raw =
            unsafe { RawLibrary::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map_err(open_error)?;
        // SAFETY: the control functions have these signatures in standin.c.
        unsafe {
            if self.control.is_none() {
                let control = Control {
                    take_log: *raw.get(b"standin_take_log").map_err(open_error)?,
                    dropped: *raw.get(b"standin_log_dropped").map_err(open_error)?,
                    set_fault: *raw.get(b"standin_set_fault").map_err(open_error)?,
                    set_value: *raw.get(b"standin_set_value").map_err(open_error)?,
                    reset: *raw.get(b"standin_reset").map_err(open_error)?,
                    live: *raw.get(b"standin_live").map_err(open_error)?,
                    acl_initialized: *raw.get(b"standin_acl_initialized").map_err(open_error)?,
                };
                let state: StatePtr = *raw.get(b"standin_state").map_err(open_error)?;
                Ok((raw, Some((state(), control))))
            } else {
                let share: ShareState = *raw.get(b"standin_share_state").map_err(open_error)?;
                share(self.state);
                Ok((raw, None))
            }
        }
    }

    /// A search over this install only: its root as file-system root, an empty environment,
    /// `RTLD_LOCAL`, no "already loaded" step and no bare-soname fallback.
    pub fn config(&self) -> SearchConfig {
        self.config_with_env(&[])
    }

    /// As [`FakeInstall::config`] with these environment variables; values are taken relative
    /// to the install root when they start with `@/`.
    pub fn config_with_env(&self, vars: &[(&str, &str)]) -> SearchConfig {
        let root = self.root.path().to_path_buf();
        let vars: HashMap<String, std::ffi::OsString> = vars
            .iter()
            .map(|(k, v)| {
                let value = match v.strip_prefix("@/") {
                    Some(rel) => root.join(rel).into_os_string(),
                    None => (*v).into(),
                };
                ((*k).to_owned(), value)
            })
            .collect();
        SearchConfig::with_env(move |name| vars.get(name).cloned())
            .filesystem_root(self.root.path())
            .scope(OpenScope::Local)
            .already_loaded(false)
            .soname_fallback(false)
    }

    /// A loader over [`FakeInstall::config`].
    ///
    /// Safe, unlike [`Cann::new`]: that search has no environment, no "already loaded" step and
    /// no bare-soname fallback, so it reaches only the install's own files, under its private
    /// temporary root, where [`FakeInstall::place`] puts only stand-in copies. Those files are
    /// trusted as a real install's are (as the process environment is, see [`Cann::new`]):
    /// writing another library, or an install-info file naming another directory, into the
    /// root is editing the install.
    pub fn cann(&self) -> Cann {
        // SAFETY: every library the search can reach is a copy of this crate's stand-in, or
        // what the install's own trusted files name (see above).
        unsafe { Cann::new(self.config()) }
    }

    fn control(&self) -> Result<&Control, StandInError> {
        self.control.as_ref().ok_or_else(|| StandInError::Refused("no library placed".into()))
    }

    /// Removes and returns the calls logged so far, in order.
    ///
    /// # Errors
    ///
    /// When nothing has been placed, or [`StandInError::LogOverflow`] when calls were lost.
    pub fn take_log(&self) -> Result<Vec<Call>, StandInError> {
        let control = self.control()?;
        // SAFETY: no arguments; reads a counter.
        let dropped = unsafe { (control.dropped)() };
        if dropped > 0 {
            return Err(StandInError::LogOverflow(dropped));
        }
        let mut out = Vec::new();
        let mut buf = vec![
            RawCall {
                func: [0; 48],
                device: 0,
                stream: 0,
                block_dim: 0,
                size: 0,
                timeout: 0,
                value: 0,
                text: [0; 128],
                ret: 0
            };
            256
        ];
        loop {
            // SAFETY: `buf` holds `buf.len()` writable entries of the C layout.
            let n = unsafe { (control.take_log)(buf.as_mut_ptr(), buf.len()) };
            out.extend(buf[..n.min(buf.len())].iter().map(Call::from));
            if n < buf.len() {
                return Ok(out);
            }
        }
    }

    /// The function names of [`FakeInstall::take_log`], for order checks.
    ///
    /// # Errors
    ///
    /// When nothing has been placed.
    pub fn take_calls(&self) -> Result<Vec<String>, StandInError> {
        Ok(self.take_log()?.into_iter().map(|c| c.func).collect())
    }

    /// Makes the `nth` call (1-based, counted since the install was made or reset; 0 = every
    /// call) of `func` return `code` without doing anything.
    ///
    /// # Errors
    ///
    /// When the fault table is full or nothing has been placed.
    pub fn fail_call(&self, func: &str, nth: u64, code: i32) -> Result<(), StandInError> {
        self.fault(func, nth, code, false)
    }

    /// As [`FakeInstall::fail_call`], and that call poisons the device: every later call
    /// returns 507899 until `aclrtResetDeviceForce`.
    ///
    /// # Errors
    ///
    /// When the fault table is full or nothing has been placed.
    pub fn poison_at(&self, func: &str, nth: u64, code: i32) -> Result<(), StandInError> {
        self.fault(func, nth, code, true)
    }

    fn fault(&self, func: &str, nth: u64, code: i32, poison: bool) -> Result<(), StandInError> {
        let control = self.control()?;
        let name = CString::new(func).map_err(|_| StandInError::Refused(func.to_owned()))?;
        // SAFETY: `name` is a valid C string for the call.
        let ret = unsafe { (control.set_fault)(name.as_ptr(), nth, code, c_int::from(poison)) };
        if ret == 0 { Ok(()) } else { Err(StandInError::Refused(func.to_owned())) }
    }

    /// Sets a knob (see the module docs).
    ///
    /// # Errors
    ///
    /// [`StandInError::Refused`] for an unknown knob.
    pub fn set_value(&self, key: &str, value: i64) -> Result<(), StandInError> {
        let control = self.control()?;
        let name = CString::new(key).map_err(|_| StandInError::Refused(key.to_owned()))?;
        // SAFETY: `name` is a valid C string for the call.
        let ret = unsafe { (control.set_value)(name.as_ptr(), value) };
        if ret == 0 { Ok(()) } else { Err(StandInError::Refused(key.to_owned())) }
    }

    /// Clears the log, knobs, faults and every stand-in object, with one exception: host
    /// mappings (`halHostRegister`) stay registered, since their holders may still read
    /// through them. Device memory is given back; storage that a live mapping covers is kept
    /// ([`ObjectKind::Retired`]) until the last mapping over it is unregistered, and any other
    /// storage is freed. So a reset while a runner still holds mappings never frees memory it
    /// may read: its later calls on its old handles fail instead.
    ///
    /// # Errors
    ///
    /// When nothing has been placed.
    pub fn reset(&self) -> Result<(), StandInError> {
        let control = self.control()?;
        // SAFETY: no arguments; the stand-in locks its state.
        unsafe { (control.reset)() };
        Ok(())
    }

    /// Live stand-in objects of a kind: device allocations or host mappings (leak checks).
    ///
    /// # Errors
    ///
    /// When nothing has been placed.
    pub fn live(&self, kind: ObjectKind) -> Result<usize, StandInError> {
        let control = self.control()?;
        // SAFETY: plain integer argument; the stand-in locks its state.
        Ok(unsafe { (control.live)(kind as c_int) })
    }

    /// Whether the install's ACL is initialised: an `aclInit` returned 0 and no `aclFinalize`
    /// (or [`FakeInstall::reset`]) came since. Every library of the install shares it, as one
    /// CANN process does.
    ///
    /// # Errors
    ///
    /// When nothing has been placed.
    pub fn acl_initialized(&self) -> Result<bool, StandInError> {
        let control = self.control()?;
        // SAFETY: no arguments; the stand-in locks its state.
        Ok(unsafe { (control.acl_initialized)() } != 0)
    }
}

/// Kinds of stand-in objects counted by [`FakeInstall::live`] (values of `standin.c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum ObjectKind {
    /// Streams.
    Streams = 1,
    /// Events.
    Events = 2,
    /// Device allocations.
    Allocations = 3,
    /// Host mappings (`halHostRegister`).
    Mappings = 4,
    /// Registered AICore binaries.
    KernelBinaries = 5,
    /// Loaded AICPU binaries.
    CpuBinaries = 6,
    /// Device memory given back (freed, reset, or released with its device by a force reset)
    /// while a live host mapping still covered it: no allocation any more, but its storage is
    /// kept, as the mapping is the identity pointer, until no live mapping covers it.
    Retired = 9,
}

/// Reads a C string returned by a stand-in or CANN function (null → `None`).
///
/// # Safety
///
/// `ptr` is null or points to a NUL-terminated string valid for the call.
pub unsafe fn c_str(ptr: *const c_char) -> Option<String> {
    // SAFETY: guaranteed by the caller.
    (!ptr.is_null()).then(|| unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned())
}
