/* Case 4: events — record, query, synchronize, elapsed time, and their ordering across streams (README.md). */
#include "conf.h"

int main(void) {
    conf_init("events");
    const unsigned T = conf_spin_us;
    CUstream A = mkstream(CU_STREAM_DEFAULT), B = mkstream(CU_STREAM_NON_BLOCKING),
             C = mkstream(CU_STREAM_NON_BLOCKING);
    CUevent e0 = mkevent(CU_EVENT_DEFAULT), e1 = mkevent(CU_EVENT_DEFAULT), nt = mkevent(CU_EVENT_DISABLE_TIMING),
            fresh = mkevent(CU_EVENT_DEFAULT), e2 = mkevent(CU_EVENT_DISABLE_TIMING);

    /* 1. an event recorded after a kernel completes with it */
    CK(D.cuEventRecord(e0, A));
    k_spin(A, T);
    CK(D.cuEventRecord(e1, A));
    fact("record_after_kernel.query", "%s", st(D.cuEventQuery(e1)));
    float ms = -1;
    fact("record_after_kernel.elapsed_before_completion", "%s", st(D.cuEventElapsedTime(&ms, e0, e1)));
    CK(D.cuEventSynchronize(e1));
    fact("record_after_kernel.query_after_sync", "%s", st(D.cuEventQuery(e1)));
    fact("record_after_kernel.stream_after_sync", "%s", st(D.cuStreamQuery(A)));
    CK(D.cuEventElapsedTime(&ms, e0, e1));
    fact("record_after_kernel.elapsed_covers_kernel", "%s", yn(ms >= 0.9f * (float)T / 1000.0f));
    info("elapsed_ms=%.3f spin_ms=%u", (double)ms, T / 1000);

    /* 2. an event never recorded is complete; elapsed time needs timing on both events */
    fact("unrecorded.query", "%s", st(D.cuEventQuery(fresh)));
    fact("unrecorded.synchronize", "%s", st(D.cuEventSynchronize(fresh)));
    CK(D.cuEventRecord(nt, A));
    CK(D.cuEventSynchronize(nt));
    fact("disable_timing.elapsed", "%s", st(D.cuEventElapsedTime(&ms, e0, nt)));

    /* 3. re-recording moves the event: the last record counts */
    k_spin(B, T);
    CK(D.cuEventRecord(e2, B));
    fact("rerecord.first", "%s", st(D.cuEventQuery(e2)));
    CK(D.cuEventRecord(e2, C));
    CK(D.cuEventSynchronize(e2));
    fact("rerecord.second_synced_while_first_stream", "%s", st(D.cuStreamQuery(B)));
    CK(D.cuStreamSynchronize(B));

    /* 4. an event recorded on the legacy stream covers earlier work of blocking streams */
    k_spin(A, T);
    CK(D.cuEventRecord(e2, NULL));
    CK(D.cuEventSynchronize(e2));
    fact("legacy_record.blocking_stream", "%s", st(D.cuStreamQuery(A)));

    /* 5. one recorded on a non-blocking stream does not */
    k_spin(A, T);
    CK(D.cuEventRecord(e2, B));
    CK(D.cuEventSynchronize(e2));
    fact("nonblocking_record.blocking_stream", "%s", st(D.cuStreamQuery(A)));
    CK(D.cuCtxSynchronize());

    /* 6. elapsed time across streams: start on B, B waits for A's kernel, end on B */
    CK(D.cuEventRecord(e0, B));
    k_spin(A, T);
    CK(D.cuEventRecord(nt, A));
    CK(D.cuStreamWaitEvent(B, nt, 0));
    CK(D.cuEventRecord(e1, B));
    CK(D.cuEventSynchronize(e1));
    fact("cross_stream.producer_done", "%s", st(D.cuStreamQuery(A)));
    CK(D.cuEventElapsedTime(&ms, e0, e1));
    fact("cross_stream.elapsed_covers_kernel", "%s", yn(ms >= 0.9f * (float)T / 1000.0f));
    info("cross_stream_elapsed_ms=%.3f", (double)ms);

    /* 7. a BLOCKING_SYNC event: the host sleeps instead of spinning, same ordering */
    CUevent bs = mkevent(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING);
    k_spin(A, T);
    CK(D.cuEventRecord(bs, A));
    fact("blocking_sync.query", "%s", st(D.cuEventQuery(bs)));
    CK(D.cuEventSynchronize(bs));
    fact("blocking_sync.stream_after_sync", "%s", st(D.cuStreamQuery(A)));

    conf_done();
    return 0;
}
