//! Output of `cargo xtask bindgen` (see the crate docs); only this file is written by hand.

/// The CANN typedefs, structs, unions and constants of the project header.
#[allow(
    missing_docs,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]
pub mod types;

/// The C signature and the lazily resolved slot of every listed function.
#[allow(non_camel_case_types, non_snake_case)]
pub(crate) mod slots;

#[allow(non_snake_case, unused_imports, clippy::too_many_arguments)]
mod acl;
#[allow(non_snake_case, unused_imports, clippy::too_many_arguments)]
mod dlog;
#[allow(non_snake_case, unused_imports, clippy::too_many_arguments)]
mod hal;
#[cfg(feature = "hccl")]
#[allow(non_snake_case, unused_imports, clippy::too_many_arguments)]
mod hccl;
#[allow(non_snake_case, unused_imports, clippy::too_many_arguments)]
mod rt;
