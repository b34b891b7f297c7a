/*
 * stream.c — streams, events, launches and the SM scheduler of the simulated GPU (test double).
 *
 * Timing model: every stream has a tail, the simulated time at which its last operation completes. An operation
 * may start at max(now, its stream's tail, legacy-stream rules, waited events). A kernel's blocks are placed, one
 * at a time, on the SM of its context that frees first (each block occupies a whole SM for `us` microseconds);
 * the shared state keeps each SM's busy-until time across processes. Without simulated MPS a kernel also waits
 * until no other process has work on any SM (time-slicing). Synchronisation calls sleep until the simulated
 * completion time, so real processes observe real latencies. Effects on memory are applied at enqueue time, in
 * program order.
 */
#include "simgpu.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HOST_COPY_BYTES_PER_US 25000ULL    /* ~25 GB/s host<->device */
#define DEVICE_COPY_BYTES_PER_US 1000000ULL /* ~1 TB/s device-side copies and fills */
#define DEVICE_COPY_BYTES_PER_US 1000000ULL /* ~1 TB/s device<->device */

static _Thread_local struct CUstream_st *t_ptds[SIM_MAX_DEVICES];

bool sim_stream_valid(CUstream s) { return s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD && s->magic == SIM_STREAM; }

static CUresult current_live_ctx(struct CUctx_st **out) {
    struct CUctx_st *c = sim_current_ctx();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (c->magic == SIM_DEAD)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (c->magic != SIM_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

CUresult sim_stream_resolve(CUstream h, bool per_thread_default, struct CUstream_st **out, struct CUctx_st **ctx) {
    SIM_CHECK_INIT();
    if (!h)
        h = per_thread_default ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    if (h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        struct CUctx_st *c;
        CUresult r = current_live_ctx(&c);
        if (r)
            return r;
        struct CUstream_st *s;
        if (h == CU_STREAM_LEGACY) {
            s = &g_sim.dev[c->device].legacy;
        } else {
            s = t_ptds[c->device];
            if (!s) {
                s = calloc(1, sizeof *s);
                if (!s)
                    return CUDA_ERROR_OUT_OF_MEMORY;
                s->magic = SIM_STREAM;
                s->per_thread = true;
                s->device = c->device;
                s->id = sim_next_id();
                pthread_mutex_lock(&g_sim.lock);
                s->next = g_sim.streams;
                g_sim.streams = s;
                pthread_mutex_unlock(&g_sim.lock);
                t_ptds[c->device] = s;
            }
        }
        *out = s;
        *ctx = c;
        return CUDA_SUCCESS;
    }
    if (h->magic != SIM_STREAM)
        return CUDA_ERROR_INVALID_HANDLE;
    if (h->ctx->magic == SIM_DEAD)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = h;
    *ctx = h->ctx;
    return CUDA_SUCCESS;
}

static inline uint64_t max64(uint64_t a, uint64_t b) { return a > b ? a : b; }

uint64_t sim_stream_ready(struct CUstream_st *s, struct CUctx_st *ctx) {
    (void)ctx;
    uint64_t t = s->tail_ns;
    if (s->legacy) {
        /* The legacy stream waits for all blocking streams of its device. */
        for (struct CUstream_st *x = g_sim.streams; x; x = x->next)
            if (x != s && x->magic == SIM_STREAM && x->device == s->device && !(x->flags & CU_STREAM_NON_BLOCKING))
                t = max64(t, x->tail_ns);
    } else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
        t = max64(t, g_sim.dev[s->device].legacy.tail_ns); /* and blocking streams wait for it */
    }
    return max64(t, sim_now_ns());
}

void sim_stream_complete(struct CUstream_st *s, struct CUctx_st *ctx, uint64_t end_ns) {
    (void)ctx;
    s->tail_ns = max64(s->tail_ns, end_ns);
}

/* ---- the SM scheduler ---- */

typedef struct {
    uint64_t t;
    uint16_t sm;
} heap_ent;

static inline bool heap_less(heap_ent a, heap_ent b) { return a.t < b.t || (a.t == b.t && a.sm < b.sm); }

static void heap_down(heap_ent *h, unsigned n, unsigned i) {
    for (;;) {
        unsigned l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && heap_less(h[l], h[m]))
            m = l;
        if (r < n && heap_less(h[r], h[m]))
            m = r;
        if (m == i)
            return;
        heap_ent t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

uint64_t sim_schedule_kernel(int device, const sim_mask *sms, unsigned limit, unsigned nblocks,
                             uint64_t us_per_block, uint64_t ready_ns, uint16_t *smids) {
    heap_ent h[SIM_MAX_SMS];
    unsigned n = 0;
    uint64_t dur = us_per_block ? us_per_block * 1000ULL : 1; /* 1 ns keeps zero-cost blocks spreading over SMs */
    sim_shared_lock();
    struct sim_dev_state *ds = &g_sim.st->dev[device];
    if (!g_sim.mps) {
        /* Time-slicing: the device runs one process's work at a time. */
        for (unsigned i = 0; i < g_sim.nsms; i++)
            if (ds->busy_pid[i] != g_sim.pid && ds->busy_until[i] > ready_ns)
                ready_ns = ds->busy_until[i];
    }
    /* MPS active-thread percentage (limit > 0): the client gets `limit` SMs, which it does not choose and which
     * other clients may be using; modelled as the lowest-numbered ones, as on the H100 this overlapped a
     * neighbour's green context (DESIGN.md table). */
    for (unsigned i = 0; i < g_sim.nsms && (!limit || n < limit); i++)
        if (mask_has(sms, i))
            h[n++] = (heap_ent){max64(ds->busy_until[i], ready_ns), (uint16_t)i};
    if (n == 0) {
        sim_shared_unlock();
        return ready_ns;
    }
    for (int i = (int)n / 2 - 1; i >= 0; i--)
        heap_down(h, n, (unsigned)i);
    uint64_t end = ready_ns;
    for (unsigned b = 0; b < nblocks; b++) {
        uint64_t start = h[0].t;
        unsigned sm = h[0].sm;
        uint64_t fin = start + dur;
        ds->busy_until[sm] = fin;
        ds->busy_pid[sm] = g_sim.pid;
        if (smids)
            smids[b] = (uint16_t)sm;
        if (fin > end)
            end = fin;
        h[0].t = fin;
        heap_down(h, n, 0);
    }
    sim_shared_unlock();
    return end;
}

/* ---- launches ---- */

CUresult sim_launch_prepare(sim_launch *l, CUfunction f, const unsigned grid[3], const unsigned block[3],
                            unsigned smem, void **kernelParams, void **extra) {
    SIM_CHECK_INIT();
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    const sim_kernel_def *def;
    if (f->magic == SIM_FUNC)
        def = f->def;
    else if (((struct CUkern_st *)(void *)f)->magic == SIM_KERN)
        def = ((struct CUkern_st *)(void *)f)->def; /* a context-less CUkernel cast to CUfunction */
    else
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t threads = 1;
    for (int i = 0; i < 3; i++) {
        if (grid[i] == 0 || block[i] == 0)
            return CUDA_ERROR_INVALID_VALUE;
        threads *= block[i];
    }
    if (threads > 1024 || grid[1] > 65535 || grid[2] > 65535 || block[2] > 64)
        return CUDA_ERROR_INVALID_VALUE;
    if (smem > 232448)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t nb = (uint64_t)grid[0] * grid[1] * grid[2];
    if (nb > (1ULL << 31))
        return CUDA_ERROR_INVALID_VALUE;
    memset(l, 0, sizeof *l);
    l->def = def;
    memcpy(l->grid, grid, sizeof l->grid);
    memcpy(l->block, block, sizeof l->block);
    l->smem = smem;
    if (kernelParams) {
        for (unsigned i = 0; i < def->nargs; i++) {
            if (!kernelParams[i])
                return CUDA_ERROR_INVALID_VALUE;
            memcpy(&l->argbuf[i * 8], kernelParams[i], def->argsize[i]);
        }
    } else if (extra) {
        const unsigned char *buf = NULL;
        size_t size = 0;
        bool have_size = false;
        for (unsigned i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                buf = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1]) {
                size = *(const size_t *)extra[i + 1];
                have_size = true;
            } else
                return CUDA_ERROR_INVALID_VALUE;
        }
        if (!buf || !have_size)
            return CUDA_ERROR_INVALID_VALUE;
        size_t off = 0;
        for (unsigned i = 0; i < def->nargs; i++) {
            unsigned a = def->argsize[i];
            off = (off + a - 1) / a * a; /* natural alignment, as nvcc packs parameters */
            if (off + a > size)
                return CUDA_ERROR_INVALID_VALUE;
            memcpy(&l->argbuf[i * 8], buf + off, a);
            off += a;
        }
    } else if (def->nargs > 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (unsigned i = 0; i < SIM_MAX_ARGS; i++)
        l->args[i] = &l->argbuf[i * 8];
    return CUDA_SUCCESS;
}

CUresult sim_launch_exec(const sim_launch *l, struct CUstream_st *s, struct CUctx_st *sctx, struct CUctx_st *kctx) {
    atomic_fetch_add_explicit(&g_sim.calls_launch, 1, memory_order_relaxed);
    unsigned nblocks = l->grid[0] * l->grid[1] * l->grid[2];
    uint32_t us;
    memcpy(&us, l->args[l->def->us_arg], sizeof us);
    uint16_t *smids = nblocks <= (1u << 22) ? malloc((size_t)nblocks * sizeof *smids) : NULL;
    unsigned limit = 0;
    if (g_sim.mps && g_sim.active_thread_pct < 100 && !kctx->green)
        limit = (g_sim.nsms * (unsigned)g_sim.active_thread_pct + 99) / 100;
    void *args[SIM_MAX_ARGS];
    memcpy(args, l->args, sizeof args);
    pthread_mutex_lock(&g_sim.lock);
    uint64_t ready = sim_stream_ready(s, sctx);
    uint64_t end = sim_schedule_kernel(kctx->device, &kctx->sms, limit, nblocks, us, ready, smids);
    CUresult r = l->def->run(args, nblocks, smids);
    sim_stream_complete(s, sctx, end);
    pthread_mutex_unlock(&g_sim.lock);
    free(smids);
    return r;
}

static CUresult launch_common(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned smem, CUstream hStream, void **kernelParams, void **extra,
                              bool ptd, bool cooperative) {
    SIM_CHECK_INIT();
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(hStream, ptd, &s, &ctx);
    if (r)
        return r;
    sim_launch l;
    unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    r = sim_launch_prepare(&l, f, grid, block, smem, kernelParams, extra);
    if (r)
        return r;
    if (cooperative && (uint64_t)gx * gy * gz > mask_count(&ctx->sms))
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE; /* one resident block per simulated SM */
    if (s->capture)
        return sim_capture_kernel(s, ctx, &l, f);
    return sim_launch_exec(&l, s, ctx, ctx);
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
    return launch_common(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                         kernelParams, extra, false, false);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
    return launch_common(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                         kernelParams, extra, true, false);
}

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **kernelParams, void **extra, bool ptd) {
    SIM_CHECK_INIT();
    if (!c || (c->numAttrs > 0 && !c->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    bool coop = false;
    for (unsigned i = 0; i < c->numAttrs; i++)
        if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && c->attrs[i].value.cooperative)
            coop = true;
    return launch_common(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                         c->sharedMemBytes, c->hStream, kernelParams, extra, ptd, coop);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    return launch_ex(config, f, kernelParams, extra, false);
}
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    return launch_ex(config, f, kernelParams, extra, true);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream, void **kernelParams) {
    return launch_common(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                         kernelParams, NULL, false, true);
}
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams) {
    return launch_common(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                         kernelParams, NULL, true, true);
}

CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *launchParamsList, unsigned int numDevices,
                                              unsigned int flags) {
    (void)launchParamsList, (void)numDevices, (void)flags;
    return CUDA_ERROR_NOT_SUPPORTED; /* deprecated; not modelled by the test double */
}
CUresult cuLaunch(CUfunction f) {
    (void)f;
    return CUDA_ERROR_NOT_SUPPORTED; /* needs the removed cuParamSet* API */
}
CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height) {
    (void)f, (void)grid_width, (void)grid_height;
    return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream) {
    (void)f, (void)grid_width, (void)grid_height, (void)hStream;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- host functions: run by one helper thread at their simulated time ---- */

struct hostfn {
    uint64_t t;
    CUhostFn fn;
    void *ud;
    struct CUstream_st *s;
    struct hostfn *next;
};
static pthread_mutex_t hf_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hf_cv, hf_done;
static struct hostfn *hf_head;
static bool hf_running;     /* one was taken off the list and is running (hf_lock): due at hf_running_t */
static uint64_t hf_running_t;
static pthread_once_t hf_once = PTHREAD_ONCE_INIT;
static bool hf_ok;

static void *hf_worker(void *arg) {
    (void)arg;
    pthread_mutex_lock(&hf_lock);
    for (;;) {
        if (!hf_head) {
            pthread_cond_wait(&hf_cv, &hf_lock);
            continue;
        }
        struct hostfn *e = hf_head;
        uint64_t now = sim_now_ns();
        if (now < e->t) {
            struct timespec ts = {.tv_sec = (time_t)(e->t / 1000000000ULL), .tv_nsec = (long)(e->t % 1000000000ULL)};
            pthread_cond_timedwait(&hf_cv, &hf_lock, &ts);
            continue;
        }
        hf_head = e->next;
        hf_running = true;
        hf_running_t = e->t;
        pthread_mutex_unlock(&hf_lock);
        e->fn(e->ud);
        pthread_mutex_lock(&hf_lock);
        hf_running = false;
        e->s->pending_hostfn--;
        pthread_cond_broadcast(&hf_done);
        free(e);
    }
    return NULL;
}

static void hf_init(void) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&hf_cv, &a);
    pthread_cond_init(&hf_done, &a);
    pthread_condattr_destroy(&a);
    pthread_t t;
    pthread_attr_t ta;
    pthread_attr_init(&ta);
    pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    hf_ok = pthread_create(&t, &ta, hf_worker, NULL) == 0;
    pthread_attr_destroy(&ta);
}

CUresult sim_enqueue_hostfn(struct CUstream_st *s, struct CUctx_st *ctx, CUhostFn fn, void *ud) {
    pthread_once(&hf_once, hf_init);
    if (!hf_ok)
        return CUDA_ERROR_OPERATING_SYSTEM;
    struct hostfn *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_sim.lock);
    e->t = sim_stream_ready(s, ctx);
    sim_stream_complete(s, ctx, e->t);
    pthread_mutex_unlock(&g_sim.lock);
    e->fn = fn;
    e->ud = ud;
    e->s = s;
    pthread_mutex_lock(&hf_lock);
    s->pending_hostfn++;
    struct hostfn **pp = &hf_head;
    while (*pp && (*pp)->t <= e->t)
        pp = &(*pp)->next;
    e->next = *pp;
    *pp = e;
    pthread_cond_broadcast(&hf_cv);
    pthread_mutex_unlock(&hf_lock);
    return CUDA_SUCCESS;
}

/* A synchronisation waits for the host functions of its stream (s; NULL: every stream) and for every host function
 * due by the time it waited for (by_ns): one on another stream that this one waited for through an event (a graph's
 * host node launched on a physical stream) has run when a real GPU says the work is complete. */
static void wait_hostfns(struct CUstream_st *s, uint64_t by_ns) {
    pthread_mutex_lock(&hf_lock);
    while (s ? s->pending_hostfn > 0 || (hf_head && hf_head->t <= by_ns) || (hf_running && hf_running_t <= by_ns)
             : hf_head || hf_running)
        pthread_cond_wait(&hf_done, &hf_lock);
    pthread_mutex_unlock(&hf_lock);
}

static CUresult host_func(CUstream hStream, CUhostFn fn, void *userData, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(hStream, ptd, &s, &ctx);
    if (r)
        return r;
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture)
        return sim_capture_host(s, fn, userData);
    return sim_enqueue_hostfn(s, ctx, fn, userData);
}
CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData) {
    return host_func(hStream, fn, userData, false);
}
CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData) {
    return host_func(hStream, fn, userData, true);
}

struct cb_thunk {
    CUstreamCallback cb;
    CUstream s;
    void *ud;
};
static void cb_run(void *p) {
    struct cb_thunk *t = p;
    t->cb(t->s, CUDA_SUCCESS, t->ud);
    free(t);
}
static CUresult add_callback(CUstream hStream, CUstreamCallback callback, void *userData, unsigned flags, bool ptd) {
    if (!callback || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(hStream, ptd, &s, &ctx);
    if (r)
        return r;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    struct cb_thunk *t = malloc(sizeof *t);
    if (!t)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *t = (struct cb_thunk){callback, hStream, userData};
    r = sim_enqueue_hostfn(s, ctx, cb_run, t);
    if (r)
        free(t);
    return r;
}
CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags) {
    return add_callback(hStream, callback, userData, flags, false);
}
CUresult cuStreamAddCallback_ptsz(CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags) {
    return add_callback(hStream, callback, userData, flags, true);
}

/* ---- copies ---- */

/* A device-side copy or memset on stream s (of context sctx) running in context on: one block on each of on's SMs
 * for the transfer time, so that it delays whatever else wants those SMs; its SMs are recorded for
 * DETSHARE_SIMGPU_CALLS. A synchronous call returns when it is done. */
CUresult sim_enqueue_device_op(struct CUstream_st *s, struct CUctx_st *sctx, struct CUctx_st *on, size_t bytes,
                               bool sync) {
    atomic_fetch_add_explicit(&g_sim.calls_device_op, 1, memory_order_relaxed);
    unsigned n = mask_count(&on->sms);
    uint16_t smids[SIM_MAX_SMS];
    pthread_mutex_lock(&g_sim.lock);
    uint64_t ready = sim_stream_ready(s, sctx);
    uint64_t end = sim_schedule_kernel(on->device, &on->sms, 0, n, bytes / DEVICE_COPY_BYTES_PER_US, ready, smids);
    for (unsigned i = 0; i < n; i++)
        mask_set(&g_sim.device_op_sms, smids[i]);
    sim_stream_complete(s, sctx, end);
    pthread_mutex_unlock(&g_sim.lock);
    if (sync)
        sim_sleep_until(end);
    return CUDA_SUCCESS;
}

CUresult sim_enqueue_copy(struct CUstream_st *s, struct CUctx_st *ctx, size_t bytes, bool sync) {
    pthread_mutex_lock(&g_sim.lock);
    uint64_t ready = sim_stream_ready(s, ctx);
    uint64_t end = ready + (uint64_t)bytes * 1000ULL / HOST_COPY_BYTES_PER_US;
    sim_stream_complete(s, ctx, end);
    pthread_mutex_unlock(&g_sim.lock);
    if (sync)
        sim_sleep_until(end);
    return CUDA_SUCCESS;
}

/* ---- streams ---- */

static CUresult stream_create(CUstream *ph, unsigned flags, int priority) {
    SIM_CHECK_INIT();
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = current_live_ctx(&c);
    if (r)
        return r;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = SIM_STREAM;
    s->flags = flags;
    s->priority = priority > 0 ? 0 : (priority < -5 ? -5 : priority); /* clamped like the driver */
    s->device = c->device;
    s->ctx = c;
    s->id = sim_next_id();
    pthread_mutex_lock(&g_sim.lock);
    s->next = g_sim.streams;
    g_sim.streams = s;
    pthread_mutex_unlock(&g_sim.lock);
    *ph = s;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) { return stream_create(phStream, Flags, 0); }
CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    return stream_create(phStream, flags, priority);
}

CUresult cuStreamDestroy_v2(CUstream hStream) {
    SIM_CHECK_INIT();
    if (!sim_stream_valid(hStream) || hStream->legacy)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_sim.lock);
    for (struct CUstream_st **pp = &g_sim.streams; *pp; pp = &(*pp)->next) {
        if (*pp == hStream) {
            *pp = hStream->next;
            break;
        }
    }
    hStream->magic = SIM_DEAD; /* pending work completes; the memory stays so stale handles are detected */
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}

static CUresult stream_query(CUstream h, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (s->capture) /* querying a capturing stream is forbidden: it invalidates the capture */
        return sim_capture_forbidden(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    pthread_mutex_lock(&g_sim.lock);
    uint64_t tail = s->tail_ns;
    pthread_mutex_unlock(&g_sim.lock);
    if (tail > sim_now_ns())
        return CUDA_ERROR_NOT_READY;
    pthread_mutex_lock(&hf_lock);
    unsigned pending = s->pending_hostfn;
    pthread_mutex_unlock(&hf_lock);
    return pending ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
CUresult cuStreamQuery(CUstream hStream) { return stream_query(hStream, false); }
CUresult cuStreamQuery_ptsz(CUstream hStream) { return stream_query(hStream, true); }

CUresult sim_stream_sync(struct CUstream_st *s) {
    pthread_mutex_lock(&g_sim.lock);
    uint64_t tail = s->tail_ns;
    pthread_mutex_unlock(&g_sim.lock);
    sim_sleep_until(tail);
    wait_hostfns(s, tail);
    return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream h, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (s->capture) /* synchronising a capturing stream is forbidden: it invalidates the capture */
        return sim_capture_forbidden(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    return sim_stream_sync(s);
}
CUresult cuStreamSynchronize(CUstream hStream) { return stream_sync(hStream, false); }
CUresult cuStreamSynchronize_ptsz(CUstream hStream) { return stream_sync(hStream, true); }

static CUresult ctx_sync(struct CUctx_st *c) {
    uint64_t t = 0;
    pthread_mutex_lock(&g_sim.lock);
    for (struct CUstream_st *x = g_sim.streams; x; x = x->next) {
        if (x->device != c->device)
            continue;
        if (!g_sim.ctx_sync_own) {
            t = max64(t, x->tail_ns);
            continue;
        }
        if (x->ctx && x->ctx != c)
            continue; /* another context's stream (legacy and per-thread streams belong to the current one) */
        t = max64(t, x->xwait_tail_ns && x->tail_ns == x->xwait_tail_ns ? x->xwait_before_ns : x->tail_ns);
    }
    pthread_mutex_unlock(&g_sim.lock);
    sim_sleep_until(t);
    wait_hostfns(NULL, 0);
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    SIM_CHECK_INIT();
    struct CUctx_st *c;
    CUresult r = current_live_ctx(&c);
    return r ? r : ctx_sync(c);
}

CUresult cuCtxSynchronize_v2(CUcontext ctx) {
    SIM_CHECK_INIT();
    if (!ctx)
        return cuCtxSynchronize();
    if (!sim_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    return ctx_sync(ctx);
}

static CUresult stream_wait_event(CUstream h, CUevent ev, unsigned flags, bool ptd) {
    atomic_fetch_add_explicit(&g_sim.calls_stream_wait_event, 1, memory_order_relaxed);
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (!ev || ev->magic != SIM_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_sim.lock);
    bool captured_ev = ev->capture && ev->capture->magic == SIM_GRAPH;
    if (s->capture && ((captured_ev && ev->capture != s->capture) ||
                       (!captured_ev && ev->recorded && !(flags & CU_EVENT_WAIT_EXTERNAL)))) {
        /* A capturing stream may wait only on an event recorded in its own capture (or an external wait): an event
         * of another capture would merge the two, one recorded outside would make the graph depend on work outside
         * it. Both are forbidden and invalidate the capture (the other one too, for a merge). */
        s->capture->cap_invalid = true;
        if (captured_ev)
            ev->capture->cap_invalid = true;
        pthread_mutex_unlock(&g_sim.lock);
        return captured_ev ? CUDA_ERROR_STREAM_CAPTURE_MERGE : CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
    if (captured_ev) {
        if (!s->capture) {
            s->capture = ev->capture; /* fork: the waiting stream joins the capture */
            s->capture_origin = false;
        }
    } else if (ev->recorded && !s->capture) {
        uint64_t before = s->tail_ns;
        s->tail_ns = max64(s->tail_ns, ev->time_ns);
        if (ev->ctx && ev->ctx != ctx) {
            s->xwait_before_ns = before;
            s->xwait_tail_ns = s->tail_ns;
        }
    }
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    return stream_wait_event(hStream, hEvent, Flags, false);
}
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    return stream_wait_event(hStream, hEvent, Flags, true);
}

static CUresult stream_prio(CUstream h, int *priority, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (!priority)
        return CUDA_ERROR_INVALID_VALUE;
    *priority = s->priority;
    return CUDA_SUCCESS;
}
CUresult cuStreamGetPriority(CUstream hStream, int *priority) { return stream_prio(hStream, priority, false); }
CUresult cuStreamGetPriority_ptsz(CUstream hStream, int *priority) { return stream_prio(hStream, priority, true); }

static CUresult stream_flags(CUstream h, unsigned *flags, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    /* Asking a capturing stream for its flags is forbidden in every capture mode: the H100 (driver 580) answers
     * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, even with the thread in relaxed mode; its
     * priority may be asked (integration/gpu/probes/capture_unsafe.c, issue 28). */
    if (s->capture)
        return sim_capture_forbidden(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    *flags = s->flags;
    return CUDA_SUCCESS;
}
CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags) { return stream_flags(hStream, flags, false); }
CUresult cuStreamGetFlags_ptsz(CUstream hStream, unsigned int *flags) { return stream_flags(hStream, flags, true); }

static CUresult stream_id(CUstream h, unsigned long long *id, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (!id)
        return CUDA_ERROR_INVALID_VALUE;
    *id = s->id;
    return CUDA_SUCCESS;
}
CUresult cuStreamGetId(CUstream hStream, unsigned long long *streamId) { return stream_id(hStream, streamId, false); }
CUresult cuStreamGetId_ptsz(CUstream hStream, unsigned long long *streamId) {
    return stream_id(hStream, streamId, true);
}

/* v1: the context of the stream; for a green stream, the context cuCtxFromGreenCtx returns (13.x behaviour). */
static CUresult stream_ctx(CUstream h, CUcontext *pctx, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = ctx;
    return CUDA_SUCCESS;
}
CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx) { return stream_ctx(hStream, pctx, false); }
CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx) { return stream_ctx(hStream, pctx, true); }

/* v2: a green stream gives its green context and the device's primary context. */
static CUresult stream_ctx_v2(CUstream h, CUcontext *pCtx, CUgreenCtx *pGreen, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (!pCtx || !pGreen)
        return CUDA_ERROR_INVALID_VALUE;
    if (ctx->green) {
        *pGreen = ctx->green;
        *pCtx = &g_sim.dev[ctx->device].primary;
    } else {
        *pGreen = NULL;
        *pCtx = ctx;
    }
    return CUDA_SUCCESS;
}
CUresult cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx) {
    return stream_ctx_v2(hStream, pCtx, pGreenCtx, false);
}
CUresult cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx) {
    return stream_ctx_v2(hStream, pCtx, pGreenCtx, true);
}

static CUresult stream_dev(CUstream h, CUdevice *dev, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    *dev = ctx->device;
    return CUDA_SUCCESS;
}
CUresult cuStreamGetDevice(CUstream hStream, CUdevice *device) { return stream_dev(hStream, device, false); }
CUresult cuStreamGetDevice_ptsz(CUstream hStream, CUdevice *device) { return stream_dev(hStream, device, true); }

CUresult cuStreamGetGreenCtx(CUstream hStream, CUgreenCtx *phCtx) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(hStream, false, &s, &ctx);
    if (r)
        return r;
    if (!phCtx)
        return CUDA_ERROR_INVALID_VALUE;
    *phCtx = ctx->green;
    return CUDA_SUCCESS;
}

CUresult cuStreamGetDevResource(CUstream hStream, CUdevResource *resource, CUdevResourceType type) {
    (void)hStream, (void)resource, (void)type;
    return CUDA_ERROR_NOT_SUPPORTED; /* CUDA 13.1; the simulated driver is 13.0 */
}

/* ---- events ---- */

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    SIM_CHECK_INIT();
    if (!phEvent || (Flags & ~7u))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = current_live_ctx(&c);
    if (r)
        return r;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = SIM_EVENT;
    e->flags = Flags;
    *phEvent = e;
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent hEvent) {
    SIM_CHECK_INIT();
    if (!hEvent || hEvent->magic != SIM_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    hEvent->magic = SIM_DEAD;
    return CUDA_SUCCESS;
}

static CUresult event_record(CUevent ev, CUstream h, unsigned flags, bool ptd) {
    atomic_fetch_add_explicit(&g_sim.calls_event_record, 1, memory_order_relaxed);
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (!ev || ev->magic != SIM_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_sim.lock);
    if (s->capture) {
        ev->capture = s->capture;
    } else {
        ev->capture = NULL;
        ev->time_ns = sim_stream_ready(s, ctx);
        ev->ctx = ctx;
        ev->recorded = true;
    }
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent hEvent, CUstream hStream) { return event_record(hEvent, hStream, 0, false); }
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) { return event_record(hEvent, hStream, 0, true); }
CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
    return event_record(hEvent, hStream, flags, false);
}
CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags) {
    return event_record(hEvent, hStream, flags, true);
}

CUresult cuEventQuery(CUevent hEvent) {
    SIM_CHECK_INIT();
    if (!hEvent || hEvent->magic != SIM_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_sim.lock);
    bool rec = hEvent->recorded;
    uint64_t t = hEvent->time_ns;
    pthread_mutex_unlock(&g_sim.lock);
    if (!rec)
        return CUDA_SUCCESS;
    return t <= sim_now_ns() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent) {
    SIM_CHECK_INIT();
    if (!hEvent || hEvent->magic != SIM_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_sim.lock);
    bool rec = hEvent->recorded;
    uint64_t t = hEvent->time_ns;
    pthread_mutex_unlock(&g_sim.lock);
    if (rec)
        sim_sleep_until(t);
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    SIM_CHECK_INIT();
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    if (!hStart || hStart->magic != SIM_EVENT || !hEnd || hEnd->magic != SIM_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_sim.lock);
    bool rec = hStart->recorded && hEnd->recorded;
    uint64_t t0 = hStart->time_ns, t1 = hEnd->time_ns;
    pthread_mutex_unlock(&g_sim.lock);
    if (!rec || ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = sim_now_ns();
    if (t0 > now || t1 > now)
        return CUDA_ERROR_NOT_READY;
    *pMilliseconds = (float)((double)((int64_t)(t1 - t0)) / 1e6);
    return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

static bool stream_in_ctx(const struct CUstream_st *x, const struct CUctx_st *c) {
    if (x->magic != SIM_STREAM || x->device != c->device)
        return false;
    return x->ctx == c || (x->ctx == NULL && !c->green) || (c->primary && x->ctx && x->ctx->primary);
}

CUresult cuCtxRecordEvent(CUcontext hCtx, CUevent hEvent) {
    SIM_CHECK_INIT();
    if (!sim_ctx_valid(hCtx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!hEvent || hEvent->magic != SIM_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_sim.lock);
    uint64_t t = sim_now_ns();
    for (struct CUstream_st *x = g_sim.streams; x; x = x->next)
        if (stream_in_ctx(x, hCtx))
            t = max64(t, x->tail_ns);
    hEvent->time_ns = t;
    hEvent->recorded = true;
    hEvent->capture = NULL;
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}

CUresult cuCtxWaitEvent(CUcontext hCtx, CUevent hEvent) {
    SIM_CHECK_INIT();
    if (!sim_ctx_valid(hCtx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!hEvent || hEvent->magic != SIM_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_sim.lock);
    for (struct CUstream_st *x = g_sim.streams; hEvent->recorded && x; x = x->next)
        if (stream_in_ctx(x, hCtx))
            x->tail_ns = max64(x->tail_ns, hEvent->time_ns);
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}
