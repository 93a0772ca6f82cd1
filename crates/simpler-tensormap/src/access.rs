//! `Access`: what one tensor argument does to its bytes, as the map sees it.

use simpler_types::{Tensor, TensorArgType};

use crate::ByteSpan;

/// How a task touches a footprint: which earlier entries it must order after
/// ([`TensorMap::dependencies`](crate::TensorMap::dependencies)) and which entry it leaves
/// behind ([`TensorMap::record`](crate::TensorMap::record)).
///
/// | Access | Orders after | Leaves |
/// |---|---|---|
/// | `Read` | the writers of overlapping bytes | a reader entry beside the others |
/// | `Overwrite` | the readers of overlapping bytes | a writer entry, superseding what it covers |
/// | `Scatter` | as `Overwrite` | a writer entry, superseding only the readers it covers |
/// | `Update` | the writers and the readers of overlapping bytes | a writer entry that also counts as a reader |
///
/// "Readers" here are reader entries, in-place writers, and writers that superseded either: a
/// covering write takes the place of the readers it waited for, so a later write still orders
/// after them through it. The protocol is described in `docs/tensormap.md`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Access {
    /// Reads the bytes (`Input`).
    Read,
    /// Writes the bytes without reading them (`Output`, `OutputExisting`): no edge to the
    /// previous writer.
    Overwrite,
    /// Writes some of its footprint's bytes without reading them: an `Output` whose view has
    /// gaps (not contiguous), whose footprint is its bounding range. Ordered as `Overwrite`;
    /// its entry takes the place of the readers it covers (it ordered after them) but not of
    /// earlier writers, whose bytes in its gaps later readers must still wait for.
    Scatter,
    /// Reads and writes the bytes in place (`InOut`).
    Update,
}

impl Access {
    /// The access of a tag; `None` for `NoDep`, which the map does not track.
    pub const fn of(tag: TensorArgType) -> Option<Access> {
        match tag {
            TensorArgType::Input => Some(Access::Read),
            TensorArgType::Output | TensorArgType::OutputExisting => Some(Access::Overwrite),
            TensorArgType::InOut => Some(Access::Update),
            TensorArgType::NoDep => None,
        }
    }

    /// The access of `tag` on the view `t`: as [`of`](Self::of), with an overwrite of a view
    /// that has gaps made a [`Scatter`](Self::Scatter). So is an overwrite of a view whose
    /// bytes cannot be computed (an unknown dtype, an end past `u64::MAX`): the map covers it
    /// with a span to the end of the address space ([`ByteSpan::of_tensor`]), which as a
    /// covering write would supersede earlier writers of bytes the view never touches.
    ///
    /// [`ByteSpan::of_tensor`]: crate::ByteSpan::of_tensor
    pub fn of_view(tag: TensorArgType, t: &Tensor) -> Option<Access> {
        match Access::of(tag)? {
            Access::Overwrite if !t.contiguous() || t.byte_span().is_none() => {
                Some(Access::Scatter)
            }
            access => Some(access),
        }
    }

    /// [`of_view`](Self::of_view) together with the bytes the map covers the view by
    /// ([`ByteSpan::of_tensor`]), the view's span computed once; `None` when either is (`NoDep`,
    /// a null or empty view): what a submit needs of each tensor argument.
    ///
    /// [`ByteSpan::of_tensor`]: crate::ByteSpan::of_tensor
    pub fn of_view_spanned(tag: TensorArgType, t: &Tensor) -> Option<(Access, ByteSpan)> {
        let access = Access::of(tag)?;
        let (span, exact) = ByteSpan::measure(t)?;
        let access = match access {
            Access::Overwrite if !t.contiguous() || !exact => Access::Scatter,
            access => access,
        };
        Some((access, span))
    }

    /// Whether the access orders after earlier writers: `Read` and `Update`.
    pub const fn after_writers(self) -> bool {
        matches!(self, Access::Read | Access::Update)
    }

    /// Whether the access orders after earlier readers: `Overwrite`, `Scatter` and `Update`.
    pub const fn after_readers(self) -> bool {
        matches!(self, Access::Overwrite | Access::Scatter | Access::Update)
    }

    /// Whether the access writes without reading: `Overwrite` and `Scatter`.
    pub const fn is_blind_write(self) -> bool {
        matches!(self, Access::Overwrite | Access::Scatter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tag_but_no_dep_is_tracked() {
        use TensorArgType::*;
        let table = [
            (Input, Some(Access::Read)),
            (Output, Some(Access::Overwrite)),
            (OutputExisting, Some(Access::Overwrite)),
            (InOut, Some(Access::Update)),
            (NoDep, None),
        ];
        for (tag, access) in table {
            assert_eq!(Access::of(tag), access, "{tag}");
        }
    }

    #[test]
    fn of_view_spanned_is_of_view_and_of_tensor_together() {
        use TensorArgType::*;
        let m = Tensor::external(0x1000, &[4, 8], simpler_types::DataType::Float32).unwrap();
        let mut unmeasurable = m;
        unmeasurable.dtype = 0xEE;
        let views = [
            m,
            m.view(&[1, 8], &[2, 0]).unwrap(),
            m.slice(1, 0, 8, 2).unwrap(),
            m.transpose(0, 1).unwrap(),
            unmeasurable,
            Tensor::external(0, &[8], simpler_types::DataType::Float32).unwrap(),
            Tensor::external(0x2000, &[0], simpler_types::DataType::Float32).unwrap(),
        ];
        for t in &views {
            for tag in [Input, Output, OutputExisting, InOut, NoDep] {
                let apart = Access::of_view(tag, t).zip(ByteSpan::of_tensor(t));
                assert_eq!(Access::of_view_spanned(tag, t), apart, "{tag} on {t:?}");
            }
        }
    }

    #[test]
    fn only_a_blind_write_of_a_view_with_gaps_is_a_scatter() {
        use TensorArgType::*;
        let m = Tensor::external(0x1000, &[4, 8], simpler_types::DataType::Float32).unwrap();
        let row = m.view(&[1, 8], &[0, 0]).unwrap();
        let even_columns = m.slice(1, 0, 8, 2).unwrap();
        assert_eq!(Access::of_view(Output, &row), Some(Access::Overwrite));
        assert_eq!(Access::of_view(Output, &even_columns), Some(Access::Scatter));
        assert_eq!(Access::of_view(OutputExisting, &even_columns), Some(Access::Scatter));
        assert_eq!(Access::of_view(Input, &even_columns), Some(Access::Read));
        assert_eq!(Access::of_view(InOut, &even_columns), Some(Access::Update));
        assert_eq!(Access::of_view(NoDep, &even_columns), None);
    }
}
