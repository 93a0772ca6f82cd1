//! Libraries opened for a real install (`OpenScope::Global`) stay loaded after the last loader
//! is dropped, since CANN's own threads may still run their code; this file is a test binary of
//! its own because it loads the stand-in `RTLD_GLOBAL`, which would let its symbols interpose
//! on other tests' copies.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

use simpler_acl_sys::standin::FakeInstall;
use simpler_acl_sys::{Candidate, Cann, Library, OpenScope};

/// Whether the library at `path` is loaded in this process (`RTLD_NOLOAD` opens nothing new).
fn loaded(path: &std::path::Path) -> bool {
    let name = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string; RTLD_NOLOAD only looks the library up, running no initialiser.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return false;
    }
    // SAFETY: `handle` came from the dlopen above, which counted one more reference.
    unsafe { libc::dlclose(handle) };
    true
}

/// The path `scope`'s loader opened a fresh install's runtime library from, after that loader
/// and the install (which keeps its copies loaded) were dropped.
fn runtime_path_after_drop(scope: OpenScope) -> std::path::PathBuf {
    let install = FakeInstall::standard().unwrap();
    // SAFETY: the search reaches only the install's copies of the stand-in.
    let cann = unsafe { Cann::new(install.config().scope(scope)) };
    let path = match cann.open(Library::Runtime) {
        Ok(Candidate::Path(path)) => path.clone(),
        other => panic!("the runtime library was not found as a path: {other:?}"),
    };
    drop(cann);
    drop(install);
    path
}

#[test]
fn a_real_install_is_never_unloaded_and_a_local_copy_is() {
    let path = runtime_path_after_drop(OpenScope::Local);
    assert!(!loaded(&path), "a local copy stayed loaded: the check below would prove nothing");
    let path = runtime_path_after_drop(OpenScope::Global);
    assert!(loaded(&path), "unloaded under threads CANN may still run");
}
