//! Property test: the host `Ring` against a reference model built from std collections
//! (ring invariants 1–15; the scope-stack invariants 16–18 are in `scope_stack.rs`).
//!
//! The model keeps, per ring, a `VecDeque` of records and the two cursors driven by its own copy
//! of the bump rule, plus the window's generations, LIFO free list and the set of live ids. After
//! every operation the ring's statistics must equal the model's, and the invariants are checked
//! on what the ring actually returned.

mod common;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::Duration;

use common::{K, RING};
use proptest::prelude::*;
use proptest::sample;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};
use simpler_ring::{HeapRegion, HeapSpan, Ring, RingConfig, RingError, RingStats};
use simpler_types::{RingIndex, SlotId};

const BYTES: [u64; 9] = [0, 1, 100, 1024, 1025, RING / 3, RING, RING + 1, u64::MAX];

// ---- Model --------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct MRecord {
    seq: u64,
    offset: u64,
    len: u64,
    released: bool,
    slot: SlotId,
}

#[derive(Clone, Debug, Default)]
struct MRing {
    top: u64,
    tail: u64,
    next_seq: u64,
    records: VecDeque<MRecord>,
    peak_live_bytes: u64,
    peak_occupied: u64,
    peak_live_allocs: u32,
    total_allocs: u64,
    total_bytes: u64,
    timeouts: u64,
    rewinds: u64,
}

impl MRing {
    fn live_bytes(&self) -> u64 {
        self.records.iter().filter(|r| !r.released).map(|r| r.len).sum()
    }

    fn live_allocs(&self) -> u32 {
        self.records.iter().filter(|r| !r.released).count() as u32
    }

    fn occupied(&self) -> u64 {
        if self.top >= self.tail { self.top - self.tail } else { RING - self.tail + self.top }
    }

    /// The bump rule, written as a table independently of the code.
    fn place(&self, a: u64) -> Option<u64> {
        let (t, l) = (self.top, self.tail);
        if t >= l {
            if RING - t >= a {
                Some(t)
            } else if l > a {
                Some(0)
            } else {
                None
            }
        } else if l - t > a {
            Some(t)
        } else {
            None
        }
    }

    /// Largest multiple of 1024 that `place` accepts, found by trying every size.
    fn largest_fit(&self) -> u64 {
        (1..=RING / K).rev().map(|n| n * K).find(|&a| self.place(a).is_some()).unwrap_or(0)
    }

    fn bump_peaks(&mut self) {
        self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes());
        self.peak_occupied = self.peak_occupied.max(self.occupied());
        self.peak_live_allocs = self.peak_live_allocs.max(self.live_allocs());
    }

    fn reset_peaks(&mut self) {
        self.peak_live_bytes = self.live_bytes();
        self.peak_occupied = self.occupied();
        self.peak_live_allocs = self.live_allocs();
    }
}

#[derive(Clone, Debug, PartialEq)]
enum ExpectedErr {
    Shutdown,
    HeapDisabled,
    TooLarge {
        ring: u8,
        aligned: Option<u64>,
    },
    WindowFull {
        live: u32,
    },
    HeapFull {
        ring: u8,
        live_bytes: u64,
        occupied: u64,
        fit: u64,
        allocs: u32,
        oldest: Option<SlotId>,
    },
}

#[derive(Clone, Debug, PartialEq)]
struct ExpectedSpan {
    ring: u8,
    seq: u64,
    offset: u64,
    len: u64,
}

#[derive(Clone, Debug, PartialEq)]
enum Expect {
    Nothing,
    Alloc(Result<(SlotId, Option<ExpectedSpan>), ExpectedErr>),
    Release(bool),
    Reset(Result<(), (u32, [u32; 4])>),
}

#[derive(Clone, Debug)]
struct Model {
    heaps: bool,
    cap: Option<u32>,
    rings: [MRing; 4],
    generations: Vec<u32>,
    free: Vec<u32>,
    live: BTreeMap<SlotId, Option<(usize, u64)>>,
    issued: Vec<SlotId>,
    peak_live: u32,
    total_allocs: u64,
    window_timeouts: u64,
    shutdown: bool,
    last: Expect,
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { bytes: u64, depth: usize },
    Release(SlotId),
    ResetToEmpty,
    ResetPeaks,
    Stats,
    Shutdown,
}

impl Model {
    fn alloc(
        &mut self,
        bytes: u64,
        depth: usize,
    ) -> Result<(SlotId, Option<ExpectedSpan>), ExpectedErr> {
        if self.shutdown {
            return Err(ExpectedErr::Shutdown);
        }
        let ring = depth.min(3);
        if bytes > 0 && !self.heaps {
            return Err(ExpectedErr::HeapDisabled);
        }
        let aligned = bytes.checked_add(K - 1).map(|b| b / K * K);
        if bytes > 0 && aligned.is_none_or(|a| a > RING) {
            return Err(ExpectedErr::TooLarge { ring: ring as u8, aligned });
        }
        let live = self.live.len() as u32;
        if self.cap.is_some_and(|cap| live >= cap) {
            self.window_timeouts += 1;
            return Err(ExpectedErr::WindowFull { live });
        }
        let index = self.free.pop().unwrap_or_else(|| {
            self.generations.push(1);
            self.generations.len() as u32 - 1
        });
        let slot = SlotId::new(index, self.generations[index as usize]);
        let mut span = None;
        if bytes > 0 {
            let a = aligned.unwrap();
            let r = &mut self.rings[ring];
            let Some(offset) = r.place(a) else {
                self.free.push(index);
                r.timeouts += 1;
                return Err(ExpectedErr::HeapFull {
                    ring: ring as u8,
                    live_bytes: r.live_bytes(),
                    occupied: r.occupied(),
                    fit: r.largest_fit(),
                    allocs: r.live_allocs(),
                    oldest: r.records.front().map(|x| x.slot),
                });
            };
            let seq = r.next_seq;
            r.next_seq += 1;
            r.records.push_back(MRecord { seq, offset, len: a, released: false, slot });
            r.top = offset + a;
            r.total_allocs += 1;
            r.total_bytes += a;
            r.bump_peaks();
            span = Some(ExpectedSpan { ring: ring as u8, seq, offset, len: a });
        }
        self.live.insert(slot, span.as_ref().map(|s| (s.ring as usize, s.seq)));
        self.issued.push(slot);
        self.total_allocs += 1;
        self.peak_live = self.peak_live.max(self.live.len() as u32);
        Ok((slot, span))
    }

    fn release(&mut self, slot: SlotId) -> bool {
        let Some(heap) = self.live.remove(&slot) else {
            return false;
        };
        if let Some((ring, seq)) = heap {
            let r = &mut self.rings[ring];
            r.records.iter_mut().find(|x| x.seq == seq).unwrap().released = true;
            while r.records.front().is_some_and(|x| x.released) {
                let x = r.records.pop_front().unwrap();
                r.tail = x.offset + x.len;
            }
            if r.records.is_empty() {
                r.top = 0;
                r.tail = 0;
                r.rewinds += 1;
            }
        }
        self.generations[slot.index as usize] += 1;
        self.free.push(slot.index);
        true
    }

    fn reset_to_empty(&mut self) -> Result<(), (u32, [u32; 4])> {
        if !self.live.is_empty() {
            return Err((self.live.len() as u32, self.rings.each_ref().map(MRing::live_allocs)));
        }
        for r in &mut self.rings {
            r.top = 0;
            r.tail = 0;
            r.reset_peaks();
        }
        self.peak_live = 0;
        Ok(())
    }
}

struct RingModel;

impl ReferenceStateMachine for RingModel {
    type State = Model;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Model> {
        (prop::bool::weighted(0.9), prop_oneof![Just(None), (3u32..8).prop_map(Some)])
            .prop_map(|(heaps, cap)| Model {
                heaps,
                cap,
                rings: Default::default(),
                generations: Vec::new(),
                free: Vec::new(),
                live: BTreeMap::new(),
                issued: Vec::new(),
                peak_live: 0,
                total_allocs: 0,
                window_timeouts: 0,
                shutdown: false,
                last: Expect::Nothing,
            })
            .boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Op> {
        let alloc = (sample::select(BYTES.to_vec()), 0usize..6)
            .prop_map(|(bytes, depth)| Op::Alloc { bytes, depth });
        let any_id = if state.issued.is_empty() {
            Just(SlotId::new(0, 1)).boxed()
        } else {
            sample::select(state.issued.clone()).boxed()
        };
        let live_id = if state.live.is_empty() {
            any_id.clone()
        } else {
            sample::select(state.live.keys().copied().collect::<Vec<_>>()).boxed()
        };
        prop_oneof![
            40 => alloc,
            24 => live_id.prop_map(Op::Release),
            6 => any_id.prop_map(Op::Release),
            3 => Just(Op::ResetToEmpty),
            3 => Just(Op::ResetPeaks),
            3 => Just(Op::Stats),
            1 => Just(Op::Shutdown),
        ]
        .boxed()
    }

    fn apply(mut state: Model, op: &Op) -> Model {
        state.last = match *op {
            Op::Alloc { bytes, depth } => Expect::Alloc(state.alloc(bytes, depth)),
            Op::Release(slot) => Expect::Release(state.release(slot)),
            Op::ResetToEmpty => Expect::Reset(state.reset_to_empty()),
            Op::ResetPeaks => {
                state.rings.iter_mut().for_each(MRing::reset_peaks);
                state.peak_live = state.live.len() as u32;
                Expect::Nothing
            }
            Op::Stats => Expect::Nothing,
            Op::Shutdown => {
                state.shutdown = true;
                Expect::Nothing
            }
        };
        state
    }
}

// ---- System under test ------------------------------------------------------------------------

struct Sut {
    ring: Ring<()>,
    regions: Option<[HeapRegion; 4]>,
    spans: BTreeMap<SlotId, HeapSpan>,
    issued: HashSet<SlotId>,
    issued_in_order: Vec<SlotId>,
}

fn expected_err(e: &RingError) -> ExpectedErr {
    match e {
        RingError::Shutdown => ExpectedErr::Shutdown,
        RingError::HeapDisabled { .. } => ExpectedErr::HeapDisabled,
        RingError::RequestTooLarge { ring, aligned, ring_size, .. } => {
            assert_eq!(*ring_size, RING);
            ExpectedErr::TooLarge { ring: ring.get(), aligned: *aligned }
        }
        RingError::TaskWindowExhausted { live, waited, .. } => {
            assert_eq!(*waited, Duration::ZERO);
            ExpectedErr::WindowFull { live: *live }
        }
        RingError::HeapExhausted(h) => {
            assert_eq!((h.ring_size, h.waited, h.aligned % K), (RING, Duration::ZERO, 0));
            ExpectedErr::HeapFull {
                ring: h.ring.get(),
                live_bytes: h.live_bytes,
                occupied: h.occupied_bytes,
                fit: h.largest_fit,
                allocs: h.live_allocs,
                oldest: h.oldest_live,
            }
        }
        other => panic!("unexpected error {other:?}"),
    }
}

/// The oldest live slab of `ring` among what the ring handed out.
fn oldest_seq(spans: &BTreeMap<SlotId, HeapSpan>, ring: RingIndex) -> Option<u64> {
    spans.values().filter(|s| s.ring == ring).map(|s| s.seq).min()
}

struct RingTest;

impl StateMachineTest for RingTest {
    type SystemUnderTest = Sut;
    type Reference = RingModel;

    fn init_test(model: &Model) -> Sut {
        let mut config = common::config(RING, Duration::ZERO);
        config.max_live_slots = model.cap;
        let regions = common::regions(RING);
        if !model.heaps {
            config = RingConfig { heap_bytes_per_ring: 0, ..RingConfig::default() };
            config.max_live_slots = model.cap;
        }
        Sut {
            ring: Ring::new(config).unwrap(),
            regions: model.heaps.then_some(regions),
            spans: BTreeMap::new(),
            issued: HashSet::new(),
            issued_in_order: Vec::new(),
        }
    }

    fn apply(mut sut: Sut, model: &Model, op: Op) -> Sut {
        let before = sut.ring.stats();
        match op {
            Op::Alloc { bytes, depth } => {
                let got = sut.ring.try_alloc(bytes, depth);
                let Expect::Alloc(want) = &model.last else { unreachable!() };
                match (&got, want) {
                    (Ok(a), Ok((slot, span))) => {
                        assert_eq!(a.slot, *slot);
                        // Invariant 8: no id ever issued is issued again.
                        assert!(sut.issued.insert(a.slot), "{} issued twice", a.slot);
                        sut.issued_in_order.push(a.slot);
                        let got_span = a.heap.map(|h| ExpectedSpan {
                            ring: h.ring.get(),
                            seq: h.seq,
                            offset: h.offset,
                            len: h.len,
                        });
                        assert_eq!(&got_span, span);
                        match a.heap {
                            Some(h) => {
                                assert_eq!(h.requested, bytes);
                                assert_eq!(h.ring, RingIndex::for_depth(depth));
                                sut.spans.insert(a.slot, h);
                            }
                            // Invariant 15: slot-only allocations leave every heap alone.
                            None => assert_eq!(sut.ring.stats().heaps, before.heaps),
                        }
                    }
                    (Err(e), Err(want)) => {
                        assert_eq!(&expected_err(e), want);
                        // Invariants 13 and 14: refusals leave the ring as it was (apart from
                        // the refusal counters, checked against the model).
                        if matches!(
                            want,
                            ExpectedErr::Shutdown
                                | ExpectedErr::HeapDisabled
                                | ExpectedErr::TooLarge { .. }
                        ) {
                            assert_eq!(sut.ring.stats(), before);
                        }
                    }
                    _ => panic!(
                        "alloc({bytes}, {depth}): ring gave {got:?}, model expected {want:?}"
                    ),
                }
            }
            Op::Release(slot) => {
                let got = sut.ring.release(slot);
                assert_eq!(Expect::Release(got), model.last, "release({slot})");
                if got {
                    if let Some(span) = sut.spans.remove(&slot) {
                        let r = span.ring.as_usize();
                        let after = sut.ring.stats().heaps[r];
                        // Invariant 4: releasing a slab that is not the oldest moves nothing.
                        if oldest_seq(&sut.spans, span.ring).is_some_and(|o| o < span.seq) {
                            assert_eq!(
                                (after.tail, after.top, after.occupied_bytes),
                                (
                                    before.heaps[r].tail,
                                    before.heaps[r].top,
                                    before.heaps[r].occupied_bytes
                                )
                            );
                        }
                        // Invariant 10: other rings are untouched.
                        for other in (0..4).filter(|&o| o != r) {
                            assert_eq!(sut.ring.stats().heaps[other], before.heaps[other]);
                        }
                    }
                } else {
                    // Invariant 7: a stale release changes nothing.
                    assert_eq!(sut.ring.stats(), before);
                }
            }
            Op::ResetToEmpty => {
                let got = sut.ring.reset_to_empty();
                let Expect::Reset(want) = &model.last else { unreachable!() };
                match (&got, want) {
                    (Ok(()), Ok(())) => {
                        // Invariant 11: every earlier id is stale afterwards.
                        assert!(sut.issued.iter().all(|id| !sut.ring.is_live(*id)));
                        for h in sut.ring.stats().heaps {
                            assert_eq!((h.top, h.tail, h.live_allocs, h.live_bytes), (0, 0, 0, 0));
                        }
                    }
                    (
                        Err(RingError::NotQuiescent { live_slots, live_allocs }),
                        Err((n, allocs)),
                    ) => {
                        assert_eq!((live_slots, live_allocs), (n, allocs));
                        assert_eq!(sut.ring.stats(), before);
                    }
                    _ => panic!("reset_to_empty: ring gave {got:?}, model expected {want:?}"),
                }
            }
            Op::ResetPeaks => sut.ring.reset_peaks(),
            Op::Stats => {}
            Op::Shutdown => {
                sut.ring.shutdown();
                assert!(sut.ring.is_shutdown());
            }
        }
        sut
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        let stats: RingStats = sut.ring.stats();
        let w = stats.window;
        // Invariant 9: live = allocations − releases; peaks as the model saw them.
        assert_eq!(w.live as usize, model.live.len());
        assert_eq!(w.peak_live, model.peak_live);
        assert!(w.peak_live >= w.live);
        assert_eq!(w.capacity as usize, model.generations.len());
        assert_eq!(
            (w.total_allocs, w.timeouts, w.waits, w.limit),
            (model.total_allocs, model.window_timeouts, 0, model.cap)
        );

        for (i, (h, m)) in stats.heaps.iter().zip(&model.rings).enumerate() {
            assert_eq!(h.ring.as_usize(), i);
            let size = if model.heaps { RING } else { 0 };
            assert_eq!(h.size, size);
            assert_eq!((h.top, h.tail), (m.top, m.tail), "cursors of ring {i}");
            // Invariant 1.
            assert_eq!(h.live_bytes, m.live_bytes());
            assert!(h.live_bytes <= size);
            // Invariant 2.
            assert_eq!(h.occupied_bytes, m.occupied());
            assert!(h.live_bytes <= h.occupied_bytes && h.occupied_bytes <= size);
            // Invariant 5.
            if m.records.is_empty() {
                assert_eq!((h.top, h.tail), (0, 0));
            }
            assert_eq!(h.live_allocs, m.live_allocs());
            assert_eq!(
                (h.peak_live_bytes, h.peak_occupied_bytes, h.peak_live_allocs),
                (m.peak_live_bytes, m.peak_occupied, m.peak_live_allocs),
                "peaks of ring {i}"
            );
            assert!(h.peak_live_bytes >= h.live_bytes && h.peak_occupied_bytes >= h.occupied_bytes);
            assert_eq!(
                (h.total_allocs, h.total_bytes, h.timeouts, h.rewinds, h.waits),
                (m.total_allocs, m.total_bytes, m.timeouts, m.rewinds, 0)
            );
        }

        // Invariant 3: live slabs lie in their ring, are aligned, and never overlap.
        let mut spans: Vec<&HeapSpan> = sut.spans.values().collect();
        if let Some(regions) = sut.regions {
            for s in &spans {
                let region = regions[s.ring.as_usize()];
                assert_eq!(s.offset % K, 0);
                assert_eq!(s.addr, region.base + s.offset);
                assert!(s.offset + s.len <= region.len);
            }
        }
        spans.sort_by_key(|s| s.addr);
        for pair in spans.windows(2) {
            assert!(
                pair[0].addr + pair[0].len <= pair[1].addr,
                "{:?} overlaps {:?}",
                pair[0],
                pair[1]
            );
        }

        // Invariant 8: `slot(id)` is `Some` exactly for live ids; live ids are distinct.
        for id in &sut.issued_in_order {
            assert_eq!(sut.ring.slot(*id).is_some(), model.live.contains_key(id), "{id}");
        }
        assert_eq!(sut.spans.len(), model.live.values().filter(|h| h.is_some()).count());
        // An id carrying an entry's current generation is live only if it was handed out and
        // not released: a free entry never looks live.
        for index in 0..w.capacity {
            let generation = sut.ring.generation(index).unwrap();
            let id = SlotId::new(index, generation);
            assert_eq!(sut.ring.is_live(id), model.live.contains_key(&id), "{id}");
        }

        // Invariant 12: once shut down, nothing allocates (checked without changing state).
        if model.shutdown {
            assert!(sut.ring.is_shutdown());
        }
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
}

prop_state_machine! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 4096, ..ProptestConfig::default() })]

    #[test]
    fn ring_matches_its_reference_model(sequential 1..80 => RingTest);
}
