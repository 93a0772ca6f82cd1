//! Deriving a tensor argument's buffer key and byte span (`docs/tensormap.md` §1, §2).
//!
//! The key says which buffer ([`TensorKey::for_tensor`]), the span which of its bytes the view
//! can touch ([`ByteSpan::of_tensor`]); [`footprint`] gives both, or nothing for an untracked
//! argument. Spans are absolute addresses in the key's address space, so the spans of all views
//! of one buffer are directly comparable.

use simpler_types::{Tensor, WorkerId};

use crate::{ByteSpan, TensorKey, TensorMapError};

impl TensorKey {
    /// The key of the buffer behind `t`, for a task whose NEXT_LEVEL target is `target`
    /// (`None` for a SUB task).
    ///
    /// | Tensor | Key |
    /// |---|---|
    /// | null (`addr == 0`) | `Ok(None)`: untracked |
    /// | host memory | `Host { addr }` |
    /// | child memory, target `w` | `Child { worker: w, addr }` |
    /// | child memory, no target | `Err(ChildMemoryWithoutTarget { addr })` |
    ///
    /// Every view of a buffer yields the buffer's key: identity is the base address, and the
    /// view's extent is the [`ByteSpan`]'s business. The tensor descriptor carries no remote
    /// descriptor yet, so this never returns a [`TensorKey::Remote`].
    pub fn for_tensor(
        t: &Tensor,
        target: Option<WorkerId>,
    ) -> Result<Option<TensorKey>, TensorMapError> {
        if t.is_null() {
            return Ok(None);
        }
        if !t.is_child_memory() {
            return Ok(Some(TensorKey::Host { addr: t.addr }));
        }
        match target {
            Some(worker) => Ok(Some(TensorKey::Child { worker, addr: t.addr })),
            None => Err(TensorMapError::ChildMemoryWithoutTarget { addr: t.addr }),
        }
    }
}

impl ByteSpan {
    /// The bytes `t`'s view can touch, `[data_addr, data_addr + extent × element_size)`;
    /// `None` for a null tensor or a zero-size view (untracked).
    ///
    /// A strided or transposed view is covered by its bounding span (the first to one past the
    /// last reachable element). A descriptor whose span cannot be computed (an unknown dtype
    /// byte, or an end past `u64::MAX`) is covered from its base address to the end of the
    /// address space: such a tensor fails validation at submit, and if one ever reaches the map
    /// anyway, a too-wide span costs an extra dependency where a missing one would cost a race
    /// (its overwrite is a [`Scatter`](crate::Access::Scatter), which supersedes nothing).
    pub fn of_tensor(t: &Tensor) -> Option<ByteSpan> {
        ByteSpan::measure(t).map(|(span, _)| span)
    }

    /// [`of_tensor`](Self::of_tensor)'s span and whether it is the view's own (`false`: the
    /// fallback to the end of the address space).
    pub(crate) fn measure(t: &Tensor) -> Option<(ByteSpan, bool)> {
        if t.is_null() || t.numel() == 0 {
            return None;
        }
        match t.byte_span() {
            Some((start, end)) => ByteSpan::new(start, end).map(|span| (span, true)),
            None => Some((ByteSpan { start: t.addr.min(u64::MAX - 1), end: u64::MAX }, false)),
        }
    }
}

/// Key and span of one tensor argument, or `None` when it is untracked (null or zero-size).
///
/// `target` is the task's NEXT_LEVEL worker (`None` for a SUB task); child memory without one
/// is [`TensorMapError::ChildMemoryWithoutTarget`], whatever the view's size.
pub fn footprint(
    t: &Tensor,
    target: Option<WorkerId>,
) -> Result<Option<(TensorKey, ByteSpan)>, TensorMapError> {
    let Some(key) = TensorKey::for_tensor(t, target)? else {
        return Ok(None);
    };
    Ok(ByteSpan::of_tensor(t).map(|span| (key, span)))
}
