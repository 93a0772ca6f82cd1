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

// Submits f = a + b over the first three arguments as one AIV task naming `func_ids`.
static int64_t submit_add(const SimplerOrchOps *ops, void *rt, const SimplerOrchArgs *args,
                          int32_t aic, int32_t aiv, int32_t aiv2) {
    const SimplerTensor *t = args->tensors;
    SimplerTensor tensors[3] = {t[0], t[1], t[2]};
    int32_t tags[3] = {SIMPLER_TAG_INPUT, SIMPLER_TAG_INPUT, SIMPLER_TAG_OUTPUT};
    SimplerSubmitDesc d = {
        .func_ids = {aic, aiv, aiv2},
        .shape = SIMPLER_SHAPE_AIV,
        .block_num = 1,
        .num_tensors = 3,
        .num_scalars = 0,
        .tensors = tensors,
        .tags = tags,
        .scalars = NULL,
    };
    return ops->submit(rt, &d);
}

// Room for `waiting_add`'s read of f (f32, at most 16384 elements). One per thread: the object
// is loaded once per process, and the runs of several runners may be inside it at once.
static _Thread_local uint8_t waiting_add_copy[16384 * 4];

// f = a + b (func 0), then a read of f, which waits for that task: an entry that is still
// running inside the object while its task executes.
int32_t waiting_add(const SimplerOrchOps *ops, void *rt, const SimplerOrchArgs *args) {
    if (ops->version != SIMPLER_ORCH_OPS_VERSION || args->num_tensors < 3) return -1;
    int64_t r = submit_add(ops, rt, args, SIMPLER_NO_FUNC, 0, SIMPLER_NO_FUNC);
    if (r < 0) return (int32_t)r;
    const SimplerTensor *t = args->tensors;
    uint64_t bytes = t[2].extent_elems * 4;
    if (bytes > sizeof waiting_add_copy) return -1;
    return ops->get_tensor_data(rt, &t[2], waiting_add_copy, bytes);
}

// f = a + b as an AIV task (func 0) whose AIC and second AIV slots name func 0 too instead of
// SIMPLER_NO_FUNC: a descriptor the runtime must refuse, since only the AIV kernel would run.
int32_t aiv_with_extra_kernels(const SimplerOrchOps *ops, void *rt, const SimplerOrchArgs *args) {
    if (ops->version != SIMPLER_ORCH_OPS_VERSION || args->num_tensors < 3) return -1;
    int64_t r = submit_add(ops, rt, args, 0, 0, 0);
    return r < 0 ? (int32_t)r : SIMPLER_ORCH_OK;
}
