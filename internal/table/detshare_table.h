/*
 * detshare_table.h — the binary layout of DetShare's host-wide shared-memory table.
 *
 * This header is the single source of truth for the layout. libdetshare includes it; the Go package
 * github.com/detshare/detshare/internal/table mirrors it and its tests compile a C program against this header
 * and fail when any size or offset differs. Change a layout here, bump DS_TABLE_ABI_VERSION, then the mirror.
 *
 * Files under the run directory (default /run/detshare, see docs/table.md):
 *   table              global table: header, GPUs, containers. Written by root on the host only; containers map
 *                      it read-only. Registration (hook, shim, `detshare run`) writes container identity and
 *                      quota under flock(table.lock); the scheduler leader is the only writer of grants,
 *                      GPU splits' mode/MPS state and temporal tokens.
 *   doorbell           one page; clients increment ds_doorbell.seq and FUTEX_WAKE it when their demand changes;
 *                      the scheduler FUTEX_WAITs on it. The only region every tenant may write.
 *   clients/<id>.page  one client page per container, mapped read-write only by that container's processes.
 *
 * Rules: every field that is read concurrently is accessed with C11 atomics (Go: sync/atomic). All integers are
 * little-endian, naturally aligned; explicit padding keeps C and Go identical.
 */
#ifndef DETSHARE_TABLE_H
#define DETSHARE_TABLE_H

#include <stdint.h>

#define DS_TABLE_MAGIC        0x3142415448534544ULL /* "DESHTAB1" little-endian */
#define DS_CLIENT_MAGIC       0x31544e4c43534544ULL /* "DESCLNT1" */
#define DS_DOORBELL_MAGIC     0x314c4542524f4444ULL /* "DDORBEL1" */
#define DS_TABLE_ABI_VERSION  2u /* 2: pinned flag, SLO, dispatch gate, latency histogram (issue 12) */

#define DS_MAX_GPUS           16u
#define DS_MAX_CONTAINERS     256u
#define DS_MAX_SM_GROUPS      64u   /* a grant is a 64-bit mask of groups of the GPU's split */
#define DS_MAX_PROCS          64u   /* processes per container */
#define DS_ID_LEN             128u  /* container ID / tenant name, NUL-terminated */

/* ds_table_header.state */
enum { DS_TABLE_INITIALISING = 0, DS_TABLE_READY = 1 };

/* ds_gpu.state */
enum { DS_GPU_ABSENT = 0, DS_GPU_PRESENT = 1 };
/* ds_gpu.split_state: whoever learns the split first (scheduler or a client) CASes UNKNOWN->PUBLISHING,
 * fills the fields, then stores PUBLISHED with release order. */
enum { DS_SPLIT_UNKNOWN = 0, DS_SPLIT_PUBLISHING = 1, DS_SPLIT_PUBLISHED = 2 };
/* ds_gpu.mps_state */
enum { DS_MPS_UNKNOWN = 0, DS_MPS_ABSENT = 1, DS_MPS_RUNNING = 2, DS_MPS_FAILED = 3 };
/* ds_gpu.mode and ds_container.grant_mode */
enum { DS_MODE_NONE = 0, DS_MODE_SPATIAL = 1, DS_MODE_TEMPORAL = 2, DS_MODE_UNRESTRICTED = 3 };

/* ds_container.state */
enum { DS_SLOT_FREE = 0, DS_SLOT_RESERVED = 1, DS_SLOT_ACTIVE = 2, DS_SLOT_DRAINING = 3 };
/* ds_container.tier */
enum { DS_TIER_BEST_EFFORT = 0, DS_TIER_BURSTABLE = 1, DS_TIER_LATENCY_CRITICAL = 2 };
/* ds_container.role */
enum { DS_ROLE_NONE = 0, DS_ROLE_PREFILL = 1, DS_ROLE_DECODE = 2 };
/* ds_container.flags */
enum { DS_CF_LEND = 1u << 0,      /* a latency-critical tenant allows its idle groups to be lent */
       DS_CF_HOST_TENANT = 1u << 1, /* registered by `detshare run`, reaped when owner_pid dies */
       DS_CF_PINNED = 1u << 3       /* a latency-critical tenant runs on exactly its guarantee (never expands) */ };

/* ds_proc.state */
enum { DS_PROC_FREE = 0, DS_PROC_CLAIMING = 1, DS_PROC_LIVE = 2, DS_PROC_REAPING = 3 };

struct ds_table_header {                 /* 4096 bytes at offset 0 */
    uint64_t magic;                      /*   0 */
    uint32_t abi_version;                /*   8 */
    uint32_t header_size;                /*  12 sizeof(struct ds_table_header) */
    uint64_t table_size;                 /*  16 total file size */
    uint32_t max_gpus;                   /*  24 */
    uint32_t max_containers;             /*  28 */
    uint32_t gpu_entry_size;             /*  32 */
    uint32_t container_entry_size;       /*  36 */
    uint64_t gpus_offset;                /*  40 */
    uint64_t containers_offset;          /*  48 */
    uint64_t created_ns;                 /*  56 CLOCK_REALTIME */
    uint64_t generation;                 /*  64 bumped by every register/deregister */
    uint32_t n_gpus;                     /*  72 */
    uint32_t state;                      /*  76 DS_TABLE_* */
    uint64_t sched_pid;                  /*  80 host PID of the scheduler leader, 0 if none */
    uint64_t sched_start_time;           /*  88 its /proc/<pid>/stat starttime */
    uint64_t sched_heartbeat_ns;         /*  96 CLOCK_MONOTONIC, refreshed by the leader */
    uint64_t sched_epoch;                /* 104 incremented at every leader takeover */
    uint32_t policy;                     /* 112 scheduler policy id (informational) */
    uint32_t flags;                      /* 116 */
    uint8_t  reserved[4096 - 120];
};

struct ds_gpu {                          /* 1024 bytes each */
    uint32_t state;                      /*   0 DS_GPU_* */
    uint32_t index;                      /*   4 */
    char     uuid[64];                   /*   8 "GPU-…" or "SIM-…" for the simulated GPU */
    char     name[64];                   /*  72 */
    uint64_t mem_total;                  /* 136 bytes */
    uint32_t sm_count;                   /* 144 */
    uint32_t split_state;                /* 148 DS_SPLIT_* */
    uint32_t split_min_size;             /* 152 minSmPartitionSize the split was made with */
    uint32_t split_alignment;            /* 156 smCoscheduledAlignment */
    uint32_t n_groups;                   /* 160 full groups of the split (the remainder is not a group) */
    uint32_t remainder_sms;              /* 164 SMs left over by the split */
    uint32_t group_sms[DS_MAX_SM_GROUPS];/* 168 SMs in each group */
    uint32_t mps_state;                  /* 424 DS_MPS_* */
    uint32_t mode;                       /* 428 DS_MODE_SPATIAL with MPS, DS_MODE_TEMPORAL without */
    char     mps_pipe_dir[128];          /* 432 host path of this GPU's MPS pipe directory */
    uint32_t token_seq;                  /* 560 futex word: bumped at every temporal token change */
    uint32_t token_holder;               /* 564 container slot + 1 holding the token, 0 = none */
    uint32_t token_holder_gen;           /* 568 that slot's generation */
    uint32_t pad0;                       /* 572 */
    uint64_t token_deadline_ns;          /* 576 CLOCK_MONOTONIC end of the current quantum */
    uint64_t grant_changes;              /* 584 grants published on this GPU */
    uint64_t pressure_compute_ppm;       /* 592 sum of the tenants' busy fractions, millionths (placement) */
    uint64_t pressure_mem_bytes;         /* 600 sum of the device memory they hold */
    uint64_t pressure_ns;                /* 608 CLOCK_REALTIME when the scheduler published them; 0 never */
    uint8_t  reserved[1024 - 616];
};

#define DS_SLO_ACTIVE         1u  /* the controller has stepped at least once */
#define DS_SLO_MISS           2u  /* the last window was above the SLO */
#define DS_SLO_INFEASIBLE     4u  /* missed at the most protective share: not attainable beside these neighbours */
#define DS_SLO_HOLDING        8u  /* not attainable: holding the largest share within 10 % of the floor */

struct ds_container {                    /* 512 bytes each */
    uint32_t state;                      /*   0 DS_SLOT_* */
    uint32_t gen;                        /*   4 incremented at every registration of this slot */
    char     id[DS_ID_LEN];              /*   8 */
    uint32_t tier;                       /* 136 DS_TIER_* */
    uint32_t role;                       /* 140 DS_ROLE_* */
    int32_t  gpu;                        /* 144 GPU index */
    uint32_t weight;                     /* 148 share of what is not guaranteed, >= 1 */
    uint32_t sm_groups_req;              /* 152 guaranteed SM groups (0 for best-effort) */
    uint32_t sm_req;                     /* 156 guaranteed SMs after rounding to groups */
    uint64_t mem_limit;                  /* 160 bytes; 0 = unlimited */
    uint64_t registered_ns;              /* 168 CLOCK_REALTIME */
    uint64_t owner_pid;                  /* 176 host PID owning a host tenant (DS_CF_HOST_TENANT), else 0 */
    uint64_t owner_start;                /* 184 its starttime */
    uint32_t flags;                      /* 192 DS_CF_* */
    uint32_t pad0;                       /* 196 */
    /* grant: written by the scheduler leader (registration resets it when the slot changes hands), seqlock
     * protected; writers take the seqlock by CAS even->odd so the two never write at once */
    uint32_t grant_seq;                  /* 200 odd while the grant is being written */
    uint32_t grant_epoch;                /* 204 futex word; +1 at every grant change (fast path compares it) */
    uint64_t grant_groups;               /* 208 bit i = group i of the GPU's split */
    uint32_t grant_sms;                  /* 216 SMs in grant_groups */
    uint32_t grant_mode;                 /* 220 DS_MODE_* */
    uint64_t grant_ns;                   /* 224 CLOCK_MONOTONIC when published */
    uint64_t demand_seen_ns;             /* 232 CLOCK_MONOTONIC when the scheduler saw the demand it answered */
    uint8_t  reserved[480 - 240];
    /* issue 12: placed at the end of the entry, away from fields other changes add at 240 */
    uint32_t slo_p99_us;                 /* 480 latency target (detshare.io/slo-p99), 0 = none; registration */
    uint32_t gate_depth;                 /* 484 dispatch gate: kernels in flight per stream, 0 = no gate; scheduler,
                                          *     written before the grant epoch it goes with */
    uint32_t gate_budget_us;             /* 488 dispatch gate: estimated run time of those kernels; scheduler */
    uint32_t narrow_groups;              /* 492 issue 26: groups of its grant (the lowest) its memory-bound kernels run on
                                          *     while a latency-critical tenant shares the GPU, 0 = the whole grant;
                                          *     scheduler, written before the grant epoch it goes with */
    /* issue 26: the SLO controller's last decision for a latency-critical tenant with slo_p99_us; scheduler,
     * informational (status, top, metrics) */
    uint32_t slo_given_back;             /* 496 SM groups of its expansion given to lower tiers while it is busy */
    uint32_t slo_state;                  /* 500 DS_SLO_* bits */
    uint32_t slo_window_p99_us;          /* 504 P99 of the controller's last window */
    uint32_t slo_floor_us;               /* 508 P99 measured at the most protective share (0: not measured) */
};

struct ds_proc {                         /* 128 bytes; one per process of a container, in its client page */
    uint32_t state;                      /*   0 DS_PROC_* (claimed by CAS FREE->CLAIMING->LIVE) */
    uint32_t nspid;                      /*   4 PID inside the process's own PID namespace */
    uint64_t pidns_ino;                  /*   8 inode of /proc/self/ns/pid */
    uint64_t start_time;                 /*  16 /proc/self/stat starttime (clock ticks since boot) */
    uint64_t host_pid;                   /*  24 host PID when known (host tenants), else 0 */
    uint64_t heartbeat_ns;               /*  32 CLOCK_MONOTONIC */
    uint64_t mem_used;                   /*  40 device bytes this process holds */
    uint64_t launches;                   /*  48 kernel launches (single writer: the process) */
    uint64_t busy_ns;                    /*  56 time with work queued */
    uint64_t queued;                     /*  64 launches submitted and not known complete */
    uint32_t busy;                       /*  72 1 while the process has work queued */
    uint32_t pad0;                       /*  76 */
    uint8_t  reserved[128 - 80];
};

#define DS_LAT_FINE_BUCKETS   64u
#define DS_LAT_FINE_SUB       8u        /* buckets per octave */
#define DS_LAT_FINE_MIN_OCT   6u        /* the first octave: [64, 128) us */

struct ds_client_page {                  /* one file per container: clients/<id>.page */
    uint64_t magic;                      /*    0 DS_CLIENT_MAGIC */
    uint32_t abi_version;                /*    8 */
    uint32_t slot;                       /*   12 index of the container in the table */
    uint32_t slot_gen;                   /*   16 ds_container.gen at registration */
    uint32_t max_procs;                  /*   20 DS_MAX_PROCS */
    char     id[DS_ID_LEN];              /*   24 */
    uint64_t mem_used;                   /*  152 container-wide device bytes; CAS against ds_container.mem_limit */
    uint64_t mem_peak;                   /*  160 */
    uint64_t oom_refusals;               /*  168 allocations refused by the quota */
    uint64_t launches;                   /*  176 launches of processes that have left (added at detach/reap);
                                          *       live processes count in their own ds_proc, off the launch path */
    uint32_t demand;                     /*  184 processes with queued work; > 0 means it wants SMs */
    uint32_t demand_seq;                 /*  188 bumped at every demand transition */
    uint64_t demand_since_ns;            /*  192 CLOCK_MONOTONIC of the last idle->busy transition */
    uint64_t busy_ns;                    /*  200 */
    uint64_t queue_delay_ns;             /*  208 cumulative wait for SMs or token */
    uint64_t queue_delay_max_ns;         /*  216 */
    /* issue 26: the same completions as lat_hist, 8 buckets per octave from 64 us (bucket 0: below 72 us) to
     * 16.4 ms (bucket 63: 15.36 ms and above), so that the scheduler can hold a P99 target to within ~12%
     * (lat_hist's octaves over-report by up to 2x) */
    uint64_t lat_fine[64];               /*  224 see DS_LAT_FINE_* */
    /* issue 12 (at the end of the header part): completion latency, measured by the library off the launch path.
     * Counters only ever increase; the scheduler works on differences. */
    uint64_t lat_count;                  /*  736 completions observed (synchronisations that waited for work) */
    uint64_t lat_sum_ns;                 /*  744 their summed latency */
    uint64_t gate_waits;                 /*  752 launches the dispatch gate held back */
    uint64_t gate_wait_ns;               /*  760 time they waited */
    uint64_t lat_hist[32];               /*  768 bucket i: latency in [2^i, 2^(i+1)) us (0: below 2 us) */
    struct ds_proc procs[DS_MAX_PROCS];  /* 1024 */
};

struct ds_doorbell {                     /* the doorbell file, one page */
    uint64_t magic;                      /*  0 DS_DOORBELL_MAGIC */
    uint32_t seq;                        /*  8 futex word */
    uint32_t pad0;                       /* 12 */
    uint8_t  reserved[4096 - 16];
};

#define DS_GPUS_OFFSET        4096u
#define DS_CONTAINERS_OFFSET  (DS_GPUS_OFFSET + DS_MAX_GPUS * 1024u)
#define DS_TABLE_SIZE         (DS_CONTAINERS_OFFSET + DS_MAX_CONTAINERS * 512u)

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(struct ds_table_header) == 4096, "ds_table_header size");
_Static_assert(sizeof(struct ds_gpu) == 1024, "ds_gpu size");
_Static_assert(sizeof(struct ds_container) == 512, "ds_container size");
_Static_assert(sizeof(struct ds_proc) == 128, "ds_proc size");
_Static_assert(sizeof(struct ds_client_page) == 1024 + 128 * DS_MAX_PROCS, "ds_client_page size");
_Static_assert(sizeof(struct ds_doorbell) == 4096, "ds_doorbell size");
#endif

#endif /* DETSHARE_TABLE_H */
