//! host_build_graph: the orchestration runs on the host against a graph builder; the finished
//! graph is written into a runtime image and uploaded; the AICPU threads only schedule.
//!
//! - `builder`: `GraphBuilder`, the ops-table implementation that records tasks, derives
//!   dependencies from tensor byte footprints and enforces the capacity rules on the host.
//! - `image`: writes a built graph into the image layout of `abi::image`.
//!
//! `HostBuildGraph` is this runtime's `ChipRuntime`: binding a run calls the
//! orchestration's config function and entry (user code, inside `catch_unwind`), builds the
//! graph and writes the image; the `HbgRun` it returns reads the run back and exports the
//! dependency graph, scope statistics and swimlane files.

pub(crate) mod builder;
pub(crate) mod image;

use std::ffi::c_void;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use simpler_types::DeviceTaskId;

use self::builder::{BuildEnv, BuildLimits, BuildScratch, BuiltGraph, GraphBuilder, HBG_OPS};
use self::image::{ImageInputs, ImageScratch, total_dispatches, write_image};
use super::{BindInputs, BoundRun, ChipRuntime};
use crate::abi::codes::RuntimeCode;
use crate::abi::launch::{PROFILE_DEP_GEN, PROFILE_SCOPE_STATS, PROFILE_SWIMLANE};
use crate::aicpu::view::HostImageView;
use crate::callable::{OrchArgs, Orchestration};
use crate::diag::swimlane::SwimlaneCapture;
use crate::diag::timing::RunPhases;
use crate::diag::{self, DiagPlan, Exporter, Outcome};
use crate::error::{ArgsProblem, CallableProblem, DeviceError, OrchFailure, RuntimeFault};
use crate::runner::{RingHighWater, RunReport};
use crate::runtime::orch::OrchCtx;

/// Most swimlane records kept per core per run.
const SWIMLANE_CAPACITY_MAX: u64 = 1 << 16;

/// The host_build_graph runtime.
#[derive(Debug)]
pub(crate) struct HostBuildGraph {
    /// The scheduler no-progress budget, reported with a latched scheduler timeout.
    scheduler_budget: Duration,
    /// Kept across runs, so binding a run of a shape seen before allocates nothing per task.
    build: BuildScratch,
    image: ImageScratch,
}

impl HostBuildGraph {
    /// The runtime of a runner whose scheduler budget is `scheduler_budget`.
    pub(crate) fn new(scheduler_budget: Duration) -> HostBuildGraph {
        HostBuildGraph {
            scheduler_budget,
            build: BuildScratch::default(),
            image: ImageScratch::default(),
        }
    }
}

/// The sizes of a built graph a run report gives.
#[derive(Clone, Copy, Debug)]
struct GraphSize {
    tasks: usize,
    edges: usize,
    tensors: usize,
    heap_used: u64,
}

/// A bound host_build_graph run: the size of the graph it built and what the image records.
#[derive(Debug)]
pub(crate) struct HbgRun {
    size: GraphSize,
    /// The graph itself, kept only for the diagnostics that export it (`deps.json` and `deps.dot`,
    /// with the swimlane trace's edges, and scope statistics); otherwise it went back to the
    /// runtime's scratch.
    graph: Option<BuiltGraph>,
    /// Kernel names by func id, for `deps.dot` and the swimlane trace (filled only for them).
    kernel_names: diag::dot::KernelNames,
    diag: DiagPlan,
    block_dim: u32,
    threads: u32,
    profiling: u32,
    scheduler_budget: Duration,
}

/// The message of a caught panic payload.
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// Calls the orchestration's config function (user code: a panic is an orchestration failure
/// of the run, never an unwind out of `prepare`) and checks the chip entry has the arguments it
/// expects.
pub(crate) fn check_arg_count(
    run_id: simpler_types::RunId,
    config: crate::callable::NativeConfigFn,
    args: &OrchArgs<'_>,
) -> Result<(), DeviceError> {
    let expected = match std::panic::catch_unwind(AssertUnwindSafe(|| config(args))) {
        Ok(c) => c.expected_arg_count as usize,
        Err(p) => {
            let message = panic_text(&*p);
            return Err(DeviceError::Orchestration {
                run_id,
                failure: OrchFailure::ConfigPanicked { message },
            });
        }
    };
    if args.len() < expected {
        return Err(DeviceError::Runtime {
            run_id,
            fault: Box::new(RuntimeFault::new(
                RuntimeCode::InvalidArgs,
                format!(
                    "the orchestration expects {expected} arguments, the chip entry got {}",
                    args.len()
                ),
            )),
        });
    }
    Ok(())
}

impl ChipRuntime for HostBuildGraph {
    fn check_config(
        &self,
        _: Option<simpler_types::RunId>,
        _: &simpler_types::CallConfig,
    ) -> Result<(), DeviceError> {
        Ok(())
    }

    fn bind(
        &mut self,
        inp: &BindInputs<'_>,
        mem: &mut dyn BuildEnv,
        host_image: &mut Vec<u8>,
    ) -> Result<Box<dyn BoundRun>, DeviceError> {
        let run_id = inp.run_id;
        let (entry, config) = match inp.callable.orchestration() {
            Orchestration::Native { entry, config } => (*entry, *config),
            Orchestration::DeviceObject(o) => {
                return Err(DeviceError::InvalidCallable {
                    run_id: Some(run_id),
                    problem: CallableProblem::DeviceObjectUnderHostBuildGraph {
                        entry: o.entry().to_owned(),
                    },
                });
            }
        };
        let args = OrchArgs::new(inp.tensors, inp.tags, inp.scalars);
        let ring0 = inp.config.runtime_env()[0];
        let limits = BuildLimits {
            task_window: ring0.task_window.unwrap_or(inp.rings.task_window),
            heap_bytes: ring0.heap_bytes.unwrap_or(inp.rings.heap_bytes),
            block_dim: inp.block_dim,
            kernels: inp.kernels,
            check_arity: true,
        };
        check_arg_count(run_id, config, &args)?;
        let graph = {
            let mut builder = GraphBuilder::new(run_id, limits, mem, inp.tensors, &mut self.build);
            let rt = &mut builder as *mut GraphBuilder<'_> as *mut c_void;
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: `rt` is the builder above, exclusively borrowed by this call; the
                // HBG ops table's functions expect exactly that context.
                let mut ctx = unsafe { OrchCtx::new(&HBG_OPS, rt) };
                entry(&mut ctx, &args)
            }));
            match outcome {
                Err(p) => Err(DeviceError::Orchestration {
                    run_id,
                    failure: OrchFailure::Panicked { message: panic_text(&*p) },
                }),
                Ok(Err(e)) if !builder.has_error() => {
                    Err(DeviceError::Orchestration { run_id, failure: OrchFailure::Returned(e) })
                }
                Ok(_) => builder.finish(),
            }
        }?;
        // Profiling flags and swimlane capacity (preparation steps 10 and 12).
        let diag = inp.diag.clone();
        let mut profiling = 0;
        let mut swimlane_capacity = 0;
        let mut aicpu_swimlane_capacity = 0;
        if diag.swimlane > 0 {
            profiling |= PROFILE_SWIMLANE;
            swimlane_capacity = total_dispatches(&graph).clamp(1, SWIMLANE_CAPACITY_MAX) as u32;
            if diag.swimlane >= 2 {
                aicpu_swimlane_capacity = swimlane_capacity;
            }
        }
        if diag.dep_gen {
            profiling |= PROFILE_DEP_GEN;
        }
        if diag.scope_stats {
            profiling |= PROFILE_SCOPE_STATS;
        }
        let written = write_image(
            host_image,
            &graph,
            &ImageInputs {
                block_dim: inp.block_dim,
                aicpu_threads: inp.threads,
                profiling,
                swimlane_capacity,
                swimlane_level: diag.swimlane,
                aicpu_swimlane_capacity,
                active_callable: inp.stamp,
                func_table: inp.func_table,
            },
            &mut self.image,
        );
        let size = GraphSize {
            tasks: graph.tasks.len(),
            edges: graph.edge_count(),
            tensors: graph.tensors.len(),
            heap_used: graph.heap_used,
        };
        // Only the diagnostics that export the graph keep it; otherwise (and when the image
        // could not be written) it goes back to the scratch for the next build.
        let graph = if written.is_some() && (diag.dep_gen || diag.scope_stats) {
            Some(graph)
        } else {
            self.build.recycle(graph);
            None
        };
        written.ok_or(DeviceError::InvalidArgs {
            run_id: Some(run_id),
            problem: ArgsProblem::ImageTooLarge,
        })?;
        // `deps.dot` and the swimlane trace label tasks by kernel name; only named kernels are
        // listed.
        let kernel_names = if diag.dep_gen || diag.swimlane > 0 {
            diag::dot::kernel_names(inp.callable.children())
        } else {
            diag::dot::KernelNames::new()
        };
        Ok(Box::new(HbgRun {
            size,
            graph,
            kernel_names,
            diag,
            block_dim: inp.block_dim,
            threads: inp.threads,
            profiling,
            scheduler_budget: self.scheduler_budget,
        }))
    }
}

impl BoundRun for HbgRun {
    fn profiling(&self) -> u32 {
        self.profiling
    }

    fn describe(&self, report: &mut RunReport) {
        let g = self.size;
        report.tasks = g.tasks as u32;
        report.edges = g.edges as u64;
        report.rings[0] = RingHighWater {
            task_window_max: g.tasks as u64,
            heap_max: g.heap_used,
            dep_pool_max: g.edges as u64,
        };
        report.tensormap_max = g.tensors as u64;
    }

    fn latched_status(&self, image: &HostImageView<'_>) -> Option<RuntimeFault> {
        super::latched_status(image.shared(), self.block_dim, self.scheduler_budget)
    }

    fn timing(
        &self,
        image: &HostImageView<'_>,
        launch_ticks: u64,
    ) -> Option<(Duration, RunPhases)> {
        diag::timing::wall_and_phases(launch_ticks, &diag::timing::phases(image, self.threads))
    }

    fn export(&self, image: Option<&HostImageView<'_>>, outcome: Outcome, out: &mut Exporter<'_>) {
        if self.diag.swimlane > 0
            && let Some(image) = image
        {
            let capture = SwimlaneCapture::read(image, self.diag.swimlane, self.threads);
            out.report().swimlane_dropped = capture.total_dropped();
            // With `dep_gen` the graph is kept, and the trace shows its edges.
            let edges: Vec<(u64, u64)> = match &self.graph {
                Some(g) if self.diag.dep_gen => g
                    .edges
                    .iter()
                    .map(|e| (DeviceTaskId::new(0, e.pred).0, DeviceTaskId::new(0, e.succ).0))
                    .collect(),
                _ => Vec::new(),
            };
            diag::swimlane::export(out, &capture, &edges, &self.kernel_names);
        }
        let Some(g) = &self.graph else { return };
        // The graph exists on the host whatever happened on the device, so `deps.json` is
        // written on every outcome (marked incomplete unless the run succeeded).
        if self.diag.dep_gen {
            let ids = |i: u32| DeviceTaskId::new(0, i).0;
            let deps = diag::deps::deps_json(g, &ids, outcome == Outcome::Success, out.origin());
            out.write("deps.json", deps.to_string().as_bytes());
            out.write(
                "deps.dot",
                diag::dot::deps_dot(g, &self.kernel_names, out.origin()).as_bytes(),
            );
        }
        if self.diag.scope_stats && outcome != Outcome::FailedBeforeLaunch {
            out.write(
                "scope_stats/scope_stats.jsonl",
                diag::scopes::scope_stats_jsonl(g).as_bytes(),
            );
        }
    }
}
