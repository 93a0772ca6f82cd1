//! [`RingConfig`]: sizes, deadline, window cap and heap backing, validated by
//! [`Ring::new`](crate::Ring::new).
//!
//! Decisions recorded here:
//! - An external region must be exactly `heap_bytes_per_ring` long. One size for every ring keeps
//!   the statistics and the error messages about "the ring size" unambiguous; a caller with a
//!   larger region passes a prefix of it.
//! - No region may start at address 0: the engine reads address 0 as "untracked tensor", so a
//!   slab at offset 0 of such a region would lose its dependencies.
//! - External regions with heaps disabled are refused as contradictory rather than ignored.

use std::time::Duration;

use simpler_types::{DEFAULT_ALLOC_TIMEOUT, DEFAULT_HEAP_RING_BYTES, HEAP_ALIGN, HEAP_RING_COUNT};

use crate::error::{ConfigProblem, RingError};

/// How a [`Ring`](crate::Ring) is sized and where its heaps live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Bytes per heap ring; 0 disables heaps (slot-only allocation still works). Otherwise a
    /// multiple of 1024.
    pub heap_bytes_per_ring: u64,
    /// How long a blocking [`Ring::alloc`](crate::Ring::alloc) may wait. The deadline is fixed
    /// the first time the call has to wait (a call that never waits reads no clock), and every
    /// later wait of the same call shares it; `Duration::ZERO` means "never wait".
    pub alloc_timeout: Duration,
    /// With `Some(n)`, at most `n` slots are live at once and allocation waits for one; `None`
    /// lets the window grow with demand.
    pub max_live_slots: Option<u32>,
    /// Where the four heap rings live.
    pub backing: HeapBacking,
}

impl Default for RingConfig {
    /// 1 GiB per ring, 10 s deadline, unbounded window, anonymous mappings.
    fn default() -> Self {
        RingConfig {
            heap_bytes_per_ring: DEFAULT_HEAP_RING_BYTES,
            alloc_timeout: DEFAULT_ALLOC_TIMEOUT,
            max_live_slots: None,
            backing: HeapBacking::Anonymous,
        }
    }
}

/// Memory behind the heap rings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HeapBacking {
    /// Four private anonymous mappings of `heap_bytes_per_ring` each: address space reserved at
    /// construction, pages committed by the kernel on first touch.
    #[default]
    Anonymous,
    /// Caller-provided regions, one per ring (device memory, tests). They must be non-zero,
    /// 1024-aligned, pairwise disjoint, exactly `heap_bytes_per_ring` long and not start at 0.
    /// The ring computes addresses inside them but never touches their memory.
    External([HeapRegion; HEAP_RING_COUNT]),
}

/// A span of addresses `[base, base + len)`.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct HeapRegion {
    /// First address.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
}

/// As derived, with the base address in hex.
impl std::fmt::Debug for HeapRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapRegion")
            .field("base", &format_args!("{:#x}", self.base))
            .field("len", &self.len)
            .finish()
    }
}

impl HeapRegion {
    /// `true` when `addr` lies in `[base, base + len)`.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < self.len
    }
}

impl RingConfig {
    /// Checks every rule of the configuration; the error names the offending values.
    pub fn validate(&self) -> Result<(), RingError> {
        let invalid = |problem: ConfigProblem| Err(RingError::InvalidConfig { problem });
        let size = self.heap_bytes_per_ring;
        if !size.is_multiple_of(HEAP_ALIGN) {
            return invalid(ConfigProblem::UnalignedHeapSize { size });
        }
        if size > isize::MAX as u64 {
            return invalid(ConfigProblem::HeapSizeTooLarge { size });
        }
        if self.max_live_slots == Some(0) {
            return invalid(ConfigProblem::ZeroLiveSlots);
        }
        if let HeapBacking::External(regions) = &self.backing {
            if size == 0 {
                return invalid(ConfigProblem::RegionsWithoutHeaps);
            }
            for (ring, r) in regions.iter().enumerate() {
                if r.len != size {
                    return invalid(ConfigProblem::RegionLength { ring, len: r.len, size });
                }
                if r.base == 0 || !r.base.is_multiple_of(HEAP_ALIGN) {
                    return invalid(ConfigProblem::RegionBase { ring, base: r.base });
                }
                if r.base.checked_add(r.len).is_none() {
                    return invalid(ConfigProblem::RegionWraps { ring, base: r.base, len: r.len });
                }
            }
            for a in 0..HEAP_RING_COUNT {
                for b in a + 1..HEAP_RING_COUNT {
                    let (ra, rb) = (regions[a], regions[b]);
                    if ra.base < rb.base + rb.len && rb.base < ra.base + ra.len {
                        return invalid(ConfigProblem::RegionsOverlap {
                            first: (a, ra.base, ra.len),
                            second: (b, rb.base, rb.len),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_region_debug_shows_the_base_in_hex() {
        let r = HeapRegion { base: 0x10_0000, len: 4096 };
        assert_eq!(format!("{r:?}"), "HeapRegion { base: 0x100000, len: 4096 }");
    }

    fn external(bases: [u64; 4], len: u64) -> RingConfig {
        RingConfig {
            heap_bytes_per_ring: len,
            backing: HeapBacking::External(bases.map(|base| HeapRegion { base, len })),
            ..RingConfig::default()
        }
    }

    fn problem(config: &RingConfig) -> ConfigProblem {
        match config.validate() {
            Err(RingError::InvalidConfig { problem }) => problem,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    fn reason(config: &RingConfig) -> String {
        problem(config).to_string()
    }

    #[test]
    fn each_broken_rule_is_its_own_problem_with_its_values() {
        let c = RingConfig { heap_bytes_per_ring: 1000, ..RingConfig::default() };
        assert_eq!(problem(&c), ConfigProblem::UnalignedHeapSize { size: 1000 });
        let c = RingConfig { max_live_slots: Some(0), ..RingConfig::default() };
        assert_eq!(problem(&c), ConfigProblem::ZeroLiveSlots);
        let k = 1 << 20;
        let overlap = external([k, 2 * k, 2 * k + 1024, 6 * k], k);
        assert_eq!(
            problem(&overlap),
            ConfigProblem::RegionsOverlap { first: (1, 2 * k, k), second: (2, 2 * k + 1024, k) }
        );
        let base = external([0, 2 * k, 4 * k, 6 * k], k);
        assert_eq!(problem(&base), ConfigProblem::RegionBase { ring: 0, base: 0 });
    }

    #[test]
    fn default_config_is_valid_and_matches_the_spec() {
        let c = RingConfig::default();
        assert_eq!(c.heap_bytes_per_ring, 1 << 30);
        assert_eq!(c.alloc_timeout, Duration::from_secs(10));
        assert_eq!(c.max_live_slots, None);
        assert_eq!(c.backing, HeapBacking::Anonymous);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn invalid_configs_name_the_offending_values() {
        let c = RingConfig { heap_bytes_per_ring: 1000, ..RingConfig::default() };
        assert!(reason(&c).contains("1000"));
        let c = RingConfig { max_live_slots: Some(0), ..RingConfig::default() };
        assert!(reason(&c).contains("max_live_slots"));
        let k = 1 << 20;
        assert!(reason(&external([0, 2 * k, 4 * k, 6 * k], k)).contains("ring 0"));
        assert!(reason(&external([k + 1, 2 * k, 4 * k, 6 * k], k)).contains("ring 0"));
        assert!(reason(&external([k, 2 * k, 2 * k + 1024, 6 * k], k)).contains("rings 1"));
        assert!(reason(&external([k, 2 * k, 4 * k, u64::MAX - 1023], k)).contains("ring 3"));
        let mut c = external([k, 2 * k, 4 * k, 6 * k], k);
        if let HeapBacking::External(r) = &mut c.backing {
            r[2].len = 2048;
        }
        assert!(reason(&c).contains("ring 2 is 2048"));
        let c = RingConfig { heap_bytes_per_ring: 0, ..external([k, 2 * k, 4 * k, 6 * k], k) };
        assert!(reason(&c).contains("disables heaps"));
        assert_eq!(external([k, 2 * k, 4 * k, 6 * k], k).validate(), Ok(()));
    }
}
