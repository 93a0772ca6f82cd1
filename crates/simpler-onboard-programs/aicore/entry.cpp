// The AICore kernel entry CANN launches: one mixed launch of B blocks starts B cube (AIC) and
// 2B vector (AIV) instances, each calling the entry of its role with the device address of the
// run's KernelArgs. The entry finds its core index from the hardware ids, derives its
// handshake record and swimlane block from KernelArgs and the runtime image header
// (docs/onboard-programs.md gives the offsets), then runs the executor loop.
//
// This file is compiled once per role with SIMPLER_AICORE_VEC set to 0 (cube, entry
// aicore_kernel_0_mix_aic) or 1 (vector, aicore_kernel_0_mix_aiv): by ccec for the AICore and
// by the host's C++ compiler for the simulator, which calls the same entries.
#include "executor.h"

#ifndef SIMPLER_AICORE_VEC
#error "compile with -DSIMPLER_AICORE_VEC=0 (cube) or -DSIMPLER_AICORE_VEC=1 (vector)"
#endif

#if SIMPLER_AICORE_VEC
#define SIMPLER_AICORE_ENTRY_NAME aicore_kernel_0_mix_aiv
#else
#define SIMPLER_AICORE_ENTRY_NAME aicore_kernel_0_mix_aic
#endif

namespace {

// KernelArgs offsets.
const uint64_t KA_ABI_VERSION = 0;
const uint64_t KA_BLOCK_DIM = 4;
const uint64_t KA_NUM_AICORE = 8;
const uint64_t KA_IMAGE_BASE = 16;
const uint64_t KA_IMAGE_LEN = 24;
const uint64_t KA_PROFILING = 40;
const uint64_t KERNEL_ARGS_SIZE = 64;
const uint32_t PROFILE_SWIMLANE = 1u << 1;

// Runtime image header offsets.
const uint64_t IH_ABI_VERSION = 4;
const uint64_t IH_IMAGE_LEN = 8;
const uint64_t IH_NUM_AICORE = 20;
const uint64_t IH_HANDSHAKE_OFF = 48;
const uint64_t IH_SWIMLANE_OFF = 112;
const uint64_t IH_SWIMLANE_CAPACITY = 120;
const uint64_t IMAGE_HEADER_SIZE = 192;

const uint32_t MAX_LAUNCH_CORES = 72;
const uint64_t HANDSHAKE_SIZE = 64;
const uint64_t SWIMLANE_HEADER_SIZE = 64;
const uint64_t SECTION_ALIGN = 64;

// The entry's result when the launch argument or the image is malformed (AICore exception).
const int32_t SIMPLER_AICORE_BAD_LAUNCH = 507015;

// Core index of this instance: AIC = block, AIV = block * subblocks + subblock + B.
uint32_t core_index(const PlatCore *plat) {
    uint32_t block = plat_block_idx(plat);
#if SIMPLER_AICORE_VEC
    return block * plat_subblock_dim(plat) + plat_subblock_id(plat) + plat_block_num(plat);
#else
    return block;
#endif
}

// 0: `env` describes this core; 1: the core is not part of the launch; else a fault code.
int32_t derive_env(const PlatCore &plat, uint64_t args, CoreEnv *env) {
    plat_invalidate(args, KERNEL_ARGS_SIZE);
    uint32_t abi = plat_load_u32(args + KA_ABI_VERSION);
    uint32_t block_dim = plat_load_u32(args + KA_BLOCK_DIM);
    uint32_t num_aicore = plat_load_u32(args + KA_NUM_AICORE);
    uint64_t image = plat_load_u64(args + KA_IMAGE_BASE);
    uint64_t image_len = plat_load_u64(args + KA_IMAGE_LEN);
    uint32_t profiling = plat_load_u32(args + KA_PROFILING);
    env->plat = plat;
    env->core_index = core_index(&env->plat);
    if (num_aicore != 3 * block_dim || num_aicore > MAX_LAUNCH_CORES) {
        return SIMPLER_AICORE_BAD_LAUNCH;
    }
    if (env->core_index >= num_aicore) {
        return 1;
    }
    if (image == 0 || image_len < IMAGE_HEADER_SIZE) {
        return SIMPLER_AICORE_BAD_LAUNCH;
    }
    plat_invalidate(image, IMAGE_HEADER_SIZE);
    uint64_t handshake_off = plat_load_u64(image + IH_HANDSHAKE_OFF);
    if (plat_load_u32(image + IH_ABI_VERSION) != abi ||
        plat_load_u64(image + IH_IMAGE_LEN) != image_len ||
        plat_load_u32(image + IH_NUM_AICORE) != num_aicore ||
        handshake_off > image_len ||
        image_len - handshake_off < uint64_t(num_aicore) * HANDSHAKE_SIZE) {
        return SIMPLER_AICORE_BAD_LAUNCH;
    }
    env->handshake = image + handshake_off + uint64_t(env->core_index) * HANDSHAKE_SIZE;
    env->core_type = SIMPLER_AICORE_VEC ? 1 : 0;
    env->physical_core_id = plat_physical_core_id(&env->plat);
    env->swimlane_header = 0;
    env->swimlane_records = 0;
    env->swimlane_capacity = 0;
    uint32_t capacity = plat_load_u32(image + IH_SWIMLANE_CAPACITY);
    if ((profiling & PROFILE_SWIMLANE) != 0 && capacity > 0) {
        uint64_t block = (SWIMLANE_HEADER_SIZE + uint64_t(capacity) * 40 + SECTION_ALIGN - 1) /
                         SECTION_ALIGN * SECTION_ALIGN;
        uint64_t off = plat_load_u64(image + IH_SWIMLANE_OFF) + uint64_t(env->core_index) * block;
        if (off > image_len || image_len - off < block) {
            return SIMPLER_AICORE_BAD_LAUNCH;
        }
        env->swimlane_header = image + off;
        env->swimlane_records = image + off + SWIMLANE_HEADER_SIZE;
        env->swimlane_capacity = capacity;
    }
    return 0;
}

}  // namespace

SIMPLER_AICORE_KERNEL(SIMPLER_AICORE_ENTRY_NAME, kernel_args) {
    PlatCore plat = plat_core();
    if (!plat_bound(&plat)) {
        return;
    }
    CoreEnv env;
    int32_t derived = derive_env(plat, plat_arg_addr(kernel_args), &env);
    if (derived == 1) {
        plat_finish(&plat, 0);
        return;
    }
    if (derived != 0) {
        plat_finish(&plat, derived);
        return;
    }
    plat_finish(&plat, execute(&env));
}
