/*
 * ds_coro.c — GPU coroutines: which physical stream a tenant's launch goes to, and the per-launch bookkeeping.
 */
#include "ds.h"

#define A64(p) ((_Atomic uint64_t *)(p))

CUstream ds_launch_stream(CUstream s, int per_thread) {
    (void)per_thread;
    struct ds_proc *self = atomic_load_explicit(&ds_self, memory_order_relaxed);
    if (DS_LIKELY(self != NULL))
        atomic_fetch_add_explicit(A64(&self->launches), 1, memory_order_relaxed);
    atomic_fetch_add_explicit(A64(&ds_t->page->launches), 1, memory_order_relaxed);
    return s;
}

void ds_launch_done(void) {}
