// The kernel ABI as the test kernels see it (docs/onboard-programs.md, "Test kernels"): a kernel
// is `kernel_entry(args)`, where args[i] for i < T is the device address of the i-th tensor's
// 128-byte descriptor and args[T + j] the j-th scalar as a raw 64-bit word (value bytes low).
// This header maps the few things that differ between the AICore (ccec: `__CCE__`) and the host
// build the simulator loads: the global-memory qualifier, the entry's declaration and the write
// back of a kernel's output before it returns. Only what ccec accepts appears here.
#ifndef SIMPLER_KERNEL_ABI_H
#define SIMPLER_KERNEL_ABI_H

#include <stdint.h>

#if defined(__CCE__) && !defined(SIMPLER_KERNEL_HOST)
#define SIMPLER_GM __gm__
#define SIMPLER_KERNEL_ENTRY extern "C" __aicore__ void kernel_entry(__gm__ int64_t *args)
// The cache lines of [addr, addr + bytes) leave this core's data cache: written back if this
// core changed them, then dropped, and the write waited for. After it a load reads global
// memory, and global memory holds what this core stored.
static inline void simpler_cache_lines_out(uint64_t addr, uint64_t bytes) {
    uint64_t end = bytes > UINT64_MAX - addr ? UINT64_MAX : addr + bytes;
    for (uint64_t a = addr & ~63ull; a < end && a >= (addr & ~63ull); a += 64) {
        dcci(reinterpret_cast<__gm__ uint64_t *>(a), SINGLE_CACHE_LINE, CACHELINE_OUT);
    }
    dsb(DSB_DDR);
}
#else
#define SIMPLER_GM
#define SIMPLER_KERNEL_ENTRY \
    extern "C" __attribute__((visibility("default"))) void kernel_entry(int64_t *args)
// The host build's memory is coherent: nothing to write back or drop.
static inline void simpler_cache_lines_out(uint64_t, uint64_t) {}
#endif

// Before a kernel reads bytes another core or the AICPU wrote (a descriptor, an input, the
// neighbours sharing its output's first and last line), a line this core cached from an
// earlier task may hold their old values: drop it, so the loads see global memory.
static inline void simpler_kernel_fetch(const SIMPLER_GM void *data, uint64_t bytes) {
    simpler_cache_lines_out(reinterpret_cast<uint64_t>(data), bytes);
}

// A kernel's scalar stores sit in the data cache: write them back and wait for the write
// before the executor reports FIN, so a consumer reads them.
static inline void simpler_kernel_flush(SIMPLER_GM float *data, uint64_t len) {
    simpler_cache_lines_out(reinterpret_cast<uint64_t>(data), 4 * len);
}

// Tensor descriptor offsets.
#define SIMPLER_TENSOR_ADDR 0
#define SIMPLER_TENSOR_START_OFFSET 24
#define SIMPLER_TENSOR_NDIMS 36
#define SIMPLER_TENSOR_DTYPE 40
#define SIMPLER_TENSOR_IS_CONTIGUOUS 42
#define SIMPLER_TENSOR_SHAPES 44
#define SIMPLER_DTYPE_FLOAT32 0
#define SIMPLER_TENSOR_DESCRIPTOR_BYTES 128

// A contiguous f32 view: its first element and its element count.
struct SimplerF32View {
    SIMPLER_GM float *data;
    uint64_t len;
};

// Tensor `i` as a contiguous f32 view; false (the kernel then writes nothing) for a null
// descriptor, another dtype, a strided view, a rank outside 1..5, a first element not 4-byte
// aligned or a view whose bytes would run past the end of the address space.
static inline bool simpler_f32_view(SIMPLER_GM int64_t *args, uint32_t i, SimplerF32View *view) {
    uint64_t desc = static_cast<uint64_t>(args[i]);
    if (desc == 0) {
        return false;
    }
    SIMPLER_GM uint8_t *d = reinterpret_cast<SIMPLER_GM uint8_t *>(desc);
    simpler_kernel_fetch(d, SIMPLER_TENSOR_DESCRIPTOR_BYTES);
    uint64_t addr = *reinterpret_cast<SIMPLER_GM uint64_t *>(d + SIMPLER_TENSOR_ADDR);
    uint64_t start = *reinterpret_cast<SIMPLER_GM uint64_t *>(d + SIMPLER_TENSOR_START_OFFSET);
    uint32_t ndims = *reinterpret_cast<SIMPLER_GM uint32_t *>(d + SIMPLER_TENSOR_NDIMS);
    if (addr == 0 || d[SIMPLER_TENSOR_DTYPE] != SIMPLER_DTYPE_FLOAT32 ||
        d[SIMPLER_TENSOR_IS_CONTIGUOUS] == 0 || ndims < 1 || ndims > 5) {
        return false;
    }
    uint64_t len = 1;
    for (uint32_t k = 0; k < ndims; ++k) {
        uint64_t extent = *reinterpret_cast<SIMPLER_GM uint32_t *>(d + SIMPLER_TENSOR_SHAPES + 4 * k);
        if (extent != 0 && len > UINT64_MAX / 4 / extent) {
            return false;
        }
        len *= extent;
    }
    if (start > (UINT64_MAX - addr) / 4) {
        return false;
    }
    uint64_t first = addr + start * 4;
    if (first % 4 != 0 || len * 4 > UINT64_MAX - first) {
        return false;
    }
    view->data = reinterpret_cast<SIMPLER_GM float *>(first);
    view->len = len;
    return true;
}

// Scalar `j` of a kernel with `tensors` tensors, as an f32 (its value bytes are the low four).
static inline float simpler_f32_scalar(SIMPLER_GM int64_t *args, uint32_t tensors, uint32_t j) {
    union {
        uint32_t bits;
        float value;
    } u;
    u.bits = static_cast<uint32_t>(static_cast<uint64_t>(args[tensors + j]));
    return u.value;
}

static inline uint64_t simpler_min(uint64_t a, uint64_t b) { return a < b ? a : b; }

// Slots 48 and 49 hold the addresses of the dispatch's contexts: the local one starts with the
// block's index and the task's block count (u32 each), the global one holds, at bytes 4 and 6,
// the index of this copy of the kernel among the members of its block that run it and their
// count (u16 each; 0 counts as 1).
#define SIMPLER_LOCAL_CONTEXT_SLOT 48
#define SIMPLER_GLOBAL_CONTEXT_SLOT 49

// Bound `part` of `n` things split into `parts` in order: floor(n · part / parts), computed
// without overflow (n = q · parts + r, r < parts).
static inline uint64_t simpler_part_bound(uint64_t n, uint64_t part, uint64_t parts) {
    uint64_t q = n / parts, r = n % parts;
    return q * part + r * part / parts;
}

// Bytes of one line of an AICore's data cache: a store fills the whole line in the core's
// cache and the write-back stores the whole line, so two cores must never write one line.
#define SIMPLER_CACHE_LINE 64

// The first element of the f32 view at `view` (4-byte aligned, n elements over `lines` cache
// lines) at or after the start of its `line`-th cache line (line 0 holds its first element); n
// from the line past its last on.
static inline uint64_t simpler_line_start(uint64_t view, uint64_t n, uint64_t line, uint64_t lines) {
    if (line >= lines) {
        return n;
    }
    uint64_t at = (view & ~static_cast<uint64_t>(SIMPLER_CACHE_LINE - 1)) + line * SIMPLER_CACHE_LINE;
    if (at <= view) {
        return 0;
    }
    uint64_t e = (at - view) / 4;
    return e < n ? e : n;
}

struct SimplerShare {
    uint64_t begin;
    uint64_t end;
};

// The elements of `view` (n elements from its first) this call writes. The cache lines the
// view touches are split among the calls of the task, blocks in order and then the copies of
// the kernel in one MIX block, each taking the elements inside its lines: no two calls write
// one element or one cache line, and together they write all n. A call outside its task's
// blocks or copies writes nothing.
static inline SimplerShare simpler_share(SIMPLER_GM int64_t *args, SIMPLER_GM float *view, uint64_t n) {
    SIMPLER_GM uint8_t *local =
        reinterpret_cast<SIMPLER_GM uint8_t *>(static_cast<uint64_t>(args[SIMPLER_LOCAL_CONTEXT_SLOT]));
    SIMPLER_GM uint8_t *global =
        reinterpret_cast<SIMPLER_GM uint8_t *>(static_cast<uint64_t>(args[SIMPLER_GLOBAL_CONTEXT_SLOT]));
    uint64_t block = 0, blocks = 1, copy = 0, copies = 1;
    if (local != 0) {
        block = *reinterpret_cast<SIMPLER_GM uint32_t *>(local);
        blocks = *reinterpret_cast<SIMPLER_GM uint32_t *>(local + 4);
    }
    if (global != 0) {
        copy = *reinterpret_cast<SIMPLER_GM uint16_t *>(global + 4);
        copies = *reinterpret_cast<SIMPLER_GM uint16_t *>(global + 6);
    }
    blocks = blocks == 0 ? 1 : blocks;
    copies = copies == 0 ? 1 : copies;
    SimplerShare s = {0, 0};
    if (n == 0 || block >= blocks || copy >= copies) {
        return s;
    }
    // The view's bytes fit the address space (`simpler_f32_view`), so its last byte does too.
    uint64_t first = reinterpret_cast<uint64_t>(view);
    uint64_t lines = (first + 4 * n - 1) / SIMPLER_CACHE_LINE - first / SIMPLER_CACHE_LINE + 1;
    uint64_t b0 = simpler_part_bound(lines, block, blocks);
    uint64_t b_lines = simpler_part_bound(lines, block + 1, blocks) - b0;
    s.begin = simpler_line_start(first, n, b0 + simpler_part_bound(b_lines, copy, copies), lines);
    s.end = simpler_line_start(first, n, b0 + simpler_part_bound(b_lines, copy + 1, copies), lines);
    return s;
}

#endif
