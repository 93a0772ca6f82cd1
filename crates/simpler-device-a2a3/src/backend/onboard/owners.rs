//! Safe owners of CANN objects: each releases its object when it drops, never synchronises,
//! and records a failed release in the device context, where the next fallible call of the
//! backend returns it (`docs/device-onboard.md`, "Ownership").

use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use simpler_acl_sys::types::{
    DEV_SVM_MAP_HOST, RT_MEMORY_HBM, aclrtEvent, rtBinHandle, rtFuncHandle, rtStream_t,
};
use simpler_acl_sys::{AclError, Cann, Error as CannError, LoadError};

/// What every owner of one device shares: the loader, the device id and the failures
/// recorded where they could not be returned (`Drop`).
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) cann: Arc<Cann>,
    pub(crate) device: i32,
    /// Release failures recorded in `Drop`, oldest first. Written by any owner's `Drop`, read
    /// by the backend's next fallible call; a leaf lock.
    deferred: Mutex<VecDeque<CannError>>,
    /// A launch, sync, setup wait or recovery drain failed: finalize force-resets. Relaxed:
    /// written and read on the runner's thread, or before the runner exists.
    poisoned: AtomicBool,
    /// Finalize could not bind the thread (a release would run in whatever context the thread
    /// has), or a force reset gave the device's handles back: owners dropped from then on
    /// release nothing and leave their handles to the device's reset. Relaxed: set and read on
    /// the thread that drops them.
    left_to_reset: AtomicBool,
}

impl Ctx {
    pub(crate) fn new(cann: Arc<Cann>, device: i32) -> Arc<Ctx> {
        Arc::new(Ctx {
            cann,
            device,
            deferred: Mutex::new(VecDeque::new()),
            poisoned: false.into(),
            left_to_reset: false.into(),
        })
    }

    /// Remembers that finalize must force-reset.
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::Relaxed);
    }

    /// Whether finalize must force-reset.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Relaxed)
    }

    /// The result of calling `func`: its load failure, or its return code as an `AclError`
    /// with CANN's recent message.
    pub(crate) fn check(
        &self,
        func: &'static str,
        ret: Result<i32, LoadError>,
    ) -> Result<(), CannError> {
        let code = ret?;
        self.cann.check(func, code).map_err(CannError::from)
    }

    /// Records a release failure for the next fallible call.
    #[cold]
    pub(crate) fn record(&self, e: CannError) {
        tracing::warn!(device = self.device, error = %e, "CANN release failed; reported by the next call");
        self.deferred.lock().push_back(e);
    }

    /// The oldest recorded failure, if any (the rest stay for the following calls).
    pub(crate) fn take_deferred(&self) -> Option<CannError> {
        self.deferred.lock().pop_front()
    }

    /// Leaves every handle released after this to the device's reset.
    pub(crate) fn leave_to_reset(&self) {
        self.left_to_reset.store(true, Ordering::Relaxed);
    }

    /// Calls `func` through `call` to release a handle, unless handles are left to the reset;
    /// whether the handle was released (a failure is recorded).
    pub(crate) fn release(
        &self,
        func: &'static str,
        call: impl FnOnce() -> Result<i32, LoadError>,
    ) -> bool {
        if self.left_to_reset.load(Ordering::Relaxed) {
            return false;
        }
        match self.check(func, call()) {
            Ok(()) => true,
            Err(e) => {
                self.record(e);
                false
            }
        }
    }
}

/// A stream (`rtStreamCreate` / `rtStreamDestroy`). Dropping it destroys the stream without
/// synchronising: a stream in its error state would wedge a sync.
#[derive(Debug)]
pub(crate) struct Stream {
    ctx: Arc<Ctx>,
    raw: rtStream_t,
}

// SAFETY: a CANN stream handle is an opaque token the runtime accepts from any thread bound
// to the device; the owner only passes it to CANN calls.
unsafe impl Send for Stream {}
// SAFETY: as above; `&Stream` only hands out the token.
unsafe impl Sync for Stream {}

impl Stream {
    pub(crate) fn create(ctx: &Arc<Ctx>) -> Result<Stream, CannError> {
        let mut raw: rtStream_t = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer for the call; priority 0 as the original.
        ctx.check("rtStreamCreate", unsafe { ctx.cann.rtStreamCreate(&mut raw, 0) })?;
        Ok(Stream { ctx: Arc::clone(ctx), raw })
    }

    pub(crate) fn raw(&self) -> rtStream_t {
        self.raw
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: `raw` is a live stream this owner created; it is destroyed once.
        self.ctx.release("rtStreamDestroy", || unsafe { self.ctx.cann.rtStreamDestroy(self.raw) });
    }
}

/// Device memory (`rtMalloc` in HBM / `rtFree`).
#[derive(Debug)]
pub(crate) struct DeviceBuffer {
    ctx: Arc<Ctx>,
    addr: *mut c_void,
    len: u64,
}

// SAFETY: the pointer is a device address the host never dereferences; it is only passed to
// CANN calls, which accept it from any bound thread.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as above.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    pub(crate) fn alloc(ctx: &Arc<Ctx>, len: u64) -> Result<DeviceBuffer, CannError> {
        let mut addr: *mut c_void = ptr::null_mut();
        // SAFETY: `addr` is a valid out-pointer; HBM, module 0 as the original.
        let ret = unsafe { ctx.cann.rtMalloc(&mut addr, len, RT_MEMORY_HBM, 0) };
        ctx.check("rtMalloc", ret)?;
        Ok(DeviceBuffer { ctx: Arc::clone(ctx), addr, len })
    }

    /// A buffer holding a copy of `bytes`.
    pub(crate) fn upload(ctx: &Arc<Ctx>, bytes: &[u8]) -> Result<DeviceBuffer, CannError> {
        let b = DeviceBuffer::alloc(ctx, bytes.len().max(1) as u64)?;
        b.write(0, bytes)?;
        Ok(b)
    }

    pub(crate) fn addr(&self) -> u64 {
        self.addr as u64
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// `rtMemcpy` host → device at `offset` (the caller checked the range).
    pub(crate) fn write(&self, offset: u64, src: &[u8]) -> Result<(), CannError> {
        let dst = (self.addr() + offset) as *mut c_void;
        let n = src.len() as u64;
        // SAFETY: `src` is readable for `n` bytes; `dst..dst + n` lies in this allocation
        // (checked by the caller), which CANN writes.
        let ret = unsafe { self.ctx.cann.rtMemcpy(dst, n, src.as_ptr().cast(), n, 1) };
        self.ctx.check("rtMemcpy", ret)
    }

    /// `rtMemcpy` device → host from `offset` (the caller checked the range).
    pub(crate) fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), CannError> {
        let src = (self.addr() + offset) as *const c_void;
        let n = dst.len() as u64;
        // SAFETY: `dst` is writable for `n` bytes; the source range lies in this allocation.
        let ret = unsafe { self.ctx.cann.rtMemcpy(dst.as_mut_ptr().cast(), n, src, n, 2) };
        self.ctx.check("rtMemcpy", ret)
    }

    /// `aclrtMemset` of `len` bytes at `offset` (the caller checked the range).
    pub(crate) fn fill(&self, offset: u64, value: u8, len: u64) -> Result<(), CannError> {
        let dst = (self.addr() + offset) as *mut c_void;
        let n = len as usize;
        // SAFETY: the range lies in this allocation; CANN writes it.
        let ret = unsafe { self.ctx.cann.aclrtMemset(dst, n, i32::from(value), n) };
        self.ctx.check("aclrtMemset", ret)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: `addr` is a live allocation of this owner; it is freed once.
        self.ctx.release("rtFree", || unsafe { self.ctx.cann.rtFree(self.addr) });
    }
}

/// A host mapping of a device range (`halHostRegister(DEV_SVM_MAP_HOST)` /
/// `halHostUnregister`). Drop it before the buffer it maps.
#[derive(Debug)]
pub(crate) struct HostMapping {
    ctx: Arc<Ctx>,
    dev: *mut c_void,
    host: *mut u8,
}

// SAFETY: the mapping is process memory reachable from any thread; the owner only hands out
// its address and unregisters it once.
unsafe impl Send for HostMapping {}
// SAFETY: as above.
unsafe impl Sync for HostMapping {}

impl HostMapping {
    pub(crate) fn map(ctx: &Arc<Ctx>, buffer: &DeviceBuffer) -> Result<HostMapping, CannError> {
        let mut host: *mut c_void = ptr::null_mut();
        // SAFETY: the range is one live allocation; `host` is a valid out-pointer.
        let ret = unsafe {
            ctx.cann.halHostRegister(
                buffer.addr,
                buffer.len as usize,
                DEV_SVM_MAP_HOST,
                ctx.device,
                &mut host,
            )
        };
        ctx.check("halHostRegister", ret)?;
        Ok(HostMapping { ctx: Arc::clone(ctx), dev: buffer.addr, host: host.cast() })
    }

    pub(crate) fn host(&self) -> *mut u8 {
        self.host
    }
}

impl Drop for HostMapping {
    fn drop(&mut self) {
        let (cann, device) = (&self.ctx.cann, self.ctx.device);
        // SAFETY: `dev` was registered by this owner and is unregistered once.
        self.ctx
            .release("halHostUnregister", || unsafe { cann.halHostUnregister(self.dev, device) });
    }
}

/// An event (`aclrtCreateEvent` / `aclrtDestroyEvent`).
#[derive(Debug)]
pub(crate) struct Event {
    ctx: Arc<Ctx>,
    raw: aclrtEvent,
}

// SAFETY: an event handle is an opaque token CANN accepts from any bound thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// The context the event belongs to.
    pub(crate) fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// Lets go of the event without `aclrtDestroyEvent`: for an event its device's reset
    /// released, or one no thread could be bound to destroy in its context. Only the owner's
    /// context reference is released.
    pub(crate) fn disown(self) {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again; `ctx` is read out once and dropped
        // here, the handle is a token that holds no resource of the host.
        drop(unsafe { std::ptr::read(&this.ctx) });
    }

    /// Creates an event and records it on `stream`.
    pub(crate) fn record(ctx: &Arc<Ctx>, stream: &Stream) -> Result<Event, CannError> {
        let mut raw: aclrtEvent = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        ctx.check("aclrtCreateEvent", unsafe { ctx.cann.aclrtCreateEvent(&mut raw) })?;
        let event = Event { ctx: Arc::clone(ctx), raw };
        // SAFETY: both handles are live.
        let ret = unsafe { ctx.cann.aclrtRecordEvent(raw, stream.raw()) };
        ctx.check("aclrtRecordEvent", ret)?;
        Ok(event)
    }

    pub(crate) fn raw(&self) -> aclrtEvent {
        self.raw
    }

    /// Whether the event completed (never blocks); CANN's refusal is the stream's failure.
    pub(crate) fn status(&self) -> Result<bool, CannError> {
        let mut status = 0;
        // SAFETY: live handle, valid out-pointer.
        let ret = unsafe { self.ctx.cann.aclrtQueryEventStatus(self.raw, &mut status) };
        self.ctx.check("aclrtQueryEventStatus", ret)?;
        Ok(status == simpler_acl_sys::types::ACL_EVENT_RECORDED_STATUS_COMPLETE)
    }

    /// Waits at most `timeout_ms` for the event.
    pub(crate) fn synchronize(&self, timeout_ms: i32) -> Result<(), CannError> {
        // SAFETY: live handle.
        let ret = unsafe { self.ctx.cann.aclrtSynchronizeEventWithTimeout(self.raw, timeout_ms) };
        self.ctx.check("aclrtSynchronizeEventWithTimeout", ret)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: live handle of this owner, destroyed once.
        self.ctx
            .release("aclrtDestroyEvent", || unsafe { self.ctx.cann.aclrtDestroyEvent(self.raw) });
    }
}

/// A loaded AICPU program (`rtsBinaryLoadFromFile` / `rtsBinaryUnload`) and the entries
/// resolved from it.
#[derive(Debug)]
pub(crate) struct CpuBinary {
    ctx: Arc<Ctx>,
    raw: rtBinHandle,
}

// SAFETY: an opaque handle CANN accepts from any bound thread.
unsafe impl Send for CpuBinary {}
// SAFETY: as above.
unsafe impl Sync for CpuBinary {}

impl CpuBinary {
    pub(crate) fn load(ctx: &Arc<Ctx>, json: &std::ffi::CStr) -> Result<CpuBinary, CannError> {
        use simpler_acl_sys::types::{
            RT_LOAD_BINARY_OPT_CPU_KERNEL_MODE, rtLoadBinaryConfig_t, rtLoadBinaryOption_t,
            rtLoadBinaryOptionValue_t,
        };
        // One option: CPU kernel mode 0, as the original.
        let mut option = rtLoadBinaryOption_t {
            optionId: RT_LOAD_BINARY_OPT_CPU_KERNEL_MODE,
            value: rtLoadBinaryOptionValue_t { cpuKernelMode: 0 },
        };
        let cfg = rtLoadBinaryConfig_t { options: &mut option, numOpt: 1 };
        let mut raw: rtBinHandle = ptr::null_mut();
        // SAFETY: `json` is NUL-terminated, `cfg` and `option` outlive the call, `raw` is a
        // valid out-pointer.
        let ret = unsafe { ctx.cann.rtsBinaryLoadFromFile(json.as_ptr(), &cfg, &mut raw) };
        ctx.check("rtsBinaryLoadFromFile", ret)?;
        Ok(CpuBinary { ctx: Arc::clone(ctx), raw })
    }

    /// Resolves one entry by its op type.
    pub(crate) fn function(&self, op: &std::ffi::CStr) -> Result<rtFuncHandle, CannError> {
        let mut f: rtFuncHandle = ptr::null_mut();
        // SAFETY: live handle, NUL-terminated name, valid out-pointer.
        let ret = unsafe { self.ctx.cann.rtsFuncGetByName(self.raw, op.as_ptr(), &mut f) };
        self.ctx.check("rtsFuncGetByName", ret)?;
        Ok(f)
    }
}

impl Drop for CpuBinary {
    fn drop(&mut self) {
        // SAFETY: live handle of this owner, unloaded once.
        self.ctx.release("rtsBinaryUnload", || unsafe { self.ctx.cann.rtsBinaryUnload(self.raw) });
    }
}

/// Turns a typed CANN failure into the code the runner's launch and sync paths carry.
pub(crate) fn code_of(e: &CannError) -> i32 {
    match e {
        CannError::Acl(AclError { code, .. }) => *code,
        // A function that cannot be loaded is an internal error of the install.
        _ => 507_000,
    }
}
