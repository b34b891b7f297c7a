/* Case 3: synchronous memcpy/memset semantics (README.md). */
#include "conf.h"

#define N 4096

int main(void) {
    conf_init("sync_memcpy");
    const unsigned T = conf_spin_us;
    CUstream A = mkstream(CU_STREAM_DEFAULT), B = mkstream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr x = dalloc(N * 4), y = dalloc(N * 4);
    uint32_t *h = malloc(N * 4);
    if (!h)
        return 3;

    /* 1. cuMemcpyDtoH waits for earlier work of blocking streams; the host sees it when the call returns */
    k_spin(A, T);
    k_fill(A, x, 7, N);
    CK(D.cuMemcpyDtoH_v2(h, x, N * 4));
    uint64_t s = 0;
    for (int i = 0; i < N; i++)
        s += h[i];
    fact("dtoh_after_blocking.data_sum", "%" PRIu64, s);
    fact("dtoh_after_blocking.blocking_stream", "%s", st(D.cuStreamQuery(A)));

    /* 2. cuMemcpyHtoD from pageable memory: the source may be reused as soon as the call returns */
    for (int i = 0; i < N; i++)
        h[i] = (uint32_t)i;
    CK(D.cuMemcpyHtoD_v2(y, h, N * 4));
    for (int i = 0; i < N; i++)
        h[i] = 0xffffffffu;
    fact("htod_pageable.data_sum", "%" PRIu64, sum_u32(y, N));

    /* 3. a synchronous memset is ordered after blocking-stream work that was issued before it */
    k_spin(A, T);
    k_fill(A, x, 1, N);
    CK(D.cuMemsetD32_v2(x, 2, N));
    fact("memset_after_blocking.data_sum", "%" PRIu64, sum_u32(x, N));
    fact("memset_after_blocking.blocking_stream", "%s", st(D.cuStreamQuery(A)));

    /* 4. cuMemcpyDtoD is ordered the same way */
    k_spin(A, T);
    k_fill(A, x, 3, N);
    CK(D.cuMemcpyDtoD_v2(y, x, N * 4));
    fact("dtod_after_blocking.data_sum", "%" PRIu64, sum_u32(y, N));

    /* 5. cuMemsetD8 then a kernel on the legacy stream then a copy: program order */
    CK(D.cuMemsetD8_v2(y, 0x01, N * 4));
    k_fill(NULL, y, 5, N / 2);
    fact("memset8_then_kernel.data_sum", "%" PRIu64, sum_u32(y, N));

    /* 6. synchronous copies do not wait for non-blocking streams */
    k_spin(B, T);
    CK(D.cuMemcpyDtoH_v2(h, y, N * 4));
    fact("dtoh_vs_nonblocking.nonblocking_stream", "%s", st(D.cuStreamQuery(B)));
    CK(D.cuMemsetD32_v2(y, 4, N));
    fact("memset_vs_nonblocking.nonblocking_stream", "%s", st(D.cuStreamQuery(B)));
    CK(D.cuStreamSynchronize(B));

    free(h);
    conf_done();
    return 0;
}
