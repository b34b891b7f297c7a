/* neighbour — not a case: another tenant's busy process for the conformance test's "shared" mode. It launches
 * grids of 4 blocks per SM, 2 ms each, until CONF_NEIGHBOUR_S seconds pass or stdin reaches EOF (the test closes
 * it), then prints which SMs its kernels ran on, so the test can check they stayed off the case tenant's groups. */
#include "conf.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

int main(void) {
    conf_init("neighbour");
    const char *s = getenv("CONF_NEIGHBOUR_S");
    unsigned secs = s && *s ? (unsigned)strtoul(s, NULL, 10) : 60;
    if (secs == 0 || secs > 3600) {
        printf("fatal: CONF_NEIGHBOUR_S=%s: allowed 1..3600\n", s);
        return 2;
    }
    CUstream st = mkstream(CU_STREAM_NON_BLOCKING);
    unsigned grid = 4u * (unsigned)conf_sms, us = 2000;
    CUdeviceptr ids = dalloc((size_t)grid * 4);
    uint32_t *h = malloc((size_t)grid * 4);
    static unsigned char seen[4096];
    if (!h)
        return 3;
    uint64_t end = now_ns() + (uint64_t)secs * 1000000000ull;
    unsigned long launches = 0;
    struct pollfd pfd = {.fd = 0, .events = POLLIN};
    while (now_ns() < end) {
        void *a[] = {&ids, &us};
        CK(launch(false, K_smid, grid, 32, st, a));
        CK(D.cuMemcpyDtoHAsync_v2(h, ids, (size_t)grid * 4, st));
        CK(D.cuStreamSynchronize(st));
        for (unsigned i = 0; i < grid; i++)
            if (h[i] < sizeof seen)
                seen[h[i]] = 1;
        launches++;
        if (poll(&pfd, 1, 0) > 0) { /* stdin readable: EOF (or data) means stop */
            char c;
            if (read(0, &c, 1) <= 0)
                break;
        }
    }
    int lo = -1, hi = -1, n = 0;
    for (int i = 0; i < (int)sizeof seen; i++)
        if (seen[i]) {
            if (lo < 0)
                lo = i;
            hi = i;
            n++;
        }
    info("neighbour_launches=%lu neighbour_sms=%d neighbour_sm_min=%d neighbour_sm_max=%d", launches, n, lo, hi);
    conf_done();
    return 0;
}
