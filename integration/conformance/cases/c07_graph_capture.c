/* Case 7: stream capture -> graph -> launch gives the results of direct launches, and a graph replays (README.md). */
#include "conf.h"

#define N 4096
#define ROUNDS 5

/* One round: x = 1, y += 2x, z = y + x (a memset node and two kernel nodes). */
static void round_ops(CUstream s, CUdeviceptr x, CUdeviceptr y, CUdeviceptr z) {
    CK(D.cuMemsetD32Async(x, bits(1.0f), N, s));
    k_axpy(s, y, x, 2.0f, N);
    k_add(s, z, y, x, N);
}

int main(void) {
    conf_init("graph_capture");
    const unsigned T = conf_spin_us;
    CUstream S = mkstream(CU_STREAM_NON_BLOCKING), A = mkstream(CU_STREAM_DEFAULT);
    CUdeviceptr x = dalloc(N * 4), y = dalloc(N * 4), z = dalloc(N * 4);

    /* direct launches */
    for (int r = 0; r < ROUNDS; r++)
        round_ops(S, x, y, z);
    CK(D.cuStreamSynchronize(S));
    uint64_t hd = hash_dev(z, N * 4, hash_dev(y, N * 4, FNV_INIT));
    fact("direct.y_ok", "%s", yn(all_f32(y, N, 2.0f * ROUNDS)));
    fact("direct.z_ok", "%s", yn(all_f32(z, N, 2.0f * ROUNDS + 1.0f)));

    /* capture the same round (plus a short spin first, to observe the replay's ordering) */
    CK(D.cuMemsetD32_v2(y, 0, N));
    CK(D.cuMemsetD32_v2(z, 0, N));
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    CK(D.cuStreamBeginCapture_v2(S, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(D.cuStreamIsCapturing(S, &cs));
    fact("capture.status_during", "%d", (int)cs);
    k_spin(S, T / 10);
    round_ops(S, x, y, z);
    CUgraph g = NULL;
    CK(D.cuStreamEndCapture(S, &g));
    CK(D.cuStreamIsCapturing(S, &cs));
    fact("capture.status_after", "%d", (int)cs);
    size_t nn = 0;
    CK(D.cuGraphGetNodes(g, NULL, &nn));
    fact("capture.nodes", "%zu", nn);
    fact("capture.no_work_ran", "%s", yn(all_f32(y, N, 0.0f)));

    CUgraphExec ge;
    CK(D.cuGraphInstantiateWithFlags(&ge, g, 0));
    fact("upload.rc", "%s", st(D.cuGraphUpload(ge, S)));
    for (int r = 0; r < ROUNDS; r++)
        CK(D.cuGraphLaunch(ge, S));
    fact("replay.stream_before_sync", "%s", st(D.cuStreamQuery(S)));
    CK(D.cuStreamSynchronize(S));
    uint64_t hg = hash_dev(z, N * 4, hash_dev(y, N * 4, FNV_INIT));
    fact("replay.y_ok", "%s", yn(all_f32(y, N, 2.0f * ROUNDS)));
    fact("replay.same_bits_as_direct", "%s", yn(hg == hd));
    info("hash=%016" PRIx64, hg);

    /* a graph launched on a blocking stream waits for the legacy stream */
    k_spin(NULL, T);
    CK(D.cuGraphLaunch(ge, A));
    CK(D.cuStreamSynchronize(A));
    fact("graph_on_blocking.legacy_stream", "%s", st(D.cuStreamQuery(NULL)));
    fact("graph_on_blocking.y_ok", "%s", yn(all_f32(y, N, 2.0f * (ROUNDS + 1))));

    /* a graph launched on the legacy stream waits for a blocking stream */
    k_spin(A, T);
    CK(D.cuGraphLaunch(ge, NULL));
    CK(D.cuStreamSynchronize(NULL));
    fact("graph_on_legacy.blocking_stream", "%s", st(D.cuStreamQuery(A)));

    /* fork/join capture across two streams (PyTorch's and vLLM's pattern): S forks to S2 through an event,
     * S2 joins back; the graph holds both branches */
    CUstream S2 = mkstream(CU_STREAM_NON_BLOCKING);
    CUevent fork = mkevent(CU_EVENT_DISABLE_TIMING), join = mkevent(CU_EVENT_DISABLE_TIMING);
    CUgraph g3;
    CUgraphExec ge3;
    CK(D.cuMemsetD32_v2(y, 0, N));
    CK(D.cuStreamBeginCapture_v2(S, CU_STREAM_CAPTURE_MODE_GLOBAL));
    k_fill(S, x, bits(1.0f), N);
    CK(D.cuEventRecord(fork, S));
    CK(D.cuStreamWaitEvent(S2, fork, 0));
    CK(D.cuStreamIsCapturing(S2, &cs));
    fact("fork_join.forked_stream_status", "%d", (int)cs);
    k_axpy(S2, y, x, 3.0f, N);
    CK(D.cuEventRecord(join, S2));
    CK(D.cuStreamWaitEvent(S, join, 0));
    k_add(S, z, y, x, N);
    CK(D.cuStreamEndCapture(S, &g3));
    CK(D.cuStreamIsCapturing(S2, &cs));
    fact("fork_join.forked_stream_status_after", "%d", (int)cs);
    CK(D.cuGraphGetNodes(g3, NULL, &nn));
    fact("fork_join.nodes", "%zu", nn);
    CK(D.cuGraphInstantiateWithFlags(&ge3, g3, 0));
    for (int r = 0; r < ROUNDS; r++)
        CK(D.cuGraphLaunch(ge3, S));
    CK(D.cuStreamSynchronize(S));
    fact("fork_join.y_ok", "%s", yn(all_f32(y, N, 3.0f * ROUNDS)));
    fact("fork_join.z_ok", "%s", yn(all_f32(z, N, 3.0f * ROUNDS + 1.0f)));
    CK(D.cuGraphExecDestroy(ge3));
    CK(D.cuGraphDestroy(g3));

    /* a captured grid of one block per SM: where its replay ran (info; the Go test checks that graphs captured
     * under a grant stay confined wherever they are launched) */
    CUstream G = mkstream(CU_STREAM_NON_BLOCKING);
    unsigned grid = (unsigned)conf_sms, us = 1000;
    CUdeviceptr ids = dalloc((size_t)grid * 4);
    void *a[] = {&ids, &us};
    CUgraph g2;
    CUgraphExec ge2;
    CK(D.cuStreamBeginCapture_v2(G, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CK(launch(false, K_smid, grid, 32, G, a));
    CK(D.cuStreamEndCapture(G, &g2));
    CK(D.cuGraphInstantiateWithFlags(&ge2, g2, 0));
    CK(D.cuGraphLaunch(ge2, NULL));
    CK(D.cuStreamSynchronize(NULL));
    uint32_t *h = malloc((size_t)grid * 4);
    if (!h)
        return 3;
    CK(D.cuMemcpyDtoH_v2(h, ids, (size_t)grid * 4));
    static unsigned char seen[4096];
    unsigned distinct = 0, hi = 0;
    bool in_range = true;
    for (unsigned i = 0; i < grid; i++) {
        if (h[i] >= (unsigned)conf_sms || h[i] >= sizeof seen) {
            in_range = false;
            continue;
        }
        if (!seen[h[i]]++)
            distinct++;
        if (h[i] > hi)
            hi = h[i];
    }
    free(h);
    fact("captured_smid.smids_in_range", "%s", yn(in_range));
    info("graph_distinct_sms=%u graph_max_sm=%u", distinct, hi);

    CK(D.cuGraphExecDestroy(ge2));
    CK(D.cuGraphDestroy(g2));
    CK(D.cuGraphExecDestroy(ge));
    CK(D.cuGraphDestroy(g));
    conf_done();
    return 0;
}
