//! Conformance items that name tensormap_and_ringbuffer, each test named after its item:
//! orchestration faults that leave the device healthy
//! (7; the ring stalls SCOPE_DEADLOCK, HEAP_RING_DEADLOCK, DEP_POOL_OVERFLOW and
//! TENSORMAP_OVERFLOW are in `trb_programs.rs`), callable and arena reuse (partial arena resets
//! included), the tensors a kernel may declare and ring sizing (13),
//! and the diagnostics files (16). Item 1 (the vector programs on every launch shape) is
//! `conformance.rs`'s test of it, which CI runs under both runtimes (`SIMPLER_TEST_RUNTIME`).

mod common;

use std::collections::BTreeSet;
use std::time::Instant;

use common::diag::*;
use common::*;
use simpler_device_a2a3::abi::codes::RuntimeCode;
use simpler_device_a2a3::{
    ArgDirection, ChipCallable, CoreCallable, DeviceError, DeviceHealth, DeviceRunner, Kernels,
    OrchArgs, OrchConfig, OrchCtx, OrchError, RingDefaults, RunRequest, RunnerOptions,
    RuntimeVariant,
};
use simpler_types::{
    CallConfig, CoreArgs, RingOverride, RingSel, SwimlaneLevel, TaskArgs, TypesError,
};

const TRB: RuntimeVariant = RuntimeVariant::TensormapAndRingbuffer;

fn trb_runner() -> DeviceRunner {
    DeviceRunner::attach(options_on(0, TRB)).unwrap()
}

// ----- 7. Orchestration faults latch their codes; the device stays healthy -----

fn unregistered_kernel_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    a.add_inout(*args.tensor(0).unwrap()).unwrap();
    ctx.submit(Kernels::Aiv(FUNC_NOOP), &a)?;
    // Func id 9 is not registered by the callable.
    ctx.submit(Kernels::Aiv(9), &a)?;
    Ok(())
}

fn fatal_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    a.add_inout(*args.tensor(0).unwrap()).unwrap();
    ctx.submit(Kernels::Aiv(FUNC_NOOP), &a)?;
    ctx.report_fatal(0, "the orchestration gave up");
    Ok(())
}

fn panicking_orch(_: &mut OrchCtx<'_>, _: &OrchArgs<'_>) -> Result<(), OrchError> {
    panic!("the orchestration panicked on purpose")
}

fn one_arg(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 1 }
}

fn two_args(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 2 }
}

fn noop_callable(
    orch: simpler_device_a2a3::NativeOrchFn,
    config: simpler_device_a2a3::NativeConfigFn,
) -> ChipCallable {
    ChipCallable::native(orch, config)
        .kernel(FUNC_NOOP, noop_core(vec![ArgDirection::InOut]))
        .build()
        .unwrap()
}

#[test]
fn item_7_trb_orchestration_faults_latch_invalid_args_and_orchestration_fatal_and_the_next_run_succeeds()
 {
    let mut r = trb_runner();
    let (p, t) = upload_f32(&mut r, &[0.0; 64]);
    let mut args = TaskArgs::new();
    args.add_inout(t).unwrap();
    let cases: [(ChipCallable, RuntimeCode, &str); 4] = [
        (noop_callable(unregistered_kernel_orch, one_arg), RuntimeCode::InvalidArgs, "func id 9"),
        (noop_callable(unregistered_kernel_orch, two_args), RuntimeCode::InvalidArgs, "expects 2"),
        (noop_callable(fatal_orch, one_arg), RuntimeCode::OrchestrationFatal, "gave up"),
        (noop_callable(panicking_orch, one_arg), RuntimeCode::OrchestrationFatal, "on purpose"),
    ];
    let ok_slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 1024);
    for (i, (callable, code, text)) in cases.iter().enumerate() {
        let slot = r.register_callable(callable).unwrap();
        let err = r
            .run(&RunRequest::new(run_id(10 + i as u64), slot, &args, &CallConfig::default()))
            .unwrap_err();
        let DeviceError::Runtime { fault, .. } = &err else { panic!("case {i}: {err}") };
        assert_eq!(fault.code, *code, "case {i}: {err}");
        assert!(fault.message.contains(text), "case {i}: {err}");
        assert_eq!(r.health(), DeviceHealth::Healthy, "case {i}");
        r.unregister_callable(slot).unwrap();
        // The next run on the same runner succeeds.
        r.run(&RunRequest::new(run_id(20 + i as u64), ok_slot, &v.args, &CallConfig::default()))
            .unwrap();
        v.check(&mut r);
    }
    v.free(&mut r);
    r.free(p).unwrap();
    r.finalize().unwrap();
}

// ----- 13. Callable and arena reuse, the tensors a kernel may declare; ring sizing -----

/// One task of kernel [`FUNC_NOOP`] reading the chip tensor as each of its 17 tensors.
fn seventeen_tensors_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let mut a = CoreArgs::new();
    for _ in 0..17 {
        a.add_input(*args.tensor(0).unwrap()).unwrap();
    }
    ctx.submit(Kernels::Aiv(FUNC_NOOP), &a)?;
    Ok(())
}

#[test]
fn item_13_a_kernel_declaring_more_tensors_than_a_trb_task_holds_is_refused_at_registration() {
    let wide = |tensors: usize| {
        ChipCallable::native(seventeen_tensors_orch, one_arg)
            // SAFETY: the kernel is written for the signature it is paired with.
            .kernel(FUNC_NOOP, unsafe {
                CoreCallable::native(vec![ArgDirection::In; tensors], noop_kernel)
            })
            .build()
            .unwrap()
    };
    let mut r = trb_runner();
    match r.register_callable(&wide(17)) {
        Err(DeviceError::InvalidCallable { run_id: None, problem }) => assert_eq!(
            problem,
            simpler_device_a2a3::CallableProblem::TooManyTensors {
                func_id: FUNC_NOOP,
                name: None,
                tensors: 17,
                max: 16
            }
        ),
        other => panic!("expected InvalidCallable, got {other:?}"),
    }
    let named = ChipCallable::native(seventeen_tensors_orch, one_arg)
        // SAFETY: the kernel is written for the signature it is paired with.
        .kernel(4, noop_core(vec![ArgDirection::Out; 20]).named("wide"))
        .build()
        .unwrap();
    let err = r.register_callable(&named).unwrap_err();
    assert!(err.to_string().contains("kernel 4 (\"wide\") signature declares 20 tensors"), "{err}");
    assert_eq!(r.stats().registrations, 0, "nothing was registered");
    r.register_callable(&wide(16)).unwrap();
    r.finalize().unwrap();

    // host_build_graph holds up to 32 tensors per task: the same kernel registers and runs.
    let mut r = DeviceRunner::attach(options_on(0, RuntimeVariant::HostBuildGraph)).unwrap();
    let slot = r.register_callable(&wide(17)).unwrap();
    let (p, t) = upload_f32(&mut r, &[1.0; 8]);
    let mut args = TaskArgs::new();
    args.add_input(t).unwrap();
    r.run(&RunRequest::new(run_id(1), slot, &args, &CallConfig::default())).unwrap();
    r.free(p).unwrap();
    r.finalize().unwrap();
}

fn chain_orch(ctx: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let n = args.scalar(0).unwrap_or(0);
    let t = *args.tensor(0).unwrap();
    ctx.scope(|ctx| -> Result<(), OrchError> {
        for _ in 0..n {
            let mut a = CoreArgs::new();
            a.add_inout(t).unwrap();
            ctx.submit(Kernels::Aiv(FUNC_NOOP), &a)?;
        }
        Ok(())
    })?
}

fn small_ring_options() -> RunnerOptions {
    let mut o = options_on(0, TRB);
    o.rings = RingDefaults { task_window: 16, heap_bytes: 64 << 10, dep_pool: 64 };
    o
}

/// `n` chained tasks in one scope (ring 1) with `cfg`.
fn run_chain(
    r: &mut DeviceRunner,
    slot: simpler_device_a2a3::ChipSlot,
    run: u64,
    n: u64,
    cfg: &CallConfig,
) -> Result<simpler_device_a2a3::RunReport, DeviceError> {
    let (p, t) = upload_f32(r, &[0.0; 64]);
    let mut args = TaskArgs::new();
    args.add_inout(t).unwrap();
    args.add_scalar(n).unwrap();
    let out = r.run(&RunRequest::new(run_id(run), slot, &args, cfg));
    r.free(p).unwrap();
    out
}

#[test]
fn item_13_rerunning_one_trb_callable_registers_once_and_builds_its_arena_once_and_a_larger_sizing_rebuilds_once()
 {
    let mut r = DeviceRunner::attach(small_ring_options()).unwrap();
    let slot = r.register_callable(&noop_callable(chain_orch, two_args)).unwrap();
    let cfg = CallConfig::default();
    run_chain(&mut r, slot, 1, 8, &cfg).unwrap();
    let first = r.stats();
    assert_eq!(first.registrations, 1);
    for run in 2..=6 {
        run_chain(&mut r, slot, run, 8, &cfg).unwrap();
    }
    let again = r.stats();
    assert_eq!(again.registrations, 1, "re-running registers nothing");
    assert_eq!(again.chip_buffer_uploads, first.chip_buffer_uploads, "nothing is re-uploaded");
    assert_eq!(again.arena_cache_misses, first.arena_cache_misses, "the arena is built once");
    assert_eq!(again.runs_completed, 6);
    // A larger ring sizing builds a new arena once, then reuses it.
    let big = RingOverride { task_window: Some(64), heap_bytes: Some(256 << 10), dep_pool: None };
    let bigger = CallConfig::builder().ring_override(RingSel::All, big).build().unwrap();
    for run in 7..=9 {
        run_chain(&mut r, slot, run, 8, &bigger).unwrap();
    }
    assert_eq!(r.stats().arena_cache_misses, again.arena_cache_misses + 1);
    r.finalize().unwrap();
}

#[test]
fn item_13_task_windows_legal_one_by_one_but_too_many_together_are_invalid_args() {
    // Four windows of the largest legal size are more than one arena holds: a typed refusal
    // naming the sizes, not an arithmetic overflow.
    let mut r = DeviceRunner::attach(small_ring_options()).unwrap();
    let slot = r.register_callable(&noop_callable(chain_orch, two_args)).unwrap();
    let huge = CallConfig::builder().task_window(RingSel::All, 1 << 28).build().unwrap();
    let err = run_chain(&mut r, slot, 1, 8, &huge).unwrap_err();
    assert!(
        matches!(&err, DeviceError::InvalidArgs {
            problem: simpler_device_a2a3::ArgsProblem::RingsTooLarge { sizes },
            ..
        } if sizes.iter().all(|s| s.task_window == 1 << 28)),
        "{err}"
    );
    assert!(err.to_string().contains("ring 0: task window 268435456, heap "), "{err}");
    run_chain(&mut r, slot, 2, 8, &CallConfig::default()).unwrap();
    r.finalize().unwrap();
}

#[test]
fn item_13_a_kept_arena_is_reset_partially_only_after_a_clean_run_of_the_same_sizing() {
    let mut r = DeviceRunner::attach(small_ring_options()).unwrap();
    let chain = r.register_callable(&noop_callable(chain_orch, two_args)).unwrap();
    let vector = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 1024);
    let cfg = CallConfig::default();
    let reused = |rep: simpler_device_a2a3::RunReport| rep.arena_reused;
    assert!(!reused(run_chain(&mut r, chain, 1, 8, &cfg).unwrap()), "a fresh arena");
    assert!(reused(run_chain(&mut r, chain, 2, 8, &cfg).unwrap()));
    // Another callable over the same sizing reuses the arena too, and computes right.
    let rep = r.run(&RunRequest::new(run_id(3), vector, &v.args, &cfg)).unwrap();
    assert!(rep.arena_reused);
    v.check(&mut r);
    v.clear(&mut r);
    // A run that fails mid-way (40 tasks in one scope of a 16-slot window) leaves its
    // leftovers unknown: the next run resets everything.
    let err = run_chain(&mut r, chain, 4, 40, &cfg).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Runtime { fault, .. } if fault.code == RuntimeCode::ScopeDeadlock)
    );
    let rep = r.run(&RunRequest::new(run_id(5), vector, &v.args, &cfg)).unwrap();
    assert!(!rep.arena_reused, "after a failed run");
    v.check(&mut r);
    v.clear(&mut r);
    // A smaller sizing fits the same allocation but lays it out anew.
    let narrow = RingOverride { task_window: Some(8), heap_bytes: None, dep_pool: None };
    let small = CallConfig::builder().ring_override(RingSel::All, narrow).build().unwrap();
    let misses = r.stats().arena_cache_misses;
    assert!(!reused(run_chain(&mut r, chain, 6, 4, &small).unwrap()), "another layout");
    assert!(reused(run_chain(&mut r, chain, 7, 4, &small).unwrap()));
    assert!(!reused(run_chain(&mut r, chain, 8, 4, &cfg).unwrap()), "back to the first layout");
    assert_eq!(r.stats().arena_cache_misses, misses, "one allocation throughout");
    let rep = r.run(&RunRequest::new(run_id(9), vector, &v.args, &cfg)).unwrap();
    assert!(rep.arena_reused);
    v.check(&mut r);
    v.free(&mut r);
    r.finalize().unwrap();
}

#[test]
fn item_13_runtime_env_beats_the_runner_ring_defaults() {
    let mut r = DeviceRunner::attach(small_ring_options()).unwrap();
    let slot = r.register_callable(&noop_callable(chain_orch, two_args)).unwrap();
    // Forty tasks in one scope do not fit the runner's 16-slot window of ring 1 ...
    let err = run_chain(&mut r, slot, 1, 40, &CallConfig::default()).unwrap_err();
    let DeviceError::Runtime { fault, .. } = &err else { panic!("{err}") };
    assert_eq!(fault.code, RuntimeCode::ScopeDeadlock, "{err}");
    assert_eq!((fault.ring, fault.sizes.map(|s| s.task_window)), (Some(1), Some(16)), "{err}");
    // ... but fit the run's own 64-slot window for ring 1, whose high-water mark shows it.
    let wide = RingOverride { task_window: Some(64), heap_bytes: None, dep_pool: None };
    let cfg = CallConfig::builder().ring_override(RingSel::Ring(1), wide).build().unwrap();
    let rep = run_chain(&mut r, slot, 2, 40, &cfg).unwrap();
    assert_eq!(rep.rings[1].task_window_max, 40);
    r.finalize().unwrap();
}

#[test]
fn item_13_bad_ring_overrides_are_rejected_naming_the_ring_and_the_field() {
    let mut r = DeviceRunner::attach(small_ring_options()).unwrap();
    let slot = r.register_callable(&noop_callable(chain_orch, two_args)).unwrap();
    // The configuration refuses what no ring can take, naming the ring ...
    let build = |o: RingOverride| CallConfig::builder().ring_override(RingSel::Ring(2), o).build();
    let window = RingOverride { task_window: Some(48), heap_bytes: None, dep_pool: None };
    assert!(matches!(build(window), Err(TypesError::TaskWindowOutOfRange { ring: 2, value: 48 })));
    let pool = RingOverride { task_window: None, heap_bytes: None, dep_pool: Some(2) };
    assert!(matches!(build(pool), Err(TypesError::DepPoolOutOfRange { ring: 2, value: 2 })));
    let heap = RingOverride { task_window: None, heap_bytes: Some(1500), dep_pool: None };
    assert!(matches!(build(heap), Err(TypesError::HeapSizeInvalid { ring: 2, value: 1500 })));
    // ... and the runtime an unusable runner default, naming the ring, the field and the value.
    for (field, bad) in [("task_window", 12u64), ("heap_bytes", 1500)] {
        let mut o = small_ring_options();
        match field {
            "task_window" => o.rings.task_window = bad as u32,
            _ => o.rings.heap_bytes = bad,
        }
        let mut r2 = DeviceRunner::attach(o).unwrap();
        let slot2 = r2.register_callable(&noop_callable(chain_orch, two_args)).unwrap();
        let err = run_chain(&mut r2, slot2, 1, 4, &CallConfig::default()).unwrap_err();
        let DeviceError::InvalidConfig { setting, value, .. } = &err else { panic!("{err}") };
        let want = (format!("ring 0 {field}"), bad.to_string());
        assert_eq!((setting.clone(), value.clone()), want, "{err}");
        r2.finalize().unwrap();
    }
    // Nothing ran, and the runner still runs.
    run_chain(&mut r, slot, 9, 4, &CallConfig::default()).unwrap();
    r.finalize().unwrap();
}

// ----- 16. Diagnostics files -----

#[test]
fn item_16_trb_diagnostics_write_parseable_files_only_under_the_prefix() {
    let dir = temp_dir("trb-diag");
    let mut r = trb_runner();
    let cfg = CallConfig::builder()
        .swimlane(SwimlaneLevel::OrchPhases)
        .dep_gen(true)
        .scope_stats(true)
        .output_prefix(&dir)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let rep = vector_once(&mut r, 1, &cfg);
    let host = t0.elapsed();
    let wall = rep.device_wall.expect("device wall time");
    assert!(wall > std::time::Duration::ZERO && wall <= host, "wall {wall:?} host {host:?}");
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    assert_eq!(rep.swimlane_dropped, 0);
    assert_eq!(
        files_under(&dir),
        BTreeSet::from([
            "deps.dot".into(),
            "deps.json".into(),
            "l2_swimlane_records.json".into(),
            "scope_stats/scope_stats.jsonl".into(),
            "swimlane.perfetto.json".into(),
        ])
    );
    assert!(rep.outputs.iter().all(|p| p.starts_with(&dir)), "{:?}", rep.outputs);

    // One X event per (task, block) dispatch, named by kernel; one AICPU dispatch record each;
    // one orchestration submit span per task (level 4).
    let perfetto = json(&dir.join("swimlane.perfetto.json"));
    let cores = x_events(&perfetto, 1);
    assert_eq!(cores.len(), 5, "one X event per (task, block) dispatch");
    let kernels: BTreeSet<&str> = cores.iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(kernels, BTreeSet::from(["add", "add_scalar", "mul"]));
    assert_eq!(x_events(&perfetto, 3).len(), 5, "AICPU dispatch spans");
    assert_eq!(x_events(&perfetto, 4).len(), 5, "orchestration submit spans");
    let records = json(&dir.join("l2_swimlane_records.json"));
    assert_eq!(records["level"], 4);
    assert_eq!(records["aicore_tasks"].as_array().unwrap().len(), 5);
    let aicpu = records["aicpu_tasks"].as_array().unwrap();
    assert_eq!(aicpu.len(), 10, "five dispatches and five submit spans");
    assert!(aicpu.iter().all(|r| r[5].as_u64() >= r[4].as_u64() && r[4].as_u64() > Some(0)));
    assert_eq!(records["metadata"]["clock_freq_hz"], 50_000_000);

    // deps.json edges equal a replay of its own task records through the tensor map, and the
    // vector example's known graph.
    let deps = json(&dir.join("deps.json"));
    assert_eq!(deps["complete"], true);
    let edges = wired_edges(&deps);
    assert_eq!(edges, replayed_edges(&deps));
    // Edges name device task ids; the known graph is by submit order (the buffers' holder
    // took a slot of ring 0 before the first task).
    let ids: Vec<u64> = deps["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task_id"].as_str().unwrap().parse().unwrap())
        .collect();
    let index = |id: u64| ids.iter().position(|&i| i == id).unwrap();
    let by_order: BTreeSet<(usize, usize)> =
        edges.iter().map(|&(p, s)| (index(p), index(s))).collect();
    assert_eq!(by_order, BTreeSet::from([(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (0, 4)]));

    // Scope statistics: one begin and one end per scope, the ring each scope used; a 3-block
    // task is 3 dispatches.
    let dir2 = temp_dir("trb-scopes");
    let slot = r.register_callable(&scoped_callable()).unwrap();
    let (p, t) = upload_f32(&mut r, &[0.0; 8]);
    let mut args = TaskArgs::new();
    args.add_inout(t).unwrap();
    let cfg = CallConfig::builder()
        .scope_stats(true)
        .swimlane(SwimlaneLevel::AicoreTiming)
        .output_prefix(&dir2)
        .build()
        .unwrap();
    let rep = r.run(&RunRequest::new(run_id(2), slot, &args, &cfg)).unwrap();
    let lines = scope_stats(&dir2);
    assert_eq!(lines[0]["total"], 4);
    assert_eq!(lines[0]["dropped"], 0);
    assert_eq!(lines[0]["task_window_max"][2], rep.rings[2].task_window_max);
    let phases: Vec<(&str, u64, u64)> = lines[1..]
        .iter()
        .map(|l| {
            (
                l["phase"].as_str().unwrap(),
                l["depth"].as_u64().unwrap(),
                l["ring"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(phases, [("begin", 1, 1), ("begin", 2, 2), ("end", 2, 2), ("end", 1, 1)]);
    // The inner scope's one task holds one slot of ring 2 at its end.
    assert_eq!(lines[3]["task_window_end"], 1);
    let perfetto = json(&dir2.join("swimlane.perfetto.json"));
    assert_eq!(x_events(&perfetto, 1).len(), 3);

    // Diagnostics off writes nothing, even with a prefix.
    let dir3 = temp_dir("trb-quiet");
    let cfg = CallConfig::builder().output_prefix(&dir3).build().unwrap();
    let rep = r.run(&RunRequest::new(run_id(3), slot, &args, &cfg)).unwrap();
    assert!(rep.outputs.is_empty());
    assert_eq!(std::fs::read_dir(&dir3).unwrap().count(), 0);
    r.free(p).unwrap();
    r.finalize().unwrap();
    for d in [dir, dir2, dir3] {
        let _ = std::fs::remove_dir_all(d);
    }
}
