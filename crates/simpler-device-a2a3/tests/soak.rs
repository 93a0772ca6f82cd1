//! Fault-recovery soak: `SIMPLER_SOAK_CYCLES` cycles (10 by default) of inject a fault (a hung
//! kernel, an AICPU fault, an AICore exception, in turn) → the typed error → `finalize` → a new
//! runner on the same device → the vector program passes. The process's thread count and
//! resident memory after the first cycle are compared with those after the last, and the
//! resident memory's growth over the second half of the cycles is bounded by a quarter of a
//! megabyte per cycle: recovery must not leak threads, and memory must stay flat.

mod common;

use common::*;
use simpler_device_a2a3::abi::codes::AclCode;
use simpler_device_a2a3::{DeviceError, DeviceRunner, ErrorClass, RunRequest};
use simpler_types::CallConfig;

#[derive(Clone, Copy, Debug)]
enum Injected {
    Hang,
    AicpuFault,
    AiCoreException,
}

const CYCLE: [Injected; 3] = [Injected::Hang, Injected::AicpuFault, Injected::AiCoreException];

/// A field of `/proc/self/status` in its unit (kB for memory), if the platform has it.
fn proc_status(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].split_whitespace().next()?.parse().ok()
}

/// One cycle: the injected fault surfaces as its typed error, the runner is finalized with no
/// stuck thread, and a fresh runner on the same device runs the vector program.
fn cycle(n: u64, fault: Injected) {
    let mut r = DeviceRunner::attach(fast_options(0)).unwrap();
    let faults = r.sim_faults().unwrap();
    match fault {
        Injected::Hang => faults.kernel_hang(FUNC_ADD_SCALAR, 1),
        Injected::AicpuFault => faults.aicpu_fault(1),
        Injected::AiCoreException => faults.kernel_fault(FUNC_MUL, 1),
    }
    let slot = r.register_callable(&vector_callable()).unwrap();
    let v = VectorRun::new(&mut r, 1024);
    let id = run_id(n);
    let err = r.run(&RunRequest::new(id, slot, &v.args, &CallConfig::default())).unwrap_err();
    assert_eq!(err.run_id(), Some(id), "cycle {n} ({fault:?}): {err}");
    let typed = match fault {
        Injected::Hang => err.class() == ErrorClass::Hang,
        Injected::AicpuFault => {
            matches!(err, DeviceError::DeviceFault { code: AclCode::AICPU_EXCEPTION, .. })
        }
        Injected::AiCoreException => {
            matches!(err, DeviceError::DeviceFault { code: AclCode::AICORE_EXCEPTION, .. })
        }
    };
    assert!(typed, "cycle {n} ({fault:?}): unexpected error {err}");
    assert!(!r.health().is_healthy(), "cycle {n}: the failed run left the device unusable");
    let report = r.finalize().unwrap();
    assert!(report.stuck_threads.is_empty(), "cycle {n}: {:?}", report.stuck_threads);
    let mut fresh = DeviceRunner::attach(options(0)).unwrap();
    vector_once(&mut fresh, n, &CallConfig::default());
    fresh.finalize().unwrap();
}

#[test]
fn repeated_fault_recovery_leaks_no_threads_and_keeps_memory_flat() {
    let cycles: u64 =
        std::env::var("SIMPLER_SOAK_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(10).max(2);
    cycle(1, CYCLE[0]);
    let (threads_first, rss_first) = (proc_status("Threads:"), proc_status("VmRSS:"));
    // The first half warms the allocator up; the second half must not grow by more than noise.
    let mid = 1 + (cycles - 1) / 2;
    let mut rss_mid = rss_first;
    for n in 2..=cycles {
        cycle(n, CYCLE[(n as usize - 1) % CYCLE.len()]);
        if n == mid {
            rss_mid = proc_status("VmRSS:");
        }
    }
    let (threads_last, rss_last) = (proc_status("Threads:"), proc_status("VmRSS:"));
    eprintln!(
        "soak: {cycles} cycles; threads {threads_first:?} -> {threads_last:?}; \
         RSS kB {rss_first:?} -> {rss_mid:?} (cycle {mid}) -> {rss_last:?}"
    );
    if let (Some(first), Some(last)) = (threads_first, threads_last) {
        assert!(last <= first, "threads grew from {first} to {last} over {cycles} cycles");
    }
    if let (Some(first), Some(last)) = (rss_first, rss_last) {
        // Allocator noise stays well below this; a leak of a runner's simulated device
        // memory or threads per cycle does not.
        let bound = 32 * 1024;
        assert!(
            last <= first + bound,
            "resident memory grew from {first} kB to {last} kB over {cycles} cycles"
        );
    }
    if let (Some(mid_kb), Some(last)) = (rss_mid, rss_last) {
        // A quarter of a megabyte per cycle: a leak of a megabyte per cycle fails.
        let bound = 256 * (cycles - mid);
        assert!(
            last <= mid_kb + bound,
            "resident memory grew from {mid_kb} kB after cycle {mid} to {last} kB after cycle \
             {cycles} (bound {bound} kB)"
        );
    }
}
