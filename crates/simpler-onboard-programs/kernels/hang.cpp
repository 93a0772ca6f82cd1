// A kernel that does not return on its own (the onboard case set's hanging kernel, registered
// in place of the vector example's func 1): it re-reads the first word of its tensor 0 until
// that word is non-zero, which nothing writes, so the op-execute watchdog ends it and the
// device is poisoned. Each read is a volatile load, after invalidating the line on the AICore,
// so the loop has a side effect in every round and never becomes undefined behaviour.
#include "kernel_abi.h"

SIMPLER_KERNEL_ENTRY {
    SimplerF32View x;
    if (!simpler_f32_view(args, 0, &x) || x.len == 0) {
        return;
    }
    volatile SIMPLER_GM uint32_t *word = reinterpret_cast<volatile SIMPLER_GM uint32_t *>(x.data);
    for (;;) {
        simpler_kernel_invalidate(x.data);
        if (*word != 0) {
            return;
        }
    }
}
