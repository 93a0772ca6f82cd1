//! Conformance behaviours of the tensor map (`docs/tensormap.md` §1–§6).
//!
//! "Looking up a key" in the A.7 sense (the whole buffer) is a lookup with `ByteSpan::ALL`.

use simpler_tensormap::{ByteSpan, TensorKey, TensorMap};
use simpler_types::{RunId, SlotId, WorkerId};

fn run(i: u64) -> RunId {
    RunId::from_raw(i).unwrap()
}

fn slot(i: u32) -> SlotId {
    SlotId::new(i, 1)
}

fn host(addr: u64) -> TensorKey {
    TensorKey::Host { addr }
}

fn child(worker: u32, addr: u64) -> TensorKey {
    TensorKey::Child { worker: WorkerId(worker), addr }
}

fn span(start: u64, end: u64) -> ByteSpan {
    ByteSpan::new(start, end).unwrap()
}

/// Every producer of `key` in `run` over the whole buffer, sorted.
fn producers(map: &TensorMap, run: RunId, key: TensorKey) -> Vec<SlotId> {
    producers_in(map, run, key, ByteSpan::ALL)
}

fn producers_in(map: &TensorMap, run: RunId, key: TensorKey, span: ByteSpan) -> Vec<SlotId> {
    let mut out = Vec::new();
    map.lookup_overlapping(run, &key, span, |s| out.push(s));
    out.sort_unstable();
    out
}

const R1: u64 = 1;

#[test]
fn lookup_in_an_empty_map_finds_nothing() {
    let map = TensorMap::new();
    assert!(producers(&map, run(R1), host(0x1000)).is_empty());
    assert!(map.is_empty());
    assert_eq!(map.len_run(run(R1)), 0);
}

#[test]
fn one_insert_is_found_under_its_key_only_and_counts_one() {
    let map = TensorMap::new();
    assert_eq!(map.insert(run(R1), host(0x1000), span(0x1000, 0x1100), slot(0)), 0);
    assert_eq!(producers(&map, run(R1), host(0x1000)), [slot(0)]);
    assert!(producers(&map, run(R1), host(0x2000)).is_empty());
    assert_eq!(map.len(), 1);
}

#[test]
fn inserting_the_same_key_twice_keeps_the_last_producer_and_one_entry() {
    let map = TensorMap::new();
    let whole = span(0x1000, 0x1100);
    map.insert(run(R1), host(0x1000), whole, slot(0));
    assert_eq!(map.insert(run(R1), host(0x1000), whole, slot(1)), 1, "the first is superseded");
    assert_eq!(producers(&map, run(R1), host(0x1000)), [slot(1)]);
    assert_eq!(map.len(), 1);
}

#[test]
fn erasing_a_tasks_listed_keys_removes_them_and_keeps_unlisted_keys() {
    let map = TensorMap::new();
    for addr in [0x1000, 0x2000, 0x3000] {
        map.insert(run(R1), host(addr), span(addr, addr + 0x100), slot(0));
    }
    assert_eq!(map.erase_owned(run(R1), slot(0), &[host(0x1000), host(0x2000)]), 2);
    assert!(producers(&map, run(R1), host(0x1000)).is_empty());
    assert!(producers(&map, run(R1), host(0x2000)).is_empty());
    assert_eq!(producers(&map, run(R1), host(0x3000)), [slot(0)]);
    assert_eq!(map.len(), 1);
}

#[test]
fn erasing_with_an_empty_key_list_is_a_no_op() {
    let map = TensorMap::new();
    map.insert(run(R1), host(0x1000), span(0x1000, 0x1100), slot(0));
    assert_eq!(map.erase_owned(run(R1), slot(0), &[]), 0);
    assert_eq!(map.len(), 1);
    assert_eq!(producers(&map, run(R1), host(0x1000)), [slot(0)]);
}

#[test]
fn a_hundred_distinct_keys_give_a_hundred_entries_each_with_its_own_producer() {
    let map = TensorMap::new();
    for i in 0..100_u32 {
        let addr = 0x1000 * (u64::from(i) + 1);
        map.insert(run(R1), host(addr), span(addr, addr + 0x100), slot(i));
    }
    assert_eq!(map.len(), 100);
    for i in 0..100_u32 {
        let addr = 0x1000 * (u64::from(i) + 1);
        assert_eq!(producers(&map, run(R1), host(addr)), [slot(i)]);
    }
}

#[test]
fn the_same_address_on_two_children_is_two_buffers() {
    let map = TensorMap::new();
    map.insert(run(R1), child(0, 0x1000), span(0x1000, 0x1100), slot(0));
    map.insert(run(R1), child(1, 0x1000), span(0x1000, 0x1100), slot(1));
    assert_eq!(map.len(), 2);
    assert_eq!(producers(&map, run(R1), child(0, 0x1000)), [slot(0)]);
    assert_eq!(producers(&map, run(R1), child(1, 0x1000)), [slot(1)]);
}

#[test]
fn the_same_address_as_host_and_as_child_memory_is_two_buffers() {
    let map = TensorMap::new();
    map.insert(run(R1), host(0x1000), span(0x1000, 0x1100), slot(0));
    map.insert(run(R1), child(0, 0x1000), span(0x1000, 0x1100), slot(1));
    assert_eq!(map.len(), 2);
    assert_eq!(producers(&map, run(R1), host(0x1000)), [slot(0)]);
    assert_eq!(producers(&map, run(R1), child(0, 0x1000)), [slot(1)]);
}

#[test]
fn erasing_the_child_key_keeps_the_host_key_of_the_same_address() {
    let map = TensorMap::new();
    map.insert(run(R1), host(0x1000), span(0x1000, 0x1100), slot(0));
    map.insert(run(R1), child(0, 0x1000), span(0x1000, 0x1100), slot(0));
    assert_eq!(map.erase_owned(run(R1), slot(0), &[child(0, 0x1000)]), 1);
    assert_eq!(producers(&map, run(R1), host(0x1000)), [slot(0)]);
    assert!(producers(&map, run(R1), child(0, 0x1000)).is_empty());
    assert_eq!(map.len(), 1);
}

#[test]
fn the_same_key_in_two_runs_is_independent() {
    let map = TensorMap::new();
    map.insert(run(1), host(0x1000), span(0x1000, 0x1100), slot(0));
    map.insert(run(2), host(0x1000), span(0x1000, 0x1100), slot(1));
    assert_eq!(producers(&map, run(1), host(0x1000)), [slot(0)]);
    assert_eq!(producers(&map, run(2), host(0x1000)), [slot(1)]);
    assert_eq!(map.erase_owned(run(1), slot(0), &[host(0x1000)]), 1);
    assert!(producers(&map, run(1), host(0x1000)).is_empty());
    assert_eq!(producers(&map, run(2), host(0x1000)), [slot(1)]);
    assert_eq!((map.len_run(run(1)), map.len_run(run(2))), (0, 1));
}

#[test]
fn erasing_for_a_superseded_producer_keeps_the_newer_producers_entry() {
    // Two unordered writers W1 then W2 of one buffer: reclaiming W1 must not hide W2 from a
    // later reader (owner-checked erase, `docs/tensormap.md` §6).
    let map = TensorMap::new();
    let whole = span(0x1000, 0x1100);
    map.insert(run(R1), host(0x1000), whole, slot(1));
    map.insert(run(R1), host(0x1000), whole, slot(2));
    assert_eq!(map.erase_owned(run(R1), slot(1), &[host(0x1000)]), 0);
    assert_eq!(producers(&map, run(R1), host(0x1000)), [slot(2)]);
}

#[test]
fn erase_owned_compares_the_slot_generation() {
    // A recycled window entry (same index, next generation) is a different producer.
    let map = TensorMap::new();
    map.insert(run(R1), host(0x1000), span(0x1000, 0x1100), SlotId::new(4, 2));
    assert_eq!(map.erase_owned(run(R1), SlotId::new(4, 1), &[host(0x1000)]), 0);
    assert_eq!(map.len(), 1);
}

#[test]
fn erase_run_removes_exactly_that_runs_entries() {
    let map = TensorMap::new();
    for r in 1..=3 {
        for addr in [0x1000, 0x2000] {
            map.insert(run(r), host(addr), span(addr, addr + 0x10), slot(r as u32));
        }
    }
    map.insert(run(2), host(0x1000), span(0x1008, 0x1010), slot(9));
    assert_eq!(map.erase_run(run(2)), 3);
    assert_eq!(map.erase_run(run(2)), 0, "a second erase finds nothing");
    assert_eq!(map.len_run(run(2)), 0);
    assert_eq!((map.len_run(run(1)), map.len_run(run(3)), map.len()), (2, 2, 4));
    assert_eq!(producers(&map, run(1), host(0x1000)), [slot(1)]);
    assert_eq!(producers(&map, run(3), host(0x2000)), [slot(3)]);
}

#[test]
fn duplicate_keys_in_an_erase_list_are_harmless() {
    let map = TensorMap::new();
    map.insert(run(R1), host(0x1000), span(0x1000, 0x1100), slot(0));
    map.insert(run(R1), host(0x2000), span(0x2000, 0x2100), slot(0));
    let keys = [host(0x1000), host(0x1000), host(0x3000), host(0x1000)];
    assert_eq!(map.erase_owned(run(R1), slot(0), &keys), 1);
    assert_eq!(map.len(), 1);
}

// Footprint behaviours (`docs/tensormap.md` §2, §4).

#[test]
fn disjoint_slices_of_one_buffer_do_not_depend_on_each_other() {
    let map = TensorMap::new();
    map.insert(run(R1), host(0x1000), span(0x1000, 0x1080), slot(0));
    assert!(producers_in(&map, run(R1), host(0x1000), span(0x1080, 0x1100)).is_empty());
    map.insert(run(R1), host(0x1000), span(0x1080, 0x1100), slot(1));
    assert_eq!(producers_in(&map, run(R1), host(0x1000), span(0x1000, 0x1080)), [slot(0)]);
    assert_eq!(producers_in(&map, run(R1), host(0x1000), span(0x1080, 0x1100)), [slot(1)]);
}

#[test]
fn a_whole_buffer_reader_depends_on_every_slice_writer() {
    let map = TensorMap::new();
    for i in 0..4_u32 {
        let start = 0x1000 + 0x40 * u64::from(i);
        map.insert(run(R1), host(0x1000), span(start, start + 0x40), slot(i));
    }
    let readers = producers_in(&map, run(R1), host(0x1000), span(0x1000, 0x1100));
    assert_eq!(readers, [slot(0), slot(1), slot(2), slot(3)]);
    assert_eq!(map.len(), 4);
}

#[test]
fn a_write_covering_older_slices_supersedes_them() {
    let map = TensorMap::new();
    map.insert(run(R1), host(0x1000), span(0x1000, 0x1040), slot(0));
    map.insert(run(R1), host(0x1000), span(0x1040, 0x1080), slot(1));
    assert_eq!(map.insert(run(R1), host(0x1000), span(0x1000, 0x1100), slot(2)), 2);
    assert_eq!(producers(&map, run(R1), host(0x1000)), [slot(2)]);
    assert_eq!(map.len(), 1);
}

#[test]
fn a_write_that_only_partly_covers_an_entry_keeps_it() {
    let map = TensorMap::new();
    map.insert(run(R1), host(0x1000), span(0x1000, 0x1100), slot(0));
    assert_eq!(map.insert(run(R1), host(0x1000), span(0x1000, 0x1010), slot(1)), 0);
    // Bytes only the old writer wrote still depend on it; the rewritten bytes see both.
    assert_eq!(producers_in(&map, run(R1), host(0x1000), span(0x1080, 0x1081)), [slot(0)]);
    assert_eq!(producers_in(&map, run(R1), host(0x1000), span(0x1000, 0x1001)), [slot(0), slot(1)]);
    assert_eq!(map.len(), 2);
}

#[test]
fn a_producer_with_several_entries_of_one_key_is_visited_once() {
    let map = TensorMap::new();
    let mut guard = map.lock();
    // A group's members write different quarters of one output; the group is one slot.
    for q in 0..4 {
        guard.insert(run(R1), host(0x1000), span(0x1000 + q * 0x40, 0x1040 + q * 0x40), slot(7));
    }
    let mut visits = Vec::new();
    guard.lookup_overlapping(run(R1), &host(0x1000), ByteSpan::ALL, |s| visits.push(s));
    assert_eq!(visits, [slot(7)]);
    assert_eq!(guard.len(), 4, "len counts entries, not producers");
    assert_eq!(guard.erase_owned(run(R1), slot(7), &[host(0x1000)]), 4);
    assert!(guard.is_empty());
}

#[test]
fn a_fan_in_over_a_thousand_slices_visits_each_writer_once() {
    let map = TensorMap::new();
    let mut guard = map.lock();
    for i in 0..1000_u32 {
        let byte = 0x1000 + u64::from(i);
        assert_eq!(guard.insert(run(R1), host(0x1000), span(byte, byte + 1), slot(i)), 0);
    }
    let mut visits = Vec::new();
    guard.lookup_overlapping(run(R1), &host(0x1000), span(0x1000, 0x1000 + 1000), |s| {
        visits.push(s)
    });
    visits.sort_unstable();
    assert_eq!(visits, (0..1000).map(slot).collect::<Vec<_>>());
    let mut middle = Vec::new();
    guard.lookup_overlapping(run(R1), &host(0x1000), span(0x1000 + 500, 0x1000 + 502), |s| {
        middle.push(s)
    });
    middle.sort_unstable();
    assert_eq!(middle, [slot(500), slot(501)]);
}

/// `count` one-byte slice writers of bytes `0..count` of `key`, writer `i` in slot `i`: enough to
/// push the key's list past its plain size.
fn slice_fan_in(map: &TensorMap, key: TensorKey, count: u32) {
    for i in 0..count {
        let byte = u64::from(i);
        map.insert(run(R1), key, span(byte, byte + 1), slot(i));
    }
}

#[test]
fn a_fan_in_superseded_to_one_entry_then_rewritten_wider_is_found_and_erased_by_its_owner() {
    let map = TensorMap::new();
    let key = host(0);
    slice_fan_in(&map, key, 40);
    let (x, y) = (slot(100), slot(101));
    assert_eq!(map.insert(run(R1), key, span(0, 40), x), 40);
    assert_eq!(map.insert(run(R1), key, span(0, 1000), y), 1);
    // A reader of bytes X never wrote must still depend on Y.
    assert_eq!(producers_in(&map, run(R1), key, span(500, 501)), [y]);
    assert_eq!(producers_in(&map, run(R1), key, span(0, 1)), [y]);
    // X was superseded: reclaiming it removes nothing and leaves Y's entry.
    assert_eq!(map.erase_owned(run(R1), x, &[key]), 0);
    assert_eq!(producers(&map, run(R1), key), [y]);
    assert_eq!(map.erase_owned(run(R1), y, &[key]), 1);
    assert!(map.is_empty());
    assert!(producers(&map, run(R1), key).is_empty());
}

#[test]
fn two_whole_writers_after_a_fan_in_keep_the_second_live_when_the_first_is_reclaimed() {
    let map = TensorMap::new();
    let key = host(0);
    slice_fan_in(&map, key, 40);
    let (x, y) = (slot(100), slot(101));
    assert_eq!(map.insert(run(R1), key, span(0, 40), x), 40);
    assert_eq!(map.insert(run(R1), key, span(0, 40), y), 1);
    assert_eq!(map.erase_owned(run(R1), x, &[key]), 0);
    assert_eq!(producers_in(&map, run(R1), key, span(0, 40)), [y]);
    assert_eq!(map.len_run(run(R1)), 1);
}

#[test]
fn a_fan_in_superseded_to_a_few_entries_keeps_every_remaining_writer_visible() {
    let map = TensorMap::new();
    let key = host(0);
    slice_fan_in(&map, key, 40);
    // Supersede all but the last three slices, then widen past everything ever written.
    assert_eq!(map.insert(run(R1), key, span(0, 37), slot(100)), 37);
    assert_eq!(map.insert(run(R1), key, span(0, 37), slot(101)), 1);
    assert_eq!(map.insert(run(R1), key, span(0, 2000), slot(102)), 4);
    assert_eq!(producers_in(&map, run(R1), key, span(1500, 1501)), [slot(102)]);
    assert_eq!(map.erase_owned(run(R1), slot(101), &[key]), 0);
    assert_eq!(map.erase_owned(run(R1), slot(102), &[key]), 1);
    assert!(map.is_empty());
}

#[test]
fn an_empty_span_is_ignored_by_insert_and_lookup() {
    let map = TensorMap::new();
    let empty = ByteSpan { start: 0x1010, end: 0x1010 };
    assert_eq!(map.insert(run(R1), host(0x1000), empty, slot(0)), 0);
    assert!(map.is_empty());
    map.insert(run(R1), host(0x1000), span(0x1000, 0x1100), slot(1));
    assert!(producers_in(&map, run(R1), host(0x1000), empty).is_empty());
}

#[test]
fn a_submit_walks_all_its_tensors_under_one_guard() {
    // InOut on one buffer: look up the previous producer, then become the producer (WaW ordered).
    let map = TensorMap::new();
    let buf = span(0x1000, 0x1100);
    map.insert(run(R1), host(0x1000), buf, slot(0));
    let mut guard = map.lock();
    let mut deps = Vec::new();
    guard.lookup_overlapping(run(R1), &host(0x1000), buf, |s| deps.push(s));
    assert_eq!(guard.insert(run(R1), host(0x1000), buf, slot(1)), 1);
    drop(guard);
    assert_eq!(deps, [slot(0)]);
    assert_eq!(producers(&map, run(R1), host(0x1000)), [slot(1)]);
}

#[test]
fn the_map_is_usable_from_several_threads() {
    let map = TensorMap::new();
    std::thread::scope(|scope| {
        for t in 0..4_u32 {
            let map = &map;
            scope.spawn(move || {
                for i in 0..250_u32 {
                    let addr = u64::from(t * 1000 + i) * 16;
                    map.insert(run(R1), host(addr), span(addr, addr + 16), slot(t * 1000 + i));
                }
            });
        }
    });
    assert_eq!(map.len(), 1000);
    std::thread::scope(|scope| {
        for t in 0..4_u32 {
            let map = &map;
            scope.spawn(move || {
                for i in 0..250_u32 {
                    let addr = u64::from(t * 1000 + i) * 16;
                    assert_eq!(map.erase_owned(run(R1), slot(t * 1000 + i), &[host(addr)]), 1);
                }
            });
        }
    });
    assert!(map.is_empty());
}
