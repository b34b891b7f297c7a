// timing.cuh — what the probes loaded by worker.py (reclaim.cu, stamp.cu) share: %globaltimer read on the GPU, the
// host's CLOCK_REALTIME stamp it is compared with (the worker subtracts the smallest difference, the launch latency,
// so the two clocks need not agree), and how a failure is reported. worker.py hashes this header with each probe's
// source, so a change here rebuilds them.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <ctime>

namespace probe {

__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

inline unsigned long long realtime_ns() {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

// Reports the failure on stderr, named after the probe, and returns the CUDA error as the caller's status.
inline int fail(const char *probe_name, const char *what, cudaError_t e) {
    fprintf(stderr, "%s probe: %s: %s\n", probe_name, what, cudaGetErrorString(e));
    return (int)e;
}

}  // namespace probe
