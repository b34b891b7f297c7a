/*
 * ds_tenant.c — who this process works for: reads the quota file, maps the table (read-only) and the client page
 * (read-write), checks that both belong to the slot and generation the quota file names, sets the MPS variables the
 * driver reads when it starts, and publishes the tenant (ds_process.tenant). Called once, by the constructor.
 *
 * Fail-closed: a process that belongs to a DetShare tenant (a quota file is in force) either runs under its quota and
 * grant or runs no CUDA work at all. Any problem with the tenant's files (quota file, table, client page) is logged
 * once with its cause and the process is refused: cuInit answers CUDA_ERROR_NOT_PERMITTED (ds_mem.c). The client page
 * is writable by the tenant, so a page with another magic, ABI version, slot or generation, or one truncated, must
 * never switch DetShare off (issue 27); the scheduler repairs such a page (table.RepairClientPages), and the next
 * process of the tenant starts normally. What identifies the tenant (slot, generation, paths) comes from the quota
 * file and the table, which the tenant cannot write.
 */
#include "ds_tenant.h"

#include "ds_guard.h"
#include "ds_ledger.h"
#include "ds_process.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static struct ds_tenant g_tenant; /* published once, through ds_process.tenant */

/* ---------------------------------------------------------------------------------------------------------------
 * Quota file (docs/internals.md "The quota file"). The Go side's parser is cgroupgpu/quota.ParseFile; this is its C
 * reader for the few keys the library needs, kept to the same format.
 * ------------------------------------------------------------------------------------------------------------- */
#define QF_NONE (~0ull) /* a numeric key the file did not set */
struct quota_file {
    unsigned long long version, slot, slot_gen, gpu; /* the numeric keys (num_key) */
    char id[DS_ID_LEN];
    char table[256];
    char client_page[256];
    char doorbell[256];
    char mps_pipe_dir[256];
};

static int copy_value(char *dst, size_t cap, const char *key, const char *v) {
    size_t n = strlen(v);
    if (n >= cap) {
        DS_LOG(DS_LOG_ERROR, "quota file: %s is %zu bytes long, at most %zu allowed", key, n, cap - 1);
        return -1;
    }
    memcpy(dst, v, n + 1);
    return 0;
}

static int parse_ul(const char *key, const char *v, unsigned long long max, unsigned long long *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || !*v || *end || x > max || v[0] == '-') {
        DS_LOG(DS_LOG_ERROR, "quota file: %s=%.64s is not an integer in 0..%llu", key, v, max); /* bounded echo */
        return -1;
    }
    *out = x;
    return 0;
}

/* The numeric key k of the file: where it goes and the largest value allowed; NULL for another key. */
static unsigned long long *num_key(struct quota_file *q, const char *k, unsigned long long *max) {
    static const struct {
        const char *key;
        size_t off;
        unsigned long long max;
    } keys[] = {
        {"version", offsetof(struct quota_file, version), 1000},
        {"slot", offsetof(struct quota_file, slot), DS_MAX_CONTAINERS - 1},
        {"slot_gen", offsetof(struct quota_file, slot_gen), UINT32_MAX},
        {"gpu", offsetof(struct quota_file, gpu), DS_MAX_GPUS - 1},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(k, keys[i].key)) {
            *max = keys[i].max;
            return (unsigned long long *)((char *)q + keys[i].off);
        }
    return NULL;
}

static int read_quota_file(const char *path, struct quota_file *q) {
    memset(q, 0, sizeof *q);
    q->slot = QF_NONE;
    FILE *f = fopen(path, "re");
    if (!f) {
        DS_LOG(DS_LOG_ERROR, "quota file %s: %s", path, strerror(errno));
        return -1;
    }
    char line[1024];
    int rc = 0, lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
            line[--n] = 0;
        char *s = line;
        while (*s == ' ' || *s == '\t')
            s++;
        if (!*s || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            DS_LOG(DS_LOG_ERROR, "quota file %s line %d: %.64s: want key=value", path, lineno, s);
            rc = -1;
            continue;
        }
        *eq = 0;
        const char *k = s, *v = eq + 1;
        unsigned long long max = 0, *num = num_key(q, k, &max);
        if (num) {
            rc |= parse_ul(k, v, max, num); /* sets *num only when the value is allowed */
        } else if (!strcmp(k, "id")) {
            rc |= copy_value(q->id, sizeof q->id, k, v);
        } else if (!strcmp(k, "table")) {
            rc |= copy_value(q->table, sizeof q->table, k, v);
        } else if (!strcmp(k, "client_page")) {
            rc |= copy_value(q->client_page, sizeof q->client_page, k, v);
        } else if (!strcmp(k, "doorbell")) {
            rc |= copy_value(q->doorbell, sizeof q->doorbell, k, v);
        } else if (!strcmp(k, "mps_pipe_dir")) {
            rc |= copy_value(q->mps_pipe_dir, sizeof q->mps_pipe_dir, k, v);
        }
        /* unknown keys are ignored: newer writers may add keys */
    }
    fclose(f);
    if (rc)
        return -1;
    if (q->version != 1) {
        DS_LOG(DS_LOG_ERROR, "quota file %s: version=%llu, this library reads version=1", path, q->version);
        return -1;
    }
    if (q->slot == QF_NONE || !q->table[0] || !q->client_page[0]) {
        DS_LOG(DS_LOG_ERROR, "quota file %s: slot, table and client_page are required", path);
        return -1;
    }
    return 0;
}

/* Under MPS the driver enforces CUDA_MPS_PINNED_DEVICE_MEM_LIMIT itself: a backstop for code that escapes the
 * interposer. It must be in the environment before the driver initialises, hence the constructor. The host's value
 * replaces whatever the tenant set (a client may raise a limit it sets itself; only the server-side limit the
 * scheduler sets is out of its reach, docs/threat-model-quota.md). The device ordinal is the process's view: 0 in a
 * container (it sees its GPU only) or when CUDA_VISIBLE_DEVICES selects it, else the table's index. */
static void set_mps_backstop(uint64_t limit, int ordinal) {
    if (!limit)
        return;
    unsigned long long mib = (unsigned long long)((limit + (1ull << 20) - 1) >> 20);
    const char *cur = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    if (cur && *cur)
        DS_LOG(DS_LOG_INFO, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT set by the tenant is replaced by the host's limit");
    char v[64];
    snprintf(v, sizeof v, "%d=%lluM", ordinal, mib);
    setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", v, 1);
    DS_LOG(DS_LOG_INFO, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%s", v);
}

/* MPS client priority (issue 12). Green contexts decide which SMs a client may use; where a latency-critical
 * tenant's grant overlaps groups a lower tier still runs on (the wide offer of an idle LC, a lent guarantee), the
 * hardware dispatches the waiting thread blocks of both. Below-normal priority for every lower tier makes the SMs
 * that free up go to the latency-critical tenant's blocks first. The driver reads the variable when the client
 * connects to the MPS server, so it is set before the driver initialises. It is a hint, never a partition: a tenant
 * that raises its own priority competes on equal terms, on the SMs it was granted (docs/threat-model.md). */
static void set_mps_priority(uint32_t tier) {
    if (!ds_process.settings.mps_priority)
        return;
    const char *want = tier == DS_TIER_LATENCY_CRITICAL ? "0" : "1";
    const char *cur = getenv("CUDA_MPS_CLIENT_PRIORITY");
    if (cur && *cur && strcmp(cur, want))
        DS_LOG(DS_LOG_INFO, "CUDA_MPS_CLIENT_PRIORITY=%s set by the tenant is replaced by its tier's %s", cur, want);
    setenv("CUDA_MPS_CLIENT_PRIORITY", want, 1);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Privilege drops (issue 13 item 7, issue 27). A host tenant's client page is reachable by root only (clients/ is
 * 0700), so a process that drops to another user before it execs its program (setpriv, su, gosu, runuser) could no
 * longer open it and would run without DetShare. A root process therefore leaves a page carrier for the programs it
 * execs: a datagram socket, inherited across exec and named in DETSHARE_CLIENT_PAGE_SOCK, holding one queued message
 * whose SCM_RIGHTS is a read-write descriptor of the page (`detshare run` makes one too, table.NewPageCarrier). The
 * library takes its own copy with recvmsg(MSG_PEEK), which leaves the message for the next process, and only after
 * it made this process non-dumpable. Never the page itself crosses exec: the kernel makes every exec'd program
 * dumpable until its constructor runs, and in that window another process of the same user could reopen an inherited
 * page read-write through /proc/<pid>/fd/<n>; a socket cannot be reopened there (ENXIO). The copy is accepted only if
 * it is open read-write on the file the quota file names (same device and inode when the path can be stat'ed) and
 * holds this tenant's slot and generation, so it can never give a process more than the page it was started with.
 * ------------------------------------------------------------------------------------------------------------- */
#define DS_PAGE_SOCK_ENV "DETSHARE_CLIENT_PAGE_SOCK"

/* The carrier named in the environment, if it is a socket (-1 if not). */
static int page_carrier(void) {
    const char *v = getenv(DS_PAGE_SOCK_ENV);
    if (!v || !*v)
        return -1;
    char *end = NULL;
    errno = 0;
    long fd = strtol(v, &end, 10);
    if (errno || *end || fd < 3 || fd > 1 << 20)
        return -1;
    struct stat st;
    if (fstat((int)fd, &st) != 0 || !S_ISSOCK(st.st_mode))
        return -1;
    return (int)fd;
}

/* Whether fd is open read-write on a regular file that is the page at path (when path can be stat'ed). */
static bool is_page_fd(int fd, const char *path) {
    struct stat fst, pst;
    if (fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode))
        return false;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || (fl & O_ACCMODE) != O_RDWR)
        return false;
    return !(stat(path, &pst) == 0 && (pst.st_dev != fst.st_dev || pst.st_ino != fst.st_ino));
}

/* A descriptor of the page (close-on-exec) taken from the carrier, or -1. Every descriptor that came with the
 * message is closed unless it is the one page descriptor accepted. */
static int page_from_carrier(int sock, const char *path) {
    char data[8];
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } u;
    struct iovec iov = {.iov_base = data, .iov_len = sizeof data};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    ssize_t n;
    do
        n = recvmsg(sock, &m, MSG_PEEK | MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -1;
    int page = -1, extra = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (page < 0 && !extra)
                page = fd;
            else {
                close(fd);
                extra = 1;
            }
        }
    }
    if (page >= 0 && (extra || (m.msg_flags & MSG_CTRUNC) || !is_page_fd(page, path))) {
        close(page);
        page = -1;
    }
    return page;
}

/* A process that maps its page from the carrier is a privilege-dropped one: it makes itself non-dumpable before it
 * holds a descriptor of the page, so /proc/<pid>/fd, /proc/<pid>/mem and ptrace are root's from then on and another
 * process of its user can never reopen the page through it. The price, for these processes only: no core dumps and
 * no debugger attach by the same user (root still can). */
static int map_carried_page(const char *path, struct ds_client_page **out, int *kept) {
    int sock = page_carrier();
    if (sock < 0)
        return -EACCES;
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
        DS_LOG(DS_LOG_ERROR, "PR_SET_DUMPABLE 0: %s; the client page is not taken into a process others could "
                             "reach", strerror(errno));
        return -EACCES;
    }
    int fd = page_from_carrier(sock, path);
    if (fd < 0)
        return -EACCES;
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= sizeof **out)
        p = mmap(NULL, sizeof **out, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    struct ds_client_page *cp = p;
    if (p == MAP_FAILED || cp->magic != DS_CLIENT_MAGIC || cp->abi_version != DS_TABLE_ABI_VERSION) {
        if (p != MAP_FAILED)
            munmap(p, sizeof *cp);
        close(fd);
        return -DS_ECORRUPT;
    }
    *out = cp;
    *kept = fd; /* the ledger reopens its own description through /proc/self/fd/<fd> */
    return 0;
}

/* Root only: leave a page carrier for the programs this process execs (see above), unless one is inherited. */
static void keep_page_for_exec(const char *path) {
    if (geteuid() != 0 || page_carrier() >= 0)
        return;
    int page = open(path, O_RDWR | O_CLOEXEC);
    if (page < 0)
        return;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv) != 0) {
        close(page);
        return;
    }
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    memset(&u, 0, sizeof u);
    char data = 'p';
    struct iovec iov = {.iov_base = &data, .iov_len = 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &page, sizeof page);
    ssize_t n = sendmsg(sv[1], &m, MSG_NOSIGNAL);
    close(sv[1]);
    close(page);
    int fd = sv[0];
    if (n == 1 && fd < 3) { /* never take the place of a standard stream the program closed */
        int hi = fcntl(fd, F_DUPFD, 3);
        close(fd);
        fd = hi;
    } else if (n != 1) {
        close(fd);
        fd = -1;
    }
    if (fd < 0 || fcntl(fd, F_SETFD, 0) != 0) { /* inherited across exec */
        if (fd >= 0)
            close(fd);
        return;
    }
    char v[16];
    snprintf(v, sizeof v, "%d", fd);
    setenv(DS_PAGE_SOCK_ENV, v, 1);
}

/* The quota file the hook mounts read-only into every tenant container. When it exists it is the only source of
 * the tenant's settings: DETSHARE_QUOTA_FILE is the tenant's own variable and must not switch DetShare off or
 * point at a file of its choosing. The variable is honoured only where the fixed path does not exist, i.e. for host
 * tenants started by `detshare run` (which could as well not load the library at all). */
#define DS_QUOTA_FIXED_PATH "/run/detshare/quota"

static const char *quota_path(bool *fixed) {
    const char *env = getenv("DETSHARE_QUOTA_FILE");
    *fixed = access(DS_QUOTA_FIXED_PATH, F_OK) == 0;
    if (*fixed) {
        if (env && *env && strcmp(env, DS_QUOTA_FIXED_PATH) != 0)
            DS_LOG(DS_LOG_WARN, "DETSHARE_QUOTA_FILE ignored: the host's quota file %s is in force",
                   DS_QUOTA_FIXED_PATH);
        return DS_QUOTA_FIXED_PATH;
    }
    return env && *env ? env : NULL;
}

/* The tenant's files do not hold up: refuse this process's CUDA work (see the file comment). Logged at error level,
 * which DETSHARE_LOG cannot silence below the default. */
static void refuse(const char *id, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refuse(const char *id, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ds_process.refused_why, sizeof ds_process.refused_why, fmt, ap);
    va_end(ap);
    ds_process.refused = 1;
    ds_log(DS_LOG_ERROR, "tenant %s: %s; DetShare refuses this process's CUDA work (fail-closed: cuInit returns "
                         "CUDA_ERROR_NOT_PERMITTED)", id && *id ? id : "?", ds_process.refused_why);
}

void ds_tenant_load(void) {
    bool fixed = false;
    const char *path = quota_path(&fixed);
    if (!path)
        return; /* not a tenant: pure pass-through */
    struct quota_file q;
    if (read_quota_file(path, &q) != 0) {
        refuse(q.id, "quota file %s unusable (reason above)", path);
        return;
    }
    const struct ds_table_header *h = NULL;
    int rc = ds_table_map_ro(q.table, &h);
    if (rc != 0) {
        refuse(q.id, "table %s: %s", q.table,
               rc == -DS_EVERSION   ? "another ABI version than this library's"
               : rc == -DS_ECORRUPT ? "bad magic, geometry or not ready"
                                    : strerror(-rc));
        return;
    }
    const struct ds_container *c = ds_table_container(h, (uint32_t)q.slot);
    uint32_t gen = __atomic_load_n(&c->gen, __ATOMIC_ACQUIRE);
    uint32_t state = __atomic_load_n(&c->state, __ATOMIC_ACQUIRE);
    if (gen != q.slot_gen || (state != DS_SLOT_ACTIVE && state != DS_SLOT_RESERVED)) {
        refuse(q.id, "table slot %llu: generation %u state %u, quota file says generation %llu (deregistered?)",
               q.slot, gen, state, q.slot_gen);
        goto fail_table;
    }
    struct ds_client_page *pg = NULL;
    int kept = -1;
    rc = ds_client_map(q.client_page, &pg);
    if (rc == -EACCES && map_carried_page(q.client_page, &pg, &kept) == 0) {
        rc = 0;
        DS_LOG(DS_LOG_INFO, "client page %s taken from the carrier left before a privilege drop", q.client_page);
    }
    if (rc != 0) {
        refuse(q.id, "client page %s: %s", q.client_page,
               rc == -DS_EVERSION   ? "another ABI version (overwritten by the tenant?)"
               : rc == -DS_ECORRUPT ? "bad magic or size (overwritten or truncated by the tenant?)"
                                    : strerror(-rc));
        goto fail_table;
    }
    if (pg->slot != (uint32_t)q.slot || pg->slot_gen != q.slot_gen || pg->max_procs != DS_MAX_PROCS) {
        refuse(q.id, "client page %s names slot %u generation %u (%u process entries), the quota file slot %llu "
                     "generation %llu (overwritten by the tenant?)",
               q.client_page, pg->slot, pg->slot_gen, pg->max_procs, q.slot, q.slot_gen);
        munmap(pg, sizeof *pg);
        if (kept >= 0)
            close(kept);
        goto fail_table;
    }
    struct ds_doorbell *db = NULL;
    if (q.doorbell[0] && ds_doorbell_map(q.doorbell, &db) != 0) {
        db = NULL;
        DS_LOG(DS_LOG_WARN, "doorbell %s unusable; demand changes are seen at the scheduler's next poll", q.doorbell);
    }
    struct ds_tenant *t = &g_tenant;
    memcpy(t->id, q.id, sizeof t->id);
    t->slot = (int)q.slot;
    t->slot_gen = (uint32_t)q.slot_gen;
    int gpu = c->gpu;
    if (gpu < 0 || gpu >= (int)DS_MAX_GPUS)
        gpu = (int)q.gpu;
    t->gpu = gpu;
    t->table = h;
    t->ctr = c;
    t->gpu_entry = ds_table_gpu(h, (uint32_t)gpu);
    t->page = pg;
    t->doorbell = db;
    memcpy(t->mps_pipe_dir, q.mps_pipe_dir, sizeof t->mps_pipe_dir);
    memcpy(t->table_path, q.table, sizeof t->table_path);
    memcpy(t->doorbell_path, q.doorbell, sizeof t->doorbell_path);
    if (kept >= 0)
        snprintf(t->ledger_path, sizeof t->ledger_path, "/proc/self/fd/%d", kept);
    else
        memcpy(t->ledger_path, q.client_page, sizeof t->ledger_path);
    if (t->mps_pipe_dir[0]) {
        /* The driver finds the MPS server through CUDA_MPS_PIPE_DIRECTORY. Processes `exec`'d into a container
         * never see env edits made at create time, so the library exports the tenant's pipe directory itself
         * (before the driver initialises); a value the user set is kept. */
        const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
        if (!pipe || !*pipe || fixed) /* in a container the host's pipe directory wins (its server sets the limit) */
            setenv("CUDA_MPS_PIPE_DIRECTORY", t->mps_pipe_dir, 1);
        bool host = (__atomic_load_n(&c->flags, __ATOMIC_RELAXED) & DS_CF_HOST_TENANT) != 0;
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        set_mps_backstop(__atomic_load_n(&c->mem_limit, __ATOMIC_RELAXED), host && !(cvd && *cvd) ? gpu : 0);
    }
    set_mps_priority(__atomic_load_n(&c->tier, __ATOMIC_RELAXED));
    keep_page_for_exec(q.client_page);
    ds_process.tenant = t;
    ds_ledger_open(__atomic_load_n(&c->mem_limit, __ATOMIC_RELAXED));
    ds_guard_snapshot();
    ds_guard_region(DS_REGION_TABLE, h, DS_TABLE_SIZE);
    ds_guard_region(DS_REGION_PAGE, pg, sizeof *pg);
    if (db)
        ds_guard_region(DS_REGION_DOORBELL, db, sizeof *db);
    if ((rc = ds_guard_install()) != 0)
        DS_LOG(DS_LOG_WARN, "SIGBUS handler not installed (%s): a truncated DetShare file would kill this process",
               strerror(-rc));
    DS_LOG(DS_LOG_INFO, "tenant %s slot %d gpu %d memory limit %llu", t->id, t->slot, t->gpu,
           (unsigned long long)c->mem_limit);
    return;
fail_table:
    ds_table_unmap(h);
}
