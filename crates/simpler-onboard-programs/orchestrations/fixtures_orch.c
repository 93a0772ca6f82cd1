// Orchestration fixtures for the runtime's error paths, linked into the same object as the
// vector example.
#include "orch_abi.h"

// A config asking for one argument more than the vector example's three.
uint32_t four_args_config(const SimplerOrchArgs *args) {
    (void)args;
    return 4;
}

// An entry that submits nothing and fails with status 7.
int32_t failing_entry(const SimplerOrchOps *ops, void *rt, const SimplerOrchArgs *args) {
    (void)ops;
    (void)rt;
    (void)args;
    return 7;
}
