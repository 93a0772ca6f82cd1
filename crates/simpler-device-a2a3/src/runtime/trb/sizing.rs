//! The sizes of the trb rings: per ring, `CallConfig::runtime_env` wins over the runner's
//! defaults (`RunnerOptions::rings`), which default to the built-in sizes.

use simpler_types::constants::{HEAP_ALIGN, HEAP_RING_COUNT};
use simpler_types::{CallConfig, RunId};

use crate::error::DeviceError;
use crate::options::RingDefaults;

/// Bits of a slot index in the schedulers' per-core task handle (`ring << SLOT_BITS | slot`), and
/// so the largest task window a ring may have.
pub(crate) const SLOT_BITS: u32 = 28;
/// The largest task window: every slot index fits in [`SLOT_BITS`].
pub(crate) const MAX_TASK_WINDOW: u32 = 1 << SLOT_BITS;

/// The three sizes of one ring.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct RingSizes {
    /// Task slots (a power of two, at least 4, at most [`MAX_TASK_WINDOW`]).
    pub(crate) task_window: u32,
    /// Heap bytes (a non-zero multiple of the heap alignment).
    pub(crate) heap_bytes: u64,
    /// Dependency-pool entries (at least 4).
    pub(crate) dep_pool: u32,
}

/// The sizes of every ring of a run: the run's override per field, else the runner's default.
///
/// An unusable size (a window that is not a power of two or is past [`MAX_TASK_WINDOW`], a heap that is not a multiple of the
/// heap alignment, fewer than 4 dependency entries) is `InvalidConfig` naming the ring and the
/// value, whichever source it came from.
pub(crate) fn resolve(
    run_id: Option<RunId>,
    config: &CallConfig,
    defaults: RingDefaults,
) -> Result<[RingSizes; HEAP_RING_COUNT], DeviceError> {
    let mut out = [RingSizes { task_window: 0, heap_bytes: 0, dep_pool: 0 }; HEAP_RING_COUNT];
    for (ring, (slot, over)) in out.iter_mut().zip(config.runtime_env()).enumerate() {
        let sizes = RingSizes {
            task_window: over.task_window.unwrap_or(defaults.task_window),
            heap_bytes: over.heap_bytes.unwrap_or(defaults.heap_bytes),
            dep_pool: over.dep_pool.unwrap_or(defaults.dep_pool),
        };
        let bad = |field: &str, value: u64, rule: &str| DeviceError::InvalidConfig {
            run_id,
            setting: format!("ring {ring} {field}"),
            value: value.to_string(),
            rule: rule.into(),
        };
        if sizes.task_window < 4
            || !sizes.task_window.is_power_of_two()
            || sizes.task_window > MAX_TASK_WINDOW
        {
            const _: () = assert!(MAX_TASK_WINDOW == 1 << 28, "the rule below names the limit");
            return Err(bad(
                "task_window",
                sizes.task_window.into(),
                "a power of two from 4 to 2^28",
            ));
        }
        if sizes.heap_bytes == 0 || !sizes.heap_bytes.is_multiple_of(HEAP_ALIGN) {
            return Err(bad(
                "heap_bytes",
                sizes.heap_bytes,
                "a non-zero multiple of the 1024-byte heap alignment",
            ));
        }
        if sizes.dep_pool < 4 {
            return Err(bad("dep_pool", sizes.dep_pool.into(), "at least 4"));
        }
        *slot = sizes;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use simpler_types::{RingOverride, RingSel};

    use super::*;

    #[test]
    fn the_run_override_wins_per_field_over_the_runner_defaults() {
        let defaults = RingDefaults { task_window: 64, heap_bytes: 8 << 10, dep_pool: 32 };
        let config = CallConfig::builder()
            .ring_override(
                RingSel::Ring(2),
                RingOverride { task_window: Some(16), heap_bytes: None, dep_pool: Some(8) },
            )
            .build()
            .unwrap();
        let sizes = resolve(None, &config, defaults).unwrap();
        assert_eq!(sizes[0], RingSizes { task_window: 64, heap_bytes: 8 << 10, dep_pool: 32 });
        assert_eq!(sizes[2], RingSizes { task_window: 16, heap_bytes: 8 << 10, dep_pool: 8 });
    }

    #[test]
    fn the_built_in_defaults_are_those_of_the_original() {
        let sizes = resolve(None, &CallConfig::default(), RingDefaults::default()).unwrap();
        for s in sizes {
            assert_eq!(
                s,
                RingSizes { task_window: 16_384, heap_bytes: 256 << 20, dep_pool: 16_384 }
            );
        }
    }

    #[test]
    fn a_window_whose_slots_do_not_fit_the_schedulers_handle_is_rejected() {
        let config = |window| {
            CallConfig::builder()
                .ring_override(
                    RingSel::Ring(3),
                    RingOverride { task_window: Some(window), heap_bytes: None, dep_pool: None },
                )
                .build()
                .unwrap()
        };
        assert!(resolve(None, &config(MAX_TASK_WINDOW), RingDefaults::default()).is_ok());
        let e = resolve(None, &config(MAX_TASK_WINDOW << 1), RingDefaults::default()).unwrap_err();
        assert!(e.to_string().contains("ring 3 task_window = \"536870912\""), "{e}");
        assert!(e.to_string().contains("2^28"), "{e}");
    }

    #[test]
    fn an_unusable_default_is_rejected_naming_the_ring() {
        let defaults = RingDefaults { task_window: 48, heap_bytes: 8 << 10, dep_pool: 32 };
        let e = resolve(None, &CallConfig::default(), defaults).unwrap_err();
        assert!(e.to_string().contains("ring 0 task_window = \"48\""), "{e}");
    }
}
