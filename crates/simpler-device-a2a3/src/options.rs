//! `RunnerOptions`: everything fixed at `attach`.
//!
//! The timeout budgets come from code ([`RunnerOptions::with_scheduler_timeout`] and its two
//! siblings), then — only when asked with [`RunnerOptions::with_env_overrides`] — from the
//! environment, then from the defaults (the same table is in `docs/device-timeouts.md`):
//!
//! | Budget | Default | Setter | Environment override (only with `with_env_overrides`) |
//! |---|---|---|---|
//! | Scheduler no-progress | 10 s | `with_scheduler_timeout` | `SIMPLER_SCHEDULER_TIMEOUT_MS` (ms) |
//! | Op execute (one AICore launch) | 45 s | `with_op_execute_timeout` | `SIMPLER_OP_EXECUTE_TIMEOUT_US` (µs) |
//! | Stream sync | 50 s | `with_stream_sync_timeout` | `SIMPLER_STREAM_SYNC_TIMEOUT_MS` (ms) |
//!
//! Rules, checked at attach (`InvalidConfig` naming the setting or variable, its value and the
//! rule): every value at least 1 unit and at most `i32::MAX` milliseconds; environment values
//! unsigned decimals (whitespace trimmed); scheduler < op execute < stream sync, and stream
//! sync > scheduler + 1.5 s.

use std::time::Duration;

use crate::error::DeviceError;
use crate::runtime::trb::sizing::MAX_TASK_WINDOW;
use crate::timeouts::{FixedBudgets, TimeoutConfig, TimeoutOverrides};

/// Which chip the runner drives.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum Platform {
    /// The simulated A2/A3 chip (feature `sim`).
    A2a3Sim,
    /// A real A2/A3 chip through CANN (feature `onboard`). Never falls back to the simulator.
    A2a3,
}

impl Platform {
    /// The launch limits every chip of this platform accepts, for callers that check a
    /// [`CallConfig`](simpler_types::CallConfig) before it reaches a chip.
    pub fn limits(self) -> PlatformLimits {
        match self {
            Platform::A2a3Sim | Platform::A2a3 => PlatformLimits {
                max_block_dim: crate::abi::MAX_BLOCK_DIM,
                max_aicpu_threads: crate::abi::MAX_AICPU_THREADS,
            },
        }
    }
}

/// Launch limits of a platform (see [`Platform::limits`]). A chip may allow fewer clusters
/// than `max_block_dim`; its runner checks that when it prepares a run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub struct PlatformLimits {
    /// Largest `CallConfig::block_dim` (clusters per launch; 0 asks for the chip's default).
    pub max_block_dim: u32,
    /// Largest `CallConfig::aicpu_thread_num` (0 asks for the default, which fits).
    pub max_aicpu_threads: u32,
}

/// A [`CallConfig`](simpler_types::CallConfig) setting beyond a [`PlatformLimits`] value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LimitExceeded {
    /// The setting, as `CallConfig.<field>`.
    pub setting: &'static str,
    /// Its value.
    pub value: u32,
    /// The largest value the platform accepts.
    pub limit: u32,
}

impl PlatformLimits {
    /// Checks the launch settings of `cfg` against these limits.
    pub fn check(&self, cfg: &simpler_types::CallConfig) -> Result<(), LimitExceeded> {
        let settings = [
            ("CallConfig.block_dim", cfg.block_dim(), self.max_block_dim),
            ("CallConfig.aicpu_thread_num", cfg.aicpu_thread_num(), self.max_aicpu_threads),
        ];
        match settings.into_iter().find(|&(_, value, limit)| value > limit) {
            Some((setting, value, limit)) => Err(LimitExceeded { setting, value, limit }),
            None => Ok(()),
        }
    }
}

/// The chip runtime a runner serves, fixed at attach.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum RuntimeVariant {
    /// The orchestration runs on the host; the finished graph is uploaded.
    HostBuildGraph,
    /// The orchestration runs on an AICPU thread with rings and a tensor map.
    TensormapAndRingbuffer,
}

impl RuntimeVariant {
    /// Both variants, host_build_graph first.
    pub const ALL: [RuntimeVariant; 2] =
        [RuntimeVariant::HostBuildGraph, RuntimeVariant::TensormapAndRingbuffer];

    /// The short name command lines use: `hbg` or `trb`.
    pub fn short_name(self) -> &'static str {
        match self {
            RuntimeVariant::HostBuildGraph => "hbg",
            RuntimeVariant::TensormapAndRingbuffer => "trb",
        }
    }
}

/// A runtime name that is not `hbg`, `trb`, `host_build_graph` or `tensormap_and_ringbuffer`.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error(
    "unknown chip runtime `{given}`: expected hbg (host_build_graph) or trb (tensormap_and_ringbuffer)"
)]
pub struct UnknownRuntime {
    /// The name given.
    pub given: String,
}

impl std::str::FromStr for RuntimeVariant {
    type Err = UnknownRuntime;

    /// Parses a short (`hbg`, `trb`) or full (`host_build_graph`, `tensormap_and_ringbuffer`)
    /// name.
    fn from_str(s: &str) -> Result<RuntimeVariant, UnknownRuntime> {
        match s {
            "hbg" | "host_build_graph" => Ok(RuntimeVariant::HostBuildGraph),
            "trb" | "tensormap_and_ringbuffer" => Ok(RuntimeVariant::TensormapAndRingbuffer),
            other => Err(UnknownRuntime { given: other.to_owned() }),
        }
    }
}

/// Runner defaults of the ring sizing, used where `CallConfig::runtime_env` is unset.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RingDefaults {
    /// Task-window entries (a power of two from 4 to 2^28).
    pub task_window: u32,
    /// Heap bytes (a non-zero multiple of 1024).
    pub heap_bytes: u64,
    /// Dependency-pool entries (at least 4).
    pub dep_pool: u32,
}

impl Default for RingDefaults {
    fn default() -> RingDefaults {
        RingDefaults { task_window: 16_384, heap_bytes: 256 << 20, dep_pool: 16_384 }
    }
}

/// The variable [`RunnerOptions::with_env_overrides`] lets `attach` take the default task
/// window of every ring from.
pub const ENV_RING_TASK_WINDOW: &str = "SIMPLER_RING_TASK_WINDOW";
/// The variable for the default heap bytes of every ring.
pub const ENV_RING_HEAP: &str = "SIMPLER_RING_HEAP";
/// The variable for the default dependency-pool entries of every ring.
pub const ENV_RING_DEP_POOL: &str = "SIMPLER_RING_DEP_POOL";

impl RingDefaults {
    /// `self` with each field still at its built-in default taken from `env` when it names a
    /// value (a value set in code beats the environment, as for the timeouts). A value that is
    /// not an unsigned decimal, or that no ring can take, is `InvalidConfig` naming the
    /// variable.
    fn with_env(self, env: &dyn Fn(&str) -> Option<String>) -> Result<RingDefaults, DeviceError> {
        let read = |var: &'static str, rule: &str, ok: fn(u64) -> bool| {
            let Some(raw) = env(var) else { return Ok(None) };
            let t = raw.trim();
            let digits = !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
            match t.parse::<u64>() {
                Ok(v) if digits && ok(v) => Ok(Some(v)),
                _ => Err(DeviceError::InvalidConfig {
                    run_id: None,
                    setting: var.into(),
                    value: raw.clone(),
                    rule: rule.into(),
                }),
            }
        };
        let built_in = RingDefaults::default();
        let mut out = self;
        if out.task_window == built_in.task_window {
            const _: () = assert!(MAX_TASK_WINDOW == 1 << 28, "the rule below names the limit");
            let rule = "an unsigned power of two from 4 to 2^28";
            let ok = |v: u64| (4..=u64::from(MAX_TASK_WINDOW)).contains(&v) && v.is_power_of_two();
            if let Some(v) = read(ENV_RING_TASK_WINDOW, rule, ok)? {
                out.task_window = v as u32;
            }
        }
        if out.heap_bytes == built_in.heap_bytes {
            let rule = "an unsigned non-zero multiple of 1024";
            if let Some(v) = read(ENV_RING_HEAP, rule, |v| v > 0 && v.is_multiple_of(1024))? {
                out.heap_bytes = v;
            }
        }
        if out.dep_pool == built_in.dep_pool {
            let rule = "an unsigned integer from 4 to 2^31 - 1";
            let ok = |v: u64| (4..=i32::MAX as u64).contains(&v);
            if let Some(v) = read(ENV_RING_DEP_POOL, rule, ok)? {
                out.dep_pool = v as u32;
            }
        }
        Ok(out)
    }
}

/// Options of the simulated chip (feature `sim`).
#[cfg(feature = "sim")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub struct SimOptions {
    /// `block_dim` used when a run asks for 0 (auto). Default 2, so a 2-core machine runs six
    /// simulated AICore cores (decision; the original uses 8).
    pub default_block_dim: u32,
    /// Most spin rounds of a simulated wait before it yields and parks; `None` = 64. A wait
    /// spins only while the device's awake simulated threads do not outnumber the host's cores
    /// and its thread's latest yield did not run another thread; a thread whose spin phases
    /// keep running out spins fewer rounds (down to 4).
    pub spin_iters: Option<u32>,
    /// `yield_now` calls of a wait after its spin phase and before it parks.
    pub yield_iters: u32,
    /// Total bytes the simulated device may allocate.
    pub memory_limit: u64,
    /// How long `finalize` (and `Drop`) waits for the simulated threads to exit;
    /// `Duration::MAX` (any budget too large to represent as a deadline) waits without limit.
    pub join_budget: Duration,
    /// See [`SimOptions::aicpu_program()`]; set only through the unsafe
    /// [`RunnerOptions::with_aicpu_program`], as attaching loads and runs the object.
    pub(crate) aicpu_program: Option<&'static std::path::Path>,
    /// See [`SimOptions::aicore_executor()`]; set only through the unsafe
    /// [`RunnerOptions::with_aicore_executor`], as attaching loads and runs the object.
    pub(crate) aicore_executor: Option<&'static std::path::Path>,
    /// Which host thread runs a dispatched kernel (default [`CoreDispatch::Auto`]).
    pub core_dispatch: CoreDispatch,
    /// Host cores the simulator plans its threads for (whether a waiter may spin, whether a
    /// kernel runs on the dispatching thread); `None` = the cores the process may use.
    pub host_cores: Option<u32>,
}

/// Which host thread runs a kernel the AICPU dispatched to a simulated core. The protocol is
/// the same either way (the core's registers, ACK, FIN and swimlane records); only the thread
/// that performs the core's side of it changes (`docs/device-simulator.md`, "Who runs a
/// dispatch").
#[cfg(feature = "sim")]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[non_exhaustive]
pub enum CoreDispatch {
    /// A core's launch starts without waking its thread: the AICPU thread that writes the
    /// core's registers also opens its window and answers its exit signal, and runs a kernel
    /// it dispatched while every host core (see [`SimOptions::host_cores`]) is taken by an
    /// awake simulated thread — waking the core's thread would only trade places with one
    /// that has work — or when it has no other work in flight and nothing else to do. Otherwise,
    /// and whenever a fault is armed, the core's thread runs it.
    /// AICPU participants whose part never waits (threads that own no cluster) run on the
    /// thread of one that may, instead of being woken for it.
    #[default]
    Auto,
    /// Always the core's own thread (and every AICPU participant on its own thread).
    CoreThread,
}

#[cfg(feature = "sim")]
impl Default for SimOptions {
    fn default() -> SimOptions {
        SimOptions {
            default_block_dim: 2,
            spin_iters: None,
            yield_iters: 4,
            memory_limit: 64 << 30,
            join_budget: Duration::from_secs(10),
            aicpu_program: None,
            aicore_executor: None,
            core_dispatch: CoreDispatch::Auto,
            host_cores: None,
        }
    }
}

#[cfg(feature = "sim")]
impl SimOptions {
    /// The built AICPU program (`libsimpler_aicpu_program.so` of the host) whose C entries the
    /// AICPU threads run instead of the scheduler compiled into this crate; `None` = the
    /// compiled-in scheduler. Used to test the shipped program's exported ABI on the simulator.
    pub fn aicpu_program(&self) -> Option<&'static std::path::Path> {
        self.aicpu_program
    }

    /// The host build of the C++ AICore executor (`libsimpler_aicore_executor.so`) the cores
    /// run instead of the Rust executor; `None` = the Rust executor.
    pub fn aicore_executor(&self) -> Option<&'static std::path::Path> {
        self.aicore_executor
    }
}

/// Everything a [`DeviceRunner`](crate::DeviceRunner) fixes at attach.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RunnerOptions {
    /// Simulated or real chip.
    pub platform: Platform,
    /// Device id (the simulator accepts any; two runners may simulate the same id).
    pub device_id: u32,
    /// The chip runtime.
    pub runtime: RuntimeVariant,
    /// Configurable budgets set in code (they beat the environment).
    pub timeouts: TimeoutOverrides,
    /// Whether `attach` reads the `SIMPLER_*` timeout variables for budgets not set in code.
    /// Off unless [`RunnerOptions::with_env_overrides`] turned it on.
    pub read_env: bool,
    /// Fixed budgets (not read from the environment).
    pub budgets: FixedBudgets,
    /// Ring sizing defaults.
    pub rings: RingDefaults,
    /// Resource slots: runs that may be prepared or in flight at once (1..=4, default 2).
    pub pipeline_slots: usize,
    /// Device queueing: `launch_run` may queue a run's kernels behind a launched, unreaped
    /// run on the same streams, and each run completes by its own events
    /// (`docs/pipelining.md`, "Device queueing"). Off by default: one launched run at a time.
    pub device_queue: bool,
    /// Simulator options.
    #[cfg(feature = "sim")]
    pub sim: SimOptions,
    /// Onboard backend options (CANN loader, device program manifest).
    #[cfg(feature = "onboard")]
    pub onboard: crate::backend::onboard::OnboardOptions,
}

impl RunnerOptions {
    /// Options for `platform` running `runtime`, with every default and no environment
    /// overrides.
    pub fn new(platform: Platform, device_id: u32, runtime: RuntimeVariant) -> RunnerOptions {
        RunnerOptions {
            platform,
            device_id,
            runtime,
            timeouts: TimeoutOverrides::default(),
            read_env: false,
            budgets: FixedBudgets::default(),
            rings: RingDefaults::default(),
            pipeline_slots: 2,
            device_queue: false,
            #[cfg(feature = "sim")]
            sim: SimOptions::default(),
            #[cfg(feature = "onboard")]
            onboard: crate::backend::onboard::OnboardOptions::default(),
        }
    }

    /// Options for a simulated chip running `runtime`, with every default.
    #[cfg(feature = "sim")]
    pub fn sim(device_id: u32, runtime: RuntimeVariant) -> RunnerOptions {
        RunnerOptions::new(Platform::A2a3Sim, device_id, runtime)
    }

    /// Options for a real chip running `runtime`.
    pub fn onboard(device_id: u32, runtime: RuntimeVariant) -> RunnerOptions {
        RunnerOptions::new(Platform::A2a3, device_id, runtime)
    }

    /// Sets the scheduler no-progress budget (whole milliseconds count; at least 1 ms).
    pub fn with_scheduler_timeout(mut self, budget: Duration) -> Self {
        self.timeouts.scheduler = Some(budget);
        self
    }

    /// Sets the op-execute budget of one AICore launch (at least 1 µs).
    pub fn with_op_execute_timeout(mut self, budget: Duration) -> Self {
        self.timeouts.op_execute = Some(budget);
        self
    }

    /// Sets the stream-sync budget (at least 1 ms).
    pub fn with_stream_sync_timeout(mut self, budget: Duration) -> Self {
        self.timeouts.stream_sync = Some(budget);
        self
    }

    /// Lets `attach` apply the `SIMPLER_SCHEDULER_TIMEOUT_MS`, `SIMPLER_OP_EXECUTE_TIMEOUT_US`
    /// and `SIMPLER_STREAM_SYNC_TIMEOUT_MS` environment variables to the budgets not set in
    /// code, and `SIMPLER_RING_TASK_WINDOW`, `SIMPLER_RING_HEAP` and `SIMPLER_RING_DEP_POOL`
    /// to the ring defaults still at their built-in values. Without this call the environment
    /// is never read. No variable names code to load: the simulator's built programs are set
    /// only in code, through the unsafe `with_aicpu_program` and `with_aicore_executor`.
    pub fn with_env_overrides(mut self) -> Self {
        self.read_env = true;
        self
    }

    /// Sets the number of resource slots (1..=4; 1 = one run at a time).
    pub fn with_pipeline_slots(mut self, slots: usize) -> Self {
        self.pipeline_slots = slots;
        self
    }

    /// Turns device queueing on or off (see [`RunnerOptions::device_queue`]).
    pub fn with_device_queue(mut self, on: bool) -> Self {
        self.device_queue = on;
        self
    }

    /// Sets the shutdown exit-ACK budget.
    pub fn with_shutdown_budget(mut self, budget: Duration) -> Self {
        self.budgets.shutdown_ack = budget;
        self
    }

    /// Sets the simulator's default `block_dim`.
    #[cfg(feature = "sim")]
    pub fn with_default_block_dim(mut self, block_dim: u32) -> Self {
        self.sim.default_block_dim = block_dim;
        self
    }

    /// Sets the simulator's memory limit.
    #[cfg(feature = "sim")]
    pub fn with_memory_limit(mut self, bytes: u64) -> Self {
        self.sim.memory_limit = bytes;
        self
    }

    /// Sets the simulator's spin iterations (`None` = automatic).
    #[cfg(feature = "sim")]
    pub fn with_spin_iters(mut self, spins: Option<u32>) -> Self {
        self.sim.spin_iters = spins;
        self
    }

    /// Runs the built AICPU program at `path` through its C entries instead of the scheduler
    /// compiled into this crate (see [`SimOptions::aicpu_program()`]).
    ///
    /// # Safety
    ///
    /// Attaching with these options loads the object at `path` into this process, which runs
    /// its initializers, and the simulated AICPU threads call its `simpler_aicpu_*` entries as
    /// the functions the built AICPU program exports (only the ABI version is checked): the
    /// object must be the host build of this workspace's AICPU program
    /// (`simpler-aicpu-program`), from sources whose entries have those types and honour the
    /// AICPU contract (touch only the launch's image, device memory and the services table).
    #[cfg(feature = "sim")]
    pub unsafe fn with_aicpu_program(mut self, path: &'static std::path::Path) -> Self {
        self.sim.aicpu_program = Some(path);
        self
    }

    /// Runs the scheduler compiled into this crate on the simulated AICPU threads, forgetting
    /// a program set by [`with_aicpu_program`](Self::with_aicpu_program).
    #[cfg(feature = "sim")]
    pub fn without_aicpu_program(mut self) -> Self {
        self.sim.aicpu_program = None;
        self
    }

    /// Runs the host build of the C++ AICore executor at `path` on the simulated cores (see
    /// [`SimOptions::aicore_executor()`]).
    ///
    /// # Safety
    ///
    /// Attaching with these options loads the object at `path` into this process, which runs
    /// its initializers, and every simulated core calls its `simpler_aicore_bind` and
    /// `aicore_kernel_0_mix_*` entries with the types of the executor's host build: the object
    /// must be the host build of this workspace's C++ AICore executor
    /// (`simpler_onboard_programs::build_host_executor`), from sources whose entries
    /// have those types and honour the AICore contract (touch only the launch's image, device
    /// memory and the core's callbacks).
    #[cfg(feature = "sim")]
    pub unsafe fn with_aicore_executor(mut self, path: &'static std::path::Path) -> Self {
        self.sim.aicore_executor = Some(path);
        self
    }

    /// Runs the Rust executor on the simulated cores, forgetting an executor set by
    /// [`with_aicore_executor`](Self::with_aicore_executor).
    #[cfg(feature = "sim")]
    pub fn without_aicore_executor(mut self) -> Self {
        self.sim.aicore_executor = None;
        self
    }

    /// Chooses which host thread runs a dispatched kernel (see [`CoreDispatch`]).
    #[cfg(feature = "sim")]
    pub fn with_core_dispatch(mut self, dispatch: CoreDispatch) -> Self {
        self.sim.core_dispatch = dispatch;
        self
    }

    /// Plans the simulator's threads for a host of `cores` cores (see
    /// [`SimOptions::host_cores`]).
    #[cfg(feature = "sim")]
    pub fn with_host_cores(mut self, cores: u32) -> Self {
        self.sim.host_cores = Some(cores);
        self
    }

    /// The effective budgets these options give (attach step A1): code values, then the
    /// environment if [`with_env_overrides`](Self::with_env_overrides) was called, then the
    /// defaults, checked against the ordering rules.
    pub fn resolve_timeouts(&self) -> Result<TimeoutConfig, DeviceError> {
        self.resolve_timeouts_with(&|var| std::env::var(var).ok())
    }

    /// The ring defaults `attach` uses: [`RunnerOptions::rings`], with the environment applied
    /// as [`RunnerOptions::with_env_overrides`] says.
    pub fn resolve_rings(&self) -> Result<RingDefaults, DeviceError> {
        self.resolve_rings_with(&|var| std::env::var(var).ok())
    }

    /// `resolve_rings` with `env` standing in for the process environment.
    fn resolve_rings_with(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<RingDefaults, DeviceError> {
        if self.read_env { self.rings.with_env(env) } else { Ok(self.rings) }
    }

    /// `resolve_timeouts` with `env` standing in for the process environment.
    fn resolve_timeouts_with(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<TimeoutConfig, DeviceError> {
        if self.read_env {
            TimeoutConfig::resolve(&self.timeouts, env)
        } else {
            TimeoutConfig::resolve(&self.timeouts, &|_| None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeouts::ENV_SCHEDULER_TIMEOUT_MS;

    #[test]
    fn runtime_names_parse_short_and_long_and_round_trip() {
        for v in RuntimeVariant::ALL {
            assert_eq!(v.short_name().parse::<RuntimeVariant>(), Ok(v));
        }
        assert_eq!("tensormap_and_ringbuffer".parse(), Ok(RuntimeVariant::TensormapAndRingbuffer));
        let e = "ring".parse::<RuntimeVariant>().unwrap_err();
        assert_eq!(e.given, "ring");
        assert!(e.to_string().contains("hbg"), "{e}");
    }

    #[test]
    fn the_environment_is_read_only_when_asked() {
        let opts = RunnerOptions::onboard(0, RuntimeVariant::HostBuildGraph);
        let untouched = |_: &str| -> Option<String> { panic!("the environment was read") };
        assert_eq!(opts.resolve_timeouts_with(&untouched).unwrap(), TimeoutConfig::default());
        let env = |var: &str| (var == ENV_SCHEDULER_TIMEOUT_MS).then(|| "2000".to_owned());
        let cfg = opts.clone().with_env_overrides().resolve_timeouts_with(&env).unwrap();
        assert_eq!(cfg.scheduler, Duration::from_millis(2000));
        // A value set in code still beats the environment.
        let cfg = opts
            .with_env_overrides()
            .with_scheduler_timeout(Duration::from_millis(300))
            .resolve_timeouts_with(&env)
            .unwrap();
        assert_eq!(cfg.scheduler, Duration::from_millis(300));
    }

    #[test]
    fn ring_defaults_come_from_the_environment_only_when_asked_and_bad_values_name_the_variable() {
        let opts = RunnerOptions::onboard(0, RuntimeVariant::TensormapAndRingbuffer);
        let untouched = |_: &str| -> Option<String> { panic!("the environment was read") };
        assert_eq!(opts.resolve_rings_with(&untouched).unwrap(), RingDefaults::default());
        let env = |var: &str| match var {
            ENV_RING_TASK_WINDOW => Some(" 1024 ".to_owned()),
            ENV_RING_HEAP => Some("1048576".to_owned()),
            _ => None,
        };
        let rings = opts.clone().with_env_overrides().resolve_rings_with(&env).unwrap();
        assert_eq!(
            rings,
            RingDefaults { task_window: 1024, heap_bytes: 1 << 20, dep_pool: 16_384 }
        );
        // A value set in code beats the environment.
        let mut coded = opts.clone().with_env_overrides();
        coded.rings.task_window = 64;
        assert_eq!(coded.resolve_rings_with(&env).unwrap().task_window, 64);
        for (var, raw) in [
            (ENV_RING_TASK_WINDOW, "48"),
            (ENV_RING_TASK_WINDOW, "-4"),
            (ENV_RING_HEAP, "1000"),
            (ENV_RING_DEP_POOL, "2"),
            (ENV_RING_DEP_POOL, "many"),
        ] {
            let bad = |v: &str| (v == var).then(|| raw.to_owned());
            let e = opts.clone().with_env_overrides().resolve_rings_with(&bad).unwrap_err();
            let DeviceError::InvalidConfig { setting, value, .. } = &e else { panic!("{e}") };
            assert_eq!((setting.as_str(), value.as_str()), (var, raw), "{e}");
        }
    }

    #[test]
    fn platform_limits_accept_the_limit_and_the_defaults_and_refuse_one_more() {
        use simpler_types::CallConfig;
        let limits = Platform::A2a3Sim.limits();
        assert_eq!(limits, Platform::A2a3.limits());
        let cfg = |block_dim, threads| {
            CallConfig::builder().block_dim(block_dim).aicpu_thread_num(threads).build().unwrap()
        };
        let (b, t) = (limits.max_block_dim, limits.max_aicpu_threads);
        for ok in [cfg(0, 0), cfg(b, t), cfg(1, 1)] {
            assert_eq!(limits.check(&ok), Ok(()));
        }
        let refused = |setting, value, limit| Err(LimitExceeded { setting, value, limit });
        assert_eq!(limits.check(&cfg(b + 1, 0)), refused("CallConfig.block_dim", b + 1, b));
        assert_eq!(limits.check(&cfg(0, t + 1)), refused("CallConfig.aicpu_thread_num", t + 1, t));
    }
}
