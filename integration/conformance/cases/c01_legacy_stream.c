/* Case 1: the legacy default stream orders with blocking streams, not with non-blocking ones (README.md). */
#include "conf.h"

#define N 4096

int main(void) {
    conf_init("legacy_stream");
    const unsigned T = conf_spin_us;
    CUstream A = mkstream(CU_STREAM_DEFAULT), C = mkstream(CU_STREAM_DEFAULT), B = mkstream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr x = dalloc(N * 4), y = dalloc(N * 4);

    /* 1. work on the legacy stream (NULL) waits for a blocking stream: it reads what A wrote after a spin */
    k_spin(A, T);
    k_fill(A, x, bits(1.0f), N);
    k_add(NULL, y, x, x, N);
    CK(D.cuStreamSynchronize(NULL));
    fact("legacy_after_blocking.blocking_stream", "%s", st(D.cuStreamQuery(A)));
    fact("legacy_after_blocking.data_ok", "%s", yn(all_f32(y, N, 2.0f)));
    CK(D.cuCtxSynchronize());

    /* 2. a blocking stream waits for the legacy stream (explicit CU_STREAM_LEGACY handle) */
    k_spin(CU_STREAM_LEGACY, T);
    k_fill(CU_STREAM_LEGACY, x, bits(3.0f), N);
    k_add(A, y, x, x, N);
    CK(D.cuStreamSynchronize(A));
    fact("blocking_after_legacy.legacy_stream", "%s", st(D.cuStreamQuery(CU_STREAM_LEGACY)));
    fact("blocking_after_legacy.data_ok", "%s", yn(all_f32(y, N, 6.0f)));
    CK(D.cuCtxSynchronize());

    /* 3. the legacy stream does not wait for a non-blocking stream */
    k_spin(B, T);
    k_fill(NULL, x, 5, N);
    CK(D.cuStreamSynchronize(NULL));
    fact("legacy_vs_nonblocking.nonblocking_stream", "%s", st(D.cuStreamQuery(B)));
    CK(D.cuStreamSynchronize(B));
    fact("legacy_vs_nonblocking.after_sync", "%s", st(D.cuStreamQuery(B)));

    /* 4. a non-blocking stream does not wait for the legacy stream */
    k_spin(NULL, T);
    k_fill(B, x, 6, N);
    CK(D.cuStreamSynchronize(B));
    fact("nonblocking_vs_legacy.legacy_stream", "%s", st(D.cuStreamQuery(NULL)));
    CK(D.cuCtxSynchronize());
    fact("nonblocking_vs_legacy.data_sum", "%" PRIu64, sum_u32(x, N));

    /* 5. two blocking streams do not wait for each other directly */
    k_spin(A, T);
    k_fill(C, y, 7, N);
    CK(D.cuStreamSynchronize(C));
    fact("blocking_vs_blocking.other_stream", "%s", st(D.cuStreamQuery(A)));
    CK(D.cuCtxSynchronize());

    /* 6. but they do through the legacy stream: A -> legacy -> C */
    k_spin(A, T);
    k_fill(NULL, x, 8, N);
    k_fill(C, y, 9, N);
    CK(D.cuStreamSynchronize(C));
    fact("blocking_chain_via_legacy.first_stream", "%s", st(D.cuStreamQuery(A)));
    fact("blocking_chain_via_legacy.legacy_stream", "%s", st(D.cuStreamQuery(NULL)));
    CK(D.cuCtxSynchronize());
    fact("blocking_chain_via_legacy.data_sum", "%" PRIu64, sum_u32(x, N) + sum_u32(y, N));

    conf_done();
    return 0;
}
