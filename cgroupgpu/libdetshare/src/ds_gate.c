/*
 * ds_gate.c — the dispatch gate and the latency the library observes (issue 12).
 *
 * Dispatch gate. Beside a latency-critical tenant that may take SM groups back at any moment, the scheduler gives a
 * best-effort or burstable tenant a gate (ds_container.gate_depth, gate_budget_us): each of its streams may have at
 * most min(depth, budget / learnt kernel duration) kernels in flight (at least one). Kernels already queued on a
 * green context keep running on its SMs until they finish (they are never preempted or cut), so this bound is what
 * makes a reclaim end within about the budget (or one kernel, if a single kernel is longer). The gate marks each
 * launch's completion with an event on the physical stream; a launch at the cap waits for the oldest one. The
 * duration of a kernel is learnt per stream from completions the gate saw happen (the oldest mark was seen
 * unfinished at an earlier launch or wait): time since the previous completion or since submission, whichever is
 * later, as an exponential average. Completions seen late make the estimate longer and the cap smaller: it errs
 * on the side of a faster reclaim.
 * Cost: without a gate the launch path pays one relaxed load of gate_depth. With one, locks, event records and
 * queries are taken on purpose: they are the throttle. The gate is cooperative (the tenant's own process runs it):
 * a tenant that bypasses it only slows its own reclaim; SM confinement never depends on it.
 *
 * Latency. A "request" starts at the first kernel launched after the process's last completed synchronisation and
 * ends when cuCtxSynchronize / cuStreamSynchronize returns; its duration goes into the client page's histogram
 * (log2 microsecond buckets) with counters only ever incremented, read by the scheduler (SLO sizing) and by
 * `detshare status`/`top`/metrics (attainment). Only the first launch of a request reads the clock.
 */
#include "ds_gate.h"

#include "ds_driver.h"
#include "ds_process.h"

#include <sched.h>
#include <string.h>
#include <time.h>

static atomic_int g_gate_warned;

/* ---- latency ---- */

void ds_latency_start(void) {
    uint64_t zero = 0;
    atomic_compare_exchange_strong(&ds_process.req_start, &zero, ds_now_ns());
}

static unsigned bucket_of(uint64_t ns) {
    uint64_t us = ns / 1000;
    unsigned b = 0;
    while (us > 1 && b < 31) {
        us >>= 1;
        b++;
    }
    return b;
}

void ds_latency_sync_done(void) {
    uint64_t st = atomic_exchange(&ds_process.req_start, 0);
    if (!st || !ds_process.tenant || !ds_process.tenant->page)
        return;
    uint64_t now = ds_now_ns();
    if (now <= st)
        return;
    struct ds_client_page *pg = ds_process.tenant->page;
    __atomic_fetch_add(&pg->lat_hist[bucket_of(now - st)], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&pg->lat_sum_ns, now - st, __ATOMIC_RELAXED);
    __atomic_fetch_add(&pg->lat_count, 1, __ATOMIC_RELEASE);
}

/* ---- gate ---- */
void ds_gate_init(struct ds_gate *g) {
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->lock, NULL);
}

static void pause_a_little(uint64_t waited_ns) {
    if (waited_ns < 200000) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}

unsigned ds_gate_cap(const struct ds_gate *g, uint32_t depth, uint64_t budget_ns) {
    unsigned cap = depth > DS_GATE_MAX ? DS_GATE_MAX : depth;
    if (!g->est_ns && cap > 2)
        cap = 2; /* nothing learnt yet: two kernels until the stream's durations are known */
    if (g->est_ns && budget_ns) {
        uint64_t k = budget_ns / g->est_ns;
        if (k < 1)
            k = 1;
        if (k < cap)
            cap = (unsigned)k;
    }
    return cap ? cap : 1;
}

void ds_gate_wait(struct ds_gate *g, uint32_t depth) {
    if (atomic_load(&ds_process.capturing) || !ds_real.cuEventQuery)
        return; /* an event record would become a node of the application's graph */
    uint64_t budget = (uint64_t)__atomic_load_n(&ds_process.tenant->ctr->gate_budget_us, __ATOMIC_RELAXED) * 1000;
    uint64_t t0 = 0, now = 0;
    pthread_mutex_lock(&g->lock);
    unsigned cap = ds_gate_cap(g, depth, budget);
    while (g->n > 0) {
        unsigned h = g->head;
        CUresult r = ds_real.cuEventQuery(g->ev[h]);
        now = ds_now_ns();
        if (r == CUDA_ERROR_NOT_READY) {
            g->head_busy = 1; /* seen unfinished: its completion time will be observed */
            if (g->n < cap)
                break;
            if (!t0)
                t0 = now;
            if (now - t0 > 1000000000ull) { /* fail-static: never hang a tenant on its own gate */
                if (!atomic_exchange(&g_gate_warned, 1))
                    DS_LOG(DS_LOG_WARN, "dispatch gate: a kernel has run for over 1 s; launching past the gate");
                break;
            }
            pause_a_little(now - t0);
            continue;
        }
        if (g->head_busy && r == CUDA_SUCCESS) {
            uint64_t start = g->last_done_ns > g->sub_ns[h] ? g->last_done_ns : g->sub_ns[h];
            uint64_t dur = now > start ? now - start : 0;
            g->est_ns = g->est_ns ? (g->est_ns * 7 + dur) / 8 : dur;
            cap = ds_gate_cap(g, depth, budget);
        }
        g->head_busy = 0;
        g->last_done_ns = now;
        g->head = (h + 1) % DS_GATE_MAX;
        g->n--;
    }
    pthread_mutex_unlock(&g->lock);
    if (t0 && ds_process.tenant->page) {
        __atomic_fetch_add(&ds_process.tenant->page->gate_waits, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&ds_process.tenant->page->gate_wait_ns, now - t0, __ATOMIC_RELAXED);
    }
}

void ds_gate_record(struct ds_gate *g, CUstream phys) {
    if (atomic_load(&ds_process.capturing))
        return;
    pthread_mutex_lock(&g->lock);
    if (g->n < DS_GATE_MAX) {
        unsigned i = (g->head + g->n) % DS_GATE_MAX;
        if (!g->ev[i] && ds_real.cuEventCreate(&g->ev[i], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
            g->ev[i] = NULL;
        if (g->ev[i] && DS_SOP_REAL(cuEventRecord)(g->ev[i], phys) == CUDA_SUCCESS) {
            g->sub_ns[i] = ds_now_ns();
            g->n++;
        }
    }
    pthread_mutex_unlock(&g->lock);
}
