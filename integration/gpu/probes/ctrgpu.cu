// ctrgpu.cu — the unmodified CUDA program container.sh runs inside a container started through DetShare's runtime.
// It knows nothing of DetShare: it reports what a tenant sees (devices, their UUIDs), computes something checkable,
// records on which SMs its blocks ran, and allocates until the driver refuses. Lines are `key value` for the script.
//
//   ctrgpu [MAX_MIB]      allocate 256 MiB chunks up to MAX_MIB (default 4096) and report where it stopped
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void saxpy_smid(int n, float a, const float *x, float *y, unsigned *smid_of_block) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (threadIdx.x == 0) {
        unsigned s;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        smid_of_block[blockIdx.x] = s;
    }
    // enough work per block that blocks spread over every SM the context may use
    float acc = 0.f;
    if (i < n) {
        for (int k = 0; k < 2000; k++) acc = acc * 0.5f + 1e-7f;
        y[i] = a * x[i] + y[i] + acc * 0.f;
    }
}

static int check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        printf("error %s: %s (%d)\n", what, cudaGetErrorString(e), (int)e);
        fflush(stdout);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    long max_mib = argc > 1 ? atol(argv[1]) : 4096;
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    printf("devices %d\n", e == cudaSuccess ? n_dev : 0);
    if (check(e, "cudaGetDeviceCount")) return 3;
    for (int d = 0; d < n_dev; d++) {
        cudaDeviceProp p;
        if (check(cudaGetDeviceProperties(&p, d), "cudaGetDeviceProperties")) return 3;
        printf("device %d %s sms %d uuid GPU-", d, p.name, p.multiProcessorCount);
        const unsigned char *u = (const unsigned char *)p.uuid.bytes;
        for (int i = 0; i < 16; i++) printf("%02x%s", u[i], (i == 3 || i == 5 || i == 7 || i == 9) ? "-" : "");
        printf("\n");
    }
    size_t free_b = 0, total_b = 0;
    if (check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo")) return 3;
    printf("meminfo_total_mib %zu\n", total_b >> 20);

    const int n = 1 << 22, threads = 128, blocks = (n + threads - 1) / threads;
    float *x, *y;
    unsigned *smids;
    if (check(cudaMalloc(&x, n * sizeof(float)), "cudaMalloc x") || check(cudaMalloc(&y, n * sizeof(float)), "cudaMalloc y") ||
        check(cudaMalloc(&smids, blocks * sizeof(unsigned)), "cudaMalloc smids"))
        return 4;
    std::vector<float> hx(n), hy(n);
    for (int i = 0; i < n; i++) {
        hx[i] = (float)(i % 1000) * 0.25f;
        hy[i] = (float)(i % 7);
    }
    cudaMemcpy(x, hx.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(y, hy.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    saxpy_smid<<<blocks, threads>>>(n, 2.0f, x, y, smids);
    if (check(cudaGetLastError(), "launch") || check(cudaDeviceSynchronize(), "kernel")) return 5;
    std::vector<float> out(n);
    std::vector<unsigned> sm(blocks);
    cudaMemcpy(out.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);
    cudaMemcpy(sm.data(), smids, blocks * sizeof(unsigned), cudaMemcpyDeviceToHost);
    long bad = 0;
    for (int i = 0; i < n; i++)
        if (out[i] != 2.0f * hx[i] + hy[i]) bad++;
    printf("compute %s mismatches %ld of %d\n", bad ? "WRONG" : "ok", bad, n);
    std::vector<int> seen(1024, 0);
    int distinct = 0, lo = 1 << 30, hi = -1;
    for (unsigned s : sm)
        if (s < 1024 && !seen[s]++) {
            distinct++;
            lo = s < (unsigned)lo ? (int)s : lo;
            hi = (int)s > hi ? (int)s : hi;
        }
    printf("distinct_sms %d smid_min %d smid_max %d\n", distinct, lo, hi);
    cudaFree(x);
    cudaFree(y);
    cudaFree(smids);

    std::vector<void *> held;
    long got = 0;
    cudaError_t refused = cudaSuccess;
    while (got + 256 <= max_mib) {
        void *p = nullptr;
        refused = cudaMalloc(&p, 256ul << 20);
        if (refused != cudaSuccess) break;
        held.push_back(p);
        got += 256;
    }
    printf("allocated_mib %ld refused %s\n", got, refused == cudaSuccess ? "no" : cudaGetErrorName(refused));
    for (void *p : held) cudaFree(p);
    return bad ? 6 : 0;
}
