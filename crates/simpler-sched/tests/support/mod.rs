//! Shared machinery of the engine's randomized tests (`stress`, `engine_model`).
//!
//! A test describes each run as a [`plan::RunPlan`]: a list of submits, allocs and scope
//! operations over a few shared buffers, plus how the run ends (close, fail, abort, a dropped
//! builder, or an engine shutdown). The plan is executed against a real [`simpler_sched::Engine`]
//! whose endpoints ([`endpoint::PlanEndpoint`]) do what the plan scripted for each member (succeed,
//! fail, panic, sleep) and record when they started and finished. A reference model
//! ([`model::RunModel`], plain std collections) infers each task's producers independently of
//! the engine from the tags and byte footprints (`docs/tensormap.md`),
//! and [`driver`] checks the engine's behaviour against it after every run and every engine.

#![allow(dead_code, reason = "each test binary uses a different part of the support module")]

pub mod driver;
pub mod endpoint;
pub mod env;
pub mod model;
pub mod plan;
pub mod strategy;
