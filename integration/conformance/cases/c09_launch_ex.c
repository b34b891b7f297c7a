/* Case 9: cuLaunchKernelEx with config.hStream, and cooperative launches (README.md). */
#include "conf.h"

#define N 4096

static CUresult launch_ex(bool ptsz, CUfunction f, unsigned grid, unsigned block, CUstream s, void **args,
                          bool coop) {
    CUlaunchAttribute at;
    memset(&at, 0, sizeof at);
    at.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    at.value.cooperative = 1;
    CUlaunchConfig c;
    memset(&c, 0, sizeof c);
    c.gridDimX = grid;
    c.gridDimY = c.gridDimZ = 1;
    c.blockDimX = block;
    c.blockDimY = c.blockDimZ = 1;
    c.hStream = s;
    c.attrs = coop ? &at : NULL;
    c.numAttrs = coop ? 1 : 0;
    return (ptsz ? D.cuLaunchKernelEx_ptsz : D.cuLaunchKernelEx)(&c, f, args, NULL);
}

static void spin_ex(bool ptsz, CUstream s, unsigned us) {
    void *a[] = {&us};
    CK(launch_ex(ptsz, K_spin, 1, 32, s, a, false));
}

static void fill_ex(CUstream s, CUdeviceptr d, uint32_t v, uint64_t n) {
    unsigned us = 0;
    void *a[] = {&d, &v, &n, &us};
    CK(launch_ex(false, K_fill, CONF_GRID, CONF_BLOCK, s, a, false));
}

/* SM ids of a grid of `grid` blocks: all in [0, sms)? Prints the number of distinct SMs as info. */
static bool smids_ok(CUdeviceptr out, unsigned grid, const char *what) {
    uint32_t *h = malloc((size_t)grid * 4);
    if (!h)
        exit(3);
    CK(D.cuMemcpyDtoH_v2(h, out, (size_t)grid * 4));
    bool ok = true;
    unsigned distinct = 0, hi = 0;
    static unsigned char seen[4096];
    memset(seen, 0, sizeof seen);
    for (unsigned i = 0; i < grid; i++) {
        if (h[i] >= (unsigned)conf_sms || h[i] >= sizeof seen) {
            ok = false;
            continue;
        }
        if (!seen[h[i]]++)
            distinct++;
        if (h[i] > hi)
            hi = h[i];
    }
    info("%s_distinct_sms=%u %s_max_sm=%u", what, distinct, what, hi);
    free(h);
    return ok;
}

int main(void) {
    conf_init("launch_ex");
    const unsigned T = conf_spin_us;
    CUstream A = mkstream(CU_STREAM_DEFAULT), B = mkstream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr x = dalloc(N * 4);
    unsigned grid = (unsigned)conf_sms;
    CUdeviceptr ids = dalloc((size_t)grid * 4);

    /* 1. config.hStream decides the stream: A, then the legacy stream waits for A */
    spin_ex(false, A, T);
    fill_ex(NULL, x, 3, N);
    CK(D.cuStreamSynchronize(NULL));
    fact("hstream.blocking_stream_after_legacy_sync", "%s", st(D.cuStreamQuery(A)));
    fact("hstream.data_sum", "%" PRIu64, sum_u32(x, N));

    /* 2. a non-blocking config.hStream is not waited for by the legacy stream */
    spin_ex(false, B, T);
    fill_ex(NULL, x, 4, N);
    CK(D.cuStreamSynchronize(NULL));
    fact("hstream.nonblocking_stream_after_legacy_sync", "%s", st(D.cuStreamQuery(B)));
    CK(D.cuStreamSynchronize(B));

    /* 3. cuLaunchKernelEx_ptsz with a NULL hStream is the per-thread default stream */
    spin_ex(true, NULL, T);
    fact("ptsz.per_thread_stream", "%s", st(D.cuStreamQuery(CU_STREAM_PER_THREAD)));
    CK(D.cuStreamSynchronize_ptsz(NULL));

    /* 4. cooperative launches with one block per SM of the device (always co-resident) */
    unsigned us = 1000;
    void *a[] = {&ids, &us};
    fact("cooperative_ex.rc", "%s", st(launch_ex(false, K_smid, grid, 32, A, a, true)));
    CK(D.cuStreamSynchronize(A));
    fact("cooperative_ex.smids_in_range", "%s", yn(smids_ok(ids, grid, "cooperative_ex")));
    fact("cooperative.rc", "%s", st(D.cuLaunchCooperativeKernel(K_smid, grid, 1, 1, 32, 1, 1, 0, B, a)));
    CK(D.cuStreamSynchronize(B));
    fact("cooperative.smids_in_range", "%s", yn(smids_ok(ids, grid, "cooperative")));

    /* 5. an ordinary grid of one block per SM on a fresh stream: where it ran (info; the Go test checks
     * confinement with it) */
    CUstream C = mkstream(CU_STREAM_NON_BLOCKING);
    CK(launch(false, K_smid, grid, 32, C, a));
    CK(D.cuStreamSynchronize(C));
    fact("plain.smids_in_range", "%s", yn(smids_ok(ids, grid, "plain")));

    conf_done();
    return 0;
}
