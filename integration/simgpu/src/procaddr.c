/*
 * procaddr.c — cuGetProcAddress and cuGetProcAddress_v2 of the simulated GPU (test double).
 *
 * Lookups take a *base* name ("cuMemAlloc", "cuLaunchKernel") and an ABI version, as cudart does. A base name with
 * versioned variants resolves through the alias table to the newest variant whose version is <= the requested
 * one; below the oldest, the answer is VERSION_NOT_SUFFICIENT. Other names resolve to the exported function of
 * that name. CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM selects the _ptsz/_ptds twin where one exists
 * (CU_GET_PROC_ADDRESS_DEFAULT means the legacy stream here). Exported variant names ("cuMemAlloc_v2",
 * "cuLaunchKernel_ptsz") are not valid lookup names, as on the real driver.
 */
#include "simgpu.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    void *fn;
} export_ent;

#define SIM_EXPORT_ENT(name, params) {#name, (void *)name},
static const export_ent exports[] = {CUDA_ABI_FUNCTIONS(SIM_EXPORT_ENT)};
#undef SIM_EXPORT_ENT

/* Compile-time check that every exported definition matches its PFN_ typedef. */
#define SIM_CHECK_SIG(name, params) _Static_assert(__builtin_types_compatible_p(__typeof__(&name), PFN_##name), #name);
CUDA_ABI_FUNCTIONS(SIM_CHECK_SIG)
#undef SIM_CHECK_SIG

typedef struct {
    const char *base;
    int version;
    const char *exported; /* NULL: the variant exists on real drivers but is not provided by the test double */
} alias_ent;

/* Ordered by base, then ascending version. */
static const alias_ent aliases[] = {
    {"cuGetProcAddress", 11030, "cuGetProcAddress"},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2"},
    {"cuDeviceTotalMem", 2000, NULL},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"},
    {"cuDeviceGetUuid", 9020, "cuDeviceGetUuid"},
    {"cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2"},
    {"cuDevicePrimaryCtxRelease", 7000, NULL},
    {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2"},
    {"cuDevicePrimaryCtxSetFlags", 7000, NULL},
    {"cuDevicePrimaryCtxSetFlags", 11000, "cuDevicePrimaryCtxSetFlags_v2"},
    {"cuDevicePrimaryCtxReset", 7000, NULL},
    {"cuDevicePrimaryCtxReset", 11000, "cuDevicePrimaryCtxReset_v2"},
    {"cuCtxCreate", 2000, NULL},
    {"cuCtxCreate", 3020, "cuCtxCreate_v2"},
    {"cuCtxCreate", 11040, "cuCtxCreate_v3"},
    {"cuCtxCreate", 12050, "cuCtxCreate_v4"},
    {"cuCtxDestroy", 2000, NULL},
    {"cuCtxDestroy", 4000, "cuCtxDestroy_v2"},
    {"cuCtxPushCurrent", 2000, NULL},
    {"cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2"},
    {"cuCtxPopCurrent", 2000, NULL},
    {"cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2"},
    {"cuCtxGetDevice", 2000, "cuCtxGetDevice"},
    {"cuCtxGetDevice", 13000, "cuCtxGetDevice_v2"},
    {"cuCtxSynchronize", 2000, "cuCtxSynchronize"},
    {"cuCtxSynchronize", 13000, "cuCtxSynchronize_v2"},
    {"cuStreamDestroy", 2000, NULL},
    {"cuStreamDestroy", 4000, "cuStreamDestroy_v2"},
    {"cuStreamGetCtx", 9020, "cuStreamGetCtx"},
    {"cuStreamGetCtx", 12050, "cuStreamGetCtx_v2"},
    {"cuEventDestroy", 2000, NULL},
    {"cuEventDestroy", 4000, "cuEventDestroy_v2"},
    {"cuEventElapsedTime", 2000, "cuEventElapsedTime"},
    {"cuEventElapsedTime", 12080, "cuEventElapsedTime_v2"},
    {"cuStreamBeginCapture", 10000, NULL},
    {"cuStreamBeginCapture", 10010, "cuStreamBeginCapture_v2"},
    {"cuStreamGetCaptureInfo", 10010, NULL},
    {"cuStreamGetCaptureInfo", 11030, "cuStreamGetCaptureInfo_v2"},
    {"cuStreamGetCaptureInfo", 12030, "cuStreamGetCaptureInfo_v3"},
    {"cuGraphInstantiate", 10000, NULL},
    {"cuGraphInstantiate", 11000, NULL},
    {"cuGraphInstantiate", 12000, "cuGraphInstantiateWithFlags"},
    {"cuGraphAddKernelNode", 10000, NULL},
    {"cuGraphAddKernelNode", 12000, "cuGraphAddKernelNode_v2"},
    {"cuGraphKernelNodeGetParams", 10000, NULL},
    {"cuGraphKernelNodeGetParams", 12000, "cuGraphKernelNodeGetParams_v2"},
    {"cuGraphKernelNodeSetParams", 10000, NULL},
    {"cuGraphKernelNodeSetParams", 12000, "cuGraphKernelNodeSetParams_v2"},
    {"cuGraphExecKernelNodeSetParams", 10010, NULL},
    {"cuGraphExecKernelNodeSetParams", 12000, "cuGraphExecKernelNodeSetParams_v2"},
    {"cuGraphExecUpdate", 10020, NULL},
    {"cuGraphExecUpdate", 12000, "cuGraphExecUpdate_v2"},
    {"cuModuleGetGlobal", 2000, NULL},
    {"cuModuleGetGlobal", 3020, "cuModuleGetGlobal_v2"},
    {"cuMemGetInfo", 2000, NULL},
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2"},
    {"cuMemAlloc", 2000, NULL},
    {"cuMemAlloc", 3020, "cuMemAlloc_v2"},
    {"cuMemAllocPitch", 2000, NULL},
    {"cuMemAllocPitch", 3020, "cuMemAllocPitch_v2"},
    {"cuMemFree", 2000, NULL},
    {"cuMemFree", 3020, "cuMemFree_v2"},
    {"cuMemGetAddressRange", 2000, NULL},
    {"cuMemGetAddressRange", 3020, "cuMemGetAddressRange_v2"},
    {"cuMemAllocHost", 2000, NULL},
    {"cuMemAllocHost", 3020, "cuMemAllocHost_v2"},
    {"cuMemHostRegister", 4000, NULL},
    {"cuMemHostRegister", 6050, "cuMemHostRegister_v2"},
    {"cuArrayCreate", 2000, NULL},
    {"cuArrayCreate", 3020, "cuArrayCreate_v2"},
    {"cuArray3DCreate", 2000, NULL},
    {"cuArray3DCreate", 3020, "cuArray3DCreate_v2"},
    {"cuMemcpyHtoD", 2000, NULL},
    {"cuMemcpyHtoD", 3020, "cuMemcpyHtoD_v2"},
    {"cuMemcpyDtoH", 2000, NULL},
    {"cuMemcpyDtoH", 3020, "cuMemcpyDtoH_v2"},
    {"cuMemcpyDtoD", 2000, NULL},
    {"cuMemcpyDtoD", 3020, "cuMemcpyDtoD_v2"},
    {"cuMemcpyHtoDAsync", 2000, NULL},
    {"cuMemcpyHtoDAsync", 3020, "cuMemcpyHtoDAsync_v2"},
    {"cuMemcpyDtoHAsync", 2000, NULL},
    {"cuMemcpyDtoHAsync", 3020, "cuMemcpyDtoHAsync_v2"},
    {"cuMemcpyDtoDAsync", 3000, NULL},
    {"cuMemcpyDtoDAsync", 3020, "cuMemcpyDtoDAsync_v2"},
    {"cuMemcpy2D", 2000, NULL},
    {"cuMemcpy2D", 3020, "cuMemcpy2D_v2"},
    {"cuMemcpy2DUnaligned", 2000, NULL},
    {"cuMemcpy2DUnaligned", 3020, "cuMemcpy2DUnaligned_v2"},
    {"cuMemcpy2DAsync", 2000, NULL},
    {"cuMemcpy2DAsync", 3020, "cuMemcpy2DAsync_v2"},
    {"cuMemcpy3D", 2000, NULL},
    {"cuMemcpy3D", 3020, "cuMemcpy3D_v2"},
    {"cuMemcpy3DAsync", 2000, NULL},
    {"cuMemcpy3DAsync", 3020, "cuMemcpy3DAsync_v2"},
    {"cuMemsetD8", 2000, NULL},
    {"cuMemsetD8", 3020, "cuMemsetD8_v2"},
    {"cuMemsetD16", 2000, NULL},
    {"cuMemsetD16", 3020, "cuMemsetD16_v2"},
    {"cuMemsetD32", 2000, NULL},
    {"cuMemsetD32", 3020, "cuMemsetD32_v2"},
    {"cuMemsetD2D8", 2000, NULL},
    {"cuMemsetD2D8", 3020, "cuMemsetD2D8_v2"},
    {"cuMemsetD2D32", 2000, NULL},
    {"cuMemsetD2D32", 3020, "cuMemsetD2D32_v2"},
    /* Single-variant entry points whose minimum version matters to callers probing for features. */
    {"cuLaunchKernel", 4000, "cuLaunchKernel"},
    {"cuLaunchKernelEx", 11060, "cuLaunchKernelEx"},
    {"cuLaunchCooperativeKernel", 9000, "cuLaunchCooperativeKernel"},
    {"cuLaunchHostFunc", 10000, "cuLaunchHostFunc"},
    {"cuGraphLaunch", 10000, "cuGraphLaunch"},
    {"cuGraphUpload", 11010, "cuGraphUpload"},
    {"cuGraphInstantiateWithFlags", 11040, "cuGraphInstantiateWithFlags"},
    {"cuGraphInstantiateWithParams", 12000, "cuGraphInstantiateWithParams"},
    {"cuEventRecordWithFlags", 11010, "cuEventRecordWithFlags"},
    {"cuMemAllocAsync", 11020, "cuMemAllocAsync"},
    {"cuMemFreeAsync", 11020, "cuMemFreeAsync"},
    {"cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync"},
    {"cuMemPoolCreate", 11020, "cuMemPoolCreate"},
    {"cuGraphAddMemAllocNode", 11040, "cuGraphAddMemAllocNode"},
    {"cuMemCreate", 10020, "cuMemCreate"},
    {"cuMemMap", 10020, "cuMemMap"},
    {"cuLibraryLoadData", 12000, "cuLibraryLoadData"},
    {"cuLibraryGetKernel", 12000, "cuLibraryGetKernel"},
    {"cuKernelGetFunction", 12000, "cuKernelGetFunction"},
    {"cuDeviceGetDevResource", 12040, "cuDeviceGetDevResource"},
    {"cuCtxGetDevResource", 12040, "cuCtxGetDevResource"},
    {"cuGreenCtxGetDevResource", 12040, "cuGreenCtxGetDevResource"},
    {"cuDevSmResourceSplitByCount", 12040, "cuDevSmResourceSplitByCount"},
    {"cuDevResourceGenerateDesc", 12040, "cuDevResourceGenerateDesc"},
    {"cuGreenCtxCreate", 12040, "cuGreenCtxCreate"},
    {"cuGreenCtxDestroy", 12040, "cuGreenCtxDestroy"},
    {"cuCtxFromGreenCtx", 12040, "cuCtxFromGreenCtx"},
    {"cuGreenCtxRecordEvent", 12040, "cuGreenCtxRecordEvent"},
    {"cuGreenCtxWaitEvent", 12040, "cuGreenCtxWaitEvent"},
    {"cuStreamGetGreenCtx", 12040, "cuStreamGetGreenCtx"},
    {"cuGreenCtxStreamCreate", 12050, "cuGreenCtxStreamCreate"},
    {"cuCtxRecordEvent", 12050, "cuCtxRecordEvent"},
    {"cuCtxWaitEvent", 12050, "cuCtxWaitEvent"},
    {"cuGreenCtxGetId", 13000, "cuGreenCtxGetId"},
    /* CUDA 13.1 additions: absent from a 13.0 driver. */
    {"cuDevSmResourceSplit", 13010, NULL},
    {"cuStreamGetDevResource", 13010, NULL},
};

static void *export_find(const char *name) {
    for (size_t i = 0; i < sizeof exports / sizeof exports[0]; i++)
        if (!strcmp(exports[i].name, name))
            return exports[i].fn;
    return NULL;
}

/* A name is a base name unless it carries a variant suffix (_vN, _ptsz, _ptds). */
static bool has_variant_suffix(const char *s) {
    size_t n = strlen(s);
    if (n > 5 && (!strcmp(s + n - 5, "_ptsz") || !strcmp(s + n - 5, "_ptds")))
        return true;
    const char *u = strrchr(s, '_');
    if (u && u[1] == 'v' && u[2] >= '0' && u[2] <= '9')
        return true;
    return false;
}

static CUresult lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status) {
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = CUDA_ERROR_NOT_FOUND;
    if (!symbol || !pfn || (flags & ~(cuuint64_t)3) || cudaVersion <= 0) {
        if (pfn)
            *pfn = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pfn = NULL;
    const char *exported = NULL;
    bool has_alias = false;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        if (strcmp(aliases[i].base, symbol))
            continue;
        has_alias = true;
        if (aliases[i].version <= cudaVersion)
            exported = aliases[i].exported; /* table is in ascending version order */
    }
    if (has_alias) {
        if (!exported) {
            /* Older than every variant, or a variant this test double does not provide. */
            bool any_newer = false;
            for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
                if (!strcmp(aliases[i].base, symbol) && aliases[i].version > cudaVersion && aliases[i].exported)
                    any_newer = true;
            st = any_newer ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
            goto out;
        }
    } else if (!has_variant_suffix(symbol)) {
        exported = symbol;
    }
    void *fn = exported ? export_find(exported) : NULL;
    if (!fn)
        goto out;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        char buf[128];
        void *pt;
        snprintf(buf, sizeof buf, "%s_ptsz", exported);
        if ((pt = export_find(buf)))
            fn = pt;
        else {
            snprintf(buf, sizeof buf, "%s_ptds", exported);
            if ((pt = export_find(buf)))
                fn = pt;
        }
    }
    *pfn = fn;
    st = CU_GET_PROC_ADDRESS_SUCCESS;
    r = CUDA_SUCCESS;
out:
    if (status)
        *status = st;
    if (r == CUDA_ERROR_NOT_FOUND)
        sim_log("cuGetProcAddress(%s, %d, %llu): not found (status %d)", symbol, cudaVersion,
                (unsigned long long)flags, (int)st);
    return r;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return lookup(symbol, pfn, cudaVersion, flags, NULL);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}
