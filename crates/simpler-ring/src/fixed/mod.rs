//! Fixed-capacity cores: the ring algorithms as plain state transitions.
//!
//! Nothing in this module locks, waits, reads a clock or allocates after construction, and it
//! uses only `core` (checked by the `fixed_uses_only_core` test): the host [`Ring`](crate::Ring) wraps these cores in its own mutexes and
//! condition variables, and a device runtime can run the very same transitions over storage it
//! carves out of a device image. Keeping one implementation means the bump rule and FIFO
//! reclamation have one property-test suite.
//!
//! - [`bump`] is the pure placement rule of a heap ring (which offset a slab of a given size
//!   gets, given the ring's cursors), with [`largest_fit`] and [`occupied_bytes`] derived from
//!   the same cursors.
//! - [`HeapRingCore`] adds the FIFO of live records, tail advance, rewind on drain and the
//!   high-water marks, over any [`RecordStore`] (a growable `VecDeque` on the host,
//!   [`FixedRecords`] over a caller-provided slice on a device).
//! - [`TaskWindowCore`] is a power-of-two circular task window with monotonic local ids and
//!   FIFO reclamation, for runtimes whose slots live in a fixed array; its retirement flags are
//!   atomics in caller-provided memory, so other threads retire ids through a [`WindowRetirer`].
//! - [`CountWatch`] and [`Idlers`] decide when a thread handing work to another must wake it,
//!   so that a waiter hears once per batch instead of once per item, without a lost wake-up.

mod bump;
mod heap_ring;
mod records;
mod task_window;
mod wake;

pub use bump::{Placement, bump, largest_fit, occupied_bytes};
pub use heap_ring::{HeapGrant, HeapRingCore, ReleaseOutcome};
pub use records::{FixedRecords, HeapRecord, RecordStore};
pub use task_window::{SlotWord, TaskWindowCore, WindowRetire, WindowRetirer};
pub use wake::{CountWatch, Idlers, WakeWord};
