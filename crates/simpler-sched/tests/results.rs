//! What a user gets back from the engine composes: a wait that could only wait on its own
//! builder is refused, outcomes work with `?`, summaries and shutdown errors print readably.

mod common;

use std::time::Instant;

use common::*;
use simpler_sched::{RunOutcome, SchedError, ShutdownError};
use simpler_types::DataType;
use simpler_types::TensorArgType::*;

#[test]
fn wait_on_a_run_that_is_still_building_is_refused_not_blocked() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    noop_on(&mut b, 0).unwrap();
    let run = b.id();
    let err = e.wait(run).unwrap_err();
    assert!(matches!(err, SchedError::NotClosed { run: r, op: "wait" } if r == run), "{err}");
    assert!(err.to_string().contains("RunBuilder::close"), "{err}");
    b.close();
    assert!(e.wait(run).unwrap().is_completed());
    // A failed builder ends the run too, so waiting on it is fine afterwards.
    let b = e.begin_run().unwrap();
    let run = b.fail("the caller gave up");
    assert!(!e.wait(run).unwrap().is_completed());
}

fn propagate(outcome: RunOutcome) -> Result<(), Box<dyn std::error::Error>> {
    outcome.into_result()?;
    Ok(())
}

#[test]
fn a_failed_outcome_propagates_with_the_question_mark_and_prints_its_failure() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    let t = noop_on(&mut b, 0).unwrap();
    h.script(t, Action::Fail("boom".into()));
    let run = b.close();
    let outcome = wait(&e, run);
    assert_eq!(outcome.to_string(), failure_of(&outcome).to_string());
    assert!(outcome.to_string().contains(&t.to_string()), "{outcome}");
    let err = propagate(outcome.clone()).unwrap_err();
    assert_eq!(err.to_string(), outcome.to_string());
    assert_eq!(RunOutcome::Completed.to_string(), "completed");
    assert!(propagate(RunOutcome::Completed).is_ok());
}

#[test]
fn a_run_summary_prints_one_line_and_only_the_heap_rings_it_used() {
    let h = Harness::new();
    let e = engine(&[0], 0, &h, false);
    let mut b = e.begin_run().unwrap();
    let t = b.alloc(&[256], DataType::UInt8).unwrap();
    b.submit_next_level(&chip(1), args(&[(t, Output)]), &cfg(), w(0), None).unwrap();
    let run = b.close();
    wait(&e, run);
    let text = e.release(run).unwrap().to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with(&format!("{run}: completed; 2 tasks")), "{text}");
    assert_eq!(lines.len(), 2, "one heap ring was used: {text}");
    assert!(lines[1].starts_with("  heap ring 0: peak "), "{text}");
}

#[test]
fn shutdown_errors_are_one_error_value_naming_each_problem() {
    fn as_error(e: ShutdownError) -> Box<dyn std::error::Error> {
        Box::new(e)
    }
    let h = Harness::new();
    let e = engine(&[0], 0, &h, true);
    let mut b = e.begin_run().unwrap();
    let t = noop_on(&mut b, 0).unwrap();
    noop_on(&mut b, 0).unwrap();
    let run = b.close();
    h.wait_running(t, 0);
    std::thread::scope(|s| {
        let stopper = s.spawn(|| e.shutdown(Instant::now()));
        eventually("the run is aborted", || e.status(run).is_ok_and(|s| s.failure.is_some()));
        h.release(t, Action::Succeed);
        let err = as_error(stopper.join().unwrap().unwrap_err());
        let text = err.to_string();
        assert!(text.starts_with("the engine stopped, but shutdown met 1 problem(s)"), "{text}");
        assert!(text.contains(&run.to_string()), "{text}");
        assert!(err.source().is_some());
    });
}
