//! `CallConfig`: per-task configuration of a NEXT_LEVEL task, and its validating builder
//! (see `docs/types.md`).
//!
//! The fields are private and the only way to make a `CallConfig` other than `Default` is
//! [`CallConfigBuilder::build`], so an invalid configuration cannot exist. Cloning is cheap: the
//! only heap field, `output_prefix`, is an `Arc<Path>`, so copying a configuration into every
//! task is a reference-count bump.
//!
//! `build()` checks, in this order, and returns the first failure:
//! 1. swimlane level ≤ 4, dump-args level ≤ 3, PMU event in {1, 2, 4, 5, 6, 7, 8};
//! 2. every `RingSel::Ring(i)` has `i ≤ 3`;
//! 3. task windows (ring 0 first) are powers of two in `[4, 2^30]`;
//! 4. heap overrides are non-zero multiples of 1024 bytes;
//! 5. dependency pools are in `[4, i32::MAX]`;
//! 6. any diagnostic on requires `output_prefix`;
//! 7. `output_prefix`, when set, is non-empty, UTF-8, free of NUL bytes and at most 1023 bytes.
//!
//! Further decisions: the raw setter `pmu_event(0)` turns PMU collection off, matching
//! how level 0 of the other raw setters means "off"; `ring_override` replaces all three values
//! of the selected rings at once; platform limits (`block_dim`, `aicpu_thread_num`) are the
//! device layer's to check.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::constants::{HEAP_ALIGN, HEAP_RING_COUNT, OUTPUT_PREFIX_MAX, RING_TASK_WINDOW_MAX};
use crate::error::TypesError;
use crate::ids::RingIndex;

/// `CallConfig::aicpu_thread_num` of the default config: 0, the chip runtime's own default
/// (3 under host_build_graph, which only schedules; 4 under tensormap_and_ringbuffer: one
/// orchestrating and three scheduling, as in the original).
pub const DEFAULT_AICPU_THREAD_NUM: u32 = 0;

/// Smallest task-window and dependency-pool override.
const MIN_RING_COUNT: u64 = 4;

/// Swimlane (timeline) capture level.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
#[repr(u8)]
#[non_exhaustive]
pub enum SwimlaneLevel {
    /// No timeline.
    #[default]
    Off = 0,
    /// AICore start/end per dispatch.
    AicoreTiming = 1,
    /// Adds AICPU dispatch/finish stamps.
    AicpuTiming = 2,
    /// Adds scheduler phases.
    SchedPhases = 3,
    /// Adds orchestrator phases.
    OrchPhases = 4,
}

impl SwimlaneLevel {
    /// Decodes a raw level; `None` above 4.
    pub const fn from_u32(v: u32) -> Option<SwimlaneLevel> {
        Some(match v {
            0 => SwimlaneLevel::Off,
            1 => SwimlaneLevel::AicoreTiming,
            2 => SwimlaneLevel::AicpuTiming,
            3 => SwimlaneLevel::SchedPhases,
            4 => SwimlaneLevel::OrchPhases,
            _ => return None,
        })
    }

    /// The raw level.
    pub const fn as_u32(self) -> u32 {
        self as u32
    }
}

/// Argument-dump level.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
#[repr(u8)]
#[non_exhaustive]
pub enum DumpArgsLevel {
    /// No dump.
    #[default]
    Off = 0,
    /// Marked arguments only.
    Partial = 1,
    /// Metadata and payload.
    Full = 2,
    /// Metadata only.
    FullJsonOnly = 3,
}

impl DumpArgsLevel {
    /// Decodes a raw level; `None` above 3.
    pub const fn from_u32(v: u32) -> Option<DumpArgsLevel> {
        Some(match v {
            0 => DumpArgsLevel::Off,
            1 => DumpArgsLevel::Partial,
            2 => DumpArgsLevel::Full,
            3 => DumpArgsLevel::FullJsonOnly,
            _ => return None,
        })
    }

    /// The raw level.
    pub const fn as_u32(self) -> u32 {
        self as u32
    }
}

/// PMU event group to collect.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
#[non_exhaustive]
pub enum PmuEvent {
    /// Arithmetic-unit utilisation.
    ArithmeticUtilization = 1,
    /// Pipe utilisation.
    PipeUtilization = 2,
    /// Memory traffic.
    Memory = 4,
    /// L0 memory traffic.
    MemoryL0 = 5,
    /// Resource conflicts.
    ResourceConflict = 6,
    /// Unified-buffer traffic.
    MemoryUb = 7,
    /// L2 cache.
    L2Cache = 8,
}

impl PmuEvent {
    /// Decodes a raw event code; `None` for a code not in the list.
    pub const fn from_u32(v: u32) -> Option<PmuEvent> {
        Some(match v {
            1 => PmuEvent::ArithmeticUtilization,
            2 => PmuEvent::PipeUtilization,
            4 => PmuEvent::Memory,
            5 => PmuEvent::MemoryL0,
            6 => PmuEvent::ResourceConflict,
            7 => PmuEvent::MemoryUb,
            8 => PmuEvent::L2Cache,
            _ => return None,
        })
    }

    /// The raw event code.
    pub const fn as_u32(self) -> u32 {
        self as u32
    }
}

/// Ring sizing overrides for one scope depth of the on-device runtime; `None` = use the
/// runtime's default.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct RingOverride {
    /// Task-window entries: a power of two in `[4, 2^30]`.
    pub task_window: Option<u32>,
    /// Heap bytes: a non-zero multiple of 1024.
    pub heap_bytes: Option<u64>,
    /// Dependency-pool entries: in `[4, i32::MAX]`.
    pub dep_pool: Option<u32>,
}

impl RingOverride {
    /// Whether nothing is overridden.
    pub fn is_unset(&self) -> bool {
        *self == RingOverride::default()
    }
}

/// Which rings a builder setter applies to.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum RingSel {
    /// All four rings (the scalar form).
    All,
    /// One ring, 0..=3; anything else is rejected by `build()`.
    Ring(u32),
}

impl fmt::Display for RingSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingSel::All => f.write_str("all rings"),
            RingSel::Ring(i) => write!(f, "ring {i}"),
        }
    }
}

/// Per-task configuration of a NEXT_LEVEL task. Build with [`CallConfig::builder`].
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct CallConfig {
    block_dim: u32,
    aicpu_thread_num: u32,
    swimlane: SwimlaneLevel,
    dump_args: DumpArgsLevel,
    pmu: Option<PmuEvent>,
    dep_gen: bool,
    scope_stats: bool,
    runtime_env: [RingOverride; HEAP_RING_COUNT],
    output_prefix: Option<Arc<Path>>,
}

impl Default for CallConfig {
    /// Auto block count, the runtime's default AICPU threads, every diagnostic off, no ring
    /// override, no prefix.
    fn default() -> CallConfig {
        CallConfig {
            block_dim: 0,
            aicpu_thread_num: DEFAULT_AICPU_THREAD_NUM,
            swimlane: SwimlaneLevel::Off,
            dump_args: DumpArgsLevel::Off,
            pmu: None,
            dep_gen: false,
            scope_stats: false,
            runtime_env: [RingOverride::default(); HEAP_RING_COUNT],
            output_prefix: None,
        }
    }
}

impl CallConfig {
    /// Whether every setting is its default (`== CallConfig::default()`, without building one
    /// or comparing field by field against it): a per-task test on the engine's submit path.
    #[inline]
    pub fn is_default(&self) -> bool {
        self.block_dim == 0
            && self.aicpu_thread_num == DEFAULT_AICPU_THREAD_NUM
            && self.swimlane == SwimlaneLevel::Off
            && self.dump_args == DumpArgsLevel::Off
            && self.pmu.is_none()
            && !self.dep_gen
            && !self.scope_stats
            && self
                .runtime_env
                .iter()
                .all(|r| r.task_window.is_none() && r.heap_bytes.is_none() && r.dep_pool.is_none())
            && self.output_prefix.is_none()
    }

    /// A builder starting from the defaults.
    pub fn builder() -> CallConfigBuilder {
        CallConfig::default().to_builder()
    }

    /// A builder starting from this configuration.
    pub fn to_builder(&self) -> CallConfigBuilder {
        let mut b = CallConfigBuilder {
            block_dim: self.block_dim,
            aicpu_thread_num: self.aicpu_thread_num,
            swimlane: self.swimlane.as_u32(),
            dump_args: self.dump_args.as_u32(),
            pmu: self.pmu.map(PmuEvent::as_u32),
            dep_gen: self.dep_gen,
            scope_stats: self.scope_stats,
            rings: [RawRingOverride::default(); HEAP_RING_COUNT],
            bad_ring: None,
            output_prefix: self.output_prefix.as_deref().map(Path::to_path_buf),
        };
        for (raw, o) in b.rings.iter_mut().zip(&self.runtime_env) {
            *raw = RawRingOverride {
                task_window: o.task_window.map(u64::from),
                heap_bytes: o.heap_bytes,
                dep_pool: o.dep_pool.map(u64::from),
            };
        }
        b
    }

    /// AICore blocks for the chip program; 0 = the device picks.
    pub fn block_dim(&self) -> u32 {
        self.block_dim
    }

    /// Total AICPU threads; 0 = the chip runtime's default.
    pub fn aicpu_thread_num(&self) -> u32 {
        self.aicpu_thread_num
    }

    /// Swimlane capture level.
    pub fn swimlane(&self) -> SwimlaneLevel {
        self.swimlane
    }

    /// Argument-dump level.
    pub fn dump_args(&self) -> DumpArgsLevel {
        self.dump_args
    }

    /// PMU event group, if collection is on.
    pub fn pmu(&self) -> Option<PmuEvent> {
        self.pmu
    }

    /// Whether to capture the chip's dependency graph.
    pub fn dep_gen(&self) -> bool {
        self.dep_gen
    }

    /// Whether to record per-scope ring peaks.
    pub fn scope_stats(&self) -> bool {
        self.scope_stats
    }

    /// Ring overrides per scope depth.
    pub fn runtime_env(&self) -> &[RingOverride; HEAP_RING_COUNT] {
        &self.runtime_env
    }

    /// The override of one ring.
    pub fn ring_override(&self, ring: RingIndex) -> RingOverride {
        self.runtime_env[ring.as_usize()]
    }

    /// Directory for diagnostic artifacts.
    pub fn output_prefix(&self) -> Option<&Path> {
        self.output_prefix.as_deref()
    }

    /// The shared directory handle, for layers that keep it beyond the config.
    pub fn output_prefix_shared(&self) -> Option<&Arc<Path>> {
        self.output_prefix.as_ref()
    }

    /// Whether any diagnostic (swimlane, dump_args, pmu, dep_gen, scope_stats) is on.
    pub fn diagnostics_any(&self) -> bool {
        self.swimlane != SwimlaneLevel::Off
            || self.dump_args != DumpArgsLevel::Off
            || self.pmu.is_some()
            || self.dep_gen
            || self.scope_stats
    }
}

/// Ring overrides as given to the builder, before range checks.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
struct RawRingOverride {
    task_window: Option<u64>,
    heap_bytes: Option<u64>,
    dep_pool: Option<u64>,
}

/// Builder of a [`CallConfig`]. Setters record raw values; [`CallConfigBuilder::build`]
/// validates them all.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CallConfigBuilder {
    block_dim: u32,
    aicpu_thread_num: u32,
    swimlane: u32,
    dump_args: u32,
    pmu: Option<u32>,
    dep_gen: bool,
    scope_stats: bool,
    rings: [RawRingOverride; HEAP_RING_COUNT],
    /// The first out-of-range `RingSel::Ring` index given to any setter.
    bad_ring: Option<u32>,
    output_prefix: Option<PathBuf>,
}

impl Default for CallConfigBuilder {
    fn default() -> CallConfigBuilder {
        CallConfig::builder()
    }
}

impl CallConfigBuilder {
    /// AICore blocks; 0 = auto.
    #[must_use]
    pub fn block_dim(mut self, v: u32) -> Self {
        self.block_dim = v;
        self
    }

    /// Total AICPU threads; 0 = the chip runtime's default.
    #[must_use]
    pub fn aicpu_thread_num(mut self, v: u32) -> Self {
        self.aicpu_thread_num = v;
        self
    }

    /// Swimlane capture level.
    #[must_use]
    pub fn swimlane(mut self, level: SwimlaneLevel) -> Self {
        self.swimlane = level.as_u32();
        self
    }

    /// Swimlane level as a raw integer (CLI and config files); checked by `build()`.
    #[must_use]
    pub fn swimlane_level(mut self, level: u32) -> Self {
        self.swimlane = level;
        self
    }

    /// Argument-dump level.
    #[must_use]
    pub fn dump_args(mut self, level: DumpArgsLevel) -> Self {
        self.dump_args = level.as_u32();
        self
    }

    /// Argument-dump level as a raw integer; checked by `build()`.
    #[must_use]
    pub fn dump_args_level(mut self, level: u32) -> Self {
        self.dump_args = level;
        self
    }

    /// PMU event group; `None` turns collection off.
    #[must_use]
    pub fn pmu(mut self, event: Option<PmuEvent>) -> Self {
        self.pmu = event.map(PmuEvent::as_u32);
        self
    }

    /// PMU event as a raw code; 0 turns collection off, other codes are checked by `build()`.
    #[must_use]
    pub fn pmu_event(mut self, code: u32) -> Self {
        self.pmu = (code != 0).then_some(code);
        self
    }

    /// Capture the chip's dependency graph.
    #[must_use]
    pub fn dep_gen(mut self, on: bool) -> Self {
        self.dep_gen = on;
        self
    }

    /// Record per-scope ring peaks.
    #[must_use]
    pub fn scope_stats(mut self, on: bool) -> Self {
        self.scope_stats = on;
        self
    }

    /// Task-window override for the selected rings.
    #[must_use]
    pub fn task_window(self, rings: RingSel, entries: u64) -> Self {
        self.with_rings(rings, |r| r.task_window = Some(entries))
    }

    /// Heap-size override in bytes for the selected rings.
    #[must_use]
    pub fn heap_bytes(self, rings: RingSel, bytes: u64) -> Self {
        self.with_rings(rings, |r| r.heap_bytes = Some(bytes))
    }

    /// Dependency-pool override for the selected rings.
    #[must_use]
    pub fn dep_pool(self, rings: RingSel, entries: u64) -> Self {
        self.with_rings(rings, |r| r.dep_pool = Some(entries))
    }

    /// Replaces all three overrides of the selected rings (unset fields become unset).
    #[must_use]
    pub fn ring_override(self, rings: RingSel, o: RingOverride) -> Self {
        self.with_rings(rings, |r| {
            *r = RawRingOverride {
                task_window: o.task_window.map(u64::from),
                heap_bytes: o.heap_bytes,
                dep_pool: o.dep_pool.map(u64::from),
            }
        })
    }

    /// Directory for diagnostic artifacts.
    #[must_use]
    pub fn output_prefix(mut self, dir: impl Into<PathBuf>) -> Self {
        self.output_prefix = Some(dir.into());
        self
    }

    /// Removes the output directory.
    #[must_use]
    pub fn clear_output_prefix(mut self) -> Self {
        self.output_prefix = None;
        self
    }

    fn with_rings(mut self, rings: RingSel, mut set: impl FnMut(&mut RawRingOverride)) -> Self {
        match rings {
            RingSel::All => self.rings.iter_mut().for_each(set),
            RingSel::Ring(i) => match usize::try_from(i).ok().and_then(|i| self.rings.get_mut(i)) {
                Some(r) => set(r),
                None => {
                    self.bad_ring.get_or_insert(i);
                }
            },
        }
        self
    }

    /// Validates every setting (see the module docs for the order) and builds the config.
    pub fn build(&self) -> Result<CallConfig, TypesError> {
        // Rule 1: level and event codes.
        let swimlane = SwimlaneLevel::from_u32(self.swimlane)
            .ok_or(TypesError::InvalidSwimlaneLevel(self.swimlane))?;
        let dump_args = DumpArgsLevel::from_u32(self.dump_args)
            .ok_or(TypesError::InvalidDumpArgsLevel(self.dump_args))?;
        let pmu = match self.pmu {
            None => None,
            Some(code) => Some(PmuEvent::from_u32(code).ok_or(TypesError::InvalidPmuEvent(code))?),
        };
        // Rule 2: ring selectors.
        if let Some(i) = self.bad_ring {
            return Err(TypesError::InvalidRingIndex(i));
        }
        // Rules 3–5, each over all rings before the next rule.
        let mut runtime_env = [RingOverride::default(); HEAP_RING_COUNT];
        for (ring, (raw, out)) in self.rings.iter().zip(&mut runtime_env).enumerate() {
            if let Some(value) = raw.task_window {
                let ok = (MIN_RING_COUNT..=RING_TASK_WINDOW_MAX).contains(&value)
                    && value.is_power_of_two();
                match u32::try_from(value) {
                    Ok(v) if ok => out.task_window = Some(v),
                    _ => return Err(TypesError::TaskWindowOutOfRange { ring: ring as u8, value }),
                }
            }
        }
        for (ring, (raw, out)) in self.rings.iter().zip(&mut runtime_env).enumerate() {
            if let Some(value) = raw.heap_bytes {
                if value == 0 || !value.is_multiple_of(HEAP_ALIGN) {
                    return Err(TypesError::HeapSizeInvalid { ring: ring as u8, value });
                }
                out.heap_bytes = Some(value);
            }
        }
        for (ring, (raw, out)) in self.rings.iter().zip(&mut runtime_env).enumerate() {
            if let Some(value) = raw.dep_pool {
                match u32::try_from(value) {
                    Ok(v) if value >= MIN_RING_COUNT && value <= i32::MAX as u64 => {
                        out.dep_pool = Some(v)
                    }
                    _ => return Err(TypesError::DepPoolOutOfRange { ring: ring as u8, value }),
                }
            }
        }
        let mut config = CallConfig {
            block_dim: self.block_dim,
            aicpu_thread_num: self.aicpu_thread_num,
            swimlane,
            dump_args,
            pmu,
            dep_gen: self.dep_gen,
            scope_stats: self.scope_stats,
            runtime_env,
            output_prefix: None,
        };
        // Rule 6: diagnostics need somewhere to write.
        if config.diagnostics_any() && self.output_prefix.is_none() {
            let enabled = [
                ("swimlane", swimlane != SwimlaneLevel::Off),
                ("dump_args", dump_args != DumpArgsLevel::Off),
                ("pmu", pmu.is_some()),
                ("dep_gen", self.dep_gen),
                ("scope_stats", self.scope_stats),
            ]
            .into_iter()
            .filter_map(|(name, on)| on.then_some(name))
            .collect();
            return Err(TypesError::OutputPrefixRequired { enabled });
        }
        // Rule 7: the prefix must fit the wire field of a child's mailbox.
        if let Some(dir) = &self.output_prefix {
            check_output_prefix(dir)?;
            config.output_prefix = Some(Arc::from(dir.as_path()));
        }
        Ok(config)
    }
}

fn check_output_prefix(dir: &Path) -> Result<(), TypesError> {
    let invalid = |reason: String| Err(TypesError::OutputPrefixInvalid { reason });
    if dir.as_os_str().is_empty() {
        return invalid("it is empty".into());
    }
    let Some(text) = dir.to_str() else {
        return invalid(format!("{} is not valid UTF-8", dir.display()));
    };
    if text.contains('\0') {
        return invalid(format!("{text:?} contains a NUL byte"));
    }
    if text.len() > OUTPUT_PREFIX_MAX {
        return invalid(format!(
            "it is {} bytes long; at most {OUTPUT_PREFIX_MAX} are allowed",
            text.len()
        ));
    }
    Ok(())
}
