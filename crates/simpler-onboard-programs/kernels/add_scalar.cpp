// `out = x + s` over f32 with an f32 scalar s (the vector example's func 1): tensors x (in),
// out (out), then the scalar.
#include "kernel_abi.h"

SIMPLER_KERNEL_ENTRY {
    SimplerF32View x, out;
    if (!simpler_f32_view(args, 0, &x) || !simpler_f32_view(args, 1, &out)) {
        return;
    }
    float s = simpler_f32_scalar(args, 2, 0);
    uint64_t n = simpler_min(out.len, x.len);
    SimplerShare part = simpler_share(args, out.data, n);
    simpler_kernel_fetch(x.data + part.begin, 4 * (part.end - part.begin));
    simpler_kernel_fetch(out.data + part.begin, 4 * (part.end - part.begin));
    for (uint64_t i = part.begin; i < part.end; ++i) {
        out.data[i] = x.data[i] + s;
    }
    simpler_kernel_flush(out.data + part.begin, part.end - part.begin);
}
