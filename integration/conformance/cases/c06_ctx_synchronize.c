/* Case 6: cuCtxSynchronize waits for every stream of the context (README.md). */
#include "conf.h"

static CUevent g_thread_ev;

static void *other(void *arg) {
    (void)arg;
    CK(D.cuCtxSetCurrent(conf_ctx));
    k_spin_on(true, NULL, conf_spin_us); /* this thread's per-thread default stream */
    CK(D.cuEventRecord_ptsz(g_thread_ev, NULL));
    return NULL;
}

int main(void) {
    conf_init("ctx_synchronize");
    const unsigned T = conf_spin_us;
    CUstream A = mkstream(CU_STREAM_DEFAULT), B = mkstream(CU_STREAM_NON_BLOCKING), P;
    CK(D.cuStreamCreateWithPriority(&P, CU_STREAM_NON_BLOCKING, -1));
    g_thread_ev = mkevent(CU_EVENT_DISABLE_TIMING);
    CUevent eb = mkevent(CU_EVENT_DISABLE_TIMING);

    uint64_t t0 = now_ns();
    pthread_t th;
    if (pthread_create(&th, NULL, other, NULL) != 0) {
        printf("fatal: pthread_create\n");
        return 2;
    }
    pthread_join(th, NULL);
    k_spin(B, T);
    CK(D.cuEventRecord(eb, B));
    k_spin(P, T);
    k_spin(A, T);
    k_spin(NULL, T / 2); /* after A (legacy waits for blocking streams) */
    fact("before.nonblocking", "%s", st(D.cuStreamQuery(B)));
    CK(D.cuCtxSynchronize());
    uint64_t dt = now_ns() - t0;
    fact("after.blocking", "%s", st(D.cuStreamQuery(A)));
    fact("after.nonblocking", "%s", st(D.cuStreamQuery(B)));
    fact("after.priority", "%s", st(D.cuStreamQuery(P)));
    fact("after.legacy", "%s", st(D.cuStreamQuery(NULL)));
    fact("after.other_thread_per_thread_stream", "%s", st(D.cuEventQuery(g_thread_ev)));
    fact("after.event_on_nonblocking", "%s", st(D.cuEventQuery(eb)));
    /* the legacy spin starts after A's: at least 1.5 T in all */
    fact("waited_for_longest_chain", "%s", yn(dt >= (uint64_t)T * 1000u * 14 / 10));
    info("ctx_sync_ms=%.1f", (double)dt / 1e6);

    /* nothing pending: returns at once with success */
    fact("idle", "%s", st(D.cuCtxSynchronize()));

    conf_done();
    return 0;
}
