/*
 * simgpu.h — internals of the DetShare simulated GPU (a TEST DOUBLE of the CUDA driver, not a GPU).
 *
 * The library exports the CUDA driver entry points declared in cgroupgpu/cuda/cuda_abi.h. Device memory is host
 * memory; kernels are a handful of built-in functions whose duration is given by their arguments; a shared-memory
 * state file holds, per simulated SM, the time until which it is busy, so that several processes contend for the
 * simulated device the way they do on a real one (README.md describes the model).
 *
 * Locking: g_sim.lock (process-local) protects every process-local object list; the state file's robust mutex
 * protects the shared state. Order: process lock, then shared lock.
 */
#ifndef DETSHARE_SIMGPU_H
#define DETSHARE_SIMGPU_H

#define CUDA_ABI_PROTOTYPES
#include "cgroupgpu/cuda/cuda_abi.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define SIM_MAX_DEVICES 8
#define SIM_MAX_SMS 512
#define SIM_MAX_PROCS 256
#define SIM_MASK_WORDS (SIM_MAX_SMS / 64)
#define SIM_DRIVER_VERSION 13000
#define SIM_SPLIT_MIN 8   /* Hopper: minSmPartitionSize */
#define SIM_SPLIT_ALIGN 8 /* Hopper: smCoscheduledAlignment */
#define SIM_MAX_PARTITIONS 16 /* groups + remainder, as measured on the H100 (15x8 + 12) */

typedef struct {
    uint64_t w[SIM_MASK_WORDS];
} sim_mask;

static inline void mask_set(sim_mask *m, unsigned i) { m->w[i / 64] |= 1ULL << (i % 64); }
static inline bool mask_has(const sim_mask *m, unsigned i) { return (m->w[i / 64] >> (i % 64)) & 1ULL; }
unsigned mask_count(const sim_mask *m);
void mask_range(sim_mask *m, unsigned first, unsigned n);

/* Object magics: every handle starts with one. Destroyed objects keep their memory with SIM_DEAD so that a stale
 * handle is reported as CUDA_ERROR_INVALID_HANDLE instead of being a use-after-free. */
enum {
    SIM_DEAD = 0xdead0000u,
    SIM_CTX = 0x51c70001u,
    SIM_GREEN = 0x51c70002u,
    SIM_STREAM = 0x51c70003u,
    SIM_EVENT = 0x51c70004u,
    SIM_MODULE = 0x51c70005u,
    SIM_FUNC = 0x51c70006u,
    SIM_LIB = 0x51c70007u,
    SIM_KERN = 0x51c70008u,
    SIM_GRAPH = 0x51c70009u,
    SIM_NODE = 0x51c7000au,
    SIM_EXEC = 0x51c7000bu,
    SIM_POOL = 0x51c7000cu,
    SIM_DESC = 0x51c7000du,
    SIM_ARRAY = 0x51c7000eu,
};

struct CUgreenCtx_st;

struct CUctx_st {
    uint32_t magic;
    int device;
    bool primary;
    unsigned flags;
    int refcount;
    uint64_t id;
    sim_mask sms;               /* SMs its kernels may use */
    struct CUgreenCtx_st *green; /* non-NULL for the context of a green context */
};

struct CUgreenCtx_st {
    uint32_t magic;
    int device;
    uint64_t id;
    sim_mask sms;
    struct CUctx_st ctx; /* what cuCtxFromGreenCtx returns */
};

struct CUdevResourceDesc_st {
    uint32_t magic;
    sim_mask sms;
    unsigned count;
};

struct CUgraph_st;

struct CUstream_st {
    uint32_t magic;
    unsigned flags;
    int priority;
    bool per_thread;  /* a thread's per-thread default stream */
    bool legacy;      /* the legacy NULL stream of a device */
    int device;
    uint64_t id;
    struct CUctx_st *ctx;    /* NULL for legacy/per-thread streams: they use the current context */
    uint64_t tail_ns;        /* simulated completion time of the last operation */
    uint64_t xwait_tail_ns;  /* tail_ns set by a wait on another context's event (DETSHARE_SIMGPU_CTX_SYNC model) */
    uint64_t xwait_before_ns; /* tail_ns before that wait */
    unsigned pending_hostfn; /* host functions queued and not yet run */
    struct CUgraph_st *capture;
    uint64_t capture_id;
    bool capture_origin;
    struct CUstream_st *next; /* process-wide list */
};

struct CUevent_st {
    uint32_t magic;
    unsigned flags;
    bool recorded;
    uint64_t time_ns;
    struct CUctx_st *ctx;       /* the context of the stream it was recorded on */
    struct CUgraph_st *capture; /* recorded while capturing into this graph */
};

/* Built-in kernels. */
#define SIM_MAX_ARGS 8
typedef struct sim_kernel_def sim_kernel_def;
struct CUmod_st {
    uint32_t magic;
    struct CUctx_st *ctx; /* NULL for a library's module: the current context at use */
    struct CUlib_st *lib;
    struct CUfunc_st *funcs; /* cache, so a name always gives the same handle */
};
struct CUfunc_st {
    uint32_t magic;
    const sim_kernel_def *def;
    struct CUmod_st *mod;
    int attrs[16];
    struct CUfunc_st *next;
};
struct CUlib_st {
    uint32_t magic;
    struct CUmod_st mod;
    struct CUkern_st *kerns;
};
struct CUkern_st {
    uint32_t magic;
    const sim_kernel_def *def;
    struct CUlib_st *lib;
    struct CUfunc_st func; /* cuKernelGetFunction */
    struct CUkern_st *next;
};

struct sim_kernel_def {
    const char *name;
    unsigned nargs;
    unsigned argsize[SIM_MAX_ARGS];
    unsigned us_arg; /* index of the microseconds-per-block argument */
    /* Applies the kernel's effect to host memory. smids[b] is the SM that ran block b. */
    CUresult (*run)(void *const *args, unsigned nblocks, const uint16_t *smids);
};
const sim_kernel_def *sim_kernel_find(const char *name);

/* A launch with its arguments copied (graphs keep these). */
typedef struct {
    const sim_kernel_def *def;
    unsigned grid[3], block[3], smem;
    unsigned char argbuf[SIM_MAX_ARGS * 8];
    void *args[SIM_MAX_ARGS];
} sim_launch;

enum { SIM_NODE_KERNEL = 0, SIM_NODE_MEMSET = 2, SIM_NODE_MEMCPY = 1, SIM_NODE_HOST = 3, SIM_NODE_EMPTY = 5,
       SIM_NODE_MEM_ALLOC = 10, /* runs as an empty node: the memory is reserved when the node is added */
       SIM_NODE_MEM_FREE = 11 /* runs as an empty node: the memory stays reserved (the graph memory pool keeps it) */ };
struct CUgraphNode_st {
    uint32_t magic;
    int type;
    struct CUctx_st *ctx;
    CUfunction func;
    CUkernel kern;
    sim_launch launch;
    CUDA_MEMSET_NODE_PARAMS memset;
    CUDA_MEMCPY3D memcpy;
    CUDA_HOST_NODE_PARAMS host;
    CUDA_MEM_ALLOC_NODE_PARAMS alloc;
    struct CUgraphNode_st *orig; /* in an executable: the graph node it was instantiated from */
    struct CUgraphNode_st *next;
};
struct CUgraph_st {
    uint32_t magic;
    struct CUgraphNode_st *head, *tail;
    size_t nnodes;
    bool cap_invalid; /* the capture sequence into this graph was invalidated (graph.c, "Invalidation") */
    CUstreamCaptureMode cap_mode; /* the mode the capture sequence into this graph began with */
    pthread_t cap_thread;         /* the thread that began it */
};
struct CUgraphExec_st {
    uint32_t magic;
    struct CUgraphNode_st *nodes; /* a private copy */
    size_t nnodes;
};

struct CUmemPoolHandle_st {
    uint32_t magic;
    int device;
    size_t max_size;
    uint64_t used, used_high, reserved_high, release_threshold;
};

struct CUarray_st {
    uint32_t magic;
    void *mem;
    size_t bytes;
};
struct CUmipmappedArray_st {
    uint32_t magic;
    void *mem;
    size_t bytes;
};

/* The shared state file. */
#define SIM_STATE_MAGIC 0x3155504d49534453ULL /* "SDSIMPU1" */
#define SIM_STATE_VERSION 1
struct sim_dev_state {
    _Atomic uint64_t mem_used;
    uint64_t busy_until[SIM_MAX_SMS];
    int32_t busy_pid[SIM_MAX_SMS];
};
struct sim_proc_slot {
    int32_t pid;
    int32_t live;
    uint64_t mem[SIM_MAX_DEVICES];
};
struct sim_state {
    uint64_t magic;
    uint32_t version;
    uint32_t ndev;
    uint32_t nsms;
    uint32_t pad;
    uint64_t mem_total;
    pthread_mutex_t lock; /* robust, process-shared */
    _Atomic uint64_t next_id;
    struct sim_proc_slot procs[SIM_MAX_PROCS];
    struct sim_dev_state dev[SIM_MAX_DEVICES];
};

struct sim_device {
    struct CUctx_st primary;
    bool primary_active;
    unsigned primary_flags;
    struct CUstream_st legacy;
    struct CUmemPoolHandle_st default_pool;
    struct CUmemPoolHandle_st *current_pool;
};

struct sim_global {
    pthread_mutex_t lock;
    atomic_bool initialized;
    bool mps;
    int active_thread_pct; /* CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, 100 if unset */
    /* MPS device-memory limit of this client, bytes (0 = none): the server-side one (<pipe dir>/pinned_mem_limit,
     * written by the simulated control daemon) which the client cannot raise, lowered by the client's own
     * CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=<N>M" or "0=<N>G"); a client value alone is the limit */
    uint64_t mps_mem_limit;
    int ndev;
    unsigned nsms;
    uint64_t mem_total;
    struct sim_state *st;
    int state_fd;
    char state_path[4096]; /* the state file; its compute-mode files sit beside it (sim_compute_mode) */
    int slot;
    int pid;
    struct sim_device dev[SIM_MAX_DEVICES];
    struct CUstream_st *streams;
    bool verbose;
    /* DETSHARE_SIMGPU_CTX_SYNC=own-context: cuCtxSynchronize waits only for the streams of that context, and not
     * for a wait on another context's event that ends a stream (what the H100 under MPS did to a primary-context
     * synchronisation after work on a green context's stream, BENCHMARKS.md). Default: every stream of the device. */
    bool ctx_sync_own;
    /* driver calls counted for tests (DETSHARE_SIMGPU_CALLS=1 prints them at exit) */
    atomic_ulong calls_event_record, calls_stream_wait_event, calls_launch, calls_device_op;
    sim_mask device_op_sms; /* every SM a device-side copy or memset ran on (under lock) */
};
extern struct sim_global g_sim;

/* state.c */
CUresult sim_state_open(void);
void sim_shared_lock(void);
void sim_shared_unlock(void);
void sim_reap_dead_procs(void); /* shared lock held */
uint64_t sim_next_id(void);

/* time */
uint64_t sim_now_ns(void);
void sim_sleep_until(uint64_t t_ns);
void sim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The device's compute mode (CU_COMPUTEMODE_*): <state file>.compute-mode-<dev> holds "exclusive_process" or
 * "default" (absent: default), written by the host as `nvidia-smi -c` would set it (internal/simgpu ComputeModes). */
int sim_compute_mode(int dev);
/* A process that is not an MPS client may not create a context on a device in EXCLUSIVE_PROCESS mode while the MPS
 * server holds it (the real driver answers CUDA_ERROR_DEVICE_UNAVAILABLE): true when this process is refused. */
bool sim_exclusive_refuses(int dev);

/* context.c */
#define SIM_CHECK_INIT()                                                                                               \
    do {                                                                                                               \
        if (!atomic_load_explicit(&g_sim.initialized, memory_order_acquire))                                           \
            return CUDA_ERROR_NOT_INITIALIZED;                                                                         \
    } while (0)
struct CUctx_st *sim_current_ctx(void);
CUresult sim_check_device(CUdevice dev);
bool sim_ctx_valid(CUcontext c);
void sim_ctx_ensure_primary(int dev);

/* stream.c */
/* Resolves a stream handle (NULL, LEGACY, PER_THREAD or a real stream) to the stream object and the context whose
 * SMs its kernels use. per_thread_default selects what NULL means (the _ptsz/_ptds variants). */
CUresult sim_stream_resolve(CUstream h, bool per_thread_default, struct CUstream_st **out, struct CUctx_st **ctx);
/* The time at which new work on s may start (its tail and the legacy-stream rules). Process lock held. */
uint64_t sim_stream_ready(struct CUstream_st *s, struct CUctx_st *ctx);
void sim_stream_complete(struct CUstream_st *s, struct CUctx_st *ctx, uint64_t end_ns);
CUresult sim_stream_sync(struct CUstream_st *s);
bool sim_stream_valid(CUstream s);
/* Schedules a kernel on the simulated SMs; returns its completion time and fills smids. Shared lock taken. */
uint64_t sim_schedule_kernel(int device, const sim_mask *sms, unsigned limit, unsigned nblocks,
                             uint64_t us_per_block, uint64_t ready_ns, uint16_t *smids);
CUresult sim_launch_prepare(sim_launch *l, CUfunction f, const unsigned grid[3], const unsigned block[3],
                            unsigned smem, void **kernelParams, void **extra);
/* Runs l on stream s (ordered with sctx's legacy-stream rules) on the SMs of kctx (the kernel's context). */
CUresult sim_launch_exec(const sim_launch *l, struct CUstream_st *s, struct CUctx_st *sctx, struct CUctx_st *kctx);
/* Enqueues a memory operation that takes `bytes` of transfer time on stream s (effects already applied). */
CUresult sim_enqueue_copy(struct CUstream_st *s, struct CUctx_st *ctx, size_t bytes, bool sync);
CUresult sim_enqueue_device_op(struct CUstream_st *s, struct CUctx_st *sctx, struct CUctx_st *on, size_t bytes,
                               bool sync);
bool sim_copy3d_on_device(const CUDA_MEMCPY3D *c);

/* memory.c */
CUresult sim_mem_check_range(CUdeviceptr p, size_t n);
/* Device memory of a graph memory-allocation node (the double reserves it when the node is added and keeps it for the
 * process's life, as the driver's graph memory pool keeps its high-water mark until cuDeviceGraphMemTrim). */
CUresult sim_graph_mem_alloc(CUdeviceptr *dptr, size_t bytes, int dev);
void *sim_devptr(CUdeviceptr p);
CUresult sim_do_memset(CUdeviceptr dst, size_t pitch, unsigned value, unsigned esize, size_t width, size_t height);
CUresult sim_do_memcpy3d(const CUDA_MEMCPY3D *c);
CUresult sim_do_memcpy2d(const CUDA_MEMCPY2D *c);

/* graph capture (graph.c) */
CUresult sim_capture_kernel(struct CUstream_st *s, struct CUctx_st *ctx, const sim_launch *l, CUfunction f);
CUresult sim_capture_memset(struct CUstream_st *s, struct CUctx_st *ctx, const CUDA_MEMSET_NODE_PARAMS *p);
CUresult sim_capture_memcpy(struct CUstream_st *s, struct CUctx_st *ctx, const CUDA_MEMCPY3D *p);
CUresult sim_capture_host(struct CUstream_st *s, CUhostFn fn, void *ud);
CUresult sim_capture_mem_alloc(struct CUstream_st *s, struct CUctx_st *ctx, CUdeviceptr *dptr, size_t bytes);
CUresult sim_capture_mem_free(struct CUstream_st *s, CUdeviceptr dptr);
CUresult sim_capture_forbidden(struct CUstream_st *s, CUresult why); /* invalidates s's capture, returns why */
/* A potentially unsafe call (graph.c, "Unsafe calls"): CUDA_SUCCESS when the calling thread may make it now, else the
 * captures it is unsafe for are invalidated and CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED is returned. */
CUresult sim_capture_unsafe_call(void);

/* host functions (stream.c) */
CUresult sim_enqueue_hostfn(struct CUstream_st *s, struct CUctx_st *ctx, CUhostFn fn, void *ud);

#endif
