//! Property test: `ScopeStack` against a `Vec<Vec<SlotId>>` model (ring invariants
//! 16–18), driven by random operation sequences.

use proptest::prelude::*;
use simpler_ring::{RingError, ScopeStack};
use simpler_types::{MAX_SCOPE_DEPTH, SlotId};

#[derive(Clone, Debug)]
enum Op {
    Begin,
    /// Begin many times in a row, to reach the depth limit often.
    BeginMany(usize),
    Register,
    End,
    Unwind(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::Begin),
        1 => (1usize..70).prop_map(Op::BeginMany),
        8 => Just(Op::Register),
        4 => Just(Op::End),
        1 => (0usize..70).prop_map(Op::Unwind),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn scope_stack_matches_its_reference_model(ops in prop::collection::vec(op(), 1..120)) {
        let mut stack = ScopeStack::new();
        let mut model: Vec<Vec<SlotId>> = Vec::new();
        let mut next = 0u32;
        let mut registered = 0usize;
        let mut returned: Vec<SlotId> = Vec::new();
        let mut out = Vec::new();
        for op in ops {
            let begins = match op {
                Op::Begin => 1,
                Op::BeginMany(n) => n,
                _ => 0,
            };
            for _ in 0..begins {
                let depth = stack.depth();
                if model.len() < MAX_SCOPE_DEPTH {
                    prop_assert_eq!(stack.begin(), Ok(()));
                    model.push(Vec::new());
                } else {
                    // Invariant 16: a refused begin changes nothing.
                    prop_assert_eq!(stack.begin(), Err(RingError::ScopeDepthExceeded { max: 64 }));
                    prop_assert_eq!(stack.depth(), depth);
                }
            }
            match op {
                Op::Begin | Op::BeginMany(_) => {}
                Op::Register => {
                    let slot = SlotId::new(next, 1);
                    next += 1;
                    stack.register(slot);
                    if let Some(frame) = model.last_mut() {
                        frame.push(slot);
                        registered += 1;
                    }
                }
                Op::End => {
                    out.clear();
                    match model.pop() {
                        Some(frame) => {
                            prop_assert_eq!(stack.end_into(&mut out), Ok(()));
                            prop_assert_eq!(&out, &frame);
                        }
                        None => prop_assert_eq!(stack.end_into(&mut out), Err(RingError::ScopeUnderflow)),
                    }
                    returned.extend_from_slice(&out);
                }
                Op::Unwind(to) => {
                    out.clear();
                    stack.unwind_into(&mut out, to);
                    let mut want = Vec::new();
                    while model.len() > to {
                        want.extend(model.pop().unwrap_or_default());
                    }
                    // Invariant 17: innermost frame first, registration order within a frame.
                    prop_assert_eq!(&out, &want);
                    returned.extend_from_slice(&out);
                }
            }
            // Invariants 16 and 18.
            prop_assert_eq!(stack.depth(), model.len());
            prop_assert!(stack.depth() <= MAX_SCOPE_DEPTH);
            prop_assert_eq!(stack.ring_index().as_usize(), model.len().saturating_sub(1).min(3));
        }
        // Invariant 17: every registered slot comes back exactly once.
        out.clear();
        stack.unwind_into(&mut out, 0);
        returned.extend_from_slice(&out);
        prop_assert_eq!(returned.len(), registered);
        let mut sorted = returned.clone();
        sorted.sort();
        sorted.dedup();
        prop_assert_eq!(sorted.len(), registered);
    }
}
