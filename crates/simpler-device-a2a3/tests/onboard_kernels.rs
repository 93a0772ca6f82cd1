//! The onboard case set's test kernels (`simpler-onboard-programs/kernels`, the CCE sources
//! ccec compiles for the AIV on a server) built for the host and run by the simulator in place
//! of the Rust kernels: the vector example passes its golden check on them, on the Rust and on
//! the C++ AICore executor, so the kernel source that ships is the source tested here.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::*;
use simpler_device_a2a3::callable::{
    ArgDirection, ChipCallable, CoreCallable, KernelCode, SharedObjectKernel,
};
use simpler_device_a2a3::programs::vector;
use simpler_device_a2a3::{DeviceRunner, RunRequest};
use simpler_onboard_programs::TEST_KERNELS;
use simpler_types::CallConfig;

/// The host builds: their directory, (func id, kernel object) per vector-example kernel (the
/// hanging kernel is built too but never run here), the C++ executor.
type Built = (tempfile::TempDir, Vec<(u32, PathBuf)>, PathBuf);

/// The host builds of the kernels and of the C++ executor, once per test process.
fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let kernels = simpler_onboard_programs::build_host_kernels(&dir.path().join("kernels"))
            .unwrap()
            .into_iter()
            .filter(|(k, _)| TEST_KERNELS.contains(k))
            .map(|(k, so)| (k.func_id, so))
            .collect();
        let exe =
            simpler_onboard_programs::build_host_executor(&dir.path().join("executor")).unwrap();
        (dir, kernels, exe)
    })
}

/// The vector example with the built kernels in place of its Rust ones.
fn vector_on_built_kernels() -> ChipCallable {
    use ArgDirection::{In, Out, Scalar};
    let mut b = ChipCallable::native(vector::orchestration, three_args)
        .names("vector_example", "vector_config")
        .signature(vec![In, In, Out]);
    for (func_id, so) in &built().1 {
        let signature =
            if *func_id == vector::ADD_SCALAR { vec![In, Out, Scalar] } else { vec![In, In, Out] };
        // SAFETY: the object is a test kernel of this project: no initializers, and its
        // `kernel_entry` has the kernel ABI and touches only its tensors' elements.
        let code = KernelCode::SharedObject(unsafe { SharedObjectKernel::new(so) });
        // SAFETY: the kernel is written for the signature it is paired with.
        b = b.kernel(*func_id, unsafe { CoreCallable::new(signature, code) });
    }
    b.build().unwrap()
}

fn run(r: &mut DeviceRunner, callable: &ChipCallable) {
    let slot = r.register_callable(callable).unwrap();
    let mut id = 1;
    for block_dim in [1, 3] {
        for threads in [2, 4] {
            let cfg = CallConfig::builder()
                .block_dim(block_dim)
                .aicpu_thread_num(threads)
                .build()
                .unwrap();
            let v = VectorRun::new(r, 128 * 128);
            r.run(&RunRequest::new(run_id(id), slot, &v.args, &cfg)).unwrap();
            v.check(r);
            v.free(r);
            id += 1;
        }
    }
    r.unregister_callable(slot).unwrap();
}

#[test]
fn the_kernel_set_is_the_vector_examples_func_ids() {
    let ids: Vec<u32> = TEST_KERNELS.iter().map(|k| k.func_id).collect();
    assert_eq!(ids, [vector::ADD, vector::ADD_SCALAR, vector::MUL]);
}

#[test]
fn the_vector_example_passes_its_golden_check_on_the_built_kernels() {
    let callable = vector_on_built_kernels();
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    run(&mut r, &callable);
    r.finalize().unwrap();
    // SAFETY: the host build of this workspace's C++ AICore executor, built by `built`.
    let mut r =
        DeviceRunner::attach(unsafe { options(0).with_aicore_executor(&built().2) }).unwrap();
    run(&mut r, &callable);
    r.finalize().unwrap();
}
