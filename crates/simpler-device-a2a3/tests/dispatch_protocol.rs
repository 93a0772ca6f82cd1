//! Property test of one core's dispatch bookkeeping against a model AICore (`docs/device-handshake.md`): random interleavings of "the AICPU issues a token", "the AICore makes a step" and
//! "the AICPU samples COND" (which may miss any number of intermediate values).

use std::collections::VecDeque;

use proptest::prelude::*;
use simpler_device_a2a3::abi::CoreType;
use simpler_device_a2a3::abi::regs::{Cond, IDLE_VALUE};
use simpler_device_a2a3::aicpu::dispatch::{CoreState, IssueRefused};

#[derive(Clone, Copy, Debug)]
enum Op {
    Issue,
    AicoreStep,
    Observe,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![Just(Op::Issue), Just(Op::AicoreStep), Just(Op::Observe)]
}

/// The AICore side: tokens in the order written, the one it is running, and COND.
#[derive(Default)]
struct Aicore {
    unstarted: VecDeque<(u32, u32)>,
    running: Option<(u32, u32)>,
    cond: u32,
    finished: Vec<u32>,
}

impl Aicore {
    fn step(&mut self) {
        if let Some((token, task)) = self.running.take() {
            self.cond = Cond::fin(token).0;
            self.finished.push(task);
        } else if let Some((token, task)) = self.unstarted.pop_front() {
            self.cond = Cond::ack(token).0;
            self.running = Some((token, task));
        }
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
            "proptest-regressions/dispatch_protocol.txt",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn completions_follow_issue_order_and_tokens_never_overrun_the_aicore(ops in proptest::collection::vec(op(), 1..200)) {
        let mut w = CoreState::new(0, CoreType::Aiv, 0, 0);
        let mut core = Aicore { cond: IDLE_VALUE, ..Aicore::default() };
        let mut next_task = 0u32;
        let mut issued: Vec<u32> = Vec::new();
        let mut completed: Vec<u32> = Vec::new();
        for op in ops {
            match op {
                Op::Issue => {
                    match w.issue(next_task) {
                        Ok(token) => {
                            // The buffer about to be used must not be the running token's.
                            if let Some((t, _)) = core.running {
                                prop_assert_ne!(t & 1, token & 1);
                            }
                            prop_assert!(core.unstarted.is_empty(), "a token was written before the previous one was acknowledged");
                            core.unstarted.push_back((token, next_task));
                            issued.push(next_task);
                            next_task += 1;
                        }
                        Err(IssueRefused::RunningNotAcked) | Err(IssueRefused::PendingFull) => {
                            // Refusing is only right while the AICPU still has work outstanding
                            // on the core (as far as it has observed).
                            prop_assert!(issued.len() > completed.len(), "refused although nothing is outstanding");
                        }
                    }
                }
                Op::AicoreStep => core.step(),
                Op::Observe => completed.extend_from_slice(w.observe(core.cond).as_slice()),
            }
            // Completions are a prefix of the issue order and never run ahead of the AICore.
            prop_assert_eq!(&completed[..], &issued[..completed.len()]);
            prop_assert!(completed.len() <= core.finished.len());
            prop_assert!(issued.len() - completed.len() <= 2, "at most one running and one pending");
        }
        // Quiescence: let the AICore finish everything; one observation completes all.
        while core.running.is_some() || !core.unstarted.is_empty() {
            core.step();
        }
        completed.extend_from_slice(w.observe(core.cond).as_slice());
        prop_assert_eq!(completed, issued);
        prop_assert!(w.is_idle());
    }
}
