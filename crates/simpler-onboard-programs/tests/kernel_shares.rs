//! The test kernels built for the host and called directly, one call per block and copy of a
//! task: each call writes exactly its share of the output (the cache lines the output touches,
//! split among blocks in order and again among the copies of a MIX block's kernel), so the calls
//! of one task never write the same element or the same 64-byte line, and together they write
//! every element.
#![cfg(feature = "host-build")]

use std::ops::Range;

use simpler_onboard_programs::{KERNEL_ENTRY, TEST_KERNELS, build_host_kernels};

type Entry = unsafe extern "C" fn(*mut i64);

/// What an untouched output element holds.
const SENTINEL: u32 = 0xffff_ffff;

/// A 128-byte descriptor of a contiguous rank-1 f32 view of `len` elements from element `start`
/// of `data`, at the
/// offsets the kernels read (`addr` 0, `start_offset` 24, `ndims` 36, `dtype` 40,
/// `is_contiguous` 42, `shapes` 44).
fn descriptor(data: *const f32, start: u64, len: u32) -> [u8; 128] {
    let mut d = [0u8; 128];
    d[0..8].copy_from_slice(&(data as u64).to_le_bytes());
    d[24..32].copy_from_slice(&start.to_le_bytes());
    d[36..40].copy_from_slice(&1u32.to_le_bytes());
    d[40] = 0; // f32
    d[42] = 1;
    d[44..48].copy_from_slice(&len.to_le_bytes());
    d
}

/// Bytes of a cache line of the AICore's data cache.
const LINE: u64 = 64;

/// Bound `part` of `n` things split into `parts` in order: `n · part / parts`.
fn bound(n: u64, part: u64, parts: u64) -> u64 {
    (u128::from(n) * u128::from(part) / u128::from(parts)) as u64
}

/// The elements call (`block`, `copy`) of a task of `blocks` × `copies` calls writes of `n`
/// f32 elements from address `first`: the elements inside its part of the view's cache lines.
fn share(
    first: u64,
    n: u64,
    (block, blocks): (u64, u64),
    (copy, copies): (u64, u64),
) -> Range<u64> {
    if n == 0 {
        return 0..0;
    }
    let lines = (first + 4 * n - 1) / LINE - first / LINE + 1;
    let line_start = |line: u64| {
        if line >= lines {
            return n;
        }
        let at = first / LINE * LINE + line * LINE;
        if at <= first { 0 } else { ((at - first) / 4).min(n) }
    };
    let b0 = bound(lines, block, blocks);
    let b_lines = bound(lines, block + 1, blocks) - b0;
    line_start(b0 + bound(b_lines, copy, copies))..line_start(b0 + bound(b_lines, copy + 1, copies))
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
        for n in [0u32, 1, 7, 17, 1001] {
            let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let y: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
            let want = |i: usize| match kernel.name {
                "add" => x[i] + y[i],
                "mul" => x[i] * y[i],
                _ => x[i] + 0.5,
            };
            // Output views starting on a cache line boundary (0, 16) and off one (3).
            for offset in [0u64, 3, 16] {
                for (blocks, copies) in [(1, 1), (2, 1), (3, 1), (4, 1), (1, 2), (2, 3), (3, 2)] {
                    let task = Task { n, offset, blocks, copies };
                    check_task(entry, scalar, &x, &y, &want, task, kernel.name);
                }
            }
        }
    }
}

/// One task's shape: `n` output elements from element `offset` of the output buffer, in
/// `blocks` blocks of `copies` copies each.
#[derive(Clone, Copy)]
struct Task {
    n: u32,
    offset: u64,
    blocks: u32,
    copies: u32,
}

/// Runs every call of `task` on one output buffer, each from an untouched buffer, and checks
/// that each writes exactly its share, that no element and no cache line is written by two
/// calls, and that together they write every element.
fn check_task(
    entry: Entry,
    scalar: bool,
    x: &[f32],
    y: &[f32],
    want: &dyn Fn(usize) -> f32,
    task: Task,
    name: &str,
) {
    let Task { n, offset, blocks, copies } = task;
    let mut out = vec![f32::from_bits(SENTINEL); n as usize + offset as usize + 32];
    // The view starts `offset` elements past the buffer's first cache line boundary.
    let start = (LINE - out.as_ptr() as u64 % LINE) % LINE / 4 + offset;
    let first = out.as_ptr() as u64 + 4 * start;
    let mut covered = vec![false; n as usize];
    let mut lines_written = std::collections::BTreeSet::new();
    for block in 0..blocks {
        for copy in 0..copies {
            out.fill(f32::from_bits(SENTINEL));
            let o = out.as_mut_ptr();
            let descs: Vec<[u8; 128]> = if scalar {
                vec![descriptor(x.as_ptr(), 0, n), descriptor(o, start, n)]
            } else {
                vec![
                    descriptor(x.as_ptr(), 0, n),
                    descriptor(y.as_ptr(), 0, n),
                    descriptor(o, start, n),
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
            // SAFETY: every slot the kernel reads is set: descriptors of views inside `x`, `y`
            // and `out` (the kernel writes only through the last, which `o` may write through),
            // which outlive the call, the scalar, and both contexts. Nothing else runs on them.
            unsafe { entry(args.as_mut_ptr()) };
            let mine = share(
                first,
                u64::from(n),
                (u64::from(block), u64::from(blocks)),
                (u64::from(copy), u64::from(copies)),
            );
            let mut lines = std::collections::BTreeSet::new();
            for (j, v) in out.iter().enumerate() {
                let what = format!(
                    "{name}: buffer element {j} (view from {offset}, {n} elements), block {block} of \
                     {blocks}, copy {copy} of {copies}"
                );
                let i = (j as u64).wrapping_sub(start);
                if i < u64::from(n) && mine.contains(&i) {
                    assert_eq!(*v, want(i as usize), "{what}");
                    assert!(!covered[i as usize], "{what} was written by an earlier call too");
                    covered[i as usize] = true;
                    lines.insert((first + 4 * i) / LINE);
                } else {
                    assert_eq!(v.to_bits(), SENTINEL, "{what} should be untouched");
                }
            }
            for line in lines {
                assert!(
                    lines_written.insert(line),
                    "{name}: {n} elements from {offset}, block {block} copy {copy}: cache line \
                     {line:#x} was written by an earlier call too"
                );
            }
        }
    }
    assert!(covered.iter().all(|&c| c), "{name}: {n} elements from {offset}, {blocks}×{copies}");
}
