//! The test kernels built for the host and called directly, one call per block and copy of a
//! task: each call writes exactly its share of the output (blocks split the elements in order,
//! the copies of a MIX block's kernel split their block's part again), so the calls of one task
//! never write the same element, and together they write every one.
#![cfg(feature = "host-build")]

use std::ops::Range;

use simpler_onboard_programs::{KERNEL_ENTRY, TEST_KERNELS, build_host_kernels};

type Entry = unsafe extern "C" fn(*mut i64);

/// What an untouched output element holds.
const SENTINEL: u32 = 0xffff_ffff;

/// A 128-byte descriptor of a contiguous rank-1 f32 view of `len` elements at `data`, at the
/// offsets the kernels read (`addr` 0, `start_offset` 24, `ndims` 36, `dtype` 40,
/// `is_contiguous` 42, `shapes` 44).
fn descriptor(data: *const f32, len: u32) -> [u8; 128] {
    let mut d = [0u8; 128];
    d[0..8].copy_from_slice(&(data as u64).to_le_bytes());
    d[36..40].copy_from_slice(&1u32.to_le_bytes());
    d[40] = 0; // f32
    d[42] = 1;
    d[44..48].copy_from_slice(&len.to_le_bytes());
    d
}

/// Part `part` of `parts` of `0..n`, as the kernels split: from `n · part / parts` on.
fn part(n: u64, part: u64, parts: u64) -> Range<u64> {
    let bound = |p: u64| (u128::from(n) * u128::from(p) / u128::from(parts)) as u64;
    bound(part)..bound(part + 1)
}

/// The elements call (`block`, `copy`) of a task of `blocks` × `copies` calls writes.
fn share(n: u64, (block, blocks): (u64, u64), (copy, copies): (u64, u64)) -> Range<u64> {
    let b = part(n, block, blocks);
    let c = part(b.end - b.start, copy, copies);
    b.start + c.start..b.start + c.end
}

/// The local context (block index, block count, async context) and the global one (sub-block,
/// copy index and count, DMA workspace) of one call.
#[repr(C)]
struct Contexts {
    local: [u32; 4],
    global: [u32; 6],
}

#[test]
fn each_call_of_a_task_writes_exactly_its_share_of_a_test_kernels_output() {
    let dir = tempfile::tempdir().unwrap();
    let built = build_host_kernels(dir.path()).unwrap();
    for (kernel, so) in built.iter().filter(|(k, _)| TEST_KERNELS.contains(k)) {
        // SAFETY: a test kernel of this project built just now: no initializers.
        let lib = unsafe { libloading::Library::new(so) }.unwrap();
        // SAFETY: `kernel_entry` has the kernel ABI's signature `void (int64_t *)`.
        let entry: Entry = *unsafe { lib.get::<Entry>(KERNEL_ENTRY.as_bytes()) }.unwrap();
        let scalar = kernel.name == "add_scalar";
        for n in [0u32, 1, 7, 1001] {
            let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let y: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
            let want = |i: usize| match kernel.name {
                "add" => x[i] + y[i],
                "mul" => x[i] * y[i],
                _ => x[i] + 0.5,
            };
            for (blocks, copies) in [(1, 1), (2, 1), (3, 1), (4, 1), (1, 2), (2, 3), (3, 2)] {
                let mut covered = vec![false; n as usize];
                for block in 0..blocks {
                    for copy in 0..copies {
                        let out = vec![f32::from_bits(SENTINEL); n as usize];
                        let descs: Vec<[u8; 128]> = if scalar {
                            vec![descriptor(x.as_ptr(), n), descriptor(out.as_ptr(), n)]
                        } else {
                            vec![
                                descriptor(x.as_ptr(), n),
                                descriptor(y.as_ptr(), n),
                                descriptor(out.as_ptr(), n),
                            ]
                        };
                        let contexts = Contexts {
                            local: [block, blocks, 0, 0],
                            global: [0, copy | (copies << 16), 0, 0, 0, 0],
                        };
                        let mut args = [0i64; 50];
                        for (i, d) in descs.iter().enumerate() {
                            args[i] = d.as_ptr() as i64;
                        }
                        if scalar {
                            args[2] = i64::from(0.5f32.to_bits());
                        }
                        args[48] = std::ptr::from_ref(&contexts.local) as i64;
                        args[49] = std::ptr::from_ref(&contexts.global) as i64;
                        // SAFETY: every slot the kernel reads is set: descriptors of views
                        // inside `x`, `y` and `out`, which outlive the call, the scalar, and
                        // both contexts. Nothing else runs on these buffers.
                        unsafe { entry(args.as_mut_ptr()) };
                        let mine = share(
                            u64::from(n),
                            (u64::from(block), u64::from(blocks)),
                            (u64::from(copy), u64::from(copies)),
                        );
                        for (i, v) in out.iter().enumerate() {
                            let what = format!(
                                "{}: element {i} of {n}, block {block} of {blocks}, copy {copy} \
                                 of {copies}",
                                kernel.name
                            );
                            if mine.contains(&(i as u64)) {
                                assert_eq!(*v, want(i), "{what}");
                                assert!(!covered[i], "{what} was written by an earlier call too");
                                covered[i] = true;
                            } else {
                                assert_eq!(v.to_bits(), SENTINEL, "{what} should be untouched");
                            }
                        }
                    }
                }
                assert!(
                    covered.iter().all(|&c| c),
                    "{}: {n} elements, {blocks}×{copies}",
                    kernel.name
                );
            }
        }
    }
}
