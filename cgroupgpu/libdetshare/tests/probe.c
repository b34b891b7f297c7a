/*
 * probe.c — a scriptable CUDA driver client for the libdetshare tests. Each argument is one step; each step prints
 * one line "<step> rc=<CUresult> [key=value ...]" so that the Go tests can assert on every call. Built twice:
 * ds_probe_rt (runtime-style lookup through cuGetProcAddress) and ds_probe_lcuda (linked with -lcuda).
 *
 * Steps: init | info | total | alloc:N | pitch:WxH | managed:N | async:N | pool:N | vmm:N | vmmhost:N |
 *        array:WxH | array3d:WxHxD | mipmap:WxH:L | free-last | free-all | launch:N | hold | env:NAME |
 *        unsetenv:NAME | setenv:NAME=VALUE (changed inside main(), after the library's constructor) |
 *        setuid:N (setresgid and setresuid to N, in-process) |
 *        procaddr:SYMBOL:VERSION:FLAGS | dlsym:NAME | fork:N (child allocates N bytes, reports, exits) |
 *        stream (later kernels go to a new blocking stream; default: the legacy NULL stream) |
 *        spinlaunch:MS (one MS-millisecond kernel; prints how long the launch call took) | spins:NxUS (N kernels of
 *        US microseconds, no synchronisation) | readback:N (a device-to-host copy of N bytes on the current stream and
 *        a synchronisation of it, as a server reading its result back) | mixburst:RxLONGxSHORT (R rounds of 8 SHORT-us kernels of one
 *        function and 2 LONG-us kernels of another, as a trainer's optimizer and GEMMs, then a synchronisation;
 *        tail_ms as burst:) | burstq:NxUS (burst:, an event recorded after each kernel; also prints queued: the
 *        kernels not finished when the last launch returned, a count a loaded machine cannot inflate) | ctxsync (cuCtxSynchronize; prints how long it waited) | sleep:MS |
 *        libkernels (later kernels come from cuLibraryLoadData + cuLibraryGetKernel + cuKernelGetFunction, as
 *        cudart 12+ loads them; default: cuModuleLoadData + cuModuleGetFunction) | pause (waits for a
 *        line on stdin) | smid:B (B blocks report their SM; prints the SMs and 8-SM groups used) | coopsmid:B
 *        (smid:B as a cooperative launch: every block resident at once) | smidsmem:B:S (smid:B with S bytes of dynamic
 *        shared memory) |
 *        axpy:K (K dependent kernels y = a*x + y; prints a hash of y) | dcopy:K (K rounds of a device copy, a
 *        memset and a kernel, each reading what the one before wrote; prints a hash) | capture:B (captures smid:B into a graph on
 *        the current stream; capturekeep:B keeps the graph, as capture:B does not) | graph (launches the captured
 *        graph, prints the SMs it used) | graphset (sets the executable's kernel node to its own parameters with
 *        cuGraphExecKernelNodeSetParams_v2, as an application changing its executable does) |
 *        conform (CUDA stream semantics checks, one line each: "conform:<check> rc=0 ok=<0|1>") |
 *        mt:NxK (N threads, own streams / per-thread default streams, K axpy kernels each + a smid kernel) |
 *        appgreen:G (the application makes its own green context over 8-SM group G of a split and launches
 *        later kernels on a stream of it) |
 *        nvml (memory of GPU 0 through libnvidia-ml.so.1, found with dlopen + dlsym like nvidia-smi and pynvml) |
 *        poolthreshold:N (sets the release threshold of a pool of its own; prints the threshold the driver has) |
 *        pooldestroy (destroys that pool) | graphmem:N (a new graph with one memory-allocation node of N bytes; graphnode:N adds it with the generic
 *        cuGraphAddNode) | graphinst (instantiates that graph once more) |
 *        rawalloc:N (a hostile tenant's bypass: cuMemAlloc_v2 resolved with glibc's own dlsym (dlvsym on libc's
 *        handle), straight from libcuda's symbol table, so the interception library never sees the call) |
 *        sigbus-handler (installs the program's own SIGBUS handler, as Python's faulthandler does: it prints
 *        "app-sigbus" and exits 7) | raise-sigbus (raises SIGBUS) |
 *        forkrace:N (N forks while two threads keep the library's locks busy; each child exits at once, without
 *        CUDA; prints how many forks returned, children exited 0, children hung, threads stuck)
 */
#include "drv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { A_PTR, A_ASYNC, A_VMM, A_ARRAY, A_MIPMAP };
struct alloc {
    int kind;
    CUdeviceptr ptr;
    CUmemGenericAllocationHandle h;
    CUarray arr;
    CUmipmappedArray mip;
};
static struct alloc g_allocs[4096];
static int g_n;
static struct drv D;
static CUdevice g_dev;
static CUstream g_stream; /* where kernels go; NULL = legacy default stream */
static CUmodule g_mod;
static CUgraphExec g_exec;
static CUgraph g_graph; /* the captured graph, kept by capturekeep */
static CUdeviceptr g_graph_out;
#define AUX_WORDS 16u
#define AUX_VALUE 0x5eedu
static CUdeviceptr g_graph_aux; /* set by the memset node of a capturememset graph */
static unsigned g_graph_blocks;
static CUgraph g_memgraph; /* the last graph of graphmem/graphnode */

static int g_libkernels; /* libkernels step: functions come from a library's kernels, as cudart 12+ loads them */
static CUlibrary g_lib;

static CUresult func(const char *name, CUfunction *fn) {
    static char image[] = "simgpu-module"; /* the simulated GPU accepts any image: every module has its kernels */
    if (g_libkernels) {
        CUresult r = g_lib ? CUDA_SUCCESS : D.cuLibraryLoadData(&g_lib, image, NULL, NULL, 0, NULL, NULL, 0);
        CUkernel k = NULL;
        if (r == CUDA_SUCCESS)
            r = D.cuLibraryGetKernel(&k, g_lib, name);
        return r ? r : D.cuKernelGetFunction(fn, k);
    }
    CUresult r = g_mod ? CUDA_SUCCESS : D.cuModuleLoadData(&g_mod, image);
    return r ? r : D.cuModuleGetFunction(fn, g_mod, name);
}

/* prints the distinct SMs of out[0..n) as ranges, and the 8-SM groups they fall in */
static void print_sms(const char *step, CUresult r, const uint32_t *sm, unsigned n) {
    static unsigned char seen[1024];
    memset(seen, 0, sizeof seen);
    unsigned distinct = 0;
    for (unsigned i = 0; r == CUDA_SUCCESS && i < n; i++)
        if (sm[i] < sizeof seen && !seen[sm[i]]) { /* set, not counted: 256 blocks on one SM must not wrap it */
            seen[sm[i]] = 1;
            distinct++;
        }
    printf("%s rc=%d distinct=%u sms=", step, r, distinct);
    int first = 1;
    for (unsigned i = 0; i < sizeof seen; i++) {
        if (!seen[i] || (i > 0 && seen[i - 1]))
            continue;
        unsigned j = i;
        while (j + 1 < sizeof seen && seen[j + 1])
            j++;
        printf("%s%u-%u", first ? "" : ",", i, j);
        first = 0;
    }
    printf(" groups=");
    first = 1;
    for (unsigned g = 0; g < sizeof seen / 8; g++) {
        int any = 0;
        for (unsigned k = 0; k < 8; k++)
            any |= seen[g * 8 + k];
        if (any) {
            printf("%s%u", first ? "" : ",", g);
            first = 0;
        }
    }
    printf("\n");
}

/* smid:B, or coopsmid:B (a cooperative launch: all B blocks resident at once, so a grant of fewer SMs refuses it);
 * smidsmem:B:S is smid:B launched with S bytes of dynamic shared memory */
static void smid_smem(const char *step, unsigned blocks, unsigned smem) {
    CUfunction fn;
    CUdeviceptr out = 0;
    uint32_t *host = calloc(blocks, 4);
    CUresult r = host ? func("ds_smid", &fn) : CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS)
        r = D.cuMemAlloc_v2(&out, (size_t)blocks * 4);
    uint32_t us = 20;
    void *args[] = {&out, &us};
    if (r == CUDA_SUCCESS)
        r = strcmp(step, "coopsmid") ? D.cuLaunchKernel(fn, blocks, 1, 1, 1, 1, 1, smem, g_stream, args, NULL)
                                     : D.cuLaunchCooperativeKernel(fn, blocks, 1, 1, 1, 1, 1, 0, g_stream, args);
    if (r == CUDA_SUCCESS)
        r = D.cuStreamSynchronize(g_stream);
    if (r == CUDA_SUCCESS)
        r = D.cuMemcpyDtoH_v2(host, out, (size_t)blocks * 4);
    print_sms(step, r, host, blocks);
    if (out)
        D.cuMemFree_v2(out);
    free(host);
}

static void smid(const char *step, unsigned blocks) { smid_smem(step, blocks, 0); }

static void push(struct alloc a) {
    if (g_n < (int)(sizeof g_allocs / sizeof g_allocs[0]))
        g_allocs[g_n++] = a;
}

static CUresult free_one(struct alloc *a) {
    switch (a->kind) {
    case A_PTR:
        return D.cuMemFree_v2(a->ptr);
    case A_ASYNC: {
        CUresult r = D.cuMemFreeAsync(a->ptr, NULL);
        if (r == CUDA_SUCCESS)
            r = D.cuCtxSynchronize();
        return r;
    }
    case A_VMM:
        return D.cuMemRelease(a->h);
    case A_ARRAY:
        return D.cuArrayDestroy(a->arr);
    default:
        return D.cuMipmappedArrayDestroy(a->mip);
    }
}

static const char *obj_of(void *p, const char **sym) {
    Dl_info i;
    *sym = "?";
    if (!p || !dladdr(p, &i) || !i.dli_fname)
        return "?";
    if (i.dli_sname)
        *sym = i.dli_sname;
    const char *b = strrchr(i.dli_fname, '/');
    return b ? b + 1 : i.dli_fname;
}

static int launch_fill(unsigned n) {
    static char image[] = "simgpu-module"; /* the simulated GPU accepts any image: every module has its kernels */
    CUmodule mod;
    CUfunction fn;
    CUresult r = D.cuModuleLoadData(&mod, image);
    if (r == CUDA_SUCCESS)
        r = D.cuModuleGetFunction(&fn, mod, "ds_fill_u32");
    if (r != CUDA_SUCCESS)
        return r;
    CUdeviceptr buf;
    uint64_t count = 256;
    if ((r = D.cuMemAlloc_v2(&buf, count * 4)) != CUDA_SUCCESS)
        return r;
    int ok = 1;
    for (unsigned i = 0; i < n && r == CUDA_SUCCESS; i++) {
        uint32_t v = 1000 + i, us = 1;
        void *args[] = {&buf, &v, &count, &us};
        r = (i & 1) ? D.cuLaunchKernel_ptsz(fn, 2, 1, 1, 32, 1, 1, 0, NULL, args, NULL)
                    : D.cuLaunchKernel(fn, 2, 1, 1, 32, 1, 1, 0, NULL, args, NULL);
    }
    if (r == CUDA_SUCCESS)
        r = D.cuCtxSynchronize();
    uint32_t host[256];
    if (r == CUDA_SUCCESS)
        r = D.cuMemcpyDtoH_v2(host, buf, sizeof host);
    for (unsigned i = 0; r == CUDA_SUCCESS && n && i < count; i++)
        if (host[i] != 1000 + n - 1)
            ok = 0;
    D.cuMemFree_v2(buf);
    printf("launch rc=%d n=%u ok=%d\n", r, n, ok);
    return -1;
}

/* K dependent kernels y = a*x + y on stream st; *hash = FNV-1a of y. With copies, each kernel is preceded by a
 * device-to-device copy x <- y and a memset of y's first quarter to 1.0f: each step reads what the one before
 * wrote. */
static CUresult axpy_rounds(CUstream st, unsigned long long k, bool copies, uint64_t *hash) {
    enum { N = 4096 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    if (!x || !y) {
        free(x);
        free(y);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (unsigned i = 0; i < N; i++) {
        x[i] = 1.0f / (float)(i + 1);
        y[i] = (float)i * 0.5f;
    }
    CUfunction fn;
    CUdeviceptr dx = 0, dy = 0;
    CUresult r = func("ds_axpy", &fn);
    if (r == CUDA_SUCCESS)
        r = D.cuMemAlloc_v2(&dx, N * sizeof(float));
    if (r == CUDA_SUCCESS)
        r = D.cuMemAlloc_v2(&dy, N * sizeof(float));
    if (r == CUDA_SUCCESS)
        r = D.cuMemcpyHtoD_v2(dx, x, N * sizeof(float));
    if (r == CUDA_SUCCESS)
        r = D.cuMemcpyHtoD_v2(dy, y, N * sizeof(float));
    uint64_t n = N;
    uint32_t us = 2;
    for (unsigned long long i = 0; i < k && r == CUDA_SUCCESS; i++) {
        float alpha = 0.75f + (float)(i % 7) * 0.125f;
        void *args[] = {&dy, &dx, &alpha, &n, &us};
        if (copies)
            r = D.cuMemcpyDtoDAsync_v2(dx, dy, N * sizeof(float), st);
        if (copies && r == CUDA_SUCCESS)
            r = D.cuMemsetD32Async(dy, 0x3f800000u, N / 4, st);
        if (r == CUDA_SUCCESS)
            r = D.cuLaunchKernel(fn, 16, 1, 1, 256, 1, 1, 0, st, args, NULL);
    }
    if (r == CUDA_SUCCESS)
        r = D.cuStreamSynchronize(st);
    if (r == CUDA_SUCCESS)
        r = D.cuMemcpyDtoH_v2(y, dy, N * sizeof(float));
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)y;
    for (size_t i = 0; i < N * sizeof(float); i++)
        h = (h ^ b[i]) * 1099511628211ull;
    if (dx)
        D.cuMemFree_v2(dx);
    if (dy)
        D.cuMemFree_v2(dy);
    free(x);
    free(y);
    *hash = h;
    return r;
}

/* N threads, each on its own stream (odd threads on their per-thread default stream), K axpy kernels each and a
 * smid kernel: prints whether every thread got the same result, and the SM groups they ran on. */
struct mt_arg {
    unsigned k, idx;
    CUcontext ctx;
    CUresult r;
    uint64_t hash;
    uint32_t sm[32];
};
static void *mt_thread(void *p) {
    struct mt_arg *a = p;
    CUstream st = NULL;
    a->r = D.cuCtxSetCurrent(a->ctx);
    if (!a->r && (a->idx & 1) == 0)
        a->r = D.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING);
    else if (!a->r)
        st = CU_STREAM_PER_THREAD;
    if (!a->r)
        a->r = axpy_rounds(st, a->k, false, &a->hash);
    CUfunction fn;
    CUdeviceptr out = 0;
    if (!a->r)
        a->r = func("ds_smid", &fn);
    if (!a->r)
        a->r = D.cuMemAlloc_v2(&out, sizeof a->sm);
    uint32_t us = 20;
    void *args[] = {&out, &us};
    if (!a->r)
        a->r = D.cuLaunchKernel(fn, 32, 1, 1, 1, 1, 1, 0, st, args, NULL);
    if (!a->r)
        a->r = D.cuStreamSynchronize(st);
    if (!a->r)
        a->r = D.cuMemcpyDtoH_v2(a->sm, out, sizeof a->sm);
    if (out)
        D.cuMemFree_v2(out);
    return NULL;
}
/* churnmt: threads that each create, launch on (one block of ds_smid) and destroy streams, while the main thread frees
 * and synchronises the context: the stream table's reuse under concurrent lookups and walks */
#define CHURN_MT_N 1500u /* four threads: 6000 streams, past the 4096 the table once held */
struct churn_arg {
    CUcontext ctx;
    unsigned idx;
    CUresult r;
    uint32_t sm[CHURN_MT_N];
};
static atomic_int g_churn_left;
static void *churn_thread(void *p) {
    struct churn_arg *a = p;
    CUfunction fn;
    CUdeviceptr out = 0;
    a->r = D.cuCtxSetCurrent(a->ctx);
    if (!a->r)
        a->r = func("ds_smid", &fn);
    if (!a->r)
        a->r = D.cuMemAlloc_v2(&out, sizeof a->sm);
    uint32_t us = 1;
    for (unsigned i = 0; i < CHURN_MT_N && !a->r; i++) {
        CUstream st;
        CUdeviceptr at = out + (CUdeviceptr)i * 4;
        void *args[] = {&at, &us};
        a->r = D.cuStreamCreate(&st, (i + a->idx) & 1 ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT);
        if (!a->r)
            a->r = D.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, args, NULL);
        if (!a->r)
            a->r = D.cuStreamSynchronize(st);
        if (!a->r)
            a->r = D.cuStreamDestroy_v2(st);
    }
    if (!a->r)
        a->r = D.cuMemcpyDtoH_v2(a->sm, out, sizeof a->sm);
    if (out)
        D.cuMemFree_v2(out);
    atomic_fetch_sub(&g_churn_left, 1);
    return NULL;
}
static void churn_mt(unsigned n) {
    static struct churn_arg args[8];
    static uint32_t all[8 * CHURN_MT_N];
    pthread_t th[8];
    CUcontext ctx;
    CUfunction warm;
    if (n > 8)
        n = 8;
    CUresult r = D.cuDevicePrimaryCtxRetain(&ctx, g_dev);
    if (!r)
        r = func("ds_smid", &warm); /* load the module before the threads race for it */
    atomic_store(&g_churn_left, (int)n);
    for (unsigned i = 0; i < n && !r; i++) {
        args[i] = (struct churn_arg){.idx = i, .ctx = ctx};
        if (pthread_create(&th[i], NULL, churn_thread, &args[i]))
            r = CUDA_ERROR_OPERATING_SYSTEM, n = i, atomic_store(&g_churn_left, (int)i);
    }
    unsigned walks = 0;
    while (!r && atomic_load(&g_churn_left) > 0) {
        CUdeviceptr p;
        r = D.cuMemAlloc_v2(&p, 256);
        if (!r)
            r = D.cuMemFree_v2(p);
        if (!r)
            r = D.cuCtxSynchronize();
        walks++;
    }
    for (unsigned i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        if (!r)
            r = args[i].r;
        memcpy(&all[i * CHURN_MT_N], args[i].sm, sizeof args[i].sm);
    }
    fprintf(stderr, "churnmt: %u frees and synchronisations during the churn\n", walks);
    print_sms("churnmt", r, all, n * CHURN_MT_N);
}

static void mt(unsigned n, unsigned k) {
    struct mt_arg args[64];
    pthread_t th[64];
    CUcontext ctx;
    CUfunction warm;
    if (n > 64)
        n = 64;
    CUresult r = D.cuDevicePrimaryCtxRetain(&ctx, g_dev);
    if (!r)
        r = func("ds_axpy", &warm); /* load the module before the threads race for it */
    for (unsigned i = 0; i < n && !r; i++) {
        args[i] = (struct mt_arg){.k = k, .idx = i, .ctx = ctx};
        if (pthread_create(&th[i], NULL, mt_thread, &args[i]))
            r = CUDA_ERROR_OPERATING_SYSTEM, n = i;
    }
    uint32_t all[64 * 32];
    unsigned same = 1;
    for (unsigned i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        if (!r)
            r = args[i].r;
        if (args[i].hash != args[0].hash)
            same = 0;
        memcpy(&all[i * 32], args[i].sm, sizeof args[i].sm);
    }
    printf("mthash rc=%d same=%u hash=%016llx\n", r, same, n ? (unsigned long long)args[0].hash : 0ull);
    print_sms("mt", r, all, n * 32);
}

/* forkrace: two threads keep launching kernels and a graph on streams of their own (a new one each round for the
 * first RACE_STREAMS rounds: new logical streams) and on the legacy stream (cross-stream rules), synchronising a
 * stream and the context (joins), while the main thread forks; under a partial grant that the test keeps changing
 * they also rebind and have graph copies made. */
#define RACE_STREAMS 64u
struct race_arg {
    CUcontext ctx;
    CUfunction fn;
    CUgraphExec exec;
    atomic_int *stop;
    unsigned long iters;
    CUresult r;
};
static void *race_thread(void *p) {
    struct race_arg *a = p;
    CUstream streams[RACE_STREAMS] = {0};
    a->r = D.cuCtxSetCurrent(a->ctx);
    uint32_t us = 1;
    void *args[] = {&us};
    while (a->r == CUDA_SUCCESS && !atomic_load(a->stop)) {
        CUstream *st = &streams[a->iters % RACE_STREAMS];
        CUresult r = *st ? CUDA_SUCCESS : D.cuStreamCreate(st, 0);
        if (r == CUDA_SUCCESS)
            r = D.cuLaunchKernel(a->fn, 1, 1, 1, 1, 1, 1, 0, *st, args, NULL);
        if (r == CUDA_SUCCESS)
            r = D.cuGraphLaunch(a->exec, *st);
        if (r == CUDA_SUCCESS)
            r = D.cuLaunchKernel(a->fn, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
        if (r == CUDA_SUCCESS)
            r = D.cuStreamSynchronize(*st);
        if (r == CUDA_SUCCESS)
            r = D.cuCtxSynchronize();
        a->r = r;
        a->iters++;
    }
    return NULL;
}

/* Waits up to ms for pid; true when it exited with status 0. *hung: it did not exit in time (then it is killed). */
static bool reap(pid_t pid, int ms, bool *hung) {
    int status = 0;
    for (int waited = 0; waited <= ms; waited++) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            return WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (w < 0)
            return false;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    *hung = true;
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return false;
}

static void forkrace(unsigned n) {
    atomic_int stop = 0;
    struct race_arg args[2];
    pthread_t th[2];
    unsigned started = 0;
    CUcontext ctx;
    CUfunction fn;
    CUstream cap = NULL;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    uint32_t us = 1;
    void *kargs[] = {&us};
    CUresult r = D.cuDevicePrimaryCtxRetain(&ctx, g_dev);
    if (r == CUDA_SUCCESS)
        r = func("ds_spin", &fn);
    if (r == CUDA_SUCCESS)
        r = D.cuStreamCreate(&cap, 0);
    if (r == CUDA_SUCCESS)
        r = D.cuStreamBeginCapture_v2(cap, CU_STREAM_CAPTURE_MODE_GLOBAL);
    if (r == CUDA_SUCCESS) {
        r = D.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, cap, kargs, NULL);
        CUresult r2 = D.cuStreamEndCapture(cap, &graph);
        if (r == CUDA_SUCCESS)
            r = r2;
    }
    if (r == CUDA_SUCCESS)
        r = D.cuGraphInstantiateWithFlags(&exec, graph, 0);
    for (unsigned i = 0; i < 2 && r == CUDA_SUCCESS; i++) {
        args[i] = (struct race_arg){.ctx = ctx, .fn = fn, .exec = exec, .stop = &stop};
        if (pthread_create(&th[i], NULL, race_thread, &args[i]) != 0)
            r = CUDA_ERROR_OPERATING_SYSTEM;
        else
            started++;
    }
    unsigned forks = 0, ok = 0, hung = 0;
    unsigned long during = 0; /* rounds the threads made while the forks went on */
    fflush(stdout);
    for (unsigned i = 0; i < n && r == CUDA_SUCCESS; i++) {
        pid_t pid = fork();
        if (pid == 0)
            exit(0); /* no CUDA in the child; the library's exit handler runs */
        if (pid < 0) {
            r = CUDA_ERROR_OPERATING_SYSTEM;
            break;
        }
        forks++;
        bool h = false;
        if (reap(pid, 5000, &h))
            ok++;
        hung += h;
    }
    for (unsigned i = 0; i < started; i++)
        during += args[i].iters;
    /* the threads must still make progress after the forks: a lock left held in the parent would stop them */
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
    atomic_store(&stop, 1);
    unsigned stuck = 0;
    unsigned long after = 0;
    for (unsigned i = 0; i < started; i++) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 10;
        if (pthread_timedjoin_np(th[i], NULL, &dl) != 0) {
            stuck++;
            continue;
        }
        after += args[i].iters;
        if (r == CUDA_SUCCESS)
            r = args[i].r;
    }
    printf("forkrace rc=%d forks=%u children_ok=%u hung=%u stuck=%u rounds_during=%lu rounds_after=%lu\n", r, forks,
           ok, hung, stuck, during, after - during);
}

static double ms_since(struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

/* a 60 ms kernel (one block of the simulated GPU's spin kernel) */
static CUresult spin(CUstream st, int per_thread) {
    CUfunction fn;
    CUresult r = func("ds_spin", &fn);
    uint32_t us = 60000;
    void *args[] = {&us};
    if (r == CUDA_SUCCESS)
        r = per_thread ? D.cuLaunchKernel_ptsz(fn, 1, 1, 1, 1, 1, 1, 0, st, args, NULL)
                       : D.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, args, NULL);
    return r;
}

static void check(const char *name, CUresult r, int ok) { printf("conform:%s rc=%d ok=%d\n", name, r, r == 0 && ok); }

/* CUDA's documented stream semantics, observed through the simulated GPU's timing: results must be the same with
 * and without libdetshare (which moves kernels to green-context streams). */
static void conform(void) {
    struct timespec t0;
    uint32_t word;
    CUdeviceptr dev = 0;
    CUstream blk = NULL, nb = NULL, s2 = NULL;
    CUevent ev = NULL;
    CUresult r = D.cuStreamCreate(&blk, CU_STREAM_DEFAULT);
    if (!r)
        r = D.cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING);
    if (!r)
        r = D.cuStreamCreate(&s2, CU_STREAM_DEFAULT);
    if (!r)
        r = D.cuEventCreate(&ev, CU_EVENT_DEFAULT);
    if (!r)
        r = D.cuMemAlloc_v2(&dev, 4);
    if (r) {
        check("setup", r, 0);
        return;
    }
    /* stream query / synchronize see the kernel */
    r = spin(blk, 0);
    CUresult q = D.cuStreamQuery(blk);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!r)
        r = D.cuStreamSynchronize(blk);
    check("stream_query_not_ready", r, q == CUDA_ERROR_NOT_READY);
    check("stream_sync_waits", r, ms_since(&t0) >= 40);
    /* a synchronous copy (legacy stream) waits for a blocking stream's kernel */
    r = spin(blk, 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!r)
        r = D.cuMemcpyDtoH_v2(&word, dev, 4);
    check("legacy_copy_waits_blocking_stream", r, ms_since(&t0) >= 40);
    D.cuCtxSynchronize();
    /* ... but not for a non-blocking stream's */
    r = spin(nb, 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!r)
        r = D.cuMemcpyDtoH_v2(&word, dev, 4);
    check("legacy_copy_skips_nonblocking_stream", r, ms_since(&t0) < 30);
    D.cuCtxSynchronize();
    /* events recorded after a kernel */
    r = spin(blk, 0);
    if (!r)
        r = D.cuEventRecord(ev, blk);
    q = D.cuEventQuery(ev);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!r)
        r = D.cuEventSynchronize(ev);
    check("event_query_not_ready", r, q == CUDA_ERROR_NOT_READY);
    check("event_sync_waits", r, ms_since(&t0) >= 40);
    /* cross-stream dependency */
    r = spin(blk, 0);
    if (!r)
        r = D.cuEventRecord(ev, blk);
    if (!r)
        r = D.cuStreamWaitEvent(s2, ev, 0);
    q = D.cuStreamQuery(s2);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!r)
        r = D.cuStreamSynchronize(s2);
    check("stream_wait_event", r, q == CUDA_ERROR_NOT_READY && ms_since(&t0) >= 40);
    /* context synchronize waits for everything */
    r = spin(nb, 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!r)
        r = D.cuCtxSynchronize();
    check("ctx_sync_waits", r, ms_since(&t0) >= 40);
    /* legacy default stream kernel, then a synchronous copy */
    r = spin(NULL, 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!r)
        r = D.cuMemcpyDtoH_v2(&word, dev, 4);
    check("legacy_stream_kernel_then_copy", r, ms_since(&t0) >= 40);
    /* per-thread default stream */
    r = spin(NULL, 1);
    q = D.cuStreamQuery(CU_STREAM_PER_THREAD);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!r)
        r = D.cuStreamSynchronize(CU_STREAM_PER_THREAD);
    check("per_thread_stream_sync", r, q == CUDA_ERROR_NOT_READY && ms_since(&t0) >= 40);
    D.cuMemFree_v2(dev);
}

static void app_sigbus(int sig) {
    (void)sig;
    static const char m[] = "app-sigbus\n";
    ssize_t w = write(1, m, sizeof m - 1);
    (void)w;
    _exit(7);
}

static int step(const char *s) {
    CUresult r = CUDA_SUCCESS;
    unsigned long long a = 0, b = 0, c = 0;
    if (!strcmp(s, "init")) {
        CUcontext ctx;
        r = D.cuInit(0);
        if (r == CUDA_SUCCESS)
            r = D.cuDeviceGet(&g_dev, 0);
        if (r == CUDA_SUCCESS)
            r = D.cuDevicePrimaryCtxRetain(&ctx, g_dev);
        if (r == CUDA_SUCCESS)
            r = D.cuCtxSetCurrent(ctx);
        printf("init rc=%d\n", r);
    } else if (!strcmp(s, "info")) {
        size_t f = 0, t = 0;
        r = D.cuMemGetInfo_v2(&f, &t);
        printf("info rc=%d free=%zu total=%zu\n", r, f, t);
    } else if (!strcmp(s, "total")) {
        size_t t = 0;
        r = D.cuDeviceTotalMem_v2(&t, g_dev);
        printf("total rc=%d bytes=%zu\n", r, t);
    } else if (sscanf(s, "alloc:%llu", &a) == 1) {
        struct alloc x = {.kind = A_PTR};
        r = D.cuMemAlloc_v2(&x.ptr, a);
        if (r == CUDA_SUCCESS)
            push(x);
        printf("%s rc=%d\n", s, r);
    } else if (sscanf(s, "pitch:%llux%llu", &a, &b) == 2) {
        struct alloc x = {.kind = A_PTR};
        size_t pitch = 0;
        r = D.cuMemAllocPitch_v2(&x.ptr, &pitch, a, b, 4);
        if (r == CUDA_SUCCESS)
            push(x);
        printf("%s rc=%d pitch=%zu\n", s, r, pitch);
    } else if (sscanf(s, "managed:%llu", &a) == 1) {
        struct alloc x = {.kind = A_PTR};
        r = D.cuMemAllocManaged(&x.ptr, a, CU_MEM_ATTACH_GLOBAL);
        if (r == CUDA_SUCCESS)
            push(x);
        printf("%s rc=%d\n", s, r);
    } else if (sscanf(s, "async:%llu", &a) == 1) {
        struct alloc x = {.kind = A_ASYNC};
        r = D.cuMemAllocAsync(&x.ptr, a, NULL);
        if (r == CUDA_SUCCESS) {
            push(x);
            r = D.cuCtxSynchronize();
        }
        printf("%s rc=%d\n", s, r);
    } else if (sscanf(s, "pool:%llu", &a) == 1) {
        struct alloc x = {.kind = A_ASYNC};
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = g_dev;
        static CUmemoryPool pool;
        r = pool ? CUDA_SUCCESS : D.cuMemPoolCreate(&pool, &props);
        if (r == CUDA_SUCCESS)
            r = D.cuMemAllocFromPoolAsync(&x.ptr, a, pool, NULL);
        if (r == CUDA_SUCCESS) {
            push(x);
            r = D.cuCtxSynchronize();
        }
        printf("%s rc=%d\n", s, r);
    } else if (sscanf(s, "poolthreshold:%llu", &a) == 1 || !strcmp(s, "pooldestroy")) {
        static CUmemoryPool tpool;
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = g_dev;
        r = tpool ? CUDA_SUCCESS : D.cuMemPoolCreate(&tpool, &props);
        cuuint64_t v = a, got = 0;
        if (r == CUDA_SUCCESS && !strcmp(s, "pooldestroy")) {
            r = D.cuMemPoolDestroy(tpool);
            tpool = NULL;
            printf("%s rc=%d\n", s, r);
        } else {
            if (r == CUDA_SUCCESS)
                r = D.cuMemPoolSetAttribute(tpool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v);
            CUresult g = tpool ? D.cuMemPoolGetAttribute(tpool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &got) : r;
            printf("%s rc=%d get_rc=%d threshold=%llu\n", s, r, g, (unsigned long long)got);
        }
    } else if (sscanf(s, "rawalloc:%llu", &a) == 1) {
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        void *(*real_dlsym)(void *, const char *) =
            libc ? (void *(*)(void *, const char *))dlvsym(libc, "dlsym", "GLIBC_2.34") : NULL;
        if (!real_dlsym && libc)
            real_dlsym = (void *(*)(void *, const char *))dlvsym(libc, "dlsym", "GLIBC_2.2.5");
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        CUresult (*raw)(CUdeviceptr *, size_t) =
            real_dlsym && h ? (CUresult(*)(CUdeviceptr *, size_t))real_dlsym(h, "cuMemAlloc_v2") : NULL;
        CUdeviceptr p = 0;
        r = raw ? raw(&p, a) : CUDA_ERROR_NOT_FOUND;
        const char *name, *obj = obj_of((void *)raw, &name);
        printf("%s rc=%d obj=%s\n", s, r, obj);
    } else if (!strcmp(s, "graphinst")) {
        CUgraphExec ex = NULL;
        r = g_memgraph ? D.cuGraphInstantiateWithFlags(&ex, g_memgraph, 0) : CUDA_ERROR_INVALID_HANDLE;
        printf("%s rc=%d\n", s, r);
    } else if (sscanf(s, "graphmem:%llu", &a) == 1 || sscanf(s, "graphnode:%llu", &a) == 1) {
        CUgraph g = NULL;
        CUgraphNode n = NULL;
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.poolProps.location.id = g_dev;
        p.bytesize = a;
        r = D.cuGraphCreate(&g, 0);
        g_memgraph = g;
        if (r == CUDA_SUCCESS && !strncmp(s, "graphnode:", 10)) {
            CUgraphNodeParams gp;
            memset(&gp, 0, sizeof gp);
            gp.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
            gp.alloc = p;
            r = D.cuGraphAddNode(&n, g, NULL, 0, &gp);
        } else if (r == CUDA_SUCCESS)
            r = D.cuGraphAddMemAllocNode(&n, g, NULL, 0, &p);
        printf("%s rc=%d\n", s, r);
    } else if (sscanf(s, "vmm:%llu", &a) == 1 || sscanf(s, "vmmhost:%llu", &a) == 1) {
        struct alloc x = {.kind = A_VMM};
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = strncmp(s, "vmmhost", 7) ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
        prop.location.id = prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? g_dev : 0;
        r = D.cuMemCreate(&x.h, a, &prop, 0);
        if (r == CUDA_SUCCESS)
            push(x);
        printf("%s rc=%d\n", s, r);
    } else if (sscanf(s, "array3d:%llux%llux%llu", &a, &b, &c) == 3) {
        struct alloc x = {.kind = A_ARRAY};
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = a, .Height = b, .Depth = c, .Format = CU_AD_FORMAT_FLOAT,
                                     .NumChannels = 1};
        r = D.cuArray3DCreate_v2(&x.arr, &d);
        if (r == CUDA_SUCCESS)
            push(x);
        printf("%s rc=%d\n", s, r);
    } else if (sscanf(s, "array:%llux%llu", &a, &b) == 2) {
        struct alloc x = {.kind = A_ARRAY};
        CUDA_ARRAY_DESCRIPTOR d = {.Width = a, .Height = b, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        r = D.cuArrayCreate_v2(&x.arr, &d);
        if (r == CUDA_SUCCESS)
            push(x);
        printf("%s rc=%d\n", s, r);
    } else if (sscanf(s, "mipmap:%llux%llu:%llu", &a, &b, &c) == 3) {
        struct alloc x = {.kind = A_MIPMAP};
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = a, .Height = b, .Depth = 0, .Format = CU_AD_FORMAT_FLOAT,
                                     .NumChannels = 1};
        r = D.cuMipmappedArrayCreate(&x.mip, &d, (unsigned)c);
        if (r == CUDA_SUCCESS)
            push(x);
        printf("%s rc=%d\n", s, r);
    } else if (!strcmp(s, "free-last")) {
        if (g_n > 0)
            r = free_one(&g_allocs[--g_n]);
        printf("%s rc=%d\n", s, r);
    } else if (!strcmp(s, "free-all")) {
        while (g_n > 0 && r == CUDA_SUCCESS)
            r = free_one(&g_allocs[--g_n]);
        printf("%s rc=%d\n", s, r);
    } else if (sscanf(s, "sleep:%llu", &a) == 1) {
        struct timespec ts = {(time_t)(a / 1000), (long)(a % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        printf("sleep rc=0\n");
    } else if (sscanf(s, "spinlaunch:%llu", &a) == 1) {
        /* one spin kernel of a ms on the current stream; prints how long the launch call itself took */
        CUfunction fn;
        r = func("ds_spin", &fn);
        uint32_t us = (uint32_t)(a * 1000);
        void *args[] = {&us};
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (r == CUDA_SUCCESS)
            r = D.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, g_stream, args, NULL);
        printf("spinlaunch rc=%d call_ms=%.3f\n", r, ms_since(&t0));
    } else if (!strcmp(s, "ctxsync")) {
        /* a context-wide synchronisation; prints how long it waited (after spinlaunch: the kernel's remainder) */
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        r = D.cuCtxSynchronize();
        printf("ctxsync rc=%d waited_ms=%.3f\n", r, ms_since(&t0));
    } else if (sscanf(s, "burst:%llux%llu", &a, &b) == 2) {
        /* a spin kernels of b us each on the current stream without waiting, then a stream synchronize: tail_ms is
         * how long the work still queued after the last launch returned took to drain (what a reclaim of the SMs
         * would wait for); total_ms the whole burst */
        CUfunction fn;
        r = func("ds_spin", &fn);
        uint32_t us = (uint32_t)b;
        void *args[] = {&us};
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (unsigned long long i = 0; i < a && r == CUDA_SUCCESS; i++)
            r = D.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, g_stream, args, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (r == CUDA_SUCCESS)
            r = D.cuStreamSynchronize(g_stream);
        printf("burst rc=%d tail_ms=%.3f total_ms=%.3f\n", r, ms_since(&t1), ms_since(&t0));
    } else if (sscanf(s, "burstq:%llux%llu", &a, &b) == 2) {
        /* burst:, counting what is still queued when the last launch returns by the events recorded after each
         * kernel: a gate of depth d leaves at most d, however slowly the machine runs them */
        CUfunction fn;
        r = func("ds_spin", &fn);
        uint32_t us = (uint32_t)b;
        void *args[] = {&us};
        enum { QMAX = 256 };
        static CUevent evs[QMAX];
        unsigned long long n = a < QMAX ? a : QMAX;
        for (unsigned long long i = 0; i < n && r == CUDA_SUCCESS; i++)
            if (!evs[i])
                r = D.cuEventCreate(&evs[i], 2 /* CU_EVENT_DISABLE_TIMING */);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (unsigned long long i = 0; i < n && r == CUDA_SUCCESS; i++) {
            r = D.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, g_stream, args, NULL);
            if (r == CUDA_SUCCESS)
                r = D.cuEventRecord(evs[i], g_stream);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        int queued = 0;
        /* newest first: once one has finished, every earlier one on the stream has too */
        for (unsigned long long i = n; i-- > 0 && r == CUDA_SUCCESS;) {
            CUresult q = D.cuEventQuery(evs[i]);
            if (q != CUDA_ERROR_NOT_READY)
                break;
            queued++;
        }
        if (r == CUDA_SUCCESS)
            r = D.cuStreamSynchronize(g_stream);
        printf("burstq rc=%d queued=%d tail_ms=%.3f total_ms=%.3f\n", r, queued, ms_since(&t1), ms_since(&t0));
    } else if (sscanf(s, "readback:%llu", &a) == 1) {
        static CUdeviceptr dev;
        static char host[1 << 16];
        if (a > sizeof host)
            a = sizeof host;
        r = dev ? CUDA_SUCCESS : D.cuMemAlloc_v2(&dev, sizeof host);
        if (r == CUDA_SUCCESS)
            r = D.cuMemcpyDtoHAsync_v2(host, dev, (size_t)a, g_stream);
        if (r == CUDA_SUCCESS)
            r = D.cuStreamSynchronize(g_stream);
        printf("readback rc=%d n=%llu\n", r, a);
    } else if (sscanf(s, "spins:%llux%llu", &a, &b) == 2) {
        CUfunction fn;
        r = func("ds_spin", &fn);
        uint32_t us = (uint32_t)b;
        void *args[] = {&us};
        for (unsigned long long i = 0; i < a && r == CUDA_SUCCESS; i++)
            r = D.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, g_stream, args, NULL);
        printf("spins rc=%d n=%llu\n", r, a);
    } else if (sscanf(s, "mixburst:%llux%llux%llu", &a, &b, &c) == 3) {
        /* the short kernels come from a module of their own: another CUfunction than the long ones */
        static CUmodule other;
        static char image[] = "simgpu-module";
        CUfunction lng, shrt = NULL;
        r = func("ds_spin", &lng);
        if (r == CUDA_SUCCESS && !other)
            r = D.cuModuleLoadData(&other, image);
        if (r == CUDA_SUCCESS)
            r = D.cuModuleGetFunction(&shrt, other, "ds_spin");
        uint32_t lus = (uint32_t)b, sus = (uint32_t)c;
        void *largs[] = {&lus}, *sargs[] = {&sus};
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (unsigned long long i = 0; i < a && r == CUDA_SUCCESS; i++) {
            for (int k = 0; k < 8 && r == CUDA_SUCCESS; k++)
                r = D.cuLaunchKernel(shrt, 1, 1, 1, 1, 1, 1, 0, g_stream, sargs, NULL);
            for (int k = 0; k < 2 && r == CUDA_SUCCESS; k++)
                r = D.cuLaunchKernel(lng, 1, 1, 1, 1, 1, 1, 0, g_stream, largs, NULL);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (r == CUDA_SUCCESS)
            r = D.cuStreamSynchronize(g_stream);
        printf("mixburst rc=%d tail_ms=%.3f total_ms=%.3f distinct=%d\n", r, ms_since(&t1), ms_since(&t0),
               shrt != lng);
    } else if (sscanf(s, "launch:%llu", &a) == 1) {
        int lr = launch_fill((unsigned)a);
        if (lr >= 0)
            printf("launch rc=%d n=%llu ok=0\n", lr, a);
    } else if (sscanf(s, "appgreen:%llu", &a) == 1) {
        CUdevResource all, groups[64], rem;
        unsigned nb = 64;
        memset(&all, 0, sizeof all);
        memset(groups, 0, sizeof groups);
        memset(&rem, 0, sizeof rem);
        CUdevResourceDesc desc;
        CUgreenCtx g;
        r = D.cuDeviceGetDevResource(g_dev, &all, CU_DEV_RESOURCE_TYPE_SM);
        if (!r)
            r = D.cuDevSmResourceSplitByCount(groups, &nb, &all, &rem, 0, 8);
        if (!r && a >= nb)
            r = CUDA_ERROR_INVALID_VALUE;
        if (!r)
            r = D.cuDevResourceGenerateDesc(&desc, &groups[a], 1);
        if (!r)
            r = D.cuGreenCtxCreate(&g, desc, g_dev, CU_GREEN_CTX_DEFAULT_STREAM);
        if (!r)
            r = D.cuGreenCtxStreamCreate(&g_stream, g, CU_STREAM_NON_BLOCKING, 0);
        printf("%s rc=%d\n", s, r);
    } else if (!strcmp(s, "nvml")) {
        typedef struct {
            unsigned long long total, free, used;
        } mem_t;
        void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        int (*init)(void) = h ? (int (*)(void))dlsym(h, "nvmlInit_v2") : NULL;
        int (*get)(unsigned, void **) =
            h ? (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2") : NULL;
        int (*info)(void *, mem_t *) = h ? (int (*)(void *, mem_t *))dlsym(h, "nvmlDeviceGetMemoryInfo") : NULL;
        void *dev = NULL;
        mem_t m = {0, 0, 0};
        int rc = !init || !get || !info ? 12 : init();
        if (!rc)
            rc = get(0, &dev);
        if (!rc)
            rc = info(dev, &m);
        printf("nvml rc=%d total=%llu free=%llu used=%llu\n", rc, m.total, m.free, m.used);
    } else if (!strcmp(s, "conform")) {
        conform();
    } else if (sscanf(s, "churnmt:%llu", &a) == 1) {
        churn_mt((unsigned)a);
    } else if (sscanf(s, "churn:%llu", &a) == 1) {
        /* a streams created, launched on once and destroyed, one after the other (the logical stream table must
         * reuse what was destroyed: issue 28) */
        CUfunction fn;
        r = func("ds_spin", &fn);
        uint32_t us = 0;
        void *args[] = {&us};
        for (unsigned long long i = 0; i < a && r == CUDA_SUCCESS; i++) {
            CUstream st;
            r = D.cuStreamCreate(&st, CU_STREAM_DEFAULT);
            if (r == CUDA_SUCCESS)
                r = D.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, args, NULL);
            if (r == CUDA_SUCCESS)
                r = D.cuStreamSynchronize(st);
            if (r == CUDA_SUCCESS)
                r = D.cuStreamDestroy_v2(st);
        }
        printf("churn rc=%d n=%llu\n", r, a);
    } else if (sscanf(s, "synccost:%llu", &a) == 1) {
        /* a rounds of a small allocation freed and a context synchronisation, with a kernel on the current stream
         * first; ns is the median round in nanoseconds (what a free and a synchronisation cost the application) */
        CUfunction fn;
        r = func("ds_spin", &fn);
        uint32_t us = 0;
        void *args[] = {&us};
        static uint64_t d[100000];
        if (a > 100000)
            a = 100000;
        for (unsigned long long i = 0; i < a && r == CUDA_SUCCESS; i++) {
            CUdeviceptr p;
            struct timespec t0, t1;
            r = D.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, g_stream, args, NULL);
            if (r == CUDA_SUCCESS)
                r = D.cuMemAlloc_v2(&p, 256);
            clock_gettime(CLOCK_MONOTONIC, &t0);
            if (r == CUDA_SUCCESS)
                r = D.cuMemFree_v2(p);
            if (r == CUDA_SUCCESS)
                r = D.cuCtxSynchronize();
            clock_gettime(CLOCK_MONOTONIC, &t1);
            d[i] = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000u + (uint64_t)(t1.tv_nsec - t0.tv_nsec);
        }
        for (unsigned long long i = 1; i < a; i++) /* insertion sort: a is small */
            for (unsigned long long j = i; j > 0 && d[j - 1] > d[j]; j--) {
                uint64_t x = d[j];
                d[j] = d[j - 1];
                d[j - 1] = x;
            }
        printf("synccost rc=%d ns=%llu\n", r, a ? (unsigned long long)d[a / 2] : 0ull);
    } else if (!strcmp(s, "stream")) {
        r = D.cuStreamCreate(&g_stream, CU_STREAM_DEFAULT);
        printf("%s rc=%d\n", s, r);
    } else if (!strcmp(s, "libkernels")) {
        g_libkernels = 1;
        printf("%s rc=0\n", s);
    } else if (!strcmp(s, "sigbus-handler")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = app_sigbus;
        sigemptyset(&sa.sa_mask);
        int rc = sigaction(SIGBUS, &sa, NULL);
        printf("%s rc=%d\n", s, rc);
    } else if (!strcmp(s, "raise-sigbus")) {
        fflush(stdout);
        raise(SIGBUS);
        printf("%s rc=0\n", s);
    } else if (!strcmp(s, "pause")) {
        printf("paused\n");
        fflush(stdout);
        char buf[64];
        if (!fgets(buf, sizeof buf, stdin))
            return 2;
    } else if (sscanf(s, "smid:%llu", &a) == 1) {
        smid("smid", (unsigned)a);
    } else if (sscanf(s, "smidsmem:%llu:%llu", &a, &b) == 2) {
        smid_smem("smidsmem", (unsigned)a, (unsigned)b);
    } else if (sscanf(s, "coopsmid:%llu", &a) == 1) {
        smid("coopsmid", (unsigned)a);
    } else if (sscanf(s, "axpy:%llu", &a) == 1) {
        uint64_t h = 0;
        r = axpy_rounds(g_stream, a, false, &h);
        printf("axpy rc=%d k=%llu hash=%016llx\n", r, a, (unsigned long long)h);
    } else if (sscanf(s, "dcopy:%llu", &a) == 1) {
        uint64_t h = 0;
        r = axpy_rounds(g_stream, a, true, &h);
        printf("dcopy rc=%d k=%llu hash=%016llx\n", r, a, (unsigned long long)h);
    } else if (sscanf(s, "mt:%llux%llu", &a, &b) == 2) {
        mt((unsigned)a, (unsigned)b);
    } else if (sscanf(s, "capture:%llu", &a) == 1 || sscanf(s, "capturememset:%llu", &a) == 1 ||
               sscanf(s, "capturekeep:%llu", &a) == 1) {
        CUfunction fn;
        CUgraph graph = NULL;
        g_graph_blocks = (unsigned)a;
        r = func("ds_smid", &fn);
        if (r == CUDA_SUCCESS && !g_graph_out)
            r = D.cuMemAlloc_v2(&g_graph_out, (size_t)a * 4);
        if (r == CUDA_SUCCESS && !g_graph_aux)
            r = D.cuMemAlloc_v2(&g_graph_aux, AUX_WORDS * 4);
        if (r == CUDA_SUCCESS)
            r = D.cuStreamBeginCapture_v2(g_stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
        /* capturememset: the graph also holds a memset node (as frameworks' graphs do) */
        if (r == CUDA_SUCCESS && !strncmp(s, "capturememset:", 14))
            r = D.cuMemsetD32Async(g_graph_aux, AUX_VALUE, AUX_WORDS, g_stream);
        uint32_t us = 20;
        void *args[] = {&g_graph_out, &us};
        if (r == CUDA_SUCCESS)
            r = D.cuLaunchKernel(fn, (unsigned)a, 1, 1, 1, 1, 1, 0, g_stream, args, NULL);
        CUresult r2 = D.cuStreamEndCapture(g_stream, &graph);
        if (r == CUDA_SUCCESS)
            r = r2;
        if (r == CUDA_SUCCESS)
            r = D.cuGraphInstantiateWithFlags(&g_exec, graph, 0);
        if (graph && r == CUDA_SUCCESS && !strncmp(s, "capturekeep:", 12))
            g_graph = graph; /* kept for graphset */
        else if (graph && r == CUDA_SUCCESS)
            r = D.cuGraphDestroy(graph); /* as frameworks do: only the executable is kept */
        printf("%s rc=%d\n", s, r);
    } else if (!strcmp(s, "graphset")) {
        /* the application sets its executable's kernel node again (cuGraphExecKernelNodeSetParams_v2) */
        CUgraphNode node = NULL;
        size_t nn = 1;
        CUDA_KERNEL_NODE_PARAMS kp;
        memset(&kp, 0, sizeof kp);
        r = g_graph && g_exec ? D.cuGraphGetNodes(g_graph, &node, &nn) : CUDA_ERROR_INVALID_HANDLE;
        if (r == CUDA_SUCCESS)
            r = D.cuGraphKernelNodeGetParams_v2(node, &kp);
        if (r == CUDA_SUCCESS && kp.kern)
            kp.func = NULL; /* kern + the node's own ctx: with func set the driver would take func's context */
        if (r == CUDA_SUCCESS)
            r = D.cuGraphExecKernelNodeSetParams_v2(g_exec, node, &kp);
        printf("%s rc=%d\n", s, r);
    } else if (!strcmp(s, "graph")) {
        uint32_t *host = calloc(g_graph_blocks ? g_graph_blocks : 1, 4);
        uint32_t aux[AUX_WORDS] = {0};
        r = g_exec ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
        if (r == CUDA_SUCCESS && g_graph_aux) /* clear what a memset node must set again, in stream order */
            r = D.cuMemsetD32Async(g_graph_aux, 0, AUX_WORDS, g_stream);
        if (r == CUDA_SUCCESS)
            r = D.cuGraphLaunch(g_exec, g_stream);
        if (r == CUDA_SUCCESS)
            r = D.cuStreamSynchronize(g_stream);
        if (r == CUDA_SUCCESS)
            r = D.cuMemcpyDtoH_v2(host, g_graph_out, (size_t)g_graph_blocks * 4);
        if (r == CUDA_SUCCESS && g_graph_aux)
            r = D.cuMemcpyDtoH_v2(aux, g_graph_aux, sizeof aux);
        unsigned set = 0;
        for (unsigned i = 0; i < AUX_WORDS; i++)
            set += aux[i] == AUX_VALUE;
        printf("graph_memset rc=%d set=%u\n", r, set);
        print_sms("graph", r, host, g_graph_blocks);
        free(host);
    } else if (!strcmp(s, "hold")) {
        printf("holding\n");
        fflush(stdout);
        char buf[64];
        while (fgets(buf, sizeof buf, stdin)) {
        }
        printf("%s rc=0\n", s);
    } else if (!strncmp(s, "env:", 4)) {
        const char *v = getenv(s + 4);
        printf("%s rc=0 value=%s\n", s, v ? v : "");
    } else if (sscanf(s, "setuid:%llu", &a) == 1) { /* an in-process privilege drop (a server after its start-up) */
        int rc = setresgid((gid_t)a, (gid_t)a, (gid_t)a) || setresuid((uid_t)a, (uid_t)a, (uid_t)a);
        printf("%s rc=%d\n", s, rc);
    } else if (!strncmp(s, "unsetenv:", 9)) { /* inside main(), after the library's constructor: a tenant leaving MPS */
        printf("%s rc=%d\n", s, unsetenv(s + 9));
    } else if (!strncmp(s, "setenv:", 7)) {
        char name[256];
        const char *eq = strchr(s + 7, '=');
        size_t n = eq ? (size_t)(eq - (s + 7)) : 0;
        if (!eq || n >= sizeof name) {
            fprintf(stderr, "setenv: want setenv:NAME=VALUE\n");
            return 2;
        }
        memcpy(name, s + 7, n);
        name[n] = 0;
        printf("%s rc=%d\n", s, setenv(name, eq + 1, 1));
    } else if (!strncmp(s, "procaddr:", 9)) {
        char sym[128];
        int ver = 0;
        unsigned long long fl = 0;
        if (sscanf(s + 9, "%127[^:]:%d:%llu", sym, &ver, &fl) != 3) {
            fprintf(stderr, "bad step %s\n", s);
            return 2;
        }
        void *p = NULL;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
        r = D.getproc(sym, &p, ver, fl, &st);
        const char *name, *obj = obj_of(p, &name);
        printf("%s rc=%d status=%d sym=%s obj=%s\n", s, r, (int)st, name, obj);
    } else if (!strncmp(s, "dlsym:", 6)) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!h)
            h = dlopen("libcuda.so.1", RTLD_NOW);
        void *p = h ? dlsym(h, s + 6) : NULL;
        const char *name, *obj = obj_of(p, &name);
        printf("%s rc=%d sym=%s obj=%s\n", s, p ? 0 : 500, name, obj);
    } else if (sscanf(s, "forkrace:%llu", &a) == 1) {
        forkrace((unsigned)a);
    } else if (sscanf(s, "fork:%llu", &a) == 1) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            /* CUDA is not usable across fork: the child allocates through a fresh driver state only if the parent
             * had none; the point here is the child's own process entry and accounting */
            struct alloc x = {.kind = A_PTR};
            CUresult cr = D.cuInit(0);
            if (cr == CUDA_SUCCESS) {
                CUcontext ctx;
                cr = D.cuDevicePrimaryCtxRetain(&ctx, 0);
                if (cr == CUDA_SUCCESS)
                    cr = D.cuCtxSetCurrent(ctx);
            }
            if (cr == CUDA_SUCCESS)
                cr = D.cuMemAlloc_v2(&x.ptr, a);
            size_t f = 0, t = 0;
            D.cuMemGetInfo_v2(&f, &t);
            printf("child rc=%d free=%zu total=%zu\n", cr, f, t);
            fflush(stdout);
            exit(0); /* runs the exit handlers: the child releases its own entry */
        }
        int status = 0;
        waitpid(pid, &status, 0);
        printf("%s rc=%d exit=%d\n", s, 0, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    } else {
        fprintf(stderr, "unknown step %s\n", s);
        return 2;
    }
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (drv_load(&D) != 0)
        return 3;
    for (int i = 1; i < argc; i++)
        if (step(argv[i]) != 0)
            return 2;
    return 0;
}
