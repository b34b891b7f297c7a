/*
 * ds_guard.c — a truncated DetShare file must not kill the tenant's process (issue 13 item 1, docs/threat-model.md).
 *
 * The library maps three files MAP_SHARED: the table (read-only; only root on the host can resize it), its client
 * page and the doorbell (both writable by the tenant, the doorbell by every tenant). When any of them is shrunk
 * under the mapping, the next access to the lost pages raises SIGBUS. A SIGBUS handler whose fault address lies in
 * one of these mappings replaces the whole mapping, in place, with private anonymous memory and returns, so the
 * access is retried on memory that cannot go away:
 *   - the table: the copy gets this tenant's last-seen container and GPU entries (grant, epoch, generation, memory
 *     limit, split) and a zero scheduler heartbeat, so the process keeps its last grant and never waits for a
 *     scheduler it can no longer see (fail-static);
 *   - the client page and the doorbell: zeroes; demand and memory counters of this process are no longer seen by
 *     the scheduler, which ignores a page it cannot map (the tenant keeps its guarantee).
 * Once lost, a mapping is never re-read from its file; the process stays on its last grant until it exits.
 * A fault outside these mappings goes to the handler that was installed before (or kills, as without DetShare).
 * Limitation: a program that installs its own SIGBUS handler after the library replaces this one.
 */
#include "ds.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static struct {
    _Atomic(uintptr_t) base;
    size_t len;
} g_region[DS_NREGIONS];
atomic_uint ds_lost_mask;
static struct sigaction g_prev;
static pthread_mutex_t g_snap_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ds_container g_ctr_snap; /* this tenant's entry as last seen (ds_guard_snapshot) */
static struct ds_gpu g_gpu_snap;

static void fill_table(char *base) {
    if (!ds_t)
        return;
    memcpy(base + ((const char *)ds_t->ctr - (const char *)ds_t->table), &g_ctr_snap, sizeof g_ctr_snap);
    memcpy(base + ((const char *)ds_t->gpu_entry - (const char *)ds_t->table), &g_gpu_snap, sizeof g_gpu_snap);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < DS_NREGIONS; i++) {
        uintptr_t b = atomic_load_explicit(&g_region[i].base, memory_order_acquire);
        if (!b || a < b || a >= b + g_region[i].len)
            continue;
        int saved = errno;
        /* raw syscall: async-signal-safe; MAP_FIXED replaces the shared mapping atomically */
        long p = syscall(SYS_mmap, (void *)b, g_region[i].len, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0L);
        if (p == (long)b) {
            if (i == DS_REGION_TABLE)
                fill_table((char *)b);
            atomic_fetch_or(&ds_lost_mask, 1u << i);
            static const char *const what[DS_NREGIONS] = {"table", "client page", "doorbell"};
            static const char pre[] = "detshare: the ";
            static const char post[] = " was truncated under this process; it keeps its last grant (fail-static)\n";
            char msg[160];
            size_t n = 0, l = strlen(what[i]);
            memcpy(msg + n, pre, sizeof pre - 1), n += sizeof pre - 1;
            memcpy(msg + n, what[i], l), n += l;
            memcpy(msg + n, post, sizeof post - 1), n += sizeof post - 1;
            ssize_t w = write(2, msg, n);
            (void)w;
            errno = saved;
            return; /* the faulting access is retried on the private copy */
        }
        errno = saved;
        break;
    }
    /* Not ours: what would have happened without the library. */
    if ((g_prev.sa_flags & SA_SIGINFO) && g_prev.sa_sigaction) {
        g_prev.sa_sigaction(sig, si, uc);
        return;
    }
    if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN) {
        g_prev.sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig); /* blocked in the handler: delivered, with the default action, when it returns */
}

void ds_guard_region(int kind, const void *base, size_t len) {
    if (kind < 0 || kind >= DS_NREGIONS || !base || !len)
        return;
    g_region[kind].len = len;
    atomic_store_explicit(&g_region[kind].base, (uintptr_t)base, memory_order_release);
}

void ds_guard_snapshot(void) {
    if (!ds_t || (atomic_load(&ds_lost_mask) & (1u << DS_REGION_TABLE)))
        return;
    pthread_mutex_lock(&g_snap_lock);
    struct ds_container c;
    struct ds_gpu g;
    memcpy(&c, ds_t->ctr, sizeof c);
    memcpy(&g, ds_t->gpu_entry, sizeof g);
    /* a lost table leaves no scheduler to wait for and nothing mid-write */
    c.grant_seq &= ~1u;
    g_ctr_snap = c;
    g_gpu_snap = g;
    pthread_mutex_unlock(&g_snap_lock);
}

int ds_guard_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &g_prev) != 0)
        return -errno;
    return 0;
}
