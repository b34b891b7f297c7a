/*
 * ds_driver.h — the real driver: which entry points the library hooks (DS_HOOKS, DS_STREAM_HOOKS) and which it
 * only calls (DS_NEEDED), the table of real functions resolved once at first use (ds_driver.c), and the way a hook
 * finds its real function. The library exports the hooked entry points (for code linked with -lcuda), interposes
 * dlsym and cuGetProcAddress{,_v2} (ds_dlsym.c), and finds the real driver with dlopen at first use.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_DRIVER_H
#define DETSHARE_LIBDETSHARE_DS_DRIVER_H

#define CUDA_ABI_PROTOTYPES
#include "cgroupgpu/cuda/cuda_abi.h"

#include "ds_process.h"

#include <stdatomic.h>
#include <stdbool.h>

/* ---- hooked entry points ----
 * HOOK(exported name, base name for cuGetProcAddress, first ABI version of that variant, per-thread variant)
 * The base/version/per-thread columns are only used when the driver's cuGetProcAddress answers with a pointer that
 * is not one of its exported functions (then the variant is chosen by name, as the driver would). */
#define DS_HOOKS(HOOK)                                                                                               \
    HOOK(cuInit, cuInit, 2000, 0)                                                                                    \
    HOOK(cuGetProcAddress, cuGetProcAddress, 11030, 0)                                                               \
    HOOK(cuGetProcAddress_v2, cuGetProcAddress, 12000, 0)                                                            \
    HOOK(cuMemGetInfo_v2, cuMemGetInfo, 3020, 0)                                                                     \
    HOOK(cuDeviceTotalMem_v2, cuDeviceTotalMem, 3020, 0)                                                             \
    HOOK(cuMemAlloc_v2, cuMemAlloc, 3020, 0)                                                                         \
    HOOK(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0)                                                               \
    HOOK(cuMemAllocManaged, cuMemAllocManaged, 6000, 0)                                                              \
    HOOK(cuMemFree_v2, cuMemFree, 3020, 0)                                                                           \
    HOOK(cuMemAllocAsync, cuMemAllocAsync, 11020, 0)                                                                 \
    HOOK(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, 1)                                                            \
    HOOK(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0)                                                 \
    HOOK(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, 1)                                            \
    HOOK(cuMemFreeAsync, cuMemFreeAsync, 11020, 0)                                                                   \
    HOOK(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, 1)                                                              \
    HOOK(cuMemCreate, cuMemCreate, 10020, 0)                                                                         \
    HOOK(cuMemPoolSetAttribute, cuMemPoolSetAttribute, 11020, 0)                                                     \
    HOOK(cuMemPoolDestroy, cuMemPoolDestroy, 11020, 0)                                                               \
    HOOK(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 11040, 0)                                                   \
    HOOK(cuGraphAddNode, cuGraphAddNode, 12020, 0)                                                                   \
    HOOK(cuGraphAddNode_v2, cuGraphAddNode, 12030, 0)                                                                \
    HOOK(cuMemRelease, cuMemRelease, 10020, 0)                                                                       \
    HOOK(cuArrayCreate_v2, cuArrayCreate, 3020, 0)                                                                   \
    HOOK(cuArray3DCreate_v2, cuArray3DCreate, 3020, 0)                                                               \
    HOOK(cuArrayDestroy, cuArrayDestroy, 2000, 0)                                                                    \
    HOOK(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0)                                                    \
    HOOK(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0)                                                  \
    HOOK(cuLaunchKernel, cuLaunchKernel, 4000, 0)                                                                    \
    HOOK(cuLaunchKernel_ptsz, cuLaunchKernel, 7000, 1)                                                               \
    HOOK(cuLaunchKernelEx, cuLaunchKernelEx, 11060, 0)                                                               \
    HOOK(cuLaunchKernelEx_ptsz, cuLaunchKernelEx, 11060, 1)                                                          \
    HOOK(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, 0)                                              \
    HOOK(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel, 9000, 1)                                         \
    HOOK(cuGraphLaunch, cuGraphLaunch, 10000, 0)                                                                     \
    HOOK(cuGraphLaunch_ptsz, cuGraphLaunch, 10000, 1)                                                                \
    HOOK(cuStreamBeginCapture_v2, cuStreamBeginCapture, 10010, 0)                                                    \
    HOOK(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture, 10010, 1)                                               \
    HOOK(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph, 12030, 0)                                         \
    HOOK(cuStreamBeginCaptureToGraph_ptsz, cuStreamBeginCaptureToGraph, 12030, 1)                                    \
    HOOK(cuStreamEndCapture, cuStreamEndCapture, 10000, 0)                                                           \
    HOOK(cuStreamEndCapture_ptsz, cuStreamEndCapture, 10000, 1)                                                      \
    HOOK(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0)                                         \
    HOOK(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, 0)                                       \
    HOOK(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams, 12000, 1)                                  \
    HOOK(cuGraphExecDestroy, cuGraphExecDestroy, 10000, 0)

/* ---- stream operations ----
 * Every other driver entry point that takes a stream, or orders work on the legacy stream implicitly, is hooked by
 * one generic wrapper each (ds_stream_ops.c). The wrapper passes the caller's arguments to the driver unchanged (as
 * twelve integer registers/stack slots: every one of these takes only integers, pointers and small structs), so it
 * needs no prototype; what it does around the call depends on the operation's kind (ds_streams.c, "Lazy edges"):
 *   OP      an operation on the stream: joins its physical stream before, marks it for an edge in after
 *   SMOP    a copy or memset, which the GPU may run on SMs: sent to the bound physical stream as a kernel is (its
 *           stream argument replaced, nothing else), because on the application's stream a device-to-device copy
 *           runs on every SM, outside the grant (measured on the H100: integration/gpu/probes/copyescape.cu)
 *   RECORD  an event record: joins before
 *   WAIT    a wait on an event: marks for an edge in after
 *   SYNC    synchronize / query / capture info: joins before
 *   DESTROY the application destroys the stream: joins before, forgets what was learnt of the handle after
 *   ALL     context-wide synchronisation and frees: joins every stream before
 *   ORDER   synchronous copies and memsets (legacy or per-thread stream) and calls whose stream argument this
 *           library does not model: joins every stream before, marks every stream for an edge in after
 *   EXEC    the application changes a graph executable: the library's per-grant copies of it are dropped
 *   UPDATE  cuGraphExecUpdate: the executable now comes from another graph; copies are re-made from that one
 * SOP(exported name, base name, first ABI version, per-thread variant, kind, index of the stream argument or -1) */
#define DS_STREAM_HOOKS(SOP)                                                                                         \
    DS_SOP_PAIR(SOP, cuMemcpyAsync, cuMemcpyAsync, 4000, SMOP, 3)                                                      \
    DS_SOP_PAIR(SOP, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync, 3020, SMOP, 3)                                           \
    DS_SOP_PAIR(SOP, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync, 3020, SMOP, 3)                                           \
    DS_SOP_PAIR(SOP, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync, 3020, SMOP, 3)                                           \
    DS_SOP_PAIR(SOP, cuMemcpy2DAsync_v2, cuMemcpy2DAsync, 3020, SMOP, 1)                                               \
    DS_SOP_PAIR(SOP, cuMemcpy3DAsync_v2, cuMemcpy3DAsync, 3020, SMOP, 1)                                               \
    DS_SOP_PAIR(SOP, cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync, 4000, OP, 1)                                          \
    DS_SOP_PAIR(SOP, cuMemcpyPeerAsync, cuMemcpyPeerAsync, 4000, OP, 5)                                              \
    DS_SOP_PAIR(SOP, cuMemcpyHtoAAsync_v2, cuMemcpyHtoAAsync, 3020, OP, 4)                                           \
    DS_SOP_PAIR(SOP, cuMemcpyAtoHAsync_v2, cuMemcpyAtoHAsync, 3020, OP, 4)                                           \
    DS_SOP_PAIR(SOP, cuMemsetD8Async, cuMemsetD8Async, 3020, SMOP, 3)                                                  \
    DS_SOP_PAIR(SOP, cuMemsetD16Async, cuMemsetD16Async, 3020, SMOP, 3)                                                \
    DS_SOP_PAIR(SOP, cuMemsetD32Async, cuMemsetD32Async, 3020, SMOP, 3)                                                \
    DS_SOP_PAIR(SOP, cuMemsetD2D8Async, cuMemsetD2D8Async, 3020, SMOP, 5)                                              \
    DS_SOP_PAIR(SOP, cuMemsetD2D16Async, cuMemsetD2D16Async, 3020, SMOP, 5)                                            \
    DS_SOP_PAIR(SOP, cuMemsetD2D32Async, cuMemsetD2D32Async, 3020, SMOP, 5)                                            \
    DS_SOP_PAIR(SOP, cuLaunchHostFunc, cuLaunchHostFunc, 10000, OP, 0)                                               \
    DS_SOP_PAIR(SOP, cuStreamAddCallback, cuStreamAddCallback, 5000, OP, 0)                                          \
    DS_SOP_PAIR(SOP, cuStreamWaitValue32, cuStreamWaitValue32, 8000, OP, 0)                                          \
    DS_SOP_PAIR(SOP, cuStreamWaitValue32_v2, cuStreamWaitValue32, 11070, OP, 0)                                      \
    DS_SOP_PAIR(SOP, cuStreamWaitValue64, cuStreamWaitValue64, 9000, OP, 0)                                          \
    DS_SOP_PAIR(SOP, cuStreamWaitValue64_v2, cuStreamWaitValue64, 11070, OP, 0)                                      \
    DS_SOP_PAIR(SOP, cuStreamWriteValue32, cuStreamWriteValue32, 8000, OP, 0)                                        \
    DS_SOP_PAIR(SOP, cuStreamWriteValue32_v2, cuStreamWriteValue32, 11070, OP, 0)                                    \
    DS_SOP_PAIR(SOP, cuStreamWriteValue64, cuStreamWriteValue64, 9000, OP, 0)                                        \
    DS_SOP_PAIR(SOP, cuStreamWriteValue64_v2, cuStreamWriteValue64, 11070, OP, 0)                                    \
    DS_SOP_PAIR(SOP, cuStreamBatchMemOp, cuStreamBatchMemOp, 8000, OP, 0)                                            \
    DS_SOP_PAIR(SOP, cuStreamBatchMemOp_v2, cuStreamBatchMemOp, 11070, OP, 0)                                        \
    DS_SOP_PAIR(SOP, cuMemPrefetchAsync, cuMemPrefetchAsync, 8000, OP, 3)                                            \
    DS_SOP_PAIR(SOP, cuMemPrefetchAsync_v2, cuMemPrefetchAsync, 12020, OP, 4)                                        \
    DS_SOP_PAIR(SOP, cuStreamAttachMemAsync, cuStreamAttachMemAsync, 6000, OP, 0)                                    \
    DS_SOP_PAIR(SOP, cuSignalExternalSemaphoresAsync, cuSignalExternalSemaphoresAsync, 10000, OP, 3)                 \
    DS_SOP_PAIR(SOP, cuWaitExternalSemaphoresAsync, cuWaitExternalSemaphoresAsync, 10000, OP, 3)                     \
    DS_SOP_PAIR(SOP, cuGraphicsMapResources, cuGraphicsMapResources, 3000, OP, 2)                                    \
    DS_SOP_PAIR(SOP, cuGraphicsUnmapResources, cuGraphicsUnmapResources, 3000, OP, 2)                                \
    DS_SOP_PAIR(SOP, cuMemMapArrayAsync, cuMemMapArrayAsync, 11010, OP, 2)                                           \
    DS_SOP_PAIR(SOP, cuStreamUpdateCaptureDependencies, cuStreamUpdateCaptureDependencies, 11030, OP, 0)             \
    DS_SOP_PAIR(SOP, cuStreamUpdateCaptureDependencies_v2, cuStreamUpdateCaptureDependencies, 12030, OP, 0)          \
    DS_SOP_PAIR(SOP, cuGraphUpload, cuGraphUpload, 11010, OP, 1)                                                     \
    DS_SOP_PAIR(SOP, cuEventRecord, cuEventRecord, 2000, RECORD, 1)                                                  \
    DS_SOP_PAIR(SOP, cuEventRecordWithFlags, cuEventRecordWithFlags, 11010, RECORD, 1)                               \
    DS_SOP_PAIR(SOP, cuStreamWaitEvent, cuStreamWaitEvent, 3020, WAIT, 0)                                            \
    DS_SOP_PAIR(SOP, cuStreamSynchronize, cuStreamSynchronize, 2000, SYNC, 0)                                        \
    DS_SOP_PAIR(SOP, cuStreamQuery, cuStreamQuery, 2000, SYNC, 0)                                                    \
    DS_SOP_PAIR(SOP, cuStreamGetCaptureInfo, cuStreamGetCaptureInfo, 10010, SYNC, 0)                                 \
    DS_SOP_PAIR(SOP, cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo, 11030, SYNC, 0)                              \
    DS_SOP_PAIR(SOP, cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo, 12030, SYNC, 0)                              \
    SOP(cuStreamDestroy, cuStreamDestroy, 2000, 0, DESTROY, 0)                                                      \
    SOP(cuStreamDestroy_v2, cuStreamDestroy, 4000, 0, DESTROY, 0)                                                   \
    SOP(cuCtxSynchronize, cuCtxSynchronize, 2000, 0, ALL, -1)                                                       \
    SOP(cuCtxSynchronize_v2, cuCtxSynchronize, 13000, 0, ALL, -1)                                                   \
    SOP(cuMemFreeHost, cuMemFreeHost, 2000, 0, ALL, -1)                                                             \
    SOP(cuMemHostUnregister, cuMemHostUnregister, 4000, 0, ALL, -1)                                                 \
    SOP(cuMemUnmap, cuMemUnmap, 10020, 0, ALL, -1)                                                                  \
    SOP(cuModuleUnload, cuModuleUnload, 2000, 0, ALL, -1)                                                           \
    SOP(cuLibraryUnload, cuLibraryUnload, 12000, 0, ALL, -1)                                                        \
    SOP(cuCtxDestroy_v2, cuCtxDestroy, 4000, 0, ALL, -1)                                                            \
    SOP(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease, 11000, 0, ALL, -1)                                 \
    SOP(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset, 11000, 0, ALL, -1)                                     \
    SOP(cuCtxRecordEvent, cuCtxRecordEvent, 12050, 0, ALL, -1)                                                      \
    SOP(cuGreenCtxRecordEvent, cuGreenCtxRecordEvent, 12040, 0, ALL, -1)                                            \
    DS_SOP_PTDS(SOP, cuMemcpy, cuMemcpy, 4000)                                                                      \
    DS_SOP_PTDS(SOP, cuMemcpyHtoD_v2, cuMemcpyHtoD, 3020)                                                           \
    DS_SOP_PTDS(SOP, cuMemcpyDtoH_v2, cuMemcpyDtoH, 3020)                                                           \
    DS_SOP_PTDS(SOP, cuMemcpyDtoD_v2, cuMemcpyDtoD, 3020)                                                           \
    DS_SOP_PTDS(SOP, cuMemcpyDtoA_v2, cuMemcpyDtoA, 3020)                                                           \
    DS_SOP_PTDS(SOP, cuMemcpyAtoD_v2, cuMemcpyAtoD, 3020)                                                           \
    DS_SOP_PTDS(SOP, cuMemcpyHtoA_v2, cuMemcpyHtoA, 3020)                                                           \
    DS_SOP_PTDS(SOP, cuMemcpyAtoH_v2, cuMemcpyAtoH, 3020)                                                           \
    DS_SOP_PTDS(SOP, cuMemcpyAtoA_v2, cuMemcpyAtoA, 3020)                                                           \
    DS_SOP_PTDS(SOP, cuMemcpy2D_v2, cuMemcpy2D, 3020)                                                               \
    DS_SOP_PTDS(SOP, cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned, 3020)                                             \
    DS_SOP_PTDS(SOP, cuMemcpy3D_v2, cuMemcpy3D, 3020)                                                               \
    DS_SOP_PTDS(SOP, cuMemcpy3DPeer, cuMemcpy3DPeer, 4000)                                                          \
    DS_SOP_PTDS(SOP, cuMemcpyPeer, cuMemcpyPeer, 4000)                                                              \
    DS_SOP_PTDS(SOP, cuMemsetD8_v2, cuMemsetD8, 3020)                                                               \
    DS_SOP_PTDS(SOP, cuMemsetD16_v2, cuMemsetD16, 3020)                                                             \
    DS_SOP_PTDS(SOP, cuMemsetD32_v2, cuMemsetD32, 3020)                                                             \
    DS_SOP_PTDS(SOP, cuMemsetD2D8_v2, cuMemsetD2D8, 3020)                                                           \
    DS_SOP_PTDS(SOP, cuMemsetD2D16_v2, cuMemsetD2D16, 3020)                                                         \
    DS_SOP_PTDS(SOP, cuMemsetD2D32_v2, cuMemsetD2D32, 3020)                                                         \
    SOP(cuCtxWaitEvent, cuCtxWaitEvent, 12050, 0, ORDER, -1)                                                        \
    SOP(cuGreenCtxWaitEvent, cuGreenCtxWaitEvent, 12040, 0, ORDER, -1)                                              \
    DS_SOP_PAIR(SOP, cuMemcpyBatchAsync, cuMemcpyBatchAsync, 12080, ORDER, -1)                                       \
    DS_SOP_PAIR(SOP, cuMemcpyBatchAsync_v2, cuMemcpyBatchAsync, 13000, ORDER, -1)                                    \
    DS_SOP_PAIR(SOP, cuMemcpy3DBatchAsync, cuMemcpy3DBatchAsync, 12080, ORDER, -1)                                   \
    DS_SOP_PAIR(SOP, cuMemcpy3DBatchAsync_v2, cuMemcpy3DBatchAsync, 13000, ORDER, -1)                                \
    DS_SOP_PAIR(SOP, cuMemPrefetchBatchAsync, cuMemPrefetchBatchAsync, 13000, ORDER, -1)                             \
    DS_SOP_PAIR(SOP, cuMemDiscardBatchAsync, cuMemDiscardBatchAsync, 13000, ORDER, -1)                               \
    DS_SOP_PAIR(SOP, cuMemDiscardAndPrefetchBatchAsync, cuMemDiscardAndPrefetchBatchAsync, 13000, ORDER, -1)         \
    SOP(cuLaunch, cuLaunch, 2000, 0, ORDER, -1)                                                                     \
    SOP(cuLaunchGrid, cuLaunchGrid, 2000, 0, ORDER, -1)                                                             \
    SOP(cuLaunchGridAsync, cuLaunchGridAsync, 2000, 0, ORDER, -1)                                                   \
    SOP(cuLaunchCooperativeKernelMultiDevice, cuLaunchCooperativeKernelMultiDevice, 9000, 0, ORDER, -1)             \
    SOP(cuGraphExecKernelNodeSetParams, cuGraphExecKernelNodeSetParams, 10010, 0, EXEC, 0)                          \
    SOP(cuGraphExecKernelNodeSetParams_v2, cuGraphExecKernelNodeSetParams, 12000, 0, EXEC, 0)                       \
    SOP(cuGraphExecMemcpyNodeSetParams, cuGraphExecMemcpyNodeSetParams, 10020, 0, EXEC, 0)                          \
    SOP(cuGraphExecMemsetNodeSetParams, cuGraphExecMemsetNodeSetParams, 10020, 0, EXEC, 0)                          \
    SOP(cuGraphExecHostNodeSetParams, cuGraphExecHostNodeSetParams, 10020, 0, EXEC, 0)                              \
    SOP(cuGraphExecChildGraphNodeSetParams, cuGraphExecChildGraphNodeSetParams, 11010, 0, EXEC, 0)                  \
    SOP(cuGraphExecEventRecordNodeSetEvent, cuGraphExecEventRecordNodeSetEvent, 11010, 0, EXEC, 0)                  \
    SOP(cuGraphExecEventWaitNodeSetEvent, cuGraphExecEventWaitNodeSetEvent, 11010, 0, EXEC, 0)                      \
    SOP(cuGraphExecExternalSemaphoresSignalNodeSetParams, cuGraphExecExternalSemaphoresSignalNodeSetParams, 11020, \
        0, EXEC, 0)                                                                                                  \
    SOP(cuGraphExecExternalSemaphoresWaitNodeSetParams, cuGraphExecExternalSemaphoresWaitNodeSetParams, 11020, 0,   \
        EXEC, 0)                                                                                                     \
    SOP(cuGraphExecBatchMemOpNodeSetParams, cuGraphExecBatchMemOpNodeSetParams, 11070, 0, EXEC, 0)                  \
    SOP(cuGraphExecNodeSetParams, cuGraphExecNodeSetParams, 12020, 0, EXEC, 0)                                      \
    SOP(cuGraphNodeSetEnabled, cuGraphNodeSetEnabled, 11060, 0, EXEC, 0)                                            \
    SOP(cuGraphExecUpdate, cuGraphExecUpdate, 10020, 0, UPDATE, 0)                                                  \
    SOP(cuGraphExecUpdate_v2, cuGraphExecUpdate, 12000, 0, UPDATE, 0)

/* A stream entry point and its per-thread-default-stream twin (_ptsz), or a synchronous one and its _ptds twin. */
#define DS_SOP_PAIR(SOP, name, base, ver, kind, idx)                                                                 \
    SOP(name, base, ver, 0, kind, idx) SOP(name##_ptsz, base, 7000, 1, kind, idx)
#define DS_SOP_PTDS(SOP, name, base, ver) SOP(name, base, ver, 0, ORDER, -1) SOP(name##_ptds, base, 7000, 1, ORDER, -1)

/* The generic wrappers' parameter list (ds_stream_ops.c) and their declarations, for the hook table. */
#define DS_GENERIC_ARGS                                                                                              \
    uintptr_t a0, uintptr_t a1, uintptr_t a2, uintptr_t a3, uintptr_t a4, uintptr_t a5, uintptr_t a6, uintptr_t a7, \
        uintptr_t a8, uintptr_t a9, uintptr_t a10, uintptr_t a11
#define DS_DECLARE_SOP_WRAPPER_(name, base, ver, pt, kind, idx) CUresult ds_w_##name(DS_GENERIC_ARGS);
DS_STREAM_HOOKS(DS_DECLARE_SOP_WRAPPER_)
#undef DS_DECLARE_SOP_WRAPPER_

enum ds_op_kind { DS_OP_OP, DS_OP_SMOP, DS_OP_RECORD, DS_OP_WAIT, DS_OP_SYNC, DS_OP_DESTROY, DS_OP_ALL, DS_OP_ORDER,
                  DS_OP_EXEC, DS_OP_UPDATE };

/* Driver functions the library calls itself without hooking them. */
#define DS_NEEDED(X)                                                                                                 \
    X(cuDriverGetVersion)                                                                                            \
    X(cuCtxGetDevice)                                                                                                \
    X(cuFuncGetAttribute)                                                                                            \
    X(cuKernelGetAttribute)                                                                                          \
    X(cuMemGetAddressRange_v2)                                                                                       \
    X(cuDeviceGetDevResource)                                                                                        \
    X(cuDevSmResourceSplitByCount)                                                                                   \
    X(cuDevResourceGenerateDesc)                                                                                     \
    X(cuGreenCtxCreate)                                                                                              \
    X(cuGreenCtxStreamCreate)                                                                                        \
    X(cuCtxFromGreenCtx)                                                                                             \
    X(cuCtxGetCurrent)                                                                                               \
    X(cuCtxSetCurrent)                                                                                               \
    X(cuGreenCtxDestroy)                                                                                             \
    X(cuStreamGetGreenCtx)                                                                                           \
    X(cuStreamGetFlags)                                                                                              \
    X(cuStreamGetPriority)                                                                                           \
    X(cuThreadExchangeStreamCaptureMode)                                                                             \
    X(cuStreamIsCapturing)                                                                                           \
    X(cuGraphMemAllocNodeGetParams)                                                                                  \
    X(cuStreamIsCapturing_ptsz)                                                                                      \
    X(cuEventCreate)                                                                                                 \
    X(cuEventQuery)                                                                                                  \
    X(cuGraphClone)                                                                                                  \
    X(cuGraphGetNodes)                                                                                               \
    X(cuGraphNodeGetType)                                                                                            \
    X(cuGraphChildGraphNodeGetGraph)                                                                                 \
    X(cuGraphKernelNodeGetParams_v2)                                                                                 \
    X(cuGraphKernelNodeSetParams_v2)                                                                                 \
    X(cuGraphMemsetNodeGetParams)                                                                                    \
    X(cuGraphMemcpyNodeGetParams)                                                                                    \
    X(cuGraphNodeSetParams)                                                                                          \
    X(cuGraphDestroy)

struct ds_real {
#define DS_REAL_FIELD_(name, base, ver, pt) PFN_##name name;
    DS_HOOKS(DS_REAL_FIELD_)
#undef DS_REAL_FIELD_
/* generic wrappers call these through ds_generic_fn; the library's own calls cast to the PFN type */
#define DS_REAL_SOP_FIELD_(name, base, ver, pt, kind, idx) void *name;
    DS_STREAM_HOOKS(DS_REAL_SOP_FIELD_)
#undef DS_REAL_SOP_FIELD_
#define DS_NEEDED_FIELD_(name) PFN_##name name;
    DS_NEEDED(DS_NEEDED_FIELD_)
#undef DS_NEEDED_FIELD_
};

/* The real function of a stream hook, typed for the library's own calls. */
#define DS_SOP_REAL(name) ((PFN_##name)ds_real.name)

/* glibc's own dlsym (ds_dlsym_init finds it once; NULL if it cannot be found): how real functions are looked up. */
typedef void *(*ds_dlsym_fn)(void *, const char *);
extern ds_dlsym_fn ds_real_dlsym;
void ds_dlsym_init(void);

/* Real driver: resolved once (pthread_once) at the first hook call. ds_drv_ready is the published flag. */
extern struct ds_real ds_real;
extern atomic_int ds_drv_ready;
void ds_driver_init(void);
static inline void ds_driver(void) {
    if (DS_UNLIKELY(!atomic_load_explicit(&ds_drv_ready, memory_order_acquire)))
        ds_driver_init();
}

/* The real function for a hook. Normally the resolved table; while the driver itself is being loaded (re-entrant
 * call from its constructor on this thread) a direct lookup of the next definition, so that loading never
 * deadlocks on the once-guard. */
void *ds_early_sym(const char *name);
static inline bool ds_driver_ready_or_init(void) {
    if (DS_LIKELY(atomic_load_explicit(&ds_drv_ready, memory_order_acquire)))
        return true;
    if (ds_depth)
        return false;
    ds_driver_init();
    return true;
}
#define DS_REAL_OR_FAIL(name)                                                                                        \
    PFN_##name real = ds_driver_ready_or_init() ? ds_real.name : (PFN_##name)ds_early_sym(#name);                   \
    if (DS_UNLIKELY(!real))                                                                                          \
        return CUDA_ERROR_NOT_INITIALIZED;

/* Calls the library makes on its own slow paths (green contexts, streams, events) must not count as "unsafe" calls
 * in a global-mode capture the application runs on another thread. */
static inline CUstreamCaptureMode ds_relaxed_begin(void) {
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (!ds_real.cuThreadExchangeStreamCaptureMode || ds_real.cuThreadExchangeStreamCaptureMode(&m) != CUDA_SUCCESS)
        m = (CUstreamCaptureMode)-1;
    return m;
}
static inline void ds_relaxed_end(CUstreamCaptureMode m) {
    if ((int)m >= 0)
        ds_real.cuThreadExchangeStreamCaptureMode(&m);
}

#endif /* DETSHARE_LIBDETSHARE_DS_DRIVER_H */
