//! `loom` models of the resource-slot hand-off (run with `RUSTFLAGS="--cfg simpler_loom" cargo
//! test -p simpler-device-a2a3 --release --lib loom`).
//!
//! The models drive the runner's real slot protocol — [`Lease`] and its drop into the return
//! queue, [`lowest_free`], [`is_current`], [`take_returned`], [`keep_returned`] and the
//! generation bump — from a
//! runner thread, a device thread that executes the launched slot, and a thread that drops a
//! handle. Each slot's per-run resources are a `loom` cell: the runner's preparation writes
//! it and the device reads it while the run executes, so a preparation that could touch the
//! executing slot, or that is not ordered after the device finished reading it, is a data
//! race loom reports. A lost completion shows as a deadlock.

use std::sync::Arc;

use loom::cell::UnsafeCell;
use loom::sync::{Condvar, Mutex};
use loom::thread;
use simpler_types::RunId;

use super::lease::{Lease, ReturnQueue, is_current, keep_returned, lowest_free, take_returned};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

fn id(n: u64) -> RunId {
    RunId::from_raw(n).expect("non-zero")
}

/// Two resource slots and the device. `state` carries the hand-off: the run launched and not
/// yet picked up by the device, and the slot the device finished reading (the streams and the
/// completion events of the real runner; the lock orders the slot's bytes between them).
struct Device {
    bytes: [UnsafeCell<u64>; 2],
    state: Mutex<Handoff>,
    cv: Condvar,
}

#[derive(Default)]
struct Handoff {
    launched: Option<usize>,
    done: Option<usize>,
}

// SAFETY: the cells are only accessed under the slot protocol the model checks; loom's cells
// report any access the protocol fails to order.
unsafe impl Sync for Device {}

impl Device {
    fn new() -> Device {
        Device {
            bytes: [UnsafeCell::new(0), UnsafeCell::new(0)],
            state: Mutex::new(Handoff::default()),
            cv: Condvar::new(),
        }
    }

    /// The device side: waits for `runs` launches, reads each launched slot's bytes (they
    /// must be that run's), then reports the slot done.
    fn execute(&self, runs: usize) -> Vec<u64> {
        let mut seen = Vec::new();
        for _ in 0..runs {
            let slot = {
                let mut g = self.state.lock().unwrap();
                loop {
                    if let Some(s) = g.launched.take() {
                        break s;
                    }
                    g = self.cv.wait(g).unwrap();
                }
            };
            seen.push(self.bytes[slot].with(|p| {
                // SAFETY: loom checks this read is ordered after the slot's preparation and
                // before its next one.
                unsafe { *p }
            }));
            self.state.lock().unwrap().done = Some(slot);
            self.cv.notify_all();
        }
        seen
    }
}

/// The runner's view of its slots: generation and occupancy per slot, and the return queue.
struct Slots {
    generation: [u64; 2],
    occupied: [bool; 2],
    returns: ReturnQueue,
}

impl Slots {
    fn new() -> Slots {
        Slots { generation: [0; 2], occupied: [false; 2], returns: Default::default() }
    }

    /// `prepare`: the lowest free slot is leased and its bytes written (`run`'s value).
    fn prepare(&mut self, dev: &Device, run: u64) -> Lease {
        let s = lowest_free(self.occupied).expect("a free slot");
        dev.bytes[s].with_mut(|p| {
            // SAFETY: the slot is free, so no launched run reads it (loom checks).
            unsafe { *p = run }
        });
        self.occupied[s] = true;
        Lease::new(s, self.generation[s], id(run), Arc::clone(&self.returns))
    }

    fn check(&self, lease: &Lease) -> bool {
        is_current(lease, &self.returns, self.generation.get(lease.slot).copied())
    }

    /// `launch_run`: hands the slot to the device.
    fn launch(&self, dev: &Device, lease: &Lease) {
        assert!(self.check(lease), "launch of a stale lease");
        dev.state.lock().unwrap().launched = Some(lease.slot);
        dev.cv.notify_all();
    }

    /// `reap_run` + `complete_run`: waits for the device, then ends the run (generation bump).
    fn complete(&mut self, dev: &Device, lease: Lease) {
        assert!(self.check(&lease), "completion of a stale lease");
        let slot = lease.slot;
        let mut g = dev.state.lock().unwrap();
        while g.done != Some(slot) {
            g = dev.cv.wait(g).unwrap();
        }
        g.done = None;
        drop(g);
        lease.consume();
        self.end(slot);
    }

    fn end(&mut self, s: usize) {
        self.occupied[s] = false;
        self.generation[s] += 1;
    }

    /// `reclaim_dropped`: frees the slots whose current lease a handle dropped.
    fn reclaim(&mut self) -> Vec<usize> {
        let mut slots = Vec::new();
        loop {
            let generation = self.generation;
            let Some((s, _)) = take_returned(&self.returns, 0, |s| generation.get(s).copied())
            else {
                return slots;
            };
            self.end(s);
            slots.push(s);
        }
    }
}

/// Run 2 is prepared while run 1 executes, launched after run 1 was reaped, and run 3 reuses
/// run 1's slot: every run's bytes reach the device intact, no preparation races the executing
/// slot, and run 1's lease is stale once its run ended.
#[test]
fn loom_prepare_while_executing_never_touches_the_executing_slot() {
    model(|| {
        let dev = Arc::new(Device::new());
        let device = {
            let dev = Arc::clone(&dev);
            thread::spawn(move || dev.execute(3))
        };
        let mut slots = Slots::new();
        let run1 = slots.prepare(&dev, 1);
        slots.launch(&dev, &run1);
        let run2 = slots.prepare(&dev, 2);
        assert_ne!(run1.slot, run2.slot, "run 2 was prepared in the executing slot");
        let stale = Lease::new(run1.slot, run1.generation, id(1), Arc::clone(&slots.returns));
        slots.complete(&dev, run1);
        assert!(!slots.check(&stale), "a lease of an ended run is refused");
        stale.consume();
        slots.launch(&dev, &run2);
        let run3 = slots.prepare(&dev, 3);
        slots.complete(&dev, run2);
        slots.launch(&dev, &run3);
        slots.complete(&dev, run3);
        assert_eq!(device.join().unwrap(), vec![1, 2, 3], "each run saw its own bytes");
    });
}

/// A prepared run's handle is dropped on another thread while the runner prepares and runs
/// another: the dropped slot is reclaimed exactly once, a lease returned after its slot was
/// reclaimed and reused is ignored, and the slot is never reused while it is still leased.
#[test]
fn loom_a_handle_dropped_on_another_thread_frees_its_slot_once() {
    model(|| {
        let dev = Arc::new(Device::new());
        let device = {
            let dev = Arc::clone(&dev);
            thread::spawn(move || dev.execute(1))
        };
        let mut slots = Slots::new();
        let dropped = slots.prepare(&dev, 1);
        let dropped_slot = dropped.slot;
        let dropper = thread::spawn(move || drop(dropped));
        let run2 = slots.prepare(&dev, 2);
        assert_ne!(run2.slot, dropped_slot, "a leased slot was prepared again");
        slots.launch(&dev, &run2);
        let early = slots.reclaim();
        dropper.join().unwrap();
        let late = slots.reclaim();
        let mut all = early.clone();
        all.extend(&late);
        assert_eq!(all, vec![dropped_slot], "the dropped slot is reclaimed exactly once");
        assert!(!slots.occupied[dropped_slot]);
        slots.complete(&dev, run2);
        // Reclaiming again finds nothing: the queue was drained and stale entries are ignored.
        slots.returns.lock().push_back((dropped_slot, 0));
        assert_eq!(slots.reclaim(), Vec::<usize>::new(), "a stale returned lease is ignored");
        assert_eq!(device.join().unwrap(), vec![2]);
    });
}

/// A cleanup that must not wait takes a dropped launched run's lease, finds the device still
/// executing it and keeps it, while another handle is dropped on another thread: the rest of
/// that cleanup skips the kept lease, a later cleanup takes it first (ahead of the lease
/// dropped after it), and each slot is reclaimed exactly once.
#[test]
fn loom_a_kept_lease_stays_queued_ahead_and_is_reclaimed_once_later() {
    model(|| {
        let dev = Device::new();
        let mut slots = Slots::new();
        let executing = slots.prepare(&dev, 1);
        let other = slots.prepare(&dev, 2);
        let (executing_slot, other_slot) = (executing.slot, other.slot);
        drop(executing);
        let dropper = thread::spawn(move || drop(other));
        let current = |g: [u64; 2]| move |s: usize| g.get(s).copied();
        let taken = take_returned(&slots.returns, 0, current(slots.generation));
        assert_eq!(taken, Some((executing_slot, 0)), "the lease dropped first is taken first");
        keep_returned(&slots.returns, 0, (executing_slot, 0));
        let mut reclaimed = Vec::new();
        if let Some((s, _)) = take_returned(&slots.returns, 1, current(slots.generation)) {
            assert_eq!(s, other_slot, "the same cleanup took the kept lease again");
            slots.end(s);
            reclaimed.push(s);
        }
        dropper.join().unwrap();
        let later = slots.reclaim();
        assert_eq!(later.first(), Some(&executing_slot), "the kept lease is taken first");
        reclaimed.extend(later);
        reclaimed.sort_unstable();
        let mut expected = vec![executing_slot, other_slot];
        expected.sort_unstable();
        assert_eq!(reclaimed, expected, "each slot is reclaimed exactly once");
        assert_eq!(slots.reclaim(), Vec::<usize>::new());
    });
}
