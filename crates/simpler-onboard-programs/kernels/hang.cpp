// A kernel that never returns (the onboard case set's hanging kernel, registered in place of
// the vector example's func 1): it re-reads its first argument slot forever, so only the
// op-execute watchdog ends it and the device is poisoned. The read is volatile, so every
// round has a side effect and the loop is not undefined behaviour.
#include "kernel_abi.h"

SIMPLER_KERNEL_ENTRY {
    volatile SIMPLER_GM int64_t *slot = args;
    for (;;) {
        (void)*slot;
    }
}
