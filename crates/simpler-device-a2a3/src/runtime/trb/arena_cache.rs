//! `ArenaCache`: the trb storage of the last sizing, kept between runs.
//!
//! A [`TrbArena`] holds the bookkeeping of every ring, the tensor map and the ready queue of one
//! sizing; building one allocates and initialises all of it (several MiB at the default sizes).
//! Runs of one runner usually share their sizing, so the runtime keeps the arena of the last
//! sizing and builds a new one only when a run asks for different sizes. An engine built over a
//! reused arena starts from an empty state whatever the previous run left behind.

use simpler_types::constants::HEAP_RING_COUNT;

use super::engine::TrbArena;
use super::sizing::RingSizes;

/// What an arena is built for: the ring sizes and the tensor map's entry and bucket counts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct ArenaShape {
    /// The sizes of every ring.
    pub(crate) rings: [RingSizes; HEAP_RING_COUNT],
    /// Tensor-map entries.
    pub(crate) map_entries: u32,
    /// Tensor-map buckets (a power of two).
    pub(crate) map_buckets: u32,
}

/// The arena of the last shape asked for.
#[derive(Debug, Default)]
pub(crate) struct ArenaCache {
    cached: Option<(ArenaShape, TrbArena)>,
    builds: u64,
}

impl ArenaCache {
    /// The arena for `shape`: the cached one when the shape is the same, else a new one that
    /// replaces it (the old one is dropped first, so two are never held at once).
    pub(crate) fn get(&mut self, shape: ArenaShape) -> &mut TrbArena {
        if self.cached.as_ref().is_none_or(|(s, _)| *s != shape) {
            self.cached = None;
            let arena = TrbArena::new(shape.rings, shape.map_entries, shape.map_buckets);
            self.builds += 1;
            self.cached = Some((shape, arena));
        }
        let (_, arena) = self.cached.as_mut().expect("just filled");
        arena
    }

    /// Arenas built over the cache's life.
    pub(crate) fn builds(&self) -> u64 {
        self.builds
    }
}

#[cfg(test)]
mod tests {
    use super::super::engine::{Access, Engine};
    use super::*;
    use simpler_tensormap::ByteSpan;
    use simpler_tensormap::fixed::AccessMode;

    fn shape(task_window: u32) -> ArenaShape {
        let ring = RingSizes { task_window, heap_bytes: 16 << 10, dep_pool: 16 };
        ArenaShape { rings: [ring; HEAP_RING_COUNT], map_entries: 64, map_buckets: 16 }
    }

    #[test]
    fn one_sizing_builds_once_and_a_new_sizing_rebuilds() {
        let mut cache = ArenaCache::default();
        let span = ByteSpan::new(0x1000, 0x1100).unwrap();
        let write = Access { key: 0x1000, span, mode: AccessMode::Write };
        let read = Access { mode: AccessMode::Read, ..write };
        for _ in 0..3 {
            // Each run is abandoned midway: the writer completed, its reader still queued.
            let mut e = Engine::new(cache.get(shape(16)));
            let w = e.submit(&[write], 1).unwrap().id;
            e.submit(&[read], 1).unwrap();
            let c = e.completer();
            assert_eq!(c.pop_ready(), Some(w), "a reused arena starts empty");
            assert_eq!(c.pop_ready(), None);
            c.complete(w);
            assert_eq!(e.incomplete(), 1, "counts start from zero");
        }
        assert_eq!(cache.builds(), 1);
        assert_eq!(cache.get(shape(32)).sizes()[0].task_window, 32);
        assert_eq!(cache.builds(), 2);
        cache.get(shape(32));
        assert_eq!(cache.builds(), 2);
    }
}
