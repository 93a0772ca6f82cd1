//! Loading C kernels from shared objects for the simulator (`KernelCode::SharedObject`).
//!
//! A thin wrapper over the platform's dynamic loader (`dlopen`/`dlsym`/`dlclose`, which glibc
//! 2.34+ and musl provide in libc), so the simulator needs no loader dependency (decision,
//! recorded in `docs/decisions/device-a2a3.md`). A loaded object stays open while the callable that uses it is
//! registered.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use crate::error::ObjectError;
use crate::kernel::KernelFn;

const RTLD_NOW: c_int = 2;
const RTLD_LOCAL: c_int = 0;

unsafe extern "C" {
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlclose(handle: *mut c_void) -> c_int;
    fn dlerror() -> *mut c_char;
}

/// The symbol every shared-object kernel exports.
pub(crate) const KERNEL_ENTRY: &str = "kernel_entry";

fn last_error() -> String {
    // SAFETY: `dlerror` returns null or a NUL-terminated string owned by the loader, valid until
    // the next loader call on this thread; it is copied out immediately.
    let p = unsafe { dlerror() };
    if p.is_null() {
        "unknown loader error".to_owned()
    } else {
        // SAFETY: non-null and NUL-terminated (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// An open shared object.
#[derive(Debug)]
pub(crate) struct SharedObject {
    handle: NonNull<c_void>,
    path: PathBuf,
}

// SAFETY: a loader handle is a process-wide token; `dlsym` and `dlclose` may be called from any
// thread, and this type only does that (closing once, in `Drop`).
unsafe impl Send for SharedObject {}
// SAFETY: as above; `&self` methods only call `dlsym`, which is thread-safe.
unsafe impl Sync for SharedObject {}

impl SharedObject {
    /// Opens `path`.
    ///
    /// # Safety
    ///
    /// Loading runs the object's initializers; they must be sound to run in this process.
    pub(crate) unsafe fn open(path: &Path) -> Result<SharedObject, ObjectError> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| ObjectError::NulInPath { path: path.to_owned() })?;
        // SAFETY: `c` is a valid NUL-terminated path; the caller vouches for the object.
        let h = unsafe { dlopen(c.as_ptr(), RTLD_NOW | RTLD_LOCAL) };
        match NonNull::new(h) {
            Some(handle) => Ok(SharedObject { handle, path: path.to_owned() }),
            None => Err(ObjectError::Open { path: path.to_owned(), loader: last_error() }),
        }
    }

    /// The address of symbol `name`, or an error naming the object and the symbol.
    pub(crate) fn symbol(&self, name: &str) -> Result<*mut c_void, ObjectError> {
        let missing = |loader: String| ObjectError::MissingSymbol {
            path: self.path.clone(),
            symbol: name.to_owned(),
            loader,
        };
        let c = CString::new(name).map_err(|_| missing("the name holds a NUL byte".into()))?;
        // SAFETY: the handle is open (closed only in `Drop`) and `c` is NUL-terminated.
        let sym = unsafe { dlsym(self.handle.as_ptr(), c.as_ptr()) };
        if sym.is_null() {
            return Err(missing(last_error()));
        }
        Ok(sym)
    }

    /// The object's `kernel_entry`.
    ///
    /// # Safety
    ///
    /// The symbol must be a function with the kernel ABI (`fn(*mut i64)`, C calling convention).
    pub(crate) unsafe fn kernel_entry(&self) -> Result<KernelFn, ObjectError> {
        let sym = self.symbol(KERNEL_ENTRY)?;
        // SAFETY: a non-null code address; the caller guarantees its signature.
        Ok(unsafe { std::mem::transmute::<*mut c_void, KernelFn>(sym) })
    }
}

impl Drop for SharedObject {
    fn drop(&mut self) {
        // SAFETY: the handle came from `dlopen` and is closed exactly once. The runner drops a
        // loaded object only when no simulated thread can be executing its code: on unregister
        // of a healthy runner (only the current run executes kernels, and its callable cannot
        // be unregistered), or in finalize after every simulated thread was joined; otherwise
        // the object is leaked.
        let rc = unsafe { dlclose(self.handle.as_ptr()) };
        if rc != 0 {
            tracing::warn!(path = %self.path.display(), error = %last_error(), "closing a kernel object failed");
        }
    }
}
