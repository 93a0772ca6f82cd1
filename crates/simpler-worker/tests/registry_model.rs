//! Op-sequence property test of registration against a reference model: registering host
//! closures, unregistering handles (twice included) and running them. The model is a vector of
//! (handle, registered, runs) entries.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::one_sub_task;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use simpler_worker::{BuildFailure, CallableHandle, WorkerError};

#[derive(Clone, Debug)]
enum Op {
    Register,
    Unregister(usize),
    Run(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Register),
        1 => (0usize..8).prop_map(Op::Unregister),
        3 => (0usize..8).prop_map(Op::Run),
    ]
}

struct Entry {
    handle: CallableHandle,
    registered: bool,
    runs: usize,
    counter: Arc<AtomicUsize>,
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/registry_model.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn registration_follows_the_reference_model(ops in proptest::collection::vec(op(), 1..24)) {
        let w = common::host().sub_workers(1).start().expect("start");
        let mut model: Vec<Entry> = Vec::new();
        for op in ops {
            match op {
                Op::Register => {
                    let counter = Arc::new(AtomicUsize::new(0));
                    let c = Arc::clone(&counter);
                    let handle = w.register_host("m", move |_| {
                        c.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }).expect("register");
                    prop_assert!(model.iter().all(|e| e.handle != handle));
                    model.push(Entry { handle, registered: true, runs: 0, counter });
                }
                Op::Unregister(i) if i < model.len() => {
                    let r = w.unregister(model[i].handle);
                    if model[i].registered {
                        prop_assert!(r.is_ok());
                        model[i].registered = false;
                    } else {
                        prop_assert!(matches!(r, Err(WorkerError::UnknownCallable { .. })), "{:?}", r);
                    }
                }
                Op::Run(i) if i < model.len() => {
                    let h = model[i].handle;
                    let r = w.run(one_sub_task(h));
                    if model[i].registered {
                        prop_assert!(r.is_ok(), "{:?}", r);
                        model[i].runs += 1;
                    } else {
                        let unknown = matches!(
                            &r,
                            Err(WorkerError::Build { cause: BuildFailure::Callback(e), .. })
                                if matches!(e.downcast_ref::<WorkerError>(), Some(WorkerError::UnknownCallable { .. }))
                        );
                        prop_assert!(unknown, "{:?}", r);
                    }
                }
                _ => {}
            }
            for e in &model {
                prop_assert_eq!(e.counter.load(Ordering::SeqCst), e.runs);
            }
        }
        w.close().expect("close");
    }
}
