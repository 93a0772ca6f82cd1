//! `TaskWindowCore` under real threads: the owner issues and reclaims while two retirer threads
//! race to retire every id, out of order.
//!
//! What must hold: every id is retired exactly once (one of the two racing CASes wins), the owner
//! reclaims strictly in FIFO order and only ids whose retirement it can see, and what a retirer
//! wrote before retiring is visible to the owner once the slot is reclaimed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use simpler_ring::fixed::{SlotWord, TaskWindowCore, WindowRetire, WindowRetirer};

const WINDOW: usize = 8;
const IDS: u32 = 40_000;
/// Only catches hangs; the test normally finishes in well under a second.
const HANG: Duration = Duration::from_secs(120);

/// Retires every id it receives, holding up to `WINDOW` of them and picking one at random, so
/// retirement order differs from issue order. Returns how many of its retires won.
fn retirer_thread(
    retirer: WindowRetirer<'_>,
    payload: &[AtomicU64],
    ids: mpsc::Receiver<u32>,
    mut seed: u64,
) -> u32 {
    let mut held: Vec<u32> = Vec::with_capacity(WINDOW);
    let mut won = 0;
    let mut retire_one = |held: &mut Vec<u32>| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let local = held.swap_remove((seed >> 33) as usize % held.len());
        // Published by the retire's release CAS; the owner checks it after reclaiming. A maximum,
        // so that the losing retirer of an older id cannot hide a later id's mark.
        payload[local as usize % WINDOW].fetch_max(u64::from(local) + 1, Ordering::Relaxed);
        match retirer.retire(local) {
            WindowRetire::Retired => won += 1,
            // The other retirer won; by now the owner may even have reused the slot.
            WindowRetire::AlreadyRetired | WindowRetire::NotLive => {}
        }
    };
    for n in 0.. {
        match ids.try_recv() {
            Ok(local) => {
                held.push(local);
                if held.len() == WINDOW || n % 3 == 0 {
                    retire_one(&mut held);
                }
            }
            // Nothing new: the owner waits for a retirement, so retire one of the held ids.
            Err(mpsc::TryRecvError::Empty) if !held.is_empty() => retire_one(&mut held),
            Err(mpsc::TryRecvError::Empty) => match ids.recv() {
                Ok(local) => held.push(local),
                Err(mpsc::RecvError) => break,
            },
            Err(mpsc::TryRecvError::Disconnected) => break,
        }
    }
    while !held.is_empty() {
        retire_one(&mut held);
    }
    won
}

#[test]
fn two_racing_retirers_and_a_reclaiming_owner_agree_on_every_id() {
    let words: Vec<SlotWord> = (0..WINDOW).map(|_| SlotWord::new(0)).collect();
    let payload: Vec<AtomicU64> = (0..WINDOW).map(|_| AtomicU64::new(0)).collect();
    let mut window = TaskWindowCore::new(&words).unwrap();
    let retirer = window.retirer();
    let (to_a, from_owner_a) = mpsc::channel();
    let (to_b, from_owner_b) = mpsc::channel();
    let deadline = Instant::now() + HANG;

    let (won_a, won_b) = thread::scope(|s| {
        let payload = &payload;
        let a = s.spawn(move || retirer_thread(retirer, payload, from_owner_a, 1));
        let b = s.spawn(move || retirer_thread(retirer, payload, from_owner_b, 2));
        let mut issued = 0;
        let mut reclaimed = 0;
        while reclaimed < IDS {
            assert!(Instant::now() < deadline, "stuck at {reclaimed} reclaimed of {IDS}");
            // `try_issue` reclaims too, so account for every id the tail passed since last time.
            window.reclaim();
            for local in reclaimed..window.tail() {
                // FIFO: the tail passed exactly the next ids, each retired and its retirer's
                // write visible.
                let seen = payload[local as usize % WINDOW].load(Ordering::Relaxed);
                assert!(seen > u64::from(local), "id {local} reclaimed before it was retired");
            }
            reclaimed = window.tail();
            if issued < IDS {
                match window.try_issue() {
                    Some(local) => {
                        assert_eq!(local, issued);
                        to_a.send(local).unwrap();
                        to_b.send(local).unwrap();
                        issued += 1;
                    }
                    None => thread::yield_now(),
                }
            } else {
                thread::yield_now();
            }
            assert!(window.live() as usize <= WINDOW);
        }
        drop((to_a, to_b));
        (a.join().unwrap(), b.join().unwrap())
    });

    assert_eq!(won_a + won_b, IDS, "each id is retired exactly once");
    assert!(won_a > 0 && won_b > 0, "both retirers won some races ({won_a}, {won_b})");
    assert_eq!((window.head(), window.tail(), window.live()), (IDS, IDS, 0));
}
