//! Binary layouts shared by the host, the AICPU scheduler and the AICore executor.
//!
//! Everything in this module is `#[repr(C)]` plain data or atomics with the layout of the
//! matching integer, so the same bytes can be written by the host, uploaded, and read by code
//! running on the device. Sizes and offsets are asserted at compile time next to each type. The
//! module uses only `core`, so the onboard AICPU program can build it for the device.
//!
//! - [`regs`]: register ids, the `COND` encoding and the reserved token values (`docs/device-handshake.md`).
//! - [`handshake`]: the per-core handshake record (`docs/device-handshake.md`).
//! - [`payload`]: the 512-byte dispatch payload, its two contexts and the 50 kernel-argument
//!   slots (`docs/device-chip.md`).
//! - [`launch`]: what the two kernel launches receive (`KernelArgs`) and the AICPU `InitArgs`.
//! - [`image`]: the runtime image the host builds and uploads: header, shared status, task
//!   records, ready queues, payload pairs and diagnostic records (`docs/device-chip.md`).
//! - [`services`]: the table of host services a host passes to the AICPU program it runs
//!   (the simulator; absent onboard).
//! - [`codes`]: runtime status codes and the device (ACL) codes the simulator reports.

pub mod codes;
pub mod handshake;
pub mod image;
pub mod launch;
pub mod payload;
pub mod regs;
pub mod services;

/// Largest `block_dim` (clusters per launch) of an A2/A3 chip.
pub const MAX_BLOCK_DIM: u32 = 24;
/// Cores in one cluster: one AIC (cube) and two AIV (vector) cores.
pub const CORES_PER_CLUSTER: u32 = 3;
/// Most AICore cores one launch can start (`3 * MAX_BLOCK_DIM`).
pub const MAX_LAUNCH_CORES: usize = (CORES_PER_CLUSTER * MAX_BLOCK_DIM) as usize;
/// Most AICPU threads one launch uses.
pub const MAX_AICPU_THREADS: u32 = 4;
/// The AICPU thread count a `CallConfig` value of 0 stands for under host_build_graph (the
/// original's default there; tensormap_and_ringbuffer defaults to 4).
pub const DEFAULT_AICPU_THREADS: u32 = 3;
/// A reported physical core id at or above this value is a handshake failure (25 per die).
pub const PHYSICAL_CORE_LIMIT: u32 = 75;
/// Frequency of the device's system counter.
pub const COUNTER_HZ: u64 = 50_000_000;
/// Nanoseconds per tick of the 50 MHz system counter.
pub const NS_PER_TICK: u64 = 1_000_000_000 / COUNTER_HZ;
/// Function ids of one chip callable are `0..MAX_FUNC_IDS`.
pub const MAX_FUNC_IDS: usize = 1024;
/// Callable slots of one runner.
pub const MAX_CALLABLE_SLOTS: usize = 64;
/// Version of the layouts in this module; bumped on any change, of a layout or of what a field
/// means (5: `GlobalContext` numbers the copies of a MIX block's kernel where it had padding),
/// so stale device programs are refused.
pub const ABI_VERSION: u32 = 5;

/// Kind of an AICore core, as stored in the handshake record.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u32)]
pub enum CoreType {
    /// A cube core.
    Aic = 0,
    /// A vector core.
    Aiv = 1,
}

impl CoreType {
    /// The type a raw handshake value names; `None` for anything else.
    pub const fn from_u32(v: u32) -> Option<CoreType> {
        match v {
            0 => Some(CoreType::Aic),
            1 => Some(CoreType::Aiv),
            _ => None,
        }
    }

    /// Short upper-case name (`AIC`, `AIV`), as used in traces.
    pub const fn name(self) -> &'static str {
        match self {
            CoreType::Aic => "AIC",
            CoreType::Aiv => "AIV",
        }
    }
}

/// Where core `index` of a launch with `block_dim` clusters sits: its type, its cluster and
/// (for AIV) its sub-block.
///
/// Cores `[0, B)` are AIC, `[B, 3B)` are AIV; cluster `k` is `{k, B + 2k, B + 2k + 1}` and the
/// AIV at `B + j` has sub-block `j % 2` (`docs/device-chip.md`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CorePlace {
    /// Cube or vector core.
    pub core_type: CoreType,
    /// Cluster index in `[0, block_dim)`.
    pub cluster: u32,
    /// Sub-block id: 0 for AIC, `j % 2` for AIV `B + j`.
    pub sub_block: u32,
}

impl CorePlace {
    /// The place of core `index`, or `None` when `index >= 3 * block_dim`.
    pub const fn of(index: u32, block_dim: u32) -> Option<CorePlace> {
        if index < block_dim {
            Some(CorePlace { core_type: CoreType::Aic, cluster: index, sub_block: 0 })
        } else if index < CORES_PER_CLUSTER * block_dim {
            let j = index - block_dim;
            Some(CorePlace { core_type: CoreType::Aiv, cluster: j / 2, sub_block: j % 2 })
        } else {
            None
        }
    }

    /// The three cores of cluster `k`: AIC, AIV sub-block 0, AIV sub-block 1.
    pub const fn cluster_cores(k: u32, block_dim: u32) -> [u32; 3] {
        [k, block_dim + 2 * k, block_dim + 2 * k + 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_places_follow_the_cluster_rule() {
        let b = 3;
        for k in 0..b {
            let [aic, v0, v1] = CorePlace::cluster_cores(k, b);
            assert_eq!(CorePlace::of(aic, b).unwrap().core_type, CoreType::Aic);
            let p0 = CorePlace::of(v0, b).unwrap();
            let p1 = CorePlace::of(v1, b).unwrap();
            assert_eq!((p0.core_type, p0.cluster, p0.sub_block), (CoreType::Aiv, k, 0));
            assert_eq!((p1.core_type, p1.cluster, p1.sub_block), (CoreType::Aiv, k, 1));
        }
        assert!(CorePlace::of(9, 3).is_none());
    }
}
