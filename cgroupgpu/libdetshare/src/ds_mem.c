/*
 * ds_mem.c — the per-tenant device-memory quota: every allocation path is charged against the tenant's limit
 * before the driver is asked (CAS loop on the client page, shared by all processes of the tenant), refused with
 * CUDA_ERROR_OUT_OF_MEMORY without changing anything when it does not fit, and credited back when freed. The
 * memory queries answer with the quota.
 *
 * Policy (docs/libdetshare.md): device allocations, pitch (pitch*height), managed memory (counted in full: it may
 * live on the device), stream-ordered/pool allocations (the bytes requested, from allocation to cuMemFreeAsync),
 * VMM physical allocations with a device location (cuMemCreate .. cuMemRelease), arrays and mipmapped arrays
 * (element size * extent, every level), graph memory-allocation nodes (bytesize, held until the process exits: the
 * driver's graph memory pool keeps what it reserved until cuDeviceGraphMemTrim) and pool release thresholds (memory a
 * pool may keep after frees: a reservation charged in full while it is set). Host and IPC-imported memory is not the
 * tenant's device memory.
 *
 * The tenant-wide total lives in the client page, which every process of the tenant can write: it is the shared
 * number the processes cooperate on (and what `detshare status` shows), not a defence. Each process also keeps its
 * own tally in private memory, and covers it in the tenant's memory ledger (ds_ledger.c: locks the kernel keeps on
 * the page), so a tenant that zeroes its page cannot take more than the quota through the library, in one process or
 * in all of them together (issue 27); the backstop against processes that bypass the library is the MPS server-side
 * limit (docs/threat-model-quota.md).
 */
#include "ds_mem.h"

#include "ds_driver.h"
#include "ds_ledger.h"
#include "ds_process.h"
#include "ds_streams.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define A32(p) ((_Atomic uint32_t *)(p))
#define A64(p) ((_Atomic uint64_t *)(p))

/* ---------------------------------------------------------------------------------------------------------------
 * Allocation tracking: what was charged for each pointer / handle, so that a free credits exactly that. A hash of
 * 4096 buckets under 64 striped locks: allocation paths may lock, the launch path never comes here.
 * ------------------------------------------------------------------------------------------------------------- */
enum { K_PTR = 1, K_VMM = 2, K_ARRAY = 3, K_MIPMAP = 4, K_POOL = 5, K_GRAPH = 6 };
#define N_BUCKETS 4096u
#define N_LOCKS 64u

struct node {
    uint64_t key;
    uint64_t size;
    int kind;
    struct node *next;
};
static struct node *g_buckets[N_BUCKETS];
static pthread_mutex_t g_locks[N_LOCKS] = {[0 ... N_LOCKS - 1] = PTHREAD_MUTEX_INITIALIZER};

static unsigned bucket_of(int kind, uint64_t key) {
    uint64_t h = (key ^ ((uint64_t)kind << 56)) * 0x9E3779B97F4A7C15ull;
    return (unsigned)(h >> 52) & (N_BUCKETS - 1);
}

static bool track_add(int kind, uint64_t key, uint64_t size) {
    struct node *n = malloc(sizeof *n);
    if (!n)
        return false;
    n->key = key;
    n->size = size;
    n->kind = kind;
    unsigned b = bucket_of(kind, key);
    pthread_mutex_t *l = &g_locks[b % N_LOCKS];
    pthread_mutex_lock(l);
    n->next = g_buckets[b];
    g_buckets[b] = n;
    pthread_mutex_unlock(l);
    return true;
}

/* Removes the record and returns its size; 0 when the pointer was not charged by us. */
static uint64_t track_del(int kind, uint64_t key) {
    unsigned b = bucket_of(kind, key);
    pthread_mutex_t *l = &g_locks[b % N_LOCKS];
    uint64_t size = 0;
    struct node *found = NULL;
    pthread_mutex_lock(l);
    for (struct node **pp = &g_buckets[b]; *pp; pp = &(*pp)->next) {
        if ((*pp)->kind == kind && (*pp)->key == key) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    pthread_mutex_unlock(l);
    if (found) {
        size = found->size;
        free(found);
    }
    return size;
}

void ds_track_lock_all(void) {
    for (unsigned i = 0; i < N_LOCKS; i++)
        pthread_mutex_lock(&g_locks[i]);
}
void ds_track_unlock_all(void) {
    for (unsigned i = 0; i < N_LOCKS; i++)
        pthread_mutex_unlock(&g_locks[i]);
}
/* What this process charged, in its private memory (see the file comment): never above the limit. */
static _Atomic uint64_t g_private_used;

void ds_track_reset_child(void) {
    atomic_store_explicit(&g_private_used, 0, memory_order_relaxed);
    for (unsigned b = 0; b < N_BUCKETS; b++) {
        struct node *n = g_buckets[b];
        while (n) {
            struct node *next = n->next;
            free(n);
            n = next;
        }
        g_buckets[b] = NULL;
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Charging: this process's private tally and the tenant's ledger (ds_ledger.c) decide; the page total only shows.
 * ------------------------------------------------------------------------------------------------------------- */
uint64_t ds_mem_limit(void) {
    return atomic_load_explicit(A64(&ds_process.tenant->ctr->mem_limit), memory_order_relaxed);
}

static bool private_charge(uint64_t size, uint64_t limit) {
    uint64_t old = atomic_load_explicit(&g_private_used, memory_order_relaxed), n;
    do {
        n = old + size;
        if (limit && (n > limit || n < old))
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&g_private_used, &old, n, memory_order_acq_rel,
                                                    memory_order_relaxed));
    return true;
}

static void private_uncharge(uint64_t size) {
    uint64_t old = atomic_load_explicit(&g_private_used, memory_order_relaxed), n;
    do {
        n = old > size ? old - size : 0;
    } while (!atomic_compare_exchange_weak_explicit(&g_private_used, &old, n, memory_order_acq_rel,
                                                    memory_order_relaxed));
}

bool ds_charge(uint64_t size) {
    struct ds_client_page *pg = ds_process.tenant->page;
    uint64_t limit = ds_mem_limit();
    if (!private_charge(size, limit)) {
        /* this process alone would exceed the quota */
        __atomic_fetch_add(&pg->oom_refusals, 1, __ATOMIC_RELAXED);
        DS_LOG(DS_LOG_INFO, "allocation of %llu bytes refused: this process alone holds %llu of %llu",
               (unsigned long long)size, (unsigned long long)atomic_load(&g_private_used), (unsigned long long)limit);
        return false;
    }
    if (!ds_ledger_cover(atomic_load_explicit(&g_private_used, memory_order_acquire), limit)) {
        /* the tenant's processes together hold the quota, whatever its page says */
        private_uncharge(size);
        (void)ds_ledger_cover(atomic_load_explicit(&g_private_used, memory_order_acquire), limit);
        __atomic_fetch_add(&pg->oom_refusals, 1, __ATOMIC_RELAXED);
        DS_LOG(DS_LOG_INFO, "allocation of %llu bytes refused: the tenant's processes hold its %llu bytes (ledger)",
               (unsigned long long)size, (unsigned long long)limit);
        return false;
    }
    /* The page's total is what the tenant's processes show (detshare status, cuMemGetInfo), never what decides: the
     * tenant can write it (issue 27: "1 TiB used" written into a victim's page stopped it allocating). */
    if (DS_LIKELY(ds_attach() != NULL))
        (void)ds_mem_charge(pg, atomic_load_explicit(&ds_process.self_idx, memory_order_relaxed), size, 0);
    else /* no process entry free: the tenant total only (a crash of this process is then not credited) */
        __atomic_fetch_add(&pg->mem_used, size, __ATOMIC_RELAXED);
    return true;
}

void ds_uncharge(uint64_t size) {
    if (!size)
        return;
    private_uncharge(size);
    (void)ds_ledger_cover(atomic_load_explicit(&g_private_used, memory_order_acquire), ds_mem_limit());
    int i = atomic_load_explicit(&ds_process.self_idx, memory_order_relaxed);
    if (i >= 0)
        ds_mem_uncharge(ds_process.tenant->page, i, size);
    else
        ds_sub_saturating(&ds_process.tenant->page->mem_used, size);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Hooks
 * ------------------------------------------------------------------------------------------------------------- */

#define REAL_OR_FAIL(name) DS_REAL_OR_FAIL(name)
/* After the process released its entry at exit, late frees (runtime teardown) must not credit the tenant again. */
#define PASS_THROUGH()                                                                                               \
    (!ds_process.tenant || ds_depth || atomic_load_explicit(&ds_process.exiting, memory_order_relaxed))

/* A process of a tenant whose files do not hold up (ds_tenant.c, fail-closed) never initialises the driver: every
 * later driver call answers CUDA_ERROR_NOT_INITIALIZED, so it runs no CUDA work outside its quota and grant. The
 * interposed dlsym and cuGetProcAddress hand out this wrapper for cuInit in such a process too (ds_dlsym.c). */
DS_EXPORT CUresult cuInit(unsigned int Flags) {
    if (DS_UNLIKELY(ds_process.refused)) {
        static atomic_int told;
        if (!atomic_exchange(&told, 1))
            ds_log(DS_LOG_ERROR, "cuInit refused (CUDA_ERROR_NOT_PERMITTED): %s", ds_process.refused_why);
        return CUDA_ERROR_NOT_PERMITTED;
    }
    REAL_OR_FAIL(cuInit);
    if (PASS_THROUGH())
        return real(Flags);
    ds_depth++;
    CUresult r = real(Flags);
    ds_depth--;
    if (r == CUDA_SUCCESS)
        ds_attach();
    return r;
}

/* Charge size, call the allocation, record key -> size, or credit back if the driver failed. Kind 0: the charge is
 * held (until the process exits), not recorded for a free. */
#define CHARGED_CALL(kind, size, call, keyexpr)                                                                      \
    do {                                                                                                             \
        uint64_t sz_ = (size);                                                                                       \
        if (!ds_charge(sz_))                                                                                         \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                                         \
        ds_depth++;                                                                                                  \
        CUresult r_ = (call);                                                                                        \
        ds_depth--;                                                                                                  \
        if (r_ != CUDA_SUCCESS) {                                                                                    \
            ds_uncharge(sz_);                                                                                        \
            return r_;                                                                                               \
        }                                                                                                            \
        if ((kind) && !track_add((kind), (uint64_t)(keyexpr), sz_))                                                  \
            DS_LOG(DS_LOG_WARN, "allocation record lost (out of host memory): its free will not be credited");       \
        return r_;                                                                                                   \
    } while (0)

DS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    REAL_OR_FAIL(cuMemAlloc_v2);
    if (PASS_THROUGH() || !dptr || !bytesize)
        return real(dptr, bytesize);
    CHARGED_CALL(K_PTR, bytesize, real(dptr, bytesize), *dptr);
}

DS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    REAL_OR_FAIL(cuMemAllocManaged);
    if (PASS_THROUGH() || !dptr || !bytesize)
        return real(dptr, bytesize, flags);
    CHARGED_CALL(K_PTR, bytesize, real(dptr, bytesize, flags), *dptr);
}

DS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                      unsigned int ElementSizeBytes) {
    REAL_OR_FAIL(cuMemAllocPitch_v2);
    if (PASS_THROUGH() || !dptr || !pPitch || !WidthInBytes || !Height ||
        WidthInBytes > UINT64_MAX / Height)
        return real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    /* the pitch is the driver's choice: charge the lower bound first, then the padding */
    uint64_t lower = (uint64_t)WidthInBytes * Height;
    if (!ds_charge(lower))
        return CUDA_ERROR_OUT_OF_MEMORY;
    ds_depth++;
    CUresult r = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    ds_depth--;
    if (r != CUDA_SUCCESS) {
        ds_uncharge(lower);
        return r;
    }
    uint64_t total = (uint64_t)*pPitch * Height;
    if (total > lower && !ds_charge(total - lower)) {
        ds_depth++;
        if (ds_real.cuMemFree_v2)
            ds_real.cuMemFree_v2(*dptr);
        ds_depth--;
        ds_uncharge(lower);
        *dptr = 0;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (total < lower)
        total = lower;
    track_add(K_PTR, *dptr, total);
    return r;
}

DS_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    REAL_OR_FAIL(cuMemFree_v2);
    if (PASS_THROUGH() || !dptr)
        return real(dptr);
    ds_depth++;
    ds_join_all(); /* kernels still queued on physical streams may use the memory: the free must wait for them */
    CUresult r = real(dptr);
    ds_depth--;
    if (r == CUDA_SUCCESS)
        ds_uncharge(track_del(K_PTR, dptr));
    return r;
}

/* Stream-ordered allocations: charged at the call, credited when the free is enqueued. Both are operations on their
 * stream (ds_streams.c): a free first joins the kernels of the stream's physical stream, which may still use the
 * memory; kernels after an allocation wait for it. */
static bool captured(CUstream s, int pt) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    PFN_cuStreamIsCapturing f = pt ? ds_real.cuStreamIsCapturing_ptsz : ds_real.cuStreamIsCapturing;
    if (!f)
        return false;
    ds_depth++;
    CUresult r = f(s, &st);
    ds_depth--;
    return r == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

#define ASYNC_ALLOC(name, pt, args)                                                                                  \
    REAL_OR_FAIL(name);                                                                                              \
    if (PASS_THROUGH() || !dptr || !bytesize)                                                                        \
        return real args;                                                                                            \
    struct ds_sop op_;                                                                                               \
    ds_depth++;                                                                                                      \
    ds_stream_before(&op_, DS_OP_OP, hStream, pt);                                                                   \
    ds_depth--;                                                                                                      \
    uint64_t sz_ = bytesize;                                                                                         \
    if (!ds_charge(sz_)) {                                                                                           \
        return CUDA_ERROR_OUT_OF_MEMORY;                                                                             \
    }                                                                                                                \
    ds_depth++;                                                                                                      \
    CUresult r_ = real args;                                                                                         \
    ds_stream_after(&op_, DS_OP_OP, r_);                                                                             \
    ds_depth--;                                                                                                      \
    if (r_ != CUDA_SUCCESS) {                                                                                        \
        ds_uncharge(sz_);                                                                                            \
        return r_;                                                                                                   \
    }                                                                                                                \
    /* captured into a graph: a graph memory node, held like cuGraphAddMemAllocNode's (a captured free does not \
     * give it back to the device) */                                                                              \
    if (atomic_load_explicit(&ds_process.capturing, memory_order_relaxed) && captured(hStream, pt))                 \
        return r_;                                                                                                   \
    if (!track_add(K_PTR, (uint64_t)*dptr, sz_))                                                                     \
        DS_LOG(DS_LOG_WARN, "allocation record lost (out of host memory): its free will not be credited");          \
    return r_;

DS_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ASYNC_ALLOC(cuMemAllocAsync, 0, (dptr, bytesize, hStream));
}
DS_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ASYNC_ALLOC(cuMemAllocAsync_ptsz, 1, (dptr, bytesize, hStream));
}
DS_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    ASYNC_ALLOC(cuMemAllocFromPoolAsync, 0, (dptr, bytesize, pool, hStream));
}
DS_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream hStream) {
    ASYNC_ALLOC(cuMemAllocFromPoolAsync_ptsz, 1, (dptr, bytesize, pool, hStream));
}

#define ASYNC_FREE(name, pt)                                                                                         \
    REAL_OR_FAIL(name);                                                                                              \
    if (PASS_THROUGH() || !dptr)                                                                                     \
        return real(dptr, hStream);                                                                                  \
    ds_depth++;                                                                                                      \
    struct ds_sop op_;                                                                                               \
    ds_stream_before(&op_, DS_OP_OP, hStream, pt);                                                                   \
    CUresult r = real(dptr, hStream);                                                                                \
    ds_stream_after(&op_, DS_OP_OP, r);                                                                              \
    ds_depth--;                                                                                                      \
    if (r == CUDA_SUCCESS)                                                                                           \
        ds_uncharge(track_del(K_PTR, dptr));                                                                         \
    return r;

DS_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { ASYNC_FREE(cuMemFreeAsync, 0); }
DS_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { ASYNC_FREE(cuMemFreeAsync_ptsz, 1); }

DS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
    REAL_OR_FAIL(cuMemCreate);
    /* only device-located physical memory is the tenant's device memory (host-located VMM is pinned host memory) */
    if (PASS_THROUGH() || !handle || !prop || !size || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return real(handle, size, prop, flags);
    CHARGED_CALL(K_VMM, size, real(handle, size, prop, flags), *handle);
}

/* Release what was charged for (kind, key) once the driver freed it. */
#define RELEASE_CALL(kind, key, call)                                                                                \
    do {                                                                                                             \
        if (PASS_THROUGH())                                                                                          \
            return (call);                                                                                           \
        ds_depth++;                                                                                                  \
        CUresult r_ = (call);                                                                                        \
        ds_depth--;                                                                                                  \
        if (r_ == CUDA_SUCCESS)                                                                                      \
            ds_uncharge(track_del((kind), (uint64_t)(key)));                                                         \
        return r_;                                                                                                   \
    } while (0)

DS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    REAL_OR_FAIL(cuMemRelease);
    RELEASE_CALL(K_VMM, handle, real(handle));
}

/* A pool's release threshold is memory the pool may keep after frees: a reservation charged in full while it is set.
 * A threshold that does not fit in the tenant's room (cudaMallocAsync users often ask for UINT64_MAX) is lowered to
 * 0 for the driver, so the pool gives freed memory back at the next synchronisation instead of keeping it unseen. */
DS_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    REAL_OR_FAIL(cuMemPoolSetAttribute);
    if (PASS_THROUGH() || !pool || !value || attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD || !ds_mem_limit())
        return real(pool, attr, value);
    uint64_t want = *(const uint64_t *)value, old = track_del(K_POOL, (uint64_t)(uintptr_t)pool);
    ds_uncharge(old);
    uint64_t set = want;
    if (want && !ds_charge(want)) {
        DS_LOG(DS_LOG_INFO, "pool release threshold %llu does not fit in the memory quota; 0 is used",
               (unsigned long long)want);
        set = 0;
    }
    ds_depth++;
    CUresult r = real(pool, attr, &set);
    ds_depth--;
    if (r != CUDA_SUCCESS) {
        /* the old threshold stays in force: keep it charged */
        ds_uncharge(set);
        if (old && ds_charge(old))
            track_add(K_POOL, (uint64_t)(uintptr_t)pool, old);
        return r;
    }
    if (set && !track_add(K_POOL, (uint64_t)(uintptr_t)pool, set))
        DS_LOG(DS_LOG_WARN, "pool record lost (out of host memory): its reservation stays charged");
    return r;
}

DS_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    REAL_OR_FAIL(cuMemPoolDestroy);
    RELEASE_CALL(K_POOL, (uintptr_t)pool, real(pool));
}

/* Graph memory nodes: charged when the node is added and held until the process exits (the driver's graph memory
 * pool keeps the memory across launches and frees until a trim; crediting earlier would let a tenant run past its
 * quota through graphs). Captured cuMemAllocAsync becomes such a node too: see cuMemAllocAsync. */
DS_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                          size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
    REAL_OR_FAIL(cuGraphAddMemAllocNode);
    if (PASS_THROUGH() || !nodeParams || !nodeParams->bytesize ||
        nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return real(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
    CHARGED_CALL(0, nodeParams->bytesize, real(phGraphNode, hGraph, dependencies, numDependencies, nodeParams), 0);
}

/* Each executable of a graph may hold its memory nodes' memory: the first is covered by the charge made when the
 * nodes were added (or the allocations captured), every later one is charged again, held until exit. A graph
 * handle instantiated before is recorded (K_GRAPH, never removed: a reused handle is charged from its first
 * instantiation, conservatively). */
static uint64_t graph_alloc_bytes(CUgraph g) {
    if (!ds_real.cuGraphGetNodes || !ds_real.cuGraphNodeGetType || !ds_real.cuGraphMemAllocNodeGetParams)
        return 0;
    size_t n = 0;
    ds_depth++;
    CUresult r = ds_real.cuGraphGetNodes(g, NULL, &n);
    CUgraphNode *nodes = r == CUDA_SUCCESS && n ? calloc(n, sizeof *nodes) : NULL;
    uint64_t total = 0;
    if (nodes && ds_real.cuGraphGetNodes(g, nodes, &n) == CUDA_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            CUgraphNodeType t;
            CUDA_MEM_ALLOC_NODE_PARAMS p;
            if (nodes[i] && ds_real.cuGraphNodeGetType(nodes[i], &t) == CUDA_SUCCESS &&
                t == CU_GRAPH_NODE_TYPE_MEM_ALLOC && ds_real.cuGraphMemAllocNodeGetParams(nodes[i], &p) == CUDA_SUCCESS)
                total += p.bytesize;
        }
    }
    ds_depth--;
    free(nodes);
    return total;
}

bool ds_graph_mem_instantiate(CUgraph g, uint64_t *charged) {
    *charged = 0;
    if (!g)
        return true;
    uint64_t bytes = graph_alloc_bytes(g);
    if (!bytes)
        return true;
    if (!track_del(K_GRAPH, (uint64_t)(uintptr_t)g)) {
        track_add(K_GRAPH, (uint64_t)(uintptr_t)g, 1); /* first executable: already charged */
        return true;
    }
    track_add(K_GRAPH, (uint64_t)(uintptr_t)g, 1);
    if (!ds_charge(bytes))
        return false;
    *charged = bytes;
    return true;
}

/* The generic entry points add memory-allocation nodes too (cudaGraphAddNode, 12.2+). */
#define ADD_NODE(call)                                                                                               \
    if (PASS_THROUGH() || !nodeParams || nodeParams->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC ||                         \
        !nodeParams->alloc.bytesize || nodeParams->alloc.poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)     \
        return call;                                                                                                 \
    CHARGED_CALL(0, nodeParams->alloc.bytesize, call, 0);

DS_EXPORT CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                  size_t numDependencies, CUgraphNodeParams *nodeParams) {
    REAL_OR_FAIL(cuGraphAddNode);
    ADD_NODE(real(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));
}

DS_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                     const void *edgeData, size_t numDependencies, CUgraphNodeParams *nodeParams) {
    REAL_OR_FAIL(cuGraphAddNode_v2);
    ADD_NODE(real(phGraphNode, hGraph, dependencies, edgeData, numDependencies, nodeParams));
}

static uint64_t format_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    default:
        return 4; /* 32-bit formats; unknown formats are charged as 32-bit */
    }
}

static uint64_t extent_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch) {
    uint64_t v = (uint64_t)(w ? w : 1) * (h ? h : 1);
    if (d > 1)
        v *= d;
    return v * (ch ? ch : 1) * format_bytes(f);
}

DS_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray) {
    REAL_OR_FAIL(cuArrayCreate_v2);
    if (PASS_THROUGH() || !pHandle || !pAllocateArray)
        return real(pHandle, pAllocateArray);
    const CUDA_ARRAY_DESCRIPTOR *d = pAllocateArray;
    CHARGED_CALL(K_ARRAY, extent_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels), real(pHandle, d),
                 (uintptr_t)*pHandle);
}

DS_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray) {
    REAL_OR_FAIL(cuArray3DCreate_v2);
    if (PASS_THROUGH() || !pHandle || !pAllocateArray)
        return real(pHandle, pAllocateArray);
    const CUDA_ARRAY3D_DESCRIPTOR *d = pAllocateArray;
    CHARGED_CALL(K_ARRAY, extent_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), real(pHandle, d),
                 (uintptr_t)*pHandle);
}

DS_EXPORT CUresult cuArrayDestroy(CUarray hArray) {
    REAL_OR_FAIL(cuArrayDestroy);
    if (PASS_THROUGH())
        return real(hArray);
    ds_depth++;
    ds_join_all(); /* queued kernels may still read the array */
    CUresult r = real(hArray);
    ds_depth--;
    if (r == CUDA_SUCCESS)
        ds_uncharge(track_del(K_ARRAY, (uintptr_t)hArray));
    return r;
}

DS_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pDesc,
                                          unsigned int numMipmapLevels) {
    REAL_OR_FAIL(cuMipmappedArrayCreate);
    if (PASS_THROUGH() || !pHandle || !pDesc)
        return real(pHandle, pDesc, numMipmapLevels);
    uint64_t total = 0;
    size_t w = pDesc->Width, h = pDesc->Height, d = pDesc->Depth;
    for (unsigned l = 0; l < (numMipmapLevels ? numMipmapLevels : 1) && l < 64; l++) {
        total += extent_bytes(w, h, d, pDesc->Format, pDesc->NumChannels);
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        d = d > 1 ? d / 2 : d;
    }
    CHARGED_CALL(K_MIPMAP, total, real(pHandle, pDesc, numMipmapLevels), (uintptr_t)*pHandle);
}

DS_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) {
    REAL_OR_FAIL(cuMipmappedArrayDestroy);
    if (PASS_THROUGH())
        return real(h);
    ds_depth++;
    ds_join_all();
    CUresult r = real(h);
    ds_depth--;
    if (r == CUDA_SUCCESS)
        ds_uncharge(track_del(K_MIPMAP, (uintptr_t)h));
    return r;
}

/* ---------------------------------------------------------------------------------------------------------------
 * What the tenant sees: total = its quota (never more than the device), free = what is left of it (never more than
 * the device really has free).
 * ------------------------------------------------------------------------------------------------------------- */
DS_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
    REAL_OR_FAIL(cuMemGetInfo_v2);
    if (PASS_THROUGH() || !free_b || !total_b)
        return real(free_b, total_b);
    size_t rf = 0, rt = 0;
    ds_depth++;
    CUresult r = real(&rf, &rt);
    ds_depth--;
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t limit = ds_mem_limit();
    if (limit) {
        uint64_t total = limit < rt ? limit : rt;
        uint64_t used = atomic_load(A64(&ds_process.tenant->page->mem_used));
        uint64_t left = used >= total ? 0 : total - used;
        rt = (size_t)total;
        rf = (size_t)(left < rf ? left : rf);
    }
    *free_b = rf;
    *total_b = rt;
    return r;
}

DS_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    REAL_OR_FAIL(cuDeviceTotalMem_v2);
    if (PASS_THROUGH() || !bytes)
        return real(bytes, dev);
    ds_depth++;
    CUresult r = real(bytes, dev);
    ds_depth--;
    uint64_t limit = ds_mem_limit();
    if (r == CUDA_SUCCESS && limit && limit < *bytes)
        *bytes = (size_t)limit;
    return r;
}
