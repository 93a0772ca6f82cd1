//! Conformance: the behaviours of `docs/ring.md`, one test each, named after the behaviour.

mod common;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{K, RING, eventually, ring, ring_with_timeout};
use simpler_ring::{HeapBacking, HeapRegion, Ring, RingConfig, RingError, ScopeStack};
use simpler_types::{RingIndex, SlotId};

fn heap_exhausted(
    result: Result<simpler_ring::Allocation, RingError>,
) -> simpler_ring::HeapExhausted {
    match result {
        Err(RingError::HeapExhausted(e)) => *e,
        other => panic!("expected HeapExhausted, got {other:?}"),
    }
}

fn slot_only_ring() -> Ring<common::Payload> {
    Ring::new(RingConfig { heap_bytes_per_ring: 0, ..RingConfig::default() }).unwrap()
}

// ---- Ring -----------------------------------------------------------------------------------

#[test]
fn eight_slot_only_allocations_return_distinct_live_ids_and_no_heap_span() {
    let ring = ring();
    let allocs: Vec<_> = (0..8).map(|_| ring.try_alloc(0, 0).unwrap()).collect();
    let ids: HashSet<SlotId> = allocs.iter().map(|a| a.slot).collect();
    assert_eq!(ids.len(), 8);
    assert!(allocs.iter().all(|a| a.heap.is_none() && ring.is_live(a.slot)));
}

#[test]
fn two_thousand_forty_eight_slot_only_allocations_all_succeed_and_count_as_live() {
    let ring = slot_only_ring();
    for _ in 0..2048 {
        ring.try_alloc(0, 0).unwrap();
    }
    assert_eq!(ring.stats().window.live, 2048);
}

#[test]
fn small_requests_get_consecutive_1024_byte_slabs_at_aligned_offsets() {
    let ring = ring();
    let spans: Vec<_> = (0..4).map(|_| ring.try_alloc(100, 0).unwrap().heap.unwrap()).collect();
    for (i, span) in spans.iter().enumerate() {
        assert_eq!((span.len, span.requested), (K, 100));
        assert_eq!(span.offset, i as u64 * K);
        assert_eq!(span.offset % K, 0);
        assert_eq!(span.addr, ring.heap_region(RingIndex::ZERO).unwrap().base + span.offset);
    }
}

#[test]
fn a_request_larger_than_the_ring_fails_at_once_with_request_too_large() {
    let ring = ring_with_timeout(Duration::from_secs(60));
    assert_eq!(
        ring.alloc(RING + 1, 2),
        Err(RingError::RequestTooLarge {
            ring: RingIndex::new(2).unwrap(),
            requested: RING + 1,
            aligned: Some(RING + K),
            ring_size: RING,
        })
    );
    assert!(matches!(
        ring.alloc(u64::MAX, 0),
        Err(RingError::RequestTooLarge { aligned: None, .. })
    ));
    let text = ring.alloc(RING + 1, 2).unwrap_err().to_string();
    assert!(text.contains("ring 2") && text.contains("16384"), "{text}");
}

#[test]
fn heap_requests_fail_with_heap_disabled_while_slot_only_allocations_work() {
    let ring = slot_only_ring();
    assert_eq!(ring.try_alloc(1, 0), Err(RingError::HeapDisabled { requested: 1 }));
    assert!(ring.try_alloc(0, 0).unwrap().heap.is_none());
    assert_eq!(ring.heap_region(RingIndex::ZERO), None);
    assert_eq!(ring.ring_of_addr(0x1000), None);
}

#[test]
fn fifo_a_released_slab_behind_the_oldest_frees_nothing_until_the_oldest_goes() {
    let ring = ring_with_timeout(Duration::from_millis(20));
    let slabs: Vec<_> = (0..4).map(|_| ring.alloc(4 * K, 0).unwrap()).collect();
    assert!(ring.release(slabs[1].slot));
    heap_exhausted(ring.alloc(4 * K, 0));
    assert!(ring.release(slabs[0].slot));
    let next = ring.alloc(4 * K, 0).unwrap().heap.unwrap();
    assert_eq!(next.offset, 0);
}

#[test]
fn wrap_places_the_next_slab_at_offset_zero_once_the_front_is_free() {
    let ring = ring();
    let a = ring.try_alloc(6 * K, 0).unwrap();
    let _b = ring.try_alloc(6 * K, 0).unwrap();
    assert!(ring.release(a.slot));
    // 4 KiB remain at the end; the 5 KiB request wraps to the freed front.
    let c = ring.try_alloc(5 * K, 0).unwrap().heap.unwrap();
    assert_eq!(c.offset, 0);
    let stats = ring.stats().heaps[0];
    assert_eq!((stats.top, stats.tail), (5 * K, 6 * K));
}

#[test]
fn a_payload_reference_keeps_its_address_and_contents_across_1000_allocations() {
    let ring = slot_only_ring();
    let id = ring.try_alloc(0, 0).unwrap().slot;
    let payload = ring.slot(id).unwrap();
    payload.value.store(0xC0FFEE, Ordering::Relaxed);
    let before: *const common::Payload = payload;
    for _ in 0..1000 {
        ring.try_alloc(0, 0).unwrap();
    }
    let after: *const common::Payload = ring.slot(id).unwrap();
    assert_eq!(before, after);
    assert_eq!(payload.value.load(Ordering::Relaxed), 0xC0FFEE);
}

#[test]
fn reset_to_empty_with_a_live_slot_fails_with_not_quiescent_and_changes_nothing() {
    let ring = ring();
    let a = ring.try_alloc(2 * K, 1).unwrap();
    let before = ring.stats();
    assert_eq!(
        ring.reset_to_empty(),
        Err(RingError::NotQuiescent { live_slots: 1, live_allocs: [0, 1, 0, 0] })
    );
    assert_eq!(ring.stats(), before);
    assert!(ring.is_live(a.slot));
}

#[test]
fn reset_to_empty_after_every_release_succeeds_and_makes_earlier_ids_stale() {
    let ring = ring();
    let ids: Vec<_> = (0..3).map(|d| ring.try_alloc(K, d).unwrap().slot).collect();
    for id in &ids {
        assert!(ring.release(*id));
    }
    ring.reset_to_empty().unwrap();
    let fresh: Vec<_> = (0..3).map(|d| ring.try_alloc(K, d).unwrap().slot).collect();
    for id in &ids {
        assert!(!ring.is_live(*id));
        assert!(!fresh.contains(id));
        assert!(!ring.release(*id));
    }
}

#[test]
fn a_blocked_allocation_proceeds_once_another_thread_releases_enough() {
    let ring = ring_with_timeout(Duration::from_secs(60));
    let full = ring.alloc(RING, 1).unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| ring.alloc(8 * K, 1));
        eventually("the allocation to block", || ring.stats().heaps[1].waits == 1);
        assert!(ring.release(full.slot));
        let got = waiter.join().unwrap().unwrap().heap.unwrap();
        assert_eq!((got.ring.get(), got.offset), (1, 0));
    });
}

#[test]
fn a_full_ring_with_a_50ms_deadline_fails_with_heap_exhausted_naming_ring_and_sizes() {
    let ring = ring_with_timeout(Duration::from_secs(60));
    let _full = ring.alloc(RING, 2).unwrap();
    let deadline = Instant::now() + Duration::from_millis(50);
    let e = heap_exhausted(ring.alloc_until(300, 2, Some(deadline)));
    assert_eq!(e.ring, RingIndex::new(2).unwrap());
    assert_eq!((e.requested, e.aligned, e.ring_size), (300, K, RING));
    assert_eq!((e.live_bytes, e.occupied_bytes, e.largest_fit, e.live_allocs), (RING, RING, 0, 1));
    let text = RingError::HeapExhausted(Box::new(e)).to_string();
    assert!(text.contains("ring 2") && text.contains("300") && text.contains("16384"), "{text}");
    assert_eq!(ring.stats().heaps[2].timeouts, 1);
}

#[test]
fn shutdown_wakes_a_blocked_allocation_with_shutdown() {
    let ring = ring_with_timeout(Duration::from_secs(60));
    let full = ring.alloc(RING, 0).unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| ring.alloc_until(K, 0, None));
        eventually("the allocation to block", || ring.stats().heaps[0].waits == 1);
        ring.shutdown();
        assert_eq!(waiter.join().unwrap(), Err(RingError::Shutdown));
    });
    assert!(ring.is_shutdown());
    assert_eq!(ring.try_alloc(0, 0), Err(RingError::Shutdown));
    assert!(ring.release(full.slot), "release keeps working after shutdown");
}

#[test]
fn depths_zero_to_three_select_rings_zero_to_three_and_deeper_ones_ring_three() {
    let ring = ring();
    for (depth, want) in [(0, 0), (1, 1), (2, 2), (3, 3), (4, 3), (64, 3)] {
        assert_eq!(RingIndex::for_depth(depth).get(), want);
        assert_eq!(ring.try_alloc(K, depth).unwrap().heap.unwrap().ring.get(), want);
    }
}

#[test]
fn the_four_anonymous_rings_are_distinct_non_overlapping_regions_of_the_configured_size() {
    let ring: Ring<()> =
        Ring::new(RingConfig { heap_bytes_per_ring: 1 << 20, ..RingConfig::default() }).unwrap();
    let regions: Vec<HeapRegion> = RingIndex::all().map(|r| ring.heap_region(r).unwrap()).collect();
    for (i, a) in regions.iter().enumerate() {
        assert_eq!(a.len, 1 << 20);
        assert_eq!(a.base % K, 0);
        assert_ne!(a.base, 0);
        for b in &regions[i + 1..] {
            assert!(a.base + a.len <= b.base || b.base + b.len <= a.base, "{a:?} overlaps {b:?}");
        }
    }
}

#[test]
fn a_slab_allocated_at_depth_d_lies_inside_ring_min_d_3_and_records_it() {
    let ring = ring();
    for depth in [0, 1, 2, 3, 7] {
        let span = ring.try_alloc(3000, depth).unwrap().heap.unwrap();
        let want = RingIndex::for_depth(depth);
        assert_eq!(span.ring, want);
        let region = ring.heap_region(want).unwrap();
        assert!(region.contains(span.addr) && region.contains(span.addr + span.len - 1));
        assert_eq!(ring.ring_of_addr(span.addr), Some(want));
        assert_eq!(ring.ring_of_addr(span.addr + span.len - 1), Some(want));
    }
    assert_eq!(ring.ring_of_addr(1), None);
}

#[test]
fn a_full_ring_one_does_not_block_rings_zero_and_three() {
    let ring = ring_with_timeout(Duration::from_millis(20));
    let _full = ring.alloc(RING, 1).unwrap();
    assert!(ring.alloc(K, 0).is_ok());
    assert!(ring.alloc(K, 3).is_ok());
    assert_eq!(heap_exhausted(ring.alloc(K, 1)).ring.get(), 1);
}

#[test]
fn churn_on_ring_one_leaves_ring_zero_untouched_and_drains_to_top_equal_tail() {
    let ring = ring();
    let _pin = ring.try_alloc(3 * K, 0).unwrap();
    let ring0 = ring.stats().heaps[0];
    let mut live = std::collections::VecDeque::new();
    for i in 0..50u64 {
        live.push_back(ring.try_alloc(1 + (i * 977) % (5 * K), 1).unwrap().slot);
        if live.len() > 2 {
            assert!(ring.release(live.pop_front().unwrap()));
        }
    }
    assert_eq!(ring.stats().heaps[0], ring0);
    for id in live {
        assert!(ring.release(id));
    }
    let ring1 = ring.stats().heaps[1];
    assert_eq!((ring1.top, ring1.tail), (0, 0));
    assert_eq!(ring.stats().heaps[0], ring0);
}

#[test]
fn after_reset_to_empty_every_ring_has_zero_cursors() {
    let ring = ring();
    for depth in 0..4 {
        let a = ring.try_alloc(5 * K, depth).unwrap();
        let _ = ring.try_alloc(K, depth).unwrap();
        assert!(ring.release(a.slot));
    }
    // Release the rest in allocation order through fresh knowledge of the window.
    let live: Vec<SlotId> = (0..ring.stats().window.capacity)
        .filter_map(|i| ring.generation(i).map(|g| SlotId::new(i, g)))
        .filter(|id| ring.is_live(*id))
        .collect();
    for id in live {
        assert!(ring.release(id));
    }
    ring.reset_to_empty().unwrap();
    for h in ring.stats().heaps {
        assert_eq!((h.top, h.tail, h.live_bytes, h.live_allocs), (0, 0, 0, 0));
        assert_eq!((h.peak_live_bytes, h.peak_occupied_bytes, h.peak_live_allocs), (0, 0, 0));
    }
}

#[test]
fn slabs_record_their_ring_and_a_per_ring_sequence_number() {
    let ring = ring();
    let a = ring.try_alloc(K, 2).unwrap().heap.unwrap();
    let b = ring.try_alloc(K, 2).unwrap().heap.unwrap();
    let c = ring.try_alloc(K, 0).unwrap().heap.unwrap();
    assert_eq!((a.ring.get(), a.seq), (2, 0));
    assert_eq!((b.ring.get(), b.seq), (2, 1));
    assert_eq!((c.ring.get(), c.seq), (0, 0));
}

#[test]
fn after_draining_a_partly_filled_ring_a_full_size_request_succeeds_immediately() {
    let ring = ring();
    let ids: Vec<_> = (0..5).map(|_| ring.try_alloc(3 * K, 0).unwrap().slot).collect();
    for id in ids.into_iter().rev() {
        assert!(ring.release(id));
    }
    let span = ring.try_alloc(RING, 0).unwrap().heap.unwrap();
    assert_eq!((span.offset, span.len), (0, RING));
    assert_eq!(ring.stats().heaps[0].rewinds, 1);
}

#[test]
fn releasing_an_id_twice_returns_false_the_second_time_and_changes_no_stats() {
    let ring = ring();
    let a = ring.try_alloc(K, 0).unwrap();
    let _b = ring.try_alloc(K, 0).unwrap();
    assert!(ring.release(a.slot));
    let before = ring.stats();
    assert!(!ring.release(a.slot));
    assert_eq!(ring.stats(), before);
}

#[test]
fn a_recycled_entry_gets_a_higher_generation_and_the_old_id_is_stale() {
    let ring = ring();
    let old = ring.try_alloc(0, 0).unwrap().slot;
    assert!(ring.release(old));
    let new = ring.try_alloc(0, 0).unwrap().slot;
    assert_eq!(new.index, old.index, "the most recently freed entry is reused");
    assert!(new.generation > old.generation);
    assert!(!ring.is_live(old) && ring.slot(old).is_none());
    assert!(ring.is_live(new));
    assert_eq!(ring.generation(new.index), Some(new.generation));
}

#[test]
fn peaks_keep_the_high_water_mark_until_reset_peaks() {
    let ring = ring();
    let ids: Vec<_> = (0..3).map(|_| ring.try_alloc(K, 0).unwrap().slot).collect();
    for id in ids {
        assert!(ring.release(id));
    }
    let h = ring.stats().heaps[0];
    assert_eq!((h.peak_live_bytes, h.live_bytes, h.peak_live_allocs), (3 * K, 0, 3));
    assert_eq!(ring.stats().window.peak_live, 3);
    ring.reset_peaks();
    let stats = ring.stats();
    assert_eq!((stats.heaps[0].peak_live_bytes, stats.heaps[0].peak_occupied_bytes), (0, 0));
    assert_eq!(stats.window.peak_live, 0);
}

#[test]
fn heap_exhausted_names_the_oldest_live_slab_that_pins_the_tail() {
    let ring = ring();
    let a = ring.try_alloc(4 * K, 3).unwrap();
    let b = ring.try_alloc(4 * K, 3).unwrap();
    let _c = ring.try_alloc(8 * K, 3).unwrap();
    assert_eq!(heap_exhausted(ring.try_alloc(K, 3)).oldest_live, Some(a.slot));
    assert!(ring.release(a.slot));
    let e = heap_exhausted(ring.try_alloc(4 * K, 3));
    assert_eq!(e.oldest_live, Some(b.slot));
    assert_eq!(e.largest_fit, 3 * K, "the wrap needs strictly more room than the request");
    assert_eq!(e.waited, Duration::ZERO);
}

#[test]
fn a_capped_window_makes_the_fifth_allocation_wait_for_a_release() {
    let ring = common::capped_ring(4);
    let ids: Vec<_> = (0..4).map(|_| ring.alloc(0, 0).unwrap().slot).collect();
    assert_eq!(
        ring.try_alloc(0, 0),
        Err(RingError::TaskWindowExhausted { limit: 4, live: 4, waited: Duration::ZERO })
    );
    std::thread::scope(|s| {
        let waiter = s.spawn(|| ring.alloc(K, 0));
        eventually("the allocation to block", || ring.stats().window.waits == 1);
        assert!(ring.release(ids[2]));
        let got = waiter.join().unwrap().unwrap();
        assert_eq!(got.slot.index, ids[2].index);
    });
    let w = ring.stats().window;
    assert_eq!((w.live, w.limit, w.timeouts, w.capacity), (4, Some(4), 1, 4));
}

#[test]
fn the_window_peak_counts_a_slab_allocation_from_its_reservation_not_its_publish() {
    let ring = common::capped_ring(4);
    let full = ring.alloc(RING, 0).unwrap();
    let others: Vec<_> = (0..2).map(|_| ring.alloc(0, 0).unwrap().slot).collect();
    std::thread::scope(|s| {
        // Reserves the fourth entry, then waits for heap space.
        let waiter = s.spawn(|| ring.alloc(K, 0));
        eventually("the allocation to block", || ring.stats().heaps[0].waits == 1);
        assert_eq!(ring.stats().window.live, 4);
        for id in &others {
            assert!(ring.release(*id));
        }
        assert!(ring.release(full.slot));
        let first = waiter.join().unwrap().unwrap();
        assert!(ring.release(first.slot));
    });
    let w = ring.stats().window;
    assert_eq!((w.live, w.peak_live), (0, 4), "four entries were live at once");

    // A reset of the peaks while such an allocation waits forgets what came before it.
    let full = ring.alloc(RING, 0).unwrap();
    let others: Vec<_> = (0..2).map(|_| ring.alloc(0, 0).unwrap().slot).collect();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| ring.alloc(K, 0));
        eventually("the allocation to block", || ring.stats().heaps[0].waits == 2);
        for id in &others {
            assert!(ring.release(*id));
        }
        ring.reset_peaks();
        assert!(ring.release(full.slot));
        waiter.join().unwrap().unwrap();
    });
    let w = ring.stats().window;
    assert_eq!(w.peak_live, 2, "live at the reset: the waiter's entry and the full slab's");
}

#[test]
fn a_refused_probe_counts_no_timeout_where_a_refused_try_alloc_counts_one() {
    let ring = common::capped_ring(2);
    let _pin = ring.alloc(RING, 2).unwrap();
    assert!(matches!(ring.probe_alloc(K, 2), Err(RingError::HeapExhausted(_))));
    let _second = ring.alloc(0, 0).unwrap();
    assert!(matches!(ring.probe_alloc(0, 0), Err(RingError::TaskWindowExhausted { .. })));
    let stats = ring.stats();
    assert_eq!((stats.window.timeouts, stats.heaps[2].timeouts), (0, 0), "probes are not refusals");
    assert!(ring.try_alloc(0, 0).is_err());
    assert_eq!(ring.stats().window.timeouts, 1);
}

// ---- Scope stack ----------------------------------------------------------------------------

fn ids(n: u32, from: u32) -> Vec<SlotId> {
    (from..from + n).map(|i| SlotId::new(i, 1)).collect()
}

#[test]
fn a_new_scope_stack_has_depth_zero() {
    let s = ScopeStack::new();
    assert_eq!(s.depth(), 0);
    assert_eq!(s.ring_index(), RingIndex::ZERO);
}

#[test]
fn ending_a_scope_without_begin_fails_with_scope_underflow() {
    let mut s = ScopeStack::new();
    let mut out = Vec::new();
    assert_eq!(s.end_into(&mut out), Err(RingError::ScopeUnderflow));
    assert!(out.is_empty());
}

#[test]
fn one_scope_returns_its_slots_in_registration_order_and_depth_returns_to_zero() {
    let mut s = ScopeStack::new();
    s.begin().unwrap();
    for id in ids(3, 0) {
        s.register(id);
    }
    let mut out = Vec::new();
    s.end_into(&mut out).unwrap();
    assert_eq!(out, ids(3, 0));
    assert_eq!(s.depth(), 0);
}

#[test]
fn registering_at_depth_zero_is_a_no_op() {
    let mut s = ScopeStack::new();
    s.register(SlotId::new(9, 1));
    s.begin().unwrap();
    let mut out = Vec::new();
    s.end_into(&mut out).unwrap();
    assert!(out.is_empty());
}

#[test]
fn nested_scopes_return_inner_slots_at_inner_end_and_outer_slots_at_outer_end() {
    let mut s = ScopeStack::new();
    s.begin().unwrap();
    s.register(SlotId::new(0, 1));
    s.begin().unwrap();
    s.register(SlotId::new(1, 1));
    s.register(SlotId::new(2, 1));
    assert_eq!(s.ring_index().get(), 1);
    let mut inner = Vec::new();
    s.end_into(&mut inner).unwrap();
    assert_eq!(inner, ids(2, 1));
    s.register(SlotId::new(3, 1));
    let mut outer = Vec::new();
    s.end_into(&mut outer).unwrap();
    assert_eq!(outer, vec![SlotId::new(0, 1), SlotId::new(3, 1)]);
}

#[test]
fn an_empty_scope_returns_nothing() {
    let mut s = ScopeStack::new();
    s.begin().unwrap();
    let mut out = vec![SlotId::new(7, 7)];
    s.end_into(&mut out).unwrap();
    assert_eq!(out, vec![SlotId::new(7, 7)], "end_into appends and returns nothing new");
}

#[test]
fn the_sixty_fifth_begin_fails_with_scope_depth_exceeded_and_leaves_depth_at_64() {
    let mut s = ScopeStack::new();
    for _ in 0..64 {
        s.begin().unwrap();
    }
    assert_eq!(s.begin(), Err(RingError::ScopeDepthExceeded { max: 64 }));
    assert_eq!(s.depth(), 64);
    assert_eq!(s.ring_index().get(), 3);
}

#[test]
fn unwinding_to_zero_returns_every_frames_slots_innermost_frame_first() {
    let mut s = ScopeStack::new();
    for frame in 0..3u32 {
        s.begin().unwrap();
        for id in ids(2, frame * 10) {
            s.register(id);
        }
    }
    let mut out = Vec::new();
    s.unwind_into(&mut out, 0);
    let mut want = ids(2, 20);
    want.extend(ids(2, 10));
    want.extend(ids(2, 0));
    assert_eq!(out, want);
    assert_eq!(s.depth(), 0);
}

// ---- Further behaviours -----------------------------------------------------------------------

#[test]
fn a_zero_timeout_never_waits() {
    let ring = ring_with_timeout(Duration::ZERO);
    let _full = ring.alloc(RING, 0).unwrap();
    let e = heap_exhausted(ring.alloc(K, 0));
    assert_eq!(e.waited, Duration::ZERO);
    let h = ring.stats().heaps[0];
    assert_eq!((h.waits, h.timeouts), (0, 1));
}

#[test]
fn a_failed_allocation_returns_its_window_entry() {
    let ring = ring();
    let _full = ring.try_alloc(RING, 0).unwrap();
    heap_exhausted(ring.try_alloc(K, 0));
    let w = ring.stats().window;
    assert_eq!((w.live, w.total_allocs), (1, 1));
    let next = ring.try_alloc(0, 0).unwrap().slot;
    assert_eq!(next, SlotId::new(1, 1), "the entry the failed call took is reused unchanged");
}

#[test]
fn ring_new_rejects_invalid_configs() {
    let bad = RingConfig { heap_bytes_per_ring: 1000, ..RingConfig::default() };
    assert!(matches!(Ring::<()>::new(bad), Err(RingError::InvalidConfig { .. })));
    let mut overlapping = common::regions(RING);
    overlapping[1].base = overlapping[0].base + K;
    let bad = RingConfig {
        backing: HeapBacking::External(overlapping),
        ..common::config(RING, Duration::ZERO)
    };
    assert!(matches!(Ring::<()>::new(bad), Err(RingError::InvalidConfig { .. })));
}

#[test]
fn the_ring_is_send_and_sync_for_a_send_sync_payload() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Ring<common::Payload>>();
    assert_send_sync::<ScopeStack>();
}
