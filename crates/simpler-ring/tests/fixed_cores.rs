//! Property tests of the fixed-capacity cores: the pure bump rule, `HeapRingCore` over a
//! caller-provided record array, and `TaskWindowCore`, each against a std-collection model.

use std::collections::VecDeque;

use proptest::prelude::*;
use simpler_ring::fixed::{
    FixedRecords, HeapRecord, HeapRingCore, Placement, ReleaseOutcome, SlotWord, TaskWindowCore,
    WindowRetire, bump, largest_fit, occupied_bytes,
};

const K: u64 = 1024;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

/// `true` when byte `b` is occupied in a ring with cursors `top` and `tail`.
fn occupied(size: u64, top: u64, tail: u64, b: u64) -> bool {
    if top >= tail { b >= tail && b < top } else { b >= tail || b < top && b < size }
}

/// Ring size in KiB, then top and tail in KiB, each within the ring.
fn cursors() -> impl Strategy<Value = (u64, u64, u64)> {
    (1u64..=32)
        .prop_flat_map(|n| (Just(n * K), (0..=n).prop_map(|t| t * K), (0..=n).prop_map(|l| l * K)))
        .prop_filter("an empty ring has both cursors at 0", |(_, t, l)| t != l || *t == 0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn bump_places_slabs_only_in_free_aligned_space_and_exactly_up_to_the_largest_fit(
        (size, top, tail) in cursors(),
        units in 1u64..=33,
    ) {
        let a = units * K;
        let fit = largest_fit(size, top, tail);
        prop_assert_eq!(fit % K, 0);
        match bump(size, top, tail, a) {
            Some(Placement { offset, new_top }) => {
                prop_assert!(a <= fit);
                prop_assert_eq!(offset % K, 0);
                prop_assert_eq!(new_top, offset + a);
                prop_assert!(new_top <= size);
                for b in (offset..new_top).step_by(K as usize) {
                    prop_assert!(!occupied(size, top, tail, b), "byte {} is live", b);
                }
                // The new state is never ambiguous: a non-empty ring never has top == tail.
                prop_assert_ne!(new_top, tail);
                let grown = occupied_bytes(size, new_top, tail) - occupied_bytes(size, top, tail);
                let skipped = if offset == top { 0 } else { size - top };
                prop_assert_eq!(grown, a + skipped);
            }
            None => prop_assert!(a > fit),
        }
    }

    #[test]
    fn heap_ring_core_over_fixed_records_matches_a_fifo_model(
        ops in prop::collection::vec((0u8..9, 1u64..=6, any::<prop::sample::Index>()), 1..150),
        capacity in 1usize..8,
    ) {
        const SIZE: u64 = 16 * K;
        let mut slots = vec![HeapRecord::default(); capacity];
        let mut core = HeapRingCore::new(SIZE, FixedRecords::new(&mut slots)).unwrap();
        // Model: (seq, offset, len, released) in FIFO order, and the cursors.
        let mut fifo: VecDeque<(u64, u64, u64, bool)> = VecDeque::new();
        let (mut top, mut tail, mut next_seq) = (0u64, 0u64, 0u64);
        // High-water marks since the last reset: live bytes, live slabs, occupied bytes.
        let (mut peak_bytes, mut peak_allocs, mut peak_occupied) = (0u64, 0u32, 0u64);
        let mut total = (0u64, 0u64);
        for (op, units, pick) in ops {
            if op == 8 {
                // Rarely: reset (refused while records remain) or reset the peaks.
                let drained = fifo.is_empty();
                if pick.index(2) == 0 {
                    prop_assert_eq!(core.reset(), drained);
                } else {
                    core.reset_peaks();
                }
                if drained || pick.index(2) == 1 {
                    peak_bytes = fifo.iter().filter(|r| !r.3).map(|r| r.2).sum();
                    peak_allocs = fifo.iter().filter(|r| !r.3).count() as u32;
                    peak_occupied = occupied_bytes(SIZE, top, tail);
                }
            } else if op % 2 == 0 {
                let a = units * K;
                let place = bump(SIZE, top, tail, a);
                prop_assert_eq!(core.try_place(a), place);
                if let Some(p) = place {
                    let grant = core.push_record(p, next_seq + 100);
                    if fifo.len() == capacity {
                        prop_assert_eq!(grant, None);
                    } else {
                        let g = grant.unwrap();
                        prop_assert_eq!((g.seq, g.offset, g.len), (next_seq, p.offset, a));
                        fifo.push_back((next_seq, p.offset, a, false));
                        next_seq += 1;
                        top = p.new_top;
                        total = (total.0 + 1, total.1 + a);
                    }
                }
            } else {
                // Release a random issued sequence number, live or not.
                let seq = if next_seq == 0 { 0 } else { pick.index(next_seq as usize) as u64 };
                let got = core.mark_released(seq);
                match fifo.iter_mut().find(|r| r.0 == seq) {
                    None => prop_assert_eq!(got, ReleaseOutcome::NotFound),
                    Some(r) if r.3 => prop_assert_eq!(got, ReleaseOutcome::AlreadyReleased),
                    Some(r) => {
                        r.3 = true;
                        let len = r.2;
                        let before = tail;
                        while fifo.front().is_some_and(|r| r.3) {
                            let r = fifo.pop_front().unwrap();
                            tail = r.1 + r.2;
                        }
                        let rewound = fifo.is_empty();
                        if rewound {
                            top = 0;
                            tail = 0;
                        }
                        prop_assert_eq!(got, ReleaseOutcome::Released { len, tail_moved: tail != before || rewound, rewound });
                    }
                }
            }
            prop_assert_eq!((core.top(), core.tail()), (top, tail));
            let live: u64 = fifo.iter().filter(|r| !r.3).map(|r| r.2).sum();
            prop_assert_eq!(core.live_bytes(), live);
            let allocs = fifo.iter().filter(|r| !r.3).count() as u32;
            peak_bytes = peak_bytes.max(live);
            peak_allocs = peak_allocs.max(allocs);
            peak_occupied = peak_occupied.max(occupied_bytes(SIZE, top, tail));
            prop_assert_eq!(core.live_allocs(), allocs);
            prop_assert_eq!(
                (core.peak_live_bytes(), core.peak_live_allocs(), core.peak_occupied_bytes()),
                (peak_bytes, peak_allocs, peak_occupied)
            );
            prop_assert_eq!((core.total_allocs(), core.total_bytes()), total);
            prop_assert_eq!(core.next_seq(), next_seq);
            prop_assert_eq!(core.largest_fit(), largest_fit(SIZE, top, tail));
            prop_assert_eq!(core.oldest_live().map(|r| r.seq), fifo.front().map(|r| r.0));
            prop_assert!(core.oldest_live().is_none_or(|r| !r.is_released()));
        }
    }

    #[test]
    fn task_window_core_matches_a_fifo_model(
        ops in prop::collection::vec((0u8..3, any::<prop::sample::Index>()), 1..200),
        log_size in 0u32..4,
        start in any::<u32>(),
    ) {
        let size = 1usize << log_size;
        let words: Vec<SlotWord> = (0..size).map(|_| SlotWord::new(0)).collect();
        let mut window = TaskWindowCore::new(&words).unwrap();
        let retirer = window.retirer();
        // Model: unreclaimed ids in FIFO order with their retired flag, and the ids reclaimed
        // while their slot was not reused yet.
        let mut model: VecDeque<(u32, bool)> = VecDeque::new();
        let mut reclaimed_ids: VecDeque<u32> = VecDeque::new();
        // Start at a later id sometimes; ids are opaque u32 values.
        for _ in 0..(start % 5) {
            let id = window.try_issue().unwrap();
            retirer.retire(id);
            window.reclaim();
            reclaimed_ids.retain(|&old| id.wrapping_sub(old) < size as u32);
            reclaimed_ids.push_back(id);
        }
        let mut next = window.head();
        let reclaim = |model: &mut VecDeque<(u32, bool)>, reclaimed_ids: &mut VecDeque<u32>| {
            let mut n = 0;
            while model.front().is_some_and(|e| e.1) {
                reclaimed_ids.push_back(model.pop_front().unwrap().0);
                n += 1;
            }
            n
        };
        for (op, pick) in ops {
            match op {
                0 => {
                    let got = window.try_issue();
                    if model.len() == size {
                        reclaim(&mut model, &mut reclaimed_ids);
                    }
                    if model.len() == size {
                        prop_assert_eq!(got, None);
                    } else {
                        prop_assert_eq!(got, Some(next));
                        model.push_back((next, false));
                        // The new id takes the slot of the id issued one lap before.
                        reclaimed_ids.retain(|&id| next.wrapping_sub(id) < size as u32);
                        next = next.wrapping_add(1);
                    }
                }
                1 => {
                    // Any id near the window: live, reclaimed, reused or never issued.
                    let span = model.len() + reclaimed_ids.len() + 2;
                    let back = pick.index(span) as u32;
                    let local = next.wrapping_add(1).wrapping_sub(back);
                    let got = retirer.retire(local);
                    match model.iter_mut().find(|e| e.0 == local) {
                        Some(e) if e.1 => prop_assert_eq!(got, WindowRetire::AlreadyRetired),
                        Some(e) => {
                            e.1 = true;
                            prop_assert_eq!(got, WindowRetire::Retired);
                        }
                        None if reclaimed_ids.contains(&local) => {
                            prop_assert_eq!(got, WindowRetire::AlreadyRetired);
                        }
                        None => prop_assert_eq!(got, WindowRetire::NotLive),
                    }
                }
                _ => {
                    let expected = reclaim(&mut model, &mut reclaimed_ids);
                    prop_assert_eq!(window.reclaim(), expected);
                }
            }
            prop_assert_eq!(window.live() as usize, model.len());
            prop_assert_eq!(window.tail(), model.front().map_or(next, |e| e.0));
            for &(local, retired) in &model {
                prop_assert!(window.is_live(local));
                prop_assert_eq!(window.is_retired(local), retired);
                prop_assert!(window.slot_of(local) < size);
            }
            // Live ids occupy distinct slots.
            let mut used: Vec<usize> = model.iter().map(|e| window.slot_of(e.0)).collect();
            used.sort_unstable();
            used.dedup();
            prop_assert_eq!(used.len(), model.len());
        }
    }
}
