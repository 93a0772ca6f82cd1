// AICore mapping of the platform (ccec, `--cce-aicore-only`, one compile per role). The
// instance's ids are the hardware's block and sub-block registers; DATA_MAIN_BASE is read as a
// special register (low half the token, high half the doorbell) and COND written with its
// intrinsic; image memory is global memory (`__gm__`), cache lines another agent wrote are
// dropped with `dcci`; the counter is the system counter. There is nobody to wake or park on:
// plat_idle is a no-op spin and the launch is torn down by the device, not by a flag; a faulting
// kernel is a hardware exception, so plat_call_kernel always returns 0. This header is compiled
// only by `cargo xtask build --platform a2a3` on a server with CANN; the host build uses
// aicore_platform_host.h instead.
#ifndef SIMPLER_AICORE_PLATFORM_CCE_H
#define SIMPLER_AICORE_PLATFORM_CCE_H

#include <stdint.h>

// The hardware core id register holds more than the id.
#define SIMPLER_AICORE_COREID_MASK 0xFFFu

struct PlatCore {
    uint32_t unused;
};

#define SIMPLER_AICORE_KERNEL(name, arg) \
    extern "C" __global__ __aicore__ void name(__gm__ uint8_t *arg)

static inline PlatCore plat_core() { return PlatCore{0}; }
static inline bool plat_bound(const PlatCore *) { return true; }
static inline uint64_t plat_arg_addr(__gm__ uint8_t *arg) { return reinterpret_cast<uint64_t>(arg); }
static inline uint32_t plat_block_idx(const PlatCore *) { return get_block_idx(); }
static inline uint32_t plat_block_num(const PlatCore *) { return get_block_num(); }
static inline uint32_t plat_subblock_id(const PlatCore *) { return get_subblockid(); }
static inline uint32_t plat_subblock_dim(const PlatCore *) { return get_subblockdim(); }
static inline uint32_t plat_physical_core_id(const PlatCore *) {
    return static_cast<uint32_t>(get_coreid()) & SIMPLER_AICORE_COREID_MASK;
}
static inline void plat_finish(const PlatCore *, int32_t) {}

// Register offsets name control registers; on the AICore only DATA_MAIN_BASE is read.
static inline uint32_t plat_read_reg(const PlatCore *, uint32_t off) {
    uint64_t v;
    __asm__ volatile("MOV %0, DATA_MAIN_BASE\n" : "=l"(v));
    return static_cast<uint32_t>(off == 0xA4 ? (v >> 32) : v);
}
static inline void plat_write_cond(const PlatCore *, uint32_t v) {
    pipe_barrier(PIPE_ALL);
    set_cond(v);
}
static inline uint64_t plat_epoch(const PlatCore *) { return 0; }
static inline void plat_idle(const PlatCore *, uint64_t, uint32_t) {}
static inline bool plat_should_stop(const PlatCore *) { return false; }
static inline uint64_t plat_counter(const PlatCore *) { return get_sys_cnt(); }
static inline void plat_report_in(const PlatCore *) {}
typedef void (*simpler_kernel_fn)(__gm__ int64_t *args);
static inline int32_t plat_call_kernel(const PlatCore *, uint64_t kernel, uint32_t, uint64_t,
                                       uint64_t args) {
    reinterpret_cast<simpler_kernel_fn>(kernel)(reinterpret_cast<__gm__ int64_t *>(args));
    return 0;
}

static inline uint64_t plat_load_u64(uint64_t addr) {
    return *reinterpret_cast<__gm__ volatile uint64_t *>(addr);
}
static inline uint32_t plat_load_u32(uint64_t addr) {
    return *reinterpret_cast<__gm__ volatile uint32_t *>(addr);
}
static inline void plat_store_u64(uint64_t addr, uint64_t v) {
    *reinterpret_cast<__gm__ volatile uint64_t *>(addr) = v;
    dcci(reinterpret_cast<__gm__ uint64_t *>(addr), SINGLE_CACHE_LINE);
}
static inline void plat_store_u32(uint64_t addr, uint32_t v) {
    *reinterpret_cast<__gm__ volatile uint32_t *>(addr) = v;
    dcci(reinterpret_cast<__gm__ uint64_t *>(addr), SINGLE_CACHE_LINE);
}
static inline void plat_store_u32_release(uint64_t addr, uint32_t v) {
    pipe_barrier(PIPE_ALL);
    *reinterpret_cast<__gm__ volatile uint32_t *>(addr) = v;
    dcci(reinterpret_cast<__gm__ uint64_t *>(addr), SINGLE_CACHE_LINE);
    dsb(DSB_DDR);
}
static inline void plat_store_u32_relaxed(uint64_t addr, uint32_t v) {
    plat_store_u32(addr, v);
}
static inline uint32_t plat_load_u32_relaxed(uint64_t addr) {
    dcci(reinterpret_cast<__gm__ uint64_t *>(addr), SINGLE_CACHE_LINE);
    return plat_load_u32(addr);
}
static inline uint64_t plat_load_u64_acquire(uint64_t addr) {
    dcci(reinterpret_cast<__gm__ uint64_t *>(addr), SINGLE_CACHE_LINE);
    return plat_load_u64(addr);
}
static inline void plat_invalidate(uint64_t addr, uint64_t len) {
    for (uint64_t a = addr & ~63ull; a < addr + len; a += 64) {
        dcci(reinterpret_cast<__gm__ uint64_t *>(a), SINGLE_CACHE_LINE);
    }
}

#endif
