/*
 * ds_process.c — the process-wide state every part of libdetshare shares (struct ds_process, ds_process.h): the
 * settings read once from the environment, logging, the clock, the re-entrancy depth, and this process's ds_proc
 * entry in the tenant's client page. It calls no other part of the library: every other file may use it.
 */
#include "ds_process.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct ds_process ds_process = {.self_idx = -1, .settings = {.log_level = DS_LOG_WARN}};
__thread int ds_depth __attribute__((tls_model("initial-exec")));

static pthread_mutex_t g_attach_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_settings_once = PTHREAD_ONCE_INIT;

void ds_log(int level, const char *fmt, ...) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "detshare[%d] %s: ", (int)getpid(), names[level & 3]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof buf)
        vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = strnlen(buf, sizeof buf - 2);
    buf[len++] = '\n';
    /* one write(2) so lines of concurrent processes do not interleave */
    ssize_t w = write(2, buf, len);
    (void)w;
}

uint64_t ds_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Settings: every DETSHARE_* variable is read here, once, before the library uses it (the constructor, or an
 * earlier first driver use); nothing reads the environment later. A bad value is logged and the default used.
 * ------------------------------------------------------------------------------------------------------------- */
static uint64_t env_ms(const char *name, uint64_t def) {
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || x == 0 || x > 3600000) {
        if (def)
            DS_LOG(DS_LOG_WARN, "%s=%s: allowed 1..3600000 (milliseconds); using %llu", name, v,
                   (unsigned long long)def);
        else
            DS_LOG(DS_LOG_WARN, "%s=%s: allowed 1..3600000 (milliseconds); using the default", name, v);
        return def;
    }
    return x;
}

static void settings_once(void) {
    struct ds_settings *st = &ds_process.settings;
    const char *lvl = getenv("DETSHARE_LOG");
    if (lvl) {
        if (!strcmp(lvl, "error"))
            st->log_level = DS_LOG_ERROR;
        else if (!strcmp(lvl, "warn"))
            st->log_level = DS_LOG_WARN;
        else if (!strcmp(lvl, "info"))
            st->log_level = DS_LOG_INFO;
        else if (!strcmp(lvl, "debug"))
            st->log_level = DS_LOG_DEBUG;
        else
            ds_log(DS_LOG_WARN, "DETSHARE_LOG=%s: allowed error, warn, info, debug; using warn", lvl);
    }
    const char *e = getenv("DETSHARE_STRICT_STREAMS");
    st->strict_streams = e && !strcmp(e, "1");
    if (e && *e && strcmp(e, "0") && strcmp(e, "1"))
        DS_LOG(DS_LOG_WARN, "DETSHARE_STRICT_STREAMS=%s: allowed 0 or 1; using 0", e);
    st->sched_stale_ms = env_ms("DETSHARE_SCHED_STALE_MS", 3000);
    st->token_wait_ms = env_ms("DETSHARE_TOKEN_WAIT_MS", 10000);
    st->first_grant_wait_ms = env_ms("DETSHARE_FIRST_GRANT_WAIT_MS", 1000);
    st->grant_wait_ms = env_ms("DETSHARE_GRANT_WAIT_MS", 10000);
    st->idle_ms = env_ms("DETSHARE_IDLE_MS", 0);
    const char *pr = getenv("DETSHARE_MPS_PRIORITY");
    st->mps_priority = !(pr && !strcmp(pr, "off"));
    if (pr && *pr && strcmp(pr, "tier") && strcmp(pr, "off"))
        DS_LOG(DS_LOG_WARN, "DETSHARE_MPS_PRIORITY=%s: allowed tier or off; using tier", pr);
    const char *lib = getenv("DETSHARE_REAL_LIBCUDA");
    if (lib && *lib && strlen(lib) < sizeof st->real_libcuda)
        memcpy(st->real_libcuda, lib, strlen(lib) + 1);
    else {
        if (lib && *lib)
            DS_LOG(DS_LOG_WARN, "DETSHARE_REAL_LIBCUDA: longer than %zu bytes; using libcuda.so.1",
                   sizeof st->real_libcuda - 1);
        memcpy(st->real_libcuda, "libcuda.so.1", sizeof "libcuda.so.1");
    }
}

void ds_settings_init(void) { pthread_once(&g_settings_once, settings_once); }

/* ---------------------------------------------------------------------------------------------------------------
 * Process record
 * ------------------------------------------------------------------------------------------------------------- */
struct ds_proc *ds_attach(void) {
    struct ds_proc *p = atomic_load_explicit(&ds_process.self, memory_order_acquire);
    if (p || !ds_process.tenant)
        return p;
    pthread_mutex_lock(&g_attach_lock);
    p = atomic_load_explicit(&ds_process.self, memory_order_acquire);
    if (!p) {
        uint32_t nspid = 0;
        uint64_t ino = 0, start = 0;
        int rc = ds_self_identity(&nspid, &ino, &start);
        if (rc != 0)
            DS_LOG(DS_LOG_WARN, "process identity: %s; the reaper cannot tell when this process dies", strerror(-rc));
        bool host = (__atomic_load_n(&ds_process.tenant->ctr->flags, __ATOMIC_RELAXED) & DS_CF_HOST_TENANT) != 0;
        int i = ds_proc_attach(ds_process.tenant->page, nspid, ino, start, host ? (uint64_t)getpid() : 0);
        if (i >= 0) {
            p = &ds_process.tenant->page->procs[i];
            atomic_store_explicit(&ds_process.self_idx, i, memory_order_relaxed);
            atomic_store_explicit(&ds_process.self, p, memory_order_release);
            DS_LOG(DS_LOG_DEBUG, "process entry %d claimed", i);
        } else {
            static atomic_int warned;
            if (!atomic_exchange(&warned, 1))
                DS_LOG(DS_LOG_WARN, "all %u process entries of tenant %s are in use; this process is counted in the "
                                    "tenant total only", DS_MAX_PROCS, ds_process.tenant->id);
        }
    }
    pthread_mutex_unlock(&g_attach_lock);
    return p;
}

/* Release at a clean exit (ds_proc_detach: credit memory and demand, free the entry). */
void ds_detach(void) {
    if (!ds_process.tenant)
        return;
    pthread_mutex_lock(&g_attach_lock);
    struct ds_proc *p = atomic_exchange(&ds_process.self, NULL);
    int i = atomic_exchange(&ds_process.self_idx, -1);
    pthread_mutex_unlock(&g_attach_lock);
    if (p && i >= 0)
        ds_proc_detach(ds_process.tenant->page, i);
}

/* fork (the lock order is in ds_init.c): the process-entry lock. In the child the entry is the parent's: the child
 * starts with none and claims its own at its first driver use. */
void ds_process_fork_lock(void) { pthread_mutex_lock(&g_attach_lock); }
void ds_process_fork_unlock(void) { pthread_mutex_unlock(&g_attach_lock); }
void ds_process_child(void) {
    atomic_store(&ds_process.self, NULL);
    atomic_store(&ds_process.self_idx, -1);
    pthread_mutex_unlock(&g_attach_lock);
}
