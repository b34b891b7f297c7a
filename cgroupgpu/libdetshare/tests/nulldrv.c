/*
 * nulldrv.c — a null CUDA driver (a test double even thinner than the simulated GPU): every entry point the launch
 * benchmark uses returns CUDA_SUCCESS at once, so that ds_bench_launch measures what libdetshare adds to a launch
 * and nothing else. Built as build/tests/nulldrv/libcuda.so.1.
 */
#define CUDA_ABI_PROTOTYPES
#include "cgroupgpu/cuda/cuda_abi.h"

#include <string.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT CUresult cuInit(unsigned int Flags) { return Flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuDriverGetVersion(int *v) {
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                               unsigned int by, unsigned int bz, unsigned int smem, CUstream s, void **p, void **e) {
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)s, (void)p, (void)e;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                    unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem, CUstream s,
                                    void **p, void **e) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, s, p, e);
}

/* Events and stream queries: what the library uses to follow a stream's work (an unconfined stream is queried by the
 * demand monitor); nothing is ever pending here. */
static char g_event;
EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    (void)flags;
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    *e = (CUevent)&g_event;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamQuery(CUstream s) {
    (void)s;
    return CUDA_SUCCESS;
}

/* Device memory of the null driver: addresses only, nothing behind them. */
static CUdeviceptr g_next = 0x100000;
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (!p || !n)
        return CUDA_ERROR_INVALID_VALUE;
    *p = __atomic_fetch_add(&g_next, (n + 255) & ~(size_t)255, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
/* A variant from the future (another ABI), exported under a name libdetshare does not know. */
EXPORT CUresult cuMemAlloc_v9(CUdeviceptr *p, size_t n, unsigned flags) {
    return flags ? CUDA_ERROR_INVALID_VALUE : cuMemAlloc_v2(p, n);
}
/* What a driver may hand out from cuGetProcAddress: an internal function that is not one of its exports. */
static CUresult internal_mem_alloc(CUdeviceptr *p, size_t n) { return cuMemAlloc_v2(p, n); }

static const struct {
    const char *name;
    void *fn;
} g_syms[] = {
    {"cuInit", (void *)cuInit},
    {"cuDriverGetVersion", (void *)cuDriverGetVersion},
    {"cuLaunchKernel", (void *)cuLaunchKernel},
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *st) {
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    if (!strcmp(symbol, "cuLaunchKernel") && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) {
        *pfn = (void *)cuLaunchKernel_ptsz;
        if (st)
            *st = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    if (!strcmp(symbol, "cuMemAlloc") && cudaVersion >= 20000) {
        *pfn = (void *)cuMemAlloc_v9;
        if (st)
            *st = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    if (!strcmp(symbol, "cuMemAlloc") && cudaVersion >= 3020) {
        *pfn = (void *)internal_mem_alloc;
        if (st)
            *st = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    if (!strcmp(symbol, "cuGetProcAddress")) {
        *pfn = (void *)cuGetProcAddress_v2;
        if (st)
            *st = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    for (size_t i = 0; i < sizeof g_syms / sizeof g_syms[0]; i++) {
        if (!strcmp(g_syms[i].name, symbol)) {
            *pfn = g_syms[i].fn;
            if (st)
                *st = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    }
    *pfn = NULL;
    if (st)
        *st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int v, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, v, flags, NULL);
}
