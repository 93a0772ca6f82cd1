//! The chip runtimes (spec §6).
//!
//! - [`orch`]: the orchestration ops table and the safe `OrchCtx` (shared by both runtimes).
//! - [`hbg`]: host_build_graph — the graph is built on the host and uploaded whole.
//!
//! The tensormap_and_ringbuffer runtime (spec §6.5) is not built yet; a runner attached with
//! that variant reports `Unsupported` at prepare.

pub mod hbg;
pub mod orch;
