//! What a user submits ([`Orchestration`]) and the builder a graph callback gets
//! ([`GraphBuilder`]), which wraps the engine's `RunBuilder` and resolves callable handles
//! (`docs/worker-protocols.md` §3, §5).

use std::any::Any;

use simpler_sched::{RunBuilder, SchedError};
use simpler_types::{
    CallConfig, DataType, RunId, TaskArgs, TaskArgsView, TaskId, Tensor, WorkerId,
};

use crate::error::{BoxError, MemError, WorkerError};
use crate::handle::{CallableHandle, Entry, Registration};
use crate::worker::{ChipPlacement, Inner};

/// A graph callback of an L3+ orchestration.
pub type GraphCallback = dyn FnMut(&mut GraphBuilder<'_>, TaskArgsView<'_>, &CallConfig) -> Result<(), BoxError>
    + Send
    + 'static;

pub(crate) enum OrchBody {
    /// L2: one chip callable.
    Chip(CallableHandle),
    /// L3+: a graph callback.
    Graph(Box<GraphCallback>),
}

/// One run's orchestration, its arguments, configuration and keep-alive values.
///
/// Everything it holds lives until the run's result is published, then is dropped on the
/// publishing thread outside every lock.
pub struct Orchestration {
    pub(crate) body: OrchBody,
    pub(crate) args: TaskArgs,
    pub(crate) config: CallConfig,
    pub(crate) keep: Vec<Box<dyn Any + Send>>,
}

impl std::fmt::Debug for Orchestration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.body {
            OrchBody::Chip(_) => "chip",
            OrchBody::Graph(_) => "graph",
        };
        f.debug_struct("Orchestration")
            .field("kind", &kind)
            .field("args", &self.args)
            .finish_non_exhaustive()
    }
}

impl Orchestration {
    /// An L2 run: the chip callable `handle` with `args`.
    pub fn chip(handle: CallableHandle, args: TaskArgs) -> Orchestration {
        Orchestration {
            body: OrchBody::Chip(handle),
            args,
            config: CallConfig::default(),
            keep: Vec::new(),
        }
    }

    /// An L3+ run: `f` builds the graph on the calling thread.
    ///
    /// `f` (like every [`keep_alive`](Self::keep_alive) value) lives until the run's result is
    /// published. A worker shared in an `Arc` must not be captured here as an `Arc` by a run
    /// nobody waits for: the worker holds the run until it is published, the run holds the
    /// worker, and the cycle keeps the worker and its threads alive for good. Capture a
    /// `Weak<Worker>` and upgrade it inside instead.
    pub fn graph(
        f: impl FnMut(&mut GraphBuilder<'_>, TaskArgsView<'_>, &CallConfig) -> Result<(), BoxError>
        + Send
        + 'static,
    ) -> Orchestration {
        Orchestration {
            body: OrchBody::Graph(Box::new(f)),
            args: TaskArgs::new(),
            config: CallConfig::default(),
            keep: Vec::new(),
        }
    }

    /// Sets the run's arguments (the graph callback sees them as a view).
    #[must_use]
    pub fn args(mut self, args: TaskArgs) -> Orchestration {
        self.args = args;
        self
    }

    /// Sets the run's configuration.
    #[must_use]
    pub fn config(mut self, config: CallConfig) -> Orchestration {
        self.config = config;
        self
    }

    /// Keeps `value` alive until the run's result is published (by a waiter, the next
    /// submit or `close`), then drops it on the publishing thread outside every lock of the
    /// worker. An `Arc` of this same worker kept here by a run nobody waits for is a cycle
    /// that never closes the worker (see [`graph`](Self::graph)); keep a `Weak` instead.
    #[must_use]
    pub fn keep_alive(mut self, value: impl Send + 'static) -> Orchestration {
        self.keep.push(Box::new(value));
        self
    }
}

/// Where a callable is being submitted, for the kind check.
#[derive(Clone, Copy)]
enum Target {
    NextLevel,
    Sub,
}

/// The builder of the one building run of a worker, handed to its graph callback.
pub struct GraphBuilder<'a> {
    pub(crate) rb: Option<RunBuilder<'a>>,
    pub(crate) inner: &'a Inner,
    /// Registrations used by this run: they stay alive until the run is published.
    pub(crate) pins: Vec<Registration>,
    pub(crate) keep: Vec<Box<dyn Any + Send>>,
    /// Addresses of the host buffers already in `keep` (a live buffer's address is unique).
    pub(crate) kept_hosts: std::collections::HashSet<u64>,
}

impl std::fmt::Debug for GraphBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphBuilder").field("run", &self.run_id()).finish_non_exhaustive()
    }
}

impl<'a> GraphBuilder<'a> {
    fn rb(&mut self) -> Result<&mut RunBuilder<'a>, WorkerError> {
        self.rb.as_mut().ok_or(WorkerError::Closed)
    }

    /// The run being built.
    pub fn run_id(&self) -> Option<RunId> {
        self.rb.as_ref().map(RunBuilder::id)
    }

    fn resolve(&mut self, handle: CallableHandle, target: Target) -> Result<(), WorkerError> {
        if handle.worker != self.inner.instance {
            return Err(WorkerError::ForeignHandle { handle });
        }
        let reg = self.inner.registry.read();
        let Some((_, r)) = reg.handles.get(&handle.seq) else {
            return Err(WorkerError::UnknownCallable { handle });
        };
        let fits = match (&r.entry, target) {
            (Entry::Host(_), Target::Sub) => true,
            (Entry::Chip(_), Target::NextLevel) => self.inner.level == 3,
            (Entry::Graph(_), Target::NextLevel) => self.inner.level >= 4,
            _ => false,
        };
        if !fits {
            let target = match target {
                Target::Sub => "a sub worker",
                Target::NextLevel if self.inner.level >= 4 => "a child worker",
                Target::NextLevel => "a chip",
            };
            return Err(WorkerError::WrongCallableKind { kind: handle.kind(), target });
        }
        let pin = r.clone();
        drop(reg);
        if !self.pins.iter().any(|p| std::sync::Arc::ptr_eq(&p.name, &pin.name)) {
            self.pins.push(pin);
        }
        Ok(())
    }

    /// Refuses a chip task whose configuration exceeds a launch limit of the chips' platform
    /// (L3), instead of letting it fail on its chip after earlier tasks ran.
    fn check_limits(
        &mut self,
        handle: CallableHandle,
        config: &CallConfig,
        chip: WorkerId,
    ) -> Result<(), WorkerError> {
        let Some(limits) = self.inner.chip_limits else { return Ok(()) };
        let Err(e) = limits.check(config) else { return Ok(()) };
        Err(WorkerError::ConfigOutOfRange {
            run: self.rb()?.id(),
            callable: self.inner.name_of(&handle.id).unwrap_or_else(|| handle.to_string()),
            chip,
            setting: e.setting,
            value: e.value,
            limit: e.limit,
        })
    }

    /// Refuses chip-memory tensors that another chip owns, or whose base address lies inside
    /// one of the target's buffers rather than at it (L3).
    fn check_owner(&self, args: &TaskArgs, target: WorkerId) -> Result<(), WorkerError> {
        if self.inner.level != 3 {
            return Ok(());
        }
        for (arg, t) in args.tensors().iter().enumerate().filter(|(_, t)| t.is_child_memory()) {
            match self.inner.chip_placement(target, t) {
                ChipPlacement::Fine => {}
                ChipPlacement::OtherChip(owner) => {
                    return Err(MemError::WrongChip { buffer_chip: owner, chip: target }.into());
                }
                ChipPlacement::InsideBuffer(buffer) => {
                    let (chip, addr) = (target, t.addr);
                    return Err(WorkerError::ChipTensorOffsetBase { arg, chip, addr, buffer });
                }
            }
        }
        Ok(())
    }

    /// L3: refuses host-memory tensors a chip lane cannot stage (anything but a
    /// [`HostBuffer`](crate::HostBuffer)) and keeps the buffers alive until the run is
    /// published, so the lane finds them when the task runs. L4+: keeps the host buffers a
    /// child task's tensors lie in alive as long, so that the child's own graph finds them, and
    /// not a later buffer at a reused address (it checks them itself when it submits).
    fn keep_host_buffers(&mut self, args: &TaskArgs) -> Result<(), WorkerError> {
        let bufs = if self.inner.level == 3 {
            crate::staging::host_buffers_of(args)?
        } else {
            crate::staging::sub_host_buffers_of(args)?
        };
        self.keep_buffers(bufs);
        Ok(())
    }

    /// L4+: refuses a task for a remote child whose tensors cannot cross hosts (anything but a
    /// [`HostBuffer`](crate::HostBuffer) tensor) and keeps the buffers alive until the run is
    /// published, so its endpoint finds them.
    #[cfg(feature = "mpi")]
    fn check_remote_task(&mut self, args: &TaskArgs, target: WorkerId) -> Result<(), WorkerError> {
        let bufs = self.inner.remote_children.check_task(args, target)?;
        self.keep_buffers(bufs);
        Ok(())
    }

    /// Keeps `bufs` alive until the run is published, each buffer once per run.
    fn keep_buffers(&mut self, bufs: Vec<crate::HostBuffer>) {
        for b in bufs {
            if self.kept_hosts.insert(b.addr()) {
                self.keep.push(Box::new(b));
            }
        }
    }

    /// Submits a task to chip or child `target` (L3: a chip callable; L4+: a graph).
    ///
    /// ```
    /// use simpler_device_a2a3::programs::{add, f32_from_le_bytes, f32_to_le_bytes};
    /// use simpler_device_a2a3::{Platform, RuntimeVariant};
    /// use simpler_types::{CallConfig, DataType, TaskArgs, WorkerId};
    /// use simpler_worker::{HostBuffer, Orchestration, Worker};
    ///
    /// let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).chips(&[0]);
    /// let add = b.register_chip(add::callable()?); // f = a + b
    /// let worker = b.start()?;
    /// let a = HostBuffer::from_bytes(&f32_to_le_bytes(&[1.0; 16]))?;
    /// let f = HostBuffer::new(64)?;
    /// let (ta, tf) = (a.tensor(&[16], DataType::Float32)?, f.tensor(&[16], DataType::Float32)?);
    /// worker.run(Orchestration::graph(move |g, _, _| {
    ///     let mut args = TaskArgs::new();
    ///     args.add_input(ta)?.add_input(ta)?.add_output(tf)?;
    ///     g.submit_next_level(add, args, &CallConfig::default(), WorkerId(0))?;
    ///     Ok(())
    /// }))?;
    /// assert_eq!(f32_from_le_bytes(&f.to_vec()), [2.0; 16]);
    /// worker.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit_next_level(
        &mut self,
        handle: CallableHandle,
        args: TaskArgs,
        config: &CallConfig,
        target: WorkerId,
    ) -> Result<TaskId, WorkerError> {
        self.resolve(handle, Target::NextLevel)?;
        self.check_limits(handle, config, target)?;
        self.check_owner(&args, target)?;
        self.keep_host_buffers(&args)?;
        #[cfg(feature = "mpi")]
        self.check_remote_task(&args, target)?;
        let id = handle.id;
        self.rb()?.submit_next_level(&id, args, config, target, None).map_err(engine_err)
    }

    /// Submits a group: member i runs on `targets[i]`, all members dispatched together.
    ///
    /// ```
    /// use simpler_device_a2a3::programs::{add, f32_from_le_bytes, f32_to_le_bytes};
    /// use simpler_device_a2a3::{Platform, RuntimeVariant};
    /// use simpler_types::{CallConfig, DataType, TaskArgs, WorkerId};
    /// use simpler_worker::{HostBuffer, Orchestration, Worker};
    ///
    /// let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).chips(&[0, 1]);
    /// let add = b.register_chip(add::callable()?);
    /// let worker = b.start()?;
    /// // Member i runs on chip i; each writes its own output.
    /// let a = HostBuffer::from_bytes(&f32_to_le_bytes(&[1.0; 16]))?;
    /// let outs = [HostBuffer::new(64)?, HostBuffer::new(64)?];
    /// let ta = a.tensor(&[16], DataType::Float32)?;
    /// let touts = [outs[0].tensor(&[16], DataType::Float32)?, outs[1].tensor(&[16], DataType::Float32)?];
    /// worker.run(Orchestration::graph(move |g, _, _| {
    ///     let mut members = Vec::new();
    ///     for out in touts {
    ///         let mut args = TaskArgs::new();
    ///         args.add_input(ta)?.add_input(ta)?.add_output(out)?;
    ///         members.push(args);
    ///     }
    ///     let chips = [WorkerId(0), WorkerId(1)];
    ///     g.submit_next_level_group(add, members, &CallConfig::default(), &chips)?;
    ///     Ok(())
    /// }))?;
    /// assert_eq!(f32_from_le_bytes(&outs[1].to_vec()), [2.0; 16]);
    /// worker.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit_next_level_group(
        &mut self,
        handle: CallableHandle,
        args: Vec<TaskArgs>,
        config: &CallConfig,
        targets: &[WorkerId],
    ) -> Result<TaskId, WorkerError> {
        self.resolve(handle, Target::NextLevel)?;
        if let Some(&first) = targets.first() {
            self.check_limits(handle, config, first)?;
        }
        for (a, t) in args.iter().zip(targets) {
            self.check_owner(a, *t)?;
            self.keep_host_buffers(a)?;
            #[cfg(feature = "mpi")]
            self.check_remote_task(a, *t)?;
        }
        crate::staging::check_group_host_writes(&args)?;
        let id = handle.id;
        self.rb()?.submit_next_level_group(&id, args, config, targets, None).map_err(engine_err)
    }

    /// Submits a host-closure task to any idle sub worker.
    ///
    /// ```
    /// use simpler_device_a2a3::{Platform, RuntimeVariant};
    /// use simpler_types::{DataType, TaskArgs};
    /// use simpler_worker::{HostBuffer, Orchestration, Worker};
    ///
    /// let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(1);
    /// let fill = b.register_host("fill", |args| {
    ///     let out = args.tensor(0).and_then(HostBuffer::of_tensor).ok_or("no buffer")?;
    ///     out.write(0, &[7; 16])?;
    ///     Ok(())
    /// });
    /// let worker = b.start()?;
    /// let buf = HostBuffer::new(16)?;
    /// let t = buf.tensor(&[16], DataType::UInt8)?;
    /// worker.run(Orchestration::graph(move |g, _, _| {
    ///     let mut args = TaskArgs::new();
    ///     args.add_output(t)?;
    ///     g.submit_sub(fill, args)?;
    ///     Ok(())
    /// }))?;
    /// assert_eq!(buf.to_vec(), [7; 16]);
    /// worker.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit_sub(
        &mut self,
        handle: CallableHandle,
        args: TaskArgs,
    ) -> Result<TaskId, WorkerError> {
        self.resolve(handle, Target::Sub)?;
        check_host_only(&args)?;
        let bufs = crate::staging::sub_host_buffers_of(&args)?;
        self.keep_buffers(bufs);
        let id = handle.id;
        self.rb()?.submit_sub(&id, args).map_err(engine_err)
    }

    /// Submits a host-closure group: each member on a distinct idle sub worker.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    ///
    /// use simpler_device_a2a3::{Platform, RuntimeVariant};
    /// use simpler_types::TaskArgs;
    /// use simpler_worker::{Orchestration, Worker};
    ///
    /// let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(2);
    /// let ran = Arc::new(AtomicU32::new(0));
    /// let seen = Arc::clone(&ran);
    /// let count = b.register_host("count", move |_| {
    ///     seen.fetch_add(1, Ordering::Relaxed);
    ///     Ok(())
    /// });
    /// let worker = b.start()?;
    /// worker.run(Orchestration::graph(move |g, _, _| {
    ///     g.submit_sub_group(count, vec![TaskArgs::new(); 2])?; // both sub workers at once
    ///     Ok(())
    /// }))?;
    /// assert_eq!(ran.load(Ordering::Relaxed), 2);
    /// worker.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit_sub_group(
        &mut self,
        handle: CallableHandle,
        args: Vec<TaskArgs>,
    ) -> Result<TaskId, WorkerError> {
        self.resolve(handle, Target::Sub)?;
        args.iter().try_for_each(check_host_only)?;
        for a in &args {
            let bufs = crate::staging::sub_host_buffers_of(a)?;
            self.keep_buffers(bufs);
        }
        let id = handle.id;
        self.rb()?.submit_sub_group(&id, args).map_err(engine_err)
    }

    /// Allocates an intermediate host buffer from the heap ring of the current scope depth.
    pub fn alloc(&mut self, shape: &[u32], dtype: DataType) -> Result<Tensor, WorkerError> {
        self.rb()?.alloc(shape, dtype).map_err(engine_err)
    }

    /// Opens a user scope (closed by [`scope_end`](Self::scope_end), or by the worker when the
    /// callback returns).
    pub fn scope_begin(&mut self) -> Result<(), WorkerError> {
        self.rb()?.scope_begin().map_err(engine_err)
    }

    /// Closes the innermost user scope.
    pub fn scope_end(&mut self) -> Result<(), WorkerError> {
        self.rb()?.scope_end().map_err(engine_err)
    }

    /// Runs `body` inside a user scope.
    pub fn scope<R>(
        &mut self,
        body: impl FnOnce(&mut GraphBuilder<'a>) -> R,
    ) -> Result<R, WorkerError> {
        self.scope_begin()?;
        let r = body(self);
        self.scope_end()?;
        Ok(r)
    }

    /// Memory calls on chip `chip` of this (L3) worker, ordered with work already queued on
    /// the chip's lane.
    pub fn chip_memory(&self, chip: WorkerId) -> Result<crate::ChipMemory<'a>, WorkerError> {
        self.inner.chip_memory(chip)
    }

    /// Runs `f` with the fault plan of simulated chip `chip` of this (L3) worker, ordered with
    /// work already queued on the chip's lane; `Ok(false)` on a real chip. As
    /// [`Worker::with_sim_faults`](crate::Worker::with_sim_faults), for a worker that only an
    /// enclosing worker can reach.
    #[cfg(feature = "sim")]
    pub fn with_sim_faults(
        &self,
        chip: WorkerId,
        f: impl FnOnce(&simpler_device_a2a3::FaultPlan) + Send + 'static,
    ) -> Result<bool, WorkerError> {
        self.inner.with_sim_faults(chip, f)
    }

    /// Keeps `value` alive until the run's result is published.
    pub fn keep_alive(&mut self, value: impl Send + 'static) {
        self.keep.push(Box::new(value));
    }
}

/// Refuses chip memory on a sub task, with the hint of this level (the engine refuses it too,
/// but can only say what is wrong).
fn check_host_only(args: &TaskArgs) -> Result<(), WorkerError> {
    match args.tensors().iter().position(Tensor::is_child_memory) {
        Some(arg) => Err(WorkerError::ChipMemoryOnSubTask { arg }),
        None => Ok(()),
    }
}

fn engine_err(e: SchedError) -> WorkerError {
    match e {
        SchedError::ShuttingDown => WorkerError::Closed,
        other => WorkerError::Engine(other),
    }
}

#[cfg(test)]
mod tests {
    use simpler_device_a2a3::{Platform, RuntimeVariant};
    use simpler_types::{DataType, TaskArgs};

    use crate::{HostBuffer, Orchestration, Worker};

    /// A run keeps each host buffer once, however many tasks and arguments name it.
    #[test]
    fn a_host_buffer_named_by_many_sub_tasks_is_kept_once_per_run() {
        let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).sub_workers(1);
        let noop = b.register_host("noop", |_| Ok(()));
        let w = b.start().expect("start");
        let (x, y) = (HostBuffer::new(64).expect("buffer"), HostBuffer::new(64).expect("buffer"));
        let (tx, ty) = (
            x.tensor(&[16], DataType::Float32).expect("t"),
            y.tensor(&[16], DataType::Float32).expect("t"),
        );
        let kept = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = std::sync::Arc::clone(&kept);
        w.run(Orchestration::graph(move |g, _, _| {
            for _ in 0..4 {
                let mut args = TaskArgs::new();
                args.add_input(tx)?.add_input(tx)?.add_input(ty)?;
                g.submit_sub(noop, args)?;
            }
            seen.store(g.keep.len(), std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }))
        .expect("run");
        assert_eq!(kept.load(std::sync::atomic::Ordering::Relaxed), 2);
        w.close().expect("close");
    }
}
