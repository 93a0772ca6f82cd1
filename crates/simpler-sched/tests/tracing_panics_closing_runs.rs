//! A tracing layer that panics when a run's span closes must not poison the engine or reach
//! the caller: the run's last reference often goes on an engine thread, inside the pass whose
//! reclamation fired the fence. The layer is process-wide, so this binary holds this one test.

mod common;

use common::*;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Panics whenever a span named `run` closes.
struct PanicsClosingRuns;

impl<S> tracing_subscriber::Layer<S> for PanicsClosingRuns
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_close(&self, id: tracing::span::Id, ctx: Context<'_, S>) {
        if ctx.span(&id).is_some_and(|s| s.name() == "run") {
            panic!("this layer refuses to close run spans");
        }
    }
}

#[test]
fn a_tracing_layer_panicking_as_a_run_span_closes_neither_poisons_the_engine_nor_panics_the_caller()
{
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(PanicsClosingRuns))
        .expect("the only subscriber of this binary");
    let h = Harness::new();
    let e = engine(&[0, 1], 0, &h, false);
    // Many short runs, so that some runs' last reference goes on an engine thread and others
    // on this one (the caller's release).
    for round in 0..200 {
        let mut b = e.begin_run().unwrap_or_else(|err| panic!("round {round}: {err}"));
        for i in 0..4 {
            noop_on(&mut b, i % 2).expect("submit");
        }
        let run = b.close();
        let outcome = wait(&e, run);
        assert!(outcome.failure().is_none(), "round {round}: {outcome:?}");
        e.release(run).expect("release");
    }
}
