//! `simpler` — run task DAGs on Ascend A2/A3 NPUs, from one chip up to many hosts.
//!
//! This facade re-exports the workspace's public crates, bottom-up. Each crate is usable on its
//! own; depend on this one to get all of them under one name.

#![forbid(unsafe_code)]

pub use simpler_device_a2a3 as device_a2a3;
pub use simpler_ring as ring;
pub use simpler_sched as sched;
pub use simpler_tensormap as tensormap;
pub use simpler_types as types;
pub use simpler_worker as worker;
