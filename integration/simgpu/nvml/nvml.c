/*
 * nvml.c — a simulated libnvidia-ml.so.1, part of the simulated GPU TEST DOUBLE (not NVIDIA's NVML).
 *
 * It reads the same shared state file as the simulated libcuda.so.1 (state.c is compiled into both), so
 * nvmlDeviceGetMemoryInfo sees the memory that processes allocated through the simulated driver, and
 * nvmlDeviceGetComputeRunningProcesses lists the processes holding device memory. Only the calls DetShare and its
 * tests use are provided; NVML's own declarations are written here (no NVIDIA headers).
 */
#include "../src/simgpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
};
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

#define EXPORT __attribute__((visibility("default")))

/* Device handles are addresses inside this table, so they compare equal across calls. */
static struct nvmlDevice_st {
    int index;
} g_devs[SIM_MAX_DEVICES];
static atomic_int g_inits;

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&g_sim.lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (!g_sim.st && sim_state_open() != CUDA_SUCCESS)
        r = NVML_ERROR_DRIVER_NOT_LOADED;
    for (int i = 0; i < SIM_MAX_DEVICES; i++)
        g_devs[i].index = i;
    pthread_mutex_unlock(&g_sim.lock);
    if (r == NVML_SUCCESS)
        atomic_fetch_add(&g_inits, 1);
    return r;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}
EXPORT nvmlReturn_t nvmlShutdown(void) {
    int n = atomic_load(&g_inits);
    while (n > 0 && !atomic_compare_exchange_weak(&g_inits, &n, n - 1)) {
    }
    return n > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

#define CHECK_INIT()                                                                                                   \
    do {                                                                                                               \
        if (atomic_load(&g_inits) <= 0)                                                                                \
            return NVML_ERROR_UNINITIALIZED;                                                                           \
    } while (0)

static int dev_index(nvmlDevice_t d) {
    if (d < &g_devs[0] || d >= &g_devs[g_sim.ndev])
        return -1;
    return d->index;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    CHECK_INIT();
    if (!version || length < 2)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((unsigned)snprintf(version, length, "580.00-simgpu") >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = SIM_DRIVER_VERSION;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    CHECK_INIT();
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)g_sim.ndev;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    CHECK_INIT();
    if (!device || index >= (unsigned)g_sim.ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devs[index];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    CHECK_INIT();
    int i = dev_index(device);
    if (i < 0 || !index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)i;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    CHECK_INIT();
    if (dev_index(device) < 0 || !name || length == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((unsigned)snprintf(name, length, "DetShare simulated GPU") >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    return NVML_SUCCESS;
}

/* "GPU-" + the hex of the same 16 bytes cuDeviceGetUuid returns, in NVML's 8-4-4-4-12 layout. */
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    CHECK_INIT();
    int i = dev_index(device);
    if (i < 0 || !uuid)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned char b[16] = {'S', 'I', 'M', '-', 'D', 'E', 'T', 'S', 'H', 'A', 'R', 'E', 0, 0, 0, 0};
    b[12] = (unsigned char)(g_sim.nsms >> 8);
    b[13] = (unsigned char)(g_sim.nsms & 0xff);
    b[15] = (unsigned char)i;
    int n = snprintf(uuid, length,
                     "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                     b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return n < 0 || (unsigned)n >= length ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    CHECK_INIT();
    if (dev_index(device) < 0 || !major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = 9;
    *minor = 0;
    return NVML_SUCCESS;
}

static void mem_numbers(int dev, unsigned long long *total, unsigned long long *used) {
    sim_shared_lock();
    sim_reap_dead_procs();
    *used = atomic_load(&g_sim.st->dev[dev].mem_used);
    sim_shared_unlock();
    *total = g_sim.mem_total;
    if (*used > *total)
        *used = *total;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    CHECK_INIT();
    int i = dev_index(device);
    if (i < 0 || !memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    mem_numbers(i, &memory->total, &memory->used);
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    CHECK_INIT();
    int i = dev_index(device);
    if (i < 0 || !memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    mem_numbers(i, &memory->total, &memory->used);
    memory->reserved = 0;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

/* Processes with device memory on the device, from the state file's process slots. */
static nvmlReturn_t procs(nvmlDevice_t device, unsigned int *count, void *infos, size_t stride, bool v1) {
    CHECK_INIT();
    int d = dev_index(device);
    if (d < 0 || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0, cap = *count;
    nvmlReturn_t r = NVML_SUCCESS;
    sim_shared_lock();
    sim_reap_dead_procs();
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        const struct sim_proc_slot *p = &g_sim.st->procs[i];
        if (!p->live || !p->mem[d])
            continue;
        if (n < cap && infos) {
            unsigned char *e = (unsigned char *)infos + n * stride;
            if (v1)
                *(nvmlProcessInfo_v1_t *)(void *)e = (nvmlProcessInfo_v1_t){(unsigned)p->pid, p->mem[d]};
            else
                *(nvmlProcessInfo_t *)(void *)e = (nvmlProcessInfo_t){(unsigned)p->pid, p->mem[d], 0xffffffffu,
                                                                      0xffffffffu};
        } else {
            r = NVML_ERROR_INSUFFICIENT_SIZE;
        }
        n++;
    }
    sim_shared_unlock();
    *count = n;
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos) {
    return procs(device, infoCount, infos, sizeof *infos, false);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos) {
    return procs(device, infoCount, infos, sizeof *infos, false);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                          nvmlProcessInfo_v1_t *infos) {
    return procs(device, infoCount, infos, sizeof *infos, true);
}

/* The architecture of the simulated GPU: NVML_DEVICE_ARCH_HOPPER, as its compute capability 9.0 says. */
EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch) {
    CHECK_INIT();
    if (dev_index(device) < 0 || !arch)
        return NVML_ERROR_INVALID_ARGUMENT;
    *arch = 9;
    return NVML_SUCCESS;
}

/*
 * Events. A test injects a critical Xid on GPU N by appending the line "N XID" to the Xid file: DETSHARE_SIMGPU_XID,
 * or else the state file's path + ".xid". An event set delivers the lines appended after it was created, for the
 * devices registered for nvmlEventTypeXidCriticalError, as that event (eventData: the Xid), in order; a line naming
 * an unregistered device or malformed is skipped. The line "lost" makes that wait return NVML_ERROR_GPU_IS_LOST, as the
 * driver does when a GPU falls off the bus (it names no GPU). DETSHARE_SIMGPU_NVML_EVENTS=0 models a driver without event
 * support: nvmlEventSetCreate and nvmlDeviceRegisterEvents return NVML_ERROR_NOT_SUPPORTED.
 */
#define SIM_EVENT_XID_CRITICAL 8ull /* nvmlEventTypeXidCriticalError */
#define SIM_EVENT_SBE 1ull          /* nvmlEventTypeSingleBitEccError */
#define SIM_EVENT_DBE 2ull          /* nvmlEventTypeDoubleBitEccError */
#define SIM_EVENT_SUPPORTED (SIM_EVENT_XID_CRITICAL | SIM_EVENT_SBE | SIM_EVENT_DBE)

typedef struct nvmlEventSet_st {
    unsigned long long mask[SIM_MAX_DEVICES]; /* the event types registered per device */
    long offset;                              /* how far the Xid file was read */
    char path[4096 + 8];
} *nvmlEventSet_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

static bool events_supported(void) {
    const char *v = getenv("DETSHARE_SIMGPU_NVML_EVENTS");
    return !v || strcmp(v, "0") != 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    CHECK_INIT();
    if (dev_index(device) < 0 || !types)
        return NVML_ERROR_INVALID_ARGUMENT;
    *types = events_supported() ? SIM_EVENT_SUPPORTED : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    CHECK_INIT();
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!events_supported())
        return NVML_ERROR_NOT_SUPPORTED;
    struct nvmlEventSet_st *s = calloc(1, sizeof *s);
    if (!s)
        return NVML_ERROR_UNKNOWN;
    const char *p = getenv("DETSHARE_SIMGPU_XID");
    if (p && *p)
        snprintf(s->path, sizeof s->path, "%s", p);
    else
        snprintf(s->path, sizeof s->path, "%s.xid", g_sim.state_path);
    FILE *f = fopen(s->path, "r");
    if (f) {
        if (fseek(f, 0, SEEK_END) == 0)
            s->offset = ftell(f);
        fclose(f);
    }
    *set = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    CHECK_INIT();
    int i = dev_index(device);
    if (i < 0 || !set)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!events_supported() || (types & ~SIM_EVENT_SUPPORTED))
        return NVML_ERROR_NOT_SUPPORTED;
    set->mask[i] |= types;
    return NVML_SUCCESS;
}

/* next_xid reads the Xid file past set's offset up to the first whole line for a registered device (NVML_SUCCESS)
 * or "lost" (NVML_ERROR_GPU_IS_LOST); NVML_ERROR_TIMEOUT: none yet. */
static nvmlReturn_t next_xid(nvmlEventSet_t set, nvmlEventData_t *data) {
    FILE *f = fopen(set->path, "r");
    if (!f)
        return NVML_ERROR_TIMEOUT;
    bool found = false, lost = false;
    char line[128];
    if (fseek(f, set->offset, SEEK_SET) == 0) {
        while (!found && !lost && fgets(line, sizeof line, f)) {
            size_t n = strlen(line);
            if (n == 0 || line[n - 1] != '\n') /* a line still being written: read it next time */
                break;
            set->offset += (long)n;
            if (strcmp(line, "lost\n") == 0) {
                lost = true;
                break;
            }
            int dev;
            unsigned long long xid;
            if (sscanf(line, "%d %llu", &dev, &xid) != 2 || dev < 0 || dev >= g_sim.ndev ||
                !(set->mask[dev] & SIM_EVENT_XID_CRITICAL))
                continue;
            *data = (nvmlEventData_t){&g_devs[dev], SIM_EVENT_XID_CRITICAL, xid, 0xffffffffu, 0xffffffffu};
            found = true;
        }
    }
    fclose(f);
    return lost ? NVML_ERROR_GPU_IS_LOST : found ? NVML_SUCCESS : NVML_ERROR_TIMEOUT;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    CHECK_INIT();
    if (!set || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int waited = 0;; waited += 20) {
        nvmlReturn_t r = next_xid(set, data);
        if (r != NVML_ERROR_TIMEOUT)
            return r;
        if (waited >= timeoutms)
            return NVML_ERROR_TIMEOUT;
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
}
EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}
