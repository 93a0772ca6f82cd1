//! The streaming and paged-attention reference programs against their host references, on
//! host_build_graph at sizes its resident graph holds and on tensormap_and_ringbuffer through
//! small rings (`SIMPLER_STREAM_TASKS` sets the streaming task count of the trb tests; the
//! default keeps them short, the S4 benchmark runs a million).

mod common;

use common::*;
use simpler_device_a2a3::programs::paged_attention::{self, PagedAttention};
use simpler_device_a2a3::programs::{f32_from_le_bytes, streaming};
use simpler_device_a2a3::{
    CapacityResource, DeviceError, DevicePtr, DeviceRunner, OrchError, OrchFailure, RingDefaults,
    RunRequest, RunnerOptions, RuntimeVariant,
};
use simpler_types::{CallConfig, DataType, TaskArgs, Tensor};

const HBG: RuntimeVariant = RuntimeVariant::HostBuildGraph;
const TRB: RuntimeVariant = RuntimeVariant::TensormapAndRingbuffer;

/// Lanes of the streaming output.
const LANES: usize = 64;

/// Tasks of the hbg streaming runs: well inside its default task window.
const HBG_TASKS: u64 = 10_000;

/// Tasks of the trb streaming runs: `SIMPLER_STREAM_TASKS`, else twenty windows' worth.
fn trb_tasks() -> u64 {
    std::env::var("SIMPLER_STREAM_TASKS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_480)
}

/// trb options with the rings of the streaming workload: a 1024-slot window and 1 MiB of heap
/// per ring.
fn small_rings(device_id: u32) -> RunnerOptions {
    let mut o = options_on(device_id, TRB);
    o.rings = RingDefaults { task_window: 1024, heap_bytes: 1 << 20, ..RingDefaults::default() };
    o
}

/// One streaming run of `tasks` tasks in chains of `chain_len` over [`LANES`] zeroed lanes;
/// the lanes afterwards.
fn stream(
    r: &mut DeviceRunner,
    run: u64,
    tasks: u64,
    chain_len: u64,
) -> Result<Vec<f32>, DeviceError> {
    let slot = r.register_callable(&streaming::callable()?)?;
    let (p, lanes) = upload_f32(r, &[0.0; LANES]);
    let args = streaming::run_args(lanes, tasks, chain_len).unwrap();
    let result = r.run(&RunRequest::new(run_id(run), slot, &args, &CallConfig::default()));
    let out = download_f32(r, p, LANES);
    r.free(p)?;
    r.unregister_callable(slot)?;
    result.map(|_| out)
}

/// One paged-attention run of `p`; `out` afterwards.
fn attend(r: &mut DeviceRunner, run: u64, p: &PagedAttention) -> Result<Vec<f32>, DeviceError> {
    let slot = r.register_callable(&paged_attention::callable()?)?;
    let mut ptrs: Vec<DevicePtr> = Vec::new();
    let mut args = TaskArgs::new();
    for (bytes, shape, dtype) in p.inputs().unwrap() {
        let ptr = r.malloc(bytes.len() as u64)?;
        r.copy_to_device(ptr, &bytes)?;
        ptrs.push(ptr);
        args.add_input(Tensor::external(ptr.addr(), &shape, dtype).unwrap().child_memory(true))
            .unwrap();
    }
    let out_bytes = (p.requests * p.head_dim * 4) as u64;
    let out = r.malloc(out_bytes)?;
    ptrs.push(out);
    let out_tensor =
        Tensor::external(out.addr(), &p.out_shape().unwrap(), DataType::Float32).unwrap();
    args.add_output(out_tensor.child_memory(true)).unwrap();
    let result = r.run(&RunRequest::new(run_id(run), slot, &args, &CallConfig::default()));
    let mut raw = vec![0u8; out_bytes as usize];
    r.copy_from_device(&mut raw, out)?;
    for ptr in ptrs {
        r.free(ptr)?;
    }
    r.unregister_callable(slot)?;
    result.map(|_| f32_from_le_bytes(&raw))
}

/// Checks `got` against the host reference of `p` within the program's tolerance.
fn assert_close(got: &[f32], p: &PagedAttention) {
    let want = p.reference().unwrap();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let (r, d) = (i / p.head_dim, i % p.head_dim);
        assert!(
            (g - w).abs() <= paged_attention::TOLERANCE,
            "request {r} (context {}), element {d}: device {g}, host {w}",
            p.context_lens[r]
        );
    }
}

#[test]
fn independent_streaming_tasks_match_the_reference_on_hbg() {
    let mut r = DeviceRunner::attach(options_on(0, HBG)).unwrap();
    let got = stream(&mut r, 1, HBG_TASKS, 1).unwrap();
    assert_eq!(got, streaming::reference(HBG_TASKS, 1, LANES));
    r.finalize().unwrap();
}

#[test]
fn chained_streaming_tasks_match_the_reference_on_hbg() {
    let mut r = DeviceRunner::attach(options_on(0, HBG)).unwrap();
    // A task count that leaves a short last chain.
    let tasks = HBG_TASKS + 37;
    let got = stream(&mut r, 1, tasks, streaming::CHAIN).unwrap();
    assert_eq!(got, streaming::reference(tasks, streaming::CHAIN, LANES));
    r.finalize().unwrap();
}

#[test]
fn a_streaming_graph_beyond_the_hbg_window_fails_before_launch_and_the_next_run_succeeds() {
    let mut o = options_on(0, HBG);
    o.rings = RingDefaults { task_window: 1024, ..RingDefaults::default() };
    let mut r = DeviceRunner::attach(o).unwrap();
    let launches = r.stats().aicore_launches;
    let e = stream(&mut r, 1, 2048, streaming::CHAIN).unwrap_err();
    assert!(
        matches!(
            e,
            DeviceError::Capacity {
                ring: 0,
                resource: CapacityResource::TaskWindow,
                capacity: 1024,
                needed: 2048,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(r.stats().aicore_launches, launches, "nothing is launched");
    assert_eq!(stream(&mut r, 2, 1000, 1).unwrap(), streaming::reference(1000, 1, LANES));
    r.finalize().unwrap();
}

#[test]
fn paged_attention_matches_the_host_reference_on_hbg() {
    let mut r = DeviceRunner::attach(options_on(0, HBG)).unwrap();
    let p = PagedAttention::example(16);
    assert_close(&attend(&mut r, 1, &p).unwrap(), &p);
    r.finalize().unwrap();
}

#[test]
fn paged_attention_refuses_a_block_outside_the_cache_and_the_next_run_succeeds() {
    let mut r = DeviceRunner::attach(options_on(0, HBG)).unwrap();
    let mut p = PagedAttention::example(4);
    // Request 3 (17 tokens) reads its second block from past the end of the cache.
    p.block_table[3 * p.max_blocks + 1] = p.pool_blocks as i32;
    let e = attend(&mut r, 1, &p).unwrap_err();
    assert!(
        matches!(
            e,
            DeviceError::Orchestration { failure: OrchFailure::Returned(OrchError { .. }), .. }
        ),
        "{e:?}"
    );
    let p = PagedAttention::example(4);
    assert_close(&attend(&mut r, 2, &p).unwrap(), &p);
    r.finalize().unwrap();
}

#[test]
fn paged_attention_refuses_a_block_table_larger_than_its_buffer_before_reading_it() {
    // A null block table whose shape claims 64 GiB: the orchestration sizes its read from the
    // shape, so it must check the shape against the buffer before it allocates anything.
    let mut r = DeviceRunner::attach(options_on(0, HBG)).unwrap();
    let p = PagedAttention::example(4);
    let slot = r.register_callable(&paged_attention::callable().unwrap()).unwrap();
    let mut ptrs = Vec::new();
    let mut args = TaskArgs::new();
    for (i, (bytes, shape, dtype)) in p.inputs().unwrap().into_iter().enumerate() {
        let t = if i == 3 {
            Tensor::external(0, &[p.requests as u32, u32::MAX], dtype).unwrap()
        } else {
            let ptr = r.malloc(bytes.len() as u64).unwrap();
            r.copy_to_device(ptr, &bytes).unwrap();
            ptrs.push(ptr);
            Tensor::external(ptr.addr(), &shape, dtype).unwrap()
        };
        args.add_input(t.child_memory(true)).unwrap();
    }
    let out = r.malloc((p.requests * p.head_dim * 4) as u64).unwrap();
    ptrs.push(out);
    let out_tensor =
        Tensor::external(out.addr(), &p.out_shape().unwrap(), DataType::Float32).unwrap();
    args.add_output(out_tensor.child_memory(true)).unwrap();
    let e = r.run(&RunRequest::new(run_id(1), slot, &args, &CallConfig::default())).unwrap_err();
    assert!(
        matches!(
            e,
            DeviceError::Orchestration { failure: OrchFailure::Returned(OrchError { .. }), .. }
        ),
        "{e:?}"
    );
    for ptr in ptrs {
        r.free(ptr).unwrap();
    }
    r.finalize().unwrap();
}

#[test]
fn independent_streaming_tasks_stream_through_a_1024_slot_window_on_trb() {
    let mut r = DeviceRunner::attach(small_rings(0)).unwrap();
    let tasks = trb_tasks();
    assert_eq!(stream(&mut r, 1, tasks, 1).unwrap(), streaming::reference(tasks, 1, LANES));
    r.finalize().unwrap();
}

#[test]
fn chained_streaming_tasks_stream_through_a_1024_slot_window_and_1_mib_heap_on_trb() {
    let mut r = DeviceRunner::attach(small_rings(0)).unwrap();
    let tasks = trb_tasks() + 37;
    let got = stream(&mut r, 1, tasks, streaming::CHAIN).unwrap();
    assert_eq!(got, streaming::reference(tasks, streaming::CHAIN, LANES));
    r.finalize().unwrap();
}

#[test]
fn paged_attention_on_trb_matches_the_reference_and_hbg_bit_for_bit() {
    // More requests than the small window holds tasks, so request scopes must be reclaimed.
    let p = PagedAttention::example(128);
    let tasks = p.tasks().unwrap();
    assert!(tasks > 1024, "{tasks} tasks");
    let mut trb = DeviceRunner::attach(small_rings(0)).unwrap();
    let on_trb = attend(&mut trb, 1, &p).unwrap();
    trb.finalize().unwrap();
    assert_close(&on_trb, &p);
    let mut hbg = DeviceRunner::attach(options_on(1, HBG)).unwrap();
    let on_hbg = attend(&mut hbg, 1, &p).unwrap();
    hbg.finalize().unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&on_trb), bits(&on_hbg));
}
