//! Simulated device memory (`docs/device-simulator.md`).
//!
//! Device memory is host memory owned by the [`SimMemory`]: every allocation is 1024-byte
//! aligned, zero-filled (lazily, by the host allocator), tracked in an ordered map, and freed when it is freed explicitly or
//! when the memory object drops. A device address is the host address as `u64`. Host copies
//! check that the whole range lies inside one tracked allocation before touching it; simulated
//! AICPU and AICore code dereferences device addresses directly, which is sound because the
//! simulated threads keep the memory object alive (they hold the device's `Arc`) and the runner
//! never frees memory a launched run may still use.
//!
//! This is one of the few modules with `unsafe` code: allocation, deallocation and the three
//! host copy primitives.

use std::alloc::Layout;
use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::backend::{AllocFailure, MemoryCounts};
use crate::error::MemPurpose;

/// Alignment of every simulated device allocation.
pub(crate) const DEVICE_ALIGN: usize = 1024;

/// One allocation: the host block (over-allocated by the alignment, so the system allocator's
/// `calloc` path can hand out lazily zeroed pages instead of touching every byte, which it does
/// for alignments above 16) and the aligned device address inside it.
#[derive(Debug)]
struct Block {
    raw: *mut u8,
    layout: Layout,
    len: u64,
    purpose: MemPurpose,
}

// SAFETY: `raw` is owned by the map entry; it is only dereferenced through the checked copy
// primitives under the memory lock and freed once, so moving the map between threads is fine.
unsafe impl Send for Block {}

#[derive(Debug, Default)]
struct Inner {
    blocks: BTreeMap<u64, Block>,
    committed: u64,
}

/// The tracked memory of one simulated device.
#[derive(Debug)]
pub(crate) struct SimMemory {
    inner: Mutex<Inner>,
    limit: u64,
}

impl SimMemory {
    pub(crate) fn new(limit: u64) -> SimMemory {
        SimMemory { inner: Mutex::new(Inner::default()), limit }
    }

    /// Allocates `bytes` (> 0) zeroed bytes, 1024-aligned.
    pub(crate) fn alloc(&self, bytes: u64, purpose: MemPurpose) -> Result<u64, AllocFailure> {
        debug_assert!(bytes > 0, "zero-byte allocations are rejected by the runner");
        let mut inner = self.inner.lock();
        if inner.committed.saturating_add(bytes) > self.limit {
            return Err(AllocFailure::Limit(self.limit));
        }
        let size = usize::try_from(bytes)
            .ok()
            .and_then(|b| b.checked_add(DEVICE_ALIGN))
            .ok_or(AllocFailure::Host)?;
        let layout = Layout::from_size_align(size, 16).map_err(|_| AllocFailure::Host)?;
        // SAFETY: `layout` has a non-zero size and a valid alignment.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        if raw.is_null() {
            return Err(AllocFailure::Host);
        }
        let addr = (raw as u64).div_ceil(DEVICE_ALIGN as u64) * DEVICE_ALIGN as u64;
        inner.blocks.insert(addr, Block { raw, layout, len: bytes, purpose });
        inner.committed += bytes;
        Ok(addr)
    }

    /// Frees the allocation starting at `addr`; returns its purpose, or `None` if `addr` is not
    /// the start of a tracked allocation.
    pub(crate) fn free(&self, addr: u64) -> Option<MemPurpose> {
        let mut inner = self.inner.lock();
        let block = inner.blocks.remove(&addr)?;
        inner.committed -= block.len;
        // SAFETY: `raw` came from `alloc_zeroed` with exactly this layout and was removed from
        // the map, so it is freed once. The runner frees memory only when no launched run can
        // still use it.
        unsafe { std::alloc::dealloc(block.raw, block.layout) };
        Some(block.purpose)
    }

    /// The purpose of the allocation holding `[addr, addr + len)` entirely, if there is one.
    pub(crate) fn find(&self, addr: u64, len: u64) -> Option<MemPurpose> {
        let inner = self.inner.lock();
        Self::find_in(&inner, addr, len).map(|(_, b)| b.purpose)
    }

    fn find_in(inner: &Inner, addr: u64, len: u64) -> Option<(u64, &Block)> {
        let end = addr.checked_add(len)?;
        let (&start, block) = inner.blocks.range(..=addr).next_back()?;
        let block_end = start + block.len;
        (end <= block_end && addr < block_end).then_some((start, block))
    }

    /// Copies `src` to device address `dst`; `false` if the range is not inside one allocation.
    pub(crate) fn write(&self, dst: u64, src: &[u8]) -> bool {
        let inner = self.inner.lock();
        if Self::find_in(&inner, dst, src.len() as u64).is_none() {
            return false;
        }
        // SAFETY: the destination range lies inside one live allocation (checked above, under
        // the lock that also guards `free`), and host memory never overlaps it.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        true
    }

    /// Copies from device address `src` into `dst`; `false` if the range is not inside one
    /// allocation.
    pub(crate) fn read(&self, src: u64, dst: &mut [u8]) -> bool {
        let inner = self.inner.lock();
        if Self::find_in(&inner, src, dst.len() as u64).is_none() {
            return false;
        }
        // SAFETY: the source range lies inside one live allocation (checked under the lock),
        // and `dst` is a distinct host buffer.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Sets `len` bytes at `dst` to `value`; `false` if the range is not inside one allocation.
    pub(crate) fn fill(&self, dst: u64, value: u8, len: u64) -> bool {
        let inner = self.inner.lock();
        if Self::find_in(&inner, dst, len).is_none() {
            return false;
        }
        let Ok(n) = usize::try_from(len) else { return false };
        // SAFETY: the range lies inside one live allocation (checked under the lock).
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, n) };
        true
    }

    /// Byte and allocation counts by purpose.
    pub(crate) fn counts(&self) -> MemoryCounts {
        let inner = self.inner.lock();
        let mut c = MemoryCounts { committed: inner.committed, ..MemoryCounts::default() };
        for block in inner.blocks.values() {
            let size = block.len;
            c.allocations += 1;
            match block.purpose {
                MemPurpose::User => {
                    c.user_bytes += size;
                    c.user_allocations += 1;
                }
                MemPurpose::HeapArena | MemPurpose::ImageArena | MemPurpose::Staging => {
                    c.pooled_bytes += size
                }
                MemPurpose::ChipBuffer | MemPurpose::Runtime => c.runtime_bytes += size,
            }
        }
        c
    }

    /// Frees every allocation; returns how many there were.
    pub(crate) fn free_all(&self) -> usize {
        let mut inner = self.inner.lock();
        let blocks = std::mem::take(&mut inner.blocks);
        inner.committed = 0;
        let n = blocks.len();
        for block in blocks.into_values() {
            // SAFETY: each entry came from `alloc_zeroed` with its layout and is freed once
            // (the map was emptied above).
            unsafe { std::alloc::dealloc(block.raw, block.layout) };
        }
        n
    }
}

impl Drop for SimMemory {
    fn drop(&mut self) {
        self.free_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_zeroed_and_range_checked() {
        let m = SimMemory::new(1 << 20);
        let a = m.alloc(3000, MemPurpose::User).unwrap();
        assert_eq!(a % DEVICE_ALIGN as u64, 0);
        let mut buf = vec![0xAAu8; 3000];
        assert!(m.read(a, &mut buf));
        assert!(buf.iter().all(|&b| b == 0));
        assert!(m.write(a + 2990, &[1; 10]));
        assert!(!m.write(a + 2991, &[1; 10]));
        assert!(!m.read(a - 1, &mut [0u8; 1]));
        assert_eq!(m.find(a, 3000), Some(MemPurpose::User));
        assert_eq!(m.find(a + 3000, 1), None);
        assert_eq!(m.free(a + 1), None);
        assert_eq!(m.free(a), Some(MemPurpose::User));
        assert_eq!(m.counts(), MemoryCounts::default());
    }

    #[test]
    fn the_memory_limit_refuses_without_aborting() {
        let m = SimMemory::new(4096);
        let a = m.alloc(4096, MemPurpose::User).unwrap();
        assert!(matches!(m.alloc(1, MemPurpose::User), Err(AllocFailure::Limit(4096))));
        m.free(a);
        assert!(m.alloc(1, MemPurpose::User).is_ok());
    }

    mod model {
        use proptest::prelude::*;

        use super::super::*;

        #[derive(Clone, Debug)]
        enum Op {
            Alloc(u64),
            Free(usize),
            Write(usize, u64, u64, u8),
            Read(usize, u64, u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (1u64..5000).prop_map(Op::Alloc),
                (0usize..8).prop_map(Op::Free),
                (0usize..8, 0u64..6000, 0u64..3000, any::<u8>())
                    .prop_map(|(i, o, l, b)| Op::Write(i, o, l, b)),
                (0usize..8, 0u64..6000, 0u64..3000).prop_map(|(i, o, l)| Op::Read(i, o, l)),
            ]
        }

        /// The live allocation holding `[at, at + len)` entirely (an address past one
        /// allocation may well be inside another) and the offset inside it.
        fn holder(live: &[(u64, Vec<u8>)], at: u64, len: u64) -> Option<(usize, usize)> {
            live.iter().enumerate().find_map(|(j, (a, b))| {
                let end = *a + b.len() as u64;
                (at >= *a && at < end && at + len <= end).then(|| (j, (at - *a) as usize))
            })
        }

        fn config() -> ProptestConfig {
            let cases =
                std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128);
            ProptestConfig {
                cases,
                failure_persistence: Some(Box::new(
                    proptest::test_runner::FileFailurePersistence::Direct(
                        "proptest-regressions/sim_memory.txt",
                    ),
                )),
                ..ProptestConfig::default()
            }
        }

        proptest! {
            #![proptest_config(config())]

            /// Reads return what the model holds, copies succeed exactly when the range lies in
            /// one live allocation, and freed or never-allocated addresses are refused.
            #[test]
            fn simulated_memory_matches_a_byte_vector_model(ops in proptest::collection::vec(op(), 1..60)) {
                let m = SimMemory::new(1 << 20);
                let mut live: Vec<(u64, Vec<u8>)> = Vec::new();
                for op in ops {
                    match op {
                        Op::Alloc(n) => {
                            let addr = m.alloc(n, MemPurpose::User).unwrap();
                            prop_assert_eq!(addr % DEVICE_ALIGN as u64, 0);
                            live.push((addr, vec![0; n as usize]));
                        }
                        Op::Free(i) if i < live.len() => {
                            let (addr, _) = live.remove(i);
                            prop_assert_eq!(m.free(addr), Some(MemPurpose::User));
                            prop_assert_eq!(m.free(addr), None, "a second free is refused");
                        }
                        Op::Free(_) => {}
                        Op::Write(i, off, len, b) if i < live.len() => {
                            let at = live[i].0 + off;
                            let owner = holder(&live, at, len);
                            prop_assert_eq!(m.write(at, &vec![b; len as usize]), owner.is_some());
                            if let Some((j, o)) = owner {
                                live[j].1[o..o + len as usize].fill(b);
                            }
                        }
                        Op::Read(i, off, len) if i < live.len() => {
                            let at = live[i].0 + off;
                            let owner = holder(&live, at, len);
                            let mut out = vec![0xEE; len as usize];
                            prop_assert_eq!(m.read(at, &mut out), owner.is_some());
                            if let Some((j, o)) = owner {
                                prop_assert_eq!(&out[..], &live[j].1[o..o + len as usize]);
                            }
                        }
                        Op::Write(..) | Op::Read(..) => {}
                    }
                    let committed: u64 = live.iter().map(|(_, b)| b.len() as u64).sum();
                    prop_assert_eq!(m.counts().committed, committed);
                }
            }
        }
    }
}
