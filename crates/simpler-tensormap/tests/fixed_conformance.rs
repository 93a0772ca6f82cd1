//! Behaviours of the fixed-capacity map, one test each, at the device's sizes where it matters.

use simpler_tensormap::ByteSpan;
use simpler_tensormap::fixed::{AccessMode, FixedMapError, FixedTensorMap, MapEntry};

use AccessMode::{Read, ReadWrite, Write};

const NOTHING_RETIRED: fn(u64) -> bool = |_| false;

fn span(start: u64, end: u64) -> ByteSpan {
    ByteSpan::new(start, end).unwrap()
}

/// Submits one task the way a runtime does: every lookup, then every insert. Returns its
/// producers, sorted and without repeats.
fn submit(
    map: &mut FixedTensorMap<'_, u64>,
    task: u64,
    accesses: &[(u64, ByteSpan, AccessMode)],
    is_retired: impl Fn(u64) -> bool + Copy,
) -> Vec<u64> {
    let mut producers = Vec::new();
    for &(key, s, mode) in accesses {
        map.lookup(&key, s, mode, is_retired, |p| producers.push(p));
    }
    for &(key, s, mode) in accesses {
        map.insert(key, s, mode, task, is_retired).unwrap();
    }
    producers.sort_unstable();
    producers.dedup();
    producers
}

fn storage(entries: usize, buckets: usize) -> (Vec<MapEntry<u64>>, Vec<u32>) {
    (vec![MapEntry::default(); entries], vec![0; buckets])
}

const BUF: u64 = 0x10_0000;

#[test]
fn an_in_out_write_after_a_read_waits_for_the_reader() {
    let (mut e, mut b) = storage(16, 4);
    let mut map = FixedTensorMap::new(&mut e, &mut b).unwrap();
    let all = span(BUF, BUF + 256);
    assert!(submit(&mut map, 1, &[(BUF, all, ReadWrite)], NOTHING_RETIRED).is_empty());
    assert_eq!(submit(&mut map, 2, &[(BUF, all, Read)], NOTHING_RETIRED), [1]);
    assert_eq!(submit(&mut map, 3, &[(BUF, all, ReadWrite)], NOTHING_RETIRED), [1, 2]);
}

#[test]
fn a_blind_write_waits_for_live_readers_but_not_for_the_previous_writer() {
    let (mut e, mut b) = storage(16, 4);
    let mut map = FixedTensorMap::new(&mut e, &mut b).unwrap();
    let all = span(BUF, BUF + 256);
    submit(&mut map, 1, &[(BUF, all, Write)], NOTHING_RETIRED);
    assert!(submit(&mut map, 2, &[(BUF, all, Write)], NOTHING_RETIRED).is_empty());
    assert_eq!(submit(&mut map, 3, &[(BUF, span(BUF, BUF + 8), Read)], NOTHING_RETIRED), [2]);
    assert_eq!(submit(&mut map, 4, &[(BUF, all, Write)], NOTHING_RETIRED), [3]);
    // 4 superseded the reader and stands in for it: a later blind write orders after 4.
    assert_eq!(submit(&mut map, 5, &[(BUF, all, Write)], NOTHING_RETIRED), [4]);
    let stand_ins_retired = |t: u64| (3..=5).contains(&t);
    assert!(submit(&mut map, 6, &[(BUF, all, Write)], stand_ins_retired).is_empty());
}

#[test]
fn readers_never_wait_for_readers() {
    let (mut e, mut b) = storage(16, 4);
    let mut map = FixedTensorMap::new(&mut e, &mut b).unwrap();
    let all = span(BUF, BUF + 256);
    submit(&mut map, 1, &[(BUF, all, Write)], NOTHING_RETIRED);
    for reader in 2..6 {
        assert_eq!(submit(&mut map, reader, &[(BUF, all, Read)], NOTHING_RETIRED), [1]);
    }
    assert_eq!(submit(&mut map, 6, &[(BUF, all, Write)], NOTHING_RETIRED), [2, 3, 4, 5]);
    assert_eq!(map.len(), 1, "the covering write superseded the writer and all four readers");
}

#[test]
fn a_fan_in_of_a_thousand_slices_is_found_whole_and_superseded_in_one_pass() {
    let (mut e, mut b) = storage(65_536, 4_096);
    let mut map = FixedTensorMap::new(&mut e, &mut b).unwrap();
    for slice in 0..1000 {
        let s = span(BUF + slice * 64, BUF + (slice + 1) * 64);
        assert!(submit(&mut map, slice, &[(BUF, s, Write)], NOTHING_RETIRED).is_empty());
    }
    let whole = span(BUF, BUF + 64_000);
    let producers = submit(&mut map, 5000, &[(BUF, whole, Read)], NOTHING_RETIRED);
    assert_eq!(producers, (0..1000).collect::<Vec<_>>(), "disjoint slices: no edges between");
    let mut waits_for = Vec::new();
    map.lookup(&BUF, whole, ReadWrite, NOTHING_RETIRED, |p| waits_for.push(p));
    assert_eq!(waits_for.len(), 1001);
    assert_eq!(map.insert(BUF, whole, ReadWrite, 5001, NOTHING_RETIRED), Ok(1001));
    assert_eq!((map.len(), map.peak_len()), (1, 1001));
}

#[test]
fn erasing_for_a_superseded_writer_keeps_the_newer_writer() {
    let (mut e, mut b) = storage(16, 4);
    let mut map = FixedTensorMap::new(&mut e, &mut b).unwrap();
    let all = span(BUF, BUF + 256);
    submit(&mut map, 1, &[(BUF, span(BUF, BUF + 128), Write)], NOTHING_RETIRED);
    submit(&mut map, 2, &[(BUF, all, Write)], NOTHING_RETIRED);
    assert_eq!(map.erase_owned(1, &[BUF, BUF]), 0);
    assert_eq!(map.erase_owned(2, &[BUF + 1]), 0, "another key");
    assert_eq!(submit(&mut map, 3, &[(BUF, all, Read)], NOTHING_RETIRED), [2]);
    assert_eq!(map.erase_owned(2, &[BUF]), 1);
    assert_eq!(map.entries_of(&BUF).count(), 1, "only the reader's entry is left");
}

#[test]
fn a_write_read_chain_of_ten_thousand_tasks_fits_a_pool_of_two() {
    let (mut e, mut b) = storage(2, 1);
    let mut map = FixedTensorMap::new(&mut e, &mut b).unwrap();
    let all = span(BUF, BUF + 256);
    for task in 0..10_000u64 {
        let (mode, expect) = if task % 2 == 0 { (ReadWrite, 2) } else { (Read, 1) };
        let producers = submit(&mut map, task, &[(BUF, all, mode)], NOTHING_RETIRED);
        assert_eq!(producers.len(), if task == 0 { 0 } else { expect });
    }
    assert_eq!(map.peak_len(), 2);
}

#[test]
fn a_full_device_sized_pool_reports_its_capacity_and_usage() {
    let (mut e, mut b) = storage(65_536, 4_096);
    let mut map = FixedTensorMap::new(&mut e, &mut b).unwrap();
    for task in 0..65_536u64 {
        let mode = if task % 4 == 0 { Read } else { Write };
        let key = BUF + task * 1024;
        map.insert(key, span(key, key + 1024), mode, task, NOTHING_RETIRED).unwrap();
    }
    let key = BUF + 65_536 * 1024;
    let full = map.insert(key, span(key, key + 1024), Write, 1 << 40, NOTHING_RETIRED);
    let err = full.unwrap_err();
    assert_eq!(err, FixedMapError::Full { capacity: 65_536, writers: 49_152, readers: 16_384 });
    assert!(err.to_string().contains("all 65536 entries"), "{err}");
    // Once the oldest half retires, the insert prunes what it meets and goes through; a prune
    // at a quiet moment takes the rest.
    let old = |t: u64| t < 32_768;
    assert_eq!(map.insert(key, span(key, key + 1024), Write, 1 << 40, old), Ok(0));
    assert!(map.len() < 65_536);
    map.prune_retired(old);
    assert_eq!(map.len(), 32_769);
}

#[test]
fn a_write_needs_no_slot_of_its_own_when_it_replaces_an_entry_it_covers() {
    let (mut entries, mut buckets) = storage(2, 2);
    let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
    submit(&mut map, 1, &[(BUF, span(BUF, BUF + 64), Write)], NOTHING_RETIRED);
    submit(&mut map, 2, &[(BUF, span(BUF + 64, BUF + 128), Read)], NOTHING_RETIRED);
    assert_eq!(map.len(), map.capacity(), "full");
    let needed = |accesses: &[(u64, ByteSpan, AccessMode)]| {
        map.slots_needed(accesses, |&a| a, NOTHING_RETIRED)
    };
    assert_eq!(needed(&[(BUF, span(BUF, BUF + 64), Write)]), 0, "replaces the writer");
    assert_eq!(needed(&[(BUF, span(BUF, BUF + 128), ReadWrite)]), 0, "replaces both");
    assert_eq!(needed(&[(BUF, span(BUF, BUF + 32), Write)]), 1, "covers nothing whole");
    assert_eq!(needed(&[(BUF, span(BUF, BUF + 64), Read)]), 1, "a reader replaces nothing");
    // The second write's entry to replace was the first's: counted as needing a slot.
    let twice = [(BUF, span(BUF, BUF + 64), Write), (BUF, span(BUF, BUF + 64), Write)];
    assert_eq!(needed(&twice), 1);
    assert_eq!(needed(&[(BUF, span(BUF, BUF + 64), Write)][..0]), 0);
    submit(&mut map, 3, &[(BUF, span(BUF, BUF + 128), Write)], NOTHING_RETIRED);
    assert_eq!(map.len(), 1, "the write replaced both entries");
}

mod slots_needed {
    use proptest::prelude::*;

    use super::*;

    fn access() -> impl Strategy<Value = (u64, ByteSpan, AccessMode)> {
        (0..2u64, 0..8u64, 1..=8u64, prop_oneof![Just(Read), Just(Write), Just(ReadWrite)])
            .prop_map(|(b, start, len, mode)| {
                let key = BUF + (b << 12);
                let start = key + 32 * start;
                (key, span(start, start + 32 * len), mode)
            })
    }

    proptest! {
        // Most draws fill the pool with tasks that the next one does not replace; many cases
        // keep the ones it does frequent enough.
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// A task whose accesses need no more slots than are vacant, by `slots_needed`, is
        /// inserted without the pool running out.
        #[test]
        fn inserts_within_the_figure_never_run_out(
            capacity in 2..8usize,
            earlier in prop::collection::vec(access(), 1..24),
            task in prop::collection::vec(access(), 1..5),
        ) {
            let (mut entries, mut buckets) = storage(capacity, 4);
            let mut map = FixedTensorMap::new(&mut entries, &mut buckets).unwrap();
            for (owner, &(key, s, mode)) in earlier.iter().enumerate() {
                map.lookup(&key, s, mode, NOTHING_RETIRED, |_| {});
                if map.insert(key, s, mode, owner as u64 + 1, NOTHING_RETIRED).is_err() {
                    break;
                }
            }
            let needed = map.slots_needed(&task, |&a| a, NOTHING_RETIRED);
            if map.capacity() - map.len() < needed {
                return Ok(());
            }
            for &(key, s, mode) in &task {
                map.lookup(&key, s, mode, NOTHING_RETIRED, |_| {});
            }
            for &(key, s, mode) in &task {
                prop_assert!(
                    map.insert(key, s, mode, 1000, NOTHING_RETIRED).is_ok(),
                    "{needed} slots were to be enough"
                );
            }
        }
    }
}
