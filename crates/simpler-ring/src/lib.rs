//! `simpler-ring` — the task window and the per-scope heap rings of one engine.
//!
//! Layer: below the engine (`simpler-sched`), above `simpler-types`. It hands out
//! generation-tagged task-window entries carrying an engine-defined payload, and 1024-aligned
//! heap slabs from four rings (one per clamped scope depth), reclaims slabs in FIFO order,
//! blocks allocations on back-pressure until a deadline or shutdown, and reports high-water
//! marks. It knows nothing about tensors, dependencies, task states or devices, and it never
//! dereferences heap memory: it only computes addresses, so it contains no `unsafe` code.
//!
//! - [`Ring`] — window plus heaps: [`Ring::alloc`], [`Ring::release`], [`Ring::slot`],
//!   [`Ring::reset_to_empty`], [`Ring::shutdown`], [`Ring::stats`]. Protocols and the lock order
//!   are in the [`ring`] module docs.
//! - [`ScopeStack`] — the orchestrator's stack of scope frames.
//! - [`fixed`] — the bump/wrap/FIFO rule and a power-of-two task window as lock-free,
//!   allocation-free state transitions, shared with device runtimes.
//! - [`RingConfig`], [`RingError`], [`RingStats`].
//!
//! ```
//! use simpler_ring::{Ring, RingConfig};
//!
//! let ring: Ring<()> = Ring::new(RingConfig { heap_bytes_per_ring: 1 << 20, ..RingConfig::default() })?;
//! // A task-window slot with a 4 KiB slab on the outermost scope's heap ring.
//! let a = ring.alloc(4096, 0)?;
//! let slab = a.heap.expect("bytes > 0 come with a slab");
//! assert_eq!(slab.addr % 1024, 0);
//! assert_eq!(ring.stats().window.live, 1);
//! ring.release(a.slot);
//! assert_eq!(ring.stats().window.live, 0);
//! # Ok::<(), simpler_ring::RingError>(())
//! ```

#![forbid(unsafe_code)]

pub mod config;
pub mod error;
pub mod fixed;
mod heap;
mod patience;
pub mod ring;
pub mod scope;
pub mod stats;
mod sync;
mod window;

pub use config::{HeapBacking, HeapRegion, RingConfig};
pub use error::{ConfigProblem, HeapExhausted, MapFailure, RingError};
pub use ring::{Allocation, HeapSpan, RELEASE_BATCH, ReleaseBatch, Ring};
pub use scope::ScopeStack;
pub use stats::{HeapRingStats, RingStats, WindowStats};
