/*
 * ds.h — internals of libdetshare, the CUDA interception library every CUDA process of a DetShare tenant loads.
 *
 * The library exports the driver entry points it hooks (for code linked with -lcuda), interposes dlsym and
 * cuGetProcAddress{,_v2} (for cudart, Triton, cuda-python, NCCL), and finds the real driver with
 * dlopen("libcuda.so.1") at first use. Without a tenant (no quota file) every hook is a plain pass-through.
 *
 * Concurrency: process-wide state is either written once before it is published with a release store (ds_g,
 * the real-function table) or protected by a lock (allocation tracking, coroutine pools) or atomic (shared pages).
 * The launch fast path takes no lock and makes no syscall.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_H
#define DETSHARE_LIBDETSHARE_DS_H

#define CUDA_ABI_PROTOTYPES
#include "cgroupgpu/cuda/cuda_abi.h"
#include "sched/table/detshare_table.h"
#include "sched/table/detshare_table_client.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define DS_EXPORT __attribute__((visibility("default")))
#define DS_HIDDEN __attribute__((visibility("hidden")))
#define DS_LIKELY(x) __builtin_expect(!!(x), 1)
#define DS_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- logging: quiet by default (DETSHARE_LOG=error|warn|info|debug, default warn) ---- */
enum { DS_LOG_ERROR = 0, DS_LOG_WARN = 1, DS_LOG_INFO = 2, DS_LOG_DEBUG = 3 };
extern int ds_log_level;
void ds_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define DS_LOG(lvl, ...)                                                                                              \
    do {                                                                                                             \
        if (DS_UNLIKELY((lvl) <= ds_log_level))                                                                      \
            ds_log((lvl), __VA_ARGS__);                                                                              \
    } while (0)

/* ---- hooked entry points ----
 * HOOK(exported name, base name for cuGetProcAddress, first ABI version of that variant, per-thread variant)
 * The base/version/per-thread columns are only used when the driver's cuGetProcAddress answers with a pointer that
 * is not one of its exported functions (then the variant is chosen by name, as the driver would). */
#define DS_HOOKS(HOOK)                                                                                               \
    HOOK(cuInit, cuInit, 2000, 0)                                                                                    \
    HOOK(cuGetProcAddress, cuGetProcAddress, 11030, 0)                                                               \
    HOOK(cuGetProcAddress_v2, cuGetProcAddress, 12000, 0)                                                            \
    HOOK(cuMemGetInfo_v2, cuMemGetInfo, 3020, 0)                                                                     \
    HOOK(cuDeviceTotalMem_v2, cuDeviceTotalMem, 3020, 0)                                                             \
    HOOK(cuMemAlloc_v2, cuMemAlloc, 3020, 0)                                                                         \
    HOOK(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0)                                                               \
    HOOK(cuMemAllocManaged, cuMemAllocManaged, 6000, 0)                                                              \
    HOOK(cuMemFree_v2, cuMemFree, 3020, 0)                                                                           \
    HOOK(cuMemAllocAsync, cuMemAllocAsync, 11020, 0)                                                                 \
    HOOK(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, 1)                                                            \
    HOOK(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0)                                                 \
    HOOK(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, 1)                                            \
    HOOK(cuMemFreeAsync, cuMemFreeAsync, 11020, 0)                                                                   \
    HOOK(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, 1)                                                              \
    HOOK(cuMemCreate, cuMemCreate, 10020, 0)                                                                         \
    HOOK(cuMemRelease, cuMemRelease, 10020, 0)                                                                       \
    HOOK(cuArrayCreate_v2, cuArrayCreate, 3020, 0)                                                                   \
    HOOK(cuArray3DCreate_v2, cuArray3DCreate, 3020, 0)                                                               \
    HOOK(cuArrayDestroy, cuArrayDestroy, 2000, 0)                                                                    \
    HOOK(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0)                                                    \
    HOOK(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0)                                                  \
    HOOK(cuLaunchKernel, cuLaunchKernel, 4000, 0)                                                                    \
    HOOK(cuLaunchKernel_ptsz, cuLaunchKernel, 7000, 1)                                                               \
    HOOK(cuLaunchKernelEx, cuLaunchKernelEx, 11060, 0)                                                               \
    HOOK(cuLaunchKernelEx_ptsz, cuLaunchKernelEx, 11060, 1)                                                          \
    HOOK(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, 0)                                              \
    HOOK(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel, 9000, 1)                                         \
    HOOK(cuGraphLaunch, cuGraphLaunch, 10000, 0)                                                                     \
    HOOK(cuGraphLaunch_ptsz, cuGraphLaunch, 10000, 1)                                                               \
    HOOK(cuStreamBeginCapture_v2, cuStreamBeginCapture, 10010, 0)                                                    \
    HOOK(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture, 10010, 1)                                               \
    HOOK(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph, 12030, 0)                                         \
    HOOK(cuStreamBeginCaptureToGraph_ptsz, cuStreamBeginCaptureToGraph, 12030, 1)                                    \
    HOOK(cuStreamEndCapture, cuStreamEndCapture, 10000, 0)                                                           \
    HOOK(cuStreamEndCapture_ptsz, cuStreamEndCapture, 10000, 1)                                                      \
    HOOK(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0)                                         \
    HOOK(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, 0)                                       \
    HOOK(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams, 12000, 1)                                  \
    HOOK(cuGraphDestroy, cuGraphDestroy, 10000, 0)                                                                   \
    HOOK(cuGraphExecDestroy, cuGraphExecDestroy, 10000, 0)

/* Driver functions the library calls itself without hooking them. */
#define DS_NEEDED(X)                                                                                                 \
    X(cuDriverGetVersion)                                                                                            \
    X(cuCtxGetDevice)                                                                                                \
    X(cuMemGetAddressRange_v2)                                                                                       \
    X(cuDeviceGetDevResource)                                                                                        \
    X(cuDevSmResourceSplitByCount)                                                                                   \
    X(cuDevResourceGenerateDesc)                                                                                     \
    X(cuGreenCtxCreate)                                                                                              \
    X(cuGreenCtxStreamCreate)                                                                                        \
    X(cuStreamGetGreenCtx)                                                                                           \
    X(cuEventCreate)                                                                                                 \
    X(cuEventRecord)                                                                                                 \
    X(cuStreamWaitEvent)                                                                                             \
    X(cuEventQuery)                                                                                                  \
    X(cuGraphGetNodes)                                                                                               \
    X(cuGraphNodeGetType)                                                                                            \
    X(cuGraphKernelNodeGetParams_v2)                                                                                 \
    X(cuGraphMemsetNodeGetParams)                                                                                    \
    X(cuMemsetD2D8Async)                                                                                             \
    X(cuMemsetD2D32Async)

struct ds_real {
#define DS_REAL_FIELD_(name, base, ver, pt) PFN_##name name;
    DS_HOOKS(DS_REAL_FIELD_)
#undef DS_REAL_FIELD_
#define DS_NEEDED_FIELD_(name) PFN_##name name;
    DS_NEEDED(DS_NEEDED_FIELD_)
#undef DS_NEEDED_FIELD_
};

/* Real driver: resolved once (pthread_once) at the first hook call. ds_drv_ready is the published flag. */
extern struct ds_real ds_real;
extern atomic_int ds_drv_ready;
void ds_driver_init(void);
static inline void ds_driver(void) {
    if (DS_UNLIKELY(!atomic_load_explicit(&ds_drv_ready, memory_order_acquire)))
        ds_driver_init();
}

/* The real function for a hook. Normally the resolved table; while the driver itself is being loaded (re-entrant
 * call from its constructor on this thread) a direct lookup of the next definition, so that loading never
 * deadlocks on the once-guard. */
void *ds_early_sym(const char *name);
static inline bool ds_driver_ready_or_init(void) {
    if (DS_LIKELY(atomic_load_explicit(&ds_drv_ready, memory_order_acquire)))
        return true;
    extern __thread int ds_depth __attribute__((tls_model("initial-exec")));
    if (ds_depth)
        return false;
    ds_driver_init();
    return true;
}
#define DS_REAL_OR_FAIL(name)                                                                                        \
    PFN_##name real = ds_driver_ready_or_init() ? ds_real.name : (PFN_##name)ds_early_sym(#name);                   \
    if (DS_UNLIKELY(!real))                                                                                          \
        return CUDA_ERROR_NOT_INITIALIZED;

/* Re-entrancy depth: a hook entered from inside another hook on the same thread (a driver that calls its own
 * exported entry points, a callback) is a pure pass-through so that nothing is counted twice. */
extern __thread int ds_depth __attribute__((tls_model("initial-exec")));

/* ---- the tenant ---- */
struct ds_tenant {
    char id[DS_ID_LEN];
    int slot;
    uint32_t slot_gen;
    int gpu;
    uint64_t quota_memory;                /* informational (file) */
    const struct ds_table_header *table;  /* read-only mapping */
    const struct ds_container *ctr;       /* this tenant's entry in it */
    const struct ds_gpu *gpu_entry;       /* its GPU */
    struct ds_client_page *page;          /* read-write */
    struct ds_doorbell *doorbell;         /* read-write, may be NULL */
    char mps_pipe_dir[256];
    char table_path[256];
};
/* NULL when the process has no tenant (pure pass-through); set once in the constructor. */
extern struct ds_tenant *ds_t;

/* This process's ds_proc entry and its index, or NULL / -1 before the first driver use and in a forked child until
 * its own first use. */
extern _Atomic(struct ds_proc *) ds_self;
extern atomic_int ds_self_idx;
struct ds_proc *ds_attach(void);
void ds_detach(void);
extern atomic_int ds_exiting; /* set when the process released its entry at exit */

/* Memory accounting (ds_mem.c). */
uint64_t ds_mem_limit(void);
bool ds_charge(uint64_t size);
void ds_uncharge(uint64_t size);
void ds_track_reset_child(void);
void ds_track_lock_all(void);
void ds_track_unlock_all(void);

/* Launch path (ds_launch.c). Called with ds_t != NULL; returns the stream to launch on. */
CUstream ds_launch_stream(CUstream s, int per_thread);
void ds_launch_done(void);
bool ds_launch_retry(CUresult r);
void ds_launch_unconfinable(CUstream s, int per_thread);
void ds_coro_child(void);
extern atomic_int ds_capturing; /* stream captures in progress in this process */
const void *ds_coro_capture_binding(void);
const void *ds_coro_pending_binding(unsigned *idx);
CUstream ds_coro_private_stream(const void *gctx);

/* Graphs (ds_graph.c). */
void ds_graph_captured(CUgraph g);
void ds_graph_instantiated(CUgraphExec e, CUgraph g);
bool ds_graph_destroying(CUgraph g);
void ds_graph_exec_destroyed(CUgraphExec e);
CUgraphExec ds_graph_for(CUgraphExec e, const void *gctx, unsigned idx);

/* dlsym / cuGetProcAddress plumbing (ds_dlsym.c). */
typedef void *(*ds_dlsym_fn)(void *, const char *);
extern ds_dlsym_fn ds_real_dlsym;
void ds_dlsym_init(void);
void *ds_map_proc(const char *symbol, void *real, int version, cuuint64_t flags);

/* NVML (ds_nvml.c). */
void *ds_nvml_wrapper_for(const char *name);

/* Misc. */
uint64_t ds_now_ns(void);

#endif /* DETSHARE_LIBDETSHARE_DS_H */
