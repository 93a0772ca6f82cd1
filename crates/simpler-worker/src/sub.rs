//! Sub workers: engine SUB endpoints that run registered host closures
//! (`docs/worker-protocols.md` §8).
//!
//! The closure gets the member's arguments as a borrowed view valid for the call only. `Ok` is
//! success, `Err` a task failure carrying the error and its source chain, and a panic is
//! caught and becomes a task failure `panicked: <payload>`; the sub worker keeps serving.
//!
//! Formatting the returned error (its `Display` and `source` chain) and dropping a panic's
//! payload run the task's code too, so they are caught as well: a panic there is the task's
//! failure by panic, saying where it happened, not a failure of the sub worker. The source
//! chain is followed for at most 32 errors, so a chain that loops ends. A returned error that
//! formats cleanly travels in the failure, so its own drop runs later, wherever the run's
//! error is dropped.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

use simpler_sched::{DispatchedMember, Endpoint, EndpointCaps, EndpointFailure};
use simpler_types::{FailureSource, WorkerId, WorkerType};

use crate::error::BoxError;
use crate::handle::{Entry, SharedRegistry};
use crate::reentry;
use crate::run::panic_text;

/// One sub worker of a level.
pub(crate) struct SubEndpoint {
    pub(crate) index: u32,
    pub(crate) level: u8,
    /// The level's worker and its ancestors: a host closure acts for all of them.
    pub(crate) lineage: reentry::Lineage,
    pub(crate) registry: SharedRegistry,
}

impl Endpoint for SubEndpoint {
    fn caps(&self) -> EndpointCaps {
        EndpointCaps {
            worker_type: WorkerType::Sub,
            id: WorkerId(self.index),
            remote: false,
            name: format!("simpler-sub-{}-{}", self.level, self.index),
        }
    }

    fn run(&mut self, task: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
        let found = self.registry.read().runnable.get(task.callable).cloned();
        let Some(reg) = found else {
            return Err(EndpointFailure::endpoint_failed(format!(
                "callable {} is not registered on this worker",
                task.callable
            )));
        };
        let Entry::Host(f) = reg.entry else {
            return Err(EndpointFailure::endpoint_failed(format!(
                "'{}' is not a host closure",
                reg.name
            )));
        };
        let _acting = reentry::enter_lineage(&self.lineage);
        match catch_unwind(AssertUnwindSafe(|| f(task.args))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(returned(e)),
            Err(p) => Err(panicked(p)),
        }
    }
}

/// The failure of a task that returned `e`: its text and source chain for the frame, `e` itself
/// for `Frame::error`. The error's `Display` and `source` are the task's code: a panic in them
/// is the task's failure by panic, and `e` is dropped.
fn returned(e: BoxError) -> EndpointFailure {
    match catch_unwind(AssertUnwindSafe(|| error_text(&*e))) {
        Ok(text) => EndpointFailure::task_failed(text).with_source(FailureSource::from_boxed(e)),
        Err(p) => {
            let text = format!("while formatting the task's error: {}", panic_text(p.as_ref()));
            dispose(p);
            dispose(e);
            EndpointFailure::panicked(text)
        }
    }
}

/// `e`'s text followed by that of each error in its source chain, joined by `": "`. A source
/// the text so far already ends with as its own part (an error that writes `"…: {source}"`
/// and also returns it as its source) is not repeated.
fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    // A chain deeper than this is taken for a cycle (an error whose source leads back to
    // itself), which would otherwise never end.
    for _ in 0..SOURCE_DEPTH {
        let Some(s) = source else { return text };
        let next = s.to_string();
        let shown = text == next
            || text.strip_suffix(next.as_str()).is_some_and(|head| head.ends_with(": "));
        if !shown {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    if source.is_some() {
        text.push_str(": …");
    }
    text
}

/// Most sources of a task's error its text follows.
const SOURCE_DEPTH: usize = 32;

/// The failure of a task that panicked with `payload`. The payload is the task's value and
/// is dropped here, under `catch_unwind`: a panic in its drop joins the failure's text.
fn panicked(payload: Box<dyn Any + Send>) -> EndpointFailure {
    let text = panic_text(payload.as_ref());
    match catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        Ok(()) => EndpointFailure::panicked(text),
        Err(p) => {
            let again = panic_text(p.as_ref());
            dispose(p);
            EndpointFailure::panicked(format!(
                "{text}; then, while dropping its panic payload: {again}"
            ))
        }
    }
}

/// `e`'s text, formatted where user code in it (a callback's error inside `e`) cannot panic
/// out: a `Display` that panics or fails gives a text saying so instead.
pub(crate) fn text_of(e: &dyn std::fmt::Display) -> String {
    catch_unwind(AssertUnwindSafe(|| e.to_string())).unwrap_or_else(|p| {
        let text = format!("(its text could not be formatted: {})", panic_text(p.as_ref()));
        dispose(p);
        text
    })
}

/// Drops `value` where a panic in its drop cannot escape. The payload of such a panic is
/// leaked rather than dropped, as dropping it could panic again.
pub(crate) fn dispose<T>(value: T) {
    if let Err(p) = catch_unwind(AssertUnwindSafe(move || drop(value))) {
        std::mem::forget(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error whose source is itself.
    #[derive(Debug)]
    struct Cycle;

    impl std::fmt::Display for Cycle {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("cycle")
        }
    }

    impl std::error::Error for Cycle {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(self)
        }
    }

    #[test]
    fn the_text_of_an_error_whose_source_chain_is_a_cycle_ends() {
        assert_eq!(error_text(&Cycle), "cycle: …");
    }

    /// An error that writes its source's text after its own and returns that source too.
    #[derive(Debug)]
    struct Wraps(std::io::Error);

    impl std::fmt::Display for Wraps {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot read the input: {}", self.0)
        }
    }

    impl std::error::Error for Wraps {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_source_whose_text_the_error_already_ends_with_is_not_repeated() {
        let text = error_text(&Wraps(std::io::Error::other("disk gone")));
        assert_eq!(text, "cannot read the input: disk gone");
        let refused = crate::MemError::Tensor(simpler_types::TypesError::NotContiguous);
        let text = error_text(&refused);
        assert_eq!(text.matches(&simpler_types::TypesError::NotContiguous.to_string()).count(), 1);
        // A source whose text only happens to end the error's own is still shown.
        let status = std::io::Error::other("the tool exited with status 12");
        let text = error_text(&Plain(status, std::io::Error::other("2")));
        assert_eq!(text, "the tool exited with status 12: 2");
    }

    /// An error that shows only its own text and returns `.1` as its source.
    #[derive(Debug)]
    struct Plain(std::io::Error, std::io::Error);

    impl std::fmt::Display for Plain {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            self.0.fmt(f)
        }
    }

    impl std::error::Error for Plain {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.1)
        }
    }
}
