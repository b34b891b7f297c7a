/*
 * device.c — cuInit, devices, attributes, error strings, contexts and primary contexts of the simulated GPU
 * (test double).
 */
#include "simgpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static CUresult g_init_result = CUDA_ERROR_NOT_INITIALIZED;

/* Per-thread context stack: cuCtxSetCurrent replaces the top, push/pop grow and shrink it. */
#define SIM_CTX_STACK 32
static _Thread_local struct {
    struct CUctx_st *stack[SIM_CTX_STACK];
    int depth;
} t_ctx;

/* The simulated GPU's device nodes model /dev/nvidia<N>: with DETSHARE_SIMGPU_DEVICE_DIR set (the container tests
 * set /dev), a process sees the simulated GPU only when a character device <dir>/detshare-simgpu<N> exists, which
 * DetShare's GPU edit puts into a container (integration/simgpu Devices); without one cuInit fails with
 * CUDA_ERROR_NO_DEVICE, as the real driver does in a container given no GPU. Unset: visible (host tests). */
static CUresult sim_device_nodes_visible(void) {
    const char *dir = getenv("DETSHARE_SIMGPU_DEVICE_DIR");
    if (!dir || !*dir)
        return CUDA_SUCCESS;
    for (int d = 0; d < SIM_MAX_DEVICES; d++) {
        char p[4096];
        struct stat sb;
        snprintf(p, sizeof p, "%s/detshare-simgpu%d", dir, d);
        if (stat(p, &sb) == 0 && S_ISCHR(sb.st_mode))
            return CUDA_SUCCESS;
    }
    sim_log("cuInit: no device node %s/detshare-simgpu<N>: no device", dir);
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuInit(unsigned int Flags) {
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (atomic_load_explicit(&g_sim.initialized, memory_order_acquire))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_sim.lock);
    if (!atomic_load(&g_sim.initialized)) {
        g_init_result = sim_device_nodes_visible();
        if (g_init_result == CUDA_SUCCESS)
            g_init_result = sim_state_open();
        if (g_init_result == CUDA_SUCCESS) {
            for (int d = 0; d < g_sim.ndev; d++) {
                struct sim_device *dv = &g_sim.dev[d];
                dv->primary.magic = SIM_CTX;
                dv->primary.device = d;
                dv->primary.primary = true;
                dv->primary.id = sim_next_id();
                mask_range(&dv->primary.sms, 0, g_sim.nsms);
                dv->legacy.magic = SIM_STREAM;
                dv->legacy.legacy = true;
                dv->legacy.id = sim_next_id();
                dv->legacy.next = g_sim.streams;
                g_sim.streams = &dv->legacy;
                dv->default_pool.magic = SIM_POOL;
                dv->default_pool.device = d;
                dv->current_pool = &dv->default_pool;
            }
            atomic_store_explicit(&g_sim.initialized, true, memory_order_release);
        }
    }
    CUresult r = g_init_result;
    pthread_mutex_unlock(&g_sim.lock);
    return r;
}

CUresult cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = SIM_DRIVER_VERSION; /* valid before cuInit, as on the real driver */
    return CUDA_SUCCESS;
}

static const struct {
    CUresult code;
    const char *name, *text;
} err_table[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "too many blocks in cooperative launch"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_MPS_CONNECTION_FAILED, "CUDA_ERROR_MPS_CONNECTION_FAILED", "MPS client failed to connect to the MPS control daemon or the MPS server"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not initiated in this stream"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_INVALID_CLUSTER_SIZE, "CUDA_ERROR_INVALID_CLUSTER_SIZE", "invalid cluster size"},
    {CUDA_ERROR_INVALID_RESOURCE_TYPE, "CUDA_ERROR_INVALID_RESOURCE_TYPE", "invalid resource type"},
    {CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION", "invalid resource configuration"},
    {CUDA_ERROR_STREAM_DETACHED, "CUDA_ERROR_STREAM_DETACHED", "stream is detached"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult err_lookup(CUresult error, const char **pStr, bool name) {
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof err_table / sizeof err_table[0]; i++) {
        if (err_table[i].code == error) {
            *pStr = name ? err_table[i].name : err_table[i].text;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **pStr) { return err_lookup(error, pStr, true); }
CUresult cuGetErrorString(CUresult error, const char **pStr) { return err_lookup(error, pStr, false); }

CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId) {
    if (!ppExportTable || !pExportTableId)
        return CUDA_ERROR_INVALID_VALUE;
    *ppExportTable = NULL; /* the private tables of the real driver do not exist here */
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult sim_check_device(CUdevice dev) {
    SIM_CHECK_INIT();
    if (dev < 0 || dev >= g_sim.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    SIM_CHECK_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_sim.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    SIM_CHECK_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_sim.ndev;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "DetShare simulated GPU");
    return CUDA_SUCCESS;
}

/* "SIM-" then the device index and SM count, so two configurations never share a UUID. */
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    static const char base[16] = {'S', 'I', 'M', '-', 'D', 'E', 'T', 'S', 'H', 'A', 'R', 'E', 0, 0, 0, 0};
    memcpy(uuid->bytes, base, 16);
    uuid->bytes[12] = (char)(g_sim.nsms >> 8);
    uuid->bytes[13] = (char)(g_sim.nsms & 0xff);
    uuid->bytes[15] = (char)dev;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = (size_t)g_sim.mem_total;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    int v;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: v = 512; break;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = (int)g_sim.nsms; break;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: v = sim_compute_mode(dev); break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x10 + dev; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 52428800; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 3; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = 233472; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: v = dev; break;
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: v = 2; break;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE: v = 32505856; break;
    case CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE: v = 134213632; break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: v = 1; break;
    default:
        if ((int)attrib <= 0 || (int)attrib > 150)
            return CUDA_ERROR_INVALID_VALUE;
        v = 0; /* a valid attribute the test double does not model */
    }
    *pi = v;
    return CUDA_SUCCESS;
}

CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!major || !minor)
        return CUDA_ERROR_INVALID_VALUE;
    *major = 9;
    *minor = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", 0x10 + dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId) {
    SIM_CHECK_INIT();
    if (!dev || !pciBusId)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned dom, bus, d, f;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &dom, &bus, &d, &f) != 4 || bus < 0x10 || bus >= 0x10u + (unsigned)g_sim.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = (CUdevice)(bus - 0x10);
    return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev) {
    CUresult r = sim_check_device(dev);
    if (!r)
        r = sim_check_device(peerDev);
    if (r)
        return r;
    if (!canAccessPeer)
        return CUDA_ERROR_INVALID_VALUE;
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}

/* ---- contexts ---- */

struct CUctx_st *sim_current_ctx(void) { return t_ctx.depth > 0 ? t_ctx.stack[t_ctx.depth - 1] : NULL; }

bool sim_ctx_valid(CUcontext c) { return c && c->magic == SIM_CTX; }

void sim_ctx_ensure_primary(int dev) {
    pthread_mutex_lock(&g_sim.lock);
    g_sim.dev[dev].primary_active = true;
    pthread_mutex_unlock(&g_sim.lock);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_exclusive_refuses(dev))
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    pthread_mutex_lock(&g_sim.lock);
    g_sim.dev[dev].primary.refcount++;
    g_sim.dev[dev].primary_active = true;
    pthread_mutex_unlock(&g_sim.lock);
    *pctx = &g_sim.dev[dev].primary;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    pthread_mutex_lock(&g_sim.lock);
    struct sim_device *d = &g_sim.dev[dev];
    if (d->primary.refcount <= 0)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (--d->primary.refcount == 0)
        d->primary_active = false;
    pthread_mutex_unlock(&g_sim.lock);
    return r;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (flags & ~(unsigned)CU_CTX_FLAGS_MASK)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_sim.lock);
    g_sim.dev[dev].primary_flags = flags;
    g_sim.dev[dev].primary.flags = flags;
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_sim.lock);
    *flags = g_sim.dev[dev].primary_flags;
    *active = g_sim.dev[dev].primary_active;
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    pthread_mutex_lock(&g_sim.lock);
    g_sim.dev[dev].primary.refcount = 0;
    g_sim.dev[dev].primary_active = false;
    g_sim.dev[dev].primary_flags = 0;
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}

static CUresult ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev, unsigned sm_limit) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!pctx || (flags & ~(unsigned)CU_CTX_FLAGS_MASK))
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_exclusive_refuses(dev))
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    if (t_ctx.depth >= SIM_CTX_STACK)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = SIM_CTX;
    c->device = dev;
    c->flags = flags;
    c->refcount = 1;
    c->id = sim_next_id();
    mask_range(&c->sms, 0, sm_limit && sm_limit < g_sim.nsms ? sm_limit : g_sim.nsms);
    t_ctx.stack[t_ctx.depth++] = c; /* cuCtxCreate makes the new context current */
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) { return ctx_create(pctx, flags, dev, 0); }

static CUresult affinity_limit(const CUexecAffinityParam *p, int n, unsigned *limit) {
    *limit = 0;
    if (n < 0 || (n > 0 && !p))
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < n; i++) {
        if (p[i].type != CU_EXEC_AFFINITY_TYPE_SM_COUNT || p[i].param.smCount.val == 0)
            return CUDA_ERROR_INVALID_VALUE;
        *limit = p[i].param.smCount.val;
    }
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                        CUdevice dev) {
    unsigned limit;
    CUresult r = affinity_limit(paramsArray, numParams, &limit);
    return r ? r : ctx_create(pctx, flags, dev, limit);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev) {
    unsigned limit = 0;
    if (ctxCreateParams) {
        if (ctxCreateParams->cigParams)
            return CUDA_ERROR_NOT_SUPPORTED;
        CUresult r = affinity_limit(ctxCreateParams->execAffinityParams, ctxCreateParams->numExecAffinityParams,
                                    &limit);
        if (r)
            return r;
    }
    return ctx_create(pctx, flags, dev, limit);
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    SIM_CHECK_INIT();
    if (!sim_ctx_valid(ctx) || ctx->primary || ctx->green)
        return CUDA_ERROR_INVALID_CONTEXT;
    ctx->magic = SIM_DEAD;
    for (int i = 0; i < t_ctx.depth; i++) {
        if (t_ctx.stack[i] == ctx) {
            memmove(&t_ctx.stack[i], &t_ctx.stack[i + 1], (size_t)(t_ctx.depth - i - 1) * sizeof(void *));
            t_ctx.depth--;
            i--;
        }
    }
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    SIM_CHECK_INIT();
    if (!sim_ctx_valid(ctx) || t_ctx.depth >= SIM_CTX_STACK)
        return CUDA_ERROR_INVALID_CONTEXT;
    t_ctx.stack[t_ctx.depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    SIM_CHECK_INIT();
    if (t_ctx.depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *c = t_ctx.stack[--t_ctx.depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    SIM_CHECK_INIT();
    if (!ctx) {
        if (t_ctx.depth > 0)
            t_ctx.depth--;
        return CUDA_SUCCESS;
    }
    if (!sim_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_ctx.depth == 0)
        t_ctx.depth = 1;
    t_ctx.stack[t_ctx.depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
    SIM_CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = sim_current_ctx();
    return CUDA_SUCCESS;
}

static CUresult ctx_or_current(CUcontext ctx, struct CUctx_st **out) {
    SIM_CHECK_INIT();
    struct CUctx_st *c = ctx ? ctx : sim_current_ctx();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (c->magic == SIM_DEAD)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (c->magic != SIM_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) { return cuCtxGetDevice_v2(device, NULL); }

CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
    struct CUctx_st *c;
    CUresult r = ctx_or_current(ctx, &c);
    if (r)
        return r;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = c->device;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetFlags(unsigned int *flags) {
    struct CUctx_st *c;
    CUresult r = ctx_or_current(NULL, &c);
    if (r)
        return r;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = c->flags;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetFlags(unsigned int flags) {
    struct CUctx_st *c;
    CUresult r = ctx_or_current(NULL, &c);
    if (r)
        return r;
    if (flags & ~(unsigned)CU_CTX_FLAGS_MASK)
        return CUDA_ERROR_INVALID_VALUE;
    c->flags = flags;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId) {
    struct CUctx_st *c;
    CUresult r = ctx_or_current(ctx, &c);
    if (r)
        return r;
    if (!ctxId)
        return CUDA_ERROR_INVALID_VALUE;
    *ctxId = c->id;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version) {
    struct CUctx_st *c;
    CUresult r = ctx_or_current(ctx, &c);
    if (r)
        return r;
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 3020;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit) {
    struct CUctx_st *c;
    CUresult r = ctx_or_current(NULL, &c);
    if (r)
        return r;
    if (!pvalue || (int)limit < 0 || limit > CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
        return CUDA_ERROR_INVALID_VALUE;
    static const size_t defaults[] = {1024, 1048576, 8388608, 2, 2048, 32, 0};
    *pvalue = defaults[limit];
    return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    struct CUctx_st *c;
    CUresult r = ctx_or_current(NULL, &c);
    if (r)
        return r;
    (void)value;
    if ((int)limit < 0 || limit > CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
    SIM_CHECK_INIT();
    if (leastPriority)
        *leastPriority = 0;
    if (greatestPriority)
        *greatestPriority = -5;
    return CUDA_SUCCESS;
}
