// Host mapping of the AICore platform onto the simulator: the register window is the core's
// simulated register block (registers at their MMIO offsets, atomic words), image memory is
// host memory, and everything that needs the simulator (parking, wakeups, the fault plan, the
// kernel call with its panic boundary) is a callback in the environment the simulator passes.
// The layout of simpler_core_env is mirrored by the simulator; change both together.
#ifndef SIMPLER_AICORE_PLATFORM_HOST_H
#define SIMPLER_AICORE_PLATFORM_HOST_H

#include <stdint.h>

extern "C" {
struct simpler_core_env {
    const void *ctx;
    uint64_t window;            // register window base
    uint64_t handshake;         // this core's handshake record
    uint64_t swimlane_header;   // this core's swimlane header (0 = swimlane off)
    uint64_t swimlane_records;  // its records
    uint32_t swimlane_capacity;
    uint32_t core_index;
    uint32_t core_type;
    uint32_t physical_core_id;
    uint64_t (*epoch)(const void *ctx);
    void (*idle)(const void *ctx, uint64_t observed, uint32_t round);
    uint32_t (*should_stop)(const void *ctx);
    void (*write_cond)(const void *ctx, uint32_t value);
    uint64_t (*counter)(const void *ctx);
    void (*report_in)(const void *ctx);
    int32_t (*call_kernel)(const void *ctx, uint64_t kernel, uint32_t func_id, uint64_t task_id,
                           int64_t *args);
};
}

typedef const simpler_core_env PlatEnv;

static inline uint32_t plat_read_reg(PlatEnv *env, uint32_t off) {
    return __atomic_load_n(reinterpret_cast<uint32_t *>(env->window + off), __ATOMIC_ACQUIRE);
}
static inline void plat_write_cond(PlatEnv *env, uint32_t v) { env->write_cond(env->ctx, v); }
static inline uint64_t plat_epoch(PlatEnv *env) { return env->epoch(env->ctx); }
static inline void plat_idle(PlatEnv *env, uint64_t epoch, uint32_t round) {
    env->idle(env->ctx, epoch, round);
}
static inline bool plat_should_stop(PlatEnv *env) { return env->should_stop(env->ctx) != 0; }
static inline uint64_t plat_counter(PlatEnv *env) { return env->counter(env->ctx); }
static inline void plat_report_in(PlatEnv *env) { env->report_in(env->ctx); }
static inline int32_t plat_call_kernel(PlatEnv *env, uint64_t kernel, uint32_t func_id,
                                       uint64_t task_id, int64_t *args) {
    return env->call_kernel(env->ctx, kernel, func_id, task_id, args);
}
static inline void plat_store_u32_release(uint64_t addr, uint32_t v) {
    __atomic_store_n(reinterpret_cast<uint32_t *>(addr), v, __ATOMIC_RELEASE);
}
static inline void plat_store_u32_relaxed(uint64_t addr, uint32_t v) {
    __atomic_store_n(reinterpret_cast<uint32_t *>(addr), v, __ATOMIC_RELAXED);
}
static inline uint32_t plat_load_u32_relaxed(uint64_t addr) {
    return __atomic_load_n(reinterpret_cast<uint32_t *>(addr), __ATOMIC_RELAXED);
}
static inline uint64_t plat_load_u64_acquire(uint64_t addr) {
    return __atomic_load_n(reinterpret_cast<uint64_t *>(addr), __ATOMIC_ACQUIRE);
}
static inline void plat_invalidate(uint64_t, uint64_t) {}

#define SIMPLER_AICORE_ENTRY extern "C" __attribute__((visibility("default")))

#endif
