//! A tracing layer that panics must not stop an engine thread nor change a task's outcome: the
//! endpoint thread that meets the panic entering or leaving a task's span still runs the task
//! and reports what the endpoint said, so its run ends as it would have, and shutdown returns.
//! A panic around the threads' own spans (the scheduler's, an endpoint thread's) is no engine
//! bug either: the engine is not poisoned by it.
//! The layer is process-wide (the engine's threads log through it), so this binary holds this
//! one test.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Task spans entered and left (counted before the layer panics).
static ENTERED: AtomicUsize = AtomicUsize::new(0);
static LEFT: AtomicUsize = AtomicUsize::new(0);

/// Panics whenever a span named `task` (an endpoint thread running a task) is entered or left,
/// and whenever an engine thread's own span (`scheduler`, `worker`) is.
struct PanicsAroundTasks;

/// Panics when `name` is a task span (counted in `tasks`) or an engine thread's span; `act`
/// is "enter" or "leave".
fn refuse(name: &str, tasks: &AtomicUsize, act: &str) {
    if name == "task" {
        tasks.fetch_add(1, Ordering::Relaxed);
    }
    if matches!(name, "task" | "scheduler" | "worker") {
        panic!("this layer refuses to {act} {name} spans");
    }
}

impl<S> tracing_subscriber::Layer<S> for PanicsAroundTasks
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_enter(&self, id: &tracing::span::Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            refuse(span.name(), &ENTERED, "enter");
        }
    }

    fn on_exit(&self, id: &tracing::span::Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            refuse(span.name(), &LEFT, "leave");
        }
    }
}

#[test]
fn a_tracing_layer_panicking_around_a_task_changes_neither_its_outcome_nor_its_thread() {
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(PanicsAroundTasks))
        .expect("the only subscriber of this binary");
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    for round in 0..3 {
        let mut b = e.begin_run().unwrap_or_else(|err| panic!("round {round}: {err}"));
        b.submit_next_level(&chip(1), args(&[]), &cfg(), w(0), None).unwrap();
        let run = b.close();
        let Some(outcome) = e.wait_timeout(run, Duration::from_secs(20)).expect("known run") else {
            // The endpoint thread died with the task: dropping the engine would wait for it.
            std::mem::forget(e);
            panic!("{run} never ended: the endpoint thread stopped with its task");
        };
        assert!(outcome.failure().is_none(), "round {round}: {outcome:?}");
    }
    // Every task span the subscriber entered was left again, so the subscriber's stack of
    // entered spans on the endpoint thread did not grow by one per task.
    let (entered, left) = (ENTERED.load(Ordering::Relaxed), LEFT.load(Ordering::Relaxed));
    assert!(entered == 3 && left == 3, "task spans entered {entered} times, left {left}");
    // The endpoint thread is alive: shutdown stops it instead of waiting for it forever.
    e.shutdown(Instant::now() + Duration::from_secs(5)).expect("shutdown");
}
