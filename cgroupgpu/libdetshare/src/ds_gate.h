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
struct ds_gate {                  /* per logical stream */
    pthread_mutex_t lock;
    CUevent ev[DS_GATE_MAX];      /* completion marks of launches in flight (ring) */
    uint64_t sub_ns[DS_GATE_MAX]; /* when each was submitted */
    unsigned head, n;
    int head_busy;                /* the oldest mark was seen unfinished */
    uint64_t est_ns;              /* learnt kernel duration on this stream */
    uint64_t last_done_ns;
};
void ds_gate_init(struct ds_gate *g);
unsigned ds_gate_cap(const struct ds_gate *g, uint32_t depth, uint64_t budget_ns);
void ds_gate_wait(struct ds_gate *g, uint32_t depth); /* before a launch: waits while the stream is at its cap */
void ds_gate_record(struct ds_gate *g, CUstream phys); /* after a launch: marks its completion */
/* The gate's depth for this tenant: the only load the ungated launch path pays. */
static inline uint32_t ds_gate_depth(void) {
    return __atomic_load_n(&ds_process.tenant->ctr->gate_depth, __ATOMIC_RELAXED);
}
void ds_latency_start(void);
void ds_latency_sync_done(void);

#endif /* DETSHARE_LIBDETSHARE_DS_GATE_H */
