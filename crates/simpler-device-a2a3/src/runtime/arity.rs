//! A kernel's arity: what its signature says a task must pass it, and the submit check that
//! holds every task to it.
//!
//! A kernel tells its tensor slots from its scalar slots by its own signature only
//! (`KernelCall::from_raw`), so a task that passed fewer tensors than the kernel declares would
//! have it take scalars, or unset slots, for descriptor addresses; a tensor the kernel writes
//! but the task tags as read-only would be written while readers the runtime let run beside it
//! read it. Both runtimes therefore refuse, at submit, a task whose tensor count, scalar count
//! or tags do not match the signature of every kernel it names.

use std::fmt;

use simpler_types::TensorArgType;

use crate::abi::image::{KernelArity, NO_FUNC};
use crate::callable::{ArgDirection, CORE_SIGNATURE_MAX};

/// The arity of kernel `func_id` with `signature` (at most [`CORE_SIGNATURE_MAX`] entries, as
/// registration checks).
pub(crate) fn arity_of(func_id: u32, signature: &[ArgDirection]) -> KernelArity {
    const _: () = assert!(CORE_SIGNATURE_MAX <= 32, "one bit per tensor in a u32");
    let mut a = KernelArity { func_id, ..KernelArity::default() };
    for d in signature {
        let bit = 1u32.checked_shl(u32::from(a.tensors)).unwrap_or(0);
        match d {
            ArgDirection::Scalar => {
                a.scalars += 1;
                continue;
            }
            ArgDirection::In => a.reads |= bit,
            ArgDirection::Out => a.writes |= bit,
            ArgDirection::InOut => {
                a.reads |= bit;
                a.writes |= bit;
            }
        }
        a.tensors += 1;
    }
    a
}

/// The record of `func_id` among `kernels` (ascending func id).
pub(crate) fn find(kernels: &[KernelArity], func_id: u32) -> Option<&KernelArity> {
    kernels.binary_search_by_key(&func_id, |k| k.func_id).ok().map(|i| &kernels[i])
}

/// How a task's arguments differ from a kernel's signature.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum ArityMismatch {
    /// No record of the kernel (the func id is checked registered before, so the records and
    /// the func table disagree).
    Unknown {
        /// The kernel's.
        func_id: u32,
    },
    /// The counts differ.
    Counts {
        /// The kernel's.
        func_id: u32,
        /// Tensors and scalars the signature declares.
        declared: (u16, u16),
        /// Tensors and scalars the task passes.
        passed: (usize, usize),
    },
    /// Tensor `index` is tagged for less than the kernel does with it.
    Tag {
        /// The kernel's.
        func_id: u32,
        /// The tensor.
        index: usize,
        /// Its tag.
        tag: TensorArgType,
        /// What the tag leaves out: the kernel writes the tensor (else: reads it).
        written: bool,
    },
}

impl fmt::Display for ArityMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ArityMismatch::Unknown { func_id } => {
                write!(f, "func id {func_id} has no signature in the image")
            }
            ArityMismatch::Counts { func_id, declared, passed } => write!(
                f,
                "func id {func_id} takes {} tensors and {} scalars; the task passes {} and {}",
                declared.0, declared.1, passed.0, passed.1
            ),
            ArityMismatch::Tag { func_id, index, tag, written } => {
                let does = if written { "writes" } else { "reads" };
                write!(f, "func id {func_id} {does} tensor {index}, which the task tags {tag}")
            }
        }
    }
}

impl std::error::Error for ArityMismatch {}

/// Whether a task running the kernels `funcs` (unused members [`NO_FUNC`]) with tensors tagged
/// `tags` and `scalars` scalars fits each one's record among `kernels`, as [`check`] says.
pub(crate) fn check_task(
    kernels: &[KernelArity],
    funcs: &[i32; 3],
    tags: &[TensorArgType],
    scalars: usize,
) -> Result<(), ArityMismatch> {
    for &f in funcs.iter().filter(|&&f| f != NO_FUNC) {
        let func_id = f as u32;
        let k = find(kernels, func_id).ok_or(ArityMismatch::Unknown { func_id })?;
        check(k, tags, scalars)?;
    }
    Ok(())
}

/// The tensors any of the kernels `funcs` (unused members [`NO_FUNC`]) writes, a bit per
/// argument; kernels not among `kernels` write nothing here ([`check_task`] refuses them).
pub(crate) fn writes_of(kernels: &[KernelArity], funcs: &[i32; 3]) -> u64 {
    let named = funcs.iter().filter(|&&f| f != NO_FUNC);
    named.filter_map(|&f| find(kernels, f as u32)).fold(0, |m, k| m | u64::from(k.writes))
}

/// Whether a task passing tensors tagged `tags` and `scalars` scalars fits kernel `k`: the
/// counts match, a tensor the kernel reads is tagged to read (`Input`, `InOut`), one it writes
/// is tagged to write (`Output`, `OutputExisting`, `InOut`), and `NoDep` fits either (the
/// caller orders that tensor's accesses).
pub(crate) fn check(
    k: &KernelArity,
    tags: &[TensorArgType],
    scalars: usize,
) -> Result<(), ArityMismatch> {
    if tags.len() != usize::from(k.tensors) || scalars != usize::from(k.scalars) {
        return Err(ArityMismatch::Counts {
            func_id: k.func_id,
            declared: (k.tensors, k.scalars),
            passed: (tags.len(), scalars),
        });
    }
    for (index, &tag) in tags.iter().enumerate() {
        let bit = 1u32 << index;
        let untracked = tag == TensorArgType::NoDep;
        let unwritten = k.writes & bit != 0 && !tag.writes();
        let unread = k.reads & bit != 0 && !tag.reads();
        if !untracked && (unwritten || unread) {
            return Err(ArityMismatch::Tag { func_id: k.func_id, index, tag, written: unwritten });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ArgDirection::{In, InOut, Out, Scalar};
    use TensorArgType::{Input, NoDep, Output, OutputExisting};

    #[test]
    fn a_signature_counts_its_tensors_and_scalars_and_marks_their_use() {
        let a = arity_of(7, &[In, Out, InOut, Scalar, Scalar]);
        assert_eq!(
            a,
            KernelArity { func_id: 7, tensors: 3, scalars: 2, reads: 0b101, writes: 0b110 }
        );
    }

    #[test]
    fn a_task_must_pass_what_the_signature_declares_tagged_for_what_the_kernel_does() {
        let add = arity_of(0, &[In, In, Out]);
        assert_eq!(check(&add, &[Input, Input, Output], 0), Ok(()));
        assert_eq!(check(&add, &[Input, TensorArgType::InOut, OutputExisting], 0), Ok(()));
        assert_eq!(check(&add, &[NoDep, NoDep, NoDep], 0), Ok(()));
        let no_tensors = check(&add, &[], 3).unwrap_err();
        assert_eq!(
            no_tensors.to_string(),
            "func id 0 takes 3 tensors and 0 scalars; the task passes 0 and 3"
        );
        assert!(check(&add, &[Input, Input, Output], 1).is_err());
        let read_only = check(&add, &[Input, Input, Input], 0).unwrap_err();
        assert_eq!(read_only.to_string(), "func id 0 writes tensor 2, which the task tags INPUT");
        let blind = check(&arity_of(1, &[InOut]), &[Output], 0).unwrap_err();
        assert_eq!(blind.to_string(), "func id 1 reads tensor 0, which the task tags OUTPUT");
    }

    #[test]
    fn records_are_found_by_func_id() {
        let ks = [arity_of(2, &[In]), arity_of(5, &[]), arity_of(900, &[Out])];
        assert_eq!(find(&ks, 5).map(|k| k.func_id), Some(5));
        assert!(find(&ks, 3).is_none());
    }
}
