//! The engine workload harness shared by the benchmark binaries: one `Engine` with two
//! NEXT_LEVEL no-op endpoints (ids 0 and 1), tasks placed round-robin on them, orchestration on
//! the calling thread, and the workload shapes P1, P1a, P2, P3 and P6.
//!
//! A gate lets the endpoints hold their first task until the whole graph is submitted and
//! closed, so that the drain alone can be timed (the "gated" variants).

#![allow(dead_code, reason = "each benchmark binary uses a different part of the harness")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use simpler_sched::{
    DispatchedMember, Endpoint, EndpointCaps, EndpointFailure, Engine, EngineConfig,
};
use simpler_types::{
    CallConfig, CallableId, CallableKind, CallableNamespace, DataType, RunId, TaskArgs, Tensor,
    WorkerId, WorkerType,
};

/// Base of the fake buffer addresses. Non-canonical on x86-64 and AArch64, so no mapping (in
/// particular no heap ring) can ever contain it and the engine never consults its alloc
/// registry for these tensors.
const BASE: u64 = 0x4000_0000_0000_0000;

/// Holds the endpoints until opened.
#[derive(Default)]
pub struct Gate {
    /// Fast path: once open, endpoints pay one load per task. Acquire/Release pairs the opener's
    /// store with the endpoint's check; the mutex below handles the sleeping case.
    open: AtomicBool,
    lock: Mutex<()>,
    cond: Condvar,
}

impl Gate {
    /// Closes the gate: the next task each endpoint receives waits for [`open`](Self::open).
    pub fn close(&self) {
        self.open.store(false, Ordering::Release);
    }

    /// Opens the gate and wakes every waiting endpoint.
    pub fn open(&self) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.open.store(true, Ordering::Release);
        self.cond.notify_all();
    }

    fn pass(&self) {
        if self.open.load(Ordering::Acquire) {
            return;
        }
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        while !self.open.load(Ordering::Acquire) {
            g = self.cond.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// An endpoint that succeeds at once (after the gate).
struct Noop {
    id: u32,
    worker_type: WorkerType,
    gate: Arc<Gate>,
}

impl Endpoint for Noop {
    fn caps(&self) -> EndpointCaps {
        EndpointCaps {
            worker_type: self.worker_type,
            id: WorkerId(self.id),
            remote: false,
            name: format!("noop-{}", self.id),
        }
    }

    fn run(&mut self, _task: DispatchedMember<'_>) -> Result<(), EndpointFailure> {
        self.gate.pass();
        Ok(())
    }
}

/// The engine and its gate.
pub struct Harness {
    /// The engine.
    pub engine: Engine,
    /// The endpoints' gate (open unless a gated workload is running).
    pub gate: Arc<Gate>,
    callable: CallableId,
    config: CallConfig,
    byte: Tensor,
}

/// What one run of a workload measured.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// `begin_run` to the fence (`wait` returning).
    pub e2e: Duration,
    /// `begin_run` to `close` returning: the orchestration, arguments built in the loop.
    pub submit: Duration,
    /// Gate opening to the fence (gated runs only).
    pub drain: Option<Duration>,
    /// Tasks in the run.
    pub tasks: u64,
    /// What the probe counted over the timed window (allocations, in the workloads binary).
    pub probed: u64,
}

/// A workload shape (`docs/benchmarks-sched.md`).
#[derive(Clone, Copy, Debug)]
pub enum Workload {
    /// `tasks` independent tasks, each with one 1-byte `Output` of its own buffer.
    Independent {
        /// Tasks.
        tasks: u64,
    },
    /// `tasks` independent tasks without tensors.
    Bare {
        /// Tasks.
        tasks: u64,
    },
    /// `tasks` tasks, each `InOut` on one shared 1-byte tensor.
    Chain {
        /// Tasks.
        tasks: u64,
    },
    /// `reps` diamonds 1 → `width` → 1 chained through the sink's output.
    Diamonds {
        /// Repetitions.
        reps: u64,
        /// Mid tasks per diamond.
        width: u32,
    },
}

impl Workload {
    /// Tasks in one run.
    pub fn tasks(self) -> u64 {
        match self {
            Workload::Independent { tasks }
            | Workload::Bare { tasks }
            | Workload::Chain { tasks } => tasks,
            Workload::Diamonds { reps, width } => reps * (u64::from(width) + 2),
        }
    }
}

impl Harness {
    /// Starts the engine (default rings: nothing here allocates heap slabs).
    pub fn start() -> Harness {
        Harness::start_with_subs(0)
    }

    /// As [`start`](Self::start), with `subs` SUB endpoints as well, which the workloads never
    /// use: they stay idle, their threads parked, as a worker's pool of host-closure workers
    /// does while its chips are busy.
    pub fn start_with_subs(subs: u32) -> Harness {
        let gate = Arc::new(Gate::default());
        gate.open();
        let noop = |id, worker_type| {
            Box::new(Noop { id, worker_type, gate: Arc::clone(&gate) }) as Box<dyn Endpoint>
        };
        let next_level = (0..2).map(|id| noop(id, WorkerType::NextLevel)).collect();
        let sub = (0..subs).map(|id| noop(id, WorkerType::Sub)).collect();
        let engine = Engine::start(EngineConfig { next_level, sub, ..EngineConfig::default() })
            .expect("engine starts");
        Harness {
            engine,
            gate,
            callable: CallableId::new([7; 32], CallableKind::Chip, CallableNamespace::LocalChip),
            config: CallConfig::default(),
            byte: Tensor::external(BASE, &[1], DataType::UInt8).expect("valid tensor"),
        }
    }

    fn one_byte(&self, index: u64) -> Tensor {
        let mut t = self.byte;
        t.addr = BASE + index;
        t
    }

    /// Runs `workload` once: begin, submit everything, close, wait, release. With `gated`, the
    /// endpoints hold their first task until submission is closed and the drain is timed too.
    pub fn run(&self, workload: Workload, gated: bool) -> Timing {
        self.run_probed(workload, gated, &|| 0)
    }

    /// As [`run`](Self::run), reading `probe` at the start and the end of the timed window.
    pub fn run_probed(&self, workload: Workload, gated: bool, probe: &dyn Fn() -> u64) -> Timing {
        if gated {
            self.gate.close();
        }
        let probe_start = probe();
        let start = Instant::now();
        let run = self.submit(workload);
        let submitted = Instant::now();
        let drain_start = gated.then(|| {
            self.gate.open();
            Instant::now()
        });
        let outcome = self.engine.wait(run).expect("known run");
        let end = Instant::now();
        let probed = probe() - probe_start;
        assert!(outcome.is_completed(), "{workload:?} failed: {outcome:?}");
        self.engine.release(run).expect("terminal run");
        Timing {
            e2e: end - start,
            submit: submitted - start,
            drain: drain_start.map(|d| end - d),
            tasks: workload.tasks(),
            probed,
        }
    }

    fn submit(&self, workload: Workload) -> RunId {
        let mut b = self.engine.begin_run().expect("admitted");
        let (c, cfg) = (&self.callable, &self.config);
        let target = |i: u64| WorkerId((i % 2) as u32);
        match workload {
            Workload::Independent { tasks } => {
                for i in 0..tasks {
                    let mut a = TaskArgs::new();
                    a.add_output(self.one_byte(i)).expect("fits");
                    b.submit_next_level(c, a, cfg, target(i), None).expect("accepted");
                }
            }
            Workload::Bare { tasks } => {
                for i in 0..tasks {
                    b.submit_next_level(c, TaskArgs::new(), cfg, target(i), None)
                        .expect("accepted");
                }
            }
            Workload::Chain { tasks } => {
                let t = self.one_byte(0);
                for i in 0..tasks {
                    let mut a = TaskArgs::new();
                    a.add_inout(t).expect("fits");
                    b.submit_next_level(c, a, cfg, target(i), None).expect("accepted");
                }
            }
            Workload::Diamonds { reps, width } => {
                // Source output A, mids' 1-byte views of Y, sink output Z (P3).
                let a_buf = self.one_byte(0);
                let z_buf = self.one_byte(1);
                let y = Tensor::external(BASE + 4096, &[width], DataType::UInt8).expect("valid");
                let mut i = 0u64;
                let mut next = || {
                    i += 1;
                    target(i)
                };
                for r in 0..reps {
                    let mut src = TaskArgs::new();
                    if r > 0 {
                        src.add_input(z_buf).expect("fits");
                    }
                    src.add_output(a_buf).expect("fits");
                    b.submit_next_level(c, src, cfg, next(), None).expect("accepted");
                    for m in 0..width {
                        let mut mid = TaskArgs::new();
                        mid.add_input(a_buf).expect("fits");
                        mid.add_output(y.view(&[1], &[m]).expect("inside Y")).expect("fits");
                        b.submit_next_level(c, mid, cfg, next(), None).expect("accepted");
                    }
                    let mut sink = TaskArgs::new();
                    sink.add_input(y).expect("fits");
                    sink.add_output(z_buf).expect("fits");
                    b.submit_next_level(c, sink, cfg, next(), None).expect("accepted");
                }
            }
        }
        b.close()
    }
}

/// Least-squares fit of `y = a + b·x`; returns `(a, b)`.
pub fn fit_line(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let b = if sxx == 0.0 { 0.0 } else { sxy / sxx };
    (my - b * mx, b)
}

/// Run sizes of P6.
pub const P6_SIZES: [u64; 5] = [1, 4, 16, 64, 256];
