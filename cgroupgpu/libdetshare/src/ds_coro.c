/*
 * ds_coro.c — GPU coroutines: every stream the application launches on is a logical stream; its kernels run on a
 * physical stream of a green context built over the SM groups the scheduler granted to the tenant, and move to a
 * new one at the next kernel boundary after the grant changes.
 *
 * Ordering (DESIGN.md §1, notes §3.3): a redirected launch is wrapped in two event edges,
 *     record e_in on the application stream -> physical stream waits e_in -> kernel on the physical stream
 *     -> record e_out on the physical stream -> application stream waits e_out.
 * The application stream therefore keeps every CUDA semantic by construction (later copies, events, host
 * functions, stream/context/event synchronisation, legacy and per-thread default streams, blocking vs
 * non-blocking), whatever other calls the application makes on it, and a rebinding needs nothing more: the new
 * physical stream waits for the application stream, which already waited for the old one. Graph capture on an
 * application stream captures the kernels on the physical stream, i.e. in the green context: captured graphs are
 * confined to the grant. Streams of green contexts the application made itself are redirected like any other.
 * Kernels, configurations and arguments are never changed.
 *
 * Fast path: one acquire load of grant_epoch compared with the cached epoch, one load of the current binding, a
 * lock-free hash probe for the logical stream. When the grant covers every group of the split the launch goes to
 * the application stream untouched (solo tenants pay nothing but the loads). Slow paths (new grant, first launch on
 * a stream, green context creation) take g_lock.
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
    unsigned idx;
    CUstream priv; /* the library's own stream in it (graph copies) */
};

struct lstream {
    CUstream app;                 /* the application's handle (CU_STREAM_LEGACY / _PER_THREAD for the defaults) */
    CUevent e_in, e_out;
    _Atomic(struct gctx *) bound; /* green context phys belongs to */
    _Atomic(CUstream) phys;
    CUstream phys_by_ctx[MAX_GCTX];
    atomic_int unconfinable;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint g_epoch_seen = UINT32_MAX;
static _Atomic(struct gctx *) g_cur;     /* NULL: launch on the application stream */
static atomic_uint g_mode;               /* grant mode of the current grant */
static atomic_int g_empty;               /* spatial grant without any group: launches wait for SMs */
static atomic_int g_ungranted;           /* no grant published yet while a scheduler is alive */
static bool scheduler_alive(void);
static struct gctx g_ctxs[MAX_GCTX];
static unsigned g_nctx;
static CUdevResource g_groups[MAX_GROUPS];
static unsigned g_ngroups;               /* 0 until the split is learnt */
static int g_split_failed;
static int g_dev;
static struct gctx *g_last_nonempty;
static atomic_int g_full;               /* the spatial grant holds every group of the split */
static _Atomic(struct gctx *) g_full_ctx; /* green context over every group, made at the first capture */
atomic_int ds_capturing;

/* lock-free lookup: keys are written once (under g_lock) and never removed */
static _Atomic(uintptr_t) g_keys[N_LSLOTS];
static _Atomic(struct lstream *) g_vals[N_LSLOTS];
static __thread struct lstream *t_ptds; /* this thread's per-thread default stream */
static __thread struct lstream *t_pending;
static __thread CUstream t_pending_phys;

static uint64_t env_ms(const char *name, uint64_t def) {
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || x == 0 || x > 3600000) {
        DS_LOG(DS_LOG_WARN, "%s=%s: allowed 1..3600000 (milliseconds); using %llu", name, v,
               (unsigned long long)def);
        return def;
    }
    return x;
}

/* ---------------------------------------------------------------------------------------------------------------
 * The split and green contexts (slow path, g_lock held)
 * ------------------------------------------------------------------------------------------------------------- */
static void publish_split(unsigned min, unsigned align, unsigned nb, const CUdevResource *rem);

static bool learn_split_locked(void) {
    if (g_ngroups)
        return true;
    if (g_split_failed)
        return false;
    g_split_failed = 1;
    if (!ds_real.cuDeviceGetDevResource || !ds_real.cuDevSmResourceSplitByCount || !ds_real.cuDevResourceGenerateDesc ||
        !ds_real.cuGreenCtxCreate || !ds_real.cuGreenCtxStreamCreate || !ds_real.cuEventCreate ||
        !ds_real.cuEventRecord || !ds_real.cuStreamWaitEvent) {
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
    const struct ds_gpu *ge = ds_t->gpu_entry;
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
    g_ngroups = nb;
    g_split_failed = 0;
    DS_LOG(DS_LOG_INFO, "split: %u groups of %u SMs (%u SMs on the device)", nb, g_groups[0].sm.smCount,
           all.sm.smCount);
    return true;
}

/* Host tenants (`detshare run`, root on the host) publish the split they learnt when nobody has (the same CAS
 * protocol as sched/table PublishSplit). Containers map the table read-only and leave it to the scheduler. */
static void publish_split(unsigned min, unsigned align, unsigned nb, const CUdevResource *rem) {
    if (!(__atomic_load_n(&ds_t->ctr->flags, __ATOMIC_RELAXED) & DS_CF_HOST_TENANT))
        return;
    const char *path = ds_t->table_path;
    void *m = NULL;
    if (ds_map_file(path, DS_TABLE_SIZE, 1, &m) != 0) {
        DS_LOG(DS_LOG_INFO, "table %s not writable here: the scheduler publishes the split", path);
        return;
    }
    struct ds_gpu *g = (struct ds_gpu *)((char *)m + DS_GPUS_OFFSET) + ds_t->gpu;
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
        DS_LOG(DS_LOG_INFO, "published the split of GPU %d: %u groups, %u SMs left over", ds_t->gpu, nb,
               rem->sm.smCount);
    }
    munmap(m, DS_TABLE_SIZE);
}

static struct gctx *gctx_for_locked(uint64_t mask) {
    for (unsigned i = 0; i < g_nctx; i++)
        if (g_ctxs[i].mask == mask)
            return &g_ctxs[i];
    if (g_nctx >= MAX_GCTX) {
        DS_LOG(DS_LOG_WARN, "more than %u distinct grants in one process; reusing the first green context", MAX_GCTX);
        return NULL;
    }
    CUdevResource res[MAX_GROUPS];
    unsigned n = 0;
    for (unsigned i = 0; i < g_ngroups; i++)
        if (mask & (1ull << i))
            res[n++] = g_groups[i];
    if (!n)
        return NULL;
    CUdevResourceDesc desc = NULL;
    CUresult r = ds_real.cuDevResourceGenerateDesc(&desc, res, n);
    CUgreenCtx g = NULL;
    if (r == CUDA_SUCCESS)
        r = ds_real.cuGreenCtxCreate(&g, desc, g_dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (r != CUDA_SUCCESS) {
        DS_LOG(DS_LOG_WARN, "green context for groups %#llx: %d; kernels of this grant run unconfined",
               (unsigned long long)mask, r);
        return NULL;
    }
    struct gctx *c = &g_ctxs[g_nctx];
    c->mask = mask;
    c->g = g;
    c->idx = g_nctx++;
    DS_LOG(DS_LOG_DEBUG, "green context %u for groups %#llx", c->idx, (unsigned long long)mask);
    return c;
}

/* While a capture is in progress and the grant holds every group, kernels are still recorded in a green context
 * (of every group), so that the graph stays confined after the grant shrinks. */
/* DETSHARE_CONFINE_FULL_CAPTURE=0 leaves captures made under a full grant in the primary context: such a graph
 * replays like a native one but runs on every SM, even after the grant shrinks, unless the library can re-make it
 * for the new grant (kernel-only graphs). A diagnostic and an opt-out for solo tenants; the default confines. */
static atomic_int g_confine_full_capture = -1;

static struct gctx *capture_ctx(void) {
    int confine = atomic_load_explicit(&g_confine_full_capture, memory_order_relaxed);
    if (DS_UNLIKELY(confine < 0)) {
        const char *v = getenv("DETSHARE_CONFINE_FULL_CAPTURE");
        confine = !(v && !strcmp(v, "0"));
        atomic_store(&g_confine_full_capture, confine);
    }
    if (!confine)
        return NULL;
    struct gctx *c = atomic_load_explicit(&g_full_ctx, memory_order_acquire);
    if (c)
        return c;
    pthread_mutex_lock(&g_lock);
    c = atomic_load(&g_full_ctx);
    if (!c && g_ngroups) {
        c = gctx_for_locked(g_ngroups >= 64 ? ~0ull : (1ull << g_ngroups) - 1);
        atomic_store_explicit(&g_full_ctx, c, memory_order_release);
    }
    pthread_mutex_unlock(&g_lock);
    return c;
}

/* A new grant epoch: read the grant (seqlock) and choose what launches bind to. */
static void regrant(uint32_t ep) {
    pthread_mutex_lock(&g_lock);
    if (atomic_load(&g_epoch_seen) == ep) {
        pthread_mutex_unlock(&g_lock);
        return;
    }
    struct ds_grant gr;
    if (ds_grant_read(ds_t->ctr, &gr) != 0) {
        /* a leader died mid-write: keep the previous grant (fail-static) and look again at the next launch */
        pthread_mutex_unlock(&g_lock);
        return;
    }
    struct gctx *cur = NULL;
    if (gr.mode == DS_MODE_SPATIAL && learn_split_locked()) {
        uint64_t every = g_ngroups >= 64 ? ~0ull : (1ull << g_ngroups) - 1;
        uint64_t mask = gr.groups & every;
        if (mask == every) {
            cur = NULL; /* every group: nothing to confine (but captures are, see capture_ctx) */
        } else if (mask) {
            cur = gctx_for_locked(mask);
            if (cur)
                g_last_nonempty = cur;
        } else {
            cur = g_last_nonempty; /* no SMs granted: launches wait for a grant, see wait_for_sms */
        }
    }
    uint64_t all = g_ngroups >= 64 ? ~0ull : (1ull << g_ngroups) - 1;
    bool spatial = gr.mode == DS_MODE_SPATIAL && g_ngroups;
    /* A tenant the scheduler has not answered yet must not run on the whole GPU beside latency-critical
     * neighbours: while a live scheduler owes it its first grant, launches wait for it (bounded, see wait_for_sms).
     * Without a live scheduler there is nothing to wait for (fail-open). */
    bool ungranted = gr.mode == DS_MODE_NONE && scheduler_alive();
    atomic_store(&g_ungranted, ungranted);
    atomic_store(&g_empty, (spatial && !(gr.groups & all)) || ungranted);
    atomic_store(&g_full, spatial && (gr.groups & all) == all);
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

static struct lstream *lstream_new(CUstream app) {
    struct lstream *ls = calloc(1, sizeof *ls);
    if (!ls)
        return NULL;
    ls->app = app;
    if (ds_real.cuEventCreate(&ls->e_in, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
        ds_real.cuEventCreate(&ls->e_out, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        free(ls);
        return NULL;
    }
    return ls;
}

static struct lstream *lstream_get(CUstream app) {
    if (app == CU_STREAM_PER_THREAD) {
        if (DS_LIKELY(t_ptds != NULL))
            return t_ptds;
        pthread_mutex_lock(&g_lock);
        t_ptds = lstream_new(app);
        pthread_mutex_unlock(&g_lock);
        return t_ptds;
    }
    uintptr_t key = (uintptr_t)app;
    unsigned s = slot_of(key);
    for (unsigned n = 0; n < N_LSLOTS; n++, s = (s + 1) & (N_LSLOTS - 1)) {
        uintptr_t k = atomic_load_explicit(&g_keys[s], memory_order_acquire);
        if (k == key) {
            struct lstream *v = atomic_load_explicit(&g_vals[s], memory_order_acquire);
            if (v)
                return v;
            break; /* being inserted: take the lock */
        }
        if (k == 0)
            break;
    }
    /* slow path: insert under the lock */
    struct lstream *ls = NULL;
    pthread_mutex_lock(&g_lock);
    s = slot_of(key);
    for (unsigned n = 0; n < N_LSLOTS; n++, s = (s + 1) & (N_LSLOTS - 1)) {
        uintptr_t k = atomic_load_explicit(&g_keys[s], memory_order_acquire);
        if (k == key) {
            ls = atomic_load(&g_vals[s]);
            break;
        }
        if (k == 0) {
            ls = lstream_new(app);
            if (ls) {
                atomic_store_explicit(&g_keys[s], key, memory_order_release);
                atomic_store_explicit(&g_vals[s], ls, memory_order_release);
            }
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (!ls) {
        static atomic_int warned;
        if (!atomic_exchange(&warned, 1))
            DS_LOG(DS_LOG_WARN, "logical stream table full or out of memory: some kernels run unconfined");
    }
    return ls;
}

/* Points ls at a physical stream of c (created once per (logical stream, green context) and kept). */
static bool rebind(struct lstream *ls, struct gctx *c) {
    pthread_mutex_lock(&g_lock);
    bool ok = true;
    if (!ls->phys_by_ctx[c->idx]) {
        CUstream p = NULL;
        /* green streams must be non-blocking; the edges give the application stream's ordering */
        CUresult r = ds_real.cuGreenCtxStreamCreate(&p, c->g, CU_STREAM_NON_BLOCKING, 0);
        if (r != CUDA_SUCCESS) {
            DS_LOG(DS_LOG_WARN, "green stream: %d; this stream runs unconfined", r);
            ok = false;
        } else {
            ls->phys_by_ctx[c->idx] = p;
        }
    }
    if (ok) {
        atomic_store_explicit(&ls->phys, ls->phys_by_ctx[c->idx], memory_order_relaxed);
        atomic_store_explicit(&ls->bound, c, memory_order_release);
    }
    pthread_mutex_unlock(&g_lock);
    return ok;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Temporal mode and empty grants: bounded waits, fail-static
 * ------------------------------------------------------------------------------------------------------------- */
static bool scheduler_alive(void) {
    uint64_t hb = __atomic_load_n(&ds_t->table->sched_heartbeat_ns, __ATOMIC_RELAXED);
    uint64_t now = ds_now_ns();
    return hb && now - hb < env_ms("DETSHARE_SCHED_STALE_MS", 3000) * 1000000ull;
}

static void account_wait(uint64_t ns) {
    struct ds_client_page *pg = ds_t->page;
    __atomic_fetch_add(&pg->queue_delay_ns, ns, __ATOMIC_RELAXED);
    uint64_t m = __atomic_load_n(&pg->queue_delay_max_ns, __ATOMIC_RELAXED);
    while (ns > m && !__atomic_compare_exchange_n(&pg->queue_delay_max_ns, &m, ns, 0, __ATOMIC_RELAXED,
                                                  __ATOMIC_RELAXED)) {
    }
}

static bool holds_token(void) {
    const struct ds_gpu *g = ds_t->gpu_entry;
    return __atomic_load_n(&g->token_holder, __ATOMIC_ACQUIRE) == (uint32_t)ds_t->slot + 1 &&
           __atomic_load_n(&g->token_holder_gen, __ATOMIC_RELAXED) == ds_t->slot_gen;
}

static atomic_int g_unthrottled_warned;

static void wait_for_token(void) {
    const struct ds_gpu *g = ds_t->gpu_entry;
    uint64_t t0 = 0, bound = env_ms("DETSHARE_TOKEN_WAIT_MS", 10000) * 1000000ull;
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
        uint32_t ep = ds_grant_epoch(ds_t->ctr);
        if (ep != atomic_load_explicit(&g_epoch_seen, memory_order_acquire))
            regrant(ep);
    }
    if (t0)
        account_wait(ds_now_ns() - t0);
}

/* Spatial grant with no groups: wait (bounded) for SMs, then run on the last groups held (fail-static). */
static void wait_for_sms(void) {
    const struct ds_container *c = ds_t->ctr;
    uint64_t t0 = ds_now_ns(), bound = atomic_load(&g_ungranted)
                                           ? env_ms("DETSHARE_FIRST_GRANT_WAIT_MS", 1000) * 1000000ull
                                           : env_ms("DETSHARE_GRANT_WAIT_MS", 10000) * 1000000ull;
    for (;;) {
        uint32_t ep = ds_grant_epoch(c);
        if (ep != atomic_load_explicit(&g_epoch_seen, memory_order_acquire))
            regrant(ep);
        if (!atomic_load(&g_empty))
            break;
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
 * 20 ms) and the work of its redirected streams complete. The monitor is started by the first idle->busy
 * transition (a slow path) and polls every few milliseconds; it never touches application streams.
 * ------------------------------------------------------------------------------------------------------------- */
static pthread_once_t g_mon_once = PTHREAD_ONCE_INIT;
static atomic_int g_mon_running;
static _Atomic uint64_t g_busy_since;

static bool streams_drained(void) {
    if (!ds_real.cuEventQuery)
        return true;
    for (unsigned i = 0; i < N_LSLOTS; i++) {
        struct lstream *ls = atomic_load_explicit(&g_vals[i], memory_order_acquire);
        if (ls && atomic_load(&ls->bound) && ds_real.cuEventQuery(ls->e_out) == CUDA_ERROR_NOT_READY)
            return false;
    }
    return true;
}

static void *monitor(void *arg) {
    (void)arg;
    uint64_t idle_ns = env_ms("DETSHARE_IDLE_MS", 20) * 1000000ull;
    uint64_t poll_ns = idle_ns / 4 ? idle_ns / 4 : 1000000ull;
    uint64_t last = 0, last_change = ds_now_ns();
    ds_depth++; /* driver calls made here are the library's own */
    for (;;) {
        struct timespec ts = {(time_t)(poll_ns / 1000000000ull), (long)(poll_ns % 1000000000ull)};
        nanosleep(&ts, NULL);
        struct ds_proc *self = atomic_load_explicit(&ds_self, memory_order_acquire);
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
        __atomic_store_n(&self->queued, 0, __ATOMIC_RELAXED); /* everything submitted has drained */
        if (__atomic_exchange_n(&self->busy, 0, __ATOMIC_ACQ_REL) == 0)
            continue;
        uint64_t since = atomic_load(&g_busy_since);
        if (since && now > since)
            __atomic_fetch_add(&self->busy_ns, now - since, __ATOMIC_RELAXED);
        struct ds_client_page *pg = ds_t->page;
        uint32_t d = __atomic_load_n(&pg->demand, __ATOMIC_RELAXED);
        while (d > 0 && !__atomic_compare_exchange_n(&pg->demand, &d, d - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        }
        if (since && now > since)
            __atomic_fetch_add(&pg->busy_ns, now - since, __ATOMIC_RELAXED);
        __atomic_fetch_add(&pg->demand_seq, 1, __ATOMIC_RELEASE);
        if (d == 1)
            ds_doorbell_ring(ds_t->doorbell);
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

/* fork: the child has no monitor thread; its first busy transition starts one */
void ds_coro_child(void) {
    pthread_once_t fresh = PTHREAD_ONCE_INIT;
    memcpy(&g_mon_once, &fresh, sizeof fresh);
    atomic_store(&g_mon_running, 0);
    t_pending = NULL;
}

static void set_busy(struct ds_proc *self) {
    if (__atomic_exchange_n(&self->busy, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    atomic_store(&g_busy_since, ds_now_ns());
    struct ds_client_page *pg = ds_t->page;
    uint32_t old = __atomic_fetch_add(&pg->demand, 1, __ATOMIC_ACQ_REL);
    if (old == 0)
        __atomic_store_n(&pg->demand_since_ns, ds_now_ns(), __ATOMIC_RELAXED);
    __atomic_fetch_add(&pg->demand_seq, 1, __ATOMIC_RELEASE);
    if (old == 0)
        ds_doorbell_ring(ds_t->doorbell);
    pthread_once(&g_mon_once, monitor_start);
}

/* ---------------------------------------------------------------------------------------------------------------
 * The launch path
 * ------------------------------------------------------------------------------------------------------------- */
CUstream ds_launch_stream(CUstream s, int per_thread) {
    struct ds_proc *self = atomic_load_explicit(&ds_self, memory_order_relaxed);
    if (DS_LIKELY(self != NULL)) {
        __atomic_fetch_add(&self->launches, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&self->queued, 1, __ATOMIC_RELAXED);
        if (DS_UNLIKELY(!__atomic_load_n(&self->busy, __ATOMIC_RELAXED)))
            set_busy(self);
    }
    __atomic_fetch_add(&ds_t->page->launches, 1, __ATOMIC_RELAXED);

    uint32_t ep = ds_grant_epoch(ds_t->ctr);
    if (DS_UNLIKELY(ep != atomic_load_explicit(&g_epoch_seen, memory_order_acquire)))
        regrant(ep);
    unsigned mode = atomic_load_explicit(&g_mode, memory_order_relaxed);
    if (DS_UNLIKELY(mode == DS_MODE_TEMPORAL) && !holds_token())
        wait_for_token();
    if (DS_UNLIKELY(atomic_load_explicit(&g_empty, memory_order_relaxed)))
        wait_for_sms();
    struct gctx *c = atomic_load_explicit(&g_cur, memory_order_acquire);
    if (DS_LIKELY(c == NULL)) {
        if (DS_LIKELY(!atomic_load_explicit(&ds_capturing, memory_order_relaxed)) ||
            !atomic_load_explicit(&g_full, memory_order_relaxed) || !(c = capture_ctx()))
            return s;
    }
    CUstream app = s;
    if (app == NULL)
        app = per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    struct lstream *ls = lstream_get(app);
    if (DS_UNLIKELY(!ls || atomic_load_explicit(&ls->unconfinable, memory_order_relaxed)))
        return s;
    if (DS_UNLIKELY(atomic_load_explicit(&ls->bound, memory_order_acquire) != c) && !rebind(ls, c))
        return s;
    CUstream phys = atomic_load_explicit(&ls->phys, memory_order_relaxed);
    if (ds_real.cuEventRecord(ls->e_in, app) != CUDA_SUCCESS ||
        ds_real.cuStreamWaitEvent(phys, ls->e_in, 0) != CUDA_SUCCESS)
        return s;
    t_pending = ls;
    t_pending_phys = phys;
    return phys;
}

bool ds_launch_retry(CUresult r) {
    struct lstream *ls = t_pending;
    t_pending = NULL;
    /* the kernel did not go on the physical stream (e.g. a function of a context green contexts cannot use): the
     * caller runs it where the application asked */
    return ls != NULL && r != CUDA_ERROR_NOT_INITIALIZED && r != CUDA_ERROR_DEINITIALIZED;
}

void ds_launch_unconfinable(CUstream s, int per_thread) {
    CUstream app = s ? s : (per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY);
    struct lstream *ls = lstream_get(app);
    if (ls && !atomic_exchange(&ls->unconfinable, 1))
        DS_LOG(DS_LOG_WARN, "a kernel could not run on its green stream; stream %p runs unconfined", (void *)s);
}

void ds_launch_done(void) {
    struct lstream *ls = t_pending;
    if (!ls)
        return;
    t_pending = NULL;
    if (ds_real.cuEventRecord(ls->e_out, t_pending_phys) == CUDA_SUCCESS)
        ds_real.cuStreamWaitEvent(ls->app, ls->e_out, 0);
}

/* The green context captures are recorded in right now (see ds_graph.c). */
const void *ds_coro_capture_binding(void) {
    const void *c = atomic_load_explicit(&g_cur, memory_order_acquire);
    return c ? c : atomic_load_explicit(&g_full_ctx, memory_order_acquire);
}

/* The green context of the launch being made on this thread, NULL when it is not redirected. */
const void *ds_coro_pending_binding(unsigned *idx) {
    struct lstream *ls = t_pending;
    struct gctx *c = ls ? atomic_load_explicit(&ls->bound, memory_order_acquire) : NULL;
    if (c && idx)
        *idx = c->idx;
    return c;
}

CUstream ds_coro_private_stream(const void *gc) {
    struct gctx *c = (struct gctx *)(uintptr_t)gc;
    pthread_mutex_lock(&g_lock);
    if (!c->priv && ds_real.cuGreenCtxStreamCreate(&c->priv, c->g, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS)
        c->priv = NULL;
    CUstream s = c->priv;
    pthread_mutex_unlock(&g_lock);
    return s;
}
