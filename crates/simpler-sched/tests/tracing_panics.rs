//! A tracing layer that panics must not stop an engine thread: the endpoint thread that meets
//! the panic around a task still reports the task (as an endpoint failure), so its run ends and
//! shutdown returns. The layer is process-wide (the engine's threads log through it), so this
//! binary holds this one test.

mod common;

use std::time::{Duration, Instant};

use common::*;
use simpler_types::FailureMechanism;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Panics whenever a span named `task` (an endpoint thread running a task) is entered.
struct PanicsEnteringTasks;

impl<S> tracing_subscriber::Layer<S> for PanicsEnteringTasks
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_enter(&self, id: &tracing::span::Id, ctx: Context<'_, S>) {
        if ctx.span(id).is_some_and(|s| s.name() == "task") {
            panic!("this layer refuses task spans");
        }
    }
}

#[test]
fn a_tracing_layer_panicking_around_a_task_fails_the_task_instead_of_hanging_the_run() {
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(PanicsEnteringTasks),
    )
    .expect("the only subscriber of this binary");
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    let task = b.submit_next_level(&chip(1), args(&[]), &cfg(), w(0), None).unwrap();
    let run = b.close();
    let Some(outcome) = e.wait_timeout(run, Duration::from_secs(20)).expect("known run") else {
        // The endpoint thread died with the task: dropping the engine would wait for it.
        std::mem::forget(e);
        panic!("{run} never ended: the endpoint thread stopped with its task");
    };
    let failure = outcome.failure().and_then(|f| f.task_failure()).expect("the task failed");
    assert_eq!(failure.task, task);
    assert_eq!(failure.mechanism, FailureMechanism::EndpointFailed, "{failure:?}");
    assert!(failure.message.contains("refuses task spans"), "{failure:?}");
    // The endpoint thread is alive: shutdown stops it instead of waiting for it forever.
    e.shutdown(Instant::now() + Duration::from_secs(5)).expect("shutdown");
}
