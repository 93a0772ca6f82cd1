//! Tests of the trb submit/completion engine: dependency rules, streams through small rings,
//! concurrent completers and every ring stall.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;

use super::*;
use crate::abi::codes::RuntimeCode;
use crate::abi::image::SUBMIT_RECORD_PRODUCERS;
use crate::runtime::trb::storage::TrbArena;

thread_local! {
    /// Run by `Completer::complete` on this thread between releasing the task's own reference
    /// and counting its completion.
    static BETWEEN_RELEASE_AND_COUNT: RefCell<Option<Box<dyn FnMut()>>> =
        const { RefCell::new(None) };
}

pub(super) fn between_release_and_count() {
    BETWEEN_RELEASE_AND_COUNT.with(|h| {
        if let Some(hook) = h.borrow_mut().as_mut() {
            hook();
        }
    });
}

fn sizes(task_window: u32, heap_bytes: u64, dep_pool: u32) -> [RingSizes; HEAP_RING_COUNT] {
    [RingSizes { task_window, heap_bytes, dep_pool }; HEAP_RING_COUNT]
}

fn access(key: u64, mode: AccessMode) -> Access {
    Access { key, span: ByteSpan::new(key, key + 256).unwrap(), mode }
}

/// Completes every task ready now, newest first, so that only dependencies order them.
fn complete_ready_newest_first(e: &Engine<'_>, done: &mut impl FnMut(DeviceTaskId)) -> usize {
    let c = e.completer();
    let ready: Vec<DeviceTaskId> = std::iter::from_fn(|| c.pop_ready()).collect();
    for &id in ready.iter().rev() {
        let _ = c.complete(id);
        done(id);
    }
    ready.len()
}

/// Submits, completing ready tasks while the engine says to wait.
fn submit_with_back_pressure(
    e: &mut Engine<'_>,
    accesses: &[Access],
    heap: u64,
    done: &mut impl FnMut(DeviceTaskId),
) -> Result<Submitted, RingStall> {
    submit_keeping(e, accesses, heap, &[], done)
}

/// [`submit_with_back_pressure`] of a task that also holds the slots of `keep`.
fn submit_keeping(
    e: &mut Engine<'_>,
    accesses: &[Access],
    heap: u64,
    keep: &[u64],
    done: &mut impl FnMut(DeviceTaskId),
) -> Result<Submitted, RingStall> {
    loop {
        match e.submit_with(accesses, heap, keep, &[], |_| {}) {
            Ok(s) => return Ok(s),
            Err(SubmitRefusal::Stall(s)) => return Err(s),
            Err(SubmitRefusal::Invalid(m)) => panic!("invalid submit: {m}"),
            Err(SubmitRefusal::Unqueued(id)) => panic!("the ready queue refused {id:?}"),
            Err(SubmitRefusal::Unrecorded { id, key, error }) => {
                panic!("the map refused {id:?}'s access of {key:#x} past its room check: {error}")
            }
            Err(SubmitRefusal::Wait) => {
                assert!(complete_ready_newest_first(e, done) > 0, "a wait with nothing ready");
            }
        }
    }
}

/// Allocates, completing ready tasks while the engine says to wait.
fn alloc_with_back_pressure(
    e: &mut Engine<'_>,
    bytes: u64,
    done: &mut impl FnMut(DeviceTaskId),
) -> Allocated {
    loop {
        match e.alloc(bytes) {
            Ok(a) => return a,
            Err(SubmitRefusal::Wait) => {
                assert!(complete_ready_newest_first(e, done) > 0, "a wait with nothing ready");
            }
            Err(other) => panic!("alloc of {bytes} bytes: {other:?}"),
        }
    }
}

fn drain(e: &mut Engine<'_>, done: &mut impl FnMut(DeviceTaskId)) {
    while complete_ready_newest_first(e, done) > 0 {}
    assert_eq!(e.incomplete(), 0, "every submitted task completed");
}

#[test]
fn reads_wait_for_writers_writes_for_readers_and_inout_for_both() {
    let mut arena = TrbArena::new(sizes(16, 16 << 10, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    let c = e.completer();
    let a = 0x10_000;
    let w0 = e.submit(&[access(a, AccessMode::Write)], 0).unwrap().id;
    let r1 = e.submit(&[access(a, AccessMode::Read)], 0).unwrap().id;
    let r2 = e.submit(&[access(a, AccessMode::Read)], 0).unwrap().id;
    let w3 = e.submit(&[access(a, AccessMode::Write)], 0).unwrap().id;
    let rw4 = e.submit(&[access(a, AccessMode::ReadWrite)], 0).unwrap().id;
    assert_eq!(c.pop_ready(), Some(w0));
    assert_eq!(c.pop_ready(), None, "the readers wait for the writer");
    let _ = c.complete(w0);
    let mut readers = [c.pop_ready(), c.pop_ready(), c.pop_ready()];
    readers.sort();
    assert_eq!(readers, [None, Some(r1), Some(r2)], "both readers, in any order");
    let _ = c.complete(r1);
    assert_eq!(c.pop_ready(), None, "the overwrite waits for both readers");
    let _ = c.complete(r2);
    assert_eq!(c.pop_ready(), Some(w3));
    assert_eq!(c.pop_ready(), None, "the read-write waits for the writer");
    let _ = c.complete(w3);
    assert_eq!(c.pop_ready(), Some(rw4));
    let _ = c.complete(rw4);
    assert_eq!(e.incomplete(), 0);
    assert_eq!(e.ring_tasks(0).0, 5, "the outer scope holds its tasks");
    e.finish().unwrap();
    assert_eq!(e.ring_tasks(0).0, 0, "closing the outer scope reclaims them");
}

/// Tasks of a chain must complete in submission order; every other order is allowed.
fn stream(chain_len: u64, tasks: u64) {
    let mut arena = TrbArena::new(sizes(1024, 1 << 20, 1024), 4096, 1024);
    let mut e = Engine::new(arena.storage(), false);
    let mut completed = 0u64;
    let mut next_in_chain = HashMap::<u64, u64>::new();
    let index_of = RefCell::new(HashMap::<u64, (u64, u64)>::new());
    let mut done = |id: DeviceTaskId| {
        let (chain, pos) = index_of.borrow_mut().remove(&id.0).expect("a submitted task");
        let next = next_in_chain.entry(chain).or_insert(0);
        assert_eq!(*next, pos, "chain {chain} completed out of order");
        *next += 1;
        completed += 1;
    };
    let mut submitted = 0u64;
    while submitted < tasks {
        e.scope_begin().unwrap();
        for _ in 0..100 {
            let (chain, pos) = (submitted / chain_len, submitted % chain_len);
            // A chain updates one buffer in place; its first task only writes it.
            let mode = if pos == 0 { AccessMode::Write } else { AccessMode::ReadWrite };
            let key = 0x1000_0000 + chain * 0x1000;
            let s =
                submit_with_back_pressure(&mut e, &[access(key, mode)], 1024, &mut done).unwrap();
            assert!(s.heap_offset.is_some());
            // Ids recycle, but a live id is never handed out twice.
            assert!(index_of.borrow_mut().insert(s.id.0, (chain, pos)).is_none());
            submitted += 1;
        }
        e.scope_end().unwrap();
    }
    e.finish().unwrap();
    drain(&mut e, &mut done);
    assert_eq!(completed, tasks);
    let (live, peak) = e.ring_tasks(1);
    assert_eq!(live, 0, "every slot was reclaimed");
    assert!(peak <= 1024);
    assert_eq!(e.ring_heap(1).0, 0);
    assert_eq!(e.ring_deps(1).0, 0);
}

#[test]
fn a_stream_of_independent_tasks_far_larger_than_the_window_runs_in_bounded_rings() {
    stream(1, 100_000);
}

#[test]
fn a_stream_of_100_task_chains_far_larger_than_the_window_runs_in_order() {
    stream(100, 100_000);
}

#[test]
fn inserts_prune_the_entries_of_reclaimed_tasks_from_their_chain() {
    // 2000 tasks each update their own 4-byte slice of one buffer, so every entry lies in one
    // chain, which only inserts prune (nothing else would before the 4096-entry pool fills).
    let mut arena = TrbArena::new(sizes(16, 16 << 10, 16), 4096, 16);
    let mut e = Engine::new(arena.storage(), false);
    let mut done = |_| {};
    let buf = 0x40_0000u64;
    for scope in 0..250u64 {
        e.scope_begin().unwrap();
        for i in 0..8 {
            let start = buf + (scope * 8 + i) * 4;
            let slice = Access {
                key: buf,
                span: ByteSpan::new(start, start + 4).unwrap(),
                mode: AccessMode::ReadWrite,
            };
            submit_with_back_pressure(&mut e, &[slice], 0, &mut done).unwrap();
        }
        e.scope_end().unwrap();
        complete_ready_newest_first(&e, &mut done);
    }
    let (held, peak) = e.map_entries();
    assert!(peak <= 2 * 16, "{peak} entries held at once for a 16-slot window ({held} at the end)");
    e.finish().unwrap();
    drain(&mut e, &mut done);
}

#[test]
fn scheduler_threads_complete_while_the_orchestration_submits_a_stream_of_chains() {
    const TASKS: u64 = 64 * 800;
    const CHAIN: u64 = 50;
    let mut arena = TrbArena::new(sizes(256, 256 << 10, 256), 2048, 512);
    let mut e = Engine::new(arena.storage(), false);
    let c = e.completer();
    let chains = (TASKS / CHAIN) as usize;
    // Per chain: how many of its tasks completed, checked against each task's position.
    let progress: Vec<AtomicU64> = (0..chains).map(|_| AtomicU64::new(0)).collect();
    // Per window slot of ring 1: the (chain, position) of the task in it, and its id (set
    // after the submit returned, so a completer may pop the task first and waits for it).
    let meta: Vec<AtomicU64> = (0..256).map(|_| AtomicU64::new(0)).collect();
    let meta_id: Vec<AtomicU64> = (0..256).map(|_| AtomicU64::new(u64::MAX)).collect();
    let finished = AtomicBool::new(false);
    let out_of_order = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                loop {
                    match c.pop_ready() {
                        Some(id) => {
                            let at = (id.0 as u32 & 255) as usize;
                            while meta_id[at].load(Acquire) != id.0 {
                                std::hint::spin_loop();
                            }
                            let m = meta[at].load(Relaxed);
                            let (chain, pos) = ((m >> 32) as usize, m as u32 as u64);
                            // A task "runs" a little, so consumers are often
                            // submitted while their producer is still running.
                            for _ in 0..2000 {
                                std::hint::spin_loop();
                            }
                            // Counted, not asserted: a panicking completer would leave
                            // the orchestration waiting for it.
                            if progress[chain].fetch_add(1, AcqRel) != pos {
                                out_of_order.fetch_add(1, Relaxed);
                            }
                            let _ = c.complete(id);
                        }
                        None if finished.load(Acquire) => break,
                        None => std::thread::yield_now(),
                    }
                }
            });
        }
        let mut submitted = 0;
        while submitted < TASKS {
            e.scope_begin().unwrap();
            for _ in 0..64 {
                let (chain, pos) = (submitted / CHAIN, submitted % CHAIN);
                let mode = if pos == 0 { AccessMode::Write } else { AccessMode::ReadWrite };
                let key = 0x1000_0000 + (chain % 97) * 0x1000 + (chain / 97) * 0x100_0000;
                let accesses = [access(key, mode)];
                let id = loop {
                    match e.submit(&accesses, 1024) {
                        Ok(s) => break s.id,
                        Err(SubmitRefusal::Wait) => std::thread::yield_now(),
                        Err(other) => panic!("submit {submitted}: {other:?}"),
                    }
                };
                // The slot holds this id until it is reclaimed, which needs its completion.
                let at = (id.0 as u32 & 255) as usize;
                meta[at].store((chain << 32) | pos, Relaxed);
                meta_id[at].store(id.0, Release);
                submitted += 1;
            }
            e.scope_end().unwrap();
        }
        e.finish().unwrap();
        while e.incomplete() > 0 {
            std::thread::yield_now();
        }
        finished.store(true, Release);
    });
    assert_eq!(out_of_order.load(Relaxed), 0, "chain tasks completed out of order");
    assert!(progress.iter().all(|p| p.load(Relaxed) == CHAIN));
    assert_eq!(e.ring_tasks(1).0, 0, "every slot was reclaimed");
    assert_eq!(e.ring_heap(1).0, 0);
    assert_eq!(e.ring_deps(1).0, 0);
}

#[test]
fn one_scope_needing_more_slots_than_the_window_is_a_scope_deadlock_naming_the_ring() {
    let mut arena = TrbArena::new(sizes(4, 64 << 10, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    let mut done = |_| {};
    e.scope_begin().unwrap();
    e.scope_begin().unwrap();
    for i in 0..4 {
        submit_with_back_pressure(&mut e, &[access(i << 12, AccessMode::Write)], 0, &mut done)
            .unwrap();
    }
    let stall =
        submit_with_back_pressure(&mut e, &[access(9 << 12, AccessMode::Write)], 0, &mut done)
            .unwrap_err();
    assert_eq!(stall.code(), RuntimeCode::ScopeDeadlock);
    assert!(stall.to_string().starts_with("ring 2: scope needs 5 task slots, window 4"), "{stall}");
    assert!(stall.to_string().contains("window 4, heap 65536 bytes, dep pool 16"), "{stall}");
}

#[test]
fn a_scope_holding_the_whole_heap_is_a_heap_ring_deadlock() {
    let mut arena = TrbArena::new(sizes(16, 4096, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    let mut done = |_| {};
    e.scope_begin().unwrap();
    for i in 0..4 {
        submit_with_back_pressure(&mut e, &[access(i << 12, AccessMode::Write)], 1000, &mut done)
            .unwrap();
    }
    let stall = submit_with_back_pressure(&mut e, &[], 1, &mut done).unwrap_err();
    assert_eq!(stall.code(), RuntimeCode::HeapRingDeadlock);
    assert!(stall.to_string().contains("ring 1: scope needs 1024 more heap bytes"), "{stall}");
    assert!(stall.to_string().contains("4096 heap bytes"), "{stall}");
    // Closing the scope releases the heap: the same submit then succeeds.
    e.scope_end().unwrap();
    drain(&mut e, &mut done);
    e.scope_begin().unwrap();
    submit_with_back_pressure(&mut e, &[], 1, &mut done).unwrap();
}

#[test]
fn a_size_too_large_to_round_up_is_refused_as_invalid_not_an_overflow() {
    let mut arena = TrbArena::new(sizes(16, 4096, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    for bytes in [u64::MAX, u64::MAX - 1023, 4097] {
        assert!(matches!(e.alloc(bytes), Err(SubmitRefusal::Invalid(_))), "alloc of {bytes} bytes");
        assert!(
            matches!(e.submit(&[], bytes), Err(SubmitRefusal::Invalid(_))),
            "submit of a {bytes}-byte slab"
        );
    }
    // Nothing changed: a buffer and a slab that fit are still placed.
    e.alloc(4096).unwrap();
    e.submit(&[], 0).unwrap();
}

#[test]
fn a_blind_write_after_more_finished_readers_than_a_task_may_have_producers_is_accepted() {
    write_after_more_finished_readers_than_a_task_may_have_producers(AccessMode::Write);
}

#[test]
fn an_in_place_update_after_more_finished_readers_than_a_task_may_have_producers_is_accepted() {
    write_after_more_finished_readers_than_a_task_may_have_producers(AccessMode::ReadWrite);
}

/// 300 readers of slices of one buffer, all finished but held by the open outer scope, then
/// one task writing the whole buffer in `mode`: none of the readers needs an edge.
fn write_after_more_finished_readers_than_a_task_may_have_producers(mode: AccessMode) {
    const READERS: u64 = MAX_FANIN as u64 + 44;
    let mut arena = TrbArena::new(sizes(512, 64 << 10, 1024), 1024, 64);
    let mut e = Engine::new(arena.storage(), false);
    e.note_finished_producers();
    let mut done = |_| {};
    let base = 0x10_0000u64;
    let slice = |i: u64| Access {
        key: base,
        span: ByteSpan::new(base + 4 * i, base + 4 * i + 4).unwrap(),
        mode: AccessMode::Read,
    };
    for i in 0..READERS {
        e.submit(&[slice(i)], 0).unwrap();
    }
    drain(&mut e, &mut done);
    let whole = Access { key: base, span: ByteSpan::new(base, base + 4 * READERS).unwrap(), mode };
    let write = e.submit(&[whole], 0);
    assert!(write.is_ok(), "{write:?}");
    assert!(e.last_producers().is_empty(), "{:?}", e.last_producers());
    // The diagnostics list the first finished readers and count the rest.
    assert_eq!(e.last_finished().len(), SUBMIT_RECORD_PRODUCERS);
    let noted = e.last_finished().len() + e.last_finished_beyond();
    assert_eq!(noted as u64, READERS, "every finished reader is listed or counted");
    // A reader still running is waited for.
    e.submit(&[slice(0)], 0).unwrap();
    let again = e.submit(&[whole], 0).unwrap();
    assert_eq!(e.last_producers().len(), 2, "the running reader and the earlier write");
    assert!(e.last_finished().is_empty(), "the first write superseded the finished readers");
    let _ = again;
}

#[test]
fn buffers_beyond_the_heap_records_are_a_heap_record_stall_not_a_full_heap() {
    // Window 4: 8 heap records. Eight 1 KiB buffers for the next task fill them with 56 KiB of
    // the 64 KiB heap still free.
    let mut arena = TrbArena::new(sizes(4, 64 << 10, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    e.scope_begin().unwrap();
    for _ in 0..8 {
        e.alloc(1024).unwrap();
    }
    let Err(SubmitRefusal::Stall(stall)) = e.alloc(1024) else {
        panic!("a ninth buffer for one task must stall")
    };
    assert_eq!(stall.kind, StallKind::HeapRecords, "{stall}");
    assert_eq!(stall.code(), RuntimeCode::HeapRingDeadlock);
    assert!(stall.to_string().contains("needs a heap record with all 8 in use"), "{stall}");
}

/// Completes `id`, which must be ready now, and every task it makes ready.
fn complete_now(e: &Engine<'_>, id: DeviceTaskId) {
    let c = e.completer();
    let mut popped = Vec::new();
    while let Some(p) = c.pop_ready() {
        popped.push(p);
    }
    assert!(popped.contains(&id), "{id:?} is not ready: {popped:?}");
    for p in popped {
        if p == id {
            let _ = c.complete(p);
        } else {
            assert!(c.ready.push(p.0));
        }
    }
}

#[test]
fn a_buffer_outlives_a_task_of_a_nested_scope_of_its_ring() {
    // Depths 3 and 4 share ring 3: the buffer of the depth-3 scope must not go with the
    // nested scope's task, however that task's slot is reclaimed.
    let mut arena = TrbArena::new(sizes(16, 64 << 10, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    for _ in 0..3 {
        e.scope_begin().unwrap();
    }
    let a = e.alloc(1024).unwrap();
    assert_eq!(a.ring, 3);
    e.scope_begin().unwrap();
    let t = e.submit(&[], 0).unwrap().id;
    e.scope_end().unwrap();
    complete_now(&e, t);
    let b = e.alloc(1024).unwrap();
    assert_ne!(b.offset, a.offset, "the open scope's buffer was reallocated");
    assert_eq!(e.buffer_holder(3, a.offset, 1024), Ok(a.owner.0));
}

#[test]
fn a_buffer_of_an_outer_scope_is_used_in_a_nested_scope() {
    let mut arena = TrbArena::new(sizes(16, 64 << 10, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    let a = e.alloc(1024).unwrap();
    e.scope_begin().unwrap();
    let write = access(0x1000, AccessMode::Write);
    let p = e.submit_with(&[write], 0, &[a.owner.0], &[], |_| {});
    assert!(p.is_ok(), "{p:?}");
    // Holding the buffer is no dependency: the task is ready at once.
    assert!(e.last_producers().is_empty());
    assert_eq!(e.completer().pop_ready(), Some(p.unwrap().id));
}

#[test]
fn a_buffer_is_released_once_its_scope_ended_and_every_task_using_it_completed() {
    let mut arena = TrbArena::new(sizes(16, 4096, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    e.scope_begin().unwrap();
    let x = e.alloc(2048).unwrap();
    let y = e.alloc(1024).unwrap();
    assert_eq!(x.owner, y.owner, "one holder for the scope's buffers");
    let user = e.submit_with(&[], 0, &[x.owner.0], &[], |_| {}).unwrap().id;
    e.scope_end().unwrap();
    // The scope ended; its buffer is not to be used again, but its user still runs.
    let again = e.submit_with(&[], 0, &[x.owner.0], &[], |_| {});
    assert_eq!(again, Err(SubmitRefusal::Invalid(USED_AFTER_SCOPE)));
    assert_eq!(e.buffer_holder(1, x.offset, 2048), Err(USED_AFTER_SCOPE));
    e.scope_begin().unwrap();
    assert!(matches!(e.alloc(2048), Err(SubmitRefusal::Wait)), "the user holds the bytes");
    complete_now(&e, user);
    let z = e.alloc(2048).unwrap();
    assert_eq!(z.offset, x.offset, "released after the user completed");
    assert!(e.buffer_holder(1, x.offset, 4096).is_err(), "longer than the buffer");
}

#[test]
fn buffers_are_found_by_address_across_the_heap_wrap() {
    // Ring 1's heap of 8 KiB ends up holding b at 3 KiB (its scope ended, its user runs), then
    // c at 6 KiB and d at 0 (the heap wrapped), both of the open scope.
    let mut arena = TrbArena::new(sizes(16, 8 << 10, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    let mut users = Vec::new();
    for bytes in [3 << 10, 3 << 10] {
        e.scope_begin().unwrap();
        let buf = e.alloc(bytes).unwrap();
        users.push((buf, e.submit_with(&[], 0, &[buf.owner.0], &[], |_| {}).unwrap().id));
        e.scope_end().unwrap();
    }
    let [(a, ua), (b, _)] = users[..] else { unreachable!() };
    assert_eq!((a.offset, b.offset), (0, 3 << 10));
    complete_now(&e, ua);
    e.scope_begin().unwrap();
    let c = e.alloc(2 << 10).unwrap();
    let d = e.alloc(2 << 10).unwrap();
    assert_eq!((c.offset, d.offset), (6 << 10, 0));
    assert_eq!(e.buffer_holder(1, c.offset, 2 << 10), Ok(c.owner.0));
    assert_eq!(e.buffer_holder(1, d.offset, 2 << 10), Ok(c.owner.0));
    assert_eq!(e.buffer_holder(1, b.offset, 3 << 10), Err(USED_AFTER_SCOPE));
    assert!(e.buffer_holder(1, 1 << 10, 1).is_err(), "inside a buffer, not at its start");
    assert!(e.buffer_holder(1, 7 << 10, 1).is_err(), "no buffer there");
    assert!(e.buffer_holder(0, 0, 1).is_err(), "nothing in ring 0");
}

#[test]
fn a_buffer_holder_named_as_a_creator_is_no_producer() {
    let mut arena = TrbArena::new(sizes(16, 64 << 10, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    let a = e.alloc(1024).unwrap();
    let t = e.submit_with(&[], 0, &[a.owner.0], &[a.owner.0], |_| {}).unwrap().id;
    assert!(e.last_producers().is_empty());
    assert_eq!(e.completer().pop_ready(), Some(t));
}

#[test]
fn a_task_with_more_producers_than_the_dep_pool_is_a_dep_pool_overflow() {
    let mut arena = TrbArena::new(sizes(16, 64 << 10, 4), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    let mut done = |_| {};
    let reads: Vec<Access> = (0..5).map(|i| access(i << 12, AccessMode::Read)).collect();
    for r in &reads {
        e.submit(&[access(r.key, AccessMode::Write)], 0).unwrap();
    }
    let stall = submit_with_back_pressure(&mut e, &reads, 0, &mut done).unwrap_err();
    assert_eq!(stall.code(), RuntimeCode::DepPoolOverflow);
    assert!(stall.to_string().contains("ring 0: a task needs 5 dep entries"), "{stall}");
}

#[test]
fn a_full_map_of_a_task_completing_now_is_a_wait_not_a_tensormap_overflow() {
    // A map of 4 entries, all of task T's, whose scope is closed: T's completion frees them.
    let mut arena = TrbArena::new(sizes(16, 64 << 10, 16), 4, 1);
    let mut e = Engine::new(arena.storage(), false);
    e.scope_begin().unwrap();
    let writes: Vec<Access> = (1..5).map(|i| access(i << 12, AccessMode::Write)).collect();
    let t = e.submit(&writes, 0).unwrap().id;
    e.scope_end().unwrap();
    let c = e.completer();
    assert_eq!(c.pop_ready(), Some(t));
    let at_hook = std::sync::Arc::new(std::sync::Barrier::new(2));
    let resume = std::sync::Arc::new(std::sync::Barrier::new(2));
    let next = [access(5 << 12, AccessMode::Write)];
    std::thread::scope(|s| {
        let (hook_at, hook_resume) = (at_hook.clone(), resume.clone());
        let completer = s.spawn(move || {
            // The completer stops inside `complete`, between the two steps of ending T.
            BETWEEN_RELEASE_AND_COUNT.with(|h| {
                *h.borrow_mut() = Some(Box::new(move || {
                    hook_at.wait();
                    hook_resume.wait();
                }));
            });
            let _ = c.complete(t);
        });
        at_hook.wait();
        // Whatever the orchestration sees of T now, T will free the map: never a stall.
        let seen = e.submit(&next, 0);
        resume.wait();
        completer.join().unwrap();
        assert!(
            !matches!(seen, Err(SubmitRefusal::Stall(_))),
            "a submit while T completes was refused as a stall: {seen:?}"
        );
        if seen.is_err() {
            e.submit(&next, 0).unwrap();
        }
    });
}

#[test]
fn a_task_with_more_accesses_than_the_map_holds_is_a_tensormap_overflow() {
    let mut arena = TrbArena::new(sizes(16, 64 << 10, 16), 4, 1);
    let mut e = Engine::new(arena.storage(), false);
    let mut done = |_| {};
    e.scope_begin().unwrap();
    e.submit(&[access(0x1000, AccessMode::Write)], 0).unwrap();
    let writes: Vec<Access> = (1..6).map(|i| access(i << 12, AccessMode::Write)).collect();
    // Refused at once, although a task is still running: no completion can make room.
    let Err(SubmitRefusal::Stall(stall)) = e.submit(&writes, 0) else {
        panic!("a task needing more entries than the map holds must stall at once")
    };
    assert_eq!(stall.code(), RuntimeCode::TensormapOverflow);
    assert!(stall.to_string().contains("tensor map's 4 entries"), "{stall}");
    // Entries of consumed tasks are pruned when the map is full, not an overflow.
    e.scope_end().unwrap();
    drain(&mut e, &mut done);
    e.scope_begin().unwrap();
    submit_with_back_pressure(&mut e, &writes[..4], 0, &mut done).unwrap();
    assert_eq!(e.map_entries().0, 4);
}

#[test]
fn a_refused_submit_changes_nothing() {
    let mut arena = TrbArena::new(sizes(4, 4096, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    e.scope_begin().unwrap();
    for i in 0..4 {
        e.submit(&[access(i << 12, AccessMode::Write)], 1).unwrap();
    }
    let before = (e.ring_tasks(1), e.ring_heap(1), e.ring_deps(1), e.map_entries());
    assert!(matches!(e.submit(&[access(0, AccessMode::Read)], 1), Err(SubmitRefusal::Stall(_))));
    assert_eq!(before, (e.ring_tasks(1), e.ring_heap(1), e.ring_deps(1), e.map_entries()));
}

#[test]
fn a_copy_waits_for_a_writer_a_later_blind_write_superseded_without_ordering_after_it() {
    let mut arena = TrbArena::new(sizes(16, 16 << 10, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    let c = e.completer();
    let a = access(0x10_000, AccessMode::Write);
    // Two blind writes of the same bytes: the second takes no edge to the first and removes
    // its entry, so only the untracked list still names the first while it runs.
    let first = e.submit(&[a], 0).unwrap().id;
    let second = e.submit(&[a], 0).unwrap().id;
    assert_eq!(e.map_entries().0, 1, "the second write supersedes the first");
    let copy_may_run = |e: &mut Engine<'_>, mode| {
        e.accessors_done(a.key, a.span, mode) && e.untracked_done(a.span)
    };
    let ready: Vec<_> = std::iter::from_fn(|| c.pop_ready()).collect();
    assert_eq!(ready, [first, second], "neither orders after the other");
    let _ = c.complete(second);
    assert!(!copy_may_run(&mut e, AccessMode::Read), "tensor_data under the first writer");
    assert!(!copy_may_run(&mut e, AccessMode::ReadWrite), "set_tensor_data under it");
    let _ = c.complete(first);
    assert!(copy_may_run(&mut e, AccessMode::Read));
    assert!(copy_may_run(&mut e, AccessMode::ReadWrite));
}

#[test]
fn a_covering_write_over_many_slice_writers_lists_only_those_still_running() {
    let mut arena = TrbArena::new(sizes(16, 16 << 10, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    let c = e.completer();
    let whole = access(0x10_000, AccessMode::Write);
    let slice = |i: u64| Access {
        key: whole.key,
        span: ByteSpan::new(whole.span.start + 32 * i, whole.span.start + 32 * (i + 1)).unwrap(),
        mode: AccessMode::Write,
    };
    // Six slice writers, five of which complete; the covering write supersedes all six.
    let writers: Vec<_> = (0..6).map(|i| e.submit(&[slice(i)], 0).unwrap().id).collect();
    let ready: Vec<_> = std::iter::from_fn(|| c.pop_ready()).collect();
    assert_eq!(ready, writers);
    for &w in &writers[1..] {
        let _ = c.complete(w);
    }
    e.submit(&[whole], 0).unwrap();
    let _ = c.complete(c.pop_ready().unwrap());
    // Bytes far from the buffer wait for nothing: the list did not overflow into a wait for
    // every task.
    let elsewhere = ByteSpan::new(0x90_000, 0x90_100).unwrap();
    assert!(e.untracked_done(elsewhere), "a copy of other bytes waits");
    assert!(!e.untracked_done(slice(0).span), "the running slice writer is not listed");
    let _ = c.complete(writers[0]);
    assert!(e.untracked_done(whole.span));
}

#[test]
fn tensor_data_waits_for_writers_and_set_tensor_data_for_readers_too() {
    let mut arena = TrbArena::new(sizes(16, 16 << 10, 16), 64, 16);
    let mut e = Engine::new(arena.storage(), false);
    let c = e.completer();
    let a = access(0x10_000, AccessMode::Write);
    let w = e.submit(&[a], 0).unwrap().id;
    let r = e.submit(&[access(a.key, AccessMode::Read)], 0).unwrap().id;
    let other = access(0x20_000, AccessMode::Read);
    assert!(e.accessors_done(other.key, other.span, AccessMode::ReadWrite), "an unknown buffer");
    assert!(!e.accessors_done(a.key, a.span, AccessMode::Read), "the writer runs");
    assert!(!e.accessors_done(a.key, a.span, AccessMode::Write), "the writer's reader runs");
    assert_eq!(c.pop_ready(), Some(w));
    let _ = c.complete(w);
    assert!(e.accessors_done(a.key, a.span, AccessMode::Read), "reading needs the writer only");
    assert!(!e.accessors_done(a.key, a.span, AccessMode::Write), "writing waits for the reader");
    // The orchestration waits while a scheduler thread completes the reader, which it does
    // only once the wait has begun (so the wait's first look finds the reader running).
    let waiting = std::sync::atomic::AtomicBool::new(false);
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
    std::thread::scope(|s| {
        s.spawn(|| {
            let id = loop {
                if let Some(id) = c.pop_ready() {
                    break id;
                }
                assert!(std::time::Instant::now() < give_up, "the reader never became ready");
                std::thread::yield_now();
            };
            assert_eq!(id, r);
            while !waiting.load(std::sync::atomic::Ordering::SeqCst) {
                assert!(std::time::Instant::now() < give_up, "the wait never began");
                std::thread::yield_now();
            }
            let _ = c.complete(id);
        });
        let mut rounds = 0;
        assert!(e.wait_for_accessors(a.key, a.span, AccessMode::Write, |_| {
            rounds += 1;
            waiting.store(true, std::sync::atomic::Ordering::SeqCst);
            std::thread::yield_now();
            std::time::Instant::now() < give_up
        }));
        assert!(rounds > 0, "the reader was still running when the wait began");
    });
    // A torn-down run ends the wait.
    e.submit(&[access(a.key, AccessMode::Read)], 0).unwrap();
    assert!(!e.wait_for_accessors(a.key, a.span, AccessMode::Write, |_| false));
}

/// Resident set size of this process in KiB, where the platform tells (Linux).
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The streaming graph with three scheduler threads completing while the orchestration
/// submits: `tasks` tasks through a 1024-slot window and a 1 MiB heap per ring, as 100-task
/// chains (`chain` = 100, each chain in order) or independent (`chain` = 1). Prints the time per
/// task and the RSS after 10k, 100k and 1M tasks.
fn threaded_stream(chain: u64, tasks: u64) {
    const WINDOW: usize = 1024;
    let mut arena = TrbArena::new(sizes(WINDOW as u32, 1 << 20, 1024), 8192, 2048);
    let mut e = Engine::new(arena.storage(), false);
    let c = e.completer();
    let chains = tasks.div_ceil(chain) as usize;
    let progress: Vec<AtomicU64> = (0..chains).map(|_| AtomicU64::new(0)).collect();
    // Per slot of ring 1: the (chain, position) of the task in it, published with its id.
    let meta: Vec<AtomicU64> = (0..WINDOW).map(|_| AtomicU64::new(0)).collect();
    let meta_id: Vec<AtomicU64> = (0..WINDOW).map(|_| AtomicU64::new(u64::MAX)).collect();
    let finished = AtomicBool::new(false);
    let out_of_order = AtomicU64::new(0);
    let start = std::time::Instant::now();
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                loop {
                    match c.pop_ready() {
                        Some(id) => {
                            let at = (id.0 as u32 as usize) % WINDOW;
                            while meta_id[at].load(Acquire) != id.0 {
                                std::hint::spin_loop();
                            }
                            let m = meta[at].load(Relaxed);
                            let (ch, pos) = ((m >> 32) as usize, m as u32 as u64);
                            if progress[ch].fetch_add(1, AcqRel) != pos {
                                out_of_order.fetch_add(1, Relaxed);
                            }
                            let _ = c.complete(id);
                        }
                        None if finished.load(Acquire) => break,
                        None => std::thread::yield_now(),
                    }
                }
            });
        }
        let mut submitted = 0u64;
        while submitted < tasks {
            e.scope_begin().unwrap();
            for _ in 0..100.min(tasks - submitted) {
                let (ch, pos) = (submitted / chain, submitted % chain);
                let mode = if pos == 0 { AccessMode::Write } else { AccessMode::ReadWrite };
                let accesses = [access(0x1000_0000 + (ch % 4096) * 0x1000, mode)];
                let id = loop {
                    match e.submit(&accesses, 1024) {
                        Ok(s) => break s.id,
                        Err(SubmitRefusal::Wait) => std::thread::yield_now(),
                        Err(other) => panic!("submit {submitted}: {other:?}"),
                    }
                };
                let at = (id.0 as u32 as usize) % WINDOW;
                meta[at].store((ch << 32) | pos, Relaxed);
                meta_id[at].store(id.0, Release);
                submitted += 1;
                if matches!(submitted, 10_000 | 100_000 | 1_000_000) {
                    let rss = rss_kib().map_or("unknown".into(), |k| format!("{k} KiB"));
                    eprintln!("trb stream (chain {chain}): {submitted} tasks, RSS {rss}");
                }
            }
            e.scope_end().unwrap();
        }
        e.finish().unwrap();
        while e.incomplete() > 0 {
            std::hint::spin_loop();
        }
        finished.store(true, Release);
    });
    let per_task = start.elapsed().as_secs_f64() * 1e6 / tasks as f64;
    eprintln!("trb stream (chain {chain}): {tasks} tasks, {per_task:.3} us per task");
    assert_eq!(out_of_order.load(Relaxed), 0, "chain tasks completed out of order");
    assert!(progress.iter().enumerate().all(|(i, p)| {
        let len = if (i as u64 + 1) * chain <= tasks { chain } else { tasks % chain };
        p.load(Relaxed) == len
    }));
    let (live, peak) = e.ring_tasks(1);
    assert_eq!(live, 0, "every slot was reclaimed");
    assert!(peak as usize <= WINDOW);
    assert!(e.ring_heap(1).1 <= 1 << 20);
    assert_eq!(e.ring_deps(1).0, 0);
}

/// Task count of the threaded streams: `SIMPLER_TRB_STREAM_TASKS` (1000000 for the full
/// size), 10000 by default.
fn stream_tasks() -> u64 {
    std::env::var("SIMPLER_TRB_STREAM_TASKS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000)
}

#[test]
fn a_threaded_stream_of_independent_tasks_runs_in_bounded_rings() {
    threaded_stream(1, stream_tasks());
}

#[test]
fn a_threaded_stream_of_100_task_chains_runs_in_order_in_bounded_rings() {
    threaded_stream(100, stream_tasks());
}

/// Runs a mixed workload to its end on `e`: chains and fan-ins over a few buffers, the tasks
/// `nested` picks in a nested scope (ring 1), every other one of those using a buffer allocated
/// in its scope, completing ready tasks whenever the rings push back.
fn run_mixed(e: &mut Engine<'_>, tasks: u64, nested: fn(u64) -> bool) {
    let mut done = |_| {};
    for i in 0..tasks {
        let nested = nested(i);
        if nested {
            e.scope_begin().unwrap();
        }
        let keep = match nested && i % 2 == 0 {
            true => vec![alloc_with_back_pressure(e, 1024, &mut done).owner.0],
            false => vec![],
        };
        let key = (i % 3) << 12;
        let mode = [AccessMode::Write, AccessMode::Read, AccessMode::ReadWrite][(i % 3) as usize];
        submit_keeping(
            e,
            &[access(key, mode), access(0x8000, AccessMode::Read)],
            1024,
            &keep,
            &mut done,
        )
        .unwrap();
        if nested {
            e.scope_end().unwrap();
        }
    }
    e.finish().unwrap();
    drain(e, &mut done);
}

#[test]
fn a_kept_arena_after_a_clean_run_is_reset_partially_to_the_same_bytes_as_a_full_reset() {
    // 20 tasks use part of a 64-slot window, in one ring or two; 100 wrap ring 1's 16 slots.
    let mostly: fn(u64) -> bool = |i| i % 8 != 0;
    for (window, tasks, nested) in
        [(64, 20, (|_| false) as fn(u64) -> bool), (64, 20, mostly), (16, 100, mostly)]
    {
        let mut arena = TrbArena::new(sizes(window, 64 << 10, 64), 4 * window * 4, window * 4);
        let mut e = Engine::new(arena.storage(), false);
        assert_eq!(e.arena_reset(), ArenaReset::Full, "a fresh arena");
        run_mixed(&mut e, tasks, nested);
        assert!(e.end_clean());
        let mut full = arena.clone();
        assert_eq!(Engine::new(full.storage(), false).arena_reset(), ArenaReset::Full);
        let mut e = Engine::new(arena.storage(), true);
        assert_eq!(e.arena_reset(), ArenaReset::Partial);
        assert!(arena.bytes() == full.bytes(), "window {window}, {tasks} tasks: bytes differ");
        // And the reused arena runs the workload again.
        e = Engine::new(arena.storage(), true);
        run_mixed(&mut e, tasks, nested);
        assert!(e.end_clean());
    }
}

#[test]
fn a_run_that_does_not_end_cleanly_leaves_a_full_reset_to_the_next() {
    let mut arena = TrbArena::new(sizes(16, 64 << 10, 64), 256, 64);
    let mut e = Engine::new(arena.storage(), false);
    run_mixed(&mut e, 10, |i| i % 2 == 0);
    assert!(e.end_clean());
    let mut e = Engine::new(arena.storage(), true);
    assert_eq!(e.arena_reset(), ArenaReset::Partial);
    e.submit(&[access(0, AccessMode::Write)], 0).unwrap();
    assert!(!e.end_clean(), "the orchestration has not finished");
    e.finish().unwrap();
    assert!(!e.end_clean(), "a task has not completed");
    let e = Engine::new(arena.storage(), true);
    assert_eq!(e.arena_reset(), ArenaReset::Full, "the abandoned run's leftovers are unknown");
    assert_eq!(Engine::new(arena.storage(), true).arena_reset(), ArenaReset::Full);
}

#[test]
fn a_write_that_replaces_what_it_covers_in_a_full_map_is_not_a_tensormap_overflow() {
    // A map of 8 entries, all readers of slices of one buffer held by the open outer scope
    // (their task completed, nothing is retired): a whole write replaces them all.
    let mut arena = TrbArena::new(sizes(16, 16 << 10, 16), 8, 4);
    let mut e = Engine::new(arena.storage(), false);
    let k = 0x10_000;
    let slice = |i: u64| Access {
        key: k,
        span: ByteSpan::new(k + 32 * i, k + 32 * (i + 1)).unwrap(),
        mode: AccessMode::Read,
    };
    let reads: Vec<Access> = (0..8).map(slice).collect();
    e.submit(&reads, 0).unwrap();
    drain(&mut e, &mut |_| {});
    let whole =
        Access { key: k, span: ByteSpan::new(k, k + 256).unwrap(), mode: AccessMode::Write };
    let submitted = e.submit(&[whole], 0);
    assert!(submitted.is_ok(), "{submitted:?}");
    drain(&mut e, &mut |_| {});
    e.finish().unwrap();
}

mod room_check {
    //! The tensor map's room check before a commit: whatever mix of overlapping reads, writes
    //! and in-place updates a task brings to a nearly full map, an access the check let through
    //! is recorded (the engine reports `Unrecorded` otherwise, which fails the run).

    use proptest::prelude::*;

    use super::*;

    /// One access: buffer index, first and last 32-byte unit, mode.
    type RawAccess = (u64, u64, u64, u8);

    fn to_access(&(buffer, first, units, mode): &RawAccess) -> Access {
        let key = 0x10_000 * (buffer + 1);
        let start = key + 32 * first;
        let mode = [AccessMode::Read, AccessMode::Write, AccessMode::ReadWrite][mode as usize];
        Access { key, span: ByteSpan::new(start, start + 32 * units).unwrap(), mode }
    }

    fn config() -> ProptestConfig {
        let cases =
            std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
        ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn every_access_the_room_check_admits_is_recorded(
            capacity in 2u32..10,
            scope_len in 1usize..6,
            tasks in prop::collection::vec(
                prop::collection::vec((0u64..3, 0u64..6, 1u64..4, 0u8..3), 1..5),
                1..40,
            ),
        ) {
            let mut arena = TrbArena::new(sizes(16, 64 << 10, 64), capacity, 4);
            let mut e = Engine::new(arena.storage(), false);
            let mut done = |_| {};
            for scope in tasks.chunks(scope_len) {
                e.scope_begin().unwrap();
                for task in scope {
                    let accesses: Vec<Access> = task.iter().map(to_access).collect();
                    // A stall (more entries than the map holds) is a valid refusal; a
                    // refusal past the check panics inside `submit_keeping`.
                    let _ = submit_with_back_pressure(&mut e, &accesses, 0, &mut done);
                }
                e.scope_end().unwrap();
            }
            e.finish().unwrap();
            drain(&mut e, &mut done);
        }
    }
}

#[test]
fn untracked_tasks_are_waited_for_until_they_complete_even_past_the_list() {
    let span = |i: u64| ByteSpan::new(0x1000 * (i + 1), 0x1000 * (i + 1) + 64).unwrap();
    for count in [3u64, 70] {
        let mut arena = TrbArena::new(sizes(128, 64 << 10, 64), 64, 16);
        let mut e = Engine::new(arena.storage(), false);
        let ids: Vec<DeviceTaskId> = (0..count)
            .map(|i| {
                let id = e.submit(&[], 0).unwrap().id;
                e.note_untracked(id, span(i));
                id
            })
            .collect();
        let last = span(count - 1);
        assert!(!e.untracked_done(last), "{count} untracked tasks, none completed");
        let elsewhere = ByteSpan::new(0x1_0000_0000, 0x1_0000_0040).unwrap();
        // Past the list, every task counts; within it, only those touching the bytes.
        assert_eq!(e.untracked_done(elsewhere), count <= 64, "{count}: other bytes");
        let c = e.completer();
        let ready: Vec<DeviceTaskId> = std::iter::from_fn(|| c.pop_ready()).collect();
        assert_eq!(ready, ids);
        for &id in &ready[..ready.len() - 1] {
            let _ = c.complete(id);
        }
        assert!(!e.untracked_done(last), "{count} untracked tasks, one still running");
        assert_eq!(e.untracked_done(span(0)), count <= 64, "{count}: the first task's bytes");
        let _ = c.complete(ready[ready.len() - 1]);
        assert!(e.untracked_done(last), "{count} untracked tasks, all completed");
    }
}
