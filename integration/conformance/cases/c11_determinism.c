/* Case 11: many streams x many kernels with cross-stream event edges give bit-identical results on every run, equal
 * to a host reference computed with the same float operations (README.md). */
#include "conf.h"

#define S 8        /* streams in the dependency graph */
#define ROUNDS 24  /* kernels per stream (plus exchanges) */
#define N 2048
#define THREADS 4  /* threads with their own independent streams */

static float xval(int s, int i) { return (float)((i * 37 + s * 101) % 1000) * 0.001953125f + (float)s * 0.25f; }
static float alpha(int s, int k) { return 1.0f / (float)(k + 2 + s); }

struct run {
    CUstream st[S];
    CUevent e[S], r[S];
    CUdeviceptr x[S], y[S], c[S];
};

static void graph_run(struct run *R) {
    for (int s = 0; s < S; s++)
        CK(D.cuMemsetD32Async(R->y[s], 0, N, R->st[s]));
    for (int k = 0; k < ROUNDS; k++) {
        for (int s = 0; s < S; s++)
            k_axpy(R->st[s], R->y[s], R->x[s], alpha(s, k), N);
        if (k % 4 == 3) {
            /* a short kernel per stream: the run lasts long enough for grant changes to land between kernels */
            for (int s = 0; s < S; s++)
                k_spin(R->st[s], 2000);
            /* exchange: s snapshots y_s into c_s (after its right neighbour finished reading c_s last time) ... */
            for (int s = 0; s < S; s++) {
                CK(D.cuStreamWaitEvent(R->st[s], R->r[(s + 1) % S], 0));
                CK(D.cuMemcpyDtoDAsync_v2(R->c[s], R->y[s], N * 4, R->st[s]));
                CK(D.cuEventRecord(R->e[s], R->st[s]));
            }
            /* ... and adds its left neighbour's snapshot */
            for (int s = 0; s < S; s++) {
                CK(D.cuStreamWaitEvent(R->st[s], R->e[(s + S - 1) % S], 0));
                k_add(R->st[s], R->y[s], R->y[s], R->c[(s + S - 1) % S], N);
                CK(D.cuEventRecord(R->r[s], R->st[s]));
            }
        }
    }
}

static void reference(float y[S][N]) {
    static float c[S][N];
    memset(y, 0, sizeof(float) * S * N);
    for (int k = 0; k < ROUNDS; k++) {
        for (int s = 0; s < S; s++)
            for (int i = 0; i < N; i++) {
                float t = alpha(s, k) * xval(s, i);
                y[s][i] = t + y[s][i];
            }
        if (k % 4 == 3) {
            memcpy(c, y, sizeof c);
            for (int s = 0; s < S; s++)
                for (int i = 0; i < N; i++)
                    y[s][i] = y[s][i] + c[(s + S - 1) % S][i];
        }
    }
}

struct tjob {
    int id;
    uint64_t hash;
};

/* Independent per-thread work: each thread its own non-blocking streams and buffers. */
static void *tworker(void *arg) {
    struct tjob *j = arg;
    CK(D.cuCtxSetCurrent(conf_ctx));
    CUstream s1 = mkstream(CU_STREAM_NON_BLOCKING), s2 = mkstream(CU_STREAM_NON_BLOCKING);
    CUevent ev = mkevent(CU_EVENT_DISABLE_TIMING);
    CUdeviceptr x = dalloc(N * 4), y = dalloc(N * 4), z = dalloc(N * 4);
    static __thread float hx[N];
    for (int i = 0; i < N; i++)
        hx[i] = xval(j->id, i);
    CK(D.cuMemcpyHtoDAsync_v2(x, hx, N * 4, s1));
    for (int k = 0; k < ROUNDS; k++) {
        k_axpy(s1, y, x, alpha(j->id, k), N);
        CK(D.cuEventRecord(ev, s1));
        CK(D.cuStreamWaitEvent(s2, ev, 0));
        k_add(s2, z, z, y, N);
        CK(D.cuEventRecord(ev, s2));
        CK(D.cuStreamWaitEvent(s1, ev, 0));
    }
    CK(D.cuStreamSynchronize(s2));
    j->hash = hash_dev(z, N * 4, hash_dev(y, N * 4, FNV_INIT));
    CK(D.cuMemFree_v2(x));
    CK(D.cuMemFree_v2(y));
    CK(D.cuMemFree_v2(z));
    CK(D.cuStreamDestroy_v2(s1));
    CK(D.cuStreamDestroy_v2(s2));
    CK(D.cuEventDestroy_v2(ev));
    return NULL;
}

int main(void) {
    conf_init("determinism");
    static struct run R;
    static float hx[N], ref[S][N], got[S][N];
    for (int s = 0; s < S; s++) {
        R.st[s] = mkstream(s % 2 ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT);
        R.e[s] = mkevent(CU_EVENT_DISABLE_TIMING);
        R.r[s] = mkevent(CU_EVENT_DISABLE_TIMING);
        R.x[s] = dalloc(N * 4);
        R.y[s] = dalloc(N * 4);
        R.c[s] = dalloc(N * 4);
        for (int i = 0; i < N; i++)
            hx[i] = xval(s, i);
        CK(D.cuMemcpyHtoD_v2(R.x[s], hx, N * 4));
    }
    reference(ref);
    uint64_t first = 0;
    bool same = true, matches = true;
    for (int run = 0; run < 3; run++) {
        graph_run(&R);
        CK(D.cuCtxSynchronize());
        uint64_t h = FNV_INIT;
        for (int s = 0; s < S; s++) {
            CK(D.cuMemcpyDtoH_v2(got[s], R.y[s], N * 4));
            h = fnv1a(got[s], N * 4, h);
        }
        if (memcmp(got, ref, sizeof got) != 0)
            matches = false;
        if (run == 0)
            first = h;
        else if (h != first)
            same = false;
    }
    fact("graph.hash", "%016" PRIx64, first);
    fact("graph.runs_identical", "%s", yn(same));
    fact("graph.matches_host_reference", "%s", yn(matches));

    pthread_t th[THREADS];
    struct tjob jobs[THREADS];
    for (int t = 0; t < THREADS; t++) {
        jobs[t].id = t;
        if (pthread_create(&th[t], NULL, tworker, &jobs[t]) != 0) {
            printf("fatal: pthread_create\n");
            return 2;
        }
    }
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < THREADS; t++)
        fact("threads.hash", "%d:%016" PRIx64, t, jobs[t].hash);

    conf_done();
    return 0;
}
