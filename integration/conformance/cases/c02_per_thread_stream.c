/* Case 2: the per-thread default stream, reached through the _ptsz/_ptds entry points that cuGetProcAddress_v2
 * returns with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (README.md). */
#include "conf.h"

#define N 4096

static CUdeviceptr g_x2;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int phase;

static void wait_phase(int p) {
    pthread_mutex_lock(&mu);
    while (phase < p)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}
static void set_phase(int p) {
    pthread_mutex_lock(&mu);
    phase = p;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* The second thread: its own per-thread stream, independent of the main thread's. */
static void *other(void *arg) {
    (void)arg;
    CK(D.cuCtxSetCurrent(conf_ctx));
    wait_phase(1);
    k_fill_on(true, NULL, g_x2, 11, N);
    CK(D.cuStreamSynchronize_ptsz(NULL));
    set_phase(2);
    return NULL;
}

int main(void) {
    conf_init("per_thread_stream");
    const unsigned T = conf_spin_us;
    CUstream B = mkstream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr x = dalloc(N * 4);
    g_x2 = dalloc(N * 4);

    /* 1. NULL through a _ptsz entry point and the explicit CU_STREAM_PER_THREAD handle are the same stream */
    k_spin_on(true, NULL, T);
    fact("ptsz_null_is_per_thread.explicit_handle", "%s", st(D.cuStreamQuery(CU_STREAM_PER_THREAD)));
    CK(D.cuStreamSynchronize(CU_STREAM_PER_THREAD));
    fact("ptsz_null_is_per_thread.after_sync", "%s", st(D.cuStreamQuery_ptsz(NULL)));

    /* 2. the legacy stream waits for the per-thread stream (it is a blocking stream) */
    k_spin_on(true, NULL, T);
    k_fill(NULL, x, 1, N);
    CK(D.cuStreamSynchronize(NULL));
    fact("legacy_waits_per_thread.per_thread_stream", "%s", st(D.cuStreamQuery_ptsz(NULL)));

    /* 3. the per-thread stream waits for the legacy stream */
    k_spin(NULL, T);
    k_fill_on(true, NULL, x, 2, N);
    CK(D.cuStreamSynchronize_ptsz(NULL));
    fact("per_thread_waits_legacy.legacy_stream", "%s", st(D.cuStreamQuery(NULL)));

    /* 4. the per-thread stream does not wait for a non-blocking stream */
    k_spin(B, T);
    k_fill_on(true, NULL, x, 3, N);
    CK(D.cuStreamSynchronize_ptsz(NULL));
    fact("per_thread_vs_nonblocking.nonblocking_stream", "%s", st(D.cuStreamQuery(B)));
    CK(D.cuCtxSynchronize());
    fact("per_thread_vs_nonblocking.data_sum", "%" PRIu64, sum_u32(x, N));

    /* 5. two threads' per-thread streams are independent */
    pthread_t th;
    if (pthread_create(&th, NULL, other, NULL) != 0) {
        printf("fatal: pthread_create\n");
        return 2;
    }
    k_spin_on(true, NULL, T);
    set_phase(1);
    wait_phase(2);
    fact("per_thread_vs_other_thread.own_stream", "%s", st(D.cuStreamQuery_ptsz(NULL)));
    pthread_join(th, NULL);
    CK(D.cuStreamSynchronize_ptsz(NULL));
    fact("per_thread_vs_other_thread.data_sum", "%" PRIu64, sum_u32(g_x2, N));

    /* 6. a synchronous per-thread copy (_ptds) waits for the per-thread stream and sees its data */
    k_spin_on(true, NULL, T);
    k_fill_on(true, NULL, x, 4, N);
    uint32_t *h = malloc(N * 4);
    if (!h)
        return 3;
    CK(D.cuMemcpyDtoH_v2_ptds(h, x, N * 4));
    uint64_t s = 0;
    for (int i = 0; i < N; i++)
        s += h[i];
    free(h);
    fact("ptds_copy.per_thread_stream", "%s", st(D.cuStreamQuery_ptsz(NULL)));
    fact("ptds_copy.data_sum", "%" PRIu64, s);

    /* 7. cuStreamWaitEvent_ptsz on NULL makes the per-thread stream wait for another stream's event */
    CUstream A = mkstream(CU_STREAM_NON_BLOCKING);
    CUevent ev = mkevent(CU_EVENT_DISABLE_TIMING);
    k_spin(A, T);
    CK(D.cuEventRecord(ev, A));
    CK(D.cuStreamWaitEvent_ptsz(NULL, ev, 0));
    k_fill_on(true, NULL, x, 5, N);
    CK(D.cuStreamSynchronize_ptsz(NULL));
    fact("ptsz_wait_event.producer_stream", "%s", st(D.cuStreamQuery(A)));

    /* 8. a _ptsz entry point with an explicit stream handle uses that stream, not the per-thread one */
    k_spin_on(true, A, T);
    fact("ptsz_explicit_stream.that_stream", "%s", st(D.cuStreamQuery(A)));
    fact("ptsz_explicit_stream.per_thread_stream", "%s", st(D.cuStreamQuery_ptsz(NULL)));
    CK(D.cuStreamSynchronize(A));

    conf_done();
    return 0;
}
