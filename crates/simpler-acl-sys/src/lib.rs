//! Raw FFI to the CANN runtime libraries of Ascend NPUs, loaded at run time symbol by symbol.
//!
//! **Layer.** The bottom of simpler's hardware path: the onboard backend of
//! `simpler-device-a2a3` builds its safe owners (runtime, streams, buffers, mappings, events)
//! on this crate. It depends on nothing of simpler.
//!
//! **What it must not do.** No safe wrappers, no policy, no retries, no process-global state
//! (except [`Cann::global`], for tools, and the table of [ACL sessions](session), because
//! CANN's ACL initialisation is itself process-wide), no linking against CANN at build time, no
//! build-time detection. A normal build needs neither CANN nor libclang nor a C compiler.
//!
//! # What is here
//!
//! - [`types`]: the CANN typedefs, structs and constants (generated). C enums are integer
//!   typedefs plus constants, never Rust enums, so an unknown value coming back from C is just
//!   a number.
//! - [`Cann`]: the loader. Each of the ~50 functions listed in `symbols.toml` is a method with
//!   the exact C signature, e.g. `unsafe fn aclrtSetDevice(&self, deviceId: i32) ->
//!   Result<aclError, LoadError>`: the first call opens the library and resolves the symbol,
//!   later calls go straight through the kept pointer. A missing library or symbol is a
//!   [`LoadError`], never a panic; [`Cann::probe`] resolves every required function at once
//!   and reports all that are missing. HCCL functions need the `hccl` feature.
//! - [`AclError`]: a failed call's function, code, CANN name, meaning and CANN's recent error
//!   message ([`Cann::check`]).
//! - [`AclSession`]: a lease on ACL being initialised ([`Cann::acl_session`]), shared by every
//!   caller of the process, so that no caller finalizes ACL while another still uses it;
//!   [`AclHold`] ([`Cann::acl_hold`]) keeps ACL from being finalized without initialising it.
//! - `standin` (feature `standin`, for tests): the project's stand-in CANN library, compiled
//!   with `cc` at test time and laid out as fake installs.
//!
//! # Pointing it at CANN
//!
//! The header pins CANN **8.2.RC1** ([`PINNED_CANN_RELEASE`]). With CANN installed in the usual
//! places (`/usr/local/Ascend/cann` or `/usr/local/Ascend/ascend-toolkit/latest`, or sourced
//! `set_env.sh`, which sets `ASCEND_HOME_PATH`) nothing needs configuring. Otherwise set
//! `SIMPLER_ASCEND_LIB_DIR` to the directory holding `libascendcl.so` and `libruntime.so`, or
//! `ASCEND_HOME_PATH` to the CANN root. The full search order is documented on
//! [`SearchConfig`].
//!
//! The process environment, the CANN install-info files and the install directories are trusted
//! as the dynamic linker trusts `LD_LIBRARY_PATH`, so [`Cann::from_process_env`] and
//! [`Cann::global`] are safe. Any other search picks the code the loader runs and calls with the
//! header's signatures, so a loader over it is built with the `unsafe` [`Cann::new`]:
//!
//! ```compile_fail,E0133
//! use simpler_acl_sys::{Cann, SearchConfig};
//!
//! let config = SearchConfig::with_env(|_| Some("/some/dir".into()));
//! let cann = Cann::new(config); // error: a call to an unsafe function
//! ```
//!
//! When CANN is missing nothing fails until a function is first used: that call (or
//! [`Cann::probe`]) returns [`LoadError::Library`], which lists every path tried with its
//! `dlerror`:
//!
//! ```
//! use simpler_acl_sys::{Cann, Library, LoadError, SearchConfig};
//!
//! // A search with no environment, an empty file-system root and no fallbacks finds nothing.
//! let empty = std::env::temp_dir().join("simpler-acl-sys-doc-no-cann");
//! let config = SearchConfig::with_env(|_| None)
//!     .filesystem_root(&empty)
//!     .already_loaded(false)
//!     .soname_fallback(false);
//! // SAFETY: the search reaches no library at all (an empty root, no environment, no
//! // fallbacks), so nothing but CANN can be loaded through it.
//! let cann = unsafe { Cann::new(config) };
//! match cann.open(Library::Acl) {
//!     Err(LoadError::Library { library: Library::Acl, tried }) => assert!(!tried.is_empty()),
//!     other => panic!("found CANN in an empty root: {other:?}"),
//! }
//! ```
//!
//! # Generated code
//!
//! `symbols.toml` is the one list; `include/simpler_cann.h` is the project's own excerpt of the
//! CANN declarations; `src/generated/` is produced from both by `cargo xtask bindgen` (which
//! needs libclang: `apt-get install libclang-dev`) and checked by `cargo xtask bindgen
//! --check`. Never edit `src/generated/` by hand.
//!
//! # Unsafe inventory
//!
//! Every file containing `unsafe`:
//!
//! - `src/generated/acl.rs`, `rt.rs`, `hal.rs`, `dlog.rs`, `hccl.rs`: one `unsafe fn` per C
//!   function, each calling through its resolved pointer.
//! - `src/generated/slots.rs`: the `unsafe extern "C" fn` pointer types.
//! - `src/generated/types.rs`: bindgen's zero-filling `Default` impls of C structs (all-zero
//!   is a valid value of each).
//! - `src/loader.rs`: `dlopen` of a candidate, `dlsym` of a symbol as its generated type,
//!   and the calls behind [`Cann::version`] and [`Cann::recent_error_message`]; the `unsafe`
//!   [`Cann::new`], whose caller vouches that its search reaches only CANN (or the stand-in),
//!   while [`Cann::from_process_env`] trusts the process environment as `LD_LIBRARY_PATH` is.
//! - `src/session.rs`: the table of sessions and holds per ACL library, the `aclInit` of a
//!   session that finds ACL not known initialised and the `aclFinalize` of the last session
//!   or hold.
//! - `src/standin.rs` (feature `standin`): opening stand-in copies and calling their control
//!   functions.
//! - `tests/standin.rs` and `benches/lazy_call.rs`: calls through the bindings (and, in the
//!   bench, through a hand-resolved pointer) into the stand-in library.

pub mod error;
mod generated;
pub mod loader;
pub mod session;
#[cfg(feature = "standin")]
pub mod standin;

pub use error::{AclError, Attempt, ERROR_NAMES, Error, LoadError, error_name};
pub use generated::slots::FUNCTIONS;
pub use generated::types;
pub use loader::{
    Candidate, Cann, CannVersion, FunctionInfo, Library, OpenScope, PINNED_CANN_RELEASE, Probe,
    SUPPORTED_MAJOR_VERSION, SearchConfig,
};
pub use session::{AclHold, AclLibrary, AclSession};
