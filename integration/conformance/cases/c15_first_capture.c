/* Case 15: the process's first GPU work is a stream capture (global mode, a fresh non-blocking stream): a large
 * cuMemsetD8Async (0.5 GiB on a real GPU, as PyTorch's zeros; 16 MiB on the simulated GPU), a D32 memset and a kernel.
 * Under the library the first work of a process is where it learns the SM split and makes its first green context,
 * physical stream and events: calls CUDA counts as potentially unsafe during a global-mode capture, which invalidate
 * it unless the library switches its thread to relaxed capture mode around them (issue 28; the H100 returned
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED for the memset). The simulated GPU models that rule (simgpu graph.c, "Unsafe
 * calls"). No dalloc here: its synchronous memset would be the first work.
 * Then a capture forks into a stream no work has named yet (an event wait pulls it in), as a framework's side stream
 * does: the library first sees that stream when it joins the capture. On the H100 asking a capturing stream for its
 * flags invalidates the capture in every capture mode (probes/capture_unsafe.c), so the library must learn a stream
 * before it is captured. */
#include "conf.h"

#define N 4096

int main(void) {
    conf_init("first_capture");
    const size_t big_bytes = conf_simulated ? (size_t)16 << 20 : (size_t)512 << 20;
    CUstream S = mkstream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr big, y;
    CK(D.cuMemAlloc_v2(&big, big_bytes));
    CK(D.cuMemAlloc_v2(&y, N * 4));
    CK(D.cuStreamBeginCapture_v2(S, CU_STREAM_CAPTURE_MODE_GLOBAL));
    fact("first_capture.memset_rc", "%s", st(D.cuMemsetD8Async(big, 0x5a, big_bytes, S)));
    fact("first_capture.memset32_rc", "%s", st(D.cuMemsetD32Async(y, bits(1.5f), N, S)));
    k_add(S, y, y, y, N);
    CUgraph g = NULL;
    CUresult r = D.cuStreamEndCapture(S, &g);
    fact("first_capture.end_rc", "%s", st(r));
    if (r != CUDA_SUCCESS) {
        printf("fatal: first capture: no graph\n");
        return 2;
    }
    size_t nn = 0;
    CK(D.cuGraphGetNodes(g, NULL, &nn));
    fact("first_capture.nodes", "%zu", nn);
    CUgraphExec ge;
    CK(D.cuGraphInstantiateWithFlags(&ge, g, 0));
    CK(D.cuGraphLaunch(ge, S));
    CK(D.cuStreamSynchronize(S));
    unsigned char head[4096], tail[4096];
    CK(D.cuMemcpyDtoH_v2(head, big, sizeof head));
    CK(D.cuMemcpyDtoH_v2(tail, big + big_bytes - sizeof tail, sizeof tail));
    bool ok = true;
    for (size_t i = 0; i < sizeof head; i++)
        ok = ok && head[i] == 0x5a && tail[i] == 0x5a;
    fact("first_capture.replay_ok", "%s", yn(ok && all_f32(y, N, 3.0f)));
    CK(D.cuGraphExecDestroy(ge));
    CK(D.cuGraphDestroy(g));

    /* fork/join into a fresh side stream: z = 2.5 there, then y = z + z on S */
    CUstream T = mkstream(CU_STREAM_NON_BLOCKING);
    CUevent fork = mkevent(CU_EVENT_DISABLE_TIMING), join = mkevent(CU_EVENT_DISABLE_TIMING);
    CUdeviceptr z;
    CK(D.cuMemAlloc_v2(&z, N * 4));
    CK(D.cuStreamBeginCapture_v2(S, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(D.cuEventRecord(fork, S));
    fact("side_stream.wait_rc", "%s", st(D.cuStreamWaitEvent(T, fork, 0)));
    fact("side_stream.memset_rc", "%s", st(D.cuMemsetD32Async(z, bits(2.5f), N, T)));
    CK(D.cuEventRecord(join, T));
    CK(D.cuStreamWaitEvent(S, join, 0));
    k_add(S, y, z, z, N);
    g = NULL;
    r = D.cuStreamEndCapture(S, &g);
    fact("side_stream.end_rc", "%s", st(r));
    if (r != CUDA_SUCCESS) {
        printf("fatal: side-stream capture: no graph\n");
        return 2;
    }
    CK(D.cuGraphInstantiateWithFlags(&ge, g, 0));
    CK(D.cuGraphLaunch(ge, S));
    CK(D.cuStreamSynchronize(S));
    fact("side_stream.replay_ok", "%s", yn(all_f32(y, N, 5.0f)));
    CK(D.cuGraphExecDestroy(ge));
    CK(D.cuGraphDestroy(g));
    CK(D.cuMemFree_v2(z));
    CK(D.cuMemFree_v2(big));
    conf_done();
    return 0;
}
