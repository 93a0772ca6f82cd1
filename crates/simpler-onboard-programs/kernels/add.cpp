// `out = x + y` over f32 (the vector example's func 0): tensors x (in), y (in), out (out).
// Elements beyond the shortest view are left alone; each block (and each copy of the kernel in a
// MIX block) writes its own part of the rest (`simpler_share`).
#include "kernel_abi.h"

SIMPLER_KERNEL_ENTRY {
    SimplerF32View x, y, out;
    if (!simpler_f32_view(args, 0, &x) || !simpler_f32_view(args, 1, &y) ||
        !simpler_f32_view(args, 2, &out)) {
        return;
    }
    uint64_t n = simpler_min(out.len, simpler_min(x.len, y.len));
    SimplerShare part = simpler_share(args, out.data, n);
    simpler_kernel_fetch(x.data + part.begin, 4 * (part.end - part.begin));
    simpler_kernel_fetch(y.data + part.begin, 4 * (part.end - part.begin));
    simpler_kernel_fetch(out.data + part.begin, 4 * (part.end - part.begin));
    for (uint64_t i = part.begin; i < part.end; ++i) {
        out.data[i] = x.data[i] + y.data[i];
    }
    simpler_kernel_flush(out.data + part.begin, part.end - part.begin);
}
