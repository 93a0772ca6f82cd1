//! What the examples that run a chip program share: the `--runtime hbg|trb` option (default
//! hbg) and a clear, typed error when the chosen chip runtime refuses to run.
// Each example uses the part it needs.
#![allow(dead_code)]

use std::error::Error;
use std::fmt;
use std::process::ExitCode;

use simpler_device_a2a3::{DeviceError, RuntimeVariant, UnknownRuntime};
use simpler_worker::{RunError, WorkerError};

/// The command line of an example: the chip runtime and the remaining positional arguments.
#[derive(Clone, Debug)]
pub struct Cli {
    /// `--runtime hbg|trb` (or `--runtime=…`); host_build_graph when absent.
    pub runtime: RuntimeVariant,
    /// The other arguments, in order.
    pub positional: Vec<String>,
}

impl Cli {
    /// The process's arguments.
    pub fn from_env() -> Result<Cli, CliError> {
        Cli::parse(std::env::args().skip(1))
    }

    /// Parses `args` (without the program name).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Cli, CliError> {
        let mut cli = Cli { runtime: RuntimeVariant::HostBuildGraph, positional: Vec::new() };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let value = match arg.strip_prefix("--runtime") {
                Some("") => args.next().ok_or(CliError::MissingRuntime)?,
                Some(v) if v.starts_with('=') => v[1..].to_owned(),
                _ if arg.starts_with("--") => return Err(CliError::UnknownFlag(arg)),
                _ => {
                    cli.positional.push(arg);
                    continue;
                }
            };
            cli.runtime = value.parse().map_err(CliError::UnknownRuntime)?;
        }
        Ok(cli)
    }

    /// Positional argument `i` parsed as `T`, or `default` when absent; one that does not
    /// parse is an error naming it.
    pub fn positional_or<T: std::str::FromStr>(&self, i: usize, default: T) -> Result<T, CliError> {
        match self.positional.get(i) {
            None => Ok(default),
            Some(s) => s.parse().map_err(|_| CliError::BadArgument { index: i, value: s.clone() }),
        }
    }
}

/// A command line the examples cannot use.
#[derive(Debug)]
pub enum CliError {
    /// `--runtime` was the last argument.
    MissingRuntime,
    /// `--runtime` named no chip runtime.
    UnknownRuntime(UnknownRuntime),
    /// An option other than `--runtime`.
    UnknownFlag(String),
    /// Positional argument `index` (from 0) did not parse.
    BadArgument { index: usize, value: String },
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::MissingRuntime => write!(f, "--runtime needs a value: hbg or trb"),
            CliError::UnknownRuntime(e) => write!(f, "--runtime: {e}"),
            CliError::UnknownFlag(flag) => write!(f, "unknown option {flag} (only --runtime)"),
            CliError::BadArgument { index, value } => {
                write!(f, "argument {} `{value}` is not a valid value", index + 1)
            }
        }
    }
}

impl Error for CliError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            CliError::UnknownRuntime(e) => Some(e),
            CliError::MissingRuntime | CliError::UnknownFlag(_) | CliError::BadArgument { .. } => {
                None
            }
        }
    }
}

/// The chip runtime the example was asked for refused the run as unsupported.
#[derive(Debug)]
pub struct RuntimeRefused {
    /// The runtime asked for.
    pub runtime: RuntimeVariant,
    /// What the device said it does not support.
    pub feature: String,
}

impl fmt::Display for RuntimeRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--runtime {}: the chip refused the run as unsupported ({})",
            self.runtime.short_name(),
            self.feature
        )
    }
}

impl Error for RuntimeRefused {}

/// The refusal of `runtime` in `e`, if that is what `e` is: a device error in its source chain,
/// or the device error a worker's run error carries in its frames.
pub fn refusal(runtime: RuntimeVariant, e: &(dyn Error + 'static)) -> Option<RuntimeRefused> {
    let mut next = Some(e);
    while let Some(e) = next {
        let device = e.downcast_ref::<DeviceError>().or_else(|| match e.downcast_ref() {
            Some(WorkerError::Run(run)) => run.device_error(),
            _ => e.downcast_ref::<RunError>().and_then(RunError::device_error),
        });
        if let Some(DeviceError::Unsupported { feature, .. }) = device {
            return Some(RuntimeRefused { runtime, feature: feature.clone() });
        }
        next = e.source();
    }
    None
}

/// `e`, or the [`RuntimeRefused`] it carries.
pub fn explain(runtime: RuntimeVariant, e: Box<dyn Error>) -> Box<dyn Error> {
    match refusal(runtime, e.as_ref()) {
        Some(refused) => Box::new(refused),
        None => e,
    }
}

/// An example's `main`: parses the command line, calls `run`, and turns its answer into the exit
/// code (a failed check or an error is a failure; a refused runtime is explained as such).
pub fn main_with(run: fn(&Cli) -> Result<bool, Box<dyn Error>>) -> ExitCode {
    let cli = match Cli::from_env() {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {}", explain(cli.runtime, e));
            ExitCode::FAILURE
        }
    }
}
