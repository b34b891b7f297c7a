// reclaim.cu — how long a request that needs every SM waits for a neighbour's kernels to leave them (issue 12: the
// dispatch gate's reclaim bound, measured on the GPU rather than inferred from latencies). No DetShare code; loaded
// by worker.py (`--model reclaim`) through ctypes, so that it runs under the scheduler like any latency-critical
// tenant.
//
// A request is two kernels on the caller's stream: `arrive` (one thread) stamps %globaltimer, then `occupy` runs
// `grid` blocks that each take 200 KiB of shared memory, so that at most one fits on an SM and only on an SM whose
// shared memory a neighbour's kernel has left (a bf16 GEMM holds ~all of it, integration/gpu/kernelgrid.py). Each
// block stamps %globaltimer when it starts, then spins for spin_us. The host stamps CLOCK_REALTIME just before the
// launches. Per request, in microseconds after that host stamp (less the smallest such delay seen when the GPU was
// idle, i.e. the launch latency): when `arrive` ran, when the first block started (an SM came free) and when the
// last one did (every SM the request needs was reclaimed).
//
//   nvcc -O2 -arch=sm_90 -shared -Xcompiler -fPIC -o reclaim.so integration/gpu/probes/reclaim.cu
#include "timing.cuh"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace {

constexpr unsigned kCap = 1u << 14;  // requests kept (a ring): 16384 x grid starts
constexpr int kSmemBytes = 200 * 1024;

using probe::gtimer;
using probe::realtime_ns;

__global__ void arrive(unsigned long long *t_arrive, unsigned *ctr) {
    unsigned i = atomicAdd(ctr, 1u) % kCap;
    t_arrive[i] = gtimer();
}

__global__ void occupy(unsigned long long *t_start, const unsigned *ctr, unsigned grid, unsigned long long spin_ns) {
    extern __shared__ volatile unsigned char smem[];
    if (threadIdx.x != 0)
        return;
    unsigned long long s = gtimer();
    unsigned i = (*ctr - 1u) % kCap;
    t_start[(size_t)i * grid + blockIdx.x] = s;
    smem[0] = 1;  // the block really holds its shared memory
    while (gtimer() - s < spin_ns) {
    }
}

struct Probe {
    unsigned grid = 0;
    unsigned long long spin_ns = 0;
    unsigned *ctr = nullptr;
    unsigned long long *t_arrive = nullptr, *t_start = nullptr;
    std::vector<unsigned long long> host;  // CLOCK_REALTIME ns before each launch, same ring index
    unsigned launched = 0;
};
Probe g;

int fail(const char *what, cudaError_t e) { return probe::fail("reclaim", what, e); }

}  // namespace

extern "C" {

// Set up: grid blocks of 200 KiB shared memory (at most one per SM), each spinning spin_us.
int reclaim_init(unsigned grid, unsigned spin_us) {
    cudaError_t e;
    if (grid == 0 || grid > 1024)
        return fail("grid must be 1..1024", cudaErrorInvalidValue);
    g.grid = grid;
    g.spin_ns = (unsigned long long)spin_us * 1000ull;
    if ((e = cudaFuncSetAttribute(occupy, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes)) != cudaSuccess)
        return fail("cudaFuncSetAttribute", e);
    if ((e = cudaMalloc(&g.ctr, sizeof(unsigned))) != cudaSuccess ||
        (e = cudaMalloc(&g.t_arrive, kCap * sizeof(unsigned long long))) != cudaSuccess ||
        (e = cudaMalloc(&g.t_start, (size_t)kCap * grid * sizeof(unsigned long long))) != cudaSuccess)
        return fail("cudaMalloc", e);
    if ((e = cudaMemset(g.ctr, 0, sizeof(unsigned))) != cudaSuccess)
        return fail("cudaMemset", e);
    if ((e = cudaDeviceSynchronize()) != cudaSuccess)
        return fail("cudaDeviceSynchronize", e);
    g.host.assign(kCap, 0);
    return 0;
}

// One request on stream (a cudaStream_t as an integer, e.g. torch.cuda.current_stream().cuda_stream).
int reclaim_launch(unsigned long long stream) {
    cudaStream_t s = (cudaStream_t)(uintptr_t)stream;
    g.host[g.launched % kCap] = realtime_ns();
    g.launched++;
    arrive<<<1, 1, 0, s>>>(g.t_arrive, g.ctr);
    occupy<<<g.grid, 32, kSmemBytes, s>>>(g.t_start, g.ctr, g.grid, g.spin_ns);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : fail("launch", e);
}

// The last n requests (n <= launched, n <= capacity), oldest first: out[3*k .. 3*k+2] = arrive, first block, last
// block, each in ns of %globaltimer after the host stamp (raw: the caller subtracts the idle launch latency).
int reclaim_read(unsigned n, long long *out) {
    if (n > g.launched || n > kCap)
        return fail("reclaim_read: more requests than kept", cudaErrorInvalidValue);
    cudaError_t e;
    if ((e = cudaDeviceSynchronize()) != cudaSuccess)
        return fail("cudaDeviceSynchronize", e);
    std::vector<unsigned long long> arr(kCap), st((size_t)kCap * g.grid);
    if ((e = cudaMemcpy(arr.data(), g.t_arrive, arr.size() * sizeof arr[0], cudaMemcpyDeviceToHost)) != cudaSuccess ||
        (e = cudaMemcpy(st.data(), g.t_start, st.size() * sizeof st[0], cudaMemcpyDeviceToHost)) != cudaSuccess)
        return fail("cudaMemcpy", e);
    for (unsigned k = 0; k < n; k++) {
        unsigned i = (g.launched - n + k) % kCap;
        unsigned long long h = g.host[i], lo = ~0ull, hi = 0;
        for (unsigned b = 0; b < g.grid; b++) {
            unsigned long long v = st[(size_t)i * g.grid + b];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        out[3 * k] = (long long)(arr[i] - h);
        out[3 * k + 1] = (long long)(lo - h);
        out[3 * k + 2] = (long long)(hi - h);
    }
    return 0;
}
}
