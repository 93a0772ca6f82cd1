//! Callable handles and the per-worker registry of host closures, graphs and names.
//!
//! A handle names one registration: worker instance, kind, registration number and the
//! callable's content id. Closures and graphs get an id derived from the worker instance and a
//! counter, chip callables their content digest, so two registrations of identical chip
//! content share one prepared slot per chip but stay two handles.
//!
//! Unregistering removes a handle from the submittable table at once (later submits get
//! `UnknownCallable`); the runnable entry stays until no run accepted before the unregister is
//! still live, so a queued task never loses its callable (the run pins it). An L2 worker's chip
//! release is instead queued on its lane behind the runs already queued there.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::RwLock;
use simpler_types::{
    CALLABLE_DIGEST_LEN, CallConfig, CallableId, CallableKind, CallableNamespace, TaskArgsView,
    WorkerId,
};

use crate::error::BoxError;
use crate::graph::GraphBuilder;

/// Opaque name of one registration on one worker. `Copy + Eq + Hash`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CallableHandle {
    pub(crate) worker: u64,
    pub(crate) seq: u64,
    pub(crate) id: CallableId,
}

impl CallableHandle {
    /// What the callable is.
    pub fn kind(&self) -> CallableKind {
        self.id.kind
    }

    /// The callable's content id (chip callables) or per-worker id (closures, graphs).
    pub fn callable_id(&self) -> CallableId {
        self.id
    }
}

impl fmt::Display for CallableHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} handle #{} of worker #{}", self.id.kind, self.seq, self.worker)
    }
}

/// A host closure run by a sub worker.
pub type HostFn = dyn Fn(TaskArgsView<'_>) -> Result<(), BoxError> + Send + Sync + 'static;

/// A graph run by a child worker (L4+): it gets the child's graph builder.
pub type GraphFn = dyn Fn(&mut GraphBuilder<'_>, TaskArgsView<'_>, &CallConfig) -> Result<(), BoxError>
    + Send
    + Sync
    + 'static;

/// What a registration runs.
#[derive(Clone)]
pub(crate) enum Entry {
    Host(Arc<HostFn>),
    Graph(Arc<GraphFn>),
    /// A chip callable prepared on these chips.
    Chip(Vec<WorkerId>),
}

/// One registration.
#[derive(Clone)]
pub(crate) struct Registration {
    pub(crate) name: Arc<str>,
    pub(crate) entry: Entry,
}

/// Handles, runnable closures and names of one worker.
#[derive(Default)]
pub(crate) struct Registry {
    pub(crate) handles: HashMap<u64, (CallableId, Registration)>,
    /// Closures and graphs by id, as the sub and child endpoints resolve them.
    pub(crate) runnable: HashMap<CallableId, Registration>,
    /// Ids whose last handle was unregistered while runs were live.
    pub(crate) pending_removal: Vec<CallableId>,
    pub(crate) next_seq: u64,
}

impl Registry {
    /// A fresh id for a closure or graph of worker `instance`.
    pub(crate) fn closure_id(instance: u64, seq: u64, kind: CallableKind) -> CallableId {
        let mut digest = [0u8; CALLABLE_DIGEST_LEN];
        digest[..8].copy_from_slice(&instance.to_le_bytes());
        digest[8..16].copy_from_slice(&seq.to_le_bytes());
        digest[16] = kind as u8;
        CallableId::new(digest, kind, CallableNamespace::LocalHost)
    }

    /// Whether another live handle names `id`.
    pub(crate) fn handles_of(&self, id: &CallableId) -> usize {
        self.handles.values().filter(|(i, _)| i == id).count()
    }

    /// Drops runnable entries whose removal was deferred; returns them so that their captures
    /// are dropped outside every lock.
    pub(crate) fn flush_removals(&mut self) -> Vec<Registration> {
        let mut dropped = Vec::new();
        for id in std::mem::take(&mut self.pending_removal) {
            if self.handles_of(&id) == 0
                && let Some(r) = self.runnable.remove(&id)
            {
                dropped.push(r);
            }
        }
        dropped
    }
}

/// Read access shared with the endpoints.
pub(crate) type SharedRegistry = Arc<RwLock<Registry>>;

/// The name of `id` in `reg`, if registered.
pub(crate) fn name_in(reg: &Registry, id: &CallableId) -> Option<String> {
    reg.runnable
        .get(id)
        .map(|r| r.name.to_string())
        .or_else(|| reg.handles.values().find(|(i, _)| i == id).map(|(_, r)| r.name.to_string()))
}
