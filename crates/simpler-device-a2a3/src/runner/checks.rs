//! Device setup and the checks every call makes before touching the device: initialization,
//! statistics, the run-state refusals of memory calls and the device rules of a run's
//! configuration (preparation step 3).
//!
//! Step labels (P1–P18, L1–L3, R1–R3, C1–C3) are the run-lifecycle steps defined in
//! `docs/device-runner.md`.

use std::time::Duration;

use simpler_types::{CallConfig, RunId};

use super::{Core, MemoryLedger, RunnerStats, Stage, busy, unusable};
use crate::abi::launch::InitArgs;
use crate::abi::{ABI_VERSION, MAX_AICPU_THREADS, MAX_BLOCK_DIM};
use crate::error::{DeviceError, InitFailure, InitStep, MemPurpose};

impl Core {
    pub(super) fn stats(&self) -> RunnerStats {
        let counts = self.backend.memory_counts();
        let threads = self.backend.thread_stats();
        RunnerStats {
            live_allocations: self.user_allocs.len() as u64,
            sim_threads_spawned: threads.spawned,
            sim_threads_alive: threads.alive,
            sim_threads_parked: threads.parked,
            memory: MemoryLedger {
                committed: counts.committed,
                user_allocations: counts.user_bytes,
                pooled_arenas: counts.pooled_bytes,
                runtime_buffers: counts.runtime_bytes,
            },
            ..self.stats
        }
    }

    pub(super) fn ensure_initialized(&mut self) -> Result<(), DeviceError> {
        if self.initialized {
            return Ok(());
        }
        // Steps 1 and 2: streams, core limit, device programs (the simulator's persistent
        // AICPU threads).
        self.backend.start_programs()?;
        self.max_block_dim = self.backend.max_block_dim().min(MAX_BLOCK_DIM);
        // The register table every run uses (P9); each resource slot allocates its own
        // KernelArgs block (P16) on its first run.
        if self.regs_table.is_none() {
            let table = self.backend.register_table()?;
            let bytes: &[u8] = bytemuck::cast_slice(&table);
            let len = bytes.len() as u64;
            // What the device refused keeps its typed error.
            let a = self.backend.malloc(len, MemPurpose::Runtime).map_err(|f| match f {
                #[cfg(feature = "onboard")]
                crate::backend::AllocFailure::Refused(e) => *e,
                _ => DeviceError::Init {
                    run_id: None,
                    step: InitStep::QueryCores,
                    failure: InitFailure::RegisterTable { bytes: len },
                },
            })?;
            if let Err(e) = self.backend.write(a, bytes) {
                self.backend.free(a);
                return Err(e);
            }
            self.regs_table = Some(a);
        }
        // Step 3: AICPU init.
        let ms = |d: Duration| d.as_millis().clamp(1, u128::from(u32::MAX)) as u32;
        self.backend.init_aicpu(InitArgs {
            abi_version: ABI_VERSION,
            device_id: self.opts.device_id,
            log_level: 1,
            scheduler_timeout_ms: ms(self.timeouts.scheduler),
            shutdown_budget_ms: ms(self.opts.budgets.shutdown_ack),
            tensor_wait_ms: ms(self.opts.budgets.tensor_wait),
            dma_workspace: [0; 2],
        })?;
        self.initialized = true;
        Ok(())
    }

    /// Refuses calls that would invalidate addresses a prepared or launched run's image holds.
    pub(super) fn refuse_while_referenced(&self, call: &'static str) -> Result<(), DeviceError> {
        match self.runs().find(|r| matches!(r.stage, Stage::Prepared | Stage::Launched)) {
            Some(r) => Err(busy(call, r.stage.describe())),
            None => Ok(()),
        }
    }

    /// The checks of a host copy: healthy, no launched run, a user range.
    pub(super) fn check_copy(
        &self,
        call: &'static str,
        addr: u64,
        len: u64,
    ) -> Result<(), DeviceError> {
        unusable(self)?;
        if self.launched().is_some() {
            return Err(busy(call, Stage::Launched.describe()));
        }
        self.check_user_range(addr, len)
    }

    /// P3: device rules on a valid `CallConfig`. Returns `(block_dim, threads)`.
    pub(super) fn device_rules(
        &self,
        run_id: Option<RunId>,
        cfg: &CallConfig,
    ) -> Result<(u32, u32), DeviceError> {
        let invalid = |setting: &str, value: u32, rule: String| DeviceError::InvalidConfig {
            run_id,
            setting: setting.into(),
            value: value.to_string(),
            rule,
        };
        let threads = match cfg.aicpu_thread_num() {
            0 => self.runtime.default_aicpu_threads(),
            n => n,
        };
        if threads > MAX_AICPU_THREADS {
            return Err(invalid(
                "CallConfig.aicpu_thread_num",
                cfg.aicpu_thread_num(),
                format!(
                    "must be in 1..={MAX_AICPU_THREADS} (0 = the runtime's default, {})",
                    self.runtime.default_aicpu_threads()
                ),
            ));
        }
        if cfg.block_dim() > self.max_block_dim {
            return Err(invalid(
                "CallConfig.block_dim",
                cfg.block_dim(),
                format!("must be at most {} on this device (0 = auto)", self.max_block_dim),
            ));
        }
        let unsupported = |feature: &str| DeviceError::Unsupported {
            run_id,
            feature: feature.into(),
            cause: None,
        };
        if cfg.pmu().is_some() {
            return Err(unsupported("PMU capture (CallConfig.pmu)"));
        }
        if cfg.dump_args() != simpler_types::DumpArgsLevel::Off {
            return Err(unsupported("argument dumps (CallConfig.dump_args)"));
        }
        self.runtime.check_config(run_id, cfg)?;
        if cfg.diagnostics_any()
            && let Some(prefix) = cfg.output_prefix()
        {
            std::fs::create_dir_all(prefix).map_err(|source| DeviceError::OutputDirectory {
                run_id,
                path: prefix.to_owned(),
                source,
            })?;
        }
        let block_dim = match cfg.block_dim() {
            0 => self.backend.default_block_dim().min(self.max_block_dim),
            b => b,
        };
        Ok((block_dim, threads))
    }
}
