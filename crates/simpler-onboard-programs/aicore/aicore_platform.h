// The AICore executor's platform: the only place that knows whether the executor runs on an
// AICore (compiled by ccec: __CCE__ set) or on a host thread standing in for one (the
// simulator). The entry and the executor call exactly these, on a PlatCore the entry gets
// from plat_core():
//
//   SIMPLER_AICORE_KERNEL(name, arg)   declares a kernel entry taking the launch argument
//   plat_arg_addr(arg)                 that argument as a device address
//   plat_bound(p)                      the instance has a platform (host: a bound core)
//   plat_block_idx / plat_block_num / plat_subblock_id / plat_subblock_dim
//                                      the instance's place in the launch
//   plat_physical_core_id(p)           the hardware core id
//   plat_finish(p, code)               the entry's result (host only: the simulator reads it)
//   plat_read_reg(p, off)              32-bit load of a control register (then a read barrier)
//   plat_write_cond(p, v)              store to COND (after a write barrier); wakes the AICPU owner
//   plat_epoch(p)                      wake counter read before a check (0 on the AICore)
//   plat_idle(p, epoch, round)         nothing new: spin, or park until the epoch moves (host)
//   plat_should_stop(p)                the launch is being torn down (never on the AICore)
//   plat_counter(p)                    the 50 MHz system counter
//   plat_report_in(p)                  wake the AICPU threads after aicore_done (host only)
//   plat_call_kernel(p, ...)           run one kernel; 0 = finished, else the fault's device code
//   plat_load_* / plat_store_*         image memory (plain, relaxed, acquire, release)
//   plat_invalidate(addr, len)         drop cached lines of data another agent wrote
//
// Only constructs the CCE compiler accepts appear in the entry and the executor: no
// exceptions, RTTI, heap, virtual calls, static constructors or standard library beyond
// <stdint.h>.
#ifndef SIMPLER_AICORE_PLATFORM_H
#define SIMPLER_AICORE_PLATFORM_H

#if defined(__CCE__) && !defined(SIMPLER_AICORE_HOST)
#include "aicore_platform_cce.h"
#else
#include "aicore_platform_host.h"
#endif

#endif
