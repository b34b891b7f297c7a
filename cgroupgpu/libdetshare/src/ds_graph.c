/*
 * ds_graph.c — CUDA graphs under GPU coroutines. A graph captured through the library has its kernels in the
 * green context of the grant at capture time, and a kernel node keeps its context for ever (a graph executable
 * cannot be moved to other SMs). So when such a graph is launched under another grant, the library launches a copy
 * made for that grant instead: the source graph's kernel nodes are replayed, in node order, into a capture on a
 * physical stream of the current green context, instantiated once and cached per (executable, green context).
 *
 * Only graphs whose nodes are kernels, memsets (8- and 32-bit) or empty nodes are replayed; others keep running on the SMs of the grant
 * they were captured under (logged once). The source graph is kept alive after the application destroys it, for
 * as long as one of its executables lives. Lookups on the launch path are lock-free; instantiation and the
 * per-grant copies take g_glock.
 */
#include "ds.h"

#include <stdlib.h>
#include <string.h>

#define N_GSLOTS 4096u

struct gtrack {
    CUgraphExec exec;
    CUgraph graph;            /* source graph (a capture through the library) */
    const void *cap;          /* green context bound when it was captured */
    atomic_int app_destroyed; /* the application destroyed the source graph: we destroy it with the exec */
    atomic_int dead;          /* the executable was destroyed */
    atomic_int unreplayable;
    _Atomic(CUgraphExec) per_ctx[64];
};

static pthread_mutex_t g_glock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(uintptr_t) g_gkeys[N_GSLOTS];
static _Atomic(struct gtrack *) g_gvals[N_GSLOTS];
/* graphs ended by a capture through the library, and the green context bound then */
static _Atomic(uintptr_t) g_capkeys[N_GSLOTS];
static _Atomic(const void *) g_capvals[N_GSLOTS];
static _Atomic(uintptr_t) g_keepkeys[N_GSLOTS]; /* source graphs the application destroyed while we keep them */

static unsigned gslot(uintptr_t k) { return (unsigned)((k * 0x9E3779B97F4A7C15ull) >> 52) & (N_GSLOTS - 1); }

static struct gtrack *track_find(CUgraphExec e) {
    uintptr_t key = (uintptr_t)e;
    unsigned s = gslot(key);
    for (unsigned n = 0; n < N_GSLOTS; n++, s = (s + 1) & (N_GSLOTS - 1)) {
        uintptr_t k = atomic_load_explicit(&g_gkeys[s], memory_order_acquire);
        if (k == key) {
            struct gtrack *t = atomic_load_explicit(&g_gvals[s], memory_order_acquire);
            if (t && !atomic_load(&t->dead))
                return t;
            continue; /* a dead entry for a reused handle: a live one may follow */
        }
        if (k == 0)
            return NULL;
    }
    return NULL;
}

static bool set_put(_Atomic(uintptr_t) *keys, _Atomic(const void *) *vals, uintptr_t key, const void *v) {
    unsigned s = gslot(key);
    for (unsigned n = 0; n < N_GSLOTS; n++, s = (s + 1) & (N_GSLOTS - 1)) {
        uintptr_t k = atomic_load(&keys[s]);
        if (k == key || k == 0 || k == 1) { /* 1 = tombstone */
            if (vals)
                atomic_store(&vals[s], v);
            atomic_store_explicit(&keys[s], key, memory_order_release);
            return true;
        }
    }
    return false;
}

static bool set_take(_Atomic(uintptr_t) *keys, _Atomic(const void *) *vals, uintptr_t key, const void **v) {
    unsigned s = gslot(key);
    for (unsigned n = 0; n < N_GSLOTS; n++, s = (s + 1) & (N_GSLOTS - 1)) {
        uintptr_t k = atomic_load(&keys[s]);
        if (k == key) {
            if (vals && v)
                *v = atomic_load(&vals[s]);
            atomic_store(&keys[s], 1);
            return true;
        }
        if (k == 0)
            return false;
    }
    return false;
}

/* Called (g_glock not held) when a capture through the library ends with graph g. */
void ds_graph_captured(CUgraph g) {
    const void *c = ds_coro_capture_binding();
    if (!g || !c)
        return;
    pthread_mutex_lock(&g_glock);
    set_put(g_capkeys, g_capvals, (uintptr_t)g, c);
    pthread_mutex_unlock(&g_glock);
}

/* An executable was instantiated from g: track it when g was captured under a binding. */
void ds_graph_instantiated(CUgraphExec e, CUgraph g) {
    if (!e || !g)
        return;
    pthread_mutex_lock(&g_glock);
    unsigned s = gslot((uintptr_t)g);
    const void *cap = NULL;
    for (unsigned n = 0; n < N_GSLOTS; n++, s = (s + 1) & (N_GSLOTS - 1)) {
        uintptr_t k = atomic_load(&g_capkeys[s]);
        if (k == (uintptr_t)g) {
            cap = atomic_load(&g_capvals[s]);
            break;
        }
        if (k == 0)
            break;
    }
    if (cap) {
        struct gtrack *t = calloc(1, sizeof *t);
        if (t) {
            t->exec = e;
            t->graph = g;
            t->cap = cap;
            uintptr_t key = (uintptr_t)e;
            unsigned i = gslot(key);
            for (unsigned n = 0; n < N_GSLOTS; n++, i = (i + 1) & (N_GSLOTS - 1)) {
                uintptr_t k = atomic_load(&g_gkeys[i]);
                struct gtrack *old = atomic_load(&g_gvals[i]);
                if (k == 0 || (k == key && old && atomic_load(&old->dead))) {
                    atomic_store_explicit(&g_gvals[i], t, memory_order_release);
                    atomic_store_explicit(&g_gkeys[i], key, memory_order_release);
                    t = NULL;
                    break;
                }
            }
            free(t); /* table full: the graph stays on its capture grant */
        }
    }
    pthread_mutex_unlock(&g_glock);
}

static bool graph_in_use(CUgraph g) {
    for (unsigned i = 0; i < N_GSLOTS; i++) {
        struct gtrack *t = atomic_load(&g_gvals[i]);
        if (t && !atomic_load(&t->dead) && t->graph == g)
            return true;
    }
    return false;
}

/* The application destroys graph g: keep it while an executable we may re-make from it lives. Returns true when
 * the real destroy must be skipped now. */
bool ds_graph_destroying(CUgraph g) {
    bool keep = false;
    pthread_mutex_lock(&g_glock);
    set_take(g_capkeys, g_capvals, (uintptr_t)g, NULL);
    if (graph_in_use(g)) {
        for (unsigned i = 0; i < N_GSLOTS; i++) {
            struct gtrack *t = atomic_load(&g_gvals[i]);
            if (t && !atomic_load(&t->dead) && t->graph == g)
                atomic_store(&t->app_destroyed, 1);
        }
        keep = set_put(g_keepkeys, NULL, (uintptr_t)g, NULL);
    }
    pthread_mutex_unlock(&g_glock);
    return keep;
}

/* The application destroys executable e: destroy our copies, and the source graph if the application already
 * let it go and nothing else uses it. */
void ds_graph_exec_destroyed(CUgraphExec e) {
    pthread_mutex_lock(&g_glock);
    struct gtrack *t = track_find(e);
    CUgraph drop = NULL;
    if (t) {
        atomic_store(&t->dead, 1);
        for (unsigned i = 0; i < 64; i++) {
            CUgraphExec x = atomic_exchange(&t->per_ctx[i], NULL);
            if (x && ds_real.cuGraphExecDestroy)
                ds_real.cuGraphExecDestroy(x);
        }
        if (atomic_load(&t->app_destroyed) && !graph_in_use(t->graph) &&
            set_take(g_keepkeys, NULL, (uintptr_t)t->graph, NULL))
            drop = t->graph;
        /* t itself stays allocated: a concurrent lock-free reader may still hold it */
    }
    pthread_mutex_unlock(&g_glock);
    if (drop && ds_real.cuGraphDestroy)
        ds_real.cuGraphDestroy(drop);
}

/* A memset node is replayed as the stream memset it was captured from (frameworks zero buffers inside their
 * graphs; without this such graphs could never follow the grant). 16-bit memsets have no replay here. */
static CUresult replay_memset(CUgraphNode n, CUstream st) {
    if (!ds_real.cuGraphMemsetNodeGetParams)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUDA_MEMSET_NODE_PARAMS m;
    memset(&m, 0, sizeof m);
    CUresult r = ds_real.cuGraphMemsetNodeGetParams(n, &m);
    if (r != CUDA_SUCCESS)
        return r;
    size_t h = m.height ? m.height : 1, pitch = m.pitch ? m.pitch : m.width * m.elementSize;
    if (m.elementSize == 1 && ds_real.cuMemsetD2D8Async)
        return ds_real.cuMemsetD2D8Async(m.dst, pitch, (unsigned char)m.value, m.width, h, st);
    if (m.elementSize == 4 && ds_real.cuMemsetD2D32Async)
        return ds_real.cuMemsetD2D32Async(m.dst, pitch, m.value, m.width, h, st);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* Replays the kernel and memset nodes of t->graph into a capture on a stream of green context c. */
static CUgraphExec build_copy(struct gtrack *t, const void *c) {
    if (!ds_real.cuGraphGetNodes || !ds_real.cuGraphNodeGetType || !ds_real.cuGraphKernelNodeGetParams_v2 ||
        !ds_real.cuStreamBeginCapture_v2 || !ds_real.cuStreamEndCapture || !ds_real.cuGraphInstantiateWithFlags ||
        !ds_real.cuLaunchKernel)
        return NULL;
    size_t n = 0;
    if (ds_real.cuGraphGetNodes(t->graph, NULL, &n) != CUDA_SUCCESS || n == 0 || n > 100000)
        return NULL;
    CUgraphNode *nodes = calloc(n, sizeof *nodes);
    if (!nodes)
        return NULL;
    CUstream st = ds_coro_private_stream(c);
    CUgraph g2 = NULL;
    CUgraphExec e2 = NULL;
    CUresult r = st ? ds_real.cuGraphGetNodes(t->graph, nodes, &n) : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS)
        r = ds_real.cuStreamBeginCapture_v2(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    bool capturing = r == CUDA_SUCCESS;
    for (size_t i = 0; r == CUDA_SUCCESS && i < n; i++) {
        CUgraphNodeType ty;
        r = ds_real.cuGraphNodeGetType(nodes[i], &ty);
        if (r != CUDA_SUCCESS)
            break;
        if (ty == CU_GRAPH_NODE_TYPE_EMPTY)
            continue;
        if (ty == CU_GRAPH_NODE_TYPE_MEMSET) {
            r = replay_memset(nodes[i], st);
            continue;
        }
        if (ty != CU_GRAPH_NODE_TYPE_KERNEL) {
            r = CUDA_ERROR_NOT_SUPPORTED;
            break;
        }
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        r = ds_real.cuGraphKernelNodeGetParams_v2(nodes[i], &p);
        if (r == CUDA_SUCCESS)
            r = ds_real.cuLaunchKernel(p.func ? p.func : (CUfunction)p.kern, p.gridDimX, p.gridDimY, p.gridDimZ,
                                       p.blockDimX, p.blockDimY, p.blockDimZ, p.sharedMemBytes, st, p.kernelParams,
                                       p.extra);
    }
    if (capturing) {
        CUresult re = ds_real.cuStreamEndCapture(st, &g2);
        if (r == CUDA_SUCCESS)
            r = re;
    }
    if (r == CUDA_SUCCESS)
        r = ds_real.cuGraphInstantiateWithFlags(&e2, g2, 0);
    if (g2 && ds_real.cuGraphDestroy)
        ds_real.cuGraphDestroy(g2);
    free(nodes);
    if (r != CUDA_SUCCESS) {
        if (!atomic_exchange(&t->unreplayable, 1))
            DS_LOG(DS_LOG_WARN, "graph %p cannot be re-made for a new grant (%d): it keeps the SMs of the grant it "
                                "was captured under", (void *)t->exec, r);
        return NULL;
    }
    return e2;
}

/* The executable to launch for e under the binding c (NULL: launch e as it is). */
CUgraphExec ds_graph_for(CUgraphExec e, const void *c, unsigned cidx) {
    if (!c || cidx >= 64)
        return e;
    struct gtrack *t = track_find(e);
    if (!t || t->cap == c || atomic_load_explicit(&t->unreplayable, memory_order_relaxed))
        return e;
    CUgraphExec x = atomic_load_explicit(&t->per_ctx[cidx], memory_order_acquire);
    if (DS_LIKELY(x != NULL))
        return x;
    pthread_mutex_lock(&g_glock);
    x = atomic_load(&t->per_ctx[cidx]);
    if (!x && !atomic_load(&t->dead)) {
        x = build_copy(t, c);
        if (x)
            atomic_store_explicit(&t->per_ctx[cidx], x, memory_order_release);
    }
    pthread_mutex_unlock(&g_glock);
    return x ? x : e;
}
