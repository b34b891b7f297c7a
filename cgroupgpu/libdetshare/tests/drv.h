/*
 * drv.h — how the libdetshare test programs reach the CUDA driver, in the two ways real programs do:
 *   DRV_LINKED:  direct calls to the exported names (code linked with -lcuda);
 *   otherwise:   runtime style, like cudart: dlopen("libcuda.so.1"), dlsym("cuGetProcAddress_v2"), then every
 *                entry point by base name + ABI version (+ the per-thread flag for the _ptsz variants).
 * Both fill the same table of function pointers, so one program tests both paths.
 */
#ifndef DS_TEST_DRV_H
#define DS_TEST_DRV_H

#ifdef DRV_LINKED
#define CUDA_ABI_PROTOTYPES
#endif
#include "cgroupgpu/cuda/cuda_abi.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* X(exported name, base name, version, per-thread) */
#define DRV_FUNCS(X)                                                                                                 \
    X(cuInit, cuInit, 2000, 0)                                                                                       \
    X(cuDriverGetVersion, cuDriverGetVersion, 2020, 0)                                                               \
    X(cuDeviceGet, cuDeviceGet, 2000, 0)                                                                             \
    X(cuDeviceGetAttribute, cuDeviceGetAttribute, 2000, 0)                                                           \
    X(cuDeviceTotalMem_v2, cuDeviceTotalMem, 3020, 0)                                                                \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, 0)                                                   \
    X(cuCtxSetCurrent, cuCtxSetCurrent, 4000, 0)                                                                     \
    X(cuCtxSynchronize, cuCtxSynchronize, 2000, 0)                                                                   \
    X(cuMemGetInfo_v2, cuMemGetInfo, 3020, 0)                                                                        \
    X(cuMemAlloc_v2, cuMemAlloc, 3020, 0)                                                                            \
    X(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0)                                                                  \
    X(cuMemAllocManaged, cuMemAllocManaged, 6000, 0)                                                                 \
    X(cuMemFree_v2, cuMemFree, 3020, 0)                                                                              \
    X(cuMemAllocAsync, cuMemAllocAsync, 11020, 0)                                                                    \
    X(cuMemFreeAsync, cuMemFreeAsync, 11020, 0)                                                                      \
    X(cuMemPoolCreate, cuMemPoolCreate, 11020, 0)                                                                    \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0)                                                    \
    X(cuMemPoolSetAttribute, cuMemPoolSetAttribute, 11020, 0)                                                        \
    X(cuMemPoolGetAttribute, cuMemPoolGetAttribute, 11020, 0)                                                        \
    X(cuMemPoolDestroy, cuMemPoolDestroy, 11020, 0)                                                                  \
    X(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 11040, 0)                                                      \
    X(cuGraphCreate, cuGraphCreate, 10000, 0)                                                                        \
    X(cuGraphAddNode, cuGraphAddNode, 12020, 0)                                                                      \
    X(cuMemCreate, cuMemCreate, 10020, 0)                                                                            \
    X(cuMemRelease, cuMemRelease, 10020, 0)                                                                          \
    X(cuArrayCreate_v2, cuArrayCreate, 3020, 0)                                                                      \
    X(cuArray3DCreate_v2, cuArray3DCreate, 3020, 0)                                                                  \
    X(cuArrayDestroy, cuArrayDestroy, 2000, 0)                                                                       \
    X(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0)                                                       \
    X(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0)                                                     \
    X(cuMemcpyHtoD_v2, cuMemcpyHtoD, 3020, 0)                                                                        \
    X(cuMemcpyDtoH_v2, cuMemcpyDtoH, 3020, 0)                                                                        \
    X(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync, 3020, 0)                                                              \
    X(cuMemsetD32_v2, cuMemsetD32, 3020, 0)                                                                          \
    X(cuMemsetD32Async, cuMemsetD32Async, 3020, 0)                                                                   \
    X(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync, 3020, 0)                                                              \
    X(cuModuleLoadData, cuModuleLoadData, 2000, 0)                                                                   \
    X(cuModuleGetFunction, cuModuleGetFunction, 2000, 0)                                                             \
    X(cuLibraryLoadData, cuLibraryLoadData, 12000, 0)                                                                \
    X(cuLibraryGetKernel, cuLibraryGetKernel, 12000, 0)                                                              \
    X(cuKernelGetFunction, cuKernelGetFunction, 12000, 0)                                                            \
    X(cuStreamCreate, cuStreamCreate, 2000, 0)                                                                       \
    X(cuStreamSynchronize, cuStreamSynchronize, 2000, 0)                                                             \
    X(cuStreamDestroy_v2, cuStreamDestroy, 4000, 0)                                                                  \
    X(cuLaunchKernel, cuLaunchKernel, 4000, 0)                                                                       \
    X(cuLaunchKernel_ptsz, cuLaunchKernel, 7000, 1)                                                                  \
    X(cuLaunchKernelEx, cuLaunchKernelEx, 11060, 0)                                                                  \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, 0)                                                 \
    X(cuStreamBeginCapture_v2, cuStreamBeginCapture, 10010, 0)                                                       \
    X(cuStreamEndCapture, cuStreamEndCapture, 10000, 0)                                                              \
    X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0)                                            \
    X(cuGraphLaunch, cuGraphLaunch, 10000, 0)                                                                        \
    X(cuGraphDestroy, cuGraphDestroy, 10000, 0)                                                                      \
    X(cuGraphGetNodes, cuGraphGetNodes, 10000, 0)                                                                    \
    X(cuGraphKernelNodeGetParams_v2, cuGraphKernelNodeGetParams, 12000, 0)                                           \
    X(cuGraphExecKernelNodeSetParams_v2, cuGraphExecKernelNodeSetParams, 12000, 0)                                   \
    X(cuStreamCreateWithPriority, cuStreamCreateWithPriority, 5050, 0)                                               \
    X(cuStreamQuery, cuStreamQuery, 2000, 0)                                                                         \
    X(cuStreamWaitEvent, cuStreamWaitEvent, 3020, 0)                                                                 \
    X(cuEventCreate, cuEventCreate, 2000, 0)                                                                         \
    X(cuEventRecord, cuEventRecord, 2000, 0)                                                                         \
    X(cuEventQuery, cuEventQuery, 2000, 0)                                                                           \
    X(cuEventSynchronize, cuEventSynchronize, 2000, 0)                                                               \
    X(cuDeviceGetDevResource, cuDeviceGetDevResource, 12040, 0)                                                      \
    X(cuDevSmResourceSplitByCount, cuDevSmResourceSplitByCount, 12040, 0)                                            \
    X(cuDevResourceGenerateDesc, cuDevResourceGenerateDesc, 12040, 0)                                                \
    X(cuGreenCtxCreate, cuGreenCtxCreate, 12040, 0)                                                                  \
    X(cuGreenCtxStreamCreate, cuGreenCtxStreamCreate, 12050, 0)

struct drv {
#define DRV_FIELD_(name, base, ver, pt) PFN_##name name;
    DRV_FUNCS(DRV_FIELD_)
#undef DRV_FIELD_
    PFN_cuGetProcAddress_v2 getproc; /* NULL on the linked path */
};

static inline int drv_load(struct drv *d) {
#ifdef DRV_LINKED
#define DRV_LINK_(name, base, ver, pt) d->name = name;
    DRV_FUNCS(DRV_LINK_)
#undef DRV_LINK_
    d->getproc = cuGetProcAddress_v2;
    return 0;
#else
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        return -1;
    }
    d->getproc = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    if (!d->getproc) {
        fprintf(stderr, "dlsym cuGetProcAddress_v2: %s\n", dlerror());
        return -1;
    }
    /* cudart first asks the driver for cuGetProcAddress itself and uses that from then on */
    void *self = NULL;
    if (d->getproc("cuGetProcAddress", &self, 12000, 0, NULL) == CUDA_SUCCESS && self)
        d->getproc = (PFN_cuGetProcAddress_v2)self;
#define DRV_LOOKUP_(name, base, ver, pt)                                                                             \
    {                                                                                                                \
        void *p = NULL;                                                                                              \
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;                                            \
        CUresult r = d->getproc(#base, &p, ver, pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st);       \
        d->name = r == CUDA_SUCCESS ? (PFN_##name)p : NULL;                                                          \
    }
    DRV_FUNCS(DRV_LOOKUP_)
#undef DRV_LOOKUP_
    return 0;
#endif
}

#endif
