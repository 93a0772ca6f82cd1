//! host_build_graph (spec §6.4): the orchestration runs on the host against a graph builder;
//! the finished graph is written into a runtime image and uploaded; the AICPU threads only
//! schedule.
//!
//! - `builder`: `GraphBuilder`, the ops-table implementation that records tasks, derives
//!   dependencies from tensor byte footprints and enforces the capacity rules on the host.
//! - `image`: writes a built graph into the image layout of `abi::image`.

pub(crate) mod builder;
pub(crate) mod image;
