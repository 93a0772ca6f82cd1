//! `TensormapAndRingbuffer`, this runtime's `ChipRuntime`: binding a run checks the
//! orchestration's arguments on the host, resolves the ring sizes, takes the arena from the
//! runner's device memory and writes the image; the orchestration itself runs on the device.
//! `TrbRun` reads the latched status, the orchestration's report and the device timing back.

use std::time::Duration;

use simpler_types::{CallConfig, DumpArgsLevel, RunId, SwimlaneLevel};

use super::image::{TrbImage, TrbReport, write_image};
use super::sizing;
use super::storage::{ArenaLayout, ArenaShape, MAX_ENTRY_TENSORS};
use crate::abi::codes::RuntimeCode;
use crate::aicpu::view::HostImageView;
use crate::callable::{OrchArgs, Orchestration};
use crate::diag::timing::RunPhases;
use crate::diag::{self, Exporter, Outcome};
use crate::error::{DeviceError, RingSizes, RuntimeFault};
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
    block_dim: u32,
    threads: u32,
    scheduler_budget: Duration,
}

impl ChipRuntime for TensormapAndRingbuffer {
    /// One orchestrating and three scheduling, as the original runs trb on A2/A3.
    fn default_aicpu_threads(&self) -> u32 {
        TRB_DEFAULT_AICPU_THREADS
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
        // The diagnostics collectors are host_build_graph's; asking trb for them must not
        // quietly produce no files.
        let diagnostic = [
            ("dep_gen", config.dep_gen()),
            ("scope_stats", config.scope_stats()),
            ("swimlane", config.swimlane() != SwimlaneLevel::Off),
            ("dump_args", config.dump_args() != DumpArgsLevel::Off),
            ("pmu", config.pmu().is_some()),
        ];
        if let Some((name, _)) = diagnostic.iter().find(|(_, on)| *on) {
            return Err(DeviceError::Unsupported {
                run_id,
                feature: format!(
                    "{name} under tensormap_and_ringbuffer (diagnostics are collected by \
                     host_build_graph only; run with RuntimeVariant::HostBuildGraph)"
                ),
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
        let Orchestration::Native { entry, config } = inp.callable.orchestration().clone() else {
            return Err(DeviceError::InvalidCallable {
                run_id: Some(run_id),
                reason: "tensormap_and_ringbuffer on this platform needs a Native orchestration"
                    .into(),
            });
        };
        check_arg_count(run_id, config, &OrchArgs::new(inp.tensors, inp.tags, inp.scalars))?;
        if inp.tensors.len() > MAX_ENTRY_TENSORS {
            return Err(DeviceError::InvalidArgs {
                run_id: Some(run_id),
                message: format!(
                    "the chip entry has {} tensors; a tensormap_and_ringbuffer orchestration \
                     takes at most {MAX_ENTRY_TENSORS}",
                    inp.tensors.len()
                ),
            });
        }
        let sizes = sizing::resolve(Some(run_id), inp.config, inp.rings)?;
        let too_large = || DeviceError::InvalidArgs {
            run_id: Some(run_id),
            message: "the ring sizes are too large for one arena".into(),
        };
        let arena = ArenaLayout::of(ArenaShape::of(sizes)).ok_or_else(too_large)?;
        // The runner keeps this allocation per slot and reuses it while it is large enough, so
        // runs of one sizing allocate their arena once.
        let arena_base = mem.heap_arena(arena.len)?;
        let frame = ImageInputs {
            block_dim: inp.block_dim,
            aicpu_threads: inp.threads,
            profiling: 0,
            swimlane_capacity: 0,
            swimlane_level: 0,
            aicpu_swimlane_capacity: 0,
            active_callable: inp.stamp,
            func_table: inp.func_table,
        };
        let trb = TrbImage {
            orch_entry: entry as usize as u64,
            arena_base,
            arena,
            tensors: inp.tensors,
            tags: inp.tags,
            scalars: inp.scalars,
        };
        write_image(host_image, &frame, &trb).ok_or_else(|| DeviceError::InvalidArgs {
            run_id: Some(run_id),
            message: "the arguments are too large for a runtime image".into(),
        })?;
        Ok(Box::new(TrbRun {
            block_dim: inp.block_dim,
            threads: inp.threads,
            scheduler_budget: self.scheduler_budget,
        }))
    }
}

impl BoundRun for TrbRun {
    fn profiling(&self) -> u32 {
        0
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

    fn export(&self, _: Option<&HostImageView<'_>>, _: Outcome, _: &mut Exporter<'_>) {}
}
