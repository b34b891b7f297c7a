/*
 * conf.h — shared helpers of the CUDA semantics conformance suite (integration/conformance, README.md).
 *
 * Each case is a small program that reaches the driver the way libcudart does (dlopen("libcuda.so.1"),
 * cuGetProcAddress_v2, base name + ABI version, the per-thread flag for the _ptsz twins) or, with
 * CONF_DRIVER_PATH=dlsym, through dlsym of the exported names (as Triton does), so it runs unchanged
 * against the simulated GPU (a test double), a real driver, and either of them under LD_PRELOAD=libdetshare.so.
 *
 * Output protocol (the Go test and integration/gpu/conformance.sh compare it between runs):
 *   case=<name>            first line
 *   <key>=<value>          facts: data checksums and ordering observations; must be identical in every run
 *   info: <text>           details that may differ between runs or machines (device name, SM ids, times)
 *   done                   last line; its absence means the program died
 * A failed driver call that the case did not expect prints "fatal: <call> -> <error>" and exits 2.
 *
 * Kernels: the simulated GPU's built-in kernels (ds_spin, ds_fill_u32, ds_add_f32, ds_axpy, ds_smid, every module
 * has them) or, on a real GPU, the same names and parameter lists from the PTX below, chosen by the device name.
 * Every kernel first spins `us` microseconds per block (%globaltimer), then does its work with a grid-stride loop,
 * so results do not depend on the grid size. ds_axpy uses mul.rn + add.rn (no FMA contraction): the same bits as
 * the test double's C arithmetic.
 */
#ifndef DETSHARE_CONFORMANCE_H
#define DETSHARE_CONFORMANCE_H

#include "cgroupgpu/cuda/cuda_abi.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* X(field, base name, ABI version, per-thread) — versions from notes/cuda-driver-abi.md §1.5 (cudaTypedefs.h). */
#define CONF_FUNCS(X)                                                                                                \
    X(cuInit, cuInit, 2000, 0)                                                                                       \
    X(cuDriverGetVersion, cuDriverGetVersion, 2020, 0)                                                               \
    X(cuGetErrorName, cuGetErrorName, 6000, 0)                                                                       \
    X(cuDeviceGet, cuDeviceGet, 2000, 0)                                                                             \
    X(cuDeviceGetName, cuDeviceGetName, 2000, 0)                                                                     \
    X(cuDeviceGetAttribute, cuDeviceGetAttribute, 2000, 0)                                                           \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, 0)                                                   \
    X(cuCtxSetCurrent, cuCtxSetCurrent, 4000, 0)                                                                     \
    X(cuCtxSynchronize, cuCtxSynchronize, 2000, 0)                                                                   \
    X(cuModuleLoadDataEx, cuModuleLoadDataEx, 2010, 0)                                                               \
    X(cuModuleGetFunction, cuModuleGetFunction, 2000, 0)                                                             \
    X(cuMemAlloc_v2, cuMemAlloc, 3020, 0)                                                                            \
    X(cuMemFree_v2, cuMemFree, 3020, 0)                                                                              \
    X(cuMemAllocHost_v2, cuMemAllocHost, 3020, 0)                                                                    \
    X(cuMemFreeHost, cuMemFreeHost, 2000, 0)                                                                         \
    X(cuMemcpyHtoD_v2, cuMemcpyHtoD, 3020, 0)                                                                        \
    X(cuMemcpyDtoH_v2, cuMemcpyDtoH, 3020, 0)                                                                        \
    X(cuMemcpyDtoD_v2, cuMemcpyDtoD, 3020, 0)                                                                        \
    X(cuMemsetD8_v2, cuMemsetD8, 3020, 0)                                                                            \
    X(cuMemsetD32_v2, cuMemsetD32, 3020, 0)                                                                          \
    X(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync, 3020, 0)                                                              \
    X(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync, 3020, 0)                                                              \
    X(cuMemsetD32Async, cuMemsetD32Async, 3020, 0)                                                                   \
    X(cuMemsetD8Async, cuMemsetD8Async, 3020, 0)                                                                     \
    X(cuMemsetD2D32Async, cuMemsetD2D32Async, 3020, 0)                                                               \
    X(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync, 3020, 0)                                                              \
    X(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH, 7000, 1)                                                                   \
    X(cuStreamCreate, cuStreamCreate, 2000, 0)                                                                       \
    X(cuStreamCreateWithPriority, cuStreamCreateWithPriority, 5050, 0)                                               \
    X(cuStreamDestroy_v2, cuStreamDestroy, 4000, 0)                                                                  \
    X(cuStreamQuery, cuStreamQuery, 2000, 0)                                                                         \
    X(cuStreamQuery_ptsz, cuStreamQuery, 7000, 1)                                                                    \
    X(cuStreamSynchronize, cuStreamSynchronize, 2000, 0)                                                             \
    X(cuStreamSynchronize_ptsz, cuStreamSynchronize, 7000, 1)                                                        \
    X(cuStreamWaitEvent, cuStreamWaitEvent, 3020, 0)                                                                 \
    X(cuStreamWaitEvent_ptsz, cuStreamWaitEvent, 7000, 1)                                                            \
    X(cuEventCreate, cuEventCreate, 2000, 0)                                                                         \
    X(cuEventDestroy_v2, cuEventDestroy, 4000, 0)                                                                    \
    X(cuEventRecord, cuEventRecord, 2000, 0)                                                                         \
    X(cuEventRecord_ptsz, cuEventRecord, 7000, 1)                                                                    \
    X(cuEventQuery, cuEventQuery, 2000, 0)                                                                           \
    X(cuEventSynchronize, cuEventSynchronize, 2000, 0)                                                               \
    X(cuEventElapsedTime, cuEventElapsedTime, 2000, 0)                                                               \
    X(cuLaunchKernel, cuLaunchKernel, 4000, 0)                                                                       \
    X(cuLaunchKernel_ptsz, cuLaunchKernel, 7000, 1)                                                                  \
    X(cuLaunchKernelEx, cuLaunchKernelEx, 11060, 0)                                                                  \
    X(cuLaunchKernelEx_ptsz, cuLaunchKernelEx, 11060, 1)                                                             \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, 0)                                                 \
    X(cuLaunchHostFunc, cuLaunchHostFunc, 10000, 0)                                                                  \
    X(cuLaunchHostFunc_ptsz, cuLaunchHostFunc, 10000, 1)                                                             \
    X(cuStreamBeginCapture_v2, cuStreamBeginCapture, 10010, 0)                                                       \
    X(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph, 12030, 0)                                           \
    X(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture, 10010, 1)                                                 \
    X(cuStreamEndCapture_ptsz, cuStreamEndCapture, 10000, 1)                                                         \
    X(cuStreamIsCapturing_ptsz, cuStreamIsCapturing, 10000, 1)                                                       \
    X(cuMemsetD32Async_ptsz, cuMemsetD32Async, 7000, 1)                                                              \
    X(cuGraphLaunch_ptsz, cuGraphLaunch, 10000, 1)                                                                   \
    X(cuGraphCreate, cuGraphCreate, 10000, 0)                                                                        \
    X(cuStreamEndCapture, cuStreamEndCapture, 10000, 0)                                                              \
    X(cuStreamIsCapturing, cuStreamIsCapturing, 10000, 0)                                                            \
    X(cuGraphGetNodes, cuGraphGetNodes, 10000, 0)                                                                    \
    X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0)                                            \
    X(cuGraphLaunch, cuGraphLaunch, 10000, 0)                                                                        \
    X(cuGraphExecDestroy, cuGraphExecDestroy, 10000, 0)                                                              \
    X(cuGraphDestroy, cuGraphDestroy, 10000, 0)                                                                      \
    X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, 11020, 0)                                                \
    X(cuMemPoolCreate, cuMemPoolCreate, 11020, 0)                                                                    \
    X(cuMemPoolDestroy, cuMemPoolDestroy, 11020, 0)                                                                  \
    X(cuMemPoolGetAttribute, cuMemPoolGetAttribute, 11020, 0)                                                        \
    X(cuMemAllocAsync, cuMemAllocAsync, 11020, 0)                                                                    \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0)                                                    \
    X(cuMemFreeAsync, cuMemFreeAsync, 11020, 0)                                                                      \
    X(cuStreamAddCallback, cuStreamAddCallback, 5000, 0)                                                             \
    X(cuGraphUpload, cuGraphUpload, 11010, 0)                                                                        \
    X(cuStreamGetFlags, cuStreamGetFlags, 5050, 0)                                                                   \
    X(cuStreamGetPriority, cuStreamGetPriority, 5050, 0)                                                             \
    X(cuStreamGetCtx, cuStreamGetCtx, 9020, 0)                                                                       \
    X(cuStreamGetCtx_v2, cuStreamGetCtx, 12050, 0)                                                                   \
    X(cuStreamGetId, cuStreamGetId, 12000, 0)                                                                        \
    X(cuCtxGetCurrent, cuCtxGetCurrent, 4000, 0)

struct conf_drv {
#define CONF_FIELD_(f, base, ver, pt) PFN_##f f;
    CONF_FUNCS(CONF_FIELD_)
#undef CONF_FIELD_
};

/* One program, one thread of setup: these are written once in conf_init before any other thread starts. */
static struct conf_drv D;
static CUfunction K_spin, K_fill, K_add, K_axpy, K_smid;
static CUdevice conf_dev;
static CUcontext conf_ctx;
static int conf_sms;
static unsigned conf_spin_us = 150000; /* CONF_SPIN_MS; long enough that "still running" facts survive a busy CI */
static const char *conf_case = "?";

static inline const char *conf_err(CUresult r) {
    const char *s = NULL;
    if (D.cuGetErrorName && D.cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "CUDA_ERROR_?";
}

#define CK(call)                                                                                                     \
    do {                                                                                                             \
        CUresult ck_r_ = (call);                                                                                     \
        if (ck_r_ != CUDA_SUCCESS) {                                                                                 \
            printf("fatal: %s:%d %s -> %s (%d)\n", conf_case, __LINE__, #call, conf_err(ck_r_), ck_r_);             \
            fflush(stdout);                                                                                          \
            exit(2);                                                                                                 \
        }                                                                                                            \
    } while (0)

static inline void fact(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void fact(const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s=", key);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

static inline void info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void info(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("info: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

/* Stream and event states as facts: "success", "not_ready", or the error name. */
static inline const char *st(CUresult r) {
    if (r == CUDA_SUCCESS)
        return "success";
    if (r == CUDA_ERROR_NOT_READY)
        return "not_ready";
    return conf_err(r);
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void sleep_ms(unsigned ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

static inline uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
#define FNV_INIT 0xcbf29ce484222325ull

/* The PTX twins of the simulated GPU's built-in kernels (sm_75+: every GPU CUDA 13 supports; PTX ISA 7.0; JIT-compiled
 * by the driver). */
#define CONF_PTX_SPIN(tag)                                                                                           \
    "  ld.param.u32 %r1, [" #tag "_us];\n"                                                                           \
    "  cvt.u64.u32 %rd1, %r1;\n"                                                                                     \
    "  mul.lo.u64 %rd1, %rd1, 1000;\n"                                                                               \
    "  mov.u64 %rd2, %globaltimer;\n"                                                                                \
    "  add.u64 %rd2, %rd2, %rd1;\n"                                                                                  \
    "" #tag "_spin:\n"                                                                                               \
    "  mov.u64 %rd3, %globaltimer;\n"                                                                                \
    "  setp.lt.u64 %p1, %rd3, %rd2;\n"                                                                               \
    "  @%p1 bra " #tag "_spin;\n"
/* %rd4 = first index, %rd5 = stride */
#define CONF_PTX_INDEX                                                                                               \
    "  mov.u32 %r2, %ctaid.x;\n"                                                                                     \
    "  mov.u32 %r3, %ntid.x;\n"                                                                                      \
    "  mov.u32 %r4, %tid.x;\n"                                                                                       \
    "  mov.u32 %r5, %nctaid.x;\n"                                                                                    \
    "  cvt.u64.u32 %rd4, %r2;\n"                                                                                     \
    "  cvt.u64.u32 %rd6, %r3;\n"                                                                                     \
    "  cvt.u64.u32 %rd7, %r4;\n"                                                                                     \
    "  mad.lo.u64 %rd4, %rd4, %rd6, %rd7;\n"                                                                         \
    "  cvt.u64.u32 %rd5, %r5;\n"                                                                                     \
    "  mul.lo.u64 %rd5, %rd5, %rd6;\n"
#define CONF_PTX_REGS                                                                                                \
    "  .reg .pred %p<4>;\n"                                                                                          \
    "  .reg .b32 %r<12>;\n"                                                                                          \
    "  .reg .f32 %f<6>;\n"                                                                                           \
    "  .reg .b64 %rd<20>;\n"

static const char conf_ptx[] =
    ".version 7.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry ds_spin(.param .u32 ds_spin_us)\n"
    "{\n" CONF_PTX_REGS CONF_PTX_SPIN(ds_spin) "  ret;\n"
    "}\n"
    "\n"
    ".visible .entry ds_fill_u32(.param .u64 ds_fill_u32_dst, .param .u32 ds_fill_u32_v, .param .u64 ds_fill_u32_n,\n"
    "    .param .u32 ds_fill_u32_us)\n"
    "{\n" CONF_PTX_REGS CONF_PTX_SPIN(ds_fill_u32) CONF_PTX_INDEX
    "  ld.param.u64 %rd8, [ds_fill_u32_dst];\n"
    "  cvta.to.global.u64 %rd8, %rd8;\n"
    "  ld.param.u32 %r6, [ds_fill_u32_v];\n"
    "  ld.param.u64 %rd9, [ds_fill_u32_n];\n"
    "ds_fill_u32_loop:\n"
    "  setp.ge.u64 %p2, %rd4, %rd9;\n"
    "  @%p2 bra ds_fill_u32_done;\n"
    "  shl.b64 %rd10, %rd4, 2;\n"
    "  add.u64 %rd11, %rd8, %rd10;\n"
    "  st.global.u32 [%rd11], %r6;\n"
    "  add.u64 %rd4, %rd4, %rd5;\n"
    "  bra ds_fill_u32_loop;\n"
    "ds_fill_u32_done:\n"
    "  ret;\n"
    "}\n"
    "\n"
    ".visible .entry ds_add_f32(.param .u64 ds_add_f32_d, .param .u64 ds_add_f32_a, .param .u64 ds_add_f32_b,\n"
    "    .param .u64 ds_add_f32_n, .param .u32 ds_add_f32_us)\n"
    "{\n" CONF_PTX_REGS CONF_PTX_SPIN(ds_add_f32) CONF_PTX_INDEX
    "  ld.param.u64 %rd8, [ds_add_f32_d];\n"
    "  cvta.to.global.u64 %rd8, %rd8;\n"
    "  ld.param.u64 %rd12, [ds_add_f32_a];\n"
    "  cvta.to.global.u64 %rd12, %rd12;\n"
    "  ld.param.u64 %rd13, [ds_add_f32_b];\n"
    "  cvta.to.global.u64 %rd13, %rd13;\n"
    "  ld.param.u64 %rd9, [ds_add_f32_n];\n"
    "ds_add_f32_loop:\n"
    "  setp.ge.u64 %p2, %rd4, %rd9;\n"
    "  @%p2 bra ds_add_f32_done;\n"
    "  shl.b64 %rd10, %rd4, 2;\n"
    "  add.u64 %rd14, %rd12, %rd10;\n"
    "  ld.global.f32 %f1, [%rd14];\n"
    "  add.u64 %rd15, %rd13, %rd10;\n"
    "  ld.global.f32 %f2, [%rd15];\n"
    "  add.rn.f32 %f3, %f1, %f2;\n"
    "  add.u64 %rd11, %rd8, %rd10;\n"
    "  st.global.f32 [%rd11], %f3;\n"
    "  add.u64 %rd4, %rd4, %rd5;\n"
    "  bra ds_add_f32_loop;\n"
    "ds_add_f32_done:\n"
    "  ret;\n"
    "}\n"
    "\n"
    ".visible .entry ds_axpy(.param .u64 ds_axpy_y, .param .u64 ds_axpy_x, .param .f32 ds_axpy_alpha,\n"
    "    .param .u64 ds_axpy_n, .param .u32 ds_axpy_us)\n"
    "{\n" CONF_PTX_REGS CONF_PTX_SPIN(ds_axpy) CONF_PTX_INDEX
    "  ld.param.u64 %rd8, [ds_axpy_y];\n"
    "  cvta.to.global.u64 %rd8, %rd8;\n"
    "  ld.param.u64 %rd12, [ds_axpy_x];\n"
    "  cvta.to.global.u64 %rd12, %rd12;\n"
    "  ld.param.f32 %f4, [ds_axpy_alpha];\n"
    "  ld.param.u64 %rd9, [ds_axpy_n];\n"
    "ds_axpy_loop:\n"
    "  setp.ge.u64 %p2, %rd4, %rd9;\n"
    "  @%p2 bra ds_axpy_done;\n"
    "  shl.b64 %rd10, %rd4, 2;\n"
    "  add.u64 %rd14, %rd12, %rd10;\n"
    "  ld.global.f32 %f1, [%rd14];\n"
    "  add.u64 %rd11, %rd8, %rd10;\n"
    "  ld.global.f32 %f2, [%rd11];\n"
    "  mul.rn.f32 %f3, %f4, %f1;\n"
    "  add.rn.f32 %f3, %f3, %f2;\n"
    "  st.global.f32 [%rd11], %f3;\n"
    "  add.u64 %rd4, %rd4, %rd5;\n"
    "  bra ds_axpy_loop;\n"
    "ds_axpy_done:\n"
    "  ret;\n"
    "}\n"
    "\n"
    ".visible .entry ds_smid(.param .u64 ds_smid_out, .param .u32 ds_smid_us)\n"
    "{\n" CONF_PTX_REGS CONF_PTX_SPIN(ds_smid)
    "  mov.u32 %r4, %tid.x;\n"
    "  setp.ne.u32 %p2, %r4, 0;\n"
    "  @%p2 bra ds_smid_done;\n"
    "  ld.param.u64 %rd8, [ds_smid_out];\n"
    "  cvta.to.global.u64 %rd8, %rd8;\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r7, %smid;\n"
    "  mul.wide.u32 %rd10, %r2, 4;\n"
    "  add.u64 %rd11, %rd8, %rd10;\n"
    "  st.global.u32 [%rd11], %r7;\n"
    "ds_smid_done:\n"
    "  ret;\n"
    "}\n";

static inline void conf_load_driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("fatal: dlopen libcuda.so.1: %s\n", dlerror());
        exit(2);
    }
    PFN_cuGetProcAddress_v2 gp = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    if (!gp) {
        printf("fatal: dlsym cuGetProcAddress_v2: %s\n", dlerror());
        exit(2);
    }
    /* CONF_DRIVER_PATH=dlsym: every entry point by its exported name through dlsym on the libcuda handle, as Triton's
     * launcher and ctypes users do (libdetshare sees these through its dlsym hook, not through cuGetProcAddress) */
    const char *path = getenv("CONF_DRIVER_PATH");
    if (path && !strcmp(path, "dlsym")) {
#define CONF_DLSYM_(f, base, ver, pt)                                                                                \
    if (!(D.f = (PFN_##f)dlsym(h, #f))) {                                                                            \
        printf("fatal: dlsym(libcuda.so.1, %s): %s\n", #f, dlerror());                                               \
        exit(2);                                                                                                     \
    }
        CONF_FUNCS(CONF_DLSYM_)
#undef CONF_DLSYM_
        return;
    }
    if (path && *path && strcmp(path, "getproc")) {
        printf("fatal: CONF_DRIVER_PATH=%s: allowed getproc (default), dlsym\n", path);
        exit(2);
    }
    /* as cudart does: ask the driver for cuGetProcAddress itself and use that from then on */
    void *self = NULL;
    if (gp("cuGetProcAddress", &self, 12000, 0, NULL) == CUDA_SUCCESS && self)
        gp = (PFN_cuGetProcAddress_v2)self;
#define CONF_LOOKUP_(f, base, ver, pt)                                                                               \
    {                                                                                                                \
        void *p = NULL;                                                                                              \
        CUdriverProcAddressQueryResult qs = CU_GET_PROC_ADDRESS_SUCCESS;                                            \
        CUresult r = gp(#base, &p, ver,                                                                              \
                        pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT, &qs);      \
        if (r != CUDA_SUCCESS || !p) {                                                                               \
            printf("fatal: cuGetProcAddress_v2(%s, %d, %s) -> %d (status %d)\n", #base, ver,                        \
                   pt ? "PER_THREAD" : "DEFAULT", r, (int)qs);                                                       \
            exit(2);                                                                                                 \
        }                                                                                                            \
        D.f = (PFN_##f)p;                                                                                            \
    }
    CONF_FUNCS(CONF_LOOKUP_)
#undef CONF_LOOKUP_
}

static bool conf_simulated;

/* Loads the driver, makes the primary context current, loads the kernels and prints the header. */
static inline void conf_init(const char *name) {
    conf_case = name;
    const char *ms = getenv("CONF_SPIN_MS");
    if (ms && *ms) {
        char *end;
        unsigned long v = strtoul(ms, &end, 10);
        if (*end || v < 10 || v > 10000) {
            printf("fatal: CONF_SPIN_MS=%s: allowed 10..10000 (milliseconds)\n", ms);
            exit(2);
        }
        conf_spin_us = (unsigned)v * 1000u;
    }
    conf_load_driver();
    CK(D.cuInit(0));
    CK(D.cuDeviceGet(&conf_dev, 0));
    char dname[256] = {0};
    CK(D.cuDeviceGetName(dname, (int)sizeof dname - 1, conf_dev));
    CK(D.cuDeviceGetAttribute(&conf_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, conf_dev));
    CK(D.cuDevicePrimaryCtxRetain(&conf_ctx, conf_dev));
    CK(D.cuCtxSetCurrent(conf_ctx));
    int ver = 0;
    CK(D.cuDriverGetVersion(&ver));
    conf_simulated = strncmp(dname, "DetShare simulated GPU", 22) == 0;
    /* the test double has every built-in kernel in every module, whatever the image; a real GPU JITs the PTX */
    const char *image = conf_simulated ? "detshare-simgpu-builtin-kernels" : conf_ptx;
    static char errlog[8192];
    CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[2] = {errlog, (void *)(uintptr_t)sizeof errlog};
    CUmodule mod;
    CUresult r = D.cuModuleLoadDataEx(&mod, image, 2, opts, vals);
    if (r != CUDA_SUCCESS) {
        printf("fatal: cuModuleLoadDataEx -> %s (%d): %s\n", conf_err(r), r, errlog);
        exit(2);
    }
    CK(D.cuModuleGetFunction(&K_spin, mod, "ds_spin"));
    CK(D.cuModuleGetFunction(&K_fill, mod, "ds_fill_u32"));
    CK(D.cuModuleGetFunction(&K_add, mod, "ds_add_f32"));
    CK(D.cuModuleGetFunction(&K_axpy, mod, "ds_axpy"));
    CK(D.cuModuleGetFunction(&K_smid, mod, "ds_smid"));
    printf("case=%s\n", name);
    const char *path = getenv("CONF_DRIVER_PATH");
    info("device=\"%s\" sms=%d driver=%d kernels=%s spin_ms=%u driver_path=%s", dname, conf_sms, ver,
         conf_simulated ? "simgpu-builtin" : "ptx", conf_spin_us / 1000, path && *path ? path : "getproc");
}

static inline void conf_done(void) {
    CK(D.cuCtxSynchronize());
    printf("done\n");
    fflush(stdout);
}

/* ---- kernels (every launch checked) ---- */
enum { CONF_BLOCK = 128, CONF_GRID = 4 };

static inline CUresult launch(bool ptsz, CUfunction f, unsigned grid, unsigned block, CUstream s, void **args) {
    PFN_cuLaunchKernel l = ptsz ? D.cuLaunchKernel_ptsz : D.cuLaunchKernel;
    return l(f, grid, 1, 1, block, 1, 1, 0, s, args, NULL);
}

/* One block spinning `us` microseconds: occupies one SM, so other work can run beside it. */
static inline void k_spin_on(bool ptsz, CUstream s, unsigned us) {
    void *a[] = {&us};
    CK(launch(ptsz, K_spin, 1, 32, s, a));
}
static inline void k_spin(CUstream s, unsigned us) { k_spin_on(false, s, us); }

static inline void k_fill_on(bool ptsz, CUstream s, CUdeviceptr d, uint32_t v, uint64_t n) {
    unsigned us = 0;
    void *a[] = {&d, &v, &n, &us};
    CK(launch(ptsz, K_fill, CONF_GRID, CONF_BLOCK, s, a));
}
static inline void k_fill(CUstream s, CUdeviceptr d, uint32_t v, uint64_t n) { k_fill_on(false, s, d, v, n); }

static inline void k_add(CUstream s, CUdeviceptr d, CUdeviceptr a, CUdeviceptr b, uint64_t n) {
    unsigned us = 0;
    void *args[] = {&d, &a, &b, &n, &us};
    CK(launch(false, K_add, CONF_GRID, CONF_BLOCK, s, args));
}

static inline void k_axpy(CUstream s, CUdeviceptr y, CUdeviceptr x, float alpha, uint64_t n) {
    unsigned us = 0;
    void *args[] = {&y, &x, &alpha, &n, &us};
    CK(launch(false, K_axpy, CONF_GRID, CONF_BLOCK, s, args));
}

/* ---- host views of device buffers (synchronous copies: call at a synchronisation point) ---- */
static inline uint64_t sum_u32(CUdeviceptr d, size_t n) {
    uint32_t *h = malloc(n * 4);
    if (!h)
        exit(3);
    CK(D.cuMemcpyDtoH_v2(h, d, n * 4));
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += h[i];
    free(h);
    return s;
}

/* All n floats equal to v (bitwise)? */
static inline bool all_f32(CUdeviceptr d, size_t n, float v) {
    float *h = malloc(n * 4);
    if (!h)
        exit(3);
    CK(D.cuMemcpyDtoH_v2(h, d, n * 4));
    bool ok = true;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&h[i], &v, 4) != 0)
            ok = false;
    free(h);
    return ok;
}

static inline uint64_t hash_dev(CUdeviceptr d, size_t bytes, uint64_t h) {
    unsigned char *b = malloc(bytes);
    if (!b)
        exit(3);
    CK(D.cuMemcpyDtoH_v2(b, d, bytes));
    h = fnv1a(b, bytes, h);
    free(b);
    return h;
}

static inline CUdeviceptr dalloc(size_t bytes) {
    CUdeviceptr p;
    CK(D.cuMemAlloc_v2(&p, bytes));
    CK(D.cuMemsetD8_v2(p, 0, bytes));
    return p;
}

static inline CUstream mkstream(unsigned flags) {
    CUstream s;
    CK(D.cuStreamCreate(&s, flags));
    return s;
}

static inline CUevent mkevent(unsigned flags) {
    CUevent e;
    CK(D.cuEventCreate(&e, flags));
    return e;
}

static inline const char *yn(bool b) { return b ? "yes" : "no"; }

/* The bits of a float, for 32-bit memsets of float buffers. */
static inline uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

#endif
