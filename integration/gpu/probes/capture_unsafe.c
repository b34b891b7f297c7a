/* capture_unsafe.c — which of the calls libdetshare makes to set itself up (learning the SM split, green contexts,
 * their streams, events) invalidate an application's global-mode stream capture on this driver, with the calling
 * thread in global capture mode (CUDA's default) and in relaxed mode (cuThreadExchangeStreamCaptureMode, what the
 * library switches to around its own calls). cuMemAlloc is the reference: CUDA documents it as potentially unsafe.
 *
 * For each mode and call: a fresh non-blocking stream begins a global-mode capture, a memset is captured, the call
 * is made (its prerequisites were made before the capture), and the line says the call's result, the capture status
 * afterwards (1 active, 2 invalidated) and cuStreamEndCapture's result:
 *     <mode>.<call> call=<rc> status=<n> end=<rc>
 * Build: cc -std=c11 -O2 -D_GNU_SOURCE -I<repo> -o capture_unsafe integration/gpu/probes/capture_unsafe.c -ldl
 * (no CUDA headers: cgroupgpu/cuda/cuda_abi.h). Runs on the simulated GPU too (LD_LIBRARY_PATH=build/lib/simgpu),
 * which models the rule (integration/simgpu/src/graph.c, "Unsafe calls"). */
#include "cgroupgpu/cuda/cuda_abi.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUNCS(X)                                                                                                     \
    X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuStreamCreate) X(cuStreamDestroy_v2)  \
    X(cuStreamBeginCapture_v2) X(cuStreamEndCapture) X(cuStreamIsCapturing) X(cuMemsetD32Async) X(cuMemAlloc_v2)     \
    X(cuMemFree_v2) X(cuThreadExchangeStreamCaptureMode) X(cuGraphDestroy) X(cuCtxGetDevice)                        \
    X(cuDeviceGetDevResource) X(cuDevSmResourceSplitByCount) X(cuDevResourceGenerateDesc) X(cuGreenCtxCreate)        \
    X(cuCtxFromGreenCtx) X(cuGreenCtxStreamCreate) X(cuEventCreate) X(cuStreamGetFlags) X(cuStreamGetPriority)       \
    X(cuCtxGetCurrent) X(cuDriverGetVersion)
#define FIELD_(f) PFN_##f f;
static struct {
    FUNCS(FIELD_)
} D;

static CUdevice dev;
static CUdevResource all, groups[64], rem;
static unsigned ngroups;
static CUdevResourceDesc desc;
static CUgreenCtx green;
static CUstream other;
static CUdeviceptr buf;

static CUresult step(const char *name, CUstream capturing) {
    CUdevice d;
    CUcontext c;
    CUresult r;
    if (!strcmp(name, "cuCtxGetDevice"))
        return D.cuCtxGetDevice(&d);
    if (!strcmp(name, "cuDeviceGetDevResource")) {
        CUdevResource x;
        memset(&x, 0, sizeof x);
        return D.cuDeviceGetDevResource(dev, &x, CU_DEV_RESOURCE_TYPE_SM);
    }
    if (!strcmp(name, "cuDevSmResourceSplitByCount")) {
        CUdevResource g[64], rr;
        unsigned n = 64;
        return D.cuDevSmResourceSplitByCount(g, &n, &all, &rr, 0, groups[0].sm.smCount);
    }
    if (!strcmp(name, "cuDevResourceGenerateDesc")) {
        CUdevResourceDesc dd;
        return D.cuDevResourceGenerateDesc(&dd, groups, 1);
    }
    if (!strcmp(name, "cuGreenCtxCreate")) {
        CUgreenCtx g;
        return D.cuGreenCtxCreate(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    }
    if (!strcmp(name, "cuCtxFromGreenCtx"))
        return D.cuCtxFromGreenCtx(&c, green);
    if (!strcmp(name, "cuGreenCtxStreamCreate")) {
        CUstream s;
        return D.cuGreenCtxStreamCreate(&s, green, CU_STREAM_NON_BLOCKING, 0);
    }
    if (!strcmp(name, "cuEventCreate")) {
        CUevent e;
        return D.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
    }
    if (!strcmp(name, "cuStreamGetFlags")) {
        unsigned f;
        return D.cuStreamGetFlags(other, &f);
    }
    if (!strcmp(name, "cuStreamGetPriority")) {
        int p;
        return D.cuStreamGetPriority(other, &p);
    }
    /* the capturing stream's own flags and priority: what the library asks of a stream it first sees */
    if (!strcmp(name, "cuStreamGetFlags(capturing)")) {
        unsigned f;
        return D.cuStreamGetFlags(capturing, &f);
    }
    if (!strcmp(name, "cuStreamGetPriority(capturing)")) {
        int p;
        return D.cuStreamGetPriority(capturing, &p);
    }
    if (!strcmp(name, "cuCtxGetCurrent"))
        return D.cuCtxGetCurrent(&c);
    if (!strcmp(name, "cuDriverGetVersion")) {
        int v;
        return D.cuDriverGetVersion(&v);
    }
    if (!strcmp(name, "cuMemAlloc")) {
        CUdeviceptr p;
        r = D.cuMemAlloc_v2(&p, 1 << 20);
        return r;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

#define CK(x)                                                                                                        \
    do {                                                                                                             \
        CUresult r_ = (x);                                                                                           \
        if (r_ != CUDA_SUCCESS) {                                                                                    \
            printf("fatal: %s -> %d\n", #x, r_);                                                                     \
            exit(2);                                                                                                 \
        }                                                                                                            \
    } while (0)

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("fatal: dlopen libcuda.so.1: %s\n", dlerror());
        return 2;
    }
#define LOAD_(f)                                                                                                     \
    if (!(D.f = (PFN_##f)dlsym(h, #f))) {                                                                            \
        printf("fatal: %s not in libcuda.so.1 (needs 12.5+)\n", #f);                                                 \
        return 2;                                                                                                    \
    }
    FUNCS(LOAD_)
    CUcontext ctx;
    CK(D.cuInit(0));
    CK(D.cuDeviceGet(&dev, 0));
    CK(D.cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(D.cuCtxSetCurrent(ctx));
    CK(D.cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    CK(D.cuMemAlloc_v2(&buf, 1 << 20));
    /* the prerequisites, outside any capture */
    CK(D.cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    ngroups = 64;
    CK(D.cuDevSmResourceSplitByCount(groups, &ngroups, &all, &rem, 0, 8));
    CK(D.cuDevResourceGenerateDesc(&desc, groups, 1));
    CK(D.cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CK(D.cuCtxSetCurrent(ctx)); /* creating a green context does not change the current one; to be sure */
    static const char *const calls[] = {"cuCtxGetDevice", "cuDeviceGetDevResource", "cuDevSmResourceSplitByCount",
                                        "cuDevResourceGenerateDesc", "cuGreenCtxCreate", "cuCtxFromGreenCtx",
                                        "cuGreenCtxStreamCreate", "cuEventCreate", "cuStreamGetFlags",
                                        "cuStreamGetPriority", "cuStreamGetFlags(capturing)",
                                        "cuStreamGetPriority(capturing)", "cuCtxGetCurrent", "cuDriverGetVersion",
                                        "cuMemAlloc"};
    static const char *const modes[] = {"global", "relaxed"};
    for (int m = 0; m < 2; m++)
        for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
            CUstream s;
            CK(D.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
            CK(D.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
            CK(D.cuMemsetD32Async(buf, 7, 1024, s));
            CUstreamCaptureMode tm = m ? CU_STREAM_CAPTURE_MODE_RELAXED : CU_STREAM_CAPTURE_MODE_GLOBAL;
            CK(D.cuThreadExchangeStreamCaptureMode(&tm));
            CUresult rc = step(calls[i], s);
            CK(D.cuThreadExchangeStreamCaptureMode(&tm));
            CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
            CK(D.cuStreamIsCapturing(s, &st));
            CUgraph g = NULL;
            CUresult re = D.cuStreamEndCapture(s, &g);
            if (g)
                D.cuGraphDestroy(g);
            printf("%s.%s call=%d status=%d end=%d\n", modes[m], calls[i], (int)rc, (int)st, (int)re);
            D.cuStreamDestroy_v2(s);
        }
    printf("done\n");
    return 0;
}
