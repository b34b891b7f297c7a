/* Case 10: stream-ordered allocation (cuMemAllocAsync / cuMemFreeAsync / pools) (README.md). */
#include "conf.h"

#define N 4096

static uint64_t used(CUmemoryPool p) {
    cuuint64_t v = 0;
    CK(D.cuMemPoolGetAttribute(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v));
    return v;
}

int main(void) {
    conf_init("mem_async");
    const unsigned T = conf_spin_us;
    CUstream A = mkstream(CU_STREAM_DEFAULT), B = mkstream(CU_STREAM_NON_BLOCKING);
    CUevent ev = mkevent(CU_EVENT_DISABLE_TIMING);
    CUmemoryPool defpool;
    CK(D.cuDeviceGetDefaultMemPool(&defpool, conf_dev));
    /* pinned: a device-to-pageable copy returns only when it is done, which would hide the "query before sync" */
    uint32_t *h = NULL;
    CK(D.cuMemAllocHost_v2((void **)&h, N * 4));
    uint64_t base = used(defpool);

    /* 1. allocate, use, copy out and free, all in the order of one stream behind a slow kernel */
    CUdeviceptr p = 0;
    k_spin(A, T);
    CK(D.cuMemAllocAsync(&p, N * 4, A));
    k_fill(A, p, 7, N);
    CK(D.cuMemcpyDtoHAsync_v2(h, p, N * 4, A));
    CK(D.cuMemFreeAsync(p, A));
    fact("one_stream.query_before_sync", "%s", st(D.cuStreamQuery(A)));
    CK(D.cuStreamSynchronize(A));
    uint64_t s = 0;
    for (int i = 0; i < N; i++)
        s += h[i];
    fact("one_stream.data_sum", "%" PRIu64, s);
    fact("one_stream.pool_used_after_free", "%" PRIu64, used(defpool) - base);

    /* 2. the pool counts the allocation once it is made, and releases it at the free */
    CK(D.cuMemAllocAsync(&p, N * 4, A));
    CK(D.cuStreamSynchronize(A));
    fact("pool.used_after_alloc_covers_size", "%s", yn(used(defpool) - base >= N * 4));
    CK(D.cuMemFreeAsync(p, A));
    CK(D.cuStreamSynchronize(A));
    fact("pool.used_after_free", "%" PRIu64, used(defpool) - base);

    /* 3. allocated on A, used and freed on B after an event */
    k_spin(A, T);
    CK(D.cuMemAllocAsync(&p, N * 4, A));
    k_fill(A, p, 9, N);
    CK(D.cuEventRecord(ev, A));
    CK(D.cuStreamWaitEvent(B, ev, 0));
    CK(D.cuMemcpyDtoHAsync_v2(h, p, N * 4, B));
    CK(D.cuMemFreeAsync(p, B));
    CK(D.cuStreamSynchronize(B));
    s = 0;
    for (int i = 0; i < N; i++)
        s += h[i];
    fact("cross_stream.data_sum", "%" PRIu64, s);
    fact("cross_stream.producer_stream", "%s", st(D.cuStreamQuery(A)));

    /* 4. an explicit pool, the legacy stream */
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = conf_dev;
    CUmemoryPool pool;
    CK(D.cuMemPoolCreate(&pool, &props));
    k_spin(A, T);
    CK(D.cuMemAllocFromPoolAsync(&p, N * 4, pool, NULL));
    k_fill(NULL, p, 5, N);
    CK(D.cuMemcpyDtoHAsync_v2(h, p, N * 4, NULL));
    CK(D.cuMemFreeAsync(p, NULL));
    CK(D.cuStreamSynchronize(NULL));
    s = 0;
    for (int i = 0; i < N; i++)
        s += h[i];
    fact("pool_legacy.data_sum", "%" PRIu64, s);
    fact("pool_legacy.blocking_stream", "%s", st(D.cuStreamQuery(A)));
    fact("pool_legacy.used_after_free", "%" PRIu64, used(pool));
    CK(D.cuMemPoolDestroy(pool));

    CK(D.cuMemFreeHost(h));
    conf_done();
    return 0;
}
