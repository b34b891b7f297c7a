/*
 * ds_streams.h — logical streams (ds_streams.c): where the work the application issues on a stream goes under the
 * current grant, and the event edges that keep CUDA's stream semantics when kernels run on a physical stream of a
 * green context.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_STREAMS_H
#define DETSHARE_LIBDETSHARE_DS_STREAMS_H

#define CUDA_ABI_PROTOTYPES
#include "cgroupgpu/cuda/cuda_abi.h"

#include <stdbool.h>

/* The launch path (ds_launch.c, and copies and memsets in ds_stream_ops.c). Called with a tenant, on the hook's
 * thread: ds_launch_stream returns the stream to launch on; ds_launch_done(result) completes the launch (or
 * ds_launch_retry + the launch on the application stream + ds_launch_unconfinable when the physical stream
 * refused it). No lock, no syscall when the stream is bound to the current grant and nothing new happened. */
CUstream ds_launch_stream(CUstream s, int per_thread, const void *key); /* key: the CUfunction or CUgraphExec */
CUstream ds_work_stream(CUstream s, int per_thread); /* ds_launch_stream for copies and memsets: no launch counted */
void ds_launch_done(CUresult r);
bool ds_launch_retry(CUresult r);
void ds_launch_unconfinable(CUstream s, int per_thread);
void ds_work_ran_on_app_stream(CUstream s, int per_thread);
/* Where a graph launched now must run (the green context of the launch's binding, or the primary context under a
 * full grant); false: leave it where it is. Between ds_launch_stream and ds_launch_done. */
bool ds_launch_graph_target(CUcontext *ctx, unsigned *idx);

/* Stream operations around the driver call (ds_stream_ops.c wraps every DS_STREAM_HOOKS entry point with these). */
struct ds_sop {
    void *ls;  /* the logical stream of the operation's stream, if any */
    int lkind; /* its legacy-stream kind */
};
void ds_stream_before(struct ds_sop *op, int kind, CUstream s, int per_thread);
void ds_stream_after(struct ds_sop *op, int kind, CUresult r);
void ds_join_all(void);

bool ds_streams_drained(void); /* every physical stream has finished (demand monitor) */
void ds_streams_after_context_sync(void); /* a context-wide synchronisation returned: wait for physical streams */
void ds_streams_force_strict(const char *why); /* an edge pair around every kernel from now on */

void ds_streams_fork_lock(void);   /* fork handler (ds_init.c, "Lock order") */
void ds_streams_fork_unlock(void); /* in the parent */
void ds_streams_child(void);       /* in the child */

#endif /* DETSHARE_LIBDETSHARE_DS_STREAMS_H */
