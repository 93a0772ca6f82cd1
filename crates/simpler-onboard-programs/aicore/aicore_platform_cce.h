// AICore mapping of the platform (ccec, `--cce-aicore-only`): registers are special-purpose
// registers read and written with the CCE register intrinsics, image memory is global memory
// (`__gm__`), cache lines another agent wrote are dropped with `dcci`, the counter is the system
// cycle counter. There is nobody to wake or park on: plat_idle is a no-op spin and the launch is
// torn down by the device, not by a flag. This header is compiled only by
// `cargo xtask build --platform a2a3` on a server with CANN; the host build of the executor uses
// aicore_platform_host.h instead.
#ifndef SIMPLER_AICORE_PLATFORM_CCE_H
#define SIMPLER_AICORE_PLATFORM_CCE_H

#include <stdint.h>

struct simpler_core_env {
    uint64_t handshake;
    uint64_t swimlane_header;
    uint64_t swimlane_records;
    uint32_t swimlane_capacity;
    uint32_t core_index;
    uint32_t core_type;
    uint32_t physical_core_id;
};

typedef const simpler_core_env PlatEnv;

// Register offsets name control registers; the CCE intrinsics address them by SPR number.
static inline uint32_t plat_read_reg(PlatEnv *, uint32_t off) {
    uint64_t v = (off == 0xA4) ? (get_data_main_base() >> 32) : get_data_main_base();
    return static_cast<uint32_t>(v);
}
static inline void plat_write_cond(PlatEnv *, uint32_t v) {
    pipe_barrier(PIPE_ALL);
    set_cond(v);
}
static inline uint64_t plat_epoch(PlatEnv *) { return 0; }
static inline void plat_idle(PlatEnv *, uint64_t, uint32_t) {}
static inline bool plat_should_stop(PlatEnv *) { return false; }
static inline uint64_t plat_counter(PlatEnv *) { return get_sys_cnt(); }
static inline void plat_report_in(PlatEnv *) {}
typedef void (*simpler_kernel_fn)(__gm__ int64_t *args);
static inline int32_t plat_call_kernel(PlatEnv *, uint64_t kernel, uint32_t, uint64_t,
                                       int64_t *args) {
    reinterpret_cast<simpler_kernel_fn>(kernel)(reinterpret_cast<__gm__ int64_t *>(args));
    return 0;
}
static inline void plat_store_u32_release(uint64_t addr, uint32_t v) {
    pipe_barrier(PIPE_ALL);
    *reinterpret_cast<__gm__ volatile uint32_t *>(addr) = v;
    dcci(reinterpret_cast<__gm__ uint64_t *>(addr), SINGLE_CACHE_LINE);
}
static inline void plat_store_u32_relaxed(uint64_t addr, uint32_t v) {
    *reinterpret_cast<__gm__ volatile uint32_t *>(addr) = v;
}
static inline uint32_t plat_load_u32_relaxed(uint64_t addr) {
    return *reinterpret_cast<__gm__ volatile uint32_t *>(addr);
}
static inline uint64_t plat_load_u64_acquire(uint64_t addr) {
    dcci(reinterpret_cast<__gm__ uint64_t *>(addr), SINGLE_CACHE_LINE);
    return *reinterpret_cast<__gm__ volatile uint64_t *>(addr);
}
static inline void plat_invalidate(uint64_t addr, uint64_t len) {
    for (uint64_t a = addr & ~63ull; a < addr + len; a += 64) {
        dcci(reinterpret_cast<__gm__ uint64_t *>(a), SINGLE_CACHE_LINE);
    }
}

#define SIMPLER_AICORE_ENTRY extern "C" __global__ __aicore__

#endif
