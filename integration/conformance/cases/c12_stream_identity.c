/* Case 12: what the application sees of its streams and context after its kernels ran (possibly through the
 * library's physical streams): flags, priority, context, green context, id and the current context (README.md). */
#include "conf.h"

static unsigned long long sid(CUstream s) {
    unsigned long long id = 0;
    CK(D.cuStreamGetId(s, &id));
    return id;
}

int main(void) {
    conf_init("stream_identity");
    CUstream A = mkstream(CU_STREAM_DEFAULT), B = mkstream(CU_STREAM_NON_BLOCKING), P;
    CK(D.cuStreamCreateWithPriority(&P, CU_STREAM_NON_BLOCKING, -1));
    CUstream all[] = {A, B, P, NULL, CU_STREAM_LEGACY};
    const char *names[] = {"blocking", "nonblocking", "priority", "null", "legacy"};
    unsigned long long ids[5];
    for (int i = 0; i < 3; i++)
        ids[i] = sid(all[i]);

    /* zeroed before any stream runs: dalloc's memset is ordered on the legacy stream only, so made after the spins
     * it could land after the non-blocking streams' fills and erase them (seen on the H100) */
    CUdeviceptr x = dalloc(5 * 1024 * 4);
    CK(D.cuCtxSynchronize());
    /* run kernels everywhere, including a spin so that work is in flight while we look */
    for (int i = 0; i < 5; i++)
        k_spin(all[i], 2000);
    /* each stream its own slice of 1024 words: the non-blocking ones run concurrently with the rest */
    for (int i = 0; i < 5; i++)
        k_fill(all[i], x + (CUdeviceptr)i * 1024 * 4, (uint32_t)i + 1, 1024);

    for (int i = 0; i < 5; i++) {
        char key[96];
        CUcontext c = NULL, c2 = NULL;
        CUgreenCtx g = (CUgreenCtx)(uintptr_t)1;
        CK(D.cuStreamGetCtx(all[i], &c));
        CK(D.cuStreamGetCtx_v2(all[i], &c2, &g));
        snprintf(key, sizeof key, "%s.ctx_is_primary", names[i]);
        fact(key, "%s", yn(c == conf_ctx && c2 == conf_ctx));
        snprintf(key, sizeof key, "%s.green_ctx_is_null", names[i]);
        fact(key, "%s", yn(g == NULL));
        if (i < 3) {
            unsigned fl = 99;
            int pr = 99;
            CK(D.cuStreamGetFlags(all[i], &fl));
            CK(D.cuStreamGetPriority(all[i], &pr));
            snprintf(key, sizeof key, "%s.flags", names[i]);
            fact(key, "%u", fl);
            snprintf(key, sizeof key, "%s.priority", names[i]);
            fact(key, "%d", pr);
            snprintf(key, sizeof key, "%s.id_unchanged", names[i]);
            fact(key, "%s", yn(sid(all[i]) == ids[i]));
        }
    }
    CUcontext cur = NULL;
    CK(D.cuCtxGetCurrent(&cur));
    fact("current_ctx_is_primary", "%s", yn(cur == conf_ctx));
    CK(D.cuCtxSynchronize());
    fact("data_sum", "%" PRIu64, sum_u32(x, 5 * 1024));
    for (int i = 0; i < 3; i++)
        CK(D.cuStreamDestroy_v2(all[i]));

    /* streams created after others were destroyed (handles may be reused) keep their own semantics */
    for (int round = 0; round < 4; round++) {
        CUstream n1 = mkstream(round % 2 ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING);
        k_spin(NULL, conf_spin_us / 2);
        k_fill(n1, x, 7, 1024);
        CK(D.cuStreamSynchronize(n1));
        char key[64];
        snprintf(key, sizeof key, "recreated_%s.legacy_stream", round % 2 ? "blocking" : "nonblocking");
        fact(key, "%s", st(D.cuStreamQuery(NULL)));
        CK(D.cuCtxSynchronize());
        CK(D.cuStreamDestroy_v2(n1));
    }
    conf_done();
    return 0;
}
