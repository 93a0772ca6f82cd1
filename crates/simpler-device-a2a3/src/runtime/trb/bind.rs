//! `TensormapAndRingbuffer`, this runtime's `ChipRuntime`: binding a run checks the
//! orchestration's arguments on the host, resolves the ring sizes, takes the arena from the
//! runner's device memory and writes the image; the orchestration itself runs on the device.
//! `TrbRun` reads the latched status, the orchestration's report and the device timing back,
//! and exports the diagnostics the device recorded (`diag`).

use std::time::Duration;

use simpler_types::{CallConfig, RunId};

use super::diag::{
    self as trb_diag, AICPU_RECORDS_PER_THREAD, Replay, SCOPE_RECORDS, SUBMIT_RECORDS,
    SWIMLANE_RECORDS_PER_CORE, TrbDiagRecords,
};
use super::image::{TrbImage, TrbReport, write_image};
use super::sizing;
use super::storage::{ArenaLayout, ArenaShape, MAX_ENTRY_TENSORS, MAX_TASK_TENSORS};
use crate::abi::codes::RuntimeCode;
use crate::abi::image::{KernelArity, ORCH_KIND_C, ORCH_KIND_NATIVE};
use crate::abi::launch::{PROFILE_DEP_GEN, PROFILE_SCOPE_STATS, PROFILE_SWIMLANE};
use crate::aicpu::view::HostImageView;
use crate::callable::{ArgDirection, ChipCallable, OrchArgs, Orchestration};
use crate::diag::swimlane::SwimlaneCapture;
use crate::diag::timing::RunPhases;
use crate::diag::{self, DiagPlan, Exporter, Outcome};
use crate::error::{
    ArgOverlap, ArgsProblem, CallableProblem, DeviceError, RingSizes, RuntimeFault,
};
use crate::runner::{RingHighWater, RunReport};
use crate::runtime::hbg::check_arg_count;
use crate::runtime::hbg::image::ImageInputs;
use crate::runtime::{BindInputs, BoundRun, BuildEnv, ChipRuntime};

/// The tensormap_and_ringbuffer runtime.
#[derive(Debug)]
pub(crate) struct TensormapAndRingbuffer {
    /// The scheduler no-progress budget, reported with a latched scheduler timeout.
    scheduler_budget: Duration,
}

impl TensormapAndRingbuffer {
    /// The runtime of a runner whose scheduler budget is `scheduler_budget`.
    pub(crate) fn new(scheduler_budget: Duration) -> TensormapAndRingbuffer {
        TensormapAndRingbuffer { scheduler_budget }
    }
}

/// AICPU threads of a trb run that does not set `CallConfig::aicpu_thread_num`.
pub(crate) const TRB_DEFAULT_AICPU_THREADS: u32 = 4;

/// A bound trb run.
#[derive(Debug)]
pub(crate) struct TrbRun {
    run_id: RunId,
    block_dim: u32,
    threads: u32,
    scheduler_budget: Duration,
    profiling: u32,
    /// The callable's kernels (for the dependency-graph replay).
    kernels: Vec<KernelArity>,
    /// Kernel names by func id, for `deps.dot` and the swimlane trace.
    kernel_names: diag::dot::KernelNames,
    plan: DiagPlan,
}

impl ChipRuntime for TensormapAndRingbuffer {
    /// One orchestrating and three scheduling, as the original runs trb on A2/A3.
    fn default_aicpu_threads(&self) -> u32 {
        TRB_DEFAULT_AICPU_THREADS
    }

    /// A task's dispatch record holds at most [`MAX_TASK_TENSORS`] tensors, and every task of a
    /// kernel passes exactly the tensors its signature declares: a kernel declaring more could
    /// never run.
    fn check_callable(&self, callable: &ChipCallable) -> Result<(), DeviceError> {
        for (func_id, k) in callable.children() {
            let tensors = k.signature().iter().filter(|d| **d != ArgDirection::Scalar).count();
            if tensors > MAX_TASK_TENSORS {
                return Err(DeviceError::InvalidCallable {
                    run_id: None,
                    problem: CallableProblem::TooManyTensors {
                        func_id: *func_id,
                        name: k.name().map(str::to_owned),
                        tensors,
                        max: MAX_TASK_TENSORS,
                    },
                });
            }
        }
        Ok(())
    }

    fn check_config(&self, run_id: Option<RunId>, config: &CallConfig) -> Result<(), DeviceError> {
        // One thread orchestrates; at least one must schedule (0 asks for the default, 4).
        if config.aicpu_thread_num() == 1 {
            return Err(DeviceError::InvalidConfig {
                run_id,
                setting: "aicpu_thread_num".into(),
                value: config.aicpu_thread_num().to_string(),
                rule: "at least 2 under tensormap_and_ringbuffer (one orchestrates)".into(),
            });
        }
        Ok(())
    }

    fn bind(
        &mut self,
        inp: &BindInputs<'_>,
        mem: &mut dyn BuildEnv,
        host_image: &mut Vec<u8>,
    ) -> Result<Box<dyn BoundRun>, DeviceError> {
        let run_id = inp.run_id;
        // A `Native` orchestration's argument count is checked here; a C one's config function
        // runs on the AICPU, which checks it there.
        let (orch_entry, orch_config, orch_kind) =
            match (inp.callable.orchestration(), inp.device_orchestration) {
                (Orchestration::Native { entry, config }, _) => {
                    let args = OrchArgs::new(inp.tensors, inp.tags, inp.scalars);
                    check_arg_count(run_id, *config, &args)?;
                    (*entry as usize as u64, 0, ORCH_KIND_NATIVE)
                }
                (Orchestration::DeviceObject(_), Some(d)) => (d.entry, d.config, ORCH_KIND_C),
                (Orchestration::DeviceObject(o), None) => {
                    return Err(DeviceError::InvalidCallable {
                        run_id: Some(run_id),
                        problem: CallableProblem::OrchestrationNotLoaded {
                            entry: o.entry().to_owned(),
                        },
                    });
                }
            };
        if inp.tensors.len() > MAX_ENTRY_TENSORS {
            return Err(DeviceError::InvalidArgs {
                run_id: Some(run_id),
                problem: ArgsProblem::TooManyEntryTensors {
                    tensors: inp.tensors.len(),
                    max: MAX_ENTRY_TENSORS,
                },
            });
        }
        let sizes = sizing::resolve(Some(run_id), inp.config, inp.rings)?;
        let too_large = || DeviceError::InvalidArgs {
            run_id: Some(run_id),
            problem: ArgsProblem::RingsTooLarge {
                sizes: Box::new(sizes.map(|r| RingSizes {
                    task_window: u64::from(r.task_window),
                    heap_bytes: r.heap_bytes,
                    dep_pool: u64::from(r.dep_pool),
                })),
            },
        };
        let arena = ArenaShape::of(sizes).and_then(ArenaLayout::of).ok_or_else(too_large)?;
        // The runner keeps this allocation per slot and reuses it while it is large enough, so
        // runs of one sizing allocate their arena once.
        let heap = mem.heap_arena(arena.len)?;
        // Profiling flags and record capacities: the device buffers are fixed, whatever the
        // graph's size, since the graph is built during the run.
        let plan = inp.diag.clone();
        let mut profiling = 0;
        if plan.swimlane > 0 {
            profiling |= PROFILE_SWIMLANE;
        }
        if plan.dep_gen {
            profiling |= PROFILE_DEP_GEN;
        }
        if plan.scope_stats {
            profiling |= PROFILE_SCOPE_STATS;
        }
        let frame = ImageInputs {
            block_dim: inp.block_dim,
            aicpu_threads: inp.threads,
            profiling,
            swimlane_capacity: if plan.swimlane > 0 { SWIMLANE_RECORDS_PER_CORE } else { 0 },
            swimlane_level: plan.swimlane,
            aicpu_swimlane_capacity: if plan.swimlane >= 2 { AICPU_RECORDS_PER_THREAD } else { 0 },
            active_callable: inp.stamp,
            func_table: inp.func_table,
        };
        let trb = TrbImage {
            orch_entry,
            orch_config,
            orch_kind,
            arena_base: heap.addr,
            arena_kept: heap.kept,
            arena,
            tensors: inp.tensors,
            tags: inp.tags,
            scalars: inp.scalars,
            kernels: inp.kernels,
            scope_records: if plan.scope_stats || plan.dep_gen { SCOPE_RECORDS } else { 0 },
            submit_records: if plan.dep_gen { SUBMIT_RECORDS } else { 0 },
        };
        write_image(host_image, &frame, &trb).ok_or(DeviceError::InvalidArgs {
            run_id: Some(run_id),
            problem: ArgsProblem::ImageTooLarge,
        })?;
        let kernel_names = if plan.dep_gen || plan.swimlane > 0 {
            diag::dot::kernel_names(inp.callable.children())
        } else {
            diag::dot::KernelNames::new()
        };
        Ok(Box::new(TrbRun {
            run_id,
            block_dim: inp.block_dim,
            threads: inp.threads,
            scheduler_budget: self.scheduler_budget,
            profiling,
            kernels: if plan.dep_gen { inp.kernels.to_vec() } else { Vec::new() },
            kernel_names,
            plan,
        }))
    }
}

impl TrbRun {
    /// The run's submit records replayed on the host; disagreements and lost records become
    /// report warnings.
    fn replay(&self, records: &TrbDiagRecords, out: &mut Exporter<'_>) -> Option<Replay> {
        if records.submit_dropped > 0 {
            out.warn(format!(
                "dep_gen: {} submits did not fit the device's {SUBMIT_RECORDS} records; deps.json \
                 holds the first {SUBMIT_RECORDS} and is marked incomplete",
                records.submit_dropped
            ));
        }
        match trb_diag::replay(records, self.run_id, self.block_dim, &self.kernels) {
            Ok(r) => {
                if let Some(first) = r.mismatches.first() {
                    out.warn(format!(
                        "dep_gen: {} edges differ between the device's wiring and the tensor-map \
                         replay (first: {first})",
                        r.mismatches.len()
                    ));
                }
                Some(r)
            }
            Err(e) => {
                out.warn(format!("dep_gen: no deps.json: {e}"));
                None
            }
        }
    }
}

impl BoundRun for TrbRun {
    fn profiling(&self) -> u32 {
        self.profiling
    }

    fn describe(&self, _: &mut RunReport) {}

    fn read_back(&self, image: &HostImageView<'_>, report: &mut RunReport) {
        let Some(status) = image.trb_status() else { return };
        let r = TrbReport::read(status);
        report.tasks = u32::try_from(r.submitted).unwrap_or(u32::MAX);
        for (hw, p) in report.rings.iter_mut().zip(r.peaks) {
            *hw = RingHighWater { task_window_max: p[0], heap_max: p[1], dep_pool_max: p[2] };
        }
        report.tensormap_max = r.map_peak;
        report.arena_reused = r.arena_partial_reset;
    }

    fn latched_status(&self, image: &HostImageView<'_>) -> Option<RuntimeFault> {
        use std::sync::atomic::Ordering::Acquire;
        let shared = image.shared();
        let mut fault =
            super::super::latched_status(shared, self.block_dim, self.scheduler_budget)?;
        if shared.orch_error_code.load(Acquire) == 0 {
            return Some(fault);
        }
        // The orchestration thread latched it: its message, and for a ring stall the ring's
        // sizes and usage.
        fault.thread = Some(self.threads.saturating_sub(1));
        if let Some(status) = image.trb_status() {
            fault.message = TrbReport::read(status).message;
        }
        if fault.code == RuntimeCode::OverlappingArguments {
            let [task, written, other] = shared.fault_usage.each_ref().map(|c| c.load(Acquire));
            let index = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
            fault.overlap = Some(ArgOverlap { task, written: index(written), other: index(other) });
        }
        let ring = shared.fault_ring.load(Acquire);
        if ring != u32::MAX && fault.code != RuntimeCode::InvalidArgs {
            let read = |v: &[std::sync::atomic::AtomicU64; 3]| RingSizes {
                task_window: v[0].load(Acquire),
                heap_bytes: v[1].load(Acquire),
                dep_pool: v[2].load(Acquire),
            };
            fault.ring = u8::try_from(ring).ok();
            fault.sizes = Some(read(&shared.fault_sizes));
            fault.usage = Some(read(&shared.fault_usage));
        }
        Some(fault)
    }

    fn timing(
        &self,
        image: &HostImageView<'_>,
        launch_ticks: u64,
    ) -> Option<(Duration, RunPhases)> {
        diag::timing::wall_and_phases(launch_ticks, &diag::timing::phases(image, self.threads))
    }

    fn export(&self, image: Option<&HostImageView<'_>>, outcome: Outcome, out: &mut Exporter<'_>) {
        // Everything trb knows about the graph was recorded on the device.
        let Some(image) = image else { return };
        let records = TrbDiagRecords::read(image);
        let replay = if self.plan.dep_gen { self.replay(&records, out) } else { None };
        let ids = |i: u32| replay.as_ref().map_or(0, |r| r.ids[i as usize]);
        if self.plan.swimlane > 0 {
            let capture = SwimlaneCapture::read(image, self.plan.swimlane, self.threads);
            out.report().swimlane_dropped = capture.total_dropped();
            let edges: Vec<(u64, u64)> = replay.as_ref().map_or_else(Vec::new, |r| {
                r.graph.edges.iter().map(|e| (ids(e.pred), ids(e.succ))).collect()
            });
            diag::swimlane::export(out, &capture, &edges, &self.kernel_names);
        }
        if let Some(r) = &replay {
            let complete = outcome == Outcome::Success && records.submit_dropped == 0;
            let deps = diag::deps::deps_json(&r.graph, &ids, complete, out.origin());
            out.write("deps.json", deps.to_string().as_bytes());
            let dot = diag::dot::deps_dot(&r.graph, &self.kernel_names, out.origin());
            out.write("deps.dot", dot.as_bytes());
        }
        if self.plan.scope_stats {
            if records.scope_dropped > 0 {
                out.warn(format!(
                    "scope_stats: {} scope events did not fit the device's {SCOPE_RECORDS} records",
                    records.scope_dropped
                ));
            }
            let fatal = outcome != Outcome::Success;
            let text = trb_diag::scope_stats(&records, out.report(), fatal);
            out.write("scope_stats/scope_stats.jsonl", text.as_bytes());
        }
    }
}
