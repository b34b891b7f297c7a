/*
 * ds_streams.c — logical streams (GPU coroutines): every stream the application launches on is a logical stream;
 * its kernels run on a physical stream of a green context built over the SM groups the scheduler granted to the
 * tenant, and move to a new one at the next kernel boundary after the grant changes. Kernels, configurations and
 * arguments are never changed.
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
 * no syscall. Edges and rebinding take the logical stream's lock, registering or forgetting a logical stream
 * g_reg_lock. The grant (ds_grant.c) says which green context (ds_pool.c) launches bind to.
 *
 * The stream table (issue 28). What costs O(streams) — a free, a context synchronisation, the demand monitor, the
 * legacy-stream rules, fork — walks the pool of logical streams, and the pool holds only what is alive: when the
 * application destroys a stream, its entry leaves the hash and its logical stream goes back to the pool, where the
 * next new stream takes it (events, lock, physical streams and all). So the walk is as long as the most streams
 * ever alive at once, not as the streams ever created, and there is no ceiling on the latter (the table used to
 * keep every handle and stop at 4096: later streams ran outside the grant). A destroyed handle may come back from
 * the driver for a new stream: it is a new key, looked up and learnt afresh.
 *
 * What makes reclaiming safe without a lock on the lookup:
 *   - logical streams are never freed, only reused (the pool's chunks live as long as the process), so a walker
 *     that read a pointer just before its stream was destroyed still touches valid memory; what it can do with it
 *     is a join under the stream's lock, which is harmless on a stream with nothing pending or on the new stream
 *     that reused it. Fields a walker reads without the lock (app, kind, phys, pending, unconfined) are atomic;
 *   - the hash is read under a sequence count (g_tab_seq): a removal moves other entries (backward-shift deletion)
 *     and a growth publishes a new array, both bumping the count, and a lookup that saw it change looks again;
 *   - the RULE relied on: the application does not destroy a stream while another of its threads still launches
 *     on it or names it (CUDA leaves that undefined anyway), so the entry of the stream a launch looks up is not
 *     removed under it, and the logical stream a launch holds is not reused before the launch completes.
 */
#include "ds_streams.h"

#include "ds_driver.h"
#include "ds_gate.h"
#include "ds_grant.h"
#include "ds_narrow.h"
#include "ds_pool.h"
#include "ds_process.h"

#include <stdlib.h>
#include <string.h>

#define LS_CHUNK 64u     /* logical streams per pool chunk */
#define LS_DIR 65536u    /* pool chunks: at most 4 Mi logical streams ALIVE at once (no limit on those ever made) */

enum { LS_NONBLOCKING = 0, LS_BLOCKING = 1, LS_LEGACY = 2 };

struct lstream {
    _Atomic(CUstream) app;        /* the application's handle (CU_STREAM_LEGACY / _PER_THREAD for the defaults) */
    CUevent e_in, e_out;
    pthread_mutex_t lock;         /* edges, rebinding, forgetting a destroyed stream */
    _Atomic(struct ds_gctx *) bound; /* green context phys belongs to; NULL: kernels run on app */
    _Atomic(CUstream) phys;
    CUstream phys_by_ctx[DS_MAX_GCTX];
    atomic_int kind;              /* LS_*: which legacy-stream rules apply */
    int prio;                     /* the application stream's priority, given to its physical streams */
    atomic_int need_in;           /* app got work the physical stream has not waited for */
    atomic_int pending;           /* the physical stream has kernels app has not waited for */
    atomic_int unconfinable;
    atomic_int in_place;          /* capturing into a graph the application made: work stays on app (see below) */
    atomic_int relearn;           /* first seen while capturing: kind and priority are defaults until learn() */
    atomic_int unconfined;        /* work went to app itself (every group granted): drained only when app is */
    atomic_uint seen_order, seen_cross;
    struct ds_gate gate;          /* dispatch gate (ds_gate.c) */
    struct lstream *free_next;    /* in the pool's free list (g_reg_lock) */
};

static pthread_mutex_t g_reg_lock = PTHREAD_MUTEX_INITIALIZER; /* registers and forgets logical streams */
/* The pool: every logical stream (per-thread default streams included) lives in a chunk that is never freed;
 * g_nall counts those handed out so far (the most alive at once), for walks over all of them; g_free (g_reg_lock)
 * holds those whose application stream was destroyed, for the next new stream. */
static _Atomic(struct lstream *) g_chunks[LS_DIR];
static atomic_uint g_nall;
static struct lstream *g_free;
/* The hash from application handle to logical stream: open addressing, linear probing, at most half full. Written
 * under g_reg_lock; read without a lock under g_tab_seq (odd while a removal or growth is under way). A replaced
 * array is kept (a lookup may still be reading it): arrays double, so the kept ones add up to less than the one in
 * use, which is sized by the most streams alive at once. */
struct lslot {
    _Atomic(uintptr_t) key; /* 0: empty */
    _Atomic(struct lstream *) val;
};
struct lstab {
    unsigned bits, used;    /* 2^bits slots; used: g_reg_lock */
    struct lslot s[];
};
static _Atomic(struct lstab *) g_tab;
static atomic_uint g_tab_seq;
static atomic_uint g_nblocking; /* a blocking stream was registered (the legacy rules apply from then on) */
static _Atomic(struct lstream *) g_legacy;
static atomic_uint g_order_gen, g_legacy_gen, g_blocking_gen;
static atomic_uint g_nbound; /* logical streams bound to a green context (launches under a full grant unbind them) */
static atomic_int g_strict; /* forced on at run time */
static __thread struct lstream *t_ptds; /* this thread's per-thread default stream */

/* DETSHARE_STRICT_STREAMS=1, or forced on at run time (ds_streams_force_strict) */
static bool strict(void) {
    return ds_process.settings.strict_streams || atomic_load_explicit(&g_strict, memory_order_relaxed);
}

void ds_streams_force_strict(const char *why) {
    if (!ds_process.settings.strict_streams && atomic_exchange(&g_strict, 1) != 1)
        DS_LOG(DS_LOG_WARN, "%s: every kernel now gets its own event edges (DETSHARE_STRICT_STREAMS behaviour)", why);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Logical streams
 * ------------------------------------------------------------------------------------------------------------- */
static unsigned slot_of(const struct lstab *t, uintptr_t key) {
    return (unsigned)((key * 0x9E3779B97F4A7C15ull) >> (64 - t->bits));
}

/* The i-th logical stream of the pool (i < g_nall). */
static struct lstream *pool_at(unsigned i) {
    return &atomic_load_explicit(&g_chunks[i / LS_CHUNK], memory_order_acquire)[i % LS_CHUNK];
}

/* The logical stream of key in the hash, or NULL. Lock-free: a removal or growth under way makes it look again. */
static struct lstream *tab_find(uintptr_t key) {
    for (;;) {
        unsigned q = atomic_load_explicit(&g_tab_seq, memory_order_acquire);
        struct lstream *ls = NULL;
        struct lstab *t = atomic_load_explicit(&g_tab, memory_order_acquire);
        if (t && !(q & 1)) {
            unsigned mask = (1u << t->bits) - 1;
            for (unsigned i = slot_of(t, key), n = 0; n <= mask; n++, i = (i + 1) & mask) {
                uintptr_t k = atomic_load_explicit(&t->s[i].key, memory_order_acquire);
                if (k == key) {
                    ls = atomic_load_explicit(&t->s[i].val, memory_order_acquire);
                    break;
                }
                if (k == 0)
                    break;
            }
        }
        atomic_thread_fence(memory_order_acquire);
        if (!(q & 1) && atomic_load_explicit(&g_tab_seq, memory_order_relaxed) == q)
            return ls;
    }
}

static void tab_write_begin(void) {
    atomic_store_explicit(&g_tab_seq, atomic_load_explicit(&g_tab_seq, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}
static void tab_write_end(void) {
    atomic_store_explicit(&g_tab_seq, atomic_load_explicit(&g_tab_seq, memory_order_relaxed) + 1,
                          memory_order_release);
}

/* g_reg_lock held: a slot of t for key (absent from t); t has room. */
static void tab_put(struct lstab *t, uintptr_t key, struct lstream *ls) {
    unsigned mask = (1u << t->bits) - 1, i = slot_of(t, key);
    while (atomic_load_explicit(&t->s[i].key, memory_order_relaxed))
        i = (i + 1) & mask;
    atomic_store_explicit(&t->s[i].val, ls, memory_order_release); /* a reader that sees the key sees the value */
    atomic_store_explicit(&t->s[i].key, key, memory_order_release);
    t->used++;
}

/* g_reg_lock held: key (absent) maps to ls from now on; false when out of memory. */
static bool tab_insert(uintptr_t key, struct lstream *ls) {
    struct lstab *t = atomic_load_explicit(&g_tab, memory_order_relaxed);
    if (!t || (t->used + 1) * 2 > (1u << t->bits)) {
        unsigned bits = t ? t->bits + 1 : 6;
        if (bits > 30)
            return false;
        struct lstab *n = calloc(1, sizeof *n + ((size_t)1 << bits) * sizeof n->s[0]);
        if (!n)
            return false;
        n->bits = bits;
        for (unsigned i = 0; t && i < (1u << t->bits); i++) {
            uintptr_t k = atomic_load_explicit(&t->s[i].key, memory_order_relaxed);
            if (k)
                tab_put(n, k, atomic_load_explicit(&t->s[i].val, memory_order_relaxed));
        }
        tab_write_begin();
        atomic_store_explicit(&g_tab, n, memory_order_release);
        tab_write_end();
        t = n; /* the old array is kept: a lookup may be reading it */
    }
    tab_put(t, key, ls);
    return true;
}

/* g_reg_lock held: forgets key if it maps to ls (backward-shift deletion: no tombstones, so a lookup of a missing
 * handle stops at the first empty slot however many streams came and went). */
static bool tab_remove(uintptr_t key, const struct lstream *ls) {
    struct lstab *t = atomic_load_explicit(&g_tab, memory_order_relaxed);
    if (!t)
        return false;
    unsigned mask = (1u << t->bits) - 1, i = slot_of(t, key);
    for (;; i = (i + 1) & mask) {
        uintptr_t k = atomic_load_explicit(&t->s[i].key, memory_order_relaxed);
        if (k == 0)
            return false;
        if (k == key)
            break;
    }
    if (atomic_load_explicit(&t->s[i].val, memory_order_relaxed) != ls)
        return false;
    tab_write_begin();
    for (unsigned j = i;;) {
        j = (j + 1) & mask;
        uintptr_t k = atomic_load_explicit(&t->s[j].key, memory_order_relaxed);
        if (k == 0)
            break;
        unsigned h = slot_of(t, k);
        /* an entry whose home lies cyclically in (i, j] stays where it is */
        if (i <= j ? (i < h && h <= j) : (i < h || h <= j))
            continue;
        atomic_store_explicit(&t->s[i].val, atomic_load_explicit(&t->s[j].val, memory_order_relaxed),
                              memory_order_relaxed);
        atomic_store_explicit(&t->s[i].key, k, memory_order_relaxed);
        i = j;
    }
    atomic_store_explicit(&t->s[i].key, 0, memory_order_relaxed);
    atomic_store_explicit(&t->s[i].val, NULL, memory_order_relaxed);
    t->used--;
    tab_write_end();
    return true;
}

static CUstream app_handle(CUstream s, int per_thread) {
    if (s == NULL)
        return per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    return s;
}

static uint64_t capture_of(CUstream s);

/* What the application's stream is: which legacy-stream rules apply, and the priority its physical streams get.
 * Never asked of a stream that is capturing: on the H100 (driver 580) cuStreamGetFlags on a capturing stream
 * invalidates its capture even in relaxed capture mode (integration/gpu/capture_trace.sh found it: a capture that
 * was a process's first GPU work, conformance c14/c15, issue 28). Such a stream is taken as blocking (the
 * conservative kind) at priority 0 until the capture is over (ds_streams_capture_ended learns it then); streams are
 * learnt before a capture begins on them and before a wait pulls them into one, so this is the rare case. */
static void learn(struct lstream *ls) {
    ls->prio = 0;
    atomic_store_explicit(&ls->relearn, 0, memory_order_relaxed);
    if (ls->app == CU_STREAM_LEGACY) {
        ls->kind = LS_LEGACY;
        return;
    }
    ls->kind = LS_BLOCKING; /* the per-thread default stream, and any stream whose flags cannot be read */
    if (ls->app == CU_STREAM_PER_THREAD)
        return;
    if (atomic_load_explicit(&ds_process.capturing, memory_order_relaxed) && capture_of(ls->app)) {
        atomic_store_explicit(&ls->relearn, 1, memory_order_release);
        return;
    }
    unsigned flags = 0;
    if (ds_real.cuStreamGetFlags && ds_real.cuStreamGetFlags(ls->app, &flags) == CUDA_SUCCESS &&
        (flags & CU_STREAM_NON_BLOCKING))
        ls->kind = LS_NONBLOCKING;
    int p = 0;
    if (ds_real.cuStreamGetPriority && ds_real.cuStreamGetPriority(ls->app, &p) == CUDA_SUCCESS)
        ls->prio = p;
}

/* g_reg_lock held: the legacy-stream rules learn of a new logical stream */
static void register_locked(struct lstream *ls) {
    if (ls->kind == LS_BLOCKING && !atomic_load_explicit(&g_nblocking, memory_order_relaxed))
        atomic_store_explicit(&g_nblocking, 1, memory_order_release);
    else if (ls->kind == LS_LEGACY)
        atomic_store_explicit(&g_legacy, ls, memory_order_release);
}

/* g_reg_lock held: a logical stream for app, from the pool's free list (its events, lock, gate and physical streams
 * kept) or new. It is not in the hash yet. */
static struct lstream *lstream_new(CUstream app) {
    struct lstream *ls = g_free;
    if (ls) {
        g_free = ls->free_next;
        ls->free_next = NULL;
        int prio = ls->prio;
        atomic_store(&ls->app, app);
        CUstreamCaptureMode m = ds_relaxed_begin();
        learn(ls);
        ds_relaxed_end(m);
        if (ls->prio != prio) /* its physical streams were made with the old stream's priority */
            for (unsigned i = 0; i < DS_MAX_GCTX; i++)
                if (ls->phys_by_ctx[i]) {
                    DS_SOP_REAL(cuStreamDestroy_v2)(ls->phys_by_ctx[i]);
                    ls->phys_by_ctx[i] = NULL;
                }
        atomic_store(&ls->unconfinable, 0);
        atomic_store(&ls->in_place, 0);
        atomic_store(&ls->need_in, 1);
        return ls;
    }
    unsigned n = atomic_load_explicit(&g_nall, memory_order_relaxed);
    if (n / LS_CHUNK >= LS_DIR)
        return NULL;
    struct lstream *chunk = atomic_load_explicit(&g_chunks[n / LS_CHUNK], memory_order_relaxed);
    if (!chunk) {
        if (!(chunk = calloc(LS_CHUNK, sizeof *chunk)))
            return NULL;
        atomic_store_explicit(&g_chunks[n / LS_CHUNK], chunk, memory_order_release);
    }
    ls = &chunk[n % LS_CHUNK]; /* zeroed: never handed out */
    atomic_store(&ls->app, app);
    CUstreamCaptureMode m = ds_relaxed_begin();
    bool ok = ds_real.cuEventCreate(&ls->e_in, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
              ds_real.cuEventCreate(&ls->e_out, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
    if (ok)
        learn(ls);
    ds_relaxed_end(m);
    if (!ok) {
        memset(ls, 0, sizeof *ls); /* not handed out: the next new stream tries this one again */
        return NULL;
    }
    pthread_mutex_init(&ls->lock, NULL);
    ds_gate_init(&ls->gate);
    atomic_store(&ls->need_in, 1);
    atomic_store_explicit(&g_nall, n + 1, memory_order_release); /* walkers may lock it from now on */
    return ls;
}

static void table_full_warning(void) {
    static atomic_int warned;
    if (!atomic_exchange(&warned, 1))
        DS_LOG(DS_LOG_WARN, "no memory for a logical stream: some kernels run unconfined");
}

/* The logical stream of an application stream handle (app_handle applied), or NULL if none was made yet. */
static struct lstream *lstream_find(CUstream app) {
    if (app == CU_STREAM_PER_THREAD)
        return t_ptds;
    return tab_find((uintptr_t)app);
}

static struct lstream *lstream_get(CUstream app) {
    struct lstream *ls = lstream_find(app);
    if (DS_LIKELY(ls != NULL))
        return ls;
    pthread_mutex_lock(&g_reg_lock);
    if (app == CU_STREAM_PER_THREAD) {
        if ((ls = lstream_new(app)) != NULL) {
            register_locked(ls);
            t_ptds = ls;
        }
    } else if (!(ls = tab_find((uintptr_t)app))) { /* another thread may have made it meanwhile */
        if ((ls = lstream_new(app)) != NULL) {
            register_locked(ls);
            if (!tab_insert((uintptr_t)app, ls)) {
                ls->free_next = g_free;
                g_free = ls;
                ls = NULL;
            }
        }
    }
    pthread_mutex_unlock(&g_reg_lock);
    if (!ls)
        table_full_warning();
    return ls;
}

/* The application destroyed ls's stream (joined before the destroy: nothing is pending): ls leaves the hash and
 * goes back to the pool. By the rule at the top, no launch on that stream is under way in another thread. */
static void lstream_forget(struct lstream *ls) {
    pthread_mutex_lock(&ls->lock);
    if (atomic_exchange(&ls->bound, NULL)) /* unbound, so it no longer counts in g_nbound */
        atomic_fetch_sub(&g_nbound, 1);
    atomic_store(&ls->phys, NULL);
    atomic_store(&ls->pending, 0);
    atomic_store(&ls->unconfined, 0); /* the demand monitor must not query the destroyed handle */
    pthread_mutex_unlock(&ls->lock);
    pthread_mutex_lock(&g_reg_lock); /* after ls->lock: the fork order takes stream locks before g_reg_lock */
    if (tab_remove((uintptr_t)atomic_load(&ls->app), ls)) {
        ls->free_next = g_free;
        g_free = ls;
    }
    pthread_mutex_unlock(&g_reg_lock);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Edges
 * ------------------------------------------------------------------------------------------------------------- */
/* The capture sequence stream s is part of (0: none), asked only while a capture runs in the process. The legacy
 * stream is never captured and is not asked: while a blocking stream captures, naming it is forbidden. A stream
 * whose capture was invalidated still belongs to it. */
static uint64_t capture_of(CUstream s) {
    if (s == NULL || s == CU_STREAM_LEGACY)
        return 0;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    if (ds_real.cuStreamGetCaptureInfo_v2) {
        if (DS_SOP_REAL(cuStreamGetCaptureInfo_v2)(s, &st, &id, NULL, NULL, NULL) != CUDA_SUCCESS)
            return 0;
        return st == CU_STREAM_CAPTURE_STATUS_NONE ? 0 : id ? id : 1;
    }
    if (!ds_real.cuStreamIsCapturing || ds_real.cuStreamIsCapturing(s, &st) != CUDA_SUCCESS)
        return 0;
    return st == CU_STREAM_CAPTURE_STATUS_NONE ? 0 : UINT64_MAX;
}

/* into waits for what from holds. Not across a capture boundary: CUDA forbids a capturing stream to wait on an event
 * recorded outside its capture (or in another one), and doing so invalidates the capture (a memset captured on a
 * blocking stream while the legacy stream's physical stream had kernels was: conformance c13, issue 28); a stream
 * outside a capture that waited on a captured event would be pulled into it. Nothing is lost: captured work never
 * depends on work outside its graph (a graph launch is ordered in its launch stream), and work outside does not run
 * the captured work. Costs nothing unless a capture runs. */
static bool tie(struct lstream *ls, CUstream from, CUstream into) {
    if (DS_UNLIKELY(atomic_load_explicit(&ds_process.capturing, memory_order_relaxed) != 0) &&
        capture_of(from) != capture_of(into))
        return false;
    if (DS_SOP_REAL(cuEventRecord)(ls->e_out, from) == CUDA_SUCCESS)
        DS_SOP_REAL(cuStreamWaitEvent)(into, ls->e_out, 0);
    return true;
}

/* ls->lock held: the application stream waits for the kernels on the physical stream. */
static void join_locked(struct lstream *ls) {
    if (!atomic_load_explicit(&ls->pending, memory_order_acquire))
        return;
    /* cleared first: a kernel launched concurrently sets it again and is joined next time */
    atomic_store(&ls->pending, 0);
    CUstream p = atomic_load(&ls->phys);
    if (p && !tie(ls, p, ls->app))
        atomic_store(&ls->pending, 1); /* left out across a capture boundary: joined once the capture is over */
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
        struct lstream *ls = pool_at(i);
        if (!atomic_load_explicit(&ls->pending, memory_order_acquire))
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
        unsigned n = atomic_load_explicit(&g_nblocking, memory_order_acquire) ?
                         atomic_load_explicit(&g_nall, memory_order_acquire) : 0;
        for (unsigned i = 0; i < n; i++) {
            struct lstream *b = pool_at(i);
            if (b->kind == LS_BLOCKING && atomic_load_explicit(&b->pending, memory_order_acquire))
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
           (ls->kind != LS_NONBLOCKING &&
            atomic_load_explicit(&ls->seen_cross, memory_order_relaxed) != cross_gen(ls->kind));
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
static bool rebind(struct lstream *ls, struct ds_gctx *c) {
    pthread_mutex_lock(&ls->lock);
    bool ok = true;
    if (atomic_load(&ls->bound) == c)
        goto out;
    if (!ls->phys_by_ctx[c->idx]) {
        CUstream p = NULL;
        CUstreamCaptureMode m = ds_relaxed_begin();
        /* green streams must be non-blocking; the edges give the application stream's ordering */
        CUresult r = ds_real.cuGreenCtxStreamCreate(&p, c->g, CU_STREAM_NON_BLOCKING, ls->prio);
        ds_relaxed_end(m);
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

/* ---------------------------------------------------------------------------------------------------------------
 * Stream operations (ds_stream_ops.c calls these around the driver's entry point)
 * ------------------------------------------------------------------------------------------------------------- */
/* The kind of the stream an operation names; ls gets its logical stream when one exists (made when the legacy
 * rules need the kind of a stream not seen yet). */
static int op_kind(CUstream app, struct lstream **out) {
    struct lstream *ls = lstream_find(app);
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
    if (!ls && kind == DS_OP_WAIT && DS_UNLIKELY(atomic_load_explicit(&ds_process.capturing, memory_order_relaxed)))
        ls = lstream_get(app); /* the wait may pull app into a capture: learn it while it is not capturing */
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
        if (ls && r == CUDA_SUCCESS && ls->app != CU_STREAM_LEGACY && ls->app != CU_STREAM_PER_THREAD)
            lstream_forget(ls);
        return;
    default:
        return;
    }
}

/* Every physical stream has finished its work (the demand monitor; never while a capture runs). */
bool ds_streams_drained(void) {
    if (atomic_load(&ds_process.capturing))
        return false; /* a physical stream may be capturing: querying it would break the capture */
    unsigned n = atomic_load_explicit(&g_nall, memory_order_acquire);
    for (unsigned i = 0; i < n; i++) {
        struct lstream *ls = pool_at(i);
        CUstream p = atomic_load(&ls->phys);
        /* asked again before each query: a capture that began meanwhile may have pulled p into it, and a query
         * invalidates a capture (this narrows the window; the launch path takes no lock to close it) */
        if (atomic_load(&ds_process.capturing))
            return false;
        if (p && DS_SOP_REAL(cuStreamQuery)(p) == CUDA_ERROR_NOT_READY)
            return false;
        /* a per-thread default stream can only be queried from its own thread: its unconfined work is seen by the
         * synchronisations of that thread, not here */
        if (atomic_load_explicit(&ls->unconfined, memory_order_acquire) && ls->app != CU_STREAM_PER_THREAD &&
            DS_SOP_REAL(cuStreamQuery)(ls->app) == CUDA_ERROR_NOT_READY)
            return false;
    }
    return true;
}

/* A context-wide synchronisation returned: every physical stream must have finished too. The join before it tied
 * them into their application streams, which a stream synchronisation honours, but on the H100 under MPS a
 * primary-context cuCtxSynchronize returned while a CUDA-graph replay on a green context's physical stream was still
 * running (torch.cuda.synchronize() after graph.replay(): 40 of 40 requests early, BENCHMARKS.md, reproduced by
 * integration/gpu/graphsync.py --no-events). So each physical stream still busy is waited for here, and said once.
 * This is the synchronisation path, not the launch path: one cuStreamQuery per physical stream. */
void ds_streams_after_context_sync(void) {
    if (atomic_load(&ds_process.capturing))
        return;
    unsigned n = atomic_load_explicit(&g_nall, memory_order_acquire);
    for (unsigned i = 0; i < n; i++) {
        struct lstream *ls = pool_at(i);
        CUstream p = atomic_load(&ls->phys);
        if (!p || DS_SOP_REAL(cuStreamQuery)(p) != CUDA_ERROR_NOT_READY)
            continue;
        static atomic_int said;
        if (!atomic_exchange(&said, 1))
            DS_LOG(DS_LOG_WARN, "a context synchronisation returned while physical stream %p still had work: "
                                "waiting for it (further cases are not logged)", (void *)p);
        DS_SOP_REAL(cuStreamSynchronize)(p);
    }
}

/* fork (the lock order is in ds_init.c): every logical stream's lock and its gate's lock, then g_reg_lock. No
 * stream lock may be taken with g_reg_lock held (lstream_forget takes ls->lock, then g_reg_lock), so a logical stream
 * registered while the stream locks are being taken (registration holds g_reg_lock) is seen by the re-check under
 * g_reg_lock, which is then released while that stream's locks are taken. Two stream locks are never nested
 * elsewhere, so holding some while taking more cannot deadlock. Logical streams in the pool's free list are locked
 * too (a walker may still hold one). */
static unsigned g_fork_nall; /* the streams whose locks the fork handler holds */

void ds_streams_fork_lock(void) {
    unsigned done = 0;
    for (;;) {
        unsigned n = atomic_load_explicit(&g_nall, memory_order_acquire);
        for (; done < n; done++) {
            struct lstream *ls = pool_at(done);
            pthread_mutex_lock(&ls->lock);
            pthread_mutex_lock(&ls->gate.lock);
        }
        pthread_mutex_lock(&g_reg_lock);
        if (atomic_load_explicit(&g_nall, memory_order_acquire) == done)
            break;
        pthread_mutex_unlock(&g_reg_lock);
    }
    g_fork_nall = done;
}

static void unlock_streams(void) {
    for (unsigned i = g_fork_nall; i-- > 0;) {
        struct lstream *ls = pool_at(i);
        pthread_mutex_unlock(&ls->gate.lock);
        pthread_mutex_unlock(&ls->lock);
    }
}

void ds_streams_fork_unlock(void) {
    pthread_mutex_unlock(&g_reg_lock);
    unlock_streams();
}

/* fork, in the child (single-threaded): the locks ds_streams_fork_lock took are released. */
void ds_streams_child(void) {
    pthread_mutex_unlock(&g_reg_lock);
    unlock_streams();
}

/* ---------------------------------------------------------------------------------------------------------------
 * The launch path
 * ------------------------------------------------------------------------------------------------------------- */
/* Work that stays on the application's stream (every group granted) is invisible to the physical streams, so the
 * stream is remembered and ds_streams_drained queries it too: otherwise the demand monitor declared a
 * latency-critical tenant idle 2 ms after it launched a 4 ms graph (H100, issue 12), and its neighbours were given
 * the GPU back in the middle of its request. */
static inline void mark_unconfined(struct lstream *ls) {
    if (DS_UNLIKELY(!atomic_load_explicit(&ls->unconfined, memory_order_relaxed)))
        atomic_store_explicit(&ls->unconfined, 1, memory_order_release);
}

/* The gate before a kernel launch to where (on width groups); ds_launch_done marks its completion (l says what). */
static void gate_pass(struct ds_launch *l, uint32_t depth, CUstream where, unsigned width) {
    ds_gate_wait(&l->ls->gate, depth, where, l->key, width);
    l->gated = true;
    l->width = width;
}

/* A gated kernel first waits until its stream admits one more launch, and only then reads the grant: a pause or a
 * token hand-over decided while it waited then holds it (ds_grant_enter). Read before the wait, the grant sent the
 * launch out on the SMs just reclaimed as soon as the kernel it waited for ended (a second trainer GEMM in a
 * latency-critical request's tail on the H100). gate_pass, once the grant is known, still keeps a new grant's
 * launches out from behind the old grant's. */
static struct lstream *gate_admit(CUstream app, uint32_t depth, const void *key) {
    if (!ds_real.cuStreamQuery || !ds_real.cuEventCreate)
        return NULL;
    struct lstream *ls = lstream_get(app);
    if (!ls)
        return NULL;
    struct ds_gctx *cur = atomic_load_explicit(&ds_grant_view.cur, memory_order_acquire);
    ds_gate_admit(&ls->gate, depth, key, cur ? (unsigned)__builtin_popcountll(cur->mask) : ds_pool_groups());
    return ls; /* the launch path's own lookup of this stream, done once */
}

/* Where work for the application's stream s goes now: its bound physical stream under a partial grant, else s.
 * Kernels are gated; copies and memsets are not. The caller counted the work first (ds_demand_work). The answer
 * carries the logical stream looked up here, so that completing the launch, and the slow paths after a refusal,
 * never look it up again. */
static inline struct ds_launch work_bind(CUstream s, int per_thread, bool kernel, const void *key, long smem) {
    struct ds_launch l = {.stream = s, .key = key};
    uint32_t gd = kernel ? ds_gate_depth() : 0; /* copies and memsets are never gated */
    CUstream app = app_handle(s, per_thread);
    struct lstream *admitted = DS_UNLIKELY(gd != 0) ? gate_admit(app, gd, key) : NULL;
    struct ds_gctx *c = ds_grant_enter();
    if (DS_LIKELY(c == NULL)) {
        /* every group (or no confinement): kernels run where the application put them, unless this stream still
         * has kernels on a physical stream from an earlier partial grant */
        struct lstream *ls = NULL;
        if (DS_LIKELY(!atomic_load_explicit(&g_nbound, memory_order_relaxed))) {
            /* one lock-free lookup (registering a new stream takes a lock once); none with a driver that could
             * not query the stream afterwards (a test double without events) */
            if (DS_LIKELY(ds_real.cuStreamQuery && ds_real.cuEventCreate))
                ls = admitted ? admitted : lstream_get(app);
        } else if ((ls = admitted ? admitted : lstream_get(app)) != NULL) {
            cross_pre(ls->kind, app);
            if (atomic_load(&ls->bound))
                unbind(ls);
            cross_post(ls->kind);
        }
        l.ls = ls;
        if (ls) {
            mark_unconfined(ls);
            if (DS_UNLIKELY(gd != 0)) /* the gate applies on the whole GPU too (ds_gate.c) */
                gate_pass(&l, gd, app, ds_pool_groups());
        }
        return l;
    }
    if (smem >= 0) {
        /* beside a latency-critical tenant a memory-bound kernel runs on the grant's narrow part (ds_narrow.c);
         * switching parts is a rebind, ordered like a grant change. Not while a capture runs: a captured graph is
         * launched as a whole, on the whole grant (ds_graph.c), and edges between two physical streams would have
         * to join the capture */
        struct ds_gctx *nc = ds_grant_narrow();
        if (DS_UNLIKELY(nc != NULL) && nc != c &&
            !atomic_load_explicit(&ds_process.capturing, memory_order_relaxed) &&
            ds_kernel_memory_bound((CUfunction)key, (unsigned)smem))
            c = nc;
    }
    struct lstream *ls = admitted ? admitted : lstream_get(app);
    l.ls = ls;
    if (DS_UNLIKELY(!ls))
        return l;
    if (ls->kind != LS_NONBLOCKING)
        cross_pre(ls->kind, app);
    if (DS_UNLIKELY(atomic_load_explicit(&ls->unconfinable, memory_order_relaxed) |
                    atomic_load_explicit(&ls->in_place, memory_order_relaxed))) {
        cross_post(ls->kind);
        return l;
    }
    if (DS_UNLIKELY(atomic_load_explicit(&ls->bound, memory_order_acquire) != c) && !rebind(ls, c)) {
        if (atomic_load(&ls->bound))
            unbind(ls);
        cross_post(ls->kind);
        return l;
    }
    CUstream phys = atomic_load_explicit(&ls->phys, memory_order_acquire);
    if ((DS_UNLIKELY(needs_edge_in(ls)) || DS_UNLIKELY(strict())) && !edge_in(ls, phys)) {
        unbind(ls);
        return l;
    }
    l.stream = phys;
    l.on_phys = true;
    if (DS_UNLIKELY(gd != 0))
        gate_pass(&l, gd, phys, (unsigned)__builtin_popcountll(c->mask));
    return l;
}

struct ds_launch ds_launch_bind(CUstream s, int per_thread, const void *key, long smem) {
    return work_bind(s, per_thread, true, key, smem);
}
struct ds_launch ds_work_bind(CUstream s, int per_thread) { return work_bind(s, per_thread, false, NULL, -1); }

void ds_launch_finish(const struct ds_launch *l, CUresult r) {
    struct lstream *ls = l->ls;
    /* a gated launch went to the physical stream, or (every group granted) to the application's stream */
    if (DS_UNLIKELY(l->gated) && r == CUDA_SUCCESS)
        ds_gate_record(&ls->gate, l->on_phys ? l->stream : ls->app, l->key, l->width);
    if (!l->on_phys || r != CUDA_SUCCESS)
        return;
    if (!atomic_load_explicit(&ls->pending, memory_order_relaxed))
        atomic_store_explicit(&ls->pending, 1, memory_order_release);
    if (DS_UNLIKELY(atomic_load_explicit(&ls->phys, memory_order_acquire) != l->stream)) {
        /* rebound by another thread while this kernel was being launched on the old physical stream */
        pthread_mutex_lock(&ls->lock);
        tie(ls, l->stream, ls->app);
        pthread_mutex_unlock(&ls->lock);
    }
    if (ls->kind != LS_NONBLOCKING)
        cross_post(ls->kind);
    if (DS_UNLIKELY(strict()))
        join(ls);
}

bool ds_launch_retry(struct ds_launch *l, CUresult r) {
    bool on_phys = l->on_phys;
    l->on_phys = false; /* completed here: ds_launch_done after the launch on the application's stream does nothing */
    l->gated = false;
    /* the kernel did not go on the physical stream (e.g. a function of a context green contexts cannot use): the
     * caller runs it where the application asked, after what the physical stream already holds */
    if (!on_phys || r == CUDA_ERROR_NOT_INITIALIZED || r == CUDA_ERROR_DEINITIALIZED)
        return false;
    join(l->ls);
    return true;
}

/* A stream first seen while it was capturing learns its kind and priority now that no capture runs (learn()). Its
 * physical streams keep the priority they were made with; a blocking guess already switched the legacy-stream
 * rules on, which costs edges, never order. */
static void relearn(struct lstream *ls) {
    pthread_mutex_lock(&g_reg_lock);
    if (atomic_load_explicit(&ls->relearn, memory_order_acquire) && atomic_load(&ls->app)) {
        CUstreamCaptureMode m = ds_relaxed_begin();
        learn(ls);
        ds_relaxed_end(m);
        register_locked(ls);
    }
    pthread_mutex_unlock(&g_reg_lock);
}

/* A capture is about to begin on s: its logical stream is made (and learnt) while s is not capturing yet. */
void ds_streams_before_capture(CUstream s, int per_thread) {
    CUstream app = app_handle(s, per_thread);
    if (app != CU_STREAM_LEGACY)
        (void)lstream_get(app); /* found, or made and learnt */
}

/* A capture ended (or was invalidated). The edges made while it ran between a capturing stream and a physical stream
 * pulled into its capture were captured, not issued: dependencies inside the graph that order nothing outside it.
 * Yet an edge in marked its logical stream as having seen everything issued so far (need_in cleared, seen_order and
 * seen_cross brought up to date), and a join cleared pending. So the first kernel or graph launched on the physical
 * stream after the capture did not wait for what the application stream must wait for: a graph captured on the
 * per-thread default stream was replayed on its physical stream before a synchronous memset the legacy stream still
 * had queued (a blocking stream waits for it; the physical stream did not), so the memset came after the replay and
 * overwrote its result (the H100's c13 per_thread.replay_ok=no, which matches native since this). Here every logical stream's next kernel takes a real edge in, and every one with
 * a physical stream is joined again at its next observation (one edge pair per stream per capture; O(streams) at
 * the end of a capture only). */
void ds_streams_capture_ended(void) {
    atomic_fetch_add_explicit(&g_order_gen, 1, memory_order_release);
    unsigned n = atomic_load_explicit(&g_nall, memory_order_acquire);
    bool none_left = atomic_load(&ds_process.capturing) == 0;
    for (unsigned i = 0; i < n; i++) {
        struct lstream *ls = pool_at(i);
        if (atomic_load_explicit(&ls->phys, memory_order_acquire) &&
            !atomic_load_explicit(&ls->pending, memory_order_relaxed))
            atomic_store_explicit(&ls->pending, 1, memory_order_release);
        if (none_left && atomic_load_explicit(&ls->relearn, memory_order_acquire))
            relearn(ls);
    }
}

/* cuStreamBeginCaptureToGraph captures into a graph the application made, which may be the body of a conditional
 * node: CUDA requires every node of a body to be in the context of its conditional node (the application's), so
 * work captured there must not go to a physical stream of a green context. While such a capture runs on s, its work
 * stays on s; the graph is moved to the grant's SMs, where it can be, when it is launched (ds_graph.c). */
void ds_streams_capture_in_place(CUstream s, int per_thread, bool on) {
    CUstream app = app_handle(s, per_thread);
    struct lstream *ls = on ? lstream_get(app) : lstream_find(app);
    if (!ls)
        return;
    atomic_store(&ls->in_place, on);
    if (on && atomic_load(&ls->bound))
        unbind(ls);
}

void ds_launch_unconfinable(const struct ds_launch *l) {
    struct lstream *ls = l->ls;
    if (!atomic_exchange(&ls->unconfinable, 1))
        DS_LOG(DS_LOG_WARN, "a kernel could not run on its green stream; stream %p runs unconfined", (void *)ls->app);
    unbind(ls);
    if (ls->kind != LS_NONBLOCKING)
        cross_post(ls->kind);
}

/* A copy or memset the physical stream refused ran on the application's stream instead (ds_launch_retry joined the
 * physical stream first): the stream's next kernel must wait for it. Kernels of the stream stay confined. */
void ds_work_ran_on_app_stream(const struct ds_launch *l) {
    struct lstream *ls = l->ls;
    atomic_store_explicit(&ls->need_in, 1, memory_order_release);
    if (ls->kind != LS_NONBLOCKING)
        cross_post(ls->kind);
}

/* Where a graph launched now must run: the green context the launch was bound to, or every SM (the primary
 * context) under a full grant. False when graphs are left as they are (no split learnt, temporal mode, a stream
 * that cannot be confined). */
bool ds_launch_graph_target(const struct ds_launch *l, CUcontext *ctx, unsigned *idx) {
    if (l->on_phys) {
        struct ds_gctx *c = atomic_load_explicit(&l->ls->bound, memory_order_acquire);
        if (!c)
            return false;
        *ctx = c->cu;
        *idx = c->idx;
        return true;
    }
    CUcontext primary = ds_pool_primary();
    if (!primary || atomic_load_explicit(&ds_grant_view.mode, memory_order_relaxed) != DS_MODE_SPATIAL ||
        atomic_load_explicit(&ds_grant_view.cur, memory_order_acquire) != NULL)
        return false;
    *ctx = primary;
    *idx = DS_CTX_PRIMARY;
    return true;
}
