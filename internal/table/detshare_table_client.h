/*
 * detshare_table_client.h — the client side of DetShare's shared-memory table, header-only (static inline), for
 * libdetshare and C tests. Layout: detshare_table.h. Protocols: internal/table (Go) package documentation and
 * docs/internals.md; the Go side (github.com/detshare/detshare/internal/table) implements the same protocols and is
 * tested against this header.
 *
 * Rules kept here:
 *  - The global table is mapped read-only (PROT_READ from an O_RDONLY descriptor): a client cannot write any
 *    container entry, its own grant included; writes fault.
 *  - The grant fast path is ds_grant_epoch(): one acquire load, no locks, no syscalls. Only when the epoch
 *    differs from the cached one does the caller take the bounded seqlock read ds_grant_read().
 *  - Blocking waits use futexes with a timeout; nothing spins without bound.
 *  - Every function checks its inputs and returns 0 or a negative errno (DS_EVERSION for a table or page of
 *    another ABI version: the caller then runs unshared, it never writes to it).
 * Uses GCC/Clang __atomic builtins on the plain integer fields of the shared structs.
 */
#ifndef DETSHARE_TABLE_CLIENT_H
#define DETSHARE_TABLE_CLIENT_H

#ifndef _GNU_SOURCE
#error "detshare_table_client.h needs _GNU_SOURCE (syscall, O_CLOEXEC, clock_gettime): build with -D_GNU_SOURCE as the Makefile does"
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>

#include "detshare_table.h"

#define DS_EVERSION 1000 /* returned negated: ABI version mismatch */
#define DS_ECORRUPT 1001 /* returned negated: bad magic or geometry */
#define DS_GRANT_READ_TRIES 4096

struct ds_grant {
    uint64_t groups;
    uint32_t sms;
    uint32_t mode;
    uint32_t epoch;
    uint32_t pad0;
    uint64_t ns;
};

static inline uint64_t ds_monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ds_map_file maps the first size bytes of path; writable selects O_RDWR + PROT_WRITE. */
static inline int ds_map_file(const char *path, size_t size, int writable, void **out)
{
    if (path == NULL || out == NULL || size == 0)
        return -EINVAL;
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    if ((uint64_t)st.st_size < size) {
        close(fd);
        return -DS_ECORRUPT;
    }
    void *p = mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return -e;
    *out = p;
    return 0;
}

/* ds_table_check validates a mapped table header: magic, ABI version, geometry, ready. */
static inline int ds_table_check(const struct ds_table_header *h)
{
    if (h == NULL)
        return -EINVAL;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != DS_TABLE_MAGIC)
        return -DS_ECORRUPT;
    if (h->abi_version != DS_TABLE_ABI_VERSION)
        return -DS_EVERSION;
    if (h->header_size != sizeof(struct ds_table_header) || h->table_size != DS_TABLE_SIZE ||
        h->max_gpus != DS_MAX_GPUS || h->max_containers != DS_MAX_CONTAINERS ||
        h->gpu_entry_size != sizeof(struct ds_gpu) || h->container_entry_size != sizeof(struct ds_container) ||
        h->gpus_offset != DS_GPUS_OFFSET || h->containers_offset != DS_CONTAINERS_OFFSET ||
        __atomic_load_n(&h->state, __ATOMIC_ACQUIRE) != DS_TABLE_READY)
        return -DS_ECORRUPT;
    return 0;
}

/* ds_table_map_ro maps the global table read-only and validates it. */
static inline int ds_table_map_ro(const char *path, const struct ds_table_header **out)
{
    void *p = NULL;
    if (out == NULL)
        return -EINVAL;
    int rc = ds_map_file(path, DS_TABLE_SIZE, 0, &p);
    if (rc != 0)
        return rc;
    rc = ds_table_check((const struct ds_table_header *)p);
    if (rc != 0) {
        munmap(p, DS_TABLE_SIZE);
        return rc;
    }
    *out = (const struct ds_table_header *)p;
    return 0;
}

static inline void ds_table_unmap(const struct ds_table_header *h)
{
    if (h != NULL)
        munmap((void *)(uintptr_t)h, DS_TABLE_SIZE);
}

static inline const struct ds_gpu *ds_table_gpu(const struct ds_table_header *h, uint32_t i)
{
    if (h == NULL || i >= DS_MAX_GPUS)
        return NULL;
    return (const struct ds_gpu *)((const char *)h + DS_GPUS_OFFSET + (size_t)i * sizeof(struct ds_gpu));
}

static inline const struct ds_container *ds_table_container(const struct ds_table_header *h, uint32_t slot)
{
    if (h == NULL || slot >= DS_MAX_CONTAINERS)
        return NULL;
    return (const struct ds_container *)((const char *)h + DS_CONTAINERS_OFFSET +
                                          (size_t)slot * sizeof(struct ds_container));
}

/* ds_grant_epoch is the launch fast path: one acquire load. */
static inline uint32_t ds_grant_epoch(const struct ds_container *c)
{
    return __atomic_load_n(&c->grant_epoch, __ATOMIC_ACQUIRE);
}

/* ds_grant_read reads the grant under the seqlock; -EBUSY when it stayed mid-write for the whole bounded retry
 * (a leader died while writing): keep the previous grant. */
static inline int ds_grant_read(const struct ds_container *c, struct ds_grant *out)
{
    if (c == NULL || out == NULL)
        return -EINVAL;
    for (int i = 0; i < DS_GRANT_READ_TRIES; i++) {
        uint32_t s1 = __atomic_load_n(&c->grant_seq, __ATOMIC_ACQUIRE);
        if (s1 & 1u)
            continue;
        out->epoch = __atomic_load_n(&c->grant_epoch, __ATOMIC_RELAXED);
        out->groups = __atomic_load_n(&c->grant_groups, __ATOMIC_RELAXED);
        out->sms = __atomic_load_n(&c->grant_sms, __ATOMIC_RELAXED);
        out->mode = __atomic_load_n(&c->grant_mode, __ATOMIC_RELAXED);
        out->ns = __atomic_load_n(&c->grant_ns, __ATOMIC_RELAXED);
        out->pad0 = 0;
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&c->grant_seq, __ATOMIC_RELAXED) == s1)
            return 0;
    }
    return -EBUSY;
}

/* ds_futex_wait blocks while *addr == val, at most timeout_ns (> 0). 0 when woken or changed, -ETIMEDOUT. */
static inline int ds_futex_wait(const uint32_t *addr, uint32_t val, uint64_t timeout_ns)
{
    if (addr == NULL || timeout_ns == 0)
        return -EINVAL;
    struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
    long r = syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
    if (r == 0 || errno == EAGAIN || errno == EINTR)
        return 0;
    return -errno;
}

static inline int ds_futex_wake(uint32_t *addr, int n)
{
    if (addr == NULL)
        return -EINVAL;
    long r = syscall(SYS_futex, addr, FUTEX_WAKE, n, NULL, NULL, 0);
    return r < 0 ? -errno : (int)r;
}

/* ds_doorbell_map maps the doorbell read-write and checks its magic. */
static inline int ds_doorbell_map(const char *path, struct ds_doorbell **out)
{
    void *p = NULL;
    if (out == NULL)
        return -EINVAL;
    int rc = ds_map_file(path, sizeof(struct ds_doorbell), 1, &p);
    if (rc != 0)
        return rc;
    if (((struct ds_doorbell *)p)->magic != DS_DOORBELL_MAGIC) {
        munmap(p, sizeof(struct ds_doorbell));
        return -DS_ECORRUPT;
    }
    *out = (struct ds_doorbell *)p;
    return 0;
}

static inline void ds_doorbell_ring(struct ds_doorbell *d)
{
    if (d == NULL)
        return;
    __atomic_fetch_add(&d->seq, 1, __ATOMIC_RELEASE);
    (void)ds_futex_wake(&d->seq, 0x7fffffff);
}

/* ds_client_map maps this tenant's client page read-write and checks magic and version. */
static inline int ds_client_map(const char *path, struct ds_client_page **out)
{
    void *p = NULL;
    if (out == NULL)
        return -EINVAL;
    int rc = ds_map_file(path, sizeof(struct ds_client_page), 1, &p);
    if (rc != 0)
        return rc;
    struct ds_client_page *cp = (struct ds_client_page *)p;
    if (cp->magic != DS_CLIENT_MAGIC || cp->abi_version != DS_TABLE_ABI_VERSION) {
        int e = cp->magic != DS_CLIENT_MAGIC ? -DS_ECORRUPT : -DS_EVERSION;
        munmap(p, sizeof(struct ds_client_page));
        return e;
    }
    *out = cp;
    return 0;
}

/* ds_self_identity fills the identity of the calling process (docs/internals.md "Process identity"). */
static inline int ds_self_identity(uint32_t *nspid, uint64_t *pidns_ino, uint64_t *start_time)
{
    if (nspid == NULL || pidns_ino == NULL || start_time == NULL)
        return -EINVAL;
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) != 0)
        return -errno;
    *pidns_ino = (uint64_t)st.st_ino;
    *nspid = (uint32_t)getpid(); /* getpid() is the PID in the caller's own namespace */
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -EIO;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return -EIO;
    /* after ") " comes field 3; starttime is field 22 */
    int field = 2;
    for (char *q = p + 1; *q; q++) {
        if (*q == ' ') {
            field++;
            if (field == 22) {
                unsigned long long v = 0;
                if (sscanf(q + 1, "%llu", &v) != 1)
                    return -EIO;
                *start_time = v;
                return 0;
            }
        }
    }
    return -EIO;
}

/* ds_proc_attach claims a process entry: CAS FREE->CLAIMING, heartbeat, identity, CAS CLAIMING->LIVE (a reaper
 * may take back a claim that looked stuck; then the next entry is tried). Returns the index or a negative errno. */
static inline int ds_proc_attach(struct ds_client_page *cp, uint32_t nspid, uint64_t pidns_ino, uint64_t start_time,
                                 uint64_t host_pid)
{
    if (cp == NULL)
        return -EINVAL;
    for (uint32_t i = 0; i < DS_MAX_PROCS; i++) {
        struct ds_proc *p = &cp->procs[i];
        uint32_t expect = DS_PROC_FREE;
        if (!__atomic_compare_exchange_n(&p->state, &expect, DS_PROC_CLAIMING, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            continue;
        __atomic_store_n(&p->heartbeat_ns, ds_monotonic_ns(), __ATOMIC_RELAXED);
        __atomic_store_n(&p->nspid, nspid, __ATOMIC_RELAXED);
        __atomic_store_n(&p->pidns_ino, pidns_ino, __ATOMIC_RELAXED);
        __atomic_store_n(&p->start_time, start_time, __ATOMIC_RELAXED);
        __atomic_store_n(&p->host_pid, host_pid, __ATOMIC_RELAXED);
        __atomic_store_n(&p->mem_used, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&p->launches, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&p->busy_ns, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&p->queued, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&p->busy, 0, __ATOMIC_RELAXED);
        expect = DS_PROC_CLAIMING;
        if (__atomic_compare_exchange_n(&p->state, &expect, DS_PROC_LIVE, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            return (int)i;
    }
    return -ENOSPC;
}

static inline void ds_sub_saturating(uint64_t *addr, uint64_t v)
{
    uint64_t old = __atomic_load_n(addr, __ATOMIC_RELAXED), n;
    do {
        n = old > v ? old - v : 0;
    } while (!__atomic_compare_exchange_n(addr, &old, n, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
}

/* ds_proc_detach releases entry i at a clean exit, crediting its memory (and demand) back to the page and adding its
 * launches to the page total. */
static inline int ds_proc_detach(struct ds_client_page *cp, int i)
{
    if (cp == NULL || i < 0 || (uint32_t)i >= DS_MAX_PROCS)
        return -EINVAL;
    struct ds_proc *p = &cp->procs[i];
    uint32_t expect = DS_PROC_LIVE;
    if (!__atomic_compare_exchange_n(&p->state, &expect, DS_PROC_REAPING, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return -ESRCH;
    uint64_t mem = __atomic_exchange_n(&p->mem_used, 0, __ATOMIC_ACQ_REL);
    if (mem != 0)
        ds_sub_saturating(&cp->mem_used, mem);
    __atomic_fetch_add(&cp->launches, __atomic_exchange_n(&p->launches, 0, __ATOMIC_ACQ_REL), __ATOMIC_RELAXED);
    if (__atomic_exchange_n(&p->busy, 0, __ATOMIC_ACQ_REL) != 0) {
        uint32_t d = __atomic_load_n(&cp->demand, __ATOMIC_RELAXED);
        while (d > 0 && !__atomic_compare_exchange_n(&cp->demand, &d, d - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        }
        __atomic_fetch_add(&cp->demand_seq, 1, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&p->heartbeat_ns, ds_monotonic_ns(), __ATOMIC_RELAXED);
    __atomic_store_n(&p->state, DS_PROC_FREE, __ATOMIC_RELEASE);
    return 0;
}

/* ds_mem_charge accounts size bytes for entry i against limit (0 = unlimited) with a CAS loop on the tenant-wide
 * total. Returns 0, or -ENOMEM (counted in oom_refusals) when it does not fit. */
static inline int ds_mem_charge(struct ds_client_page *cp, int i, uint64_t size, uint64_t limit)
{
    if (cp == NULL || i < 0 || (uint32_t)i >= DS_MAX_PROCS)
        return -EINVAL;
    uint64_t old = __atomic_load_n(&cp->mem_used, __ATOMIC_RELAXED), n;
    do {
        n = old + size;
        if (limit != 0 && (n > limit || n < old)) {
            __atomic_fetch_add(&cp->oom_refusals, 1, __ATOMIC_RELAXED);
            return -ENOMEM;
        }
    } while (!__atomic_compare_exchange_n(&cp->mem_used, &old, n, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
    uint64_t pk = __atomic_load_n(&cp->mem_peak, __ATOMIC_RELAXED);
    while (n > pk && !__atomic_compare_exchange_n(&cp->mem_peak, &pk, n, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
    }
    __atomic_fetch_add(&cp->procs[i].mem_used, size, __ATOMIC_RELAXED);
    return 0;
}

static inline int ds_mem_uncharge(struct ds_client_page *cp, int i, uint64_t size)
{
    if (cp == NULL || i < 0 || (uint32_t)i >= DS_MAX_PROCS)
        return -EINVAL;
    ds_sub_saturating(&cp->procs[i].mem_used, size);
    ds_sub_saturating(&cp->mem_used, size);
    return 0;
}

#endif /* DETSHARE_TABLE_CLIENT_H */
