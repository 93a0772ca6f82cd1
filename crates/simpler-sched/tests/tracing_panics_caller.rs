//! A tracing layer that panics while the engine logs on the calling thread (beginning a run,
//! aborting one, shutting down) must not leave the engine half changed: the call may fail, but
//! the next one works, and no thread or hook is lost. Each test installs its layer for its own
//! thread only (`with_default`).

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use simpler_sched::{Engine, EngineConfig};
use simpler_types::{CancelReason, WorkerType};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Panics when a span of this name opens, or an event with this message is logged.
#[derive(Clone, Copy, Debug)]
enum PanicsOn {
    Span(&'static str),
    Event(&'static str),
}

/// A [`PanicsOn`] layer counting the panics it made, so that a test knows it fired.
struct Refusing {
    on: PanicsOn,
    hits: Arc<AtomicUsize>,
}

impl Refusing {
    fn refuse(&self, what: &str) -> ! {
        self.hits.fetch_add(1, Ordering::SeqCst);
        panic!("this layer refuses the {what}");
    }
}

/// The `message` field of an event.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S> tracing_subscriber::Layer<S> for Refusing
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: Context<'_, S>,
    ) {
        if matches!(self.on, PanicsOn::Span(name) if attrs.metadata().name() == name) {
            self.refuse("span");
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if let PanicsOn::Event(text) = self.on {
            let mut m = Message(String::new());
            event.record(&mut m);
            if m.0 == text {
                self.refuse("event");
            }
        }
    }
}

/// Runs `f` on this thread with a layer panicking on `on` installed; `f`'s panic, if the
/// layer made one, is caught. The layer must have fired: a renamed span or event would
/// otherwise leave the test checking nothing.
fn under<R>(on: PanicsOn, f: impl FnOnce() -> R) -> std::thread::Result<R> {
    let hits = Arc::new(AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry().with(Refusing { on, hits: Arc::clone(&hits) });
    let r = tracing::subscriber::with_default(subscriber, || {
        // Interest cached while no subscriber was set would skip the layer.
        tracing::callsite::rebuild_interest_cache();
        catch_unwind(AssertUnwindSafe(f))
    });
    assert!(hits.load(Ordering::SeqCst) > 0, "the layer never saw {on:?}");
    r
}

fn one_run(e: &Engine) {
    let mut b = e.begin_run().expect("the engine still begins runs");
    noop_on(&mut b, 0).unwrap();
    let run = b.close();
    assert!(wait(e, run).is_completed());
}

#[test]
fn a_layer_panicking_as_a_run_opens_leaves_the_next_begin_run_working() {
    for layer in [PanicsOn::Span("run"), PanicsOn::Event("run begun")] {
        let h = Harness::new();
        let e = engine(&[0], 0, &h, false);
        let _ = under(layer, || e.begin_run().map(|b| b.close()));
        one_run(&e);
        e.shutdown(Instant::now() + Duration::from_secs(5)).expect("shutdown");
    }
}

#[test]
fn a_layer_panicking_as_shutdown_begins_still_stops_every_endpoint() {
    let h = Harness::new();
    let fake = common::Fake::new(WorkerType::NextLevel, 0, &h, false);
    let lifecycle = Arc::clone(&fake.lifecycle);
    let e =
        Engine::start(EngineConfig { next_level: vec![Box::new(fake)], ..EngineConfig::default() })
            .unwrap();
    one_run(&e);
    let _ = under(PanicsOn::Event("engine shutting down"), || {
        e.shutdown(Instant::now() + Duration::from_secs(5))
    });
    drop(e);
    eventually("the endpoint's shutdown hook ran", || {
        lifecycle.lock().unwrap().contains(&"shutdown")
    });
}

#[test]
fn a_layer_panicking_as_a_run_is_aborted_still_cancels_its_unstarted_tasks() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, true);
    let mut b = e.begin_run().unwrap();
    let first = noop_on(&mut b, 0).unwrap();
    let second = noop_on(&mut b, 0).unwrap();
    let run = b.close();
    h.wait_started(first, 0);
    let _ = under(PanicsOn::Event("aborting run"), || e.abort_run(run, CancelReason::Shutdown));
    h.release(first, Action::Succeed);
    let outcome = wait(&e, run);
    assert!(!outcome.is_completed(), "the run was aborted");
    assert!(!h.log().iter().any(|d| d.task == second), "an aborted run's queued task ran");
    e.shutdown(Instant::now() + Duration::from_secs(5)).expect("shutdown");
}
