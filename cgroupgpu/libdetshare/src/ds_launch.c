/*
 * ds_launch.c — the kernel-launch, graph-launch, capture and graph-instantiation hooks. Each launch is counted
 * (relaxed atomics in the process's own entry) and sent to the stream ds_launch_bind chooses (the GPU-coroutine
 * binding, ds_streams.c); a graph is launched as the copy made for the current grant (ds_graph.c). Kernels, their
 * launch configurations and arguments are never changed. No lock, no syscall on this path.
 */
#include "ds_demand.h"
#include "ds_driver.h"
#include "ds_graph.h"
#include "ds_mem.h"
#include "ds_process.h"
#include "ds_streams.h"

#include <string.h>

#define REAL_OR_FAIL(name) DS_REAL_OR_FAIL(name)
#define PASS_THROUGH() (!ds_process.tenant || ds_depth)

/* Every launch hook: count the launch (ds_demand_work), pick its stream (ds_launch_bind: the launch l_, its stream
 * s_), launch there; if the physical stream refuses the kernel, launch it where the application asked (after what
 * the physical stream holds) and leave that stream unconfined. params: the hook's parameter list; app_stream: the
 * application's stream; key: what is launched (CUfunction, CUgraphExec: the dispatch gate learns its duration,
 * ds_gate.c); usable: false passes
 * the call through (an argument the driver must reject itself); prepare: statements run after the stream is chosen
 * (s_ holds it); on_phys / on_app: the driver call on the chosen stream / as the application made it. */
#define LAUNCH(name, pt, params, app_stream, key, smem, usable, prepare, on_phys, on_app)                            \
    DS_EXPORT CUresult name params {                                                                                 \
        REAL_OR_FAIL(name);                                                                                          \
        if (PASS_THROUGH() || !(usable))                                                                             \
            return on_app;                                                                                           \
        ds_depth++;                                                                                                  \
        ds_demand_work(true);                                                                                        \
        struct ds_launch l_ = ds_launch_bind(app_stream, pt, (const void *)(key), (smem));                           \
        CUstream s_ = l_.stream;                                                                                     \
        prepare;                                                                                                     \
        CUresult r = on_phys;                                                                                        \
        if (DS_UNLIKELY(r != CUDA_SUCCESS) && ds_launch_retry(&l_, r)) {                                             \
            r = on_app;                                                                                              \
            if (r == CUDA_SUCCESS)                                                                                   \
                ds_launch_unconfinable(&l_);                                                                         \
        }                                                                                                            \
        ds_launch_done(&l_, r);                                                                                      \
        ds_depth--;                                                                                                  \
        return r;                                                                                                    \
    }

#define KERNEL_PARAMS                                                                                                \
    (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX,      \
     unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,                  \
     void **kernelParams, void **extra)
#define KERNEL_ARGS(s) f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, s, kernelParams
#define LAUNCH_KERNEL(name, pt)                                                                                      \
    LAUNCH(name, pt, KERNEL_PARAMS, hStream, f, (long)sharedMemBytes, true, (void)0, real(KERNEL_ARGS(s_), extra),   \
           real(KERNEL_ARGS(hStream), extra))
LAUNCH_KERNEL(cuLaunchKernel, 0)
LAUNCH_KERNEL(cuLaunchKernel_ptsz, 1)

#define COOP_PARAMS                                                                                                  \
    (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX,      \
     unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,                  \
     void **kernelParams)
#define LAUNCH_COOP(name, pt)                                                                                        \
    LAUNCH(name, pt, COOP_PARAMS, hStream, f, -1L, true, (void)0, real(KERNEL_ARGS(s_)),                             \
           real(KERNEL_ARGS(hStream)))
LAUNCH_COOP(cuLaunchCooperativeKernel, 0)
LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz, 1)

/* a copy of the configuration with the stream replaced; attrs (clusters, priority, ...) are kept as they are */
#define LAUNCH_KERNEL_EX(name, pt)                                                                                   \
    LAUNCH(name, pt, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra),                \
           config->hStream, f, config && !config->numAttrs ? (long)config->sharedMemBytes : -1L, config != NULL,      \
           CUlaunchConfig c_ = *config; c_.hStream = s_,                                                             \
           real(&c_, f, kernelParams, extra), real(config, f, kernelParams, extra))
LAUNCH_KERNEL_EX(cuLaunchKernelEx, 0)
LAUNCH_KERNEL_EX(cuLaunchKernelEx_ptsz, 1)

/* a graph is launched as the copy made for the grant the launch is bound to (ds_graph.c) */
#define GRAPH_LAUNCH(name, pt)                                                                                       \
    LAUNCH(name, pt, (CUgraphExec hGraphExec, CUstream hStream), hStream, hGraphExec, -1L, true,                    \
           CUcontext target_ = NULL; unsigned tidx_ = 0;                                                             \
           CUgraphExec e_ = ds_launch_graph_target(&l_, &target_, &tidx_) ? ds_graph_for(hGraphExec, target_, tidx_)  \
                                                                        : hGraphExec,                                \
           real(e_, s_), real(hGraphExec, hStream))
GRAPH_LAUNCH(cuGraphLaunch, 0)
GRAPH_LAUNCH(cuGraphLaunch_ptsz, 1)

/* Stream capture: the application stream's physical stream joins the capture through the first edge in (so its
 * kernels are captured in the green context of the grant, and the graph stays confined) and is joined back before
 * the capture ends. Captures in progress are counted: the demand monitor must not query a capturing stream. */
#define BEGIN_CAPTURE(name, pt, in_place, params, args)                                                              \
    DS_EXPORT CUresult name params {                                                                                 \
        REAL_OR_FAIL(name);                                                                                          \
        if (PASS_THROUGH())                                                                                          \
            return real args;                                                                                        \
        ds_depth++;                                                                                                  \
        ds_streams_before_capture(hStream, pt);                                                                      \
        struct ds_sop op_;                                                                                           \
        ds_stream_before(&op_, DS_OP_OP, hStream, pt);                                                               \
        CUresult r = real args;                                                                                      \
        ds_stream_after(&op_, DS_OP_OP, r);                                                                          \
        ds_depth--;                                                                                                  \
        if (r == CUDA_SUCCESS)                                                                                       \
            atomic_fetch_add(&ds_process.capturing, 1);                                                              \
        if (r == CUDA_SUCCESS && (in_place)) {                                                                       \
            ds_depth++;                                                                                              \
            ds_streams_capture_in_place(hStream, pt, true);                                                          \
            ds_depth--;                                                                                              \
        }                                                                                                            \
        return r;                                                                                                    \
    }
BEGIN_CAPTURE(cuStreamBeginCapture_v2, 0, 0, (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode))
BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, 1, 0, (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode))
/* into a graph the application made (a conditional node's body, for one): captured in place, see
 * ds_streams_capture_in_place */
BEGIN_CAPTURE(cuStreamBeginCaptureToGraph, 0, 1,
              (CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies, const CUgraphEdgeData *edgeData,
               size_t numDependencies, CUstreamCaptureMode mode),
              (hStream, hGraph, dependencies, edgeData, numDependencies, mode))
BEGIN_CAPTURE(cuStreamBeginCaptureToGraph_ptsz, 1, 1,
              (CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies, const CUgraphEdgeData *edgeData,
               size_t numDependencies, CUstreamCaptureMode mode),
              (hStream, hGraph, dependencies, edgeData, numDependencies, mode))

#define END_CAPTURE(name, pt)                                                                                        \
    DS_EXPORT CUresult name(CUstream hStream, CUgraph *phGraph) {                                                    \
        REAL_OR_FAIL(name);                                                                                          \
        if (PASS_THROUGH())                                                                                          \
            return real(hStream, phGraph);                                                                           \
        ds_depth++;                                                                                                  \
        struct ds_sop op_;                                                                                           \
        ds_stream_before(&op_, DS_OP_SYNC, hStream, pt);                                                             \
        CUresult r = real(hStream, phGraph);                                                                         \
        ds_stream_after(&op_, DS_OP_SYNC, r);                                                                        \
        ds_depth--;                                                                                                  \
        if (r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||                                       \
            r == CUDA_ERROR_STREAM_CAPTURE_UNJOINED) {                                                               \
            int n = atomic_load(&ds_process.capturing);                                                              \
            while (n > 0 && !atomic_compare_exchange_weak(&ds_process.capturing, &n, n - 1)) {                       \
            }                                                                                                        \
            ds_streams_capture_ended();                                                                              \
            ds_depth++;                                                                                              \
            ds_streams_capture_in_place(hStream, pt, false);                                                         \
            ds_depth--;                                                                                              \
        }                                                                                                            \
        return r;                                                                                                    \
    }
END_CAPTURE(cuStreamEndCapture, 0)
END_CAPTURE(cuStreamEndCapture_ptsz, 1)

/* Graph executables: tracked so that a graph can be moved to another grant's SMs (ds_graph.c). */
DS_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    REAL_OR_FAIL(cuGraphInstantiateWithFlags);
    uint64_t gmem = 0;
    if (PASS_THROUGH())
        return real(phGraphExec, hGraph, flags);
    if (!ds_graph_mem_instantiate(hGraph, &gmem))
        return CUDA_ERROR_OUT_OF_MEMORY;
    ds_depth++;
    CUresult r = real(phGraphExec, hGraph, flags);
    if (r == CUDA_SUCCESS && phGraphExec)
        ds_graph_instantiated(*phGraphExec, hGraph, flags);
    ds_depth--;
    if (r != CUDA_SUCCESS)
        ds_uncharge(gmem);
    return r;
}

#define INSTANTIATE_PARAMS(name)                                                                                     \
    DS_EXPORT CUresult name(CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {            \
        REAL_OR_FAIL(name);                                                                                          \
        uint64_t gmem = 0;                                                                                           \
        if (PASS_THROUGH())                                                                                          \
            return real(phGraphExec, hGraph, p);                                                                     \
        if (!ds_graph_mem_instantiate(hGraph, &gmem))                                                                \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                                         \
        ds_depth++;                                                                                                  \
        CUresult r = real(phGraphExec, hGraph, p);                                                                   \
        if (r == CUDA_SUCCESS && phGraphExec)                                                                        \
            ds_graph_instantiated(*phGraphExec, hGraph, p ? p->flags : 0);                                           \
        ds_depth--;                                                                                                  \
        if (r != CUDA_SUCCESS)                                                                                       \
            ds_uncharge(gmem);                                                                                       \
        return r;                                                                                                    \
    }
INSTANTIATE_PARAMS(cuGraphInstantiateWithParams)
INSTANTIATE_PARAMS(cuGraphInstantiateWithParams_ptsz)

DS_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    REAL_OR_FAIL(cuGraphExecDestroy);
    if (PASS_THROUGH() || !hGraphExec)
        return real(hGraphExec);
    ds_depth++;
    CUresult r = real(hGraphExec);
    if (r == CUDA_SUCCESS)
        ds_graph_exec_destroyed(hGraphExec);
    ds_depth--;
    return r;
}
