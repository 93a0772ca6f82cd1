// Host build only: the per-thread binding of the simulated core the kernel entries run as
// (aicore_platform_host.h). One definition, shared by both role objects.
#include "aicore_platform_host.h"

namespace {
thread_local simpler_host_core *bound = nullptr;
}

extern "C" __attribute__((visibility("default"))) void simpler_aicore_bind(simpler_host_core *core) {
    bound = core;
}

simpler_host_core *simpler_aicore_bound() { return bound; }
