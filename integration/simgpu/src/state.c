/*
 * state.c — configuration, the cross-process state file, time and logging of the simulated GPU (test double).
 *
 * The state file (DETSHARE_SIMGPU_STATE, default /dev/shm/detshare-simgpu-<uid>) is a struct sim_state mapped
 * shared by every process using the same simulated GPU. Its mutex is a robust process-shared pthread mutex: a
 * process that dies holding it cannot wedge the others (EOWNERDEAD is recovered). Each process owns a slot; it
 * holds an OFD byte-range lock on the file at SIM_SLOT_LOCK_BASE+slot for its lifetime, so a dead process (in any
 * PID namespace) is recognised by its lock having vanished, and its memory is given back.
 */
#include "simgpu.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SIM_SLOT_LOCK_BASE (1LL << 30)

struct sim_global g_sim = {.lock = PTHREAD_MUTEX_INITIALIZER, .state_fd = -1, .slot = -1};

unsigned mask_count(const sim_mask *m) {
    unsigned n = 0;
    for (unsigned i = 0; i < SIM_MASK_WORDS; i++)
        n += (unsigned)__builtin_popcountll(m->w[i]);
    return n;
}

void mask_range(sim_mask *m, unsigned first, unsigned n) {
    for (unsigned i = first; i < first + n && i < SIM_MAX_SMS; i++)
        mask_set(m, i);
}

uint64_t sim_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void sim_sleep_until(uint64_t t_ns) {
    /* The default 50 us timer slack would add itself to every simulated latency; 1 us keeps timings honest. */
    static _Thread_local bool slack_set;
    if (!slack_set) {
        prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
        slack_set = true;
    }
    if (t_ns <= sim_now_ns())
        return;
    struct timespec ts = {.tv_sec = (time_t)(t_ns / 1000000000ULL), .tv_nsec = (long)(t_ns % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

void sim_log(const char *fmt, ...) {
    if (!g_sim.verbose)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[detshare-simgpu test double] ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Errors in the configuration are always printed: a test that set a bad value must learn why cuInit failed. */
static void sim_config_error(const char *var, const char *val, const char *allowed) {
    fprintf(stderr, "[detshare-simgpu test double] cuInit: invalid %s=%s (allowed: %s)\n", var, val, allowed);
}

static bool parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-')
        return false;
    uint64_t mul = 1;
    if (*end) {
        if (!strcmp(end, "K") || !strcmp(end, "KiB"))
            mul = 1ULL << 10;
        else if (!strcmp(end, "M") || !strcmp(end, "MiB"))
            mul = 1ULL << 20;
        else if (!strcmp(end, "G") || !strcmp(end, "GiB"))
            mul = 1ULL << 30;
        else
            return false;
    }
    if (v > UINT64_MAX / mul)
        return false;
    *out = v * mul;
    return true;
}

/* DETSHARE_SIMGPU_CALLS=1: the counted driver calls on stderr at exit, one line a test can parse. */
__attribute__((destructor)) static void sim_print_calls(void) {
    const char *v = getenv("DETSHARE_SIMGPU_CALLS");
    if (!v || strcmp(v, "1"))
        return;
    /* device_op_sms: the SMs device-side copies and memsets ran on, as first-last ranges ("-" when none) */
    char sms[4 * SIM_MAX_SMS + 2] = "";
    size_t len = 0;
    for (unsigned i = 0; i < SIM_MAX_SMS && len + 16 < sizeof sms; i++) {
        if (!mask_has(&g_sim.device_op_sms, i) || (i && mask_has(&g_sim.device_op_sms, i - 1)))
            continue;
        unsigned j = i;
        while (j + 1 < SIM_MAX_SMS && mask_has(&g_sim.device_op_sms, j + 1))
            j++;
        len += (size_t)snprintf(sms + len, sizeof sms - len, "%s%u-%u", len ? "," : "", i, j);
    }
    fprintf(stderr, "simgpu-calls event_record=%lu stream_wait_event=%lu kernels=%lu device_ops=%lu device_op_sms=%s\n",
            atomic_load(&g_sim.calls_event_record), atomic_load(&g_sim.calls_stream_wait_event),
            atomic_load(&g_sim.calls_launch), atomic_load(&g_sim.calls_device_op), len ? sms : "-");
}

static CUresult sim_parse_config(void) {
    const char *v;
    uint64_t n;
    g_sim.verbose = (v = getenv("DETSHARE_SIMGPU_VERBOSE")) && *v && strcmp(v, "0");
    g_sim.ctx_sync_own = (v = getenv("DETSHARE_SIMGPU_CTX_SYNC")) && !strcmp(v, "own-context");
    g_sim.ndev = 1;
    if ((v = getenv("DETSHARE_SIMGPU_COUNT")) && *v) {
        if (!parse_u64(v, &n) || n < 1 || n > SIM_MAX_DEVICES) {
            sim_config_error("DETSHARE_SIMGPU_COUNT", v, "1..8");
            return CUDA_ERROR_INVALID_VALUE;
        }
        g_sim.ndev = (int)n;
    }
    g_sim.nsms = 132;
    if ((v = getenv("DETSHARE_SIMGPU_SMS")) && *v) {
        if (!parse_u64(v, &n) || n < SIM_SPLIT_MIN || n > SIM_MAX_SMS) {
            sim_config_error("DETSHARE_SIMGPU_SMS", v, "8..512");
            return CUDA_ERROR_INVALID_VALUE;
        }
        g_sim.nsms = (unsigned)n;
    }
    g_sim.mem_total = 80ULL << 30;
    if ((v = getenv("DETSHARE_SIMGPU_MEM")) && *v) {
        if (!parse_u64(v, &n) || n < (1ULL << 20)) {
            sim_config_error("DETSHARE_SIMGPU_MEM", v, "bytes >= 1048576, optional suffix K, M, G, KiB, MiB, GiB");
            return CUDA_ERROR_INVALID_VALUE;
        }
        g_sim.mem_total = n;
    }
    g_sim.mps = false;
    if ((v = getenv("DETSHARE_SIMGPU_MPS")) && *v) {
        if (!strcmp(v, "1"))
            g_sim.mps = true;
        else if (strcmp(v, "0")) {
            sim_config_error("DETSHARE_SIMGPU_MPS", v, "0, 1");
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (!g_sim.mps && (v = getenv("CUDA_MPS_PIPE_DIRECTORY")) && *v) {
        char path[4096];
        snprintf(path, sizeof path, "%s/control", v);
        g_sim.mps = access(path, F_OK) == 0;
    }
    g_sim.mps_mem_limit = 0;
    if (g_sim.mps) {
        uint64_t server = 0, client = 0;
        if ((v = getenv("CUDA_MPS_PIPE_DIRECTORY")) && *v) {
            char path[4096], buf[64] = {0};
            snprintf(path, sizeof path, "%s/pinned_mem_limit", v);
            FILE *f = fopen(path, "re");
            if (f) {
                if (fgets(buf, sizeof buf, f))
                    buf[strcspn(buf, "\n")] = 0;
                fclose(f);
                if (!parse_u64(buf, &server))
                    server = 0;
            }
        }
        if ((v = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")) && !strncmp(v, "0=", 2)) {
            unsigned long long x = 0;
            char unit = 0;
            if (sscanf(v + 2, "%llu%c", &x, &unit) == 2 && (unit == 'M' || unit == 'G'))
                client = (uint64_t)x << (unit == 'G' ? 30 : 20);
        }
        g_sim.mps_mem_limit = server && client ? (client < server ? client : server) : server ? server : client;
    }
    g_sim.active_thread_pct = 100;
    if ((v = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")) && *v) {
        if (!parse_u64(v, &n) || n < 1 || n > 100) {
            sim_config_error("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", v, "1..100");
            return CUDA_ERROR_INVALID_VALUE;
        }
        g_sim.active_thread_pct = (int)n;
    }
    return CUDA_SUCCESS;
}

void sim_shared_lock(void) {
    int r = pthread_mutex_lock(&g_sim.st->lock);
    if (r == EOWNERDEAD) {
        /* A process died inside the critical section. Every update under this lock leaves the state usable at
         * any point (times only grow, memory counters are re-derived from slots when reaping), so accept it. */
        pthread_mutex_consistent(&g_sim.st->lock);
        sim_log("recovered the state lock from a dead process");
    }
}

void sim_shared_unlock(void) { pthread_mutex_unlock(&g_sim.st->lock); }

uint64_t sim_next_id(void) {
    if (!g_sim.st)
        return 1;
    return atomic_fetch_add(&g_sim.st->next_id, 1) + 1;
}

static bool slot_alive(int i) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = SIM_SLOT_LOCK_BASE + i, .l_len = 1};
    if (fcntl(g_sim.state_fd, F_OFD_GETLK, &fl) < 0)
        return true; /* cannot tell: never reap on doubt */
    return fl.l_type != F_UNLCK;
}

static void slot_release(struct sim_proc_slot *p) {
    for (unsigned d = 0; d < SIM_MAX_DEVICES; d++) {
        uint64_t m = p->mem[d];
        if (m) {
            uint64_t used = atomic_load(&g_sim.st->dev[d].mem_used);
            atomic_store(&g_sim.st->dev[d].mem_used, used >= m ? used - m : 0);
        }
        p->mem[d] = 0;
    }
    p->live = 0;
    p->pid = 0;
}

void sim_reap_dead_procs(void) {
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        struct sim_proc_slot *p = &g_sim.st->procs[i];
        if (!p->live || i == g_sim.slot)
            continue;
        if (!slot_alive(i)) {
            sim_log("reaping dead process %d (slot %d)", p->pid, i);
            slot_release(p);
        }
    }
}

CUresult sim_state_open(void) {
    CUresult r = sim_parse_config();
    if (r != CUDA_SUCCESS)
        return r;
    char defpath[128];
    const char *path = getenv("DETSHARE_SIMGPU_STATE");
    if (!path || !*path) {
        snprintf(defpath, sizeof defpath, "/dev/shm/detshare-simgpu-%u", (unsigned)getuid());
        path = defpath;
    }
    snprintf(g_sim.state_path, sizeof g_sim.state_path, "%s", path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "[detshare-simgpu test double] cuInit: cannot open state file %s: %s\n", path,
                strerror(errno));
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    /* flock serialises creation only; it is released automatically if the creator dies. */
    while (flock(fd, LOCK_EX) < 0 && errno == EINTR) {
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0 || ((size_t)sb.st_size < sizeof(struct sim_state) &&
                               ftruncate(fd, (off_t)sizeof(struct sim_state)) < 0)) {
        fprintf(stderr, "[detshare-simgpu test double] cuInit: cannot size state file %s: %s\n", path,
                strerror(errno));
        close(fd);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    struct sim_state *st = mmap(NULL, sizeof *st, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (st == MAP_FAILED) {
        fprintf(stderr, "[detshare-simgpu test double] cuInit: cannot map state file %s: %s\n", path,
                strerror(errno));
        close(fd);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    if (st->magic != SIM_STATE_MAGIC || st->version != SIM_STATE_VERSION) {
        memset(st, 0, sizeof *st);
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&st->lock, &a);
        pthread_mutexattr_destroy(&a);
        st->ndev = (uint32_t)g_sim.ndev;
        st->nsms = g_sim.nsms;
        st->mem_total = g_sim.mem_total;
        st->version = SIM_STATE_VERSION;
        atomic_thread_fence(memory_order_release);
        st->magic = SIM_STATE_MAGIC;
    } else if (st->ndev != (uint32_t)g_sim.ndev || st->nsms != g_sim.nsms || st->mem_total != g_sim.mem_total) {
        /* The device is what the first process made it; a later process cannot reshape it. */
        sim_log("state file %s describes %u GPU(s) x %u SMs, %llu bytes; using that instead of the environment",
                path, st->ndev, st->nsms, (unsigned long long)st->mem_total);
        g_sim.ndev = (int)st->ndev;
        g_sim.nsms = st->nsms;
        g_sim.mem_total = st->mem_total;
    }
    flock(fd, LOCK_UN);
    g_sim.st = st;
    g_sim.state_fd = fd;
    g_sim.pid = (int)getpid();

    sim_shared_lock();
    int slot = -1;
    for (int i = 0; i < SIM_MAX_PROCS && slot < 0; i++) {
        struct sim_proc_slot *p = &st->procs[i];
        if (p->live && slot_alive(i))
            continue;
        if (p->live)
            slot_release(p);
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = SIM_SLOT_LOCK_BASE + i, .l_len = 1};
        if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
            slot = i;
    }
    if (slot >= 0) {
        st->procs[slot].pid = g_sim.pid;
        st->procs[slot].live = 1;
        memset(st->procs[slot].mem, 0, sizeof st->procs[slot].mem);
    }
    sim_shared_unlock();
    if (slot < 0) {
        fprintf(stderr, "[detshare-simgpu test double] cuInit: all %d process slots of %s are in use\n",
                SIM_MAX_PROCS, path);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g_sim.slot = slot;
    sim_log("state %s: %d GPU(s), %u SMs, %llu bytes, MPS %s, slot %d", path, g_sim.ndev, g_sim.nsms,
            (unsigned long long)g_sim.mem_total, g_sim.mps ? "on" : "off", slot);
    return CUDA_SUCCESS;
}

int sim_compute_mode(int dev) {
    char path[4200], buf[64] = {0};
    snprintf(path, sizeof path, "%s.compute-mode-%d", g_sim.state_path, dev);
    FILE *f = fopen(path, "re");
    if (!f)
        return CU_COMPUTEMODE_DEFAULT;
    if (!fgets(buf, sizeof buf, f))
        buf[0] = 0;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    return !strcmp(buf, "exclusive_process") ? CU_COMPUTEMODE_EXCLUSIVE_PROCESS : CU_COMPUTEMODE_DEFAULT;
}

bool sim_exclusive_refuses(int dev) {
    if (g_sim.mps || sim_compute_mode(dev) != CU_COMPUTEMODE_EXCLUSIVE_PROCESS)
        return false;
    sim_log("device %d is in EXCLUSIVE_PROCESS compute mode and this process is not an MPS client "
            "(CUDA_MPS_PIPE_DIRECTORY unset or changed): CUDA_ERROR_DEVICE_UNAVAILABLE", dev);
    return true;
}
