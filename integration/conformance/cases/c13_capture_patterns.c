/* Case 13: every stream-capture pattern frameworks use (issue 28; README.md). Each capture must end with a graph,
 * hold the nodes CUDA documents, run nothing while captured, and replay with the right data. PyTorch's CUDA graphs
 * and torch.compile's cudagraph trees capture memsets, copies, host functions, event edges across streams,
 * stream-ordered allocations and (torch.cond) into graphs they made; under the library an operation that synchronises, queries, or ties a capturing
 * stream to work outside its capture invalidates the capture. */
#include "conf.h"

#include <stdatomic.h>

#define N 4096
#define ROUNDS 3

/* Ends the capture on s and reports it as <tag>.end_rc, <tag>.status_after and <tag>.nodes; exits when there is no
 * graph (the facts so far name the failure). */
static CUgraphExec end_capture(const char *tag, CUstream s, CUgraph *gout) {
    char k[64];
    CUgraph g = NULL;
    CUresult r = D.cuStreamEndCapture(s, &g);
    snprintf(k, sizeof k, "%s.end_rc", tag);
    fact(k, "%s", st(r));
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    CK(D.cuStreamIsCapturing(s, &cs));
    snprintf(k, sizeof k, "%s.status_after", tag);
    fact(k, "%d", (int)cs);
    if (r != CUDA_SUCCESS || !g) {
        printf("fatal: %s: no graph (%s)\n", tag, st(r));
        exit(2);
    }
    size_t nn = 0;
    CK(D.cuGraphGetNodes(g, NULL, &nn));
    snprintf(k, sizeof k, "%s.nodes", tag);
    fact(k, "%zu", nn);
    CUgraphExec ge;
    CK(D.cuGraphInstantiateWithFlags(&ge, g, 0));
    *gout = g;
    return ge;
}

static void status_during(const char *tag, CUstream s) {
    char k[64];
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    CK(D.cuStreamIsCapturing(s, &cs));
    snprintf(k, sizeof k, "%s.status_during", tag);
    fact(k, "%d", (int)cs);
}

static void release(CUgraphExec ge, CUgraph g) {
    CK(D.cuGraphExecDestroy(ge));
    CK(D.cuGraphDestroy(g));
}

static atomic_int g_host_runs;
static void host_fn(void *arg) {
    (void)arg;
    atomic_fetch_add(&g_host_runs, 1);
}

int main(void) {
    conf_init("capture_patterns");
    /* B: a blocking stream (cudaStreamCreate's default), the kind that is ordered with the legacy stream; S2: a
     * non-blocking side stream (PyTorch's pool streams) */
    CUstream B = mkstream(CU_STREAM_DEFAULT), S2 = mkstream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr x = dalloc(N * 4), y = dalloc(N * 4), z = dalloc(N * 4), w = dalloc(N * 4), v = dalloc(N * 4);
    CUgraph g;
    CUgraphExec ge;

    /* 1. Memsets as the first operations of a capture on a blocking stream, while the legacy stream still has a
     * kernel queued: D8, D32, D2D32, then a kernel (x = y + z = 3). The capture must not be tied to the legacy
     * stream's work (CUDA forbids a capturing stream to wait on work outside its capture). */
    k_spin(NULL, conf_spin_us / 10);
    k_fill(NULL, w, 7, N);
    CK(D.cuStreamBeginCapture_v2(B, CU_STREAM_CAPTURE_MODE_GLOBAL));
    status_during("memset", B);
    fact("memset.d8_rc", "%s", st(D.cuMemsetD8Async(x, 0xff, N * 4, B)));
    fact("memset.d32_rc", "%s", st(D.cuMemsetD32Async(y, bits(2.0f), N, B)));
    fact("memset.d2d32_rc", "%s", st(D.cuMemsetD2D32Async(z, 256 * 4, bits(1.0f), 256, N / 256, B)));
    k_add(B, x, y, z, N);
    ge = end_capture("memset", B, &g);
    fact("memset.no_work_ran", "%s", yn(all_f32(y, N, 0.0f) && all_f32(z, N, 0.0f)));
    CK(D.cuGraphLaunch(ge, B));
    CK(D.cuStreamSynchronize(B));
    fact("memset.replay_ok", "%s", yn(all_f32(x, N, 3.0f) && all_f32(y, N, 2.0f) && all_f32(z, N, 1.0f)));
    CK(D.cuStreamSynchronize(NULL));
    fact("memset.legacy_work_ok", "%s", yn(sum_u32(w, N) == 7ull * N));
    release(ge, g);

    /* 2. Copies: device to device, host to device and device to host (page-locked host memory), thread-local mode */
    uint32_t *hin, *hout;
    CK(D.cuMemAllocHost_v2((void **)&hin, N * 4));
    CK(D.cuMemAllocHost_v2((void **)&hout, N * 4));
    for (unsigned i = 0; i < N; i++)
        hin[i] = i;
    memset(hout, 0, N * 4);
    CK(D.cuMemsetD32_v2(v, 0, N));
    CK(D.cuStreamBeginCapture_v2(B, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    status_during("memcpy", B);
    fact("memcpy.htod_rc", "%s", st(D.cuMemcpyHtoDAsync_v2(v, hin, N * 4, B)));
    fact("memcpy.dtod_rc", "%s", st(D.cuMemcpyDtoDAsync_v2(w, v, N * 4, B)));
    fact("memcpy.dtoh_rc", "%s", st(D.cuMemcpyDtoHAsync_v2(hout, w, N * 4, B)));
    ge = end_capture("memcpy", B, &g);
    bool none = true;
    for (unsigned i = 0; i < N; i++)
        none = none && hout[i] == 0;
    fact("memcpy.no_work_ran", "%s", yn(none && sum_u32(v, N) == 0));
    CK(D.cuGraphLaunch(ge, B));
    CK(D.cuStreamSynchronize(B));
    bool same = true;
    for (unsigned i = 0; i < N; i++)
        same = same && hout[i] == i;
    fact("memcpy.replay_ok", "%s", yn(same));
    release(ge, g);

    /* 3. A host function between two kernels: it runs once per replay, after the first kernel */
    CK(D.cuMemsetD32_v2(v, 0, N));
    CK(D.cuStreamBeginCapture_v2(B, CU_STREAM_CAPTURE_MODE_GLOBAL));
    status_during("host_func", B);
    k_fill(B, v, 1, N);
    fact("host_func.rc", "%s", st(D.cuLaunchHostFunc(B, host_fn, NULL)));
    k_add(B, x, x, x, N);
    ge = end_capture("host_func", B, &g);
    fact("host_func.no_run_at_capture", "%s", yn(atomic_load(&g_host_runs) == 0));
    for (int r = 0; r < ROUNDS; r++)
        CK(D.cuGraphLaunch(ge, B));
    CK(D.cuStreamSynchronize(B));
    fact("host_func.runs", "%d", atomic_load(&g_host_runs));
    fact("host_func.replay_ok", "%s", yn(sum_u32(v, N) == N && all_f32(x, N, 3.0f * (1 << ROUNDS))));
    release(ge, g);

    /* 4. Events inside a capture: a record and a wait on the same stream, and a fork to S2 and a join back
     * (PyTorch's side-stream pattern) with a memset and a copy on S2 and a kernel after the join */
    CUevent e1 = mkevent(CU_EVENT_DISABLE_TIMING), fork = mkevent(CU_EVENT_DISABLE_TIMING),
            join = mkevent(CU_EVENT_DISABLE_TIMING);
    CK(D.cuMemsetD32_v2(y, 0, N));
    CK(D.cuMemsetD32_v2(z, 0, N));
    CK(D.cuStreamBeginCapture_v2(B, CU_STREAM_CAPTURE_MODE_GLOBAL));
    status_during("events", B);
    CK(D.cuMemsetD32Async(y, bits(4.0f), N, B));
    fact("events.record_rc", "%s", st(D.cuEventRecord(e1, B)));
    fact("events.wait_same_stream_rc", "%s", st(D.cuStreamWaitEvent(B, e1, 0)));
    CK(D.cuEventRecord(fork, B));
    fact("events.fork_rc", "%s", st(D.cuStreamWaitEvent(S2, fork, 0)));
    status_during("events.side", S2);
    fact("events.side_memset_rc", "%s", st(D.cuMemsetD32Async(z, bits(0.5f), N, S2)));
    fact("events.side_copy_rc", "%s", st(D.cuMemcpyDtoDAsync_v2(v, y, N * 4, S2)));
    CK(D.cuEventRecord(join, S2));
    fact("events.join_rc", "%s", st(D.cuStreamWaitEvent(B, join, 0)));
    k_add(B, x, v, z, N);
    ge = end_capture("events", B, &g);
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    CK(D.cuStreamIsCapturing(S2, &cs));
    fact("events.side_status_after", "%d", (int)cs);
    fact("events.no_work_ran", "%s", yn(all_f32(y, N, 0.0f) && all_f32(z, N, 0.0f)));
    CK(D.cuGraphLaunch(ge, B));
    CK(D.cuStreamSynchronize(B));
    fact("events.replay_ok", "%s", yn(all_f32(x, N, 4.5f) && all_f32(v, N, 4.0f)));
    release(ge, g);

    /* 5. Memory nodes: a stream-ordered allocation and free inside the capture (cudaMallocAsync / cudaFreeAsync),
     * the memory used in between */
    CK(D.cuMemsetD32_v2(v, 0, N));
    CK(D.cuStreamBeginCapture_v2(B, CU_STREAM_CAPTURE_MODE_GLOBAL));
    status_during("mem_nodes", B);
    CUdeviceptr t = 0;
    fact("mem_nodes.alloc_rc", "%s", st(D.cuMemAllocAsync(&t, N * 4, B)));
    CK(D.cuMemsetD32Async(t, bits(5.0f), N, B));
    k_add(B, v, t, t, N);
    fact("mem_nodes.free_rc", "%s", st(D.cuMemFreeAsync(t, B)));
    ge = end_capture("mem_nodes", B, &g);
    fact("mem_nodes.no_work_ran", "%s", yn(all_f32(v, N, 0.0f)));
    for (int r = 0; r < ROUNDS; r++)
        CK(D.cuGraphLaunch(ge, B));
    CK(D.cuStreamSynchronize(B));
    fact("mem_nodes.replay_ok", "%s", yn(all_f32(v, N, 10.0f)));
    release(ge, g);

    /* 6. A capture into a graph the application made (cuStreamBeginCaptureToGraph, how conditional bodies are
     * filled): the capture ends with that same graph, holding what was captured */
    CUgraph mine;
    CK(D.cuGraphCreate(&mine, 0));
    CK(D.cuMemsetD32_v2(v, 0, N));
    fact("to_graph.begin_rc", "%s",
         st(D.cuStreamBeginCaptureToGraph(B, mine, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL)));
    status_during("to_graph", B);
    CK(D.cuMemsetD32Async(v, bits(6.0f), N, B));
    k_add(B, x, v, v, N);
    ge = end_capture("to_graph", B, &g);
    fact("to_graph.same_graph", "%s", yn(g == mine));
    fact("to_graph.no_work_ran", "%s", yn(all_f32(v, N, 0.0f)));
    CK(D.cuGraphLaunch(ge, B));
    CK(D.cuStreamSynchronize(B));
    fact("to_graph.replay_ok", "%s", yn(all_f32(x, N, 12.0f) && all_f32(v, N, 6.0f)));
    release(ge, g);

    /* 7. A capture on this thread's per-thread default stream (a blocking stream) through the _ptsz entry points,
     * while the legacy stream still has a kernel queued: a memset and a kernel */
    k_spin(NULL, conf_spin_us / 10);
    k_fill(NULL, w, 9, N);
    CK(D.cuMemsetD32_v2(v, 0, N));
    fact("per_thread.begin_rc", "%s", st(D.cuStreamBeginCapture_v2_ptsz(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL)));
    cs = CU_STREAM_CAPTURE_STATUS_NONE;
    CK(D.cuStreamIsCapturing_ptsz(NULL, &cs));
    fact("per_thread.status_during", "%d", (int)cs);
    fact("per_thread.memset_rc", "%s", st(D.cuMemsetD32Async_ptsz(v, bits(8.0f), N, NULL)));
    k_fill_on(true, NULL, y, bits(0.25f), N);
    g = NULL;
    fact("per_thread.end_rc", "%s", st(D.cuStreamEndCapture_ptsz(NULL, &g)));
    if (!g) {
        printf("fatal: per_thread: no graph\n");
        return 2;
    }
    size_t nn = 0;
    CK(D.cuGraphGetNodes(g, NULL, &nn));
    fact("per_thread.nodes", "%zu", nn);
    CK(D.cuGraphInstantiateWithFlags(&ge, g, 0));
    CK(D.cuGraphLaunch_ptsz(ge, NULL));
    CK(D.cuStreamSynchronize_ptsz(NULL));
    /* each node's result read once after the per-thread synchronisation, then again after a context-wide one (a
     * replay not yet finished when the per-thread stream said it was shows there only), then the same graph replayed
     * on another stream (a wrong graph fails there too, a wrong per-thread launch or synchronisation does not) */
    bool v_ok = all_f32(v, N, 8.0f), y_ok = all_f32(y, N, 0.25f);
    fact("per_thread.replay_ok", "%s", yn(v_ok && y_ok));
    fact("per_thread.replay_memset_ok", "%s", yn(v_ok));
    fact("per_thread.replay_kernel_ok", "%s", yn(y_ok));
    CK(D.cuCtxSynchronize());
    fact("per_thread.replay_ok_after_ctx_sync", "%s", yn(all_f32(v, N, 8.0f) && all_f32(y, N, 0.25f)));
    CK(D.cuMemsetD32_v2(v, 0, N));
    CK(D.cuMemsetD32_v2(y, 0, N));
    CK(D.cuGraphLaunch(ge, B));
    CK(D.cuStreamSynchronize(B));
    fact("per_thread.replay_on_other_stream_ok", "%s", yn(all_f32(v, N, 8.0f) && all_f32(y, N, 0.25f)));
    CK(D.cuStreamSynchronize(NULL));
    fact("per_thread.legacy_work_ok", "%s", yn(sum_u32(w, N) == 9ull * N));
    release(ge, g);

    CK(D.cuMemFreeHost(hin));
    CK(D.cuMemFreeHost(hout));
    conf_done();
    return 0;
}
