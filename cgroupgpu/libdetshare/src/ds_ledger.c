/*
 * ds_ledger.c — the tenant-wide memory ledger (ds_ledger.h).
 *
 * The client page's mem_used is the number the tenant's processes cooperate on, and every process of the tenant can
 * write it: zeroed, it let N processes hold N x the quota (issue 27). The ledger is kept where the tenant cannot
 * write: in the kernel, as open-file-description locks (F_OFD_SETLK) on the client page, far past its end (offset
 * DS_LEDGER_BASE, where no byte of the page is). The quota is cut into units of DS_LEDGER_UNIT bytes, unit i being
 * byte DS_LEDGER_BASE + i; a process holding n bytes through the library holds write locks on ceil(n / unit) units.
 * Write locks are exclusive between open file descriptions, so all the processes of a tenant together can never hold
 * more units than the quota has, whatever is written in the page. Only the kernel knows who holds which unit; a lock
 * goes away only when its holder unlocks it or closes its description (its process exits, is killed, or execs: the
 * descriptor is close-on-exec), so a crashed process's share comes back by itself, without the reaper.
 *
 * Each process opens its own description of the page (a descriptor inherited through fork or exec would share its
 * locks with the parent): by its path, or through /proc/self/fd/<n> for the descriptor kept across a privilege drop.
 * A process can still give up its own units (close the descriptor, unlock them): that is a process tampering with
 * itself, which can as well call the driver past the library; the backstop for that is the MPS server-side limit
 * (docs/threat-model-quota.md). Units are taken on the allocation path (never the launch path), under this file's
 * lock: one F_OFD_SETLK when the next units are free, one F_OFD_GETLK more per lock of another process in the way.
 */
#include "ds_ledger.h"

#include "ds_process.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define DS_LEDGER_BASE (1ull << 40)  /* first unit's byte: far past the page's end */
#define DS_LEDGER_UNIT (64ull << 10) /* bytes per unit: a process's charge is rounded up to it */
#define DS_LEDGER_RUNS 256           /* runs of units one process holds (the kernel merges adjacent ones) */

struct run {
    uint64_t start, len; /* units */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_fd = -1;
static struct run g_runs[DS_LEDGER_RUNS]; /* sorted by start, disjoint */
static int g_nruns;
static uint64_t g_units; /* units this process holds: the sum of g_runs */

static int ledger_fd(void) {
    if (g_fd >= 0)
        return g_fd;
    /* Opened in the constructor (ds_ledger_open); here only when that failed, or in a child whose reopen failed. */
    const char *path = ds_process.tenant->ledger_path;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ELOOP) /* /proc/self/fd/<n> is a link by design */
        fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        DS_LOG(DS_LOG_ERROR, "memory ledger %s: %s; allocations are refused", path, strerror(errno));
        return -1;
    }
    g_fd = fd;
    return fd;
}

/* fcntl(cmd) on units [start, start+len); *fl is what the kernel answered (F_OFD_GETLK: a conflicting lock). */
static int lock_units_fl(int fd, short type, uint64_t start, uint64_t len, int cmd, struct flock *fl) {
    memset(fl, 0, sizeof *fl);
    fl->l_type = type;
    fl->l_whence = SEEK_SET;
    fl->l_start = (off_t)(DS_LEDGER_BASE + start);
    fl->l_len = (off_t)len;
    return fcntl(fd, cmd, fl);
}

static int lock_units(int fd, short type, uint64_t start, uint64_t len, int cmd) {
    struct flock fl;
    return lock_units_fl(fd, type, start, len, cmd, &fl);
}

/* Adds [start, start+len) to the runs (merged with a neighbour when adjacent). false when the table is full. */
static bool runs_add(uint64_t start, uint64_t len) {
    int i = 0;
    while (i < g_nruns && g_runs[i].start < start)
        i++;
    if (i > 0 && g_runs[i - 1].start + g_runs[i - 1].len == start) {
        g_runs[i - 1].len += len;
        if (i < g_nruns && g_runs[i - 1].start + g_runs[i - 1].len == g_runs[i].start) {
            g_runs[i - 1].len += g_runs[i].len;
            memmove(&g_runs[i], &g_runs[i + 1], (size_t)(g_nruns - i - 1) * sizeof g_runs[0]);
            g_nruns--;
        }
        return true;
    }
    if (i < g_nruns && start + len == g_runs[i].start) {
        g_runs[i].start = start;
        g_runs[i].len += len;
        return true;
    }
    if (g_nruns == DS_LEDGER_RUNS)
        return false;
    memmove(&g_runs[i + 1], &g_runs[i], (size_t)(g_nruns - i) * sizeof g_runs[0]);
    g_runs[i] = (struct run){start, len};
    g_nruns++;
    return true;
}

/* Gives back n units, from the highest runs down. */
static void release(int fd, uint64_t n) {
    while (n && g_nruns) {
        struct run *r = &g_runs[g_nruns - 1];
        uint64_t k = r->len < n ? r->len : n;
        if (lock_units(fd, F_UNLCK, r->start + r->len - k, k, F_OFD_SETLK) != 0)
            DS_LOG(DS_LOG_WARN, "memory ledger: unlock: %s", strerror(errno));
        r->len -= k;
        n -= k;
        g_units -= k;
        if (!r->len)
            g_nruns--;
    }
}

/* Takes n more units among `total`, none of them already ours; on failure gives back what it took. The common case
 * (the next units are free) is one F_OFD_SETLK. When another process holds some, F_OFD_GETLK names one of its locks
 * in the range tried (not necessarily the lowest): the range is cut before it, or skipped past it when it starts
 * at u, so every failed try narrows the range or moves on, and the loop ends. */
static bool acquire(int fd, uint64_t n, uint64_t total) {
    uint64_t want = n, u = 0, cap = total; /* cap: the end of the range to try (cut after a failed try) */
    int ri = 0;                            /* first of our runs that may lie at or after u */
    while (n) {
        while (ri < g_nruns && g_runs[ri].start + g_runs[ri].len <= u)
            ri++;
        if (ri < g_nruns && g_runs[ri].start <= u) { /* u is ours already */
            u = g_runs[ri].start + g_runs[ri].len;
            cap = total;
            continue;
        }
        if (u >= total)
            break;
        uint64_t end = ri < g_nruns && g_runs[ri].start < cap ? g_runs[ri].start : cap;
        uint64_t len = end - u < n ? end - u : n;
        if (lock_units(fd, F_WRLCK, u, len, F_OFD_SETLK) == 0) {
            if (!runs_add(u, len)) {
                (void)lock_units(fd, F_UNLCK, u, len, F_OFD_SETLK);
                break;
            }
            g_units += len;
            n -= len;
            u += len;
            cap = total;
            continue;
        }
        if (errno != EAGAIN && errno != EACCES)
            break;
        struct flock fl;
        if (lock_units_fl(fd, F_WRLCK, u, len, F_OFD_GETLK, &fl) != 0)
            break;
        if (fl.l_type == F_UNLCK)
            continue; /* released meanwhile: try again */
        uint64_t cs = (uint64_t)fl.l_start - DS_LEDGER_BASE;
        if (cs > u) {
            cap = cs;
        } else {
            u = fl.l_len ? cs + (uint64_t)fl.l_len : total;
            cap = total;
        }
    }
    if (n) {
        release(fd, want - n);
        return false;
    }
    return true;
}

bool ds_ledger_cover(uint64_t held, uint64_t limit) {
    if (!limit)
        return true;
    uint64_t total = (limit + DS_LEDGER_UNIT - 1) / DS_LEDGER_UNIT;
    uint64_t need = held / DS_LEDGER_UNIT + (held % DS_LEDGER_UNIT != 0);
    bool ok = true;
    pthread_mutex_lock(&g_lock);
    int fd = ledger_fd();
    if (fd < 0)
        ok = need <= g_units;
    else if (need > g_units)
        ok = need <= total && acquire(fd, need - g_units, total);
    else if (need < g_units)
        release(fd, g_units - need);
    pthread_mutex_unlock(&g_lock);
    return ok;
}

/* The constructor opens the ledger while the process still has the rights it started with: a process that drops
 * privileges in-process later (setuid) could no longer open a host tenant's page by its path (clients/ is root's). */
void ds_ledger_open(uint64_t limit) {
    if (!limit)
        return;
    pthread_mutex_lock(&g_lock);
    (void)ledger_fd();
    pthread_mutex_unlock(&g_lock);
}

void ds_ledger_fork_lock(void) { pthread_mutex_lock(&g_lock); }
void ds_ledger_fork_unlock(void) { pthread_mutex_unlock(&g_lock); }
void ds_ledger_child(void) {
    /* The descriptor is the parent's description: the child opens its own through /proc/self/fd (no path lookup, so
     * it works after a privilege drop too) and closes its copy, which leaves the parent's locks alone. */
    if (g_fd >= 0) {
        char p[32] = "/proc/self/fd/";
        char d[12];
        int n = 0;
        for (unsigned v = (unsigned)g_fd; n == 0 || v; v /= 10)
            d[n++] = (char)('0' + v % 10);
        size_t k = strlen(p);
        while (n)
            p[k++] = d[--n];
        p[k] = 0;
        int fd = open(p, O_RDWR | O_CLOEXEC);
        close(g_fd);
        g_fd = fd; /* -1: opened by path at the first charge */
    }
    g_nruns = 0;
    g_units = 0;
    pthread_mutex_unlock(&g_lock);
}
