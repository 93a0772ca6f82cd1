//! Staging of host-memory tensors on L3 chip tasks (`docs/worker-protocols.md`, "Host tensors
//! on chip tasks").
//!
//! A chip task whose tensors name a [`HostBuffer`] runs on a copy: the lane allocates one
//! device buffer per distinct host buffer, copies the bytes in unless every tensor of that
//! buffer is only written (`Output`, `OutputExisting`), rewrites the tensors to the device copy,
//! runs the task and, after a successful run, copies the bytes back unless every tensor of that
//! buffer is only read (`Input`, `NoDep`). The device copies are freed on every path.
//!
//! Tensors of one host buffer share one device copy, so views of the same bytes stay aliased
//! on the chip as they are on the host.

use simpler_device_a2a3::{DeviceError, DevicePtr, DeviceRunner};
use simpler_sched::EndpointFailure;
use simpler_types::{
    CallConfig, CallableId, TaskArgs, TaskArgsView, TaskId, Tensor, TensorArgType,
};

use crate::chip::{ChipState, device_failure};
use crate::error::WorkerError;
use crate::host_buffer::HostBuffer;

/// Whether tensor `t` names host memory a chip lane has to stage.
fn is_host(t: &Tensor) -> bool {
    !t.is_null() && !t.is_child_memory()
}

/// Whether any tensor of `args` is host memory.
pub(crate) fn has_host_tensors(args: TaskArgsView<'_>) -> bool {
    args.tensors.iter().any(is_host)
}

/// The submit-time check of one chip task's arguments: every host-memory tensor lies in a live
/// [`HostBuffer`], which is returned so that the run keeps it alive.
pub(crate) fn host_buffers_of(args: &TaskArgs) -> Result<Vec<HostBuffer>, WorkerError> {
    let mut out: Vec<HostBuffer> = Vec::new();
    for (arg, t) in args.tensors().iter().enumerate().filter(|(_, t)| is_host(t)) {
        let buf = HostBuffer::covering(t.addr, t.size).ok_or(WorkerError::HostTensorNotStaged {
            arg,
            addr: t.addr,
            len: t.size,
        })?;
        if !out.iter().any(|b| HostBuffer::same(b, &buf)) {
            out.push(buf);
        }
    }
    Ok(out)
}

/// One host buffer staged for a chip task.
struct Staged {
    host: HostBuffer,
    dev: DevicePtr,
    copy_in: bool,
    copy_back: bool,
}

/// Runs a chip task whose arguments name host memory, staging it as the module docs say.
pub(crate) fn run_staged(
    state: &mut ChipState,
    callable: &CallableId,
    args: TaskArgsView<'_>,
    config: &CallConfig,
    origin: TaskId,
) -> Result<(), EndpointFailure> {
    let mut device_args = TaskArgs::from_view(args).map_err(|e| {
        device_failure(DeviceError::InvalidArgs { run_id: None, message: e.to_string() })
    })?;
    let mut staged: Vec<Staged> = Vec::new();
    let result = stage_in(state, &mut device_args, &mut staged)
        .map_err(device_failure)
        .and_then(|()| state.run(callable, device_args.view(), config, origin))
        .and_then(|()| stage_out(state, &staged).map_err(device_failure));
    // Freeing a device copy can only fail on a chip that is already failing; the task's own
    // result says more, so a free error is logged.
    if let Some(runner) = state.runner.as_mut() {
        for s in &staged {
            if let Err(e) = runner.free(s.dev) {
                tracing::warn!(chip = %state.chip, %origin, "freeing a staging copy failed: {e}");
            }
        }
    }
    result
}

fn runner(state: &mut ChipState) -> Result<&mut DeviceRunner, DeviceError> {
    state.runner.as_mut().ok_or(DeviceError::Finalized { call: "stage host tensors" })
}

/// Allocates and fills the device copies and points the tensors of `args` at them.
fn stage_in(
    state: &mut ChipState,
    args: &mut TaskArgs,
    staged: &mut Vec<Staged>,
) -> Result<(), DeviceError> {
    let tags: Vec<TensorArgType> = args.tags().to_vec();
    for (i, t) in args.tensors_mut().iter_mut().enumerate() {
        if !is_host(t) {
            continue;
        }
        let tag = tags.get(i).copied().unwrap_or_default();
        let host =
            HostBuffer::covering(t.addr, t.size).ok_or_else(|| DeviceError::InvalidArgs {
                run_id: None,
                message: format!(
                    "chip argument {i}: host memory at {:#x} is not a live HostBuffer",
                    t.addr
                ),
            })?;
        // A blind write of the whole buffer needs no copy in; a partial one does, or the copy
        // back would return the bytes it did not write as garbage.
        let whole = t.byte_span() == Some((host.addr(), host.addr() + host.len()));
        let blind = matches!(tag, TensorArgType::Output | TensorArgType::OutputExisting);
        let k = match staged.iter().position(|s| HostBuffer::same(&s.host, &host)) {
            Some(k) => k,
            None => {
                let dev = runner(state)?.malloc(host.len())?;
                staged.push(Staged { host, dev, copy_in: false, copy_back: false });
                staged.len() - 1
            }
        };
        let s = &mut staged[k];
        s.copy_in |= !(blind && whole);
        s.copy_back |= !matches!(tag, TensorArgType::Input | TensorArgType::NoDep);
        t.addr = s.dev.0 + (t.addr - s.host.addr());
        t.child_memory = 1;
    }
    for s in staged.iter().filter(|s| s.copy_in) {
        let runner = runner(state)?;
        s.host.with_bytes(|b| runner.copy_to_device(s.dev, b))?;
    }
    Ok(())
}

/// Copies the written device copies back into their host buffers.
fn stage_out(state: &mut ChipState, staged: &[Staged]) -> Result<(), DeviceError> {
    for s in staged.iter().filter(|s| s.copy_back) {
        let runner = runner(state)?;
        s.host.with_bytes(|b| runner.copy_from_device(b, s.dev))?;
    }
    Ok(())
}
