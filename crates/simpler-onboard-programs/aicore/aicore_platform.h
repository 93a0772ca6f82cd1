// The AICore executor's platform: the only place that knows whether the executor runs on an
// AICore (compiled by ccec, __CCE_KT_TEST__ unset and __CCE__ set) or on a host thread standing
// in for one (the simulator). The executor calls exactly these:
//
//   PlatEnv                        per-core state the entry builds
//   plat_read_reg(env, off)        32-bit load of a control register (then a read barrier)
//   plat_write_cond(env, v)        store to COND (after a write barrier); wakes the AICPU owner
//   plat_epoch(env)                wake counter read before a check (0 on the AICore)
//   plat_idle(env, epoch, round)   nothing new: spin, or park until the epoch moves (host)
//   plat_should_stop(env)          the launch is being torn down (never on the AICore)
//   plat_counter(env)              the 50 MHz system counter
//   plat_report_in(env)            wake the AICPU threads after aicore_done (host only)
//   plat_call_kernel(env, ...)     run one kernel; 0 = finished, else the fault's device code
//   plat_store_u32_release / plat_load_u64_acquire / plat_store_u32_relaxed on image memory
//   plat_invalidate(addr, len)     drop cached lines of data another agent wrote
//
// Only constructs the CCE compiler accepts appear in the executor: no exceptions, RTTI, heap,
// virtual calls, static constructors or standard library beyond <stdint.h>.
#ifndef SIMPLER_AICORE_PLATFORM_H
#define SIMPLER_AICORE_PLATFORM_H

#if defined(__CCE__) && !defined(SIMPLER_AICORE_HOST)
#include "aicore_platform_cce.h"
#else
#include "aicore_platform_host.h"
#endif

#endif
