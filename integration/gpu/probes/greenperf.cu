// greenperf.cu — what green contexts cost on a real GPU, side by side in one process, with no DetShare code.
//
// It answers the questions the GPU-coroutine design depends on (issue 5):
//   1. eager launches: a chain of N kernels on a primary stream, on a green stream, with an event edge pair around
//      every kernel (libdetshare's old scheme), and with one edge in and one out around the whole chain (lazy join);
//   2. graph replay: the same chain captured on a primary stream, on a green stream, through per-kernel edges and
//      through a lazy join, replayed on the primary stream and on the green stream;
//   3. moving a graph to other SMs without re-capturing: a clone whose kernel nodes get the green context in
//      CUDA_KERNEL_NODE_PARAMS_v2.ctx (with func kept, and with func=NULL + kern=CUkernel), checked with %smid.
//
//   nvcc -O2 -arch=sm_90 -o greenperf integration/gpu/probes/greenperf.cu -lcuda
//   ./greenperf [N=200] [reps=15]
// Output: one "key value" line per figure (times in microseconds, medians over reps).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <vector>

static int g_fail;
#define CK(x) ck_cu((x), #x, __LINE__)
#define RK(x) ck_rt((x), #x, __LINE__)
static bool ck_cu(CUresult r, const char *what, int line) {
    if (r == CUDA_SUCCESS)
        return true;
    const char *s = nullptr;
    cuGetErrorString(r, &s);
    printf("FAIL line %d: %s -> %d %s\n", line, what, (int)r, s ? s : "?");
    g_fail++;
    return false;
}
static bool ck_rt(cudaError_t r, const char *what, int line) {
    if (r == cudaSuccess)
        return true;
    printf("FAIL line %d: %s -> %s\n", line, what, cudaGetErrorString(r));
    g_fail++;
    return false;
}

__device__ unsigned smid() {
    unsigned r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}
__global__ void tiny(float *x) { x[threadIdx.x] += 1.0f; }
__global__ void work(float *x, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = x[i];
    for (int k = 0; k < iters; k++)
        v = v * 1.000001f + 0.5f;
    x[i] = v;
}
__global__ void smidk(unsigned *out, int spin) {
    long long t = clock64();
    while (clock64() - t < spin) {
    }
    if (threadIdx.x == 0)
        out[blockIdx.x] = smid();
}

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}
static double timed(const std::function<void()> &f, int reps) {
    for (int i = 0; i < 3; i++)
        f();
    std::vector<double> v;
    for (int i = 0; i < reps; i++) {
        double t = now_us();
        f();
        v.push_back(now_us() - t);
    }
    return median(v);
}

struct Green {
    CUgreenCtx g = nullptr;
    CUcontext c = nullptr;
    CUstream s = nullptr;
    int sms = 0;
};
static CUdevResource g_parts[64];
static unsigned g_nparts;

static bool make_green(CUdevice dev, unsigned first, unsigned n, Green &out) {
    CUdevResourceDesc d;
    if (!CK(cuDevResourceGenerateDesc(&d, &g_parts[first], n)) ||
        !CK(cuGreenCtxCreate(&out.g, d, dev, CU_GREEN_CTX_DEFAULT_STREAM)) || !CK(cuCtxFromGreenCtx(&out.c, out.g)) ||
        !CK(cuGreenCtxStreamCreate(&out.s, out.g, CU_STREAM_NON_BLOCKING, 0)))
        return false;
    out.sms = 0;
    for (unsigned i = first; i < first + n; i++)
        out.sms += g_parts[i].sm.smCount;
    return true;
}

enum Kind { TINY, WORK };
static float *g_x;
static void launch(Kind k, cudaStream_t s) {
    if (k == TINY)
        tiny<<<1, 32, 0, s>>>(g_x);
    else
        work<<<264, 256, 0, s>>>(g_x, 400);
}

// How the chain is submitted.
enum Mode { ON_APP, ON_GREEN, EDGES, LAZY };
static const char *mode_name[] = {"primary", "green", "edges", "lazy"};
struct Chain {
    cudaStream_t app;
    CUstream phys;
    CUevent ein, eout;
};
static void submit(const Chain &c, Mode m, Kind k, int n) {
    switch (m) {
    case ON_APP:
        for (int i = 0; i < n; i++)
            launch(k, c.app);
        break;
    case ON_GREEN:
        for (int i = 0; i < n; i++)
            launch(k, (cudaStream_t)c.phys);
        break;
    case EDGES:
        for (int i = 0; i < n; i++) {
            cuEventRecord(c.ein, (CUstream)c.app);
            cuStreamWaitEvent(c.phys, c.ein, 0);
            launch(k, (cudaStream_t)c.phys);
            cuEventRecord(c.eout, c.phys);
            cuStreamWaitEvent((CUstream)c.app, c.eout, 0);
        }
        break;
    case LAZY:
        cuEventRecord(c.ein, (CUstream)c.app);
        cuStreamWaitEvent(c.phys, c.ein, 0);
        for (int i = 0; i < n; i++)
            launch(k, (cudaStream_t)c.phys);
        cuEventRecord(c.eout, c.phys);
        cuStreamWaitEvent((CUstream)c.app, c.eout, 0);
        break;
    }
}

static int distinct_sms(unsigned *d, int n) {
    std::vector<unsigned> h(n);
    RK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    std::set<unsigned> s(h.begin(), h.end());
    return (int)s.size();
}

// Clone g and give every kernel node context ctx. how: 0 = keep func, set ctx; 1 = func NULL, kern = k, set ctx.
static CUgraph recontext(CUgraph g, CUcontext ctx, int how, CUkernel k, bool print) {
    CUgraph c = nullptr;
    if (!CK(cuGraphClone(&c, g)))
        return nullptr;
    size_t n = 0;
    CK(cuGraphGetNodes(c, nullptr, &n));
    std::vector<CUgraphNode> nodes(n);
    CK(cuGraphGetNodes(c, nodes.data(), &n));
    for (size_t i = 0; i < n; i++) {
        CUgraphNodeType t;
        CK(cuGraphNodeGetType(nodes[i], &t));
        if (t != CU_GRAPH_NODE_TYPE_KERNEL)
            continue;
        CUDA_KERNEL_NODE_PARAMS_v2 p;
        memset(&p, 0, sizeof p);
        if (!CK(cuGraphKernelNodeGetParams_v2(nodes[i], &p)))
            return nullptr;
        if (print && i == 0)
            printf("node_params func=%p kern=%p ctx=%p\n", (void *)p.func, (void *)p.kern, (void *)p.ctx);
        p.ctx = ctx;
        if (how == 1) {
            p.func = nullptr;
            p.kern = k;
        }
        if (!CK(cuGraphKernelNodeSetParams_v2(nodes[i], &p))) {
            cuGraphDestroy(c);
            return nullptr;
        }
    }
    return c;
}

// Captures one launch of f on stream s and prints what its kernel node records (func, kern, ctx).
static void print_captured_node(const char *label, CUfunction f, CUstream s, unsigned *out, int blocks) {
    CUdeviceptr o = (CUdeviceptr)out;
    void *args[] = {&o};
    cudaGraph_t g;
    RK(cudaStreamBeginCapture((cudaStream_t)s, cudaStreamCaptureModeThreadLocal));
    CK(cuLaunchKernel(f, blocks, 1, 1, 32, 1, 1, 0, s, args, nullptr));
    RK(cudaStreamEndCapture((cudaStream_t)s, &g));
    size_t n = 1;
    CUgraphNode node;
    CK(cuGraphGetNodes((CUgraph)g, &node, &n));
    CUDA_KERNEL_NODE_PARAMS_v2 p;
    memset(&p, 0, sizeof p);
    CK(cuGraphKernelNodeGetParams_v2(node, &p));
    printf("%s func=%p kern=%p ctx=%p (launched %p)\n", label, (void *)p.func, (void *)p.kern, (void *)p.ctx,
           (void *)f);
    cudaGraphDestroy(g);
}

int main(int argc, char **argv) {
    int N = argc > 1 ? atoi(argv[1]) : 200, reps = argc > 2 ? atoi(argv[2]) : 15;
    RK(cudaFree(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext primary;
    CK(cuCtxGetCurrent(&primary));
    CUdevResource all;
    memset(&all, 0, sizeof all);
    CK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    CUdevResource rem;
    g_nparts = 64;
    CK(cuDevSmResourceSplitByCount(g_parts, &g_nparts, &all, &rem, 0, 8));
    printf("device_sms %u groups %u group_sms %u remainder %u\n", all.sm.smCount, g_nparts, g_parts[0].sm.smCount,
           rem.sm.smCount);
    const char *mps = getenv("CUDA_MPS_PIPE_DIRECTORY");
    printf("mps_env %s\n", mps ? mps : "-");

    Green gall, g4, g4b;
    if (!make_green(dev, 0, g_nparts, gall) || !make_green(dev, 0, 4, g4) || !make_green(dev, 4, 4, g4b))
        return 1;
    printf("green_all_sms %d green4_sms %d\n", gall.sms, g4.sms);
    RK(cudaMalloc(&g_x, 264 * 256 * sizeof(float)));
    RK(cudaMemset(g_x, 0, 264 * 256 * sizeof(float)));
    cudaStream_t app;
    RK(cudaStreamCreateWithFlags(&app, cudaStreamNonBlocking));
    CUevent ein, eout;
    CK(cuEventCreate(&ein, CU_EVENT_DISABLE_TIMING));
    CK(cuEventCreate(&eout, CU_EVENT_DISABLE_TIMING));

    // ---- 1. eager chains ----
    const Kind kinds[] = {TINY, WORK};
    const char *kind_name[] = {"tiny", "work"};
    Green *greens[] = {&gall, &g4};
    const char *gname[] = {"all", "g4"};
    // every (kernel kind, green context, submission mode); the primary-stream mode once per kind
    auto each_case = [&](const std::function<void(Kind, int, Mode, const Chain &)> &f) {
        for (Kind k : kinds)
            for (int gi = 0; gi < 2; gi++)
                for (int m = ON_APP; m <= LAZY; m++)
                    if (!(m == ON_APP && gi == 1))
                        f(k, gi, (Mode)m, Chain{app, greens[gi]->s, ein, eout});
    };
    each_case([&](Kind k, int gi, Mode m, const Chain &c) {
        cudaStream_t sync = m == ON_GREEN ? (cudaStream_t)c.phys : app;
        double submit_us = 0;
        double t = timed(
            [&] {
                double t0 = now_us();
                submit(c, m, k, N);
                submit_us = now_us() - t0;
                cudaStreamSynchronize(sync);
            },
            reps);
        printf("eager %s %s %s total_us %.1f per_kernel_us %.2f submit_us %.1f\n", kind_name[k],
               m == ON_APP ? "-" : gname[gi], mode_name[m], t, t / N, submit_us);
    });

    // ---- 2. graph replay ----
    each_case([&](Kind k, int gi, Mode m, const Chain &c) {
        cudaStream_t cap = m == ON_GREEN ? (cudaStream_t)c.phys : app;
        cudaGraph_t g;
        cudaGraphExec_t e;
        if (!RK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal)))
            return;
        submit(c, m, k, N);
        if (!RK(cudaStreamEndCapture(cap, &g)) || !RK(cudaGraphInstantiate(&e, g, 0)))
            return;
        size_t nn = 0;
        cudaGraphGetNodes(g, nullptr, &nn);
        for (int on = 0; on < 2; on++) {
            cudaStream_t ls = on == 0 ? app : (cudaStream_t)c.phys;
            double lat = timed(
                [&] {
                    cudaGraphLaunch(e, ls);
                    cudaStreamSynchronize(ls);
                },
                reps * 2);
            double thr = timed(
                             [&] {
                                 for (int i = 0; i < 10; i++)
                                     cudaGraphLaunch(e, ls);
                                 cudaStreamSynchronize(ls);
                             },
                             reps) /
                         10;
            printf("graph %s %s cap_%s nodes %zu launch_on %s replay_us %.1f back_to_back_us %.1f\n", kind_name[k],
                   m == ON_APP ? "-" : gname[gi], mode_name[m], nn, on == 0 ? "primary" : "green", lat, thr);
        }
        cudaGraphExecDestroy(e);
        cudaGraphDestroy(g);
    });

    // ---- 3. re-contexting a primary-captured graph: confinement and replay cost ----
    const int NB = 1024;
    unsigned *sm_out;
    RK(cudaMalloc(&sm_out, NB * 4));
    cudaKernel_t ksm = nullptr, ktiny = nullptr;
    RK(cudaGetKernel(&ksm, smidk));
    RK(cudaGetKernel(&ktiny, tiny));
    cudaFunction_t fsm = nullptr;
    RK(cudaGetFuncBySymbol(&fsm, (const void *)smidk));
    printf("handles cudaGetKernel(smidk)=%p cudaGetFuncBySymbol(smidk)=%p green4_ctx=%p primary=%p\n", (void *)ksm,
           (void *)fsm, (void *)g4.c, (void *)primary);
    // smid graph captured on the primary stream, and one captured on the 4-group green stream
    for (int src = 0; src < 2; src++) {
        cudaStream_t cap = src == 0 ? app : (cudaStream_t)g4.s;
        cudaGraph_t g;
        RK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal));
        smidk<<<NB, 64, 0, cap>>>(sm_out, 20000);
        RK(cudaStreamEndCapture(cap, &g));
        cudaGraphExec_t e;
        RK(cudaGraphInstantiate(&e, g, 0));
        RK(cudaGraphLaunch(e, app));
        RK(cudaStreamSynchronize(app));
        printf("smid %s_capture as_is sms %d\n", src ? "green4" : "primary", distinct_sms(sm_out, NB));
        cudaGraphExecDestroy(e);
        for (int how = 0; how < 2; how++) {
            CUgraph c = recontext((CUgraph)g, g4b.c, how, (CUkernel)ksm, true);
            if (!c) {
                printf("smid %s_capture recontext_%s failed\n", src ? "green4" : "primary",
                       how ? "kern" : "func");
                continue;
            }
            CUgraphExec ce;
            if (CK(cuGraphInstantiateWithFlags(&ce, c, 0))) {
                RK(cudaMemset(sm_out, 0xff, NB * 4));
                CK(cuGraphLaunch(ce, (CUstream)app));
                RK(cudaStreamSynchronize(app));
                std::vector<unsigned> h(NB);
                RK(cudaMemcpy(h.data(), sm_out, NB * 4, cudaMemcpyDeviceToHost));
                std::set<unsigned> s(h.begin(), h.end());
                printf("smid %s_capture recontext_%s(to g4b) sms %zu min %u max %u\n", src ? "green4" : "primary",
                       how ? "kern" : "func", s.size(), *s.begin(), *s.rbegin());
                cuGraphExecDestroy(ce);
            }
            cuGraphDestroy(c);
        }
        cudaGraphDestroy(g);
    }
    // which SMs the two green contexts own, for reference
    for (int i = 0; i < 2; i++) {
        Green &gg = i ? g4b : g4;
        smidk<<<NB, 64, 0, (cudaStream_t)gg.s>>>(sm_out, 20000);
        RK(cudaStreamSynchronize((cudaStream_t)gg.s));
        std::vector<unsigned> h(NB);
        RK(cudaMemcpy(h.data(), sm_out, NB * 4, cudaMemcpyDeviceToHost));
        std::set<unsigned> s(h.begin(), h.end());
        printf("smid eager_on_%s sms %zu min %u max %u\n", i ? "g4b" : "g4", s.size(), *s.begin(), *s.rbegin());
    }
    // replay cost of a re-contexted tiny chain vs the primary and green captures
    {
        cudaGraph_t g;
        RK(cudaStreamBeginCapture(app, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < N; i++)
            tiny<<<1, 32, 0, app>>>(g_x);
        RK(cudaStreamEndCapture(app, &g));
        for (int how = 0; how < 2; how++) {
            CUgraph c = recontext((CUgraph)g, gall.c, how, (CUkernel)ktiny, false);
            CUgraphExec ce;
            if (!c || !CK(cuGraphInstantiateWithFlags(&ce, c, 0)))
                continue;
            for (int on = 0; on < 2; on++) {
                CUstream ls = on == 0 ? (CUstream)app : gall.s;
                double lat = timed(
                    [&] {
                        cuGraphLaunch(ce, ls);
                        cuStreamSynchronize(ls);
                    },
                    reps * 2);
                printf("graph tiny all recontext_%s launch_on %s replay_us %.1f\n", how ? "kern" : "func",
                       on ? "green" : "primary", lat);
            }
            double t0 = now_us();
            CUgraph c2 = recontext((CUgraph)g, g4.c, how, (CUkernel)ktiny, false);
            CUgraphExec ce2;
            bool ok = c2 && CK(cuGraphInstantiateWithFlags(&ce2, c2, 0));
            printf("recontext_%s_cost_us %.1f (clone + %d set-params + instantiate)\n", how ? "kern" : "func",
                   now_us() - t0, N);
            if (ok)
                cuGraphExecDestroy(ce2);
            cuGraphExecDestroy(ce);
            cuGraphDestroy(c);
            if (c2)
                cuGraphDestroy(c2);
        }
        cudaGraphDestroy(g);
    }
    // ---- 4. what a captured node records for a module function (cuModuleLoadData, Triton's way) ----
    {
        static const char ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
                                  ".visible .entry modk(.param .u64 out) {\n"
                                  " .reg .b32 %r<3>; .reg .b64 %rd<4>;\n"
                                  " ld.param.u64 %rd1, [out]; cvta.to.global.u64 %rd2, %rd1;\n"
                                  " mov.u32 %r1, %smid; mov.u32 %r2, %ctaid.x; mul.wide.u32 %rd3, %r2, 4;\n"
                                  " add.s64 %rd2, %rd2, %rd3; st.global.u32 [%rd2], %r1; ret; }\n";
        CUmodule mod;
        CUfunction mf;
        if (CK(cuModuleLoadData(&mod, ptx)) && CK(cuModuleGetFunction(&mf, mod, "modk")))
            print_captured_node("module_function_node", mf, g4.s, sm_out, NB);
        CUlibrary lib;
        CUkernel lk;
        if (CK(cuLibraryLoadData(&lib, ptx, nullptr, nullptr, 0, nullptr, nullptr, 0)) &&
            CK(cuLibraryGetKernel(&lk, lib, "modk")))
            print_captured_node("library_kernel_node", (CUfunction)lk, g4.s, sm_out, NB);
    }
    // ---- 5. does making a green context (or a stream of one) wait for work already on the GPU? ----
    {
        cudaStream_t busy;
        RK(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
        for (int loaded = 0; loaded < 2; loaded++) {
            RK(cudaDeviceSynchronize());
            if (loaded)
                smidk<<<132, 64, 0, busy>>>(sm_out, 200000000); /* ~100 ms at ~2 GHz */
            double t0 = now_us();
            Green gg;
            bool ok = make_green(dev, 8 + loaded * 2, 2, gg); /* a group set not used above */
            double t1 = now_us();
            CUstream extra = nullptr;
            if (ok)
                CK(cuGreenCtxStreamCreate(&extra, gg.g, CU_STREAM_NON_BLOCKING, 0));
            double t2 = now_us();
            CUevent ev;
            CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
            double t3 = now_us();
            bool kernel_done = cudaStreamQuery(busy) == cudaSuccess;
            printf("create_%s green_ctx_us %.0f (incl. first stream) green_stream_us %.0f event_us %.0f "
                   "busy_kernel_done_after %s\n",
                   loaded ? "while_busy" : "idle", t1 - t0, t2 - t1, t3 - t2, kernel_done ? "yes" : "no");
        }
        RK(cudaStreamSynchronize(busy));
    }
    // ---- 7. while another thread creates a green context (waiting for in-flight work), can this thread launch? ----
    {
        cudaStream_t busy, s2;
        RK(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
        RK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
        RK(cudaDeviceSynchronize());
        smidk<<<8, 64, 0, busy>>>(sm_out, 200000000); /* ~100 ms on 8 SMs */
        std::atomic<int> started{0};
        double create_us = 0;
        std::thread creator([&] {
            cuCtxSetCurrent(primary);
            started = 1;
            double t0 = now_us();
            Green gg;
            make_green(dev, 13, 2, gg);
            create_us = now_us() - t0;
        });
        while (!started)
            ;
        double worst = 0, t_end = now_us() + 150000;
        int n = 0;
        while (now_us() < t_end) {
            double t0 = now_us();
            tiny<<<1, 32, 0, s2>>>(g_x);
            double dt = now_us() - t0;
            if (dt > worst)
                worst = dt;
            n++;
            while (now_us() < t0 + 100) /* one launch every 100 us: the launch queue never fills */
                ;
        }
        creator.join();
        RK(cudaStreamSynchronize(s2));
        printf("concurrent_create create_us %.0f other_thread_launches %d worst_launch_call_us %.0f\n", create_us, n,
               worst);
        RK(cudaStreamSynchronize(busy));
    }
    // ---- 6. what a pool of green contexts costs in device memory ----
    {
        RK(cudaDeviceSynchronize());
        size_t free0 = 0, free1 = 0, total = 0;
        CK(cuMemGetInfo(&free0, &total));
        const int K = 8;
        Green pool[K];
        int made = 0;
        for (int i = 0; i < K; i++)
            if (make_green(dev, (unsigned)(i % 7) * 2, 2 + (unsigned)(i / 7), pool[i]))
                made++;
        RK(cudaDeviceSynchronize());
        CK(cuMemGetInfo(&free1, &total));
        printf("pool_memory green_contexts %d (each with one stream) device_bytes %lld per_context_MiB %.2f\n", made,
               (long long)free0 - (long long)free1,
               made ? ((double)free0 - (double)free1) / made / 1048576.0 : 0.0);
    }
    RK(cudaDeviceSynchronize());
    printf("failures %d\n", g_fail);
    return 0;
}
