/*
 * ds_gate.c — the dispatch gate and the latency the library observes (issue 12).
 *
 * Dispatch gate. Beside a latency-critical tenant that may take SM groups back at any moment, the scheduler gives a
 * best-effort or burstable tenant a gate (ds_container.gate_depth, gate_budget_us). Kernels already queued keep
 * running on the SMs they were launched for until they finish (they are never preempted or cut), so what a tenant
 * has queued is what a reclaim waits for; the gate bounds it:
 *   - Work, not count: each stream may have at most depth launches in flight and, beyond the first, only as many
 *     as fit the budget by their predicted durations. A duration is learnt per kernel (CUfunction, or CUgraphExec)
 *     as work = nanoseconds x SM groups of the grant it ran on, so a GEMM learnt on the whole GPU is predicted 15
 *     times longer on one group. On the H100 a bf16 trainer's GEMMs are persistent kernels (one block per SM held
 *     for the whole ~0.35 ms kernel, integration/gpu/kernelgrid.py) next to 35 us optimizer kernels: one average per
 *     stream let five GEMMs queue under a 500 us budget.
 *   - Every grant, the whole GPU included: a tenant holding every group launches on the application's own stream,
 *     and was ungated there, so a whole training step (~13 ms) could be queued when the latency-critical tenant woke.
 *   - No launch behind another grant's: a launch to another stream than the launches in flight (the grant changed)
 *     waits until they have finished. Otherwise a kernel launched wide, queued in stream order behind kernels that
 *     run long on a one-group floor, would start only much later, when the latency-critical tenant may be running.
 * The gate marks each launch's completion with an event on the stream it went to; a launch that does not fit waits
 * for the oldest one. A completion is timed from when it was seen (the oldest mark was seen unfinished at an earlier
 * launch or wait): time since the previous completion or since submission, whichever is later. Completions seen
 * late make the estimate longer: it errs on the side of a faster reclaim.
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

/* DS_LAT_FINE_SUB buckets per octave from 2^DS_LAT_FINE_MIN_OCT us; everything below in bucket 0, everything from
 * the last bucket's lower edge up in the last */
static unsigned fine_bucket_of(uint64_t ns) {
    uint64_t us = ns / 1000;
    if (us < (1u << DS_LAT_FINE_MIN_OCT))
        return 0;
    unsigned oct = 63u - (unsigned)__builtin_clzll(us);
    unsigned sub = (unsigned)(us >> (oct - 3)) & (DS_LAT_FINE_SUB - 1);
    unsigned b = (oct - DS_LAT_FINE_MIN_OCT) * DS_LAT_FINE_SUB + sub;
    return b < DS_LAT_FINE_BUCKETS ? b : DS_LAT_FINE_BUCKETS - 1;
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
    __atomic_fetch_add(&pg->lat_fine[fine_bucket_of(now - st)], 1, __ATOMIC_RELAXED);
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

static unsigned cost_slot(const void *key) {
    uintptr_t k = (uintptr_t)key;
    return (unsigned)((k >> 4) ^ (k >> 12) ^ (k >> 20)) % DS_GATE_KEYS;
}

/* The predicted duration of a launch of key on width groups, 0 when nothing is learnt. */
static uint64_t predict(const struct ds_gate *g, const void *key, unsigned width) {
    if (!width)
        width = 1;
    const struct ds_gate_cost *c = &g->cost[cost_slot(key)];
    if (key && c->key == key && c->work)
        return c->work / width;
    return g->work / width;
}

/* When the oldest launch in flight started running: at the previous completion, or at its submission if later. */
static uint64_t head_start(const struct ds_gate *g) {
    unsigned h = g->head;
    return g->last_done_ns > g->sub_ns[h] ? g->last_done_ns : g->sub_ns[h];
}

/* Whether one more launch (predicted est ns) may go at time now: depth and budget from the table, against what is
 * left of the launches in flight. */
static int admits(const struct ds_gate *g, uint32_t depth, uint64_t budget_ns, uint64_t est, uint64_t now) {
    unsigned cap = depth > DS_GATE_MAX ? DS_GATE_MAX : depth;
    if (g->n == 0)
        return 1; /* one launch always goes: the gate throttles, it never stops a tenant */
    if (g->n >= cap)
        return 0;
    if (!budget_ns)
        return 1;
    if (!est && !g->est_sum)
        return g->n < 2; /* nothing learnt yet: two launches until the durations are known */
    /* what is left of the work in flight: the oldest launch has been running since head_start, so the next one may
     * queue as it nears its end and the stream does not idle between them */
    uint64_t start = head_start(g), ran = now > start ? now - start : 0;
    uint64_t left = g->est_sum - (ran < g->est_in[g->head] ? ran : g->est_in[g->head]);
    return left + est <= budget_ns;
}

static void learn(struct ds_gate *g, unsigned h, uint64_t dur) {
    uint64_t w = dur * (g->width_in[h] ? g->width_in[h] : 1);
    g->work = g->work ? (g->work * 7 + w) / 8 : w;
    const void *key = g->key_in[h];
    if (!key)
        return;
    struct ds_gate_cost *c = &g->cost[cost_slot(key)];
    if (c->key != key) {
        c->key = key;
        c->work = w;
    } else {
        c->work = (c->work * 3 + w) / 4;
    }
}

static void gate_wait(struct ds_gate *g, uint32_t depth, CUstream where, bool any_where, const void *key,
                      unsigned width) {
    if (atomic_load(&ds_process.capturing) || !ds_real.cuEventQuery)
        return; /* an event record would become a node of the application's graph */
    uint64_t budget = (uint64_t)__atomic_load_n(&ds_process.tenant->ctr->gate_budget_us, __ATOMIC_RELAXED) * 1000;
    uint64_t t0 = 0, now = 0;
    pthread_mutex_lock(&g->lock);
    while (g->n > 0) {
        unsigned h = g->head;
        CUresult r = ds_real.cuEventQuery(g->ev[h]);
        now = ds_now_ns();
        if (r == CUDA_ERROR_NOT_READY) {
            g->head_busy = 1; /* seen unfinished: its completion time will be observed */
            /* the grant changed: nothing may queue behind the old grant's launches */
            if ((any_where || g->where == where) && admits(g, depth, budget, predict(g, key, width), now))
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
            uint64_t start = head_start(g);
            learn(g, h, now > start ? now - start : 0);
        }
        g->head_busy = 0;
        g->last_done_ns = now;
        g->est_sum -= g->est_in[h] < g->est_sum ? g->est_in[h] : g->est_sum;
        g->head = (h + 1) % DS_GATE_MAX;
        g->n--;
    }
    pthread_mutex_unlock(&g->lock);
    if (t0 && ds_process.tenant->page) {
        __atomic_fetch_add(&ds_process.tenant->page->gate_waits, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&ds_process.tenant->page->gate_wait_ns, now - t0, __ATOMIC_RELAXED);
    }
}

void ds_gate_wait(struct ds_gate *g, uint32_t depth, CUstream where, const void *key, unsigned width) {
    gate_wait(g, depth, where, false, key, width);
}

void ds_gate_admit(struct ds_gate *g, uint32_t depth, const void *key, unsigned width) {
    gate_wait(g, depth, NULL, true, key, width);
}

void ds_gate_record(struct ds_gate *g, CUstream where, const void *key, unsigned width) {
    if (atomic_load(&ds_process.capturing))
        return;
    pthread_mutex_lock(&g->lock);
    if (g->n < DS_GATE_MAX) {
        unsigned i = (g->head + g->n) % DS_GATE_MAX;
        if (!g->ev[i] && ds_real.cuEventCreate(&g->ev[i], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
            g->ev[i] = NULL;
        if (g->ev[i] && DS_SOP_REAL(cuEventRecord)(g->ev[i], where) == CUDA_SUCCESS) {
            if (g->n == 0)
                g->where = where;
            g->sub_ns[i] = ds_now_ns();
            g->key_in[i] = key;
            g->width_in[i] = width;
            g->est_in[i] = predict(g, key, width);
            g->est_sum += g->est_in[i];
            g->n++;
        }
    }
    pthread_mutex_unlock(&g->lock);
}
