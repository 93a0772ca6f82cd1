//! The run registry: admission, the building mark, stop and poison flags
//! (`docs/engine-protocols.md` §2).
//!
//! # Admission protocol (`begin_run`)
//!
//! 1. Under the registry lock: poisoned → `EnginePoisoned`; stopping → `ShuttingDown`; a run is
//!    building → `AnotherRunBuilding` (at once; this is also what turns a nested submit from
//!    inside an orchestration into an error instead of a self-deadlock).
//! 2. **Serial admission**: if an earlier run is not terminal, release the lock, wait on that
//!    run's own fence (its condition variable; `AdmissionTimeout` at the deadline) and start
//!    again at step 1. Waiting on the run's fence rather than on a registry condition variable
//!    means the fencing thread needs no second lock to wake admission waiters, and a wake-up
//!    cannot be lost: the waiter checks the phase under the run's lock.
//! 3. Still under the lock from step 1: take the next id, register a `Building` record, set the
//!    building mark and hand the orchestrator state to the builder.
//!
//! The building mark and the orchestrator state travel together: `end_building` returns the
//! state and clears the mark in one critical section, so the next admitted run always finds it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Instant;

use simpler_types::RunId;

use crate::builder::OrchState;
use crate::error::SchedError;
use crate::run_record::RunRecord;
use crate::sync::Mutex;

struct RegistryState {
    /// Registered runs in id order (ids only grow, so pushing keeps the order).
    runs: Vec<Arc<RunRecord>>,
    /// The run whose builder is live.
    building: Option<RunId>,
    /// Orchestrator state, present while no builder is live.
    orch: Option<Box<OrchState>>,
    /// Shutdown has begun.
    stopping: bool,
    /// An engine thread hit an internal error.
    poisoned: bool,
    /// The next id to issue; `None` once `u64::MAX` was issued.
    next: Option<RunId>,
}

/// Every registered run, plus admission state.
pub(crate) struct Registry {
    state: Mutex<RegistryState>,
}

/// What admission hands to a new builder.
pub(crate) struct Admitted {
    /// The new run.
    pub(crate) run: Arc<RunRecord>,
    /// The orchestrator state, owned by the builder until it closes or fails.
    pub(crate) orch: Box<OrchState>,
    /// The most recent earlier run, whose ring peaks must be captured before they are reset.
    pub(crate) previous: Option<Arc<RunRecord>>,
}

impl Registry {
    /// An empty registry holding the orchestrator state.
    pub(crate) fn new(orch: Box<OrchState>) -> Registry {
        Registry {
            state: Mutex::new(RegistryState {
                runs: Vec::new(),
                building: None,
                orch: Some(orch),
                stopping: false,
                poisoned: false,
                next: Some(RunId::FIRST),
            }),
        }
    }

    /// The admission protocol. `make_span` creates the run's tracing span.
    pub(crate) fn admit(
        &self,
        deadline: Option<Instant>,
        make_span: impl Fn(RunId) -> tracing::Span,
    ) -> Result<Admitted, SchedError> {
        loop {
            let mut s = self.state.lock();
            if s.poisoned {
                return Err(SchedError::EnginePoisoned);
            }
            if s.stopping {
                return Err(SchedError::ShuttingDown);
            }
            if let Some(building) = s.building {
                return Err(SchedError::AnotherRunBuilding { building });
            }
            if let Some(earlier) = s.runs.iter().find(|r| !r.is_terminal()) {
                let earlier = Arc::clone(earlier);
                drop(s);
                if earlier.wait_until(deadline).is_none() {
                    return Err(SchedError::AdmissionTimeout { waiting_for: earlier.id });
                }
                continue;
            }
            let Some(id) = s.next else {
                return Err(SchedError::RunIdsExhausted);
            };
            if s.orch.is_none() {
                // Only a leaked builder (`mem::forget`) can keep the state away while no run
                // is marked building; the mark would then still be set, so this is unreachable.
                return Err(SchedError::AnotherRunBuilding { building: id });
            }
            // Before anything changes: a logging layer that panics as the span opens must not
            // leave the orchestrator state taken and no run building. The run then has none.
            let span = catch_unwind(AssertUnwindSafe(|| make_span(id)))
                .unwrap_or_else(|_| tracing::Span::none());
            let Some(orch) = s.orch.take() else {
                return Err(SchedError::AnotherRunBuilding { building: id });
            };
            s.next = id.next();
            let run = Arc::new(RunRecord::new(id, span));
            let previous = s.runs.last().cloned();
            s.runs.push(Arc::clone(&run));
            s.building = Some(id);
            return Ok(Admitted { run, orch, previous });
        }
    }

    /// Returns the orchestrator state and clears the building mark of `run`.
    pub(crate) fn end_building(&self, run: RunId, orch: Box<OrchState>) {
        let mut s = self.state.lock();
        debug_assert_eq!(s.building, Some(run), "ending a build that is not marked");
        s.building = None;
        s.orch = Some(orch);
    }

    /// The registered run `id`.
    pub(crate) fn find(&self, id: RunId) -> Result<Arc<RunRecord>, SchedError> {
        let s = self.state.lock();
        s.runs
            .binary_search_by_key(&id, |r| r.id)
            .map(|i| Arc::clone(&s.runs[i]))
            .map_err(|_| SchedError::UnknownRun { run: id })
    }

    /// Removes a terminal run. Returns the record and whether the registry is now empty.
    pub(crate) fn remove_terminal(&self, id: RunId) -> Result<(Arc<RunRecord>, bool), SchedError> {
        let mut s = self.state.lock();
        let i = s
            .runs
            .binary_search_by_key(&id, |r| r.id)
            .map_err(|_| SchedError::UnknownRun { run: id })?;
        let phase = s.runs[i].phase();
        if !phase.is_terminal() {
            return Err(SchedError::NotTerminal { run: id, phase });
        }
        let run = s.runs.remove(i);
        Ok((run, s.runs.is_empty()))
    }

    /// Runs `f` under the registry lock if no run is registered, so that no run can be
    /// admitted (and start using the ring) while `f` runs. `f` must not take the registry lock.
    pub(crate) fn while_empty(&self, f: impl FnOnce()) {
        let s = self.state.lock();
        if s.runs.is_empty() {
            f();
        }
    }

    /// Every registered run, in id order.
    pub(crate) fn runs(&self) -> Vec<Arc<RunRecord>> {
        self.state.lock().runs.clone()
    }

    /// Shutdown step 1: refuse new runs from now on.
    pub(crate) fn set_stopping(&self) {
        self.state.lock().stopping = true;
    }

    /// Marks the engine poisoned and returns every registered run.
    pub(crate) fn poison(&self) -> Vec<Arc<RunRecord>> {
        let mut s = self.state.lock();
        s.poisoned = true;
        s.runs.clone()
    }

    /// Whether the engine is poisoned.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.state.lock().poisoned
    }
}
