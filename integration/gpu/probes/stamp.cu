// stamp.cu — where a request's service time goes: waiting for the GPU, or running slower once on it (issue 12: the
// median shift of a latency-critical request beside a trainer). No DetShare code; loaded by worker.py (`--stamp`)
// through ctypes, around each request of an unmodified model.
//
// Around each request the worker launches two one-thread kernels on the request's stream: `begin` before the model's
// kernels and `end` after them. Each stamps %globaltimer. The host stamps CLOCK_REALTIME just before `begin`. Per
// request: the start delay (`begin` ran, less the host stamp: the launch latency plus any wait for the GPU, e.g. for a
// neighbour's time slice) and the GPU span (`end` less `begin`: the model's kernels, including anything interleaved
// with them). The worker subtracts the smallest start delay seen (the launch latency on an idle GPU). Under MPS a
// one-thread kernel fits beside a neighbour's blocks, so there `begin` says when the request's context ran, not when
// SMs came free (probes/reclaim.cu measures that).
//
//   nvcc -O2 -arch=sm_90 -shared -Xcompiler -fPIC -o stamp.so integration/gpu/probes/stamp.cu
#include "timing.cuh"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace {

constexpr unsigned kCap = 1u << 15;  // requests kept (a ring)

using probe::gtimer;
using probe::realtime_ns;

__global__ void stamp(unsigned long long *ring, unsigned i) { ring[i] = gtimer(); }

struct Stamps {
    unsigned long long *begin = nullptr, *end = nullptr;
    std::vector<unsigned long long> host;  // CLOCK_REALTIME ns before each `begin`, same ring index
    unsigned launched = 0;
};
Stamps g;

int fail(const char *what, cudaError_t e) { return probe::fail("stamp", what, e); }

}  // namespace

extern "C" {

int stamp_init(void) {
    cudaError_t e;
    if ((e = cudaMalloc(&g.begin, kCap * sizeof(unsigned long long))) != cudaSuccess ||
        (e = cudaMalloc(&g.end, kCap * sizeof(unsigned long long))) != cudaSuccess)
        return fail("cudaMalloc", e);
    if ((e = cudaDeviceSynchronize()) != cudaSuccess)
        return fail("cudaDeviceSynchronize", e);
    g.host.assign(kCap, 0);
    return 0;
}

// Before a request's kernels, on stream (a cudaStream_t as an integer).
int stamp_begin(unsigned long long stream) {
    cudaStream_t s = (cudaStream_t)(uintptr_t)stream;
    unsigned i = g.launched % kCap;
    g.host[i] = realtime_ns();
    stamp<<<1, 1, 0, s>>>(g.begin, i);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : fail("launch begin", e);
}

// After the same request's kernels, on the same stream.
int stamp_end(unsigned long long stream) {
    cudaStream_t s = (cudaStream_t)(uintptr_t)stream;
    stamp<<<1, 1, 0, s>>>(g.end, g.launched % kCap);
    g.launched++;
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : fail("launch end", e);
}

// The last n requests (n <= launched, n <= capacity), oldest first: out[2*k] = `begin` less the host stamp,
// out[2*k+1] = `end` less `begin`, both ns (raw: the caller subtracts the idle launch latency from the first).
int stamp_read(unsigned n, long long *out) {
    if (n > g.launched || n > kCap)
        return fail("stamp_read: more requests than kept", cudaErrorInvalidValue);
    cudaError_t e;
    if ((e = cudaDeviceSynchronize()) != cudaSuccess)
        return fail("cudaDeviceSynchronize", e);
    std::vector<unsigned long long> b(kCap), en(kCap);
    if ((e = cudaMemcpy(b.data(), g.begin, kCap * sizeof b[0], cudaMemcpyDeviceToHost)) != cudaSuccess ||
        (e = cudaMemcpy(en.data(), g.end, kCap * sizeof en[0], cudaMemcpyDeviceToHost)) != cudaSuccess)
        return fail("cudaMemcpy", e);
    for (unsigned k = 0; k < n; k++) {
        unsigned i = (g.launched - n + k) % kCap;
        out[2 * k] = (long long)(b[i] - g.host[i]);
        out[2 * k + 1] = (long long)(en[i] - b[i]);
    }
    return 0;
}
}
