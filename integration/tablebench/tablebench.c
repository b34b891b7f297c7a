/*
 * tablebench — C micro-benchmarks of the table's client fast path (detshare_table_client.h):
 *   BenchmarkCGrantEpoch          ds_grant_epoch(): the per-launch check
 *   BenchmarkCGrantRead           ds_grant_read(): seqlock read of a quiescent grant
 *   BenchmarkCGrantReadContended  ds_grant_read() while another thread publishes grants (torn reads are counted
 *                                 and make the program fail)
 * Usage: tablebench [-n ITERATIONS]. It builds a private table file in $TMPDIR, maps it read-only exactly like a
 * client, and prints Go-benchmark-style lines. Exit status 0 = every read was consistent.
 */
#include <pthread.h>
#include <stdlib.h>

#include "internal/table/detshare_table_client.h"

static struct ds_container *wc; /* the writer's (read-write) view of the benchmarked slot */
static int stop_writer;          /* atomic */

static void publish(struct ds_container *c, uint64_t groups)
{
    uint32_t s = __atomic_load_n(&c->grant_seq, __ATOMIC_RELAXED);
    __atomic_store_n(&c->grant_seq, s + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&c->grant_groups, groups, __ATOMIC_RELAXED);
    __atomic_store_n(&c->grant_sms, 8u * (uint32_t)__builtin_popcountll(groups), __ATOMIC_RELAXED);
    __atomic_store_n(&c->grant_mode, DS_MODE_SPATIAL, __ATOMIC_RELAXED);
    __atomic_store_n(&c->grant_seq, s + 2, __ATOMIC_RELEASE);
    __atomic_fetch_add(&c->grant_epoch, 1, __ATOMIC_RELEASE);
}

static void *writer(void *arg)
{
    (void)arg;
    uint64_t g = 1;
    while (!__atomic_load_n(&stop_writer, __ATOMIC_RELAXED)) {
        g = g * 6364136223846793005ull + 1442695040888963407ull;
        publish(wc, g);
    }
    return NULL;
}

static double now_s(void) { return (double)ds_monotonic_ns() / 1e9; }

int main(int argc, char **argv)
{
    long n = 50000000;
    if (argc == 3 && strcmp(argv[1], "-n") == 0)
        n = strtol(argv[2], NULL, 10);
    else if (argc != 1) {
        fprintf(stderr, "usage: %s [-n ITERATIONS]\n", argv[0]);
        return 2;
    }
    if (n <= 0) {
        fprintf(stderr, "tablebench: -n must be > 0\n");
        return 2;
    }
    const char *tmp = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tablebench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, DS_TABLE_SIZE) != 0) {
        perror("tablebench: table file");
        return 1;
    }
    struct ds_table_header *h = mmap(NULL, DS_TABLE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (h == MAP_FAILED) {
        perror("tablebench: mmap");
        unlink(path);
        return 1;
    }
    h->magic = DS_TABLE_MAGIC;
    h->abi_version = DS_TABLE_ABI_VERSION;
    h->header_size = sizeof *h;
    h->table_size = DS_TABLE_SIZE;
    h->max_gpus = DS_MAX_GPUS;
    h->max_containers = DS_MAX_CONTAINERS;
    h->gpu_entry_size = sizeof(struct ds_gpu);
    h->container_entry_size = sizeof(struct ds_container);
    h->gpus_offset = DS_GPUS_OFFSET;
    h->containers_offset = DS_CONTAINERS_OFFSET;
    h->state = DS_TABLE_READY;
    wc = (struct ds_container *)(uintptr_t)ds_table_container(h, 7);
    wc->state = DS_SLOT_ACTIVE;
    publish(wc, 0xff);

    const struct ds_table_header *ro;
    int rc = ds_table_map_ro(path, &ro);
    unlink(path);
    if (rc != 0) {
        fprintf(stderr, "tablebench: ds_table_map_ro: %d\n", rc);
        return 1;
    }
    const struct ds_container *c = ds_table_container(ro, 7);
    struct ds_grant g;
    uint64_t sink = 0;

    double t0 = now_s();
    for (long i = 0; i < n; i++)
        sink += ds_grant_epoch(c);
    double t1 = now_s();
    printf("BenchmarkCGrantEpoch %ld %.2f ns/op\n", n, (t1 - t0) * 1e9 / (double)n);

    t0 = now_s();
    for (long i = 0; i < n; i++) {
        if (ds_grant_read(c, &g) != 0)
            return 1;
        sink += g.groups;
    }
    t1 = now_s();
    printf("BenchmarkCGrantRead %ld %.2f ns/op\n", n, (t1 - t0) * 1e9 / (double)n);

    pthread_t th;
    if (pthread_create(&th, NULL, writer, NULL) != 0) {
        fprintf(stderr, "tablebench: pthread_create failed\n");
        return 1;
    }
    long torn = 0, busy = 0, m = n / 10 > 0 ? n / 10 : 1;
    t0 = now_s();
    for (long i = 0; i < m; i++) {
        if (ds_grant_read(c, &g) != 0) {
            busy++;
            continue;
        }
        if (g.sms != 8u * (uint32_t)__builtin_popcountll(g.groups))
            torn++;
        sink += g.groups;
    }
    t1 = now_s();
    __atomic_store_n(&stop_writer, 1, __ATOMIC_RELAXED);
    pthread_join(th, NULL);
    printf("BenchmarkCGrantReadContended %ld %.2f ns/op (torn %ld, gave up %ld)\n", m, (t1 - t0) * 1e9 / (double)m,
           torn, busy);
    if (sink == 42)
        printf("\n"); /* keep sink alive */
    return torn == 0 ? 0 : 1;
}
