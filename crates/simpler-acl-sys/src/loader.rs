//! Finding and opening the CANN libraries, and resolving symbols one by one on first use.
//!
//! A [`Cann`] is an owned value: it opens nothing when built, opens each library on the first
//! use of any of its functions and resolves each function on its first call. Where it looks is
//! decided by a [`SearchConfig`], whose environment is injectable so that tests can lay out
//! fake installs side by side in one process. Loading through a search other than the process
//! environment's is `unsafe` ([`Cann::new`]): the search chooses the code that runs.
//!
//! # Slot protocol
//!
//! Every library and every function has one slot (`OnceLock<Result<…, LoadError>>`):
//!
//! 1. A slot starts empty. The first thread to need it runs the search (or `dlsym`); threads
//!    arriving meanwhile wait for that one outcome instead of searching again.
//! 2. The outcome (the opened library or the function pointer, or the error) is stored once
//!    and never changes: a failure is returned again without a second search, so a missing
//!    optional symbol costs one `dlsym`.
//! 3. A function slot is filled only after its library slot holds an opened library, and both
//!    live in the same `Cann`, so a resolved pointer never outlives its library.
//! 4. Later calls read the slot with one acquire load and call through the pointer.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use libloading::os::unix::{Library as RawLibrary, RTLD_GLOBAL, RTLD_LOCAL, RTLD_NOW};

use crate::error::{AclError, Attempt, Error, LoadError};
use crate::generated::slots::{FUNCTIONS, Slots};

/// A lazily resolved function pointer: empty until the first call, then the symbol or the
/// error that resolving it gave.
pub(crate) type Slot<F> = OnceLock<Result<F, LoadError>>;

/// The CANN libraries simpler binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Library {
    /// `libascendcl.so`: ACL, the application-facing runtime API.
    Acl,
    /// `libruntime.so`: RTS, the lower-level runtime (streams, kernels, device memory).
    Runtime,
    /// `libascend_hal.so`: the driver's host library (mappings, device information).
    Hal,
    /// `libunified_dlog.so` or `libascendalog.so`: the device log controls.
    Dlog,
    /// `libhcomm.so` (CANN 9) or `libhccl.so`: collective communication.
    Hccl,
}

impl Library {
    /// Every library, in declaration order.
    pub const ALL: [Library; 5] =
        [Library::Acl, Library::Runtime, Library::Hal, Library::Dlog, Library::Hccl];

    /// The file names this library may have, most preferred first.
    pub fn sonames(self) -> &'static [&'static str] {
        match self {
            Library::Acl => &["libascendcl.so"],
            Library::Runtime => &["libruntime.so"],
            Library::Hal => &["libascend_hal.so"],
            Library::Dlog => &["libunified_dlog.so", "libascendalog.so"],
            Library::Hccl => &["libhcomm.so", "libhccl.so"],
        }
    }

    /// The first file name, used to name the library in messages.
    pub fn name(self) -> &'static str {
        self.sonames()[0]
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One entry of the generated function table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionInfo {
    /// The C name.
    pub name: &'static str,
    /// The library that exports it.
    pub library: Library,
    /// Whether L2 compute needs it ([`Cann::probe`] resolves these up front).
    pub required: bool,
}

/// How a found library is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenScope {
    /// `RTLD_NOW | RTLD_GLOBAL`, as a program linked against CANN would have it: for real
    /// installs, whose libraries find each other's symbols. With `RTLD_NODELETE` too: CANN
    /// starts threads of its own, which may still run its code after the last loader is
    /// dropped, so its libraries are never unloaded.
    Global,
    /// `RTLD_NOW | RTLD_LOCAL`: several copies of a library (stand-in installs in tests) can be
    /// loaded side by side without one's symbols shadowing another's.
    Local,
}

/// One place the loader tries for a library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Candidate {
    /// A library of this name already loaded in the process (`RTLD_NOLOAD`).
    Loaded(&'static str),
    /// A file.
    Path(PathBuf),
    /// The bare file name, found by the dynamic linker (`LD_LIBRARY_PATH`, the cache).
    Soname(&'static str),
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Candidate::Loaded(name) => write!(f, "{name} (already loaded)"),
            Candidate::Path(path) => write!(f, "{}", path.display()),
            Candidate::Soname(name) => write!(f, "{name} (dynamic linker search path)"),
        }
    }
}

type EnvLookup = dyn Fn(&str) -> Option<OsString> + Send + Sync;

/// Where [`Cann`] looks for the CANN libraries.
///
/// Per library, in order (the first that opens wins):
///
/// 1. a library of that name already loaded in the process;
/// 2. `$SIMPLER_ASCEND_LIB_DIR`;
/// 3. `$ASCEND_HOME_PATH/{lib64, <arch>-linux/lib64, runtime/lib64}`;
/// 4. the same under `$ASCEND_TOOLKIT_HOME`;
/// 5. the same under the `Install_Path` of `/etc/Ascend/ascend_cann_install.info`, then of
///    `$HOME/Ascend/ascend_cann_install.info`;
/// 6. the same under `/usr/local/Ascend/cann` and `/usr/local/Ascend/ascend-toolkit/latest`;
/// 7. for the driver library also `/usr/local/Ascend/driver/lib64/driver` and `…/lib64`;
/// 8. the bare file name, for the dynamic linker's own search (`LD_LIBRARY_PATH`).
///
/// The environment is read through a lookup function and every absolute system path is taken
/// relative to a file-system root, so a test can point the whole search at a temporary
/// directory without touching the process environment.
///
/// # Trust
///
/// A search decides which code the process loads and calls as CANN's. Building one is safe;
/// loading through one is not, except for the search of the process environment:
/// [`Cann::from_process_env`] (and [`Cann::global`]) trust the process environment, the
/// install-info files and the standard install directories as the dynamic linker trusts
/// `LD_LIBRARY_PATH`, while a loader over any other search is built with the `unsafe`
/// [`Cann::new`], whose caller vouches that every library the search can reach is a CANN
/// runtime of the pinned ABI or this crate's stand-in.
#[derive(Clone)]
pub struct SearchConfig {
    env: Arc<EnvLookup>,
    root: PathBuf,
    arch: String,
    scope: OpenScope,
    already_loaded: bool,
    soname: bool,
}

impl fmt::Debug for SearchConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SearchConfig")
            .field("root", &self.root)
            .field("arch", &self.arch)
            .field("scope", &self.scope)
            .field("already_loaded", &self.already_loaded)
            .field("soname", &self.soname)
            .finish_non_exhaustive()
    }
}

impl SearchConfig {
    /// The search of a real install: the process environment, the real file system, libraries
    /// opened `RTLD_GLOBAL`, every step enabled.
    pub fn from_process_env() -> Self {
        Self::with_env(|name| std::env::var_os(name))
    }

    /// The full search with an injected environment lookup (everything else as
    /// [`SearchConfig::from_process_env`]).
    pub fn with_env(lookup: impl Fn(&str) -> Option<OsString> + Send + Sync + 'static) -> Self {
        SearchConfig {
            env: Arc::new(lookup),
            root: PathBuf::from("/"),
            arch: std::env::consts::ARCH.to_owned(),
            scope: OpenScope::Global,
            already_loaded: true,
            soname: true,
        }
    }

    /// Takes `/etc/Ascend/…` and `/usr/local/Ascend/…` relative to `root` instead of `/`.
    pub fn filesystem_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = root.into();
        self
    }

    /// Sets how found libraries are opened.
    pub fn scope(mut self, scope: OpenScope) -> Self {
        self.scope = scope;
        self
    }

    /// Enables or disables step 1 (a library already loaded in the process).
    pub fn already_loaded(mut self, enabled: bool) -> Self {
        self.already_loaded = enabled;
        self
    }

    /// Enables or disables the last step (the bare file name).
    pub fn soname_fallback(mut self, enabled: bool) -> Self {
        self.soname = enabled;
        self
    }

    /// Every place tried for `library`, in order.
    pub fn candidates(&self, library: Library) -> Vec<Candidate> {
        let names = library.sonames();
        let mut out = Vec::new();
        if self.already_loaded {
            out.extend(names.iter().map(|n| Candidate::Loaded(n)));
        }
        let mut dirs: Vec<PathBuf> = Vec::new();
        if let Some(dir) = self.var("SIMPLER_ASCEND_LIB_DIR") {
            dirs.push(dir.into());
        }
        let mut roots: Vec<PathBuf> = Vec::new();
        roots.extend(self.var("ASCEND_HOME_PATH").map(PathBuf::from));
        roots.extend(self.var("ASCEND_TOOLKIT_HOME").map(PathBuf::from));
        let mut info_files = vec![self.system("etc/Ascend/ascend_cann_install.info")];
        if let Some(home) = self.var("HOME") {
            info_files.push(PathBuf::from(home).join("Ascend/ascend_cann_install.info"));
        }
        roots.extend(info_files.iter().filter_map(|f| install_path(f)));
        roots.push(self.system("usr/local/Ascend/cann"));
        roots.push(self.system("usr/local/Ascend/ascend-toolkit/latest"));
        let arch_lib = format!("{}-linux/lib64", self.arch);
        for root in roots {
            dirs.push(root.join("lib64"));
            dirs.push(root.join(&arch_lib));
            dirs.push(root.join("runtime/lib64"));
        }
        if library == Library::Hal {
            dirs.push(self.system("usr/local/Ascend/driver/lib64/driver"));
            dirs.push(self.system("usr/local/Ascend/driver/lib64"));
        }
        for dir in dirs {
            out.extend(names.iter().map(|n| Candidate::Path(dir.join(n))));
        }
        if self.soname {
            out.extend(names.iter().map(|n| Candidate::Soname(n)));
        }
        out
    }

    fn var(&self, name: &str) -> Option<OsString> {
        (self.env)(name).filter(|v| !v.is_empty())
    }

    fn system(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    fn open(&self, library: Library) -> Result<Opened, LoadError> {
        let flags = match self.scope {
            OpenScope::Global => RTLD_NOW | RTLD_GLOBAL | libc::RTLD_NODELETE,
            OpenScope::Local => RTLD_NOW | RTLD_LOCAL,
        };
        let mut tried = Vec::new();
        for candidate in self.candidates(library) {
            let result = match &candidate {
                Candidate::Loaded(name) => open_raw(OsStr::new(name), flags | libc::RTLD_NOLOAD),
                // A path that does not exist is reported as such, without asking dlopen.
                Candidate::Path(path) if !path.exists() => {
                    tried.push(Attempt { candidate, error: "no such file".to_owned() });
                    continue;
                }
                Candidate::Path(path) => open_raw(path.as_os_str(), flags),
                Candidate::Soname(name) => open_raw(OsStr::new(name), flags),
            };
            match result {
                Ok(raw) => return Ok(Opened { raw, from: candidate }),
                Err(error) => tried.push(Attempt { candidate, error }),
            }
        }
        Err(LoadError::Library { library, tried })
    }
}

/// Reads `Install_Path=<dir>` from a CANN install-info file.
fn install_path(file: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        let value = value.trim();
        (key.trim().eq_ignore_ascii_case("install_path") && !value.is_empty())
            .then(|| PathBuf::from(value))
    })
}

fn open_raw(name: &OsStr, flags: libc::c_int) -> Result<RawLibrary, String> {
    // Checked before dlopen so that an interior NUL is an error, not a truncated name.
    if CString::new(name.as_bytes()).is_err() {
        return Err("the name contains a NUL byte".to_owned());
    }
    // SAFETY: opening a shared object runs its initialisers. Every candidate of a loader's
    // search is a CANN library (or the project's stand-in): `Cann::new`'s callers vouch for
    // their searches, and the process environment is trusted. Their initialisers have no
    // preconditions on the caller.
    unsafe { RawLibrary::open(Some(name), flags) }.map_err(|e| dlerror_text(&e))
}

fn dlerror_text(error: &libloading::Error) -> String {
    match error {
        libloading::Error::DlOpen { desc } | libloading::Error::DlSym { desc } => {
            format!("{desc:?}").trim_matches('"').to_owned()
        }
        other => other.to_string(),
    }
}

struct Opened {
    raw: RawLibrary,
    from: Candidate,
}

// The onboard backend shares one loader between threads (`Arc<Cann>`).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Cann>();
};

/// The CANN libraries of one process (or one test), opened and resolved lazily.
///
/// Every CANN function of `symbols.toml` is a method of the same name with the exact C
/// signature that returns `Result<R, LoadError>`: the library is opened and the symbol
/// resolved on the first call, and a missing one is a [`LoadError`], never a panic.
pub struct Cann {
    config: SearchConfig,
    libraries: [OnceLock<Result<Opened, LoadError>>; Library::ALL.len()],
    pub(crate) slots: Slots,
}

impl fmt::Debug for Cann {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opened: Vec<_> = Library::ALL
            .iter()
            .filter_map(|l| self.library_source(*l).map(|c| (l.name(), c.to_string())))
            .collect();
        f.debug_struct("Cann").field("config", &self.config).field("opened", &opened).finish()
    }
}

/// `Ok` when `missing` is empty, else [`LoadError::Incomplete`] listing each failure once (a
/// library that cannot be opened fails every one of its symbols the same way).
fn all_resolved(missing: impl IntoIterator<Item = LoadError>) -> Result<(), LoadError> {
    let mut unique: Vec<LoadError> = Vec::new();
    for error in missing {
        if !unique.contains(&error) {
            unique.push(error);
        }
    }
    if unique.is_empty() { Ok(()) } else { Err(LoadError::Incomplete { missing: unique }) }
}

/// What [`Cann::probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Probe {
    /// Each library that the required functions come from, with where it was found.
    pub libraries: Vec<(Library, Candidate)>,
    /// The version `aclrtGetVersion` reports, when the library exports it.
    pub version: Option<CannVersion>,
}

/// A version as `aclrtGetVersion` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CannVersion {
    /// Major version.
    pub major: i32,
    /// Minor version.
    pub minor: i32,
    /// Patch version.
    pub patch: i32,
}

impl fmt::Display for CannVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The CANN release whose declarations and struct layouts the project header pins.
pub const PINNED_CANN_RELEASE: &str = "8.2.RC1";

/// The major version the pinned release reports; other majors change struct layouts.
pub const SUPPORTED_MAJOR_VERSION: i32 = 8;

impl Probe {
    /// Whether the reported version has the pinned release's major version (an unknown version
    /// is accepted: old libraries do not report one).
    pub fn version_supported(&self) -> bool {
        self.version.is_none_or(|v| v.major == SUPPORTED_MAJOR_VERSION)
    }
}

impl Cann {
    /// A loader that searches as `config` says. Nothing is opened yet.
    ///
    /// The loader later opens whatever library the search finds, which runs that library's
    /// initialisers, and calls its symbols as the C functions of the project header: the
    /// choice of library decides whether safe methods such as [`Cann::version`] or
    /// [`Cann::recent_error_message`] are sound. [`Cann::from_process_env`] is the safe
    /// constructor for the search of a real install.
    ///
    /// # Safety
    ///
    /// Every library this search can reach (each [candidate](SearchConfig::candidates), and
    /// whatever the dynamic linker finds for the bare file names when that step is enabled) is
    /// a CANN runtime of the pinned ABI ([`PINNED_CANN_RELEASE`]), or this crate's stand-in,
    /// and stays so while the loader lives.
    pub unsafe fn new(config: SearchConfig) -> Self {
        Cann { config, libraries: Default::default(), slots: Slots::default() }
    }

    /// A loader over [`SearchConfig::from_process_env`]: the search of a real install. Nothing
    /// is opened yet.
    ///
    /// This is safe because the process environment (`SIMPLER_ASCEND_LIB_DIR`,
    /// `ASCEND_HOME_PATH`, `ASCEND_TOOLKIT_HOME`, `HOME`, `LD_LIBRARY_PATH`), the CANN
    /// install-info files and the standard install directories are trusted as the dynamic
    /// linker trusts `LD_LIBRARY_PATH`: whoever sets them up chooses the code the process runs,
    /// and they are expected to name a CANN of the pinned ABI.
    pub fn from_process_env() -> Self {
        // SAFETY: the search of the process environment reaches the libraries the process's
        // environment and install name, which are trusted to be CANN's (see above).
        unsafe { Cann::new(SearchConfig::from_process_env()) }
    }

    /// The process-wide loader over the process environment, for tools (xtask, diagnostics).
    /// Libraries and runners hold their own [`Cann`] instead.
    pub fn global() -> &'static Cann {
        static GLOBAL: OnceLock<Cann> = OnceLock::new();
        GLOBAL.get_or_init(Cann::from_process_env)
    }

    /// The search this loader uses.
    pub fn config(&self) -> &SearchConfig {
        &self.config
    }

    /// Where `library` was opened from, if it has been opened.
    pub fn library_source(&self, library: Library) -> Option<&Candidate> {
        match self.libraries[library.index()].get() {
            Some(Ok(opened)) => Some(&opened.from),
            _ => None,
        }
    }

    /// Opens `library` now (it is otherwise opened on first use).
    ///
    /// # Errors
    ///
    /// [`LoadError::Library`] listing every place tried, each with its `dlerror`.
    pub fn open(&self, library: Library) -> Result<&Candidate, LoadError> {
        self.library(library).map(|opened| &opened.from)
    }

    fn library(&self, library: Library) -> Result<&Opened, LoadError> {
        self.libraries[library.index()]
            .get_or_init(|| self.config.open(library))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Resolves every required function at once.
    ///
    /// # Errors
    ///
    /// [`LoadError::Incomplete`] with one entry per missing library or symbol.
    pub fn probe(&self) -> Result<Probe, LoadError> {
        let required = FUNCTIONS.iter().filter(|f| f.required);
        all_resolved(required.filter_map(|f| self.slots.resolve_named(self, f.name)?.err()))?;
        let mut libraries = Vec::new();
        for library in Library::ALL {
            if FUNCTIONS.iter().any(|f| f.required && f.library == library) {
                libraries.push((library, self.library(library)?.from.clone()));
            }
        }
        Ok(Probe { libraries, version: self.version() })
    }

    /// Resolves the functions `names` now, opening their libraries: for optional functions a
    /// feature cannot do without, so that a missing one refuses the feature at its start instead
    /// of failing its first call.
    ///
    /// # Errors
    ///
    /// [`LoadError::Incomplete`] with one entry per missing library (once), missing symbol, or
    /// name this crate does not bind ([`LoadError::Unlisted`]).
    pub fn require(&self, names: &[&str]) -> Result<(), LoadError> {
        all_resolved(names.iter().filter_map(|name| {
            let resolved = self.slots.resolve_named(self, name);
            resolved
                .unwrap_or_else(|| Err(LoadError::Unlisted { symbol: (*name).to_owned() }))
                .err()
        }))
    }

    /// The version `aclrtGetVersion` reports, or `None` when it is not exported or fails.
    pub fn version(&self) -> Option<CannVersion> {
        let (mut major, mut minor, mut patch) = (0, 0, 0);
        // SAFETY: the three out-pointers are valid, writable `i32`s for the call.
        let code = unsafe { self.aclrtGetVersion(&mut major, &mut minor, &mut patch) }.ok()?;
        (code == 0).then_some(CannVersion { major, minor, patch })
    }

    /// The SoC name `aclrtGetSocName` reports (`Ascend910B1`, …), read within an
    /// [ACL session](Cann::acl_session): ACL is initialised for the call unless it is already,
    /// and finalized after it unless another session or hold still lives or ACL was
    /// initialised outside the project. No device is opened. `Ok(None)` when CANN answers no name.
    ///
    /// # Errors
    ///
    /// [`Error::Load`] when a library or symbol is missing, [`Error::Acl`] when `aclInit`
    /// fails. An `aclFinalize` that fails as the session ends is logged, not returned: the
    /// name was read, and ACL's session ends all the same.
    pub fn soc_name(&self) -> Result<Option<String>, Error> {
        let session = self.acl_session()?;
        // SAFETY: no arguments; the answer is null or a NUL-terminated string CANN keeps alive.
        let name = unsafe { self.aclrtGetSocName() }.map(|p| {
            // SAFETY: as above; copied before anything else is called.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        });
        drop(session);
        Ok(name?)
    }

    /// Turns the return code of an ACL or RTS call into a result, capturing CANN's recent error
    /// message (thread-local in CANN, so this must run on the failing thread, right after it).
    ///
    /// # Errors
    ///
    /// [`AclError`] for any non-zero `code`.
    pub fn check(&self, func: &'static str, code: i32) -> Result<(), AclError> {
        if code == 0 { Ok(()) } else { Err(self.error(func, code)) }
    }

    /// The [`AclError`] of `func` failing with `code`, with CANN's recent message if any.
    #[cold]
    pub fn error(&self, func: &'static str, code: i32) -> AclError {
        AclError::new(func, code, self.recent_error_message())
    }

    /// `aclGetRecentErrMsg`, when the library exports it and has a message.
    pub fn recent_error_message(&self) -> Option<String> {
        // SAFETY: no arguments; the function returns null or a NUL-terminated string owned by
        // CANN that stays valid until the next ACL call on this thread, and is copied at once.
        let message = unsafe { self.aclGetRecentErrMsg() }.ok()?;
        if message.is_null() {
            return None;
        }
        // SAFETY: non-null and NUL-terminated, as above.
        let text = unsafe { std::ffi::CStr::from_ptr(message) }.to_string_lossy().into_owned();
        (!text.is_empty()).then_some(text)
    }

    /// Resolves one function: opens its library if needed and looks the symbol up once.
    pub(crate) fn resolve<F: Copy>(
        &self,
        slot: &Slot<F>,
        library: Library,
        name: &'static str,
    ) -> Result<F, LoadError> {
        slot.get_or_init(|| {
            let opened = self.library(library)?;
            // SAFETY: `F` is the generated function-pointer type of `name`, written from the
            // CANN declaration of that symbol, and the library is a CANN runtime of the pinned
            // ABI (the contract of `Cann::new`), so reading the symbol as `F` is sound; the
            // pointer is only used while `self` (which owns the library) lives.
            unsafe { opened.raw.get::<F>(name.as_bytes()) }.map(|symbol| *symbol).map_err(|e| {
                LoadError::Symbol {
                    library,
                    symbol: name,
                    from: opened.from.to_string(),
                    error: dlerror_text(&e),
                }
            })
        })
        .clone()
    }
}
