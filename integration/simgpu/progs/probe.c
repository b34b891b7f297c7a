/*
 * probe.c — simgpu-probe: a small CUDA driver client for tests, against the simulated GPU (a test double) or a
 * real driver. Built twice:
 *   simgpu-probe         reaches the driver exactly as libcudart does: dlopen("libcuda.so.1"), dlsym
 *                        "cuGetProcAddress_v2", then every entry point through it (per-thread variants with
 *                        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM). --path=linked re-executes the other build.
 *   simgpu-probe-linked  calls the exported symbols directly (linked with -lcuda).
 * Output: one JSON object per line on stdout. Exit status 0 on success, 1 on a failed check or driver error,
 * 2 on bad usage. integration/simgpu/README.md documents the commands.
 */
#define CUDA_ABI_PROTOTYPES
#include "cgroupgpu/cuda/cuda_abi.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct {
    PFN_cuInit init;
    PFN_cuDriverGetVersion driverGetVersion;
    PFN_cuGetErrorName getErrorName;
    PFN_cuDeviceGet deviceGet;
    PFN_cuDeviceGetCount deviceGetCount;
    PFN_cuDeviceGetName deviceGetName;
    PFN_cuDeviceGetAttribute deviceGetAttribute;
    PFN_cuDeviceTotalMem_v2 deviceTotalMem;
    PFN_cuDevicePrimaryCtxRetain primaryCtxRetain;
    PFN_cuCtxSetCurrent ctxSetCurrent;
    PFN_cuCtxSynchronize ctxSynchronize;
    PFN_cuMemAlloc_v2 memAlloc;
    PFN_cuMemFree_v2 memFree;
    PFN_cuMemGetInfo_v2 memGetInfo;
    PFN_cuMemAllocPitch_v2 memAllocPitch;
    PFN_cuMemAllocManaged memAllocManaged;
    PFN_cuMemAllocAsync memAllocAsync;
    PFN_cuMemFreeAsync memFreeAsync;
    PFN_cuMemPoolCreate memPoolCreate;
    PFN_cuMemPoolDestroy memPoolDestroy;
    PFN_cuMemAllocFromPoolAsync memAllocFromPoolAsync;
    PFN_cuMemCreate memCreate;
    PFN_cuMemRelease memRelease;
    PFN_cuMemAddressReserve memAddressReserve;
    PFN_cuMemAddressFree memAddressFree;
    PFN_cuMemMap memMap;
    PFN_cuMemUnmap memUnmap;
    PFN_cuMemSetAccess memSetAccess;
    PFN_cuArrayCreate_v2 arrayCreate;
    PFN_cuArrayDestroy arrayDestroy;
    PFN_cuMemcpyHtoD_v2 memcpyHtoD;
    PFN_cuMemcpyDtoH_v2 memcpyDtoH;
    PFN_cuMemcpyDtoHAsync_v2 memcpyDtoHAsync;
    PFN_cuMemsetD32_v2 memsetD32;
    PFN_cuMemcpy2D_v2 memcpy2D;
    PFN_cuModuleLoadData moduleLoadData;
    PFN_cuModuleGetFunction moduleGetFunction;
    PFN_cuLaunchKernel launchKernel;
    PFN_cuStreamCreate streamCreate;
    PFN_cuStreamDestroy_v2 streamDestroy;
    PFN_cuStreamSynchronize streamSynchronize;
    PFN_cuStreamIsCapturing streamIsCapturing;
    PFN_cuEventCreate eventCreate;
    PFN_cuEventRecord eventRecord;
    PFN_cuEventSynchronize eventSynchronize;
    PFN_cuEventElapsedTime eventElapsedTime;
    PFN_cuDeviceGetDevResource deviceGetDevResource;
    PFN_cuDevSmResourceSplitByCount splitByCount;
    PFN_cuDevResourceGenerateDesc generateDesc;
    PFN_cuGreenCtxCreate greenCtxCreate;
    PFN_cuGreenCtxStreamCreate greenCtxStreamCreate;
    PFN_cuStreamGetGreenCtx streamGetGreenCtx;
    PFN_cuStreamGetCtx_v2 streamGetCtx2;
    PFN_cuStreamBeginCapture_v2 beginCapture;
    PFN_cuStreamEndCapture endCapture;
    PFN_cuGraphInstantiateWithFlags graphInstantiate;
    PFN_cuGraphLaunch graphLaunch;
    PFN_cuGraphExecDestroy graphExecDestroy;
    PFN_cuGraphDestroy graphDestroy;
    PFN_cuCtxFromGreenCtx ctxFromGreenCtx;
    PFN_cuCtxPushCurrent_v2 ctxPushCurrent;
    PFN_cuCtxPopCurrent_v2 ctxPopCurrent;
    PFN_cuGreenCtxRecordEvent greenCtxRecordEvent;
    PFN_cuLaunchHostFunc launchHostFunc;
    PFN_cuStreamWaitEvent streamWaitEvent;
    PFN_cuStreamQuery streamQuery;
    PFN_cuGetProcAddress_v2 getProcAddress;
} D;

static bool g_ptds;       /* per-thread default stream variants */
static const char *g_path = "runtime";
#ifndef PROBE_LINKED
static void *g_lib; /* runtime path: the dlopen handle */
#endif

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static const char *errname(CUresult r) {
    const char *s = NULL;
    if (D.getErrorName && D.getErrorName(r, &s) == CUDA_SUCCESS && s)
        return s;
    static char buf[32];
    snprintf(buf, sizeof buf, "CUresult(%d)", r);
    return buf;
}

static void out(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static void die_cu(const char *what, CUresult r) {
    out("{\"error\":\"%s\",\"call\":\"%s\",\"code\":%d,\"path\":\"%s\"}", errname(r), what, r, g_path);
    exit(1);
}

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        CUresult r_ = (call);                                                                                          \
        if (r_ != CUDA_SUCCESS)                                                                                        \
            die_cu(#call, r_);                                                                                         \
    } while (0)

static void usage(const char *msg) {
    fprintf(stderr, "simgpu-probe: %s\n(see integration/simgpu/README.md for the commands)\n", msg);
    exit(2);
}

/* ---- resolving the driver ---- */

#ifdef PROBE_LINKED
#define R(field, base, ver, name) D.field = name
#define RP(field, base, ver, name, ptname) D.field = g_ptds ? ptname : name
static void resolve_all(void) {
    g_path = "linked";
#else
static void resolve(void **field, const char *base, int ver, bool pt) {
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = D.getProcAddress(base, field, ver,
                                  pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT, &st);
    if (r != CUDA_SUCCESS || !*field) {
        out("{\"error\":\"cannot resolve\",\"symbol\":\"%s\",\"version\":%d,\"code\":%d,\"status\":%d}", base, ver, r,
            (int)st);
        exit(1);
    }
}
#define R(field, base, ver, name) resolve((void **)&D.field, base, ver, false)
#define RP(field, base, ver, name, ptname) resolve((void **)&D.field, base, ver, g_ptds)
static void resolve_all(void) {
    /* As libcudart: dlopen the driver, find cuGetProcAddress_v2 by dlsym, then ask it for itself. */
    g_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!g_lib) {
        out("{\"error\":\"dlopen libcuda.so.1 failed\",\"detail\":\"%s\"}", dlerror());
        exit(1);
    }
    PFN_cuGetProcAddress_v2 gpa = (PFN_cuGetProcAddress_v2)dlsym(g_lib, "cuGetProcAddress_v2");
    if (!gpa) {
        out("{\"error\":\"dlsym cuGetProcAddress_v2 failed\"}");
        exit(1);
    }
    D.getProcAddress = gpa;
    resolve((void **)&D.getProcAddress, "cuGetProcAddress", 12000, false);
#endif
    R(init, "cuInit", 2000, cuInit);
    R(driverGetVersion, "cuDriverGetVersion", 2020, cuDriverGetVersion);
    R(getErrorName, "cuGetErrorName", 6000, cuGetErrorName);
    R(deviceGet, "cuDeviceGet", 2000, cuDeviceGet);
    R(deviceGetCount, "cuDeviceGetCount", 2000, cuDeviceGetCount);
    R(deviceGetName, "cuDeviceGetName", 2000, cuDeviceGetName);
    R(deviceGetAttribute, "cuDeviceGetAttribute", 2000, cuDeviceGetAttribute);
    R(deviceTotalMem, "cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2);
    R(primaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain);
    R(ctxSetCurrent, "cuCtxSetCurrent", 4000, cuCtxSetCurrent);
    R(ctxSynchronize, "cuCtxSynchronize", 2000, cuCtxSynchronize);
    R(memAlloc, "cuMemAlloc", 3020, cuMemAlloc_v2);
    R(memFree, "cuMemFree", 3020, cuMemFree_v2);
    R(memGetInfo, "cuMemGetInfo", 3020, cuMemGetInfo_v2);
    R(memAllocPitch, "cuMemAllocPitch", 3020, cuMemAllocPitch_v2);
    R(memAllocManaged, "cuMemAllocManaged", 6000, cuMemAllocManaged);
    RP(memAllocAsync, "cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz);
    RP(memFreeAsync, "cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz);
    R(memPoolCreate, "cuMemPoolCreate", 11020, cuMemPoolCreate);
    R(memPoolDestroy, "cuMemPoolDestroy", 11020, cuMemPoolDestroy);
    RP(memAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz);
    R(memCreate, "cuMemCreate", 10020, cuMemCreate);
    R(memRelease, "cuMemRelease", 10020, cuMemRelease);
    R(memAddressReserve, "cuMemAddressReserve", 10020, cuMemAddressReserve);
    R(memAddressFree, "cuMemAddressFree", 10020, cuMemAddressFree);
    R(memMap, "cuMemMap", 10020, cuMemMap);
    R(memUnmap, "cuMemUnmap", 10020, cuMemUnmap);
    R(memSetAccess, "cuMemSetAccess", 10020, cuMemSetAccess);
    R(arrayCreate, "cuArrayCreate", 3020, cuArrayCreate_v2);
    R(arrayDestroy, "cuArrayDestroy", 2000, cuArrayDestroy);
    RP(memcpyHtoD, "cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds);
    RP(memcpyDtoH, "cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds);
    RP(memcpyDtoHAsync, "cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz);
    RP(memsetD32, "cuMemsetD32", 3020, cuMemsetD32_v2, cuMemsetD32_v2_ptds);
    RP(memcpy2D, "cuMemcpy2D", 3020, cuMemcpy2D_v2, cuMemcpy2D_v2_ptds);
    R(moduleLoadData, "cuModuleLoadData", 2000, cuModuleLoadData);
    R(moduleGetFunction, "cuModuleGetFunction", 2000, cuModuleGetFunction);
    RP(launchKernel, "cuLaunchKernel", g_ptds ? 7000 : 4000, cuLaunchKernel, cuLaunchKernel_ptsz);
    R(streamCreate, "cuStreamCreate", 2000, cuStreamCreate);
    R(streamDestroy, "cuStreamDestroy", 4000, cuStreamDestroy_v2);
    RP(streamSynchronize, "cuStreamSynchronize", g_ptds ? 7000 : 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz);
    RP(streamIsCapturing, "cuStreamIsCapturing", 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz);
    R(eventCreate, "cuEventCreate", 2000, cuEventCreate);
    RP(eventRecord, "cuEventRecord", g_ptds ? 7000 : 2000, cuEventRecord, cuEventRecord_ptsz);
    R(eventSynchronize, "cuEventSynchronize", 2000, cuEventSynchronize);
    R(eventElapsedTime, "cuEventElapsedTime", 2000, cuEventElapsedTime);
    R(deviceGetDevResource, "cuDeviceGetDevResource", 12040, cuDeviceGetDevResource);
    R(splitByCount, "cuDevSmResourceSplitByCount", 12040, cuDevSmResourceSplitByCount);
    R(generateDesc, "cuDevResourceGenerateDesc", 12040, cuDevResourceGenerateDesc);
    R(greenCtxCreate, "cuGreenCtxCreate", 12040, cuGreenCtxCreate);
    R(greenCtxStreamCreate, "cuGreenCtxStreamCreate", 12050, cuGreenCtxStreamCreate);
    R(streamGetGreenCtx, "cuStreamGetGreenCtx", 12040, cuStreamGetGreenCtx);
    RP(streamGetCtx2, "cuStreamGetCtx", 12050, cuStreamGetCtx_v2, cuStreamGetCtx_v2_ptsz);
    RP(beginCapture, "cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz);
    RP(endCapture, "cuStreamEndCapture", 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz);
    R(graphInstantiate, "cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags);
    RP(graphLaunch, "cuGraphLaunch", 10000, cuGraphLaunch, cuGraphLaunch_ptsz);
    R(graphExecDestroy, "cuGraphExecDestroy", 10000, cuGraphExecDestroy);
    R(graphDestroy, "cuGraphDestroy", 10000, cuGraphDestroy);
    R(ctxFromGreenCtx, "cuCtxFromGreenCtx", 12040, cuCtxFromGreenCtx);
    R(ctxPushCurrent, "cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2);
    R(ctxPopCurrent, "cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2);
    R(greenCtxRecordEvent, "cuGreenCtxRecordEvent", 12040, cuGreenCtxRecordEvent);
    RP(launchHostFunc, "cuLaunchHostFunc", 10000, cuLaunchHostFunc, cuLaunchHostFunc_ptsz);
    RP(streamWaitEvent, "cuStreamWaitEvent", g_ptds ? 7000 : 3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz);
    RP(streamQuery, "cuStreamQuery", g_ptds ? 7000 : 2000, cuStreamQuery, cuStreamQuery_ptsz);
#ifdef PROBE_LINKED
    D.getProcAddress = cuGetProcAddress_v2;
#endif
}

static CUdevice g_dev;
static CUcontext g_primary;

static void setup(void) {
    resolve_all();
    CK(D.init(0));
    CK(D.deviceGet(&g_dev, 0));
    CK(D.primaryCtxRetain(&g_primary, g_dev));
    CK(D.ctxSetCurrent(g_primary));
}

/* ---- options ---- */

typedef struct {
    const char *name;
    const char *val;
} opt;
static opt g_opts[64];
static int g_nopts;
static const char *g_pos[64];
static int g_npos;

static void parse_opts(int argc, char **argv, int first) {
    for (int i = first; i < argc; i++) {
        if (!strncmp(argv[i], "--", 2)) {
            if (g_nopts == 64)
                usage("too many options");
            char *eq = strchr(argv[i], '=');
            if (eq) {
                /* argv stays intact: --path=linked re-executes with it */
                g_opts[g_nopts++] = (opt){strndup(argv[i] + 2, (size_t)(eq - argv[i] - 2)), eq + 1};
            } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) {
                g_opts[g_nopts++] = (opt){argv[i] + 2, argv[i + 1]};
                i++;
            } else {
                g_opts[g_nopts++] = (opt){argv[i] + 2, "1"};
            }
        } else if (g_npos < 64) {
            g_pos[g_npos++] = argv[i];
        } else {
            usage("too many arguments");
        }
    }
}

static const char *opt_str(const char *name, const char *def) {
    for (int i = 0; i < g_nopts; i++)
        if (!strcmp(g_opts[i].name, name))
            return g_opts[i].val;
    return def;
}

static unsigned long long parse_size(const char *s, const char *field) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned long long mul = 1;
    if (*end == 'K')
        mul = 1ULL << 10;
    else if (*end == 'M')
        mul = 1ULL << 20;
    else if (*end == 'G')
        mul = 1ULL << 30;
    else if (*end)
        mul = 0;
    if (errno || end == s || !mul || s[0] == '-') {
        fprintf(stderr, "simgpu-probe: invalid --%s=%s (allowed: a non-negative integer, optional K, M or G)\n", field,
                s);
        exit(2);
    }
    return v * mul;
}

static unsigned long long opt_num(const char *name, unsigned long long def) {
    const char *v = opt_str(name, NULL);
    return v ? parse_size(v, name) : def;
}

/* ---- commands ---- */

static int cmd_info(void) {
    int ver = 0, n = 0, sms = 0, major = 0, minor = 0;
    char name[128];
    size_t total = 0;
    CK(D.driverGetVersion(&ver));
    CK(D.deviceGetCount(&n));
    CK(D.deviceGetName(name, sizeof name, g_dev));
    CK(D.deviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, g_dev));
    CK(D.deviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, g_dev));
    CK(D.deviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, g_dev));
    CK(D.deviceTotalMem(&total, g_dev));
    out("{\"cmd\":\"info\",\"path\":\"%s\",\"driver\":%d,\"devices\":%d,\"name\":\"%s\",\"sms\":%d,\"cc\":\"%d.%d\","
        "\"mem_total\":%zu}",
        g_path, ver, n, name, sms, major, minor, total);
    return 0;
}

static void meminfo(size_t *f, size_t *t) { CK(D.memGetInfo(f, t)); }

static int cmd_meminfo(void) {
    size_t f, t;
    meminfo(&f, &t);
    out("{\"cmd\":\"meminfo\",\"free\":%zu,\"total\":%zu}", f, t);
    return 0;
}

typedef struct {
    CUdeviceptr p;
    size_t size;
    CUmemGenericAllocationHandle h;
    CUarray arr;
} alloc_rec;

static int cmd_alloc(void) {
    const char *kind = opt_str("kind", "plain");
    size_t size = (size_t)opt_num("size", 1 << 20);
    unsigned count = (unsigned)opt_num("count", 1);
    unsigned hold = (unsigned)opt_num("hold-ms", 0);
    bool nofree = opt_num("no-free", 0) != 0;
    if (count == 0 || count > 4096)
        usage("--count must be 1..4096");
    static const char *kinds[] = {"plain", "pitch", "managed", "async", "pool", "vmm", "array"};
    bool known = false;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        known |= !strcmp(kind, kinds[i]);
    if (!known) {
        fprintf(stderr, "simgpu-probe: invalid --kind=%s (allowed: plain, pitch, managed, async, pool, vmm, array)\n",
                kind);
        return 2;
    }
    alloc_rec *recs = calloc(count, sizeof *recs);
    size_t f0, t;
    meminfo(&f0, &t);
    CUmemoryPool pool = NULL;
    if (!strcmp(kind, "pool")) {
        CUmemPoolProps pp = {0};
        pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        pp.location.id = g_dev;
        pp.maxSize = (size_t)opt_num("pool-max", 0);
        CK(D.memPoolCreate(&pool, &pp));
    }
    unsigned ok = 0;
    CUresult err = CUDA_SUCCESS;
    for (unsigned i = 0; i < count && !err; i++) {
        alloc_rec *a = &recs[i];
        a->size = size;
        if (!strcmp(kind, "plain"))
            err = D.memAlloc(&a->p, size);
        else if (!strcmp(kind, "pitch")) {
            size_t pitch;
            err = D.memAllocPitch(&a->p, &pitch, size / 16 ? size / 16 : 1, 16, 4);
        } else if (!strcmp(kind, "managed"))
            err = D.memAllocManaged(&a->p, size, CU_MEM_ATTACH_GLOBAL);
        else if (!strcmp(kind, "async"))
            err = D.memAllocAsync(&a->p, size, NULL);
        else if (!strcmp(kind, "pool"))
            err = D.memAllocFromPoolAsync(&a->p, size, pool, NULL);
        else if (!strcmp(kind, "array")) {
            CUDA_ARRAY_DESCRIPTOR ad = {.Width = size / 4 ? size / 4 : 1, .Height = 1, .Format = CU_AD_FORMAT_FLOAT,
                                        .NumChannels = 1};
            err = D.arrayCreate(&a->arr, &ad);
        } else { /* vmm */
            CUmemAllocationProp prop = {0};
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = g_dev;
            size_t gran = 2 << 20;
            a->size = (size + gran - 1) / gran * gran;
            err = D.memCreate(&a->h, a->size, &prop, 0);
            if (!err)
                err = D.memAddressReserve(&a->p, a->size, 0, 0, 0);
            if (!err)
                err = D.memMap(a->p, a->size, 0, a->h, 0);
            if (!err) {
                CUmemAccessDesc ad = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, g_dev},
                                      .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
                err = D.memSetAccess(a->p, a->size, &ad, 1);
            }
        }
        if (!err)
            ok++;
    }
    size_t f1;
    meminfo(&f1, &t);
    out("{\"cmd\":\"alloc\",\"path\":\"%s\",\"kind\":\"%s\",\"size\":%zu,\"requested\":%u,\"allocated\":%u,"
        "\"result\":\"%s\",\"free_before\":%zu,\"free_after_alloc\":%zu,\"total\":%zu}",
        g_path, kind, size, count, ok, errname(err), f0, f1, t);
    if (hold)
        usleep(hold * 1000u);
    if (nofree) /* leave it to process exit: the memory must come back when the process is gone */
        return err ? 1 : 0;
    for (unsigned i = 0; i < ok; i++) {
        alloc_rec *a = &recs[i];
        if (!strcmp(kind, "vmm")) {
            CK(D.memUnmap(a->p, a->size));
            CK(D.memAddressFree(a->p, a->size));
            CK(D.memRelease(a->h));
        } else if (!strcmp(kind, "array"))
            CK(D.arrayDestroy(a->arr));
        else if (!strcmp(kind, "async") || !strcmp(kind, "pool"))
            CK(D.memFreeAsync(a->p, NULL));
        else
            CK(D.memFree(a->p));
    }
    if (pool)
        CK(D.memPoolDestroy(pool));
    size_t f2;
    meminfo(&f2, &t);
    out("{\"cmd\":\"free\",\"kind\":\"%s\",\"freed\":%u,\"free_after_free\":%zu,\"total\":%zu}", kind, ok, f2, t);
    free(recs);
    return err ? 1 : 0;
}

/* Parses "a-b,c" into a bitmask of group indices. */
static unsigned long long parse_groups(const char *s) {
    unsigned long long m = 0;
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (end == s || a < 0 || a > 63)
            usage("invalid --groups (allowed: comma-separated indices or ranges 0..63, e.g. 0-3,5)");
        if (*end == '-') {
            s = end + 1;
            b = strtol(s, &end, 10);
            if (end == s || b < a || b > 63)
                usage("invalid --groups range");
        }
        for (long i = a; i <= b; i++)
            m |= 1ULL << i;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            usage("invalid --groups");
    }
    return m;
}

typedef struct {
    CUgreenCtx green;
    CUstream stream;
    unsigned sms;
} green_setup;

/* Builds a green context from groups of one split with minCount `split`. */
static CUresult make_green(unsigned split, unsigned long long groups, green_setup *g) {
    CUdevResource dev, res[64], rem;
    memset(&dev, 0, sizeof dev);
    memset(res, 0, sizeof res);
    memset(&rem, 0, sizeof rem);
    CUresult r = D.deviceGetDevResource(g_dev, &dev, CU_DEV_RESOURCE_TYPE_SM);
    if (r)
        return r;
    unsigned n = 64;
    if ((r = D.splitByCount(res, &n, &dev, &rem, 0, split)))
        return r;
    CUdevResource pick[64];
    unsigned np = 0;
    g->sms = 0;
    for (unsigned i = 0; i < n; i++) {
        if (groups & (1ULL << i)) {
            pick[np++] = res[i];
            g->sms += res[i].sm.smCount;
        }
    }
    if (np == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUdevResourceDesc desc;
    if ((r = D.generateDesc(&desc, pick, np)))
        return r;
    if ((r = D.greenCtxCreate(&g->green, desc, g_dev, CU_GREEN_CTX_DEFAULT_STREAM)))
        return r;
    return D.greenCtxStreamCreate(&g->stream, g->green, CU_STREAM_NON_BLOCKING, 0);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmd_spin(void) {
    unsigned blocks = (unsigned)opt_num("blocks", 0);
    unsigned us = (unsigned)opt_num("us", 1000);
    unsigned iters = (unsigned)opt_num("iters", 0);
    unsigned duration = (unsigned)opt_num("duration-ms", 0);
    unsigned split = (unsigned)opt_num("split", 0);
    const char *groups_s = opt_str("groups", "0");
    const char *stream_kind = opt_str("stream", "auto");
    const char *graph = opt_str("graph", "none");
    unsigned long long start_at = opt_num("start-at", 0);
    bool per_iter = opt_num("per-iter", 0) != 0;
    /* dynamic shared memory per block: a GEMM-like kernel has tens of KiB, which is how libdetshare tells it from a
     * memory-bound one (ds_narrow.c) */
    unsigned smem = (unsigned)opt_num("smem", 0);
    if (!iters && !duration)
        iters = 10;
    if (strcmp(graph, "none") && strcmp(graph, "capture-green") && strcmp(graph, "capture-primary")) {
        fprintf(stderr, "simgpu-probe: invalid --graph=%s (allowed: none, capture-green, capture-primary)\n", graph);
        return 2;
    }
    if (strcmp(stream_kind, "auto") && strcmp(stream_kind, "legacy") && strcmp(stream_kind, "ptds") &&
        strcmp(stream_kind, "blocking") && strcmp(stream_kind, "nonblocking")) {
        fprintf(stderr,
                "simgpu-probe: invalid --stream=%s (allowed: auto, legacy, ptds, blocking, nonblocking)\n",
                stream_kind);
        return 2;
    }
    if (!strcmp(graph, "capture-green") && !split)
        usage("--graph=capture-green needs --split");

    green_setup g = {0};
    unsigned ctx_sms = 0;
    int total_sms = 0;
    CK(D.deviceGetAttribute(&total_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, g_dev));
    if (split) {
        CUresult r = make_green(split, parse_groups(groups_s), &g);
        if (r)
            die_cu("green context setup", r);
        ctx_sms = g.sms;
    } else {
        ctx_sms = (unsigned)total_sms;
    }
    if (!blocks)
        blocks = ctx_sms;

    /* The stream work is launched on. */
    CUstream s = NULL;
    if (split)
        s = g.stream;
    else if (!strcmp(stream_kind, "blocking"))
        CK(D.streamCreate(&s, CU_STREAM_DEFAULT));
    else if (!strcmp(stream_kind, "nonblocking"))
        CK(D.streamCreate(&s, CU_STREAM_NON_BLOCKING));
    else if (!strcmp(stream_kind, "ptds") && !g_ptds)
        s = CU_STREAM_PER_THREAD;
    else if (!strcmp(stream_kind, "legacy") && g_ptds)
        s = CU_STREAM_LEGACY;

    CUmodule mod;
    CUfunction fn;
    CK(D.moduleLoadData(&mod, "simgpu-probe"));
    CK(D.moduleGetFunction(&fn, mod, "ds_smid"));
    CUdeviceptr outbuf;
    CK(D.memAlloc(&outbuf, (size_t)blocks * 4));
    void *args[] = {&outbuf, &us};

    CUgraphExec exec = NULL;
    CUgraph gr = NULL;
    if (strcmp(graph, "none")) {
        CUstream cs;
        if (!strcmp(graph, "capture-green"))
            cs = g.stream;
        else
            CK(D.streamCreate(&cs, CU_STREAM_NON_BLOCKING)); /* a primary-context stream */
        CK(D.beginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
        CUstreamCaptureStatus st;
        CK(D.streamIsCapturing(cs, &st));
        if (st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
            die_cu("capture not active", CUDA_ERROR_UNKNOWN);
        CK(D.launchKernel(fn, blocks, 1, 1, 128, 1, 1, smem, cs, args, NULL));
        CK(D.endCapture(cs, &gr));
        CK(D.graphInstantiate(&exec, gr, 0));
    }

    if (start_at) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long wait_ms = (long long)start_at - ((long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
        if (wait_ms > 0)
            usleep((useconds_t)wait_ms * 1000);
    }

    size_t cap = iters ? iters : 100000;
    double *lat = malloc(cap * sizeof *lat);
    uint32_t *ids = malloc((size_t)blocks * 4);
    unsigned char seen[1024] = {0};
    CUevent e0, e1;
    CK(D.eventCreate(&e0, 0));
    CK(D.eventCreate(&e1, 0));
    double t_start = now_ms(), ev_total = 0;
    unsigned n = 0;
    while ((iters && n < iters) || (!iters && now_ms() - t_start < duration && n < cap)) {
        double t0 = now_ms();
        CK(D.eventRecord(e0, s));
        if (exec)
            CK(D.graphLaunch(exec, s));
        else
            CK(D.launchKernel(fn, blocks, 1, 1, 128, 1, 1, smem, s, args, NULL));
        CK(D.eventRecord(e1, s));
        CK(D.streamSynchronize(s));
        lat[n] = now_ms() - t0;
        float ev;
        CK(D.eventElapsedTime(&ev, e0, e1));
        ev_total += ev;
        if (per_iter)
            out("{\"iter\":%u,\"ms\":%.3f,\"event_ms\":%.3f}", n, lat[n], ev);
        if (n == 0 || !iters || n + 1 == iters) {
            CK(D.memcpyDtoH(ids, outbuf, (size_t)blocks * 4));
            for (unsigned b = 0; b < blocks; b++)
                if (ids[b] < sizeof seen)
                    seen[ids[b]] = 1;
        }
        n++;
    }
    double sum = 0, best = 1e300;
    for (unsigned i = 0; i < n; i++) {
        sum += lat[i];
        if (lat[i] < best)
            best = lat[i];
    }
    qsort(lat, n, sizeof *lat, cmp_double);
    char smlist[8192];
    size_t off = 0;
    unsigned distinct = 0;
    for (unsigned i = 0; i < sizeof seen; i++) {
        if (seen[i]) {
            off += (size_t)snprintf(smlist + off, sizeof smlist - off, "%s%u", distinct ? "," : "", i);
            distinct++;
            if (off >= sizeof smlist - 8)
                break;
        }
    }
    CUgreenCtx gq = NULL;
    CUcontext cq = NULL;
    CK(D.streamGetGreenCtx(s, &gq));
    CK(D.streamGetCtx2(s, &cq, &gq));
    out("{\"cmd\":\"spin\",\"path\":\"%s\",\"ptds\":%s,\"graph\":\"%s\",\"blocks\":%u,\"us\":%u,\"iters\":%u,"
        "\"ctx_sms\":%u,\"green\":%s,\"mean_ms\":%.3f,\"best_ms\":%.3f,\"p50_ms\":%.3f,\"max_ms\":%.3f,"
        "\"event_mean_ms\":%.3f,\"distinct_sms\":%u,\"sms\":[%s]}",
        g_path, g_ptds ? "true" : "false", graph, blocks, us, n, ctx_sms, gq ? "true" : "false", n ? sum / n : 0,
        n ? best : 0, n ? lat[n / 2] : 0, n ? lat[n - 1] : 0, n ? ev_total / n : 0, distinct, smlist);
    if (exec) {
        CK(D.graphExecDestroy(exec));
        CK(D.graphDestroy(gr));
    }
    CK(D.memFree(outbuf));
    free(lat);
    free(ids);
    return 0;
}

static int cmd_split(void) {
    unsigned minc = (unsigned)opt_num("min", 8);
    unsigned want = (unsigned)opt_num("groups", 64);
    unsigned flags = (unsigned)opt_num("flags", 0);
    const char *resplit = opt_str("resplit", "none");
    CUdevResource dev, res[64], rem;
    memset(&dev, 0, sizeof dev);
    memset(res, 0, sizeof res);
    memset(&rem, 0, sizeof rem);
    CK(D.deviceGetDevResource(g_dev, &dev, CU_DEV_RESOURCE_TYPE_SM));
    unsigned n = want > 64 ? 64 : want;
    CUresult r = D.splitByCount(res, &n, &dev, &rem, flags, minc);
    if (r) {
        out("{\"cmd\":\"split\",\"min\":%u,\"result\":\"%s\",\"code\":%d}", minc, errname(r), r);
        return 0; /* the result is the answer; tests assert on it */
    }
    char sizes[1024];
    size_t off = 0;
    for (unsigned i = 0; i < n; i++)
        off += (size_t)snprintf(sizes + off, sizeof sizes - off, "%s%u", i ? "," : "", res[i].sm.smCount);
    const char *rs = "null";
    char rsbuf[64];
    if (strcmp(resplit, "none")) {
        const CUdevResource *in = !strcmp(resplit, "remainder") ? &rem : &res[0];
        CUdevResource again[64];
        memset(again, 0, sizeof again);
        unsigned n2 = 64;
        CUresult r2 = D.splitByCount(again, &n2, in, NULL, 0, 8);
        snprintf(rsbuf, sizeof rsbuf, "\"%s\"", errname(r2));
        rs = rsbuf;
    }
    out("{\"cmd\":\"split\",\"min\":%u,\"result\":\"CUDA_SUCCESS\",\"device_sms\":%u,\"min_partition\":%u,"
        "\"alignment\":%u,\"groups\":%u,\"group_sms\":[%s],\"remainder\":%u,\"resplit\":%s}",
        minc, dev.sm.smCount, dev.sm.minSmPartitionSize, dev.sm.smCoscheduledAlignment, n, sizes, rem.sm.smCount, rs);
    return 0;
}

/* Queries name:version:flags triples and says which exported variant came back. */
static int cmd_procaddr(void) {
    static const char *variants[] = {
        "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuMemAlloc_v2", "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds",
        "cuStreamSynchronize", "cuStreamSynchronize_ptsz", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4",
        "cuStreamGetCtx", "cuStreamGetCtx_v2", "cuStreamGetCtx_v2_ptsz", "cuGetProcAddress", "cuGetProcAddress_v2",
        "cuGreenCtxStreamCreate", "cuGraphInstantiateWithFlags", "cuStreamBeginCapture_v2",
        "cuStreamBeginCapture_v2_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz", "cuMemAllocAsync",
        "cuMemAllocAsync_ptsz", "cuEventRecord", "cuEventRecord_ptsz", "cuGraphLaunch", "cuGraphLaunch_ptsz",
        "cuDevSmResourceSplitByCount", "cuInit", "cuCtxSynchronize", "cuCtxSynchronize_v2"};
    int rc = 0;
    for (int i = 0; i < g_npos; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", g_pos[i]);
        char *c1 = strchr(buf, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c1 || !c2)
            usage("procaddr arguments are name:version:flags");
        *c1 = *c2 = 0;
        int ver = atoi(c1 + 1);
        unsigned long long flags = strtoull(c2 + 1, NULL, 0);
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
        CUresult r = D.getProcAddress(buf, &fn, ver, flags, &st);
        const char *which = "";
        for (size_t k = 0; fn && k < sizeof variants / sizeof variants[0]; k++) {
            void *v = NULL;
#ifdef PROBE_LINKED
            v = dlsym(RTLD_DEFAULT, variants[k]);
#else
            v = dlsym(g_lib, variants[k]);
#endif
            if (v == fn) {
                which = variants[k];
                break;
            }
        }
        out("{\"cmd\":\"procaddr\",\"symbol\":\"%s\",\"version\":%d,\"flags\":%llu,\"result\":\"%s\",\"status\":%d,"
            "\"found\":%s,\"variant\":\"%s\"}",
            buf, ver, flags, errname(r), (int)st, fn ? "true" : "false", which);
    }
    return rc;
}

static int g_failed;
static void check(bool ok, const char *what) {
    out("{\"check\":\"%s\",\"ok\":%s}", what, ok ? "true" : "false");
    if (!ok)
        g_failed = 1;
}

static int cmd_data(void) {
    const unsigned n = 1000;
    size_t bytes = n * sizeof(float);
    CUdeviceptr a, b, c;
    CK(D.memAlloc(&a, bytes));
    CK(D.memAlloc(&b, bytes));
    CK(D.memAlloc(&c, bytes));
    float ha[1000], hb[1000], hc[1000];
    for (unsigned i = 0; i < n; i++) {
        ha[i] = (float)i;
        hb[i] = 2.0f * (float)i;
    }
    CK(D.memcpyHtoD(a, ha, bytes));
    CK(D.memcpyHtoD(b, hb, bytes));
    CUmodule mod;
    CUfunction add, axpy, fill;
    CK(D.moduleLoadData(&mod, "simgpu-probe"));
    CK(D.moduleGetFunction(&add, mod, "ds_add_f32"));
    CK(D.moduleGetFunction(&axpy, mod, "ds_axpy"));
    CK(D.moduleGetFunction(&fill, mod, "ds_fill_u32"));
    CUfunction nope;
    check(D.moduleGetFunction(&nope, mod, "no_such_kernel") == CUDA_ERROR_NOT_FOUND, "unknown kernel is NOT_FOUND");
    unsigned long long nn = n;
    unsigned us = 10;
    void *add_args[] = {&c, &a, &b, &nn, &us};
    CK(D.launchKernel(add, 4, 1, 1, 256, 1, 1, 0, NULL, add_args, NULL));
    CK(D.memcpyDtoH(hc, c, bytes));
    bool ok = true;
    for (unsigned i = 0; i < n; i++)
        ok &= hc[i] == 3.0f * (float)i;
    check(ok, "ds_add_f32 computes a+b");
    float alpha = 0.5f;
    void *axpy_args[] = {&c, &a, &alpha, &nn, &us};
    CK(D.launchKernel(axpy, 4, 1, 1, 256, 1, 1, 0, NULL, axpy_args, NULL));
    CK(D.memcpyDtoH(hc, c, bytes));
    ok = true;
    for (unsigned i = 0; i < n; i++)
        ok &= hc[i] == 3.5f * (float)i;
    check(ok, "ds_axpy computes alpha*x+y");
    /* Packed arguments through `extra`, as some launchers pass them. */
    struct {
        uint64_t dst;
        uint32_t value;
        uint32_t pad;
        uint64_t n;
        uint32_t us;
    } packed = {c, 0xabcdef01u, 0, n, 5};
    size_t psize = sizeof packed;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &psize, CU_LAUNCH_PARAM_END};
    CK(D.launchKernel(fill, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, extra));
    uint32_t hu[1000];
    CK(D.memcpyDtoH(hu, c, bytes));
    ok = true;
    for (unsigned i = 0; i < n; i++)
        ok &= hu[i] == 0xabcdef01u;
    check(ok, "ds_fill_u32 through extra");
    CK(D.memsetD32(c, 7u, n));
    CK(D.memcpyDtoH(hu, c, bytes));
    ok = true;
    for (unsigned i = 0; i < n; i++)
        ok &= hu[i] == 7u;
    check(ok, "memsetD32");
    /* 2D copy: a 10x10 block of floats into a pitched allocation and back. */
    CUdeviceptr p2;
    size_t pitch;
    CK(D.memAllocPitch(&p2, &pitch, 40, 10, 4));
    check(pitch >= 40 && pitch % 512 == 0, "pitch is aligned");
    CUDA_MEMCPY2D cp = {0};
    cp.srcMemoryType = CU_MEMORYTYPE_HOST;
    cp.srcHost = ha;
    cp.srcPitch = 40;
    cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    cp.dstDevice = p2;
    cp.dstPitch = pitch;
    cp.WidthInBytes = 40;
    cp.Height = 10;
    CK(D.memcpy2D(&cp));
    float back[100];
    CUDA_MEMCPY2D cb = {0};
    cb.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    cb.srcDevice = p2;
    cb.srcPitch = pitch;
    cb.dstMemoryType = CU_MEMORYTYPE_HOST;
    cb.dstHost = back;
    cb.dstPitch = 40;
    cb.WidthInBytes = 40;
    cb.Height = 10;
    CK(D.memcpy2D(&cb));
    check(!memcmp(back, ha, sizeof back), "2D copy round trip");
    /* VMM: two handles mapped side by side behave as one range. */
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = g_dev;
    size_t g = 2 << 20;
    CUmemGenericAllocationHandle h1, h2;
    CK(D.memCreate(&h1, g, &prop, 0));
    CK(D.memCreate(&h2, g, &prop, 0));
    CUdeviceptr va;
    CK(D.memAddressReserve(&va, 2 * g, 0, 0, 0));
    CK(D.memMap(va, g, 0, h1, 0));
    CK(D.memMap(va + g, g, 0, h2, 0));
    CUmemAccessDesc ad = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, g_dev}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CK(D.memSetAccess(va, 2 * g, &ad, 1));
    CK(D.memcpyHtoD(va + g - 2000, ha, bytes)); /* straddles the two handles */
    CK(D.memcpyDtoH(back, va + g - 2000, sizeof back));
    check(!memcmp(back, ha, sizeof back), "VMM mapping across two handles");
    check(D.memCreate(&h1, 1000, &prop, 0) == CUDA_ERROR_INVALID_VALUE, "cuMemCreate rejects unaligned size");
    CK(D.memUnmap(va, g));
    CK(D.memUnmap(va + g, g));
    CK(D.memAddressFree(va, 2 * g));
    CK(D.memRelease(h1));
    CK(D.memRelease(h2));
    CUdeviceptr bad = 0;
    check(D.memAlloc(&bad, 0) == CUDA_ERROR_INVALID_VALUE, "cuMemAlloc(0) is INVALID_VALUE");
    check(D.memFree(a + 4) == CUDA_ERROR_INVALID_VALUE, "cuMemFree of an interior pointer is INVALID_VALUE");
    check(D.memcpyHtoD(a + bytes - 4, ha, 8) == CUDA_ERROR_INVALID_VALUE, "copy past the end is INVALID_VALUE");
    /* Timing: 132 blocks x 2000 us on the full device take about 2 ms of simulated time. */
    CUfunction spin;
    CK(D.moduleGetFunction(&spin, mod, "ds_spin"));
    CUevent e0, e1;
    CK(D.eventCreate(&e0, 0));
    CK(D.eventCreate(&e1, 0));
    int sms;
    CK(D.deviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, g_dev));
    unsigned sus = 2000;
    void *sargs[] = {&sus};
    CK(D.eventRecord(e0, NULL));
    CK(D.launchKernel(spin, (unsigned)sms * 2, 1, 1, 32, 1, 1, 0, NULL, sargs, NULL));
    CK(D.eventRecord(e1, NULL));
    CK(D.eventSynchronize(e1));
    float ms;
    CK(D.eventElapsedTime(&ms, e0, e1));
    check(ms > 3.9f && ms < 4.5f, "two waves of 2 ms take 4 ms (event timing)");
    out("{\"cmd\":\"data\",\"path\":\"%s\",\"ptds\":%s,\"ok\":%s,\"two_wave_ms\":%.3f}", g_path,
        g_ptds ? "true" : "false", g_failed ? "false" : "true", ms);
    CK(D.memFree(a));
    CK(D.memFree(b));
    CK(D.memFree(c));
    CK(D.memFree(p2));
    return g_failed;
}

/* ---- stream ordering semantics ---- */

static CUfunction g_spin, g_fill;

static void launch_spin(CUstream s, unsigned blocks, unsigned us) {
    void *args[] = {&us};
    CK(D.launchKernel(g_spin, blocks, 1, 1, 32, 1, 1, 0, s, args, NULL));
}

static void host_stamp(void *p) { *(double *)p = now_ms(); }

struct pt_arg {
    double ms;
    CUresult r;
};
static void *pt_thread(void *p) {
    struct pt_arg *a = p;
    CUresult r = D.ctxSetCurrent(g_primary);
    double t0 = now_ms();
    unsigned us = 20000; /* long enough that thread start-up jitter on a busy machine does not matter */
    void *args[] = {&us};
    if (!r)
        r = D.launchKernel(g_spin, 1, 1, 1, 32, 1, 1, 0, CU_STREAM_PER_THREAD, args, NULL);
    if (!r)
        r = D.streamSynchronize(CU_STREAM_PER_THREAD);
    a->ms = now_ms() - t0;
    a->r = r;
    return NULL;
}

static int cmd_streams(void) {
    CUmodule mod;
    CK(D.moduleLoadData(&mod, "simgpu-probe"));
    CK(D.moduleGetFunction(&g_spin, mod, "ds_spin"));
    CK(D.moduleGetFunction(&g_fill, mod, "ds_fill_u32"));
    CUstream blocking, nonblocking;
    CK(D.streamCreate(&blocking, CU_STREAM_DEFAULT));
    CK(D.streamCreate(&nonblocking, CU_STREAM_NON_BLOCKING));

    /* The legacy stream waits for blocking streams, not for non-blocking ones. */
    double t0 = now_ms();
    launch_spin(blocking, 1, 3000);
    launch_spin(CU_STREAM_LEGACY, 1, 10);
    CK(D.streamSynchronize(CU_STREAM_LEGACY));
    double legacy_after_blocking = now_ms() - t0;
    check(legacy_after_blocking >= 2.9, "legacy stream waits for a blocking stream");
    CK(D.ctxSynchronize());
    /* Judged by order, not by a clock: the non-blocking stream's kernel must still be running when the legacy
     * stream's work is done (a 5 ms wall-clock bound failed once on a loaded CI machine). 300 ms is far longer than
     * any scheduling delay of the legacy stream's 10 us kernel. */
    t0 = now_ms();
    launch_spin(nonblocking, 1, 300000);
    launch_spin(CU_STREAM_LEGACY, 1, 10);
    CK(D.streamSynchronize(CU_STREAM_LEGACY));
    double legacy_after_nonblocking = now_ms() - t0; /* reported, not judged */
    check(D.streamQuery(nonblocking) == CUDA_ERROR_NOT_READY,
          "legacy stream does not wait for a non-blocking stream (its 300 ms kernel still runs)");
    CK(D.ctxSynchronize());
    /* ... and a blocking stream waits for the legacy stream. */
    t0 = now_ms();
    launch_spin(CU_STREAM_LEGACY, 1, 3000);
    launch_spin(blocking, 1, 10);
    CK(D.streamSynchronize(blocking));
    check(now_ms() - t0 >= 2.9, "blocking stream waits for the legacy stream");
    CK(D.ctxSynchronize());

    /* Query is NOT_READY while work is pending. */
    launch_spin(nonblocking, 1, 3000);
    check(D.streamQuery(nonblocking) == CUDA_ERROR_NOT_READY, "cuStreamQuery is NOT_READY while a kernel runs");
    CK(D.streamSynchronize(nonblocking));
    check(D.streamQuery(nonblocking) == CUDA_SUCCESS, "cuStreamQuery is SUCCESS after synchronize");

    /* Event edges order streams. */
    CUevent ev;
    CK(D.eventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    t0 = now_ms();
    launch_spin(blocking, 1, 3000);
    CK(D.eventRecord(ev, blocking));
    CK(D.streamWaitEvent(nonblocking, ev, 0));
    launch_spin(nonblocking, 1, 10);
    CK(D.streamSynchronize(nonblocking));
    check(now_ms() - t0 >= 2.9, "cuStreamWaitEvent orders a stream after another stream's kernel");

    /* Host functions run after the preceding work, before synchronize returns. */
    volatile double stamp = 0;
    t0 = now_ms();
    launch_spin(nonblocking, 1, 3000);
    CK(D.launchHostFunc(nonblocking, host_stamp, (void *)&stamp));
    CK(D.streamSynchronize(nonblocking));
    check(stamp != 0, "host function ran before cuStreamSynchronize returned");
    check(stamp - t0 >= 2.9, "host function ran after the preceding kernel finished");

    /* Per-thread default streams of two threads run concurrently. */
    pthread_t th[2];
    struct pt_arg pa[2] = {{0, 0}, {0, 0}}, alone = {0, 0};
    /* one thread alone first: on a loaded machine the 20 ms kernel takes longer, and two serialised ones twice that */
    pthread_create(&th[0], NULL, pt_thread, &alone);
    pthread_join(th[0], NULL);
    t0 = now_ms();
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, pt_thread, &pa[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    double both = now_ms() - t0;
    check(pa[0].r == CUDA_SUCCESS && pa[1].r == CUDA_SUCCESS, "per-thread default stream launches succeed");
    check(alone.r == CUDA_SUCCESS && both < 1.6 * (alone.ms > 20.0 ? alone.ms : 20.0),
          "per-thread default streams of two threads overlap (20 ms each, both < 1.6x one alone)");

    /* Capture with fork/join through events; the graph replays the captured work. */
    CUdeviceptr buf;
    CK(D.memAlloc(&buf, 4096));
    CK(D.memsetD32(buf, 0, 1024));
    CUevent fork, join;
    CK(D.eventCreate(&fork, CU_EVENT_DISABLE_TIMING));
    CK(D.eventCreate(&join, CU_EVENT_DISABLE_TIMING));
    CK(D.beginCapture(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL));
    check(D.streamSynchronize(blocking) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
          "synchronizing a capturing stream is STREAM_CAPTURE_UNSUPPORTED");
    CUstreamCaptureStatus cs;
    CK(D.streamIsCapturing(blocking, &cs));
    check(cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED, "the synchronisation invalidated the capture");
    CUgraph bad = (CUgraph)1;
    check(D.endCapture(blocking, &bad) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && bad == NULL,
          "ending an invalidated capture is STREAM_CAPTURE_INVALIDATED, with no graph");
    CK(D.beginCapture(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(D.eventRecord(fork, blocking));
    CK(D.streamWaitEvent(nonblocking, fork, 0));
    CK(D.streamIsCapturing(nonblocking, &cs));
    check(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE, "a stream waiting on a captured event joins the capture");
    unsigned long long n = 1024;
    unsigned v = 0x5eed, us = 10;
    void *fargs[] = {&buf, &v, &n, &us};
    CK(D.launchKernel(g_fill, 1, 1, 1, 32, 1, 1, 0, nonblocking, fargs, NULL));
    CK(D.eventRecord(join, nonblocking));
    CK(D.streamWaitEvent(blocking, join, 0));
    CUgraph gr;
    CK(D.endCapture(blocking, &gr));
    CK(D.streamIsCapturing(nonblocking, &cs));
    check(cs == CU_STREAM_CAPTURE_STATUS_NONE, "ending the capture releases joined streams");
    uint32_t h[1024];
    CK(D.memcpyDtoH(h, buf, sizeof h));
    check(h[0] == 0 && h[1023] == 0, "captured work does not run at capture time");
    CUgraphExec ex;
    CK(D.graphInstantiate(&ex, gr, 0));
    CK(D.graphLaunch(ex, blocking));
    CK(D.streamSynchronize(blocking));
    CK(D.memcpyDtoH(h, buf, sizeof h));
    check(h[0] == 0x5eed && h[1023] == 0x5eed, "graph launch replays the captured kernel");

    /* CUDA 12.4 style: a green context made current through cuCtxFromGreenCtx confines NULL-stream work and
     * owns the streams created while it is current. */
    green_setup gsu = {0};
    CK(make_green(32, 1ULL << 1, &gsu));
    CUcontext gctx, popped;
    CK(D.ctxFromGreenCtx(&gctx, gsu.green));
    CK(D.ctxPushCurrent(gctx));
    CUfunction smid;
    CK(D.moduleGetFunction(&smid, mod, "ds_smid"));
    CUdeviceptr ids;
    CK(D.memAlloc(&ids, 64 * 4));
    void *iargs[] = {&ids, &us};
    CK(D.launchKernel(smid, 64, 1, 1, 32, 1, 1, 0, NULL, iargs, NULL));
    uint32_t hid[64];
    CK(D.memcpyDtoH(hid, ids, sizeof hid));
    bool inside = true;
    for (int i = 0; i < 64; i++)
        inside &= hid[i] >= 32 && hid[i] < 64;
    check(inside, "NULL-stream kernels of a current green context stay on its SMs");
    CUstream owned;
    CK(D.streamCreate(&owned, CU_STREAM_NON_BLOCKING));
    CUgreenCtx got = NULL;
    CK(D.streamGetGreenCtx(owned, &got));
    check(got == gsu.green, "a stream created under a current green context belongs to it");
    CK(D.ctxPopCurrent(&popped));
    check(popped == gctx, "cuCtxPopCurrent returns the green context's CUcontext");
    CK(D.streamGetGreenCtx(nonblocking, &got));
    check(got == NULL, "a primary-context stream has no green context");
    /* cuGreenCtxRecordEvent captures the green context's pending work. */
    CUevent gev;
    CK(D.eventCreate(&gev, CU_EVENT_DISABLE_TIMING));
    t0 = now_ms();
    launch_spin(gsu.stream, 1, 3000);
    CK(D.greenCtxRecordEvent(gsu.green, gev));
    CK(D.streamWaitEvent(nonblocking, gev, 0));
    launch_spin(nonblocking, 1, 10);
    CK(D.streamSynchronize(nonblocking));
    check(now_ms() - t0 >= 2.9, "cuGreenCtxRecordEvent orders other streams after the green context's work");

    /* Handles and argument checks. */
    CUstream dead;
    CK(D.streamCreate(&dead, CU_STREAM_NON_BLOCKING));
    CK(D.streamDestroy(dead));
    void *sargs[] = {&us};
    check(D.launchKernel(g_spin, 1, 1, 1, 32, 1, 1, 0, dead, sargs, NULL) == CUDA_ERROR_INVALID_HANDLE,
          "launch on a destroyed stream is INVALID_HANDLE");
    check(D.launchKernel(g_spin, 1, 1, 1, 2048, 1, 1, 0, NULL, sargs, NULL) == CUDA_ERROR_INVALID_VALUE,
          "2048 threads per block is INVALID_VALUE");
    check(D.launchKernel(g_spin, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == CUDA_ERROR_INVALID_VALUE,
          "missing kernel arguments are INVALID_VALUE");
    CUdevResource dev;
    memset(&dev, 0, sizeof dev);
    CK(D.deviceGetDevResource(g_dev, &dev, CU_DEV_RESOURCE_TYPE_SM));
    CUdevResourceDesc desc;
    CK(D.generateDesc(&desc, &dev, 1));
    CUgreenCtx gc;
    check(D.greenCtxCreate(&gc, desc, g_dev, 0) == CUDA_ERROR_INVALID_VALUE,
          "cuGreenCtxCreate without CU_GREEN_CTX_DEFAULT_STREAM is INVALID_VALUE");
    CK(D.greenCtxCreate(&gc, desc, g_dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CUstream gs;
    check(D.greenCtxStreamCreate(&gs, gc, CU_STREAM_DEFAULT, 0) == CUDA_ERROR_INVALID_VALUE,
          "a blocking green stream is INVALID_VALUE");
    check(D.deviceGetDevResource(g_dev, &dev, (CUdevResourceType)1000) == CUDA_ERROR_INVALID_RESOURCE_TYPE,
          "workqueue resources are INVALID_RESOURCE_TYPE on 13.0");
    out("{\"cmd\":\"streams\",\"path\":\"%s\",\"ptds\":%s,\"ok\":%s,\"legacy_after_blocking_ms\":%.3f,"
        "\"legacy_after_nonblocking_ms\":%.3f,\"two_ptds_threads_ms\":%.3f}",
        g_path, g_ptds ? "true" : "false", g_failed ? "false" : "true", legacy_after_blocking,
        legacy_after_nonblocking, both);
    return g_failed;
}

/* ---- NVML (libnvidia-ml.so.1 through dlopen, as frameworks load it) ---- */

typedef struct {
    unsigned long long total, free, used;
} probe_nvml_mem;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} probe_nvml_mem2;
typedef struct {
    unsigned int pid;
    unsigned long long used;
    unsigned int gi, ci;
} probe_nvml_proc;

static int cmd_nvml(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        out("{\"error\":\"dlopen libnvidia-ml.so.1 failed\",\"detail\":\"%s\"}", dlerror());
        return 1;
    }
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2");
    int (*handle)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*name)(void *, char *, unsigned) = (int (*)(void *, char *, unsigned))dlsym(h, "nvmlDeviceGetName");
    int (*uuid)(void *, char *, unsigned) = (int (*)(void *, char *, unsigned))dlsym(h, "nvmlDeviceGetUUID");
    int (*mem)(void *, probe_nvml_mem *) = (int (*)(void *, probe_nvml_mem *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    int (*mem2)(void *, probe_nvml_mem2 *) =
        (int (*)(void *, probe_nvml_mem2 *))dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    int (*procs)(void *, unsigned *, probe_nvml_proc *) =
        (int (*)(void *, unsigned *, probe_nvml_proc *))dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!init || !count || !handle || !name || !uuid || !mem || !mem2 || !procs) {
        out("{\"error\":\"missing NVML symbols\"}");
        return 1;
    }
    int r;
    unsigned n = 0;
    void *dev = NULL;
    char nm[96] = "", id[96] = "";
    probe_nvml_mem m = {0};
    probe_nvml_mem2 m2 = {.version = (unsigned)(sizeof(probe_nvml_mem2) | (2u << 24))};
    probe_nvml_proc ps[64];
    unsigned np = 64;
    if ((r = init()) || (r = count(&n)) || (r = handle(0, &dev)) || (r = name(dev, nm, sizeof nm)) ||
        (r = uuid(dev, id, sizeof id)) || (r = mem(dev, &m)) || (r = mem2(dev, &m2)) || (r = procs(dev, &np, ps))) {
        out("{\"error\":\"NVML call failed\",\"code\":%d}", r);
        return 1;
    }
    char plist[2048];
    size_t off = 0;
    for (unsigned i = 0; i < np && i < 64; i++)
        off += (size_t)snprintf(plist + off, sizeof plist - off, "%s{\"pid\":%u,\"used\":%llu}", i ? "," : "",
                                ps[i].pid, ps[i].used);
    plist[off] = 0;
    out("{\"cmd\":\"nvml\",\"count\":%u,\"name\":\"%s\",\"uuid\":\"%s\",\"total\":%llu,\"free\":%llu,\"used\":%llu,"
        "\"v2_total\":%llu,\"v2_free\":%llu,\"processes\":[%s]}",
        n, nm, id, m.total, m.free, m.used, m2.total, m2.free, plist);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2)
        usage("missing command (info, meminfo, alloc, spin, split, procaddr, data, streams, nvml)");
    const char *cmd = argv[1];
    parse_opts(argc, argv, 2);
    const char *path = opt_str("path", NULL);
#ifndef PROBE_LINKED
    if (path && !strcmp(path, "linked")) {
        /* Same arguments, other build (linked with -lcuda), next to this executable. */
        char self[PATH_MAX];
        ssize_t k = readlink("/proc/self/exe", self, sizeof self - 16);
        if (k <= 0)
            usage("cannot find own executable for --path=linked");
        self[k] = 0;
        strcat(self, "-linked");
        execv(self, argv);
        fprintf(stderr, "simgpu-probe: cannot exec %s: %s\n", self, strerror(errno));
        return 2;
    }
#endif
    if (path && strcmp(path, "linked") && strcmp(path, "runtime")) {
        fprintf(stderr, "simgpu-probe: invalid --path=%s (allowed: runtime, linked)\n", path);
        return 2;
    }
    g_ptds = opt_num("ptds", 0) != 0;
    if (!strcmp(cmd, "procaddr")) {
        resolve_all();
        return cmd_procaddr();
    }
    if (!strcmp(cmd, "nvml"))
        return cmd_nvml(); /* NVML only: no CUDA context in this process */
    if (!strcmp(cmd, "streams")) {
        /* Before cuInit every call but version and entry-point queries fails with NOT_INITIALIZED. */
        resolve_all();
        int cnt;
        CUdeviceptr p;
        check(D.deviceGetCount(&cnt) == CUDA_ERROR_NOT_INITIALIZED, "cuDeviceGetCount before cuInit");
        check(D.memAlloc(&p, 16) == CUDA_ERROR_NOT_INITIALIZED, "cuMemAlloc before cuInit");
        check(D.init(1) == CUDA_ERROR_INVALID_VALUE, "cuInit(1) is INVALID_VALUE");
        setup();
        return cmd_streams();
    }
    setup();
    if (!strcmp(cmd, "info"))
        return cmd_info();
    if (!strcmp(cmd, "meminfo"))
        return cmd_meminfo();
    if (!strcmp(cmd, "alloc"))
        return cmd_alloc();
    if (!strcmp(cmd, "spin"))
        return cmd_spin();
    if (!strcmp(cmd, "split"))
        return cmd_split();
    if (!strcmp(cmd, "data"))
        return cmd_data();
    fprintf(stderr, "simgpu-probe: unknown command %s (allowed: info, meminfo, alloc, spin, split, procaddr, data, streams, nvml)\n",
            cmd);
    return 2;
}
