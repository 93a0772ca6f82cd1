// Host mapping of the AICore platform onto the simulator. The simulator binds, on the thread
// that stands in for a core, a simpler_host_core record (simpler_aicore_bind) and then calls
// the same kernel entry CANN would launch. The record gives the hardware ids of the instance,
// its register window (the core's simulated register block, registers at their MMIO offsets,
// atomic words), and callbacks for what only the simulator can do: parking, waking the AICPU
// owner of COND, the stop flag, the fault plan and the kernel call with its panic boundary.
// Image memory is host memory. The layout of simpler_host_core is mirrored by the simulator;
// change both together.
#ifndef SIMPLER_AICORE_PLATFORM_HOST_H
#define SIMPLER_AICORE_PLATFORM_HOST_H

#include <stdint.h>

extern "C" {
struct simpler_host_core {
    const void *ctx;
    uint64_t window;  // register window base
    uint32_t block_idx;
    uint32_t block_num;
    uint32_t subblock_id;
    uint32_t subblock_dim;
    uint32_t physical_core_id;
    int32_t result;  // written by the entry: 0, -1 (torn down) or a fault's device code
    uint64_t (*epoch)(const void *ctx);
    void (*idle)(const void *ctx, uint64_t observed, uint32_t round);
    uint32_t (*should_stop)(const void *ctx);
    void (*write_cond)(const void *ctx, uint32_t value);
    uint64_t (*counter)(const void *ctx);
    void (*report_in)(const void *ctx);
    int32_t (*call_kernel)(const void *ctx, uint64_t kernel, uint32_t func_id, uint64_t task_id,
                           int64_t *args);
};

// Binds `core` to the calling thread (null unbinds); defined in host_bind.cpp.
void simpler_aicore_bind(simpler_host_core *core);
}

// The record bound to the calling thread (host_bind.cpp).
simpler_host_core *simpler_aicore_bound();

struct PlatCore {
    simpler_host_core *core;
};

#define SIMPLER_AICORE_KERNEL(name, arg) \
    extern "C" __attribute__((visibility("default"))) void name(uint64_t arg)

static inline PlatCore plat_core() { return PlatCore{simpler_aicore_bound()}; }
static inline bool plat_bound(const PlatCore *p) { return p->core != nullptr; }
static inline uint64_t plat_arg_addr(uint64_t arg) { return arg; }
static inline uint32_t plat_block_idx(const PlatCore *p) { return p->core->block_idx; }
static inline uint32_t plat_block_num(const PlatCore *p) { return p->core->block_num; }
static inline uint32_t plat_subblock_id(const PlatCore *p) { return p->core->subblock_id; }
static inline uint32_t plat_subblock_dim(const PlatCore *p) { return p->core->subblock_dim; }
static inline uint32_t plat_physical_core_id(const PlatCore *p) {
    return p->core->physical_core_id;
}
static inline void plat_finish(const PlatCore *p, int32_t code) {
    if (p->core != nullptr) {
        p->core->result = code;
    }
}

static inline uint32_t plat_read_reg(const PlatCore *p, uint32_t off) {
    return __atomic_load_n(reinterpret_cast<uint32_t *>(p->core->window + off), __ATOMIC_ACQUIRE);
}
static inline void plat_write_cond(const PlatCore *p, uint32_t v) {
    p->core->write_cond(p->core->ctx, v);
}
static inline uint64_t plat_epoch(const PlatCore *p) { return p->core->epoch(p->core->ctx); }
static inline void plat_idle(const PlatCore *p, uint64_t epoch, uint32_t round) {
    p->core->idle(p->core->ctx, epoch, round);
}
static inline bool plat_should_stop(const PlatCore *p) {
    return p->core->should_stop(p->core->ctx) != 0;
}
static inline uint64_t plat_counter(const PlatCore *p) { return p->core->counter(p->core->ctx); }
static inline void plat_report_in(const PlatCore *p) { p->core->report_in(p->core->ctx); }
static inline int32_t plat_call_kernel(const PlatCore *p, uint64_t kernel, uint32_t func_id,
                                       uint64_t task_id, uint64_t args) {
    return p->core->call_kernel(p->core->ctx, kernel, func_id, task_id,
                                reinterpret_cast<int64_t *>(args));
}

// Image memory. Payloads and records are plain data ordered by the register and handshake
// accesses around them, as in the Rust executor; the handshake words are atomics.
static inline uint64_t plat_load_u64(uint64_t addr) {
    return *reinterpret_cast<const uint64_t *>(addr);
}
static inline uint32_t plat_load_u32(uint64_t addr) {
    return *reinterpret_cast<const uint32_t *>(addr);
}
static inline void plat_store_u64(uint64_t addr, uint64_t v) {
    *reinterpret_cast<uint64_t *>(addr) = v;
}
static inline void plat_store_u32(uint64_t addr, uint32_t v) {
    *reinterpret_cast<uint32_t *>(addr) = v;
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

#endif
