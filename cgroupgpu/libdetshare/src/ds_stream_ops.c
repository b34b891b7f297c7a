/*
 * ds_stream_ops.c — the driver entry points that take a stream (or order work on the legacy stream implicitly), other
 * than kernel launches: one generic wrapper each, generated from DS_STREAM_HOOKS (ds_driver.h).
 *
 * Why generic: there are about a hundred and fifty of these (copies, memsets, host functions, events, memory
 * operations, capture queries, synchronous copies and their _ptsz/_ptds twins, graph-executable setters), and what
 * the library does around each depends only on the kind of operation and which argument is the stream. Every one of
 * them takes integers, pointers and small structs only, so the wrapper receives twelve integer arguments (registers,
 * then the caller's stack slots, always mapped) and hands exactly those to the driver: extra ones are ignored by the
 * callee under the SysV x86-64 and AAPCS64 calling conventions. Only the stream argument is read (and, for
 * graph-executable setters, the executable); only the stream argument of copies and memsets is changed, to send them
 * where the stream's kernels go.
 *
 * The exported CUDA name is an assembler alias of the wrapper, so this file needs no C prototype per entry point.
 */
#include "ds_demand.h"
#include "ds_driver.h"
#include "ds_gate.h"
#include "ds_graph.h"
#include "ds_process.h"
#include "ds_streams.h"

#include <string.h>

typedef CUresult (*ds_generic_fn)(DS_GENERIC_ARGS);

#if defined(__x86_64__)
#define DS_FUNC_TYPE "@function"
#elif defined(__aarch64__)
#define DS_FUNC_TYPE "%function"
#else
#error "libdetshare: generic stream wrappers written for x86_64 and aarch64 only"
#endif

static CUresult call(ds_generic_fn real, const uintptr_t *a) {
    return real(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11]);
}

/* A copy or memset goes where the stream's kernels go (ds_work_bind), with the same arguments but the stream. If
 * the physical stream refuses it, it runs on the application's stream after what the physical stream holds. */
static CUresult redirected(ds_generic_fn real, int per_thread, int stream_arg, const uintptr_t *a) {
    uintptr_t b[12];
    memcpy(b, a, sizeof b);
    ds_demand_work(false);
    struct ds_launch l = ds_work_bind((CUstream)a[stream_arg], per_thread);
    b[stream_arg] = (uintptr_t)l.stream;
    CUresult r = call(real, b);
    if (DS_UNLIKELY(r != CUDA_SUCCESS) && b[stream_arg] != a[stream_arg] && ds_launch_retry(&l, r)) {
        r = call(real, a);
        if (r == CUDA_SUCCESS)
            ds_work_ran_on_app_stream(&l);
        return r;
    }
    ds_launch_done(&l, r);
    return r;
}

/* Returns the driver's result; the library's edges never change it. */
static CUresult around(void *const *realp, const char *name, int kind, int per_thread, int stream_arg,
                       const uintptr_t *a) {
    ds_generic_fn real = ds_driver_ready_or_init() ? (ds_generic_fn)*realp : (ds_generic_fn)ds_early_sym(name);
    if (DS_UNLIKELY(!real))
        return CUDA_ERROR_NOT_FOUND; /* the driver does not have it: neither would the application */
    if (!ds_process.tenant || ds_depth)
        return call(real, a);
    ds_depth++;
    if (kind == DS_OP_SMOP) {
        CUresult r = redirected(real, per_thread, stream_arg, a);
        ds_depth--;
        return r;
    }
    struct ds_sop op;
    CUstream s = stream_arg >= 0 ? (CUstream)a[stream_arg] : NULL;
    ds_stream_before(&op, kind, s, per_thread);
    CUresult r = call(real, a);
    ds_stream_after(&op, kind, r);
    if (r == CUDA_SUCCESS && (kind == DS_OP_ALL || kind == DS_OP_SYNC) && strstr(name, "Synchronize")) {
        if (kind == DS_OP_ALL)
            ds_streams_after_context_sync();
        ds_latency_sync_done(); /* a request completed (ds_gate.c) */
        ds_demand_synced(kind == DS_OP_ALL);
    }
    if (r == CUDA_SUCCESS) {
        if (kind == DS_OP_EXEC)
            ds_graph_exec_changed((CUgraphExec)a[0]);
        else if (kind == DS_OP_UPDATE)
            ds_graph_exec_updated((CUgraphExec)a[0], (CUgraph)a[1]);
    }
    ds_depth--;
    return r;
}

#define DS_STREAM_WRAPPER_(name, base, ver, pt, kind, idx)                                                           \
    DS_HIDDEN CUresult ds_w_##name(DS_GENERIC_ARGS) {                                                                \
        const uintptr_t a[12] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};                                  \
        return around(&ds_real.name, #name, DS_OP_##kind, pt, idx, a);                                               \
    }                                                                                                                \
    __asm__(".globl " #name "\n\t.type " #name ", " DS_FUNC_TYPE "\n\t.set " #name ", ds_w_" #name);
DS_STREAM_HOOKS(DS_STREAM_WRAPPER_)
#undef DS_STREAM_WRAPPER_
