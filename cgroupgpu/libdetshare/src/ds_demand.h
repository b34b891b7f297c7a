/*
 * ds_demand.h — whether this process has GPU work (ds_demand.c): counted per launch without a lock, published to
 * the scheduler only on idle->busy and busy->idle transitions.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_DEMAND_H
#define DETSHARE_LIBDETSHARE_DS_DEMAND_H

#include "ds_gate.h"
#include "ds_process.h"

#include <stdbool.h>

/* Constructor (ds_init.c), before the tenant is loaded: drained() says whether the work of every stream the library
 * redirected has finished (ds_streams_drained). Demand is told, so that it does not depend on the streams above it. */
void ds_demand_init(bool (*drained)(void));
void ds_demand_busy(struct ds_proc *self);  /* idle -> busy: demand up, doorbell, monitor started */
void ds_demand_synced(bool whole_context);  /* a synchronisation returned: a drained latency-critical tenant is idle */
void ds_demand_wait_begin(void);            /* a launch waits for the token or for SMs: busy for as long as it waits */
void ds_demand_wait_end(void);
void ds_demand_child(void);                 /* fork, in the child */

/* Work is being issued (a kernel, or a copy or memset): counted in this process's entry (relaxed atomics); the
 * first kernel after idle makes the process busy. Copies alone do not: they run on copy engines, not on the SMs the
 * scheduler grants, and a latency-critical server that reads its result back after each request would otherwise
 * wake the scheduler twice per request and throttle its neighbours for a copy (seen on the H100, issue 12). */
static inline void ds_demand_work(bool kernel) {
    struct ds_proc *self = atomic_load_explicit(&ds_process.self, memory_order_relaxed);
    if (DS_LIKELY(self != NULL)) {
        if (kernel) {
            __atomic_fetch_add(&self->launches, 1, __ATOMIC_RELAXED);
            if (DS_UNLIKELY(!atomic_load_explicit(&ds_process.req_start, memory_order_relaxed)))
                ds_latency_start();
        }
        __atomic_fetch_add(&self->queued, 1, __ATOMIC_RELAXED);
        if (kernel && DS_UNLIKELY(!__atomic_load_n(&self->busy, __ATOMIC_RELAXED)))
            ds_demand_busy(self);
    }
}

#endif /* DETSHARE_LIBDETSHARE_DS_DEMAND_H */
