// smid_loop.cu — the application side of rebind.py: an unmodified CUDA program (runtime API, <<<>>> launches) that
// launches a short kernel back to back for a while and records, for every kernel, the host's CLOCK_MONOTONIC time
// before the launch, after it returns, and after the stream synchronised, plus the SM ids its blocks ran on.
// rebind.py runs it under libdetshare while it flips the tenant's grant, and reads the records.
//
//   nvcc -O2 -arch=sm_90 -o smid_loop integration/gpu/probes/smid_loop.cu
//   ./smid_loop OUT.json SECONDS [BLOCKS=128] [SPIN_CYCLES=20000]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <set>
#include <vector>

__global__ void smidk(unsigned *out, long long spin) {
    long long t = clock64();
    while (clock64() - t < spin) {
    }
    if (threadIdx.x == 0) {
        unsigned r;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
        out[blockIdx.x] = r;
    }
}

static long long mono_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

struct Rec {
    long long t0, t1, t2;
    std::set<unsigned> sms;
};

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s OUT.json SECONDS [BLOCKS] [SPIN_CYCLES]\n", argv[0]);
        return 2;
    }
    double secs = atof(argv[2]);
    int blocks = argc > 3 ? atoi(argv[3]) : 128;
    long long spin = argc > 4 ? atoll(argv[4]) : 20000;
    unsigned *d, *h;
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess || cudaMalloc(&d, blocks * 4) != cudaSuccess ||
        cudaMallocHost(&h, blocks * 4) != cudaSuccess) {
        fprintf(stderr, "smid_loop: CUDA setup failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    std::vector<Rec> recs;
    recs.reserve(200000);
    long long end = mono_ns() + (long long)(secs * 1e9);
    while (mono_ns() < end) {
        Rec r;
        r.t0 = mono_ns();
        smidk<<<blocks, 32, 0, s>>>(d, spin);
        r.t1 = mono_ns();
        cudaMemcpyAsync(h, d, blocks * 4, cudaMemcpyDeviceToHost, s);
        cudaError_t e = cudaStreamSynchronize(s);
        r.t2 = mono_ns();
        if (e != cudaSuccess) {
            fprintf(stderr, "smid_loop: %s\n", cudaGetErrorString(e));
            return 1;
        }
        r.sms.insert(h, h + blocks);
        recs.push_back(r);
    }
    FILE *f = fopen(argv[1], "w");
    if (!f)
        return 1;
    fprintf(f, "{\"records\": [");
    for (size_t i = 0; i < recs.size(); i++) {
        fprintf(f, "%s[%lld, %lld, %lld, [", i ? ",\n" : "", recs[i].t0, recs[i].t1, recs[i].t2);
        bool first = true;
        for (unsigned x : recs[i].sms) {
            fprintf(f, "%s%u", first ? "" : ", ", x);
            first = false;
        }
        fprintf(f, "]]");
    }
    fprintf(f, "]}\n");
    fclose(f);
    printf("smid_loop: %zu kernels\n", recs.size());
    return 0;
}
