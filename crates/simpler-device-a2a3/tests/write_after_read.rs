//! Write-after-read ordering on the simulated chip: bgemm's product and accumulate kernels with
//! one scratch tile per output tile, shared by all its products. Product `k + 1` overwrites the
//! scratch tile that accumulation `k` reads, so the result is right only if every write waits
//! for the earlier readers of its bytes.

mod common;

use common::*;
use simpler_device_a2a3::programs::bgemm::{self, ACC, GEMM, TILE, TILES};
use simpler_device_a2a3::{
    ChipCallable, ChipSlot, DeviceRunner, Kernels, OrchArgs, OrchCtx, OrchError, RunRequest,
    RuntimeVariant,
};
use simpler_types::{CallConfig, CoreArgs, DataType, RunId, TaskArgs, Tensor, TensorArgType};

fn orch_error() -> OrchError {
    OrchError::from_status(-1)
}

fn core_args(tensors: &[(Tensor, TensorArgType)]) -> Result<CoreArgs, OrchError> {
    let mut args = CoreArgs::new();
    for (t, tag) in tensors {
        args.add_tensor(*t, *tag).map_err(|_| orch_error())?;
    }
    Ok(args)
}

/// `C += A·B` like `bgemm::orchestration`, but the products of one output tile all write one
/// shared scratch tile (`Output`) that its accumulations read (`Input`).
fn shared_scratch_orchestration(
    ctx: &mut OrchCtx<'_>,
    args: &OrchArgs<'_>,
) -> Result<(), OrchError> {
    use TensorArgType::{InOut, Input, Output};
    let (Some(a), Some(b), Some(c)) = (args.tensor(0), args.tensor(1), args.tensor(2)) else {
        return Err(orch_error());
    };
    let t = TILE as u32;
    let tile = |m: &Tensor, r: u32, col: u32| {
        m.view(&[1, 1, t, t], &[r, col, 0, 0]).map_err(|_| orch_error())
    };
    for i in 0..TILES as u32 {
        for j in 0..TILES as u32 {
            let scratch = ctx.alloc_tensor(&[1, 1, t, t], DataType::Float32)?;
            for k in 0..TILES as u32 {
                let product = [(tile(a, i, k)?, Input), (tile(b, k, j)?, Input), (scratch, Output)];
                ctx.submit(Kernels::Aic(GEMM), &core_args(&product)?)?;
                let acc = [(tile(c, i, j)?, InOut), (scratch, Input)];
                ctx.submit(Kernels::Aiv(ACC), &core_args(&acc)?)?;
            }
        }
    }
    Ok(())
}

fn shared_scratch_callable() -> ChipCallable {
    let reference = bgemm::callable().unwrap();
    let mut builder = ChipCallable::native(shared_scratch_orchestration, three_args)
        .names("bgemm_shared_scratch", "bgemm_shared_scratch_config")
        .signature(reference.signature().to_vec());
    for (func_id, kernel) in reference.children() {
        builder = builder.kernel(*func_id, kernel.clone());
    }
    builder.build().unwrap()
}

/// Block dims from one to the platform's maximum, with the uneven ones in between.
const BLOCK_DIMS: [u32; 7] = [1, 2, 3, 5, 8, 13, simpler_device_a2a3::abi::MAX_BLOCK_DIM];

/// Uploads two fixed matrices and a zeroed result, runs the callable in `slot` as run `run` on
/// `block_dim` blocks and `threads` AICPU threads, and checks the result against the host
/// reference.
fn check_bgemm(r: &mut DeviceRunner, slot: ChipSlot, run: u64, block_dim: u32, threads: u32) {
    let n = bgemm::N * bgemm::N;
    let a: Vec<f32> = (0..n).map(|x| ((x * 7) % 13) as f32 * 0.125).collect();
    let b: Vec<f32> = (0..n).map(|x| ((x * 5) % 11) as f32 * 0.25).collect();
    let expected = bgemm::tile_major(&bgemm::reference(&a, &b));
    let scale = expected.iter().fold(1f32, |m, v| m.max(v.abs()));
    let shape = bgemm::shape();
    let cfg = CallConfig::builder().block_dim(block_dim).aicpu_thread_num(threads).build().unwrap();
    let mut ptrs = Vec::new();
    let mut args = TaskArgs::new();
    for (values, tag) in [
        (bgemm::tile_major(&a), TensorArgType::Input),
        (bgemm::tile_major(&b), TensorArgType::Input),
        (vec![0.0; n], TensorArgType::InOut),
    ] {
        let (p, flat) = upload_f32(r, &values);
        let t = Tensor::external(flat.addr, &shape, DataType::Float32).unwrap().child_memory(true);
        args.add_tensor(t, tag).unwrap();
        ptrs.push(p);
    }
    let req = RunRequest::new(RunId::from_raw(run).unwrap(), slot, &args, &cfg);
    r.run(&req).unwrap();
    let got = download_f32(r, ptrs[2], n);
    for p in ptrs {
        r.free(p).unwrap();
    }
    let max_err = got.iter().zip(&expected).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
    assert!(
        max_err <= 1e-5 * scale,
        "block_dim {block_dim}, {threads} AICPU threads: max error {max_err} (scale {scale})"
    );
}

/// The AICPU thread counts to run `block_dim` (the `i`-th of [`BLOCK_DIMS`]) with: one, in
/// turn, so that each count meets small and large block dims; every count with
/// `SIMPLER_BGEMM_ALL_THREADS=1` (each run takes seconds in a debug build). The counts are one
/// to four, two to four under tensormap_and_ringbuffer, where one thread orchestrates.
fn thread_counts(i: usize, offset: usize) -> Vec<u32> {
    let least = if runtime_under_test() == RuntimeVariant::TensormapAndRingbuffer { 2 } else { 1 };
    let counts = 5 - least;
    if std::env::var_os("SIMPLER_BGEMM_ALL_THREADS").is_some_and(|v| v == "1") {
        (least..=4).collect()
    } else {
        vec![least + ((i + offset) % counts as usize) as u32]
    }
}

#[test]
fn products_sharing_a_scratch_tile_wait_for_the_accumulation_reading_it() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&shared_scratch_callable()).unwrap();
    let mut run = 1;
    for (i, block_dim) in BLOCK_DIMS.into_iter().enumerate() {
        for threads in thread_counts(i, 0) {
            check_bgemm(&mut r, slot, run, block_dim, threads);
            run += 1;
        }
    }
    r.finalize().unwrap();
}

#[test]
fn the_reference_bgemm_program_is_right_on_every_block_dim() {
    let mut r = DeviceRunner::attach(options(0)).unwrap();
    let slot = r.register_callable(&bgemm::callable().unwrap()).unwrap();
    let mut run = 1;
    for (i, block_dim) in BLOCK_DIMS.into_iter().enumerate() {
        // Offset by two from the shared-scratch test, so each block dim meets two counts.
        for threads in thread_counts(i, 2) {
            check_bgemm(&mut r, slot, run, block_dim, threads);
            run += 1;
        }
    }
    r.finalize().unwrap();
}
