/* Case 8: cuLaunchHostFunc ordering (README.md). Host functions make no CUDA calls. */
#include "conf.h"

#include <stdatomic.h>

static atomic_int g_seq;

struct hf {
    uint64_t t;
    int order;
    unsigned sleep_ms;
    atomic_int ran;
};

static void hostfn(void *p) {
    struct hf *h = p;
    if (h->sleep_ms)
        sleep_ms(h->sleep_ms);
    h->t = now_ns();
    h->order = atomic_fetch_add(&g_seq, 1);
    atomic_store(&h->ran, 1);
}

/* cuStreamAddCallback: the callback gets the application's own stream handle and the stream's status. */
struct cbrec {
    CUstream stream;
    CUresult status;
    uint64_t t;
    atomic_int ran;
};

static void callback(CUstream s, CUresult status, void *p) {
    struct cbrec *c = p;
    c->stream = s;
    c->status = status;
    c->t = now_ns();
    atomic_store(&c->ran, 1);
}

int main(void) {
    conf_init("host_func");
    const unsigned T = conf_spin_us;
    CUstream A = mkstream(CU_STREAM_DEFAULT), B = mkstream(CU_STREAM_NON_BLOCKING);
    CUevent ev = mkevent(CU_EVENT_DISABLE_TIMING);
    static struct hf h[16];

    /* 1. a host function runs after the kernel before it */
    uint64_t t0 = now_ns();
    k_spin(A, T);
    CK(D.cuLaunchHostFunc(A, hostfn, &h[0]));
    CK(D.cuStreamSynchronize(A));
    fact("after_kernel.ran", "%d", atomic_load(&h[0].ran));
    fact("after_kernel.ran_after_kernel_time", "%s", yn(h[0].t - t0 >= (uint64_t)T * 900u));

    /* 2. later work waits for the host function; stream sync waits for it too */
    h[1].sleep_ms = T / 2000;
    CK(D.cuLaunchHostFunc(A, hostfn, &h[1]));
    k_spin(A, 1000);
    fact("blocks_stream.query", "%s", st(D.cuStreamQuery(A)));
    CK(D.cuStreamSynchronize(A));
    fact("blocks_stream.ran_before_sync_returned", "%d", atomic_load(&h[1].ran));

    /* 3. host functions on one stream run in issue order */
    atomic_store(&g_seq, 0);
    for (int i = 2; i < 7; i++) {
        k_spin(A, 2000);
        CK(D.cuLaunchHostFunc(A, hostfn, &h[i]));
    }
    CK(D.cuStreamSynchronize(A));
    fact("in_order.orders", "%d,%d,%d,%d,%d", h[2].order, h[3].order, h[4].order, h[5].order, h[6].order);

    /* 4. across streams through an event: B's host function runs after A's */
    atomic_store(&g_seq, 0);
    k_spin(A, T);
    CK(D.cuLaunchHostFunc(A, hostfn, &h[7]));
    CK(D.cuEventRecord(ev, A));
    CK(D.cuStreamWaitEvent(B, ev, 0));
    k_spin(B, 1000);
    CK(D.cuLaunchHostFunc(B, hostfn, &h[8]));
    CK(D.cuStreamSynchronize(B));
    fact("cross_stream.orders", "%d,%d", h[7].order, h[8].order);

    /* 5. a host function on the legacy stream runs after earlier blocking-stream work */
    t0 = now_ns();
    k_spin(A, T);
    CK(D.cuLaunchHostFunc(NULL, hostfn, &h[9]));
    CK(D.cuStreamSynchronize(NULL));
    fact("legacy.ran", "%d", atomic_load(&h[9].ran));
    fact("legacy.ran_after_blocking_kernel", "%s", yn(h[9].t - t0 >= (uint64_t)T * 900u));

    /* 6. per-thread default stream through the _ptsz twin */
    t0 = now_ns();
    k_spin_on(true, NULL, T);
    CK(D.cuLaunchHostFunc_ptsz(NULL, hostfn, &h[10]));
    CK(D.cuStreamSynchronize_ptsz(NULL));
    fact("per_thread.ran_after_kernel", "%s", yn(atomic_load(&h[10].ran) && h[10].t - t0 >= (uint64_t)T * 900u));

    /* 7. stream callbacks (the older API): after the kernel, with the application's stream handle */
    static struct cbrec cb;
    t0 = now_ns();
    k_spin(B, T);
    CK(D.cuStreamAddCallback(B, callback, &cb, 0));
    CK(D.cuStreamSynchronize(B));
    fact("callback.ran", "%d", atomic_load(&cb.ran));
    fact("callback.stream_is_app_stream", "%s", yn(cb.stream == B));
    fact("callback.status", "%s", st(cb.status));
    fact("callback.ran_after_kernel", "%s", yn(cb.t - t0 >= (uint64_t)T * 900u));

    conf_done();
    return 0;
}
