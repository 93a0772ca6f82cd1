//! [`ConfigError`]: a builder mistake, found by `CompositeWorkerBuilder::child` or by `start`
//! before anything starts (carried by [`StartCause::Config`](crate::StartCause::Config)).

/// A builder mistake found before anything starts. Each variant carries the values it found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The startup timeout is zero.
    #[error("startup_timeout must be > 0")]
    ZeroStartupTimeout,
    /// More sub workers than one level may have.
    #[error("sub_workers = {given} exceeds the limit of {limit} sub workers per level")]
    TooManySubWorkers {
        /// The count given.
        given: usize,
        /// The limit ([`MAX_SUB_WORKERS`](crate::MAX_SUB_WORKERS)).
        limit: usize,
    },
    /// A device id is given twice.
    #[error(
        "device ids are not distinct: device {duplicate} appears more than once in {devices:?}"
    )]
    DuplicateDevice {
        /// The lowest id given more than once.
        duplicate: u32,
        /// The ids given, in order.
        devices: Vec<u32>,
    },
    /// A composite worker's level is below 4.
    #[error("a composite worker has level >= 4, not {level}")]
    CompositeLevel {
        /// The level given.
        level: u8,
    },
    /// A child's level is not one below its parent's.
    #[error("an L{parent} worker adopts L{} children, not L{child}", .parent.saturating_sub(1))]
    ChildLevel {
        /// The adopting worker's level.
        parent: u8,
        /// The child's level.
        child: u8,
    },
    /// `chip_options` is set while chips run in child processes, which a closure cannot reach.
    #[error(
        "chip_options cannot reach chips in child processes (a closure does not cross processes)"
    )]
    ChipOptionsInProcessMode,
    /// The builder attached no chip.
    #[error("no chips attached")]
    NoChips,
    /// A remote L3 child was started on its own; its parent's adoption starts it.
    #[cfg(feature = "mpi")]
    #[error("a remote child is started by its parent")]
    RemoteChildAlone,
}
