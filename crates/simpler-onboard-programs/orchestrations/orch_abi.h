// The chip orchestration ABI for C: what a tensormap_and_ringbuffer `DeviceObject`
// orchestration exports and the ops table it builds its graph through. Layouts match the
// runtime's `#[repr(C)]` types (`docs/device-chip.md`, "The orchestration API"); the static
// assertions below keep them honest.
#ifndef SIMPLER_ORCH_ABI_H
#define SIMPLER_ORCH_ABI_H

#include <stddef.h>
#include <stdint.h>

#define SIMPLER_ORCH_OPS_VERSION 1u
#define SIMPLER_ORCH_OK 0
#define SIMPLER_MAX_TENSOR_DIMS 5
#define SIMPLER_NO_FUNC (-1)

// Task shapes (`TaskShape`).
enum { SIMPLER_SHAPE_MIX = 0, SIMPLER_SHAPE_AIC = 1, SIMPLER_SHAPE_AIV = 2, SIMPLER_SHAPE_DUMMY = 3 };
// Access tags (`TensorArgType`).
enum {
    SIMPLER_TAG_INPUT = 0,
    SIMPLER_TAG_OUTPUT = 1,
    SIMPLER_TAG_INOUT = 2,
    SIMPLER_TAG_OUTPUT_EXISTING = 3,
    SIMPLER_TAG_NO_DEP = 4
};
// Element types (`DataType`), the one this file's helpers need.
enum { SIMPLER_DTYPE_FLOAT32 = 0 };

// The 128-byte tensor descriptor (`Tensor`).
typedef struct __attribute__((aligned(64))) SimplerTensor {
    uint64_t addr;
    uint64_t size;
    uint64_t owner_task_id;
    uint64_t start_offset;
    int32_t version;
    uint32_t ndims;
    uint8_t dtype;
    uint8_t manual_dep;
    uint8_t is_contiguous;
    uint8_t child_memory;
    uint32_t shapes[SIMPLER_MAX_TENSOR_DIMS];
    uint64_t extent_elems;
    uint32_t strides[SIMPLER_MAX_TENSOR_DIMS];
    uint8_t reserved[36];
} SimplerTensor;

_Static_assert(sizeof(SimplerTensor) == 128, "tensor descriptor size");
_Static_assert(offsetof(SimplerTensor, ndims) == 36, "ndims offset");
_Static_assert(offsetof(SimplerTensor, shapes) == 44, "shapes offset");
_Static_assert(offsetof(SimplerTensor, extent_elems) == 64, "extent offset");
_Static_assert(offsetof(SimplerTensor, strides) == 72, "strides offset");

// One submitted task (`SubmitDesc`).
typedef struct SimplerSubmitDesc {
    int32_t func_ids[3];  // AIC, AIV0, AIV1; SIMPLER_NO_FUNC = none
    uint32_t shape;
    uint32_t block_num;
    uint32_t num_tensors;
    uint32_t num_scalars;
    uint32_t reserved;
    const SimplerTensor *tensors;
    const int32_t *tags;
    const uint64_t *scalars;
} SimplerSubmitDesc;

_Static_assert(sizeof(SimplerSubmitDesc) == 56, "submit descriptor size");

// The ops table (`OrchOps`); every function takes the runtime context first. Statuses: 0 =
// success, negative = refused (the runtime latched the detail and reports it as the run's error).
typedef struct SimplerOrchOps {
    uint32_t version;
    int64_t (*submit)(void *rt, const SimplerSubmitDesc *desc);
    int32_t (*scope_begin)(void *rt);
    int32_t (*scope_end)(void *rt);
    int32_t (*alloc_tensors)(void *rt, SimplerTensor *tensors, uint32_t count);
    int32_t (*get_tensor_data)(void *rt, const SimplerTensor *t, uint8_t *dst, uint64_t len);
    int32_t (*set_tensor_data)(void *rt, const SimplerTensor *t, const uint8_t *src, uint64_t len);
    uint32_t (*available_clusters)(void *rt);
    uint32_t (*available_aiv_cores)(void *rt);
    void (*report_fatal)(void *rt, int32_t code, const uint8_t *msg, size_t len);
    void (*log)(void *rt, uint32_t level, const uint8_t *msg, size_t len);
} SimplerOrchOps;

// The chip entry's arguments (`COrchArgs`).
typedef struct SimplerOrchArgs {
    const SimplerTensor *tensors;
    const int32_t *tags;
    const uint64_t *scalars;
    uint32_t num_tensors;
    uint32_t num_scalars;
} SimplerOrchArgs;

// What an orchestration object exports, under the names its callable registers:
//   int32_t entry(const SimplerOrchOps *ops, void *rt, const SimplerOrchArgs *args);
//   uint32_t config(const SimplerOrchArgs *args);   // arguments the entry expects
typedef int32_t (*SimplerOrchEntry)(const SimplerOrchOps *, void *, const SimplerOrchArgs *);
typedef uint32_t (*SimplerOrchConfig)(const SimplerOrchArgs *);

// A descriptor for a fresh contiguous buffer of `like`'s shape and element type `dtype`, for
// `alloc_tensors` (address 0; the runtime places it).
static inline SimplerTensor simpler_tensor_like(const SimplerTensor *like, uint8_t dtype) {
    SimplerTensor t = {0};
    t.owner_task_id = UINT64_MAX;
    t.dtype = dtype;
    t.ndims = like->ndims;
    t.is_contiguous = 1;
    uint64_t stride = 1;
    for (uint32_t d = like->ndims; d-- > 0;) {
        t.shapes[d] = like->shapes[d];
        t.strides[d] = (uint32_t)stride;
        stride *= like->shapes[d];
    }
    t.extent_elems = stride;
    return t;
}

// An f32 scalar argument, in the low four bytes of its slot.
static inline uint64_t simpler_f32_scalar(float v) {
    union {
        float f;
        uint32_t u;
    } bits = {v};
    return bits.u;
}

#endif
