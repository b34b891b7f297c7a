/*
 * ds_gate.h — the dispatch gate and observed request latency (ds_gate.c).
 */
#ifndef DETSHARE_LIBDETSHARE_DS_GATE_H
#define DETSHARE_LIBDETSHARE_DS_GATE_H

#define CUDA_ABI_PROTOTYPES
#include "cgroupgpu/cuda/cuda_abi.h"

#include "ds_process.h"

#include <pthread.h>
#include <stdint.h>

#define DS_GATE_MAX 64u
#define DS_GATE_KEYS 64u
struct ds_gate_cost {             /* what one kernel (or graph) costs, learnt from completions */
    const void *key;              /* its CUfunction or CUgraphExec */
    uint64_t work;                /* nanoseconds x SM groups it ran on (exponential average) */
};
struct ds_gate {                  /* per logical stream */
    pthread_mutex_t lock;
    CUevent ev[DS_GATE_MAX];      /* completion marks of launches in flight (ring) */
    uint64_t sub_ns[DS_GATE_MAX]; /* when each was submitted */
    uint64_t est_in[DS_GATE_MAX]; /* its predicted duration when it was admitted (0: unknown) */
    const void *key_in[DS_GATE_MAX];
    unsigned width_in[DS_GATE_MAX]; /* SM groups of the grant it was launched on */
    uint64_t est_sum;             /* sum of est_in over the launches in flight */
    CUstream where;               /* the stream the launches in flight went to */
    unsigned head, n;
    int head_busy;                /* the oldest mark was seen unfinished */
    uint64_t work;                /* learnt work of any kernel on this stream (fallback for an unknown key) */
    uint64_t last_done_ns;
    struct ds_gate_cost cost[DS_GATE_KEYS]; /* direct-mapped by key; a collision replaces */
};
void ds_gate_init(struct ds_gate *g);
/* Before a launch of key to stream where, on a grant of width groups: waits while the stream is at its cap, and
 * until every launch in flight finished if they went to another stream (another grant). */
void ds_gate_wait(struct ds_gate *g, uint32_t depth, CUstream where, const void *key, unsigned width);
/* Waits until the stream admits one more kernel wherever it goes (ds_gate_wait without its rule on grant changes):
 * taken before the grant is read, so that what the scheduler decided during the wait holds the launch. */
void ds_gate_admit(struct ds_gate *g, uint32_t depth, const void *key, unsigned width);
/* After that launch: marks its completion. */
void ds_gate_record(struct ds_gate *g, CUstream where, const void *key, unsigned width);
/* The gate's depth for this tenant: the only load the ungated launch path pays. */
static inline uint32_t ds_gate_depth(void) {
    return __atomic_load_n(&ds_process.tenant->ctr->gate_depth, __ATOMIC_RELAXED);
}
void ds_latency_start(void);
void ds_latency_sync_done(void);

#endif /* DETSHARE_LIBDETSHARE_DS_GATE_H */
