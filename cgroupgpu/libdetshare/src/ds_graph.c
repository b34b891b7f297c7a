/*
 * ds_graph.c — CUDA graphs under GPU coroutines. A graph's kernel nodes carry the context they run in (a capture
 * gives them the capturing stream's), whatever stream the graph is launched on (DESIGN.md §2). So a graph launched
 * under a grant whose SMs differ from its nodes' is launched as a copy made for that grant:
 *
 *   re-contexting (the normal way): a clone of the graph whose kernel nodes get func = NULL, kern = their CUkernel
 *   and ctx = the grant's green context (or the primary context for a full grant), and whose memset and memcpy
 *   nodes get that context too (cuGraphNodeSetParams, 12.2+), instantiated with the application's flags. Every
 *   node type and the graph's topology are kept. Measured on the H100
 *   (integration/gpu/probes/greenperf.cu): the copy runs on exactly the target's SMs and replays as fast as a
 *   native graph; keeping func makes the driver ignore ctx, so func is always cleared.
 *   replay (fallback, for kernels without a CUkernel, e.g. module functions): the kernel and memset nodes are
 *   replayed in node order into a capture on a stream of the green context; graphs with other node types, or
 *   re-contexting to the primary context, stay where they are (logged once).
 *
 * Every executable instantiated through the library is tracked with a clone of its source graph (taken at
 * instantiation: the application may destroy or change its graph afterwards). Copies are made at the first launch
 * under a grant and cached per (executable, grant); they are dropped when the application changes the executable
 * (cuGraphExec*SetParams, cuGraphNodeSetEnabled: the executable then stays where it is) or updates it
 * (cuGraphExecUpdate: copies are re-made from the new graph). Lookups on the launch path are lock-free; the rest
 * takes g_glock.
 */
#include "ds_graph.h"

#include "ds_driver.h"
#include "ds_pool.h"
#include "ds_process.h"

#include <stdlib.h>
#include <string.h>

#define N_GSLOTS 4096u
#define N_TARGETS (DS_CTX_PRIMARY + 1)
#define CAP_MIXED (-1)
#define MAX_DEPTH 8 /* child graphs nested deeper than this are not walked */

struct gtrack {
    CUgraphExec exec;
    CUgraph src;               /* our clone of the graph the executable was instantiated from */
    unsigned long long flags;  /* its instantiation flags, without UPLOAD (our copies are not uploaded) */
    int cap;                   /* where its kernel nodes run: a green-context index, DS_CTX_PRIMARY, CAP_MIXED */
    atomic_int dead;           /* the executable was destroyed */
    atomic_int frozen;         /* changed by the application, or no copy can be made: launched as it is */
    atomic_int failed[N_TARGETS];
    _Atomic(CUgraphExec) per_ctx[N_TARGETS];
};

static pthread_mutex_t g_glock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(uintptr_t) g_gkeys[N_GSLOTS];
static _Atomic(struct gtrack *) g_gvals[N_GSLOTS];

/* fork (lock order in ds_init.c): g_glock is the first lock taken, the last released. */
void ds_graph_fork_lock(void) { pthread_mutex_lock(&g_glock); }
void ds_graph_fork_unlock(void) { pthread_mutex_unlock(&g_glock); }

static unsigned gslot(uintptr_t k) { return (unsigned)((k * 0x9E3779B97F4A7C15ull) >> 52) & (N_GSLOTS - 1); }

static struct gtrack *track_find(CUgraphExec e) {
    uintptr_t key = (uintptr_t)e;
    unsigned s = gslot(key);
    for (unsigned n = 0; n < N_GSLOTS; n++, s = (s + 1) & (N_GSLOTS - 1)) {
        uintptr_t k = atomic_load_explicit(&g_gkeys[s], memory_order_acquire);
        if (k == key) {
            struct gtrack *t = atomic_load_explicit(&g_gvals[s], memory_order_acquire);
            if (t && !atomic_load_explicit(&t->dead, memory_order_relaxed))
                return t;
            continue; /* a dead entry for a reused handle: a live one may follow */
        }
        if (k == 0)
            return NULL;
    }
    return NULL;
}

/* Calls f on every kernel node of g and of its child graphs; stops at the first non-success. Conditional nodes
 * (whose bodies cannot be walked through this API) give CUDA_ERROR_NOT_SUPPORTED. */
/* The nodes of g in a calloc'd array (*out, *n; *out NULL for an empty graph). */
static CUresult graph_nodes(CUgraph g, CUgraphNode **out, size_t *n) {
    *out = NULL;
    *n = 0;
    CUresult r = ds_real.cuGraphGetNodes(g, NULL, n);
    if (r != CUDA_SUCCESS || *n == 0)
        return r;
    if (*n > 1000000)
        return CUDA_ERROR_NOT_SUPPORTED;
    *out = calloc(*n, sizeof **out);
    if (!*out)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = ds_real.cuGraphGetNodes(g, *out, n);
    if (r != CUDA_SUCCESS) {
        free(*out);
        *out = NULL;
    }
    return r;
}

/* Calls f for every kernel, memset and memcpy node of g and of its child graphs. */
typedef CUresult (*node_fn)(CUgraphNode n, CUgraphNodeType ty, void *arg);
static CUresult each_work_node(CUgraph g, node_fn f, void *arg, int depth) {
    if (depth > MAX_DEPTH)
        return CUDA_ERROR_NOT_SUPPORTED;
    size_t n = 0;
    CUgraphNode *nodes = NULL;
    CUresult r = graph_nodes(g, &nodes, &n);
    for (size_t i = 0; r == CUDA_SUCCESS && i < n; i++) {
        CUgraphNodeType ty;
        r = ds_real.cuGraphNodeGetType(nodes[i], &ty);
        if (r != CUDA_SUCCESS)
            break;
        if (ty == CU_GRAPH_NODE_TYPE_KERNEL || ty == CU_GRAPH_NODE_TYPE_MEMSET || ty == CU_GRAPH_NODE_TYPE_MEMCPY) {
            r = f(nodes[i], ty, arg);
        } else if (ty == CU_GRAPH_NODE_TYPE_GRAPH) {
            CUgraph child = NULL;
            r = ds_real.cuGraphChildGraphNodeGetGraph ? ds_real.cuGraphChildGraphNodeGetGraph(nodes[i], &child)
                                                      : CUDA_ERROR_NOT_SUPPORTED;
            if (r == CUDA_SUCCESS)
                r = each_work_node(child, f, arg, depth + 1);
        } else if (ty == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
            r = CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    free(nodes);
    return r;
}

static CUresult kernel_params(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS *p) {
    memset(p, 0, sizeof *p);
    return ds_real.cuGraphKernelNodeGetParams_v2(n, p);
}

struct cap_scan {
    int cap;
    bool first;
};
static CUresult scan_node(CUgraphNode n, CUgraphNodeType ty, void *arg) {
    struct cap_scan *sc = arg;
    if (ty != CU_GRAPH_NODE_TYPE_KERNEL)
        return CUDA_SUCCESS; /* where a graph runs is where its kernels run */
    CUDA_KERNEL_NODE_PARAMS p;
    CUresult r = kernel_params(n, &p);
    if (r != CUDA_SUCCESS)
        return r;
    int c = ds_pool_ctx_index(p.ctx);
    if (sc->first) {
        sc->cap = c;
        sc->first = false;
    } else if (sc->cap != c) {
        sc->cap = CAP_MIXED;
    }
    return CUDA_SUCCESS;
}

/* Where the kernel nodes of g run (CAP_MIXED when they disagree or cannot be read). */
static int graph_cap(CUgraph g) {
    struct cap_scan sc = {DS_CTX_PRIMARY, true};
    if (!ds_real.cuGraphKernelNodeGetParams_v2 || each_work_node(g, scan_node, &sc, 0) != CUDA_SUCCESS)
        return CAP_MIXED;
    return sc.cap < 0 ? CAP_MIXED : sc.cap;
}

static CUgraph clone_of(CUgraph g) {
    CUgraph c = NULL;
    if (!g || !ds_real.cuGraphClone || ds_real.cuGraphClone(&c, g) != CUDA_SUCCESS)
        return NULL;
    return c;
}

static void drop_copies(struct gtrack *t) {
    for (unsigned i = 0; i < N_TARGETS; i++) {
        CUgraphExec x = atomic_exchange(&t->per_ctx[i], NULL);
        if (x && ds_real.cuGraphExecDestroy)
            ds_real.cuGraphExecDestroy(x);
        atomic_store(&t->failed[i], 0);
    }
}

/* An executable was instantiated from g: track it with a clone of g. Graphs that cannot be cloned (memory
 * allocation nodes) stay where they are. */
void ds_graph_instantiated(CUgraphExec e, CUgraph g, unsigned long long flags) {
    if (!e || !g || !ds_real.cuGraphGetNodes || !ds_real.cuGraphNodeGetType)
        return;
    CUgraph src = clone_of(g);
    if (!src) {
        static atomic_int warned;
        if (!atomic_exchange(&warned, 1))
            DS_LOG(DS_LOG_INFO, "a graph could not be cloned (memory nodes?): it runs where it was captured");
        return;
    }
    struct gtrack *t = calloc(1, sizeof *t);
    if (!t) {
        ds_real.cuGraphDestroy(src);
        return;
    }
    t->exec = e;
    t->src = src;
    t->flags = flags & ~(unsigned long long)CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
    t->cap = graph_cap(src);
    pthread_mutex_lock(&g_glock);
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
    pthread_mutex_unlock(&g_glock);
    if (t) { /* table full: the graph stays where it was captured */
        ds_real.cuGraphDestroy(t->src);
        free(t);
    }
}

/* The application destroys executable e: destroy our copies and our clone. */
void ds_graph_exec_destroyed(CUgraphExec e) {
    pthread_mutex_lock(&g_glock);
    struct gtrack *t = track_find(e);
    if (t) {
        atomic_store(&t->dead, 1);
        drop_copies(t);
        if (t->src)
            ds_real.cuGraphDestroy(t->src);
        t->src = NULL;
        /* t itself stays allocated: a concurrent lock-free reader may still hold it */
    }
    pthread_mutex_unlock(&g_glock);
}

/* The application changed e node by node: our copies would run the old parameters. */
void ds_graph_exec_changed(CUgraphExec e) {
    pthread_mutex_lock(&g_glock);
    struct gtrack *t = track_find(e);
    if (t && !atomic_exchange(&t->frozen, 1)) {
        drop_copies(t);
        DS_LOG(DS_LOG_INFO, "graph %p was changed by the application: it runs where it was captured", (void *)e);
    }
    pthread_mutex_unlock(&g_glock);
}

/* cuGraphExecUpdate: e now runs g's topology and parameters; copies are re-made from g. */
void ds_graph_exec_updated(CUgraphExec e, CUgraph g) {
    CUgraph src = clone_of(g);
    pthread_mutex_lock(&g_glock);
    struct gtrack *t = track_find(e);
    if (t) {
        drop_copies(t);
        if (t->src)
            ds_real.cuGraphDestroy(t->src);
        t->src = src;
        src = NULL;
        t->cap = t->src ? graph_cap(t->src) : CAP_MIXED;
        atomic_store(&t->frozen, t->src == NULL);
    }
    pthread_mutex_unlock(&g_glock);
    if (src)
        ds_real.cuGraphDestroy(src);
}

/* ---- re-contexting ---- */
struct recontext {
    CUcontext target;
};
/* Memset and memcpy nodes run on SMs too (a device-to-device copy on the SMs of its node's context: measured on the
 * H100, integration/gpu/probes/copyescape.cu). Their context is set with cuGraphNodeSetParams (12.2+). Without it, or
 * if the driver refuses, the node keeps its context: logged once, the graph still moves. */
static CUresult recontext_copy_node(CUgraphNode n, CUgraphNodeType ty, CUcontext target) {
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = ty;
    CUresult r = CUDA_ERROR_NOT_SUPPORTED;
    if (ds_real.cuGraphNodeSetParams && ty == CU_GRAPH_NODE_TYPE_MEMSET && ds_real.cuGraphMemsetNodeGetParams) {
        CUDA_MEMSET_NODE_PARAMS m;
        memset(&m, 0, sizeof m);
        r = ds_real.cuGraphMemsetNodeGetParams(n, &m);
        np.memset = (CUDA_MEMSET_NODE_PARAMS_v2){m.dst, m.pitch, m.value, m.elementSize, m.width, m.height, target};
    } else if (ds_real.cuGraphNodeSetParams && ty == CU_GRAPH_NODE_TYPE_MEMCPY && ds_real.cuGraphMemcpyNodeGetParams) {
        r = ds_real.cuGraphMemcpyNodeGetParams(n, &np.memcpy.copyParams);
        np.memcpy.copyCtx = target;
    }
    if (r == CUDA_SUCCESS)
        r = ds_real.cuGraphNodeSetParams(n, &np);
    if (r != CUDA_SUCCESS) {
        static atomic_int warned;
        if (!atomic_exchange(&warned, 1))
            DS_LOG(DS_LOG_INFO, "a graph's %s node keeps the context it was captured in (%d)",
                   ty == CU_GRAPH_NODE_TYPE_MEMSET ? "memset" : "memcpy", r);
    }
    return CUDA_SUCCESS;
}

static CUresult recontext_node(CUgraphNode n, CUgraphNodeType ty, void *arg) {
    struct recontext *rc = arg;
    if (ty != CU_GRAPH_NODE_TYPE_KERNEL)
        return recontext_copy_node(n, ty, rc->target);
    CUDA_KERNEL_NODE_PARAMS p;
    CUresult r = kernel_params(n, &p);
    if (r != CUDA_SUCCESS)
        return r;
    if (!p.kern)
        return CUDA_ERROR_NOT_SUPPORTED; /* a module function: its context cannot be changed */
    p.func = NULL;                       /* with func set the driver ignores ctx */
    p.ctx = rc->target;
    return ds_real.cuGraphKernelNodeSetParams_v2(n, &p);
}

static CUresult make_recontexted(struct gtrack *t, CUcontext target, CUgraphExec *out) {
    if (!ds_real.cuGraphKernelNodeGetParams_v2 || !ds_real.cuGraphKernelNodeSetParams_v2 ||
        !ds_real.cuGraphInstantiateWithFlags)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUgraph g = clone_of(t->src);
    if (!g)
        return CUDA_ERROR_NOT_SUPPORTED;
    struct recontext rc = {target};
    CUresult r = each_work_node(g, recontext_node, &rc, 0);
    if (r == CUDA_SUCCESS)
        r = ds_real.cuGraphInstantiateWithFlags(out, g, t->flags);
    ds_real.cuGraphDestroy(g);
    return r;
}

/* ---- replay (fallback) ---- */
/* A memset node is replayed as the stream memset it was captured from (frameworks zero buffers inside their
 * graphs). 16-bit memsets have no replay here. */
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
        return DS_SOP_REAL(cuMemsetD2D8Async)(m.dst, pitch, (unsigned char)m.value, m.width, h, st);
    if (m.elementSize == 4 && ds_real.cuMemsetD2D32Async)
        return DS_SOP_REAL(cuMemsetD2D32Async)(m.dst, pitch, m.value, m.width, h, st);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* Replays the kernel and memset nodes of t->src, in node order, into a capture on a stream of green context idx. */
static CUresult make_replayed(struct gtrack *t, unsigned idx, CUgraphExec *out) {
    if (idx >= DS_CTX_PRIMARY || !ds_real.cuGraphKernelNodeGetParams_v2 || !ds_real.cuStreamBeginCapture_v2 ||
        !ds_real.cuStreamEndCapture || !ds_real.cuGraphInstantiateWithFlags || !ds_real.cuLaunchKernel)
        return CUDA_ERROR_NOT_SUPPORTED;
    size_t n = 0;
    CUgraphNode *nodes = NULL;
    CUresult r = graph_nodes(t->src, &nodes, &n);
    if (r != CUDA_SUCCESS || n == 0) {
        free(nodes);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUstream st = ds_pool_private_stream(idx);
    CUgraph g2 = NULL;
    if (!st)
        r = CUDA_ERROR_INVALID_HANDLE;
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
        r = kernel_params(nodes[i], &p);
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
        r = ds_real.cuGraphInstantiateWithFlags(out, g2, t->flags);
    if (g2)
        ds_real.cuGraphDestroy(g2);
    free(nodes);
    return r;
}

/* The executable to launch for e under the target context (green context idx, or DS_CTX_PRIMARY for every SM). */
CUgraphExec ds_graph_for(CUgraphExec e, CUcontext target, unsigned idx) {
    if (idx >= N_TARGETS)
        return e;
    struct gtrack *t = track_find(e);
    if (!t || t->cap == (int)idx || atomic_load_explicit(&t->frozen, memory_order_relaxed) ||
        atomic_load_explicit(&t->failed[idx], memory_order_relaxed))
        return e;
    CUgraphExec x = atomic_load_explicit(&t->per_ctx[idx], memory_order_acquire);
    if (DS_LIKELY(x != NULL))
        return x;
    pthread_mutex_lock(&g_glock);
    x = atomic_load(&t->per_ctx[idx]);
    if (!x && !atomic_load(&t->dead) && !atomic_load(&t->frozen) && t->src) {
        CUgraphExec made = NULL;
        uint64_t t0 = ds_now_ns();
        CUresult r = make_recontexted(t, target, &made);
        const char *how = "re-contexted";
        if (r != CUDA_SUCCESS) {
            made = NULL;
            r = make_replayed(t, idx, &made);
            how = "replayed";
        }
        if (r == CUDA_SUCCESS && made) {
            x = made;
            atomic_store_explicit(&t->per_ctx[idx], x, memory_order_release);
            DS_LOG(DS_LOG_DEBUG, "graph %p %s for context %u in %llu us", (void *)e, how, idx,
                   (unsigned long long)((ds_now_ns() - t0) / 1000));
        } else {
            atomic_store(&t->failed[idx], 1);
            static atomic_int warned;
            if (!atomic_exchange(&warned, 1))
                DS_LOG(DS_LOG_WARN, "graph %p cannot be moved to another grant's SMs (%d): it runs where it was "
                                    "captured (further such graphs are not logged)", (void *)e, r);
        }
    }
    pthread_mutex_unlock(&g_glock);
    return x ? x : e;
}
