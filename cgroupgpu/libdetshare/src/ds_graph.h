/*
 * ds_graph.h — CUDA graphs under GPU coroutines (ds_graph.c): executables are tracked and launched as a copy made
 * for the grant the launch is bound to.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_GRAPH_H
#define DETSHARE_LIBDETSHARE_DS_GRAPH_H

#define CUDA_ABI_PROTOTYPES
#include "cgroupgpu/cuda/cuda_abi.h"

void ds_graph_instantiated(CUgraphExec e, CUgraph g, unsigned long long flags);
void ds_graph_exec_destroyed(CUgraphExec e);
void ds_graph_exec_changed(CUgraphExec e);
void ds_graph_exec_updated(CUgraphExec e, CUgraph g);
/* The executable to launch for e under the target context (green context idx, or DS_CTX_PRIMARY). */
CUgraphExec ds_graph_for(CUgraphExec e, CUcontext target, unsigned idx);
void ds_graph_fork_lock(void); /* fork handler (ds_init.c, "Lock order") */
void ds_graph_fork_unlock(void);

#endif /* DETSHARE_LIBDETSHARE_DS_GRAPH_H */
