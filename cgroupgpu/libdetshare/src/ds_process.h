/*
 * ds_process.h — what every part of libdetshare shares (ds_process.c): the tenant, this process's entry in the
 * client page, the settings read once from the environment (struct ds_process), logging, visibility and the
 * re-entrancy depth. libdetshare is the CUDA interception library every CUDA process of a DetShare tenant loads;
 * docs/libdetshare.md maps its files.
 *
 * Concurrency: process-wide state is either written once before it is published (the tenant, the settings, the
 * real-function table), or atomic, or owned by one file under its own lock; the fork handler (ds_init.c) takes
 * every lock in the documented order. The launch fast path takes no lock and makes no syscall.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_PROCESS_H
#define DETSHARE_LIBDETSHARE_DS_PROCESS_H

#include "internal/table/detshare_table.h"
#include "internal/table/detshare_table_client.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define DS_EXPORT __attribute__((visibility("default")))
#define DS_HIDDEN __attribute__((visibility("hidden")))
#define DS_LIKELY(x) __builtin_expect(!!(x), 1)
#define DS_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- logging: quiet by default (DETSHARE_LOG=error|warn|info|debug, default warn) ---- */
enum { DS_LOG_ERROR = 0, DS_LOG_WARN = 1, DS_LOG_INFO = 2, DS_LOG_DEBUG = 3 };
void ds_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define DS_LOG(lvl, ...)                                                                                              \
    do {                                                                                                             \
        if (DS_UNLIKELY((lvl) <= ds_process.settings.log_level))                                                     \
            ds_log((lvl), __VA_ARGS__);                                                                              \
    } while (0)

/* Re-entrancy depth: a hook entered from inside another hook on the same thread (a driver that calls its own
 * exported entry points, a callback) is a pure pass-through so that nothing is counted twice. */
extern __thread int ds_depth __attribute__((tls_model("initial-exec")));

/* ---- the tenant ---- */
struct ds_tenant {
    char id[DS_ID_LEN];
    int slot;
    uint32_t slot_gen;
    int gpu;
    const struct ds_table_header *table;  /* read-only mapping */
    const struct ds_container *ctr;       /* this tenant's entry in it */
    const struct ds_gpu *gpu_entry;       /* its GPU */
    struct ds_client_page *page;          /* read-write */
    struct ds_doorbell *doorbell;         /* read-write, may be NULL */
    char mps_pipe_dir[256];
    char table_path[256];
    char doorbell_path[256];
    char ledger_path[256];                /* the page as this process opens it for the memory ledger (ds_ledger.c):
                                           * its path, or /proc/self/fd/<n> for a descriptor kept across a drop */
};

/* Settings, read once from the environment (ds_settings_init: the constructor, or an earlier first driver use);
 * never written afterwards. */
struct ds_settings {
    int log_level;                /* DETSHARE_LOG: error|warn|info|debug, default warn */
    int strict_streams;           /* DETSHARE_STRICT_STREAMS=1: an edge pair around every kernel */
    uint64_t sched_stale_ms;      /* DETSHARE_SCHED_STALE_MS (3000): heartbeat age after which the scheduler is gone */
    uint64_t token_wait_ms;       /* DETSHARE_TOKEN_WAIT_MS (10000): longest wait for the GPU token */
    uint64_t first_grant_wait_ms; /* DETSHARE_FIRST_GRANT_WAIT_MS (1000): longest wait for the first grant */
    uint64_t grant_wait_ms;       /* DETSHARE_GRANT_WAIT_MS (10000): longest wait for SMs under an empty grant */
    uint64_t idle_ms;             /* DETSHARE_IDLE_MS; 0: the tier's default (2 latency-critical, 20 otherwise) */
    int mps_priority;             /* DETSHARE_MPS_PRIORITY=tier (default): CUDA_MPS_CLIENT_PRIORITY from the tier */
    char real_libcuda[4096];      /* DETSHARE_REAL_LIBCUDA; default libcuda.so.1 */
};

/* The process-wide state every part of the library shares. Each part keeps what only it uses in its own file. */
struct ds_process {
    struct ds_tenant *tenant;           /* NULL: no tenant (pure pass-through); set once in the constructor
                                         * (ds_tenant_load, ds_tenant.c) */
    /* This process's ds_proc entry and its index, or NULL / -1 before the first driver use and in a forked child
     * until its own first use. */
    _Atomic(struct ds_proc *) self;
    atomic_int self_idx;
    atomic_int exiting;                 /* set when the process released its entry at exit */
    atomic_int capturing;               /* stream captures in progress in this process */
    _Atomic uint64_t req_start;         /* first launch since the last completed synchronisation, 0 = none */
    atomic_uint lost_mask;              /* DS_REGION_* bits of truncated mappings (ds_guard.c) */
    /* Set once in the constructor (ds_tenant_load) when this process belongs to a DetShare tenant whose files do not
     * hold up (fail-closed): tenant stays NULL, cuInit answers CUDA_ERROR_NOT_PERMITTED and the driver is never
     * initialised, so the process runs no CUDA work at all instead of running without its quota and grant. */
    int refused;
    char refused_why[320];
    struct ds_settings settings;
};
extern struct ds_process ds_process;
void ds_settings_init(void);  /* reads ds_process.settings once (pthread_once) */
struct ds_proc *ds_attach(void); /* this process's ds_proc entry, claimed at the first use that needs it */
void ds_detach(void);            /* releases it (clean exit) */
void ds_process_fork_lock(void); /* fork handler (ds_init.c, "Lock order") */
void ds_process_fork_unlock(void);
void ds_process_child(void);     /* in the child: no entry until its own first use */

/* Monotonic clock (vDSO, no syscall). */
uint64_t ds_now_ns(void);

#endif /* DETSHARE_LIBDETSHARE_DS_PROCESS_H */
