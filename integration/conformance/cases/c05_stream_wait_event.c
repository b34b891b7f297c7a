/* Case 5: cuStreamWaitEvent cross-stream dependencies (README.md). */
#include "conf.h"

#define N 4096

int main(void) {
    conf_init("stream_wait_event");
    const unsigned T = conf_spin_us;
    CUstream A = mkstream(CU_STREAM_NON_BLOCKING), B = mkstream(CU_STREAM_NON_BLOCKING),
             C = mkstream(CU_STREAM_NON_BLOCKING);
    CUevent ev = mkevent(CU_EVENT_DISABLE_TIMING), ev2 = mkevent(CU_EVENT_DISABLE_TIMING),
            fresh = mkevent(CU_EVENT_DISABLE_TIMING);
    CUdeviceptr x = dalloc(N * 4), y = dalloc(N * 4), z = dalloc(N * 4);

    /* 1. a slow producer on A, a dependent consumer on B */
    k_spin(A, T);
    k_fill(A, x, bits(1.5f), N);
    CK(D.cuEventRecord(ev, A));
    CK(D.cuStreamWaitEvent(B, ev, 0));
    k_add(B, y, x, x, N);
    CK(D.cuStreamSynchronize(B));
    fact("dependent.producer_stream", "%s", st(D.cuStreamQuery(A)));
    fact("dependent.data_ok", "%s", yn(all_f32(y, N, 3.0f)));

    /* 2. without the wait, C does not wait; a wait on a never-recorded event is a no-op */
    k_spin(A, T);
    CK(D.cuStreamWaitEvent(C, fresh, 0));
    k_fill(C, z, 1, N);
    CK(D.cuStreamSynchronize(C));
    fact("independent.other_stream", "%s", st(D.cuStreamQuery(A)));
    CK(D.cuStreamSynchronize(A));

    /* 3. a chain A -> B -> C */
    k_spin(A, T);
    k_fill(A, x, bits(2.0f), N);
    CK(D.cuEventRecord(ev, A));
    CK(D.cuStreamWaitEvent(B, ev, 0));
    k_add(B, y, x, x, N);
    CK(D.cuEventRecord(ev2, B));
    CK(D.cuStreamWaitEvent(C, ev2, 0));
    k_add(C, z, y, x, N);
    CK(D.cuStreamSynchronize(C));
    fact("chain.first", "%s", st(D.cuStreamQuery(A)));
    fact("chain.second", "%s", st(D.cuStreamQuery(B)));
    fact("chain.data_ok", "%s", yn(all_f32(z, N, 6.0f)));

    /* 4. the wait binds to the record made before it: re-recording the event later does not release it */
    k_spin(A, T);
    CK(D.cuEventRecord(ev, A));
    CK(D.cuStreamWaitEvent(B, ev, 0));
    CK(D.cuEventRecord(ev, C));
    CK(D.cuStreamSynchronize(B));
    fact("wait_binds_record.producer_stream", "%s", st(D.cuStreamQuery(A)));

    /* 5. the legacy stream can wait on an event of a non-blocking stream */
    k_spin(A, T);
    k_fill(A, x, bits(4.0f), N);
    CK(D.cuEventRecord(ev, A));
    CK(D.cuStreamWaitEvent(NULL, ev, 0));
    k_add(NULL, y, x, x, N);
    CK(D.cuStreamSynchronize(NULL));
    fact("legacy_waits_event.producer_stream", "%s", st(D.cuStreamQuery(A)));
    fact("legacy_waits_event.data_ok", "%s", yn(all_f32(y, N, 8.0f)));

    conf_done();
    return 0;
}
