//! Timeout budgets (`docs/device-timeouts.md` has the table).
//!
//! Three configurable budgets, resolved once at `attach`: a value set in code through
//! [`TimeoutOverrides`] wins; otherwise, if the options asked for environment overrides
//! (`RunnerOptions::with_env_overrides`), the environment variable is read (once); otherwise
//! the default applies. Every value is validated, and the resulting set must satisfy
//! `scheduler < op execute < stream sync` and `stream sync > scheduler + 1500 ms`. Anything else
//! is `InvalidConfig` naming the setting, its value and the rule (decision: the original warns
//! and falls back to defaults).
//!
//! The fixed budgets ([`FixedBudgets`]) are not read from the environment; tests lower them in
//! code.

use std::time::Duration;

use crate::error::DeviceError;

/// Environment variable of the scheduler no-progress budget, in milliseconds.
pub const ENV_SCHEDULER_TIMEOUT_MS: &str = "SIMPLER_SCHEDULER_TIMEOUT_MS";
/// Environment variable of the op-execute budget, in microseconds.
pub const ENV_OP_EXECUTE_TIMEOUT_US: &str = "SIMPLER_OP_EXECUTE_TIMEOUT_US";
/// Environment variable of the stream-sync budget, in milliseconds.
pub const ENV_STREAM_SYNC_TIMEOUT_MS: &str = "SIMPLER_STREAM_SYNC_TIMEOUT_MS";

/// Minimum gap between the scheduler budget and the stream-sync budget.
pub const SYNC_OVER_SCHEDULER_MARGIN: Duration = Duration::from_millis(1500);

/// Values set in code; `None` falls back to the environment (when asked), then to the
/// default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeoutOverrides {
    /// Scheduler no-progress budget (counted in whole milliseconds).
    pub scheduler: Option<Duration>,
    /// Op-execute budget of one AICore launch (counted in whole microseconds).
    pub op_execute: Option<Duration>,
    /// Stream-sync budget (counted in whole milliseconds).
    pub stream_sync: Option<Duration>,
}

/// The effective configurable budgets of a runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeoutConfig {
    /// No progress in the AICPU scheduler for this long latches SCHEDULER_TIMEOUT.
    pub scheduler: Duration,
    /// One AICore execution longer than this fails the AICore entry (507014).
    pub op_execute: Duration,
    /// A stream synchronisation waits at most this long.
    pub stream_sync: Duration,
}

impl Default for TimeoutConfig {
    fn default() -> TimeoutConfig {
        TimeoutConfig {
            scheduler: Duration::from_millis(10_000),
            op_execute: Duration::from_micros(45_000_000),
            stream_sync: Duration::from_millis(50_000),
        }
    }
}

/// Budgets that are not read from the environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedBudgets {
    /// AICPU init and callable registration syncs.
    pub init_sync: Duration,
    /// A core answering the exit signal at shutdown (simulator default 10 s).
    pub shutdown_ack: Duration,
    /// Waiting for tensor data (TENSOR_WAIT_TIMEOUT).
    pub tensor_wait: Duration,
    /// Idle time after which a diagnostic collector gives up.
    pub collector_idle: Duration,
}

impl Default for FixedBudgets {
    fn default() -> FixedBudgets {
        FixedBudgets {
            init_sync: Duration::from_secs(50),
            shutdown_ack: Duration::from_secs(10),
            tensor_wait: Duration::from_secs(15),
            collector_idle: Duration::from_secs(30),
        }
    }
}

/// Where a value came from, for error messages.
#[derive(Clone, Copy)]
enum Source {
    Code(&'static str),
    Env(&'static str),
}

impl Source {
    fn setting(self) -> String {
        match self {
            Source::Code(field) => format!("RunnerOptions.timeouts.{field}"),
            Source::Env(var) => var.to_owned(),
        }
    }
}

fn invalid(source: Source, value: impl Into<String>, rule: impl Into<String>) -> DeviceError {
    DeviceError::InvalidConfig {
        run_id: None,
        setting: source.setting(),
        value: value.into(),
        rule: rule.into(),
    }
}

/// Parses one environment value: an unsigned decimal, whitespace trimmed.
fn parse_env(var: &'static str, raw: &str) -> Result<u64, DeviceError> {
    let t = raw.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(Source::Env(var), raw, "must be an unsigned decimal integer"));
    }
    t.parse::<u64>().map_err(|_| invalid(Source::Env(var), raw, "does not fit in 64 bits"))
}

/// Validates the range of one value (≥ 1, and within `max`).
fn check_range(source: Source, v: u64, max: u64, unit: &str) -> Result<u64, DeviceError> {
    if v == 0 {
        return Err(invalid(source, v.to_string(), format!("must be at least 1 {unit}")));
    }
    if v > max {
        return Err(invalid(source, v.to_string(), format!("must be at most {max} {unit}")));
    }
    Ok(v)
}

fn pick(
    code: Option<u64>,
    field: &'static str,
    var: &'static str,
    default: u64,
    max: u64,
    unit: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<u64, DeviceError> {
    if let Some(v) = code {
        return check_range(Source::Code(field), v, max, unit);
    }
    match env(var) {
        Some(raw) => check_range(Source::Env(var), parse_env(var, &raw)?, max, unit),
        None => Ok(default),
    }
}

impl TimeoutConfig {
    /// Resolves the budgets from code overrides, then `env` (called once per variable), then the
    /// defaults, and checks the ordering rules.
    pub fn resolve(
        overrides: &TimeoutOverrides,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<TimeoutConfig, DeviceError> {
        let d = TimeoutConfig::default();
        let ms_max = i32::MAX as u64;
        let ms = |d: Option<Duration>| d.map(|d| d.as_millis().min(u128::from(u64::MAX)) as u64);
        let us = |d: Option<Duration>| d.map(|d| d.as_micros().min(u128::from(u64::MAX)) as u64);
        let sched = pick(
            ms(overrides.scheduler),
            "scheduler",
            ENV_SCHEDULER_TIMEOUT_MS,
            d.scheduler.as_millis() as u64,
            ms_max,
            "ms",
            env,
        )?;
        // Microseconds: the same i32 bound in milliseconds, expressed in microseconds.
        let op = pick(
            us(overrides.op_execute),
            "op_execute",
            ENV_OP_EXECUTE_TIMEOUT_US,
            d.op_execute.as_micros() as u64,
            ms_max * 1000,
            "us",
            env,
        )?;
        let sync = pick(
            ms(overrides.stream_sync),
            "stream_sync",
            ENV_STREAM_SYNC_TIMEOUT_MS,
            d.stream_sync.as_millis() as u64,
            ms_max,
            "ms",
            env,
        )?;
        let cfg = TimeoutConfig {
            scheduler: Duration::from_millis(sched),
            op_execute: Duration::from_micros(op),
            stream_sync: Duration::from_millis(sync),
        };
        cfg.check_order(overrides)?;
        Ok(cfg)
    }

    /// Resolves with the process environment.
    pub fn from_env(overrides: &TimeoutOverrides) -> Result<TimeoutConfig, DeviceError> {
        TimeoutConfig::resolve(overrides, &|var| std::env::var(var).ok())
    }

    fn check_order(&self, o: &TimeoutOverrides) -> Result<(), DeviceError> {
        let name = |code: Option<Duration>, field: &'static str, var: &'static str| {
            if code.is_some() { Source::Code(field) } else { Source::Env(var) }
        };
        let op_src = name(o.op_execute, "op_execute", ENV_OP_EXECUTE_TIMEOUT_US);
        let sync_src = name(o.stream_sync, "stream_sync", ENV_STREAM_SYNC_TIMEOUT_MS);
        if self.scheduler >= self.op_execute {
            return Err(invalid(
                op_src,
                format!("{}", self.op_execute.as_micros()),
                format!(
                    "the op-execute budget ({:?}) must exceed the scheduler budget ({:?})",
                    self.op_execute, self.scheduler
                ),
            ));
        }
        if self.op_execute >= self.stream_sync {
            return Err(invalid(
                sync_src,
                format!("{}", self.stream_sync.as_millis()),
                format!(
                    "the stream-sync budget ({:?}) must exceed the op-execute budget ({:?})",
                    self.stream_sync, self.op_execute
                ),
            ));
        }
        if self.stream_sync <= self.scheduler + SYNC_OVER_SCHEDULER_MARGIN {
            return Err(invalid(
                sync_src,
                format!("{}", self.stream_sync.as_millis()),
                format!(
                    "the stream-sync budget ({:?}) must exceed the scheduler budget ({:?}) by more than 1500 ms",
                    self.stream_sync, self.scheduler
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        let pairs = pairs.to_vec();
        move |var| pairs.iter().find(|(k, _)| *k == var).map(|(_, v)| (*v).to_owned())
    }

    fn overrides(scheduler_ms: u64, op_execute_us: u64, stream_sync_ms: u64) -> TimeoutOverrides {
        TimeoutOverrides {
            scheduler: Some(Duration::from_millis(scheduler_ms)),
            op_execute: Some(Duration::from_micros(op_execute_us)),
            stream_sync: Some(Duration::from_millis(stream_sync_ms)),
        }
    }

    fn setting_of(e: DeviceError) -> (String, String) {
        match e {
            DeviceError::InvalidConfig { setting, value, .. } => (setting, value),
            other => panic!("expected InvalidConfig, got {other}"),
        }
    }

    #[test]
    fn timeout_defaults_pass_and_are_reported() {
        let cfg = TimeoutConfig::resolve(&TimeoutOverrides::default(), &env_of(&[])).unwrap();
        assert_eq!(cfg, TimeoutConfig::default());
    }

    #[test]
    fn timeout_env_values_are_trimmed_decimals() {
        let cfg = TimeoutConfig::resolve(
            &TimeoutOverrides::default(),
            &env_of(&[(ENV_SCHEDULER_TIMEOUT_MS, " 2000 \n")]),
        )
        .unwrap();
        assert_eq!(cfg.scheduler, Duration::from_millis(2000));
    }

    #[test]
    fn timeout_malformed_values_name_the_variable() {
        for bad in ["", "abc", "-5", "1.5", "0x10", "99999999999999999999999"] {
            let e = TimeoutConfig::resolve(
                &TimeoutOverrides::default(),
                &env_of(&[(ENV_STREAM_SYNC_TIMEOUT_MS, bad)]),
            )
            .unwrap_err();
            assert_eq!(setting_of(e), (ENV_STREAM_SYNC_TIMEOUT_MS.to_owned(), bad.to_owned()));
        }
        let e = TimeoutConfig::resolve(
            &TimeoutOverrides::default(),
            &env_of(&[(ENV_SCHEDULER_TIMEOUT_MS, "0")]),
        )
        .unwrap_err();
        assert_eq!(setting_of(e).0, ENV_SCHEDULER_TIMEOUT_MS);
        let e = TimeoutConfig::resolve(
            &TimeoutOverrides::default(),
            &env_of(&[(ENV_SCHEDULER_TIMEOUT_MS, "2147483648")]),
        )
        .unwrap_err();
        assert_eq!(setting_of(e).0, ENV_SCHEDULER_TIMEOUT_MS);
    }

    #[test]
    fn timeout_ordering_rules_are_each_enforced() {
        // scheduler >= op execute
        let o = overrides(100, 100_000, 5000);
        assert_eq!(
            setting_of(TimeoutConfig::resolve(&o, &env_of(&[])).unwrap_err()).0,
            "RunnerOptions.timeouts.op_execute"
        );
        // op execute >= stream sync
        let o = overrides(100, 5_000_000, 5000);
        assert_eq!(
            setting_of(TimeoutConfig::resolve(&o, &env_of(&[])).unwrap_err()).0,
            "RunnerOptions.timeouts.stream_sync"
        );
        // stream sync <= scheduler + 1500 ms
        let o = overrides(100, 200_000, 1600);
        assert_eq!(
            setting_of(TimeoutConfig::resolve(&o, &env_of(&[])).unwrap_err()).0,
            "RunnerOptions.timeouts.stream_sync"
        );
        let o = overrides(100, 200_000, 1601);
        assert!(TimeoutConfig::resolve(&o, &env_of(&[])).is_ok());
    }

    #[test]
    fn timeout_code_values_beat_the_environment() {
        let o =
            TimeoutOverrides { scheduler: Some(Duration::from_millis(300)), ..Default::default() };
        let cfg =
            TimeoutConfig::resolve(&o, &env_of(&[(ENV_SCHEDULER_TIMEOUT_MS, "garbage")])).unwrap();
        assert_eq!(cfg.scheduler, Duration::from_millis(300));
    }
}
