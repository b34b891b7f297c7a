// graphcopy.cu — can a captured graph's memset and memcpy nodes be moved to another green context, as its kernel
// nodes can (greenperf.cu section 3)? No DetShare code.
//
// A graph captured on green context A holds a 1 GiB memset, a 256 MiB device copy and a kernel. A clone gets every
// node's context set to green context B with cuGraphNodeSetParams (memset: CUDA_MEMSET_NODE_PARAMS_v2.ctx, memcpy:
// CUDA_MEMCPY_NODE_PARAMS.copyCtx, kernel: func = NULL, kern, ctx). While replays of a graph flood the GPU, a
// compute-only kernel K runs on A: if the flood's memset and copy ran on A's SMs, K slows down.
//
//   nvcc -O2 -arch=sm_90 -o graphcopy integration/gpu/probes/graphcopy.cu -lcuda && ./graphcopy
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

int main() {
    CHECK(cudaFree(0));
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    CUdevResource all, rem, parts[64];
    memset(&all, 0, sizeof all);
    CHECK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    unsigned n = 64;
    CHECK(cuDevSmResourceSplitByCount(parts, &n, &all, &rem, 0, 8));
    CUstream sA, sB;
    CUcontext cA, cB;
    int smsA = 32;
    for (int side = 0; side < 2; side++) {
        unsigned first = side ? 4 : 0, cnt = side ? n - 4 : 4;
        CUdevResourceDesc d;
        CUgreenCtx g;
        CHECK(cuDevResourceGenerateDesc(&d, &parts[first], cnt));
        CHECK(cuGreenCtxCreate(&g, d, dev, CU_GREEN_CTX_DEFAULT_STREAM));
        CHECK(cuCtxFromGreenCtx(side ? &cB : &cA, g));
        CHECK(cuGreenCtxStreamCreate(side ? &sB : &sA, g, CU_STREAM_NON_BLOCKING, 0));
    }
    const size_t big = 1ull << 30, mid = 256ull << 20;
    CUdeviceptr buf, src, dst;
    float *kbuf, *tbuf;
    CHECK(cuMemAlloc(&buf, big));
    CHECK(cuMemAlloc(&src, mid));
    CHECK(cuMemAlloc(&dst, mid));
    CHECK(cudaMalloc(&kbuf, 4096 * 256 * sizeof(float)));
    CHECK(cudaMalloc(&tbuf, 4096 * 256 * sizeof(float)));

    // the graph, captured on A
    CUgraph g;
    CHECK(cuStreamBeginCapture(sA, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CHECK(cuMemsetD32Async(buf, 7, big / 4, sA));
    CHECK(cuMemcpyDtoDAsync(dst, src, mid, sA));
    fma_only<<<8, 256, 0, (cudaStream_t)sA>>>(tbuf, 10);
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

    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    auto timeK = [&] {
        std::vector<float> v;
        for (int i = 0; i < 7; i++) {
            cudaEventRecord(e0, (cudaStream_t)sA);
            fma_only<<<smsA * 8, 256, 0, (cudaStream_t)sA>>>(kbuf, 100000);
            cudaEventRecord(e1, (cudaStream_t)sA);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            v.push_back(ms);
        }
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    struct {
        const char *name;
        CUgraphExec e;
    } floods[] = {{"none", nullptr}, {"captured_graph_on_B_stream", eA}, {"moved_clone_on_B_stream", eB}};
    float alone = 0;
    for (auto &f : floods) {
        CHECK(cudaDeviceSynchronize());
        for (int i = 0; f.e && i < 100; i++)
            CHECK(cuGraphLaunch(f.e, sB));
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
        float ms = timeK();
        CHECK(cudaDeviceSynchronize());
        if (!alone)
            alone = ms;
        printf("kernel_on_A flood=%s ms %.3f ratio %.2f\n", f.name, ms, ms / alone);
    }
    // the moved clone's copy must still be right
    std::vector<unsigned> h(16);
    CHECK(cuMemsetD32(buf, 0, big / 4));
    CHECK(cuGraphLaunch(eB, sB));
    CHECK(cuStreamSynchronize(sB));
    CHECK(cuMemcpyDtoH(h.data(), buf + big - 64, 64));
    printf("moved clone memset result %s\n", h[15] == 7 ? "ok" : "WRONG");
    printf("done\n");
    return 0;
}
