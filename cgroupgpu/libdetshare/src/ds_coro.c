/*
 * ds_coro.c — GPU coroutines: every stream the application launches on is a logical stream; its kernels run on a
 * physical stream of a green context built over the SM groups the scheduler granted to the tenant, and move to a
 * new one at the next kernel boundary after the grant changes. Kernels, configurations and arguments are never
 * changed.
 *
 * Lazy edges. A logical stream pairs the application's stream A with a physical stream P. Kernels go to P; every
 * other operation stays on A (so the application keeps CUDA's semantics for copies, events, host functions,
 * legacy/per-thread default streams and capture). The two are tied by event edges only where order can be
 * observed:
 *   - edge in  (record e_in on A, P waits): before a kernel, when A got work P has not waited for (need_in), when
 *     the legacy stream and a blocking stream must see each other's work (the gens below), or after an operation
 *     this library does not model stream by stream (g_order_gen);
 *   - join     (record e_out on P, A waits): before anything observes A — an operation on it, an event record,
 *     synchronize/query, capture end/info, destroy — and before context-wide synchronisation and frees.
 * A run of kernels on one stream therefore costs what it costs natively; a captured graph holds no per-kernel
 * edges (measured on the H100: per-kernel edges add ~2 µs per graph node, integration/gpu/probes/greenperf.cu).
 * Rebinding to a new grant is a join followed by an edge in: the new P waits for A, which waited for the old P.
 * DETSHARE_STRICT_STREAMS=1 restores an edge pair around every kernel (the library's earlier behaviour), which
 * keeps every stream rule even for a driver entry point the library does not hook.
 *
 * Legacy stream rules (CUDA: the legacy stream waits for blocking streams and they for it): an operation or kernel
 * on the legacy stream first joins every blocking stream with pending kernels, one on a blocking stream (per-thread
 * default streams are blocking) joins the legacy stream; g_legacy_gen / g_blocking_gen make the other side's next
 * kernel take an edge in. Non-blocking streams pay none of this.
 *
 * Fast path (a kernel on a stream already bound to the current grant, nothing new on A): one acquire load of
 * grant_epoch, a lock-free hash probe for the logical stream, a few relaxed loads, the launch, one store. No lock,
 * no syscall. Edges, rebinding, stream creation and green contexts take the logical stream's lock or g_lock.
 * Green contexts for new grants are made by a helper thread while launches use the largest cached context inside
 * the grant (cuGreenCtxCreate waits for the process's in-flight work; measured on the H100, it does not hold up
 * other threads' launches); only a grant with nothing cached inside it makes its context on the launch path.
 *
 * Temporal mode (no MPS): a launch waits for the tenant's GPU token on the token futex, bounded; when the
 * scheduler is gone or the bound passes it logs once and runs unthrottled (fail-static, never hangs).
 */
#include "ds.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MAX_GCTX 64u
#define MAX_GROUPS DS_MAX_SM_GROUPS
#define N_LSLOTS 4096u

struct gctx {
    uint64_t mask;
    CUgreenCtx g;
    CUcontext cu; /* cuCtxFromGreenCtx: what graph kernel nodes name as their context */
    unsigned idx;
    CUstream priv; /* the library's own stream in it (graph copies) */
};

enum { LS_NONBLOCKING = 0, LS_BLOCKING = 1, LS_LEGACY = 2 };

struct lstream {
    CUstream app;                 /* the application's handle (CU_STREAM_LEGACY / _PER_THREAD for the defaults) */
    CUevent e_in, e_out;
    pthread_mutex_t lock;         /* edges, rebinding, re-learning a reused handle */
    _Atomic(struct gctx *) bound; /* green context phys belongs to; NULL: kernels run on app */
    _Atomic(CUstream) phys;
    CUstream phys_by_ctx[MAX_GCTX];
    int kind;                     /* LS_*: which legacy-stream rules apply */
    int prio;                     /* the application stream's priority, given to its physical streams */
    atomic_int need_in;           /* app got work the physical stream has not waited for */
    atomic_int pending;           /* the physical stream has kernels app has not waited for */
    atomic_int unconfinable;
    atomic_int stale;             /* the application destroyed the stream: learn the handle again at next use */
    atomic_uint seen_order, seen_cross;
    struct ds_gate gate;          /* dispatch gate (ds_gate.c) */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint g_epoch_seen = UINT32_MAX;
static _Atomic(struct gctx *) g_cur;     /* NULL: launch on the application stream */
static atomic_uint g_mode;               /* grant mode of the current grant */
static atomic_int g_empty;               /* spatial grant without any group: launches wait for SMs */
static atomic_int g_ungranted;           /* no grant published yet while a scheduler is alive */
static atomic_int g_orphan;              /* the slot is no longer this process's tenant's: work is held */
static bool scheduler_alive(void);
static struct gctx g_ctxs[MAX_GCTX];
static atomic_uint g_nctx;
static CUdevResource g_groups[MAX_GROUPS];
/* The split is learnt once (g_lock held): g_groups, g_dev and g_primary are written before g_ngroups is published
 * with a release store and never change afterwards, so a reader that loads g_ngroups != 0 with acquire (split_groups)
 * may read them without a lock (the launch path, the green-context thread). */
static atomic_uint g_ngroups;            /* 0 until the split is learnt */
static int g_split_failed;
static int g_dev;
static CUcontext g_primary;              /* the context current when the split was learnt */
static struct gctx *g_last_nonempty;

/* lock-free lookup: keys are written once (under g_lock) and never removed */
static _Atomic(uintptr_t) g_keys[N_LSLOTS];
static _Atomic(struct lstream *) g_vals[N_LSLOTS];
/* every logical stream (per-thread default streams included), for joins over all of them; append-only */
static _Atomic(struct lstream *) g_all[N_LSLOTS];
static atomic_uint g_nall;
static _Atomic(struct lstream *) g_blocking[N_LSLOTS];
static atomic_uint g_nblocking;
static _Atomic(struct lstream *) g_legacy;
static atomic_uint g_order_gen, g_legacy_gen, g_blocking_gen;
static atomic_uint g_nbound; /* logical streams bound to a green context (launches under a full grant unbind them) */
static atomic_int g_strict; /* forced on at run time */
static __thread struct lstream *t_ptds; /* this thread's per-thread default stream */
static __thread struct lstream *t_pending;
static __thread CUstream t_pending_phys;
static __thread int t_gated; /* this launch passed the dispatch gate: mark its completion */

/* DETSHARE_STRICT_STREAMS=1, or forced on at run time (ds_coro_force_strict) */
static bool strict(void) {
    return ds_process.settings.strict_streams || atomic_load_explicit(&g_strict, memory_order_relaxed);
}

void ds_coro_force_strict(const char *why) {
    if (!ds_process.settings.strict_streams && atomic_exchange(&g_strict, 1) != 1)
        DS_LOG(DS_LOG_WARN, "%s: every kernel now gets its own event edges (DETSHARE_STRICT_STREAMS behaviour)", why);
}

/* Calls the library makes on its own slow paths (green contexts, streams, events) must not count as "unsafe" calls
 * in a global-mode capture the application runs on another thread. */
static CUstreamCaptureMode relaxed_begin(void) {
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (!ds_real.cuThreadExchangeStreamCaptureMode || ds_real.cuThreadExchangeStreamCaptureMode(&m) != CUDA_SUCCESS)
        m = (CUstreamCaptureMode)-1;
    return m;
}
static void relaxed_end(CUstreamCaptureMode m) {
    if ((int)m >= 0)
        ds_real.cuThreadExchangeStreamCaptureMode(&m);
}

/* ---------------------------------------------------------------------------------------------------------------
 * The split and green contexts (slow path, g_lock held)
 * ------------------------------------------------------------------------------------------------------------- */
static void publish_split(unsigned min, unsigned align, unsigned nb, const CUdevResource *rem);

/* The number of groups of the split (0 until learnt); g_groups, g_dev and g_primary are readable once non-zero. */
static inline unsigned split_groups(void) { return atomic_load_explicit(&g_ngroups, memory_order_acquire); }

/* The primary context, or NULL before the split is learnt. */
static inline CUcontext primary_ctx(void) { return split_groups() ? g_primary : NULL; }

static bool learn_split_locked(void) {
    if (split_groups())
        return true;
    if (g_split_failed)
        return false;
    g_split_failed = 1;
    if (!ds_real.cuDeviceGetDevResource || !ds_real.cuDevSmResourceSplitByCount || !ds_real.cuDevResourceGenerateDesc ||
        !ds_real.cuGreenCtxCreate || !ds_real.cuGreenCtxStreamCreate || !ds_real.cuEventCreate ||
        !ds_real.cuEventRecord || !ds_real.cuStreamWaitEvent || !ds_real.cuCtxFromGreenCtx) {
        DS_LOG(DS_LOG_WARN, "driver without green contexts (needs CUDA 12.5+): kernels run unconfined");
        return false;
    }
    CUdevice dev = 0;
    if (!ds_real.cuCtxGetDevice || ds_real.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        dev = 0;
    CUdevResource all;
    memset(&all, 0, sizeof all);
    CUresult r = ds_real.cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
    if (r != CUDA_SUCCESS) {
        DS_LOG(DS_LOG_WARN, "cuDeviceGetDevResource: %d; kernels run unconfined", r);
        return false;
    }
    const struct ds_gpu *ge = ds_process.tenant->gpu_entry;
    unsigned min = 0;
    uint32_t split_state = __atomic_load_n(&ge->split_state, __ATOMIC_ACQUIRE);
    if (split_state == DS_SPLIT_PUBLISHED)
        min = ge->split_min_size;
    int ver = 0;
    if (!min && ds_real.cuDriverGetVersion && ds_real.cuDriverGetVersion(&ver) == CUDA_SUCCESS &&
        ver >= CUDA_ABI_VERSION_SM_PARTITION_METADATA)
        min = all.sm.minSmPartitionSize;
    if (!min)
        min = 8; /* compute capability 9.x granularity; older drivers do not report it */
    unsigned nb = MAX_GROUPS;
    CUdevResource rem;
    memset(g_groups, 0, sizeof g_groups);
    memset(&rem, 0, sizeof rem);
    r = ds_real.cuDevSmResourceSplitByCount(g_groups, &nb, &all, &rem, 0, min);
    if (r != CUDA_SUCCESS || nb == 0) {
        DS_LOG(DS_LOG_WARN, "cuDevSmResourceSplitByCount(min %u): %d; kernels run unconfined", min, r);
        return false;
    }
    if (split_state == DS_SPLIT_PUBLISHED && __atomic_load_n(&ge->n_groups, __ATOMIC_RELAXED) != nb) {
        DS_LOG(DS_LOG_ERROR, "split of %u groups of %u SMs here, the table says %u groups: kernels run unconfined",
               nb, min, ge->n_groups);
        return false;
    }
    if (split_state == DS_SPLIT_UNKNOWN)
        publish_split(min, all.sm.smCoscheduledAlignment ? all.sm.smCoscheduledAlignment : min, nb, &rem);
    g_dev = dev;
    if (!ds_real.cuCtxGetCurrent || ds_real.cuCtxGetCurrent(&g_primary) != CUDA_SUCCESS)
        g_primary = NULL;
    atomic_store_explicit(&g_ngroups, nb, memory_order_release); /* publishes g_groups, g_dev, g_primary */
    g_split_failed = 0;
    DS_LOG(DS_LOG_INFO, "split: %u groups of %u SMs (%u SMs on the device)", nb, g_groups[0].sm.smCount,
           all.sm.smCount);
    return true;
}

/* Host tenants (`detshare run`, root on the host) publish the split they learnt when nobody has (the same CAS
 * protocol as sched/table PublishSplit). Containers map the table read-only and leave it to the scheduler. */
static void publish_split(unsigned min, unsigned align, unsigned nb, const CUdevResource *rem) {
    if (!(__atomic_load_n(&ds_process.tenant->ctr->flags, __ATOMIC_RELAXED) & DS_CF_HOST_TENANT))
        return;
    const char *path = ds_process.tenant->table_path;
    void *m = NULL;
    if (ds_map_file(path, DS_TABLE_SIZE, 1, &m) != 0) {
        DS_LOG(DS_LOG_INFO, "table %s not writable here: the scheduler publishes the split", path);
        return;
    }
    struct ds_gpu *g = (struct ds_gpu *)((char *)m + DS_GPUS_OFFSET) + ds_process.tenant->gpu;
    uint32_t want = DS_SPLIT_UNKNOWN;
    if (__atomic_compare_exchange_n(&g->split_state, &want, DS_SPLIT_PUBLISHING, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED)) {
        g->split_min_size = min;
        g->split_alignment = align;
        g->remainder_sms = rem->sm.smCount;
        for (unsigned i = 0; i < DS_MAX_SM_GROUPS; i++)
            g->group_sms[i] = i < nb ? g_groups[i].sm.smCount : 0;
        __atomic_store_n(&g->n_groups, nb, __ATOMIC_RELAXED);
        __atomic_store_n(&g->split_state, DS_SPLIT_PUBLISHED, __ATOMIC_RELEASE);
        DS_LOG(DS_LOG_INFO, "published the split of GPU %d: %u groups, %u SMs left over", ds_process.tenant->gpu, nb,
               rem->sm.smCount);
    }
    munmap(m, DS_TABLE_SIZE);
}

static struct gctx *gctx_find_locked(uint64_t mask) {
    unsigned n_ctx = atomic_load_explicit(&g_nctx, memory_order_relaxed);
    for (unsigned i = 0; i < n_ctx; i++)
        if (g_ctxs[i].mask == mask)
            return &g_ctxs[i];
    return NULL;
}

/* The cached green context with the most groups inside mask (NULL if none): what launches may use while the
 * context of mask itself is being made, without running anywhere outside the grant. */
static struct gctx *largest_cached_subset_locked(uint64_t mask) {
    struct gctx *best = NULL;
    unsigned n_ctx = atomic_load_explicit(&g_nctx, memory_order_relaxed);
    for (unsigned i = 0; i < n_ctx; i++)
        if (!(g_ctxs[i].mask & ~mask) &&
            (!best || __builtin_popcountll(g_ctxs[i].mask) > __builtin_popcountll(best->mask)))
            best = &g_ctxs[i];
    return best;
}

/* Makes a green context over the groups of mask (no lock needed: the split is fixed once learnt). The driver call
 * waits for the work the process already has on the GPU (measured on the H100: 102 ms behind a 100 ms kernel), but
 * not for other threads' launches. */
static CUresult gctx_make(uint64_t mask, CUgreenCtx *g, CUcontext *cu) {
    CUdevResource res[MAX_GROUPS];
    unsigned n = 0, ngroups = split_groups();
    for (unsigned i = 0; i < ngroups; i++)
        if (mask & (1ull << i))
            res[n++] = g_groups[i];
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode m = relaxed_begin();
    CUdevResourceDesc desc = NULL;
    CUresult r = ds_real.cuDevResourceGenerateDesc(&desc, res, n);
    if (r == CUDA_SUCCESS)
        r = ds_real.cuGreenCtxCreate(g, desc, g_dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (r == CUDA_SUCCESS)
        r = ds_real.cuCtxFromGreenCtx(cu, *g);
    relaxed_end(m);
    return r;
}

static struct gctx *gctx_insert_locked(uint64_t mask, CUgreenCtx g, CUcontext cu) {
    unsigned n_ctx = atomic_load_explicit(&g_nctx, memory_order_relaxed);
    if (n_ctx >= MAX_GCTX) {
        DS_LOG(DS_LOG_WARN, "more than %u distinct grants in one process; kernels of new ones run unconfined",
               MAX_GCTX);
        return NULL;
    }
    struct gctx *c = &g_ctxs[n_ctx];
    c->mask = mask;
    c->g = g;
    c->cu = cu;
    c->idx = n_ctx;
    atomic_store_explicit(&g_nctx, n_ctx + 1, memory_order_release);
    DS_LOG(DS_LOG_DEBUG, "green context %u for groups %#llx", c->idx, (unsigned long long)mask);
    return c;
}

static void gctx_failed(uint64_t mask, CUresult r) {
    DS_LOG(DS_LOG_WARN, "green context for groups %#llx: %d; kernels of this grant run unconfined",
           (unsigned long long)mask, r);
}

/* The green context of mask, made here if it is not cached (g_lock held). */
static struct gctx *gctx_for_locked(uint64_t mask) {
    struct gctx *c = gctx_find_locked(mask);
    if (c)
        return c;
    if (atomic_load_explicit(&g_nctx, memory_order_relaxed) >= MAX_GCTX)
        return gctx_insert_locked(mask, NULL, NULL); /* logs and gives NULL */
    CUgreenCtx g = NULL;
    CUcontext cu = NULL;
    CUresult r = gctx_make(mask, &g, &cu);
    if (r != CUDA_SUCCESS) {
        gctx_failed(mask, r);
        return NULL;
    }
    return gctx_insert_locked(mask, g, cu);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Green contexts made off the launch path. A grant whose context is not cached is made by this thread while
 * launches run on the largest cached context inside the grant (for a grant that grew, the one they already use);
 * when it is ready the next launch looks at the grant again. Only a grant with no cached context inside it is made
 * on the launch path (the first grant, or a move to groups never used).
 * ------------------------------------------------------------------------------------------------------------- */
#define MK_QUEUE 8
static pthread_mutex_t g_mk_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_mk_cond = PTHREAD_COND_INITIALIZER;
static uint64_t g_mk_queue[MK_QUEUE], g_mk_failed[MK_QUEUE];
static unsigned g_mk_n, g_mk_nfailed;
static int g_mk_started; /* under g_mk_lock */

static bool mk_failed_locked(uint64_t mask) {
    for (unsigned i = 0; i < g_mk_nfailed; i++)
        if (g_mk_failed[i] == mask)
            return true;
    return false;
}

static void *maker(void *arg) {
    (void)arg;
    ds_depth++; /* the library's own driver calls */
    (void)relaxed_begin();
    CUcontext primary = primary_ctx();
    if (primary && ds_real.cuCtxSetCurrent)
        ds_real.cuCtxSetCurrent(primary);
    for (;;) {
        pthread_mutex_lock(&g_mk_lock);
        while (!g_mk_n)
            pthread_cond_wait(&g_mk_cond, &g_mk_lock);
        uint64_t mask = g_mk_queue[0]; /* stays queued until made, so it is not asked for twice */
        pthread_mutex_unlock(&g_mk_lock);

        pthread_mutex_lock(&g_lock);
        bool have = gctx_find_locked(mask) != NULL;
        pthread_mutex_unlock(&g_lock);
        CUresult r = CUDA_SUCCESS;
        if (!have) {
            CUgreenCtx g = NULL;
            CUcontext cu = NULL;
            uint64_t t0 = ds_now_ns();
            r = gctx_make(mask, &g, &cu);
            pthread_mutex_lock(&g_lock);
            if (r == CUDA_SUCCESS && (gctx_find_locked(mask) || !gctx_insert_locked(mask, g, cu)))
                ds_real.cuGreenCtxDestroy(g); /* made meanwhile on the launch path, or the table is full */
            pthread_mutex_unlock(&g_lock);
            if (r != CUDA_SUCCESS)
                gctx_failed(mask, r);
            else
                DS_LOG(DS_LOG_INFO, "green context for groups %#llx made off the launch path in %llu us",
                       (unsigned long long)mask, (unsigned long long)((ds_now_ns() - t0) / 1000));
        }
        pthread_mutex_lock(&g_mk_lock);
        if (r != CUDA_SUCCESS && g_mk_nfailed < MK_QUEUE)
            g_mk_failed[g_mk_nfailed++] = mask;
        memmove(g_mk_queue, g_mk_queue + 1, (--g_mk_n) * sizeof g_mk_queue[0]);
        pthread_mutex_unlock(&g_mk_lock);
        atomic_store_explicit(&g_epoch_seen, UINT32_MAX, memory_order_release); /* look at the grant again */
    }
    return NULL;
}

/* Asks the maker for mask's green context; false when it cannot (queue full, thread not started, failed before). */
static bool mk_request(uint64_t mask) {
    bool ok = false;
    pthread_mutex_lock(&g_mk_lock);
    if (mk_failed_locked(mask))
        goto out;
    for (unsigned i = 0; i < g_mk_n; i++)
        if (g_mk_queue[i] == mask) {
            ok = true;
            goto out;
        }
    if (g_mk_n >= MK_QUEUE)
        goto out;
    if (!g_mk_started) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, 256 * 1024);
        g_mk_started = pthread_create(&th, &at, maker, NULL) == 0 ? 1 : -1;
        pthread_attr_destroy(&at);
        if (g_mk_started < 0)
            DS_LOG(DS_LOG_WARN, "green-context thread not started: new grants' contexts are made on the launch path");
    }
    if (g_mk_started > 0) {
        g_mk_queue[g_mk_n++] = mask;
        pthread_cond_signal(&g_mk_cond);
        ok = true;
    }
out:
    pthread_mutex_unlock(&g_mk_lock);
    return ok;
}

/* A new grant epoch: read the grant (seqlock) and choose what launches bind to. */
static void regrant(uint32_t ep) {
    pthread_mutex_lock(&g_lock);
    if (atomic_load(&g_epoch_seen) == ep) {
        pthread_mutex_unlock(&g_lock);
        return;
    }
    struct ds_grant gr;
    if (ds_grant_read(ds_process.tenant->ctr, &gr) != 0) {
        /* a leader died mid-write: keep the previous grant (fail-static) and look again at the next launch */
        pthread_mutex_unlock(&g_lock);
        return;
    }
    /* Is the slot still ours? Registration bumps the generation before it resets the grant, so a grant read
     * before this load of the generation that belongs to a newcomer shows the newcomer's generation here. */
    uint32_t gen = __atomic_load_n(&ds_process.tenant->ctr->gen, __ATOMIC_ACQUIRE);
    uint32_t st = __atomic_load_n(&ds_process.tenant->ctr->state, __ATOMIC_ACQUIRE);
    if (gen != ds_process.tenant->slot_gen || st == DS_SLOT_FREE || st == DS_SLOT_DRAINING) {
        /* An orphan (its tenant deregistered or reaped while it ran): the grant in this slot is not its own, and
         * running on any SMs would take them from tenants that own them. Its GPU work is held (launches, copies
         * and memsets wait) until it exits; see docs/threat-model.md "Orphans". */
        if (!atomic_exchange(&g_orphan, 1))
            DS_LOG(DS_LOG_ERROR, "tenant %s left slot %d (generation %u, state %u; ours was generation %u): this "
                                 "process belongs to no tenant any more, its GPU work is held until it exits",
                   ds_process.tenant->id, ds_process.tenant->slot, gen, st, ds_process.tenant->slot_gen);
        atomic_store(&g_empty, 1);
        atomic_store(&g_mode, DS_MODE_NONE);
        atomic_store_explicit(&g_epoch_seen, gr.epoch, memory_order_release);
        pthread_mutex_unlock(&g_lock);
        return;
    }
    ds_guard_snapshot();
    struct gctx *cur = NULL;
    if (gr.mode == DS_MODE_SPATIAL && learn_split_locked()) {
        unsigned ng = split_groups();
        uint64_t every = ng >= 64 ? ~0ull : (1ull << ng) - 1;
        uint64_t mask = gr.groups & every;
        if (mask == every) {
            cur = NULL; /* every group: launches and captures stay on the application's streams, all SMs */
        } else if (mask) {
            cur = gctx_find_locked(mask);
            if (!cur) {
                struct gctx *sub = largest_cached_subset_locked(mask);
                if (sub && mk_request(mask))
                    cur = sub; /* the maker brings mask's own context; until then a part of the grant */
            }
            if (!cur)
                cur = gctx_for_locked(mask); /* nothing inside the grant is cached: made here */
            if (cur)
                g_last_nonempty = cur;
        } else {
            cur = g_last_nonempty; /* no SMs granted: launches wait for a grant, see wait_for_sms */
        }
    }
    unsigned ngroups = split_groups();
    uint64_t all = ngroups >= 64 ? ~0ull : (1ull << ngroups) - 1;
    bool spatial = gr.mode == DS_MODE_SPATIAL && ngroups;
    /* A tenant the scheduler has not answered yet must not run on the whole GPU beside latency-critical
     * neighbours: while a live scheduler owes it its first grant, launches wait for it (bounded, see wait_for_sms).
     * Without a live scheduler there is nothing to wait for (fail-open). */
    bool ungranted = gr.mode == DS_MODE_NONE && scheduler_alive();
    atomic_store(&g_ungranted, ungranted);
    atomic_store(&g_empty, (spatial && !(gr.groups & all)) || ungranted);
    atomic_store(&g_mode, gr.mode);
    atomic_store_explicit(&g_cur, cur, memory_order_release);
    atomic_store_explicit(&g_epoch_seen, gr.epoch, memory_order_release);
    pthread_mutex_unlock(&g_lock);
    DS_LOG(DS_LOG_DEBUG, "grant epoch %u: mode %u groups %#llx", gr.epoch, gr.mode, (unsigned long long)gr.groups);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Logical streams
 * ------------------------------------------------------------------------------------------------------------- */
static unsigned slot_of(uintptr_t key) { return (unsigned)((key * 0x9E3779B97F4A7C15ull) >> 52) & (N_LSLOTS - 1); }

static CUstream app_handle(CUstream s, int per_thread) {
    if (s == NULL)
        return per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    return s;
}

/* What the application's stream is: which legacy-stream rules apply, and the priority its physical streams get. */
static void learn(struct lstream *ls) {
    ls->prio = 0;
    if (ls->app == CU_STREAM_LEGACY) {
        ls->kind = LS_LEGACY;
        return;
    }
    ls->kind = LS_BLOCKING; /* the per-thread default stream, and any stream whose flags cannot be read */
    if (ls->app == CU_STREAM_PER_THREAD)
        return;
    unsigned flags = 0;
    if (ds_real.cuStreamGetFlags && ds_real.cuStreamGetFlags(ls->app, &flags) == CUDA_SUCCESS &&
        (flags & CU_STREAM_NON_BLOCKING))
        ls->kind = LS_NONBLOCKING;
    int p = 0;
    if (ds_real.cuStreamGetPriority && ds_real.cuStreamGetPriority(ls->app, &p) == CUDA_SUCCESS)
        ls->prio = p;
}

/* g_lock held */
static void register_locked(struct lstream *ls, bool all) {
    if (all) {
        unsigned n = atomic_load(&g_nall);
        if (n < N_LSLOTS) {
            atomic_store(&g_all[n], ls);
            atomic_store_explicit(&g_nall, n + 1, memory_order_release);
        }
    }
    if (ls->kind == LS_BLOCKING) {
        unsigned n = atomic_load(&g_nblocking);
        for (unsigned i = 0; i < n; i++)
            if (atomic_load(&g_blocking[i]) == ls)
                return;
        if (n < N_LSLOTS) {
            atomic_store(&g_blocking[n], ls);
            atomic_store_explicit(&g_nblocking, n + 1, memory_order_release);
        }
    } else if (ls->kind == LS_LEGACY) {
        atomic_store_explicit(&g_legacy, ls, memory_order_release);
    }
}

static struct lstream *lstream_new(CUstream app) {
    struct lstream *ls = calloc(1, sizeof *ls);
    if (!ls)
        return NULL;
    ls->app = app;
    CUstreamCaptureMode m = relaxed_begin();
    bool ok = ds_real.cuEventCreate(&ls->e_in, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
              ds_real.cuEventCreate(&ls->e_out, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
    if (ok)
        learn(ls);
    relaxed_end(m);
    if (!ok) {
        free(ls);
        return NULL;
    }
    pthread_mutex_init(&ls->lock, NULL);
    ds_gate_init(&ls->gate);
    atomic_store(&ls->need_in, 1);
    return ls;
}

static void table_full_warning(void) {
    static atomic_int warned;
    if (!atomic_exchange(&warned, 1))
        DS_LOG(DS_LOG_WARN, "logical stream table full or out of memory: some kernels run unconfined");
}

/* The logical stream of an application stream handle (app_handle applied), or NULL if none was made yet. */
static struct lstream *lstream_find(CUstream app) {
    if (app == CU_STREAM_PER_THREAD)
        return t_ptds;
    uintptr_t key = (uintptr_t)app;
    unsigned s = slot_of(key);
    for (unsigned n = 0; n < N_LSLOTS; n++, s = (s + 1) & (N_LSLOTS - 1)) {
        uintptr_t k = atomic_load_explicit(&g_keys[s], memory_order_acquire);
        if (k == key)
            return atomic_load_explicit(&g_vals[s], memory_order_acquire);
        if (k == 0)
            return NULL;
    }
    return NULL;
}

static void relearn(struct lstream *ls);

static struct lstream *lstream_get(CUstream app) {
    struct lstream *ls = lstream_find(app);
    if (DS_LIKELY(ls != NULL)) {
        if (DS_UNLIKELY(atomic_load_explicit(&ls->stale, memory_order_acquire)))
            relearn(ls);
        return ls;
    }
    if (app == CU_STREAM_PER_THREAD) {
        ls = lstream_new(app);
        if (!ls) {
            table_full_warning();
            return NULL;
        }
        pthread_mutex_lock(&g_lock);
        register_locked(ls, true);
        pthread_mutex_unlock(&g_lock);
        t_ptds = ls;
        return ls;
    }
    uintptr_t key = (uintptr_t)app;
    pthread_mutex_lock(&g_lock);
    unsigned s = slot_of(key);
    for (unsigned n = 0; n < N_LSLOTS; n++, s = (s + 1) & (N_LSLOTS - 1)) {
        uintptr_t k = atomic_load_explicit(&g_keys[s], memory_order_acquire);
        if (k == key) {
            ls = atomic_load(&g_vals[s]);
            break;
        }
        if (k == 0) {
            ls = lstream_new(app);
            if (ls) {
                register_locked(ls, true);
                atomic_store_explicit(&g_vals[s], ls, memory_order_release);
                atomic_store_explicit(&g_keys[s], key, memory_order_release);
            }
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (!ls)
        table_full_warning();
    return ls;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Edges
 * ------------------------------------------------------------------------------------------------------------- */
static void tie(struct lstream *ls, CUstream from, CUstream into) {
    if (DS_SOP_REAL(cuEventRecord)(ls->e_out, from) == CUDA_SUCCESS)
        DS_SOP_REAL(cuStreamWaitEvent)(into, ls->e_out, 0);
}

/* ls->lock held: the application stream waits for the kernels on the physical stream. */
static void join_locked(struct lstream *ls) {
    if (!atomic_load_explicit(&ls->pending, memory_order_acquire))
        return;
    /* cleared first: a kernel launched concurrently sets it again and is joined next time */
    atomic_store(&ls->pending, 0);
    CUstream p = atomic_load(&ls->phys);
    if (p)
        tie(ls, p, ls->app);
}

static void join(struct lstream *ls) {
    if (!atomic_load_explicit(&ls->pending, memory_order_acquire))
        return;
    pthread_mutex_lock(&ls->lock);
    join_locked(ls);
    pthread_mutex_unlock(&ls->lock);
}

/* Another stream (observer) must see ls's kernels, without ls's own application stream being involved (it may be
 * another thread's per-thread default stream, which only its thread can name). ls stays pending for its own
 * observers. */
static void join_into(struct lstream *ls, CUstream observer) {
    if (!atomic_load_explicit(&ls->pending, memory_order_acquire))
        return;
    pthread_mutex_lock(&ls->lock);
    CUstream p = atomic_load(&ls->phys);
    if (p && atomic_load(&ls->pending))
        tie(ls, p, observer);
    pthread_mutex_unlock(&ls->lock);
}

static bool foreign_ptds(const struct lstream *ls) { return ls->app == CU_STREAM_PER_THREAD && ls != t_ptds; }

/* Before context-wide synchronisation, frees and operations not modelled stream by stream. */
void ds_join_all(void) {
    unsigned n = atomic_load_explicit(&g_nall, memory_order_acquire);
    for (unsigned i = 0; i < n; i++) {
        struct lstream *ls = atomic_load_explicit(&g_all[i], memory_order_acquire);
        if (!ls || !atomic_load_explicit(&ls->pending, memory_order_acquire))
            continue;
        if (!foreign_ptds(ls))
            join(ls);
        else if (!atomic_load(&ds_process.capturing)) /* the legacy stream may not be touched while a capture runs */
            join_into(ls, CU_STREAM_LEGACY);
    }
}

/* The legacy-stream rules, before work on a stream of kind k (handle app) is issued: the legacy stream sees every
 * blocking stream's kernels, a blocking stream sees the legacy stream's. */
static void cross_pre(int k, CUstream app) {
    if (k == LS_LEGACY) {
        unsigned n = atomic_load_explicit(&g_nblocking, memory_order_acquire);
        for (unsigned i = 0; i < n; i++) {
            struct lstream *b = atomic_load_explicit(&g_blocking[i], memory_order_acquire);
            if (b && b->kind == LS_BLOCKING && atomic_load_explicit(&b->pending, memory_order_acquire))
                join_into(b, CU_STREAM_LEGACY);
        }
    } else if (k == LS_BLOCKING) {
        struct lstream *l = atomic_load_explicit(&g_legacy, memory_order_acquire);
        if (l && atomic_load_explicit(&l->pending, memory_order_acquire))
            join_into(l, app);
    }
}

/* After work on a stream of kind k was issued: the other side's next kernel must take an edge in. */
static void cross_post(int k) {
    if (k == LS_LEGACY) {
        if (atomic_load_explicit(&g_nblocking, memory_order_relaxed))
            atomic_fetch_add_explicit(&g_legacy_gen, 1, memory_order_release);
    } else if (k == LS_BLOCKING) {
        if (atomic_load_explicit(&g_legacy, memory_order_relaxed))
            atomic_fetch_add_explicit(&g_blocking_gen, 1, memory_order_release);
    }
}

static unsigned cross_gen(int k) {
    if (k == LS_LEGACY)
        return atomic_load_explicit(&g_blocking_gen, memory_order_acquire);
    if (k == LS_BLOCKING)
        return atomic_load_explicit(&g_legacy_gen, memory_order_acquire);
    return 0;
}

static bool needs_edge_in(struct lstream *ls) {
    return atomic_load_explicit(&ls->need_in, memory_order_acquire) ||
           atomic_load_explicit(&ls->seen_order, memory_order_relaxed) !=
               atomic_load_explicit(&g_order_gen, memory_order_acquire) ||
           (ls->kind != LS_NONBLOCKING && atomic_load_explicit(&ls->seen_cross, memory_order_relaxed) != cross_gen(ls->kind));
}

/* The physical stream waits for everything issued to the application stream so far. */
static bool edge_in(struct lstream *ls, CUstream phys) {
    pthread_mutex_lock(&ls->lock);
    /* read what the edge covers before recording it, and clear need_in first: work issued meanwhile is either
     * covered by the record or flags the next kernel again */
    unsigned og = atomic_load(&g_order_gen), cg = cross_gen(ls->kind);
    atomic_store(&ls->need_in, 0);
    bool ok = DS_SOP_REAL(cuEventRecord)(ls->e_in, ls->app) == CUDA_SUCCESS &&
              DS_SOP_REAL(cuStreamWaitEvent)(phys, ls->e_in, 0) == CUDA_SUCCESS;
    if (ok) {
        atomic_store(&ls->seen_order, og);
        atomic_store(&ls->seen_cross, cg);
    } else {
        atomic_store(&ls->need_in, 1);
    }
    pthread_mutex_unlock(&ls->lock);
    return ok;
}

/* Points ls at a physical stream of c (created once per (logical stream, green context) and kept). */
static bool rebind(struct lstream *ls, struct gctx *c) {
    pthread_mutex_lock(&ls->lock);
    bool ok = true;
    if (atomic_load(&ls->bound) == c)
        goto out;
    if (!ls->phys_by_ctx[c->idx]) {
        CUstream p = NULL;
        CUstreamCaptureMode m = relaxed_begin();
        /* green streams must be non-blocking; the edges give the application stream's ordering */
        CUresult r = ds_real.cuGreenCtxStreamCreate(&p, c->g, CU_STREAM_NON_BLOCKING, ls->prio);
        relaxed_end(m);
        if (r != CUDA_SUCCESS) {
            DS_LOG(DS_LOG_WARN, "green stream: %d; this stream runs unconfined", r);
            ok = false;
            goto out;
        }
        ls->phys_by_ctx[c->idx] = p;
    }
    join_locked(ls); /* the application stream waits for the old physical stream; the new one waits for it */
    if (!atomic_load(&ls->bound))
        atomic_fetch_add(&g_nbound, 1);
    atomic_store_explicit(&ls->phys, ls->phys_by_ctx[c->idx], memory_order_release);
    atomic_store_explicit(&ls->bound, c, memory_order_release);
    atomic_store(&ls->need_in, 1);
out:
    pthread_mutex_unlock(&ls->lock);
    return ok;
}

/* Kernels of ls run on its application stream from now on (full grant, failure): join what is on the physical one. */
static void unbind(struct lstream *ls) {
    pthread_mutex_lock(&ls->lock);
    join_locked(ls);
    if (atomic_exchange(&ls->bound, NULL))
        atomic_fetch_sub(&g_nbound, 1);
    atomic_store(&ls->phys, NULL);
    atomic_store(&ls->need_in, 1);
    pthread_mutex_unlock(&ls->lock);
}

/* The application destroyed the stream and its handle may come back as another stream: learn it again. Its
 * physical streams were joined at the destroy; they are kept unless the priority differs. */
static void relearn(struct lstream *ls) {
    pthread_mutex_lock(&ls->lock);
    if (atomic_load(&ls->stale)) {
        int prio = ls->prio;
        CUstreamCaptureMode m = relaxed_begin();
        learn(ls);
        relaxed_end(m);
        if (ls->prio != prio) {
            for (unsigned i = 0; i < MAX_GCTX; i++)
                if (ls->phys_by_ctx[i]) {
                    DS_SOP_REAL(cuStreamDestroy_v2)(ls->phys_by_ctx[i]);
                    ls->phys_by_ctx[i] = NULL;
                }
            if (atomic_exchange(&ls->bound, NULL))
                atomic_fetch_sub(&g_nbound, 1);
            atomic_store(&ls->phys, NULL);
        }
        atomic_store(&ls->pending, 0);
        atomic_store(&ls->unconfinable, 0);
        atomic_store(&ls->need_in, 1);
        pthread_mutex_lock(&g_lock);
        register_locked(ls, false);
        pthread_mutex_unlock(&g_lock);
        atomic_store_explicit(&ls->stale, 0, memory_order_release);
    }
    pthread_mutex_unlock(&ls->lock);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Stream operations (ds_stream.c calls these around the driver's entry point)
 * ------------------------------------------------------------------------------------------------------------- */
/* The kind of the stream an operation names; ls gets its logical stream when one exists (made when the legacy
 * rules need the kind of a stream not seen yet). */
static int op_kind(CUstream app, struct lstream **out) {
    struct lstream *ls = lstream_find(app);
    if (ls && DS_UNLIKELY(atomic_load_explicit(&ls->stale, memory_order_acquire)))
        relearn(ls);
    *out = ls;
    if (app == CU_STREAM_LEGACY)
        return LS_LEGACY;
    if (app == CU_STREAM_PER_THREAD)
        return LS_BLOCKING;
    if (ls)
        return ls->kind;
    /* unseen stream: its kind only matters when the legacy stream is in use */
    if (!atomic_load_explicit(&g_legacy, memory_order_acquire))
        return LS_NONBLOCKING;
    ls = lstream_get(app);
    *out = ls;
    return ls ? ls->kind : LS_BLOCKING;
}

void ds_stream_before(struct ds_sop *op, int kind, CUstream s, int per_thread) {
    op->ls = NULL;
    op->lkind = LS_NONBLOCKING;
    if (kind == DS_OP_ALL || kind == DS_OP_ORDER) {
        ds_join_all();
        return;
    }
    if (kind == DS_OP_EXEC || kind == DS_OP_UPDATE)
        return;
    CUstream app = app_handle(s, per_thread);
    struct lstream *ls;
    op->lkind = op_kind(app, &ls);
    op->ls = ls;
    if (kind == DS_OP_WAIT)
        return;
    cross_pre(op->lkind, app);
    if (ls)
        join(ls);
}

void ds_stream_after(struct ds_sop *op, int kind, CUresult r) {
    struct lstream *ls = op->ls;
    switch (kind) {
    case DS_OP_ORDER:
        atomic_fetch_add_explicit(&g_order_gen, 1, memory_order_release);
        return;
    case DS_OP_OP:
    case DS_OP_WAIT:
        if (ls)
            atomic_store_explicit(&ls->need_in, 1, memory_order_release);
        cross_post(op->lkind);
        return;
    case DS_OP_DESTROY:
        if (ls && r == CUDA_SUCCESS && ls->app != CU_STREAM_LEGACY && ls->app != CU_STREAM_PER_THREAD) {
            /* joined before the destroy: nothing is pending; unbound, so it no longer counts in g_nbound */
            pthread_mutex_lock(&ls->lock);
            if (atomic_exchange(&ls->bound, NULL))
                atomic_fetch_sub(&g_nbound, 1);
            atomic_store(&ls->phys, NULL);
            atomic_store(&ls->pending, 0);
            pthread_mutex_unlock(&ls->lock);
            atomic_store_explicit(&ls->stale, 1, memory_order_release);
        }
        return;
    default:
        return;
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Temporal mode and empty grants: bounded waits, fail-static
 * ------------------------------------------------------------------------------------------------------------- */
static bool scheduler_alive(void) {
    uint64_t hb = __atomic_load_n(&ds_process.tenant->table->sched_heartbeat_ns, __ATOMIC_RELAXED);
    uint64_t now = ds_now_ns();
    return hb && now - hb < ds_process.settings.sched_stale_ms * 1000000ull;
}

static void account_wait(uint64_t ns) {
    struct ds_client_page *pg = ds_process.tenant->page;
    __atomic_fetch_add(&pg->queue_delay_ns, ns, __ATOMIC_RELAXED);
    uint64_t m = __atomic_load_n(&pg->queue_delay_max_ns, __ATOMIC_RELAXED);
    while (ns > m && !__atomic_compare_exchange_n(&pg->queue_delay_max_ns, &m, ns, 0, __ATOMIC_RELAXED,
                                                  __ATOMIC_RELAXED)) {
    }
}

static bool holds_token(void) {
    const struct ds_gpu *g = ds_process.tenant->gpu_entry;
    return __atomic_load_n(&g->token_holder, __ATOMIC_ACQUIRE) == (uint32_t)ds_process.tenant->slot + 1 &&
           __atomic_load_n(&g->token_holder_gen, __ATOMIC_RELAXED) == ds_process.tenant->slot_gen;
}

static atomic_int g_unthrottled_warned;

static void wait_for_token(void) {
    const struct ds_gpu *g = ds_process.tenant->gpu_entry;
    uint64_t t0 = 0, bound = ds_process.settings.token_wait_ms * 1000000ull;
    for (;;) {
        uint32_t seq = __atomic_load_n(&g->token_seq, __ATOMIC_ACQUIRE);
        if (holds_token() || atomic_load(&g_mode) != DS_MODE_TEMPORAL)
            break;
        uint64_t now = ds_now_ns();
        if (!t0)
            t0 = now;
        if (now - t0 >= bound || !scheduler_alive()) {
            if (!atomic_exchange(&g_unthrottled_warned, 1))
                DS_LOG(DS_LOG_WARN, "no GPU token after %llu ms (scheduler %s): running unthrottled (fail-static)",
                       (unsigned long long)((now - t0) / 1000000), scheduler_alive() ? "slow" : "gone");
            break;
        }
        ds_futex_wait(&g->token_seq, seq, 50000000ull);
        uint32_t ep = ds_grant_epoch(ds_process.tenant->ctr);
        if (ep != atomic_load_explicit(&g_epoch_seen, memory_order_acquire))
            regrant(ep);
    }
    if (t0)
        account_wait(ds_now_ns() - t0);
}

/* Spatial grant with no groups: wait (bounded) for SMs, then run on the last groups held (fail-static). */
static void wait_for_sms(void) {
    const struct ds_container *c = ds_process.tenant->ctr;
    uint64_t t0 = ds_now_ns(), bound = atomic_load(&g_ungranted)
                                           ? ds_process.settings.first_grant_wait_ms * 1000000ull
                                           : ds_process.settings.grant_wait_ms * 1000000ull;
    for (;;) {
        uint32_t ep = ds_grant_epoch(c);
        if (ep != atomic_load_explicit(&g_epoch_seen, memory_order_acquire))
            regrant(ep);
        if (!atomic_load(&g_empty))
            break;
        if (atomic_load(&g_orphan)) { /* never released: the slot will not become this tenant's again */
            ds_futex_wait(&c->grant_epoch, ep, 1000000000ull);
            continue;
        }
        uint64_t now = ds_now_ns();
        if (now - t0 >= bound || !scheduler_alive()) {
            if (!atomic_exchange(&g_unthrottled_warned, 1))
                DS_LOG(DS_LOG_WARN, "no SMs granted for %llu ms: running on the last grant (fail-static)",
                       (unsigned long long)((now - t0) / 1000000));
            break;
        }
        ds_futex_wait(&c->grant_epoch, ep, 50000000ull);
    }
    account_wait(ds_now_ns() - t0);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Demand: a process is busy from its first launch after idle (the doorbell rings only on the tenant's idle->busy
 * and busy->idle transitions, never per launch) until a monitor thread sees no launch for DETSHARE_IDLE_MS (default
 * 20 ms, 2 ms for a latency-critical tenant) and the work of its redirected streams complete. The monitor is started by the first idle->busy
 * transition (a slow path) and polls every few milliseconds; it never touches application streams.
 * ------------------------------------------------------------------------------------------------------------- */
static pthread_once_t g_mon_once = PTHREAD_ONCE_INIT;
static atomic_int g_mon_running;
static _Atomic uint64_t g_busy_since;

static bool streams_drained(void) {
    if (atomic_load(&ds_process.capturing))
        return false; /* a physical stream may be capturing: querying it would break the capture */
    unsigned n = atomic_load_explicit(&g_nall, memory_order_acquire);
    for (unsigned i = 0; i < n; i++) {
        struct lstream *ls = atomic_load_explicit(&g_all[i], memory_order_acquire);
        CUstream p = ls ? atomic_load(&ls->phys) : NULL;
        if (p && DS_SOP_REAL(cuStreamQuery)(p) == CUDA_ERROR_NOT_READY)
            return false;
    }
    return true;
}

/* busy -> idle for this process (its work has drained): demand down, doorbell when the tenant went idle. */
static void go_idle(struct ds_proc *self, uint64_t now) {
    __atomic_store_n(&self->queued, 0, __ATOMIC_RELAXED); /* everything submitted has drained */
    if (__atomic_exchange_n(&self->busy, 0, __ATOMIC_ACQ_REL) == 0)
        return;
    uint64_t since = atomic_load(&g_busy_since);
    if (since && now > since)
        __atomic_fetch_add(&self->busy_ns, now - since, __ATOMIC_RELAXED);
    struct ds_client_page *pg = ds_process.tenant->page;
    uint32_t d = __atomic_load_n(&pg->demand, __ATOMIC_RELAXED);
    while (d > 0 && !__atomic_compare_exchange_n(&pg->demand, &d, d - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
    }
    if (since && now > since)
        __atomic_fetch_add(&pg->busy_ns, now - since, __ATOMIC_RELAXED);
    __atomic_fetch_add(&pg->demand_seq, 1, __ATOMIC_RELEASE);
    if (d == 1)
        ds_guard_ring();
}

/* A synchronisation returned (ds_stream.c). A latency-critical tenant whose work has all drained is idle at once:
 * its request is over, and its neighbours get their groups back now rather than DETSHARE_IDLE_MS later. */
void ds_coro_synced(bool whole_context) {
    struct ds_proc *self = atomic_load_explicit(&ds_process.self, memory_order_acquire);
    if (!self || !__atomic_load_n(&self->busy, __ATOMIC_RELAXED) ||
        __atomic_load_n(&ds_process.tenant->ctr->tier, __ATOMIC_RELAXED) != DS_TIER_LATENCY_CRITICAL ||
        atomic_load(&ds_process.capturing))
        return;
    if (!whole_context && !streams_drained())
        return;
    go_idle(self, ds_now_ns());
}

static void *monitor(void *arg) {
    (void)arg;
    /* A latency-critical tenant's busy/idle follows its requests (2 ms): while it is idle its neighbours get the
     * groups back, and each request's first launch wakes the scheduler (issue 12). */
    bool lc = __atomic_load_n(&ds_process.tenant->ctr->tier, __ATOMIC_RELAXED) == DS_TIER_LATENCY_CRITICAL;
    uint64_t idle_ms = ds_process.settings.idle_ms ? ds_process.settings.idle_ms : lc ? 2 : 20;
    uint64_t idle_ns = idle_ms * 1000000ull;
    uint64_t poll_ns = idle_ns / 4 ? idle_ns / 4 : 1000000ull;
    uint64_t last = 0, last_change = ds_now_ns();
    ds_depth++; /* driver calls made here are the library's own */
    (void)relaxed_begin(); /* and never "unsafe" for an application's global-mode capture */
    for (;;) {
        struct timespec ts = {(time_t)(poll_ns / 1000000000ull), (long)(poll_ns % 1000000000ull)};
        nanosleep(&ts, NULL);
        struct ds_proc *self = atomic_load_explicit(&ds_process.self, memory_order_acquire);
        if (!self)
            continue;
        uint64_t n = __atomic_load_n(&self->launches, __ATOMIC_RELAXED), now = ds_now_ns();
        if (n != last) {
            last = n;
            last_change = now;
            continue;
        }
        if (!__atomic_load_n(&self->busy, __ATOMIC_RELAXED) || now - last_change < idle_ns || !streams_drained())
            continue;
        go_idle(self, now);
    }
    return NULL;
}

static void monitor_start(void) {
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 64 * 1024);
    if (pthread_create(&th, &at, monitor, NULL) == 0)
        atomic_store(&g_mon_running, 1);
    else
        DS_LOG(DS_LOG_WARN, "demand monitor thread: not started; the tenant stays marked busy");
    pthread_attr_destroy(&at);
}

/* fork (the lock order is in ds_init.c): every logical stream's lock and its gate's lock, then g_lock, then g_mk_lock.
 * No stream lock may be taken with g_lock held (relearn nests ls->lock -> g_lock), so a logical stream registered
 * while the stream locks are being taken (registration holds g_lock) is seen by the re-check under g_lock, which is
 * then released while that stream's locks are taken. Two stream locks are never nested elsewhere, so holding some
 * while taking more cannot deadlock. Streams beyond the N_LSLOTS that g_all lists have no lock taken. */
static unsigned g_fork_nall; /* the streams whose locks the fork handler holds */

void ds_coro_fork_lock(void) {
    unsigned done = 0;
    for (;;) {
        unsigned n = atomic_load_explicit(&g_nall, memory_order_acquire);
        for (; done < n; done++) {
            struct lstream *ls = atomic_load_explicit(&g_all[done], memory_order_acquire);
            pthread_mutex_lock(&ls->lock);
            pthread_mutex_lock(&ls->gate.lock);
        }
        pthread_mutex_lock(&g_lock);
        if (atomic_load_explicit(&g_nall, memory_order_acquire) == done)
            break;
        pthread_mutex_unlock(&g_lock);
    }
    g_fork_nall = done;
    pthread_mutex_lock(&g_mk_lock);
}

static void unlock_streams(void) {
    for (unsigned i = g_fork_nall; i-- > 0;) {
        struct lstream *ls = atomic_load_explicit(&g_all[i], memory_order_relaxed);
        pthread_mutex_unlock(&ls->gate.lock);
        pthread_mutex_unlock(&ls->lock);
    }
}

void ds_coro_fork_unlock(void) {
    pthread_mutex_unlock(&g_mk_lock);
    pthread_mutex_unlock(&g_lock);
    unlock_streams();
}

/* fork, in the child (single-threaded): the locks ds_coro_fork_lock took are released; the child has no monitor
 * thread (its first busy transition starts one) and no green-context thread. */
void ds_coro_child(void) {
    /* the green-context thread is not in the child: its lock and queue start afresh (its condition variable may
     * have had that thread as a waiter) */
    pthread_mutex_init(&g_mk_lock, NULL);
    pthread_cond_init(&g_mk_cond, NULL);
    g_mk_n = 0;
    g_mk_started = 0;
    pthread_mutex_unlock(&g_lock);
    unlock_streams();
    pthread_once_t fresh = PTHREAD_ONCE_INIT;
    memcpy(&g_mon_once, &fresh, sizeof fresh);
    atomic_store(&g_mon_running, 0);
    t_pending = NULL;
}

static void set_busy(struct ds_proc *self) {
    if (__atomic_exchange_n(&self->busy, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    atomic_store(&g_busy_since, ds_now_ns());
    struct ds_client_page *pg = ds_process.tenant->page;
    uint32_t old = __atomic_fetch_add(&pg->demand, 1, __ATOMIC_ACQ_REL);
    if (old == 0)
        __atomic_store_n(&pg->demand_since_ns, ds_now_ns(), __ATOMIC_RELAXED);
    __atomic_fetch_add(&pg->demand_seq, 1, __ATOMIC_RELEASE);
    if (old == 0)
        ds_guard_ring();
    pthread_once(&g_mon_once, monitor_start);
}

/* ---------------------------------------------------------------------------------------------------------------
 * The launch path
 * ------------------------------------------------------------------------------------------------------------- */
/* Where work for the application's stream s goes now: its bound physical stream under a partial grant, else s.
 * Kernels count as launches; copies and memsets only as queued work. */
static inline CUstream work_stream(CUstream s, int per_thread, bool kernel) {
    t_pending = NULL;
    struct ds_proc *self = atomic_load_explicit(&ds_process.self, memory_order_relaxed);
    if (DS_LIKELY(self != NULL)) {
        if (kernel) {
            __atomic_fetch_add(&self->launches, 1, __ATOMIC_RELAXED);
            if (DS_UNLIKELY(!atomic_load_explicit(&ds_process.req_start, memory_order_relaxed)))
                ds_latency_start();
        }
        __atomic_fetch_add(&self->queued, 1, __ATOMIC_RELAXED);
        if (DS_UNLIKELY(!__atomic_load_n(&self->busy, __ATOMIC_RELAXED)))
            set_busy(self);
    }

    uint32_t ep = ds_grant_epoch(ds_process.tenant->ctr);
    if (DS_UNLIKELY(ep != atomic_load_explicit(&g_epoch_seen, memory_order_acquire)))
        regrant(ep);
    unsigned mode = atomic_load_explicit(&g_mode, memory_order_relaxed);
    if (DS_UNLIKELY(mode == DS_MODE_TEMPORAL) && !holds_token())
        wait_for_token();
    if (DS_UNLIKELY(atomic_load_explicit(&g_empty, memory_order_relaxed)))
        wait_for_sms();
    struct gctx *c = atomic_load_explicit(&g_cur, memory_order_acquire);
    CUstream app = app_handle(s, per_thread);
    if (DS_LIKELY(c == NULL)) {
        /* every group (or no confinement): kernels run where the application put them, unless this stream still
         * has kernels on a physical stream from an earlier partial grant */
        if (DS_LIKELY(!atomic_load_explicit(&g_nbound, memory_order_relaxed)))
            return s;
        struct lstream *ls = lstream_get(app);
        if (ls) {
            cross_pre(ls->kind, app);
            if (atomic_load(&ls->bound))
                unbind(ls);
            cross_post(ls->kind);
        }
        return s;
    }
    struct lstream *ls = lstream_get(app);
    if (DS_UNLIKELY(!ls))
        return s;
    if (ls->kind != LS_NONBLOCKING)
        cross_pre(ls->kind, app);
    if (DS_UNLIKELY(atomic_load_explicit(&ls->unconfinable, memory_order_relaxed))) {
        cross_post(ls->kind);
        return s;
    }
    if (DS_UNLIKELY(atomic_load_explicit(&ls->bound, memory_order_acquire) != c) && !rebind(ls, c)) {
        if (atomic_load(&ls->bound))
            unbind(ls);
        cross_post(ls->kind);
        return s;
    }
    CUstream phys = atomic_load_explicit(&ls->phys, memory_order_acquire);
    if ((DS_UNLIKELY(needs_edge_in(ls)) || DS_UNLIKELY(strict())) && !edge_in(ls, phys)) {
        unbind(ls);
        return s;
    }
    t_pending = ls;
    t_pending_phys = phys;
    uint32_t gd = ds_gate_depth();
    if (DS_UNLIKELY(gd != 0) && kernel) {
        ds_gate_wait(&ls->gate, gd);
        t_gated = 1;
    }
    return phys;
}

CUstream ds_launch_stream(CUstream s, int per_thread) { return work_stream(s, per_thread, true); }
CUstream ds_work_stream(CUstream s, int per_thread) { return work_stream(s, per_thread, false); }

void ds_launch_done(CUresult r) {
    struct lstream *ls = t_pending;
    if (!ls)
        return;
    t_pending = NULL;
    if (DS_UNLIKELY(t_gated)) {
        t_gated = 0;
        if (r == CUDA_SUCCESS)
            ds_gate_record(&ls->gate, t_pending_phys);
    }
    if (r != CUDA_SUCCESS)
        return;
    if (!atomic_load_explicit(&ls->pending, memory_order_relaxed))
        atomic_store_explicit(&ls->pending, 1, memory_order_release);
    if (DS_UNLIKELY(atomic_load_explicit(&ls->phys, memory_order_acquire) != t_pending_phys)) {
        /* rebound by another thread while this kernel was being launched on the old physical stream */
        pthread_mutex_lock(&ls->lock);
        tie(ls, t_pending_phys, ls->app);
        pthread_mutex_unlock(&ls->lock);
    }
    if (ls->kind != LS_NONBLOCKING)
        cross_post(ls->kind);
    if (DS_UNLIKELY(strict()))
        join(ls);
}

bool ds_launch_retry(CUresult r) {
    struct lstream *ls = t_pending;
    t_pending = NULL;
    t_gated = 0;
    /* the kernel did not go on the physical stream (e.g. a function of a context green contexts cannot use): the
     * caller runs it where the application asked, after what the physical stream already holds */
    if (ls == NULL || r == CUDA_ERROR_NOT_INITIALIZED || r == CUDA_ERROR_DEINITIALIZED)
        return false;
    join(ls);
    return true;
}

void ds_launch_unconfinable(CUstream s, int per_thread) {
    struct lstream *ls = lstream_get(app_handle(s, per_thread));
    if (!ls)
        return;
    if (!atomic_exchange(&ls->unconfinable, 1))
        DS_LOG(DS_LOG_WARN, "a kernel could not run on its green stream; stream %p runs unconfined", (void *)s);
    unbind(ls);
    if (ls->kind != LS_NONBLOCKING)
        cross_post(ls->kind);
}

/* A copy or memset the physical stream refused ran on the application's stream instead (ds_launch_retry joined the
 * physical stream first): the stream's next kernel must wait for it. Kernels of the stream stay confined. */
void ds_work_ran_on_app_stream(CUstream s, int per_thread) {
    struct lstream *ls = lstream_find(app_handle(s, per_thread));
    if (!ls)
        return;
    atomic_store_explicit(&ls->need_in, 1, memory_order_release);
    if (ls->kind != LS_NONBLOCKING)
        cross_post(ls->kind);
}

/* Where a graph launched now must run: the green context the launch was bound to, or every SM (the primary
 * context) under a full grant. False when graphs are left as they are (no split learnt, temporal mode, a stream
 * that cannot be confined). */
bool ds_coro_graph_target(CUcontext *ctx, unsigned *idx) {
    struct lstream *ls = t_pending;
    if (ls) {
        struct gctx *c = atomic_load_explicit(&ls->bound, memory_order_acquire);
        if (!c)
            return false;
        *ctx = c->cu;
        *idx = c->idx;
        return true;
    }
    CUcontext primary = primary_ctx();
    if (!primary || atomic_load_explicit(&g_mode, memory_order_relaxed) != DS_MODE_SPATIAL ||
        atomic_load_explicit(&g_cur, memory_order_acquire) != NULL)
        return false;
    *ctx = primary;
    *idx = DS_CTX_PRIMARY;
    return true;
}

/* The index of the green context a graph kernel node names (DS_CTX_PRIMARY: the primary context, -1: another). */
int ds_coro_ctx_index(CUcontext cu) {
    if (cu == NULL || cu == primary_ctx())
        return DS_CTX_PRIMARY;
    unsigned n = atomic_load_explicit(&g_nctx, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (g_ctxs[i].cu == cu)
            return (int)i;
    return -1;
}

/* The library's own stream in green context idx (re-making graphs by replay). */
CUstream ds_coro_private_stream(unsigned idx) {
    if (idx >= atomic_load_explicit(&g_nctx, memory_order_acquire))
        return NULL;
    struct gctx *c = &g_ctxs[idx];
    pthread_mutex_lock(&g_lock);
    if (!c->priv && ds_real.cuGreenCtxStreamCreate(&c->priv, c->g, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS)
        c->priv = NULL;
    CUstream s = c->priv;
    pthread_mutex_unlock(&g_lock);
    return s;
}
