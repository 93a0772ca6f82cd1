//! The trb orchestration's ops table: the C-ABI functions an orchestration calls, each
//! checking its raw arguments before handing them to the orchestration thread's state.

use core::ffi::c_void;

use simpler_tensormap::fixed::AccessMode;
use simpler_types::Tensor;

use super::super::record;
use super::{FaultDetail, TrbOrch};
use crate::abi::codes::RuntimeCode;
use crate::aicpu::{AicpuPlatform, LogLevel};
use crate::runtime::orch::{ORCH_FAILED, ORCH_OK, ORCH_OPS_VERSION, OrchOps, SubmitDesc, c_ref};

/// The ops table of the trb orchestration over platform `P`.
pub(super) fn ops_table<P: AicpuPlatform>() -> OrchOps {
    OrchOps {
        version: ORCH_OPS_VERSION,
        submit: op_submit::<P>,
        scope_begin: op_scope_begin::<P>,
        scope_end: op_scope_end::<P>,
        alloc_tensors: op_alloc_tensors::<P>,
        get_tensor_data: op_get_tensor_data::<P>,
        set_tensor_data: op_set_tensor_data::<P>,
        available_clusters: op_available_clusters::<P>,
        available_aiv_cores: op_available_aiv_cores::<P>,
        report_fatal: op_report_fatal::<P>,
        log: op_log::<P>,
    }
}

/// # Safety
/// `rt` must be the `TrbOrch` of the `orchestrate` call in progress.
unsafe fn orch<'r, P: AicpuPlatform>(rt: *mut c_void) -> &'r mut TrbOrch<'r, P> {
    // SAFETY: the caller's guarantee; the context is used by one call at a time.
    unsafe { &mut *rt.cast::<TrbOrch<'r, P>>() }
}

unsafe extern "C-unwind" fn op_submit<P: AicpuPlatform>(
    rt: *mut c_void,
    desc: *const SubmitDesc,
) -> i64 {
    // SAFETY: the ops table's contract.
    let o = unsafe { orch::<P>(rt) };
    // SAFETY: a non-null, aligned descriptor is valid for the call (the ops table's contract).
    match unsafe { c_ref(desc) } {
        Some(d) => o.submit(d),
        None => i64::from(o.invalid(format_args!("submit: null or misaligned descriptor"))),
    }
}

unsafe extern "C-unwind" fn op_scope_begin<P: AicpuPlatform>(rt: *mut c_void) -> i32 {
    // SAFETY: the ops table's contract.
    let o = unsafe { orch::<P>(rt) };
    if o.failed {
        return ORCH_FAILED;
    }
    match o.engine.scope_begin() {
        Ok(()) => {
            if let Some(rec) = o.records.as_mut() {
                rec.depth += 1;
                rec.scope(record::scope_usage(&mut o.engine, true, rec.depth));
            }
            ORCH_OK
        }
        Err(r) => o.refused(&"scope_begin", r),
    }
}

unsafe extern "C-unwind" fn op_scope_end<P: AicpuPlatform>(rt: *mut c_void) -> i32 {
    // SAFETY: the ops table's contract.
    let o = unsafe { orch::<P>(rt) };
    if o.failed {
        return ORCH_FAILED;
    }
    // The scope's usage before its end releases it.
    let end = o.records.as_ref().map(|r| r.depth);
    let usage = end.map(|depth| record::scope_usage(&mut o.engine, false, depth));
    match o.engine.scope_end() {
        Ok(()) => {
            if let (Some(rec), Some(u)) = (o.records.as_mut(), usage) {
                rec.scope(u);
                rec.depth = rec.depth.saturating_sub(1);
            }
            ORCH_OK
        }
        Err(r) => o.refused(&"scope_end", r),
    }
}

unsafe extern "C-unwind" fn op_alloc_tensors<P: AicpuPlatform>(
    rt: *mut c_void,
    tensors: *mut Tensor,
    count: u32,
) -> i32 {
    // SAFETY: the ops table's contract.
    let o = unsafe { orch::<P>(rt) };
    if count == 0 {
        return if o.failed { ORCH_FAILED } else { ORCH_OK };
    }
    if tensors.is_null() || !tensors.is_aligned() {
        return o.invalid(format_args!("alloc_tensors: null or misaligned descriptor array"));
    }
    // SAFETY: non-null and aligned; the caller passes `count` descriptors it owns for the call
    // (the ops table's contract).
    let tensors = unsafe { core::slice::from_raw_parts_mut(tensors, count as usize) };
    o.alloc(tensors)
}

unsafe extern "C-unwind" fn op_get_tensor_data<P: AicpuPlatform>(
    rt: *mut c_void,
    t: *const Tensor,
    dst: *mut u8,
    len: u64,
) -> i32 {
    // SAFETY: the ops table's contract.
    let o = unsafe { orch::<P>(rt) };
    // SAFETY: a non-null, aligned descriptor is valid for the call.
    let Some(t) = (unsafe { c_ref(t) }) else {
        return o.invalid(format_args!("tensor_data: null or misaligned descriptor"));
    };
    if dst.is_null() && len > 0 {
        return o.invalid(format_args!("tensor_data: null destination"));
    }
    match o.data_span(t, len, AccessMode::Read, "tensor_data") {
        // SAFETY: `data_span` checked that the span lies in an entry buffer or in a heap buffer
        // whose scope is open (only this thread ends scopes, so no other buffer takes the
        // bytes during the copy), and waited for the tasks writing it: those the tensor map
        // names and every task with an untracked access, so no task writes the bytes during
        // the copy; `dst` is valid for `len` bytes (`OrchCtx::tensor_data`).
        Ok(span) => unsafe {
            core::ptr::copy_nonoverlapping(span.start as *const u8, dst, len as usize);
            ORCH_OK
        },
        Err(status) => status,
    }
}

unsafe extern "C-unwind" fn op_set_tensor_data<P: AicpuPlatform>(
    rt: *mut c_void,
    t: *const Tensor,
    src: *const u8,
    len: u64,
) -> i32 {
    // SAFETY: the ops table's contract.
    let o = unsafe { orch::<P>(rt) };
    // SAFETY: a non-null, aligned descriptor is valid for the call.
    let Some(t) = (unsafe { c_ref(t) }) else {
        return o.invalid(format_args!("set_tensor_data: null or misaligned descriptor"));
    };
    if src.is_null() && len > 0 {
        return o.invalid(format_args!("set_tensor_data: null source"));
    }
    // An in-out access's wait: the readers and every writer of the bytes. A write-only
    // access orders after a plain `Output` writer only when it must (it would be skipped),
    // but this copy happens now, so a writer still to run would overwrite it, and one running
    // would race it.
    match o.data_span(t, len, AccessMode::ReadWrite, "set_tensor_data") {
        // SAFETY: as for `op_get_tensor_data`, having waited for the tasks reading or writing
        // the bytes; `src` is valid for `len` bytes.
        Ok(span) => unsafe {
            core::ptr::copy_nonoverlapping(src, span.start as *mut u8, len as usize);
            ORCH_OK
        },
        Err(status) => status,
    }
}

unsafe extern "C-unwind" fn op_available_clusters<P: AicpuPlatform>(rt: *mut c_void) -> u32 {
    // SAFETY: the ops table's contract.
    unsafe { orch::<P>(rt) }.view.header().block_dim
}

unsafe extern "C-unwind" fn op_available_aiv_cores<P: AicpuPlatform>(rt: *mut c_void) -> u32 {
    // SAFETY: the ops table's contract.
    2 * unsafe { orch::<P>(rt) }.view.header().block_dim
}

unsafe extern "C-unwind" fn op_report_fatal<P: AicpuPlatform>(
    rt: *mut c_void,
    code: i32,
    msg: *const u8,
    len: usize,
) {
    // SAFETY: the ops table's contract.
    let o = unsafe { orch::<P>(rt) };
    let code = RuntimeCode::reported_by_orchestration(code);
    // SAFETY: the ops table's contract: `msg` and `len` are a string the call lends.
    let text = unsafe { message_text(msg, len) };
    o.latch(code, format_args!("{text}"), FaultDetail::None);
}

unsafe extern "C-unwind" fn op_log<P: AicpuPlatform>(
    rt: *mut c_void,
    level: u32,
    msg: *const u8,
    len: usize,
) {
    // SAFETY: the ops table's contract.
    let o = unsafe { orch::<P>(rt) };
    let level = match level {
        0 => LogLevel::Error,
        1 => LogLevel::Warn,
        2 => LogLevel::Info,
        _ => LogLevel::Debug,
    };
    // SAFETY: the ops table's contract: `msg` and `len` are a string the call lends.
    let text = unsafe { message_text(msg, len) };
    o.p.log(level, format_args!("orchestration: {text}"));
}

/// The message at `msg` of `len` bytes (empty for a null `msg`; a placeholder when it is not
/// UTF-8).
///
/// # Safety
///
/// A non-null `msg` is readable for `len` bytes while the returned text is used (the ops
/// table's contract: `OrchCtx` passes a `&str`'s pointer and length).
unsafe fn message_text<'a>(msg: *const u8, len: usize) -> &'a str {
    if msg.is_null() {
        return "";
    }
    // SAFETY: the caller's contract.
    let bytes = unsafe { core::slice::from_raw_parts(msg, len) };
    core::str::from_utf8(bytes).unwrap_or("(not UTF-8)")
}
