/*
 * ds_pool.h — the green-context pool (ds_pool.c): the split of the GPU's SMs into groups, learnt once, and one
 * green context per set of groups a grant named, cached for the life of the process.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_POOL_H
#define DETSHARE_LIBDETSHARE_DS_POOL_H

#define CUDA_ABI_PROTOTYPES
#include "cgroupgpu/cuda/cuda_abi.h"

#include <stdint.h>

#define DS_MAX_GCTX 64u          /* green contexts per process */
#define DS_CTX_PRIMARY 64        /* graph-copy index of the primary context (every SM); green contexts are 0..63 */

struct ds_gctx {                 /* written once, before it is counted in the pool; never freed */
    uint64_t mask;               /* the groups it spans */
    CUgreenCtx g;
    CUcontext cu;                /* cuCtxFromGreenCtx: what graph kernel nodes name as their context */
    unsigned idx;                /* its index in the pool, 0..DS_MAX_GCTX-1 */
    CUstream priv;               /* the library's own stream in it (graph copies), under the pool lock */
};

/* The pool lock: the grant reader (ds_grant.c) holds it while it chooses a grant's context and publishes it, so
 * that the green-context thread's "look at the grant again" (the made callback below, after it added a context)
 * cannot fall between the choice and its publication. */
void ds_pool_lock(void);
void ds_pool_unlock(void);

/* The context launches bind to for a spatial grant of groups (pool lock held): NULL for every group, or when the
 * split cannot be learnt or no context made (kernels then run unconfined); for a grant without groups the last
 * non-empty one (launches wait for SMs meanwhile). Learns the split at the first call. When the choice is a part of
 * the grant until the green-context thread has made the grant's own context, that thread calls made() once it has
 * (the grant reader's "read the grant again"; the pool calls back, it knows nothing of grants). */
struct ds_gctx *ds_pool_select_locked(uint64_t groups, void (*made)(void));

/* ds_pool_select_locked for a part of the grant that launches bind to besides it (ds_grant.c's narrow part): the
 * same choice, but it leaves the context an empty grant waits on alone. NULL for no groups. */
struct ds_gctx *ds_pool_select_part_locked(uint64_t groups, void (*made)(void));

/* The number of groups of the split, 0 until it is learnt (acquire: the split is readable once non-zero). */
unsigned ds_pool_groups(void);
/* The context current when the split was learnt (every SM), NULL before. */
CUcontext ds_pool_primary(void);
/* The index of the green context a graph kernel node names (DS_CTX_PRIMARY: the primary context, -1: another). */
int ds_pool_ctx_index(CUcontext cu);
/* The library's own stream in green context idx (re-making graphs by replay), NULL if none can be made. */
CUstream ds_pool_private_stream(unsigned idx);

void ds_pool_fork_lock(void);   /* fork handler (ds_init.c, "Lock order"): the pool lock, then the maker's */
void ds_pool_fork_unlock(void); /* in the parent */
void ds_pool_child(void);       /* in the child: released; the green-context thread is not there */

#endif /* DETSHARE_LIBDETSHARE_DS_POOL_H */
