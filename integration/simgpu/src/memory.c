/*
 * memory.c — device memory of the simulated GPU (test double): host memory behind device pointers.
 *
 * Every allocation family of cuda_abi.h is here. Device memory is accounted device-wide in the shared state (all
 * processes) and per process in its slot, so a dead process's memory is given back by whoever notices first.
 * Sizes are accounted exactly as requested (pitch allocations as pitch*height, VMM handles as their size); the
 * real driver's 2 MiB rounding of small allocations is not modelled. Pools release memory at free time
 * (reserved == used).
 */
#include "simgpu.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define VMM_GRANULARITY (2ULL << 20)
#define PITCH_ALIGN 512

enum { K_DEV = 1, K_HOST = 2, K_RESERVE = 3 };

typedef struct {
    uintptr_t base;
    size_t size;
    int kind;
    int dev;
    bool managed;
    bool host_owned; /* cuMemAllocHost/cuMemHostAlloc: free with free() */
    struct CUmemPoolHandle_st *pool;
} region;

typedef struct {
    uintptr_t base;
    size_t size;
    struct vmm_handle *h;
} mapping;

struct vmm_handle {
    uint32_t magic;
    int fd;
    size_t size;
    int dev;
    bool counted;
    bool released;
    int maps;
};
#define VMM_MAGIC 0x51c7000fu

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static region *regions;
static size_t nregions, capregions;
static mapping *maps;
static size_t nmaps, capmaps;

/* mem_lock held. Index of the region containing p, or -1. */
static long region_find(uintptr_t p) {
    size_t lo = 0, hi = nregions;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (regions[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    region *r = &regions[lo - 1];
    return p < r->base + r->size || (r->size == 0 && p == r->base) ? (long)(lo - 1) : -1;
}

static CUresult region_add(region r) {
    pthread_mutex_lock(&mem_lock);
    if (nregions == capregions) {
        size_t nc = capregions ? capregions * 2 : 64;
        region *n = realloc(regions, nc * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&mem_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        regions = n;
        capregions = nc;
    }
    size_t i = nregions;
    while (i > 0 && regions[i - 1].base > r.base) {
        regions[i] = regions[i - 1];
        i--;
    }
    regions[i] = r;
    nregions++;
    pthread_mutex_unlock(&mem_lock);
    return CUDA_SUCCESS;
}

/* Removes the region starting exactly at base with the given kind; returns it in *out. */
static bool region_take(uintptr_t base, int kind, region *out) {
    pthread_mutex_lock(&mem_lock);
    long i = region_find(base);
    if (i < 0 || regions[i].base != base || regions[i].kind != kind) {
        pthread_mutex_unlock(&mem_lock);
        return false;
    }
    *out = regions[i];
    memmove(&regions[i], &regions[i + 1], (nregions - (size_t)i - 1) * sizeof *regions);
    nregions--;
    pthread_mutex_unlock(&mem_lock);
    return true;
}

CUresult sim_mem_check_range(CUdeviceptr p, size_t n) {
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t a = (uintptr_t)p;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_lock);
    long i = region_find(a);
    if (i >= 0 && regions[i].kind == K_DEV && a + n <= regions[i].base + regions[i].size)
        r = CUDA_SUCCESS;
    /* VMM: the range may span several adjacent mappings. */
    while (r && n > 0) {
        size_t k = 0;
        while (k < nmaps && !(a >= maps[k].base && a < maps[k].base + maps[k].size))
            k++;
        if (k == nmaps)
            break;
        size_t chunk = maps[k].base + maps[k].size - a;
        if (chunk >= n)
            r = CUDA_SUCCESS;
        else {
            a += chunk;
            n -= chunk;
        }
    }
    pthread_mutex_unlock(&mem_lock);
    return r;
}

void *sim_devptr(CUdeviceptr p) { return (void *)(uintptr_t)p; }

/* Device-wide accounting in the shared state; delta > 0 may fail with OUT_OF_MEMORY. */
static CUresult account(int dev, int64_t delta) {
    if (delta == 0)
        return CUDA_SUCCESS;
    sim_shared_lock();
    struct sim_dev_state *ds = &g_sim.st->dev[dev];
    struct sim_proc_slot *me = &g_sim.st->procs[g_sim.slot];
    if (delta > 0) {
        if (g_sim.mps_mem_limit && me->mem[dev] + (uint64_t)delta > g_sim.mps_mem_limit) {
            sim_shared_unlock(); /* the MPS server's per-client limit */
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        uint64_t used = atomic_load(&ds->mem_used);
        if (used + (uint64_t)delta > g_sim.mem_total) {
            sim_reap_dead_procs();
            used = atomic_load(&ds->mem_used);
            if (used + (uint64_t)delta > g_sim.mem_total) {
                sim_shared_unlock();
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        atomic_store(&ds->mem_used, used + (uint64_t)delta);
        me->mem[dev] += (uint64_t)delta;
    } else {
        uint64_t d = (uint64_t)(-delta), used = atomic_load(&ds->mem_used);
        atomic_store(&ds->mem_used, used >= d ? used - d : 0);
        me->mem[dev] = me->mem[dev] >= d ? me->mem[dev] - d : 0;
    }
    sim_shared_unlock();
    return CUDA_SUCCESS;
}

static CUresult current_dev(int *dev) {
    SIM_CHECK_INIT();
    struct CUctx_st *c = sim_current_ctx();
    if (!c || c->magic != SIM_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = c->device;
    return CUDA_SUCCESS;
}

static void *map_anon(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static CUresult dev_alloc(CUdeviceptr *dptr, size_t bytes, int dev, bool managed, struct CUmemPoolHandle_st *pool) {
    if (!dptr || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (pool) {
        /* Reserve in the pool first so that concurrent allocations cannot both pass its maxSize. */
        pthread_mutex_lock(&mem_lock);
        bool fits = !pool->max_size || pool->used + bytes <= pool->max_size;
        if (fits) {
            pool->used += bytes;
            if (pool->used > pool->used_high)
                pool->used_high = pool->used;
            if (pool->used > pool->reserved_high)
                pool->reserved_high = pool->used;
        }
        pthread_mutex_unlock(&mem_lock);
        if (!fits)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = account(dev, (int64_t)bytes);
    void *p = NULL;
    if (!r && !(p = map_anon(bytes))) {
        account(dev, -(int64_t)bytes);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!r && (r = region_add((region){.base = (uintptr_t)p, .size = bytes, .kind = K_DEV, .dev = dev,
                                       .managed = managed, .pool = pool}))) {
        munmap(p, bytes);
        account(dev, -(int64_t)bytes);
    }
    if (r) {
        if (pool) {
            pthread_mutex_lock(&mem_lock);
            pool->used -= bytes;
            pthread_mutex_unlock(&mem_lock);
        }
        return r;
    }
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult sim_graph_mem_alloc(CUdeviceptr *dptr, size_t bytes, int dev) {
    if (dev < 0 || dev >= g_sim.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    return dev_alloc(dptr, bytes, dev, false, NULL);
}

static CUresult dev_free(CUdeviceptr dptr) {
    SIM_CHECK_INIT();
    region reg;
    if (!region_take((uintptr_t)dptr, K_DEV, &reg))
        return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)reg.base, reg.size);
    if (reg.pool) {
        pthread_mutex_lock(&mem_lock);
        reg.pool->used -= reg.size;
        pthread_mutex_unlock(&mem_lock);
    }
    account(reg.dev, -(int64_t)reg.size);
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    int dev;
    CUresult r = current_dev(&dev);
    if (!r)
        r = sim_capture_unsafe_call(); /* cudaMalloc: CUDA's example of a potentially unsafe call (graph.c) */
    return r ? r : dev_alloc(dptr, bytesize, dev, false, NULL);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes) {
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    if (!pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    if (Height > SIZE_MAX / pitch)
        return CUDA_ERROR_INVALID_VALUE;
    r = dev_alloc(dptr, pitch * Height, dev, false, NULL);
    if (!r)
        *pPitch = pitch;
    return r;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return dev_alloc(dptr, bytesize, dev, true, NULL); /* counted as device memory, as HAMi does */
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    SIM_CHECK_INIT();
    if (!dptr)
        return CUDA_SUCCESS;
    return dev_free(dptr);
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    SIM_CHECK_INIT();
    CUresult r = CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&mem_lock);
    long i = region_find((uintptr_t)dptr);
    if (i >= 0 && regions[i].kind == K_DEV) {
        if (pbase)
            *pbase = regions[i].base;
        if (psize)
            *psize = regions[i].size;
        r = CUDA_SUCCESS;
    }
    for (size_t k = 0; r && k < nmaps; k++) {
        if ((uintptr_t)dptr >= maps[k].base && (uintptr_t)dptr < maps[k].base + maps[k].size) {
            if (pbase)
                *pbase = maps[k].base;
            if (psize)
                *psize = maps[k].size;
            r = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&mem_lock);
    return r;
}

CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    if (!free_ || !total)
        return CUDA_ERROR_INVALID_VALUE;
    sim_shared_lock();
    sim_reap_dead_procs();
    uint64_t used = atomic_load(&g_sim.st->dev[dev].mem_used);
    sim_shared_unlock();
    *total = (size_t)g_sim.mem_total;
    *free_ = used >= g_sim.mem_total ? 0 : (size_t)(g_sim.mem_total - used);
    return CUDA_SUCCESS;
}

/* ---- stream-ordered allocation and pools ---- */

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytes, struct CUmemPoolHandle_st *pool, CUstream h, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (s->capture) /* a graph memory-allocation node (from the device's graph memory pool, whatever the pool) */
        return dptr && bytes ? sim_capture_mem_alloc(s, ctx, dptr, bytes) : CUDA_ERROR_INVALID_VALUE;
    if (!pool)
        pool = g_sim.dev[ctx->device].current_pool;
    if (pool->magic != SIM_POOL)
        return CUDA_ERROR_INVALID_VALUE;
    return dev_alloc(dptr, bytes, pool->device, false, pool);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return alloc_async(dptr, bytesize, NULL, hStream, false);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return alloc_async(dptr, bytesize, NULL, hStream, true);
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, bytesize, pool, hStream, false);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, bytesize, pool, hStream, true);
}

static CUresult free_async(CUdeviceptr dptr, CUstream h, bool ptd) {
    struct CUstream_st *s;
    struct CUctx_st *ctx;
    CUresult r = sim_stream_resolve(h, ptd, &s, &ctx);
    if (r)
        return r;
    if (s->capture)
        return sim_capture_mem_free(s, dptr); /* a graph memory-free node */
    return dev_free(dptr);
}
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream, false); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream, true); }

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
    SIM_CHECK_INIT();
    if (!pool || !poolProps || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (poolProps->location.id < 0 || poolProps->location.id >= g_sim.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->magic = SIM_POOL;
    p->device = poolProps->location.id;
    p->max_size = poolProps->maxSize;
    *pool = p;
    return CUDA_SUCCESS;
}

static bool pool_ok(CUmemoryPool p) { return p && p->magic == SIM_POOL; }

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    SIM_CHECK_INIT();
    if (!pool_ok(pool) || pool == &g_sim.dev[pool->device].default_pool)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_sim.lock);
    if (g_sim.dev[pool->device].current_pool == pool)
        g_sim.dev[pool->device].current_pool = &g_sim.dev[pool->device].default_pool;
    pool->magic = SIM_DEAD;
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
    SIM_CHECK_INIT();
    (void)minBytesToKeep; /* nothing is cached beyond what is in use */
    return pool_ok(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    SIM_CHECK_INIT();
    if (!pool_ok(pool) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_lock);
    CUresult r = CUDA_SUCCESS;
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        pool->release_threshold = *(const uint64_t *)value;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*(const uint64_t *)value != 0) {
            r = CUDA_ERROR_INVALID_VALUE; /* only a reset to 0 is allowed */
            break;
        }
        if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
            pool->reserved_high = pool->used;
        else
            pool->used_high = pool->used;
        break;
    default:
        r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&mem_lock);
    return r;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    SIM_CHECK_INIT();
    if (!pool_ok(pool) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_lock);
    CUresult r = CUDA_SUCCESS;
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = 1;
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(uint64_t *)value = pool->release_threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(uint64_t *)value = pool->used; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(uint64_t *)value = pool->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(uint64_t *)value = pool->used_high; break;
    default: r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&mem_lock);
    return r;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!pool_out)
        return CUDA_ERROR_INVALID_VALUE;
    *pool_out = &g_sim.dev[dev].default_pool;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_sim.lock);
    *pool = g_sim.dev[dev].current_pool;
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!pool_ok(pool) || pool->device != dev)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_sim.lock);
    g_sim.dev[dev].current_pool = pool;
    pthread_mutex_unlock(&g_sim.lock);
    return CUDA_SUCCESS;
}

/* ---- virtual memory management: memfd-backed handles mapped into reserved ranges ---- */

static CUresult check_prop(const CUmemAllocationProp *prop) {
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (prop->location.id < 0 || prop->location.id >= g_sim.ndev)
            return CUDA_ERROR_INVALID_DEVICE;
    } else if (prop->location.type != CU_MEM_LOCATION_TYPE_HOST &&
               prop->location.type != CU_MEM_LOCATION_TYPE_HOST_NUMA &&
               prop->location.type != CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option) {
    SIM_CHECK_INIT();
    if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_prop(prop);
    if (r)
        return r;
    *granularity = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    SIM_CHECK_INIT();
    CUresult r = check_prop(prop);
    if (r)
        return r;
    if (!handle || size == 0 || size % VMM_GRANULARITY || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    bool counted = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
    int dev = counted ? prop->location.id : 0;
    if (counted && (r = account(dev, (int64_t)size)))
        return r;
    struct vmm_handle *h = calloc(1, sizeof *h);
    int fd = memfd_create("detshare-simgpu-vmm", MFD_CLOEXEC);
    if (!h || fd < 0 || ftruncate(fd, (off_t)size) < 0) {
        free(h);
        if (fd >= 0)
            close(fd);
        if (counted)
            account(dev, -(int64_t)size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *h = (struct vmm_handle){.magic = VMM_MAGIC, .fd = fd, .size = size, .dev = dev, .counted = counted};
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

static struct vmm_handle *vmm_get(CUmemGenericAllocationHandle handle) {
    struct vmm_handle *h = (struct vmm_handle *)(uintptr_t)handle;
    return h && h->magic == VMM_MAGIC && !h->released ? h : NULL;
}

/* mem_lock held: frees the physical memory once the handle is released and unmapped everywhere. */
static void vmm_maybe_free(struct vmm_handle *h) {
    if (!h->released || h->maps > 0)
        return;
    close(h->fd);
    h->magic = SIM_DEAD;
    if (h->counted)
        account(h->dev, -(int64_t)h->size);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    SIM_CHECK_INIT();
    pthread_mutex_lock(&mem_lock);
    struct vmm_handle *h = vmm_get(handle);
    if (!h) {
        pthread_mutex_unlock(&mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    h->released = true;
    vmm_maybe_free(h);
    pthread_mutex_unlock(&mem_lock);
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    SIM_CHECK_INIT();
    if (!ptr || size == 0 || size % VMM_GRANULARITY || flags != 0 || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > VMM_GRANULARITY ? alignment : VMM_GRANULARITY;
    /* Over-reserve to honour the alignment, then trim. `addr` is only a hint, as on the driver. */
    void *raw = mmap(addr ? (void *)(uintptr_t)addr : NULL, size + align, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t a = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
    if (a > (uintptr_t)raw)
        munmap(raw, a - (uintptr_t)raw);
    uintptr_t end = (uintptr_t)raw + size + align;
    if (end > a + size)
        munmap((void *)(a + size), end - (a + size));
    CUresult r = region_add((region){.base = a, .size = size, .kind = K_RESERVE});
    if (r) {
        munmap((void *)a, size);
        return r;
    }
    *ptr = a;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    SIM_CHECK_INIT();
    pthread_mutex_lock(&mem_lock);
    for (size_t k = 0; k < nmaps; k++) {
        if (maps[k].base >= (uintptr_t)ptr && maps[k].base < (uintptr_t)ptr + size) {
            pthread_mutex_unlock(&mem_lock);
            return CUDA_ERROR_INVALID_VALUE; /* still mapped */
        }
    }
    pthread_mutex_unlock(&mem_lock);
    region reg;
    if (!region_take((uintptr_t)ptr, K_RESERVE, &reg))
        return CUDA_ERROR_INVALID_VALUE;
    if (reg.size != size) {
        region_add(reg);
        return CUDA_ERROR_INVALID_VALUE;
    }
    munmap((void *)reg.base, reg.size);
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    SIM_CHECK_INIT();
    if (!ptr || size == 0 || size % VMM_GRANULARITY || offset % VMM_GRANULARITY || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_lock);
    struct vmm_handle *h = vmm_get(handle);
    long i = region_find((uintptr_t)ptr);
    CUresult r = CUDA_SUCCESS;
    if (!h || offset + size > h->size)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (i < 0 || regions[i].kind != K_RESERVE || (uintptr_t)ptr + size > regions[i].base + regions[i].size)
        r = CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; !r && k < nmaps; k++)
        if ((uintptr_t)ptr < maps[k].base + maps[k].size && maps[k].base < (uintptr_t)ptr + size)
            r = CUDA_ERROR_ALREADY_MAPPED;
    if (!r && nmaps == capmaps) {
        size_t nc = capmaps ? capmaps * 2 : 32;
        mapping *n = realloc(maps, nc * sizeof *n);
        if (!n)
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            maps = n;
            capmaps = nc;
        }
    }
    if (!r && mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, h->fd,
                   (off_t)offset) == MAP_FAILED)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (!r) {
        maps[nmaps++] = (mapping){(uintptr_t)ptr, size, h};
        h->maps++;
    }
    pthread_mutex_unlock(&mem_lock);
    return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    SIM_CHECK_INIT();
    pthread_mutex_lock(&mem_lock);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; k < nmaps; k++) {
        if (maps[k].base == (uintptr_t)ptr && maps[k].size == size) {
            /* Put the reservation back in place of the mapping. */
            mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                 -1, 0);
            struct vmm_handle *h = maps[k].h;
            maps[k] = maps[--nmaps];
            h->maps--;
            vmm_maybe_free(h);
            r = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&mem_lock);
    return r;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    SIM_CHECK_INIT();
    if (!desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            return CUDA_ERROR_INVALID_VALUE;
        if (desc[i].location.id < 0 || desc[i].location.id >= g_sim.ndev)
            return CUDA_ERROR_INVALID_DEVICE;
        if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
    }
    return sim_mem_check_range(ptr, size); /* the whole range must be mapped */
}

/* ---- arrays ---- */

static size_t format_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

static CUresult array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch, size_t *out) {
    size_t e = format_bytes(f);
    if (w == 0 || e == 0 || (ch != 1 && ch != 2 && ch != 4))
        return CUDA_ERROR_INVALID_VALUE;
    *out = w * (h ? h : 1) * (d ? d : 1) * e * ch;
    return CUDA_SUCCESS;
}

static CUresult array_alloc(void **mem, size_t bytes, int *devp) {
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    if ((r = account(dev, (int64_t)bytes)))
        return r;
    *mem = map_anon(bytes);
    if (!*mem) {
        account(dev, -(int64_t)bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *devp = dev;
    return CUDA_SUCCESS;
}

struct array_obj {
    struct CUarray_st a;
    int dev;
};

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d) {
    SIM_CHECK_INIT();
    if (!pHandle || !d)
        return CUDA_ERROR_INVALID_VALUE;
    size_t bytes;
    CUresult r = array_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels, &bytes);
    if (r)
        return r;
    struct array_obj *o = calloc(1, sizeof *o);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if ((r = array_alloc(&o->a.mem, bytes, &o->dev))) {
        free(o);
        return r;
    }
    o->a.magic = SIM_ARRAY;
    o->a.bytes = bytes;
    *pHandle = &o->a;
    return CUDA_SUCCESS;
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    SIM_CHECK_INIT();
    if (!pHandle || !d)
        return CUDA_ERROR_INVALID_VALUE;
    size_t bytes;
    CUresult r = array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, &bytes);
    if (r)
        return r;
    struct array_obj *o = calloc(1, sizeof *o);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if ((r = array_alloc(&o->a.mem, bytes, &o->dev))) {
        free(o);
        return r;
    }
    o->a.magic = SIM_ARRAY;
    o->a.bytes = bytes;
    *pHandle = &o->a;
    return CUDA_SUCCESS;
}

CUresult cuArrayDestroy(CUarray hArray) {
    SIM_CHECK_INIT();
    if (!hArray || hArray->magic != SIM_ARRAY)
        return CUDA_ERROR_INVALID_HANDLE;
    struct array_obj *o = (struct array_obj *)hArray;
    munmap(o->a.mem, o->a.bytes);
    account(o->dev, -(int64_t)o->a.bytes);
    o->a.magic = SIM_DEAD;
    return CUDA_SUCCESS;
}

struct mipmap_obj {
    struct CUmipmappedArray_st a;
    int dev;
};

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                unsigned int numMipmapLevels) {
    SIM_CHECK_INIT();
    if (!pHandle || !d || numMipmapLevels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t total = 0, w = d->Width, h = d->Height, dep = d->Depth;
    for (unsigned l = 0; l < numMipmapLevels; l++) {
        size_t b;
        CUresult r = array_bytes(w, h, dep, d->Format, d->NumChannels, &b);
        if (r)
            return r;
        total += b;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        dep = dep > 1 ? dep / 2 : dep;
    }
    struct mipmap_obj *o = calloc(1, sizeof *o);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = array_alloc(&o->a.mem, total, &o->dev);
    if (r) {
        free(o);
        return r;
    }
    o->a.magic = SIM_ARRAY;
    o->a.bytes = total;
    *pHandle = &o->a;
    return CUDA_SUCCESS;
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    SIM_CHECK_INIT();
    if (!hMipmappedArray || hMipmappedArray->magic != SIM_ARRAY)
        return CUDA_ERROR_INVALID_HANDLE;
    struct mipmap_obj *o = (struct mipmap_obj *)hMipmappedArray;
    munmap(o->a.mem, o->a.bytes);
    account(o->dev, -(int64_t)o->a.bytes);
    o->a.magic = SIM_DEAD;
    return CUDA_SUCCESS;
}

/* ---- pinned host memory (not device memory) ---- */

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
    SIM_CHECK_INIT();
    if (!pp || bytesize == 0 || (Flags & ~7u))
        return CUDA_ERROR_INVALID_VALUE;
    void *p = map_anon(bytesize);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = region_add((region){.base = (uintptr_t)p, .size = bytesize, .kind = K_HOST, .host_owned = true});
    if (r) {
        munmap(p, bytesize);
        return r;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { return cuMemHostAlloc(pp, bytesize, 0); }

CUresult cuMemFreeHost(void *p) {
    SIM_CHECK_INIT();
    region reg;
    if (!region_take((uintptr_t)p, K_HOST, &reg) || !reg.host_owned)
        return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)reg.base, reg.size);
    return CUDA_SUCCESS;
}

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags) {
    SIM_CHECK_INIT();
    if (!p || bytesize == 0 || (Flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_lock);
    long i = region_find((uintptr_t)p);
    pthread_mutex_unlock(&mem_lock);
    if (i >= 0)
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    return region_add((region){.base = (uintptr_t)p, .size = bytesize, .kind = K_HOST});
}

CUresult cuMemHostUnregister(void *p) {
    SIM_CHECK_INIT();
    region reg;
    if (!region_take((uintptr_t)p, K_HOST, &reg))
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    if (reg.host_owned) {
        region_add(reg);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    SIM_CHECK_INIT();
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_lock);
    long i = region_find((uintptr_t)ptr);
    region reg = {0};
    bool found = i >= 0 && regions[i].kind != K_RESERVE;
    if (found)
        reg = regions[i];
    for (size_t k = 0; !found && k < nmaps; k++) {
        if ((uintptr_t)ptr >= maps[k].base && (uintptr_t)ptr < maps[k].base + maps[k].size) {
            reg = (region){.base = maps[k].base, .size = maps[k].size, .kind = K_DEV, .dev = maps[k].h->dev};
            found = true;
        }
    }
    pthread_mutex_unlock(&mem_lock);
    if (!found)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = &g_sim.dev[reg.dev].primary; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = reg.kind == K_HOST ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: *(void **)data = (void *)(uintptr_t)ptr; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = reg.managed; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = reg.dev; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = reg.base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = reg.size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = 1; break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(CUmemoryPool *)data = reg.pool; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
