// remainder.cu — can the split's remainder (the SMs cuDevSmResourceSplitByCount leaves over: 12 of an H100's 132 at
// minCount 8) join a green context? Without DetShare code: split, build descriptors from groups plus the remainder,
// create green contexts, and on each one count the distinct %smid a wide kernel touches, time a compute-bound kernel,
// and launch a kernel with thread-block clusters of 2 (cuBLAS's Hopper GEMMs use clusters). Prints one line per case.
//
//   nvcc -O2 -arch=sm_90 -o /tmp/remainder remainder.cu -lcuda && /tmp/remainder
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        CUresult r_ = (x);                                                                                             \
        if (r_ != CUDA_SUCCESS) {                                                                                      \
            printf("  %s: error %d\n", #x, (int)r_);                                                                   \
            return r_;                                                                                                 \
        }                                                                                                              \
    } while (0)

__global__ void smids(unsigned *seen, int spin) {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    if (threadIdx.x == 0)
        atomicOr(&seen[id / 32], 1u << (id % 32));
    long long t0 = clock64();
    while (clock64() - t0 < spin) {
    }
}

__global__ void fma_loop(float *out, int iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.5f;
    for (int i = 0; i < iters; i++) {
        a = fmaf(a, b, c);
        c = fmaf(c, b, a);
    }
    if (a == 12345.f)
        out[0] = a + c;
}

__global__ void __cluster_dims__(2, 1, 1) clustered(unsigned *seen) {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    if (threadIdx.x == 0)
        atomicOr(&seen[id / 32], 1u << (id % 32));
}

static int count_bits(const unsigned *w, int n) {
    int c = 0;
    for (int i = 0; i < n; i++)
        c += __builtin_popcount(w[i]);
    return c;
}

static CUresult run_case(const char *name, CUdevResource *res, unsigned nres, CUdevice dev, CUfunction fsm,
                         CUfunction ffma, CUfunction fcl, unsigned *dseen, float *dout) {
    printf("%s:", name);
    unsigned sum = 0;
    for (unsigned i = 0; i < nres; i++)
        sum += res[i].sm.smCount;
    printf(" %u resources, %u SMs;", nres, sum);
    CUdevResourceDesc desc;
    CUresult r = cuDevResourceGenerateDesc(&desc, res, nres);
    if (r != CUDA_SUCCESS) {
        printf(" cuDevResourceGenerateDesc -> %d\n", (int)r);
        return r;
    }
    CUgreenCtx g;
    r = cuGreenCtxCreate(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (r != CUDA_SUCCESS) {
        printf(" cuGreenCtxCreate -> %d\n", (int)r);
        return r;
    }
    CUdevResource got;
    CK(cuGreenCtxGetDevResource(g, &got, CU_DEV_RESOURCE_TYPE_SM));
    CUstream s;
    CK(cuGreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, 0));
    printf(" context reports %u SMs;", got.sm.smCount);

    unsigned host[8];
    CK(cuMemsetD32Async((CUdeviceptr)dseen, 0, 8, s));
    int spin = 200000;
    void *a1[] = {&dseen, &spin};
    CK(cuLaunchKernel(fsm, 132 * 16, 1, 1, 64, 1, 1, 0, s, a1, nullptr));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(host, (CUdeviceptr)dseen, sizeof host));
    printf(" distinct smid %d;", count_bits(host, 8));

    int iters = 20000;
    void *a2[] = {&dout, &iters};
    CUevent e0, e1;
    CK(cuEventCreate(&e0, 0));
    CK(cuEventCreate(&e1, 0));
    CK(cuLaunchKernel(ffma, 132 * 32, 1, 1, 256, 1, 1, 0, s, a2, nullptr)); // warm
    CK(cuEventRecord(e0, s));
    for (int k = 0; k < 5; k++)
        CK(cuLaunchKernel(ffma, 132 * 32, 1, 1, 256, 1, 1, 0, s, a2, nullptr));
    CK(cuEventRecord(e1, s));
    CK(cuStreamSynchronize(s));
    float ms = 0;
    CK(cuEventElapsedTime(&ms, e0, e1));
    printf(" fma kernel %.3f ms;", ms / 5);

    CK(cuMemsetD32Async((CUdeviceptr)dseen, 0, 8, s));
    void *a3[] = {&dseen};
    r = cuLaunchKernel(fcl, 132 * 8, 1, 1, 64, 1, 1, 0, s, a3, nullptr);
    if (r == CUDA_SUCCESS)
        r = cuStreamSynchronize(s);
    if (r != CUDA_SUCCESS) {
        printf(" cluster-2 launch -> %d\n", (int)r);
    } else {
        CK(cuMemcpyDtoH(host, (CUdeviceptr)dseen, sizeof host));
        printf(" cluster-2 ok, distinct smid %d\n", count_bits(host, 8));
    }
    return CUDA_SUCCESS;
}

int main() {
    cudaFree(0); // primary context, as an application's runtime makes it
    CUdevice dev;
    CK(cuCtxGetDevice(&dev));
    CUfunction fsm, ffma, fcl;
    if (cudaGetFuncBySymbol(&fsm, (const void *)smids) != cudaSuccess ||
        cudaGetFuncBySymbol(&ffma, (const void *)fma_loop) != cudaSuccess ||
        cudaGetFuncBySymbol(&fcl, (const void *)clustered) != cudaSuccess) {
        printf("cudaGetFuncBySymbol failed\n");
        return 1;
    }
    unsigned *dseen;
    float *dout;
    cudaMalloc(&dseen, 64);
    cudaMalloc(&dout, 64);
    CUdevResource all;
    CK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    CUdevResource groups[64], rem;
    memset(&rem, 0, sizeof rem);
    unsigned nb = 64;
    CK(cuDevSmResourceSplitByCount(groups, &nb, &all, &rem, 0, 8));
    printf("device %u SMs: %u groups of %u, remainder %u SMs\n", all.sm.smCount, nb, groups[0].sm.smCount,
           rem.sm.smCount);
    std::vector<CUdevResource> v;
    // 7 groups (what the trainer holds beside an LC holding 8 of 15), with and without the remainder
    v.assign(groups, groups + 7);
    run_case("7 groups", v.data(), v.size(), dev, fsm, ffma, fcl, dseen, dout);
    v.push_back(rem);
    run_case("7 groups + remainder", v.data(), v.size(), dev, fsm, ffma, fcl, dseen, dout);
    v.assign(groups + 14, groups + 15);
    v.push_back(rem);
    run_case("last group + remainder", v.data(), v.size(), dev, fsm, ffma, fcl, dseen, dout);
    run_case("remainder alone", &rem, 1, dev, fsm, ffma, fcl, dseen, dout);
    v.assign(groups, groups + nb);
    run_case("all groups", v.data(), v.size(), dev, fsm, ffma, fcl, dseen, dout);
    v.push_back(rem);
    run_case("all groups + remainder", v.data(), v.size(), dev, fsm, ffma, fcl, dseen, dout);
    // the split's own alternative: no coscheduling guarantee, 12-SM groups cover all 132 SMs
    CUdevResource g12[64], rem12;
    memset(&rem12, 0, sizeof rem12);
    unsigned nb12 = 64;
    CUresult r = cuDevSmResourceSplitByCount(g12, &nb12, &all, &rem12, CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING, 12);
    if (r != CUDA_SUCCESS) {
        printf("split IGNORE_SM_COSCHEDULING min 12 -> %d\n", (int)r);
    } else {
        printf("split IGNORE_SM_COSCHEDULING min 12: %u groups of %u, remainder %u\n", nb12, g12[0].sm.smCount,
               rem12.sm.smCount);
        run_case("6 groups of 12, no coscheduling", g12, 6, dev, fsm, ffma, fcl, dseen, dout);
    }
    return 0;
}
