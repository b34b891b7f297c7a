/*
 * ds_pool.c — the green-context pool. The GPU's SMs are split into groups once (cuDevSmResourceSplitByCount, the
 * same split the scheduler publishes in the table), and a grant names a set of groups; its green context is made
 * once and cached (at most DS_MAX_GCTX per process, never destroyed: logical streams keep physical streams in them).
 *
 * The SMs the split leaves over (12 of an H100's 132 at 8 SMs a group) run with the last group: its contexts are
 * made from that group and the remainder together (the table keeps publishing the split as the driver made it, groups
 * and remainder; status shows the remainder in the last group). Without that, every grant short of the whole GPU left them idle
 * (a trainer beside a latency-critical partition ran on 56 SMs instead of 68). Measured on the H100 without DetShare
 * (integration/gpu/remainder.sh): descriptors of groups plus the remainder make green contexts of exactly those SMs,
 * with and without MPS, and kernels with thread-block clusters of 2 launch on them. Should a driver refuse it, the
 * last group's contexts are made without the remainder (logged once) and those SMs stay idle as before.
 *
 * Green contexts for new grants are made by a helper thread while launches use the largest cached context inside
 * the grant (cuGreenCtxCreate waits for the process's in-flight work; measured on the H100, it does not hold up
 * other threads' launches); only a grant with nothing cached inside it makes its context on the launch path.
 *
 * Concurrency: g_pool_lock guards learning the split, adding contexts and their private streams; readers on the
 * launch path and the helper thread read without it what was published with a release store (g_ngroups: the split,
 * g_nctx: the contexts below it, each written once before it is counted).
 */
#include "ds_pool.h"

#include "ds_driver.h"
#include "ds_process.h"

#include <string.h>
#include <sys/mman.h>

#define MAX_GROUPS DS_MAX_SM_GROUPS

static pthread_mutex_t g_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ds_gctx g_ctxs[DS_MAX_GCTX];
static atomic_uint g_nctx;
static CUdevResource g_groups[MAX_GROUPS];
static CUdevResource g_rem;              /* the split's remainder: part of the last group (g_rem.sm.smCount may be 0) */
static atomic_int g_rem_refused;         /* a driver refused a context with the remainder: leave it out from then on */
/* The split is learnt once (g_pool_lock held): g_groups, g_rem, g_dev and g_primary are written before g_ngroups is
 * published with a release store and never change afterwards, so a reader that loads g_ngroups != 0 with acquire
 * (ds_pool_groups) may read them without a lock (the launch path, the green-context thread). */
static atomic_uint g_ngroups;            /* 0 until the split is learnt */
static int g_split_failed;
static int g_dev;
static CUcontext g_primary;              /* the context current when the split was learnt */
static struct ds_gctx *g_last_nonempty;  /* the last grant's context that had groups (g_pool_lock) */

void ds_pool_lock(void) { pthread_mutex_lock(&g_pool_lock); }
void ds_pool_unlock(void) { pthread_mutex_unlock(&g_pool_lock); }

unsigned ds_pool_groups(void) { return atomic_load_explicit(&g_ngroups, memory_order_acquire); }
CUcontext ds_pool_primary(void) { return ds_pool_groups() ? g_primary : NULL; }

/* ---------------------------------------------------------------------------------------------------------------
 * The split and green contexts (slow path, g_pool_lock held)
 * ------------------------------------------------------------------------------------------------------------- */
static void publish_split(unsigned min, unsigned align, unsigned nb);

static bool learn_split_locked(void) {
    if (ds_pool_groups())
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
    g_rem = rem;
    if (split_state == DS_SPLIT_UNKNOWN)
        publish_split(min, all.sm.smCoscheduledAlignment ? all.sm.smCoscheduledAlignment : min, nb);
    g_dev = dev;
    if (!ds_real.cuCtxGetCurrent || ds_real.cuCtxGetCurrent(&g_primary) != CUDA_SUCCESS)
        g_primary = NULL;
    atomic_store_explicit(&g_ngroups, nb, memory_order_release); /* publishes g_groups, g_rem, g_dev, g_primary */
    g_split_failed = 0;
    DS_LOG(DS_LOG_INFO, "split: %u groups of %u SMs, the last with the %u SMs left over (%u SMs on the device)", nb,
           g_groups[0].sm.smCount, rem.sm.smCount, all.sm.smCount);
    return true;
}

/* Host tenants (`detshare run`, root on the host) publish the split they learnt when nobody has (the same CAS
 * protocol as internal/table PublishSplit). Containers map the table read-only and leave it to the scheduler. */
static void publish_split(unsigned min, unsigned align, unsigned nb) {
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
        g->remainder_sms = g_rem.sm.smCount; /* run with the last group (gctx_make) */
        for (unsigned i = 0; i < DS_MAX_SM_GROUPS; i++)
            g->group_sms[i] = i < nb ? g_groups[i].sm.smCount : 0;
        __atomic_store_n(&g->n_groups, nb, __ATOMIC_RELAXED);
        __atomic_store_n(&g->split_state, DS_SPLIT_PUBLISHED, __ATOMIC_RELEASE);
        DS_LOG(DS_LOG_INFO, "published the split of GPU %d: %u groups, the last with the %u SMs left over",
               ds_process.tenant->gpu, nb, g_rem.sm.smCount);
    }
    munmap(m, DS_TABLE_SIZE);
}

static struct ds_gctx *gctx_find_locked(uint64_t mask) {
    unsigned n_ctx = atomic_load_explicit(&g_nctx, memory_order_relaxed);
    for (unsigned i = 0; i < n_ctx; i++)
        if (g_ctxs[i].mask == mask)
            return &g_ctxs[i];
    return NULL;
}

/* The cached green context with the most groups inside mask (NULL if none): what launches may use while the
 * context of mask itself is being made, without running anywhere outside the grant. */
static struct ds_gctx *largest_cached_subset_locked(uint64_t mask) {
    struct ds_gctx *best = NULL;
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
static CUresult gctx_create(CUdevResource *res, unsigned n, CUgreenCtx *g, CUcontext *cu) {
    CUstreamCaptureMode m = ds_relaxed_begin();
    CUdevResourceDesc desc = NULL;
    CUresult r = ds_real.cuDevResourceGenerateDesc(&desc, res, n);
    if (r == CUDA_SUCCESS)
        r = ds_real.cuGreenCtxCreate(g, desc, g_dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (r == CUDA_SUCCESS) {
        r = ds_real.cuCtxFromGreenCtx(cu, *g);
        if (r != CUDA_SUCCESS && ds_real.cuGreenCtxDestroy)
            ds_real.cuGreenCtxDestroy(*g);
    }
    ds_relaxed_end(m);
    return r;
}

static CUresult gctx_make(uint64_t mask, CUgreenCtx *g, CUcontext *cu) {
    CUdevResource res[MAX_GROUPS + 1];
    unsigned n = 0, ngroups = ds_pool_groups();
    for (unsigned i = 0; i < ngroups; i++)
        if (mask & (1ull << i))
            res[n++] = g_groups[i];
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    bool with_rem = ngroups && (mask & (1ull << (ngroups - 1))) && g_rem.sm.smCount &&
                    !atomic_load_explicit(&g_rem_refused, memory_order_relaxed);
    if (!with_rem)
        return gctx_create(res, n, g, cu);
    res[n] = g_rem;
    CUresult r = gctx_create(res, n + 1, g, cu);
    if (r == CUDA_SUCCESS)
        return r;
    if (!atomic_exchange(&g_rem_refused, 1))
        DS_LOG(DS_LOG_WARN, "green context with the %u SMs left over by the split: %d; they stay idle", g_rem.sm.smCount,
               r);
    return gctx_create(res, n, g, cu);
}

static struct ds_gctx *gctx_insert_locked(uint64_t mask, CUgreenCtx g, CUcontext cu) {
    unsigned n_ctx = atomic_load_explicit(&g_nctx, memory_order_relaxed);
    if (n_ctx >= DS_MAX_GCTX) {
        DS_LOG(DS_LOG_WARN, "more than %u distinct grants in one process; kernels of new ones run unconfined",
               DS_MAX_GCTX);
        return NULL;
    }
    struct ds_gctx *c = &g_ctxs[n_ctx];
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

/* The green context of mask, made here if it is not cached (g_pool_lock held). */
static struct ds_gctx *gctx_for_locked(uint64_t mask) {
    struct ds_gctx *c = gctx_find_locked(mask);
    if (c)
        return c;
    if (atomic_load_explicit(&g_nctx, memory_order_relaxed) >= DS_MAX_GCTX)
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
static void (*g_mk_made)(void); /* under g_mk_lock: called after a context was made (ds_pool_select_locked) */

static bool mk_failed_locked(uint64_t mask) {
    for (unsigned i = 0; i < g_mk_nfailed; i++)
        if (g_mk_failed[i] == mask)
            return true;
    return false;
}

static void *maker(void *arg) {
    (void)arg;
    ds_depth++; /* the library's own driver calls */
    (void)ds_relaxed_begin();
    CUcontext primary = ds_pool_primary();
    if (primary && ds_real.cuCtxSetCurrent)
        ds_real.cuCtxSetCurrent(primary);
    for (;;) {
        pthread_mutex_lock(&g_mk_lock);
        while (!g_mk_n)
            pthread_cond_wait(&g_mk_cond, &g_mk_lock);
        uint64_t mask = g_mk_queue[0]; /* stays queued until made, so it is not asked for twice */
        pthread_mutex_unlock(&g_mk_lock);

        pthread_mutex_lock(&g_pool_lock);
        bool have = gctx_find_locked(mask) != NULL;
        pthread_mutex_unlock(&g_pool_lock);
        CUresult r = CUDA_SUCCESS;
        if (!have) {
            CUgreenCtx g = NULL;
            CUcontext cu = NULL;
            uint64_t t0 = ds_now_ns();
            r = gctx_make(mask, &g, &cu);
            pthread_mutex_lock(&g_pool_lock);
            if (r == CUDA_SUCCESS && (gctx_find_locked(mask) || !gctx_insert_locked(mask, g, cu)))
                ds_real.cuGreenCtxDestroy(g); /* made meanwhile on the launch path, or the table is full */
            pthread_mutex_unlock(&g_pool_lock);
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
        void (*made)(void) = g_mk_made;
        pthread_mutex_unlock(&g_mk_lock);
        if (made)
            made(); /* the next launch looks at the grant again */
    }
    return NULL;
}

/* Asks the maker for mask's green context; false when it cannot (queue full, thread not started, failed before). */
static bool mk_request(uint64_t mask, void (*made)(void)) {
    bool ok = false;
    pthread_mutex_lock(&g_mk_lock);
    g_mk_made = made;
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

/* ---------------------------------------------------------------------------------------------------------------
 * What a grant binds to
 * ------------------------------------------------------------------------------------------------------------- */
/* The first launch, copy or memset of a process may come while the application captures (PyTorch's first CUDA graph
 * can be its first GPU work): learning the split and making a green context are potentially unsafe calls that
 * invalidate a global- or thread-local-mode capture (the H100 returned CUDA_ERROR_STREAM_CAPTURE_INVALIDATED for a
 * memset captured as a process's first work, conformance c15), so this thread is in relaxed capture mode here. */
static struct ds_gctx *select_locked(uint64_t groups, void (*made)(void), bool remember);
struct ds_gctx *ds_pool_select_locked(uint64_t groups, void (*made)(void)) {
    CUstreamCaptureMode m = ds_relaxed_begin();
    struct ds_gctx *cur = select_locked(groups, made, true);
    ds_relaxed_end(m);
    return cur;
}

struct ds_gctx *ds_pool_select_part_locked(uint64_t groups, void (*made)(void)) {
    if (!groups)
        return NULL;
    CUstreamCaptureMode m = ds_relaxed_begin();
    struct ds_gctx *c = select_locked(groups, made, false);
    ds_relaxed_end(m);
    return c;
}

static struct ds_gctx *select_locked(uint64_t groups, void (*made)(void), bool remember) {
    struct ds_gctx *cur = NULL;
    if (!learn_split_locked())
        return NULL;
    unsigned ng = ds_pool_groups();
    uint64_t every = ng >= 64 ? ~0ull : (1ull << ng) - 1;
    uint64_t mask = groups & every;
    if (mask == every) {
        cur = NULL; /* every group: launches and captures stay on the application's streams, all SMs */
    } else if (mask) {
        cur = gctx_find_locked(mask);
        if (!cur) {
            struct ds_gctx *sub = largest_cached_subset_locked(mask);
            if (sub && mk_request(mask, made))
                cur = sub; /* the maker brings mask's own context; until then a part of the grant */
        }
        if (!cur)
            cur = gctx_for_locked(mask); /* nothing inside the grant is cached: made here */
        if (cur && remember)
            g_last_nonempty = cur;
    } else {
        cur = g_last_nonempty; /* no SMs granted: launches wait for a grant (ds_grant_wait_sms) */
    }
    return cur;
}

/* The index of the green context a graph kernel node names (DS_CTX_PRIMARY: the primary context, -1: another). */
int ds_pool_ctx_index(CUcontext cu) {
    if (cu == NULL || cu == ds_pool_primary())
        return DS_CTX_PRIMARY;
    unsigned n = atomic_load_explicit(&g_nctx, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (g_ctxs[i].cu == cu)
            return (int)i;
    return -1;
}

/* The library's own stream in green context idx (re-making graphs by replay). */
CUstream ds_pool_private_stream(unsigned idx) {
    if (idx >= atomic_load_explicit(&g_nctx, memory_order_acquire))
        return NULL;
    struct ds_gctx *c = &g_ctxs[idx];
    pthread_mutex_lock(&g_pool_lock);
    if (!c->priv) {
        CUstreamCaptureMode m = ds_relaxed_begin(); /* a graph may be launched inside an application's capture */
        if (ds_real.cuGreenCtxStreamCreate(&c->priv, c->g, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS)
            c->priv = NULL;
        ds_relaxed_end(m);
    }
    CUstream s = c->priv;
    pthread_mutex_unlock(&g_pool_lock);
    return s;
}

/* fork (lock order in ds_init.c): the pool lock, then the maker's queue lock. */
void ds_pool_fork_lock(void) {
    pthread_mutex_lock(&g_pool_lock);
    pthread_mutex_lock(&g_mk_lock);
}

void ds_pool_fork_unlock(void) {
    pthread_mutex_unlock(&g_mk_lock);
    pthread_mutex_unlock(&g_pool_lock);
}

/* In the child: the green-context thread is not there, so its lock and queue start afresh (its condition variable
 * may have had that thread as a waiter); a later grant starts a new one. */
void ds_pool_child(void) {
    pthread_mutex_init(&g_mk_lock, NULL);
    pthread_cond_init(&g_mk_cond, NULL);
    g_mk_n = 0;
    g_mk_started = 0;
    pthread_mutex_unlock(&g_pool_lock);
}
