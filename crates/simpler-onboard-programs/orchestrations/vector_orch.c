// The vector programs as C orchestrations, chip arguments a (in), b (in), f (out) over f32:
// - vector_example: f = (a + b + 1)(a + b + 2) + (a + b) in five AIV tasks (func 0:
//   out = x + y, func 1: out = x + s, func 2: out = x * y) over four intermediate buffers of
//   a's shape;
// - vector_add: f = a + b in one AIV task (func 0).
#include "orch_abi.h"

enum { ADD = 0, ADD_SCALAR = 1, MUL = 2 };

static int64_t submit_aiv(const SimplerOrchOps *ops, void *rt, int32_t func,
                          const SimplerTensor *t0, int32_t tag0, const SimplerTensor *t1,
                          int32_t tag1, const SimplerTensor *t2, int32_t tag2,
                          const uint64_t *scalar) {
    SimplerTensor tensors[3] = {*t0, *t1, t2 != NULL ? *t2 : *t1};
    int32_t tags[3] = {tag0, tag1, tag2};
    SimplerSubmitDesc d = {
        .func_ids = {SIMPLER_NO_FUNC, func, SIMPLER_NO_FUNC},
        .shape = SIMPLER_SHAPE_AIV,
        .block_num = 1,
        .num_tensors = t2 != NULL ? 3u : 2u,
        .num_scalars = scalar != NULL ? 1u : 0u,
        .tensors = tensors,
        .tags = tags,
        .scalars = scalar,
    };
    return ops->submit(rt, &d);
}

uint32_t vector_config(const SimplerOrchArgs *args) {
    (void)args;
    return 3;
}

int32_t vector_example(const SimplerOrchOps *ops, void *rt, const SimplerOrchArgs *args) {
    if (ops->version != SIMPLER_ORCH_OPS_VERSION || args->num_tensors < 3) return -1;
    const SimplerTensor *a = &args->tensors[0], *b = &args->tensors[1], *f = &args->tensors[2];
    SimplerTensor tmp[4];
    for (int i = 0; i < 4; ++i) tmp[i] = simpler_tensor_like(a, SIMPLER_DTYPE_FLOAT32);
    int32_t st = ops->alloc_tensors(rt, tmp, 4);
    if (st != SIMPLER_ORCH_OK) return st;
    const SimplerTensor *c = &tmp[0], *d = &tmp[1], *e = &tmp[2], *g = &tmp[3];
    const uint64_t one = simpler_f32_scalar(1.0f), two = simpler_f32_scalar(2.0f);
    const int32_t IN = SIMPLER_TAG_INPUT, OUT = SIMPLER_TAG_OUTPUT;
    // One submit after another: the submit order is the dependency order.
    int64_t r = submit_aiv(ops, rt, ADD, a, IN, b, IN, c, OUT, NULL);
    if (r >= 0) r = submit_aiv(ops, rt, ADD_SCALAR, c, IN, d, OUT, NULL, 0, &one);
    if (r >= 0) r = submit_aiv(ops, rt, ADD_SCALAR, c, IN, e, OUT, NULL, 0, &two);
    if (r >= 0) r = submit_aiv(ops, rt, MUL, d, IN, e, IN, g, OUT, NULL);
    if (r >= 0) r = submit_aiv(ops, rt, ADD, g, IN, c, IN, f, OUT, NULL);
    if (r < 0) return (int32_t)r;
    return SIMPLER_ORCH_OK;
}

int32_t vector_add(const SimplerOrchOps *ops, void *rt, const SimplerOrchArgs *args) {
    if (ops->version != SIMPLER_ORCH_OPS_VERSION || args->num_tensors < 3) return -1;
    const SimplerTensor *t = args->tensors;
    int64_t r = submit_aiv(ops, rt, ADD, &t[0], SIMPLER_TAG_INPUT, &t[1], SIMPLER_TAG_INPUT,
                           &t[2], SIMPLER_TAG_OUTPUT, NULL);
    return r < 0 ? (int32_t)r : SIMPLER_ORCH_OK;
}
