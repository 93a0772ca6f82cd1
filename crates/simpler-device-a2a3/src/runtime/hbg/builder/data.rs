//! The builder's data calls, `tensor_data` and `set_tensor_data` on the bytes of one tensor,
//! checked against the tasks recorded so far: nothing runs before the whole graph is built, so
//! a read is refused for bytes a recorded task may write, and a write for bytes one touches.

use simpler_tensormap::{ByteSpan, TensorKey};
use simpler_types::Tensor;

use super::{GraphBuilder, span_of};
use crate::error::{ArgsProblem, OrchOp};
use crate::runtime::orch::{ORCH_FAILED, ORCH_OK};

impl GraphBuilder<'_> {
    /// The bytes `t` names for `op` (`tensor_data` or `set_tensor_data`) with a `len`-byte
    /// buffer: a contiguous view of exactly that many bytes, else the latched invalid-args
    /// status.
    fn data_span(&mut self, t: &Tensor, len: usize, op: OrchOp) -> Result<ByteSpan, i32> {
        // Every call after a failure fails, as a submit does.
        if self.stopped() {
            return Err(ORCH_FAILED);
        }
        if let Err(source) = t.validate() {
            return Err(self.invalid(ArgsProblem::DataDescriptor { op, source }));
        }
        if let Err(ended) = self.not_after_its_scope(None, 0, t) {
            return Err(self.invalid(ended));
        }
        let Some(span) = span_of(t) else {
            return Err(self.invalid(ArgsProblem::DataEmpty { op }));
        };
        let contiguous = t.contiguous();
        if !contiguous || span.len() != len as u64 {
            let view_bytes = span.len();
            let buffer_bytes = len;
            return Err(self.invalid(ArgsProblem::DataShape {
                op,
                contiguous,
                view_bytes,
                buffer_bytes,
            }));
        }
        if let Err(alias) = self.base_alias(None, 0, t) {
            return Err(self.invalid(alias));
        }
        self.note_base(t);
        Ok(span)
    }

    pub(super) fn get_data(&mut self, t: &Tensor, out: &mut [u8]) -> i32 {
        let span = match self.data_span(t, out.len(), OrchOp::TensorData) {
            Ok(span) => span,
            Err(status) => return status,
        };
        let mut written = false;
        let key = TensorKey::Host { addr: t.addr };
        for map in [&self.scratch.map, &self.scratch.untracked_writes] {
            map.lookup_overlapping(self.run_id, &key, span, |_| written = true);
        }
        let (addr, len) = (span.start, span.len());
        if written {
            return self.invalid(ArgsProblem::DataNotWritten { addr, len });
        }
        if !self.scratch.entry_spans.iter().any(|e| e.contains(span)) {
            return self.invalid(ArgsProblem::DataNotStaged { addr, len });
        }
        if !self.env.read(addr, out) {
            let op = OrchOp::TensorData;
            return self.invalid(ArgsProblem::DataNotDeviceMemory { op, addr, len });
        }
        ORCH_OK
    }

    pub(super) fn set_data(&mut self, t: &Tensor, data: &[u8]) -> i32 {
        let span = match self.data_span(t, data.len(), OrchOp::SetTensorData) {
            Ok(span) => span,
            Err(status) => return status,
        };
        let mut used = false;
        self.scratch.touched.lookup_overlapping(
            self.run_id,
            &TensorKey::Host { addr: t.addr },
            span,
            |_| used = true,
        );
        let (addr, len) = (span.start, span.len());
        if used {
            return self.invalid(ArgsProblem::DataInUse { addr, len });
        }
        // The same policy as for submitted tensors: the runtime's own buffers (image, kernel
        // arguments, chip buffers) hold what the scheduler trusts and are never writable here.
        if !self.range_ok(addr, len) {
            return self.invalid(ArgsProblem::DataOutsideAllocation { addr, len });
        }
        if !self.env.write(addr, data) {
            let op = OrchOp::SetTensorData;
            return self.invalid(ArgsProblem::DataNotDeviceMemory { op, addr, len });
        }
        ORCH_OK
    }
}
