// The AICore executor: one core's side of the handshake and dispatch protocol
// (docs/device-handshake.md, steps 2, 3, 5, 7 and 11), written once for the AICore and the
// simulator. Everything hardware-specific is in aicore_platform.h. It is a header of
// internal-linkage functions because entry.cpp is compiled once per core role (cube and
// vector) and both objects are linked into one binary: each role gets its own copy, and no
// symbol but the two kernel entries is defined twice.
//
// 1. Report in: physical_core_id and core_type, then aicore_done = index + 1 (release).
// 2. Wait until the low half of DATA_MAIN_BASE is non-zero (the AICPU opened the window); an
//    exit signal there means the AICPU gave up before opening it: answer EXITED and leave.
// 3. COND = IDLE, read the payload-pair address from the handshake record (acquire).
// 4. Loop on the low half v: exit signal -> COND = EXITED, return; AICPU idle or v == last ->
//    wait; otherwise payload v & 1: if gated, wait for the doorbell (high half == v) or the exit
//    signal (exit wins); COND = ACK(v); run the kernel; last = v; swimlane record; COND = FIN(v).
// 5. A faulting kernel ends the loop without FIN; the fault's code is the result.
//
// Result: 0 after a clean exit, SIMPLER_AICORE_ABORTED when the launch was torn down, else the
// device code of a kernel fault.
#ifndef SIMPLER_AICORE_EXECUTOR_H
#define SIMPLER_AICORE_EXECUTOR_H

#include "aicore_platform.h"

// What the entry derived for one core from the launch argument and the runtime image.
struct CoreEnv {
    PlatCore plat;
    uint64_t handshake;         // this core's handshake record
    uint64_t swimlane_header;   // this core's swimlane header (0 = swimlane off)
    uint64_t swimlane_records;  // its records
    uint32_t swimlane_capacity;
    uint32_t core_index;
    uint32_t core_type;         // 0 = AIC, 1 = AIV
    uint32_t physical_core_id;
};

namespace {

const uint32_t REG_DATA_MAIN_BASE_LOW = 0xA0;
const uint32_t REG_DATA_MAIN_BASE_HIGH = 0xA4;

const uint32_t TOKEN_MASK = 0x7FFFFFFFu;
const uint32_t COND_FIN = 0x80000000u;
const uint32_t AICPU_IDLE = 0x7FFFFFFDu;
const uint32_t EXIT_SIGNAL = 0x7FFFFFF0u;
const uint32_t IDLE_VALUE = COND_FIN | 0x7FFFFFFFu;
const uint32_t EXITED_VALUE = COND_FIN | 0x7FFFFFFEu;

// Handshake record offsets.
const uint64_t HS_AICORE_DONE = 4;
const uint64_t HS_TASK = 8;
const uint64_t HS_CORE_TYPE = 16;
const uint64_t HS_PHYSICAL_CORE_ID = 20;

// Dispatch payload layout (512 bytes, two per core).
const uint64_t PAYLOAD_SIZE = 512;
const uint64_t PL_KERNEL = 0;
const uint64_t PL_BLOCK_IDX = 8;
const uint64_t PL_SRC_PAYLOAD = 24;
const uint64_t PL_TASK_ID = 32;
const uint64_t PL_FUNC_ID = 40;
const uint64_t PL_ARGS = 64;

// Swimlane header and record layout.
const uint64_t SW_COUNT = 0;
const uint64_t SW_DROPPED = 4;
const uint64_t SW_RECORD_SIZE = 40;

const int32_t SIMPLER_AICORE_ABORTED = -1;

typedef const CoreEnv Env;

inline uint32_t ack(uint32_t v) { return v & TOKEN_MASK; }
inline uint32_t fin(uint32_t v) { return COND_FIN | (v & TOKEN_MASK); }

// Waits until the low half is non-zero or the launch stops; returns the value (0 = stopped).
uint32_t wait_for_window(Env *env) {
    for (uint32_t round = 0;; ++round) {
        uint64_t epoch = plat_epoch(&env->plat);
        uint32_t v = plat_read_reg(&env->plat, REG_DATA_MAIN_BASE_LOW);
        if (v != 0) {
            return v;
        }
        if (plat_should_stop(&env->plat)) {
            return 0;
        }
        plat_idle(&env->plat, epoch, round);
    }
}

enum Gate { GATE_RUN, GATE_EXIT, GATE_STOPPED };

// A gated payload waits for its doorbell; the exit signal wins.
Gate wait_for_doorbell(Env *env, uint32_t v) {
    for (uint32_t round = 0;; ++round) {
        uint64_t epoch = plat_epoch(&env->plat);
        if (plat_read_reg(&env->plat, REG_DATA_MAIN_BASE_LOW) == EXIT_SIGNAL) {
            return GATE_EXIT;
        }
        if (plat_read_reg(&env->plat, REG_DATA_MAIN_BASE_HIGH) == v) {
            return GATE_RUN;
        }
        if (plat_should_stop(&env->plat)) {
            return GATE_STOPPED;
        }
        plat_idle(&env->plat, epoch, round);
    }
}

void record_swimlane(Env *env, uint64_t task_id, uint32_t token, uint32_t func_id,
                     uint64_t start, uint64_t end, uint32_t block_idx) {
    uint64_t h = env->swimlane_header;
    uint32_t n = plat_load_u32_relaxed(h + SW_COUNT);
    if (n >= env->swimlane_capacity) {
        plat_store_u32_relaxed(h + SW_DROPPED, plat_load_u32_relaxed(h + SW_DROPPED) + 1);
        return;
    }
    uint64_t r = env->swimlane_records + uint64_t(n) * SW_RECORD_SIZE;
    plat_store_u64(r + 0, task_id);
    plat_store_u32(r + 8, token);
    plat_store_u32(r + 12, func_id);
    plat_store_u64(r + 16, start);
    plat_store_u64(r + 24, end);
    plat_store_u32(r + 32, block_idx);
    plat_store_u32(r + 36, 0);
    // The host reads the records after the launch completed.
    plat_store_u32_relaxed(h + SW_COUNT, n + 1);
}

// Runs one core of the launch to its end (steps 1-5 above).
int32_t execute(Env *env) {
    uint64_t hs = env->handshake;
    // Step 1: report in without waiting.
    plat_store_u32_relaxed(hs + HS_PHYSICAL_CORE_ID, env->physical_core_id);
    plat_store_u32_relaxed(hs + HS_CORE_TYPE, env->core_type);
    plat_store_u32_release(hs + HS_AICORE_DONE, env->core_index + 1);
    plat_report_in(&env->plat);

    // Step 2: the window.
    uint32_t opened = wait_for_window(env);
    if (opened == 0) {
        return SIMPLER_AICORE_ABORTED;
    }
    if (opened == EXIT_SIGNAL) {
        plat_write_cond(&env->plat, EXITED_VALUE);
        return 0;
    }

    // Step 3.
    plat_write_cond(&env->plat, IDLE_VALUE);
    uint64_t pair = plat_load_u64_acquire(hs + HS_TASK);
    bool swimlane = env->swimlane_header != 0 && env->swimlane_capacity > 0;
    uint32_t last = AICPU_IDLE;

    // Step 4.
    for (uint32_t round = 0;;) {
        uint64_t epoch = plat_epoch(&env->plat);
        uint32_t v = plat_read_reg(&env->plat, REG_DATA_MAIN_BASE_LOW);
        if (v == EXIT_SIGNAL) {
            plat_write_cond(&env->plat, EXITED_VALUE);
            return 0;
        }
        if (v == AICPU_IDLE || v == last) {
            if (plat_should_stop(&env->plat)) {
                return SIMPLER_AICORE_ABORTED;
            }
            plat_idle(&env->plat, epoch, round);
            if (round != 0xFFFFFFFFu) {
                ++round;
            }
            continue;
        }
        round = 0;
        uint64_t p = pair + uint64_t(v & 1) * PAYLOAD_SIZE;
        plat_invalidate(p, PAYLOAD_SIZE);
        uint64_t kernel = plat_load_u64(p + PL_KERNEL);
        uint64_t src = plat_load_u64(p + PL_SRC_PAYLOAD);
        uint64_t task_id = plat_load_u64(p + PL_TASK_ID);
        uint32_t func_id = plat_load_u32(p + PL_FUNC_ID);
        uint32_t block_idx = plat_load_u32(p + PL_BLOCK_IDX);
        if (src != 0) {
            Gate g = wait_for_doorbell(env, v);
            if (g == GATE_EXIT) {
                plat_write_cond(&env->plat, EXITED_VALUE);
                return 0;
            }
            if (g == GATE_STOPPED) {
                return SIMPLER_AICORE_ABORTED;
            }
        }
        plat_write_cond(&env->plat, ack(v));
        uint64_t start = swimlane ? plat_counter(&env->plat) : 0;
        int32_t code =
            plat_call_kernel(&env->plat, kernel, func_id, task_id, p + PL_ARGS);
        if (code != 0) {
            return code;
        }
        last = v;
        if (swimlane) {
            record_swimlane(env, task_id, v, func_id, start, plat_counter(&env->plat), block_idx);
        }
        plat_write_cond(&env->plat, fin(v));
    }
}

}  // namespace

#endif
