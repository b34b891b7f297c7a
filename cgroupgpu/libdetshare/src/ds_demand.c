/*
 * ds_demand.c — whether this process has GPU work: the tenant's demand count in its client page, which the
 * scheduler reads (and the doorbell it rings on the tenant's idle->busy and busy->idle transitions).
 */
#include "ds_demand.h"

#include "ds_driver.h"
#include "ds_guard.h"
#include "ds_pool.h"
#include "ds_process.h"

#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------------------------------------------------------
 * Demand: a process is busy from its first launch after idle (the doorbell rings only on the tenant's idle->busy
 * and busy->idle transitions, never per launch) until a monitor thread sees no launch for DETSHARE_IDLE_MS (default
 * 20 ms, 2 ms for a latency-critical tenant) and the work of its redirected streams complete. The monitor is
 * started by the first idle->busy transition (a slow path) and polls every few milliseconds; it never touches
 * application streams.
 * ------------------------------------------------------------------------------------------------------------- */
static pthread_once_t g_mon_once = PTHREAD_ONCE_INIT;
static atomic_int g_mon_running;
static _Atomic uint64_t g_busy_since;
/* Threads whose launch waits for the GPU token or for SMs (ds_grant.c). Such a process launches nothing while it
 * waits, yet has work: marked idle, it would drop out of the scheduler's rotation of busy tenants and never be given
 * the token it waits for (seen on the H100: a trainer waited out the 10 s bound beside a latency-critical tenant). */
static atomic_int g_waiting;
/* Whether every redirected stream's work has finished (ds_streams_drained), set by the constructor before a tenant
 * is published (ds_demand_init): written once, before any thread that reads it exists. */
static bool (*g_drained)(void);

void ds_demand_init(bool (*drained)(void)) { g_drained = drained; }

/* busy -> idle for this process (its work has drained): demand down, doorbell when the tenant went idle. */
static void go_idle(struct ds_proc *self, uint64_t now) {
    __atomic_store_n(&self->queued, 0, __ATOMIC_RELAXED); /* everything submitted has drained */
    if (__atomic_exchange_n(&self->busy, 0, __ATOMIC_ACQ_REL) == 0)
        return;
    uint64_t since = atomic_load(&g_busy_since);
    if (since && now > since)
        __atomic_fetch_add(&self->busy_ns, now - since, __ATOMIC_RELAXED);
    struct ds_client_page *pg = ds_process.tenant->page;
    uint32_t d = __atomic_load_n(&pg->demand, __ATOMIC_RELAXED);
    while (d > 0 && !__atomic_compare_exchange_n(&pg->demand, &d, d - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
    }
    if (since && now > since)
        __atomic_fetch_add(&pg->busy_ns, now - since, __ATOMIC_RELAXED);
    __atomic_fetch_add(&pg->demand_seq, 1, __ATOMIC_RELEASE);
    if (d == 1)
        ds_guard_ring();
}

/* A synchronisation returned (ds_stream_ops.c). A latency-critical tenant whose work has all drained is idle at once:
 * its request is over, and its neighbours get their groups back now rather than DETSHARE_IDLE_MS later. */
void ds_demand_synced(bool whole_context) {
    struct ds_proc *self = atomic_load_explicit(&ds_process.self, memory_order_acquire);
    if (!self || !__atomic_load_n(&self->busy, __ATOMIC_RELAXED) ||
        __atomic_load_n(&ds_process.tenant->ctr->tier, __ATOMIC_RELAXED) != DS_TIER_LATENCY_CRITICAL ||
        atomic_load(&ds_process.capturing))
        return;
    if (!whole_context && !g_drained())
        return;
    go_idle(self, ds_now_ns());
}

static void *monitor(void *arg) {
    (void)arg;
    /* A latency-critical tenant's busy/idle follows its requests (2 ms): while it is idle its neighbours get the
     * groups back, and each request's first launch wakes the scheduler (issue 12). */
    bool lc = __atomic_load_n(&ds_process.tenant->ctr->tier, __ATOMIC_RELAXED) == DS_TIER_LATENCY_CRITICAL;
    uint64_t idle_ms = ds_process.settings.idle_ms ? ds_process.settings.idle_ms : lc ? 2 : 20;
    uint64_t idle_ns = idle_ms * 1000000ull;
    uint64_t poll_ns = idle_ns / 4 ? idle_ns / 4 : 1000000ull;
    uint64_t last = 0, last_change = ds_now_ns();
    ds_depth++; /* driver calls made here are the library's own */
    (void)ds_relaxed_begin(); /* and never "unsafe" for an application's global-mode capture */
    bool ctx_set = false;
    for (;;) {
        struct timespec ts = {(time_t)(poll_ns / 1000000000ull), (long)(poll_ns % 1000000000ull)};
        nanosleep(&ts, NULL);
        struct ds_proc *self = atomic_load_explicit(&ds_process.self, memory_order_acquire);
        if (!self)
            continue;
        uint64_t n = __atomic_load_n(&self->launches, __ATOMIC_RELAXED), now = ds_now_ns();
        if (n != last) {
            last = n;
            last_change = now;
            continue;
        }
        if (!ctx_set && ds_pool_primary() && ds_real.cuCtxSetCurrent) {
            /* the application's legacy stream is the current context's: query it in the application's context */
            ctx_set = ds_real.cuCtxSetCurrent(ds_pool_primary()) == CUDA_SUCCESS;
        }
        if (atomic_load(&g_waiting)) {
            last_change = now; /* idle counts from the end of the wait */
            continue;
        }
        if (!__atomic_load_n(&self->busy, __ATOMIC_RELAXED) || now - last_change < idle_ns || !g_drained())
            continue;
        go_idle(self, now);
    }
    return NULL;
}

static void monitor_start(void) {
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 64 * 1024);
    if (pthread_create(&th, &at, monitor, NULL) == 0)
        atomic_store(&g_mon_running, 1);
    else
        DS_LOG(DS_LOG_WARN, "demand monitor thread: not started; the tenant stays marked busy");
    pthread_attr_destroy(&at);
}

void ds_demand_busy(struct ds_proc *self) {
    if (__atomic_exchange_n(&self->busy, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    atomic_store(&g_busy_since, ds_now_ns());
    struct ds_client_page *pg = ds_process.tenant->page;
    uint32_t old = __atomic_fetch_add(&pg->demand, 1, __ATOMIC_ACQ_REL);
    if (old == 0)
        __atomic_store_n(&pg->demand_since_ns, ds_now_ns(), __ATOMIC_RELAXED);
    __atomic_fetch_add(&pg->demand_seq, 1, __ATOMIC_RELEASE);
    if (old == 0)
        ds_guard_ring();
    pthread_once(&g_mon_once, monitor_start);
}

void ds_demand_wait_begin(void) {
    atomic_fetch_add(&g_waiting, 1);
    /* the monitor may have judged the process idle between this launch's ds_demand_work and the wait */
    struct ds_proc *self = atomic_load_explicit(&ds_process.self, memory_order_acquire);
    if (self && !__atomic_load_n(&self->busy, __ATOMIC_ACQUIRE))
        ds_demand_busy(self);
}

void ds_demand_wait_end(void) { atomic_fetch_sub(&g_waiting, 1); }

/* fork, in the child: no monitor thread there; its first busy transition starts one. */
void ds_demand_child(void) {
    pthread_once_t fresh = PTHREAD_ONCE_INIT;
    memcpy(&g_mon_once, &fresh, sizeof fresh);
    atomic_store(&g_mon_running, 0);
    atomic_store(&g_waiting, 0); /* only the forking thread lives on, and it was not waiting */
}
