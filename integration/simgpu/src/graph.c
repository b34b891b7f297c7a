/*
 * graph.c — stream capture and CUDA graphs of the simulated GPU (test double).
 *
 * A node keeps the context it was made in: captured kernels take the capturing stream's context, so a graph
 * captured on a green stream stays on that green context's SMs wherever it is launched, and one captured on a
 * primary-context stream runs on all SMs even when launched on a green stream (as measured on the H100). Nodes run
 * in insertion order on the launching stream; dependencies are accepted but not needed for that order.
 *
 * Invalidation (CUDA programming guide, "Prohibited and Unhandled Operations" and "Invalidation"): an operation the
 * driver forbids during capture — synchronising or querying a capturing stream, a capturing stream waiting on an
 * event recorded outside its capture (without CU_EVENT_WAIT_EXTERNAL) or in another capture — fails and invalidates
 * the capture sequence: every later operation captured into it fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, its
 * streams report CU_STREAM_CAPTURE_STATUS_INVALIDATED, and cuStreamEndCapture returns that error and no graph.
 *
 * Unsafe calls (cuThreadExchangeStreamCaptureMode, CUDA driver API reference): a "potentially unsafe" call fails
 * with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the captures it is unsafe for, by the calling thread's
 * capture mode: GLOBAL (every thread's default) — a capture this thread began in a mode other than RELAXED, or a
 * capture another thread began in GLOBAL mode; THREAD_LOCAL — only the former; RELAXED — none. The double treats
 * as unsafe what sets up green contexts (cuDeviceGetDevResource, cuDevSmResourceSplitByCount,
 * cuDevResourceGenerateDesc, cuGreenCtxCreate: the last waits for the device's work, as a synchronisation does) and
 * cuMemAlloc (cudaMalloc, the example CUDA's documentation gives). A library that sets up such things while an
 * application captures must switch its thread to RELAXED around them and back.
 */
#include "simgpu.h"

#include <stdlib.h>
#include <string.h>

static _Thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

static struct CUgraphNode_st *node_new(struct CUgraph_st *g, int type) {
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->magic = SIM_NODE;
    n->type = type;
    if (g->tail)
        g->tail->next = n;
    else
        g->head = n;
    g->tail = n;
    g->nnodes++;
    return n;
}

static void node_fix_args(struct CUgraphNode_st *n) {
    for (unsigned i = 0; i < SIM_MAX_ARGS; i++)
        n->launch.args[i] = &n->launch.argbuf[i * 8];
}

static bool graph_ok(CUgraph g) { return g && g->magic == SIM_GRAPH; }

/* The context-less kernel behind a launched handle, as the driver records it in a captured node (kern): a CUkernel
 * passed as a CUfunction, or a function obtained from a library kernel with cuKernelGetFunction. Functions of
 * modules loaded with cuModuleLoad* have none. */
static CUkernel kernel_of(CUfunction f) {
    if (!f)
        return NULL;
    if (f->magic == SIM_KERN)
        return (CUkernel)(void *)f;
    if (f->magic != SIM_FUNC || !f->mod || !f->mod->lib)
        return NULL;
    for (struct CUkern_st *k = f->mod->lib->kerns; k; k = k->next)
        if (&k->func == f)
            return k;
    return NULL;
}

/* An operation forbidden during capture was attempted on the capturing stream s: its capture is invalidated. */
CUresult sim_capture_forbidden(struct CUstream_st *s, CUresult why) {
    pthread_mutex_lock(&g_sim.lock);
    if (s->capture)
        s->capture->cap_invalid = true;
    pthread_mutex_unlock(&g_sim.lock);
    return why;
}

CUresult sim_capture_unsafe_call(void) {
    if (t_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    pthread_t self = pthread_self();
    bool hit = false;
    pthread_mutex_lock(&g_sim.lock);
    for (struct CUstream_st *x = g_sim.streams; x; x = x->next) {
        struct CUgraph_st *g = x->capture;
        if (!g || !x->capture_origin)
            continue;
        bool mine = pthread_equal(g->cap_thread, self);
        if ((mine && g->cap_mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!mine && t_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && g->cap_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            g->cap_invalid = true;
            hit = true;
        }
    }
    pthread_mutex_unlock(&g_sim.lock);
    return hit ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* g_sim.lock held: a node for the capture of s, or NULL with *r set (an invalidated capture takes no more nodes). */
static struct CUgraphNode_st *capture_node(struct CUstream_st *s, int type, CUresult *r) {
    if (s->capture->cap_invalid) {
        *r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        return NULL;
    }
    struct CUgraphNode_st *n = node_new(s->capture, type);
    *r = n ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    return n;
}

CUresult sim_capture_kernel(struct CUstream_st *s, struct CUctx_st *ctx, const sim_launch *l, CUfunction f) {
    CUresult r;
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraphNode_st *n = capture_node(s, SIM_NODE_KERNEL, &r);
    if (n) {
        n->ctx = ctx;
        n->func = f;
        n->kern = kernel_of(f);
        n->launch = *l;
        node_fix_args(n);
    }
    pthread_mutex_unlock(&g_sim.lock);
    return r;
}

CUresult sim_capture_memset(struct CUstream_st *s, struct CUctx_st *ctx, const CUDA_MEMSET_NODE_PARAMS *p) {
    CUresult r;
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraphNode_st *n = capture_node(s, SIM_NODE_MEMSET, &r);
    if (n) {
        n->memset = *p;
        n->ctx = ctx;
    }
    pthread_mutex_unlock(&g_sim.lock);
    return r;
}

CUresult sim_capture_memcpy(struct CUstream_st *s, struct CUctx_st *ctx, const CUDA_MEMCPY3D *p) {
    CUresult r;
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraphNode_st *n = capture_node(s, SIM_NODE_MEMCPY, &r);
    if (n) {
        n->memcpy = *p;
        n->ctx = ctx;
    }
    pthread_mutex_unlock(&g_sim.lock);
    return r;
}

CUresult sim_capture_host(struct CUstream_st *s, CUhostFn fn, void *ud) {
    CUresult r;
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraphNode_st *n = capture_node(s, SIM_NODE_HOST, &r);
    if (n)
        n->host = (CUDA_HOST_NODE_PARAMS){fn, ud};
    pthread_mutex_unlock(&g_sim.lock);
    return r;
}

/* Stream-ordered allocation captured into a graph: a memory-allocation node whose memory the double reserves at once
 * (as cuGraphAddMemAllocNode does), its address returned to the caller as the driver does at capture. */
CUresult sim_capture_mem_alloc(struct CUstream_st *s, struct CUctx_st *ctx, CUdeviceptr *dptr, size_t bytes) {
    pthread_mutex_lock(&g_sim.lock);
    bool invalid = s->capture->cap_invalid;
    pthread_mutex_unlock(&g_sim.lock);
    if (invalid)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    CUresult r = sim_graph_mem_alloc(dptr, bytes, ctx->device);
    if (r)
        return r;
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraphNode_st *n = capture_node(s, SIM_NODE_MEM_ALLOC, &r);
    if (n) {
        memset(&n->alloc, 0, sizeof n->alloc);
        n->alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        n->alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        n->alloc.poolProps.location.id = ctx->device;
        n->alloc.bytesize = bytes;
        n->alloc.dptr = *dptr;
    }
    pthread_mutex_unlock(&g_sim.lock);
    return r;
}

/* cuMemFreeAsync captured into a graph: a memory-free node. */
CUresult sim_capture_mem_free(struct CUstream_st *s, CUdeviceptr dptr) {
    (void)dptr;
    CUresult r;
    pthread_mutex_lock(&g_sim.lock);
    (void)capture_node(s, SIM_NODE_MEM_FREE, &r);
    pthread_mutex_unlock(&g_sim.lock);
    return r;
}

/* ---- capture ---- */

static CUresult begin_capture(CUstream h, CUgraph into, CUstreamCaptureMode mode, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (s->legacy)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot be captured */
    if (into && !graph_ok(into))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_sim.lock);
    if (s->capture) {
        pthread_mutex_unlock(&g_sim.lock);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    struct CUgraph_st *g = into;
    if (!g) {
        g = calloc(1, sizeof *g);
        if (!g) {
            pthread_mutex_unlock(&g_sim.lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        g->magic = SIM_GRAPH;
    }
    g->cap_mode = mode;
    g->cap_thread = pthread_self();
    s->capture = g;
    s->capture_origin = true;
    s->capture_id = sim_next_id();
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    return begin_capture(hStream, NULL, mode, false);
}
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
    return begin_capture(hStream, NULL, mode, true);
}
CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
                                     const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                     CUstreamCaptureMode mode) {
    (void)dependencyData;
    if (numDependencies && !dependencies)
        return CUDA_ERROR_INVALID_VALUE;
    if (!hGraph)
        return CUDA_ERROR_INVALID_VALUE;
    return begin_capture(hStream, hGraph, mode, false);
}
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
                                          const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                          CUstreamCaptureMode mode) {
    (void)dependencyData;
    if (numDependencies && !dependencies)
        return CUDA_ERROR_INVALID_VALUE;
    if (!hGraph)
        return CUDA_ERROR_INVALID_VALUE;
    return begin_capture(hStream, hGraph, mode, true);
}

static CUresult end_capture(CUstream h, CUgraph *phGraph, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraph_st *g = s->capture;
    if (!g || !s->capture_origin) {
        pthread_mutex_unlock(&g_sim.lock);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    for (struct CUstream_st *x = g_sim.streams; x; x = x->next)
        if (x->capture == g)
            x->capture = NULL; /* joined streams leave the capture with it */
    s->capture = NULL;
    s->capture_origin = false;
    bool invalid = g->cap_invalid;
    g->cap_invalid = false; /* a graph captured into (cuStreamBeginCaptureToGraph) may be captured into again */
    pthread_mutex_unlock(&g_sim.lock);
    if (invalid) {
        *phGraph = NULL; /* the driver destroys a graph it made; the double leaks it (a test double) */
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *phGraph = g;
    return CUDA_SUCCESS;
}
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) { return end_capture(hStream, phGraph, false); }
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) { return end_capture(hStream, phGraph, true); }

static CUstreamCaptureStatus capture_status(const struct CUstream_st *s) {
    pthread_mutex_lock(&g_sim.lock);
    CUstreamCaptureStatus st = !s->capture           ? CU_STREAM_CAPTURE_STATUS_NONE
                               : s->capture->cap_invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                                         : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&g_sim.lock);
    return st;
}

static CUresult is_capturing(CUstream h, CUstreamCaptureStatus *st, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (!st)
        return CUDA_ERROR_INVALID_VALUE;
    *st = capture_status(s);
    return CUDA_SUCCESS;
}
CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
    return is_capturing(hStream, captureStatus, false);
}
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
    return is_capturing(hStream, captureStatus, true);
}

static CUresult capture_info(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *graph,
                             const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (!st)
        return CUDA_ERROR_INVALID_VALUE;
    *st = capture_status(s);
    if (id)
        *id = s->capture ? s->capture_id : 0;
    if (graph)
        *graph = s->capture;
    if (deps)
        *deps = NULL;
    if (edges)
        *edges = NULL;
    if (ndeps)
        *ndeps = 0;
    return CUDA_SUCCESS;
}
CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                   const CUgraphNode **deps, size_t *n) {
    return capture_info(h, st, id, g, deps, NULL, n, false);
}
CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                        const CUgraphNode **deps, size_t *n) {
    return capture_info(h, st, id, g, deps, NULL, n, true);
}
CUresult cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                   const CUgraphNode **deps, const CUgraphEdgeData **e, size_t *n) {
    return capture_info(h, st, id, g, deps, e, n, false);
}
CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                        const CUgraphNode **deps, const CUgraphEdgeData **e, size_t *n) {
    return capture_info(h, st, id, g, deps, e, n, true);
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    SIM_CHECK_INIT();
    if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = t_capture_mode;
    t_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

/* ---- graphs built by API ---- */

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    SIM_CHECK_INIT();
    if (!phGraph || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = SIM_GRAPH;
    *phGraph = g;
    return CUDA_SUCCESS;
}

CUresult cuGraphClone(CUgraph *phGraphClone, CUgraph originalGraph) {
    SIM_CHECK_INIT();
    if (!phGraphClone || !graph_ok(originalGraph))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = SIM_GRAPH;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_sim.lock);
    for (struct CUgraphNode_st *n = originalGraph->head; n; n = n->next) {
        struct CUgraphNode_st *c = node_new(g, n->type);
        if (!c) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        *c = *n;
        c->magic = SIM_NODE;
        c->next = NULL;
        c->orig = NULL;
        node_fix_args(c);
    }
    pthread_mutex_unlock(&g_sim.lock);
    if (r != CUDA_SUCCESS) {
        cuGraphDestroy(g);
        return r;
    }
    *phGraphClone = g;
    return CUDA_SUCCESS;
}

/* The test double has no child-graph nodes: every node handle is the wrong type for this call. */
CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph) {
    SIM_CHECK_INIT();
    if (!hNode || hNode->magic != SIM_NODE || !phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphDestroy(CUgraph hGraph) {
    SIM_CHECK_INIT();
    if (!graph_ok(hGraph))
        return CUDA_ERROR_INVALID_VALUE;
    hGraph->magic = SIM_DEAD; /* nodes stay allocated: executables own copies, stale node handles are detected */
    for (struct CUgraphNode_st *n = hGraph->head; n; n = n->next)
        n->magic = SIM_DEAD;
    return CUDA_SUCCESS;
}

static CUresult add_check(CUgraphNode *ph, CUgraph g, const CUgraphNode *deps, size_t ndeps) {
    SIM_CHECK_INIT();
    if (!ph || !graph_ok(g) || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < ndeps; i++)
        if (!deps[i] || deps[i]->magic != SIM_NODE)
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* The context a kernel node runs in: with func set, params->ctx is ignored (documented, and seen on the H100: a
 * node given a green context with its func kept ran on every SM): a module function keeps its module's context, a
 * library function the current one. A context-less CUkernel (func NULL) takes params->ctx, or the current context. */
static CUresult kernel_node_fill(struct CUgraphNode_st *n, const CUDA_KERNEL_NODE_PARAMS *p) {
    CUfunction f = p->func ? p->func : (CUfunction)(void *)p->kern;
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    sim_launch l;
    unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ}, block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
    CUresult r = sim_launch_prepare(&l, f, grid, block, p->sharedMemBytes, p->kernelParams, p->extra);
    if (r)
        return r;
    struct CUctx_st *ctx = NULL;
    if (p->func && p->func->magic == SIM_FUNC)
        ctx = p->func->mod->ctx;
    else if (!p->func && p->ctx)
        ctx = p->ctx;
    if (!ctx)
        ctx = sim_current_ctx();
    if (!sim_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    n->ctx = ctx;
    n->func = p->func;
    n->kern = p->kern;
    n->launch = l;
    node_fix_args(n);
    return CUDA_SUCCESS;
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                 size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams) {
    CUresult r = add_check(phGraphNode, hGraph, dependencies, numDependencies);
    if (r)
        return r;
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st tmp = {0};
    if ((r = kernel_node_fill(&tmp, nodeParams)))
        return r;
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraphNode_st *n = node_new(hGraph, SIM_NODE_KERNEL);
    if (n) {
        tmp.magic = n->magic;
        tmp.type = n->type;
        tmp.next = NULL;
        *n = tmp;
        node_fix_args(n);
    }
    pthread_mutex_unlock(&g_sim.lock);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraphNode = n;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddMemsetNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                              size_t numDependencies, const CUDA_MEMSET_NODE_PARAMS *memsetParams, CUcontext ctx) {
    CUresult r = add_check(phGraphNode, hGraph, dependencies, numDependencies);
    if (r)
        return r;
    if (!memsetParams)
        return CUDA_ERROR_INVALID_VALUE;
    if (ctx && !sim_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraphNode_st *n = node_new(hGraph, SIM_NODE_MEMSET);
    if (n) {
        n->memset = *memsetParams;
        n->ctx = ctx;
    }
    pthread_mutex_unlock(&g_sim.lock);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraphNode = n;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddMemcpyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                              size_t numDependencies, const CUDA_MEMCPY3D *copyParams, CUcontext ctx) {
    CUresult r = add_check(phGraphNode, hGraph, dependencies, numDependencies);
    if (r)
        return r;
    if (!copyParams)
        return CUDA_ERROR_INVALID_VALUE;
    if (ctx && !sim_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraphNode_st *n = node_new(hGraph, SIM_NODE_MEMCPY);
    if (n) {
        n->memcpy = *copyParams;
        n->ctx = ctx;
    }
    pthread_mutex_unlock(&g_sim.lock);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraphNode = n;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddHostNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                            size_t numDependencies, const CUDA_HOST_NODE_PARAMS *nodeParams) {
    CUresult r = add_check(phGraphNode, hGraph, dependencies, numDependencies);
    if (r)
        return r;
    if (!nodeParams || !nodeParams->fn)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraphNode_st *n = node_new(hGraph, SIM_NODE_HOST);
    if (n)
        n->host = *nodeParams;
    pthread_mutex_unlock(&g_sim.lock);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraphNode = n;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddEmptyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                             size_t numDependencies) {
    CUresult r = add_check(phGraphNode, hGraph, dependencies, numDependencies);
    if (r)
        return r;
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraphNode_st *n = node_new(hGraph, SIM_NODE_EMPTY);
    pthread_mutex_unlock(&g_sim.lock);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraphNode = n;
    return CUDA_SUCCESS;
}

/* A graph memory-allocation node: the double reserves the memory at once (device memory used, as nvidia-smi shows
 * for a real graph memory pool) and runs the node as an empty one. */
CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
    CUresult r = add_check(phGraphNode, hGraph, dependencies, numDependencies);
    if (r)
        return r;
    if (!nodeParams || !nodeParams->bytesize || nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    r = sim_graph_mem_alloc(&nodeParams->dptr, nodeParams->bytesize, nodeParams->poolProps.location.id);
    if (!r)
        r = cuGraphAddEmptyNode(phGraphNode, hGraph, dependencies, numDependencies);
    if (!r) {
        pthread_mutex_lock(&g_sim.lock);
        (*phGraphNode)->type = SIM_NODE_MEM_ALLOC;
        (*phGraphNode)->alloc = *nodeParams;
        pthread_mutex_unlock(&g_sim.lock);
    }
    return r;
}

CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    SIM_CHECK_INIT();
    if (!hNode || hNode->magic != SIM_NODE || hNode->type != SIM_NODE_MEM_ALLOC || !p)
        return CUDA_ERROR_INVALID_VALUE;
    *p = hNode->alloc;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                        size_t numDependencies, CUgraphNodeParams *nodeParams) {
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    switch (nodeParams->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
        return cuGraphAddKernelNode_v2(phGraphNode, hGraph, dependencies, numDependencies, &nodeParams->kernel);
    case CU_GRAPH_NODE_TYPE_MEMSET: {
        const CUDA_MEMSET_NODE_PARAMS_v2 *m = &nodeParams->memset;
        CUDA_MEMSET_NODE_PARAMS v1 = {m->dst, m->pitch, m->value, m->elementSize, m->width, m->height};
        return cuGraphAddMemsetNode(phGraphNode, hGraph, dependencies, numDependencies, &v1, m->ctx);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
        return cuGraphAddMemcpyNode(phGraphNode, hGraph, dependencies, numDependencies,
                                    &nodeParams->memcpy.copyParams, nodeParams->memcpy.copyCtx);
    case CU_GRAPH_NODE_TYPE_HOST:
        return cuGraphAddHostNode(phGraphNode, hGraph, dependencies, numDependencies, &nodeParams->host);
    case CU_GRAPH_NODE_TYPE_EMPTY:
        return cuGraphAddEmptyNode(phGraphNode, hGraph, dependencies, numDependencies);
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
        return cuGraphAddMemAllocNode(phGraphNode, hGraph, dependencies, numDependencies, &nodeParams->alloc);
    default:
        return CUDA_ERROR_NOT_SUPPORTED; /* not modelled by the test double */
    }
}

/* 12.3+: edge data is accepted and not modelled (nodes run in insertion order). */
CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                           const void *edgeData, size_t numDependencies, CUgraphNodeParams *nodeParams) {
    (void)edgeData;
    return cuGraphAddNode(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes) {
    SIM_CHECK_INIT();
    if (!graph_ok(hGraph) || !numNodes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!nodes) {
        *numNodes = hGraph->nnodes;
        return CUDA_SUCCESS;
    }
    size_t i = 0;
    for (struct CUgraphNode_st *n = hGraph->head; n && i < *numNodes; n = n->next)
        nodes[i++] = n;
    for (size_t k = i; k < *numNodes; k++)
        nodes[k] = NULL;
    *numNodes = i;
    return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type) {
    SIM_CHECK_INIT();
    if (!hNode || hNode->magic != SIM_NODE || !type)
        return CUDA_ERROR_INVALID_VALUE;
    *type = (CUgraphNodeType)hNode->type;
    return CUDA_SUCCESS;
}

CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS *p) {
    SIM_CHECK_INIT();
    if (!hNode || hNode->magic != SIM_NODE || hNode->type != SIM_NODE_KERNEL || !p)
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    p->func = hNode->func;
    p->kern = hNode->kern;
    p->ctx = hNode->ctx;
    p->gridDimX = hNode->launch.grid[0];
    p->gridDimY = hNode->launch.grid[1];
    p->gridDimZ = hNode->launch.grid[2];
    p->blockDimX = hNode->launch.block[0];
    p->blockDimY = hNode->launch.block[1];
    p->blockDimZ = hNode->launch.block[2];
    p->sharedMemBytes = hNode->launch.smem;
    p->kernelParams = hNode->launch.args;
    return CUDA_SUCCESS;
}

CUresult cuGraphMemsetNodeGetParams(CUgraphNode hNode, CUDA_MEMSET_NODE_PARAMS *p) {
    SIM_CHECK_INIT();
    if (!hNode || hNode->magic != SIM_NODE || hNode->type != SIM_NODE_MEMSET || !p)
        return CUDA_ERROR_INVALID_VALUE;
    *p = hNode->memset;
    return CUDA_SUCCESS;
}

CUresult cuGraphMemcpyNodeGetParams(CUgraphNode hNode, CUDA_MEMCPY3D *p) {
    SIM_CHECK_INIT();
    if (!hNode || hNode->magic != SIM_NODE || hNode->type != SIM_NODE_MEMCPY || !p)
        return CUDA_ERROR_INVALID_VALUE;
    *p = hNode->memcpy;
    return CUDA_SUCCESS;
}

/* 12.2+: a node's parameters, its context included, by node type (kernel, memset and memcpy are modelled). */
CUresult cuGraphNodeSetParams(CUgraphNode hNode, CUgraphNodeParams *p) {
    SIM_CHECK_INIT();
    if (!hNode || hNode->magic != SIM_NODE || !p)
        return CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
        return cuGraphKernelNodeSetParams_v2(hNode, &p->kernel);
    case CU_GRAPH_NODE_TYPE_MEMSET:
        if (hNode->type != SIM_NODE_MEMSET || (p->memset.ctx && !sim_ctx_valid(p->memset.ctx)))
            return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&g_sim.lock);
        hNode->memset = (CUDA_MEMSET_NODE_PARAMS){p->memset.dst,         p->memset.pitch, p->memset.value,
                                                  p->memset.elementSize, p->memset.width, p->memset.height};
        hNode->ctx = p->memset.ctx;
        pthread_mutex_unlock(&g_sim.lock);
        return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_MEMCPY:
        if (hNode->type != SIM_NODE_MEMCPY || (p->memcpy.copyCtx && !sim_ctx_valid(p->memcpy.copyCtx)))
            return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&g_sim.lock);
        hNode->memcpy = p->memcpy.copyParams;
        hNode->ctx = p->memcpy.copyCtx;
        pthread_mutex_unlock(&g_sim.lock);
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_NOT_SUPPORTED; /* not modelled by the test double */
    }
}

CUresult cuGraphKernelNodeSetParams_v2(CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS *p) {
    SIM_CHECK_INIT();
    if (!hNode || hNode->magic != SIM_NODE || hNode->type != SIM_NODE_KERNEL || !p)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st tmp = *hNode;
    CUresult r = kernel_node_fill(&tmp, p);
    if (r)
        return r;
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraphNode_st *next = hNode->next;
    *hNode = tmp;
    hNode->next = next;
    node_fix_args(hNode);
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}

/* ---- executable graphs ---- */

static CUresult instantiate(CUgraphExec *ph, CUgraph g) {
    SIM_CHECK_INIT();
    if (!ph || !graph_ok(g))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = SIM_EXEC;
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraphNode_st **tail = &e->nodes;
    for (struct CUgraphNode_st *n = g->head; n; n = n->next) {
        struct CUgraphNode_st *c = malloc(sizeof *c);
        if (!c)
            break;
        *c = *n;
        c->next = NULL;
        c->orig = n;
        node_fix_args(c);
        *tail = c;
        tail = &c->next;
        e->nnodes++;
    }
    pthread_mutex_unlock(&g_sim.lock);
    if (e->nnodes != g->nnodes)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ph = e;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    if (flags & ~0xfULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
        return CUDA_ERROR_NOT_SUPPORTED;
    return instantiate(phGraphExec, hGraph);
}

static CUresult inst_params(CUgraphExec *ph, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p, bool ptd) {
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuGraphInstantiateWithFlags(ph, g, p->flags);
    p->result_out = r ? CUDA_GRAPH_INSTANTIATE_ERROR : CUDA_GRAPH_INSTANTIATE_SUCCESS;
    p->hErrNode_out = NULL;
    (void)ptd; /* upload (FLAG_UPLOAD) is a no-op: there is nothing to copy to a simulated device */
    return r;
}
CUresult cuGraphInstantiateWithParams(CUgraphExec *ph, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    return inst_params(ph, g, p, false);
}
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *ph, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    return inst_params(ph, g, p, true);
}

static struct CUgraphNode_st *exec_node_for(CUgraphExec e, CUgraphNode orig) {
    for (struct CUgraphNode_st *c = e->nodes; c; c = c->next)
        if (c->orig == orig)
            return c;
    return NULL;
}

CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode,
                                           const CUDA_KERNEL_NODE_PARAMS *nodeParams) {
    SIM_CHECK_INIT();
    if (!hGraphExec || hGraphExec->magic != SIM_EXEC || !hNode || hNode->magic != SIM_NODE || !nodeParams ||
        hNode->type != SIM_NODE_KERNEL)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *c = exec_node_for(hGraphExec, hNode);
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st tmp = *c;
    CUresult r = kernel_node_fill(&tmp, nodeParams);
    if (r)
        return r;
    if (tmp.ctx != c->ctx)
        return CUDA_ERROR_INVALID_VALUE; /* "the owning context of the function cannot change" */
    pthread_mutex_lock(&g_sim.lock);
    struct CUgraphNode_st *next = c->next, *orig = c->orig;
    *c = tmp;
    c->next = next;
    c->orig = orig;
    node_fix_args(c);
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}

CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *resultInfo) {
    SIM_CHECK_INIT();
    if (!hGraphExec || hGraphExec->magic != SIM_EXEC || !graph_ok(hGraph) || !resultInfo)
        return CUDA_ERROR_INVALID_VALUE;
    memset(resultInfo, 0, sizeof *resultInfo);
    if (hGraph->nnodes != hGraphExec->nnodes) {
        resultInfo->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
        return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
    pthread_mutex_lock(&g_sim.lock);
    CUresult r = CUDA_SUCCESS;
    struct CUgraphNode_st *n = hGraph->head, *c = hGraphExec->nodes;
    for (; n && c; n = n->next, c = c->next) {
        if (n->type != c->type) {
            resultInfo->result = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
            resultInfo->errorNode = n;
            r = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
            break;
        }
        if (n->type == SIM_NODE_KERNEL && n->ctx != c->ctx) {
            resultInfo->result = CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE;
            resultInfo->errorNode = n;
            r = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
            break;
        }
    }
    if (!r) {
        for (n = hGraph->head, c = hGraphExec->nodes; n && c; n = n->next, c = c->next) {
            struct CUgraphNode_st *next = c->next;
            *c = *n;
            c->next = next;
            c->orig = n;
            node_fix_args(c);
        }
    }
    pthread_mutex_unlock(&g_sim.lock);
    return r;
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    SIM_CHECK_INIT();
    if (!hGraphExec || hGraphExec->magic != SIM_EXEC)
        return CUDA_ERROR_INVALID_VALUE;
    hGraphExec->magic = SIM_DEAD;
    return CUDA_SUCCESS;
}

/* The context a memset or memcpy node runs in: the one it was captured or added in, else the launching stream's. */
static struct CUctx_st *node_ctx(const struct CUgraphNode_st *n, struct CUctx_st *sctx) {
    return n->ctx && n->ctx->magic == SIM_CTX ? n->ctx : sctx;
}

static CUresult graph_launch(CUgraphExec e, CUstream h, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *sctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &sctx);
    if (r)
        return r;
    if (!e || e->magic != SIM_EXEC)
        return CUDA_ERROR_INVALID_VALUE;
    for (struct CUgraphNode_st *n = e->nodes; n && !r; n = n->next) {
        if (s->capture) {
            /* Launching into a capturing stream copies the nodes into the capture. */
            switch (n->type) {
            case SIM_NODE_KERNEL: r = sim_capture_kernel(s, n->ctx, &n->launch, n->func); break;
            case SIM_NODE_MEMSET: r = sim_capture_memset(s, n->ctx, &n->memset); break;
            case SIM_NODE_MEMCPY: r = sim_capture_memcpy(s, n->ctx, &n->memcpy); break;
            case SIM_NODE_HOST: r = sim_capture_host(s, n->host.fn, n->host.userData); break;
            default: break;
            }
            continue;
        }
        switch (n->type) {
        case SIM_NODE_KERNEL:
            if (n->ctx->magic != SIM_CTX)
                return CUDA_ERROR_CONTEXT_IS_DESTROYED;
            r = sim_launch_exec(&n->launch, s, sctx, n->ctx);
            break;
        case SIM_NODE_MEMSET:
            r = sim_do_memset(n->memset.dst, n->memset.pitch, n->memset.value, n->memset.elementSize,
                              n->memset.width, n->memset.height);
            if (!r)
                r = sim_enqueue_device_op(s, sctx, node_ctx(n, sctx),
                                          n->memset.width * n->memset.elementSize * n->memset.height, false);
            break;
        case SIM_NODE_MEMCPY: {
            size_t bytes = n->memcpy.WidthInBytes * (n->memcpy.Height ? n->memcpy.Height : 1) *
                           (n->memcpy.Depth ? n->memcpy.Depth : 1);
            r = sim_do_memcpy3d(&n->memcpy);
            if (!r && sim_copy3d_on_device(&n->memcpy))
                r = sim_enqueue_device_op(s, sctx, node_ctx(n, sctx), bytes, false);
            else if (!r)
                r = sim_enqueue_copy(s, sctx, bytes, false);
            break;
        }
        case SIM_NODE_HOST: r = sim_enqueue_hostfn(s, sctx, n->host.fn, n->host.userData); break;
        default: break;
        }
    }
    return r;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) { return graph_launch(hGraphExec, hStream, false); }
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    return graph_launch(hGraphExec, hStream, true);
}

static CUresult graph_upload(CUgraphExec e, CUstream h, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    return e && e->magic == SIM_EXEC ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) { return graph_upload(hGraphExec, hStream, false); }
CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    return graph_upload(hGraphExec, hStream, true);
}
