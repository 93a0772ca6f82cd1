//! The engine accesses of one submit: a task's tensor arguments and their tags, turned into
//! `(buffer, bytes, mode)` triples for the tensor map.
//!
//! On the chip every tensor is device memory, so a buffer is named by its base address and a
//! view by the bytes it can touch (its bounding span). `Input` reads, `Output` and
//! `OutputExisting` overwrite blindly, `InOut` updates in place; `NoDep`, `manual_dep`, null
//! and zero-size tensors are not tracked (a `manual_dep` tensor orders after its creator only).

use simpler_tensormap::fixed::AccessMode;
use simpler_tensormap::{Access as MapAccess, ByteSpan};
use simpler_types::{Tensor, TensorArgType};

use super::engine::Access;

/// Most tracked tensor arguments of one task.
pub(crate) const MAX_ACCESSES: usize = 32;

/// A task's tracked accesses, held inline so that a submit allocates nothing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Accesses {
    items: [Access; MAX_ACCESSES],
    len: usize,
}

/// A task has more tracked tensor arguments than [`MAX_ACCESSES`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct TooManyAccesses {
    /// The tracked arguments the task has.
    pub(crate) tracked: usize,
}

/// How the tensor map records tensor `t` under `tag`; `None` for `NoDep` and `manual_dep`
/// tensors, which it leaves untracked.
fn tracked_as(t: &Tensor, tag: TensorArgType) -> Option<MapAccess> {
    MapAccess::of_view(tag, t).filter(|_| !t.is_manual_dep())
}

impl Accesses {
    /// The accesses of `tensors` under `tags` (paired by position; extra entries of the longer
    /// slice are ignored, the caller checks the counts).
    pub(crate) fn of(
        tensors: &[Tensor],
        tags: &[TensorArgType],
    ) -> Result<Accesses, TooManyAccesses> {
        let empty = Access { key: 0, span: ByteSpan { start: 0, end: 0 }, mode: AccessMode::Read };
        let mut out = Accesses { items: [empty; MAX_ACCESSES], len: 0 };
        let tracked = tensors.iter().zip(tags).filter_map(|(t, &tag)| {
            let (access, span) = MapAccess::of_view_spanned(tag, t)?;
            (!t.is_manual_dep()).then(|| Access { key: t.addr, span, mode: access.into() })
        });
        for (i, a) in tracked.enumerate() {
            match out.items.get_mut(i) {
                Some(slot) => *slot = a,
                None => return Err(TooManyAccesses { tracked: i + 1 }),
            }
            out.len = i + 1;
        }
        Ok(out)
    }

    /// The bytes `tensors` name under a tag the map does not record (`NoDep`, or a
    /// `manual_dep` tensor): what the orchestration's data copies must wait for separately.
    pub(crate) fn untracked<'t>(
        tensors: &'t [Tensor],
        tags: &'t [TensorArgType],
    ) -> impl Iterator<Item = ByteSpan> + 't {
        tensors.iter().zip(tags).filter_map(|(t, &tag)| {
            let untracked = tracked_as(t, tag).is_none();
            if untracked && !t.is_null() { ByteSpan::of_tensor(t) } else { None }
        })
    }

    /// The tracked accesses, in argument order.
    pub(crate) fn as_slice(&self) -> &[Access] {
        &self.items[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use simpler_types::DataType;

    use super::*;
    use TensorArgType::{InOut, Input, NoDep, Output, OutputExisting};

    fn tensor(addr: u64, elems: u32) -> Tensor {
        Tensor::external(addr, &[elems], DataType::Float32).unwrap()
    }

    #[test]
    fn tags_become_modes_and_untracked_or_manual_dep_arguments_are_left_out() {
        let t = [tensor(0x1000, 4), tensor(0x2000, 4), tensor(0x3000, 4), tensor(0x4000, 4)];
        let manual = t[1].manual_dep(true);
        let tensors = [t[0], t[1], t[2], t[3], t[0], tensor(0, 4), tensor(0x5000, 0), manual];
        let tags = [Input, Output, InOut, OutputExisting, NoDep, Input, Input, Input];
        let a = Accesses::of(&tensors, &tags).unwrap();
        let got: Vec<(u64, u64, u64, AccessMode)> =
            a.as_slice().iter().map(|a| (a.key, a.span.start, a.span.end, a.mode)).collect();
        assert_eq!(
            got,
            [
                (0x1000, 0x1000, 0x1010, AccessMode::Read),
                (0x2000, 0x2000, 0x2010, AccessMode::Write),
                (0x3000, 0x3000, 0x3010, AccessMode::ReadWrite),
                (0x4000, 0x4000, 0x4010, AccessMode::Write),
            ]
        );
    }

    #[test]
    fn a_view_is_keyed_by_its_buffer_and_spans_its_own_bytes() {
        let half = tensor(0x1000, 8).view(&[4], &[4]).unwrap();
        let a = Accesses::of(&[half], &[Output]).unwrap();
        let a = a.as_slice()[0];
        assert_eq!((a.key, a.span.start, a.span.end), (0x1000, 0x1010, 0x1020));
    }

    #[test]
    fn more_tracked_arguments_than_a_task_may_have_are_refused_with_the_count() {
        let tensors: Vec<Tensor> =
            (1..=MAX_ACCESSES as u64 + 1).map(|i| tensor(i << 12, 1)).collect();
        let tags = vec![Input; tensors.len()];
        assert_eq!(
            Accesses::of(&tensors, &tags).unwrap_err(),
            TooManyAccesses { tracked: MAX_ACCESSES + 1 }
        );
        assert_eq!(Accesses::of(&tensors[1..], &tags).unwrap().as_slice().len(), MAX_ACCESSES);
    }
}
