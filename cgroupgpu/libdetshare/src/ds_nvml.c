/*
 * ds_nvml.c — NVML inside a tenant shows the tenant's memory view: nvmlDeviceGetMemoryInfo{,_v2} answer with the
 * quota as total and what is left of it as free, like cuMemGetInfo, so nvidia-smi and frameworks that size caches
 * from NVML (vLLM) agree with CUDA. Everything else in NVML is untouched. libnvidia-ml is found lazily with dlopen.
 */
#include "ds_nvml.h"

#include "ds_driver.h"
#include "ds_mem.h"
#include "ds_process.h"

#include <dlfcn.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
enum { NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
       NVML_ERROR_LIBRARY_NOT_FOUND = 12, NVML_ERROR_FUNCTION_NOT_FOUND = 13 };

typedef nvmlReturn_t (*PFN_nvmlDeviceGetMemoryInfo)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*PFN_nvmlDeviceGetMemoryInfo_v2)(nvmlDevice_t, nvmlMemory_v2_t *);

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static PFN_nvmlDeviceGetMemoryInfo g_mem;
static PFN_nvmlDeviceGetMemoryInfo_v2 g_mem2;
static void *g_lib;

static void nvml_once(void) {
    ds_dlsym_init();
    ds_depth++;
    g_lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    ds_depth--;
    if (g_lib && ds_real_dlsym) {
        g_mem = (PFN_nvmlDeviceGetMemoryInfo)ds_real_dlsym(g_lib, "nvmlDeviceGetMemoryInfo");
        g_mem2 = (PFN_nvmlDeviceGetMemoryInfo_v2)ds_real_dlsym(g_lib, "nvmlDeviceGetMemoryInfo_v2");
    }
}

/* total/free/used seen by the tenant given the device's real numbers. */
static void tenant_view(unsigned long long *total, unsigned long long *free_b, unsigned long long *used) {
    uint64_t limit = ds_mem_limit();
    if (!limit)
        return;
    uint64_t t = limit < *total ? limit : *total;
    uint64_t u = atomic_load((_Atomic uint64_t *)&ds_process.tenant->page->mem_used);
    uint64_t left = u >= t ? 0 : t - u;
    *total = t;
    *free_b = left < *free_b ? left : *free_b;
    *used = t - *free_b;
}

DS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m) {
    pthread_once(&g_once, nvml_once);
    if (!g_mem)
        return g_lib ? NVML_ERROR_FUNCTION_NOT_FOUND : NVML_ERROR_LIBRARY_NOT_FOUND;
    nvmlReturn_t r = g_mem(dev, m);
    if (r == NVML_SUCCESS && m && ds_process.tenant)
        tenant_view(&m->total, &m->free, &m->used);
    return r;
}

DS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m) {
    pthread_once(&g_once, nvml_once);
    if (!g_mem2)
        return g_lib ? NVML_ERROR_FUNCTION_NOT_FOUND : NVML_ERROR_LIBRARY_NOT_FOUND;
    nvmlReturn_t r = g_mem2(dev, m);
    if (r == NVML_SUCCESS && m && ds_process.tenant) {
        tenant_view(&m->total, &m->free, &m->used);
        if (m->used >= m->reserved)
            m->used -= m->reserved;
    }
    return r;
}

void *ds_nvml_wrapper_for(const char *name) {
    if (!strcmp(name, "nvmlDeviceGetMemoryInfo"))
        return (void *)nvmlDeviceGetMemoryInfo;
    if (!strcmp(name, "nvmlDeviceGetMemoryInfo_v2"))
        return (void *)nvmlDeviceGetMemoryInfo_v2;
    return NULL;
}
