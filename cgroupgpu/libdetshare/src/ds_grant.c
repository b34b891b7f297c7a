/*
 * ds_grant.c — this tenant's grant, as launches see it. The scheduler writes the grant into the tenant's table
 * entry under a seqlock and bumps grant_epoch; a launch that sees a new epoch reads the grant (ds_grant_reread) and
 * publishes what launches bind to in ds_grant_view: the green context of the granted groups (ds_pool.c), the mode,
 * whether launches must wait. Reading the grant word costs the launch fast path one acquire load (ds_grant.h).
 *
 * Temporal mode (no MPS): a launch waits for the tenant's GPU token on the token futex, bounded; when the
 * scheduler is gone or the bound passes it logs once and runs unthrottled (fail-static, never hangs). A
 * latency-critical tenant waits only behind another latency-critical holder (see runs_without_token). A spatial
 * grant without groups, or no grant yet while a scheduler is alive, makes launches wait for SMs, bounded too. A
 * process whose slot now belongs to another tenant (an orphan) holds its GPU work until it exits.
 */
#include "ds_grant.h"

#include "ds_demand.h"
#include "ds_guard.h"
#include "ds_pool.h"
#include "ds_process.h"

struct ds_grant_view ds_grant_view = {.epoch_seen = UINT32_MAX};

static bool scheduler_alive(void);

/* A new grant epoch: read the grant (seqlock) and choose what launches bind to. */
/* The green-context thread made a context a grant waits for (ds_pool_select_locked): the next launch reads the
 * grant again. */
static void recheck(void) { atomic_store_explicit(&ds_grant_view.epoch_seen, UINT32_MAX, memory_order_release); }

/* The green context of the lowest n groups of a spatial grant (memory-bound kernels, ds_narrow.c), NULL when n is
 * 0 or the grant has no more than n groups. Pool lock held. */
static struct ds_gctx *narrow_select_locked(uint64_t groups, uint32_t n) {
    unsigned ng = ds_pool_groups();
    uint64_t all = ng >= 64 ? ~0ull : (1ull << ng) - 1;
    groups &= all;
    if (!n || !ng || (unsigned)__builtin_popcountll(groups) <= n)
        return NULL;
    uint64_t sub = 0, rest = groups;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t low = rest & -rest;
        sub |= low;
        rest &= ~low;
    }
    struct ds_gctx *c = ds_pool_select_part_locked(sub, recheck);
    return c && !(c->mask & ~groups) ? c : NULL; /* never outside the grant */
}

void ds_grant_narrow_changed(void) {
    recheck();
    ds_grant_reread(ds_grant_epoch(ds_process.tenant->ctr));
}

void ds_grant_reread(uint32_t ep) {
    ds_pool_lock();
    if (atomic_load(&ds_grant_view.epoch_seen) == ep) {
        ds_pool_unlock();
        return;
    }
    struct ds_grant gr;
    if (ds_grant_read(ds_process.tenant->ctr, &gr) != 0) {
        /* a leader died mid-write: keep the previous grant (fail-static) and look again at the next launch */
        ds_pool_unlock();
        return;
    }
    /* Is the slot still ours? Registration bumps the generation before it resets the grant, so a grant read
     * before this load of the generation that belongs to a newcomer shows the newcomer's generation here. */
    uint32_t gen = __atomic_load_n(&ds_process.tenant->ctr->gen, __ATOMIC_ACQUIRE);
    uint32_t st = __atomic_load_n(&ds_process.tenant->ctr->state, __ATOMIC_ACQUIRE);
    if (gen != ds_process.tenant->slot_gen || st == DS_SLOT_FREE || st == DS_SLOT_DRAINING) {
        /* An orphan (its tenant deregistered or reaped while it ran): the grant in this slot is not its own, and
         * running on any SMs would take them from tenants that own them. Its GPU work is held (launches, copies
         * and memsets wait) until it exits; see docs/threat-model.md "Orphans". */
        if (!atomic_exchange(&ds_grant_view.orphan, 1))
            DS_LOG(DS_LOG_ERROR, "tenant %s left slot %d (generation %u, state %u; ours was generation %u): this "
                                 "process belongs to no tenant any more, its GPU work is held until it exits",
                   ds_process.tenant->id, ds_process.tenant->slot, gen, st, ds_process.tenant->slot_gen);
        atomic_store(&ds_grant_view.empty, 1);
        atomic_store(&ds_grant_view.mode, DS_MODE_NONE);
        atomic_store_explicit(&ds_grant_view.epoch_seen, gr.epoch, memory_order_release);
        ds_pool_unlock();
        return;
    }
    ds_guard_snapshot();
    struct ds_gctx *cur = gr.mode == DS_MODE_SPATIAL ? ds_pool_select_locked(gr.groups, recheck) : NULL;
    uint32_t nn = __atomic_load_n(&ds_process.tenant->ctr->narrow_groups, __ATOMIC_RELAXED);
    /* none on every group (nobody to make room for); a narrow part that is the grant's context itself is never
     * switched to (ds_streams.c compares them) */
    struct ds_gctx *narrow = cur ? narrow_select_locked(gr.groups, nn) : NULL;
    unsigned ngroups = ds_pool_groups();
    uint64_t all = ngroups >= 64 ? ~0ull : (1ull << ngroups) - 1;
    bool spatial = gr.mode == DS_MODE_SPATIAL && ngroups;
    atomic_store_explicit(&ds_grant_view.narrow, narrow, memory_order_release);
    atomic_store(&ds_grant_view.narrow_n, nn);
    /* A tenant the scheduler has not answered yet must not run on the whole GPU beside latency-critical
     * neighbours: while a live scheduler owes it its first grant, launches wait for it (bounded, see
     * ds_grant_wait_sms). Without a live scheduler there is nothing to wait for (fail-open). */
    bool ungranted = gr.mode == DS_MODE_NONE && scheduler_alive();
    atomic_store(&ds_grant_view.ungranted, ungranted);
    atomic_store(&ds_grant_view.empty, (spatial && !(gr.groups & all)) || ungranted);
    atomic_store(&ds_grant_view.mode, gr.mode);
    atomic_store_explicit(&ds_grant_view.cur, cur, memory_order_release);
    atomic_store_explicit(&ds_grant_view.epoch_seen, gr.epoch, memory_order_release);
    ds_pool_unlock();
    DS_LOG(DS_LOG_DEBUG, "grant epoch %u: mode %u groups %#llx", gr.epoch, gr.mode, (unsigned long long)gr.groups);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Temporal mode and empty grants: bounded waits, fail-static
 * ------------------------------------------------------------------------------------------------------------- */
static bool scheduler_alive(void) {
    uint64_t hb = __atomic_load_n(&ds_process.tenant->table->sched_heartbeat_ns, __ATOMIC_RELAXED);
    uint64_t now = ds_now_ns();
    return hb && now - hb < ds_process.settings.sched_stale_ms * 1000000ull;
}

static void account_wait(uint64_t ns) {
    struct ds_client_page *pg = ds_process.tenant->page;
    __atomic_fetch_add(&pg->queue_delay_ns, ns, __ATOMIC_RELAXED);
    uint64_t m = __atomic_load_n(&pg->queue_delay_max_ns, __ATOMIC_RELAXED);
    while (ns > m && !__atomic_compare_exchange_n(&pg->queue_delay_max_ns, &m, ns, 0, __ATOMIC_RELAXED,
                                                  __ATOMIC_RELAXED)) {
    }
}

static atomic_int g_unthrottled_warned;

/* A latency-critical tenant does not wait for the token while a lower tier (or nobody) holds it. Its launch has
 * already rung the doorbell, so the scheduler is taking the token from the holder, whose launches then wait; what
 * the holder has queued meanwhile is bounded by its dispatch gate, and the driver's time-slicing gives this process
 * the GPU once that has drained. Waiting for the hand-over instead would add the scheduler's round trip to the start
 * of every request. Behind another latency-critical holder it waits its turn, as every tier does.
 * "Lower tier" is the scheduler's word, not the tier claimed at registration: beside a latency-critical tenant it
 * gates every tenant it schedules below one (tier ceilings applied, policy.TemporalGates) and never the
 * latency-critical ones. So a tenant that claimed latency-critical but was demoted by tenants.max_tier is gated
 * itself, or finds no gated holder, and waits like any other. */
static bool runs_without_token(const struct ds_gpu *g) {
    const struct ds_container *self = ds_process.tenant->ctr;
    if (__atomic_load_n(&self->tier, __ATOMIC_RELAXED) != DS_TIER_LATENCY_CRITICAL ||
        __atomic_load_n(&self->gate_depth, __ATOMIC_RELAXED) != 0)
        return false;
    uint32_t holder = __atomic_load_n(&g->token_holder, __ATOMIC_ACQUIRE);
    if (holder == 0)
        return true; /* nobody is busy: nobody to overtake */
    const struct ds_container *c = ds_table_container(ds_process.tenant->table, holder - 1);
    return c != NULL && __atomic_load_n(&c->gate_depth, __ATOMIC_RELAXED) != 0;
}

void ds_grant_wait_token(void) {
    const struct ds_gpu *g = ds_process.tenant->gpu_entry;
    uint64_t t0 = 0, bound = ds_process.settings.token_wait_ms * 1000000ull;
    bool waiting = false;
    for (;;) {
        uint32_t seq = __atomic_load_n(&g->token_seq, __ATOMIC_ACQUIRE);
        if (ds_grant_holds_token() || atomic_load(&ds_grant_view.mode) != DS_MODE_TEMPORAL || runs_without_token(g))
            break;
        uint64_t now = ds_now_ns();
        if (!t0)
            t0 = now;
        if (now - t0 >= bound || !scheduler_alive()) {
            if (!atomic_exchange(&g_unthrottled_warned, 1))
                DS_LOG(DS_LOG_WARN, "no GPU token after %llu ms (scheduler %s): running unthrottled (fail-static)",
                       (unsigned long long)((now - t0) / 1000000), scheduler_alive() ? "slow" : "gone");
            break;
        }
        if (!waiting) {
            waiting = true;
            ds_demand_wait_begin();
        }
        ds_futex_wait(&g->token_seq, seq, 50000000ull);
        uint32_t ep = ds_grant_epoch(ds_process.tenant->ctr);
        if (ep != atomic_load_explicit(&ds_grant_view.epoch_seen, memory_order_acquire))
            ds_grant_reread(ep);
    }
    if (waiting)
        ds_demand_wait_end();
    if (t0)
        account_wait(ds_now_ns() - t0);
}

/* Spatial grant with no groups: wait (bounded) for SMs, then run on the last groups held (fail-static). */
void ds_grant_wait_sms(void) {
    const struct ds_container *c = ds_process.tenant->ctr;
    uint64_t t0 = ds_now_ns(), bound = atomic_load(&ds_grant_view.ungranted)
                                           ? ds_process.settings.first_grant_wait_ms * 1000000ull
                                           : ds_process.settings.grant_wait_ms * 1000000ull;
    bool waiting = false;
    for (;;) {
        uint32_t ep = ds_grant_epoch(c);
        if (ep != atomic_load_explicit(&ds_grant_view.epoch_seen, memory_order_acquire))
            ds_grant_reread(ep);
        if (!atomic_load(&ds_grant_view.empty))
            break;
        if (atomic_load(&ds_grant_view.orphan)) { /* never released: the slot will not become this tenant's again */
            if (waiting) { /* and it has no demand to keep: it is no tenant's any more */
                waiting = false;
                ds_demand_wait_end();
            }
            ds_futex_wait(&c->grant_epoch, ep, 1000000000ull);
            continue;
        }
        uint64_t now = ds_now_ns();
        if (now - t0 >= bound || !scheduler_alive()) {
            if (!atomic_exchange(&g_unthrottled_warned, 1))
                DS_LOG(DS_LOG_WARN, "no SMs granted for %llu ms: running on the last grant (fail-static)",
                       (unsigned long long)((now - t0) / 1000000));
            break;
        }
        if (!waiting) {
            waiting = true;
            ds_demand_wait_begin();
        }
        ds_futex_wait(&c->grant_epoch, ep, 50000000ull);
    }
    if (waiting)
        ds_demand_wait_end();
    account_wait(ds_now_ns() - t0);
}
