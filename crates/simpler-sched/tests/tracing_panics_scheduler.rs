//! A tracing layer that panics on an event the scheduler logs in a pass (a task member that
//! failed) must not be taken for an engine bug: the run fails with its task's failure, and the
//! engine is not poisoned. The layer is process-wide (the scheduler's pass runs on engine
//! threads), so this binary holds this one test.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Panics on every event whose message starts with "member failed".
struct PanicsOnMemberFailures;

/// The panics the layer made, so that the test knows it fired.
static HITS: AtomicUsize = AtomicUsize::new(0);

struct StartsWithMemberFailed(bool);

impl Visit for StartsWithMemberFailed {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}").starts_with("member failed");
        }
    }
}

impl<S> tracing_subscriber::Layer<S> for PanicsOnMemberFailures
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut m = StartsWithMemberFailed(false);
        event.record(&mut m);
        if m.0 {
            HITS.fetch_add(1, Ordering::SeqCst);
            panic!("this layer refuses member failures");
        }
    }
}

#[test]
fn a_layer_panicking_on_a_member_failure_fails_the_run_not_the_engine() {
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(PanicsOnMemberFailures),
    )
    .expect("the only subscriber of this binary");
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    let task = noop_on(&mut b, 0).unwrap();
    h.script(task, Action::Fail("refused on purpose".into()));
    let run = b.close();
    let outcome = wait(&e, run);
    let failure = outcome.failure().and_then(|f| f.task_failure()).expect("the task failed");
    assert_eq!(failure.task, task, "{failure:?}");
    assert!(HITS.load(Ordering::SeqCst) > 0, "the layer never saw the member failure");
    assert!(!e.is_poisoned(), "a panicking layer poisoned the engine");
    let mut b = e.begin_run().expect("the engine still begins runs");
    noop_on(&mut b, 0).unwrap();
    let run = b.close();
    assert!(wait(&e, run).is_completed());
    e.shutdown(Instant::now() + Duration::from_secs(5)).expect("shutdown");
}
