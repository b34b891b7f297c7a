/*
 * ds_streams.h — logical streams (ds_streams.c): where the work the application issues on a stream goes under the
 * current grant, and the event edges that keep CUDA's stream semantics when kernels run on a physical stream of a
 * green context.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_STREAMS_H
#define DETSHARE_LIBDETSHARE_DS_STREAMS_H

#define CUDA_ABI_PROTOTYPES
#include "cgroupgpu/cuda/cuda_abi.h"

#include "ds_process.h"

#include <stdbool.h>

/* The launch path (ds_launch.c, and copies and memsets in ds_stream_ops.c). Called with a tenant, on the hook's
 * thread, after the work was counted (ds_demand_work). ds_launch_bind looks the application's stream up once and
 * says where this launch goes; the answer is the launch's own (returned by value, kept by the hook, no thread-local
 * state) and is handed to ds_launch_done(result), which completes it, or, when the physical stream refused the work,
 * to ds_launch_retry, then, after the launch on the application's stream, to ds_launch_unconfinable (a kernel) or
 * ds_work_ran_on_app_stream (a copy or memset). No lock, no syscall when the stream is bound to the current grant
 * and nothing new happened. */
struct lstream; /* a logical stream (ds_streams.c) */
struct ds_launch {
    CUstream stream;    /* where to launch: the bound physical stream (on_phys), else the application's stream */
    struct lstream *ls; /* the application stream's logical stream, looked up once; NULL: none */
    const void *key;    /* what is launched (the CUfunction or CUgraphExec), for the dispatch gate */
    unsigned width;     /* gated: SM groups of the grant it was launched under */
    bool on_phys;       /* sent to a physical stream: ds_launch_done marks ls as having work there */
    bool gated;         /* passed the dispatch gate: ds_launch_done marks its completion */
};
/* key: the CUfunction or CUgraphExec; smem: the kernel's dynamic shared memory, or -1 for work that always runs on
 * the whole grant (graphs, cooperative launches, launches with attributes): the rest may run on its narrow part */
struct ds_launch ds_launch_bind(CUstream s, int per_thread, const void *key, long smem);
struct ds_launch ds_work_bind(CUstream s, int per_thread); /* ds_launch_bind for copies and memsets: never gated */
void ds_launch_finish(const struct ds_launch *l, CUresult r); /* ds_launch_done's work when there is some */
static inline void ds_launch_done(const struct ds_launch *l, CUresult r) {
    if (DS_UNLIKELY(l->on_phys | l->gated)) /* else nothing to complete: no call on the unconfined fast path */
        ds_launch_finish(l, r);
}
bool ds_launch_retry(struct ds_launch *l, CUresult r);   /* true: run it on the application's stream */
void ds_launch_unconfinable(const struct ds_launch *l);   /* after a kernel ran there: the stream stays unconfined */
void ds_work_ran_on_app_stream(const struct ds_launch *l); /* after a copy or memset ran there */
/* Where a graph launched now must run (the green context of the launch's binding, or the primary context under a
 * full grant); false: leave it where it is. */
bool ds_launch_graph_target(const struct ds_launch *l, CUcontext *ctx, unsigned *idx);

/* Stream operations around the driver call (ds_stream_ops.c wraps every DS_STREAM_HOOKS entry point with these). */
struct ds_sop {
    void *ls;  /* the logical stream of the operation's stream, if any */
    int lkind; /* its legacy-stream kind */
};
void ds_stream_before(struct ds_sop *op, int kind, CUstream s, int per_thread);
void ds_stream_after(struct ds_sop *op, int kind, CUresult r);
void ds_join_all(void);
void ds_streams_capture_in_place(CUstream s, int per_thread, bool on); /* cuStreamBeginCaptureToGraph .. End */
void ds_streams_before_capture(CUstream s, int per_thread); /* learns s while it is not capturing */
void ds_streams_capture_ended(void); /* edges made during a capture were captured: the next kernels take real ones */

bool ds_streams_drained(void); /* every physical stream has finished (demand monitor) */
void ds_streams_after_context_sync(void); /* a context-wide synchronisation returned: wait for physical streams */
void ds_streams_force_strict(const char *why); /* an edge pair around every kernel from now on */

void ds_streams_fork_lock(void);   /* fork handler (ds_init.c, "Lock order") */
void ds_streams_fork_unlock(void); /* in the parent */
void ds_streams_child(void);       /* in the child */

#endif /* DETSHARE_LIBDETSHARE_DS_STREAMS_H */
