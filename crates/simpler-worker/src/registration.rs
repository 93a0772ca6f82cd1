//! Registration on a worker: host closures, graphs and chip callables get handles; a chip
//! callable is prepared on every chip that serves it, or on none (a failed preparation rolls
//! back the chips that succeeded), and `unregister` releases a handle's content once no handle
//! and no run still needs it (`docs/worker-protocols.md` §4 for the deferred release).

use std::any::Any;
use std::sync::Arc;

use simpler_device_a2a3::{ChipCallable, DeviceError};
use simpler_types::{CallConfig, CallableId, CallableKind, TaskArgsView, WorkerId};

use crate::chip::LaneReply;
use crate::deferred_drop;
use crate::error::{BoxError, RegistrationFailure, WorkerError};
use crate::graph::GraphBuilder;
use crate::handle::{CallableHandle, Entry, GraphFn, HostFn, Registration, Registry};
use crate::process::ChildError;
use crate::worker::{Body, Worker};

impl Worker {
    /// Adds a handle. `id` is the content id of a chip callable; closures and graphs get a
    /// fresh id from the registration number, assigned under the same lock.
    fn register(&self, name: &str, id: Option<CallableId>, entry: Entry) -> CallableHandle {
        let mut reg = self.inner.registry.write();
        reg.next_seq += 1;
        let seq = reg.next_seq;
        let kind = match entry {
            Entry::Host(_) => CallableKind::Host,
            Entry::Graph(_) => CallableKind::Graph,
            Entry::Chip(_) => CallableKind::Chip,
        };
        let id = id.unwrap_or_else(|| Registry::closure_id(self.inner.instance, seq, kind));
        let r = Registration { name: Arc::from(name), entry };
        reg.runnable.entry(id).or_insert_with(|| r.clone());
        reg.handles.insert(seq, (id, r));
        CallableHandle { worker: self.inner.instance, seq, id }
    }

    /// Registers a host closure (L3+, needs sub workers); visible to every sub worker before
    /// the call returns.
    pub fn register_host(
        &self,
        name: &str,
        f: impl Fn(TaskArgsView<'_>) -> Result<(), BoxError> + Send + Sync + 'static,
    ) -> Result<CallableHandle, WorkerError> {
        if self.inner.level < 3 {
            return Err(WorkerError::WrongLevel { op: "register_host", level: self.inner.level });
        }
        let _lease = self.inner.lease()?;
        if self.inner.subs == 0 {
            return Err(WorkerError::NoEligibleTarget {
                callable: name.to_owned(),
                needs: "sub workers",
            });
        }
        let f: Arc<HostFn> = Arc::new(f);
        Ok(self.register(name, None, Entry::Host(f)))
    }

    /// Registers a graph a child runs (L4+, needs children). On a started worker with L3
    /// children on other MPI ranks (feature `mpi`) it reaches every rank in two phases, all or
    /// nothing: [`WorkerError::RemoteRegistration`] names the rank that refused. A rank the
    /// commit then cannot reach fails for good, its tasks with `RemoteError::CommitLost`
    /// (`docs/multi-host.md`, "Registration after start").
    pub fn register_graph(
        &self,
        name: &str,
        g: impl Fn(&mut GraphBuilder<'_>, TaskArgsView<'_>, &CallConfig) -> Result<(), BoxError>
        + Send
        + Sync
        + 'static,
    ) -> Result<CallableHandle, WorkerError> {
        if self.inner.level < 4 {
            return Err(WorkerError::WrongLevel { op: "register_graph", level: self.inner.level });
        }
        let _lease = self.inner.lease()?;
        if self.child_ids().is_empty() {
            return Err(WorkerError::NoEligibleTarget {
                callable: name.to_owned(),
                needs: "child workers",
            });
        }
        let g: Arc<GraphFn> = Arc::new(g);
        #[cfg(feature = "mpi")]
        return self
            .inner
            .remote_children
            .register_graph(name, || self.register(name, None, Entry::Graph(g)));
        #[cfg(not(feature = "mpi"))]
        Ok(self.register(name, None, Entry::Graph(g)))
    }

    /// Registers a chip callable on every chip (L2, L3).
    pub fn register_chip(&self, c: &ChipCallable) -> Result<CallableHandle, WorkerError> {
        let chips = self.inner.chips();
        self.register_chip_on(c, &chips)
    }

    /// Registers a chip callable on `chips`, all or nothing: a failure rolls back the chips
    /// that succeeded.
    pub fn register_chip_on(
        &self,
        c: &ChipCallable,
        chips: &[WorkerId],
    ) -> Result<CallableHandle, WorkerError> {
        if self.inner.level > 3 {
            return Err(WorkerError::WrongLevel { op: "register_chip", level: self.inner.level });
        }
        // Declared before the lease and the registration lock: the cleanup of finished runs
        // below may release closures, whose captures are dropped once both are let go.
        let _deferred = deferred_drop::scope();
        let _lease = self.inner.lease()?;
        let name = c.entry_name().to_owned();
        if chips.is_empty() {
            return Err(WorkerError::NoEligibleTarget { callable: name, needs: "chips" });
        }
        let known = self.inner.chips();
        if let Some(bad) = chips.iter().find(|c| !known.contains(c)) {
            return Err(WorkerError::NoSuchChild { id: *bad });
        }
        // Each chip holds one reference per registration; a chip named twice would take two
        // and give one back at unregistration.
        if let Some(i) = (1..chips.len()).find(|&i| chips[..i].contains(&chips[i])) {
            return Err(WorkerError::DuplicateChip { callable: name, chip: chips[i] });
        }
        // From a closure on one of this worker's lanes the call could wait for a lane that
        // waits for it: refused before anything changed, so nothing needs rolling back.
        self.inner.off_lane("register_chip")?;
        // Chip registrations are serialized among themselves (pending-removal check, lane
        // preparation, rollback), never with submits, so a callback may register.
        let _serial = self.inner.chip_registration.lock();
        let id = c.id();
        let pending_on = || {
            let pending = self.inner.chip_pending.lock();
            let (_, on) = pending.iter().find(|(i, _)| *i == id)?;
            on.iter().find(|p| chips.contains(p)).copied()
        };
        if pending_on().is_some() {
            // The runs that held the removal back may have finished with nobody waiting for
            // them: cleaning them up performs it.
            self.inner.retire_finished();
        }
        if let Some(chip) = pending_on() {
            return Err(WorkerError::RemovalPending { callable: name, chip });
        }
        let mut done: Vec<WorkerId> = Vec::new();
        for &chip in chips {
            let callable = c.clone();
            // `None`: the pair is unusable after an earlier failed removal.
            let r = self.inner.on_chip(chip, move |s| {
                (!s.is_unusable(&callable.id())).then(|| s.register(&callable))
            });
            let failure = match r {
                Ok(Some(Ok(()))) => {
                    done.push(chip);
                    continue;
                }
                Ok(Some(Err(e))) => e,
                // The pair is unusable, or the lane could not serve the call (its own typed
                // error): nothing to add about the device.
                Ok(None) | Err(_) => {
                    let rollback_failed = self.roll_back_chips(&done, id, &name);
                    if !rollback_failed.is_empty() {
                        tracing::error!(callable = %name, "rolling back chip(s) {rollback_failed:?} failed; the pairs are unusable");
                    }
                    return Err(match r {
                        Err(e) => e,
                        _ => WorkerError::CallableUnusable { callable: name, chip },
                    });
                }
            };
            let rollback_failed = self.roll_back_chips(&done, id, &name);
            // An unusable chip is reported as such whichever call met it.
            if matches!(
                failure,
                RegistrationFailure::Device(DeviceError::Unusable { .. })
                    | RegistrationFailure::Child(ChildError::Unusable { .. })
            ) {
                if !rollback_failed.is_empty() {
                    tracing::error!(callable = %name, "rolling back chip(s) {rollback_failed:?} failed; the pairs are unusable");
                }
                let (code, message) = (failure.device_code(), failure.to_string());
                let (child, device) = match failure {
                    RegistrationFailure::Child(e) => (Some(Box::new(e)), None),
                    RegistrationFailure::Device(e) => (None, Some(Arc::new(e))),
                };
                return Err(WorkerError::DeviceUnusable { chip, code, message, child, device });
            }
            return Err(WorkerError::Registration {
                callable: name,
                chip,
                source: Box::new(failure),
                rollback_failed,
            });
        }
        Ok(self.register(&name, Some(id), Entry::Chip(chips.to_vec())))
    }

    /// Drops the reference a failed registration took on each of `chips`; returns the chips
    /// where that failed (the chip state marks those pairs unusable).
    fn roll_back_chips(&self, chips: &[WorkerId], id: CallableId, name: &str) -> Vec<WorkerId> {
        let mut failed = Vec::new();
        for &chip in chips {
            match self.inner.on_chip(chip, move |s| s.release(&id)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(%chip, callable = %name, "rollback failed: {e}");
                    failed.push(chip);
                }
                Err(e) => {
                    tracing::warn!(%chip, callable = %name, "rollback failed: {e}");
                    failed.push(chip);
                }
            }
        }
        failed
    }

    /// Unregisters a handle. Runs already accepted keep the callable; later submits with the
    /// handle get `UnknownCallable`. At L2 the chip's release queues on its lane behind those
    /// runs, so it returns once the run in flight has finished; at L3, while runs are live, the
    /// release waits for the last of them.
    pub fn unregister(&self, handle: CallableHandle) -> Result<(), WorkerError> {
        if handle.worker != self.inner.instance {
            return Err(WorkerError::ForeignHandle { handle });
        }
        // Declared before the lease: a closure's captures, dropped here when this was its last
        // handle, may close the worker, which waits for every lease (`deferred_drop`).
        let _deferred = deferred_drop::scope();
        let _lease = self.inner.lease()?;
        let mut reg = self.inner.registry.write();
        // As in `register_chip`: refused from a lane of this worker before the handle is
        // removed, so the handle and its chips' references stay as they were.
        if let Some((_, Registration { entry: Entry::Chip(_), .. })) = reg.handles.get(&handle.seq)
        {
            self.inner.off_lane("unregister")?;
        }
        // Read under the registry write lock: a submit joins the accepted set before it looks
        // a callable up, so either this sees its run (and defers the removal) or the submit's
        // lookup comes after the removal (and gets `UnknownCallable`).
        let live = !self.inner.accepted.lock().is_empty();
        let Some((id, r)) = reg.handles.remove(&handle.seq) else {
            return Err(WorkerError::UnknownCallable { handle });
        };
        // The last handle's entry stays while runs are live: their tasks resolve closures and
        // graphs by it, and their errors name chip callables by it.
        let last = reg.handles_of(&id) == 0;
        let mut dropped = None;
        if last {
            if live {
                reg.pending_removal.push(id);
            } else {
                dropped = reg.runnable.remove(&id);
            }
        }
        let chips = match &r.entry {
            Entry::Chip(chips) => chips.clone(),
            _ => {
                drop(reg);
                let parked = [Some(r), dropped].into_iter().flatten();
                deferred_drop::drop_logged(
                    None,
                    parked.map(|v| Box::new(v) as Box<dyn Any + Send>).collect(),
                );
                return Ok(());
            }
        };
        if let Body::Chip(lane) = &self.inner.body {
            // Never deferred at L2: the lane runs the release after every run queued before it
            // (a submit queues its run under the registry lock, after its lookup) and retires
            // the run in flight first, so no run that uses the callable still executes. Queued
            // under the write lock, waited for without it.
            let reply = lane.queue_call(move |s| s.release(&id));
            drop(reg);
            return match reply.and_then(LaneReply::wait) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => {
                    tracing::warn!(chip = %lane.chip, callable = %r.name, "unregistration failed: {e}");
                    Err(WorkerError::Registration {
                        callable: r.name.to_string(),
                        chip: lane.chip,
                        source: Box::new(e),
                        rollback_failed: vec![lane.chip],
                    })
                }
                Err(e) => Err(e),
            };
        }
        if live {
            // Queued under the registry lock so that the flush of the retiring last run, which
            // takes that lock first, cannot miss it.
            self.inner.chip_pending.lock().push((id, chips));
            return Ok(());
        }
        drop(reg);
        // Every chip is tried; a failed removal leaves that pair unusable (the chip state
        // marks it), as a failed registration rollback does.
        // The first failure wins: the chip's (as a `Registration` error), or the lane's own
        // error when the lane could not serve the call.
        let mut first: Option<(WorkerId, Result<RegistrationFailure, WorkerError>)> = None;
        let mut failed = Vec::new();
        for chip in chips {
            let failure = match self.inner.on_chip(chip, move |s| s.release(&id)) {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => Ok(e),
                Err(e) => Err(e),
            };
            match &failure {
                Ok(e) => tracing::warn!(%chip, callable = %r.name, "unregistration failed: {e}"),
                Err(e) => tracing::warn!(%chip, callable = %r.name, "unregistration failed: {e}"),
            }
            failed.push(chip);
            first.get_or_insert((chip, failure));
        }
        match first {
            None => Ok(()),
            Some((chip, Ok(e))) => Err(WorkerError::Registration {
                callable: r.name.to_string(),
                chip,
                source: Box::new(e),
                rollback_failed: failed,
            }),
            Some((_, Err(e))) => Err(e),
        }
    }
}

#[cfg(all(test, feature = "sim", not(simpler_loom)))]
mod tests {
    use std::sync::{Arc, Mutex, mpsc};
    use std::time::Duration;

    use simpler_device_a2a3::{Platform, RuntimeVariant};
    use simpler_types::TaskArgs;

    use crate::graph::Orchestration;
    use crate::worker::{Worker, retire_hook};

    #[test]
    fn a_removal_deferred_for_a_run_accepted_while_the_last_run_retired_waits_for_that_run() {
        let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(1);
        let (release, gate) = mpsc::channel::<()>();
        let gate = Mutex::new(gate);
        let hold = b.register_host("hold", move |_| {
            let _ = gate.lock().unwrap().recv_timeout(Duration::from_secs(20));
            Ok(())
        });
        let noop = b.register_host("noop", |_| Ok(()));
        let w = Arc::new(b.start().expect("start"));
        let first = w.submit(Orchestration::graph(|_, _, _| Ok(()))).expect("submit");
        // Between the last run's retirement seeing no run left and its flush of deferred
        // removals: a run is accepted that uses `noop` (behind `hold`, on the one sub worker),
        // and `noop` is unregistered while that run is live, so its removal is deferred.
        let second = Arc::new(Mutex::new(None));
        let (w2, s2) = (Arc::clone(&w), Arc::clone(&second));
        retire_hook::set(Box::new(move || {
            let orch = Orchestration::graph(move |g, _, _| {
                g.submit_sub(hold, TaskArgs::new())?;
                g.submit_sub(noop, TaskArgs::new())?;
                Ok(())
            });
            *s2.lock().unwrap() = Some(w2.submit(orch).expect("submit"));
            w2.unregister(noop).expect("unregister");
        }));
        first.wait().expect("the first run");
        let second = second.lock().unwrap().take().expect("the retirement ran the hook");
        release.send(()).unwrap();
        second.wait().expect("a run keeps the callables it was accepted with");
        Arc::into_inner(w).expect("the only handle").close().expect("close");
    }
}
