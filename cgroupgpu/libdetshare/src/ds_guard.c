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
 * Once lost, the table and the client page are never re-read from their files; the process stays on its last grant
 * until it exits. The doorbell is every tenant's: one tenant truncating it must not cost the others their wake-ups
 * for good, so the next ring maps the file again once the scheduler has repaired it (ds_guard_ring).
 * A fault outside these mappings goes to the program's own handler (or kills, as without DetShare). The handler
 * stays in front: sigaction(SIGBUS, …) is interposed and records the program's handler for chaining instead of
 * replacing this one (Python's faulthandler, which pytest enables, and JVMs install SIGBUS handlers).
 * signal(2) and raw syscalls are not interposed.
 */
#include "ds_guard.h"

#include "ds_process.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static struct {
    _Atomic(uintptr_t) base;
    size_t len;
} g_region[DS_NREGIONS];
static struct sigaction g_prev;
static pthread_mutex_t g_snap_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ds_container g_ctr_snap; /* this tenant's entry as last seen (ds_guard_snapshot) */
static struct ds_gpu g_gpu_snap;

static void fill_table(char *base) {
    const struct ds_tenant *t = ds_process.tenant;
    if (!t)
        return;
    memcpy(base + ((const char *)t->ctr - (const char *)t->table), &g_ctr_snap, sizeof g_ctr_snap);
    memcpy(base + ((const char *)t->gpu_entry - (const char *)t->table), &g_gpu_snap, sizeof g_gpu_snap);
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
            atomic_fetch_or(&ds_process.lost_mask, 1u << i);
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

/* fork (lock order in ds_init.c) */
void ds_guard_fork_lock(void) { pthread_mutex_lock(&g_snap_lock); }
void ds_guard_fork_unlock(void) { pthread_mutex_unlock(&g_snap_lock); }

void ds_guard_snapshot(void) {
    if (!ds_process.tenant || (atomic_load(&ds_process.lost_mask) & (1u << DS_REGION_TABLE)))
        return;
    pthread_mutex_lock(&g_snap_lock);
    struct ds_container c;
    struct ds_gpu g;
    memcpy(&c, ds_process.tenant->ctr, sizeof c);
    memcpy(&g, ds_process.tenant->gpu_entry, sizeof g);
    /* a lost table leaves no scheduler to wait for and nothing mid-write */
    c.grant_seq &= ~1u;
    g_ctr_snap = c;
    g_gpu_snap = g;
    pthread_mutex_unlock(&g_snap_lock);
}

#if defined(__aarch64__)
#define DS_GLIBC_BASE "GLIBC_2.17"
#else
#define DS_GLIBC_BASE "GLIBC_2.2.5"
#endif

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static _Atomic(sigaction_fn) g_real_sigaction;
static atomic_int g_installed;

static sigaction_fn real_sigaction(void) {
    sigaction_fn f = atomic_load_explicit(&g_real_sigaction, memory_order_acquire);
    if (!f) {
        /* dlvsym is not interposed: the next sigaction after this library is glibc's */
        f = (sigaction_fn)dlvsym(RTLD_NEXT, "sigaction", DS_GLIBC_BASE);
        atomic_store_explicit(&g_real_sigaction, f, memory_order_release);
    }
    return f;
}

int ds_guard_install(void) {
    sigaction_fn real = real_sigaction();
    if (!real)
        return -ENOSYS;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (real(SIGBUS, &sa, &g_prev) != 0)
        return -errno;
    atomic_store(&g_installed, 1);
    return 0;
}

/* sigaction as the program sees it: for SIGBUS, once the guard is installed, the program's handler is recorded
 * (and reported back) for chaining while the guard stays installed. Lock-free: sigaction is async-signal-safe. */
DS_EXPORT int ds_sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (sig == SIGBUS && atomic_load(&g_installed)) {
        struct sigaction prev = g_prev;
        if (act)
            g_prev = *act;
        if (old)
            *old = prev;
        return 0;
    }
    sigaction_fn real = real_sigaction();
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    return real(sig, act, old);
}
__asm__(".symver ds_sigaction, sigaction@@" DS_GLIBC_BASE);

/* Ring the doorbell (demand transitions only, never on the launch path). A doorbell lost to a truncation is mapped
 * again from its file first, in place, when the scheduler has given it back its size and magic. */
void ds_guard_ring(void) {
    if (!ds_process.tenant || !ds_process.tenant->doorbell)
        return;
    if ((atomic_load(&ds_process.lost_mask) & (1u << DS_REGION_DOORBELL)) && ds_process.tenant->doorbell_path[0]) {
        int fd = open(ds_process.tenant->doorbell_path, O_RDWR | O_CLOEXEC);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size >= sizeof(struct ds_doorbell)) {
            void *p = mmap(ds_process.tenant->doorbell, sizeof(struct ds_doorbell), PROT_READ | PROT_WRITE,
                           MAP_SHARED | MAP_FIXED, fd, 0);
            if (p == (void *)ds_process.tenant->doorbell) {
                if (__atomic_load_n(&ds_process.tenant->doorbell->magic, __ATOMIC_ACQUIRE) == DS_DOORBELL_MAGIC) {
                    atomic_fetch_and(&ds_process.lost_mask, ~(1u << DS_REGION_DOORBELL));
                    DS_LOG(DS_LOG_INFO, "doorbell %s mapped again after its repair", ds_process.tenant->doorbell_path);
                } else { /* not repaired yet: back to private memory, try at the next ring */
                    (void)mmap(ds_process.tenant->doorbell, sizeof(struct ds_doorbell), PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
                }
            }
        }
        if (fd >= 0)
            close(fd);
    }
    ds_doorbell_ring(ds_process.tenant->doorbell);
}
