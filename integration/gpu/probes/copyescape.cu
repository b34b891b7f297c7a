// copyescape.cu — do device-to-device copies and memsets stay inside a green context's SMs, and can a captured
// graph's memset and memcpy nodes be moved to another green context as its kernel nodes can? No DetShare code.
//
// isolation.sh showed a 32-SM tenant's kernels slowed 14x beside a neighbour doing nothing but 1 GiB device copies,
// and not beside a neighbour running kernels. A compute-only kernel K runs on green context A (4 groups); while a
// flood of operations runs on green context B (the other groups) or on a primary-context stream, K's time tells
// whether the flood took A's SMs. Kernels on B are the control (confined: K unchanged). Then the reverse: a copy
// on A timed alone and beside a kernel flood on B.
//
// Graphs: a graph captured on A holds a 1 GiB memset, a 256 MiB device copy and a kernel. A clone gets every node's
// context set to B with cuGraphNodeSetParams (memset: CUDA_MEMSET_NODE_PARAMS_v2.ctx, memcpy:
// CUDA_MEMCPY_NODE_PARAMS.copyCtx, kernel: func = NULL, kern, ctx). K is timed while replays of either flood the GPU.
//
//   nvcc -O2 -arch=sm_90 -o copyescape integration/gpu/probes/copyescape.cu -lcuda && ./copyescape
// Output: one "what flood=... ms ratio" line per case, and one line per moved graph node.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#define CHECK(x)                                                                                                    \
    do {                                                                                                            \
        int r_ = (int)(x);                                                                                          \
        if (r_) {                                                                                                   \
            printf("FAIL %s -> %d (line %d)\n", #x, r_, __LINE__);                                                   \
            return 1;                                                                                               \
        }                                                                                                           \
    } while (0)

__global__ void fma_only(float *x, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = (float)i;
    for (int k = 0; k < iters; k++)
        v = v * 0.999999f + 0.5f;
    x[i] = v;
}

static float median_of(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main() {
    CHECK(cudaFree(0));
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    CUdevResource all, rem, parts[64];
    memset(&all, 0, sizeof all);
    CHECK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    unsigned n = 64;
    CHECK(cuDevSmResourceSplitByCount(parts, &n, &all, &rem, 0, 8));
    if (n < 8) {
        printf("FAIL only %u groups\n", n);
        return 1;
    }
    CUstream sA, sB;
    CUcontext cA, cB;
    int smsA = 0, smsB = 0;
    for (int side = 0; side < 2; side++) {
        unsigned first = side ? 4 : 0, cnt = side ? n - 4 : 4;
        CUdevResourceDesc d;
        CUgreenCtx g;
        CHECK(cuDevResourceGenerateDesc(&d, &parts[first], cnt));
        CHECK(cuGreenCtxCreate(&g, d, dev, CU_GREEN_CTX_DEFAULT_STREAM));
        CHECK(cuCtxFromGreenCtx(side ? &cB : &cA, g));
        CHECK(cuGreenCtxStreamCreate(side ? &sB : &sA, g, CU_STREAM_NON_BLOCKING, 0));
        for (unsigned i = first; i < first + cnt; i++)
            (side ? smsB : smsA) += parts[i].sm.smCount;
    }
    cudaStream_t sP;
    CHECK(cudaStreamCreateWithFlags(&sP, cudaStreamNonBlocking));
    printf("A_sms %d B_sms %d device_sms %u mps_env %s\n", smsA, smsB, all.sm.smCount,
           getenv("CUDA_MPS_PIPE_DIRECTORY") ? "set" : "-");

    const size_t big = 1ull << 30, small = 256ull << 20;
    float *kbuf, *fbuf;
    CUdeviceptr src, dst, src2, dst2;
    CHECK(cudaMalloc(&kbuf, 4096 * 256 * sizeof(float)));
    CHECK(cudaMalloc(&fbuf, 4096 * 256 * sizeof(float)));
    CHECK(cuMemAlloc(&src, big));
    CHECK(cuMemAlloc(&dst, big));
    CHECK(cuMemAlloc(&src2, small));
    CHECK(cuMemAlloc(&dst2, small));
    CHECK(cuMemsetD32(src, 1, big / 4));
    CHECK(cuMemsetD32(src2, 2, small / 4));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));

    // what is measured on A: the kernel K (one wave of 8 CTAs per SM), or a 256 MiB copy
    auto kernelA = [&] { fma_only<<<smsA * 8, 256, 0, (cudaStream_t)sA>>>(kbuf, 100000); };
    auto copyA = [&] { cuMemcpyDtoDAsync(dst2, src2, small, sA); };
    auto timeOnA = [&](const std::function<void()> &op) {
        std::vector<float> v;
        for (int i = 0; i < 7; i++) {
            cudaEventRecord(e0, (cudaStream_t)sA);
            op();
            cudaEventRecord(e1, (cudaStream_t)sA);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            v.push_back(ms);
        }
        return median_of(v);
    };
    struct Flood {
        const char *name;
        std::function<void()> op;
    };
    std::vector<Flood> floods = {
        {"none", [] {}},
        {"kernels_on_B", [&] { fma_only<<<smsB * 8, 256, 0, (cudaStream_t)sB>>>(fbuf, 20000); }},
        {"memcpyDtoD_on_B", [&] { cuMemcpyDtoDAsync(dst, src, big, sB); }},
        {"memsetD32_on_B", [&] { cuMemsetD32Async(dst, 7, big / 4, sB); }},
        {"memcpyDtoD_on_primary", [&] { cuMemcpyDtoDAsync(dst, src, big, (CUstream)sP); }},
        {"memsetD32_on_primary", [&] { cuMemsetD32Async(dst, 7, big / 4, (CUstream)sP); }},
    };
    for (int what = 0; what < 2; what++) {
        const char *wname = what ? "copy256MiB_on_A" : "kernel_on_A";
        float alone = 0;
        for (auto &f : floods) {
            CHECK(cudaDeviceSynchronize());
            for (int i = 0; i < 200; i++) // ~100+ ms of flood, longer than the measurement
                f.op();
            std::this_thread::sleep_for(std::chrono::milliseconds(3));
            float ms = timeOnA(what ? std::function<void()>(copyA) : std::function<void()>(kernelA));
            CHECK(cudaGetLastError());
            CHECK(cudaDeviceSynchronize());
            if (!alone)
                alone = ms;
            printf("%s flood=%s ms %.3f ratio %.2f\n", wname, f.name, ms, ms / alone);
        }
    }

    // the graph, captured on A
    CUgraph g;
    CHECK(cuStreamBeginCapture(sA, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CHECK(cuMemsetD32Async(dst, 7, big / 4, sA));
    CHECK(cuMemcpyDtoDAsync(dst2, src2, small, sA));
    fma_only<<<8, 256, 0, (cudaStream_t)sA>>>(fbuf, 10);
    CHECK(cuStreamEndCapture(sA, &g));

    // the clone, every node moved to B
    CUgraph g2;
    CHECK(cuGraphClone(&g2, g));
    size_t nn = 0;
    CHECK(cuGraphGetNodes(g2, nullptr, &nn));
    std::vector<CUgraphNode> nodes(nn);
    CHECK(cuGraphGetNodes(g2, nodes.data(), &nn));
    for (CUgraphNode nd : nodes) {
        CUgraphNodeType ty;
        CHECK(cuGraphNodeGetType(nd, &ty));
        CUgraphNodeParams p;
        memset(&p, 0, sizeof p);
        CUresult gr = CUDA_ERROR_NOT_SUPPORTED;
        if (ty == CU_GRAPH_NODE_TYPE_MEMSET) {
            CUDA_MEMSET_NODE_PARAMS m;
            CHECK(cuGraphMemsetNodeGetParams(nd, &m));
            p.type = CU_GRAPH_NODE_TYPE_MEMSET;
            p.memset.dst = m.dst;
            p.memset.pitch = m.pitch;
            p.memset.value = m.value;
            p.memset.elementSize = m.elementSize;
            p.memset.width = m.width;
            p.memset.height = m.height;
            p.memset.ctx = cB;
            gr = cuGraphNodeSetParams(nd, &p);
            printf("memset node: set ctx to B -> %d\n", (int)gr);
        } else if (ty == CU_GRAPH_NODE_TYPE_MEMCPY) {
            CUDA_MEMCPY3D c;
            CHECK(cuGraphMemcpyNodeGetParams(nd, &c));
            p.type = CU_GRAPH_NODE_TYPE_MEMCPY;
            p.memcpy.copyParams = c;
            p.memcpy.copyCtx = cB;
            gr = cuGraphNodeSetParams(nd, &p);
            printf("memcpy node: set copyCtx to B -> %d\n", (int)gr);
        } else if (ty == CU_GRAPH_NODE_TYPE_KERNEL) {
            CUDA_KERNEL_NODE_PARAMS_v2 k;
            CHECK(cuGraphKernelNodeGetParams_v2(nd, &k));
            if (k.kern) {
                k.func = nullptr;
                k.ctx = cB;
                gr = cuGraphKernelNodeSetParams_v2(nd, &k);
            }
            printf("kernel node: kern %p, set ctx to B -> %d\n", (void *)k.kern, (int)gr);
        }
    }
    CUgraphExec eA, eB;
    CHECK(cuGraphInstantiate(&eA, g, 0));
    CUresult ir = cuGraphInstantiate(&eB, g2, 0);
    printf("instantiate moved clone -> %d\n", (int)ir);
    if (ir)
        return 1;

    struct {
        const char *name;
        CUgraphExec e;
    } gfloods[] = {{"none", nullptr}, {"graph_captured_on_A", eA}, {"graph_moved_to_B", eB}};
    float alone = 0;
    for (auto &f : gfloods) {
        CHECK(cudaDeviceSynchronize());
        for (int i = 0; f.e && i < 100; i++)
            CHECK(cuGraphLaunch(f.e, sB));
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
        float ms = timeOnA(kernelA);
        CHECK(cudaDeviceSynchronize());
        if (!alone)
            alone = ms;
        printf("kernel_on_A flood=%s ms %.3f ratio %.2f\n", f.name, ms, ms / alone);
    }
    // the moved graph's memset must still set what it set
    std::vector<unsigned> h(16);
    CHECK(cuMemsetD32(dst, 0, big / 4));
    CHECK(cuGraphLaunch(eB, sB));
    CHECK(cuStreamSynchronize(sB));
    CHECK(cuMemcpyDtoH(h.data(), dst + big - 64, 64));
    printf("moved graph memset result %s\n", h[15] == 7 ? "ok" : "WRONG");
    printf("done\n");
    return 0;
}
