/*
 * ds_grant.h — this tenant's grant as launches see it (ds_grant.c): read from the table's grant word at the first
 * launch after it changed, published for the launch path without a lock.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_GRANT_H
#define DETSHARE_LIBDETSHARE_DS_GRANT_H

#include "ds_process.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct ds_gctx;

/* What launches read without a lock; written by ds_grant_reread under the pool lock. */
struct ds_grant_view {
    atomic_uint epoch_seen;         /* the grant epoch these describe; UINT32_MAX: read the grant again */
    _Atomic(struct ds_gctx *) cur;  /* the green context launches bind to; NULL: the application's streams */
    atomic_uint mode;               /* grant mode of the current grant */
    atomic_int empty;               /* spatial grant without any group, or none yet: launches wait for SMs */
    atomic_int ungranted;           /* no grant published yet while a scheduler is alive */
    atomic_int orphan;              /* the slot is no longer this process's tenant's: work is held */
    _Atomic(struct ds_gctx *) narrow; /* where memory-bound kernels run (ds_narrow.c); NULL: with the rest */
    atomic_uint narrow_n;           /* the narrow_groups it was chosen for */
};
extern struct ds_grant_view ds_grant_view;

void ds_grant_reread(uint32_t ep); /* a new grant epoch: read the grant (seqlock) and choose what launches bind to */
void ds_grant_wait_token(void);    /* temporal mode: wait (bounded) for this tenant's GPU token */
void ds_grant_wait_sms(void);      /* no SMs granted: wait (bounded) for a grant with some */
void ds_grant_narrow_changed(void); /* the scheduler changed narrow_groups: read the grant again */

static inline bool ds_grant_holds_token(void) {
    const struct ds_gpu *g = ds_process.tenant->gpu_entry;
    return __atomic_load_n(&g->token_holder, __ATOMIC_ACQUIRE) == (uint32_t)ds_process.tenant->slot + 1 &&
           __atomic_load_n(&g->token_holder_gen, __ATOMIC_RELAXED) == ds_process.tenant->slot_gen;
}

/* Before work is issued (the launch fast path: one acquire load of the grant epoch and three relaxed loads when
 * nothing changed): reads a new grant, waits for the token or for SMs when the grant says so, and returns the green
 * context work binds to (NULL: the application's streams). */
static inline struct ds_gctx *ds_grant_enter(void) {
    uint32_t ep = ds_grant_epoch(ds_process.tenant->ctr);
    if (DS_UNLIKELY(ep != atomic_load_explicit(&ds_grant_view.epoch_seen, memory_order_acquire)))
        ds_grant_reread(ep);
    unsigned mode = atomic_load_explicit(&ds_grant_view.mode, memory_order_relaxed);
    if (DS_UNLIKELY(mode == DS_MODE_TEMPORAL) && !ds_grant_holds_token())
        ds_grant_wait_token();
    if (DS_UNLIKELY(atomic_load_explicit(&ds_grant_view.empty, memory_order_relaxed)))
        ds_grant_wait_sms();
    return atomic_load_explicit(&ds_grant_view.cur, memory_order_acquire);
}

/* The green context of the narrow part of a partial grant, where memory-bound kernels run (ds_narrow.c), or NULL
 * when the scheduler set none: two relaxed loads when nothing changed. */
static inline struct ds_gctx *ds_grant_narrow(void) {
    uint32_t n = __atomic_load_n(&ds_process.tenant->ctr->narrow_groups, __ATOMIC_RELAXED);
    if (DS_UNLIKELY(n != atomic_load_explicit(&ds_grant_view.narrow_n, memory_order_relaxed)))
        ds_grant_narrow_changed();
    else if (DS_LIKELY(n == 0))
        return NULL;
    return atomic_load_explicit(&ds_grant_view.narrow, memory_order_acquire);
}

#endif /* DETSHARE_LIBDETSHARE_DS_GRANT_H */
