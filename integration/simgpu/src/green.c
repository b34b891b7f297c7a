/*
 * green.c — green contexts of the simulated GPU (test double), with Hopper's split rules.
 *
 * A CUdevResource carries, in its opaque _internal_padding, which physical SMs it stands for and where it came
 * from. Splits hand out SMs in index order, so the same split gives the same physical SMs in every process.
 * Rules (notes/cuda-driver-abi.md §1.6, DESIGN.md): groups are multiples of 8 SMs (minimum 8), 2 with
 * IGNORE_SM_COSCHEDULING; at most 16 partitions including a non-empty remainder (132 SMs, minCount 8 -> 15x8 + 12,
 * as measured on the H100); split outputs and remainders cannot be split again (915); splitting under
 * CUDA_MPS_ACTIVE_THREAD_PERCENTAGE < 100 with MPS fails with 915; descriptors with several resources need groups
 * of one split call, that split's remainder among them allowed (measured on the H100, integration/gpu/remainder.sh).
 */
#include "simgpu.h"

#include <stdlib.h>
#include <string.h>

#define RES_MAGIC 0x53494d52u /* "SIMR" */
enum { RES_DEVICE = 1, RES_CTX = 2, RES_GROUP = 3, RES_REMAINDER = 4 };

struct res_priv {
    uint32_t magic;
    uint8_t kind;
    uint8_t device;
    uint16_t pad;
    uint64_t split_id;
    sim_mask sms;
};
_Static_assert(sizeof(struct res_priv) <= sizeof(((CUdevResource *)0)->_internal_padding), "fits the padding");

static void res_fill(CUdevResource *r, int kind, int dev, uint64_t split, const sim_mask *m, unsigned gran) {
    memset(r, 0, sizeof *r);
    r->type = CU_DEV_RESOURCE_TYPE_SM;
    r->sm.smCount = mask_count(m);
    r->sm.minSmPartitionSize = gran;
    r->sm.smCoscheduledAlignment = gran;
    struct res_priv p = {.magic = RES_MAGIC, .kind = (uint8_t)kind, .device = (uint8_t)dev, .split_id = split,
                         .sms = *m};
    memcpy(r->_internal_padding, &p, sizeof p);
}

static CUresult res_read(const CUdevResource *r, struct res_priv *p) {
    if (!r)
        return CUDA_ERROR_INVALID_VALUE;
    if (r->type != CU_DEV_RESOURCE_TYPE_SM)
        return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    memcpy(p, r->_internal_padding, sizeof *p);
    if (p->magic != RES_MAGIC || p->device >= g_sim.ndev)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetDevResource(CUdevice device, CUdevResource *resource, CUdevResourceType type) {
    CUresult r = sim_check_device(device);
    if (r)
        return r;
    if (!resource)
        return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_DEV_RESOURCE_TYPE_SM)
        return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    if ((r = sim_capture_unsafe_call()) != CUDA_SUCCESS) /* graph.c, "Unsafe calls" */
        return r;
    sim_mask all = {0};
    mask_range(&all, 0, g_sim.nsms);
    res_fill(resource, RES_DEVICE, device, 0, &all, SIM_SPLIT_MIN);
    return CUDA_SUCCESS;
}

static CUresult ctx_resource(const struct CUctx_st *c, CUdevResource *resource, CUdevResourceType type) {
    if (!resource)
        return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_DEV_RESOURCE_TYPE_SM)
        return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    res_fill(resource, RES_CTX, c->device, 0, &c->sms, SIM_SPLIT_MIN);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevResource(CUcontext hCtx, CUdevResource *resource, CUdevResourceType type) {
    SIM_CHECK_INIT();
    struct CUctx_st *c = hCtx ? hCtx : sim_current_ctx();
    if (!sim_ctx_valid(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    return ctx_resource(c, resource, type);
}

CUresult cuGreenCtxGetDevResource(CUgreenCtx hCtx, CUdevResource *resource, CUdevResourceType type) {
    SIM_CHECK_INIT();
    if (!hCtx || hCtx->magic != SIM_GREEN)
        return CUDA_ERROR_INVALID_HANDLE;
    return ctx_resource(&hCtx->ctx, resource, type);
}

CUresult cuDevSmResourceSplitByCount(CUdevResource *result, unsigned int *nbGroups, const CUdevResource *input,
                                     CUdevResource *remaining, unsigned int useFlags, unsigned int minCount) {
    SIM_CHECK_INIT();
    if (!nbGroups || !input)
        return CUDA_ERROR_INVALID_VALUE;
    struct res_priv in;
    CUresult r = res_read(input, &in);
    if (r)
        return r;
    if ((r = sim_capture_unsafe_call()) != CUDA_SUCCESS)
        return r;
    if (useFlags & ~(unsigned)(CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING |
                               CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE))
        return CUDA_ERROR_INVALID_VALUE;
    if (in.kind == RES_GROUP || in.kind == RES_REMAINDER)
        return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION; /* split outputs cannot be split again */
    if (g_sim.mps && g_sim.active_thread_pct < 100)
        return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION; /* measured on the H100 under MPS */
    unsigned gran = (useFlags & CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING) ? 2 : SIM_SPLIT_ALIGN;
    unsigned count = minCount < gran ? gran : minCount;
    count = (count + gran - 1) / gran * gran;
    unsigned avail = mask_count(&in.sms);
    unsigned maxg = avail / count;
    if (maxg * count < avail && maxg > SIM_MAX_PARTITIONS - 1)
        maxg = SIM_MAX_PARTITIONS - 1;
    if (maxg > SIM_MAX_PARTITIONS)
        maxg = SIM_MAX_PARTITIONS;
    if (maxg == 0)
        return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    if (!result) {
        *nbGroups = maxg; /* discovery */
        return CUDA_SUCCESS;
    }
    unsigned n = *nbGroups;
    if (n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (n > maxg)
        n = maxg;
    uint64_t split = sim_next_id();
    unsigned sm = 0;
    for (unsigned g = 0; g < n; g++) {
        sim_mask m = {0};
        for (unsigned k = 0; k < count; sm++) {
            if (mask_has(&in.sms, sm)) {
                mask_set(&m, sm);
                k++;
            }
        }
        res_fill(&result[g], RES_GROUP, in.device, split, &m, gran);
    }
    if (remaining) {
        sim_mask m = {0};
        for (; sm < SIM_MAX_SMS; sm++)
            if (mask_has(&in.sms, sm))
                mask_set(&m, sm);
        res_fill(remaining, RES_REMAINDER, in.device, split, &m, gran);
    }
    *nbGroups = n;
    return CUDA_SUCCESS;
}

CUresult cuDevSmResourceSplit(CUdevResource *result, unsigned int nbGroups, const CUdevResource *input,
                              CUdevResource *remainder, unsigned int flags, CU_DEV_SM_RESOURCE_GROUP_PARAMS *groupParams) {
    (void)result, (void)nbGroups, (void)input, (void)remainder, (void)flags, (void)groupParams;
    return CUDA_ERROR_NOT_SUPPORTED; /* CUDA 13.1; the simulated driver is 13.0 */
}

CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *phDesc, CUdevResource *resources, unsigned int nbResources) {
    SIM_CHECK_INIT();
    if (!phDesc || !resources || nbResources == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult ur = sim_capture_unsafe_call();
    if (ur != CUDA_SUCCESS)
        return ur;
    sim_mask m = {0};
    struct res_priv first = {0};
    for (unsigned i = 0; i < nbResources; i++) {
        struct res_priv p;
        CUresult r = res_read(&resources[i], &p);
        if (r)
            return r;
        if (i == 0)
            first = p;
        else if ((p.kind != RES_GROUP && p.kind != RES_REMAINDER) ||
                 (first.kind != RES_GROUP && first.kind != RES_REMAINDER) || p.split_id != first.split_id ||
                 p.device != first.device)
            return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION; /* several resources must come from one split */
        for (unsigned w = 0; w < SIM_MASK_WORDS; w++)
            m.w[w] |= p.sms.w[w];
    }
    struct CUdevResourceDesc_st *d = calloc(1, sizeof *d);
    if (!d)
        return CUDA_ERROR_OUT_OF_MEMORY;
    d->magic = SIM_DESC;
    d->sms = m;
    d->count = mask_count(&m);
    *phDesc = d;
    return CUDA_SUCCESS;
}

CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!phCtx || !desc || desc->magic != SIM_DESC)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags != CU_GREEN_CTX_DEFAULT_STREAM)
        return CUDA_ERROR_INVALID_VALUE; /* documented as required through 13.0 */
    if ((r = sim_capture_unsafe_call()) != CUDA_SUCCESS)
        return r;
    /* As measured on the H100 (integration/gpu/probes/greenperf.cu): creation waits for the work the process already
     * has on the device (102 ms behind a 100 ms kernel), without holding up other threads' launches. */
    uint64_t busy_until = 0;
    pthread_mutex_lock(&g_sim.lock);
    for (struct CUstream_st *x = g_sim.streams; x; x = x->next)
        if (x->device == dev && x->tail_ns > busy_until)
            busy_until = x->tail_ns;
    pthread_mutex_unlock(&g_sim.lock);
    sim_sleep_until(busy_until);
    struct CUgreenCtx_st *g = calloc(1, sizeof *g);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = SIM_GREEN;
    g->device = dev;
    g->id = sim_next_id();
    g->sms = desc->sms;
    g->ctx.magic = SIM_CTX;
    g->ctx.device = dev;
    g->ctx.green = g;
    g->ctx.id = g->id;
    g->ctx.sms = desc->sms;
    /* The green context retains the primary context (released on destroy). */
    pthread_mutex_lock(&g_sim.lock);
    g_sim.dev[dev].primary.refcount++;
    g_sim.dev[dev].primary_active = true;
    pthread_mutex_unlock(&g_sim.lock);
    *phCtx = g;
    return CUDA_SUCCESS;
}

CUresult cuGreenCtxDestroy(CUgreenCtx hCtx) {
    SIM_CHECK_INIT();
    if (!hCtx || hCtx->magic != SIM_GREEN)
        return CUDA_ERROR_INVALID_HANDLE;
    hCtx->magic = SIM_DEAD;
    hCtx->ctx.magic = SIM_DEAD; /* streams of it now fail with CONTEXT_IS_DESTROYED */
    cuDevicePrimaryCtxRelease_v2(hCtx->device);
    return CUDA_SUCCESS;
}

CUresult cuCtxFromGreenCtx(CUcontext *pContext, CUgreenCtx hCtx) {
    SIM_CHECK_INIT();
    if (!pContext)
        return CUDA_ERROR_INVALID_VALUE;
    if (!hCtx || hCtx->magic != SIM_GREEN)
        return CUDA_ERROR_INVALID_HANDLE;
    *pContext = &hCtx->ctx;
    return CUDA_SUCCESS;
}

CUresult cuGreenCtxGetId(CUgreenCtx greenCtx, unsigned long long *greenCtxId) {
    SIM_CHECK_INIT();
    if (!greenCtxId)
        return CUDA_ERROR_INVALID_VALUE;
    if (!greenCtx || greenCtx->magic != SIM_GREEN)
        return CUDA_ERROR_INVALID_HANDLE;
    *greenCtxId = greenCtx->id;
    return CUDA_SUCCESS;
}

CUresult cuGreenCtxRecordEvent(CUgreenCtx hCtx, CUevent hEvent) {
    SIM_CHECK_INIT();
    if (!hCtx || hCtx->magic != SIM_GREEN)
        return CUDA_ERROR_INVALID_HANDLE;
    return cuCtxRecordEvent(&hCtx->ctx, hEvent);
}

CUresult cuGreenCtxWaitEvent(CUgreenCtx hCtx, CUevent hEvent) {
    SIM_CHECK_INIT();
    if (!hCtx || hCtx->magic != SIM_GREEN)
        return CUDA_ERROR_INVALID_HANDLE;
    return cuCtxWaitEvent(&hCtx->ctx, hEvent);
}

CUresult cuGreenCtxStreamCreate(CUstream *phStream, CUgreenCtx greenCtx, unsigned int flags, int priority) {
    SIM_CHECK_INIT();
    if (!phStream)
        return CUDA_ERROR_INVALID_VALUE;
    if (!greenCtx || greenCtx->magic != SIM_GREEN)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!(flags & CU_STREAM_NON_BLOCKING) || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE; /* green streams must be non-blocking */
    CUcontext saved = sim_current_ctx();
    CUresult r = cuCtxPushCurrent_v2(&greenCtx->ctx);
    if (r)
        return r;
    r = cuStreamCreateWithPriority(phStream, flags, priority);
    CUcontext popped;
    cuCtxPopCurrent_v2(&popped);
    (void)saved;
    return r;
}
