/*
 * bench_launch.c — what libdetshare adds to a kernel launch. Looks cuLaunchKernel up the way cudart does
 * (cuGetProcAddress_v2) and times batches of launches against whatever libcuda.so.1 the loader finds (the null
 * driver for the number we report). Run it with and without LD_PRELOAD=libdetshare.so; the difference of the two
 * medians is the per-launch cost. Prints: median_ns=<per launch> p99_ns=<per launch> batches=<n>.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cgroupgpu/cuda/cuda_abi.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static unsigned long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int batches = argc > 1 ? atoi(argv[1]) : 2000;
    int per = argc > 2 ? atoi(argv[2]) : 1000;
    if (batches < 1 || batches > 1000000 || per < 1 || per > 1000000) {
        fprintf(stderr, "usage: ds_bench_launch [batches 1..1000000] [launches per batch 1..1000000]\n");
        return 2;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    PFN_cuGetProcAddress_v2 gp = h ? (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (!gp) {
        fprintf(stderr, "no libcuda.so.1 with cuGetProcAddress_v2: %s\n", dlerror());
        return 3;
    }
    PFN_cuInit init = NULL;
    PFN_cuLaunchKernel launch = NULL;
    if (gp("cuInit", (void **)&init, 2000, 0, NULL) || gp("cuLaunchKernel", (void **)&launch, 4000, 0, NULL) ||
        init(0)) {
        fprintf(stderr, "driver lookup/init failed\n");
        return 3;
    }
    double *v = malloc(sizeof(double) * (size_t)batches);
    if (!v)
        return 3;
    for (int w = 0; w < per * 10; w++)
        launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    for (int b = 0; b < batches; b++) {
        unsigned long long t0 = now_ns();
        for (int i = 0; i < per; i++)
            if (launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS)
                return 4;
        v[b] = (double)(now_ns() - t0) / per;
    }
    qsort(v, (size_t)batches, sizeof v[0], cmp);
    printf("median_ns=%.2f p99_ns=%.2f batches=%d per_batch=%d\n", v[batches / 2], v[(batches * 99) / 100], batches,
           per);
    return 0;
}
